"""Every process of a rank shares the rank's GPU (issue 8): a descendant that re-points
CUDA_VISIBLE_DEVICES to another single GPU is an R1 violation, compared by identity."""
from __future__ import annotations

import json
import textwrap

import pytest

from conftest import PYTHON
from _guard import guarded

GPU2 = "GPU-12c0ffee-0000-4000-8000-000000000002"
RANK_ENV = {"RANKGUARD_REFUSAL_ENDS": "process", "RANKGUARD_RANK_GPU": "2", "RANKGUARD_RANK_GPU_UUID": GPU2, "RANK": "3",
            "RANKGUARD_JOB": "job-desc"}

# The rank: initialises CUDA itself, then starts children whose CVD it rewrites, through
# subprocess and multiprocessing (spawn), and a child that starts a grandchild. It prints
# each child's exit status and keeps running.
RANK = textwrap.dedent("""
    import json, multiprocessing as mp, os, subprocess, sys
    from cuda.bindings import driver as cu

    CHILD = "from cuda.bindings import driver as cu; print(int(cu.cuInit(0)[0]))"

    def spawned():
        from cuda.bindings import driver as cu2
        sys.exit(0 if int(cu2.cuInit(0)[0]) in (0, 100) else 1)

    def with_cvd(cvd, argv):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=cvd)
        p = subprocess.run(argv, env=env, capture_output=True, text=True)
        return p.returncode, p.stdout.strip()

    if __name__ == "__main__":
        assert int(cu.cuInit(0)[0]) == 0
        out = {}
        for name, cvd in [("index5", "5"), ("uuid", sys.argv[1]), ("prefix", "GPU-12"),
                          ("empty", ""), ("minus1", "-1"), ("same", "2")]:
            out["sub-" + name] = with_cvd(cvd, [sys.executable, "-c", CHILD])
        ctx = mp.get_context("spawn")
        for name, cvd in [("index5", "5"), ("uuid", sys.argv[1])]:
            old = os.environ["CUDA_VISIBLE_DEVICES"]
            os.environ["CUDA_VISIBLE_DEVICES"] = cvd
            p = ctx.Process(target=spawned)
            p.start()
            os.environ["CUDA_VISIBLE_DEVICES"] = old
            p.join()
            out["mp-" + name] = [p.exitcode, ""]
        # grandchild: a child on the rank's GPU starts one on GPU 5
        grand = f"import subprocess, os, sys; env = dict(os.environ, CUDA_VISIBLE_DEVICES='5'); " \\
                f"sys.exit(subprocess.run([sys.executable, '-c', {CHILD!r}], env=env).returncode)"
        out["grandchild"] = with_cvd("2", [sys.executable, "-c", grand])
        print("RESULT " + json.dumps(out))
        print("rank still running")
""")


def _result(r):
    line = next(l for l in r.out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_descendants_enforce(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    r = guarded([PYTHON, script, GPU2], tmp_path, cvd="2", timeout=180, **RANK_ENV)
    assert r.rc == 0, r.out + r.err
    res = _result(r)
    assert res["sub-index5"][0] == 78
    assert res["mp-index5"][0] == 78
    assert res["grandchild"][0] == 78
    assert res["sub-uuid"] == [0, "0"] and res["mp-uuid"][0] == 0
    assert res["sub-prefix"] == [0, "0"] and res["sub-same"] == [0, "0"]
    # deliberately no GPU: the driver's own answer (CUDA_ERROR_NO_DEVICE), not terminated
    assert res["sub-empty"] == [0, "100"] and res["sub-minus1"] == [0, "100"]
    assert "rank still running" in r.out
    # the line names the rank, the rank's GPU, the GPU the child sees and the CVD value
    line = next(l for l in r.err.splitlines() if "[R1 one GPU per rank]" in l)
    assert "[rank 3]" in line and "CUDA_VISIBLE_DEVICES=5" in line
    assert f"rank GPU {GPU2}" in line
    assert "this process sees GPU-15c0ffee-0000-4000-8000-000000000005" in line
    recs = [x for x in r.audit if x["rule"] == "R1"]
    assert len(recs) == 3 and all(x["verdict"] == "deny" and x["rank"] == 3 for x in recs)
    assert all(x["sees"] == "GPU-15c0ffee-0000-4000-8000-000000000005" for x in recs)


def test_descendants_warn(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    r = guarded([PYTHON, script, GPU2], tmp_path, cvd="2", mode="warn", timeout=180, **RANK_ENV)
    assert r.rc == 0, r.out + r.err
    res = _result(r)
    assert res["sub-index5"] == [0, "0"] and res["mp-index5"][0] == 0
    assert res["grandchild"][0] == 0
    recs = [x for x in r.audit if x["rule"] == "R1"]
    assert len(recs) == 3 and all(x["verdict"] == "warn" for x in recs)
    assert all(x["detail"] == "the process sees one GPU, but not the rank's GPU" for x in recs)


def test_without_rank_gpu_nothing_changes(tmp_path):
    """Plain LD_PRELOAD (no launcher variables): a single GPU is a single GPU."""
    r = guarded([PYTHON, "-c", "from cuda.bindings import driver as cu; print(int(cu.cuInit(0)[0]))"],
                tmp_path, cvd="5", timeout=60)
    assert r.rc == 0 and r.out.strip() == "0", r.err
    assert r.audit == []


@pytest.mark.parametrize("rank_entry", ["2", "GPU-12", GPU2])
def test_rank_entry_forms_without_uuid_variable(tmp_path, rank_entry):
    """Only RANKGUARD_RANK_GPU: a full UUID compares by identity; an index or a UUID prefix
    counts only as the process's own entry (the launcher always adds the UUID; a prefix
    elsewhere cannot be proven to name one GPU, issue 14)."""
    prog = "from cuda.bindings import driver as cu; print(int(cu.cuInit(0)[0]))"
    own = "GPU-12" if rank_entry == "GPU-12" else "2"
    ok = guarded([PYTHON, "-c", prog], tmp_path, cvd=own, RANKGUARD_RANK_GPU=rank_entry)
    assert ok.rc == 0, ok.err
    bad = guarded([PYTHON, "-c", prog], tmp_path, cvd="5", RANKGUARD_RANK_GPU=rank_entry)
    assert bad.rc == 78, bad.err

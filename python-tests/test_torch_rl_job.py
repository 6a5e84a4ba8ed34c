"""The seed's RL job with real PyTorch (examples/rl_job_torch.py) under `rankguard launch
--nproc-per-node 4` on the fake node: per rank a learner, two collectors, a replay and an
inference ring of two sharing CUDA tensors through torch.multiprocessing (torch's own
cudaIpc* calls), every byte checked through host copies.

The children are started with torch's forkserver method (one torch import per rank instead
of one per child: 4 ranks x 5 children would cost a torch import each); test_spawn_rank
runs one rank with the example's default, spawn."""
from __future__ import annotations

import json
import pathlib


from conftest import ROOT, clean_env, fake_node

EXAMPLE = ROOT / "examples" / "rl_job_torch.py"


def _line(text: str) -> int:
    """The line of rl_job_torch.py holding `text` (exactly one)."""
    hits = [i for i, line in enumerate(EXAMPLE.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def launch(tmp_path: pathlib.Path, mode: str, *args: str, nproc: int = 4, method="forkserver"):
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    audit = tmp_path / "audit"
    audit.mkdir()
    env = clean_env(RANKGUARD_MODE=mode, RANKGUARD_AUDIT=str(audit / "%h.%p.jsonl"),
                    RANKGUARD_REGISTRY=str(reg))
    p = fake_node(["rankguard", "launch", "--nproc-per-node", str(nproc), "--", "python",
                   EXAMPLE, "--start-method", method, *args], env=env, timeout=240)
    records = [r for f in sorted(audit.glob("*.jsonl"))
               for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") != "map"]
    return p, records


def planted(world: int) -> list[tuple]:
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import rl_job_torch; "
            "print(json.dumps(rl_job_torch.planted_violations(int(sys.argv[2]))))")
    p = fake_node(["python", "-c", code, ROOT / "examples", str(world)], env=clean_env())
    assert p.returncode == 0, p.stderr
    return sorted((v["rank"], v["rule"], v["call"]) for v in json.loads(p.stdout))


def test_clean_config_exits_0_with_no_record(tmp_path):
    p, records = launch(tmp_path, "enforce")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("done, every check passed") == 4, out
    assert "RANKGUARD" not in out, out
    assert records == []


def test_legacy_warn_records_r1_r2_r3_with_the_users_lines(tmp_path):
    p, records = launch(tmp_path, "warn", "--legacy")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("done, every check passed") == 4, out
    got = sorted((r["rank"], r["rule"], r["call"]) for r in records)
    # The hand-written set: ranks 1-3 name their global index, collector 1 of every rank
    # sees the next GPU (R1) and opens the learner's tensor across GPUs: its event, then
    # its memory (R3).
    want = sorted([(r, "R2", "cudaSetDevice") for r in (1, 2, 3)] +
                  [(r, rule, call) for r in range(4) for rule, call in
                   (("R1", "cuInit"), ("R3", "cudaIpcOpenEventHandle"),
                    ("R3", "cudaIpcOpenMemHandle"))])
    assert got == want, got
    assert planted(4) == want
    assert {r["verdict"] for r in records} == {"warn"}
    assert len({r["job"] for r in records}) == 1
    # Each record's Python stack names the user's line that made the call: the legacy
    # set_device, and the collector's queue read that imports the tensor (torch initialises
    # CUDA and opens the handles inside it).
    user = {"R2": f"{EXAMPLE}:{_line('torch.cuda.set_device(local)')} in learner",
            "R1": f"{EXAMPLE}:{_line('_, buf = inq.get()')} in collector",
            "R3": f"{EXAMPLE}:{_line('_, buf = inq.get()')} in collector"}
    for r in records:
        assert user[r["rule"]] in r["py_stack"], (r["rule"], r["call"], r["py_stack"])
    for r in (1, 2, 3):
        assert f"[rank {r}] RANKGUARD WARN cudaSetDevice(device={r}) allowed (warn mode) [R2" in out


def test_legacy_enforce_refuses_the_collector_naming_r1(tmp_path):
    p, records = launch(tmp_path, "enforce", "--legacy")
    out = p.stdout + p.stderr
    # Collector 1 of some rank is terminated at cuInit (78) and ends its rank's process,
    # the learner, which uses CUDA: it ends with 78 and its own line (issue 28), before it
    # could see the death itself; the launcher stops the job with 78 and its summary.
    assert p.returncode == 78, out
    assert "RANKGUARD DENY terminating: this process breaks rule R1" in out
    assert "ending the rank's process (status 78)" in out, out
    assert "RANKGUARD DENY ending this process, the rank's process, with status 78" in out, out
    assert "stopping the job" in out, out
    root = out.split("Root Cause (first observed failure):", 1)[1]
    assert "  rule      : R1 (one GPU per rank)" in root and "  exitcode  : 78 (pid: " in root, root
    assert "refused   : pid " in root, root
    assert records and {r["verdict"] for r in records} == {"deny"}
    assert ("R1", "cuInit") in {(r["rule"], r["call"]) for r in records}
    # Nothing was imported across GPUs: the collector never got that far.
    assert not [r for r in records if r["rule"] == "R3"]


def test_spawn_rank(tmp_path):
    """One rank of the legacy config with torch's spawn start method, in warn mode."""
    p, records = launch(tmp_path, "warn", "--legacy", nproc=2, method="spawn")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("done, every check passed") == 2, out
    got = sorted((r["rank"], r["rule"], r["call"]) for r in records)
    assert got == planted(2), got

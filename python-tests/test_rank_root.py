"""One program is one rank (issue 12): without a launcher or rank variables, a guarded
process belongs to the rank of its outermost guarded ancestor given a single-entry
CUDA_VISIBLE_DEVICES (crates/core/src/rank_root.rs), so R1 (a process of the rank on another GPU) and
R3 (cross-device IPC inside the rank) hold under plain LD_PRELOAD.

The programs are python-tests/_rank_root_prog.py (NVIDIA's cuda.bindings on the fake node):
a learner on GPU 0 that exports memory over CUDA IPC and starts a collector, started after
or before the learner's first cuInit, through subprocess, multiprocessing spawn and
forkserver, or as a grandchild.
"""
from __future__ import annotations

import json
import pathlib
import socket
import subprocess

import pytest

from _ipc import gpu_uuid
from _guard import prog
from conftest import CLI, GUARD, PYTHON, clean_env, run

PROG = pathlib.Path(__file__).with_name("_rank_root_prog.py")
HOST = socket.gethostname().split(".")[0]
STARTS = [("subprocess", "after"), ("subprocess", "before"), ("spawn", "after"), ("spawn", "before"),
          ("forkserver", "before"), ("grandchild", "after")]


def env_for(tmp: pathlib.Path, cvd: str | None, mode: str = "enforce", **extra) -> dict[str, str]:
    reg = tmp / "registry"
    reg.mkdir(mode=0o700, exist_ok=True)
    return clean_env(**{"LD_PRELOAD": str(GUARD), "FAKECUDA_GPUS": "8", "CUDA_VISIBLE_DEVICES": cvd,
                        "RANKGUARD_MODE": mode, "RANKGUARD_REGISTRY": str(reg),
                        "RANKGUARD_AUDIT": str(tmp / "audit.jsonl"),
                        # these tests watch the refused process itself; ending its rank
                        # is test_end_rank.py's
                        "RANKGUARD_REFUSAL_ENDS": "process", **extra})


def audit(tmp: pathlib.Path) -> list[dict]:
    path = tmp / "audit.jsonl"
    return ([r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") != "map"]
            if path.exists() else [])


def learner(tmp, collector_cvd, how, when, mode="enforce", **extra):
    work = tmp / "work"
    work.mkdir()
    p = run([PYTHON, PROG, "learner", work, collector_cvd, how, when],
            env=env_for(tmp, "0", mode, **extra), timeout=120)
    assert p.returncode == 0 and "learner finished" in p.stdout, f"{p.stdout}\n{p.stderr}"
    line = next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), p


def root_of(res) -> dict:
    return {"pid": res["learner_pid"], "start": res["learner_start"], "host": HOST}


# ------------------------------------------------------------------ the same rank, two GPUs

@pytest.mark.parametrize("how,when", STARTS)
def test_collector_on_another_gpu_is_recorded_in_warn_mode(tmp_path, how, when):
    res, p = learner(tmp_path, "1", how, when, mode="warn")
    assert res["collector_status"] == 0
    col = res["collector"]
    assert col["rc"] == 0 and col["intact"] is True     # warn mode lets it through
    recs = audit(tmp_path)
    assert sorted(r["rule"] for r in recs) == ["R1", "R3"], recs
    r1 = next(r for r in recs if r["rule"] == "R1")
    r3 = next(r for r in recs if r["rule"] == "R3")
    root = root_of(res)
    # both name the learner as the rank root, by pid, start time and host
    assert r1["rank_root"] == root and r3["rank_root"] == root
    assert r3["exporter_rank_root"] == root and r3["exporter_pid"] == res["learner_pid"]
    assert r1["pid"] == r3["pid"] == col["pid"] and r1["rank"] is None
    assert r1["detail"] == "the process sees one GPU, but not the rank's GPU"
    assert r1["sees"] == gpu_uuid(1)
    assert r3["exporter_gpu"] == gpu_uuid(0) and r3["gpu"] == gpu_uuid(1)
    assert r3["decision"] == "same rank, another GPU"
    # the lines name the root too
    line = next(l for l in p.stderr.splitlines() if "[R1 one GPU per rank]" in l)
    assert f"[rank root {res['learner_pid']}]" in line


@pytest.mark.parametrize("how,when", STARTS)
def test_collector_on_another_gpu_is_stopped_in_enforce_mode(tmp_path, how, when):
    res, p = learner(tmp_path, "1", how, when)
    assert res["collector_status"] == 78 and res["collector"] is None
    (rec,) = audit(tmp_path)
    assert rec["rule"] == "R1" and rec["verdict"] == "deny" and rec["rank_root"] == root_of(res)
    assert "terminating: this process breaks rule R1" in p.stderr


@pytest.mark.parametrize("entry", ["0", gpu_uuid(0), "GPU-10"])
def test_collector_on_the_rank_gpu_reads_every_byte(tmp_path, entry):
    """Same GPU named by index, full UUID or unique prefix: allowed. Under strict an unknown
    exporter would be denied, so this passes only as "same rank, same GPU"."""
    res, p = learner(tmp_path, entry, "subprocess", "after", RANKGUARD_IPC="strict")
    assert res["collector_status"] == 0, p.stderr
    assert res["collector"]["rc"] == 0 and res["collector"]["intact"] is True
    assert audit(tmp_path) == [] and "RANKGUARD" not in p.stderr


def test_collector_on_the_rank_gpu_before_the_learner_initialises(tmp_path):
    res, p = learner(tmp_path, "0", "spawn", "before", RANKGUARD_IPC="strict")
    assert res["collector_status"] == 0 and res["collector"]["intact"] is True, p.stderr
    assert audit(tmp_path) == []


# ------------------------------------------------------------------ separate programs are separate ranks

def _pair(tmp, x_env, i_env, x_cmd=None, i_cmd=None):
    """Exporter and importer started as separate programs; the importer's result."""
    work = tmp / "work"
    work.mkdir()
    x = subprocess.Popen([str(c) for c in (x_cmd or [PYTHON, PROG, "export", work])], env=x_env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        i = run(i_cmd or [PYTHON, PROG, "import", work], env=i_env, timeout=120)
    finally:
        (work / "done").write_text("")
        xo, xe = x.communicate(timeout=60)
    assert x.returncode == 0 and i.returncode == 0, f"{xo}\n{xe}\n{i.stdout}\n{i.stderr}"
    return json.loads((work / "import.result").read_text()), i


def test_two_programs_started_separately_are_two_ranks(tmp_path):
    """Exporter on GPU 1, importer on GPU 0, each started on its own: another rank's
    memory (NCCL P2P between ranks), allowed even under strict, every byte intact."""
    res, i = _pair(tmp_path, env_for(tmp_path, "1", RANKGUARD_IPC="strict"),
                   env_for(tmp_path, "0", RANKGUARD_IPC="strict"))
    assert res["rc"] == 0 and res["intact"] is True, i.stderr
    assert audit(tmp_path) == []


SUPERVISOR = """
import subprocess, sys
prog, work, guard = sys.argv[1:4]
env = lambda cvd: dict(__import__("os").environ, LD_PRELOAD=guard, CUDA_VISIBLE_DEVICES=cvd)
x = subprocess.Popen([sys.executable, prog, "export", work], env=env("3"))
i = subprocess.run([sys.executable, prog, "import", work], env=env("4"))
open(work + "/done", "w").close()
sys.exit(x.wait() or i.returncode)
"""


def test_unguarded_supervisor_starting_workers_on_gpus_3_and_4_is_two_ranks(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    e = env_for(tmp_path, "3,4", RANKGUARD_IPC="strict", LD_PRELOAD=None)
    p = run([PYTHON, "-c", SUPERVISOR, PROG, work, GUARD], env=e, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads((work / "import.result").read_text())
    assert res["rc"] == 0 and res["intact"] is True
    assert audit(tmp_path) == []


def test_guarded_shell_starting_two_programs_on_two_gpus_is_two_ranks(tmp_path):
    """LD_PRELOAD=librankguard.so bash -c '...' with no CVD of its own is not a rank."""
    work = tmp_path / "work"
    work.mkdir()
    script = (f'CUDA_VISIBLE_DEVICES=1 "{PYTHON}" "{PROG}" export "{work}" & '
              f'CUDA_VISIBLE_DEVICES=0 "{PYTHON}" "{PROG}" import "{work}"; rc=$?; '
              f'touch "{work}/done"; wait $! && exit $rc')
    p = run(["bash", "-c", script], env=env_for(tmp_path, None, RANKGUARD_IPC="strict"), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads((work / "import.result").read_text())
    assert res["rc"] == 0 and res["intact"] is True
    assert audit(tmp_path) == []


def test_the_same_shell_given_one_gpu_is_one_rank(tmp_path):
    """The counterpart: a guarded shell given CVD=0 is a rank, and a program it re-points
    to GPU 1 is stopped (R1), naming the shell as the root."""
    script = f'echo "shell $$"; CUDA_VISIBLE_DEVICES=1 "{PYTHON}" -c "from cuda.bindings import driver as d; d.cuInit(0)"; exit $?'
    p = run(["bash", "-c", script], env=env_for(tmp_path, "0"), timeout=60)
    assert p.returncode == 78, p.stdout + p.stderr
    (rec,) = audit(tmp_path)
    assert rec["rule"] == "R1" and rec["rank_root"]["pid"] == int(p.stdout.split()[1])


# ------------------------------------------------------------------ explicit variables win

def test_rank_variables_win_over_the_root(tmp_path):
    """RANK set: no root is looked for (rank_root null); the collector on GPU 1 is not an
    R1 violation without RANKGUARD_RANK_GPU (today's rule), and R3 compares RANK."""
    res, _ = learner(tmp_path, "1", "subprocess", "after", mode="warn", RANK="3")
    assert res["collector_status"] == 0
    (rec,) = audit(tmp_path)
    assert rec["rule"] == "R3" and rec["rank"] == 3 and rec["exporter_rank"] == 3
    assert rec["rank_root"] is None and rec["exporter_rank_root"] is None
    assert not list((tmp_path / "registry").glob("rank-*")), "no rank records under RANK"


@pytest.mark.parametrize("launcher,rules,rank", [
    (["run", "--device", "0"], ["R1"], None),                 # names the rank GPU, no RANK
    (["launch", "--nproc-per-node", "1"], ["R1", "R3"], 0),   # RANK=0 too: R3 by rank
])
def test_launcher_wins_over_the_root(tmp_path, launcher, rules, rank):
    """Under `rankguard run`/`launch` the launcher's rank GPU and RANK decide, as before:
    no root is looked for, no rank record written."""
    work = tmp_path / "work"
    work.mkdir()
    e = env_for(tmp_path, None, "warn")
    p = run([CLI, *launcher, "--", PYTHON, PROG, "learner", work, "1", "subprocess", "after"],
            env=e, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = audit(tmp_path)
    assert sorted(r["rule"] for r in recs) == rules, recs
    assert all(r["rank_root"] is None and r["rank"] == rank for r in recs)
    assert recs[0]["rank_gpu"] == "0"
    assert not list((tmp_path / "registry").glob("rank-*"))


# ------------------------------------------------------------------ report

def test_report_groups_processes_by_rank_root(tmp_path):
    res, _ = learner(tmp_path, "1", "subprocess", "after", mode="warn")
    p = run([CLI, "report", "--json", tmp_path / "audit.jsonl"], env=clean_env())
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    for g in doc["groups"]:
        (r,) = g["ranks"]
        assert r["rank"] is None and r["rank_root"] == root_of(res)
    assert doc["totals"]["ranks"] == 1
    t = run([CLI, "report", tmp_path / "audit.jsonl"], env=clean_env()).stdout
    # One way of naming a rank without a number, in the call's line and its site's (issue
    # 32: the site line used to say "in rank -").
    assert f": 1 warned in rank root {HOST}:{res['learner_pid']}\n" in t, t
    assert f"1 warned in rank root {HOST}:{res['learner_pid']}, from 1 process\n" in t, t
    assert "rank -" not in t, t
    assert f"(rank root {HOST}:{res['learner_pid']})" in t        # the R3 exporter line


# ------------------------------------------------------------------ rank records: trust

SHELL_WAITS = ('echo "shell $$"; while [ ! -e "$W/go" ]; do sleep 0.02; done; '
               'CUDA_VISIBLE_DEVICES=1 "$PY" -c "from cuda.bindings import driver as d; d.cuInit(0)"; exit $?')


def _record(pid: int, start: int, gpu: str) -> str:
    return (f"rankguard-ipc-record 1\nkey rank-{pid}\njob -\nrank -\npid {pid}\nstart {start}\n"
            f"gpu {gpu}\nlocation device\ntime 1\nroot {pid}.{start}\nend\n")


@pytest.mark.parametrize("honest", [True, False])
def test_a_rank_record_makes_its_writer_a_root_only_with_its_start_time(tmp_path, honest):
    """A guarded shell with no CVD is not a rank by its environment; a rank record for it
    (what a process that set its CVD in-process writes at cuInit, as Ray's worker does) makes
    it one, and its child on GPU 1 is stopped. The same record naming another start time
    (the pid of an exited process, reused) is not trusted: the child is its own root."""
    (tmp_path / "w").mkdir()
    e = env_for(tmp_path, None, W=str(tmp_path / "w"), PY=PYTHON)
    p = subprocess.Popen(["bash", "-c", SHELL_WAITS], env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        pid = int(p.stdout.readline().split()[1])
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        start = int(stat[stat.rfind(")") + 2:].split()[19])
        rec = tmp_path / "registry" / f"rank-{pid}"
        rec.write_text(_record(pid, start if honest else start + 1, gpu_uuid(0)))
        rec.chmod(0o600)
        (tmp_path / "w" / "go").write_text("")
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    if honest:
        assert p.returncode == 78, err
        (r,) = audit(tmp_path)
        assert r["rank_root"] == {"pid": pid, "start": start, "host": HOST}
        assert r["rank_gpu"] == gpu_uuid(0)
    else:
        assert p.returncode == 0, err
        assert audit(tmp_path) == []
        assert not rec.exists(), "the untrusted record was removed"


FORK_AFTER_REPORT = """
import os, sys
from cuda.bindings import driver as d
assert int(d.cuDeviceGet(1)[0]) == 101          # reported before cuInit: the root is found here
pid = os.fork()
if pid == 0:                                    # a forked collector re-pointed to GPU 1
    os.environ["CUDA_VISIBLE_DEVICES"] = "1"
    d.cuInit(0)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "parent", os.getpid())
"""


def test_a_forked_child_finds_its_own_root(tmp_path):
    """The parent found its root (itself) at a report before cuInit; its forked child
    inherits that value but must not take "I am the root" from it: it is stopped by R1."""
    p = run([PYTHON, "-c", FORK_AFTER_REPORT], env=env_for(tmp_path, "0"), timeout=60)
    assert p.returncode == 0, p.stderr
    words = p.stdout.split()
    assert words[:2] == ["child", "78"], p.stdout + p.stderr
    r1 = [r for r in audit(tmp_path) if r["rule"] == "R1"]
    assert len(r1) == 1 and r1[0]["rank_root"]["pid"] == int(words[3])


# ------------------------------------------------------------------ cold path, other users

def test_processes_that_never_touch_cuda_never_walk(tmp_path):
    """A guarded shell and programs that never initialise CUDA: no rank record, not even
    the registry directory (the walk runs at the first cuInit or report only)."""
    p = run(["bash", "-c", f'true; "{PYTHON}" -c pass; ls / >/dev/null; exit $?'],
            env=env_for(tmp_path, "0"), timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert list((tmp_path / "registry").iterdir()) == []
    assert audit(tmp_path) == []


OTHER_USER = """
import ctypes, os, sys
drop = sys.argv[2] == "drop"
r, w = os.pipe()
pid = os.fork()
if pid == 0:                      # the child stays this user; it waits for its parent
    os.close(w)
    os.read(r, 1)
    os.environ["CUDA_VISIBLE_DEVICES"] = "1"
    os.execv(sys.argv[1], [sys.argv[1], "link", "cuDeviceGet", "0"])
if drop:                          # the parent (the rank: guarded, CVD=0) becomes another user
    os.setgid(65534)
    os.setuid(65534)
    # keep /proc/<pid> owned by that user (a credential change makes it root's)
    assert ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0) == 0   # PR_SET_DUMPABLE
os.write(w, b"x")
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("drop,status", [(True, 0), (False, 78)])
def test_the_walk_stops_at_another_users_process(tmp_path, drop, status):
    """A rank (guarded, CVD=0) whose child re-points to GPU 1 is stopped (R1); when the
    rank's process belongs to another user by then, nothing of it is trusted (its
    environment is that user's to write): the child is its own rank."""
    import os
    if os.geteuid() != 0:
        pytest.skip("needs root to make a process another user's")
    p = run([PYTHON, "-c", OTHER_USER, prog("guard_call"), "drop" if drop else "keep"],
            env=env_for(tmp_path, "0"), timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == f"child {status}", p.stdout + p.stderr


VOLUME = """
import os
from cuda.bindings import driver as d
d.cuInit(0)
for _ in range(150):
    d.cuDeviceGet(1)
print("pid", os.getpid())
"""


def test_summary_records_name_the_rank_root_too(tmp_path):
    """Past a site's first 100 violations the guard writes summary records (counts): they
    carry the rank root as the full records do, so the report keeps one rank and exact
    totals."""
    p = run([PYTHON, "-c", VOLUME], env=env_for(tmp_path, "0", "warn"), timeout=60)
    assert p.returncode == 0, p.stderr
    pid = int(p.stdout.split()[1])
    recs = audit(tmp_path)
    assert any(r.get("summary") for r in recs), recs[-1]
    assert {r["rank_root"]["pid"] for r in recs} == {pid}
    q = run([CLI, "report", "--json", tmp_path / "audit.jsonl"], env=clean_env())
    (g,) = json.loads(q.stdout)["groups"]
    (r,) = g["ranks"]
    assert r["rank_root"]["pid"] == pid and r["count"] == 150

"""A refusal ends the rank, not only the refused process (issue 28): a parent that never
watches its child (it reads a pipe it holds open itself, as a learner's queue.get() does)
is ended when the guard stops its child for R1, instead of waiting forever. Warn mode, a
clean job, an empty-CVD helper and the opt-out end nothing; a rank root that is another
user's process, or a pid whose start time differs, is never signalled.

Every run is bounded by a timeout far above what it needs: on the code before this change
the enforce cases hang until it (the parent is never ended)."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time

import pytest

from _ipc import gpu_uuid
from conftest import CLI, GUARD, TESTS, clean_env, run

PARENT = TESTS / "pipe_parent"
INIT = TESTS / "guard_init"
BOUND = 20  # seconds: a hang detector, not a timing assertion


def env_for(tmp: pathlib.Path, cvd: str | None, mode: str = "enforce", **extra) -> dict[str, str]:
    reg = tmp / "registry"
    reg.mkdir(mode=0o700, exist_ok=True)
    return clean_env(**{"LD_PRELOAD": str(GUARD), "FAKECUDA_GPUS": "8", "CUDA_VISIBLE_DEVICES": cvd,
                        "RANKGUARD_MODE": mode, "RANKGUARD_REGISTRY": str(reg),
                        "RANKGUARD_AUDIT": str(tmp / "audit.jsonl"), **extra})


def audit(tmp: pathlib.Path) -> list[dict]:
    path = tmp / "audit.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def parent_pid(out: str) -> int:
    return int(next(l for l in out.splitlines() if l.startswith("parent ")).split()[1])


def test_plain_preload_ends_the_rank_root_with_the_line(tmp_path):
    p = run([PARENT, "1"], env=env_for(tmp_path, "0"), timeout=BOUND)
    assert p.returncode == -signal.SIGTERM, p.stdout + p.stderr
    pid = parent_pid(p.stdout)
    (line,) = [l for l in p.stderr.splitlines() if "the rank's process" in l]
    assert f"the rank's process {pid} ('pipe_parent')" in line and "broke R1" in line, line
    assert "ending the rank's process (SIGTERM)" in line and "fix: give each rank" in line, line
    assert [r["rule"] for r in audit(tmp_path)] == ["R1"]


def test_a_rank_process_that_uses_cuda_ends_with_78_and_the_line(tmp_path):
    """A learner initialises CUDA on the rank's GPU before its child is refused: it caught
    the guard's signal at its cuInit, so it ends with R1's 78 and says why itself; the
    refused child's line names its call site."""
    p = run([PARENT, "1"], env=env_for(tmp_path, "0", PIPE_PARENT_INIT="1"), timeout=BOUND)
    assert p.returncode == 78, p.stdout + p.stderr
    pid = parent_pid(p.stdout)
    assert "parent cuInit=0" in p.stdout, p.stdout
    (child,) = [l for l in p.stderr.splitlines() if "this process " in l and "the rank's process " in l]
    assert f"the rank's process {pid} ('pipe_parent')" in child, child
    assert "ending the rank's process (status 78)" in child and " at pipe_parent(" in child, child
    (top,) = [l for l in p.stderr.splitlines() if "ending this process, the rank's process" in l]
    assert f":{pid}:{pid} " in top and "with status 78" in top, top
    assert "broke R1 (one GPU per rank)" in top and "fix: give each rank" in top, top
    assert [r["rule"] for r in audit(tmp_path)] == ["R1"]


def test_run_ends_the_ranks_process(tmp_path):
    e = env_for(tmp_path, None, LOCAL_RANK="0", LD_PRELOAD=None)
    p = run([CLI, "run", "--narrow-by", "LOCAL_RANK", "--", PARENT, "5"], env=e, timeout=BOUND)
    assert p.returncode == -signal.SIGTERM, p.stdout + p.stderr
    pid = parent_pid(p.stdout)
    assert f"the rank's process {pid} ('pipe_parent')" in p.stderr, p.stderr
    # a rank's process that initialised CUDA itself ends with 78 and its own line
    p = run([CLI, "run", "--narrow-by", "LOCAL_RANK", "--", PARENT, "5"],
            env={**e, "PIPE_PARENT_INIT": "1"}, timeout=BOUND)
    assert p.returncode == 78, p.stdout + p.stderr
    pid = parent_pid(p.stdout)
    assert f"the rank's process {pid} ('pipe_parent')" in p.stderr, p.stderr
    assert f":{pid}:{pid} " in next(l for l in p.stderr.splitlines() if "ending this process" in l)


@pytest.mark.parametrize("parent_init,exitcode", [(None, 143), ("1", 78)],
                         ids=["rank-no-cuda", "rank-uses-cuda"])
def test_launch_stops_the_job_with_78_and_the_summary(tmp_path, parent_init, exitcode):
    """Rank 1's child is re-pointed to GPU 5 and refused; rank 0 would run for 30 s. The
    whole job ends at once (the bound is a sanity check, not a timing claim), with 78 and
    the torchrun-shaped box naming rank, pid, rule, call site and the why; no rank's
    process group is left."""
    e = env_for(tmp_path, None, LD_PRELOAD=None, TMPDIR=str(tmp_path), PIPE_PARENT_INIT=parent_init)
    script = 'if [ "$LOCAL_RANK" = 1 ]; then exec "$0" 5; else sleep 30; fi'
    t0 = time.monotonic()
    p = run([CLI, "launch", "--nproc-per-node", "2", "--", "bash", "-c", script, str(PARENT)],
            env=e, timeout=BOUND)
    took = time.monotonic() - t0
    assert p.returncode == 78, p.stdout + p.stderr
    assert took < 5, took
    assert "broke R1" in p.stderr, p.stderr
    box = p.stderr[p.stderr.index("=" * 72):]
    lines = box.splitlines()
    assert lines[0] == lines[-1] == "=" * 72, box
    assert lines[1].startswith("bash FAILED"), box
    assert "Failures:\n  <NO_OTHER_FAILURES>\n" in box, box
    root = box.split("Root Cause (first observed failure):\n[0]:\n", 1)[1]
    fields = {k.strip(): v for k, v in (l.split(" : ", 1) for l in root.splitlines() if " : " in l)}
    assert fields["rank"] == "1 (local_rank: 1)", fields
    assert fields["exitcode"].startswith(f"{exitcode} (pid: "), fields
    assert fields["rule"] == "R1 (one GPU per rank)", fields
    assert fields["refused"].endswith("('pipe_parent')"), fields
    assert fields["site"] != "?" and "rank's GPU" in fields["error"], fields
    assert fields["time"].endswith(" UTC") and fields["host"], fields
    assert box.count("[0]:") == 1 and "[1]:" not in box, box
    # The notes directory is gone with the launcher.
    assert not list(tmp_path.glob("rankguard-launch-*")), list(tmp_path.iterdir())


@pytest.mark.parametrize("cvd,mode,ends,status", [
    ("1", "warn", None, 0),          # warn: runs to the end, with the record
    ("0", "enforce", None, 0),       # clean: the child is on the rank's GPU
    ("", "enforce", None, 0),        # a helper deliberately given no GPU
    ("-1", "enforce", None, 0),
    ("1", "enforce", "process", 78), # the opt-out: today's behaviour, only the child ends
])
@pytest.mark.parametrize("parent_init", [None, "1"], ids=["parent-no-cuda", "parent-cuda"])
def test_what_is_never_ended(tmp_path, cvd, mode, ends, status, parent_init):
    e = env_for(tmp_path, "0", mode, RANKGUARD_REFUSAL_ENDS=ends, PIPE_PARENT_INIT=parent_init)
    p = run([PARENT, cvd, "2"], env=e, timeout=BOUND)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"parent gave up; child status {status}" in p.stdout, p.stdout + p.stderr
    assert "the rank's process" not in p.stderr, p.stderr
    rules = [r["rule"] for r in audit(tmp_path)]
    assert rules == (["R1"] if cvd == "1" else []), rules


SHELL = ('echo "shell $$"; while [ ! -e "$W/go" ]; do sleep 0.02; done; '
         'CUDA_VISIBLE_DEVICES=1 "$INIT"; exit $?')


def _start(pid: int) -> int:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[19])


@pytest.mark.parametrize("case", ["other-user", "reused-pid", "unrelated"])
def test_a_recorded_root_outside_the_rank_is_never_signalled(tmp_path, case):
    """A guarded shell's rank record names a root that is not its rank's: another user's
    process, a live pid whose start time differs (the pid was reused), or an unrelated
    process of the same user. Its child on GPU 1 is refused (R1) and ends alone: the
    named process keeps running and the shell sees the child's 78."""
    if case == "other-user" and os.geteuid() != 0:
        pytest.skip("needs root to start another user's process")
    pre = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if case == "other-user" else []
    victim = subprocess.Popen(pre + ["sleep", "60"])
    try:
        vstart = _start(victim.pid) + (1 if case == "reused-pid" else 0)
        (tmp_path / "w").mkdir()
        e = env_for(tmp_path, None, W=str(tmp_path / "w"), INIT=str(INIT))
        p = subprocess.Popen(["bash", "-c", SHELL], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            pid = int(p.stdout.readline().split()[1])
            rec = tmp_path / "registry" / f"rank-{pid}"
            rec.write_text(f"rankguard-ipc-record 1\nkey rank-{pid}\njob -\nrank -\npid {pid}\n"
                           f"start {_start(pid)}\ngpu {gpu_uuid(0)}\nlocation device\ntime 1\n"
                           f"root {victim.pid}.{vstart}\nend\n")
            rec.chmod(0o600)
            (tmp_path / "w" / "go").write_text("")
            out, err = p.communicate(timeout=BOUND)
        finally:
            p.kill()
        assert p.returncode == 78, err
        assert victim.poll() is None, "the named process was signalled"
        assert "the rank's process" not in err, err
    finally:
        victim.kill()
        victim.wait()

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
    # Decision records (map records, one per process at its first cuInit, left out).
    return [r for l in path.read_text().splitlines() for r in [json.loads(l)]
            if r.get("kind") != "map"] if path.exists() else []


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


def test_the_armed_signal_from_anyone_else_does_its_default_action(tmp_path):
    """The rank's process that caught the guard's signal at its cuInit (SigCgt) and then gets
    that signal from someone else (a plain kill, not a refused descendant's queued one) dies
    of it, as without the guard: the handler restores the default action, raises the signal
    and returns, so the return from the handler (on x86_64 through the library's own
    `rt_sigreturn` restorer, src/guard/1_sys/sigaction.rs) has to work."""
    sig = signal.SIGRTMAX - 3
    p = subprocess.Popen([str(PARENT), "0"], env=env_for(tmp_path, "0", PIPE_PARENT_INIT="1"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = parent_pid(p.stdout.readline())
        # The child's line comes once the parent's cuInit let it go: the parent is armed and
        # then only waits (the child, on the same GPU, passes and exits).
        assert p.stdout.readline().strip() == "parent cuInit=0"
        assert p.stdout.readline().strip() == "child cuInit=0"
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        caught = int(next(l for l in status.splitlines() if l.startswith("SigCgt:")).split()[1], 16)
        assert caught & (1 << (sig - 1)), f"signal {sig} not caught after cuInit: {status}"
        os.kill(pid, sig)
        _, err = p.communicate(timeout=BOUND)
        assert p.returncode == -sig, err
        assert "ending this process" not in err, err
    finally:
        p.kill()
        p.communicate()


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
    """Rank 1's child is re-pointed to GPU 5 and refused; rank 0 would sleep for an hour.
    The whole job ends at once (run's BOUND is the hang detector: a launch that waited for
    rank 0, or waited out its grace period, set above BOUND here, before signalling it,
    would time out), with 78 and the torchrun-shaped box naming rank, pid, rule, call site
    and the why; no rank's process group is left."""
    e = env_for(tmp_path, None, LD_PRELOAD=None, TMPDIR=str(tmp_path), PIPE_PARENT_INIT=parent_init)
    script = 'if [ "$LOCAL_RANK" = 1 ]; then exec "$0" 5; else sleep 3600; fi'
    p = run([CLI, "launch", "--nproc-per-node", "2", "--grace-period", str(3 * BOUND), "--",
             "bash", "-c", script, str(PARENT)], env=e, timeout=BOUND)
    assert p.returncode == 78, p.stdout + p.stderr
    assert "broke R1" in p.stderr, p.stderr
    # The failure box, then launch's end summary (issue 32) below it.
    bar = "=" * 72
    box = p.stderr[p.stderr.index(bar):p.stderr.rindex(bar) + len(bar)]
    lines = box.splitlines()
    assert lines[0] == lines[-1] == bar, box
    assert "the guard recorded 1 violation in this job" in p.stderr[p.stderr.rindex(bar):], p.stderr
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


SHELL = ('echo "$$" > "$W/sh"; mv "$W/sh" "$W/shell"; while [ ! -e "$W/go" ]; do sleep 0.02; done; '
         'CUDA_VISIBLE_DEVICES=1 "$INIT"; echo "$?" > "$W/st"; mv "$W/st" "$W/status"')


def _start(pid: int) -> int:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[19])


def _file(path: pathlib.Path) -> str:
    """The file's text once it exists; a hang detector, not a timing assertion."""
    end = time.monotonic() + BOUND
    while not path.exists():
        assert time.monotonic() < end, f"{path} never written"
        time.sleep(0.02)
    return path.read_text().strip()


AS_NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups"


def _became(pid: int, comm: str) -> None:
    """Wait until process `pid` runs `comm` (its exec done: for `setpriv ... sleep`, the
    change of user before it too); a hang detector, not a timing assertion."""
    end = time.monotonic() + BOUND
    while pathlib.Path(f"/proc/{pid}/comm").read_text().strip() != comm:
        assert time.monotonic() < end, f"process {pid} never became {comm!r}"
        time.sleep(0.02)


@pytest.mark.parametrize("case", ["other-user", "reused-pid", "unrelated", "the-rank-root"])
def test_a_recorded_root_outside_the_rank_is_never_signalled(tmp_path, case):
    """A guarded shell's rank record names its root; its child on GPU 1 is refused (R1).
    The named process is the shell's parent but another user's (a root shell that forked
    the guarded one and then became nobody's `sleep`, as after a setuid change), or the
    shell's parent with another start time (the recorded root is gone and its pid was
    reused by the parent), or an unrelated process of the same user: the refused child
    ends alone (78) and the named process keeps running. The control: the same record
    naming the real parent ends that parent."""
    if case == "other-user" and os.geteuid() != 0:
        pytest.skip("needs root to start another user's process")
    w = tmp_path / "w"
    w.mkdir()
    e = env_for(tmp_path, None, W=str(w), INIT=str(INIT), SHELL_CMD=SHELL)
    then = {"other-user": f"exec {AS_NOBODY} sleep 60", "reused-pid": "exec sleep 60",
            "the-rank-root": "exec sleep 60"}
    if case == "unrelated":
        victim = subprocess.Popen(["sleep", "60"])
        shell = subprocess.Popen(["bash", "-c", SHELL], env=e)
    else:
        # the guarded shell in the background, then its parent becomes the victim
        victim = subprocess.Popen(["bash", "-c", f'bash -c "$SHELL_CMD" & {then[case]}'], env=e)
        shell = None
    try:
        pid = int(_file(w / "shell"))
        if case != "unrelated":
            # On a busy machine the shell can be up before its parent's exec: the victim
            # must be `sleep` (another user's, for other-user) when the child asks.
            _became(victim.pid, "sleep")
        vstart = _start(victim.pid) + (1 if case == "reused-pid" else 0)
        if case != "unrelated":
            assert int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == victim.pid
        rec = tmp_path / "registry" / f"rank-{pid}"
        rec.write_text(f"rankguard-ipc-record 1\nkey rank-{pid}\njob -\nrank -\npid {pid}\n"
                       f"start {_start(pid)}\ngpu {gpu_uuid(0)}\nlocation device\ntime 1\n"
                       f"root {victim.pid}.{vstart}\nend\n")
        rec.chmod(0o600)
        (w / "go").write_text("")
        assert _file(w / "status") == "78"
        if case == "the-rank-root":
            assert victim.wait(timeout=BOUND) == -signal.SIGTERM
        else:
            assert victim.poll() is None, "the named process was signalled"
    finally:
        for p in (victim, shell):
            if p is not None:
                p.kill()
                p.wait()


VMM = pathlib.Path(__file__).parent / "_torch_vmm.py"


def test_a_torch_learner_waiting_with_no_timeout_is_ended_under_launch(tmp_path):
    """The issue's case with real PyTorch: under `rankguard launch --nproc-per-node 2` each
    rank's learner shares a CUDA tensor with a torch.multiprocessing spawn collector
    re-pointed to GPU 3 and waits for its answer with no timeout and no look at the
    collector (_torch_vmm.py --no-timeout). The collector is stopped at cuInit (R1), its
    learner ends with 78 and its own line, and launch stops the job with 78 and the
    summary. Before, the job never ended (this test's bound)."""
    from conftest import fake_node
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    env = clean_env(RANKGUARD_MODE="enforce", RANKGUARD_REGISTRY=str(reg), TMPDIR=str(tmp_path),
                    RANKGUARD_AUDIT=str(tmp_path / "audit.%p.jsonl"))
    p = fake_node(["rankguard", "launch", "--nproc-per-node", "2", "--", "python", VMM, "3",
                   "--no-timeout"], env=env, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 78, out
    assert not [l for l in p.stdout.splitlines() if l.startswith("{")], out   # no learner got an answer
    assert "RANKGUARD DENY ending this process, the rank's process, with status 78" in p.stderr, out
    root = p.stderr.split("Root Cause (first observed failure):\n[0]:\n", 1)[1]
    assert "  rule      : R1 (one GPU per rank)" in root and "  exitcode  : 78 (pid: " in root, root
    assert "  refused   : pid " in root and "torch/cuda/" in root.split("  site      : ", 1)[1], root
    recs = [r for f in tmp_path.glob("audit.*.jsonl") for l in f.read_text().splitlines()
            for r in [json.loads(l)] if r.get("kind") != "map"]
    assert recs and {(r["rule"], r["call"], r["verdict"]) for r in recs} == {("R1", "cuInit", "deny")}, recs

"""Hostile inputs, second round (issue 29): the enforce-mode bypasses (items 1 to 4) and
the stale registry (item 11). Each test is a way the guard let a violation through, or
said something false, on the code before the fix."""
from __future__ import annotations

import pathlib

from _guard import prog
from conftest import GUARD, clean_env, run


def rank_env(tmp: pathlib.Path, **extra) -> dict[str, str]:
    """A guarded rank root on GPU 0 (no rank variables), with its own registry."""
    reg = tmp / "registry"
    reg.mkdir(mode=0o700, exist_ok=True)
    return clean_env(**{"LD_PRELOAD": str(GUARD), "FAKECUDA_GPUS": "8", "CUDA_VISIBLE_DEVICES": "0",
                        "RANKGUARD_MODE": "enforce", "RANKGUARD_REGISTRY": str(reg), **extra})


def descendant(tmp: pathlib.Path, cmd: str, **extra):
    """Run `cmd` as a child of a guarded shell that is the rank root on GPU 0 (its initial
    environment holds CUDA_VISIBLE_DEVICES=0); `cmd` re-points its own CVD. The shell
    prints the child's exit status last: it watches its child itself, so a refusal ends
    only the child (RANKGUARD_REFUSAL_ENDS=process; ending the rank is test_end_rank.py's)."""
    extra.setdefault("RANKGUARD_REFUSAL_ENDS", "process")
    return run(["bash", "-c", f'{cmd}; echo "status $?"'], env=rank_env(tmp, **extra), timeout=60)


# ------------------------------------------------------- item 1: the R1 window for other threads

def test_item1_no_thread_gets_a_context_before_the_r1_verdict(tmp_path):
    """A re-pointed descendant (CVD=1 under a rank root on GPU 0) whose second thread polls
    cuDeviceGet(0) and then calls cuCtxCreate and cuMemAlloc while the main thread's cuInit
    is in the R1 check: every guarded call waits for the verdict, so the process is
    stopped (78) and the second thread never gets a context on the wrong GPU. Before the
    fix only concurrent cuInit callers waited (the second thread got its context in most
    runs)."""
    leaks = []
    for i in range(50):
        p = descendant(tmp_path, f'CUDA_VISIBLE_DEVICES=1 "{prog("guard_r1_window")}"')
        assert p.stdout.splitlines()[-1] == "status 78", f"run {i}: {p.stdout}\n{p.stderr}"
        assert "main: cuInit returned" not in p.stdout, p.stdout
        if "second thread: context and allocation" in p.stdout:
            leaks.append(i)
    assert leaks == [], f"the second thread got a context on GPU 1 in runs {leaks}"


def test_item1_the_rank_gpu_still_runs_both_threads(tmp_path):
    """The same program on the rank's own GPU: the verdict is allow, the waiting thread
    goes on and both threads finish."""
    p = descendant(tmp_path, f'"{prog("guard_r1_window")}"')
    assert p.stdout.splitlines()[-1] == "status 0", p.stdout + p.stderr
    assert "second thread: context and allocation" in p.stdout
    assert "main: cuInit returned" in p.stdout
    assert "RANKGUARD" not in p.stderr, p.stderr


# ------------------------------------------------------------- item 2: fd exhaustion fails closed

def test_item2_a_walk_that_cannot_read_proc_fails_closed(tmp_path):
    """The re-pointed descendant with its fd table full at its first cuInit: the ancestor
    walk cannot open /proc/<pid>/stat, so the rank is unknown. Before the fix it ran on
    silently (exit 0, `[rank -]`); now R1 refuses (78) and the line says what could not be
    read, why (EMFILE) and the fix."""
    p = descendant(tmp_path, f'CUDA_VISIBLE_DEVICES=1 "{prog("guard_fd_full")}"')
    assert p.stdout.splitlines()[-1] == "status 78", p.stdout + p.stderr
    line = next((l for l in p.stderr.splitlines() if "[R1 one GPU per rank]" in l), None)
    assert line is not None, p.stderr
    assert "could not be read (EMFILE)" in line and "/stat" in line, line
    assert "ulimit -n" in line, line


def test_item2_a_full_fd_table_on_the_rank_gpu_is_refused_too(tmp_path):
    """On the rank's own GPU the walk cannot tell either: refused the same way (the
    guard cannot know it is the rank's GPU); with a rank variable there is no walk and the
    process runs."""
    p = descendant(tmp_path, f'"{prog("guard_fd_full")}"')
    assert p.stdout.splitlines()[-1] == "status 78", p.stdout + p.stderr
    assert "EMFILE" in p.stderr
    p = descendant(tmp_path, f'RANK=0 "{prog("guard_fd_full")}"')
    assert p.stdout.splitlines()[-1] == "status 0", p.stdout + p.stderr
    assert "cuInit=0" in p.stdout
    # R1's "started with" (issue 32) is checked all the same: the start environment is
    # read from the process's memory, which needs no descriptor ...
    assert "could not be read" not in p.stderr, p.stderr
    # ... and where it must be read through /proc/self/environ (a program that rewrote its
    # argv array), the process is told what could not be checked
    p = descendant(tmp_path, f'RANK=0 "{prog("guard_fd_full")}" argv')
    assert p.stdout.splitlines()[-1] == "status 0", p.stdout + p.stderr
    assert "/environ could not be read" in p.stderr and "is not checked" in p.stderr, p.stderr

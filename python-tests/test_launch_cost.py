"""What `rankguard launch` starts besides the ranks (issue 17; docs/benchmarks.md figure 4:
8 ranks of /bin/true within 1.3x of a shell loop starting them).

A shell loop forks and execs each rank, nothing else. The launcher starts each rank with
a clone that shares its memory until the exec (src/cli/rank_start.rs: no copy of the
launcher, as a fork makes), and adds exactly two helpers, each a fork that never execs
(src/cli/forked.rs): the driver query, once per launch whatever the number of ranks, and
the reaper. Counted with a preload that logs every fork, clone, exec, posix_spawn and
program image started (c-tests/testlibs/libspawn_log.c), so the test does not depend on
timing. Under the guard (the launcher itself preloaded with it) the query must not run in a
copy of a guarded process: it is an exec of `rankguard __driver-query`, still once.
"""
from __future__ import annotations

import pathlib
from collections import Counter

import pytest

from conftest import CLI, GUARD, TESTS, clean_env, run

LOG_LIB = TESTS / "libspawn_log.so"


def launch_log(tmp_path, nproc, preload=(), **env) -> tuple[int, list[tuple[int, str, str]]]:
    """Run `launch --nproc-per-node N -- /bin/true` under the logging preload; the
    launcher's pid and every logged (pid, call, path)."""
    log = tmp_path / f"spawn-{nproc}-{len(list(tmp_path.iterdir()))}.log"
    assert LOG_LIB.exists(), "run make -C c-tests"
    e = clean_env(FAKECUDA_GPUS="8", SPAWN_LOG=str(log), LD_PRELOAD=":".join([*map(str, preload), str(LOG_LIB)]),
                  **env)
    p = run([CLI, "launch", "--nproc-per-node", str(nproc), "--", "/bin/true"], env=e, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = []
    for line in log.read_text().splitlines():
        pid, call, *path = line.split(" ", 2)
        lines.append((int(pid), call, path[0] if path else ""))
    launcher = lines[0][0]
    return launcher, lines


@pytest.mark.parametrize("nproc", [1, 2, 8])
def test_launch_clones_the_ranks_forks_two_helpers_and_runs_only_the_ranks(tmp_path, nproc):
    launcher, lines = launch_log(tmp_path, nproc)
    calls = Counter((pid == launcher, call, path) for pid, call, path in lines)
    # The launcher's own image, then: each rank a clone sharing its memory (no fork: a
    # fork would copy the launcher) ...
    assert calls[(True, "clone", "vm")] == nproc, lines
    # ... two helpers forked (driver query, reaper) ...
    assert calls[(True, "fork", "")] == 2, lines
    # ... and every other program image is a rank's; the launcher execs nothing itself
    # (the ranks' execve is a raw system call, seen here by the image it starts).
    assert calls[(False, "image", "/bin/true")] == nproc, lines
    assert sum(calls.values()) == 1 + 2 * nproc + 2, lines
    assert not any(call in ("spawn", "exec") or "rankguard" in path for pid, call, path in lines
                   if pid != launcher), lines


def test_the_driver_is_asked_once_also_with_a_parent_cvd(tmp_path):
    _, lines = launch_log(tmp_path, 4, CUDA_VISIBLE_DEVICES="4,5,6,7")
    assert sum(1 for _, call, _ in lines if call == "fork") == 2, lines
    assert sum(1 for _, call, _ in lines if call == "clone") == 4, lines


def test_under_the_guard_the_query_is_an_exec_once(tmp_path):
    launcher, lines = launch_log(tmp_path, 8, preload=[GUARD])
    spawned = [path for pid, call, path in lines if pid == launcher and call == "spawn"]
    assert [pathlib.Path(p).name for p in spawned] == ["rankguard"], lines
    forks = [1 for pid, call, _ in lines if pid == launcher and call == "fork"]
    assert len(forks) == 1, lines  # the reaper
    assert sum(1 for pid, call, _ in lines if pid == launcher and call == "clone") == 8, lines

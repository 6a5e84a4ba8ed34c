"""A rank whose program cannot be executed (issue 17). The launcher starts each rank
without waiting for its exec (src/cli/rank_start.rs; std's `Command::spawn` waited, so ranks
started one after another): a rank that cannot exec writes one line naming
the program and the reason to its stderr and exits 127 (not found) or 126 (any other
failure), as a shell does; the launcher reports it like any failed rank, stops the others
and exits with that status (docs/cli.md)."""
from __future__ import annotations

import re
from collections import Counter

from _cli import CLI, clean_env, cli
from conftest import TESTS, run

LOG_LIB = TESTS / "libspawn_log.so"
NO_VM_CLONE = TESTS / "no_vm_clone"


def launch(*args, **env):
    return cli("launch", *args, env=clean_env(FAKECUDA_GPUS="8", **env), timeout=30)


def test_a_missing_program_exits_127_with_one_line(tmp_path):
    missing = tmp_path / "no-such-program"
    p = launch("--nproc-per-node", "1", "--", str(missing), "arg")
    assert p.returncode == 127, p.stderr
    line = f"rankguard launch: rank 0: cannot execute '{missing}': No such file or directory (os error 2)"
    assert p.stderr.count(line) == 1, p.stderr
    assert "rank 0 (pid " in p.stderr and "exited with status 127" in p.stderr, p.stderr
    assert p.stdout == ""


def cannot_execute_lines(stderr: str, prog, reason: str) -> list[str]:
    """The ranks' lines; each rank that got as far as its exec writes one (the others may be
    stopped by the first failure before they do)."""
    lines = [l for l in stderr.splitlines() if "cannot execute" in l]
    for l in lines:
        assert l.endswith(f": cannot execute '{prog}': {reason}"), l
    return lines


def test_every_rank_that_fails_to_exec_says_so_and_the_launch_exits_127(tmp_path):
    missing = tmp_path / "no-such-program"
    p = launch("--nproc-per-node", "4", "--", str(missing))
    assert p.returncode == 127, p.stderr
    lines = cannot_execute_lines(p.stderr, missing, "No such file or directory (os error 2)")
    ranks = sorted(int(re.search(r"launch: rank (\d+): ", l).group(1)) for l in lines)
    assert ranks and len(set(ranks)) == len(ranks) and set(ranks) <= {0, 1, 2, 3}, p.stderr


def test_a_program_not_on_path_is_searched_like_a_shell_and_exits_127(tmp_path):
    p = launch("--nproc-per-node", "1", "--", "rankguard-test-no-such-program", PATH=str(tmp_path))
    assert p.returncode == 127, p.stderr
    assert ("rankguard launch: rank 0: cannot execute 'rankguard-test-no-such-program': "
            "No such file or directory (os error 2)") in p.stderr, p.stderr


def test_a_file_that_is_not_executable_exits_126(tmp_path):
    prog = tmp_path / "not-executable"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o644)
    p = launch("--nproc-per-node", "2", "--prefix-output", "--", str(prog))
    assert p.returncode == 126, p.stderr
    # With --prefix-output the line comes through the rank's relayed stderr.
    lines = cannot_execute_lines(p.stderr, prog, "Permission denied (os error 13)")
    assert lines and all(re.match(r"\[rank (\d+)\] rankguard launch: rank \1: ", l) for l in lines), p.stderr


def test_a_script_without_interpreter_line_runs_under_sh_as_before(tmp_path):
    # execvp's rule (what std's Command used): a file the kernel cannot exec (ENOEXEC) is
    # run by /bin/sh.
    prog = tmp_path / "plain-script"
    prog.write_text('echo "rank $RANK ran"\nexit 0\n')
    prog.chmod(0o755)
    p = launch("--nproc-per-node", "2", "--", str(prog))
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["rank 0 ran", "rank 1 ran"]


def test_ranks_are_started_without_waiting_for_each_others_exec(tmp_path):
    """Every rank is started although rank 0's exec fails: the launcher did not wait for
    rank 0's exec before starting rank 1 (std's spawn stopped at the first exec error, so
    exactly one rank was started). Counted with the logging preload, no timing."""
    log = tmp_path / "spawn.log"
    missing = tmp_path / "missing"
    p = launch("--nproc-per-node", "8", "--", str(missing), SPAWN_LOG=str(log), LD_PRELOAD=str(LOG_LIB))
    assert p.returncode == 127, p.stderr
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    launcher = int(lines[0][0])
    calls = Counter((int(pid) == launcher, call, rest[0] if rest else "") for pid, call, *rest in lines)
    assert calls[(True, "clone", "vm")] == 8, lines  # the ranks
    assert calls[(True, "fork", "")] == 2, lines  # the driver query, the reaper
    # Ranks started after the first failure may be stopped before their exec: at least one
    # tried it, and none ran anything.
    assert 1 <= len(cannot_execute_lines(p.stderr, missing, "No such file or directory (os error 2)")) <= 8, \
        p.stderr
    assert not any(call == "image" for pid, call, *_ in lines if int(pid) != launcher), lines


def test_where_a_clone_sharing_memory_is_refused_ranks_are_forked(tmp_path):
    """An emulator or a sandbox that allows only threads and forks (qemu-user) answers the
    ranks' clone(CLONE_VM) with EINVAL; c-tests' no_vm_clone makes one with seccomp. The
    launcher then forks every rank (src/cli/rank_start.rs), and the launch is the same."""
    log = tmp_path / "spawn.log"
    p = run([NO_VM_CLONE, CLI, "launch", "--nproc-per-node", "3", "--prefix-output", "--", "sh", "-c",
             'echo "rank $RANK ran"'],
            env=clean_env(FAKECUDA_GPUS="8", SPAWN_LOG=str(log), LD_PRELOAD=str(LOG_LIB)), timeout=30)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == [f"[rank {r}] rank {r} ran" for r in range(3)], p.stdout
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    launcher = int(lines[0][0])
    calls = Counter((int(pid) == launcher, call, rest[0] if rest else "") for pid, call, *rest in lines)
    # One refused clone (the first rank's), then forks: 3 ranks and the two helpers.
    assert calls[(True, "clone", "vm")] == 1, lines
    assert calls[(True, "fork", "")] == 3 + 2, lines


def on_path(tmp_path, name: str, dirs: dict[str, tuple[str, int] | None]) -> str:
    """A PATH of directories under tmp_path, in order; each holds `name` with the given
    text and mode, or not (None)."""
    entries = []
    for d, file in dirs.items():
        p = tmp_path / d
        p.mkdir()
        if file is not None:
            text, mode = file
            (p / name).write_text(text)
            (p / name).chmod(mode)
        entries.append(str(p))
    return ":".join(entries)


def test_path_search_passes_a_denied_file_and_runs_a_later_one_as_execvp(tmp_path):
    # execvp's rule: EACCES on one entry is remembered and the search goes on; a later
    # entry that runs wins. The launcher plans the search, the rank's child only tries the
    # paths (it may not call the C library: src/cli/rank_start.rs).
    path = on_path(tmp_path, "rg-prog", {
        "missing": None,
        "denied": ("#!/bin/sh\necho denied\n", 0o644),
        "good": ("#!/bin/sh\necho \"rank $RANK good\"\n", 0o755),
    })
    p = launch("--nproc-per-node", "2", "--", "rg-prog", PATH=f"{path}:/usr/bin:/bin")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["rank 0 good", "rank 1 good"]


def test_path_search_that_only_finds_a_denied_file_exits_126_permission_denied(tmp_path):
    path = on_path(tmp_path, "rg-prog", {"denied": ("#!/bin/sh\necho denied\n", 0o644), "missing": None})
    p = launch("--nproc-per-node", "1", "--", "rg-prog", PATH=f"{path}:/usr/bin:/bin")
    assert p.returncode == 126, p.stderr
    assert cannot_execute_lines(p.stderr, "rg-prog", "Permission denied (os error 13)"), p.stderr


def test_path_search_runs_a_script_without_interpreter_line_under_sh(tmp_path):
    path = on_path(tmp_path, "rg-plain", {"bin": ('echo "rank $RANK args $*"\n', 0o755)})
    p = launch("--nproc-per-node", "2", "--", "rg-plain", "a", "b c", PATH=f"{path}:/usr/bin:/bin")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["rank 0 args a b c", "rank 1 args a b c"]

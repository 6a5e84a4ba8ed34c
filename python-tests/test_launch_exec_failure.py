"""A rank whose program cannot be executed (issue 17). The launcher forks and execs each
rank without waiting for the exec (src/cli/sys.rs `spawn_rank`; std's `Command::spawn`
waited, so ranks started one after another): a rank that cannot exec writes one line naming
the program and the reason to its stderr and exits 127 (not found) or 126 (any other
failure), as a shell does; the launcher reports it like any failed rank, stops the others
and exits with that status (docs/cli.md)."""
from __future__ import annotations

import re
from collections import Counter

from _cli import clean_env, cli
from conftest import TESTS

LOG_LIB = TESTS / "libspawn_log.so"


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
    """Every rank is forked although rank 0's exec fails: the launcher did not wait for
    rank 0's exec before forking rank 1 (std's spawn stopped at the first exec error, so
    exactly one rank was forked). Counted with the logging preload, no timing."""
    log = tmp_path / "spawn.log"
    missing = tmp_path / "missing"
    p = launch("--nproc-per-node", "8", "--", str(missing), SPAWN_LOG=str(log), LD_PRELOAD=str(LOG_LIB))
    assert p.returncode == 127, p.stderr
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    launcher = int(lines[0][0])
    calls = Counter((int(pid) == launcher, call, rest[0] if rest else "") for pid, call, *rest in lines)
    assert calls[(True, "fork", "")] == 8 + 2, lines  # 8 ranks, the driver query, the reaper
    # Ranks forked after the first failure may be stopped before their exec: at least one.
    assert 1 <= calls[(False, "exec", str(missing))] <= 8, lines
    assert cannot_execute_lines(p.stderr, missing, "No such file or directory (os error 2)"), p.stderr


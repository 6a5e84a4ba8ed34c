"""rankguard CLI: `lib`, help, version and argument errors (docs/cli.md)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

from _cli import CLI, clean_env, cli
from conftest import GUARD, LIB_GUARD, run


def test_lib_prints_the_guard_next_to_the_executable():
    p = cli("lib", check=True)
    assert p.stdout.strip() == str(LIB_GUARD.resolve())
    assert os.path.isabs(p.stdout.strip())


def test_lib_honours_rankguard_lib(tmp_path):
    fake = tmp_path / "librankguard.so"
    fake.write_bytes(b"")
    p = cli("lib", env=clean_env(RANKGUARD_LIB=str(fake)), check=True)
    assert p.stdout.strip() == str(fake)


def test_lib_refuses_a_wrong_rankguard_lib(tmp_path):
    p = cli("lib", env=clean_env(RANKGUARD_LIB=str(tmp_path / "nope.so")))
    assert p.returncode == 2
    assert "RANKGUARD_LIB" in p.stderr and "nope.so" in p.stderr


def test_lib_says_where_it_looked(tmp_path):
    # A copy of the CLI with no library beside it and none in ../lib.
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "rankguard"
    shutil.copy(CLI, exe)
    # ... and nowhere to write the copy a release binary carries (no HOME, no
    # XDG_CACHE_HOME; that copy is tested in test_install.py).
    p = run([exe, "lib"], env=clean_env(HOME=None, XDG_CACHE_HOME=None))
    assert p.returncode == 2
    assert str(tmp_path / "bin" / "librankguard.so") in p.stderr
    assert "lib/librankguard.so" in p.stderr and "RANKGUARD_LIB" in p.stderr
    # The prefix layout: <exe>/../lib/librankguard.so.
    (tmp_path / "lib").mkdir()
    shutil.copy(GUARD, tmp_path / "lib" / "librankguard.so")
    p = run([exe, "lib"], check=True)
    assert p.stdout.strip() == str(tmp_path / "lib" / "librankguard.so")


def test_help_lists_every_command():
    p = cli("--help", check=True)
    for c in ("launch", "run", "check", "plan", "lib"):
        assert f"  {c}" in p.stdout
    for c in ("launch", "run", "check", "plan", "lib"):
        q = cli(c, "--help", check=True)
        assert "Usage: rankguard" in q.stdout
    assert cli("--version", check=True).stdout.startswith("rankguard ")


def test_help_carries_the_reference_an_installed_user_needs():
    """An installed user has no docs/ (issue 32): --help names no file of the repository
    and carries the variables and exit statuses itself; `help CMD` is `CMD --help`."""
    p = cli("--help", check=True)
    assert "docs/" not in p.stdout, p.stdout
    for c in ("report", "doctor", "slurm-task-prolog", "cdi"):
        assert f"  {c} " in p.stdout, p.stdout
    for var in ("RANKGUARD_MODE", "RANKGUARD_AUDIT", "RANKGUARD_NARROW_BY", "RANKGUARD_REGISTRY"):
        assert var in p.stdout, var
    assert "Exit statuses: 0 success" in p.stdout and "78 " in p.stdout, p.stdout
    assert cli("help", "report", check=True).stdout == cli("report", "--help", check=True).stdout


def test_usage_errors_name_the_input():
    cases = [
        (["bogus"], "unknown command 'bogus'"),
        ([], "no command given"),
        (["launch", "--nproc-per-node", "2"], "no command given"),
        (["launch", "--nproc-per-node", "two", "--", "true"], "--nproc-per-node 'two'"),
        (["plan", "--frobnicate"], "unknown option '--frobnicate'"),
        (["plan", "--devices"], "--devices needs a value"),
        (["plan", "--devices", "GPU-12"], "--devices 'GPU-12'"),
        (["plan", "--cpu-ids", "0-x"], "--cpu-ids '0-x'"),
        (["plan", "--nproc-per-node", "1", "--nnodes", "2"], "--master-addr and --master-port"),
        (["plan", "--nproc-per-node", "1", "--master-port", "0"], "--master-port 0"),
        (["plan", "--nproc-per-node", "1", "--sysroot", "/does/not/exist"], "--sysroot /does/not/exist"),
        (["run"], "no command given"),
        (["run", "--narrow-by", "A B", "--", "true"], "--narrow-by 'A B'"),
        (["lib", "extra"], "takes no arguments"),
        (["check", "--json=yes"], "does not take a value"),
    ]
    for args, msg in cases:
        p = cli(*args, env=clean_env(FAKECUDA_GPUS="2"))
        assert p.returncode == 2, (args, p.stderr)
        assert msg in p.stderr, (args, p.stderr)
        # One prefix: `rankguard: error:`, or `rankguard CMD: error:` for a message that
        # names its command, never `rankguard: error: rankguard CMD: ...` (issue 32).
        last = p.stderr.strip().splitlines()[-1]
        assert re.match(r"rankguard( [a-z-]+)?: error: ", last), p.stderr
        assert "error: rankguard" not in last, p.stderr
    p = cli("run", env=clean_env())
    assert p.stderr.startswith("rankguard run: error: no command given"), p.stderr


def test_launch_reports_a_missing_command():
    p = cli("launch", "--nproc-per-node", "1", "--", "/no/such/program", env=clean_env(FAKECUDA_GPUS="2"))
    assert p.returncode == 127
    assert "/no/such/program" in p.stderr


# The CLI's entry point is its own C `main` (`#![no_main]`, src/cli/sys.rs): what it keeps
# of std's start-up is tested here.

def test_a_closed_pipe_is_not_a_death_by_sigpipe():
    # stdout a pipe whose reader is gone: the write fails with EPIPE, which the CLI ignores
    # (`emit`); with SIGPIPE at its default the process would be killed by it.
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([str(CLI), "--help"], stdout=w, stderr=subprocess.PIPE,
                           env=clean_env(), timeout=20)
    finally:
        os.close(w)
    assert p.returncode == 0, (p.returncode, p.stderr)


def test_ranks_get_sigpipe_back_at_its_default():
    # Ignored dispositions survive exec: the launcher must not hand its SIG_IGN to ranks.
    p = cli("launch", "--nproc-per-node", "1", "--", "sh", "-c", "grep SigIgn /proc/self/status")
    assert p.returncode == 0, p.stderr
    ignored = int(p.stdout.split()[-1], 16)
    assert not ignored & (1 << (13 - 1)), p.stdout  # SIGPIPE is 13


def _ignore_sigusr1_only():
    # A shell runs a background job with SIGINT and SIGQUIT ignored, and pytest may be one:
    # the launcher's parent here ignores exactly SIGUSR1.
    for s in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def test_ranks_start_with_no_signal_blocked_and_keep_what_the_launchers_parent_ignored():
    # A rank's child is cloned with every signal blocked (src/cli/rank_start.rs) and clears
    # the mask right before its exec; a signal ignored by whoever started the launcher
    # (SIGUSR1 here, as `nohup` does with SIGHUP) stays ignored, as across a fork and exec.
    p = subprocess.run([str(CLI), "launch", "--nproc-per-node", "2", "--prefix-output", "--", "cat",
                        "/proc/self/status"], capture_output=True, text=True, env=clean_env(), timeout=30,
                       preexec_fn=_ignore_sigusr1_only)
    assert p.returncode == 0, p.stderr
    for rank in (0, 1):
        fields = dict(l.split(":", 1) for l in p.stdout.splitlines() if l.startswith(f"[rank {rank}] Sig"))
        assert int(fields[f"[rank {rank}] SigBlk"], 16) == 0, p.stdout
        ignored = int(fields[f"[rank {rank}] SigIgn"], 16)
        assert ignored == 1 << (signal.SIGUSR1 - 1), p.stdout


def test_closed_standard_descriptors_are_opened_on_dev_null():
    # Started with stdout closed, the CLI must not hand a file of its own to a rank as its
    # stdout: descriptors 0-2 are opened on /dev/null first, as std's start-up does.
    # The open file's flags tell the launcher's own /dev/null (read-write, as std opens it)
    # from the read-only one it gives ranks as stdin, which would otherwise land on fd 1.
    rank = ("import os, sys; flags = open('/proc/self/fdinfo/1').read().split()[3]; "
            "sys.stderr.write(os.readlink('/proc/self/fd/1') + ' ' + flags + chr(10))")
    p = subprocess.run(f'exec 1>&- && exec {CLI} launch --nproc-per-node 1 -- {sys.executable} -c "{rank}"',
                       shell=True, stderr=subprocess.PIPE, text=True, env=clean_env(), timeout=30)
    assert p.returncode == 0, p.stderr
    # The first line is the rank's; launch's summary follows it.
    path, flags = p.stderr.splitlines()[0].split()
    assert path == "/dev/null" and int(flags, 8) & os.O_ACCMODE == os.O_RDWR, p.stderr


def test_an_error_exit_status_reaches_the_shell():
    p = cli("launch", "--nproc-per-node", "1", "--", "sh", "-c", "exit 7")
    assert p.returncode == 7, p.stderr

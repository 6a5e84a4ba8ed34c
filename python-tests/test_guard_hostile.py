"""The guard never hangs, corrupts or exposes the program it lives in (issue 14): each test
is one finding of a hostile-input campaign. Hangs are bounded by each run's timeout, which
fails the test (subprocess.TimeoutExpired), never the suite."""
from __future__ import annotations

import json
import os
import stat
import subprocess

from conftest import GUARD, TESTS, clean_env, run
from _guard import guarded, prog

GPU0 = "GPU-10c0ffee-0000-4000-8000-000000000000"


def guard_env(**extra):
    return clean_env(LD_PRELOAD=str(GUARD), **extra)


def test_item1_fifo_without_reader_never_hangs(tmp_path):
    """RANKGUARD_AUDIT / RANKGUARD_DEBUG_FILE naming a FIFO nobody reads: said once, the
    program runs on (it used to block forever in open at its first cuInit)."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for var in ["RANKGUARD_AUDIT", "RANKGUARD_DEBUG_FILE"]:
        env = guard_env(CUDA_VISIBLE_DEVICES="0", RANKGUARD_DEBUG="DEBUG", **{var: str(fifo)})
        p = run([prog("guard_call"), "link", "cuDeviceGet", "1"], env=env, timeout=20)
        assert p.returncode == 0, p.stderr
        lines = [x for x in p.stderr.splitlines() if "FIFO with no reader" in x]
        assert len(lines) == 1 and var in lines[0], p.stderr


def test_item1_full_fifo_drops_records_instead_of_blocking(tmp_path):
    """A FIFO with a reader that never reads: once the pipe is full, records are dropped
    (counted, said once), the program is never blocked."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    rd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    import fcntl
    fcntl.fcntl(rd, 1031, 4096)  # F_SETPIPE_SZ: one page
    try:
        env = guard_env(CUDA_VISIBLE_DEVICES="3", RANKGUARD_AUDIT=str(fifo))
        p = run([prog("guard_race"), "64"], env=env, timeout=30)
        # 64 records of ~700 bytes exceed a one-page pipe.
        assert p.returncode == 0, p.stderr
        lost = [x for x in p.stderr.splitlines() if "are being lost" in x]
        assert len(lost) == 1 and "full" in lost[0], p.stderr
    finally:
        os.close(rd)


def test_item2_fork_during_setup_never_deadlocks(tmp_path):
    """32 threads enter the guard's one-time set-up (made to last 20 ms); the main thread
    forks 20 children meanwhile. Each child must take the set-up over, not wait forever."""
    slow = TESTS / "slow_hostname.so"
    env = clean_env(LD_PRELOAD=f"{slow}:{GUARD}", CUDA_VISIBLE_DEVICES="0",
                    RANKGUARD_AUDIT=str(tmp_path / "a.jsonl"))
    for _ in range(3):
        p = run([prog("guard_fork_race"), "20"], env=env, timeout=60)
        assert p.returncode == 0 and p.stdout.strip() == "hung 0 bad 0", p.stdout + p.stderr


def test_item2_fork_race_without_slowdown(tmp_path):
    """The issue's recipe as it is: no child hangs, whatever the timing."""
    env = guard_env(CUDA_VISIBLE_DEVICES="0", RANKGUARD_AUDIT=str(tmp_path / "a.jsonl"))
    for _ in range(10):
        p = run([prog("guard_fork_race"), "20"], env=env, timeout=60)
        assert p.returncode == 0 and p.stdout.strip() == "hung 0 bad 0", p.stdout + p.stderr


def test_item3_audit_never_written_into_the_program_own_file(tmp_path):
    """The program closes every fd >= 3 and opens its own file on the old number; or a
    vfork child touches the guard first: the audit records still go to the audit file."""
    for how in ["close", "vfork"]:
        audit = tmp_path / f"audit-{how}.jsonl"
        mine = tmp_path / f"mine-{how}.txt"
        env = guard_env(CUDA_VISIBLE_DEVICES="0", RANKGUARD_AUDIT=str(audit))
        p = run([prog("guard_fd_reuse"), how, str(mine)], env=env, timeout=20)
        assert p.returncode == 0 and "cuDeviceGet(1)=101" in p.stdout, p.stdout + p.stderr
        assert mine.read_text() == "mine\n", (how, mine.read_text())
        recs = [r for r in map(json.loads, audit.read_text().splitlines()) if r.get("kind") != "map"]
        assert len(recs) == 2 and all(r["call"] == "cuDeviceGet" for r in recs), recs


def test_item4_audit_files_are_private_and_never_followed(tmp_path):
    # created 0600
    r = guarded([prog("guard_call"), "link", "cuDeviceGet", "1"], tmp_path, cvd="0")
    audit = next(tmp_path.glob("audit-*.jsonl"))
    assert stat.S_IMODE(audit.stat().st_mode) == 0o600, oct(audit.stat().st_mode)
    assert len(r.audit) == 1
    # a symbolic link (to a victim's file) is refused, the victim untouched
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "rg-audit.jsonl"
    link.symlink_to(victim)
    p = run([prog("guard_call"), "link", "cuDeviceGet", "1"],
            env=guard_env(CUDA_VISIBLE_DEVICES="0", RANKGUARD_AUDIT=str(link)), timeout=20)
    assert victim.read_text() == "precious\n"
    assert len([x for x in p.stderr.splitlines() if "symbolic link" in x]) == 1, p.stderr
    # a file another user created first is refused, not appended to
    trap = tmp_path / "trap.jsonl"
    trap.write_text("")
    if os.geteuid() == 0:
        os.chown(trap, 65534, 65534)
        trap.chmod(0o666)
        env = guard_env(CUDA_VISIBLE_DEVICES="0", RANKGUARD_AUDIT=str(trap),
                        RANKGUARD_DEBUG="INFO", RANKGUARD_DEBUG_FILE=str(trap))
        p = run([prog("guard_call"), "link", "cuDeviceGet", "1"], env=env, timeout=20)
        assert trap.read_text() == ""
        owned = [x for x in p.stderr.splitlines() if "belongs to uid 65534" in x]
        assert len(owned) == 2, p.stderr


def test_item8_rank_gpu_that_names_no_single_gpu_fails_closed(tmp_path):
    """RANKGUARD_RANK_GPU=GPU- (a prefix of every GPU), an ambiguous or unverifiable
    prefix, empty, or not UTF-8: the guard stops the process at cuInit, and
    `rankguard check` on the same environment says it fails too."""
    from _cli import CLI
    for value in [b"GPU-", b"GPU-1", b"", b"\xff", b"GPU-12"]:
        env = {k.encode(): v.encode() for k, v in guard_env(CUDA_VISIBLE_DEVICES="2").items()}
        env[b"RANKGUARD_RANK_GPU"] = value
        p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "0"], env=env, capture_output=True, timeout=20)
        assert p.returncode == 78, (value, p.stderr)
        c = subprocess.run([str(CLI), "check", "--json"], env=env, capture_output=True, timeout=60)
        assert c.returncode == 1, (value, c.stdout)
        assert json.loads(c.stdout)["rank_gpu_matches"] is False, value
    # the rank's own entry and full UUIDs still pass, in both
    for value in [b"2", b"GPU-12c0ffee-0000-4000-8000-000000000002"]:
        env = {k.encode(): v.encode() for k, v in guard_env(CUDA_VISIBLE_DEVICES="2").items()}
        env[b"RANKGUARD_RANK_GPU"] = value
        p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "0"], env=env, capture_output=True, timeout=20)
        assert p.returncode == 0, (value, p.stderr)
        c = subprocess.run([str(CLI), "check", "--json"], env=env, capture_output=True, timeout=60)
        assert c.returncode == 0, (value, c.stdout)


def test_item9_lost_audit_records_are_said_once(tmp_path):
    env = guard_env(CUDA_VISIBLE_DEVICES="3", RANKGUARD_AUDIT="/dev/full")
    p = run([prog("guard_race"), "16"], env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    lost = [x for x in p.stderr.splitlines() if "are being lost" in x]
    assert len(lost) == 1 and "No space left on device" in lost[0], p.stderr
    env = guard_env(CUDA_VISIBLE_DEVICES="3", RANKGUARD_DEBUG="DEBUG", RANKGUARD_DEBUG_FILE="/dev/full")
    p = run([prog("guard_race"), "16"], env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if "/dev/full" in x or "Unable to write" in x]
    assert len(lines) == 1 and "RANKGUARD_DEBUG_FILE" in lines[0], p.stderr


def test_item10_non_utf8_values(tmp_path):
    base = {k.encode(): v.encode() for k, v in guard_env().items()}
    env = dict(base)
    env[b"CUDA_VISIBLE_DEVICES"] = b"\xff"
    p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "0"], env=env, capture_output=True, timeout=20)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 78, err
    assert "CUDA_VISIBLE_DEVICES=\\xff," in err and "<unset>" not in err, err
    env = dict(base)
    env[b"CUDA_VISIBLE_DEVICES"] = b"0"
    env[b"RANKGUARD_MODE"] = b"war\xffn"
    p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "1"], env=env, capture_output=True, timeout=20)
    err = p.stderr.decode(errors="replace")
    assert "RANKGUARD_MODE=" in err and "is not valid" in err, err
    assert "denied" in err  # enforce


def test_item12_dlopened_library_is_inert_and_says_so(tmp_path):
    """dlopen()ed instead of preloaded, the library guards nothing (the program's own calls
    never reach it): it says so once and passes calls through, never 500."""
    env = clean_env(CUDA_VISIBLE_DEVICES="0,1")
    p = run([prog("guard_dlopen"), str(GUARD)], env=env, timeout=20)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "cuInit=0 cuDeviceGet(0)=0 cuDeviceGet(1)=0", p.stdout
    lines = [x for x in p.stderr.splitlines() if "RANKGUARD" in x]
    assert len(lines) == 1 and "dlopen" in lines[0] and "inert" in lines[0], p.stderr
    # preloaded, the same program is guarded (R1 stops it)
    p = run([prog("guard_dlopen"), str(GUARD)], env=guard_env(CUDA_VISIBLE_DEVICES="0,1"), timeout=20)
    assert p.returncode == 78, p.stdout + p.stderr


def test_item1_a_stderr_nobody_reads_never_hangs_the_program(tmp_path):
    """The guard's lines go to the program's stderr, whose blocking mode is not ours: when
    it is a full pipe nobody reads, a line waits at most 2 s, then is dropped."""
    import fcntl
    import time
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    try:
        t0 = time.monotonic()
        p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "1"], stdout=subprocess.PIPE,
                           stderr=w, env=guard_env(CUDA_VISIBLE_DEVICES="0"), timeout=30, text=True)
        assert p.returncode == 0 and "rc=101" in p.stdout, p.stdout
        assert time.monotonic() - t0 < 15
    finally:
        os.close(r)
        os.close(w)

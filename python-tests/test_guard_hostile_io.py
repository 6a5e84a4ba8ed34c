"""Hostile inputs, second round (issue 29, items 5-10 and 12): the guard's own output never
hangs, kills or corrupts the program it lives in. Each test is bounded by its run's timeout,
which fails the test (subprocess.TimeoutExpired), never the suite."""
from __future__ import annotations

import fcntl
import os
import resource
import subprocess

import json

from conftest import CLI, GUARD, PYTHON, clean_env
from _guard import prog

# A Python program that makes violations (cuDeviceGet with ordinal 1: R2) with a periodic
# signal arriving every 300 ms (a handler that does nothing, as a profiler's or a
# progress timer's would).
SIGNALLED = """
import ctypes, signal, sys
signal.signal(signal.SIGALRM, lambda *a: None)
signal.setitimer(signal.ITIMER_REAL, 0.3, 0.3)
lib = ctypes.CDLL('libcuda.so.1'); lib.cuInit(0); d = ctypes.c_int()
for i in range(int(sys.argv[1])):
    rc = lib.cuDeviceGet(ctypes.byref(d), 1)
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print('rc=%d' % rc, flush=True)
"""


def full_pipe():
    """A pipe whose buffer is full and that nobody reads: (read end, blocking write end)."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return r, w


def test_item5_blocked_stderr_under_a_periodic_signal_is_bounded(tmp_path):
    """stderr a full pipe nobody reads and a signal every 300 ms: each EINTR used to start
    a fresh 2 s wait, so the violating call never returned. The wait is a deadline: the
    line is dropped after 2 s whatever the signals, and the program ends."""
    script = tmp_path / "sig.py"
    script.write_text(SIGNALLED)
    r, w = full_pipe()
    try:
        env = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0", RANKGUARD_MODE="warn")
        p = subprocess.run([PYTHON, str(script), "1"], stdout=subprocess.PIPE, stderr=w,
                           env=env, timeout=40, text=True)
        # warn mode: the call reaches the driver, which has no device 1 under CVD=0 (101).
        assert p.returncode == 0 and "rc=101" in p.stdout, p.stdout
    finally:
        os.close(r)
        os.close(w)


def test_item6_file_size_limit_never_kills_the_program(tmp_path):
    """`ulimit -f` below the shared audit (or debug) file's size: the guard's write used to
    raise SIGXFSZ and kill the program (status 153; SIGXFSZ's default action). The record is
    lost, said once, and the program runs on."""
    for var, extra in [("RANKGUARD_AUDIT", {}),
                       ("RANKGUARD_DEBUG_FILE", {"RANKGUARD_DEBUG": "DEBUG"})]:
        big = tmp_path / f"{var}.log"
        big.write_bytes(b"x" * 8192 + b"\n")
        env = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0", **{var: str(big)}, **extra)

        def limit():
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

        # restore_signals (the default) gives the program SIGXFSZ's default action.
        p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "1"], capture_output=True,
                           text=True, env=env, timeout=40, preexec_fn=limit)
        assert p.returncode == 0 and "rc=101" in p.stdout, (var, p.returncode, p.stdout, p.stderr)
        lost = [x for x in p.stderr.splitlines() if "being lost" in x and var in x]
        assert len(lost) == 1 and "too large" in lost[0].lower(), p.stderr
        assert big.stat().st_size == 8193


def test_item10_guard_and_check_agree_on_entries_cuda_does_not_read():
    """`0,` and `0,-1` are the single device 0 (docs/design.md §3: the first invalid entry
    truncates the list). The guard allowed them silently and `rankguard check` exited 1:
    now both decide on the entries read (allowed, exit 0) and both say the rest, in the same
    words (one function, crates/core cvd::unread)."""
    for value in ["0,", "0,-1"]:
        env = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES=value)
        p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "0"], capture_output=True,
                           text=True, env=env, timeout=30)
        assert p.returncode == 0 and "rc=0" in p.stdout, (value, p.stdout, p.stderr)
        said = [x for x in p.stderr.splitlines() if "CUDA reads only its first 1 of 2 entries" in x]
        assert len(said) == 1 and "fix the variable" in said[0], (value, p.stderr)
        c = subprocess.run([str(CLI), "check", "--json"], capture_output=True, text=True, env=env, timeout=60)
        d = json.loads(c.stdout)
        assert c.returncode == 0 and d["ok"] is True and d["entries"] == ["0"], (value, d)
        sentence = said[0].split(" RANKGUARD WARN ", 1)[1]
        assert sentence in d["warnings"], (value, sentence, d["warnings"])


def test_item8_long_values_never_cut_a_line_nor_glue_the_next():
    """A 2,000-character RANKGUARD_* value, or an audit path over 1 KiB: the guard's line was
    cut at 1,024 bytes without its newline and the next line (the R2 denial) glued onto it.
    Every line ends with its newline and keeps its end (what happens, the fix); the long
    value is shown by its two ends."""
    long_dir = "/nonexistent/" + "d" * 1500
    cases = [
        ({"RANKGUARD_MODE": "x" * 2000 + "END"}, "is not valid: expected"),
        ({"RANKGUARD_AUDIT": long_dir + "/a.jsonl"}, "no audit records will be written by this process"),
    ]
    for extra, end in cases:
        env = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0", **extra)
        p = subprocess.run([str(prog("guard_call")), "link", "cuDeviceGet", "1"], capture_output=True,
                           text=True, env=env, timeout=30)
        assert p.returncode == 0 and "rc=101" in p.stdout, (p.stdout, p.stderr)
        lines = [x for x in p.stderr.splitlines() if "RANKGUARD" in x]
        assert all(x.count(" RANKGUARD ") == 1 for x in lines), lines
        said = [x for x in lines if end in x]
        assert len(said) == 1 and len(said[0]) < 1024 and " [...] " in said[0], lines
        denial = [x for x in lines if "cuDeviceGet(ordinal=1) denied [R2" in x]
        assert len(denial) == 1 and end not in denial[0], lines


# The start of every audit record (docs/schema/audit-record.v1.json: "format" comes first).
RECORD_START = b'{"format":"rankguard-audit"'


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def test_item7_a_record_cut_by_a_full_file_system_never_merges_with_a_later_one(tmp_path):
    """A record crossing the space left on a full tmpfs left a fragment without a newline;
    the next record, written after space was freed, was glued to it and `report` lost it.
    A record is whole or absent: the fragment stays alone on its line (the writer starts its
    next record with a newline, in the same write) and `report` counts it as one torn
    record, keeping every whole one.

    A 4-page tmpfs in a private mount namespace, 3 pages taken by a filler file: the audit
    file gets one page. guard_volume makes 40 violations at site_a (full records, ~400
    bytes each: one crosses the page's end, the later ones find no space), removes the
    filler, then makes 5 at site_b. A record that ends exactly at the page's end leaves no
    fragment: then the run is repeated with the file shifted by empty lines (which the
    report ignores), so that one record crosses."""
    flags = "-m" if os.geteuid() == 0 else "-rm"
    fs, out = tmp_path / "fs", tmp_path / "audit.jsonl"
    fs.mkdir()
    script = ('set -e; mount -t tmpfs -o size=16k,mode=0700 tmpfs "$1"; '
              'dd if=/dev/zero of="$1/fill" bs=4096 count=3 2>/dev/null; '
              'printf "%s" "$2" > "$1/a.jsonl"; '
              'LD_PRELOAD="$3" RANKGUARD_AUDIT="$1/a.jsonl" "$4" unlink 40 "$1/fill" 5; '
              'cp "$1/a.jsonl" "$5"')
    env = clean_env(CUDA_VISIBLE_DEVICES="0,1", RANKGUARD_MODE="warn")
    for pad in range(3):
        p = subprocess.run(["unshare", flags, "sh", "-c", script, "sh", str(fs), "\n" * pad, str(GUARD),
                            str(prog("guard_volume")), str(out)],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0 and "done n=45" in p.stdout, (p.returncode, p.stdout, p.stderr)
        lines = out.read_bytes().split(b"\n")
        bad = [ln for ln in lines if ln.strip() and not _parses(ln)]
        if bad:
            break
    else:
        raise AssertionError("no record crossed the end of the space in three runs")
    lost = [x for x in p.stderr.splitlines() if "being lost" in x]
    assert len(lost) == 1 and "No space left on device" in lost[0], p.stderr
    # The writer: the fragment is alone on its line, a later record never glued to it.
    assert len(bad) == 1 and bad[0].startswith(RECORD_START) and bad[0].count(RECORD_START) == 1, bad
    whole = [json.loads(ln) for ln in lines if ln.strip() and _parses(ln)]
    at = {s: sum(1 for r in whole if r.get("site", "").startswith(f"guard_volume(site_{s}+")) for s in "ab"}
    assert at["b"] == 5 and 0 < at["a"] < 40, at
    # The report: every whole record, and the fragment as one torn record.
    doc = json.loads(subprocess.run([str(CLI), "report", "--json", str(out)], capture_output=True,
                                    text=True, timeout=60).stdout)
    got = {s.split("+")[0]: n for g in doc["groups"] if g["call"] == "cuDeviceGet"
           for s, n in [(x["site"], x["count"]) for x in g["sites"]]}
    assert got == {"guard_volume(site_a": at["a"], "guard_volume(site_b": 5}, got
    assert doc["totals"]["problems"] == 1, doc["problems"]
    assert doc["problems"][0]["why"].startswith("torn"), doc["problems"]


def test_item7_report_resynchronises_at_a_record_glued_to_a_fragment(tmp_path):
    """The reader alone: another process's record can land right after a fragment (the
    writer's newline only covers its own next record). `report` splits the line at each
    record's start: the fragment is one torn record, the record after it is kept."""
    p = subprocess.run([str(prog("guard_volume")), "loop", "3"], capture_output=True, text=True,
                       env=clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0,1", RANKGUARD_MODE="warn",
                                     RANKGUARD_AUDIT=str(tmp_path / "a.jsonl")), timeout=60)
    assert p.returncode == 0, p.stderr
    recs = [r for r in (tmp_path / "a.jsonl").read_bytes().splitlines() if b'"call":"cuDeviceGet"' in r]
    assert len(recs) == 3
    glued = tmp_path / "glued.jsonl"
    glued.write_bytes(recs[0] + b"\n" + recs[1][:155] + recs[2] + b"\n")
    doc = json.loads(subprocess.run([str(CLI), "report", "--json", str(glued)], capture_output=True,
                                    text=True, timeout=60).stdout)
    [g] = [g for g in doc["groups"] if g["call"] == "cuDeviceGet"]
    assert g["count"] == 2 and doc["totals"]["problems"] == 1, doc
    assert doc["problems"][0]["line"] == 2 and doc["problems"][0]["why"].startswith("torn"), doc["problems"]

"""Warn mode at production volume (issue 19): per process and per (rule, call, site), the
first 100 violations are recorded in full and later ones are counted and written as
summary records; `rankguard report` totals are exact, whatever way the process ends.

Driven by c-tests/build/tests/guard_volume (every violation is cuDeviceGet(&d, 1), R2).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import CLI, GUARD, PYTHON, clean_env, run
from _guard import guarded, prog

FULL = 100  # FULL_PER_SITE in src/guard/6_audit/tally.rs


def report_json(*paths) -> dict:
    p = run([CLI, "report", "--json", *paths], timeout=120)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    return json.loads(p.stdout)


def sites_of(doc: dict, call: str = "cuDeviceGet") -> dict[str, int]:
    out: dict[str, int] = {}
    for g in doc["groups"]:
        if g["call"] == call:
            for s in g["sites"]:
                out[s["site"]] = out.get(s["site"], 0) + s["count"]
    return out


def one_site(doc: dict, prefix: str) -> int:
    [(site, n)] = [(s, n) for s, n in sites_of(doc).items() if s.startswith(prefix)]
    return n


@pytest.mark.parametrize("mode", ["warn", "enforce"])
def test_200000_violations_stay_small_and_are_counted_exactly(tmp_path, mode):
    r = guarded([prog("guard_volume"), "loop", "200000"], tmp_path, cvd="0,1" if mode == "warn" else "0",
                mode=mode, timeout=120)
    assert r.rc == 0 and "done n=200000" in r.out, r.out + r.err
    audit = next(tmp_path.glob("audit-*.jsonl"))
    assert audit.stat().st_size < 1_000_000, audit.stat().st_size
    full = [x for x in r.audit if x["call"] == "cuDeviceGet" and not x.get("summary")]
    summaries = [x for x in r.audit if x.get("summary")]
    assert len(full) == FULL
    assert sum(x["count"] for x in summaries) == 200000 - FULL
    assert all(x["verdict"] == ("warn" if mode == "warn" else "deny") for x in full + summaries)
    for s in summaries:
        assert s["site"] == full[0]["site"] and s["since"] <= s["ts"]
    doc = report_json(audit)
    assert one_site(doc, "guard_volume(site_a+") == 200000
    [g] = [g for g in doc["groups"] if g["call"] == "cuDeviceGet"]
    assert g["count"] == 200000 and doc["totals"]["problems"] == 0
    assert doc["totals"]["violations"] == 200000 + (1 if mode == "warn" else 0)  # + R1 at cuInit (warn)
    # The stderr line stays once per (rule, call, site).
    assert sum(1 for ln in r.err.splitlines() if "cuDeviceGet(ordinal=1)" in ln) == 1


def test_two_sites_8_threads_4_processes_on_one_file(tmp_path):
    audit = tmp_path / "shared.jsonl"
    env = clean_env(LD_PRELOAD=str(GUARD), RANKGUARD_AUDIT=str(audit), RANKGUARD_MODE="warn",
                    CUDA_VISIBLE_DEVICES="0,1")
    n = 20000
    procs = [subprocess.Popen([str(prog("guard_volume")), "threads", str(n), "8"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and f"done n={2 * n * 8}" in out, out + err
    doc = report_json(audit)
    assert doc["totals"]["problems"] == 0, doc["problems"]
    assert one_site(doc, "guard_volume(site_a+") == 4 * 8 * n
    assert one_site(doc, "guard_volume(site_b+") == 4 * 8 * n
    # Every line is whole JSON (report would list torn ones as problems; check directly too).
    lines = audit.read_text().splitlines()
    assert all(json.loads(ln) for ln in lines)
    # Per process: 100 full records per site, the rest in summaries.
    full = [r for r in map(json.loads, lines) if r.get("kind") != "map"]
    per = {}
    for x in full:
        if x["call"] == "cuDeviceGet" and not x.get("summary"):
            per[(x["pid"], x["site"])] = per.get((x["pid"], x["site"]), 0) + 1
    assert len(per) == 8 and set(per.values()) == {FULL}, per


@pytest.mark.parametrize("how", ["return", "exit", "exec", "execl"])
def test_totals_are_exact_however_the_process_ends(tmp_path, how):
    n = 12345
    args = {"return": ["loop", str(n)], "exit": ["exit", str(n)],
            "exec": ["exec", str(n), "/bin/sh", "-c", "echo execed"],
            "execl": ["execl", str(n), "echo execed with $# args: $0"]}[how]
    r = guarded([prog("guard_volume"), *args], tmp_path, cvd="0,1", mode="warn")
    assert r.rc == 0 and f"done n={n}" in r.out, r.out + r.err
    if how == "exec":
        assert "execed" in r.out
    if how == "execl":
        # The variadic call's arguments went through the guard's trampoline intact.
        assert "execed with 0 args: sh" in r.out, r.out
    assert one_site(report_json(next(tmp_path.glob("audit-*.jsonl"))), "guard_volume(site_a+") == n


def test_exec_through_python_os_execv_keeps_exact_totals(tmp_path):
    script = tmp_path / "ex.py"
    script.write_text(
        "import ctypes, os\n"
        "lib = ctypes.CDLL('libcuda.so.1'); lib.cuInit(0); d = ctypes.c_int()\n"
        "for _ in range(500):\n"
        "    lib.cuDeviceGet(ctypes.byref(d), 1)\n"
        "os.execv('/bin/true', ['/bin/true'])\n")
    r = guarded([PYTHON, script], tmp_path,
                cvd="0,1", mode="warn")
    assert r.rc == 0, r.out + r.err
    assert sum(sites_of(report_json(next(tmp_path.glob("audit-*.jsonl")))).values()) == 500


def test_counts_are_written_within_an_interval_even_when_violations_stop(tmp_path):
    """SIGKILL and _exit run no handler: what the flusher wrote is what survives. After
    violations stop, one interval (1 s) later everything is written, so a process killed
    then loses nothing; killed earlier, it loses at most the last interval (README).
    The flusher is a thread, started only in a program that has more than one thread
    already (`t:`: guard_volume starts an idle thread first); a single-threaded program
    is the next test's."""
    audit = tmp_path / "k.jsonl"
    env = clean_env(LD_PRELOAD=str(GUARD), RANKGUARD_AUDIT=str(audit), RANKGUARD_MODE="warn",
                    CUDA_VISIBLE_DEVICES="0,1")
    p = subprocess.Popen([str(prog("guard_volume")), "t:idle", "5000"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("idle n=5000")
        time.sleep(2.5)
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    assert one_site(report_json(audit), "guard_volume(site_a+") == 5000
    # _exit after more than an interval: exact too.
    r = guarded([prog("guard_volume"), "t:_exit", "3000", "2500"], tmp_path, cvd="0,1", mode="warn")
    assert r.rc == 0, r.out + r.err
    assert one_site(report_json(next(tmp_path.glob("audit-*.jsonl"))), "guard_volume(site_a+") == 3000


def test_a_single_threaded_program_stays_single_threaded_and_gets_its_summaries(tmp_path):
    """Issue 29, item 9: after 101 violations at one site with an audit file, the guard
    started its summary thread, so a single-threaded program's unshare(CLONE_NEWUSER)
    failed with EINVAL. The guard adds no thread to a process that has one: the violating
    call writes the summaries once an interval (1 s) has passed, and exit writes the rest.

    guard_volume single: 5000 violations, then it reports its threads and unshare's
    result, sleeps 1.2 s, makes 64 more violations (the guard reads the clock at every
    64th counted one: that call writes every count so far, its own included) and waits to
    be killed: SIGKILL runs no handler, so the audit file holds what that call wrote: the
    5000 from before the pause and 1 to 64 of those after it."""
    audit = tmp_path / "s.jsonl"
    env = clean_env(LD_PRELOAD=str(GUARD), RANKGUARD_AUDIT=str(audit), RANKGUARD_MODE="warn",
                    CUDA_VISIBLE_DEVICES="0,1")
    p = subprocess.Popen([str(prog("guard_volume")), "single", "5000", "1200", "64"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        idle = p.stdout.readline()
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    assert first.strip() == "threads=1 unshare=0", first
    assert idle.startswith("idle n=5064"), idle
    written = one_site(report_json(audit), "guard_volume(site_a+")
    assert 5000 < written <= 5064, written
    # Ending normally: exit writes what was counted since (here: everything after the 100).
    r = guarded([prog("guard_volume"), "exit", "3000"], tmp_path, cvd="0,1", mode="warn")
    assert r.rc == 0, r.out + r.err
    assert sum(x["count"] for x in r.audit if x.get("summary")) == 2900
    assert one_site(report_json(next(tmp_path.glob("audit-*.jsonl"))), "guard_volume(site_a+") == 3000


def test_no_audit_file_still_one_line_per_site(tmp_path):
    env = clean_env(LD_PRELOAD=str(GUARD), RANKGUARD_MODE="warn", CUDA_VISIBLE_DEVICES="0,1")
    p = run([prog("guard_volume"), "threads", "5000", "4"], env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    got = [ln for ln in p.stderr.splitlines() if "cuDeviceGet(ordinal=1)" in ln]
    assert len(got) == 2 and {ln.rsplit(" at ", 1)[1].split("+")[0] for ln in got} == {
        "guard_volume(site_a", "guard_volume(site_b"}, got

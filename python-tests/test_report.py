"""`rankguard report` over real audit files (issue 6).

A known set of violations is planted by running real guarded processes
(c-tests/build/tests/guard_call under librankguard.so on the fake node) as "ranks" 0..3 and
one process with no rank, each appending to its rank's RANKGUARD_AUDIT file. The expected
summary is computed from the plan alone (which rule/call/rank/verdict each run plants, and
so which run is the first of each group); only the fields the report passes through
unchanged (time, args, detail, CUDA_VISIBLE_DEVICES, GPU) are read back from the record of
the run the plan says comes first. The report, human and --json, must equal it exactly.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import socket

import pytest

from conftest import CLI, GUARD, clean_env, run
from _guard import prog

RULE_NAMES = {"R1": "one GPU per rank", "R2": "cuda:0 only",
              "R3": "no cross-device IPC inside a rank", "R4": "no peer access inside a rank"}

# (audit file, RANK or None, mode, CUDA_VISIBLE_DEVICES, guard_call args,
#  the records this run plants: [(rule, call, verdict)])
PLAN = [
    ("rank0", "0", "enforce", "3", ["link", "cuDeviceGet", "1"], [("R2", "cuDeviceGet", "deny")]),
    ("rank0", "0", "enforce", "3", ["link", "cuDeviceGet", "0"], []),
    ("rank1", "1", "enforce", "3", ["link", "cuDeviceGet", "2"], [("R2", "cuDeviceGet", "deny")]),
    ("rank1", "1", "enforce", "3", ["link", "cudaDeviceEnablePeerAccess", "1"],
     [("R4", "cudaDeviceEnablePeerAccess", "deny")]),
    ("rank2", "2", "warn", "0,1", ["link", "cuDeviceGet", "0"], [("R1", "cuInit", "warn")]),
    ("rank2", "2", "enforce", "3", ["dlsym", "cuDeviceGet", "1"], [("R2", "cuDeviceGet", "deny")]),
    ("rank3", "3", "enforce", "3", ["link", "cudaMemcpyPeer", "1"], [("R4", "cudaMemcpyPeer", "deny")]),
    ("rank3", "3", "enforce", "3", ["gpa2", "cuCtxCreate", "2", "12050"], [("R2", "cuCtxCreate", "deny")]),
    ("rank3", "3", "warn", "0,1", ["link", "cuDeviceGet", "0"], [("R1", "cuInit", "warn")]),
    # A second rank-0 process whose records go to another file, given FIRST on the command
    # line: the first occurrence must still be the earlier run (by time, not input order).
    ("late0", "0", "enforce", "3", ["link", "cuDeviceGet", "1"], [("R2", "cuDeviceGet", "deny")]),
    ("late0", "0", "enforce", "3", ["link", "cudaSetDevice", "1"], [("R2", "cudaSetDevice", "deny")]),
    ("norank", None, "enforce", "3", ["link", "cudaSetDevice", "2"], [("R2", "cudaSetDevice", "deny")]),
]
FILE_ORDER = ["late0", "rank0", "rank1", "rank2", "rank3", "norank"]

# A file of lines the report must list as problems, each with its reason, and skip.
_REC = '{"ts":1796046868.387809,"call":"cuDeviceGet","abi":"cuDeviceGet","verdict":"deny","rule":"R2"}'
GARBAGE = [
    (b"", None),
    (b"hello", "not JSON: unexpected 'h' at byte 1"),
    (b'{"call":"cuDeviceGet"}', "not an audit record: field 'verdict' is missing"),
    (b"[1,2]", "not an audit record: a JSON value that is not an object"),
    (b'{"call":"x","verdict":"deny","rule":"R2","pid":"7"}', "not an audit record: field 'pid' is not an integer"),
    (_REC[:60].encode(), "partial record: the line ends inside a JSON value (a cut or interleaved write?)"),
    (_REC.encode() + b"}", "not JSON: unexpected '}' after the JSON value at byte 95"),
    (b"\xff\xfe{", "not UTF-8 text (a binary file, or a corrupted write?)"),
]
TORN = (_REC[:30].encode(), "torn: the file ends inside a record (no final newline); was the writer killed mid-write?")


def _utc(ts: float) -> str:
    us = round(ts * 1e6)
    d = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=us)
    return d.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Run the plan; return (dir, files in command-line order, per-run (pid, records))."""
    d = tmp_path_factory.mktemp("audit")
    runs = []
    for name, rank, mode, cvd, args, want in PLAN:
        audit = d / f"{name}.jsonl"
        env = clean_env(LD_PRELOAD=str(GUARD), RANKGUARD_AUDIT=str(audit), RANKGUARD_MODE=mode,
                        CUDA_VISIBLE_DEVICES=cvd, RANK=rank)
        # `exec` keeps the shell's pid, so the test knows each process's pid.
        p = run(["sh", "-c", 'echo "pid=$$"; exec "$@"', "sh", prog("guard_call"), *args], env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        pid = int(p.stdout.split("pid=", 1)[1].split()[0])
        recs = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
        # Each process's map record (docs/report.md) comes first; report --map reads it,
        # the violation report skips it, but it holds a line of the file.
        for n, r in enumerate(recs, 1):
            if r["pid"] == pid and r.get("kind") != "map":
                LINES[(pid, r["call"])] = n
        # (none when the process was refused before it ever initialised CUDA)
        assert len([r for r in recs if r["pid"] == pid and r.get("kind") == "map"]) <= 1, recs
        mine = [r for r in recs if r["pid"] == pid and r.get("kind") != "map"]
        # The plan is what the guard really recorded: exactly these records, in this order.
        assert [(r["rule"], r["call"], r["verdict"]) for r in mine] == want, (args, mine, p.stderr)
        runs.append((pid, mine))
    files = [d / f"{n}.jsonl" for n in FILE_ORDER]
    return d, files, runs


# (pid, call) -> the line of that process's record in its file, as the fixture read it.
LINES: dict[tuple[int, str], int] = {}


def _rank_name(rank, root):
    """The one way the report names a rank (issue 32)."""
    if rank is not None:
        return str(rank)
    return f"root {root['host']}:{root['pid']}" if root else "-"


def _rank_order(k):
    rank, root = k
    return (0, rank, "", 0, 0) if rank is not None else \
        (1, 0, root["host"], root["pid"], root["start"]) if root else (2, 0, "", 0, 0)


def rank_list(keys) -> str:
    """`rank 3` or `ranks 0-3, 5, root h:20`: runs of three or more numbers as ranges."""
    keys = sorted(keys, key=_rank_order)
    nums = [r for r, _ in keys if r is not None]
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts += [f"{nums[i]}-{nums[j]}"] if j >= i + 2 else [str(n) for n in nums[i:j + 1]]
        i = j + 1
    parts += [_rank_name(r, root) for r, root in keys if r is None]
    return f"{'rank' if len(keys) == 1 else 'ranks'} {', '.join(parts)}"


def expected_json(files, runs, extra_files=(), problems=()):
    host = socket.gethostname().split(".")[0]
    # Line numbers, read from the files (other lines, e.g. GPU map records, may sit among
    # the decision records).
    lines = {}
    for f in files:
        if f.exists():
            for i, line in enumerate(f.read_text().splitlines(), 1):
                r = json.loads(line)
                if "call" in r:
                    lines[(r["pid"], r["call"])] = i
    groups: dict = {}
    procs, ranks = set(), set()
    for (name, rank, mode, cvd, args, want), (pid, recs) in zip(PLAN, runs):
        for (rule, call, verdict), rec in zip(want, recs):
            rank_v = None if rank is None else int(rank)
            if rank_v is None:      # no RANK: the process is its own rank root
                assert rec["rank_root"]["pid"] == pid and rec["rank_root"]["host"] == host, rec
            procs.add(pid)
            ranks.add(rank_v)
            g = groups.setdefault((int(rule[1:]), call), {
                "rule": rule, "rule_name": RULE_NAMES[rule], "call": call,
                "count": 0, "denied": 0, "warned": 0, "ranks": {}, "sites": {}})
            # Issue 13: every record names its call site (a function of guard_call).
            site = rec["site"]
            assert site.startswith("guard_call("), rec
            st = g["sites"].get(site)
            if st is None:
                st = g["sites"][site] = {
                    "site": site, "count": 0, "denied": 0, "warned": 0, "ranks": set(),
                    "keys": {}, "processes": set(),
                    "first": {"ts": rec["ts"],
                              "host": host, "pid": pid, "rank": rank_v, "args": rec["args"],
                              "verdict": verdict, "detail": rec["detail"], "cvd": cvd,
                              "gpu": rec["gpu"], "sees": rec.get("sees"), "devices": rec.get("devices"),
                              "rank_gpu": rec["rank_gpu"],
                              "rank_gpu_uuid": rec["rank_gpu_uuid"],
                              "py_stack": [], "file": str(files[FILE_ORDER.index(name)]),
                              "line": lines[(pid, call)], "exporter": None}}
            elif rec["ts"] < st["first"]["ts"]:
                raise AssertionError("the plan runs each site's first record first")
            st["count"] += 1
            st["denied" if verdict == "deny" else "warned"] += 1
            st["ranks"].add(rank_v)
            root = rec["rank_root"] if rank_v is None else None
            st["keys"][(rank_v, None if root is None else json.dumps(root, sort_keys=True))] = root
            st["processes"].add(pid)
            g["count"] += 1
            g["denied" if verdict == "deny" else "warned"] += 1
            r = g["ranks"].get(rank_v)
            if r is None:
                line = lines[(pid, call)]
                r = g["ranks"][rank_v] = {
                    "rank": rank_v,
                    # a process with no RANK is its own rank root (issue 12)
                    "rank_root": rec["rank_root"] if rank_v is None else None,
                    "count": 0, "denied": 0, "warned": 0, "processes": set(),
                    "first": {
                        "ts": rec["ts"], "host": host,
                        "pid": pid, "verdict": verdict, "mode": mode, "abi": rec["abi"],
                        "args": rec["args"], "ordinal": rec.get("ordinal"), "detail": rec["detail"],
                        "cvd": cvd, "gpu": rec["gpu"], "sees": rec.get("sees"), "devices": rec.get("devices"),
                        "rank_gpu": rec["rank_gpu"], "rank_gpu_uuid": rec["rank_gpu_uuid"], "job": None,
                        "file": str(files[FILE_ORDER.index(name)]), "line": line, "exporter": None}}
            r["count"] += 1
            r["denied" if verdict == "deny" else "warned"] += 1
            r["processes"].add(pid)
    out_groups = []
    for key in sorted(groups):
        g = groups[key]
        rk = sorted(g["ranks"], key=lambda r: (r is None, r or 0))
        g["ranks"] = [dict(g["ranks"][r], processes=len(g["ranks"][r]["processes"])) for r in rk]
        sites = sorted(g["sites"].values(), key=lambda x: (-x["count"], x["site"]))
        out_sites = []
        for x in sites:
            keys = sorted(((r, root) for (r, _), root in x.pop("keys").items()), key=_rank_order)
            first = x.pop("first")
            out_sites.append(dict(
                x, ranks=sorted(x["ranks"], key=lambda r: (r is None, r or 0)),
                rank_roots=[root for r, root in keys if r is None and root],
                rank_names=[_rank_name(r, root) for r, root in keys],
                processes=len(x["processes"]), first=first))
        g["sites"] = out_sites
        out_groups.append(g)
    total = sum(g["count"] for g in out_groups)
    denied = sum(g["denied"] for g in out_groups)
    problems = list(problems)
    return {
        "format": "rankguard-report",
        "version": 2,
        "files": [str(f) for f in list(files) + list(extra_files)],
        "totals": {"violations": total, "summary_records": 0, "denied": denied, "warned": total - denied,
                   "calls": len(out_groups), "ranks": len(ranks), "processes": len(procs),
                   "problems": len(problems), "problems_unlisted": 0},
        "groups": out_groups,
        "problems": problems,
        "status": 1 if total else (2 if problems else 0),
    }


def render_text(doc, unreadable=0) -> str:
    """The human format (docs/report.md), written independently of the Rust code."""
    def counts(c, d, w):
        return f"{c} denied" if w == 0 else f"{c} warned" if d == 0 else f"{c} ({d} denied, {w} warned)"

    def n(k, one, many):
        return f"{k} {one if k == 1 else many}"

    out, rule = [], None
    for g in doc["groups"]:
        if g["rule"] != rule:
            rule = g["rule"]
            out.append(f"{g['rule']} {g['rule_name']}")
        keys = [(r["rank"], r.get("rank_root")) for r in g["ranks"]]
        out.append(f"  {g['call']}: {counts(g['count'], g['denied'], g['warned'])} in {rank_list(keys)}")
        # One entry per site, folded across ranks (issue 32): no block per rank.
        for st in g["sites"]:
            sk = [(r, None) for r in st["ranks"] if r is not None] + [(None, x) for x in st["rank_roots"]]
            if "-" in st["rank_names"]:
                sk.append((None, None))
            f = st["first"]
            out.append(f"    at {st['site']}: {counts(st['count'], st['denied'], st['warned'])} in "
                       f"{rank_list(sk)}, from {n(st['processes'], 'process', 'processes')}")
            verdict = "denied" if f["verdict"] == "deny" else "allowed (warn mode)"
            out.append(f"      first {_utc(f['ts'])} {f['host']}:{f['pid']} {g['call']}({f['args']}) "
                       f"{verdict}: {f['detail']}")
            at = f"({f['file']}:{f['line']})"
            if g["rule"] == "R1":
                # R1 shows both GPUs: the one the process saw, and the rank's.
                d = f["devices"]
                seen = f["sees"] or f["gpu"] or (
                    f"{d} {'device' if d == 1 else 'devices'}" if d is not None and d != 1 else "no identifiable GPU")
                mine = f["rank_gpu"] or f["rank_gpu_uuid"]
                if f["rank_gpu"] and f["rank_gpu_uuid"] and f["rank_gpu"] != f["rank_gpu_uuid"]:
                    mine = f"{f['rank_gpu_uuid']} (entry {f['rank_gpu']})"
                mine = mine or "none named (no RANKGUARD_RANK_GPU, no rank root with one GPU)"
                out.append(f"      saw {seen} (CUDA_VISIBLE_DEVICES={f['cvd']}); the rank's GPU: {mine} {at}")
            else:
                out.append(f"      CUDA_VISIBLE_DEVICES={f['cvd']}, GPU {f['gpu'] or 'unknown'} {at}")
            x = f["exporter"]
            if x is not None and x["pid"] is not None:
                rank_x = _rank_name(x["rank"], x.get("rank_root"))
                loc = f" ({x['location']} memory)" if x["location"] else ""
                out.append(f"      exported by pid {x['pid']} (rank {rank_x}) on {x['gpu'] or 'an unknown GPU'}{loc}")
            elif x is not None:
                out.append("      exporter unknown (no trusted provenance record for the handle)")
    if doc["problems"]:
        if doc["groups"]:
            out.append("")
        out.append("problems (skipped, not counted above):")
        for p in doc["problems"]:
            where = p["file"] if p["line"] is None else f"{p['file']}:{p['line']}"
            out.append(f"  {where}: {p['why']}")
    if out:
        out.append("")
    t = doc["totals"]
    nfiles = len(doc["files"])
    if t["violations"] == 0:
        last = f"total: no violations in {n(nfiles, 'file', 'files')}"
    else:
        rules = len({g["rule"] for g in doc["groups"]})
        last = (f"total: {n(t['violations'], 'violation', 'violations')} ({t['denied']} denied, "
                f"{t['warned']} warned) of {n(t['calls'], 'call', 'calls')} under "
                f"{n(rules, 'rule', 'rules')}, in {n(t['ranks'], 'rank', 'ranks')}, "
                f"{n(t['processes'], 'process', 'processes')}, from {n(nfiles, 'file', 'files')}")
    if t["problems"]:
        last += f"; {n(t['problems'], 'problem', 'problems')} skipped"
        if unreadable:
            last += f" ({n(unreadable, 'file', 'files')} unreadable)"
    out.append(last)
    return "\n".join(out) + "\n"


def report(*args):
    return run([CLI, "report", *args], env=clean_env())


def test_report_json_matches_the_planted_violations_exactly(planted):
    d, files, runs = planted
    r = report("--json", *files)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr == ""
    got = json.loads(r.stdout)
    want = expected_json(files, runs)
    assert got == want
    # The shape the plan implies, spelled out: R1 once in ranks 2 and 3; cuDeviceGet in
    # ranks 0 (two processes, first from rank0.jsonl), 1 and 2; R4 in ranks 1 and 3.
    shape = [(g["rule"], g["call"], [(x["rank"], x["count"]) for x in g["ranks"]]) for g in got["groups"]]
    assert shape == [
        ("R1", "cuInit", [(2, 1), (3, 1)]),
        ("R2", "cuCtxCreate", [(3, 1)]),
        ("R2", "cuDeviceGet", [(0, 2), (1, 1), (2, 1)]),
        ("R2", "cudaSetDevice", [(0, 1), (None, 1)]),
        ("R4", "cudaDeviceEnablePeerAccess", [(1, 1)]),
        ("R4", "cudaMemcpyPeer", [(3, 1)]),
    ]
    first0 = got["groups"][2]["ranks"][0]["first"]
    assert first0["pid"] == runs[0][0] and first0["file"].endswith("rank0.jsonl")
    assert got["totals"] == {"violations": 11, "summary_records": 0, "denied": 9, "warned": 2, "calls": 6,
                             "ranks": 5, "processes": 11, "problems": 0, "problems_unlisted": 0}


def test_report_text_matches_the_planted_violations_exactly(planted):
    d, files, runs = planted
    r = report(*files)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout == render_text(expected_json(files, runs))
    assert r.stdout.endswith(
        "total: 11 violations (9 denied, 2 warned) of 6 calls under 3 rules, in 5 ranks, "
        "11 processes, from 6 files\n")


def test_torn_garbage_and_unreadable_inputs_are_reported_not_fatal(planted, tmp_path):
    d, files, runs = planted
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\n".join(line for line, _ in GARBAGE) + b"\n" + TORN[0])
    missing = tmp_path / "missing.jsonl"
    problems = [{"file": str(garbage), "line": i + 1, "why": why}
                for i, (_, why) in enumerate(GARBAGE) if why is not None]
    problems.append({"file": str(garbage), "line": len(GARBAGE) + 1, "why": TORN[1]})
    problems.append({"file": str(missing), "line": None,
                     "why": "cannot read: No such file or directory (os error 2)"})

    r = report("--json", *files, garbage, missing)
    assert r.returncode == 1, r.stdout + r.stderr
    want = expected_json(files, runs, extra_files=[garbage], problems=problems)
    assert json.loads(r.stdout) == want

    r = report(*files, garbage, missing)
    assert r.returncode == 1
    assert r.stdout == render_text(want, unreadable=1)
    assert f"  {garbage}:9: torn: the file ends inside a record" in r.stdout

    # Nothing found but something unreadable: inconclusive, fail closed (2).
    r = report(garbage)
    assert r.returncode == 2, r.stdout
    assert r.stdout.endswith("total: no violations in 1 file; 8 problems skipped\n")


def test_a_directory_means_its_files(planted):
    d, files, runs = planted
    by_dir = json.loads(report("--json", d).stdout)
    by_name = json.loads(report("--json", *sorted(files)).stdout)
    assert by_dir == by_name
    assert by_dir["totals"]["violations"] == 11


def test_clean_audit_exits_0_and_usage_errors_exit_2(tmp_path):
    empty = tmp_path / "clean.jsonl"
    empty.write_text("")
    r = report(empty)
    assert (r.returncode, r.stdout) == (0, "total: no violations in 1 file\n")
    assert json.loads(report("--json", empty).stdout)["status"] == 0

    # `-` reads standard input.
    r = run([CLI, "report", "--json", "-"], env=clean_env(),
            input='{"call":"cuDeviceGet","verdict":"deny","rule":"R2","rank":1,"pid":5}\n')
    doc = json.loads(r.stdout)
    assert (r.returncode, doc["files"], doc["totals"]["violations"]) == (1, ["<stdin>"], 1)
    assert doc["groups"][0]["ranks"][0]["first"]["file"] == "<stdin>"

    r = report()
    assert r.returncode == 2
    assert "name at least one audit file" in r.stderr
    r = report("--bogus", empty)
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr
    r = report("--help")
    assert r.returncode == 0 and "Exit 0: no violations" in r.stdout


def test_a_directory_is_walked_and_what_is_not_read_is_said(planted, tmp_path):
    """Issue 14, item 6: a subdirectory's violations are found (recursed), and a FIFO or a
    symbolic link to a directory inside is listed as not read: never "no violations"."""
    import os
    import shutil
    d, files, runs = planted
    top = tmp_path / "audits"
    (top / "node7" / "step1").mkdir(parents=True)
    for f in files:
        shutil.copy(f, top / "node7" / "step1" / pathlib.Path(f).name)
    os.mkfifo(top / "pipe.jsonl")
    (top / "loop").symlink_to(top, target_is_directory=True)
    r = run([CLI, "report", "--json", top], env=clean_env(), timeout=30)
    doc = json.loads(r.stdout)
    assert r.returncode == 1, r.stdout + r.stderr
    assert doc["totals"]["violations"] == 11
    whys = {pathlib.Path(p["file"]).name: p["why"] for p in doc["problems"]}
    assert "FIFO" in whys["pipe.jsonl"] and "not read" in whys["pipe.jsonl"], whys
    assert "not followed" in whys["loop"], whys
    # Only unread entries and no violation: inconclusive, exit 2.
    only = tmp_path / "only"
    only.mkdir()
    os.mkfifo(only / "p")
    (only / "clean.jsonl").write_text("")
    r = run([CLI, "report", only], env=clean_env(), timeout=30)
    assert r.returncode == 2 and "not read" in r.stdout, r.stdout


def test_lines_longer_than_a_record_are_skipped_in_bounded_memory(planted, tmp_path):
    """Issue 14, item 7: a 200 MB line is skipped and counted, the records after it are
    read; /dev/zero (no newline, ever) does not grow memory."""
    import subprocess
    import time
    d, files, runs = planted
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.write(b"x" * (200 << 20) + b"\n")
        f.write(pathlib.Path(files[0]).read_bytes())
    r = run(["/usr/bin/env", "bash", "-c", f"ulimit -v 262144; exec {CLI} report --json {big}"],
            env=clean_env(), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["totals"]["violations"] >= 1
    assert any("longer than 64 KiB skipped" in p["why"] and p["line"] == 1 for p in doc["problems"]), doc["problems"]
    p = subprocess.Popen([str(CLI), "report", "/dev/zero"], stdout=subprocess.DEVNULL, env=clean_env())
    try:
        time.sleep(1.5)
        rss1 = int(next(x for x in open(f"/proc/{p.pid}/status") if x.startswith("VmRSS")).split()[1])
        time.sleep(1.5)
        rss2 = int(next(x for x in open(f"/proc/{p.pid}/status") if x.startswith("VmRSS")).split()[1])
    finally:
        p.kill()
        p.wait()
    assert rss2 < 64 * 1024 and rss2 - rss1 < 1024, (rss1, rss2)


# Runs a command and prints its peak RSS (KiB). A separate small interpreter, because a
# child's ru_maxrss starts at its parent's RSS at fork/exec (Linux keeps the exec'ing mm's
# high-water mark): measured from the test process it would be the test's own size.
_PEAK_RSS = """
import os, signal, subprocess, sys
p = subprocess.Popen(sys.argv[2:], stdout=open(sys.argv[1], "wb"))
# A hang fails the test, never blocks it. os.kill, not p.kill(): Popen.kill() polls first,
# and a poll from the handler could reap the child that wait4 below is waiting for.
signal.signal(signal.SIGALRM, lambda *_: os.kill(p.pid, signal.SIGKILL))
signal.alarm(120)
_, status, ru = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), ru.ru_maxrss)
"""


def _report_peak_rss(args, out_path):
    """Run `rankguard report ARGS` with stdout to OUT_PATH; return (exit status, its peak
    RSS in KiB: that process's own, plus at most the ~10 MB of the small interpreter that
    starts it)."""
    import sys
    r = run([sys.executable, "-I", "-S", "-c", _PEAK_RSS, out_path, CLI, "report", *args],
            env=clean_env(), timeout=150)
    assert len(r.stdout.split()) == 2, (
        f"the peak-RSS helper exited {r.returncode} without its two figures\n"
        f"stdout: {r.stdout!r}\nstderr: {r.stderr[-2000:]}")
    status, rss = r.stdout.split()
    return int(status), int(rss)


def test_garbage_is_counted_with_a_bounded_sample_in_bounded_memory(planted, tmp_path):
    """Issue 29, item 12: ~60 MB of binary garbage (a core dump in a job directory) among
    real audit files. Every unusable line is counted, only a bounded sample is listed, the
    report stays small and its peak memory does not grow with the garbage; the real records
    (in their own files and between the garbage lines) are all found."""
    import random
    d, files, runs = planted
    top = tmp_path / "job"
    top.mkdir()
    for f in files:
        (top / pathlib.Path(f).name).write_bytes(pathlib.Path(f).read_bytes())
    real = pathlib.Path(files[1]).read_bytes()          # rank0's records, whole lines
    # violations among them (the map records, one per process, are not violations)
    n_real = sum(1 for ln in real.splitlines() if b'"kind":"map"' not in ln)
    assert n_real >= 1
    rng = random.Random(29)
    bad = 0
    with open(top / "core.12345", "wb") as g:
        size = 0
        while size < 60 << 20:
            # A line that is never UTF-8 (starts with 0xff), so each one is exactly one
            # problem; short lines, as in a core dump full of small values.
            n = rng.randrange(0, 64)
            line = b"\xff" + rng.randbytes(n).replace(b"\n", b"\xfe") + b"\n"
            g.write(line)
            size += len(line)
            bad += 1
            if bad % 500_000 == 0:
                g.write(real)                      # real records between the garbage
        g.write(b"\xff" * 100_000 + b"\n")         # and one line too long to be a record
        bad += 1
    inserted = (bad - 1) // 500_000
    assert inserted >= 1
    want_violations = 11 + inserted * n_real

    out = tmp_path / "report.json"
    rc, rss_json = _report_peak_rss(["--json", top], out)
    assert rc == 1, out.read_text()[-2000:]
    assert out.stat().st_size < 64 << 10, out.stat().st_size
    doc = json.loads(out.read_text())
    assert doc["totals"]["violations"] == want_violations, doc["totals"]
    assert doc["totals"]["problems"] == bad, doc["totals"]
    assert len(doc["problems"]) <= 100
    core = str(top / "core.12345")
    assert [p for p in doc["problems"] if p["file"] == core][0] == {
        "file": core, "line": 1, "why": "not UTF-8 text (a binary file, or a corrupted write?)"}
    assert any(p["file"] == core and f"{bad - 10} more unusable lines" in p["why"]
               for p in doc["problems"]), doc["problems"]

    out = tmp_path / "report.txt"
    rc, rss_text = _report_peak_rss([top], out)
    assert rc == 1
    assert out.stat().st_size < 64 << 10, out.stat().st_size
    text = out.read_text()
    assert f"total: {want_violations} violations" in text, text[-2000:]
    assert f"; {bad} problems skipped\n" in text, text[-2000:]
    assert f"  {core}:1: not UTF-8 text" in text
    # Peak memory independent of the input's size: the binary itself and its buffers.
    assert rss_json < 40 << 10 and rss_text < 40 << 10, (rss_json, rss_text)

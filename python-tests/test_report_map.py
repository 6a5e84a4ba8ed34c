"""`rankguard report` as a newcomer reads it (issue 32): one bug in many ranks folded into
one entry with its rank list, R1 entries showing both GPUs, one way of naming a rank without
a number, and `report --map` (rank -> processes -> GPU, who broke what) from the guard's GPU
map records, read tolerantly (synthetic records here: the guard's own are tested with the
demo, test_demo.py)."""
from __future__ import annotations

import json
import socket

from conftest import CLI, GUARD, clean_env, run
from _guard import prog

HOST = socket.gethostname().split(".")[0]


def uuid(i: int) -> str:
    return f"GPU-{0x10 + i:02x}c0ffee-0000-4000-8000-{i:012x}"


def guarded(audit, *args, **env):
    """guard_call under the guard, appending to `audit`; returns its pid."""
    e = clean_env(FAKECUDA_GPUS="8", LD_PRELOAD=str(GUARD), RANKGUARD_AUDIT=str(audit), **env)
    p = run(["sh", "-c", 'echo "pid=$$"; exec "$@"', "sh", prog("guard_call"), *args], env=e)
    assert p.returncode == 0, p.stdout + p.stderr
    return int(p.stdout.split("pid=", 1)[1].split()[0])


def report(*args):
    return run([CLI, "report", *args], env=clean_env())


def test_one_bug_in_eight_ranks_is_one_entry(tmp_path):
    """The same call site broken in ranks 0..7 is one entry naming `ranks 0-7`, with one
    first occurrence: 5 lines, not a block per rank (25 lines before)."""
    audit = tmp_path / "audit.jsonl"
    for r in range(8):
        guarded(audit, "link", "cuDeviceGet", "1", RANK=str(r), CUDA_VISIBLE_DEVICES=str(r))
    p = report(audit)
    assert p.returncode == 1, p.stdout + p.stderr
    body = p.stdout.split("\n\ntotal:", 1)[0].splitlines()
    assert body[:3] == ["R2 cuda:0 only", "  cuDeviceGet: 8 denied in ranks 0-7",
                        body[2]], p.stdout
    assert body[2].startswith("    at guard_call(") and body[2].endswith(
        ": 8 denied in ranks 0-7, from 8 processes"), p.stdout
    assert len(body) == 5, p.stdout
    assert body[3].startswith("      first ") and " cuDeviceGet(ordinal=1) denied: " in body[3], p.stdout
    assert body[4].startswith("      CUDA_VISIBLE_DEVICES="), p.stdout
    # The JSON keeps every rank's own counts.
    doc = json.loads(report("--json", audit).stdout)
    (g,) = doc["groups"]
    assert [(r["rank"], r["count"]) for r in g["ranks"]] == [(r, 1) for r in range(8)]
    assert g["sites"][0]["rank_names"] == [str(r) for r in range(8)]


def test_an_r1_entry_shows_the_gpu_seen_and_the_ranks(tmp_path):
    """A process of rank 2 (RANKGUARD_RANK_GPU=2) re-pointed to GPU 5: its R1 entry names
    GPU 5's UUID, which it saw, and the rank's GPU 2 (entry and UUID)."""
    audit = tmp_path / "audit.jsonl"
    guarded(audit, "link", "cuDeviceGet", "0", RANK="2", CUDA_VISIBLE_DEVICES="5",
            RANKGUARD_MODE="warn", RANKGUARD_RANK_GPU="2", RANKGUARD_RANK_GPU_UUID=uuid(2))
    p = report(audit)
    assert p.returncode == 1, p.stdout + p.stderr
    assert (f"\n      saw {uuid(5)} (CUDA_VISIBLE_DEVICES=5); the rank's GPU: {uuid(2)} (entry 2) "
            in p.stdout), p.stdout
    (g,) = json.loads(report("--json", audit).stdout)["groups"]
    first = g["sites"][0]["first"]
    assert (first["sees"], first["rank_gpu"], first["rank_gpu_uuid"]) == (uuid(5), "2", uuid(2)), first


def test_ranks_without_a_number_are_named_by_their_root_everywhere(tmp_path):
    """Two processes with no RANK, each its own rank root (Ray's case): the call's line and
    the site's both name `root host:pid`, never `rank -`."""
    audit = tmp_path / "audit.jsonl"
    pids = [guarded(audit, "link", "cuDeviceGet", "1", CUDA_VISIBLE_DEVICES=c) for c in ("1", "2")]
    p = report(audit)
    roots = ", ".join(f"root {HOST}:{pid}" for pid in sorted(pids))
    assert f"  cuDeviceGet: 2 denied in ranks {roots}\n" in p.stdout, p.stdout
    assert f": 2 denied in ranks {roots}, from 2 processes\n" in p.stdout, p.stdout
    assert "rank -" not in p.stdout and "ranks -" not in p.stdout, p.stdout
    (g,) = json.loads(report("--json", audit).stdout)["groups"]
    assert sorted(x["pid"] for x in g["sites"][0]["rank_roots"]) == sorted(pids)


# Map records as a guard may write them: the fields the GPU map record carries (kind,
# rank, pid, root, the GPU's UUID and index, mode, ts), spelled the ways report accepts.
MAPS = [
    {"format": "rankguard-audit", "version": 1, "kind": "map", "ts": 1.5, "host": "n1", "pid": 100,
     "rank": 0, "root_pid": 100, "gpu": uuid(0), "index": 0, "mode": "warn", "cvd": "0"},
    {"kind": "map", "ts": 1.6, "host": "n1", "pid": 101, "rank": 0, "root": 100, "uuid": uuid(1),
     "gpu_index": 1, "mode": "warn", "cvd": "1", "some_future_field": [1, 2]},
    {"kind": "map", "ts": 1.7, "host": "n1", "pid": 200, "rank": 1,
     "rank_root": {"pid": 200, "start": 7, "host": "n1"}, "gpu": uuid(1), "index": 1, "mode": "warn"},
    # no rank number: named by its root
    {"kind": "map", "ts": 1.8, "host": "n1", "pid": 301, "rank": None, "root_pid": 300, "gpu": uuid(3),
     "index": 0, "mode": "warn"},
]
VIOLATIONS = [
    {"ts": 2.0, "call": "cuInit", "verdict": "warn", "rule": "R1", "mode": "warn", "pid": 101, "host": "n1",
     "rank": 0, "cvd": "1", "gpu": uuid(1), "rank_gpu": "0", "devices": 1, "entries": 1, "sees": uuid(1)},
    {"ts": 2.1, "call": "cuIpcOpenMemHandle", "verdict": "warn", "rule": "R3", "mode": "warn", "pid": 101,
     "host": "n1", "rank": 0, "exporter_pid": 100, "exporter_gpu": uuid(0)},
    # a process with a violation and no map record (an older guard)
    {"ts": 2.2, "call": "cuDeviceGet", "verdict": "deny", "rule": "R2", "mode": "enforce", "pid": 400,
     "host": "n1", "rank": 2, "cvd": "2", "gpu": uuid(2), "ordinal": 1},
]


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_map_records_are_neither_violations_nor_problems(tmp_path):
    f = tmp_path / "a.jsonl"
    _write(f, MAPS)
    p = report(f)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "total: no violations in 1 file\n", p.stdout
    doc = json.loads(report("--json", f).stdout)
    assert doc["problems"] == [] and doc["totals"]["violations"] == 0 and "map" not in doc
    # A map record with a wrong type is a problem, named like any other.
    _write(f, [{"kind": "map", "pid": "x"}])
    p = report(f)
    assert p.returncode == 2 and "not a GPU map record: field 'pid' is not an integer" in p.stdout, p.stdout


def test_report_map_is_rank_processes_gpu_and_who_broke_what(tmp_path):
    f = tmp_path / "a.jsonl"
    _write(f, MAPS + VIOLATIONS)
    p = report("--map", f)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "GPU map: 4 ranks, 5 processes (4 map records read)", p.stdout
    assert lines[1].split() == ["RANK", "HOST", "PID", "ROOT", "GPU", "INDEX", "CVD", "MODE", "BROKE"]
    rows = [ln.split() for ln in lines[2:7]]
    # rank 0: two processes (the rank is named on its first row only); the one that saw GPU
    # 1 broke R1 and R3
    assert rows[0] == ["0", "n1", "100", "100", uuid(0), "0", "0", "warn", "-"], p.stdout
    assert rows[1] == ["n1", "101", "100", uuid(1), "1", "1", "warn", "R1", "x1,", "R3", "x1"], p.stdout
    assert rows[2] == ["1", "n1", "200", "200", uuid(1), "1", "-", "warn", "-"], p.stdout
    # rank 2: known from its violation only (no map record: marked, and said below)
    assert rows[3] == ["2", "n1", "400", "-", uuid(2), "*", "-", "2", "enforce", "R2", "x1"], p.stdout
    assert rows[4] == ["root", "n1:300", "n1", "301", "300", uuid(3), "0", "-", "warn", "-"], p.stdout
    assert lines[7].startswith("* no map record for this process"), p.stdout
    assert p.stdout.endswith("\ntotal: 3 violations (1 denied, 2 warned) of 3 calls under 3 rules, in 2 ranks, "
                             "2 processes, from 1 file\n"), p.stdout
    doc = json.loads(report("--map", "--json", f).stdout)
    assert list(doc)[-2:] == ["map", "status"]
    m = {(x["host"], x["pid"]): x for x in doc["map"]}
    assert m[("n1", 101)]["broke"] == [{"rule": "R1", "count": 1}, {"rule": "R3", "count": 1}]
    assert m[("n1", 101)]["gpu"] == uuid(1) and m[("n1", 101)]["rank"] == 0 and m[("n1", 101)]["mapped"]
    assert m[("n1", 301)]["rank"] is None and m[("n1", 301)]["rank_name"] == "root n1:300"
    assert m[("n1", 400)]["mapped"] is False and m[("n1", 400)]["broke"] == [{"rule": "R2", "count": 1}]


def test_report_map_with_no_record_says_so(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    p = report("--map", f)
    assert p.returncode == 0 and p.stdout.startswith("GPU map: no map record and no violation in 1 file"), p.stdout

"""scripts/demo, the README's main job (issue 6): each of its three acts ends as described,
and the violations the legacy config plants are exactly what the audit files and
`rankguard report --json` say (which calls, rules, ranks, counts).

The demo runs once per module (about 10 s on 2 cores) with --no-build: the test command has
already set up and built everything.
"""
from __future__ import annotations

import collections
import json
import pathlib
import re
import shutil
import sys

import pytest

from conftest import CLI, PYTHON, ROOT, clean_env, run

DEMO = ROOT / "scripts" / "demo"
EXAMPLES = ROOT / "examples"
WORLD = 4
GPU = "GPU-1{0}c0ffee-0000-4000-8000-00000000000{0}"   # the fake node's UUIDs (cvd-vectors.tsv)

# The planted set, written out by hand rather than computed by examples/rl_job.py, so the
# test does not trust the example's own bookkeeping. Per rank r of 4 (GPU r):
#   the learner's cuDeviceGet(r) names a global index: R2, except rank 0 (index 0 is cuda:0);
#   collector 1 is pinned to GPU (r+1)%4 by rewriting CUDA_VISIBLE_DEVICES: R1 at cuInit;
#   from there it opens the learner's rollout buffer, exported on GPU r: R3.
# Collector 0, the inference ring and the inter-rank weights check follow the contract.
PLANTED = collections.Counter({
    (0, "R1", "cuInit"): 1, (0, "R3", "cuIpcOpenMemHandle"): 1,
    (1, "R2", "cuDeviceGet"): 1, (1, "R1", "cuInit"): 1, (1, "R3", "cuIpcOpenMemHandle"): 1,
    (2, "R2", "cuDeviceGet"): 1, (2, "R1", "cuInit"): 1, (2, "R3", "cuIpcOpenMemHandle"): 1,
    (3, "R2", "cuDeviceGet"): 1, (3, "R1", "cuInit"): 1, (3, "R3", "cuIpcOpenMemHandle"): 1,
})


class Demo:
    def __init__(self, proc, work: pathlib.Path):
        self.proc, self.work = proc, work

    @property
    def out(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def act_output(self, n: int) -> str:
        return (self.work / f"act{n}" / "output.txt").read_text()

    def records(self, n: int) -> list[dict]:
        out = []
        for f in sorted((self.work / f"act{n}" / "audit").glob("*.jsonl")):
            out += [r for line in f.read_text().splitlines() if line.strip()
                    for r in [json.loads(line)] if r.get("kind") != "map"]
        return out

    def launcher_status(self, n: int) -> int:
        """The status the demo printed after act n's `rankguard launch`."""
        marker = "(rankguard launch exited with status "
        text = self.out.split(f"Act {n}/3", 1)[1]
        return int(text.split(marker, 1)[1].split(")", 1)[0])


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Demo:
    work = tmp_path_factory.mktemp("demo")
    p = run([DEMO, "--no-build", "--workdir", work], env=clean_env(), timeout=300)
    return Demo(p, work)


def tally(records) -> collections.Counter:
    return collections.Counter((r["rank"], r["rule"], r["call"]) for r in records)


def test_demo_exits_0_with_every_act_as_described(demo):
    assert demo.proc.returncode == 0, demo.out
    # scripts/setup installs PyTorch, so the demo's fourth act (the job written with torch)
    # always runs here.
    for n in (1, 2, 3, 4):
        assert f"act {n} ended as described" in demo.out, demo.out
    assert "all four acts ended as described" in demo.out


def test_act4_torch_legacy_warn_records_the_planted_set(demo):
    assert "(rankguard launch exited with status 0)" in demo.out.split("Act 4:", 1)[1], demo.out
    got = tally(demo.records(4))
    want = collections.Counter()
    for r in range(WORLD):
        if r:
            want[(r, "R2", "cudaSetDevice")] += 1
        for rule, call in (("R1", "cuInit"), ("R3", "cudaIpcOpenEventHandle"),
                           ("R3", "cudaIpcOpenMemHandle")):
            want[(r, rule, call)] += 1
    assert got == want, got
    assert demo.act_output(4).count("done, every check passed") == WORLD


def test_act1_legacy_warn_runs_to_the_end(demo):
    assert demo.launcher_status(1) == 0, demo.out
    out = demo.act_output(1)
    assert out.count("done, every check passed") == WORLD, out
    # The guard's lines, as they are: warn mode lets each call through.
    for r in range(WORLD):
        assert f"[rank {r}] RANKGUARD WARN cuInit(flags=0) allowed (warn mode) [R1" in out, out
        assert f"[rank {r}] RANKGUARD WARN cuIpcOpenMemHandle(" in out, out
    for r in range(1, WORLD):
        assert f"[rank {r}] RANKGUARD WARN cuDeviceGet(ordinal={r}) allowed (warn mode) [R2" in out, out


def test_act1_audit_is_exactly_the_planted_set(demo):
    recs = demo.records(1)
    assert tally(recs) == PLANTED, recs
    assert {r["verdict"] for r in recs} == {"warn"} and {r["mode"] for r in recs} == {"warn"}
    assert len({r["job"] for r in recs}) == 1, "one job id for every rank"
    for r in recs:
        rank = r["rank"]
        if r["rule"] == "R2":
            assert r["ordinal"] == rank and r["cvd"] == str(rank), r
        else:
            # R1 and R3 come from collector 1, which sees the next GPU.
            nxt = (rank + 1) % WORLD
            assert r["cvd"] == str(nxt) and r["gpu"] == GPU.format(nxt), r
            assert r["rank_gpu"] == str(rank), r
    # Each R1/R3 pair comes from one process (collector 1 of that rank).
    pids = collections.defaultdict(set)
    for r in recs:
        if r["rule"] in ("R1", "R3"):
            pids[r["rank"]].add(r["pid"])
    assert all(len(p) == 1 for p in pids.values()) and len(pids) == WORLD, pids


def test_report_json_matches_the_planted_set(demo):
    p = run([CLI, "report", "--json", demo.work / "act1" / "audit"], timeout=60)
    assert p.returncode == 1, f"report should exit 1 (violations found)\n{p.stdout}{p.stderr}"
    doc = json.loads(p.stdout)
    got = collections.Counter()
    for g in doc["groups"]:
        assert g["count"] == sum(r["count"] for r in g["ranks"]), g
        assert g["warned"] == g["count"] and g["denied"] == 0, g
        for r in g["ranks"]:
            got[(r["rank"], g["rule"], g["call"])] += r["count"]
            assert r["first"]["verdict"] == "warn" and r["first"]["pid"] is not None, r
    assert got == PLANTED, json.dumps(doc["groups"], indent=1)
    t = doc["totals"]
    assert (t["violations"], t["warned"], t["denied"], t["ranks"], t["problems"]) == \
        (sum(PLANTED.values()), sum(PLANTED.values()), 0, WORLD, 0), t
    assert doc["problems"] == []


def test_report_text_is_what_the_demo_showed(demo):
    """The demo ends act 1 with the human report: every rule and call, with counts."""
    text = demo.out.split("Act 1: the audit summary", 1)[1].split("Act 1: the GPU map", 1)[0]
    assert "cuInit: 4 warned in ranks 0-3" in text, text
    assert "cuDeviceGet: 3 warned in ranks 1-3" in text, text
    assert "cuIpcOpenMemHandle: 4 warned in ranks 0-3" in text, text
    # One planted bug in 4 ranks is one entry (its site, with the rank list), not a block
    # per rank (issue 32): 3 rules, 3 calls, one site each, 2 lines of first occurrence
    # each and R3's exporter line, then the total.
    body = text.split("$ rankguard report ", 1)[1].split("\n\ntotal: ", 1)[0].splitlines()[1:]
    assert len(body) == 3 + 3 + 3 + 3 * 2 + 1, text
    # R1's first occurrence shows both GPUs: the one collector 1 saw, and the rank's.
    assert re.search(r"\n      saw GPU-1\dc0ffee-\S+ \(CUDA_VISIBLE_DEVICES=\d\); the rank's GPU: GPU-1\dc0ffee-\S+ \(entry \d\)", text), text
    assert "total: 11 violations (0 denied, 11 warned)" in text, text


def test_act1_gpu_map_shows_every_process_of_every_rank_with_its_gpu(demo):
    """Issue 32: `rankguard report --map` on act 1's audit lists every process of every rank
    (the learner, its collectors and its inference ring, each from its map record) with the
    GPU it saw, and marks who broke what: collector 1 of rank r saw GPU (r+1)%4 (R1, R3).

    Needs the guard's GPU map records (one per process at its first cuInit; branch
    newcomer-guard): without them the map holds only the processes that broke a rule,
    each marked `*` (no map record), and this test fails saying so."""
    text = demo.out.split("Act 1: the GPU map", 1)[1].split("Act 2/3", 1)[0]
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("RANK "))
    cols = lines[head].split()
    assert cols == ["RANK", "HOST", "PID", "ROOT", "GPU", "INDEX", "CVD", "MODE", "BROKE"], lines[head]
    rows, rank = [], None
    for ln in lines[head + 1:]:
        if not ln.strip() or ln.startswith(("* ", "total:", "problems")):
            break
        first = ln[:len("RANK  ")].strip()
        if first:
            rank = first
        rest = ln[len("RANK  "):].split()
        rows.append((rank, rest))
    unmapped = [r for r in rows if r[1][3].endswith("*") or "*" in r[1]]
    assert not unmapped and "no map record" not in text, (
        "no GPU map records in the demo's audit: the guard does not write them yet (the GPU map "
        "record of branch newcomer-guard)\n" + text)
    per_rank = collections.defaultdict(list)
    for rank, rest in rows:
        host, pid, root, gpu = rest[:4]
        per_rank[rank].append((int(pid), gpu, " ".join(rest[7:])))
    # Each learner says how many collectors and inference processes it started.
    out = demo.act_output(1)
    m = re.search(r"; (\d+) collectors, an inference ring of (\d+),", out)
    assert m, out
    procs = 1 + int(m.group(1)) + int(m.group(2))
    assert sorted(per_rank) == [str(r) for r in range(WORLD)], per_rank
    for r in range(WORLD):
        got = per_rank[str(r)]
        assert len(got) == procs and len({p for p, _, _ in got}) == procs, (r, got)
        mine = GPU.format(r)
        others = [(p, g, b) for p, g, b in got if g != mine]
        # collector 1 alone sees another GPU, the next rank's, and broke R1 and R3 there
        assert [(g, "R1" in b and "R3" in b) for _, g, b in others] == [(GPU.format((r + 1) % WORLD), True)], got
        for p, g, b in got:
            if g == mine:
                assert "R1" not in b and "R3" not in b, (r, got)


def _line_of(pattern: str) -> int:
    """The line of examples/rl_job.py, in function fn, that makes a planted call."""
    text = (EXAMPLES / "rl_job.py").read_text().splitlines()
    fn, pat = pattern
    start = next(i for i, line in enumerate(text) if line.startswith(f"def {fn}("))
    return start + 1 + next(i for i, line in enumerate(text[start:]) if pat in line)


# Where each planted (rule, call) is made: the function and the line of the call (issue 13).
PLANTED_SITES = {
    ("R1", "cuInit"): ("open_device", 'ok(cu.cuInit(0), "cuInit")'),
    ("R2", "cuDeviceGet"): ("learner_main", "err, dev = cu.cuDeviceGet(g)"),
    ("R3", "cuIpcOpenMemHandle"): ("import_", "cu.cuIpcOpenMemHandle(h, FLAGS)"),
}


def test_act1_shows_the_site_of_each_planted_violation(demo):
    """Lines, records and the report name the line of rl_job.py each violation came from."""
    script = str(EXAMPLES / "rl_job.py")
    sites = {k: f"{script}:{_line_of((fn, pat))} in {fn}" for k, (fn, pat) in PLANTED_SITES.items()}
    for r in demo.records(1):
        assert r["site"] == sites[(r["rule"], r["call"])], r
        assert r["py_stack"][-1] == r["site"] and r["py_stack"][0].endswith(" in <module>"), r
    out = demo.act_output(1)
    for (rule, call), site in sites.items():
        said = [ln for ln in out.splitlines() if "RANKGUARD WARN" in ln and f" {call}(" in ln]
        assert said and all(f"; at {site}; fix: " in ln for ln in said), (call, said)
    text = demo.out.split("Act 1: the audit summary", 1)[1].split("Act 1: the GPU map", 1)[0]
    for (rule, call), site in sites.items():
        n = sum(v for (rank, ru, c), v in PLANTED.items() if (ru, c) == (rule, call))
        assert f"\n    at {site}: {n} warned in ranks " in text, (site, text)


def test_act2_legacy_enforce_is_refused_and_the_job_stopped(demo):
    assert demo.launcher_status(2) == 78, demo.out
    out = demo.act_output(2)
    assert "RANKGUARD DENY terminating: this process breaks rule R1" in out, out
    assert "denied [R1 one GPU per rank]" in out, out
    # The refused collector ends its rank's process (issue 28), the learner, which uses
    # CUDA itself and so ends with 78 and its own line; launch stops the job with the
    # failure summary naming the rule and the call site.
    assert "ending the rank's process (status 78)" in out, out
    assert "RANKGUARD DENY ending this process, the rank's process, with status 78" in out, out
    assert "stopping the job" in out, out
    assert "Root Cause (first observed failure):" in out and "  rule      : R1 " in out, out
    assert "examples/rl_job.py:" in out.split("Root Cause", 1)[1], out
    assert "every check passed" not in out, out
    recs = demo.records(2)
    # The launcher stops the job at the first failure: some ranks may not get as far, but
    # nothing outside the planted set is recorded, every record is a denial, and the
    # collector on another GPU never reached its import (R1 stopped it at cuInit).
    assert not tally(recs) - PLANTED, recs
    assert {r["verdict"] for r in recs} == {"deny"}, recs
    assert any(r["rule"] == "R1" for r in recs), recs
    assert not any(r["rule"] == "R3" for r in recs), recs


def test_act3_compliant_config_is_clean(demo):
    assert demo.launcher_status(3) == 0, demo.out
    out = demo.act_output(3)
    assert "RANKGUARD" not in out, out
    assert "the guard recorded no violation in this job" in out, out
    assert out.count("done, every check passed") == WORLD, out
    assert out.count("between ranks: allowed") == WORLD, out
    files = list((demo.work / "act3" / "audit").glob("*.jsonl"))
    assert files, "the guard opens its audit file in every process that touches CUDA"
    assert demo.records(3) == []


def test_example_plants_what_the_test_expects():
    """examples/rl_job.py's own list (what the demo checks against) is the hand-written set."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import rl_job; "
            "print(json.dumps(rl_job.planted_violations(4)))")
    p = run([PYTHON, "-c", code, EXAMPLES], check=True)
    mine = collections.Counter({(v["rank"], v["rule"], v["call"]): v["count"] for v in json.loads(p.stdout)})
    assert mine == PLANTED


@pytest.fixture(scope="module")
def check_audit():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import check_audit as m
    finally:
        sys.path.remove(str(EXAMPLES))
    return m


def _rec(rank, rule, call, verdict="warn"):
    return {"rank": rank, "rule": rule, "call": call, "verdict": verdict}


def test_demo_audit_check_rejects_what_it_should(check_audit):
    """The demo's own check (examples/check_audit.py) fails on a missing, an extra, or a
    wrongly-judged record, so the demo cannot pass with a wrong audit."""
    good = [_rec(*k) for k, n in PLANTED.items() for _ in range(n)]
    assert check_audit.compare(good, "warn", PLANTED) == []
    assert check_audit.compare(good[1:], "warn", PLANTED)                           # missing
    assert check_audit.compare(good + [_rec(0, "R2", "cuDeviceGet")], "warn", PLANTED)  # extra
    assert check_audit.compare(good + [good[0]], "warn", PLANTED)                   # twice
    assert check_audit.compare([dict(good[0], verdict="deny")] + good[1:], "warn", PLANTED)
    denied = [_rec(1, "R1", "cuInit", "deny"), _rec(1, "R2", "cuDeviceGet", "deny")]
    assert check_audit.compare(denied, "enforce", PLANTED) == []
    assert check_audit.compare(denied[1:], "enforce", PLANTED)                      # no R1
    assert check_audit.compare(denied + [_rec(1, "R4", "cuMemcpyPeer", "deny")], "enforce", PLANTED)
    assert check_audit.compare([], "none", collections.Counter()) == []
    assert check_audit.compare(denied, "none", collections.Counter())


def test_demo_rejects_unknown_arguments():
    p = run([DEMO, "--frobnicate"], env=clean_env())
    assert p.returncode == 2 and "unknown argument '--frobnicate'" in p.stderr, p.stderr


def test_demo_fails_naming_the_act_when_an_act_goes_wrong(tmp_path):
    """The demo's own checks bite: in a copy of the tree whose legacy config pins *both*
    collectors to another GPU (8 violations more than planted), the demo exits 1 naming
    act 1, while act 3 (untouched) still passes."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    (tree / "c-tests").mkdir()
    shutil.copy2(DEMO, tree / "scripts" / "demo")
    shutil.copytree(EXAMPLES, tree / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    for built in ("target", ".venv", "c-tests/build"):
        (tree / built).symlink_to(ROOT / built)
    job = tree / "examples" / "rl_job.py"
    src = job.read_text()
    assert src.count("if a.legacy and c == 1:") == 1
    job.write_text(src.replace("if a.legacy and c == 1:", "if a.legacy:"))
    p = run([tree / "scripts" / "demo", "--no-build", "--workdir", tmp_path / "work"],
            env=clean_env(), timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "act 1 did NOT end as described: the audit does not hold the planted violations" in out, out
    assert "act 3 ended as described" in out, out
    # Act 2 may or may not see the extra denials: the launcher stops the job at the first
    # failure, racing the second collector's cuInit.
    assert re.search(r"the demo FAILED: act 1( 2)? did not end as described", out), out

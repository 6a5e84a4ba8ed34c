"""Every JSON output and the audit record against its published schema (docs/schema/,
issue 32), with the standard `jsonschema` validator: plan --json, check --json, and
report --json over audit records that real guarded processes wrote; each record too. Each
document carries one format/version pair, and times in one form: `ts`, Unix seconds."""
from __future__ import annotations

import json
import pathlib

import jsonschema
import pytest

from conftest import CLI, GUARD, clean_env, run
from _guard import prog

SCHEMAS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "schema"


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def valid(name: str, doc: dict) -> None:
    errors = sorted(validator(name).iter_errors(doc), key=str)
    assert not errors, f"{name}: " + "; ".join(e.message for e in errors)


def cli_json(*args, **env) -> dict:
    p = run([str(CLI), *args], env=clean_env(FAKECUDA_GPUS="8", **env))
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


def test_plan_json_matches_its_schema():
    d = cli_json("plan", "--json", "--nproc-per-node", "4")
    valid("plan.v1.json", d)
    assert (d["format"], d["version"]) == ("rankguard-plan", 1)


def test_check_json_matches_its_schema():
    for cvd in ("3", "0,1", None):
        d = cli_json("check", "--json", CUDA_VISIBLE_DEVICES=cvd)
        valid("check.v1.json", d)
        assert (d["format"], d["version"]) == ("rankguard-check", 1)


@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> pathlib.Path:
    """Records of the kinds a job writes: an R1 warning at cuInit, R2 and R4 denials."""
    tmp = tmp_path_factory.mktemp("schema")
    f = tmp / "audit.jsonl"
    for rank, mode, cvd, args in [(None, "warn", "0,1", ["link", "cuDeviceGet", "0"]),
                                  ("1", "enforce", "3", ["link", "cuDeviceGet", "1"]),
                                  ("2", "enforce", "3", ["link", "cudaMemcpyPeer", "1"])]:
        env = clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES=cvd, RANK=rank,
                        RANKGUARD_MODE=mode, RANKGUARD_AUDIT=str(f), LD_PRELOAD=str(GUARD))
        run([str(prog("guard_call")), *args], env=env)
    return f


def test_audit_records_of_real_processes_match_their_schema(audit):
    recs = [json.loads(line) for line in audit.read_text().splitlines()]
    maps = [r for r in recs if r.get("kind") == "map"]
    decisions = [r for r in recs if "kind" not in r]
    assert {r["rule"] for r in decisions} == {"R1", "R2", "R4"}, recs
    # one map record per process (docs/report.md, "The map record")
    assert len(maps) == 3 and len({m["pid"] for m in maps}) == 3, maps
    assert len(maps) + len(decisions) == len(recs)
    for r in recs:
        valid("audit-record.v1.json", r)
        assert list(r)[:2] == ["format", "version"] and isinstance(r["ts"], float), r
    for r in decisions:
        assert list(r)[:3] == ["format", "version", "ts"], r
    for m in maps:
        assert list(m)[:4] == ["format", "version", "kind", "ts"], m


def test_the_schema_tells_a_map_record_from_a_decision_record(audit):
    """`kind` selects the members: a map record is checked as one, a decision record too."""
    recs = [json.loads(line) for line in audit.read_text().splitlines()]
    m = next(r for r in recs if r.get("kind") == "map")
    d = next(r for r in recs if "kind" not in r)
    v = validator("audit-record.v1.json")
    assert not v.is_valid({**m, "r1": "maybe"})
    assert not v.is_valid({k: x for k, x in m.items() if k != "gpu"})
    assert not v.is_valid({k: x for k, x in d.items() if k != "rule"})
    assert not v.is_valid({**d, "kind": "map"})


def test_report_json_matches_its_schema_and_times_are_the_records(audit):
    d = cli_json("report", "--json", str(audit))
    valid("report.v2.json", d)
    assert (d["format"], d["version"]) == ("rankguard-report", 2)
    recs = [json.loads(line) for line in audit.read_text().splitlines()]
    firsts = [x["first"] for g in d["groups"] for x in g["ranks"] + g["sites"]]
    assert firsts and all(f["ts"] in {r["ts"] for r in recs} for f in firsts), firsts


def test_records_without_the_pair_are_still_read(tmp_path, audit):
    """A record of a guard older than the pair: report reads it as before."""
    old = tmp_path / "old.jsonl"
    lines = []
    for line in audit.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") != "map":      # map records are younger than the pair
            del r["format"], r["version"]
        lines.append(json.dumps(r))
    old.write_text("\n".join(lines) + "\n")
    new = cli_json("report", "--json", str(audit))
    was = cli_json("report", "--json", str(old))
    valid("report.v2.json", was)
    assert was["problems"] == [] and was["totals"] == new["totals"]
    same = json.dumps(was["groups"]).replace(str(old), str(audit))
    assert json.loads(same) == new["groups"]

#!/usr/bin/env python3
"""Did an act of `scripts/demo` leave the audit records it should have?

Why it exists: the demo must exit non-zero when an act does not end as described, and
"as described" includes the guard's audit. This compares the records of one act's audit
files (RANKGUARD_AUDIT=<dir>/audit.%h.%p.jsonl, one JSON object per line) with what
examples/rl_job.py plants (`planted_violations`), and prints one line saying so.

  check_audit.py --expect warn    --world 4 FILES...  exactly the planted set, verdict warn
  check_audit.py --expect enforce --world 4 FILES...  denials only, at least one R1, and no
                                                     record outside the planted set (the
                                                     launcher stops ranks early, so fewer
                                                     may be written)
  check_audit.py --expect none FILES...              no record at all

Exit status 0 when the audit is as expected, 1 when not, 2 for unreadable input.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def read_records(paths) -> list[dict]:
    """Every decision record of the audit files (map records left out); a line that is not a JSON object is an error (the
    guard writes each record with one write(2), so a torn line means something broke)."""
    out = []
    for p in paths:
        for n, line in enumerate(pathlib.Path(p).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{n}: not a JSON audit record ({e})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{p}:{n}: not a JSON object")
            if rec.get("kind") == "map":
                continue        # a process's GPU map record (docs/report.md), not a decision
            out.append(rec)
    return out


def tally(records) -> collections.Counter:
    """(rank, rule, call) -> how many records."""
    return collections.Counter((r.get("rank"), r.get("rule"), r.get("call")) for r in records)


def planted(world: int) -> collections.Counter:
    from rl_job import planted_violations  # noqa: E402 (needs cuda.bindings: imported late)
    return collections.Counter({(v["rank"], v["rule"], v["call"]): v["count"]
                                for v in planted_violations(world)})


def compare(records, expect: str, want: collections.Counter) -> list[str]:
    """Problems with the records, empty when they are as expected."""
    got = tally(records)
    problems = []
    if expect == "none":
        if records:
            problems.append(f"{len(records)} record(s), expected none: {fmt(got)}")
        return problems
    verdict = "warn" if expect == "warn" else "deny"
    odd = sorted({r.get("verdict") for r in records} - {verdict}, key=str)
    if odd:
        problems.append(f"verdicts {odd} where every record should say {verdict!r}")
    extra = got - want
    if extra:
        problems.append(f"unexpected: {fmt(extra)}")
    if expect == "warn":
        missing = want - got
        if missing:
            problems.append(f"missing: {fmt(missing)}")
    elif not any(rule == "R1" for (_, rule, _) in got):
        problems.append("no R1 denial: the collector on another GPU was not stopped by the guard")
    return problems


def fmt(c: collections.Counter) -> str:
    return ", ".join(f"rank {k[0]} {k[1]} {k[2]} x{n}" for k, n in sorted(c.items(), key=str))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect", choices=["warn", "enforce", "none"], required=True)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("files", nargs="*")
    a = ap.parse_args(argv)
    try:
        records = read_records(a.files)
    except (OSError, ValueError) as e:
        print(f"check_audit: {e}", file=sys.stderr)
        return 2
    want = collections.Counter() if a.expect == "none" else planted(a.world)
    problems = compare(records, a.expect, want)
    if problems:
        print(f"audit NOT as expected ({len(records)} record(s) in {len(a.files)} file(s)): "
              + "; ".join(problems))
        return 1
    if a.expect == "none":
        print(f"audit as expected: no records ({len(a.files)} file(s))")
    else:
        print(f"audit as expected: {len(records)} record(s), {fmt(tally(records))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""numba-cuda (pinned, python-tests/requirements-numba.txt, on the test venv's cuda-bindings
12.9.4) under the guard on the fake node: device arrays and IPC between two processes of a
rank work; a process of the rank re-pointed to another GPU that imports the array is R1 at
cuInit and R3 at the import (warn), and is stopped at cuInit, with its rank (enforce). Before this set-up
numba-cuda was not installed at all."""
from __future__ import annotations

import json

from conftest import CLI, ROOT, clean_env, run

NUMBA = ROOT / ".numba-cuda"
PROG = ROOT / "python-tests" / "_numba_ipc.py"


def rank(tmp_path, mode: str, *args: str):
    assert (NUMBA / ".requirements-numba.sha256").exists(), "run scripts/setup (it installs numba-cuda)"
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    audit = tmp_path / "audit"
    audit.mkdir()
    env = clean_env(PYTHONPATH=str(NUMBA), NUMBA_CUDA_DIR=str(NUMBA), CUDA_VISIBLE_DEVICES="2",
                    RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", RANKGUARD_MODE=mode,
                    RANKGUARD_AUDIT=str(audit / "%p.jsonl"), RANKGUARD_REGISTRY=str(reg))
    p = run([CLI, "run", "--", ROOT / ".venv" / "bin" / "python", PROG, "parent", *args],
            env=env, timeout=120)
    records = [r for f in sorted(audit.glob("*.jsonl"))
               for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") != "map"]
    return p, records


def test_device_arrays_and_ipc_in_a_rank(tmp_path):
    p, records = rank(tmp_path, "enforce")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "parent ok child rc 0 child ok True" in p.stdout, p.stdout + p.stderr
    assert "RANKGUARD" not in p.stderr, p.stderr
    assert records == []


def test_cross_device_import_is_r3_in_warn_mode(tmp_path):
    p, records = rank(tmp_path, "warn", "3,2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "child ok True" in p.stdout, p.stdout + p.stderr
    # The child sees GPU 3 and the rank's GPU 2 (as ordinal 1): numba-cuda opens a handle
    # only when the exporting device is visible ("Target device may not be visible in this
    # process" otherwise, before any CUDA call), so the legacy child here sees both. It
    # queries ordinal 1 (R2), finds it a peer and imports into its own context on GPU 3.
    got = {(r["rule"], r["call"]) for r in records}
    assert {("R1", "cuInit"), ("R3", "cuIpcOpenMemHandle")} <= got, got
    assert {rule for rule, _ in got} == {"R1", "R2", "R3"}, got
    assert [r for r in records if r["rule"] == "R3"][0]["verdict"] == "warn"
    r3 = next(r for r in records if r["rule"] == "R3")
    assert f"{PROG}:" in " ".join(r3["py_stack"]), r3["py_stack"]


def test_cross_device_child_is_stopped_in_enforce_mode(tmp_path):
    """The child is stopped at cuInit (78) and takes its rank with it (issue 28): the rank's
    process, which uses CUDA itself, ends with 78 and its own line before it could go on."""
    p, records = rank(tmp_path, "enforce", "3")
    assert p.returncode == 78, p.stdout + p.stderr
    assert "parent ok child rc" not in p.stdout, p.stdout + p.stderr
    # The parent captured its child's stderr (the child's own lines went with it): the
    # line the user sees is the rank's process's.
    (top,) = [l for l in p.stderr.splitlines() if "ending this process, the rank's process" in l]
    assert "[rank 0] RANKGUARD DENY" in top and "broke R1 (one GPU per rank)" in top, top
    assert "fix: give each rank exactly one GPU" in top, top
    assert [(r["rule"], r["call"], r["verdict"]) for r in records] == [("R1", "cuInit", "deny")]

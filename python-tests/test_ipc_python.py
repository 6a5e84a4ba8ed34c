"""Rule R3 from Python: NVIDIA's cuda.bindings driver API in multiprocessing (spawn)
children, each with its own CUDA_VISIBLE_DEVICES and RANK, under librankguard.so on the
fake platform (python-tests/_ipc_py_worker.py does the exchange)."""
from __future__ import annotations

import json
import pathlib

import pytest

from _ipc import audit, gpu_uuid, guard_env
from conftest import PYTHON, run

WORKER = pathlib.Path(__file__).with_name("_ipc_py_worker.py")
KINDS = ["mem", "event", "vmm"]


def exchange(tmp_path, kind, x, i, extra=(), **env):
    """x, i: (cvd, rank) of exporter and importer; `extra`: more worker arguments."""
    e = guard_env(tmp_path, "0", None, CUDA_VISIBLE_DEVICES=None, **env)
    p = run([PYTHON, WORKER, kind, x[0], str(x[1]), i[0], str(i[1]), *extra], env=e, timeout=180)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1]), p


def r3(tmp_path):
    return [r for r in audit(tmp_path) if r.get("rule") == "R3"]


@pytest.mark.parametrize("kind", KINDS)
def test_python_same_rank_other_gpu_is_denied(tmp_path, kind):
    res, p = exchange(tmp_path, kind, ("0", 0), ("1", 0))
    assert res["rc"] == 800
    (rec,) = r3(tmp_path)
    assert rec["verdict"] == "deny" and rec["exporter_pid"] == res["exporter_pid"]
    assert rec["exporter_gpu"] == gpu_uuid(0) and rec["gpu"] == gpu_uuid(1)
    assert f"pid {res['exporter_pid']}" in p.stderr and "R3" in p.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_python_same_rank_other_gpu_is_recorded_in_warn_mode(tmp_path, kind):
    res, _ = exchange(tmp_path, kind, ("0", 0), ("1", 0), RANKGUARD_MODE="warn")
    assert res["rc"] == 0 and res["intact"] in (True, None)
    (rec,) = r3(tmp_path)
    assert rec["rule"] == "R3" and rec["verdict"] == "warn" and rec["mode"] == "warn"
    assert rec["exporter_pid"] == res["exporter_pid"]


@pytest.mark.parametrize("kind", KINDS)
def test_python_same_gpu_is_allowed_with_every_byte(tmp_path, kind):
    res, p = exchange(tmp_path, kind, ("0", 0), ("0", 0), RANKGUARD_IPC="strict")
    assert res["rc"] == 0
    assert res["intact"] is (None if kind == "event" else True)
    assert "RANKGUARD WARN" not in p.stderr and r3(tmp_path) == []


@pytest.mark.parametrize("kind", KINDS)
def test_python_other_rank_is_allowed_with_every_byte(tmp_path, kind):
    res, p = exchange(tmp_path, kind, ("0", 0), ("1", 1), RANKGUARD_IPC="strict")
    assert res["rc"] == 0
    assert res["intact"] is (None if kind == "event" else True)
    assert r3(tmp_path) == []


@pytest.mark.parametrize("kind", KINDS)
def test_python_unknown_exporter_is_allowed_by_default_denied_when_strict(tmp_path, kind):
    """The exporter records into a registry the importer does not read: no provenance."""
    elsewhere = str(tmp_path / "elsewhere")
    res, p = exchange(tmp_path, kind, ("0", 0), ("1", 0), extra=[elsewhere])
    assert res["rc"] == 0 and res["intact"] in (True, None)
    assert "RANKGUARD WARN" not in p.stderr
    res, p = exchange(tmp_path, kind, ("0", 0), ("0", 0), extra=[elsewhere], RANKGUARD_IPC="strict")
    assert res["rc"] == 800
    (rec,) = r3(tmp_path)
    assert rec["exporter_pid"] is None and "unknown provenance" in rec["detail"]

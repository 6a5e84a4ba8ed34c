"""An exported event's provenance record goes when the event is destroyed
(src/guard/7_decide/event_records.rs).

An event handle can be opened only while its event exists, and a program that exchanges
a new interprocess event at every step (PyTorch's `torch.multiprocessing` exports one per
share of a CUDA tensor) would otherwise leave a record per step in the registry for as long
as it lives: 65,536 of them fill it, and the exports after that are lost records. Driven
through NVIDIA's cuda-bindings (the driver API), and each ABI symbol of the driver and of
both runtime majors by dlsym (ctypes).
"""
from __future__ import annotations

import json

import pytest

from conftest import FAKE, GUARD, PYTHON, ROOT, clean_env, run

TESTS = str(ROOT / "python-tests")

STEPS = 300

DRIVER = f"""
import json, os, sys
from cuda.bindings import driver as cu
def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, r
    return r[1:] if isinstance(r, tuple) else None
reg = os.environ["RANKGUARD_REGISTRY"]
sys.path.insert(0, {TESTS!r})
from _handle_table import names
events = lambda: names(reg, "event-")
ok(cu.cuInit(0))
(dev,) = ok(cu.cuDeviceGet(0))
(ctx,) = ok(cu.cuDevicePrimaryCtxRetain(dev))
ok(cu.cuCtxSetCurrent(ctx))
flags = cu.CUevent_flags.CU_EVENT_INTERPROCESS | cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
(kept,) = ok(cu.cuEventCreate(flags))
ok(cu.cuIpcGetEventHandle(kept))
out = {{"kept": events(), "while": [], "after": [],
       "files": [n for n in os.listdir(reg) if n.startswith("event-")]}}
for i in range({STEPS}):
    (ev,) = ok(cu.cuEventCreate(flags))
    ok(cu.cuIpcGetEventHandle(ev))
    ok(cu.cuIpcGetEventHandle(ev))  # exported twice: one record, one slot
    out["while"].append(len(events()))
    ok(cu.cuEventDestroy(ev))
    out["after"].append(len(events()))
plain = ok(cu.cuEventCreate(0))[0]
ok(cu.cuEventDestroy(plain))  # never exported: nothing to remove
out["end"] = events()
print(json.dumps(out))
"""

# The driver's two ABI symbols and each runtime's, by dlsym (ctypes), beside cuda-bindings'
# own path above.
SYMBOLS = f"""
import ctypes, json, os, sys
lib, create, export, destroy = sys.argv[1:5]
so = ctypes.CDLL(lib)
reg = os.environ["RANKGUARD_REGISTRY"]
sys.path.insert(0, {TESTS!r})
from _handle_table import names
events = lambda: names(reg, "event-")
INTERPROCESS_NO_TIMING = 0x4 | 0x2  # CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING (runtime: the same bits)
out = {{"while": [], "after": [], "rc": []}}
if lib.startswith("libcuda."):
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    out["rc"] += [so.cuInit(0), so.cuDeviceGet(ctypes.byref(dev), 0),
                  so.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), so.cuCtxSetCurrent(ctx)]
for i in range({STEPS}):
    ev = ctypes.c_void_p()
    h = (ctypes.c_char * 64)()
    out["rc"].append(getattr(so, create)(ctypes.byref(ev), INTERPROCESS_NO_TIMING))
    out["rc"].append(getattr(so, export)(h, ev))
    out["while"].append(len(events()))
    out["rc"].append(getattr(so, destroy)(ev))
    out["after"].append(len(events()))
out["end"] = events()
print(json.dumps(out))
"""


def _run(tmp_path, prog: str, *args: str, mode: str = "enforce", **extra: str) -> dict:
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    env = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0", RANK="0",
                    RANKGUARD_MODE=mode, RANKGUARD_REGISTRY=str(reg), LD_LIBRARY_PATH=str(FAKE), **extra)
    p = run([PYTHON, "-c", prog, *args], env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RANKGUARD" not in p.stderr, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_driver_an_exported_events_record_goes_with_the_event(tmp_path):
    out = _run(tmp_path, DRIVER)
    assert len(out["kept"]) == 1, "an exported event has its record"
    assert out["files"] == [], "a slot of the registry's handle table, not a file"
    assert out["while"] == [2] * STEPS, "each step's event is recorded once while it lives"
    assert out["after"] == [1] * STEPS, "and its record goes with it: only the kept event's stays"
    assert out["end"] == out["kept"]


@pytest.mark.parametrize("lib,create,export,destroy,extra", [
    ("libcuda.so.1", "cuEventCreate", "cuIpcGetEventHandle", "cuEventDestroy_v2", {}),
    ("libcuda.so.1", "cuEventCreate", "cuIpcGetEventHandle", "cuEventDestroy", {}),
    ("libcudart.so.12", "cudaEventCreateWithFlags", "cudaIpcGetEventHandle", "cudaEventDestroy", {}),
    ("libcudart.so.13", "cudaEventCreateWithFlags", "cudaIpcGetEventHandle", "cudaEventDestroy",
     {"FAKECUDA_DRIVER_VERSION": "13050"}),
], ids=["driver-v2", "driver-v1", "runtime12", "runtime13"])
def test_every_destroy_symbol_removes_the_record(tmp_path, lib, create, export, destroy, extra):
    out = _run(tmp_path, SYMBOLS, lib, create, export, destroy, **extra)
    assert set(out["rc"]) == {0}, out["rc"]
    assert out["while"] == [1] * STEPS, "each step's event is recorded while it lives"
    assert out["after"] == [0] * STEPS, "and its record goes with it"
    assert out["end"] == []


def test_warn_mode_removes_the_records_it_wrote(tmp_path):
    out = _run(tmp_path, DRIVER, mode="warn")
    assert out["while"] == [2] * STEPS and out["after"] == [1] * STEPS

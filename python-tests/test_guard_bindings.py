"""NVIDIA's cuda.bindings.driver under the guard, against the fake driver (issue 3)."""
from __future__ import annotations

import textwrap

from conftest import PYTHON
from _guard import guarded

SCRIPT = textwrap.dedent("""
    from cuda.bindings import driver as cu
    def rc(x):
        return int(x[0] if isinstance(x, tuple) else x)
    print("init", rc(cu.cuInit(0)))
    err, n = cu.cuDeviceGetCount()
    print("count", n)
    err, d0 = cu.cuDeviceGet(0)
    print("get0", rc(err))
    err, ctx = cu.cuCtxCreate(0, d0)
    print("ctx0", rc(err))
    err, ptr = cu.cuMemAlloc(1024)
    print("alloc", rc(err))
    err, _ = cu.cuDeviceGet(1)
    print("get1", rc(err))
    err, ctx1 = cu.cuCtxCreate(0, cu.CUdevice(1))
    print("ctx1", rc(err))
""")


def _values(out):
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def test_cuda_bindings_under_the_guard(tmp_path):
    r = guarded([PYTHON, "-c", SCRIPT], tmp_path, cvd="3", timeout=120)
    assert r.rc == 0, r.out + r.err
    v = _values(r.out)
    assert v["init"] == "0" and v["count"] == "1" and v["get0"] == "0"
    assert v["ctx0"] == "0" and v["alloc"] == "0"
    assert v["get1"] == "101" and v["ctx1"] == "101"
    calls = sorted(x["call"] for x in r.audit)
    assert calls == ["cuCtxCreate", "cuDeviceGet"], r.audit
    assert all(x["verdict"] == "deny" and x["ordinal"] == 1 for x in r.audit)


def test_cuda_bindings_warn_mode_passes_through(tmp_path):
    r = guarded([PYTHON, "-c", SCRIPT], tmp_path, cvd="3,4", mode="warn", timeout=120)
    assert r.rc == 0, r.out + r.err
    v = _values(r.out)
    assert v["count"] == "2" and v["get1"] == "0" and v["ctx1"] == "0"
    rules = sorted((x["call"], x["rule"]) for x in r.audit)
    assert rules == [("cuCtxCreate", "R2"), ("cuDeviceGet", "R2"), ("cuInit", "R1")]

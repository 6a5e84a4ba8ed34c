"""NVIDIA's `cuda-bindings` 13.x driver API against the fake driver, unguarded and under the
guard (issue 11). The 12.9 suite (test_fake_bindings.py, test_guard_bindings.py) stays:
cuda-bindings 12.9.4 is the venv's; 13.x lives in .venv/cu13-bindings (scripts/setup,
`pip install --target`, python-tests/requirements-cu13.txt), first on PYTHONPATH here.

cuda.bindings 13 asks cuGetProcAddress_v2 for the 13.x variants (cuCtxSynchronize at
13000 is cuCtxSynchronize_v2, cuMemPrefetchAsync is the location-based _v2, new entry
points such as cuMemGetMemPool), so this checks the fake's 13.x routing table with a real
client. The fake driver reports 13.5 (FAKECUDA_DRIVER_VERSION), as a machine running
CUDA 13 programs has.
"""
from __future__ import annotations

import textwrap

from _arglog import DRIVER_13
from _guard import guarded
from conftest import PYTHON, ROOT, clean_env, run

BINDINGS13 = ROOT / ".venv" / "cu13-bindings"

PRELUDE = textwrap.dedent("""
    import cuda.bindings
    from cuda.bindings import driver
    assert cuda.bindings.__version__.startswith("13."), cuda.bindings.__version__

    def ok(res):
        err, *rest = res if isinstance(res, tuple) else (res,)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else rest

    def rc(res):
        return int(res[0] if isinstance(res, tuple) else res)
""")


def env13(**kw):
    assert (BINDINGS13 / "cuda" / "bindings").is_dir(), \
        f"{BINDINGS13} missing: run scripts/setup"
    return dict(PYTHONPATH=str(BINDINGS13), FAKECUDA_DRIVER_VERSION=DRIVER_13, **kw)


def run_py(body: str, **env: str | None):
    p = run([PYTHON, "-c", PRELUDE + textwrap.dedent(body)], env=clean_env(**env13(**env)),
            timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_bindings13_init_count_uuid_version():
    out = run_py("""
        print("bindings", cuda.bindings.__version__)
        ok(driver.cuInit(0))
        print("count", ok(driver.cuDeviceGetCount()))
        dev = ok(driver.cuDeviceGet(0))
        print("uuid", bytes(ok(driver.cuDeviceGetUuid(dev)).bytes).hex())
        print("get2", rc(driver.cuDeviceGet(2)))
        print("version", ok(driver.cuDriverGetVersion()))
    """, CUDA_VISIBLE_DEVICES="5,6")
    assert "bindings 13.5.0" in out
    assert "count 2" in out
    assert "uuid 15c0ffee000040008000000000000005" in out      # physical GPU 5
    assert "get2 101" in out
    assert "version 13050" in out


SCENARIO = """
    ok(driver.cuInit(0))
    dev = ok(driver.cuDeviceGet(0))
    ctx = ok(driver.cuDevicePrimaryCtxRetain(dev))
    ok(driver.cuCtxSetCurrent(ctx))
    ok(driver.cuCtxSynchronize())                      # 13000: cuCtxSynchronize_v2
    n = 1 << 16
    src = bytes((i * 13 + 1) % 256 for i in range(n))
    dptr = ok(driver.cuMemAlloc(n))
    ok(driver.cuMemcpyHtoD(dptr, src, n))
    dst = bytearray(n)
    ok(driver.cuMemcpyDtoH(dst, dptr, n))
    print("roundtrip", bytes(dst) == src)
    m = ok(driver.cuMemAllocManaged(4096, driver.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    s = ok(driver.cuStreamCreate(0))
    loc = driver.CUmemLocation()
    loc.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = 0
    print("prefetch0", rc(driver.cuMemPrefetchAsync(m, 4096, loc, 0, s)))
    host = driver.CUmemLocation()
    host.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
    print("prefetchhost", rc(driver.cuMemPrefetchAsync(m, 4096, host, 0, s)))
    pool = ok(driver.cuMemGetMemPool(loc, driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED))
    print("pool", int(pool) == int(ok(driver.cuDeviceGetMemPool(dev))))
    print("get1", rc(driver.cuDeviceGet(1)))
    ok(driver.cuMemFree(dptr))
"""


def test_bindings13_context_memory_prefetch_pools():
    out = run_py(SCENARIO, CUDA_VISIBLE_DEVICES="3", FAKECUDA_GPUS="8")
    assert "roundtrip True" in out
    assert "prefetch0 0" in out and "prefetchhost 0" in out
    assert "pool True" in out
    assert "get1 101" in out                                 # one visible device


def test_bindings13_under_the_guard(tmp_path):
    r = guarded([PYTHON, "-c", PRELUDE + textwrap.dedent(SCENARIO)], tmp_path, cvd="3",
                timeout=120, **env13())
    assert r.rc == 0, r.out + r.err
    assert "roundtrip True" in r.out and "pool True" in r.out
    assert "prefetch0 0" in r.out and "prefetchhost 0" in r.out
    assert "get1 101" in r.out
    assert [(x["call"], x["verdict"], x["ordinal"]) for x in r.audit] == [("cuDeviceGet", "deny", 1)]


def test_bindings13_under_the_guard_warn_mode_passes_through(tmp_path):
    r = guarded([PYTHON, "-c", PRELUDE + textwrap.dedent(SCENARIO)], tmp_path, cvd="3,4",
                mode="warn", timeout=120, **env13())
    assert r.rc == 0, r.out + r.err
    assert "get1 0" in r.out
    rules = sorted((x["call"], x["rule"]) for x in r.audit)
    assert ("cuDeviceGet", "R2") in rules, rules

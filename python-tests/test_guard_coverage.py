"""Issue 15's ranked list: the functions that reach another device outside the first
guarded set, each on every path a program reaches it by.

For each function (c-tests/tests/guard_call.c makes the call; a runtime function once per
ABI symbol, per-thread `_ptsz`/`_ptds` forms included, in each major the guard wraps it for:
guard_call against the CUDA 12 runtime, guard_call13 and reach13_calls against CUDA 13):
  - ordinal 0 / the rank's own device: reaches the driver unchanged (the same rc as an
    unguarded run) and leaves no audit record;
  - another ordinal (or a peer pair) under one visible GPU in enforce mode: denied with the
    documented code (101 for R2, 800 for R4) and one deny record; queries are never denied
    (the driver's own answer, no record);
  - with two GPUs visible in warn mode: recorded with its rule and passed through, so the
    program gets exactly what the driver alone answers.
Plus PyTorch's cudaMallocAsync allocator pattern (c-tests/tests/pool_peer.c) and the
dma-buf / external-memory R3 exchange (c-tests/tests/ipc_peer.c kinds dmabuf, rtdmabuf,
extvmm).
"""
from __future__ import annotations

import pytest

from _guard import guarded, prog
from _guarded import GUARDED

# (call, rule, code): rule None = a query (recorded in warn, never denied). Each is called
# at the version of every legacy ABI variant the generated matrix lists for it
# (`variant_versions`), so a variant a new header adds is called without editing this list.
DRIVER_RULES = [
    ("cuDeviceGetDefaultMemPool", "R2", 101),
    ("cuDeviceGetMemPool", "R2", 101),
    ("cuDeviceSetMemPool", "R2", 101),
    ("cuMemPoolSetAccess", "R2", 101),
    ("cuMemcpy3DPeer", "R4", 800),
    ("cuMemcpy3DPeerAsync", "R4", 800),
    ("cuMulticastAddDevice", "R2", 101),
    ("cuGreenCtxCreate", "R2", 101),
    ("cuDeviceGetDevResource", "R2", 101),
    ("cuLaunchCooperativeKernelMultiDevice", "R4", 800),
    ("cuGraphAddMemAllocNode", "R2", 101),
    ("cuGraphAddNode", "R2", 101),
    ("cuMemGetDefaultMemPool", "R2", 101),
    ("cuMemPrefetchBatchAsync", "R2", 101),
    ("cuMemDiscardAndPrefetchBatchAsync", "R2", 101),
    ("cuMemGetMemPool", "R2", 101),
    ("cuMemSetMemPool", "R2", 101),
    ("cuMulticastUnbind", "R2", 101),
    ("cuMulticastBindMem", "R2", 101),
    ("cuLogicalEndpointAddDevice", "R2", 101),
    ("cuGraphNodeSetParams", "R2", 101),
    ("cuCheckpointProcessRestore", "R1", 800),
    ("cuDeviceGetP2PAttribute", None, None),
    ("cuDeviceComputeCapability", None, None),
    ("cuDeviceGetLuid", None, None),
    ("cuDeviceGetByPCIBusId", None, None),
    ("cuDeviceGraphMemTrim", "R2", 101),
    ("cuDeviceSetGraphMemAttribute", "R2", 101),
    ("cuKernelSetAttribute", "R2", 101),
    ("cuDeviceGetTexture1DLinearMaxWidth", None, None),
    ("cuDeviceGetExecAffinitySupport", None, None),
]

# ABI variants that name no device: passed through untouched whatever the ordinal (the 12.x
# multicast binds; the memory's location was judged at cuMemCreate).
NAMES_NO_DEVICE = {"cuMulticastBindAddr", "cuMulticastBindMem"}


def variant_versions(api: str) -> list[int]:
    """The versions of `api`'s legacy-stream ABI variants (cudaTypedefs.h PFN_*_vNNNNN)."""
    vs = next(vs for lib, a, _, vs in GUARDED if lib == "driver" and a == api)
    return sorted({v for _, v, pt in vs if not pt})


def variant_abi(api: str, version: int) -> str:
    vs = next(vs for lib, a, _, vs in GUARDED if lib == "driver" and a == api)
    return next(abi for abi, v, pt in vs if v == version and not pt)


def per_thread_variant(api: str, version: int) -> str | None:
    """The per-thread ABI variant (`_ptds`/`_ptsz`) a per-thread caller of `api` gets at
    `version`: the newest one introduced at or before it, None if there is none."""
    vs = next((vs for lib, a, _, vs in GUARDED if lib == "driver" and a == api), [])
    pts = [(v, abi) for abi, v, pt in vs if pt and v <= version]
    return max(pts)[1] if pts else None


DRIVER = [(c, variant_versions(c), rule, code) for c, rule, code in DRIVER_RULES]
PATHS = ["link", "dlsym", "gpa1", "gpa2", "gpa2pt", "static", "ep", "epv"]
# A program built with --default-stream per-thread links (or dlsyms) the per-thread symbol:
# these paths run at each version where the function has one (guard_call linkpt/dlsympt).
PT_PATHS = ["linkpt", "dlsympt"]
# The runtime's cudaGetDriverEntryPoint (ep) asks at the runtime's own version (12.090 for
# the fake libcudart.so.12 these programs link): it hands out the newest variant up to
# then, and nothing introduced later (CUDA 13's entry points).
CASES = [(p, c, v) + (("none", None) if variant_abi(c, v) in NAMES_NO_DEVICE else (rule, code))
         for c, vs, rule, code in DRIVER for p in PATHS for v in vs
         if p != "ep" or v == max((x for x in vs if x <= 12090), default=None)] + [
    (p, c, v, rule, code) for c, vs, rule, code in DRIVER for v in vs
    if per_thread_variant(c, v) for p in PT_PATHS]

RUNTIME = [
    ("cudaDeviceGetDefaultMemPool", "R2", 101),
    ("cudaDeviceGetMemPool", "R2", 101),
    ("cudaDeviceSetMemPool", "R2", 101),
    ("cudaMemPoolSetAccess", "R2", 101),
    ("cudaMemcpy3DPeer", "R4", 800),
    ("cudaMemcpy3DPeerAsync", "R4", 800),
    ("cudaSetValidDevices", "R2", 101),
    ("cudaLaunchCooperativeKernelMultiDevice", "R4", 800),
    ("cudaGraphAddMemAllocNode", "R2", 101),
    ("cudaDeviceGetP2PAttribute", None, None),
]

_BASELINE: dict = {}


def baseline(tmp_path, args, cvd, **env) -> int:
    """What the fake platform alone answers (no guard)."""
    key = (tuple(str(a) for a in args), cvd)
    if key not in _BASELINE:
        r = guarded(args, tmp_path, cvd=cvd, preload=False, **env)
        assert "setup ok" in r.out, r.out + r.err
        _BASELINE[key] = r.value("rc")
    return _BASELINE[key]


def check(tmp_path, args_of, call, rule, code, abi=None, **env):
    """`abi`: the ABI symbol called, which every record must name (the wrapper of that
    symbol judged the call, not another major's or the legacy-stream one)."""
    ok = guarded(args_of(0), tmp_path, cvd="3", **env)
    assert ok.rc == 0 and "setup ok" in ok.out, ok.out + ok.err
    assert ok.value("rc") == baseline(tmp_path, args_of(0), "3", **env), ok.out + ok.err
    assert ok.audit == [] and "RANKGUARD" not in ok.err, ok.err

    bad = guarded(args_of(1), tmp_path, cvd="3", **env)
    assert bad.rc == 0 and "setup ok" in bad.out, bad.out + bad.err
    mine = [r for r in bad.audit if r["call"] == call]
    if rule is None:
        # A query about another device: the driver's own answer, never denied.
        assert bad.value("rc") == baseline(tmp_path, args_of(1), "3", **env), bad.out + bad.err
        assert [r for r in mine if r["verdict"] == "deny"] == [], mine
    else:
        assert bad.value("rc") == code, bad.out + bad.err
        assert len(mine) == 1, bad.audit
        assert mine[0]["verdict"] == "deny" and mine[0]["rule"] == rule, mine
        assert abi is None or mine[0]["abi"] == abi, mine
        assert f"RANKGUARD DENY {call}(" in bad.err, bad.err

    warn = guarded(args_of(1), tmp_path, cvd="0,1", mode="warn", **env)
    assert warn.rc == 0 and "setup ok" in warn.out, warn.out + warn.err
    assert warn.value("rc") == baseline(tmp_path, args_of(1), "0,1", **env), warn.out + warn.err
    mine = [r for r in warn.audit if r["call"] == call]
    assert len(mine) == 1 and mine[0]["verdict"] == "warn", warn.audit
    assert mine[0]["rule"] == (rule or "R2"), mine
    assert abi is None or mine[0]["abi"] == abi, mine


def passes_untouched(tmp_path, args_of, call, **env):
    """A variant that names no device: allowed in enforce mode whatever the ordinal, with
    the driver's own answer and no record; in warn mode not recorded either."""
    for ordinal, cvd, mode in ((0, "3", "enforce"), (1, "3", "enforce"), (1, "0,1", "warn")):
        r = guarded(args_of(ordinal), tmp_path, cvd=cvd, mode=mode, **env)
        assert r.rc == 0 and "setup ok" in r.out, r.out + r.err
        assert r.value("rc") == baseline(tmp_path, args_of(ordinal), cvd, **env), r.out + r.err
        assert [x for x in r.audit if x["call"] == call] == [], r.audit


@pytest.mark.parametrize("path,call,version,rule,code", CASES,
                         ids=[f"{p}-{c}-{v}" for p, c, v, _, _ in CASES])
def test_driver_function_on_every_path(tmp_path, path, call, version, rule, code):
    driver_case(tmp_path, path, call, version, rule, code)


def driver_case(tmp_path, path, call, version, rule, code):
    """guard_call's driver call on `path` at `version`: checked against `rule` and `code`
    (`check`), or, for rule "none" (a variant that names no device), passed untouched."""
    def args_of(o):
        return [prog("guard_call"), path, call, str(o), str(version)]
    if rule == "none":
        passes_untouched(tmp_path, args_of, call)
    else:
        check(tmp_path, args_of, call, rule, code)


def _abi_cases(rows):
    """(major, api, abi, rule, code) for every ABI symbol (per-thread forms included) of
    each function in every runtime major that has a wrapper for it (generated matrix)."""
    variants = {api: vs for lib, api, _, vs in GUARDED if lib == "runtime"}
    return [(m, api, abi, rule, code) for api, rule, code in rows for abi, m, _ in variants[api]]


# The program of each runtime major (the same source, built against each major's headers
# and linked with its libcudart), and the driver version its runtime needs.
RUNTIME_PROG = {12: ("guard_call", {}), 13: ("guard_call13", {"FAKECUDA_DRIVER_VERSION": "13050"})}
RUNTIME_CASES = _abi_cases(RUNTIME)


@pytest.mark.parametrize("path", ["link", "dlsym"])
@pytest.mark.parametrize("major,call,abi,rule,code", RUNTIME_CASES,
                         ids=[f"{a}-cu{m}" for m, _, a, _, _ in RUNTIME_CASES])
def test_runtime_function(tmp_path, path, major, call, abi, rule, code):
    name, env = RUNTIME_PROG[major]
    check(tmp_path, lambda o: [prog(name), path, abi, str(o)], call, rule, code, abi=abi, **env)


RUNTIME13 = [
    ("cudaMemGetDefaultMemPool", "R2", 101),
    ("cudaMemGetMemPool", "R2", 101),
    ("cudaMemSetMemPool", "R2", 101),
    ("cudaDeviceGetDevResource", "R2", 101),
    ("cudaGreenCtxCreate", "R2", 101),
    ("cudaDeviceGetExecutionCtx", "R2", 101),
    ("cudaMemPrefetchBatchAsync", "R2", 101),
]


RUNTIME13_CASES = _abi_cases(RUNTIME13)


@pytest.mark.parametrize("path", ["link", "dlsym"])
@pytest.mark.parametrize("major,call,abi,rule,code", RUNTIME13_CASES,
                         ids=[a for _, _, a, _, _ in RUNTIME13_CASES])
def test_cuda13_runtime_function(tmp_path, path, major, call, abi, rule, code):
    """CUDA 13 runtime names (a program linked against libcudart.so.13, on a 13.5 driver)."""
    assert major == 13
    check(tmp_path, lambda o: [prog("reach13_calls"), path, abi, str(o)], call, rule, code,
          abi=abi, FAKECUDA_DRIVER_VERSION="13050")


# (call, version): the per-thread variants cuGetProcAddress_v2 hands out from that version.
PER_THREAD = [("cuMemcpy3DPeer", 7000), ("cuMemcpy3DPeerAsync", 7000)]


@pytest.mark.parametrize("path", ["gpa2pt"] + PT_PATHS)
@pytest.mark.parametrize("call,version", PER_THREAD)
def test_per_thread_3d_peer_copies_are_their_own_variants(tmp_path, path, call, version):
    """cuGetProcAddress_v2 with the per-thread flag hands out `_ptds`/`_ptsz`, and a
    per-thread program links them: guarded too (an unknown variant of a guarded function
    would be refused with 500)."""
    r = guarded([prog("guard_call"), path, call, "0", str(version)], tmp_path, cvd="3")
    assert f"setup ok ({call}_pt" in r.out and r.value("rc") == 0, r.out + r.err
    r = guarded([prog("guard_call"), path, call, "1", str(version)], tmp_path, cvd="3")
    assert r.value("rc") == 800, r.out + r.err
    assert [x["abi"] for x in r.audit] == [per_thread_variant(call, version)], r.audit


@pytest.mark.parametrize("api", ["rt", "drv"])
def test_pytorch_allocator_pattern(tmp_path, api):
    """`cudaDeviceGetDefaultMemPool(&pool, 1)` then `cudaMemPoolSetAccess(pool, {location
    {device, 0}, readWrite})`: peer access through a pool (and its driver twin)."""
    get, setacc = (("cudaDeviceGetDefaultMemPool", "cudaMemPoolSetAccess") if api == "rt"
                   else ("cuDeviceGetDefaultMemPool", "cuMemPoolSetAccess"))
    alone = guarded([prog("pool_peer"), api], tmp_path, cvd="0,1", preload=False)
    assert (alone.value("getpool-rc"), alone.value("setaccess-rc"), alone.value("access")) == (0, 0, 3), alone.out

    # enforce: refused at the first step; no pool of device 1, no access granted
    bad = guarded([prog("pool_peer"), api], tmp_path, cvd="3")
    assert bad.value("getpool-rc") == 101 and bad.value("pool") == 0, bad.out + bad.err
    rec = [r for r in bad.audit if r["call"] == get]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and rec[0]["verdict"] == "deny", bad.audit

    # warn: both steps recorded (device 1's pool: R2; device 0 given access to it: R4), and
    # the program gets exactly what the platform alone gives
    warn = guarded([prog("pool_peer"), api], tmp_path, cvd="0,1", mode="warn")
    assert (warn.value("getpool-rc"), warn.value("setaccess-rc"), warn.value("access")) == (0, 0, 3), warn.out
    got = [r for r in warn.audit if r["call"] == get]
    assert len(got) == 1 and got[0]["rule"] == "R2" and got[0]["verdict"] == "warn", warn.audit
    acc = [r for r in warn.audit if r["call"] == setacc]
    assert len(acc) == 1 and acc[0]["rule"] == "R4" and acc[0]["verdict"] == "warn", warn.audit
    assert "peer access between device 1 and device 0" in acc[0]["detail"], acc[0]
    # one grant, one record: the driver call the runtime makes inside it is not a second one
    assert not [r for r in warn.audit if r["call"] != setacc and r["rule"] == "R4"], warn.audit


def test_a_pool_of_the_ranks_own_device_is_no_peer_grant(tmp_path):
    """Device 0's pool made accessible from device 0 (what PyTorch does on a one-GPU rank):
    allowed, unchanged, no record."""
    r = guarded([prog("guard_call"), "link", "cudaMemPoolSetAccess", "0"], tmp_path, cvd="3")
    assert r.value("rc") == 0 and r.audit == [], r.out + r.err

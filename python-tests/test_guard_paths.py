"""R2 and R4 on every path a program reaches CUDA by (issue 3).

For each guarded call and each path (linked symbol, dlopen+dlsym, cuGetProcAddress v1/v2
at old and new versions and with the per-thread flag, cudaGetDriverEntryPoint(ByVersion),
a static-runtime-like program that only dlsyms cuGetProcAddress_v2):
  - ordinal 0 passes through (rc 0, no audit record);
  - another ordinal is denied in enforce mode (the guard's code and its audit record);
  - with several GPUs visible in warn mode it is recorded and passed through to the
    driver, which succeeds (so the denial above is the guard's, not the driver's).
Functions that need their own set-up, or that the fake refuses itself (SET_UP_DRIVER,
SET_UP_RUNTIME), are compared with an unguarded run instead; every guarded function is
called here or by test_guard_coverage.py (test_the_matrix_covers_every_guarded_function).
"""
from __future__ import annotations

import re

import pytest

import test_guard_coverage as cov
from _guard import guarded, prog
from _guarded import GUARDED

# Every guarded function whose policy is not hand-written, from the generated matrix
# (scripts/gen_guarded.py: the same table the guard is built from). cuInit, the entry points
# and IPC have their own suites (test_guard_init, test_guard_entry*, test_ipc).
R2_POLICIES = {"ordinal", "ordinal_or_host", "location", "location_in", "access"}


# Issue 15's ranked list has its own set-up per function (a pool, a multicast team, a
# green context's resources, ...) and is called on every path by test_guard_coverage.py
# (batch and attribute copies, advice, the runtime's graph node: test_guard_copies.py).
def _elsewhere():
    import test_guard_copies as copies
    return {c[0] for c in cov.DRIVER + cov.RUNTIME + cov.RUNTIME13} | copies.COVERED


ELSEWHERE = _elsewhere()

# Guarded functions called with their own set-up (c-tests/include/set_up_calls.h,
# driver_set_up_call / runtime_set_up_call), or whose fake answer is a refusal of its own
# (no graphs, kernels, NvSciSync or logical endpoints on the fake), so the generic tests' "the driver alone succeeds" does not
# hold: api -> (rule, code), rule None = a query. Each is called below on every path of
# every ABI variant the generated matrix lists for it, and compared with an unguarded run
# (test_guard_coverage.check).
SET_UP_DRIVER = {
    "cuGraphExecNodeSetParams": ("R2", 101),
    "cuLogicalEndpointBindMem": ("R2", 101),
    "cuLogicalEndpointBindAddr": ("R2", 101),
    "cuLogicalEndpointUnbind": ("R2", 101),
    "cuMulticastBindAddr": ("R2", 101),
}
SET_UP_RUNTIME = {
    "cudaKernelSetAttributeForDevice": ("R2", 101),
    "cudaGraphAddNode_v2": ("R2", 101),
    "cudaGraphNodeSetParams": ("R2", 101),
    "cudaGraphExecNodeSetParams": ("R2", 101),
    "cudaMemDiscardAndPrefetchBatchAsync": ("R2", 101),
    "cudaDeviceGetNvSciSyncAttributes": (None, None),
    "cudaChooseDevice": (None, None),
}
SET_UP = set(SET_UP_DRIVER) | set(SET_UP_RUNTIME)


def _driver(kinds):
    """(api, versions): one version per legacy ABI variant (cudaTypedefs.h PFN_*_vNNNNN);
    the per-thread path picks the per-thread variant at the same version."""
    return [(api, sorted({v for _, v, pt in vs if not pt}))
            for lib, api, kind, vs in GUARDED
            if lib == "driver" and kind in kinds and api not in ELSEWHERE | SET_UP]


def _runtime(kinds):
    """(major, api, abi) of every runtime ABI symbol of those policies, in every wrapped
    major: guard_call (CUDA 12) and guard_call13 (the same program built against CUDA 13)
    call each through their own runtime, with its parameters."""
    return [(m, api, abi) for lib, api, kind, vs in GUARDED
            if lib == "runtime" and kind in kinds and api not in ELSEWHERE | SET_UP for abi, m, _ in vs]


# The program of each runtime major, and the driver version its runtime needs.
RUNTIME_PROG = {12: ("guard_call", None), 13: ("guard_call13", "13050")}


def _rt(major, path, call, ordinal, tmp_path, **kw):
    name, driver = RUNTIME_PROG[major]
    env = {"FAKECUDA_DRIVER_VERSION": driver} if driver else {}
    return guarded([prog(name), path, call, ordinal], tmp_path, **kw, **env)


DRIVER_CALLS = _driver(R2_POLICIES)
DRIVER_QUERIES = _driver({"query"})
DRIVER_PEER = [api for api, _ in _driver({"peer_ctx"})]
RUNTIME_R2 = _runtime(R2_POLICIES)
RUNTIME_R4 = _runtime({"peer"})
RUNTIME_QUERIES = _runtime({"query"})


def own_suites(hooks):
    """Hand-written bodies tested by their own suites: initialisation (test_guard_init),
    entry points (test_guard_entry*), IPC, shareable handles, dma-buf and external memory
    (test_ipc), the pool-device memory of cuMemPoolCreate (test_guard_coverage's
    pool-access tests), an exported event's record removed at its destroy
    (test_event_records: cuda-bindings, and every ABI symbol by dlsym)."""
    return {"cuInit", "cuGetProcAddress", "cudaGetDriverEntryPoint",
            "cudaGetDriverEntryPointByVersion", "cuMemPoolCreate", "cuImportExternalMemory",
            "cudaImportExternalMemory", "cuMemGetHandleForAddressRange", "cuEventDestroy",
            "cudaEventDestroy"} | {
        a for a in hooks if "Ipc" in a or "Shareable" in a or "PoolExport" in a or "PoolImport" in a}


def test_every_runtime_symbol_of_every_major_is_called():
    """Below the API level: every runtime ABI symbol the guard wraps (per-thread `_ptsz` /
    `_ptds` forms included), in every major it wraps it for, is called by some case here,
    in test_guard_coverage.py or in test_guard_copies.py, so a wrapper that no test reaches
    (a new per-thread form, a function's CUDA 13 wrapper) fails this test."""
    import test_guard_copies as copies
    reached = {(abi, m) for m, _, abi in RUNTIME_R2 + RUNTIME_R4 + RUNTIME_QUERIES}
    reached |= {(abi, m) for m, _, abi, _, _ in SET_UP_RUNTIME_CASES}
    reached |= {(abi, m) for m, _, abi, _, _ in cov.RUNTIME_CASES + cov.RUNTIME13_CASES}
    reached |= {(abi, m) for m, abi in copies.RUNTIME}
    hooks = {api for _, api, kind, _ in GUARDED if kind == "hook"}
    wrapped = {(abi, m): api for lib, api, _, vs in GUARDED if lib == "runtime"
               for abi, m, _ in vs if api not in own_suites(hooks)}
    assert sorted(set(wrapped) - reached) == []
    assert not reached - set(wrapped), "a case calls a symbol the guard does not wrap"


def test_every_driver_variant_is_called_on_every_path():
    """Below the API level, for the driver: every legacy-stream ABI variant of every guarded
    function outside the hand-written suites is called on the link, dlsym, cuGetProcAddress
    v1/v2 (with and without the per-thread flag), static and
    cudaGetDriverEntryPointByVersion paths, and every per-thread variant through
    cuGetProcAddress_v2's per-thread flag and as a per-thread program's linked and dlsym'ed
    symbol. A case (call, version, path) reaches the newest variant introduced at or before
    its version (per-thread on the per-thread paths)."""
    import test_guard_copies as copies
    pt_paths = ["gpa2pt"] + cov.PT_PATHS
    reached = {(c, v, p) for p, c, v in CASES + QUERY_CASES + copies.DRIVER_CASES}
    reached |= {(c, v, p) for p, c, v, _, _ in cov.CASES + SET_UP_DRIVER_CASES}
    reached |= {(c, v, p) for c, v in cov.PER_THREAD for p in pt_paths}
    reached |= {(c, 12090, p) for c in DRIVER_PEER for p in PEER_PATHS}
    variants = {api: vs for lib, api, _, vs in GUARDED if lib == "driver"}

    def legacy(api, version):
        return max((v, abi) for abi, v, pt in variants[api] if not pt and v <= version)[1]

    hit = {(legacy(c, v), p) for c, v, p in reached if p not in cov.PT_PATHS}
    hit |= {(cov.per_thread_variant(c, v), p) for c, v, p in reached if p in pt_paths}
    hooks = {api for _, api, kind, _ in GUARDED if kind == "hook"}
    missing = [(abi, p) for api, vs in variants.items() if api not in own_suites(hooks)
               for abi, _, pt in vs
               for p in (pt_paths if pt else ["link", "dlsym", "gpa1", "gpa2", "gpa2pt", "static", "epv"])
               if (abi, p) not in hit]
    assert missing == []


def test_the_matrix_covers_every_guarded_function():
    """Every guarded function is called here, by test_guard_coverage.py (issue 15's ranked
    list, with its own set-up per function), or is a hand-written hook with its own suite,
    so a new guarded function that no test calls fails this test."""
    covered = {a for a, _ in DRIVER_CALLS + DRIVER_QUERIES} | set(DRIVER_PEER) | {
        a for _, a, _ in RUNTIME_R2 + RUNTIME_R4 + RUNTIME_QUERIES} | ELSEWHERE | {
        c for _, c, _, _, _ in SET_UP_DRIVER_CASES} | {a for _, a, _, _, _ in SET_UP_RUNTIME_CASES}
    assert {m for m, _, _ in RUNTIME_R2} == set(RUNTIME_PROG)
    hooks = {api for _, api, kind, _ in GUARDED if kind == "hook"}
    assert covered | own_suites(hooks) == {api for _, api, _, _ in GUARDED}
    assert not (SET_UP & ELSEWHERE), "tested with its own set-up elsewhere: remove it from SET_UP_*"
    # every ABI variant of a function with its own set-up is reached by some case
    reached = {(c, v) for _, c, v, _, _ in SET_UP_DRIVER_CASES} | {
        (a, abi) for _, a, abi, _, _ in SET_UP_RUNTIME_CASES}
    for lib, api, _, vs in GUARDED:
        if api in SET_UP_DRIVER:
            assert {(api, v) for _, v, pt in vs if not pt} <= reached, api
        elif api in SET_UP_RUNTIME:
            assert {(api, abi) for abi, _, _ in vs} <= reached, api
    assert {"cudaMemPrefetchAsync", "cudaGetDeviceProperties", "cuDeviceGetUuid"} <= covered


# Paths that take an explicit version, and those that do not (the ABI name or the
# runtime's own version decides).
VERSIONED = ["gpa1", "gpa2", "gpa2pt", "static", "epv", "link", "dlsym"]

def _cases(calls):
    out = []
    for call, versions in calls:
        for path in VERSIONED:
            for v in versions:
                out.append((path, call, v))
        out += [(p, call, v) for v in versions if cov.per_thread_variant(call, v)
                for p in cov.PT_PATHS]
        # cudaGetDriverEntryPoint of the CUDA 12 runtime asks at its own version (12090):
        # a function that only CUDA 13 declares is not an entry point it can hand out.
        if min(versions) <= 12090:
            out.append(("ep", call, 12090))
    return out


CASES = _cases(DRIVER_CALLS)
QUERY_CASES = _cases(DRIVER_QUERIES)


def _args(path, call, ordinal, version):
    return [prog("guard_call"), path, call, str(ordinal), str(version)]


_BASELINE: dict = {}


def baseline(tmp_path, args, cvd) -> int:
    """What the fake driver alone answers (no guard): an allowed or warned call must
    reach the driver and come back with exactly this."""
    key = (tuple(str(a) for a in args), cvd)
    if key not in _BASELINE:
        _BASELINE[key] = guarded(args, tmp_path, cvd=cvd, preload=False).value("rc")
    return _BASELINE[key]


@pytest.mark.parametrize("path,call,version", CASES,
                         ids=[f"{p}-{c}-{v}" for p, c, v in CASES])
def test_driver_call_on_every_path(tmp_path, path, call, version):
    ok = guarded(_args(path, call, 0, version), tmp_path, cvd="3")
    assert ok.rc == 0, ok.out + ok.err
    assert ok.value("rc") == baseline(tmp_path, _args(path, call, 0, version), "3")
    assert ok.audit == []
    assert "RANKGUARD" not in ok.err

    bad = guarded(_args(path, call, 1, version), tmp_path, cvd="3")
    assert bad.rc == 0, bad.out + bad.err
    assert bad.value("rc") == 101, bad.out + bad.err
    denied = [r for r in bad.audit if r["call"] == call]
    assert len(denied) == 1, bad.audit
    assert denied[0]["verdict"] == "deny" and denied[0]["rule"] == "R2"
    assert denied[0]["ordinal"] == 1 and denied[0]["cvd"] == "3"
    assert f"RANKGUARD DENY {call}(" in bad.err

    warn = guarded(_args(path, call, 1, version), tmp_path, cvd="0,1", mode="warn")
    assert warn.rc == 0, warn.out + warn.err
    assert warn.value("rc") == baseline(tmp_path, _args(path, call, 1, version), "0,1")
    recorded = [r for r in warn.audit if r["call"] == call]
    assert len(recorded) == 1 and recorded[0]["verdict"] == "warn", warn.audit
    assert recorded[0]["rule"] == "R2"


@pytest.mark.parametrize("call", [c for c, _ in DRIVER_CALLS])
def test_without_the_guard_the_driver_allows_it(tmp_path, call):
    """Control: the fake driver alone lets ordinal 1 through when two GPUs are visible,
    so the denials above come from the guard."""
    r = guarded(_args("link", call, 1, 12090), tmp_path, cvd="0,1", preload=False)
    assert r.value("rc") == 0, r.out + r.err
    assert r.audit == []


@pytest.mark.parametrize("path,call,version", QUERY_CASES,
                         ids=[f"{p}-{c}-{v}" for p, c, v in QUERY_CASES])
def test_driver_query_on_every_path(tmp_path, path, call, version):
    """A pure query about another device is never denied: the driver answers it (under
    correct visibility, with its own invalid-device error); warn mode records it."""
    for ordinal, cvd in ((0, "3"), (1, "3")):
        r = guarded(_args(path, call, ordinal, version), tmp_path, cvd=cvd)
        assert r.rc == 0, r.out + r.err
        assert r.value("rc") == baseline(tmp_path, _args(path, call, ordinal, version), cvd)
        assert [x for x in r.audit if x["call"] == call and x["verdict"] != "query"] == [], r.audit
    warn = guarded(_args(path, call, 1, version), tmp_path, cvd="0,1", mode="warn")
    assert warn.rc == 0, warn.out + warn.err
    assert warn.value("rc") == baseline(tmp_path, _args(path, call, 1, version), "0,1")
    rec = [x for x in warn.audit if x["call"] == call]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and rec[0]["ordinal"] == 1, warn.audit


@pytest.mark.parametrize("path", ["link", "dlsym"])
@pytest.mark.parametrize("major,api,call", RUNTIME_R2 + RUNTIME_R4,
                         ids=[f"{c}-cu{m}" for m, _, c in RUNTIME_R2 + RUNTIME_R4])
def test_runtime_call(tmp_path, path, major, api, call):
    rule, code = ("R2", 101) if (major, api, call) in RUNTIME_R2 else ("R4", 800)
    ok = _rt(major, path, call, "0", tmp_path, cvd="3")
    assert ok.rc == 0, ok.out + ok.err
    assert ok.audit == []
    if rule == "R2" or call != "cudaDeviceEnablePeerAccess":
        assert ok.value("rc") == 0, ok.out + ok.err

    bad = _rt(major, path, call, "1", tmp_path, cvd="3")
    assert bad.value("rc") == code, bad.out + bad.err
    rec = [r for r in bad.audit if r["call"] == api]
    assert len(rec) == 1 and rec[0]["rule"] == rule and rec[0]["verdict"] == "deny"
    assert rec[0]["abi"] == call

    warn = _rt(major, path, call, "1", tmp_path, cvd="0,1", mode="warn")
    assert warn.value("rc") == 0, warn.out + warn.err
    rec = [r for r in warn.audit if r["call"] == api]
    assert len(rec) == 1 and rec[0]["rule"] == rule and rec[0]["verdict"] == "warn"


@pytest.mark.parametrize("path", ["link", "dlsym"])
@pytest.mark.parametrize("major,api,call", RUNTIME_QUERIES,
                         ids=[f"{c}-cu{m}" for m, _, c in RUNTIME_QUERIES])
def test_runtime_query(tmp_path, path, major, api, call):
    for ordinal in ("0", "1"):
        r = _rt(major, path, call, ordinal, tmp_path, cvd="3")
        assert r.rc == 0, r.out + r.err
        assert r.value("rc") == _rt(major, path, call, ordinal, tmp_path, cvd="3",
                                    preload=False).value("rc")
        assert [x for x in r.audit if x["verdict"] != "query"] == [], r.audit
    warn = _rt(major, path, call, "1", tmp_path, cvd="0,1", mode="warn")
    assert warn.value("rc") == 0, warn.out + warn.err
    rec = [x for x in warn.audit if x["call"] == api]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and rec[0]["abi"] == call, warn.audit


PEER_PATHS = ["link", "dlsym", "gpa1", "gpa2", "gpa2pt", "static", "ep", "epv"] + cov.PT_PATHS


@pytest.mark.parametrize("path", PEER_PATHS)
@pytest.mark.parametrize("call", DRIVER_PEER)
def test_peer_access_between_contexts_is_r4(tmp_path, path, call):
    """Contexts on two devices exist only with several GPUs visible, i.e. in warn mode
    (enforce stops such a process at cuInit): the guard records R4 and passes through."""
    warn = guarded([prog("guard_call"), path, call, "1", "12090"], tmp_path, cvd="0,1",
                   mode="warn")
    assert warn.value("rc") == 0, warn.out + warn.err
    rec = [r for r in warn.audit if r["call"] == call]
    assert len(rec) == 1 and rec[0]["rule"] == "R4", warn.audit
    if path in ["gpa2pt"] + cov.PT_PATHS:
        assert rec[0]["abi"] == (cov.per_thread_variant(call, 12090) or call), rec


# ---- functions with their own set-up (SET_UP_DRIVER, SET_UP_RUNTIME) --------------------


def _set_up_driver_cases():
    """(path, call, version, rule, code) on every path, at each version of a legacy ABI
    variant (cov.PATHS; the runtime's cudaGetDriverEntryPoint only at the newest version up
    to its own 12090); rule "none" where the variant names no device."""
    out = []
    for lib, api, _, vs in GUARDED:
        if lib != "driver" or api not in SET_UP_DRIVER:
            continue
        versions = sorted({v for _, v, pt in vs if not pt})
        ep = max((v for v in versions if v <= 12090), default=None)
        for v in versions:
            abi = next(a for a, x, pt in vs if x == v and not pt)
            rule, code = ("none", None) if abi in cov.NAMES_NO_DEVICE else SET_UP_DRIVER[api]
            out += [(p, api, v, rule, code) for p in cov.PATHS if p != "ep" or v == ep]
    return out


def _set_up_runtime_cases():
    """(major, api, abi, rule, code) of every runtime ABI symbol, in every wrapped major."""
    return [(m, api, abi) + SET_UP_RUNTIME[api] for lib, api, _, vs in GUARDED
            if lib == "runtime" and api in SET_UP_RUNTIME for abi, m, _ in vs]


SET_UP_DRIVER_CASES = _set_up_driver_cases()
SET_UP_RUNTIME_CASES = _set_up_runtime_cases()


@pytest.mark.parametrize("path,call,version,rule,code", SET_UP_DRIVER_CASES,
                         ids=[f"{p}-{c}-{v}" for p, c, v, _, _ in SET_UP_DRIVER_CASES])
def test_driver_function_with_set_up(tmp_path, path, call, version, rule, code):
    cov.driver_case(tmp_path, path, call, version, rule, code)


@pytest.mark.parametrize("path", ["link", "dlsym"])
@pytest.mark.parametrize("major,api,abi,rule,code", SET_UP_RUNTIME_CASES,
                         ids=[f"{a}-cu{m}" for m, _, a, _, _ in SET_UP_RUNTIME_CASES])
def test_runtime_function_with_set_up(tmp_path, path, major, api, abi, rule, code):
    name, driver = RUNTIME_PROG[major]
    env = {"FAKECUDA_DRIVER_VERSION": driver} if driver else {}
    if api == "cudaChooseDevice":
        # GPU 1 of another compute capability: asked for it, the runtime returns device 1
        topo = tmp_path / "topology"
        topo.write_text("1 cc=8.0\n")
        env["FAKECUDA_TOPOLOGY"] = str(topo)
    cov.check(tmp_path, lambda o: [prog(name), path, abi, str(o)], api, rule, code, **env)


def test_choose_device_answers_another_device_only_when_asked(tmp_path):
    """Control for cudaChooseDevice's query: with device 1 of another compute capability
    visible, the runtime alone chooses it (so the warn record above is about device 1)."""
    topo = tmp_path / "topology"
    topo.write_text("1 cc=8.0\n")
    for ordinal, chosen in (("0", 0), ("1", 1)):
        r = guarded([prog("guard_call"), "link", "cudaChooseDevice", ordinal], tmp_path, cvd="0,1",
                    preload=False, FAKECUDA_TOPOLOGY=str(topo))
        assert (r.value("rc"), r.value("device")) == (0, chosen), r.out + r.err


# The runtime functions whose fake records its arguments (c-tests/fake/runtime/
# cudart_reach_more.c, cudaMemDiscardAndPrefetchBatchAsync in cudart_reach.c): a warned
# call reaches the runtime of its major with every argument as the program passed it.
ARGLOGGED = {"cudaDeviceGraphMemTrim", "cudaDeviceSetGraphMemAttribute",
             "cudaDeviceGetGraphMemAttribute", "cudaKernelSetAttributeForDevice",
             "cudaDeviceGetTexture1DLinearMaxWidth", "cudaDeviceGetNvSciSyncAttributes",
             "cudaDeviceGetHostAtomicCapabilities", "cudaDeviceGetP2PAtomicCapabilities",
             "cudaGraphAddNode_v2", "cudaGraphNodeSetParams", "cudaGraphExecNodeSetParams",
             "cudaMemDiscardAndPrefetchBatchAsync"}
ARGLOG_CASES = [(m, api, abi) for lib, api, _, vs in GUARDED
                if lib == "runtime" and api in ARGLOGGED for abi, m, _ in vs]


@pytest.mark.parametrize("major,api,abi", ARGLOG_CASES, ids=[f"{a}-cu{m}" for m, _, a in ARGLOG_CASES])
def test_runtime_arguments_arrive_intact(tmp_path, major, api, abi):
    name, driver = RUNTIME_PROG[major]
    env = {"FAKECUDA_DRIVER_VERSION": driver} if driver else {}
    lines = {}
    for preload in (False, True):
        log = tmp_path / f"arglog-{preload}.txt"
        r = guarded([prog(name), "link", abi, "1"], tmp_path, cvd="0,1", mode="warn",
                    preload=preload, FAKECUDA_ARGLOG=str(log), **env)
        assert r.rc == 0 and "setup ok" in r.out, r.out + r.err
        lines[preload] = [x for x in log.read_text().splitlines()
                          if x.split()[:2] == [f"libcudart.so.{major}", abi]]
        if preload:
            assert [x["verdict"] for x in r.audit if x["call"] == api] == ["warn"], r.audit
    assert len(lines[False]) == 1, lines
    assert lines[True] == lines[False]
    # the device the program named (ORDINAL 1) is among what arrived
    assert re.search(r"(device|Device)=1\b|id=1}", lines[True][0]), lines

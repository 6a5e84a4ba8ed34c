"""Issue 15's items 6 and 7 (and issue 11's per-major runtime wrappers): batch and attribute
copies' location hints, runtime memory advice and prefetch by location, and the runtime's
generic graph node, each on every path a program reaches it by.

The calls are made by guard_call / guard_call13 (c-tests/include/copies_calls.h): every
copy moves a patterned managed buffer into a zeroed one; its source hints are host
locations (with a non-zero id: never a device), its last destination hint is {DEVICE,
ORDINAL}, the others device 0. For each call:
  - ORDINAL 0: reaches the platform and does what it does without the guard (the same rc,
    the same bytes copied), no record; a runtime call reaches its major's runtime with every
    argument the program passed (the fake runtime's argument log, FAKECUDA_ARGLOG), as in
    the unguarded run;
  - ORDINAL 1 under one visible GPU in enforce mode: denied with 101 before the platform
    (nothing copied, nothing logged), one R2 deny record;
  - ORDINAL 1 with two GPUs visible in warn mode: one R2 warn record, then exactly what the
    platform alone does.
Driver functions: through the exported symbol, dlsym, cuGetProcAddress (v1), _v2 (legacy
and per-thread), a static runtime's one dlsym, and cudaGetDriverEntryPoint(ByVersion) of
the CUDA 13 runtime, at every ABI version (12.8's with failIdx, 13.0's without); 12.8's
also from a CUDA 12 program, through the CUDA 12 runtime's entry points.
"""
from __future__ import annotations

import re

import pytest

import test_guard_coverage as cov
from _guard import guarded, prog

DRIVER_13 = "13050"

# (call, [ABI versions]) of the driver: every variant's version (cudaTypedefs.h).
DRIVER = [
    ("cuMemcpyBatchAsync", [12080, 13000]),
    ("cuMemcpy3DBatchAsync", [12080, 13000]),
    ("cuMemcpyWithAttributesAsync", [13020]),
    ("cuMemcpy3DWithAttributesAsync", [13020]),
    ("cuFabricCpyBatchAsync", [13050]),
]
PATHS = ["link", "dlsym", "gpa1", "gpa2", "gpa2pt", "static", "ep", "epv"]
# cudaGetDriverEntryPoint (ep) asks at the CUDA 13 runtime's own version (13050): the
# newest variant, so only that version's case.
DRIVER_CASES = [(p, c, v) for c, vs in DRIVER for p in PATHS for v in vs if p != "ep" or v == max(vs)] + [
    (p, c, v) for c, vs in DRIVER for v in vs if cov.per_thread_variant(c, v) for p in cov.PT_PATHS]

# (major, runtime ABI symbol): each major's own names, with its own parameters.
RUNTIME = [
    (12, "cudaMemAdvise"), (12, "cudaMemAdvise_v2"), (12, "cudaMemPrefetchAsync_v2"),
    (12, "cudaMemPrefetchAsync_v2_ptsz"),
    (12, "cudaMemcpyBatchAsync"), (12, "cudaMemcpyBatchAsync_ptsz"),
    (12, "cudaMemcpy3DBatchAsync"), (12, "cudaMemcpy3DBatchAsync_ptsz"),
    (12, "cudaGraphAddNode"),
    (13, "cudaMemAdvise"),
    (13, "cudaMemcpyBatchAsync"), (13, "cudaMemcpyBatchAsync_ptsz"),
    (13, "cudaMemcpy3DBatchAsync"), (13, "cudaMemcpy3DBatchAsync_ptsz"),
    (13, "cudaMemcpyWithAttributesAsync"), (13, "cudaMemcpyWithAttributesAsync_ptsz"),
    (13, "cudaMemcpy3DWithAttributesAsync"), (13, "cudaMemcpy3DWithAttributesAsync_ptsz"),
    (13, "cudaGraphAddNode"),
]
RUNTIME_PROG = {12: ("guard_call", None), 13: ("guard_call13", DRIVER_13)}

# The guarded API names these tests call on every path (test_guard_paths.py counts them as
# covered).
COVERED = {c for c, _ in DRIVER} | {re.sub(r"_ptsz$", "", a) for _, a in RUNTIME}


def api_of(abi: str) -> str:
    return re.sub(r"_ptsz$", "", abi)


def results(r):
    """What the program observed: the call's rc and whether the bytes were copied."""
    return r.value("rc"), r.value("copied")


def expected_and_logged(r, log):
    exp = [l[len("expect "):] for l in r.out.splitlines() if l.startswith("expect ")]
    got = log.read_text().splitlines() if log.exists() else []
    return exp, got


def blank(lines):
    """Two runs differ only in addresses (ASLR)."""
    return [re.sub(r"0x[0-9a-f]+", "0x_", l) for l in lines]


def check(tmp_path, args_of, api, abi=None, **env):
    n = len(list(tmp_path.glob("arglog-*")))
    logs = [tmp_path / f"arglog-{n}-{i}.txt" for i in range(5)]

    def run(ordinal, cvd, i, **kw):
        return guarded(args_of(ordinal), tmp_path, cvd=cvd, FAKECUDA_ARGLOG=str(logs[i]), **kw, **env)

    alone = run(0, "3", 0, preload=False)
    ok = run(0, "3", 1)
    assert ok.rc == 0 and "setup ok" in ok.out, ok.out + ok.err
    assert results(ok) == results(alone), ok.out + alone.out
    assert ok.audit == [] and "RANKGUARD" not in ok.err, ok.err
    exp, got = expected_and_logged(ok, logs[1])
    if abi:   # a runtime call: every argument as the program passed it, as without the guard
        assert exp and got == exp, (exp, got)
        assert blank(got) == blank(expected_and_logged(alone, logs[0])[1])
        if "Memcpy" in abi:
            assert ok.value("copied") == 1 and ok.value("rc") == 0, ok.out

    bad = run(1, "3", 2)
    assert bad.rc == 0 and "setup ok" in bad.out, bad.out + bad.err
    assert results(bad) == (101, 0), bad.out + bad.err
    mine = [r for r in bad.audit if r["call"] == api]
    assert len(mine) == 1 and mine[0]["verdict"] == "deny" and mine[0]["rule"] == "R2", bad.audit
    assert mine[0]["ordinal"] == 1, mine
    if abi:
        assert mine[0]["abi"] == abi, mine
        assert expected_and_logged(bad, logs[2])[1] == [], "a denied call reached the runtime"
    assert f"RANKGUARD DENY {api}(" in bad.err, bad.err

    alone = run(1, "0,1", 3, preload=False)
    warn = run(1, "0,1", 4, mode="warn")
    assert warn.rc == 0 and "setup ok" in warn.out, warn.out + warn.err
    assert results(warn) == results(alone), warn.out + alone.out
    mine = [r for r in warn.audit if r["call"] == api]
    assert len(mine) == 1 and mine[0]["verdict"] == "warn" and mine[0]["rule"] == "R2", warn.audit
    if abi:
        exp, got = expected_and_logged(warn, logs[4])
        assert got == exp and blank(got) == blank(expected_and_logged(alone, logs[3])[1]), (exp, got)


@pytest.mark.parametrize("path,call,version", DRIVER_CASES,
                         ids=[f"{p}-{c}-{v}" for p, c, v in DRIVER_CASES])
def test_driver_copy_on_every_path(tmp_path, path, call, version):
    check(tmp_path, lambda o: [prog("guard_call13"), path, call, str(o), str(version)], call,
          FAKECUDA_DRIVER_VERSION=DRIVER_13)


# 12.8's variants through a CUDA 12 program (guard_call, 12.9 headers): its runtime's
# cudaGetDriverEntryPoint (at 12090) and ...ByVersion hand out the guard's wrappers too.
DRIVER12_CASES = [(p, c, 12080) for c in ("cuMemcpyBatchAsync", "cuMemcpy3DBatchAsync")
                  for p in ("link", "gpa2", "gpa2pt", "ep", "epv")]


@pytest.mark.parametrize("path,call,version", DRIVER12_CASES,
                         ids=[f"{p}-{c}-{v}" for p, c, v in DRIVER12_CASES])
def test_driver_copy_of_a_cuda12_program(tmp_path, path, call, version):
    check(tmp_path, lambda o: [prog("guard_call"), path, call, str(o), str(version)], call)


@pytest.mark.parametrize("path", ["link", "dlsym"])
@pytest.mark.parametrize("major,abi", RUNTIME, ids=[f"{a}-cu{m}" for m, a in RUNTIME])
def test_runtime_call_of_each_major(tmp_path, path, major, abi):
    name, driver = RUNTIME_PROG[major]
    env = {"FAKECUDA_DRIVER_VERSION": driver} if driver else {}
    check(tmp_path, lambda o: [prog(name), path, abi, str(o)], api_of(abi), abi, **env)


def test_every_variant_of_these_functions_is_called():
    """The lists above name every guarded ABI variant of these functions (generated table):
    a new variant in a header fails here until it is called."""
    from _guarded import GUARDED
    drv = {c: sorted({v for _, v, pt in vs if not pt}) for lib, c, _, vs in GUARDED if lib == "driver"}
    for call, versions in DRIVER:
        assert drv[call] == versions, (call, drv[call])
    rt = {(m, abi) for lib, api, _, vs in GUARDED if lib == "runtime" and api in COVERED for abi, m, _ in vs}
    assert rt == set(RUNTIME), sorted(rt ^ set(RUNTIME))


HOST_CASES = [(m, a) for m, a in RUNTIME if "Advise" in a or "Prefetch" in a]


@pytest.mark.parametrize("major,abi", HOST_CASES, ids=[f"{a}-cu{m}" for m, a in HOST_CASES])
def test_advice_and_prefetch_to_the_host_are_allowed_intact(tmp_path, major, abi):
    """ORDINAL -1: `cudaCpuDeviceId` (12's advice) or a host location: not a device, so
    allowed in enforce mode with every argument intact and nothing recorded."""
    name, driver = RUNTIME_PROG[major]
    env = {"FAKECUDA_DRIVER_VERSION": driver} if driver else {}
    logs = [tmp_path / "alone.txt", tmp_path / "guarded.txt"]
    alone = guarded([prog(name), "link", abi, "-1"], tmp_path, cvd="3", preload=False,
                    FAKECUDA_ARGLOG=str(logs[0]), **env)
    r = guarded([prog(name), "link", abi, "-1"], tmp_path, cvd="3", FAKECUDA_ARGLOG=str(logs[1]), **env)
    assert r.rc == 0 and results(r) == results(alone) and r.value("rc") == 0, r.out + r.err
    exp, got = expected_and_logged(r, logs[1])
    assert exp and got == exp and blank(got) == blank(expected_and_logged(alone, logs[0])[1])
    assert ("device=-1" in got[0]) != ("location={type=2,id=0}" in got[0]), got
    assert r.audit == [] and "RANKGUARD" not in r.err, r.err


BOUND_CASES = [("guard_call13", DRIVER_13, "cuMemcpyBatchAsync", v) for v in ("12080", "13000")] + [
    (name, driver, "cudaMemcpyBatchAsync", None) for name, driver in RUNTIME_PROG.values()]


@pytest.mark.parametrize("name,driver,call,version", BOUND_CASES,
                         ids=[f"{c}-{n}-{v or 'rt'}" for n, _, c, v in BOUND_CASES])
def test_attributes_past_the_copy_count_are_not_read(tmp_path, name, driver, call, version):
    """One attribute more than there are copies, naming device 1: the guard reads at most
    `count` attributes, so the call reaches the platform, which refuses numAttrs > count
    itself (the same answer as without the guard), and nothing is recorded."""
    args = [prog(name), "link", call, "0"] + ([version] if version else [])
    env = {"COPIES_ATTRS_PAST_COUNT": "1", **({"FAKECUDA_DRIVER_VERSION": driver} if driver else {})}
    alone = guarded(args, tmp_path, cvd="3", preload=False, **env)
    r = guarded(args, tmp_path, cvd="3", **env)
    assert r.rc == 0 and results(r) == results(alone), r.out + r.err + alone.out
    assert r.value("rc") == 1 and r.value("copied") == 0, r.out    # CUDA_ERROR_INVALID_VALUE
    assert r.audit == [] and "RANKGUARD" not in r.err, r.err

"""R2 and R4 on every path a program reaches CUDA by (issue 3).

For each guarded call and each path (linked symbol, dlopen+dlsym, cuGetProcAddress v1/v2
at old and new versions and with the per-thread flag, cudaGetDriverEntryPoint(ByVersion),
a static-runtime-like program that only dlsyms cuGetProcAddress_v2):
  - ordinal 0 passes through (rc 0, no audit record);
  - another ordinal is denied in enforce mode (the guard's code and its audit record);
  - with several GPUs visible in warn mode it is recorded and passed through to the
    driver, which succeeds (so the denial above is the guard's, not the driver's).
"""
from __future__ import annotations

import pytest

from _guard import guarded, prog

# (call, versions): the versions pick ABI variants (cudaTypedefs.h PFN_*_vNNNNN).
DRIVER_CALLS = [
    ("cuDeviceGet", [2000]),
    ("cuCtxCreate", [2000, 3020, 11040, 12050]),
    ("cuDevicePrimaryCtxRetain", [7000]),
    ("cuDevicePrimaryCtxRelease", [7000, 11000]),
    ("cuDevicePrimaryCtxReset", [7000, 11000]),
    ("cuDevicePrimaryCtxSetFlags", [7000, 11000]),
    ("cuDevicePrimaryCtxGetState", [7000]),
    ("cuMemCreate", [10020]),
    ("cuMemPoolCreate", [11020]),
    ("cuMemSetAccess", [10020]),
    ("cuMemPrefetchAsync", [8000, 12020]),
    ("cuMemAdvise", [8000, 12020]),
]
# Paths that take an explicit version, and those that do not (the ABI name or the
# runtime's own version decides).
VERSIONED = ["gpa1", "gpa2", "gpa2pt", "static", "epv", "link", "dlsym"]

CASES = []
for call, versions in DRIVER_CALLS:
    for path in VERSIONED:
        for v in versions:
            CASES.append((path, call, v))
    CASES.append(("ep", call, 12090))


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
    assert f"RANKGUARD WARN {call}(" in bad.err

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


RUNTIME_R2 = ["cudaSetDevice", "cudaInitDevice"]
RUNTIME_R4 = ["cudaDeviceEnablePeerAccess", "cudaMemcpyPeer", "cudaMemcpyPeerAsync"]


@pytest.mark.parametrize("path", ["link", "dlsym"])
@pytest.mark.parametrize("call", RUNTIME_R2 + RUNTIME_R4)
def test_runtime_call(tmp_path, path, call):
    rule, code = ("R2", 101) if call in RUNTIME_R2 else ("R4", 800)
    ok = guarded([prog("guard_call"), path, call, "0"], tmp_path, cvd="3")
    assert ok.rc == 0, ok.out + ok.err
    assert ok.audit == []
    if call in RUNTIME_R2 or call != "cudaDeviceEnablePeerAccess":
        assert ok.value("rc") == 0, ok.out + ok.err

    bad = guarded([prog("guard_call"), path, call, "1"], tmp_path, cvd="3")
    assert bad.value("rc") == code, bad.out + bad.err
    rec = [r for r in bad.audit if r["call"] == call]
    assert len(rec) == 1 and rec[0]["rule"] == rule and rec[0]["verdict"] == "deny"

    warn = guarded([prog("guard_call"), path, call, "1"], tmp_path, cvd="0,1", mode="warn")
    assert warn.value("rc") == 0, warn.out + warn.err
    rec = [r for r in warn.audit if r["call"] == call]
    assert len(rec) == 1 and rec[0]["rule"] == rule and rec[0]["verdict"] == "warn"


PEER_PATHS = ["link", "dlsym", "gpa1", "gpa2", "gpa2pt", "static", "ep"]


@pytest.mark.parametrize("path", PEER_PATHS)
@pytest.mark.parametrize("call", ["cuCtxEnablePeerAccess", "cuMemcpyPeer", "cuMemcpyPeerAsync"])
def test_peer_access_between_contexts_is_r4(tmp_path, path, call):
    """Contexts on two devices exist only with several GPUs visible, i.e. in warn mode
    (enforce stops such a process at cuInit): the guard records R4 and passes through."""
    warn = guarded([prog("guard_call"), path, call, "1", "12090"], tmp_path, cvd="0,1",
                   mode="warn")
    assert warn.value("rc") == 0, warn.out + warn.err
    rec = [r for r in warn.audit if r["call"] == call]
    assert len(rec) == 1 and rec[0]["rule"] == "R4", warn.audit


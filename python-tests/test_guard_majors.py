"""CUDA 12 and 13 side by side under the guard (issue 11): each runtime call reaches the
wrapper with its own major's parameters and the runtime of its own major, on the fake
platform's two runtimes (c-tests/fake/runtime: libcudart.so.12 and .13, each logging every
argument it receives, FAKECUDA_ARGLOG).

Each guarded run is compared with the same program run without the guard: the arguments
of every call that reaches the runtime are the same, byte for byte.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from _arglog import DRIVER_13, DRIVER_14, logged_run, prog, sigdiff_names
from _guard import guarded
from _guard import prog as gprog
from conftest import GUARD, NATIVE_GUARD, TESTS

ENFORCE = {"CUDA_VISIBLE_DEVICES": "0", "RANKGUARD_MODE": "enforce"}


def same(lines):
    """Log lines with addresses blanked: two runs of a program differ only there (ASLR);
    each run's own `expect` lines are compared exactly. IPC handles carry the exporter's pid."""
    return [re.sub(r"reserved=[0-9a-f]+", "reserved=_", re.sub(r"0x[0-9a-f]+", "0x_", l)) for l in lines]


def _audit(tmp_path):
    path = tmp_path / "audit.jsonl"
    return path, (lambda: [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") != "map"]
                  if path.exists() else [])


def guarded_run(cmd, tmp_path, mode="enforce", cvd="0", gpus="2", **env):
    path, read = _audit(tmp_path)
    r = logged_run(cmd, tmp_path, guard=True, gpus=gpus, CUDA_VISIBLE_DEVICES=cvd,
                   RANKGUARD_MODE=mode, RANKGUARD_AUDIT=str(path), **env)
    r.records = read()
    path.unlink(missing_ok=True)
    return r


@pytest.mark.parametrize("lib", [GUARD, NATIVE_GUARD], ids=["glibc-2.28", "glibc-2.34"])
def test_the_guard_defines_each_runtime_wrapper_under_its_major(lib):
    """cudaMemPrefetchAsync@libcudart.so.12 and @@libcudart.so.13 (the default), distinct
    functions; every other export stays unversioned (dlsym must satisfy dlsym@GLIBC_2.34).
    Both builds (docs/install.md, "Two builds")."""
    assert lib.is_file(), f"{lib} missing: cargo build --release (scripts/setup for zig)"
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 8 and f[6] != "UND":
            syms[f[7]] = f[1]
    for name in ("cudaMemPrefetchAsync", "cudaSetDevice", "cudaIpcOpenMemHandle", "cudaGetDriverEntryPoint"):
        assert f"{name}@libcudart.so.12" in syms and f"{name}@@libcudart.so.13" in syms, name
        assert syms[f"{name}@libcudart.so.12"] != syms[f"{name}@@libcudart.so.13"], name
        assert name not in syms
    assert "cudaGetDeviceProperties_v2@libcudart.so.12" in syms
    assert "cudaGetDeviceProperties@@libcudart.so.13" in syms
    for name in ("dlsym", "cuInit", "cuCtxCreate_v4", "execve"):
        assert name in syms, name


def test_cu13_prefetch_allowed_allowed_denied_and_every_argument_intact(tmp_path):
    """Device 0, the host, device 1: allowed, allowed, denied with 101 (R2); the calls
    that reach the runtime carry exactly the arguments of the unguarded run (the caller's
    stream included)."""
    plain = logged_run([prog("cu13_calls"), "prefetch"], tmp_path)
    assert plain.rc == 0 and plain.logged == plain.expected, plain.out + plain.err
    r = guarded_run([prog("cu13_calls"), "prefetch"], tmp_path)
    assert r.rc == 0, r.out + r.err
    assert [c for _, c in r.results] == [0, 0, 101, 0], r.out + r.err
    # What reached the runtime: exactly what the program passed, minus the denied call;
    # the same as the unguarded run.
    assert r.logged == [r.expected[0], r.expected[1], r.expected[3]]
    assert same(r.logged) == same([plain.logged[0], plain.logged[1], plain.logged[3]])
    assert all("stream=(nil)" not in l for l in r.logged)
    deny = [x for x in r.records if x["call"] == "cudaMemPrefetchAsync"]
    assert len(deny) == 1 and deny[0]["verdict"] == "deny" and deny[0]["rule"] == "R2", r.records
    assert "location=CUmemLocation { type_: 1, id: 1 }" in deny[0]["args"], deny[0]
    assert "RANKGUARD DENY cudaMemPrefetchAsync(" in r.err


def test_cu13_prefetch_in_warn_mode_is_recorded_and_passes_intact(tmp_path):
    plain = logged_run([prog("cu13_calls"), "prefetch"], tmp_path)
    r = guarded_run([prog("cu13_calls"), "prefetch"], tmp_path, mode="warn", cvd="0,1")
    assert r.rc == 0, r.out + r.err
    assert r.logged == r.expected and same(r.logged) == same(plain.logged)
    assert [c for _, c in r.results] == [c for _, c in plain.results]
    warned = [x for x in r.records if x["call"] == "cudaMemPrefetchAsync"]
    assert len(warned) == 1 and warned[0]["verdict"] == "warn" and warned[0]["rule"] == "R2"


def test_cu13_every_differing_function_arrives_intact_under_the_guard(tmp_path):
    """Every runtime function whose 13 signature differs from 12's (generated list): with the
    guard its arguments reach the 13 runtime exactly as without it."""
    plain = logged_run([prog("cu13_calls"), "sigdiff"], tmp_path)
    assert plain.rc == 0 and plain.logged == plain.expected, plain.out + plain.err
    for mode, cvd in (("enforce", "0"), ("warn", "0,1")):
        r = guarded_run([prog("cu13_calls"), "sigdiff"], tmp_path, mode=mode, cvd=cvd)
        assert r.rc == 0, r.out + r.err
        assert r.logged == r.expected and same(r.logged) == same(plain.logged), mode
        assert r.results == plain.results, mode
    assert {l.split()[1] for l in plain.logged} >= {n for n, _ in sigdiff_names()} - {"cudaMemPrefetchAsync", "cudaGetDeviceProperties"}   # prefetch, props: above


def test_cu13_get_device_properties_of_device_1_is_r2(tmp_path):
    r = guarded_run([prog("cu13_calls"), "props"], tmp_path, mode="warn", cvd="0,1")
    assert r.rc == 0, r.out + r.err
    assert r.logged == r.expected
    rec = [x for x in r.records if x["call"] == "cudaGetDeviceProperties"]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and rec[0]["ordinal"] == 1, r.records
    assert rec[0]["abi"] == "cudaGetDeviceProperties"


@pytest.mark.parametrize("mode,cvd", [("enforce", "0"), ("warn", "0,1")])
@pytest.mark.parametrize("main,lib", [("mixed_main12", "libmixed13.so"),
                                      ("mixed_main13", "libmixed12.so")])
def test_mixed_majors_each_caller_reaches_its_own_runtime_under_the_guard(tmp_path, main, lib, mode, cvd):
    """One process, a cu12 executable plus an RTLD_LOCAL cu13 library (and the reverse):
    each caller's cudaSetDevice, cudaIpcGetMemHandle/OpenMemHandle and
    cudaGetDriverEntryPoint reach its own runtime; the library's cudaSetDevice(1) is R2."""
    plain = logged_run([prog(main), prog(lib)], tmp_path)
    assert plain.rc == 0 and plain.logged == plain.expected, plain.out + plain.err
    r = guarded_run([prog(main), prog(lib)], tmp_path, mode=mode, cvd=cvd)
    assert r.rc == 0, r.out + r.err
    own, other = main[-2:], lib[-5:-3]
    denied = f"libcudart.so.{other} cudaSetDevice device=1"
    if mode == "enforce":
        assert r.logged == [l for l in r.expected if l != denied], r.out + r.err
        assert same(r.logged) == same([l for l in plain.logged if l != denied])
    else:
        assert r.logged == r.expected and same(r.logged) == same(plain.logged)
    assert f"libcudart.so.{own} cudaSetDevice device=0" in r.logged
    assert any(l.startswith(f"libcudart.so.{other} cudaIpcOpenMemHandle") for l in r.logged)
    assert any(l.startswith(f"libcudart.so.{own} cudaGetDriverEntryPoint") for l in r.logged)
    assert any(l.startswith(f"libcudart.so.{other} cudaGetDriverEntryPoint") for l in r.logged)
    # The driver functions each runtime hands out are the guard's (they work, and route).
    assert "entry cuInit found=1 status=0" in r.out and "entry cuDeviceGet found=1 status=0" in r.out
    rec = [x for x in r.records if x["call"] == "cudaSetDevice"]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and rec[0]["ordinal"] == 1, r.records
    assert rec[0]["verdict"] == ("deny" if mode == "enforce" else "warn")


def test_an_unknown_runtime_major_passes_untouched_with_one_line(tmp_path):
    """The stand-in libcudart.so.14: no wrapper with a guessed signature; its calls (device 1
    included) reach it untouched and one line names it. The driver layer still enforces:
    the runtime's own prefetch to device 1 reaches the driver's cuMemPrefetchAsync_v2
    through the guard, which records it (warn mode, two GPUs visible)."""
    plain = logged_run([prog("cu14_calls"), "prefetch"], tmp_path, driver=DRIVER_14)
    r = guarded_run([prog("cu14_calls"), "prefetch"], tmp_path, driver=DRIVER_14, mode="warn", cvd="0,1")
    assert r.rc == 0, r.out + r.err
    assert r.logged == r.expected and same(r.logged) == same(plain.logged)
    assert r.results == plain.results and [c for _, c in r.results] == [0, 0, 0, 0]
    assert all(l.startswith("libcudart.so.14 ") for l in r.logged)
    lines = [l for l in r.err.splitlines() if "libcudart.so.14" in l]
    assert len(lines) == 1, r.err
    assert "a major this guard has no wrappers for (it wraps 12 and 13)" in lines[0]
    assert "driver layer" in lines[0]
    assert not [x for x in r.records if x["call"].startswith("cuda")], r.records
    drv = [x for x in r.records if x["call"] == "cuMemPrefetchAsync"]
    assert len(drv) == 1 and drv[0]["abi"] == "cuMemPrefetchAsync_v2", r.records
    assert drv[0]["rule"] == "R2" and drv[0]["verdict"] == "warn"


def test_a_known_major_says_nothing(tmp_path):
    r = guarded_run([prog("cu13_calls"), "basic"], tmp_path, driver=DRIVER_13, mode="warn", cvd="0,1")
    assert r.rc == 0, r.out + r.err
    assert "no wrappers for" not in r.err


def test_two_copies_of_one_major_share_the_wrappers(tmp_path):
    """Two copies of runtime 12 in one process (the program's libcudart.so.12 and
    libuses_cudart.so's private copy, same version node): decided (README, "Runtime
    majors"), the private copy's caller gets the same 12 wrapper, which serves it with the
    first copy found. The call is guarded exactly once and has the unguarded outcome. (The
    fake runtimes, like NVIDIA's, keep the current device in the driver's current context,
    so which copy served it is not visible here, nor to the program.)"""
    cmd = [gprog("guard_two_copies"), TESTS, "1"]
    plain = guarded(cmd, tmp_path, cvd="0,1", preload=False)
    assert "rc=0 global=1 private=1" in plain.out, plain.out + plain.err
    warn = guarded(cmd, tmp_path, cvd="0,1", mode="warn")
    assert "rc=0 global=1 private=1" in warn.out, warn.out + warn.err
    rec = [x for x in warn.audit if x["call"] == "cudaSetDevice"]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and rec[0]["abi"] == "cudaSetDevice", warn.audit
    bad = guarded(cmd, tmp_path, cvd="0")
    assert "rc=101 global=0 private=0" in bad.out, bad.out + bad.err
    assert [x["verdict"] for x in bad.audit if x["call"] == "cudaSetDevice"] == ["deny"]
    ok = guarded([gprog("guard_two_copies"), TESTS, "0"], tmp_path, cvd="0")
    assert "rc=0 global=0 private=0" in ok.out and ok.audit == [], ok.out + ok.err


@pytest.mark.parametrize("how", ["handle", "default", "next"])
def test_cu13_dlsym_paths_hand_out_the_13_wrapper(tmp_path, how):
    """dlsym of cudaMemPrefetchAsync on the 13 runtime's handle, RTLD_DEFAULT and RTLD_NEXT:
    the wrapper with CUDA 13's parameters, calling the 13 runtime (device 1 denied, every
    argument intact)."""
    r = guarded_run([prog("guard_dlsym13"), how], tmp_path)
    assert r.rc == 0, r.out + r.err
    assert [c for _, c in r.results] == [0, 0, 101], r.out + r.err
    assert r.logged == r.expected[:2]
    rec = [x for x in r.records if x["call"] == "cudaMemPrefetchAsync"]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and rec[0]["verdict"] == "deny", r.records


def test_cu12_rtld_next_reaches_the_default_13_wrapper(tmp_path):
    """A CUDA 12 program's dlsym(RTLD_NEXT, name) finds the guard's default (13) definition:
    cudaSetDevice (same parameters in both majors) reaches the 12 runtime, guarded;
    cudaMemPrefetchAsync (parameters differ) is refused with 500 and one line naming why,
    never called with the wrong parameters."""
    for ordinal, code in (("0", 0), ("1", 101)):
        r = guarded([gprog("guard_next12"), "cudaSetDevice", ordinal], tmp_path, cvd="0")
        assert f"rc={code}" in r.out, r.out + r.err
    r = guarded([gprog("guard_next12"), "cudaMemPrefetchAsync", "0"], tmp_path, cvd="0")
    assert "rc=500" in r.out, r.out + r.err
    assert "cudaMemPrefetchAsync: the real function was not found in a CUDA 13 runtime" in r.err
    assert "its parameters differ in the other CUDA majors" in r.err


def test_cu12_rtld_default_gets_the_12_wrapper(tmp_path):
    """dlsym(RTLD_DEFAULT, "cudaMemPrefetchAsync") in a CUDA 12 process finds the guard's
    default (13) definition first; with no 13 runtime loaded the guard hands out the 12
    wrapper instead, so the call has 12's parameters: device 0 allowed, device 1 R2."""
    ok = guarded([gprog("guard_next12"), "cudaMemPrefetchAsync", "0", "default"], tmp_path, cvd="0")
    assert "rc=0" in ok.out and ok.audit == [], ok.out + ok.err
    bad = guarded([gprog("guard_next12"), "cudaMemPrefetchAsync", "1", "default"], tmp_path, cvd="0")
    assert "rc=101" in bad.out, bad.out + bad.err
    rec = [x for x in bad.audit if x["call"] == "cudaMemPrefetchAsync"]
    assert len(rec) == 1 and rec[0]["rule"] == "R2" and "dstDevice=1" in rec[0]["args"], bad.audit

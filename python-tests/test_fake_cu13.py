"""The fake platform's two runtime majors (issue 11, the platform side), without the guard.

The fake libcudart.so.13 is the fake runtime's source compiled against NVIDIA's 13.x
headers, with the `libcudart.so.13` version node; libcudart.so.14 is a stand-in of a major
rankguard does not know. Every runtime call the guard wraps, and every function whose
signature differs between 12.9 and 13.x, records what it received (FAKECUDA_ARGLOG); the
programs print what they passed, and these tests compare the two: the reference the
guarded runs (the guard side of issue 11) are compared with.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

from _arglog import DRIVER_13, DRIVER_14, logged_run, prog, sigdiff_names
from conftest import FAKE, PYTHON, ROOT, clean_env, run

GEN_SIGDIFF = ROOT / "c-tests" / "fake" / "runtime" / "gen_sigdiff.py"
INC12 = ROOT / "c-tests" / "build" / "cuda-include"
INC13 = ROOT / "c-tests" / "build" / "cuda13-include"
# NVIDIA's own runtimes, from the same pinned wheels as the headers.
NVIDIA12 = INC12.resolve().parent / "lib" / "libcudart.so.12"
NVIDIA13 = INC13.resolve().parent / "lib" / "libcudart.so.13"


def exports(lib: pathlib.Path) -> dict[str, str]:
    """{name: version node} of the functions a library defines (`nm -D`)."""
    out = subprocess.run(["nm", "-D", "--defined-only", "--with-symbol-versions", str(lib)],
                         capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TW" and "@" in parts[2]:
            name, _, node = parts[2].partition("@")
            res[name] = node.lstrip("@")
    return res


# ---- the list of differing functions comes from the headers -------------------------

def test_sigdiff_list_is_generated_from_both_headers():
    names = dict(sigdiff_names())
    # Facts of the two pinned headers (issue 11): the signature changes...
    for n in ("cudaMemPrefetchAsync", "cudaMemAdvise", "cudaMemcpyBatchAsync",
              "cudaMemcpy3DBatchAsync", "cudaGraphAddNode", "cudaGraphGetEdges",
              "cudaStreamUpdateCaptureDependencies"):
        assert names.get(n) == "sig", (n, names)
    # ...and the names 12.9 maps to a suffixed symbol while 13 exports the plain one.
    for n in ("cudaGetDeviceProperties", "cudaSignalExternalSemaphoresAsync",
              "cudaWaitExternalSemaphoresAsync"):
        assert names.get(n) == "symbol", (n, names)
    # The built list is what the generator derives from the headers now.
    p = run([sys.executable, GEN_SIGDIFF, INC12 / "cuda_runtime_api.h",
             INC13 / "cuda_runtime_api.h"], check=True)
    assert [tuple(l.split()) for l in p.stdout.splitlines()] == sigdiff_names()


HEADER = """\
#define cudaGetThing cudaGetThing_v2
#define cudaCopyAsync __CUDART_API_PTSZ(cudaCopyAsync)
extern __host__ cudaError_t CUDARTAPI cudaGetThing(struct cudaThing *t, int device);
extern __host__ cudaError_t CUDARTAPI cudaCopyAsync(void *dst, {ARG}, cudaStream_t stream __dv(0));
extern __host__ cudaError_t CUDARTAPI cudaSame(int a, size_t b);
#if defined(__CUDA_API_VERSION_INTERNAL)
extern __host__ cudaError_t CUDARTAPI cudaSame(long a);
#endif
"""


def test_sigdiff_generator_sees_a_changed_parameter_and_a_dropped_suffix(tmp_path):
    old = tmp_path / "old.h"
    new = tmp_path / "new.h"
    old.write_text(HEADER.replace("{ARG}", "int device"))
    new.write_text(HEADER.replace("{ARG}", "struct cudaMemLocation loc")
                   .replace("#define cudaGetThing cudaGetThing_v2\n", ""))
    p = run([sys.executable, GEN_SIGDIFF, old, new], check=True)
    assert p.stdout.splitlines() == ["cudaCopyAsync sig", "cudaGetThing symbol"]
    # The same header twice: nothing differs, which the generator refuses (wrong headers).
    p = run([sys.executable, GEN_SIGDIFF, old, old])
    assert p.returncode != 0 and "no differences" in p.stderr


# ---- exports and version nodes ---------------------------------------------------------

def test_fake_runtimes_export_only_their_majors_functions_under_their_node():
    nv12, nv13 = exports(NVIDIA12), exports(NVIDIA13)
    f12, f13 = exports(FAKE / "libcudart.so.12"), exports(FAKE / "libcudart.so.13")
    f14 = exports(FAKE / "libcudart.so.14")
    assert set(f12.values()) == {"libcudart.so.12"}
    assert set(f13.values()) == {"libcudart.so.13"}
    assert set(f14.values()) == {"libcudart.so.14"}
    # Every export is one NVIDIA's library of that major has.
    assert set(f12) <= set(nv12), sorted(set(f12) - set(nv12))
    assert set(f13) <= set(nv13), sorted(set(f13) - set(nv13))
    assert set(f14) == set(f13)
    # What 13 removed is not exported by the 13 fake (e.g. cudaMemPrefetchAsync_v2,
    # cudaGetDeviceProperties_v2), though the 12 fake has it.
    removed = set(nv12) - set(nv13)
    assert {"cudaMemPrefetchAsync_v2", "cudaGetDeviceProperties_v2"} <= removed & set(f12)
    assert not (removed & set(f13)), sorted(removed & set(f13))
    # Every differing function is exported by the 13 fake under its plain name.
    for name, _ in sigdiff_names():
        assert name in f13, name


def test_cu13_programs_reference_the_13_node():
    from _elf import needed_versions
    assert needed_versions(prog("cu13_calls"))["libcudart.so.13"] == {"libcudart.so.13"}
    assert needed_versions(prog("cu14_calls"))["libcudart.so.14"] == {"libcudart.so.14"}
    assert needed_versions(prog("mixed_main12"))["libcudart.so.12"] == {"libcudart.so.12"}
    assert needed_versions(prog("libmixed13.so"))["libcudart.so.13"] == {"libcudart.so.13"}


# ---- arguments arrive intact (the reference for the guarded runs) -------------------------

def test_cu13_prefetch_device0_host_device1_arrive_intact(tmp_path):
    r = logged_run([prog("cu13_calls"), "prefetch"], tmp_path)
    assert r.rc == 0, r.out + r.err
    assert len(r.expected) == 4
    assert r.logged == r.expected
    assert [c for _, c in r.results] == [0, 0, 0, 0]
    # The location (type 1 device, 2 host) and the caller's stream, not the legacy one.
    assert "location={type=1,id=0}" in r.logged[0] and "location={type=2,id=0}" in r.logged[1]
    assert "location={type=1,id=1}" in r.logged[2]
    assert all("stream=(nil)" not in l for l in r.logged)


def test_cu13_every_differing_function_arrives_intact(tmp_path):
    r = logged_run([prog("cu13_calls"), "all"], tmp_path)
    assert r.rc == 0, r.out + r.err
    assert r.logged == r.expected
    called = {l.split()[1] for l in r.logged}
    missing = {n for n, _ in sigdiff_names()} - called
    assert not missing, f"cu13_calls does not call {sorted(missing)}: add them"
    codes = dict(r.results)
    # Implemented: prefetch, properties, cudaSetDevice, advice, batch copies (their arguments
    # here are not valid copies), the graph node (the fake driver has no graphs: 801).
    assert codes["cudaMemPrefetchAsync"] == 0 and codes["cudaGetDeviceProperties"] == 0
    assert codes["cudaMemAdvise"] == 0 and codes["cudaGraphAddNode"] == 801
    assert codes["cudaMemcpyBatchAsync"] == codes["cudaMemcpy3DBatchAsync"] == 1   # invalid value


def test_cu13_get_device_properties_of_device_1(tmp_path):
    r = logged_run([prog("cu13_calls"), "props"], tmp_path)
    assert r.rc == 0, r.out + r.err
    assert r.logged == r.expected
    assert r.logged[0].endswith(" device=1")
    assert r.results == [("cudaGetDeviceProperties", 0)] * 2
    assert "props 1 name=NVIDIA" in r.out


def test_cu13_runtime_needs_a_13_driver(tmp_path):
    r = logged_run([prog("cu13_calls"), "basic"], tmp_path, driver=None)
    assert "runtime 0 13050" in r.out, r.out
    assert r.results == [("cudaSetDevice", 35)]         # cudaErrorInsufficientDriver
    r = logged_run([prog("cu13_calls"), "basic"], tmp_path)
    assert r.results == [("cudaSetDevice", 0)], r.out + r.err
    assert r.logged == r.expected == ["libcudart.so.13 cudaSetDevice device=1"]


@pytest.mark.parametrize("main,lib", [("mixed_main12", "libmixed13.so"),
                                      ("mixed_main13", "libmixed12.so")])
def test_mixed_majors_each_caller_reaches_its_own_runtime(tmp_path, main, lib):
    r = logged_run([prog(main), prog(lib)], tmp_path)
    assert r.rc == 0, r.out + r.err
    assert r.logged == r.expected
    own, other = main[-2:], lib[-5:-3]
    calls = ["cudaSetDevice", "cudaIpcGetMemHandle", "cudaIpcOpenMemHandle",
             "cudaGetDriverEntryPoint"]
    assert [l.split()[:2] for l in r.logged] == (
        [[f"libcudart.so.{own}", c] for c in calls] + [[f"libcudart.so.{other}", c] for c in calls])
    assert f"libcudart.so.{own} cudaSetDevice device=0" in r.logged
    assert f"libcudart.so.{other} cudaSetDevice device=1" in r.logged
    assert "entry cuInit found=1 status=0" in r.out and "entry cuDeviceGet found=1 status=0" in r.out


def test_stand_in_runtime_14(tmp_path):
    r = logged_run([prog("cu14_calls"), "basic"], tmp_path, driver=DRIVER_14)
    assert "runtime 0 14000" in r.out, r.out
    r2 = logged_run([prog("cu14_calls"), "prefetch"], tmp_path, driver=DRIVER_14)
    for x in (r, r2):
        assert x.rc == 0, x.out + x.err
        assert x.logged == x.expected
        assert all(l.startswith("libcudart.so.14 ") for l in x.logged)
        assert all(c == 0 for _, c in x.results)


def test_arglog_is_off_by_default_and_a_bad_path_stops_the_program(tmp_path):
    p = run([prog("cu13_calls"), "basic"], env=clean_env(FAKECUDA_GPUS="2",
            FAKECUDA_DRIVER_VERSION=DRIVER_13, FAKECUDA_ARGLOG=None))
    assert p.returncode == 0 and "rc cudaSetDevice 0" in p.stdout
    bad = tmp_path / "missing-dir" / "log"
    p = run([prog("cu13_calls"), "basic"], env=clean_env(FAKECUDA_GPUS="2",
            FAKECUDA_DRIVER_VERSION=DRIVER_13, FAKECUDA_ARGLOG=str(bad)))
    assert p.returncode != 0
    assert f"FAKECUDA_ARGLOG={bad}: cannot open" in p.stderr


# ---- the fake driver: 13.x routes and version ----------------------------------------

DRIVER_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    cu = ctypes.CDLL("libcuda.so.1")
    v = ctypes.c_int()
    print("version", cu.cuDriverGetVersion(ctypes.byref(v)), v.value)
    assert cu.cuInit(0) == 0
    gpa = cu.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    def lookup(name, ver):
        fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
        r = gpa(name.encode(), ctypes.byref(fn), ver, 0, ctypes.byref(st))
        return r, st.value, fn.value
    def addr(sym):
        return ctypes.cast(getattr(cu, sym), ctypes.c_void_p).value
    for name, ver, sym in [("cuCtxSynchronize", 12090, "cuCtxSynchronize"),
                           ("cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"),
                           ("cuCtxGetDevice", 13050, "cuCtxGetDevice_v2"),
                           ("cuCtxCreate", 13050, "cuCtxCreate_v4"),
                           ("cuMemGetMemPool", 13050, "cuMemGetMemPool"),
                           ("cuMemPrefetchBatchAsync", 13050, "cuMemPrefetchBatchAsync"),
                           ("cuStreamGetDevResource", 13050, "cuStreamGetDevResource")]:
        r, st, fn = lookup(name, ver)
        print("route", name, ver, r, st, fn == addr(sym))
    print("too-old", *lookup("cuMemGetMemPool", 12090)[:2])
    # cuStreamGetDevResource: a 13.1 entry point the fake does not implement.
    print("stub", cu.cuStreamGetDevResource(None, None, 0))
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 1) == 0
    print("sync_v2", cu.cuCtxSynchronize_v2(ctx), cu.cuCtxSynchronize_v2(None))
    print("getdev_v2", cu.cuCtxGetDevice_v2(ctypes.byref(dev), ctx), dev.value)
    class Loc(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
    pool, dpool = ctypes.c_void_p(), ctypes.c_void_p()
    loc = Loc(1, 1)                        # CU_MEM_LOCATION_TYPE_DEVICE, device 1
    print("getpool", cu.cuMemGetMemPool(ctypes.byref(pool), ctypes.byref(loc), 1),
          cu.cuDeviceGetMemPool(ctypes.byref(dpool), 1), pool.value == dpool.value)
    host = Loc(2, 0)
    print("hostpool", cu.cuMemGetMemPool(ctypes.byref(pool), ctypes.byref(host), 1))
""")


def test_fake_driver_routes_13_requests_and_reports_the_asked_version():
    p = run([PYTHON, "-c", DRIVER_SCRIPT],
            env=clean_env(FAKECUDA_GPUS="2", FAKECUDA_DRIVER_VERSION=DRIVER_13))
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.splitlines()
    assert "version 0 13050" in out
    routes = [l for l in out if l.startswith("route ")]
    assert len(routes) == 7 and all(l.endswith(" 0 0 True") for l in routes), routes
    assert "too-old 0 2" in out                  # CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
    assert "stub 801" in out                     # CUDA_ERROR_NOT_SUPPORTED
    # NULL: the current context, and there is none on this thread.
    assert "sync_v2 0 201" in out and "getdev_v2 0 1" in out
    assert "getpool 0 0 True" in out and "hostpool 801" in out


def test_fake_driver_version_default_and_bad_value():
    p = run([PYTHON, "-c", DRIVER_SCRIPT.split("assert cu.cuInit")[0]], env=clean_env())
    assert "version 0 12090" in p.stdout, p.stdout + p.stderr
    p = run([PYTHON, "-c", DRIVER_SCRIPT], env=clean_env(FAKECUDA_DRIVER_VERSION="13.5"))
    assert p.returncode != 0
    assert "FAKECUDA_DRIVER_VERSION=13.5 is not a CUDA version" in p.stderr

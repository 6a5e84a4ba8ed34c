"""The fake CUDA runtime (c-tests/build/fakecuda/libcudart.so.12) against the fake driver.

Why: rankguard's runtime-level guarantees are tested on this runtime, so it must behave
like NVIDIA's where rankguard looks: how it reaches the driver (dlopen + one dlsym +
cuGetProcAddress_v2 with explicit versions, flags 2 for per-thread entry points), its
versioned exports, its error codes, and IPC/peer traffic byte for byte. The C programs in
c-tests/tests/fake_rt_*.c check themselves; these tests run them in scrubbed environments
and check what only the outside can see (symbols, the dlsym/cuGetProcAddress log).
"""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import textwrap

import pytest

from conftest import FAKE, PYTHON, ROOT, TESTS, clean_env, run

RUNTIME = FAKE / "libcudart.so.12"
COUNTER = TESTS / "fake_rt_dlsym_counter.so"
REAL_RUNTIME = next(iter(sorted(
    (ROOT / ".venv").glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"))),
    None)

# Entry points the runtime fetches with flags 2 (behind its `_ptds`/`_ptsz` exports), at
# the version their per-thread variant appeared in (cudaTypedefs.h PFN_*_v<version>_pt*).
PER_THREAD = {("cuMemcpy", 7000), ("cuMemcpyHtoD", 7000), ("cuMemcpyDtoH", 7000),
              ("cuMemcpyDtoD", 7000), ("cuMemsetD8", 7000), ("cuMemcpyPeer", 7000),
              ("cuMemcpyPeerAsync", 7000), ("cuEventRecord", 7000), ("cuStreamSynchronize", 7000),
              ("cuMemPrefetchAsync", 8000), ("cuMemPrefetchAsync", 12020)}


def program(name: str) -> pathlib.Path:
    path = TESTS / name
    assert path.exists(), f"{path} is missing: build the C tests with `make -C c-tests`"
    return path


def run_c(name: str, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
    p = run([program(name), *args], env=env if env is not None else clean_env(), timeout=timeout)
    assert p.returncode == 0, f"{name} {' '.join(map(str, args))} exited {p.returncode}\n" \
                              f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "all checks passed" in p.stdout, p.stdout
    return p


def dyn_symbols(path: pathlib.Path) -> list[tuple[str, str, str]]:
    """(name@version, type, ndx) of every dynamic symbol, from readelf."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True,
                         text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0].endswith(":") and f[0][:-1].isdigit():
            rows.append((f[7], f[3], f[6]))
    return rows


def exported(path: pathlib.Path) -> dict[str, str]:
    """Defined FUNC exports: base name -> version suffix as readelf prints it."""
    out = {}
    for name, typ, ndx in dyn_symbols(path):
        if typ == "FUNC" and ndx != "UND":
            base, _, ver = name.partition("@")
            out[base] = "@" + ver if ver else ""
    return out


def probe_log(tmp_path, name, *args, env_extra=None):
    """Run a program under the dlsym/cuGetProcAddress probe; return its log lines."""
    log = tmp_path / f"{name}.log"
    env = clean_env(LD_PRELOAD=str(COUNTER), FAKE_RT_DLSYM_LOG=str(log), **(env_extra or {}))
    assert COUNTER.exists(), f"{COUNTER} is missing: `make -C c-tests`"
    run_c(name, *args, env=env)
    return [line.split("\t") for line in log.read_text().splitlines()]


# ---- the library itself ---------------------------------------------------------------

def test_exports_carry_the_libcudart_version_node():
    syms = exported(RUNTIME)
    # The runtime API and the compiler-facing registration and launch calls
    # (__cudaRegisterFatBinary, ...), which NVIDIA's library exports too.
    cuda = {k: v for k, v in syms.items() if k.startswith(("cuda", "__cuda"))}
    required = """cudaGetDeviceCount cudaSetDevice cudaGetDevice cudaInitDevice
        cudaDeviceSynchronize cudaDeviceReset cudaDriverGetVersion cudaRuntimeGetVersion
        cudaGetLastError cudaPeekAtLastError cudaGetErrorString cudaGetErrorName cudaMalloc
        cudaFree cudaMemcpy cudaMemset cudaPointerGetAttributes cudaDeviceGetAttribute
        cudaDeviceGetPCIBusId cudaIpcGetMemHandle cudaIpcOpenMemHandle cudaIpcCloseMemHandle
        cudaEventCreate cudaEventCreateWithFlags cudaEventRecord cudaEventSynchronize
        cudaEventQuery cudaEventDestroy cudaIpcGetEventHandle cudaIpcOpenEventHandle
        cudaStreamCreate cudaStreamSynchronize cudaStreamDestroy cudaDeviceCanAccessPeer
        cudaDeviceEnablePeerAccess cudaDeviceDisablePeerAccess cudaMemcpyPeer
        cudaMemcpyPeerAsync cudaGetDriverEntryPoint cudaGetDriverEntryPoint_ptsz
        cudaGetDriverEntryPointByVersion cudaGetDriverEntryPointByVersion_ptsz
        cudaMemcpy_ptds cudaMemset_ptds cudaEventRecord_ptsz cudaStreamSynchronize_ptsz
        cudaGetDeviceProperties_v2 cudaMallocManaged cudaMemPrefetchAsync
        cudaMemPrefetchAsync_ptsz cudaMemPrefetchAsync_v2 cudaMemPrefetchAsync_v2_ptsz
        cudaMemGetInfo""".split()
    missing = [n for n in required if n not in cuda]
    assert not missing, f"libcudart.so.12 lacks {missing}"
    unversioned = [n for n, v in cuda.items() if v != "@@libcudart.so.12"]
    assert not unversioned, f"exports without the libcudart.so.12 version node: {unversioned}"
    others = sorted(set(syms) - set(cuda))
    assert not others, f"libcudart.so.12 exports non-runtime functions: {others}"


def test_exports_match_nvidias_names():
    """Every name we export, NVIDIA's libcudart.so.12 (pinned wheel) exports too; in
    particular no cudaMemcpyPeer_ptds / cudaMemcpyPeerAsync_ptsz, which neither the real
    library nor cuda_runtime_api.h's __CUDART_API_PTDS/PTSZ macros have."""
    assert REAL_RUNTIME is not None, "NVIDIA's libcudart.so.12 missing from .venv: run scripts/setup"
    real = exported(REAL_RUNTIME)
    ours = exported(RUNTIME)
    assert not sorted(set(ours) - set(real)), sorted(set(ours) - set(real))
    assert all(real[n] == "@@libcudart.so.12" for n in ours)
    assert "cudaMemcpyPeerAsync_ptsz" not in real and "cudaMemcpyPeerAsync_ptsz" not in ours


ERROR_TABLE = textwrap.dedent("""
    import ctypes, json, sys
    rt = ctypes.CDLL(sys.argv[1])
    rt.cudaGetErrorName.restype = ctypes.c_char_p
    rt.cudaGetErrorString.restype = ctypes.c_char_p
    codes = list(range(0, 1100)) + [10000, 123456]
    print(json.dumps({c: [rt.cudaGetErrorName(c).decode(), rt.cudaGetErrorString(c).decode()]
                      for c in codes}))
""")


def test_error_names_and_strings_are_nvidias():
    """cudaGetErrorName agrees with NVIDIA's libcudart.so.12 on every code; every string
    cudaGetErrorString returns is NVIDIA's, except the documented fallback (the name) for
    codes this platform never produces."""
    assert REAL_RUNTIME is not None, "NVIDIA's libcudart.so.12 missing from .venv: run scripts/setup"
    tables = []
    for lib in (RUNTIME, REAL_RUNTIME):
        p = run([PYTHON, "-c", ERROR_TABLE, lib], env=clean_env(LD_LIBRARY_PATH=None))
        assert p.returncode == 0, p.stderr
        tables.append(json.loads(p.stdout))
    ours, real = tables
    assert {c: v[0] for c, v in ours.items()} == {c: v[0] for c, v in real.items()}
    own_strings = {c: v[1] for c, v in ours.items() if v[1] != v[0]}
    assert len(own_strings) >= 30
    assert own_strings == {c: real[c][1] for c in own_strings}


def test_soname_and_no_driver_link():
    out = subprocess.run(["readelf", "-d", str(RUNTIME)], capture_output=True, text=True,
                         check=True).stdout
    assert "Library soname: [libcudart.so.12]" in out
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    assert not [n for n in needed if n.startswith("libcuda.")], \
        f"libcudart.so.12 must dlopen libcuda.so.1, not link it: NEEDED {needed}"
    assert (FAKE / "libcudart.so").resolve() == RUNTIME.resolve()


# ---- how it reaches the driver --------------------------------------------------------

def test_one_dlsym_then_cugetprocaddress_with_explicit_versions(tmp_path):
    lines = probe_log(tmp_path, "fake_rt_memory")
    dlsyms = [l[2] for l in lines if l[0] == "dlsym" and l[1] == "libcudart.so.12"]
    assert dlsyms == ["cuGetProcAddress_v2"], f"runtime dlsym calls: {dlsyms}"
    gpa = [(l[2], int(l[3]), int(l[4])) for l in lines if l[0] == "gpa" and l[1] == "libcudart.so.12"]
    assert len(gpa) >= 30, gpa
    assert all(v >= 2000 for _, v, _ in gpa), [g for g in gpa if g[1] < 2000]
    assert all(f in (1, 2) for _, _, f in gpa), [g for g in gpa if g[2] not in (1, 2)]
    per_thread = {(n, v) for n, v, f in gpa if f == 2}
    assert per_thread == PER_THREAD
    assert {n for n, v, f in gpa if f == 1} >= {n for n, _ in PER_THREAD}  # legacy twins
    # The ABI versions the runtime was written for (cudaTypedefs.h PFN_*_v<version>).
    for want in [("cuInit", 2000, 1), ("cuMemAlloc", 3020, 1), ("cuMemFree", 3020, 1),
                 ("cuCtxSetCurrent", 4000, 1), ("cuDevicePrimaryCtxRetain", 7000, 1),
                 ("cuDevicePrimaryCtxRelease", 11000, 1), ("cuIpcOpenMemHandle", 11000, 1),
                 ("cuMemcpyHtoD", 3020, 1), ("cuMemcpy", 4000, 1), ("cuEventDestroy", 4000, 1),
                 ("cuStreamDestroy", 4000, 1), ("cuDeviceGetPCIBusId", 4010, 1),
                 ("cuDeviceGetUuid", 11040, 1), ("cuMemPrefetchAsync", 8000, 1),
                 ("cuMemPrefetchAsync", 12020, 1), ("cuMemGetInfo", 3020, 1)]:
        assert want in gpa, f"{want} not requested; got {sorted(set(gpa))}"
    assert len(set(gpa)) == len(gpa), "an entry point was fetched twice"


def test_every_requested_entry_point_exists_in_the_driver(tmp_path):
    """The runtime leaves an entry point it cannot get NULL (and fails the call that needs
    it with cudaErrorCallRequiresNewerDriver): every one it asks for must resolve."""
    lines = probe_log(tmp_path, "fake_rt_memory")
    gpa = sorted({(l[2], int(l[3]), int(l[4])) for l in lines
                  if l[0] == "gpa" and l[1] == "libcudart.so.12"})
    script = textwrap.dedent(f"""
        from cuda.bindings import driver as d
        bad = []
        for name, ver, flags in {gpa!r}:
            err, pfn, status = d.cuGetProcAddress(name.encode(), ver, flags)
            if err != d.CUresult.CUDA_SUCCESS or not pfn or status != 0:
                bad.append((name, ver, flags, int(err), int(status)))
        print(bad)
    """)
    p = run([PYTHON, "-c", script], timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", f"not found in the driver: {p.stdout}"


def test_concurrent_first_calls_init_once(tmp_path):
    lines = probe_log(tmp_path, "fake_rt_threads", "8")
    dlsyms = [l[2] for l in lines if l[0] == "dlsym" and l[1] == "libcudart.so.12"]
    assert dlsyms == ["cuGetProcAddress_v2"]
    gpa = [(l[2], l[3], l[4]) for l in lines if l[0] == "gpa" and l[1] == "libcudart.so.12"]
    assert len(set(gpa)) == len(gpa), "lazy init ran more than once"


def test_entry_points_go_through_the_held_cugetprocaddress(tmp_path):
    """cudaGetDriverEntryPoint(ByVersion) forward to the cuGetProcAddress_v2 pointer the
    runtime got from its dlsym (here the probe's wrapper, as a guard's would be), with the
    runtime's version (12090) or the caller's, and flags 1 or 2."""
    lines = probe_log(tmp_path, "fake_rt_entry")
    gpa = [(l[2], int(l[3]), int(l[4])) for l in lines if l[0] == "gpa" and l[1] == "libcudart.so.12"]
    for want in [("cuMemAlloc", 12090, 1), ("cuCtxCreate", 12090, 1), ("cuCtxCreate", 3020, 1),
                 ("cuCtxCreate", 11040, 1), ("cuMemcpy", 12090, 2), ("cuMemcpyHtoD", 12000, 2),
                 ("cuStreamSynchronize", 12090, 2), ("cuNoSuchFunction", 12090, 1),
                 ("cuGetProcAddress", 11000, 1)]:
        assert want in gpa, f"{want} did not reach the held cuGetProcAddress_v2"
    dlsyms = [l[2] for l in lines if l[0] == "dlsym" and l[1] == "libcudart.so.12"]
    assert dlsyms == ["cuGetProcAddress_v2"]


# ---- runtime semantics (self-checking C programs) ------------------------------------

@pytest.mark.parametrize("gpus", ["8", "4", "2"])
def test_basic(gpus):
    run_c("fake_rt_basic", gpus, env=clean_env(FAKECUDA_GPUS=gpus))


def test_memory():
    run_c("fake_rt_memory")


def test_peer_access_and_peer_copies():
    run_c("fake_rt_peer")


def test_driver_entry_points():
    run_c("fake_rt_entry")


def test_calls_that_reach_another_device():
    """Pools and PyTorch's allocator pattern, 3D peer copies, external memory,
    cudaSetValidDevices, cudaChooseDevice, P2P attributes, the multi-device cooperative
    launch (issue 15's ranked list, unguarded)."""
    run_c("fake_rt_reach", env=clean_env(FAKECUDA_GPUS="4"))


def test_graph_memory_texture_width_and_graph_node_calls():
    """cudart_reach_more.c: graph memory, the 1D texture width's channel formats
    (RT-texfmt), NvSciSync attributes and the generic graph-node calls (RT-graphnode),
    with device 0 and device 1 (issue 18's last path tests, unguarded)."""
    run_c("fake_rt_devstate", env=clean_env(FAKECUDA_GPUS="4"))


def test_threads_keep_their_own_device():
    run_c("fake_rt_threads", "4", env=clean_env(FAKECUDA_GPUS="4"))


def test_per_thread_default_stream_program():
    p = program("fake_rt_ptds")
    imports = {n for n, typ, ndx in dyn_symbols(p) if ndx == "UND"}
    for name in ["cudaMemcpy_ptds", "cudaMemset_ptds", "cudaEventRecord_ptsz",
                 "cudaStreamSynchronize_ptsz", "cudaGetDriverEntryPoint_ptsz",
                 "cudaMemPrefetchAsync_ptsz", "cudaMemPrefetchAsync_v2_ptsz",
                 "cudaGetDriverEntryPointByVersion_ptsz"]:
        assert f"{name}@libcudart.so.12" in imports, f"fake_rt_ptds does not import {name}"
    run_c("fake_rt_ptds")


# ---- visibility and init failures (ctypes against the library) ------------------------

CTYPES_PROBE = textwrap.dedent("""
    import ctypes, sys
    rt = ctypes.CDLL(sys.argv[1])
    n = ctypes.c_int(-1); v = ctypes.c_int(-1)
    e = rt.cudaGetDeviceCount(ctypes.byref(n))
    d = rt.cudaDriverGetVersion(ctypes.byref(v))
    bus = ctypes.create_string_buffer(32)
    b = rt.cudaDeviceGetPCIBusId(bus, 32, 0)
    rt.cudaGetErrorName.restype = ctypes.c_char_p
    s0, s1 = rt.cudaSetDevice(0), rt.cudaSetDevice(1)
    print(e, n.value, d, v.value, b, bus.value.decode().lower() or "-", rt.cudaGetErrorName(e).decode(),
          s0, s1)
""")


def ctypes_probe(env):
    p = run([PYTHON, "-c", CTYPES_PROBE, RUNTIME], env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_visible_devices_follow_the_driver():
    """Under CUDA_VISIBLE_DEVICES=3 the runtime has one device, ordinal 0 = GPU 3; ordinal
    1 is cudaErrorInvalidDevice (101), the code rankguard mirrors."""
    e, n, d, v, b, bus, _, s0, s1 = ctypes_probe(clean_env(CUDA_VISIBLE_DEVICES="3"))
    assert (e, n, b, bus, s0, s1) == ("0", "1", "0", "0000:48:00.0", "0", "101")


def test_no_visible_device_is_cuda_error_no_device():
    e, n, d, v, b, bus, name, s0, s1 = ctypes_probe(clean_env(CUDA_VISIBLE_DEVICES=""))
    assert (e, n, name, s0, s1) == ("100", "0", "cudaErrorNoDevice", "100", "100")
    assert b == "100"
    assert d == "0" and int(v) >= 12000  # the driver version needs no device


def test_without_a_driver(tmp_path):
    """No libcuda.so.1 on the search path: cudaErrorInsufficientDriver (35), as NVIDIA's
    runtime reports it, and cudaDriverGetVersion gives 0 ("no driver installed")."""
    lonely = tmp_path / "libcudart.so.12"
    lonely.write_bytes(RUNTIME.read_bytes())
    env = clean_env(LD_LIBRARY_PATH=str(tmp_path))
    p = run([PYTHON, "-c", CTYPES_PROBE, lonely], env=env)
    assert p.returncode == 0, p.stderr
    e, n, d, v, b, bus, name, s0, s1 = p.stdout.split()
    assert (e, n, d, v, name, s0) == ("35", "0", "0", "0", "cudaErrorInsufficientDriver", "35")


# ---- cross-process IPC ---------------------------------------------------------------

def ipc_round_trip(export_dev, import_dev, nbytes, export_env=None, import_env=None):
    exporter = subprocess.Popen([str(program("fake_rt_ipc")), "export", str(export_dev), str(nbytes)],
                                env=export_env or clean_env(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        handles, seen = {}, []
        while len(handles) < 2:
            line = exporter.stdout.readline()
            assert line, f"exporter ended early:\n{''.join(seen)}\n{exporter.stderr.read()}"
            seen.append(line)
            kind, _, rest = line.partition(" ")
            if kind in ("MEM", "EVT"):
                handles[kind] = rest.strip()
        imp = run([program("fake_rt_ipc"), "import", import_dev, nbytes, handles["MEM"],
                   handles["EVT"]], env=import_env or clean_env())
        out, err = exporter.communicate("go\n", timeout=60)
    finally:
        if exporter.poll() is None:
            exporter.kill()
    assert imp.returncode == 0, f"importer:\n{imp.stdout}\n{imp.stderr}"
    assert "all checks passed" in imp.stdout
    assert exporter.returncode == 0, f"exporter:\n{''.join(seen)}{out}\n{err}"
    assert "all checks passed" in out


@pytest.mark.parametrize("export_dev,import_dev", [(0, 0), (0, 1), (5, 2)])
def test_ipc_memory_and_event_across_processes(export_dev, import_dev):
    ipc_round_trip(export_dev, import_dev, 1 << 16)


def test_ipc_import_of_a_device_the_importer_cannot_see():
    """"cudaIpcOpenMemHandle can open handles to devices that may not be visible in the
    process calling the API": exporter on GPU 0, importer sees only GPU 6 (its device 0)."""
    ipc_round_trip(0, 0, 4096, import_env=clean_env(CUDA_VISIBLE_DEVICES="6"))

"""The guard's dlsym fast reject (issue 17): names that start like CUDA's but cannot be
guarded (libcurl's `curl_*`, cuDNN's `cudnn*`, cuBLAS's `cublas*`, ...) are forwarded to
the real dlsym in a few byte compares, and must resolve exactly as without the guard:
RTLD_NEXT, a library handle and RTLD_DEFAULT. Guarded names still get the wrappers.
(That the rejected names never enter the guard's Rust code is tested by the unit tests in
src/guard/8_hooks/dlsym.rs; the instructions they cost by test_dlsym_trampoline_path.py, and by
callgrind in figure 2 of scripts/bench.)"""
from __future__ import annotations

from _guard import guarded, prog

NAMES = ["plain_probe", "c", "cu", "cud", "cuda", "curl_easy_init", "cublasCreate_v2",
         "cufftPlan1d", "cudnnCreate", "cuda_probe", "cudaz", "cuProbeNotGuarded",
         "cudaProbeNotGuarded"]


def lines(r) -> dict[str, str]:
    assert r.rc == 0, r.out + r.err
    out = {}
    for line in r.out.splitlines():
        key, _, rest = line.partition(" ")
        if key == "guarded":
            key, _, rest = rest.partition(" ")
            key = "guarded " + key
        out[key] = rest
    return out


def test_non_guarded_cu_names_resolve_as_without_the_guard(tmp_path):
    plain = lines(guarded([prog("guard_dlsym_names")], tmp_path, cvd="0", preload=False))
    guard = lines(guarded([prog("guard_dlsym_names")], tmp_path, cvd="0"))
    for name in NAMES:
        assert plain[name] == "next=B handle=B default=A", (name, plain[name])
        assert guard[name] == plain[name], (name, guard[name])


def test_guarded_names_still_get_the_wrappers(tmp_path):
    plain = lines(guarded([prog("guard_dlsym_names")], tmp_path, cvd="0", preload=False))
    guard = lines(guarded([prog("guard_dlsym_names")], tmp_path, cvd="0"))
    assert plain["guarded cuDeviceGet"] == "from=libcuda.so.1"
    assert plain["guarded cudaSetDevice"] == "from=libcudart.so.12"
    assert guard["guarded cuDeviceGet"] == "from=librankguard.so"
    assert guard["guarded cudaSetDevice"] == "from=librankguard.so"

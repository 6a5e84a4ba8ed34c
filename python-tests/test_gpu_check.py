"""scripts/gpu-check off a GPU: the distinct no-GPU status, and its runner on the fake node.

Why: gpu-check is meant to be tried anywhere, so its no-GPU answer (exit 3) is part of its
contract, and the fake platform (a libcuda.so.1 on LD_LIBRARY_PATH, an nvidia-smi look-
alike) must never pass for a real GPU. Its checks proper need a real GPU and frameworks;
here the runner is driven through its testing hook (--proc-gpus) on the fake node, where
cuda-bindings is installed: skips, a pass, and a check failing without the guard.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import pathlib
import re

import pytest

from _arglog import DRIVER_13
from conftest import FAKE, GUARD, PYTHON, ROOT, TESTS, clean_env, run

GPU_CHECK = ROOT / "scripts" / "gpu-check"
EXIT_NO_GPU = 3

real_gpu = pytest.mark.skipif(
    any(pathlib.Path("/proc/driver/nvidia/gpus").glob("*")),
    reason="this machine has a real NVIDIA GPU: the no-GPU path cannot be observed here")


def load_gpu_check():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(GPU_CHECK))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@real_gpu
def test_no_gpu_is_reported_with_its_own_status(tmp_path):
    # The fake driver is on LD_LIBRARY_PATH (clean_env puts it there): still no GPU.
    p = run([PYTHON, GPU_CHECK, tmp_path / "out"], env=clean_env(FAKECUDA_GPUS="2"))
    assert p.returncode == EXIT_NO_GPU, p.stdout + p.stderr
    assert "no NVIDIA GPU found" in p.stdout
    j = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert j["status"] == "no-gpu" and j["exit"] == EXIT_NO_GPU
    assert not (tmp_path / "out" / "logs").exists(), "nothing may run without a GPU"


@real_gpu
def test_an_nvidia_smi_look_alike_is_not_a_gpu(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(FAKE / "fakecuda-smi")
    env = clean_env(FAKECUDA_GPUS="2")
    env["PATH"] = f"{bindir}:{env['PATH']}"
    assert "GPU 0:" in run(["nvidia-smi", "-L"], env=env, check=True).stdout
    p = run([PYTHON, GPU_CHECK, tmp_path / "out"], env=env)
    assert p.returncode == EXIT_NO_GPU, p.stdout + p.stderr


def test_a_missing_output_folder_parent_is_a_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = run([PYTHON, GPU_CHECK, blocker / "out"])
    assert p.returncode == 2, p.stdout + p.stderr
    assert "cannot create the output folder" in p.stderr


def fake_gpu_run(tmp_path, *extra, **env):
    """gpu-check on the fake node. Its CUDA runtime checks get the fake runtimes (the real
    libcudart cannot initialise on the fake driver), which need a 13.x driver, and log every
    argument they receive to tmp_path/arglog.txt."""
    proc = tmp_path / "proc-gpus"
    (proc / "0000:18:00.0").mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    env = dict(dict(FAKECUDA_GPUS="2", FAKECUDA_DRIVER_VERSION=DRIVER_13,
                    FAKECUDA_ARGLOG=str(tmp_path / "arglog.txt"),
                    GPU_CHECK_CUDART12=str(FAKE / "libcudart.so.12"),
                    GPU_CHECK_CUDART13=str(FAKE / "libcudart.so.13")), **env)
    p = run([PYTHON, GPU_CHECK, out, "--proc-gpus", proc, "--python", PYTHON, *extra],
            env=clean_env(**env), timeout=300)
    report = json.loads((out / "gpu-check.json").read_text())
    return p, report, {c["name"]: c for c in report["checks"]}


def test_checks_on_the_fake_node_pass_or_skip(tmp_path):
    p, report, checks = fake_gpu_run(tmp_path, "--guard", GUARD)
    assert p.returncode == 0, p.stdout + p.stderr
    assert report["status"] == "passed"
    # cuda-bindings runs fully on the fake driver (docs/design.md §5): a real pass, with the
    # guard's own line for the refused cuDeviceGet(1).
    assert checks["cuda_bindings"]["status"] == "pass", checks["cuda_bindings"]
    assert "RANKGUARD" in checks["cuda_bindings"]["guard_line"]
    assert "cuDeviceGet" in checks["cuda_bindings"]["guard_line"]
    # Every check is listed, each passed or skipped with a reason naming its framework.
    assert set(checks) == set(load_gpu_check().NEEDS)
    for name, c in checks.items():
        assert c["status"] in ("pass", "skip"), c
        if c["status"] == "skip":
            assert c["detail"].split(":")[0] in ("torch", "cupy", "jax"), c
    assert "check" in (tmp_path / "out" / "gpu-check.txt").read_text()
    # The CUDA 13 prefetch and the two majors in one process run fully on the fake runtimes.
    for name in ("cu13_prefetch", "mixed_majors"):
        assert checks[name]["status"] == "pass", checks[name]
        assert "RANKGUARD" in checks[name]["guard_line"], checks[name]
    assert "cudaMemPrefetchAsync" in checks["cu13_prefetch"]["guard_line"]
    # What the runtimes received (FAKECUDA_ARGLOG): the cu13 check's prefetches to device 0
    # and the host, with CUDA 13's location and the created stream; the mixed check's of
    # each major with that major's parameters, each in its own runtime; device 1 never.
    log = (tmp_path / "arglog.txt").read_text().splitlines()
    prefetch = [l for l in log if " cudaMemPrefetchAsync " in l]
    shapes = [re.sub(r"devPtr=0x[0-9a-f]+", "devPtr=_", re.sub(r"stream=0x[0-9a-f]+", "stream=S", l))
              for l in prefetch]
    assert shapes == [
        "libcudart.so.13 cudaMemPrefetchAsync devPtr=_ count=4096 location={type=1,id=0} flags=0 stream=S",
        "libcudart.so.13 cudaMemPrefetchAsync devPtr=_ count=4096 location={type=2,id=0} flags=0 stream=S",
        "libcudart.so.12 cudaMemPrefetchAsync devPtr=_ count=4096 dstDevice=0 stream=S",
        "libcudart.so.12 cudaMemPrefetchAsync devPtr=_ count=4096 dstDevice=-1 stream=S",
        "libcudart.so.13 cudaMemPrefetchAsync devPtr=_ count=4096 location={type=1,id=0} flags=0 stream=S",
        "libcudart.so.13 cudaMemPrefetchAsync devPtr=_ count=4096 location={type=2,id=0} flags=0 stream=S",
    ], prefetch
    assert [l.split()[0] for l in log if " cudaSetDevice " in l] == ["libcudart.so.12", "libcudart.so.13"]


def test_a_missing_runtime_major_is_skipped_with_its_line(tmp_path):
    p, _, checks = fake_gpu_run(tmp_path, "--guard", GUARD, GPU_CHECK_CUDART12=str(tmp_path / "none.so"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert checks["cu13_prefetch"]["status"] == "pass", checks["cu13_prefetch"]
    c = checks["mixed_majors"]
    assert c["status"] == "skip" and c["detail"].startswith("cudart12+13: no CUDA 12 runtime"), c
    assert "nvidia-cuda-runtime-cu12" in c["detail"] and "GPU_CHECK_CUDART12" in c["detail"], c


def test_a_refusal_without_the_guards_line_fails(tmp_path):
    # Another preload instead of the guard: the fake driver still answers 101 for
    # cuDeviceGet(1), but nothing says RANKGUARD, so the check must fail.
    p, report, checks = fake_gpu_run(tmp_path, "--guard", TESTS / "libnext_a.so")
    assert p.returncode == 1, p.stdout + p.stderr
    assert report["status"] == "failed"
    assert checks["cuda_bindings"]["status"] == "fail"
    assert "not by the guard" in checks["cuda_bindings"]["detail"]
    # The runtime checks too: the fake runtimes refuse device 1 themselves (one visible).
    for name in ("cu13_prefetch", "mixed_majors"):
        assert checks[name]["status"] == "fail", checks[name]
        assert "not by the guard" in checks[name]["detail"], checks[name]


def test_every_check_script_compiles():
    mod = load_gpu_check()
    for name, body in mod.CHECKS.items():
        compile(mod.PRELUDE + body, f"gpu-check:{name}", "exec")
    compile(mod.PROBE, "gpu-check:probe", "exec")
    assert set(mod.CHECKS) == set(mod.NEEDS)


# A stand-in for PyTorch on the fake node: torch.cuda.set_device(n) is the runtime's
# cudaSetDevice(n), as in PyTorch (c10::cuda::set_device), through the fake libcudart.
STUB_TORCH = '''
import ctypes
_rt = ctypes.CDLL("libcudart.so.12")
class cuda:
    @staticmethod
    def set_device(n):
        rc = _rt.cudaSetDevice(n)
        if rc:
            raise RuntimeError(f"CUDA error: invalid device ordinal ({rc})")
def zeros(*args, **kwargs):
    raise RuntimeError("stub torch: no tensors")
'''


def _warn_check(tmp_path, preload):
    mod = load_gpu_check()
    # Installed like the real one, under site-packages: its frames are not the user's site.
    stub = tmp_path / "stub" / "site-packages" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(STUB_TORCH)
    script = tmp_path / "warn_audit.py"
    import textwrap
    script.write_text(mod.PRELUDE + textwrap.dedent(mod.CHECKS["warn_audit"]))
    audit = tmp_path / "audit"
    audit.mkdir()
    env = clean_env(RANKGUARD_MODE="warn", RANKGUARD_AUDIT=str(audit / "audit.%p.jsonl"),
                    GPU_CHECK_AUDIT_DIR=str(audit), CUDA_VISIBLE_DEVICES="0",
                    PYTHONPATH=str(tmp_path / "stub" / "site-packages"))
    if preload:
        env["LD_PRELOAD"] = str(preload)
    p = run([PYTHON, script], env=env, timeout=60)
    [res] = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    return script, p, res


def test_warn_check_names_the_users_set_device_line(tmp_path):
    """Issue 13's GPU check, run here with a stand-in torch: the warn check passes only when
    the record's site is the snippet's own `torch.cuda.set_device(legacy_device)` line."""
    script, p, res = _warn_check(tmp_path, GUARD)
    assert res["status"] == "pass", (res, p.stderr)
    n = next(i for i, l in enumerate(script.read_text().splitlines(), 1)
             if l.strip() == "torch.cuda.set_device(legacy_device)")
    assert res["site"] == f"{script}:{n} in <module>"
    # The framework's own frame is still in the record's stack, innermost.
    assert "site-packages/torch/__init__.py" in res["records"][0]["py_stack"][-1], res["records"][0]
    line = next(l for l in p.stderr.splitlines() if "RANKGUARD WARN cudaSetDevice(" in l)
    assert f"; at {script}:{n} in <module>; fix: " in line, line


def test_warn_check_fails_without_records(tmp_path):
    _, p, res = _warn_check(tmp_path, TESTS / "libnext_a.so")
    assert res["status"] == "fail" and "no audit record" in res["detail"], res

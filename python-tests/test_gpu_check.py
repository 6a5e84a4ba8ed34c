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

import pytest

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


def fake_gpu_run(tmp_path, *extra):
    proc = tmp_path / "proc-gpus"
    (proc / "0000:18:00.0").mkdir(parents=True)
    out = tmp_path / "out"
    p = run([PYTHON, GPU_CHECK, out, "--proc-gpus", proc, "--python", PYTHON, *extra],
            env=clean_env(FAKECUDA_GPUS="2"), timeout=300)
    report = json.loads((out / "gpu-check.json").read_text())
    return p, report, {c["name"]: c for c in report["checks"]}


def test_checks_on_the_fake_node_pass_or_skip(tmp_path):
    p, report, checks = fake_gpu_run(tmp_path, "--guard", GUARD)
    assert p.returncode == 0, p.stdout + p.stderr
    assert report["status"] == "passed"
    # cuda-bindings runs fully on the fake driver (DESIGN.md §5): a real pass, with the
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


def test_a_refusal_without_the_guards_line_fails(tmp_path):
    # Another preload instead of the guard: the fake driver still answers 101 for
    # cuDeviceGet(1), but nothing says RANKGUARD, so the check must fail.
    p, report, checks = fake_gpu_run(tmp_path, "--guard", TESTS / "libnext_a.so")
    assert p.returncode == 1, p.stdout + p.stderr
    assert report["status"] == "failed"
    assert checks["cuda_bindings"]["status"] == "fail"
    assert "not by the guard" in checks["cuda_bindings"]["detail"]


def test_every_check_script_compiles():
    mod = load_gpu_check()
    for name, body in mod.CHECKS.items():
        compile(mod.PRELUDE + body, f"gpu-check:{name}", "exec")
    compile(mod.PROBE, "gpu-check:probe", "exec")
    assert set(mod.CHECKS) == set(mod.NEEDS)

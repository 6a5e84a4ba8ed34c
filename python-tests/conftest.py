"""Shared fixtures for every pytest suite.

Every test process starts from a scrubbed environment (`clean_env`): the outer
environment's LD_PRELOAD, CUDA_VISIBLE_DEVICES, RANKGUARD_*, FAKECUDA_* and rank
variables never leak in, and LD_LIBRARY_PATH points at the fake CUDA platform, so a
test sees exactly the node it describes.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAKE = ROOT / "c-tests" / "build" / "fakecuda"
TESTS = ROOT / "c-tests" / "build" / "tests"
GUARD = ROOT / "target" / "release" / "librankguard.so"
CLI = ROOT / "target" / "release" / "rankguard"
# The glibc 2.34 build (docs/install.md, "Two builds"), which build.rs puts beside GUARD.
NATIVE_GUARD = ROOT / "target" / "release" / "glibc-2.34" / "librankguard.so"


def gnu_libc_version() -> tuple[int, ...]:
    return tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split("."))


# What `rankguard lib` (and so `launch`/`run`) hands out by default here: the build that fits
# this glibc (src/cli/lib_build.rs). test_two_builds.py checks that the 2.34 build exists.
LIB_GUARD = NATIVE_GUARD if gnu_libc_version() >= (2, 34) and NATIVE_GUARD.exists() else GUARD
PYTHON = sys.executable

# Variables of the outer world that would change what a test sees.
_SCRUB_PREFIXES = ("RANKGUARD_", "FAKECUDA_", "CUDA_", "NCCL_", "SLURM_", "OMPI_", "PMI_",
                   "TORCHELASTIC_")
_SCRUB = {"LD_PRELOAD", "LD_LIBRARY_PATH", "RANK", "LOCAL_RANK", "WORLD_SIZE",
          "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"}


def clean_env(**overrides: str | None) -> dict[str, str]:
    """A scrubbed copy of os.environ with the fake platform on LD_LIBRARY_PATH.

    Keyword arguments set variables; a value of None removes one.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in _SCRUB and not k.startswith(_SCRUB_PREFIXES)}
    env["LD_LIBRARY_PATH"] = str(FAKE)
    env["PYTHONUNBUFFERED"] = "1"
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run(cmd, env=None, timeout=60, check=False, **kw) -> subprocess.CompletedProcess:
    """Run a command with a scrubbed environment, capturing text output."""
    if env is None:
        env = clean_env()
    p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True,
                       timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


@pytest.fixture
def env():
    return clean_env()


# PyTorch on the fake node (scripts/setup installs the pinned torch into .venv-torch;
# scripts/fake-node runs a command with it, the fake platform and the built rankguard).
TORCH_VENV = ROOT / ".venv-torch"
TORCH_SITE = TORCH_VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
FAKE_NODE = ROOT / "scripts" / "fake-node"


def fake_node(cmd, env=None, timeout=120, **kw) -> subprocess.CompletedProcess:
    """Run cmd through scripts/fake-node with a scrubbed environment (clean_env())."""
    assert (TORCH_VENV / ".requirements-torch.sha256").exists(), \
        f"{TORCH_VENV} missing: run scripts/setup (it installs the pinned torch)"
    return run([FAKE_NODE, *cmd], env=env, timeout=timeout, **kw)


# The longest files, first (those over 5 s with two workers on 2 CPUs, longest first):
# scripts/test hands whole files to its workers in collection order (pytest-xdist
# --dist loadfile), so the PyTorch suites (60-75 s each) start at once and short files fill
# in at the end, instead of a long one ending the run alone on one worker.
_FIRST = ("test_torch_rl_job.py", "test_torchrun.py", "test_torch_allocators.py",
          "test_end_rank.py", "test_demo.py", "test_readme_quickstart.py", "test_numba_cuda.py",
          "test_rank_root.py", "test_rank_root_ray.py", "test_install.py", "test_fake_frameworks.py",
          "test_ipc_python.py", "test_registry_stale.py", "test_guard_paths.py", "test_report.py",
          "test_cli_launch.py", "test_slurm.py", "test_guard_volume.py", "test_guard_coverage.py",
          "test_ipc.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(_FIRST)))  # stable: file order kept

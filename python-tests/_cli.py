"""Helpers for the rankguard CLI suites (python-tests/test_cli_*.py).

`child_cmd(...)` is the rank program the launcher starts: NVIDIA's cuda.bindings asking the
(fake) driver itself what it sees, plus the environment and the CPU affinity read back from
/proc/self/status, printed as one JSON line tagged `CHILD`. Options make it fail, sleep, or
record its pid so supervision tests can check what is still running.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time

from conftest import CLI, FAKE, PYTHON, ROOT, clean_env, run

CHILD = pathlib.Path(__file__).resolve().parent / "_cli_child.py"
SMI = FAKE / "fakecuda-smi"


def uuid(i: int) -> str:
    """The fake node's deterministic UUID of GPU i (c-tests/cvd-vectors.tsv header)."""
    return f"GPU-{0x10 + i:02x}c0ffee-0000-4000-8000-{i:012x}"


def bus(i: int) -> str:
    return f"0000:{0x18 + 0x10 * i:02x}:00.0"


def child_cmd(*args: str) -> list[str]:
    return [PYTHON, str(CHILD), *args]


def children(stdout: str) -> list[dict]:
    """The CHILD reports in an output, ordered by RANK."""
    out = [json.loads(line.split("CHILD ", 1)[1]) for line in stdout.splitlines() if "CHILD {" in line]
    return sorted(out, key=lambda c: int(c["env"].get("RANK") or 0))


def cli(*args, env=None, timeout=60, **kw):
    return run([CLI, *args], env=env if env is not None else clean_env(), timeout=timeout, **kw)


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # The file opens and the read fails with ESRCH when the process is reaped in between.
        return False


def wait_for(pred, timeout=20.0, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def sysroot(tmp: pathlib.Path, **fake_env: str) -> pathlib.Path:
    """Write the fake node's /proc and /sys files under tmp with fakecuda-smi."""
    root = tmp / "sysroot"
    env = clean_env(**fake_env)
    run([SMI, "--sysroot", root], env=env, check=True)
    return root


__all__ = ["CHILD", "CLI", "FAKE", "PYTHON", "ROOT", "SMI", "alive", "bus", "child_cmd", "children",
           "clean_env", "cli", "json", "os", "run", "signal", "subprocess", "sysroot", "uuid", "wait_for"]

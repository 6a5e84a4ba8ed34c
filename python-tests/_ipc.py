"""Shared helpers of the R3 (no cross-device IPC inside a rank) suites: test_ipc.py (C
programs) and test_ipc_python.py (NVIDIA's cuda.bindings).

Every process of an exchange gets its own scrubbed environment: the guard preloaded, the
fake node (4 GPUs), its own single-entry CUDA_VISIBLE_DEVICES and RANK, one job id, and a
registry directory private to the test.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
from contextlib import contextmanager

from conftest import GUARD, TESTS, clean_env

PEER = TESTS / "ipc_peer"
JOB = "job-r3"


def gpu_uuid(i: int) -> str:
    """The fake node's deterministic UUID of GPU i (c-tests/cvd-vectors.tsv header)."""
    return f"GPU-{0x10 + i:02x}c0ffee-0000-4000-8000-{i:012x}"


def guard_env(tmp: pathlib.Path, cvd: str, rank: int | None, **extra: str | None) -> dict[str, str]:
    """The environment of one guarded rank process."""
    env = clean_env(
        LD_PRELOAD=str(GUARD),
        FAKECUDA_GPUS="4",
        CUDA_VISIBLE_DEVICES=cvd,
        RANKGUARD_JOB=JOB,
        RANKGUARD_REGISTRY=str(tmp / "registry"),
        RANKGUARD_AUDIT=str(tmp / "audit.jsonl"),
    )
    if rank is not None:
        env["RANK"] = str(rank)
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def audit(tmp: pathlib.Path) -> list[dict]:
    """Every audit record written so far (each line must be whole JSON)."""
    path = tmp / "audit.jsonl"
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
            if r.get("kind") != "map"]  # map records: one per process (docs/report.md)


class Exporter:
    """A running `ipc_peer export` process: its pid, handle directory and output."""

    def __init__(self, proc: subprocess.Popen, where: pathlib.Path):
        self.proc = proc
        self.dir = where
        self.pid = proc.pid
        self.stdout = ""
        self.stderr = ""


@contextmanager
def exporter(tmp: pathlib.Path, kind: str, env: dict[str, str], name: str = "x", cmd=None,
             preexec=None):
    """Start an exporter, wait for "ready", yield it; on exit let it finish and check it
    exited cleanly (its own checks passed). `cmd` replaces the command line (a wrapper
    that execs the program in the same process); `preexec` runs in the child first."""
    where = tmp / name
    where.mkdir(exist_ok=True)
    argv = [str(c) for c in (cmd or [PEER, "export", kind, where])]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    ex = Exporter(proc, where)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.strip() == "ready":
            break
    else:
        proc.wait(timeout=30)
        raise AssertionError(f"exporter {kind} never got ready:\n{''.join(seen)}\n{proc.stderr.read()}")
    try:
        yield ex
    finally:
        out, err = proc.communicate(timeout=60)
        ex.stdout = "".join(seen) + out
        ex.stderr = err
    assert proc.returncode == 0, f"exporter failed ({proc.returncode}):\n{ex.stdout}\n{ex.stderr}"

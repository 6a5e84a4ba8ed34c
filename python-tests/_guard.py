"""Helpers for the guard's tests: run a program with librankguard.so preloaded on the fake
platform, and read back its audit records."""
from __future__ import annotations

import json
import pathlib
import subprocess
from dataclasses import dataclass, field

from conftest import GUARD, TESTS, clean_env, run


@dataclass
class Guarded:
    proc: subprocess.CompletedProcess
    # The decision records; the map records (`"kind":"map"`, one per process at its first
    # cuInit, docs/report.md) apart in `maps`.
    audit: list[dict] = field(default_factory=list)
    maps: list[dict] = field(default_factory=list)

    @property
    def out(self) -> str:
        return self.proc.stdout

    @property
    def err(self) -> str:
        return self.proc.stderr

    @property
    def rc(self) -> int:
        return self.proc.returncode

    def value(self, key: str) -> int:
        """The integer printed as `key=<n>` in stdout."""
        for tok in self.out.split():
            if tok.startswith(key + "="):
                return int(tok.split("=", 1)[1])
        raise AssertionError(f"{key}= not in output:\n{self.out}\nstderr:\n{self.err}")


def guarded(cmd, tmp_path: pathlib.Path, *, cvd: str | None, mode: str | None = "enforce",
            preload: bool = True, timeout: int = 60, **extra_env) -> Guarded:
    """Run cmd with the guard preloaded (unless preload=False), CUDA_VISIBLE_DEVICES=cvd
    (None: unset), RANKGUARD_MODE=mode and an audit file in tmp_path."""
    audit = tmp_path / f"audit-{len(list(tmp_path.glob('audit-*')))}.jsonl"
    env = clean_env(CUDA_VISIBLE_DEVICES=cvd, RANKGUARD_MODE=mode,
                    RANKGUARD_AUDIT=str(audit), **extra_env)
    if preload:
        env["LD_PRELOAD"] = str(GUARD)
    p = run(cmd, env=env, timeout=timeout)
    records, maps = read_audit(audit) if audit.exists() else ([], [])
    return Guarded(p, records, maps)


def read_audit(path: pathlib.Path) -> tuple[list[dict], list[dict]]:
    """An audit file's decision records and its map records (`"kind":"map"`), apart."""
    records, maps = [], []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        (maps if r.get("kind") == "map" else records).append(r)
    return records, maps


def prog(name: str) -> pathlib.Path:
    p = TESTS / name
    assert p.exists(), f"{p} not built: run make -C c-tests"
    return p


def assert_is_the_guard(lib: pathlib.Path):
    """`lib` preloads without a loader complaint and is the guard: it denies ordinal 1."""
    p = run(["/bin/true"], env=clean_env(LD_PRELOAD=str(lib)))
    assert (p.returncode, p.stderr) == (0, ""), p.stderr
    p = run([prog("guard_call"), "link", "cuDeviceGet", "1"],
            env=clean_env(LD_PRELOAD=str(lib), CUDA_VISIBLE_DEVICES="3", RANKGUARD_MODE="enforce"))
    assert "rc=101" in p.stdout, p.stdout + p.stderr
    assert "RANKGUARD DENY cuDeviceGet(" in p.stderr

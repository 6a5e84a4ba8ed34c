"""librankguard.so must load on glibc 2.28 and newer (Ubuntu 20.04, RHEL 8): it is preloaded
into other people's processes on their machines, whatever glibc built it (issue 6).

Checked on every artefact we ship as the glibc 2.28 build: the library at the product path
(what the test suites preload), the 2.28 copy the CLI carries for `cargo install` and the
wheel, and the CLI itself (the wheel is tagged manylinux_2_28). The glibc 2.34 build, which
`rankguard lib` hands out on glibc 2.34+, is test_two_builds.py's. How it is met:
.cargo/config.toml links x86_64 builds with scripts/link-glibc-2.28 (zig's glibc 2.28 stubs);
this test fails if that silently fell back to the system linker.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import CLI, GUARD, TESTS, clean_env, run
from _elf import glibc_versions, needed_versions

FLOOR = (2, 28)


def gnu_libc_version() -> tuple[int, ...]:
    return tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split("."))


def _fmt(v):
    return "GLIBC_" + ".".join(map(str, v))


def _check(path: pathlib.Path):
    versions = glibc_versions(path)
    assert versions, f"{path}: no GLIBC_ version needed at all? the ELF reader is broken"
    over = [_fmt(v) for v in versions if v > FLOOR]
    assert not over, (
        f"{path} needs {', '.join(over)}, newer than the glibc {FLOOR[0]}.{FLOOR[1]} floor: it was linked "
        "without scripts/link-glibc-2.28 (run scripts/setup to install ziglang + cargo-zigbuild into .venv, "
        "check .cargo/config.toml, then rebuild)")


def test_the_elf_reader_sees_what_the_loader_checks():
    # A program built here by the system compiler (glibc 2.36) needs GLIBC_2.34's
    # __libc_start_main: the reader must see versions above the floor where they exist.
    prog = TESTS / "guard_call"
    assert prog.exists(), "run make -C c-tests"
    need = needed_versions(prog)
    assert "libc.so.6" in need
    if gnu_libc_version() > FLOOR:
        assert max(glibc_versions(prog)) > FLOOR, need
    if shutil.which("objdump"):
        # binutils agrees (objdump -T lists the version of every imported symbol).
        text = subprocess.run(["objdump", "-T", str(prog)], capture_output=True, text=True).stdout
        listed = set(re.findall(r"\((GLIBC_[0-9.]+)\)", text))
        assert listed and listed <= {n for s in need.values() for n in s}


def test_librankguard_stays_within_glibc_2_28():
    _check(GUARD)


def test_rankguard_cli_stays_within_glibc_2_28():
    _check(CLI)


def test_the_library_the_cli_carries_stays_within_glibc_2_28(tmp_path):
    # A lone copy of the CLI has nothing beside it: it writes the library it carries. It
    # carries two builds (test_two_builds.py); the glibc 2.28 one is what this test is about.
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "rankguard"
    shutil.copy(CLI, exe)
    p = run([exe, "lib"], env=clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"), RANKGUARD_LIB_GLIBC="2.28"),
            check=True)
    lib = pathlib.Path(p.stdout.strip())
    assert lib.is_relative_to(tmp_path / "cache"), lib
    _check(lib)

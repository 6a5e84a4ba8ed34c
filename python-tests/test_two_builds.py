"""Two builds of librankguard.so, and `rankguard lib` picks the one that fits (issue 17;
docs/install.md, "Two builds"):

- the glibc 2.28 build (target/release/librankguard.so): loads on glibc 2.28+, and so must
  name libdl.so.2 and libpthread.so.0 (test_glibc_floor.py keeps it within 2.28);
- the glibc 2.34 build (target/release/glibc-2.34/librankguard.so, built by build.rs):
  needs only libc.so.6, so a process on glibc 2.34+ does not load two more libraries.

`rankguard lib` (and `launch`/`run`, and the copies a lone binary carries) picks by the
running glibc; RANKGUARD_LIB_GLIBC=2.28|2.34 forces one. Each path is checked by what the
chosen file needs (DT_NEEDED, GLIBC_ versions) and by preloading it: it must be the guard.
"""
from __future__ import annotations

import pathlib
import shutil

import pytest

from conftest import CLI, GUARD, NATIVE_GUARD, clean_env, gnu_libc_version, run
from _cli import child_cmd, children
from _elf import glibc_versions, needed_libraries
from _guard import assert_is_the_guard as guards, prog

NATIVE_HOST = gnu_libc_version() >= (2, 34)
SPLIT = {"libdl.so.2", "libpthread.so.0"}


def is_floor(lib: pathlib.Path) -> bool:
    need = set(needed_libraries(lib))
    assert "libc.so.6" in need, need
    return SPLIT <= need and max(glibc_versions(lib)) <= (2, 28)


def is_native(lib: pathlib.Path) -> bool:
    need = set(needed_libraries(lib))
    return need <= {"libc.so.6", "ld-linux-x86-64.so.2"} and max(glibc_versions(lib)) == (2, 34)


def lib(exe=CLI, **env):
    return run([exe, "lib"], env=clean_env(**env))


def test_the_release_build_made_both_and_they_need_what_they_should():
    # scripts/setup installs zig, with which build.rs links the 2.34 build: it must exist.
    assert NATIVE_GUARD.is_file(), f"{NATIVE_GUARD} missing: build.rs did not build it (see its cargo warning)"
    assert is_floor(GUARD), (needed_libraries(GUARD), glibc_versions(GUARD)[-1])
    assert is_native(NATIVE_GUARD), (needed_libraries(NATIVE_GUARD), glibc_versions(NATIVE_GUARD)[-1])


@pytest.mark.skipif(not NATIVE_HOST, reason="the glibc 2.34 build cannot load on this glibc")
def test_the_native_build_is_the_guard():
    guards(NATIVE_GUARD)


def test_lib_picks_the_build_that_fits_this_glibc():
    p = lib()
    assert p.returncode == 0, p.stderr
    assert pathlib.Path(p.stdout.strip()) == (NATIVE_GUARD if NATIVE_HOST else GUARD).resolve()
    p = lib(RANKGUARD_LIB_GLIBC="auto")
    assert pathlib.Path(p.stdout.strip()) == (NATIVE_GUARD if NATIVE_HOST else GUARD).resolve()


def test_lib_can_be_forced_to_either_build():
    p = lib(RANKGUARD_LIB_GLIBC="2.28")
    assert p.returncode == 0, p.stderr
    assert pathlib.Path(p.stdout.strip()) == GUARD.resolve()
    p = lib(RANKGUARD_LIB_GLIBC="2.34")
    if NATIVE_HOST:
        assert p.returncode == 0, p.stderr
        assert pathlib.Path(p.stdout.strip()) == NATIVE_GUARD.resolve()
    else:
        assert p.returncode == 2 and "does not load on this glibc" in p.stderr, p.stderr
    p = lib(RANKGUARD_LIB_GLIBC="native")
    assert p.returncode == 2
    assert "RANKGUARD_LIB_GLIBC='native' is not auto, 2.28 or 2.34" in p.stderr
    # An explicit library wins over the choice of build.
    p = lib(RANKGUARD_LIB=str(GUARD), RANKGUARD_LIB_GLIBC="2.34")
    assert pathlib.Path(p.stdout.strip()) == GUARD.resolve(), p.stderr


def test_a_prefix_install_with_both_builds(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib" / "glibc-2.34").mkdir(parents=True)
    exe = tmp_path / "bin" / "rankguard"
    shutil.copy(CLI, exe)
    shutil.copy(GUARD, tmp_path / "lib" / "librankguard.so")
    shutil.copy(NATIVE_GUARD, tmp_path / "lib" / "glibc-2.34" / "librankguard.so")
    want = tmp_path / "lib" / ("glibc-2.34/librankguard.so" if NATIVE_HOST else "librankguard.so")
    assert run([exe, "lib"], env=clean_env(), check=True).stdout.strip() == str(want)
    p = run([exe, "lib"], env=clean_env(RANKGUARD_LIB_GLIBC="2.28"), check=True)
    assert p.stdout.strip() == str(tmp_path / "lib" / "librankguard.so")
    # Only the 2.28 build installed: it is what everyone gets, unless 2.34 is demanded.
    shutil.rmtree(tmp_path / "lib" / "glibc-2.34")
    assert run([exe, "lib"], env=clean_env(), check=True).stdout.strip() == str(tmp_path / "lib" / "librankguard.so")
    p = run([exe, "lib"], env=clean_env(RANKGUARD_LIB_GLIBC="2.34", HOME=None, XDG_CACHE_HOME=None))
    if NATIVE_HOST:
        assert p.returncode == 2, p.stdout
        assert "RANKGUARD_LIB_GLIBC asks for the glibc 2.34 build" in p.stderr
        assert "/lib/glibc-2.34/librankguard.so" in p.stderr, p.stderr


def test_the_copies_a_lone_binary_carries(tmp_path):
    """`cargo install` and the wheel ship the binary alone: it carries both builds and
    writes the one that fits (or the forced one) to the cache."""
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "rankguard"
    shutil.copy(CLI, exe)
    cache = tmp_path / "cache"
    auto = pathlib.Path(lib(exe, XDG_CACHE_HOME=str(cache)).stdout.strip())
    floor = pathlib.Path(lib(exe, XDG_CACHE_HOME=str(cache), RANKGUARD_LIB_GLIBC="2.28").stdout.strip())
    for p in (auto, floor):
        assert p.is_relative_to(cache) and p.name == "librankguard.so", p
    assert is_floor(floor)
    guards(floor)
    if NATIVE_HOST:
        assert auto != floor and is_native(auto)
        guards(auto)
        assert pathlib.Path(lib(exe, XDG_CACHE_HOME=str(cache), RANKGUARD_LIB_GLIBC="2.34").stdout.strip()) == auto
    else:
        assert auto == floor


def test_launch_injects_the_chosen_build(tmp_path):
    env = dict(FAKECUDA_GPUS="2")
    for forced, want in (("2.28", GUARD), (None, NATIVE_GUARD if NATIVE_HOST else GUARD)):
        p = run([CLI, "launch", "--nproc-per-node", "2", "--", *child_cmd()],
                env=clean_env(RANKGUARD_LIB_GLIBC=forced, **env), timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        kids = children(p.stdout)
        assert len(kids) == 2
        for k in kids:
            assert k["env"]["LD_PRELOAD"] == str(want.resolve()), k["env"]
            assert k["guard_loaded"]

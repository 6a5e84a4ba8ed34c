"""Installing rankguard anywhere (issue 6): `cargo install`, and the wheel for Python users.

Both ship the `rankguard` binary alone; it carries librankguard.so (build.rs) and
`rankguard lib` writes it once to `$XDG_CACHE_HOME/rankguard/<version>-<hash>/`
(src/cli/embedded.rs). Each test installs into a temporary prefix, then checks that the
library it reports exists, is the guard (preloaded, it denies a non-zero ordinal on the fake
node) and loads cleanly, and that the cache is private to the user.
"""
from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT, clean_env, run
from _cli import child_cmd, children
from _guard import prog

# Both builds reuse target/release (already built by scripts/test), so they are quick.
BUILD_TIMEOUT = 1800


def _guard_works(lib: pathlib.Path, tmp_path: pathlib.Path):
    """`lib` preloads without a loader complaint and is the guard: it denies ordinal 1."""
    p = run(["/bin/true"], env=clean_env(LD_PRELOAD=str(lib)))
    assert (p.returncode, p.stderr) == (0, ""), p.stderr
    p = run([prog("guard_call"), "link", "cuDeviceGet", "1"],
            env=clean_env(LD_PRELOAD=str(lib), CUDA_VISIBLE_DEVICES="3", RANKGUARD_MODE="enforce"))
    assert "rc=101" in p.stdout, p.stdout + p.stderr
    assert "RANKGUARD WARN cuDeviceGet(" in p.stderr


def _cache_is_private(lib: pathlib.Path, cache: pathlib.Path):
    assert lib.parent.parent == cache / "rankguard", lib
    assert lib.parent.name.startswith("0.1.0-") or "-" in lib.parent.name
    st = lib.parent.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_cargo_install_gives_a_rankguard_that_finds_its_library(tmp_path):
    root = tmp_path / "prefix"
    p = run(["cargo", "install", "--quiet", "--locked", "--path", ROOT, "--root", root,
             "--target-dir", ROOT / "target"], env=clean_env(), cwd=ROOT, timeout=BUILD_TIMEOUT)
    assert p.returncode == 0, p.stderr
    # cargo install installs binaries only: nothing but rankguard.
    assert sorted(x.name for x in (root / "bin").iterdir()) == ["rankguard"]
    exe = root / "bin" / "rankguard"
    cache = tmp_path / "cache"
    env = clean_env(XDG_CACHE_HOME=str(cache))

    lib = pathlib.Path(run([exe, "lib"], env=env, check=True).stdout.strip())
    assert lib.is_file()
    _cache_is_private(lib, cache)
    _guard_works(lib, tmp_path)

    # Written once: a second call finds it and does not rewrite it.
    before = lib.stat().st_mtime_ns
    assert run([exe, "lib"], env=env, check=True).stdout.strip() == str(lib)
    assert lib.stat().st_mtime_ns == before

    # A corrupted (or foreign) copy is replaced by the carried bytes.
    good = lib.read_bytes()
    lib.write_bytes(b"not a library")
    assert run([exe, "lib"], env=env, check=True).stdout.strip() == str(lib)
    assert lib.read_bytes() == good

    # HOME/.cache when XDG_CACHE_HOME is unset.
    home = tmp_path / "home"
    home.mkdir()
    p = run([exe, "lib"], env=clean_env(XDG_CACHE_HOME=None, HOME=str(home)), check=True)
    assert p.stdout.strip().startswith(str(home / ".cache" / "rankguard") + "/")


def test_the_cache_directory_must_be_private_and_real(tmp_path):
    root = tmp_path / "bin"
    root.mkdir()
    exe = root / "rankguard"
    exe.write_bytes((ROOT / "target" / "release" / "rankguard").read_bytes())
    exe.chmod(0o755)
    cache = tmp_path / "cache"
    env = clean_env(XDG_CACHE_HOME=str(cache))
    lib = pathlib.Path(run([exe, "lib"], env=env, check=True).stdout.strip())
    d = lib.parent
    # Group/other access of our own directory is tightened back to 0700.
    d.chmod(0o777)
    run([exe, "lib"], env=env, check=True)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    # A symbolic link in its place (someone else's directory) is refused, naming it.
    other = tmp_path / "elsewhere"
    other.mkdir(mode=0o700)
    lib.unlink()
    d.rmdir()
    d.symlink_to(other)
    p = run([exe, "lib"], env=env)
    assert p.returncode == 2
    assert str(d) in p.stderr and "not a directory" in p.stderr and "RANKGUARD_LIB" in p.stderr


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """Build the wheel with maturin, install it into a fresh venv with --no-index."""
    tmp = tmp_path_factory.mktemp("wheel")
    maturin = pathlib.Path(sys.executable).parent / "maturin"
    assert maturin.exists(), "maturin missing: run scripts/setup (python/build-requirements.txt)"
    p = run([maturin, "build", "--release", "--locked", "--out", tmp / "dist"], env=clean_env(),
            cwd=ROOT, timeout=BUILD_TIMEOUT)
    assert p.returncode == 0, p.stdout + p.stderr
    wheels = list((tmp / "dist").glob("*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--disable-pip-version-check",
         wheels[0]], check=True, timeout=300)
    return wheels[0], venv, tmp


def test_the_wheel_is_manylinux_2_28_and_carries_the_cli_and_package(wheel_venv):
    whl, _, _ = wheel_venv
    assert whl.name == "rankguard-0.1.0-py3-none-manylinux_2_28_x86_64.whl", whl.name
    names = set(zipfile.ZipFile(whl).namelist())
    assert {"rankguard/__init__.py", "rankguard/__main__.py", "rankguard-0.1.0.data/scripts/rankguard"} <= names


def test_pip_installed_rankguard_check_and_lib_work(wheel_venv):
    _, venv, tmp = wheel_venv
    cache = tmp / "cache"
    env = clean_env(XDG_CACHE_HOME=str(cache), CUDA_VISIBLE_DEVICES="3",
                    PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    exe = venv / "bin" / "rankguard"

    # `python -m rankguard lib`: the library, written to the user's cache.
    p = run([venv / "bin" / "python", "-m", "rankguard", "lib"], env=env, check=True)
    lib = pathlib.Path(p.stdout.strip())
    _cache_is_private(lib, cache)
    _guard_works(lib, tmp)
    # The same library from the command and from the Python API.
    assert run([exe, "lib"], env=env, check=True).stdout.strip() == str(lib)
    p = run([venv / "bin" / "python", "-c", "import rankguard; print(rankguard.lib())"], env=env, check=True)
    assert p.stdout.strip() == str(lib)

    # `rankguard check` on the fake node: one GPU visible, the guard preloaded -> exit 0.
    p = run([exe, "check"], env=dict(env, LD_PRELOAD=str(lib)))
    assert p.returncode == 0, p.stdout + p.stderr
    # ... and a rank seeing two GPUs violates the contract -> exit 1.
    p = run([exe, "check"], env=dict(env, CUDA_VISIBLE_DEVICES="0,1"))
    assert p.returncode == 1, p.stdout + p.stderr


def test_pip_installed_rankguard_launch_injects_the_cached_library(wheel_venv):
    _, venv, tmp = wheel_venv
    env = clean_env(XDG_CACHE_HOME=str(tmp / "cache"), FAKECUDA_GPUS="8",
                    PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    lib = run([venv / "bin" / "rankguard", "lib"], env=env, check=True).stdout.strip()
    p = run([venv / "bin" / "rankguard", "launch", "--nproc-per-node", "2", "--", *child_cmd()], env=env,
            timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    kids = children(p.stdout)
    assert len(kids) == 2
    for k in kids:
        assert k["env"]["LD_PRELOAD"].split(":")[0] == lib, k["env"]


def test_pip_installed_rankguard_lib_picks_the_build_for_this_glibc(wheel_venv):
    """The wheel's binary carries both builds (test_two_builds.py): `python -m rankguard lib`
    hands out the glibc 2.34 one on glibc 2.34+, the 2.28 one when forced or on older glibc."""
    from conftest import gnu_libc_version
    from _elf import needed_libraries
    _, venv, tmp = wheel_venv
    env = clean_env(XDG_CACHE_HOME=str(tmp / "cache-builds"))
    py = venv / "bin" / "python"
    auto = pathlib.Path(run([py, "-m", "rankguard", "lib"], env=env, check=True).stdout.strip())
    floor = pathlib.Path(run([py, "-m", "rankguard", "lib"], env=dict(env, RANKGUARD_LIB_GLIBC="2.28"),
                             check=True).stdout.strip())
    split = {"libdl.so.2", "libpthread.so.0"}
    assert split <= set(needed_libraries(floor))
    if gnu_libc_version() >= (2, 34):
        assert auto != floor and not split & set(needed_libraries(auto)), needed_libraries(auto)
        _guard_works(auto, tmp)
    else:
        assert auto == floor
    _guard_works(floor, tmp)

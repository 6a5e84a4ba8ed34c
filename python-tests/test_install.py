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

from conftest import PYTHON, ROOT, clean_env, run
from _cli import child_cmd, children, sysroot
from _guard import assert_is_the_guard, prog

# Both builds reuse target/release (already built by scripts/test), so they are quick. maturin's
# `cargo rustc` removes target/release/rankguard and links it again even when nothing changed,
# so scripts/test runs this file alone, before the suites that run that binary.
BUILD_TIMEOUT = 1800




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
    assert_is_the_guard(lib)

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
    assert {"rankguard/__init__.py", "rankguard/__main__.py", "rankguard/api.py", "rankguard/py.typed",
            "rankguard-0.1.0.data/scripts/rankguard"} <= names


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
    assert_is_the_guard(lib)
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
        assert_is_the_guard(auto)
    else:
        assert auto == floor
    assert_is_the_guard(floor)


# The rank of the R1 check below: its child keeps the rank's GPU, its other child re-points
# CUDA_VISIBLE_DEVICES to GPU 7 (the guard must stop it at cuInit, status 78).
R1_RANK = """
import os, subprocess, sys
init = "from cuda.bindings import driver as cu; print(int(cu.cuInit(0)[0]))"
same = subprocess.run([sys.executable, "-c", init], capture_output=True, text=True)
other = subprocess.run([sys.executable, "-c", init], env=dict(os.environ, CUDA_VISIBLE_DEVICES="7"),
                       capture_output=True, text=True)
line = " ".join(map(str, ("R1", os.environ["RANK"], same.returncode, same.stdout.strip(), other.returncode,
                           "RANKGUARD" in other.stderr and "R1" in other.stderr)))
# One write() below PIPE_BUF: the two ranks share stdout, and print() under PYTHONUNBUFFERED
# writes each argument separately, so their lines could interleave.
os.write(1, (line + "\\n").encode())
"""


def test_a_launcher_on_the_python_api_starts_ranks_as_launch_does(wheel_venv, tmp_path):
    """examples/launcher.py (the README's launcher, the API alone) from the installed wheel,
    against `rankguard launch` of the same wheel: same CVDs, CPU blocks, guard, R1."""
    _, venv, tmp = wheel_venv
    launcher = [venv / "bin" / "python", ROOT / "examples" / "launcher.py"]
    launch = [venv / "bin" / "rankguard", "launch"]
    env = clean_env(XDG_CACHE_HOME=str(tmp / "cache"), FAKECUDA_GPUS="8", RANKGUARD_JOB="job-api",
                    PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    lib = run([venv / "bin" / "rankguard", "lib"], env=env, check=True).stdout.strip()

    def both(nproc, cpu_ids, cmd, env=env):
        p = run([*launcher, str(nproc), cpu_ids or "-", *cmd], env=env, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        q = run([*launch, "--nproc-per-node", str(nproc), *(["--cpu-ids", cpu_ids] if cpu_ids else []), "--",
                 *cmd], env=env, timeout=120)
        assert q.returncode == 0, q.stdout + q.stderr
        return p, q

    # 4 ranks: the same environment (MASTER_PORT aside: each launch picks a free one), the
    # same GPU as cuda:0, the guard loaded.
    p, q = both(4, None, child_cmd())
    api, ref = children(p.stdout), children(q.stdout)
    assert [k["env"]["CUDA_VISIBLE_DEVICES"] for k in api] == ["0", "1", "2", "3"]
    assert len(ref) == 4
    for a, b in zip(api, ref):
        assert a["guard_loaded"] and a["env"]["LD_PRELOAD"].split(":")[0] == lib
        assert {k: v for k, v in a["env"].items() if k != "MASTER_PORT"} == \
            {k: v for k, v in b["env"].items() if k != "MASTER_PORT"}
        assert a["env"]["MASTER_PORT"].isdigit()
        assert a["cuda"] == b["cuda"] and a["cuda"]["count"] == 1
        assert a["cpus_allowed_list"] == b["cpus_allowed_list"]

    # CPU blocks (auto, read from a fake topology): the same block per rank, as the kernel
    # reports the children's affinity.
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "the launcher test needs an affinity of 2 CPUs or more"
    root = sysroot(tmp_path, FAKECUDA_GPUS="8", FAKECUDA_CPUS=f"{cpus[0]},{cpus[1]}", FAKECUDA_NUMA_NODES="2")
    p, q = both(2, "auto", child_cmd("--no-cuda"), env=dict(env, RANKGUARD_SYSROOT=str(root)))
    api, ref = children(p.stdout), children(q.stdout)
    assert [k["threads_affinity"] for k in api] == [k["threads_affinity"] for k in ref] == [[cpus[0]], [cpus[1]]]
    assert [k["env"]["OMP_NUM_THREADS"] for k in api] == ["1", "1"]

    # R1: a rank's child re-pointed to another GPU is stopped at cuInit, as under launch.
    # This rank reads its children's statuses itself, the case RANKGUARD_REFUSAL_ENDS=process
    # is for: only the child ends.
    p, q = both(2, None, [PYTHON, "-c", R1_RANK], env=dict(env, RANKGUARD_REFUSAL_ENDS="process"))
    lines = lambda out: sorted(l for l in out.splitlines() if l.startswith("R1 "))
    assert lines(p.stdout) == lines(q.stdout) == ["R1 0 0 0 78 True", "R1 1 0 0 78 True"]
    # By default the refusal ends the rank's process too (issue 28): each rank (a process
    # that never initialised CUDA itself) is sent SIGTERM, and the API's loop exits 128+15
    # as a shell says it (examples/launcher.py; sys.exit(-15) was 241); launch stops the
    # job with 78 and its failure summary.
    p = run([*launcher, "2", "-", PYTHON, "-c", R1_RANK], env=env, timeout=120)
    assert p.returncode == 143, p.stdout + p.stderr
    assert lines(p.stdout) == [] and p.stderr.count("ending the rank's process (SIGTERM)") == 2, p.stderr
    q = run([*launch, "--nproc-per-node", "2", "--", PYTHON, "-c", R1_RANK], env=env, timeout=120)
    assert q.returncode == 78 and "Root Cause (first observed failure):" in q.stderr, q.stdout + q.stderr
    assert lines(q.stdout) == [], q.stdout

    # A conflict is the CLI's refusal, raised as rankguard.ConflictError.
    p = run([*launcher, "2", "-", "true"], env=dict(env, CUDA_VISIBLE_DEVICES="3"))
    assert p.returncode == 1 and p.stderr.startswith("launcher: ") and "single-entry" in p.stderr, p.stderr

"""Where the guard finds the driver's functions (issue 33; docs/design.md §2, "Real
functions").

A program linked with the driver (`-lcuda`: `libcuda.so.1` in its `DT_NEEDED`) has it loaded
before `main`, for good: the guard looks the driver's functions up in the driver's own
symbol table and knows that the program's lookups reach its wrappers from the order the
loader lists its objects, with no `dlopen` and no `dlsym` at the first `cuInit`. Every other
program (the driver opened at run time by a runtime, ctypes, cuda-python) gets the handle the
guard opens, as before, which keeps that driver loaded. These tests hold both, and that a
guard the program `dlopen()`s stays inert in either.
"""
from __future__ import annotations

import re
import sys

from conftest import GUARD, NATIVE_GUARD, clean_env, run
from _guard import prog


def bindings(lib, argv, **env) -> tuple[set[str], object]:
    """The C library functions the loader bound for `lib` while `argv` ran under it
    (LD_DEBUG=bindings), and the run."""
    p = run(argv, env=clean_env(LD_PRELOAD=str(lib), LD_DEBUG="bindings", **env), timeout=30)
    name = re.escape(lib.name)
    bound = set(re.findall(rf"binding file \S*{name} \[0\] to \S+ \[0\]: normal symbol `(\w+)'",
                           p.stderr))
    return bound, p


def libraries():
    return [GUARD] + ([NATIVE_GUARD] if NATIVE_GUARD.exists() else [])


def test_a_program_linked_with_the_driver_resolves_it_without_dlopen():
    for lib in libraries():
        bound, p = bindings(lib, [prog("guard_call"), "link", "cuDeviceGet", "0"],
                            CUDA_VISIBLE_DEVICES="0", RANK="0")
        assert p.returncode == 0 and "rc=0" in p.stdout, p.stdout + p.stderr[-2000:]
        # The walk of the loaded objects ran (the guard bound dl_iterate_phdr): the check
        # is not vacuous.
        assert "dl_iterate_phdr" in bound, (lib, sorted(bound))
        assert not bound & {"dlopen", "dlsym", "dlvsym", "dlclose"}, (lib, sorted(bound))


# The driver opened at run time, as ctypes-based bindings (numba, cuda-python) open it.
CTYPES_INIT = ("import ctypes; c = ctypes.CDLL('libcuda.so.1'); d = ctypes.c_int(-1); "
               "print('rc=%d,%d' % (c.cuInit(0), c.cuDeviceGet(ctypes.byref(d), 0)))")


def test_a_driver_opened_at_run_time_is_still_opened_by_the_guard():
    # Python does not need libcuda.so.1: the guard opens its own handle of the driver (the
    # reference that keeps it loaded should the program close its own).
    for lib in libraries():
        bound, p = bindings(lib, [sys.executable, "-c", CTYPES_INIT],
                            CUDA_VISIBLE_DEVICES="0", RANK="0")
        assert p.returncode == 0 and "rc=0,0" in p.stdout, p.stdout + p.stderr[-2000:]
        assert "dlopen" in bound, (lib, sorted(bound))


def test_a_dlopened_guard_stays_inert_in_a_program_linked_with_the_driver():
    """The driver, needed by the program, is listed before the guard the program opens
    later: the order does not say the program's lookups reach the guard, so the guard asks
    the loader, which says they do not (the same answer as without the driver linked,
    test_guard_hostile.py::test_item12)."""
    for name in ("guard_dlopen", "guard_dlopen_linked"):
        p = run([prog(name), str(GUARD)], env=clean_env(CUDA_VISIBLE_DEVICES="0,1"), timeout=20)
        assert p.returncode == 0, (name, p.stdout + p.stderr)
        assert p.stdout.strip() == "cuInit=0 cuDeviceGet(0)=0 cuDeviceGet(1)=0", (name, p.stdout)
        lines = [x for x in p.stderr.splitlines() if "RANKGUARD" in x]
        assert len(lines) == 1 and "dlopen" in lines[0] and "inert" in lines[0], (name, p.stderr)
        # preloaded, the same program is guarded: R1 stops two visible GPUs
        p = run([prog(name), str(GUARD)],
                env=clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0,1"), timeout=20)
        assert p.returncode == 78, (name, p.stdout + p.stderr)


def test_the_walk_reads_proc_by_system_calls_alone(tmp_path):
    """Without rank variables the first cuInit walks to its rank root: the parent's
    environment (`/proc/<pid>/environ`), the user id, the host name. Those reads are
    system calls made by the guard itself (`signal_safe::RawFile`, `euid`, `nodename`):
    the loader binds none of the C library's `read`, `close`, `geteuid` or `gethostname`
    for the guard, each a look-up through every object of the process at a first `cuInit`
    (docs/benchmarks.md, "The parent's environment"). The walk did run: the guard bound
    `__register_atfork`, which only the walk's root registers."""
    reg = tmp_path / "reg"
    reg.mkdir(mode=0o700)
    for lib in libraries():
        bound, p = bindings(lib, [prog("guard_call"), "link", "cuDeviceGet", "0"],
                            CUDA_VISIBLE_DEVICES="0", RANK=None, RANKGUARD_REGISTRY=str(reg))
        assert p.returncode == 0 and "rc=0" in p.stdout, p.stdout + p.stderr[-2000:]
        assert "__register_atfork" in bound or "pthread_atfork" in bound, (lib, sorted(bound))
        assert not bound & {"read", "close", "geteuid", "gethostname"}, (lib, sorted(bound))

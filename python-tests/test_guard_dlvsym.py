"""dlvsym under the guard, and the guard's own runtime calls per major (issue 11).

`dlvsym(handle, "cudaSetDevice", "libcudart.so.13")` asks one runtime major for its
function (the runtime keeps names across majors; only the version node tells them apart).
The guard's `dlvsym` hands out the wrapper of the major the node names, calling that
runtime; a node of a major it has no wrappers for gets the real function, untouched, and one
line; `RTLD_NEXT` keeps the caller's meaning. Programs: c-tests/tests13/guard_dlvsym.c (a
CUDA 13 program, with a private 12 or 14 runtime where asked), testlibs/libvnext.c (an
interposer's `dlvsym(RTLD_NEXT)`), mixed/mixed_calls.c `peer` (a cu12 executable with an
RTLD_LOCAL cu13 library, and the reverse). Each guarded run is compared with the program run
without the guard, on the fake runtimes' argument log (FAKECUDA_ARGLOG).
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from _arglog import DRIVER_13, DRIVER_14, logged_run, prog
from conftest import GUARD, NATIVE_GUARD, TESTS

BUILDS = pytest.mark.parametrize("lib", [GUARD, NATIVE_GUARD], ids=["glibc-2.28", "glibc-2.34"])


def same(lines):
    """Log lines with addresses blanked (two runs differ only there: ASLR; IPC handles carry
    the exporter's pid)."""
    return [re.sub(r"reserved=[0-9a-f]+", "reserved=_", re.sub(r"0x[0-9a-f]+", "0x_", l)) for l in lines]


def denied(line):
    """A call that asks for device 1: cudaSetDevice(1), a prefetch to device 1 (12: int, 13:
    a location of type device, id 1)."""
    return line.endswith("device=1") or "dstDevice=1 " in line or "location={type=1,id=1}" in line


def run(cmd, tmp_path, lib=GUARD, preload=None, mode="enforce", cvd="0", driver=DRIVER_13):
    """cmd on the fake platform with `preload` (default: the guard `lib`; "" for none)."""
    audit = tmp_path / "audit.jsonl"
    audit.unlink(missing_ok=True)
    r = logged_run(cmd, tmp_path, driver=driver, CUDA_VISIBLE_DEVICES=cvd, RANKGUARD_MODE=mode,
                   RANKGUARD_AUDIT=str(audit),
                   LD_PRELOAD=str(lib) if preload is None else preload or None)
    r.records = [x for x in map(json.loads, audit.read_text().splitlines()) if x.get("kind") != "map"] if audit.exists() else []
    r.found = [l.split()[1] for l in r.out.splitlines() if l.startswith("found ")]
    return r


@BUILDS
@pytest.mark.parametrize("where,node", [("rt13", "libcudart.so.13"), ("rt12", "libcudart.so.12"),
                                        ("default", "libcudart.so.13"), ("next", "libcudart.so.13")])
def test_dlvsym_hands_out_the_wrapper_of_the_nodes_major_in_enforce_mode(tmp_path, lib, where, node):
    """dlvsym on a runtime's handle (the program's 13, a private 12), RTLD_DEFAULT and the
    program's RTLD_NEXT: the guard's wrapper with that major's parameters, calling that
    major's runtime. cudaSetDevice 0 / 1 and cudaMemPrefetchAsync to device 0, the host and
    device 1: allowed, denied, allowed, allowed, denied (R2), every argument of the allowed
    ones (the stream included) as in the unguarded run."""
    cmd = [prog("guard_dlvsym"), where, node]
    plain = run(cmd, tmp_path, preload="")
    assert plain.rc == 0 and plain.logged == plain.expected, plain.out + plain.err
    assert plain.found == [f"{'libcudart.so.13' if where in ('default', 'next') else node}"] * 2
    r = run(cmd, tmp_path, lib)
    assert r.rc == 0, r.out + r.err
    assert r.found == [lib.name] * 2, r.out
    assert [c for _, c in r.results] == [0, 101, 0, 0, 101], r.out + r.err
    allowed = [l for l in r.expected if not denied(l)]
    assert len(allowed) == 3 and all(l.startswith(f"{node} ") for l in allowed)
    assert r.logged == allowed, r.out + r.err
    assert same(r.logged) == same([l for l in plain.logged if not denied(l)])
    rec = [(x["call"], x["rule"], x["verdict"]) for x in r.records]
    assert rec == [("cudaSetDevice", "R2", "deny"), ("cudaMemPrefetchAsync", "R2", "deny")], r.records
    prefetch = r.records[1]["args"]
    assert ("dstDevice=1" in prefetch) if node.endswith("12") else ("type_: 1, id: 1" in prefetch), prefetch


@pytest.mark.parametrize("where,node", [("rt13", "libcudart.so.13"), ("rt12", "libcudart.so.12")])
def test_dlvsym_wrappers_in_warn_mode_record_and_pass_every_argument(tmp_path, where, node):
    cmd = [prog("guard_dlvsym"), where, node]
    plain = run(cmd, tmp_path, preload="", cvd="0,1")
    r = run(cmd, tmp_path, mode="warn", cvd="0,1")
    assert r.rc == 0 and r.found == [GUARD.name] * 2, r.out + r.err
    assert r.logged == r.expected and same(r.logged) == same(plain.logged), r.out + r.err
    assert r.results == plain.results
    # (Two visible GPUs also break R1, and the runtime's own driver calls for device 1 are
    # recorded too: only the wrappers' records are looked at.)
    rec = [(x["call"], x["abi"], x["rule"], x["verdict"]) for x in r.records if x["call"].startswith("cuda")]
    assert rec == [("cudaSetDevice", "cudaSetDevice", "R2", "warn"),
                   ("cudaMemPrefetchAsync", "cudaMemPrefetchAsync", "R2", "warn")], r.records


def test_dlvsym_of_another_majors_node_on_a_runtime_finds_nothing_as_without_the_guard(tmp_path):
    cmd = [prog("guard_dlvsym"), "rt13", "libcudart.so.12"]
    assert run(cmd, tmp_path, preload="").found == ["none"]
    r = run(cmd, tmp_path)
    assert r.rc == 0 and r.found == ["none"] and r.logged == [], r.out + r.err


@BUILDS
def test_dlvsym_of_an_unknown_major_is_untouched_with_one_line(tmp_path, lib):
    """The stand-in libcudart.so.14, loaded privately, asked for its own node: its real
    functions, untouched (device 1 reaches it too), and one line naming the major."""
    cmd = [prog("guard_dlvsym"), "rt14", "libcudart.so.14"]
    plain = run(cmd, tmp_path, preload="", driver=DRIVER_14, mode="warn", cvd="0,1")
    r = run(cmd, tmp_path, lib, driver=DRIVER_14, mode="warn", cvd="0,1")
    assert r.rc == 0 and r.found == ["libcudart.so.14"] * 2, r.out + r.err
    assert r.logged == r.expected and same(r.logged) == same(plain.logged)
    assert r.results == plain.results
    lines = [l for l in r.err.splitlines() if "no wrappers for" in l]
    assert len(lines) == 1 and "libcudart.so.14" in lines[0], r.err
    assert not [x for x in r.records if x["call"].startswith("cuda")], r.records


@BUILDS
def test_dlvsym_rtld_next_keeps_the_callers_meaning(tmp_path, lib):
    """An interposer's dlvsym(RTLD_NEXT): preloaded after the guard it gets the real 13
    runtime's function (what an interposer asks for); preloaded before it, the guard's. The
    guard's dlvsym tail-jumps to the real one, so "next" is reckoned from the caller."""
    vnext = TESTS / "libvnext.so"
    cmd = [prog("guard_dlvsym"), "interposer", "libcudart.so.13"]
    after = run(cmd, tmp_path, preload=f"{lib} {vnext}")
    assert after.rc == 0 and after.found == ["libcudart.so.13"] * 2, after.out + after.err
    before = run(cmd, tmp_path, preload=f"{vnext} {lib}")
    assert before.rc == 0 and before.found == [lib.name] * 2, before.out + before.err
    assert [c for _, c in before.results] == [0, 101, 0, 0, 101]
    alone = run(cmd, tmp_path, preload=str(vnext))
    assert alone.found == ["libcudart.so.13"] * 2, alone.out + alone.err


def test_dlvsym_of_a_driver_name_answers_as_the_driver_does(tmp_path):
    """The driver has no version nodes, and dlvsym matches only a definition of the node it
    names: it finds no driver function, with or without the guard (dlsym does, and gets the
    guard's wrapper)."""
    cmd = [prog("guard_dlvsym"), "driver", "libcuda.so.1"]
    for preload in ("", None):
        r = run(cmd, tmp_path, preload=preload)
        assert r.rc == 0 and r.found == ["none"], r.out + r.err


@pytest.mark.parametrize("mode,cvd", [("enforce", "0"), ("warn", "0,1")])
@pytest.mark.parametrize("main,lib", [("mixed_main12", "libmixed13.so"),
                                      ("mixed_main13", "libmixed12.so")])
def test_the_guards_own_runtime_calls_go_to_the_callers_major(tmp_path, main, lib, mode, cvd):
    """One process with both majors (a cu12 executable and an RTLD_LOCAL cu13 library, and
    the reverse): each side's cudaDeviceEnablePeerAccess makes the guard ask for the current
    device (cudaGetDevice), and it asks the runtime of that side's major. The first runtime
    in the global scope, which an unversioned lookup finds, is the executable's: the
    library's check asked it before (the other major's current device, and its state)."""
    cmd = [prog(main), prog(lib), "peer"]
    plain = run(cmd, tmp_path, preload="", mode=mode, cvd=cvd)
    assert plain.rc == 0 and not [l for l in plain.logged if " cudaGetDevice " in l], plain.out
    r = run(cmd, tmp_path, mode=mode, cvd=cvd)
    assert r.rc == 0, r.out + r.err
    own, other = main[-2:], lib[-5:-3]
    asked = [l.split()[0] for l in r.logged if " cudaGetDevice " in l]
    assert asked == [f"libcudart.so.{own}", f"libcudart.so.{other}"], r.logged
    # Each is asked right before that side's peer call, after its entry-point lookup.
    for major in (own, other):
        mine = [l for l in r.logged if l.startswith(f"libcudart.so.{major} ")]
        i = next(i for i, l in enumerate(mine) if " cudaGetDevice " in l)
        assert " cudaGetDriverEntryPoint " in mine[i - 1], mine
    # Apart from the guard's own question, the log is the unguarded run's (less what it denied).
    rest = [l for l in r.logged if " cudaGetDevice " not in l]
    if mode == "enforce":
        assert same(rest) == same([l for l in plain.logged
                                   if not (l.endswith("device=1") or "peerDevice=1 " in l)])
    else:
        assert same(rest) == same(plain.logged)


@BUILDS
def test_the_guard_exports_dlvsym_unversioned_and_imports_none(lib):
    """Exported unversioned (it must answer programs' dlvsym@GLIBC_2.34 and @GLIBC_2.2.5
    references), and never imported: the guard reads the real one from the C library, so
    neither build needs a dlvsym version (the 2.28 floor: test_glibc_floor.py)."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    defined, imported = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 8:
            (imported if f[6] == "UND" else defined).add(f[7])
    assert "dlvsym" in defined and "dlsym" in defined, sorted(n for n in defined if n.startswith("dl"))
    assert not [n for n in imported if n.split("@")[0] in ("dlvsym", "dlsym")], sorted(imported)


@BUILDS
def test_another_interposers_dlvsym_sees_only_the_programs_calls(tmp_path, lib):
    """libvcount.so, preloaded before the guard, defines dlvsym and forwards to the next one
    (the guard's). It sees the program's two lookups and nothing of the guard's own (the
    guard resolves its real dlsym and each runtime major's functions with the real dlvsym,
    never by name: by name they would reach this interposer, which asks the guard's dlsym,
    which asked dlvsym again, until the stack ran out)."""
    cmd = [prog("guard_dlvsym"), "rt13", "libcudart.so.13"]
    r = run(cmd, tmp_path, preload=f"{TESTS / 'libvcount.so'} {lib}")
    assert r.rc == 0, r.out + r.err
    assert r.found == [lib.name] * 2 and [c for _, c in r.results] == [0, 101, 0, 0, 101], r.out
    assert "libvcount: dlvsym calls=2" in r.err, r.err

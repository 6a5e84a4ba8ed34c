"""Every violation names its call site (issue 13): the Python line of the calling thread
(also while it does not hold the GIL: cuda.bindings and ctypes release it), else the first
native frame outside the guard and the CUDA libraries; `rankguard report` groups by site.

The scripts below are written to files so that their line numbers are known: each
violating line carries a `# SITE name` marker and the tests look the number up.
"""
from __future__ import annotations

import glob
import json
import os
import pathlib
import re
import shutil
import textwrap

import pytest

from conftest import CLI, PYTHON, TESTS, run
from _guard import guarded, prog

LEGACY = textwrap.dedent("""\
    import ctypes
    import threading
    from cuda.bindings import driver as cu
    libcuda = ctypes.CDLL("libcuda.so.1")

    def place_learner(devices, rank):
        return cu.cuDeviceGet(devices[rank])  # SITE bindings

    def pin_collector():
        d = ctypes.c_int()
        return libcuda.cuDeviceGet(ctypes.byref(d), 4)  # SITE ctypes

    def collector_thread():
        d = ctypes.c_int()
        libcuda.cuDeviceGet(ctypes.byref(d), 3)  # SITE thread

    cu.cuInit(0)  # SITE init
    place_learner([0, 1, 6, 3], 2)  # SITE module
    pin_collector()
    t = threading.Thread(target=collector_thread, name="collector")
    t.start()
    t.join()
    print("done")
""")


def write(tmp_path: pathlib.Path, name: str, text: str) -> pathlib.Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def site_line(text: str, marker: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if line.rstrip().endswith(f"# SITE {marker}"):
            return i
    raise AssertionError(f"no # SITE {marker} line")


def lines(err: str, call: str) -> list[str]:
    return [ln for ln in err.splitlines() if "RANKGUARD" in ln and f" {call}(" in ln]


def by_args(audit: list[dict], args: str) -> list[dict]:
    return [r for r in audit if r.get("args") == args and not r.get("summary")]


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    d = tmp_path_factory.mktemp("legacy")
    script = write(d, "legacy_cfg.py", LEGACY)
    r = guarded([PYTHON, script], d, cvd="0,1,2,3,4,5,6,7", mode="warn", timeout=120)
    assert r.rc == 0 and "done" in r.out, r.out + r.err
    return script, r


def test_cuda_bindings_line_names_the_users_line_and_function(legacy):
    script, r = legacy
    n = site_line(LEGACY, "bindings")
    [line] = [ln for ln in lines(r.err, "cuDeviceGet") if "ordinal=6" in ln]
    assert f"; at {script}:{n} in place_learner; fix: " in line, line
    [rec] = by_args(r.audit, "ordinal=6")
    assert rec["site"] == f"{script}:{n} in place_learner"
    # py_stack runs down from <module> to the site, like a traceback.
    assert rec["py_stack"] == [f"{script}:{site_line(LEGACY, 'module')} in <module>",
                               rec["site"]], rec["py_stack"]
    assert "py_stack_cut" not in rec
    assert 1 <= len(rec["native_stack"]) <= 16


def test_a_second_site_of_the_same_call_is_printed_with_its_own_line(legacy):
    script, r = legacy
    n = site_line(LEGACY, "ctypes")
    [line] = [ln for ln in lines(r.err, "cuDeviceGet") if "ordinal=4" in ln]
    assert f"; at {script}:{n} in pin_collector; fix: " in line, line
    [rec] = by_args(r.audit, "ordinal=4")
    assert rec["site"] == f"{script}:{n} in pin_collector"
    assert rec["py_stack"][0].endswith(" in <module>")
    # R1 at cuInit names the line that initialised CUDA.
    [init] = lines(r.err, "cuInit")
    assert f"; at {script}:{site_line(LEGACY, 'init')} in <module>; fix: " in init, init


def test_a_call_from_another_python_thread_names_that_threads_frame(legacy):
    script, r = legacy
    n = site_line(LEGACY, "thread")
    [line] = [ln for ln in lines(r.err, "cuDeviceGet") if "ordinal=3" in ln]
    assert f"; at {script}:{n} in collector_thread; fix: " in line, line
    [rec] = by_args(r.audit, "ordinal=3")
    assert rec["tid"] != rec["pid"]
    assert rec["py_stack"][-1] == f"{script}:{n} in collector_thread"
    # The thread's own stack: threading's bootstrap, not the main thread's <module>.
    assert rec["py_stack"][0].endswith(" in _bootstrap"), rec["py_stack"]
    assert not any("<module>" in f for f in rec["py_stack"])


def _pythons():
    """Every CPython 3.10+ on this machine (the venv's, Debian's, pyenv's): the site
    must come out the same on each (README: supported versions)."""
    found = {os.path.realpath(PYTHON): PYTHON}
    for pat in ["/usr/bin/python3.1[0-9]", os.path.expanduser("~/.pyenv/versions/3.1*/bin/python3.1[0-9]")]:
        for p in sorted(glob.glob(pat)):
            if re.fullmatch(r"python3\.1\d", os.path.basename(p)):
                found.setdefault(os.path.realpath(p), p)
    return sorted(found.values())


CTYPES_ONLY = textwrap.dedent("""\
    import ctypes, sys, threading
    sys.setrecursionlimit(30000)
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuInit(0)

    def legacy():
        d = ctypes.c_int()
        return lib.cuDeviceGet(ctypes.byref(d), 1)  # SITE get

    def in_thread():
        d = ctypes.c_int()
        return lib.cuDeviceGet(ctypes.byref(d), 2)  # SITE thread

    def down(n):
        if n == 0:
            d = ctypes.c_int()
            return lib.cuDeviceGet(ctypes.byref(d), 3)  # SITE deep
        return down(n - 1)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    down(10000)
    print("rc", legacy(), sys.version_info[:2])
""")


# CPython exports `_Py_DumpTraceback` (faulthandler's GIL-free dump) in 3.11 and 3.12; 3.13
# hides it but publishes its frame layout (`_PyRuntime.debug_offsets`, src/guard/1_sys/pyframes.rs).
# 3.10 has neither (README).
PY_SITE_VERSIONS = {(3, 11), (3, 12), (3, 13)}


@pytest.mark.parametrize("python", _pythons())
def test_python_site_on_every_cpython_here(tmp_path, python):
    script = write(tmp_path, "cfg.py", CTYPES_ONLY)
    r = guarded([python, "-S", script], tmp_path, cvd="0,1", mode="warn", timeout=60)
    assert r.rc == 0, r.out + r.err
    version = tuple(int(x) for x in re.search(r"\((\d+), (\d+)\)", r.out).groups())
    [rec] = by_args(r.audit, "ordinal=1")
    if version in PY_SITE_VERSIONS:
        assert rec["site"] == f"{script}:{site_line(CTYPES_ONLY, 'get')} in legacy", (python, rec)
        assert rec["py_stack"][0].endswith(" in <module>")
        # Another thread: its own frames, from threading's bootstrap.
        [t] = by_args(r.audit, "ordinal=2")
        assert t["site"] == f"{script}:{site_line(CTYPES_ONLY, 'thread')} in in_thread", t
        assert t["py_stack"][0].endswith(" in _bootstrap"), t["py_stack"]
        # 10,000 frames deep: cut, never walked whole.
        [d] = by_args(r.audit, "ordinal=3")
        assert d["site"] == f"{script}:{site_line(CTYPES_ONLY, 'deep')} in down", d
        assert len(d["py_stack"]) == 32 and d["py_stack_cut"] is True
    else:
        # No GIL-free traceback here: the native site (ctypes' call), never a crash.
        assert "py_stack" not in rec and rec["site"] and ".py:" not in rec["site"], rec


def test_c_program_names_the_executable_and_main(tmp_path):
    r = guarded([prog("guard_volume"), "main"], tmp_path, cvd="0,1", mode="warn")
    assert r.rc == 0, r.out + r.err
    [line] = lines(r.err, "cuDeviceGet")
    assert re.search(r"; at guard_volume\(main\+0x[0-9a-f]+\); fix: ", line), line
    [rec] = by_args(r.audit, "ordinal=7")
    assert re.fullmatch(r"guard_volume\(main\+0x[0-9a-f]+\)", rec["site"]), rec
    assert "py_stack" not in rec
    assert rec["native_stack"][0] == rec["site"]
    # Enforce mode: the denial line names it too.
    r = guarded([prog("guard_volume"), "main"], tmp_path, cvd="0", mode="enforce")
    [line] = lines(r.err, "cuDeviceGet")
    assert "denied" in line and re.search(r"; at guard_volume\(main\+0x[0-9a-f]+\); fix: ", line), line


def test_runtime_calls_name_the_programs_frame_not_the_runtimes(tmp_path):
    """cudaSetDevice(1) in warn mode: the runtime's own driver calls for it are violations
    too; their site is the program's frame, past libcudart and the guard."""
    r = guarded([prog("guard_volume"), "cudart", "3"], tmp_path, cvd="0,1", mode="warn")
    assert r.rc == 0, r.out + r.err
    sites = {rec["call"]: rec["site"] for rec in r.audit}
    assert set(sites) >= {"cudaSetDevice", "cuDeviceGet"}, sites
    for call, site in sites.items():
        if call != "cuInit":
            assert re.fullmatch(r"guard_volume\(main\+0x[0-9a-f]+\)", site), (call, site)


def test_report_groups_each_call_by_site_text_and_json(tmp_path, legacy):
    script, r0 = legacy
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "py.jsonl").write_text("".join(json.dumps(x) + "\n" for x in r0.audit))
    c = guarded([prog("guard_volume"), "loop", "3"], tmp_path, cvd="0,1", mode="warn")
    (audit / "c.jsonl").write_text("".join(json.dumps(x) + "\n" for x in c.audit))
    p = run([CLI, "report", audit])
    assert p.returncode == 1, p.stdout + p.stderr
    n = site_line(LEGACY, "bindings")
    # A process without rank variables is named by its rank root (itself here: no guarded
    # ancestor), `root host:pid`, the report's one way of naming a rank without a number.
    root = r"rank root [^\s,]+:\d+"
    assert re.search(rf"\n    at {re.escape(str(script))}:{n} in place_learner: 1 warned in {root}, from 1 process\n",
                     p.stdout), p.stdout
    assert f"    at {script}:{site_line(LEGACY, 'ctypes')} in pin_collector: 1 warned" in p.stdout
    assert re.search(rf"\n    at guard_volume\(site_a\+0x[0-9a-f]+\): 3 warned in {root}, from 1 process\n", p.stdout), p.stdout
    j = json.loads(run([CLI, "report", "--json", audit]).stdout)
    [g] = [g for g in j["groups"] if g["call"] == "cuDeviceGet"]
    sites = {s["site"]: s["count"] for s in g["sites"]}
    assert sites[f"{script}:{n} in place_learner"] == 1
    assert sum(sites.values()) == g["count"] == 6, g
    [c_site] = [s for s in g["sites"] if s["site"].startswith("guard_volume(site_a")]
    assert c_site["count"] == 3 and c_site["ranks"] == [None] and c_site["processes"] == 1
    assert c_site["first"]["args"] == "ordinal=1"
    py_site = next(s for s in g["sites"] if s["site"].endswith("in place_learner"))
    assert py_site["first"]["py_stack"][-1] == py_site["site"]


# --------------------------------------------------------------------------- torture

def _all_lines_whole(audit_file: pathlib.Path) -> list[dict]:
    text = audit_file.read_text()
    assert text.endswith("\n")
    return [r for r in map(json.loads, text.splitlines()) if r.get("kind") != "map"]


def test_64_python_threads_violating_at_once(tmp_path):
    script = write(tmp_path, "hammer.py", textwrap.dedent("""\
        import ctypes, threading
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuInit(0)
        go = threading.Barrier(64)

        def hammer():
            d = ctypes.c_int()
            go.wait()
            for _ in range(40):
                lib.cuDeviceGet(ctypes.byref(d), 1)  # SITE hammer

        ts = [threading.Thread(target=hammer) for _ in range(64)]
        for t in ts: t.start()
        for t in ts: t.join()
        print("done")
    """))
    r = guarded([PYTHON, script], tmp_path, cvd="0,1", mode="warn", timeout=120)
    assert r.rc == 0 and "done" in r.out, r.out + r.err
    audit = next(tmp_path.glob("audit-*.jsonl"))
    recs = _all_lines_whole(audit)
    get = [x for x in recs if x["call"] == "cuDeviceGet"]
    assert {x["site"] for x in get} == {f"{script}:10 in hammer"}
    assert all(x["summary"] for x in get if "count" in x)
    assert sum(x.get("count", 1) for x in get) == 64 * 40
    assert len(lines(r.err, "cuDeviceGet")) == 1


def test_a_thread_without_python_frames_in_a_python_process(tmp_path):
    lib = TESTS / "libnopy_thread.so"
    assert lib.exists(), "make -C c-tests"
    script = write(tmp_path, "nopy.py", textwrap.dedent(f"""\
        import ctypes
        ctypes.CDLL("libcuda.so.1").cuInit(0)
        print("rc", ctypes.CDLL({str(lib)!r}).violate_from_c_thread())
    """))
    r = guarded([PYTHON, script], tmp_path, cvd="0,1", mode="warn", timeout=60)
    assert r.rc == 0 and "rc 0" in r.out, r.out + r.err
    [rec] = by_args(r.audit, "ordinal=1")
    assert re.fullmatch(r"libnopy_thread\.so\(c_thread\+0x[0-9a-f]+\)", rec["site"]), rec
    assert "py_stack" not in rec


def test_a_process_that_forks_right_after(tmp_path):
    script = write(tmp_path, "forker.py", textwrap.dedent("""\
        import ctypes, os, sys
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuInit(0)
        d = ctypes.c_int()
        for _ in range(150):
            lib.cuDeviceGet(ctypes.byref(d), 1)  # SITE parent
        pid = os.fork()
        if pid == 0:
            for _ in range(120):
                lib.cuDeviceGet(ctypes.byref(d), 1)  # SITE child
            sys.exit(0)
        _, st = os.waitpid(pid, 0)
        print("child", st)
    """))
    r = guarded([PYTHON, script], tmp_path, cvd="0,1", mode="warn", timeout=60)
    assert r.rc == 0 and "child 0" in r.out, r.out + r.err
    recs = _all_lines_whole(next(tmp_path.glob("audit-*.jsonl")))
    get = [x for x in recs if x["call"] == "cuDeviceGet"]
    pids = {x["pid"] for x in get}
    assert len(pids) == 2
    for pid in pids:
        mine = [x for x in get if x["pid"] == pid]
        total = sum(x.get("count", 1) for x in mine)
        [site] = {x["site"] for x in mine}
        # The child starts its own count: its own first records, its own line.
        assert (total, site.split(" in ")[0].rsplit(":", 1)[1]) in {(150, "6"), (120, "10")}, (total, site)
        assert sum(1 for x in mine if not x.get("summary")) == 100
    assert len(lines(r.err, "cuDeviceGet")) == 2
    # The C program: a violation, fork, the child's own violation.
    c = guarded([prog("guard_volume"), "fork"], tmp_path, cvd="0,1", mode="warn")
    assert c.rc == 0 and "child done" in c.out, c.out + c.err
    assert len({x["pid"] for x in c.audit if x["call"] == "cuDeviceGet"}) == 2


def test_a_10000_frame_deep_python_stack_is_cut_not_walked(tmp_path):
    script = write(tmp_path, "deep.py", textwrap.dedent("""\
        import ctypes, sys
        sys.setrecursionlimit(30000)
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuInit(0)

        def down(n):
            if n == 0:
                d = ctypes.c_int()
                return lib.cuDeviceGet(ctypes.byref(d), 1)  # SITE deep
            return down(n - 1)

        print("rc", down(10000))
    """))
    r = guarded([PYTHON, script], tmp_path, cvd="0,1", mode="warn", timeout=120)
    assert r.rc == 0 and "rc 0" in r.out, r.out + r.err
    [rec] = by_args(r.audit, "ordinal=1")
    assert rec["site"] == f"{script}:9 in down"
    assert len(rec["py_stack"]) == 32 and rec["py_stack_cut"] is True
    assert rec["py_stack"][-1] == rec["site"]


def test_a_10000_frame_deep_native_stack_is_cut_not_walked(tmp_path):
    r = guarded([prog("guard_volume"), "deep", "10000"], tmp_path, cvd="0,1", mode="warn")
    assert r.rc == 0, r.out + r.err
    [rec] = by_args(r.audit, "ordinal=1")
    assert re.fullmatch(r"guard_volume\(site_a\+0x[0-9a-f]+\)", rec["site"]), rec
    assert len(rec["native_stack"]) == 16 and rec["native_stack_cut"] is True
    assert all(f.startswith("guard_volume(deep+") for f in rec["native_stack"][1:])


def test_long_frames_make_a_long_record_never_a_torn_one(tmp_path):
    """32 frames with 400-character function names in a 300-character directory: every
    frame is capped (with '...'), the record is one valid line."""
    sub = tmp_path / ("d" * 200) / ("e" * 100)
    sub.mkdir(parents=True)
    names = [f"f{i}_" + "x" * 400 for i in range(40)]
    body = ["import ctypes", 'lib = ctypes.CDLL("libcuda.so.1")', "lib.cuInit(0)"]
    for i, nm in enumerate(names):
        nxt = f"{names[i + 1]}()" if i + 1 < len(names) else "lib.cuDeviceGet(ctypes.byref(ctypes.c_int()), 1)"
        body += [f"def {nm}():", f"    return {nxt}"]
    body.append(f"print('rc', {names[0]}())")
    script = write(sub, "long.py", "\n".join(body) + "\n")
    r = guarded([PYTHON, script], tmp_path, cvd="0,1", mode="warn", timeout=60)
    assert r.rc == 0 and "rc 0" in r.out, r.out + r.err
    recs = _all_lines_whole(next(tmp_path.glob("audit-*.jsonl")))
    [rec] = [x for x in recs if x["call"] == "cuDeviceGet"]
    assert len(rec["py_stack"]) == 32 and rec["py_stack_cut"]
    assert all(len(f) <= 300 + len("...[cut]") and f.endswith("...[cut]") for f in rec["py_stack"]), rec["py_stack"][:2]
    assert len(rec["site"]) <= 240
    [line] = lines(r.err, "cuDeviceGet")
    assert "; at " + rec["site"] + "; fix: " in line

"""The guard inside other people's processes: RTLD_NEXT, threads, fork (issue 3)."""
from __future__ import annotations

import re

from _guard import guarded, prog


def test_rtld_next_keeps_its_meaning(tmp_path):
    """Library A asking dlsym(RTLD_NEXT, "probe") gets library B's probe, not its own."""
    plain = guarded([prog("guard_rtld_next")], tmp_path, cvd="0", preload=False)
    r = guarded([prog("guard_rtld_next")], tmp_path, cvd="0")
    assert plain.out.strip() == "next=B"
    assert r.out.strip() == "next=B", r.err


def test_64_threads_race_the_first_guarded_call(tmp_path):
    for _ in range(5):
        r = guarded([prog("guard_race"), "64"], tmp_path, cvd="3")
        assert r.rc == 0, r.out + r.err
        assert r.out.strip() == "ok 64 cuDeviceGet(1)=101"
        assert len([x for x in r.audit if x["call"] == "cuDeviceGet"]) == 64


def test_64_threads_race_r1(tmp_path):
    """A violating process is stopped once, cleanly, however many threads race cuInit."""
    r = guarded([prog("guard_race"), "64"], tmp_path, cvd="0,1")
    assert r.rc == 78, r.out + r.err
    assert len([x for x in r.audit if x["rule"] == "R1"]) == 1


def test_forked_child_initialises_cuda_itself(tmp_path):
    r = guarded([prog("guard_fork")], tmp_path, cvd="3", timeout=20)
    assert r.rc == 0, r.out + r.err
    parent = int(re.search(r"parent pid=(\d+)", r.out).group(1))
    child = int(re.search(r"child pid=(\d+)", r.out).group(1))
    assert "cuDeviceGet(1)=101 cuDeviceGet(0)=0" in r.out
    assert "child status=0" in r.out
    pids = [x["pid"] for x in r.audit if x["call"] == "cuDeviceGet"]
    assert pids == [parent, child]
    # each process says its own first violation on stderr, with its own pid
    assert f":{parent}:" in r.err and f":{child}:" in r.err


def test_a_forked_child_says_its_own_once_per_process_lines(tmp_path):
    """"Said once per process" is once per pid (src/guard/1_sys/lifecycle.rs, `PerProcess`): a
    child forked after its parent said a configuration warning says it again at its own
    first violation, with its own pid, instead of inheriting the parent's "said"."""
    r = guarded([prog("guard_fork")], tmp_path, cvd="3", timeout=20, RANKGUARD_IPC="bogus")
    assert r.rc == 0, r.out + r.err
    parent = int(re.search(r"parent pid=(\d+)", r.out).group(1))
    child = int(re.search(r"child pid=(\d+)", r.out).group(1))
    said = [ln for ln in r.err.splitlines() if 'RANKGUARD_IPC="bogus" is not valid' in ln]
    pids = [int(ln.split(":")[1]) for ln in said]
    assert pids == [parent, child], r.err


def test_audit_appends_from_many_processes_never_interleave(tmp_path):
    import subprocess, json
    from conftest import GUARD, clean_env
    audit = tmp_path / "shared.jsonl"
    env = clean_env(CUDA_VISIBLE_DEVICES="3", RANKGUARD_AUDIT=str(audit), LD_PRELOAD=str(GUARD))
    procs = [subprocess.Popen([str(prog("guard_race")), "32"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(8)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    lines = [ln for ln in audit.read_text().splitlines() if '"kind":"map"' not in ln]
    assert len(lines) == 8 * 32
    for line in lines:
        rec = json.loads(line)
        assert rec["call"] == "cuDeviceGet" and rec["verdict"] == "deny"


def test_runtime_loaded_privately_is_found(tmp_path):
    """A runtime outside the global scope (a dependency of a library dlopen'ed with
    RTLD_LOCAL, as PyTorch loads libcudart): the wrapper still finds the real function."""
    from conftest import TESTS
    ok = guarded([prog("guard_local_rt"), TESTS, "0"], tmp_path, cvd="3")
    assert ok.out.strip() == "rc=0", ok.out + ok.err
    bad = guarded([prog("guard_local_rt"), TESTS, "1"], tmp_path, cvd="3")
    assert bad.out.strip() == "rc=101", bad.out + bad.err
    assert [r["call"] for r in bad.audit] == ["cudaSetDevice"]


def test_missing_real_function_is_a_defined_error(tmp_path):
    """No libcuda.so.1 to be found: a guarded call reached through the guard's export
    returns CUDA_ERROR_NOT_FOUND (500) and says which library lacks it, never crashes."""
    from conftest import GUARD, PYTHON, clean_env, run
    code = ("import ctypes; f = ctypes.CDLL(None).cuDeviceGet; d = ctypes.c_int(); "
            "print('rc=%d' % f(ctypes.byref(d), 0)); print('rc=%d' % f(ctypes.byref(d), 0))")
    env = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0", LD_LIBRARY_PATH=None)
    r = run([PYTHON, "-c", code], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["rc=500", "rc=500"]
    lines = [l for l in r.stderr.splitlines() if "RANKGUARD" in l]
    assert len(lines) == 1 and "cuDeviceGet: the real function was not found in libcuda.so.1" in lines[0]

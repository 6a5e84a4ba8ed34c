"""An exporter's provenance records go when it ends (issue 33: the registry bounded by what
is alive; src/guard/7_decide/own_records.rs).

An exported handle opens only while its exporter lives, so its records are dead weight once
it has gone. Before, only its rank record went at exit (and an event's record when the event
was destroyed): every other record stayed until a sweep met it, and a learner that shared a
thousand tensors left a thousand. Now a process removes the records it wrote when it exits
and before it execs, whatever their kind; a forked child never removes its parent's; a
process that dies by a signal leaves them to the sweeps, as before
(test_ipc.py::test_records_of_dead_exporters_are_cleaned_up).
"""
from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from _handle_table import names
from _ipc import PEER, exporter, guard_env
from conftest import PYTHON, ROOT, run


def records(tmp) -> list[str]:
    """The registry's handle records (not rank records, not the overflow mark), by name:
    the files and the handle table's records."""
    reg = tmp / "registry"
    if not reg.exists():
        return []
    return sorted(names(reg))


# Each kind ipc_peer exports, and the tag of the record it writes (a pool writes two: the
# pool's fd and the allocation's export data).
KINDS = {
    "mem": ("mem-",), "rtmem": ("mem-",), "event": ("event-",), "rtevent": ("event-",),
    "vmm": ("vmmfd-",), "vmmhost": ("vmmfd-",), "pool": ("poolfd-", "poolptr-"), "dmabuf": ("dmabuf-",),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_exporters_records_are_gone_after_it_exits(tmp_path, kind):
    """While the exporter lives its record is there (an importer needs it); after its normal
    exit, none is left. Before the fix every kind but the event's stayed."""
    env = guard_env(tmp_path, "0", 0)
    with exporter(tmp_path, kind, env):
        during = records(tmp_path)
        assert sorted({n.split("-")[0] + "-" for n in during}) == sorted(KINDS[kind]), during
    assert records(tmp_path) == [], "left after the exporter's exit"


# cuda-bindings: export memory and an event, then fork a child that exports its own and
# exits, then exit or exec a shell that lists the registry.
BINDINGS = """
import os, sys
from cuda.bindings import driver as cu
def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, r
    return r[1:] if isinstance(r, tuple) else None
reg, how, tests = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tests)
from _handle_table import names as listed
names = lambda: listed(reg)
ok(cu.cuInit(0))
(dev,) = ok(cu.cuDeviceGet(0))
(ctx,) = ok(cu.cuDevicePrimaryCtxRetain(dev))
ok(cu.cuCtxSetCurrent(ctx))
(ptr,) = ok(cu.cuMemAlloc(1 << 20))
ok(cu.cuIpcGetMemHandle(ptr))
flags = cu.CUevent_flags.CU_EVENT_INTERPROCESS | cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
(ev,) = ok(cu.cuEventCreate(flags))
ok(cu.cuIpcGetEventHandle(ev))
print("parent", len(names()), flush=True)
child = os.fork()
if child == 0:
    ok(cu.cuIpcGetEventHandle(ok(cu.cuEventCreate(flags))[0]))
    print("child", len(names()), flush=True)
    sys.exit(0)
os.waitpid(child, 0)
print("after-child", len(names()), flush=True)
if how == "exec":
    code = f"import sys; sys.path.insert(0, {tests!r}); from _handle_table import names; print('after-exec', len(names({reg!r})))"
    os.execv(sys.executable, [sys.executable, "-c", code])
"""


@pytest.mark.parametrize("how", ["exit", "exec"])
def test_records_go_at_exit_and_exec_and_a_forked_child_takes_only_its_own(tmp_path, how):
    """NVIDIA's cuda-bindings: two records (memory, event); a forked child adds one and
    exits, removing its own only; the parent's go at its exit, or before its exec (the new
    program cannot know it has them)."""
    env = guard_env(tmp_path, "0", 0)
    p = run([PYTHON, "-c", BINDINGS, str(tmp_path / "registry"), how, ROOT / "python-tests"], env=env,
            timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.split("\n")
    assert "parent 2" in lines and "child 3" in lines and "after-child 2" in lines, p.stdout
    if how == "exec":
        assert "after-exec 0" in lines, p.stdout
    assert records(tmp_path) == []


def test_the_registry_of_1000_short_exporters_holds_only_the_live_ones(tmp_path):
    """Two long-lived exporters and 1,000 short ones (each exports memory and exits), 16 at a
    time: afterwards the registry holds the two live exporters' records and nothing else."""
    env = guard_env(tmp_path, "0", 0)
    with exporter(tmp_path, "mem", env, name="a"), exporter(tmp_path, "event", env, name="b"):
        live = records(tmp_path)
        assert len(live) == 2, live
        (tmp_path / "short").mkdir()

        def one(_):
            return subprocess.run([str(PEER), "export", "rtmem", str(tmp_path / "short")], env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=60).returncode

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(one, range(1000)))
        assert codes == [0] * 1000
        assert records(tmp_path) == live
    assert records(tmp_path) == []

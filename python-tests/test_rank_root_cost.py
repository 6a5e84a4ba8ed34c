"""The rank root at bounded cost, and rank records that go with their process (issue 33).

- The first cuInit without rank variables reads no /proc file of a guarded ancestor: the
  lineage note each guarded exec hands down names them (docs/design.md §1, "The walk's cost",
  "The lineage note"). Of other processes it reads the environment of the one unguarded
  process above them, where the walk ends (not its stat: an unguarded process without a
  rank record ends the walk whatever its stat says), and looks up one rank record by name,
  the rest from the registry's start-up sweep: counted with strace at depths 1 and 8, the
  same. Of its own it reads no /proc file: its parent from getppid, its start environment
  from its memory (test_start_env.py). Where no note could be written, it reads each
  guarded ancestor's environment and stat, as before the note.
- A guarded process started on its GPU owes its rank record until it starts a child (its
  start environment tells a walk the same root; docs/design.md §1, "The rank record"), and
  writes it before the child can walk. A rank record (`rank-<pid>`) is removed when its
  process exits or execs, and the registry of a run of 1,000 short processes holds only
  the live ones.
"""
from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from _guard import prog
from conftest import GUARD, PYTHON, clean_env, run

# A chain of processes: `python CHAIN_FILE N ENV_JSON -- cmd...` starts itself N times, each
# level a child of the one before with the environment ENV_JSON (the top level keeps its
# own), and the innermost level runs cmd; every level exits with its child's status.
CHAIN = """
import json, subprocess, sys
n, env = int(sys.argv[1]), json.loads(sys.argv[2])
cmd = sys.argv[sys.argv.index("--") + 1:]
argv = [sys.executable, __file__, str(n - 1), sys.argv[2], "--", *cmd] if n else cmd
sys.exit(subprocess.run(argv, env=env).returncode)
"""


def registry(tmp: pathlib.Path) -> pathlib.Path:
    reg = tmp / "registry"
    reg.mkdir(mode=0o700, parents=True, exist_ok=True)
    return reg


def guarded_env(tmp: pathlib.Path, **extra) -> dict[str, str]:
    """Plain LD_PRELOAD, no rank variables, a 64 KiB environment without CVD."""
    pad = {f"PAD_{i:02d}": "x" * 1000 for i in range(64)}
    return clean_env(LD_PRELOAD=str(GUARD), FAKECUDA_GPUS="2", RANKGUARD_MODE="enforce",
                     RANKGUARD_REGISTRY=str(registry(tmp)), CUDA_VISIBLE_DEVICES=None, **pad, **extra)


def opens_at_first_cuinit(tmp: pathlib.Path, depth: int) -> dict:
    """Run guard_init (CUDA_VISIBLE_DEVICES=0: its own rank root) under `depth` guarded
    ancestors with 64 KiB environments (depth - 1 chain levels, then strace, which traces
    it), below one unguarded process (the chain's top). Returns what its first cuInit read
    of other processes (`procs`: the /proc files it opened, `vm`: the pids whose memory it
    read with process_vm_readv), the rank records it looked up by name and did not find
    (`probes`), the number of files it opened and of opens that failed, the lines that
    open its own /proc files or the registry directory itself (`own`), and its `uname`
    calls (`uname`: the host name, which only a record or a line that names the root
    needs)."""
    strace = shutil.which("strace")
    assert strace, "this test counts open(2) calls with strace: install it (apt-get install strace)"
    tmp = tmp / f"depth-{depth}"
    env = guarded_env(tmp)
    trace = tmp / "strace.txt"
    leaf = [strace, "-qq", "-e", "trace=open,openat,process_vm_readv,uname", "-o", trace,
            "-E", "CUDA_VISIBLE_DEVICES=0", prog("guard_init")]
    top = clean_env(LD_PRELOAD=None)        # the unguarded top of the tree
    chain = tmp / "chain.py"
    chain.write_text(CHAIN)
    p = run([PYTHON, chain, str(depth - 1), json.dumps(env), "--", *leaf], env=top, timeout=120)
    assert p.returncode == 0 and "cuInit=0" in p.stdout, p.stdout + p.stderr
    lines = trace.read_text().splitlines()
    opens = [l for l in lines if re.match(r"open(at)?\(", l)]
    opened = [l for l in opens if re.search(r"\) = \d+$", l)]
    reg = str(registry(tmp))
    return {
        "procs": [m.group(0) for l in opened for m in [re.search(r'"/proc/\d+/[a-z]+"', l)] if m],
        "vm": [int(m.group(1)) for l in lines for m in [re.match(r"process_vm_readv\((\d+),", l)] if m],
        # the registry look-up of an ancestor's rank record: absent, one open that fails
        "probes": [int(m.group(1)) for l in opens if "ENOENT" in l
                   for m in [re.search(r'/registry/rank-(\d+)"', l)] if m],
        "opened": len(opened),
        "failed": len(opens) - len(opened),
        "own": [l for l in opens if '"/proc/self/' in l or f'"{reg}"' in l],
        "uname": [l for l in lines if l.startswith("uname(")],
    }


def test_the_first_cuinit_reads_a_constant_of_the_tree_above_it(tmp_path):
    """At depth 1 and 8 alike (docs/design.md §1, "The walk's cost" and "The lineage
    note"): the guarded ancestors are named by the lineage note each guarded exec hands
    down, so of other processes the first cuInit reads only the unguarded one above them,
    where the walk ends: its /proc/<pid>/environ, not its stat (before: its stat, then its
    environment by process_vm_readv); no /proc file of any guarded ancestor (before the
    note: its stat and its environment, 64 KiB each here). One rank record is looked up by
    name (the note's first member's: one open that fails), the rest from the registry's
    start-up sweep (the directory read once). Of its own it opens no /proc file (before:
    /proc/self/stat), and it writes no rank record (it owes it: it starts no child) and
    asks no host name (before: one `uname` for the root it found, named by no line)."""
    seen = {}
    for depth in (1, 8):
        r = opens_at_first_cuinit(tmp_path, depth)
        pids = {int(re.search(r"/proc/(\d+)/", f).group(1)) for f in r["procs"]} | set(r["vm"])
        assert len(pids) == 1, (depth, r["procs"], r["vm"])
        (top,) = pids
        assert r["procs"] == [f'"/proc/{top}/environ"'], r["procs"]
        assert r["vm"] == [], r["vm"]
        assert len(r["probes"]) == 1 and top not in r["probes"], r["probes"]
        files = sorted(re.search(r'"([^"]*)"', l).group(1) for l in r["own"])
        assert files == [str(registry(tmp_path / f"depth-{depth}"))], r["own"]
        assert all(re.search(r"\) = \d+$", l) for l in r["own"]), r["own"]
        assert list(registry(tmp_path / f"depth-{depth}").glob("rank-*")) == []
        assert r["uname"] == [], r["uname"]
        seen[depth] = (r["opened"], r["failed"], len(r["vm"]))
    # everything the first cuInit opens, or tries to, is the same at both depths: a constant
    assert seen[8] == seen[1], seen


# The chain, each level starting the next from a child it forked first (os.fork, then
# subprocess): the exec happens in a grandchild of the level's image, which writes no note.
FORKED_CHAIN = CHAIN.replace("sys.exit(subprocess.run(argv, env=env).returncode)", """import os
pid = os.fork()
if pid == 0:
    os._exit(subprocess.run(argv, env=env).returncode)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))""")


def test_without_the_note_the_walk_reads_each_guarded_ancestor(tmp_path):
    """The lineage note is an economy, never a decision of its own: where no guarded exec
    could write one (each level starts the next from a child it forked first, so the exec
    runs in a grandchild of the level's image, which does not know the image's parent), the
    walk reads each guarded ancestor's environment and stat as it did before the note, and
    ends at the same unguarded process: strace (whose own exec writes the program a note
    naming it), then the three levels' images and forked children (environment and stat),
    then the top's forked child (unguarded: its environment only) are read: 7 processes."""
    strace = shutil.which("strace")
    assert strace
    tmp = tmp_path / "unnoted"
    env = guarded_env(tmp)
    trace = tmp / "strace.txt"
    leaf = [strace, "-qq", "-e", "trace=open,openat,process_vm_readv", "-o", trace,
            "-E", "CUDA_VISIBLE_DEVICES=0", prog("guard_init")]
    chain = tmp / "chain.py"
    chain.write_text(FORKED_CHAIN)
    p = run([PYTHON, chain, "3", json.dumps(env), "--", *leaf], env=clean_env(LD_PRELOAD=None), timeout=120)
    assert p.returncode == 0 and "cuInit=0" in p.stdout, p.stdout + p.stderr
    lines = trace.read_text().splitlines()
    stats = [int(m.group(1)) for l in lines for m in [re.search(r'"/proc/(\d+)/stat"', l)] if m]
    envs = {int(m.group(1)) for l in lines for m in [re.match(r"process_vm_readv\((\d+),", l)] if m}
    envs |= {int(m.group(1)) for l in lines for m in [re.search(r'"/proc/(\d+)/environ"', l)] if m}
    assert len(envs) == 7 and len(stats) == 6 and set(stats) < envs, (stats, sorted(envs))


# ------------------------------------------------------------------ records end with their process

LIVES = """
import os, subprocess, sys
from cuda.bindings import driver as d
assert int(d.cuInit(0)[0]) == 0
reg = sys.argv[1]
rec = os.path.join(reg, f"rank-{os.getpid()}")
# owed until a child can walk: written before this one starts (subprocess: a vfork child's exec)
print("owed", not os.path.exists(rec), flush=True)
subprocess.run(["/bin/true"], check=True)
print("during", os.path.exists(rec), flush=True)
how = sys.argv[2]
if how == "exec-unguarded":
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    os.execve("/bin/sh", ["sh", "-c", f'test -e "{reg}/rank-$$" && echo after-exec kept || echo after-exec gone'], env)
if how == "exec-guarded":
    os.execv("/bin/sh", ["sh", "-c", f'test -e "{reg}/rank-$$" && echo after-exec kept || echo after-exec gone'])
if how == "wait":
    sys.stdin.read()
print("pid", os.getpid())
"""


@pytest.mark.parametrize("how", ["exit", "exec-unguarded", "exec-guarded"])
def test_a_rank_record_is_gone_when_its_process_ends(tmp_path, how):
    """A guarded process on one GPU, no rank variables: its rank record is owed until it
    starts a child, exists from then while it runs, and is gone after it exits or execs (the
    new program, guarded or not, records again at its own first cuInit). Before the fix the
    record stayed until a sweep."""
    reg = registry(tmp_path)
    env = clean_env(LD_PRELOAD=str(GUARD), FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="0",
                    RANKGUARD_REGISTRY=str(reg))
    p = run([PYTHON, "-c", LIVES, reg, how], env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "owed True" in p.stdout and "during True" in p.stdout, p.stdout + p.stderr
    if how.startswith("exec"):
        assert "after-exec gone" in p.stdout, p.stdout
    assert list(reg.glob("rank-*")) == [], list(reg.iterdir())


OWED = """
import os, subprocess, sys
from cuda.bindings import driver as d
assert int(d.cuInit(0)[0]) == 0
reg, how = sys.argv[1], sys.argv[2]
rec = os.path.join(reg, f"rank-{os.getpid()}")
print("owed", not os.path.exists(rec), flush=True)
# the child looks for its parent's record itself, as its walk would
check = ["/bin/sh", "-c", f'test -e "{rec}" && echo child-sees written || echo child-sees missing']
if how == "subprocess":
    subprocess.run(check, check=True)
elif how == "posix_spawn":
    os.waitpid(os.posix_spawn(check[0], check, dict(os.environ)), 0)
elif how == "fork":
    c = os.fork()
    if c == 0:
        print("child-sees", "written" if os.path.exists(rec) else "missing", flush=True)
        os._exit(0)
    os.waitpid(c, 0)
print("parent-sees", os.path.exists(rec), flush=True)
"""


@pytest.mark.parametrize("how", ["subprocess", "posix_spawn", "fork"])
def test_an_owed_record_is_written_before_a_child_can_walk(tmp_path, how):
    """A guarded process started on its GPU (its start environment names its rank) owes its
    rank record: none after its first cuInit, and it is there when a child started any way
    the guard sees runs: Python's subprocess (a vfork child's exec writes it for its
    parent), posix_spawn (the hook, in the parent), fork (the prepare handler). The parent
    keeps it and removes it at exit (docs/design.md §1, "The rank record")."""
    reg = registry(tmp_path)
    env = clean_env(LD_PRELOAD=str(GUARD), FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="0",
                    RANKGUARD_REGISTRY=str(reg))
    p = run([PYTHON, "-c", OWED, reg, how], env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split("\n")[:3] == ["owed True", "child-sees written", "parent-sees True"], p.stdout
    assert list(reg.iterdir()) == [], list(reg.iterdir())


def test_a_forked_child_leaves_its_parents_record(tmp_path):
    """The exit handler is inherited across fork: a child that exits must not remove the
    record of the parent that wrote it."""
    code = LIVES.replace('print("pid", os.getpid())',
                         'c = os.fork()\nif c == 0:\n    sys.exit(0)\nos.waitpid(c, 0)\n'
                         'print("after-child", os.path.exists(os.path.join(reg, f"rank-{os.getpid()}")))')
    reg = registry(tmp_path)
    env = clean_env(LD_PRELOAD=str(GUARD), FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="0",
                    RANKGUARD_REGISTRY=str(reg))
    p = run([PYTHON, "-c", code, reg, "exit"], env=env, timeout=60)
    assert p.returncode == 0 and "after-child True" in p.stdout, p.stdout + p.stderr
    assert list(reg.glob("rank-*")) == []


def test_the_registry_of_1000_short_processes_holds_only_the_live_ones(tmp_path):
    """Three long-lived guarded processes and 1,000 short ones (guard_repoint 0, each given
    its GPU in-process, so each records its rank at its first cuInit, as Ray's workers do),
    16 at a time: afterwards the registry holds exactly the three live processes' records."""
    reg = registry(tmp_path)
    env = clean_env(LD_PRELOAD=str(GUARD), FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="0",
                    RANKGUARD_REGISTRY=str(reg))
    live = [subprocess.Popen([PYTHON, "-c", LIVES, str(reg), "wait"], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        for l in live:
            assert [l.stdout.readline().strip() for _ in range(2)] == ["owed True", "during True"]
        short = [str(prog("guard_repoint")), "0"]
        short_env = dict(env)
        short_env.pop("CUDA_VISIBLE_DEVICES")
        # each writes its record (the registry's directory grows while they run)
        probe = run(short, env=dict(short_env, RANKGUARD_DEBUG="DEBUG"), timeout=60)
        assert "recorded this process's rank root" in probe.stderr, probe.stderr

        def one(_):
            return subprocess.run(short, env=short_env, capture_output=True, text=True, timeout=60).returncode

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(one, range(1000)))
        assert codes == [0] * 1000
        names = sorted(p.name for p in reg.iterdir())
        assert names == sorted(f"rank-{l.pid}" for l in live), names[:20]
    finally:
        for l in live:
            l.kill()
            l.wait(timeout=30)


def test_a_start_up_sweeps_records_of_dead_processes(tmp_path):
    """Records a process could not remove (it died by a signal or _exit): the first
    registry a guarded process opens for a write is swept, within SWEEP_BUDGET entries and
    1 ms, so a few dead records are gone after one guarded start-up that records its rank
    (guard_repoint 0: its GPU given in-process)."""
    reg = registry(tmp_path)
    env = clean_env(LD_PRELOAD=str(GUARD), FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="0",
                    RANKGUARD_REGISTRY=str(reg))
    # a process killed by SIGKILL after its cuInit leaves its record
    k = subprocess.Popen([PYTHON, "-c", LIVES, str(reg), "wait"], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert [k.stdout.readline().strip() for _ in range(2)] == ["owed True", "during True"]
    k.kill()
    k.wait(timeout=30)
    assert [p.name for p in reg.glob("rank-*")] == [f"rank-{k.pid}"]
    env.pop("CUDA_VISIBLE_DEVICES")
    p = run([prog("guard_repoint"), "0"], env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert list(reg.iterdir()) == [], list(reg.iterdir())

"""The lineage note (docs/design.md §1, "The lineage note"; crates/core/src/lineage.rs):
every guarded exec and posix_spawn hands the program it starts the facts of that program's
guarded ancestors (pid, start time, whether each preloads the guard, each one's initial
CUDA_VISIBLE_DEVICES), so the rank root's walk reads no /proc file of theirs. These tests
check what the note says on every path a real job starts a process by (a shell's vfork,
Python's subprocess with and without env=, os.posix_spawn, exec without a fork), that the
guard's note replaces one the program put in the child's environment, that a note which is
not the reader's is ignored, and that R1 holds through it.
"""
from __future__ import annotations

import json
import os
import pathlib

from _guard import prog
from conftest import GUARD, PYTHON, clean_env, run

# One program, one level per argument: each prints its pid, then starts the next level the
# way its name says; the last prints its note and its parent.
LEVELS = r"""
import json, os, subprocess, sys
levels, env = sys.argv[1:-1], json.loads(sys.argv[-1])
how, rest = levels[0], levels[1:]
print("LEVEL", how, os.getpid(), flush=True)
nxt = [sys.executable, __file__, *rest, sys.argv[-1]]
e = {k: v for k, v in {**os.environ, **env.get(how, {})}.items() if v is not None}
if how == "print":
    note = os.environ.get("RANKGUARD_LINEAGE") or ""
    starts = {}          # the start time of each member, read while they all live
    for m in note.split("/", 2)[-1].partition("^")[0].split(","):
        pid = m.split(".")[0]
        if pid.isdigit():
            stat = open(f"/proc/{pid}/stat").read()
            starts[pid] = int(stat[stat.rindex(")") + 2:].split()[19])
    print("NOTE", json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "note": note,
                              "starts": starts}), flush=True)
elif how == "sh":          # dash starts its command by vfork + execve
    sys.exit(subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *nxt], env=e).returncode)
elif how == "subprocess-env":
    sys.exit(subprocess.run(nxt, env=e).returncode)          # execve
elif how == "subprocess":
    for k, v in env.get(how, {}).items():
        os.environ.pop(k, None) if v is None else os.environ.update({k: v})
    sys.exit(subprocess.run(nxt).returncode)                 # execv (environ)
elif how == "posix_spawn":
    pid = os.posix_spawn(sys.executable, nxt, e)
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
elif how == "exec":
    os.execve(sys.executable, nxt, e)                        # no fork: the same process
"""


def start_time(pid: int) -> int:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def members(note: str) -> tuple[int, list[tuple[int, int, str]], int | None]:
    """(uid, [(pid, start, kind)], above) of a note's value; kind is 'u', 'g' or the CVD."""
    uid, rest = note.split("/", 1)
    rest, _, above = rest.partition("^")
    out = []
    for m in rest.split(","):
        pid, start, kind = m.split(".", 2)
        out.append((int(pid), int(start), bytes.fromhex(kind[1:]).decode() if kind[0] == "c" else kind))
    return int(uid), out, int(above) if above else None


def test_every_way_of_starting_a_process_hands_it_its_guarded_ancestors(tmp_path):
    """The unguarded test runs a guarded chain: sh (vfork) -> subprocess with env= (execve)
    -> subprocess with os.environ (execv) -> os.posix_spawn -> os.execve without a fork ->
    the printer. Its note names its guarded ancestors innermost first, each with its start
    time and its initial CUDA_VISIBLE_DEVICES, then the unguarded test above them (`^`)."""
    levels = ["sh", "subprocess-env", "subprocess", "posix_spawn", "exec", "print"]
    cvds = {"sh": "0,1", "subprocess-env": "1", "subprocess": None, "posix_spawn": "GPU-1",
            "exec": "1"}
    # the CVD each level's child starts with (None: unset)
    env = {how: {"CUDA_VISIBLE_DEVICES": cvd} for how, cvd in cvds.items()}
    script = tmp_path / "levels.py"
    script.write_text(LEVELS)
    base = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0,1")
    p = run([PYTHON, script, *levels, json.dumps(env)], env=base, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    pids = {}
    for line in p.stdout.splitlines():
        if line.startswith("LEVEL "):
            _, how, pid = line.split()
            pids[how] = int(pid)
    note = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("NOTE "))[5:])
    assert note["note"], p.stdout
    uid, got, above = members(note["note"])
    assert uid == os.geteuid()
    # The printer is the `exec` level's process (same pid); its parent started it by
    # posix_spawn. The sh level's python is the first guarded process: its parent, the test.
    assert note["pid"] == pids["exec"] == pids["print"]
    chain = ["posix_spawn", "subprocess", "subprocess-env", "sh"]
    # sh's own process: the sh level's python started /bin/sh, which started the next level
    shells = [m for m in got if m[0] not in {pids[h] for h in chain}]
    assert len(shells) == 1, (got, pids)
    sh_pid = shells[0][0]
    want_order = [pids["posix_spawn"], pids["subprocess"], pids["subprocess-env"], sh_pid, pids["sh"]]
    assert [m[0] for m in got] == want_order, (got, pids)
    for pid, start, _ in got:
        assert start == note["starts"][str(pid)]
    kinds = {pid: kind for pid, _, kind in got}
    # each one's initial CVD: what its parent started it with
    assert kinds[pids["posix_spawn"]] == "g"            # started by `subprocess` with none
    assert kinds[pids["subprocess"]] == "1"             # by `subprocess-env`
    assert kinds[pids["subprocess-env"]] == "0,1"       # by sh, which inherited the sh level's
    assert kinds[sh_pid] == "0,1" and kinds[pids["sh"]] == "0,1"
    assert above == os.getpid()


def test_no_note_where_no_walk_can_use_it(tmp_path):
    """A launcher's ranks (a rank variable set) never walk, and an unguarded program ends
    its descendants' walk: a guarded exec into either writes no note (no cost)."""
    script = tmp_path / "levels.py"
    script.write_text(LEVELS)
    for extra in ({"RANK": "0"}, {"SLURM_PROCID": "3"}, {"LD_PRELOAD": "/lib/x86_64-linux-gnu/libm.so.6"}):
        env = {"subprocess-env": extra}
        base = clean_env(LD_PRELOAD=str(GUARD))
        p = run([PYTHON, script, "subprocess-env", "print", json.dumps(env)], env=base, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        note = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("NOTE "))[5:])
        assert note["note"] == "", (extra, note)


def test_the_guards_note_replaces_one_the_program_hands_its_child(tmp_path):
    """A guarded learner on GPU 0 starts a collector on GPU 1 with a note of its own making
    in the collector's environment, saying the learner is not guarded (so that the walk
    would stop there): the guard's exec drops it and writes the true one, and the collector
    is refused with R1, by subprocess and by posix_spawn alike."""
    forged = f"{os.geteuid()}/{os.getpid()}.1.u"
    for how in ("subprocess-env", "posix_spawn"):
        env = {how: {"CUDA_VISIBLE_DEVICES": "1", "RANKGUARD_LINEAGE": forged}}
        script = tmp_path / "levels.py"
        script.write_text(LEVELS.replace('if how == "print":', 'if how == "init":\n    os.execv(os.environ["GUARD_INIT"], ["guard_init"])\nelif how == "print":'))
        base = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0", FAKECUDA_GPUS="2",
                         RANKGUARD_MODE="enforce", RANKGUARD_REFUSAL_ENDS="process",
                         RANKGUARD_REGISTRY=str(registry(tmp_path)), GUARD_INIT=str(prog("guard_init")))
        p = run([PYTHON, script, how, "init", json.dumps(env)], env=base, timeout=60)
        assert p.returncode == 78, (how, p.stdout, p.stderr)
        assert "R1" in p.stderr, p.stderr


def registry(tmp: pathlib.Path) -> pathlib.Path:
    reg = tmp / "registry"
    reg.mkdir(mode=0o700, exist_ok=True)
    return reg


def guard_init_under_the_test(tmp_path, note: str | None) -> int:
    """guard_init on GPU 0, a child of this (unguarded) test, started with `note`."""
    env = clean_env(LD_PRELOAD=str(GUARD), CUDA_VISIBLE_DEVICES="0", FAKECUDA_GPUS="2",
                    RANKGUARD_MODE="enforce", RANKGUARD_REFUSAL_ENDS="process",
                    RANKGUARD_REGISTRY=str(registry(tmp_path)), RANKGUARD_LINEAGE=note)
    p = run([prog("guard_init")], env=env, timeout=60)
    assert p.returncode in (0, 78), p.stdout + p.stderr
    return p.returncode


def test_a_note_that_is_not_the_readers_is_ignored(tmp_path):
    """The test itself is unguarded: the honest walk finds no rank above guard_init, which
    runs. A note saying its parent is a guarded rank on GPU 1 is used only when it is the
    reader's: its first member the reader's parent, started before it, this user's. Any
    other (another pid, a later start, another uid, not of the form) is ignored, and the
    walk reads /proc: guard_init runs. One that is the reader's is believed as far as the
    walk believed /proc (docs/design.md: a program that writes it on purpose could as well
    start the child without the guard): R1."""
    me, uid, start = os.getpid(), os.geteuid(), start_time(os.getpid())
    assert guard_init_under_the_test(tmp_path, None) == 0
    for note in (f"{uid}/1.1.c31^1",                      # another pid
                 f"{uid}/{me}.{10**15}.c31^1",            # started after the reader
                 f"{uid + 1}/{me}.{start}.c31^1",         # another user's
                 f"{uid}/{me}.{start}.c31",               # not of the form (no end)
                 f"{uid}/{me}.{start}.cZZ^1"):
        assert guard_init_under_the_test(tmp_path, note) == 0, note
    assert guard_init_under_the_test(tmp_path, f"{uid}/{me}.{start}.c31^1") == 78

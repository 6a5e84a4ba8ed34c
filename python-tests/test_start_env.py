"""The start environment (R1's "started with") read from the process's own memory.

The first cuInit reads the CUDA_VISIBLE_DEVICES a process was started with from the
environment block the kernel wrote at exec, in the process's memory
(src/guard/1_sys/start_block.rs), and through /proc/self/environ only where the initial
stack is not as the kernel laid it out (docs/benchmarks.md, "The start environment without
a file"). Both ways give the same answer:

- a process that re-points itself is R1 whichever way was taken, with its start GPU named;
- with the layout intact, no /proc/self/environ is opened, in a rank (RANK set) or not;
- a program that rewrote its argv array, or whose unsetenv moved the loader's environment
  array (the variable first in the environment), is read through /proc/self/environ;
- a 64 KiB environment with the variable at its end reads the same.
"""
from __future__ import annotations

import pathlib
import re
import shutil

import pytest

from _guard import prog, read_audit
from conftest import GUARD, clean_env, run


def repoint(tmp_path: pathlib.Path, how: str | None, *, first: bool = False, pad: bool = False,
            **extra: str) -> tuple:
    """guard_repoint 5 (started with CUDA_VISIBLE_DEVICES=2, enforce, 6 fake GPUs) under
    strace: its exit status, stderr, R1 records, and how often it opened
    /proc/self/environ."""
    strace = shutil.which("strace")
    assert strace, "this test counts open(2) calls with strace: install it (apt-get install strace)"
    audit = tmp_path / f"audit-{how}-{first}-{pad}.jsonl"
    trace = tmp_path / f"strace-{how}-{first}-{pad}.txt"
    base = clean_env(CUDA_VISIBLE_DEVICES=None, FAKECUDA_GPUS="6", RANKGUARD_MODE="enforce",
                     RANKGUARD_AUDIT=str(audit), LD_PRELOAD=None, **extra)
    padding = {f"PAD_{i:02d}": "x" * 1000 for i in range(64)} if pad else {}
    # The variable first in the environment (envp[0]), or after everything else.
    env = ({"CUDA_VISIBLE_DEVICES": "2", **base, **padding} if first
           else {**base, **padding, "CUDA_VISIBLE_DEVICES": "2"})
    # Only the traced program is guarded (strace itself, unguarded, is no rank process).
    cmd = [strace, "-qq", "-e", "trace=open,openat", "-o", trace, "-E", f"LD_PRELOAD={GUARD}",
           prog("guard_repoint"), "5"]
    p = run(cmd + ([how] if how else []), env=env)
    records = read_audit(audit)[0] if audit.exists() else []
    opens = len(re.findall(r'"/proc/self/environ"', trace.read_text()))
    return p.returncode, p.stderr, [r for r in records if r["rule"] == "R1"], opens


@pytest.mark.parametrize("first,pad", [(False, False), (True, False), (False, True)])
def test_read_from_memory_a_repointed_process_is_r1_and_opens_no_file(tmp_path, first, pad):
    rc, err, r1, opens = repoint(tmp_path, None, first=first, pad=pad)
    assert rc == 78, err
    assert len(r1) == 1 and r1[0]["detail"].startswith(
        "the process was started with one GPU and re-pointed"), r1
    assert (r1[0]["cvd"], r1[0]["rank_gpu"]) == ("5", "2"), r1
    assert opens == 0, "the start environment was read through /proc/self/environ"


def test_in_a_rank_too_no_file_is_opened(tmp_path):
    rc, err, r1, opens = repoint(tmp_path, None, RANK="0")
    assert rc == 78, err
    assert [r["rank_gpu"] for r in r1] == ["2"], r1
    assert opens == 0


@pytest.mark.parametrize("how,first", [("argv", False), ("unset", True)])
def test_a_layout_the_program_changed_is_read_through_proc(tmp_path, how, first):
    """`argv`: argv[0] points at a copy; `unset`: the variable was envp[0], and unsetenv
    moved the rest of the array down. Either way the block in memory is not trusted, the
    file is read once, and the answer is the same R1."""
    rc, err, r1, opens = repoint(tmp_path, how, first=first)
    assert rc == 78, err
    assert len(r1) == 1 and (r1[0]["cvd"], r1[0]["rank_gpu"]) == ("5", "2"), r1
    assert opens == 1, opens


def test_unset_when_it_was_not_first_keeps_the_layout(tmp_path):
    """unsetenv of a later entry moves only the entries after it: envp[0] is still the
    block's start, so the block is read from memory, and it still holds the start value."""
    rc, err, r1, opens = repoint(tmp_path, "unset", first=False)
    assert rc == 78, err
    assert [r["cvd"] for r in r1] == ["5"], r1
    assert opens == 0

"""A registry holding more dead records than one sweep examines (issue 29, item 11).

Every write to a full registry sweeps a bounded number of its entries
(crates/core/src/registry.rs, SWEEP_BUDGET) and is refused only when that sweep freed
nothing, so a directory of stale records never reads as full of live exporters, and a
process start never pays for sweeping the whole directory.
"""
from __future__ import annotations

import os
import pathlib

from _ipc import gpu_uuid
from conftest import GUARD, PYTHON, clean_env, run

# More than the registry holds (65,536 records, MAX_RECORDS), so every start finds it full
# (the case was 30,000 dead records against the old bound of 4,096).
DEAD = 66_000
# Prints whether its own rank record exists while it runs (it is removed at exit), and its pid.
# It is given its GPU in-process (Ray's worker does so), so its start environment does not
# say its rank and its record is written at its first cuInit, through the registry's bounds
# (a process started on its GPU owes its record until it starts a child: test_rank_root_cost.py).
CUINIT = ("import os; os.environ['CUDA_VISIBLE_DEVICES'] = '0'; "
          "from cuda.bindings import driver as d; d.cuInit(0); "
          "print(os.path.isfile(os.path.join(os.environ['RANKGUARD_REGISTRY'], f'rank-{os.getpid()}')), "
          "os.getpid())")


def _dead_records(reg: pathlib.Path, n: int) -> None:
    pid = 4_000_000
    made = 0
    while made < n:
        pid += 1
        if os.path.exists(f"/proc/{pid}"):
            continue
        rec = reg / f"rank-{pid}"
        rec.write_text(f"rankguard-ipc-record 1\nkey rank-{pid}\njob -\nrank -\npid {pid}\nstart 1\n"
                       f"gpu {gpu_uuid(0)}\nlocation device\ntime 1\nroot {pid}.1\nend\n")
        rec.chmod(0o600)
        made += 1


def test_more_dead_records_than_the_bound_are_not_a_full_registry(tmp_path):
    """The issue's case: a registry over its bound with records of exited exporters only.
    Before, the sweep examined 16,384 entries, counted the directory again, said "is full
    (4096 records of live exporters)" and the process's rank record was not written. Now each start's bounded
    sweep frees room for its own record: two starts in a row both write theirs, say
    nothing, and the directory shrinks."""
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    _dead_records(reg, DEAD)
    env = clean_env(LD_PRELOAD=str(GUARD), FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES=None,
                    RANKGUARD_MODE="enforce", RANKGUARD_REGISTRY=str(reg))
    sizes = [DEAD]
    for _ in range(2):
        p = run([PYTHON, "-c", CUINIT], env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stderr == "", p.stderr
        written, pid = p.stdout.split()
        assert written == "True", "the rank record is written"
        assert not (reg / f"rank-{pid}").exists(), "and removed when its process exits"
        sizes.append(sum(1 for _ in reg.iterdir()))
        assert sizes[-1] < sizes[-2], sizes

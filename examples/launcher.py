"""A launcher built on rankguard's Python API alone: one child per rank, each with one GPU,
the guard and its CPU block, as `rankguard launch` would start it (README, "Python API").
Usage: python launcher.py NPROC CPU_IDS|- CMD ARGS...      (CPU_IDS: auto, 0-3/4-7, ...)"""
import os
import subprocess
import sys

import rankguard


def main(nproc: int, cpu_ids, cmd: list) -> int:
    ranks = rankguard.plan(nproc_per_node=nproc, cpu_ids=cpu_ids, env=os.environ)
    procs = []
    for r in ranks:  # r.env is complete: guard, single-entry CUDA_VISIBLE_DEVICES, RANK, ...
        pin = (lambda cpus=r.cpus: os.sched_setaffinity(0, cpus)) if r.cpus else None
        procs.append(subprocess.Popen(cmd, env=r.env, preexec_fn=pin, stdin=subprocess.DEVNULL,
                                      start_new_session=True))
    codes = [p.wait() for p in procs]
    # a rank killed by signal S (Popen reports -S) exits 128+S, as a shell and `launch` say
    # it; sys.exit(-S) would exit 256-S (a rank ended by SIGTERM: 241)
    return next((c if c > 0 else 128 - c for c in codes if c != 0), 0)


if __name__ == "__main__":
    try:
        sys.exit(main(int(sys.argv[1]), None if sys.argv[2] == "-" else sys.argv[2], sys.argv[3:]))
    except rankguard.ConflictError as e:  # where `rankguard launch` would exit 2
        sys.exit(f"launcher: {e}")

"""One task of a Slurm job step in python-tests/test_slurm.py's IPC checks (rule R3).

    _slurm_task.py pair DIR PEER CLI   two tasks (two ranks, one GPU each): task 0 exports
                                       device memory, task 1 imports it on its own GPU
    _slurm_task.py own DIR PEER CLI    one task given two GPUs: its exporter starts through
                                       `rankguard run --device 0` on the first, and another
                                       process of the same rank, preloaded directly, imports
                                       on the second

PEER is c-tests' ipc_peer (it checks codes and every byte itself), CLI the rankguard binary.
Each task prints one line `TASK {json}` (one write, so tasks' lines never interleave): its
Slurm identity and what its processes got. Every wait has a deadline, so a broken exchange
fails the test instead of hanging the job.
"""
import json
import os
import pathlib
import subprocess
import sys
import time

role, where, PEER, CLI = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]
rank = int(os.environ["SLURM_PROCID"])
DEADLINE = 30


def report(**kw):
    info = {"role": role, "rank": rank, "job": os.environ.get("SLURM_JOB_ID"),
            "step": os.environ.get("SLURM_STEP_ID"), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), **kw}
    os.write(1, ("TASK " + json.dumps(info) + "\n").encode())


def wait_file(p: pathlib.Path):
    end = time.monotonic() + DEADLINE
    while not p.exists():
        if time.monotonic() > end:
            report(error=f"timed out waiting for {p}")
            sys.exit(3)
        time.sleep(0.02)


def start_exporter(prefix, env):
    """`ipc_peer export mem` (behind `prefix`), once it printed "ready"."""
    d = where / "x"
    d.mkdir(exist_ok=True)
    p = subprocess.Popen([*prefix, PEER, "export", "mem", str(d)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.strip() == "ready":
            return p
    p.wait(timeout=DEADLINE)
    report(error="the exporter never got ready", stderr=p.stderr.read())
    sys.exit(3)


def finish_exporter(p):
    out, err = p.communicate(timeout=DEADLINE)
    return {"exporter_pid": p.pid, "exporter_rc": p.returncode, "exporter_stderr": err}


def importer(expect, env):
    p = subprocess.run([PEER, "import", "mem", str(where / "x"), expect], env=env, capture_output=True, text=True,
                       timeout=DEADLINE)
    return {"import_rc": p.returncode, "import_out": p.stdout, "import_stderr": p.stderr}


if role == "pair":
    if rank == 0:
        ex = start_exporter([], dict(os.environ))
        (where / "exported").touch()
        wait_file(where / "imported")
        report(**finish_exporter(ex))
    else:
        wait_file(where / "exported")
        got = importer("allow", dict(os.environ))
        (where / "imported").touch()
        report(**got)
elif role == "own":
    first, second = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    ex = start_exporter([CLI, "run", "--device", "0", "--"], dict(os.environ))
    lib = subprocess.run([CLI, "lib"], capture_output=True, text=True, check=True).stdout.strip()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=second, LD_PRELOAD=lib)
    got = importer("deny", env)
    report(first=first, second=second, **got, **finish_exporter(ex))
else:
    sys.exit(f"unknown role {role!r}")

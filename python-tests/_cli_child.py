"""A rank program for the CLI suites: reports what this process sees, then obeys its options.

Prints one line `CHILD {json}`: the rank environment, the CPU affinity as the kernel reports
it in /proc/self/status, and what the CUDA driver (the fake platform, through NVIDIA's
cuda.bindings) enumerates. Options:
  --no-cuda          do not touch CUDA at all
  --exit N           exit with status N after reporting (default 0)
  --exit-if-rank R   ... but only on rank R, once every rank wrote its pid (the others sleep,
                     then exit 0)
  --sleep S          sleep S seconds after reporting (before exiting)
  --pid-dir D        write D/<rank>.pid first
  --spawn            also start a grandchild (`sleep 600`) and record it as D/<rank>.grand
"""
import json
import os
import subprocess
import sys
import time

VARS = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "RANKGUARD_JOB", "RANKGUARD_RANK_GPU", "RANKGUARD_RANK_GPU_UUID", "LD_PRELOAD", "OMP_NUM_THREADS",
        "GROUP_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
        "SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID"]


def opt(name, default=None):
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


def cuda_view():
    from cuda.bindings import driver
    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        return {"init": int(err), "count": 0, "devices": []}
    err, n = driver.cuDeviceGetCount()
    devices = []
    for i in range(n):
        err, dev = driver.cuDeviceGet(i)
        err, u = driver.cuDeviceGetUuid(dev)
        b = bytes(u.bytes)
        h = b.hex()
        uuid = f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        err, u2 = driver.cuDeviceGetUuid_v2(dev)  # a MIG device's own UUID (cuda.h)
        h2 = bytes(u2.bytes).hex()
        err, busid = driver.cuDeviceGetPCIBusId(32, dev)
        devices.append({"ordinal": i, "uuid": uuid, "uuid_v2": f"{h2[0:8]}-{h2[8:12]}-{h2[12:16]}-{h2[16:20]}-{h2[20:32]}",
                        "bus_id": busid.split(b"\0")[0].decode().lower()})
    return {"init": 0, "count": n, "devices": devices}


def record(pid_dir: str, name: str, pid: int):
    """D/name holds pid, whole when it appears (a test polls the directory and reads
    what it finds; an empty file it read between open and write failed test_slurm)."""
    tmp = os.path.join(pid_dir, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(str(pid))
    os.rename(tmp, os.path.join(pid_dir, name))


def main():
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0")))
    pid_dir = opt("--pid-dir")
    if pid_dir:
        record(pid_dir, f"{rank}.pid", os.getpid())
        if "--spawn" in sys.argv:
            g = subprocess.Popen(["sleep", "600"])
            record(pid_dir, f"{rank}.grand", g.pid)
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    report = {
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in VARS},
        "cpus_allowed_list": status.get("Cpus_allowed_list"),
        "threads_affinity": sorted(os.sched_getaffinity(0)),
        "guard_loaded": "librankguard.so" in open("/proc/self/maps").read(),
    }
    if "--no-cuda" not in sys.argv:
        report["cuda"] = cuda_view()
    # One write() below PIPE_BUF, so lines of concurrent ranks never interleave.
    os.write(1, ("CHILD " + json.dumps(report) + "\n").encode())
    code = int(opt("--exit", "0"))
    only = opt("--exit-if-rank")
    if only is not None:
        if only == rank:
            # Fail only once every rank has started (recorded its pid), so the test can
            # check that each of them was stopped.
            world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            end = time.monotonic() + 30
            while pid_dir and time.monotonic() < end and len(
                    [f for f in os.listdir(pid_dir) if f.endswith(".pid")]) < world:
                time.sleep(0.02)
            sys.exit(code)
        code = 0
    time.sleep(float(opt("--sleep", "0")))
    sys.exit(code)


main()

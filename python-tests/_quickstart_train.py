"""The `train.py` of the README's quick start (python-tests/test_readme_quickstart.py): what a
rank of an unmodified program sees, and one legacy call.

Through the driver by name (ctypes, so it runs in any interpreter: the test venv's, the
torch venv's under scripts/fake-node, a Ray worker's): cuInit, the device count, cuDeviceGet
of ordinal 0 and of ordinal 1 (a legacy `cuda:1`, which the guard denies with a RANKGUARD
line). Prints one line `TRAIN {json}`; `report()` returns the same dict (a Ray actor calls it
in its own process).
"""
import ctypes
import json
import os


def report() -> dict:
    cu = ctypes.CDLL("libcuda.so.1")
    init = cu.cuInit(0)
    count = ctypes.c_int(-1)
    cu.cuDeviceGetCount(ctypes.byref(count))
    dev = ctypes.c_int()
    get0 = cu.cuDeviceGet(ctypes.byref(dev), 0)
    get1 = cu.cuDeviceGet(ctypes.byref(dev), 1)
    with open("/proc/self/maps") as f:
        guard = "librankguard" in f.read()
    return {"pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "rank": os.environ.get("RANK", os.environ.get("SLURM_PROCID")),
            "init": init, "count": count.value, "get0": get0, "get1": get1, "guard": guard}


if __name__ == "__main__":
    # One write of the whole line: torchrun's ranks share the job's output file, and
    # print() under PYTHONUNBUFFERED writes the text and its newline apart.
    os.write(1, ("TRAIN " + json.dumps(report()) + "\n").encode())

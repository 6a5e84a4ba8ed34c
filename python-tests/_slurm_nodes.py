"""A Slurm task under device cgroups (python-tests/test_slurm_cgroup.py): which of the
node's GPU device nodes it may open, then, with a command after `--`, exec it.

Prints one line `NODES {json}`: the task's Slurm rank, CUDA_VISIBLE_DEVICES as it reached
this process, and the GPU indices whose device node (DIR/nvidiaN, made with mknod, no
driver behind it) the kernel lets it open. With no driver, an allowed open fails with ENXIO
(the device cgroup let it through) and a refused one with EPERM (the device cgroup said no).
"""
import errno
import json
import os
import sys

devdir, rest = sys.argv[1], sys.argv[2:]
allowed, other = [], {}
for name in sorted(os.listdir(devdir), key=lambda n: int(n.removeprefix("nvidia"))):
    i = int(name.removeprefix("nvidia"))
    try:
        os.close(os.open(os.path.join(devdir, name), os.O_RDWR))
        allowed.append(i)
    except OSError as e:
        if e.errno == errno.ENXIO:
            allowed.append(i)
        elif e.errno != errno.EPERM:
            other[i] = errno.errorcode.get(e.errno, str(e.errno))
# One write of the whole line (the tasks of a job share its output).
os.write(1, ("NODES " + json.dumps({"rank": int(os.environ["SLURM_PROCID"]),
                                    "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                    "allowed": allowed, "other": other}) + "\n").encode())
if rest and rest[0] == "--":
    os.execvp(rest[1], rest[1:])

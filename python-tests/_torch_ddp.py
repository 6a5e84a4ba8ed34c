"""A torchrun worker (test_torchrun.py): its rank's GPU as cuda:0, a gloo all_reduce of
bytes that went through the GPU (copies only: the fake node runs no kernels).

LEGACY=1: the pre-contract `torch.cuda.set_device(LOCAL_RANK)`, falling back to cuda:0
when CUDA refuses it. FAIL_FIRST=1: rank 1 of the first attempt exits 3 before the
process group forms, once every rank has called set_device, so that torchrun
--max-restarts restarts the workers.
REPOINT_CHILD=R: rank R starts a child re-pointed to another GPU (the guard stops it at
cuInit, R1) and then waits, with no timeout, on a pipe it holds open itself, as a learner
on its queue: only the end of the rank by the guard (issue 28) stops it."""
import os
import sys

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
if os.environ.get("LEGACY"):
    try:
        torch.cuda.set_device(local)
    except RuntimeError:
        torch.cuda.set_device(0)
else:
    torch.cuda.set_device(0)
if os.environ.get("REPOINT_CHILD") == os.environ["RANK"]:
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import torch; torch.cuda.init()"],
                     env=dict(os.environ, CUDA_VISIBLE_DEVICES=str((local + 4) % 8)))
    r, w = os.pipe()
    os.read(r, 1)
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
# The agent's store, prefixed per attempt: after a restart on this machine, gloo's default
# env:// rendezvous met the first attempt's addresses in the store (connection refused).
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                      is_master=False)
if os.environ.get("FAIL_FIRST") and attempt == 0:
    # Rank 1 fails the attempt only once every rank has made its set_device call (torchrun
    # stops the others when it fails: a slow rank would otherwise never make it).
    store.add("attempt-0/set", 1)
    if rank == 1:
        import time
        deadline = time.monotonic() + 120
        while store.add("attempt-0/set", 0) < world and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(3)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                        rank=rank, world_size=world)
x = torch.tensor([float(rank + 1)] * 4).cuda()
y = x.cpu()
dist.all_reduce(y)
# One write(2) per line, so the lines of the four workers never mix.
os.write(1, (f"rank {rank} attempt {attempt} gpu {torch.cuda.get_device_name(0).replace(' ', '_')} "
      f"cvd {os.environ.get('CUDA_VISIBLE_DEVICES')} run {os.environ.get('TORCHELASTIC_RUN_ID')} "
      f"sum {y.tolist()}\n").encode())
ok = y.tolist() == [world * (world + 1) / 2] * 4
dist.destroy_process_group()
sys.exit(0 if ok else 1)

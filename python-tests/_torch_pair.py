"""Two processes of one rank that a legacy per-rank launch script started side by side, each
pinned to a GPU of its own with a one-entry CUDA_VISIBLE_DEVICES (the learner on one, its
collector on another: "a rank owns two GPUs"). Each sees exactly one GPU (R1 holds for each:
neither is the other's descendant), so only R3 can catch what they do: the learner shares
CUDA memory with the collector through torch's own pickling (a torch.multiprocessing
reduction over a multiprocessing.connection socket, what a torch.multiprocessing queue
sends), and the collector imports it on its own GPU. Driven by test_torch_allocators.py
under scripts/fake-node.

    python _torch_pair.py learner SOCKET WHAT
    python _torch_pair.py collector SOCKET

WHAT is `tensor` (a CUDA tensor: its memory and its interprocess event, what torch sends for
the default caching allocator and expandable_segments:True) or `event` (an interprocess
torch.cuda.Event's handle: what torch shares under backend:cudaMallocAsync, which refuses to
share pool memory). The learner prints one JSON line: what the collector answered."""
import json
import sys
import time
from multiprocessing.connection import Client, Listener

import torch
import torch.multiprocessing  # noqa: F401  (registers torch's reductions with the pickler)

N = 1 << 16


def learner(sock: str, what: str) -> None:
    x = torch.arange(N, dtype=torch.int32).cuda()  # a copy: the fake node runs no kernel
    out = {"backend": torch.cuda.get_allocator_backend()}
    with Listener(sock, family="AF_UNIX") as ls, ls.accept() as conn:
        if what == "tensor":
            conn.send(("tensor", x))
        else:
            ev = torch.cuda.Event(interprocess=True)
            ev.record()
            conn.send(("event", ev.ipc_handle()))
        if not conn.poll(60):                 # a hang detector
            out["collector"] = "no answer in 60 s"
        else:
            out["collector"] = conn.recv()
        conn.send("bye")                      # the collector let go of what it imported
    print(json.dumps(out), flush=True)


def collector(sock: str) -> None:
    for _ in range(600):                      # up to 60 s for the learner's socket
        try:
            conn = Client(sock, family="AF_UNIX")
            break
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.1)
    else:
        sys.exit("collector: no learner socket in 60 s")
    with conn:
        try:
            kind, obj = conn.recv()           # the import: torch opens the learner's handles
            if kind == "tensor":
                want = torch.arange(N, dtype=torch.int32)
                answer = {"device": str(obj.device), "bytes_ok": bool((obj.cpu() == want).all())}
            else:
                ev = torch.cuda.Event.from_ipc_handle(0, obj)
                ev.synchronize()
                answer = {"event": "opened"}
            del obj
        except RuntimeError as e:             # torch's own words for a refused import
            answer = {"error": str(e).splitlines()[0]}
        conn.send(answer)
        conn.recv()


if __name__ == "__main__":
    role, sock = sys.argv[1], sys.argv[2]
    if role == "learner":
        learner(sock, sys.argv[3])
    else:
        collector(sock)

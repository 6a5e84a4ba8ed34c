"""A learner shares one CUDA tensor with a torch.multiprocessing (spawn) collector through a
queue; the collector checks every byte through a host copy and answers. Driven by
test_torch_allocators.py under scripts/fake-node, usually with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.

    python _torch_vmm.py [CHILD_CVD [--no-timeout]]

CHILD_CVD, when given, re-points the collector: it starts with CUDA_VISIBLE_DEVICES=CHILD_CVD
(the legacy config: a rank's child pinned to another GPU). Prints one JSON line.
--no-timeout: the learner waits for the answer as most do, with no timeout and no look at
the collector (only the end of its rank by the guard stops it when the collector is
refused, issue 28)."""
import json
import os
import queue
import sys

import torch
import torch.multiprocessing as mp

N = 1 << 20


def collector(q, back):
    x = q.get()                               # the import: torch opens the learner's handle
    want = torch.arange(N, dtype=torch.int32)
    back.put({"device": str(x.device), "bytes_ok": bool((x.cpu() == want).all())})
    del x


def main():
    out = {"backend": torch.cuda.get_allocator_backend(),
           "expandable": "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    x = torch.arange(N, dtype=torch.int32).cuda()  # a copy: the fake node runs no kernel
    ctx = mp.get_context("spawn")
    q, back = ctx.Queue(), ctx.Queue()
    if len(sys.argv) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[1]
    p = ctx.Process(target=collector, args=(q, back))
    p.start()
    q.put(x)
    out["child"] = None
    if sys.argv[2:] == ["--no-timeout"]:
        out["child"] = back.get()
    for _ in range(0 if out["child"] else 120):                      # up to 60 s: a hang detector
        try:
            out["child"] = back.get(timeout=0.5)
            break
        except queue.Empty:
            if not p.is_alive():              # the collector ended (or was stopped) unanswered
                break
    p.join(60)
    out["child_rc"] = p.exitcode
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

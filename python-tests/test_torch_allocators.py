"""PyTorch's allocators on the fake node, guarded and unguarded: the default caching
allocator and backend:cudaMallocAsync (pools) allocate, copy and share (or refuse to share,
in torch's words) the same way under the guard as without it."""
from __future__ import annotations

import json

from conftest import GUARD, clean_env, fake_node

PROG = r"""
import json, sys
import torch
from torch.multiprocessing.reductions import reduce_tensor
out = {"backend": torch.cuda.get_allocator_backend()}
x = torch.arange(4096, dtype=torch.int32).cuda()
y = torch.empty_like(x)
y.copy_(x)
out["bytes_ok"] = bool((y.cpu() == torch.arange(4096, dtype=torch.int32)).all())
out["allocated"] = torch.cuda.memory_stats().get("allocated_bytes.all.current")
torch.cuda.reset_peak_memory_stats()
del y
torch.cuda.empty_cache()
try:
    reduce_tensor(x)          # what a queue's feeder thread does with a CUDA tensor
    out["share"] = "exported"
except RuntimeError as e:
    out["share"] = str(e).splitlines()[0]
print(json.dumps(out))
"""


def _run(tmp_path, conf: str | None, guard: bool):
    env = clean_env(CUDA_VISIBLE_DEVICES="0", PYTORCH_CUDA_ALLOC_CONF=conf,
                    RANKGUARD_MODE="enforce", RANKGUARD_REGISTRY=None)
    if guard:
        env["LD_PRELOAD"] = str(GUARD)
    p = fake_node(["python", "-c", PROG], env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("RANKGUARD" in p.stderr) is False, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_default_caching_allocator_same_guarded_and_not(tmp_path):
    bare, guarded = _run(tmp_path, None, False), _run(tmp_path, None, True)
    assert bare == guarded
    assert bare["backend"] == "native" and bare["bytes_ok"] and bare["share"] == "exported"


def test_cuda_malloc_async_same_guarded_and_not(tmp_path):
    conf = "backend:cudaMallocAsync"
    bare, guarded = _run(tmp_path, conf, False), _run(tmp_path, conf, True)
    assert bare == guarded
    assert bare["backend"] == "cudaMallocAsync" and bare["bytes_ok"]
    assert bare["allocated"] == 4096 * 4 * 2
    # torch refuses to share pool memory, in its own words.
    assert "cudaMallocAsync does not yet support shareIpcHandle" in bare["share"], bare

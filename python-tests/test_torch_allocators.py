"""PyTorch's allocators on the fake node, guarded and unguarded: the default caching
allocator and backend:cudaMallocAsync (pools) allocate, copy and share (or refuse to share,
in torch's words) the same way under the guard as without it; expandable_segments:True (the VMM
allocator, its segments shared as file descriptors) shares byte-exact guarded and unguarded,
and a collector re-pointed to another GPU is R3 at cuMemImportFromShareableHandle (warn) and
stopped at cuInit by R1, with its rank (enforce)."""
from __future__ import annotations

import json

from conftest import GUARD, ROOT, clean_env, fake_node

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


# expandable_segments:True: the VMM allocator (cuMemCreate with POSIX-fd handles, mapped into
# a reserved range); a shared segment travels as a file descriptor the importer takes with
# pidfd_getfd and opens with cuMemImportFromShareableHandle. torch asks NVML about each
# segment's GPU: the fake node's NVML (c-tests/fake/nvml/) answers.
VMM = ROOT / "python-tests" / "_torch_vmm.py"
EXPANDABLE = "expandable_segments:True"


def _share(env):
    p = fake_node(["python", VMM], env=env)
    return p, json.loads(p.stdout.splitlines()[-1])


def test_expandable_segments_share_same_guarded_and_not(tmp_path):
    outs = []
    for guard in (False, True):
        env = clean_env(CUDA_VISIBLE_DEVICES="0", PYTORCH_CUDA_ALLOC_CONF=EXPANDABLE,
                        RANKGUARD_MODE="enforce", RANKGUARD_REGISTRY=None)
        if guard:
            env["LD_PRELOAD"] = str(GUARD)
        p, out = _share(env)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "RANKGUARD" not in p.stderr, p.stderr
        outs.append(out)
    assert outs[0] == outs[1]
    assert outs[0] == {"backend": "native", "expandable": True, "child_rc": 0,
                       "child": {"device": "cuda:0", "bytes_ok": True}}, outs[0]


def _rank(tmp_path, mode: str, child_cvd: str):
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    audit = tmp_path / "audit"
    audit.mkdir()
    env = clean_env(CUDA_VISIBLE_DEVICES="2", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                    PYTORCH_CUDA_ALLOC_CONF=EXPANDABLE, RANKGUARD_MODE=mode,
                    RANKGUARD_AUDIT=str(audit / "%p.jsonl"), RANKGUARD_REGISTRY=str(reg))
    p = fake_node(["rankguard", "run", "--", "python", VMM, child_cvd], env=env)
    records = [json.loads(line) for f in sorted(audit.glob("*.jsonl"))
               for line in f.read_text().splitlines()]
    last = p.stdout.splitlines()[-1:]
    return p, json.loads(last[0]) if last and last[0].startswith("{") else None, records


def test_expandable_segments_cross_device_import_is_r3_in_warn_mode(tmp_path):
    # The collector sees GPU 3 first and the rank's GPU 2 second: torch opens the learner's
    # segment on its cuda:0, GPU 3, a cross-device import inside the rank.
    p, out, records = _rank(tmp_path, "warn", "3,2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert out["child"] == {"device": "cuda:0", "bytes_ok": True}, out
    r3 = [r for r in records if r["rule"] == "R3" and r["call"] == "cuMemImportFromShareableHandle"]
    assert r3 and r3[0]["verdict"] == "warn", records
    assert f"{VMM}:" in " ".join(r3[0]["py_stack"]), r3[0]["py_stack"]
    assert {r["rule"] for r in records} == {"R1", "R2", "R3"}, records


def test_expandable_segments_cross_device_collector_is_stopped_in_enforce_mode(tmp_path):
    # Enforce never reaches the import: a process of the rank that sees another GPU is stopped
    # at cuInit (R1) whatever the order of its CUDA_VISIBLE_DEVICES, and its rank with it
    # (issue 28): the learner, a CUDA user, ends with 78 and its own line before it prints.
    p, out, records = _rank(tmp_path, "enforce", "3,2")
    assert p.returncode == 78, p.stdout + p.stderr
    assert out is None, out
    assert "RANKGUARD WARN terminating: this process breaks rule R1" in p.stderr
    assert "ending the rank's process (status 78)" in p.stderr, p.stderr
    assert "ending this process, the rank's process, with status 78" in p.stderr, p.stderr
    assert [(r["rule"], r["call"], r["verdict"]) for r in records] == [("R1", "cuInit", "deny")]

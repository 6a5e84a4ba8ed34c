"""PyTorch's allocators on the fake node, guarded and unguarded: the default caching
allocator and backend:cudaMallocAsync (pools) allocate, copy and share (or refuse to share,
in torch's words) the same way under the guard as without it; expandable_segments:True (the VMM
allocator, its segments shared as file descriptors) shares byte-exact guarded and unguarded,
and a collector re-pointed to another GPU is R3 at cuMemImportFromShareableHandle (warn) and
stopped at cuInit by R1, with its rank (enforce). Two processes of one rank, each on a GPU of its own (R1 holds
for each), sharing through torch's pickling: on every allocator's path R3 records both imports
(warn) and refuses the first, the share's interprocess event, with torch's own error (enforce).
The cudaMallocAsync backend shares no pool (its IPC path makes no pool access grant: the fake
runtime's call log); the grant it makes, on a copy between two GPUs, is R4 (warn), and never
happens in enforce mode, where R1 stops a process that sees two GPUs first."""
from __future__ import annotations

import json
import subprocess

import pytest

import _handle_table as handle_table
from conftest import FAKE_NODE, GUARD, ROOT, clean_env, fake_node

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
    records = [r for f in sorted(audit.glob("*.jsonl"))
               for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") != "map"]
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
    assert "RANKGUARD DENY terminating: this process breaks rule R1" in p.stderr
    assert "ending the rank's process (status 78)" in p.stderr, p.stderr
    assert "RANKGUARD DENY ending this process, the rank's process, with status 78" in p.stderr, p.stderr
    assert [(r["rule"], r["call"], r["verdict"]) for r in records] == [("R1", "cuInit", "deny")]


# A cross-device import inside a rank that R1 does not stop first: two processes of rank 0 that
# a legacy per-rank launch script started side by side (not one the other's child), the learner
# on GPU 2 and its collector on GPU 3, each with a one-entry CUDA_VISIBLE_DEVICES of its own.
# Each sees exactly one GPU, so only R3 can see that the collector opens the learner's memory
# across GPUs. The learner sends through torch's own pickling (python-tests/_torch_pair.py); on
# every allocator's path the first thing torch opens is the share's interprocess event
# (torch/csrc/StorageSharing.cpp opens the event before the memory; under
# backend:cudaMallocAsync, which refuses to share pool memory, an interprocess torch.cuda.Event
# is what torch shares).
PAIR = ROOT / "python-tests" / "_torch_pair.py"
ALLOCATORS = {"default": (None, "tensor", "cudaIpcOpenMemHandle"),
              "expandable_segments": (EXPANDABLE, "tensor", "cuMemImportFromShareableHandle"),
              "cudaMallocAsync": ("backend:cudaMallocAsync", "event", None)}


def _pair(tmp_path, mode: str, allocator: str):
    """(the learner's line, the collector's stderr, the audit records, the fake runtime's
    call log of both processes); the registry is empty after both have exited."""
    conf, what, _ = ALLOCATORS[allocator]
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    audit = tmp_path / "audit"
    audit.mkdir()
    sock = tmp_path / "learner.sock"

    def env(gpu: str):
        return clean_env(CUDA_VISIBLE_DEVICES=gpu, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                         RANKGUARD_JOB="legacy-job", RANKGUARD_MODE=mode, LD_PRELOAD=str(GUARD),
                         RANKGUARD_AUDIT=str(audit / "%p.jsonl"), RANKGUARD_REGISTRY=str(reg),
                         PYTORCH_CUDA_ALLOC_CONF=conf, FAKECUDA_ARGLOG=str(tmp_path / "calls.log"))

    learner = subprocess.Popen([str(FAKE_NODE), "python", str(PAIR), "learner", str(sock), what],
                               env=env("2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        coll = fake_node(["python", PAIR, "collector", sock], env=env("3"), timeout=150)
        out, err = learner.communicate(timeout=90)
    finally:
        learner.kill()
        learner.wait()
    assert learner.returncode == 0, out + err
    assert coll.returncode == 0, coll.stdout + coll.stderr
    records = [r for f in sorted(audit.glob("*.jsonl"))
               for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") != "map"]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # Both have exited: what they recorded for their exports went with them (issue 33),
    # the handle table's slots too (the table file stays, for the next exporter).
    left = sorted(f.name for f in reg.iterdir() if f.name != handle_table.FILE_NAME)
    assert left == [] and handle_table.records(reg) == [], (left, handle_table.records(reg))
    return json.loads(out.splitlines()[-1]), coll.stderr, records, calls


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_cross_device_import_inside_a_rank_is_refused_by_r3_in_enforce_mode(tmp_path, allocator):
    out, err, records, _ = _pair(tmp_path, "enforce", allocator)
    # The event open is refused (800): torch raises in its own words and never maps the
    # learner's memory.
    assert out["collector"] == {"error": "CUDA error: operation not permitted"}, out
    denied = [l for l in err.splitlines() if "RANKGUARD DENY" in l]
    assert len(denied) == 1, err
    assert "cudaIpcOpenEventHandle(" in denied[0] and " denied [R3 " in denied[0], denied
    assert "GPU-12c0ffee-0000-4000-8000-000000000002" in denied[0], denied[0]   # the learner's
    assert "GPU-13c0ffee-0000-4000-8000-000000000003" in denied[0], denied[0]   # the collector's
    assert [(r["rule"], r["call"], r["verdict"]) for r in records] == \
        [("R3", "cudaIpcOpenEventHandle", "deny")], records
    assert records[0]["exporter_rank"] == 0 and records[0]["rank"] == 0
    assert f"{PAIR}:" in " ".join(records[0]["py_stack"]), records[0]["py_stack"]  # the user's line


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_cross_device_import_inside_a_rank_is_r3_in_warn_mode(tmp_path, allocator):
    out, err, records, calls = _pair(tmp_path, "warn", allocator)
    _, what, mem_call = ALLOCATORS[allocator]
    if what == "tensor":
        assert out["collector"] == {"device": "cuda:0", "bytes_ok": True}, out
    else:
        assert out["collector"] == {"event": "opened"}, out
    # Warn mode lets both imports through and records each: the event, then the memory.
    want = [("R3", "cudaIpcOpenEventHandle", "warn")] + ([("R3", mem_call, "warn")] if mem_call else [])
    assert [(r["rule"], r["call"], r["verdict"]) for r in records] == want, records
    for r in records:
        assert f"{PAIR}:" in " ".join(r["py_stack"]), r["py_stack"]
    if allocator == "cudaMallocAsync":
        # The pool backend allocated the learner's tensor, and sharing under it grants no
        # pool access (the fake runtime's call log of both processes).
        names = [line.split()[1] for line in calls]
        assert "cudaMallocAsync" in names, sorted(set(names))
        assert "cudaMemPoolSetAccess" not in names, calls


# R4 through torch's cudaMallocAsync backend. Torch never shares pool memory: its libraries
# import no pool export or import function (below; the driver functions it asks for by entry
# point are the VMM ones of expandable_segments), and a pool share is refused in torch's words
# (test_cuda_malloc_async_same_guarded_and_not). The pool access grant torch does make is on a
# copy between two GPUs of one process: the backend grants the destination device's default
# pool to the source device (cudaDeviceGetDefaultMemPool, cudaMemPoolSetAccess). Only a process
# that sees two GPUs can make it, so in enforce mode R1 stops that process at cuInit first.
PEER_COPY = r"""
import json, torch
x = torch.arange(1 << 16, dtype=torch.int32).to("cuda:0")  # copies: the fake node runs no kernel
y = x.to("cuda:1")                      # the legacy multi-GPU process: a copy across GPUs
print(json.dumps({"backend": torch.cuda.get_allocator_backend(),
                  "copied": bool((y.cpu() == torch.arange(1 << 16, dtype=torch.int32)).all())}))
"""
POOL_CALLS = ("cudaMemPoolExportToShareableHandle", "cudaMemPoolImportFromShareableHandle",
              "cudaMemPoolExportPointer", "cudaMemPoolImportPointer")


def test_torch_imports_a_pool_access_grant_and_no_pool_sharing():
    from test_fake_frameworks import torch_cudart_imports
    names = torch_cudart_imports()
    assert "cudaMemPoolSetAccess" in names and "cudaDeviceGetDefaultMemPool" in names
    assert not [n for n in POOL_CALLS if n in names], sorted(n for n in names if "Pool" in n)


def _peer_copy(tmp_path, mode: str):
    audit = tmp_path / "audit"
    audit.mkdir()
    log = tmp_path / "calls.log"
    env = clean_env(CUDA_VISIBLE_DEVICES="2,3", RANKGUARD_MODE=mode, LD_PRELOAD=str(GUARD),
                    RANKGUARD_AUDIT=str(audit / "%p.jsonl"), RANKGUARD_REFUSAL_ENDS="process",
                    RANKGUARD_REGISTRY=str(tmp_path / "registry"), FAKECUDA_ARGLOG=str(log),
                    PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    prog = tmp_path / "peer_copy.py"
    prog.write_text(PEER_COPY)
    p = fake_node(["python", prog], env=env)
    records = [r for f in sorted(audit.glob("*.jsonl"))
               for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") != "map"]
    calls = log.read_text().splitlines() if log.exists() else []
    return p, records, calls, prog


def test_pool_access_grant_across_devices_is_r4_in_warn_mode(tmp_path):
    p, records, calls, prog = _peer_copy(tmp_path, "warn")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == {"backend": "cudaMallocAsync", "copied": True}
    # What torch called (the fake runtime's log): device 1's default pool, granted to device 0.
    grants = [line for line in calls if line.split()[1] == "cudaMemPoolSetAccess"]
    assert len(grants) == 1 and "location={type=1,id=0}" in grants[0], calls
    assert any(line.split()[1] == "cudaDeviceGetDefaultMemPool" and "device=1" in line for line in calls)
    r4 = [r for r in records if r["rule"] == "R4"]
    # The runtime's grant, once: the driver's grant the runtime makes inside it (through our
    # cuGetProcAddress, a guarded entry point) is the same grant, not recorded again.
    assert [(r["call"], r["verdict"]) for r in r4] == [("cudaMemPoolSetAccess", "warn")], r4
    assert f"{prog}:4 in <module>" in " ".join(r4[0]["py_stack"]), r4[0]["py_stack"]
    assert "[R4 no peer access inside a rank]: peer access between device 1 and device 0" in p.stderr
    assert {r["rule"] for r in records} == {"R1", "R2", "R4"}


def test_pool_access_grant_across_devices_never_happens_in_enforce_mode(tmp_path):
    # The only process that can grant a pool across devices sees two GPUs: R1 stops it at
    # cuInit, before torch allocates or grants anything.
    p, records, calls, _ = _peer_copy(tmp_path, "enforce")
    assert p.returncode == 78, p.stdout + p.stderr
    assert "RANKGUARD DENY terminating: this process breaks rule R1" in p.stderr
    assert [(r["rule"], r["call"], r["verdict"]) for r in records] == [("R1", "cuInit", "deny")]
    names = {line.split()[1] for line in calls}
    assert not names & {"cudaMemPoolSetAccess", "cudaMallocAsync", "cudaDeviceGetDefaultMemPool"}, calls

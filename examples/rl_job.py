#!/usr/bin/env python3
"""A small but honest RL-style training job: the workload `scripts/demo` runs under
`rankguard launch` on the fake 8-GPU node.

Why it exists: rankguard's contract (one rank = one GPU, seen as cuda:0 by every process of
the rank; no cross-device IPC inside a rank) only matters for jobs shaped like this one,
where a rank is a process *tree* that shares GPU memory through CUDA IPC. Every byte is
real: the processes exchange device memory with NVIDIA's `cuda.bindings` (cuMemAlloc,
cuIpcGetMemHandle / cuIpcOpenMemHandle with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
cuMemcpyHtoD/DtoH, and an interprocess event: cuIpcGetEventHandle / cuIpcOpenEventHandle)
and every transfer is checked with SHA-256.

One rank (started by the launcher, which sets RANK, LOCAL_RANK, WORLD_SIZE and a one-entry
CUDA_VISIBLE_DEVICES):
- the learner owns the rank's GPU, allocates a weights buffer and a rollout buffer and
  exports both;
- collectors (separate processes) import the rollout buffer and write their rollouts into
  their slots; the learner checks every slot's checksum, then updates the weights;
- an inference ring (separate processes) imports the learner's weights and the event the
  learner records after each weights update, waits on it, checks the weights, writes its
  actions into its own exported buffer and checks its ring neighbour's;
- at the end, learner r reads learner r+1's final weights through IPC: traffic *between*
  ranks, as NCCL's P2P transport does it, which the contract allows.

`--legacy` is the configuration the contract replaces (TATP-233): the learner asks for its
*global* device index (`training.devices[LOCAL_RANK]`, rule R2: in-rank code names cuda:0)
and falls back to ordinal 0 when CUDA refuses it, and collector 1 is pinned to the next
GPU by rewriting CUDA_VISIBLE_DEVICES (rule R1: every process of the rank sees the rank's
GPU), from where it imports the learner's memory across GPUs (rule R3).
`planted_violations()` is the exact list of guard decisions that config provokes; the
demo and its test compare the audit with it.

Child processes talk to the learner in JSON lines over their stdin/stdout; their stderr is
the terminal's (the guard's lines appear as they are). Exit status: 0 when every check
passed; a child's non-zero status is passed on (78: the guard terminated it, rule R1);
1 for a failed check.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

from cuda.bindings import driver as cu

FLAGS = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
WEIGHTS_BYTES = 64 * 1024
SLOT_BYTES = 16 * 1024
RENDEZVOUS_TIMEOUT_S = 60.0


# ---------------------------------------------------------------------------- the plan

def legacy_devices(world: int) -> list[int]:
    """The legacy `training.devices`: global GPU indices, one per local rank."""
    return list(range(world))


def planted_violations(world: int, collectors: int = 2) -> list[dict]:
    """The guard decisions `--legacy` provokes in warn mode, one dict per (rank, rule, call).

    Per rank r: the learner's cuDeviceGet(devices[r]) names a global index (R2) unless it
    happens to be 0; collector 1 sees another GPU at cuInit (R1) and imports the learner's
    rollout buffer from there (R3). Everything else (collector 0, the inference ring, the
    inter-rank weight check) follows the contract.
    """
    if collectors < 2:
        raise ValueError("the legacy config pins collector 1: use at least 2 collectors")
    out = []
    for r, g in enumerate(legacy_devices(world)):
        if g != 0:
            out.append({"rank": r, "rule": "R2", "call": "cuDeviceGet", "count": 1})
        out.append({"rank": r, "rule": "R1", "call": "cuInit", "count": 1})
        out.append({"rank": r, "rule": "R3", "call": "cuIpcOpenMemHandle", "count": 1})
    return out


# ---------------------------------------------------------------------------- CUDA helpers

class CudaFailure(RuntimeError):
    pass


def ok(result, what: str):
    """Unwrap a cuda.bindings result tuple; raise with the CUDA error name on failure."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaFailure(f"{what} failed: {error_name(err)}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def error_name(err) -> str:
    e, name = cu.cuGetErrorName(err)
    return name.decode() if int(e) == 0 and name else f"CUresult {int(err)}"


def uuid_text(dev) -> str:
    u = ok(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes.hex()
    return f"GPU-{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}"


def open_device(ordinal: int):
    """cuInit, cuDeviceGet(ordinal), a context on it; returns (device, context)."""
    ok(cu.cuInit(0), "cuInit")
    dev = ok(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
    ctx = ok(cu.cuCtxCreate(0, dev), "cuCtxCreate")
    return dev, ctx


def put(ptr, data: bytes, offset: int = 0) -> None:
    ok(cu.cuMemcpyHtoD(cu.CUdeviceptr(int(ptr) + offset), data, len(data)), "cuMemcpyHtoD")


def get(ptr, n: int, offset: int = 0) -> bytes:
    buf = bytearray(n)
    ok(cu.cuMemcpyDtoH(buf, cu.CUdeviceptr(int(ptr) + offset), n), "cuMemcpyDtoH")
    return bytes(buf)


def export(ptr) -> str:
    return bytes(ok(cu.cuIpcGetMemHandle(ptr), "cuIpcGetMemHandle").reserved).hex()


def import_(handle_hex: str):
    h = cu.CUipcMemHandle()
    h.reserved = bytes.fromhex(handle_hex)
    return ok(cu.cuIpcOpenMemHandle(h, FLAGS), "cuIpcOpenMemHandle")


def new_ipc_event():
    """An event other processes can wait on (cuda.h: INTERPROCESS needs DISABLE_TIMING)."""
    flags = int(cu.CUevent_flags.CU_EVENT_INTERPROCESS) | int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    return ok(cu.cuEventCreate(flags), "cuEventCreate")


def export_event(ev) -> str:
    return bytes(ok(cu.cuIpcGetEventHandle(ev), "cuIpcGetEventHandle").reserved).hex()


def import_event(handle_hex: str):
    h = cu.CUipcEventHandle()
    h.reserved = bytes.fromhex(handle_hex)
    return ok(cu.cuIpcOpenEventHandle(h), "cuIpcOpenEventHandle")


def pattern(n: int, *seed) -> bytes:
    """n deterministic bytes from a seed: what a rollout, weights or actions hold."""
    out = bytearray()
    block = hashlib.sha256(repr(seed).encode()).digest()
    while len(out) < n:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:n])


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def weights_at(rank: int, step: int) -> bytes:
    return pattern(WEIGHTS_BYTES, "weights", rank, step)


def rollout(rank: int, collector: int, step: int) -> bytes:
    return pattern(SLOT_BYTES, "rollout", rank, collector, step)


def actions(weights_sha: str, member: int, step: int) -> bytes:
    return pattern(SLOT_BYTES, "actions", weights_sha, member, step)


# ---------------------------------------------------------------------------- children

def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def commands():
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "stop":
            return
        yield msg


def collector_main(a) -> int:
    """Import the learner's rollout buffer; on each step write this collector's slot."""
    rank = int(os.environ.get("RANK", "0"))
    dev, _ = open_device(0)
    hello = json.loads(sys.stdin.readline())
    buf = import_(hello["rollouts"])
    send({"ready": True, "gpu": uuid_text(dev)})
    for msg in commands():
        data = rollout(rank, a.index, msg["step"])
        put(buf, data, offset=a.index * SLOT_BYTES)
        send({"step": msg["step"], "sha": sha(data)})
    ok(cu.cuIpcCloseMemHandle(buf), "cuIpcCloseMemHandle")
    return 0


def inference_main(a) -> int:
    """One member of the inference ring: read the learner's weights, write actions into an
    exported buffer, check the ring neighbour's actions through IPC."""
    dev, _ = open_device(0)
    hello = json.loads(sys.stdin.readline())
    weights = import_(hello["weights"])
    weights_ready = import_event(hello["weights_ready"])
    own = ok(cu.cuMemAlloc(SLOT_BYTES), "cuMemAlloc")
    ok(cu.cuMemsetD8(own, 0, SLOT_BYTES), "cuMemsetD8")
    send({"ready": True, "handle": export(own), "gpu": uuid_text(dev)})
    neighbour = None
    for msg in commands():
        if msg["cmd"] == "neighbour":
            neighbour = (msg["index"], import_(msg["handle"]))
            send({"ok": True})
        elif msg["cmd"] == "act":
            # Wait for the learner's copy of the new weights, through its IPC event.
            ok(cu.cuEventSynchronize(weights_ready), "cuEventSynchronize")
            w = get(weights, WEIGHTS_BYTES)
            if sha(w) != msg["weights_sha"]:
                send({"error": f"weights read through IPC do not match the learner's (step {msg['step']})"})
                return 1
            put(own, actions(msg["weights_sha"], a.index, msg["step"]))
            send({"ok": True})
        elif msg["cmd"] == "check":
            idx, ptr = neighbour
            want = actions(msg["weights_sha"], idx, msg["step"])
            if get(ptr, SLOT_BYTES) != want:
                send({"error": f"member {idx}'s actions read through IPC are wrong (step {msg['step']})"})
                return 1
            send({"ok": True})
    if neighbour:
        ok(cu.cuIpcCloseMemHandle(neighbour[1]), "cuIpcCloseMemHandle")
    ok(cu.cuIpcCloseMemHandle(weights), "cuIpcCloseMemHandle")
    ok(cu.cuEventDestroy(weights_ready), "cuEventDestroy")
    ok(cu.cuMemFree(own), "cuMemFree")
    return 0


# ---------------------------------------------------------------------------- the learner

class Child:
    """A collector or inference process, driven over JSON lines."""

    def __init__(self, name: str, role: str, index: int, env: dict | None = None):
        self.name = name
        cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--index", str(index)]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)

    def tell(self, msg: dict) -> None:
        try:
            self.p.stdin.write(json.dumps(msg) + "\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            raise ChildFailed(self, self.p.wait())

    def hear(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise ChildFailed(self, self.p.wait())
        msg = json.loads(line)
        if "error" in msg:
            raise CheckFailed(f"{self.name}: {msg['error']}")
        return msg

    def ask(self, msg: dict) -> dict:
        self.tell(msg)
        return self.hear()

    def stop(self) -> int:
        try:
            self.tell({"cmd": "stop"})
            self.p.stdin.close()
        except ChildFailed:
            pass
        return self.p.wait()


class ChildFailed(Exception):
    def __init__(self, child: Child, status: int):
        self.child, self.status = child, status
        why = " (terminated by the guard: rule R1)" if status == 78 else ""
        super().__init__(f"{child.name} (pid {child.p.pid}) exited with status {status}{why}")


class CheckFailed(Exception):
    pass


def say(rank: int, text: str) -> None:
    """One line on stdout in one write(2), so concurrent processes never mix lines."""
    sys.stdout.write(f"learner {rank}: {text}\n")
    sys.stdout.flush()


def learner_main(a) -> int:
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")

    ok(cu.cuInit(0), "cuInit")
    if a.legacy:
        devices = legacy_devices(world)
        g = devices[local]
        err, dev = cu.cuDeviceGet(g)
        if int(err) != 0:
            say(rank, f"legacy training.devices[{local}]={g}: cuDeviceGet({g}) -> {error_name(err)}; "
                      "falling back to ordinal 0")
            dev = ok(cu.cuDeviceGet(0), "cuDeviceGet(0)")
    else:
        dev = ok(cu.cuDeviceGet(0), "cuDeviceGet(0)")
    ok(cu.cuCtxCreate(0, dev), "cuCtxCreate")
    gpu = uuid_text(dev)

    weights = ok(cu.cuMemAlloc(WEIGHTS_BYTES), "cuMemAlloc")
    rollouts = ok(cu.cuMemAlloc(a.collectors * SLOT_BYTES), "cuMemAlloc")
    ok(cu.cuMemsetD8(rollouts, 0, a.collectors * SLOT_BYTES), "cuMemsetD8")
    put(weights, weights_at(rank, 0))
    stream = ok(cu.cuStreamCreate(0), "cuStreamCreate")
    weights_ready = new_ipc_event()
    say(rank, f"cuda:0 is {gpu} (CUDA_VISIBLE_DEVICES={cvd}); {a.collectors} collectors, "
              f"an inference ring of {a.ring}, {a.steps} steps")

    children: list[Child] = []
    try:
        collectors = []
        for c in range(a.collectors):
            env = None
            if a.legacy and c == 1:
                # The legacy config spreads collectors over GPUs with global indices.
                other = legacy_devices(world)[(local + 1) % world]
                env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(other))
            collectors.append(Child(f"collector {c}", "collector", c, env))
        ring = [Child(f"inference {i}", "inference", i) for i in range(a.ring)]
        children = collectors + ring

        wh, rh = export(weights), export(rollouts)
        for c in collectors:
            c.tell({"rollouts": rh})
        for c in collectors:
            c.hear()
        handles = []
        eh = export_event(weights_ready)
        for m in ring:
            m.tell({"weights": wh, "weights_ready": eh})
        for m in ring:
            handles.append(m.hear()["handle"])
        for i, m in enumerate(ring):
            j = (i + 1) % len(ring)
            m.ask({"cmd": "neighbour", "index": j, "handle": handles[j]})

        for step in range(a.steps):
            for c in collectors:
                c.tell({"cmd": "collect", "step": step})
            for i, c in enumerate(collectors):
                reported = c.hear()["sha"]
                got = sha(get(rollouts, SLOT_BYTES, offset=i * SLOT_BYTES))
                if not reported == got == sha(rollout(rank, i, step)):
                    raise CheckFailed(f"step {step}: collector {i}'s rollout in the learner's buffer is wrong")
            w = weights_at(rank, step + 1)
            # The update goes on the learner's stream; the ring waits on its IPC event.
            # (From pageable memory the copy returns once `w` is staged: CUDA's API sync
            # behaviour, so `w` may go away.)
            ok(cu.cuMemcpyHtoDAsync(weights, w, WEIGHTS_BYTES, stream), "cuMemcpyHtoDAsync")
            ok(cu.cuEventRecord(weights_ready, stream), "cuEventRecord")
            for m in ring:
                m.ask({"cmd": "act", "step": step, "weights_sha": sha(w)})
            for m in ring:
                m.ask({"cmd": "check", "step": step, "weights_sha": sha(w)})
        ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")   # final weights in place
        say(rank, f"{a.steps} steps: {a.collectors * a.steps} rollouts and {a.ring * a.steps} ring "
                  "exchanges checked through IPC")
        for ch in children:
            st = ch.stop()
            if st != 0:
                raise ChildFailed(ch, st)
        children = []

        if world > 1 and a.rendezvous:
            peer_weights_check(a.rendezvous, rank, world, weights, a.steps)
            say(rank, f"read rank {(rank + 1) % world}'s final weights through IPC (between ranks: allowed)")
    except ChildFailed as e:
        say(rank, f"stopping: {e}")
        return e.status or 1
    except (CheckFailed, CudaFailure) as e:
        say(rank, f"FAILED: {e}")
        return 1
    finally:
        for ch in children:
            if ch.p.poll() is None:
                ch.p.kill()
            ch.p.wait()
    ok(cu.cuEventDestroy(weights_ready), "cuEventDestroy")
    ok(cu.cuStreamDestroy(stream), "cuStreamDestroy")
    ok(cu.cuMemFree(rollouts), "cuMemFree")
    ok(cu.cuMemFree(weights), "cuMemFree")
    say(rank, "done, every check passed")
    return 0


def wait_for(path: pathlib.Path) -> None:
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out waiting for {path} (did another rank fail?)")
        time.sleep(0.02)


def write_atomic(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def peer_weights_check(directory: str, rank: int, world: int, weights, steps: int) -> None:
    """Learner r imports learner r+1's weights and checks them; each keeps its weights
    alive until its reader says it is done."""
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / f"weights.{rank}", export(weights))
    peer = (rank + 1) % world
    wait_for(d / f"weights.{peer}")
    ptr = import_((d / f"weights.{peer}").read_text())
    good = sha(get(ptr, WEIGHTS_BYTES)) == sha(weights_at(peer, steps))
    ok(cu.cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")
    write_atomic(d / f"read.{peer}", "1")
    if not good:
        raise CheckFailed(f"rank {peer}'s weights read through IPC are wrong")
    wait_for(d / f"read.{rank}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--legacy", action="store_true",
                    help="the pre-contract config: global device indices, a collector on another GPU")
    ap.add_argument("--collectors", type=int, default=2)
    ap.add_argument("--ring", type=int, default=2, help="inference ring size")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rendezvous", metavar="DIR",
                    help="a directory the ranks share for the inter-rank weights check (skipped without it)")
    ap.add_argument("--role", choices=["learner", "collector", "inference"], default="learner",
                    help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.role == "learner":
        if "RANK" not in os.environ:
            ap.error("RANK is not set: start it under a launcher, e.g. "
                     "rankguard launch --nproc-per-node 4 -- python examples/rl_job.py")
        if a.collectors < (2 if a.legacy else 1) or a.ring < 2 or a.steps < 1:
            ap.error("need --collectors >= 1 (2 with --legacy), --ring >= 2, --steps >= 1")
        return learner_main(a)
    try:
        return collector_main(a) if a.role == "collector" else inference_main(a)
    except CudaFailure as e:
        sys.stderr.write(f"{a.role} {a.index} of rank {os.environ.get('RANK', '?')} (pid {os.getpid()}): {e}\n")
        sys.stderr.flush()
        return 1


if __name__ == "__main__":
    sys.exit(main())

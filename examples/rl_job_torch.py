#!/usr/bin/env python3
"""examples/rl_job.py's RL job written with PyTorch: what our users run.

One rank (started by a launcher that sets RANK, LOCAL_RANK, WORLD_SIZE and a one-entry
CUDA_VISIBLE_DEVICES) is a process tree sharing CUDA tensors through torch's own IPC
(`torch.multiprocessing`, start method spawn: CUDA tensors put on a queue are exported with
cudaIpcGetMemHandle and an interprocess event, and imported by the receiver):
- the learner owns the rank's GPU: a weights tensor and a rollout buffer on cuda:0;
- collectors receive the rollout buffer and write their rollouts into their slots; the
  learner checks every slot through a host copy (`.cpu()`) against what the collector
  reports and what it should be;
- a replay process receives a device copy of each step's rollouts and checks it;
- an inference ring receives the learner's weights and its `weights_ready` event (an
  interprocess `torch.cuda.Event`), waits on it after each update, checks the weights and
  writes its actions into its own CUDA tensor, which its ring neighbour received and
  checks.
Every byte is compared through host copies, with SHA-256.

`--legacy` is the configuration the contract replaces: the learner calls
`torch.cuda.set_device(LOCAL_RANK)` (its global index; rule R2: in-rank code names cuda:0)
and falls back to cuda:0 when CUDA refuses it, and collector 1 re-points itself to the next
GPU by rewriting CUDA_VISIBLE_DEVICES before it touches CUDA (rule R1), from where it opens
the learner's tensor across GPUs (rule R3). `planted_violations()` is what that provokes.

On the fake node (no GPU): `rankguard launch --nproc-per-node 4 -- scripts/fake-node
python examples/rl_job_torch.py`; the fake runs no kernels, and this job moves data only by
copies and fills. Exit status: 0 when every check passed; a child's non-zero status is
passed on (78: the guard terminated it); 1 for a failed check.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import queue
import sys

WEIGHTS_BYTES = 64 * 1024
SLOT_BYTES = 16 * 1024
CHILD_TIMEOUT_S = 150.0   # a hang detector: spawned children import torch, slow on a busy machine


def planted_violations(world: int) -> list[dict]:
    """The guard decisions `--legacy` provokes in warn mode, per (rank, rule, call).

    Per rank r: the learner's cudaSetDevice(r) names a global index (R2) unless r is 0;
    collector 1 sees another GPU at cuInit (R1) and imports the learner's rollout buffer
    from there: torch opens the tensor's event, then its memory (R3 on both).
    """
    out = []
    for r in range(world):
        if r != 0:
            out.append({"rank": r, "rule": "R2", "call": "cudaSetDevice"})
        out.append({"rank": r, "rule": "R1", "call": "cuInit"})
        out.append({"rank": r, "rule": "R3", "call": "cudaIpcOpenEventHandle"})
        out.append({"rank": r, "rule": "R3", "call": "cudaIpcOpenMemHandle"})
    return out


def pattern(n: int, *seed) -> bytes:
    out = bytearray()
    block = hashlib.sha256(repr(seed).encode()).digest()
    while len(out) < n:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:n])


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def host_bytes(t) -> bytes:
    """The tensor's bytes, through a device-to-host copy."""
    return t.cpu().numpy().tobytes()


def as_tensor(b: bytes):
    import torch
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def weights_at(rank: int, step: int) -> bytes:
    return pattern(WEIGHTS_BYTES, "weights", rank, step)


def rollout(rank: int, collector: int, step: int) -> bytes:
    return pattern(SLOT_BYTES, "rollout", rank, collector, step)


def actions(weights_sha: str, member: int, step: int) -> bytes:
    return pattern(SLOT_BYTES, "actions", weights_sha, member, step)


# ---------------------------------------------------------------------------- children
# Each runs in a spawned process; `inq` brings the learner's commands, `outq` takes replies
# (role, index, ...). A failed check is reported as ("error", text).

def collector(index: int, rank: int, legacy_gpu: int | None, inq, outq) -> None:
    if legacy_gpu is not None:
        # The legacy config spreads collectors over GPUs by global index.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(legacy_gpu)
    import torch
    _, buf = inq.get()                       # the learner's rollout buffer (CUDA IPC)
    outq.put(("ready", index, torch.cuda.get_device_name(0)))
    while True:
        msg = inq.get()
        if msg[0] == "stop":
            break
        step = msg[1]
        data = rollout(rank, index, step)
        buf[index * SLOT_BYTES:(index + 1) * SLOT_BYTES].copy_(as_tensor(data))
        torch.cuda.synchronize()
        outq.put(("collected", index, sha(data)))
    del buf


def replay(index: int, inq, outq) -> None:
    import torch
    kept = []
    while True:
        msg = inq.get()
        if msg[0] == "stop":
            break
        _, step, rollouts = msg
        kept = (kept + [rollouts])[-2:]          # a small replay memory of device tensors
        outq.put(("stored", index, step, sha(host_bytes(rollouts))))
    del kept
    torch.cuda.synchronize()


def inference(index: int, ring: int, inq, own_nq, neighbour_nq, outq) -> None:
    import torch
    _, weights, event_handle = inq.get()
    ready = torch.cuda.Event.from_ipc_handle(0, event_handle)
    own = torch.zeros(SLOT_BYTES, dtype=torch.uint8, device="cuda")
    neighbour_nq.put(("actions", own))           # the ring neighbour reads our actions
    _, theirs = own_nq.get()
    outq.put(("ready", index, None))
    while True:
        msg = inq.get()
        if msg[0] == "stop":
            break
        cmd, step, wsha = msg
        if cmd == "act":
            ready.synchronize()                  # the learner's copy of new weights is done
            if sha(host_bytes(weights)) != wsha:
                outq.put(("error", f"inference {index}: weights read through IPC are wrong (step {step})"))
                return
            own.copy_(as_tensor(actions(wsha, index, step)))
            torch.cuda.synchronize()
        else:
            j = (index - 1) % ring                # whose tensor we received
            if host_bytes(theirs) != actions(wsha, j, step):
                outq.put(("error", f"inference {index}: member {j}'s actions are wrong (step {step})"))
                return
        outq.put(("ok", index, step))
    del theirs, weights, ready
    # Keep our exported tensor alive until the neighbour let go of it.
    outq.put(("released", index, None))
    inq.get()


# ---------------------------------------------------------------------------- the learner

class ChildFailed(Exception):
    def __init__(self, name: str, status: int):
        self.status = status
        why = " (terminated by the guard)" if status == 78 else ""
        super().__init__(f"{name} exited with status {status}{why}")


class CheckFailed(Exception):
    pass


def say(rank: int, text: str) -> None:
    sys.stdout.write(f"learner {rank}: {text}\n")
    sys.stdout.flush()


def learner(a) -> int:
    import torch
    import torch.multiprocessing as mp

    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.legacy:
        try:
            torch.cuda.set_device(local)          # the legacy `training.devices[LOCAL_RANK]`
        except RuntimeError as e:
            say(rank, f"legacy torch.cuda.set_device({local}): {str(e).splitlines()[0]}; falling back to cuda:0")
            torch.cuda.set_device(0)
    else:
        torch.cuda.set_device(0)
    weights = torch.tensor(list(weights_at(rank, 0)), dtype=torch.uint8, device="cuda")
    rollouts = torch.zeros(a.collectors * SLOT_BYTES, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    weights_ready = torch.cuda.Event(interprocess=True)
    weights_ready.record()
    say(rank, f"cuda:0 is {torch.cuda.get_device_name(0)} (CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES')}); {a.collectors} collectors, a replay, "
              f"an inference ring of {a.ring}, {a.steps} steps")

    ctx = mp.get_context(a.start_method)
    if a.start_method == "forkserver":
        ctx.set_forkserver_preload(["torch"])
    outq = ctx.Queue()
    procs: dict[str, object] = {}
    inqs: dict[str, object] = {}

    def start(name, target, *args):
        p = ctx.Process(target=target, args=args, name=name)
        procs[name] = p
        p.start()

    def hear(expect: str):
        """The next reply; a child that died (the guard's 78 among others) is ChildFailed."""
        waited = 0.0
        while True:
            try:
                msg = outq.get(timeout=0.2)
            except queue.Empty:
                waited += 0.2
                for name, p in procs.items():
                    if p.exitcode not in (None, 0):
                        raise ChildFailed(name, p.exitcode)
                if waited > CHILD_TIMEOUT_S:
                    raise CheckFailed(f"no '{expect}' from the children in {CHILD_TIMEOUT_S:.0f} s")
                continue
            if msg[0] == "error":
                raise CheckFailed(msg[1])
            if msg[0] != expect:
                raise CheckFailed(f"expected '{expect}', got {msg!r}")
            return msg

    try:
        for c in range(a.collectors):
            other = (local + 1) % world if a.legacy and c == 1 else None
            inqs[f"collector {c}"] = ctx.Queue()
            start(f"collector {c}", collector, c, rank, other, inqs[f"collector {c}"], outq)
        inqs["replay"] = ctx.Queue()
        start("replay", replay, 0, inqs["replay"], outq)
        ring_q = [ctx.Queue() for _ in range(a.ring)]
        ring_nq = [ctx.Queue() for _ in range(a.ring)]   # between ring neighbours
        for i in range(a.ring):
            inqs[f"inference {i}"] = ring_q[i]
            start(f"inference {i}", inference, i, a.ring, ring_q[i], ring_nq[i],
                  ring_nq[(i + 1) % a.ring], outq)

        for c in range(a.collectors):
            inqs[f"collector {c}"].put(("hello", rollouts))
        for i in range(a.ring):
            ring_q[i].put(("hello", weights, weights_ready.ipc_handle()))
        for _ in range(a.collectors + a.ring):
            hear("ready")

        for step in range(a.steps):
            for c in range(a.collectors):
                inqs[f"collector {c}"].put(("collect", step))
            reported = {}
            for _ in range(a.collectors):
                _, c, s = hear("collected")
                reported[c] = s
            got = host_bytes(rollouts)
            for c in range(a.collectors):
                mine = sha(got[c * SLOT_BYTES:(c + 1) * SLOT_BYTES])
                if not reported[c] == mine == sha(rollout(rank, c, step)):
                    raise CheckFailed(f"step {step}: collector {c}'s rollout in the learner's buffer is wrong")
            inqs["replay"].put(("store", step, rollouts.clone()))
            if hear("stored")[3] != sha(got):
                raise CheckFailed(f"step {step}: the replay's copy of the rollouts is wrong")
            w = weights_at(rank, step + 1)
            with torch.cuda.stream(stream):
                weights.copy_(as_tensor(w).pin_memory(), non_blocking=True)
                weights_ready.record(stream)
            for cmd in ("act", "check"):
                for i in range(a.ring):
                    ring_q[i].put((cmd, step, sha(w)))
                for _ in range(a.ring):
                    hear("ok")
        say(rank, f"{a.steps} steps: {a.collectors * a.steps} rollouts, {a.steps} replay copies and "
                  f"{a.ring * a.steps} ring exchanges checked through host copies")
        for name, q in inqs.items():
            q.put(("stop",))
        for _ in range(a.ring):
            hear("released")
        for i in range(a.ring):
            ring_q[i].put(("bye",))
        for name, p in procs.items():
            p.join(CHILD_TIMEOUT_S)
            if p.exitcode != 0:
                raise ChildFailed(name, p.exitcode if p.exitcode is not None else -1)
    except ChildFailed as e:
        say(rank, f"stopping: {e}")
        return e.status or 1
    except CheckFailed as e:
        say(rank, f"FAILED: {e}")
        return 1
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
            p.join()
    say(rank, "done, every check passed")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--legacy", action="store_true",
                    help="the pre-contract config: set_device(LOCAL_RANK), a collector on another GPU")
    ap.add_argument("--collectors", type=int, default=2)
    ap.add_argument("--ring", type=int, default=2, help="inference ring size")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--start-method", choices=["spawn", "forkserver"], default="spawn",
                    help="torch.multiprocessing's start method (both start children with no CUDA "
                         "state; forkserver imports torch once per rank)")
    a = ap.parse_args(argv)
    if "RANK" not in os.environ:
        ap.error("RANK is not set: start it under a launcher, e.g. rankguard launch "
                 "--nproc-per-node 4 -- scripts/fake-node python examples/rl_job_torch.py")
    if a.collectors < (2 if a.legacy else 1) or a.ring < 2 or a.steps < 1:
        ap.error("need --collectors >= 1 (2 with --legacy), --ring >= 2, --steps >= 1")
    return learner(a)


if __name__ == "__main__":
    sys.exit(main())

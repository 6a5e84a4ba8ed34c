"""The launcher API: `plan()` and `check()`, for frameworks that start their ranks themselves.

Both run this package's `rankguard` binary and read its stable JSON (`rankguard plan --json
--env`, `rankguard check --json`; docs/cli.md), so the decisions are exactly the CLI's:
there is no second planner here. `plan()` returns, per rank, the complete environment to
start that rank with: the launcher's environment plus what `rankguard launch` would set
(the guard in LD_PRELOAD, the single-entry CUDA_VISIBLE_DEVICES, the rank's identity, the
torchrun variables, RANKGUARD_JOB), and its CPU block.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

__all__ = ["CheckResult", "ConflictError", "ContractError", "Device", "DriverInfo", "GuardInfo", "Rank",
           "RankguardError", "check", "plan"]

# The CLI's "refused: nothing was started" status (docs/cli.md, "Exit statuses").
_EXIT_USAGE = 2


class RankguardError(RuntimeError):
    """The `rankguard` binary failed in a way that is not a refusal (it could not run, or
    printed something that is not its JSON)."""


class ConflictError(ValueError):
    """What `rankguard` refuses with status 2: a precedence conflict (an external
    single-entry CUDA_VISIBLE_DEVICES and more ranks), a malformed CUDA_VISIBLE_DEVICES, more
    ranks than devices, CPU blocks outside the affinity, bad arguments. `str()` is the CLI's
    message, which names the conflict and the fix."""

    def __init__(self, message: str, command: Sequence[str]):
        super().__init__(message)
        self.message = message
        self.command = list(command)


class ContractError(RuntimeError):
    """Raised by `CheckResult.raise_if_violated()`: a rank started in this environment would
    break the contract; `problems` says why."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Rank:
    """One rank of a plan: start it with `env` (complete: no other environment is needed)
    inside `cpus` (`os.sched_setaffinity`), or with the inherited affinity when `cpus` is
    None.

    `repr()` and `str()` leave `env` out (it is the launcher's whole environment: tokens,
    passwords): they show the rank, its GPU, its CPU block and how many variables `env`
    holds. Read `env` itself where the values are needed."""

    rank: int
    local_rank: int
    env: Dict[str, str] = field(repr=False)
    cpus: Optional[List[int]]
    cuda_visible_devices: str
    """The rank's one CUDA_VISIBLE_DEVICES entry (also in `env`)."""
    uuid: Optional[str]
    """Its GPU's UUID as the driver reports it; None when the driver could not be asked."""
    numa_node: Optional[int]

    def __repr__(self) -> str:
        return (f"Rank(rank={self.rank!r}, local_rank={self.local_rank!r}, "
                f"cuda_visible_devices={self.cuda_visible_devices!r}, uuid={self.uuid!r}, "
                f"numa_node={self.numa_node!r}, cpus={self.cpus!r}, "
                f"env=<{len(self.env)} variables, not shown>)")


@dataclass(frozen=True)
class Device:
    ordinal: int
    uuid: str
    bus_id: str
    numa_node: Optional[int]
    local_cpus: Optional[str]


@dataclass(frozen=True)
class DriverInfo:
    ok: bool
    count: Optional[int]
    devices: List[Device]
    error: Optional[str]


@dataclass(frozen=True)
class GuardInfo:
    preloaded: bool
    preload_entry: Optional[str]
    library: Optional[str]
    mode: str


@dataclass(frozen=True)
class CheckResult:
    """`rankguard check --json` (docs/cli.md, "check --json"), typed."""

    ok: bool
    cuda_visible_devices: Optional[str]
    mode: str
    entries: List[str]
    driver: DriverInfo
    guard: GuardInfo
    rank_gpu: Optional[str]
    rank_gpu_matches: Optional[bool]
    job: Optional[str]
    affinity: Optional[str]
    omp_num_threads: Optional[str]
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def raise_if_violated(self) -> None:
        """Raise ContractError when a rank started here would break the contract."""
        if not self.ok:
            raise ContractError(self.problems)


Env = Mapping[str, str]


def _run(args: List[str], env: Optional[Env], ok: Sequence[int]) -> Dict[str, Any]:
    from . import executable

    cmd = [executable(), *args]
    env = dict(os.environ if env is None else env)
    p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    message = p.stderr.strip()
    # The CLI's error line: `rankguard: error: MSG`, or `rankguard CMD: error: REST` for a
    # message that names its command (src/cli/mod.rs, error_line); the message is MSG.
    m = re.match(r"rankguard( [a-z-]+)?: error: ", message)
    if m:
        message = (f"rankguard{m.group(1)}: " if m.group(1) else "") + message[m.end():]
    if p.returncode == _EXIT_USAGE:
        raise ConflictError(message or f"{' '.join(cmd)} refused (status 2)", cmd)
    if p.returncode not in ok:
        raise RankguardError(f"{' '.join(cmd)} exited with status {p.returncode}: {message}")
    try:
        out = json.loads(p.stdout)
    except ValueError as e:
        raise RankguardError(f"{' '.join(cmd)} did not print JSON ({e}): {p.stdout[:200]!r}") from None
    if not isinstance(out, dict):
        raise RankguardError(f"{' '.join(cmd)} printed {type(out).__name__}, not a JSON object")
    return out


def _list_arg(value: Union[str, Sequence[int]]) -> str:
    return value if isinstance(value, str) else ",".join(str(int(v)) for v in value)


def plan(nproc_per_node: Union[int, str, None] = None, devices: Union[str, Sequence[int], None] = None,
         cpu_ids: Union[str, Sequence[Sequence[int]], None] = None, env: Optional[Env] = None, *,
         nnodes: Optional[int] = None, node_rank: Optional[int] = None, master_addr: Optional[str] = None,
         master_port: Optional[int] = None, sysroot: Optional[str] = None) -> List[Rank]:
    """The ranks `rankguard launch` would start with these options, one item per rank.

    nproc_per_node: a count, or "gpu" (one rank per selected device); None as the CLI's
    default. devices: positions in the visible device list ("0,2", "0-3" or [0, 2]).
    cpu_ids: "auto", a CLI block list ("0-3/4-7"), or one list of CPUs per rank. env: the
    launcher's environment (default os.environ); each rank's `env` is it plus what launch
    sets. Raises ConflictError where the CLI refuses (status 2), naming the conflict.
    """
    args = ["plan", "--json", "--env"]
    if nproc_per_node is not None:
        args += ["--nproc-per-node", str(nproc_per_node)]
    if devices is not None:
        args += ["--devices", _list_arg(devices)]
    if cpu_ids is not None:
        blocks = cpu_ids if isinstance(cpu_ids, str) else "/".join(_list_arg(b) for b in cpu_ids)
        args += ["--cpu-ids", blocks]
    for flag, value in (("--nnodes", nnodes), ("--node-rank", node_rank), ("--master-addr", master_addr),
                        ("--master-port", master_port), ("--sysroot", sysroot)):
        if value is not None:
            args += [flag, str(value)]
    base = dict(os.environ if env is None else env)
    out = _run(args, base, ok=(0,))
    ranks = []
    for r in out["ranks"]:
        child = dict(base)
        for k, v in r["env"].items():
            if v is None:
                child.pop(k, None)
            else:
                child[k] = v
        ranks.append(Rank(rank=r["rank"], local_rank=r["local_rank"], env=child, cpus=r["cpu_list"],
                          cuda_visible_devices=r["cuda_visible_devices"], uuid=r["uuid"], numa_node=r["numa_node"]))
    return ranks


def check(env: Optional[Env] = None, *, sysroot: Optional[str] = None) -> CheckResult:
    """What `rankguard check --json` says about `env` (default os.environ): whether a rank
    started there keeps the contract (`ok`; `problems` says why not), what the driver
    enumerates, the guard's state. `raise_if_violated()` turns a violation into a
    ContractError, so a framework fails early instead of with status 78 at cuInit."""
    args = ["check", "--json"] + (["--sysroot", sysroot] if sysroot is not None else [])
    out = _run(args, env, ok=(0, 1))
    d = out["driver"]
    g = out["guard"]
    return CheckResult(
        ok=out["ok"], cuda_visible_devices=out["cuda_visible_devices"], mode=out["mode"], entries=out["entries"],
        driver=DriverInfo(ok=d["ok"], count=d["count"], error=d["error"],
                          devices=[Device(ordinal=x["ordinal"], uuid=x["uuid"], bus_id=x["bus_id"],
                                          numa_node=x["numa_node"], local_cpus=x["local_cpus"])
                                   for x in d["devices"]]),
        guard=GuardInfo(preloaded=g["preloaded"], preload_entry=g["preload_entry"], library=g["library"],
                        mode=g["mode"]),
        rank_gpu=out["rank_gpu"], rank_gpu_matches=out["rank_gpu_matches"], job=out["job"],
        affinity=out["affinity"], omp_num_threads=out["omp_num_threads"], problems=out["problems"],
        warnings=out["warnings"])

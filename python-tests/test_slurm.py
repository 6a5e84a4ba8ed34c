"""Slurm end to end: the README's srun recipes under a real single-node Slurm cluster.

The module starts Debian's Slurm (slurmctld, slurmd; installed with munge by scripts/setup)
on loopback, with every file in a temporary directory: munged with its own key and socket,
the controller's state, slurmd's spool. The node has 8 GPUs as GRES `gpu`, backed by
character devices made with mknod in a private directory (never the real /dev) and by the
fake CUDA platform (`FAKECUDA_GPUS=8`, the same GPU indices). `SlurmdParameters=
config_overrides` lets the node claim 8 single-core CPUs on a 2-core machine. Without
device cgroups, Slurm sets CUDA_VISIBLE_DEVICES to the node-global indices of the GPUs it
bound (with `--gpus-per-task 1`, one per task).

Everything is stopped at the end, on failure too: jobs cancelled, daemons terminated, and
any process still tied to the cluster (slurmstepd, tasks: found by their working directory,
open files or environment) killed.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess

import pytest

from _cli import CHILD, alive, uuid, wait_for
from conftest import CLI, PYTHON, TESTS, clean_env, run

TASK = pathlib.Path(__file__).resolve().parent / "_slurm_task.py"
PEER = TESTS / "ipc_peer"
GUARD_CALL = TESTS / "guard_call"
NODE = "rgnode"
GPUS = 8
# The marker every process of the cluster carries (daemons and, through srun, tasks).
MARKER = "RANKGUARD_TEST_SLURM"
# Set in a task's environment: the cluster's TaskProlog injects the guard into it.
INJECT = "RANKGUARD_TEST_INJECT"
NEEDED = ["munged", "slurmctld", "slurmd", "srun", "sinfo", "squeue", "scancel"]


def _free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ours(tmp: pathlib.Path, keep=()) -> list[tuple[int, str]]:
    """Live processes tied to this cluster (other than this one and `keep`): slurmstepd
    clears its environment, so also by working directory and open files under `tmp`."""
    me, found = os.getpid(), []
    mark, root = f"{MARKER}={tmp}".encode(), str(tmp)
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in (me, *keep) or not alive(int(d.name)):
            continue
        try:
            tied = mark in (d / "environ").read_bytes().split(b"\0") or os.readlink(d / "cwd").startswith(root)
            if not tied:
                for fd in (d / "fd").iterdir():
                    with contextlib.suppress(OSError):
                        if os.readlink(fd).startswith(root):
                            tied = True
                            break
            if tied:
                found.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


def _die_with_parent():
    """PR_SET_PDEATHSIG(SIGKILL): a daemon must not outlive a killed test run."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


class Cluster:
    def __init__(self, tmp: pathlib.Path):
        self.tmp = tmp
        self.conf = tmp / "etc" / "slurm.conf"
        self.daemons: list[subprocess.Popen] = []

    def env(self, **extra: str | None) -> dict[str, str]:
        """The environment of srun and its tasks: the fake 8-GPU node, this cluster."""
        return clean_env(SLURM_CONF=str(self.conf), FAKECUDA_GPUS=str(GPUS), **{MARKER: str(self.tmp)}, **extra)

    def cmd(self, *args, env=None, timeout=60, **kw) -> subprocess.CompletedProcess:
        return run(list(args), env=env or self.env(), timeout=timeout, cwd=self.tmp, **kw)

    def srun(self, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
        return self.cmd("srun", *args, env=env, timeout=timeout)

    def write_config(self):
        t = self.tmp
        for d in ("etc", "state", "spool", "munge", "dev", "log"):
            (t / d).mkdir(mode=0o700)
        for i in range(GPUS):  # NVIDIA's character devices: major 195, minor = index
            os.mknod(t / "dev" / f"nvidia{i}", 0o600 | 0o020000, os.makedev(195, i))
        key = t / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text(f"""\
ClusterName=rankguard
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={t}/munge/sock
StateSaveLocation={t}/state
SlurmdSpoolDir={t}/spool
SlurmctldPidFile={t}/state/slurmctld.pid
SlurmdPidFile={t}/spool/slurmd.pid
SlurmctldLogFile={t}/log/slurmctld.log
SlurmdLogFile={t}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
GresTypes=gpu
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
TaskProlog={t}/etc/task_prolog.sh
ReturnToService=2
KillWait=2
MessageTimeout=10
NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=8 Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
""")
        # The operator's TaskProlog (README, "Turn it on for a whole cluster"); only the tasks
        # of the injection tests carry the marker, so the other tests' tasks are unchanged.
        prolog = t / "etc" / "task_prolog.sh"
        prolog.write_text(f'#!/bin/sh\n[ -n "${INJECT}" ] || exit 0\nexec {CLI} slurm-task-prolog\n')
        prolog.chmod(0o755)
        (t / "etc" / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={t}/dev/nvidia[0-{GPUS - 1}]\n")

    def start(self, *argv):
        """A daemon in the foreground, in its own session, killed if pytest itself dies."""
        log = open(self.tmp / "log" / f"{pathlib.Path(argv[0]).name}.out", "w")
        self.daemons.append(subprocess.Popen([str(a) for a in argv], env=self.env(), cwd=self.tmp, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, preexec_fn=_die_with_parent))
        log.close()

    @contextlib.contextmanager
    def running(self):
        """The cluster up for the with-block and down after it, whatever happened."""
        try:
            self.write_config()
            self.up()
            yield self
        finally:
            self.down()

    def sbatch(self, script: str, *, env, cwd: pathlib.Path, timeout: int, runner=run):
        """`sbatch --wait` of `script` in `cwd` (slurmd runs it there); the finished sbatch
        and what the job wrote to its output file (cwd/job.out; "" if it wrote none)."""
        out = cwd / "job.out"
        p = runner(["sbatch", "--wait", "--output", out, script], env=env, timeout=timeout, cwd=cwd)
        return p, out.read_text(errors="replace") if out.exists() else ""

    def logs(self) -> str:
        return "".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in sorted((self.tmp / "log").iterdir()))

    def up(self):
        t = self.tmp
        self.start("munged", "--foreground", "--force", f"--key-file={t}/munge/munge.key", f"--socket={t}/munge/sock",
                   f"--pid-file={t}/munge/munged.pid", f"--seed-file={t}/munge/munged.seed",
                   f"--log-file={t}/log/munged.log")
        assert wait_for(lambda: (t / "munge" / "sock").exists(), 20), "munged did not start\n" + self.logs()
        self.start("slurmctld", "-D", "-i", "-f", self.conf)
        self.start("slurmd", "-D", "-N", NODE, "-f", self.conf)

        def idle():
            p = self.cmd("sinfo", "-h", "-n", NODE, "-o", "%T", timeout=20)
            return p.returncode == 0 and p.stdout.strip() == "idle"
        assert wait_for(idle, 30, 0.2), "the Slurm node never became idle\n" + self.logs()

    def down(self):
        """Cancel every job, stop the daemons, kill whatever is still tied to the cluster."""
        if self.daemons and all(d.poll() is None for d in self.daemons):
            with contextlib.suppress(Exception):
                self.cmd("scancel", "--quiet", f"--user={os.getuid()}", timeout=20)
                wait_for(lambda: self.cmd("squeue", "-h", timeout=20).stdout.strip() == "", 15, 0.2)
        for d in reversed(self.daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.pid, signal.SIGTERM)
        for d in reversed(self.daemons):
            try:
                d.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(d.pid, signal.SIGKILL)
                d.wait(timeout=10)
        for pid, _ in _ours(self.tmp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not _ours(self.tmp), 10), f"left running: {_ours(self.tmp)}"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [b for b in NEEDED if shutil.which(b) is None]
    assert not missing, f"{missing} not found: scripts/setup installs Slurm (slurm-wlm) and munge"
    assert os.geteuid() == 0, "the Slurm suite runs slurmd as root and makes device nodes (mknod); run it as root"
    # A short path: munge's socket path must fit in sun_path (108 bytes).
    with Cluster(tmp_path_factory.mktemp("slurm")).running() as c:
        yield c


def tasks(stdout: str, tag: str = "CHILD") -> list[dict]:
    """The tasks' JSON reports, ordered by Slurm rank (SLURM_PROCID)."""
    out = [json.loads(line.split(f"{tag} ", 1)[1]) for line in stdout.splitlines() if f"{tag} {{" in line]
    key = (lambda c: int(c["env"]["SLURM_PROCID"])) if tag == "CHILD" else (lambda c: c["rank"])
    return sorted(out, key=key)


@contextlib.contextmanager
def holding(c: Cluster, gpus: int):
    """A job holding the first `gpus` GPUs (and one CPU), so the recipes get GPUs that are
    not 0..N-1 and the test sees that Slurm's indices are kept."""
    p = subprocess.Popen(["srun", "--ntasks", "1", f"--gpus={gpus}", "sleep", "300"], env=c.env(), cwd=c.tmp,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: c.cmd("squeue", "-h", "-t", "R", "-o", "%i").stdout.strip() != "", 20, 0.1), \
            "the holding job never ran\n" + c.logs()
        yield
    finally:
        c.cmd("scancel", "--quiet", f"--user={os.getuid()}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
        assert wait_for(lambda: c.cmd("squeue", "-h").stdout.strip() == "", 20, 0.1), "the holding job stayed"


def probe(c: Cluster, *opts: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES as Slurm itself sets it for each task of a step with `opts`."""
    p = c.srun(*opts, "--label", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"')
    assert p.returncode == 0, p.stderr
    return [v for _, v in sorted((int(l.split(":", 1)[0]), l.split(":", 1)[1].strip())
                                 for l in p.stdout.splitlines())]


def check_ranks(kids: list[dict], entries: list[str]):
    """Each task sees exactly its entry, as cuda:0, under the guard, on its own GPU."""
    assert [k["env"]["CUDA_VISIBLE_DEVICES"] for k in kids] == entries
    assert [k["env"]["RANKGUARD_RANK_GPU"] for k in kids] == entries
    for k, e in zip(kids, entries):
        assert k["guard_loaded"], k
        assert k["env"]["LD_PRELOAD"].split(":")[0].endswith("/librankguard.so")
        assert k["cuda"]["count"] == 1 and k["cuda"]["devices"][0]["uuid"] == uuid(int(e))
        assert k["env"]["RANKGUARD_RANK_GPU_UUID"] == uuid(int(e))
    step = {(k["env"]["SLURM_JOB_ID"], k["env"]["SLURM_STEP_ID"]) for k in kids}
    assert len(step) == 1
    ((job, stepid),) = step
    # The job id is Slurm's (the same derivation as the guard's, crates/core/src/jobid.rs).
    assert {k["env"]["RANKGUARD_JOB"] for k in kids} == {f"slurm:{job}.{stepid}"}


def test_gpus_per_task_recipe(slurm):
    """srun --ntasks 4 --gpus-per-task 1 rankguard run -- python rank.py"""
    opts = ["--ntasks", "4", "--gpus-per-task", "1"]
    with holding(slurm, 3):
        slurm_cvds = probe(slurm, *opts)
        # Slurm exports one entry per task: the node-global index of the GPU it bound.
        assert slurm_cvds == ["3", "4", "5", "6"], slurm_cvds
        p = slurm.srun(*opts, CLI, "run", "--", PYTHON, CHILD)
    assert p.returncode == 0, p.stdout + p.stderr
    kids = tasks(p.stdout)
    assert [k["env"]["SLURM_PROCID"] for k in kids] == ["0", "1", "2", "3"]
    check_ranks(kids, slurm_cvds)  # kept verbatim


def test_gpus_per_node_recipe_narrowed_by_local_id(slurm):
    """srun --ntasks-per-node 4 --gpus-per-node 4 rankguard run --narrow-by SLURM_LOCALID -- ..."""
    opts = ["--ntasks-per-node", "4", "--gpus-per-node", "4"]
    with holding(slurm, 2):
        slurm_cvds = probe(slurm, *opts)
        # Every task gets the step's four GPUs ...
        assert slurm_cvds == ["2,3,4,5"] * 4, slurm_cvds
        p = slurm.srun(*opts, CLI, "run", "--narrow-by", "SLURM_LOCALID", "--", PYTHON, CHILD)
        # ... and with --gpus-per-task 1 added, one each: the same recipe keeps it.
        assert probe(slurm, *opts, "--gpus-per-task", "1") == ["2", "3", "4", "5"]
        q = slurm.srun(*opts, "--gpus-per-task", "1", CLI, "run", "--narrow-by", "SLURM_LOCALID", "--", PYTHON, CHILD)
    assert p.returncode == 0, p.stdout + p.stderr
    check_ranks(tasks(p.stdout), ["2", "3", "4", "5"])
    assert q.returncode == 0, q.stdout + q.stderr
    check_ranks(tasks(q.stdout), ["2", "3", "4", "5"])


def _legacy(c: Cluster, mode: str) -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    """A legacy task: cuDeviceGet(SLURM_PROCID), its global rank as a device ordinal."""
    audit = c.tmp / f"audit-{mode}"
    audit.mkdir()
    env = c.env(RANKGUARD_MODE=mode, RANKGUARD_AUDIT=str(audit / "audit.%h.%p.jsonl"))
    p = c.srun("--ntasks", "4", "--gpus-per-task", "1", "--label", CLI, "run", "--", "sh", "-c",
               f'exec {GUARD_CALL} link cuDeviceGet "$SLURM_PROCID"', env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, audit


def records(audit: pathlib.Path) -> list[dict]:
    return [r for f in sorted(audit.iterdir()) for l in f.read_text().splitlines() if l.strip()
            for r in [json.loads(l)] if r.get("kind") != "map"]


def _codes(p) -> dict[int, str]:
    return {int(l.split(":", 1)[0]): l.split("rc=", 1)[1] for l in p.stdout.splitlines() if "rc=" in l}


def test_legacy_task_is_refused_in_enforce_and_recorded_in_warn(slurm):
    p, audit = _legacy(slurm, "enforce")
    assert _codes(p) == {0: "0", 1: "101", 2: "101", 3: "101"}, p.stdout
    for r in (1, 2, 3):
        line = next((l for l in p.stderr.splitlines() if f"[rank {r}] RANKGUARD DENY cuDeviceGet(" in l), "")
        assert f"ordinal={r}" in line and "denied" in line and "R2" in line, p.stderr
    p, audit = _legacy(slurm, "warn")
    # Passed through: the driver itself answers for the one GPU the task sees.
    assert _codes(p) == {0: "0", 1: "101", 2: "101", 3: "101"}, p.stdout
    recs = records(audit)
    assert sorted((r["rank"], r["verdict"], r["rule"], r["call"]) for r in recs) == [
        (r, "warn", "R2", "cuDeviceGet") for r in (1, 2, 3)]
    job = {r["job"] for r in recs}
    assert len(job) == 1 and job.pop().startswith("slurm:")
    # `rankguard report` over the job's audit names Slurm's ranks.
    rep = run([CLI, "report", audit], env=slurm.env())
    assert rep.returncode == 1, rep.stdout + rep.stderr
    assert "cuDeviceGet" in rep.stdout and "R2" in rep.stdout
    # One site broken the same way in ranks 1-3 is one entry with its rank list (report
    # folding, issue 32); rank 0 broke nothing.
    assert "cuDeviceGet: 3 warned in ranks 1-3" in rep.stdout, rep.stdout
    assert "rank 0" not in rep.stdout and "ranks 0" not in rep.stdout


def test_ipc_between_tasks_is_allowed_and_a_tasks_own_cross_device_import_is_r3(slurm):
    for d in ("pair", "own"):
        (slurm.tmp / d).mkdir()
    audit = slurm.tmp / "audit-ipc"
    audit.mkdir()
    reg = slurm.tmp / "registry"
    env = slurm.env(RANKGUARD_AUDIT=str(audit / "audit.%p.jsonl"), RANKGUARD_REGISTRY=str(reg))

    # Two tasks, two ranks, one GPU each, both through the recipe: rank 1 maps rank 0's
    # memory on its own GPU (NCCL's P2P pattern), allowed.
    p = slurm.srun("--ntasks", "2", "--gpus-per-task", "1", CLI, "run", "--", PYTHON, TASK, "pair",
                   slurm.tmp / "pair", PEER, CLI, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    t0, t1 = tasks(p.stdout, "TASK")
    assert t0["cvd"] != t1["cvd"]
    assert t0["exporter_rc"] == 0, t0
    assert t1["import_rc"] == 0 and "import-rc 0" in t1["import_out"], t1
    assert "RANKGUARD" not in t1["import_stderr"]
    assert records(audit) == []

    # One task given two GPUs: its exporter (through `rankguard run --device 0`) and another
    # process of the same rank preloaded directly on the second GPU. The guard's job id
    # comes from Slurm on both sides: the import is the rank's own, across devices, R3.
    p = slurm.srun("--ntasks", "1", "--gpus-per-task", "2", PYTHON, TASK, "own", slurm.tmp / "own", PEER, CLI,
                   env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    (t,) = tasks(p.stdout, "TASK")
    assert t["exporter_rc"] == 0, t
    assert t["import_rc"] == 0 and "import-rc 800" in t["import_out"], t
    (rec,) = records(audit)
    assert rec["rule"] == "R3" and rec["verdict"] == "deny"
    assert rec["job"] == rec["exporter_job"] == f"slurm:{t['job']}.{t['step']}"
    assert rec["rank"] == rec["exporter_rank"] == 0
    assert rec["exporter_gpu"] == uuid(int(t["first"])) and rec["gpu"] == uuid(int(t["second"]))
    assert rec["exporter_pid"] == t["exporter_pid"]


def test_scancel_leaves_nothing_running(slurm):
    pids = slurm.tmp / "pids"
    pids.mkdir()
    srun = subprocess.Popen(["srun", "--ntasks", "2", "--gpus-per-task", "1", CLI, "run", "--", PYTHON, CHILD,
                             "--no-cuda", "--pid-dir", pids, "--spawn", "--sleep", "300"],
                            env=slurm.env(), cwd=slurm.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        # The child writes each file whole under a dot name and renames it into place.
        written = lambda: [f for f in pids.iterdir() if not f.name.startswith(".")]
        assert wait_for(lambda: len(written()) == 4, 30), list(pids.iterdir())
        recorded = [int(f.read_text()) for f in written()]
        assert all(alive(p) for p in recorded)
        (job,) = slurm.cmd("squeue", "-h", "-o", "%i").stdout.split()
        assert slurm.cmd("scancel", job).returncode == 0
        srun.wait(timeout=30)
    finally:
        if srun.poll() is None:
            os.killpg(srun.pid, signal.SIGKILL)
            srun.wait()
            # A failure above must not leave the job holding GPUs for the next test.
            slurm.cmd("scancel", "--quiet", f"--user={os.getuid()}")
            wait_for(lambda: slurm.cmd("squeue", "-h").stdout.strip() == "", 20, 0.1)
    assert wait_for(lambda: not any(alive(p) for p in recorded), 20), [p for p in recorded if alive(p)]
    assert wait_for(lambda: slurm.cmd("squeue", "-h").stdout.strip() == "", 20, 0.1)
    # Nothing of the job is left: no slurmstepd, no task, no grandchild; only the daemons.
    daemons = [d.pid for d in slurm.daemons]
    assert wait_for(lambda: not _ours(slurm.tmp, keep=daemons + [p for d in daemons for p in _children(d)]), 20), \
        _ours(slurm.tmp, keep=daemons)


def _children(pid: int) -> list[int]:
    """A daemon's helper processes (slurmctld's slurmscriptd)."""
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
    return out


def test_task_prolog_guards_and_narrows_a_job_that_never_names_rankguard(slurm):
    """TaskProlog=rankguard slurm-task-prolog: `srun python rank.py`, each task on its GPU."""
    env = slurm.env(**{INJECT: "1"})
    opts = ["--ntasks", "4", "--gpus-per-node", "4"]
    with holding(slurm, 2):
        p = slurm.srun(*opts, PYTHON, CHILD, env=env)
        q = slurm.srun(*opts, "--gpus-per-task", "1", PYTHON, CHILD, env=env)
        # Legacy: cuDeviceGet(SLURM_LOCALID), the local rank as a device ordinal.
        legacy = slurm.srun(*opts, "--label", "sh", "-c", f'exec {GUARD_CALL} link cuDeviceGet "$SLURM_LOCALID"',
                            env=env)
    for r in (p, q):
        assert r.returncode == 0, r.stdout + r.stderr
        kids = tasks(r.stdout)
        assert [k["env"]["CUDA_VISIBLE_DEVICES"] for k in kids] == ["2", "3", "4", "5"]
        for k in kids:
            assert k["guard_loaded"] and k["env"]["LD_PRELOAD"].endswith("/librankguard.so"), k
            assert k["env"]["RANKGUARD_RANK_GPU"] == k["env"]["CUDA_VISIBLE_DEVICES"]
            assert k["cuda"]["count"] == 1
            assert k["cuda"]["devices"][0]["uuid"] == uuid(int(k["env"]["CUDA_VISIBLE_DEVICES"]))
    assert legacy.returncode == 0, legacy.stdout + legacy.stderr
    assert _codes(legacy) == {0: "0", 1: "101", 2: "101", 3: "101"}, legacy.stdout
    for r in (1, 2, 3):
        line = next((ln for ln in legacy.stderr.splitlines() if "RANKGUARD DENY cuDeviceGet(" in ln
                     and f"ordinal={r}" in ln), "")
        assert "denied" in line and "R2" in line, legacy.stderr


def test_task_prolog_without_the_guard_says_so_and_gives_no_gpu(slurm):
    # A node where the guard is missing: the task is not left unguarded on its GPUs.
    env = slurm.env(**{INJECT: "1", "RANKGUARD_LIB": str(slurm.tmp / "missing" / "librankguard.so")})
    p = slurm.srun("--ntasks", "1", "--gpus-per-node", "2", PYTHON, CHILD, env=env)
    out = p.stdout + p.stderr
    assert "this task is NOT guarded" in out and "missing/librankguard.so" in out, out
    # Slurm 22.05 does not start a task whose TaskProlog failed (the prolog exits 1); the
    # prolog also empties CUDA_VISIBLE_DEVICES for a Slurm that would start it anyway.
    assert p.returncode == 1 and "TaskProlog failed" in p.stderr, out
    assert tasks(p.stdout) == [], out

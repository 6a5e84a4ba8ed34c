"""Slurm with device cgroups (`ConstrainDevices=yes`, README "Slurm with device cgroups"):
the same single-node cluster as test_slurm.py, with `TaskPlugin=task/cgroup`,
`ProctrackType=proctrack/cgroup` and a cgroup.conf of `ConstrainDevices=yes` (cgroup/v1,
the hierarchy this machine mounts at /sys/fs/cgroup).

What changes there, and what these tests show on the real Slurm 22.05:
- each task's (or, without per-task binding, each step's) devices cgroup lets it open only
  its GPUs' device nodes (the gres.conf File= nodes: mknod'd 195:N nodes in a private
  directory; opening one with no driver behind it gives ENXIO when the cgroup allows it,
  EPERM when it does not);
- Slurm's CUDA_VISIBLE_DEVICES counts from 0 within what the cgroup allows (`0` per task
  with --gpus-per-task 1, `0,1,2,3` for a step of four GPUs), no longer the node's indices;
- `rankguard run` keeps a single entry verbatim and `--narrow-by SLURM_LOCALID` (the
  recipe, and the TaskProlog) picks entry SLURM_LOCALID of the step's list: the task's
  position among the GPUs the step's cgroup allows.

The fake CUDA platform does not read device nodes or cgroups: it enumerates its 8 GPUs
whatever the cgroup allows, so these tests check Slurm's half (the cgroup, the variable)
and the guard's half (the entry, the guard loaded, one device seen, R2 refused) apart;
that the real driver enumerates only the GPUs whose nodes a process may open is NVIDIA's.
"""
from __future__ import annotations

import os
import pathlib

import pytest

from _cli import CHILD
from conftest import CLI, PYTHON, run
from test_slurm import GUARD_CALL, INJECT, Cluster, _codes, holding, tasks

NODES = pathlib.Path(__file__).resolve().parent / "_slurm_nodes.py"
CGROUP = pathlib.Path("/sys/fs/cgroup")


class CgroupCluster(Cluster):
    def write_config(self):
        super().write_config()
        conf = self.conf.read_text()
        for old, new in (("ProctrackType=proctrack/linuxproc", "ProctrackType=proctrack/cgroup"),
                         ("TaskPlugin=task/none", "TaskPlugin=task/cgroup")):
            assert old in conf
            conf = conf.replace(old, new)
        self.conf.write_text(conf)
        (self.tmp / "etc" / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainDevices=yes\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\n")

    def down(self):
        super().down()
        # slurmd leaves its node's (empty) cgroup directories behind; remove them.
        for ctl in ("devices", "freezer"):
            for d in sorted((CGROUP / ctl).glob("slurm_rgnode/**/"), key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except OSError:
                    pass


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    assert os.geteuid() == 0, "the Slurm suite runs slurmd as root and makes device nodes (mknod); run it as root"
    assert (CGROUP / "devices" / "devices.allow").exists() and (CGROUP / "freezer" / "tasks").exists(), \
        "ConstrainDevices=yes needs the cgroup v1 devices and freezer controllers mounted under /sys/fs/cgroup"
    with CgroupCluster(tmp_path_factory.mktemp("slurmcg")).running() as c:
        yield c


def nodes(c: Cluster, *opts: str, cmd=()) -> tuple[list[dict], object]:
    p = c.srun(*opts, PYTHON, NODES, c.tmp / "dev", *(["--", *map(str, cmd)] if cmd else []))
    assert p.returncode == 0, p.stdout + p.stderr
    n = tasks(p.stdout, "NODES")
    assert all(t["other"] == {} for t in n), n
    return n, p


def test_each_task_opens_only_its_gpu_and_the_recipe_keeps_slurms_local_entry(slurm):
    """srun --ntasks 4 --gpus-per-task 1 rankguard run -- ...: every task's variable is `0`,
    an index into the one GPU its cgroup allows; the guard keeps it, as cuda:0."""
    opts = ["--ntasks", "4", "--gpus-per-task", "1"]
    with holding(slurm, 3):
        n, _ = nodes(slurm, *opts)
        # The cgroup: task r may open GPU 3+r's node only (the holding job has 0-2) ...
        assert [t["allowed"] for t in n] == [[3], [4], [5], [6]], n
        # ... and Slurm's CUDA_VISIBLE_DEVICES counts within it: `0` for each task.
        assert [t["cvd"] for t in n] == ["0"] * 4, n
        n, p = nodes(slurm, *opts, cmd=[CLI, "run", "--", PYTHON, CHILD])
        legacy = slurm.srun(*opts, "--label", CLI, "run", "--", "sh", "-c",
                            f'exec {GUARD_CALL} link cuDeviceGet "$SLURM_PROCID"')
    assert [t["allowed"] for t in n] == [[3], [4], [5], [6]], n
    kids = tasks(p.stdout)
    assert [k["env"]["SLURM_PROCID"] for k in kids] == ["0", "1", "2", "3"]
    for k in kids:
        assert k["guard_loaded"] and k["env"]["LD_PRELOAD"].split(":")[0].endswith("/librankguard.so"), k
        assert k["env"]["CUDA_VISIBLE_DEVICES"] == k["env"]["RANKGUARD_RANK_GPU"] == "0", k
        assert k["cuda"]["count"] == 1, k
    assert len({k["env"]["RANKGUARD_JOB"] for k in kids}) == 1
    # The guard's contract still applies inside the cgroup: ordinal SLURM_PROCID is refused.
    assert legacy.returncode == 0, legacy.stdout + legacy.stderr
    assert _codes(legacy) == {0: "0", 1: "101", 2: "101", 3: "101"}, legacy.stdout
    for r in (1, 2, 3):
        line = next((ln for ln in legacy.stderr.splitlines() if "RANKGUARD DENY cuDeviceGet(" in ln
                     and f"ordinal={r}" in ln), "")
        assert "R2" in line, legacy.stderr


def test_a_steps_gpus_narrowed_by_local_id_index_the_steps_cgroup(slurm):
    """srun --ntasks-per-node 4 --gpus-per-node 4 rankguard run --narrow-by SLURM_LOCALID:
    the step's cgroup allows its four GPUs to every task; Slurm's variable is `0,1,2,3`;
    task r keeps entry r, the r-th GPU the cgroup allows (the real driver's cuda:r there)."""
    opts = ["--ntasks-per-node", "4", "--gpus-per-node", "4"]
    with holding(slurm, 2):
        n, _ = nodes(slurm, *opts)
        assert [t["allowed"] for t in n] == [[2, 3, 4, 5]] * 4, n
        assert [t["cvd"] for t in n] == ["0,1,2,3"] * 4, n
        n, p = nodes(slurm, *opts, cmd=[CLI, "run", "--narrow-by", "SLURM_LOCALID", "--", PYTHON, CHILD])
    kids = tasks(p.stdout)
    assert [k["env"]["CUDA_VISIBLE_DEVICES"] for k in kids] == ["0", "1", "2", "3"], kids
    assert [k["env"]["RANKGUARD_RANK_GPU"] for k in kids] == ["0", "1", "2", "3"], kids
    for k in kids:
        assert k["guard_loaded"] and k["cuda"]["count"] == 1, k
    # Narrowing is CUDA's view, not the kernel's: each task may still open the step's nodes.
    assert [t["allowed"] for t in n] == [[2, 3, 4, 5]] * 4, n


def test_the_task_prolog_narrows_by_local_id_under_device_cgroups(slurm):
    """TaskProlog=rankguard slurm-task-prolog: `srun python rank.py` in a step of four GPUs."""
    env = slurm.env(**{INJECT: "1"})
    with holding(slurm, 2):
        p = slurm.srun("--ntasks", "4", "--gpus-per-node", "4", PYTHON, CHILD, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    kids = tasks(p.stdout)
    assert [k["env"]["CUDA_VISIBLE_DEVICES"] for k in kids] == ["0", "1", "2", "3"], kids
    for k in kids:
        assert k["guard_loaded"] and k["env"]["LD_PRELOAD"].endswith("/librankguard.so"), k
        assert k["env"]["RANKGUARD_RANK_GPU"] == k["env"]["CUDA_VISIBLE_DEVICES"]
        assert k["cuda"]["count"] == 1, k

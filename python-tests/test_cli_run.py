"""rankguard run: one rank, narrowed from a multi-entry CUDA_VISIBLE_DEVICES by an engine's
local-rank variable, the guard injected, then exec; and a real engine (Open MPI's mpirun)
driving it."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from _cli import CLI, child_cmd, children, clean_env, cli, uuid
from conftest import LIB_GUARD


def run_rank(*args, **env):
    return cli("run", *args, env=clean_env(FAKECUDA_GPUS="8", **env))


def one(p):
    assert p.returncode == 0, p.stderr
    (c,) = children(p.stdout)
    return c


def test_narrow_by_local_rank_gives_the_right_single_entry():
    c = one(run_rank("--narrow-by", "LOCAL_RANK", "--", *child_cmd(), CUDA_VISIBLE_DEVICES="4,5,6,7", LOCAL_RANK="2"))
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == "6"
    assert c["env"]["RANKGUARD_RANK_GPU"] == "6"
    assert c["env"]["RANKGUARD_RANK_GPU_UUID"] == uuid(6)
    assert c["env"]["LD_PRELOAD"] == str(LIB_GUARD.resolve())
    assert c["guard_loaded"]
    assert c["cuda"]["count"] == 1 and c["cuda"]["devices"][0]["uuid"] == uuid(6)
    # UUID lists narrow to the verbatim entry.
    cvd = f"GPU-12,{uuid(5)}"
    c = one(run_rank("--narrow-by", "SLURM_LOCALID", "--", *child_cmd(), CUDA_VISIBLE_DEVICES=cvd, SLURM_LOCALID="0"))
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-12"
    assert c["env"]["RANKGUARD_RANK_GPU_UUID"] == uuid(2)
    assert c["cuda"]["devices"][0]["uuid"] == uuid(2)
    # Unset CVD: every GPU, so position = ordinal.
    c = one(run_rank("--narrow-by", "LOCAL_RANK", "--", *child_cmd(), LOCAL_RANK="3"))
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == "3"
    assert c["cuda"]["devices"][0]["uuid"] == uuid(3)


def test_a_single_external_entry_is_authoritative():
    # Slurm with --gpus-per-task=1 already narrowed: the same recipe keeps its entry.
    c = one(run_rank("--narrow-by", "SLURM_LOCALID", "--", *child_cmd(), CUDA_VISIBLE_DEVICES=uuid(5),
                     SLURM_LOCALID="3"))
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == uuid(5)
    c = one(run_rank("--", *child_cmd(), CUDA_VISIBLE_DEVICES="5"))
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == "5"
    p = run_rank("--device", "GPU-13", "--", *child_cmd(), CUDA_VISIBLE_DEVICES=uuid(5))
    assert p.returncode == 2
    assert "--device 'GPU-13'" in p.stderr and f"CUDA_VISIBLE_DEVICES='{uuid(5)}'" in p.stderr


def test_device_flag():
    c = one(run_rank("--device", "1", "--", *child_cmd(), CUDA_VISIBLE_DEVICES="4,5"))
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == "5" and c["cuda"]["devices"][0]["uuid"] == uuid(5)
    c = one(run_rank("--device", "GPU-17", "--", *child_cmd()))
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-17" and c["cuda"]["devices"][0]["uuid"] == uuid(7)


@pytest.mark.parametrize("env,args,needles", [
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, [], ["CUDA_VISIBLE_DEVICES='0,1,2,3'", "--narrow-by", "LOCAL_RANK"]),
    ({}, [], ["CUDA_VISIBLE_DEVICES is unset", "--narrow-by"]),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, ["--narrow-by", "LOCAL_RANK"], ["LOCAL_RANK is not set"]),
    ({"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "2"}, ["--narrow-by", "LOCAL_RANK"],
     ["LOCAL_RANK=2", "CUDA_VISIBLE_DEVICES='0,1'"]),
    ({"CUDA_VISIBLE_DEVICES": "", "LOCAL_RANK": "0"}, ["--narrow-by", "LOCAL_RANK"], ["no GPU visible"]),
    ({"CUDA_VISIBLE_DEVICES": "0,2,-1", "LOCAL_RANK": "0"}, ["--narrow-by", "LOCAL_RANK"], ["malformed"]),
])
def test_refusals_say_the_fix_and_run_nothing(tmp_path, env, args, needles):
    p = run_rank(*args, "--", *child_cmd("--pid-dir", str(tmp_path)), **env)
    assert p.returncode == 2
    for n in needles:
        assert n in p.stderr, (n, p.stderr)
    assert list(tmp_path.iterdir()) == []


def test_run_execs_in_place_and_keeps_identity_and_job():
    proc = subprocess.Popen([str(CLI), "run", "--", *child_cmd("--no-cuda")], stdout=subprocess.PIPE, text=True,
                            env=clean_env(CUDA_VISIBLE_DEVICES="2", RANKGUARD_RANK_GPU="GPU-12",
                                          RANKGUARD_JOB="job-7"))
    out, _ = proc.communicate(timeout=60)
    (c,) = children(out)
    assert c["pid"] == proc.pid, "run must exec, not fork"
    assert c["env"]["RANKGUARD_RANK_GPU"] == "GPU-12"  # the outer rank's identity is kept
    # issue 14 item 8: the guard accepts a prefix only when it can verify it, so run
    # resolves an inherited identity that lacks its full UUID.
    assert c["env"]["RANKGUARD_RANK_GPU_UUID"] == uuid(2)
    assert c["env"]["RANKGUARD_JOB"] == "job-7"
    c = one(run_rank("--", *child_cmd("--no-cuda"), CUDA_VISIBLE_DEVICES="2", SLURM_JOB_ID="99", SLURM_STEP_ID="1"))
    assert c["env"]["RANKGUARD_JOB"] == "slurm:99.1"  # the guard's own derivation (crates/core/src/jobid.rs)


def test_run_missing_command_is_127():
    p = run_rank("--", "/no/such/program", CUDA_VISIBLE_DEVICES="0")
    assert p.returncode == 127 and "/no/such/program" in p.stderr


def test_run_inside_a_launched_rank_keeps_its_gpu():
    p = cli("launch", "--nproc-per-node", "2", "--", str(CLI), "run", "--narrow-by", "LOCAL_RANK", "--",
            *child_cmd(), env=clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="3,1"))
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in kids] == ["3", "1"]
    assert [c["cuda"]["devices"][0]["uuid"] for c in kids] == [uuid(3), uuid(1)]


def test_mpirun_drives_run():
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found: scripts/setup installs Open MPI (openmpi-bin)"
    env = clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="4,5,6,7", OMPI_ALLOW_RUN_AS_ROOT="1",
                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run([mpirun, "--oversubscribe", "-np", "4", str(CLI), "run", "--narrow-by",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "--", *child_cmd()],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    kids = sorted(children(p.stdout), key=lambda c: int(c["env"]["OMPI_COMM_WORLD_LOCAL_RANK"]))
    assert len(kids) == 4
    jobs = {c["env"]["RANKGUARD_JOB"] for c in kids}
    assert len(jobs) == 1, "every rank of one mpirun job shares a job id"
    for k, c in enumerate(kids):
        assert c["env"]["CUDA_VISIBLE_DEVICES"] == str(4 + k)
        assert c["env"]["RANKGUARD_RANK_GPU"] == str(4 + k)
        assert c["guard_loaded"], "the guard is not loaded in the rank"
        assert c["cuda"]["count"] == 1
        assert c["cuda"]["devices"][0]["uuid"] == uuid(4 + k)

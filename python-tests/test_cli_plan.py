"""rankguard plan: the rank -> GPU entry -> CPU block mapping, its stable JSON form, and
every device-precedence conflict (docs/design.md R5), checked without starting anything."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from _cli import CLI, bus, clean_env, cli, sysroot, uuid


def plan_json(*args, **env):
    p = cli("plan", "--json", *args, env=clean_env(FAKECUDA_GPUS="8", **env))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_plan_json_is_the_documented_format():
    d = plan_json("--nproc-per-node", "4")
    assert list(d) == ["format", "version", "nnodes", "node_rank", "nproc_per_node", "world_size", "master_addr",
                       "master_port", "device_source", "parent_cuda_visible_devices", "visible_devices",
                       "launcher_affinity", "cpu_policy", "cpu_note", "job", "ranks"]
    assert d["format"] == "rankguard-plan" and d["version"] == 1
    assert (d["nnodes"], d["node_rank"], d["nproc_per_node"], d["world_size"]) == (1, 0, 4, 4)
    assert d["device_source"] == "driver" and d["parent_cuda_visible_devices"] is None
    assert d["visible_devices"] == 8 and d["cpu_policy"] == "inherit"
    for i, r in enumerate(d["ranks"]):
        assert list(r) == ["rank", "local_rank", "position", "cuda_visible_devices", "uuid", "bus_id", "numa_node",
                           "cpus", "omp_num_threads", "cpu_list"]
        assert (r["rank"], r["local_rank"], r["position"]) == (i, i, i)
        assert r["cuda_visible_devices"] == str(i)
        assert r["uuid"] == uuid(i) and r["bus_id"] == bus(i)
        assert r["cpus"] is None and r["omp_num_threads"] is None and r["cpu_list"] is None
    assert d["job"] is None  # resolved with --env only


def test_plan_json_env_is_each_ranks_launch_environment():
    d = plan_json("--env", "--nproc-per-node", "2", "--cpu-ids", "1,0", "--master-port", "29511", RANKGUARD_JOB="j-9",
                  RANKGUARD_RANK_GPU_UUID="GPU-stale", LD_PRELOAD="libm.so.6")
    assert d["job"] == "j-9"
    for i, r in enumerate(d["ranks"]):
        assert r["cpu_list"] == [1 - i] and r["cpus"] == str(1 - i)
        assert list(r["env"]) == ["CUDA_VISIBLE_DEVICES", "RANKGUARD_RANK_GPU", "RANKGUARD_JOB", "LD_PRELOAD", "RANK",
                                  "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                  "MASTER_PORT", "RANKGUARD_RANK_GPU_UUID", "OMP_NUM_THREADS"]
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == r["env"]["RANKGUARD_RANK_GPU"] == str(i)
        assert r["env"]["RANKGUARD_RANK_GPU_UUID"] == uuid(i) and r["env"]["RANKGUARD_JOB"] == "j-9"
        assert r["env"]["LD_PRELOAD"].endswith("/librankguard.so:libm.so.6")
        assert (r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"], r["env"]["OMP_NUM_THREADS"]) == \
            ("127.0.0.1", "29511", "1")
    # Not valid UTF-8: JSON cannot carry it exactly, so it is refused, not mangled.
    env = clean_env(FAKECUDA_GPUS="8")
    env_b = {k.encode(): v.encode() for k, v in env.items()}
    env_b[b"LD_PRELOAD"] = b"/opt/\xff.so"
    p = subprocess.run([str(CLI), "plan", "--json", "--env", "--nproc-per-node", "1"], env=env_b,
                       capture_output=True, text=True, errors="replace", timeout=60)
    assert p.returncode == 2 and "LD_PRELOAD" in p.stderr and "UTF-8" in p.stderr, p.stderr
    # --env needs --json, and is plan's alone.
    p = cli("plan", "--env", env=clean_env(FAKECUDA_GPUS="8"))
    assert p.returncode == 2 and "add --json" in p.stderr
    p = cli("launch", "--env", "--", "true", env=clean_env(FAKECUDA_GPUS="8"))
    assert p.returncode == 2 and "--env belongs to `rankguard plan --json`" in p.stderr


def test_plan_table_names_every_rank():
    p = cli("plan", "--nproc-per-node", "2", "--devices", "3,5", env=clean_env(FAKECUDA_GPUS="8"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "selected by --devices 3,5" in lines[0]
    assert lines[2].split()[:4] == ["RANK", "LOCAL_RANK", "POSITION", "CUDA_VISIBLE_DEVICES"]
    assert lines[3].split()[:5] == ["0", "0", "3", "3", uuid(3)]
    assert lines[4].split()[:5] == ["1", "1", "5", "5", uuid(5)]


def test_parent_uuid_entries_and_devices_positions():
    cvd = f"{uuid(6)},GPU-13,{uuid(1)}"
    d = plan_json("--devices", "2,0", CUDA_VISIBLE_DEVICES=cvd)
    assert d["device_source"] == "--devices" and d["parent_cuda_visible_devices"] == cvd
    assert [r["cuda_visible_devices"] for r in d["ranks"]] == [uuid(1), uuid(6)]
    assert [r["position"] for r in d["ranks"]] == [2, 0]
    d = plan_json("--nproc-per-node", "gpu", CUDA_VISIBLE_DEVICES=cvd)
    assert [r["cuda_visible_devices"] for r in d["ranks"]] == [uuid(6), "GPU-13", uuid(1)]
    assert [r["uuid"] for r in d["ranks"]] == [uuid(6), uuid(3), uuid(1)]


def test_multi_node_ranks():
    d = plan_json("--nproc-per-node", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr", "10.0.0.1",
                  "--master-port", "29500")
    assert [r["rank"] for r in d["ranks"]] == [2, 3]
    assert d["world_size"] == 6 and d["master_addr"] == "10.0.0.1" and d["master_port"] == 29500


# (environment, arguments, substrings the message must hold: both sources)
CONFLICTS = [
    ({"CUDA_VISIBLE_DEVICES": "3"}, ["--nproc-per-node", "2"],
     ["--nproc-per-node 2", "CUDA_VISIBLE_DEVICES='3'", "authoritative"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-13"}, ["--devices", "1"],
     ["--devices '1'", "CUDA_VISIBLE_DEVICES='GPU-13'", "authoritative"]),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, ["--devices", "2"],
     ["--devices '2'", "position 2", "CUDA_VISIBLE_DEVICES='0,1'"]),
    ({}, ["--devices", "1,1"], ["--devices '1,1'", "repeats position 1", "the driver (8 GPUs"]),
    ({"CUDA_VISIBLE_DEVICES": "4,5,6"}, ["--devices", "0,2,0"], ["repeats position 0", "CUDA_VISIBLE_DEVICES='4,5,6'"]),
    ({}, ["--nproc-per-node", "3", "--devices", "0,1"], ["--nproc-per-node 3", "more ranks than", "--devices '0,1'"]),
    ({}, ["--nproc-per-node", "9"], ["--nproc-per-node 9", "more ranks than devices", "the driver (8 GPUs"]),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, ["--nproc-per-node", "3"], ["--nproc-per-node 3", "CUDA_VISIBLE_DEVICES='0,1'"]),
    ({"CUDA_VISIBLE_DEVICES": "0,1,9"}, ["--nproc-per-node", "1"],
     ["CUDA_VISIBLE_DEVICES='0,1,9'", "driver enumerates only 2", "entry '9' is not a device"]),
    ({"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, ["--nproc-per-node", "1"], ["CUDA_VISIBLE_DEVICES='0,2,-1,1'", "malformed"]),
    ({"CUDA_VISIBLE_DEVICES": ""}, ["--nproc-per-node", "1"], ["CUDA_VISIBLE_DEVICES=''", "no GPU visible"]),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, ["--nproc-per-node", "1"], ["CUDA_VISIBLE_DEVICES='-1'", "no GPU visible"]),
]


@pytest.mark.parametrize("env,args,needles", CONFLICTS, ids=[" ".join(c[1]) + " " + str(c[0]) for c in CONFLICTS])
def test_precedence_conflicts_are_refused(env, args, needles):
    p = cli("plan", *args, env=clean_env(FAKECUDA_GPUS="8", **env))
    assert p.returncode == 2, p.stdout
    for n in needles:
        assert n in p.stderr, (n, p.stderr)
    assert p.stdout == ""


def test_single_external_entry_is_one_rank():
    for args in (["--nproc-per-node", "1"], []):  # one rank is also the default
        d = plan_json(*args, CUDA_VISIBLE_DEVICES=uuid(5))
        assert [r["cuda_visible_devices"] for r in d["ranks"]] == [uuid(5)]
    d = plan_json("--devices", "0", CUDA_VISIBLE_DEVICES="5")
    assert [r["cuda_visible_devices"] for r in d["ranks"]] == ["5"]


def _two_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs a launcher affinity of at least 2 CPUs")
    return cpus[:2]


def test_auto_blocks_are_numa_local(tmp_path):
    a, b = _two_cpus()
    root = sysroot(tmp_path, FAKECUDA_GPUS="8", FAKECUDA_CPUS=f"{a},{b}", FAKECUDA_NUMA_NODES="2")
    d = plan_json("--devices", "0,4", "--cpu-ids", "auto", "--sysroot", str(root))
    assert d["cpu_policy"] == "numa", d["cpu_note"]
    assert [(r["numa_node"], r["cpus"], r["omp_num_threads"]) for r in d["ranks"]] == [(0, str(a), 1), (1, str(b), 1)]
    # RANKGUARD_SYSROOT is the same as --sysroot.
    d = plan_json("--devices", "4,0", "--cpu-ids", "auto", RANKGUARD_SYSROOT=str(root))
    assert [r["cpus"] for r in d["ranks"]] == [str(b), str(a)]


def test_auto_falls_back_and_says_why(tmp_path):
    a, b = _two_cpus()
    root = sysroot(tmp_path, FAKECUDA_GPUS="8", FAKECUDA_CPUS=f"{a},{b}", FAKECUDA_NUMA_NODES="2")
    # Both GPUs on node 0, which has one CPU: NUMA-local blocks are impossible.
    d = plan_json("--devices", "0,1", "--cpu-ids", "auto", "--sysroot", str(root))
    assert d["cpu_policy"] == "contiguous"
    # The topology is known: the launcher's affinity is to blame (issue 32), not the topology.
    assert "holds 1 of the CPUs" in d["cpu_note"], d["cpu_note"]
    assert "do not fit in the launcher's affinity" in d["cpu_note"], d["cpu_note"]
    assert "topology is unknown" not in d["cpu_note"], d["cpu_note"]
    assert sorted(r["cpus"] for r in d["ranks"]) == sorted([str(a), str(b)])
    # No topology files at all.
    (tmp_path / "empty").mkdir()
    d = plan_json("--devices", "0,1", "--cpu-ids", "auto", "--sysroot", str(tmp_path / "empty"))
    assert d["cpu_policy"] == "contiguous" and "no /proc/driver/nvidia/gpus entry" in d["cpu_note"]


def test_explicit_blocks_outside_the_affinity_are_refused():
    a, _ = _two_cpus()
    outside = max(os.sched_getaffinity(0)) + 1
    p = cli("plan", "--nproc-per-node", "2", "--cpu-ids", f"{a},{outside}", env=clean_env(FAKECUDA_GPUS="8"))
    assert p.returncode == 2
    assert f"block 1 ({outside}) is outside the launcher's own CPU affinity" in p.stderr
    p = cli("plan", "--nproc-per-node", "2", "--cpu-ids", f"{a},{a}", env=clean_env(FAKECUDA_GPUS="8"))
    assert p.returncode == 2 and "share CPUs" in p.stderr


def test_without_a_driver():
    # No libcuda.so.1 on the library path: the driver's list is needed only when the parent
    # gives none.
    env = clean_env(LD_LIBRARY_PATH="/nonexistent")
    p = cli("plan", "--nproc-per-node", "1", env=env)
    assert p.returncode == 2
    assert "cannot list this node's GPUs" in p.stderr and "libcuda.so.1" in p.stderr
    p = cli("plan", "--json", "--nproc-per-node", "2", env=clean_env(LD_LIBRARY_PATH="/nonexistent",
                                                                     CUDA_VISIBLE_DEVICES="GPU-12,GPU-13"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [(r["cuda_visible_devices"], r["uuid"], r["bus_id"]) for r in d["ranks"]] == \
        [("GPU-12", None, None), ("GPU-13", None, None)]

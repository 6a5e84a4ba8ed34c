"""rankguard check: what an environment means for the contract, its stable JSON form, and
a non-zero status exactly when a rank started there would violate the contract."""
from __future__ import annotations

import json

from _cli import CLI, bus, clean_env, cli, sysroot, uuid
from conftest import GUARD, LIB_GUARD

KEYS = ["format", "version", "ok", "enforced", "cuda_visible_devices", "mode", "entries", "driver", "guard", "rank_gpu",
        "rank_gpu_matches", "job", "affinity", "omp_num_threads", "problems", "warnings"]


def check(*args, **env):
    p = cli("check", "--json", *args, env=clean_env(FAKECUDA_GPUS="8", **env))
    assert p.returncode in (0, 1), p.stderr
    d = json.loads(p.stdout)
    assert (p.returncode == 0) == d["ok"] == (d["problems"] == [])
    return p.returncode, d


def test_a_launched_rank_keeps_the_contract():
    p = cli("launch", "--devices", "3", "--", str(CLI), "check", "--json", env=clean_env(FAKECUDA_GPUS="8"))
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(p.stdout)
    assert list(d) == KEYS
    assert d["format"] == "rankguard-check" and d["version"] == 1 and d["ok"]
    assert d["cuda_visible_devices"] == "3" and d["mode"] == "index" and d["entries"] == ["3"]
    assert d["driver"] == {"ok": True, "count": 1, "error": None,
                           "devices": [{"ordinal": 0, "uuid": uuid(3), "bus_id": bus(3), "numa_node": None,
                                        "local_cpus": None}]}
    assert d["guard"]["preloaded"] and d["guard"]["preload_entry"] == str(LIB_GUARD.resolve())
    assert d["guard"]["mode"] == "enforce"
    assert d["rank_gpu"] == "3" and d["rank_gpu_matches"] is True
    assert d["job"] and d["problems"] == [] and d["warnings"] == []


def test_numa_node_where_the_topology_is_readable(tmp_path):
    root = sysroot(tmp_path, FAKECUDA_GPUS="8", FAKECUDA_CPUS="0-15", FAKECUDA_NUMA_NODES="2")
    rc, d = check("--sysroot", str(root), CUDA_VISIBLE_DEVICES="GPU-16", LD_PRELOAD=str(GUARD))
    assert rc == 0, d
    assert d["mode"] == "uuid"
    assert d["driver"]["devices"][0]["numa_node"] == 1 and d["driver"]["devices"][0]["local_cpus"] == "8-15"


def test_violations_exit_1_and_say_why():
    cases = [
        ({}, "is unset"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, "makes 2 GPUs visible"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "makes no GPU visible"),
        # CUDA reads 0,2 (the first invalid entry truncates): two GPUs
        ({"CUDA_VISIBLE_DEVICES": "0,2,-1"}, "makes 2 GPUs visible"),
        ({"CUDA_VISIBLE_DEVICES": "9"}, "the driver enumerates 0 devices"),
        ({"CUDA_VISIBLE_DEVICES": "2", "RANKGUARD_RANK_GPU": uuid(3)}, f"its rank owns RANKGUARD_RANK_GPU='{uuid(3)}'"),
        # a prefix that is not this process's own entry cannot be proven to name one GPU
        ({"CUDA_VISIBLE_DEVICES": "2", "RANKGUARD_RANK_GPU": "GPU-13"}, "RANKGUARD_RANK_GPU='GPU-13' names no single GPU"),
    ]
    for env, needle in cases:
        rc, d = check(LD_PRELOAD=str(GUARD), **env)
        assert rc == 1, (env, d)
        assert any(needle in p for p in d["problems"]), (env, d["problems"])


def test_rank_gpu_is_compared_by_identity():
    rc, d = check(CUDA_VISIBLE_DEVICES="2", RANKGUARD_RANK_GPU=uuid(2), LD_PRELOAD=str(GUARD))
    assert rc == 0, d["problems"]
    assert d["rank_gpu_matches"] is True
    # A prefix counts when it is the process's own entry (the driver resolved that text to
    # the one device it sees); another prefix cannot be proven unique here (issue 14).
    rc, d = check(CUDA_VISIBLE_DEVICES="GPU-12", RANKGUARD_RANK_GPU="GPU-12", LD_PRELOAD=str(GUARD))
    assert rc == 0 and d["rank_gpu_matches"] is True, d["problems"]
    rc, d = check(CUDA_VISIBLE_DEVICES="2", RANKGUARD_RANK_GPU="GPU-12", LD_PRELOAD=str(GUARD))
    assert rc == 1 and d["rank_gpu_matches"] is False
    assert any("names no single GPU" in p for p in d["problems"]), d["problems"]
    rc, d = check(CUDA_VISIBLE_DEVICES="2", RANKGUARD_RANK_GPU="3", LD_PRELOAD=str(GUARD))
    assert rc == 1 and d["rank_gpu_matches"] is False


def test_rank_gpu_uuid_from_the_launcher_decides():
    rc, d = check(CUDA_VISIBLE_DEVICES="2", RANKGUARD_RANK_GPU="7", RANKGUARD_RANK_GPU_UUID=uuid(2),
                  LD_PRELOAD=str(GUARD))
    assert rc == 0 and d["rank_gpu_matches"] is True
    rc, d = check(CUDA_VISIBLE_DEVICES="2", RANKGUARD_RANK_GPU="2", RANKGUARD_RANK_GPU_UUID=uuid(3),
                  LD_PRELOAD=str(GUARD))
    assert rc == 1 and d["rank_gpu_matches"] is False


def test_check_under_the_guard_with_many_gpus_still_reports():
    # The check process itself never initialises CUDA, so the guard cannot stop it.
    rc, d = check(CUDA_VISIBLE_DEVICES="0,1,2", LD_PRELOAD=str(GUARD))
    assert rc == 1
    assert d["driver"]["count"] == 3 and d["guard"]["preloaded"]


def test_warnings_do_not_fail():
    rc, d = check(CUDA_VISIBLE_DEVICES="1", RANKGUARD_MODE="warn")
    assert rc == 0
    assert any("not in LD_PRELOAD" in w for w in d["warnings"])
    assert any("RANKGUARD_MODE=warn" in w for w in d["warnings"])
    rc, d = check(CUDA_VISIBLE_DEVICES="1", RANKGUARD_MODE="bogus", LD_PRELOAD=str(GUARD))
    assert rc == 0 and d["guard"]["mode"] == "enforce"
    assert any("'bogus'" in w for w in d["warnings"])


def test_text_form():
    p = cli("check", env=clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="0,1"))
    assert p.returncode == 1
    assert "problem: CUDA_VISIBLE_DEVICES='0,1' makes 2 GPUs visible" in p.stdout
    assert p.stdout.rstrip().endswith("violation: a rank started here would break the contract")
    p = cli("check", env=clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="1", LD_PRELOAD=str(GUARD)))
    assert p.returncode == 0, p.stdout
    assert uuid(1) in p.stdout and p.stdout.rstrip().endswith(
        "ok: a rank started here keeps the contract, and the guard enforces it")


def test_never_ok_and_not_enforced_at_once():
    """Issue 32: a clean environment without the guard (or in warn/off mode) is "not
    enforced", status 0, never "ok" beside "the contract is not enforced"."""
    for extra in ({}, {"LD_PRELOAD": str(GUARD), "RANKGUARD_MODE": "warn"},
                  {"LD_PRELOAD": str(GUARD), "RANKGUARD_MODE": "off"}):
        p = cli("check", env=clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="1", **extra))
        assert p.returncode == 0, p.stdout
        assert "\nok" not in p.stdout and not p.stdout.startswith("ok"), p.stdout
        last = p.stdout.rstrip().splitlines()[-1]
        assert last.startswith("not enforced: this environment keeps the contract, but "), last
        rc, d = check(CUDA_VISIBLE_DEVICES="1", **extra)
        assert rc == 0 and d["ok"] and d["enforced"] is False, d
    assert "the guard is not in LD_PRELOAD" in cli(
        "check", env=clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="1")).stdout.splitlines()[-1]
    rc, d = check(CUDA_VISIBLE_DEVICES="1", LD_PRELOAD=str(GUARD))
    assert d["enforced"] is True

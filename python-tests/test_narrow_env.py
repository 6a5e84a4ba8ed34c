"""RANKGUARD_NARROW_BY: the guard narrows CUDA_VISIBLE_DEVICES itself at load time, as
`rankguard run --narrow-by` does (one rule, rankguard_core::narrow), early enough for
Python's os.environ and the driver, once per rank: a descendant keeps its rank's GPU and is
judged by R1 (docs/design.md, "Narrowing without a wrapper")."""
from __future__ import annotations

import subprocess

import pytest

from _cli import child_cmd, children, clean_env, cli, uuid
from conftest import LIB_GUARD, PYTHON

EIGHT = "0,1,2,3,4,5,6,7"


def injected(cmd, **env):
    """cmd with the guard preloaded and RANKGUARD_NARROW_BY set, no wrapper."""
    env.setdefault("RANKGUARD_NARROW_BY", "LOCAL_RANK")
    return subprocess.run(cmd, env=clean_env(FAKECUDA_GPUS="8", LD_PRELOAD=str(LIB_GUARD), **env),
                          capture_output=True, text=True, timeout=60)


def test_a_python_rank_sees_one_entry_in_os_environ_and_the_driver_one_device():
    p = injected(child_cmd(), CUDA_VISIBLE_DEVICES=EIGHT, LOCAL_RANK="3")
    assert p.returncode == 0, p.stderr
    (c,) = children(p.stdout)
    assert c["env"]["CUDA_VISIBLE_DEVICES"] == "3"  # os.environ, snapshotted before main
    assert c["env"]["RANKGUARD_RANK_GPU"] == "3"
    assert c["cuda"]["count"] == 1 and c["cuda"]["devices"][0]["uuid"] == uuid(3)
    assert "WARN" not in p.stderr, p.stderr


LEGACY = r"""
import os, subprocess, sys
print("PARENT cvd=" + os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
# A legacy collector: "see every GPU again", then start a helper that touches CUDA.
env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
sys.exit(subprocess.run(sys.argv[1:], env=env).returncode)
"""


def test_the_child_of_a_legacy_rewrite_is_r1_not_narrowed_again():
    p = injected([PYTHON, "-c", LEGACY, *child_cmd()], CUDA_VISIBLE_DEVICES=EIGHT, LOCAL_RANK="3")
    assert "PARENT cvd=3\n" in p.stdout, p.stdout
    # Narrowed again it would see GPU 3 and report; it is stopped by R1 at cuInit instead.
    assert p.returncode == 78, (p.returncode, p.stdout, p.stderr)
    assert "rule R1" in p.stderr and "CHILD {" not in p.stdout, p.stderr


def test_a_bad_value_fails_closed_at_cuinit_with_one_line_and_leaves_others_alone():
    p = injected(child_cmd(), CUDA_VISIBLE_DEVICES=EIGHT)
    assert p.returncode == 78, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "RANKGUARD_NARROW_BY=LOCAL_RANK" in ln]
    assert len(lines) == 1 and "LOCAL_RANK is not set" in lines[0] and "LOCAL_RANK (torchrun)" in lines[0], p.stderr
    assert "CHILD {" not in p.stdout
    # The launcher itself (no LOCAL_RANK, never touches CUDA) runs undisturbed.
    p = injected(child_cmd("--no-cuda"), CUDA_VISIBLE_DEVICES=EIGHT)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    p = injected(child_cmd(), RANKGUARD_NARROW_BY="LOCAL-RANK", CUDA_VISIBLE_DEVICES="5")
    assert p.returncode == 78, p.stderr
    assert "RANKGUARD_NARROW_BY='LOCAL-RANK' is not an environment variable name" in p.stderr


# run's matrix (test_cli_run.py): (CUDA_VISIBLE_DEVICES, variable, value).
MATRIX = [
    ("4,5,6,7", "LOCAL_RANK", "2"),
    (f"GPU-12,{uuid(5)}", "SLURM_LOCALID", "0"),
    (f"GPU-12,{uuid(5)}", "SLURM_LOCALID", "1"),
    (None, "LOCAL_RANK", "3"),
    (uuid(5), "SLURM_LOCALID", "3"),
    ("5", "LOCAL_RANK", "0"),
    ("0,1", "LOCAL_RANK", None),
    ("0,1", "LOCAL_RANK", "2"),
    ("0,1", "LOCAL_RANK", "x"),
    ("", "LOCAL_RANK", "0"),
    ("0,2,-1", "LOCAL_RANK", "0"),
]
SAME = ["CUDA_VISIBLE_DEVICES", "RANKGUARD_RANK_GPU", "LOCAL_RANK", "SLURM_LOCALID"]


@pytest.mark.parametrize("cvd,var,value", MATRIX)
def test_run_narrow_by_and_the_variable_give_the_same_environment(cvd, var, value):
    env = {"CUDA_VISIBLE_DEVICES": cvd, var: value}
    r = cli("run", "--narrow-by", var, "--", *child_cmd(), env=clean_env(FAKECUDA_GPUS="8", **env))
    g = injected(child_cmd(), RANKGUARD_NARROW_BY=var, **env)
    if r.returncode == 2:
        # Refused by run: the guard stops the rank at cuInit with the same message.
        assert g.returncode == 78, g.stderr
        # run's error line is `rankguard run: error: MSG`; the guard says `rankguard: MSG`.
        msg = r.stderr.strip().replace("rankguard run: error: ", "rankguard: ").replace(
            f"--narrow-by {var}", f"RANKGUARD_NARROW_BY={var}")
        assert msg in g.stderr, (msg, g.stderr)
        assert "CHILD {" not in g.stdout
        return
    assert r.returncode == 0 and g.returncode == 0, (r.stderr, g.stderr)
    ((a,), (b,)) = children(r.stdout), children(g.stdout)
    assert {k: a["env"].get(k) for k in SAME} == {k: b["env"].get(k) for k in SAME}
    assert a["cuda"] == b["cuda"] and a["cuda"]["count"] == 1
    # run resolves an index to its UUID through the driver; the guard, which makes no
    # driver call at load, exports a UUID only for a full-UUID entry and proves an index at
    # cuInit (crates/core/src/rankgpu.rs): where it exports one, the two agree.
    if b["env"].get("RANKGUARD_RANK_GPU_UUID"):
        assert b["env"]["RANKGUARD_RANK_GPU_UUID"] == a["env"]["RANKGUARD_RANK_GPU_UUID"]

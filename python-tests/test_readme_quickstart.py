"""The README's quick start (issue 32), taken from the README and run as written on the fake
8-GPU node: every block of the "Quick start" section, one test each, with
python-tests/_quickstart_train.py as the user's `train.py` (it reports what its process sees
and makes one legacy call, `cuDeviceGet(1)`).

- plain preload and torchrun: the block's shell lines under scripts/fake-node;
- Slurm: the block is the sbatch file, submitted (`sbatch --wait`) to the real single-node
  Slurm cluster of test_slurm.py (its fixture, a cluster of this module's own);
- Ray: the block runs in a driver process whose `ray.init` gets this test's cluster options
  (loopback, a private session directory) on top of the block's own, then starts two GPU
  actors that run train.py's report in their worker;
- Kubernetes: the Dockerfile's ENTRYPOINT + CMD, run on a fake node of one GPU (what the
  device plugin leaves a pod of `nvidia.com/gpu: 1`); its wheel is the one Install builds.

Each must give every rank one GPU as `cuda:0` with the guard loaded, and the guard must deny
the legacy call (one R2 record per rank): a quick-start command that breaks, or stops
guarding, fails here.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess

from conftest import CLI, PYTHON, ROOT, clean_env, fake_node, run
from test_slurm import slurm  # noqa: F401  (the module's own Slurm cluster)

TRAIN = pathlib.Path(__file__).resolve().parent / "_quickstart_train.py"
KINDS = ("plain preload", "torchrun", "Slurm", "Ray", "Kubernetes")
WHEEL = "rankguard-0.1.0-py3-none-manylinux_2_28_x86_64.whl"


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, f"README has no section {title!r}"
    return m.group(1)


def blocks() -> dict[str, tuple[str, str]]:
    """The quick start's blocks by kind (the first word(s) of each block's first comment)."""
    out = {}
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", section("Quick start"), re.S | re.M):
        comment = next(line for line in body.splitlines() if line.startswith("# "))
        kind = next((k for k in KINDS if comment[2:].startswith(k)), None)
        assert kind and kind not in out, f"quick-start block of unknown or repeated kind: {comment!r}"
        out[kind] = (lang, body)
    assert sorted(out) == sorted(KINDS), sorted(out)
    return out


def reports(stdout: str) -> list[dict]:
    return [json.loads(line.split("TRAIN ", 1)[1]) for line in stdout.splitlines() if line.startswith("TRAIN {")]


def audit_records(audit: pathlib.Path) -> list[dict]:
    # Decision records (the GPU map's records, one per process, are read apart).
    return [r for f in sorted(audit.iterdir()) for line in f.read_text().splitlines() if line.strip()
            for r in [json.loads(line)] if r.get("kind") != "map"]


def check_ranks(got: list[dict], records: list[dict], n: int, out: str):
    """n ranks, each on its own single GPU as cuda:0, guarded; cuDeviceGet(1) denied in each."""
    assert len(got) == n, out
    assert len({r["cvd"] for r in got}) == n, out
    for r in got:
        assert r["guard"] and r["cvd"] is not None and "," not in r["cvd"], (r, out)
        assert (r["init"], r["count"], r["get0"], r["get1"]) == (0, 1, 0, 101), (r, out)
    denied = sorted((rec["pid"], rec["rule"], rec["call"], rec["verdict"]) for rec in records)
    assert denied == sorted((r["pid"], "R2", "cuDeviceGet", "deny") for r in got), (denied, out)


def workdir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    shutil.copy(TRAIN, tmp_path / "train.py")
    audit = tmp_path / "audit"
    audit.mkdir()
    return tmp_path, audit


def shell_block(kind: str, tmp_path, n: int, **env):
    lang, body = blocks()[kind]
    assert lang == "sh", lang
    cwd, audit = workdir(tmp_path)
    p = fake_node(["bash", "-euc", body], env=clean_env(RANKGUARD_AUDIT=str(audit / "%p.jsonl"), **env),
                  timeout=180, cwd=cwd)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    check_ranks(reports(p.stdout), audit_records(audit), n, out)
    return p


def test_plain_preload(tmp_path):
    p = shell_block("plain preload", tmp_path, 1)
    assert reports(p.stdout)[0]["cvd"] == "0"
    assert "cuDeviceGet(ordinal=1)" in p.stderr and "RANKGUARD" in p.stderr, p.stderr


def test_torchrun(tmp_path):
    p = shell_block("torchrun", tmp_path, 4)
    got = reports(p.stdout)
    assert sorted(r["cvd"] for r in got) == ["0", "1", "2", "3"]
    assert sorted(r["rank"] for r in got) == ["0", "1", "2", "3"]


def test_slurm_sbatch(slurm, tmp_path):  # noqa: F811
    lang, body = blocks()["Slurm"]
    assert lang == "sh" and body.startswith("#!/bin/sh\n"), body
    assert "#SBATCH " in body
    # The job's files live in the cluster's directory (slurmd runs the batch script there).
    (slurm.tmp / "quickstart").mkdir()
    cwd, audit = workdir(slurm.tmp / "quickstart")
    (cwd / "train.sbatch").write_text(body)
    env = slurm.env(RANKGUARD_AUDIT=str(audit / "%p.jsonl"),
                    PATH=f"{CLI.parent}:{pathlib.Path(PYTHON).parent}:{os.environ.get('PATH', '')}")
    p, job_out = slurm.sbatch("train.sbatch", env=env, cwd=cwd, timeout=180)
    out = p.stdout + p.stderr + job_out
    assert p.returncode == 0, out + slurm.logs()
    got = reports(job_out)
    check_ranks(got, audit_records(audit), 4, out)
    assert sorted(r["rank"] for r in got) == ["0", "1", "2", "3"], out


RAY_DRIVER = '''
import json, runpy, sys
import ray as _ray
block, temp, train = sys.argv[1:4]
_init = _ray.init
def init(*args, **kwargs):  # the test's cluster, on top of the block's own options
    return _init(*args, num_cpus=2, num_gpus=8, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False, _temp_dir=temp, **kwargs)
_ray.init = init
exec(compile(block, "README.md (quick start, Ray)", "exec"), {"__name__": "readme_quickstart"})
assert _ray.is_initialized(), "the block did not start Ray"
@_ray.remote(num_gpus=1)
class Rank:
    def train(self):
        return runpy.run_path(train)["report"]()
try:
    ranks = [Rank.remote() for _ in range(2)]
    for r in _ray.get([r.train.remote() for r in ranks], timeout=120):
        print("TRAIN " + json.dumps(r), flush=True)
finally:
    _ray.shutdown()
'''


def test_ray(tmp_path):
    lang, body = blocks()["Ray"]
    assert lang == "python", lang
    cwd, audit = workdir(tmp_path)
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    session = pathlib.Path(subprocess.check_output(["mktemp", "-d", "/tmp/rg-qs-ray-XXXXXX"], text=True).strip())
    env = clean_env(FAKECUDA_GPUS="8", RANKGUARD_AUDIT=str(audit / "%p.jsonl"), RANKGUARD_REGISTRY=str(reg),
                    RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                    PATH=f"{CLI.parent}:{os.environ.get('PATH', '')}")
    p = subprocess.Popen([PYTHON, "-c", RAY_DRIVER, body, str(session), str(cwd / "train.py")], env=env, cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(session, ignore_errors=True)
    out = stdout + stderr
    assert p.returncode == 0, out
    check_ranks(reports(stdout), audit_records(audit), 2, out)


def test_kubernetes_entrypoint(tmp_path):
    lang, body = blocks()["Kubernetes"]
    assert lang == "dockerfile", lang
    directive = {}
    for line in body.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("ENTRYPOINT", "CMD"):
            directive[word] = json.loads(rest)
    # The image installs the wheel Install builds (python-tests/test_install.py checks its name).
    assert WHEEL in body and WHEEL in section("Install")
    assert WHEEL in (ROOT / "python-tests" / "test_install.py").read_text()
    cwd, audit = workdir(tmp_path)
    p = fake_node(directive["ENTRYPOINT"] + directive["CMD"],
                  env=clean_env(FAKECUDA_GPUS="1", RANKGUARD_AUDIT=str(audit / "%p.jsonl")), timeout=120, cwd=cwd)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    got = reports(p.stdout)
    check_ranks(got, audit_records(audit), 1, out)
    assert got[0]["cvd"] == "0", out

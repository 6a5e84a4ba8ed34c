"""torchrun for real: the README's torchrun recipe, taken from the README and run as
written (train.py is python-tests/_torch_ddp.py: cuda:0, a gloo all_reduce) with the pinned
torch on the fake 8-GPU node (scripts/fake-node); and its several-nodes recipe (--rdzv-id
$SLURM_JOB_ID) in a batch job of the suite's Slurm cluster."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil

from conftest import CLI, ROOT, clean_env, fake_node
from test_slurm import slurm  # noqa: F401  (the module's own Slurm cluster, for the several-nodes recipe)

WORKER = ROOT / "python-tests" / "_torch_ddp.py"
SET_DEVICE_LINE = next(i for i, line in enumerate(WORKER.read_text().splitlines(), 1)
                       if "torch.cuda.set_device(local)" in line)


def readme_recipe() -> list[str]:
    """The README's torchrun command line (one, in a sh block of "Recipes"; the quick start
    repeats it verbatim)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    lines = [line for b in blocks for line in b.splitlines() if line.startswith("torchrun ")]
    assert len(lines) >= 1 and len(set(lines)) == 1, lines
    return shlex.split(lines[0])


def torchrun(tmp_path, *, extra=(), **env):
    """Run the recipe in tmp_path (its train.py the worker); (process, records, lines)."""
    shutil.copy(WORKER, tmp_path / "train.py")
    audit = tmp_path / "audit"
    audit.mkdir()
    cmd = readme_recipe()
    assert cmd[0] == "torchrun" and cmd[-2:] == ["python", "train.py"], cmd
    cmd = [cmd[0], *extra, *cmd[1:]]
    p = fake_node(cmd, env=clean_env(RANKGUARD_AUDIT=str(audit / "%p.jsonl"), **env),
                  timeout=120, cwd=tmp_path)
    records = [r for f in sorted(audit.glob("*.jsonl"))
               for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") != "map"]
    workers = [line.split() for line in p.stdout.splitlines() if line.startswith("rank ")]
    return p, records, workers


def _fields(words: list[str]) -> dict[str, str]:
    return {k: v for k, v in zip(words[::2], words[1::2])}


def test_readme_recipe_runs_4_ranks_each_on_its_gpu_as_cuda0(tmp_path):
    p, records, workers = torchrun(tmp_path, RANKGUARD_MODE="enforce")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    ranks = {w["rank"]: w for w in map(_fields, workers)}
    assert sorted(ranks) == ["0", "1", "2", "3"], out
    for r, w in ranks.items():
        assert w["cvd"] == r, out               # --narrow-by LOCAL_RANK: one GPU each
    assert all(line.endswith("sum [10.0, 10.0, 10.0, 10.0]") for line in
               (ln for ln in p.stdout.splitlines() if ln.startswith("rank "))), out
    assert "RANKGUARD" not in out, out
    assert records == []


def test_legacy_set_device_is_r2_with_the_users_line_and_one_job_id_across_a_restart(tmp_path):
    p, records, workers = torchrun(tmp_path, extra=("--max-restarts", "1"),
                                   RANKGUARD_MODE="warn", LEGACY="1", FAIL_FIRST="1")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    attempts = {(w["rank"], w["attempt"]) for w in map(_fields, workers)}
    # Rank 1 failed the first attempt before the group formed; torchrun restarted all four,
    # and the second attempt reduced.
    assert attempts == {(r, "1") for r in ("0", "1", "2", "3")}, out
    assert "failed (exitcode: 3) local_rank: 1" in out, out
    run_ids = {w["run"] for w in map(_fields, workers)}
    assert len(run_ids) == 1 and "None" not in run_ids, out
    job = "torchelastic:" + run_ids.pop()
    # Ranks 1-3 name their global index in both attempts (rank 0's set_device(0) is legal).
    got = sorted((r["rank"], r["rule"], r["call"]) for r in records)
    assert got == sorted([(r, "R2", "cudaSetDevice") for r in (1, 2, 3)] * 2), got
    assert {r["job"] for r in records} == {job}
    assert {r["verdict"] for r in records} == {"warn"}
    for r in records:
        assert r["py_stack"][0] == f"{tmp_path / 'train.py'}:{SET_DEVICE_LINE} in <module>", r
    for r in (1, 2, 3):
        assert f"[rank {r}] RANKGUARD WARN cudaSetDevice(device={r}) allowed (warn mode) [R2" in out


def test_legacy_set_device_is_refused_in_enforce_mode(tmp_path):
    p, records, workers = torchrun(tmp_path, RANKGUARD_MODE="enforce", LEGACY="1")
    out = p.stdout + p.stderr
    # Refused with the driver's answer (invalid device); the worker falls back to cuda:0.
    assert p.returncode == 0, out
    assert len(workers) == 4, out
    got = sorted((r["rank"], r["rule"], r["call"], r["verdict"]) for r in records)
    assert got == [(r, "R2", "cudaSetDevice", "deny") for r in (1, 2, 3)], got
    for r in (1, 2, 3):
        assert f"[rank {r}] RANKGUARD DENY cudaSetDevice(device={r}) denied [R2" in out
    assert len({r["job"] for r in records}) == 1


def test_a_refused_child_ends_its_worker_and_torchrun_stops_the_job(tmp_path):
    """Rank 1's worker starts a child re-pointed to another GPU and waits on a pipe it holds
    itself (no timeout). The guard stops the child at cuInit (R1) and ends its rank's
    process, the worker, with 78 and the line (issue 28); torchrun's own failure path
    stops the job and names the worker's 78. Before, the job never ended (the timeout)."""
    p, records, workers = torchrun(tmp_path, RANKGUARD_MODE="enforce", REPOINT_CHILD="1")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out                       # torchrun's status for a failed worker
    assert "ChildFailedError" in out and "exitcode  : 78" in out, out
    assert "[rank 1] RANKGUARD DENY ending this process, the rank's process, with status 78" in out, out
    assert "ending the rank's process (status 78)" in out and "broke R1" in out, out
    assert workers == [], out
    got = [(r["rank"], r["rule"], r["call"], r["verdict"]) for r in records]
    assert got == [(1, "R1", "cuInit", "deny")], got


def readme_multinode() -> str:
    """The README's torchrun-on-several-nodes block (a sh block of "Recipes")."""
    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if b.startswith("# torchrun on several nodes")]
    assert "--rdzv-id \"$SLURM_JOB_ID\"" in block and "srun " in block, block
    return block


def test_readme_multinode_recipe_in_an_sbatch_job_has_the_jobs_run_id(slurm, tmp_path):  # noqa: F811
    """The README's several-nodes block as the body of a one-node batch script on the suite's
    Slurm cluster: torchrun's run id is the Slurm job's, so every rank's job id is
    torchelastic:<job id>, and nothing says the run id `none`. (The rendezvous port is
    swapped for a free one, so concurrent runs cannot collide.)"""
    from test_readme_quickstart import TRAIN, audit_records, check_ranks, reports
    from test_slurm import _free_ports
    block = readme_multinode()
    (port,) = _free_ports(1)
    assert ":29500" in block
    cwd = slurm.tmp / "torchrun-multinode"
    cwd.mkdir()
    shutil.copy(TRAIN, cwd / "train.py")
    audit = cwd / "audit"
    audit.mkdir()
    (cwd / "job.sbatch").write_text("#!/bin/sh\n#SBATCH --nodes=1 --ntasks-per-node=1 --gpus-per-node=4\n"
                                    + block.replace(":29500", f":{port}"))
    env = slurm.env(RANKGUARD_AUDIT=str(audit / "%p.jsonl"),
                    PATH=f"{CLI.parent}:{os.environ.get('PATH', '')}")
    p, job_out = slurm.sbatch("job.sbatch", env=env, cwd=cwd, timeout=240, runner=fake_node)
    out = p.stdout + p.stderr + job_out
    assert p.returncode == 0, out + slurm.logs()
    job = re.search(r"Submitted batch job (\d+)", p.stdout).group(1)
    got = reports(job_out)
    records = audit_records(audit)
    check_ranks(got, records, 4, out)
    assert sorted(r["rank"] for r in got) == ["0", "1", "2", "3"], out
    assert {r["job"] for r in records} == {f"torchelastic:{job}"}, records
    assert "TORCHELASTIC_RUN_ID=none" not in out, out

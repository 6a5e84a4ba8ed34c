"""One job id for the guard and `rankguard run` (crates/core/src/jobid.rs).

Under an engine (Slurm, torchrun), a rank's process started through `rankguard run` gets
`RANKGUARD_JOB` from the CLI, and another process of the same rank preloaded directly
derives the job itself from the engine's variables. Both must name the same job: two
spellings made them two jobs, and a cross-device import inside the rank (R3) passed.
The exporter here runs through `rankguard run` (which execs, so its pid is the exporter's),
the importer with a plain LD_PRELOAD, on another GPU, same rank.
"""
from __future__ import annotations

import pytest

from _ipc import PEER, audit, exporter, gpu_uuid, guard_env
from conftest import CLI, run

ENGINES = {
    # srun's variables for task 0 of step 0 of job 4242
    "slurm": dict(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_LOCALID="0"),
    # torchrun's variables for rank 0
    "torchrun": dict(TORCHELASTIC_RUN_ID="run-77", RANK="0", LOCAL_RANK="0"),
}
EXPECTED_JOB = {"slurm": "slurm:4242.0", "torchrun": "torchelastic:run-77"}


def _env(tmp_path, cvd, engine, **extra):
    # No launcher's RANKGUARD_JOB, no RANK from the helper: only the engine's variables.
    return guard_env(tmp_path, cvd, None, RANKGUARD_JOB=None, **ENGINES[engine], **extra)


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("mode", ["enforce", "warn"])
def test_run_started_exporter_and_preloaded_importer_are_one_job(tmp_path, engine, mode):
    where = tmp_path / "x"
    where.mkdir()
    # The exporter: `rankguard run` keeps the single-entry CVD, injects the guard, execs.
    ex_env = _env(tmp_path, "0", engine, LD_PRELOAD=None, RANKGUARD_MODE=mode)
    cmd = [CLI, "run", "--", PEER, "export", "mem", where]
    with exporter(tmp_path, "mem", ex_env, cmd=cmd) as ex:
        im_env = _env(tmp_path, "1", engine, RANKGUARD_MODE=mode)
        p = run([PEER, "import", "mem", ex.dir, "deny" if mode == "enforce" else "allow"], env=im_env)
        assert p.returncode == 0, f"importer failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    assert ("import-rc 800" if mode == "enforce" else "import-rc 0") in p.stdout, p.stdout + p.stderr
    (rec,) = [r for r in audit(tmp_path) if r.get("rule") == "R3"]
    assert rec["verdict"] == ("deny" if mode == "enforce" else "warn")
    assert rec["exporter_pid"] == ex.pid and rec["exporter_gpu"] == gpu_uuid(0) and rec["gpu"] == gpu_uuid(1)
    # Both sides named the job the same way, and it is the engine's.
    assert rec["job"] == rec["exporter_job"] == EXPECTED_JOB[engine]
    assert rec["rank"] == rec["exporter_rank"] == 0


def test_the_cli_exports_the_guards_job_id(tmp_path):
    """What `rankguard run` exports is exactly what the guard derives by itself."""
    for engine, job in EXPECTED_JOB.items():
        p = run([CLI, "run", "--", "/bin/sh", "-c", 'printf %s "$RANKGUARD_JOB"'],
                env=_env(tmp_path, "0", engine, LD_PRELOAD=None))
        assert (p.returncode, p.stdout) == (0, job), p.stderr

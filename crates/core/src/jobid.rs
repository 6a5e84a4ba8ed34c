//! The job a rank process belongs to, derived in ONE place for the guard and the CLI.
//!
//! The guard (`config.rs`) compares job ids to tell a rank's own cross-device IPC import
//! (rule R3) from traffic between jobs; `rankguard run` exports the id it derives as
//! `RANKGUARD_JOB`. Both read it through [`from_lookup`], so a rank process started through
//! `rankguard run` and another process of the same rank preloaded directly (same engine
//! variables) always agree on the job: two spellings would make them two jobs, and the
//! cross-device import would pass.
//!
//! Order: `RANKGUARD_JOB` (set by `rankguard launch`/`run`), then the engine's own id:
//! torchrun's `TORCHELASTIC_RUN_ID`, Slurm's `SLURM_JOB_ID` with `SLURM_STEP_ID` (one job
//! per step; `-` when no step is set, as in a batch script), a PMIx namespace (`mpirun`,
//! `srun --mpi=pmix`), Open MPI's `OMPI_MCA_ess_base_jobid`. Values are trimmed; an empty
//! value counts as unset (shells export `VAR=` to clear).
//!
//! torchrun's run id `none` is no job id: torchrun without `--standalone` or `--rdzv-id`
//! sets `TORCHELASTIC_RUN_ID=none`, so every such job on a host would share the job
//! `torchelastic:none`. It counts as unset (the next engine's id, e.g. Slurm's, names the
//! job), and [`shared_run_id`] lets the guard say so once.

/// The variable `rankguard launch`/`run` set, read first.
pub const VAR: &str = "RANKGUARD_JOB";

/// torchrun's run id when neither `--standalone` nor `--rdzv-id` was given.
pub const TORCHRUN_NONE: &str = "none";

/// What to say when `TORCHELASTIC_RUN_ID` holds torchrun's shared run id `none` (None
/// otherwise): it is not taken for a job id, and how to give the job one.
pub fn shared_run_id(get: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    get("TORCHELASTIC_RUN_ID")
        .filter(|v| v.trim() == TORCHRUN_NONE)
        .map(|_| {
            "TORCHELASTIC_RUN_ID=none (torchrun without --standalone or --rdzv-id) is shared by every such job on this host, so it is not used as the job id (R3's \"same job\"); fix: give each job its own id, torchrun --rdzv-id=<job id> (or --standalone), or set RANKGUARD_JOB"
        })
}

/// The job id from an environment lookup (`std::env::var`-like; None = unset), or None when
/// no launcher or engine names one.
pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let get = |k: &str| {
        get(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(j) = get(VAR) {
        return Some(j);
    }
    if let Some(j) = get("TORCHELASTIC_RUN_ID").filter(|j| j != TORCHRUN_NONE) {
        return Some(format!("torchelastic:{j}"));
    }
    if let Some(j) = get("SLURM_JOB_ID") {
        let step = get("SLURM_STEP_ID").unwrap_or_else(|| "-".into());
        return Some(format!("slurm:{j}.{step}"));
    }
    if let Some(ns) = get("PMIX_NAMESPACE") {
        return Some(format!("pmix:{ns}"));
    }
    if let Some(j) = get("OMPI_MCA_ess_base_jobid") {
        return Some(format!("ompi:{j}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(vars: &[(&str, &str)]) -> Option<String> {
        from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_launcher_id_wins_then_each_engine_in_order() {
        assert_eq!(
            job(&[("RANKGUARD_JOB", "j1"), ("SLURM_JOB_ID", "7")]).as_deref(),
            Some("j1")
        );
        assert_eq!(
            job(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "0")]).as_deref(),
            Some("slurm:77.0")
        );
        assert_eq!(
            job(&[("SLURM_JOB_ID", "77")]).as_deref(),
            Some("slurm:77.-")
        );
        assert_eq!(
            job(&[("TORCHELASTIC_RUN_ID", "r"), ("SLURM_JOB_ID", "7")]).as_deref(),
            Some("torchelastic:r")
        );
        assert_eq!(
            job(&[("PMIX_NAMESPACE", "ns"), ("OMPI_MCA_ess_base_jobid", "9")]).as_deref(),
            Some("pmix:ns")
        );
        assert_eq!(
            job(&[("OMPI_MCA_ess_base_jobid", "9")]).as_deref(),
            Some("ompi:9")
        );
        assert_eq!(job(&[]), None);
    }

    #[test]
    fn torchrun_run_id_none_is_no_job_id() {
        let vars = [("TORCHELASTIC_RUN_ID", " none ")];
        assert_eq!(job(&vars), None);
        assert_eq!(
            job(&[("TORCHELASTIC_RUN_ID", "none"), ("SLURM_JOB_ID", "8")]).as_deref(),
            Some("slurm:8.-")
        );
        let get = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let said = shared_run_id(get).unwrap();
        assert!(said.contains("--rdzv-id") && said.contains("not used as the job id"));
        // a real run id (and a run id that merely contains the word) is a job id
        for id in ["r1", "none-7", "None"] {
            assert_eq!(
                job(&[("TORCHELASTIC_RUN_ID", id)]),
                Some(format!("torchelastic:{id}"))
            );
            assert_eq!(
                shared_run_id(|k| (k == "TORCHELASTIC_RUN_ID").then(|| id.to_string())),
                None
            );
        }
    }

    #[test]
    fn blank_values_are_unset_and_values_are_trimmed() {
        assert_eq!(
            job(&[
                ("RANKGUARD_JOB", " "),
                ("SLURM_JOB_ID", " 5 "),
                ("SLURM_STEP_ID", "")
            ])
            .as_deref(),
            Some("slurm:5.-")
        );
        assert_eq!(job(&[("RANKGUARD_JOB", " j ")]).as_deref(), Some("j"));
    }
}

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

/// The variable `rankguard launch`/`run` set, read first.
pub const VAR: &str = "RANKGUARD_JOB";

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
    if let Some(j) = get("TORCHELASTIC_RUN_ID") {
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

//! The environment a launch gives each rank, computed in one place for `launch`, which
//! starts the children with it, and for `plan --json --env`, which prints it for launchers
//! that start their children themselves (the Python API `rankguard.plan`): the two cannot
//! diverge. docs/cli.md, "Child environment", documents each variable.

use std::ffi::OsString;
use std::net::TcpListener;

use super::exit::{Error, Result};
use super::{env, lib_path};
use crate::cvd;
use crate::plan::{Plan, RankPlan};

/// What one launch fixes for all its ranks.
pub struct Launch {
    pub job: String,
    /// `LD_PRELOAD` with the guard first.
    pub preload: OsString,
    pub master_addr: String,
    pub master_port: u16,
    /// The user set `OMP_NUM_THREADS`: it is inherited, not derived from the CPU block.
    pub user_omp: bool,
}

impl Launch {
    /// Resolve it from this process's environment: the guard library (`rankguard lib`'s
    /// search), the job id (inherited, else fresh), the rendezvous (given, else 127.0.0.1
    /// and a free port).
    pub fn resolve(master_addr: Option<&str>, master_port: Option<u16>) -> Result<Launch> {
        let guard = lib_path::find()?;
        let master_port = match master_port {
            Some(p) => p,
            None => free_port()?,
        };
        Ok(Launch {
            job: env::job_for_launch(),
            preload: env::preload_with_guard(&guard, std::env::var_os("LD_PRELOAD").as_deref()),
            master_addr: master_addr.unwrap_or("127.0.0.1").to_string(),
            master_port,
            user_omp: std::env::var_os("OMP_NUM_THREADS").is_some(),
        })
    }

    /// The variables rank `r` gets on top of the launcher's environment, in order; `None`
    /// removes a variable the launcher's environment may carry.
    pub fn rank_env(&self, p: &Plan, r: &RankPlan) -> Vec<(&'static str, Option<OsString>)> {
        let s = |v: String| Some(OsString::from(v));
        let entry = r.device.entry.text();
        let mut out = vec![
            (cvd::VAR, s(entry.clone())),
            (env::RANK_GPU, s(entry)),
            (env::JOB, s(self.job.clone())),
            ("LD_PRELOAD", Some(self.preload.clone())),
            ("RANK", s(r.rank.to_string())),
            ("LOCAL_RANK", s(r.local_rank.to_string())),
            ("WORLD_SIZE", s(p.world_size.to_string())),
            ("LOCAL_WORLD_SIZE", s(p.nproc.to_string())),
            ("GROUP_RANK", s(p.node_rank.to_string())),
            ("MASTER_ADDR", s(self.master_addr.clone())),
            ("MASTER_PORT", s(self.master_port.to_string())),
            // Removed when the driver could not be asked: an inherited UUID of another GPU
            // must not become this rank's identity.
            (
                env::RANK_GPU_UUID,
                r.device.uuid.clone().map(OsString::from),
            ),
        ];
        if let (Some(c), false) = (&r.cpus, self.user_omp) {
            out.push(("OMP_NUM_THREADS", s(c.len().to_string())));
        }
        out
    }
}

fn free_port() -> Result<u16> {
    // Bound on every interface, then released: the same race as torchrun's
    // `_get_free_port`, acceptable for a single-node rendezvous.
    TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| {
            Error::usage(format!(
                "cannot find a free port for MASTER_PORT: {e}; pass --master-port"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuset::CpuSet;
    use crate::cvd::CvdEntry;
    use crate::plan::{CpuPolicy, HostView, Source, VisibleDevice};

    fn plan_of(uuid: Option<&str>, cpus: Option<&str>) -> Plan {
        let device = VisibleDevice {
            entry: CvdEntry::Index(5),
            uuid: uuid.map(String::from),
            bus_id: None,
        };
        Plan {
            host: HostView {
                source: Source::Driver,
                devices: vec![device.clone()],
            },
            nproc: 1,
            nnodes: 2,
            node_rank: 1,
            world_size: 2,
            affinity: CpuSet::parse("0-3").unwrap(),
            cpu_policy: CpuPolicy::Inherit,
            cpu_note: String::new(),
            ranks: vec![RankPlan {
                rank: 1,
                local_rank: 0,
                position: 0,
                device,
                numa_node: None,
                cpus: cpus.map(|c| CpuSet::parse(c).unwrap()),
            }],
        }
    }

    fn launch(user_omp: bool) -> Launch {
        Launch {
            job: "j".into(),
            preload: "/g/librankguard.so:a.so".into(),
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            user_omp,
        }
    }

    fn get<'a>(env: &'a [(&'static str, Option<OsString>)], k: &str) -> Option<Option<&'a str>> {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.as_ref().map(|v| v.to_str().unwrap()))
    }

    #[test]
    fn a_rank_gets_its_entry_identity_guard_and_torchrun_variables() {
        let p = plan_of(Some("GPU-15"), Some("2-3"));
        let env = launch(false).rank_env(&p, &p.ranks[0]);
        for (k, v) in [
            ("CUDA_VISIBLE_DEVICES", "5"),
            ("RANKGUARD_RANK_GPU", "5"),
            ("RANKGUARD_JOB", "j"),
            ("LD_PRELOAD", "/g/librankguard.so:a.so"),
            ("RANK", "1"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RANKGUARD_RANK_GPU_UUID", "GPU-15"),
            ("OMP_NUM_THREADS", "2"),
        ] {
            assert_eq!(get(&env, k), Some(Some(v)), "{k}");
        }
    }

    #[test]
    fn unknown_uuid_is_removed_and_a_users_omp_is_kept() {
        let p = plan_of(None, Some("2-3"));
        let env = launch(true).rank_env(&p, &p.ranks[0]);
        assert_eq!(get(&env, "RANKGUARD_RANK_GPU_UUID"), Some(None));
        assert_eq!(get(&env, "OMP_NUM_THREADS"), None);
        let p = plan_of(None, None);
        assert_eq!(
            get(&launch(false).rank_env(&p, &p.ranks[0]), "OMP_NUM_THREADS"),
            None
        );
    }
}

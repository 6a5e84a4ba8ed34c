//! The rank root, guard side: at the first `cuInit` of a process that no rank variable
//! names, read `/proc` and the registry for the walk of [`crate::rank_root`], keep the
//! result for the process's lines and records, and leave a rank record for descendants.
//!
//! Cold path only: everything here runs once, inside the R1 check at the first `cuInit`
//! (and reads a set value afterwards). A process that never initialises CUDA never walks.
//! Explicit rank variables win: with `RANK`/`SLURM_PROCID`/`OMPI_COMM_WORLD_RANK`/
//! `PMI_RANK` or `RANKGUARD_RANK_GPU` set, nothing here runs and the root stays unset.
#![deny(unsafe_code)]

use std::fmt::{self, Write};
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;

use once_cell::sync::OnceCell;

use crate::config::Config;
use crate::cvd::Visibility;
use crate::guard::ipc;
use crate::guard::report::{self, json_str};
use crate::rank_root::{self, Ancestor, EnvFacts, ProcView, RankGpu, RankRecord, RootId, Stat};
use crate::registry::{self, Key, Location, Lookup, ProcFs, Record, Registry};

/// Largest `/proc/<pid>/environ` read (ARG_MAX-sized environments fit).
const MAX_ENVIRON: u64 = 8 << 20;

/// This process's rank root.
#[derive(Debug)]
pub struct Root {
    pub id: RootId,
    /// The node's host name (the walk never leaves the node).
    pub host: String,
    /// The rank GPU as the root's evidence names it; None when this process is the root
    /// (its own GPU is the rank's).
    pub gpu: Option<RankGpu>,
}

static ROOT: OnceCell<Root> = OnceCell::new();

/// The rank root, once the R1 check established it.
pub fn current() -> Option<&'static Root> {
    ROOT.get()
}

pub fn id() -> Option<RootId> {
    ROOT.get().map(|r| r.id)
}

/// Whether the rank is for this module to find: no rank variable and no launcher's rank GPU.
pub fn applies(cfg: &Config) -> bool {
    cfg.rank.is_none() && cfg.rank_gpu.is_none()
}

/// The real `/proc`, and the registry for rank records (opened once per walk).
struct ProcFsView {
    reg: Option<Option<Registry>>,
}

impl ProcView for ProcFsView {
    fn stat(&mut self, pid: u32) -> Option<Stat> {
        rank_root::parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }
    fn uid(&mut self, pid: u32) -> Option<u32> {
        fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
    }
    fn environ(&mut self, pid: u32) -> Option<EnvFacts> {
        let mut buf = Vec::new();
        File::open(format!("/proc/{pid}/environ"))
            .ok()?
            .take(MAX_ENVIRON)
            .read_to_end(&mut buf)
            .ok()?;
        Some(rank_root::scan_environ(&buf))
    }
    fn record(&mut self, id: RootId) -> Option<RankRecord> {
        let reg = self.reg.get_or_insert_with(ipc::open_registry).as_ref()?;
        match reg.lookup(&Key::rank(id.pid), &ProcFs) {
            // lookup checked that pid `id.pid` is alive, ours, and started at rec.start
            Lookup::Found(rec) if rec.start == id.start => Some(RankRecord {
                root: rec.root?,
                gpu: rec.gpu?,
            }),
            Lookup::Found(_) | Lookup::Missing => None,
            Lookup::Skipped(skip) => {
                tracing::debug!(pid = id.pid, "rank record not trusted: {skip}");
                None
            }
        }
    }
}

/// This process's rank root, found on first use: at the first `cuInit`, or at a violation
/// reported before it (a `cudaSetDevice(2)` denied before the runtime initialised). None
/// when rank variables name the rank ([`applies`]) or the identity could not be read.
/// Never called from [`super::engine::prefix`]: the walk may say a registry problem, whose
/// line calls `prefix`, which reads [`current`] only.
pub fn ensure(cfg: &Config) -> Option<&'static Root> {
    if let Some(r) = ROOT.get() {
        return Some(r);
    }
    if !applies(cfg) {
        return None;
    }
    establish()
}

fn establish() -> Option<&'static Root> {
    let found = std::panic::catch_unwind(|| {
        let me = report::pid();
        let start = registry::own_start_time()?;
        let mut view = ProcFsView { reg: None };
        let ancestor = rank_root::find(me, ipc::euid(), &mut view);
        tracing::debug!(?ancestor, "rank root walk");
        let mut host = [0u8; 64];
        let host = report::hostname(&mut host).to_string();
        Some(match ancestor {
            Some(Ancestor { root, gpu, .. }) => Root {
                id: root,
                host,
                gpu: Some(gpu),
            },
            None => Root {
                id: RootId { pid: me, start },
                host,
                gpu: None,
            },
        })
    });
    match found {
        Ok(Some(r)) => {
            let _ = ROOT.set(r);
            ROOT.get()
        }
        _ => None,
    }
}

/// Whether the one GPU this process sees is the rank root's (None: this process is the
/// root, or there is no root).
pub fn is_rank_gpu(own_uuid: &str, vis: &Visibility) -> Option<bool> {
    let gpu = ROOT.get()?.gpu.as_ref()?;
    Some(match gpu {
        RankGpu::Uuid(u) => super::engine::is_rank_gpu(u, Some(u), own_uuid, vis),
        RankGpu::Entry(e) => super::engine::is_rank_gpu(e, None, own_uuid, vis),
    })
}

/// The rank GPU for reports: the root's, when it is an ancestor.
pub fn rank_gpu() -> Option<&'static str> {
    ROOT.get()?.gpu.as_ref().map(RankGpu::text)
}

/// Leave this process's rank record for its descendants: its root and the rank GPU's UUID
/// (`own_uuid` when this process sees the rank's GPU, else the root's recorded one).
/// Problems with the registry are said once (`guard/ipc.rs`); never fails the caller.
pub fn publish(cfg: &Config, own_uuid: &str, sees_rank_gpu: bool) {
    let Some(root) = ROOT.get() else { return };
    let gpu = match (&root.gpu, sees_rank_gpu) {
        (_, true) if !own_uuid.is_empty() => own_uuid.to_string(),
        (Some(RankGpu::Uuid(u)), _) => u.clone(),
        _ => return,
    };
    let _ = std::panic::catch_unwind(|| {
        let reg = ipc::open_registry()?;
        let rec = Record {
            key: Key::rank(report::pid()),
            job: cfg.job.as_deref().map(registry::job_token),
            rank: None,
            pid: report::pid(),
            start: registry::own_start_time()?,
            gpu: Some(gpu),
            location: Location::Device,
            time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            root: Some(root.id),
        };
        match reg.write(&rec, &ProcFs) {
            Ok(()) => tracing::debug!(root = %root.id, "recorded this process's rank"),
            Err(problem) => ipc::said_write_problem(reg.dir(), &problem),
        }
        Some(())
    });
}

/// `,"rank_root":{"pid":P,"start":S,"host":"H"}` (or `null`) for an audit record.
pub fn write_json<W: Write>(j: &mut W, root: Option<&Root>) -> fmt::Result {
    let Some(r) = root else {
        return j.write_str(",\"rank_root\":null");
    };
    write!(
        j,
        ",\"rank_root\":{{\"pid\":{},\"start\":{},\"host\":",
        r.id.pid, r.id.start
    )?;
    json_str(j, &r.host, 64)?;
    j.write_char('}')
}

/// `,"exporter_rank_root":{...}` for an R3 record: the exporter's root (same host).
pub fn write_exporter_json<W: Write>(j: &mut W, root: Option<RootId>) -> fmt::Result {
    let Some(id) = root else {
        return j.write_str(",\"exporter_rank_root\":null");
    };
    let mut host = [0u8; 64];
    write!(
        j,
        ",\"exporter_rank_root\":{{\"pid\":{},\"start\":{},\"host\":",
        id.pid, id.start
    )?;
    json_str(j, report::hostname(&mut host), 64)?;
    j.write_char('}')
}

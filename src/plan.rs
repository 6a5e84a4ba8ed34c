//! Launch planning: which GPU entry and which CPU block each rank of this node gets.
//!
//! Pure: the CLI gathers the inputs (the parent's `CUDA_VISIBLE_DEVICES`, the driver's GPU
//! list, the launcher's own affinity, the topology files) and this module decides, so every
//! rule of docs/design.md R5 (device precedence) and R6 (CPU blocks) lives here, once, with a
//! unit test. `rankguard plan` prints the result; `rankguard launch` executes it.
//!
//! Decisions the issue leaves open (listed in docs/cli.md, "Decisions"):
//!   - A parent CVD that CUDA would truncate or empty (`0,2,-1,1`, `0,1,0`, `GPU-12,3`) is
//!     refused, not silently shortened: a rank mapping built on a malformed list is a bug.
//!   - Without a parent CVD, rank i's child gets the driver ordinal as an integer entry; the
//!     launcher's driver query and the children run under the same `CUDA_DEVICE_ORDER`
//!     (passed through), so the integer names the same device in both.
//!   - `--devices` with `--nproc-per-node` must list exactly one device per rank.
//!   - CPU blocks of one launch all have the same size (ranks of a collective job run in
//!     lockstep, so a bigger block on one rank only idles); leftover CPUs stay unassigned.

use std::collections::BTreeMap;
use std::fmt;

use crate::cpuset::CpuSet;
use crate::cvd::{self, CvdEntry};
use crate::topology::Topology;

/// A planning error: the message names the inputs in conflict and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError(pub String);

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlanError {}

fn err<T>(msg: impl Into<String>) -> Result<T, PlanError> {
    Err(PlanError(msg.into()))
}

/// A GPU as the driver enumerates it (its ordinal is its index in the list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverGpu {
    pub uuid: String,
    pub bus_id: String,
}

/// Where the host-visible device list came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The parent's `CUDA_VISIBLE_DEVICES`, verbatim.
    ParentCvd(String),
    /// The driver's full list (CVD unset).
    Driver,
}

/// One host-visible device: the entry a child gets in its CVD, and its identity when the
/// driver could be asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibleDevice {
    pub entry: CvdEntry,
    pub uuid: Option<String>,
    pub bus_id: Option<String>,
}

/// The launcher's visible devices, in CUDA's enumeration order (positions 0..).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostView {
    pub source: Source,
    pub devices: Vec<VisibleDevice>,
}

impl HostView {
    /// Who said which devices are visible, for messages: `CUDA_VISIBLE_DEVICES='0,1'
    /// (2 visible, positions 0-1)`.
    pub fn describe(&self) -> String {
        let n = self.devices.len();
        let pos = if n == 1 {
            "position 0".to_string()
        } else {
            format!("positions 0-{}", n - 1)
        };
        match &self.source {
            Source::ParentCvd(raw) => format!("{}='{raw}' ({n} visible, {pos})", cvd::VAR),
            Source::Driver => format!(
                "the driver ({n} GPU{}, {pos}; {} unset)",
                if n == 1 { "" } else { "s" },
                cvd::VAR
            ),
        }
    }
}

/// Build the host view from the parent's CVD and the driver's answer (under that CVD).
pub fn host_view(
    cvd_raw: Option<&str>,
    driver: Result<&[DriverGpu], &str>,
) -> Result<HostView, PlanError> {
    let var = cvd::VAR;
    let Some(raw) = cvd_raw else {
        let gpus = match driver {
            Ok(g) => g,
            Err(e) => {
                return err(format!(
                    "cannot list this node's GPUs ({var} is unset and the driver could not be asked: {e}); \
                     set {var} to the GPUs to use, or fix the driver installation"))
            }
        };
        if gpus.is_empty() {
            return err(format!(
                "the driver reports no GPU on this node ({var} is unset): nothing to launch on"
            ));
        }
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| VisibleDevice {
                entry: CvdEntry::Index(i as u32),
                uuid: Some(g.uuid.clone()),
                bus_id: Some(g.bus_id.clone()),
            })
            .collect();
        return Ok(HostView {
            source: Source::Driver,
            devices,
        });
    };
    let entries = rankguard_core::narrow::visible_list(raw).map_err(PlanError)?;
    let mut devices: Vec<VisibleDevice> = entries
        .into_iter()
        .map(|entry| VisibleDevice {
            entry,
            uuid: None,
            bus_id: None,
        })
        .collect();
    if let Ok(gpus) = driver {
        if gpus.len() < devices.len() {
            let bad = &devices[gpus.len()].entry;
            return err(format!(
                "{var}='{raw}' lists {} devices but the driver enumerates only {}: entry '{bad}' is not a device of \
                 this node (an ordinal beyond the device count, or an unknown or ambiguous UUID prefix); fix {var}",
                devices.len(), gpus.len()));
        }
        for (d, g) in devices.iter_mut().zip(gpus) {
            d.uuid = Some(g.uuid.clone());
            d.bus_id = Some(g.bus_id.clone());
        }
    }
    Ok(HostView {
        source: Source::ParentCvd(raw.to_string()),
        devices,
    })
}

/// `--nproc-per-node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nproc {
    /// Not given: one rank per `--devices` entry, one rank under an external single-entry
    /// CVD, else an error.
    Unspecified,
    /// `gpu`: one rank per selected (or visible) device.
    PerDevice,
    Count(u32),
}

/// `--cpu-ids`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuRequest {
    /// Not given: children inherit the launcher's affinity.
    Inherit,
    /// One block per rank.
    Explicit(Vec<CpuSet>),
    /// Partition the launcher's affinity, NUMA-local where the topology is known.
    Auto,
}

/// Parse `--cpu-ids`: `auto`, or one block per rank. Blocks are separated by `/` when any
/// block needs a comma (`0-3,8-11/4-7,12-15`); otherwise each comma item is one block
/// (`0-7,8-15`), the form the issue shows.
pub fn parse_cpu_ids(text: &str) -> Result<CpuRequest, PlanError> {
    let t = text.trim();
    if t == "auto" {
        return Ok(CpuRequest::Auto);
    }
    let parts: Vec<&str> = if t.contains('/') {
        t.split('/').collect()
    } else {
        t.split(',').collect()
    };
    let mut blocks = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let set = CpuSet::parse(p)
            .map_err(|e| PlanError(format!("--cpu-ids '{text}': block {i}: {e}")))?;
        if set.is_empty() {
            return err(format!(
                "--cpu-ids '{text}': block {i} is empty; give one non-empty block per rank"
            ));
        }
        blocks.push(set);
    }
    Ok(CpuRequest::Explicit(blocks))
}

/// Parse `--devices`: positions in the launcher's visible list, comma-separated, ranges
/// allowed (`0,2-3`). Order is kept: rank i gets the i-th listed position.
pub fn parse_devices(text: &str) -> Result<Vec<u32>, PlanError> {
    let bad = |why: &str| {
        err(format!(
            "--devices '{text}': {why}; give positions in the visible device list, such as 0,1 or 0-3 \
             (to pick GPUs by UUID, set {} instead)", cvd::VAR))
    };
    let mut out = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        let num = |s: &str| -> Option<u32> {
            let s = s.trim();
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                s.parse().ok()
            }
        };
        match item.split_once('-') {
            Some((a, b)) => match (num(a), num(b)) {
                (Some(a), Some(b)) if a <= b && b - a < 4096 => out.extend(a..=b),
                _ => return bad(&format!("'{item}' is not a range of positions")),
            },
            None => match num(item) {
                Some(v) => out.push(v),
                None => return bad(&format!("'{item}' is not a position")),
            },
        }
    }
    Ok(out)
}

/// Everything `launch`/`plan` were asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub nproc: Nproc,
    /// `--devices` as given (text, for messages) and parsed.
    pub devices: Option<(String, Vec<u32>)>,
    pub cpus: CpuRequest,
    pub nnodes: u32,
    pub node_rank: u32,
}

/// How the CPU blocks were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuPolicy {
    Inherit,
    Explicit,
    Numa,
    Contiguous,
}

impl CpuPolicy {
    /// The stable name used in `plan --json`.
    pub fn name(self) -> &'static str {
        match self {
            CpuPolicy::Inherit => "inherit",
            CpuPolicy::Explicit => "explicit",
            CpuPolicy::Numa => "numa",
            CpuPolicy::Contiguous => "contiguous",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPlan {
    pub rank: u32,
    pub local_rank: u32,
    /// Position of the device in the launcher's visible list.
    pub position: u32,
    pub device: VisibleDevice,
    pub numa_node: Option<u32>,
    pub cpus: Option<CpuSet>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub host: HostView,
    pub nproc: u32,
    pub nnodes: u32,
    pub node_rank: u32,
    pub world_size: u32,
    pub ranks: Vec<RankPlan>,
    pub cpu_policy: CpuPolicy,
    /// One line saying how the CPU blocks were chosen (and why, on a fallback).
    pub cpu_note: String,
    pub affinity: CpuSet,
}

/// Plan this node's ranks. `topology` is only consulted for NUMA nodes and `--cpu-ids auto`.
pub fn plan(
    req: &Request,
    host: &HostView,
    affinity: &CpuSet,
    topology: Result<&Topology, &str>,
) -> Result<Plan, PlanError> {
    let visible = host.devices.len() as u32;
    let hdesc = host.describe();
    let single_external = matches!(host.source, Source::ParentCvd(_)) && visible == 1;

    if req.nnodes == 0 {
        return err("--nnodes 0: a job needs at least one node");
    }
    if req.node_rank >= req.nnodes {
        return err(format!(
            "--node-rank {} is outside --nnodes {} (node ranks are 0-{})",
            req.node_rank,
            req.nnodes,
            req.nnodes - 1
        ));
    }

    // R5: device precedence. An external single-entry CVD is authoritative for one rank.
    if let Some((text, positions)) = &req.devices {
        if single_external && positions.as_slice() != [0] {
            return err(format!(
                "--devices '{text}' conflicts with {hdesc}: an external single-entry {} is authoritative and \
                 gives this launcher exactly one GPU for one rank; drop --devices, or unset {} and let \
                 --devices choose", cvd::VAR, cvd::VAR));
        }
        for (i, &p) in positions.iter().enumerate() {
            if p >= visible {
                return err(format!(
                    "--devices '{text}' names position {p}, but the launcher can see only {hdesc}; pick positions \
                     inside the visible list or widen {}", cvd::VAR));
            }
            if positions[..i].contains(&p) {
                return err(format!(
                    "--devices '{text}' repeats position {p} ({} entry '{}' of {hdesc}): one rank owns exactly one \
                     GPU, so each device may be listed once", cvd::VAR, host.devices[p as usize].entry));
            }
        }
        if positions.is_empty() {
            return err(format!("--devices '{text}' selects no device"));
        }
    }
    let pool: Vec<u32> = match &req.devices {
        Some((_, p)) => p.clone(),
        None => (0..visible).collect(),
    };
    let nproc = match req.nproc {
        Nproc::Count(0) => return err("--nproc-per-node 0: give at least one rank"),
        Nproc::Count(n) => n,
        Nproc::PerDevice => pool.len() as u32,
        Nproc::Unspecified => match &req.devices {
            Some((_, p)) => p.len() as u32,
            None if single_external => 1,
            None => {
                return err(format!(
                    "give --nproc-per-node N (or 'gpu' for one rank per visible GPU); {hdesc}"
                ))
            }
        },
    };
    if let Some((text, positions)) = &req.devices {
        if nproc as usize != positions.len() {
            let what = if nproc as usize > positions.len() {
                "asks for more ranks than"
            } else {
                "does not match"
            };
            return err(format!(
                "--nproc-per-node {nproc} {what} --devices '{text}' ({} device{}, from {hdesc}): list exactly one \
                 device per rank", positions.len(), if positions.len() == 1 { "" } else { "s" }));
        }
    } else if nproc > visible {
        let hint = if single_external {
            format!("an external single-entry {} is authoritative for one rank; unset it or launch one rank", cvd::VAR)
        } else {
            "launch fewer ranks or make more GPUs visible".to_string()
        };
        return err(format!(
            "--nproc-per-node {nproc} asks for more ranks than devices: {hdesc}; {hint}"
        ));
    }

    let topo = topology.ok();
    let mut ranks: Vec<RankPlan> = (0..nproc)
        .map(|local| {
            let position = pool[local as usize];
            let device = host.devices[position as usize].clone();
            let numa_node = topo
                .and_then(|t| gpu_info(t, &device))
                .and_then(|g| g.numa_node);
            RankPlan {
                rank: req.node_rank * nproc + local,
                local_rank: local,
                position,
                device,
                numa_node,
                cpus: None,
            }
        })
        .collect();

    let (cpu_policy, cpu_note) = assign_cpus(&req.cpus, &mut ranks, affinity, topology)?;
    Ok(Plan {
        host: host.clone(),
        nproc,
        nnodes: req.nnodes,
        node_rank: req.node_rank,
        world_size: req.nnodes * nproc,
        ranks,
        cpu_policy,
        cpu_note,
        affinity: affinity.clone(),
    })
}

fn gpu_info<'t>(t: &'t Topology, d: &VisibleDevice) -> Option<&'t crate::topology::GpuInfo> {
    d.bus_id
        .as_deref()
        .and_then(|b| t.by_bus_id(b))
        .or_else(|| d.uuid.as_deref().and_then(|u| t.by_uuid(u)))
}

/// R6: fill in each rank's CPU block.
fn assign_cpus(
    req: &CpuRequest,
    ranks: &mut [RankPlan],
    affinity: &CpuSet,
    topology: Result<&Topology, &str>,
) -> Result<(CpuPolicy, String), PlanError> {
    let n = ranks.len();
    match req {
        CpuRequest::Inherit => Ok((
            CpuPolicy::Inherit,
            format!("ranks inherit the launcher's affinity ({affinity})"),
        )),
        CpuRequest::Explicit(blocks) => {
            if blocks.len() != n {
                return err(format!(
                    "--cpu-ids gives {} block{} for {n} rank{}: give exactly one block per rank (blocks separated \
                     by ',' or, when a block needs commas, by '/')",
                    blocks.len(), if blocks.len() == 1 { "" } else { "s" }, if n == 1 { "" } else { "s" }));
            }
            for (i, b) in blocks.iter().enumerate() {
                if !b.is_subset(affinity) {
                    return err(format!(
                        "--cpu-ids block {i} ({b}) is outside the launcher's own CPU affinity ({affinity}): CPUs \
                         {} are not allowed to it; pick CPUs inside it, or start the launcher with more CPUs \
                         (taskset/numactl/cgroup)", b.difference(affinity)));
                }
                for (j, other) in blocks[..i].iter().enumerate() {
                    if !b.is_disjoint(other) {
                        return err(format!(
                            "--cpu-ids blocks {j} ({other}) and {i} ({b}) share CPUs {}: each rank needs its own block",
                            b.intersection(other)));
                    }
                }
            }
            for (r, b) in ranks.iter_mut().zip(blocks) {
                r.cpus = Some(b.clone());
            }
            Ok((
                CpuPolicy::Explicit,
                "explicit blocks from --cpu-ids".to_string(),
            ))
        }
        CpuRequest::Auto => {
            if affinity.len() < n {
                return err(format!(
                    "--cpu-ids auto: {n} ranks need at least {n} CPUs but the launcher's affinity has {} ({affinity}); \
                     launch fewer ranks, widen the affinity, or drop --cpu-ids", affinity.len()));
            }
            match numa_blocks(ranks, affinity, topology) {
                Ok((blocks, size)) => {
                    let used: usize = size * n;
                    for (r, b) in ranks.iter_mut().zip(blocks) {
                        r.cpus = Some(b);
                    }
                    let left = affinity.len() - used;
                    Ok((CpuPolicy::Numa, format!(
                        "NUMA-local blocks of {size} CPU{} from the launcher's affinity ({affinity}), each taken from \
                         the CPUs of its GPU's NUMA node{}",
                        if size == 1 { "" } else { "s" },
                        if left > 0 { format!("; {left} CPUs left unassigned") } else { String::new() })))
                }
                Err(fallback) => {
                    let size = affinity.len() / n;
                    let cpus: Vec<u32> = affinity.iter().collect();
                    for (i, r) in ranks.iter_mut().enumerate() {
                        r.cpus = Some(cpus[i * size..(i + 1) * size].iter().copied().collect());
                    }
                    let left = affinity.len() - size * n;
                    // Blame what is to blame: the topology when it could not be read, the
                    // launcher's affinity when the topology is known but the affinity does not
                    // hold enough CPUs of the GPUs' NUMA nodes (issue 32).
                    let because = match fallback {
                        NoNuma::Topology(why) => format!("the GPU topology is unknown: {why}"),
                        NoNuma::Affinity(why) => format!(
                            "NUMA-local blocks do not fit in the launcher's affinity: {why}; widen the \
                             launcher's affinity to the GPUs' NUMA nodes (taskset, numactl, the cgroup) or give \
                             --cpu-ids explicitly"),
                    };
                    Ok((CpuPolicy::Contiguous, format!(
                        "contiguous blocks of {size} CPU{} from the launcher's affinity ({affinity}) because \
                         {because}{}",
                        if size == 1 { "" } else { "s" },
                        if left > 0 { format!("; {left} CPUs left unassigned") } else { String::new() })))
                }
            }
        }
    }
}

/// Why NUMA-local blocks cannot be made.
enum NoNuma {
    /// The GPU topology (which CPUs are local to which GPU) is not known.
    Topology(String),
    /// It is known, but the launcher's affinity does not hold enough of those CPUs.
    Affinity(String),
}

/// NUMA-local equal blocks, or the reason they cannot be made.
fn numa_blocks(
    ranks: &[RankPlan],
    affinity: &CpuSet,
    topology: Result<&Topology, &str>,
) -> Result<(Vec<CpuSet>, usize), NoNuma> {
    let unknown = NoNuma::Topology;
    let topo = topology.map_err(|e| unknown(format!("topology not readable ({e})")))?;
    // Each rank's locality set; ranks sharing a set form a group.
    let mut locals: Vec<CpuSet> = Vec::with_capacity(ranks.len());
    for r in ranks {
        let d = &r.device;
        let name = d
            .bus_id
            .clone()
            .or_else(|| d.uuid.clone())
            .unwrap_or_else(|| d.entry.text());
        if d.bus_id.is_none() && d.uuid.is_none() {
            return Err(unknown(format!(
                "the driver could not be asked which GPU '{}' is",
                d.entry
            )));
        }
        let g = gpu_info(topo, d)
            .ok_or_else(|| unknown(format!("no /proc/driver/nvidia/gpus entry for GPU {name}")))?;
        let l = topo
            .local_cpus(g)
            .ok_or_else(|| unknown(format!("no NUMA node or local_cpulist for GPU {name}")))?;
        locals.push(l);
    }
    let mut groups: BTreeMap<String, (CpuSet, Vec<usize>)> = BTreeMap::new();
    for (i, l) in locals.iter().enumerate() {
        groups
            .entry(l.to_string())
            .or_insert_with(|| (l.clone(), vec![]))
            .1
            .push(i);
    }
    let sets: Vec<&CpuSet> = groups.values().map(|(s, _)| s).collect();
    for (i, a) in sets.iter().enumerate() {
        for b in &sets[..i] {
            if !a.is_disjoint(b) {
                return Err(unknown(format!("GPU locality sets {a} and {b} overlap")));
            }
        }
    }
    let mut size = usize::MAX;
    for (set, members) in groups.values() {
        let pool = set.intersection(affinity);
        let per = pool.len() / members.len();
        if per == 0 {
            return Err(NoNuma::Affinity(format!(
                "it ({affinity}) holds {} of the CPUs local to the GPUs of ranks {} ({set})",
                pool.len(),
                members
                    .iter()
                    .map(|m| ranks[*m].local_rank.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )));
        }
        size = size.min(per);
    }
    let mut blocks = vec![CpuSet::new(); ranks.len()];
    for (set, members) in groups.values() {
        let cpus: Vec<u32> = set.intersection(affinity).iter().collect();
        for (k, &m) in members.iter().enumerate() {
            blocks[m] = cpus[k * size..(k + 1) * size].iter().copied().collect();
        }
    }
    Ok((blocks, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::GpuInfo;

    fn uuid(i: u32) -> String {
        format!("GPU-{:02x}c0ffee-0000-4000-8000-{:012x}", 0x10 + i, i)
    }
    fn bus(i: u32) -> String {
        format!("0000:{:02x}:00.0", 0x18 + 0x10 * i)
    }
    fn driver(n: u32) -> Vec<DriverGpu> {
        (0..n)
            .map(|i| DriverGpu {
                uuid: uuid(i),
                bus_id: bus(i),
            })
            .collect()
    }
    /// The fake node: `gpus` GPUs, `k` NUMA nodes, GPU i on node i*k/gpus, CPUs split evenly.
    fn topo(gpus: u32, k: u32, cpus: &str) -> Topology {
        let all: Vec<u32> = CpuSet::parse(cpus).unwrap().iter().collect();
        let per = all.len() / k as usize;
        let mut t = Topology::default();
        for n in 0..k {
            t.nodes.insert(
                n,
                all[n as usize * per..(n as usize + 1) * per]
                    .iter()
                    .copied()
                    .collect(),
            );
        }
        for i in 0..gpus {
            let node = i * k / gpus;
            t.gpus.push(GpuInfo {
                bus_id: bus(i),
                uuid: Some(uuid(i)),
                model: None,
                minor: Some(i),
                numa_node: Some(node),
                local_cpulist: t.nodes.get(&node).cloned(),
            });
        }
        t
    }
    fn req(nproc: Nproc, devices: Option<&str>, cpus: CpuRequest) -> Request {
        Request {
            nproc,
            devices: devices.map(|d| (d.to_string(), parse_devices(d).unwrap())),
            cpus,
            nnodes: 1,
            node_rank: 0,
        }
    }
    fn all() -> CpuSet {
        CpuSet::parse("0-15").unwrap()
    }
    fn entries(p: &Plan) -> Vec<String> {
        p.ranks.iter().map(|r| r.device.entry.text()).collect()
    }
    fn plan_err(r: &Request, h: &HostView) -> String {
        plan(r, h, &all(), Err("none")).unwrap_err().0
    }

    #[test]
    fn driver_list_gives_integer_entries_with_identities() {
        let d = driver(8);
        let h = host_view(None, Ok(&d)).unwrap();
        let p = plan(
            &req(Nproc::Count(4), None, CpuRequest::Inherit),
            &h,
            &all(),
            Err("none"),
        )
        .unwrap();
        assert_eq!(entries(&p), ["0", "1", "2", "3"]);
        assert_eq!(p.ranks[3].device.uuid.as_deref(), Some(uuid(3).as_str()));
        assert_eq!(p.world_size, 4);
        assert_eq!(p.cpu_policy, CpuPolicy::Inherit);
    }

    #[test]
    fn devices_select_positions_in_the_parent_list() {
        let d = driver(4);
        let h = host_view(Some("GPU-13,GPU-15,GPU-11,GPU-10"), Ok(&d)).unwrap();
        let p = plan(
            &req(Nproc::Unspecified, Some("1,2"), CpuRequest::Inherit),
            &h,
            &all(),
            Err("x"),
        )
        .unwrap();
        assert_eq!(entries(&p), ["GPU-15", "GPU-11"]);
        assert_eq!(p.ranks[1].position, 2);
        let p = plan(
            &req(Nproc::Count(3), Some("0-2"), CpuRequest::Inherit),
            &h,
            &all(),
            Err("x"),
        )
        .unwrap();
        assert_eq!(entries(&p), ["GPU-13", "GPU-15", "GPU-11"]);
    }

    #[test]
    fn uuid_and_mig_entries_stay_verbatim() {
        // UUID entries are matched verbatim (no space stripping: crates/core/src/cvd.rs, pytorch#92315).
        let h = host_view(
            Some("MIG-1000a11c-0000-4000-8000-000000000000,MIG-1001a11c"),
            Err("no driver"),
        )
        .unwrap();
        let p = plan(
            &req(Nproc::PerDevice, None, CpuRequest::Inherit),
            &h,
            &all(),
            Err("x"),
        )
        .unwrap();
        assert_eq!(
            entries(&p),
            ["MIG-1000a11c-0000-4000-8000-000000000000", "MIG-1001a11c"]
        );
    }

    #[test]
    fn multi_node_ranks() {
        let d = driver(8);
        let h = host_view(None, Ok(&d)).unwrap();
        let mut r = req(Nproc::Count(4), None, CpuRequest::Inherit);
        r.nnodes = 3;
        r.node_rank = 2;
        let p = plan(&r, &h, &all(), Err("x")).unwrap();
        assert_eq!(
            p.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
            [8, 9, 10, 11]
        );
        assert_eq!(p.world_size, 12);
        r.node_rank = 3;
        assert!(plan_err(&r, &h).contains("--node-rank 3"));
    }

    #[test]
    fn single_external_entry_is_authoritative() {
        let d = driver(1);
        let h = host_view(Some("GPU-13"), Ok(&d)).unwrap();
        let e = plan_err(&req(Nproc::Count(1), Some("1"), CpuRequest::Inherit), &h);
        assert!(
            e.contains("--devices '1'") && e.contains("CUDA_VISIBLE_DEVICES='GPU-13'"),
            "{e}"
        );
        let e = plan_err(&req(Nproc::Count(2), None, CpuRequest::Inherit), &h);
        assert!(
            e.contains("--nproc-per-node 2") && e.contains("CUDA_VISIBLE_DEVICES='GPU-13'"),
            "{e}"
        );
        let p = plan(
            &req(Nproc::Unspecified, None, CpuRequest::Inherit),
            &h,
            &all(),
            Err("x"),
        )
        .unwrap();
        assert_eq!(entries(&p), ["GPU-13"]);
        // Position 0 of a single entry is the entry itself: no conflict.
        let p = plan(
            &req(Nproc::Count(1), Some("0"), CpuRequest::Inherit),
            &h,
            &all(),
            Err("x"),
        )
        .unwrap();
        assert_eq!(entries(&p), ["GPU-13"]);
    }

    #[test]
    fn conflicts_name_both_sources() {
        let h = host_view(Some("0,1,2"), Err("no driver")).unwrap();
        let e = plan_err(&req(Nproc::Count(1), Some("5"), CpuRequest::Inherit), &h);
        assert!(
            e.contains("--devices '5'") && e.contains("CUDA_VISIBLE_DEVICES='0,1,2'"),
            "{e}"
        );
        let e = plan_err(&req(Nproc::Count(2), Some("1,1"), CpuRequest::Inherit), &h);
        assert!(
            e.contains("repeats position 1") && e.contains("CUDA_VISIBLE_DEVICES='0,1,2'"),
            "{e}"
        );
        let e = plan_err(&req(Nproc::Count(3), Some("0,1"), CpuRequest::Inherit), &h);
        assert!(
            e.contains("more ranks than") && e.contains("--devices '0,1'") && e.contains("'0,1,2'"),
            "{e}"
        );
        let e = plan_err(&req(Nproc::Count(4), None, CpuRequest::Inherit), &h);
        assert!(
            e.contains("--nproc-per-node 4") && e.contains("CUDA_VISIBLE_DEVICES='0,1,2'"),
            "{e}"
        );
        let d = driver(2);
        let h = host_view(None, Ok(&d)).unwrap();
        let e = plan_err(&req(Nproc::Count(3), None, CpuRequest::Inherit), &h);
        assert!(e.contains("the driver (2 GPUs"), "{e}");
        let e = plan_err(&req(Nproc::Unspecified, None, CpuRequest::Inherit), &h);
        assert!(e.contains("--nproc-per-node"), "{e}");
    }

    #[test]
    fn malformed_parent_lists_are_refused() {
        for (v, piece) in [
            ("0,2,-1,1", "first 2 of 4"),
            ("GPU-12,3", "first 1 of 2"),
            ("0,1,0", "no GPU visible"),
            ("", "no GPU visible"),
            ("-1", "no GPU visible"),
            ("0,", "first 1 of 2"),
        ] {
            let e = host_view(Some(v), Err("x")).unwrap_err().0;
            assert!(
                e.contains(piece) && e.contains(&format!("CUDA_VISIBLE_DEVICES='{v}'")),
                "{v}: {e}"
            );
        }
        let d = driver(2);
        let e = host_view(Some("0,1,5"), Ok(&d)).unwrap_err().0;
        assert!(e.contains("entry '5' is not a device of this node"), "{e}");
        let e = host_view(None, Err("libcuda.so.1: cannot open"))
            .unwrap_err()
            .0;
        assert!(e.contains("libcuda.so.1"), "{e}");
        let e = host_view(None, Ok(&[])).unwrap_err().0;
        assert!(e.contains("no GPU"), "{e}");
    }

    #[test]
    fn parses_devices_and_cpu_ids() {
        assert_eq!(parse_devices("0,2-4, 7").unwrap(), [0, 2, 3, 4, 7]);
        for bad in ["", "a", "1-", "3-1", "GPU-12", "-1"] {
            assert!(parse_devices(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cpu_ids("auto").unwrap(), CpuRequest::Auto);
        let CpuRequest::Explicit(b) = parse_cpu_ids("0-7,8-15").unwrap() else {
            panic!()
        };
        assert_eq!(
            b.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ["0-7", "8-15"]
        );
        let CpuRequest::Explicit(b) = parse_cpu_ids("0-3,8-11/4-7,12-15").unwrap() else {
            panic!()
        };
        assert_eq!(
            b.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ["0-3,8-11", "4-7,12-15"]
        );
        assert!(parse_cpu_ids("0-3/")
            .unwrap_err()
            .0
            .contains("block 1 is empty"));
        assert!(parse_cpu_ids("x").is_err());
    }

    #[test]
    fn explicit_blocks_are_checked_against_the_affinity() {
        let d = driver(2);
        let h = host_view(None, Ok(&d)).unwrap();
        let aff = CpuSet::parse("0-1").unwrap();
        let r = req(Nproc::Count(2), None, parse_cpu_ids("0,1").unwrap());
        let p = plan(&r, &h, &aff, Err("x")).unwrap();
        assert_eq!(p.ranks[1].cpus.as_ref().unwrap().to_string(), "1");
        let r = req(Nproc::Count(2), None, parse_cpu_ids("0,2-3").unwrap());
        let e = plan(&r, &h, &aff, Err("x")).unwrap_err().0;
        assert!(
            e.contains("block 1 (2-3) is outside the launcher's own CPU affinity (0-1)"),
            "{e}"
        );
        let r = req(Nproc::Count(2), None, parse_cpu_ids("0-1/1").unwrap());
        assert!(plan(&r, &h, &aff, Err("x"))
            .unwrap_err()
            .0
            .contains("share CPUs 1"));
        let r = req(Nproc::Count(2), None, parse_cpu_ids("0").unwrap());
        assert!(plan(&r, &h, &aff, Err("x"))
            .unwrap_err()
            .0
            .contains("1 block for 2 ranks"));
    }

    #[test]
    fn auto_takes_numa_local_blocks() {
        let d = driver(8);
        let h = host_view(None, Ok(&d)).unwrap();
        let t = topo(8, 2, "0-15");
        // 4 ranks on GPUs 0-3, all on node 0 (CPUs 0-7): blocks of 2 from node 0.
        let p = plan(
            &req(Nproc::Count(4), None, CpuRequest::Auto),
            &h,
            &all(),
            Ok(&t),
        )
        .unwrap();
        assert_eq!(p.cpu_policy, CpuPolicy::Numa);
        let blocks: Vec<String> = p
            .ranks
            .iter()
            .map(|r| r.cpus.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(blocks, ["0-1", "2-3", "4-5", "6-7"]);
        // GPUs 0 and 4 sit on different nodes.
        let p = plan(
            &req(Nproc::Unspecified, Some("0,4"), CpuRequest::Auto),
            &h,
            &all(),
            Ok(&t),
        )
        .unwrap();
        let blocks: Vec<String> = p
            .ranks
            .iter()
            .map(|r| r.cpus.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(blocks, ["0-7", "8-15"]);
        assert_eq!(p.ranks[1].numa_node, Some(1));
        // The launcher's affinity limits the pool.
        let aff = CpuSet::parse("2-5,8-9").unwrap();
        let p = plan(
            &req(Nproc::Unspecified, Some("0,1,4"), CpuRequest::Auto),
            &h,
            &aff,
            Ok(&t),
        )
        .unwrap();
        let blocks: Vec<String> = p
            .ranks
            .iter()
            .map(|r| r.cpus.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(blocks, ["2-3", "4-5", "8-9"]);
    }

    #[test]
    fn auto_on_two_cpus_two_nodes() {
        let d = driver(8);
        let h = host_view(None, Ok(&d)).unwrap();
        let t = topo(8, 2, "0-1");
        let aff = CpuSet::parse("0-1").unwrap();
        let p = plan(
            &req(Nproc::Unspecified, Some("0,4"), CpuRequest::Auto),
            &h,
            &aff,
            Ok(&t),
        )
        .unwrap();
        let blocks: Vec<String> = p
            .ranks
            .iter()
            .map(|r| r.cpus.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(blocks, ["0", "1"]);
        assert_eq!(p.cpu_policy, CpuPolicy::Numa);
        // Both ranks on node 0 with one CPU there: cannot be local, falls back and says why.
        let p = plan(
            &req(Nproc::Count(2), None, CpuRequest::Auto),
            &h,
            &aff,
            Ok(&t),
        )
        .unwrap();
        assert_eq!(p.cpu_policy, CpuPolicy::Contiguous);
        assert!(p.cpu_note.contains("holds 1 of the CPUs"), "{}", p.cpu_note);
        // The topology is known: the launcher's affinity is to blame, not the topology.
        assert!(
            p.cpu_note.contains("do not fit in the launcher's affinity")
                && p.cpu_note.contains("widen the launcher's affinity")
                && !p.cpu_note.contains("topology is unknown"),
            "{}",
            p.cpu_note
        );
    }

    #[test]
    fn auto_falls_back_when_topology_is_unknown() {
        let d = driver(4);
        let h = host_view(None, Ok(&d)).unwrap();
        let aff = CpuSet::parse("0-6").unwrap();
        let p = plan(
            &req(Nproc::Count(3), None, CpuRequest::Auto),
            &h,
            &aff,
            Ok(&Topology::default()),
        )
        .unwrap();
        assert_eq!(p.cpu_policy, CpuPolicy::Contiguous);
        let blocks: Vec<String> = p
            .ranks
            .iter()
            .map(|r| r.cpus.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(blocks, ["0-1", "2-3", "4-5"]);
        assert!(
            p.cpu_note.contains("no /proc/driver/nvidia/gpus entry")
                && p.cpu_note.contains("1 CPUs left"),
            "{}",
            p.cpu_note
        );
        let p = plan(
            &req(Nproc::Count(3), None, CpuRequest::Auto),
            &h,
            &aff,
            Err("permission denied"),
        )
        .unwrap();
        assert!(p.cpu_note.contains("permission denied"));
        let e = plan(
            &req(Nproc::Count(3), None, CpuRequest::Auto),
            &h,
            &CpuSet::parse("0-1").unwrap(),
            Err("x"),
        );
        assert!(e.unwrap_err().0.contains("need at least 3 CPUs"));
    }

    #[test]
    fn blocks_are_disjoint_and_inside_the_affinity() {
        // A small exhaustive sweep instead of a property test: every rank count on a few
        // affinities and topologies.
        let d = driver(8);
        let h = host_view(None, Ok(&d)).unwrap();
        for cpus in ["0-15", "0-1", "0-5", "0-31"] {
            for k in [1, 2, 4] {
                let t = topo(8, k, cpus);
                for aff in [cpus, "0-1", "1-3,9"] {
                    let aff = CpuSet::parse(aff).unwrap();
                    for n in 1..=8 {
                        let Ok(p) = plan(
                            &req(Nproc::Count(n), None, CpuRequest::Auto),
                            &h,
                            &aff,
                            Ok(&t),
                        ) else {
                            assert!(aff.len() < n as usize);
                            continue;
                        };
                        let mut seen = CpuSet::new();
                        for r in &p.ranks {
                            let b = r.cpus.as_ref().unwrap();
                            assert!(
                                !b.is_empty() && b.is_subset(&aff) && b.is_disjoint(&seen),
                                "{p:?}"
                            );
                            seen = seen.union(b);
                        }
                    }
                }
            }
        }
    }
}

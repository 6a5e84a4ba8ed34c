//! The contract as decisions: a guarded call's arguments in, a [`Verdict`] out.
//!
//! Pure and allocation-free: the interposer calls these on every guarded call, so a
//! verdict is plain data, and what a violation says is rendered only when one is reported.
//! Each check names the rule it enforces (docs/design.md §1) and the CUDA error code a denial
//! returns: an ordinal other than 0 gets the code the driver itself gives for an invisible
//! device (`CUDA_ERROR_INVALID_DEVICE`/`cudaErrorInvalidDevice`, 101); every other denial
//! gets `CUDA_ERROR_NOT_PERMITTED`/`cudaErrorNotPermitted` (800).

use std::fmt;

use crate::strtab::StrTable;

/// A rule of the contract, in the order of its number (`R1` is 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// One GPU per rank process, and the rank's GPU.
    R1,
    /// Device-taking calls name ordinal 0.
    R2,
    /// No cross-device IPC inside a rank.
    R3,
    /// No peer access inside a rank.
    R4,
}

impl Rule {
    /// Every rule, in the order of their numbers.
    pub const ALL: [Rule; 4] = [Rule::R1, Rule::R2, Rule::R3, Rule::R4];

    /// The rule's number (`R1` is 1), as compact records (the guard's tally) keep it.
    pub fn number(self) -> u8 {
        // Declared in number order from 0 (explicit discriminants 1..=4 made the compiler
        // turn `as_str` into a table of string pointers: relocations at every load).
        self as u8 + 1
    }

    /// The rule of a number; None for one this build does not know.
    pub fn from_number(n: u8) -> Option<Rule> {
        Rule::ALL.get(usize::from(n).checked_sub(1)?).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::R1 => "R1",
            Rule::R2 => "R2",
            Rule::R3 => "R3",
            Rule::R4 => "R4",
        }
    }

    /// A rule's short id as records spell it (`R1`..`R4`); None for an id this build does
    /// not know (a record of a newer guard).
    pub fn parse(id: &str) -> Option<Rule> {
        // A match, not a search of `ALL` by `as_str`: that makes `as_str` a table of string
        // pointers, relocated by the loader at every start of the guard.
        match id {
            "R1" => Some(Rule::R1),
            "R2" => Some(Rule::R2),
            "R3" => Some(Rule::R3),
            "R4" => Some(Rule::R4),
            _ => None,
        }
    }

    /// The rule's human name, as the stderr line and `rankguard report` print it.
    pub fn name(self) -> &'static str {
        // By index into one joined string, not a `match` of literals: that is a table of
        // string pointers, relocated by the loader at every start of the guard (strtab).
        const NAMES: StrTable<4> = crate::str_table!(
            "one GPU per rank",
            "cuda:0 only",
            "no cross-device IPC inside a rank",
            "no peer access inside a rank",
        );
        NAMES.get(self as usize)
    }

    /// What the user should do, in one sentence.
    pub fn fix(self) -> &'static str {
        // As `name`.
        const FIXES: StrTable<4> = crate::str_table!(
            "give each rank exactly one GPU: CUDA_VISIBLE_DEVICES=<one index or GPU-uuid>, e.g. `rankguard launch` or `rankguard run --narrow-by LOCAL_RANK`, and do not rewrite CUDA_VISIBLE_DEVICES inside the rank",
            "use device 0 (cuda:0): the rank sees exactly one GPU; choose GPUs with CUDA_VISIBLE_DEVICES before the process starts, never with device ordinals inside it",
            "keep every process of a rank on the rank's GPU; exchange tensors between GPUs through the inter-rank collectives (NCCL), not CUDA IPC inside one rank",
            "peer access crosses GPUs inside one rank; move data between GPUs through the inter-rank collectives (NCCL) instead",
        );
        FIXES.get(self as usize)
    }
}

/// Which error a denial returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyCode {
    /// 101: the call named a device this rank must not use.
    InvalidDevice,
    /// 800: the operation is not permitted inside a rank.
    NotPermitted,
}

/// What a violating call did, as data (rendered only when reported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// A device ordinal (or `CUdevice`) other than 0.
    Ordinal { ordinal: i32 },
    /// A memory location of device type whose id is not 0.
    Location { id: i32 },
    /// Peer access or a peer copy between two devices.
    Peer { device: i32, peer: i32 },
    /// Peer access or a peer copy whose contexts' devices could not be determined.
    PeerUnknown,
    /// The process sees a number of devices other than one (R1).
    Visible { entries: usize, devices: i32 },
    /// `CUDA_VISIBLE_DEVICES` is unset: the process sees every GPU the driver has (R1).
    Unset { devices: i32 },
    /// The one CVD entry names no GPU of this node: the driver enumerates none (R1).
    /// `node_gpus`: how many GPUs the node has (NVML, which ignores CVD), when known.
    NoSuchGpu { node_gpus: Option<u32> },
    /// The process sees one GPU but not the rank's (R1, descendants).
    NotRankGpu,
    /// The process was started with a single-entry CVD and sees another GPU at its first
    /// `cuInit`: it re-pointed its own CVD (R1, [`crate::rankgpu::started_with`]).
    RepointedItself,
    /// An IPC import of memory (`event: false`) or of an event (`event: true`) exported on
    /// another GPU by the same rank (R3).
    CrossDeviceIpc { event: bool },
    /// An IPC import whose exporter is unknown, under `RANKGUARD_IPC=strict` (R3).
    UnknownExporter,
    /// An IPC import of unknown provenance while the user has no registry it can trust (the
    /// default directory was taken by another user and there is no private fallback):
    /// refused whatever `RANKGUARD_IPC` says, else squatting the directory would switch R3 off.
    UnknownNoRegistry,
    /// An IPC import of unknown provenance inside a known rank while the registry has lost
    /// records of a live exporter (it was full, or its file system): refused whatever
    /// `RANKGUARD_IPC` says, else an overflowing registry would let this rank's own
    /// cross-device import through (`crate::registry::Decision::after_overflow`).
    UnknownOverflow,
    /// An imported mapping that the driver reports on another device than the rank's (R3).
    ImportedOnOtherDevice { device: i32 },
    /// One cooperative launch across several devices (R4).
    MultiDeviceLaunch { devices: u32 },
    /// A checkpoint restore that moves a process's CUDA state onto another GPU (R1).
    RestoreOntoOtherGpu,
    /// The ancestor walk that names the rank (no rank variables) could not read `/proc`
    /// (R1 fails closed: the process's rank GPU is unknown, not absent).
    RankUnreadable(Unreadable),
}

/// A `/proc` file the rank root's walk could not read, and why (an OS error number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unreadable {
    pub pid: u32,
    /// The file under `/proc/<pid>/` (`stat`, `environ`).
    pub file: &'static str,
    pub errno: i32,
}

/// The symbolic name of the OS errors a `/proc` read can hit for lack of resources.
fn errno_name(errno: i32) -> &'static str {
    match errno {
        4 => "EINTR",
        5 => "EIO",
        11 => "EAGAIN",
        12 => "ENOMEM",
        23 => "ENFILE",
        24 => "EMFILE",
        _ => "an OS error",
    }
}

impl Detail {
    /// The text of [`Detail::NotRankGpu`] (the stderr line adds what the process sees).
    pub const NOT_RANK_GPU: &'static str = "the process sees one GPU, but not the rank's GPU";
    /// The text of [`Detail::RepointedItself`] (the stderr line adds both values).
    pub const REPOINTED_ITSELF: &'static str = "the process was started with one GPU and re-pointed CUDA_VISIBLE_DEVICES to another before its first cuInit";
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Detail::Ordinal { ordinal } => write!(f, "device ordinal {ordinal} is not 0"),
            Detail::Location { id } => write!(f, "memory location is device {id}, not 0"),
            Detail::Peer { device, peer } => {
                write!(f, "peer access between device {device} and device {peer}")
            }
            Detail::PeerUnknown => {
                f.write_str("peer access between contexts whose devices could not be determined")
            }
            Detail::Visible { entries, devices } => write!(
                f,
                "the process sees {devices} device{} from {entries} CUDA_VISIBLE_DEVICES entr{}",
                if devices == 1 { "" } else { "s" },
                if entries == 1 { "y" } else { "ies" }
            ),
            Detail::Unset { devices } => write!(
                f,
                "CUDA_VISIBLE_DEVICES is unset, so the process sees every GPU of the node ({devices} device{})",
                if devices == 1 { "" } else { "s" }
            ),
            Detail::NoSuchGpu { node_gpus } => match node_gpus {
                Some(0) => f.write_str(
                    "CUDA_VISIBLE_DEVICES names a GPU that does not exist: this node has no GPU",
                ),
                Some(1) => f.write_str(
                    "CUDA_VISIBLE_DEVICES names a GPU that does not exist: this node has GPU 0 only",
                ),
                Some(n) => write!(
                    f,
                    "CUDA_VISIBLE_DEVICES names a GPU that does not exist: this node has GPUs 0-{}",
                    n - 1
                ),
                None => f.write_str(
                    "CUDA_VISIBLE_DEVICES names a GPU the driver does not have (it enumerates no device)",
                ),
            },
            Detail::NotRankGpu => f.write_str(Detail::NOT_RANK_GPU),
            Detail::RepointedItself => f.write_str(Detail::REPOINTED_ITSELF),
            Detail::CrossDeviceIpc { event: false } => {
                f.write_str("IPC import of memory exported on another GPU by the same rank")
            }
            Detail::CrossDeviceIpc { event: true } => {
                f.write_str("IPC import of an event exported on another GPU by the same rank")
            }
            Detail::UnknownExporter => {
                f.write_str("IPC import of unknown provenance (RANKGUARD_IPC=strict)")
            }
            Detail::UnknownNoRegistry => f.write_str(
                "IPC import of unknown provenance: refused, there is no provenance registry this user can trust (set RANKGUARD_REGISTRY)",
            ),
            Detail::UnknownOverflow => write!(
                f,
                "IPC import of unknown provenance inside a rank while the provenance registry has lost records of a live exporter (it holds at most {} records; full, or its file system full), so this may be the rank's own memory on another GPU; fix: fewer live IPC exports per node, free space in the registry's file system, or set RANKGUARD_REGISTRY to a directory with room",
                REGISTRY_RECORDS
            ),
            Detail::ImportedOnOtherDevice { device } => {
                write!(
                    f,
                    "the imported mapping is on device {device}, not the rank's device 0"
                )
            }
            Detail::MultiDeviceLaunch { devices } => {
                write!(f, "one cooperative launch across {devices} devices")
            }
            Detail::RestoreOntoOtherGpu => f.write_str(
                "a checkpoint restore remaps the process onto another GPU than it was checkpointed on",
            ),
            Detail::RankUnreadable(u) => write!(
                f,
                "the rank could not be established: /proc/{}/{} could not be read ({}), so the walk of the ancestors is refused; fix: leave fds free at the first cuInit (ulimit -n) or name the rank (RANK, RANKGUARD_RANK_GPU)",
                u.pid,
                u.file,
                errno_name(u.errno),
            ),
        }
    }
}

/// A broken rule: which, why, and what a denial returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: Rule,
    pub code: DenyCode,
    pub detail: Detail,
}

impl Violation {
    /// The ordinal the call named, for the audit record's `ordinal` field.
    pub fn ordinal(&self) -> Option<i32> {
        match self.detail {
            Detail::Ordinal { ordinal } => Some(ordinal),
            Detail::Location { id } => Some(id),
            Detail::Peer { peer, .. } => Some(peer),
            _ => None,
        }
    }
}

/// How many records the IPC provenance registry holds (`registry::MAX_RECORDS`, which is
/// this): defined here, below the registry, because the overflow line names it.
pub const REGISTRY_RECORDS: usize = 65_536;

/// The decision on one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Within the contract.
    Allow,
    /// A pure query about another device: never denied (the driver refuses it under
    /// correct visibility), recorded in warn mode.
    Query(Violation),
    /// Breaks the contract.
    Violation(Violation),
}

impl Verdict {
    #[inline]
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow)
    }
}

/// R2: a call that uses a device by ordinal or `CUdevice`.
#[inline]
pub fn ordinal(ordinal: i32) -> Verdict {
    if ordinal == 0 {
        Verdict::Allow
    } else {
        Verdict::Violation(Violation {
            rule: Rule::R2,
            code: DenyCode::InvalidDevice,
            detail: Detail::Ordinal { ordinal },
        })
    }
}

/// R2: a device argument that may also name the host (`CU_DEVICE_CPU`, -1).
#[inline]
pub fn ordinal_or_host(device: i32) -> Verdict {
    if device == -1 {
        Verdict::Allow
    } else {
        ordinal(device)
    }
}

/// A pure query about a device: recorded in warn mode when it is not device 0.
#[inline]
pub fn query(device: i32) -> Verdict {
    match ordinal(device) {
        Verdict::Violation(v) => Verdict::Query(v),
        other => other,
    }
}

/// `CUmemLocationType` values (cuda.h).
pub mod location {
    pub const DEVICE: u32 = 1;
    pub const HOST: u32 = 2;
    pub const HOST_NUMA: u32 = 3;
    pub const HOST_NUMA_CURRENT: u32 = 4;
}

/// R2 on a `CUmemLocation`: only a location of device type names a device; host, host-NUMA
/// and others are not devices, whatever their id (HAMi#1764 misread them).
#[inline]
pub fn location(type_: u32, id: i32) -> Verdict {
    if type_ != location::DEVICE || id == 0 {
        Verdict::Allow
    } else {
        Verdict::Violation(Violation {
            rule: Rule::R2,
            code: DenyCode::InvalidDevice,
            detail: Detail::Location { id },
        })
    }
}

/// R4: peer access or a peer copy between two devices known by ordinal. The same device on
/// both sides is not a peer operation (the driver answers it itself); two different
/// devices are a violation whatever their ordinals.
#[inline]
pub fn peer(device: i32, peer: i32) -> Verdict {
    if device == peer {
        ordinal(device)
    } else {
        Verdict::Violation(Violation {
            rule: Rule::R4,
            code: DenyCode::NotPermitted,
            detail: Detail::Peer { device, peer },
        })
    }
}

/// R4 when the devices behind two contexts could not be determined: fail closed.
pub fn peer_unknown() -> Verdict {
    Verdict::Violation(Violation {
        rule: Rule::R4,
        code: DenyCode::NotPermitted,
        detail: Detail::PeerUnknown,
    })
}

/// The first verdict that is not Allow among several (each argument of an array: access
/// descriptors, locations, a device list), else Allow. Violations and queries are reported
/// for the first offending element, as the driver reports the first invalid one.
#[inline]
pub fn first<I: IntoIterator<Item = Verdict>>(verdicts: I) -> Verdict {
    verdicts
        .into_iter()
        .find(|v| !v.is_allow())
        .unwrap_or(Verdict::Allow)
}

/// A query about two devices (P2P attributes): recorded when either is not device 0.
#[inline]
pub fn query_pair(a: i32, b: i32) -> Verdict {
    first([query(a), query(b)])
}

/// Granting a device access to a memory pool (`cuMemPoolSetAccess`): R2 on the
/// descriptor's location; and R4 when the pool lives on another device than the one
/// granted access (PyTorch's allocator enables peer access this way, not through
/// `cudaDeviceEnablePeerAccess`). `pool_device` is the pool's device when it has a device
/// location and the guard could learn it; `None` for a host pool or an unknown one.
#[inline]
pub fn pool_access(pool_device: Option<i32>, type_: u32, id: i32) -> Verdict {
    let r2 = location(type_, id);
    if !r2.is_allow() || type_ != location::DEVICE {
        return r2;
    }
    match pool_device {
        Some(p) if p != id => peer(p, id),
        _ => Verdict::Allow,
    }
}

/// R4: one cooperative kernel launched on several devices at once
/// (`cuLaunchCooperativeKernelMultiDevice`). A single device is the rank's own (its stream's
/// context was created under R2).
#[inline]
pub fn multi_device(devices: u32) -> Verdict {
    if devices <= 1 {
        Verdict::Allow
    } else {
        Verdict::Violation(Violation {
            rule: Rule::R4,
            code: DenyCode::NotPermitted,
            detail: Detail::MultiDeviceLaunch { devices },
        })
    }
}

/// R1 on a checkpoint restore (`cuCheckpointProcessRestore`, CUDA 13.5's GPU remapping):
/// each pair moves the state of the GPU `old` onto `new`. A rank is one GPU, checked at its
/// first `cuInit` against its `CUDA_VISIBLE_DEVICES` and rank GPU, and a restored process
/// does not initialise again: a pair onto another GPU would move the rank off its GPU
/// unseen. Pairs that keep the GPU are allowed.
pub fn restore<'a, I: IntoIterator<Item = (&'a [u8; 16], &'a [u8; 16])>>(pairs: I) -> Verdict {
    if pairs.into_iter().all(|(old, new)| old == new) {
        Verdict::Allow
    } else {
        Verdict::Violation(Violation {
            rule: Rule::R1,
            code: DenyCode::NotPermitted,
            detail: Detail::RestoreOntoOtherGpu,
        })
    }
}

/// What the R1 check at CUDA initialisation needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitFacts {
    /// `CUDA_VISIBLE_DEVICES` was set.
    pub cvd_set: bool,
    /// Entries left after CUDA's syntactic rules (`cvd::parse`).
    pub entries: usize,
    /// Devices the driver enumerates (0 when cuInit failed).
    pub devices: i32,
    /// Whether the device this process sees is the rank's GPU: `None` when the launcher
    /// named no rank GPU (plain `LD_PRELOAD`), or the identity could not be compared.
    pub is_rank_gpu: Option<bool>,
    /// The walk that names the rank (no rank variables) could not read `/proc`.
    pub walk_unreadable: Option<Unreadable>,
    /// Whether the one device this process sees is the GPU its single-entry start CVD named
    /// ([`crate::rankgpu::started_with`]): `None` when it was started with no such CVD.
    pub kept_start_gpu: Option<bool>,
    /// The node's GPU count as NVML tells it (NVML ignores CVD), when known: says which
    /// GPUs exist when the one entry names none.
    pub node_gpus: Option<u32>,
}

/// R1 at CUDA initialisation.
///
/// - A process deliberately given no GPU (CVD empty, `-1`, nothing valid) is not a rank
///   process: it gets the driver's own "no device" answer.
/// - Otherwise CVD must hold exactly one entry and the driver must enumerate exactly one
///   device; an entry naming a GPU the driver does not have (one entry, zero devices)
///   breaks R1 too, since a silent CPU fallback is what the contract exists to prevent.
/// - With a rank GPU named by the launcher (or the rank root), the one device must be that
///   GPU.
/// - A process started with a single-entry CVD must see that entry's GPU: re-pointing its
///   own CVD before `cuInit` is R1 as re-pointing a child's is (docs/design.md §1).
pub fn init(f: InitFacts) -> Verdict {
    if f.cvd_set && f.entries == 0 {
        return Verdict::Allow;
    }
    let r1 = |detail| {
        Verdict::Violation(Violation {
            rule: Rule::R1,
            code: DenyCode::NotPermitted,
            detail,
        })
    };
    if !f.cvd_set {
        return r1(Detail::Unset { devices: f.devices });
    }
    if f.entries == 1 && f.devices == 0 {
        return r1(Detail::NoSuchGpu {
            node_gpus: f.node_gpus,
        });
    }
    if f.entries != 1 || f.devices != 1 {
        return r1(Detail::Visible {
            entries: f.entries,
            devices: f.devices,
        });
    }
    if let Some(u) = f.walk_unreadable {
        return Verdict::Violation(Violation {
            rule: Rule::R1,
            code: DenyCode::NotPermitted,
            detail: Detail::RankUnreadable(u),
        });
    }
    if f.is_rank_gpu == Some(false) {
        return r1(Detail::NotRankGpu);
    }
    if f.kept_start_gpu == Some(false) {
        return r1(Detail::RepointedItself);
    }
    Verdict::Allow
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_is_its_number_and_its_id() {
        for (i, r) in Rule::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(r.number()), i + 1);
            assert_eq!(Rule::from_number(r.number()), Some(r));
            assert_eq!(r.as_str(), format!("R{}", i + 1));
            assert_eq!(Rule::parse(r.as_str()), Some(r));
        }
        assert_eq!(Rule::from_number(0), None);
        assert_eq!(Rule::from_number(5), None);
        assert_eq!(Rule::parse("R5"), None);
        assert_eq!(Rule::parse("r1"), None);
    }

    #[test]
    fn ordinal_zero_is_the_only_device() {
        assert!(ordinal(0).is_allow());
        for o in [1, 7, -1, i32::MAX, i32::MIN] {
            match ordinal(o) {
                Verdict::Violation(v) => {
                    assert_eq!(v.rule, Rule::R2);
                    assert_eq!(v.code, DenyCode::InvalidDevice);
                    assert_eq!(v.ordinal(), Some(o));
                }
                other => panic!("{o}: {other:?}"),
            }
        }
        assert!(ordinal_or_host(-1).is_allow());
        assert!(!ordinal_or_host(-2).is_allow());
    }

    #[test]
    fn queries_are_never_violations() {
        assert!(query(0).is_allow());
        assert!(matches!(query(3), Verdict::Query(v) if v.rule == Rule::R2));
    }

    #[test]
    fn host_locations_are_not_devices() {
        assert!(location(location::HOST, 5).is_allow());
        assert!(location(location::HOST_NUMA, 1).is_allow());
        assert!(location(location::HOST_NUMA_CURRENT, 1).is_allow());
        assert!(location(location::DEVICE, 0).is_allow());
        assert!(!location(location::DEVICE, 1).is_allow());
    }

    #[test]
    fn peer_operations() {
        assert!(peer(0, 0).is_allow());
        assert!(
            matches!(peer(0, 1), Verdict::Violation(v) if v.rule == Rule::R4 && v.code == DenyCode::NotPermitted)
        );
        assert!(matches!(peer(1, 1), Verdict::Violation(v) if v.rule == Rule::R2));
        assert!(!peer_unknown().is_allow());
    }

    #[test]
    fn arrays_report_their_first_offender() {
        assert!(first([]).is_allow());
        assert!(first([ordinal(0), location(location::HOST, 3)]).is_allow());
        let v = first([ordinal(0), ordinal(2), ordinal(5)]);
        assert!(matches!(v, Verdict::Violation(x) if x.ordinal() == Some(2)));
        // A device list (cudaSetValidDevices): any entry other than 0 is R2.
        assert!(!first([0, 1].map(ordinal)).is_allow());
        assert!(first([0, 0].map(ordinal)).is_allow());
    }

    #[test]
    fn two_device_queries() {
        assert!(query_pair(0, 0).is_allow());
        assert!(matches!(query_pair(0, 1), Verdict::Query(v) if v.ordinal() == Some(1)));
        assert!(matches!(query_pair(3, 0), Verdict::Query(v) if v.ordinal() == Some(3)));
    }

    #[test]
    fn pool_access_grants() {
        use location::*;
        // The rank's own pool, its own device.
        assert!(pool_access(Some(0), DEVICE, 0).is_allow());
        // Unknown or host pool, device 0: nothing crosses devices that the guard can see.
        assert!(pool_access(None, DEVICE, 0).is_allow());
        // Another device named in the descriptor: R2, whatever the pool.
        for pool in [None, Some(0), Some(1)] {
            assert!(
                matches!(pool_access(pool, DEVICE, 1), Verdict::Violation(v) if v.rule == Rule::R2 && v.code == DenyCode::InvalidDevice),
                "{pool:?}"
            );
        }
        // PyTorch's pattern: device 1's pool made accessible from device 0 is R4.
        assert!(
            matches!(pool_access(Some(1), DEVICE, 0), Verdict::Violation(v) if v.rule == Rule::R4 && v.code == DenyCode::NotPermitted && v.detail == Detail::Peer { device: 1, peer: 0 })
        );
        // Host locations are not devices.
        assert!(pool_access(Some(1), HOST_NUMA, 0).is_allow());
    }

    #[test]
    fn multi_device_launches() {
        assert!(multi_device(0).is_allow());
        assert!(multi_device(1).is_allow());
        let v = multi_device(2);
        assert!(
            matches!(v, Verdict::Violation(x) if x.rule == Rule::R4 && x.code == DenyCode::NotPermitted)
        );
        if let Verdict::Violation(x) = v {
            assert_eq!(
                x.detail.to_string(),
                "one cooperative launch across 2 devices"
            );
        }
    }

    #[test]
    fn restores_keep_the_gpu() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert!(restore([]).is_allow());
        assert!(restore([(&a, &a), (&b, &b)]).is_allow());
        assert!(
            matches!(restore([(&a, &a), (&a, &b)]), Verdict::Violation(v) if v.rule == Rule::R1 && v.code == DenyCode::NotPermitted && v.detail == Detail::RestoreOntoOtherGpu)
        );
    }

    fn facts(cvd_set: bool, entries: usize, devices: i32) -> InitFacts {
        InitFacts {
            cvd_set,
            entries,
            devices,
            is_rank_gpu: None,
            walk_unreadable: None,
            kept_start_gpu: None,
            node_gpus: None,
        }
    }

    #[test]
    fn r1_at_init() {
        // unset on an 8-GPU node, `0,1`, one entry, empty/-1, an entry naming nothing
        assert!(!init(facts(false, 0, 8)).is_allow());
        assert!(!init(facts(false, 0, 1)).is_allow());
        assert!(!init(facts(true, 2, 2)).is_allow());
        assert!(init(facts(true, 1, 1)).is_allow());
        assert!(init(facts(true, 0, 0)).is_allow());
        assert!(!init(facts(true, 1, 0)).is_allow());
        let mut f = facts(true, 1, 1);
        f.is_rank_gpu = Some(false);
        assert!(matches!(init(f), Verdict::Violation(v) if v.detail == Detail::NotRankGpu));
        f.is_rank_gpu = Some(true);
        assert!(init(f).is_allow());
    }

    /// A process started with one GPU that sees another at its first cuInit is R1; one
    /// started with several entries or none that narrowed itself to one is not.
    #[test]
    fn r1_a_process_that_repointed_itself() {
        let mut f = facts(true, 1, 1);
        f.kept_start_gpu = Some(false);
        let Verdict::Violation(v) = init(f) else {
            panic!("allowed")
        };
        assert_eq!((v.rule, v.detail), (Rule::R1, Detail::RepointedItself));
        assert_eq!(v.detail.to_string(), Detail::REPOINTED_ITSELF);
        f.kept_start_gpu = Some(true);
        assert!(init(f).is_allow());
        // not started with a single entry (several, none): the single-rank case runs
        f.kept_start_gpu = None;
        assert!(init(f).is_allow());
        // the launcher's or the root's rank GPU is said first when both disagree
        f.kept_start_gpu = Some(false);
        f.is_rank_gpu = Some(false);
        assert!(matches!(init(f), Verdict::Violation(v) if v.detail == Detail::NotRankGpu));
        // deliberately given no GPU after starting with one: the driver's own answer
        let mut none = facts(true, 0, 0);
        none.kept_start_gpu = Some(false);
        assert!(init(none).is_allow());
    }

    /// Unset CVD is said as unset; an entry naming no GPU says which GPUs the node has.
    #[test]
    fn r1_details_say_what_the_process_was_given() {
        let d = |f: InitFacts| match init(f) {
            Verdict::Violation(v) => v.detail.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            d(facts(false, 0, 8)),
            "CUDA_VISIBLE_DEVICES is unset, so the process sees every GPU of the node (8 devices)"
        );
        assert_eq!(
            d(facts(true, 2, 2)),
            "the process sees 2 devices from 2 CUDA_VISIBLE_DEVICES entries"
        );
        let mut f = facts(true, 1, 0);
        assert_eq!(
            d(f),
            "CUDA_VISIBLE_DEVICES names a GPU the driver does not have (it enumerates no device)"
        );
        f.node_gpus = Some(8);
        assert_eq!(
            d(f),
            "CUDA_VISIBLE_DEVICES names a GPU that does not exist: this node has GPUs 0-7"
        );
        f.node_gpus = Some(1);
        assert!(d(f).ends_with("this node has GPU 0 only"));
        f.node_gpus = Some(0);
        assert!(d(f).ends_with("this node has no GPU"));
    }

    /// A walk that could not read /proc fails closed, and says what, why and the fix; a
    /// process deliberately given no GPU is still allowed.
    #[test]
    fn r1_unread_walk_fails_closed() {
        let u = Unreadable {
            pid: 42,
            file: "stat",
            errno: 24,
        };
        let mut f = facts(true, 1, 1);
        f.walk_unreadable = Some(u);
        let Verdict::Violation(v) = init(f) else {
            panic!("allowed")
        };
        assert_eq!((v.rule, v.detail), (Rule::R1, Detail::RankUnreadable(u)));
        let text = v.detail.to_string();
        for part in ["/proc/42/stat", "EMFILE", "ulimit -n", "RANKGUARD_RANK_GPU"] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let mut none = facts(true, 0, 0);
        none.walk_unreadable = Some(u);
        assert!(init(none).is_allow());
    }
}

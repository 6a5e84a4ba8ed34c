//! The IPC provenance registry behind rule R3 (no cross-device IPC inside a rank).
//!
//! A CUDA IPC handle does not say which GPU it came from, and the runtime opens handles of
//! devices the importer does not even see, so the guard remembers who exported what: when
//! a guarded process exports, it writes one small record (job, rank, pid, the GPU, the
//! memory's location type) into a per-user directory; when a guarded process imports, it
//! looks the handle up there and [`decide`]s.
//!
//! Safe code only: the FFI glue (`guard/ipc.rs`) passes in the facts it asked the driver
//! and the kernel for (handle bytes, file identity, euid) and gets decisions back.
//!
//! Trust. The directory is trusted only when it is a real directory (not a symlink) owned
//! by the effective user with no group/other permission bits; anything else is ignored
//! ([`DirProblem`]). Inside it, a record is trusted only when it is a regular file (opened
//! with `O_NOFOLLOW`), owned by the user, not group/other-writable, at most
//! [`MAX_RECORD_BYTES`], parses completely (a closing `end` line), names the key its file
//! name says, and its exporter is alive: the pid exists, belongs to the same user, and
//! started at the recorded time (pid reuse and forged pids fail that). Anything else is
//! skipped ([`Skip`]) and removed, never trusted. Pids are compared in the registry's pid
//! namespace: processes sharing a registry must share a pid namespace (one node or one
//! container); across namespaces records look forged and provenance is unknown. Two caches
//! make repeated shares cheaper without skipping a check: a re-export of a record this
//! process found in place costs one `lstat` of it ([`Known`]), and an import reuses a
//! liveness verdict of the same `(pid, start time)` for 5 ms ([`RecentlyAlive`]).
//!
//! Writes are atomic: a record is written to a fresh `O_EXCL` temporary file and renamed
//! over its final name, so a reader sees a whole record or none, and concurrent writers of
//! different keys never interfere. The directory is bounded ([`MAX_RECORDS`]): a write to a
//! full registry first sweeps at most [`SWEEP_BUDGET`] entries of it (bounded in time), and
//! is refused only when that sweep freed nothing, saying what the sweep saw. A record that
//! cannot be stored (full, or its file system) puts its exporter on the overflow mark
//! ([`OVERFLOW_MARK`]), under which unknown provenance inside a known rank is refused
//! ([`Decision::after_overflow`]).
//!
//! Keys (one file per exported handle, named `<tag>-<hex>`):
//! - legacy memory and event handles, FABRIC handles and pool pointer export data: their 64
//!   bytes, which the driver hands out by value and which are equal for the same allocation
//!   (ucx#11724: a handle for base+offset equals the base's); never parsed;
//! - VMM/pool POSIX file descriptors: the open file's identity `(st_dev, st_ino)`, which the
//!   fd passed over a unix socket (SCM_RIGHTS) keeps. Only a regular file's identity is
//!   unique (a memfd/tmpfs inode names one file while it exists); an `anon_inode` fd (one
//!   inode shared by every such file) or a device node is not, and has no key
//!   ([`Key::from_file`]): its provenance is unknown.

use std::fmt::{self, Write as _};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::config::IpcPolicy;
use crate::handle_table::Handle;
use crate::policy::{self, DenyCode, Detail, Rule, Verdict, Violation};
use crate::rank_root::RootId;

/// Largest record file accepted (a real one is ~300 bytes).
pub const MAX_RECORD_BYTES: u64 = 1024;
/// Most entries in the registry directory (about: see [`COUNT_EVERY`]). A caching allocator
/// exports one handle per segment, so a node's live exports reach tens of thousands. A
/// lookup is one open by name, whatever the size; on tmpfs each record takes one page of
/// memory (4 KiB), so a full registry holds about 256 MiB of `/dev/shm`.
pub const MAX_RECORDS: usize = crate::policy::REGISTRY_RECORDS;
/// A process counts the directory at its first new record and at every `COUNT_EVERY`th
/// after (each count reads up to [`MAX_RECORDS`] entries), and at every new record while
/// its last count found the registry full: the bound is exceeded by at most this many
/// records per concurrent writer. The first count is the start-up sweep's, when it read the
/// whole directory and the first write goes through the registry it swept
/// ([`Registry::sweep_dead_within`]).
pub const COUNT_EVERY: u64 = 256;
/// Most directory entries one sweep examines. Each costs an open, a read and a `/proc`
/// lookup (tens of microseconds), so a sweep at a process start or an export stays within
/// a few milliseconds however many stale records there are; a registry holding more dead
/// records than this is cleaned over several sweeps, each of which frees room for its own
/// write.
pub const SWEEP_BUDGET: usize = 128;
/// The most time a process's start-up sweep spends (the first registry a guarded process
/// opens is swept once, within this and [`SWEEP_BUDGET`] entries): records of processes that
/// died without removing theirs (a signal, `_exit`) go, and no start-up pays more than this
/// for them however many there are.
pub const START_SWEEP_TIME: std::time::Duration = std::time::Duration::from_millis(1);
/// The overflow mark (issue 29, item 3): a file in the registry directory listing the live
/// processes whose exports could not be recorded (the registry full, its file system full or
/// read-only). While it names a live process, a missing record no longer means "an
/// unguarded exporter": it may be this rank's own export on another GPU
/// ([`Decision::after_overflow`]). Not a key's file name, so a sweep keeps it.
pub const OVERFLOW_MARK: &str = "overflow";
/// Most exporters one overflow mark lists; one more makes it [`Overflow::sticky`].
pub const OVERFLOW_MAX: usize = 64;
const OVERFLOW_MAGIC: &str = "rankguard-ipc-overflow 1";
/// A temporary file older than this is a writer's leftover (it died between create and
/// rename) and is removed by a sweep.
pub const STALE_TMP_SECS: u64 = 60;
/// The longest job id stored verbatim; longer ones are stored as a prefix and a hash.
const MAX_JOB: usize = 128;
/// `PID_MAX_LIMIT` on 64-bit Linux (2^22).
const PID_MAX: u32 = 1 << 22;
const MAGIC: &str = "rankguard-ipc-record 1";
/// `ANON_INODE_FS_MAGIC` (linux/magic.h): every anon_inode file shares one inode.
pub const ANON_INODE_FS_MAGIC: i64 = 0x0904_1934;
/// `DMA_BUF_MAGIC` (linux/magic.h): each dma-buf is its own inode of the dmabuf
/// filesystem (not a regular file, but a unique identity).
pub const DMA_BUF_MAGIC: i64 = 0x444d_4142;

// ---------------------------------------------------------------------------------------
// Keys

/// What kind of handle a record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cuIpcGetMemHandle` / `cudaIpcGetMemHandle` (64 bytes).
    Mem,
    /// `cuIpcGetEventHandle` / `cudaIpcGetEventHandle` (64 bytes).
    Event,
    /// `cuMemExportToShareableHandle` POSIX fd (file identity).
    VmmFd,
    /// `cuMemExportToShareableHandle` FABRIC handle (64 bytes).
    Fabric,
    /// `cuMemPoolExportToShareableHandle` POSIX fd (file identity).
    PoolFd,
    /// `cuMemPoolExportToShareableHandle` FABRIC handle (64 bytes).
    PoolFabric,
    /// `cuMemPoolExportPointer` export data (64 bytes).
    PoolPtr,
    /// `cuMemGetHandleForAddressRange` dma-buf fd (file identity).
    DmaBuf,
    /// Not a handle: a guarded process's rank record (`rank-<pid>`, see
    /// [`crate::rank_root`]): written at its first `cuInit` when no rank variables name its
    /// rank, so its descendants find the rank root. Its `gpu` is the rank GPU, its `root`
    /// the root it belongs to.
    Rank,
}

/// The handle table's key of a 64-byte handle of `kind` (its kind is the slot's tag).
pub fn table_handle(kind: Kind, bytes: [u8; 64]) -> Handle {
    Handle {
        kind: kind as u8,
        bytes,
    }
}

impl Kind {
    /// Every kind, in declaration order (so `ALL[k as usize] == k`).
    const ALL: [Kind; 9] = [
        Kind::Mem,
        Kind::Event,
        Kind::VmmFd,
        Kind::Fabric,
        Kind::PoolFd,
        Kind::PoolFabric,
        Kind::PoolPtr,
        Kind::DmaBuf,
        Kind::Rank,
    ];

    fn tag(self) -> &'static str {
        match self {
            Kind::Mem => "mem",
            Kind::Event => "event",
            Kind::VmmFd => "vmmfd",
            Kind::Fabric => "fabric",
            Kind::PoolFd => "poolfd",
            Kind::PoolFabric => "poolfabric",
            Kind::PoolPtr => "poolptr",
            Kind::DmaBuf => "dmabuf",
            Kind::Rank => "rank",
        }
    }

    /// The handle type, as reports name it.
    pub fn as_str(self) -> &'static str {
        self.tag()
    }

    /// The kind's place in a fixed order, a compact form for tables of atomics
    /// ([`Kind::from_index`] is its inverse).
    pub fn index(self) -> u8 {
        self as u8
    }

    /// The kind at `index` in [`Kind::index`]'s order.
    pub fn from_index(index: u8) -> Option<Kind> {
        Kind::ALL.get(usize::from(index)).copied()
    }
}

/// The identity of an open file, as `fstat`/`fstatfs` report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdent {
    pub dev: u64,
    pub ino: u64,
    /// `S_ISREG(st_mode)`.
    pub regular: bool,
    /// `fstatfs().f_type`.
    pub fs_magic: i64,
}

/// A registry key: a kind and a hex identity; also the record's file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    kind: Kind,
    ident: String,
}

/// Why a file descriptor has no key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoKey {
    /// An anon_inode or device fd: its inode is shared by other files.
    NotUnique,
}

impl Key {
    /// A handle passed by value: its bytes, never parsed.
    pub fn from_bytes(kind: Kind, bytes: &[u8]) -> Key {
        // By table, not `write!` per byte: PyTorch makes two or three keys per share of a
        // tensor, and 64 formatter calls a key were most of the guard's own time in it.
        // Into a buffer of its final size, two digits a step, not a `push` (and its capacity
        // check) per digit.
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = vec![0u8; bytes.len() * 2];
        for (pair, &b) in hex.chunks_exact_mut(2).zip(bytes) {
            pair.copy_from_slice(&[DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]]);
        }
        // Hex digits are ASCII: the check cannot fail (an empty identity if it did).
        let ident = String::from_utf8(hex).unwrap_or_default();
        Key { kind, ident }
    }

    /// The rank record of process `pid` (decimal digits are valid key text).
    pub fn rank(pid: u32) -> Key {
        Key {
            kind: Kind::Rank,
            ident: pid.to_string(),
        }
    }

    /// A file descriptor: its `(st_dev, st_ino)` where that is unique.
    pub fn from_file(kind: Kind, f: FileIdent) -> Result<Key, NoKey> {
        let dmabuf = f.fs_magic == DMA_BUF_MAGIC;
        if !(f.regular || dmabuf) || f.fs_magic == ANON_INODE_FS_MAGIC {
            return Err(NoKey::NotUnique);
        }
        Ok(Key {
            kind,
            ident: format!("{:x}.{:x}", f.dev, f.ino),
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The record's file name: `<tag>-<ident>` (at most 11 + 128 bytes).
    pub fn file_name(&self) -> String {
        let tag = self.kind.tag();
        let mut name = String::with_capacity(tag.len() + 1 + self.ident.len());
        name.push_str(tag);
        name.push('-');
        name.push_str(&self.ident);
        name
    }

    /// The identity part of the name: the handle's bytes in lowercase hex, or a file's
    /// `<dev>.<ino>` in hex, or a rank record's pid.
    pub fn ident(&self) -> &str {
        &self.ident
    }

    /// The bytes a handle's identity is the lowercase hex of (at most 64) and how many there
    /// are; None for an identity that is text (a file's `<dev>.<ino>`, a rank record's pid
    /// with an odd number of digits). Allocation-free.
    pub fn bytes(&self) -> Option<([u8; 64], usize)> {
        let hex = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let b = self.ident.as_bytes();
        if !b.len().is_multiple_of(2) || b.len() > 128 {
            return None;
        }
        let mut out = [0u8; 64];
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            *o = (hex(pair[0])? << 4) | hex(pair[1])?;
        }
        Some((out, b.len() / 2))
    }

    /// This handle's key in the handle table ([`crate::handle_table`]): a handle whose
    /// identity is 64 bytes (legacy memory and event handles, fabric handles, a pool
    /// allocation's export data); None for a file's identity or a rank record.
    pub fn table_handle(&self) -> Option<Handle> {
        match self.bytes() {
            Some((bytes, 64)) if self.kind != Kind::Rank => Some(table_handle(self.kind, bytes)),
            _ => None,
        }
    }

    /// A short form for reports: the kind and the identity's first 16 hex digits.
    pub fn short(&self) -> String {
        let n = self.ident.len().min(16);
        format!("{}:{}", self.kind.tag(), &self.ident[..n])
    }

    /// The key a record file name stands for, if it is one.
    pub fn parse_file_name(name: &str) -> Option<Key> {
        let (tag, ident) = name.split_once('-')?;
        let kind = Kind::ALL.into_iter().find(|k| k.tag() == tag)?;
        let ok = !ident.is_empty()
            && ident.len() <= 128
            && ident
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase() || b == b'.');
        ok.then(|| Key {
            kind,
            ident: ident.to_string(),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Records

/// Where the exported memory lives (`CUmemLocationType`, cuda.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    Device,
    Host,
    HostNuma,
    HostNumaCurrent,
    /// The driver could not tell.
    Unknown,
}

impl Location {
    /// From a `CUmemLocationType` value.
    pub fn from_cu(type_: u32) -> Location {
        match type_ {
            policy::location::DEVICE => Location::Device,
            policy::location::HOST => Location::Host,
            policy::location::HOST_NUMA => Location::HostNuma,
            policy::location::HOST_NUMA_CURRENT => Location::HostNumaCurrent,
            _ => Location::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Location::Device => "device",
            Location::Host => "host",
            Location::HostNuma => "host_numa",
            Location::HostNumaCurrent => "host_numa_current",
            Location::Unknown => "unknown",
        }
    }

    fn parse(s: &str) -> Option<Location> {
        [
            Location::Device,
            Location::Host,
            Location::HostNuma,
            Location::HostNumaCurrent,
            Location::Unknown,
        ]
        .into_iter()
        .find(|l| l.as_str() == s)
    }

    /// Host memory (NCCL's SHM transport): R3 never applies.
    pub fn is_host(self) -> bool {
        matches!(
            self,
            Location::Host | Location::HostNuma | Location::HostNumaCurrent
        )
    }
}

/// A provenance record: who exported a handle (or, keyed by a rank root, which GPU a
/// rank owns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvenanceRecord {
    pub key: Key,
    /// The job token ([`job_token`]), None when the exporter knew no job.
    pub job: Option<String>,
    pub rank: Option<u32>,
    pub pid: u32,
    /// The exporter's start time (`/proc/<pid>/stat` field 22, clock ticks since boot).
    pub start: u64,
    /// The GPU the memory is on (`GPU-...`/`MIG-...`), None for host memory or unknown.
    pub gpu: Option<String>,
    pub location: Location,
    /// Seconds since the epoch when it was first written (for people reading the
    /// directory; writing the same record again keeps the file, [`Registry::write`]).
    pub time: u64,
    /// The writer's rank root ([`crate::rank_root`]) when no rank variables named its rank;
    /// an optional `root <pid>.<start>` line (records without it stay readable).
    pub root: Option<RootId>,
}

/// Why a record's text was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrupt(pub &'static str);

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The job id as stored and compared: printable ASCII kept, other bytes and `%`
/// percent-encoded, and an id longer than [`MAX_JOB`] cut to a prefix plus an FNV-1a hash of
/// the whole (so two long ids that differ only at the end stay different).
pub fn job_token(job: &str) -> String {
    let mut out = String::new();
    for b in job.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out.len() > MAX_JOB {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in job.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut cut = MAX_JOB - 17;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        let _ = write!(out, "~{h:016x}");
    }
    out
}

fn valid_token(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_JOB && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

fn valid_gpu(s: &str) -> bool {
    (s.starts_with("GPU-") || s.starts_with("MIG-"))
        && s.len() <= 96
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/')
}

impl ProvenanceRecord {
    /// Whether `other` says the same as this record, whenever it was written.
    pub fn same_but_time(&self, other: &ProvenanceRecord) -> bool {
        let ProvenanceRecord {
            key,
            job,
            rank,
            pid,
            start,
            gpu,
            location,
            time: _,
            root,
        } = self;
        (key, job, rank, pid, start, gpu, location, root)
            == (
                &other.key,
                &other.job,
                &other.rank,
                &other.pid,
                &other.start,
                &other.gpu,
                &other.location,
                &other.root,
            )
    }

    /// The record's file content.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(320);
        for part in [
            MAGIC,
            "\nkey ",
            self.key.kind.tag(),
            "-",
            &self.key.ident,
            "\njob ",
        ] {
            s.push_str(part);
        }
        s.push_str(self.job.as_deref().unwrap_or("-"));
        s.push('\n');
        match self.rank {
            Some(r) => {
                let _ = writeln!(s, "rank {r}");
            }
            None => s.push_str("rank -\n"),
        }
        let _ = writeln!(s, "pid {}", self.pid);
        let _ = writeln!(s, "start {}", self.start);
        for part in ["gpu ", self.gpu.as_deref().unwrap_or("-"), "\nlocation "] {
            s.push_str(part);
        }
        s.push_str(self.location.as_str());
        s.push('\n');
        let _ = writeln!(s, "time {}", self.time);
        if let Some(r) = self.root {
            let _ = writeln!(s, "root {r}");
        }
        s.push_str("end\n");
        s
    }

    /// The text [`render`](Self::render) gives the rank record of process `pid` (started at
    /// `start`, its own rank root, on `gpu`, in job `job`, a token of [`job_token`]), written
    /// to `w` with nothing allocated: for a writer that may not allocate (the `vfork` child
    /// that writes its parent's record before its `exec`, `root_walk`).
    pub fn write_rank(
        w: &mut impl fmt::Write,
        pid: u32,
        start: u64,
        job: Option<&str>,
        gpu: &str,
        time: u64,
    ) -> fmt::Result {
        // Pieces and digits, no `format_args!`: its table of pieces would be one more
        // relocation at every process start of the guard (test_startup_cost.py).
        let dec = |w: &mut dyn fmt::Write, mut v: u64| {
            let mut digits = [0u8; 20];
            let mut at = digits.len();
            loop {
                at -= 1;
                if let Some(d) = digits.get_mut(at) {
                    *d = b'0' + (v % 10) as u8;
                }
                v /= 10;
                if v == 0 || at == 0 {
                    break;
                }
            }
            w.write_str(std::str::from_utf8(digits.get(at..).unwrap_or_default()).unwrap_or("0"))
        };
        let pid = u64::from(pid);
        w.write_str(MAGIC)?;
        w.write_str("\nkey ")?;
        w.write_str(Kind::Rank.tag())?;
        w.write_str("-")?;
        dec(w, pid)?;
        w.write_str("\njob ")?;
        w.write_str(job.unwrap_or("-"))?;
        w.write_str("\nrank -\npid ")?;
        dec(w, pid)?;
        w.write_str("\nstart ")?;
        dec(w, start)?;
        w.write_str("\ngpu ")?;
        w.write_str(gpu)?;
        w.write_str("\nlocation ")?;
        w.write_str(Location::Device.as_str())?;
        w.write_str("\ntime ")?;
        dec(w, time)?;
        w.write_str("\nroot ")?;
        dec(w, pid)?;
        w.write_str(".")?;
        dec(w, start)?;
        w.write_str("\nend\n")
    }

    /// Parse a record's text; every field must be present once and well-formed, the key
    /// must be `expect` (a record renamed to another key is not trusted), and the text must
    /// end with the `end` line (a truncated record is rejected).
    pub fn parse(text: &str, expect: &Key) -> Result<ProvenanceRecord, Corrupt> {
        let mut lines = text.split('\n');
        if lines.next() != Some(MAGIC) {
            return Err(Corrupt("not a rankguard IPC record (bad first line)"));
        }
        let mut key = None;
        let mut job = None;
        let mut rank = None;
        let mut pid = None;
        let mut start = None;
        let mut gpu = None;
        let mut location = None;
        let mut time = None;
        let mut root = None;
        let mut ended = false;
        for line in lines.by_ref() {
            if line == "end" {
                ended = true;
                break;
            }
            let (name, value) = line
                .split_once(' ')
                .ok_or(Corrupt("a line without a value"))?;
            fn once<T>(slot: &mut Option<T>, v: T) -> Result<(), Corrupt> {
                if slot.replace(v).is_some() {
                    return Err(Corrupt("a field appears twice"));
                }
                Ok(())
            }
            match name {
                "key" => once(
                    &mut key,
                    Key::parse_file_name(value).ok_or(Corrupt("bad key"))?,
                )?,
                "job" => {
                    let v = match value {
                        "-" => None,
                        t if valid_token(t) => Some(t.to_string()),
                        _ => return Err(Corrupt("bad job")),
                    };
                    once(&mut job, v)?
                }
                "rank" => {
                    let v = match value {
                        "-" => None,
                        t => Some(
                            parse_dec(t)
                                .and_then(|r| u32::try_from(r).ok())
                                .ok_or(Corrupt("bad rank"))?,
                        ),
                    };
                    once(&mut rank, v)?
                }
                "pid" => {
                    let p = parse_dec(value)
                        .and_then(|p| u32::try_from(p).ok())
                        .filter(|p| (1..=PID_MAX).contains(p))
                        .ok_or(Corrupt("bad pid"))?;
                    once(&mut pid, p)?
                }
                "start" => once(
                    &mut start,
                    parse_dec(value).ok_or(Corrupt("bad start time"))?,
                )?,
                "gpu" => {
                    let v = match value {
                        "-" => None,
                        g if valid_gpu(g) => Some(g.to_string()),
                        _ => return Err(Corrupt("bad gpu")),
                    };
                    once(&mut gpu, v)?
                }
                "location" => once(
                    &mut location,
                    Location::parse(value).ok_or(Corrupt("bad location"))?,
                )?,
                "time" => once(&mut time, parse_dec(value).ok_or(Corrupt("bad time"))?)?,
                "root" => once(&mut root, RootId::parse(value).ok_or(Corrupt("bad root"))?)?,
                _ => return Err(Corrupt("unknown field")),
            }
        }
        if !ended {
            return Err(Corrupt("truncated (no end line)"));
        }
        if lines.any(|l| !l.is_empty()) {
            return Err(Corrupt("text after the end line"));
        }
        let key = key.ok_or(Corrupt("no key"))?;
        if &key != expect {
            return Err(Corrupt("the record names another key than its file name"));
        }
        Ok(ProvenanceRecord {
            key,
            job: job.ok_or(Corrupt("no job"))?,
            rank: rank.ok_or(Corrupt("no rank"))?,
            pid: pid.ok_or(Corrupt("no pid"))?,
            start: start.ok_or(Corrupt("no start time"))?,
            gpu: gpu.ok_or(Corrupt("no gpu"))?,
            location: location.ok_or(Corrupt("no location"))?,
            time: time.ok_or(Corrupt("no time"))?,
            root,
        })
    }
}

/// A plain decimal u64 (no sign, no spaces, at most 20 digits).
fn parse_dec(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

// ---------------------------------------------------------------------------------------
// Processes

/// A live process as the registry checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// `/proc/<pid>/stat` field 22.
    pub start: u64,
    /// Owner of `/proc/<pid>` (the process's effective uid).
    pub uid: u32,
}

/// How the registry learns about processes (injectable for tests).
pub trait Procs {
    /// None when no process `pid` exists.
    fn info(&self, pid: u32) -> Option<ProcInfo>;

    /// This process's pid and the monotonic time, for reusing a liveness verdict of the
    /// last [`RECENTLY_ALIVE_US`] ([`RecentlyAlive`]); None (the default): every look-up
    /// asks [`info`](Self::info).
    fn now(&self) -> Option<Now> {
        None
    }
}

/// Who asks and when ([`Procs::now`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// The asking process's pid (a fork child never reuses its parent's verdicts).
    pub me: u32,
    /// Microseconds on a monotonic clock (`CLOCK_MONOTONIC`).
    pub us: u64,
}

/// The real `/proc`.
pub struct ProcFs;

impl Procs for ProcFs {
    fn info(&self, pid: u32) -> Option<ProcInfo> {
        let dir = format!("/proc/{pid}");
        let uid = fs::metadata(&dir).ok()?.uid();
        let stat = read_proc_file(Path::new(&format!("{dir}/stat")))?;
        Some(ProcInfo {
            start: stat_start_time(&stat)?,
            uid,
        })
    }
}

/// A small `/proc` file's one line of text. `fs::read_to_string` asks for the size first
/// and, since procfs says 0, grows its buffer from 32 bytes: six reads and an fstat for one
/// stat line (an IPC import checks its exporter's this way, an export reads its own).
/// procfs hands a line to a read with room for it whole, ending in its newline: one read,
/// and no second one to see the end (reading goes on only while the text does not end in a
/// newline, up to 64 KiB).
fn read_proc_file(path: &Path) -> Option<String> {
    let mut f = File::open(path).ok()?;
    let mut buf = vec![0u8; 1024];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if len >= 1 << 16 {
                return None;
            }
            buf.resize(len * 2, 0);
        }
        // `get`: an index keeps a panic location, a relocation (stat_start_time).
        let rest = buf.get_mut(len..)?; // never None: len <= buf.len()
        match f.read(rest) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len.checked_sub(1).and_then(|last| buf.get(last)) == Some(&b'\n') {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

/// Field 22 (starttime) of a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may contain spaces and parentheses itself, so fields are counted after
/// the last `)`.
pub fn stat_start_time(stat: &str) -> Option<u64> {
    // `get`: an index keeps a panic location, a relocation (crate::strtab).
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    // After ")" come field 3 (state) onwards: starttime is the 20th of those.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// This process's start time, to write into its records.
pub fn own_start_time() -> Option<u64> {
    stat_start_time(&read_proc_file(Path::new("/proc/self/stat"))?)
}

// ---------------------------------------------------------------------------------------
// Caches of the export and import paths
//
// PyTorch's caching allocator exports the same segment's handle at every share of a tensor
// in it, and an importer checks the exporter of every handle it opens, so a share's cost is
// the registry's system calls. Two small caches cut the repeated ones without skipping a
// check. Both are fixed arrays of atomics in statics: no allocation, no lock. A slot is
// guarded by a sequence word (odd while a writer fills it): a reader that sees it odd or
// changed misses, a writer that finds it odd (another thread, or a signal handler's
// interrupted caller, is filling it) does not wait and keeps nothing. A fork child inherits
// the slots but never uses what another pid kept: each entry names the process it is about
// (the record's writer, [`Known`]) or the process that asked ([`RecentlyAlive`]), and a slot
// a parent left half-written (odd) is only a miss. (docs/design.md §2, "Lifecycle": keyed by
// pid, like `PidValue`.)

/// Slots of each cache (direct-mapped: a new entry replaces the slot's old one).
pub const CACHE_SLOTS: usize = 16;
/// How long a liveness verdict is reused ([`RecentlyAlive`]), in microseconds.
pub const RECENTLY_ALIVE_US: u64 = 5_000;

/// The words of one slot, behind a sequence word.
struct Slot<const N: usize> {
    seq: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> Slot<N> {
    const fn new() -> Self {
        Slot {
            seq: AtomicU64::new(0),
            words: [const { AtomicU64::new(0) }; N],
        }
    }

    /// A consistent copy of the words, or None (being written, or changed meanwhile).
    fn load(&self) -> Option<[u64; N]> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 || s1 == 0 {
            return None;
        }
        let mut out = [0u64; N];
        for (o, w) in out.iter_mut().zip(&self.words) {
            *o = w.load(Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some(out)
    }

    /// Replace the words, unless another writer is at it (then nothing is kept).
    fn store(&self, words: [u64; N]) {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 == 1
            || self
                .seq
                .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        std::sync::atomic::fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(s + 2, Ordering::Release);
    }

    /// Empty the slot: all zero words, which no look-up matches (pids are never 0).
    fn clear(&self) {
        self.store([0; N]);
    }
}

/// A 128-bit FNV-1a digest of `parts` (each followed by a 0 byte): a record's path and
/// text stand in a [`Known`] slot by it. Two different records of one process having one
/// digest is a 2^-128 chance, not something an exporter's own handles can arrange.
fn digest(parts: &[&[u8]]) -> u128 {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for p in parts {
        for &b in p.iter().chain(&[0u8]) {
            h ^= u128::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// What a record file was when it was read: its identity and the times only a change of
/// the file moves (`st_ctime` the kernel sets at any write, rename, link or chmod of it,
/// and no user can set back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Stamp {
    fn of(md: &fs::Metadata) -> Stamp {
        Stamp {
            dev: md.dev(),
            ino: md.ino(),
            size: md.len(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }

    fn ident(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// The records this process found in place, as it would write them ([`Registry::write`]):
/// a re-export of the same handle whose record is still that file, unchanged, costs one
/// `lstat` of it instead of an open, a read and a parse. The `lstat` checks what the read
/// would (a regular file, not a link, the user's, not group/other-writable, at most
/// [`MAX_RECORD_BYTES`]) and that it is the same file, unchanged since it was read: same
/// `(st_dev, st_ino)`, size, mtime and ctime. A removed record (no file), a replaced one
/// (another inode) or one changed in place (another ctime) is read again, and rewritten
/// where it differs. Entries are about the record's writer (its pid is in the record and in
/// the entry): a fork child writes records with its own pid and never matches its parent's.
///
/// File times move in ticks of the kernel's coarse clock, so a change in place that keeps
/// the size within one tick of the read is not seen. Only this user can write the file, and
/// such a writer could change it just after a rewrite as well: the re-export's rewrite never
/// defended against it. What an importer trusts is decided by its own read of the file, with
/// every check ([`Registry::lookup`]), cache or none.
pub struct Known {
    /// `[pid, digest lo, digest hi, dev, ino, size, mtime s, mtime ns, ctime s, ctime ns]`.
    slots: [Slot<10>; CACHE_SLOTS],
}

impl Known {
    pub const fn new() -> Self {
        Known {
            slots: [const { Slot::new() }; CACHE_SLOTS],
        }
    }

    fn slot(&self, digest: u128) -> &Slot<10> {
        &self.slots[(digest as usize) % CACHE_SLOTS]
    }

    fn words(pid: u32, digest: u128, st: &Stamp) -> [u64; 10] {
        [
            u64::from(pid),
            digest as u64,
            (digest >> 64) as u64,
            st.dev,
            st.ino,
            st.size,
            st.mtime.0 as u64,
            st.mtime.1 as u64,
            st.ctime.0 as u64,
            st.ctime.1 as u64,
        ]
    }

    /// Remember that process `pid`'s record of `digest` is the file `st` describes.
    pub fn keep(&self, pid: u32, digest: u128, st: &Stamp) {
        self.slot(digest).store(Known::words(pid, digest, st));
    }

    /// The stamp kept for `pid`'s record of `digest`, if any.
    fn kept(&self, pid: u32, digest: u128) -> Option<[u64; 10]> {
        let w = self.slot(digest).load()?;
        (w[0] == u64::from(pid) && w[1] == digest as u64 && w[2] == (digest >> 64) as u64)
            .then_some(w)
    }

    /// Whether `path` is still the unchanged, trusted file kept for `pid`'s `digest`
    /// (one `lstat` when an entry is kept, none otherwise).
    fn holds(&self, pid: u32, digest: u128, path: &Path, uid: u32) -> bool {
        let Some(w) = self.kept(pid, digest) else {
            return false;
        };
        let Ok(md) = fs::symlink_metadata(path) else {
            return false;
        };
        let trusted = md.file_type().is_file()
            && md.uid() == uid
            && md.permissions().mode() & 0o022 == 0
            && md.len() <= MAX_RECORD_BYTES;
        trusted && Known::words(pid, digest, &Stamp::of(&md)) == w
    }
}

impl Default for Known {
    fn default() -> Self {
        Known::new()
    }
}

/// Liveness verdicts of the last [`RECENTLY_ALIVE_US`]: a burst of imports from one exporter
/// (PyTorch opens a tensor's event and memory handles together) reads its `/proc` stat once.
/// Only a positive verdict is kept, for exactly the `(pid, start time, owner)` that was seen
/// alive, by the process that saw it; a verdict that finds the pid dead or another process
/// empties its slot.
///
/// Why pid reuse cannot be exploited: a verdict is reused only for a record naming the same
/// pid *and start time*, and a process that takes over a reused pid has another start time
/// (it started after the exporter it replaces was seen alive), so its records never match
/// the entry. What the window allows is trusting, for at most 5 ms after the exporter was
/// last seen alive, a record the exporter itself wrote while alive: its content is what the
/// import would have been decided by a moment earlier, and a dead exporter's handles no
/// longer open (its memory went with it). Wrapping the pid space (up to 2^22 pids) within the
/// window to put another process at that pid buys nothing, as its start time differs; and a
/// record naming a live process's `(pid, start)` is trusted without the cache too.
pub struct RecentlyAlive {
    /// `[asking pid, pid, start, uid, seen at (us)]`.
    slots: [Slot<5>; CACHE_SLOTS],
}

impl RecentlyAlive {
    pub const fn new() -> Self {
        RecentlyAlive {
            slots: [const { Slot::new() }; CACHE_SLOTS],
        }
    }

    fn slot(&self, pid: u32) -> &Slot<5> {
        &self.slots[pid as usize % CACHE_SLOTS]
    }

    /// Whether `now.me` saw `(pid, start, uid)` alive within the last [`RECENTLY_ALIVE_US`].
    pub fn holds(&self, now: Now, pid: u32, start: u64, uid: u32) -> bool {
        self.slot(pid).load().is_some_and(|w| {
            w[..4] == [u64::from(now.me), u64::from(pid), start, u64::from(uid)]
                && now.us >= w[4]
                && now.us - w[4] < RECENTLY_ALIVE_US
        })
    }

    /// `now.me` saw `(pid, start, uid)` alive at `now.us`.
    pub fn keep(&self, now: Now, pid: u32, start: u64, uid: u32) {
        self.slot(pid).store([
            u64::from(now.me),
            u64::from(pid),
            start,
            u64::from(uid),
            now.us,
        ]);
    }

    /// `pid` was seen dead, or not the process a record names: no verdict about it stays.
    pub fn forget(&self, pid: u32) {
        let s = self.slot(pid);
        if s.load().is_some_and(|w| w[1] == u64::from(pid)) {
            s.clear();
        }
    }
}

impl Default for RecentlyAlive {
    fn default() -> Self {
        RecentlyAlive::new()
    }
}

/// The directory verdict of the last [`RECENTLY_ALIVE_US`] ([`Registry::open_recent`]): a
/// share of a PyTorch tensor opens the registry four times, two exports and two imports in
/// two processes, and each verified the directory with an `lstat` of its own.
///
/// What reusing it allows: the checks (a directory, not a symbolic link, this user's, mode
/// 0700) are of a path, and each operation after them reaches the records by that path
/// again, so a directory swapped after the check was never excluded by it; the reuse widens
/// that window from the microseconds between an `lstat` and the `open` after it to 5 ms.
/// Swapping it takes write permission on its parent: no other user has that on the
/// default's parent (`/dev/shm` and `/tmp` are sticky). And what a swapped directory could
/// do is the same either way: records found there are still checked one by one (this
/// user's, not writable by others, not a link), so nothing another user wrote is trusted;
/// at worst an import finds no record (unknown provenance) and an export's record is
/// written where the importer does not look. A fork child (another pid) verifies again.
pub struct RecentDir {
    /// `[asking pid, uid, digest of the path (2 words), seen at (us)]`.
    slot: Slot<5>,
}

impl RecentDir {
    pub const fn new() -> Self {
        RecentDir { slot: Slot::new() }
    }

    fn words(now: Now, uid: u32, path: u128) -> [u64; 4] {
        [
            u64::from(now.me),
            u64::from(uid),
            path as u64,
            (path >> 64) as u64,
        ]
    }

    /// Whether `now.me` verified the directory `path` (a digest) for `uid` within the last
    /// [`RECENTLY_ALIVE_US`].
    fn holds(&self, now: Now, uid: u32, path: u128) -> bool {
        self.slot.load().is_some_and(|w| {
            w[..4] == RecentDir::words(now, uid, path)
                && now.us >= w[4]
                && now.us - w[4] < RECENTLY_ALIVE_US
        })
    }

    fn keep(&self, now: Now, uid: u32, path: u128) {
        let [a, b, c, d] = RecentDir::words(now, uid, path);
        self.slot.store([a, b, c, d, now.us]);
    }
}

impl Default for RecentDir {
    fn default() -> Self {
        RecentDir::new()
    }
}

/// This process's caches (the guard's one registry user).
static KNOWN: Known = Known::new();
static RECENTLY_ALIVE: RecentlyAlive = RecentlyAlive::new();
static RECENT_DIR: RecentDir = RecentDir::new();

/// A record read from the handle table ([`crate::handle_table`]) by a process of `uid`,
/// trusted as [`Registry::lookup`] trusts a file's: its text parses as the record of `key`,
/// and its exporter, the slot's `owner`, is the live process it names. No directory is
/// looked at: the table's slots are reached through a mapping of the file that was
/// checked when it was opened (this user's, not writable by others, in the verified
/// directory), never through its path again.
pub fn trust_table_text(text: &[u8], key: &Key, owner: u32, uid: u32, procs: &dyn Procs) -> Lookup {
    let rec = match std::str::from_utf8(text)
        .map_err(|_| Corrupt("not UTF-8"))
        .and_then(|t| ProvenanceRecord::parse(t, key))
    {
        Ok(rec) => rec,
        Err(c) => return Lookup::Skipped(Skip::Corrupt(c)),
    };
    if rec.pid != owner {
        return Lookup::Skipped(Skip::Forged { pid: rec.pid });
    }
    match alive_with(&rec, uid, &RECENTLY_ALIVE, procs) {
        Ok(()) => Lookup::Found(rec),
        Err(skip) => Lookup::Skipped(skip),
    }
}

/// Whether the record's exporter is the live process it names: the same pid, start time
/// and owner `uid` this process saw alive in the last [`RECENTLY_ALIVE_US`], or now.
fn alive_with(
    rec: &ProvenanceRecord,
    uid: u32,
    recently_alive: &RecentlyAlive,
    procs: &dyn Procs,
) -> Result<(), Skip> {
    let now = procs.now();
    if now.is_some_and(|n| recently_alive.holds(n, rec.pid, rec.start, uid)) {
        return Ok(());
    }
    let verdict = match procs.info(rec.pid) {
        None => Err(Skip::Dead { pid: rec.pid }),
        Some(p) if p.start != rec.start || p.uid != uid => Err(Skip::Forged { pid: rec.pid }),
        Some(_) => Ok(()),
    };
    match (now, &verdict) {
        (Some(n), Ok(())) => recently_alive.keep(n, rec.pid, rec.start, uid),
        (_, Err(_)) => recently_alive.forget(rec.pid),
        (None, Ok(())) => {}
    }
    verdict
}

// ---------------------------------------------------------------------------------------
// The directory

/// Why the registry directory is not used.
#[derive(Debug)]
pub enum DirProblem {
    /// `RANKGUARD_REGISTRY` is not an absolute path.
    NotAbsolute,
    /// It is a symbolic link (even to a good directory: the link could be re-pointed).
    Symlink,
    NotDirectory,
    /// Owned by another user.
    Owner {
        uid: u32,
    },
    /// Group or others have permissions on it.
    Mode {
        mode: u32,
    },
    /// It could not be examined or created.
    Io(io::Error),
}

impl fmt::Display for DirProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirProblem::NotAbsolute => f.write_str("is not an absolute path"),
            DirProblem::Symlink => f.write_str("is a symbolic link"),
            DirProblem::NotDirectory => f.write_str("is not a directory"),
            DirProblem::Owner { uid } => write!(f, "is owned by uid {uid}, not by this user"),
            DirProblem::Mode { mode } => {
                write!(
                    f,
                    "has mode {:04o}; group and others must have no access (0700)",
                    mode & 0o7777
                )
            }
            DirProblem::Io(e) => write!(f, "cannot be used: {e}"),
        }
    }
}

/// Why a write did not happen.
#[derive(Debug)]
pub enum WriteProblem {
    Dir(DirProblem),
    /// [`MAX_RECORDS`] entries already, and a bounded sweep of them freed none.
    Full(Swept),
    /// The record would exceed [`MAX_RECORD_BYTES`].
    TooLarge,
    /// Creating, writing or renaming failed (full disk, read-only directory, ...).
    Io(io::Error),
}

impl fmt::Display for WriteProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteProblem::Dir(d) => d.fmt(f),
            WriteProblem::Full(s) if s.complete => write!(
                f,
                "is full ({} entries, all records of live exporters or files that are not records)",
                s.kept
            ),
            WriteProblem::Full(s) => write!(
                f,
                "is full (at least {} entries; the {} a bounded sweep examined are all records of live exporters or files that are not records)",
                s.max, s.kept
            ),
            WriteProblem::TooLarge => write!(f, "record would exceed {MAX_RECORD_BYTES} bytes"),
            WriteProblem::Io(e) => write!(f, "cannot be written: {e}"),
        }
    }
}

/// Why a record file was not trusted.
#[derive(Debug)]
pub enum Skip {
    /// A symbolic link where a record should be.
    Symlink,
    /// Not a regular file.
    NotRegular,
    /// Owned by another user, or writable by group/others.
    Permissions,
    TooLarge,
    Corrupt(Corrupt),
    /// Its exporter has exited (normal: the record is stale).
    Dead {
        pid: u32,
    },
    /// Its pid is alive but is not the exporter: a different start time or owner
    /// (pid reused, or a forged record).
    Forged {
        pid: u32,
    },
    Io(io::Error),
}

impl Skip {
    /// Whether this is worth telling the user (a dead exporter is routine).
    pub fn is_suspicious(&self) -> bool {
        !matches!(self, Skip::Dead { .. })
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::Symlink => f.write_str("is a symbolic link"),
            Skip::NotRegular => f.write_str("is not a regular file"),
            Skip::Permissions => f.write_str("is owned by another user or writable by others"),
            Skip::TooLarge => write!(f, "is larger than {MAX_RECORD_BYTES} bytes"),
            Skip::Corrupt(c) => write!(f, "is corrupt: {c}"),
            Skip::Dead { pid } => write!(f, "names exporter pid {pid}, which has exited"),
            Skip::Forged { pid } => write!(
                f,
                "names exporter pid {pid}, but that process is not the exporter (different start time or owner): forged or stale"
            ),
            Skip::Io(e) => write!(f, "cannot be read: {e}"),
        }
    }
}

/// The outcome of a lookup.
#[derive(Debug)]
pub enum Lookup {
    Found(ProvenanceRecord),
    /// No record for this key.
    Missing,
    /// A record was there but is not trusted (and was removed when possible).
    Skipped(Skip),
}

/// What a sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub kept: usize,
    pub removed: usize,
    /// The sweep reached the end of the directory (not stopped by its budget).
    pub complete: bool,
    /// The registry's bound, where a full write reports it (else 0).
    pub max: usize,
}

/// The registry has lost records ([`Registry::overflow`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overflow {
    /// A live exporter whose records were lost (None: only a sticky mark).
    pub pid: Option<u32>,
    /// More exporters than the mark lists ([`OVERFLOW_MAX`]), or a mark that cannot be
    /// read: it stays until it is removed by hand.
    pub sticky: bool,
    /// The mark's path, for the line that says how to clear it.
    pub path: PathBuf,
}

/// A verified registry directory.
pub struct Registry {
    dir: PathBuf,
    uid: u32,
    /// [`MAX_RECORDS`] (smaller in unit tests).
    max: usize,
    /// [`COUNT_EVERY`] (1 in unit tests: every new record counts).
    every: u64,
    /// The process's caches (their own in unit tests).
    known: &'static Known,
    recently_alive: &'static RecentlyAlive,
    /// The entries the start-up sweep of this registry left, when it read the whole
    /// directory, for its first write (taken by it); [`NOT_COUNTED`] otherwise.
    swept_count: AtomicUsize,
    /// The pids of the rank records (`rank-<pid>`) the start-up sweep of this registry left,
    /// when it read the whole directory: the rank root's walk looks up no other pid's
    /// ([`Registry::no_rank_record`]).
    swept_ranks: std::sync::OnceLock<Vec<u32>>,
}

/// The pid of a rank record's file name (`rank-<pid>`).
fn rank_pid(name: &str) -> Option<u32> {
    name.strip_prefix("rank-")
        .and_then(parse_dec)
        .and_then(|p| u32::try_from(p).ok())
}

/// [`Registry::swept_count`]: no count to use.
const NOT_COUNTED: usize = usize::MAX;

/// Where the registry lives when `RANKGUARD_REGISTRY` is unset: `/dev/shm` is a tmpfs every
/// process of the node shares (NCCL's SHM transport lives there too); `/tmp` otherwise.
pub fn default_dir(uid: u32) -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from(format!("/dev/shm/rankguard-{uid}"))
    } else {
        PathBuf::from(format!("/tmp/rankguard-{uid}"))
    }
}

/// Where the registry lives when the default directory is taken by someone else (another
/// user created it first, or left it with the wrong mode): a directory under the user's own
/// home, which no other user can create, one per host (a home on a network file system is
/// shared between hosts; records are only meaningful on their own host). Every process of
/// the user on the host derives the same path, so the registry keeps working.
pub fn fallback_dir(home: &Path, host: &str) -> PathBuf {
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    home.join(".cache")
        .join("rankguard")
        .join(format!("registry-{host}"))
}

/// The status of the directory `dir` itself, from `lstat` (one system call, made at each
/// verification: a process reuses its verdict for 5 ms, [`RecentDir`]): the final component is examined, never followed (a symbolic link
/// is refused; anything else that is not a directory is "not a directory"). Opening it
/// `O_DIRECTORY|O_NOFOLLOW` and `fstat`ing the descriptor says the same of the same
/// component in three calls; the records are then reached by path either way.
fn dir_status(dir: &Path) -> Result<fs::Metadata, DirProblem> {
    let md = fs::symlink_metadata(dir).map_err(DirProblem::Io)?;
    if md.file_type().is_symlink() {
        return Err(DirProblem::Symlink);
    }
    if !md.is_dir() {
        return Err(DirProblem::NotDirectory);
    }
    Ok(md)
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);
/// New records this process wrote (see [`COUNT_EVERY`]).
static NEW_WRITES: AtomicU64 = AtomicU64::new(0);
/// This process's last count found the registry full.
static LAST_FULL: AtomicBool = AtomicBool::new(false);

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Registry {
    /// Verify `dir` (creating it with mode 0700 when `create` and it does not exist) for
    /// the user `uid`.
    pub fn open(dir: &Path, uid: u32, create: bool) -> Result<Registry, DirProblem> {
        if !dir.is_absolute() {
            return Err(DirProblem::NotAbsolute);
        }
        let md = match dir_status(dir) {
            Err(DirProblem::Io(e)) if e.kind() == io::ErrorKind::NotFound && create => {
                match fs::DirBuilder::new().mode(0o700).create(dir) {
                    Ok(()) => {}
                    // Another process created it first: verify theirs.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(DirProblem::Io(e)),
                }
                dir_status(dir)?
            }
            r => r?,
        };
        if md.uid() != uid {
            return Err(DirProblem::Owner { uid: md.uid() });
        }
        if md.mode() & 0o077 != 0 {
            return Err(DirProblem::Mode { mode: md.mode() });
        }
        Ok(Registry::verified(dir, uid))
    }

    /// [`open`](Self::open), reusing the verdict `now.me` reached about `dir` for `uid` in
    /// the last [`RECENTLY_ALIVE_US`] ([`RecentDir`], which says why that is safe): no system
    /// call then. A verdict is kept only when the directory passed.
    pub fn open_recent(
        dir: &Path,
        uid: u32,
        create: bool,
        now: Now,
    ) -> Result<Registry, DirProblem> {
        Registry::open_with(dir, uid, create, now, &RECENT_DIR)
    }

    fn open_with(
        dir: &Path,
        uid: u32,
        create: bool,
        now: Now,
        recent: &RecentDir,
    ) -> Result<Registry, DirProblem> {
        let path = digest(&[dir.as_os_str().as_encoded_bytes()]);
        if dir.is_absolute() && recent.holds(now, uid, path) {
            return Ok(Registry::verified(dir, uid));
        }
        let reg = Registry::open(dir, uid, create)?;
        recent.keep(now, uid, path);
        Ok(reg)
    }

    /// The registry in `dir`, verified for `uid`.
    fn verified(dir: &Path, uid: u32) -> Registry {
        Registry {
            dir: dir.to_path_buf(),
            uid,
            max: MAX_RECORDS,
            every: COUNT_EVERY,
            known: &KNOWN,
            recently_alive: &RECENTLY_ALIVE,
            swept_count: AtomicUsize::new(NOT_COUNTED),
            swept_ranks: std::sync::OnceLock::new(),
        }
    }

    /// Whether `pid` certainly has no rank record here: this registry's start-up sweep read
    /// the whole directory moments ago and left none of its. A record written since is as
    /// much missed as by a look-up made just before it; a look-up decides everything else.
    pub fn no_rank_record(&self, pid: u32) -> bool {
        self.swept_ranks
            .get()
            .is_some_and(|pids| !pids.contains(&pid))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Write (or replace) the record of `rec.key`. A full registry is swept first. The
    /// record's pid is its writer's, this process's (it names the temporary file).
    pub fn write(&self, rec: &ProvenanceRecord, procs: &dyn Procs) -> Result<(), WriteProblem> {
        self.write_probed(rec, procs, true)
    }

    /// [`write`](Self::write) for a record this process knows it has not written before
    /// (an event it exports for the first time: PyTorch exports a new one at every share),
    /// with no probe of its name: a file already there (only a dead exporter's, of the same
    /// handle bytes) is replaced, as `write` would replace a record that differs. Counted
    /// as a new record.
    pub fn write_fresh(
        &self,
        rec: &ProvenanceRecord,
        procs: &dyn Procs,
    ) -> Result<(), WriteProblem> {
        self.write_probed(rec, procs, false)
    }

    fn write_probed(
        &self,
        rec: &ProvenanceRecord,
        procs: &dyn Procs,
        probe: bool,
    ) -> Result<(), WriteProblem> {
        let text = rec.render();
        if text.len() as u64 > MAX_RECORD_BYTES {
            return Err(WriteProblem::TooLarge);
        }
        let name = rec.key.file_name();
        let target = self.dir.join(&name);
        // The first write after this registry's complete start-up sweep (the process's first
        // record: a rank record at the first `cuInit`, or a first export) has that sweep's
        // count. Below the bound a new record and a replaced one are written alike, and a
        // process's first record cannot repeat one it wrote: no probe of its name, no count.
        if self.swept_count.swap(NOT_COUNTED, Ordering::Relaxed) < self.max {
            if self.must_count() {
                LAST_FULL.store(false, Ordering::Relaxed);
            }
            return self
                .replace(&target, &text, rec.pid)
                .map_err(WriteProblem::Io);
        }
        // The same record again (PyTorch exports a segment's handle, the same bytes, at every
        // share of a tensor in it) stays as it is: only its time would change, and that says
        // when it was first written. Reading it costs no create and no rename (a rename over
        // a file starts its writeback on ext4); once read, a `lstat` says it is still that
        // file ([`Known`]).
        let existing = probe && {
            let timeless = ProvenanceRecord {
                time: 0,
                ..rec.clone()
            }
            .render();
            let digest = digest(&[target.as_os_str().as_encoded_bytes(), timeless.as_bytes()]);
            if self.known.holds(rec.pid, digest, &target, self.uid) {
                return Ok(());
            }
            match self.read(&target, &rec.key) {
                Ok(Some((old, stamp))) if old.same_but_time(rec) => {
                    self.known.keep(rec.pid, digest, &stamp);
                    return Ok(());
                }
                Ok(None) => false,
                _ => true,
            }
        };
        // Replacing an existing record does not grow the directory.
        // A sweep that freed an entry made room for this one (a concurrent writer may take
        // it too: the bound is approximate by the number of writers at once). Counting again
        // instead would call a registry of more dead records than one sweep examines full.
        if !existing && self.must_count() {
            let full = self.count()? >= self.max;
            LAST_FULL.store(full, Ordering::Relaxed);
            if full {
                let swept = self.sweep(procs, SWEEP_BUDGET);
                if swept.removed == 0 {
                    return Err(WriteProblem::Full(Swept {
                        max: self.max,
                        ..swept
                    }));
                }
            }
        }
        self.replace(&target, &text, rec.pid)
            .map_err(WriteProblem::Io)
    }

    /// Whether this new record's write counts the directory ([`COUNT_EVERY`]).
    fn must_count(&self) -> bool {
        self.every == 1
            || NEW_WRITES
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(COUNT_EVERY)
            || LAST_FULL.load(Ordering::Relaxed)
    }

    fn count(&self) -> Result<usize, WriteProblem> {
        let rd = fs::read_dir(&self.dir).map_err(WriteProblem::Io)?;
        Ok(rd.take(self.max + 1).count())
    }

    /// Remove the record of `key` (its handle can no longer be opened: a destroyed event).
    /// No record is no error.
    pub fn remove(&self, key: &Key) -> io::Result<()> {
        match fs::remove_file(self.dir.join(key.file_name())) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Look up the record of `key`. An untrusted record is removed (its exporter is dead,
    /// or it cannot be trusted in a directory only this user writes).
    pub fn lookup(&self, key: &Key, procs: &dyn Procs) -> Lookup {
        let path = self.dir.join(key.file_name());
        let (rec, ident) = match self.read(&path, key) {
            Ok(Some((rec, stamp))) => (rec, stamp.ident()),
            Ok(None) => return Lookup::Missing,
            Err((skip, ident)) => {
                if let Some(ident) = ident {
                    self.remove_if(&path, ident);
                }
                return Lookup::Skipped(skip);
            }
        };
        match self.alive(&rec, procs) {
            Ok(()) => Lookup::Found(rec),
            Err(skip) => {
                self.remove_if(&path, ident);
                Lookup::Skipped(skip)
            }
        }
    }

    /// Whether the record's exporter is the live process it names (see [`alive_with`]).
    fn alive(&self, rec: &ProvenanceRecord, procs: &dyn Procs) -> Result<(), Skip> {
        alive_with(rec, self.uid, self.recently_alive, procs)
    }

    /// Read and parse one record file. `Ok(None)`: no such file. On a bad file, the
    /// `(st_dev, st_ino)` of what was examined, so only that file is removed.
    #[allow(clippy::type_complexity)]
    fn read(
        &self,
        path: &Path,
        key: &Key,
    ) -> Result<Option<(ProvenanceRecord, Stamp)>, (Skip, Option<(u64, u64)>)> {
        // O_NOFOLLOW: a symbolic link fails with ELOOP (then looked at, so that this link
        // is what is removed); O_NONBLOCK: a FIFO cannot block the open. No `lstat` first:
        // the descriptor's `fstat` below says what was opened.
        let mut f = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                let lident = fs::symlink_metadata(path)
                    .ok()
                    .filter(|m| m.file_type().is_symlink())
                    .map(|m| (m.dev(), m.ino()));
                return Err((Skip::Symlink, lident));
            }
            Err(e) => return Err((Skip::Io(e), None)),
        };
        let md = match f.metadata() {
            Ok(m) => m,
            Err(e) => return Err((Skip::Io(e), None)),
        };
        let ident = Some((md.dev(), md.ino()));
        if !md.file_type().is_file() {
            return Err((Skip::NotRegular, ident));
        }
        if md.uid() != self.uid || md.permissions().mode() & 0o022 != 0 {
            return Err((Skip::Permissions, ident));
        }
        if md.len() > MAX_RECORD_BYTES {
            return Err((Skip::TooLarge, ident));
        }
        // A record is written whole into a file of its own and renamed into place, never
        // changed after: the size `fstat` gave is what one read gets (no read to see the
        // end). A file that is shorter than it said is damaged. One that grew after the
        // `fstat` (only its owner, this user, can write it) is parsed by its first `st_size`
        // bytes, which must still be a whole record ending in its `end` line.
        let mut buf = vec![0u8; md.len() as usize];
        match f.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err((Skip::Corrupt(Corrupt("shorter than its size")), ident))
            }
            Err(e) => return Err((Skip::Io(e), None)),
        }
        let text =
            std::str::from_utf8(&buf).map_err(|_| (Skip::Corrupt(Corrupt("not UTF-8")), ident))?;
        let rec = ProvenanceRecord::parse(text, key).map_err(|c| (Skip::Corrupt(c), ident))?;
        Ok(Some((rec, Stamp::of(&md))))
    }

    /// Remove `path` if it is still the file examined (a writer may have renamed a fresh
    /// record over it meanwhile: that one stays).
    fn remove_if(&self, path: &Path, ident: (u64, u64)) {
        if let Ok(md) = fs::symlink_metadata(path) {
            if (md.dev(), md.ino()) == ident {
                let _ = fs::remove_file(path);
            }
        }
    }

    /// Mark the registry as having lost a record of the live process `pid` (started at
    /// `start`): its entry is added to the [`OVERFLOW_MARK`] (exited ones are dropped), by
    /// an atomic rename like a record. A concurrent marker may replace the file with its own
    /// list; the entry is checked after the rename and added again (a few tries), and every
    /// later lost record of the process checks it again.
    pub fn mark_overflow(&self, pid: u32, start: u64, procs: &dyn Procs) -> io::Result<()> {
        let path = self.dir.join(OVERFLOW_MARK);
        for _ in 0..4 {
            let (mut listed, mut sticky) = match self.read_mark(&path) {
                Ok(Some(m)) => m,
                Ok(None) => (Vec::new(), false),
                // Unreadable or corrupt: start it again, sticky (it named someone).
                Err(_) => (Vec::new(), true),
            };
            if listed.contains(&(pid, start)) {
                return Ok(());
            }
            listed.retain(|&(p, s)| procs.info(p).is_some_and(|i| i.start == s));
            if listed.len() >= OVERFLOW_MAX {
                listed.truncate(OVERFLOW_MAX - 1);
                sticky = true;
            }
            listed.push((pid, start));
            let mut text = format!("{OVERFLOW_MAGIC}\n");
            for (p, s) in &listed {
                let _ = writeln!(text, "exporter {p} {s}");
            }
            if sticky {
                text.push_str("more\n");
            }
            text.push_str("end\n");
            self.replace(&path, &text, pid)?;
        }
        Ok(())
    }

    /// Whether the registry has lost records of a live exporter ([`OVERFLOW_MARK`]). A
    /// mark whose exporters have all exited is removed (their handles died with them). A
    /// mark that cannot be read or parsed counts as set, and as sticky: removed by hand.
    pub fn overflow(&self, procs: &dyn Procs) -> Option<Overflow> {
        let path = self.dir.join(OVERFLOW_MARK);
        let ident = fs::symlink_metadata(&path)
            .ok()
            .map(|m| (m.dev(), m.ino()))?;
        let Ok(m) = self.read_mark(&path) else {
            return Some(Overflow {
                pid: None,
                sticky: true,
                path,
            });
        };
        let (listed, sticky) = m?;
        let live = listed
            .iter()
            .find(|&&(p, s)| {
                procs
                    .info(p)
                    .is_some_and(|i| i.start == s && i.uid == self.uid)
            })
            .map(|&(p, _)| p);
        if live.is_none() && !sticky {
            self.remove_if(&path, ident);
            return None;
        }
        Some(Overflow {
            pid: live,
            sticky,
            path,
        })
    }

    /// The mark's `(pid, start)` entries and its `more` flag; `Ok(None)`: no mark.
    #[allow(clippy::type_complexity)]
    fn read_mark(&self, path: &Path) -> Result<Option<(Vec<(u32, u64)>, bool)>, Skip> {
        let mut f = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Skip::Io(e)),
        };
        let md = f.metadata().map_err(Skip::Io)?;
        if !md.file_type().is_file() {
            return Err(Skip::NotRegular);
        }
        if md.uid() != self.uid || md.permissions().mode() & 0o022 != 0 {
            return Err(Skip::Permissions);
        }
        let max = 64 * (OVERFLOW_MAX as u64 + 2);
        let mut buf = String::new();
        (&mut f as &mut File)
            .take(max + 1)
            .read_to_string(&mut buf)
            .map_err(Skip::Io)?;
        if buf.len() as u64 > max {
            return Err(Skip::TooLarge);
        }
        let bad = || Skip::Corrupt(Corrupt("not a rankguard IPC overflow mark"));
        let mut lines = buf.split('\n');
        if lines.next() != Some(OVERFLOW_MAGIC) {
            return Err(bad());
        }
        let (mut listed, mut sticky) = (Vec::new(), false);
        for line in lines {
            match line.split(' ').collect::<Vec<_>>()[..] {
                ["end"] => return Ok(Some((listed, sticky))),
                ["more"] => sticky = true,
                ["exporter", p, s] => listed.push((
                    parse_dec(p)
                        .and_then(|p| u32::try_from(p).ok())
                        .ok_or_else(bad)?,
                    parse_dec(s).ok_or_else(bad)?,
                )),
                _ => return Err(bad()),
            }
        }
        Err(bad())
    }

    /// Write `text` to `path` by a fresh temporary file renamed over it; `pid` is this
    /// process's (it names the temporary file, for a sweep to see whose it is).
    fn replace(&self, path: &Path, text: &str, pid: u32) -> io::Result<()> {
        let tmp = self.dir.join(format!(
            ".tmp.{pid}.{}.{}",
            TMP_SEQ.fetch_add(1, Ordering::Relaxed),
            now_secs()
        ));
        let result = (|| -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            drop(f);
            fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Remove the records of dead exporters, untrusted records and stale temporaries among
    /// the first `budget` entries of the directory (files that are not records are kept).
    /// Returns what it kept and removed, and whether it reached the directory's end.
    pub fn sweep(&self, procs: &dyn Procs, budget: usize) -> Swept {
        self.sweep_until(procs, budget, None)
    }

    /// A process's start-up sweep ([`START_SWEEP_TIME`]): as [`sweep`](Self::sweep), but
    /// stopping also once `within` has passed (checked before each entry), and removing
    /// only the records whose writer's pid no longer exists (and stale temporaries). A
    /// record that cannot be trusted for another reason (damaged, forged, a link, loose
    /// permissions) is left to the look-up that meets it, which says so.
    pub fn sweep_dead_within(
        &self,
        procs: &dyn Procs,
        budget: usize,
        within: std::time::Duration,
    ) -> Swept {
        let mut ranks = Vec::new();
        let swept = self.sweep_until(
            procs,
            budget,
            Some((std::time::Instant::now() + within, &mut ranks)),
        );
        if swept.complete {
            // what is left, for the first write's count (`write`) and the walk's look-ups
            self.swept_count.store(swept.kept, Ordering::Relaxed);
            let _ = self.swept_ranks.set(ranks);
        }
        swept
    }

    /// The sweep; with a deadline, the start-up sweep (dead writers only), which lists the
    /// pids of the rank records it leaves in the vector given with it.
    fn sweep_until(
        &self,
        procs: &dyn Procs,
        budget: usize,
        start_up: Option<(std::time::Instant, &mut Vec<u32>)>,
    ) -> Swept {
        let (deadline, mut ranks) = match start_up {
            Some((d, r)) => (Some(d), Some(r)),
            None => (None, None),
        };
        let mut out = Swept::default();
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return out;
        };
        let now = now_secs();
        let mut entries = rd.flatten();
        let mut examined = 0;
        loop {
            if examined == budget || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                out.complete = entries.next().is_none();
                break;
            }
            let Some(entry) = entries.next() else {
                out.complete = true;
                break;
            };
            examined += 1;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            if let Some(rest) = name.strip_prefix(".tmp.") {
                // .tmp.<pid>.<seq>.<secs>: a writer between create and rename, unless old.
                let old = rest
                    .rsplit('.')
                    .next()
                    .and_then(parse_dec)
                    .is_some_and(|t| now.saturating_sub(t) > STALE_TMP_SECS);
                let pid = rest
                    .split('.')
                    .next()
                    .and_then(parse_dec)
                    .and_then(|p| u32::try_from(p).ok());
                if old || pid.is_some_and(|p| procs.info(p).is_none()) {
                    let _ = fs::remove_file(&path);
                    out.removed += 1;
                } else {
                    out.kept += 1;
                }
                continue;
            }
            let Some(key) = Key::parse_file_name(name) else {
                // Not ours: leave it (a user's file is not ours to delete).
                out.kept += 1;
                continue;
            };
            if deadline.is_some() {
                match self.read(&path, &key) {
                    Ok(Some((rec, stamp))) if procs.info(rec.pid).is_none() => {
                        self.remove_if(&path, stamp.ident());
                        out.removed += 1;
                    }
                    Ok(None) => {}
                    Ok(Some(_)) | Err(_) => {
                        out.kept += 1;
                        // A rank record left (or one not read: looked up as before).
                        if let (Some(ranks), Some(pid)) = (ranks.as_deref_mut(), rank_pid(name)) {
                            ranks.push(pid);
                        }
                    }
                }
                continue;
            }
            match self.lookup(&key, procs) {
                Lookup::Found(_) => out.kept += 1,
                Lookup::Missing => {}
                Lookup::Skipped(_) => out.removed += 1,
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------
// The R3 import decision

/// The importing process, as R3 compares it.
#[derive(Clone, Copy, Debug)]
pub struct Importer<'a> {
    /// Job token ([`job_token`]).
    pub job: Option<&'a str>,
    pub rank: Option<u32>,
    /// The rank's GPU (`GPU-...`/`MIG-...`), None if unknown.
    pub gpu: Option<&'a str>,
    /// The rank root, when no rank variables name the rank ([`crate::rank_root`]).
    pub root: Option<RootId>,
}

/// What R3 decided about one import, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Same job and rank, same GPU.
    SameGpu,
    /// Another rank of the same job: inter-rank traffic (NCCL P2P).
    OtherRank,
    /// Another job (or one side knows no job): not this rank's business.
    OtherJob,
    /// Host memory (NCCL SHM): R3 never applies.
    HostMemory,
    /// No trusted record, or not enough identity to compare: allowed by default.
    Unknown,
    /// The same: under `RANKGUARD_IPC=strict`, denied.
    UnknownStrict,
    /// The same, while there is no registry the user can trust (its default directory was
    /// taken by another user, no private fallback): refused in any policy, since squatting
    /// the directory must not switch R3 off ([`Decision::without_registry`]).
    UnknownNoRegistry,
    /// The same, inside a known rank (the importer knows its rank and GPU), while the
    /// registry has lost records of a live exporter ([`Decision::after_overflow`]).
    UnknownOverflow,
    /// Same job and rank, another GPU: the violation R3 exists for.
    CrossDevice,
}

impl Decision {
    /// The policy verdict (R3, `CUDA_ERROR_NOT_PERMITTED` on denial) on an import of a
    /// handle of `kind` (`None`: a handle with no identity); the kind only words the detail
    /// (an event's import is not called memory).
    pub fn verdict(self, kind: Option<Kind>) -> Verdict {
        let detail = match self {
            Decision::CrossDevice => Detail::CrossDeviceIpc {
                event: kind == Some(Kind::Event),
            },
            Decision::UnknownStrict => Detail::UnknownExporter,
            Decision::UnknownNoRegistry => Detail::UnknownNoRegistry,
            Decision::UnknownOverflow => Detail::UnknownOverflow,
            _ => return Verdict::Allow,
        };
        Verdict::Violation(Violation {
            rule: Rule::R3,
            code: DenyCode::NotPermitted,
            detail,
        })
    }

    /// Whether the mapping should still be verified after the import (where the driver can
    /// tell its device): the import is allowed but could be this rank's cross-device one.
    pub fn verify_after(self) -> bool {
        matches!(self, Decision::SameGpu | Decision::Unknown)
    }

    /// The decision when the importer has no registry it can trust (the default directory
    /// was taken, no private fallback): unknown provenance is refused, the rest stands.
    pub fn without_registry(self) -> Decision {
        match self {
            Decision::Unknown | Decision::UnknownStrict => Decision::UnknownNoRegistry,
            d => d,
        }
    }

    /// The decision while the registry has lost records of a live exporter
    /// ([`Registry::overflow`]): a missing record is then no evidence of an unguarded
    /// exporter, since the import may be of this rank's own export on another GPU. So
    /// unknown provenance inside a known rank (the importer has a rank, by variables or a
    /// rank root, and a GPU: what the importer can know) is refused in any policy; outside
    /// one it keeps its meaning (nothing to compare), as does every decided case.
    pub fn after_overflow(self, me: &Importer<'_>) -> Decision {
        let in_rank = me.gpu.is_some() && (me.rank.is_some() || me.root.is_some());
        match self {
            Decision::Unknown | Decision::UnknownStrict if in_rank => Decision::UnknownOverflow,
            d => d,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::SameGpu => "same rank, same GPU",
            Decision::OtherRank => "exporter is another rank (inter-rank traffic)",
            Decision::OtherJob => "exporter is another job",
            Decision::HostMemory => "host memory",
            Decision::Unknown => "unknown exporter (allowed; RANKGUARD_IPC=strict denies)",
            Decision::UnknownStrict => "unknown exporter (RANKGUARD_IPC=strict)",
            Decision::UnknownNoRegistry => "unknown provenance: refused (no trusted registry)",
            Decision::UnknownOverflow => {
                "unknown provenance: refused (the registry lost records of a live exporter)"
            }
            Decision::CrossDevice => "same rank, another GPU",
        }
    }
}

/// Whether two GPU identities name the same GPU: the UUID text after the `GPU-`/`MIG-`
/// prefix, case-insensitively (the two sides may print the prefix differently).
pub fn same_gpu(a: &str, b: &str) -> bool {
    fn body(s: &str) -> &str {
        match s.get(..4) {
            Some(p) if p.eq_ignore_ascii_case("GPU-") || p.eq_ignore_ascii_case("MIG-") => {
                s.get(4..).unwrap_or(s) // `get`: no panic location (stat_start_time)
            }
            _ => s,
        }
    }
    let (a, b) = (body(a.trim()), body(b.trim()));
    !a.is_empty() && a.eq_ignore_ascii_case(b)
}

/// R3 on one import.
///
/// `exporter` is the trusted record (None: missing or skipped); `location` is what the
/// driver says about the imported memory after the fact, where it can (VMM allocation
/// properties), else None.
///
/// Decided here (the docs are silent; docs/design.md §1 R3 only fixes the cases):
/// - host memory, by the record or by the driver, is always allowed;
/// - the job is compared first: different jobs (or a job on one side only) are not the
///   same rank; no job on both sides counts as the same job (one user's node);
/// - ranks named by variables are compared when both sides have one; when neither has,
///   the rank roots are (same root: same rank; different roots: another rank, e.g. two
///   programs started separately or two Ray actors); anything else cannot establish "same
///   rank": unknown;
/// - a GPU missing on either side: unknown.
pub fn decide(
    me: &Importer<'_>,
    exporter: Option<&ProvenanceRecord>,
    location: Option<Location>,
    ipc: IpcPolicy,
) -> Decision {
    if location.is_some_and(Location::is_host) || exporter.is_some_and(|r| r.location.is_host()) {
        return Decision::HostMemory;
    }
    let unknown = match ipc {
        IpcPolicy::Default => Decision::Unknown,
        IpcPolicy::Strict => Decision::UnknownStrict,
    };
    let Some(r) = exporter else { return unknown };
    if r.job.as_deref() != me.job {
        return Decision::OtherJob;
    }
    match (r.rank, me.rank) {
        (Some(a), Some(b)) if a != b => return Decision::OtherRank,
        (Some(_), Some(_)) => {}
        (None, None) => match (r.root, me.root) {
            (Some(a), Some(b)) if a != b => return Decision::OtherRank,
            (Some(_), Some(_)) => {}
            _ => return unknown,
        },
        _ => return unknown,
    }
    match (r.gpu.as_deref(), me.gpu) {
        (Some(a), Some(b)) if same_gpu(a, b) => Decision::SameGpu,
        (Some(_), Some(_)) => Decision::CrossDevice,
        _ => unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_record_is_trusted_as_a_files_is() {
        let k = mem_key(9);
        let r = rec(
            k.clone(),
            Some(0),
            Some("GPU-aaaaaaaa-0000-0000-0000-000000000000"),
        );
        let text = r.render();
        let u = uid();
        let live = FakeProcs::with(4242, 777, u);
        let trusted = |t: &[u8], owner, procs: &FakeProcs| trust_table_text(t, &k, owner, u, procs);
        assert!(
            matches!(trusted(text.as_bytes(), 4242, &live), Lookup::Found(ref got) if *got == r)
        );
        // Not the slot's owner's record, another key's, garbage, a dead or reused pid.
        assert!(matches!(
            trusted(text.as_bytes(), 4243, &live),
            Lookup::Skipped(Skip::Forged { pid: 4242 })
        ));
        let other = rec(mem_key(8), Some(0), None).render();
        assert!(matches!(
            trusted(other.as_bytes(), 4242, &live),
            Lookup::Skipped(Skip::Corrupt(_))
        ));
        assert!(matches!(
            trusted(b"\xff\xfe", 4242, &live),
            Lookup::Skipped(Skip::Corrupt(_))
        ));
        assert!(matches!(
            trusted(text.as_bytes(), 4242, &FakeProcs::default()),
            Lookup::Skipped(Skip::Dead { pid: 4242 })
        ));
        assert!(matches!(
            trusted(text.as_bytes(), 4242, &FakeProcs::with(4242, 778, u)),
            Lookup::Skipped(Skip::Forged { pid: 4242 })
        ));
    }

    #[test]
    fn a_handles_key_gives_its_bytes_back_and_a_files_none() {
        let h: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
        let (bytes, n) = Key::from_bytes(Kind::Event, &h).bytes().unwrap();
        assert_eq!((&bytes[..n], n), (&h[..], 64));
        assert_eq!(
            Key::from_bytes(Kind::Mem, &[0x0f, 0xa0, 0]).file_name(),
            "mem-0fa000"
        );
        let f = FileIdent {
            dev: 0x803,
            ino: 0x1f,
            regular: true,
            fs_magic: 0,
        };
        assert_eq!(
            Key::from_file(Kind::VmmFd, f).unwrap().bytes(),
            None,
            "dev.ino is text"
        );
        assert_eq!(Key::rank(123).bytes(), None, "an odd number of digits");
    }
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// The bound unit tests use (the real one is tens of thousands of files).
    const SMALL: usize = 600;

    impl Registry {
        fn bounded(mut self, max: usize) -> Registry {
            self.max = max;
            self.every = 1;
            self
        }
    }

    const G0: &str = "GPU-10c0ffee-0000-4000-8000-000000000000";
    const G1: &str = "GPU-11c0ffee-0000-4000-8000-000000000001";

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!(
                "rankguard-registry-test-{tag}-{}-{}",
                std::process::id(),
                TMP_SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::set_permissions(&self.0, fs::Permissions::from_mode(0o700));
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[derive(Default)]
    struct FakeProcs(RefCell<HashMap<u32, ProcInfo>>);
    impl FakeProcs {
        fn with(pid: u32, start: u64, uid: u32) -> FakeProcs {
            let p = FakeProcs::default();
            p.0.borrow_mut().insert(pid, ProcInfo { start, uid });
            p
        }
    }
    impl Procs for FakeProcs {
        fn info(&self, pid: u32) -> Option<ProcInfo> {
            self.0.borrow().get(&pid).copied()
        }
    }

    fn uid() -> u32 {
        fs::metadata("/proc/self").unwrap().uid()
    }

    fn rec(key: Key, rank: Option<u32>, gpu: Option<&str>) -> ProvenanceRecord {
        ProvenanceRecord {
            key,
            job: Some(job_token("job-1")),
            rank,
            pid: 4242,
            start: 777,
            gpu: gpu.map(str::to_string),
            location: Location::Device,
            time: 1,
            root: None,
        }
    }

    fn mem_key(b: u8) -> Key {
        Key::from_bytes(Kind::Mem, &[b; 64])
    }

    #[test]
    fn keys_name_files_and_round_trip() {
        let k = mem_key(0xab);
        assert_eq!(k.file_name().len(), 4 + 128);
        assert_eq!(Key::parse_file_name(&k.file_name()), Some(k.clone()));
        let f = Key::from_file(
            Kind::VmmFd,
            FileIdent {
                dev: 0x2a,
                ino: 99,
                regular: true,
                fs_magic: 0x0102_1994,
            },
        )
        .unwrap();
        assert_eq!(f.file_name(), "vmmfd-2a.63");
        assert_eq!(Key::parse_file_name("vmmfd-2a.63"), Some(f));
        for bad in [
            "", "mem", "mem-", "mem-XYZ", "nope-00", "mem-../x", "mem-AB",
        ] {
            assert_eq!(Key::parse_file_name(bad), None, "{bad}");
        }
        assert_eq!(
            Key::parse_file_name(&format!("mem-{}", "0".repeat(129))),
            None
        );
    }

    #[test]
    fn only_unique_file_identities_are_keys() {
        let anon = FileIdent {
            dev: 14,
            ino: 1,
            regular: true,
            fs_magic: ANON_INODE_FS_MAGIC,
        };
        assert_eq!(Key::from_file(Kind::VmmFd, anon), Err(NoKey::NotUnique));
        let chr = FileIdent {
            dev: 5,
            ino: 7,
            regular: false,
            fs_magic: 0x1021994,
        };
        assert_eq!(Key::from_file(Kind::VmmFd, chr), Err(NoKey::NotUnique));
        // A real dma-buf is no regular file, but each is its own inode of the dmabuf fs.
        let dmabuf = FileIdent {
            dev: 13,
            ino: 0x2c,
            regular: false,
            fs_magic: DMA_BUF_MAGIC,
        };
        let k = Key::from_file(Kind::DmaBuf, dmabuf).unwrap();
        assert_eq!(k.file_name(), "dmabuf-d.2c");
        assert_eq!(Key::parse_file_name("dmabuf-d.2c"), Some(k));
    }

    #[test]
    fn records_round_trip_and_reject_damage() {
        let k = mem_key(1);
        let r = rec(k.clone(), Some(3), Some(G0));
        let text = r.render();
        assert!(text.len() < 400);
        assert_eq!(ProvenanceRecord::parse(&text, &k), Ok(r.clone()));
        // every truncation is rejected, never half-trusted
        for cut in 0..text.len() - 1 {
            assert!(
                ProvenanceRecord::parse(&text[..cut], &k).is_err(),
                "cut at {cut}"
            );
        }
        // another key
        assert!(ProvenanceRecord::parse(&text, &mem_key(2)).is_err());
        // hostile values
        for (from, to) in [
            ("pid 4242", "pid 0"),
            ("pid 4242", "pid -1"),
            ("pid 4242", "pid 99999999999"),
            ("rank 3", "rank 3.5"),
            ("rank 3", "rank 4294967296"),
            ("gpu GPU-", "gpu ../"),
            ("location device", "location moon"),
            ("job job-1", "job a b"),
            ("time 1", "time 1\ntime 2"),
            ("end\n", "end\ntrailing\n"),
            ("start 777", "start 777\nextra 1"),
        ] {
            let bad = text.replacen(from, to, 1);
            assert!(ProvenanceRecord::parse(&bad, &k).is_err(), "{from} -> {to}");
        }
        let none = ProvenanceRecord {
            job: None,
            rank: None,
            gpu: None,
            location: Location::Host,
            ..r
        };
        assert_eq!(ProvenanceRecord::parse(&none.render(), &k), Ok(none));
    }

    #[test]
    fn job_tokens_are_printable_and_bounded() {
        assert_eq!(job_token("slurm:77.0"), "slurm:77.0");
        assert_eq!(job_token("a b%\n"), "a%20b%25%0A");
        let long_a = "x".repeat(300) + "a";
        let long_b = "x".repeat(300) + "b";
        assert!(job_token(&long_a).len() <= MAX_JOB);
        assert_ne!(job_token(&long_a), job_token(&long_b));
        assert!(valid_token(&job_token(&long_a)));
        assert!(valid_token(&job_token("é ü")));
    }

    #[test]
    fn stat_start_time_survives_odd_command_names() {
        let stat =
            "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(stat_start_time(stat), Some(98765));
        assert_eq!(stat_start_time("garbage"), None);
        assert!(own_start_time().is_some());
        let me = ProcFs.info(std::process::id()).unwrap();
        assert_eq!(Some(me.start), own_start_time());
    }

    #[test]
    fn the_fallback_is_private_and_per_host() {
        let f = fallback_dir(Path::new("/home/ann"), "node7.cluster/x y");
        assert_eq!(
            f,
            PathBuf::from("/home/ann/.cache/rankguard/registry-node7.cluster_x_y")
        );
        assert_ne!(
            fallback_dir(Path::new("/h"), "a"),
            fallback_dir(Path::new("/h"), "b")
        );
    }

    #[test]
    fn an_unchanged_record_is_not_written_again() {
        // PyTorch exports a segment's handle at every share of a tensor in it (the same bytes
        // each time): the second write of the same record leaves the file alone (no create,
        // no rename: on a disk filesystem a rename over a file starts its writeback).
        let t = TempDir::new("unchanged");
        let reg = Registry::open(&t.0, uid(), false).unwrap();
        let procs = FakeProcs::with(4242, 777, uid());
        let first = rec(mem_key(7), Some(0), Some(G0));
        reg.write(&first, &procs).unwrap();
        let path = t.0.join(first.key.file_name());
        let ino = fs::metadata(&path).unwrap().ino();
        let again = ProvenanceRecord {
            time: 99,
            ..first.clone()
        };
        reg.write(&again, &procs).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().ino(), ino);
        assert_eq!(fs::read_to_string(&path).unwrap(), first.render());
        assert_eq!(fs::read_dir(&t.0).unwrap().count(), 1);
        // Anything else that differs is written.
        let moved = ProvenanceRecord {
            gpu: Some(G1.to_string()),
            ..again.clone()
        };
        reg.write(&moved, &procs).unwrap();
        assert_ne!(fs::metadata(&path).unwrap().ino(), ino);
        assert!(matches!(reg.lookup(&first.key, &procs), Lookup::Found(r) if r == moved));
        let other = ProvenanceRecord {
            pid: 4243,
            ..moved.clone()
        };
        let ino = fs::metadata(&path).unwrap().ino();
        reg.write(&other, &procs).unwrap();
        assert_ne!(fs::metadata(&path).unwrap().ino(), ino);
    }

    #[test]
    fn proc_stat_start_times_are_read_whole() {
        let me = std::process::id();
        let info = ProcFs.info(me).unwrap();
        assert_eq!(Some(info.start), own_start_time());
        assert_eq!(info.uid, uid());
        // A stat line longer than any first read (a long command name is cut at 15 bytes by
        // the kernel, but the numbers after it grow): the reader keeps reading to the end.
        let long = format!("1 (x) S {}", "123456789 ".repeat(200));
        let f = std::env::temp_dir().join(format!("rankguard-stat-test-{me}"));
        fs::write(&f, &long).unwrap();
        assert_eq!(read_proc_file(&f).as_deref(), Some(long.as_str()));
        let _ = fs::remove_file(&f);
        assert_eq!(read_proc_file(Path::new("/proc/self/no-such-file")), None);
    }

    /// A directory verdict is reused by the process that reached it, for the user it was
    /// about, within the window; a failed check keeps nothing; a later time, another pid
    /// (a fork child) or another user verifies again.
    #[test]
    fn a_directory_verdict_is_reused_for_five_ms_by_its_process_only() {
        let t = TempDir::new("recent");
        let u = uid();
        let recent = RecentDir::new();
        let at = |me, us| Now { me, us };
        assert!(Registry::open_with(&t.0, u, false, at(7, 1_000), &recent).is_ok());
        // Now not trusted by a fresh check, still by the kept verdict (no system call).
        fs::set_permissions(&t.0, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Registry::open(&t.0, u, false).is_err());
        assert!(Registry::open_with(
            &t.0,
            u,
            false,
            at(7, 1_000 + RECENTLY_ALIVE_US - 1),
            &recent
        )
        .is_ok());
        for (me, us, who) in [
            (7, 1_000 + RECENTLY_ALIVE_US, "the window's end"),
            (8, 1_001, "a fork child"),
        ] {
            assert!(
                matches!(
                    Registry::open_with(&t.0, u, false, at(me, us), &recent),
                    Err(DirProblem::Mode { .. })
                ),
                "{who}"
            );
        }
        assert!(Registry::open_with(&t.0, u + 1, false, at(7, 1_002), &recent).is_err());
        // A failed check kept nothing: once fixed, verified again, then kept again.
        let other = TempDir::new("recent-other");
        fs::set_permissions(&other.0, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Registry::open_with(&other.0, u, false, at(7, 2_000), &recent).is_err());
        assert!(Registry::open_with(&other.0, u, false, at(7, 2_001), &recent).is_err());
        fs::set_permissions(&other.0, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(Registry::open_with(&other.0, u, false, at(7, 2_002), &recent).is_ok());
        // The verdict is about one path: the first directory is checked afresh.
        assert!(Registry::open_with(&t.0, u, false, at(7, 2_003), &recent).is_err());
    }

    #[test]
    fn directory_checks() {
        let t = TempDir::new("dir");
        let u = uid();
        assert!(Registry::open(&t.0, u, false).is_ok());
        assert!(matches!(
            Registry::open(Path::new("rel/dir"), u, true),
            Err(DirProblem::NotAbsolute)
        ));
        assert!(matches!(
            Registry::open(&t.0, u + 1, false),
            Err(DirProblem::Owner { .. })
        ));
        fs::set_permissions(&t.0, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            Registry::open(&t.0, u, false),
            Err(DirProblem::Mode { .. })
        ));
        fs::set_permissions(&t.0, fs::Permissions::from_mode(0o700)).unwrap();
        let link = t.0.with_extension("link");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&t.0, &link).unwrap();
        assert!(matches!(
            Registry::open(&link, u, true),
            Err(DirProblem::Symlink)
        ));
        let _ = fs::remove_file(&link);
        let file = t.0.join("f");
        fs::write(&file, "x").unwrap();
        assert!(matches!(
            Registry::open(&file, u, true),
            Err(DirProblem::NotDirectory)
        ));
        // creation: mode 0700
        let sub = t.0.join("new");
        let r = Registry::open(&sub, u, true).unwrap();
        assert_eq!(fs::metadata(r.dir()).unwrap().mode() & 0o777, 0o700);
        assert!(matches!(
            Registry::open(&t.0.join("missing"), u, false),
            Err(DirProblem::Io(_))
        ));
    }

    #[test]
    fn write_lookup_and_liveness() {
        let t = TempDir::new("rw");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(SMALL);
        let procs = FakeProcs::with(4242, 777, u);
        let k = mem_key(7);
        let r = rec(k.clone(), Some(0), Some(G0));
        reg.write(&r, &procs).unwrap();
        assert_eq!(
            fs::metadata(t.0.join(k.file_name())).unwrap().mode() & 0o777,
            0o600
        );
        match reg.lookup(&k, &procs) {
            Lookup::Found(got) => assert_eq!(got, r),
            other => panic!("{other:?}"),
        }
        assert!(matches!(reg.lookup(&mem_key(8), &procs), Lookup::Missing));
        // no temporaries left behind
        assert_eq!(fs::read_dir(&t.0).unwrap().count(), 1);

        // a pid reused by another process (other start time), or of another user: forged
        let reused = FakeProcs::with(4242, 778, u);
        assert!(matches!(
            reg.lookup(&k, &reused),
            Lookup::Skipped(Skip::Forged { pid: 4242 })
        ));
        assert!(
            matches!(reg.lookup(&k, &procs), Lookup::Missing),
            "the forged record was removed"
        );
        reg.write(&r, &procs).unwrap();
        let other_user = FakeProcs::with(4242, 777, u + 1);
        assert!(matches!(
            reg.lookup(&k, &other_user),
            Lookup::Skipped(Skip::Forged { .. })
        ));
        // a dead exporter: skipped quietly and removed
        reg.write(&r, &procs).unwrap();
        let s = reg.lookup(&k, &FakeProcs::default());
        assert!(matches!(&s, Lookup::Skipped(sk @ Skip::Dead { .. }) if !sk.is_suspicious()));
        assert_eq!(fs::read_dir(&t.0).unwrap().count(), 0);
    }

    #[test]
    fn a_kinds_index_is_its_place() {
        for (i, k) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(k.index()), i);
            assert_eq!(Kind::from_index(k.index()), Some(k));
        }
        assert_eq!(Kind::from_index(Kind::ALL.len() as u8), None);
    }

    #[test]
    fn a_fresh_write_replaces_what_is_there_and_is_read_back() {
        let t = TempDir::new("fresh");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(SMALL);
        let procs = FakeProcs::with(4242, 777, u);
        let k = Key::from_bytes(Kind::Event, &[3; 64]);
        // A dead exporter's record of the same handle bytes, and a hostile file there: a
        // fresh write replaces either (it never reads them), and what it wrote is trusted.
        for planted in ["rankguard-ipc-record 1\nkey x\nend\n", "garbage"] {
            fs::write(t.0.join(k.file_name()), planted).unwrap();
            let r = rec(k.clone(), Some(1), Some(G0));
            reg.write_fresh(&r, &procs).unwrap();
            match reg.lookup(&k, &procs) {
                Lookup::Found(got) => assert_eq!(got, r),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            fs::read_dir(&t.0).unwrap().count(),
            1,
            "no temporaries left"
        );
    }

    #[test]
    fn hostile_records_are_skipped() {
        let t = TempDir::new("hostile");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(SMALL);
        let procs = FakeProcs::with(4242, 777, u);
        let k = mem_key(9);
        let path = t.0.join(k.file_name());
        // garbage
        fs::write(&path, b"\x00\xff garbage").unwrap();
        assert!(matches!(
            reg.lookup(&k, &procs),
            Lookup::Skipped(Skip::Corrupt(_))
        ));
        // truncated
        let text = rec(k.clone(), Some(0), Some(G0)).render();
        fs::write(&path, &text[..text.len() / 2]).unwrap();
        assert!(matches!(
            reg.lookup(&k, &procs),
            Lookup::Skipped(Skip::Corrupt(_))
        ));
        // too large
        fs::write(&path, "x".repeat(MAX_RECORD_BYTES as usize + 1)).unwrap();
        assert!(matches!(
            reg.lookup(&k, &procs),
            Lookup::Skipped(Skip::TooLarge)
        ));
        // writable by others
        fs::write(&path, &text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(
            reg.lookup(&k, &procs),
            Lookup::Skipped(Skip::Permissions)
        ));
        // a symlink to a good record elsewhere
        let elsewhere = t.0.with_extension("target");
        fs::write(&elsewhere, &text).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert!(matches!(
            reg.lookup(&k, &procs),
            Lookup::Skipped(Skip::Symlink)
        ));
        assert!(elsewhere.exists(), "the link's target is never touched");
        assert!(
            fs::symlink_metadata(&path).is_err(),
            "the link itself is what is removed"
        );
        let _ = fs::remove_file(&elsewhere);
        // a directory
        let _ = fs::remove_file(&path);
        fs::create_dir(&path).unwrap();
        assert!(matches!(
            reg.lookup(&k, &procs),
            Lookup::Skipped(Skip::NotRegular)
        ));
    }

    #[test]
    fn sweep_removes_dead_and_stale() {
        let t = TempDir::new("sweep");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(SMALL);
        let procs = FakeProcs::with(4242, 777, u);
        for b in 0..5 {
            let mut r = rec(mem_key(b), Some(0), Some(G0));
            if b % 2 == 1 {
                r.pid = 5000 + u32::from(b);
            }
            reg.write(&r, &procs).unwrap();
        }
        fs::write(t.0.join(".tmp.5999.0.1"), "half").unwrap();
        fs::write(t.0.join("README"), "a user's file").unwrap();
        let s = reg.sweep(&procs, SWEEP_BUDGET);
        assert_eq!(
            s,
            Swept {
                kept: 4,
                removed: 3,
                complete: true,
                max: 0
            }
        );
        assert!(t.0.join("README").exists());
        // A budget smaller than the directory: it stops there and says so.
        let s = reg.sweep(&procs, 2);
        assert_eq!((s.kept + s.removed, s.complete), (2, false));
        // A start-up sweep whose time is up examines nothing more; with time, all of it,
        // removing dead writers' records only: a damaged record is left for the look-up
        // that meets it to say.
        let dead = rec(mem_key(7), Some(0), Some(G0));
        let dead = ProvenanceRecord { pid: 5007, ..dead };
        reg.write(&dead, &procs).unwrap();
        fs::write(t.0.join(mem_key(8).file_name()), "damaged").unwrap();
        let s = reg.sweep_dead_within(&procs, SWEEP_BUDGET, std::time::Duration::ZERO);
        assert_eq!((s.kept + s.removed, s.complete), (0, false));
        let s = reg.sweep_dead_within(&procs, SWEEP_BUDGET, std::time::Duration::from_secs(60));
        assert_eq!((s.removed, s.complete), (1, true));
        assert!(!t.0.join(mem_key(7).file_name()).exists());
        assert!(t.0.join(mem_key(8).file_name()).exists());
    }

    #[test]
    fn the_first_write_after_a_start_up_sweep_decides_with_its_count() {
        // The first write through a registry whose start-up sweep read the whole directory
        // uses that sweep's count: the same decisions as a count of its own, once.
        let t = TempDir::new("swept-count");
        let u = uid();
        let procs = FakeProcs::with(4242, 777, u);
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(3);
        for b in 0..2 {
            reg.write(&rec(mem_key(b), Some(0), Some(G0)), &procs)
                .unwrap();
        }
        let dead = ProvenanceRecord {
            pid: 5001,
            ..rec(mem_key(9), Some(0), Some(G0))
        };
        reg.write(&dead, &procs).unwrap();
        // below the bound after the sweep (two live records left): written
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(3);
        let s = reg.sweep_dead_within(&procs, SWEEP_BUDGET, std::time::Duration::from_secs(60));
        assert_eq!((s.kept, s.removed, s.complete), (2, 1, true));
        reg.write(&rec(mem_key(2), Some(0), Some(G0)), &procs)
            .unwrap();
        assert!(matches!(
            reg.lookup(&mem_key(2), &procs),
            Lookup::Found(r) if r.gpu.as_deref() == Some(G0)
        ));
        // the count was the first write's alone: the next one counts three, full
        assert!(matches!(
            reg.write(&rec(mem_key(3), Some(0), Some(G0)), &procs),
            Err(WriteProblem::Full(_))
        ));
        // at the bound after the sweep: full, as a count of its own says
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(3);
        let s = reg.sweep_dead_within(&procs, SWEEP_BUDGET, std::time::Duration::from_secs(60));
        assert_eq!((s.kept, s.complete), (3, true));
        assert!(matches!(
            reg.write(&rec(mem_key(4), Some(0), Some(G0)), &procs),
            Err(WriteProblem::Full(_))
        ));
        // ... and a replacement of a record there is written (it does not grow the directory)
        let again = ProvenanceRecord {
            gpu: Some(G1.to_string()),
            ..rec(mem_key(2), Some(0), Some(G0))
        };
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(3);
        reg.sweep_dead_within(&procs, SWEEP_BUDGET, std::time::Duration::from_secs(60));
        reg.write(&again, &procs).unwrap();
        assert!(matches!(
            reg.lookup(&mem_key(2), &procs),
            Lookup::Found(r) if r.gpu.as_deref() == Some(G1)
        ));
    }

    #[test]
    fn more_dead_records_than_a_sweep_examines_never_read_as_full() {
        // Issue 29, item 11: with 16,384 entries examined per sweep and a recount after it,
        // 30,000 dead records read as "full (4096 records of live exporters)" and the write
        // was refused. Now each write's bounded sweep frees room for it, and the directory
        // shrinks at every write until it is under the bound.
        let t = TempDir::new("stale");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(SMALL);
        let procs = FakeProcs::with(4242, 777, u);
        let dead = SMALL + 3 * SWEEP_BUDGET;
        for i in 0..dead {
            let mut r = rec(Key::rank(100_000 + i as u32), None, Some(G0));
            r.pid = 100_000 + i as u32;
            fs::write(t.0.join(r.key.file_name()), r.render()).unwrap();
            fs::set_permissions(
                t.0.join(r.key.file_name()),
                fs::Permissions::from_mode(0o600),
            )
            .unwrap();
        }
        let entries = || fs::read_dir(&t.0).unwrap().count();
        for n in 0..4u8 {
            let before = entries();
            reg.write(&rec(mem_key(n), Some(0), Some(G0)), &procs)
                .unwrap();
            assert!(
                entries() < before || before < SMALL,
                "{before} -> {}",
                entries()
            );
        }
        assert!(entries() <= SMALL, "converged in 4 writes: {}", entries());
        // A registry full of live exporters is refused, saying how much was examined.
        let t = TempDir::new("live");
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(SMALL);
        for i in 0..SMALL {
            let r = rec(Key::rank(i as u32 + 1), None, Some(G0));
            fs::write(t.0.join(r.key.file_name()), r.render()).unwrap();
            fs::set_permissions(
                t.0.join(r.key.file_name()),
                fs::Permissions::from_mode(0o600),
            )
            .unwrap();
        }
        let e = reg
            .write(&rec(mem_key(9), Some(0), Some(G0)), &procs)
            .unwrap_err();
        assert!(
            matches!(
                e,
                WriteProblem::Full(Swept {
                    kept: SWEEP_BUDGET,
                    removed: 0,
                    complete: false,
                    max: SMALL
                })
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains(&format!(
                "at least {SMALL} entries; the {SWEEP_BUDGET} a bounded sweep examined"
            )),
            "{e}"
        );
    }

    #[test]
    fn a_full_registry_sweeps_then_refuses() {
        let t = TempDir::new("full");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().bounded(SMALL);
        let procs = FakeProcs::with(4242, 777, u);
        for i in 0..SMALL {
            fs::write(t.0.join(format!("filler{i}")), "").unwrap();
        }
        let r = rec(mem_key(1), Some(0), Some(G0));
        assert!(matches!(reg.write(&r, &procs), Err(WriteProblem::Full(_))));
        for i in 0..10 {
            fs::remove_file(t.0.join(format!("filler{i}"))).unwrap();
        }
        reg.write(&r, &procs).unwrap();
    }

    #[test]
    fn concurrent_writers_never_tear_a_record() {
        let t = TempDir::new("conc");
        let u = uid();
        let k = mem_key(3);
        std::thread::scope(|s| {
            for w in 0..8u32 {
                let dir = t.0.clone();
                let k = k.clone();
                s.spawn(move || {
                    let reg = Registry::open(&dir, u, false).unwrap();
                    let p = FakeProcs::default();
                    for i in 0..200 {
                        let mut r = rec(k.clone(), Some(w), Some(G0));
                        r.time = i;
                        reg.write(&r, &p).unwrap();
                    }
                });
            }
            let dir = t.0.clone();
            let k = k.clone();
            s.spawn(move || {
                let reg = Registry::open(&dir, u, false).unwrap();
                for _ in 0..2000 {
                    match reg.read(&dir.join(k.file_name()), &k) {
                        Ok(_) => {}
                        Err((skip, _)) => panic!("torn or bad record: {skip}"),
                    }
                }
            });
        });
    }

    fn me<'a>(rank: Option<u32>, gpu: Option<&'a str>, job: Option<&'a str>) -> Importer<'a> {
        Importer {
            job,
            rank,
            gpu,
            root: None,
        }
    }

    #[test]
    fn r3_decisions() {
        use Decision::*;
        let job = job_token("job-1");
        let j = Some(job.as_str());
        let d = IpcPolicy::Default;
        let s = IpcPolicy::Strict;
        let r0g0 = rec(mem_key(1), Some(0), Some(G0));
        // same rank: the GPU decides
        assert_eq!(
            decide(&me(Some(0), Some(G1), j), Some(&r0g0), None, d),
            CrossDevice
        );
        assert_eq!(
            decide(&me(Some(0), Some(G0), j), Some(&r0g0), None, d),
            SameGpu
        );
        assert_eq!(
            decide(
                &me(Some(0), Some("gpu-10C0FFEE-0000-4000-8000-000000000000"), j),
                Some(&r0g0),
                None,
                s
            ),
            SameGpu
        );
        // another rank, another job
        assert_eq!(
            decide(&me(Some(1), Some(G1), j), Some(&r0g0), None, s),
            OtherRank
        );
        assert_eq!(
            decide(&me(Some(0), Some(G1), Some("other")), Some(&r0g0), None, s),
            OtherJob
        );
        assert_eq!(
            decide(&me(Some(0), Some(G1), None), Some(&r0g0), None, s),
            OtherJob
        );
        // host memory, by record or by the driver
        let host = ProvenanceRecord {
            location: Location::Host,
            gpu: None,
            ..r0g0.clone()
        };
        assert_eq!(
            decide(&me(Some(0), Some(G1), j), Some(&host), None, s),
            HostMemory
        );
        assert_eq!(
            decide(&me(Some(0), Some(G1), j), None, Some(Location::HostNuma), s),
            HostMemory
        );
        // unknown: no record, no rank, no GPU
        assert_eq!(decide(&me(Some(0), Some(G1), j), None, None, d), Unknown);
        assert_eq!(
            decide(&me(Some(0), Some(G1), j), None, Some(Location::Device), s),
            UnknownStrict
        );
        assert_eq!(
            decide(&me(None, Some(G1), j), Some(&r0g0), None, d),
            Unknown
        );
        assert_eq!(
            decide(&me(Some(0), None, j), Some(&r0g0), None, s),
            UnknownStrict
        );
        // verdicts
        assert!(
            matches!(CrossDevice.verdict(Some(Kind::Mem)), Verdict::Violation(v) if v.rule == Rule::R3 && v.detail == Detail::CrossDeviceIpc { event: false } && v.code == DenyCode::NotPermitted)
        );
        assert!(
            matches!(CrossDevice.verdict(Some(Kind::Event)), Verdict::Violation(v) if v.detail == Detail::CrossDeviceIpc { event: true })
        );
        assert_eq!(
            Detail::CrossDeviceIpc { event: true }.to_string(),
            "IPC import of an event exported on another GPU by the same rank"
        );
        assert!(
            matches!(UnknownStrict.verdict(None), Verdict::Violation(v) if v.detail == Detail::UnknownExporter)
        );
        for a in [SameGpu, OtherRank, OtherJob, HostMemory, Unknown] {
            assert!(a.verdict(None).is_allow());
        }
        assert!(SameGpu.verify_after() && Unknown.verify_after() && !OtherRank.verify_after());
    }

    #[test]
    fn without_a_trusted_registry_unknown_provenance_is_refused_in_any_policy() {
        use Decision::*;
        assert_eq!(Unknown.without_registry(), UnknownNoRegistry);
        assert_eq!(UnknownStrict.without_registry(), UnknownNoRegistry);
        for d in [SameGpu, OtherRank, OtherJob, HostMemory, CrossDevice] {
            assert_eq!(d.without_registry(), d);
        }
        assert!(
            matches!(UnknownNoRegistry.verdict(None), Verdict::Violation(v) if v.rule == Rule::R3 && v.detail == Detail::UnknownNoRegistry && v.code == DenyCode::NotPermitted)
        );
        assert!(!UnknownNoRegistry.verify_after());
        let text = Detail::UnknownNoRegistry.to_string();
        assert!(
            text.contains("refused") && text.contains("RANKGUARD_REGISTRY"),
            "{text}"
        );
    }

    #[test]
    fn r3_compares_rank_roots_when_no_side_has_a_rank() {
        use Decision::*;
        let (a, b) = (
            RootId {
                pid: 10,
                start: 100,
            },
            RootId {
                pid: 11,
                start: 100,
            },
        );
        let reused = RootId {
            pid: 10,
            start: 555,
        };
        let x = ProvenanceRecord {
            job: None,
            rank: None,
            root: Some(a),
            ..rec(mem_key(1), None, Some(G0))
        };
        let me_root = |root, gpu| Importer {
            job: None,
            rank: None,
            gpu: Some(gpu),
            root,
        };
        let s = IpcPolicy::Strict;
        // the same root is the same rank: the GPU decides
        assert_eq!(
            decide(&me_root(Some(a), G1), Some(&x), None, s),
            CrossDevice
        );
        assert_eq!(decide(&me_root(Some(a), G0), Some(&x), None, s), SameGpu);
        // another root (another program, another Ray actor, or a reused pid) is another rank
        assert_eq!(decide(&me_root(Some(b), G1), Some(&x), None, s), OtherRank);
        assert_eq!(
            decide(&me_root(Some(reused), G1), Some(&x), None, s),
            OtherRank
        );
        // no root on one side: unknown, as before
        assert_eq!(decide(&me_root(None, G1), Some(&x), None, s), UnknownStrict);
        let old = ProvenanceRecord {
            root: None,
            ..x.clone()
        };
        assert_eq!(
            decide(&me_root(Some(a), G1), Some(&old), None, s),
            UnknownStrict
        );
        // explicit ranks win over roots: same rank by variables, whatever the roots say
        let ranked = ProvenanceRecord {
            rank: Some(0),
            root: Some(b),
            ..x.clone()
        };
        let me_ranked = Importer {
            job: None,
            rank: Some(0),
            gpu: Some(G1),
            root: Some(a),
        };
        assert_eq!(decide(&me_ranked, Some(&ranked), None, s), CrossDevice);
        // a rank on one side only: unknown
        assert_eq!(
            decide(&me_root(Some(a), G1), Some(&ranked), None, s),
            UnknownStrict
        );
    }

    #[test]
    fn a_rank_record_written_without_allocating_is_the_rendered_one() {
        let gpu = "GPU-0c0ffee0-0000-4000-8000-000000000000";
        for (job, pid, start, time) in [
            (None, 4242, 987_654, 1_700_000_000),
            (Some("slurm:12.0"), 4_194_303, 18_446_744_073_709, 0),
        ] {
            let rec = ProvenanceRecord {
                key: Key::rank(pid),
                job: job.map(str::to_string),
                rank: None,
                pid,
                start,
                gpu: Some(gpu.into()),
                location: Location::Device,
                time,
                root: Some(RootId { pid, start }),
            };
            let mut out = String::new();
            ProvenanceRecord::write_rank(&mut out, pid, start, job, gpu, time).unwrap();
            assert_eq!(out, rec.render());
            assert_eq!(ProvenanceRecord::parse(&out, &Key::rank(pid)).unwrap(), rec);
        }
    }

    #[test]
    fn rank_records_and_roots_round_trip() {
        let key = Key::rank(4242);
        assert_eq!(key.file_name(), "rank-4242");
        assert_eq!(Key::parse_file_name("rank-4242"), Some(key.clone()));
        let r = ProvenanceRecord {
            root: Some(RootId { pid: 7, start: 70 }),
            ..rec(key.clone(), None, Some(G1))
        };
        let text = r.render();
        assert!(text.contains("\nroot 7.70\nend\n"), "{text}");
        assert_eq!(ProvenanceRecord::parse(&text, &key), Ok(r));
        // records without a root line (older guards) parse, with no root
        let plain = rec(mem_key(3), Some(1), Some(G0));
        assert!(!plain.render().contains("root"));
        assert_eq!(
            ProvenanceRecord::parse(&plain.render(), &mem_key(3))
                .unwrap()
                .root,
            None
        );
        for bad in ["root 7\n", "root x.1\n", "root 7.70\nroot 7.70\n"] {
            let t = text.replace("root 7.70\n", bad);
            assert!(ProvenanceRecord::parse(&t, &key).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_provenance_inside_a_known_rank_is_refused_while_records_are_lost() {
        use Decision::*;
        let root = RootId { pid: 20, start: 5 };
        let in_rank = [
            me(Some(0), Some(G1), None),
            Importer {
                root: Some(root),
                ..me(None, Some(G1), None)
            },
        ];
        for m in &in_rank {
            assert_eq!(Unknown.after_overflow(m), UnknownOverflow);
            assert_eq!(UnknownStrict.after_overflow(m), UnknownOverflow);
            for d in [
                SameGpu,
                OtherRank,
                OtherJob,
                HostMemory,
                CrossDevice,
                UnknownNoRegistry,
            ] {
                assert_eq!(d.after_overflow(m), d, "a decided case stands: {d:?}");
            }
        }
        // Not a known rank (no GPU, or neither rank nor root): nothing to compare, as before.
        for m in [me(Some(0), None, None), me(None, Some(G1), None)] {
            assert_eq!(Unknown.after_overflow(&m), Unknown);
            assert_eq!(UnknownStrict.after_overflow(&m), UnknownStrict);
        }
        assert!(
            matches!(UnknownOverflow.verdict(None), Verdict::Violation(v) if v.rule == Rule::R3 && v.detail == Detail::UnknownOverflow && v.code == DenyCode::NotPermitted)
        );
        assert!(!UnknownOverflow.verify_after());
        let text = Detail::UnknownOverflow.to_string();
        assert!(
            text.contains(&MAX_RECORDS.to_string()) && text.contains("fix:"),
            "{text}"
        );
    }

    #[test]
    fn the_overflow_mark_lists_live_exporters_and_goes_with_the_last() {
        let t = TempDir::new("overflow");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap();
        let procs = FakeProcs::with(100, 1, u);
        procs
            .0
            .borrow_mut()
            .insert(200, ProcInfo { start: 2, uid: u });
        assert_eq!(reg.overflow(&procs), None, "no mark: nothing lost");
        reg.mark_overflow(100, 1, &procs).unwrap();
        reg.mark_overflow(200, 2, &procs).unwrap();
        reg.mark_overflow(100, 1, &procs).unwrap(); // listed once
        let text = fs::read_to_string(t.0.join(OVERFLOW_MARK)).unwrap();
        assert_eq!(text.matches("exporter 100 1\n").count(), 1, "{text}");
        assert!(text.contains("exporter 200 2\n"), "{text}");
        assert!(
            Key::parse_file_name(OVERFLOW_MARK).is_none(),
            "a sweep keeps it"
        );
        assert_eq!(
            reg.overflow(&procs).map(|o| (o.pid, o.sticky)),
            Some((Some(100), false))
        );
        // One exited, or its pid reused (another start time): the other still holds it.
        procs
            .0
            .borrow_mut()
            .insert(100, ProcInfo { start: 9, uid: u });
        assert_eq!(reg.overflow(&procs).and_then(|o| o.pid), Some(200));
        // The last one exited: its handles died with it, and the mark goes.
        procs.0.borrow_mut().remove(&200);
        assert_eq!(reg.overflow(&procs), None);
        assert!(!t.0.join(OVERFLOW_MARK).exists());
        // A new mark drops the exited entries it finds.
        fs::write(
            t.0.join(OVERFLOW_MARK),
            format!("{OVERFLOW_MAGIC}\nexporter 7 7\nend\n"),
        )
        .unwrap();
        reg.mark_overflow(100, 9, &procs).unwrap();
        let text = fs::read_to_string(t.0.join(OVERFLOW_MARK)).unwrap();
        assert!(
            !text.contains("exporter 7 7") && text.contains("exporter 100 9"),
            "{text}"
        );
    }

    #[test]
    fn an_overflow_mark_past_its_bound_or_unreadable_stays_until_removed() {
        let t = TempDir::new("overflow-sticky");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap();
        let procs = FakeProcs::default();
        for pid in 1..=(OVERFLOW_MAX as u32 + 1) {
            procs
                .0
                .borrow_mut()
                .insert(pid, ProcInfo { start: 3, uid: u });
            reg.mark_overflow(pid, 3, &procs).unwrap();
        }
        let o = reg.overflow(&procs).unwrap();
        assert!(o.sticky && o.path == t.0.join(OVERFLOW_MARK));
        procs.0.borrow_mut().clear();
        assert_eq!(
            reg.overflow(&procs).map(|o| (o.pid, o.sticky)),
            Some((None, true))
        );
        // Garbage where the mark is: set (fail closed), and sticky.
        fs::write(t.0.join(OVERFLOW_MARK), "garbage\n").unwrap();
        assert_eq!(reg.overflow(&procs).map(|o| o.sticky), Some(true));
        assert!(t.0.join(OVERFLOW_MARK).exists());
    }

    // ---- the caches ------------------------------------------------------------------

    impl Registry {
        /// Caches of its own, so that tests running at once do not share the process's.
        fn own_caches(mut self) -> Registry {
            self.known = Box::leak(Box::new(Known::new()));
            self.recently_alive = Box::leak(Box::new(RecentlyAlive::new()));
            self
        }

        /// The digest `write` keeps `rec` under.
        fn digest_of(&self, rec: &ProvenanceRecord) -> u128 {
            let timeless = ProvenanceRecord {
                time: 0,
                ..rec.clone()
            }
            .render();
            digest(&[
                self.dir
                    .join(rec.key.file_name())
                    .as_os_str()
                    .as_encoded_bytes(),
                timeless.as_bytes(),
            ])
        }
    }

    /// Fake processes with a clock, counting the look-ups that reach them.
    struct Clocked<'a> {
        procs: &'a FakeProcs,
        now: std::cell::Cell<Now>,
        asked: std::cell::Cell<u32>,
    }

    impl<'a> Clocked<'a> {
        fn new(procs: &'a FakeProcs, me: u32) -> Clocked<'a> {
            Clocked {
                procs,
                now: std::cell::Cell::new(Now { me, us: 1_000_000 }),
                asked: std::cell::Cell::new(0),
            }
        }
        fn advance(&self, us: u64) {
            let n = self.now.get();
            self.now.set(Now { us: n.us + us, ..n });
        }
    }

    impl Procs for Clocked<'_> {
        fn info(&self, pid: u32) -> Option<ProcInfo> {
            self.asked.set(self.asked.get() + 1);
            self.procs.info(pid)
        }
        fn now(&self) -> Option<Now> {
            Some(self.now.get())
        }
    }

    #[test]
    fn a_slot_being_written_is_a_miss_and_is_not_written_over() {
        let slot: Slot<2> = Slot::new();
        assert_eq!(slot.load(), None, "never written");
        slot.store([7, 8]);
        assert_eq!(slot.load(), Some([7, 8]));
        // A writer in the middle (another thread, an interrupted caller, or a parent that
        // forked meanwhile): readers miss, other writers keep nothing and do not wait.
        let s = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(s + 1, Ordering::Relaxed);
        assert_eq!(slot.load(), None);
        slot.store([9, 9]);
        assert_eq!(slot.words[0].load(Ordering::Relaxed), 7);
        slot.seq.store(s + 2, Ordering::Relaxed);
        assert_eq!(slot.load(), Some([7, 8]));
        slot.clear();
        assert_eq!(
            slot.load(),
            Some([0, 0]),
            "cleared: zeros, which no entry matches"
        );
    }

    #[test]
    fn a_re_export_trusts_its_record_only_while_it_is_the_same_unchanged_file() {
        let t = TempDir::new("known");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().own_caches();
        let procs = FakeProcs::default();
        let r = rec(mem_key(1), Some(0), Some(G0));
        let path = t.0.join(r.key.file_name());
        let d = reg.digest_of(&r);
        reg.write(&r, &procs).unwrap();
        assert!(
            !reg.known.holds(r.pid, d, &path, u),
            "a fresh write keeps nothing: the first re-export reads the file"
        );
        reg.write(&r, &procs).unwrap();
        assert!(
            reg.known.holds(r.pid, d, &path, u),
            "read and found the same: kept"
        );
        // Another process (a fork child writes its own pid) never matches the entry.
        assert!(!reg.known.holds(r.pid + 1, d, &path, u));
        // Another record of the same key (another GPU) is another digest.
        let other = rec(mem_key(1), Some(0), Some(G1));
        assert!(!reg.known.holds(r.pid, reg.digest_of(&other), &path, u));

        // Removed: not trusted, and the re-export writes it again.
        fs::remove_file(&path).unwrap();
        assert!(!reg.known.holds(r.pid, d, &path, u));
        reg.write(&r, &procs).unwrap();
        assert!(ProvenanceRecord::parse(&fs::read_to_string(&path).unwrap(), &r.key).is_ok());
        reg.write(&r, &procs).unwrap();
        assert!(reg.known.holds(r.pid, d, &path, u));

        // Replaced by another file (a rename over it): another inode, read again, rewritten.
        let forged = rec(mem_key(1), Some(0), Some(G1)).render();
        let tmp = t.0.join("other");
        fs::write(&tmp, &forged).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert!(!reg.known.holds(r.pid, d, &path, u));
        reg.write(&r, &procs).unwrap();
        let now = fs::read_to_string(&path).unwrap();
        assert!(now.contains(G0) && !now.contains(G1), "{now}");

        // Changed in place (another size): not the file that was read.
        reg.write(&r, &procs).unwrap();
        assert!(reg.known.holds(r.pid, d, &path, u));
        fs::write(&path, rec(mem_key(1), Some(10), Some(G0)).render()).unwrap();
        assert!(!reg.known.holds(r.pid, d, &path, u));
        reg.write(&r, &procs).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), r.render());

        // Group-writable, or a symbolic link to the very file: not trusted either.
        reg.write(&r, &procs).unwrap();
        assert!(reg.known.holds(r.pid, d, &path, u));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o620)).unwrap();
        assert!(!reg.known.holds(r.pid, d, &path, u));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        reg.write(&r, &procs).unwrap();
        assert!(reg.known.holds(r.pid, d, &path, u));
        let real = t.0.join("real");
        fs::rename(&path, &real).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        assert!(!reg.known.holds(r.pid, d, &path, u));
    }

    #[test]
    fn a_liveness_verdict_is_reused_only_for_the_same_exporter_and_only_briefly() {
        let t = TempDir::new("alive");
        let u = uid();
        let reg = Registry::open(&t.0, u, false).unwrap().own_caches();
        let fake = FakeProcs::with(4242, 777, u);
        let procs = Clocked::new(&fake, 10);
        let r = rec(mem_key(2), Some(0), Some(G0));
        reg.write(&r, &fake).unwrap();
        // Hit: a second look-up inside the window asks /proc nothing.
        assert!(matches!(reg.lookup(&r.key, &procs), Lookup::Found(_)));
        assert_eq!(procs.asked.get(), 1);
        procs.advance(RECENTLY_ALIVE_US - 1);
        assert!(matches!(reg.lookup(&r.key, &procs), Lookup::Found(_)));
        assert_eq!(procs.asked.get(), 1, "hit");
        // Expiry: the window is counted from when it was seen, not renewed by a hit.
        procs.advance(1);
        assert!(matches!(reg.lookup(&r.key, &procs), Lookup::Found(_)));
        assert_eq!(procs.asked.get(), 2, "expired: asked again");
        // Another process (a fork child) does not reuse this one's verdict.
        let child = Clocked::new(&fake, 11);
        child.now.set(Now {
            me: 11,
            ..procs.now.get()
        });
        assert!(matches!(reg.lookup(&r.key, &child), Lookup::Found(_)));
        assert_eq!(child.asked.get(), 1);
        // A clock that went back (another clock, never the same one) is a miss.
        let back = Clocked::new(&fake, 10);
        assert!(matches!(reg.lookup(&r.key, &back), Lookup::Found(_)));
        assert_eq!(back.asked.get(), 1);

        // The pid reused by another process: a record naming its start time is checked,
        // while the old verdict for (4242, 777) is still in the window.
        procs.advance(RECENTLY_ALIVE_US);
        assert!(matches!(reg.lookup(&r.key, &procs), Lookup::Found(_)));
        fake.0
            .borrow_mut()
            .insert(4242, ProcInfo { start: 999, uid: u });
        let reused = ProvenanceRecord {
            start: 999,
            ..rec(mem_key(3), Some(0), Some(G1))
        };
        reg.write(&reused, &fake).unwrap();
        let asked = procs.asked.get();
        assert!(matches!(reg.lookup(&reused.key, &procs), Lookup::Found(_)));
        assert_eq!(procs.asked.get(), asked + 1, "another start time: a miss");
        // That look-up saw 4242 alive with start 999 (and kept that), so a record still
        // naming the old start is forged now, whatever was kept before.
        assert!(matches!(
            reg.lookup(&r.key, &procs),
            Lookup::Skipped(Skip::Forged { pid: 4242 })
        ));

        // Any verdict against a pid empties its slot (here one still true: asked again).
        let asked = procs.asked.get();
        assert!(matches!(reg.lookup(&reused.key, &procs), Lookup::Found(_)));
        assert_eq!(procs.asked.get(), asked + 1);

        // Dead: a look-up that finds the pid dead empties its slot, so the verdict kept for
        // (4242, 999) a moment ago is not reused after it, inside the window or not.
        assert!(reg.recently_alive.holds(procs.now.get(), 4242, 999, u));
        fake.0.borrow_mut().remove(&4242);
        let stale = ProvenanceRecord {
            start: 555,
            ..rec(mem_key(4), Some(0), Some(G0))
        };
        reg.write(&stale, &fake).unwrap();
        assert!(matches!(
            reg.lookup(&stale.key, &procs),
            Lookup::Skipped(Skip::Dead { pid: 4242 })
        ));
        assert!(!reg.recently_alive.holds(procs.now.get(), 4242, 999, u));
        assert!(matches!(
            reg.lookup(&reused.key, &procs),
            Lookup::Skipped(Skip::Dead { pid: 4242 })
        ));
    }

    #[test]
    fn recently_alive_keys_every_field() {
        let c = RecentlyAlive::new();
        let now = Now { me: 5, us: 100 };
        assert!(!c.holds(now, 7, 70, 1), "empty");
        c.keep(now, 7, 70, 1);
        assert!(c.holds(now, 7, 70, 1));
        assert!(!c.holds(now, 7, 71, 1), "another start time");
        assert!(!c.holds(now, 7, 70, 2), "another owner");
        assert!(
            !c.holds(Now { me: 6, ..now }, 7, 70, 1),
            "another asking process"
        );
        assert!(
            !c.holds(now, 7 + CACHE_SLOTS as u32, 70, 1),
            "another pid, same slot"
        );
        assert!(!c.holds(
            Now {
                us: 100 + RECENTLY_ALIVE_US,
                ..now
            },
            7,
            70,
            1
        ));
        c.forget(7 + CACHE_SLOTS as u32);
        assert!(
            c.holds(now, 7, 70, 1),
            "forgetting another pid keeps this one"
        );
        c.forget(7);
        assert!(!c.holds(now, 7, 70, 1));
    }
}

//! The rank root, guard side: at the first `cuInit` of a process that no rank variable
//! names, read `/proc` and the registry for the walk of [`crate::rank_root`], keep the
//! result for the process's lines and records, and leave a rank record for descendants.
//!
//! Cold path only: the walk runs once, inside the R1 check at the first `cuInit` or at the
//! first violation reported before it (`decision_record::record_decision`); afterwards a
//! set value is read.
//! A process that never initialises CUDA (and breaks no rule) never walks. The guarded
//! ancestors its lineage note names (`process::lineage`) are not read, only looked up in the
//! registry where its start-up sweep saw their records; above the note (or without one)
//! it reads each guarded ancestor's stat and environment and those of the first unguarded
//! one, where it ends, or ends at the first rank record (docs/design.md §1, "The walk's
//! cost", "The lineage note").
//!
//! The record it leaves goes with the process: at `exit` and before `exec`
//! ([`drop_record`]), from a path kept in a static buffer (no allocation where a signal,
//! fork or `vfork` child can be). Where the process's start environment already names its
//! rank, the record is owed until a child can start ([`pay_owed`]; docs/design.md §1, "The
//! rank record").
//! Explicit rank variables win: with `RANK`/`SLURM_PROCID`/`OMPI_COMM_WORLD_RANK`/
//! `PMI_RANK` or `RANKGUARD_RANK_GPU` set, nothing here runs and the root stays unset.
//!
//! Fork: the root is kept with the pid that found it. A forked child inherits its parent's
//! value and its lines keep naming it (the child is in that tree), but the child's own R1
//! check walks again: "no root GPU, this process is the root" is the parent's fact, not
//! the child's. No lock is involved: the value is a leaked box behind an atomic pointer.
#![allow(unsafe_code)]

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::config::Config;
use crate::cvd::Visibility;
use crate::guard::output::{debug_log, line};
use crate::guard::process::{lineage, registry_io};
use crate::guard::sys::lifecycle::{Latch, PerProcess, PidValue};
use crate::guard::sys::signal_safe::{self, RawFile};
use crate::policy::Unreadable;
use crate::rank_root::{
    self, Ancestor, EnvFacts, EnvScan, ProcView, RankRecord, RootGpu, RootId, Stat,
};
use crate::rankgpu;
use crate::registry::{self, Key, Location, Lookup, ProcFs, ProvenanceRecord, Registry};
use rankguard_core::record::RootRef;
use std::borrow::Cow;

/// Largest `/proc/<pid>/environ` read (ARG_MAX-sized environments fit).
const MAX_ENVIRON: u64 = 8 << 20;

/// This process's rank root.
#[derive(Debug)]
pub struct Root {
    pid: u32,
    /// The root's start time when it is an ancestor; 0 when it is the process that found
    /// it, whose own start time is read only when something asks ([`Root::id`]): the walk
    /// itself never needs it (docs/design.md §1, "The walk's cost").
    start: u64,
    /// The rank GPU as the root's evidence names it; None when this process is the root
    /// (its own GPU is the rank's).
    pub gpu: Option<RootGpu>,
    /// The process that found it.
    by: u32,
    /// Whether the finder's start environment preloads the guard (`lineage::start_facts`):
    /// a descendant's walk reads it then, rather than ending at it.
    started_guarded: bool,
}

impl Root {
    /// The root by pid and start time; None when the root is the process that found it and
    /// its stat cannot be read now (the fd table full), or is the parent this process was
    /// forked from and was not read before the fork (never: [`before_fork`] reads it).
    pub fn id(&self) -> Option<RootId> {
        let start = match self.start {
            0 => start_of(self.by)?,
            s => s,
        };
        Some(RootId {
            pid: self.pid,
            start,
        })
    }
}

/// The start time of the process it names, read from its stat when first asked: this
/// process's (its records', `decide::ipc`'s too), or in a fork child its parent's, inherited
/// (the root it keeps naming until its own walk).
static OWN_START: PidValue = PidValue::new();

/// The start time of process `pid` when it is this process or its parent (a fork child
/// naming the root its parent found, the `vfork` child writing its parent's record), read
/// once and kept (a fork child inherits the value its parent kept); None for another
/// process or when unreadable. Plain system calls, no allocation: [`before_fork`] and a
/// `vfork` child call it.
pub(crate) fn start_of(pid: u32) -> Option<u64> {
    if let Some(start) = OWN_START.get(pid) {
        return Some(start);
    }
    let own = pid == signal_safe::pid();
    if !own && pid != signal_safe::ppid() {
        return None;
    }
    let mut line = [0u8; 1024];
    let (n, _) = lineage::read_stat(pid, &mut line)?;
    // The parent ended while its stat was read: the pid may be another process's now.
    if !own && signal_safe::ppid() != pid {
        return None;
    }
    let start = rank_root::parse_stat(std::str::from_utf8(line.get(..n)?).ok()?)?.start;
    OWN_START.set(pid, start);
    Some(start)
}

/// `pthread_atfork`'s prepare handler (registered once per image by the first walk that
/// found its own process the root): the rank record owed is written before the child can
/// walk ([`pay_owed`]), and the child inherits the root's start time already read, since
/// it cannot read its parent's stat once the parent has exited.
extern "C" fn before_fork() {
    let _ = std::panic::catch_unwind(|| {
        pay_owed(false);
        if let Some(r) = mine() {
            if r.start == 0 {
                let _ = start_of(r.by);
            }
        }
    });
}

/// [`before_fork`] is registered (once per image: a fork child inherits the registration).
static FORK_HOOK: Latch = Latch::new();

/// A `Box<Root>` leaked on purpose (once per process that walks), or null.
static ROOT: AtomicPtr<Root> = AtomicPtr::new(ptr::null_mut());

/// The walk's outcome as a sentence in the debug log (DEBUG).
fn say_walk(ancestor: Option<&Ancestor>) {
    match ancestor {
        Some(a) => debug_log::log!(
            Debug,
            "rank root: ancestor pid {} (started at {}) is this process's rank root, on rank GPU {}, found by its {}",
            a.root.pid,
            a.root.start,
            a.gpu.text(),
            if a.by_record { "rank record in the registry" } else { "initial environment" }
        ),
        None => debug_log::log!(
            Debug,
            "rank root: no guarded ancestor was given a single-entry CUDA_VISIBLE_DEVICES, so this process is its own rank root"
        ),
    }
}

/// The rank root, once found here or in the parent this process was forked from.
pub fn current() -> Option<&'static Root> {
    let p = ROOT.load(Ordering::Acquire);
    // SAFETY: a non-null ROOT comes from Box::leak in `establish` and is never freed or
    // written through, so it is a valid &'static Root.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The rank root this process found itself (not one inherited across fork).
fn mine() -> Option<&'static Root> {
    current().filter(|r| r.by == signal_safe::pid())
}

pub fn id() -> Option<RootId> {
    current().and_then(Root::id)
}

/// Whether the rank is for this module to find: no rank variable and no launcher's rank GPU
/// (set at all, even empty: the R1 check then fails closed on it, as `init_check` decides).
pub fn applies(cfg: &Config) -> bool {
    cfg.rank.is_none() && signal_safe::getenv_bytes("RANKGUARD_RANK_GPU").is_none()
}

/// The real `/proc`, and the registry for rank records (opened once per walk). Per
/// ancestor it reads `/proc/<pid>/stat` (whose owner is the process's, so no second look-up
/// for [`ProcView::uid`]) and the environment (by [`VmReader`], else `/proc/<pid>/environ`,
/// in pieces, up to the variables the decision needs), and looks its rank record up in the
/// registry unless the start-up sweep saw none.
pub(crate) struct ProcFsView {
    /// The registry, verified and swept at its opening: its sweep's listing answers every
    /// look-up after the first.
    reg: Option<Option<Registry>>,
    /// The walk's first rank-record look-up went by name (one `open`), without the sweep.
    named: bool,
    /// The first read that failed for a reason other than the process being gone or not
    /// ours to read (EMFILE with the fd table full, ENOMEM, EIO): the walk is incomplete.
    failed: Option<Unreadable>,
    /// The owner of the last `/proc/<pid>/stat` read: (pid, uid).
    owner: Option<(u32, u32)>,
    /// Where the initial environment of the last process whose stat was read lies in its
    /// memory (pid, start, end; fields 50 and 51 of the stat line), for [`VmReader`].
    env_at: Option<(u32, u64, u64)>,
    /// One buffer for every environment read of the walk.
    buf: Vec<u8>,
    /// This process's own stat as the walk takes it: its parent from `getppid`, its start
    /// time bounded by the time now ([`rank_root::start_bound`]; its stat is not read).
    own: Option<(u32, Stat)>,
    /// That parent (0: none): its stat read is kept only when `getppid` still names it
    /// afterwards, which stands for the start-time check the walk cannot make.
    parent: u32,
    /// Environments are scanned for the rank's marks too (the rank's top, `end_rank`):
    /// read whole, not up to the walk's two variables.
    marks: bool,
}

/// Bytes asked of `/proc/<pid>/environ` by the first read: one page, which the kernel
/// copies (a 64 KiB environment asked whole is sixteen pages copied, and as many pages of a
/// fresh buffer zeroed and faulted in). The variables the scan wants are often among the
/// first entries (a launcher's own, or a shell's `export` of them, come early), and the scan
/// stops reading once they are seen; when it goes on, later reads ask [`ENVIRON_PIECE`].
const FIRST_PIECE: usize = 4 << 10;

/// Bytes asked of `/proc/<pid>/environ` by each read after the first (at most: an entry
/// cut by the last read is kept at the buffer's front): a large environment in a few reads.
const ENVIRON_PIECE: usize = 8 << 10;

impl ProcFsView {
    /// `r`'s value; on an error, None, remembering one that leaves the walk incomplete.
    fn read<T>(&mut self, pid: u32, file: &'static str, r: std::io::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(0);
                // Gone (ENOENT, ESRCH) or another user's (EACCES, EPERM): the walk stops
                // there by its own rules. Anything else is a read that did not happen.
                if ![libc::ENOENT, libc::ESRCH, libc::EACCES, libc::EPERM].contains(&errno) {
                    self.failed.get_or_insert(Unreadable { pid, file, errno });
                }
                None
            }
        }
    }

    /// `/proc/<pid>/stat` in one read (a stat line is far shorter than the buffer), and
    /// the file's owner when `owner` (0 when not asked: this process's own stat, whose
    /// owner the walk never asks).
    fn stat_line(path: &str, out: &mut [u8; 1024], owner: bool) -> std::io::Result<(usize, u32)> {
        let mut f = RawFile::open(path)?;
        let uid = if owner { f.owner()? } else { 0 };
        let n = f.read(out)?;
        Ok((n, uid))
    }

    /// Scan `/proc/<pid>/environ` piece by piece until its variables are seen or it ends.
    fn scan_environ(&mut self, pid: u32) -> std::io::Result<EnvFacts> {
        let scan = if self.marks {
            EnvScan::with_marks()
        } else {
            EnvScan::default()
        };
        let scan = scan.finding_nul_with(signal_safe::first_nul);
        if let Some((_, at, end)) = self.env_at.filter(|e| e.0 == pid) {
            let reader = VmReader { pid, at, end };
            if let Ok(facts) = scan_environ_reads(
                reader,
                scan.clone(),
                &mut self.buf,
                FIRST_PIECE,
                ENVIRON_PIECE,
            ) {
                return Ok(facts);
            }
        }
        scan_environ_file(&format!("/proc/{pid}/environ"), scan, &mut self.buf)
    }
}

/// The initial environment of process `pid`, read from its memory by `process_vm_readv`
/// (the bytes `/proc/<pid>/environ` reads, from the range its stat line gives): one system
/// call a piece, no file opened and closed, and the kernel copies the pages in one pass
/// where its `environ` file copies them page by page through a buffer of its own. Any
/// error (`EPERM`: Yama's `ptrace_scope` or a non-dumpable process, which the file may
/// still allow; `ESRCH`; `EFAULT`; `ENOSYS`) and any short copy of a piece fails the scan,
/// and the caller reads the file instead, whose answer decides.
struct VmReader {
    pid: u32,
    at: u64,
    end: u64,
}

impl Read for VmReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.end - self.at).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: want,
        };
        let remote = libc::iovec {
            iov_base: self.at as *mut libc::c_void,
            iov_len: want,
        };
        // SAFETY: `local` describes `want` bytes of `buf`, which this call may write; the
        // remote range is only read, in process `pid`, by the kernel, which checks it. A
        // system call through `syscall` (no symbol of its own for the loader to bind).
        let n = unsafe {
            libc::syscall(
                libc::SYS_process_vm_readv,
                self.pid as libc::pid_t,
                &local as *const libc::iovec,
                1usize,
                &remote as *const libc::iovec,
                1usize,
                0usize,
            )
        };
        match usize::try_from(n) {
            Ok(n) if n == want => {
                self.at += n as u64;
                Ok(n)
            }
            // A short copy: a page of the range is not mapped there (the file would say
            // what it reads): not an answer.
            Ok(_) => Err(std::io::Error::from_raw_os_error(libc::EFAULT)),
            Err(_) => Err(std::io::Error::last_os_error()),
        }
    }
}

/// Scan an environment file (`/proc/<pid>/environ`) with `scan`, in reads into `buf` of
/// up to [`FIRST_PIECE`] and then [`ENVIRON_PIECE`] bytes, until the scan is done or the
/// file ends (at most [`MAX_ENVIRON`] bytes). The start environment (`start_env`) is read
/// this way too, up to its first CVD. `buf` is zeroed when it is sized (later reads
/// overwrite it) and kept by the caller for the next file (the walk reads one per
/// ancestor): an entry cut by a read moves to its front; one longer than it doubles it.
pub(crate) fn scan_environ_file(
    path: &str,
    scan: EnvScan,
    buf: &mut Vec<u8>,
) -> std::io::Result<EnvFacts> {
    let f = RawFile::open(path)?;
    scan_environ_reads(f, scan, buf, FIRST_PIECE, ENVIRON_PIECE)
}

/// [`scan_environ_file`]'s reads of an open file `f` (any reader, for the unit tests), the
/// first of at most `first` bytes, the later ones into a buffer of at least `piece`.
fn scan_environ_reads(
    mut f: impl Read,
    mut scan: EnvScan,
    buf: &mut Vec<u8>,
    first: usize,
    piece: usize,
) -> std::io::Result<EnvFacts> {
    // Sized once for every piece: a buffer grown after its first read is copied and its
    // new part zeroed (memset and page faults); a fresh one from `calloc` is neither.
    if buf.len() < first.max(piece) {
        *buf = vec![0; first.max(piece)];
    }
    let mut kept = 0;
    let mut total = 0u64;
    loop {
        if kept == buf.len() {
            buf.resize(2 * kept, 0);
        }
        // The first read asks `first` bytes even of a buffer a previous file grew.
        let want = if total == 0 {
            first.min(buf.len())
        } else {
            buf.len() - kept
        };
        let n = loop {
            // `get` (never None: kept < len): an index keeps a panic location, a relocation
            // (test_startup_cost.py); so below.
            match f.read(buf.get_mut(kept..kept + want).unwrap_or_default()) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        let end = kept + n;
        total += n as u64;
        // The kernel fills a read of environ up to its end: a short read is the end.
        let last = n < want || total >= MAX_ENVIRON;
        let used = scan.feed(buf.get(..end).unwrap_or_default(), last);
        if last || scan.done() {
            return Ok(scan.finish());
        }
        // the entry the read cut (shorter than one entry) to the front
        kept = end.saturating_sub(used);
        for i in 0..kept {
            let b = buf.get(used + i).copied().unwrap_or(0);
            if let Some(d) = buf.get_mut(i) {
                *d = b;
            }
        }
        // The environment goes on past the first read: read on in larger pieces.
        if buf.len() < piece {
            buf.resize(piece, 0);
        }
    }
}

impl ProcFsView {
    /// A view for the rank's top (`end_rank`): environments scanned for the marks.
    pub(crate) fn new() -> ProcFsView {
        ProcFsView {
            reg: None,
            named: false,
            failed: None,
            owner: None,
            env_at: None,
            buf: Vec::new(),
            own: None,
            parent: 0,
            marks: true,
        }
    }
}

impl ProcView for ProcFsView {
    fn stat(&mut self, pid: u32) -> Option<Stat> {
        if let Some((_, st)) = self.own.filter(|(me, _)| *me == pid) {
            return Some(st);
        }
        let mut line = [0u8; 1024];
        let r = Self::stat_line(&format!("/proc/{pid}/stat"), &mut line, true);
        let (n, uid) = self.read(pid, "stat", r)?;
        // The parent ended while its stat was read (this process was re-parented, and the
        // pid may be another process's now): as gone (rank_root::start_bound).
        if pid == self.parent && signal_safe::ppid() != pid {
            return None;
        }
        self.owner = Some((pid, uid));
        let text = std::str::from_utf8(line.get(..n)?).ok()?;
        self.env_at = rank_root::parse_stat_env(text).map(|(at, end)| (pid, at, end));
        rank_root::parse_stat(text)
    }
    fn uid(&mut self, pid: u32) -> Option<u32> {
        match self.owner {
            // The walk's shortcut: the stat file's owner, read with the stat. The rank's top
            // (`end_rank`, `marks`) asks the process's directory itself before it signals
            // anything: a process that changed its uid (setuid, not dumpable) must read as
            // not ours there (test_end_rank.py, the other user's process).
            Some((p, uid)) if p == pid && !self.marks => Some(uid),
            _ => fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid()),
        }
    }
    fn environ(&mut self, pid: u32) -> Option<EnvFacts> {
        let r = self.scan_environ(pid);
        self.read(pid, "environ", r)
    }
    fn record(&mut self, id: RootId) -> Option<RankRecord> {
        // The first look-up by name alone: a walk that asks one (its parent's, the usual
        // case under plain LD_PRELOAD) costs one `open`, not the directory's whole read.
        if self.reg.is_none() && !self.named {
            self.named = true;
            return trusted_record(&registry_io::open_registry_unswept()?, id);
        }
        let reg = self.swept()?;
        // The start-up sweep of this registry read the whole directory a moment ago: a pid
        // it saw no rank record of is not looked up (docs/design.md §1, "The walk's cost").
        if reg.no_rank_record(id.pid) {
            return None;
        }
        trusted_record(reg, id)
    }
    fn may_have_record(&mut self, pid: u32) -> bool {
        // As `record` asks: the first by name, the rest from the sweep's listing. A record
        // found here is read again, whole and checked, by `record`.
        if self.reg.is_none() && !self.named {
            self.named = true;
            return registry_io::open_registry_unswept()
                .is_some_and(|r| !matches!(r.lookup(&Key::rank(pid), &ProcFs), Lookup::Missing));
        }
        self.swept().is_some_and(|r| !r.no_rank_record(pid))
    }
}

impl ProcFsView {
    /// The registry opened, verified and swept once for the rest of the walk.
    fn swept(&mut self) -> Option<&Registry> {
        self.reg
            .get_or_insert_with(registry_io::open_registry)
            .as_ref()
    }
}

/// The rank record of the live process `id` in `reg`, when it is one to trust.
fn trusted_record(reg: &Registry, id: RootId) -> Option<RankRecord> {
    match reg.lookup(&Key::rank(id.pid), &ProcFs) {
        // lookup checked that pid `id.pid` is alive, ours, and started at rec.start
        Lookup::Found(rec) if rec.start == id.start => Some(RankRecord {
            root: rec.root?,
            gpu: rec.gpu?,
        }),
        Lookup::Found(_) | Lookup::Missing => None,
        Lookup::Skipped(skip) => {
            debug_log::log!(Debug, "rank record not trusted: {skip} pid={}", id.pid);
            None
        }
    }
}

/// This process's rank root, found on first use: at the first `cuInit`, or at a violation
/// reported before it (a `cudaSetDevice(2)` denied before the runtime initialised). None
/// when rank variables name the rank ([`applies`]) or the walk could not finish.
/// Never called from [`crate::guard::audit::decision_record::prefix`]: the walk may say a registry problem, whose
/// line calls `prefix`, which reads [`current`] only.
pub fn ensure(cfg: &Config) -> Option<&'static Root> {
    ensure_checked(cfg).ok().flatten()
}

/// [`ensure`], saying when the walk could not read `/proc` (the R1 check fails closed
/// then: issue 29, item 2). Not kept: a later call walks again.
pub fn ensure_checked(cfg: &Config) -> Result<Option<&'static Root>, Unreadable> {
    ensure_at_init(cfg).0
}

/// The registry a walk opened (verified and swept at its start by `registry_io`), handed
/// from the R1 check's walk to its [`publish`], which writes through it instead of verifying
/// the directory a second time within the same check (docs/design.md §1, "The walk's cost").
/// Empty when no walk ran or it opened none (then `publish` opens the registry itself).
pub struct Opened(Option<Registry>);

/// [`ensure_checked`] for the R1 check, with the registry the walk opened for its
/// [`publish`].
pub fn ensure_at_init(cfg: &Config) -> (Result<Option<&'static Root>, Unreadable>, Opened) {
    if let Some(r) = mine() {
        return (Ok(Some(r)), Opened(None));
    }
    if !applies(cfg) {
        return (Ok(None), Opened(None));
    }
    let mut reg = None;
    let root = establish(&mut reg);
    (root, Opened(reg))
}

/// Walk, and keep in `opened` the registry the walk opened and verified (if it did).
fn establish(opened: &mut Option<Registry>) -> Result<Option<&'static Root>, Unreadable> {
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let me = signal_safe::pid();
        // Not its own stat (docs/design.md §1, "The walk's cost"): its parent by `getppid`,
        // checked again after the parent's stat is read, and its start time bounded by the
        // time now (rank_root::start_bound).
        let ppid = signal_safe::ppid();
        let mut view = ProcFsView {
            reg: None,
            named: false,
            failed: None,
            owner: None,
            env_at: None,
            buf: Vec::new(),
            own: Some((
                me,
                Stat {
                    ppid,
                    start: rank_root::start_bound(
                        signal_safe::boot_ns(),
                        // SAFETY: getauxval has no preconditions.
                        unsafe { libc::getauxval(libc::AT_CLKTCK) },
                    ),
                },
            )),
            parent: ppid,
            marks: false,
        };
        // The guarded ancestors the lineage note names are not read (docs/design.md §1).
        let defs = lineage::start_facts();
        let note = defs
            .as_ref()
            .and_then(|d| d.note)
            .and_then(crate::lineage::parse);
        let ancestor = rank_root::find_with(me, signal_safe::euid(), note, &mut view);
        *opened = view.reg.take().flatten();
        say_walk(ancestor.as_ref());
        if let Some(u) = view.failed {
            return Err(u);
        }
        let started_guarded = defs.is_some_and(|d| d.guarded());
        Ok(Some(match ancestor {
            Some(Ancestor { root, gpu, .. }) => Root {
                pid: root.pid,
                start: root.start,
                gpu: Some(gpu),
                by: me,
                started_guarded,
            },
            None => Root {
                pid: me,
                start: 0,
                gpu: None,
                by: me,
                started_guarded,
            },
        }))
    }));
    let r = match found {
        Ok(Ok(Some(r))) => r,
        Ok(Err(u)) => return Err(u),
        Ok(Ok(None)) | Err(_) => return Ok(None),
    };
    let old = ROOT.load(Ordering::Acquire);
    if let Some(first) = mine() {
        return Ok(Some(first)); // another thread of this process found it meanwhile
    }
    let new: &'static mut Root = Box::leak(Box::new(r));
    match ROOT.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            line::set_root_pid(new.pid);
            if new.start == 0 && FORK_HOOK.first() {
                // SAFETY: `before_fork` is a plain extern "C" function of this library, which
                // is never unloaded once CUDA was initialised through it; it makes system
                // calls only (no lock, no allocation), as a prepare handler may.
                unsafe { libc::pthread_atfork(Some(before_fork), None, None) };
            }
            Ok(Some(new))
        }
        // Lost a race with another thread of this process (its value is kept; this box
        // stays leaked, at most once per racing thread).
        Err(_) => Ok(mine()),
    }
}

/// Whether the one GPU this process sees is the rank root's (None: this process is the
/// root, or there is no root).
pub fn is_rank_gpu(own_uuid: &str, vis: &Visibility) -> Option<bool> {
    let gpu = mine()?.gpu.as_ref()?;
    // The launcher's rule (crate::rankgpu, shared with `rankguard check`): a full UUID is
    // compared with the driver's; an index or prefix entry only with this process's own.
    let uuid = match gpu {
        RootGpu::Uuid(u) => Some(u.as_bytes()),
        RootGpu::Entry(_) => None,
    };
    Some(rankgpu::decide(gpu.text().as_bytes(), uuid, own_uuid, vis.entries()).is_same())
}

/// The rank GPU for reports: the root's, when it is an ancestor.
pub fn rank_gpu() -> Option<&'static str> {
    current()?.gpu.as_ref().map(RootGpu::text)
}

/// Leave this process's rank record for its descendants: its root and the rank GPU's UUID
/// (`own_uuid` when this process sees the rank's GPU, else the root's recorded one).
/// Problems with the registry are said once (`registry_io`); never fails the caller.
///
/// Where the start environment already tells a descendant's walk the same root, the record
/// is owed instead, written only when a descendant can start ([`pay_owed`];
/// docs/design.md §1, "The rank record"): a process that preloads the guard from its start
/// and is its own root by the single-entry CVD it was started with (`started_on_it`: the GPU
/// it sees) is what a walk that reaches it finds in its environment. The record still ends
/// such a walk, with the GPU's UUID (a child that names the GPU another way, a record-only
/// rank above that initialised CUDA later), so it is written before any child of this
/// process can walk; a process that starts none (most CUDA processes) writes none.
pub fn publish(
    cfg: &Config,
    own_uuid: &str,
    sees_rank_gpu: bool,
    started_on_it: bool,
    opened: Opened,
) {
    let Some(root) = mine() else { return };
    let mut opened = opened.0;
    if root.gpu.is_none() && root.started_guarded && started_on_it && !own_uuid.is_empty() {
        let reg = opened.take().or_else(registry_io::open_registry_unswept);
        if let Some(reg) = reg.filter(|reg| owe(cfg, own_uuid, reg.dir())) {
            debug_log::log!(
                Debug,
                "rank record owed: written before this process starts a child ({})",
                reg.dir().display()
            );
            return;
        }
    }
    let gpu = match (&root.gpu, sees_rank_gpu) {
        (_, true) if !own_uuid.is_empty() => own_uuid.to_string(),
        (Some(RootGpu::Uuid(u)), _) => u.clone(),
        _ => return,
    };
    let _ = std::panic::catch_unwind(|| {
        let reg = match opened {
            Some(reg) => reg,
            None => registry_io::open_registry()?,
        };
        let id = root.id()?;
        let rec = ProvenanceRecord {
            key: Key::rank(root.by),
            job: cfg.job.as_deref().map(registry::job_token),
            rank: None,
            pid: root.by,
            start: start_of(root.by)?,
            gpu: Some(gpu),
            location: Location::Device,
            time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            root: Some(id),
        };
        match reg.write(&rec, &ProcFs) {
            Ok(()) => {
                debug_log::log!(Debug, "recorded this process's rank root={id}");
                drop_at_end(&reg.dir().join(rec.key.file_name()));
            }
            Err(problem) => registry_io::said_write_problem(
                reg.dir(),
                &problem,
                "this process's rank is not recorded, so a process it starts cannot name it as its rank root unless its environment does",
            ),
        }
        Some(())
    });
}

/// A root as a record names it, on `host`: the node's host name, which the caller (a record
/// of this process) has already (the walk never leaves the node, and asks no `uname` of
/// its own: a first `cuInit` that writes no record and no line makes none).
pub fn as_ref<'a>(r: &Root, host: &'a str) -> Option<RootRef<'a>> {
    let id = r.id()?;
    Some(RootRef {
        pid: id.pid,
        start: id.start,
        host: Some(Cow::Borrowed(host)),
    })
}

// This process's rank record, removed when the process ends

/// The path of this process's rank record, NUL-terminated, in an allocation made where
/// allocating is allowed (the R1 check) and kept for the life of the image, for a removal
/// that must not allocate (an exit handler, an `exec` shim in a `vfork` child or a signal
/// handler). In the heap, not a static: a first `cuInit` then touches no page of the
/// library's `.bss` for it (each a page fault of its own). Null: none yet.
static RECORD_PATH: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

/// Longest record path kept (a registry path is far shorter).
const RECORD_PATH_MAX: usize = 4096;

/// The process that wrote the record at RECORD_PATH (none: no record). A forked child
/// finds it marked by another pid and so never removes the parent's record; its own
/// `cuInit` records its own.
static RECORD_OWNER: PerProcess = PerProcess::new();
/// The `atexit` handler is registered (once per image: a fork child inherits it).
static EXIT_HOOK: Latch = Latch::new();

/// Keep `path` as RECORD_PATH (NUL-terminated); false when it cannot be one. Called while
/// RECORD_OWNER is clear (no remover reads it), by the R1 check's thread (once per process,
/// under INIT_CHECK); the allocation before it, if any, stays (a fork child's, whose parent
/// may still remove its own record through it).
fn keep_path(path: &[u8]) -> bool {
    if path.len() >= RECORD_PATH_MAX || path.contains(&0) {
        return false;
    }
    let mut kept = Vec::with_capacity(path.len() + 1);
    kept.extend_from_slice(path);
    kept.push(0);
    RECORD_PATH.store(
        Box::leak(kept.into_boxed_slice()).as_mut_ptr(),
        Ordering::Release,
    );
    true
}

/// RECORD_PATH's bytes, without the NUL.
fn kept_path() -> Option<&'static [u8]> {
    let p = RECORD_PATH.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null RECORD_PATH is a leaked NUL-terminated allocation (keep_path),
    // never freed.
    Some(unsafe { std::ffi::CStr::from_ptr(p.cast()) }.to_bytes())
}

/// Remember the record just written so that it goes when this process ends: at `exit`
/// (an `atexit` handler, registered once per image) or before an `exec` (`hooks::exec`
/// calls [`drop_record`]). A process that dies by a signal or `_exit` leaves
/// it to the bounded sweeps (`registry_io`, the record's liveness check at every look-up).
fn drop_at_end(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    RECORD_OWNER.clear();
    if !keep_path(path.as_os_str().as_bytes()) {
        return;
    }
    RECORD_OWNER.mark(signal_safe::pid());
    exit_hook();
}

/// Register the exit handler that removes the record (once per image).
fn exit_hook() {
    if EXIT_HOOK.first() {
        // SAFETY: `at_exit` is a plain extern "C" function of this library, which stays
        // loaded (it interposes the process's CUDA calls); it only calls unlink(2).
        unsafe { libc::atexit(at_exit) };
    }
}

extern "C" fn at_exit() {
    drop_record();
}

/// Remove this process's rank record now, if this process wrote one. Async-signal-safe:
/// two atomic operations, `getpid` and `unlink`, nothing allocated or locked.
pub fn drop_record() {
    if RECORD_OWNER.take_in(signal_safe::pid()) {
        let p = RECORD_PATH.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: a non-null RECORD_PATH is a NUL-terminated path (keep_path).
            unsafe { libc::unlink(p.cast()) };
        }
    }
}

// The rank record owed (docs/design.md §1, "The rank record")

/// The process that owes its rank record (0: none), written before it starts a child.
static OWED_BY: AtomicU32 = AtomicU32::new(0);

/// What the owed record says beyond its writer's pid and start time.
struct OwedParts {
    gpu: String,
    job: Option<String>,
}

/// The owed record's parts, a leaked allocation made by [`owe`] before OWED_BY is marked
/// (Release) and read by [`pay_owed`] after it saw the mark (Acquire) and claimed it, so
/// never while being written; in the heap for the reason RECORD_PATH is. Null: none.
static OWED: AtomicPtr<OwedParts> = AtomicPtr::new(ptr::null_mut());

/// Owe this process's rank record (its own root, on `own_uuid`) in registry `dir`: keep
/// what it will say and where it goes, and register the exit handler that removes it once
/// written. False when it cannot be kept (the caller writes it now).
fn owe(cfg: &Config, own_uuid: &str, dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let me = signal_safe::pid();
    if !FORK_HOOK.done() {
        return false;
    }
    OWED_BY.store(0, Ordering::Release);
    RECORD_OWNER.clear();
    if !keep_path(dir.join(Key::rank(me).file_name()).as_os_str().as_bytes()) {
        return false;
    }
    let parts = Box::new(OwedParts {
        gpu: own_uuid.to_string(),
        job: cfg.job.as_deref().map(registry::job_token),
    });
    OWED.store(Box::leak(parts), Ordering::Release);
    exit_hook();
    OWED_BY.store(me, Ordering::Release);
    true
}

/// Write the rank record this process owes, before a descendant can walk: at a `fork`
/// (`before_fork`), a `posix_spawn` and an `exec` (`hooks::exec`). An `exec` in the owing
/// process itself (`exec`: true) replaces it, so nothing is owed any more; one in its
/// `vfork` child (Python's `subprocess`, dash), which shares its memory, writes the record
/// for it, by system calls alone (nothing allocated or locked), and leaves its removal to it.
/// A child forked without the prepare handler (a raw `clone`) writes it too, but its parent
/// never learns so and leaves it to the sweeps. One atomic load where nothing is owed.
pub fn pay_owed(exec: bool) {
    let owner = OWED_BY.load(Ordering::Acquire);
    if owner == 0 {
        return;
    }
    let me = signal_safe::pid();
    if (me == owner && exec) || (me != owner && signal_safe::ppid() != owner) {
        return;
    }
    if OWED_BY
        .compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return; // another thread pays it
    }
    if write_owed(owner, me).is_some() {
        RECORD_OWNER.mark(owner);
    }
}

/// The owed record of process `owner` at RECORD_PATH, through a temporary file named by
/// `me` (the registry's `.tmp.<pid>.<seq>.<secs>`, which its sweeps read), renamed over it.
fn write_owed(owner: u32, me: u32) -> Option<()> {
    use rankguard_core::record::FixedWriter;
    let start = start_of(owner)?;
    // SAFETY: the caller claimed OWED_BY, after owe stored the parts (a leaked Box, never
    // freed or written again).
    let parts = unsafe { OWED.load(Ordering::Acquire).as_ref() }?;
    let secs = signal_safe::now_us() / 1_000_000;
    let mut text = [0u8; 1024];
    let mut w = FixedWriter::new(&mut text);
    ProvenanceRecord::write_rank(&mut w, owner, start, parts.job.as_deref(), &parts.gpu, secs)
        .ok()?;
    if w.overflowed() {
        return None;
    }
    let path = kept_path()?;
    let dir = path.iter().rposition(|&b| b == b'/')?;
    let mut tmp = [0u8; RECORD_PATH_MAX + 48];
    let mut tw = FixedWriter::new(&mut tmp);
    let dir_text = std::str::from_utf8(path.get(..dir)?).ok()?;
    std::fmt::Write::write_fmt(&mut tw, format_args!("{dir_text}/.tmp.{me}.0.{secs}\0")).ok()?;
    if tw.overflowed() {
        return None;
    }
    let bytes = w.as_bytes();
    // SAFETY: `tmp` is a NUL-terminated path on our stack, RECORD_PATH's a NUL-terminated
    // allocation (keep_path); `bytes` is ours to read for its length. System calls by the
    // instruction (nothing for the loader to bind in a `vfork` child).
    unsafe {
        let tmp = tw.as_bytes().as_ptr() as usize;
        let fd = signal_safe::raw_syscall(
            libc::SYS_openat,
            libc::AT_FDCWD as usize,
            tmp,
            (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                as usize,
            0o600,
        );
        if fd < 0 {
            return None;
        }
        let fd = fd as usize;
        let n =
            signal_safe::raw_syscall(libc::SYS_write, fd, bytes.as_ptr() as usize, bytes.len(), 0);
        signal_safe::raw_syscall(libc::SYS_close, fd, 0, 0, 0);
        let target = RECORD_PATH.load(Ordering::Acquire) as usize;
        if usize::try_from(n).ok() != Some(bytes.len())
            || signal_safe::raw_syscall(libc::SYS_rename, tmp, target, 0, 0) != 0
        {
            signal_safe::raw_syscall(libc::SYS_unlink, tmp, 0, 0, 0);
            return None;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that gives what it is asked for, as procfs does for environ (a short read is
    /// the end), and remembers the size of each request.
    struct Procfs<'a> {
        left: &'a [u8],
        asked: Vec<usize>,
    }

    impl Read for Procfs<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            self.asked.push(out.len());
            let n = out.len().min(self.left.len());
            out[..n].copy_from_slice(&self.left[..n]);
            self.left = &self.left[n..];
            Ok(n)
        }
    }

    fn environ(entries: &[String]) -> Vec<u8> {
        entries.iter().flat_map(|e| e.bytes().chain([0])).collect()
    }

    /// `pad` entries of `len` bytes, then CUDA_VISIBLE_DEVICES, LD_PRELOAD and the marks,
    /// then `tail` more padding.
    fn env_with(pad: usize, len: usize, tail: usize) -> Vec<u8> {
        let mut e: Vec<String> = (0..pad)
            .map(|i| format!("P{i:03}={}", "x".repeat(len)))
            .collect();
        e.push("CUDA_VISIBLE_DEVICES=GPU-1234".into());
        e.push("LD_PRELOAD=/opt/librankguard.so".into());
        e.push("RANK=3".into());
        e.extend((0..tail).map(|i| format!("T{i:03}={}", "y".repeat(len))));
        environ(&e)
    }

    fn scan(
        bytes: &[u8],
        kind: fn() -> EnvScan,
        first: usize,
        buf: &mut Vec<u8>,
    ) -> (EnvFacts, Vec<usize>) {
        scan_in(bytes, kind, first, ENVIRON_PIECE, buf)
    }

    fn scan_in(
        bytes: &[u8],
        kind: fn() -> EnvScan,
        first: usize,
        piece: usize,
        buf: &mut Vec<u8>,
    ) -> (EnvFacts, Vec<usize>) {
        let mut f = Procfs {
            left: bytes,
            asked: Vec::new(),
        };
        let facts =
            scan_environ_reads(&mut f, kind(), buf, first, piece).expect("reads never fail here");
        (facts, f.asked)
    }

    #[test]
    fn pieces_give_what_one_whole_read_gives() {
        // Entries cut by the first read and by later ones, entries longer than a piece,
        // variables early, late and after the first piece; small `first` sizes cut often.
        let envs = [
            env_with(0, 10, 0),
            env_with(3, 10, 50),
            env_with(40, 100, 40),
            env_with(70, 1000, 10),
            env_with(2, 40_000, 2),
            environ(&[]),
            environ(&["A=1".into()]),
        ];
        // (the scan, whether it reads LD_PRELOAD, whether it reads the marks)
        type Kind = (fn() -> EnvScan, bool, bool);
        let kinds: [Kind; 3] = [
            (EnvScan::default, true, false),
            (EnvScan::cvd_only, false, false),
            (EnvScan::with_marks, true, true),
        ];
        for bytes in &envs {
            let whole = rank_root::scan_environ(bytes);
            for (kind, preload, marks) in kinds {
                for (first, piece) in [1, 7, 64, FIRST_PIECE, ENVIRON_PIECE]
                    .map(|f| (f, ENVIRON_PIECE))
                    .into_iter()
                    .chain([(7, 7)])
                {
                    let (facts, _) = scan_in(bytes, kind, first, piece, &mut Vec::new());
                    let at = format!("reads {first} then {piece}, {} bytes", bytes.len());
                    assert_eq!(facts.cvd, whole.cvd, "{at}");
                    if preload {
                        assert_eq!(facts.guarded, whole.guarded, "{at}");
                    }
                    if marks {
                        assert_eq!(facts, whole, "{at}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_first_read_asks_one_page_and_the_scan_stops_there_when_it_can() {
        // The variables in the first page of a 64 KiB environment: one read of one page.
        let early = env_with(5, 100, 64);
        let (facts, asked) = scan(&early, EnvScan::cvd_only, FIRST_PIECE, &mut Vec::new());
        assert_eq!(facts.cvd.as_deref(), Some("GPU-1234"));
        assert_eq!(asked, vec![FIRST_PIECE]);
        // Late: one page, then larger pieces (an entry cut by a read is kept at the front).
        let late = env_with(64, 1000, 0);
        let (facts, asked) = scan(&late, EnvScan::cvd_only, FIRST_PIECE, &mut Vec::new());
        assert_eq!(facts.cvd.as_deref(), Some("GPU-1234"));
        assert_eq!(asked.first(), Some(&FIRST_PIECE));
        assert!(
            asked.len() >= 3 && asked[1..].iter().all(|&n| n > FIRST_PIECE),
            "{asked:?}"
        );
        // A buffer a previous file grew (the walk keeps one for every ancestor) still asks
        // one page first.
        let mut buf = vec![0; 2 * ENVIRON_PIECE];
        let (_, asked) = scan(&early, EnvScan::cvd_only, FIRST_PIECE, &mut buf);
        assert_eq!(asked, vec![FIRST_PIECE]);
    }
}

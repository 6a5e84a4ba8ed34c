//! The IPC provenance registry as this process opens it: which directory (configured,
//! default, or the private fallback under the user's home), and its problems said once.
//! The rank root (`root_walk`) and R3 (`decide::ipc`) both read and write through it.
#![allow(unsafe_code)]

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crate::guard::output::debug_log;
use crate::guard::output::line::say;
use crate::guard::process::state;
use crate::guard::sys::lifecycle::PerProcess;
use crate::guard::sys::signal_safe;
use crate::handle_table::{self, HandleTable};
use crate::registry::{self, ProcFs, Registry};

static SAID_DIR: PerProcess = PerProcess::new();
pub(crate) static SAID_WRITE: PerProcess = PerProcess::new();

/// Say `args` once per process under `flag` (later ones go to the debug log).
pub(crate) fn say_once(flag: &PerProcess, args: fmt::Arguments<'_>) {
    if !flag.first() {
        debug_log::log!(Debug, "{args}");
        return;
    }
    say("WARN", args);
}

/// The verified registry, or None (said once).
pub(crate) fn open_registry() -> Option<Registry> {
    open_registry_or_why().ok()
}

/// [`open_registry`] for a caller that has this process's pid at hand.
pub(crate) fn open_registry_in(pid: u32) -> Option<Registry> {
    open_registry_or_why_in(pid).ok()
}

/// Why there is no registry to trust.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Untrusted {
    /// `RANKGUARD_REGISTRY` names a directory that is not trusted (the user's own setting).
    Configured,
    /// The default directory is not usable (another user created it first, or it has the
    /// wrong mode) and neither is the private fallback (no home, or not writable): nothing
    /// this user can trust, and the default may have been taken to switch R3 off, so
    /// imports of unknown provenance are refused (`Decision::without_registry`).
    DefaultTaken,
}

/// The verified registry, or why there is none (said once).
pub(crate) fn open_registry_or_why() -> Result<Registry, Untrusted> {
    open_registry_or_why_in(signal_safe::pid())
}

/// [`open_registry_or_why`] in process `pid` (this one: asked once by the caller).
pub(crate) fn open_registry_or_why_in(pid: u32) -> Result<Registry, Untrusted> {
    verified(pid).map(|r| swept_at_start(r, pid))
}

/// The verified registry for one look-up by name, not swept: the rank root's walk asks one
/// rank record this way before any other (`root_walk`: a process that writes nothing and
/// asks once leaves the sweep to the next that writes; docs/design.md §1, "The walk's
/// cost").
pub(crate) fn open_registry_unswept() -> Option<Registry> {
    verified(signal_safe::pid()).ok()
}

/// The registry this process trusts (the configured one, the default, or the default's
/// private fallback), verified; problems said once.
fn verified(pid: u32) -> Result<Registry, Untrusted> {
    let uid = signal_safe::euid();
    let (dir, var) = match &state::get().config.registry {
        Some(d) => (PathBuf::from(d), "RANKGUARD_REGISTRY"),
        None => (registry::default_dir(uid), "the default registry"),
    };
    // A verdict about the directory this process reached in the last 5 ms is reused
    // (`registry::RecentDir`, which says why that is safe): one `lstat` fewer per operation.
    let now = registry::Now {
        me: pid,
        us: signal_safe::monotonic_us(),
    };
    match Registry::open_recent(&dir, uid, true, now) {
        Ok(r) => Ok(r),
        Err(problem) if state::get().config.registry.is_none() => {
            open_fallback(uid, &dir, &problem.to_string()).ok_or(Untrusted::DefaultTaken)
        }
        Err(problem) => {
            say_once(
                &SAID_DIR,
                format_args!(
                    "IPC provenance registry {var} {:?} {problem}; not trusted, ignoring it: every IPC import has unknown provenance (allowed, or denied under RANKGUARD_IPC=strict). Fix: point RANKGUARD_REGISTRY at a directory you own with mode 0700 (not a symlink), or unset it",
                    dir.display().to_string()
                ),
            );
            Err(Untrusted::Configured)
        }
    }
}

/// Whether this process swept the registry at its start (a forked child sweeps again).
static SWEPT_AT_START: PerProcess = PerProcess::new();

/// The first registry a process opens is swept once, at most [`registry::SWEEP_BUDGET`]
/// entries within [`registry::START_SWEEP_TIME`]: the records of processes that died
/// without removing theirs go (an untrusted record is left for the look-up that says so), so the registry stays bounded by what is alive (each
/// process removes its own rank record when it ends: `root_walk::drop_record`).
fn swept_at_start(reg: Registry, pid: u32) -> Registry {
    if SWEPT_AT_START.first_in(pid) {
        let s = reg.sweep_dead_within(&ProcFs, registry::SWEEP_BUDGET, registry::START_SWEEP_TIME);
        debug_log::log!(
            Debug,
            "swept the IPC registry at start: removed {} record(s) of ended processes, kept {}{}",
            s.removed,
            s.kept,
            if s.complete {
                ""
            } else {
                " (stopped by its budget: the rest at a later start)"
            }
        );
    }
    reg
}

/// A record could not be written (said once per process). `consequence`: what is lost.
pub(crate) fn said_write_problem(
    dir: &std::path::Path,
    problem: &registry::WriteProblem,
    consequence: &str,
) {
    say_once(
        &SAID_WRITE,
        format_args!(
            "IPC provenance registry {:?} {problem}: {consequence}. Fix: free space in (or make writable) that directory, or set RANKGUARD_REGISTRY to another one",
            dir.display().to_string()
        ),
    );
}

/// The default registry directory is not usable (another user created it first, or it has
/// the wrong mode): use the private fallback under the user's home, which nobody else can
/// create, and say so once: the default being taken may be an attempt to disable R3.
fn open_fallback(uid: u32, default: &std::path::Path, problem: &str) -> Option<Registry> {
    let mut host = [0u8; 256];
    let fallback =
        home_dir(uid).map(|home| registry::fallback_dir(&home, full_hostname(&mut host)));
    let opened = fallback.as_ref().map(|f| {
        if let Some(parent) = f.parent() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent);
        }
        Registry::open(f, uid, true)
    });
    match (fallback, opened) {
        (Some(f), Some(Ok(r))) => {
            say_once(
                &SAID_DIR,
                format_args!(
                    "the default IPC provenance registry {:?} {problem}; using the private fallback {:?} instead (another user may have created the default to disable rule R3; remove it if it is stale)",
                    default.display().to_string(),
                    f.display().to_string()
                ),
            );
            Some(r)
        }
        (f, opened) => {
            let why = match (f, opened) {
                (Some(f), Some(Err(p))) => {
                    format!("and the private fallback {:?} {p}", f.display().to_string())
                }
                _ => "and there is no home directory for a private fallback".to_string(),
            };
            say_once(
                &SAID_DIR,
                format_args!(
                    "the default IPC provenance registry {:?} {problem}, {why}: there is no registry this user can trust (another user may have created the default to disable rule R3), so every IPC import of unknown provenance is refused (R3; recorded in warn mode) and this process's exports are not recorded. Fix: set RANKGUARD_REGISTRY to a directory you own with mode 0700 (not a symlink), the same for every process of the job, e.g. one under a home or a scratch directory only you can write; or remove the default if it is stale",
                    default.display().to_string()
                ),
            );
            None
        }
    }
}

/// The user's home directory from the password database (not `$HOME`, which a process
/// may change: every process of the user must find the same fallback).
fn home_dir(uid: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain data (integers and pointers): all-zero is a valid value.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into `pw` and into `buf` (whose length we pass) and sets
    // `result` to `&pw` or to NULL.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: on success pw_dir points to a NUL-terminated string inside `buf`.
    let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes()));
    path.is_absolute().then_some(path)
}

/// The full host name (not cut at the first dot: hosts sharing a home must differ).
fn full_hostname(out: &mut [u8; 256]) -> &str {
    if !signal_safe::nodename(out) {
        return "unknown-host";
    }
    let end = out.iter().position(|&b| b == 0).unwrap_or(255);
    std::str::from_utf8(&out[..end]).unwrap_or("unknown-host")
}

/// The handle table's mapping in this process image (`handle_table`; a fork child shares its
/// parent's, MAP_SHARED), or null: not tried yet, or [`TABLE_UNUSABLE`] after a failure.
static TABLE: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
/// Set when the table could not be used in this process image: its records go to files.
static TABLE_UNUSABLE: AtomicBool = AtomicBool::new(false);

/// The handle table of `reg`'s directory (`rankguard_core::handle_table`), mapped at the first
/// call of this process image that finds it (`create`: an exporter's, which creates it);
/// None when there is none yet to read, or it cannot be used (the records go to files, as
/// before the table: said in the debug log).
pub(crate) fn handle_table(reg: &Registry, create: bool) -> Option<HandleTable<'static>> {
    if let Some(t) = mapped_handle_table() {
        return Some(t);
    }
    if TABLE_UNUSABLE.load(Ordering::Relaxed) {
        return None;
    }
    let path = reg.dir().join(handle_table::FILE_NAME);
    match map_table(&path, create) {
        // No table yet: nothing was recorded in one (an importer creates none).
        Ok(None) => None,
        Ok(Some(ptr)) => {
            if let Err(ours) = TABLE.compare_exchange(
                std::ptr::null_mut(),
                ptr,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // Another thread mapped it first: one mapping is kept.
                // SAFETY: `ours` is the mapping of BYTES this call made, referenced nowhere.
                unsafe { libc::munmap(ours.cast(), handle_table::BYTES) };
                return mapped_handle_table();
            }
            let table = mapped_handle_table()?;
            // The slots of exporters killed before they emptied theirs go now, as the
            // start-up sweep removes their record files (once per process image).
            let swept = table.sweep(signal_safe::pid(), &process_exists);
            debug_log::log!(
                Debug,
                "mapped the handle table {:?}; {swept} slot{} of ended processes emptied",
                path.display().to_string(),
                if swept == 1 { "" } else { "s" }
            );
            Some(table)
        }
        Err(why) => {
            TABLE_UNUSABLE.store(true, Ordering::Relaxed);
            debug_log::log!(
                Info,
                "the IPC handle table {:?} is not used ({why}): its records are files",
                path.display().to_string()
            );
            None
        }
    }
}

/// The handle table if this process image mapped it already (the exit's removal asks this:
/// no mapping is made there).
pub(crate) fn mapped_handle_table() -> Option<HandleTable<'static>> {
    let p = TABLE.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null TABLE is a MAP_SHARED, PROT_READ|PROT_WRITE mapping of
    // handle_table::BYTES (WORDS aligned u64 words) that is never unmapped, of a file
    // allocated to that size (fallocate); AtomicU64 has the layout of u64, and every access
    // to the words is atomic.
    let words = unsafe { std::slice::from_raw_parts(p.cast_const(), handle_table::WORDS) };
    // Its header was checked when it was mapped (`map_table`): not again at every use, each
    // a compare-and-swap on a line every process of the user shares.
    HandleTable::mapped(words)
}

/// Open (`create`: or create) and map the table: a regular file of this user, not writable
/// by others, of [`handle_table::BYTES`] allocated up front, so that no store into the
/// mapping ever needs a page the file system cannot give (a full tmpfs would raise SIGBUS
/// there). `Ok(None)`: no table and not `create`.
fn map_table(path: &std::path::Path, create: bool) -> Result<Option<*mut AtomicU64>, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| "a NUL in its path")?;
    let last = || std::io::Error::last_os_error().to_string();
    // SAFETY: `c` is a NUL-terminated path; the flags create at most a regular file.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR
                | if create { libc::O_CREAT } else { 0 }
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if !create && e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        return Err(format!("open: {e}"));
    }
    let result = (|| {
        // SAFETY: an all-zero stat is a valid value, filled by fstat on the open fd.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open; st is a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(format!("fstat: {}", last()));
        }
        if let Some(why) = handle_table::file_problem(
            st.st_mode & libc::S_IFMT == libc::S_IFREG,
            st.st_uid,
            st.st_mode,
            u64::try_from(st.st_size).unwrap_or(u64::MAX),
            signal_safe::euid(),
        ) {
            return Err(why);
        }
        if st.st_size == 0 {
            // By the instruction, not posix_fallocate: one lazy binding fewer in the library
            // (python-tests/test_startup_cost.py holds their number).
            // SAFETY: fallocate(fd, 0, 0, BYTES) reads no memory; fd is open for writing.
            let rc = unsafe {
                signal_safe::raw_syscall(
                    libc::SYS_fallocate,
                    fd as usize,
                    0,
                    0,
                    handle_table::BYTES,
                )
            };
            if rc != 0 {
                return Err(format!(
                    "fallocate: {}",
                    std::io::Error::from_raw_os_error(i32::try_from(-rc).unwrap_or(libc::EIO))
                ));
            }
        }
        // MAP_POPULATE: the table's pages mapped now, once, not one fault at a time on the
        // shares' round trips (a new event's slot is on a page of its hash's choosing).
        // SAFETY: a new shared mapping of fd's first BYTES, which the file now has.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                handle_table::BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap: {}", last()));
        }
        let words = p.cast::<AtomicU64>();
        // SAFETY: the mapping just made, of WORDS aligned words (see mapped_handle_table).
        let slice = unsafe { std::slice::from_raw_parts(words.cast_const(), handle_table::WORDS) };
        if HandleTable::new(slice).is_none() {
            // SAFETY: the mapping just made, referenced nowhere else.
            unsafe { libc::munmap(p, handle_table::BYTES) };
            return Err("its header is not this version's".to_string());
        }
        Ok(Some(words))
    })();
    // SAFETY: fd is open and owned here; the mapping stays valid after its close.
    unsafe { libc::close(fd) };
    result
}

/// Whether process `pid` exists (the handle table takes back the slots of owners that do
/// not: `kill(pid, 0)`).
pub(crate) fn process_exists(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    unsafe { libc::kill(p, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

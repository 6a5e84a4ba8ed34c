//! The IPC provenance registry as this process opens it: which directory (configured,
//! default, or the private fallback under the user's home), and its problems said once.
//! The rank root (`root_walk`) and R3 (`decide::ipc`) both read and write through it.
#![allow(unsafe_code)]

use std::fmt;
use std::path::PathBuf;

use crate::guard::output::debug_log;
use crate::guard::output::line::say;
use crate::guard::process::state;
use crate::guard::sys::lifecycle::PerProcess;
use crate::guard::sys::signal_safe;
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

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
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
    let uid = euid();
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
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    if unsafe { libc::gethostname(out.as_mut_ptr().cast(), out.len() - 1) } != 0 {
        return "unknown-host";
    }
    out[255] = 0;
    let end = out.iter().position(|&b| b == 0).unwrap_or(255);
    std::str::from_utf8(&out[..end]).unwrap_or("unknown-host")
}

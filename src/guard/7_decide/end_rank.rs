//! Ending the rank of a process the guard ends (docs/design.md, "Ending the rank"): R1 in
//! enforce mode (status 78) and every violation in abort mode. The process itself is
//! ended by its caller; this ends the rank's process (the one the launcher or engine
//! started, or the rank root without rank variables), so that a parent which never
//! watches its children (a learner reading a pipe it holds open itself) does not wait
//! forever. Cold path: runs once, in a process about to exit.
//!
//! No thread and no signal handler is installed anywhere: the refused process, which is
//! ending anyway, finds the rank's process and signals it. It never signals a process
//! outside the same user's rank: the target is an ancestor reached through a verified
//! chain (`crate::rank_root::rank_top`: same user, each parent started before its child),
//! opened as a pidfd and checked again by start time and owner after the open, so a pid
//! reused meanwhile is never signalled (the pidfd names one process for good).
#![allow(unsafe_code)]

use std::fmt::Write;

use crate::config::Mode;
use crate::guard::audit::decision_record::prefix;
use crate::guard::audit::site;
use crate::guard::decide::ipc;
use crate::guard::process::rank_root::{self, ProcFsView};
use crate::guard::process::state;
use crate::guard::sys::signal_safe::{self, StackBuf};
use crate::policy::Rule;
use crate::rank_root::{marks_of, parse_stat, rank_top, RootId};

/// The opt-out: `process` ends only the refused process (a tree that handles its
/// children's deaths itself); `rank` (default) ends the rank's process too.
pub const ENDS_VAR: &str = "RANKGUARD_REFUSAL_ENDS";

/// How long the rank's process gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE_MS: i32 = 500;

/// End the rank of this process, which the guard is ending for `rule` (`why`: the first
/// line of the reason). Warn and off modes end nothing. Never panics, never fails the
/// caller: what could not be done is said in one line.
pub fn end_rank(mode: Mode, rule: Rule, why: &str) {
    if matches!(mode, Mode::Warn | Mode::Off) {
        return;
    }
    if signal_safe::getenv_bytes(ENDS_VAR) == Some(b"process") {
        return;
    }
    let _ = std::panic::catch_unwind(|| end(mode, rule, why));
}

fn end(mode: Mode, rule: Rule, why: &str) {
    let cfg = &state::get().config;
    let me = signal_safe::pid();
    let uid = ipc::euid();
    let marks =
        marks_of(|n| signal_safe::getenv_bytes(n).map(|v| String::from_utf8_lossy(v).into_owned()));
    // Without rank marks: the rank root, when it is an ancestor (not this process).
    let root = rank_root::ensure(cfg)
        .filter(|r| r.gpu.is_some())
        .map(|r| r.id);
    let Some(top) = rank_top(me, uid, &marks, root, &mut ProcFsView::new()) else {
        return; // this process is the rank's process: its own exit ends the rank
    };
    let (sig, sig_name) = match mode {
        Mode::Abort => (libc::SIGABRT, "SIGABRT"),
        _ => (libc::SIGTERM, "SIGTERM"),
    };
    let cap = site::capture(site::python_thread());
    let site = cap.site.as_deref().unwrap_or("<unknown site>");
    let comm = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let mut line = String::new();
    let outcome = signal(top, uid, sig);
    let _ = write!(
        line,
        "the rank's process {} ('{}'): this process {me} ('{}') broke {rule:?} ({}) at {site}: {why}; ",
        top.pid,
        comm(top.pid),
        comm(me),
        rule.name(),
    );
    match outcome {
        Ok(_) => {
            let _ = write!(line, "ending the rank's process ({sig_name}) so the job does not wait on it ({ENDS_VAR}=process leaves it running)");
        }
        Err(e) => {
            let _ = write!(line, "it could not be ended ({e}): stop the job yourself");
        }
    }
    let _ = write!(line, "; fix: {}", rule.fix());
    let mut b = StackBuf::<64>::new();
    prefix(&mut b, "WARN");
    let mut out = b.as_bytes().to_vec();
    out.extend_from_slice(line.as_bytes());
    out.push(b'\n');
    signal_safe::write_all(2, &out);
    if let Ok(fd) = outcome {
        finish(fd);
    }
}

/// Whether `/proc/<pid>` is still the process `id` of user `uid`.
fn still(id: RootId, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let start = std::fs::read_to_string(format!("/proc/{}/stat", id.pid))
        .ok()
        .and_then(|s| parse_stat(&s))
        .map(|s| s.start);
    let owner = std::fs::metadata(format!("/proc/{}", id.pid)).map(|m| m.uid());
    start == Some(id.start) && owner.ok() == Some(uid)
}

/// A pidfd for `id`, verified after the open (so it names that process, not a reused pid).
fn open_verified(id: RootId, uid: u32) -> Result<i32, &'static str> {
    // SAFETY: pidfd_open(pid, flags) takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, id.pid as libc::c_int, 0) };
    if fd < 0 {
        return Err("pidfd_open failed (Linux 5.3 or later is needed, and a free descriptor)");
    }
    let fd = fd as i32;
    if !still(id, uid) {
        // SAFETY: fd is the descriptor opened above, closed once.
        unsafe { libc::close(fd) };
        return Err("it exited, or its pid now names another process");
    }
    Ok(fd)
}

fn send(fd: i32, sig: i32) -> bool {
    // SAFETY: pidfd_send_signal(fd, sig, info, flags) with a NULL info and no flags; fd is
    // a pidfd this module opened.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd,
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// Signal `top`; the pidfd, still open, for [`finish`].
fn signal(top: RootId, uid: u32, sig: i32) -> Result<i32, &'static str> {
    let fd = open_verified(top, uid)?;
    if !send(fd, sig) {
        // SAFETY: fd opened above, closed once.
        unsafe { libc::close(fd) };
        return Err("pidfd_send_signal failed");
    }
    Ok(fd)
}

/// After SIGTERM: SIGKILL when the rank's process has not exited within the grace (it
/// handles or ignores SIGTERM). The pidfd still names the same process.
fn finish(fd: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a pidfd is readable once its process has exited.
    let ready = unsafe { libc::poll(&mut p, 1, TERM_GRACE_MS) };
    if ready == 0 {
        send(fd, libc::SIGKILL);
    }
    // SAFETY: fd opened by `signal`, closed once.
    unsafe { libc::close(fd) };
}

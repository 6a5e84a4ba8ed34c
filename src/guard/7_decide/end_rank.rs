//! Ending the rank of a process the guard ends (docs/design.md, "Ending the rank"): R1 in
//! enforce mode (status 78) and every violation in abort mode. The process itself is
//! ended by its caller; this ends the rank's process (the one the launcher or engine
//! started, or the rank root without rank variables), so that a parent which never
//! watches its children (a learner reading a pipe it holds open itself) does not wait
//! forever. Cold paths: [`end_rank`] runs once, in a process about to exit; [`arm`] is one
//! `rt_sigaction` pair at a `cuInit` that passed R1.
//!
//! No thread is started anywhere: the refused process, which is ending anyway, finds the
//! rank's process and signals it. A process that passed R1 in enforce mode (any rank's
//! process that uses CUDA) catches one real-time signal ([`end_signal`], [`arm`]) so that,
//! sent by a refused descendant, it ends with status 78 and a line of its own; any other
//! rank's process is sent SIGTERM. It never signals a process outside the same user's
//! rank: the target is an ancestor reached through a verified chain
//! (`crate::rank_root::rank_top`: same user, each parent started before its child), opened
//! as a pidfd and checked again by start time and owner after the open, so a pid reused
//! meanwhile is never signalled (the pidfd names one process for good).
#![allow(unsafe_code)]

use std::fmt::Write;

use crate::config::Mode;
use crate::guard::audit::decision_record::prefix;
use crate::guard::audit::site;
use crate::guard::process::root_walk::{self, ProcFsView};
use crate::guard::process::state;
use crate::guard::sys::signal_safe::{self, StackBuf};
use crate::guard::sys::{sigaction, sigmask};
use crate::policy::{Rule, Violation};
use crate::rank_root::{marks_of, parse_stat, rank_top, RootId};

/// The opt-out: `process` ends only the refused process (a tree that handles its
/// children's deaths itself); `rank` (default) ends the rank's process too.
pub const ENDS_VAR: &str = "RANKGUARD_REFUSAL_ENDS";

/// The status the rank's process ends with when it catches [`end_signal`]: R1's
/// (`init_check::EXIT_R1`, which imports this module, hence not named from here).
const EXIT_ENDED: i32 = 78;

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
    let uid = crate::guard::sys::signal_safe::euid();
    let marks =
        marks_of(|n| signal_safe::getenv_bytes(n).map(|v| String::from_utf8_lossy(v).into_owned()));
    // Without rank marks: the rank root, when it is an ancestor (not this process).
    let root = root_walk::ensure(cfg)
        .filter(|r| r.gpu.is_some())
        .and_then(|r| r.id());
    let top = rank_top(me, uid, &marks, root, &mut ProcFsView::new());
    let cap = site::capture(site::python_thread());
    let site = cap.site.as_deref().unwrap_or("<unknown site>");
    let comm = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    // Under `rankguard launch`: the note its supervisor reads. The claim is the rank's,
    // once: a second refused process of the same rank ends only itself.
    let rank_id = top.or_else(|| self_id(me));
    if let Some(id) = rank_id {
        if !claim_note(id, me, &comm(me), rule, site, why) {
            return;
        }
    }
    let Some(top) = top else {
        return; // this process is the rank's process: its own exit ends the rank
    };
    // The line is said before the signal: under `launch` the job (this process's group
    // too) is stopped as soon as the rank's process ends.
    let outcome = open_verified(top, uid);
    let (sig, sig_name) = match mode {
        Mode::Abort => (libc::SIGABRT, "SIGABRT"),
        _ if catches(top.pid, end_signal()) => (end_signal(), "status 78"),
        _ => (libc::SIGTERM, "SIGTERM"),
    };
    let mut line = String::new();
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
            let ends_var = ENDS_VAR; // a local: `{ENDS_VAR}` would be a relocated constant
            let _ = write!(line, "ending the rank's process ({sig_name}) so the job does not wait on it ({ends_var}=process leaves it running)");
        }
        Err(e) => {
            let _ = write!(line, "it could not be ended ({e}): stop the job yourself");
        }
    }
    let _ = write!(line, "; fix: {}", rule.fix());
    say(&line);
    if outcome.is_ok() {
        say_at(top.pid, &line);
    }
    let Ok(fd) = outcome else { return };
    if send(fd, sig, (sig == end_signal()).then_some((me, uid, rule))) {
        finish(fd);
    } else {
        say("the rank's process could not be signalled (pidfd_send_signal failed): stop the job yourself");
        // SAFETY: fd opened by open_verified, closed once.
        unsafe { libc::close(fd) };
    }
}

/// One line on stderr, with the guard's prefix.
fn say(line: &str) {
    let mut b = StackBuf::<64>::new();
    prefix(&mut b, "DENY");
    let mut out = b.as_bytes().to_vec();
    out.extend_from_slice(line.as_bytes());
    out.push(b'\n');
    signal_safe::write_all(2, &out);
}

/// The line on the rank's process's stderr as well, when that is not this process's: a
/// parent that captured its children's stderr (`subprocess.run(capture_output=True)`)
/// would otherwise take the only line with it. Opened through `/proc/<pid>/fd/2` (the
/// same user's process, verified by the caller) non-blocking, so a pipe without a reader
/// fails (ENXIO) instead of waiting, and a full one drops the line; SIGPIPE is blocked
/// around the write and a pending one taken back, so a closed pipe cannot end this
/// process with another status than its own.
fn say_at(top: u32, line: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let Ok(mut theirs) = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/{top}/fd/2"))
    else {
        return;
    };
    let mine = std::fs::metadata("/proc/self/fd/2").ok();
    let same = mine
        .zip(theirs.metadata().ok())
        .is_some_and(|(a, b)| a.dev() == b.dev() && a.ino() == b.ino());
    if same {
        return;
    }
    let mut b = StackBuf::<64>::new();
    prefix(&mut b, "DENY");
    let mut out = b.as_bytes().to_vec();
    out.extend_from_slice(line.as_bytes());
    out.push(b'\n');
    // By system call (`sys::sigmask`): the C library's signal functions would be imports
    // the loader relocates in every process (test_startup_cost.py).
    let old = sigmask::block(libc::SIGPIPE);
    let pending_before = old.is_some() && sigmask::pending(libc::SIGPIPE) == Some(true);
    let _ = theirs.write(&out);
    if let Some(old) = old {
        if !pending_before && sigmask::pending(libc::SIGPIPE) == Some(true) {
            sigmask::take(libc::SIGPIPE);
        }
        sigmask::restore(old);
    }
}

/// The private notes directory `rankguard launch` gives its ranks (src/cli/failure.rs
/// reads it); unset elsewhere.
pub const LAUNCH_DIR_VAR: &str = "RANKGUARD_LAUNCH_DIR";

/// This process as a [`RootId`].
fn self_id(me: u32) -> Option<RootId> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    Some(RootId {
        pid: me,
        start: parse_stat(&stat)?.start,
    })
}

/// Under `rankguard launch`, claim the rank whose process is `id` by creating
/// `$RANKGUARD_LAUNCH_DIR/<pid>.<start>` (O_EXCL, 0600) holding the refusal. False when
/// another refused process of the rank claimed it first (it says the line and ends the
/// rank's process); true otherwise, also when there is no directory or the note cannot
/// be written (then the line on stderr is all there is, as under `run`).
fn claim_note(id: RootId, me: u32, comm: &str, rule: Rule, site: &str, why: &str) -> bool {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(dir) = signal_safe::getenv_bytes(LAUNCH_DIR_VAR) else {
        return true;
    };
    let one = |s: &str| s.lines().next().unwrap_or("").to_string();
    let mut path = std::path::PathBuf::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(dir),
    );
    path.push(format!("{id}"));
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return false,
        Err(_) => return true,
    };
    let rank = signal_safe::getenv_bytes("RANK").unwrap_or(b"-");
    let local = signal_safe::getenv_bytes("LOCAL_RANK").unwrap_or(b"-");
    let body = format!(
        "rankguard-refusal 1\npid {me}\ncommand {}\nrank {}\nlocal_rank {}\nrule {} ({})\nsite {}\nwhy {}\nend\n",
        one(comm),
        String::from_utf8_lossy(rank),
        String::from_utf8_lossy(local),
        format_args!("{rule:?}"),
        rule.name(),
        one(site),
        one(why),
    );
    let _ = f.write_all(body.as_bytes());
    true
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

/// Send `sig` through the pidfd; with `queued` (this pid, uid, the rule) as `sigqueue`
/// does (`SI_QUEUE`), carrying [`MAGIC`] and the rule, which [`on_end`] checks.
fn send(fd: i32, sig: i32, queued: Option<(u32, u32, Rule)>) -> bool {
    let info = queued.map(|(pid, uid, rule)| QueueInfo {
        signo: sig,
        errno: 0,
        code: libc::SI_QUEUE,
        pad: 0,
        pid: pid as i32,
        uid,
        value: MAGIC << 8 | RULES.iter().position(|&r| r == rule).unwrap_or(0xff),
        rest: [0; 12],
    });
    let ptr = info.as_ref().map_or(std::ptr::null(), |i| {
        std::ptr::from_ref(i).cast::<libc::siginfo_t>()
    });
    // SAFETY: pidfd_send_signal(fd, sig, info, flags) with no flags and either a NULL info
    // or a QueueInfo, which has siginfo_t's size and the kernel's layout for SI_QUEUE
    // (checked below); fd is a pidfd this module opened.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd, sig, ptr, 0) == 0 }
}

/// The signal a refused process sends its rank's process when that process catches it
/// (`SigCgt` in `/proc/<pid>/status`): one of the real-time signals, which nothing sends
/// by default and few programs use.
pub fn end_signal() -> libc::c_int {
    sigaction::SIGRTMAX - 3
}

/// What a queued [`end_signal`] carries above the rule's index ("RGEN").
const MAGIC: usize = 0x5247_454e;

/// The rules by index, as the queued value carries them.
const RULES: [Rule; 4] = [Rule::R1, Rule::R2, Rule::R3, Rule::R4];

/// `siginfo_t` as the kernel lays it out for `SI_QUEUE` on 64-bit Linux: signo, errno,
/// code, padding, then the union's pid, uid and value, 128 bytes in all.
#[repr(C)]
struct QueueInfo {
    signo: i32,
    errno: i32,
    code: i32,
    pad: i32,
    pid: i32,
    uid: u32,
    value: usize,
    rest: [u64; 12],
}

const _: () = assert!(std::mem::size_of::<QueueInfo>() == std::mem::size_of::<libc::siginfo_t>());
const _: () = assert!(
    std::mem::size_of::<usize>() == 8,
    "QueueInfo is the 64-bit layout"
);

/// Whether process `pid` catches signal `sig` (its `SigCgt` mask).
fn catches(pid: u32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| (1..=64).contains(&sig) && m & (1 << (sig - 1)) != 0)
}

/// Catch [`end_signal`] in this process, unless something else already does or ignores it
/// (its handler is kept). Called once, at `cuInit`, by a process that passed R1 in enforce
/// mode: the process a refused descendant will end. A child forked from it inherits the
/// handler, an `exec` drops it (then SIGTERM is what the rank's process gets).
pub fn arm() {
    // By system call (`sys::sigaction`): the C library's signal functions would be imports
    // the loader relocates in every process (test_startup_cost.py).
    let sig = end_signal();
    if sigaction::handler_of(sig) == Some(libc::SIG_DFL) {
        // on_end lives as long as this library (it is never unloaded: -z nodelete).
        sigaction::catch(sig, on_end);
    }
}

/// The handler [`arm`] installs. Only async-signal-safe work: one line built on the stack,
/// `write`, `_exit(78)`. A signal that is not a refused descendant's (no `SI_QUEUE` with
/// [`MAGIC`]) does what the default action does: it ends the process by that signal.
extern "C" fn on_end(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler; si_pid and
    // si_value are read as the SI_QUEUE layout, which si_code is checked to be first.
    let (code, pid, value) = unsafe {
        let i = &*info;
        (i.si_code, i.si_pid(), i.si_value().sival_ptr as usize)
    };
    if code != libc::SI_QUEUE || value >> 8 != MAGIC {
        // Both system calls (async-signal-safe); SIG_DFL for a real-time signal terminates
        // the process once the handler returns and the signal, blocked while it runs, is
        // unblocked.
        sigaction::default_action(sig);
        sigaction::raise(sig);
        return;
    }
    let rule = RULES.get(value & 0xff).copied().unwrap_or(Rule::R1);
    let mut comm = [0u8; 32];
    let comm = comm_of(pid as u32, &mut comm);
    let mut b = StackBuf::<1024>::new();
    prefix(&mut b, "DENY");
    let ends_var = ENDS_VAR; // as in `end`
    let _ = writeln!(
        b,
        "ending this process, the rank's process, with status {EXIT_ENDED}: its descendant {pid} ('{comm}') broke {rule:?} ({}) and was terminated by the guard (its own line names the call site), so the job must not wait on this rank ({ends_var}=process leaves it running); fix: {}",
        rule.name(),
        rule.fix(),
    );
    signal_safe::write_all(2, b.as_bytes());
    // SAFETY: _exit is async-signal-safe; atexit handlers are skipped on purpose, as in
    // init_check (another thread may hold any lock).
    unsafe { libc::_exit(EXIT_ENDED) }
}

/// `/proc/<pid>/comm` through open/read/close only (async-signal-safe); "?" if unreadable.
fn comm_of(pid: u32, out: &mut [u8; 32]) -> &str {
    let mut path = StackBuf::<32>::new();
    let _ = write!(path, "/proc/{pid}/comm\0");
    // SAFETY: path is NUL-terminated and lives across the call; out is ours, read writes
    // at most its length; the fd is closed once.
    let n = unsafe {
        let fd = libc::open(
            path.as_bytes().as_ptr().cast(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return "?";
        }
        let n = libc::read(fd, out.as_mut_ptr().cast(), out.len());
        libc::close(fd);
        n
    };
    let n = usize::try_from(n).unwrap_or(0);
    // `get`: an index keeps a panic location, a relocation (test_startup_cost.py).
    out.get(..n)
        .and_then(|b| std::str::from_utf8(b).ok())
        .map_or("?", str::trim_end)
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
        send(fd, libc::SIGKILL, None);
    }
    // SAFETY: fd opened by open_verified, closed once.
    unsafe { libc::close(fd) };
}

/// What happens once a verdict is "refuse" (R1 in enforce mode, any violation in abort
/// mode; init_check and verdict call it), before this process ends: its rank's process is
/// ended too ([`end_rank`]), so the job stops.
pub fn refused(mode: Mode, v: &Violation) {
    let mut why = StackBuf::<256>::new();
    let _ = write!(why, "{}", v.detail);
    end_rank(
        mode,
        v.rule,
        std::str::from_utf8(why.as_bytes()).unwrap_or("?"),
    );
}

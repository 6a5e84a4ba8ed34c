//! The prefix of every line the guard writes (stderr, the debug log):
//! `host:pid:tid [rank N] RANKGUARD LEVEL `, the NCCL line shape users grep.
//!
//! The rank it names is handed down by the layers that know it (the configuration,
//! `process::state`; the rank root, `process::root_walk`) when they learn it, so that this
//! layer, which everything above writes through, imports none of them. Both are plain
//! atomics: a forked child inherits them, as it inherits the configuration and the rank root
//! they come from.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::guard::sys::signal_safe::{self, StackBuf};

/// The configured rank (`RANKGUARD_RANK` and the like), or [`NO_RANK`].
static RANK: AtomicU64 = AtomicU64::new(NO_RANK);
const NO_RANK: u64 = u64::MAX;

/// The pid of the rank root when this process has one, else 0.
static ROOT_PID: AtomicU32 = AtomicU32::new(0);

/// The configuration's rank (called once the configuration is read).
pub fn set_rank(rank: Option<u32>) {
    RANK.store(rank.map_or(NO_RANK, u64::from), Ordering::Release);
}

/// The rank root's pid (called once the rank root is found).
pub fn set_root_pid(pid: u32) {
    ROOT_PID.store(pid, Ordering::Release);
}

/// `host:pid:tid [rank N] RANKGUARD LEVEL `.
pub fn prefix<W: Write>(w: &mut W, level: &str) {
    let mut host = [0u8; 64];
    let host = signal_safe::hostname(&mut host);
    let _ = write!(w, "{host}:{}:{} ", signal_safe::pid(), signal_safe::tid());
    match (
        RANK.load(Ordering::Acquire),
        ROOT_PID.load(Ordering::Acquire),
    ) {
        (NO_RANK, 0) => {
            let _ = w.write_str("[rank -] ");
        }
        (NO_RANK, root) => {
            let _ = write!(w, "[rank root {root}] ");
        }
        (r, _) => {
            let _ = write!(w, "[rank {r}] ");
        }
    }
    let _ = write!(w, "RANKGUARD {level} ");
}

/// The longest line [`say`] writes (a longer text is cut before its newline, ` [...]`).
pub const SAY_MAX: usize = 1024;

/// Say one line on stderr: the prefix with `level`, `text`, one newline, in one `write(2)`
/// (no allocation: the line is built on the stack). Every line the guard says on stderr
/// goes through here but four: a decision record (`audit::decision_record`), the
/// end-of-rank handler's (async-signal-safe, `decide::end_rank`), `hooks::trampoline`'s
/// last words before `abort` when no real `dlsym` exists, and `debug_log`'s fallback
/// to stderr.
pub fn say(level: &str, text: fmt::Arguments<'_>) {
    let mut b = StackBuf::<SAY_MAX>::new();
    prefix(&mut b, level);
    let _ = b.write_fmt(text);
    b.end_line();
    signal_safe::write_all(2, b.as_bytes());
}

//! The debug log (`RANKGUARD_DEBUG=WARN|INFO|DEBUG|TRACE`, `RANKGUARD_DEBUG_FILE`): one
//! line per event, in the shape of the guard's stderr lines and of `NCCL_DEBUG`'s
//! (`host:pid:tid [rank N] RANKGUARD DEBUG message`), written with one `write(2)` to the
//! debug file, or to stderr.
//!
//! Why not `tracing`: its call-site statics, their metadata and the subscriber's vtables
//! are ~400 pointers in this library's data, which the loader relocates at every start
//! of every process the library is preloaded into, CUDA or not: three more pages written
//! (copy-on-write faults) and 2% of `/bin/true`'s start-up (docs/benchmarks.md, "What
//! `tracing` cost"). This writer has no statics but the level: an event below the level
//! costs one relaxed load; one at or above it is formatted into a stack buffer (no
//! allocation, no lock a forked child could inherit held) and handed over whole.

use crate::guard::output::line;
use crate::guard::output::sink;
use crate::guard::sys::lifecycle::ForkSafeCell;
use crate::guard::sys::signal_safe::{self, StackBuf};
use rankguard_core::config::Level;
use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

/// The most verbose level written, as [`verbosity`] numbers it; 0: the log is off.
static MAX: AtomicU8 = AtomicU8::new(0);

/// A line longer than this is cut (and ends with [`CUT`]).
const LINE_MAX: usize = 2048;
const CUT: &str = " [...]";

/// `level`'s place: WARN 1 ... TRACE 4 (0 is "off").
const fn verbosity(level: Level) -> u8 {
    match level {
        Level::Warn => 1,
        Level::Info => 2,
        Level::Debug => 3,
        Level::Trace => 4,
    }
}

/// The word a line carries (`NCCL_DEBUG`'s names).
const fn name(level: Level) -> &'static str {
    match level {
        Level::Warn => "WARN",
        Level::Info => "INFO",
        Level::Debug => "DEBUG",
        Level::Trace => "TRACE",
    }
}

/// The debug file's template (`RANKGUARD_DEBUG_FILE`), handed down by the configuration
/// (`process::state`) before it sets the level; unset: lines go to stderr.
static FILE: ForkSafeCell<&'static str> = ForkSafeCell::new();

/// Set the debug file's template (once; a second call changes nothing).
pub fn set_file(template: Option<&'static str>) {
    if let Some(t) = template {
        FILE.set(t);
    }
}

/// Turn the log on at `level` (`state`'s configuration, once per process).
pub fn set_level(level: Level) {
    MAX.store(verbosity(level), Ordering::Relaxed);
}

/// Whether an event at `level` is written.
#[inline(always)]
pub fn enabled(level: Level) -> bool {
    verbosity(level) <= MAX.load(Ordering::Relaxed)
}

/// Format `args` after the line prefix into `buf`: one line, cut at `N` bytes with [`CUT`]
/// before its newline.
fn render<const N: usize>(buf: &mut StackBuf<N>, level: Level, args: fmt::Arguments<'_>) {
    line::prefix(buf, name(level));
    let _ = buf.write_fmt(args);
    end_line(buf);
}

/// End `buf` with exactly one newline, cutting it (with [`CUT`]) when it is full.
fn end_line<const N: usize>(buf: &mut StackBuf<N>) {
    if buf.remaining() == 0 {
        buf.truncate(N - CUT.len() - 1);
        buf.push_bytes(CUT.as_bytes());
    }
    if !buf.as_bytes().ends_with(b"\n") {
        buf.push_bytes(b"\n");
    }
}

/// Write one event (the [`log!`] macro's body, reached only when `level` is enabled).
#[cold]
pub fn write(level: Level, args: fmt::Arguments<'_>) {
    let mut b = StackBuf::<LINE_MAX>::new();
    render(&mut b, level, args);
    write_line(b.as_bytes());
}

/// Hand a finished line (its own prefix and newline included) to the debug file, or to
/// stderr when there is none or it cannot be opened (the sink says why, once).
pub fn write_line(line: &[u8]) {
    match FILE.get() {
        Some(t) if sink::DEBUG.write(t, line) => {}
        _ => signal_safe::write_all(2, line),
    }
}

/// `log!(Debug, "recorded IPC export key={key}")`: one debug log line at that level, formatted
/// only when the level is on.
macro_rules! log {
    ($level:ident, $($arg:tt)+) => {
        if $crate::guard::output::debug_log::enabled(::rankguard_core::config::Level::$level) {
            $crate::guard::output::debug_log::write(
                ::rankguard_core::config::Level::$level,
                ::std::format_args!($($arg)+),
            );
        }
    };
}
pub(crate) use log;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_like_nccl_debug() {
        assert!(verbosity(Level::Warn) < verbosity(Level::Info));
        assert!(verbosity(Level::Info) < verbosity(Level::Debug));
        assert!(verbosity(Level::Debug) < verbosity(Level::Trace));
        assert_eq!(
            [Level::Warn, Level::Info, Level::Debug, Level::Trace].map(name),
            ["WARN", "INFO", "DEBUG", "TRACE"]
        );
    }

    #[test]
    fn a_long_line_is_cut_and_still_one_line() {
        let mut b = StackBuf::<64>::new();
        render(&mut b, Level::Debug, format_args!("{}", "x".repeat(200)));
        let s = std::str::from_utf8(b.as_bytes()).unwrap();
        assert_eq!(s.len(), 64, "{s}");
        assert!(s.ends_with(" [...]\n"), "{s}");
        assert_eq!(s.matches('\n').count(), 1, "{s}");
        assert!(s.contains(" RANKGUARD DEBUG "), "{s}");
    }

    #[test]
    fn a_short_line_gets_one_newline() {
        let mut b = StackBuf::<256>::new();
        render(&mut b, Level::Info, format_args!("swept={}", 3));
        let s = std::str::from_utf8(b.as_bytes()).unwrap();
        assert!(s.ends_with(" RANKGUARD INFO swept=3\n"), "{s}");
        let mut b = StackBuf::<256>::new();
        render(&mut b, Level::Info, format_args!("already ended\n"));
        assert!(std::str::from_utf8(b.as_bytes())
            .unwrap()
            .ends_with("ended\n"));
    }
}

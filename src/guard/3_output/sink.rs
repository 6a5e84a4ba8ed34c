//! The audit file and the debug log file: opened and written so that they can never hang,
//! corrupt or expose the program the guard lives in (issue 14, items 1, 3, 4, 9).
//!
//! - **Bounded**: opened with `O_NONBLOCK` (a FIFO without a reader fails at once with
//!   ENXIO instead of waiting for one) and written without blocking (a full pipe or FIFO
//!   drops the record: counted, said once). A regular file on a stalled network mount can
//!   still block in the kernel: no user-space flag bounds that (README, "Limits").
//! - **Never the program's descriptor**: the descriptor's file identity `(st_dev, st_ino)`
//!   is remembered at open and checked with `fstat` before each write. A program that closed
//!   it (daemons and launchers close every fd >= 3) and reused the number for its own file,
//!   or a `vfork` child that opened it in its own descriptor table, gets it reopened, never
//!   written into.
//! - **Private**: `O_NOFOLLOW | O_CLOEXEC`, created mode 0600; a symbolic link, or an
//!   existing regular file or FIFO that another user owns, is refused with one line.
//! - **Said once**: a file that cannot be opened, or records being lost (ENOSPC, EIO, a
//!   full pipe), is said once per process on stderr, never once per event.
//! - **Whole or absent** (issue 29, item 7): a record is one `write(2)`, never completed
//!   by a second one (another process may have appended meanwhile). A write that the file
//!   system cut short (full part-way) leaves a fragment without a newline; the process
//!   remembers it, and its next record goes out in one `writev(2)` that starts with a
//!   newline, so no later record of it is glued to the fragment. A record of another
//!   process sharing the file can still land right after the fragment: `rankguard report`
//!   resynchronises at each record's start inside a line (`crate::audit`).
//!
//! All state is atomics plus a fork-safe [`PidLock`] around the short check-or-reopen.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use crate::config;
use crate::guard::output::line;
use crate::guard::sys::lifecycle::{PerProcess, PidLock};
use crate::guard::sys::sigmask;
use crate::guard::sys::signal_safe::{self, Mid};

pub struct Sink {
    /// Which file: its variable, what it holds and what happens instead are `kind`'s texts
    /// (an enum, not `&'static str` fields: a pointer in a mutable static is a relocation
    /// on a page the loader then writes at every process start, docs/benchmarks.md).
    kind: Kind,
    lock: PidLock,
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
    /// Opening failed in this process (not retried, said once).
    refused: PerProcess,
    /// This process said that records are being lost.
    lost_said: PerProcess,
    /// Records that could not be written (all processes sharing this memory).
    lost: AtomicU64,
    /// This process's last write was cut short (the file ends in its fragment, with no
    /// newline): its next record starts with a newline.
    torn: PerProcess,
}

pub static AUDIT: Sink = Sink::new(Kind::Audit);
pub static DEBUG: Sink = Sink::new(Kind::Debug);

#[derive(Clone, Copy)]
enum Kind {
    Audit,
    Debug,
}

impl Kind {
    /// The variable that names the file.
    fn var(self) -> &'static str {
        match self {
            Kind::Audit => "RANKGUARD_AUDIT",
            Kind::Debug => "RANKGUARD_DEBUG_FILE",
        }
    }
    /// What the file holds, for messages.
    fn what(self) -> &'static str {
        match self {
            Kind::Audit => "audit records",
            Kind::Debug => "debug log lines",
        }
    }
    /// What happens instead when the file cannot be opened.
    fn instead(self) -> &'static str {
        match self {
            Kind::Audit => "no audit records will be written by this process",
            Kind::Debug => "the debug log goes to stderr",
        }
    }
}

/// Why a file was not opened.
enum OpenProblem {
    Errno(i32),
    Owner(u32),
}

impl Sink {
    const fn new(kind: Kind) -> Sink {
        Sink {
            kind,
            lock: PidLock::new(),
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
            refused: PerProcess::new(),
            lost_said: PerProcess::new(),
            lost: AtomicU64::new(0),
            torn: PerProcess::new(),
        }
    }

    /// Open the file now (at the first guarded call), so that a problem with it is said
    /// up front rather than at the first record.
    pub fn open_now(&self, template: &str) {
        let _ = self.descriptor(template);
    }

    /// Append one record (one `write(2)`: records of processes sharing the file never
    /// interleave). Never blocks on a pipe or FIFO; a record that cannot be written is
    /// counted and said once. False when the file could not be opened at all. After a
    /// write of this process was cut short, the next record starts with a newline, in the
    /// same system call (see "Whole or absent" above).
    pub fn write(&self, template: &str, bytes: &[u8]) -> bool {
        let Some(fd) = self.descriptor(template) else {
            return false;
        };
        // Only after a cut-short write is the pid asked for (a system call).
        let resync = self.torn.done_here();
        let want = bytes.len() + usize::from(resync);
        loop {
            let (n, err) = if resync {
                write_no_sigxfsz(fd, b"\n", bytes)
            } else {
                write_no_sigxfsz(fd, &[], bytes)
            };
            if n >= 0 && n as usize == want {
                if resync {
                    self.torn.clear();
                }
                return true;
            }
            if err == libc::EINTR {
                continue;
            }
            // A short write (a full disk part-way) or an error: the record is lost either
            // way; never retry a partial record (it would tear the line). A short write
            // that got past the leading newline left a fragment of this record.
            if n > isize::from(resync) {
                self.torn.mark(signal_safe::pid());
            } else if n == 1 {
                self.torn.clear();
            }
            self.lose(template, if n >= 0 { libc::ENOSPC } else { err });
            return true;
        }
    }

    fn lose(&self, template: &str, err: i32) {
        let total = self.lost.fetch_add(1, Ordering::Relaxed) + 1;
        let pid = signal_safe::pid();
        if !self.lost_said.first_in(pid) {
            return;
        }
        let why = if err == libc::EAGAIN {
            "the pipe or FIFO is full (its reader is not keeping up)".to_string()
        } else if err == libc::EFBIG {
            "File too large: the file is past this process's file size limit, `ulimit -f`; the guard blocks the SIGXFSZ that would kill the program".to_string()
        } else {
            std::io::Error::from_raw_os_error(err).to_string()
        };
        let fix = if err == libc::EFBIG {
            "raise the file size limit or point"
        } else {
            "free space on that file system or point"
        };
        line::say(
            "WARN",
            format_args!(
                "{}=\"{}\": a write failed ({why}); {} are being lost ({total} so far; said once per process). Fix: {fix} {} elsewhere",
                self.kind.var(),
                Mid(&self.path(template), signal_safe::VALUE_MAX),
                self.kind.what(),
                self.kind.var()
            ),
        );
    }

    fn path(&self, template: &str) -> String {
        let mut host = [0u8; 64];
        let host = signal_safe::hostname(&mut host).to_string();
        config::expand_path(template, &host, signal_safe::pid())
    }

    /// Our descriptor of the file, checked to still be the file we opened; reopened when
    /// the program closed it and reused the number (or it was opened by a vfork child in
    /// its own descriptor table). None when it cannot be opened (said once).
    fn descriptor(&self, template: &str) -> Option<i32> {
        let pid = signal_safe::pid();
        if self.refused.done_in(pid) {
            return None;
        }
        let _guard = self.lock.lock();
        let fd = self.fd.load(Ordering::Relaxed);
        if fd >= 0 && self.is_ours(fd) {
            return Some(fd);
        }
        // Never close `fd` here: it is not ours any more (or never was in this process).
        let path = self.path(template);
        match open_private(&path) {
            Ok((fd, dev, ino)) => {
                self.fd.store(fd, Ordering::Relaxed);
                self.dev.store(dev, Ordering::Relaxed);
                self.ino.store(ino, Ordering::Relaxed);
                Some(fd)
            }
            Err(problem) => {
                self.fd.store(-1, Ordering::Relaxed);
                if self.refused.first_in(pid) {
                    self.say_refused(&path, problem);
                }
                None
            }
        }
    }

    fn is_ours(&self, fd: i32) -> bool {
        // SAFETY: `stat` is plain data, for which all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid, exclusively borrowed out-pointer; on a closed or
        // reused fd fstat fails or describes that file, which the compare below rejects.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return false;
        }
        st.st_dev == self.dev.load(Ordering::Relaxed)
            && st.st_ino == self.ino.load(Ordering::Relaxed)
    }

    fn say_refused(&self, path: &str, problem: OpenProblem) {
        let what = match problem {
            OpenProblem::Errno(libc::ELOOP) => {
                "is a symbolic link: refused (another user could point it at your files); name the file itself".to_string()
            }
            OpenProblem::Errno(libc::ENXIO) => {
                "is a FIFO with no reader: not waiting for one (the program would hang)".to_string()
            }
            OpenProblem::Errno(libc::ENOENT) => {
                let dir = path.rsplit_once('/').map_or(".", |(d, _)| if d.is_empty() { "/" } else { d });
                format!(
                    "cannot be opened: its directory {} does not exist; fix: create it before the job starts (mkdir -p {}) or point {} at an existing directory",
                    Mid(dir, signal_safe::VALUE_MAX),
                    Mid(dir, signal_safe::VALUE_MAX),
                    self.kind.var()
                )
            }
            OpenProblem::Errno(e) => format!("cannot be opened ({})", std::io::Error::from_raw_os_error(e)),
            OpenProblem::Owner(uid) => format!(
                "exists and belongs to uid {uid}, not to you (uid {}): refused (it could be another user's trap for your records); remove it or choose another path",
                signal_safe::euid()
            ),
        };
        line::say(
            "WARN",
            format_args!(
                "{}=\"{}\" {what}; {}",
                self.kind.var(),
                Mid(path, signal_safe::VALUE_MAX),
                self.kind.instead()
            ),
        );
    }
}

/// One `write(2)` that never raises SIGXFSZ in the program: past `RLIMIT_FSIZE` (`ulimit
/// -f` below a shared file's size) the kernel sends the writing thread SIGXFSZ, whose
/// default action kills the process. The signal is blocked in this thread only, for the
/// write (the program's disposition and other threads' masks are untouched), so the write
/// returns EFBIG instead; a SIGXFSZ that the write left pending is taken with a zero-timeout
/// `sigtimedwait`, only when none was pending before (one the program had pending is its
/// own and stays). Checking the limit first instead would race with the other processes
/// appending to the same file. `head` and `bytes` go out in one system call (`writev` when
/// `head` is not empty). Returns the write's result and its errno (0 on success).
fn write_no_sigxfsz(fd: i32, head: &[u8], bytes: &[u8]) -> (isize, i32) {
    // By system call (`sys::sigmask`, and `writev` through `syscall`): the C library's
    // signal functions and `writev` would be imports the loader relocates in every process.
    let old = sigmask::block(libc::SIGXFSZ);
    let pending_before = old.is_some() && sigmask::pending(libc::SIGXFSZ) == Some(true);
    let n = if head.is_empty() {
        // SAFETY: `bytes` is a live slice; write(2) reads at most `len` bytes of it.
        unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) }
    } else {
        let iov = [
            libc::iovec {
                iov_base: head.as_ptr() as *mut libc::c_void,
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: bytes.as_ptr() as *mut libc::c_void,
                iov_len: bytes.len(),
            },
        ];
        // SAFETY: `iov` is a live array of two iovecs over live slices; writev(2) only
        // reads them and at most each one's `iov_len` bytes.
        unsafe {
            libc::syscall(
                libc::SYS_writev,
                fd as libc::c_long,
                iov.as_ptr(),
                2 as libc::c_long,
            ) as isize
        }
    };
    let err = if n < 0 { errno() } else { 0 };
    if let Some(old) = old {
        if !pending_before && sigmask::pending(libc::SIGXFSZ) == Some(true) {
            sigmask::take(libc::SIGXFSZ);
        }
        sigmask::restore(old);
    }
    (n, err)
}

fn errno() -> i32 {
    // SAFETY: __errno_location always returns a valid thread-local pointer.
    unsafe { *libc::__errno_location() }
}

/// Open `path` for appending, privately: no symlink, close-on-exec, never blocking, created
/// 0600; an existing regular file or FIFO must be the user's own. Character devices
/// (`/dev/null`, `/dev/full`, a terminal) are accepted: only root creates them.
fn open_private(path: &str) -> Result<(i32, u64, u64), OpenProblem> {
    let c = CString::new(path).map_err(|_| OpenProblem::Errno(libc::EINVAL))?;
    // SAFETY: `c` is NUL-terminated; the flags ask for an append-only, non-blocking,
    // close-on-exec descriptor that does not follow a final symbolic link.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY
                | libc::O_APPEND
                | libc::O_CREAT
                | libc::O_CLOEXEC
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(OpenProblem::Errno(errno()));
    }
    // SAFETY: `stat` is plain data, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, exclusively borrowed out-pointer; `fd` is the descriptor
    // this function just opened and still owns.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = errno();
        // SAFETY: `fd` is ours, opened above.
        unsafe { libc::close(fd) };
        return Err(OpenProblem::Errno(e));
    }
    let kind = st.st_mode & libc::S_IFMT;
    if (kind == libc::S_IFREG || kind == libc::S_IFIFO) && st.st_uid != signal_safe::euid() {
        // SAFETY: `fd` is ours, opened above.
        unsafe { libc::close(fd) };
        return Err(OpenProblem::Owner(st.st_uid));
    }
    Ok((fd, st.st_dev, st.st_ino))
}

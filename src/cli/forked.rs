//! Helper processes without an `exec`: a `fork` of this (single-threaded) CLI that runs one
//! Rust function and `_exit`s. The launcher's driver query and its reaper were each an
//! `exec` of the rankguard binary (loader, libraries, Rust runtime start-up: most of the
//! fixed cost of `rankguard launch`, docs/benchmarks.md figure 4); a forked copy is already
//! loaded and starts at once.
//!
//! Only sound while this process has one thread: a child forked from a multi-threaded
//! process may only make async-signal-safe calls before `exec` (another thread could have
//! held the allocator's or the loader's lock). [`spawn`] checks it and refuses otherwise;
//! callers then fall back to an `exec`ed helper. The child's descriptors are exactly the
//! ones given (0, 1, 2; `/dev/null` for the others), every other one is closed, its signal
//! mask is empty, and it never returns into the caller's code: a panic ends it with status
//! 70, like an error.
//!
//! `unsafe` is allowed in this module (FFI: fork, dup2, close_range, _exit, waitpid); each
//! block says why it is sound.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Whether this process has exactly one thread (`/proc/self/task`).
pub fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count() == 1)
        .unwrap_or(false)
}

/// How the child is set up.
pub struct Setup {
    /// The child's fd 0 (None: /dev/null).
    pub stdin: Option<OwnedFd>,
    /// The child's fd 1 (None: /dev/null). Its fd 2 is always /dev/null.
    pub stdout: Option<OwnedFd>,
    /// Lead a new process group (signals to the caller's group do not reach it).
    pub own_group: bool,
}

/// A forked child.
pub struct Child {
    pid: libc::pid_t,
}

impl Child {
    /// Wait for the child; its exit status (128 + signal if killed).
    pub fn wait(self) -> io::Result<i32> {
        let mut status: libc::c_int = 0;
        loop {
            // SAFETY: `status` is a valid out-pointer; `pid` is our own child.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if rc == self.pid {
                break;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        })
    }
}

/// Run `f` in a forked child set up as `setup` says; the child exits with `f`'s value.
/// Err when this process has more than one thread (see the module doc) or fork fails.
pub fn spawn(setup: Setup, f: impl FnOnce() -> i32) -> io::Result<Child> {
    if !single_threaded() {
        return Err(io::Error::other(
            "more than one thread: a fork without exec is not safe here",
        ));
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    // SAFETY: this process has one thread (checked above; nothing in this CLI starts one
    // concurrently with this call), so the child may run ordinary Rust code: no lock can
    // be held by a thread that does not exist in it.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(Child { pid });
    }
    // The child. Never returns: every path ends in _exit.
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let fds = [
            setup
                .stdin
                .as_ref()
                .map_or(null.as_raw_fd(), |f| f.as_raw_fd()),
            setup
                .stdout
                .as_ref()
                .map_or(null.as_raw_fd(), |f| f.as_raw_fd()),
            null.as_raw_fd(),
        ];
        for (target, fd) in fds.into_iter().enumerate() {
            // SAFETY: both are open descriptors of this process; dup2 onto 0-2 replaces them.
            if unsafe { libc::dup2(fd, target as libc::c_int) } < 0 {
                return 71;
            }
        }
        close_from(3);
        // SAFETY: an empty, initialised sigset_t passed by pointer; setpgid(0, 0) takes no
        // pointers.
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            if setup.own_group {
                libc::setpgid(0, 0);
            }
        }
        f()
    }))
    .unwrap_or(70);
    // SAFETY: _exit ends the process without running the parent's atexit handlers or
    // flushing buffers it copied from the parent (Rust's stdout buffer).
    unsafe { libc::_exit(code) }
}

/// Close every descriptor from `low` on (the child must not hold the caller's pipes, or
/// their readers would wait for it).
fn close_from(low: libc::c_int) {
    // SAFETY: close_range takes integers only; closing descriptors is always allowed.
    if unsafe {
        libc::syscall(
            libc::SYS_close_range,
            low as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        )
    } == 0
    {
        return;
    }
    // Kernels before 5.9: close what /proc lists.
    let fds: Vec<libc::c_int> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|&fd| fd >= low) {
        // SAFETY: closing a descriptor number; an already-closed one gives EBADF, ignored.
        unsafe { libc::close(fd) };
    }
}

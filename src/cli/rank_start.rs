//! A rank's start: `clone(CLONE_VM)` and `execve`, without copying the launcher.
//!
//! Why not `fork`: a fork copies the launcher's page tables and shares its pages
//! copy-on-write until the child's exec, which then tears that copy down; every page either
//! side writes meanwhile is a fault and a copy: for 8 ranks of `/bin/true`, the largest part
//! of a launch (docs/benchmarks.md, "Starting ranks without copying the launcher", with the
//! figures). A child made with `CLONE_VM` runs in the launcher's memory, on a stack of its own, until its exec gives it memory of its own. Why
//! not `vfork` (glibc's `posix_spawn`: `CLONE_VM | CLONE_VFORK`): the launcher would stop
//! until each exec, and the ranks would start one after the other (measured slower: the
//! same document, "Tried and reverted").
//!
//! The child runs alongside the launcher in the same memory, so it:
//! - reads only its [`ChildData`], built before the clone and neither changed nor freed by
//!   the launcher until the child has been reaped ([`ChildMemory::release`]), and writes only
//!   its own stack and `ChildData::script_argv`;
//! - makes raw system calls only, never a C library function: those set `errno`, which is
//!   in the launcher's thread-local storage (the child has none of its own), and some take
//!   the C library's locks. So the `PATH` search is planned in advance
//!   (`spawn::search`, execvp's rule) and the child only tries the paths in order;
//! - starts with every signal blocked (the launcher blocks them around the clone), because
//!   a handler would run in the launcher's memory. Signals the launcher handles, and
//!   SIGPIPE (the CLI ignores it; ranks get it back), are set to their default before the
//!   mask is cleared, right before the exec;
//! - cannot panic: panicking uses thread-local storage and the allocator. The child's code
//!   (this module's `child_main` and `spawn::Line`) allocates nothing and indexes only
//!   within checked lengths.
//!
//! Its file descriptors are its own (no `CLONE_FILES`): a copy of the launcher's table at
//! the clone, as after a fork. `PR_SET_PDEATHSIG`, the parent pid check and the process
//! group work as after a fork.
//!
//! Where such a clone is refused, the same child is forked instead (the child's code is
//! sound after a fork too): under valgrind, which stops the whole process at a `CLONE_VM`
//! clone that is not a thread ("Unsupported clone() flags"), so `valgrind
//! --trace-children=yes rankguard launch ...` keeps working; and where the clone is refused
//! (EINVAL, EPERM or ENOSYS: an emulator or a sandbox that allows only threads and forks,
//! such as qemu-user), from then on for every rank.
//!
//! `unsafe` is allowed in this module (FFI and the raw system calls); each block says why
//! it is sound.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::spawn::{failure_status, Line, Prepared};
use super::sys::{self, Mask};
use crate::cpuset::CpuSet;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "src/cli/rank_start.rs makes raw system calls for x86_64 and aarch64 only; add this \
     architecture's syscall instruction to `raw`"
);

/// A rank's process, started by [`spawn`]: its pid (also its process group), the read ends
/// of its stdout and stderr when its output is relayed, and the memory its child used
/// before its exec.
pub struct RankProcess {
    pub pid: u32,
    pub stdout: Option<std::io::PipeReader>,
    pub stderr: Option<std::io::PipeReader>,
    pub memory: ChildMemory,
}

/// What a child reads between its clone and its exec, and the stack it runs on there. It
/// must outlive the child's use of it, which the launcher only knows for sure once the
/// child is reaped: [`ChildMemory::release`] frees it then, and dropping it without that
/// leaks it (never a stack a child may still run on).
pub struct ChildMemory {
    /// A leaked `Box` (`Box::into_raw`): the child reads it through this pointer, so no
    /// `Box` may be moved or dropped meanwhile.
    data: NonNull<ChildData>,
    stack: Stack,
}

impl ChildMemory {
    /// Free the child's stack and data. Only once the child has been reaped (its exec or
    /// its exit is then past).
    pub fn release(self) {
        // SAFETY: the caller reaped the child, the only other user of this memory; `data`
        // came from `Box::into_raw` and `self` is consumed, so this happens once.
        unsafe {
            drop(Box::from_raw(self.data.as_ptr()));
            self.stack.unmap();
        }
    }
}

/// Everything the child uses, owned here and built before the clone.
struct ChildData {
    prep: Prepared,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// `/bin/sh PATH ARGS...` for a file the kernel cannot exec (ENOEXEC), as execvp runs
    /// it; slot 1 is written by the child (the path that gave ENOEXEC), the only memory
    /// outside its stack that it writes.
    script_argv: UnsafeCell<Vec<*const c_char>>,
    mask: Option<Mask>,
    fds: [c_int; 3],
    launcher: libc::pid_t,
    to_default: &'static [c_int],
}

/// The child's stack: an anonymous mapping with an inaccessible guard page at its bottom.
struct Stack {
    base: *mut c_void,
    len: usize,
}

/// Bytes of stack the child may use; it needs a few KiB (its failure line is 1 KiB).
const STACK_SIZE: usize = 64 * 1024;
const GUARD_SIZE: usize = 4096;

impl Stack {
    fn new() -> io::Result<Stack> {
        let len = STACK_SIZE + GUARD_SIZE;
        // SAFETY: an anonymous private mapping at an address the kernel picks; no pointer
        // is passed in.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the first page of the mapping made above. The stack grows down, so an
        // overflow faults there instead of writing the launcher's memory below it.
        if unsafe { libc::mprotect(base, GUARD_SIZE, libc::PROT_NONE) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: no child has used the mapping.
            unsafe { stack.unmap() };
            return Err(e);
        }
        Ok(stack)
    }

    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping: the initial stack pointer of a
        // downward-growing stack.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }

    /// # Safety
    /// No child runs on it any more.
    unsafe fn unmap(&self) {
        // SAFETY: the mapping made in `new`, of that length (the caller's invariant says
        // nothing uses it).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// The signals whose disposition the child sets to default before it unblocks signals:
/// every one the launcher has a handler for (read once, at the first rank: the CLI sets
/// none after start-up), and SIGPIPE.
fn signals_to_default() -> &'static [c_int] {
    static SIGNALS: OnceLock<Vec<c_int>> = OnceLock::new();
    SIGNALS.get_or_init(|| {
        let mut out = vec![libc::SIGPIPE];
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP || sig == libc::SIGPIPE {
                continue;
            }
            // SAFETY: `sigaction` is plain data (integers, a mask and a handler address), for
            // which all-zero bytes are a valid value.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: with a NULL new action sigaction changes nothing and only writes the
            // current disposition into `old`, a valid, exclusively borrowed out-pointer.
            if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
            {
                out.push(sig);
            }
        }
        out
    })
}

/// Whether an object of this file name means the launcher runs under valgrind, whose core
/// preload (`vgpreload_core-<arch>-linux.so`) every valgrind tool loads.
fn is_valgrind(file: &[u8]) -> bool {
    file.starts_with(b"vgpreload_core")
}

/// Set when a clone sharing memory was refused (EINVAL, EPERM, ENOSYS): every later rank
/// is forked.
static FORK_ONLY: AtomicBool = AtomicBool::new(false);

/// Whether ranks are forked rather than cloned into the launcher's memory (module doc).
fn fork_only() -> bool {
    static UNDER_VALGRIND: OnceLock<bool> = OnceLock::new();
    FORK_ONLY.load(Ordering::Relaxed)
        || *UNDER_VALGRIND.get_or_init(|| sys::any_object_loaded(is_valgrind))
}

/// Start one rank as `prep` says, without waiting for its exec: the child runs on `cpus`
/// (inherited by its threads and descendants), dies with SIGKILL when the launcher dies
/// (`PR_SET_PDEATHSIG`), leads its own process group (so signals reach the rank's whole
/// tree), starts with an empty signal mask and SIGPIPE at its default, reads `/dev/null`
/// (`null`) and, with `capture`, writes into two pipes. When a step or the exec fails, the
/// child writes one line to its stderr (`prep.setup_failed`/`prep.exec_failed`, the reason)
/// and exits 127 (not found) or 126 (`spawn::failure_status`): its program never runs
/// without its set-up. Err only when the launcher itself cannot (pipe, stack, clone).
pub fn spawn(
    prep: Prepared,
    cpus: Option<&CpuSet>,
    null: &std::fs::File,
    capture: bool,
) -> io::Result<RankProcess> {
    let pipes = if capture {
        Some((std::io::pipe()?, std::io::pipe()?))
    } else {
        None
    };
    let fds = [
        null.as_raw_fd(),
        pipes.as_ref().map_or(1, |((_, w), _)| w.as_raw_fd()),
        pipes.as_ref().map_or(2, |(_, (_, w))| w.as_raw_fd()),
    ];
    // argv and envp: NULL-terminated arrays of pointers into `prep`'s strings, which live
    // on the heap and do not move when `prep` moves into the box below.
    let nul_ended = |v: &[std::ffi::CString]| -> Vec<*const c_char> {
        v.iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let argv = nul_ended(&prep.argv);
    let envp = nul_ended(&prep.envp);
    let script_argv: Vec<*const c_char> = [c"/bin/sh".as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(argv.iter().skip(1).copied())
        .collect();
    let stack = Stack::new()?;
    let data = Box::new(ChildData {
        prep,
        argv,
        envp,
        script_argv: UnsafeCell::new(script_argv),
        mask: cpus.map(Mask::from_set),
        fds,
        // SAFETY: getpid is always safe to call.
        launcher: unsafe { libc::getpid() },
        to_default: signals_to_default(),
    });
    let data = NonNull::from(Box::leak(data));
    let arg = data.as_ptr();
    // SAFETY: sigset_t is plain data, initialised by sigfillset / written by
    // pthread_sigmask before it is read.
    let (mut all, mut old): (libc::sigset_t, libc::sigset_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: (block, clone or fork, restore) the child runs `child_main` on `stack` with
    // `arg`, the boxed `ChildData`, both kept alive and unchanged until the child is reaped
    // (`ChildMemory`); it shares our memory (CLONE_VM) but not our descriptor table or
    // signal handlers, and makes only raw system calls (module doc). A forked child runs it
    // on its copy of this stack, with its copy of `arg`'s memory: raw system calls are
    // sound there too, whatever other threads held. Every signal is blocked in this thread
    // across the clone so that the child starts with all blocked, then this thread's mask
    // is restored.
    let pid = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut pid = -1;
        let mut e = io::Error::from_raw_os_error(libc::EINVAL);
        if !fork_only() {
            pid = libc::clone(
                child_main,
                stack.top(),
                libc::CLONE_VM | libc::SIGCHLD,
                arg.cast(),
            );
            e = io::Error::last_os_error();
            // Refused as a kind of clone (not for want of memory or processes, which a
            // fork would meet too).
            if pid < 0
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EPERM | libc::ENOSYS)
                )
            {
                FORK_ONLY.store(true, Ordering::Relaxed);
            }
        }
        if pid < 0 && fork_only() {
            pid = libc::fork();
            if pid == 0 {
                child_main(arg.cast()); // never returns
            }
            e = io::Error::last_os_error();
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            // No child: nothing else uses the stack or the data.
            stack.unmap();
            drop(Box::from_raw(arg));
            return Err(e);
        }
        pid
    };
    // The parent sets the child's process group too: the launcher may signal the group
    // (another rank failed) before the child has run its own setpgid, and would then miss
    // it. Whichever call comes first makes the group; the other is a no-op, or EACCES once
    // the child has exec'ed (ignored).
    // SAFETY: setpgid takes integers only; `pid` is our child.
    unsafe { libc::setpgid(pid, pid) };
    // The write ends are in the child's own descriptor table now (dropped here), the read
    // ends ours.
    let (stdout, stderr) = match pipes {
        Some(((out_r, _), (err_r, _))) => (Some(out_r), Some(err_r)),
        None => (None, None),
    };
    Ok(RankProcess {
        pid: pid as u32,
        stdout,
        stderr,
        memory: ChildMemory { data, stack },
    })
}

/// A raw system call: the kernel's result, `-errno` on failure. The C library's `syscall`
/// would set `errno`, the launcher's (module doc).
///
/// # Safety
/// The arguments must be what system call `nr` expects (pointers valid for it).
#[cfg(target_arch = "x86_64")]
unsafe fn raw(nr: libc::c_long, a: [usize; 4]) -> isize {
    let ret: isize;
    // SAFETY: the x86_64 Linux system call convention: number in rax, arguments in rdi,
    // rsi, rdx, r10; rcx and r11 are clobbered; the result is in rax. The caller vouches
    // for the arguments.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// See the x86_64 one.
///
/// # Safety
/// The arguments must be what system call `nr` expects (pointers valid for it).
#[cfg(target_arch = "aarch64")]
unsafe fn raw(nr: libc::c_long, a: [usize; 4]) -> isize {
    let ret: isize;
    // SAFETY: the aarch64 Linux system call convention: number in x8, arguments in x0-x3,
    // the result in x0. The caller vouches for the arguments.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") nr,
            inlateout("x0") a[0] as isize => ret,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            options(nostack),
        );
    }
    ret
}

/// The raw `exit_group`: ends the child with `code`.
///
/// # Safety
/// Only in the child of [`spawn`] (it ends the calling process).
unsafe fn exit_group(code: c_int) -> ! {
    // SAFETY: exit_group takes an integer and does not return, so the end of this function
    // is never reached.
    unsafe {
        raw(libc::SYS_exit_group, [code as usize, 0, 0, 0]);
        std::hint::unreachable_unchecked()
    }
}

/// The kernel's `struct sigaction` (x86_64 and aarch64 alike): all zero is SIG_DFL, no
/// flags, an empty mask.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// The kernel's signal set size (`rt_sigaction`, `rt_sigprocmask`).
const KERNEL_SIGSET: usize = 8;

/// The child of [`spawn`]'s clone (or fork); never returns.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the boxed ChildData that outlives this child (ChildMemory).
    let d = unsafe { &*arg.cast_const().cast::<ChildData>() };
    // SAFETY: everything below is a raw system call (no errno, no lock) on descriptor and
    // signal numbers, or on pointers into `d` and this stack, which stay valid until the
    // exec or the exit.
    unsafe {
        for (target, fd) in d.fds.into_iter().enumerate() {
            // dup3 onto 0-2 (aarch64 has no dup2); a descriptor already in place keeps
            // FD_CLOEXEC (ours have it), so it is cleared explicitly.
            let rc = if fd == target as c_int {
                raw(libc::SYS_fcntl, [fd as usize, libc::F_SETFD as usize, 0, 0])
            } else {
                raw(libc::SYS_dup3, [fd as usize, target, 0, 0])
            };
            if rc < 0 {
                fail(d, b"redirecting its standard streams (dup2)", rc);
            }
        }
        let default = KernelSigaction {
            handler: 0,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for &sig in d.to_default {
            let _ = raw(
                libc::SYS_rt_sigaction,
                [
                    sig as usize,
                    &default as *const KernelSigaction as usize,
                    0,
                    KERNEL_SIGSET,
                ],
            );
        }
        if let Some(m) = &d.mask {
            let rc = raw(
                libc::SYS_sched_setaffinity,
                [0, std::mem::size_of::<Mask>(), m as *const Mask as usize, 0],
            );
            if rc < 0 {
                fail(d, b"setting its CPU affinity (sched_setaffinity)", rc);
            }
        }
        let rc = raw(
            libc::SYS_prctl,
            [
                libc::PR_SET_PDEATHSIG as usize,
                libc::SIGKILL as usize,
                0,
                0,
            ],
        );
        if rc < 0 {
            fail(d, b"PR_SET_PDEATHSIG", rc);
        }
        // The launcher may have died before the prctl: then nothing would ever kill us.
        if raw(libc::SYS_getppid, [0; 4]) != d.launcher as isize {
            fail(d, b"the launcher exited", -(libc::ESRCH as isize));
        }
        let rc = raw(libc::SYS_setpgid, [0, 0, 0, 0]);
        if rc < 0 {
            fail(d, b"leading its own process group (setpgid)", rc);
        }
        let empty: u64 = 0;
        let _ = raw(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_SETMASK as usize,
                &empty as *const u64 as usize,
                0,
                KERNEL_SIGSET,
            ],
        );
        let e = exec(d);
        let mut line = Line::new();
        line.push(&d.prep.exec_failed).push_errno(e);
        let l = line.finish();
        let _ = raw(libc::SYS_write, [2, l.as_ptr() as usize, l.len(), 0]);
        exit_group(failure_status(e))
    }
}

/// Try the exec's paths in order as execvp does (`spawn::Search`); returns the error to
/// report when none ran.
///
/// # Safety
/// Only in the child of [`spawn`] (see there).
unsafe fn exec(d: &ChildData) -> i32 {
    let s = &d.prep.search;
    let mut err = s.none;
    let mut denied = false;
    for path in &s.paths {
        let run = |file: *const c_char, argv: *const *const c_char| -> i32 {
            // SAFETY: NUL-terminated path, NULL-terminated argv and envp of NUL-terminated
            // strings, all in `d`.
            let rc = unsafe {
                raw(
                    libc::SYS_execve,
                    [file as usize, argv as usize, d.envp.as_ptr() as usize, 0],
                )
            };
            -rc as i32
        };
        err = run(path.as_ptr(), d.argv.as_ptr());
        if err == libc::ENOEXEC {
            // A file without a `#!` line: run it with /bin/sh, as execvp does.
            // SAFETY: `script_argv` is this child's alone (ChildData's doc); slot 1 exists
            // (the vector holds at least "/bin/sh", the slot and NULL).
            let script = unsafe { &mut *d.script_argv.get() };
            script[1] = path.as_ptr();
            err = run(c"/bin/sh".as_ptr(), script.as_ptr());
        }
        if !s.in_path {
            break;
        }
        match err {
            libc::EACCES => denied = true,
            libc::ENOENT
            | libc::ESTALE
            | libc::ENOTDIR
            | libc::ENODEV
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::ETIMEDOUT => {}
            _ => return err,
        }
    }
    if denied {
        libc::EACCES
    } else {
        err
    }
}

/// The child's set-up failed at `step` (`rc` the raw call's `-errno`): one line on its
/// stderr, then exit as [`failure_status`] says.
///
/// # Safety
/// Only in the child of [`spawn`] (see there).
unsafe fn fail(d: &ChildData, step: &[u8], rc: isize) -> ! {
    let e = -rc as i32;
    let mut line = Line::new();
    line.push(&d.prep.setup_failed)
        .push(step)
        .push(b": ")
        .push_errno(e);
    let l = line.finish();
    // SAFETY: `l` is a live buffer of that length; exit_group takes an integer.
    unsafe {
        let _ = raw(libc::SYS_write, [2, l.as_ptr() as usize, l.len(), 0]);
        exit_group(failure_status(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valgrinds_core_preload_is_recognised_by_its_file_name() {
        assert!(is_valgrind(b"vgpreload_core-amd64-linux.so"));
        assert!(is_valgrind(b"vgpreload_core-arm64-linux.so"));
        assert!(!is_valgrind(b"vgpreload_memcheck-amd64-linux.so"));
        assert!(!is_valgrind(b"libc.so.6"));
        assert!(!is_valgrind(b"librankguard.so"));
    }
}

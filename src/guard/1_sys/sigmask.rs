//! The calling thread's signal mask, its pending signals and a wait that does not wait, by
//! system call on the kernel's signal set: what `sink`'s SIGXFSZ-free write needs, without
//! a C library function.
//!
//! Why not `pthread_sigmask`, `sigpending`, `sigtimedwait` and the `sigset_t` helpers: each
//! C function the library imports is a relocation the loader applies at every process
//! start, CUDA or not, and `pthread_sigmask` is `GLIBC_2.32` in the glibc 2.34 build, a
//! version the library otherwise never needs and the loader checks against the C library's
//! whole list of versions (~340 instructions of every `/bin/true`; docs/benchmarks.md,
//! "What the loader's added instructions are made of"). `syscall` is imported anyway
//! (`signal_safe::tid`). What the C library's wrappers add (keeping its own two internal
//! signals unblockable) does not apply: only the one signal asked for is ever added, and a
//! mask is only ever restored to what the kernel returned.
#![allow(unsafe_code)]

use std::ptr;

/// The kernel's signal set as its `rt_sig*` calls take it on x86_64 and aarch64: 64 bits,
/// signal `n` at bit `n - 1`.
type KernelSet = u64;
const SET_BYTES: usize = std::mem::size_of::<KernelSet>();

const fn bit(sig: i32) -> KernelSet {
    1 << (sig - 1)
}

/// Block `sig` in the calling thread; the mask before, or `None` when nothing changed.
pub fn block(sig: i32) -> Option<KernelSet> {
    let set = bit(sig);
    let mut old: KernelSet = 0;
    // SAFETY: rt_sigprocmask reads SET_BYTES bytes at `&set` and writes SET_BYTES bytes at
    // `&mut old`, both live locals of that size; it changes only this thread's mask.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &set as *const KernelSet,
            &mut old as *mut KernelSet,
            SET_BYTES,
        )
    };
    (rc == 0).then_some(old)
}

/// Give the calling thread back the mask `old` that [`block`] returned.
pub fn restore(old: KernelSet) {
    // SAFETY: rt_sigprocmask reads SET_BYTES bytes at `&old`, a live local; no old mask is
    // asked for (null).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &old as *const KernelSet,
            ptr::null_mut::<KernelSet>(),
            SET_BYTES,
        );
    }
}

/// Whether `sig` is pending for the calling thread or its process (`None`: not known).
pub fn pending(sig: i32) -> Option<bool> {
    let mut set: KernelSet = 0;
    // SAFETY: rt_sigpending writes SET_BYTES bytes at `&mut set`, a live local.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigpending,
            &mut set as *mut KernelSet,
            SET_BYTES,
        )
    };
    (rc == 0).then_some(set & bit(sig) != 0)
}

/// Take a pending, blocked `sig` without waiting (a zero timeout); nothing when none is.
pub fn take(sig: i32) {
    let set = bit(sig);
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: rt_sigtimedwait reads SET_BYTES bytes at `&set` and the timespec at `&zero`,
    // both live locals; no siginfo is asked for (null).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigtimedwait,
            &set as *const KernelSet,
            ptr::null_mut::<libc::siginfo_t>(),
            &zero as *const libc::timespec,
            SET_BYTES,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_sees_pending_takes_and_restores() {
        // SIGXFSZ raised at this thread while blocked stays pending, is taken without
        // waiting, and the mask comes back as it was.
        let old = block(libc::SIGXFSZ).expect("rt_sigprocmask");
        assert_eq!(
            old & bit(libc::SIGXFSZ),
            0,
            "SIGXFSZ blocked before the test"
        );
        assert_eq!(pending(libc::SIGXFSZ), Some(false));
        // SAFETY: raise has no preconditions; SIGXFSZ is blocked in this thread.
        assert_eq!(unsafe { libc::raise(libc::SIGXFSZ) }, 0);
        assert_eq!(pending(libc::SIGXFSZ), Some(true));
        take(libc::SIGXFSZ);
        assert_eq!(pending(libc::SIGXFSZ), Some(false));
        take(libc::SIGXFSZ); // none pending: returns at once
        restore(old);
        let now = block(libc::SIGUSR2).expect("rt_sigprocmask");
        assert_eq!(
            now & bit(libc::SIGXFSZ),
            0,
            "SIGXFSZ still blocked after restore"
        );
        restore(now);
    }
}

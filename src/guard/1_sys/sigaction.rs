//! A signal's action, and a signal sent to the calling thread, by system call: what ending
//! the rank (`decide::end_rank`) needs to catch its real-time signal and to fall back to the
//! default action, without a C library function.
//!
//! Why not `sigaction`, `signal`, `sigemptyset`, `raise` and `SIGRTMAX()`
//! (`__libc_current_sigrtmax`): each C function the library imports is a lazy PLT slot the
//! loader relocates at every process start, CUDA or not (~15 loader instructions each of
//! every `/bin/true`; docs/benchmarks.md, "What the loader's added instructions are made
//! of"). `syscall` is imported anyway (`signal_safe::tid`, `sigmask`). What the C library's
//! wrappers add does not apply: `sigaction` refuses its own two internal signals (32, 33),
//! and only [`SIGRTMAX`]` - 3` is ever caught here; `raise` blocks every signal around its
//! `tgkill`, which matters to a caller that is not already inside the handler of the
//! signal it raises, and the one caller here is (the signal is blocked until it returns).
//!
//! Every function here is async-signal-safe: one or two system calls on locals, nothing
//! allocated, nothing locked.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::ptr;

use super::signal_safe;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "src/guard/1_sys/sigaction.rs lays out the kernel's struct sigaction for x86_64 and \
     aarch64 only; add this architecture's layout (and its signal return, if the kernel \
     needs one from user space)"
);

/// The highest signal number, the kernel's (`_NSIG` = 64 on x86_64 and aarch64). It is what
/// glibc's `SIGRTMAX` (`__libc_current_sigrtmax()`) returns too: glibc reserves its
/// internal real-time signals at the bottom of the range (it moves `SIGRTMIN` up to 34),
/// never the top (a C program printing `SIGRTMAX` gives 64 on glibc 2.36, x86_64).
pub const SIGRTMAX: c_int = 64;

/// A handler as `SA_SIGINFO` calls it.
pub type Handler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

/// The kernel's `struct sigaction` as `rt_sigaction` takes it on x86_64 and aarch64 (not the
/// C library's, whose mask is 128 bytes): handler, flags, the signal return (`sa_restorer`,
/// used with `SA_RESTORER` only) and the 64-bit mask, 32 bytes.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

const _: () = assert!(std::mem::size_of::<KernelSigaction>() == 32);

/// The mask's size, as `rt_sigaction` is told it (the kernel refuses any other).
const MASK_BYTES: usize = 8;

/// `SA_RESTORER` (the kernel's uapi `asm/signal.h`; the libc crate does not define it for
/// these targets).
#[cfg(target_arch = "x86_64")]
const SA_RESTORER: u64 = 0x0400_0000;

/// The signal return of a handler on x86_64: the kernel leaves the return address of a
/// handler to user space (`SA_RESTORER`), and glibc's `sigaction` sets its `__restore_rt`,
/// these two instructions: `rt_sigreturn`, which restores the interrupted context (and the
/// mask the handler ran with). The kernel makes the call only; nothing returns to it.
/// Needed even by a handler that never returns (`end_rank::on_end`'s `_exit(78)`): without
/// `SA_RESTORER` the x86_64 kernel cannot build the signal frame and ends the process with
/// SIGSEGV instead of running the handler (a C program making the raw `rt_sigaction`
/// without it dies so on this host's Linux 6.18). (aarch64 needs none: without
/// `SA_RESTORER` the kernel returns through the vDSO's `__kernel_rt_sigreturn`.)
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn restore_rt() -> ! {
    core::arch::naked_asm!(
        "mov rax, {nr}",
        "syscall",
        "ud2",
        nr = const libc::SYS_rt_sigreturn,
    )
}

/// `rt_sigaction(sig, new, old)`: true when the kernel took it.
fn rt_sigaction(
    sig: c_int,
    new: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> bool {
    let new = new.map_or(ptr::null(), ptr::from_ref);
    let old = old.map_or(ptr::null_mut(), ptr::from_mut);
    // SAFETY: rt_sigaction reads a KernelSigaction at `new` and writes one at `old` when
    // they are not null; both are references the caller holds across the call, with the
    // kernel's layout for this architecture (above) and MASK_BYTES as its mask's size.
    unsafe {
        signal_safe::raw_syscall(
            libc::SYS_rt_sigaction,
            sig as usize,
            new as usize,
            old as usize,
            MASK_BYTES,
        ) == 0
    }
}

/// The handler `sig` has now: `SIG_DFL` (0), `SIG_IGN` (1) or a function's address; `None`
/// when the kernel refused (not a signal).
pub fn handler_of(sig: c_int) -> Option<usize> {
    let mut old = KernelSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    rt_sigaction(sig, None, Some(&mut old)).then_some(old.handler)
}

/// Catch `sig` with `handler` (`SA_SIGINFO | SA_RESTART`, nothing more blocked while it
/// runs than `sig` itself); true when the kernel took it. The handler must live as long as
/// the process can receive `sig`.
pub fn catch(sig: c_int, handler: Handler) -> bool {
    #[cfg(target_arch = "x86_64")]
    let (flags, restorer) = (
        SA_RESTORER,
        restore_rt as unsafe extern "C" fn() -> ! as usize,
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (flags, restorer) = (0, 0);
    let act = KernelSigaction {
        handler: handler as usize,
        flags: flags | (libc::SA_SIGINFO | libc::SA_RESTART) as u64,
        restorer,
        mask: 0,
    };
    rt_sigaction(sig, Some(&act), None)
}

/// Give `sig` its default action (`signal(sig, SIG_DFL)`).
pub fn default_action(sig: c_int) -> bool {
    let act = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    rt_sigaction(sig, Some(&act), None)
}

/// Send `sig` to the calling thread (`raise`): `tgkill(getpid(), gettid(), sig)`.
pub fn raise(sig: c_int) -> bool {
    let (pid, tid) = (signal_safe::pid(), signal_safe::tid());
    // SAFETY: tgkill takes three integers; the thread named is this one, of this process.
    unsafe {
        signal_safe::raw_syscall(
            libc::SYS_tgkill,
            pid as usize,
            tid as usize,
            sig as usize,
            0,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI32, Ordering};

    static CAUGHT: AtomicI32 = AtomicI32::new(0);

    extern "C" fn note(sig: c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
        // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
        let code = unsafe { (*info).si_code };
        CAUGHT.store(
            if code == libc::SI_TKILL { sig } else { -code },
            Ordering::SeqCst,
        );
    }

    #[test]
    fn catches_returns_from_the_handler_and_restores_the_default() {
        // A real-time signal nothing else in the test binary uses. The handler returns,
        // through `restore_rt` on x86_64: a wrong signal return would crash here.
        let sig = SIGRTMAX - 5;
        assert_eq!(handler_of(sig), Some(libc::SIG_DFL));
        assert!(catch(sig, note));
        assert_eq!(handler_of(sig), Some(note as Handler as usize));
        assert!(raise(sig));
        assert_eq!(
            CAUGHT.load(Ordering::SeqCst),
            sig,
            "handler not run, or not by tgkill"
        );
        assert!(default_action(sig));
        assert_eq!(handler_of(sig), Some(libc::SIG_DFL));
        assert_eq!(handler_of(65), None, "65 is past the kernel's last signal");
    }

    #[test]
    fn sigrtmax_is_the_c_librarys() {
        // The C library's answer (`__libc_current_sigrtmax`), imported by the tests only.
        assert_eq!(SIGRTMAX, libc::SIGRTMAX());
    }
}

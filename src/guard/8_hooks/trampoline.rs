//! The one body of the `dlsym` and `dlvsym` trampolines' asking half: save the arguments,
//! ask the decision function, restore them, then return its answer or, when it is NULL,
//! tail-jump to the real function with the caller's frame intact (glibc reads what
//! `RTLD_NEXT` means from the caller's return address: `dlsym.rs`).
#![allow(unsafe_code)]

/// The body of a naked `extern "C"` function of up to three pointer arguments that asks
/// `decide` (same arguments) and returns its non-NULL answer, or jumps through `real` (a
/// static holding the real function's address, unexported: `dlsym.rs`).
///
/// x86_64: at entry rsp = 8 mod 16 (the return address); three pushes bring it to 0 mod 16
/// for the call, as the SysV ABI requires (rdx is saved whether it is an argument or not).
#[cfg(target_arch = "x86_64")]
macro_rules! ask_then_forward {
    ($decide:path, $real:path) => {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "push rdx",
            "call {decide}",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "test rax, rax",
            "jz 2f",
            "ret",
            "2:",
            "jmp qword ptr [rip + {real}]",
            decide = sym $decide,
            real = sym $real,
        )
    };
}

/// aarch64: x0-x2 and the link register (x30) are saved in a 32-byte frame around the call,
/// then the answer is returned or the real function is branched to (not called), so x30
/// still holds the caller's return address.
#[cfg(target_arch = "aarch64")]
macro_rules! ask_then_forward {
    ($decide:path, $real:path) => {
        core::arch::naked_asm!(
            "stp x0, x1, [sp, #-32]!",
            "stp x2, x30, [sp, #16]",
            "bl {decide}",
            "mov x16, x0",
            "ldp x2, x30, [sp, #16]",
            "ldp x0, x1, [sp], #32",
            "cbz x16, 2f",
            "mov x0, x16",
            "ret",
            "2:",
            "adrp x16, {real}",
            "ldr x16, [x16, :lo12:{real}]",
            "br x16",
            decide = sym $decide,
            real = sym $real,
        )
    };
}

pub(crate) use ask_then_forward;

/// No real function to jump to (not glibc): jumping to 0 would crash. Say why and abort.
#[cold]
pub fn no_real(why: &[u8]) -> ! {
    crate::guard::sys::signal_safe::write_all(2, why);
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

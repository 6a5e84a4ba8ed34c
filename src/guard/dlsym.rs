//! Our `dlsym`: a naked trampoline that asks [`route::dlsym_decide`] and otherwise
//! *jumps* to the real `dlsym`.
//!
//! glibc decides what `RTLD_NEXT` means from the caller's return address. A plain Rust
//! override that called the real `dlsym` would make every library's `dlsym(RTLD_NEXT, ..)`
//! look like a call from this library (HAMi-core PR 315, DMTCP PR 944; a prototype here
//! saw a library get its own symbol back). The trampoline preserves the caller's frame:
//! it saves the arguments, calls the decision function, restores them, and either returns
//! the wrapper or tail-jumps to the real `dlsym` with the original return address intact.
//!
//! `REAL_DLSYM` must stay unexported (a PC-relative reference to an exported static fails
//! to link in a cdylib: `R_X86_64_PC32`), and `dlsym_decide` must ensure it is set.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};
use std::sync::atomic::Ordering;

use crate::guard::real::{init_real_dlsym, REAL_DLSYM};
use crate::guard::route;

/// Called by the trampoline. Returns the wrapper to hand out, or NULL to forward.
/// Never unwinds (nothing in it panics on any input: no indexing beyond checked lengths,
/// no allocation), and always leaves `REAL_DLSYM` set when it returns NULL.
extern "C" fn rg_dlsym_decide(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if REAL_DLSYM.load(Ordering::Acquire) == 0 && init_real_dlsym() == 0 {
        // No real dlsym to jump to: glibc without versioned dlsym is not supported, and
        // jumping to 0 would crash. Say so and abort with a clear reason instead.
        crate::guard::report::write_all(2, b"RANKGUARD: cannot find the real dlsym (dlvsym failed for GLIBC_2.34 and the base version); librankguard.so needs glibc\n");
        // SAFETY: abort has no preconditions.
        unsafe { libc::abort() }
    }
    route::dlsym_decide(handle, symbol)
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
/// # Safety
/// Same contract as glibc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Fast path first: once the real dlsym is known, a name that does not start with "cu"
    // (almost every name a process looks up) jumps straight to it without a call into Rust.
    // Byte 1 is read only after byte 0 matched 'c', so never past the NUL.
    // Slow path: at entry rsp = 8 mod 16 (return address pushed); two pushes and 8 bytes of
    // padding bring it to 0 mod 16 for the call, as the SysV ABI requires.
    core::arch::naked_asm!(
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "test rsi, rsi",
        "jz 3f",
        "cmp byte ptr [rsi], 0x63",
        "jne 4f",
        "cmp byte ptr [rsi + 1], 0x75",
        "jne 4f",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        "4:",
        "jmp rax",
        decide = sym rg_dlsym_decide,
        real = sym REAL_DLSYM,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
/// # Safety
/// Same contract as glibc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Save x0, x1 and the link register (x30) in a 32-byte frame, call the decision
    // function, restore, then return its answer or branch (not call) to the real dlsym,
    // so x30 still holds the caller's return address.
    core::arch::naked_asm!(
        "stp x0, x1, [sp, #-32]!",
        "str x30, [sp, #16]",
        "bl {decide}",
        "mov x16, x0",
        "ldr x30, [sp, #16]",
        "ldp x0, x1, [sp], #32",
        "cbz x16, 2f",
        "mov x0, x16",
        "ret",
        "2:",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "br x16",
        decide = sym rg_dlsym_decide,
        real = sym REAL_DLSYM,
    )
}

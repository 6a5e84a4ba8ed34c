//! `exec*` replaces the process image and with it the counts of violations not yet written
//! (`tally.rs`) and the image that wrote the process's rank record (`root_walk.rs`) and its
//! export records (`decide::own_records`): the new program, guarded or not, cannot know it
//! has them to remove at its end, so they go now (a guarded program records again at its
//! own first `cuInit` and exports). These exports do all three first, then jump to the real
//! function with the caller's registers and stack untouched (the `execl` family is
//! variadic, so the shims are naked trampolines, like our `dlsym`). When the process never
//! violated, wrote no rank record and exported nothing, a shim costs three atomic loads
//! and, once per function, a `dlsym(RTLD_NEXT)`.
//!
//! x86-64 only; on other architectures nothing is interposed and an `exec` after
//! violations loses at most the last interval's counts, like `_exit` (README).
#![allow(unsafe_code)]
// Unit-test builds do not export the shims (as for `dlsym`), so nothing calls the hook there.
#![cfg_attr(test, allow(dead_code))]

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::ffi::c_int;

    use crate::guard::audit::tally;
    use crate::guard::decide::own_records;
    use crate::guard::process::root_walk;
    use crate::guard::resolve::exec_real;

    /// A real function that cannot be found: fail the call the way exec fails.
    extern "C" fn missing() -> c_int {
        // SAFETY: __errno_location always returns this thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        -1
    }

    /// Called by every shim with its index (into `table::EXEC_NAMES`): flush the counts,
    /// remove the rank record, return the real function. Never unwinds into the caller.
    extern "C" fn rg_exec_hook(which: usize) -> usize {
        let _ = std::panic::catch_unwind(tally::before_exec);
        root_walk::drop_record();
        own_records::drop_all();
        match exec_real::get(which) {
            0 => missing as *const () as usize,
            p => p,
        }
    }

    /// Save every argument register (and `al`, the vector count of a variadic call), ask
    /// the hook, restore, and jump to its answer with the caller's return address intact.
    /// Seven pushes take rsp from 8 mod 16 (after the call) to 0 mod 16 for the hook call.
    macro_rules! exec_shim {
        ($name:ident, $idx:literal) => {
            #[unsafe(naked)]
            #[cfg_attr(not(test), no_mangle)]
            /// # Safety
            /// Same contract as glibc's function of this name.
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "push rdi", "push rsi", "push rdx", "push rcx", "push r8", "push r9", "push rax",
                    concat!("mov edi, ", $idx),
                    "call {hook}",
                    "mov r11, rax",
                    "pop rax", "pop r9", "pop r8", "pop rcx", "pop rdx", "pop rsi", "pop rdi",
                    "jmp r11",
                    hook = sym rg_exec_hook,
                )
            }
        };
    }

    // One shim per name of `table::EXEC_NAMES`, with its index (generated from guarded.spec's
    // `exec:` line).
    crate::guard::table::exec_shims!(exec_shim);
}

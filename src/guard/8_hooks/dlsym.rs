//! Our `dlsym`: a naked trampoline that rejects every name that cannot be guarded in a few
//! byte compares and *jumps* to the real `dlsym`; only names of the guarded shape ask
//! [`route::dlsym_decide`].
//!
//! glibc decides what `RTLD_NEXT` means from the caller's return address. A plain Rust
//! override that called the real `dlsym` would make every library's `dlsym(RTLD_NEXT, ..)`
//! look like a call from this library (HAMi-core PR 315, DMTCP PR 944; a prototype here
//! saw a library get its own symbol back). The trampoline preserves the caller's frame:
//! it saves the arguments, calls the decision function, restores them, and either returns
//! the wrapper or tail-jumps to the real `dlsym` with the original return address intact.
//!
//! Fast reject (docs/benchmarks.md, figure 2): every guarded name is `cu<Upper>...` or
//! `cuda<Upper>...` ([`table::guarded_shape`]). The trampoline tests exactly that, byte by
//! byte, with compares against immediates (byte i is read only once bytes 0..i matched, so
//! never past the NUL; no table, no register written), and jumps through [`FORWARD`] for
//! every other name: `curl_easy_init`, `cudnnCreate`, `cublasCreate_v2` cost 9
//! instructions, any name not starting with `c` 3, and none enters Rust. `FORWARD` starts as the slow path (which
//! resolves the real `dlsym` and then stores it there), so the fast path needs no "is it
//! resolved yet" test. A NULL name is not tested for: glibc's own `dlsym` faults on it, and
//! so does the trampoline, at the same call.
//!
//! `REAL_DLSYM` and `FORWARD` must stay unexported (a PC-relative reference to an
//! exported static fails to link in a cdylib: `R_X86_64_PC32`), and `rg_dlsym_decide` must
//! ensure `REAL_DLSYM` is set and stored in `FORWARD` before it returns.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::guard::hooks::route;
use crate::guard::hooks::trampoline::{ask_then_forward, no_real};
use crate::guard::resolve::real::{init_real_dlsym, REAL_DLSYM};
#[cfg(test)]
use crate::guard::table;

/// Where the fast path forwards a name it rejected: the real `dlsym` once known, until
/// then the slow path, which resolves it. Read by the trampoline with a plain load: either
/// value is a correct target, so no ordering is needed beyond the store's atomicity.
///
/// Its initial value is a pointer, so the loader writes it at every process start: it
/// lives in its own section, which lld places right before `.got.plt`, on the page the
/// loader writes anyway for the lazy PLT slots, instead of in `.data`, where it would cost
/// one more copy-on-write page per process (docs/benchmarks.md, "Written pages").
#[cfg_attr(not(test), link_section = ".rankguard_relocated")]
static FORWARD: AtomicPtr<c_void> = AtomicPtr::new(rg_dlsym_slow as *mut c_void);

#[cfg(test)]
thread_local! {
    /// Calls of the decision function from this thread (tests of the fast reject).
    static DECIDED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Called by the slow path. Returns the wrapper to hand out, or NULL to forward.
/// Never unwinds (nothing in it panics on any input: no indexing beyond checked lengths,
/// no allocation), and always leaves `REAL_DLSYM` set, and in `FORWARD`, when it returns.
extern "C" fn rg_dlsym_decide(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    #[cfg(test)]
    DECIDED.with(|c| c.set(c.get() + 1));
    let mut real = REAL_DLSYM.load(Ordering::Acquire);
    if real == 0 {
        real = init_real_dlsym();
    }
    if real == 0 {
        // glibc without versioned dlsym is not supported.
        no_real(b"RANKGUARD: cannot find the real dlsym (the C library's dlvsym found no dlsym at GLIBC_2.34 or the base version); librankguard.so needs glibc\n");
    }
    if FORWARD.load(Ordering::Relaxed) as usize != real {
        FORWARD.store(real as *mut c_void, Ordering::Release);
    }
    route::dlsym_decide(handle, symbol)
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
/// # Safety
/// Same contract as glibc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // rdi = handle, rsi = symbol. No register is written: the name's bytes are compared
    // in memory. `curl_easy_init`, `cublasCreate_v2` and `cudnnCreate`: 9 instructions and
    // no branch taken before the last one, the jump to the real dlsym; a name not starting
    // with 'c': 3. Byte 2 is compared with 'Z' first: every lower-case letter is above it,
    // and a lower-case `cu?` is guarded only as `cuda`, so bytes 2 and 3 are then compared
    // with "da" as one 16-bit word (byte 2 is not NUL there, so byte 3 is inside the string:
    // the read cannot cross the string's end). Each way out has its own jump to the real
    // dlsym, reached by falling through (interleaved on an Intel host: docs/benchmarks.md,
    // "The floor of interposing `dlsym`").
    core::arch::naked_asm!(
        "cmp byte ptr [rsi], 0x63",        // 'c'
        "jne 2f",
        "cmp byte ptr [rsi + 1], 0x75",    // 'u'
        "jne 2f",
        "cmp byte ptr [rsi + 2], 0x5a",    // at most 'Z': upper case, digits, NUL
        "jbe 4f",
        "cmp word ptr [rsi + 2], 0x6164",  // "da" (little-endian)
        "je 5f",
        "2:",
        "jmp qword ptr [rip + {forward}]",
        "4:",
        "cmp byte ptr [rsi + 2], 0x41",    // 'A'..'Z': cu<Upper>
        "jae {slow}",
        "jmp qword ptr [rip + {forward}]",
        "5:",
        "cmp byte ptr [rsi + 4], 0x5a",
        "ja 2b",
        "cmp byte ptr [rsi + 4], 0x41",    // cuda<Upper>
        "jae {slow}",
        "jmp qword ptr [rip + {forward}]",
        forward = sym FORWARD,
        slow = sym rg_dlsym_slow,
    )
}

/// The slow path, reached by a jump from [`dlsym`] (names of the guarded shape) or through
/// [`FORWARD`] before the real `dlsym` is known: asks [`rg_dlsym_decide`], then returns
/// its wrapper or tail-jumps to the real `dlsym` (the body `dlvsym` has too).
#[unsafe(naked)]
unsafe extern "C" fn rg_dlsym_slow(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    ask_then_forward!(rg_dlsym_decide, REAL_DLSYM)
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
/// # Safety
/// Same contract as glibc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // x0 = handle, x1 = symbol; x16 (IP0) is scratch at a function's entry. The same
    // tests as the x86_64 one, in the same order.
    core::arch::naked_asm!(
        "ldrb w16, [x1]",
        "cmp w16, #0x63",                   // 'c'
        "b.ne 2f",
        "ldrb w16, [x1, #1]",
        "cmp w16, #0x75",                   // 'u'
        "b.ne 2f",
        "ldrb w16, [x1, #2]",
        "cmp w16, #0x64",                   // 'd'
        "b.eq 3f",
        "cmp w16, #0x5a",                   // above 'Z'
        "b.hi 2f",
        "cmp w16, #0x41",                   // cu<Upper>
        "b.hs 4f",
        "2:",
        "adrp x16, {forward}",
        "ldr x16, [x16, :lo12:{forward}]",
        "br x16",
        "3:",
        "ldrb w16, [x1, #3]",
        "cmp w16, #0x61",                   // cud: 'a'
        "b.ne 2b",
        "ldrb w16, [x1, #4]",
        "cmp w16, #0x5a",
        "b.hi 2b",
        "cmp w16, #0x41",                   // cuda<Upper>
        "b.lo 2b",
        "4:",
        "b {slow}",
        forward = sym FORWARD,
        slow = sym rg_dlsym_slow,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    /// The first lookup of the process goes through the slow path, which resolves the
    /// real dlsym and stores it in FORWARD; every test starts after that.
    fn prime() {
        through_trampoline(b"cuInit");
        assert_ne!(
            FORWARD.load(Ordering::Acquire),
            rg_dlsym_slow as *mut c_void
        );
    }

    /// Look `name` up through the trampoline; whether it entered the decision function.
    fn through_trampoline(name: &[u8]) -> (*mut c_void, bool) {
        let c = CString::new(name).expect("test names have no NUL");
        let before = DECIDED.with(|d| d.get());
        // SAFETY: a valid pseudo-handle and a NUL-terminated name: dlsym's contract.
        let p = unsafe { dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
        (p, DECIDED.with(|d| d.get()) != before)
    }

    fn real(name: &[u8]) -> *mut c_void {
        let c = CString::new(name).expect("test names have no NUL");
        crate::guard::resolve::real::lookup(libc::RTLD_DEFAULT, &c)
    }

    fn shape(name: &[u8]) -> bool {
        table::guarded_shape(|i| name.get(i).copied().unwrap_or(0))
    }

    /// The trampoline enters Rust exactly for names of the guarded shape, deciding on each
    /// byte of the first five: every byte value at positions 0 to 4 after a matching prefix.
    #[test]
    fn only_names_of_the_guarded_shape_enter_rust() {
        prime();
        for prefix in [&b""[..], b"c", b"cu", b"cud", b"cuda"] {
            for b in 1..=255u8 {
                for tail in [&b""[..], b"Init", b"_x"] {
                    let name = [prefix, &[b], tail].concat();
                    let (_, decided) = through_trampoline(&name);
                    assert_eq!(
                        decided,
                        shape(&name),
                        "{:?}",
                        String::from_utf8_lossy(&name)
                    );
                }
            }
        }
        for name in [
            &b""[..],
            b"c",
            b"cu",
            b"cud",
            b"cuda",
            b"curl_easy_init",
            b"cudnnCreate",
            b"cublasCreate_v2",
        ] {
            assert!(
                !through_trampoline(name).1,
                "{:?}",
                String::from_utf8_lossy(name)
            );
        }
        for name in [
            &b"cuInit"[..],
            b"cuDeviceGet",
            b"cudaSetDevice",
            b"cuX",
            b"cudaX",
        ] {
            assert!(
                through_trampoline(name).1,
                "{:?}",
                String::from_utf8_lossy(name)
            );
        }
    }

    /// A rejected name gets exactly what the real dlsym answers (here libc's `cuserid`,
    /// a real function whose name starts with "cu", and a name found nowhere).
    #[test]
    fn rejected_names_get_the_real_answer() {
        prime();
        for name in [&b"cuserid"[..], b"curl_easy_init_not_here", b"strlen"] {
            let (p, decided) = through_trampoline(name);
            assert!(!decided);
            assert_eq!(p, real(name), "{:?}", String::from_utf8_lossy(name));
        }
        assert!(
            !through_trampoline(b"cuserid").0.is_null(),
            "libc exports cuserid"
        );
    }
}

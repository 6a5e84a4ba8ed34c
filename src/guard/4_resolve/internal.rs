//! Real CUDA functions the guard itself calls (to learn a context's device, a pointer's
//! device, to undo a denied import) but does not guard: resolved like the wrappers' real
//! functions ([`real::resolve_slot`]), never exported, never routed. Exporting pass-through
//! wrappers for them would add a hop to every program's calls and make each of their ABI
//! variants (`cuMemFreeAsync_ptsz`, ...) one more thing the routing must know.
//!
//! The runtime ones are per major (`cudaGetDevice(major)`): their parameters are the same in
//! 12 and 13, but the runtime *instance* matters. A device is current in one runtime, and a
//! mapping lives in the runtime that opened it: a denied import of a cu13 caller in a
//! process with both majors is closed in the 13 runtime. Each is resolved in the wrapper's
//! own major (`majors::in_major`), else, when none of that major is loaded (its wrapper was
//! reached by an unversioned lookup), in any runtime, as the wrapper itself was served.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::guard::resolve::real;
use crate::guard::table::{Lib, RUNTIME_MAJORS};

/// `name: Lib fn(args) -> ret;` generates `pub fn name() -> Option<unsafe extern "C" fn(args) -> ret>`.
macro_rules! internal {
    ($( $sym:ident : $lib:ident fn( $( $ty:ty ),* ) -> $ret:ty ; )*) => {
        $(
            #[allow(non_snake_case)]
            pub fn $sym() -> Option<unsafe extern "C" fn($( $ty ),*) -> $ret> {
                static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
                let mut p = SLOT.load(Ordering::Acquire);
                if p.is_null() {
                    p = real::resolve_slot(
                        Lib::$lib,
                        // Rust identifiers hold no NUL, and the literal ends with one.
                        match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($sym), "\0").as_bytes()) {
                            Ok(c) => c,
                            Err(_) => return None,
                        },
                        &SLOT,
                    );
                }
                if p.is_null() {
                    return None;
                }
                // SAFETY: `p` is the real library's export of this exact ABI name, whose C
                // signature (cudaTypedefs.h's PFN of it) is the one declared here, generated
                // from that header (generated.rs).
                Some(unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($( $ty ),*) -> $ret>(p) })
            }
        )*
    };
}

/// `name fn(args) -> ret;` generates `pub fn name(major: u8) -> Option<unsafe extern "C"
/// fn(args) -> ret>`: the real function of the runtime of `major`.
macro_rules! internal_runtime {
    ($( $sym:ident : fn( $( $ty:ty ),* ) -> $ret:ty ; )*) => {
        $(
            #[allow(non_snake_case)]
            pub fn $sym(major: u8) -> Option<unsafe extern "C" fn($( $ty ),*) -> $ret> {
                static BY_MAJOR: [AtomicPtr<c_void>; RUNTIME_MAJORS.len()] =
                    [const { AtomicPtr::new(std::ptr::null_mut()) }; RUNTIME_MAJORS.len()];
                // Rust identifiers hold no NUL, and the literal ends with one.
                let Ok(name) = std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($sym), "\0").as_bytes()) else {
                    return None;
                };
                let p = runtime_slot(&BY_MAJOR, name, major);
                if p.is_null() {
                    return None;
                }
                // SAFETY: `p` is a real runtime's export of this exact name, whose C
                // signature (cuda_runtime_api.h, the same in every wrapped major: checked by
                // the generator) is the one declared here, generated from those headers.
                Some(unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($( $ty ),*) -> $ret>(p) })
            }
        )*
    };
}

// The calls themselves, typed from the headers (guarded.spec's `internal:` lines,
// scripts/gen_guarded.py).
include!("generated.rs");

/// `name` in the runtime of `major`, recorded in that major's slot of `slots`; when no
/// runtime of `major` is loaded, `name` in any loaded runtime (not recorded: one of its
/// own major may be loaded later). Null if there is none.
fn runtime_slot(
    slots: &[AtomicPtr<c_void>; RUNTIME_MAJORS.len()],
    name: &std::ffi::CStr,
    major: u8,
) -> *mut c_void {
    let slot = RUNTIME_MAJORS
        .iter()
        .position(|&m| m == major)
        .map(|i| &slots[i]);
    if let Some(s) = slot {
        let p = s.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
    }
    let p = crate::guard::resolve::majors::in_major(name, major);
    if !p.is_null() {
        return match slot {
            Some(s) => crate::guard::sys::lifecycle::keep_first(s, p),
            None => p,
        };
    }
    let p = real::any_runtime(name);
    if real::is_own(p) {
        std::ptr::null_mut()
    } else {
        p
    }
}

//! Finding the real functions behind the wrappers, all in one place.
//!
//! - The real `dlvsym` is read from the C library's dynamic symbol table (`libcsym.rs`):
//!   this library exports `dlvsym` too, so calling it by name would call ourselves. The
//!   real `dlsym` comes from the real `dlvsym(RTLD_NEXT, "dlsym", <version>)`: our own
//!   `dlsym` export would otherwise answer.
//! - Driver functions come from `libcuda.so.1` opened by name (never linked), looked up
//!   with the real `dlsym`, or are recorded when a program's own `dlsym` found them.
//! - Runtime functions are those of the wrapper's own major (`guard/majors.rs`): the next
//!   definition after this library with that major's version node, else one in a runtime
//!   loaded privately.
//!
//! A pointer that is one of our own wrappers is never recorded as real (a driver that
//! resolves itself through `dlsym` would get our wrapper back and loop forever). A real
//! function that cannot be found leaves the slot empty; the wrapper then returns
//! `CUDA_ERROR_NOT_FOUND`/`cudaErrorSymbolNotFound` (500) and says so.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::guard::table::SLOTS;
use crate::guard::table::{Lib, TABLE};

// The C library's lookup (dl.rs) and the any-major runtime lookup (majors.rs), under the
// names their callers know them by.
pub use crate::guard::resolve::dl::{
    driver_handle, init_real_dlsym, is_own, lookup, real_dlvsym_addr, vlookup, REAL_DLSYM,
    REAL_DLVSYM,
};
pub use crate::guard::resolve::majors::any_runtime;

/// The real function of table entry `id`, or null if it cannot be found.
#[inline]
pub fn get(id: usize) -> *mut c_void {
    let p = SLOTS[id].real.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    resolve(id)
}

#[cold]
fn resolve(id: usize) -> *mut c_void {
    let e = &TABLE[id];
    match e.lib {
        Lib::Driver => resolve_slot(e.lib, e.abi_cstr(), e.real()),
        // Each runtime wrapper calls its own major's runtime (guard/majors.rs).
        Lib::Runtime => {
            let p = crate::guard::resolve::majors::resolve(e);
            if p.is_null() || is_own(p) {
                return ptr::null_mut();
            }
            match e
                .real()
                .compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => p,
                Err(existing) => existing,
            }
        }
    }
}

/// Find the real function `name` of `lib` and record it in `slot` (unless one is recorded
/// already); returns the recorded one, or null if it cannot be found.
#[cold]
pub fn resolve_slot(lib: Lib, name: &CStr, slot: &AtomicPtr<c_void>) -> *mut c_void {
    let mut p = match lib {
        Lib::Driver => {
            let h = driver_handle();
            if h.is_null() {
                ptr::null_mut()
            } else {
                lookup(h, name)
            }
        }
        Lib::Runtime => any_runtime(name),
    };
    if is_own(p) {
        p = ptr::null_mut();
    }
    if p.is_null() {
        return p;
    }
    match slot.compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// Record `p` as entry `id`'s real function unless one is recorded already; returns the
/// recorded one.
pub fn record(id: usize, p: *mut c_void) -> *mut c_void {
    if p.is_null() || is_own(p) {
        return TABLE[id].real().load(Ordering::Acquire);
    }
    match TABLE[id]
        .real()
        .compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// Resolve every driver entry (once, before routing by pointer).
pub fn resolve_all_driver() {
    for (id, e) in TABLE.iter().enumerate() {
        if e.lib == Lib::Driver {
            let _ = get(id);
        }
    }
}

//! Finding the real functions behind the wrappers, all in one place.
//!
//! - The real `dlvsym` is read from the C library's dynamic symbol table (`libcsym.rs`):
//!   this library exports `dlvsym` too, so calling it by name would call ourselves. The
//!   real `dlsym` comes from the real `dlvsym(RTLD_NEXT, "dlsym", <version>)`: our own
//!   `dlsym` export would otherwise answer.
//! - Driver functions come from the driver's own symbol table when the program was linked
//!   with it (`sys::libcsym::linked_driver`: loaded before `main`, never unloaded), else
//!   from `libcuda.so.1` opened by name (never linked) and looked up with the real `dlsym`,
//!   or are recorded when a program's own `dlsym` found them (docs/design.md §2, "Real
//!   functions").
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
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::guard::sys::lifecycle::{keep_first, ForkSafeOnce};
use crate::guard::sys::signal_safe;
use crate::guard::table::SLOTS;
use crate::guard::table::{Id, Lib, TABLE};

// The C library's lookup (dl.rs) and the any-major runtime lookup (majors.rs), under the
// names their callers know them by.
pub use crate::guard::resolve::dl::{
    driver_handle, init_real_dlsym, is_own, lookup, real_dlvsym_addr, vlookup, REAL_DLSYM,
    REAL_DLVSYM,
};
pub use crate::guard::resolve::majors::any_runtime;

/// The R1 check at the first `cuInit` (`init_check::around_init` runs it).
pub static R1_CHECK: ForkSafeOnce = ForkSafeOnce::new();

/// The thread running the R1 check (valid while [`R1_CHECK`] is in progress).
pub static R1_CHECKER: AtomicU32 = AtomicU32::new(0);

/// Whether a guarded driver function may be published for the hot path ([`get`]): true
/// once R1 is decided, after waiting while another thread of this process is in the
/// check. False, without waiting, before any `cuInit` (the driver itself answers
/// `CUDA_ERROR_NOT_INITIALIZED` then) and in the checking thread itself (its own queries
/// of the driver): such calls proceed unpublished, through the cold path each time.
pub fn verdict_gate() -> bool {
    R1_CHECK.settled(|| R1_CHECKER.load(Ordering::Relaxed) == signal_safe::tid())
}

/// The real function of table entry `id`, or null if it cannot be found.
///
/// The hot path is one load of the published slot. A driver function's slot is published
/// only once the R1 check has decided ([`verdict_gate`]): until then every call
/// takes the cold path, which waits there while another thread of the process is in the
/// check, so no guarded driver call of any thread proceeds before the verdict, at no cost
/// to the allowed path (issue 29, item 1).
///
/// A process's first `cuInit` is usually its first touch of the slots' page: `cuInit`'s
/// own wrapper takes it with a write (a compare-and-swap of null for null, which x86
/// performs as a locked write whatever it compares), which maps a page of its own at once,
/// where a first read maps the shared zero page and the write that follows (the resolved
/// function) copies it: one page fault instead of two. A constant test: compiled away in
/// every other wrapper.
#[inline]
pub fn get(id: usize) -> *mut c_void {
    if id == Id::cuInit as usize {
        let null = std::ptr::null_mut();
        let _ = SLOTS[id]
            .real
            .compare_exchange(null, null, Ordering::Relaxed, Ordering::Relaxed);
    }
    let p = SLOTS[id].real.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    resolve(id)
}

/// The published real function of entry `id`, or null when it is not published yet:
/// one load, nothing else (a wrapper's hot path, `guarded_wrapper!`; null sends the call
/// to the wrapper's cold half, which resolves it through [`get`]).
#[inline(always)]
pub fn published(id: usize) -> *mut c_void {
    SLOTS[id].real.load(Ordering::Acquire)
}

#[cold]
fn resolve(id: usize) -> *mut c_void {
    let e = &TABLE[id];
    let p = find(id);
    if p.is_null() {
        return p;
    }
    // Runtime functions are published at once: a runtime's own driver calls reach the
    // driver's wrappers, which wait (and the runtime's first call is what runs cuInit).
    if e.lib == Lib::Runtime || verdict_gate() {
        SLOTS[id].real.store(p, Ordering::Release);
    }
    p
}

/// The real function of table entry `id`, found on first use, published or not (the
/// guard's own queries, routing).
pub fn find(id: usize) -> *mut c_void {
    let e = &TABLE[id];
    let p = e.found().load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    match e.lib {
        Lib::Driver => resolve_slot(e.lib, e.abi_cstr(), e.found()),
        // Each runtime wrapper calls its own major's runtime (guard/majors.rs).
        Lib::Runtime => {
            let p = crate::guard::resolve::majors::resolve(e);
            if p.is_null() || is_own(p) {
                return ptr::null_mut();
            }
            keep_first(e.found(), p)
        }
    }
}

/// Find the real function `name` of `lib` and record it in `slot` (unless one is recorded
/// already); returns the recorded one, or null if it cannot be found.
#[cold]
pub fn resolve_slot(lib: Lib, name: &CStr, slot: &AtomicPtr<c_void>) -> *mut c_void {
    let mut p = match lib {
        // The driver the program was linked with: its own table, no `dlopen` (libcsym.rs).
        Lib::Driver if let Some(a) = crate::guard::sys::libcsym::linked_driver(name) => {
            a as *mut c_void
        }
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
    keep_first(slot, p)
}

/// Keep `p` as entry `id`'s found real function unless one is kept already (found, not
/// yet published for [`get`]: [`published`]); returns the kept one.
pub fn keep_found(id: usize, p: *mut c_void) -> *mut c_void {
    if is_own(p) {
        return TABLE[id].found().load(Ordering::Acquire);
    }
    keep_first(TABLE[id].found(), p)
}

/// Find every driver entry (once, before routing by pointer); publishes nothing.
pub fn resolve_all_driver() {
    for (id, e) in TABLE.iter().enumerate() {
        if e.lib == Lib::Driver {
            let _ = find(id);
        }
    }
}

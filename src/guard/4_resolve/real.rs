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

use std::ffi::{c_char, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use crate::guard::hooks::wrappers::SLOTS;
use crate::guard::resolve::majors;
use crate::guard::sys::once::ForkSafeOnce;
use crate::guard::sys::signal_safe;
use crate::guard::table::{Lib, TABLE};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// The real `dlvsym`, as an address (the `dlvsym` trampoline jumps through it).
pub static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);

/// The real `dlsym`, as an address (the naked trampoline jumps through it).
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

static DRIVER: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Versions of `dlsym` to ask `dlvsym` for: glibc 2.34 moved it into libc.so.6 under a
/// new version; older glibc has only the base version of the architecture.
#[cfg(target_arch = "x86_64")]
const DLSYM_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
#[cfg(target_arch = "aarch64")]
const DLSYM_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];

/// The real `dlsym`, resolving it on first use.
#[inline]
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        p = init_real_dlsym();
    }
    if p == 0 {
        return None;
    }
    // SAFETY: `p` is the address dlvsym returned for "dlsym", whose C signature is DlsymFn.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// The real `dlvsym`'s address, resolving it on first use; 0 when there is none (not glibc).
#[inline]
pub fn real_dlvsym_addr() -> usize {
    let p = REAL_DLVSYM.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    init_real_dlvsym()
}

#[cold]
fn init_real_dlvsym() -> usize {
    let p = crate::guard::sys::libcsym::find_dlvsym();
    if p != 0 {
        REAL_DLVSYM.store(p, Ordering::Release);
    }
    p
}

/// The real `dlvsym(handle, name, version)` with this library as the caller (so
/// `RTLD_NEXT` means: after it); null when there is no real `dlvsym`.
pub fn vlookup(handle: *mut c_void, name: &CStr, version: &CStr) -> *mut c_void {
    vlookup_raw(handle, name.as_ptr(), version.as_ptr())
}

/// [`vlookup`] with C strings as they came (`dlvsym`'s own arguments).
pub fn vlookup_raw(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let p = real_dlvsym_addr();
    if p == 0 {
        return ptr::null_mut();
    }
    // SAFETY: `p` is the C library's `dlvsym` (libcsym.rs), whose C signature is DlvsymFn;
    // the strings are NUL-terminated (the callers' contract, dlvsym's own).
    unsafe { std::mem::transmute::<usize, DlvsymFn>(p)(handle, name, version) }
}

#[cold]
pub fn init_real_dlsym() -> usize {
    for v in DLSYM_VERSIONS {
        // Through the real dlvsym: this library's own `dlvsym` export would answer a call by
        // name; the real one, called from here, takes this library as the caller.
        let p = vlookup(libc::RTLD_NEXT, c"dlsym", v);
        if !p.is_null() {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

/// Look `name` up in `handle` with the real `dlsym` (caller context: this library).
pub fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: `name` is NUL-terminated; `handle` is a dlopen handle or a pseudo-handle.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => ptr::null_mut(),
    }
}

/// The driver library's handle, opening `libcuda.so.1` by name on first use.
pub fn driver_handle() -> *mut c_void {
    let h = DRIVER.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    // SAFETY: the name is NUL-terminated; RTLD_LAZY|RTLD_LOCAL adds no symbols to the global
    // scope. The handle is kept for the life of the process (never dlclose'd).
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if !h.is_null() {
        DRIVER.store(h, Ordering::Release);
    }
    h
}

/// True if `p` is one of this library's wrappers.
pub fn is_own(p: *const c_void) -> bool {
    crate::guard::table::is_wrapper(p)
}

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
            match e.found().compare_exchange(
                ptr::null_mut(),
                p,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => p,
                Err(existing) => existing,
            }
        }
    }
}

/// `name` in any loaded runtime, whatever its major: the next definition after this
/// library, else a runtime loaded privately. For runtime functions the guard calls itself
/// (`internal.rs`) and for wrappers whose parameters are the same in every major.
pub fn any_runtime(name: &CStr) -> *mut c_void {
    let mut p = lookup(libc::RTLD_NEXT, name);
    if p.is_null() || is_own(p) {
        // Not in the global scope: a runtime loaded privately, as a dependency of a
        // library dlopen'ed with RTLD_LOCAL (PyTorch's libtorch_cuda.so, CuPy).
        let h = loaded_runtime();
        p = if h.is_null() {
            ptr::null_mut()
        } else {
            lookup(h, name)
        };
    }
    p
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

/// A handle of the CUDA runtime already loaded in this process, whatever its major version
/// (`libcudart.so.12`, `libcudart.so.13`, ...), or null. Loads nothing: the runtime a
/// wrapper was reached from is necessarily loaded. The loaded runtimes are listed once, by
/// [`majors::loaded_runtimes`]; a renamed wheel copy (`libcudart-<hash>.so.12`) is not
/// taken here.
fn loaded_runtime() -> *mut c_void {
    let mut names = [ptr::null(); majors::MAX_RUNTIMES];
    let n = majors::loaded_runtimes(&mut names);
    for &name in &names[..n] {
        // SAFETY: `name` is a loaded object's NUL-terminated name from the loader's records.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        let base = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
        if base.starts_with(b"libcudart.so") {
            // SAFETY: as above; RTLD_NOLOAD returns a handle only for an object already
            // loaded, loading nothing.
            return unsafe { libc::dlopen(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        }
    }
    ptr::null_mut()
}

/// Record `p` as entry `id`'s real function unless one is recorded already; returns the
/// recorded one.
pub fn record(id: usize, p: *mut c_void) -> *mut c_void {
    if p.is_null() || is_own(p) {
        return TABLE[id].found().load(Ordering::Acquire);
    }
    match TABLE[id].found().compare_exchange(
        ptr::null_mut(),
        p,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// Find every driver entry (once, before routing by pointer); publishes nothing.
pub fn resolve_all_driver() {
    for (id, e) in TABLE.iter().enumerate() {
        if e.lib == Lib::Driver {
            let _ = find(id);
        }
    }
}

//! The C library's symbol lookup: the real `dlsym` and `dlvsym` (found through the loaded
//! C library's own tables, `sys::libcsym`), lookups by name and by version, the driver's
//! handle, and whether a pointer is one of this library's wrappers. The lowest part of
//! resolving: `majors` and `real` look up through it.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::guard::sys::lifecycle::keep_first;

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
    keep_first(&DRIVER, h)
}

/// True if `p` is one of this library's wrappers.
pub fn is_own(p: *const c_void) -> bool {
    crate::guard::table::is_wrapper(p)
}

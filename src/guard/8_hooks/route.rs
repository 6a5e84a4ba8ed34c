//! Routing function pointers that CUDA hands out to our wrappers.
//!
//! `cuGetProcAddress(_v2)` and `cudaGetDriverEntryPoint(ByVersion)` take a base name and a
//! version and return whichever ABI variant the driver picks (`cuCtxCreate` at 11040 is
//! `cuCtxCreate_v3`). We never guess the variant from the name ("try _v3 then _v2" returns
//! a function of the wrong signature, HAMi-core#233): we compare the pointer the real
//! driver returned with the real address of every guarded ABI symbol, and hand out the
//! wrapper of the one it is (coldzerofear/vgpu-manager `build_driver_routes` does the same).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering;

use crate::guard::output::debug_log;
use crate::guard::resolve::real;
use crate::guard::sys::lifecycle::ForkSafeOnce;
use crate::guard::table::{self, TABLE};

/// The outcome of routing one pointer.
pub enum Routed {
    /// Not a guarded function (or already our wrapper): hand it out unchanged.
    Keep,
    /// A guarded function: hand out this wrapper instead.
    Wrap(*mut c_void),
    /// The name is a guarded API but the pointer matches none of the ABI variants we know
    /// (a newer driver's `_v5`): refuse rather than hand out an unguarded function.
    Unknown,
}

static DRIVER_ROUTES: ForkSafeOnce = ForkSafeOnce::new();

/// Route a driver function pointer returned for `symbol`.
pub fn route(p: *mut c_void, symbol: *const c_char) -> Routed {
    if p.is_null() || real::is_own(p) {
        return Routed::Keep;
    }
    if symbol.is_null() {
        return Routed::Keep;
    }
    // SAFETY: a non-NULL symbol argument of cuGetProcAddress is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    // The name's variants only (binary searches): an unguarded name is kept untouched
    // without resolving anything. A driver asked for an ABI name (`cuCtxCreate_v2`) is
    // routed among that API's variants too.
    let variants = match table::driver_variants(name) {
        Some(v) => v,
        None => match table::find_abi(name)
            .and_then(|id| table::driver_variants(TABLE[id].call().as_bytes()))
        {
            Some(v) => v,
            None => return Routed::Keep,
        },
    };
    DRIVER_ROUTES.call(real::resolve_all_driver);
    for &id in variants {
        let e = &TABLE[id as usize];
        if e.found().load(Ordering::Acquire) == p {
            return Routed::Wrap(e.wrapper() as *mut c_void);
        }
    }
    Routed::Unknown
}

/// The decision behind our `dlsym`: the wrapper to return instead of the real symbol, or
/// NULL to let the real `dlsym` answer (the trampoline then jumps to it with the caller's
/// own return address, so `RTLD_NEXT` keeps its meaning).
///
/// Cheap for every name that is not ours: the trampoline itself forwards every name that
/// is not of the guarded shape (`dlsym.rs`); the same test here covers the process's first
/// lookup, which reaches this function whatever the name, before any table scan. Never
/// loads a library or takes a lock.
pub fn dlsym_decide(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if symbol.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's symbol argument is a NUL-terminated string; `at(i)` is only called
    // when bytes 0..i are non-NUL (each test in guarded_shape needs the previous one true),
    // so it never reads past the NUL.
    let at = |i: usize| unsafe { *symbol.add(i) as u8 };
    if !table::guarded_shape(at) {
        return std::ptr::null_mut();
    }
    // SAFETY: as above, a NUL-terminated string.
    let cname = unsafe { CStr::from_ptr(symbol) };
    let name = cname.to_bytes();
    // RTLD_NEXT depends on the caller's position in the search order, which only the
    // real dlsym, reached with the caller's return address, can know.
    if handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    let entries = table::abi_entries(name);
    let Some(&first) = entries.first() else {
        return std::ptr::null_mut();
    };
    if crate::guard::process::state::try_get().is_some_and(|s| s.inert) {
        return std::ptr::null_mut();
    }
    let found = real::lookup(handle, cname);
    if found.is_null() {
        return std::ptr::null_mut();
    }
    if real::is_own(found) {
        // An unversioned lookup (RTLD_DEFAULT, the program's own handle) found the guard's
        // default (CUDA 13) runtime definition. Where no 13 runtime is loaded but one of
        // another wrapped major is, hand out that major's wrapper: a CUDA 12 process asking
        // the global scope gets the function with its own parameters (guard/majors.rs).
        let e = &TABLE[first as usize];
        if e.lib == table::Lib::Runtime
            && found
                == TABLE[entries[entries.len() - 1] as usize]
                    .wrapper()
                    .cast_mut()
        {
            let default = TABLE[entries[entries.len() - 1] as usize].major;
            if crate::guard::resolve::majors::in_major(cname, default).is_null() {
                for &i in entries.iter().rev().skip(1) {
                    let p = crate::guard::resolve::majors::in_major(cname, TABLE[i as usize].major);
                    if !p.is_null() {
                        real::keep_found(i as usize, p);
                        return TABLE[i as usize].wrapper() as *mut c_void;
                    }
                }
            }
        }
        return found;
    }
    // A runtime function: the wrapper of the major whose version node the handle's
    // definition carries (guard/majors.rs).
    let Some(id) = entry_for(entries, || {
        crate::guard::resolve::majors::major_at(handle, cname, found)
    }) else {
        return std::ptr::null_mut();
    };
    real::keep_found(id, found);
    debug_log::log!(
        Trace,
        "dlsym: handing out the guard's wrapper symbol={}",
        String::from_utf8_lossy(name)
    );
    TABLE[id].wrapper() as *mut c_void
}

/// Which of a name's ABI entries (`entries`, from `table::abi_entries`, not empty) a lookup
/// hands out: a driver function's own, or the runtime wrapper of the major `major` names
/// (asked only for a runtime function). None for a runtime major no wrapper exists for:
/// such a runtime is never given a wrapper with a guessed signature, so the caller hands out
/// its function untouched; `majors::notice_unknown` says so once. Shared by `dlsym` (major
/// from the definition's version node) and `dlvsym` (major from the node asked for).
pub(crate) fn entry_for(entries: &[u16], major: impl FnOnce() -> Option<u8>) -> Option<usize> {
    let first = *entries.first()? as usize;
    if TABLE[first].lib == table::Lib::Driver {
        return Some(first);
    }
    let id = major().and_then(|m| entries.iter().find(|&&i| TABLE[i as usize].major == m));
    if id.is_none() {
        crate::guard::resolve::majors::notice_unknown();
    }
    id.map(|&i| i as usize)
}

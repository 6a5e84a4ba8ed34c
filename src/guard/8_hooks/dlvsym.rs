//! Our `dlvsym`: a naked trampoline that asks [`dlvsym_decide`] and either returns the
//! guard's wrapper or tail-jumps to the real `dlvsym` with the caller's frame intact.
//!
//! `dlvsym(handle, "cudaSetDevice", "libcudart.so.13")` is how a program asks a runtime of
//! one major for its function (the runtime keeps names across majors and tells them apart
//! only by the version node). Asked of a runtime's handle, the real `dlvsym` answers with
//! the runtime's own, unguarded function; the guard hands out the wrapper of the major the
//! version names instead, which calls that runtime (`guard/majors.rs`). A version naming a
//! major no wrapper exists for (`libcudart.so.14`) gets the real function, untouched, and
//! one line says so (`majors::notice_unknown`). A driver name (`cuInit`: the driver has no
//! version nodes, any version matches) gets the same wrapper as `dlsym` hands out.
//!
//! `RTLD_NEXT` keeps its meaning, as with our `dlsym`: the real `dlvsym` decides from the
//! caller's return address, which the trampoline preserves. A program (before this library
//! in the search order) gets the guard's definition of that node; an interposer loaded
//! after it gets the real one, which is what it asks for.
//!
//! The real `dlvsym` is not called by name (that is this export): `libcsym.rs` reads it from
//! the C library's dynamic symbol table. [`dlvsym_decide`] never unwinds, allocates or
//! locks, and always leaves `REAL_DLVSYM` set before it returns NULL (the trampoline jumps
//! through it); `REAL_DLVSYM` stays unexported (see `dlsym.rs`).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};

use crate::guard::hooks::route;
use crate::guard::hooks::trampoline::{ask_then_forward, no_real};
use crate::guard::resolve::real::{self, REAL_DLVSYM};
use crate::guard::table::{self, TABLE};

/// Called by the trampoline. Returns the wrapper to hand out, or NULL to let the real
/// `dlvsym` answer (and set `dlerror`).
extern "C" fn rg_dlvsym_decide(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    if real::real_dlvsym_addr() == 0 {
        no_real(b"RANKGUARD: cannot find the real dlvsym in the C library (libc.so.6, libdl.so.2); librankguard.so needs glibc\n");
    }
    dlvsym_decide(handle, symbol, version)
}

/// The decision behind our `dlvsym`: the wrapper to return instead of the real symbol, or
/// NULL to let the real `dlvsym` answer. Every name that is not of the guarded shape, every
/// `RTLD_NEXT` lookup and every lookup the real `dlvsym` fails is forwarded.
pub fn dlvsym_decide(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    if symbol.is_null() || version.is_null() {
        // glibc faults on either; the forwarded call faults at the same place.
        return std::ptr::null_mut();
    }
    // SAFETY: dlvsym's symbol argument is a NUL-terminated string; `at(i)` is only called
    // when bytes 0..i are non-NUL (table::guarded_shape), so it never reads past the NUL.
    let at = |i: usize| unsafe { *symbol.add(i) as u8 };
    if !table::guarded_shape(at) || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    // SAFETY: both are NUL-terminated strings (dlvsym's contract).
    let (cname, cversion) = unsafe { (CStr::from_ptr(symbol), CStr::from_ptr(version)) };
    let entries = table::abi_entries(cname.to_bytes());
    if entries.is_empty() {
        return std::ptr::null_mut();
    }
    if crate::guard::process::state::try_get().is_some_and(|s| s.inert) {
        return std::ptr::null_mut();
    }
    let found = real::vlookup(handle, cname, cversion);
    if found.is_null() || real::is_own(found) {
        // Not found (the forwarded call says why in dlerror), or already the guard's
        // definition under that node (RTLD_DEFAULT finds this library's first).
        return found;
    }
    // A runtime function: the wrapper of the node's major. A runtime of a major no wrapper
    // exists for (or a node that is no runtime's): its function, untouched.
    let Some(id) = route::entry_for(entries, || node_major(cversion.to_bytes())) else {
        return std::ptr::null_mut();
    };
    real::keep_found(id, found);
    TABLE[id].wrapper() as *mut c_void
}

/// The major of a runtime version node (`libcudart.so.13` -> 13), None for any other node.
pub fn node_major(node: &[u8]) -> Option<u8> {
    let digits = node.strip_prefix(b"libcudart.so.")?;
    if digits.is_empty() || digits.len() > 3 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'));
    u8::try_from(n).ok()
}

#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
/// # Safety
/// Same contract as glibc's `dlvsym`.
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    ask_then_forward!(rg_dlvsym_decide, REAL_DLVSYM)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through_trampoline(handle: *mut c_void, name: &CStr, version: &CStr) -> *mut c_void {
        // SAFETY: a valid handle and NUL-terminated strings: dlvsym's contract.
        unsafe { dlvsym(handle, name.as_ptr(), version.as_ptr()) }
    }

    /// Forwarded names get exactly the real answer (a versioned libc function, a name found
    /// nowhere, a guarded-shape name that is not guarded).
    #[test]
    fn forwarded_lookups_get_the_real_answer() {
        for (name, version) in [
            (c"dlsym", c"GLIBC_2.2.5"),
            (c"dlsym", c"GLIBC_2.34"),
            (c"cuserid", c"GLIBC_2.2.5"),
            (c"cuNoSuchFunction", c"GLIBC_2.2.5"),
            (c"nothing_here", c"NO_SUCH_VERSION"),
        ] {
            let p = through_trampoline(libc::RTLD_DEFAULT, name, version);
            assert_eq!(
                p,
                real::vlookup(libc::RTLD_DEFAULT, name, version),
                "{name:?}"
            );
        }
        assert!(!through_trampoline(libc::RTLD_DEFAULT, c"dlsym", c"GLIBC_2.2.5").is_null());
    }

    #[test]
    fn runtime_nodes_name_their_major() {
        assert_eq!(node_major(b"libcudart.so.12"), Some(12));
        assert_eq!(node_major(b"libcudart.so.13"), Some(13));
        assert_eq!(node_major(b"libcudart.so.14"), Some(14));
        for bad in [
            &b"libcudart.so."[..],
            b"libcudart.so.1x",
            b"libcudart.so.1234",
            b"libcudart.so.999",
            b"GLIBC_2.34",
            b"libcudart-abc.so.12",
        ] {
            assert_eq!(node_major(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}

//! CUDA runtime majors side by side (12 and 13): which runtime a runtime wrapper calls.
//!
//! The runtime keeps a function's name across majors and changes its parameters
//! (`cudaMemPrefetchAsync`: `int dstDevice` in 12, `struct cudaMemLocation, unsigned flags`
//! in 13); only the version node tells them apart. Each wrapped major has its own wrappers,
//! generated from that major's header and defined under its node
//! (`cudaMemPrefetchAsync@libcudart.so.12`, `@@libcudart.so.13`), so a program's versioned
//! reference reaches the wrapper with its own parameters. That wrapper calls the real
//! function of *its* major: `dlvsym(name, "libcudart.so.N")`, first in the global scope after
//! this library, then in every runtime loaded privately (RTLD_LOCAL). A symbol whose
//! parameters are the same in every major may fall back to a runtime of another major when
//! none of its own is loaded (an unversioned lookup, such as `dlsym(RTLD_NEXT)` from a
//! program that interposes the runtime itself, finds the default, 13, definition).
//!
//! Two copies of one major (a wheel's renamed `libcudart-<hash>.so.12` beside the shared
//! `libcudart.so.12`) carry the same node: their callers share one wrapper and one real
//! function, the first found (the global scope's, else the first loaded). Both copies talk
//! to the same driver, which every guarded decision goes through; routing by caller would
//! cost the allowed path a caller lookup per call (README, "Runtime majors").
//!
//! A runtime of a major no wrapper exists for (a future 14) is never given a wrapper with a
//! guessed signature: its versioned references do not bind to ours, its calls pass
//! untouched, and one line says so ([`notice_unknown`]); the driver layer, which every
//! runtime goes through, still enforces the contract.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};
use std::fmt::Write;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::guard::resolve::dl;
use crate::guard::sys::lifecycle::PerProcess;
use crate::guard::sys::loaded;
use crate::guard::sys::signal_safe::{self, StackBuf};
use crate::guard::table::{self, Entry};

/// At most this many runtimes are looked at (a process with more is not a real case; the
/// rest are not searched, never an out-of-bounds write).
pub(crate) const MAX_RUNTIMES: usize = 8;

/// The paths of the loaded objects whose file name starts with `libcudart`, in load order.
pub(crate) fn loaded_runtimes(out: &mut [*const c_char; MAX_RUNTIMES]) -> usize {
    let mut names = [ptr::null(); MAX_RUNTIMES];
    let mut n = 0;
    loaded::each(|_, path| {
        if n < MAX_RUNTIMES && loaded::basename(path.to_bytes()).starts_with(b"libcudart") {
            // The loader's own copy of the name, valid while the object is loaded.
            names[n] = path.as_ptr();
            n += 1;
        }
        n == MAX_RUNTIMES
    });
    *out = names;
    n
}

/// The major in a runtime's file name: `libcudart.so.13`, `libcudart-a1b2c3d4.so.12`,
/// `libcudart.so.12.9.79` -> 13, 12, 12. None when the name carries none.
pub fn major_of(path: &[u8]) -> Option<u32> {
    let base = loaded::basename(path);
    let at = base.windows(4).position(|w| w == b".so.")? + 4;
    let digits = base[at..].split(|&b| b == b'.').next()?;
    if digits.is_empty() || digits.len() > 4 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits
        .iter()
        .try_fold(0u32, |n, &d| Some(n * 10 + u32::from(d - b'0')))
}

/// The real `dlvsym` with this library as the caller (so `RTLD_NEXT` means: after it).
fn dlvsym(handle: *mut c_void, name: &CStr, node: &CStr) -> *mut c_void {
    crate::guard::resolve::dl::vlookup(handle, name, node)
}

/// The real function of a runtime wrapper: its own major's, found by version node in the
/// global scope after this library, else in a privately loaded runtime; for a symbol with
/// the same parameters in every major, any loaded runtime's when none of its major is
/// loaded. Null when there is none.
pub fn resolve(e: &Entry) -> *mut c_void {
    let name = e.abi_cstr();
    let p = in_major(name, e.major);
    if !p.is_null() {
        return p;
    }
    if e.same_everywhere {
        return any_runtime(name);
    }
    ptr::null_mut()
}

/// `name` as defined by a loaded runtime of `major` (by version node): the global scope's
/// after this library, else a privately loaded one's; null if none.
pub fn in_major(name: &CStr, major: u8) -> *mut c_void {
    if let Some(node) = table::runtime_node(major) {
        let p = dlvsym(libc::RTLD_NEXT, name, node);
        if !p.is_null() && !crate::guard::resolve::dl::is_own(p) {
            return p;
        }
        let mut names = [ptr::null(); MAX_RUNTIMES];
        let n = loaded_runtimes(&mut names);
        for &path in &names[..n] {
            // SAFETY: `path` names a loaded object; RTLD_NOLOAD loads nothing.
            let h = unsafe { libc::dlopen(path, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if h.is_null() {
                continue;
            }
            let p = dlvsym(h, name, node);
            if !p.is_null() && !crate::guard::resolve::dl::is_own(p) {
                return p;
            }
        }
    }
    ptr::null_mut()
}

/// The wrapped major whose version node `handle`'s definition `found` of `name` carries,
/// or None (a runtime of a major no wrapper exists for).
pub fn major_at(handle: *mut c_void, name: &CStr, found: *mut c_void) -> Option<u8> {
    table::RUNTIME_MAJORS
        .into_iter()
        .find(|&m| table::runtime_node(m).is_some_and(|node| dlvsym(handle, name, node) == found))
}

static UNKNOWN_SAID: PerProcess = PerProcess::new();
/// The first unknown runtime's path, for tests of the line.
static UNKNOWN_PATH: AtomicPtr<c_char> = AtomicPtr::new(ptr::null_mut());

/// Say once per process, on stderr, that a loaded runtime is of a major no wrapper exists
/// for (its calls pass untouched; the driver layer still enforces). Called at the first
/// `cuInit` (every runtime initialises the driver) and when `dlsym` hands out a runtime
/// function of such a major. Loads nothing, allocates nothing.
pub fn notice_unknown() {
    let pid = signal_safe::pid();
    if UNKNOWN_SAID.done_in(pid) {
        return;
    }
    let mut names = [ptr::null(); MAX_RUNTIMES];
    let n = loaded_runtimes(&mut names);
    for &path in &names[..n] {
        // SAFETY: a loaded object's NUL-terminated name.
        let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
        let known = major_of(bytes)
            .is_some_and(|m| table::RUNTIME_MAJORS.iter().any(|&k| u32::from(k) == m));
        if known || !UNKNOWN_SAID.first_in(pid) {
            continue;
        }
        UNKNOWN_PATH.store(path.cast_mut(), Ordering::Relaxed);
        let shown = std::str::from_utf8(bytes).unwrap_or("libcudart (name not UTF-8)");
        let mut wrapped = StackBuf::<64>::new();
        for (i, m) in table::RUNTIME_MAJORS.iter().enumerate() {
            let _ = write!(wrapped, "{}{m}", if i > 0 { " and " } else { "" });
        }
        crate::guard::output::line::say(
            "WARN",
            format_args!(
                "{shown} is a CUDA runtime of a major this guard has no wrappers for (it wraps {}): its runtime calls pass untouched; the driver layer (cuInit, device ordinals, peer access, IPC) still enforces the contract. Upgrade rankguard.",
                std::str::from_utf8(wrapped.as_bytes()).unwrap_or("")
            ),
        );
        return;
    }
}

/// `name` in any loaded runtime, whatever its major: the next definition after this
/// library, else a runtime loaded privately. For runtime functions the guard calls itself
/// (`internal.rs`) and for wrappers whose parameters are the same in every major.
pub fn any_runtime(name: &CStr) -> *mut c_void {
    let mut p = dl::lookup(libc::RTLD_NEXT, name);
    if p.is_null() || dl::is_own(p) {
        // Not in the global scope: a runtime loaded privately, as a dependency of a
        // library dlopen'ed with RTLD_LOCAL (PyTorch's libtorch_cuda.so, CuPy).
        let h = loaded_runtime();
        p = if h.is_null() {
            ptr::null_mut()
        } else {
            dl::lookup(h, name)
        };
    }
    p
}

/// A handle of the CUDA runtime already loaded in this process, whatever its major version
/// (`libcudart.so.12`, `libcudart.so.13`, ...), or null. Loads nothing: the runtime a
/// wrapper was reached from is necessarily loaded. The loaded runtimes are listed once, by
/// [`loaded_runtimes`]; a renamed wheel copy (`libcudart-<hash>.so.12`) is not
/// taken here.
fn loaded_runtime() -> *mut c_void {
    let mut names = [ptr::null(); MAX_RUNTIMES];
    let n = loaded_runtimes(&mut names);
    for &name in names.iter().take(n) {
        // SAFETY: `name` is a loaded object's NUL-terminated name from the loader's records.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        if loaded::basename(bytes).starts_with(b"libcudart.so") {
            // SAFETY: as above; RTLD_NOLOAD returns a handle only for an object already
            // loaded, loading nothing.
            return unsafe { libc::dlopen(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        }
    }
    ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_from_file_names() {
        for (name, major) in [
            ("libcudart.so.12", Some(12)),
            ("/usr/lib/libcudart.so.13", Some(13)),
            ("/site/nvidia/cu13/lib/libcudart.so.13.0.96", Some(13)),
            ("/site/cupy/.libs/libcudart-a1b2c3d4.so.12", Some(12)),
            ("libcudart.so.14", Some(14)),
            ("libcudart.so", None),
            ("libcudart.so.", None),
            ("libcudart.so.x1", None),
            ("libcudart.so.123456", None),
            ("libcudart_static.a", None),
        ] {
            assert_eq!(major_of(name.as_bytes()), major, "{name}");
        }
    }

    /// Every wrapped major has a node, and only those.
    #[test]
    fn nodes_of_the_wrapped_majors() {
        for m in table::RUNTIME_MAJORS {
            assert_eq!(
                table::runtime_node(m).unwrap().to_bytes(),
                format!("libcudart.so.{m}").as_bytes()
            );
        }
        assert!(table::runtime_node(14).is_none());
        assert!(table::runtime_node(0).is_none());
    }
}

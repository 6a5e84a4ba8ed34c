//! The objects loaded in this process, as the loader lists them: one `dl_iterate_phdr`
//! walk for every caller (the C library's and a linked driver's symbol tables, `libcsym`; the loaded CUDA
//! runtimes, `resolve::majors`), and the file name of an object's path. No allocation and
//! no lock of ours (the walk takes the loader's recursive lock, as `dlsym` does).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};

/// The file name of a path: what follows its last `/` (all of it when it has none).
pub fn basename(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// Call `visit` with each loaded object that has a name (its loader record, valid during
/// the call, and its path as the loader keeps it; the main program's is empty), in load
/// order, until it returns true. Generic, not `dyn`: a closure's vtable would be one more
/// pointer in a static for the loader to relocate at every process start.
pub fn each<F: FnMut(&libc::dl_phdr_info, &CStr) -> bool>(mut visit: F) {
    unsafe extern "C" fn trampoline<F: FnMut(&libc::dl_phdr_info, &CStr) -> bool>(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the duration of the callback;
        // `data` is the `F` of `each` below, alive for the whole walk; a non-null name is
        // the loader's NUL-terminated path of the object.
        unsafe {
            let visit = &mut *data.cast::<F>();
            let info = &*info;
            if info.dlpi_name.is_null() {
                return 0;
            }
            c_int::from(visit(info, CStr::from_ptr(info.dlpi_name)))
        }
    }
    // SAFETY: the callback only reads the info it is given and calls `visit`.
    unsafe { libc::dl_iterate_phdr(Some(trampoline::<F>), (&raw mut visit).cast()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basename_is_what_follows_the_last_slash() {
        assert_eq!(basename(b"/usr/lib/libc.so.6"), b"libc.so.6");
        assert_eq!(basename(b"libc.so.6"), b"libc.so.6");
        assert_eq!(basename(b"/lib/"), b"");
        assert_eq!(basename(b""), b"");
    }

    /// The walk sees this process's C library, and stops when asked to.
    #[test]
    fn the_walk_sees_the_c_library_and_stops_when_asked() {
        let (mut seen, mut libc) = (0, false);
        each(|_, path| {
            seen += 1;
            libc |= basename(path.to_bytes()) == b"libc.so.6";
            false
        });
        assert!(libc && seen > 1, "{seen} objects, libc {libc}");
        let mut calls = 0;
        each(|_, _| {
            calls += 1;
            true
        });
        assert_eq!(calls, 1);
    }
}

//! What the guard says when it cannot hand out a guarded function: the real one is missing
//! from the CUDA library, or an entry point came back as an ABI variant it does not know.
#![allow(unsafe_code)]

use crate::guard::decide::verdict::Code;
use crate::guard::output::line::say;
use crate::guard::sys::lifecycle::PerProcess;
use crate::guard::sys::signal_safe;
use crate::guard::table::TABLE;

/// The real function of entry `id` is missing: say so once, return the defined error.
#[cold]
pub fn not_found<R: Code>(id: usize) -> R {
    let e = &TABLE[id];
    if e.first_said(signal_safe::pid()) {
        match e.lib {
            crate::guard::table::Lib::Driver => {
                say(
                    "WARN",
                    format_args!(
                        "{}: the real function was not found in libcuda.so.1; returning error 500 (not found). Is the CUDA library installed and on the library path?",
                        e.abi()
                    ),
                );
            }
            // Each major's wrapper has that major's parameters (guard/majors.rs): one whose
            // parameters differ between majors never calls another major's runtime.
            crate::guard::table::Lib::Runtime => {
                say(
                    "WARN",
                    format_args!(
                        "{}: the real function was not found in a CUDA {} runtime (libcudart.so.{}){}; returning error 500 (not found). Is the CUDA library installed and on the library path?",
                    e.abi(),
                    e.major,
                    e.major,
                    if e.same_everywhere {
                        ""
                    } else {
                        ", and its parameters differ in the other CUDA majors, whose runtimes it never calls"
                    }
                    ),
                );
            }
        }
    }
    R::missing()
}

/// A guarded API's entry point came back as a pointer matching none of its ABI variants
/// we know: say so (once per process) and refuse it.
#[cold]
pub fn unknown_variant(symbol: *const std::ffi::c_char) {
    static SAID: PerProcess = PerProcess::new();
    if !SAID.first() {
        return;
    }
    let name = if symbol.is_null() {
        "?"
    } else {
        // SAFETY: a non-NULL symbol argument is a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(symbol) }
            .to_str()
            .unwrap_or("?")
    };
    say(
        "WARN",
        format_args!(
            "entry point for {name} is an ABI variant this guard does not know (newer driver?); refusing it (pointer NULL, status not found) rather than handing out an unguarded function. Upgrade rankguard."
        ),
    );
}

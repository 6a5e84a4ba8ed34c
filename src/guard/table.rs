//! The one declarative table of guarded functions, and the macros that build it.
//!
//! `guarded!` (invoked once, by `wrappers.rs` including the generated `generated.rs`)
//! takes every guarded ABI symbol (a runtime one once per major) with its C signature and
//! body and generates, from that single list:
//! - the exported wrapper (driver: `#[no_mangle]`, unversioned; runtime: defined under its
//!   major's version node, `cudaSetDevice@libcudart.so.12` / `@@libcudart.so.13`);
//! - its entry in [`TABLE`]: ABI name, the API name programs call it by, library, runtime
//!   major, the slot of the real function, the wrapper's address.
//!
//! Every interposition layer (exported symbols, `dlsym`, `cuGetProcAddress`,
//! `cudaGetDriverEntryPoint`) derives from [`TABLE`]; nothing is listed twice.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};

/// Which library a guarded function belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Driver,
    Runtime,
}

/// One guarded ABI symbol.
pub struct Entry {
    pub lib: Lib,
    /// The runtime major whose parameters this wrapper has (0 for the driver, whose ABI
    /// symbols never change meaning).
    pub major: u8,
    /// Whether this symbol has the same parameters in every wrapped runtime major (always
    /// for the driver): only then may its wrapper call a runtime of another major.
    pub same_everywhere: bool,
    /// The API name programs write (`cuCtxCreate` for `cuCtxCreate_v2`): the name
    /// `cuGetProcAddress` is asked for, and the `call` of reports.
    pub call: &'static str,
    /// The exported ABI symbol, NUL-terminated.
    abi: &'static str,
    pub real: AtomicPtr<c_void>,
    wrapper: *const (),
    /// The pid that last said this symbol's first violation on stderr: later ones in the
    /// same process go to the audit file and the debug log only, so a loop cannot flood the
    /// terminal; a forked child says its own first one.
    pub said: AtomicU32,
    /// Ordinals (0..63) whose queries were already recorded in warn mode.
    pub queried: AtomicU64,
}

// SAFETY: `wrapper` is the address of a function (immutable code); every other field is
// immutable or atomic.
unsafe impl Sync for Entry {}

impl Entry {
    pub const fn new(
        lib: Lib,
        major: u8,
        same_everywhere: bool,
        call: &'static str,
        abi: &'static str,
        wrapper: *const (),
    ) -> Entry {
        Entry {
            lib,
            major,
            same_everywhere,
            call,
            abi,
            real: AtomicPtr::new(std::ptr::null_mut()),
            wrapper,
            said: AtomicU32::new(0),
            queried: AtomicU64::new(0),
        }
    }

    /// The ABI name without its NUL.
    pub fn abi(&self) -> &'static str {
        &self.abi[..self.abi.len() - 1]
    }

    pub fn abi_cstr(&self) -> &'static CStr {
        // The macro appends exactly one NUL and Rust identifiers contain none.
        match CStr::from_bytes_with_nul(self.abi.as_bytes()) {
            Ok(c) => c,
            Err(_) => c"",
        }
    }

    /// True the first time this process says something about this symbol.
    pub fn first_said(&self, pid: u32) -> bool {
        self.said.swap(pid, std::sync::atomic::Ordering::Relaxed) != pid
    }

    pub fn wrapper(&self) -> *const c_void {
        self.wrapper.cast()
    }
}

/// Whether a name can be a guarded one, from its first bytes alone: every guarded ABI name
/// is `cu<Upper>...` (driver) or `cuda<Upper>...` (runtime), so `curl_*`, `cudnn*`,
/// `cublas*` and all other names are rejected in at most five byte compares, without
/// `strlen` (the `dlsym` hot path). `at(i)` is the name's byte i; it is only asked for byte
/// i when bytes 0..i matched (and so are not NUL).
#[inline(always)]
pub fn guarded_shape(at: impl Fn(usize) -> u8) -> bool {
    at(0) == b'c'
        && at(1) == b'u'
        && (at(2).is_ascii_uppercase()
            || (at(2) == b'd' && at(3) == b'a' && at(4).is_ascii_uppercase()))
}

/// The entries whose ABI name is `name` (a runtime name: one per wrapped major, in major
/// order), empty if none: binary searches of the generated, sorted [`BY_ABI`].
pub fn abi_entries(name: &[u8]) -> &'static [(&'static str, u16)] {
    let lo = BY_ABI.partition_point(|(abi, _)| abi.as_bytes() < name);
    let hi = lo + BY_ABI[lo..].partition_point(|(abi, _)| abi.as_bytes() == name);
    &BY_ABI[lo..hi]
}

/// The first entry whose ABI name is `name` (the driver's only one).
pub fn find_abi(name: &[u8]) -> Option<usize> {
    abi_entries(name).first().map(|&(_, id)| id as usize)
}

/// The entries of every ABI variant of the guarded driver API `name` (`cuCtxCreate`:
/// bare, `_v2`, `_v3`, `_v4`), or None when `name` is not a guarded driver API: a binary
/// search of the generated, sorted [`DRIVER_APIS`].
pub fn driver_variants(name: &[u8]) -> Option<&'static [u16]> {
    DRIVER_APIS
        .binary_search_by(|(api, _)| api.as_bytes().cmp(name))
        .ok()
        .map(|i| DRIVER_APIS[i].1)
}

/// Generates the wrappers and [`TABLE`] from the items of `generated.rs`, one per ABI
/// symbol and (runtime) major:
/// `Driver 0 "cuCtxCreate" "cuCtxCreate_v2" same true fn cuCtxCreate_v2(pctx: *mut CUcontext, ...) -> CuResult |real| { body }`
/// `Runtime 13 "cudaSetDevice" "cudaSetDevice" same true symver "cudaSetDevice@@libcudart.so.13" fn cudaSetDevice_cu13(...) -> CudaError |real| { body }`
/// A runtime wrapper is defined under its major's version node (`symver`, in builds linked
/// with `src/guard/librankguard.map`: cfg `rankguard_symver`); in other builds the
/// `fallback` one is exported under the plain name instead. `same` says whether the
/// symbol's parameters are the same in every wrapped major. In the body, `real` is the real
/// function of the symbol being called (already resolved: a missing one returns 500 before
/// the body runs) and `ID` is its entry's index.
macro_rules! guarded {
    ($( $lib:ident $major:literal $call:literal $abi:literal same $same:literal
        $( symver $sv:literal )? $( fallback $fb:literal )?
        fn $sym:ident ( $( $arg:ident : $ty:ty ),* $(,)? )
        -> $ret:ty | $real:ident | $body:block )*) => {
        // Variants are the C names (`cuCtxGetId` ends with the enum's name), runtime ones
        // with their major (`cudaSetDevice_cu13`).
        #[allow(non_camel_case_types, dead_code, clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Id { $( $sym, )* }

        pub const COUNT: usize = [$( stringify!($sym), )*].len();

        pub static TABLE: [$crate::guard::table::Entry; COUNT] = [
            $( $crate::guard::table::Entry::new(
                $crate::guard::table::Lib::$lib,
                $major,
                $same,
                $call,
                concat!($abi, "\0"),
                $sym as *const (),
            ), )*
        ];

        $(
            $( #[cfg(all(not(test), rankguard_symver))]
               ::core::arch::global_asm!(concat!(".symver ", stringify!($sym), ", ", $sv)); )?
            guarded_wrapper! { [ $( $fb )? ] $sym ( $( $arg : $ty ),* ) -> $ret | $real | $body }
        )*
    };
}

/// One exported wrapper (see [`guarded!`]).
macro_rules! guarded_wrapper {
    ([ $fb:literal ] $sym:ident $args:tt -> $ret:ty | $real:ident | $body:block) => {
        guarded_wrapper! { @fn
            #[cfg_attr(all(not(test), rankguard_symver), no_mangle)]
            #[cfg_attr(all(not(test), not(rankguard_symver)), export_name = $fb)]
            $sym $args -> $ret | $real | $body }
    };
    ([] $sym:ident $args:tt -> $ret:ty | $real:ident | $body:block) => {
        guarded_wrapper! { @fn #[cfg_attr(not(test), no_mangle)] $sym $args -> $ret | $real | $body }
    };
    (@fn $( #[$attr:meta] )* $sym:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty | $real:ident | $body:block) => {
        $( #[$attr] )*
        #[allow(non_snake_case, unused_variables, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $sym( $( $arg : $ty ),* ) -> $ret {
            #[allow(dead_code)]
            const ID: usize = Id::$sym as usize;
            let p = $crate::guard::real::get(ID);
            if p.is_null() {
                return $crate::guard::missing::missing::<$ret>(ID);
            }
            // SAFETY: `p` is the real function exported under this wrapper's own ABI
            // name (or the pointer the driver returned for it), so it has exactly this
            // C signature.
            let $real = unsafe {
                ::std::mem::transmute::<*mut ::std::ffi::c_void,
                    unsafe extern "C" fn($( $ty ),*) -> $ret>(p)
            };
            $body
        }
    };
}

/// `gate!(verdict, "fmt", args...)`: if the verdict is not Allow, let the engine decide;
/// return its error code from the enclosing wrapper when the call is denied. The format
/// arguments describe the call's arguments and are only evaluated on that cold path.
macro_rules! gate {
    ($verdict:expr, $($fmt:tt)*) => {{
        let verdict = $verdict;
        if !verdict.is_allow() {
            let ra = $crate::caller_address!();
            match $crate::guard::verdict::repeated(ID, verdict, ra) {
                Some(Ok(())) => {}
                Some(Err(code)) => return code,
                None => {
                    if let Err(code) = $crate::guard::verdict::on_verdict_ra(ID, verdict, format_args!($($fmt)*), ra) {
                        return code;
                    }
                }
            }
        }
    }};
}

pub use crate::guard::wrappers::{runtime_node, Id, BY_ABI, DRIVER_APIS, RUNTIME_MAJORS, TABLE};

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated indexes are sorted (binary search needs it) and name every entry.
    #[test]
    fn indexes_are_sorted_and_complete() {
        assert!(BY_ABI.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(DRIVER_APIS.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(BY_ABI.len(), TABLE.len());
        for (id, e) in TABLE.iter().enumerate() {
            let all = abi_entries(e.abi().as_bytes());
            assert!(all.iter().any(|&(_, i)| i as usize == id), "{}", e.abi());
            assert!(all
                .iter()
                .all(|&(abi, i)| abi == e.abi() && TABLE[i as usize].lib == e.lib));
            if e.lib == Lib::Driver {
                assert_eq!(all.len(), 1, "{}", e.abi());
                assert_eq!(e.major, 0);
            } else {
                assert!(RUNTIME_MAJORS.contains(&e.major), "{}", e.abi());
                // One per major, in major order.
                assert!(all
                    .windows(2)
                    .all(|w| TABLE[w[0].1 as usize].major < TABLE[w[1].1 as usize].major));
            }
            if e.lib == Lib::Driver {
                let vs = driver_variants(e.call.as_bytes()).expect(e.call);
                assert!(vs.contains(&(id as u16)), "{}", e.abi());
            } else {
                assert!(driver_variants(e.call.as_bytes()).is_none(), "{}", e.call);
            }
        }
        assert_eq!(find_abi(b"cuCtxCreate_v9"), None);
        assert_eq!(find_abi(b""), None);
        assert_eq!(driver_variants(b"cuMemAlloc"), None);
    }

    fn shape(name: &str) -> bool {
        let b = name.as_bytes();
        guarded_shape(|i| b.get(i).copied().unwrap_or(0))
    }

    /// The `dlsym` fast path may only reject names that are not in the table.
    #[test]
    fn every_guarded_name_has_the_guarded_shape() {
        for e in TABLE.iter() {
            assert!(
                shape(e.abi()),
                "{} would be forwarded unguarded by dlsym",
                e.abi()
            );
        }
        for other in [
            "curl_easy_init",
            "cudnnCreate",
            "cublasCreate_v2",
            "cu",
            "c",
            "",
            "cuda",
            "cuda_x",
        ] {
            assert!(!shape(other), "{other}");
        }
    }
}

//! Every guarded CUDA function, once: [`generated.rs`](generated.rs), written by
//! `scripts/gen_guarded.py` from the policy spec `guarded.spec` (what the guard does around
//! each API) and NVIDIA's headers (every ABI variant's C signature). The `guarded!` macro
//! derives the exported wrappers and the routing table from it; this file holds the
//! helpers the generated bodies call.
//!
//! Error codes (README contract table): an ordinal other than 0 -> 101 (invalid device,
//! what the driver itself answers under correct visibility); peer access across devices ->
//! 800 (not permitted); a real function that cannot be found -> 500 (not found).
#![allow(unsafe_code, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::guard::decide::ipc::IpcHandle;
use crate::guard::decide::reach;
use crate::guard::decide::{init_check, missing};
use crate::guard::hooks::route::{self, Routed};
use crate::guard::process::driver_query;
use crate::guard::sys::ffi::*;
use crate::policy;

/// Route `*pfn` after a successful entry-point query; refuse an unknown variant of a
/// guarded function (fail closed: the pointer is cleared and the status says not found).
///
/// # Safety
/// `pfn` is NULL or valid for reads and writes; `status` is NULL or valid for writes.
unsafe fn route_out(pfn: *mut *mut c_void, symbol: *const c_char, status: *mut c_int) -> bool {
    if pfn.is_null() {
        return true;
    }
    // SAFETY: caller guarantees `pfn` is valid.
    let p = unsafe { *pfn };
    match route::route(p, symbol) {
        Routed::Keep => true,
        Routed::Wrap(w) => {
            // SAFETY: as above.
            unsafe { *pfn = w };
            true
        }
        Routed::Unknown => {
            missing::unknown_variant(symbol);
            // SAFETY: as above; `status` may be NULL (optional out-parameter).
            unsafe {
                *pfn = std::ptr::null_mut();
                if !status.is_null() {
                    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
                }
            }
            false
        }
    }
}

/// R2 on an optional `CUmemLocation` behind a caller's pointer.
///
/// # Safety
/// `loc` is NULL or points to a readable `CUmemLocation`.
unsafe fn location_at(loc: *const CUmemLocation) -> policy::Verdict {
    if loc.is_null() {
        // The driver rejects a NULL descriptor itself.
        return policy::Verdict::Allow;
    }
    // SAFETY: caller guarantees readability.
    let l = unsafe { *loc };
    policy::location(l.type_, l.id)
}

/// R4 between the devices of two contexts (NULL = the current context).
fn peer_contexts(a: CUcontext, b: CUcontext) -> policy::Verdict {
    if a == b {
        return policy::Verdict::Allow;
    }
    match (
        driver_query::context_device(a),
        driver_query::context_device(b),
    ) {
        (Some(x), Some(y)) => policy::peer(x, y),
        _ => policy::peer_unknown(),
    }
}

/// Generates the exported wrappers from the items of `generated.rs`, one per ABI symbol and
/// (runtime) major, in the order of the table's own generated list (`table::TABLE`, whose
/// `Id` names them):
/// `Driver 0 "cuCtxCreate" "cuCtxCreate_v2" same true fn cuCtxCreate_v2(pctx: *mut CUcontext, ...) -> CuResult |real| { body }`
/// `Runtime 13 "cudaSetDevice" "cudaSetDevice" same true symver "cudaSetDevice@@libcudart.so.13" fn cudaSetDevice_cu13(...) -> CudaError |real| { body }`
/// A runtime wrapper is defined under its major's version node (`symver`, in builds linked
/// with `src/guard/2_table/librankguard.map`: cfg `rankguard_symver`); in other builds the
/// `fallback` one is exported under the plain name instead. `same` says whether the
/// symbol's parameters are the same in every wrapped major. In the body, `real` is the real
/// function of the symbol being called (already resolved: a missing one returns 500 before
/// the body runs) and `ID` is its entry's index.
macro_rules! guarded {
    ($( $lib:ident $major:literal $call:literal $abi:literal same $same:literal
        $( symver $sv:literal )? $( fallback $fb:literal )?
        fn $sym:ident ( $( $arg:ident : $ty:ty ),* $(,)? )
        -> $ret:ty | $real:ident | $( hot $hot:block )? $body:block )*) => {
        /// Each entry's wrapper, as the compiler sees it (the test of `Entry::wrapper`).
        #[cfg(test)]
        pub fn wrapper_fns() -> [*const (); $crate::guard::table::COUNT] {
            [$( $sym as *const (), )*]
        }

        // The wrappers' addresses as 32-bit offsets from the table's own address, in TABLE's
        // order: differences the linker resolves (the wrappers are bound to this library,
        // build.rs `-Bsymbolic`), so none is left for the loader (`Entry::wrapper`).
        ::core::arch::global_asm!(
            ".pushsection .rodata.rankguard_wrapper_offsets,\"a\"",
            ".balign 4",
            ".globl rankguard_wrapper_offsets",
            ".hidden rankguard_wrapper_offsets",
            ".type rankguard_wrapper_offsets, STT_OBJECT",
            "rankguard_wrapper_offsets:",
            $( concat!(".long {", stringify!($sym), "} - rankguard_wrapper_offsets"), )*
            ".size rankguard_wrapper_offsets, . - rankguard_wrapper_offsets",
            ".popsection",
            $( $sym = sym $sym, )*
        );

        $(
            $( #[cfg(all(not(test), rankguard_symver))]
               ::core::arch::global_asm!(concat!(".symver ", stringify!($sym), ", ", $sv)); )?
            guarded_wrapper! { [ $( $fb )? ] $sym ( $( $arg : $ty ),* ) -> $ret | $real | [ $( $hot )? ] $body }
        )*
    };
}

/// One exported wrapper (see [`guarded!`]).
///
/// A wrapper whose check is a pure condition on its arguments (`hot { .. }`, every kind but
/// `hook` and `access`: scripts/gen_guarded.py) is two functions. The exported one is the
/// allowed path and nothing else: one load of the published real function, the condition,
/// and a tail call of the real function (docs/benchmarks.md, "Allowed calls: the hot
/// half"). Anything else (an unpublished slot: first use, R1 not decided yet; a condition
/// that does not hold) tail-calls the cold half with the same arguments, which is the
/// whole wrapper as before: resolution, the verdict, the repeated-violation count, the
/// record. Because the cold half is reached by a jump, not a call, the return address in
/// its frame is the program's call site, as it was in the wrapper's own frame
/// (`caller_address!`); `test_wrapper_code.py` holds every hot half to "no call".
macro_rules! guarded_wrapper {
    ([ $fb:literal ] $sym:ident $args:tt -> $ret:ty | $real:ident | $hot:tt $body:block) => {
        guarded_wrapper! { @hot $hot
            #[cfg_attr(all(not(test), rankguard_symver), no_mangle)]
            #[cfg_attr(all(not(test), not(rankguard_symver)), export_name = $fb)]
            $sym $args -> $ret | $real | $body }
    };
    ([] $sym:ident $args:tt -> $ret:ty | $real:ident | $hot:tt $body:block) => {
        guarded_wrapper! { @hot $hot #[cfg_attr(not(test), no_mangle)] $sym $args -> $ret | $real | $body }
    };
    (@hot [] $( #[$attr:meta] )* $sym:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty | $real:ident | $body:block) => {
        $( #[$attr] )*
        #[allow(non_snake_case, unused_variables, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $sym( $( $arg : $ty ),* ) -> $ret {
            #[allow(dead_code)]
            const ID: usize = $crate::guard::table::Id::$sym as usize;
            guarded_wrapper! { @whole ( $( $arg : $ty ),* ) -> $ret | $real | $body }
        }
    };
    (@hot [ $hot:block ] $( #[$attr:meta] )* $sym:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty | $real:ident | $body:block) => {
        $( #[$attr] )*
        #[allow(non_snake_case, unused_variables, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $sym( $( $arg : $ty ),* ) -> $ret {
            #[allow(dead_code)]
            const ID: usize = $crate::guard::table::Id::$sym as usize;

            /// The whole wrapper: everything but the allowed path of a published slot.
            #[cold]
            #[inline(never)]
            #[allow(non_snake_case, unused_variables)]
            unsafe extern "C" fn cold( $( $arg : $ty ),* ) -> $ret {
                guarded_wrapper! { @whole ( $( $arg : $ty ),* ) -> $ret | $real | $body }
            }

            let p = $crate::guard::resolve::real::published(ID);
            if !p.is_null() && $hot {
                // SAFETY: `p` is the real function published for this wrapper's own ABI
                // name (or the pointer the driver returned for it), so it has exactly this
                // C signature; the arguments are the caller's, passed on unchanged.
                return unsafe {
                    ::std::mem::transmute::<*mut ::std::ffi::c_void,
                        unsafe extern "C" fn($( $ty ),*) -> $ret>(p)( $( $arg ),* )
                };
            }
            // SAFETY: the cold half has this wrapper's own signature and contract; the
            // arguments are the caller's, passed on unchanged.
            unsafe { cold( $( $arg ),* ) }
        }
    };
    (@whole ( $( $arg:ident : $ty:ty ),* ) -> $ret:ty | $real:ident | $body:block) => {{
        let p = $crate::guard::resolve::real::get(ID);
        if p.is_null() {
            return $crate::guard::decide::missing::not_found::<$ret>(ID);
        }
        // SAFETY: `p` is the real function exported under this wrapper's own ABI
        // name (or the pointer the driver returned for it), so it has exactly this
        // C signature.
        let $real = unsafe {
            ::std::mem::transmute::<*mut ::std::ffi::c_void,
                unsafe extern "C" fn($( $ty ),*) -> $ret>(p)
        };
        $body
    }};
}

/// `gate!(verdict, "fmt", args...)`: if the verdict is not Allow, let the engine decide;
/// return its error code from the enclosing wrapper when the call is denied. The format
/// arguments describe the call's arguments and are only evaluated on that cold path.
///
/// The call of [`verdict::cold_path`](crate::guard::decide::verdict::cold_path) makes the allowed
/// call the wrapper's straight line: without it LLVM placed the allowed path out of line,
/// behind a taken branch to wherever it landed (62 bytes into a cache line in one build:
/// +0.9 ns per `cudaSetDevice` at the same instruction count; docs/benchmarks.md,
/// "Allowed calls: layout"). The repeated path stays inlined in the cold block
/// (`tally::counted_again` is `#[inline(always)]`): the allowed call keeps its instructions
/// (+23 per guarded call) and the repeated one its own.
macro_rules! gate {
    ($verdict:expr, $($fmt:tt)*) => {{
        let verdict = $verdict;
        if !verdict.is_allow() {
            $crate::guard::decide::verdict::cold_path();
            let ra = $crate::caller_address!();
            match $crate::guard::decide::verdict::repeated(ID, verdict, ra) {
                Some(Ok(())) => {}
                Some(Err(code)) => return code,
                None => {
                    if let Err(code) = $crate::guard::decide::verdict::on_verdict_ra(ID, verdict, format_args!($($fmt)*), ra) {
                        return code;
                    }
                }
            }
        }
    }};
}

// The wrappers: generated from guarded.spec and NVIDIA's headers (scripts/gen_guarded.py).
include!("generated.rs");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::table::{is_wrapper, Id, NAMES, TABLE};

    /// The linker-computed offsets give each entry its own wrapper, and the names are
    /// each entry's own (not shifted by one piece).
    #[test]
    fn wrappers_and_names_are_each_entrys_own() {
        let fns = wrapper_fns();
        for (id, e) in TABLE.iter().enumerate() {
            assert_eq!(e.wrapper(), fns[id].cast(), "{}", e.abi());
            assert_eq!(e.abi_cstr().to_bytes(), e.abi().as_bytes());
            assert!(e.abi().starts_with(e.call()), "{} / {}", e.abi(), e.call());
        }
        let e = &TABLE[Id::cuCtxCreate_v2 as usize];
        assert_eq!((e.abi(), e.call()), ("cuCtxCreate_v2", "cuCtxCreate"));
        assert!(TABLE.iter().all(|e| is_wrapper(e.wrapper())));
        assert!(!is_wrapper(std::ptr::null()));
        let e = &TABLE[Id::cuDeviceGet as usize];
        assert_eq!(e.wrapper(), cuDeviceGet as *const c_void);
        assert_eq!(NAMES.last(), Some(&0));
    }
}

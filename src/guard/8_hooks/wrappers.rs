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

// The wrappers: generated from guarded.spec and NVIDIA's headers (scripts/gen_guarded.py).
include!("generated.rs");

//! Real CUDA functions the guard itself calls (to learn a context's device, a pointer's
//! device, to undo a denied import) but does not guard: resolved like the wrappers' real
//! functions ([`real::resolve_slot`]), never exported, never routed. Exporting pass-through
//! wrappers for them would add a hop to every program's calls and make each of their ABI
//! variants (`cuMemFreeAsync_ptsz`, ...) one more thing the routing must know.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::guard::ffi::{CUcontext, CUdevice, CuResult, CudaError};
use crate::guard::real;
use crate::guard::table::Lib;

/// `name: Lib fn(args) -> ret;` generates `pub fn name() -> Option<unsafe extern "C" fn(args) -> ret>`.
macro_rules! internal {
    ($( $sym:ident : $lib:ident fn( $( $ty:ty ),* ) -> $ret:ty ; )*) => {
        $(
            #[allow(non_snake_case)]
            pub fn $sym() -> Option<unsafe extern "C" fn($( $ty ),*) -> $ret> {
                static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
                let mut p = SLOT.load(Ordering::Acquire);
                if p.is_null() {
                    p = real::resolve_slot(
                        Lib::$lib,
                        // Rust identifiers hold no NUL, and the literal ends with one.
                        match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($sym), "\0").as_bytes()) {
                            Ok(c) => c,
                            Err(_) => return None,
                        },
                        &SLOT,
                    );
                }
                if p.is_null() {
                    return None;
                }
                // SAFETY: `p` is the real library's export of this exact ABI name, whose C
                // signature (cuda.h / cuda_runtime_api.h 12.9) is the one declared here.
                Some(unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($( $ty ),*) -> $ret>(p) })
            }
        )*
    };
}

internal! {
    cuDeviceGetCount: Driver fn(*mut c_int) -> CuResult;
    cuCtxPushCurrent_v2: Driver fn(CUcontext) -> CuResult;
    cuCtxPopCurrent_v2: Driver fn(*mut CUcontext) -> CuResult;
    cuCtxGetDevice: Driver fn(*mut CUdevice) -> CuResult;
    cuPointerGetAttribute: Driver fn(*mut c_void, c_int, u64) -> CuResult;
    cuMemGetAllocationPropertiesFromHandle: Driver fn(*mut c_void, u64) -> CuResult;
    cuIpcCloseMemHandle: Driver fn(u64) -> CuResult;
    cuMemRelease: Driver fn(u64) -> CuResult;
    cuMemFreeAsync: Driver fn(u64, *mut c_void) -> CuResult;
    cudaGetDevice: Runtime fn(*mut c_int) -> CudaError;
    cudaIpcCloseMemHandle: Runtime fn(*mut c_void) -> CudaError;
}

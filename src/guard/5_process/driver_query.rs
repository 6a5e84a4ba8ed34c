//! Questions the guard asks the real driver or runtime for itself (device count, UUIDs,
//! a context's device, the current device), never through its own wrappers.
#![allow(unsafe_code)]

use std::ffi::c_void;

use crate::guard::resolve::internal;
use crate::guard::resolve::real;
use crate::guard::sys::ffi::{CUdevice, CUuuid, CuResult, CudaError};
use crate::guard::sys::signal_safe::{self, StackBuf};
use crate::guard::table::Id;
use rankguard_core::uuid::{write_uuid, UuidKind};

pub fn driver_count() -> Option<i32> {
    let f = internal::cuDeviceGetCount()?;
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer.
    (unsafe { f(&mut n) } == CuResult::SUCCESS).then_some(n)
}

/// The UUID of the device with this ordinal, from the real driver.
pub fn device_uuid_bytes(ordinal: i32) -> Option<CUuuid> {
    let get = real::find(Id::cuDeviceGet as usize);
    let uuid = real::find(Id::cuDeviceGetUuid_v2 as usize);
    let uuid = if uuid.is_null() {
        real::find(Id::cuDeviceGetUuid as usize)
    } else {
        uuid
    };
    if get.is_null() || uuid.is_null() {
        return None;
    }
    // SAFETY: these are the driver's cuDeviceGet(CUdevice*, int) and
    // cuDeviceGetUuid(_v2)(CUuuid*, CUdevice).
    let (get, uuid): (
        unsafe extern "C" fn(*mut CUdevice, i32) -> CuResult,
        unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CuResult,
    ) = unsafe {
        (
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut CUdevice, i32) -> CuResult>(
                get,
            ),
            std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CuResult,
            >(uuid),
        )
    };
    let mut dev: CUdevice = 0;
    let mut u = CUuuid { bytes: [0; 16] };
    // SAFETY: valid out-pointers.
    unsafe {
        if get(&mut dev, ordinal) != CuResult::SUCCESS || uuid(&mut u, dev) != CuResult::SUCCESS {
            return None;
        }
    }
    Some(u)
}

/// The UUID text of the device with this ordinal: `MIG-...` when CUDA_VISIBLE_DEVICES names
/// MIG instances (cuDeviceGetUuid_v2 returns the instance's UUID), else `GPU-...`.
pub fn device_uuid(ordinal: i32) -> Option<String> {
    let u = device_uuid_bytes(ordinal)?;
    let mig = signal_safe::getenv(c"CUDA_VISIBLE_DEVICES").is_some_and(|t| t.starts_with("MIG-"));
    let mut b = StackBuf::<64>::new();
    let kind = if mig { UuidKind::Mig } else { UuidKind::Gpu };
    let _ = write_uuid(&mut b, kind, &u.bytes);
    Some(String::from_utf8_lossy(b.as_bytes()).into_owned())
}

/// The device of a context, asked from the real driver without disturbing the caller's
/// current context (push, query, pop).
pub fn context_device(ctx: *mut c_void) -> Option<i32> {
    let (push, pop, getdev) = (
        internal::cuCtxPushCurrent_v2()?,
        internal::cuCtxPopCurrent_v2()?,
        internal::cuCtxGetDevice()?,
    );
    if ctx.is_null() {
        let mut d = 0;
        // SAFETY: valid out-pointer; a NULL context means "the current one".
        return (unsafe { getdev(&mut d) } == CuResult::SUCCESS).then_some(d);
    }
    // SAFETY: push/pop are balanced; the out-pointers are valid.
    unsafe {
        if push(ctx) != CuResult::SUCCESS {
            return None;
        }
        let mut d = 0;
        let ok = getdev(&mut d) == CuResult::SUCCESS;
        let mut popped = std::ptr::null_mut();
        let _ = pop(&mut popped);
        ok.then_some(d)
    }
}

/// The current device of the runtime table entry `id`'s wrapper calls (its major's),
/// asked from that real runtime; 0 if it cannot tell.
pub fn runtime_current_device(id: usize) -> i32 {
    let Some(f) = internal::cudaGetDevice(crate::guard::table::TABLE[id].major) else {
        return 0;
    };
    let mut d = 0;
    // SAFETY: valid out-pointer.
    if unsafe { f(&mut d) } == CudaError::SUCCESS {
        d
    } else {
        0
    }
}

/// How many GPUs this node has, asked from NVML (`libnvidia-ml.so.1`), which ignores
/// `CUDA_VISIBLE_DEVICES`: the driver cannot tell once the process's CVD named none. None
/// when there is no NVML or it fails. Cold: only when R1 found an entry naming no GPU.
pub fn node_gpu_count() -> Option<u32> {
    // SAFETY: the name is NUL-terminated; dlopen has no other precondition.
    let h = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if h.is_null() {
        return None;
    }
    let (init, count, shutdown) = (
        crate::guard::resolve::dl::lookup(h, c"nvmlInit_v2"),
        crate::guard::resolve::dl::lookup(h, c"nvmlDeviceGetCount_v2"),
        crate::guard::resolve::dl::lookup(h, c"nvmlShutdown"),
    );
    let mut n: u32 = 0;
    let ok = if init.is_null() || count.is_null() || shutdown.is_null() {
        false
    } else {
        type Init = unsafe extern "C" fn() -> i32;
        type Count = unsafe extern "C" fn(*mut u32) -> i32;
        // SAFETY: nvml.h: nvmlReturn_t nvmlInit_v2(void), nvmlDeviceGetCount_v2(unsigned
        // int *), nvmlShutdown(void); the pointers are those functions of the handle `h`.
        unsafe {
            let (init, count, shutdown) = (
                std::mem::transmute::<*mut c_void, Init>(init),
                std::mem::transmute::<*mut c_void, Count>(count),
                std::mem::transmute::<*mut c_void, Init>(shutdown),
            );
            if init() == 0 {
                let ok = count(&mut n) == 0;
                shutdown();
                ok
            } else {
                false
            }
        }
    };
    // SAFETY: `h` came from dlopen above; this drops the reference it added.
    unsafe { libc::dlclose(h) };
    ok.then_some(n)
}

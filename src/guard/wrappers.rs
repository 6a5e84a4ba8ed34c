//! Every guarded CUDA function, once: ABI symbol, C signature (from NVIDIA's `cuda.h` /
//! `cuda_runtime_api.h` 12.9), and what the guard does around the real call. The
//! `guarded!` macro derives the exported wrappers and the routing table from this list.
//!
//! Error codes (README contract table): an ordinal other than 0 -> 101 (invalid device,
//! what the driver itself answers under correct visibility); peer access across devices ->
//! 800 (not permitted); a real function that cannot be found -> 500 (not found).
#![allow(unsafe_code, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::guard::ffi::*;
use crate::guard::route::{self, Routed};
use crate::guard::{driver_query, init_check, missing};
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

guarded! {
    // ---- initialisation (R1) -------------------------------------------------------
    Driver "cuInit" fn cuInit(flags: c_uint) -> CuResult |real| {
        let rc = real(flags);
        init_check::after_init(rc);
        rc
    }

    // ---- entry points: hand out wrappers -------------------------------------------
    Driver "cuGetProcAddress" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> CuResult |real| {
        let rc = real(symbol, pfn, cuda_version, flags);
        if rc == CuResult::SUCCESS && !route_out(pfn, symbol, std::ptr::null_mut()) {
            return CuResult::NOT_FOUND;
        }
        rc
    }
    Driver "cuGetProcAddress" fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_int) -> CuResult |real| {
        let rc = real(symbol, pfn, cuda_version, flags, status);
        if rc == CuResult::SUCCESS && !route_out(pfn, symbol, status) {
            return CuResult::NOT_FOUND;
        }
        rc
    }
    Runtime "cudaGetDriverEntryPoint" fn cudaGetDriverEntryPoint | cudaGetDriverEntryPoint_ptsz(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int) -> CudaError |real| {
        let rc = real(symbol, pfn, flags, status);
        if rc == CudaError::SUCCESS && !route_out(pfn, symbol, status) {
            return CudaError::SYMBOL_NOT_FOUND;
        }
        rc
    }
    Runtime "cudaGetDriverEntryPointByVersion" fn cudaGetDriverEntryPointByVersion | cudaGetDriverEntryPointByVersion_ptsz(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_uint, flags: u64, status: *mut c_int) -> CudaError |real| {
        let rc = real(symbol, pfn, cuda_version, flags, status);
        if rc == CudaError::SUCCESS && !route_out(pfn, symbol, status) {
            return CudaError::SYMBOL_NOT_FOUND;
        }
        rc
    }

    // ---- driver: devices by ordinal (R2) -------------------------------------------
    Driver "cuDeviceGet" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CuResult |real| {
        gate!(policy::ordinal(ordinal), "ordinal={ordinal}");
        real(device, ordinal)
    }
    Driver "cuCtxCreate" fn cuCtxCreate | cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CuResult |real| {
        gate!(policy::ordinal(dev), "flags={flags:#x}, dev={dev}");
        real(pctx, flags, dev)
    }
    Driver "cuCtxCreate" fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint, dev: CUdevice) -> CuResult |real| {
        gate!(policy::ordinal(dev), "numParams={num_params}, flags={flags:#x}, dev={dev}");
        real(pctx, params, num_params, flags, dev)
    }
    Driver "cuCtxCreate" fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CuResult |real| {
        gate!(policy::ordinal(dev), "flags={flags:#x}, dev={dev}");
        real(pctx, params, flags, dev)
    }
    Driver "cuDevicePrimaryCtxRetain" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CuResult |real| {
        gate!(policy::ordinal(dev), "dev={dev}");
        real(pctx, dev)
    }
    Driver "cuDevicePrimaryCtxRelease" fn cuDevicePrimaryCtxRelease | cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CuResult |real| {
        gate!(policy::ordinal(dev), "dev={dev}");
        real(dev)
    }
    Driver "cuDevicePrimaryCtxReset" fn cuDevicePrimaryCtxReset | cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CuResult |real| {
        gate!(policy::ordinal(dev), "dev={dev}");
        real(dev)
    }
    Driver "cuDevicePrimaryCtxSetFlags" fn cuDevicePrimaryCtxSetFlags | cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CuResult |real| {
        gate!(policy::ordinal(dev), "dev={dev}, flags={flags:#x}");
        real(dev, flags)
    }
    Driver "cuDevicePrimaryCtxGetState" fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CuResult |real| {
        gate!(policy::ordinal(dev), "dev={dev}");
        real(dev, flags, active)
    }

    // ---- driver: memory locations (R2; host locations are not devices) ------------
    Driver "cuMemCreate" fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationPropHead, flags: u64) -> CuResult |real| {
        let loc = if prop.is_null() { std::ptr::null() } else { &raw const (*prop).location };
        gate!(location_at(loc), "size={size}, prop.location={:?}", loc.as_ref());
        real(handle, size, prop, flags)
    }
    Driver "cuMemSetAccess" fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CuResult |real| {
        if !desc.is_null() {
            for i in 0..count {
                let loc = &raw const (*desc.add(i)).location;
                gate!(location_at(loc), "ptr={ptr:#x}, size={size}, desc[{i}].location={:?}", *loc);
            }
        }
        real(ptr, size, desc, count)
    }
    Driver "cuMemPrefetchAsync" fn cuMemPrefetchAsync | cuMemPrefetchAsync_ptsz(dev_ptr: CUdeviceptr, count: usize, dst_device: CUdevice, stream: CUstream) -> CuResult |real| {
        gate!(policy::ordinal_or_host(dst_device), "devPtr={dev_ptr:#x}, count={count}, dstDevice={dst_device}");
        real(dev_ptr, count, dst_device, stream)
    }
    Driver "cuMemPrefetchAsync" fn cuMemPrefetchAsync_v2 | cuMemPrefetchAsync_v2_ptsz(dev_ptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: c_uint, stream: CUstream) -> CuResult |real| {
        gate!(policy::location(location.type_, location.id), "devPtr={dev_ptr:#x}, count={count}, location={location:?}");
        real(dev_ptr, count, location, flags, stream)
    }
    Driver "cuMemAdvise" fn cuMemAdvise(dev_ptr: CUdeviceptr, count: usize, advice: c_int, device: CUdevice) -> CuResult |real| {
        gate!(policy::ordinal_or_host(device), "devPtr={dev_ptr:#x}, count={count}, advice={advice}, device={device}");
        real(dev_ptr, count, advice, device)
    }
    Driver "cuMemAdvise" fn cuMemAdvise_v2(dev_ptr: CUdeviceptr, count: usize, advice: c_int, location: CUmemLocation) -> CuResult |real| {
        gate!(policy::location(location.type_, location.id), "devPtr={dev_ptr:#x}, count={count}, advice={advice}, location={location:?}");
        real(dev_ptr, count, advice, location)
    }
    Driver "cuMemPoolCreate" fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolPropsHead) -> CuResult |real| {
        let loc = if props.is_null() { std::ptr::null() } else { &raw const (*props).location };
        gate!(location_at(loc), "poolProps.location={:?}", loc.as_ref());
        real(pool, props)
    }

    // ---- driver: pure queries (recorded in warn mode, never denied) ---------------
    Driver "cuDeviceGetAttribute" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CuResult |real| {
        gate!(policy::query(dev), "attrib={attrib}, dev={dev}");
        real(pi, attrib, dev)
    }
    Driver "cuDeviceGetName" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CuResult |real| {
        gate!(policy::query(dev), "len={len}, dev={dev}");
        real(name, len, dev)
    }
    Driver "cuDeviceGetUuid" fn cuDeviceGetUuid | cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CuResult |real| {
        gate!(policy::query(dev), "dev={dev}");
        real(uuid, dev)
    }
    Driver "cuDeviceGetPCIBusId" fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CuResult |real| {
        gate!(policy::query(dev), "len={len}, dev={dev}");
        real(bus_id, len, dev)
    }
    Driver "cuDeviceTotalMem" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CuResult |real| {
        gate!(policy::query(dev), "dev={dev}");
        real(bytes, dev)
    }
    Driver "cuDeviceTotalMem" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CuResult |real| {
        gate!(policy::query(dev), "dev={dev}");
        real(bytes, dev)
    }
    Driver "cuDeviceCanAccessPeer" fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CuResult |real| {
        gate!(policy::query(if dev != 0 { dev } else { peer }), "dev={dev}, peerDev={peer}");
        real(can, dev, peer)
    }

    // ---- driver: peer access (R4) -----------------------------------------------------
    Driver "cuCtxEnablePeerAccess" fn cuCtxEnablePeerAccess(peer_ctx: CUcontext, flags: c_uint) -> CuResult |real| {
        gate!(peer_contexts(std::ptr::null_mut(), peer_ctx), "peerContext={peer_ctx:p}, flags={flags:#x}");
        real(peer_ctx, flags)
    }
    Driver "cuMemcpyPeer" fn cuMemcpyPeer | cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) -> CuResult |real| {
        gate!(peer_contexts(dst_ctx, src_ctx), "dst={dst:#x}, dstContext={dst_ctx:p}, src={src:#x}, srcContext={src_ctx:p}, ByteCount={n}");
        real(dst, dst_ctx, src, src_ctx, n)
    }
    Driver "cuMemcpyPeerAsync" fn cuMemcpyPeerAsync | cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) -> CuResult |real| {
        gate!(peer_contexts(dst_ctx, src_ctx), "dst={dst:#x}, dstContext={dst_ctx:p}, src={src:#x}, srcContext={src_ctx:p}, ByteCount={n}");
        real(dst, dst_ctx, src, src_ctx, n, stream)
    }

    // ---- runtime: devices by ordinal (R2) ------------------------------------------
    Runtime "cudaSetDevice" fn cudaSetDevice(device: c_int) -> CudaError |real| {
        gate!(policy::ordinal(device), "device={device}");
        real(device)
    }
    Runtime "cudaInitDevice" fn cudaInitDevice(device: c_int, device_flags: c_uint, flags: c_uint) -> CudaError |real| {
        gate!(policy::ordinal(device), "device={device}, deviceFlags={device_flags:#x}, flags={flags:#x}");
        real(device, device_flags, flags)
    }
    Runtime "cudaMemPrefetchAsync" fn cudaMemPrefetchAsync | cudaMemPrefetchAsync_ptsz(dev_ptr: *const c_void, count: usize, dst_device: c_int, stream: *mut c_void) -> CudaError |real| {
        gate!(policy::ordinal_or_host(dst_device), "devPtr={dev_ptr:p}, count={count}, dstDevice={dst_device}");
        real(dev_ptr, count, dst_device, stream)
    }

    // ---- runtime: pure queries --------------------------------------------------------
    Runtime "cudaDeviceGetAttribute" fn cudaDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) -> CudaError |real| {
        gate!(policy::query(device), "attr={attr}, device={device}");
        real(value, attr, device)
    }
    Runtime "cudaDeviceGetPCIBusId" fn cudaDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: c_int) -> CudaError |real| {
        gate!(policy::query(device), "len={len}, device={device}");
        real(bus_id, len, device)
    }
    Runtime "cudaGetDeviceProperties" fn cudaGetDeviceProperties_v2(prop: *mut c_void, device: c_int) -> CudaError |real| {
        gate!(policy::query(device), "device={device}");
        real(prop, device)
    }
    Runtime "cudaDeviceCanAccessPeer" fn cudaDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) -> CudaError |real| {
        gate!(policy::query(if device != 0 { device } else { peer }), "device={device}, peerDevice={peer}");
        real(can, device, peer)
    }

    // ---- runtime: peer access (R4) ----------------------------------------------------
    Runtime "cudaDeviceEnablePeerAccess" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> CudaError |real| {
        gate!(policy::peer(driver_query::runtime_current_device(), peer), "peerDevice={peer}, flags={flags:#x}");
        real(peer, flags)
    }
    Runtime "cudaMemcpyPeer" fn cudaMemcpyPeer(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, count: usize) -> CudaError |real| {
        gate!(policy::peer(dst_device, src_device), "dst={dst:p}, dstDevice={dst_device}, src={src:p}, srcDevice={src_device}, count={count}");
        real(dst, dst_device, src, src_device, count)
    }
    Runtime "cudaMemcpyPeerAsync" fn cudaMemcpyPeerAsync(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, count: usize, stream: *mut c_void) -> CudaError |real| {
        gate!(policy::peer(dst_device, src_device), "dst={dst:p}, dstDevice={dst_device}, src={src:p}, srcDevice={src_device}, count={count}");
        real(dst, dst_device, src, src_device, count, stream)
    }

    // ---- IPC (R3) -----------------------------------------------------------------------
    // Exports record provenance after the real call succeeded; imports are decided before
    // the real call (legacy handles, events, pools) or right after it (VMM: the
    // allocation's location type decides host memory), and verified after the fact where
    // the driver can tell. Denials return 800. Logic: guard/ipc.rs and registry.rs.
    Driver "cuIpcGetMemHandle" fn cuIpcGetMemHandle(handle: *mut crate::guard::ipc::IpcHandle, dptr: CUdeviceptr) -> CuResult |real| {
        let rc = real(handle, dptr);
        if rc == CuResult::SUCCESS {
            crate::guard::ipc::exported_mem(handle, dptr);
        }
        rc
    }
    Driver "cuIpcOpenMemHandle" fn cuIpcOpenMemHandle | cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: crate::guard::ipc::IpcHandle, flags: c_uint) -> CuResult |real| {
        use crate::guard::ipc;
        let checked = match ipc::check_import::<CuResult>(ID, Some(ipc::key_of(crate::registry::Kind::Mem, &handle)), None, format_args!("handle={}, Flags={flags:#x}", ipc::Short(&handle))) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let rc = real(pdptr, handle, flags);
        if rc == CuResult::SUCCESS && !pdptr.is_null() {
            let p = *pdptr;
            if let Err(code) = ipc::verify_pointer::<CuResult>(ID, checked, p, format_args!("handle={}, Flags={flags:#x} -> {p:#x}", ipc::Short(&handle))) {
                ipc::close_mem(p);
                *pdptr = 0;
                return code;
            }
        }
        rc
    }
    Driver "cuIpcGetEventHandle" fn cuIpcGetEventHandle(handle: *mut crate::guard::ipc::IpcHandle, event: CUevent) -> CuResult |real| {
        let rc = real(handle, event);
        if rc == CuResult::SUCCESS {
            crate::guard::ipc::exported_event(handle);
        }
        rc
    }
    Driver "cuIpcOpenEventHandle" fn cuIpcOpenEventHandle(event: *mut CUevent, handle: crate::guard::ipc::IpcHandle) -> CuResult |real| {
        use crate::guard::ipc;
        if let Err(code) = ipc::check_import::<CuResult>(ID, Some(ipc::key_of(crate::registry::Kind::Event, &handle)), None, format_args!("handle={}", ipc::Short(&handle))) {
            return code;
        }
        real(event, handle)
    }
    Driver "cuMemExportToShareableHandle" fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: c_uint, flags: u64) -> CuResult |real| {
        let rc = real(shareable, handle, handle_type, flags);
        if rc == CuResult::SUCCESS {
            crate::guard::ipc::exported_allocation(shareable, handle, handle_type);
        }
        rc
    }
    Driver "cuMemImportFromShareableHandle" fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: c_uint) -> CuResult |real| {
        use crate::guard::ipc;
        use crate::registry::Kind;
        // The key first: the fd is the caller's until the call returns.
        let key = ipc::key_of_shareable(Kind::VmmFd, Kind::Fabric, os_handle, handle_type);
        let rc = real(handle, os_handle, handle_type);
        if rc == CuResult::SUCCESS && !handle.is_null() {
            let h = *handle;
            if let Err(code) = ipc::check_vmm_import::<CuResult>(ID, key, h, format_args!("osHandle={os_handle:p}, shHandleType={handle_type:#x}")) {
                ipc::release_allocation(h);
                *handle = 0;
                return code;
            }
        }
        rc
    }
    Driver "cuMemPoolExportToShareableHandle" fn cuMemPoolExportToShareableHandle(shareable: *mut c_void, pool: CUmemoryPool, handle_type: c_uint, flags: u64) -> CuResult |real| {
        let rc = real(shareable, pool, handle_type, flags);
        if rc == CuResult::SUCCESS {
            crate::guard::ipc::exported_pool(shareable, handle_type);
        }
        rc
    }
    Driver "cuMemPoolImportFromShareableHandle" fn cuMemPoolImportFromShareableHandle(pool: *mut CUmemoryPool, os_handle: *mut c_void, handle_type: c_uint, flags: u64) -> CuResult |real| {
        use crate::guard::ipc;
        use crate::registry::Kind;
        let key = ipc::key_of_shareable(Kind::PoolFd, Kind::PoolFabric, os_handle, handle_type);
        if let Err(code) = ipc::check_import::<CuResult>(ID, key, None, format_args!("handle={os_handle:p}, handleType={handle_type:#x}, flags={flags:#x}")) {
            return code;
        }
        real(pool, os_handle, handle_type, flags)
    }
    Driver "cuMemPoolExportPointer" fn cuMemPoolExportPointer(data: *mut crate::guard::ipc::IpcHandle, ptr: CUdeviceptr) -> CuResult |real| {
        let rc = real(data, ptr);
        if rc == CuResult::SUCCESS {
            crate::guard::ipc::exported_pool_pointer(data, ptr);
        }
        rc
    }
    Driver "cuMemPoolImportPointer" fn cuMemPoolImportPointer(ptr_out: *mut CUdeviceptr, pool: CUmemoryPool, data: *mut crate::guard::ipc::IpcHandle) -> CuResult |real| {
        use crate::guard::ipc;
        let key = data.as_ref().map(|d| ipc::key_of(crate::registry::Kind::PoolPtr, d));
        let checked = match ipc::check_import::<CuResult>(ID, key, None, format_args!("pool={pool:p}, shareData={data:p}")) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let rc = real(ptr_out, pool, data);
        if rc == CuResult::SUCCESS && !ptr_out.is_null() {
            let p = *ptr_out;
            if let Err(code) = ipc::verify_pointer::<CuResult>(ID, checked, p, format_args!("pool={pool:p}, shareData={data:p} -> {p:#x}")) {
                ipc::free_pointer(p);
                *ptr_out = 0;
                return code;
            }
        }
        rc
    }
    Runtime "cudaIpcGetMemHandle" fn cudaIpcGetMemHandle(handle: *mut crate::guard::ipc::IpcHandle, dev_ptr: *mut c_void) -> CudaError |real| {
        let rc = {
            let _nested = crate::guard::ipc::RuntimeScope::enter();
            real(handle, dev_ptr)
        };
        if rc == CudaError::SUCCESS {
            crate::guard::ipc::exported_mem(handle, dev_ptr as CUdeviceptr);
        }
        rc
    }
    Runtime "cudaIpcOpenMemHandle" fn cudaIpcOpenMemHandle(dev_ptr: *mut *mut c_void, handle: crate::guard::ipc::IpcHandle, flags: c_uint) -> CudaError |real| {
        use crate::guard::ipc;
        // cudaIpcMemLazyEnablePeerAccess (the only valid flag) is not a violation by itself.
        let checked = match ipc::check_import::<CudaError>(ID, Some(ipc::key_of(crate::registry::Kind::Mem, &handle)), None, format_args!("handle={}, flags={flags:#x}", ipc::Short(&handle))) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let rc = {
            let _nested = ipc::RuntimeScope::enter();
            real(dev_ptr, handle, flags)
        };
        if rc == CudaError::SUCCESS && !dev_ptr.is_null() {
            let p = *dev_ptr;
            if let Err(code) = ipc::verify_pointer::<CudaError>(ID, checked, p as CUdeviceptr, format_args!("handle={}, flags={flags:#x} -> {p:p}", ipc::Short(&handle))) {
                ipc::close_mem_runtime(p);
                *dev_ptr = std::ptr::null_mut();
                return code;
            }
        }
        rc
    }
    Runtime "cudaIpcGetEventHandle" fn cudaIpcGetEventHandle(handle: *mut crate::guard::ipc::IpcHandle, event: *mut c_void) -> CudaError |real| {
        let rc = {
            let _nested = crate::guard::ipc::RuntimeScope::enter();
            real(handle, event)
        };
        if rc == CudaError::SUCCESS {
            crate::guard::ipc::exported_event(handle);
        }
        rc
    }
    Runtime "cudaIpcOpenEventHandle" fn cudaIpcOpenEventHandle(event: *mut *mut c_void, handle: crate::guard::ipc::IpcHandle) -> CudaError |real| {
        use crate::guard::ipc;
        if let Err(code) = ipc::check_import::<CudaError>(ID, Some(ipc::key_of(crate::registry::Kind::Event, &handle)), None, format_args!("handle={}", ipc::Short(&handle))) {
            return code;
        }
        let _nested = ipc::RuntimeScope::enter();
        real(event, handle)
    }
}

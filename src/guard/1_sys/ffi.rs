//! C types and constants of the CUDA driver and runtime APIs that the guard reads or returns.
//!
//! Result codes are `#[repr(transparent)]` newtypes with associated constants, not Rust
//! enums: a newer driver returns codes we have never heard of, and an unknown value in a
//! Rust enum is undefined behaviour (rustix `src/io/errno.rs` does the same for errno).
//! Enum-typed fields of C structs we read (`CUmemLocationType`, ...) are `u32` for the same
//! reason. Layouts follow NVIDIA's `cuda.h` 12.9; `c-tests/tests/layout_check.c` checks the
//! sizes and offsets we rely on against the real header (`c-tests/tests13/layout_check13.c`
//! those of the 13-only structs against 13.x's).
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_int, c_uint, c_void};

pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type CUmemoryPool = *mut c_void;

/// `CUresult`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CuResult(pub c_uint);

impl CuResult {
    pub const SUCCESS: CuResult = CuResult(0);
    pub const INVALID_VALUE: CuResult = CuResult(1);
    pub const NOT_INITIALIZED: CuResult = CuResult(3);
    pub const INVALID_DEVICE: CuResult = CuResult(101);
    pub const INVALID_CONTEXT: CuResult = CuResult(201);
    pub const NOT_FOUND: CuResult = CuResult(500);
    pub const NOT_PERMITTED: CuResult = CuResult(800);
}

/// `cudaError_t`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CudaError(pub c_uint);

impl CudaError {
    pub const SUCCESS: CudaError = CudaError(0);
    pub const INVALID_DEVICE: CudaError = CudaError(101);
    pub const SYMBOL_NOT_FOUND: CudaError = CudaError(500);
    pub const NOT_PERMITTED: CudaError = CudaError(800);
}

/// `CUmemLocation`: `{ CUmemLocationType type; int id; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_uint = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_uint = 3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_uint = 4;

/// The leading fields of `CUmemAllocationProp` (type, requestedHandleTypes, location):
/// the guard reads only `location`, and only through a pointer the caller gave.
#[repr(C)]
pub struct CUmemAllocationPropHead {
    pub type_: c_uint,
    pub requestedHandleTypes: c_uint,
    pub location: CUmemLocation,
}

/// The leading fields of `CUmemPoolProps` (allocType, handleTypes, location).
#[repr(C)]
pub struct CUmemPoolPropsHead {
    pub allocType: c_uint,
    pub handleTypes: c_uint,
    pub location: CUmemLocation,
}

/// `CUmemAccessDesc`: `{ CUmemLocation location; CUmemAccess_flags flags; }`.
#[repr(C)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

/// `CU_DEVICE_CPU`: the host, where a device argument may name it.
pub const CU_DEVICE_CPU: CUdevice = -1;

/// `CUDA_MEMCPY3D_PEER` (cuda.h): the guard reads the two contexts (and memory types:
/// contexts of arrays are ignored by the driver).
#[repr(C)]
pub struct CUDA_MEMCPY3D_PEER {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcZ: usize,
    pub srcLOD: usize,
    pub srcMemoryType: c_uint,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: *mut c_void,
    pub srcContext: CUcontext,
    pub srcPitch: usize,
    pub srcHeight: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstZ: usize,
    pub dstLOD: usize,
    pub dstMemoryType: c_uint,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: *mut c_void,
    pub dstContext: CUcontext,
    pub dstPitch: usize,
    pub dstHeight: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
    pub Depth: usize,
}

/// The head of `CUDA_MEM_ALLOC_NODE_PARAMS` / `cudaMemAllocNodeParams` (same layout in 12.9
/// and 13.x): the pool properties (88 bytes, location at 8) and the access descriptors.
#[repr(C)]
pub struct MemAllocNodeParamsHead {
    pub poolProps: CUmemPoolPropsHead,
    pub _rest_of_pool_props: [u8; 72],
    pub accessDescs: *const CUmemAccessDesc,
    pub accessDescCount: usize,
}

/// The head of `CUgraphNodeParams` / `cudaGraphNodeParams` (same layout in 12.9 and 13.x):
/// the node type, then the union, whose memory-allocation member has
/// `CUDA_MEM_ALLOC_NODE_PARAMS`'s head.
#[repr(C)]
pub struct GraphNodeParamsHead {
    pub type_: c_int,
    pub reserved0: [c_int; 3],
    pub alloc: MemAllocNodeParamsHead,
}

/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC` = `cudaGraphNodeTypeMemAlloc`.
pub const GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;

/// `CUmemcpyAttributes` (12.8 and 13.x): the location hints of a batch or attribute copy.
#[repr(C)]
pub struct CUmemcpyAttributes {
    pub srcAccessOrder: c_uint,
    pub srcLocHint: CUmemLocation,
    pub dstLocHint: CUmemLocation,
    pub flags: c_uint,
}

/// `CUmemcpy3DOperand` / `cudaMemcpy3DOperand` (12.8 and 13.x, same layout) as its
/// pointer member: the type, then the union, whose pointer member ends with the location
/// hint (the array member is as large and names no location).
#[repr(C)]
pub struct Memcpy3DOperand {
    pub type_: c_uint,
    pub ptr: CUdeviceptr,
    pub rowLength: usize,
    pub layerHeight: usize,
    pub locHint: CUmemLocation,
}

/// `CUDA_MEMCPY3D_BATCH_OP` / `cudaMemcpy3DBatchOp` (12.8 and 13.x, same layout): one copy
/// of a 3D batch (`cuMemcpy3DBatchAsync`) or an attribute copy (`cuMemcpy3DWithAttributesAsync`).
#[repr(C)]
pub struct Memcpy3DBatchOp {
    pub src: Memcpy3DOperand,
    pub dst: Memcpy3DOperand,
    pub extent: [usize; 3],
    pub srcAccessOrder: c_uint,
    pub flags: c_uint,
}

/// `CU_MEMCPY_OPERAND_TYPE_POINTER` = `cudaMemcpyOperandTypePointer` =
/// `CU_FABRIC_COPY_OPERAND_TYPE_POINTER`: an operand whose location hint is read.
pub const OPERAND_TYPE_POINTER: c_uint = 1;

/// `CUfabricCpyOperand` (13.5) as its pointer member (the logical-endpoint member is as
/// large; an endpoint's devices were judged when they were added or bound).
#[repr(C)]
pub struct FabricCpyOperand {
    pub type_: c_uint,
    pub ptr: CUdeviceptr,
    pub locHint: CUmemLocation,
}

/// `CUDA_FABRIC_COPY_BATCH_OP` (13.5): one copy of `cuFabricCpyBatchAsync`.
#[repr(C)]
pub struct FabricCopyBatchOp {
    pub src: FabricCpyOperand,
    pub dst: FabricCpyOperand,
    pub size: usize,
    pub flags: c_uint,
}

/// The head of `CUcheckpointRestoreArgs`: 13.5 puts the GPU remapping first (12.8 to 13.4
/// have `reserved[8]`, which must be zero: a NULL array, no pairs).
#[repr(C)]
pub struct CUcheckpointRestoreArgsHead {
    pub gpuPairs: *const CUcheckpointGpuPair,
    pub gpuPairsCount: c_uint,
}

/// `CUcheckpointGpuPair` (13.5): the GPU checkpointed and the GPU to restore onto.
#[repr(C)]
pub struct CUcheckpointGpuPair {
    pub oldUuid: CUuuid,
    pub newUuid: CUuuid,
}

/// `CU_MEMORYTYPE_ARRAY`: a copy side whose context the driver ignores.
pub const CU_MEMORYTYPE_ARRAY: c_uint = 3;

/// `cudaMemcpy3DPeerParms` (driver_types.h) up to `dstDevice`: the guard reads the two
/// device ordinals.
#[repr(C)]
pub struct cudaMemcpy3DPeerParmsHead {
    pub srcArray: *mut c_void,
    pub srcPos: [usize; 3],
    pub srcPtr: [usize; 4],
    pub srcDevice: c_int,
    pub dstArray: *mut c_void,
    pub dstPos: [usize; 3],
    pub dstPtr: [usize; 4],
    pub dstDevice: c_int,
}

/// The head of `CUDA_EXTERNAL_MEMORY_HANDLE_DESC` / `cudaExternalMemoryHandleDesc` (same
/// layout): the handle type and, for an opaque fd, the fd (first member of the union).
#[repr(C)]
pub struct ExternalMemoryHandleDescHead {
    pub type_: c_uint,
    /// The union starts 8-aligned (its win32 member holds pointers).
    pub _pad: c_uint,
    pub fd: c_int,
}

/// `CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD` = `cudaExternalMemoryHandleTypeOpaqueFd`.
pub const EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD: c_uint = 1;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_uint = 1;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUdriverProcAddressQueryResult` values.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;

#[cfg(test)]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The same numbers c-tests/tests/layout_check.c (and layout_check13.c, 13-only structs)
    /// asserts against NVIDIA's cuda.h.
    #[test]
    fn layouts_match_cuda_h() {
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(offset_of!(CUmemLocation, id), 4);
        assert_eq!(offset_of!(CUmemAllocationPropHead, location), 8);
        assert_eq!(offset_of!(CUmemPoolPropsHead, location), 8);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(offset_of!(CUmemAccessDesc, flags), 8);
        assert_eq!(size_of::<CUuuid>(), 16);
        assert_eq!(size_of::<CUDA_MEMCPY3D_PEER>(), 200);
        assert_eq!(offset_of!(CUDA_MEMCPY3D_PEER, srcMemoryType), 32);
        assert_eq!(offset_of!(CUDA_MEMCPY3D_PEER, srcContext), 64);
        assert_eq!(offset_of!(CUDA_MEMCPY3D_PEER, dstMemoryType), 120);
        assert_eq!(offset_of!(CUDA_MEMCPY3D_PEER, dstContext), 152);
        assert_eq!(offset_of!(cudaMemcpy3DPeerParmsHead, srcDevice), 64);
        assert_eq!(offset_of!(cudaMemcpy3DPeerParmsHead, dstDevice), 136);
        assert_eq!(offset_of!(ExternalMemoryHandleDescHead, fd), 8);
        assert_eq!(offset_of!(MemAllocNodeParamsHead, accessDescs), 88);
        assert_eq!(offset_of!(CUcheckpointRestoreArgsHead, gpuPairsCount), 8);
        assert_eq!(offset_of!(GraphNodeParamsHead, alloc), 16);
        assert_eq!(size_of::<CUmemcpyAttributes>(), 24);
        assert_eq!(offset_of!(CUmemcpyAttributes, dstLocHint), 12);
        assert_eq!(
            offset_of!(GraphNodeParamsHead, alloc)
                + offset_of!(MemAllocNodeParamsHead, accessDescs),
            104
        );
        assert_eq!(size_of::<CUcheckpointGpuPair>(), 32);
        assert_eq!(size_of::<Memcpy3DOperand>(), 40);
        assert_eq!(offset_of!(Memcpy3DOperand, locHint), 32);
        assert_eq!(size_of::<Memcpy3DBatchOp>(), 112);
        assert_eq!(offset_of!(Memcpy3DBatchOp, dst), 40);
        assert_eq!(size_of::<FabricCpyOperand>(), 24);
        assert_eq!(offset_of!(FabricCpyOperand, locHint), 16);
        assert_eq!(size_of::<FabricCopyBatchOp>(), 64);
        assert_eq!(offset_of!(FabricCopyBatchOp, dst), 24);
        assert_eq!(offset_of!(MemAllocNodeParamsHead, accessDescCount), 96);
        assert_eq!(size_of::<CUdevice>(), 4);
        assert_eq!(size_of::<CuResult>(), 4);
        assert_eq!(CU_MEM_LOCATION_TYPE_DEVICE, crate::policy::location::DEVICE);
        assert_eq!(
            CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
            crate::policy::location::HOST_NUMA_CURRENT
        );
    }
}

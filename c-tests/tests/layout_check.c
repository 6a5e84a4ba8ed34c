/* layout_check: the sizes and offsets of the CUDA structs that librankguard.so declares by
 * hand (src/guard/1_sys/ffi.rs), checked against NVIDIA's real cuda.h at compile time. The same
 * numbers are asserted on the Rust side (ffi.rs `layout` test), so a wrong declaration on
 * either side fails the build or the tests. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdio.h>

_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation size");
_Static_assert(offsetof(CUmemLocation, type) == 0, "CUmemLocation.type");
_Static_assert(offsetof(CUmemLocation, id) == 4, "CUmemLocation.id");
_Static_assert(offsetof(CUmemAllocationProp, type) == 0, "CUmemAllocationProp.type");
_Static_assert(offsetof(CUmemAllocationProp, requestedHandleTypes) == 4, "requestedHandleTypes");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location");
_Static_assert(offsetof(CUmemPoolProps, allocType) == 0, "CUmemPoolProps.allocType");
_Static_assert(offsetof(CUmemPoolProps, handleTypes) == 4, "CUmemPoolProps.handleTypes");
_Static_assert(offsetof(CUmemPoolProps, location) == 8, "CUmemPoolProps.location");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc size");
_Static_assert(offsetof(CUmemAccessDesc, location) == 0, "CUmemAccessDesc.location");
_Static_assert(offsetof(CUmemAccessDesc, flags) == 8, "CUmemAccessDesc.flags");
_Static_assert(sizeof(CUuuid) == 16, "CUuuid size");
_Static_assert(sizeof(CUdevice) == 4, "CUdevice is an int");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr is 64-bit");
_Static_assert(sizeof(CUresult) == 4, "CUresult is a 32-bit enum");
_Static_assert(CU_MEM_LOCATION_TYPE_DEVICE == 1 && CU_MEM_LOCATION_TYPE_HOST == 2 &&
               CU_MEM_LOCATION_TYPE_HOST_NUMA == 3 && CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT == 4,
               "CUmemLocationType values");
_Static_assert(CU_DEVICE_CPU == -1, "CU_DEVICE_CPU");
_Static_assert(sizeof(CUDA_MEMCPY3D_PEER) == 200, "CUDA_MEMCPY3D_PEER size");
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, srcMemoryType) == 32, "CUDA_MEMCPY3D_PEER.srcMemoryType");
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, srcContext) == 64, "CUDA_MEMCPY3D_PEER.srcContext");
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, dstMemoryType) == 120, "CUDA_MEMCPY3D_PEER.dstMemoryType");
_Static_assert(offsetof(CUDA_MEMCPY3D_PEER, dstContext) == 152, "CUDA_MEMCPY3D_PEER.dstContext");
_Static_assert(CU_MEMORYTYPE_ARRAY == 3, "CU_MEMORYTYPE_ARRAY");
_Static_assert(offsetof(struct cudaMemcpy3DPeerParms, srcDevice) == 64, "cudaMemcpy3DPeerParms.srcDevice");
_Static_assert(offsetof(struct cudaMemcpy3DPeerParms, dstDevice) == 136, "cudaMemcpy3DPeerParms.dstDevice");
_Static_assert(offsetof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, type) == 0, "external memory desc type");
_Static_assert(offsetof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, handle.fd) == 8, "external memory desc fd");
_Static_assert(offsetof(struct cudaExternalMemoryHandleDesc, handle.fd) == 8, "runtime external memory desc fd");
_Static_assert(CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD == 1 && cudaExternalMemoryHandleTypeOpaqueFd == 1, "opaque fd");
_Static_assert(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD == 1, "dma-buf range handle");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs size (12.9: reserved[8])");
_Static_assert(offsetof(CUgraphNodeParams, alloc) == 16 && offsetof(CUgraphNodeParams, alloc.accessDescs) == 104,
               "CUgraphNodeParams.alloc");
_Static_assert(offsetof(struct cudaGraphNodeParams, alloc) == 16 && offsetof(struct cudaGraphNodeParams, alloc.accessDescs) == 104,
               "cudaGraphNodeParams.alloc");
_Static_assert(CU_GRAPH_NODE_TYPE_MEM_ALLOC == 10 && cudaGraphNodeTypeMemAlloc == 10, "memory-allocation node type");
_Static_assert(sizeof(CUmemcpyAttributes) == 24 && offsetof(CUmemcpyAttributes, srcLocHint) == 4 &&
               offsetof(CUmemcpyAttributes, dstLocHint) == 12, "CUmemcpyAttributes");
_Static_assert(sizeof(CUmemcpy3DOperand) == 40 && offsetof(CUmemcpy3DOperand, op.ptr.ptr) == 8 &&
               offsetof(CUmemcpy3DOperand, op.ptr.locHint) == 32, "CUmemcpy3DOperand");
_Static_assert(sizeof(CUDA_MEMCPY3D_BATCH_OP) == 112 && offsetof(CUDA_MEMCPY3D_BATCH_OP, dst) == 40,
               "CUDA_MEMCPY3D_BATCH_OP");
_Static_assert(sizeof(struct cudaMemcpy3DBatchOp) == 112 && offsetof(struct cudaMemcpy3DBatchOp, dst) == 40 &&
               offsetof(struct cudaMemcpy3DBatchOp, dst.op.ptr.locHint) == 72, "cudaMemcpy3DBatchOp");
_Static_assert(sizeof(struct cudaMemcpyAttributes) == 24 && offsetof(struct cudaMemcpyAttributes, dstLocHint) == 12,
               "cudaMemcpyAttributes");
_Static_assert(CU_MEMCPY_OPERAND_TYPE_POINTER == 1 && cudaMemcpyOperandTypePointer == 1, "pointer operand type");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps size");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs) == 88, "alloc node accessDescs");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescCount) == 96, "alloc node accessDescCount");
_Static_assert(offsetof(struct cudaMemAllocNodeParams, accessDescs) == 88, "runtime alloc node accessDescs");
_Static_assert(sizeof(struct cudaMemAccessDesc) == sizeof(CUmemAccessDesc), "cudaMemAccessDesc = CUmemAccessDesc");
_Static_assert(CUDA_ERROR_INVALID_DEVICE == 101 && CUDA_ERROR_NOT_PERMITTED == 800 &&
               CUDA_ERROR_NOT_FOUND == 500, "CUresult codes the guard returns");
_Static_assert(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND == 1, "CUdriverProcAddressQueryResult");

int main(void) {
    puts("layouts ok");
    return 0;
}

/* layout_check13: the CUDA 13-only structs librankguard.so declares by hand
 * (src/guard/1_sys/ffi.rs: the operations of 13.5's cuFabricCpyBatchAsync), checked at compile time
 * against NVIDIA's 13.x cuda.h; the Rust side asserts the same numbers (ffi.rs `layout`
 * test). layout_check.c does the same for the structs of both majors against 12.9's. */
#include <cuda.h>
#include <stddef.h>
#include <stdio.h>

_Static_assert(sizeof(CUfabricCpyOperand) == 24 && offsetof(CUfabricCpyOperand, op.ptr.ptr) == 8 &&
               offsetof(CUfabricCpyOperand, op.ptr.locHint) == 16, "CUfabricCpyOperand");
_Static_assert(sizeof(CUDA_FABRIC_COPY_BATCH_OP) == 64 && offsetof(CUDA_FABRIC_COPY_BATCH_OP, dst) == 24,
               "CUDA_FABRIC_COPY_BATCH_OP");
_Static_assert(CU_FABRIC_COPY_OPERAND_TYPE_POINTER == 1, "fabric pointer operand type");
_Static_assert(sizeof(CUDA_MEMCPY3D_BATCH_OP) == 112 && sizeof(CUmemcpyAttributes) == 24,
               "13.x keeps 12.8's copy structs");

int main(void)
{
    puts("layouts ok");
    return 0;
}

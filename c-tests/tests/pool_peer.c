/* pool_peer: PyTorch's cudaMallocAsync allocator pattern, which enables peer access through
 * a memory pool instead of cudaDeviceEnablePeerAccess: device 1's default pool, then made
 * accessible from device 0. Driven by python-tests/test_guard_coverage.py.
 *
 *   pool_peer rt|drv
 *
 * Prints "getpool-rc=N", "pool=<0|1>" (whether a pool came back) and, when one did,
 * "setaccess-rc=N" and "access=N" (the access device 0 then has to the pool). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "rt") && strcmp(argv[1], "drv"))) {
        fprintf(stderr, "usage: pool_peer rt|drv\n");
        return 3;
    }
    int rt = !strcmp(argv[1], "rt");
    if (rt) {
        cudaMemPool_t pool = NULL;
        cudaError_t r = cudaDeviceGetDefaultMemPool(&pool, 1);
        printf("getpool-rc=%d\npool=%d\n", (int)r, pool != NULL);
        if (r != cudaSuccess)
            return 0;
        struct cudaMemAccessDesc d = {{cudaMemLocationTypeDevice, 0}, cudaMemAccessFlagsProtReadWrite};
        printf("setaccess-rc=%d\n", (int)cudaMemPoolSetAccess(pool, &d, 1));
        enum cudaMemAccessFlags f = cudaMemAccessFlagsProtNone;
        struct cudaMemLocation l0 = {cudaMemLocationTypeDevice, 0};
        cudaMemPoolGetAccess(&f, pool, &l0);
        printf("access=%d\n", (int)f);
        return 0;
    }
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) {
        printf("setup failed\n");
        return 2;
    }
    CUmemoryPool pool = NULL;
    CUresult r = cuDeviceGetDefaultMemPool(&pool, 1);
    printf("getpool-rc=%d\npool=%d\n", (int)r, pool != NULL);
    if (r != CUDA_SUCCESS)
        return 0;
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    printf("setaccess-rc=%d\n", (int)cuMemPoolSetAccess(pool, &d, 1));
    CUmemAccess_flags f = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    cuMemPoolGetAccess(&f, pool, &l0);
    printf("access=%d\n", (int)f);
    return 0;
}

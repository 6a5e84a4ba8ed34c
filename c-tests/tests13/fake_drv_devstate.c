/* The fake driver's graph-memory state, 1D texture width, atomic capabilities
 * (fake/driver/devstate.c) and the other CUDA 13 entry points issue 18's path tests reach
 * (cuMulticastBindAddr_v2, cuMemDiscardAndPrefetchBatchAsync): their argument checks and
 * answers (D-graphmem, D-tex1d, D-atomic, D-multicast). Built against the 13.x headers,
 * which declare them all. Self-checking; needs at least two visible GPUs. Driven by
 * python-tests/test_fake_driver.py. */
#include <cuda.h>
#include <string.h>

#include "fakecuda_drvtest.h"

#define MIB (1ul << 20)

static void graph_memory(void)
{
    cuuint64_t v = 7;
    EXPECT_RC(cuDeviceGraphMemTrim(1), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceGraphMemTrim(64), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &v), CUDA_SUCCESS);
    EXPECT(v == 0, "no graph memory: every attribute reads 0");
    EXPECT_RC(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetGraphMemAttribute(0, (CUgraphMem_attribute)99, &v), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetGraphMemAttribute(64, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v), CUDA_ERROR_INVALID_DEVICE);
    v = 0;
    EXPECT_RC(cuDeviceSetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &v), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceSetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &v), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceSetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v), CUDA_ERROR_INVALID_VALUE);
    v = 1;
    EXPECT_RC(cuDeviceSetGraphMemAttribute(1, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &v), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceSetGraphMemAttribute(64, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &v), CUDA_ERROR_INVALID_DEVICE);
}

static void texture_width(void)
{
    size_t w = 0;
    EXPECT_RC(cuDeviceGetTexture1DLinearMaxWidth(&w, CU_AD_FORMAT_FLOAT, 4, 1), CUDA_SUCCESS);
    EXPECT(w == (size_t)1 << 28, "2^28 elements");
    EXPECT_RC(cuDeviceGetTexture1DLinearMaxWidth(&w, CU_AD_FORMAT_FLOAT, 3, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetTexture1DLinearMaxWidth(&w, (CUarray_format)0x7777, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetTexture1DLinearMaxWidth(NULL, CU_AD_FORMAT_FLOAT, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetTexture1DLinearMaxWidth(&w, CU_AD_FORMAT_FLOAT, 1, 64), CUDA_ERROR_INVALID_DEVICE);
}

static void cuda13(void)
{
    /* a one-device team of device 0; 2 MiB of device 0's memory mapped at va */
    CUmulticastObjectProp prop = {1, 2 * MIB, 0, 0};
    CUmemGenericAllocationHandle mc, h;
    MUST(cuMulticastCreate(&mc, &prop));
    MUST(cuMulticastAddDevice(mc, 0));
    CUmemAllocationProp ap;
    memset(&ap, 0, sizeof ap);
    ap.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.location.id = 0;
    MUST(cuMemCreate(&h, 2 * MIB, &ap, 0));
    CUdeviceptr va;
    MUST(cuMemAddressReserve(&va, 2 * MIB, 2 * MIB, 0, 0));
    MUST(cuMemMap(va, 2 * MIB, 0, h, 0));
    EXPECT_RC(cuMulticastBindAddr_v2(mc, 1, 0, va, 2 * MIB, 0), CUDA_ERROR_INVALID_DEVICE); /* not in the team */
    EXPECT_RC(cuMulticastBindAddr_v2(mc, 64, 0, va, 2 * MIB, 0), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuMulticastBindAddr_v2(0, 0, 0, va, 2 * MIB, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMulticastBindAddr_v2(mc, 0, 0, va, 2 * MIB, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMulticastBindAddr_v2(mc, 0, 0, va, 2 * MIB, 0), CUDA_SUCCESS);

    /* two managed ranges: the first to device 0, the second to device 1 */
    CUdeviceptr p[2];
    MUST(cuMemAllocManaged(&p[0], 4096, CU_MEM_ATTACH_GLOBAL));
    MUST(cuMemAllocManaged(&p[1], 4096, CU_MEM_ATTACH_GLOBAL));
    size_t sizes[2] = {4096, 4096}, idx[2] = {0, 1};
    CUmemLocation locs[2] = {{.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                             {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1}};
    EXPECT_RC(cuMemDiscardAndPrefetchBatchAsync(p, sizes, 2, locs, idx, 2, 0, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemDiscardAndPrefetchBatchAsync(p, sizes, 2, locs, idx, 2, 1, NULL), CUDA_ERROR_INVALID_VALUE);
    locs[1].id = 64;
    EXPECT_RC(cuMemDiscardAndPrefetchBatchAsync(p, sizes, 2, locs, idx, 2, 0, NULL), CUDA_ERROR_INVALID_DEVICE);
}

static void atomics(void)
{
    CUatomicOperation ops[3] = {CU_ATOMIC_OPERATION_INTEGER_ADD, CU_ATOMIC_OPERATION_AND,
                                CU_ATOMIC_OPERATION_FLOAT_ADD};
    unsigned caps[3] = {0, 0, 0};
    const unsigned scalar = CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
    EXPECT_RC(cuDeviceGetHostAtomicCapabilities(caps, ops, 3, 1), CUDA_SUCCESS);
    EXPECT(caps[0] == (scalar | CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED) &&
           caps[1] == 0 && caps[2] == 0, "host link: integer add natively, AND and float add not");
    EXPECT_RC(cuDeviceGetHostAtomicCapabilities(caps, ops, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetHostAtomicCapabilities(NULL, ops, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetHostAtomicCapabilities(caps, ops, 1, 64), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, 0, 1), CUDA_SUCCESS);
    EXPECT(caps[1] == (scalar | CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED |
                       CU_ATOMIC_CAPABILITY_REDUCTION) && caps[2] == scalar,
           "NVLink between whole GPUs: integer ops with reductions, float ops at 32/64 bits");
    EXPECT_RC(cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, 1, 1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, 0, 64), CUDA_ERROR_INVALID_DEVICE);
    ops[0] = CU_ATOMIC_OPERATION_MAX;
    EXPECT_RC(cuDeviceGetP2PAtomicCapabilities(caps, ops, 1, 0, 1), CUDA_ERROR_INVALID_VALUE);
}

int main(void)
{
    MUST(cuInit(0));
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    if (n < 2) {
        printf("FAIL needs two visible GPUs (%d)\n", n);
        return 2;
    }
    CUcontext ctx;
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
    graph_memory();
    texture_width();
    cuda13();
    atomics();
    return drvtest_done();
}

/* The fake CUDA 12 runtime's calls of cudart_reach_more.c with device 0 and device 1: graph
 * memory, a kernel attribute per device, the 1D texture width (RT-texfmt), NvSciSync
 * attributes and the generic graph-node calls (RT-graphnode: the fake driver has no graphs
 * and refuses them itself). Self-checking; needs at least two visible GPUs. Driven by
 * python-tests/test_fake_runtime.py. */
#include <string.h>

#include "fake_rt_check.h"

int main(void)
{
    int n = 0;
    MUST_RT(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("FAIL needs two visible GPUs (%d)\n", n);
        return 2;
    }

    /* Graph memory (D-graphmem behind it). */
    unsigned long long v = 7;
    EXPECT_RT(cudaDeviceGraphMemTrim(1), cudaSuccess);
    EXPECT_RT(cudaDeviceGraphMemTrim(64), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceGetGraphMemAttribute(1, cudaGraphMemAttrReservedMemHigh, &v), cudaSuccess);
    CHECK(v == 0, "no graph memory: every attribute reads 0");
    v = 0;
    EXPECT_RT(cudaDeviceSetGraphMemAttribute(1, cudaGraphMemAttrUsedMemHigh, &v), cudaSuccess);
    EXPECT_RT(cudaDeviceSetGraphMemAttribute(1, cudaGraphMemAttrUsedMemCurrent, &v), cudaErrorInvalidValue);
    EXPECT_RT(cudaDeviceSetGraphMemAttribute(64, cudaGraphMemAttrUsedMemHigh, &v), cudaErrorInvalidDevice);

    /* No kernel exists: the driver refuses the handle (its stub: not supported). */
    EXPECT_RT(cudaKernelSetAttributeForDevice(NULL, cudaFuncAttributeMaxDynamicSharedMemorySize, 0, 64),
              cudaErrorInvalidDevice);

    /* RT-texfmt */
    size_t w = 0;
    struct cudaChannelFormatDesc f4 = {32, 32, 32, 32, cudaChannelFormatKindFloat};
    EXPECT_RT(cudaDeviceGetTexture1DLinearMaxWidth(&w, &f4, 1), cudaSuccess);
    CHECK(w == (size_t)1 << 28, "2^28 elements");
    struct cudaChannelFormatDesc f3 = {32, 32, 32, 0, cudaChannelFormatKindFloat};
    EXPECT_RT(cudaDeviceGetTexture1DLinearMaxWidth(&w, &f3, 0), cudaErrorInvalidChannelDescriptor);
    struct cudaChannelFormatDesc mixed = {8, 16, 0, 0, cudaChannelFormatKindUnsigned};
    EXPECT_RT(cudaDeviceGetTexture1DLinearMaxWidth(&w, &mixed, 0), cudaErrorInvalidChannelDescriptor);
    struct cudaChannelFormatDesc f64 = {64, 0, 0, 0, cudaChannelFormatKindFloat};
    EXPECT_RT(cudaDeviceGetTexture1DLinearMaxWidth(&w, &f64, 0), cudaErrorInvalidChannelDescriptor);
    struct cudaChannelFormatDesc s16 = {16, 16, 0, 0, cudaChannelFormatKindSigned};
    EXPECT_RT(cudaDeviceGetTexture1DLinearMaxWidth(&w, &s16, 1), cudaSuccess);
    EXPECT_RT(cudaDeviceGetTexture1DLinearMaxWidth(&w, NULL, 0), cudaErrorInvalidValue);
    EXPECT_RT(cudaDeviceGetTexture1DLinearMaxWidth(&w, &f4, 64), cudaErrorInvalidDevice);

    /* NvSciSync does not exist on this node: the driver's own answer. */
    char attrs[64];
    EXPECT_RT(cudaDeviceGetNvSciSyncAttributes(attrs, 64, cudaNvSciSyncAttrSignal), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceGetNvSciSyncAttributes(attrs, 1, cudaNvSciSyncAttrSignal), cudaErrorNotSupported);

    /* RT-graphnode */
    struct cudaGraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = cudaGraphNodeTypeMemAlloc;
    np.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    np.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    np.alloc.poolProps.location.id = 1;
    np.alloc.bytesize = 4096;
    cudaGraphNode_t node;
    EXPECT_RT(cudaGraphAddNode_v2(&node, NULL, NULL, NULL, 0, NULL), cudaErrorInvalidValue);
    EXPECT_RT(cudaGraphAddNode_v2(&node, NULL, NULL, NULL, 1, &np), cudaErrorInvalidValue);
    EXPECT_RT(cudaGraphAddNode_v2(&node, NULL, NULL, NULL, 0, &np), cudaErrorNotSupported);
    EXPECT_RT(cudaGraphNodeSetParams(NULL, NULL), cudaErrorInvalidValue);
    EXPECT_RT(cudaGraphNodeSetParams(NULL, &np), cudaErrorNotSupported);
    EXPECT_RT(cudaGraphExecNodeSetParams(NULL, NULL, NULL), cudaErrorInvalidValue);
    EXPECT_RT(cudaGraphExecNodeSetParams(NULL, NULL, &np), cudaErrorNotSupported);
    return rt_done("fake_rt_devstate");
}

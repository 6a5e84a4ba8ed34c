/* The fake runtime's calls that reach another device or share memory outside CUDA IPC
 * (fake/runtime/cudart_reach.c), with device 0 and device 1, including PyTorch's
 * cudaMallocAsync allocator pattern (device 1's default pool made accessible from device
 * 0). Self-checking; needs at least two visible GPUs. Driven by
 * python-tests/test_fake_runtime.py. */
#define CUDA_ENABLE_DEPRECATED
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

    /* Pools. */
    cudaMemPool_t p0, p1, cur;
    MUST_RT(cudaDeviceGetDefaultMemPool(&p0, 0));
    MUST_RT(cudaDeviceGetDefaultMemPool(&p1, 1));
    CHECK(p0 != p1, "each device has its own default pool");
    EXPECT_RT(cudaDeviceGetDefaultMemPool(&cur, 64), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceGetDefaultMemPool(NULL, 0), cudaErrorInvalidValue);
    MUST_RT(cudaDeviceGetMemPool(&cur, 1));
    CHECK(cur == p1, "device 1's current pool is its default pool");
    EXPECT_RT(cudaDeviceSetMemPool(0, p1), cudaErrorInvalidValue);
    EXPECT_RT(cudaDeviceSetMemPool(1, p1), cudaSuccess);
    struct cudaMemAccessDesc d = {{cudaMemLocationTypeDevice, 0}, cudaMemAccessFlagsProtReadWrite};
    EXPECT_RT(cudaMemPoolSetAccess(p1, &d, 1), cudaSuccess);
    enum cudaMemAccessFlags f = cudaMemAccessFlagsProtNone;
    struct cudaMemLocation l0 = {cudaMemLocationTypeDevice, 0};
    MUST_RT(cudaMemPoolGetAccess(&f, p1, &l0));
    CHECK(f == cudaMemAccessFlagsProtReadWrite, "PyTorch's pattern: device 0 reads and writes device 1's pool");
    d.location.id = 64;
    EXPECT_RT(cudaMemPoolSetAccess(p1, &d, 1), cudaErrorInvalidDevice);
    void *a = NULL;
    EXPECT_RT(cudaMallocFromPoolAsync(&a, 4096, p1, 0), cudaSuccess);
    EXPECT_RT(cudaFreeAsync(a, 0), cudaSuccess);
    EXPECT_RT(cudaMallocAsync(&a, 4096, 0), cudaSuccess);
    EXPECT_RT(cudaFreeAsync(a, 0), cudaSuccess);

    /* 3D peer copy from device 0 to device 1. */
    void *src, *dst;
    MUST_RT(cudaSetDevice(0));
    MUST_RT(cudaMalloc(&src, 256));
    MUST_RT(cudaSetDevice(1));
    MUST_RT(cudaMalloc(&dst, 256));
    MUST_RT(cudaSetDevice(0));
    unsigned char in[256], out[256];
    for (int i = 0; i < 256; i++)
        in[i] = (unsigned char)(i * 3 + 7);
    MUST_RT(cudaMemcpy(src, in, 256, cudaMemcpyHostToDevice));
    struct cudaMemcpy3DPeerParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = (struct cudaPitchedPtr){src, 64, 64, 4};
    p.dstPtr = (struct cudaPitchedPtr){dst, 64, 64, 4};
    p.srcDevice = 0;
    p.dstDevice = 1;
    p.extent = (struct cudaExtent){64, 4, 1};
    EXPECT_RT(cudaMemcpy3DPeer(&p), cudaSuccess);
    MUST_RT(cudaMemcpy(out, dst, 256, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(in, out, 256), "cudaMemcpy3DPeer copied every byte to device 1");
    EXPECT_RT(cudaMemcpy3DPeerAsync(&p, 0), cudaSuccess);
    p.dstDevice = 64;
    EXPECT_RT(cudaMemcpy3DPeer(&p), cudaErrorInvalidDevice);

    /* Devices. */
    int list[2] = {1, 0};
    EXPECT_RT(cudaSetValidDevices(list, 2), cudaSuccess);
    list[0] = 64;
    EXPECT_RT(cudaSetValidDevices(list, 2), cudaErrorInvalidDevice);
    EXPECT_RT(cudaSetValidDevices(NULL, 1), cudaErrorInvalidValue);
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    prop.major = 9;
    int chosen = -1;
    EXPECT_RT(cudaChooseDevice(&chosen, &prop), cudaSuccess);
    CHECK(chosen == 0, "cudaChooseDevice: device 0 matches compute capability 9.0 first (%d)", chosen);
    int v = -1;
    EXPECT_RT(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, 0, 1), cudaSuccess);
    CHECK(v == 1, "GPUs 0 and 1 are peers");
    EXPECT_RT(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, 0, 64), cudaErrorInvalidDevice);
    struct cudaLaunchParams lp[2];
    memset(lp, 0, sizeof lp);
    EXPECT_RT(cudaLaunchCooperativeKernelMultiDevice(lp, 2, 0), cudaErrorInvalidResourceHandle);
    EXPECT_RT(cudaLaunchCooperativeKernelMultiDevice(lp, 0, 0), cudaErrorInvalidValue);
    return rt_done("fake_rt_reach");
}

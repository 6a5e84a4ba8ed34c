/* The fake driver's functions that reach another device or share memory outside CUDA IPC
 * (fake/driver/reach.c, and the pool functions of memory.c), each with the caller's own
 * device 0 and with device 1, as rankguard's coverage tests call them. Self-checking; needs
 * at least two visible GPUs. Driven by python-tests/test_fake_driver.py. */
/* cuLaunchCooperativeKernelMultiDevice and cuDeviceComputeCapability are deprecated, and
 * still exported: programs call them. */
#define CUDA_ENABLE_DEPRECATED
#include <cuda.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_drvtest.h"

#define MIB (1ul << 20)

static CUcontext ctx[2];

static void pools(void)
{
    CUmemoryPool p0, p1, cur;
    MUST(cuDeviceGetDefaultMemPool(&p0, 0));
    MUST(cuDeviceGetDefaultMemPool(&p1, 1));
    EXPECT(p0 != p1, "each device has its own default pool");
    EXPECT_RC(cuDeviceGetDefaultMemPool(&cur, 64), CUDA_ERROR_INVALID_DEVICE);
    MUST(cuDeviceGetMemPool(&cur, 1));
    EXPECT(cur == p1, "the current pool of device 1 is its default pool");
    EXPECT_RC(cuDeviceSetMemPool(0, p1), CUDA_ERROR_INVALID_VALUE);   /* not located on 0 */
    EXPECT_RC(cuDeviceSetMemPool(1, p1), CUDA_SUCCESS);

    /* PyTorch's cudaMallocAsync allocator: device 1's pool made accessible from device 0. */
    CUmemAccess_flags f;
    CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    MUST(cuMemPoolGetAccess(&f, p1, &l1));
    EXPECT(f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "a pool's own device has read-write access");
    MUST(cuMemPoolGetAccess(&f, p1, &l0));
    EXPECT(f == CU_MEM_ACCESS_FLAGS_PROT_NONE, "another device has no access before cuMemPoolSetAccess");
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT_RC(cuMemPoolSetAccess(p1, &d, 1), CUDA_SUCCESS);
    MUST(cuMemPoolGetAccess(&f, p1, &l0));
    EXPECT(f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "device 0 reads and writes device 1's pool");
    d.location.id = 64;
    EXPECT_RC(cuMemPoolSetAccess(p1, &d, 1), CUDA_ERROR_INVALID_DEVICE);

    CUdeviceptr p;
    MUST(cuCtxSetCurrent(ctx[0]));
    MUST(cuMemAllocFromPoolAsync(&p, 4096, p1, NULL));
    EXPECT(fakecuda_pointer_physical_gpu(p) == 1, "an allocation from device 1's pool is on GPU 1");
    MUST(cuMemFreeAsync(p, NULL));
}

static void copy3d(void)
{
    CUdeviceptr a, b;
    MUST(cuCtxSetCurrent(ctx[0]));
    MUST(cuMemAlloc(&a, 64 * 4));
    MUST(cuCtxSetCurrent(ctx[1]));
    MUST(cuMemAlloc(&b, 64 * 4));
    unsigned char in[256], out[256];
    for (int i = 0; i < 256; i++)
        in[i] = (unsigned char)(i * 7 + 1);
    MUST(cuMemcpyHtoD(a, in, sizeof in));
    MUST(cuMemsetD8(b, 0, sizeof out));
    CUDA_MEMCPY3D_PEER c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = a;
    c.srcContext = ctx[0];
    c.dstDevice = b;
    c.dstContext = ctx[1];
    c.srcPitch = c.dstPitch = 64;
    c.srcHeight = c.dstHeight = 2;
    c.WidthInBytes = 48;               /* a 48x2x2 box of a 64-byte pitch */
    c.Height = 2;
    c.Depth = 2;
    EXPECT_RC(cuMemcpy3DPeer(&c), CUDA_SUCCESS);
    MUST(cuMemcpyDtoH(out, b, sizeof out));
    int same = 1;
    for (int i = 0; i < 256; i++)
        same &= out[i] == (i % 64 < 48 ? in[i] : 0);
    EXPECT(same, "cuMemcpy3DPeer copied the box from device 0 to device 1, pitch gaps untouched");
    c.WidthInBytes = 64;
    EXPECT_RC(cuMemcpy3DPeerAsync(&c, NULL), CUDA_SUCCESS);
    MUST(cuMemcpyDtoH(out, b, sizeof out));
    EXPECT(!memcmp(in, out, sizeof in), "cuMemcpy3DPeerAsync copied every byte");
    c.dstContext = (CUcontext)(uintptr_t)0x1234;
    EXPECT_RC(cuMemcpy3DPeer(&c), CUDA_ERROR_INVALID_CONTEXT);
    c.dstContext = ctx[1];
    c.srcLOD = 1;
    EXPECT_RC(cuMemcpy3DPeer(&c), CUDA_ERROR_INVALID_VALUE);
}

static void multicast(void)
{
    int sup = -1;
    MUST(cuDeviceGetAttribute(&sup, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0));
    EXPECT(sup == 1, "whole GPUs support multicast");
    CUmulticastObjectProp prop = {2, 2 * MIB, 0, 0};
    size_t g = 0;
    MUST(cuMulticastGetGranularity(&g, &prop, CU_MULTICAST_GRANULARITY_MINIMUM));
    EXPECT(g == 2 * MIB, "multicast granularity 2 MiB");
    CUmemGenericAllocationHandle mc;
    MUST(cuMulticastCreate(&mc, &prop));
    EXPECT_RC(cuMulticastAddDevice(mc, 64), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuMulticastAddDevice(mc, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMulticastAddDevice(mc, 0), CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp ap;
    memset(&ap, 0, sizeof ap);
    ap.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.location.id = 1;
    CUmemGenericAllocationHandle h1;
    MUST(cuMemCreate(&h1, 2 * MIB, &ap, 0));
    EXPECT_RC(cuMulticastBindMem(mc, 0, h1, 0, 2 * MIB, 0), CUDA_ERROR_NOT_PERMITTED);  /* team incomplete */
    EXPECT_RC(cuMulticastAddDevice(mc, 1), CUDA_SUCCESS);
    EXPECT_RC(cuMulticastAddDevice(mc, 2), CUDA_ERROR_INVALID_VALUE);                   /* team full */
    EXPECT_RC(cuMulticastBindMem(mc, 0, h1, 0, 2 * MIB, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMulticastUnbind(mc, 1, 0, 2 * MIB), CUDA_SUCCESS);
    ap.location.id = 0;
    CUmemGenericAllocationHandle h0;
    MUST(cuMemCreate(&h0, 2 * MIB, &ap, 0));
    CUdeviceptr va;
    MUST(cuMemAddressReserve(&va, 2 * MIB, 0, 0, 0));
    MUST(cuMemMap(va, 2 * MIB, 0, h0, 0));
    EXPECT_RC(cuMulticastBindAddr(mc, 0, va, 2 * MIB, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMulticastBindAddr(mc, 0, va, 2 * MIB, 1), CUDA_ERROR_INVALID_VALUE);
}

static void green(void)
{
    CUdevResource r0, r1;
    EXPECT_RC(cuDeviceGetDevResource(64, &r0, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_DEVICE);
    MUST(cuDeviceGetDevResource(0, &r0, CU_DEV_RESOURCE_TYPE_SM));
    MUST(cuDeviceGetDevResource(1, &r1, CU_DEV_RESOURCE_TYPE_SM));
    EXPECT(r0.sm.smCount == 132, "device 0's SM resource: 132 SMs (%u)", r0.sm.smCount);
    CUdevResourceDesc d0, d1;
    MUST(cuDevResourceGenerateDesc(&d0, &r0, 1));
    MUST(cuDevResourceGenerateDesc(&d1, &r1, 1));
    CUgreenCtx g;
    EXPECT_RC(cuGreenCtxCreate(&g, d0, 1, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    EXPECT_RC(cuGreenCtxCreate(&g, d0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuGreenCtxCreate(&g, d1, 1, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    CUdevResource back;
    MUST(cuGreenCtxGetDevResource(g, &back, CU_DEV_RESOURCE_TYPE_SM));
    EXPECT(back.sm.smCount == r1.sm.smCount, "a green context reports its SMs");
    EXPECT_RC(cuGreenCtxDestroy(g), CUDA_SUCCESS);
    EXPECT_RC(cuGreenCtxDestroy(g), CUDA_ERROR_INVALID_CONTEXT);
}

static void dmabuf(void)
{
    int sup = 0;
    MUST(cuDeviceGetAttribute(&sup, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 1));
    EXPECT(sup == 1, "dma-buf export supported");
    MUST(cuCtxSetCurrent(ctx[1]));
    CUdeviceptr d;
    MUST(cuMemAlloc(&d, MIB));
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        in[i] = (unsigned char)(i * 13 + 5);
    MUST(cuMemcpyHtoD(d + 4096, in, sizeof in));
    int fd = -1, fd2 = -1;
    EXPECT_RC(cuMemGetHandleForAddressRange(&fd, d + 1, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)(uintptr_t)in & ~4095ul, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemGetHandleForAddressRange(&fd, d + 4096, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    MUST(cuMemGetHandleForAddressRange(&fd2, d + 4096, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    struct stat a, b;
    EXPECT(fstat(fd, &a) == 0 && fstat(fd2, &b) == 0 && a.st_ino != b.st_ino,
           "each dma-buf export is its own file (a regular-file identity, st_ino %lu)", (unsigned long)a.st_ino);
    close(fd2);
    MUST(cuCtxSetCurrent(ctx[0]));
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC hd;
    memset(&hd, 0, sizeof hd);
    hd.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_WIN32;
    CUexternalMemory ext;
    hd.size = 4096;
    EXPECT_RC(cuImportExternalMemory(&ext, &hd), CUDA_ERROR_NOT_SUPPORTED);
    hd.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    hd.handle.fd = 0;                                  /* stdin: not a fake export */
    EXPECT_RC(cuImportExternalMemory(&ext, &hd), CUDA_ERROR_INVALID_VALUE);
    hd.handle.fd = fd;
    hd.size = 8192;
    EXPECT_RC(cuImportExternalMemory(&ext, &hd), CUDA_ERROR_INVALID_VALUE);  /* larger than the export */
    hd.size = 4096;
    MUST(cuImportExternalMemory(&ext, &hd));
    EXPECT(fcntl(fd, F_GETFD) == -1, "the imported fd belongs to the driver (closed)");
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC bd;
    memset(&bd, 0, sizeof bd);
    bd.size = 4096;
    CUdeviceptr p;
    MUST(cuExternalMemoryGetMappedBuffer(&p, ext, &bd));
    MUST(cuMemcpyDtoH(out, p, sizeof out));
    EXPECT(!memcmp(in, out, sizeof in), "the imported buffer holds the exported range's bytes");
    EXPECT(fakecuda_pointer_physical_gpu(p) == 1, "the imported buffer is device 1's memory");
    unsigned char z = 0x5a;
    MUST(cuMemcpyHtoD(p, &z, 1));
    MUST(cuMemcpyDtoH(out, d + 4096, 1));
    EXPECT(out[0] == 0x5a, "a write through the import is seen by the exporter");
    EXPECT_RC(cuMemFree(p), CUDA_SUCCESS);
    EXPECT_RC(cuDestroyExternalMemory(ext), CUDA_SUCCESS);
    EXPECT_RC(cuDestroyExternalMemory(ext), CUDA_ERROR_INVALID_HANDLE);
}

static void launches_and_queries(void)
{
    CUDA_LAUNCH_PARAMS lp[2];
    memset(lp, 0, sizeof lp);
    EXPECT_RC(cuLaunchCooperativeKernelMultiDevice(lp, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuLaunchCooperativeKernelMultiDevice(lp, 2, 0), CUDA_ERROR_INVALID_HANDLE);
    int v = -1;
    EXPECT_RC(cuDeviceGetP2PAttribute(&v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 0), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGetP2PAttribute(&v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 1), CUDA_SUCCESS);
    EXPECT(v == 1, "GPUs 0 and 1 are peers");
    int maj = 0, min = -1;
    EXPECT_RC(cuDeviceComputeCapability(&maj, &min, 1), CUDA_SUCCESS);
    EXPECT(maj == 9 && min == 0, "compute capability 9.0");
    char luid[8];
    unsigned mask;
    EXPECT_RC(cuDeviceGetLuid(luid, &mask, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_RC(cuDeviceGetLuid(luid, &mask, 64), CUDA_ERROR_INVALID_DEVICE);
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
    MUST(cuDevicePrimaryCtxRetain(&ctx[0], 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx[1], 1));
    MUST(cuCtxSetCurrent(ctx[0]));
    pools();
    copy3d();
    multicast();
    green();
    dmabuf();
    launches_and_queries();
    return drvtest_done();
}

/* Self-checking conformance program for the fake driver's single-process semantics:
 * init rules, device queries, primary and created contexts, memory and pointer
 * attributes, peer access and copies, streams, events, managed memory, prefetch/advise,
 * VMM within one process, error strings. Linked against libcuda.so.1 by ABI name through
 * NVIDIA's cuda.h, exactly as a real program (cuCtxCreate -> cuCtxCreate_v2, ...).
 * Driven by python-tests/test_fake_driver.py. Modes:
 *   fake_drv_basic            everything below (node: 8 GPUs, CVD unset)
 *   fake_drv_basic env-once   CVD set to "3,4" by the caller, changed after cuInit */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_drvtest.h"

static void *proc(const char *name, int version, int flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (cuGetProcAddress_v2(name, &p, version, (cuuint64_t)flags, &st) != CUDA_SUCCESS ||
        st != CU_GET_PROC_ADDRESS_SUCCESS) {
        printf("FAIL cuGetProcAddress(%s, %d, %d)\n", name, version, flags);
        exit(2);
    }
    return p;
}

static int env_once(void)
{
    MUST(cuInit(0));
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    EXPECT(n == 2, "CVD=3,4 enumerates 2 devices (got %d)", n);
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    EXPECT_RC(cuInit(0), CUDA_SUCCESS);
    MUST(cuDeviceGetCount(&n));
    EXPECT(n == 2, "CVD changed after cuInit is ignored (count %d)", n);
    CUuuid u;
    MUST(cuDeviceGetUuid_v2(&u, 0));
    EXPECT((unsigned char)u.bytes[0] == 0x13, "ordinal 0 is still physical GPU 3");
    return drvtest_done();
}

static void before_init(void)
{
    int n = -1, v = 0;
    CUdevice d;
    const char *s = NULL;
    EXPECT_RC(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_RC(cuDeviceGet(&d, 0), CUDA_ERROR_NOT_INITIALIZED);
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_RC(cuDriverGetVersion(&v), CUDA_SUCCESS);
    EXPECT(v == 12090, "cuDriverGetVersion before cuInit = %d", v);
    EXPECT_RC(cuGetErrorName(CUDA_ERROR_INVALID_DEVICE, &s), CUDA_SUCCESS);
    EXPECT(s && !strcmp(s, "CUDA_ERROR_INVALID_DEVICE"), "cuGetErrorName(101) = %s", s);
    void *fn = NULL;
    EXPECT_RC(cuGetProcAddress_v2("cuInit", &fn, 2000, 0, NULL), CUDA_SUCCESS);
    EXPECT(fn == (void *)cuInit, "cuGetProcAddress works before cuInit");
    EXPECT_RC(cuInit(1), CUDA_ERROR_INVALID_VALUE);
}

static void devices(void)
{
    int n = 0, v = 0;
    MUST(cuDeviceGetCount(&n));
    EXPECT(n == 8, "default node has 8 GPUs (got %d)", n);
    CUdevice d;
    EXPECT_RC(cuDeviceGet(&d, 8), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGet(&d, -1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    MUST(cuDeviceGet(&d, 1));
    char name[64], pci[32];
    MUST(cuDeviceGetName(name, sizeof name, d));
    EXPECT(!strcmp(name, "NVIDIA H100 80GB HBM3"), "name %s", name);
    MUST(cuDeviceGetPCIBusId(pci, sizeof pci, d));
    EXPECT(!strcmp(pci, "0000:28:00.0"), "PCI bus id of ordinal 1: %s", pci);
    CUdevice back = -1;
    EXPECT_RC(cuDeviceGetByPCIBusId(&back, "0000:28:00.0"), CUDA_SUCCESS);
    EXPECT(back == 1, "by PCI bus id 0000:28:00.0 -> %d", back);
    EXPECT_RC(cuDeviceGetByPCIBusId(&back, "38:00.0"), CUDA_SUCCESS);
    EXPECT(back == 2, "short form 38:00.0 -> %d", back);
    EXPECT_RC(cuDeviceGetByPCIBusId(&back, "0000:19:00.0"), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuDeviceGetByPCIBusId(&back, "gpu1"), CUDA_ERROR_INVALID_VALUE);
    CUuuid u;
    MUST(cuDeviceGetUuid(&u, d));
    static const unsigned char want[16] = {0x11, 0xc0, 0xff, 0xee, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1};
    EXPECT(!memcmp(u.bytes, want, 16), "uuid of GPU 1 is GPU-11c0ffee-0000-4000-8000-000000000001");
    struct { CUdevice_attribute a; int want; } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
        {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
        {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x28},
        {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
        {CU_DEVICE_ATTRIBUTE_NUMA_ID, 0},
        {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0},
        {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
        {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
        {CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 1},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        MUST(cuDeviceGetAttribute(&v, attrs[i].a, d));
        EXPECT(v == attrs[i].want, "attribute %d = %d (want %d)", attrs[i].a, v, attrs[i].want);
    }
    MUST(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_NUMA_ID, 7));
    EXPECT(v == 1, "GPU 7 of 8 on NUMA node 7*2/8 = 1 (got %d)", v);
    EXPECT_RC(cuDeviceGetAttribute(&v, (CUdevice_attribute)0, d), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetAttribute(&v, (CUdevice_attribute)9999, d), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 8), CUDA_ERROR_INVALID_DEVICE);
    size_t total = 0;
    MUST(cuDeviceTotalMem(&total, d));
    EXPECT(total == 80ull << 30, "cuDeviceTotalMem_v2 = %zu", total);
}

static void contexts(CUcontext *pc0, CUcontext *pc1)
{
    CUcontext c = (CUcontext)1;
    MUST(cuCtxGetCurrent(&c));
    EXPECT(c == NULL, "no current context at start");
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
    unsigned flags = 1;
    int active = 1;
    MUST(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(!active && flags == 0, "primary context inactive before retain");
    CUcontext p0, p0b;
    MUST(cuDevicePrimaryCtxRetain(&p0, 0));
    MUST(cuDevicePrimaryCtxRetain(&p0b, 0));
    EXPECT(p0 == p0b, "retain returns the same primary context");
    MUST(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(active, "primary context active after retain");
    EXPECT_RC(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_BLOCKING_SYNC), CUDA_SUCCESS);
    EXPECT_RC(cuDevicePrimaryCtxSetFlags(0, 0x10000), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuCtxDestroy(p0), CUDA_ERROR_INVALID_CONTEXT);
    MUST(cuCtxSetCurrent(p0));
    CUdevice dev = -1;
    MUST(cuCtxGetDevice(&dev));
    EXPECT(dev == 0, "primary context of ordinal 0 is current");
    MUST(cuDevicePrimaryCtxRelease(0));
    MUST(cuDevicePrimaryCtxGetState(0, &flags, &active));
    EXPECT(active, "still active after one of two releases");

    CUcontext c1 = NULL;
    EXPECT_RC(cuCtxCreate(&c1, 0, 8), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuCtxCreate(&c1, 0x100000, 1), CUDA_ERROR_INVALID_VALUE);
    MUST(cuCtxCreate(&c1, 0, 1));                /* cuda.h: cuCtxCreate -> cuCtxCreate_v2 */
    MUST(cuCtxGetCurrent(&c));
    EXPECT(c == c1, "a created context is current");
    MUST(cuCtxGetDevice(&dev));
    EXPECT(dev == 1, "created context on ordinal 1");
    CUcontext popped = NULL;
    MUST(cuCtxPopCurrent(&popped));
    EXPECT(popped == c1, "pop returns the created context");
    MUST(cuCtxGetCurrent(&c));
    EXPECT(c == p0, "pop restores the primary context");
    CUcontext c3 = NULL, c4 = NULL;
    MUST(cuCtxCreate_v3(&c3, NULL, 0, 0, 2));
    MUST(cuCtxCreate_v4(&c4, NULL, 0, 3));
    MUST(cuCtxGetDevice(&dev));
    EXPECT(dev == 3, "cuCtxCreate_v4 context on ordinal 3 is current");
    MUST(cuCtxDestroy(c4));
    MUST(cuCtxGetCurrent(&c));
    EXPECT(c == c3, "destroying the current context pops it");
    MUST(cuCtxDestroy(c3));
    EXPECT_RC(cuCtxDestroy(c3), CUDA_ERROR_INVALID_CONTEXT);
    MUST(cuCtxSetCurrent(p0));
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
    *pc0 = p0;
    *pc1 = c1;
}

static void memory(CUcontext c0, CUcontext c1)
{
    MUST(cuCtxSetCurrent(c0));
    CUdeviceptr a, b;
    EXPECT_RC(cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemAlloc(&a, 4096));
    MUST(cuMemAlloc(&b, 4096));
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        in[i] = (unsigned char)(i * 7 + 3);
    MUST(cuMemcpyHtoD(a, in, sizeof in));
    MUST(cuMemcpyDtoD(b, a, sizeof in));
    memset(out, 0, sizeof out);
    MUST(cuMemcpyDtoH(out, b, sizeof out));
    EXPECT(!memcmp(in, out, sizeof in), "HtoD -> DtoD -> DtoH round trip, 4096 bytes");
    MUST(cuMemsetD8(b + 100, 0xab, 10));
    MUST(cuMemcpy((CUdeviceptr)(uintptr_t)out, b, sizeof out));
    EXPECT(out[99] == in[99] && out[100] == 0xab && out[109] == 0xab && out[110] == in[110],
           "cuMemsetD8 on [100,110), cuMemcpy by unified address");
    EXPECT_RC(cuMemcpyHtoD(a + 4000, in, 200), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoH(out, (CUdeviceptr)(uintptr_t)in, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpy((CUdeviceptr)(uintptr_t)out, a + 4000, 200), CUDA_ERROR_INVALID_VALUE);
    /* per-thread-stream variants, fetched the way runtimes do */
    PFN_cuMemcpyHtoD_v7000_ptds h2d = proc("cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    PFN_cuMemcpyDtoH_v7000_ptds d2h = proc("cuMemcpyDtoH", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    PFN_cuMemsetD8_v7000_ptds ms = proc("cuMemsetD8", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    unsigned char x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {0};
    MUST(h2d(a, x, 8));
    MUST(ms(a + 2, 0, 2));
    MUST(d2h(y, a, 8));
    EXPECT(y[0] == 1 && y[2] == 0 && y[3] == 0 && y[4] == 5, "_ptds copy and memset variants");

    CUcontext pc = NULL;
    CUmemorytype mt = 0;
    int ord = -5, managed = 1;
    CUdeviceptr start = 0;
    size_t size = 0;
    void *hp = NULL;
    MUST(cuPointerGetAttribute(&pc, CU_POINTER_ATTRIBUTE_CONTEXT, a + 10));
    MUST(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 10));
    MUST(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a + 10));
    MUST(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, a + 10));
    MUST(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 10));
    MUST(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 10));
    EXPECT(pc == c0 && mt == CU_MEMORYTYPE_DEVICE && ord == 0 && !managed && start == a &&
           size == 4096, "pointer attributes of a+10: ctx, DEVICE, ordinal 0, range [a, +4096)");
    EXPECT_RC(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, a), CUDA_ERROR_INVALID_VALUE);
    int local = 0;
    EXPECT_RC(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)&local),
              CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_CONTEXT};
    mt = 9;
    ord = 9;
    pc = (CUcontext)1;
    void *data[3] = {&mt, &ord, &pc};
    EXPECT_RC(cuPointerGetAttributes(3, at, data, (CUdeviceptr)(uintptr_t)&local), CUDA_SUCCESS);
    EXPECT(mt == 0 && ord == -1 && pc == NULL, "cuPointerGetAttributes on host stack memory");
    MUST(cuPointerGetAttributes(3, at, data, b));
    EXPECT(mt == CU_MEMORYTYPE_DEVICE && ord == 0 && pc == c0, "cuPointerGetAttributes on device memory");

    /* peer */
    int can = -1;
    MUST(cuDeviceCanAccessPeer(&can, 0, 1));
    EXPECT(can == 1, "0 can access peer 1");
    MUST(cuDeviceCanAccessPeer(&can, 0, 0));
    EXPECT(can == 0, "a device is not its own peer");
    EXPECT_RC(cuDeviceCanAccessPeer(&can, 0, 8), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuCtxEnablePeerAccess(c1, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuCtxEnablePeerAccess(c1, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    EXPECT_RC(cuCtxEnablePeerAccess(c0, 0), CUDA_ERROR_INVALID_CONTEXT);   /* itself */
    CUcontext other0;
    MUST(cuCtxCreate(&other0, 0, 0));
    MUST(cuCtxPopCurrent(NULL));
    EXPECT_RC(cuCtxEnablePeerAccess(other0, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED); /* same device */
    MUST(cuCtxDestroy(other0));
    EXPECT_RC(cuCtxEnablePeerAccess((CUcontext)&local, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_RC(cuCtxDisablePeerAccess(c1), CUDA_SUCCESS);
    EXPECT_RC(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    MUST(cuCtxPushCurrent(c1));
    CUdeviceptr on1;
    MUST(cuMemAlloc(&on1, 4096));
    MUST(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on1));
    EXPECT(ord == 1, "memory allocated in the ordinal-1 context reports ordinal 1");
    MUST(cuCtxPopCurrent(NULL));
    MUST(cuMemsetD8(b, 0, 4096));
    MUST(cuMemcpyPeer(on1, c1, a, c0, 4096));
    MUST(cuMemcpyPeer(b, c0, on1, c1, 4096));
    MUST(cuMemcpyDtoH(out, b, 4096));
    MUST(cuMemcpyDtoH(in, a, 4096));
    EXPECT(!memcmp(out, in, 4096), "cuMemcpyPeer 0 -> 1 -> 0 keeps all 4096 bytes");
    PFN_cuMemcpyPeer_v7000_ptds peer_ptds = proc("cuMemcpyPeer", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    PFN_cuMemcpyPeerAsync_v7000_ptsz peer_async_ptsz = proc("cuMemcpyPeerAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    MUST(cuMemsetD8(on1, 0x5a, 4096));
    MUST(peer_ptds(b, c0, on1, c1, 16));
    MUST(cuMemcpyDtoH(out, b, 16));
    EXPECT(out[0] == 0x5a && out[15] == 0x5a, "cuMemcpyPeer_ptds copies bytes");
    MUST(cuMemsetD8(on1, 0x6b, 4096));
    MUST(peer_async_ptsz(b, c0, on1, c1, 16, CU_STREAM_PER_THREAD));
    MUST(cuMemcpyDtoH(out, b, 16));
    EXPECT(out[0] == 0x6b, "cuMemcpyPeerAsync_ptsz copies bytes");
    EXPECT_RC(cuMemcpyPeer(b, (CUcontext)&local, on1, c1, 16), CUDA_ERROR_INVALID_CONTEXT);

    /* IPC within the exporting process */
    CUipcMemHandle h1, h2;
    MUST(cuIpcGetMemHandle(&h1, a));
    MUST(cuIpcGetMemHandle(&h2, a + 100));
    EXPECT(!memcmp(&h1, &h2, sizeof h1), "handle of base+offset equals the base's");
    CUdeviceptr opened;
    EXPECT_RC(cuIpcOpenMemHandle(&opened, h1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuIpcOpenMemHandle(&opened, h1, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
    CUipcMemHandle junk;
    memset(&junk, 0x42, sizeof junk);
    EXPECT_RC(cuIpcOpenMemHandle(&opened, junk, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuIpcGetMemHandle(&h1, (CUdeviceptr)(uintptr_t)&local), CUDA_ERROR_INVALID_VALUE);

    EXPECT_RC(cuMemFree(a + 1), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemFree(a));
    EXPECT_RC(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
    size_t fr = 0, tot = 0;
    MUST(cuMemGetInfo(&fr, &tot));
    EXPECT(tot == 80ull << 30 && fr < tot, "cuMemGetInfo free %zu of %zu", fr, tot);
    MUST(cuMemFree(b));
    MUST(cuCtxPushCurrent(c1));
    MUST(cuMemFree(on1));
    MUST(cuCtxPopCurrent(NULL));
}

static void streams_events(void)
{
    CUstream s;
    EXPECT_RC(cuStreamCreate(&s, 4), CUDA_ERROR_INVALID_VALUE);
    MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    EXPECT_RC(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_RC(cuStreamQuery(s), CUDA_SUCCESS);
    EXPECT_RC(cuStreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    EXPECT_RC(cuStreamSynchronize(NULL), CUDA_SUCCESS);
    CUevent e1, e2, ipc;
    MUST(cuEventCreate(&e1, 0));
    MUST(cuEventCreate(&e2, CU_EVENT_BLOCKING_SYNC));
    EXPECT_RC(cuEventCreate(&ipc, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuEventCreate(&ipc, 0x100), CUDA_ERROR_INVALID_VALUE);
    MUST(cuEventCreate(&ipc, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    float ms = -1;
    EXPECT_RC(cuEventElapsedTime(&ms, e1, e2), CUDA_ERROR_NOT_READY);
    MUST(cuEventRecord(e1, s));
    MUST(cuEventRecord(e2, s));
    EXPECT_RC(cuEventSynchronize(e2), CUDA_SUCCESS);
    EXPECT_RC(cuEventQuery(e2), CUDA_SUCCESS);
    EXPECT_RC(cuEventElapsedTime(&ms, e1, e2), CUDA_SUCCESS);
    EXPECT(ms >= 0, "elapsed time %f ms", ms);
    EXPECT_RC(cuStreamWaitEvent(s, e1, 0), CUDA_SUCCESS);
    CUipcEventHandle eh;
    EXPECT_RC(cuIpcGetEventHandle(&eh, e1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuIpcGetEventHandle(&eh, ipc), CUDA_SUCCESS);
    CUevent back;
    EXPECT_RC(cuIpcOpenEventHandle(&back, eh), CUDA_ERROR_INVALID_CONTEXT);
    MUST(cuEventDestroy(e1));
    EXPECT_RC(cuEventDestroy(e1), CUDA_ERROR_INVALID_HANDLE);
    MUST(cuEventDestroy(e2));
    MUST(cuEventDestroy(ipc));
    MUST(cuStreamDestroy(s));
    EXPECT_RC(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_RC(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
}

static void managed(void)
{
    CUdeviceptr m, d;
    EXPECT_RC(cuMemAllocManaged(&m, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    MUST(cuMemAlloc(&d, 4096));
    int is_managed = 0;
    MUST(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m));
    EXPECT(is_managed == 1, "managed memory reports IS_MANAGED");
    ((unsigned char *)(uintptr_t)m)[5] = 9;     /* host-accessible, as managed memory is */
    EXPECT_RC(cuMemPrefetchAsync(m, 4096, 1, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemPrefetchAsync(m, 4096, CU_DEVICE_CPU, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemPrefetchAsync(m, 4096, 8, NULL), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuMemPrefetchAsync(d, 4096, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 7};
    EXPECT_RC(cuMemPrefetchAsync_v2(m, 4096, loc, 0, NULL), CUDA_SUCCESS);
    loc.id = 8;
    EXPECT_RC(cuMemPrefetchAsync_v2(m, 4096, loc, 0, NULL), CUDA_ERROR_INVALID_DEVICE);
    loc = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, 1};
    EXPECT_RC(cuMemPrefetchAsync_v2(m, 4096, loc, 0, NULL), CUDA_SUCCESS);
    loc.id = 2;
    EXPECT_RC(cuMemPrefetchAsync_v2(m, 4096, loc, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemAdvise(m, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, 2), CUDA_SUCCESS);
    EXPECT_RC(cuMemAdvise(m, 4096, CU_MEM_ADVISE_SET_ACCESSED_BY, 8), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_RC(cuMemAdvise(m, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, 8), CUDA_SUCCESS);
    EXPECT_RC(cuMemAdvise(m, 4096, (CUmem_advise)99, 0), CUDA_ERROR_INVALID_VALUE);
    loc = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 9};
    EXPECT_RC(cuMemAdvise_v2(m, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc), CUDA_ERROR_INVALID_DEVICE);
    loc.id = 3;
    EXPECT_RC(cuMemAdvise_v2(m, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc), CUDA_SUCCESS);
    MUST(cuMemFree(m));
    MUST(cuMemFree(d));
}

static void vmm_local(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    MUST(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT(gran == 2u << 20, "granularity 2 MiB (%zu)", gran);
    CUmemGenericAllocationHandle h, h2, imp;
    EXPECT_RC(cuMemCreate(&h, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 8;
    EXPECT_RC(cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
    prop.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, 2};
    EXPECT_RC(cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    prop.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 1};
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    EXPECT_RC(cuMemCreate(&h, gran, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    MUST(cuMemCreate(&h, 2 * gran, &prop, 0));
    CUdeviceptr va;
    MUST(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
    EXPECT(va % gran == 0, "reserved range is granularity-aligned");
    MUST(cuMemMap(va, 2 * gran, 0, h, 0));
    EXPECT_RC(cuMemsetD8(va, 1, 16), CUDA_ERROR_ILLEGAL_ADDRESS);   /* no access granted yet */
    EXPECT_RC(cuMemMap(va, gran, 0, h, 0), CUDA_ERROR_ALREADY_MAPPED);
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    acc.location.id = 8;
    EXPECT_RC(cuMemSetAccess(va, 2 * gran, &acc, 1), CUDA_ERROR_INVALID_DEVICE);
    acc.location.id = 1;
    MUST(cuMemSetAccess(va, 2 * gran, &acc, 1));
    unsigned long long fl = 0;
    CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1}, l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    MUST(cuMemGetAccess(&fl, &l1, va));
    EXPECT(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "ordinal 1 has read-write access");
    MUST(cuMemGetAccess(&fl, &l0, va));
    EXPECT(fl == CU_MEM_ACCESS_FLAGS_PROT_NONE, "ordinal 0 has no access");
    MUST(cuMemsetD8(va + gran - 1, 0x77, 2));
    unsigned char two[2];
    MUST(cuMemcpyDtoH(two, va + gran - 1, 2));
    EXPECT(two[0] == 0x77 && two[1] == 0x77, "VMM mapping is writable and readable");
    int ord = -1;
    MUST(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va));
    EXPECT(ord == 1, "VMM memory on ordinal 1 reports ordinal 1");
    MUST(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(va + 5)));
    EXPECT(h2 == h, "retain returns the mapped handle");
    MUST(cuMemRelease(h2));
    CUmemAllocationProp got;
    MUST(cuMemGetAllocationPropertiesFromHandle(&got, h));
    EXPECT(got.location.type == CU_MEM_LOCATION_TYPE_DEVICE && got.location.id == 1, "props of own handle");
    int fd = -1;
    MUST(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    struct stat st1, st2;
    int fd2 = -1;
    MUST(cuMemExportToShareableHandle(&fd2, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fstat(fd, &st1);
    fstat(fd2, &st2);
    EXPECT(st1.st_ino == st2.st_ino && st1.st_dev == st2.st_dev, "every export of one allocation is the same inode");
    MUST(cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    MUST(cuMemGetAllocationPropertiesFromHandle(&got, imp));
    EXPECT(got.location.type == CU_MEM_LOCATION_TYPE_DEVICE && got.location.id == 1, "props of imported handle");
    int junk = open("/dev/null", 0);
    EXPECT_RC(cuMemImportFromShareableHandle(&h2, (void *)(uintptr_t)junk, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_ERROR_INVALID_VALUE);
    close(junk);
    close(fd);
    close(fd2);
    MUST(cuMemRelease(imp));
    MUST(cuMemRelease(h));
    MUST(cuMemcpyDtoH(two, va + gran - 1, 2));
    EXPECT(two[0] == 0x77, "mapping keeps the memory after cuMemRelease");
    EXPECT_RC(cuMemAddressFree(va, 2 * gran), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemUnmap(va, 2 * gran));
    MUST(cuMemAddressFree(va, 2 * gran));
    EXPECT_RC(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
}

static void errors(void)
{
    const char *s = (const char *)1;
    EXPECT_RC(cuGetErrorString(CUDA_ERROR_NO_DEVICE, &s), CUDA_SUCCESS);
    EXPECT(s && strstr(s, "device"), "cuGetErrorString(100) = %s", s);
    EXPECT_RC(cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(s == NULL, "unknown error code gives a NULL string");
    EXPECT_RC(cuGetErrorName(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, &s), CUDA_SUCCESS);
    EXPECT(!strcmp(s, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"), "cuGetErrorName(704) = %s", s);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "env-once"))
        return env_once();
    before_init();
    MUST(cuInit(0));
    devices();
    CUcontext c0, c1;
    contexts(&c0, &c1);
    memory(c0, c1);
    streams_events();
    managed();
    vmm_local();
    errors();
    return drvtest_done();
}

/* cudart_api.c: the CUDA runtime API calls the fake libcudart.so.12 and .so.13 implement.
 *
 * Why it exists: rankguard guards runtime calls (cudaSetDevice, IPC, peer access, entry
 * points) of unmodified programs; its tests need a runtime with the real semantics and
 * error codes (cuda_runtime_api.h documentation of CUDA 12.9) on top of the fake driver.
 * Each call maps onto the driver the way the runtime documents ("\sa ::cu..." lines).
 * Every error return goes through rt_ret() so cudaGetLastError sees it. One source serves
 * both majors: compiled against the 12.9 or the 13.x headers, `#if CUDART_VERSION >= 13000`
 * where a signature or an exported name differs (the list: gen_sigdiff.py). The calls
 * rankguard guards, and those whose signature differs, record their arguments (RT_LOG).
 */
#include <stddef.h>
#include <string.h>

#include "cudart_internal.h"

/* The per-thread-default-stream exports. cuda_runtime_api.h maps these names onto the
 * plain ones only under CUDA_API_PER_THREAD_DEFAULT_STREAM (the __CUDART_API_PTDS/PTSZ
 * macros), so it declares none of them here; the real libcudart.so.12 exports them all.
 * cudaMemcpyPeer/cudaMemcpyPeerAsync have no `_ptds`/`_ptsz` export in the real library
 * and no mapping in the header, so neither does this one. */
RT_EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind);
RT_EXPORT cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count);
RT_EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
RT_EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
#if CUDART_VERSION >= 13000
RT_EXPORT cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count,
        struct cudaMemLocation location, unsigned int flags, cudaStream_t stream);
#else
RT_EXPORT cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count, int dstDevice,
                                                cudaStream_t stream);
RT_EXPORT cudaError_t cudaMemPrefetchAsync_v2_ptsz(const void *devPtr, size_t count,
        struct cudaMemLocation location, unsigned int flags, cudaStream_t stream);
#endif
RT_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
        unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus);
RT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol,
        void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
        enum cudaDriverEntryPointQueryResult *driverStatus);

#define TRY(expr) do { cudaError_t e_ = (expr); if (e_ != cudaSuccess) return rt_ret(e_); } while (0)
/* An entry point the driver did not provide: the call cannot be made on this driver. */
#define NEED(fn) do { if (!(fn)) return rt_ret(cudaErrorCallRequiresNewerDriver); } while (0)
#define DRIVER(call) return rt_ret(rt_map(call))

/* ---- versions, devices ------------------------------------------------------------ */

RT_EXPORT cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return rt_ret(cudaErrorInvalidValue);
    *runtimeVersion = FAKECUDART_RUNTIME_VERSION; /* the pinned headers' version: 12090, 13050 */
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return rt_ret(cudaErrorInvalidValue);
    /* "If no driver is installed, then 0 is returned as the driver version." */
    if (rt_load() != cudaSuccess) {
        *driverVersion = 0;
        return cudaSuccess;
    }
    DRIVER(rt_drv.driverGetVersion(driverVersion));
}

RT_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return rt_ret(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    if (e != cudaSuccess) {
        *count = 0; /* the real runtime reports 0 devices with cudaErrorNoDevice & co. */
        return rt_ret(e);
    }
    *count = rt_device_count();
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaSetDevice(int device)
{
    RT_LOG("cudaSetDevice", "device=%d", device);
    TRY(rt_check_device(device));
    rt_set_current_device(device);
    /* CUDA 12: "This function will also immediately initialize the runtime state on the
     * primary context, and the context will be current on device immediately." */
    TRY(rt_bind());
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaGetDevice(int *device)
{
    /* Logged: the guard asks the runtime of the caller's major for its current device
     * (a peer-access check), and the log shows which runtime it asked. */
    RT_LOG("cudaGetDevice", "device=%p", (void *)device);
    if (!device)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_init());
    *device = rt_current_device();
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
    RT_LOG("cudaInitDevice", "device=%d deviceFlags=%u flags=%u", device, deviceFlags,
           flags);
    TRY(rt_check_device(device));
    if (flags & ~(unsigned int)cudaInitDeviceFlagsAreValid)
        return rt_ret(cudaErrorInvalidValue);
    if (flags & cudaInitDeviceFlagsAreValid) {
        /* deviceFlags "match those of the flags parameters in cudaSetDeviceFlags"; the
         * cudaDevice* values equal the driver's CU_CTX_* ones. */
        if (deviceFlags & ~(unsigned int)cudaDeviceMask)
            return rt_ret(cudaErrorInvalidValue);
        NEED(rt_drv.primaryCtxSetFlags);
        CUdevice cu;
        TRY(rt_cu_device(device, &cu));
        TRY(rt_map(rt_drv.primaryCtxSetFlags(cu, deviceFlags)));
    }
    /* "initialize the CUDA Runtime structures and primary context on device ..., but the
     * context will not be made current". */
    CUcontext ctx;
    TRY(rt_primary_ctx(device, &ctx));
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    TRY(rt_bind());
    NEED(rt_drv.ctxSynchronize);
    DRIVER(rt_drv.ctxSynchronize());
}

RT_EXPORT cudaError_t cudaDeviceReset(void)
{
    TRY(rt_init());
    TRY(rt_reset_device(rt_current_device()));
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    RT_LOG("cudaDeviceGetAttribute", "value=%p attr=%d device=%d", (void *)value, (int)attr,
           device);
    if (!value)
        return rt_ret(cudaErrorInvalidValue);
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(rt_drv.deviceGetAttribute);
    /* cudaDeviceAttr values are defined equal to CUdevice_attribute values. */
    DRIVER(rt_drv.deviceGetAttribute(value, (CUdevice_attribute)attr, cu));
}

RT_EXPORT cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    RT_LOG("cudaDeviceGetPCIBusId", "pciBusId=%p len=%d device=%d", (void *)pciBusId, len,
           device);
    if (!pciBusId || len <= 0)
        return rt_ret(cudaErrorInvalidValue);
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(rt_drv.deviceGetPCIBusId);
    DRIVER(rt_drv.deviceGetPCIBusId(pciBusId, len, cu));
}

/* cudaDeviceProp fields that are one driver attribute each (the attribute names in
 * cuda.h's CUdevice_attribute say which field they back). */
struct prop_attr {
    size_t offset;
    CUdevice_attribute attr;
};
#define PA(field, attr) { offsetof(struct cudaDeviceProp, field), CU_DEVICE_ATTRIBUTE_##attr }
static const struct prop_attr prop_attrs[] = {
    PA(major, COMPUTE_CAPABILITY_MAJOR),
    PA(minor, COMPUTE_CAPABILITY_MINOR),
    PA(multiProcessorCount, MULTIPROCESSOR_COUNT),
#if CUDART_VERSION < 13000 /* fields removed from cudaDeviceProp in 13.0 */
    PA(clockRate, CLOCK_RATE),
#endif
    PA(warpSize, WARP_SIZE),
    PA(maxThreadsPerBlock, MAX_THREADS_PER_BLOCK),
    PA(maxThreadsDim[0], MAX_BLOCK_DIM_X),
    PA(maxThreadsDim[1], MAX_BLOCK_DIM_Y),
    PA(maxThreadsDim[2], MAX_BLOCK_DIM_Z),
    PA(maxGridSize[0], MAX_GRID_DIM_X),
    PA(maxGridSize[1], MAX_GRID_DIM_Y),
    PA(maxGridSize[2], MAX_GRID_DIM_Z),
    PA(regsPerBlock, MAX_REGISTERS_PER_BLOCK),
    PA(integrated, INTEGRATED),
    PA(canMapHostMemory, CAN_MAP_HOST_MEMORY),
#if CUDART_VERSION < 13000 /* fields removed from cudaDeviceProp in 13.0 */
    PA(computeMode, COMPUTE_MODE),
#endif
    PA(concurrentKernels, CONCURRENT_KERNELS),
    PA(ECCEnabled, ECC_ENABLED),
    PA(pciBusID, PCI_BUS_ID),
    PA(pciDeviceID, PCI_DEVICE_ID),
    PA(pciDomainID, PCI_DOMAIN_ID),
    PA(asyncEngineCount, ASYNC_ENGINE_COUNT),
    PA(unifiedAddressing, UNIFIED_ADDRESSING),
#if CUDART_VERSION < 13000 /* fields removed from cudaDeviceProp in 13.0 */
    PA(memoryClockRate, MEMORY_CLOCK_RATE),
#endif
    PA(memoryBusWidth, GLOBAL_MEMORY_BUS_WIDTH),
    PA(l2CacheSize, L2_CACHE_SIZE),
    PA(maxThreadsPerMultiProcessor, MAX_THREADS_PER_MULTIPROCESSOR),
    PA(managedMemory, MANAGED_MEMORY),
    PA(isMultiGpuBoard, MULTI_GPU_BOARD),
    PA(multiGpuBoardGroupID, MULTI_GPU_BOARD_GROUP_ID),
    PA(concurrentManagedAccess, CONCURRENT_MANAGED_ACCESS),
    PA(pageableMemoryAccess, PAGEABLE_MEMORY_ACCESS),
    PA(cooperativeLaunch, COOPERATIVE_LAUNCH),
    PA(maxBlocksPerMultiProcessor, MAX_BLOCKS_PER_MULTIPROCESSOR),
    PA(memoryPoolsSupported, MEMORY_POOLS_SUPPORTED),
    PA(ipcEventSupported, IPC_EVENT_SUPPORTED),
};
#undef PA

/* 12 exports the current struct under cudaGetDeviceProperties_v2 (the header maps the
 * plain name onto it); 13 exports it under the plain name and has no _v2. */
#if CUDART_VERSION >= 13000
#define GET_DEVICE_PROPERTIES cudaGetDeviceProperties
#define GET_DEVICE_PROPERTIES_NAME "cudaGetDeviceProperties"
#else
#define GET_DEVICE_PROPERTIES cudaGetDeviceProperties_v2
#define GET_DEVICE_PROPERTIES_NAME "cudaGetDeviceProperties_v2"
#endif
RT_EXPORT cudaError_t GET_DEVICE_PROPERTIES(struct cudaDeviceProp *prop, int device)
{
    RT_LOG(GET_DEVICE_PROPERTIES_NAME, "prop=%p device=%d", (void *)prop, device);
    if (!prop)
        return rt_ret(cudaErrorInvalidValue);
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(rt_drv.deviceGetName);
    NEED(rt_drv.deviceGetUuid);
    NEED(rt_drv.deviceTotalMem);
    NEED(rt_drv.deviceGetAttribute);
    /* Decision: the fields the driver can answer come from it (name, UUID, memory, the
     * attributes above); an attribute it refuses, and every other field, reads 0. */
    memset(prop, 0, sizeof *prop);
    TRY(rt_map(rt_drv.deviceGetName(prop->name, sizeof prop->name, cu)));
    CUuuid u;
    TRY(rt_map(rt_drv.deviceGetUuid(&u, cu)));
    _Static_assert(sizeof u == sizeof prop->uuid, "cudaUUID_t is CUuuid");
    memcpy(&prop->uuid, &u, sizeof u);
    TRY(rt_map(rt_drv.deviceTotalMem(&prop->totalGlobalMem, cu)));
    for (size_t i = 0; i < sizeof prop_attrs / sizeof prop_attrs[0]; i++) {
        int v = 0;
        if (rt_drv.deviceGetAttribute(&v, prop_attrs[i].attr, cu) != CUDA_SUCCESS)
            v = 0;
        memcpy((char *)prop + prop_attrs[i].offset, &v, sizeof v);
    }
    return cudaSuccess;
}

/* ---- memory --------------------------------------------------------------------- */

RT_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    /* Decision (docs silent; the real runtime does this): a 0-byte request succeeds with a
     * NULL pointer instead of reaching cuMemAlloc, which rejects size 0. */
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    NEED(rt_drv.memAlloc);
    CUdeviceptr p = 0;
    CUresult r = rt_drv.memAlloc(&p, size);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    *devPtr = (void *)(uintptr_t)p;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaFree(void *devPtr)
{
    /* cudaFree(0) is the classic "initialize the context" idiom: bind first. */
    TRY(rt_bind());
    if (!devPtr)
        return cudaSuccess;
    NEED(rt_drv.memFree);
    DRIVER(rt_drv.memFree((CUdeviceptr)(uintptr_t)devPtr));
}

RT_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    /* "flags: Must be either cudaMemAttachGlobal or cudaMemAttachHost"; the values equal
     * CU_MEM_ATTACH_GLOBAL/HOST. */
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    if (size == 0) /* "If size is 0, cudaMallocManaged returns cudaErrorInvalidValue." */
        return rt_ret(cudaErrorInvalidValue);
    NEED(rt_drv.memAllocManaged);
    CUdeviceptr p = 0;
    CUresult r = rt_drv.memAllocManaged(&p, size, flags);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    *devPtr = (void *)(uintptr_t)p;
    return cudaSuccess;
}

#if CUDART_VERSION < 13000
static cudaError_t prefetch_with(const struct rt_stream_fns *s, const void *devPtr,
                                 size_t count, int dstDevice, cudaStream_t stream)
{
    /* dstDevice: a device ordinal, or cudaCpuDeviceId (-1) = CU_DEVICE_CPU for the host. */
    CUdevice dst = CU_DEVICE_CPU;
    if (dstDevice != cudaCpuDeviceId)
        TRY(rt_cu_device(dstDevice, &dst));
    TRY(rt_bind());
    NEED(s->memPrefetchAsync);
    DRIVER(s->memPrefetchAsync((CUdeviceptr)(uintptr_t)devPtr, count, dst, stream));
}
#endif

#if CUDART_VERSION < 13000
RT_EXPORT cudaError_t cudaMemPrefetchAsync(const void *devPtr, size_t count, int dstDevice,
                                           cudaStream_t stream)
{
    RT_LOG("cudaMemPrefetchAsync", "devPtr=%p count=%zu dstDevice=%d stream=%p", devPtr, count,
           dstDevice, (void *)stream);
    return prefetch_with(&rt_legacy, devPtr, count, dstDevice, stream);
}

RT_EXPORT cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count, int dstDevice,
                                                cudaStream_t stream)
{
    RT_LOG("cudaMemPrefetchAsync_ptsz", "devPtr=%p count=%zu dstDevice=%d stream=%p", devPtr,
           count, dstDevice, (void *)stream);
    return prefetch_with(&rt_per_thread, devPtr, count, dstDevice, stream);
}
#endif

static cudaError_t prefetch_v2_with(const struct rt_stream_fns *s, const void *devPtr,
                                    size_t count, struct cudaMemLocation location,
                                    unsigned int flags, cudaStream_t stream)
{
    /* cudaMemLocationType values equal CUmemLocationType ones; only a device location
     * carries a runtime ordinal (the host kinds carry no id or a NUMA node id). */
    CUmemLocation loc = { .type = (CUmemLocationType)location.type, .id = location.id };
    if (location.type == cudaMemLocationTypeDevice) {
        CUdevice cu;
        TRY(rt_cu_device(location.id, &cu));
        loc.id = cu;
    }
    TRY(rt_bind());
    NEED(s->memPrefetchAsyncV2);
    DRIVER(s->memPrefetchAsyncV2((CUdeviceptr)(uintptr_t)devPtr, count, loc, flags, stream));
}

/* 12: cudaMemPrefetchAsync_v2(_ptsz); 13: the same signature under the plain name, and
 * no _v2 (13 removed it). */
#if CUDART_VERSION >= 13000
#define PREFETCH_LOC(suffix) cudaMemPrefetchAsync##suffix
#define PREFETCH_LOC_NAME "cudaMemPrefetchAsync"
#else
#define PREFETCH_LOC(suffix) cudaMemPrefetchAsync_v2##suffix
#define PREFETCH_LOC_NAME "cudaMemPrefetchAsync_v2"
#endif
#define PREFETCH_LOC_LOG(name) \
    RT_LOG(name, "devPtr=%p count=%zu location=" RT_LOC_FMT " flags=%u stream=%p", devPtr, \
           count, RT_LOC_ARGS(location), flags, (void *)stream)

RT_EXPORT cudaError_t PREFETCH_LOC()(const void *devPtr, size_t count,
        struct cudaMemLocation location, unsigned int flags, cudaStream_t stream)
{
    PREFETCH_LOC_LOG(PREFETCH_LOC_NAME);
    return prefetch_v2_with(&rt_legacy, devPtr, count, location, flags, stream);
}

RT_EXPORT cudaError_t PREFETCH_LOC(_ptsz)(const void *devPtr, size_t count,
        struct cudaMemLocation location, unsigned int flags, cudaStream_t stream)
{
    PREFETCH_LOC_LOG(PREFETCH_LOC_NAME "_ptsz");
    return prefetch_v2_with(&rt_per_thread, devPtr, count, location, flags, stream);
}

RT_EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    if (!free || !total)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.memGetInfo);
    DRIVER(rt_drv.memGetInfo(free, total));
}

static cudaError_t memcpy_with(const struct rt_stream_fns *s, void *dst, const void *src,
                               size_t count, enum cudaMemcpyKind kind)
{
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    TRY(rt_bind());
    if (count == 0)
        return cudaSuccess;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, sp = (CUdeviceptr)(uintptr_t)src;
    switch (kind) {
    case cudaMemcpyHostToHost:
        /* Host to host: synchronous with the device like every cudaMemcpy; the bytes never
         * touch the driver. */
        NEED(rt_drv.ctxSynchronize);
        TRY(rt_map(rt_drv.ctxSynchronize()));
        memmove(dst, src, count);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        NEED(s->memcpyHtoD);
        DRIVER(s->memcpyHtoD(d, src, count));
    case cudaMemcpyDeviceToHost:
        NEED(s->memcpyDtoH);
        DRIVER(s->memcpyDtoH(dst, sp, count));
    case cudaMemcpyDeviceToDevice:
        NEED(s->memcpyDtoD);
        DRIVER(s->memcpyDtoD(d, sp, count));
    case cudaMemcpyDefault:
        /* cudaMemcpyDefault: "the type of transfer is inferred from the pointer values"
         * (unified addressing): exactly what cuMemcpy does. */
        NEED(s->memcpy);
        DRIVER(s->memcpy(d, sp, count));
    }
    return rt_ret(cudaErrorInvalidMemcpyDirection);
}

RT_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                                 enum cudaMemcpyKind kind)
{
    return memcpy_with(&rt_legacy, dst, src, count, kind);
}

RT_EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind)
{
    return memcpy_with(&rt_per_thread, dst, src, count, kind);
}

static cudaError_t memset_with(const struct rt_stream_fns *s, void *devPtr, int value,
                               size_t count)
{
    TRY(rt_bind());
    if (count == 0)
        return cudaSuccess;
    NEED(s->memsetD8);
    DRIVER(s->memsetD8((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count));
}

RT_EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    return memset_with(&rt_legacy, devPtr, value, count);
}

RT_EXPORT cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
    return memset_with(&rt_per_thread, devPtr, value, count);
}

RT_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                               const void *ptr)
{
    if (!attributes)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.pointerGetAttribute);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    unsigned int mem_type = 0;
    CUresult r = rt_drv.pointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (r == CUDA_ERROR_INVALID_VALUE) {
        /* "In CUDA 11.0 forward passing host pointer will return cudaMemoryTypeUnregistered
         * ... and call will return cudaSuccess." Decision (docs silent on the other
         * fields): device -2 as the real runtime reports, both aliases NULL. */
        void *base;
        if (rt_host_lookup(ptr, &base)) {
            /* Page-locked host memory the runtime allocated or registered: host memory,
             * mapped at the same address on the device (unified addressing). */
            attributes->type = cudaMemoryTypeHost;
            attributes->device = rt_current_device();
            attributes->devicePointer = (void *)ptr;
            attributes->hostPointer = (void *)ptr;
            return cudaSuccess;
        }
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
        attributes->devicePointer = NULL;
        attributes->hostPointer = NULL;
        return cudaSuccess;
    }
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));

    int managed = 0, ordinal = -1;
    (void)rt_drv.pointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p);
    TRY(rt_map(rt_drv.pointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p)));
    void *dptr = NULL, *hptr = NULL;
    /* An alias that does not exist ("cannot be accessed directly") is reported as NULL. */
    if (rt_drv.pointerGetAttribute(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p) != CUDA_SUCCESS)
        dptr = NULL;
    if (rt_drv.pointerGetAttribute(&hptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, p) != CUDA_SUCCESS)
        hptr = NULL;

    if (managed)
        attributes->type = cudaMemoryTypeManaged;
    else if (mem_type == CU_MEMORYTYPE_HOST)
        attributes->type = cudaMemoryTypeHost;
    else
        attributes->type = cudaMemoryTypeDevice;
    attributes->device = ordinal; /* runtime ordinals are driver ordinals */
    attributes->devicePointer = dptr;
    attributes->hostPointer = hptr;
    return cudaSuccess;
}

/* ---- IPC ------------------------------------------------------------------------ */

RT_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    RT_LOG("cudaIpcGetMemHandle", "handle=%p devPtr=%p", (void *)handle, devPtr);
    if (!handle)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.ipcGetMemHandle);
    CUipcMemHandle h;
    CUresult r = rt_drv.ipcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)devPtr);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    _Static_assert(sizeof h == sizeof *handle, "cudaIpcMemHandle_t is CUipcMemHandle");
    memcpy(handle, &h, sizeof h);
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
                                           unsigned int flags)
{
    RT_LOG_HEX("cudaIpcOpenMemHandle", handle.reserved, "devPtr=%p handle={reserved=%s} flags=%u",
               (void *)devPtr, hex_, flags);
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    /* "flags - Flags for this operation. Must be specified as
     * cudaIpcMemLazyEnablePeerAccess". */
    if (flags != cudaIpcMemLazyEnablePeerAccess)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.ipcOpenMemHandle);
    CUipcMemHandle h;
    memcpy(&h, &handle, sizeof h);
    CUdeviceptr p = 0;
    CUresult r = rt_drv.ipcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    *devPtr = (void *)(uintptr_t)p;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    /* Logged: the guard undoes a denied import in the runtime that opened it. */
    RT_LOG("cudaIpcCloseMemHandle", "devPtr=%p", devPtr);
    TRY(rt_bind());
    NEED(rt_drv.ipcCloseMemHandle);
    DRIVER(rt_drv.ipcCloseMemHandle((CUdeviceptr)(uintptr_t)devPtr));
}

RT_EXPORT cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    RT_LOG("cudaIpcGetEventHandle", "handle=%p event=%p", (void *)handle, (void *)event);
    if (!handle)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.ipcGetEventHandle);
    CUipcEventHandle h;
    CUresult r = rt_drv.ipcGetEventHandle(&h, event);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    _Static_assert(sizeof h == sizeof *handle, "cudaIpcEventHandle_t is CUipcEventHandle");
    memcpy(handle, &h, sizeof h);
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    RT_LOG_HEX("cudaIpcOpenEventHandle", handle.reserved, "event=%p handle={reserved=%s}",
               (void *)event, hex_);
    if (!event)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.ipcOpenEventHandle);
    CUipcEventHandle h;
    memcpy(&h, &handle, sizeof h);
    DRIVER(rt_drv.ipcOpenEventHandle(event, h));
}

/* ---- events, streams ------------------------------------------------------------ */

RT_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event)
        return rt_ret(cudaErrorInvalidValue);
    const unsigned int known = cudaEventBlockingSync | cudaEventDisableTiming |
                               cudaEventInterprocess;
    if (flags & ~known)
        return rt_ret(cudaErrorInvalidValue);
    /* driver_types.h: "cudaEventInterprocess: cudaEventDisableTiming must be set". */
    if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.eventCreate);
    /* cudaEvent* flag values equal CU_EVENT_* ones. */
    DRIVER(rt_drv.eventCreate(event, flags));
}

RT_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

static cudaError_t event_record_with(const struct rt_stream_fns *s, cudaEvent_t event,
                                     cudaStream_t stream)
{
    TRY(rt_bind());
    NEED(s->eventRecord);
    /* cudaStream_t is CUstream; 0 means the legacy stream through the legacy entry point
     * and the per-thread stream through the `_ptsz` one, as in the driver. */
    DRIVER(s->eventRecord(event, stream));
}

RT_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return event_record_with(&rt_legacy, event, stream);
}

RT_EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
    return event_record_with(&rt_per_thread, event, stream);
}

RT_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    TRY(rt_init());
    NEED(rt_drv.eventSynchronize);
    DRIVER(rt_drv.eventSynchronize(event));
}

RT_EXPORT cudaError_t cudaEventQuery(cudaEvent_t event)
{
    TRY(rt_init());
    NEED(rt_drv.eventQuery);
    DRIVER(rt_drv.eventQuery(event));
}

RT_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    TRY(rt_init());
    NEED(rt_drv.eventDestroy);
    DRIVER(rt_drv.eventDestroy(event));
}

RT_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    if (!pStream)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.streamCreate);
    DRIVER(rt_drv.streamCreate(pStream, CU_STREAM_DEFAULT));
}

static cudaError_t stream_sync_with(const struct rt_stream_fns *s, cudaStream_t stream)
{
    TRY(rt_bind());
    NEED(s->streamSynchronize);
    DRIVER(s->streamSynchronize(stream));
}

RT_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return stream_sync_with(&rt_legacy, stream);
}

RT_EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    return stream_sync_with(&rt_per_thread, stream);
}

RT_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    TRY(rt_init());
    NEED(rt_drv.streamDestroy);
    DRIVER(rt_drv.streamDestroy(stream));
}

/* ---- peer access ---------------------------------------------------------------- */

RT_EXPORT cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    RT_LOG("cudaDeviceCanAccessPeer", "canAccessPeer=%p device=%d peerDevice=%d",
           (void *)canAccessPeer, device, peerDevice);
    if (!canAccessPeer)
        return rt_ret(cudaErrorInvalidValue);
    CUdevice cu, peer;
    TRY(rt_cu_device(device, &cu));
    TRY(rt_cu_device(peerDevice, &peer));
    NEED(rt_drv.deviceCanAccessPeer);
    DRIVER(rt_drv.deviceCanAccessPeer(canAccessPeer, cu, peer));
}

RT_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    RT_LOG("cudaDeviceEnablePeerAccess", "peerDevice=%d flags=%u", peerDevice, flags);
    TRY(rt_check_device(peerDevice));
    if (flags != 0)
        return rt_ret(cudaErrorInvalidValue);
    int self = rt_current_device();
    /* "Returns cudaErrorInvalidDevice if cudaDeviceCanAccessPeer() indicates that the
     * current device cannot directly access memory from peerDevice"; a device is never
     * its own peer. */
    if (peerDevice == self)
        return rt_ret(cudaErrorInvalidDevice);
    CUdevice cu, peer;
    TRY(rt_cu_device(self, &cu));
    TRY(rt_cu_device(peerDevice, &peer));
    NEED(rt_drv.deviceCanAccessPeer);
    NEED(rt_drv.ctxEnablePeerAccess);
    int can = 0;
    TRY(rt_map(rt_drv.deviceCanAccessPeer(&can, cu, peer)));
    if (!can)
        return rt_ret(cudaErrorInvalidDevice);
    CUcontext peer_ctx;
    TRY(rt_bind());
    TRY(rt_primary_ctx(peerDevice, &peer_ctx));
    DRIVER(rt_drv.ctxEnablePeerAccess(peer_ctx, 0));
}

RT_EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peerDevice)
{
    TRY(rt_check_device(peerDevice));
    NEED(rt_drv.ctxDisablePeerAccess);
    CUcontext peer_ctx;
    TRY(rt_bind());
    TRY(rt_primary_ctx(peerDevice, &peer_ctx));
    DRIVER(rt_drv.ctxDisablePeerAccess(peer_ctx));
}

RT_EXPORT cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
                                     size_t count)
{
    RT_LOG("cudaMemcpyPeer", "dst=%p dstDevice=%d src=%p srcDevice=%d count=%zu", dst,
           dstDevice, src, srcDevice, count);
    TRY(rt_check_device(dstDevice));
    TRY(rt_check_device(srcDevice));
    CUcontext dctx, sctx;
    TRY(rt_bind());
    TRY(rt_primary_ctx(dstDevice, &dctx));
    TRY(rt_primary_ctx(srcDevice, &sctx));
    if (count == 0)
        return cudaSuccess;
    NEED(rt_legacy.memcpyPeer);
    DRIVER(rt_legacy.memcpyPeer((CUdeviceptr)(uintptr_t)dst, dctx,
                                (CUdeviceptr)(uintptr_t)src, sctx, count));
}

RT_EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src,
                                          int srcDevice, size_t count, cudaStream_t stream)
{
    RT_LOG("cudaMemcpyPeerAsync", "dst=%p dstDevice=%d src=%p srcDevice=%d count=%zu stream=%p",
           dst, dstDevice, src, srcDevice, count, (void *)stream);
    TRY(rt_check_device(dstDevice));
    TRY(rt_check_device(srcDevice));
    CUcontext dctx, sctx;
    TRY(rt_bind());
    TRY(rt_primary_ctx(dstDevice, &dctx));
    TRY(rt_primary_ctx(srcDevice, &sctx));
    if (count == 0)
        return cudaSuccess;
    NEED(rt_legacy.memcpyPeerAsync);
    DRIVER(rt_legacy.memcpyPeerAsync((CUdeviceptr)(uintptr_t)dst, dctx,
                                     (CUdeviceptr)(uintptr_t)src, sctx, count, stream));
}

/* ---- driver entry points -------------------------------------------------------- */

/* cudaGetDriverEntryPoint(ByVersion): forwarded to the driver's cuGetProcAddress_v2
 * through the pointer the runtime got from its one dlsym, so whatever stands behind that
 * pointer (a guard's wrapper) sees these requests too. cudaEnableDefault means "per-thread
 * if the caller was compiled for it": the `_ptsz` export is what such a caller links to. */
static cudaError_t entry_point(const char *symbol, void **funcPtr, int cudaVersion,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *driverStatus,
                               int per_thread_caller)
{
    if (!symbol || !funcPtr)
        return rt_ret(cudaErrorInvalidValue);
    cuuint64_t cu_flags;
    switch (flags) {
    case cudaEnableDefault:
        cu_flags = per_thread_caller ? RT_FLAGS_PER_THREAD : RT_FLAGS_LEGACY;
        break;
    case cudaEnableLegacyStream:
        cu_flags = RT_FLAGS_LEGACY;
        break;
    case cudaEnablePerThreadDefaultStream:
        cu_flags = RT_FLAGS_PER_THREAD;
        break;
    default:
        return rt_ret(cudaErrorInvalidValue);
    }
    /* Decision: only the driver library must be loaded (phase 1), not cuInit'ed: looking a
     * symbol up needs no device. */
    TRY(rt_load());
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *funcPtr = NULL;
    CUresult r = rt_get_proc_address(symbol, funcPtr, cudaVersion, cu_flags, &status);
    if (r != CUDA_SUCCESS) {
        *funcPtr = NULL;
        return rt_ret(rt_map(r));
    }
    if (status != CU_GET_PROC_ADDRESS_SUCCESS)
        *funcPtr = NULL;
    if (driverStatus) {
        switch (status) {
        case CU_GET_PROC_ADDRESS_SUCCESS:
            *driverStatus = cudaDriverEntryPointSuccess;
            break;
        case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT:
            *driverStatus = cudaDriverEntryPointVersionNotSufficent;
            break;
        default:
            *driverStatus = cudaDriverEntryPointSymbolNotFound;
            break;
        }
    }
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
        unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus)
{
    RT_LOG("cudaGetDriverEntryPoint", "symbol=%s funcPtr=%p flags=%llu driverStatus=%p",
           RT_STR(symbol), (void *)funcPtr, flags, (void *)driverStatus);
    /* "the API will use the CUDA runtime version" (CUDART_VERSION). */
    return entry_point(symbol, funcPtr, FAKECUDART_RUNTIME_VERSION, flags, driverStatus, 0);
}

RT_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
        unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus)
{
    RT_LOG("cudaGetDriverEntryPoint_ptsz", "symbol=%s funcPtr=%p flags=%llu driverStatus=%p",
           RT_STR(symbol), (void *)funcPtr, flags, (void *)driverStatus);
    return entry_point(symbol, funcPtr, FAKECUDART_RUNTIME_VERSION, flags, driverStatus, 1);
}

RT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
        unsigned int cudaVersion, unsigned long long flags,
        enum cudaDriverEntryPointQueryResult *driverStatus)
{
    RT_LOG("cudaGetDriverEntryPointByVersion",
           "symbol=%s funcPtr=%p cudaVersion=%u flags=%llu driverStatus=%p", RT_STR(symbol),
           (void *)funcPtr, cudaVersion, flags, (void *)driverStatus);
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus, 0);
}

RT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol,
        void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
        enum cudaDriverEntryPointQueryResult *driverStatus)
{
    RT_LOG("cudaGetDriverEntryPointByVersion_ptsz",
           "symbol=%s funcPtr=%p cudaVersion=%u flags=%llu driverStatus=%p", RT_STR(symbol),
           (void *)funcPtr, cudaVersion, flags, (void *)driverStatus);
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus, 1);
}

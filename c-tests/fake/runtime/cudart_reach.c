/* cudart_reach.c: runtime calls that reach a device other than the current one, or share
 * device memory outside CUDA IPC: stream-ordered pools (default/current pool, pool access,
 * allocation from a pool), 3D peer copies, external memory, the multi-device cooperative
 * launch, cudaSetValidDevices, cudaChooseDevice and the P2P attribute query.
 *
 * Why it exists: rankguard guards these calls (and the driver calls they map onto); its
 * tests need them with the runtime's documented semantics (cuda_runtime_api.h 12.9), each
 * reaching the driver the way cudart_driver.c describes: through cuGetProcAddress_v2 with
 * the ABI version the runtime was written against, fetched once.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cudart_internal.h"

#define TRY(expr) do { cudaError_t e_ = (expr); if (e_ != cudaSuccess) return rt_ret(e_); } while (0)
#define NEED(fn) do { if (!(fn)) return rt_ret(cudaErrorCallRequiresNewerDriver); } while (0)
#define DRIVER(call) return rt_ret(rt_map(call))

RT_EXPORT cudaError_t cudaMemcpy3DPeer_ptds(const struct cudaMemcpy3DPeerParms *p);
RT_EXPORT cudaError_t cudaMemcpy3DPeerAsync_ptsz(const struct cudaMemcpy3DPeerParms *p,
                                                 cudaStream_t stream);
RT_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size,
                                                   cudaMemPool_t memPool, cudaStream_t stream);
RT_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
RT_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);

/* The driver entry points of this file, fetched once after the runtime loaded the driver,
 * with the version of the ABI each typedef names (cudaTypedefs.h). */
static struct {
    PFN_cuDeviceGetDefaultMemPool_v11020 getDefaultMemPool;
    PFN_cuDeviceGetMemPool_v11020 getMemPool;
    PFN_cuDeviceSetMemPool_v11020 setMemPool;
    PFN_cuMemPoolSetAccess_v11020 poolSetAccess;
    PFN_cuMemPoolGetAccess_v11020 poolGetAccess;
    PFN_cuMemAllocFromPoolAsync_v11020 allocFromPool[2];    /* legacy, per-thread */
    PFN_cuMemAllocAsync_v11020 allocAsync[2];
    PFN_cuMemFreeAsync_v11020 freeAsync[2];
    PFN_cuMemcpy3DPeer_v4000 copy3DPeer[2];
    PFN_cuMemcpy3DPeerAsync_v4000 copy3DPeerAsync[2];
    PFN_cuImportExternalMemory_v10000 importExternalMemory;
    PFN_cuExternalMemoryGetMappedBuffer_v10000 externalMemoryGetMappedBuffer;
    PFN_cuDestroyExternalMemory_v10000 destroyExternalMemory;
    PFN_cuLaunchCooperativeKernelMultiDevice_v9000 launchCoopMulti;
    PFN_cuDeviceGetP2PAttribute_v8000 getP2PAttribute;
    PFN_cuGraphAddMemAllocNode_v11040 graphAddMemAllocNode;
} drv;

static void fetch(void *slot, const char *name, int version, cuuint64_t flags)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (rt_get_proc_address(name, &fn, version, flags, &status) != CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS)
        fn = NULL;                                   /* RT-missing */
    memcpy(slot, &fn, sizeof fn);
}

static pthread_once_t fetched = PTHREAD_ONCE_INIT;

static void fetch_all(void)
{
    fetch(&drv.getDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, RT_FLAGS_LEGACY);
    fetch(&drv.getMemPool, "cuDeviceGetMemPool", 11020, RT_FLAGS_LEGACY);
    fetch(&drv.setMemPool, "cuDeviceSetMemPool", 11020, RT_FLAGS_LEGACY);
    fetch(&drv.poolSetAccess, "cuMemPoolSetAccess", 11020, RT_FLAGS_LEGACY);
    fetch(&drv.poolGetAccess, "cuMemPoolGetAccess", 11020, RT_FLAGS_LEGACY);
    fetch(&drv.importExternalMemory, "cuImportExternalMemory", 10000, RT_FLAGS_LEGACY);
    fetch(&drv.externalMemoryGetMappedBuffer, "cuExternalMemoryGetMappedBuffer", 10000, RT_FLAGS_LEGACY);
    fetch(&drv.destroyExternalMemory, "cuDestroyExternalMemory", 10000, RT_FLAGS_LEGACY);
    fetch(&drv.launchCoopMulti, "cuLaunchCooperativeKernelMultiDevice", 9000, RT_FLAGS_LEGACY);
    fetch(&drv.getP2PAttribute, "cuDeviceGetP2PAttribute", 8000, RT_FLAGS_LEGACY);
    fetch(&drv.graphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, RT_FLAGS_LEGACY);
    const cuuint64_t fl[2] = {RT_FLAGS_LEGACY, RT_FLAGS_PER_THREAD};
    for (int i = 0; i < 2; i++) {
        fetch(&drv.allocFromPool[i], "cuMemAllocFromPoolAsync", 11020, fl[i]);
        fetch(&drv.allocAsync[i], "cuMemAllocAsync", 11020, fl[i]);
        fetch(&drv.freeAsync[i], "cuMemFreeAsync", 11020, fl[i]);
        /* The per-thread 3D peer copies appeared with the other per-thread copies (7.0). */
        fetch(&drv.copy3DPeer[i], "cuMemcpy3DPeer", i ? 7000 : 4000, fl[i]);
        fetch(&drv.copy3DPeerAsync[i], "cuMemcpy3DPeerAsync", i ? 7000 : 4000, fl[i]);
    }
}

static cudaError_t load(void)
{
    cudaError_t e = rt_init();
    if (e == cudaSuccess)
        pthread_once(&fetched, fetch_all);
    return e;
}

/* ---- stream-ordered memory pools ---------------------------------------------- */

RT_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    RT_LOG("cudaDeviceGetDefaultMemPool", "memPool=%p device=%d", (void *)memPool, device);
    if (!memPool)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.getDefaultMemPool);
    DRIVER(drv.getDefaultMemPool((CUmemoryPool *)memPool, cu));
}

RT_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    if (!memPool)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.getMemPool);
    DRIVER(drv.getMemPool((CUmemoryPool *)memPool, cu));
}

RT_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.setMemPool);
    DRIVER(drv.setMemPool(cu, (CUmemoryPool)memPool));
}

/* cudaMemAccessDesc and CUmemAccessDesc have the same layout and values (the runtime
 * enums equal the driver's); a device location's id is a runtime ordinal, 1:1 with the
 * driver's CUdevice. */
_Static_assert(sizeof(struct cudaMemAccessDesc) == sizeof(CUmemAccessDesc), "access desc");

RT_EXPORT cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool,
                                           const struct cudaMemAccessDesc *descList, size_t count)
{
    if (descList && count > 0)
        RT_LOG("cudaMemPoolSetAccess", "memPool=%p descList[0]={location=" RT_LOC_FMT ",flags=%d} count=%zu",
               RT_LOG_HANDLE(memPool), RT_LOC_ARGS(descList[0].location), (int)descList[0].flags, count);
    else
        RT_LOG("cudaMemPoolSetAccess", "memPool=%p descList=%p count=%zu", RT_LOG_HANDLE(memPool),
               (const void *)descList, count);
    if (!descList || count == 0)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    for (size_t i = 0; i < count; i++)
        if (descList[i].location.type == cudaMemLocationTypeDevice)
            TRY(rt_check_device(descList[i].location.id));
    NEED(drv.poolSetAccess);
    DRIVER(drv.poolSetAccess((CUmemoryPool)memPool, (const CUmemAccessDesc *)descList, count));
}

RT_EXPORT cudaError_t cudaMemPoolGetAccess(enum cudaMemAccessFlags *flags, cudaMemPool_t memPool,
                                           struct cudaMemLocation *location)
{
    if (!flags || !location)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    NEED(drv.poolGetAccess);
    CUmemAccess_flags f;
    CUmemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = (CUmemLocationType)location->type;
    loc.id = location->id;
    CUresult r = drv.poolGetAccess(&f, (CUmemoryPool)memPool, &loc);
    if (r == CUDA_SUCCESS)
        *flags = (enum cudaMemAccessFlags)f;
    DRIVER(r);
}

/* "Allocates memory from a specified pool ... on the stream's device" (RT-ctx: the calling
 * thread's current device's primary context is made current). */
static cudaError_t from_pool(int pt, void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t s)
{
    if (!ptr)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    TRY(rt_bind());
    NEED(drv.allocFromPool[pt]);
    DRIVER(drv.allocFromPool[pt]((CUdeviceptr *)ptr, size, (CUmemoryPool)pool, s));
}

RT_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
    return from_pool(0, ptr, size, memPool, stream);
}
RT_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
    return from_pool(1, ptr, size, memPool, stream);
}

static cudaError_t malloc_async(int pt, void **ptr, size_t size, cudaStream_t s)
{
    RT_LOG(pt ? "cudaMallocAsync_ptsz" : "cudaMallocAsync", "devPtr=%p size=%zu hStream=%p",
           (void *)ptr, size, RT_LOG_HANDLE(s));
    if (!ptr)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    TRY(rt_bind());
    NEED(drv.allocAsync[pt]);
    DRIVER(drv.allocAsync[pt]((CUdeviceptr *)ptr, size, s));
}

RT_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) { return malloc_async(0, devPtr, size, hStream); }
RT_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) { return malloc_async(1, devPtr, size, hStream); }

static cudaError_t free_async(int pt, void *p, cudaStream_t s)
{
    TRY(load());
    TRY(rt_bind());
    NEED(drv.freeAsync[pt]);
    DRIVER(drv.freeAsync[pt]((CUdeviceptr)(uintptr_t)p, s));
}

RT_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) { return free_async(0, devPtr, hStream); }
RT_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) { return free_async(1, devPtr, hStream); }

/* ---- 3D peer copies -------------------------------------------------------------- */

/* Linear memory only (arrays do not exist on the fake: cudaErrorInvalidValue); each side's
 * context is its device's primary context. */
static cudaError_t copy3d_peer(int pt, const struct cudaMemcpy3DPeerParms *p, cudaStream_t s, int async)
{
    if (!p || p->srcArray || p->dstArray)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    TRY(rt_check_device(p->srcDevice));
    TRY(rt_check_device(p->dstDevice));
    CUcontext sctx, dctx;
    TRY(rt_bind());
    TRY(rt_primary_ctx(p->srcDevice, &sctx));
    TRY(rt_primary_ctx(p->dstDevice, &dctx));
    CUDA_MEMCPY3D_PEER c;
    memset(&c, 0, sizeof c);
    c.srcXInBytes = p->srcPos.x;
    c.srcY = p->srcPos.y;
    c.srcZ = p->srcPos.z;
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = (CUdeviceptr)(uintptr_t)p->srcPtr.ptr;
    c.srcContext = sctx;
    c.srcPitch = p->srcPtr.pitch;
    c.srcHeight = p->srcPtr.ysize;
    c.dstXInBytes = p->dstPos.x;
    c.dstY = p->dstPos.y;
    c.dstZ = p->dstPos.z;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = (CUdeviceptr)(uintptr_t)p->dstPtr.ptr;
    c.dstContext = dctx;
    c.dstPitch = p->dstPtr.pitch;
    c.dstHeight = p->dstPtr.ysize;
    c.WidthInBytes = p->extent.width;
    c.Height = p->extent.height;
    c.Depth = p->extent.depth;
    if (async) {
        NEED(drv.copy3DPeerAsync[pt]);
        DRIVER(drv.copy3DPeerAsync[pt](&c, s));
    }
    NEED(drv.copy3DPeer[pt]);
    DRIVER(drv.copy3DPeer[pt](&c));
}

RT_EXPORT cudaError_t cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms *p) { return copy3d_peer(0, p, NULL, 0); }
RT_EXPORT cudaError_t cudaMemcpy3DPeer_ptds(const struct cudaMemcpy3DPeerParms *p) { return copy3d_peer(1, p, NULL, 0); }
RT_EXPORT cudaError_t cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms *p, cudaStream_t stream) { return copy3d_peer(0, p, stream, 1); }
RT_EXPORT cudaError_t cudaMemcpy3DPeerAsync_ptsz(const struct cudaMemcpy3DPeerParms *p, cudaStream_t stream) { return copy3d_peer(1, p, stream, 1); }

/* ---- external memory ----------------------------------------------------------- */

RT_EXPORT cudaError_t cudaImportExternalMemory(cudaExternalMemory_t *extMem_out,
                                               const struct cudaExternalMemoryHandleDesc *desc)
{
    if (!extMem_out || !desc)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    TRY(rt_bind());
    NEED(drv.importExternalMemory);
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
    memset(&d, 0, sizeof d);
    d.type = (CUexternalMemoryHandleType)desc->type;
    if (desc->type == cudaExternalMemoryHandleTypeOpaqueFd)
        d.handle.fd = desc->handle.fd;
    else
        memcpy(&d.handle, &desc->handle, sizeof desc->handle < sizeof d.handle ? sizeof desc->handle : sizeof d.handle);
    d.size = desc->size;
    d.flags = desc->flags;
    DRIVER(drv.importExternalMemory((CUexternalMemory *)extMem_out, &d));
}

RT_EXPORT cudaError_t cudaExternalMemoryGetMappedBuffer(void **devPtr, cudaExternalMemory_t extMem,
                                                        const struct cudaExternalMemoryBufferDesc *bufferDesc)
{
    if (!devPtr || !bufferDesc)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    TRY(rt_bind());
    NEED(drv.externalMemoryGetMappedBuffer);
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC b;
    memset(&b, 0, sizeof b);
    b.offset = bufferDesc->offset;
    b.size = bufferDesc->size;
    b.flags = bufferDesc->flags;
    DRIVER(drv.externalMemoryGetMappedBuffer((CUdeviceptr *)devPtr, (CUexternalMemory)extMem, &b));
}

RT_EXPORT cudaError_t cudaDestroyExternalMemory(cudaExternalMemory_t extMem)
{
    TRY(load());
    NEED(drv.destroyExternalMemory);
    DRIVER(drv.destroyExternalMemory((CUexternalMemory)extMem));
}

/* ---- devices ---------------------------------------------------------------------- */

#if CUDART_VERSION < 13000
/* cudaLaunchParams -> CUDA_LAUNCH_PARAMS: the stream's context is the launch's device. The
 * fake has no kernels, so a valid list reaches the driver, which refuses the function
 * handle (cudaErrorInvalidResourceHandle). */
RT_EXPORT cudaError_t cudaLaunchCooperativeKernelMultiDevice(struct cudaLaunchParams *launchParamsList,
                                                             unsigned int numDevices, unsigned int flags)
{
    if (!launchParamsList || numDevices == 0 || numDevices > 64)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    TRY(rt_bind());
    NEED(drv.launchCoopMulti);
    CUDA_LAUNCH_PARAMS l[64];
    memset(l, 0, sizeof l);
    for (unsigned i = 0; i < numDevices; i++) {
        const struct cudaLaunchParams *p = &launchParamsList[i];
        l[i].function = (CUfunction)p->func;
        l[i].gridDimX = p->gridDim.x;
        l[i].gridDimY = p->gridDim.y;
        l[i].gridDimZ = p->gridDim.z;
        l[i].blockDimX = p->blockDim.x;
        l[i].blockDimY = p->blockDim.y;
        l[i].blockDimZ = p->blockDim.z;
        l[i].sharedMemBytes = (unsigned)p->sharedMem;
        l[i].hStream = (CUstream)p->stream;
        l[i].kernelParams = p->args;
    }
    DRIVER(drv.launchCoopMulti(l, numDevices, flags));
}
#endif /* CUDA 13 removed cudaLaunchCooperativeKernelMultiDevice from the runtime */

/* RT-valid: the list is checked (every entry a valid ordinal) and then unused: the fake's
 * runtime never picks a device implicitly other than the thread's current one. */
RT_EXPORT cudaError_t cudaSetValidDevices(int *device_arr, int len)
{
    if (len < 0 || (len > 0 && !device_arr))
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    for (int i = 0; i < len; i++)
        TRY(rt_check_device(device_arr[i]));
    return cudaSuccess;
}

/* RT-choose: the device whose compute capability is the closest to prop's (major, minor),
 * the lowest ordinal among equals. */
RT_EXPORT cudaError_t cudaChooseDevice(int *device, const struct cudaDeviceProp *prop)
{
    if (!device || !prop)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    NEED(rt_drv.deviceGetAttribute);
    int best = 0, best_d = -1;
    for (int i = 0; i < rt_device_count(); i++) {
        int maj = 0, min = 0;
        TRY(rt_map(rt_drv.deviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, i)));
        TRY(rt_map(rt_drv.deviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, i)));
        int d = (maj - prop->major) * 10 + (min - prop->minor);
        d = d < 0 ? -d : d;
        if (best_d < 0 || d < best_d) {
            best = i;
            best_d = d;
        }
    }
    *device = best;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaDeviceGetP2PAttribute(int *value, enum cudaDeviceP2PAttr attr,
                                                int srcDevice, int dstDevice)
{
    if (!value)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    CUdevice s, d;
    TRY(rt_cu_device(srcDevice, &s));
    TRY(rt_cu_device(dstDevice, &d));
    NEED(drv.getP2PAttribute);
    DRIVER(drv.getP2PAttribute(value, (CUdevice_P2PAttribute)attr, s, d));
}

/* ---- graphs ----------------------------------------------------------------------- */

/* cudaMemAllocNodeParams has CUDA_MEM_ALLOC_NODE_PARAMS's layout (the pool properties and
 * access descriptors of the runtime equal the driver's). The fake driver has no graphs and
 * answers CUDA_ERROR_NOT_SUPPORTED: this only reaches it with the caller's arguments. */
_Static_assert(sizeof(struct cudaMemAllocNodeParams) == sizeof(CUDA_MEM_ALLOC_NODE_PARAMS), "alloc node params");

RT_EXPORT cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                               const cudaGraphNode_t *pDependencies,
                                               size_t numDependencies,
                                               struct cudaMemAllocNodeParams *nodeParams)
{
    if (!pGraphNode || !nodeParams)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    NEED(drv.graphAddMemAllocNode);
    DRIVER(drv.graphAddMemAllocNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
                                    (const CUgraphNode *)pDependencies, numDependencies,
                                    (CUDA_MEM_ALLOC_NODE_PARAMS *)nodeParams));
}

#if CUDART_VERSION >= 13000
/* ---- CUDA 13: pools by location, green and execution contexts ------------------- */

static struct {
    PFN_cuMemGetDefaultMemPool_v13000 getDefault;
    PFN_cuMemGetMemPool_v13000 get;
    PFN_cuMemSetMemPool_v13000 set;
    PFN_cuDeviceGetDevResource_v12040 getDevResource;
    PFN_cuDevResourceGenerateDesc_v12040 generateDesc;
    PFN_cuGreenCtxCreate_v12040 greenCtxCreate;
    PFN_cuMemPrefetchBatchAsync_v13000 prefetchBatch[2]; /* legacy, per-thread */
    /* PFN_cuMemDiscardAndPrefetchBatchAsync_v13000 has prefetchBatch's parameters */
    PFN_cuMemPrefetchBatchAsync_v13000 discardAndPrefetchBatch[2]; /* legacy, per-thread */
} drv13;
static pthread_once_t fetched13 = PTHREAD_ONCE_INIT;

static void fetch13(void)
{
    fetch(&drv13.getDefault, "cuMemGetDefaultMemPool", 13000, RT_FLAGS_LEGACY);
    fetch(&drv13.get, "cuMemGetMemPool", 13000, RT_FLAGS_LEGACY);
    fetch(&drv13.set, "cuMemSetMemPool", 13000, RT_FLAGS_LEGACY);
    fetch(&drv13.getDevResource, "cuDeviceGetDevResource", 12040, RT_FLAGS_LEGACY);
    fetch(&drv13.generateDesc, "cuDevResourceGenerateDesc", 12040, RT_FLAGS_LEGACY);
    fetch(&drv13.greenCtxCreate, "cuGreenCtxCreate", 12040, RT_FLAGS_LEGACY);
    fetch(&drv13.prefetchBatch[0], "cuMemPrefetchBatchAsync", 13000, RT_FLAGS_LEGACY);
    fetch(&drv13.prefetchBatch[1], "cuMemPrefetchBatchAsync", 13000, RT_FLAGS_PER_THREAD);
    fetch(&drv13.discardAndPrefetchBatch[0], "cuMemDiscardAndPrefetchBatchAsync", 13000, RT_FLAGS_LEGACY);
    fetch(&drv13.discardAndPrefetchBatch[1], "cuMemDiscardAndPrefetchBatchAsync", 13000, RT_FLAGS_PER_THREAD);
}

static cudaError_t load13(void)
{
    cudaError_t e = load();
    if (e == cudaSuccess)
        pthread_once(&fetched13, fetch13);
    return e;
}

/* A runtime location -> the driver's (a device location's id is a runtime ordinal). */
static cudaError_t cu_location(const struct cudaMemLocation *l, CUmemLocation *out)
{
    if (!l)
        return cudaErrorInvalidValue;
    memset(out, 0, sizeof *out);
    out->type = (CUmemLocationType)l->type;
    out->id = l->id;
    if (l->type == cudaMemLocationTypeDevice) {
        CUdevice cu;
        cudaError_t e = rt_cu_device(l->id, &cu);
        if (e != cudaSuccess)
            return e;
        out->id = cu;
    }
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t *memPool, struct cudaMemLocation *location,
                                               enum cudaMemAllocationType type)
{
    if (!memPool)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load13());
    CUmemLocation l;
    TRY(cu_location(location, &l));
    NEED(drv13.getDefault);
    DRIVER(drv13.getDefault((CUmemoryPool *)memPool, &l, (CUmemAllocationType)type));
}

RT_EXPORT cudaError_t cudaMemGetMemPool(cudaMemPool_t *memPool, struct cudaMemLocation *location,
                                        enum cudaMemAllocationType type)
{
    if (!memPool)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load13());
    CUmemLocation l;
    TRY(cu_location(location, &l));
    NEED(drv13.get);
    DRIVER(drv13.get((CUmemoryPool *)memPool, &l, (CUmemAllocationType)type));
}

RT_EXPORT cudaError_t cudaMemSetMemPool(struct cudaMemLocation *location, enum cudaMemAllocationType type,
                                        cudaMemPool_t memPool)
{
    TRY(load13());
    CUmemLocation l;
    TRY(cu_location(location, &l));
    NEED(drv13.set);
    DRIVER(drv13.set(&l, (CUmemAllocationType)type, (CUmemoryPool)memPool));
}

_Static_assert(sizeof(cudaDevResource) == sizeof(CUdevResource), "device resource layout");

RT_EXPORT cudaError_t cudaDeviceGetDevResource(int device, cudaDevResource *resource, enum cudaDevResourceType type)
{
    if (!resource)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load13());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv13.getDevResource);
    DRIVER(drv13.getDevResource(cu, (CUdevResource *)resource, (CUdevResourceType)type));
}

RT_EXPORT cudaError_t cudaDevResourceGenerateDesc(cudaDevResourceDesc_t *phDesc, cudaDevResource *resources,
                                                  unsigned int nbResources)
{
    TRY(load13());
    NEED(drv13.generateDesc);
    DRIVER(drv13.generateDesc((CUdevResourceDesc *)phDesc, (CUdevResource *)resources, nbResources));
}

/* RT-exec: an execution context is the driver's green context (cudaGreenCtxCreate) or the
 * device's primary context (cudaDeviceGetExecutionCtx); the handle is the driver's. */
RT_EXPORT cudaError_t cudaGreenCtxCreate(cudaExecutionContext_t *phCtx, cudaDevResourceDesc_t desc,
                                         int device, unsigned int flags)
{
    if (!phCtx)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load13());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv13.greenCtxCreate);
    /* cudaGreenCtxDefaultStream is the only flag, and the driver's is required */
    if (flags != 0)
        return rt_ret(cudaErrorInvalidValue);
    DRIVER(drv13.greenCtxCreate((CUgreenCtx *)phCtx, (CUdevResourceDesc)desc, cu, CU_GREEN_CTX_DEFAULT_STREAM));
}

RT_EXPORT cudaError_t cudaDeviceGetExecutionCtx(cudaExecutionContext_t *ctx, int device)
{
    if (!ctx)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load13());
    CUcontext c;
    TRY(rt_primary_ctx(device, &c));
    *ctx = (cudaExecutionContext_t)c;
    return cudaSuccess;
}
/* The batch prefetches (plain and discard-first: the same parameters, cudaTypedefs.h) to the
 * driver function in `slot`: each location converted like cu_location; at most 64 locations
 * (the fake's limit). The per-thread-stream exports (`_ptsz`) pass the driver's per-thread
 * variant. */
_Static_assert(__builtin_types_compatible_p(PFN_cuMemPrefetchBatchAsync_v13000,
                                            PFN_cuMemDiscardAndPrefetchBatchAsync_v13000),
               "cudaTypedefs.h: the two batch prefetches take the same parameters");

static cudaError_t batch_to_driver(PFN_cuMemPrefetchBatchAsync_v13000 *slot, void **dptrs,
                                   size_t *sizes, size_t count, struct cudaMemLocation *prefetchLocs,
                                   size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                   unsigned long long flags, cudaStream_t stream)
{
    if (!prefetchLocs || numPrefetchLocs == 0 || numPrefetchLocs > 64)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load13());
    CUmemLocation l[64];
    for (size_t i = 0; i < numPrefetchLocs; i++)
        TRY(cu_location(&prefetchLocs[i], &l[i]));
    TRY(rt_bind());
    NEED(*slot);
    DRIVER((*slot)((CUdeviceptr *)dptrs, sizes, count, l, prefetchLocIdxs, numPrefetchLocs, flags,
                   stream));
}

RT_EXPORT cudaError_t cudaMemPrefetchBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count,
                                                     struct cudaMemLocation *prefetchLocs,
                                                     size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                     unsigned long long flags, cudaStream_t stream);

RT_EXPORT cudaError_t cudaMemPrefetchBatchAsync(void **dptrs, size_t *sizes, size_t count,
                                                struct cudaMemLocation *prefetchLocs,
                                                size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                unsigned long long flags, cudaStream_t stream)
{
    return batch_to_driver(&drv13.prefetchBatch[0], dptrs, sizes, count, prefetchLocs,
                           prefetchLocIdxs, numPrefetchLocs, flags, stream);
}

RT_EXPORT cudaError_t cudaMemPrefetchBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count,
                                                     struct cudaMemLocation *prefetchLocs,
                                                     size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                     unsigned long long flags, cudaStream_t stream)
{
    return batch_to_driver(&drv13.prefetchBatch[1], dptrs, sizes, count, prefetchLocs,
                           prefetchLocIdxs, numPrefetchLocs, flags, stream);
}

/* Like cudaMemPrefetchBatchAsync (the ranges' contents are discarded first); it records
 * the locations it received (RT_LOG), and has a per-thread-stream export. */
static cudaError_t discard_prefetch_batch(int pt, void **dptrs, size_t *sizes, size_t count,
                                          struct cudaMemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                          size_t numPrefetchLocs, unsigned long long flags,
                                          cudaStream_t stream)
{
    const char *sym = pt ? "cudaMemDiscardAndPrefetchBatchAsync_ptsz" : "cudaMemDiscardAndPrefetchBatchAsync";
    if (rt_arglog_on()) {
        char locs[256] = "(null)";
        size_t at = 0;
        for (size_t i = 0; prefetchLocs && i < numPrefetchLocs && i < 8 && at < sizeof locs; i++)
            at += (size_t)snprintf(locs + at, sizeof locs - at, "%s{type=%d,id=%d}", i ? "," : "[",
                                   (int)prefetchLocs[i].type, prefetchLocs[i].id);
        if (prefetchLocs && numPrefetchLocs && at < sizeof locs)
            snprintf(locs + at, sizeof locs - at, "]");
        rt_arglog(sym, "count=%zu prefetchLocs=%s numPrefetchLocs=%zu flags=%llu stream=%p", count,
                  locs, numPrefetchLocs, flags, RT_LOG_HANDLE(stream));
    }
    return batch_to_driver(&drv13.discardAndPrefetchBatch[pt], dptrs, sizes, count, prefetchLocs,
                           prefetchLocIdxs, numPrefetchLocs, flags, stream);
}

RT_EXPORT cudaError_t cudaMemDiscardAndPrefetchBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count,
                                                               struct cudaMemLocation *prefetchLocs,
                                                               size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                               unsigned long long flags, cudaStream_t stream);

RT_EXPORT cudaError_t cudaMemDiscardAndPrefetchBatchAsync(void **dptrs, size_t *sizes, size_t count,
                                                          struct cudaMemLocation *prefetchLocs,
                                                          size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                          unsigned long long flags, cudaStream_t stream)
{
    return discard_prefetch_batch(0, dptrs, sizes, count, prefetchLocs, prefetchLocIdxs,
                                  numPrefetchLocs, flags, stream);
}

RT_EXPORT cudaError_t cudaMemDiscardAndPrefetchBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count,
                                                               struct cudaMemLocation *prefetchLocs,
                                                               size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                               unsigned long long flags, cudaStream_t stream)
{
    return discard_prefetch_batch(1, dptrs, sizes, count, prefetchLocs, prefetchLocIdxs,
                                  numPrefetchLocs, flags, stream);
}
#endif /* CUDA 13 */

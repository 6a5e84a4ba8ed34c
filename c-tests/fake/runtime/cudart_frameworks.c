/* cudart_frameworks.c: the runtime calls a framework's own libraries make (PyTorch 2.15's
 * libtorch_cuda, libc10_cuda, libtorch_nvshmem...): fat-binary and kernel registration, the
 * launch configuration, kernel launches, function attributes and occupancy, streams with
 * flags and priorities, events with flags and timing, host memory, async copies and
 * memsets, stream capture and graphs, user objects, CUDA libraries, pool attributes and
 * the profiler switches.
 *
 * Why it exists: python-tests/test_fake_frameworks.py derives the list of runtime names
 * the pinned torch imports (its libraries' undefined `@libcudart.so.13` symbols) and fails
 * when the fake lacks one, so torch runs on the fake node (scripts/fake-node). Semantics are
 * cuda_runtime_api.h's (13.x and 12.9: the signatures are the same in both), with these
 * decisions (c-tests/README.md, "Known differences"):
 *   - D-nokernel: registration is accepted and remembered; a launch of a registered kernel
 *     with a valid configuration succeeds and runs nothing. Data moves only by copies and
 *     memsets. An unregistered function is cudaErrorInvalidDeviceFunction.
 *   - D-hostfn: all work is complete when it is enqueued (as in the fake driver), so a host
 *     function or stream callback runs at once, in the enqueuing thread.
 *   - D-nograph: stream capture and graphs are not modelled: capture never starts
 *     (cudaErrorStreamCaptureUnsupported), no graph exists (graph calls are
 *     cudaErrorInvalidValue for the handle), CUDA libraries cannot be loaded
 *     (cudaErrorNotSupported) and so hold nothing.
 * Host memory is the process's own memory (mmap), remembered so cudaFreeHost and
 * cudaHostUnregister answer as documented for unknown pointers.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cudart_internal.h"

#define TRY(expr) do { cudaError_t e_ = (expr); if (e_ != cudaSuccess) return rt_ret(e_); } while (0)
#define NEED(fn) do { if (!(fn)) return rt_ret(cudaErrorCallRequiresNewerDriver); } while (0)
#define DRIVER(call) return rt_ret(rt_map(call))

/* The compiler-facing entry points (crt/host_runtime.h and crt/device_functions.h of the
 * CUDA 13 toolkit; the runtime wheel does not ship crt/, triton's copy of the toolkit
 * headers does). The profiler switches are cuda_profiler_api.h's. */
RT_EXPORT void **__cudaRegisterFatBinary(void *fatCubin);
RT_EXPORT void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
RT_EXPORT void __cudaUnregisterFatBinary(void **fatCubinHandle);
RT_EXPORT void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                      const char *deviceName, int thread_limit, uint3 *tid,
                                      uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
RT_EXPORT void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                                 const char *deviceName, int ext, size_t size, int constant,
                                 int global);
RT_EXPORT unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                               struct CUstream_st *stream);
RT_EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim,
                                                 size_t *sharedMem, void *stream);
#if CUDART_VERSION >= 13000
RT_EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func);
RT_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                         void **args, size_t sharedMem, cudaStream_t stream);
RT_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                              void **args, size_t sharedMem, cudaStream_t stream);
#endif
RT_EXPORT cudaError_t cudaProfilerStart(void);
RT_EXPORT cudaError_t cudaProfilerStop(void);

/* ---- the registry: host functions, variables, host memory --------------------------- */

enum { REG_FUNC = 1, REG_VAR, REG_HOST_ALLOC, REG_HOST_REGISTERED };

struct reg {
    const void *key;     /* host function or variable address, host memory base */
    int kind;
    size_t size;         /* variable or host memory bytes */
    void *dev;           /* a variable's device memory, allocated on first use */
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct reg *regs;
static size_t nregs, capregs;

static struct reg *reg_find_locked(const void *key, int kind)
{
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].key == key && regs[i].kind == kind)
            return &regs[i];
    return NULL;
}

static int reg_add(const void *key, int kind, size_t size)
{
    pthread_mutex_lock(&reg_lock);
    int ok = 1;
    /* Functions and variables are registered once each, at load: no search (a framework
     * registers thousands); host ranges were checked by the caller. */
    {
        if (nregs == capregs) {
            size_t cap = capregs ? 2 * capregs : 1024;
            struct reg *n = realloc(regs, cap * sizeof *n);
            if (!n)
                ok = 0;
            else {
                regs = n;
                capregs = cap;
            }
        }
        if (ok)
            regs[nregs++] = (struct reg){key, kind, size, NULL};
    }
    pthread_mutex_unlock(&reg_lock);
    return ok;
}

static int reg_has(const void *key, int kind)
{
    pthread_mutex_lock(&reg_lock);
    int has = reg_find_locked(key, kind) != NULL;
    pthread_mutex_unlock(&reg_lock);
    return has;
}

/* Remove key of kind; its size in *size. 0 when it was not there. */
static int reg_del(const void *key, int kind, size_t *size)
{
    pthread_mutex_lock(&reg_lock);
    struct reg *r = reg_find_locked(key, kind);
    if (r) {
        if (size)
            *size = r->size;
        *r = regs[--nregs];
    }
    pthread_mutex_unlock(&reg_lock);
    return r != NULL;
}

/* Host memory [p, p+n) overlaps a registered or allocated range. */
static int host_overlaps(const char *p, size_t n)
{
    pthread_mutex_lock(&reg_lock);
    int hit = 0;
    for (size_t i = 0; i < nregs && !hit; i++) {
        if (regs[i].kind != REG_HOST_ALLOC && regs[i].kind != REG_HOST_REGISTERED)
            continue;
        const char *b = regs[i].key;
        hit = p < b + regs[i].size && b < p + n;
    }
    pthread_mutex_unlock(&reg_lock);
    return hit;
}

int rt_host_lookup(const void *ptr, void **base)
{
    pthread_mutex_lock(&reg_lock);
    int hit = 0;
    for (size_t i = 0; i < nregs && !hit; i++) {
        if (regs[i].kind != REG_HOST_ALLOC && regs[i].kind != REG_HOST_REGISTERED)
            continue;
        const char *b = regs[i].key;
        if ((const char *)ptr >= b && (const char *)ptr < b + regs[i].size) {
            *base = (void *)b;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&reg_lock);
    return hit;
}

/* ---- registration (D-nokernel) --------------------------------------------------------- */

/* The handle is the fat binary's own address, as an opaque non-NULL pointer the program only
 * hands back; the module it describes is never loaded. */
void **__cudaRegisterFatBinary(void *fatCubin)
{
    static void *anchor;
    return fatCubin ? (void **)fatCubin : &anchor;
}

void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }

void __cudaUnregisterFatBinary(void **fatCubinHandle) { (void)fatCubinHandle; }

void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)fatCubinHandle; (void)deviceFun; (void)deviceName; (void)thread_limit;
    (void)tid; (void)bid; (void)bDim; (void)gDim; (void)wSize;
    if (hostFun)
        (void)reg_add(hostFun, REG_FUNC, 0);
}

void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                       const char *deviceName, int ext, size_t size, int constant, int global)
{
    (void)fatCubinHandle; (void)deviceAddress; (void)deviceName; (void)ext; (void)constant;
    (void)global;
    if (hostVar)
        (void)reg_add(hostVar, REG_VAR, size);
}

/* The configuration of the next launch, per thread (the <<<...>>> of the calling thread). */
static __thread struct { dim3 grid, block; size_t shared; void *stream; int set; } call_cfg;

unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st *stream)
{
    call_cfg.grid = gridDim;
    call_cfg.block = blockDim;
    call_cfg.shared = sharedMem;
    call_cfg.stream = stream;
    call_cfg.set = 1;
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream)
{
    if (!call_cfg.set)
        return cudaErrorMissingConfiguration;
    if (gridDim)
        *gridDim = call_cfg.grid;
    if (blockDim)
        *blockDim = call_cfg.block;
    if (sharedMem)
        *sharedMem = call_cfg.shared;
    if (stream)
        memcpy(stream, &call_cfg.stream, sizeof call_cfg.stream);
    call_cfg.set = 0;
    return cudaSuccess;
}

/* ---- launches (D-nokernel) --------------------------------------------------------------- */

/* A launch configuration as the runtime checks it: at least one block of at least one
 * thread, at most 1024 threads a block (maxThreadsPerBlock), the block dimensions within
 * 1024 x 1024 x 64 and the grid's y and z within 65535 (cudaDeviceProp of compute
 * capability 9.0). */
static cudaError_t check_config(dim3 grid, dim3 block)
{
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
        return cudaErrorInvalidConfiguration;
    if (block.x > 1024 || block.y > 1024 || block.z > 64 ||
        (unsigned long long)block.x * block.y * block.z > 1024 ||
        grid.y > 65535 || grid.z > 65535)
        return cudaErrorInvalidConfiguration;
    return cudaSuccess;
}

static cudaError_t launch(const void *func, dim3 grid, dim3 block, cudaStream_t stream)
{
    if (!func || !reg_has(func, REG_FUNC))
        return rt_ret(cudaErrorInvalidDeviceFunction);
    TRY(check_config(grid, block));
    TRY(rt_bind());
    NEED(rt_legacy.streamSynchronize);
    /* The stream must be valid; the kernel runs nothing (D-nokernel). */
    CUresult r = rt_legacy.streamSynchronize(stream);
    return r == CUDA_SUCCESS ? cudaSuccess : rt_ret(rt_map(r));
}

RT_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                       size_t sharedMem, cudaStream_t stream)
{
    (void)args; (void)sharedMem;
    return launch(func, gridDim, blockDim, stream);
}

RT_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                                  void **args, size_t sharedMem,
                                                  cudaStream_t stream)
{
    (void)args; (void)sharedMem;
    return launch(func, gridDim, blockDim, stream);
}

RT_EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                          void **args)
{
    (void)args;
    if (!config)
        return rt_ret(cudaErrorInvalidValue);
    return launch(func, config->gridDim, config->blockDim, config->stream);
}

#if CUDART_VERSION >= 13000
/* A kernel handle is the registered host function's address. */
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func)
{
    if (!kernel)
        return rt_ret(cudaErrorInvalidValue);
    if (!func || !reg_has(func, REG_FUNC))
        return rt_ret(cudaErrorInvalidDeviceFunction);
    *kernel = (cudaKernel_t)(uintptr_t)func;
    return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream)
{
    (void)args; (void)sharedMem;
    return launch((const void *)kernel, gridDim, blockDim, stream);
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                    size_t sharedMem, cudaStream_t stream)
{
    (void)args; (void)sharedMem;
    return launch((const void *)kernel, gridDim, blockDim, stream);
}
#endif

/* ---- function attributes, occupancy ------------------------------------------------------ */

RT_EXPORT cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    if (!attr)
        return rt_ret(cudaErrorInvalidValue);
    if (!func || !reg_has(func, REG_FUNC))
        return rt_ret(cudaErrorInvalidDeviceFunction);
    memset(attr, 0, sizeof *attr);
    /* No code exists: no registers, no static memory; the device's limits (9.0). */
    attr->maxThreadsPerBlock = 1024;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = 48 * 1024;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (!func || !reg_has(func, REG_FUNC))
        return rt_ret(cudaErrorInvalidDeviceFunction);
    if ((int)attr < 0 || attr >= cudaFuncAttributeMax || value < 0)
        return rt_ret(cudaErrorInvalidValue);
    return cudaSuccess;
}

static cudaError_t occupancy(int *numBlocks, const void *func, int blockSize, unsigned flags)
{
    if (!numBlocks || blockSize <= 0 || blockSize > 1024 ||
        (flags & ~(unsigned)cudaOccupancyDisableCachingOverride))
        return rt_ret(cudaErrorInvalidValue);
    if (!func || !reg_has(func, REG_FUNC))
        return rt_ret(cudaErrorInvalidDeviceFunction);
    /* 2048 resident threads and 32 resident blocks per multiprocessor (9.0). */
    int n = 2048 / blockSize;
    *numBlocks = n > 32 ? 32 : n;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func,
                                                                    int blockSize,
                                                                    size_t dynamicSMemSize)
{
    (void)dynamicSMemSize;
    return occupancy(numBlocks, func, blockSize, 0);
}

RT_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *numBlocks, const void *func, int blockSize, size_t dynamicSMemSize, unsigned int flags)
{
    (void)dynamicSMemSize;
    return occupancy(numBlocks, func, blockSize, flags);
}

/* ---- symbols (registered variables, backed by device memory on first use) ----------- */

static cudaError_t symbol_address(const void *symbol, void **dev, size_t *size)
{
    TRY(rt_bind());
    pthread_mutex_lock(&reg_lock);
    struct reg *r = reg_find_locked(symbol, REG_VAR);
    cudaError_t e = cudaSuccess;
    if (!r)
        e = cudaErrorInvalidSymbol;
    else if (!r->dev) {
        CUdeviceptr p = 0;
        if (!rt_drv.memAlloc)
            e = cudaErrorCallRequiresNewerDriver;
        else
            e = rt_map(rt_drv.memAlloc(&p, r->size ? r->size : 1));
        if (e == cudaSuccess)
            r->dev = (void *)(uintptr_t)p;
    }
    if (e == cudaSuccess) {
        *dev = r->dev;
        *size = r->size;
    }
    pthread_mutex_unlock(&reg_lock);
    return e;
}

RT_EXPORT cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    size_t size;
    TRY(symbol_address(symbol, devPtr, &size));
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
                                         size_t offset, enum cudaMemcpyKind kind)
{
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice &&
        kind != cudaMemcpyDefault)
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    void *dev;
    size_t size;
    TRY(symbol_address(symbol, &dev, &size));
    if (offset > size || count > size - offset)
        return rt_ret(cudaErrorInvalidValue);
    return cudaMemcpy((char *)dev + offset, src, count, kind);
}

/* ---- streams -------------------------------------------------------------------------- */

static struct {
    PFN_cuStreamCreateWithPriority_v5050 createWithPriority;
    PFN_cuStreamGetPriority_v5050 getPriority;
    PFN_cuCtxGetStreamPriorityRange_v5050 priorityRange;
    PFN_cuStreamQuery_v2000 query[2];
    PFN_cuStreamWaitEvent_v3020 waitEvent[2];
    PFN_cuEventRecordWithFlags_v11010 recordWithFlags[2];
    PFN_cuEventElapsedTime_v2000 elapsed;
    PFN_cuMemcpyAsync_v4000 copyAsync[2];
    PFN_cuMemsetD8Async_v3020 memsetAsync[2];
    PFN_cuMemPoolSetAttribute_v11020 poolSet;
    PFN_cuMemPoolGetAttribute_v11020 poolGet;
    PFN_cuMemPoolTrimTo_v11020 poolTrim;
} fw;

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
    fetch(&fw.createWithPriority, "cuStreamCreateWithPriority", 5050, RT_FLAGS_LEGACY);
    fetch(&fw.getPriority, "cuStreamGetPriority", 5050, RT_FLAGS_LEGACY);
    fetch(&fw.priorityRange, "cuCtxGetStreamPriorityRange", 5050, RT_FLAGS_LEGACY);
    fetch(&fw.elapsed, "cuEventElapsedTime", 2000, RT_FLAGS_LEGACY);
    fetch(&fw.poolSet, "cuMemPoolSetAttribute", 11020, RT_FLAGS_LEGACY);
    fetch(&fw.poolGet, "cuMemPoolGetAttribute", 11020, RT_FLAGS_LEGACY);
    fetch(&fw.poolTrim, "cuMemPoolTrimTo", 11020, RT_FLAGS_LEGACY);
    const cuuint64_t fl[2] = {RT_FLAGS_LEGACY, RT_FLAGS_PER_THREAD};
    for (int i = 0; i < 2; i++) {
        fetch(&fw.query[i], "cuStreamQuery", i ? 7000 : 2000, fl[i]);
        fetch(&fw.waitEvent[i], "cuStreamWaitEvent", i ? 7000 : 3020, fl[i]);
        fetch(&fw.recordWithFlags[i], "cuEventRecordWithFlags", 11010, fl[i]);
        fetch(&fw.copyAsync[i], "cuMemcpyAsync", i ? 7000 : 4000, fl[i]);
        fetch(&fw.memsetAsync[i], "cuMemsetD8Async", i ? 7000 : 3020, fl[i]);
    }
}

static cudaError_t ready(void)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    pthread_once(&fetched, fetch_all);
    return rt_bind();
}

RT_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    NEED(rt_drv.streamCreate);
    /* cudaStreamNonBlocking equals CU_STREAM_NON_BLOCKING. */
    DRIVER(rt_drv.streamCreate(pStream, flags));
}

RT_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                   int priority)
{
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return rt_ret(cudaErrorInvalidValue);
    TRY(ready());
    NEED(fw.createWithPriority);
    /* "Priorities outside this range are clamped": the driver does. */
    DRIVER(fw.createWithPriority(pStream, flags, priority));
}

RT_EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
    if (!priority)
        return rt_ret(cudaErrorInvalidValue);
    TRY(ready());
    NEED(fw.getPriority);
    DRIVER(fw.getPriority(hStream, priority));
}

RT_EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    TRY(ready());
    NEED(fw.priorityRange);
    DRIVER(fw.priorityRange(leastPriority, greatestPriority));
}

RT_EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    TRY(ready());
    NEED(fw.query[0]);
    DRIVER(fw.query[0](stream));
}

RT_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    TRY(ready());
    NEED(fw.waitEvent[0]);
    DRIVER(fw.waitEvent[0](stream, event, flags));
}

RT_EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                               unsigned int flags)
{
    TRY(ready());
    NEED(fw.recordWithFlags[0]);
    /* cudaEventRecordExternal equals CU_EVENT_RECORD_EXTERNAL. */
    DRIVER(fw.recordWithFlags[0](event, stream, flags));
}

RT_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    TRY(ready());
    NEED(fw.elapsed);
    DRIVER(fw.elapsed(ms, start, end));
}

/* D-hostfn: the stream's earlier work is complete, so the function runs now. */
RT_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    if (!fn)
        return rt_ret(cudaErrorInvalidValue);
    TRY(ready());
    NEED(fw.query[0]);
    CUresult r = fw.query[0](stream);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    fn(userData);
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                            void *userData, unsigned int flags)
{
    /* "flags - Reserved for future use, must be 0". */
    if (!callback || flags != 0)
        return rt_ret(cudaErrorInvalidValue);
    TRY(ready());
    NEED(fw.query[0]);
    CUresult r = fw.query[0](stream);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    callback(stream, cudaSuccess, userData);
    return cudaSuccess;
}

/* ---- host memory ---------------------------------------------------------------------- */

RT_EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (!pHost)
        return rt_ret(cudaErrorInvalidValue);
    const unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (flags & ~known)
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    if (size == 0) {            /* as cudaMalloc: success, NULL */
        *pHost = NULL;
        return cudaSuccess;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return rt_ret(cudaErrorMemoryAllocation);
    if (!reg_add(p, REG_HOST_ALLOC, size)) {
        munmap(p, size);
        return rt_ret(cudaErrorMemoryAllocation);
    }
    *pHost = p;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

RT_EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    size_t size;
    if (!reg_del(ptr, REG_HOST_ALLOC, &size))
        return rt_ret(cudaErrorInvalidValue);
    munmap(ptr, size);
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    const unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped |
                           cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
    if (!ptr || size == 0 || (flags & ~known))
        return rt_ret(cudaErrorInvalidValue);
    TRY(rt_bind());
    if (host_overlaps(ptr, size))
        return rt_ret(cudaErrorHostMemoryAlreadyRegistered);
    if (!reg_add(ptr, REG_HOST_REGISTERED, size))
        return rt_ret(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
    if (!reg_del(ptr, REG_HOST_REGISTERED, NULL))
        return rt_ret(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

/* ---- async copies and memsets (complete when enqueued, as the fake driver's) ------------ */

static cudaError_t copy_async(int pt, void *dst, const void *src, size_t count,
                              enum cudaMemcpyKind kind, cudaStream_t stream)
{
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    TRY(ready());
    NEED(fw.copyAsync[pt]);
    if (kind == cudaMemcpyHostToHost) {
        NEED(fw.query[pt]);
        CUresult r = fw.query[pt](stream);
        if (r != CUDA_SUCCESS)
            return rt_ret(rt_map(r));
        memmove(dst, src, count);
        return cudaSuccess;
    }
    /* Unified addressing: the driver infers each side from the pointer, as with
     * cudaMemcpyDefault. */
    DRIVER(fw.copyAsync[pt]((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count,
                            stream));
}

RT_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy_async(0, dst, src, count, kind, stream);
}

RT_EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                           enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy_async(1, dst, src, count, kind, stream);
}

RT_EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind kind,
                                        cudaStream_t stream)
{
    /* "cudaErrorInvalidPitchValue: ... pitch greater than the maximum" and a width wider
     * than either pitch. */
    if (width > dpitch || width > spitch)
        return rt_ret(cudaErrorInvalidPitchValue);
    for (size_t row = 0; row < height; row++)
        TRY(copy_async(0, (char *)dst + row * dpitch, (const char *)src + row * spitch, width,
                       kind, stream));
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    TRY(ready());
    if (count == 0)
        return cudaSuccess;
    NEED(fw.memsetAsync[0]);
    DRIVER(fw.memsetAsync[0]((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count, stream));
}

/* ---- stream capture, graphs, user objects, libraries (D-nograph) ----------------------- */

static __thread enum cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

RT_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (!mode || (int)*mode < cudaStreamCaptureModeGlobal || *mode > cudaStreamCaptureModeRelaxed)
        return rt_ret(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus *pCaptureStatus)
{
    if (!pCaptureStatus)
        return rt_ret(cudaErrorInvalidValue);
    TRY(ready());
    NEED(fw.query[0]);
    CUresult r = fw.query[0](stream);
    if (r != CUDA_SUCCESS)
        return rt_ret(rt_map(r));
    *pCaptureStatus = cudaStreamCaptureStatusNone;    /* nothing is ever captured */
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    (void)stream; (void)mode;
    return rt_ret(cudaErrorStreamCaptureUnsupported);
}

RT_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                    const cudaGraphNode_t *dependencies,
                                                    const cudaGraphEdgeData *dependencyData,
                                                    size_t numDependencies,
                                                    enum cudaStreamCaptureMode mode)
{
    (void)stream; (void)graph; (void)dependencies; (void)dependencyData; (void)numDependencies;
    (void)mode;
    return rt_ret(cudaErrorStreamCaptureUnsupported);
}

/* No capture began, so none can end: "cudaErrorIllegalState" for a stream not capturing. */
RT_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    (void)stream;
    if (!pGraph)
        return rt_ret(cudaErrorInvalidValue);
    return rt_ret(cudaErrorIllegalState);
}

/* No graph exists: every graph handle is invalid. */
RT_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) { (void)graph; return rt_ret(cudaErrorInvalidValue); }
RT_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) { (void)graphExec; return rt_ret(cudaErrorInvalidValue); }
RT_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    (void)graphExec; (void)stream;
    return rt_ret(cudaErrorInvalidValue);
}
RT_EXPORT cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes)
{
    (void)graph; (void)nodes; (void)numNodes;
    return rt_ret(cudaErrorInvalidValue);
}
RT_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                           unsigned long long flags)
{
    (void)pGraphExec; (void)graph; (void)flags;
    return rt_ret(cudaErrorInvalidValue);
}
RT_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                    unsigned long long flags)
{
    (void)pGraphExec; (void)graph; (void)flags;
    return rt_ret(cudaErrorInvalidValue);
}
RT_EXPORT cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle *pHandle_out,
                                                       cudaGraph_t graph,
                                                       unsigned int defaultLaunchValue,
                                                       unsigned int flags)
{
    (void)pHandle_out; (void)graph; (void)defaultLaunchValue; (void)flags;
    return rt_ret(cudaErrorInvalidValue);
}
RT_EXPORT cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                                unsigned int count, unsigned int flags)
{
    (void)graph; (void)object; (void)count; (void)flags;
    return rt_ret(cudaErrorInvalidValue);
}

/* User objects are real: a reference count and a destructor run when it reaches 0. */
struct user_object {
    unsigned magic;
    unsigned refs;
    void *ptr;
    cudaHostFn_t destroy;
};
#define USER_OBJECT_MAGIC 0x05e70b1eu

RT_EXPORT cudaError_t cudaUserObjectCreate(cudaUserObject_t *object_out, void *ptr,
                                           cudaHostFn_t destroy, unsigned int initialRefcount,
                                           unsigned int flags)
{
    /* "flags - Currently it is required to pass cudaUserObjectNoDestructorSync". */
    if (!object_out || !destroy || initialRefcount == 0 ||
        flags != cudaUserObjectNoDestructorSync)
        return rt_ret(cudaErrorInvalidValue);
    struct user_object *o = malloc(sizeof *o);
    if (!o)
        return rt_ret(cudaErrorMemoryAllocation);
    *o = (struct user_object){USER_OBJECT_MAGIC, initialRefcount, ptr, destroy};
    *object_out = (cudaUserObject_t)o;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count)
{
    struct user_object *o = (struct user_object *)object;
    if (!o || count == 0 || o->magic != USER_OBJECT_MAGIC)
        return rt_ret(cudaErrorInvalidValue);
    unsigned left = __atomic_sub_fetch(&o->refs, count, __ATOMIC_ACQ_REL);
    if (left == 0) {
        o->magic = 0;
        o->destroy(o->ptr);
        free(o);
    }
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
                                          enum cudaJitOption *jitOptions, void **jitOptionsValues,
                                          unsigned int numJitOptions,
                                          enum cudaLibraryOption *libraryOptions,
                                          void **libraryOptionValues, unsigned int numLibraryOptions)
{
    (void)code; (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    if (!library)
        return rt_ret(cudaErrorInvalidValue);
    return rt_ret(cudaErrorNotSupported);
}

RT_EXPORT cudaError_t cudaLibraryLoadFromFile(cudaLibrary_t *library, const char *fileName,
                                              enum cudaJitOption *jitOptions,
                                              void **jitOptionsValues, unsigned int numJitOptions,
                                              enum cudaLibraryOption *libraryOptions,
                                              void **libraryOptionValues,
                                              unsigned int numLibraryOptions)
{
    (void)fileName; (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    if (!library)
        return rt_ret(cudaErrorInvalidValue);
    return rt_ret(cudaErrorNotSupported);
}

/* No library was loaded, so every library handle is invalid. */
RT_EXPORT cudaError_t cudaLibraryUnload(cudaLibrary_t library) { (void)library; return rt_ret(cudaErrorInvalidResourceHandle); }
RT_EXPORT cudaError_t cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library, const char *name)
{
    (void)pKernel; (void)library; (void)name;
    return rt_ret(cudaErrorInvalidResourceHandle);
}
RT_EXPORT cudaError_t cudaLibraryGetKernelCount(unsigned int *count, cudaLibrary_t lib)
{
    (void)count; (void)lib;
    return rt_ret(cudaErrorInvalidResourceHandle);
}
RT_EXPORT cudaError_t cudaLibraryGetGlobal(void **dptr, size_t *bytes, cudaLibrary_t library, const char *name)
{
    (void)dptr; (void)bytes; (void)library; (void)name;
    return rt_ret(cudaErrorInvalidResourceHandle);
}
RT_EXPORT cudaError_t cudaLibraryGetManaged(void **dptr, size_t *bytes, cudaLibrary_t library, const char *name)
{
    (void)dptr; (void)bytes; (void)library; (void)name;
    return rt_ret(cudaErrorInvalidResourceHandle);
}
RT_EXPORT cudaError_t cudaLibraryGetUnifiedFunction(void **fptr, cudaLibrary_t library, const char *symbol)
{
    (void)fptr; (void)library; (void)symbol;
    return rt_ret(cudaErrorInvalidResourceHandle);
}

/* ---- pool attributes (the driver's answer) ----------------------------------------------- */

RT_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    TRY(ready());
    NEED(fw.poolSet);
    /* cudaMemPoolAttr values equal CUmemPool_attribute ones. */
    DRIVER(fw.poolSet((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

RT_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    TRY(ready());
    NEED(fw.poolGet);
    DRIVER(fw.poolGet((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

RT_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    TRY(ready());
    NEED(fw.poolTrim);
    DRIVER(fw.poolTrim((CUmemoryPool)memPool, minBytesToKeep));
}

/* ---- profiler ----------------------------------------------------------------------------- */

/* No profiler is attached; enabling and disabling it is accepted, as without one. */
cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

/* cudart_driver.c: how the fake libcudart.so.12 reaches the driver, and its lazy init.
 *
 * Why it exists: rankguard interposes the driver on the paths the real runtime uses, so
 * this fake must use exactly those paths (docs/design.md §3): dlopen("libcuda.so.1"),
 * ONE dlsym(h, "cuGetProcAddress_v2"), then every driver function through that pointer
 * with an explicit ABI version and flags 1 (legacy stream) or 2 (per-thread stream, for
 * the entry points behind the `_ptds`/`_ptsz` exports). The library is never linked
 * against -lcuda. Init is lazy and thread-safe: nothing runs in a constructor.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_internal.h"

struct rt_driver rt_drv;
struct rt_stream_fns rt_legacy;
struct rt_stream_fns rt_per_thread;
PFN_cuGetProcAddress_v12000 rt_get_proc_address;

/* One row per entry point: where it goes, its base name, the ABI version asked for. */
struct rt_entry {
    size_t offset;
    const char *name;
    int version;
};

#define DRV(field, name, ver) { offsetof(struct rt_driver, field), name, ver }
static const struct rt_entry driver_entries[] = {
    DRV(init,                "cuInit",                     2000),
    DRV(driverGetVersion,    "cuDriverGetVersion",         2020),
    DRV(deviceGetCount,      "cuDeviceGetCount",           2000),
    DRV(deviceGet,           "cuDeviceGet",                2000),
    DRV(deviceGetAttribute,  "cuDeviceGetAttribute",       2000),
    DRV(deviceGetName,       "cuDeviceGetName",            2000),
    DRV(deviceGetUuid,       "cuDeviceGetUuid",            11040),
    DRV(deviceTotalMem,      "cuDeviceTotalMem",           3020),
    DRV(deviceGetPCIBusId,   "cuDeviceGetPCIBusId",        4010),
    DRV(deviceCanAccessPeer, "cuDeviceCanAccessPeer",      4000),
    DRV(primaryCtxRetain,    "cuDevicePrimaryCtxRetain",   7000),
    DRV(primaryCtxRelease,   "cuDevicePrimaryCtxRelease",  11000),
    DRV(primaryCtxReset,     "cuDevicePrimaryCtxReset",    11000),
    DRV(primaryCtxSetFlags,  "cuDevicePrimaryCtxSetFlags", 11000),
    DRV(ctxGetCurrent,       "cuCtxGetCurrent",            4000),
    DRV(ctxSetCurrent,       "cuCtxSetCurrent",            4000),
    DRV(ctxSynchronize,      "cuCtxSynchronize",           2000),
    DRV(ctxEnablePeerAccess, "cuCtxEnablePeerAccess",      4000),
    DRV(ctxDisablePeerAccess,"cuCtxDisablePeerAccess",     4000),
    DRV(memAlloc,            "cuMemAlloc",                 3020),
    DRV(memFree,             "cuMemFree",                  3020),
    DRV(memAllocManaged,     "cuMemAllocManaged",          6000),
    DRV(memGetInfo,          "cuMemGetInfo",               3020),
    DRV(pointerGetAttribute, "cuPointerGetAttribute",      4000),
    DRV(ipcGetMemHandle,     "cuIpcGetMemHandle",          4010),
    DRV(ipcOpenMemHandle,    "cuIpcOpenMemHandle",         11000),
    DRV(ipcCloseMemHandle,   "cuIpcCloseMemHandle",        4010),
    DRV(ipcGetEventHandle,   "cuIpcGetEventHandle",        4010),
    DRV(ipcOpenEventHandle,  "cuIpcOpenEventHandle",       4010),
    DRV(eventCreate,         "cuEventCreate",              2000),
    DRV(eventSynchronize,    "cuEventSynchronize",         2000),
    DRV(eventQuery,          "cuEventQuery",               2000),
    DRV(eventDestroy,        "cuEventDestroy",             4000),
    DRV(streamCreate,        "cuStreamCreate",             2000),
    DRV(streamDestroy,       "cuStreamDestroy",            4000),
};
#undef DRV

/* Stream-ordered entry points: {legacy version, per-thread version}. The per-thread
 * variants (`_ptds`/`_ptsz`) appeared in CUDA 7.0 (cudaTypedefs.h: PFN_*_v7000_ptds),
 * cuMemPrefetchAsync's with the function itself in 8.0 (PFN_cuMemPrefetchAsync_v8000_ptsz);
 * the location-based cuMemPrefetchAsync (`_v2`) is 12.2 (PFN_cuMemPrefetchAsync_v12020). */
struct rt_stream_entry {
    size_t offset;
    const char *name;
    int legacy_version;
    int per_thread_version;
};
#define STR(field, name, lv, pv) { offsetof(struct rt_stream_fns, field), name, lv, pv }
static const struct rt_stream_entry stream_entries[] = {
    STR(memcpy,            "cuMemcpy",            4000, 7000),
    STR(memcpyHtoD,        "cuMemcpyHtoD",        3020, 7000),
    STR(memcpyDtoH,        "cuMemcpyDtoH",        3020, 7000),
    STR(memcpyDtoD,        "cuMemcpyDtoD",        3020, 7000),
    STR(memsetD8,          "cuMemsetD8",          3020, 7000),
    STR(memcpyPeer,        "cuMemcpyPeer",        4000, 7000),
    STR(memcpyPeerAsync,   "cuMemcpyPeerAsync",   4000, 7000),
    STR(eventRecord,       "cuEventRecord",       2000, 7000),
    STR(streamSynchronize, "cuStreamSynchronize", 2000, 7000),
    STR(memPrefetchAsync,  "cuMemPrefetchAsync",  8000, 8000),
    STR(memPrefetchAsyncV2, "cuMemPrefetchAsync", 12020, 12020),
};
#undef STR

/* A symbol the driver does not have stays NULL; the API call that needs it then fails
 * with cudaErrorCallRequiresNewerDriver instead of crashing. */
static void resolve(void *table, size_t offset, const char *name, int version,
                    cuuint64_t flags)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = rt_get_proc_address(name, &fn, version, flags, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS)
        fn = NULL;
    memcpy((char *)table + offset, &fn, sizeof fn);
}

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static cudaError_t load_error = cudaErrorInitializationError;

static void do_load(void)
{
    /* The real runtime loads the driver by soname, so LD_LIBRARY_PATH picks the fake. A
     * missing driver (or one older than 12.0, without cuGetProcAddress_v2) is reported the
     * way the real runtime reports it: cudaErrorInsufficientDriver. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        load_error = cudaErrorInsufficientDriver;
        return;
    }
    void *gpa = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
        load_error = cudaErrorInsufficientDriver;
        return;
    }
    memcpy(&rt_get_proc_address, &gpa, sizeof gpa);

    for (size_t i = 0; i < sizeof driver_entries / sizeof driver_entries[0]; i++)
        resolve(&rt_drv, driver_entries[i].offset, driver_entries[i].name,
                driver_entries[i].version, RT_FLAGS_LEGACY);
    for (size_t i = 0; i < sizeof stream_entries / sizeof stream_entries[0]; i++) {
        const struct rt_stream_entry *e = &stream_entries[i];
        resolve(&rt_legacy, e->offset, e->name, e->legacy_version, RT_FLAGS_LEGACY);
        resolve(&rt_per_thread, e->offset, e->name, e->per_thread_version,
                RT_FLAGS_PER_THREAD);
    }

    /* Without these the runtime cannot come up at all. */
    if (!rt_drv.init || !rt_drv.driverGetVersion || !rt_drv.deviceGetCount ||
        !rt_drv.deviceGet || !rt_drv.primaryCtxRetain || !rt_drv.ctxGetCurrent ||
        !rt_drv.ctxSetCurrent) {
        load_error = cudaErrorInsufficientDriver;
        return;
    }
    load_error = cudaSuccess;
}

cudaError_t rt_load(void)
{
    pthread_once(&load_once, do_load);
    return load_error;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static cudaError_t init_error = cudaErrorInitializationError;
static int device_count;

/* Per-device state: the primary context the runtime retained (NULL until first use). */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext *primary_ctx;

static void do_init(void)
{
    cudaError_t e = rt_load();
    if (e != cudaSuccess) {
        init_error = e;
        return;
    }
    CUresult r = rt_drv.init(0);
    if (r != CUDA_SUCCESS) {
        init_error = rt_map(r);
        return;
    }
    /* cudart N.x runs on any N.x or newer driver (minor-version compatibility), not on an
     * older major: the 13 runtime on a 12.9 driver is cudaErrorInsufficientDriver. */
    int version = 0;
    r = rt_drv.driverGetVersion(&version);
    if (r != CUDA_SUCCESS) {
        init_error = rt_map(r);
        return;
    }
    if (version < FAKECUDART_MAJOR * 1000) {
        init_error = cudaErrorInsufficientDriver;
        return;
    }
    int count = 0;
    r = rt_drv.deviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
        init_error = rt_map(r);
        return;
    }
    if (count <= 0) {
        init_error = cudaErrorNoDevice;
        return;
    }
    primary_ctx = calloc((size_t)count, sizeof *primary_ctx);
    if (!primary_ctx) {
        init_error = cudaErrorMemoryAllocation;
        return;
    }
    device_count = count;
    init_error = cudaSuccess;
}

cudaError_t rt_init(void)
{
    pthread_once(&init_once, do_init);
    return init_error;
}

int rt_device_count(void)
{
    return device_count;
}

cudaError_t rt_check_device(int dev)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    return (dev >= 0 && dev < device_count) ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t rt_cu_device(int dev, CUdevice *out)
{
    cudaError_t e = rt_check_device(dev);
    if (e != cudaSuccess)
        return e;
    return rt_map(rt_drv.deviceGet(out, dev));
}

cudaError_t rt_primary_ctx(int dev, CUcontext *out)
{
    CUdevice cu;
    cudaError_t e = rt_cu_device(dev, &cu);
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&ctx_lock);
    if (!primary_ctx[dev]) {
        CUcontext ctx = NULL;
        CUresult r = rt_drv.primaryCtxRetain(&ctx, cu);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&ctx_lock);
            return rt_map(r);
        }
        primary_ctx[dev] = ctx;
    }
    *out = primary_ctx[dev];
    pthread_mutex_unlock(&ctx_lock);
    return cudaSuccess;
}

cudaError_t rt_bind(void)
{
    CUcontext want, have = NULL;
    cudaError_t e = rt_primary_ctx(rt_current_device(), &want);
    if (e != cudaSuccess)
        return e;
    CUresult r = rt_drv.ctxGetCurrent(&have);
    if (r != CUDA_SUCCESS)
        return rt_map(r);
    if (have != want) {
        r = rt_drv.ctxSetCurrent(want);
        if (r != CUDA_SUCCESS)
            return rt_map(r);
    }
    return cudaSuccess;
}

cudaError_t rt_reset_device(int dev)
{
    CUdevice cu;
    cudaError_t e = rt_cu_device(dev, &cu);
    if (e != cudaSuccess)
        return e;
    if (!rt_drv.primaryCtxRelease || !rt_drv.primaryCtxReset)
        return cudaErrorCallRequiresNewerDriver;
    /* Decision (the runtime docs say only "destroys all allocations and resets all state;
     * any subsequent API call to this device will reinitialize the device"): drop the
     * runtime's own retain, then reset the primary context; the next call that needs the
     * device retains it again. */
    pthread_mutex_lock(&ctx_lock);
    CUresult r = CUDA_SUCCESS;
    CUcontext old = primary_ctx[dev];
    if (old) {
        r = rt_drv.primaryCtxRelease(cu);
        primary_ctx[dev] = NULL;
    }
    if (r == CUDA_SUCCESS)
        r = rt_drv.primaryCtxReset(cu);
    pthread_mutex_unlock(&ctx_lock);
    if (r != CUDA_SUCCESS)
        return rt_map(r);
    /* The reset context must not stay current on this thread under a stale handle. */
    CUcontext have = NULL;
    if (old && rt_drv.ctxGetCurrent(&have) == CUDA_SUCCESS && have == old)
        (void)rt_drv.ctxSetCurrent(NULL);
    return cudaSuccess;
}

static __thread int current_device;
static __thread cudaError_t last_error = cudaSuccess;

int rt_current_device(void)
{
    return current_device;
}

void rt_set_current_device(int dev)
{
    current_device = dev;
}

cudaError_t rt_ret(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

cudaError_t rt_last_error(int reset)
{
    cudaError_t e = last_error;
    if (reset)
        last_error = cudaSuccess;
    return e;
}

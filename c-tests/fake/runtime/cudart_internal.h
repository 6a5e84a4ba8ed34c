/* cudart_internal.h: shared state of the fake libcudart.so.12 and .so.13.
 *
 * Why it exists: the fake runtime is split into the driver layer (cudart_driver.c: loading
 * libcuda.so.1 the way the real runtime does, lazy init, primary contexts), the public API
 * (cudart_api.c) and the error tables (cudart_errors.c). This header is their contract; it
 * is not installed and nothing outside c-tests/fake/runtime/ includes it.
 */
#ifndef FAKECUDART_INTERNAL_H
#define FAKECUDART_INTERNAL_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

/* The major this copy of the fake runtime is (its soname libcudart.so.<major> and version
 * node), and what cudaRuntimeGetVersion reports. From the headers it is compiled against,
 * unless the build says otherwise (the stand-in libcudart.so.14, built from 13.x headers). */
#ifndef FAKECUDART_MAJOR
#define FAKECUDART_MAJOR (CUDART_VERSION / 1000)
#endif
#ifndef FAKECUDART_RUNTIME_VERSION
#define FAKECUDART_RUNTIME_VERSION CUDART_VERSION
#endif

/* Everything not in the version script (libcudart.map) is local anyway; hidden visibility
 * additionally keeps internal calls from going through the PLT. */
#define RT_HIDDEN __attribute__((visibility("hidden")))
#define RT_EXPORT __attribute__((visibility("default")))

/* The cuGetProcAddress_v2 flags the runtime uses (cuda.h, CUdriverProcAddress_flags). */
#define RT_FLAGS_LEGACY     CU_GET_PROC_ADDRESS_LEGACY_STREAM              /* 1 */
#define RT_FLAGS_PER_THREAD CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM  /* 2 */

/* Driver entry points the runtime uses, each fetched once with the version of the ABI the
 * runtime was written against (the PFN_<name>_v<version> typedef names it). */
struct rt_driver {
    PFN_cuInit_v2000                    init;
    PFN_cuDriverGetVersion_v2020        driverGetVersion;
    PFN_cuDeviceGetCount_v2000          deviceGetCount;
    PFN_cuDeviceGet_v2000               deviceGet;
    PFN_cuDeviceGetAttribute_v2000      deviceGetAttribute;
    PFN_cuDeviceGetName_v2000           deviceGetName;
    PFN_cuDeviceGetUuid_v11040          deviceGetUuid;
    PFN_cuDeviceTotalMem_v3020          deviceTotalMem;
    PFN_cuDeviceGetPCIBusId_v4010       deviceGetPCIBusId;
    PFN_cuDeviceCanAccessPeer_v4000     deviceCanAccessPeer;
    PFN_cuDevicePrimaryCtxRetain_v7000  primaryCtxRetain;
    PFN_cuDevicePrimaryCtxRelease_v11000 primaryCtxRelease;
    PFN_cuDevicePrimaryCtxReset_v11000  primaryCtxReset;
    PFN_cuDevicePrimaryCtxSetFlags_v11000 primaryCtxSetFlags;
    PFN_cuCtxGetCurrent_v4000           ctxGetCurrent;
    PFN_cuCtxSetCurrent_v4000           ctxSetCurrent;
    PFN_cuCtxSynchronize_v2000          ctxSynchronize;
    PFN_cuCtxEnablePeerAccess_v4000     ctxEnablePeerAccess;
    PFN_cuCtxDisablePeerAccess_v4000    ctxDisablePeerAccess;
    PFN_cuMemAlloc_v3020                memAlloc;
    PFN_cuMemFree_v3020                 memFree;
    PFN_cuMemAllocManaged_v6000         memAllocManaged;
    PFN_cuMemGetInfo_v3020              memGetInfo;
    PFN_cuPointerGetAttribute_v4000     pointerGetAttribute;
    PFN_cuIpcGetMemHandle_v4010         ipcGetMemHandle;
    PFN_cuIpcOpenMemHandle_v11000       ipcOpenMemHandle;
    PFN_cuIpcCloseMemHandle_v4010       ipcCloseMemHandle;
    PFN_cuIpcGetEventHandle_v4010       ipcGetEventHandle;
    PFN_cuIpcOpenEventHandle_v4010      ipcOpenEventHandle;
    PFN_cuEventCreate_v2000             eventCreate;
    PFN_cuEventSynchronize_v2000        eventSynchronize;
    PFN_cuEventQuery_v2000              eventQuery;
    PFN_cuEventDestroy_v4000            eventDestroy;
    PFN_cuStreamCreate_v2000            streamCreate;
    PFN_cuStreamDestroy_v4000           streamDestroy;
};

/* Entry points whose behaviour depends on the default-stream mode. They are fetched twice:
 * once with flags 1 (legacy stream) for the plain exports, once with flags 2 (per-thread
 * stream) for the `_ptds`/`_ptsz` exports; the per-thread variants share the signatures. */
struct rt_stream_fns {
    PFN_cuMemcpy_v4000                  memcpy;
    PFN_cuMemcpyHtoD_v3020              memcpyHtoD;
    PFN_cuMemcpyDtoH_v3020              memcpyDtoH;
    PFN_cuMemcpyDtoD_v3020              memcpyDtoD;
    PFN_cuMemsetD8_v3020                memsetD8;
    PFN_cuMemcpyPeer_v4000              memcpyPeer;
    PFN_cuMemcpyPeerAsync_v4000         memcpyPeerAsync;
    PFN_cuEventRecord_v2000             eventRecord;
    PFN_cuStreamSynchronize_v2000       streamSynchronize;
    PFN_cuMemPrefetchAsync_v8000        memPrefetchAsync;
    PFN_cuMemPrefetchAsync_v12020       memPrefetchAsyncV2;
};

RT_HIDDEN extern struct rt_driver rt_drv;
RT_HIDDEN extern struct rt_stream_fns rt_legacy;      /* flags 1 */
RT_HIDDEN extern struct rt_stream_fns rt_per_thread;  /* flags 2 */

/* The cuGetProcAddress_v2 pointer obtained with the runtime's one dlsym(); the runtime's
 * own lookups and cudaGetDriverEntryPoint(ByVersion) all go through it. */
RT_HIDDEN extern PFN_cuGetProcAddress_v12000 rt_get_proc_address;

/* Phase 1: dlopen("libcuda.so.1"), one dlsym, all entry points. No cuInit. */
RT_HIDDEN cudaError_t rt_load(void);
/* Phase 2 (implies phase 1): cuInit(0), driver version check, device count. */
RT_HIDDEN cudaError_t rt_init(void);
/* Number of devices; valid after rt_init() returned cudaSuccess. */
RT_HIDDEN int rt_device_count(void);
/* cudaSuccess if `dev` is a valid runtime ordinal (rt_init done), else cudaErrorInvalidDevice. */
RT_HIDDEN cudaError_t rt_check_device(int dev);
/* The driver's CUdevice for a runtime ordinal (1:1 with driver ordinals). */
RT_HIDDEN cudaError_t rt_cu_device(int dev, CUdevice *out);
/* The primary context of `dev`, retained by the runtime on first use. */
RT_HIDDEN cudaError_t rt_primary_ctx(int dev, CUcontext *out);
/* Make the calling thread's current device's primary context current (lazy init). */
RT_HIDDEN cudaError_t rt_bind(void);
/* Drop the runtime's retain of dev's primary context and reset it (cudaDeviceReset). */
RT_HIDDEN cudaError_t rt_reset_device(int dev);

/* The calling thread's current device (cudaSetDevice/cudaGetDevice). Default 0. */
RT_HIDDEN int rt_current_device(void);
RT_HIDDEN void rt_set_current_device(int dev);

/* Record `e` as the thread's last error when it is not cudaSuccess; returns `e`. */
RT_HIDDEN cudaError_t rt_ret(cudaError_t e);
RT_HIDDEN cudaError_t rt_last_error(int reset);

/* Host memory of cudaHostAlloc/cudaMallocHost/cudaHostRegister containing `ptr`
 * (cudart_frameworks.c): 1 and its base in *base, else 0. */
RT_HIDDEN int rt_host_lookup(const void *ptr, void **base);

/* CUresult -> cudaError_t (see cudart_errors.c for the rule). */
RT_HIDDEN cudaError_t rt_map(CUresult r);

/* The argument log (cudart_arglog.c): RT_LOG("cudaX", "a=%d b=%p", a, b) appends
 * `libcudart.so.<major> cudaX a=.. b=..` to $FAKECUDA_ARGLOG; nothing when unset. */
RT_HIDDEN int rt_arglog_on(void);
RT_HIDDEN void rt_arglog(const char *symbol, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define RT_LOG(symbol, ...) do { if (rt_arglog_on()) rt_arglog(symbol, __VA_ARGS__); } while (0)
/* An opaque handle (cudaStream_t, cudaGraph_t, ...) for %p; the build fails if the type is
 * not a pointer (GCC's pointer_type_class is 5). */
#define RT_LOG_HANDLE(h) \
    ((void)sizeof(char[__builtin_classify_type(h) == 5 ? 1 : -1]), (const void *)(h))
/* A byte array (an IPC handle's `reserved`) in hex: RT_LOG_HEX(symbol, bytes, fmt, ...)
 * names the hex string `hex_` for the arguments; it is built only when the log is on. */
#define RT_LOG_HEX(symbol, bytes, ...) do { if (rt_arglog_on()) { \
        char hex_[2 * sizeof(bytes) + 1]; \
        rt_hex(hex_, (bytes), sizeof(bytes)); \
        rt_arglog(symbol, __VA_ARGS__); } } while (0)
RT_HIDDEN void rt_hex(char *out, const void *bytes, size_t n);
/* A C string argument, "(null)" for NULL. */
#define RT_STR(s) ((s) ? (s) : "(null)")
/* A cudaMemLocation by value, every field. */
#define RT_LOC_FMT "{type=%d,id=%d}"
#define RT_LOC_ARGS(l) (int)(l).type, (l).id

/* The generated stubs (gen_sigdiff.py) of functions whose signature differs between
 * majors: exported, weak, so a hand-written definition replaces one. */
#define RT_STUB __attribute__((weak, visibility("default")))

#endif

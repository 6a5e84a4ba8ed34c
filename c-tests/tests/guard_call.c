/* guard_call: make one guarded CUDA call through one of the paths a real program reaches
 * CUDA by, and print what it returned. Driven by python-tests/test_guard_paths.py, which
 * runs it with and without librankguard.so preloaded and checks codes and audit records.
 *
 *   guard_call PATH CALL ORDINAL [VERSION]
 *
 * PATH   link    the exported symbol, referenced at link time (-lcuda / -lcudart)
 *        dlsym   dlopen("libcuda.so.1" / "libcudart.so.12" or .13) + dlsym(ABI name)
 *        gpa1    cuGetProcAddress (4 args, CUDA 11.3), linked
 *        gpa2    cuGetProcAddress_v2 (5 args, CUDA 12.0), linked
 *        gpa2pt  cuGetProcAddress_v2 with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 *        linkpt, dlsympt  link / dlsym of the per-thread ABI symbol (`_ptds`/`_ptsz`), as a
 *                program built with --default-stream per-thread references it (the legacy
 *                one where the function has no per-thread variant at VERSION)
 *        static  like a statically linked runtime: dlopen libcuda.so.1, one dlsym of
 *                cuGetProcAddress_v2, everything else through it
 *        ep      cudaGetDriverEntryPoint (the runtime's version picks the variant)
 *        epv     cudaGetDriverEntryPointByVersion at VERSION
 * CALL   a guarded driver API name or CUDA 12 runtime ABI symbol: every one in
 *        c-tests/include/guarded.h (generated with the guard's table) whose policy is not
 *        hand-written (cuInit, the entry points and IPC have their own programs)
 * VERSION picks the ABI variant for the driver paths (default: newest, 12090), e.g.
 *        cuCtxCreate: 2000 bare, 3020 _v2, 11040 _v3, 12050 _v4.
 *
 * Output: "setup ok" then "rc=<code>" for the call under test. Exit 0 when the program
 * ran (whatever rc was), 2 on a setup failure (printed), 3 on bad arguments.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guarded.h"

/* Link-time references to exact ABI symbols (asm labels bypass cuda.h's macros): every
 * guarded driver variant and CUDA 12 runtime symbol (c-tests/include/guarded.h, generated
 * with the guard's table by scripts/gen_guarded.py), and the helpers the set-up uses. */
#define ABI(n) extern void abi_##n(void) __asm__(#n);
/* `#abi` and `abi_##abi` here, not through ABI(): an argument passed on is macro-expanded
 * first, and cuda.h remaps names (`#define cuCtxCreate cuCtxCreate_v2`). */
#define ABI_OF(api, abi, v, pt) extern void abi_##abi(void) __asm__(#abi);
#define HELPERS(X) X(cuMemRelease) X(cuMemGetAllocationGranularity) X(cuMemAllocManaged) \
    X(cuMemAddressReserve) X(cuMemMap) X(cuCtxSetCurrent) X(cuMemAlloc_v2) X(cudaMalloc) \
    X(cudaMallocManaged) X(cudaGetDeviceCount)
/* Built twice: against the 12.9 headers and libcudart.so.12 (tests/guard_call), and
 * against the 13.x headers and libcudart.so.13 (tests13/guard_call13.c includes this file):
 * the runtime calls are that major's, with its parameters. */
#if CUDART_VERSION >= 13000
#define RT_MAJOR 13
#define GUARDED_RUNTIME_VARIANTS GUARDED_RUNTIME13_VARIANTS
#else
#define RT_MAJOR 12
#define GUARDED_RUNTIME_VARIANTS GUARDED_RUNTIME12_VARIANTS
#endif
#define STR_(x) #x
#define STR(x) STR_(x)
GUARDED_DRIVER_VARIANTS(ABI_OF)
/* Weak: a guarded runtime function the fake runtime does not implement links as NULL
 * (the path tests call the ones it implements; test_guard_coverage.py the rest). */
#define ABI_OF_WEAK(api, abi, v, pt) extern void abi_##abi(void) __asm__(#abi) __attribute__((weak));
GUARDED_RUNTIME_VARIANTS(ABI_OF_WEAK)
HELPERS(ABI)
#define COVERAGE_ABIS(X) X(cuInit) X(cuDeviceGet) X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) \
    X(cuCtxCreate_v4) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) \
    X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxReset_v2) \
    X(cuDevicePrimaryCtxSetFlags) X(cuDevicePrimaryCtxSetFlags_v2) X(cuDevicePrimaryCtxGetState) \
    X(cuMemCreate) X(cuMemRelease) X(cuMemGetAllocationGranularity) X(cuMemPrefetchAsync) \
    X(cuMemPrefetchAsync_ptsz) X(cuMemPrefetchAsync_v2) X(cuMemAdvise) X(cuMemAdvise_v2) \
    X(cuMemAllocManaged) X(cuMemPoolCreate) X(cuMemSetAccess) X(cuMemAddressReserve) X(cuMemMap) \
    X(cuMemcpyPeer) X(cuMemcpyPeer_ptds) X(cuMemcpyPeerAsync) X(cuMemcpyPeerAsync_ptsz) \
    X(cuCtxEnablePeerAccess) X(cuCtxSetCurrent) X(cuMemAlloc_v2) X(cuGetProcAddress) \
    X(cuGetProcAddress_v2) X(cuDeviceGetAttribute) \
    X(cudaSetDevice) X(cudaInitDevice) X(cudaDeviceEnablePeerAccess) X(cudaMemcpyPeer) \
    X(cudaMemcpyPeerAsync) X(cudaMalloc) X(cudaGetDriverEntryPoint) \
    X(cudaGetDriverEntryPointByVersion) \
    X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuDeviceSetMemPool) X(cuMemPoolSetAccess) \
    X(cuMemcpy3DPeer) X(cuMemcpy3DPeer_ptds) X(cuMemcpy3DPeerAsync) X(cuMemcpy3DPeerAsync_ptsz) \
    X(cuMulticastCreate) X(cuMulticastAddDevice) X(cuDeviceGetDevResource) \
    X(cuDevResourceGenerateDesc) X(cuGreenCtxCreate) X(cuLaunchCooperativeKernelMultiDevice) \
    X(cuDeviceGetP2PAttribute) X(cuDeviceComputeCapability) X(cuDeviceGetLuid) \
    X(cudaDeviceGetDefaultMemPool) X(cudaDeviceGetMemPool) X(cudaDeviceSetMemPool) \
    X(cudaMemPoolSetAccess) X(cudaMemcpy3DPeer) X(cudaMemcpy3DPeerAsync) X(cudaSetValidDevices) \
    X(cudaLaunchCooperativeKernelMultiDevice) X(cudaDeviceGetP2PAttribute) \
    X(cuGraphAddMemAllocNode) X(cudaGraphAddMemAllocNode) \
    X(cuMemGetDefaultMemPool) X(cuMemPrefetchBatchAsync) X(cuMemPrefetchBatchAsync_ptsz) \
    X(cuCheckpointProcessRestore) X(cuGraphAddNode) X(cuGraphAddNode_v2) X(cuMemcpyBatchAsync) \
    X(cuMemcpyBatchAsync_ptsz) X(cuDeviceGetByPCIBusId) X(cuDeviceGetPCIBusId) \
    X(cuDeviceGraphMemTrim) X(cuDeviceSetGraphMemAttribute) X(cuKernelSetAttribute) \
    X(cuDeviceGetTexture1DLinearMaxWidth) X(cuDeviceGetExecAffinitySupport) \
    X(cuMulticastUnbind) X(cuMulticastBindMem_v2) X(cuLogicalEndpointAddDevice) X(cuMemSetMemPool) \
    X(cuMemGetMemPool) X(cuMemDiscardAndPrefetchBatchAsync) X(cuMemDiscardAndPrefetchBatchAsync_ptsz) \
    X(cuGraphNodeSetParams)
#if RT_MAJOR == 12
COVERAGE_ABIS(ABI)
#define COVERAGE_ROWS COVERAGE_ABIS(ROW)
#else
#define COVERAGE_ROWS
#endif

/* CUDA 13 entry points (this program is compiled against the 12.9 headers): their
 * signatures from the 13.x cudaTypedefs.h. */
typedef CUresult (*PFN_cuMemGetDefaultMemPool_v13000)(CUmemoryPool *pool_out, CUmemLocation *location,
                                                      CUmemAllocationType type);
typedef CUresult (*PFN_cuMemSetMemPool_v13000)(CUmemLocation *location, CUmemAllocationType type,
                                               CUmemoryPool pool);
typedef CUresult (*PFN_cuMulticastBindMem_v13010)(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                                  size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                                                  size_t memOffset, size_t size, unsigned long long flags);
typedef CUresult (*PFN_cuLogicalEndpointAddDevice_v13030)(unsigned int leId, CUdevice dev);
typedef CUresult (*PFN_cuMemPrefetchBatchAsync_v13000)(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                       CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                                       size_t numPrefetchLocs, unsigned long long flags,
                                                       CUstream hStream);
#define ROW(n) {#n, (void *)abi_##n},
#define ROW_OF(api, abi, v, pt) {#abi, (void *)abi_##abi},
static const struct { const char *name; void *fn; } linked[] = {
    GUARDED_DRIVER_VARIANTS(ROW_OF) GUARDED_RUNTIME_VARIANTS(ROW_OF) HELPERS(ROW) COVERAGE_ROWS
};

/* Every guarded driver variant with the version of its cudaTypedefs.h PFN. */
#define VARIANT_OF(api, abi, v, pt) {#api, #abi, v, pt},
static const struct { const char *api, *abi; int since; const char *pt; } variants[] = {
    GUARDED_DRIVER_VARIANTS(VARIANT_OF)
};

enum path { LINK, DLSYM, GPA1, GPA2, GPA2PT, STATIC, EP, EPV, LINKPT, DLSYMPT };
static enum path path;
static int version = 12090;
static void *hdrv, *hrt;
static PFN_cuGetProcAddress_v12000 static_gpa;

static void *linked_fn(const char *abi) {
    for (size_t i = 0; i < sizeof linked / sizeof linked[0]; i++)
        if (!strcmp(linked[i].name, abi)) return linked[i].fn;
    fprintf(stderr, "guard_call: %s is not in the linked table\n", abi);
    exit(3);
}

/* Resolve a driver function: `abi` is the ABI name the version implies (used by the link
 * and dlsym paths), `base` the API name (entry-point paths), `ver` the version to ask. */
static void *drv(const char *abi, const char *base, int ver) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    enum cudaDriverEntryPointQueryResult rst = cudaDriverEntryPointSuccess;
    CUresult rc = CUDA_SUCCESS;
    switch (path) {
    case LINK: case LINKPT: return linked_fn(abi);
    case DLSYM: case DLSYMPT: return dlsym(hdrv, abi);
    case GPA1:
        rc = ((PFN_cuGetProcAddress_v11030)linked_fn("cuGetProcAddress"))(base, &p, ver, 0);
        break;
    case GPA2:
    case GPA2PT:
        rc = ((PFN_cuGetProcAddress_v12000)linked_fn("cuGetProcAddress_v2"))(
            base, &p, ver, path == GPA2PT ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);
        break;
    case STATIC: rc = static_gpa(base, &p, ver, 0, &st); break;
    case EP:
        rc = (CUresult)((cudaError_t(*)(const char *, void **, unsigned long long,
                                          enum cudaDriverEntryPointQueryResult *))
                            linked_fn("cudaGetDriverEntryPoint"))(base, &p, cudaEnableDefault, &rst);
        break;
    case EPV:
        rc = (CUresult)((cudaError_t(*)(const char *, void **, unsigned int, unsigned long long,
                                          enum cudaDriverEntryPointQueryResult *))
                            linked_fn("cudaGetDriverEntryPointByVersion"))(base, &p, ver,
                                                                         cudaEnableDefault, &rst);
        break;
    }
    if (rc != CUDA_SUCCESS || !p) {
        printf("resolve %s@%d: rc=%d status=%d/%d p=%p\n", base, ver, rc, st, rst, p);
        return NULL;
    }
    return p;
}

static void *rt(const char *abi) {
    if (path == LINK) return linked_fn(abi);
    if (path == DLSYM) return dlsym(hrt, abi);
    fprintf(stderr, "guard_call: runtime calls support the link and dlsym paths only\n");
    exit(3);
}

#define DRV(T, abi, base, ver) ((T)need(drv(abi, base, ver), base))
static void *need(void *p, const char *what) {
    if (!p) { printf("setup failed: cannot resolve %s\n", what); exit(2); }
    return p;
}
#define CHECK_SETUP(expr) do { CUresult r_ = (expr); if (r_) { \
    printf("setup failed: %s = %d\n", #expr, r_); exit(2); } } while (0)

/* The guarded functions of issue 15 that need their own set-up or arguments (issue 18's
 * last path tests): their own block, tried first by each dispatch below. */
#include "set_up_calls.h"

/* The ABI variant a driver API resolves to at `ver`: the newest variant at or before it,
 * per-thread when the path asks for the per-thread default stream and one exists. */
static const char *variant(const char *base, int ver) {
    static char buf[128];
    const char *best = NULL;
    for (int pt = (path == GPA2PT || path == LINKPT || path == DLSYMPT); pt >= 0 && !best; pt--) {
        int since = -1;
        for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
            if (!strcmp(variants[i].api, base) && (variants[i].pt[0] != 0) == pt &&
                variants[i].since <= ver && variants[i].since > since) {
                best = variants[i].abi;
                since = variants[i].since;
            }
    }
    if (best) return best;
    snprintf(buf, sizeof buf, "%s", base);
    return buf;
}

/* `abi` is `name` or its per-thread form (`cuMemPrefetchAsync_v2_ptsz` is `_v2`). */
static int is(const char *abi, const char *name) {
    size_t n = strlen(name);
    return !strncmp(abi, name, n) && (!abi[n] || !strcmp(abi + n, "_ptsz") || !strcmp(abi + n, "_ptds"));
}

/* Batch and attribute copies, memory advice, the runtime's generic graph node (issue 15's
 * items 6 and 7): their own block, made before the dispatch below. */
#include "copies_calls.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: guard_call PATH CALL ORDINAL [VERSION]\n");
        return 3;
    }
    const char *paths[] = {"link", "dlsym", "gpa1", "gpa2", "gpa2pt", "static", "ep", "epv",
                           "linkpt", "dlsympt"};
    int found = 0;
    for (int i = 0; i < (int)(sizeof paths / sizeof paths[0]); i++)
        if (!strcmp(argv[1], paths[i])) { path = (enum path)i; found = 1; }
    if (!found) { fprintf(stderr, "guard_call: unknown path %s\n", argv[1]); return 3; }
    const char *call = argv[2];
    int ord = atoi(argv[3]);
    if (argc > 4) version = atoi(argv[4]);

    hdrv = dlopen("libcuda.so.1", RTLD_NOW);
    hrt = dlopen("libcudart.so." STR(RT_MAJOR), RTLD_NOW);
    if (!hdrv) { printf("setup failed: dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    if (path == STATIC)
        static_gpa = (PFN_cuGetProcAddress_v12000)need(dlsym(hdrv, "cuGetProcAddress_v2"),
                                                       "cuGetProcAddress_v2");

    if (copies_call(call, ord))
        return 0;

    /* Runtime calls: everything through the runtime. */
    if (!strncmp(call, "cuda", 4)) {
        int rc = -1;
        if (runtime_set_up_call(call, ord, &rc))
            return 0;
        if (!strcmp(call, "cudaSetDevice"))
            rc = ((cudaError_t(*)(int))rt("cudaSetDevice"))(ord);
        else if (!strcmp(call, "cudaInitDevice"))
            rc = ((cudaError_t(*)(int, unsigned, unsigned))rt("cudaInitDevice"))(ord, 0, 0);
        else if (!strcmp(call, "cudaDeviceEnablePeerAccess"))
            rc = ((cudaError_t(*)(int, unsigned))rt("cudaDeviceEnablePeerAccess"))(ord, 0);
        else if (!strcmp(call, "cudaMemcpyPeer") || !strcmp(call, "cudaMemcpyPeerAsync")) {
            void *a = NULL, *b = NULL;
            if (((cudaError_t(*)(void **, size_t))rt("cudaMalloc"))(&a, 64) ||
                ((cudaError_t(*)(void **, size_t))rt("cudaMalloc"))(&b, 64)) {
                printf("setup failed: cudaMalloc\n");
                return 2;
            }
            printf("setup ok\n");
            if (!strcmp(call, "cudaMemcpyPeer"))
                rc = ((cudaError_t(*)(void *, int, const void *, int, size_t))rt("cudaMemcpyPeer"))(
                    b, ord, a, 0, 64);
            else
                rc = ((cudaError_t(*)(void *, int, const void *, int, size_t, void *))rt(
                    "cudaMemcpyPeerAsync"))(b, ord, a, 0, 64, NULL);
            printf("rc=%d\n", rc);
            return 0;
        } else if (!strcmp(call, "cudaDeviceGetDefaultMemPool") || !strcmp(call, "cudaDeviceGetMemPool")) {
            cudaMemPool_t pool;
            rc = ((cudaError_t(*)(cudaMemPool_t *, int))rt(call))(&pool, ord);
        } else if (!strcmp(call, "cudaDeviceSetMemPool") || !strcmp(call, "cudaMemPoolSetAccess")) {
            /* Device 0's default pool: set as device ORD's pool (the runtime refuses a pool
             * of another device itself), or made accessible from device ORD. */
            cudaMemPool_t pool;
            if (((cudaError_t(*)(cudaMemPool_t *, int))rt("cudaDeviceGetDefaultMemPool"))(&pool, 0)) {
                printf("setup failed: cudaDeviceGetDefaultMemPool\n");
                return 2;
            }
            printf("setup ok\n");
            if (!strcmp(call, "cudaDeviceSetMemPool")) {
                rc = ((cudaError_t(*)(int, cudaMemPool_t))rt(call))(ord, pool);
            } else {
                struct cudaMemAccessDesc d = {.location = {.type = cudaMemLocationTypeDevice, .id = ord},
                                              .flags = cudaMemAccessFlagsProtReadWrite};
                rc = ((cudaError_t(*)(cudaMemPool_t, const struct cudaMemAccessDesc *, size_t))rt(call))(pool, &d, 1);
            }
            printf("rc=%d\n", rc);
            return 0;
        } else if (is(call, "cudaMemcpy3DPeer") || is(call, "cudaMemcpy3DPeerAsync")) {
            void *a = NULL, *b = NULL;
            if (((cudaError_t(*)(void **, size_t))rt("cudaMalloc"))(&a, 256) ||
                ((cudaError_t(*)(void **, size_t))rt("cudaMalloc"))(&b, 256)) {
                printf("setup failed: cudaMalloc\n");
                return 2;
            }
            printf("setup ok\n");
            struct cudaMemcpy3DPeerParms p;
            memset(&p, 0, sizeof p);
            p.srcPtr = (struct cudaPitchedPtr){a, 64, 64, 4};
            p.dstPtr = (struct cudaPitchedPtr){b, 64, 64, 4};
            p.srcDevice = 0;
            p.dstDevice = ord;
            p.extent = (struct cudaExtent){64, 4, 1};
            if (is(call, "cudaMemcpy3DPeer"))
                rc = ((cudaError_t(*)(const struct cudaMemcpy3DPeerParms *))rt(call))(&p);
            else
                rc = ((cudaError_t(*)(const struct cudaMemcpy3DPeerParms *, cudaStream_t))rt(call))(&p, NULL);
            printf("rc=%d\n", rc);
            return 0;
        } else if (!strcmp(call, "cudaSetValidDevices")) {
            int list[2] = {0, ord};
            rc = ((cudaError_t(*)(int *, int))rt(call))(list, 2);
#if RT_MAJOR == 12 /* CUDA 13 removed it and struct cudaLaunchParams */
        } else if (!strcmp(call, "cudaLaunchCooperativeKernelMultiDevice")) {
            /* ORDINAL+1 devices; no kernel exists on the fake (invalid handle, after the
             * argument checks). */
            struct cudaLaunchParams lp[2];
            memset(lp, 0, sizeof lp);
            rc = ((cudaError_t(*)(struct cudaLaunchParams *, unsigned, unsigned))rt(call))(lp, (unsigned)ord + 1, 0);
#endif
        } else if (!strcmp(call, "cudaGraphAddMemAllocNode")) {
            struct cudaMemAllocNodeParams np;
            memset(&np, 0, sizeof np);
            np.poolProps.allocType = cudaMemAllocationTypePinned;
            np.poolProps.location.type = cudaMemLocationTypeDevice;
            np.poolProps.location.id = ord;
            np.bytesize = 4096;
            cudaGraphNode_t node;
            rc = ((cudaError_t(*)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, size_t,
                                   struct cudaMemAllocNodeParams *))rt(call))(&node, NULL, NULL, 0, &np);
        } else if (!strcmp(call, "cudaDeviceGetP2PAttribute")) {
            int v = -1;
            rc = ((cudaError_t(*)(int *, enum cudaDeviceP2PAttr, int, int))rt(call))(
                &v, cudaDevP2PAttrAccessSupported, 0, ord);
        } else if (is(call, "cudaMemPrefetchAsync")) {
            void *p = NULL;
            if (((cudaError_t(*)(void **, size_t, unsigned))rt("cudaMallocManaged"))(
                    &p, 4096, cudaMemAttachGlobal)) {
                printf("setup failed: cudaMallocManaged\n");
                return 2;
            }
            printf("setup ok\n");
#if RT_MAJOR >= 13
            struct cudaMemLocation loc = {.type = cudaMemLocationTypeDevice, .id = ord};
            rc = ((cudaError_t(*)(const void *, size_t, struct cudaMemLocation, unsigned,
                                  cudaStream_t))rt(call))(p, 4096, loc, 0, NULL);
#else
            rc = ((cudaError_t(*)(const void *, size_t, int, cudaStream_t))rt(call))(p, 4096, ord,
                                                                                    NULL);
#endif
            printf("rc=%d\n", rc);
            return 0;
        } else if (!strcmp(call, "cudaDeviceGetAttribute")) {
            int v;
            rc = ((cudaError_t(*)(int *, enum cudaDeviceAttr, int))rt(call))(
                &v, cudaDevAttrMultiProcessorCount, ord);
        } else if (!strcmp(call, "cudaDeviceGetPCIBusId")) {
            char buf[64];
            rc = ((cudaError_t(*)(char *, int, int))rt(call))(buf, (int)sizeof buf, ord);
        } else if (!strcmp(call, "cudaGetDeviceProperties_v2") ||
                   !strcmp(call, "cudaGetDeviceProperties")) {
            struct cudaDeviceProp prop;
            rc = ((cudaError_t(*)(struct cudaDeviceProp *, int))rt(call))(&prop, ord);
        } else if (!strcmp(call, "cudaDeviceCanAccessPeer")) {
            int can;
            rc = ((cudaError_t(*)(int *, int, int))rt(call))(&can, ord, 0);
        } else {
            fprintf(stderr, "guard_call: unknown runtime call %s\n", call);
            return 3;
        }
        printf("setup ok\nrc=%d\n", rc);
        return 0;
    }

    /* Driver calls: initialise through the same path, with a context on device 0. */
    CHECK_SETUP(DRV(PFN_cuInit_v2000, "cuInit", "cuInit", 2000)(0));
    CUdevice d0;
    CHECK_SETUP(DRV(PFN_cuDeviceGet_v2000, "cuDeviceGet", "cuDeviceGet", 2000)(&d0, 0));
    CUcontext ctx0;
    CHECK_SETUP(DRV(PFN_cuDevicePrimaryCtxRetain_v7000, "cuDevicePrimaryCtxRetain",
                    "cuDevicePrimaryCtxRetain", 7000)(&ctx0, d0));
    CHECK_SETUP(((PFN_cuCtxSetCurrent_v4000)linked_fn("cuCtxSetCurrent"))(ctx0));
    CUdevice dev = (CUdevice)ord; /* a CUdevice made without cuDeviceGet, like cuda.bindings */
    const char *abi = variant(call, version);
    int rc = -1;

    if (driver_set_up_call(call, abi, dev, ord, &rc)) {
    } else if (!strcmp(call, "cuDeviceGet")) {
        CUdevice d;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGet_v2000, abi, call, version)(&d, ord);
    } else if (!strcmp(call, "cuCtxCreate")) {
        CUcontext c = NULL;
        void *f = drv(abi, call, version);
        if (!f) { printf("setup failed: resolve\n"); return 2; }
        printf("setup ok (%s)\n", abi);
        if (is(abi, "cuCtxCreate_v4")) {
            CUctxCreateParams params;
            memset(&params, 0, sizeof params);
            rc = ((PFN_cuCtxCreate_v12050)f)(&c, &params, 0, dev);
        } else if (is(abi, "cuCtxCreate_v3"))
            rc = ((PFN_cuCtxCreate_v11040)f)(&c, NULL, 0, 0, dev);
        else
            rc = ((PFN_cuCtxCreate_v3020)f)(&c, 0, dev);
    } else if (!strcmp(call, "cuDevicePrimaryCtxRetain")) {
        CUcontext c;
        printf("setup ok\n");
        rc = DRV(PFN_cuDevicePrimaryCtxRetain_v7000, abi, call, version)(&c, dev);
    } else if (!strcmp(call, "cuDevicePrimaryCtxRelease") ||
               !strcmp(call, "cuDevicePrimaryCtxReset")) {
        /* Release needs a retained context. Its result is ignored: where the guard refuses
         * the retain (enforce, ordinal 1) it refuses the release too, before the driver. */
        CUcontext c;
        (void)((PFN_cuDevicePrimaryCtxRetain_v7000)linked_fn("cuDevicePrimaryCtxRetain"))(&c, dev);
        printf("setup ok (%s)\n", abi);
        rc = DRV(PFN_cuDevicePrimaryCtxRelease_v11000, abi, call, version)(dev);
    } else if (!strcmp(call, "cuDevicePrimaryCtxSetFlags")) {
        printf("setup ok (%s)\n", abi);
        rc = DRV(PFN_cuDevicePrimaryCtxSetFlags_v11000, abi, call, version)(dev, 0);
    } else if (!strcmp(call, "cuDevicePrimaryCtxGetState")) {
        unsigned f; int a;
        printf("setup ok\n");
        rc = DRV(PFN_cuDevicePrimaryCtxGetState_v7000, abi, call, version)(dev, &f, &a);
    } else if (!strcmp(call, "cuMemCreate") || !strcmp(call, "cuMemPoolCreate")) {
        printf("setup ok\n");
        if (!strcmp(call, "cuMemCreate")) {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = ord;
            CUmemGenericAllocationHandle h;
            rc = DRV(PFN_cuMemCreate_v10020, abi, call, 10020)(&h, 2 << 20, &prop, 0);
        } else {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = ord;
            CUmemoryPool pool;
            rc = DRV(PFN_cuMemPoolCreate_v11020, abi, call, 11020)(&pool, &props);
        }
    } else if (!strcmp(call, "cuMemSetAccess")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        size_t gran = 0;
        CHECK_SETUP(((PFN_cuMemGetAllocationGranularity_v10020)linked_fn(
            "cuMemGetAllocationGranularity"))(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUmemGenericAllocationHandle h;
        CHECK_SETUP(((PFN_cuMemCreate_v10020)linked_fn("cuMemCreate"))(&h, gran, &prop, 0));
        CUdeviceptr va;
        CHECK_SETUP(((PFN_cuMemAddressReserve_v10020)linked_fn("cuMemAddressReserve"))(
            &va, gran, 0, 0, 0));
        CHECK_SETUP(((PFN_cuMemMap_v10020)linked_fn("cuMemMap"))(va, gran, 0, h, 0));
        CUmemAccessDesc desc[2];
        memset(desc, 0, sizeof desc);
        desc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[0].location.id = 0;
        desc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        desc[1] = desc[0];
        desc[1].location.id = ord;
        printf("setup ok\n");
        rc = DRV(PFN_cuMemSetAccess_v10020, abi, call, 10020)(va, gran, desc, ord ? 2 : 1);
    } else if (!strcmp(call, "cuMemPrefetchAsync") || !strcmp(call, "cuMemAdvise")) {
        CUdeviceptr p;
        CHECK_SETUP(((PFN_cuMemAllocManaged_v6000)linked_fn("cuMemAllocManaged"))(
            &p, 4096, CU_MEM_ATTACH_GLOBAL));
        printf("setup ok (%s)\n", abi);
        void *f = need(drv(abi, call, version), call);
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ord};
        if (is(abi, "cuMemPrefetchAsync_v2"))
            rc = ((PFN_cuMemPrefetchAsync_v12020)f)(p, 4096, loc, 0, NULL);
        else if (is(abi, "cuMemAdvise_v2"))
            rc = ((PFN_cuMemAdvise_v12020)f)(p, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc);
        else if (!strcmp(call, "cuMemAdvise"))
            rc = ((PFN_cuMemAdvise_v8000)f)(p, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev);
        else
            rc = ((PFN_cuMemPrefetchAsync_v8000)f)(p, 4096, dev, NULL);
    } else if (!strcmp(call, "cuMemcpyPeer") || !strcmp(call, "cuMemcpyPeerAsync") ||
               !strcmp(call, "cuCtxEnablePeerAccess")) {
        /* The peer context of device `ord`, taken through the linked export: in warn mode
         * with several GPUs visible this works; in enforce mode the guard refuses it. */
        CUcontext peer;
        CHECK_SETUP(((PFN_cuDevicePrimaryCtxRetain_v7000)linked_fn("cuDevicePrimaryCtxRetain"))(
            &peer, dev));
        CUdeviceptr a, b;
        CHECK_SETUP(((PFN_cuMemAlloc_v3020)linked_fn("cuMemAlloc_v2"))(&a, 64));
        CHECK_SETUP(((PFN_cuMemAlloc_v3020)linked_fn("cuMemAlloc_v2"))(&b, 64));
        printf("setup ok (%s)\n", abi);
        void *f = need(drv(abi, call, version), call);
        if (!strcmp(call, "cuCtxEnablePeerAccess"))
            rc = ((PFN_cuCtxEnablePeerAccess_v4000)f)(peer, 0);
        else if (!strcmp(call, "cuMemcpyPeer"))
            rc = ((PFN_cuMemcpyPeer_v4000)f)(b, peer, a, ctx0, 64);
        else
            rc = ((PFN_cuMemcpyPeerAsync_v4000)f)(b, peer, a, ctx0, 64, NULL);
    } else if (!strcmp(call, "cuDeviceGetDefaultMemPool") || !strcmp(call, "cuDeviceGetMemPool")) {
        CUmemoryPool pool;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetMemPool_v11020, abi, call, version)(&pool, dev);
    } else if (!strcmp(call, "cuDeviceSetMemPool") || !strcmp(call, "cuMemPoolSetAccess")) {
        /* Device 0's default pool, set as device ORD's pool (the driver refuses a pool of
         * another device itself) or made accessible from device ORD. */
        CUmemoryPool pool;
        CHECK_SETUP(((PFN_cuDeviceGetDefaultMemPool_v11020)linked_fn("cuDeviceGetDefaultMemPool"))(&pool, 0));
        printf("setup ok\n");
        if (!strcmp(call, "cuDeviceSetMemPool")) {
            rc = DRV(PFN_cuDeviceSetMemPool_v11020, abi, call, version)(dev, pool);
        } else {
            CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ord},
                                 .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            rc = DRV(PFN_cuMemPoolSetAccess_v11020, abi, call, version)(pool, &d, 1);
        }
    } else if (!strcmp(call, "cuMulticastAddDevice")) {
        CUmulticastObjectProp prop = {1, 2u << 20, 0, 0};
        CUmemGenericAllocationHandle mc;
        CHECK_SETUP(((PFN_cuMulticastCreate_v12010)linked_fn("cuMulticastCreate"))(&mc, &prop));
        printf("setup ok\n");
        rc = DRV(PFN_cuMulticastAddDevice_v12010, abi, call, version)(mc, dev);
    } else if (!strcmp(call, "cuGreenCtxCreate")) {
        /* Device 0's SMs, for a green context on device ORD (the driver refuses resources
         * of another device itself). */
        CUdevResource res;
        CUdevResourceDesc desc;
        CHECK_SETUP(((PFN_cuDeviceGetDevResource_v12040)linked_fn("cuDeviceGetDevResource"))(0, &res, CU_DEV_RESOURCE_TYPE_SM));
        CHECK_SETUP(((PFN_cuDevResourceGenerateDesc_v12040)linked_fn("cuDevResourceGenerateDesc"))(&desc, &res, 1));
        printf("setup ok\n");
        CUgreenCtx g;
        rc = DRV(PFN_cuGreenCtxCreate_v12040, abi, call, version)(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    } else if (!strcmp(call, "cuDeviceGetDevResource")) {
        CUdevResource res;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetDevResource_v12040, abi, call, version)(dev, &res, CU_DEV_RESOURCE_TYPE_SM);
    } else if (!strcmp(call, "cuLaunchCooperativeKernelMultiDevice")) {
        /* ORDINAL+1 devices; no kernel exists on the fake (invalid handle). */
        CUDA_LAUNCH_PARAMS lp[2];
        memset(lp, 0, sizeof lp);
        printf("setup ok\n");
        rc = DRV(PFN_cuLaunchCooperativeKernelMultiDevice_v9000, abi, call, version)(lp, (unsigned)ord + 1, 0);
    } else if (!strcmp(call, "cuGraphAddMemAllocNode")) {
        /* A node allocating on device ORD, accessible from device 0 (the fake has no
         * graphs: the driver alone answers NOT_SUPPORTED). */
        CUDA_MEM_ALLOC_NODE_PARAMS np;
        memset(&np, 0, sizeof np);
        np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        np.poolProps.location.id = ord;
        CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                             .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        np.accessDescs = &d;
        np.accessDescCount = 1;
        np.bytesize = 4096;
        CUgraphNode node;
        printf("setup ok\n");
        rc = DRV(PFN_cuGraphAddMemAllocNode_v11040, abi, call, version)(&node, NULL, NULL, 0, &np);
    } else if (!strcmp(call, "cuMemGetDefaultMemPool")) {
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ord};
        CUmemoryPool pool;
        printf("setup ok\n");
        rc = DRV(PFN_cuMemGetDefaultMemPool_v13000, abi, call, version)(&pool, &loc, CU_MEM_ALLOCATION_TYPE_PINNED);
    } else if (!strcmp(call, "cuMemGetMemPool") || !strcmp(call, "cuMemSetMemPool")) {
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ord};
        CUmemoryPool pool = NULL;
        printf("setup ok\n");
        if (!strcmp(call, "cuMemGetMemPool"))
            rc = DRV(PFN_cuMemGetDefaultMemPool_v13000, abi, call, version)(&pool, &loc, CU_MEM_ALLOCATION_TYPE_PINNED);
        else
            rc = DRV(PFN_cuMemSetMemPool_v13000, abi, call, version)(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, pool);
    } else if (!strcmp(call, "cuMulticastUnbind") || !strcmp(call, "cuMulticastBindMem") ||
               !strcmp(call, "cuLogicalEndpointAddDevice")) {
        /* A one-device team of device 0 (the 13.1 bind and 13.3 endpoints are stubs on the
         * fake: the driver alone answers NOT_SUPPORTED). */
        CUmulticastObjectProp prop = {1, 2u << 20, 0, 0};
        CUmemGenericAllocationHandle mc;
        CHECK_SETUP(((PFN_cuMulticastCreate_v12010)linked_fn("cuMulticastCreate"))(&mc, &prop));
        CHECK_SETUP(((PFN_cuMulticastAddDevice_v12010)linked_fn("cuMulticastAddDevice"))(mc, 0));
        printf("setup ok (%s)\n", abi);
        if (!strcmp(call, "cuMulticastUnbind"))
            rc = DRV(PFN_cuMulticastUnbind_v12010, abi, call, version)(mc, dev, 0, 2u << 20);
        else if (!strcmp(call, "cuLogicalEndpointAddDevice"))
            rc = DRV(PFN_cuLogicalEndpointAddDevice_v13030, abi, call, version)(1, dev);
        else
            rc = DRV(PFN_cuMulticastBindMem_v13010, abi, call, version)(mc, dev, 0, 0, 0, 2u << 20, 0);
    } else if (!strcmp(call, "cuGraphNodeSetParams")) {
        CUgraphNodeParams np;
        memset(&np, 0, sizeof np);
        np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        np.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        np.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        np.alloc.poolProps.location.id = ord;
        np.alloc.bytesize = 4096;
        printf("setup ok\n");
        rc = DRV(PFN_cuGraphNodeSetParams_v12020, abi, call, version)(NULL, &np);
    } else if (!strcmp(call, "cuMemPrefetchBatchAsync") || !strcmp(call, "cuMemDiscardAndPrefetchBatchAsync")) {
        /* Two managed ranges: the first to device 0, the second to device ORD. */
        CUdeviceptr p[2];
        CHECK_SETUP(((PFN_cuMemAllocManaged_v6000)linked_fn("cuMemAllocManaged"))(&p[0], 4096, CU_MEM_ATTACH_GLOBAL));
        CHECK_SETUP(((PFN_cuMemAllocManaged_v6000)linked_fn("cuMemAllocManaged"))(&p[1], 4096, CU_MEM_ATTACH_GLOBAL));
        size_t sizes[2] = {4096, 4096}, idx[2] = {0, 1};
        CUmemLocation locs[2] = {{.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                                 {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ord}};
        printf("setup ok (%s)\n", abi);
        rc = DRV(PFN_cuMemPrefetchBatchAsync_v13000, abi, call, version)(p, sizes, 2, locs, idx, 2, 0, NULL);
    } else if (!strcmp(call, "cuCheckpointProcessRestore")) {
        /* CUDA 13.5's restore arguments (13.x cuda.h): GPU 0 restored onto GPU ORD (the same
         * GPU for ORDINAL 0). The fake has no checkpointing: the driver answers
         * NOT_SUPPORTED. */
        struct { CUuuid old_uuid, new_uuid; } pair;
        struct { void *pairs; unsigned count, pad; void *storage; char reserved[40]; } args;
        memset(&pair, 0, sizeof pair);
        memset(&args, 0, sizeof args);
        pair.old_uuid.bytes[0] = 0x10;
        pair.new_uuid.bytes[0] = (char)(0x10 + ord);
        args.pairs = &pair;
        args.count = 1;
        printf("setup ok\n");
        rc = DRV(PFN_cuCheckpointProcessRestore_v12080, abi, call, version)((int)getpid(), (CUcheckpointRestoreArgs *)(void *)&args);
    } else if (!strcmp(call, "cuGraphAddNode")) {
        /* A generic memory-allocation node on device ORD (the fake has no graphs: the
         * driver alone answers NOT_SUPPORTED). */
        CUgraphNodeParams np;
        memset(&np, 0, sizeof np);
        np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        np.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        np.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        np.alloc.poolProps.location.id = ord;
        np.alloc.bytesize = 4096;
        CUgraphNode node;
        void *f = need(drv(abi, call, version), call);
        printf("setup ok (%s)\n", abi);
        /* _v2 (12.3) and _v3 (13.4) take the edge data; cudaTypedefs.h gives _v3 the
         * parameters of _v2 (checked below where the header has _v3). */
#if CUDA_VERSION >= 13040
        _Static_assert(__builtin_types_compatible_p(PFN_cuGraphAddNode_v13040, PFN_cuGraphAddNode_v12030),
                       "cuGraphAddNode_v3 has _v2's parameters");
#endif
        if (!strcmp(abi, "cuGraphAddNode_v2") || !strcmp(abi, "cuGraphAddNode_v3"))
            rc = ((PFN_cuGraphAddNode_v12030)f)(&node, NULL, NULL, NULL, 0, &np);
        else
            rc = ((PFN_cuGraphAddNode_v12020)f)(&node, NULL, NULL, 0, &np);
    } else if (!strcmp(call, "cuDeviceGetByPCIBusId")) {
        /* ORDINAL 0: the bus id of the device this process sees first; otherwise physical
         * GPU ORDINAL's (0000:28:00.0 for GPU 1: device 1 when GPUs 0 and 1 are visible). */
        char bus[32] = "";
        if (ord == 0)
            CHECK_SETUP(((PFN_cuDeviceGetPCIBusId_v4010)linked_fn("cuDeviceGetPCIBusId"))(bus, sizeof bus, 0));
        else
            snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x18 + 0x10 * ord);
        CUdevice d = -1;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetByPCIBusId_v4010, abi, call, version)(&d, bus);
        printf("device=%d\n", (int)d);
    } else if (!strcmp(call, "cuDeviceGraphMemTrim")) {
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGraphMemTrim_v11040, abi, call, version)(dev);
    } else if (!strcmp(call, "cuDeviceSetGraphMemAttribute")) {
        cuuint64_t zero = 0;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceSetGraphMemAttribute_v11040, abi, call, version)(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero);
    } else if (!strcmp(call, "cuKernelSetAttribute")) {
        /* no kernel exists on the fake: the driver alone refuses the handle */
        printf("setup ok\n");
        rc = DRV(PFN_cuKernelSetAttribute_v12000, abi, call, version)(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 0, NULL, dev);
    } else if (!strcmp(call, "cuDeviceGetTexture1DLinearMaxWidth")) {
        size_t w = 0;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetTexture1DLinearMaxWidth_v11010, abi, call, version)(&w, CU_AD_FORMAT_FLOAT, 1, dev);
    } else if (!strcmp(call, "cuDeviceGetExecAffinitySupport")) {
        int v = 0;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetExecAffinitySupport_v11040, abi, call, version)(&v, CU_EXEC_AFFINITY_TYPE_SM_COUNT, dev);
    } else if (!strcmp(call, "cuDeviceGetP2PAttribute")) {
        int v = -1;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetP2PAttribute_v8000, abi, call, version)(&v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, dev);
    } else if (!strcmp(call, "cuDeviceComputeCapability")) {
        int maj, min;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceComputeCapability_v2000, abi, call, version)(&maj, &min, dev);
    } else if (!strcmp(call, "cuDeviceGetProperties")) {
        CUdevprop prop;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetProperties_v2000, abi, call, version)(&prop, dev);
    } else if (!strcmp(call, "cuDeviceGetGraphMemAttribute")) {
        unsigned long long v = 0;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetGraphMemAttribute_v11040, abi, call, version)(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v);
    } else if (!strcmp(call, "cuDeviceGetNvSciSyncAttributes")) {
        char attrs[64]; /* an opaque NvSciSyncAttrList stand-in: the fake never writes it */
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetNvSciSyncAttributes_v10020, abi, call, version)(attrs, dev, CUDA_NVSCISYNC_ATTR_SIGNAL);
    /* CUDA 13 queries (this program is compiled against the 12.9 headers): parameters from
     * the 13.x cudaTypedefs.h, their 13-only struct and enum types passed as opaque memory. */
    } else if (!strcmp(call, "cuDeviceGetCliqueCount")) {
        size_t n = 0;
        printf("setup ok\n");
        rc = DRV(CUresult(*)(size_t *, CUdevice), abi, call, version)(&n, dev);
    } else if (!strcmp(call, "cuDeviceGetCliqueInfo")) {
        unsigned char info[256];
        size_t n = 1;
        printf("setup ok\n");
        rc = DRV(CUresult(*)(void *, size_t *, CUdevice), abi, call, version)(info, &n, dev);
    } else if (!strcmp(call, "cuDeviceGetFabricClusterUuid")) {
        CUuuid u;
        printf("setup ok\n");
        rc = DRV(CUresult(*)(CUuuid *, CUdevice), abi, call, version)(&u, dev);
    } else if (!strcmp(call, "cuDeviceGetHostAtomicCapabilities")) {
        unsigned caps = 0;
        int op = 0; /* CU_ATOMIC_OPERATION_INTEGER_ADD */
        printf("setup ok\n");
        rc = DRV(CUresult(*)(unsigned *, const void *, unsigned, CUdevice), abi, call, version)(&caps, &op, 1, dev);
    } else if (!strcmp(call, "cuDeviceGetP2PAtomicCapabilities")) {
        unsigned caps = 0;
        int op = 0;
        printf("setup ok\n");
        rc = DRV(CUresult(*)(unsigned *, const void *, unsigned, CUdevice, CUdevice), abi, call, version)(&caps, &op, 1, 0, dev);
    } else if (!strcmp(call, "cuDeviceGetLuid")) {
        char luid[8];
        unsigned mask;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetLuid_v10000, abi, call, version)(luid, &mask, dev);
    } else if (!strcmp(call, "cuMemcpy3DPeer") || !strcmp(call, "cuMemcpy3DPeerAsync")) {
        /* Device 0's buffer to device ORD's context. ORDINAL 0: both contexts are device
         * 0's. With one GPU visible, ORDINAL 1 names a context that is no context (the
         * guard cannot tell its device: denied, fail closed; the driver alone refuses it
         * with INVALID_CONTEXT); with two, device 1's primary context. */
        CUcontext peer = ctx0;
        int count = 0;
        CHECK_SETUP(((PFN_cuDeviceGetCount_v2000)dlsym(hdrv, "cuDeviceGetCount"))(&count));
        if (ord && count > ord)
            CHECK_SETUP(((PFN_cuDevicePrimaryCtxRetain_v7000)linked_fn("cuDevicePrimaryCtxRetain"))(&peer, dev));
        else if (ord)
            peer = (CUcontext)(uintptr_t)0x10;
        CUdeviceptr a, b;
        CHECK_SETUP(((PFN_cuMemAlloc_v3020)linked_fn("cuMemAlloc_v2"))(&a, 256));
        CHECK_SETUP(((PFN_cuMemAlloc_v3020)linked_fn("cuMemAlloc_v2"))(&b, 256));
        printf("setup ok (%s)\n", abi);
        CUDA_MEMCPY3D_PEER c;
        memset(&c, 0, sizeof c);
        c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = a;
        c.srcContext = ctx0;
        c.dstDevice = b;
        c.dstContext = peer;
        c.srcPitch = c.dstPitch = 64;
        c.WidthInBytes = 64;
        c.Height = 4;
        c.Depth = 1;
        void *f = need(drv(abi, call, version), call);
        if (!strcmp(call, "cuMemcpy3DPeer"))
            rc = ((PFN_cuMemcpy3DPeer_v4000)f)(&c);
        else
            rc = ((PFN_cuMemcpy3DPeerAsync_v4000)f)(&c, NULL);
    } else if (!strcmp(call, "cuDeviceGetAttribute")) {
        int v;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetAttribute_v2000, abi, call, version)(
            &v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    } else if (!strcmp(call, "cuDeviceGetName") || !strcmp(call, "cuDeviceGetPCIBusId")) {
        char buf[64]; /* both are (char *, int len, CUdevice) */
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceGetName_v2000, abi, call, version)(buf, (int)sizeof buf, dev);
    } else if (!strcmp(call, "cuDeviceGetUuid")) {
        CUuuid u;
        printf("setup ok (%s)\n", abi);
        rc = DRV(PFN_cuDeviceGetUuid_v11040, abi, call, version)(&u, dev);
    } else if (!strcmp(call, "cuDeviceTotalMem")) {
        printf("setup ok (%s)\n", abi);
        if (is(abi, "cuDeviceTotalMem_v2")) {
            size_t b;
            rc = DRV(PFN_cuDeviceTotalMem_v3020, abi, call, version)(&b, dev);
        } else { /* the 2.0 variant: an unsigned int out-parameter */
            unsigned b;
            rc = DRV(CUresult(*)(unsigned *, CUdevice), abi, call, version)(&b, dev);
        }
    } else if (!strcmp(call, "cuDeviceCanAccessPeer")) {
        int can;
        printf("setup ok\n");
        rc = DRV(PFN_cuDeviceCanAccessPeer_v4000, abi, call, version)(&can, dev, 0);
    } else {
        fprintf(stderr, "guard_call: unknown driver call %s\n", call);
        return 3;
    }
    printf("rc=%d\n", rc);
    return 0;
}

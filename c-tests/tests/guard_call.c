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
    X(cudaMallocManaged)
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
GUARDED_RUNTIME_VARIANTS(ABI_OF)
HELPERS(ABI)
#define ROW(n) {#n, (void *)abi_##n},
#define ROW_OF(api, abi, v, pt) {#abi, (void *)abi_##abi},
static const struct { const char *name; void *fn; } linked[] = {
    GUARDED_DRIVER_VARIANTS(ROW_OF) GUARDED_RUNTIME_VARIANTS(ROW_OF) HELPERS(ROW)
};

/* Every guarded driver variant with the version of its cudaTypedefs.h PFN. */
#define VARIANT_OF(api, abi, v, pt) {#api, #abi, v, pt},
static const struct { const char *api, *abi; int since; const char *pt; } variants[] = {
    GUARDED_DRIVER_VARIANTS(VARIANT_OF)
};

enum path { LINK, DLSYM, GPA1, GPA2, GPA2PT, STATIC, EP, EPV };
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
    case LINK: return linked_fn(abi);
    case DLSYM: return dlsym(hdrv, abi);
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

/* The ABI variant a driver API resolves to at `ver`: the newest variant at or before it,
 * per-thread when the path asks for the per-thread default stream and one exists. */
static const char *variant(const char *base, int ver) {
    static char buf[128];
    const char *best = NULL;
    for (int pt = (path == GPA2PT); pt >= 0 && !best; pt--) {
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

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: guard_call PATH CALL ORDINAL [VERSION]\n");
        return 3;
    }
    const char *paths[] = {"link", "dlsym", "gpa1", "gpa2", "gpa2pt", "static", "ep", "epv"};
    int found = 0;
    for (int i = 0; i < 8; i++)
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

    /* Runtime calls: everything through the runtime. */
    if (!strncmp(call, "cuda", 4)) {
        int rc = -1;
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

    if (!strcmp(call, "cuDeviceGet")) {
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

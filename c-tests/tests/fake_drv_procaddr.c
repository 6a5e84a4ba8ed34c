/* cuGetProcAddress / cuGetProcAddress_v2 routing of the fake driver, checked against the
 * addresses dlsym() gives for the ABI names in libcuda.so.1 (loaded by name with dlopen,
 * as cuda.bindings and libcudart do). Driven by python-tests/test_fake_driver.py.
 *   fake_drv_procaddr           the named cases of the issue + error cases
 *   fake_drv_procaddr table     reads "name version flags abi" lines on stdin (every row of
 *                               the generated table) and checks each one
 *   fake_drv_procaddr preload   run with an LD_PRELOAD exporting cuCtxCreate_v2 that
 *                               returns 999: the driver's table must not hand it out */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <string.h>

#include "fakecuda_drvtest.h"

static void *lib;
static PFN_cuGetProcAddress_v12000 gpa2;
static PFN_cuGetProcAddress_v11030 gpa1;

static void *sym(const char *abi)
{
    void *p = dlsym(lib, abi);
    if (!p) {
        printf("FAIL dlsym(libcuda.so.1, %s) is NULL\n", abi);
        exit(2);
    }
    return p;
}

/* want_abi NULL: expect *pfn == NULL with want_status. Checks both entry points. */
static void route(const char *name, int version, int flags, const char *want_abi,
                  CUdriverProcAddressQueryResult want_status)
{
    void *p = (void *)1, *q = (void *)1;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)77;
    CUresult r = gpa2(name, &p, version, (cuuint64_t)flags, &st);
    CUresult r1 = gpa1(name, &q, version, (cuuint64_t)flags);
    void *want = want_abi ? sym(want_abi) : NULL;
    EXPECT(r == CUDA_SUCCESS && p == want && st == want_status,
           "cuGetProcAddress_v2(%s, %d, flags %d) -> %s (rc %d, status %d)", name, version, flags,
           want_abi ? want_abi : "NULL", (int)r, (int)st);
    EXPECT(r1 == CUDA_SUCCESS && q == want, "cuGetProcAddress(%s, %d, flags %d) -> %s", name,
           version, flags, want_abi ? want_abi : "NULL");
}

static int table(void)
{
    char name[128], abi[160];
    int version, flags, n = 0;
    while (scanf("%127s %d %d %159s", name, &version, &flags, abi) == 4) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st;
        CUresult r = gpa2(name, &p, version, (cuuint64_t)flags, &st);
        if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || p != sym(abi)) {
            printf("FAIL table row %s %d %d -> want %s (rc %d status %d)\n", name, version,
                   flags, abi, (int)r, (int)st);
            drvtest_failures++;
        }
        n++;
    }
    EXPECT(n > 500, "checked %d table rows against dlsym", n);
    return drvtest_done();
}

static int preload(void)
{
    void *p = NULL;
    MUST(gpa2("cuCtxCreate", &p, 3020, 0, NULL));
    void *global = dlsym(RTLD_DEFAULT, "cuCtxCreate_v2");
    EXPECT(global != NULL && global != p, "the preload's cuCtxCreate_v2 shadows the driver's globally");
    EXPECT(p == sym("cuCtxCreate_v2"), "cuGetProcAddress returns the driver's own cuCtxCreate_v2");
    MUST(cuInit(0));
    CUcontext c = NULL;
    CUresult r = ((PFN_cuCtxCreate_v3020)p)(&c, 0, 0);
    EXPECT(r == CUDA_SUCCESS && c != NULL, "the returned pointer is the driver's function (rc %d)", (int)r);
    return drvtest_done();
}

int main(int argc, char **argv)
{
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL dlopen(libcuda.so.1): %s\n", dlerror());
        return 2;
    }
    gpa2 = (PFN_cuGetProcAddress_v12000)sym("cuGetProcAddress_v2");
    gpa1 = (PFN_cuGetProcAddress_v11030)sym("cuGetProcAddress");
    if (argc > 1 && !strcmp(argv[1], "table"))
        return table();
    if (argc > 1 && !strcmp(argv[1], "preload"))
        return preload();

    const int PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    const int LEG = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    const CUdriverProcAddressQueryResult OK = CU_GET_PROC_ADDRESS_SUCCESS;
    const CUdriverProcAddressQueryResult NF = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUdriverProcAddressQueryResult LOW = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;

    /* cuCtxCreate: v2000 bare, v3020 _v2, v11040 _v3, v12050 _v4 */
    route("cuCtxCreate", 2000, 0, "cuCtxCreate", OK);
    route("cuCtxCreate", 3010, 0, "cuCtxCreate", OK);
    route("cuCtxCreate", 3020, 0, "cuCtxCreate_v2", OK);
    route("cuCtxCreate", 11030, 0, "cuCtxCreate_v2", OK);
    route("cuCtxCreate", 11040, 0, "cuCtxCreate_v3", OK);
    route("cuCtxCreate", 12050, 0, "cuCtxCreate_v4", OK);
    route("cuCtxCreate", 13050, PT, "cuCtxCreate_v4", OK);   /* no per-thread variant */
    route("cuCtxCreate", 1000, 0, NULL, LOW);
    /* cuIpcOpenMemHandle: v4010 bare, v11000 _v2 */
    route("cuIpcOpenMemHandle", 4010, 0, "cuIpcOpenMemHandle", OK);
    route("cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2", OK);
    route("cuIpcOpenMemHandle", 4000, 0, NULL, LOW);
    /* per-thread default stream */
    route("cuMemcpyPeer", 12000, PT, "cuMemcpyPeer_ptds", OK);
    route("cuMemcpyPeer", 12000, 0, "cuMemcpyPeer", OK);
    route("cuMemcpyPeer", 12000, LEG, "cuMemcpyPeer", OK);
    route("cuMemcpyPeer", 4000, PT, "cuMemcpyPeer", OK);     /* _ptds appeared in 7000 */
    route("cuMemcpyPeerAsync", 12000, PT, "cuMemcpyPeerAsync_ptsz", OK);
    route("cuMemcpyHtoD", 12000, PT, "cuMemcpyHtoD_v2_ptds", OK);
    route("cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2", OK);
    route("cuMemcpyHtoD", 2000, 0, "cuMemcpyHtoD", OK);
    route("cuStreamBeginCapture", 10000, PT, "cuStreamBeginCapture_ptsz", OK);
    route("cuStreamBeginCapture", 10010, PT, "cuStreamBeginCapture_v2_ptsz", OK);
    route("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2", OK);
    route("cuMemPrefetchAsync", 12020, PT, "cuMemPrefetchAsync_v2_ptsz", OK);
    route("cuMemPrefetchAsync", 12010, PT, "cuMemPrefetchAsync_ptsz", OK);
    /* other renamed entry points */
    route("cuGetProcAddress", 11030, 0, "cuGetProcAddress", OK);
    route("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", OK);
    route("cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease", OK);
    route("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2", OK);
    route("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2", OK);
    route("cuMemAlloc", 3020, 0, "cuMemAlloc_v2", OK);
    route("cuEventDestroy", 4000, 0, "cuEventDestroy_v2", OK);
    /* unknown names: success, NULL, SYMBOL_NOT_FOUND */
    route("cuNoSuchFunction", 12000, 0, NULL, NF);
    route("cudaMalloc", 12000, 0, NULL, NF);
    route("cuCtxCreate_v2", 12000, 0, NULL, NF);   /* ABI names are not base names */
    route("", 12000, 0, NULL, NF);
    /* argument errors */
    void *p;
    EXPECT(gpa2(NULL, &p, 12000, 0, NULL) == CUDA_ERROR_INVALID_VALUE, "NULL symbol -> INVALID_VALUE");
    EXPECT(gpa2("cuInit", NULL, 12000, 0, NULL) == CUDA_ERROR_INVALID_VALUE, "NULL pfn -> INVALID_VALUE");
    EXPECT(gpa2("cuInit", &p, 12000, 4, NULL) == CUDA_ERROR_INVALID_VALUE, "unknown flag bit -> INVALID_VALUE");
    /* an entry point the fake does not implement: a stub, as documented */
    MUST(gpa2("cuModuleLoad", &p, 12000, 0, NULL));
    EXPECT(p == sym("cuModuleLoad"), "cuModuleLoad resolves to the exported stub");
    MUST(cuInit(0));
    CUresult r = ((PFN_cuModuleLoad_v2000)p)(NULL, "x");
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "the stub returns CUDA_ERROR_NOT_SUPPORTED (%d)", (int)r);
    return drvtest_done();
}

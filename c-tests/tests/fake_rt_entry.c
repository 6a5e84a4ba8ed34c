/* fake_rt_entry: cudaGetDriverEntryPoint / cudaGetDriverEntryPointByVersion (and their
 * `_ptsz` exports) of the fake libcudart.so.12 return the driver's own ABI functions.
 *
 * Why it exists: PyTorch and NCCL fetch driver functions this way (docs/design.md §2,
 * layer 4); the runtime must answer with the variant the version and flags select, the
 * same pointer dlsym() finds under the ABI name in libcuda.so.1.
 */
#include <dlfcn.h>
#include <string.h>

#include "fake_rt_check.h"

/* The `_ptsz` exports: cuda_runtime_api.h only names them under
 * CUDA_API_PER_THREAD_DEFAULT_STREAM, so a plain C file declares them itself. */
extern cudaError_t cudaGetDriverEntryPoint_ptsz(const char *, void **, unsigned long long,
                                                enum cudaDriverEntryPointQueryResult *);
extern cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *, void **, unsigned int,
        unsigned long long, enum cudaDriverEntryPointQueryResult *);

static void *drv;

static void *abi(const char *name)
{
    void *p = dlsym(drv, name);
    if (!p)
        printf("FAIL libcuda.so.1 does not export %s\n", name);
    return p;
}

#define ENTRY(call, abi_name) do {                                                    \
    void *p_ = (void *)1;                                                             \
    enum cudaDriverEntryPointQueryResult st_ = (enum cudaDriverEntryPointQueryResult)-1; \
    cudaError_t e_ = (call);                                                          \
    void *want_ = abi(abi_name);                                                      \
    CHECK(e_ == cudaSuccess && st_ == cudaDriverEntryPointSuccess && p_ && p_ == want_, \
          "%s -> %s status %d = %s", #call, cudaGetErrorName(e_), (int)st_, abi_name); \
} while (0)

int main(void)
{
    drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (!drv) {
        printf("FAIL cannot dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }

    /* Runtime version 12090 picks the newest variant at or before 12.9. */
    ENTRY(cudaGetDriverEntryPoint("cuMemAlloc", &p_, cudaEnableDefault, &st_), "cuMemAlloc_v2");
    ENTRY(cudaGetDriverEntryPoint("cuCtxCreate", &p_, cudaEnableDefault, &st_), "cuCtxCreate_v4");
    ENTRY(cudaGetDriverEntryPoint("cuDeviceGet", &p_, cudaEnableLegacyStream, &st_), "cuDeviceGet");
    ENTRY(cudaGetDriverEntryPoint("cuIpcOpenMemHandle", &p_, cudaEnableDefault, &st_),
          "cuIpcOpenMemHandle_v2");
    /* Explicit versions. */
    ENTRY(cudaGetDriverEntryPointByVersion("cuMemAlloc", &p_, 2000, cudaEnableDefault, &st_),
          "cuMemAlloc");
    ENTRY(cudaGetDriverEntryPointByVersion("cuCtxCreate", &p_, 3020, cudaEnableDefault, &st_),
          "cuCtxCreate_v2");
    ENTRY(cudaGetDriverEntryPointByVersion("cuCtxCreate", &p_, 11040, cudaEnableDefault, &st_),
          "cuCtxCreate_v3");
    ENTRY(cudaGetDriverEntryPointByVersion("cuCtxCreate", &p_, 12050, cudaEnableDefault, &st_),
          "cuCtxCreate_v4");
    /* Per-thread default stream: flags 2, or cudaEnableDefault through the `_ptsz` export. */
    ENTRY(cudaGetDriverEntryPoint("cuMemcpy", &p_, cudaEnableDefault, &st_), "cuMemcpy");
    ENTRY(cudaGetDriverEntryPoint("cuMemcpy", &p_, cudaEnablePerThreadDefaultStream, &st_),
          "cuMemcpy_ptds");
    ENTRY(cudaGetDriverEntryPoint_ptsz("cuMemcpy", &p_, cudaEnableDefault, &st_), "cuMemcpy_ptds");
    ENTRY(cudaGetDriverEntryPoint_ptsz("cuMemcpy", &p_, cudaEnableLegacyStream, &st_), "cuMemcpy");
    ENTRY(cudaGetDriverEntryPoint_ptsz("cuStreamSynchronize", &p_, cudaEnableDefault, &st_),
          "cuStreamSynchronize_ptsz");
    ENTRY(cudaGetDriverEntryPointByVersion_ptsz("cuMemcpyHtoD", &p_, 12000, cudaEnableDefault, &st_),
          "cuMemcpyHtoD_v2_ptds");
    ENTRY(cudaGetDriverEntryPointByVersion("cuMemcpyHtoD", &p_, 12000,
                                           cudaEnablePerThreadDefaultStream, &st_),
          "cuMemcpyHtoD_v2_ptds");
    /* No per-thread variant: the legacy one. */
    ENTRY(cudaGetDriverEntryPoint_ptsz("cuMemAlloc", &p_, cudaEnableDefault, &st_), "cuMemAlloc_v2");

    /* Not found: success, NULL, and the status says why. */
    void *p = (void *)1;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSuccess;
    EXPECT_RT(cudaGetDriverEntryPoint("cuNoSuchFunction", &p, cudaEnableDefault, &st), cudaSuccess);
    CHECK(p == NULL && st == cudaDriverEntryPointSymbolNotFound,
          "unknown symbol: NULL (%p), SymbolNotFound (%d)", p, (int)st);
    p = (void *)1;
    st = cudaDriverEntryPointSuccess;
    EXPECT_RT(cudaGetDriverEntryPointByVersion("cuGetProcAddress", &p, 11000, cudaEnableDefault, &st),
              cudaSuccess);
    CHECK(p == NULL && st == cudaDriverEntryPointVersionNotSufficent,
          "cuGetProcAddress at 11000: NULL (%p), VersionNotSufficent (%d)", p, (int)st);
    p = (void *)1;
    EXPECT_RT(cudaGetDriverEntryPoint("cuMemAlloc", &p, cudaEnableDefault, NULL), cudaSuccess);
    CHECK(p == abi("cuMemAlloc_v2"), "driverStatus is optional");

    /* Bad arguments. */
    EXPECT_RT(cudaGetDriverEntryPoint(NULL, &p, cudaEnableDefault, &st), cudaErrorInvalidValue);
    EXPECT_RT(cudaGetDriverEntryPoint("cuMemAlloc", NULL, cudaEnableDefault, &st), cudaErrorInvalidValue);
    EXPECT_RT(cudaGetDriverEntryPoint("cuMemAlloc", &p, 4, &st), cudaErrorInvalidValue);
    EXPECT_RT(cudaGetDriverEntryPointByVersion("cuMemAlloc", &p, 12000, 3, &st), cudaErrorInvalidValue);
    cudaGetLastError();

    /* The pointer works: allocate through the driver function the runtime handed out. */
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = NULL;
    CUresult (*mem_free)(CUdeviceptr) = NULL;
    MUST_RT(cudaFree(0)); /* the runtime's context is current */
    MUST_RT(cudaGetDriverEntryPoint("cuMemAlloc", (void **)&mem_alloc, cudaEnableDefault, NULL));
    MUST_RT(cudaGetDriverEntryPoint("cuMemFree", (void **)&mem_free, cudaEnableDefault, NULL));
    CUdeviceptr dp = 0;
    CHECK(mem_alloc && mem_alloc(&dp, 256) == CUDA_SUCCESS && dp, "cuMemAlloc_v2 via entry point");
    CHECK(mem_free && mem_free(dp) == CUDA_SUCCESS, "cuMemFree_v2 via entry point");
    return rt_done("fake_rt_entry");
}

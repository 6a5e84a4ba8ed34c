/* fake_rt_ptds: a program compiled for the per-thread default stream
 * (CUDA_API_PER_THREAD_DEFAULT_STREAM, i.e. nvcc --default-stream per-thread).
 *
 * Why it exists: such programs call the runtime's `_ptds`/`_ptsz` exports (the header's
 * __CUDART_API_PTDS/PTSZ macros rename cudaMemcpy to cudaMemcpy_ptds, ...), which reach
 * the driver's per-thread entry points; rankguard must see them too. pytest checks with
 * readelf that this binary really imports the `_ptds`/`_ptsz` names.
 */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include <dlfcn.h>
#include <string.h>

#include "fake_rt_check.h"

#define N 1024

int main(void)
{
    static unsigned char host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (unsigned char)(i * 5);
    MUST_RT(cudaSetDevice(0));
    void *d = NULL;
    MUST_RT(cudaMalloc(&d, N));
    EXPECT_RT(cudaMemcpy(d, host, N, cudaMemcpyHostToDevice), cudaSuccess);   /* _ptds */
    EXPECT_RT(cudaMemcpy(back, d, N, cudaMemcpyDefault), cudaSuccess);        /* _ptds */
    CHECK(!memcmp(back, host, N), "per-thread cudaMemcpy round trip");
    EXPECT_RT(cudaMemset(d, 0x3c, N), cudaSuccess);                           /* _ptds */
    EXPECT_RT(cudaMemcpy(back, d, N, cudaMemcpyDeviceToHost), cudaSuccess);
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= back[i] == 0x3c;
    CHECK(ok, "per-thread cudaMemset");

    void *m = NULL;
    MUST_RT(cudaMallocManaged(&m, N, cudaMemAttachGlobal));
    EXPECT_RT(cudaMemPrefetchAsync(m, N, 0, 0), cudaSuccess);                 /* _ptsz */
    struct cudaMemLocation to_dev = {cudaMemLocationTypeDevice, 0};
    EXPECT_RT(cudaMemPrefetchAsync_v2(m, N, to_dev, 0, 0), cudaSuccess);      /* _v2_ptsz */
    EXPECT_RT(cudaStreamSynchronize(0), cudaSuccess);
    MUST_RT(cudaFree(m));

    cudaEvent_t ev;
    MUST_RT(cudaEventCreate(&ev));
    EXPECT_RT(cudaEventRecord(ev, 0), cudaSuccess);                           /* _ptsz */
    EXPECT_RT(cudaEventSynchronize(ev), cudaSuccess);
    EXPECT_RT(cudaStreamSynchronize(0), cudaSuccess);                         /* _ptsz */
    EXPECT_RT(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    EXPECT_RT(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    MUST_RT(cudaEventDestroy(ev));

    /* cudaEnableDefault from a per-thread program means the per-thread variants. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    void *p = NULL;
    enum cudaDriverEntryPointQueryResult st;
    EXPECT_RT(cudaGetDriverEntryPoint("cuMemcpy", &p, cudaEnableDefault, &st), cudaSuccess); /* _ptsz */
    CHECK(drv && p && p == dlsym(drv, "cuMemcpy_ptds"), "cudaEnableDefault -> cuMemcpy_ptds");
    EXPECT_RT(cudaGetDriverEntryPointByVersion("cuEventRecord", &p, 12000, cudaEnableDefault, &st),
              cudaSuccess);
    CHECK(drv && p && p == dlsym(drv, "cuEventRecord_ptsz"), "cudaEnableDefault -> cuEventRecord_ptsz");
    MUST_RT(cudaFree(d));
    return rt_done("fake_rt_ptds");
}

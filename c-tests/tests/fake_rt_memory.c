/* fake_rt_memory: cudaMalloc/cudaFree/cudaMemcpy (every cudaMemcpyKind)/cudaMemset and
 * cudaPointerGetAttributes of the fake libcudart.so.12, with byte checks.
 *
 * Why it exists: rankguard's IPC and peer tests move bytes through these calls; a copy
 * that silently did nothing would make every byte check downstream meaningless.
 */
#include <stdint.h>
#include <string.h>

#include "fake_rt_check.h"

#define N 4096

static int all_equal(const unsigned char *b, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != v)
            return 0;
    return 1;
}

int main(void)
{
    static unsigned char host[N], back[N], other[N];
    for (int i = 0; i < N; i++)
        host[i] = (unsigned char)(i * 7 + 3);

    MUST_RT(cudaSetDevice(1));
    void *a = NULL, *b = NULL, *z = (void *)1;
    EXPECT_RT(cudaMalloc(&a, N), cudaSuccess);
    EXPECT_RT(cudaMalloc(&b, N), cudaSuccess);
    CHECK(a && b && a != b, "two allocations: %p %p", a, b);
    EXPECT_RT(cudaMalloc(NULL, N), cudaErrorInvalidValue);
    EXPECT_RT(cudaMalloc(&z, 0), cudaSuccess);
    CHECK(z == NULL, "cudaMalloc of 0 bytes gives NULL (%p)", z);
    void *huge = NULL;
    EXPECT_RT(cudaMalloc(&huge, (size_t)1 << 50), cudaErrorMemoryAllocation);
    cudaGetLastError();

    /* Every direction, explicit and inferred. */
    EXPECT_RT(cudaMemcpy(a, host, N, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_RT(cudaMemcpy(b, a, N, cudaMemcpyDeviceToDevice), cudaSuccess);
    memset(back, 0, N);
    EXPECT_RT(cudaMemcpy(back, b, N, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(!memcmp(back, host, N), "H2D, D2D, D2H round trip keeps the bytes");
    memset(other, 0, N);
    EXPECT_RT(cudaMemcpy(other, back, N, cudaMemcpyHostToHost), cudaSuccess);
    CHECK(!memcmp(other, host, N), "H2H copies the bytes");

    EXPECT_RT(cudaMemset(a, 0x5a, N), cudaSuccess);
    memset(back, 0, N);
    EXPECT_RT(cudaMemcpy(back, a, N, cudaMemcpyDefault), cudaSuccess);
    CHECK(all_equal(back, N, 0x5a), "cudaMemset + cudaMemcpyDefault (D2H inferred)");
    EXPECT_RT(cudaMemcpy(a, host, N, cudaMemcpyDefault), cudaSuccess);
    EXPECT_RT(cudaMemcpy(b, a, N / 2, cudaMemcpyDefault), cudaSuccess);
    memset(back, 0, N);
    EXPECT_RT(cudaMemcpy(back, b, N, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(!memcmp(back, host, N), "cudaMemcpyDefault H2D and D2D inferred");
    memset(other, 0, N);
    EXPECT_RT(cudaMemcpy(other, host, N, cudaMemcpyDefault), cudaSuccess);
    CHECK(!memcmp(other, host, N), "cudaMemcpyDefault H2H inferred");

    /* Offsets inside an allocation. */
    EXPECT_RT(cudaMemset((char *)a + 100, 0xee, 10), cudaSuccess);
    EXPECT_RT(cudaMemcpy(back, (char *)a + 95, 20, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(!memcmp(back, host + 95, 5) && all_equal(back + 5, 10, 0xee) &&
          !memcmp(back + 15, host + 110, 5), "memset/memcpy at an offset");

    EXPECT_RT(cudaMemcpy(back, a, N, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    EXPECT_RT(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);
    EXPECT_RT(cudaMemcpy(back, a, 0, cudaMemcpyDeviceToHost), cudaSuccess);

    /* Pointer attributes. */
    struct cudaPointerAttributes at;
    memset(&at, 0x7f, sizeof at);
    EXPECT_RT(cudaPointerGetAttributes(&at, a), cudaSuccess);
    CHECK(at.type == cudaMemoryTypeDevice, "device pointer type %d", (int)at.type);
    CHECK(at.device == 1, "device pointer on device %d (want 1)", at.device);
    CHECK(at.devicePointer == a, "devicePointer %p (want %p)", at.devicePointer, a);
    CHECK(at.hostPointer == NULL, "hostPointer of device memory is NULL (%p)", at.hostPointer);
    memset(&at, 0x7f, sizeof at);
    EXPECT_RT(cudaPointerGetAttributes(&at, (char *)a + 8), cudaSuccess);
    CHECK(at.type == cudaMemoryTypeDevice && at.devicePointer == (char *)a + 8,
          "interior pointer keeps its own address");
    memset(&at, 0x7f, sizeof at);
    EXPECT_RT(cudaPointerGetAttributes(&at, host), cudaSuccess);
    CHECK(at.type == cudaMemoryTypeUnregistered, "host pointer is unregistered (%d)", (int)at.type);
    CHECK(at.device == -2, "unregistered pointer device %d (want -2)", at.device);
    EXPECT_RT(cudaPointerGetAttributes(NULL, a), cudaErrorInvalidValue);
    cudaGetLastError();

    /* Managed memory and prefetch (to a device, and to the host: cudaCpuDeviceId). */
    void *m = NULL;
    EXPECT_RT(cudaMallocManaged(&m, N, cudaMemAttachGlobal), cudaSuccess);
    EXPECT_RT(cudaMallocManaged(&z, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT_RT(cudaMallocManaged(&z, N, 4), cudaErrorInvalidValue);
    EXPECT_RT(cudaMemcpy(m, host, N, cudaMemcpyDefault), cudaSuccess);
    EXPECT_RT(cudaMemPrefetchAsync(m, N, 1, 0), cudaSuccess);
    EXPECT_RT(cudaMemPrefetchAsync(m, N, cudaCpuDeviceId, 0), cudaSuccess);
    EXPECT_RT(cudaMemPrefetchAsync(m, N, 99, 0), cudaErrorInvalidDevice);
    struct cudaMemLocation to_dev = {cudaMemLocationTypeDevice, 0};
    struct cudaMemLocation to_host = {cudaMemLocationTypeHost, 0};
    struct cudaMemLocation to_bad = {cudaMemLocationTypeDevice, 99};
    EXPECT_RT(cudaMemPrefetchAsync_v2(m, N, to_dev, 0, 0), cudaSuccess);
    EXPECT_RT(cudaMemPrefetchAsync_v2(m, N, to_host, 0, 0), cudaSuccess);
    EXPECT_RT(cudaMemPrefetchAsync_v2(m, N, to_bad, 0, 0), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceSynchronize(), cudaSuccess);
    memset(back, 0, N);
    EXPECT_RT(cudaMemcpy(back, m, N, cudaMemcpyDefault), cudaSuccess);
    CHECK(!memcmp(back, host, N), "managed memory keeps its bytes across prefetches");
    memset(&at, 0, sizeof at);
    EXPECT_RT(cudaPointerGetAttributes(&at, m), cudaSuccess);
    CHECK(at.type == cudaMemoryTypeManaged, "managed pointer type %d", (int)at.type);
    EXPECT_RT(cudaFree(m), cudaSuccess);
    cudaGetLastError();

    /* Memory info of the current device (1). */
    size_t free_b = 0, total_b = 0;
    struct cudaDeviceProp prop;
    EXPECT_RT(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    MUST_RT(cudaGetDeviceProperties(&prop, 1));
    CHECK(total_b == prop.totalGlobalMem && free_b > 0 && free_b <= total_b,
          "cudaMemGetInfo: %zu free of %zu", free_b, total_b);
    EXPECT_RT(cudaMemGetInfo(NULL, &total_b), cudaErrorInvalidValue);
    cudaGetLastError();

    /* Free. */
    EXPECT_RT(cudaFree(NULL), cudaSuccess);
    EXPECT_RT(cudaFree(a), cudaSuccess);
    EXPECT_RT(cudaFree(b), cudaSuccess);
    EXPECT_RT(cudaFree(host), cudaErrorInvalidValue);
    cudaGetLastError();

    return rt_done("fake_rt_memory");
}

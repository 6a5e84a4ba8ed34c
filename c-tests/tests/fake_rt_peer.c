/* fake_rt_peer: peer access and peer copies of the fake libcudart.so.12.
 *
 * Why it exists: rule R4 denies exactly these calls inside a rank, so their unguarded
 * behaviour must be right first: cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess /
 * DisablePeerAccess with the documented errors (cudaErrorInvalidDevice for itself or an
 * unknown device, cudaErrorPeerAccessAlreadyEnabled, cudaErrorPeerAccessNotEnabled,
 * cudaErrorInvalidValue for flags), and cudaMemcpyPeer(Async) moving the bytes.
 */
#include <string.h>

#include "fake_rt_check.h"

#define N 8192

int main(void)
{
    static unsigned char src[N], back[N];
    for (int i = 0; i < N; i++)
        src[i] = (unsigned char)(i ^ 0xa5);

    int count = 0;
    MUST_RT(cudaGetDeviceCount(&count));
    if (count < 3) {
        printf("FAIL need 3 devices, have %d\n", count);
        return 1;
    }

    int can = -1;
    EXPECT_RT(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
    CHECK(can == 1, "device 0 can access device 1 (%d)", can);
    can = -1;
    EXPECT_RT(cudaDeviceCanAccessPeer(&can, 0, 0), cudaSuccess);
    CHECK(can == 0, "a device is not its own peer (%d)", can);
    EXPECT_RT(cudaDeviceCanAccessPeer(&can, 0, count), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceCanAccessPeer(&can, -1, 0), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceCanAccessPeer(NULL, 0, 1), cudaErrorInvalidValue);

    MUST_RT(cudaSetDevice(0));
    EXPECT_RT(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceEnablePeerAccess(count, 0), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceEnablePeerAccess(1, 1), cudaErrorInvalidValue);
    EXPECT_RT(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
    EXPECT_RT(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    EXPECT_RT(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
    EXPECT_RT(cudaGetLastError(), cudaErrorPeerAccessAlreadyEnabled);
    EXPECT_RT(cudaDeviceDisablePeerAccess(count), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceDisablePeerAccess(1), cudaSuccess);
    EXPECT_RT(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
    /* Access is unidirectional and per current device. */
    EXPECT_RT(cudaDeviceEnablePeerAccess(2, 0), cudaSuccess);
    MUST_RT(cudaSetDevice(2));
    EXPECT_RT(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    EXPECT_RT(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
    cudaGetLastError();

    /* Peer copies: 0 -> 1 synchronously, 1 -> 2 asynchronously on a stream of device 2. */
    void *d0 = NULL, *d1 = NULL, *d2 = NULL;
    MUST_RT(cudaSetDevice(0));
    MUST_RT(cudaMalloc(&d0, N));
    MUST_RT(cudaMemcpy(d0, src, N, cudaMemcpyHostToDevice));
    MUST_RT(cudaSetDevice(1));
    MUST_RT(cudaMalloc(&d1, N));
    MUST_RT(cudaMemset(d1, 0, N));
    MUST_RT(cudaSetDevice(2));
    MUST_RT(cudaMalloc(&d2, N));
    MUST_RT(cudaMemset(d2, 0, N));

    EXPECT_RT(cudaMemcpyPeer(d1, 1, d0, 0, N), cudaSuccess);
    memset(back, 0, N);
    MUST_RT(cudaMemcpy(back, d1, N, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(back, src, N), "cudaMemcpyPeer 0 -> 1 copied %d bytes", N);

    cudaStream_t s;
    MUST_RT(cudaStreamCreate(&s));
    EXPECT_RT(cudaMemcpyPeerAsync(d2, 2, d1, 1, N, s), cudaSuccess);
    EXPECT_RT(cudaStreamSynchronize(s), cudaSuccess);
    memset(back, 0, N);
    MUST_RT(cudaMemcpy(back, d2, N, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(back, src, N), "cudaMemcpyPeerAsync 1 -> 2 copied %d bytes", N);

    EXPECT_RT(cudaMemcpyPeer(d1, count, d0, 0, N), cudaErrorInvalidDevice);
    EXPECT_RT(cudaMemcpyPeer(d1, 1, d0, -1, N), cudaErrorInvalidDevice);
    EXPECT_RT(cudaMemcpyPeerAsync(d1, 1, d0, count, N, s), cudaErrorInvalidDevice);
    EXPECT_RT(cudaStreamDestroy(s), cudaSuccess);
    cudaGetLastError();

    MUST_RT(cudaFree(d2));
    MUST_RT(cudaSetDevice(1));
    MUST_RT(cudaFree(d1));
    MUST_RT(cudaSetDevice(0));
    MUST_RT(cudaFree(d0));
    return rt_done("fake_rt_peer");
}

/* mixed_calls: one process with both runtime majors, each caller bound to its own.
 *
 * Why it exists: a cu12 program that dlopen()s (RTLD_LOCAL) a library linked against
 * libcudart.so.13 (PyTorch cu13 beside CuPy cu12), and the reverse. Each side's references
 * carry its version node (cudaSetDevice@libcudart.so.12 / @libcudart.so.13), so without an
 * interposer each call reaches its own runtime; the fake runtimes log which one received
 * it (`libcudart.so.<major>` first in each argument-log line). An interposer that holds one
 * real-function slot per name sends one side's calls to the other runtime.
 *
 * Built four times (c-tests/Makefile): mixed_main12 / mixed_main13 (this file with
 * MIXED_MAIN, against the 12.9 / 13.x headers and libcudart.so.12 / .13) and libmixed12.so
 * / libmixed13.so (the library). Usage: mixed_main<NN> <path of the other major's library>.
 * The program's own calls use device 0 and look up "cuInit"; the library's use device 1 and
 * "cuDeviceGet", so the log shows whose call reached which runtime. Every call prints
 * `expect ...` (include/arglog_expect.h) and `rc ...`. With a second argument `peer`, each
 * side also asks cudaDeviceEnablePeerAccess for the other device: the guard checks it
 * against the current device, which it asks the caller's own runtime for (cudaGetDevice,
 * logged by the fake runtimes).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "arglog_expect.h"

#define MAJOR (CUDART_VERSION / 1000)

static void hex(char *out, const void *bytes, size_t n)
{
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

__attribute__((visibility("default"))) int mixed_calls(int device, const char *entry, int peer)
{
    printf("side libcudart.so.%d device=%d entry=%s\n", MAJOR, device, entry);
    EXPECT_LOG(MAJOR, "cudaSetDevice", "device=%d", device);
    REPORT_RC("cudaSetDevice", cudaSetDevice(device));

    void *buf = NULL;
    cudaError_t e = cudaMalloc(&buf, 1 << 16);
    if (e != cudaSuccess) {
        fprintf(stderr, "mixed_calls (libcudart.so.%d): cudaMalloc: %d\n", MAJOR, (int)e);
        return 1;
    }
    cudaIpcMemHandle_t h;
    memset(&h, 0, sizeof h);
    EXPECT_LOG(MAJOR, "cudaIpcGetMemHandle", "handle=%p devPtr=%p", (void *)&h, buf);
    REPORT_RC("cudaIpcGetMemHandle", cudaIpcGetMemHandle(&h, buf));
    void *opened = NULL;
    char hx[2 * sizeof h.reserved + 1];
    hex(hx, h.reserved, sizeof h.reserved);
    EXPECT_LOG(MAJOR, "cudaIpcOpenMemHandle", "devPtr=%p handle={reserved=%s} flags=%u",
               (void *)&opened, hx, (unsigned)cudaIpcMemLazyEnablePeerAccess);
    REPORT_RC("cudaIpcOpenMemHandle",
              cudaIpcOpenMemHandle(&opened, h, cudaIpcMemLazyEnablePeerAccess));

    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    EXPECT_LOG(MAJOR, "cudaGetDriverEntryPoint", "symbol=%s funcPtr=%p flags=%llu driverStatus=%p",
               entry, (void *)&fn, (unsigned long long)cudaEnableDefault, (void *)&st);
    /* Deprecated in 13.x (cudaGetDriverEntryPointByVersion replaces it) but exported and
     * guarded: old code still calls it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    REPORT_RC("cudaGetDriverEntryPoint", cudaGetDriverEntryPoint(entry, &fn, cudaEnableDefault, &st));
#pragma GCC diagnostic pop
    printf("entry %s found=%d status=%d\n", entry, fn != NULL, (int)st);
    if (peer) {
        EXPECT_LOG(MAJOR, "cudaDeviceEnablePeerAccess", "peerDevice=%d flags=%u", 1 - device, 0u);
        REPORT_RC("cudaDeviceEnablePeerAccess", cudaDeviceEnablePeerAccess(1 - device, 0));
    }
    return 0;
}

#ifdef MIXED_MAIN
int main(int argc, char **argv)
{
    if (argc != 2 && !(argc == 3 && !strcmp(argv[2], "peer"))) {
        fprintf(stderr, "usage: mixed_main%d <libmixedNN.so of the other major> [peer]\n", MAJOR);
        return 2;
    }
    int peer = argc == 3;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mixed_calls(0, "cuInit", peer))
        return 1;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "mixed_main: dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    int (*other)(int, const char *, int) = (int (*)(int, const char *, int))dlsym(lib, "mixed_calls");
    if (!other) {
        fprintf(stderr, "mixed_main: dlsym mixed_calls: %s\n", dlerror());
        return 1;
    }
    return other(1, "cuDeviceGet", peer);
}
#endif

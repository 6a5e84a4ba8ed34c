/* guard_dlsym13 HOW: a CUDA 13 program that finds cudaMemPrefetchAsync by dlsym instead of
 * a linked reference, and prefetches a managed buffer to device 0, the host and device 1 on
 * a created stream (argument log format of include/arglog_expect.h).
 *   handle   dlsym(dlopen("libcudart.so.13", RTLD_NOLOAD), ...): the runtime's own handle
 *   default  dlsym(RTLD_DEFAULT, ...)
 *   next     dlsym(RTLD_NEXT, ...)
 * Under the guard each must hand out the wrapper with CUDA 13's parameters, calling the
 * 13 runtime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "arglog_expect.h"

typedef cudaError_t (*prefetch13)(const void *, size_t, struct cudaMemLocation, unsigned int,
                                  cudaStream_t);

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: guard_dlsym13 handle|default|next\n"); return 3; }
    void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    if (!h) { printf("setup failed: libcudart.so.13 not loaded\n"); return 2; }
    void *where; /* RTLD_DEFAULT is NULL */
    if (!strcmp(argv[1], "handle")) where = h;
    else if (!strcmp(argv[1], "default")) where = RTLD_DEFAULT;
    else if (!strcmp(argv[1], "next")) where = RTLD_NEXT;
    else { fprintf(stderr, "guard_dlsym13: unknown %s\n", argv[1]); return 3; }
    prefetch13 f = (prefetch13)dlsym(where, "cudaMemPrefetchAsync");
    if (!f) { printf("setup failed: dlsym: %s\n", dlerror()); return 2; }
    void *p = NULL;
    cudaStream_t s = NULL;
    if (cudaMallocManaged(&p, 4096, cudaMemAttachGlobal) || cudaStreamCreate(&s)) {
        printf("setup failed: cudaMallocManaged/cudaStreamCreate\n");
        return 2;
    }
    const struct cudaMemLocation locs[] = {
        { .type = cudaMemLocationTypeDevice, .id = 0 },
        { .type = cudaMemLocationTypeHost, .id = 0 },
        { .type = cudaMemLocationTypeDevice, .id = 1 },
    };
    for (size_t i = 0; i < sizeof locs / sizeof locs[0]; i++) {
        EXPECT_LOG(13, "cudaMemPrefetchAsync", "devPtr=%p count=%zu location=" LOC_FMT
                   " flags=%u stream=%p", p, (size_t)4096, LOC_ARGS(locs[i]), 0u, (void *)s);
        REPORT_RC("cudaMemPrefetchAsync", f(p, 4096, locs[i], 0, s));
    }
    return 0;
}

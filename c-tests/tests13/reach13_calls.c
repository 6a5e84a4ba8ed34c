/* reach13_calls: one CUDA 13 runtime call that reaches a device by location or ordinal,
 * made by a program linked against libcudart.so.13 (link) or through dlopen + dlsym of
 * that library (dlsym). Driven by python-tests/test_guard_coverage.py.
 *
 *   reach13_calls link|dlsym CALL ORDINAL
 *
 * CALL may be a per-thread ABI name (`cudaMemPrefetchBatchAsync_ptsz`): that symbol is called.
 * Prints "setup ok" then "rc=<code>"; exit 2 on a setup failure, 3 on bad arguments. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int use_dlsym;
static void *hrt;

/* Per-thread-stream exports, which cuda_runtime_api.h names only under
 * CUDA_API_PER_THREAD_DEFAULT_STREAM (the same parameters as the legacy ones). */
extern cudaError_t cudaMemPrefetchBatchAsync_ptsz(
    void **dptrs, size_t *sizes, size_t count, struct cudaMemLocation *prefetchLocs,
    size_t *prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, cudaStream_t stream);

_Static_assert(__builtin_types_compatible_p(__typeof__(&cudaMemPrefetchBatchAsync_ptsz),
                                            __typeof__(&cudaMemPrefetchBatchAsync)),
               "the per-thread export has the header's parameters");

#define LINKED(n) {#n, (void *)n}
static const struct { const char *name; void *fn; } linked[] = {
    LINKED(cudaMemGetDefaultMemPool), LINKED(cudaMemGetMemPool), LINKED(cudaMemSetMemPool),
    LINKED(cudaDeviceGetDevResource), LINKED(cudaDevResourceGenerateDesc),
    LINKED(cudaGreenCtxCreate), LINKED(cudaDeviceGetExecutionCtx),
    LINKED(cudaMemPrefetchBatchAsync), LINKED(cudaMemPrefetchBatchAsync_ptsz),
    LINKED(cudaMallocManaged),
};

static void *fn(const char *name)
{
    if (use_dlsym) {
        void *p = dlsym(hrt, name);
        if (!p) {
            printf("setup failed: dlsym %s\n", name);
            exit(2);
        }
        return p;
    }
    for (size_t i = 0; i < sizeof linked / sizeof linked[0]; i++)
        if (!strcmp(linked[i].name, name))
            return linked[i].fn;
    fprintf(stderr, "reach13_calls: %s is not linked\n", name);
    exit(3);
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "link") && strcmp(argv[1], "dlsym"))) {
        fprintf(stderr, "usage: reach13_calls link|dlsym CALL ORDINAL\n");
        return 3;
    }
    use_dlsym = !strcmp(argv[1], "dlsym");
    if (use_dlsym && !(hrt = dlopen("libcudart.so.13", RTLD_NOW))) {
        printf("setup failed: dlopen libcudart.so.13: %s\n", dlerror());
        return 2;
    }
    const char *call = argv[2];
    int ord = atoi(argv[3]);
    struct cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = cudaMemLocationTypeDevice;
    loc.id = ord;
    cudaError_t rc;
    if (!strcmp(call, "cudaMemGetDefaultMemPool") || !strcmp(call, "cudaMemGetMemPool")) {
        cudaMemPool_t pool;
        printf("setup ok\n");
        rc = ((cudaError_t(*)(cudaMemPool_t *, struct cudaMemLocation *, enum cudaMemAllocationType))fn(call))(
            &pool, &loc, cudaMemAllocationTypePinned);
    } else if (!strcmp(call, "cudaMemSetMemPool")) {
        /* device 0's default pool, set as the pool of device ORD */
        cudaMemPool_t pool;
        struct cudaMemLocation l0 = loc;
        l0.id = 0;
        if (((cudaError_t(*)(cudaMemPool_t *, struct cudaMemLocation *, enum cudaMemAllocationType))fn(
                "cudaMemGetDefaultMemPool"))(&pool, &l0, cudaMemAllocationTypePinned)) {
            printf("setup failed: cudaMemGetDefaultMemPool\n");
            return 2;
        }
        printf("setup ok\n");
        rc = ((cudaError_t(*)(struct cudaMemLocation *, enum cudaMemAllocationType, cudaMemPool_t))fn(call))(
            &loc, cudaMemAllocationTypePinned, pool);
    } else if (!strcmp(call, "cudaDeviceGetDevResource")) {
        cudaDevResource res;
        printf("setup ok\n");
        rc = ((cudaError_t(*)(int, cudaDevResource *, enum cudaDevResourceType))fn(call))(ord, &res, cudaDevResourceTypeSm);
    } else if (!strcmp(call, "cudaGreenCtxCreate")) {
        /* device 0's SMs for a green context on device ORD */
        cudaDevResource res;
        cudaDevResourceDesc_t desc;
        if (((cudaError_t(*)(int, cudaDevResource *, enum cudaDevResourceType))fn("cudaDeviceGetDevResource"))(0, &res, cudaDevResourceTypeSm) ||
            ((cudaError_t(*)(cudaDevResourceDesc_t *, cudaDevResource *, unsigned))fn("cudaDevResourceGenerateDesc"))(&desc, &res, 1)) {
            printf("setup failed: device 0's resources\n");
            return 2;
        }
        cudaExecutionContext_t ctx;
        printf("setup ok\n");
        rc = ((cudaError_t(*)(cudaExecutionContext_t *, cudaDevResourceDesc_t, int, unsigned))fn(call))(&ctx, desc, ord, 0);
    } else if (!strcmp(call, "cudaDeviceGetExecutionCtx")) {
        cudaExecutionContext_t ctx;
        printf("setup ok\n");
        rc = ((cudaError_t(*)(cudaExecutionContext_t *, int))fn(call))(&ctx, ord);
    } else if (!strcmp(call, "cudaMemPrefetchBatchAsync") || !strcmp(call, "cudaMemPrefetchBatchAsync_ptsz")) {
        void *p[2];
        for (int i = 0; i < 2; i++)
            if (((cudaError_t(*)(void **, size_t, unsigned))fn("cudaMallocManaged"))(&p[i], 4096, cudaMemAttachGlobal)) {
                printf("setup failed: cudaMallocManaged\n");
                return 2;
            }
        size_t sizes[2] = {4096, 4096}, idx[2] = {0, 1};
        struct cudaMemLocation locs[2];
        memset(locs, 0, sizeof locs);
        locs[0].type = locs[1].type = cudaMemLocationTypeDevice;
        locs[1].id = ord;
        printf("setup ok\n");
        rc = ((cudaError_t(*)(void **, size_t *, size_t, struct cudaMemLocation *, size_t *, size_t,
                              unsigned long long, cudaStream_t))fn(call))(p, sizes, 2, locs, idx, 2, 0, NULL);
    } else {
        fprintf(stderr, "reach13_calls: unknown call %s\n", call);
        return 3;
    }
    printf("rc=%d\n", (int)rc);
    return 0;
}

/* cu13_calls: a CUDA 13 program (compiled against the 13.x headers, linked against
 * libcudart.so.13) making the calls whose signature differs from CUDA 12.
 *
 * Why it exists: an interposer that declares a runtime function with the 12.9 signature
 * corrupts a CUDA 13 caller's arguments (cudaMemPrefetchAsync's location read as a
 * device, the stream lost). Each call below prints what it passes (`expect ...`, the
 * argument-log format of include/arglog_expect.h) and its result (`rc ...`); the tests
 * compare that with the fake runtime's log, with and without the guard.
 *
 * Usage: cu13_calls basic|prefetch|sigdiff|props|all
 *   basic     cudaRuntimeGetVersion (printed) and cudaSetDevice(1);
 *   prefetch  cudaMemPrefetchAsync of a managed buffer to device 0, the host, device 1,
 *             on a created stream (and the _ptsz export, to device 0);
 *   sigdiff   every other runtime function whose signature or exported name differs
 *             between 12.9 and 13.x (fake/runtime/gen_sigdiff.py lists them; the test
 *             checks this covers the list), with distinct arguments;
 *   props     cudaGetDeviceProperties(prop, 1) and (prop, 0).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "arglog_expect.h"

#if CUDART_VERSION < 13000
#error "cu13_calls is compiled against the 13.x headers (c-tests/build/cuda13-include)"
#endif

/* The _ptsz export a per-thread-default-stream build of a CUDA 13 program references. */
extern cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count,
                                             struct cudaMemLocation location, unsigned int flags,
                                             cudaStream_t stream);

/* The major of the runtime it is linked against: 13, or 14 for cu14_calls (the same
 * program linked against the stand-in libcudart.so.14). */
#ifndef FAKE_MAJOR
#define FAKE_MAJOR 13
#endif
#define MAJOR FAKE_MAJOR

static cudaStream_t make_stream(void)
{
    cudaStream_t s = NULL;
    cudaError_t e = cudaStreamCreate(&s);
    if (e != cudaSuccess || !s) {
        fprintf(stderr, "cu13_calls: cudaStreamCreate: %d\n", (int)e);
        exit(1);
    }
    return s;
}

static void basic(void)
{
    int v = 0;
    cudaError_t e = cudaRuntimeGetVersion(&v);
    printf("runtime %d %d\n", (int)e, v);
    EXPECT_LOG(MAJOR, "cudaSetDevice", "device=%d", 1);
    REPORT_RC("cudaSetDevice", cudaSetDevice(1));
}

static void prefetch(void)
{
    void *p = NULL;
    cudaError_t e = cudaMallocManaged(&p, 4096, cudaMemAttachGlobal);
    if (e != cudaSuccess) {
        fprintf(stderr, "cu13_calls: cudaMallocManaged: %d\n", (int)e);
        exit(1);
    }
    cudaStream_t s = make_stream();
    const struct cudaMemLocation locs[] = {
        { .type = cudaMemLocationTypeDevice, .id = 0 },
        { .type = cudaMemLocationTypeHost, .id = 0 },
        { .type = cudaMemLocationTypeDevice, .id = 1 },
    };
    for (size_t i = 0; i < sizeof locs / sizeof locs[0]; i++) {
        EXPECT_LOG(MAJOR, "cudaMemPrefetchAsync", "devPtr=%p count=%zu location=" LOC_FMT
                   " flags=%u stream=%p", p, (size_t)4096, LOC_ARGS(locs[i]), 0u, (void *)s);
        REPORT_RC("cudaMemPrefetchAsync", cudaMemPrefetchAsync(p, 4096, locs[i], 0, s));
    }
    EXPECT_LOG(MAJOR, "cudaMemPrefetchAsync_ptsz", "devPtr=%p count=%zu location=" LOC_FMT
               " flags=%u stream=%p", p, (size_t)2048, LOC_ARGS(locs[0]), 0u, (void *)s);
    REPORT_RC("cudaMemPrefetchAsync_ptsz", cudaMemPrefetchAsync_ptsz(p, 2048, locs[0], 0, s));
}

static void props(void)
{
    static struct cudaDeviceProp prop;
    for (int dev = 1; dev >= 0; dev--) {
        memset(&prop, 0, sizeof prop);
        EXPECT_LOG(MAJOR, "cudaGetDeviceProperties", "prop=%p device=%d", (void *)&prop, dev);
        cudaError_t e = cudaGetDeviceProperties(&prop, dev);
        REPORT_RC("cudaGetDeviceProperties", e);
        if (e == cudaSuccess)
            printf("props %d name=%s uuid0=%02x\n", dev, prop.name, (unsigned char)prop.uuid.bytes[0]);
    }
}

/* Distinct, valid addresses for the arguments the stubs only record. */
static char arena[16][64];
#define A(i) ((void *)arena[i])

static void sigdiff(void)
{
    void *p = NULL;
    if (cudaMallocManaged(&p, 8192, cudaMemAttachGlobal) != cudaSuccess)
        exit(1);
    cudaStream_t s = make_stream();
    /* device 0: the guarded runs compare every argument in enforce mode too (denials of
     * another device: test_guard_copies.py) */
    const struct cudaMemLocation dev0 = { .type = cudaMemLocationTypeDevice, .id = 0 };
    cudaGraph_t graph = A(0);
    cudaGraphNode_t node = A(1);

    EXPECT_LOG(MAJOR, "cudaMemAdvise", "devPtr=%p count=%zu advice=%d location=" LOC_FMT,
               p, (size_t)8192, (int)cudaMemAdviseSetPreferredLocation, LOC_ARGS(dev0));
    REPORT_RC("cudaMemAdvise", cudaMemAdvise(p, 8192, cudaMemAdviseSetPreferredLocation, dev0));

    EXPECT_LOG(MAJOR, "cudaMemcpyBatchAsync", "dsts=%p srcs=%p sizes=%p count=%zu attrs=%p "
               "attrsIdxs=%p numAttrs=%zu stream=%p", A(2), A(3), A(4), (size_t)3, A(5), A(6),
               (size_t)1, (void *)s);
    REPORT_RC("cudaMemcpyBatchAsync", cudaMemcpyBatchAsync(A(2), A(3), A(4), 3, A(5), A(6), 1, s));

    EXPECT_LOG(MAJOR, "cudaMemcpy3DBatchAsync", "numOps=%zu opList=%p flags=%llu stream=%p",
               (size_t)2, A(7), 5ull, (void *)s);
    REPORT_RC("cudaMemcpy3DBatchAsync", cudaMemcpy3DBatchAsync(2, A(7), 5, s));

    EXPECT_LOG(MAJOR, "cudaGraphAddNode", "pGraphNode=%p graph=%p pDependencies=%p "
               "dependencyData=%p numDependencies=%zu nodeParams=%p", A(8), (void *)graph,
               A(9), A(10), (size_t)4, A(11));
    REPORT_RC("cudaGraphAddNode", cudaGraphAddNode(A(8), graph, A(9), A(10), 4, A(11)));

    EXPECT_LOG(MAJOR, "cudaGraphAddDependencies", "graph=%p from=%p to=%p edgeData=%p "
               "numDependencies=%zu", (void *)graph, A(9), A(10), A(11), (size_t)5);
    REPORT_RC("cudaGraphAddDependencies", cudaGraphAddDependencies(graph, A(9), A(10), A(11), 5));

    EXPECT_LOG(MAJOR, "cudaGraphRemoveDependencies", "graph=%p from=%p to=%p edgeData=%p "
               "numDependencies=%zu", (void *)graph, A(10), A(9), A(11), (size_t)6);
    REPORT_RC("cudaGraphRemoveDependencies", cudaGraphRemoveDependencies(graph, A(10), A(9), A(11), 6));

    EXPECT_LOG(MAJOR, "cudaGraphGetEdges", "graph=%p from=%p to=%p edgeData=%p numEdges=%p",
               (void *)graph, A(12), A(13), A(14), A(15));
    REPORT_RC("cudaGraphGetEdges", cudaGraphGetEdges(graph, A(12), A(13), A(14), A(15)));

    EXPECT_LOG(MAJOR, "cudaGraphNodeGetDependencies", "node=%p pDependencies=%p edgeData=%p "
               "pNumDependencies=%p", (void *)node, A(12), A(14), A(15));
    REPORT_RC("cudaGraphNodeGetDependencies", cudaGraphNodeGetDependencies(node, A(12), A(14), A(15)));

    EXPECT_LOG(MAJOR, "cudaGraphNodeGetDependentNodes", "node=%p pDependentNodes=%p edgeData=%p "
               "pNumDependentNodes=%p", (void *)node, A(13), A(14), A(15));
    REPORT_RC("cudaGraphNodeGetDependentNodes",
              cudaGraphNodeGetDependentNodes(node, A(13), A(14), A(15)));

    EXPECT_LOG(MAJOR, "cudaStreamGetCaptureInfo", "stream=%p captureStatus_out=%p id_out=%p "
               "graph_out=%p dependencies_out=%p edgeData_out=%p numDependencies_out=%p",
               (void *)s, A(2), A(3), A(4), A(5), A(6), A(7));
    REPORT_RC("cudaStreamGetCaptureInfo",
              cudaStreamGetCaptureInfo(s, A(2), A(3), A(4), A(5), A(6), A(7)));

    EXPECT_LOG(MAJOR, "cudaStreamUpdateCaptureDependencies", "stream=%p dependencies=%p "
               "dependencyData=%p numDependencies=%zu flags=%u", (void *)s, A(8), A(9),
               (size_t)7, 1u);
    REPORT_RC("cudaStreamUpdateCaptureDependencies",
              cudaStreamUpdateCaptureDependencies(s, A(8), A(9), 7, 1));

    EXPECT_LOG(MAJOR, "cudaSignalExternalSemaphoresAsync", "extSemArray=%p paramsArray=%p "
               "numExtSems=%u stream=%p", A(10), A(11), 2u, (void *)s);
    REPORT_RC("cudaSignalExternalSemaphoresAsync",
              cudaSignalExternalSemaphoresAsync(A(10), A(11), 2, s));

    EXPECT_LOG(MAJOR, "cudaWaitExternalSemaphoresAsync", "extSemArray=%p paramsArray=%p "
               "numExtSems=%u stream=%p", A(12), A(13), 3u, (void *)s);
    REPORT_RC("cudaWaitExternalSemaphoresAsync",
              cudaWaitExternalSemaphoresAsync(A(12), A(13), 3, s));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: cu13_calls basic|prefetch|sigdiff|props|all\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *m = argv[1];
    int all = !strcmp(m, "all");
    if (all || !strcmp(m, "basic"))
        basic();
    if (all || !strcmp(m, "prefetch"))
        prefetch();
    if (all || !strcmp(m, "sigdiff"))
        sigdiff();
    if (all || !strcmp(m, "props"))
        props();
    if (!all && strcmp(m, "basic") && strcmp(m, "prefetch") && strcmp(m, "sigdiff") && strcmp(m, "props")) {
        fprintf(stderr, "cu13_calls: unknown mode %s\n", m);
        return 2;
    }
    return 0;
}

/* cudart_copies.c: the runtime calls whose parameters differ between the majors and that
 * name a device or a location: memory advice (12: `int device`, and 12's cudaMemAdvise_v2;
 * 13: a location), batch and attribute copies (12.8's with `failIdx`, 13 without; 13.2's
 * cudaMemcpy(3D)WithAttributesAsync) and the generic graph node (12: five parameters, 13:
 * six). Each replaces the recording stub gen_sigdiff.py generates for it (same log line),
 * records what it received (FAKECUDA_ARGLOG) and reaches the driver through the entry point
 * of its major's ABI, fetched once (legacy and per-thread for the stream-ordered copies).
 *
 * RT-copy (the docs are silent): the runtime's copy attributes and operations have the
 * driver's layout and this runtime's ordinals are the driver's, so they are passed on as
 * the caller gave them; the driver validates the location hints (c-tests/README.md,
 * D-copyhint; nothing is converted, so a batch has no size limit here). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cudart_internal.h"

#define TRY(expr) do { cudaError_t e_ = (expr); if (e_ != cudaSuccess) return rt_ret(e_); } while (0)
#define NEED(fn) do { if (!(fn)) return rt_ret(cudaErrorCallRequiresNewerDriver); } while (0)
#define DRIVER(call) return rt_ret(rt_map(call))

_Static_assert(sizeof(struct cudaMemcpyAttributes) == sizeof(CUmemcpyAttributes) &&
               offsetof(struct cudaMemcpyAttributes, dstLocHint) == offsetof(CUmemcpyAttributes, dstLocHint),
               "copy attributes: the driver's layout");
_Static_assert(sizeof(struct cudaMemcpy3DBatchOp) == sizeof(CUDA_MEMCPY3D_BATCH_OP) &&
               offsetof(struct cudaMemcpy3DBatchOp, dst.op.ptr.locHint) ==
                   offsetof(CUDA_MEMCPY3D_BATCH_OP, dst.op.ptr.locHint),
               "3D batch operation: the driver's layout");
_Static_assert(sizeof(struct cudaGraphNodeParams) == sizeof(CUgraphNodeParams), "graph node parameters");

#if CUDART_VERSION >= 13000
typedef PFN_cuMemcpyBatchAsync_v13000 batch_fn;
typedef PFN_cuMemcpy3DBatchAsync_v13000 batch3d_fn;
typedef PFN_cuGraphAddNode_v12030 add_node_fn;
#define BATCH_VERSION 13000
#define ADD_NODE_VERSION 12030
#else
typedef PFN_cuMemcpyBatchAsync_v12080 batch_fn;
typedef PFN_cuMemcpy3DBatchAsync_v12080 batch3d_fn;
typedef PFN_cuGraphAddNode_v12020 add_node_fn;
#define BATCH_VERSION 12080
#define ADD_NODE_VERSION 12020
#endif

static struct {
    PFN_cuMemAdvise_v8000 advise;
    PFN_cuMemAdvise_v12020 adviseLocation;
    add_node_fn addNode;
    batch_fn batch[2];                 /* legacy, per-thread */
    batch3d_fn batch3d[2];
#if CUDART_VERSION >= 13000
    PFN_cuMemcpyWithAttributesAsync_v13020 withAttributes[2];
    PFN_cuMemcpy3DWithAttributesAsync_v13020 withAttributes3d[2];
#endif
} cp;

static void *entry(const char *name, int version, cuuint64_t flags)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (rt_get_proc_address(name, &fn, version, flags, &st) != CUDA_SUCCESS ||
        st != CU_GET_PROC_ADDRESS_SUCCESS)
        return NULL;                                 /* RT-missing */
    return fn;
}

static pthread_once_t fetched = PTHREAD_ONCE_INIT;

static void fetch_copies(void)
{
    cp.advise = (PFN_cuMemAdvise_v8000)entry("cuMemAdvise", 8000, RT_FLAGS_LEGACY);
    cp.adviseLocation = (PFN_cuMemAdvise_v12020)entry("cuMemAdvise", 12020, RT_FLAGS_LEGACY);
    cp.addNode = (add_node_fn)entry("cuGraphAddNode", ADD_NODE_VERSION, RT_FLAGS_LEGACY);
    const cuuint64_t fl[2] = {RT_FLAGS_LEGACY, RT_FLAGS_PER_THREAD};
    for (int i = 0; i < 2; i++) {
        cp.batch[i] = (batch_fn)entry("cuMemcpyBatchAsync", BATCH_VERSION, fl[i]);
        cp.batch3d[i] = (batch3d_fn)entry("cuMemcpy3DBatchAsync", BATCH_VERSION, fl[i]);
#if CUDART_VERSION >= 13000
        cp.withAttributes[i] = (PFN_cuMemcpyWithAttributesAsync_v13020)entry(
            "cuMemcpyWithAttributesAsync", 13020, fl[i]);
        cp.withAttributes3d[i] = (PFN_cuMemcpy3DWithAttributesAsync_v13020)entry(
            "cuMemcpy3DWithAttributesAsync", 13020, fl[i]);
#endif
    }
}

/* The driver loaded and initialised, the entry points fetched, the current device's
 * primary context current (copies and advice need one). */
static cudaError_t ready(void)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    pthread_once(&fetched, fetch_copies);
    return rt_bind();
}

/* ---- memory advice ------------------------------------------------------------------ */

static cudaError_t advise_at(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                             struct cudaMemLocation location)
{
    TRY(ready());
    NEED(cp.adviseLocation);
    /* cudaMemoryAdvise and cudaMemLocationType values equal the driver's. */
    CUmemLocation l = {.type = (CUmemLocationType)location.type, .id = location.id};
    DRIVER(cp.adviseLocation((CUdeviceptr)(uintptr_t)devPtr, count, (CUmem_advise)advice, l));
}

#if CUDART_VERSION >= 13000
RT_EXPORT cudaError_t cudaMemAdvise(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                                    struct cudaMemLocation location)
{
    RT_LOG("cudaMemAdvise", "devPtr=%p count=%zu advice=%d location=" RT_LOC_FMT, devPtr, count,
           (int)advice, RT_LOC_ARGS(location));
    return advise_at(devPtr, count, advice, location);
}
#else
RT_EXPORT cudaError_t cudaMemAdvise(const void *devPtr, size_t count, enum cudaMemoryAdvise advice, int device)
{
    RT_LOG("cudaMemAdvise", "devPtr=%p count=%zu advice=%d device=%d", devPtr, count, (int)advice, device);
    TRY(ready());
    NEED(cp.advise);
    /* device: an ordinal, or cudaCpuDeviceId (-1) = CU_DEVICE_CPU (the same number) */
    DRIVER(cp.advise((CUdeviceptr)(uintptr_t)devPtr, count, (CUmem_advise)advice, (CUdevice)device));
}

RT_EXPORT cudaError_t cudaMemAdvise_v2(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                                       struct cudaMemLocation location)
{
    RT_LOG("cudaMemAdvise_v2", "devPtr=%p count=%zu advice=%d location=" RT_LOC_FMT, devPtr, count,
           (int)advice, RT_LOC_ARGS(location));
    return advise_at(devPtr, count, advice, location);
}
#endif

/* ---- batch and attribute copies ------------------------------------------------------ */

#if CUDART_VERSION >= 13000
#define BATCH_PARAMS(dsts, srcs, sizes) \
    void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count, \
    struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, cudaStream_t stream
#define BATCH_FAIL_FMT ""
#define BATCH_FAIL_ARG
#define BATCH_FAIL_PASS
#define BATCH3D_PARAMS size_t numOps, struct cudaMemcpy3DBatchOp *opList, unsigned long long flags, \
    cudaStream_t stream
#else
#define BATCH_PARAMS(dsts, srcs, sizes) \
    void **dsts, void **srcs, size_t *sizes, size_t count, struct cudaMemcpyAttributes *attrs, \
    size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, cudaStream_t stream
#define BATCH_FAIL_FMT " failIdx=%p"
#define BATCH_FAIL_ARG , (const void *)failIdx
#define BATCH_FAIL_PASS failIdx,
#define BATCH3D_PARAMS size_t numOps, struct cudaMemcpy3DBatchOp *opList, size_t *failIdx, \
    unsigned long long flags, cudaStream_t stream
#endif

#define BATCH_BODY(sym, pt)                                                                   \
    RT_LOG(sym, "dsts=%p srcs=%p sizes=%p count=%zu attrs=%p attrsIdxs=%p numAttrs=%zu"       \
           BATCH_FAIL_FMT " stream=%p", (const void *)dsts, (const void *)srcs,               \
           (const void *)sizes, count, (const void *)attrs, (const void *)attrsIdxs, numAttrs \
           BATCH_FAIL_ARG, (const void *)stream);                                             \
    TRY(ready());                                                                             \
    NEED(cp.batch[pt]);                                                                       \
    DRIVER(cp.batch[pt]((CUdeviceptr *)dsts, (CUdeviceptr *)srcs, (size_t *)sizes, count,     \
                        (CUmemcpyAttributes *)attrs, attrsIdxs, numAttrs, BATCH_FAIL_PASS     \
                        (CUstream)stream))

RT_EXPORT cudaError_t cudaMemcpyBatchAsync(BATCH_PARAMS(dsts, srcs, sizes))
{
    BATCH_BODY("cudaMemcpyBatchAsync", 0);
}
RT_EXPORT cudaError_t cudaMemcpyBatchAsync_ptsz(BATCH_PARAMS(dsts, srcs, sizes));
RT_EXPORT cudaError_t cudaMemcpyBatchAsync_ptsz(BATCH_PARAMS(dsts, srcs, sizes))
{
    BATCH_BODY("cudaMemcpyBatchAsync_ptsz", 1);
}

#define BATCH3D_BODY(sym, pt)                                                                 \
    RT_LOG(sym, "numOps=%zu opList=%p" BATCH_FAIL_FMT " flags=%llu stream=%p", numOps,        \
           (const void *)opList BATCH_FAIL_ARG, flags, (const void *)stream);                 \
    TRY(ready());                                                                             \
    NEED(cp.batch3d[pt]);                                                                     \
    DRIVER(cp.batch3d[pt](numOps, (CUDA_MEMCPY3D_BATCH_OP *)opList, BATCH_FAIL_PASS flags,    \
                          (CUstream)stream))

RT_EXPORT cudaError_t cudaMemcpy3DBatchAsync(BATCH3D_PARAMS)
{
    BATCH3D_BODY("cudaMemcpy3DBatchAsync", 0);
}
RT_EXPORT cudaError_t cudaMemcpy3DBatchAsync_ptsz(BATCH3D_PARAMS);
RT_EXPORT cudaError_t cudaMemcpy3DBatchAsync_ptsz(BATCH3D_PARAMS)
{
    BATCH3D_BODY("cudaMemcpy3DBatchAsync_ptsz", 1);
}

#if CUDART_VERSION >= 13000
static cudaError_t with_attributes(int pt, void *dst, const void *src, size_t size,
                                   struct cudaMemcpyAttributes *attr, cudaStream_t stream)
{
    TRY(ready());
    NEED(cp.withAttributes[pt]);
    DRIVER(cp.withAttributes[pt]((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, size,
                                 (CUmemcpyAttributes *)attr, (CUstream)stream));
}
#define WITH_ATTRIBUTES_LOG(sym) \
    RT_LOG(sym, "dst=%p src=%p size=%zu attr=%p stream=%p", dst, src, size, (const void *)attr, \
           (const void *)stream)

RT_EXPORT cudaError_t cudaMemcpyWithAttributesAsync(void *dst, const void *src, size_t size,
                                                    struct cudaMemcpyAttributes *attr, cudaStream_t stream)
{
    WITH_ATTRIBUTES_LOG("cudaMemcpyWithAttributesAsync");
    return with_attributes(0, dst, src, size, attr, stream);
}
RT_EXPORT cudaError_t cudaMemcpyWithAttributesAsync_ptsz(void *dst, const void *src, size_t size,
                                                         struct cudaMemcpyAttributes *attr,
                                                         cudaStream_t stream);
RT_EXPORT cudaError_t cudaMemcpyWithAttributesAsync_ptsz(void *dst, const void *src, size_t size,
                                                         struct cudaMemcpyAttributes *attr,
                                                         cudaStream_t stream)
{
    WITH_ATTRIBUTES_LOG("cudaMemcpyWithAttributesAsync_ptsz");
    return with_attributes(1, dst, src, size, attr, stream);
}

static cudaError_t with_attributes_3d(int pt, struct cudaMemcpy3DBatchOp *op, unsigned long long flags,
                                      cudaStream_t stream)
{
    TRY(ready());
    NEED(cp.withAttributes3d[pt]);
    DRIVER(cp.withAttributes3d[pt]((CUDA_MEMCPY3D_BATCH_OP *)op, flags, (CUstream)stream));
}
#define WITH_ATTRIBUTES_3D_LOG(sym) \
    RT_LOG(sym, "op=%p flags=%llu stream=%p", (const void *)op, flags, (const void *)stream)

RT_EXPORT cudaError_t cudaMemcpy3DWithAttributesAsync(struct cudaMemcpy3DBatchOp *op, unsigned long long flags,
                                                      cudaStream_t stream)
{
    WITH_ATTRIBUTES_3D_LOG("cudaMemcpy3DWithAttributesAsync");
    return with_attributes_3d(0, op, flags, stream);
}
RT_EXPORT cudaError_t cudaMemcpy3DWithAttributesAsync_ptsz(struct cudaMemcpy3DBatchOp *op,
                                                           unsigned long long flags, cudaStream_t stream);
RT_EXPORT cudaError_t cudaMemcpy3DWithAttributesAsync_ptsz(struct cudaMemcpy3DBatchOp *op,
                                                           unsigned long long flags, cudaStream_t stream)
{
    WITH_ATTRIBUTES_3D_LOG("cudaMemcpy3DWithAttributesAsync_ptsz");
    return with_attributes_3d(1, op, flags, stream);
}
#endif

/* ---- the generic graph node ------------------------------------------------------------ */

#if CUDART_VERSION >= 13000
RT_EXPORT cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                       const cudaGraphNode_t *pDependencies,
                                       const cudaGraphEdgeData *dependencyData, size_t numDependencies,
                                       struct cudaGraphNodeParams *nodeParams)
{
    RT_LOG("cudaGraphAddNode", "pGraphNode=%p graph=%p pDependencies=%p dependencyData=%p "
           "numDependencies=%zu nodeParams=%p", (const void *)pGraphNode, (const void *)graph,
           (const void *)pDependencies, (const void *)dependencyData, numDependencies,
           (const void *)nodeParams);
    TRY(ready());
    NEED(cp.addNode);
    /* cudaGraphEdgeData has CUgraphEdgeData's layout (driver_types.h, cuda.h). */
    DRIVER(cp.addNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                      (const CUgraphEdgeData *)dependencyData, numDependencies,
                      (CUgraphNodeParams *)nodeParams));
}
#else
RT_EXPORT cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                       const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                       struct cudaGraphNodeParams *nodeParams)
{
    RT_LOG("cudaGraphAddNode", "pGraphNode=%p graph=%p pDependencies=%p numDependencies=%zu nodeParams=%p",
           (const void *)pGraphNode, (const void *)graph, (const void *)pDependencies, numDependencies,
           (const void *)nodeParams);
    TRY(ready());
    NEED(cp.addNode);
    DRIVER(cp.addNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                      numDependencies, (CUgraphNodeParams *)nodeParams));
}
#endif

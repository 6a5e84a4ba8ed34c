/* copies_calls.h: guard_call's batch and attribute copies, memory advice and the runtime's
 * generic graph node (issue 15's items 6 and 7), with their location hints naming device
 * ORDINAL. Included by tests/guard_call.c (which provides the paths: drv(), rt(), variant())
 * and so built twice: guard_call (12.9 headers, libcudart.so.12) and guard_call13 (13.x
 * headers, libcudart.so.13). The driver copies are made by guard_call13, whose 13.x headers
 * declare every variant (12.8's with failIdx, 13.0's without, 13.2's and 13.5's) and their
 * operand structs; guard_call makes 12.8's (its 12.9 headers have them) for the paths
 * through the CUDA 12 runtime. Driven by python-tests/test_guard_copies.py.
 *
 * Every copy moves bytes from a patterned managed buffer to a zeroed one; each source hint
 * is a host location with a non-zero id (never a device), the last destination hint is
 * {DEVICE, ORDINAL}, the others {DEVICE, 0}. Output after "setup ok": "rc=<code>" and
 * "copied=<1|0>" (the destination holds the source's bytes); runtime calls also print
 * "expect <line>" in the fake runtime's argument-log format (arglog_expect.h).
 * With COPIES_ATTRS_PAST_COUNT=1 in the environment, cu/cudaMemcpyBatchAsync pass one
 * attribute more than there are copies, naming device 1 (numAttrs > count: the driver
 * refuses it; the guard must not read past count).
 * copies_call() returns 0 when CALL is not one of these. */
#ifndef COPIES_CALLS_H
#define COPIES_CALLS_H

#include "arglog_expect.h"

#define COPY_BYTES 256
#define HOST_HINT_ID 7

static unsigned char *copies_src, *copies_dst;

static void copies_report(int rc)
{
    printf("rc=%d\ncopied=%d\n", rc, !memcmp(copies_src, copies_dst, COPY_BYTES));
}

/* How many attributes a 1D batch of 2 copies passes (3: one past count, naming device 1). */
static size_t copies_num_attrs(void)
{
    const char *e = getenv("COPIES_ATTRS_PAST_COUNT");
    return e && !strcmp(e, "1") ? 3 : 2;
}

static CUstream copies_stream;

static void copies_setup_driver(void)
{
    CUdeviceptr a, b;
    CHECK_SETUP(((PFN_cuMemAllocManaged_v6000)linked_fn("cuMemAllocManaged"))(&a, COPY_BYTES, CU_MEM_ATTACH_GLOBAL));
    CHECK_SETUP(((PFN_cuMemAllocManaged_v6000)linked_fn("cuMemAllocManaged"))(&b, COPY_BYTES, CU_MEM_ATTACH_GLOBAL));
    CHECK_SETUP(((PFN_cuStreamCreate_v2000)need(dlsym(hdrv, "cuStreamCreate"), "cuStreamCreate"))(&copies_stream, 0));
    copies_src = (unsigned char *)(uintptr_t)a;
    copies_dst = (unsigned char *)(uintptr_t)b;
    for (int i = 0; i < COPY_BYTES; i++) {
        copies_src[i] = (unsigned char)(i * 7 + 1);
        copies_dst[i] = 0;
    }
}

/* Location hints: the host (id ignored by the driver, not 0 here) and a device. */
#define HOST_HINT {.type = CU_MEM_LOCATION_TYPE_HOST, .id = HOST_HINT_ID}
#define DEVICE_HINT(d) {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (d)}

/* A pointer operand of a 3D copy. */
static CUmemcpy3DOperand copies_operand(unsigned char *p, CUmemLocation hint)
{
    CUmemcpy3DOperand o;
    memset(&o, 0, sizeof o);
    o.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    o.op.ptr.ptr = (CUdeviceptr)(uintptr_t)p;
    o.op.ptr.locHint = hint;
    return o;
}

static CUDA_MEMCPY3D_BATCH_OP copies_op(size_t off, int dst_device)
{
    CUDA_MEMCPY3D_BATCH_OP op;
    memset(&op, 0, sizeof op);
    op.src = copies_operand(copies_src + off, (CUmemLocation)HOST_HINT);
    op.dst = copies_operand(copies_dst + off, (CUmemLocation)DEVICE_HINT(dst_device));
    op.extent = (CUextent3D){16, (COPY_BYTES / 2) / 16, 1};
    op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    return op;
}

static int copies_driver(const char *call, int ord, const char *abi, void *f)
{
    (void)abi; /* the 12 build has only 12.8's variants */
    if (!strcmp(call, "cuMemcpyBatchAsync")) {
        CUdeviceptr dsts[2] = {(CUdeviceptr)(uintptr_t)copies_dst, (CUdeviceptr)(uintptr_t)copies_dst + COPY_BYTES / 2};
        CUdeviceptr srcs[2] = {(CUdeviceptr)(uintptr_t)copies_src, (CUdeviceptr)(uintptr_t)copies_src + COPY_BYTES / 2};
        size_t sizes[2] = {COPY_BYTES / 2, COPY_BYTES / 2}, idx[3] = {0, 1, 2}, fail = 0, n = copies_num_attrs();
        CUmemcpyAttributes attrs[3] = {
            {CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, HOST_HINT, DEVICE_HINT(0), 0},
            {CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, HOST_HINT, DEVICE_HINT(ord), 0},
            {CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, HOST_HINT, DEVICE_HINT(1), 0},
        };
#if CUDART_VERSION >= 13000
        if (is(abi, "cuMemcpyBatchAsync_v2"))
            return ((PFN_cuMemcpyBatchAsync_v13000)f)(dsts, srcs, sizes, 2, attrs, idx, n, copies_stream);
#endif
        return ((PFN_cuMemcpyBatchAsync_v12080)f)(dsts, srcs, sizes, 2, attrs, idx, n, &fail, copies_stream);
    }
#if CUDART_VERSION >= 13000
    if (!strcmp(call, "cuMemcpyWithAttributesAsync")) {
        CUmemcpyAttributes attr = {CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, HOST_HINT, DEVICE_HINT(ord), 0};
        return ((PFN_cuMemcpyWithAttributesAsync_v13020)f)((CUdeviceptr)(uintptr_t)copies_dst,
                                                           (CUdeviceptr)(uintptr_t)copies_src,
                                                           COPY_BYTES, &attr, copies_stream);
    }
#endif
    if (!strcmp(call, "cuMemcpy3DBatchAsync")) {
        CUDA_MEMCPY3D_BATCH_OP ops[2] = {copies_op(0, 0), copies_op(COPY_BYTES / 2, ord)};
        size_t fail = 0;
#if CUDART_VERSION >= 13000
        if (is(abi, "cuMemcpy3DBatchAsync_v2"))
            return ((PFN_cuMemcpy3DBatchAsync_v13000)f)(2, ops, 0, copies_stream);
#endif
        return ((PFN_cuMemcpy3DBatchAsync_v12080)f)(2, ops, &fail, 0, copies_stream);
    }
#if CUDART_VERSION >= 13000
    if (!strcmp(call, "cuMemcpy3DWithAttributesAsync")) {
        /* the whole buffer as one copy of 16 rows of 16 */
        CUDA_MEMCPY3D_BATCH_OP op = copies_op(0, ord);
        op.extent.height = COPY_BYTES / 16;
        return ((PFN_cuMemcpy3DWithAttributesAsync_v13020)f)(&op, 0, copies_stream);
    }
    if (!strcmp(call, "cuFabricCpyBatchAsync")) {
        CUDA_FABRIC_COPY_BATCH_OP ops[2];
        memset(ops, 0, sizeof ops);
        for (int i = 0; i < 2; i++) {
            ops[i].src.type = ops[i].dst.type = CU_FABRIC_COPY_OPERAND_TYPE_POINTER;
            ops[i].src.op.ptr.ptr = (CUdeviceptr)(uintptr_t)copies_src + i * COPY_BYTES / 2;
            ops[i].dst.op.ptr.ptr = (CUdeviceptr)(uintptr_t)copies_dst + i * COPY_BYTES / 2;
            ops[i].src.op.ptr.locHint = (CUmemLocation)HOST_HINT;
            ops[i].dst.op.ptr.locHint = (CUmemLocation)DEVICE_HINT(i ? ord : 0);
            ops[i].size = COPY_BYTES / 2;
        }
        return ((PFN_cuFabricCpyBatchAsync_v13050)f)(2, ops, 0, copies_stream);
    }
#endif
    return -1;
}

static int copies_driver_call(const char *call)
{
    static const char *const names[] = {"cuMemcpyBatchAsync", "cuMemcpyWithAttributesAsync",
                                        "cuMemcpy3DBatchAsync", "cuMemcpy3DWithAttributesAsync",
                                        "cuFabricCpyBatchAsync"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(call, names[i]))
            return 1;
    return 0;
}

/* ---- runtime ----------------------------------------------------------------------------- */

static cudaStream_t copies_rt_stream;

static void copies_setup_runtime(void)
{
    void *a = NULL, *b = NULL;
    cudaError_t (*managed)(void **, size_t, unsigned) = (cudaError_t(*)(void **, size_t, unsigned))rt("cudaMallocManaged");
    cudaError_t (*stream)(cudaStream_t *) = (cudaError_t(*)(cudaStream_t *))need(dlsym(hrt, "cudaStreamCreate"), "cudaStreamCreate");
    if (managed(&a, COPY_BYTES, cudaMemAttachGlobal) || managed(&b, COPY_BYTES, cudaMemAttachGlobal) ||
        stream(&copies_rt_stream)) {
        printf("setup failed: cudaMallocManaged / cudaStreamCreate\n");
        exit(2);
    }
    copies_src = a;
    copies_dst = b;
    for (int i = 0; i < COPY_BYTES; i++) {
        copies_src[i] = (unsigned char)(i * 7 + 1);
        copies_dst[i] = 0;
    }
}

#define RT_HOST_HINT {.type = cudaMemLocationTypeHost, .id = HOST_HINT_ID}
#define RT_DEVICE_HINT(d) {.type = cudaMemLocationTypeDevice, .id = (d)}

static struct cudaMemcpy3DOperand copies_rt_operand(unsigned char *p, struct cudaMemLocation hint)
{
    struct cudaMemcpy3DOperand o;
    memset(&o, 0, sizeof o);
    o.type = cudaMemcpyOperandTypePointer;
    o.op.ptr.ptr = p;
    o.op.ptr.locHint = hint;
    return o;
}

static struct cudaMemcpy3DBatchOp copies_rt_op(size_t off, size_t rows, int dst_device)
{
    struct cudaMemcpy3DBatchOp op;
    memset(&op, 0, sizeof op);
    op.src = copies_rt_operand(copies_src + off, (struct cudaMemLocation)RT_HOST_HINT);
    op.dst = copies_rt_operand(copies_dst + off, (struct cudaMemLocation)RT_DEVICE_HINT(dst_device));
    op.extent = (struct cudaExtent){16, rows, 1};
    op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    return op;
}

/* The runtime calls of this file (each major's names): 1 and the call's rc, or 0. */
static int copies_runtime(const char *call, int ord, int *rc)
{
    void *s = (void *)copies_rt_stream;
    if (!strcmp(call, "cudaMemAdvise") || !strcmp(call, "cudaMemAdvise_v2") || is(call, "cudaMemPrefetchAsync_v2")) {
        /* advice or prefetch of one managed buffer to device ORD (-1: the host,
         * cudaCpuDeviceId or a host location) */
        struct cudaMemLocation loc = RT_DEVICE_HINT(ord);
        if (ord == cudaCpuDeviceId)
            loc = (struct cudaMemLocation){.type = cudaMemLocationTypeHost, .id = 0};
        void *f = rt(call);
        printf("setup ok\n");
        if (is(call, "cudaMemPrefetchAsync_v2")) {
            EXPECT_LOG(RT_MAJOR, call, "devPtr=%p count=%zu location=" LOC_FMT " flags=%u stream=%p",
                       (void *)copies_src, (size_t)COPY_BYTES, LOC_ARGS(loc), 0u, s);
            *rc = ((cudaError_t(*)(const void *, size_t, struct cudaMemLocation, unsigned, cudaStream_t))f)(
                copies_src, COPY_BYTES, loc, 0, copies_rt_stream);
        } else if (RT_MAJOR == 12 && !strcmp(call, "cudaMemAdvise")) {
            EXPECT_LOG(RT_MAJOR, call, "devPtr=%p count=%zu advice=%d device=%d", (void *)copies_src,
                       (size_t)COPY_BYTES, (int)cudaMemAdviseSetPreferredLocation, ord);
            *rc = ((cudaError_t(*)(const void *, size_t, enum cudaMemoryAdvise, int))f)(
                copies_src, COPY_BYTES, cudaMemAdviseSetPreferredLocation, ord);
        } else {
            EXPECT_LOG(RT_MAJOR, call, "devPtr=%p count=%zu advice=%d location=" LOC_FMT, (void *)copies_src,
                       (size_t)COPY_BYTES, (int)cudaMemAdviseSetPreferredLocation, LOC_ARGS(loc));
            *rc = ((cudaError_t(*)(const void *, size_t, enum cudaMemoryAdvise, struct cudaMemLocation))f)(
                copies_src, COPY_BYTES, cudaMemAdviseSetPreferredLocation, loc);
        }
        return 1;
    }
    if (is(call, "cudaMemcpyBatchAsync")) {
        void *dsts[2] = {copies_dst, copies_dst + COPY_BYTES / 2};
        void *srcs[2] = {copies_src, copies_src + COPY_BYTES / 2};
        size_t sizes[2] = {COPY_BYTES / 2, COPY_BYTES / 2}, idx[3] = {0, 1, 2}, n = copies_num_attrs();
        struct cudaMemcpyAttributes attrs[3] = {
            {cudaMemcpySrcAccessOrderStream, RT_HOST_HINT, RT_DEVICE_HINT(0), 0},
            {cudaMemcpySrcAccessOrderStream, RT_HOST_HINT, RT_DEVICE_HINT(ord), 0},
            {cudaMemcpySrcAccessOrderStream, RT_HOST_HINT, RT_DEVICE_HINT(1), 0},
        };
        void *f = rt(call);
        printf("setup ok\n");
#if RT_MAJOR >= 13
        EXPECT_LOG(RT_MAJOR, call, "dsts=%p srcs=%p sizes=%p count=%zu attrs=%p attrsIdxs=%p numAttrs=%zu "
                   "stream=%p", (void *)dsts, (void *)srcs, (void *)sizes, (size_t)2, (void *)attrs,
                   (void *)idx, n, s);
        *rc = ((cudaError_t(*)(void *const *, const void *const *, const size_t *, size_t,
                               struct cudaMemcpyAttributes *, size_t *, size_t, cudaStream_t))f)(
            dsts, (const void *const *)srcs, sizes, 2, attrs, idx, n, copies_rt_stream);
#else
        size_t fail = 0;
        EXPECT_LOG(RT_MAJOR, call, "dsts=%p srcs=%p sizes=%p count=%zu attrs=%p attrsIdxs=%p numAttrs=%zu "
                   "failIdx=%p stream=%p", (void *)dsts, (void *)srcs, (void *)sizes, (size_t)2,
                   (void *)attrs, (void *)idx, n, (void *)&fail, s);
        *rc = ((cudaError_t(*)(void **, void **, size_t *, size_t, struct cudaMemcpyAttributes *, size_t *,
                               size_t, size_t *, cudaStream_t))f)(dsts, srcs, sizes, 2, attrs, idx, n, &fail,
                                                                  copies_rt_stream);
#endif
        return 1;
    }
    if (is(call, "cudaMemcpy3DBatchAsync")) {
        struct cudaMemcpy3DBatchOp ops[2] = {copies_rt_op(0, 8, 0), copies_rt_op(COPY_BYTES / 2, 8, ord)};
        void *f = rt(call);
        printf("setup ok\n");
#if RT_MAJOR >= 13
        EXPECT_LOG(RT_MAJOR, call, "numOps=%zu opList=%p flags=%llu stream=%p", (size_t)2, (void *)ops, 0ull, s);
        *rc = ((cudaError_t(*)(size_t, struct cudaMemcpy3DBatchOp *, unsigned long long, cudaStream_t))f)(
            2, ops, 0, copies_rt_stream);
#else
        size_t fail = 0;
        EXPECT_LOG(RT_MAJOR, call, "numOps=%zu opList=%p failIdx=%p flags=%llu stream=%p", (size_t)2,
                   (void *)ops, (void *)&fail, 0ull, s);
        *rc = ((cudaError_t(*)(size_t, struct cudaMemcpy3DBatchOp *, size_t *, unsigned long long,
                               cudaStream_t))f)(2, ops, &fail, 0, copies_rt_stream);
#endif
        return 1;
    }
#if RT_MAJOR >= 13
    if (is(call, "cudaMemcpyWithAttributesAsync")) {
        struct cudaMemcpyAttributes attr = {cudaMemcpySrcAccessOrderStream, RT_HOST_HINT, RT_DEVICE_HINT(ord), 0};
        void *f = rt(call);
        printf("setup ok\n");
        EXPECT_LOG(RT_MAJOR, call, "dst=%p src=%p size=%zu attr=%p stream=%p", (void *)copies_dst,
                   (void *)copies_src, (size_t)COPY_BYTES, (void *)&attr, s);
        *rc = ((cudaError_t(*)(void *, const void *, size_t, struct cudaMemcpyAttributes *, cudaStream_t))f)(
            copies_dst, copies_src, COPY_BYTES, &attr, copies_rt_stream);
        return 1;
    }
    if (is(call, "cudaMemcpy3DWithAttributesAsync")) {
        struct cudaMemcpy3DBatchOp op = copies_rt_op(0, COPY_BYTES / 16, ord);
        void *f = rt(call);
        printf("setup ok\n");
        EXPECT_LOG(RT_MAJOR, call, "op=%p flags=%llu stream=%p", (void *)&op, 0ull, s);
        *rc = ((cudaError_t(*)(struct cudaMemcpy3DBatchOp *, unsigned long long, cudaStream_t))f)(
            &op, 0, copies_rt_stream);
        return 1;
    }
#endif
    if (!strcmp(call, "cudaGraphAddNode")) {
        /* A generic memory-allocation node on device ORD (the fake has no graphs: the driver
         * answers NOT_SUPPORTED; what matters is what reaches the runtime). */
        struct cudaGraphNodeParams np;
        memset(&np, 0, sizeof np);
        np.type = cudaGraphNodeTypeMemAlloc;
        np.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
        np.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
        np.alloc.poolProps.location.id = ord;
        np.alloc.bytesize = 4096;
        cudaGraphNode_t node;
        void *f = rt(call);
        printf("setup ok\n");
#if RT_MAJOR >= 13
        EXPECT_LOG(RT_MAJOR, call, "pGraphNode=%p graph=%p pDependencies=%p dependencyData=%p "
                   "numDependencies=%zu nodeParams=%p", (void *)&node, (void *)NULL, (void *)NULL,
                   (void *)NULL, (size_t)0, (void *)&np);
        *rc = ((cudaError_t(*)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, const cudaGraphEdgeData *,
                               size_t, struct cudaGraphNodeParams *))f)(&node, NULL, NULL, NULL, 0, &np);
#else
        EXPECT_LOG(RT_MAJOR, call, "pGraphNode=%p graph=%p pDependencies=%p numDependencies=%zu nodeParams=%p",
                   (void *)&node, (void *)NULL, (void *)NULL, (size_t)0, (void *)&np);
        *rc = ((cudaError_t(*)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, size_t,
                               struct cudaGraphNodeParams *))f)(&node, NULL, NULL, 0, &np);
#endif
        return 1;
    }
    return 0;
}

/* Make CALL if it is one of this file's: prints its results and returns 1; else 0. */
static int copies_call(const char *call, int ord)
{
    if (!strncmp(call, "cuda", 4)) {
        static const char *const rt_names[] = {"cudaMemAdvise", "cudaMemAdvise_v2", "cudaMemPrefetchAsync_v2",
                                               "cudaMemcpyBatchAsync", "cudaMemcpy3DBatchAsync",
                                               "cudaMemcpyWithAttributesAsync",
                                               "cudaMemcpy3DWithAttributesAsync", "cudaGraphAddNode"};
        int mine = 0;
        for (size_t i = 0; i < sizeof rt_names / sizeof rt_names[0]; i++)
            mine |= is(call, rt_names[i]);
        if (!mine)
            return 0;
        copies_setup_runtime();
        int rc = -1;
        if (!copies_runtime(call, ord, &rc)) {
            fprintf(stderr, "guard_call: %s is not a CUDA %d runtime function\n", call, RT_MAJOR);
            exit(3);
        }
        ((cudaError_t(*)(cudaStream_t))need(dlsym(hrt, "cudaStreamSynchronize"), "cudaStreamSynchronize"))(copies_rt_stream);
        copies_report(rc);
        return 1;
    }
    if (!copies_driver_call(call))
        return 0;
#if CUDART_VERSION < 13000
    /* The 12.9 headers declare 12.8's batch copies only. */
    if (version >= 13000 || (strcmp(call, "cuMemcpyBatchAsync") && strcmp(call, "cuMemcpy3DBatchAsync"))) {
        fprintf(stderr, "guard_call: %s at %d: made by guard_call13 (the CUDA 13 headers declare it)\n", call,
                version);
        exit(3);
    }
#endif
    CHECK_SETUP(DRV(PFN_cuInit_v2000, "cuInit", "cuInit", 2000)(0));
    CUdevice d0;
    CHECK_SETUP(DRV(PFN_cuDeviceGet_v2000, "cuDeviceGet", "cuDeviceGet", 2000)(&d0, 0));
    CUcontext ctx0;
    CHECK_SETUP(DRV(PFN_cuDevicePrimaryCtxRetain_v7000, "cuDevicePrimaryCtxRetain",
                    "cuDevicePrimaryCtxRetain", 7000)(&ctx0, d0));
    CHECK_SETUP(((PFN_cuCtxSetCurrent_v4000)linked_fn("cuCtxSetCurrent"))(ctx0));
    copies_setup_driver();
    const char *abi = variant(call, version);
    void *f = need(drv(abi, call, version), call);
    printf("setup ok (%s)\n", abi);
    int rc = copies_driver(call, ord, abi, f);
    ((PFN_cuStreamSynchronize_v2000)need(dlsym(hdrv, "cuStreamSynchronize"), "cuStreamSynchronize"))(copies_stream);
    copies_report(rc);
    return 1;
}

#endif

/* cudart_reach_more.c: the rest of the runtime calls rankguard guards that name a device
 * (issue 15's list), beyond cudart_reach.c: a device's graph-memory state (trim, get and
 * set an attribute), a kernel attribute for one device, device queries (1D linear texture
 * width, NvSciSync attributes; CUDA 13's host and P2P atomic capabilities), and the generic
 * graph-node calls (add, set on a node, set on an executable graph).
 *
 * Why it exists: the path tests (python-tests/test_guard_paths.py) call every guarded
 * function through the fake runtime of each major with and without the guard; these reach
 * the fake driver with the runtime's documented argument checks (cuda_runtime_api.h 12.9
 * and 13.x), each through the driver entry point the runtime was written against (fetched
 * once, with the version of its cudaTypedefs.h PFN). The fake driver has no graphs and no
 * NvSciSync: it answers those itself.
 *
 * Each call records what it received (RT_LOG): scalars, and the fields the guard reads
 * behind pointers (a node's type and allocation location, a format, the operations), never
 * addresses of the caller's memory, so a guarded and an unguarded run log the same line.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cudart_internal.h"

#define TRY(expr) do { cudaError_t e_ = (expr); if (e_ != cudaSuccess) return rt_ret(e_); } while (0)
#define NEED(fn) do { if (!(fn)) return rt_ret(cudaErrorCallRequiresNewerDriver); } while (0)
#define DRIVER(call) return rt_ret(rt_map(call))

static struct {
    PFN_cuDeviceGraphMemTrim_v11040 graphMemTrim;
    PFN_cuDeviceGetGraphMemAttribute_v11040 getGraphMemAttribute;
    PFN_cuDeviceSetGraphMemAttribute_v11040 setGraphMemAttribute;
    PFN_cuKernelSetAttribute_v12000 kernelSetAttribute;
    PFN_cuDeviceGetTexture1DLinearMaxWidth_v11010 texture1DLinearMaxWidth;
    PFN_cuDeviceGetNvSciSyncAttributes_v10020 nvSciSyncAttributes;
    PFN_cuGraphAddNode_v12030 graphAddNode;
    PFN_cuGraphNodeSetParams_v12020 graphNodeSetParams;
    PFN_cuGraphExecNodeSetParams_v12020 graphExecNodeSetParams;
#if CUDART_VERSION >= 13000
    PFN_cuDeviceGetHostAtomicCapabilities_v13000 hostAtomicCapabilities;
    PFN_cuDeviceGetP2PAtomicCapabilities_v13000 p2pAtomicCapabilities;
#endif
} drv;

static void fetch(void *slot, const char *name, int version)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (rt_get_proc_address(name, &fn, version, RT_FLAGS_LEGACY, &status) != CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS)
        fn = NULL;                                   /* RT-missing */
    memcpy(slot, &fn, sizeof fn);
}

static pthread_once_t fetched = PTHREAD_ONCE_INIT;

static void fetch_all(void)
{
    fetch(&drv.graphMemTrim, "cuDeviceGraphMemTrim", 11040);
    fetch(&drv.getGraphMemAttribute, "cuDeviceGetGraphMemAttribute", 11040);
    fetch(&drv.setGraphMemAttribute, "cuDeviceSetGraphMemAttribute", 11040);
    fetch(&drv.kernelSetAttribute, "cuKernelSetAttribute", 12000);
    fetch(&drv.texture1DLinearMaxWidth, "cuDeviceGetTexture1DLinearMaxWidth", 11010);
    fetch(&drv.nvSciSyncAttributes, "cuDeviceGetNvSciSyncAttributes", 10020);
    fetch(&drv.graphAddNode, "cuGraphAddNode", 12030);
    fetch(&drv.graphNodeSetParams, "cuGraphNodeSetParams", 12020);
    fetch(&drv.graphExecNodeSetParams, "cuGraphExecNodeSetParams", 12020);
#if CUDART_VERSION >= 13000
    fetch(&drv.hostAtomicCapabilities, "cuDeviceGetHostAtomicCapabilities", 13000);
    fetch(&drv.p2pAtomicCapabilities, "cuDeviceGetP2PAtomicCapabilities", 13000);
#endif
}

static cudaError_t load(void)
{
    cudaError_t e = rt_init();
    if (e == cudaSuccess)
        pthread_once(&fetched, fetch_all);
    return e;
}

/* ---- a device's graph-memory state and a kernel's attribute on one device ------------ */

RT_EXPORT cudaError_t cudaDeviceGraphMemTrim(int device)
{
    RT_LOG("cudaDeviceGraphMemTrim", "device=%d", device);
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.graphMemTrim);
    DRIVER(drv.graphMemTrim(cu));
}

RT_EXPORT cudaError_t cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr,
                                                     void *value)
{
    RT_LOG("cudaDeviceGetGraphMemAttribute", "device=%d attr=%d value=%s", device, (int)attr,
           value ? "set" : "(null)");
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.getGraphMemAttribute);
    DRIVER(drv.getGraphMemAttribute(cu, (CUgraphMem_attribute)attr, value));
}

/* The settable attributes (the high watermarks) take a pointer to a 64-bit value. */
RT_EXPORT cudaError_t cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr,
                                                     void *value)
{
    RT_LOG("cudaDeviceSetGraphMemAttribute", "device=%d attr=%d value=%llu%s", device, (int)attr,
           value ? *(unsigned long long *)value : 0ull, value ? "" : "(null)");
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.setGraphMemAttribute);
    DRIVER(drv.setGraphMemAttribute(cu, (CUgraphMem_attribute)attr, value));
}

/* cudaFuncAttribute and CUfunction_attribute number the same attributes alike; a
 * cudaKernel_t is the driver's CUkernel. */
RT_EXPORT cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, enum cudaFuncAttribute attr,
                                                      int value, int device)
{
    RT_LOG("cudaKernelSetAttributeForDevice", "kernel=%p attr=%d value=%d device=%d",
           RT_LOG_HANDLE(kernel), (int)attr, value, device);
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.kernelSetAttribute);
    DRIVER(drv.kernelSetAttribute((CUfunction_attribute)attr, value, (CUkernel)kernel, cu));
}

/* ---- device queries --------------------------------------------------------------- */

/* RT-texfmt: a channel description -> the driver's array format and channel count: 1, 2
 * or 4 channels of one size; signed and unsigned 8/16/32-bit integers, 16/32-bit floats.
 * Anything else is cudaErrorInvalidChannelDescriptor. */
static cudaError_t array_format(const struct cudaChannelFormatDesc *d, CUarray_format *fmt,
                                unsigned *channels)
{
    const int sizes[4] = {d->x, d->y, d->z, d->w};
    unsigned n = 0;
    for (int i = 0; i < 4; i++)
        if (sizes[i]) {
            if (sizes[i] != d->x || i != (int)n)
                return cudaErrorInvalidChannelDescriptor;
            n++;
        }
    if (n != 1 && n != 2 && n != 4)
        return cudaErrorInvalidChannelDescriptor;
    *channels = n;
    switch (d->f) {
    case cudaChannelFormatKindSigned:
    case cudaChannelFormatKindUnsigned: {
        int s = d->f == cudaChannelFormatKindSigned;
        if (d->x == 8) *fmt = s ? CU_AD_FORMAT_SIGNED_INT8 : CU_AD_FORMAT_UNSIGNED_INT8;
        else if (d->x == 16) *fmt = s ? CU_AD_FORMAT_SIGNED_INT16 : CU_AD_FORMAT_UNSIGNED_INT16;
        else if (d->x == 32) *fmt = s ? CU_AD_FORMAT_SIGNED_INT32 : CU_AD_FORMAT_UNSIGNED_INT32;
        else return cudaErrorInvalidChannelDescriptor;
        return cudaSuccess;
    }
    case cudaChannelFormatKindFloat:
        if (d->x == 16) *fmt = CU_AD_FORMAT_HALF;
        else if (d->x == 32) *fmt = CU_AD_FORMAT_FLOAT;
        else return cudaErrorInvalidChannelDescriptor;
        return cudaSuccess;
    default:
        return cudaErrorInvalidChannelDescriptor;
    }
}

RT_EXPORT cudaError_t cudaDeviceGetTexture1DLinearMaxWidth(size_t *maxWidthInElements,
                                                           const struct cudaChannelFormatDesc *fmtDesc,
                                                           int device)
{
    if (fmtDesc)
        RT_LOG("cudaDeviceGetTexture1DLinearMaxWidth", "fmtDesc={x=%d,y=%d,z=%d,w=%d,f=%d} device=%d",
               fmtDesc->x, fmtDesc->y, fmtDesc->z, fmtDesc->w, (int)fmtDesc->f, device);
    else
        RT_LOG("cudaDeviceGetTexture1DLinearMaxWidth", "fmtDesc=(null) device=%d", device);
    if (!maxWidthInElements || !fmtDesc)
        return rt_ret(cudaErrorInvalidValue);
    CUarray_format fmt;
    unsigned channels;
    TRY(array_format(fmtDesc, &fmt, &channels));
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.texture1DLinearMaxWidth);
    DRIVER(drv.texture1DLinearMaxWidth(maxWidthInElements, fmt, channels, cu));
}

/* The attribute list is NvSciSync's opaque object: passed on as it is. */
RT_EXPORT cudaError_t cudaDeviceGetNvSciSyncAttributes(void *nvSciSyncAttrList, int device, int flags)
{
    RT_LOG("cudaDeviceGetNvSciSyncAttributes", "nvSciSyncAttrList=%s device=%d flags=%d",
           nvSciSyncAttrList ? "set" : "(null)", device, flags);
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.nvSciSyncAttributes);
    DRIVER(drv.nvSciSyncAttributes(nvSciSyncAttrList, cu, flags));
}

#if CUDART_VERSION >= 13000
/* cudaAtomicOperation and CUatomicOperation number the operations alike (13.x headers). */
_Static_assert(sizeof(enum cudaAtomicOperation) == sizeof(CUatomicOperation), "atomic operation");

/* The first operations of a list, for the log: "[0,3]" (at most 8, then "..."). */
static const char *ops_text(char *buf, size_t n, const enum cudaAtomicOperation *ops, unsigned count)
{
    if (!ops)
        return "(null)";
    size_t at = (size_t)snprintf(buf, n, "[");
    for (unsigned i = 0; i < count && i < 8 && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%d", i ? "," : "", (int)ops[i]);
    if (at < n)
        snprintf(buf + at, n - at, "%s]", count > 8 ? ",..." : "");
    return buf;
}

RT_EXPORT cudaError_t cudaDeviceGetHostAtomicCapabilities(unsigned int *capabilities,
                                                          const enum cudaAtomicOperation *operations,
                                                          unsigned int count, int device)
{
    char ops[64];
    RT_LOG("cudaDeviceGetHostAtomicCapabilities", "operations=%s count=%u device=%d",
           ops_text(ops, sizeof ops, operations, count), count, device);
    TRY(load());
    CUdevice cu;
    TRY(rt_cu_device(device, &cu));
    NEED(drv.hostAtomicCapabilities);
    DRIVER(drv.hostAtomicCapabilities(capabilities, (const CUatomicOperation *)operations, count, cu));
}

RT_EXPORT cudaError_t cudaDeviceGetP2PAtomicCapabilities(unsigned int *capabilities,
                                                         const enum cudaAtomicOperation *operations,
                                                         unsigned int count, int srcDevice, int dstDevice)
{
    char ops[64];
    RT_LOG("cudaDeviceGetP2PAtomicCapabilities", "operations=%s count=%u srcDevice=%d dstDevice=%d",
           ops_text(ops, sizeof ops, operations, count), count, srcDevice, dstDevice);
    TRY(load());
    CUdevice s, d;
    TRY(rt_cu_device(srcDevice, &s));
    TRY(rt_cu_device(dstDevice, &d));
    NEED(drv.p2pAtomicCapabilities);
    DRIVER(drv.p2pAtomicCapabilities(capabilities, (const CUatomicOperation *)operations, count, s, d));
}
#endif /* CUDA 13 */

/* ---- generic graph-node parameters ---------------------------------------------------- */

/* RT-graphnode: struct cudaGraphNodeParams has CUgraphNodeParams's size, and its type and
 * memory-allocation member the driver's layout (the only node type rankguard reads); the
 * parameters pass on as they are. The fake driver has no graphs (it answers each call
 * itself): this only reaches it with the caller's arguments. */
_Static_assert(sizeof(struct cudaGraphNodeParams) == sizeof(CUgraphNodeParams), "graph node params");
_Static_assert(offsetof(struct cudaGraphNodeParams, alloc) == offsetof(CUgraphNodeParams, alloc),
               "graph node params: the allocation member");
_Static_assert(sizeof(cudaGraphEdgeData) == sizeof(CUgraphEdgeData), "graph edge data");

/* The node's type, and where a memory-allocation node allocates, for the log. */
static const char *node_text(char *buf, size_t n, const struct cudaGraphNodeParams *p)
{
    if (!p)
        return "(null)";
    if (p->type == cudaGraphNodeTypeMemAlloc)
        snprintf(buf, n, "{type=%d,alloc.poolProps.location={type=%d,id=%d}}", (int)p->type,
                 (int)p->alloc.poolProps.location.type, p->alloc.poolProps.location.id);
    else
        snprintf(buf, n, "{type=%d}", (int)p->type);
    return buf;
}

#if CUDART_VERSION < 13000 /* CUDA 13 renamed it cudaGraphAddNode (cudart_copies.c) */
RT_EXPORT cudaError_t cudaGraphAddNode_v2(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                          const cudaGraphNode_t *pDependencies,
                                          const cudaGraphEdgeData *dependencyData,
                                          size_t numDependencies, struct cudaGraphNodeParams *nodeParams)
{
    char np[96];
    RT_LOG("cudaGraphAddNode_v2", "graph=%p numDependencies=%zu nodeParams=%s", RT_LOG_HANDLE(graph),
           numDependencies, node_text(np, sizeof np, nodeParams));
    if (!pGraphNode || !nodeParams || (numDependencies && !pDependencies))
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    NEED(drv.graphAddNode);
    DRIVER(drv.graphAddNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                            (const CUgraphEdgeData *)dependencyData, numDependencies,
                            (CUgraphNodeParams *)nodeParams));
}
#endif

RT_EXPORT cudaError_t cudaGraphNodeSetParams(cudaGraphNode_t node, struct cudaGraphNodeParams *nodeParams)
{
    char np[96];
    RT_LOG("cudaGraphNodeSetParams", "node=%p nodeParams=%s", RT_LOG_HANDLE(node),
           node_text(np, sizeof np, nodeParams));
    if (!nodeParams)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    NEED(drv.graphNodeSetParams);
    DRIVER(drv.graphNodeSetParams((CUgraphNode)node, (CUgraphNodeParams *)nodeParams));
}

RT_EXPORT cudaError_t cudaGraphExecNodeSetParams(cudaGraphExec_t graphExec, cudaGraphNode_t node,
                                                 struct cudaGraphNodeParams *nodeParams)
{
    char np[96];
    RT_LOG("cudaGraphExecNodeSetParams", "graphExec=%p node=%p nodeParams=%s", RT_LOG_HANDLE(graphExec),
           RT_LOG_HANDLE(node), node_text(np, sizeof np, nodeParams));
    if (!nodeParams)
        return rt_ret(cudaErrorInvalidValue);
    TRY(load());
    NEED(drv.graphExecNodeSetParams);
    DRIVER(drv.graphExecNodeSetParams((CUgraphExec)graphExec, (CUgraphNode)node,
                                      (CUgraphNodeParams *)nodeParams));
}

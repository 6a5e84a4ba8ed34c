/* set_up_calls.h: guard_call's calls of the guarded functions of issue 15 that need their
 * own set-up or arguments (python-tests/test_guard_paths.py: SET_UP_DRIVER, SET_UP_RUNTIME,
 * and the generic matrix for the runtime's graph-memory calls and queries). Included by
 * c-tests/tests/guard_call.c after its helpers (drv, rt, linked_fn, need, DRV,
 * CHECK_SETUP); each function prints "setup ok" and "rc=<code>" and returns 1 when CALL is
 * one of its calls, 0 otherwise. */
static int is(const char *abi, const char *name);

/* CUDA 13 entry points (the driver calls are compiled against the 12.9 headers): their
 * signatures from the 13.x cudaTypedefs.h. */
typedef CUresult (*PFN_cuLogicalEndpointBindAddr_v13030)(unsigned int leId, CUdevice dev, cuuint64_t offset,
                                                         void *ptr, cuuint64_t size, unsigned long long flags);
typedef CUresult (*PFN_cuLogicalEndpointBindMem_v13030)(unsigned int leId, CUdevice dev, cuuint64_t offset,
                                                        CUmemGenericAllocationHandle memHandle,
                                                        cuuint64_t memOffset, cuuint64_t size,
                                                        unsigned long long flags);
typedef CUresult (*PFN_cuLogicalEndpointUnbind_v13030)(unsigned int leId, CUdevice dev, cuuint64_t offset,
                                                       cuuint64_t size);
typedef CUresult (*PFN_cuMulticastBindAddr_v13010)(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                                   size_t mcOffset, CUdeviceptr memptr, size_t size,
                                                   unsigned long long flags);

/* A generic memory-allocation node on device ORD, for the driver and for the runtime. */
static CUgraphNodeParams alloc_node_on(int ord) {
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.alloc.poolProps.location.id = ord;
    np.alloc.bytesize = 4096;
    return np;
}

static struct cudaGraphNodeParams rt_alloc_node_on(int ord) {
    struct cudaGraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = cudaGraphNodeTypeMemAlloc;
    np.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    np.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    np.alloc.poolProps.location.id = ord;
    np.alloc.bytesize = 4096;
    return np;
}

static int driver_set_up_call(const char *call, const char *abi, CUdevice dev, int ord, int *rc) {
    if (!strcmp(call, "cuGraphExecNodeSetParams")) {
        /* No executable graph exists on the fake (the driver alone answers). */
        CUgraphNodeParams np = alloc_node_on(ord);
        printf("setup ok\n");
        *rc = DRV(PFN_cuGraphExecNodeSetParams_v12020, abi, call, version)(NULL, NULL, &np);
    } else if (!strcmp(call, "cuLogicalEndpointBindMem") || !strcmp(call, "cuLogicalEndpointBindAddr") ||
               !strcmp(call, "cuLogicalEndpointUnbind")) {
        /* Endpoint 1, 2 MiB at offset 0, through device ORD (13.3; the fake's endpoints are
         * stubs: the driver alone answers NOT_SUPPORTED). */
        printf("setup ok\n");
        if (!strcmp(call, "cuLogicalEndpointBindMem"))
            *rc = DRV(PFN_cuLogicalEndpointBindMem_v13030, abi, call, version)(1, dev, 0, 0, 0, 2u << 20, 0);
        else if (!strcmp(call, "cuLogicalEndpointBindAddr"))
            *rc = DRV(PFN_cuLogicalEndpointBindAddr_v13030, abi, call, version)(1, dev, 0, NULL, 2u << 20, 0);
        else
            *rc = DRV(PFN_cuLogicalEndpointUnbind_v13030, abi, call, version)(1, dev, 0, 2u << 20);
    } else if (!strcmp(call, "cuMulticastBindAddr")) {
        /* A one-device team of device 0 and 2 MiB of device 0's memory mapped at an
         * address: bound to the team (12.1: no device named), or through device ORD (13.1). */
        CUmulticastObjectProp prop = {1, 2u << 20, 0, 0};
        CUmemGenericAllocationHandle mc, h;
        CHECK_SETUP(((PFN_cuMulticastCreate_v12010)linked_fn("cuMulticastCreate"))(&mc, &prop));
        CHECK_SETUP(((PFN_cuMulticastAddDevice_v12010)linked_fn("cuMulticastAddDevice"))(mc, 0));
        CUmemAllocationProp mp;
        memset(&mp, 0, sizeof mp);
        mp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        mp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        mp.location.id = 0;
        CHECK_SETUP(((PFN_cuMemCreate_v10020)linked_fn("cuMemCreate"))(&h, 2u << 20, &mp, 0));
        CUdeviceptr va;
        CHECK_SETUP(((PFN_cuMemAddressReserve_v10020)linked_fn("cuMemAddressReserve"))(&va, 2u << 20, 2u << 20, 0, 0));
        CHECK_SETUP(((PFN_cuMemMap_v10020)linked_fn("cuMemMap"))(va, 2u << 20, 0, h, 0));
        void *f = need(drv(abi, call, version), call);
        printf("setup ok (%s)\n", abi);
        if (is(abi, "cuMulticastBindAddr_v2"))
            *rc = ((PFN_cuMulticastBindAddr_v13010)f)(mc, dev, 0, va, 2u << 20, 0);
        else
            *rc = ((PFN_cuMulticastBindAddr_v12010)f)(mc, 0, va, 2u << 20, 0);
    } else {
        return 0;
    }
    return 1;
}

static int runtime_set_up_call(const char *call, int ord, int *rc) {
    if (!strcmp(call, "cudaDeviceGraphMemTrim")) {
        *rc = ((cudaError_t(*)(int))rt(call))(ord);
    } else if (!strcmp(call, "cudaDeviceSetGraphMemAttribute") ||
               !strcmp(call, "cudaDeviceGetGraphMemAttribute")) {
        /* reset the high watermark (the only settable value is 0) / read the current use */
        unsigned long long v = 0;
        enum cudaGraphMemAttributeType attr = !strcmp(call, "cudaDeviceSetGraphMemAttribute")
                                                  ? cudaGraphMemAttrUsedMemHigh : cudaGraphMemAttrUsedMemCurrent;
        *rc = ((cudaError_t(*)(int, enum cudaGraphMemAttributeType, void *))rt(call))(ord, attr, &v);
    } else if (!strcmp(call, "cudaKernelSetAttributeForDevice")) {
        /* no kernel exists on the fake: the driver alone refuses the handle */
        *rc = ((cudaError_t(*)(cudaKernel_t, enum cudaFuncAttribute, int, int))rt(call))(
            NULL, cudaFuncAttributeMaxDynamicSharedMemorySize, 0, ord);
    } else if (!strcmp(call, "cudaDeviceGetTexture1DLinearMaxWidth")) {
        struct cudaChannelFormatDesc fmt = {32, 0, 0, 0, cudaChannelFormatKindFloat};
        size_t w = 0;
        *rc = ((cudaError_t(*)(size_t *, const struct cudaChannelFormatDesc *, int))rt(call))(&w, &fmt, ord);
    } else if (!strcmp(call, "cudaDeviceGetNvSciSyncAttributes")) {
        char attrs[64]; /* an opaque NvSciSyncAttrList stand-in: the fake never writes it */
        *rc = ((cudaError_t(*)(void *, int, int))rt(call))(attrs, ord, cudaNvSciSyncAttrSignal);
#if RT_MAJOR >= 13
    } else if (!strcmp(call, "cudaDeviceGetHostAtomicCapabilities")) {
        unsigned caps = 0;
        enum cudaAtomicOperation op = cudaAtomicOperationIntegerAdd;
        *rc = ((cudaError_t(*)(unsigned *, const enum cudaAtomicOperation *, unsigned, int))rt(call))(
            &caps, &op, 1, ord);
    } else if (!strcmp(call, "cudaDeviceGetP2PAtomicCapabilities")) {
        unsigned caps = 0;
        enum cudaAtomicOperation op = cudaAtomicOperationIntegerAdd;
        *rc = ((cudaError_t(*)(unsigned *, const enum cudaAtomicOperation *, unsigned, int, int))rt(call))(
            &caps, &op, 1, 0, ord);
    } else if (is(call, "cudaMemDiscardAndPrefetchBatchAsync")) {
        /* Two managed ranges: the first to device 0, the second to device ORD. */
        void *p[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++)
            if (((cudaError_t(*)(void **, size_t, unsigned))rt("cudaMallocManaged"))(&p[i], 4096, cudaMemAttachGlobal)) {
                printf("setup failed: cudaMallocManaged\n");
                exit(2);
            }
        size_t sizes[2] = {4096, 4096}, idx[2] = {0, 1};
        struct cudaMemLocation locs[2] = {{.type = cudaMemLocationTypeDevice, .id = 0},
                                          {.type = cudaMemLocationTypeDevice, .id = ord}};
        *rc = ((cudaError_t(*)(void **, size_t *, size_t, struct cudaMemLocation *, size_t *, size_t,
                               unsigned long long, cudaStream_t))rt(call))(p, sizes, 2, locs, idx, 2, 0, NULL);
#endif
#if RT_MAJOR == 12 /* CUDA 13 renamed it cudaGraphAddNode */
    } else if (!strcmp(call, "cudaGraphAddNode_v2")) {
        struct cudaGraphNodeParams np = rt_alloc_node_on(ord);
        cudaGraphNode_t node;
        *rc = ((cudaError_t(*)(cudaGraphNode_t *, cudaGraph_t, const cudaGraphNode_t *, const cudaGraphEdgeData *,
                               size_t, struct cudaGraphNodeParams *))rt(call))(
            &node, NULL, NULL, NULL, 0, &np);
#endif
    } else if (!strcmp(call, "cudaGraphNodeSetParams")) {
        struct cudaGraphNodeParams np = rt_alloc_node_on(ord);
        *rc = ((cudaError_t(*)(cudaGraphNode_t, struct cudaGraphNodeParams *))rt(call))(NULL, &np);
    } else if (!strcmp(call, "cudaGraphExecNodeSetParams")) {
        struct cudaGraphNodeParams np = rt_alloc_node_on(ord);
        *rc = ((cudaError_t(*)(cudaGraphExec_t, cudaGraphNode_t, struct cudaGraphNodeParams *))rt(call))(
            NULL, NULL, &np);
    } else if (!strcmp(call, "cudaChooseDevice")) {
        /* The compute capability of device ORD where it exists (a test gives device 1
         * another one), else 0.0: the device chosen is the query. */
        struct cudaDeviceProp prop;
        memset(&prop, 0, sizeof prop);
        int count = 0, chosen = -1;
        if (((cudaError_t(*)(int *))rt("cudaGetDeviceCount"))(&count)) {
            printf("setup failed: cudaGetDeviceCount\n");
            exit(2);
        }
        if (ord < count &&
            (((cudaError_t(*)(int *, enum cudaDeviceAttr, int))rt("cudaDeviceGetAttribute"))(
                 &prop.major, cudaDevAttrComputeCapabilityMajor, ord) ||
             ((cudaError_t(*)(int *, enum cudaDeviceAttr, int))rt("cudaDeviceGetAttribute"))(
                 &prop.minor, cudaDevAttrComputeCapabilityMinor, ord))) {
            printf("setup failed: cudaDeviceGetAttribute\n");
            exit(2);
        }
        printf("setup ok\n");
        *rc = ((cudaError_t(*)(int *, const struct cudaDeviceProp *))rt(call))(&chosen, &prop);
        printf("rc=%d\ndevice=%d\n", *rc, chosen);
        exit(0);
    } else {
        return 0;
    }
    printf("setup ok\nrc=%d\n", *rc);
    return 1;
}

/* Internal state shared by the fake driver's translation units: the node model (node.c),
 * the visible device list (cvd.c), contexts and the driver lock (driver.c) and memory
 * (memory.c). Compiled with __CUDA_API_VERSION_INTERNAL so cuda.h declares every ABI
 * variant under its real exported name (cuCtxCreate, cuCtxCreate_v2, ..._ptds). */
#ifndef FAKECUDA_FAKE_H
#define FAKECUDA_FAKE_H

#include <cuda.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FAKE_API __attribute__((visibility("default")))
#define FAKE_MAX_GPUS 64
#define FAKE_MAX_MIG 7
/* cuDriverGetVersion: FAKECUDA_DRIVER_VERSION (e.g. 13050, for CUDA 13 programs) or 12090. */
#define FAKE_DRIVER_VERSION 12090
int fake_driver_version(void);

/* One physical GPU of the node (PCI bus order: index i has bus 0x18 + 0x10*i). */
struct fake_gpu {
    int index;
    char name[96];
    int sm_count;
    int clock_khz;
    int cc_major, cc_minor;
    size_t total_mem;
    int numa_node;
    int mig_count;           /* 0: not in MIG mode */
};

/* One enumerated CUDA device: a whole GPU, or one MIG instance of it. */
struct fake_dev {
    int gpu;                 /* physical index */
    int mig;                 /* -1 for a whole GPU, else the instance number */
};

struct fake_node {
    int n_gpus;
    int numa_nodes;
    struct fake_gpu gpu[FAKE_MAX_GPUS];
};

/* Set once by cuInit (under fake_lock), read-only afterwards. */
extern struct fake_node fake_node;
extern struct fake_dev fake_visible[FAKE_MAX_GPUS];
extern int fake_visible_count;

/* node.c */
int fake_node_load(struct fake_node *node);          /* 0 ok, -1 error (printed) */
void fake_gpu_uuid(int gpu, unsigned char out[16]);
void fake_mig_uuid(int gpu, int mig, unsigned char out[16]);
void fake_uuid_string(const char *prefix, const unsigned char u[16], char *out, size_t len);
void fake_dev_uuid(const struct fake_dev *d, unsigned char out[16]);
int fake_gpu_pci_bus(int gpu);

/* cvd.c: fills out[] (capacity FAKE_MAX_GPUS) from CUDA_VISIBLE_DEVICES and
 * CUDA_DEVICE_ORDER; returns the count (0 = nothing visible). */
int fake_resolve_visible(const struct fake_node *node, const char *cvd, const char *order,
                         struct fake_dev *out);

/* driver.c */
extern pthread_mutex_t fake_lock;
CUresult fake_check_init(void);
int fake_ordinal_of_gpu(int gpu, int mig);           /* -1 when not visible */
struct fake_ctx;
CUresult fake_current_ctx(struct fake_ctx **out);
/* CUDA 13 entry points the fake implements, declared here because the fake compiles
 * against the 12.9 cuda.h, which does not have them (signatures: 13.x cudaTypedefs.h). */
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx);
CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location,
                                        CUmemAllocationType type);
CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool *pool_out, CUmemLocation *location,
                                 CUmemAllocationType type);
CUresult CUDAAPI cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
                                 CUmemoryPool pool);
CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                         CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                         size_t numPrefetchLocs, unsigned long long flags,
                                         CUstream hStream);
CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                              CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                              size_t numPrefetchLocs, unsigned long long flags,
                                              CUstream hStream);
CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                   CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                                   size_t numPrefetchLocs, unsigned long long flags,
                                                   CUstream hStream);
CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                        CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                                        size_t numPrefetchLocs, unsigned long long flags,
                                                        CUstream hStream);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
                                        CUdeviceptr memptr, size_t size, unsigned long long flags);
int fake_ctx_valid(struct fake_ctx *c);
int fake_ctx_device(struct fake_ctx *c);             /* ordinal */
CUresult fake_stream_check(CUstream s);

/* memory.c */
void fake_memory_atfork_child(void);

/* memory.c, for reach.c: what a known address range or VMM handle is backed by. */
struct fake_range {
    uintptr_t base;
    size_t size;
    int gpu, mig;                    /* physical owner; gpu -1 for host memory */
    struct fake_ctx *ctx;
    int fd;                          /* the memfd holding the bytes (-1: none reachable) */
    size_t fd_off;                   /* where the range's first byte is in fd */
    CUmemLocation loc;               /* VMM handles: the allocation's location */
    unsigned handle_types;           /* VMM handles: requested shareable handle types */
};
int fake_range_of(uintptr_t p, size_t n, struct fake_range *out);      /* under fake_lock; 0 ok */
int fake_vmm_handle_of(CUmemGenericAllocationHandle h, struct fake_range *out); /* same */
void fake_add_ext_mapping(uintptr_t base, size_t size, int fd, int gpu, int mig,
                          struct fake_ctx *ctx);                      /* under fake_lock */
CUresult fake_copy(CUdeviceptr dst, int dst_dev, CUdeviceptr src, int src_dev, size_t n,
                   CUstream s, int async);
/* A location's validity: a DEVICE one must be visible (CUDA_ERROR_INVALID_DEVICE), host
 * ones only where allow_host (CUDA_ERROR_INVALID_VALUE otherwise). */
CUresult fake_check_location(const CUmemLocation *loc, int allow_host);

#endif

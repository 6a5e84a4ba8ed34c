/* Fake device memory: every allocation is a memfd mapped MAP_SHARED, so a device pointer
 * is a host address the fake can memcpy, and another process reaches the same bytes
 * (legacy IPC through /proc/<pid>/fd/<n> while the exporter lives; VMM through the fd
 * itself, which carries a header page describing the allocation).
 * Covers cuMemAlloc/Free, copies and memset (+_ptds/_ptsz), cuPointerGetAttribute(s),
 * legacy IPC memory handles, VMM (cuMemCreate ... cuMemImportFromShareableHandle),
 * managed memory, prefetch and advise. Decisions the docs leave open are marked D-xxx and
 * listed in c-tests/README.md. */
#include "fake.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096ul
#define GRANULARITY (2ul << 20)        /* VMM minimum and recommended granularity: 2 MiB */

#define CHECK_INIT()                         \
    do {                                     \
        CUresult r_ = fake_check_init();     \
        if (r_ != CUDA_SUCCESS)              \
            return r_;                       \
    } while (0)

enum kind { K_DEVICE, K_MANAGED, K_IPC, K_VMM, K_POOL, K_POOL_IMPORT, K_EXT };

struct fake_pool;

/* One address range the fake knows: a cuMemAlloc(Managed) allocation, an opened IPC
 * handle, or a cuMemMap'ed VMM range. */
struct alloc {
    struct alloc *next;
    enum kind kind;
    uintptr_t base;
    size_t size;
    int fd;                           /* memfd (K_DEVICE/K_MANAGED), -1 otherwise */
    struct fake_ctx *ctx;             /* context allocated in / mapped into */
    int gpu, mig;                     /* physical owner; gpu -1 for host memory */
    unsigned long long id;
    int ipc_refs;                     /* K_IPC: opens not yet closed */
    int ipc_pid, ipc_fd;              /* K_IPC: where it came from */
    unsigned long long ino;
    struct vmm_handle *vmm;           /* K_VMM */
    struct fake_pool *pool;           /* K_POOL, K_POOL_IMPORT */
    size_t pool_off;                  /* offset of the data in the pool's (VMM: handle's) memfd */
    int vmm_loc_id;                   /* K_VMM: the allocation's reported location.id */
    unsigned long long access[FAKE_MAX_GPUS]; /* K_VMM: CUmemAccess_flags per ordinal */
    int prot;                         /* host protection of the range (PROT_*) */
};

static struct alloc *allocs;
static unsigned long long next_id = 1;

static struct alloc *find(uintptr_t p, size_t n)
{
    for (struct alloc *a = allocs; a; a = a->next)
        if (p >= a->base && p - a->base < a->size && n <= a->size - (p - a->base))
            return a;
    return NULL;
}

static void unlink_alloc(struct alloc *x)
{
    for (struct alloc **pp = &allocs; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            return;
        }
}

void fake_memory_atfork_child(void)
{
    /* Mappings are MAP_SHARED and inherited: the child keeps reaching the same bytes. */
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* ---------------------------------------------------------------- cuMemAlloc */

static CUresult alloc_memfd(size_t size, int *pfd, void **pmem)
{
    int fd = memfd_create("fakecuda-mem", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = round_up(size, PAGE);
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pfd = fd;
    *pmem = m;
    return CUDA_SUCCESS;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t bytesize, enum kind kind)
{
    CHECK_INIT();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    int dev = r == CUDA_SUCCESS ? fake_ctx_device(c) : 0;
    size_t total = 0;
    if (r == CUDA_SUCCESS && (cuDeviceTotalMem_v2(&total, dev) != CUDA_SUCCESS || bytesize > total))
        r = CUDA_ERROR_OUT_OF_MEMORY;       /* one allocation larger than the device */
    int fd;
    void *m;
    if (r == CUDA_SUCCESS)
        r = alloc_memfd(bytesize, &fd, &m);
    if (r == CUDA_SUCCESS) {
        struct alloc *a = calloc(1, sizeof *a);
        a->kind = kind;
        a->prot = PROT_READ | PROT_WRITE;
        a->base = (uintptr_t)m;
        a->size = bytesize;
        a->fd = fd;
        a->ctx = c;
        a->gpu = fake_visible[dev].gpu;
        a->mig = fake_visible[dev].mig;
        a->id = next_id++;
        a->next = allocs;
        allocs = a;
        *dptr = (CUdeviceptr)a->base;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return mem_alloc(dptr, bytesize, K_DEVICE);
}

FAKE_API CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return mem_alloc(dptr, bytesize, K_MANAGED);
}

FAKE_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    CHECK_INIT();
    if (!dptr)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)dptr, 1);
    CUresult r = CUDA_SUCCESS;
    if (!a || a->base != (uintptr_t)dptr ||
        (a->kind != K_DEVICE && a->kind != K_MANAGED && a->kind != K_EXT)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        unlink_alloc(a);
        munmap((void *)a->base, round_up(a->size, PAGE));
        close(a->fd);
        free(a);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemGetInfo_v2(size_t *free_, size_t *total)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) {
        size_t t = 0;
        cuDeviceTotalMem_v2(&t, fake_ctx_device(c));
        size_t used = 0;
        for (struct alloc *a = allocs; a; a = a->next)
            if (a->kind == K_DEVICE && a->gpu == fake_visible[fake_ctx_device(c)].gpu)
                used += a->size;
        size_t avail = t - t / 100;       /* 1% reserved, as a real context takes some */
        if (free_)
            *free_ = used < avail ? avail - used : 0;
        if (total)
            *total = t;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)dptr, 1);
    if (a) {
        if (pbase)
            *pbase = (CUdeviceptr)a->base;
        if (psize)
            *psize = a->size;
    }
    pthread_mutex_unlock(&fake_lock);
    return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* ---------------------------------------------------------------- copies */

/* Every copy goes through here. A range that starts inside a known range must lie inside
 * it (INVALID_VALUE otherwise); `device` ranges must be known; a VMM range without the
 * needed access (no cuMemSetAccess yet) is CUDA_ERROR_ILLEGAL_ADDRESS, what a GPU reports
 * for such an access (D-illegal: the fake's error is not sticky). Host memory outside
 * every known range is not checked. */
static CUresult check_range(CUdeviceptr p, size_t n, int device, int write)
{
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)p, 1);
    CUresult r = CUDA_SUCCESS;
    if (!a)
        r = device ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    else if (n > a->size - ((uintptr_t)p - a->base))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!(a->prot & PROT_READ) || (write && !(a->prot & PROT_WRITE)))
        r = CUDA_ERROR_ILLEGAL_ADDRESS;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static CUresult need_ctx(void)
{
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static CUresult copy(CUdeviceptr dst, int dst_dev, CUdeviceptr src, int src_dev, size_t n,
                     CUstream s, int async)
{
    CHECK_INIT();
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS)
        return r;
    if (async) {
        pthread_mutex_lock(&fake_lock);
        r = fake_stream_check(s);
        pthread_mutex_unlock(&fake_lock);
        if (r != CUDA_SUCCESS)
            return r;
    }
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check_range(dst, n, dst_dev, 1)) != CUDA_SUCCESS ||
        (r = check_range(src, n, src_dev, 0)) != CUDA_SUCCESS)
        return r;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

#define H2D(d, s, n) copy((d), 1, (CUdeviceptr)(uintptr_t)(s), 0, (n), NULL, 0)
#define D2H(d, s, n) copy((CUdeviceptr)(uintptr_t)(d), 0, (s), 1, (n), NULL, 0)

FAKE_API CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) { return H2D(dstDevice, srcHost, ByteCount); }
FAKE_API CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) { return H2D(dstDevice, srcHost, ByteCount); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) { return D2H(dstHost, srcDevice, ByteCount); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) { return D2H(dstHost, srcDevice, ByteCount); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) { return copy(dstDevice, 1, srcDevice, 1, ByteCount, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) { return copy(dstDevice, 1, srcDevice, 1, ByteCount, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) { return copy(dstDevice, 1, (CUdeviceptr)(uintptr_t)srcHost, 0, ByteCount, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) { return copy(dstDevice, 1, (CUdeviceptr)(uintptr_t)srcHost, 0, ByteCount, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { return copy((CUdeviceptr)(uintptr_t)dstHost, 0, srcDevice, 1, ByteCount, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { return copy((CUdeviceptr)(uintptr_t)dstHost, 0, srcDevice, 1, ByteCount, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { return copy(dstDevice, 1, srcDevice, 1, ByteCount, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { return copy(dstDevice, 1, srcDevice, 1, ByteCount, hStream, 1); }
/* Unified addressing: cuMemcpy infers the direction; any mapped address is accepted. */
FAKE_API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) { return copy(dst, 0, src, 0, ByteCount, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) { return copy(dst, 0, src, 0, ByteCount, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) { return copy(dst, 0, src, 0, ByteCount, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) { return copy(dst, 0, src, 0, ByteCount, hStream, 1); }

/* cuMemcpyPeer needs valid contexts on both sides, not enabled peer access (cuda.h). */
static CUresult peer_copy(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
                          size_t n, CUstream s, int async)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    int ok = fake_ctx_valid((struct fake_ctx *)dctx) && fake_ctx_valid((struct fake_ctx *)sctx);
    pthread_mutex_unlock(&fake_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    return copy(dst, 1, src, 1, n, s, async);
}

FAKE_API CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount) { return peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount) { return peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream) { return peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream) { return peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, 1); }

static CUresult memset8(CUdeviceptr dst, unsigned char v, size_t n, CUstream s, int async)
{
    CHECK_INIT();
    CUresult r = need_ctx();
    if (r == CUDA_SUCCESS && async) {
        pthread_mutex_lock(&fake_lock);
        r = fake_stream_check(s);
        pthread_mutex_unlock(&fake_lock);
    }
    if (r == CUDA_SUCCESS && n)
        r = check_range(dst, n, 1, 1);
    if (r == CUDA_SUCCESS && n)
        memset((void *)(uintptr_t)dst, v, n);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) { return memset8(dstDevice, uc, N, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) { return memset8(dstDevice, uc, N, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) { return memset8(dstDevice, uc, N, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) { return memset8(dstDevice, uc, N, hStream, 1); }

/* ---------------------------------------------------------------- pointer attributes */

static int ordinal_for(const struct alloc *a)
{
    /* D-ordinal: the ordinal, in THIS process's enumeration, of the device the memory
     * lives on; for memory of a device this process cannot see (an IPC import), the
     * ordinal of the context it was mapped into. The real driver documents neither; the
     * guard must keep its own provenance rather than trust this. VMM mappings have no
     * context: they report their allocation's location.id (D-importprop). */
    if (a->kind == K_VMM || a->kind == K_POOL_IMPORT)   /* what it records, D-importprop */
        return a->vmm_loc_id;
    int o = fake_ordinal_of_gpu(a->gpu, a->mig);
    if (o < 0 && a->ctx)
        o = fake_ctx_device(a->ctx);
    return o;
}

static unsigned pool_handle_types(const struct fake_pool *p);

/* Caller holds fake_lock. a == NULL: the pointer is unknown to the fake. */
static CUresult get_attr(CUpointer_attribute attr, void *data, struct alloc *a, uintptr_t p)
{
    int is_host = a && a->gpu < 0;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUcontext *)data = a->kind == K_VMM ? NULL : (CUcontext)a->ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUmemorytype *)data = is_host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = (CUdeviceptr)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!a || (!is_host && a->kind != K_MANAGED))
            return CUDA_ERROR_INVALID_VALUE;     /* device memory has no host address */
        *(void **)data = (void *)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(unsigned long long *)data = a->id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = a->kind == K_MANAGED;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = is_host ? -1 : ordinal_for(a);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = a->kind == K_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = (CUdeviceptr)a->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(size_t *)data = a->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = a != NULL;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(unsigned long long *)data = 0;
        if (a->kind == K_VMM)
            *(unsigned long long *)data = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        if (a->kind == K_POOL || a->kind == K_POOL_IMPORT)
            *(unsigned long long *)data = pool_handle_types(a->pool);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(CUmemoryPool *)data = (CUmemoryPool)a->pool;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(size_t *)data = a->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)a->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        if (!a)
            return CUDA_ERROR_INVALID_VALUE;
        *(unsigned long long *)data = a->id;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

FAKE_API CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CHECK_INIT();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)ptr, 1);
    CUresult r = get_attr(attribute, data, a, (uintptr_t)ptr);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* cuda.h: for memory the driver does not know, cuPointerGetAttributes succeeds with
 * MEMORY_TYPE 0, CONTEXT NULL, DEVICE_ORDINAL -1 and the other values zeroed. */
FAKE_API CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                                 void **data, CUdeviceptr ptr)
{
    CHECK_INIT();
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)ptr, 1);
    CUresult r = CUDA_SUCCESS;
    for (unsigned i = 0; i < numAttributes && r == CUDA_SUCCESS; i++) {
        if (!data[i])
            continue;
        if (attributes[i] < CU_POINTER_ATTRIBUTE_CONTEXT ||
            attributes[i] > CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        if (a) {
            if (get_attr(attributes[i], data[i], a, (uintptr_t)ptr) != CUDA_SUCCESS) {
                /* e.g. HOST_POINTER of device memory: reported as NULL, not an error */
                *(void **)data[i] = NULL;
            }
            continue;
        }
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
            *(void **)data[i] = NULL;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = -1;
            break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
            *(unsigned long long *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
            *(size_t *)data[i] = 0;
            break;
        default:
            *(int *)data[i] = 0;
            break;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ---------------------------------------------------------------- legacy IPC memory */

#define IPC_MEM_MAGIC 0x46434d48u     /* "FCMH" */

/* Opaque to clients: where the exporter's memfd is and how big the allocation is. */
struct ipc_mem_handle {
    unsigned magic;
    int pid;
    int fd;
    int gpu;
    int mig;
    int pad0;
    unsigned long long size;
    unsigned long long ino;
    unsigned long long id;
    char pad[64 - 48];
};
_Static_assert(sizeof(struct ipc_mem_handle) == CU_IPC_HANDLE_SIZE, "handle size");

/* A pointer inside an allocation yields the base's handle (ucx#11724). */
FAKE_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CHECK_INIT();
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)dptr, 1);
    CUresult r = CUDA_SUCCESS;
    if (!a || a->kind != K_DEVICE) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        struct stat st;
        fstat(a->fd, &st);
        struct ipc_mem_handle h = {IPC_MEM_MAGIC, getpid(), a->fd, a->gpu, a->mig, 0,
                                   a->size, (unsigned long long)st.st_ino, a->id, {0}};
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle, &h, sizeof h);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* The runtime docs: "can open handles to devices that may not be visible in the process
 * calling the API"; the fake therefore opens any valid handle (the guard decides). */
static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    CHECK_INIT();
    if (!pdptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)   /* cuda.h: must be specified as */
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_mem_handle h;
    memcpy(&h, &handle, sizeof h);
    if (h.magic != IPC_MEM_MAGIC || h.size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == getpid())                     /* D-ipcself */
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r != CUDA_SUCCESS)
        goto out;
    for (struct alloc *a = allocs; a; a = a->next) {
        /* cuda.h: "If the memory handle has already been opened by the current context,
         * the reference count on the handle is incremented by 1 and the existing device
         * pointer is returned." Each open needs its own cuIpcCloseMemHandle. */
        if (a->kind == K_IPC && a->ctx == c && a->ipc_pid == h.pid && a->ipc_fd == h.fd &&
            a->ino == h.ino) {
            a->ipc_refs++;
            *pdptr = (CUdeviceptr)a->base;
            goto out;
        }
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || (unsigned long long)st.st_ino != h.ino ||
        (unsigned long long)st.st_size < h.size) {
        if (fd >= 0)
            close(fd);
        r = CUDA_ERROR_INVALID_VALUE;          /* D-ipcstale */
        goto out;
    }
    void *m = mmap(NULL, round_up(h.size, PAGE), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct alloc *a = calloc(1, sizeof *a);
    a->kind = K_IPC;
    a->prot = PROT_READ | PROT_WRITE;
    a->base = (uintptr_t)m;
    a->size = h.size;
    a->fd = -1;
    a->ctx = c;
    a->gpu = h.gpu;
    a->mig = h.mig;
    a->id = next_id++;
    a->ipc_refs = 1;
    a->ipc_pid = h.pid;
    a->ipc_fd = h.fd;
    a->ino = h.ino;
    a->next = allocs;
    allocs = a;
    *pdptr = (CUdeviceptr)a->base;
out:
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags);
}

FAKE_API CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags);
}

FAKE_API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)dptr, 1);
    CUresult r = CUDA_SUCCESS;
    if (!a || a->kind != K_IPC || a->base != (uintptr_t)dptr) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (--a->ipc_refs == 0) {
        unlink_alloc(a);
        munmap((void *)a->base, round_up(a->size, PAGE));
        free(a);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Test hook (not a CUDA API): the physical GPU index an IPC-opened or allocated pointer
 * lives on, -1 if unknown. Lets the conformance tests check provenance without relying on
 * a documented attribute. */
FAKE_API int fakecuda_pointer_physical_gpu(CUdeviceptr p)
{
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)p, 1);
    int g = a ? a->gpu : -1;
    pthread_mutex_unlock(&fake_lock);
    return g;
}

/* ---------------------------------------------------------------- VMM */

#define VMM_MAGIC 0x46435646u         /* "FCVF": header page of every VMM memfd */

/* Page 0 of the memfd; data starts at PAGE. It is what an importer learns from the fd. */
struct vmm_header {
    unsigned magic;
    int loc_type;                     /* CUmemLocationType */
    int gpu, mig;                     /* physical owner for DEVICE, -1 otherwise */
    int loc_id;                       /* the id the exporter passed (its own ordinal/node) */
    int handle_types;
    int exporter_pid;
    int pad;
    unsigned long long size;
};

struct vmm_handle {
    struct vmm_handle *next;
    int fd;
    size_t size;
    CUmemAllocationProp prop;         /* as this process reports it */
    int gpu, mig;
    int refs;                         /* 1 for the handle + 1 per mapping/retain */
};

static struct vmm_handle *vmm_handles;

struct reservation {
    struct reservation *next;
    uintptr_t base;
    size_t size;
};
static struct reservation *reservations;

static struct vmm_handle *vmm_lookup(CUmemGenericAllocationHandle h)
{
    for (struct vmm_handle *v = vmm_handles; v; v = v->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)v == h)
            return v;
    return NULL;
}

static void vmm_unref(struct vmm_handle *v)
{
    if (--v->refs > 0)
        return;
    for (struct vmm_handle **pp = &vmm_handles; *pp; pp = &(*pp)->next)
        if (*pp == v) {
            *pp = v->next;
            break;
        }
    close(v->fd);
    free(v);
}

/* Validates a location for cuMemCreate / granularity / prefetch. */
static CUresult check_location(const CUmemLocation *loc, int allow_host)
{
    switch (loc->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return loc->id >= 0 && loc->id < fake_visible_count ? CUDA_SUCCESS
                                                            : CUDA_ERROR_INVALID_DEVICE;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return allow_host ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        if (!allow_host)
            return CUDA_ERROR_INVALID_VALUE;
        return loc->id >= 0 && loc->id < fake_node.numa_nodes ? CUDA_SUCCESS
                                                              : CUDA_ERROR_INVALID_VALUE;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult fake_check_location(const CUmemLocation *loc, int allow_host)
{
    return check_location(loc, allow_host);
}

static CUresult check_prop(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->requestedHandleTypes & ~(unsigned)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                                 CU_MEM_HANDLE_TYPE_WIN32 |
                                                 CU_MEM_HANDLE_TYPE_WIN32_KMT |
                                                 CU_MEM_HANDLE_TYPE_FABRIC))
        return CUDA_ERROR_INVALID_VALUE;
    /* No Windows handles on Linux, and the fake node has no NVLink fabric (D-fabric). */
    if (prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    return check_location(&prop->location, 1);
}

FAKE_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                        CUmemAllocationGranularity_flags option)
{
    CHECK_INIT();
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop);
    if (r == CUDA_SUCCESS)
        *granularity = GRANULARITY;
    return r;
}

FAKE_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                      const CUmemAllocationProp *prop, unsigned long long flags)
{
    CHECK_INIT();
    if (!handle || flags != 0 || size == 0 || size % GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop);
    if (r != CUDA_SUCCESS)
        return r;
    int fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)(PAGE + size))) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct vmm_header hd = {0};
    hd.magic = VMM_MAGIC;
    hd.loc_type = prop->location.type;
    hd.gpu = hd.mig = -1;
    hd.loc_id = prop->location.id;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        hd.gpu = fake_visible[prop->location.id].gpu;
        hd.mig = fake_visible[prop->location.id].mig;
    } else if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        hd.loc_id = 0;          /* D-numacur: the fake's calling thread is on node 0 */
    }
    hd.handle_types = prop->requestedHandleTypes;
    hd.exporter_pid = getpid();
    hd.size = size;
    if (pwrite(fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct vmm_handle *v = calloc(1, sizeof *v);
    v->fd = fd;
    v->size = size;
    v->prop = *prop;
    v->gpu = hd.gpu;
    v->mig = hd.mig;
    v->refs = 1;
    pthread_mutex_lock(&fake_lock);
    v->next = vmm_handles;
    vmm_handles = v;
    pthread_mutex_unlock(&fake_lock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct vmm_handle *v = vmm_lookup(handle);
    if (v)
        vmm_unref(v);              /* mappings keep the memory until cuMemUnmap */
    pthread_mutex_unlock(&fake_lock);
    return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                              CUdeviceptr addr, unsigned long long flags)
{
    CHECK_INIT();
    if (!ptr || size == 0 || size % GRANULARITY || (alignment & (alignment - 1)) ||
        flags != 0)                       /* cuda.h: "flags - Currently unused, must be zero" */
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < GRANULARITY)
        alignment = GRANULARITY;
    /* addr is a hint; the fake always picks its own range (allowed by cuda.h). */
    (void)addr;
    size_t span = size + alignment;
    void *m = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = round_up((uintptr_t)m, alignment);
    if (base > (uintptr_t)m)
        munmap(m, base - (uintptr_t)m);
    size_t tail = (uintptr_t)m + span - (base + size);
    if (tail)
        munmap((void *)(base + size), tail);
    struct reservation *res = calloc(1, sizeof *res);
    res->base = base;
    res->size = size;
    pthread_mutex_lock(&fake_lock);
    res->next = reservations;
    reservations = res;
    pthread_mutex_unlock(&fake_lock);
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (struct reservation **pp = &reservations; *pp; pp = &(*pp)->next) {
        struct reservation *res = *pp;
        if (res->base == (uintptr_t)ptr && res->size == size) {
            for (struct alloc *a = allocs; a; a = a->next)
                if (a->kind == K_VMM && a->base >= res->base && a->base < res->base + size)
                    goto out;              /* still mapped: unmap first */
            *pp = res->next;
            munmap((void *)res->base, res->size);
            free(res);
            r = CUDA_SUCCESS;
            break;
        }
    }
out:
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static struct reservation *reservation_of(uintptr_t p, size_t n)
{
    for (struct reservation *res = reservations; res; res = res->next)
        if (p >= res->base && p - res->base < res->size && n <= res->size - (p - res->base))
            return res;
    return NULL;
}

FAKE_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                   CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CHECK_INIT();
    if (flags != 0 || size == 0 || size % GRANULARITY || offset % GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct vmm_handle *v = vmm_lookup(handle);
    CUresult r = CUDA_SUCCESS;
    if (!v || offset + size > v->size || !reservation_of((uintptr_t)ptr, size))
        r = CUDA_ERROR_INVALID_VALUE;
    for (struct alloc *a = allocs; a && r == CUDA_SUCCESS; a = a->next)
        if ((uintptr_t)ptr < a->base + a->size && a->base < (uintptr_t)ptr + size)
            r = CUDA_ERROR_ALREADY_MAPPED;
    if (r == CUDA_SUCCESS) {
        /* No access until cuMemSetAccess, as on the real driver. */
        void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd,
                       (off_t)(PAGE + offset));
        if (m == MAP_FAILED) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            struct alloc *a = calloc(1, sizeof *a);
            a->kind = K_VMM;
            a->base = (uintptr_t)ptr;
            a->size = size;
            a->fd = -1;
            a->gpu = v->gpu;
            a->mig = v->mig;
            a->id = next_id++;
            a->vmm = v;
            a->vmm_loc_id = v->prop.location.id;
            a->pool_off = PAGE + offset;
            v->refs++;
            a->next = allocs;
            allocs = a;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    struct alloc *a = find((uintptr_t)ptr, size);
    if (a && a->kind == K_VMM && a->base == (uintptr_t)ptr && a->size == size) {
        mmap((void *)a->base, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
             MAP_NORESERVE, -1, 0);
        unlink_alloc(a);
        vmm_unref(a->vmm);
        free(a);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Access is granted per device ordinal; the host mapping is readable/writable as soon as
 * any device has read-write access (the fake's "device" is the host). */
FAKE_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CHECK_INIT();
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE &&
            desc[i].location.type != CU_MEM_LOCATION_TYPE_HOST &&
            desc[i].location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
            return CUDA_ERROR_INVALID_VALUE;
        CUresult r = check_location(&desc[i].location, 1);
        if (r != CUDA_SUCCESS)
            return r;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake_lock);
    CUresult r = CUDA_SUCCESS;
    /* every byte of [ptr, ptr+size) must be mapped */
    for (uintptr_t p = (uintptr_t)ptr; p < (uintptr_t)ptr + size && r == CUDA_SUCCESS;) {
        struct alloc *a = find(p, 1);
        if (!a || a->kind != K_VMM) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        p = a->base + a->size;
    }
    for (uintptr_t p = (uintptr_t)ptr; r == CUDA_SUCCESS && p < (uintptr_t)ptr + size;) {
        struct alloc *a = find(p, 1);
        int prot = PROT_NONE;
        for (size_t i = 0; i < count; i++) {
            int slot = desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE ? desc[i].location.id
                                                                           : FAKE_MAX_GPUS - 1;
            a->access[slot] = desc[i].flags;
        }
        for (int k = 0; k < FAKE_MAX_GPUS; k++) {
            if (a->access[k] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                prot = PROT_READ | PROT_WRITE;
            else if (a->access[k] == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
                prot = PROT_READ;
        }
        mprotect((void *)a->base, a->size, prot);
        a->prot = prot;
        p = a->base + a->size;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    CHECK_INIT();
    if (!flags || !location)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_location(location, 1);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)ptr, 1);
    if (!a || a->kind != K_VMM) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        int slot = location->type == CU_MEM_LOCATION_TYPE_DEVICE ? location->id : FAKE_MAX_GPUS - 1;
        *flags = a->access[slot];
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* The exported fd is a dup of the allocation's memfd: same inode everywhere it travels
 * (the guard keys VMM provenance by (st_dev, st_ino)); it carries the header page. */
FAKE_API CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                       CUmemAllocationHandleType handleType,
                                                       unsigned long long flags)
{
    CHECK_INIT();
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&fake_lock);
    struct vmm_handle *v = vmm_lookup(handle);
    CUresult r = CUDA_SUCCESS;
    if (!v || !(v->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        r = CUDA_ERROR_INVALID_VALUE;    /* not requested at cuMemCreate */
    } else {
        int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)shareableHandle = fd;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* D-importprop: the importer's allocation properties say DEVICE with id = the device's
 * ordinal in the importer when it can see that GPU; otherwise the id the exporter passed
 * to cuMemCreate (an ordinal of the exporter's numbering), which may name a different,
 * visible device here. A driver copying the creation properties behaves exactly so; the
 * guard must not take location.id of an import as provenance. */
FAKE_API CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                         CUmemAllocationHandleType shHandleType)
{
    CHECK_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int src = (int)(intptr_t)osHandle;
    struct vmm_header hd;
    struct stat st;
    if (src < 0 || fstat(src, &st) || pread(src, &hd, sizeof hd, 0) != (ssize_t)sizeof hd ||
        hd.magic != VMM_MAGIC || (unsigned long long)st.st_size < PAGE + hd.size)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(src, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct vmm_handle *v = calloc(1, sizeof *v);
    v->fd = fd;
    v->size = hd.size;
    v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    v->prop.requestedHandleTypes = hd.handle_types;
    v->prop.location.type = hd.loc_type;
    v->prop.location.id = hd.loc_id;
    v->gpu = hd.gpu;
    v->mig = hd.mig;
    v->refs = 1;
    pthread_mutex_lock(&fake_lock);
    if (hd.loc_type == CU_MEM_LOCATION_TYPE_DEVICE) {
        int o = fake_ordinal_of_gpu(hd.gpu, hd.mig);
        if (o >= 0)
            v->prop.location.id = o;
    }
    v->next = vmm_handles;
    vmm_handles = v;
    pthread_mutex_unlock(&fake_lock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                                 CUmemGenericAllocationHandle handle)
{
    CHECK_INIT();
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct vmm_handle *v = vmm_lookup(handle);
    if (v)
        *prop = v->prop;
    pthread_mutex_unlock(&fake_lock);
    return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CHECK_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)addr, 1);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (a && a->kind == K_VMM) {
        a->vmm->refs++;            /* released with cuMemRelease, like a created handle */
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)a->vmm;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ---------------------------------------------------------------- managed: prefetch/advise */

static CUresult managed_range(CUdeviceptr p, size_t n)
{
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)p, n ? n : 1);
    CUresult r = a && a->kind == K_MANAGED ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static CUresult check_device_or_cpu(CUdevice d)
{
    if (d == CU_DEVICE_CPU)
        return CUDA_SUCCESS;
    return d >= 0 && d < fake_visible_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult prefetch(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags, CUstream s)
{
    CHECK_INIT();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_location(&loc, 1);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fake_lock);
    r = fake_stream_check(s);
    pthread_mutex_unlock(&fake_lock);
    if (r != CUDA_SUCCESS)
        return r;
    return managed_range(p, n);
}

static CUmemLocation loc_of_device(CUdevice d)
{
    CUmemLocation l;
    l.type = d == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    l.id = d == CU_DEVICE_CPU ? 0 : d;
    return l;
}

FAKE_API CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream)
{
    CHECK_INIT();
    CUresult r = check_device_or_cpu(dstDevice);
    return r != CUDA_SUCCESS ? r : prefetch(devPtr, count, loc_of_device(dstDevice), 0, hStream);
}
FAKE_API CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream)
{
    return cuMemPrefetchAsync(devPtr, count, dstDevice, hStream);
}
FAKE_API CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                                unsigned int flags, CUstream hStream)
{
    return prefetch(devPtr, count, location, flags, hStream);
}
FAKE_API CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                                     unsigned int flags, CUstream hStream)
{
    return prefetch(devPtr, count, location, flags, hStream);
}

/* CUDA 13 (cuMemPrefetchBatchAsync_v13000): range i goes to prefetchLocs[k], where k is the
 * last index with prefetchLocIdxs[k] <= i (prefetchLocIdxs[0] must be 0, the indices
 * strictly increasing); flags must be 0. Every argument is checked before any range moves. */
static CUresult prefetch_batch(CUdeviceptr *dptrs, size_t *sizes, size_t count, CUmemLocation *locs,
                               size_t *locIdxs, size_t numLocs, unsigned long long flags,
                               CUstream s)
{
    CHECK_INIT();
    if (!dptrs || !sizes || !locs || !locIdxs || count == 0 || numLocs == 0 || numLocs > count ||
        locIdxs[0] != 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 1; k < numLocs; k++)
        if (locIdxs[k] <= locIdxs[k - 1] || locIdxs[k] >= count)
            return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < numLocs; k++) {
        CUresult r = check_location(&locs[k], 1);
        if (r != CUDA_SUCCESS)
            return r;
    }
    for (size_t i = 0, k = 0; i < count; i++) {
        while (k + 1 < numLocs && locIdxs[k + 1] <= i)
            k++;
        CUresult r = prefetch(dptrs[i], sizes[i], locs[k], 0, s);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}
FAKE_API CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                  CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                                  size_t numPrefetchLocs, unsigned long long flags,
                                                  CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags,
                          hStream);
}
FAKE_API CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                       CUmemLocation *prefetchLocs,
                                                       size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                       unsigned long long flags, CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags,
                          hStream);
}
/* CUDA 13: the ranges' contents are discarded (undefined afterwards; the fake keeps the
 * bytes, which is one valid outcome), then prefetched as by cuMemPrefetchBatchAsync. */
FAKE_API CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                            CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                                            size_t numPrefetchLocs, unsigned long long flags,
                                                            CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags,
                          hStream);
}
FAKE_API CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                                 CUmemLocation *prefetchLocs,
                                                                 size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                                 unsigned long long flags, CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags,
                          hStream);
}

static CUresult advise(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc)
{
    CHECK_INIT();
    if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    /* READ_MOSTLY ignores the location (cuda.h); the others name a device or the host. */
    if (advice != CU_MEM_ADVISE_SET_READ_MOSTLY && advice != CU_MEM_ADVISE_UNSET_READ_MOSTLY) {
        CUresult r = check_location(&loc, 1);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return managed_range(p, n);
}

FAKE_API CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device)
{
    CHECK_INIT();
    if (advice != CU_MEM_ADVISE_SET_READ_MOSTLY && advice != CU_MEM_ADVISE_UNSET_READ_MOSTLY) {
        CUresult r = check_device_or_cpu(device);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return advise(devPtr, count, advice, loc_of_device(device == CU_DEVICE_CPU ? CU_DEVICE_CPU
                                                       : (device < 0 ? 0 : device)));
}

FAKE_API CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location)
{
    return advise(devPtr, count, advice, location);
}

/* ---------------------------------------------------------------- memory pools */

/* A pool is one sparse memfd: a header page (location, physical GPU, handle types, the
 * bump offset) then the allocations, each mapped at its own offset. Exporting the pool
 * hands out that fd; an exported pointer names an offset and size in it. Freed ranges are
 * not reused (D-pool). */
#define POOL_MAGIC 0x4643504cu        /* "FCPL" */
#define POOL_SPAN (64ull << 30)       /* sparse: nothing is allocated until touched */

struct pool_header {
    unsigned magic;
    int loc_type;
    int gpu, mig;
    int loc_id;
    int handle_types;
    int exporter_pid;
    int pad;
    unsigned long long bump;          /* next free offset (exporter only allocates) */
};

struct fake_pool {
    struct fake_pool *next;
    int fd;
    int imported;
    int destroyed;
    CUmemPoolProps props;             /* as this process reports them */
    int gpu, mig;
    unsigned long long ino;
    unsigned long long access[FAKE_MAX_GPUS];
    /* Pool attributes (cuMemPoolSetAttribute): the three reuse policies (default enabled),
     * the release threshold (default 0), this process's used bytes and the high watermarks. */
    int reuse[3];
    cuuint64_t release_threshold;
    cuuint64_t used, used_high, reserved_high;
};

static struct fake_pool *pools;
static struct fake_pool *default_pool[FAKE_MAX_GPUS];
static struct fake_pool *current_pool[FAKE_MAX_GPUS];

static unsigned pool_handle_types(const struct fake_pool *p)
{
    return p ? (unsigned)p->props.handleTypes : 0;
}

static struct fake_pool *pool_lookup(CUmemoryPool h)
{
    for (struct fake_pool *p = pools; p; p = p->next)
        if ((CUmemoryPool)p == h && !p->destroyed)
            return p;
    return NULL;
}

/* Caller holds fake_lock. */
static CUresult pool_create(const CUmemPoolProps *props, struct fake_pool **out)
{
    if (!props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->handleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;            /* D-fabric */
    CUresult r = check_location(&props->location, 1);
    if (r != CUDA_SUCCESS)
        return r;
    int fd = memfd_create("fakecuda-pool", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)POOL_SPAN)) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct pool_header hd = {0};
    hd.magic = POOL_MAGIC;
    hd.loc_type = props->location.type;
    hd.loc_id = props->location.id;
    hd.gpu = hd.mig = -1;
    if (props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        hd.gpu = fake_visible[props->location.id].gpu;
        hd.mig = fake_visible[props->location.id].mig;
    } else if (props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        hd.loc_id = 0;                              /* D-numacur */
    }
    hd.handle_types = props->handleTypes;
    hd.exporter_pid = getpid();
    hd.bump = PAGE;
    struct stat st;
    if (pwrite(fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd || fstat(fd, &st)) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fake_pool *p = calloc(1, sizeof *p);
    if (!p) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->fd = fd;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    p->props = *props;
    p->gpu = hd.gpu;
    p->mig = hd.mig;
    p->ino = (unsigned long long)st.st_ino;
    if (props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        p->access[props->location.id] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    p->next = pools;
    pools = p;
    *out = p;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CHECK_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = NULL;
    CUresult r = pool_create(poolProps, &p);
    pthread_mutex_unlock(&fake_lock);
    if (r == CUDA_SUCCESS)
        *pool = (CUmemoryPool)p;
    return r;
}

/* Outstanding allocations stay valid; the pool's resources go with the last of them
 * (cuda.h). The fake keeps the pool record, marked destroyed. */
FAKE_API CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(pool);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (p) {
        int is_default = 0;
        for (int i = 0; i < FAKE_MAX_GPUS; i++)
            is_default |= default_pool[i] == p;
        if (!is_default) {                          /* a device's default pool stays */
            for (int i = 0; i < FAKE_MAX_GPUS; i++)
                if (current_pool[i] == p)
                    current_pool[i] = default_pool[i];
            p->destroyed = 1;
            r = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Caller holds fake_lock. */
static struct fake_pool *device_default_pool(int dev)
{
    if (!default_pool[dev]) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev;
        if (pool_create(&props, &default_pool[dev]) != CUDA_SUCCESS)
            return NULL;
    }
    return default_pool[dev];
}

FAKE_API CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CHECK_INIT();
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fake_visible_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = device_default_pool(dev);
    pthread_mutex_unlock(&fake_lock);
    *pool_out = (CUmemoryPool)p;
    return p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_API CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CHECK_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fake_visible_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = current_pool[dev] ? current_pool[dev] : device_default_pool(dev);
    pthread_mutex_unlock(&fake_lock);
    *pool = (CUmemoryPool)p;
    return p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* CUDA 13's location-based pool calls (cuMem{Get,Set,GetDefault}MemPool_v13000). The fake
 * has device pools only: a device location with CU_MEM_ALLOCATION_TYPE_PINNED is the
 * cuDevice*MemPool call of that device (cuda.h says they are equivalent); any other valid
 * location or type is CUDA_ERROR_NOT_SUPPORTED (documented in c-tests/README.md). */
static CUresult pool_location(const CUmemLocation *loc, CUmemAllocationType type, CUdevice *dev)
{
    if (!loc)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_ALLOCATION_TYPE_PINNED || loc->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (loc->id < 0 || loc->id >= fake_visible_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = loc->id;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location,
                                                 CUmemAllocationType type)
{
    CHECK_INIT();
    CUdevice dev;
    CUresult r = pool_location(location, type, &dev);
    return r != CUDA_SUCCESS ? r : cuDeviceGetDefaultMemPool(pool_out, dev);
}

FAKE_API CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool *pool_out, CUmemLocation *location,
                                          CUmemAllocationType type)
{
    CHECK_INIT();
    CUdevice dev;
    CUresult r = pool_location(location, type, &dev);
    return r != CUDA_SUCCESS ? r : cuDeviceGetMemPool(pool_out, dev);
}

FAKE_API CUresult CUDAAPI cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
                                          CUmemoryPool pool)
{
    CHECK_INIT();
    CUdevice dev;
    CUresult r = pool_location(location, type, &dev);
    return r != CUDA_SUCCESS ? r : cuDeviceSetMemPool(dev, pool);
}

/* cuda.h: the pool must be located on dev. */
FAKE_API CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CHECK_INIT();
    if (dev < 0 || dev >= fake_visible_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(pool);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (p && !p->imported && p->props.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        p->props.location.id == dev) {
        current_pool[dev] = p;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Caller holds fake_lock. Maps [off, off+size) of the pool's memfd. */
static CUresult pool_map(struct fake_pool *p, size_t off, size_t size, enum kind kind,
                         struct fake_ctx *ctx, CUdeviceptr *out)
{
    void *m = mmap(NULL, round_up(size, PAGE), PROT_READ | PROT_WRITE, MAP_SHARED, p->fd,
                   (off_t)off);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = calloc(1, sizeof *a);
    a->kind = kind;
    a->prot = PROT_READ | PROT_WRITE;
    a->base = (uintptr_t)m;
    a->size = size;
    a->fd = -1;
    a->ctx = ctx;
    a->gpu = p->gpu;
    a->mig = p->mig;
    a->id = next_id++;
    a->pool = p;
    a->pool_off = off;
    a->vmm_loc_id = p->props.location.id;
    a->next = allocs;
    allocs = a;
    *out = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

/* Caller holds fake_lock. */
static CUresult pool_alloc(struct fake_pool *p, size_t size, CUdeviceptr *out)
{
    if (p->imported)          /* cuda.h: allocations cannot be made from imported pools */
        return CUDA_ERROR_INVALID_VALUE;
    struct pool_header hd;
    if (pread(p->fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = round_up(size, PAGE);
    if (hd.bump + len > POOL_SPAN || (p->props.maxSize && hd.bump - PAGE + len > p->props.maxSize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t off = hd.bump;
    hd.bump += len;
    if (pwrite(p->fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fake_ctx *c = NULL;
    fake_current_ctx(&c);
    CUresult r = pool_map(p, off, size, K_POOL, c, out);
    if (r == CUDA_SUCCESS) {
        p->used += len;
        if (p->used > p->used_high)
            p->used_high = p->used;
        if (hd.bump - PAGE > p->reserved_high)
            p->reserved_high = hd.bump - PAGE;
    }
    return r;
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s)
{
    CHECK_INIT();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    CUresult r = fake_stream_check(s);
    struct fake_pool *p = NULL;
    if (r == CUDA_SUCCESS) {
        if (pool) {
            p = pool_lookup(pool);
        } else {                          /* cuMemAllocAsync: the current device's pool */
            struct fake_ctx *c;
            r = fake_current_ctx(&c);
            if (r == CUDA_SUCCESS) {
                int dev = fake_ctx_device(c);
                p = current_pool[dev] ? current_pool[dev] : device_default_pool(dev);
            }
        }
        if (r == CUDA_SUCCESS && !p)
            r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS)
        r = pool_alloc(p, bytesize, dptr);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return pool ? alloc_from_pool(dptr, bytesize, pool, hStream) : CUDA_ERROR_INVALID_VALUE;
}
FAKE_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}
FAKE_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_from_pool(dptr, bytesize, NULL, hStream);
}
FAKE_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_from_pool(dptr, bytesize, NULL, hStream);
}

/* Frees pool allocations and releases imported pool pointers (cuda.h: imported pointers
 * are freed with cuMemFreeAsync). */
static CUresult free_async(CUdeviceptr dptr, CUstream s)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    CUresult r = fake_stream_check(s);
    struct alloc *a = find((uintptr_t)dptr, 1);
    if (r == CUDA_SUCCESS && (!a || a->base != (uintptr_t)dptr ||
                              (a->kind != K_POOL && a->kind != K_POOL_IMPORT)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        if (a->kind == K_POOL && a->pool && a->pool->used >= round_up(a->size, PAGE))
            a->pool->used -= round_up(a->size, PAGE);
        unlink_alloc(a);
        munmap((void *)a->base, round_up(a->size, PAGE));
        free(a);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Pool attributes (cuda.h, cuMemPoolSetAttribute / cuMemPoolGetAttribute). D-pool: freed
 * ranges are never reused and never released, so the reserved size is every byte the pool
 * has handed out (read from its header: all processes of an exported pool share it); the
 * reuse policies and the release threshold are kept and reported, and change nothing. */
static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, int set)
{
    CHECK_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(pool);
    CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    struct pool_header hd = {0};
    if (r == CUDA_SUCCESS && pread(p->fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd)
        r = CUDA_ERROR_INVALID_VALUE;
    cuuint64_t reserved = hd.bump >= PAGE ? hd.bump - PAGE : 0;
    if (r == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: {
            int *slot = &p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
            if (set)
                *slot = *(int *)value != 0;
            else
                *(int *)value = *slot;
            break;
        }
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            if (set)
                p->release_threshold = *(cuuint64_t *)value;
            else
                *(cuuint64_t *)value = p->release_threshold;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: {
            cuuint64_t *high = attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH ? &p->used_high : &p->reserved_high;
            /* "It is illegal to set this attribute to a non-zero value"; a reset takes the
             * current value. */
            if (set && *(cuuint64_t *)value != 0)
                r = CUDA_ERROR_INVALID_VALUE;
            else if (set)
                *high = attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH ? p->used : reserved;
            else
                *(cuuint64_t *)value = *high;
            break;
        }
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            if (set)                          /* read-only */
                r = CUDA_ERROR_INVALID_VALUE;
            else
                *(cuuint64_t *)value = attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT ? p->used : reserved;
            break;
        default:
            r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, 1);
}

FAKE_API CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, 0);
}

/* D-pool: nothing is ever released, so there is nothing to trim; the pool must exist. */
FAKE_API CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    (void)minBytesToKeep;
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(pool);
    pthread_mutex_unlock(&fake_lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream); }
FAKE_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream); }

FAKE_API CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    CHECK_INIT();
    if (!map || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        CUresult r = check_location(&map[i].location, 0);
        if (r != CUDA_SUCCESS)
            return r;
        if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(pool);
    CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; r == CUDA_SUCCESS && i < count; i++)
        p->access[map[i].location.id] = map[i].flags;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location)
{
    CHECK_INIT();
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_location(location, 0);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(memPool);
    if (p)
        *flags = (CUmemAccess_flags)p->access[location->id];
    pthread_mutex_unlock(&fake_lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult CUDAAPI cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                           CUmemAllocationHandleType handleType,
                                                           unsigned long long flags)
{
    CHECK_INIT();
    if (!handle_out || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(pool);
    CUresult r = CUDA_SUCCESS;
    if (!p || p->imported || !(p->props.handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        r = CUDA_ERROR_INVALID_VALUE;       /* not created exportable as a POSIX fd */
    } else {
        int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)handle_out = fd;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Properties of an imported pool follow D-importprop, like VMM imports. */
FAKE_API CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                             CUmemAllocationHandleType handleType,
                                                             unsigned long long flags)
{
    CHECK_INIT();
    if (!pool_out || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int src = (int)(intptr_t)handle;
    struct pool_header hd;
    struct stat st;
    if (src < 0 || fstat(src, &st) || pread(src, &hd, sizeof hd, 0) != (ssize_t)sizeof hd ||
        hd.magic != POOL_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(src, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fake_pool *p = calloc(1, sizeof *p);
    if (!p) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->fd = fd;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    p->imported = 1;
    p->props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->props.handleTypes = hd.handle_types;
    p->props.location.type = hd.loc_type;
    p->props.location.id = hd.loc_id;
    p->gpu = hd.gpu;
    p->mig = hd.mig;
    p->ino = (unsigned long long)st.st_ino;
    pthread_mutex_lock(&fake_lock);
    if (hd.loc_type == CU_MEM_LOCATION_TYPE_DEVICE) {
        int o = fake_ordinal_of_gpu(hd.gpu, hd.mig);
        if (o >= 0) {
            p->props.location.id = o;
            p->access[o] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
    }
    p->next = pools;
    pools = p;
    pthread_mutex_unlock(&fake_lock);
    *pool_out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

#define POOL_PTR_MAGIC 0x46435050u    /* "FCPP" */
struct pool_ptr_data {
    unsigned magic;
    int pad;
    unsigned long long ino;           /* the pool's memfd */
    unsigned long long off, size;
    char rest[64 - 32];
};
_Static_assert(sizeof(struct pool_ptr_data) == sizeof(CUmemPoolPtrExportData), "export data size");

FAKE_API CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
    CHECK_INIT();
    if (!shareData_out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct alloc *a = find((uintptr_t)ptr, 1);
    CUresult r = CUDA_SUCCESS;
    if (!a || a->kind != K_POOL || !(a->pool->props.handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        struct pool_ptr_data d = {POOL_PTR_MAGIC, 0, a->pool->ino, a->pool_off, a->size, {0}};
        memcpy(shareData_out, &d, sizeof d);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                                 CUmemPoolPtrExportData *shareData)
{
    CHECK_INIT();
    if (!ptr_out || !shareData)
        return CUDA_ERROR_INVALID_VALUE;
    struct pool_ptr_data d;
    memcpy(&d, shareData, sizeof d);
    pthread_mutex_lock(&fake_lock);
    struct fake_pool *p = pool_lookup(pool);
    CUresult r = CUDA_SUCCESS;
    if (!p || !p->imported || d.magic != POOL_PTR_MAGIC || d.ino != p->ino || d.off < PAGE ||
        d.size == 0 || d.off + d.size > POOL_SPAN) {
        r = CUDA_ERROR_INVALID_VALUE;       /* not from this pool */
    } else {
        struct fake_ctx *c = NULL;
        fake_current_ctx(&c);
        r = pool_map(p, d.off, d.size, K_POOL_IMPORT, c, ptr_out);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ---------------------------------------------------------------- hooks for reach.c */

/* Caller holds fake_lock. */
int fake_range_of(uintptr_t p, size_t n, struct fake_range *out)
{
    struct alloc *a = find(p, n ? n : 1);
    if (!a)
        return -1;
    out->base = a->base;
    out->size = a->size;
    out->gpu = a->gpu;
    out->mig = a->mig;
    out->ctx = a->ctx;
    out->fd = -1;
    out->fd_off = 0;
    switch (a->kind) {
    case K_DEVICE:
    case K_MANAGED:
    case K_EXT:
        out->fd = a->fd;
        break;
    case K_VMM:
        out->fd = a->vmm->fd;
        out->fd_off = a->pool_off;
        break;
    case K_POOL:
    case K_POOL_IMPORT:
        out->fd = a->pool->fd;
        out->fd_off = a->pool_off;
        break;
    case K_IPC:
        break;
    }
    return 0;
}

/* Caller holds fake_lock. */
int fake_vmm_handle_of(CUmemGenericAllocationHandle h, struct fake_range *out)
{
    struct vmm_handle *v = vmm_lookup(h);
    if (!v)
        return -1;
    memset(out, 0, sizeof *out);
    out->size = v->size;
    out->gpu = v->gpu;
    out->mig = v->mig;
    out->fd = v->fd;
    out->fd_off = PAGE;
    out->loc = v->prop.location;
    out->handle_types = (unsigned)v->prop.requestedHandleTypes;
    return 0;
}

/* Caller holds fake_lock. Records a mapping of another file (an imported external
 * buffer); takes ownership of fd; freed with cuMemFree. */
void fake_add_ext_mapping(uintptr_t base, size_t size, int fd, int gpu, int mig, struct fake_ctx *ctx)
{
    struct alloc *a = calloc(1, sizeof *a);
    a->kind = K_EXT;
    a->prot = PROT_READ | PROT_WRITE;
    a->base = base;
    a->size = size;
    a->fd = fd;
    a->ctx = ctx;
    a->gpu = gpu;
    a->mig = mig;
    a->id = next_id++;
    a->next = allocs;
    allocs = a;
}

CUresult fake_copy(CUdeviceptr dst, int dst_dev, CUdeviceptr src, int src_dev, size_t n,
                   CUstream s, int async)
{
    return copy(dst, dst_dev, src, src_dev, n, s, async);
}

/* Fake driver functions that reach a device other than the caller's own, or export and
 * import device memory outside CUDA IPC: 3D peer copies, multicast objects, green
 * contexts and device resources, dma-buf export of an address range, external memory
 * import, the multi-device cooperative launch, and device queries (P2P attributes,
 * LUID). They exist so rankguard's tests can call every function of
 * its ranked coverage list on a platform with CUDA 12.9's documented argument checks and
 * error codes. Decisions the docs leave open are tagged D-xxx and listed in
 * c-tests/README.md. */
#include "fake.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096ul
#define MC_GRANULARITY (2ul << 20)     /* D-multicast: minimum = recommended = 2 MiB */

#define CHECK_INIT()                         \
    do {                                     \
        CUresult r_ = fake_check_init();     \
        if (r_ != CUDA_SUCCESS)              \
            return r_;                       \
    } while (0)

static int valid_device(CUdevice d) { return d >= 0 && d < fake_visible_count; }

/* ---------------------------------------------------------------- 3D peer copies */

/* cuda.h: like cuMemcpy3D, with a context on each side (ignored for arrays). The fake
 * copies linear memory only (host, device or unified); arrays do not exist here
 * (CUDA_ERROR_INVALID_VALUE, as for an invalid array handle). LOD must be 0. */
static CUresult side(CUmemorytype t, const void *host, CUdeviceptr dev, CUcontext ctx,
                     size_t x, size_t y, size_t z, size_t pitch, size_t height,
                     CUdeviceptr *base, int *is_dev)
{
    switch (t) {
    case CU_MEMORYTYPE_HOST:
        *base = (CUdeviceptr)(uintptr_t)host;
        *is_dev = 0;
        break;
    case CU_MEMORYTYPE_DEVICE:
    case CU_MEMORYTYPE_UNIFIED:
        *base = dev;
        *is_dev = 1;
        pthread_mutex_lock(&fake_lock);
        int ok = fake_ctx_valid((struct fake_ctx *)ctx);
        pthread_mutex_unlock(&fake_lock);
        if (!ok)
            return CUDA_ERROR_INVALID_CONTEXT;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!*base)
        return CUDA_ERROR_INVALID_VALUE;
    *base += x + y * pitch + z * pitch * height;
    return CUDA_SUCCESS;
}

static CUresult memcpy3d_peer(const CUDA_MEMCPY3D_PEER *p, CUstream s, int async)
{
    CHECK_INIT();
    if (!p || p->srcLOD || p->dstLOD)
        return CUDA_ERROR_INVALID_VALUE;
    size_t h = p->Height ? p->Height : 1, d = p->Depth ? p->Depth : 1;
    if ((h > 1 || d > 1) && (p->srcPitch < p->WidthInBytes || p->dstPitch < p->WidthInBytes))
        return CUDA_ERROR_INVALID_VALUE;
    if (d > 1 && (p->srcHeight < h || p->dstHeight < h))
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr src, dst;
    int sdev, ddev;
    CUresult r = side(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcContext, p->srcXInBytes,
                      p->srcY, p->srcZ, p->srcPitch, p->srcHeight, &src, &sdev);
    if (r == CUDA_SUCCESS)
        r = side(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstContext, p->dstXInBytes,
                 p->dstY, p->dstZ, p->dstPitch, p->dstHeight, &dst, &ddev);
    for (size_t z = 0; r == CUDA_SUCCESS && z < d; z++)
        for (size_t y = 0; r == CUDA_SUCCESS && y < h; y++)
            r = fake_copy(dst + y * p->dstPitch + z * p->dstPitch * p->dstHeight, ddev,
                          src + y * p->srcPitch + z * p->srcPitch * p->srcHeight, sdev,
                          p->WidthInBytes, s, async);
    return r;
}

FAKE_API CUresult CUDAAPI cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *pCopy) { return memcpy3d_peer(pCopy, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER *pCopy) { return memcpy3d_peer(pCopy, NULL, 0); }
FAKE_API CUresult CUDAAPI cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream) { return memcpy3d_peer(pCopy, hStream, 1); }
FAKE_API CUresult CUDAAPI cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream) { return memcpy3d_peer(pCopy, hStream, 1); }

/* ---------------------------------------------------------------- multicast */

/* D-multicast: every whole GPU of the fake node supports multicast (an NVSwitch system,
 * CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 1); MIG instances do not. A multicast object
 * is a team record: devices added, memory bound per device. Nothing is replicated (no
 * kernels run here), so mapping a multicast object (cuMemMap) is not supported. */
#define MC_MAGIC 0x4643434du           /* "FCCM" */
struct fake_mc {
    unsigned magic;
    unsigned num_devices;
    size_t size;
    unsigned added;
    int dev[FAKE_MAX_GPUS];            /* ordinals, in the order added */
    size_t bound[FAKE_MAX_GPUS];       /* bytes bound per added device */
};

/* Every multicast object of the process (never freed, at most 256; D-multicast). */
static struct fake_mc *fake_mc_list[257];

/* Caller holds fake_lock. */
static struct fake_mc *mc_lookup(CUmemGenericAllocationHandle h)
{
    struct fake_mc *m = (struct fake_mc *)(uintptr_t)h;
    for (int i = 0; i < 256 && fake_mc_list[i]; i++)
        if (fake_mc_list[i] == m)
            return m;
    return NULL;
}

static int mc_supported(CUdevice d) { return fake_visible[d].mig < 0; }

FAKE_API CUresult CUDAAPI cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop,
                                                    CUmulticastGranularity_flags option)
{
    CHECK_INIT();
    if (!granularity || !prop || prop->numDevices == 0 ||
        (option != CU_MULTICAST_GRANULARITY_MINIMUM && option != CU_MULTICAST_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = MC_GRANULARITY;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)
{
    CHECK_INIT();
    if (!mcHandle || !prop || prop->numDevices == 0 || prop->size == 0 ||
        prop->size % MC_GRANULARITY || prop->flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->handleTypes & ~(unsigned long long)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;             /* D-fabric */
    pthread_mutex_lock(&fake_lock);
    int n = 0;
    while (n < 256 && fake_mc_list[n])
        n++;
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (n < 256) {
        struct fake_mc *m = calloc(1, sizeof *m);
        m->magic = MC_MAGIC;
        m->num_devices = prop->numDevices;
        m->size = prop->size;
        fake_mc_list[n] = m;
        *mcHandle = (CUmemGenericAllocationHandle)(uintptr_t)m;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
    CHECK_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!mc_supported(dev))
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&fake_lock);
    struct fake_mc *m = mc_lookup(mcHandle);
    CUresult r = m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; m && i < m->added; i++)
        if (m->dev[i] == dev)
            r = CUDA_ERROR_INVALID_VALUE;            /* already a member */
    if (r == CUDA_SUCCESS && m->added >= m->num_devices)
        r = CUDA_ERROR_INVALID_VALUE;                /* the team is full */
    if (r == CUDA_SUCCESS)
        m->dev[m->added++] = dev;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Caller holds fake_lock. The team slot of the device whose memory is bound; the real
 * driver blocks until the team is complete: D-multicast returns NOT_PERMITTED instead of
 * blocking forever. */
static CUresult mc_bind(struct fake_mc *m, size_t mc_off, int gpu, int mig, size_t size)
{
    if (!m || size == 0 || size % MC_GRANULARITY || mc_off % MC_GRANULARITY ||
        mc_off + size > m->size)
        return CUDA_ERROR_INVALID_VALUE;
    if (m->added < m->num_devices)
        return CUDA_ERROR_NOT_PERMITTED;
    int ord = fake_ordinal_of_gpu(gpu, mig);
    for (unsigned i = 0; i < m->added; i++)
        if (ord >= 0 && m->dev[i] == ord) {
            m->bound[i] += size;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_DEVICE;                /* memory of a device not in the team */
}

FAKE_API CUresult CUDAAPI cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                             CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                             size_t size, unsigned long long flags)
{
    CHECK_INIT();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_range v;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (fake_vmm_handle_of(memHandle, &v) == 0 && v.gpu >= 0 && memOffset % MC_GRANULARITY == 0 &&
        memOffset + size <= v.size)
        r = mc_bind(mc_lookup(mcHandle), mcOffset, v.gpu, v.mig, size);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                              CUdeviceptr memptr, size_t size, unsigned long long flags)
{
    CHECK_INIT();
    if (flags != 0 || memptr % MC_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_range a;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (fake_range_of((uintptr_t)memptr, size, &a) == 0 && a.gpu >= 0)
        r = mc_bind(mc_lookup(mcHandle), mcOffset, a.gpu, a.mig, size);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* CUDA 13.1 (cuMulticastBindAddr_v13010): the same bind, through device `dev`, which must be
 * a member of the team (D-multicast). */
FAKE_API CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                                 size_t mcOffset, CUdeviceptr memptr, size_t size,
                                                 unsigned long long flags)
{
    CHECK_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    struct fake_mc *m = mc_lookup(mcHandle);
    int member = 0;
    for (unsigned i = 0; m && i < m->added; i++)
        member |= m->dev[i] == dev;
    pthread_mutex_unlock(&fake_lock);
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    if (!member)
        return CUDA_ERROR_INVALID_DEVICE;
    return cuMulticastBindAddr(mcHandle, mcOffset, memptr, size, flags);
}

FAKE_API CUresult CUDAAPI cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                            size_t mcOffset, size_t size)
{
    CHECK_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    struct fake_mc *m = mc_lookup(mcHandle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; m && i < m->added; i++)
        if (m->dev[i] == dev && mcOffset + size <= m->size && m->bound[i] >= size) {
            m->bound[i] -= size;
            r = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ---------------------------------------------------------------- green contexts */

/* D-green: a device's SM resource is all its SMs; a descriptor is a heap copy of one SM
 * resource with the device it came from; a green context is a record of its device and SM
 * count. They exist to be created and destroyed; work submitted to them (streams,
 * cuCtxFromGreenCtx) is not modelled. */
#define GREEN_MAGIC 0x46434743u       /* "FCGC" */
#define DESC_MAGIC 0x46434744u        /* "FCGD" */
struct fake_desc { unsigned magic; int dev; unsigned sms; };
struct fake_green { unsigned magic; int dev; unsigned sms; int destroyed; };

/* The device an SM resource came from is kept in its internal padding (the header says the
 * structure "should not be directly modified outside of the API that created it"). */
struct res_tag { unsigned magic; int dev; };

FAKE_API CUresult CUDAAPI cuDeviceGetDevResource(CUdevice device, CUdevResource *resource, CUdevResourceType type)
{
    CHECK_INIT();
    if (!valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!resource || type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    int sms = 0;
    CUresult r = cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
    if (r != CUDA_SUCCESS)
        return r;
    memset(resource, 0, sizeof *resource);
    resource->type = CU_DEV_RESOURCE_TYPE_SM;
    resource->sm.smCount = (unsigned)sms;
    struct res_tag t = {DESC_MAGIC, device};
    memcpy(resource->_internal_padding, &t, sizeof t);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources,
                                                    unsigned int nbResources)
{
    CHECK_INIT();
    if (!phDesc || !resources || nbResources != 1)  /* one SM resource per descriptor */
        return CUDA_ERROR_INVALID_VALUE;
    struct res_tag t;
    memcpy(&t, resources[0]._internal_padding, sizeof t);
    if (resources[0].type != CU_DEV_RESOURCE_TYPE_SM || t.magic != DESC_MAGIC ||
        !valid_device(t.dev))
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    struct fake_desc *d = calloc(1, sizeof *d);
    d->magic = DESC_MAGIC;
    d->dev = t.dev;
    d->sms = resources[0].sm.smCount;
    *phDesc = (CUdevResourceDesc)d;
    return CUDA_SUCCESS;
}

/* cuda.h: the descriptor must come from resources of `dev`; CU_GREEN_CTX_DEFAULT_STREAM is
 * required. */
FAKE_API CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
{
    CHECK_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_desc *d = (struct fake_desc *)desc;
    if (!phCtx || !d || d->magic != DESC_MAGIC || flags != CU_GREEN_CTX_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    if (d->dev != dev)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    struct fake_green *g = calloc(1, sizeof *g);
    g->magic = GREEN_MAGIC;
    g->dev = dev;
    g->sms = d->sms;
    *phCtx = (CUgreenCtx)g;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    CHECK_INIT();
    struct fake_green *g = (struct fake_green *)hCtx;
    if (!g || g->magic != GREEN_MAGIC || g->destroyed)
        return CUDA_ERROR_INVALID_CONTEXT;
    g->destroyed = 1;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource *resource, CUdevResourceType type)
{
    CHECK_INIT();
    struct fake_green *g = (struct fake_green *)hCtx;
    if (!g || g->magic != GREEN_MAGIC || g->destroyed)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = cuDeviceGetDevResource(g->dev, resource, type);
    if (r == CUDA_SUCCESS)
        resource->sm.smCount = g->sms;
    return r;
}

/* ---------------------------------------------------------------- dma-buf, external memory */

/* D-dmabuf: cuMemGetHandleForAddressRange(DMA_BUF_FD) returns a new memfd (its own file
 * identity, like a real dma-buf) holding a header page: physical GPU, exporter pid, the
 * exporter's fd number and inode of the memory's memfd, offset, size. An importer reaches
 * the bytes through /proc/<pid>/fd/<n> as legacy IPC does (D-ipcstale: the exporter must
 * be alive). Host memory and opened legacy IPC handles are refused (INVALID_VALUE).
 * D-extmem: cuImportExternalMemory(OPAQUE_FD) accepts the fake's own dma-buf fds and VMM
 * shareable fds (cuMemExportToShareableHandle); other fds (no Vulkan here) are
 * INVALID_VALUE. On success the fd is owned by the driver and closed (cuda.h). */
#define DMABUF_MAGIC 0x46434442u      /* "FCDB" */
#define VMM_MAGIC 0x46435646u         /* memory.c's VMM header, first fields */
struct dmabuf_header {
    unsigned magic;
    int gpu, mig;
    int exporter_pid;
    int src_fd;
    int pad;
    unsigned long long src_ino;
    unsigned long long src_off;
    unsigned long long size;
};
struct vmm_header_prefix { unsigned magic; int loc_type; int gpu, mig; int loc_id; int handle_types; int exporter_pid; int pad; unsigned long long size; };

FAKE_API CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                        CUmemRangeHandleType handleType,
                                                        unsigned long long flags)
{
    CHECK_INIT();
    if (!handle || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || size == 0 ||
        dptr % PAGE || size % PAGE ||
        (flags & ~(unsigned long long)CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_range a;
    struct stat st;
    CUresult r = CUDA_SUCCESS;
    if (fake_range_of((uintptr_t)dptr, size, &a) || a.gpu < 0 || a.fd < 0 || fstat(a.fd, &st))
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_lock);
    if (r != CUDA_SUCCESS)
        return r;
    struct dmabuf_header hd = {DMABUF_MAGIC, a.gpu, a.mig, getpid(), a.fd, 0,
                               (unsigned long long)st.st_ino,
                               a.fd_off + ((uintptr_t)dptr - a.base), size};
    int fd = memfd_create("fakecuda-dmabuf", MFD_CLOEXEC);
    if (fd < 0 || pwrite(fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

#define EXT_MAGIC 0x46434558u         /* "FCEX" */
struct fake_ext {
    unsigned magic;
    int destroyed;
    int fd;                           /* the memfd holding the bytes */
    unsigned long long off, size;     /* where the external object starts in fd */
    int gpu, mig;
};

/* Opens the memory behind a fake dma-buf or VMM fd; returns a new fd and fills e. */
static CUresult ext_source(int fd, struct fake_ext *e)
{
    unsigned magic = 0;
    if (pread(fd, &magic, sizeof magic, 0) != (ssize_t)sizeof magic)
        return CUDA_ERROR_INVALID_VALUE;
    if (magic == DMABUF_MAGIC) {
        struct dmabuf_header hd;
        if (pread(fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd)
            return CUDA_ERROR_INVALID_VALUE;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", hd.exporter_pid, hd.src_fd);
        int src = open(path, O_RDWR | O_CLOEXEC);
        struct stat st;
        if (src < 0)
            return CUDA_ERROR_INVALID_VALUE;                   /* D-ipcstale */
        if (fstat(src, &st) || (unsigned long long)st.st_ino != hd.src_ino) {
            close(src);
            return CUDA_ERROR_INVALID_VALUE;
        }
        e->fd = src;
        e->off = hd.src_off;
        e->size = hd.size;
        e->gpu = hd.gpu;
        e->mig = hd.mig;
        return CUDA_SUCCESS;
    }
    if (magic == VMM_MAGIC) {
        struct vmm_header_prefix hd;
        if (pread(fd, &hd, sizeof hd, 0) != (ssize_t)sizeof hd)
            return CUDA_ERROR_INVALID_VALUE;
        int src = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (src < 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        e->fd = src;
        e->off = PAGE;
        e->size = hd.size;
        e->gpu = hd.gpu;
        e->mig = hd.mig;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult CUDAAPI cuImportExternalMemory(CUexternalMemory *extMem_out,
                                                 const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc)
{
    CHECK_INIT();
    if (!extMem_out || !desc || desc->size == 0 ||
        (desc->flags & ~(unsigned)CUDA_EXTERNAL_MEMORY_DEDICATED))
        return CUDA_ERROR_INVALID_VALUE;
    if (desc->type != CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD)
        return CUDA_ERROR_NOT_SUPPORTED;            /* Windows, D3D, NvSciBuf: not on this node */
    int fd = desc->handle.fd;
    struct fake_ext e = {EXT_MAGIC, 0, -1, 0, 0, -1, -1};
    CUresult r = fd < 0 ? CUDA_ERROR_INVALID_VALUE : ext_source(fd, &e);
    if (r == CUDA_SUCCESS && desc->size > e.size) {
        close(e.fd);
        r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r != CUDA_SUCCESS)
        return r;
    close(fd);                       /* cuda.h: ownership of the fd passes to the driver */
    struct fake_ext *p = malloc(sizeof *p);
    *p = e;
    p->size = desc->size;
    *extMem_out = (CUexternalMemory)p;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuExternalMemoryGetMappedBuffer(CUdeviceptr *devPtr, CUexternalMemory extMem,
                                                          const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *bufferDesc)
{
    CHECK_INIT();
    struct fake_ext *e = (struct fake_ext *)extMem;
    if (!devPtr || !bufferDesc || !e || e->magic != EXT_MAGIC || e->destroyed ||
        bufferDesc->flags != 0 || bufferDesc->size == 0 ||
        bufferDesc->offset + bufferDesc->size > e->size || (e->off + bufferDesc->offset) % PAGE)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) {
        int fd = fcntl(e->fd, F_DUPFD_CLOEXEC, 0);
        void *m = fd < 0 ? MAP_FAILED
                         : mmap(NULL, bufferDesc->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                                (off_t)(e->off + bufferDesc->offset));
        if (m == MAP_FAILED) {
            if (fd >= 0)
                close(fd);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            fake_add_ext_mapping((uintptr_t)m, bufferDesc->size, fd, e->gpu, e->mig, c);
            *devPtr = (CUdeviceptr)(uintptr_t)m;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuDestroyExternalMemory(CUexternalMemory extMem)
{
    CHECK_INIT();
    struct fake_ext *e = (struct fake_ext *)extMem;
    if (!e || e->magic != EXT_MAGIC || e->destroyed)
        return CUDA_ERROR_INVALID_HANDLE;
    e->destroyed = 1;                /* mapped buffers stay valid until cuMemFree */
    close(e->fd);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- cooperative multi-device */

/* cuda.h (deprecated): numDevices launches, one per device, each on a stream of a distinct
 * device. The fake has no modules, so no CUfunction is valid: after the documented argument
 * checks a launch returns CUDA_ERROR_INVALID_HANDLE, as the real driver does for a function
 * handle it does not know. */
FAKE_API CUresult CUDAAPI cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList,
                                                               unsigned int numDevices, unsigned int flags)
{
    CHECK_INIT();
    if (!launchParamsList || numDevices == 0 || numDevices > (unsigned)fake_visible_count ||
        (flags & ~(unsigned)(CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_PRE_LAUNCH_SYNC |
                             CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_POST_LAUNCH_SYNC)))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_INVALID_HANDLE;
}

/* ---------------------------------------------------------------- queries */

/* D-p2p: whole GPUs reach each other (NVLink: performance rank 0, atomics and array access
 * supported); a device is not its own peer (INVALID_DEVICE, as cuDeviceGetP2PAttribute
 * documents for src == dst); MIG instances have no peer access (0). */
FAKE_API CUresult CUDAAPI cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib,
                                                  CUdevice srcDevice, CUdevice dstDevice)
{
    CHECK_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(srcDevice) || !valid_device(dstDevice) || srcDevice == dstDevice)
        return CUDA_ERROR_INVALID_DEVICE;
    int peer = fake_visible[srcDevice].mig < 0 && fake_visible[dstDevice].mig < 0;
    switch (attrib) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = peer; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* cuda.h: "supported on Windows only"; Linux drivers answer NOT_SUPPORTED for a valid
 * device. */
FAKE_API CUresult CUDAAPI cuDeviceGetLuid(char *luid, unsigned int *deviceNodeMask, CUdevice dev)
{
    CHECK_INIT();
    if (!luid || !deviceNodeMask)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_ERROR_NOT_SUPPORTED;
}

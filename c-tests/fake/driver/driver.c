/* The fake NVIDIA driver's core: cuInit and the visible device list, device queries,
 * contexts (primary and created), streams, events (including legacy IPC events), peer
 * access, error strings and cuGetProcAddress(_v2). Memory lives in memory.c.
 *
 * Every function is exported under its real ABI name (cuda.h with
 * __CUDA_API_VERSION_INTERNAL declares them all). The library is linked with -Bsymbolic
 * and cuGetProcAddress answers from the generated static table, never through dlsym: a
 * preloaded guard exports the same names, and resolving ourselves through dlsym would hand
 * back its wrapper (docs/design.md §4). One mutex guards all state: it is a fake. */
#include "fake.h"
#include "fakecuda_routes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
struct fake_node fake_node;
struct fake_dev fake_visible[FAKE_MAX_GPUS];
int fake_visible_count;

/* 0: cuInit never called; 1: done, result in init_result. */
static int init_done;
static CUresult init_result;

/* ---------------------------------------------------------------- fork safety */

static void atfork_prepare(void) { pthread_mutex_lock(&fake_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&fake_lock); }
static void atfork_child(void)
{
    /* The child inherits an initialised driver (the env was read once, by the parent's
     * cuInit) and its memory mappings; the lock was taken by prepare, so it is consistent. */
    pthread_mutex_unlock(&fake_lock);
    fake_memory_atfork_child();
}

__attribute__((constructor)) static void fake_ctor(void)
{
    /* Only registers fork handlers; the environment is read at cuInit, like the driver. */
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ---------------------------------------------------------------- init */

FAKE_API CUresult CUDAAPI cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    if (!init_done) {
        if (fake_node_load(&fake_node)) {
            /* D-initerr: a bad FAKECUDA_* value fails cuInit with INVALID_VALUE, and every
             * later call keeps failing (the real driver caches a failed init too). */
            init_result = CUDA_ERROR_INVALID_VALUE;
        } else {
            fake_visible_count = fake_resolve_visible(&fake_node, getenv("CUDA_VISIBLE_DEVICES"),
                                                      getenv("CUDA_DEVICE_ORDER"), fake_visible);
            init_result = fake_visible_count ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
        }
        __atomic_store_n(&init_done, 1, __ATOMIC_RELEASE);
    }
    CUresult r = init_result;
    pthread_mutex_unlock(&fake_lock);
    /* FAKECUDA_INIT_HOLD=S (a test device): the first cuInit leaves a process holding every
     * descriptor of this one for S seconds, as a driver whose teardown outlives its answer
     * would: `rankguard launch` must plan from the driver query's whole answer, not wait
     * for the end of its output (python-tests/test_cli_launch.py). Forked after the lock is
     * released: the fork handlers take it. */
    static int held;
    const char *hold = getenv("FAKECUDA_INIT_HOLD");
    if (hold && *hold && !__atomic_exchange_n(&held, 1, __ATOMIC_ACQ_REL) && fork() == 0) {
        sleep((unsigned)atoi(hold));
        _exit(0);
    }
    return r;
}

CUresult fake_check_init(void)
{
    if (!__atomic_load_n(&init_done, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    /* After a failed cuInit every call reports the same error, NO_DEVICE included. */
    return init_result;
}

#define CHECK_INIT()                         \
    do {                                     \
        CUresult r_ = fake_check_init();     \
        if (r_ != CUDA_SUCCESS)              \
            return r_;                       \
    } while (0)

#define CHECK_DEV(d)                                         \
    do {                                                     \
        if ((d) < 0 || (d) >= fake_visible_count)            \
            return CUDA_ERROR_INVALID_DEVICE;                \
    } while (0)

/* FAKECUDA_DRIVER_VERSION, read once: a CUDA version number (major * 1000 + minor * 10,
 * 12000 to 99990). cuDriverGetVersion may be called before cuInit, so it is not read with
 * the rest of the environment. A malformed value is a broken test set-up: the process
 * stops with a message naming it. */
static int driver_version = FAKE_DRIVER_VERSION;
static pthread_once_t driver_version_once = PTHREAD_ONCE_INIT;

static void driver_version_read(void)
{
    const char *s = getenv("FAKECUDA_DRIVER_VERSION");
    if (!s || !*s)
        return;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 12000 || v > 99990 || v % 10) {
        fprintf(stderr, "fake libcuda: FAKECUDA_DRIVER_VERSION=%s is not a CUDA version "
                "(major*1000 + minor*10, e.g. 13050 for 13.5); unset it for %d\n", s,
                FAKE_DRIVER_VERSION);
        abort();
    }
    driver_version = (int)v;
}

int fake_driver_version(void)
{
    pthread_once(&driver_version_once, driver_version_read);
    return driver_version;
}

FAKE_API CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = fake_driver_version();
    return CUDA_SUCCESS;
}

int fake_ordinal_of_gpu(int gpu, int mig)
{
    for (int i = 0; i < fake_visible_count; i++)
        if (fake_visible[i].gpu == gpu && (mig < -1 || fake_visible[i].mig == mig))
            return i;
    return -1;
}

/* ---------------------------------------------------------------- devices */

FAKE_API CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    CHECK_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fake_visible_count;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    CHECK_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(ordinal);
    *device = ordinal;
    return CUDA_SUCCESS;
}

/* MIG instance slices: N instances share 7 slices evenly (1:7g, 2:3g, 3:2g, 4..7:1g). */
static int mig_slices(const struct fake_gpu *g) { return 7 / g->mig_count; }

static void dev_name(int dev, char *out, size_t len)
{
    const struct fake_dev *d = &fake_visible[dev];
    const struct fake_gpu *g = &fake_node.gpu[d->gpu];
    if (d->mig < 0)
        snprintf(out, len, "%s", g->name);
    else
        snprintf(out, len, "%s MIG %dg.%dgb", g->name, mig_slices(g),
                 (int)(g->total_mem / 8 / (1u << 30)) * mig_slices(g));
}

static size_t dev_total_mem(int dev)
{
    const struct fake_dev *d = &fake_visible[dev];
    const struct fake_gpu *g = &fake_node.gpu[d->gpu];
    return d->mig < 0 ? g->total_mem : g->total_mem / 8 * (size_t)mig_slices(g);
}

static int dev_sms(int dev)
{
    const struct fake_dev *d = &fake_visible[dev];
    const struct fake_gpu *g = &fake_node.gpu[d->gpu];
    return d->mig < 0 ? g->sm_count : g->sm_count / 8 * mig_slices(g);
}

FAKE_API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CHECK_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    dev_name(dev, name, (size_t)len);
    return CUDA_SUCCESS;
}

/* D-uuidv1: cuDeviceGetUuid (v1) of a MIG device gives the parent GPU's UUID, _v2 the MIG
 * UUID (cuda.h: "If the device is in MIG mode, [_v2] returns its MIG UUID"). */
FAKE_API CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    CHECK_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    fake_gpu_uuid(fake_visible[dev].gpu, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CHECK_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    fake_dev_uuid(&fake_visible[dev], (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

/* D-pci: bus = 0x18 + 0x10*i; for i >= 15 that exceeds 0xff and the excess goes to the
 * PCI domain (GPU 15 = 0001:08:00.0), keeping ids unique and well-formed for 64 GPUs. */
static void dev_pci(int dev, int *domain, int *bus)
{
    int b = fake_gpu_pci_bus(fake_visible[dev].gpu);
    *domain = b >> 8;
    *bus = b & 0xff;
}

FAKE_API CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    CHECK_INIT();
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    int domain, bus;
    dev_pci(dev, &domain, &bus);
    snprintf(pciBusId, (size_t)len, "%04x:%02x:%02x.0", domain, bus, 0);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    CHECK_INIT();
    if (!dev || !pciBusId)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0, bus, device, function;
    int n = 0;
    /* "[domain]:[bus]:[device].[function]" or "[bus]:[device].[function]", hex (cuda.h) */
    if (sscanf(pciBusId, "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &n) != 4 ||
        pciBusId[n]) {
        domain = 0;
        n = 0;
        if (sscanf(pciBusId, "%x:%x.%x%n", &bus, &device, &function, &n) != 3 || pciBusId[n])
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; i < fake_visible_count; i++) {
        int dm, b;
        dev_pci(i, &dm, &b);
        if ((unsigned)dm == domain && (unsigned)b == bus && device == 0 && function == 0) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

FAKE_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CHECK_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    *bytes = dev_total_mem(dev);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    CHECK_INIT();
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    *major = fake_node.gpu[fake_visible[dev].gpu].cc_major;
    *minor = fake_node.gpu[fake_visible[dev].gpu].cc_minor;
    return CUDA_SUCCESS;
}

/* Plausible H100 SXM values; attributes not listed read 0 ("not supported"). A value
 * outside cuda.h's CUdevice_attribute enum is CUDA_ERROR_INVALID_VALUE. */
FAKE_API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CHECK_INIT();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    int valid = 0;
    for (unsigned k = 0; k < fakecuda_device_attrs_len; k++)
        if (fakecuda_device_attrs[k] == (int)attrib)
            valid = 1;
    if (!valid)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fake_dev *d = &fake_visible[dev];
    const struct fake_gpu *g = &fake_node.gpu[d->gpu];
    int domain, bus, v = 0;
    dev_pci(dev, &domain, &bus);
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = g->clock_khz; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = dev_sms(dev); break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; break;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = domain; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 5; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = g->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = g->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: v = d->gpu; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
        v = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        break;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: v = 1; break;
    /* D-multicast (reach.c): whole GPUs on an NVSwitch node; dma-buf export. */
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: v = d->mig < 0; break;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: v = 1; break;
    /* The issue fixes GPU i's NUMA node as i*K/N for both ids (a real x86 H100 reports
     * NUMA_CONFIG none and NUMA_ID -1; see README "Known differences"). */
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: v = CU_DEVICE_NUMA_CONFIG_NONE; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: v = g->numa_node; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = g->numa_node; break;
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- contexts */

#define CTX_MAGIC 0xc0c0face
#define MAX_CTX 1024
#define CTX_FLAGS_MASK 0xffu   /* sched (0..4), MAP_HOST 8, LMEM 16, COREDUMP 32/64, SYNC 128 */

struct fake_ctx {
    unsigned magic;
    int dev;                     /* ordinal */
    int primary;
    unsigned flags;
    unsigned char peer[FAKE_MAX_GPUS];
};

static struct fake_ctx *ctx_registry[MAX_CTX];
static struct fake_ctx primary_ctx[FAKE_MAX_GPUS];
static int primary_refs[FAKE_MAX_GPUS];
static unsigned primary_flags[FAKE_MAX_GPUS];

static __thread struct fake_ctx *ctx_stack[64];
static __thread int ctx_depth;

/* Caller holds fake_lock. */
int fake_ctx_valid(struct fake_ctx *c)
{
    if (!c)
        return 0;
    for (int i = 0; i < fake_visible_count; i++)
        if (c == &primary_ctx[i])
            return primary_refs[i] > 0;
    for (int i = 0; i < MAX_CTX; i++)
        if (ctx_registry[i] == c)
            return 1;
    return 0;
}

int fake_ctx_device(struct fake_ctx *c) { return c->dev; }

/* Caller holds fake_lock. */
CUresult fake_current_ctx(struct fake_ctx **out)
{
    struct fake_ctx *c = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    /* cuda.h cuCtxDestroy: a context destroyed while current to other threads gives
     * them CUDA_ERROR_CONTEXT_IS_DESTROYED. (Records are never freed, so c is readable.) */
    if (c && !fake_ctx_valid(c) && c->magic == 0)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (!c || !fake_ctx_valid(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    struct fake_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = CTX_MAGIC;
    c->dev = dev;
    c->flags = flags;
    pthread_mutex_lock(&fake_lock);
    int slot = -1;
    for (int i = 0; i < MAX_CTX && slot < 0; i++)
        if (!ctx_registry[i])
            slot = i;
    if (slot < 0 || ctx_depth == 64) {
        pthread_mutex_unlock(&fake_lock);
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ctx_registry[slot] = c;
    ctx_stack[ctx_depth++] = c;          /* "The created context is current" (cuda.h) */
    pthread_mutex_unlock(&fake_lock);
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

FAKE_API CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

FAKE_API CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                         int numParams, unsigned int flags, CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

FAKE_API CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                         unsigned int flags, CUdevice dev)
{
    if (ctxCreateParams && ctxCreateParams->numExecAffinityParams < 0)
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

static void stack_remove(struct fake_ctx *c)
{
    int w = 0;
    for (int r = 0; r < ctx_depth; r++)
        if (ctx_stack[r] != c)
            ctx_stack[w++] = ctx_stack[r];
    ctx_depth = w;
}

FAKE_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    CHECK_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    pthread_mutex_lock(&fake_lock);
    int slot = -1;
    for (int i = 0; i < MAX_CTX; i++)
        if (c && ctx_registry[i] == c)
            slot = i;
    if (slot < 0) {
        pthread_mutex_unlock(&fake_lock);
        /* includes primary contexts: they are released, never destroyed (cuda.h) */
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    ctx_registry[slot] = NULL;
    stack_remove(c);
    c->magic = 0;
    pthread_mutex_unlock(&fake_lock);
    /* Not freed: another thread may still hold the handle, and a new context at the same
     * address would make its stale handle valid again. A fake can afford the leak. */
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

FAKE_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = ctx_depth ? (CUcontext)ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    CHECK_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    pthread_mutex_lock(&fake_lock);
    if (c && !fake_ctx_valid(c)) {
        pthread_mutex_unlock(&fake_lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    pthread_mutex_unlock(&fake_lock);
    if (!c) {                            /* NULL pops (or is a no-op on an empty stack) */
        if (ctx_depth)
            ctx_depth--;
    } else if (ctx_depth) {
        ctx_stack[ctx_depth - 1] = c;    /* replaces the top of the stack */
    } else {
        ctx_stack[ctx_depth++] = c;
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    CHECK_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    pthread_mutex_lock(&fake_lock);
    int ok = fake_ctx_valid(c);
    pthread_mutex_unlock(&fake_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 64)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CHECK_INIT();
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_ctx *c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
FAKE_API CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

FAKE_API CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    CHECK_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS)
        *device = c->dev;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* CUDA 13 (cuCtxGetDevice_v13000): the device of `ctx`, or of the current context when
 * ctx is NULL. */
FAKE_API CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    CHECK_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    CUresult r = CUDA_SUCCESS;
    if (!c)
        r = fake_current_ctx(&c);
    else if (!fake_ctx_valid(c))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS)
        *device = c->dev;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags)
{
    CHECK_INIT();
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS)
        *flags = c->primary ? primary_flags[c->dev] : c->flags;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    CHECK_INIT();
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    CUresult r = CUDA_SUCCESS;
    if (!c)
        r = fake_current_ctx(&c);
    else if (!fake_ctx_valid(c))
        r = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&fake_lock);
    if (r == CUDA_SUCCESS)
        *version = 3020;
    return r;
}

FAKE_API CUresult CUDAAPI cuCtxSynchronize(void)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    pthread_mutex_unlock(&fake_lock);
    return r;                            /* all work is synchronous in the fake */
}

/* CUDA 13 (cuCtxSynchronize_v13000): synchronize `ctx`, or the current context when NULL. */
FAKE_API CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    CUresult r = CUDA_SUCCESS;
    if (!c)
        r = fake_current_ctx(&c);
    else if (!fake_ctx_valid(c))
        r = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&fake_lock);
    return r;                            /* all work is synchronous in the fake */
}

/* Primary contexts: one per visible device, same handle across retain/release cycles. */
FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c = &primary_ctx[dev];
    c->magic = CTX_MAGIC;
    c->dev = dev;
    c->primary = 1;
    primary_refs[dev]++;
    pthread_mutex_unlock(&fake_lock);
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CHECK_INIT();
    CHECK_DEV(dev);
    pthread_mutex_lock(&fake_lock);
    CUresult r = CUDA_SUCCESS;
    if (primary_refs[dev] <= 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--primary_refs[dev] == 0)
        memset(primary_ctx[dev].peer, 0, sizeof primary_ctx[dev].peer);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CHECK_INIT();
    CHECK_DEV(dev);
    if (flags & ~CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    primary_flags[dev] = flags;
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CHECK_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    pthread_mutex_lock(&fake_lock);
    *flags = primary_flags[dev];
    *active = primary_refs[dev] > 0;
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
}

/* D-reset: Reset drops peer mappings and flags; the retain count is kept, so a context
 * retained before the reset is still usable (cuda.h: "the primary context ... will be
 * destroyed ... next retain creates a new one"; the fake reuses the same handle). */
FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CHECK_INIT();
    CHECK_DEV(dev);
    pthread_mutex_lock(&fake_lock);
    primary_flags[dev] = 0;
    memset(primary_ctx[dev].peer, 0, sizeof primary_ctx[dev].peer);
    pthread_mutex_unlock(&fake_lock);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

/* ---------------------------------------------------------------- peer access */

static int is_mig(int dev) { return fake_visible[dev].mig >= 0; }

/* 1 for any two distinct visible GPUs; MIG instances have no peer access (MIG User Guide). */
FAKE_API CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    CHECK_INIT();
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(dev);
    CHECK_DEV(peerDev);
    *canAccessPeer = dev != peerDev && !is_mig(dev) && !is_mig(peerDev);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    CHECK_INIT();
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *cur, *peer = (struct fake_ctx *)peerContext;
    CUresult r = fake_current_ctx(&cur);
    if (r == CUDA_SUCCESS && !fake_ctx_valid(peer))
        r = CUDA_ERROR_INVALID_CONTEXT;
    /* cuda.h: INVALID_CONTEXT "if the current context is peerContext"; UNSUPPORTED when
     * cuDeviceCanAccessPeer says no, which includes two contexts on one device. */
    if (r == CUDA_SUCCESS) {
        if (peer == cur)
            r = CUDA_ERROR_INVALID_CONTEXT;
        else if (peer->dev == cur->dev || is_mig(peer->dev) || is_mig(cur->dev))
            r = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        else if (cur->peer[peer->dev])
            r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        else
            cur->peer[peer->dev] = 1;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *cur, *peer = (struct fake_ctx *)peerContext;
    CUresult r = fake_current_ctx(&cur);
    if (r == CUDA_SUCCESS && !fake_ctx_valid(peer))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        if (!cur->peer[peer->dev])
            r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
        else
            cur->peer[peer->dev] = 0;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ---------------------------------------------------------------- streams */

#define STREAM_MAGIC 0x57ea4a11
struct fake_stream {
    unsigned magic;
    struct fake_ctx *ctx;
    unsigned flags;
    int priority;
};

#define MAX_STREAMS 4096
static struct fake_stream *stream_registry[MAX_STREAMS];

/* Caller holds fake_lock. NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD need a current
 * context; a created stream must still exist. */
CUresult fake_stream_check(CUstream s)
{
    struct fake_ctx *c;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return fake_current_ctx(&c);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (stream_registry[i] == (struct fake_stream *)s)
            return fake_ctx_valid(stream_registry[i]->ctx) ? CUDA_SUCCESS
                                                          : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_ERROR_INVALID_HANDLE;
}

static CUresult stream_create(CUstream *ph, unsigned flags, int priority)
{
    CHECK_INIT();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        for (int i = 0; i < MAX_STREAMS; i++) {
            if (!stream_registry[i]) {
                struct fake_stream *s = calloc(1, sizeof *s);
                if (!s)
                    break;
                *s = (struct fake_stream){STREAM_MAGIC, c, flags, priority};
                stream_registry[i] = s;
                *ph = (CUstream)s;
                r = CUDA_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return stream_create(phStream, Flags, 0);
}

FAKE_API CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    /* range [-5, 0] as on H100 (cuCtxGetStreamPriorityRange); out of range is clamped */
    if (priority < -5)
        priority = -5;
    if (priority > 0)
        priority = 0;
    return stream_create(phStream, flags, priority);
}

FAKE_API CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    CHECK_INIT();
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < MAX_STREAMS; i++) {
        if (hStream && stream_registry[i] == (struct fake_stream *)hStream) {
            free(stream_registry[i]);
            stream_registry[i] = NULL;
            r = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

/* cuda.h: "Query the priority of a given stream"; the NULL (legacy or per-thread) stream has
 * the default priority 0. */
static CUresult stream_priority(CUstream hStream, int *priority)
{
    CHECK_INIT();
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    CUresult r = fake_stream_check(hStream);
    if (r == CUDA_SUCCESS)
        *priority = (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
                        ? 0 : ((struct fake_stream *)hStream)->priority;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int *priority) { return stream_priority(hStream, priority); }
FAKE_API CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream hStream, int *priority) { return stream_priority(hStream, priority); }

static CUresult stream_sync(CUstream s)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    CUresult r = fake_stream_check(s);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream); }
FAKE_API CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream); }
FAKE_API CUresult CUDAAPI cuStreamQuery(CUstream hStream) { return stream_sync(hStream); }
FAKE_API CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) { return stream_sync(hStream); }

/* ---------------------------------------------------------------- events */

#define EVENT_MAGIC 0xe7e47000
#define MAX_EVENTS 4096
#define IPC_EVENT_MAGIC 0x46434556u   /* "FCEV" */

/* Shared page of an interprocess event: exporter and importers see the same record count. */
struct ipc_event_page {
    unsigned magic;
    int gpu;
    unsigned long long records;
};

struct fake_event {
    unsigned magic;
    struct fake_ctx *ctx;
    unsigned flags;
    int recorded;
    struct timespec when;
    int fd;                        /* interprocess: memfd of the shared page, else -1 */
    struct ipc_event_page *page;
    int imported;
};

static struct fake_event *event_registry[MAX_EVENTS];

static struct fake_event *event_lookup(CUevent e)
{
    for (int i = 0; i < MAX_EVENTS; i++)
        if (e && event_registry[i] == (struct fake_event *)e)
            return event_registry[i];
    return NULL;
}

static CUresult event_register(struct fake_event *ev)
{
    for (int i = 0; i < MAX_EVENTS; i++) {
        if (!event_registry[i]) {
            event_registry[i] = ev;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_API CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    CHECK_INIT();
    unsigned all = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~all))
        return CUDA_ERROR_INVALID_VALUE;
    /* cuda.h: CU_EVENT_INTERPROCESS "... CU_EVENT_DISABLE_TIMING must be set" */
    if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    struct fake_event *ev = NULL;
    if (r == CUDA_SUCCESS) {
        ev = calloc(1, sizeof *ev);
        r = ev ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        *ev = (struct fake_event){EVENT_MAGIC, c, Flags, 0, {0, 0}, -1, NULL, 0};
        if (Flags & CU_EVENT_INTERPROCESS) {
            ev->fd = memfd_create("fakecuda-event", MFD_CLOEXEC);
            if (ev->fd < 0 || ftruncate(ev->fd, 4096) ||
                (ev->page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ev->fd, 0)) ==
                    MAP_FAILED) {
                if (ev->fd >= 0)
                    close(ev->fd);
                free(ev);
                pthread_mutex_unlock(&fake_lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            ev->page->magic = IPC_EVENT_MAGIC;
            ev->page->gpu = fake_visible[c->dev].gpu;
        }
        r = event_register(ev);
        if (r == CUDA_SUCCESS)
            *phEvent = (CUevent)ev;
        else
            free(ev);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static CUresult event_record(CUevent hEvent, CUstream hStream)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    struct fake_event *ev = event_lookup(hEvent);
    CUresult r = ev ? fake_stream_check(hStream) : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS) {
        ev->recorded = 1;
        clock_gettime(CLOCK_MONOTONIC, &ev->when);
        if (ev->page)
            __atomic_add_fetch(&ev->page->records, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream); }
FAKE_API CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream); }
FAKE_API CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    return event_record(hEvent, hStream);
}
FAKE_API CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return cuEventRecordWithFlags(hEvent, hStream, flags);
}

static CUresult event_check(CUevent hEvent)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    CUresult r = event_lookup(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&fake_lock);
    return r;                 /* work completes at once: every recorded event is done */
}

FAKE_API CUresult CUDAAPI cuEventQuery(CUevent hEvent) { return event_check(hEvent); }
FAKE_API CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) { return event_check(hEvent); }

static CUresult stream_wait_event(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    CHECK_INIT();
    if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    CUresult r = event_lookup(hEvent) ? fake_stream_check(hStream) : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return stream_wait_event(hStream, hEvent, Flags);
}
FAKE_API CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return stream_wait_event(hStream, hEvent, Flags);
}

FAKE_API CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    CHECK_INIT();
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_event *a = event_lookup(hStart), *b = event_lookup(hEnd);
    CUresult r = CUDA_SUCCESS;
    if (!a || !b)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded || !b->recorded)
        r = CUDA_ERROR_NOT_READY;
    else
        *pMilliseconds = (float)((b->when.tv_sec - a->when.tv_sec) * 1e3 +
                                 (b->when.tv_nsec - a->when.tv_nsec) / 1e6);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    CHECK_INIT();
    pthread_mutex_lock(&fake_lock);
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < MAX_EVENTS; i++) {
        struct fake_event *ev = event_registry[i];
        if (hEvent && ev == (struct fake_event *)hEvent) {
            if (ev->page)
                munmap(ev->page, 4096);
            if (ev->fd >= 0)
                close(ev->fd);
            free(ev);
            event_registry[i] = NULL;
            r = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

/* Legacy IPC event handle: opaque to clients. The importer opens the exporter's memfd via
 * /proc/<pid>/fd/<fd> (the exporter must be alive, as with the real driver). */
struct ipc_event_handle {
    unsigned magic;
    int pid;
    int fd;
    int gpu;
    unsigned long long ino;
    char pad[64 - 24];
};
_Static_assert(sizeof(struct ipc_event_handle) == CU_IPC_HANDLE_SIZE, "handle size");

FAKE_API CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    CHECK_INIT();
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    struct fake_event *ev = event_lookup(event);
    CUresult r = CUDA_SUCCESS;
    if (!ev)
        r = CUDA_ERROR_INVALID_HANDLE;
    /* cuda.h: "The event must have been created with CU_EVENT_INTERPROCESS and
     * CU_EVENT_DISABLE_TIMING flags set", else CUDA_ERROR_INVALID_VALUE. */
    else if (!ev->page || ev->imported)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        struct stat st;
        fstat(ev->fd, &st);
        struct ipc_event_handle h = {IPC_EVENT_MAGIC, getpid(), ev->fd, ev->page->gpu,
                                     (unsigned long long)st.st_ino, {0}};
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle, &h, sizeof h);
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}

FAKE_API CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    CHECK_INIT();
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_event_handle h;
    memcpy(&h, &handle, sizeof h);
    if (h.magic != IPC_EVENT_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    /* D-ipcself: opening a handle in the process that exported it fails, as IPC memory. */
    if (h.pid == getpid())
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fake_lock);
    struct fake_ctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&fake_lock);
        return r;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    struct fake_event *ev = NULL;
    if (fd < 0 || fstat(fd, &st) || (unsigned long long)st.st_ino != h.ino) {
        r = CUDA_ERROR_INVALID_VALUE;        /* D-ipcstale: exporter gone or fd reused */
        goto out;
    }
    ev = calloc(1, sizeof *ev);
    if (!ev) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *ev = (struct fake_event){EVENT_MAGIC, c, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING,
                              0, {0, 0}, fd, NULL, 1};
    ev->page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ev->page == MAP_FAILED || ev->page->magic != IPC_EVENT_MAGIC) {
        if (ev->page != MAP_FAILED)
            munmap(ev->page, 4096);
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    r = event_register(ev);
    if (r == CUDA_SUCCESS) {
        *phEvent = (CUevent)ev;
        ev = NULL;
        fd = -1;
    }
out:
    if (ev)
        free(ev);
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Test hook (not a CUDA API): how many times an interprocess event was recorded, summed
 * over every process that holds it. Lets tests prove two processes share one event. */
FAKE_API int fakecuda_ipc_event_records(CUevent hEvent)
{
    pthread_mutex_lock(&fake_lock);
    struct fake_event *ev = event_lookup(hEvent);
    int n = ev && ev->page ? (int)__atomic_load_n(&ev->page->records, __ATOMIC_SEQ_CST) : -1;
    pthread_mutex_unlock(&fake_lock);
    return n;
}

/* ---------------------------------------------------------------- errors */

static const struct fakecuda_error *error_lookup(CUresult e)
{
    for (unsigned i = 0; i < fakecuda_errors_len; i++)
        if (fakecuda_errors[i].code == (int)e)
            return &fakecuda_errors[i];
    return NULL;
}

FAKE_API CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fakecuda_error *e = error_lookup(error);
    *pStr = e ? e->desc : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fakecuda_error *e = error_lookup(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------------- entry points */

/* cuda.h cuGetProcAddress: the newest variant introduced at or before cudaVersion;
 * PER_THREAD_DEFAULT_STREAM selects the _ptds/_ptsz variant where one exists ("If a
 * per-thread version is not found, the API will return the legacy version"); DEFAULT (0)
 * means legacy, as for code built without CUDA_API_PER_THREAD_DEFAULT_STREAM.
 * Unknown symbol or version too low: CUDA_SUCCESS, *pfn = NULL and the status says why.
 * Works before cuInit (the runtime fetches cuInit itself this way). */
static CUresult proc_address(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    unsigned lo = 0, hi = fakecuda_routes_len;
    while (lo < hi) {                            /* first entry with name >= symbol */
        unsigned mid = (lo + hi) / 2;
        if (strcmp(fakecuda_routes[mid].name, symbol) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    const struct fakecuda_route *legacy = NULL, *pt = NULL;
    int found = 0;
    for (unsigned i = lo; i < fakecuda_routes_len && !strcmp(fakecuda_routes[i].name, symbol); i++) {
        const struct fakecuda_route *r = &fakecuda_routes[i];
        found = 1;
        if (r->version > cudaVersion)
            continue;
        if (r->per_thread) {
            if (!pt || r->version > pt->version)
                pt = r;
        } else if (!legacy || r->version > legacy->version) {
            legacy = r;
        }
    }
    const struct fakecuda_route *pick = legacy;
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && pt &&
        (!legacy || pt->version >= legacy->version))
        pick = pt;
    if (!pick) {
        if (status)
            *status = found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_SUCCESS;
    }
    *pfn = (void *)pick->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                           cuuint64_t flags)
{
    return proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

FAKE_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                              cuuint64_t flags,
                                              CUdriverProcAddressQueryResult *symbolStatus)
{
    return proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

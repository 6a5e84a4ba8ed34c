/* Fake driver functions about a device's graph memory, its 1D linear textures and its
 * atomic operations: cuDeviceGraphMemTrim, cuDeviceGetGraphMemAttribute,
 * cuDeviceSetGraphMemAttribute, cuDeviceGetTexture1DLinearMaxWidth (cuda.h 12.9) and
 * CUDA 13's cuDeviceGetHostAtomicCapabilities and cuDeviceGetP2PAtomicCapabilities. They
 * exist so rankguard's path tests see these calls (and the runtime's cudaDeviceGraphMemTrim,
 * ...) succeed on the rank's own device with the driver's documented argument checks, and
 * fail on an invalid one with the driver's own error, so a denial is the guard's.
 * Decisions: D-graphmem, D-tex1d, D-atomic in c-tests/README.md. Compiled against the 13.x
 * cuda.h (driver.mk), which declares the 12.9 functions too. */
#include "fake.h"

#define CHECK_INIT()                         \
    do {                                     \
        CUresult r_ = fake_check_init();     \
        if (r_ != CUDA_SUCCESS)              \
            return r_;                       \
    } while (0)

static int valid_device(CUdevice d) { return d >= 0 && d < fake_visible_count; }

/* D-graphmem: the fake has no graphs, so no device ever holds graph memory: trimming has
 * nothing to free, every attribute reads 0, and the high watermarks reset (to 0, the only
 * value cuda.h allows setting) trivially. */
FAKE_API CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device)
{
    CHECK_INIT();
    return valid_device(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FAKE_API CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                       void *value)
{
    CHECK_INIT();
    if (!valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* cuda.h: only the high watermarks can be set, and only reset to 0. */
FAKE_API CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                       void *value)
{
    CHECK_INIT();
    if (!valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value || *(cuuint64_t *)value != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* D-tex1d: 2^28 elements for every format and 1, 2 or 4 channels (the CUDA C++
 * Programming Guide's 1D linear texture width limit for compute capability 9.0); any other
 * channel count or an unknown format is CUDA_ERROR_INVALID_VALUE. */
FAKE_API CUresult CUDAAPI cuDeviceGetTexture1DLinearMaxWidth(size_t *maxWidthInElements, CUarray_format format,
                                                             unsigned numChannels, CUdevice dev)
{
    CHECK_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!maxWidthInElements || (numChannels != 1 && numChannels != 2 && numChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_HALF:
    case CU_AD_FORMAT_FLOAT:
        *maxWidthInElements = (size_t)1 << 28;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* D-atomic: the host link (PCIe) natively does 32- and 64-bit integer add, exchange and
 * compare-and-swap (add also signed and unsigned); a link between two whole GPUs (NVLink:
 * D-p2p) does every integer operation signed and unsigned, with reductions, at 32 and 64
 * bits, and the float ones at 32 and 64 bits; MIG instances are no peers (0 for every
 * operation). An operation outside CUatomicOperation is CUDA_ERROR_INVALID_VALUE. */
static int atomic_ops_valid(const unsigned *capabilities, const CUatomicOperation *operations, unsigned count)
{
    if (!capabilities || !operations || count == 0)
        return 0;
    for (unsigned i = 0; i < count; i++)
        if ((unsigned)operations[i] >= (unsigned)CU_ATOMIC_OPERATION_MAX)
            return 0;
    return 1;
}

static unsigned host_atomic(CUatomicOperation op)
{
    const unsigned scalar = CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
    switch (op) {
    case CU_ATOMIC_OPERATION_INTEGER_ADD:
        return scalar | CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED;
    case CU_ATOMIC_OPERATION_EXCHANGE:
    case CU_ATOMIC_OPERATION_CAS:
        return scalar;
    default:
        return 0;
    }
}

static unsigned peer_atomic(CUatomicOperation op)
{
    const unsigned scalar = CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
    switch (op) {
    case CU_ATOMIC_OPERATION_FLOAT_ADD:
    case CU_ATOMIC_OPERATION_FLOAT_MIN:
    case CU_ATOMIC_OPERATION_FLOAT_MAX:
        return scalar;
    default:
        return scalar | CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED |
               CU_ATOMIC_CAPABILITY_REDUCTION;
    }
}

FAKE_API CUresult CUDAAPI cuDeviceGetHostAtomicCapabilities(unsigned int *capabilities,
                                                            const CUatomicOperation *operations,
                                                            unsigned int count, CUdevice dev)
{
    CHECK_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!atomic_ops_valid(capabilities, operations, count))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++)
        capabilities[i] = host_atomic(operations[i]);
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuDeviceGetP2PAtomicCapabilities(unsigned int *capabilities,
                                                           const CUatomicOperation *operations,
                                                           unsigned int count, CUdevice srcDevice,
                                                           CUdevice dstDevice)
{
    CHECK_INIT();
    if (!valid_device(srcDevice) || !valid_device(dstDevice) || srcDevice == dstDevice)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!atomic_ops_valid(capabilities, operations, count))
        return CUDA_ERROR_INVALID_VALUE;
    int peers = fake_visible[srcDevice].mig < 0 && fake_visible[dstDevice].mig < 0;
    for (unsigned i = 0; i < count; i++)
        capabilities[i] = peers ? peer_atomic(operations[i]) : 0;
    return CUDA_SUCCESS;
}

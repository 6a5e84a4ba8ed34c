/* Fake driver functions about a device's graph memory and its 1D linear textures:
 * cuDeviceGraphMemTrim, cuDeviceGetGraphMemAttribute, cuDeviceSetGraphMemAttribute and
 * cuDeviceGetTexture1DLinearMaxWidth (cuda.h 12.9). They exist so rankguard's path tests
 * see these calls (and the runtime's cudaDeviceGraphMemTrim, ...) succeed on the rank's own
 * device with the driver's documented argument checks, and fail on an invalid one with the
 * driver's own error, so a denial is the guard's. Decisions: D-graphmem, D-tex1d in
 * c-tests/README.md. */
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

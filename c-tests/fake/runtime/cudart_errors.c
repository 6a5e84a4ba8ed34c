/* cudart_errors.c: cudaGetErrorName/cudaGetErrorString, the last-error calls, and how
 * driver results become runtime errors.
 *
 * Why it exists: tests (and rankguard's messages) print runtime error names and strings,
 * so they must read like the real runtime's. Names come from NVIDIA's driver_types.h itself
 * (runtime.mk generates fakecudart_error_names.h from the cudaError enum), so every code
 * of the pinned headers has its real name.
 */
#include <stddef.h>

#include "cudart_internal.h"

struct rt_error_name {
    int code;
    const char *name;
};

static const struct rt_error_name error_names[] = {
#include "fakecudart_error_names.h"
};

/* The real runtime's message strings for the codes this fake (and rankguard) produce.
 * Decision (docs silent on the exact text): these are the strings the real
 * libcudart.so.12 returns; a valid code not listed here returns its name, an invalid one
 * "unrecognized error code" (as the real runtime does for unknown values). */
static const struct rt_error_name error_strings[] = {
    { cudaSuccess,                       "no error" },
    { cudaErrorInvalidValue,             "invalid argument" },
    { cudaErrorMemoryAllocation,         "out of memory" },
    { cudaErrorInitializationError,      "initialization error" },
    { cudaErrorCudartUnloading,          "driver shutting down" },
    { cudaErrorInvalidDevicePointer,     "invalid device pointer" },
    { cudaErrorInvalidMemcpyDirection,   "invalid copy direction for memcpy" },
    { cudaErrorStubLibrary,              "CUDA driver is a stub library" },
    { cudaErrorInsufficientDriver,
      "CUDA driver version is insufficient for CUDA runtime version" },
    { cudaErrorCallRequiresNewerDriver,  "API call is not supported in the installed CUDA driver" },
    { cudaErrorDevicesUnavailable,       "CUDA-capable device(s) is/are busy or unavailable" },
    { cudaErrorNoDevice,                 "no CUDA-capable device is detected" },
    { cudaErrorInvalidDevice,            "invalid device ordinal" },
    { cudaErrorDeviceNotLicensed,        "device doesn't have valid Grid license" },
    { cudaErrorDeviceUninitialized,      "invalid device context" },
    { cudaErrorMapBufferObjectFailed,    "mapping of buffer object failed" },
    { cudaErrorPeerAccessUnsupported,    "peer access is not supported between these two devices" },
    { cudaErrorOperatingSystem,          "OS call failed or operation not supported on this OS" },
    { cudaErrorInvalidResourceHandle,    "invalid resource handle" },
    { cudaErrorSymbolNotFound,           "named symbol not found" },
    { cudaErrorNotReady,                 "device not ready" },
    { cudaErrorIllegalAddress,           "an illegal memory access was encountered" },
    { cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled" },
    { cudaErrorPeerAccessNotEnabled,     "peer access has not been enabled" },
    { cudaErrorSetOnActiveProcess,       "cannot set while device is active in this process" },
    { cudaErrorContextIsDestroyed,       "context is destroyed" },
    { cudaErrorTooManyPeers,             "peer mapping resources exhausted" },
    { cudaErrorNotPermitted,             "operation not permitted" },
    { cudaErrorNotSupported,             "operation not supported" },
    { cudaErrorSystemNotReady,           "system not yet initialized" },
    { cudaErrorSystemDriverMismatch,
      "system has unsupported display driver / cuda driver combination" },
    { cudaErrorUnknown,                  "unknown error" },
};

static const char *lookup(const struct rt_error_name *t, size_t n, int code)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].code == code)
            return t[i].name;
    return NULL;
}

RT_EXPORT const char *cudaGetErrorName(cudaError_t error)
{
    const char *s = lookup(error_names, sizeof error_names / sizeof error_names[0], error);
    return s ? s : "unrecognized error code";
}

RT_EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    const char *s = lookup(error_strings, sizeof error_strings / sizeof error_strings[0], error);
    if (s)
        return s;
    s = lookup(error_names, sizeof error_names / sizeof error_names[0], error);
    return s ? s : "unrecognized error code";
}

RT_EXPORT cudaError_t cudaGetLastError(void)
{
    return rt_last_error(1);
}

RT_EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return rt_last_error(0);
}

/* Decision: since CUDA 10.x the runtime's cudaError values equal the driver's CUresult
 * values for every condition both report (driver_types.h and cuda.h list the same numbers:
 * 1 invalid value, 2 out of memory, 100 no device, 101 invalid device, 201 invalid
 * context / device uninitialized, 400 invalid handle, 500 not found, 600 not ready,
 * 704/705 peer access, 800 not permitted, 801 not supported, ...), so the mapping is the
 * identity for codes the runtime enum has, and cudaErrorUnknown for any other. */
cudaError_t rt_map(CUresult r)
{
    if (r == CUDA_SUCCESS)
        return cudaSuccess;
    if (lookup(error_names, sizeof error_names / sizeof error_names[0], (int)r))
        return (cudaError_t)r;
    return cudaErrorUnknown;
}

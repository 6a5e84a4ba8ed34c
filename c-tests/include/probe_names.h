/* Names defined by both RTLD_NEXT probe libraries (testlibs/libnext_a.c, libnext_b.c) and
 * looked up by tests/guard_dlsym_names.c. None is a guarded CUDA function, so with the
 * guard preloaded each must resolve exactly as without it. They cover every way the
 * guard's dlsym can decide: not starting with "cu", rejected at byte 2 (curl_*, cublas*,
 * cufft*), at byte 3 (cudnn*), at byte 4 (cuda_*), the bare prefixes, and names of the
 * guarded shape that are not in its table (cu<Upper>..., cuda<Upper>...), which take the
 * slow path and must still be forwarded. */
#ifndef PROBE_NAMES_H
#define PROBE_NAMES_H
#define PROBE_NAMES(X) \
    X(plain_probe)     \
    X(c)               \
    X(cu)              \
    X(cud)             \
    X(cuda)            \
    X(curl_easy_init)  \
    X(cublasCreate_v2) \
    X(cufftPlan1d)     \
    X(cudnnCreate)     \
    X(cuda_probe)      \
    X(cudaz)           \
    X(cuProbeNotGuarded) \
    X(cudaProbeNotGuarded)
#endif

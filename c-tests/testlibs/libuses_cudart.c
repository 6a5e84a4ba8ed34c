/* A library that links the CUDA runtime, as libtorch_cuda.so does, for a program to
 * dlopen with RTLD_LOCAL: the runtime is then in this library's local scope only, not in
 * the global scope where the guard's RTLD_NEXT lookup looks first. */
#include <cuda_runtime_api.h>
int uses_set_device(int device) { return (int)cudaSetDevice(device); }
/* The device this library's own runtime copy holds as current (cudaGetDevice is not
 * guarded: it always reaches this copy). */
int uses_get_device(void) { int d = -1; return cudaGetDevice(&d) ? -2 : d; }

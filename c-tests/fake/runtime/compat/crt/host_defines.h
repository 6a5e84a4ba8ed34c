/* compat/crt/host_defines.h: host-compiler stand-in for NVIDIA's crt/host_defines.h.
 *
 * Why it exists: cuda_runtime_api.h, driver_types.h and vector_types.h include
 * "crt/host_defines.h", which the pinned nvidia-cuda-runtime-cu12 wheel does not ship (it
 * comes with the nvcc package). For a plain C compiler (no __CUDACC__) that header only
 * defines decorations: the location qualifiers (__host__, __device__, ...) and the
 * builtin markers expand to nothing, alignment macros to GCC's aligned attribute, and the
 * calling convention CUDARTAPI to nothing on Linux. This file defines exactly those, for
 * a host compile only. It is found through -idirafter (runtime.mk), so a real
 * crt/host_defines.h next to the headers always wins; if NVIDIA's headers ever need more
 * from it, the build fails loudly instead of guessing.
 */
#ifndef FAKECUDA_COMPAT_CRT_HOST_DEFINES_H
#define FAKECUDA_COMPAT_CRT_HOST_DEFINES_H

#if defined(__CUDACC__) || !defined(__GNUC__)
#error "fakecuda compat crt/host_defines.h serves host-side GCC/Clang compiles only"
#endif

#define __no_return__ __attribute__((noreturn))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __align__(n)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a)
#define __location__(a)
#define __specialization_static
#define CUDARTAPI
#define CUDARTAPI_CDECL

#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __global__
#define __global__
#endif
#ifndef __shared__
#define __shared__
#endif
#ifndef __constant__
#define __constant__
#endif
#ifndef __managed__
#define __managed__
#endif
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__

#endif

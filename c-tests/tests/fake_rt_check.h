/* fake_rt_check.h: the self-check helpers of the fake runtime's C test programs
 * (c-tests/tests/fake_rt_*.c, driven by python-tests/test_fake_runtime*.py).
 *
 * Why it exists: every program prints each check it makes ("ok ..." or "FAIL file:line
 * ...") and exits non-zero if any failed, so pytest output shows exactly what broke.
 */
#ifndef FAKE_RT_CHECK_H
#define FAKE_RT_CHECK_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

static int rt_failures;

#define CHECK(cond, ...) do {                                                     \
    if (cond) {                                                                   \
        printf("ok   ");                                                          \
    } else {                                                                      \
        printf("FAIL %s:%d: ", __FILE__, __LINE__);                               \
        rt_failures++;                                                            \
    }                                                                             \
    printf(__VA_ARGS__);                                                          \
    printf("\n");                                                                 \
    fflush(stdout);                                                               \
} while (0)

/* A runtime call must return exactly `want`. */
#define EXPECT_RT(call, want) do {                                                \
    cudaError_t e_ = (call), w_ = (want);                                         \
    CHECK(e_ == w_, "%s -> %s (%d), want %s (%d)", #call, cudaGetErrorName(e_),   \
          (int)e_, cudaGetErrorName(w_), (int)w_);                                \
} while (0)

/* A driver call must return exactly `want`. */
#define EXPECT_CU(call, want) do {                                                \
    CUresult e_ = (call), w_ = (want);                                            \
    CHECK(e_ == w_, "%s -> %d, want %d", #call, (int)e_, (int)w_);                \
} while (0)

/* A call that must succeed for the rest of the program to make sense. */
#define MUST_RT(call) do {                                                        \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
        printf("FAIL %s:%d: %s -> %s (%d); cannot continue\n", __FILE__, __LINE__, \
               #call, cudaGetErrorName(e_), (int)e_);                             \
        exit(1);                                                                  \
    }                                                                             \
} while (0)

static inline int rt_done(const char *prog)
{
    printf("%s: %s (%d failed)\n", prog, rt_failures ? "FAILED" : "all checks passed",
           rt_failures);
    return rt_failures ? 1 : 0;
}

#endif

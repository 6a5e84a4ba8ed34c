/* Helpers shared by the fake driver's self-checking C test programs (c-tests/tests/
 * fake_drv_*.c): every check prints what it verified and counts failures, so a program
 * exits non-zero when anything it checked was wrong. */
#ifndef FAKECUDA_DRVTEST_H
#define FAKECUDA_DRVTEST_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static int drvtest_failures;

/* Test hooks the fake driver exports besides the CUDA API (c-tests/README.md): the
 * physical GPU a pointer's memory lives on (-1 unknown), and how many times an
 * interprocess event was recorded across all processes sharing it. */
int fakecuda_pointer_physical_gpu(CUdeviceptr p);
int fakecuda_ipc_event_records(CUevent e);

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (cond) {                                                         \
            printf("ok   ");                                                \
        } else {                                                            \
            printf("FAIL ");                                                \
            drvtest_failures++;                                             \
        }                                                                   \
        printf(__VA_ARGS__);                                                \
        printf("  [%s:%d]\n", __FILE__, __LINE__);                          \
        fflush(stdout);                                                     \
    } while (0)

/* Expect a CUresult. */
#define EXPECT_RC(call, want)                                               \
    do {                                                                    \
        CUresult got_ = (call);                                             \
        EXPECT(got_ == (want), "%s -> %d (want %d)", #call, (int)got_, (int)(want)); \
    } while (0)

/* A step that must succeed for the rest to make sense. */
#define MUST(call)                                                          \
    do {                                                                    \
        CUresult got_ = (call);                                             \
        if (got_ != CUDA_SUCCESS) {                                         \
            printf("FAIL %s -> %d, cannot continue  [%s:%d]\n", #call,      \
                   (int)got_, __FILE__, __LINE__);                          \
            exit(2);                                                        \
        }                                                                   \
    } while (0)

static inline int drvtest_done(void)
{
    printf("%s: %d failure(s)\n", drvtest_failures ? "FAILED" : "PASSED", drvtest_failures);
    return drvtest_failures ? 1 : 0;
}

#endif

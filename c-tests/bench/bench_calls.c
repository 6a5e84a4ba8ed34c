/* bench_calls: the cost of one CUDA call on the guard's allowed path, measured in a tight
 * loop inside one process. scripts/bench runs it alternately with and without
 * librankguard.so in LD_PRELOAD and compares the two (interleaved rounds, median).
 *
 *   bench_calls CASE N
 *
 * CASE  drv-link   cuDeviceGet(&d, 0) through the exported symbol (linked -lcuda)
 *       drv-gpa2   cuDeviceGet(&d, 0) through the pointer cuGetProcAddress_v2 returned
 *       rt-set     cudaSetDevice(0) through the (fake) runtime (linked -lcudart)
 *       drv-wrap   cuDeviceGetCount(&n): a guarded wrapper with no policy check
 *       drv-pass   cuDriverGetVersion(&v): a driver call the guard does not interpose
 *       drv-repeat cuDeviceGet(&d, 1) from one call site, again and again: under the guard in
 *                  warn mode with CUDA_VISIBLE_DEVICES=0,1, a repeated violation (the warm-up
 *                  takes the site's full records; every timed call is only counted)
 *       lock-add   no CUDA call: one relaxed atomic increment of a counter (`lock add`),
 *                  what a repeated violation's count costs on this CPU in a thread other
 *                  than the first to count its site
 *       rt-where   times nothing: prints which object and symbol the program's calls to
 *                  cudaSetDevice reach (dladdr of the address they use), as
 *                  "served_by=<file> symbol=<name> offset=0x<offset in the file's mapping>"
 * The same source is also linked with the CUDA 13 runtime (build/bench/bench_calls13,
 * bench.mk): its rt-set and rt-where cases are then the cu13 runtime's.
 * Timed with the thread's CPU clock, after 1000 warm-up calls, in 10 chunks of N/10 calls:
 * the figure is the fastest chunk (see TIMED). N must be a multiple of 10.
 * Output: "case=<CASE> calls=<N> ns_per_call=<x>". Exit 0 on success, 1 if a call
 * failed (printed: a failing call would make the figure meaningless), 2 on bad arguments.
 * Needs CUDA_VISIBLE_DEVICES to name one device when run under the guard (R1).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this thread: time the scheduler gives to other processes (2 shared cores,
 * other builds running) is not counted, so the figure is the call's own cost. */
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* One loop per case; `rc |=` keeps every call's result live so nothing is elided (the
 * calls go through the PLT or a pointer into another library and cannot be inlined). */
#define LOOP(n, call) do { for (long i_ = 0; i_ < (n); i_++) rc |= (int)(call); } while (0)

/* TIMED(n, call): n calls in CHUNKS chunks; *ns becomes the fastest chunk's time scaled to
 * n calls. On a shared machine a chunk hit by a context switch (cold caches afterwards) is
 * slower; the fastest chunk is the call's own cost. */
#define CHUNKS 10
#define TIMED(n, call) do { \
        double best_ = -1; \
        for (int c_ = 0; c_ < CHUNKS; c_++) { \
            double t0_ = now_ns(); \
            LOOP((n) / CHUNKS, call); \
            double dt_ = now_ns() - t0_; \
            if (best_ < 0 || dt_ < best_) best_ = dt_; \
        } \
        *ns = best_ * CHUNKS; \
    } while (0)

static int run(const char *c, long n, double *ns)
{
    int rc = 0;
    CUdevice d = -1;
    int v = 0;
    if (!strcmp(c, "drv-link")) {
        LOOP(1000, cuDeviceGet(&d, 0));
        TIMED(n, cuDeviceGet(&d, 0));
    } else if (!strcmp(c, "drv-gpa2")) {
        PFN_cuDeviceGet_v2000 f = NULL;
        CUdriverProcAddressQueryResult st;
        CUresult r = cuGetProcAddress_v2("cuDeviceGet", (void **)&f, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
        if (r != CUDA_SUCCESS || !f || st != CU_GET_PROC_ADDRESS_SUCCESS) {
            fprintf(stderr, "bench_calls: cuGetProcAddress_v2(cuDeviceGet) failed: rc=%d status=%d\n", (int)r, (int)st);
            return 1;
        }
        LOOP(1000, f(&d, 0));
        TIMED(n, f(&d, 0));
    } else if (!strcmp(c, "rt-set")) {
        LOOP(1000, cudaSetDevice(0));
        TIMED(n, cudaSetDevice(0));
    } else if (!strcmp(c, "drv-wrap")) {
        LOOP(1000, cuDeviceGetCount(&v));
        TIMED(n, cuDeviceGetCount(&v));
    } else if (!strcmp(c, "drv-repeat")) {
        LOOP(1000, cuDeviceGet(&d, 1));
        TIMED(n, cuDeviceGet(&d, 1));
    } else if (!strcmp(c, "lock-add")) {
        static unsigned long count;
        LOOP(1000, (__atomic_fetch_add(&count, 1, __ATOMIC_RELAXED), 0));
        TIMED(n, (__atomic_fetch_add(&count, 1, __ATOMIC_RELAXED), 0));
    } else if (!strcmp(c, "drv-pass")) {
        LOOP(1000, cuDriverGetVersion(&v));
        TIMED(n, cuDriverGetVersion(&v));
    } else {
        fprintf(stderr, "bench_calls: unknown case '%s' (drv-link, drv-gpa2, rt-set, drv-wrap, drv-pass, drv-repeat, lock-add, rt-where)\n", c);
        return 2;
    }
    if (rc != 0) {
        fprintf(stderr, "bench_calls: %s: a timed call failed (or-ed result %d); "
                        "is CUDA_VISIBLE_DEVICES set to one device of the fake node?\n", c, rc);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    char *end = NULL;
    long n = argc == 3 ? strtol(argv[2], &end, 10) : 0;
    if (argc != 3 || !end || *end || n <= 0 || n % CHUNKS) {
        fprintf(stderr, "usage: bench_calls CASE N   (N: a positive multiple of %d)\n", CHUNKS);
        return 2;
    }
    if (!strcmp(argv[1], "rt-where")) {
        /* The address the linked calls use (read from the GOT in a PIE): the guard's wrapper
         * when it interposes, else the runtime's own function. */
        void *f = (void *)cudaSetDevice;
        Dl_info di;
        if (!dladdr(f, &di) || !di.dli_fname) {
            fprintf(stderr, "bench_calls: dladdr(cudaSetDevice) found no object\n");
            return 1;
        }
        printf("served_by=%s symbol=%s offset=0x%lx\n", di.dli_fname, di.dli_sname ? di.dli_sname : "?",
               (unsigned long)((char *)f - (char *)di.dli_fbase));
        return 0;
    }
    /* The runtime case initialises through cudaSetDevice itself, as programs do. */
    if (strcmp(argv[1], "rt-set") != 0) {
        CUresult r = cuInit(0);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "bench_calls: cuInit failed: %d\n", (int)r);
            return 1;
        }
    }
    double ns = 0;
    int rc = run(argv[1], n, &ns);
    if (rc)
        return rc;
    printf("case=%s calls=%ld ns_per_call=%.3f\n", argv[1], n, ns / (double)n);
    return 0;
}

/* bench_dlsym: the cost of dlsym for names that are not CUDA, which every preloaded
 * process pays through the guard's dlsym trampoline. scripts/bench runs it alternately
 * with and without librankguard.so in LD_PRELOAD.
 *
 *   bench_dlsym LIB NAME N
 *
 * dlopen(LIB) once, then N times dlsym(handle, NAME). NAME must exist in LIB (a failed
 * lookup takes a different, slower path in glibc and is not what programs do in a loop).
 * Timed with the thread's CPU clock, after 1000 warm-up lookups, in 10 chunks of N/10:
 * the figure is the fastest chunk.
 * Output: "name=<NAME> calls=<N> ns_per_call=<x>". Exit 1 if LIB or NAME is missing,
 * 2 on bad arguments.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
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

int main(int argc, char **argv)
{
    char *end = NULL;
    long n = argc == 4 ? strtol(argv[3], &end, 10) : 0;
    if (argc != 4 || !end || *end || n <= 0) {
        fprintf(stderr, "usage: bench_dlsym LIB NAME N   (N: a positive call count)\n");
        return 2;
    }
    /* The name is looked up from a fixed, 64-byte aligned buffer, not from argv: argv's
     * strings move with the size of the environment (LD_PRELOAD set or not), and glibc's
     * strcmp costs a few instructions more or less with the alignment of its arguments,
     * which would show up as a difference that is not the guard's. */
    static char name[256] __attribute__((aligned(64)));
    if (strlen(argv[2]) >= sizeof name) {
        fprintf(stderr, "bench_dlsym: NAME is longer than %zu bytes\n", sizeof name - 1);
        return 2;
    }
    strcpy(name, argv[2]);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "bench_dlsym: dlopen(%s): %s\n", argv[1], dlerror());
        return 1;
    }
    void *first = dlsym(h, name);
    if (!first) {
        fprintf(stderr, "bench_dlsym: %s not found in %s\n", argv[2], argv[1]);
        return 1;
    }
    for (int i = 0; i < 1000; i++)
        (void)dlsym(h, name);
    /* CHUNKS chunks of n/CHUNKS lookups; the figure is the fastest chunk (a chunk hit by a
     * context switch on a shared machine is slower for reasons that are not dlsym's). */
    enum { CHUNKS = 10 };
    uintptr_t acc = 0;
    double best = -1;
    for (int c = 0; c < CHUNKS; c++) {
        double t0 = now_ns();
        for (long i = 0; i < n / CHUNKS; i++)
            acc ^= (uintptr_t)dlsym(h, name);
        double dt = now_ns() - t0;
        if (best < 0 || dt < best)
            best = dt;
    }
    double ns = best * CHUNKS;
    /* Every lookup returned the same address: an odd count leaves it, an even one 0. */
    if (acc != (((n / CHUNKS * CHUNKS) & 1) ? (uintptr_t)first : 0)) {
        fprintf(stderr, "bench_dlsym: %s resolved to different addresses during the loop\n", argv[2]);
        return 1;
    }
    printf("name=%s calls=%ld ns_per_call=%.3f\n", argv[2], n, ns / (double)n);
    return 0;
}

/* bench_spawn: process start-up and launch wall time, variants measured side by side.
 * Spawning from C (posix_spawn + waitpid, environment arrays built once) keeps the
 * measuring harness out of the figure; a Python or shell timer adds its own milliseconds
 * and would flatten every ratio.
 *
 *   bench_spawn ROUNDS REPS NVAR { NAME NENV ENV... NARG ARG... } x NVAR
 *
 * Each variant is a name, an explicit environment (NENV "K=V" strings: nothing else is
 * inherited) and an argv whose first element is an absolute path. Each round runs every
 * variant REPS times back to back, timing the whole block; the variant order rotates from
 * round to round so drift on a noisy machine falls on every variant alike.
 * Output per variant: "variant=<NAME> rounds=<R> reps=<K> median_ns=<x> min_ns=<y>", the
 * median and minimum over rounds of the mean time per start; then one line per round:
 * "round=<r> <NAME>=<ns> ..." (for paired comparisons). Exit 1 if any child did not exit
 * 0 (printed with its status), 2 on bad arguments.
 */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

struct variant {
    const char *name;
    char **env;
    char **argv;
    double *round_ns;
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long number(const char *s, const char *what)
{
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : -1;
    if (!s || !end || *end || v < 0) {
        fprintf(stderr, "bench_spawn: %s must be a non-negative integer, got '%s'\n", what, s ? s : "(missing)");
        exit(2);
    }
    return v;
}

/* Take `count` arguments starting at argv[*i] as a NULL-terminated array. */
static char **take(int argc, char **argv, int *i, long count, const char *what)
{
    if (*i + count > argc) {
        fprintf(stderr, "bench_spawn: %s: %ld arguments announced, only %d left\n", what, count, argc - *i);
        exit(2);
    }
    char **out = calloc((size_t)count + 1, sizeof *out);
    if (!out) { perror("bench_spawn: calloc"); exit(2); }
    for (long k = 0; k < count; k++)
        out[k] = argv[(*i)++];
    return out;
}

extern char **environ;

int main(int argc, char **argv)
{
    int i = 1;
    long rounds = number(argc > i ? argv[i++] : NULL, "ROUNDS");
    long reps = number(argc > i ? argv[i++] : NULL, "REPS");
    long nvar = number(argc > i ? argv[i++] : NULL, "NVAR");
    if (rounds < 1 || reps < 1 || nvar < 1) {
        fprintf(stderr, "usage: bench_spawn ROUNDS REPS NVAR { NAME NENV ENV... NARG ARG... } x NVAR\n");
        return 2;
    }
    struct variant *v = calloc((size_t)nvar, sizeof *v);
    if (!v) { perror("bench_spawn: calloc"); return 2; }
    for (long k = 0; k < nvar; k++) {
        if (i >= argc) { fprintf(stderr, "bench_spawn: variant %ld: name missing\n", k); return 2; }
        v[k].name = argv[i++];
        v[k].env = take(argc, argv, &i, number(argc > i ? argv[i++] : NULL, "NENV"), v[k].name);
        long na = number(argc > i ? argv[i++] : NULL, "NARG");
        if (na < 1 || i >= argc || argv[i][0] != '/') {
            fprintf(stderr, "bench_spawn: variant %s: needs a command given by absolute path\n", v[k].name);
            return 2;
        }
        v[k].argv = take(argc, argv, &i, na, v[k].name);
        v[k].round_ns = calloc((size_t)rounds, sizeof(double));
        if (!v[k].round_ns) { perror("bench_spawn: calloc"); return 2; }
    }
    if (i != argc) {
        fprintf(stderr, "bench_spawn: %d unexpected arguments after the last variant\n", argc - i);
        return 2;
    }
    for (long r = 0; r < rounds; r++) {
        for (long j = 0; j < nvar; j++) {
            struct variant *x = &v[(j + r) % nvar];
            double t0 = now_ns();
            for (long k = 0; k < reps; k++) {
                pid_t pid;
                int err = posix_spawn(&pid, x->argv[0], NULL, NULL, x->argv, x->env);
                if (err) {
                    fprintf(stderr, "bench_spawn: %s: cannot start %s: %s\n", x->name, x->argv[0], strerror(err));
                    return 1;
                }
                int st = 0;
                while (waitpid(pid, &st, 0) < 0) {}
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    fprintf(stderr, "bench_spawn: %s: %s ended with status %#x (exit %d, signal %d)\n",
                            x->name, x->argv[0], st, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                            WIFSIGNALED(st) ? WTERMSIG(st) : 0);
                    return 1;
                }
            }
            x->round_ns[r] = (now_ns() - t0) / (double)reps;
        }
    }
    for (long r = 0; r < rounds; r++) {
        printf("round=%ld", r);
        for (long k = 0; k < nvar; k++)
            printf(" %s=%.0f", v[k].name, v[k].round_ns[r]);
        printf("\n");
    }
    for (long k = 0; k < nvar; k++) {
        double *s = malloc((size_t)rounds * sizeof(double));
        if (!s) { perror("bench_spawn: malloc"); return 2; }
        memcpy(s, v[k].round_ns, (size_t)rounds * sizeof(double));
        qsort(s, (size_t)rounds, sizeof(double), cmp_double);
        double med = rounds % 2 ? s[rounds / 2] : (s[rounds / 2 - 1] + s[rounds / 2]) / 2;
        printf("variant=%s rounds=%ld reps=%ld median_ns=%.0f min_ns=%.0f\n", v[k].name, rounds, reps, med, s[0]);
        free(s);
    }
    (void)environ;
    return 0;
}

/* guard_volume: violations at production volume and from known call sites, for
 * python-tests/test_guard_volume.py (issues 13 and 19). Every violation is cuDeviceGet
 * with an ordinal other than 0 (R2), through the linked symbol.
 *
 *   guard_volume main                 one cuDeviceGet(&d, 7) written in main
 *   guard_volume loop N               N violations from one site (site_a), return from main
 *   guard_volume exit N               the same, then exit(0) from a helper
 *   guard_volume _exit N MS           the same, sleep MS milliseconds, then _exit(0)
 *   guard_volume exec N PROG ARGS...  the same, then execv(PROG, [PROG, ARGS...])
 *   guard_volume execl N SHELL-CMD    the same, then execl("/bin/sh", "sh", "-c", CMD, NULL)
 *                                     (a variadic exec: its arguments must arrive intact)
 *   guard_volume idle N               the same, then print "idle" and sleep (the test kills it)
 *   guard_volume t:MODE ...           MODE, with one more thread (idle) started before cuInit:
 *                                     a multi-threaded program
 *   guard_volume single N MS [M]      N violations at site_a, then print the process's
 *                                     threads (/proc/self/task) and unshare(CLONE_NEWUSER)'s
 *                                     result ("unshare=0" or "unshare=<errno name>"), sleep MS
 *                                     milliseconds, M more (default 1), print "idle" and sleep
 *   guard_volume unlink N PATH M      N violations at site_a, unlink(PATH), M at site_b
 *   guard_volume threads N T          T threads, each N iterations of site_a then site_b
 *   guard_volume deep DEPTH           recurse DEPTH frames, then one violation
 *   guard_volume fork                 one violation, fork; the child violates at site_b once
 *   guard_volume cudart N             N cudaSetDevice(1) (a runtime call: the driver's
 *                                     violations come from inside libcudart)
 *
 * Prints "done n=<violations made by this process>" at the end (before exit/exec).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long made;

/* Two distinct sites (the volatile stores keep the compiler from folding them into one). */
static volatile int which;
__attribute__((noinline)) static void site_a(void) {
    CUdevice d;
    which = 1;
    cuDeviceGet(&d, 1);
    which = 1;
}

__attribute__((noinline)) static void site_b(void) {
    CUdevice d;
    which = 2;
    cuDeviceGet(&d, 1);
    which = 2;
}

static void loop(long n) {
    for (long i = 0; i < n; i++) site_a();
    made += n;
}

struct targ { long n; };
static void *thread_main(void *p) {
    long n = ((struct targ *)p)->n;
    for (long i = 0; i < n; i++) {
        site_a();
        site_b();
    }
    return NULL;
}

__attribute__((noinline)) static int deep(long depth) {
    if (depth <= 0) {
        site_a();
        return 1;
    }
    volatile int x = deep(depth - 1);
    return x + 1;
}

__attribute__((noinline)) static void leave_with_exit(void) {
    printf("done n=%ld\n", made);
    fflush(stdout);
    exit(0);
}

static void *idle_thread(void *p) {
    (void)p;
    for (;;) pause();
    return NULL;
}

static int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2) return 3;
    const char *m = argv[1];
    if (!strncmp(m, "t:", 2)) {
        pthread_t th;
        if (pthread_create(&th, NULL, idle_thread, NULL) != 0) return 5;
        m += 2;
    }
    if (cuInit(0) != CUDA_SUCCESS) {
        printf("cuInit failed\n");
        return 2;
    }
    long n = argc > 2 ? atol(argv[2]) : 0;
    if (!strcmp(m, "main")) {
        CUdevice d;
        CUresult rc = cuDeviceGet(&d, 7);
        made = 1;
        printf("rc=%d\n", (int)rc);
    } else if (!strcmp(m, "loop")) {
        loop(n);
    } else if (!strcmp(m, "exit")) {
        loop(n);
        leave_with_exit();
    } else if (!strcmp(m, "_exit")) {
        loop(n);
        printf("done n=%ld\n", made);
        fflush(stdout);
        usleep(argc > 3 ? atol(argv[3]) * 1000 : 0);
        _exit(0);
    } else if (!strcmp(m, "exec")) {
        loop(n);
        printf("done n=%ld\n", made);
        fflush(stdout);
        execv(argv[3], argv + 3);
        perror("execv");
        return 4;
    } else if (!strcmp(m, "execl")) {
        loop(n);
        printf("done n=%ld\n", made);
        fflush(stdout);
        execl("/bin/sh", "sh", "-c", argv[3], (char *)NULL);
        perror("execl");
        return 4;
    } else if (!strcmp(m, "idle")) {
        loop(n);
        printf("idle n=%ld\n", made);
        fflush(stdout);
        for (;;) pause();
    } else if (!strcmp(m, "single")) {
        loop(n);
        int rc = unshare(CLONE_NEWUSER);
        int err = errno;
        printf("threads=%d unshare=%s\n", task_count(),
               rc == 0 ? "0" : err == EINVAL ? "EINVAL" : err == EPERM ? "EPERM" : "other");
        fflush(stdout);
        usleep(argc > 3 ? atol(argv[3]) * 1000 : 0);
        long more = argc > 4 ? atol(argv[4]) : 1;
        for (long i = 0; i < more; i++) site_a();
        made += more;
        printf("idle n=%ld\n", made);
        fflush(stdout);
        for (;;) pause();
    } else if (!strcmp(m, "unlink")) {
        if (argc < 5) return 3;
        loop(n);
        if (unlink(argv[3]) != 0) {
            perror("unlink");
            return 4;
        }
        long later = atol(argv[4]);
        for (long i = 0; i < later; i++) site_b();
        made += later;
    } else if (!strcmp(m, "threads")) {
        long t = argc > 3 ? atol(argv[3]) : 1;
        pthread_t th[64];
        struct targ a = {n};
        if (t > 64) t = 64;
        for (long i = 0; i < t; i++) pthread_create(&th[i], NULL, thread_main, &a);
        for (long i = 0; i < t; i++) pthread_join(th[i], NULL);
        made = 2 * n * t;
    } else if (!strcmp(m, "deep")) {
        deep(n);
        made = 1;
    } else if (!strcmp(m, "fork")) {
        site_a();
        pid_t c = fork();
        if (c == 0) {
            site_b();
            printf("child done n=1\n");
            fflush(stdout);
            _exit(0);
        }
        int st;
        waitpid(c, &st, 0);
        made = 1;
    } else if (!strcmp(m, "cudart")) {
        for (long i = 0; i < n; i++) cudaSetDevice(1);
        made = n;
    } else {
        return 3;
    }
    printf("done n=%ld\n", made);
    return 0;
}

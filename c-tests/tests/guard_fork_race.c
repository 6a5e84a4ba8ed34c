/* guard_fork_race: fork while other threads are inside the guard's one-time set-up
 * (issue 14, item 2). 32 threads call cuInit + cuDeviceGet; at the same moment the main
 * thread forks 20 (argv[1]) children that each call cuDeviceGet(1) (denied, 101) and exit. A child
 * still running 5 s after the forks is hung (a lock or one-time wait inherited from a thread
 * that does not exist in it): it is killed and the program prints "hung N", exit 1. */
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile int go;

static void *worker(void *arg) {
    (void)arg;
    while (!go) { }
    CUdevice d;
    cuInit(0);
    for (int i = 0; i < 50; i++) cuDeviceGet(&d, 0);
    return NULL;
}

int main(int argc, char **argv) {
    enum { THREADS = 32, MAX_CHILDREN = 400 };
    int CHILDREN = argc > 1 ? atoi(argv[1]) : 20;
    if (CHILDREN < 1 || CHILDREN > MAX_CHILDREN) return 2;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, NULL);
    pid_t kids[MAX_CHILDREN];
    go = 1;
    /* Let the threads get into the guard's set-up (slow_hostname.so makes it last). */
    struct timespec settle = {0, 5 * 1000 * 1000};
    nanosleep(&settle, NULL);
    for (int i = 0; i < CHILDREN; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            CUdevice d;
            int rc = cuDeviceGet(&d, 1);
            _exit(rc == CUDA_ERROR_INVALID_DEVICE ? 0 : 3);
        }
    }
    /* All children get 5 s together; any still running then is hung. */
    int hung = 0, bad = 0, left = CHILDREN;
    int done[MAX_CHILDREN] = {0};
    for (int ms = 0; ms < 5000 && left > 0; ms++) {
        for (int i = 0; i < CHILDREN; i++) {
            int status = 0;
            if (!done[i] && waitpid(kids[i], &status, WNOHANG) == kids[i]) {
                done[i] = 1;
                left--;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
            }
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < CHILDREN; i++) {
        if (!done[i]) {
            int status;
            hung++;
            kill(kids[i], SIGKILL);
            waitpid(kids[i], &status, 0);
        }
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    printf("hung %d bad %d\n", hung, bad);
    return hung || bad ? 1 : 0;
}

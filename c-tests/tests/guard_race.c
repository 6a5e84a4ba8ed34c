/* guard_race N: N threads race the first guarded CUDA call (cuInit, then cuDeviceGet(0)
 * and cuDeviceGet(1)). Prints "ok N" when every thread got the same answers:
 * cuInit 0, cuDeviceGet(0) 0, and the same code for cuDeviceGet(1) in every thread. */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static pthread_barrier_t barrier;
static int results[256][3];
static void *worker(void *arg) {
    int i = (int)(long)arg;
    CUdevice d;
    pthread_barrier_wait(&barrier);
    results[i][0] = cuInit(0);
    results[i][1] = cuDeviceGet(&d, 0);
    results[i][2] = cuDeviceGet(&d, 1);
    return NULL;
}
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    if (n < 1 || n > 256) return 3;
    pthread_t t[256];
    pthread_barrier_init(&barrier, NULL, (unsigned)n);
    for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < n; i++)
        if (results[i][0] || results[i][1] || results[i][2] != results[0][2]) {
            printf("thread %d: cuInit=%d cuDeviceGet(0)=%d cuDeviceGet(1)=%d\n", i,
                   results[i][0], results[i][1], results[i][2]);
            return 1;
        }
    printf("ok %d cuDeviceGet(1)=%d\n", n, results[0][2]);
    return 0;
}

/* fake_rt_threads: the fake libcudart.so.12's lazy init under concurrent first calls.
 *
 * Why it exists: the real runtime initializes on whichever thread calls first, and many
 * programs start CUDA from several threads at once (data loaders, NCCL's proxy); the fake
 * must come up exactly once (pytest checks the one dlsym under the counting probe) and
 * keep a current device per thread.
 */
#include <pthread.h>
#include <string.h>

#include "fake_rt_check.h"

#define THREADS 8
#define N 512

static pthread_barrier_t start;
static int devices;

struct job {
    int index;
    int ok;
    char why[128];
};

static void *worker(void *arg)
{
    struct job *j = arg;
    unsigned char host[N], back[N];
    int dev = j->index % devices, got = -1;
    void *d = NULL;
    memset(host, j->index + 1, N);
    pthread_barrier_wait(&start);
    cudaError_t e;
    if ((e = cudaSetDevice(dev)) != cudaSuccess ||
        (e = cudaMalloc(&d, N)) != cudaSuccess ||
        (e = cudaMemcpy(d, host, N, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(back, d, N, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaGetDevice(&got)) != cudaSuccess ||
        (e = cudaFree(d)) != cudaSuccess) {
        snprintf(j->why, sizeof j->why, "%s", cudaGetErrorName(e));
        return NULL;
    }
    if (got != dev) {
        snprintf(j->why, sizeof j->why, "device %d, want %d", got, dev);
        return NULL;
    }
    if (memcmp(host, back, N)) {
        snprintf(j->why, sizeof j->why, "bytes differ");
        return NULL;
    }
    j->ok = 1;
    return NULL;
}

int main(int argc, char **argv)
{
    devices = argc > 1 ? atoi(argv[1]) : 8;
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (struct job){.index = i};
        pthread_create(&t[i], NULL, worker, &jobs[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(jobs[i].ok, "thread %d on device %d: %s", i, i % devices,
              jobs[i].ok ? "set device, malloc, round trip" : jobs[i].why);
    }
    int dev = -1;
    cudaGetDevice(&dev);
    CHECK(dev == 0, "main thread's device unaffected (%d)", dev);
    return rt_done("fake_rt_threads");
}

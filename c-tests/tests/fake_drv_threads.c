/* Thread and fork safety of the fake driver: 64 threads race cuInit (all must succeed and
 * agree on the device count, with no thread seeing a half-initialised driver), then
 * threads allocate and copy concurrently, then a forked child calls cuInit again and uses
 * the driver. Driven by python-tests/test_fake_driver.py. */
#include <cuda.h>
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda_drvtest.h"

#define THREADS 64

static pthread_barrier_t barrier;
static int counts[THREADS];
static CUresult results[THREADS];

static void *racer(void *arg)
{
    int i = (int)(long)arg;
    pthread_barrier_wait(&barrier);
    results[i] = cuInit(0);
    int n = -1;
    if (results[i] == CUDA_SUCCESS && cuDeviceGetCount(&n) != CUDA_SUCCESS)
        n = -2;
    counts[i] = n;
    return NULL;
}

static void *worker(void *arg)
{
    int i = (int)(long)arg;
    CUcontext c;
    CUdeviceptr d;
    unsigned char in[256], out[256];
    long ok = 1;
    if (cuDevicePrimaryCtxRetain(&c, i % 2) || cuCtxSetCurrent(c))
        return (void *)0;
    for (int round = 0; round < 50 && ok; round++) {
        memset(in, i + round, sizeof in);
        if (cuMemAlloc(&d, sizeof in) || cuMemcpyHtoD(d, in, sizeof in) ||
            cuMemcpyDtoH(out, d, sizeof out) || memcmp(in, out, sizeof in) || cuMemFree(d))
            ok = 0;
    }
    return (void *)ok;
}

static CUcontext destroyed_ctx;
static int holder_ready, holder_go;

static void *holder(void *arg)
{
    (void)arg;
    CUdeviceptr d;
    if (cuCtxSetCurrent(destroyed_ctx) != CUDA_SUCCESS)
        return (void *)-1L;
    __atomic_store_n(&holder_ready, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&holder_go, __ATOMIC_ACQUIRE))
        usleep(1000);
    return (void *)(long)cuMemAlloc(&d, 16);
}

int main(void)
{
    pthread_t t[THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, racer, (void *)i);
    int agree = 1;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (results[i] != CUDA_SUCCESS || counts[i] != counts[0] || counts[0] <= 0)
            agree = 0;
    }
    EXPECT(agree, "%d threads racing cuInit all succeed and see %d devices", THREADS, counts[0]);

    for (long i = 0; i < 16; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    int all = 1;
    for (int i = 0; i < 16; i++) {
        void *ok;
        pthread_join(t[i], &ok);
        all &= ok != NULL;
    }
    EXPECT(all, "16 threads allocate and copy concurrently");

    /* a context destroyed while current to another thread */
    CUcontext victim;
    MUST(cuCtxCreate(&victim, 0, 1));
    pthread_t t2;
    destroyed_ctx = victim;
    pthread_create(&t2, NULL, holder, NULL);
    while (!__atomic_load_n(&holder_ready, __ATOMIC_ACQUIRE))
        usleep(1000);
    MUST(cuCtxDestroy(victim));
    __atomic_store_n(&holder_go, 1, __ATOMIC_RELEASE);
    void *rc;
    pthread_join(t2, &rc);
    EXPECT((long)rc == CUDA_ERROR_CONTEXT_IS_DESTROYED,
           "another thread using a destroyed context gets CONTEXT_IS_DESTROYED (%ld)", (long)rc);

    CUcontext c;
    CUdeviceptr shared;
    MUST(cuDevicePrimaryCtxRetain(&c, 0));
    MUST(cuCtxSetCurrent(c));
    MUST(cuMemAlloc(&shared, 64));
    MUST(cuMemsetD8(shared, 0x11, 64));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int n = -1, fails = 0;
        unsigned char b[64];
        CUcontext cc;
        CUdeviceptr d;
        fails += cuInit(0) != CUDA_SUCCESS;
        fails += cuDeviceGetCount(&n) != CUDA_SUCCESS || n != counts[0];
        fails += cuDevicePrimaryCtxRetain(&cc, 0) != CUDA_SUCCESS || cuCtxSetCurrent(cc) != CUDA_SUCCESS;
        fails += cuMemAlloc(&d, 64) != CUDA_SUCCESS || cuMemsetD8(d, 0x22, 64) != CUDA_SUCCESS;
        fails += cuMemcpyDtoH(b, d, 64) != CUDA_SUCCESS || b[63] != 0x22;
        /* the parent's allocation is inherited (MAP_SHARED): same bytes */
        fails += cuMemcpyDtoH(b, shared, 64) != CUDA_SUCCESS || b[0] != 0x11;
        _exit(fails ? 10 + fails : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "forked child: cuInit, count, context, alloc, copy (exit %d)", WEXITSTATUS(status));
    /* a fork while another thread holds the driver lock must not deadlock the child */
    pthread_create(&t[0], NULL, worker, (void *)3);
    pid = fork();
    if (pid == 0) {
        int n;
        _exit(cuDeviceGetCount(&n) == CUDA_SUCCESS ? 0 : 1);
    }
    waitpid(pid, &status, 0);
    pthread_join(t[0], NULL);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork during concurrent driver use");
    return drvtest_done();
}

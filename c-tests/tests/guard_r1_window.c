/* guard_r1_window: a second thread races the main thread's first cuInit. It polls
 * cuDeviceGet(0) until the driver is initialised, then creates a context on that device
 * and allocates. The guard's R1 check runs inside the main thread's cuInit; no call of the
 * second thread may get past the guard before R1 is decided (issue 29, item 1). Prints
 * "second thread: context and allocation" (one write(2), unbuffered) when it got both,
 * and "main: cuInit returned" after cuInit. */
#include <cuda.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
static void say(const char *s) {
    ssize_t r = write(1, s, strlen(s));
    (void)r;
}
static void *second(void *arg) {
    (void)arg;
    CUdevice d;
    while (cuDeviceGet(&d, 0) != CUDA_SUCCESS) {
    }
    CUcontext ctx;
    if (cuCtxCreate(&ctx, 0, d) != CUDA_SUCCESS) return NULL;
    CUdeviceptr p;
    if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS) return NULL;
    say("second thread: context and allocation\n");
    return NULL;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, second, NULL);
    usleep(2000);
    int rc = cuInit(0);
    say(rc == CUDA_SUCCESS ? "main: cuInit returned\n" : "main: cuInit failed\n");
    pthread_join(t, NULL);
    return 0;
}

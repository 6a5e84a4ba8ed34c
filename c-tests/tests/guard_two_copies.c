/* guard_two_copies DIR ORDINAL: two copies of one runtime major in one process, as a wheel's
 * renamed libcudart-<hash>.so.12 beside the shared libcudart.so.12. This program links the
 * fake libcudart.so.12 (the global scope's copy) and dlopens DIR/libuses_cudart.so with
 * RTLD_LOCAL, whose private runtime copy carries the same version node (libcudart.so.12).
 * The library calls cudaSetDevice(ORDINAL) through its copy's reference; then each copy is
 * asked for its current device (cudaGetDevice, not guarded: each reaches its own copy).
 * Prints "rc=<code> global=<device> private=<device>": which copy served the call
 * (README, "Runtime majors": the guard's wrapper serves both copies' callers with the
 * first copy found, the global scope's). */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    char path[4096];
    if (argc < 3) { fprintf(stderr, "usage: guard_two_copies DIR ORDINAL\n"); return 3; }
    int d = -1;
    if (cudaGetDevice(&d)) { printf("setup failed: cudaGetDevice\n"); return 2; }
    snprintf(path, sizeof path, "%s/libuses_cudart.so", argv[1]);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
    int (*set)(int) = (int (*)(int))dlsym(h, "uses_set_device");
    int (*get)(void) = (int (*)(void))dlsym(h, "uses_get_device");
    if (!set || !get) { printf("setup failed: libuses_cudart.so symbols\n"); return 2; }
    int rc = set(atoi(argv[2]));
    if (cudaGetDevice(&d)) d = -2;
    printf("rc=%d global=%d private=%d\n", rc, d, get());
    return 0;
}

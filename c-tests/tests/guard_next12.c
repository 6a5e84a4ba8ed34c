/* guard_next12 NAME ORDINAL [default]: a CUDA 12 program (linked against libcudart.so.12
 * only) that takes the next definition of a runtime function after itself,
 * dlsym(RTLD_NEXT, NAME), as a program interposing the runtime does (with `default`:
 * dlsym(RTLD_DEFAULT, NAME), the global scope's first), and calls it: cudaSetDevice(ORDINAL), or
 * cudaMemPrefetchAsync(managed buffer, 4096, ORDINAL, NULL) with CUDA 12's parameters.
 * Under the guard RTLD_NEXT finds the guard's default (CUDA 13) definition: a function whose
 * parameters are the same in both majors reaches the 12 runtime; one whose parameters
 * differ is refused (500) when no 13 runtime is loaded (README, "Runtime majors"). With
 * `default` the guard hands out the wrapper of the major that is loaded (12).
 * Prints "rc=<code>". */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: guard_next12 NAME ORDINAL\n"); return 3; }
    int ord = atoi(argv[2]);
    void *f = dlsym(argc > 3 && !strcmp(argv[3], "default") ? RTLD_DEFAULT : RTLD_NEXT, argv[1]);
    if (!f) { printf("setup failed: dlsym: %s\n", dlerror()); return 2; }
    int rc;
    if (!strcmp(argv[1], "cudaSetDevice")) {
        rc = ((cudaError_t(*)(int))f)(ord);
    } else if (!strcmp(argv[1], "cudaMemPrefetchAsync")) {
        void *p = NULL;
        if (cudaMallocManaged(&p, 4096, cudaMemAttachGlobal)) { printf("setup failed\n"); return 2; }
        rc = ((cudaError_t(*)(const void *, size_t, int, cudaStream_t))f)(p, 4096, ord, NULL);
    } else {
        fprintf(stderr, "guard_next12: unknown %s\n", argv[1]);
        return 3;
    }
    printf("rc=%d\n", rc);
    return 0;
}

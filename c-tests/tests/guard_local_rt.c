/* guard_local_rt DIR ORDINAL: dlopen DIR/libuses_cudart.so with RTLD_LOCAL (the runtime
 * comes in as its dependency, outside the global scope, like PyTorch's) and call
 * cudaSetDevice(ORDINAL) through it. Prints "rc=<code>". */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    char path[4096];
    if (argc < 3) { fprintf(stderr, "usage: guard_local_rt DIR ORDINAL\n"); return 3; }
    snprintf(path, sizeof path, "%s/libuses_cudart.so", argv[1]);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
    int (*f)(int) = (int (*)(int))dlsym(h, "uses_set_device");
    if (!f) { printf("no uses_set_device\n"); return 2; }
    printf("rc=%d\n", f(atoi(argv[2])));
    return 0;
}

/* guard_dlvsym WHERE NODE: a CUDA 13 program that asks dlvsym for runtime and driver
 * functions by version node, the way a program picks one runtime major's function
 * (the runtime keeps a name across majors and tells them apart only by the node).
 *   rt13       dlvsym(dlopen("libcudart.so.13", RTLD_NOLOAD), ...): the program's runtime
 *   rt12       dlvsym(dlopen("libcudart.so.12", RTLD_LOCAL), ...): a private 12 runtime
 *   rt14       dlvsym(dlopen("libcudart.so.14", RTLD_LOCAL), ...): a major rankguard lacks
 *   default    dlvsym(RTLD_DEFAULT, ...)
 *   next       dlvsym(RTLD_NEXT, ...) from the program
 *   interposer dlvsym(RTLD_NEXT, ...) asked by libvnext.so (preloaded; testlibs/)
 *   driver     dlvsym(dlopen("libcuda.so.1"), "cuDeviceGet", NODE), beside its dlsym
 * Prints `found <file>`: the object the returned function is in (dladdr), or `found none`.
 * For runtime nodes it then calls the function on devices 0 and 1 (cudaSetDevice), and
 * cudaMemPrefetchAsync with that major's parameters (12: int device; 13, 14: a
 * cudaMemLocation and flags) to device 0, the host and device 1 on a created stream, each
 * with its `expect` line (include/arglog_expect.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "arglog_expect.h"

typedef cudaError_t (*set_device_fn)(int);
typedef cudaError_t (*prefetch12_fn)(const void *, size_t, int, cudaStream_t);
typedef cudaError_t (*prefetch13_fn)(const void *, size_t, struct cudaMemLocation, unsigned int,
                                     cudaStream_t);

static const char *file_of(void *f)
{
    Dl_info info;
    if (!f)
        return "none";
    if (!dladdr(f, &info) || !info.dli_fname)
        return "unknown";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

static void *lookup(void *where, const char *name, const char *node, int interposer)
{
    if (interposer) {
        void *(*vnext)(const char *, const char *) =
            (void *(*)(const char *, const char *))dlsym(RTLD_DEFAULT, "vnext");
        if (!vnext) {
            printf("setup failed: libvnext.so is not preloaded\n");
            exit(2);
        }
        return vnext(name, node);
    }
    return dlvsym(where, name, node);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: guard_dlvsym rt12|rt13|rt14|default|next|interposer|driver NODE\n");
        return 3;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *how = argv[1], *node = argv[2];
    void *where = NULL; /* RTLD_DEFAULT */
    int interposer = 0;
    if (!strcmp(how, "rt13"))
        where = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    else if (!strcmp(how, "rt12"))
        where = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    else if (!strcmp(how, "rt14"))
        where = dlopen("libcudart.so.14", RTLD_NOW | RTLD_LOCAL);
    else if (!strcmp(how, "driver"))
        where = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    else if (!strcmp(how, "next"))
        where = RTLD_NEXT;
    else if (!strcmp(how, "interposer"))
        interposer = 1;
    else if (strcmp(how, "default")) {
        fprintf(stderr, "guard_dlvsym: unknown %s\n", how);
        return 3;
    }
    if (!where && strcmp(how, "default") && !interposer) {
        printf("setup failed: dlopen for %s: %s\n", how, dlerror());
        return 2;
    }
    if (!strcmp(how, "driver")) {
        void *v = dlvsym(where, "cuDeviceGet", node);
        void *p = dlsym(where, "cuDeviceGet");
        printf("found %s same=%d\n", file_of(v), v == p);
        return 0;
    }
    int major = 0;
    if (strncmp(node, "libcudart.so.", 13) || !(major = atoi(node + 13))) {
        fprintf(stderr, "guard_dlvsym: %s is not a runtime node\n", node);
        return 3;
    }
    set_device_fn set = (set_device_fn)lookup(where, "cudaSetDevice", node, interposer);
    printf("found %s\n", file_of((void *)set));
    if (!set)
        return 0;
    for (int d = 0; d < 2; d++) {
        EXPECT_LOG(major, "cudaSetDevice", "device=%d", d);
        REPORT_RC("cudaSetDevice", set(d));
    }
    void *p = NULL;
    cudaStream_t s = NULL;
    if (cudaMallocManaged(&p, 4096, cudaMemAttachGlobal) || cudaStreamCreate(&s)) {
        printf("setup failed: cudaMallocManaged/cudaStreamCreate\n");
        return 2;
    }
    void *f = lookup(where, "cudaMemPrefetchAsync", node, interposer);
    printf("found %s\n", file_of(f));
    if (!f)
        return 0;
    if (major == 12) {
        const int devs[] = { 0, cudaCpuDeviceId, 1 };
        for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) {
            EXPECT_LOG(12, "cudaMemPrefetchAsync", "devPtr=%p count=%zu dstDevice=%d stream=%p", p,
                       (size_t)4096, devs[i], (void *)s);
            REPORT_RC("cudaMemPrefetchAsync", ((prefetch12_fn)f)(p, 4096, devs[i], s));
        }
    } else {
        const struct cudaMemLocation locs[] = {
            { .type = cudaMemLocationTypeDevice, .id = 0 },
            { .type = cudaMemLocationTypeHost, .id = 0 },
            { .type = cudaMemLocationTypeDevice, .id = 1 },
        };
        for (size_t i = 0; i < sizeof locs / sizeof locs[0]; i++) {
            EXPECT_LOG(major, "cudaMemPrefetchAsync", "devPtr=%p count=%zu location=" LOC_FMT
                       " flags=%u stream=%p", p, (size_t)4096, LOC_ARGS(locs[i]), 0u, (void *)s);
            REPORT_RC("cudaMemPrefetchAsync", ((prefetch13_fn)f)(p, 4096, locs[i], 0, s));
        }
    }
    return 0;
}

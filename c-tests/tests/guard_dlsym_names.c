/* guard_dlsym_names: how dlsym resolves names that start like CUDA's but are not guarded
 * (c-tests/include/probe_names.h), and guarded ones. Linked against libnext_a.so then
 * libnext_b.so (both define every probe name). For each probe name it prints
 *
 *   <name> next=<X> handle=<Y> default=<Z>
 *
 * next: dlsym(RTLD_NEXT, name) asked from inside A (must be B's: the guard's trampoline
 * keeps the caller's return address); handle: dlsym(dlopen("libnext_b.so"), name) (B's);
 * default: dlsym(RTLD_DEFAULT, name) (A's, first in the search order). Then, for a guarded
 * driver and runtime name looked up in the fake libraries:
 *
 *   guarded <name> from=<basename of the object the returned address lies in>
 *
 * (librankguard.so under the guard: its wrapper; libcuda.so.1 / libcudart.so.12 without). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "probe_names.h"

const char *a_next(const char *name);

static const char *call(void *p) { return p ? ((const char *(*)(void))p)() : "none"; }

static const char *object_of(void *p) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_fname) return "none";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

int main(void) {
    void *b = dlopen("libnext_b.so", RTLD_NOW | RTLD_NOLOAD);
    if (!b) {
        fprintf(stderr, "guard_dlsym_names: libnext_b.so is not loaded: %s\n", dlerror());
        return 1;
    }
#define SHOW(n) printf("%s next=%s handle=%s default=%s\n", #n, a_next(#n), call(dlsym(b, #n)), \
                       call(dlsym(RTLD_DEFAULT, #n)));
    PROBE_NAMES(SHOW)
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!drv || !rt) {
        fprintf(stderr, "guard_dlsym_names: cannot open the fake CUDA libraries: %s\n", dlerror());
        return 1;
    }
    printf("guarded cuDeviceGet from=%s\n", object_of(dlsym(drv, "cuDeviceGet")));
    printf("guarded cudaSetDevice from=%s\n", object_of(dlsym(rt, "cudaSetDevice")));
    return 0;
}

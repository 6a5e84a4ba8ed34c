/* libvcount.so: another interposer's dlvsym, preloaded before librankguard.so: it counts
 * every call of the exported `dlvsym` and forwards to the next one (the guard's). The guard
 * must never call `dlvsym` by name itself (it reads the real one from the C library), or an
 * interposer like this would see, and could loop on, the guard's own lookups. Prints the
 * count at exit. Used by python-tests/test_guard_dlvsym.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static int calls;

void *dlvsym(void *handle, const char *name, const char *version)
{
    static dlvsym_fn next;
    if (!next)
        next = (dlvsym_fn)dlsym(RTLD_NEXT, "dlvsym");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    void *volatile p = next ? next(handle, name, version) : NULL;
    return p;
}

__attribute__((destructor)) static void report(void)
{
    fprintf(stderr, "libvcount: dlvsym calls=%d\n", __atomic_load_n(&calls, __ATOMIC_RELAXED));
}

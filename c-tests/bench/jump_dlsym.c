/* jump_dlsym: the floor of interposing dlsym. A preload whose dlsym does nothing but jump
 * to the C library's (a tail call: `jmp *real(%rip)` at -O2), so scripts/bench can show,
 * beside the guard's dlsym figures, what any LD_PRELOAD interposer of dlsym costs before it
 * looks at a single byte of the name: one more jump, through a pointer, on every lookup.
 * The real dlsym is found once, by its version (glibc 2.34 moved it to libc), at load. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real;

__attribute__((constructor)) static void find_real(void)
{
    real = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real)
        real = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!real) {
        fputs("jump_dlsym.so: no dlsym at GLIBC_2.34 or GLIBC_2.2.5 in the C library\n", stderr);
        abort();
    }
}

void *dlsym(void *handle, const char *name)
{
    return real(handle, name);
}

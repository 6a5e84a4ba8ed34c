/* libvnext.so: an interposer's dlvsym(RTLD_NEXT, ...). Preloaded after librankguard.so it
 * must get the next definition after itself (the real runtime's), preloaded before it the
 * guard's: the guard's dlvsym keeps the caller's return address, from which the real
 * dlvsym decides what "next" means. Used by tests13/guard_dlvsym.c (`interposer`). */
#define _GNU_SOURCE
#include <dlfcn.h>
void *vnext(const char *name, const char *node)
{
    /* Not a tail call: the call must come from this library, not from its caller. */
    void *volatile p = dlvsym(RTLD_NEXT, name, node);
    return p;
}

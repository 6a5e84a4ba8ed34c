/* RTLD_NEXT probe, library A: defines probe() and asks dlsym(RTLD_NEXT, "probe") for the
 * next definition after itself. With A loaded before B, the answer must be B's probe(),
 * preloaded guard or not (a dlsym override that is not a tail jump makes it A's own). */
#define _GNU_SOURCE
#include <dlfcn.h>
const char *probe(void) { return "A"; }
const char *a_next_probe(void) {
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "probe");
    return next ? next() : "none";
}

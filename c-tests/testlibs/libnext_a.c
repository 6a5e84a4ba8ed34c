/* RTLD_NEXT probe, library A: defines probe() and asks dlsym(RTLD_NEXT, "probe") for the
 * next definition after itself. With A loaded before B, the answer must be B's probe(),
 * preloaded guard or not (a dlsym override that is not a tail jump makes it A's own).
 * It also defines names that start with "cu" without being guarded ones (libcurl's,
 * cuDNN's, cuBLAS's, cuFFT's, and names of every shape the guard's dlsym tests byte by
 * byte), for guard_dlsym_names: see probe_names.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "probe_names.h"
const char *probe(void) { return "A"; }
const char *a_next_probe(void) {
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "probe");
    return next ? next() : "none";
}
#define DEFINE_A(n) const char *n(void) { return "A"; }
PROBE_NAMES(DEFINE_A)
/* dlsym(RTLD_NEXT, name) asked from inside A: the next definition after A. */
const char *a_next(const char *name) {
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, name);
    return next ? next() : "none";
}

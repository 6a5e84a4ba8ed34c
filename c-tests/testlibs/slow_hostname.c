/* slow_hostname.so: preloaded before the guard by the fork-race test, it makes
 * gethostname take 20 ms, so the guard's one-time set-up (which asks for the host name)
 * reliably lasts long enough for a fork to land in the middle of it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <time.h>

int gethostname(char *name, size_t len) {
    static int (*real)(char *, size_t);
    if (!real) real = (int (*)(char *, size_t))dlsym(RTLD_NEXT, "gethostname");
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    return real ? real(name, len) : -1;
}

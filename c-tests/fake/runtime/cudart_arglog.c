/* cudart_arglog.c: the fake runtime's argument log (FAKECUDA_ARGLOG=<path>).
 *
 * Why it exists: a runtime function keeps its name and changes its signature between
 * CUDA 12 and 13 (cudaMemPrefetchAsync: `int dstDevice` vs `struct cudaMemLocation,
 * unsigned flags`), so an interposer declared with the wrong major's signature passes
 * garbage on (a lost stream, a location read as a device). The tests compare what each
 * call received, argument by argument, with and without the guard.
 *
 * Format: one line per call, appended with a single write(2) (O_APPEND: lines of several
 * processes and threads do not interleave):
 *     libcudart.so.<major> <symbol> <param>=<value> ...
 * Scalars in decimal, pointers and handles with %p, enums as their number, a struct
 * passed by value as {field=value,...} with every field. Off (one load and a branch per
 * call) unless FAKECUDA_ARGLOG names a file; the variable is read once per process.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudart_internal.h"

RT_HIDDEN int rt_arglog_fd = -2; /* -2: not read yet, -1: off, else the open file */
static pthread_once_t arglog_once = PTHREAD_ONCE_INIT;

static void arglog_open(void)
{
    const char *path = getenv("FAKECUDA_ARGLOG");
    int fd = -1;
    if (path && *path) {
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) /* Decision: a log the test asked for and cannot get is fatal. */ {
            fprintf(stderr, "fake libcudart: FAKECUDA_ARGLOG=%s: cannot open: %s\n", path,
                    strerror(errno));
            abort();
        }
    }
    __atomic_store_n(&rt_arglog_fd, fd, __ATOMIC_RELEASE);
}

RT_HIDDEN int rt_arglog_on(void)
{
    int fd = __atomic_load_n(&rt_arglog_fd, __ATOMIC_ACQUIRE);
    if (fd == -2) {
        pthread_once(&arglog_once, arglog_open);
        fd = __atomic_load_n(&rt_arglog_fd, __ATOMIC_ACQUIRE);
    }
    return fd >= 0;
}

RT_HIDDEN void rt_arglog(const char *symbol, const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "libcudart.so.%d %s", FAKECUDART_MAJOR, symbol);
    if (n < 0 || (size_t)n >= sizeof line - 2)
        abort();
    if (*fmt) {
        line[n++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
        va_end(ap);
        if (m < 0 || (size_t)m >= sizeof line - (size_t)n - 1)
            abort(); /* a truncated line would compare as a wrong argument */
        n += m;
    }
    line[n++] = '\n';
    if (write(rt_arglog_fd, line, (size_t)n) != n)
        abort();
}

RT_HIDDEN void rt_hex(char *out, const void *bytes, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

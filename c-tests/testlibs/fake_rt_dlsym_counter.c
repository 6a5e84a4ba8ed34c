/* fake_rt_dlsym_counter.so: an LD_PRELOAD probe that records how a program reaches the
 * CUDA driver.
 *
 * Why it exists: the fake libcudart.so.12 must reach the driver exactly like NVIDIA's
 * (docs/design.md §3): one dlsym(h, "cuGetProcAddress_v2"), then every entry point through
 * that pointer with an explicit version, and flags 2 for the per-thread ones. This probe
 * logs, one line each, to the file named by FAKE_RT_DLSYM_LOG (appending, with write(2)):
 *   dlsym <TAB> <calling object's file name> <TAB> <symbol>
 *   gpa   <TAB> <calling object's file name> <TAB> <symbol> <TAB> <version> <TAB> <flags>
 * Every dlsym of "cuGetProcAddress_v2" gets a logging wrapper that forwards to the driver's
 * function, which is also how a guard substitutes its own wrapper at that dlsym, so the
 * gpa lines show every request that went through the pointer the caller holds.
 * Limits: a plain C dlsym override resolves RTLD_NEXT relative to this probe (docs/design.md
 * section 4); the programs run under it do not use RTLD_NEXT.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult_t;
typedef CUresult_t (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
typedef void *(*dlsym_fn)(void *, const char *);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dlsym_fn real_dlsym;
static int log_fd = -1;
static gpa_fn real_gpa;

static void setup(void)
{
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    const char *path = getenv("FAKE_RT_DLSYM_LOG");
    if (path)
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (!real_dlsym) {
        static const char msg[] = "fake_rt_dlsym_counter: cannot find the real dlsym\n";
        (void)!write(2, msg, sizeof msg - 1);
        abort();
    }
}

static const char *caller_name(const void *addr)
{
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname || !*info.dli_fname)
        return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

static void log_line(const char *line, int n)
{
    if (log_fd >= 0 && n > 0)
        (void)!write(log_fd, line, (size_t)n);
}

static CUresult_t logging_gpa(const char *symbol, void **pfn, int version,
                              unsigned long long flags, int *status)
{
    char line[512];
    int n = snprintf(line, sizeof line, "gpa\t%s\t%s\t%d\t%llu\n",
                     caller_name(__builtin_return_address(0)), symbol ? symbol : "(null)",
                     version, flags);
    log_line(line, n < (int)sizeof line ? n : (int)sizeof line - 1);
    return real_gpa(symbol, pfn, version, flags, status);
}

void *dlsym(void *handle, const char *name)
{
    pthread_once(&once, setup);
    char line[512];
    int n = snprintf(line, sizeof line, "dlsym\t%s\t%s\n",
                     caller_name(__builtin_return_address(0)), name);
    log_line(line, n < (int)sizeof line ? n : (int)sizeof line - 1);
    void *p = real_dlsym(handle, name);
    if (p && !strcmp(name, "cuGetProcAddress_v2")) {
        real_gpa = (gpa_fn)p;
        return (void *)logging_gpa;
    }
    return p;
}

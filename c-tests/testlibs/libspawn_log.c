/* libspawn_log.so: a preload that appends one line per process-creating call to the file
 * named by SPAWN_LOG, then forwards the call:
 *
 *   <pid> fork
 *   <pid> clone vm             (clone with CLONE_VM; "clone" without it)
 *   <pid> exec <path>          (execve, execv, execvp, execvpe)
 *   <pid> spawn <path>         (posix_spawn, posix_spawnp)
 *   <pid> image <path>         (a program image started with this preload: the path its
 *                               exec was given, AT_EXECFN; also after a raw execve system
 *                               call, which no preload can see)
 *
 * test_launch_cost.py counts what `rankguard launch` starts: which helpers are forked,
 * which ranks are cloned, which programs run, and how often. One write(2) per line,
 * O_APPEND: lines from several processes never interleave. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/auxv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void log_line(const char *what, const char *path)
{
    const char *file = getenv("SPAWN_LOG");
    if (!file)
        return;
    char buf[4200];
    int n = snprintf(buf, sizeof buf, "%d %s%s%s\n", (int)getpid(), what, path ? " " : "", path ? path : "");
    if (n <= 0 || n >= (int)sizeof buf)
        return;
    int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    (void)!write(fd, buf, (size_t)n);
    close(fd);
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

__attribute__((constructor)) static void log_image(void)
{
    const char *path = (const char *)getauxval(AT_EXECFN);
    log_line("image", path ? path : "?");
}

/* glibc's clone(fn, stack, flags, arg, [ptid, tls, ctid]): the optional arguments are
 * forwarded as read (unused ones are whatever the caller left in those registers). */
int clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    pid_t *ptid = va_arg(ap, pid_t *);
    void *tls = va_arg(ap, void *);
    pid_t *ctid = va_arg(ap, pid_t *);
    va_end(ap);
    log_line((flags & CLONE_VM) ? "clone vm" : "clone", NULL);
    return NEXT(clone)(fn, stack, flags, arg, ptid, tls, ctid);
}

pid_t fork(void)
{
    log_line("fork", NULL);
    return NEXT(fork)();
}

int execve(const char *path, char *const argv[], char *const envp[])
{
    log_line("exec", path);
    return NEXT(execve)(path, argv, envp);
}

int execv(const char *path, char *const argv[])
{
    log_line("exec", path);
    return NEXT(execv)(path, argv);
}

int execvp(const char *file, char *const argv[])
{
    log_line("exec", file);
    return NEXT(execvp)(file, argv);
}

int execvpe(const char *file, char *const argv[], char *const envp[])
{
    log_line("exec", file);
    return NEXT(execvpe)(file, argv, envp);
}

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    log_line("spawn", path);
    return NEXT(posix_spawn)(pid, path, fa, attr, argv, envp);
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                 const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    log_line("spawn", file);
    return NEXT(posix_spawnp)(pid, file, fa, attr, argv, envp);
}

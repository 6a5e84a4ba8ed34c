/* libspawn_log.so: a preload that appends one line per process-creating call to the file
 * named by SPAWN_LOG, then forwards the call:
 *
 *   <pid> fork
 *   <pid> exec <path>          (execve, execv, execvp, execvpe)
 *   <pid> spawn <path>         (posix_spawn, posix_spawnp)
 *
 * test_launch_cost.py counts what `rankguard launch` starts: which helpers are forked,
 * which programs are exec'ed, and how often. One write(2) per line, O_APPEND: lines from
 * several processes never interleave. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
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

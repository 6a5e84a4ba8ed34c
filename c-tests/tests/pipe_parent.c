/* pipe_parent CHILD_CVD [SECS]: a parent that never watches its child (issue 28): it
 * makes a pipe, keeps its write end open itself, starts a child that initialises CUDA
 * with CUDA_VISIBLE_DEVICES=CHILD_CVD ("unset" leaves it unset), and reads the pipe. The
 * read never ends by itself, as a learner's queue.get() on a pipe it holds open. With
 * SECS it gives up after SECS seconds ("parent gave up") and reaps the child.
 * With PIPE_PARENT_INIT=1 in its environment the parent initialises CUDA itself first, as
 * a learner does, and only then lets the child go. The child always waits for the parent's
 * go: a refused child ends its parent (SIGTERM), which must have printed its line by then.
 * Prints "parent PID child PID" first, then "child status N" when it gives up. */
#include <cuda.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 2) return 3;
    int fds[2], go[2];
    if (pipe(fds) || pipe(go)) return 2;
    int parent_init = getenv("PIPE_PARENT_INIT") != NULL;
    pid_t c = fork();
    if (c == 0) {
        char g;
        if (read(go[0], &g, 1) != 1) _exit(4);
        if (strcmp(argv[1], "unset")) setenv("CUDA_VISIBLE_DEVICES", argv[1], 1);
        else unsetenv("CUDA_VISIBLE_DEVICES");
        int rc = cuInit(0);
        printf("child cuInit=%d\n", rc);
        fflush(stdout);
        _exit(0);
    }
    printf("parent %d child %d\n", (int)getpid(), (int)c);
    fflush(stdout);
    if (parent_init) {
        printf("parent cuInit=%d\n", (int)cuInit(0));
        fflush(stdout);
    }
    if (write(go[1], "g", 1) != 1) return 2;
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int ms = argc > 2 ? atoi(argv[2]) * 1000 : -1;
    int r = poll(&p, 1, ms);
    if (r == 0) {
        int st = 0;
        waitpid(c, &st, 0);
        printf("parent gave up; child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        return 0;
    }
    char b;
    return (int)read(fds[0], &b, 1);
}

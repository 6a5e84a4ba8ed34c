/* pipe_parent CHILD_CVD [SECS]: a parent that never watches its child (issue 28): it
 * makes a pipe, keeps its write end open itself, starts a child that initialises CUDA
 * with CUDA_VISIBLE_DEVICES=CHILD_CVD ("unset" leaves it unset), and reads the pipe. The
 * read never ends by itself, as a learner's queue.get() on a pipe it holds open. With
 * SECS it gives up after SECS seconds ("parent gave up") and reaps the child.
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
    int fds[2];
    if (pipe(fds)) return 2;
    pid_t c = fork();
    if (c == 0) {
        if (strcmp(argv[1], "unset")) setenv("CUDA_VISIBLE_DEVICES", argv[1], 1);
        else unsetenv("CUDA_VISIBLE_DEVICES");
        int rc = cuInit(0);
        printf("child cuInit=%d\n", rc);
        fflush(stdout);
        _exit(0);
    }
    printf("parent %d child %d\n", (int)getpid(), (int)c);
    fflush(stdout);
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

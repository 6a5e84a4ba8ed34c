/* guard_fd_full [argv]: the first cuInit with the fd table full (issue 29, item 2). Lowers
 * RLIMIT_NOFILE to 64, opens /dev/null until EMFILE, then calls cuInit(0) and prints
 * "cuInit=<rc>" (an unbuffered write to fd 1, which is open). `argv` first points argv[0]
 * at a copy, so that the guard reads the start environment through /proc/self/environ
 * (src/guard/1_sys/start_block.rs), which needs a free descriptor. */
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "argv"))
        argv[0] = strdup(argv[0]);
    struct rlimit rl = {64, 64};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 3;
    int n = 0;
    while (open("/dev/null", O_RDONLY) >= 0) n++;
    int rc = cuInit(0);
    char b[64];
    int len = snprintf(b, sizeof b, "filled=%d cuInit=%d\n", n, rc);
    ssize_t w = write(1, b, (size_t)len);
    (void)w;
    return 0;
}

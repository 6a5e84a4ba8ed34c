/* guard_fd_reuse: the guard must never write into a descriptor the program has since
 * closed and reused (issue 14, item 3). argv[1] = "close" or "vfork", argv[2] = the
 * program's own file. "close": a violation opens the audit file, then the program closes
 * every fd >= 3 (as daemons do) and opens its own file; "vfork": a vfork child is the first
 * to touch the guard. Then one more violation; the program writes "mine\n" to its file. */
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    CUdevice d;
    if (strcmp(argv[1], "close") == 0) {
        cuInit(0);
        cuDeviceGet(&d, 1);
        for (int fd = 3; fd < 1024; fd++) close(fd);
    } else {
        pid_t pid = vfork();
        if (pid == 0) {
            cuDeviceGet(&d, 1);
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
    }
    int mine = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (mine < 0) return 2;
    int rc = cuDeviceGet(&d, 1);
    if (write(mine, "mine\n", 5) != 5) return 2;
    close(mine);
    printf("fd=%d cuDeviceGet(1)=%d\n", mine, rc);
    return 0;
}

/* guard_fork: the parent goes through the guard (cuInit, cuDeviceGet(1)), then fork()s;
 * the child initialises CUDA itself and makes the same denied call. Prints each side's
 * pid and codes; the child's report must carry the child's own pid. */
#include <cuda.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    CUdevice d;
    int a = cuInit(0), b = cuDeviceGet(&d, 1);
    printf("parent pid=%d cuInit=%d cuDeviceGet(1)=%d\n", getpid(), a, b);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) {
        int c = cuInit(0), e = cuDeviceGet(&d, 1), f = cuDeviceGet(&d, 0);
        printf("child pid=%d cuInit=%d cuDeviceGet(1)=%d cuDeviceGet(0)=%d\n", getpid(), c, e, f);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

/* guard_repoint VALUE|-: re-point this process's CUDA_VISIBLE_DEVICES (setenv VALUE; `-`
 * unsets it) before initialising CUDA, as a legacy C program that picks its own GPU does,
 * then print what it sees. Driven by python-tests/test_gpu_map.py (R1's "started with"). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: guard_repoint VALUE|-\n");
        return 3;
    }
    if (!strcmp(argv[1], "-"))
        unsetenv("CUDA_VISIBLE_DEVICES");
    else
        setenv("CUDA_VISIBLE_DEVICES", argv[1], 1);
    int n = -1;
    int rc = cuInit(0);
    int rc2 = cuDeviceGetCount(&n);
    printf("cuInit=%d cuDeviceGetCount=%d count=%d\n", rc, rc2, n);
    return 0;
}

/* guard_repoint VALUE|- [argv|unset]: re-point this process's CUDA_VISIBLE_DEVICES (setenv
 * VALUE; `-` unsets it) before initialising CUDA, as a legacy C program that picks its own
 * GPU does, then print what it sees. Driven by python-tests/test_gpu_map.py (R1's "started
 * with") and test_start_env.py. The third argument first changes what the guard reads the
 * start environment through (src/guard/1_sys/start_block.rs): `argv` points argv[0] at a
 * copy, as a program that rewrites its arguments does; `unset` unsets the variable before
 * setting it, which moves the later entries of the loader's environment array down. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: guard_repoint VALUE|- [argv|unset]\n");
        return 3;
    }
    const char *how = argc == 3 ? argv[2] : "";
    if (!strcmp(how, "argv"))
        argv[0] = strdup(argv[0]);
    else if (!strcmp(how, "unset"))
        unsetenv("CUDA_VISIBLE_DEVICES");
    else if (*how) {
        fprintf(stderr, "guard_repoint: unknown '%s' (argv, unset)\n", how);
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

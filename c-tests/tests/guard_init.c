/* guard_init [rt]: initialise CUDA (driver: cuInit; rt: cudaGetDeviceCount through the
 * runtime) and print what the process sees. Used for the R1 outcomes per CVD and mode. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    int n = -1;
    if (argc > 1 && !strcmp(argv[1], "rt")) {
        int rc = cudaGetDeviceCount(&n);
        printf("cudaGetDeviceCount=%d count=%d\n", rc, n);
        return 0;
    }
    int rc = cuInit(0);
    int rc2 = cuDeviceGetCount(&n);
    printf("cuInit=%d cuDeviceGetCount=%d count=%d\n", rc, rc2, n);
    return 0;
}

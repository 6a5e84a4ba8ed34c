/* guard_gpa_all: read "NAME VERSION FLAGS" lines on stdin, ask cuGetProcAddress_v2 for each
 * and print "NAME VERSION FLAGS rc=R status=S lib=LIB sym=SYM": which library and which
 * symbol the returned pointer belongs to (dladdr). Drives the test that every ABI variant
 * of every guarded function comes back as the guard's own wrapper of that variant. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    char name[256];
    int version;
    unsigned long long flags;
    if (cuInit(0) != CUDA_SUCCESS) {
        printf("cuInit failed\n");
        return 2;
    }
    while (scanf("%255s %d %llu", name, &version, &flags) == 3) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        CUresult rc = cuGetProcAddress_v2(name, &p, version, flags, &st);
        Dl_info info;
        const char *lib = "-", *sym = "-";
        if (p && dladdr(p, &info)) {
            lib = info.dli_fname ? strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1
                                                                : info.dli_fname
                                 : "-";
            sym = info.dli_sname ? info.dli_sname : "-";
        }
        printf("%s %d %llu rc=%d status=%d lib=%s sym=%s\n", name, version, flags, rc, st, lib, sym);
    }
    return 0;
}

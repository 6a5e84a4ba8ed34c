/* hot_pages: the first cuInit and ten cuDeviceGet(0) calls (scripts/bench's figure 7
 * program), then print which pages of librankguard.so's executable mapping are present in
 * this process's page table (/proc/self/pagemap, bit 63), as ELF addresses:
 * "present 0x<vaddr>" per page, then "done". Exit 1 on a failed call, 2 when no executable
 * mapping of a librankguard file is found. python-tests/test_hot_text.py checks that fewer
 * than half of the text's pages are present (docs/benchmarks.md, "The first cuInit's text
 * pages"). */
#include <cuda.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    if (cuInit(0) != CUDA_SUCCESS) {
        fprintf(stderr, "hot_pages: cuInit failed\n");
        return 1;
    }
    CUdevice d;
    for (int i = 0; i < 10; i++)
        if (cuDeviceGet(&d, 0) != CUDA_SUCCESS) {
            fprintf(stderr, "hot_pages: cuDeviceGet(0) failed\n");
            return 1;
        }
    FILE *maps = fopen("/proc/self/maps", "r");
    int pm = open("/proc/self/pagemap", O_RDONLY);
    if (!maps || pm < 0) {
        perror("hot_pages: /proc/self/maps or pagemap");
        return 1;
    }
    char line[4096];
    unsigned long base = 0;
    int found = 0;
    long page = sysconf(_SC_PAGESIZE);
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi, off;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %lx", &lo, &hi, perms, &off) != 4 || !strstr(line, "/librankguard"))
            continue;
        if (off == 0 && !base)
            base = lo; /* the first LOAD segment: ELF vaddr 0 */
        if (perms[2] != 'x')
            continue;
        found = 1;
        for (unsigned long a = lo; a < hi; a += page) {
            uint64_t e = 0;
            if (pread(pm, &e, sizeof e, (off_t)(a / page * sizeof e)) != sizeof e) {
                perror("hot_pages: pagemap read");
                return 1;
            }
            if (e >> 63)
                printf("present 0x%lx\n", a - base);
        }
    }
    printf("done\n");
    return found ? 0 : 2;
}

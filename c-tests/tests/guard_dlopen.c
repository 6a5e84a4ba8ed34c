/* guard_dlopen: a program that dlopen()s librankguard.so itself (argv[1]) instead of
 * preloading it, and calls its exported cuInit and cuDeviceGet (issue 14, item 12). */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*init_fn)(unsigned);
typedef int (*get_fn)(int *, int);

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 2; }
    init_fn init = (init_fn)dlsym(h, "cuInit");
    get_fn get = (get_fn)dlsym(h, "cuDeviceGet");
    if (!init || !get) return 2;
    int d = -1;
    int a = init(0), b = get(&d, 0), c = get(&d, 1);
    printf("cuInit=%d cuDeviceGet(0)=%d cuDeviceGet(1)=%d\n", a, b, c);
    return 0;
}

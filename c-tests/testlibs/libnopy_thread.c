/* libnopy_thread: a library a Python process loads with ctypes; violate_from_c_thread()
 * starts a plain C thread (no Python thread state, no Python frame) that calls
 * cuDeviceGet(&d, 1) through dlsym, joins it and returns the call's result. Used by
 * python-tests/test_guard_sites.py: the violation's site is this library's function. */
#include <dlfcn.h>
#include <pthread.h>

typedef int (*get_fn)(int *, int);
static int result = -1;

__attribute__((noinline)) static void *c_thread(void *arg) {
    (void)arg;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    get_fn f = h ? (get_fn)dlsym(h, "cuDeviceGet") : 0;
    int d = 0;
    result = f ? f(&d, 1) : -2;
    return 0;
}

int violate_from_c_thread(void) {
    pthread_t t;
    if (pthread_create(&t, 0, c_thread, 0) != 0) return -3;
    pthread_join(t, 0);
    return result;
}

/* guard_rtld_next: linked against libnext_a.so then libnext_b.so, prints what A's
 * dlsym(RTLD_NEXT, "probe") finds. Expected "next=B" with or without a preloaded guard;
 * a dlsym override that calls (instead of jumping to) the real dlsym makes the lookup look
 * like it came from the override, and the answer becomes A's own probe. */
#include <stdio.h>
const char *a_next_probe(void);
int main(void) {
    printf("next=%s\n", a_next_probe());
    return 0;
}

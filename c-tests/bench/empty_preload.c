/* empty_preload: a shared library with nothing in it, preloaded by scripts/bench as the
 * physical floor of LD_PRELOAD. Whatever a process pays for loading one more small library
 * (open, mmap, relocation, one more object in every symbol search) this library pays too;
 * librankguard.so's start-up cost is judged against it, not against no preload at all.
 * The one symbol keeps the object a normal DSO with a dynamic symbol table. */
int rankguard_bench_empty_preload(void);
int rankguard_bench_empty_preload(void) { return 0; }

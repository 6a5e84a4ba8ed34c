/* benchsyms: the library bench_dlsym looks names up in. It exports one plain name and one
 * name that starts with "cu" without being CUDA (libcurl's curl_easy_init): the guard's
 * dlsym decides on the first two bytes, so the second name is the slower non-CUDA case. */
int bench_plain_symbol(void);
int curl_easy_init(void);
int bench_plain_symbol(void) { return 1; }
int curl_easy_init(void) { return 2; }

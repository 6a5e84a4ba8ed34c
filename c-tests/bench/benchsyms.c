/* benchsyms: the library bench_dlsym looks names up in. It exports one plain name and names
 * that start with "cu" without being guarded CUDA functions, as real jobs look them up:
 * libcurl's curl_easy_init, cuBLAS's cublasCreate_v2, cuDNN's cudnnCreate. The guard's dlsym
 * rejects them in its trampoline: at byte 2 (curl, cublas) or byte 3 (cudnn), 9 instructions
 * each. */
int bench_plain_symbol(void);
int curl_easy_init(void);
int cublasCreate_v2(void);
int cudnnCreate(void);
int bench_plain_symbol(void) { return 1; }
int curl_easy_init(void) { return 2; }
int cublasCreate_v2(void) { return 3; }
int cudnnCreate(void) { return 4; }

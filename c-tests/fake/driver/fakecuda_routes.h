/* Types of the tables gen_routes.py generates from NVIDIA's headers (see that script):
 * the cuGetProcAddress routing table, CUresult names and valid device attributes.
 * Private to the fake driver; the generated file includes only this header. */
#ifndef FAKECUDA_ROUTES_H
#define FAKECUDA_ROUTES_H

struct fakecuda_route {
    const char *name;        /* base name passed to cuGetProcAddress, e.g. "cuCtxCreate" */
    int version;             /* CUDA version the variant appeared in (typedef suffix) */
    int per_thread;          /* 1 for the _ptds/_ptsz variant */
    int implemented;         /* 0: a generated stub returning CUDA_ERROR_NOT_SUPPORTED */
    const char *abi;         /* exported symbol, e.g. "cuCtxCreate_v2" */
    void (*fn)(void);        /* the library's own function, never looked up with dlsym */
};

struct fakecuda_error {
    int code;
    const char *name;
    const char *desc;
};

/* Sorted by (name, per_thread, version). */
extern const struct fakecuda_route fakecuda_routes[];
extern const unsigned fakecuda_routes_len;
extern const struct fakecuda_error fakecuda_errors[];
extern const unsigned fakecuda_errors_len;
extern const int fakecuda_device_attrs[];
extern const unsigned fakecuda_device_attrs_len;

#endif

/* guard_call13: guard_call (tests/guard_call.c) built against the CUDA 13 headers and
 * linked against libcudart.so.13: the runtime calls are CUDA 13's, with its parameters
 * (test_guard_paths.py runs both). */
#include "../tests/guard_call.c"

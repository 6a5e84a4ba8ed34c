# The fake CUDA runtimes (libcudart.so.12, libcudart.so.13, the stand-in libcudart.so.14)
# and fakecuda-smi. Included by c-tests/Makefile.
#
# One source, three builds: .so.12 against the 12.9 headers (build/cuda-include), .so.13
# against the 13.x headers (build/cuda13-include), .so.14 against the 13.x headers with
# FAKECUDART_MAJOR=14 (a major rankguard does not know). Each has the version node of its
# soname (a version script generated from libcudart.map). gen_sigdiff.py derives, from the
# two headers, the functions whose signature or exported name differs between 12.9 and
# 13.x, and generates each major's weak argument-logging stubs of them.
#
# libcudart.so.12 is NOT linked against -lcuda: like NVIDIA's runtime it dlopen()s
# libcuda.so.1 at first use, so it can be built before or after the fake driver. Its
# exports carry the `libcudart.so.12` version node (libcudart.map). The error-name table
# is generated from NVIDIA's driver_types.h so names can never drift from the headers.
# fakecuda-smi also dlopen()s libcuda.so.1; its RUNPATH ($ORIGIN) finds the fake driver
# next to it even without LD_LIBRARY_PATH.
RT_DIR   := $(HERE)fake/runtime
SMI_DIR  := $(HERE)fake/smi
RT_SRCS  := $(wildcard $(RT_DIR)/*.c)
RT_HDRS  := $(wildcard $(RT_DIR)/*.h)
SMI_SRCS := $(wildcard $(SMI_DIR)/*.c)
SIGDIFF  := $(RT_DIR)/gen_sigdiff.py
RT_API_H := $(wildcard $(CUDA_INC)/cuda_runtime_api.h) $(wildcard $(CUDA13_INC)/cuda_runtime_api.h)
# CFLAGS of a build against the 13.x headers: its include directories searched first.
CFLAGS13  = -I$(GEN)/13 -I$(CUDA13_INC) $(CFLAGS)

# cuda_runtime_api.h needs crt/host_defines.h, which the pinned runtime wheel lacks; the
# host-only stand-in in compat/ is searched after every other directory (see its header).
# Appended to the shared CFLAGS because every C file that includes cuda_runtime_api.h
# (the runtime's test programs) needs it.
CFLAGS   += -idirafter $(RT_DIR)/compat

fake: $(FAKE)/libcudart.so.12 $(FAKE)/libcudart.so $(FAKE)/fakecuda-smi \
      $(FAKE)/libcudart.so.13 $(FAKE)/libcudart.so.14 $(GEN)/fakecudart_sigdiff.txt

# The differing functions (name kind), for the tests; and each major's stubs of them.
$(GEN)/fakecudart_sigdiff.txt: $(SIGDIFF) $(RT_API_H) | check-headers check-headers13
	@mkdir -p $(GEN)
	$(DRV_PYTHON) $(SIGDIFF) $(CUDA_INC)/cuda_runtime_api.h $(CUDA13_INC)/cuda_runtime_api.h --out-txt $@
$(GEN)/12/fakecudart_sigdiff_stubs.c: $(SIGDIFF) $(RT_API_H) | check-headers check-headers13
	@mkdir -p $(GEN)/12
	$(DRV_PYTHON) $(SIGDIFF) $(CUDA_INC)/cuda_runtime_api.h $(CUDA13_INC)/cuda_runtime_api.h \
	    --stubs-for $(CUDA_INC)/cuda_runtime_api.h --out-c $@
$(GEN)/13/fakecudart_sigdiff_stubs.c: $(SIGDIFF) $(RT_API_H) | check-headers check-headers13
	@mkdir -p $(GEN)/13
	$(DRV_PYTHON) $(SIGDIFF) $(CUDA_INC)/cuda_runtime_api.h $(CUDA13_INC)/cuda_runtime_api.h \
	    --stubs-for $(CUDA13_INC)/cuda_runtime_api.h --out-c $@
# libcudart.map with the node of another major.
$(GEN)/libcudart.so.%.map: $(RT_DIR)/libcudart.map
	@mkdir -p $(GEN)
	sed 's/^libcudart\.so\.12 {/libcudart.so.$* {/' $< > $@
	grep -q '^libcudart\.so\.$* {' $@

$(GEN)/fakecudart_error_names.h: $(wildcard $(CUDA_INC)/driver_types.h) $(RT_DIR)/runtime.mk | check-headers
	@mkdir -p $(GEN)
	sed -nE 's/^[[:space:]]*,?[[:space:]]*(cuda(Success|Error[A-Za-z0-9]*))[[:space:]]*=[[:space:]]*[0-9]+.*/    { \1, "\1" },/p' \
	    $(CUDA_INC)/driver_types.h > $@.tmp
	@test -s $@.tmp || { echo "runtime.mk: no cudaError values found in $(CUDA_INC)/driver_types.h" >&2; exit 1; }
	mv $@.tmp $@

$(FAKE)/libcudart.so.12: $(RT_SRCS) $(RT_HDRS) $(RT_DIR)/libcudart.map $(GEN)/fakecudart_error_names.h \
                         $(GEN)/12/fakecudart_sigdiff_stubs.c | check-headers
	@mkdir -p $(FAKE)
	$(CC) $(CFLAGS) -fvisibility=hidden -shared -Wl,-soname,libcudart.so.12 \
	    -Wl,--version-script,$(RT_DIR)/libcudart.map -Wl,-z,defs -o $@ $(RT_SRCS) \
	    -I$(RT_DIR) $(GEN)/12/fakecudart_sigdiff_stubs.c -ldl -pthread

$(GEN)/13/fakecudart_error_names.h: $(wildcard $(CUDA13_INC)/driver_types.h) $(RT_DIR)/runtime.mk | check-headers13
	@mkdir -p $(GEN)/13
	sed -nE 's/^[[:space:]]*,?[[:space:]]*(cuda(Success|Error[A-Za-z0-9]*))[[:space:]]*=[[:space:]]*[0-9]+.*/    { \1, "\1" },/p' \
	    $(CUDA13_INC)/driver_types.h > $@.tmp
	@test -s $@.tmp || { echo "runtime.mk: no cudaError values found in $(CUDA13_INC)/driver_types.h" >&2; exit 1; }
	mv $@.tmp $@

RT13_DEPS := $(RT_SRCS) $(RT_HDRS) $(GEN)/13/fakecudart_error_names.h $(GEN)/13/fakecudart_sigdiff_stubs.c
$(FAKE)/libcudart.so.13: $(RT13_DEPS) $(GEN)/libcudart.so.13.map | check-headers13
	@mkdir -p $(FAKE)
	$(CC) $(CFLAGS13) -fvisibility=hidden -shared -Wl,-soname,libcudart.so.13 \
	    -Wl,--version-script,$(GEN)/libcudart.so.13.map -Wl,-z,defs -o $@ $(RT_SRCS) \
	    -I$(RT_DIR) $(GEN)/13/fakecudart_sigdiff_stubs.c -ldl -pthread

# A runtime of a major rankguard does not know: the 13 one under the soname and version
# node libcudart.so.14, reporting runtime version 14000 and needing a 14.x driver.
$(FAKE)/libcudart.so.14: $(RT13_DEPS) $(GEN)/libcudart.so.14.map | check-headers13
	@mkdir -p $(FAKE)
	$(CC) $(CFLAGS13) -DFAKECUDART_MAJOR=14 -DFAKECUDART_RUNTIME_VERSION=14000 \
	    -fvisibility=hidden -shared -Wl,-soname,libcudart.so.14 \
	    -Wl,--version-script,$(GEN)/libcudart.so.14.map -Wl,-z,defs -o $@ $(RT_SRCS) \
	    -I$(RT_DIR) $(GEN)/13/fakecudart_sigdiff_stubs.c -ldl -pthread

$(FAKE)/libcudart.so: $(FAKE)/libcudart.so.12
	ln -sf libcudart.so.12 $@

$(FAKE)/fakecuda-smi: $(SMI_SRCS) | check-headers
	@mkdir -p $(FAKE)
	$(CC) $(CFLAGS) -o $@ $(SMI_SRCS) -ldl -Wl,-rpath,'$$ORIGIN'

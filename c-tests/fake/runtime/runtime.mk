# The fake CUDA runtime (libcudart.so.12) and fakecuda-smi. Included by c-tests/Makefile.
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

# cuda_runtime_api.h needs crt/host_defines.h, which the pinned runtime wheel lacks; the
# host-only stand-in in compat/ is searched after every other directory (see its header).
# Appended to the shared CFLAGS because every C file that includes cuda_runtime_api.h
# (the runtime's test programs) needs it.
CFLAGS   += -idirafter $(RT_DIR)/compat

fake: $(FAKE)/libcudart.so.12 $(FAKE)/libcudart.so $(FAKE)/fakecuda-smi

$(GEN)/fakecudart_error_names.h: $(wildcard $(CUDA_INC)/driver_types.h) $(RT_DIR)/runtime.mk | check-headers
	@mkdir -p $(GEN)
	sed -nE 's/^[[:space:]]*,?[[:space:]]*(cuda(Success|Error[A-Za-z0-9]*))[[:space:]]*=[[:space:]]*[0-9]+.*/    { \1, "\1" },/p' \
	    $(CUDA_INC)/driver_types.h > $@.tmp
	@test -s $@.tmp || { echo "runtime.mk: no cudaError values found in $(CUDA_INC)/driver_types.h" >&2; exit 1; }
	mv $@.tmp $@

$(FAKE)/libcudart.so.12: $(RT_SRCS) $(RT_HDRS) $(RT_DIR)/libcudart.map $(GEN)/fakecudart_error_names.h | check-headers
	@mkdir -p $(FAKE)
	$(CC) $(CFLAGS) -fvisibility=hidden -shared -Wl,-soname,libcudart.so.12 \
	    -Wl,--version-script,$(RT_DIR)/libcudart.map -Wl,-z,defs -o $@ $(RT_SRCS) -ldl -pthread

$(FAKE)/libcudart.so: $(FAKE)/libcudart.so.12
	ln -sf libcudart.so.12 $@

$(FAKE)/fakecuda-smi: $(SMI_SRCS) | check-headers
	@mkdir -p $(FAKE)
	$(CC) $(CFLAGS) -o $@ $(SMI_SRCS) -ldl -Wl,-rpath,'$$ORIGIN'

# The fake NVIDIA driver: $(FAKE)/libcuda.so.1 (+ the libcuda.so link-time symlink).
# Included by c-tests/Makefile, which defines HERE, FAKE, GEN, CUDA_INC, CC and CFLAGS.
#
# Build order: compile the driver's sources, list the symbols they define (nm), generate
# the cuGetProcAddress routing table from cudaTypedefs.h with gen_routes.py (pointing at
# those symbols, stubs for the rest), then link with -Bsymbolic so every address the table
# holds is the library's own function even when a preload exports the same names.
DRV_DIR   := $(HERE)fake/driver
DRV_OBJ   := $(GEN)/driver
DRV_SRCS  := $(DRV_DIR)/node.c $(DRV_DIR)/cvd.c $(DRV_DIR)/driver.c $(DRV_DIR)/memory.c $(DRV_DIR)/reach.c \
             $(DRV_DIR)/devstate.c
DRV_OBJS  := $(patsubst $(DRV_DIR)/%.c,$(DRV_OBJ)/%.o,$(DRV_SRCS))
DRV_HDRS  := $(DRV_DIR)/fake.h $(DRV_DIR)/fakecuda_routes.h
# __CUDA_API_VERSION_INTERNAL: cuda.h then declares every ABI variant under its exported
# name (cuCtxCreate, cuCtxCreate_v2, cuMemcpyHtoD_v2_ptds, ...) instead of remapping.
DRV_CFLAGS := $(CFLAGS) -D_GNU_SOURCE -D__CUDA_API_VERSION_INTERNAL -fvisibility=hidden -I$(DRV_DIR)
DRV_PYTHON ?= $(firstword $(wildcard $(HERE)../.venv/bin/python3) python3)
# Sources compiled against the 13.x headers, which declare the CUDA 13 entry points they
# implement with their types (and every 12.9 function): copies.c, the batch and attribute
# copies (12.8's and 13's) with their operand structs.
DRV13_OBJS := $(DRV_OBJ)/copies.o
DRV_OBJS  += $(DRV13_OBJS)
$(DRV13_OBJS): $(DRV_OBJ)/%.o: $(DRV_DIR)/%.c $(DRV_HDRS) | check-headers13
	@mkdir -p $(DRV_OBJ)
	$(CC) $(filter-out -I$(CUDA_INC),$(DRV_CFLAGS)) -I$(CUDA13_INC) -c -o $@ $<

.PHONY: fake
fake: $(FAKE)/libcuda.so.1 $(FAKE)/libcuda.so

$(DRV_OBJ)/%.o: $(DRV_DIR)/%.c $(DRV_HDRS) | check-headers
	@mkdir -p $(DRV_OBJ)
	$(CC) $(DRV_CFLAGS) -c -o $@ $<

# devstate.c implements CUDA 13's atomic capabilities with their types: the 13.x cuda.h
# declares them (and every 12.9 function it also implements).
$(DRV_OBJ)/devstate.o: $(DRV_DIR)/devstate.c $(DRV_HDRS) | check-headers13
	@mkdir -p $(DRV_OBJ)
	$(CC) $(filter-out -I$(CUDA_INC),$(DRV_CFLAGS)) -I$(CUDA13_INC) -c -o $@ $<

$(GEN)/fakecuda_implemented.txt: $(DRV_OBJS)
	@mkdir -p $(GEN)
	nm -g --defined-only $(DRV_OBJS) | awk 'NF == 3 && $$2 == "T" { print $$3 }' | sort -u > $@

# The routing table merges the 12.9 and the 13.x headers (requests up to 13xxx get the
# variant a 13.x driver would return; 13's new entry points exist).
$(GEN)/fakecuda_routes.c: $(DRV_DIR)/gen_routes.py $(GEN)/fakecuda_implemented.txt | check-headers check-headers13
	$(DRV_PYTHON) $(DRV_DIR)/gen_routes.py \
	  --typedefs $(CUDA_INC)/cudaTypedefs.h --cuda-h $(CUDA_INC)/cuda.h \
	  --typedefs $(CUDA13_INC)/cudaTypedefs.h --cuda-h $(CUDA13_INC)/cuda.h \
	  --implemented $(GEN)/fakecuda_implemented.txt -o $@

$(DRV_OBJ)/fakecuda_routes.o: $(GEN)/fakecuda_routes.c $(DRV_DIR)/fakecuda_routes.h
	@mkdir -p $(DRV_OBJ)
	$(CC) $(DRV_CFLAGS) -c -o $@ $<

$(FAKE)/libcuda.so.1: $(DRV_OBJS) $(DRV_OBJ)/fakecuda_routes.o
	@mkdir -p $(FAKE)
	$(CC) -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -Wl,-z,defs -o $@ $^ -pthread

$(FAKE)/libcuda.so: $(FAKE)/libcuda.so.1
	ln -sf libcuda.so.1 $@

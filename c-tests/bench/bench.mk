# Benchmark programs for scripts/bench (not tests: nothing in python-tests runs them).
# Included by c-tests/Makefile, which defines HERE, BUILD, FAKE, CUDA_INC, CC, CFLAGS,
# CFLAGS13 and TEST_LDFLAGS. Cheap to build, but kept out of `all`: `make -C c-tests bench`.
#   build/bench/bench_calls        guarded call cost (links the fake libcuda/libcudart)
#   build/bench/bench_calls13      the same, built as a CUDA 13 program (13.x headers, the fake
#                                  libcudart.so.13) where the fake platform has one
#   build/bench/bench_dlsym        non-CUDA dlsym cost
#   build/bench/bench_spawn        start-up and launch wall time (posix_spawn, no CUDA)
#   build/bench/empty_preload.so   the physical floor of LD_PRELOAD
#   build/bench/jump_dlsym.so      the floor of interposing dlsym (a dlsym that only jumps)
#   build/bench/libbenchsyms.so    names bench_dlsym looks up
BBUILD := $(BUILD)/bench
BENCH_BINS := $(BBUILD)/bench_calls $(BBUILD)/bench_calls13 $(BBUILD)/bench_dlsym $(BBUILD)/bench_spawn \
              $(BBUILD)/empty_preload.so $(BBUILD)/jump_dlsym.so $(BBUILD)/libbenchsyms.so

.PHONY: bench
bench: $(BENCH_BINS)

$(BBUILD)/bench_calls: $(HERE)bench/bench_calls.c fake | check-headers
	@mkdir -p $(BBUILD)
	$(CC) $(CFLAGS) -o $@ $< $(TEST_LDFLAGS) -lcudart -lcuda

# Without a fake libcudart.so.13 nothing is built (and any old copy is removed), so the cu13
# row of scripts/bench says it is not measurable rather than time something else.
# Compiled against the 13.x headers, as a CUDA 13 program is.
$(BBUILD)/bench_calls13: $(HERE)bench/bench_calls.c fake | check-headers13
	@mkdir -p $(BBUILD)
	@if [ -e $(FAKE)/libcudart.so.13 ]; then \
	    echo "$(CC) $(CFLAGS13) -o $@ $< $(TEST_LDFLAGS) -l:libcudart.so.13 -lcuda"; \
	    $(CC) $(CFLAGS13) -o $@ $< $(TEST_LDFLAGS) -l:libcudart.so.13 -lcuda; \
	else \
	    rm -f $@; echo "bench: no $(FAKE)/libcudart.so.13, so no $@"; \
	fi

$(BBUILD)/bench_dlsym: $(HERE)bench/bench_dlsym.c
	@mkdir -p $(BBUILD)
	$(CC) $(CFLAGS) -o $@ $< -ldl

$(BBUILD)/bench_spawn: $(HERE)bench/bench_spawn.c
	@mkdir -p $(BBUILD)
	$(CC) $(CFLAGS) -o $@ $<

$(BBUILD)/empty_preload.so: $(HERE)bench/empty_preload.c
	@mkdir -p $(BBUILD)
	$(CC) $(CFLAGS) -shared -o $@ $<

$(BBUILD)/jump_dlsym.so: $(HERE)bench/jump_dlsym.c
	@mkdir -p $(BBUILD)
	$(CC) $(CFLAGS) -shared -o $@ $< -ldl

$(BBUILD)/libbenchsyms.so: $(HERE)bench/benchsyms.c
	@mkdir -p $(BBUILD)
	$(CC) $(CFLAGS) -shared -o $@ $<

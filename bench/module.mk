# Benchmarks: every bench/<name>.c becomes $(O)/bench/<name>, built by `make bench` (never by
# the tests). They link libpfclient + libpfcore and the test helpers (tests/lib).
BENCH_SRCS := $(sort $(wildcard bench/*.c))
BENCH_BINS := $(patsubst bench/%.c,$(O)/bench/%,$(BENCH_SRCS))

$(O)/bench/%: $(O)/obj/bench/%.o $(call obj,$(TESTLIB_SRCS)) $(LIBPFCLIENT) $(LIBPFCORE)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -o $@ $< $(TESTLIB_OBJS) $(LIBPFCLIENT) $(LIBPFCORE) $(LIBS_ALL) \
		$(CUDA_LIBS) $(if $(CU_SRCS),-lstdc++)

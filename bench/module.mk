# Benchmarks: bench/<name>.c -> $(O)/bench/<name>, built by `make bench` (never by tests).
BENCH_SRCS := $(sort $(wildcard bench/*.c))
BENCH_BINS := $(patsubst bench/%.c,$(O)/bench/%,$(BENCH_SRCS))

$(O)/bench/%: $(O)/obj/bench/%.o $(LIBPFCORE)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIBPFCORE) $(LIBS_ALL) $(CUDA_LIBS) $(if $(CU_SRCS),-lstdc++)

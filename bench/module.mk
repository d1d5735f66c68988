# Benchmarks: bench/<name>.c -> $(O)/bench/<name>, linked like the integration helpers.
# `make bench` builds them; each prints a table and a JSON result (bench/metaserver: see
# docs/metaserver.md).
BENCH_SRCS := $(sort $(wildcard bench/*.c))
BENCH_BINS := $(patsubst bench/%.c,$(O)/bench/%,$(BENCH_SRCS))

$(O)/bench/%: $(O)/obj/bench/%.o $(LIBPFCLIENT) $(LIBPFCORE)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIBPFCLIENT) $(LIBPFCORE) $(LIBS_ALL) $(CUDA_LIBS) \
		$(if $(CU_SRCS),-lstdc++)

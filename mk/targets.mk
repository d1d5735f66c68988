# Top-level convenience targets.
PREFIX ?= /usr/local
.PHONY: all run coverage format clean install bench bench-build deps help

all: $(BINS) $(LIBPEGAFLOW)

deps:
	@ci/install-deps.sh

# `make run`: the server on defaults with the simulated GPU and a pool that fits this
# machine (the 30gb default does not fit a small VM). Extra flags: make run ARGS="...".
run:
	@ci/install-deps.sh
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@pool=$$(ci/pick-pool-size.sh); \
	echo "make run: pegaflow-server --gpu-backend sim --pool-size $$pool $(ARGS)"; \
	exec $(O)/bin/pegaflow-server --gpu-backend sim --pool-size $$pool $(ARGS)

coverage:
	@ci/install-deps.sh
	@$(MAKE) --no-print-directory COVERAGE=1 -j$(NPROC) test-build
	@find build/cov -name '*.gcda' -delete
	@$(MAKE) --no-print-directory COVERAGE=1 test-run || true
	@ci/coverage-report.sh build/cov

# `make bench`: build, run every benchmark, write build/bench/report.md and report.json
# (QUICK=1: smaller sizes, a smoke run; the figures then mean little; REPEAT=N: N whole runs,
# merged as min/median/max of the runs' medians; the curves of "How cost grows", SVG files
# next to report.md, unless CURVES=0). bench-build: build only.
bench: bench-build
	@/usr/bin/python3 bench/report.py --out build/bench --bin $(O) $(if $(QUICK),--quick) \
		$(if $(REPEAT),--repeat $(REPEAT)) $(if $(filter 0,$(CURVES)),--no-curves)

bench-build:
	@$(MAKE) --no-print-directory -j$(NPROC) all $(BENCH_BINS)

format:
	@find src sim hw tests bench -name '*.[ch]' -print0 | xargs -0 clang-format -i

clean:
	rm -rf build

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/pegaflow
	install -m 755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $(LIBPEGAFLOW) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 src/client/pegaflow.h $(DESTDIR)$(PREFIX)/include/pegaflow/

help:
	@awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' Makefile

# PegaFlow in C — top-level, non-recursive Makefile.
#
#   make                 build binaries and libpegaflow
#   make test            install missing deps, build, run unit + integration + python tests
#   make run             install missing deps, build, start pegaflow-server on defaults (sim GPU)
#   make demo            install missing deps, build, run pegaflow-sim (a 3-node cluster, a workload, a fault)
#   make test SAN=address,undefined | SAN=thread   sanitizer builds (own output dir)
#   make coverage        gcov/lcov build + tests, prints line and branch coverage
#   make deb | wheel     pegaflow_<version>_<arch>.deb, the connector wheel (build/rel/pkg/)
#   make fuzz            libFuzzer targets for minutes each (FUZZ_SECONDS; mk/fuzz.mk)
#
# Modules add their sources from their own module.mk (src/*/, sim/*/, hw/*/, tests/*/).
.DEFAULT_GOAL := all
.SUFFIXES:
.DELETE_ON_ERROR:
# keep test and binary objects (pattern-rule intermediates) so a rebuild relinks only what changed
.SECONDARY:

TOP := $(CURDIR)
include mk/config.mk
include mk/toolchain.mk
include mk/proto.mk

CORE_SRCS :=
CLIENT_SRCS :=
CU_SRCS :=
BIN_NAMES :=
UNIT_TESTS :=
INTEG_PROGS :=
BENCH_PROGS :=

include $(sort $(wildcard src/*/module.mk sim/*/module.mk hw/*/module.mk))
include $(sort $(wildcard tests/*/module.mk tests/unit/*/module.mk bench/module.mk))

include mk/link.mk
include mk/test.mk
include mk/fuzz.mk
include mk/targets.mk
include mk/package.mk
include mk/sim.mk

# libFuzzer targets: tests/fuzz/fuzz_<name>.c -> build/fuzz/tests/fuzz/fuzz_<name>, built in
# their own variant (FUZZ=1: clang, -fsanitize=fuzzer,address,undefined, CUDA and verbs off)
# and linked with tests/fuzz/guard.c + fake_rpc.c (see tests/fuzz/fuzz.h). docs/testing.md.
#   make fuzz              every target for FUZZ_SECONDS (default 180) each, on a working corpus
#                          build/fuzz/corpus/<name> seeded from tests/fuzz/corpus/<name>;
#                          crashes land in build/fuzz/crashes/<name>/ (FUZZ_TARGETS="a b": some)
#   make fuzz-merge        minimises the working corpora into tests/fuzz/corpus/ (-merge=1)
#   make fuzz-build        the targets only; skipped with a note when clang/libFuzzer is absent
#   make fuzz-seeds        rewrites the seed inputs (tests/fuzz/make-seeds.py)
#   make test-fuzz         the "fuzz" suite of tests/run.sh: each target for FUZZ_TEST_SECONDS
#                          (default 5) over the committed corpus (make test runs it too)
FUZZ_SRCS := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(FUZZ_SRCS))
FUZZ_TARGETS ?= $(FUZZ_NAMES)
FUZZ_BINDIR := build/fuzz/tests/fuzz
FUZZ_HELPERS := tests/fuzz/guard.c tests/fuzz/fake_rpc.c
FUZZ_WRAPS := -Wl,--wrap=getaddrinfo,--wrap=connect,--wrap=mmap \
	-Wl,--wrap=pf_rpc_fail,--wrap=pf_rpc_respond,--wrap=pf_rpc_call_peer \
	-Wl,--wrap=pf_rpc_call_expired,--wrap=pf_rpc_call_identities \
	-Wl,--wrap=pf_rpc_call_on_cancel
FUZZ_SECONDS ?= 180
FUZZ_TEST_SECONDS ?= 5
FUZZ_MAKE = $(MAKE) --no-print-directory FUZZ=1 HAVE_CUDA=0 HAVE_VERBS=0 SAN= COVERAGE=

ifeq ($(FUZZ),1)
FUZZ_HELPER_OBJS = $(call obj,$(FUZZ_HELPERS))
$(O)/tests/fuzz/fuzz_%: $(O)/obj/tests/fuzz/fuzz_%.o $(call obj,$(FUZZ_HELPERS)) $(LIBPFCLIENT) \
		$(LIBPFCORE)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -fsanitize=fuzzer $(FUZZ_WRAPS) -o $@ $< $(FUZZ_HELPER_OBJS) \
		$(LIBPFCLIENT) $(LIBPFCORE) $(LIBS_ALL)

.PHONY: fuzz-build-variant
fuzz-build-variant: $(addprefix $(O)/tests/fuzz/fuzz_,$(FUZZ_NAMES))
endif

.PHONY: fuzz fuzz-build fuzz-merge test-fuzz
fuzz-build:
	@if tests/fuzz/have-libfuzzer.sh; then $(FUZZ_MAKE) -j$(NPROC) fuzz-build-variant; fi

fuzz:
	@ci/install-deps.sh
	@tests/fuzz/have-libfuzzer.sh
	@$(FUZZ_MAKE) -j$(NPROC) fuzz-build-variant
	@tests/fuzz/run-target.sh --long $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-merge:
	@tests/fuzz/have-libfuzzer.sh
	@$(FUZZ_MAKE) -j$(NPROC) fuzz-build-variant
	@tests/fuzz/run-target.sh --merge 0 $(FUZZ_TARGETS)

test-fuzz: fuzz-build
	@$(TEST_ENV) tests/run.sh fuzz $(O)

# rewrites the seed inputs (tests/fuzz/corpus/<name>/seed-*) from tests/fuzz/make-seeds.py
.PHONY: fuzz-seeds
fuzz-seeds:
	@tests/fuzz/make-seeds.py

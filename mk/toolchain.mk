# Toolchain, flags and build variants.
#   FUZZ=1                               -> build/fuzz/ (clang; see mk/fuzz.mk)
#   SAN=address,undefined | SAN=thread  -> build/san-<list>/
#   COVERAGE=1                           -> build/cov/
#   default                              -> build/rel/
comma := ,
CC ?= cc
ifeq ($(origin CC),default)
CC := cc
endif
NPROC := $(shell nproc 2>/dev/null || echo 2)
PKGS := grpc libprotobuf-c libmicrohttpd liburing libxxhash libcjson numa libcurl hiredis openssl

ifeq ($(FUZZ),1)
# libFuzzer targets (mk/fuzz.mk): clang, ASan + UBSan, coverage instrumentation everywhere
CC := clang
VARIANT := fuzz
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,fuzzer-no-link \
	-fno-sanitize-recover=undefined
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined
else ifneq ($(SAN),)
VARIANT := san-$(subst $(comma),-,$(SAN))
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=$(SAN)
SANFLAGS := -fsanitize=$(SAN)
ifneq ($(findstring undefined,$(SAN)),)
OPT += -fno-sanitize-recover=undefined
SANFLAGS += -fno-sanitize-recover=undefined
endif
else ifeq ($(COVERAGE),1)
VARIANT := cov
OPT := -O0 -g --coverage
SANFLAGS := --coverage
else
VARIANT := rel
OPT := -O2 -g
SANFLAGS :=
endif
O := build/$(VARIANT)
GEN := build/gen

# Deferred (=) so pkg-config runs only when a recipe needs it, after install-deps.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
WARN := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wstrict-prototypes -Wmissing-prototypes
CPPFLAGS_ALL = -D_GNU_SOURCE -Isrc/include -I$(GEN) -Isrc -Itests/lib $(PKG_CFLAGS)
CFLAGS_ALL = -std=c11 -fPIC -pthread $(OPT) $(WARN) -MMD -MP $(CFLAGS)
LDFLAGS_ALL = -pthread $(SANFLAGS) $(LDFLAGS)
LIBS_ALL = $(PKG_LIBS) -libverbs -lm -ldl -lrt

ifeq ($(HAVE_CUDA),1)
# The server and libpfcore link no CUDA library (hw/cuda loads libcuda.so.1 at run time).
# Only the on-hardware check programs of tests/gpu use the runtime (CUDART_LIBS).
CUDA_LIBS :=
CUDART_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
CUDA_CPPFLAGS := -I$(CUDA_HOME)/include
else
CUDA_LIBS :=
CUDART_LIBS :=
CUDA_CPPFLAGS :=
endif
ifneq ($(HAVE_VERBS),1)
LIBS_ALL := $(filter-out -libverbs,$(LIBS_ALL))
endif

# object path for a source path
obj = $(patsubst %.c,$(O)/obj/%.o,$(filter %.c,$(1))) $(patsubst %.cu,$(O)/obj/%.cu.o,$(filter %.cu,$(1)))

$(O)/obj/%.o: %.c | $(GEN)/engine.pb-c.h
	@mkdir -p $(@D)
	@echo "  CC      $<"
	@$(CC) $(CPPFLAGS_ALL) $(CUDA_CPPFLAGS_$(subst /,_,$(dir $<))) $(CFLAGS_ALL) $(CFLAGS_$(subst /,_,$(dir $<))) -c $< -o $@

$(O)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	@echo "  NVCC    $<"
	@$(NVCC) $(NVCCFLAGS) -c $< -o $@

LIBPFCORE := $(O)/lib/libpfcore.a
LIBPFCLIENT := $(O)/lib/libpfclient.a
LIBPEGAFLOW := $(O)/lib/libpegaflow.so
TESTLIB_SRCS := $(wildcard tests/lib/*.c)
TESTLIB_OBJS = $(call obj,$(TESTLIB_SRCS))

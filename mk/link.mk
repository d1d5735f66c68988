# Libraries and binaries.
#   $(O)/lib/libpfcore.a    every core, HAL backend and generated object
#   $(O)/lib/libpegaflow.so the C client library (exports pf_client_*, pf_loadstate_*, pf_simkv_*)
#   $(O)/bin/<name>         from src/bin/<name>.c
CORE_OBJS := $(call obj,$(CORE_SRCS) $(GEN_SRCS) $(CU_SRCS))
CLIENT_OBJS := $(call obj,$(sort $(CLIENT_SRCS) $(GEN_SRCS)))
BINS := $(addprefix $(O)/bin/,$(BIN_NAMES))

$(LIBPFCORE): $(CORE_OBJS)
	@mkdir -p $(@D)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(LIBPFCLIENT): $(call obj,$(wildcard src/client/*.c))
	@mkdir -p $(@D)
	@rm -f $@ && ar rcs $@ $^

$(LIBPEGAFLOW): $(CLIENT_OBJS) src/client/libpegaflow.map
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) -shared -Wl,--version-script=src/client/libpegaflow.map -Wl,-soname,libpegaflow.so \
		$(LDFLAGS_ALL) -o $@ $(CLIENT_OBJS) $(PKG_LIBS) -lm -lrt

$(O)/bin/%: $(O)/obj/src/bin/%.o $(LIBPFCORE)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -o $@ $< $(LINK_EXTRA) $(LIBPFCORE) $(LIBS_ALL) $(CUDA_LIBS) $(if $(CU_SRCS),-lstdc++)

-include $(shell find $(O)/obj -name '*.d' 2>/dev/null)

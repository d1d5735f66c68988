# tests/gpu: programs of the GPU check (tests/gpu/run.sh); built only with the CUDA toolkit.
#   gpu_probe      is there a usable GPU? (cudart only)
#   gpu_hal_check  the cuda backend through the HAL, no server (libpfcore)
#   gpu_kv_check   save/load through pegaflow-server (libpfclient: the Engine client RPCs)
# test-build compiles all three and links the first two; run.sh links gpu_kv_check when it
# runs (make gpu-check-progs).
ifeq ($(HAVE_CUDA),1)
CUDA_CPPFLAGS_tests_gpu_ := $(CUDA_CPPFLAGS)
GPU_CHECK_BINS := $(O)/tests/gpu/gpu_probe $(O)/tests/gpu/gpu_hal_check $(O)/tests/gpu/gpu_kv_check

$(O)/tests/gpu/gpu_probe: $(O)/obj/tests/gpu/gpu_probe.o
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -o $@ $< $(CUDART_LIBS)

$(O)/tests/gpu/gpu_hal_check: $(O)/obj/tests/gpu/gpu_hal_check.o $(LIBPFCORE)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIBPFCORE) $(LIBS_ALL) $(CUDART_LIBS)

$(O)/tests/gpu/gpu_kv_check: $(O)/obj/tests/gpu/gpu_kv_check.o $(LIBPFCLIENT) $(LIBPFCORE)
	@mkdir -p $(@D)
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIBPFCLIENT) $(LIBPFCORE) $(LIBS_ALL) $(CUDART_LIBS)

.PHONY: gpu-check-progs
gpu-check-progs: $(GPU_CHECK_BINS)

test-build: $(GPU_CHECK_BINS)
endif

# The build directory of this variant (run.sh asks, so SAN=... finds its own objects).
.PHONY: gpu-check-builddir
gpu-check-builddir:
	@echo $(O)

# hw/cuda: compiled whenever ./configure found the CUDA toolkit (HAVE_CUDA=1). The backend
# links no CUDA library: the driver API is loaded at run time (cuda_drv.c), the copy kernel
# is embedded as PTX (below). The toolkit is needed only for its headers and nvcc/ptxas.
ifeq ($(HAVE_CUDA)$(wildcard hw/cuda/cuda.c),1hw/cuda/cuda.c)
CORE_SRCS += $(filter-out hw/cuda/cuda_absent.c,$(wildcard hw/cuda/*.c)) $(GEN)/cuda_kernel_ptx.c
CUDA_CPPFLAGS_hw_cuda_ := $(CUDA_CPPFLAGS)
# tests/unit/cuda: the backend's helpers and the backend itself against the fake driver
# library (tests/unit/cuda/fake_cuda.c, built as a shared object the backend dlopens
# exactly as it dlopens libcuda.so.1); without CUDA they skip.
CUDA_CPPFLAGS_tests_unit_cuda_ := $(CUDA_CPPFLAGS) -Ihw/cuda -DPF_TEST_HAVE_CUDA=1

# The copy kernel as PTX text: nvcc -ptx for compute_75, .version lowered from the
# toolkit's ISA (CUDA 13.0 writes 9.0, which only R580+ drivers JIT) to PF_CUDA_PTX_ISA
# 7.0 (CUDA 11.0: every R450+ driver), then ptxas must accept it for sm_75 and sm_90 (a
# PTX instruction newer than ISA 7.0 fails here, at build time, not on a cluster).
CUDA_PTX_ISA := 7.0
$(GEN)/cuda_kernel.ptx: hw/cuda/cuda_kernel.cu hw/cuda/cuda_internal.h
	@mkdir -p $(@D)
	@echo "  PTX     $<"
	@$(NVCC) -ptx -arch=compute_75 -std=c++17 -Isrc/include -Ihw/cuda $< -o $@.raw
	@sed -E 's/^\.version [0-9]+\.[0-9]+$$/.version $(CUDA_PTX_ISA)/' $@.raw > $@.tmp
	@grep -qx '.version $(CUDA_PTX_ISA)' $@.tmp || { echo "no .version line in $@.raw" >&2; exit 1; }
	@$(CUDA_HOME)/bin/ptxas --gpu-name sm_75 $@.tmp -o $@.sm75.cubin
	@$(CUDA_HOME)/bin/ptxas --gpu-name sm_90 $@.tmp -o $@.sm90.cubin
	@rm -f $@.raw $@.sm75.cubin $@.sm90.cubin
	@mv $@.tmp $@

$(GEN)/cuda_kernel_ptx.c: $(GEN)/cuda_kernel.ptx
	@echo "  EMBED   $<"
	@{ echo '/* generated from hw/cuda/cuda_kernel.cu by hw/cuda/module.mk; do not edit */'; \
	   echo 'extern const char pf_cuda_kernel_ptx[];'; \
	   echo 'const char pf_cuda_kernel_ptx[] = {'; \
	   od -An -v -tx1 $< | sed -E 's/ *([0-9a-f]{2})/0x\1,/g'; \
	   echo '0x00};'; } > $@.tmp && mv $@.tmp $@

# The fake driver library and the test that loads it.
FAKE_CUDA_SRCS := tests/unit/cuda/fake_cuda.c tests/unit/cuda/fake_cuda_copy.c
$(O)/tests/fakes/libpffakecuda.so: $(FAKE_CUDA_SRCS) tests/unit/cuda/fake_cuda.h \
		tests/unit/cuda/fake_cuda_int.h
	@mkdir -p $(@D)
	@echo "  SO      $@"
	@$(CC) $(CPPFLAGS_ALL) $(CUDA_CPPFLAGS) -Itests/unit/cuda $(CFLAGS_ALL) -MF /dev/null -shared \
		-o $@ $(FAKE_CUDA_SRCS) $(LDFLAGS_ALL) -ldl
$(O)/tests/unit/cuda/test_cuda $(O)/tests/unit/cuda/test_cuda_open: | \
	$(O)/tests/fakes/libpffakecuda.so
test-build: $(O)/tests/fakes/libpffakecuda.so
else
CORE_SRCS += hw/cuda/cuda_absent.c
endif

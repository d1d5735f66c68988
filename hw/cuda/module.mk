# hw/cuda: compiled whenever ./configure found the CUDA toolkit (HAVE_CUDA=1).
ifeq ($(HAVE_CUDA)$(wildcard hw/cuda/cuda.c),1hw/cuda/cuda.c)
CORE_SRCS += $(filter-out hw/cuda/cuda_absent.c,$(wildcard hw/cuda/*.c))
CU_SRCS += $(wildcard hw/cuda/*.cu)
CUDA_CPPFLAGS_hw_cuda_ := $(CUDA_CPPFLAGS)
# tests/unit/cuda: the backend's pure helpers (cuda_internal.h); without CUDA they skip.
CUDA_CPPFLAGS_tests_unit_cuda_ := $(CUDA_CPPFLAGS) -Ihw/cuda -DPF_TEST_HAVE_CUDA=1
# test_cuda drives the backend through a fake CUDA runtime: every call it makes is wrapped.
CUDA_WRAPPED := cudaGetDeviceCount cudaGetDeviceProperties cudaDeviceGetPCIBusId cudaSetDevice \
	cudaGetDriverEntryPointByVersion cudaIpcOpenMemHandle cudaIpcCloseMemHandle \
	cudaHostRegister cudaHostGetDevicePointer cudaHostUnregister cudaStreamCreateWithFlags \
	cudaStreamDestroy cudaEventCreateWithFlags cudaEventDestroy cudaEventRecord \
	cudaEventQuery cudaMalloc cudaFree cudaMemcpyAsync pf_cuda_kernel_launch
UNIT_LDFLAGS_cuda_test_cuda := $(foreach f,$(CUDA_WRAPPED),-Wl,--wrap=$(f))
else
CORE_SRCS += hw/cuda/cuda_absent.c
endif

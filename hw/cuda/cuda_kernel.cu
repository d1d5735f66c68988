/* TRANSFER_MODE_KERNEL copy kernel (compiled by nvcc to PTX only, never linked: the build
 * lowers the PTX's .version to PF_CUDA_PTX_ISA, checks it with ptxas for sm_75 and embeds
 * the text in the binary; cuda_copy.c loads it with cuModuleLoadData, so the driver JIT-
 * compiles it for the GPU it runs, and an older driver than the toolkit still accepts it).
 *
 * One launch copies a whole batch: the descriptor array (dst, src, len) lives in device
 * memory, thread block b handles descriptors b, b + gridDim.x, ... and its 256 threads
 * stride over the bytes. Host memory is reached through its device-mapped alias (pinned,
 * mapped registration), so the same kernel serves D2H and H2D. Each thread keeps four
 * 16-byte loads in flight before storing, which matters when one side is host memory
 * across PCIe. */
#include "cuda_internal.h"

namespace
{

__device__ void copy_vec16(uint4 *dst, const uint4 *src, uint64_t n)
{
    const uint64_t step = blockDim.x;
    uint64_t j = threadIdx.x;
    for (; j + 3 * step < n; j += 4 * step) {
        uint4 a = src[j];
        uint4 b = src[j + step];
        uint4 c = src[j + 2 * step];
        uint4 d = src[j + 3 * step];
        dst[j] = a;
        dst[j + step] = b;
        dst[j + 2 * step] = c;
        dst[j + 3 * step] = d;
    }
    for (; j < n; j += step)
        dst[j] = src[j];
}

__device__ void copy_vec4(uint32_t *dst, const uint32_t *src, uint64_t n)
{
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x)
        dst[j] = src[j];
}

__device__ void copy_bytes(uint8_t *dst, const uint8_t *src, uint64_t n)
{
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x)
        dst[j] = src[j];
}

} // namespace

extern "C" __global__ void __launch_bounds__(PF_CUDA_KERNEL_THREADS)
    pf_cuda_copy_kernel(const pf_cuda_kdesc *desc, uint64_t n)
{
    for (uint64_t i = blockIdx.x; i < n; i += gridDim.x) {
        uint8_t *dst = reinterpret_cast<uint8_t *>(desc[i].dst);
        const uint8_t *src = reinterpret_cast<const uint8_t *>(desc[i].src);
        uint64_t len = desc[i].len;
        uint64_t done = 0;
        uint64_t align = desc[i].dst | desc[i].src;
        if ((align & 15) == 0) {
            done = len & ~15ull;
            copy_vec16(reinterpret_cast<uint4 *>(dst), reinterpret_cast<const uint4 *>(src),
                       len >> 4);
        } else if ((align & 3) == 0) {
            done = len & ~3ull;
            copy_vec4(reinterpret_cast<uint32_t *>(dst), reinterpret_cast<const uint32_t *>(src),
                      len >> 2);
        }
        copy_bytes(dst + done, src + done, len - done);
    }
}


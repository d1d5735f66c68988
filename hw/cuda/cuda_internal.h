/* Private interfaces of the CUDA GPU backend (hw/cuda).
 *
 * The pure helpers (error translation, PCI/NUMA lookup, UUID formatting, range merging,
 * kernel descriptor building) need neither a GPU nor a driver and are unit-tested in
 * tests/unit/cuda/. This header is also included by the nvcc-built copy kernel
 * (cuda_kernel.cu), so it stays valid C++ and includes no core header that is not. */
#ifndef PF_HW_CUDA_INTERNAL_H
#define PF_HW_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <driver_types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ cuda_util.c */

/* Translates a CUDA runtime error to -errno (cudaSuccess -> 0). "No usable GPU" codes
 * (35 insufficient driver, 100 no device, 34 stub library, 46 devices unavailable, 101
 * invalid device, 802-804 system/driver not ready or mismatched) become -ENODEV; unknown
 * codes -EIO. Thread-safe, no side effects. */
int pf_cuda_errno(cudaError_t e);

/* True for the codes that mean "this machine has no usable GPU" (35, 100, 34, 46, 802,
 * 803, 804): open answers -ENODEV for them so "auto" falls back to sim. */
bool pf_cuda_no_gpu(cudaError_t e);

/* Normalises a PCI bus id as CUDA prints it ("0000:3B:00.0", "00000000:3b:00.0") to the
 * sysfs spelling "0000:3b:00.0". Returns 0, or -EINVAL when busid does not parse. */
int pf_cuda_busid_normalize(const char *busid, char *out, size_t outlen);

/* NUMA node of the PCI device busid read from <sysfs_root>/bus/pci/devices/<busid>/numa_node
 * (sysfs_root is "/sys" in production, a temporary tree in tests). Returns the node (>= 0),
 * or -1 when unknown (file missing, unparsable, or the kernel's -1). */
int pf_cuda_numa_node(const char *sysfs_root, const char *busid);

/* Formats a 16-byte UUID like nvidia-smi: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
 * (41 characters + NUL). Truncates to outlen. */
void pf_cuda_uuid_format(const uint8_t uuid[16], char *out, size_t outlen);

/* ------------------------------------------------------------------ cuda_merge.c */

/* One validated copy between a device range and a host range. host is the host address
 * (direct mode) or its device-mapped alias (kernel mode); the two ids name the device
 * allocation and the host registration the ranges lie in: merging never crosses either. */
struct pf_cuda_span {
    uint64_t dev;
    uint64_t host;
    uint64_t len;
    uint32_t dev_alloc;
    uint32_t host_alloc;
};

/* Merges, in place, spans adjacent on both sides: span i+1 joins the current run when
 * its dev and host addresses both continue the run, it lies in the same device
 * allocation and host registration, and the run stays <= max_len bytes (a single input
 * span longer than max_len is kept as is, never split). Zero-length spans are dropped.
 * Order is preserved. Returns the number of spans left (<= n). Pure. */
size_t pf_cuda_spans_merge(struct pf_cuda_span *s, size_t n, uint64_t max_len);

/* Kernel-mode descriptor: what the copy kernel reads from device memory. */
struct pf_cuda_kdesc {
    uint64_t dst;
    uint64_t src;
    uint64_t len;
};

/* Number of kernel descriptors pf_cuda_kdesc_build() writes for these spans: each span is
 * cut into pieces of at most chunk bytes (chunk > 0). Saturates at SIZE_MAX. */
size_t pf_cuda_kdesc_count(const struct pf_cuda_span *s, size_t n, uint64_t chunk);

/* Writes the kernel descriptors of n spans for direction d2h (1: dst = host alias, src =
 * dev; 0: the reverse) into out (room for pf_cuda_kdesc_count() entries). Pieces start at
 * multiples of chunk from the span start, so a 16-byte aligned span yields 16-byte aligned
 * pieces when chunk is a multiple of 16. Returns the number written. Pure. */
size_t pf_cuda_kdesc_build(const struct pf_cuda_span *s, size_t n, uint64_t chunk, int d2h,
                           struct pf_cuda_kdesc *out);

/* ------------------------------------------------------------------ cuda_kernel.cu */

#define PF_CUDA_KERNEL_THREADS  256
#define PF_CUDA_KERNEL_MAX_GRID 65535u
/* Piece size of kernel descriptors: several thread blocks share a long merged range. */
#define PF_CUDA_KERNEL_CHUNK (64u * 1024u)

/* Launches the copy kernel on stream st over n descriptors already in device memory
 * (dev_desc). One 256-thread block per descriptor, grid-strided (grid <= 65535); a 16-byte
 * vector path when dst and src are 16-byte aligned, 4-byte when 4-aligned, else bytes.
 * Returns the launch status (asynchronous errors surface at the next stream sync). */
cudaError_t pf_cuda_kernel_launch(const struct pf_cuda_kdesc *dev_desc, size_t n, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif

/* Private interfaces of the CUDA GPU backend (hw/cuda).
 *
 * The backend speaks the CUDA driver API only, through a table of entry points loaded at
 * run time (cuda_drv.c): dlopen("libcuda.so.1") and cuGetProcAddress with an explicit
 * CUDA version, so one binary built with any toolkit runs on every driver that provides
 * that version's ABI (R535 = CUDA 12.2 and newer). No CUDA library is linked.
 *
 * The pure helpers (error translation, PCI/NUMA lookup, UUID formatting, range merging,
 * kernel descriptor building, host chunking) need neither a GPU nor a driver and are
 * unit-tested in tests/unit/cuda/. This header is also included by the nvcc-built copy
 * kernel (cuda_kernel.cu, compiled to PTX), so it stays valid C++. */
#ifndef PF_HW_CUDA_INTERNAL_H
#define PF_HW_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ cuda_drv.c */

/* The CUDA version whose ABI every required entry point is requested at (cuGetProcAddress
 * "cudaVersion"): 12.0, so drivers of the R525+ branches resolve them all. */
#define PF_CU_API_VERSION 12000
/* cuMemcpyBatchAsync appeared in 12.8 (R570); requested at 12.8's ABI (with failIdx). */
#define PF_CU_BATCH_VERSION 12080

/* Driver entry points, each with the signature of the version named in its PFN type
 * (cudaTypedefs.h). batch is NULL when the driver predates 12.8. */
struct pf_cu {
    void *lib;          /* dlopen handle */
    int driver_version; /* cuDriverGetVersion: 1000 * major + 10 * minor */
    bool initialised;   /* cuInit succeeded: the library is never unloaded */
    PFN_cuInit_v2000 Init;
    PFN_cuDriverGetVersion_v2020 DriverGetVersion;
    PFN_cuGetErrorString_v6000 GetErrorString;
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuDeviceGetCount_v2000 DeviceGetCount;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDeviceGetName_v2000 DeviceGetName;
    PFN_cuDeviceGetUuid_v11040 DeviceGetUuid;
    PFN_cuDeviceTotalMem_v3020 DeviceTotalMem;
    PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
    PFN_cuDeviceGetPCIBusId_v4010 DeviceGetPCIBusId;
    PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain;
    PFN_cuDevicePrimaryCtxRelease_v11000 DevicePrimaryCtxRelease;
    PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
    PFN_cuIpcOpenMemHandle_v11000 IpcOpenMemHandle;
    PFN_cuIpcCloseMemHandle_v4010 IpcCloseMemHandle;
    PFN_cuMemGetAddressRange_v3020 MemGetAddressRange;
    PFN_cuMemHostRegister_v6050 MemHostRegister;
    PFN_cuMemHostUnregister_v4000 MemHostUnregister;
    PFN_cuMemHostGetDevicePointer_v3020 MemHostGetDevicePointer;
    PFN_cuMemAllocHost_v3020 MemAllocHost;
    PFN_cuMemFreeHost_v2000 MemFreeHost;
    PFN_cuMemAlloc_v3020 MemAlloc;
    PFN_cuMemFree_v3020 MemFree;
    PFN_cuStreamCreate_v2000 StreamCreate;
    PFN_cuStreamDestroy_v4000 StreamDestroy;
    PFN_cuEventCreate_v2000 EventCreate;
    PFN_cuEventDestroy_v4000 EventDestroy;
    PFN_cuEventRecord_v2000 EventRecord;
    PFN_cuEventQuery_v2000 EventQuery;
    PFN_cuMemcpyHtoDAsync_v3020 MemcpyHtoDAsync;
    PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
    PFN_cuModuleLoadData_v2000 ModuleLoadData;
    PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
    PFN_cuModuleUnload_v2000 ModuleUnload;
    PFN_cuLaunchKernel_v4000 LaunchKernel;
    PFN_cuMemcpyBatchAsync_v12080 MemcpyBatchAsync; /* optional */
};

/* Loads the driver library (path; NULL = "libcuda.so.1", or the test override) and
 * resolves every entry point at PF_CU_API_VERSION. Returns 0, or:
 *   -ENOENT  the library is not there (dlopen failed): no driver installed
 *   -ENOSYS  it lacks cuGetProcAddress (a driver older than CUDA 11.3) or an entry point
 *            at the requested version (a driver older than CUDA 12.0)
 * with a sentence in why. Does not call cuInit. pf_cu_unload() forgets the table and
 * closes the library unless cuInit succeeded on it (accepts a zeroed table). */
int pf_cu_load(const char *path, struct pf_cu *cu, char *why, size_t whylen);
void pf_cu_unload(struct pf_cu *cu);

/* Test hooks (tests/unit/cuda only; production never calls them): the driver library to
 * load instead of libcuda.so.1, and the directory whose nvidia0/nvidiactl nodes tell
 * "a GPU is installed" (default /dev). NULL restores the default. Not thread-safe: set
 * before pf_hal_gpu_open. */
void pf_cuda_test_set_driver(const char *path);
void pf_cuda_test_set_devdir(const char *dir);
/* Host registration chunk size (default PF_CUDA_REG_CHUNK); 0 restores the default. */
void pf_cuda_test_set_reg_chunk(uint64_t bytes);

/* ------------------------------------------------------------------ cuda_util.c */

/* Translates a CUDA driver error to -errno (CUDA_SUCCESS -> 0). "No usable GPU" codes
 * (100 no device, 34 stub library, 46 device unavailable, 101 invalid device, 802-804
 * system/driver not ready or mismatched) become -ENODEV; sticky
 * errors (pf_cuda_sticky) -ENOTRECOVERABLE; unknown codes -EIO. Pure. */
int pf_cuda_errno(CUresult e);

/* True for the codes that mean "CUDA cannot use this machine's GPUs" (100, 34, 46, 802,
 * 803, 804). The driver API has no code 35: the runtime's cudaErrorInsufficientDriver
 * shows up here as an entry point cuGetProcAddress cannot give at the requested version
 * (pf_cu_load: -ENOSYS) or, with a forward-compatibility package, as 803/804 from cuInit. */
bool pf_cuda_no_gpu(CUresult e);

/* True for the errors cuda.h documents as "This leaves the process in an inconsistent
 * state and any further CUDA work will return the same error. To continue using CUDA,
 * the process must be terminated and relaunched": 226 CONTAINED, 700 ILLEGAL_ADDRESS, 702
 * LAUNCH_TIMEOUT, 714-719 (HARDWARE_STACK_ERROR .. LAUNCH_FAILED), 911 EXTERNAL_DEVICE. */
bool pf_cuda_sticky(CUresult e);

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
 * allocation and the host registration chunk the ranges lie in: merging never crosses
 * either. */
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
/* Entry point of the copy kernel in the embedded PTX (extern "C", unmangled):
 * pf_cuda_copy_kernel(const struct pf_cuda_kdesc *desc, uint64_t n). */
#define PF_CUDA_KERNEL_NAME "pf_cuda_copy_kernel"

/* The copy kernel as PTX text (NUL-terminated), generated at build time from
 * cuda_kernel.cu with its .version lowered to PF_CUDA_PTX_ISA (see mk and docs/gpu.md):
 * cuModuleLoadData JIT-compiles it for whatever GPU the driver runs. */
extern const char pf_cuda_kernel_ptx[];
/* PTX ISA the embedded kernel declares: 7.0 (CUDA 11.0), understood by every driver
 * since R450; target sm_75 (Turing and newer). */
#define PF_CUDA_PTX_ISA "7.0"

/* ------------------------------------------------------------------ cuda_host.c */

/* Largest single cuMemHostRegister: 64 GiB. vLLM #51080: one registration of >= 512 GiB
 * fails; smaller chunks also register in parallel. */
#define PF_CUDA_REG_CHUNK (64ull << 30)

#ifdef __cplusplus
}
#endif

#endif

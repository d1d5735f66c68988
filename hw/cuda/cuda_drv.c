/* Run-time loading of the CUDA driver API (see cuda_internal.h).
 *
 * Why not the runtime: a statically linked CUDA 13 runtime refuses every driver older than
 * R580 (cudaGetDeviceCount answers 35, "driver version is insufficient for CUDA runtime
 * version"), while production clusters run R535-R570. The driver API has no such floor:
 * cuGetProcAddress(symbol, &fn, cudaVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) returns
 * the entry point with the ABI of cudaVersion (cuda.h, "cuGetProcAddress": "the CUDA
 * version ... to search for the symbol"; a symbol added or changed after the driver's own
 * version answers CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT). Requesting 12.0 gives the
 * same ABI on R525 and on R580, whatever toolkit built this file.
 *
 * cuGetProcAddress_v2 (with the status out-argument) exists since CUDA 12.0 drivers; the
 * v1 symbol (CUDA 11.3) is the fallback. Both are found with dlsym; every other entry
 * point through them. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

static const char *drv_override;

void pf_cuda_test_set_driver(const char *path)
{
    drv_override = path;
}

struct drv_sym {
    const char *name; /* base name, as cuGetProcAddress wants it (no _v2 suffix) */
    size_t off;
    int version;
    bool optional;
};

static const struct drv_sym drv_syms[] = {
    {"cuInit", offsetof(struct pf_cu, Init), PF_CU_API_VERSION, false},
    {"cuDriverGetVersion", offsetof(struct pf_cu, DriverGetVersion), PF_CU_API_VERSION, false},
    {"cuGetErrorString", offsetof(struct pf_cu, GetErrorString), PF_CU_API_VERSION, false},
    {"cuGetErrorName", offsetof(struct pf_cu, GetErrorName), PF_CU_API_VERSION, false},
    {"cuDeviceGetCount", offsetof(struct pf_cu, DeviceGetCount), PF_CU_API_VERSION, false},
    {"cuDeviceGet", offsetof(struct pf_cu, DeviceGet), PF_CU_API_VERSION, false},
    {"cuDeviceGetName", offsetof(struct pf_cu, DeviceGetName), PF_CU_API_VERSION, false},
    {"cuDeviceGetUuid", offsetof(struct pf_cu, DeviceGetUuid), PF_CU_API_VERSION, false},
    {"cuDeviceTotalMem", offsetof(struct pf_cu, DeviceTotalMem), PF_CU_API_VERSION, false},
    {"cuDeviceGetAttribute", offsetof(struct pf_cu, DeviceGetAttribute), PF_CU_API_VERSION, false},
    {"cuDeviceGetPCIBusId", offsetof(struct pf_cu, DeviceGetPCIBusId), PF_CU_API_VERSION, false},
    {"cuDevicePrimaryCtxRetain", offsetof(struct pf_cu, DevicePrimaryCtxRetain), PF_CU_API_VERSION,
     false},
    {"cuDevicePrimaryCtxRelease", offsetof(struct pf_cu, DevicePrimaryCtxRelease),
     PF_CU_API_VERSION, false},
    {"cuCtxSetCurrent", offsetof(struct pf_cu, CtxSetCurrent), PF_CU_API_VERSION, false},
    {"cuIpcOpenMemHandle", offsetof(struct pf_cu, IpcOpenMemHandle), PF_CU_API_VERSION, false},
    {"cuIpcCloseMemHandle", offsetof(struct pf_cu, IpcCloseMemHandle), PF_CU_API_VERSION, false},
    {"cuMemGetAddressRange", offsetof(struct pf_cu, MemGetAddressRange), PF_CU_API_VERSION, false},
    {"cuMemHostRegister", offsetof(struct pf_cu, MemHostRegister), PF_CU_API_VERSION, false},
    {"cuMemHostUnregister", offsetof(struct pf_cu, MemHostUnregister), PF_CU_API_VERSION, false},
    {"cuMemHostGetDevicePointer", offsetof(struct pf_cu, MemHostGetDevicePointer),
     PF_CU_API_VERSION, false},
    {"cuMemAllocHost", offsetof(struct pf_cu, MemAllocHost), PF_CU_API_VERSION, false},
    {"cuMemFreeHost", offsetof(struct pf_cu, MemFreeHost), PF_CU_API_VERSION, false},
    {"cuMemAlloc", offsetof(struct pf_cu, MemAlloc), PF_CU_API_VERSION, false},
    {"cuMemFree", offsetof(struct pf_cu, MemFree), PF_CU_API_VERSION, false},
    {"cuStreamCreate", offsetof(struct pf_cu, StreamCreate), PF_CU_API_VERSION, false},
    {"cuStreamDestroy", offsetof(struct pf_cu, StreamDestroy), PF_CU_API_VERSION, false},
    {"cuEventCreate", offsetof(struct pf_cu, EventCreate), PF_CU_API_VERSION, false},
    {"cuEventDestroy", offsetof(struct pf_cu, EventDestroy), PF_CU_API_VERSION, false},
    {"cuEventRecord", offsetof(struct pf_cu, EventRecord), PF_CU_API_VERSION, false},
    {"cuEventQuery", offsetof(struct pf_cu, EventQuery), PF_CU_API_VERSION, false},
    {"cuMemcpyHtoDAsync", offsetof(struct pf_cu, MemcpyHtoDAsync), PF_CU_API_VERSION, false},
    {"cuMemcpyDtoHAsync", offsetof(struct pf_cu, MemcpyDtoHAsync), PF_CU_API_VERSION, false},
    {"cuModuleLoadData", offsetof(struct pf_cu, ModuleLoadData), PF_CU_API_VERSION, false},
    {"cuModuleGetFunction", offsetof(struct pf_cu, ModuleGetFunction), PF_CU_API_VERSION, false},
    {"cuModuleUnload", offsetof(struct pf_cu, ModuleUnload), PF_CU_API_VERSION, false},
    {"cuLaunchKernel", offsetof(struct pf_cu, LaunchKernel), PF_CU_API_VERSION, false},
    {"cuMemcpyBatchAsync", offsetof(struct pf_cu, MemcpyBatchAsync), PF_CU_BATCH_VERSION, true},
};

void pf_cu_unload(struct pf_cu *cu)
{
    /* Only a library whose cuInit never ran is closed: an initialised libcuda keeps its own
     * threads and exit handlers, and unmapping it under them crashes at exit. Loading it
     * again (a later open) returns the same handle. */
    if (cu->lib && !cu->initialised)
        dlclose(cu->lib);
    memset(cu, 0, sizeof(*cu));
}

int pf_cu_load(const char *path, struct pf_cu *cu, char *why, size_t whylen)
{
    memset(cu, 0, sizeof(*cu));
    if (!path)
        path = drv_override ? drv_override : "libcuda.so.1";
    cu->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cu->lib) {
        const char *e = dlerror();
        snprintf(why, whylen, "cannot load the CUDA driver library %s: %s", path, e ? e : "?");
        return -ENOENT;
    }
    PFN_cuGetProcAddress_v12000 gpa2 =
        (PFN_cuGetProcAddress_v12000)(uintptr_t)dlsym(cu->lib, "cuGetProcAddress_v2");
    PFN_cuGetProcAddress_v11030 gpa1 =
        (PFN_cuGetProcAddress_v11030)(uintptr_t)dlsym(cu->lib, "cuGetProcAddress");
    if (!gpa2 && !gpa1) {
        snprintf(why, whylen,
                 "%s has no cuGetProcAddress: the NVIDIA driver is older than CUDA 11.3 "
                 "(R465); install R535 or newer",
                 path);
        goto err_close;
    }
    for (size_t i = 0; i < sizeof(drv_syms) / sizeof(drv_syms[0]); i++) {
        const struct drv_sym *s = &drv_syms[i];
        void *fn = NULL;
        CUresult r;
        CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
        if (gpa2)
            r = gpa2(s->name, &fn, s->version, CU_GET_PROC_ADDRESS_DEFAULT, &q);
        else
            r = gpa1(s->name, &fn, s->version, CU_GET_PROC_ADDRESS_DEFAULT);
        if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
            if (s->optional)
                continue;
            snprintf(why, whylen,
                     "the CUDA driver (%s) lacks %s at CUDA %d.%d (cuGetProcAddress: error %d, "
                     "status %d): the NVIDIA driver is older than this backend needs; install "
                     "R535 or newer",
                     path, s->name, s->version / 1000, s->version % 1000 / 10, (int)r, (int)q);
            goto err_close;
        }
        memcpy((char *)cu + s->off, &fn, sizeof(fn));
    }
    return 0;
err_close:
    pf_cu_unload(cu);
    return -ENOSYS;
}

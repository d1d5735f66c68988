/* A fake CUDA driver library for tests/unit/cuda/test_cuda (built as libpffakecuda.so and
 * loaded by hw/cuda through dlopen + cuGetProcAddress_v2, exactly like libcuda.so.1).
 *
 * It emulates GPUs in host memory: "device memory" is malloc'd, an IPC handle carries an
 * allocation index, registered host memory has a distinct device alias (FAKE_ALIAS_OFF),
 * and the copy kernel runs on the CPU from the descriptors in fake device memory. It is
 * as strict as the real driver where the backend could get something wrong. Each rule
 * cites its source: cuda.h of CUDA 13.0 (/usr/local/cuda/include/cuda.h, the doc comments
 * of the functions named) and the "API synchronization behavior" and "Stream
 * synchronization behavior" pages of the CUDA Driver API reference.
 *
 * - Work is asynchronous: copies, uploads and launches are queued on their stream and run
 *   when an event recorded after them is queried (cuEventQuery: "Returns CUDA_SUCCESS if
 *   all captured work has been completed"), so reusing a source buffer before the copy ran
 *   shows up as wrong bytes. Exception, as documented ("API synchronization behavior"):
 *   an async copy from pageable host memory is staged immediately (counted in pageable).
 * - Sticky errors (cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS 700, CUDA_ERROR_LAUNCH_FAILED 719:
 *   "This leaves the process in an inconsistent state and any further CUDA work will
 *   return the same error"): once raised, every call answers it until the library is
 *   reset (process exit).
 * - Registration cap: vLLM #51080 (R580+: a single cudaHostRegister of >= 512 GiB fails
 *   with code 2, out of memory, whatever memory is free); reg_cap models it.
 * - Old drivers: cuGetProcAddress ("If the specified CUDA version is greater than the
 *   driver version, the API will return CUDA_ERROR_INVALID_VALUE"; a symbol newer than the
 *   requested version: CUDA_SUCCESS, pfn NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
 *   unknown: CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND); cuModuleLoadData refuses PTX of a
 *   newer ISA than the driver knows (CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222, cuda.h: "the
 *   PTX was compiled with an unsupported toolchain").
 * - Exclusive-process mode (cuda.h, CUDA_ERROR_DEVICE_UNAVAILABLE 46: "Devices are often
 *   unavailable due to use of CU_COMPUTEMODE_EXCLUSIVE_PROCESS or
 *   CU_COMPUTEMODE_PROHIBITED"): cuDevicePrimaryCtxRetain fails when another process holds
 *   the device.
 * - Every call but cuInit/cuDriverGetVersion/cuGetErrorString before cuInit answers
 *   CUDA_ERROR_NOT_INITIALIZED (cuda.h, cuInit: "must be called before any other function
 *   from the driver API"); calls needing a context answer CUDA_ERROR_INVALID_CONTEXT
 *   without one; a stream of another context: CUDA_ERROR_INVALID_HANDLE.
 * - cuMemcpyBatchAsync (cuda.h): "the first entry in attrsIdxs must always be 0",
 *   "numAttrs must be lesser than or equal to count", each copy needs a valid
 *   srcAccessOrder, else CUDA_ERROR_INVALID_VALUE; the 12.8 ABI has failIdx, 13.0 not.
 * Copy calls, uploads, launches and registrations are counted. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cudaTypedefs.h>

#include "fake_cuda_int.h"

#define FAKE_MAX_DBUFS 64

pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reg_cv = PTHREAD_COND_INITIALIZER;
struct fake_cu fk;
bool inited;
static int ctx_obj[FAKE_MAX_DEVS];
static int ctx_refs[FAKE_MAX_DEVS];
__thread int cur = -1; /* device of the current context of this thread */
static struct {
    uint8_t *p;
    size_t len;
    bool host; /* cuMemAllocHost (pinned) rather than cuMemAlloc */
} dbufs[FAKE_MAX_DBUFS];
/* live streams and events, freed by fake_cu_reset when a dead backend left them */
#define FAKE_MAX_LIVE 512
static void *live[FAKE_MAX_LIVE];
int fn_obj;     /* the copy kernel's CUfunction */
int module_obj; /* CUmodule */

struct fake_cu *fake_cu_state(void)
{
    return &fk;
}

void fake_cu_uuid(int dev, uint8_t u[16])
{
    memset(u, 0, 16);
    memcpy(u, "fakegpu", 7);
    u[15] = (uint8_t)(0xa0 + dev);
}

void fake_cu_reset(int ndev)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < fk.nallocs; i++)
        free(fk.allocs[i].p);
    for (int i = 0; i < FAKE_MAX_DBUFS; i++) {
        free(dbufs[i].p);
        dbufs[i].p = NULL;
    }
    for (int i = 0; i < FAKE_MAX_LIVE; i++) {
        if (live[i] && *(int *)live[i] == 1) /* a stream: its queue too */
            free(((struct fstream *)live[i])->ops);
        free(live[i]);
        live[i] = NULL;
    }
    memset(&fk, 0, sizeof(fk));
    memset(ctx_refs, 0, sizeof(ctx_refs));
    inited = false;
    fk.ndev = ndev;
    fk.driver_version = 12020; /* R535 */
    fk.ptx_isa_max = 82;       /* CUDA 12.2 drivers JIT PTX ISA <= 8.2 */
    fk.last_copy_dev = -1;
    pthread_mutex_unlock(&mu);
}

int fake_cu_export(int dev, size_t size, CUipcMemHandle *h)
{
    pthread_mutex_lock(&mu);
    int i = fk.nallocs++;
    struct fake_alloc *a = &fk.allocs[i];
    a->p = aligned_alloc(256, (size + 255) & ~(size_t)255);
    a->size = size;
    a->dev = dev;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, "FAKEIPC", 7);
    h->reserved[8] = (char)i;
    pthread_mutex_unlock(&mu);
    return i;
}

bool is_sticky(CUresult e)
{
    return e == CUDA_ERROR_ILLEGAL_ADDRESS || e == CUDA_ERROR_LAUNCH_FAILED ||
           e == CUDA_ERROR_MISALIGNED_ADDRESS || e == CUDA_ERROR_HARDWARE_STACK_ERROR;
}

/* The answer every call gives before doing anything: sticky, not initialised. */
CUresult gate(bool need_ctx)
{
    if (fk.sticky)
        return fk.sticky;
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (need_ctx && cur < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory lookup */

int find_reg(uint64_t a, uint64_t len, bool alias)
{
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        uint64_t b = (uint64_t)(uintptr_t)fk.regs[i].p + (alias ? FAKE_ALIAS_OFF : 0);
        if (fk.regs[i].p && a >= b && len <= fk.regs[i].len && a - b <= fk.regs[i].len - len)
            return i;
    }
    return -1;
}

bool is_kv_dev(uint64_t a, uint64_t len)
{
    for (int i = 0; i < fk.nallocs; i++) {
        uint64_t b = (uint64_t)(uintptr_t)fk.allocs[i].p;
        if (fk.allocs[i].opened && a >= b && len <= fk.allocs[i].size &&
            a - b <= fk.allocs[i].size - len)
            return true;
    }
    return false;
}

int find_dbuf(uint64_t a, uint64_t len, bool host)
{
    for (int i = 0; i < FAKE_MAX_DBUFS; i++) {
        uint64_t b = (uint64_t)(uintptr_t)dbufs[i].p;
        if (dbufs[i].p && dbufs[i].host == host && a >= b && len <= dbufs[i].len &&
            a - b <= dbufs[i].len - len)
            return i;
    }
    return -1;
}

bool is_pinned(uint64_t a, uint64_t len)
{
    return find_reg(a, len, false) >= 0 || find_dbuf(a, len, true) >= 0;
}

/* ------------------------------------------------------------------ streams */

void push(struct fstream *s, struct op o)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->ops = realloc(s->ops, s->cap * sizeof(*s->ops));
        if (!s->ops)
            abort();
    }
    s->ops[s->n++] = o;
}

/* Runs the copy kernel on the CPU: one side of each descriptor must be KV device memory,
 * the other the device alias of registered host memory; anything else is an illegal
 * address, as on the GPU (sticky). */
static void run_kernel(uint64_t descp, uint64_t n)
{
    const struct {
        uint64_t dst, src, len;
    } *d = (const void *)(uintptr_t)descp;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t dst = d[i].dst, src = d[i].src, len = d[i].len;
        if (find_reg(dst, len, true) >= 0 && is_kv_dev(src, len)) {
            dst -= FAKE_ALIAS_OFF;
        } else if (find_reg(src, len, true) >= 0 && is_kv_dev(dst, len)) {
            src -= FAKE_ALIAS_OFF;
        } else {
            fk.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
            return;
        }
        memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, len);
        fk.copied += len;
    }
}

void run_until(struct fstream *s, size_t pos)
{
    for (; s->done < pos && !fk.sticky; s->done++) {
        struct op *o = &s->ops[s->done];
        if (o->kind == OP_COPY)
            memcpy((void *)(uintptr_t)o->dst, (const void *)(uintptr_t)o->src, o->len);
        else if (o->kind == OP_KERNEL)
            run_kernel(o->src, o->len);
    }
}

CUresult stream_ok(CUstream st)
{
    struct fstream *s = (struct fstream *)st;
    if (!s) /* the backend never uses the legacy NULL stream */
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->dev != cur)
        return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS;
}

void live_add(void *p)
{
    for (int i = 0; i < FAKE_MAX_LIVE; i++) {
        if (!live[i]) {
            live[i] = p;
            return;
        }
    }
    abort(); /* a test leaking hundreds of streams */
}

void live_del(void *p)
{
    for (int i = 0; i < FAKE_MAX_LIVE; i++)
        if (live[i] == p)
            live[i] = NULL;
}

/* ------------------------------------------------------------------ init, devices */

static CUresult f_Init(unsigned flags)
{
    pthread_mutex_lock(&mu);
    if (flags != 0)
        RET(CUDA_ERROR_INVALID_VALUE);
    if (fk.init_err)
        RET(fk.init_err);
    inited = true;
    RET(CUDA_SUCCESS);
}

static CUresult f_DriverGetVersion(int *v)
{
    *v = fk.driver_version;
    return CUDA_SUCCESS;
}

static CUresult f_GetErrorString(CUresult e, const char **s)
{
    switch (e) { /* the strings of the real driver */
    case CUDA_ERROR_INVALID_VALUE:
        *s = "invalid argument";
        break;
    case CUDA_ERROR_OUT_OF_MEMORY:
        *s = "out of memory";
        break;
    case CUDA_ERROR_NOT_INITIALIZED:
        *s = "initialization error";
        break;
    case CUDA_ERROR_NO_DEVICE:
        *s = "no CUDA-capable device is detected";
        break;
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
        *s = "CUDA-capable device(s) is/are busy or unavailable";
        break;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
        *s = "the provided PTX was compiled with an unsupported toolchain.";
        break;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        *s = "an illegal memory access was encountered";
        break;
    case CUDA_ERROR_LAUNCH_FAILED:
        *s = "unspecified launch failure";
        break;
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        *s = "system has unsupported display driver / cuda driver combination";
        break;
    case CUDA_ERROR_MAP_FAILED:
        *s = "mapping of buffer object failed";
        break;
    default:
        *s = "fake CUDA error";
        break;
    }
    return CUDA_SUCCESS;
}

static CUresult f_GetErrorName(CUresult e, const char **s)
{
    *s = "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

static CUresult f_DeviceGetCount(int *n)
{
    GATE(false);
    *n = fk.ndev;
    RET(CUDA_SUCCESS);
}

static CUresult f_DeviceGet(CUdevice *d, int ord)
{
    GATE(false);
    if (ord < 0 || ord >= fk.ndev)
        RET(CUDA_ERROR_INVALID_DEVICE);
    *d = ord;
    RET(CUDA_SUCCESS);
}

static CUresult f_DeviceGetName(char *name, int len, CUdevice d)
{
    GATE(false);
    if (d < 0 || d >= fk.ndev)
        RET(CUDA_ERROR_INVALID_DEVICE);
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    RET(CUDA_SUCCESS);
}

static CUresult f_DeviceGetUuid(CUuuid *u, CUdevice d)
{
    GATE(false);
    if (d < 0 || d >= fk.ndev)
        RET(CUDA_ERROR_INVALID_DEVICE);
    fake_cu_uuid(d, (uint8_t *)u->bytes);
    RET(CUDA_SUCCESS);
}

static CUresult f_DeviceTotalMem(size_t *b, CUdevice d)
{
    GATE(false);
    if (d < 0 || d >= fk.ndev)
        RET(CUDA_ERROR_INVALID_DEVICE);
    *b = (size_t)(80 + d) << 30;
    RET(CUDA_SUCCESS);
}

static CUresult f_DeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    GATE(false);
    if (d < 0 || d >= fk.ndev)
        RET(CUDA_ERROR_INVALID_DEVICE);
    if (a == CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)
        *v = 1;
    else if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)
        *v = fk.compute_mode[d];
    else
        RET(CUDA_ERROR_INVALID_VALUE); /* the backend asks for nothing else */
    RET(CUDA_SUCCESS);
}

static CUresult f_DeviceGetPCIBusId(char *b, int len, CUdevice d)
{
    GATE(false);
    if (d < 0 || d >= fk.ndev)
        RET(CUDA_ERROR_INVALID_DEVICE);
    snprintf(b, (size_t)len, "0000:%02X:00.0", 0x3b + d);
    RET(CUDA_SUCCESS);
}

static CUresult f_DevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    GATE(false);
    if (d < 0 || d >= fk.ndev)
        RET(CUDA_ERROR_INVALID_DEVICE);
    if ((fk.compute_mode[d] == CU_COMPUTEMODE_EXCLUSIVE_PROCESS && fk.held_elsewhere[d]) ||
        fk.compute_mode[d] == CU_COMPUTEMODE_PROHIBITED)
        RET(CUDA_ERROR_DEVICE_UNAVAILABLE);
    ctx_refs[d]++;
    fk.contexts++;
    *c = (CUcontext)&ctx_obj[d];
    RET(CUDA_SUCCESS);
}

static CUresult f_DevicePrimaryCtxRelease(CUdevice d)
{
    GATE(false);
    if (d < 0 || d >= fk.ndev || ctx_refs[d] == 0)
        RET(CUDA_ERROR_INVALID_CONTEXT);
    ctx_refs[d]--;
    fk.contexts--;
    RET(CUDA_SUCCESS);
}

static CUresult f_CtxSetCurrent(CUcontext c)
{
    GATE(false);
    if (!c) {
        cur = -1;
        RET(CUDA_SUCCESS);
    }
    int d = (int)((int *)c - ctx_obj);
    if (d < 0 || d >= fk.ndev || ctx_refs[d] == 0)
        RET(CUDA_ERROR_INVALID_CONTEXT);
    cur = d;
    RET(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ IPC */

static CUresult f_IpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned flags)
{
    GATE(true);
    if (fk.ipc_open_err)
        RET(fk.ipc_open_err);
    if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        RET(CUDA_ERROR_INVALID_VALUE);
    int i = (unsigned char)h.reserved[8];
    if (memcmp(h.reserved, "FAKEIPC", 7) != 0 || i >= fk.nallocs)
        RET(CUDA_ERROR_INVALID_VALUE);
    if (fk.allocs[i].dev != cur)
        RET(CUDA_ERROR_INVALID_DEVICE);
    if (fk.allocs[i].opened) /* cuda.h: a handle opens once per context */
        RET(CUDA_ERROR_ALREADY_MAPPED);
    fk.allocs[i].opened++;
    fk.ipc_opens++;
    *p = (CUdeviceptr)(uintptr_t)fk.allocs[i].p;
    RET(CUDA_SUCCESS);
}

static CUresult f_IpcCloseMemHandle(CUdeviceptr p)
{
    GATE(true);
    for (int i = 0; i < fk.nallocs; i++) {
        if ((CUdeviceptr)(uintptr_t)fk.allocs[i].p == p && fk.allocs[i].opened) {
            fk.allocs[i].opened--;
            fk.ipc_closes++;
            RET(CUDA_SUCCESS);
        }
    }
    RET(CUDA_ERROR_INVALID_VALUE);
}

static CUresult f_MemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    GATE(true);
    if (fk.no_addr_range)
        RET(CUDA_ERROR_NOT_FOUND);
    for (int i = 0; i < fk.nallocs; i++) {
        CUdeviceptr b = (CUdeviceptr)(uintptr_t)fk.allocs[i].p;
        if (fk.allocs[i].opened && p >= b && p < b + fk.allocs[i].size) {
            *base = b;
            *size = fk.allocs[i].size;
            RET(CUDA_SUCCESS);
        }
    }
    RET(CUDA_ERROR_NOT_FOUND);
}

/* ------------------------------------------------------------------ host memory */

static CUresult f_MemHostRegister(void *p, size_t len, unsigned flags)
{
    GATE(true);
    if (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                            CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY))
        RET(CUDA_ERROR_INVALID_VALUE);
    if (flags != (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP))
        RET(CUDA_ERROR_INVALID_VALUE); /* the backend needs both: every context, an alias */
    if (!p || len == 0)
        RET(CUDA_ERROR_INVALID_VALUE);
    fk.registers++;
    if (len > fk.max_reg_len)
        fk.max_reg_len = len;
    if (fk.reg_cap && len >= fk.reg_cap) /* vLLM #51080 */
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    /* several registrations at once: wait (bounded) for a second registering thread, so a
     * backend that registers serially shows max_reg_threads == 1 */
    fk.reg_threads_now++;
    if (fk.reg_threads_now > fk.max_reg_threads)
        fk.max_reg_threads = fk.reg_threads_now;
    pthread_cond_broadcast(&reg_cv);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 200 * 1000 * 1000;
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    while (fk.max_reg_threads < 2 && pthread_cond_timedwait(&reg_cv, &mu, &dl) == 0)
        ;
    fk.reg_threads_now--;
    uint8_t *a = p;
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        uint8_t *b = fk.regs[i].p;
        if (b && a < b + fk.regs[i].len && b < a + len)
            RET(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        if (!fk.regs[i].p) {
            fk.regs[i].p = p;
            fk.regs[i].len = len;
            RET(CUDA_SUCCESS);
        }
    }
    RET(CUDA_ERROR_OUT_OF_MEMORY);
}

static CUresult f_MemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags)
{
    GATE(true);
    if (flags != 0)
        RET(CUDA_ERROR_INVALID_VALUE);
    int i = find_reg((uint64_t)(uintptr_t)p, 1, false);
    if (i < 0)
        RET(CUDA_ERROR_INVALID_VALUE);
    *d = (CUdeviceptr)((uintptr_t)p + FAKE_ALIAS_OFF);
    RET(CUDA_SUCCESS);
}

static CUresult f_MemHostUnregister(void *p)
{
    GATE(true);
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        if (fk.regs[i].p == p) { /* cuda.h: p must be the registered base address */
            fk.regs[i].p = NULL;
            RET(CUDA_SUCCESS);
        }
    }
    RET(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

static CUresult dbuf_alloc(void **p, size_t len, bool host)
{
    for (int i = 0; i < FAKE_MAX_DBUFS; i++) {
        if (!dbufs[i].p) {
            dbufs[i].p = calloc(1, len);
            if (!dbufs[i].p)
                return CUDA_ERROR_OUT_OF_MEMORY;
            dbufs[i].len = len;
            dbufs[i].host = host;
            *p = dbufs[i].p;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult dbuf_free(void *p, bool host)
{
    for (int i = 0; i < FAKE_MAX_DBUFS; i++) {
        if (dbufs[i].p && dbufs[i].p == p && dbufs[i].host == host) {
            free(dbufs[i].p);
            dbufs[i].p = NULL;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult f_MemAllocHost(void **p, size_t len)
{
    GATE(true);
    fk.host_allocs++;
    RET(dbuf_alloc(p, len, true));
}

static CUresult f_MemFreeHost(void *p)
{
    GATE(true);
    fk.host_frees++;
    RET(dbuf_free(p, true));
}

static CUresult f_MemAlloc(CUdeviceptr *d, size_t len)
{
    GATE(true);
    void *p = NULL;
    CUresult e = dbuf_alloc(&p, len, false);
    if (e == CUDA_SUCCESS) {
        fk.mallocs++;
        *d = (CUdeviceptr)(uintptr_t)p;
    }
    RET(e);
}

static CUresult f_MemFree(CUdeviceptr d)
{
    GATE(true);
    fk.frees++;
    RET(dbuf_free((void *)(uintptr_t)d, false));
}

/* ------------------------------------------------------------------ cuGetProcAddress */

static const struct {
    const char *name;
    int since; /* CUDA version of this ABI (cudaTypedefs.h PFN_<name>_v<since>) */
    void *fn;
} procs[] = {
    {"cuInit", 2000, (void *)f_Init},
    {"cuDriverGetVersion", 2020, (void *)f_DriverGetVersion},
    {"cuGetErrorString", 6000, (void *)f_GetErrorString},
    {"cuGetErrorName", 6000, (void *)f_GetErrorName},
    {"cuDeviceGetCount", 2000, (void *)f_DeviceGetCount},
    {"cuDeviceGet", 2000, (void *)f_DeviceGet},
    {"cuDeviceGetName", 2000, (void *)f_DeviceGetName},
    {"cuDeviceGetUuid", 11040, (void *)f_DeviceGetUuid},
    {"cuDeviceTotalMem", 3020, (void *)f_DeviceTotalMem},
    {"cuDeviceGetAttribute", 2000, (void *)f_DeviceGetAttribute},
    {"cuDeviceGetPCIBusId", 4010, (void *)f_DeviceGetPCIBusId},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)f_DevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 11000, (void *)f_DevicePrimaryCtxRelease},
    {"cuCtxSetCurrent", 4000, (void *)f_CtxSetCurrent},
    {"cuIpcOpenMemHandle", 11000, (void *)f_IpcOpenMemHandle},
    {"cuIpcCloseMemHandle", 4010, (void *)f_IpcCloseMemHandle},
    {"cuMemGetAddressRange", 3020, (void *)f_MemGetAddressRange},
    {"cuMemHostRegister", 6050, (void *)f_MemHostRegister},
    {"cuMemHostUnregister", 4000, (void *)f_MemHostUnregister},
    {"cuMemHostGetDevicePointer", 3020, (void *)f_MemHostGetDevicePointer},
    {"cuMemAllocHost", 3020, (void *)f_MemAllocHost},
    {"cuMemFreeHost", 2000, (void *)f_MemFreeHost},
    {"cuMemAlloc", 3020, (void *)f_MemAlloc},
    {"cuMemFree", 3020, (void *)f_MemFree},
    {"cuStreamCreate", 2000, (void *)f_StreamCreate},
    {"cuStreamDestroy", 4000, (void *)f_StreamDestroy},
    {"cuEventCreate", 2000, (void *)f_EventCreate},
    {"cuEventDestroy", 4000, (void *)f_EventDestroy},
    {"cuEventRecord", 2000, (void *)f_EventRecord},
    {"cuEventQuery", 2000, (void *)f_EventQuery},
    {"cuMemcpyHtoDAsync", 3020, (void *)f_MemcpyHtoDAsync},
    {"cuMemcpyDtoHAsync", 3020, (void *)f_MemcpyDtoHAsync},
    {"cuModuleLoadData", 2000, (void *)f_ModuleLoadData},
    {"cuModuleGetFunction", 2000, (void *)f_ModuleGetFunction},
    {"cuModuleUnload", 2000, (void *)f_ModuleUnload},
    {"cuLaunchKernel", 4000, (void *)f_LaunchKernel},
    /* two ABIs: 12.8 with failIdx, 13.0 without (cuda.h cuMemcpyBatchAsync_v2) */
    {"cuMemcpyBatchAsync", 12080, (void *)f_MemcpyBatchAsync_v12080},
    {"cuMemcpyBatchAsync", 13000, (void *)f_MemcpyBatchAsync_v13000},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (version > fk.driver_version) /* cuda.h: newer than the driver: invalid value */
        return CUDA_ERROR_INVALID_VALUE;
    bool known = false;
    int best = -1;
    for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
        if (strcmp(procs[i].name, symbol) != 0 || procs[i].since > fk.driver_version)
            continue; /* a driver does not know symbols newer than itself */
        known = true;
        if (procs[i].since <= version && (best < 0 || procs[i].since > procs[best].since))
            best = (int)i;
    }
    if (status)
        *status = best >= 0 ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known   ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (best >= 0)
        *pfn = procs[best].fn;
    return CUDA_SUCCESS;
}

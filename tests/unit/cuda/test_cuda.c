/* The CUDA GPU backend (hw/cuda/cuda.c).
 *
 * Real runtime, through the HAL registry: without a usable GPU (no driver: CUDA error 35,
 * or no device: 100) opening "cuda" must answer -ENODEV with a log line saying why, and
 * "auto" must fall back to "sim" and say so. On a machine with a GPU the same tests check
 * instead that "cuda" opens, reports sane device info and rejects bad input.
 *
 * Fake runtime: the binary is linked with -Wl,--wrap for every CUDA call the backend makes
 * (UNIT_LDFLAGS_cuda_test_cuda in hw/cuda/module.mk). With fake_on the wrappers emulate a
 * two-GPU machine in host memory (device memory is malloc'd, IPC handles carry an
 * allocation index, the copy kernel is emulated on the CPU from the uploaded descriptor
 * array, registered host memory has a distinct "device alias"), so the backend's logic runs
 * without a GPU: discovery and --devices, UUID lookup, shared refcounted IPC allocations,
 * validation (-EFAULT before anything is enqueued), merging, both transfer modes byte-exact,
 * the grow-only scratch, event polling with -ETIMEDOUT, async errors, logging once per
 * call site, and close releasing leftovers. With fake_on false they call the real runtime. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef PF_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "pf/hal.h"
#include "pf/log.h"
#include <cuda.h>
#include <stdbool.h>

#include "cuda_internal.h"

/* ------------------------------------------------------------------ fake CUDA runtime */

#define FAKE_MAX_DEVS   4
#define FAKE_MAX_ALLOCS 16
#define FAKE_MAX_REGS   8
#define FAKE_ALIAS_OFF  (1ull << 46) /* device alias of registered host memory */

struct fake_alloc {
    uint8_t *p;
    size_t size;
    int dev;
    int opened; /* cudaIpcOpenMemHandle count not yet closed */
};

static struct fake {
    bool on;
    cudaError_t count_err;
    int ndev;
    int cur;
    struct fake_alloc allocs[FAKE_MAX_ALLOCS];
    int nallocs;
    struct {
        uint8_t *p;
        size_t len;
    } regs[FAKE_MAX_REGS];
    int not_ready;          /* cudaEventQuery answers NotReady this many times */
    cudaError_t async_err;  /* returned once by the next cudaEventQuery */
    cudaError_t memcpy_err; /* returned by every cudaMemcpyAsync while set */
    cudaError_t ipc_open_err;
    bool no_addr_range;
    /* counters */
    int ipc_opens, ipc_closes, memcpys, uploads, launches, mallocs, frees, streams, events;
    size_t last_launch_n;
    uint64_t copied;
} fk;

static void fake_reset(void)
{
    for (int i = 0; i < fk.nallocs; i++)
        free(fk.allocs[i].p);
    memset(&fk, 0, sizeof(fk));
}

static int fake_find_reg(uint64_t a, uint64_t len, bool alias)
{
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        uint64_t b = (uint64_t)(uintptr_t)fk.regs[i].p + (alias ? FAKE_ALIAS_OFF : 0);
        if (fk.regs[i].p && a >= b && a - b + len <= fk.regs[i].len)
            return i;
    }
    return -1;
}

static bool fake_is_dev(const void *p, size_t len)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    for (int i = 0; i < fk.nallocs; i++) {
        uint64_t b = (uint64_t)(uintptr_t)fk.allocs[i].p;
        if (fk.allocs[i].opened && a >= b && a - b + len <= fk.allocs[i].size)
            return true;
    }
    return false;
}

/* Exports a device allocation of size bytes on fake device dev; returns its index. */
static int fake_export(int dev, size_t size, cudaIpcMemHandle_t *h)
{
    assert_true(fk.nallocs < FAKE_MAX_ALLOCS);
    struct fake_alloc *a = &fk.allocs[fk.nallocs];
    a->p = aligned_alloc(256, size);
    assert_non_null(a->p);
    a->size = size;
    a->dev = dev;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, "FAKEIPC", 7);
    h->reserved[8] = (char)fk.nallocs;
    return fk.nallocs++;
}

static void fake_uuid(int dev, uint8_t u[16])
{
    memset(u, 0, 16);
    memcpy(u, "fakegpu", 7);
    u[15] = (uint8_t)(0xa0 + dev);
}

cudaError_t __real_cudaGetDeviceCount(int *n);
cudaError_t __wrap_cudaGetDeviceCount(int *n);
cudaError_t __wrap_cudaGetDeviceCount(int *n)
{
    if (!fk.on)
        return __real_cudaGetDeviceCount(n);
    if (fk.count_err)
        return fk.count_err;
    *n = fk.ndev;
    return cudaSuccess;
}

cudaError_t __real_cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t __wrap_cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t __wrap_cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
    if (!fk.on)
        return __real_cudaGetDeviceProperties(p, dev);
    if (dev < 0 || dev >= fk.ndev)
        return cudaErrorInvalidDevice;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "Fake GPU %d", dev);
    fake_uuid(dev, (uint8_t *)p->uuid.bytes);
    p->totalGlobalMem = (size_t)(80 + dev) << 30;
    p->canMapHostMemory = 1;
    return cudaSuccess;
}

cudaError_t __real_cudaDeviceGetPCIBusId(char *b, int len, int dev);
cudaError_t __wrap_cudaDeviceGetPCIBusId(char *b, int len, int dev);
cudaError_t __wrap_cudaDeviceGetPCIBusId(char *b, int len, int dev)
{
    if (!fk.on)
        return __real_cudaDeviceGetPCIBusId(b, len, dev);
    snprintf(b, (size_t)len, "0000:%02X:00.0", 0x3b + dev);
    return cudaSuccess;
}

cudaError_t __real_cudaSetDevice(int dev);
cudaError_t __wrap_cudaSetDevice(int dev);
cudaError_t __wrap_cudaSetDevice(int dev)
{
    if (!fk.on)
        return __real_cudaSetDevice(dev);
    if (dev < 0 || dev >= fk.ndev)
        return cudaErrorInvalidDevice;
    fk.cur = dev;
    return cudaSuccess;
}

static CUresult fake_addr_range(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    for (int i = 0; i < fk.nallocs; i++) {
        CUdeviceptr b = (CUdeviceptr)(uintptr_t)fk.allocs[i].p;
        if (p >= b && p < b + fk.allocs[i].size) {
            *base = b;
            *size = fk.allocs[i].size;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

cudaError_t __real_cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned v,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *q);
cudaError_t __wrap_cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned v,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *q);
cudaError_t __wrap_cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned v,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *q)
{
    if (!fk.on)
        return __real_cudaGetDriverEntryPointByVersion(sym, fn, v, flags, q);
    if (fk.no_addr_range || strcmp(sym, "cuMemGetAddressRange") != 0) {
        *q = cudaDriverEntryPointSymbolNotFound;
        return cudaErrorSymbolNotFound;
    }
    *fn = (void *)fake_addr_range;
    *q = cudaDriverEntryPointSuccess;
    return cudaSuccess;
}

cudaError_t __real_cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t __wrap_cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t __wrap_cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags)
{
    if (!fk.on)
        return __real_cudaIpcOpenMemHandle(p, h, flags);
    if (fk.ipc_open_err)
        return fk.ipc_open_err;
    int i = (unsigned char)h.reserved[8];
    if (memcmp(h.reserved, "FAKEIPC", 7) != 0 || i >= fk.nallocs)
        return cudaErrorInvalidValue;
    if (fk.allocs[i].dev != fk.cur)
        return cudaErrorInvalidDevice;
    if (fk.allocs[i].opened) /* like CUDA: one open per handle per context */
        return cudaErrorAlreadyMapped;
    fk.allocs[i].opened++;
    fk.ipc_opens++;
    *p = fk.allocs[i].p;
    return cudaSuccess;
}

cudaError_t __real_cudaIpcCloseMemHandle(void *p);
cudaError_t __wrap_cudaIpcCloseMemHandle(void *p);
cudaError_t __wrap_cudaIpcCloseMemHandle(void *p)
{
    if (!fk.on)
        return __real_cudaIpcCloseMemHandle(p);
    for (int i = 0; i < fk.nallocs; i++) {
        if (fk.allocs[i].p == p && fk.allocs[i].opened) {
            fk.allocs[i].opened--;
            fk.ipc_closes++;
            return cudaSuccess;
        }
    }
    return cudaErrorInvalidValue;
}

cudaError_t __real_cudaHostRegister(void *p, size_t len, unsigned flags);
cudaError_t __wrap_cudaHostRegister(void *p, size_t len, unsigned flags);
cudaError_t __wrap_cudaHostRegister(void *p, size_t len, unsigned flags)
{
    if (!fk.on)
        return __real_cudaHostRegister(p, len, flags);
    assert_int_equal(flags, cudaHostRegisterPortable | cudaHostRegisterMapped);
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        uint8_t *b = fk.regs[i].p;
        if (b && (uint8_t *)p < b + fk.regs[i].len && b < (uint8_t *)p + len)
            return cudaErrorHostMemoryAlreadyRegistered;
    }
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        if (!fk.regs[i].p) {
            fk.regs[i].p = p;
            fk.regs[i].len = len;
            return cudaSuccess;
        }
    }
    return cudaErrorMemoryAllocation;
}

cudaError_t __real_cudaHostGetDevicePointer(void **d, void *p, unsigned flags);
cudaError_t __wrap_cudaHostGetDevicePointer(void **d, void *p, unsigned flags);
cudaError_t __wrap_cudaHostGetDevicePointer(void **d, void *p, unsigned flags)
{
    if (!fk.on)
        return __real_cudaHostGetDevicePointer(d, p, flags);
    if (fake_find_reg((uint64_t)(uintptr_t)p, 1, false) < 0)
        return cudaErrorInvalidValue;
    *d = (void *)((uintptr_t)p + FAKE_ALIAS_OFF);
    return cudaSuccess;
}

cudaError_t __real_cudaHostUnregister(void *p);
cudaError_t __wrap_cudaHostUnregister(void *p);
cudaError_t __wrap_cudaHostUnregister(void *p)
{
    if (!fk.on)
        return __real_cudaHostUnregister(p);
    for (int i = 0; i < FAKE_MAX_REGS; i++) {
        if (fk.regs[i].p == p) {
            fk.regs[i].p = NULL;
            return cudaSuccess;
        }
    }
    return cudaErrorHostMemoryNotRegistered;
}

cudaError_t __real_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t __wrap_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t __wrap_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    if (!fk.on)
        return __real_cudaStreamCreateWithFlags(s, flags);
    *s = (cudaStream_t)malloc(1);
    fk.streams++;
    return cudaSuccess;
}

cudaError_t __real_cudaStreamDestroy(cudaStream_t s);
cudaError_t __wrap_cudaStreamDestroy(cudaStream_t s);
cudaError_t __wrap_cudaStreamDestroy(cudaStream_t s)
{
    if (!fk.on)
        return __real_cudaStreamDestroy(s);
    free(s);
    fk.streams--;
    return cudaSuccess;
}

cudaError_t __real_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t __wrap_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t __wrap_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    if (!fk.on)
        return __real_cudaEventCreateWithFlags(e, flags);
    *e = (cudaEvent_t)malloc(1);
    fk.events++;
    return cudaSuccess;
}

cudaError_t __real_cudaEventDestroy(cudaEvent_t e);
cudaError_t __wrap_cudaEventDestroy(cudaEvent_t e);
cudaError_t __wrap_cudaEventDestroy(cudaEvent_t e)
{
    if (!fk.on)
        return __real_cudaEventDestroy(e);
    free(e);
    fk.events--;
    return cudaSuccess;
}

cudaError_t __real_cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t __wrap_cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t __wrap_cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!fk.on)
        return __real_cudaEventRecord(e, s);
    return cudaSuccess;
}

cudaError_t __real_cudaEventQuery(cudaEvent_t e);
cudaError_t __wrap_cudaEventQuery(cudaEvent_t e);
cudaError_t __wrap_cudaEventQuery(cudaEvent_t e)
{
    if (!fk.on)
        return __real_cudaEventQuery(e);
    if (fk.async_err) {
        cudaError_t r = fk.async_err;
        fk.async_err = cudaSuccess;
        return r;
    }
    if (fk.not_ready > 0) {
        fk.not_ready--;
        return cudaErrorNotReady;
    }
    return cudaSuccess;
}

cudaError_t __real_cudaMalloc(void **p, size_t len);
cudaError_t __wrap_cudaMalloc(void **p, size_t len);
cudaError_t __wrap_cudaMalloc(void **p, size_t len)
{
    if (!fk.on)
        return __real_cudaMalloc(p, len);
    *p = malloc(len);
    fk.mallocs++;
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t __real_cudaFree(void *p);
cudaError_t __wrap_cudaFree(void *p);
cudaError_t __wrap_cudaFree(void *p)
{
    if (!fk.on)
        return __real_cudaFree(p);
    free(p);
    fk.frees++;
    return cudaSuccess;
}

cudaError_t __real_cudaMemcpyAsync(void *dst, const void *src, size_t len, enum cudaMemcpyKind kind,
                                   cudaStream_t s);
cudaError_t __wrap_cudaMemcpyAsync(void *dst, const void *src, size_t len, enum cudaMemcpyKind kind,
                                   cudaStream_t s);
cudaError_t __wrap_cudaMemcpyAsync(void *dst, const void *src, size_t len, enum cudaMemcpyKind kind,
                                   cudaStream_t s)
{
    if (!fk.on)
        return __real_cudaMemcpyAsync(dst, src, len, kind, s);
    if (fk.memcpy_err)
        return fk.memcpy_err;
    bool dev_dst = fake_is_dev(dst, len), dev_src = fake_is_dev(src, len);
    bool reg_dst = fake_find_reg((uint64_t)(uintptr_t)dst, len, false) >= 0;
    bool reg_src = fake_find_reg((uint64_t)(uintptr_t)src, len, false) >= 0;
    if (kind == cudaMemcpyDeviceToHost) {
        assert_true(dev_src && reg_dst); /* direct copies use host pointers, not aliases */
        fk.memcpys++;
        fk.copied += len;
    } else if (kind == cudaMemcpyHostToDevice && dev_dst && reg_src) {
        fk.memcpys++;
        fk.copied += len;
    } else {
        assert_int_equal(kind, cudaMemcpyHostToDevice); /* descriptor upload to scratch */
        fk.uploads++;
    }
    memcpy(dst, src, len); /* "asynchronous": done at once, the source is not kept */
    return cudaSuccess;
}

/* The copy kernel, on the CPU: reads the uploaded descriptors and copies, translating
 * host aliases back to host pointers (and refusing plain host pointers). */
cudaError_t __real_pf_cuda_kernel_launch(const struct pf_cuda_kdesc *d, size_t n, cudaStream_t st);
cudaError_t __wrap_pf_cuda_kernel_launch(const struct pf_cuda_kdesc *d, size_t n, cudaStream_t st);
cudaError_t __wrap_pf_cuda_kernel_launch(const struct pf_cuda_kdesc *d, size_t n, cudaStream_t st)
{
    if (!fk.on)
        return __real_pf_cuda_kernel_launch(d, n, st);
    fk.launches++;
    fk.last_launch_n = n;
    for (size_t i = 0; i < n; i++) {
        assert_true(d[i].len > 0 && d[i].len <= PF_CUDA_KERNEL_CHUNK);
        uint64_t dst = d[i].dst, src = d[i].src;
        if (fake_find_reg(dst, d[i].len, true) >= 0) {
            dst -= FAKE_ALIAS_OFF;
            assert_true(fake_is_dev((void *)(uintptr_t)src, d[i].len));
        } else {
            assert_true(fake_find_reg(src, d[i].len, true) >= 0);
            src -= FAKE_ALIAS_OFF;
            assert_true(fake_is_dev((void *)(uintptr_t)dst, d[i].len));
        }
        memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, d[i].len);
        fk.copied += d[i].len;
    }
    return cudaSuccess;
}

static int gpus_present(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    return e == cudaSuccess ? n : 0;
}

/* Runs fn with the log captured into buf (NUL-terminated). */
static void capture_log(char *buf, size_t len, void (*fn)(void *), void *arg)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    pf_log_set_fd(fileno(f));
    fn(arg);
    pf_log_set_fd(2);
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    fputs(buf, stderr); /* keep it in the test log */
}

struct open_call {
    const char *name;
    int rc;
    struct pf_gpu *g;
    char chosen[32];
    char err[256];
};

static void do_open(void *p)
{
    struct open_call *c = p;
    struct pf_gpu_config cfg = {0};
    c->rc =
        pf_hal_gpu_open(c->name, &cfg, &c->g, c->chosen, sizeof(c->chosen), c->err, sizeof(c->err));
}

static void test_register(void **st)
{
    pf_hal_init();
    /* pf_hal_init registered the backend already: a second registration is refused */
    assert_int_equal(pf_cuda_register(), -EEXIST);
}

static void test_open_cuda(void **st)
{
    char log[4096];
    struct open_call c = {.name = "cuda"};
    capture_log(log, sizeof(log), do_open, &c);
    if (gpus_present() == 0) {
        assert_int_equal(c.rc, -ENODEV);
        assert_null(c.g);
        assert_non_null(strstr(c.err, "cuda"));
        assert_non_null(strstr(log, "no usable CUDA GPU"));
        return;
    }
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.chosen, "cuda");
    int n = pf_gpu_device_count(c.g);
    assert_int_equal(n, gpus_present());
    for (int i = 0; i < n; i++) {
        struct pf_gpu_dev_info info;
        assert_int_equal(pf_gpu_device_info(c.g, i, &info), 0);
        assert_int_equal(info.index, i);
        assert_true(info.total_mem > 0);
        assert_true(info.name[0] != '\0');
        assert_true(info.numa_node >= -1);
        static const uint8_t zero[16];
        assert_memory_not_equal(info.uuid, zero, 16);
    }
    struct pf_gpu_dev_info info;
    assert_int_equal(pf_gpu_device_info(c.g, n, &info), -ENODEV);
    pf_gpu_close(c.g);
}

static void test_open_auto_falls_back(void **st)
{
    char log[4096];
    struct open_call c = {.name = "auto"};
    capture_log(log, sizeof(log), do_open, &c);
    assert_int_equal(c.rc, 0);
    if (gpus_present() == 0) {
        assert_string_equal(c.chosen, "sim");
        assert_non_null(strstr(log, "chose sim"));
        assert_non_null(strstr(log, "cuda"));
    } else {
        assert_string_equal(c.chosen, "cuda");
    }
    pf_gpu_close(c.g);
}

static void test_devices_out_of_range(void **st)
{
    int n = gpus_present();
    int devs[1] = {n + 5};
    struct pf_gpu_config cfg = {.devices = devs, .ndevices = 1};
    struct pf_gpu *g = NULL;
    char err[256];
    int rc = pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, err, sizeof(err));
    assert_int_equal(rc, -ENODEV);
    assert_null(g);
}

/* ---- GPU only: input validation of an opened backend */

static void test_rejects_bad_input(void **st)
{
    if (gpus_present() == 0) {
        printf("no GPU: input validation of an opened backend is checked on GPU hosts\n");
        skip();
    }
    struct pf_gpu *g = NULL;
    assert_int_equal(pf_hal_gpu_open("cuda", NULL, &g, NULL, 0, NULL, 0), 0);
    struct pf_gpu_mapping *m = NULL;
    struct pf_ipc_desc d = {.kind = PF_IPC_SIM_SHM, .size = 4096};
    strcpy(d.shm_name, "/pf-not-a-gpu");
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    d.kind = PF_IPC_UNSPECIFIED;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    d.kind = PF_IPC_CUDA;
    d.has_uuid = true;
    memset(d.device_uuid, 0xee, sizeof(d.device_uuid));
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -ENODEV);
    d.size = 0;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    assert_null(m);

    size_t len = 1 << 20;
    void *host = aligned_alloc(4096, len);
    assert_non_null(host);
    struct pf_gpu_host_reg *r = NULL;
    assert_int_equal(pf_gpu_host_register(g, host, len, &r), 0);
    struct pf_gpu_stream *s = NULL;
    assert_int_equal(pf_gpu_stream_create(g, 0, &s), 0);
    assert_int_equal(pf_gpu_stream_create(g, pf_gpu_device_count(g), &s), -ENODEV);
    void *dev = NULL;
    assert_int_equal(cudaMalloc(&dev, len), cudaSuccess);
    /* device memory of this process is not an imported mapping: refused */
    struct pf_copy_desc c = {.dev = (pf_devptr_t)(uintptr_t)dev, .host = host, .len = 4096};
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), -EFAULT);
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_H2D, PF_COPY_MODE_KERNEL, &c, 1), -EFAULT);
    assert_int_equal(pf_gpu_copy_batch(s, 0, PF_COPY_MODE_DIRECT, &c, 1), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 0), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 1000), 0);
    pf_gpu_stream_destroy(s);
    pf_gpu_host_unregister(r);
    cudaFree(dev);
    free(host);
    pf_gpu_close(g);
}

/* ------------------------------------------------------------------ fake-runtime tests */

static int fake_setup(void **st)
{
    fake_reset();
    fk.on = true;
    fk.ndev = 2;
    return 0;
}

static int fake_teardown(void **st)
{
    assert_int_equal(fk.streams, 0); /* every stream and event destroyed */
    assert_int_equal(fk.events, 0);
    for (int i = 0; i < fk.nallocs; i++)
        assert_int_equal(fk.allocs[i].opened, 0); /* every IPC handle closed */
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        assert_null(fk.regs[i].p); /* every registration dropped */
    fake_reset();
    return 0;
}

static struct pf_gpu *fake_open(const int *devs, size_t n)
{
    struct pf_gpu_config cfg = {.devices = devs, .ndevices = n};
    struct pf_gpu *g = NULL;
    char err[256];
    int rc = pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, err, sizeof(err));
    if (rc)
        fail_msg("open cuda (fake): %s", err);
    return g;
}

static struct pf_ipc_desc fake_desc(int dev, const cudaIpcMemHandle_t *h, uint64_t off,
                                    uint64_t size)
{
    struct pf_ipc_desc d = {.kind = PF_IPC_CUDA, .has_uuid = true, .offset = off, .size = size};
    fake_uuid(dev, d.device_uuid);
    memcpy(d.cuda_handle, h, 64);
    return d;
}

static void pattern(uint8_t *p, size_t len, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

static void test_fake_discovery(void **st)
{
    struct pf_gpu *g = fake_open(NULL, 0);
    assert_int_equal(pf_gpu_device_count(g), 2);
    struct pf_gpu_dev_info info;
    uint8_t u[16];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pf_gpu_device_info(g, i, &info), 0);
        assert_int_equal(info.index, i);
        char name[32], bus[32];
        snprintf(name, sizeof(name), "Fake GPU %d", i);
        snprintf(bus, sizeof(bus), "0000:%02x:00.0", 0x3b + i); /* normalised to lower case */
        assert_string_equal(info.name, name);
        assert_string_equal(info.pci_bus_id, bus);
        fake_uuid(i, u);
        assert_memory_equal(info.uuid, u, 16);
        assert_int_equal(info.total_mem, (uint64_t)(80 + i) << 30);
        assert_int_equal(info.numa_node, pf_cuda_numa_node("/sys", bus));
    }
    pf_gpu_close(g);

    /* --devices 1: one device, HAL ordinal 0, CUDA ordinal 1 */
    int one = 1;
    g = fake_open(&one, 1);
    assert_int_equal(pf_gpu_device_count(g), 1);
    assert_int_equal(pf_gpu_device_info(g, 0, &info), 0);
    assert_int_equal(info.index, 1);
    assert_int_equal(pf_gpu_device_info(g, 1, &info), -ENODEV);
    pf_gpu_close(g);

    /* errors */
    struct pf_gpu_config cfg = {.devices = (int[]){2}, .ndevices = 1};
    g = NULL;
    assert_int_equal(pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, NULL, 0), -ENODEV);
    fk.ndev = 0;
    assert_int_equal(pf_hal_gpu_open("cuda", NULL, &g, NULL, 0, NULL, 0), -ENODEV);
    fk.ndev = 2;
    fk.count_err = cudaErrorNoDevice;
    assert_int_equal(pf_hal_gpu_open("cuda", NULL, &g, NULL, 0, NULL, 0), -ENODEV);
    fk.count_err = cudaErrorInitializationError;
    assert_int_equal(pf_hal_gpu_open("cuda", NULL, &g, NULL, 0, NULL, 0), -ENODEV);
    fk.count_err = cudaErrorMemoryAllocation; /* any failure to count devices: no GPU */
    assert_int_equal(pf_hal_gpu_open("cuda", NULL, &g, NULL, 0, NULL, 0), -ENODEV);
    char chosen[32];
    assert_int_equal(pf_hal_gpu_open("auto", NULL, &g, chosen, sizeof(chosen), NULL, 0), 0);
    assert_string_equal(chosen, "sim");
    pf_gpu_close(g);
}

static void test_fake_ipc(void **st)
{
    struct pf_gpu *g = fake_open(NULL, 0);
    cudaIpcMemHandle_t ha, hb;
    int ia = fake_export(1, 1 << 20, &ha);
    fake_export(1, 1 << 19, &hb);
    struct pf_gpu_mapping *m1 = NULL, *m2 = NULL, *m3 = NULL, *mb = NULL;
    struct pf_ipc_desc d = fake_desc(1, &ha, 0, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m1), 0);
    assert_int_equal(m1->device, 1); /* found by UUID */
    assert_ptr_equal((void *)(uintptr_t)m1->base, fk.allocs[ia].p);
    assert_int_equal(m1->size, 1 << 19);
    /* a second view of the same allocation shares the opened handle */
    d = fake_desc(1, &ha, 1 << 19, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m2), 0);
    assert_int_equal(fk.ipc_opens, 1);
    assert_int_equal(m2->base, m1->base + (1 << 19));
    /* past the end of the allocation */
    d = fake_desc(1, &ha, 3 << 18, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ERANGE);
    d = fake_desc(1, &ha, UINT64_MAX, 2);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ERANGE);
    assert_null(m3);
    /* bad descriptors */
    d = fake_desc(7, &ha, 0, 4096); /* unknown UUID */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ENODEV);
    d = fake_desc(0, &ha, 0, 4096); /* a device that does not hold the handle */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ENODEV);
    d = fake_desc(1, &ha, 0, 0);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    d = fake_desc(1, &ha, 0, 4096);
    d.has_uuid = false; /* two devices: cannot tell which */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    d = fake_desc(1, &ha, 0, 4096);
    d.kind = PF_IPC_SIM_SHM;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    d.kind = PF_IPC_UNSPECIFIED;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    fk.ipc_open_err = cudaErrorMapBufferObjectFailed; /* exporter gone */
    d = fake_desc(1, &hb, 0, 4096);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ENOENT);
    fk.ipc_open_err = cudaSuccess;
    assert_null(m3);
    assert_int_equal(fk.ipc_opens, 1);
    /* the handle closes with its last view, and opens again */
    pf_gpu_ipc_close(m1);
    assert_int_equal(fk.ipc_closes, 0);
    pf_gpu_ipc_close(m2);
    assert_int_equal(fk.ipc_closes, 1);
    d = fake_desc(1, &ha, 0, 1 << 20);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m1), 0);
    assert_int_equal(fk.ipc_opens, 2);
    pf_gpu_ipc_close(m1);
    /* a mapping left open is released by close */
    d = fake_desc(1, &hb, 0, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &mb), 0);
    pf_gpu_close(g);
    assert_int_equal(fk.ipc_closes, 3);
}

static void test_fake_ipc_without_range_query(void **st)
{
    /* a driver without cuMemGetAddressRange: sizes cannot be checked, views still work */
    fk.no_addr_range = true;
    int one = 1;
    struct pf_gpu *g = fake_open(&one, 1);
    cudaIpcMemHandle_t h;
    fake_export(1, 1 << 16, &h);
    struct pf_gpu_mapping *m = NULL;
    struct pf_ipc_desc d = fake_desc(1, &h, 1 << 15, 1 << 15);
    d.has_uuid = false; /* one device: it must be that one */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), 0);
    assert_int_equal(m->device, 0);
    pf_gpu_ipc_close(m);
    pf_gpu_close(g);
}

static void test_fake_host_register(void **st)
{
    struct pf_gpu *g = fake_open(NULL, 0);
    size_t len = 1 << 20;
    uint8_t *h = aligned_alloc(4096, len);
    assert_non_null(h);
    struct pf_gpu_host_reg *r = NULL, *r2 = NULL;
    assert_int_equal(pf_gpu_host_register(g, h, 0, &r), -EINVAL);
    assert_int_equal(pf_gpu_host_register(g, NULL, len, &r), -EINVAL);
    assert_int_equal(pf_gpu_host_register(g, h, len, &r), 0);
    assert_ptr_equal(r->addr, h);
    assert_int_equal(r->len, len);
    assert_int_equal(pf_gpu_host_register(g, h + 4096, 4096, &r2), -EEXIST);
    assert_null(r2);
    pf_gpu_host_unregister(r);
    assert_int_equal(pf_gpu_host_register(g, h + 4096, 4096, &r2), 0);
    pf_gpu_close(g); /* releases r2 */
    free(h);
}

/* A device allocation of 64 blocks of 64 KiB, mapped, and a registered host buffer. */
struct fake_rig {
    struct pf_gpu *g;
    struct pf_gpu_mapping *m;
    struct pf_gpu_host_reg *r;
    struct pf_gpu_stream *s;
    uint8_t *dev, *host;
    size_t len;
};

#define RIG_BLK  (64u * 1024u)
#define RIG_NBLK 64u

static void rig_up(struct fake_rig *rig)
{
    int one = 1;
    rig->g = fake_open(&one, 1); /* HAL device 0 is CUDA device 1 */
    rig->len = (size_t)RIG_BLK * RIG_NBLK;
    cudaIpcMemHandle_t h;
    int i = fake_export(1, rig->len, &h);
    rig->dev = fk.allocs[i].p;
    struct pf_ipc_desc d = fake_desc(1, &h, 0, rig->len);
    assert_int_equal(pf_gpu_ipc_open(rig->g, &d, &rig->m), 0);
    rig->host = aligned_alloc(4096, rig->len);
    assert_non_null(rig->host);
    assert_int_equal(pf_gpu_host_register(rig->g, rig->host, rig->len, &rig->r), 0);
    assert_int_equal(pf_gpu_stream_create(rig->g, rig->m->device, &rig->s), 0);
    assert_int_equal(pf_gpu_stream_create(rig->g, 1, &(struct pf_gpu_stream *){NULL}), -ENODEV);
}

static void rig_down(struct fake_rig *rig)
{
    fk.not_ready = 0;
    pf_gpu_stream_destroy(rig->s);
    pf_gpu_host_unregister(rig->r);
    pf_gpu_ipc_close(rig->m);
    pf_gpu_close(rig->g);
    free(rig->host);
}

/* host block k <- device block perm(k): runs of 8 adjacent blocks in reverse run order,
 * plus zero-length descriptors with garbage pointers that must be ignored */
static size_t rig_plan(struct fake_rig *rig, struct pf_copy_desc *d, unsigned *perm)
{
    size_t n = 0;
    for (unsigned k = 0; k < RIG_NBLK; k++) {
        perm[k] = (RIG_NBLK / 8 - 1 - k / 8) * 8 + k % 8;
        d[n++] = (struct pf_copy_desc){rig->m->base + (uint64_t)perm[k] * RIG_BLK,
                                       rig->host + (size_t)k * RIG_BLK, RIG_BLK};
        if (k % 9 == 4)
            d[n++] = (struct pf_copy_desc){0xdead, NULL, 0};
    }
    return n;
}

static void check_copies(struct fake_rig *rig, enum pf_copy_mode mode)
{
    struct pf_copy_desc d[RIG_NBLK * 2];
    unsigned perm[RIG_NBLK];
    size_t n = rig_plan(rig, d, perm);

    pattern(rig->dev, rig->len, 1);
    memset(rig->host, 0, rig->len);
    int memcpys = fk.memcpys, launches = fk.launches, uploads = fk.uploads;
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_D2H, mode, d, n), 0);
    assert_int_equal(pf_gpu_stream_sync(rig->s, 1000), 0);
    for (unsigned k = 0; k < RIG_NBLK; k++)
        assert_memory_equal(rig->host + (size_t)k * RIG_BLK, rig->dev + (size_t)perm[k] * RIG_BLK,
                            RIG_BLK);
    if (mode == PF_COPY_MODE_DIRECT) {
        assert_int_equal(fk.memcpys - memcpys, 8); /* one per merged run */
        assert_int_equal(fk.launches, launches);
    } else {
        assert_int_equal(fk.memcpys, memcpys);
        assert_int_equal(fk.uploads - uploads, 1);   /* one descriptor upload */
        assert_int_equal(fk.launches - launches, 1); /* one launch per batch */
        assert_int_equal(fk.last_launch_n, 8 * 8 * RIG_BLK / PF_CUDA_KERNEL_CHUNK);
    }

    pattern(rig->host, rig->len, 2);
    memset(rig->dev, 0, rig->len);
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_H2D, mode, d, n / 2), 0);
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_H2D, mode, d + n / 2, n - n / 2), 0);
    assert_int_equal(pf_gpu_stream_sync(rig->s, 1000), 0);
    for (unsigned k = 0; k < RIG_NBLK; k++)
        assert_memory_equal(rig->dev + (size_t)perm[k] * RIG_BLK, rig->host + (size_t)k * RIG_BLK,
                            RIG_BLK);
}

static void test_fake_copy_direct(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    check_copies(&rig, PF_COPY_MODE_DIRECT);
    rig_down(&rig);
}

static void test_fake_copy_kernel(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    check_copies(&rig, PF_COPY_MODE_KERNEL);
    assert_int_equal(fk.mallocs, 1); /* the descriptor scratch */

    /* 3000 unaligned, non-adjacent 100-byte pieces: the scratch grows (grow-only) */
    enum { NP = 3000 };
    static struct pf_copy_desc d[NP];
    for (unsigned i = 0; i < NP; i++)
        d[i] = (struct pf_copy_desc){rig.m->base + 3 + 200ull * i, rig.host + 1 + 300ull * i, 100};
    pattern(rig.dev, rig.len, 3);
    memset(rig.host, 0, rig.len);
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_KERNEL, d, NP), 0);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), 0);
    assert_int_equal(fk.last_launch_n, NP);
    assert_int_equal(fk.mallocs, 2);
    assert_int_equal(fk.frees, 1);
    for (unsigned i = 0; i < NP; i++)
        assert_memory_equal(rig.host + 1 + 300 * i, rig.dev + 3 + 200 * i, 100);
    /* smaller batches reuse it */
    check_copies(&rig, PF_COPY_MODE_KERNEL);
    assert_int_equal(fk.mallocs, 2);
    rig_down(&rig);
    assert_int_equal(fk.frees, 2);
}

static void test_fake_copy_validation(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    uint8_t *unreg = malloc(8192);
    assert_non_null(unreg);
    struct pf_copy_desc ok = {rig.m->base, rig.host, 4096};
    struct pf_copy_desc bad[] = {
        {rig.m->base + rig.len - 4096, rig.host, 8192}, /* past the mapping */
        {rig.m->base - 4096, rig.host, 4096},           /* before it */
        {rig.m->base, unreg, 4096},                     /* unregistered host memory */
        {rig.m->base, rig.host + rig.len - 100, 4096},  /* past the registration */
        {rig.m->base, rig.host, UINT64_MAX},            /* overflowing length */
    };
    int before = fk.memcpys + fk.uploads + fk.launches;
    for (int mode = 0; mode < 2; mode++) {
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            struct pf_copy_desc two[2] = {ok, bad[i]}; /* nothing of the batch is enqueued */
            assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, mode, two, 2), -EFAULT);
            assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_H2D, mode, &bad[i], 1), -EFAULT);
        }
    }
    assert_int_equal(fk.memcpys + fk.uploads + fk.launches, before);
    assert_int_equal(pf_gpu_copy_batch(rig.s, 0, PF_COPY_MODE_DIRECT, &ok, 1), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, 7, &ok, 1), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &ok, 0), 0);
    struct pf_copy_desc empty = {0x1234, NULL, 0};
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_KERNEL, &empty, 1), 0);
    assert_int_equal(fk.memcpys + fk.uploads + fk.launches, before);
    free(unreg);
    rig_down(&rig);
}

static void test_fake_mapping_of_other_device(void **st)
{
    struct pf_gpu *g = fake_open(NULL, 0);
    cudaIpcMemHandle_t h0, h1;
    fake_export(0, 1 << 16, &h0);
    fake_export(1, 1 << 16, &h1);
    struct pf_gpu_mapping *m0 = NULL, *m1 = NULL;
    struct pf_ipc_desc d = fake_desc(0, &h0, 0, 1 << 16);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m0), 0);
    d = fake_desc(1, &h1, 0, 1 << 16);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m1), 0);
    uint8_t *host = aligned_alloc(4096, 1 << 16);
    struct pf_gpu_host_reg *r = NULL;
    assert_int_equal(pf_gpu_host_register(g, host, 1 << 16, &r), 0);
    struct pf_gpu_stream *s = NULL;
    assert_int_equal(pf_gpu_stream_create(g, m1->device, &s), 0);
    struct pf_copy_desc c = {m0->base, host, 4096}; /* device 0's memory on device 1's stream */
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), -EFAULT);
    c.dev = m1->base;
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 1000), 0);
    assert_int_equal(fk.cur, 1); /* copies ran with the stream's device current */
    pf_gpu_stream_destroy(s);
    pf_gpu_host_unregister(r);
    pf_gpu_ipc_close(m0);
    pf_gpu_ipc_close(m1);
    pf_gpu_close(g);
    free(host);
}

static void test_fake_sync(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    struct pf_copy_desc c = {rig.m->base, rig.host, 4096};
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), 0);
    fk.not_ready = 1 << 30; /* the copy never finishes */
    assert_int_equal(pf_gpu_stream_sync(rig.s, 0), -ETIMEDOUT);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 5), -ETIMEDOUT);
    fk.not_ready = 3; /* finishes after a few polls */
    assert_int_equal(pf_gpu_stream_sync(rig.s, 10000), 0);
    assert_int_equal(fk.not_ready, 0);
    fk.async_err = cudaErrorIllegalAddress; /* a copy faulted on the GPU */
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), -EFAULT);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), 0);
    rig_down(&rig);
}

static void copy_three_failures(void *p)
{
    struct fake_rig *rig = p;
    struct pf_copy_desc c = {rig->m->base, rig->host, 4096};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1),
                         -EINVAL);
}

static void test_fake_error_logged_once(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    fk.memcpy_err = cudaErrorInvalidValue;
    char log[4096];
    capture_log(log, sizeof(log), copy_three_failures, &rig);
    fk.memcpy_err = cudaSuccess;
    int lines = 0;
    for (const char *p = log; (p = strstr(p, "cudaMemcpyAsync: ")); p++)
        lines++;
    assert_int_equal(lines, 1);
    assert_non_null(strstr(log, "invalid argument"));
    assert_non_null(strstr(log, "CUDA error 1"));
    rig_down(&rig);
}

int main(void)
{
    int n = gpus_present();
    printf("%d CUDA GPU(s) visible to this test\n", n);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_open_cuda),
        cmocka_unit_test(test_open_auto_falls_back),
        cmocka_unit_test(test_devices_out_of_range),
        cmocka_unit_test(test_rejects_bad_input),
        cmocka_unit_test_setup_teardown(test_fake_discovery, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_ipc, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_ipc_without_range_query, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_host_register, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_direct, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_kernel, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_validation, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_mapping_of_other_device, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_sync, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_error_logged_once, fake_setup, fake_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit (HAVE_CUDA=0), hw/cuda is not compiled\n");
    return 77;
}
#endif

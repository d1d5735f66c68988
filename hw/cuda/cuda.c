/* CUDA GPU backend ("cuda"): the GPU HAL on the CUDA runtime API (static cudart; the
 * driver library is never linked, so the binary starts on machines without a driver).
 *
 * Devices: cudaGetDeviceCount, filtered by --devices (CUDA ordinals as this process sees
 * them); each device's UUID, name, PCI bus id and NUMA node (sysfs of the PCI device) are
 * read once at open. No driver (35), no device (100) or zero devices -> open answers
 * -ENODEV and "auto" falls back to the sim backend.
 *
 * IPC import: an IpcTensor names its GPU by UUID (not by index, so CUDA_VISIBLE_DEVICES
 * differences between client and server do not matter) and carries the cudaIpcMemHandle
 * of the allocation plus the offset of the tensor inside it. Several tensors (layers) are
 * often views of one allocation and CUDA refuses to open a handle twice in one context,
 * so opened allocations are shared and refcounted by (device, handle); the last
 * ipc_close closes the handle. When the driver exposes cuMemGetAddressRange (through
 * cudaGetDriverEntryPointByVersion, no libcuda link) the view is checked against the
 * allocation's size.
 *
 * Host memory: cudaHostRegister(portable | mapped); the device alias of each registration
 * is kept for the copy kernel.
 *
 * Streams: one cudaStream_t (non-blocking) and one event per pf_gpu_stream. copy_batch
 * validates every descriptor against the mappings of the stream's device and the host
 * registrations (-EFAULT, nothing enqueued), merges ranges adjacent on both sides inside
 * one allocation and one registration (cuda_merge.c), then either issues one
 * cudaMemcpyAsync per merged range (direct) or uploads the descriptor array to a
 * grow-only device scratch buffer and launches the copy kernel once (kernel mode,
 * cuda_kernel.cu). stream_sync records the event and polls it until the deadline,
 * returning -ETIMEDOUT with the work still in flight.
 *
 * Errors: every CUDA call goes through CUDA_CALL, which translates the code to -errno
 * (pf_cuda_errno) and logs the CUDA error string once per call site: the first failure of
 * a site at warn level, later ones at debug (callers report their own failures upward). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#define PF_LOG_MOD "cuda"
#include "pf/clock.h"
#include "pf/hal.h"
#include "pf/log.h"

#include "cuda_internal.h"

#define CUDA_MAX_DEVS        64
#define CUDA_SCRATCH_MIN     (64u * 1024u)
#define CUDA_DESTROY_WAIT_MS 60000u
#define CUDA_GROW_WAIT_MS    60000u
#define CUDA_SPIN_NS         50000u
#define CUDA_POLL_MAX_NS     500000u

_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(((struct pf_ipc_desc *)0)->cuda_handle),
               "IpcTensor handle size");

struct cuda_dev {
    int ordinal; /* CUDA ordinal in this process */
    int numa;
    bool can_map_host;
    uint8_t uuid[16];
    char name[64];
    char busid[32];
    uint64_t total_mem;
};

/* One opened IPC allocation, shared by the mappings of its views (g->ipc_mu). */
struct cuda_alloc {
    struct cuda_alloc *next;
    int dev;
    uint8_t handle[64];
    void *base;
    uint64_t size; /* 0 = unknown (no cuMemGetAddressRange) */
    uint32_t id;
    unsigned refs;
};

struct cuda_map {
    struct pf_gpu_mapping base;
    struct cuda_map *next;
    struct cuda_alloc *alloc;
};

struct cuda_reg {
    struct pf_gpu_host_reg base;
    struct cuda_reg *next;
    uint64_t devptr; /* device alias of base.addr */
    uint32_t id;
};

typedef CUresult (*cuda_addr_range_fn)(CUdeviceptr *base_p, size_t *size_p, CUdeviceptr p);

struct cuda_gpu {
    struct pf_gpu base;
    int ndev;
    struct cuda_dev devs[CUDA_MAX_DEVS];
    cuda_addr_range_fn addr_range;
    pthread_mutex_t ipc_mu; /* allocs; taken before lock */
    struct cuda_alloc *allocs;
    pthread_rwlock_t lock; /* maps, regs: read by copy_batch */
    struct cuda_map *maps;
    struct cuda_reg *regs;
    _Atomic uint32_t next_id;
};

struct cuda_stream {
    struct pf_gpu_stream base;
    struct cuda_gpu *g;
    cudaStream_t st;
    cudaEvent_t ev;
    struct pf_cuda_span *spans; /* grow-only scratch of copy_batch */
    size_t spans_cap;
    struct pf_cuda_kdesc *kdesc; /* pageable staging of the descriptor upload */
    size_t kdesc_cap;
    void *scratch; /* device copy of the descriptors */
    size_t scratch_cap;
};

static const struct pf_gpu_ops cuda_ops;

static int cuda_fail(cudaError_t e, const char *what, _Atomic bool *site_logged)
{
    enum pf_log_level lvl = atomic_exchange(site_logged, true) ? PF_LOG_DEBUG : PF_LOG_WARN;
    if (pf_log_enabled(lvl))
        pf_log_write(lvl, PF_LOG_MOD, "%.*s: %s (CUDA error %d)", (int)strcspn(what, "("), what,
                     cudaGetErrorString(e), (int)e);
    return pf_cuda_errno(e);
}

/* rc_ = 0 or -errno of the CUDA call expr_, logged at this call site on failure. */
#define CUDA_CALL(rc_, expr_)                                                                      \
    do {                                                                                           \
        static _Atomic bool cuda_site_;                                                            \
        cudaError_t cuda_e_ = (expr_);                                                             \
        (rc_) = cuda_e_ == cudaSuccess ? 0 : cuda_fail(cuda_e_, #expr_, &cuda_site_);              \
    } while (0)

static struct cuda_gpu *cg(struct pf_gpu *g)
{
    return pf_container_of(g, struct cuda_gpu, base);
}

static struct cuda_stream *cs(struct pf_gpu_stream *s)
{
    return pf_container_of(s, struct cuda_stream, base);
}

static uint32_t cuda_new_id(struct cuda_gpu *g)
{
    return atomic_fetch_add(&g->next_id, 1) + 1;
}

/* ------------------------------------------------------------------ devices */

static int cuda_count(struct pf_gpu *pg)
{
    return cg(pg)->ndev;
}

static int cuda_info(struct pf_gpu *pg, int dev, struct pf_gpu_dev_info *info_p)
{
    struct cuda_gpu *g = cg(pg);
    if (dev < 0 || dev >= g->ndev)
        return -ENODEV;
    const struct cuda_dev *d = &g->devs[dev];
    memset(info_p, 0, sizeof(*info_p));
    info_p->index = d->ordinal;
    info_p->numa_node = d->numa;
    memcpy(info_p->uuid, d->uuid, sizeof(d->uuid));
    snprintf(info_p->name, sizeof(info_p->name), "%s", d->name);
    snprintf(info_p->pci_bus_id, sizeof(info_p->pci_bus_id), "%s", d->busid);
    info_p->total_mem = d->total_mem;
    return 0;
}

static int cuda_set_device(struct cuda_gpu *g, int dev)
{
    int rc;
    CUDA_CALL(rc, cudaSetDevice(g->devs[dev].ordinal));
    return rc;
}

/* ------------------------------------------------------------------ IPC import */

static int cuda_dev_by_uuid(struct cuda_gpu *g, const struct pf_ipc_desc *d)
{
    if (!d->has_uuid) {
        if (g->ndev == 1)
            return 0;
        pf_warn("IpcTensor without a device UUID, and this server opened %d GPUs: cannot tell "
                "which one holds it",
                g->ndev);
        return -EINVAL;
    }
    for (int i = 0; i < g->ndev; i++)
        if (memcmp(g->devs[i].uuid, d->device_uuid, 16) == 0)
            return i;
    char want[48];
    pf_cuda_uuid_format(d->device_uuid, want, sizeof(want));
    pf_warn("IpcTensor names %s, which is not one of the %d GPU(s) this server opened "
            "(check --devices and CUDA_VISIBLE_DEVICES of the server)",
            want, g->ndev);
    return -ENODEV;
}

/* Finds or opens the allocation of handle on dev. Caller holds g->ipc_mu. */
static int cuda_alloc_get(struct cuda_gpu *g, int dev, const uint8_t handle[64],
                          struct cuda_alloc **a_p)
{
    for (struct cuda_alloc *a = g->allocs; a; a = a->next) {
        if (a->dev == dev && memcmp(a->handle, handle, 64) == 0) {
            a->refs++;
            *a_p = a;
            return 0;
        }
    }
    struct cuda_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    int rc = cuda_set_device(g, dev);
    if (rc)
        goto err_free;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    static _Atomic bool open_site;
    cudaError_t e = cudaIpcOpenMemHandle(&a->base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        rc = cuda_fail(e, "cudaIpcOpenMemHandle", &open_site);
        /* a handle whose exporter is gone or that was never valid: "not found" */
        if (e == cudaErrorMapBufferObjectFailed || e == cudaErrorInvalidResourceHandle)
            rc = -ENOENT;
        goto err_free;
    }
    if (g->addr_range) {
        CUdeviceptr base = 0;
        size_t size = 0;
        if (g->addr_range(&base, &size, (CUdeviceptr)(uintptr_t)a->base) == CUDA_SUCCESS &&
            base == (CUdeviceptr)(uintptr_t)a->base)
            a->size = size;
    }
    a->dev = dev;
    memcpy(a->handle, handle, 64);
    a->id = cuda_new_id(g);
    a->refs = 1;
    a->next = g->allocs;
    g->allocs = a;
    pf_debug("opened IPC allocation %u at %p (%llu bytes) on GPU %d", a->id, a->base,
             (unsigned long long)a->size, g->devs[dev].ordinal);
    *a_p = a;
    return 0;
err_free:
    free(a);
    return rc;
}

/* Drops one reference. Caller holds g->ipc_mu. */
static void cuda_alloc_put(struct cuda_gpu *g, struct cuda_alloc *a)
{
    if (--a->refs > 0)
        return;
    for (struct cuda_alloc **pp = &g->allocs; *pp; pp = &(*pp)->next) {
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    }
    int rc = cuda_set_device(g, a->dev);
    if (rc == 0)
        CUDA_CALL(rc, cudaIpcCloseMemHandle(a->base));
    pf_debug("closed IPC allocation %u on GPU %d", a->id, g->devs[a->dev].ordinal);
    free(a);
}

static int cuda_ipc_open(struct pf_gpu *pg, const struct pf_ipc_desc *d,
                         struct pf_gpu_mapping **m_p)
{
    struct cuda_gpu *g = cg(pg);
    if (d->kind == PF_IPC_SIM_SHM) {
        pf_warn("refusing IpcTensor of kind SIM_SHM (%s): the cuda GPU backend imports "
                "CUDA_IPC descriptors only; the client uses the sim GPU, start the server "
                "with --gpu-backend sim",
                d->shm_name);
        return -EINVAL;
    }
    if (d->kind != PF_IPC_CUDA) {
        pf_warn("refusing IpcTensor of kind %d: the cuda GPU backend imports CUDA_IPC "
                "descriptors only",
                (int)d->kind);
        return -EINVAL;
    }
    if (d->size == 0) {
        pf_warn("IpcTensor of 0 bytes");
        return -EINVAL;
    }
    uint64_t end;
    if (!pf_add_ok(d->offset, d->size, &end))
        return -ERANGE;
    int dev = cuda_dev_by_uuid(g, d);
    if (dev < 0)
        return dev;
    struct cuda_map *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    pthread_mutex_lock(&g->ipc_mu);
    struct cuda_alloc *a = NULL;
    int rc = cuda_alloc_get(g, dev, d->cuda_handle, &a);
    if (rc)
        goto err_unlock;
    uint64_t base = (uint64_t)(uintptr_t)a->base, dev_end;
    if ((a->size && end > a->size) || !pf_add_ok(base, end, &dev_end)) {
        pf_warn("IpcTensor range [%llu, +%llu) exceeds its CUDA allocation of %llu bytes",
                (unsigned long long)d->offset, (unsigned long long)d->size,
                (unsigned long long)a->size);
        rc = -ERANGE;
        goto err_put;
    }
    m->alloc = a;
    m->base.gpu = pg;
    m->base.device = dev;
    m->base.base = base + d->offset;
    m->base.size = d->size;
    pthread_rwlock_wrlock(&g->lock);
    m->next = g->maps;
    g->maps = m;
    pthread_rwlock_unlock(&g->lock);
    pthread_mutex_unlock(&g->ipc_mu);
    *m_p = &m->base;
    return 0;
err_put:
    cuda_alloc_put(g, a);
err_unlock:
    pthread_mutex_unlock(&g->ipc_mu);
    free(m);
    return rc;
}

static void cuda_ipc_close(struct pf_gpu_mapping *mp)
{
    struct cuda_map *m = pf_container_of(mp, struct cuda_map, base);
    struct cuda_gpu *g = cg(mp->gpu);
    pthread_mutex_lock(&g->ipc_mu);
    pthread_rwlock_wrlock(&g->lock);
    for (struct cuda_map **pp = &g->maps; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    pthread_rwlock_unlock(&g->lock);
    cuda_alloc_put(g, m->alloc);
    pthread_mutex_unlock(&g->ipc_mu);
    free(m);
}

/* ------------------------------------------------------------------ host memory */

static int cuda_host_register(struct pf_gpu *pg, void *addr, size_t len,
                              struct pf_gpu_host_reg **r_p)
{
    struct cuda_gpu *g = cg(pg);
    if (!addr || !len)
        return -EINVAL;
    struct cuda_reg *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    int rc = cuda_set_device(g, 0);
    if (rc)
        goto err_free;
    uint64_t t0 = pf_now_ns();
    CUDA_CALL(rc, cudaHostRegister(addr, len, cudaHostRegisterPortable | cudaHostRegisterMapped));
    if (rc)
        goto err_free;
    void *dp = NULL;
    CUDA_CALL(rc, cudaHostGetDevicePointer(&dp, addr, 0));
    if (rc)
        goto err_unregister;
    r->base.gpu = pg;
    r->base.addr = addr;
    r->base.len = len;
    r->devptr = (uint64_t)(uintptr_t)dp;
    r->id = cuda_new_id(g);
    pthread_rwlock_wrlock(&g->lock);
    r->next = g->regs;
    g->regs = r;
    pthread_rwlock_unlock(&g->lock);
    pf_debug("registered %zu bytes of host memory at %p (device alias 0x%llx) in %.3f s", len, addr,
             (unsigned long long)r->devptr, (double)(pf_now_ns() - t0) / 1e9);
    *r_p = &r->base;
    return 0;
err_unregister:
    cudaHostUnregister(addr);
err_free:
    free(r);
    return rc;
}

static void cuda_host_unregister(struct pf_gpu_host_reg *rp)
{
    struct cuda_reg *r = pf_container_of(rp, struct cuda_reg, base);
    struct cuda_gpu *g = cg(rp->gpu);
    pthread_rwlock_wrlock(&g->lock);
    for (struct cuda_reg **pp = &g->regs; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    pthread_rwlock_unlock(&g->lock);
    /* the registration lives in the first opened device's context (portable) */
    int rc = cuda_set_device(g, 0);
    if (rc == 0)
        CUDA_CALL(rc, cudaHostUnregister(rp->addr));
    free(r);
}

/* ------------------------------------------------------------------ streams */

/* Polls the stream's event (recorded by the caller) until it completes or timeout_ms
 * passed: a short spin, then sleeps growing to CUDA_POLL_MAX_NS. */
static int cuda_event_wait(struct cuda_stream *s, uint64_t timeout_ms)
{
    uint64_t start = pf_now_ns(), deadline, sleep_ns = 10000;
    if (!pf_mul_ok(timeout_ms, PF_NS_PER_MS, &deadline) || !pf_add_ok(deadline, start, &deadline))
        deadline = UINT64_MAX;
    for (;;) {
        cudaError_t e = cudaEventQuery(s->ev);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady) {
            static _Atomic bool site;
            return cuda_fail(e, "cudaEventQuery", &site); /* a copy failed on the GPU */
        }
        uint64_t now = pf_now_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        if (now - start < CUDA_SPIN_NS) {
            sched_yield();
            continue;
        }
        uint64_t left = deadline - now;
        uint64_t ns = sleep_ns < left ? sleep_ns : left;
        struct timespec ts = {.tv_sec = (time_t)(ns / PF_NS_PER_SEC),
                              .tv_nsec = (long)(ns % PF_NS_PER_SEC)};
        nanosleep(&ts, NULL);
        if (sleep_ns < CUDA_POLL_MAX_NS)
            sleep_ns *= 2;
    }
}

/* Records the event after everything enqueued so far and waits for it. */
static int cuda_stream_wait(struct cuda_stream *s, uint64_t timeout_ms)
{
    int rc = cuda_set_device(s->g, s->base.device);
    if (rc)
        return rc;
    CUDA_CALL(rc, cudaEventRecord(s->ev, s->st));
    if (rc)
        return rc;
    return cuda_event_wait(s, timeout_ms);
}

static int cuda_stream_create(struct pf_gpu *pg, int dev, struct pf_gpu_stream **s_p)
{
    struct cuda_gpu *g = cg(pg);
    if (dev < 0 || dev >= g->ndev)
        return -ENODEV;
    struct cuda_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    int rc = cuda_set_device(g, dev);
    if (rc)
        goto err_free;
    CUDA_CALL(rc, cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking));
    if (rc)
        goto err_free;
    CUDA_CALL(rc, cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming));
    if (rc)
        goto err_stream;
    s->base.gpu = pg;
    s->base.device = dev;
    s->g = g;
    *s_p = &s->base;
    return 0;
err_stream:
    cudaStreamDestroy(s->st);
err_free:
    free(s);
    return rc;
}

static void cuda_stream_destroy(struct pf_gpu_stream *sp)
{
    struct cuda_stream *s = cs(sp);
    int rc = cuda_stream_wait(s, CUDA_DESTROY_WAIT_MS);
    if (rc == -ETIMEDOUT)
        pf_warn("stream of GPU %d still busy after %u ms at destroy; its descriptor scratch "
                "(%zu bytes) is leaked",
                s->g->devs[sp->device].ordinal, CUDA_DESTROY_WAIT_MS, s->scratch_cap);
    else if (s->scratch)
        cudaFree(s->scratch);
    cudaEventDestroy(s->ev);
    cudaStreamDestroy(s->st);
    free(s->spans);
    free(s->kdesc);
    free(s);
}

/* ------------------------------------------------------------------ copies */

static const struct cuda_map *cuda_find_map(struct cuda_gpu *g, int dev, uint64_t p, uint64_t len,
                                            const struct cuda_map *hint)
{
    if (hint && p >= hint->base.base && len <= hint->base.size &&
        p - hint->base.base <= hint->base.size - len)
        return hint;
    for (const struct cuda_map *m = g->maps; m; m = m->next)
        if (m->base.device == dev && p >= m->base.base && len <= m->base.size &&
            p - m->base.base <= m->base.size - len)
            return m;
    return NULL;
}

static const struct cuda_reg *cuda_find_reg(struct cuda_gpu *g, uint64_t p, uint64_t len,
                                            const struct cuda_reg *hint)
{
    if (hint && p >= (uint64_t)(uintptr_t)hint->base.addr && len <= hint->base.len &&
        p - (uint64_t)(uintptr_t)hint->base.addr <= hint->base.len - len)
        return hint;
    for (const struct cuda_reg *r = g->regs; r; r = r->next) {
        uint64_t b = (uint64_t)(uintptr_t)r->base.addr;
        if (p >= b && len <= r->base.len && p - b <= r->base.len - len)
            return r;
    }
    return NULL;
}

static int cuda_grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n = n > SIZE_MAX / 2 ? need : n * 2;
    if (n > SIZE_MAX / elem)
        return -ENOMEM;
    void *p = realloc(*buf, n * elem);
    if (!p)
        return -ENOMEM;
    *buf = p;
    *cap = n;
    return 0;
}

/* Validates the descriptors and turns them into spans (host alias in kernel mode). */
static int cuda_build_spans(struct cuda_stream *s, enum pf_copy_mode mode,
                            const struct pf_copy_desc *d, size_t n, size_t *nspans_p)
{
    struct cuda_gpu *g = s->g;
    void *spans = s->spans;
    int rc = cuda_grow(&spans, &s->spans_cap, n, sizeof(struct pf_cuda_span));
    s->spans = spans;
    if (rc)
        return rc;
    const struct cuda_map *mh = NULL;
    const struct cuda_reg *rh = NULL;
    size_t k = 0;
    pthread_rwlock_rdlock(&g->lock);
    for (size_t i = 0; i < n; i++) {
        if (d[i].len == 0)
            continue;
        uint64_t host = (uint64_t)(uintptr_t)d[i].host;
        const struct cuda_map *m = cuda_find_map(g, s->base.device, d[i].dev, d[i].len, mh);
        if (!m) {
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "copy %zu of %zu: device range 0x%llx+%llu is outside every "
                               "mapping of GPU %d",
                               i, n, (unsigned long long)d[i].dev, (unsigned long long)d[i].len,
                               g->devs[s->base.device].ordinal);
            rc = -EFAULT;
            break;
        }
        const struct cuda_reg *r = cuda_find_reg(g, host, d[i].len, rh);
        if (!r) {
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "copy %zu of %zu: host range %p+%llu is not registered memory", i, n,
                               d[i].host, (unsigned long long)d[i].len);
            rc = -EFAULT;
            break;
        }
        mh = m;
        rh = r;
        s->spans[k++] = (struct pf_cuda_span){
            .dev = d[i].dev,
            .host = mode == PF_COPY_MODE_KERNEL
                        ? r->devptr + (host - (uint64_t)(uintptr_t)r->base.addr)
                        : host,
            .len = d[i].len,
            .dev_alloc = m->alloc->id,
            .host_alloc = r->id,
        };
    }
    pthread_rwlock_unlock(&g->lock);
    if (rc)
        return rc;
    *nspans_p = k;
    return 0;
}

static int cuda_copy_direct(struct cuda_stream *s, enum pf_copy_dir dir, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct pf_cuda_span *p = &s->spans[i];
        if (dir == PF_COPY_D2H)
            CUDA_CALL(rc, cudaMemcpyAsync((void *)(uintptr_t)p->host, (void *)(uintptr_t)p->dev,
                                          p->len, cudaMemcpyDeviceToHost, s->st));
        else
            CUDA_CALL(rc, cudaMemcpyAsync((void *)(uintptr_t)p->dev, (void *)(uintptr_t)p->host,
                                          p->len, cudaMemcpyHostToDevice, s->st));
    }
    return rc;
}

static int cuda_copy_kernel(struct cuda_stream *s, enum pf_copy_dir dir, size_t n)
{
    size_t nk = pf_cuda_kdesc_count(s->spans, n, PF_CUDA_KERNEL_CHUNK);
    if (nk == 0)
        return 0;
    if (nk > SIZE_MAX / sizeof(struct pf_cuda_kdesc))
        return -ENOMEM;
    void *kd = s->kdesc;
    int rc = cuda_grow(&kd, &s->kdesc_cap, nk, sizeof(struct pf_cuda_kdesc));
    s->kdesc = kd;
    if (rc)
        return rc;
    pf_cuda_kdesc_build(s->spans, n, PF_CUDA_KERNEL_CHUNK, dir == PF_COPY_D2H, s->kdesc);
    size_t bytes = nk * sizeof(struct pf_cuda_kdesc);
    if (bytes > s->scratch_cap) {
        /* grow-only: the old scratch may still feed an earlier launch of this stream */
        size_t cap = s->scratch_cap ? s->scratch_cap : CUDA_SCRATCH_MIN;
        while (cap < bytes)
            cap *= 2;
        if (s->scratch) {
            rc = cuda_stream_wait(s, CUDA_GROW_WAIT_MS);
            if (rc)
                return rc;
            cudaFree(s->scratch);
            s->scratch = NULL;
            s->scratch_cap = 0;
        }
        CUDA_CALL(rc, cudaMalloc(&s->scratch, cap));
        if (rc) {
            s->scratch = NULL;
            return rc;
        }
        s->scratch_cap = cap;
    }
    /* Pageable source: cudaMemcpyAsync stages it before returning, so the staging array
     * may be rewritten by the next batch while this one is still queued. */
    CUDA_CALL(rc, cudaMemcpyAsync(s->scratch, s->kdesc, bytes, cudaMemcpyHostToDevice, s->st));
    if (rc)
        return rc;
    CUDA_CALL(rc, pf_cuda_kernel_launch(s->scratch, nk, s->st));
    return rc;
}

static int cuda_copy_batch(struct pf_gpu_stream *sp, enum pf_copy_dir dir, enum pf_copy_mode mode,
                           const struct pf_copy_desc *d, size_t n)
{
    struct cuda_stream *s = cs(sp);
    if (dir != PF_COPY_D2H && dir != PF_COPY_H2D)
        return -EINVAL;
    if (mode != PF_COPY_MODE_DIRECT && mode != PF_COPY_MODE_KERNEL)
        return -EINVAL;
    if (n == 0)
        return 0;
    size_t ns;
    int rc = cuda_build_spans(s, mode, d, n, &ns);
    if (rc)
        return rc;
    ns = pf_cuda_spans_merge(s->spans, ns, UINT64_MAX);
    if (ns == 0)
        return 0;
    rc = cuda_set_device(s->g, sp->device);
    if (rc)
        return rc;
    pf_trace("copy_batch %s %s: %zu descriptors -> %zu ranges", dir == PF_COPY_D2H ? "D2H" : "H2D",
             mode == PF_COPY_MODE_KERNEL ? "kernel" : "direct", n, ns);
    if (mode == PF_COPY_MODE_DIRECT)
        return cuda_copy_direct(s, dir, ns);
    return cuda_copy_kernel(s, dir, ns);
}

static int cuda_stream_sync(struct pf_gpu_stream *sp, uint64_t timeout_ms)
{
    return cuda_stream_wait(cs(sp), timeout_ms);
}

/* ------------------------------------------------------------------ open / close */

static void cuda_close(struct pf_gpu *pg)
{
    struct cuda_gpu *g = cg(pg);
    /* the core closes its mappings and registrations first; anything left is released */
    while (g->maps)
        cuda_ipc_close(&g->maps->base);
    while (g->regs)
        cuda_host_unregister(&g->regs->base);
    pthread_rwlock_destroy(&g->lock);
    pthread_mutex_destroy(&g->ipc_mu);
    free(g);
}

static int cuda_dev_probe(struct cuda_dev *d, int ordinal)
{
    struct cudaDeviceProp prop;
    int rc;
    CUDA_CALL(rc, cudaGetDeviceProperties(&prop, ordinal));
    if (rc)
        return rc;
    d->ordinal = ordinal;
    memcpy(d->uuid, prop.uuid.bytes, sizeof(d->uuid));
    size_t nl = strnlen(prop.name, sizeof(d->name) - 1);
    memcpy(d->name, prop.name, nl);
    d->name[nl] = '\0';
    d->total_mem = prop.totalGlobalMem;
    d->can_map_host = prop.canMapHostMemory != 0;
    char raw[32];
    CUDA_CALL(rc, cudaDeviceGetPCIBusId(raw, sizeof(raw), ordinal));
    if (rc)
        return rc;
    if (pf_cuda_busid_normalize(raw, d->busid, sizeof(d->busid)) != 0)
        snprintf(d->busid, sizeof(d->busid), "%s", raw);
    d->numa = pf_cuda_numa_node("/sys", d->busid);
    /* create the primary context now: errors show at start-up, not on the first copy */
    CUDA_CALL(rc, cudaSetDevice(ordinal));
    if (rc)
        return rc;
    if (!d->can_map_host)
        pf_warn("GPU %d (%s) cannot map host memory: TRANSFER_MODE_KERNEL will fail on it", ordinal,
                d->name);
    char uuid[48];
    pf_cuda_uuid_format(d->uuid, uuid, sizeof(uuid));
    pf_debug("GPU %d: %s %s, PCI %s, NUMA node %d, %llu MiB", ordinal, d->name, uuid, d->busid,
             d->numa, (unsigned long long)(d->total_mem >> 20));
    return 0;
}

static int cuda_open(const struct pf_gpu_config *cfg, struct pf_gpu **g_p)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        /* whatever the cause, there is no usable GPU: -ENODEV lets "auto" fall back */
        if (e == cudaSuccess)
            pf_info("no usable CUDA GPU: 0 devices");
        else if (pf_cuda_no_gpu(e))
            pf_info("no usable CUDA GPU: %s (CUDA error %d)", cudaGetErrorString(e), (int)e);
        else
            pf_warn("no usable CUDA GPU: cudaGetDeviceCount: %s (CUDA error %d)",
                    cudaGetErrorString(e), (int)e);
        return -ENODEV;
    }
    size_t n = cfg && cfg->devices ? cfg->ndevices : (size_t)count;
    if (n == 0 || n > CUDA_MAX_DEVS) {
        pf_error("--devices: %zu devices requested, between 1 and %d supported", n, CUDA_MAX_DEVS);
        return -EINVAL;
    }
    struct cuda_gpu *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int ord = cfg && cfg->devices ? cfg->devices[i] : (int)i;
        if (ord < 0 || ord >= count) {
            pf_error("--devices: CUDA device %d does not exist (this process sees %d: 0..%d)", ord,
                     count, count - 1);
            rc = -ENODEV;
            goto err_free;
        }
        rc = cuda_dev_probe(&g->devs[i], ord);
        if (rc)
            goto err_free;
        g->ndev = (int)i + 1;
    }
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult qr;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &qr) == cudaSuccess &&
        qr == cudaDriverEntryPointSuccess && fn)
        g->addr_range = (cuda_addr_range_fn)fn;
    else
        pf_debug("cuMemGetAddressRange not available: IpcTensor sizes are not checked against "
                 "their allocation");
    pthread_mutex_init(&g->ipc_mu, NULL);
    pthread_rwlock_init(&g->lock, NULL);
    g->base.ops = &cuda_ops;
    pf_info("CUDA backend: %d of %d GPU(s) opened", g->ndev, count);
    *g_p = &g->base;
    return 0;
err_free:
    free(g);
    return rc;
}

static const struct pf_gpu_ops cuda_ops = {
    .name = "cuda",
    .device_count = cuda_count,
    .device_info = cuda_info,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .copy_batch = cuda_copy_batch,
    .stream_sync = cuda_stream_sync,
    .close = cuda_close,
};

static const struct pf_gpu_backend cuda_backend = {
    .name = "cuda",
    .hardware = 1,
    .ops = &cuda_ops,
    .open = cuda_open,
};

int pf_cuda_register(void)
{
    return pf_hal_register_gpu(&cuda_backend);
}

/* Streams and copies of the CUDA backend.
 *
 * Each pf_gpu_stream is one non-blocking CUstream plus one event. copy_batch validates
 * every descriptor against the mappings of the stream's device and the host registrations
 * (-EFAULT, nothing enqueued), splits a descriptor that crosses a registration chunk
 * (cuda_host.c), merges ranges adjacent on both sides inside one allocation and one chunk
 * (cuda_merge.c), then:
 *   direct: one cuMemcpyBatchAsync per batch (CUDA 12.8+ drivers, unless
 *           --gpu-copy-batch off), else one cuMemcpyDtoHAsync/HtoDAsync per merged range;
 *   kernel: the ranges are cut into 64 KiB pieces whose descriptors are written to a
 *           pinned staging slot (cuMemAllocHost), uploaded to the slot's device buffer and
 *           consumed by one launch of the copy kernel (cuda_kernel.cu as PTX). A stream has
 *           CUDA_KSLOTS slots, each guarded by an event recorded after its launch, so
 *           several kernel batches are in flight at once and nothing is freed or
 *           reallocated on the copy path (slots are allocated on first use, freed at
 *           stream destroy).
 * stream_sync records the event and polls it until the deadline (-ETIMEDOUT leaves the
 * work in flight). A sticky error anywhere marks the backend dead (cuda.c). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PF_LOG_MOD "cuda"
#include "pf/clock.h"
#include "pf/log.h"

#include "cuda_backend.h"

#define CUDA_DESTROY_WAIT_MS 60000u
#define CUDA_SLOT_WAIT_MS    60000u
#define CUDA_SPIN_NS         50000u
#define CUDA_POLL_MAX_NS     500000u
#define CUDA_KSLOTS          4u
#define CUDA_KSLOT_DESCS     8192u /* 192 KiB of descriptors: 512 MiB of 64 KiB pieces */
#define CUDA_BATCH_MAX       4096u /* copies per cuMemcpyBatchAsync call */

struct cuda_kslot {
    struct pf_cuda_kdesc *host; /* pinned staging (cuMemAllocHost) */
    CUdeviceptr dev;
    CUevent done; /* recorded after the launch that reads this slot */
    bool busy;
};

struct cuda_stream {
    struct pf_gpu_stream base;
    struct cuda_gpu *g;
    CUstream st;
    CUevent ev;
    struct pf_cuda_span *spans; /* grow-only scratch of copy_batch */
    size_t spans_cap;
    struct pf_cuda_kdesc *kdesc; /* the batch's descriptors before staging */
    size_t kdesc_cap;
    struct cuda_kslot slots[CUDA_KSLOTS];
    unsigned next_slot;
    bool slots_ready;
    CUdeviceptr *bdst, *bsrc; /* cuMemcpyBatchAsync arrays, read during the call */
    size_t *bsize;
    size_t bcap;
};

static struct cuda_stream *cs(struct pf_gpu_stream *s)
{
    return pf_container_of(s, struct cuda_stream, base);
}

/* Polls ev until it completes or timeout_ms passed: a short spin, then sleeps growing to
 * CUDA_POLL_MAX_NS. */
static int cuda_event_wait(struct cuda_gpu *g, CUevent ev, uint64_t timeout_ms)
{
    uint64_t start = pf_now_ns(), deadline, sleep_ns = 10000;
    if (!pf_mul_ok(timeout_ms, PF_NS_PER_MS, &deadline) || !pf_add_ok(deadline, start, &deadline))
        deadline = UINT64_MAX;
    for (;;) {
        if (cuda_is_dead(g))
            return -ENOTRECOVERABLE;
        CUresult e = g->cu.EventQuery(ev);
        if (e == CUDA_SUCCESS)
            return 0;
        if (e != CUDA_ERROR_NOT_READY) {
            static _Atomic bool site;
            return cuda_fail(g, e, "cuEventQuery", &site); /* a copy failed on the GPU */
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
    struct cuda_gpu *g = s->g;
    if (cuda_is_dead(g))
        return -ENOTRECOVERABLE;
    int rc = cuda_ctx(g, s->base.device);
    if (rc)
        return rc;
    CU_CALL(g, rc, EventRecord, s->ev, s->st);
    if (rc)
        return rc;
    return cuda_event_wait(g, s->ev, timeout_ms);
}

int cuda_stream_create(struct pf_gpu *pg, int dev, struct pf_gpu_stream **s_p)
{
    struct cuda_gpu *g = cg(pg);
    if (dev < 0 || dev >= g->ndev)
        return -ENODEV;
    if (cuda_is_dead(g))
        return -ENOTRECOVERABLE;
    struct cuda_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    int rc = cuda_ctx(g, dev);
    if (rc)
        goto err_free;
    CU_CALL(g, rc, StreamCreate, &s->st, CU_STREAM_NON_BLOCKING);
    if (rc)
        goto err_free;
    CU_CALL(g, rc, EventCreate, &s->ev, CU_EVENT_DISABLE_TIMING);
    if (rc)
        goto err_stream;
    s->base.gpu = pg;
    s->base.device = dev;
    s->g = g;
    *s_p = &s->base;
    return 0;
err_stream:
    g->cu.StreamDestroy(s->st);
err_free:
    free(s);
    return rc;
}

static void slots_free(struct cuda_stream *s, bool leak_device)
{
    struct cuda_gpu *g = s->g;
    for (unsigned i = 0; i < CUDA_KSLOTS; i++) {
        struct cuda_kslot *k = &s->slots[i];
        if (k->done)
            g->cu.EventDestroy(k->done);
        if (k->dev && !leak_device)
            g->cu.MemFree(k->dev);
        if (k->host && !leak_device)
            g->cu.MemFreeHost(k->host);
        memset(k, 0, sizeof(*k));
    }
}

void cuda_stream_destroy(struct pf_gpu_stream *sp)
{
    struct cuda_stream *s = cs(sp);
    struct cuda_gpu *g = s->g;
    if (!cuda_is_dead(g)) {
        int rc = cuda_stream_wait(s, CUDA_DESTROY_WAIT_MS);
        bool busy = rc == -ETIMEDOUT;
        if (busy)
            pf_warn("stream of GPU %d still busy after %u ms at destroy; its descriptor slots "
                    "are leaked",
                    g->devs[sp->device].ordinal, CUDA_DESTROY_WAIT_MS);
        if (!cuda_is_dead(g)) {
            slots_free(s, busy);
            g->cu.EventDestroy(s->ev);
            g->cu.StreamDestroy(s->st);
        }
    }
    free(s->spans);
    free(s->kdesc);
    free(s->bdst);
    free(s->bsrc);
    free(s->bsize);
    free(s);
}

/* ------------------------------------------------------------------ validation */

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

static int span_push(struct cuda_stream *s, size_t *k, struct pf_cuda_span sp)
{
    void *p = s->spans;
    int rc = cuda_grow(&p, &s->spans_cap, *k + 1, sizeof(struct pf_cuda_span));
    s->spans = p;
    if (rc)
        return rc;
    s->spans[(*k)++] = sp;
    return 0;
}

/* Validates the descriptors and turns them into spans (host alias in kernel mode), one
 * per registration chunk a descriptor touches. */
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
    for (size_t i = 0; i < n && rc == 0; i++) {
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
        size_t c;
        const struct cuda_reg *r = cuda_find_reg(g, host, d[i].len, rh, &c);
        if (!r) {
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "copy %zu of %zu: host range %p+%llu is not registered memory", i, n,
                               d[i].host, (unsigned long long)d[i].len);
            rc = -EFAULT;
            break;
        }
        mh = m;
        rh = r;
        uint64_t off = host - (uint64_t)(uintptr_t)r->base.addr, dev = d[i].dev, left = d[i].len;
        while (left > 0 && rc == 0) { /* one span per chunk: a copy never crosses one */
            const struct cuda_chunk *ch = &r->chunks[c++];
            uint64_t piece = ch->off + ch->len - off;
            if (piece > left)
                piece = left;
            rc = span_push(s, &k,
                           (struct pf_cuda_span){
                               .dev = dev,
                               .host = mode == PF_COPY_MODE_KERNEL
                                           ? ch->devptr + (off - ch->off)
                                           : (uint64_t)(uintptr_t)r->base.addr + off,
                               .len = piece,
                               .dev_alloc = m->alloc->id,
                               .host_alloc = ch->id,
                           });
            off += piece;
            dev += piece;
            left -= piece;
        }
    }
    pthread_rwlock_unlock(&g->lock);
    if (rc)
        return rc;
    *nspans_p = k;
    return 0;
}

/* ------------------------------------------------------------------ direct mode */

static int cuda_copy_ranges(struct cuda_stream *s, enum pf_copy_dir dir, size_t n)
{
    struct cuda_gpu *g = s->g;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct pf_cuda_span *p = &s->spans[i];
        if (dir == PF_COPY_D2H)
            CU_CALL(g, rc, MemcpyDtoHAsync, (void *)(uintptr_t)p->host, p->dev, p->len, s->st);
        else
            CU_CALL(g, rc, MemcpyHtoDAsync, p->dev, (void *)(uintptr_t)p->host, p->len, s->st);
    }
    return rc;
}

/* cuMemcpyBatchAsync (cuda.h, CUDA 12.8): one attribute for the whole batch, source read in
 * stream order (CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: the source may be written by work
 * queued before the copy); the arrays are only read during the call. */
static int cuda_copy_batched(struct cuda_stream *s, enum pf_copy_dir dir, size_t n)
{
    struct cuda_gpu *g = s->g;
    size_t need = n < CUDA_BATCH_MAX ? n : CUDA_BATCH_MAX;
    if (need > s->bcap) { /* grow-only, the three arrays together */
        CUdeviceptr *dst = realloc(s->bdst, need * sizeof(*dst));
        if (dst)
            s->bdst = dst;
        CUdeviceptr *src = realloc(s->bsrc, need * sizeof(*src));
        if (src)
            s->bsrc = src;
        size_t *sz = realloc(s->bsize, need * sizeof(*sz));
        if (sz)
            s->bsize = sz;
        if (!dst || !src || !sz)
            return -ENOMEM;
        s->bcap = need;
    }
    int rc = 0;
    CUmemcpyAttributes attr = {
        .srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        .srcLocHint = {.type = dir == PF_COPY_D2H ? CU_MEM_LOCATION_TYPE_DEVICE
                                                  : CU_MEM_LOCATION_TYPE_HOST,
                       .id = dir == PF_COPY_D2H ? g->devs[s->base.device].dev : 0},
        .dstLocHint = {.type = dir == PF_COPY_D2H ? CU_MEM_LOCATION_TYPE_HOST
                                                  : CU_MEM_LOCATION_TYPE_DEVICE,
                       .id = dir == PF_COPY_D2H ? 0 : g->devs[s->base.device].dev},
        .flags = 0,
    };
    for (size_t i = 0; i < n && rc == 0;) {
        size_t cnt = n - i < CUDA_BATCH_MAX ? n - i : CUDA_BATCH_MAX;
        for (size_t j = 0; j < cnt; j++) {
            const struct pf_cuda_span *p = &s->spans[i + j];
            s->bdst[j] = dir == PF_COPY_D2H ? (CUdeviceptr)p->host : p->dev;
            s->bsrc[j] = dir == PF_COPY_D2H ? p->dev : (CUdeviceptr)p->host;
            s->bsize[j] = p->len;
        }
        size_t idx0 = 0, fail = SIZE_MAX;
        CU_CALL(g, rc, MemcpyBatchAsync, s->bdst, s->bsrc, s->bsize, cnt, &attr, &idx0, 1, &fail,
                s->st);
        i += cnt;
    }
    return rc;
}

/* ------------------------------------------------------------------ kernel mode */

static int slots_setup(struct cuda_stream *s)
{
    struct cuda_gpu *g = s->g;
    int rc = 0;
    size_t bytes = (size_t)CUDA_KSLOT_DESCS * sizeof(struct pf_cuda_kdesc);
    for (unsigned i = 0; i < CUDA_KSLOTS && rc == 0; i++) {
        struct cuda_kslot *k = &s->slots[i];
        void *h = NULL;
        CU_CALL(g, rc, MemAllocHost, &h, bytes);
        if (rc)
            break;
        k->host = h;
        CU_CALL(g, rc, MemAlloc, &k->dev, bytes);
        if (rc == 0)
            CU_CALL(g, rc, EventCreate, &k->done, CU_EVENT_DISABLE_TIMING);
    }
    if (rc) {
        slots_free(s, false);
        return rc;
    }
    s->slots_ready = true;
    return 0;
}

static int cuda_copy_kernel(struct cuda_stream *s, enum pf_copy_dir dir, size_t n)
{
    struct cuda_gpu *g = s->g;
    const struct cuda_dev *dv = &g->devs[s->base.device];
    if (!dv->kfn) {
        pf_log_ratelimited(PF_LOG_ERROR, 1000,
                           "TRANSFER_MODE_KERNEL on GPU %d: the copy kernel did not load at "
                           "start (see the start-up log); use TRANSFER_MODE_DIRECT",
                           dv->ordinal);
        return -ENOEXEC;
    }
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
    if (!s->slots_ready && (rc = slots_setup(s)) != 0)
        return rc;
    pf_cuda_kdesc_build(s->spans, n, PF_CUDA_KERNEL_CHUNK, dir == PF_COPY_D2H, s->kdesc);
    for (size_t i = 0; i < nk && rc == 0;) {
        size_t cnt = nk - i < CUDA_KSLOT_DESCS ? nk - i : CUDA_KSLOT_DESCS;
        struct cuda_kslot *k = &s->slots[s->next_slot];
        s->next_slot = (s->next_slot + 1) % CUDA_KSLOTS;
        /* the slot's staging is rewritten only after its previous launch finished */
        if (k->busy && (rc = cuda_event_wait(g, k->done, CUDA_SLOT_WAIT_MS)) != 0)
            return rc;
        k->busy = false;
        memcpy(k->host, s->kdesc + i, cnt * sizeof(struct pf_cuda_kdesc));
        CU_CALL(g, rc, MemcpyHtoDAsync, k->dev, k->host, cnt * sizeof(struct pf_cuda_kdesc), s->st);
        if (rc)
            return rc;
        CUdeviceptr descp = k->dev;
        uint64_t count = cnt;
        void *params[] = {&descp, &count};
        unsigned grid = cnt < PF_CUDA_KERNEL_MAX_GRID ? (unsigned)cnt : PF_CUDA_KERNEL_MAX_GRID;
        CU_CALL(g, rc, LaunchKernel, dv->kfn, grid, 1, 1, PF_CUDA_KERNEL_THREADS, 1, 1, 0, s->st,
                params, NULL);
        if (rc)
            return rc;
        CU_CALL(g, rc, EventRecord, k->done, s->st);
        if (rc)
            return rc;
        k->busy = true;
        i += cnt;
    }
    return rc;
}

int cuda_copy_batch(struct pf_gpu_stream *sp, enum pf_copy_dir dir, enum pf_copy_mode mode,
                    const struct pf_copy_desc *d, size_t n)
{
    struct cuda_stream *s = cs(sp);
    if (dir != PF_COPY_D2H && dir != PF_COPY_H2D)
        return -EINVAL;
    if (mode != PF_COPY_MODE_DIRECT && mode != PF_COPY_MODE_KERNEL)
        return -EINVAL;
    if (n == 0)
        return 0;
    if (cuda_is_dead(s->g))
        return -ENOTRECOVERABLE;
    size_t ns;
    int rc = cuda_build_spans(s, mode, d, n, &ns);
    if (rc)
        return rc;
    ns = pf_cuda_spans_merge(s->spans, ns, UINT64_MAX);
    if (ns == 0)
        return 0;
    rc = cuda_ctx(s->g, sp->device);
    if (rc)
        return rc;
    pf_trace("copy_batch %s %s: %zu descriptors -> %zu ranges", dir == PF_COPY_D2H ? "D2H" : "H2D",
             mode == PF_COPY_MODE_KERNEL ? "kernel" : "direct", n, ns);
    if (mode == PF_COPY_MODE_KERNEL)
        return cuda_copy_kernel(s, dir, ns);
    if (s->g->batch && ns > 1)
        return cuda_copy_batched(s, dir, ns);
    return cuda_copy_ranges(s, dir, ns);
}

int cuda_stream_sync(struct pf_gpu_stream *sp, uint64_t timeout_ms)
{
    return cuda_stream_wait(cs(sp), timeout_ms);
}

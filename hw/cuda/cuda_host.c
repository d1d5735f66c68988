/* Host memory registration of the CUDA backend: chunked, parallel cuMemHostRegister.
 *
 * One registration of a whole pool fails for large pools (vLLM #51080: a single
 * cudaHostRegister of >= 512 GiB fails) and pins serially at about 0.1 s/GB. So a
 * registration is cut into chunks of at most PF_CUDA_REG_CHUNK (64 GiB), with boundaries
 * on 2 MiB (huge page) addresses so no page belongs to two chunks, and the chunks are
 * registered by up to CUDA_REG_THREADS threads at once, progress logged at info.
 *
 * Each chunk is its own CUDA registration with its own device alias, so a copy must not
 * cross a chunk boundary: copy_batch (cuda_copy.c) splits a descriptor that does at the
 * boundary and never merges across it; the pool's allocator needs to know nothing.
 *
 * Flags: CU_MEMHOSTREGISTER_PORTABLE (usable from every context) | DEVICEMAP (a device
 * alias for the copy kernel, cuMemHostGetDevicePointer). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "cuda"
#include "pf/clock.h"
#include "pf/log.h"

#include "cuda_backend.h"

#define CUDA_REG_THREADS 8u
#define CUDA_REG_ALIGN   (2ull << 20)

static uint64_t reg_chunk = PF_CUDA_REG_CHUNK;

void pf_cuda_test_set_reg_chunk(uint64_t bytes)
{
    reg_chunk = bytes ? bytes : PF_CUDA_REG_CHUNK;
}

struct reg_job {
    struct cuda_gpu *g;
    struct cuda_reg *r;
    uint64_t t0;
    _Atomic size_t next;
    _Atomic size_t done;
    _Atomic int rc;
};

static void *reg_worker(void *arg)
{
    struct reg_job *j = arg;
    struct cuda_gpu *g = j->g;
    struct cuda_reg *r = j->r;
    int rc = cuda_ctx(g, 0);
    if (rc) {
        int zero = 0;
        atomic_compare_exchange_strong(&j->rc, &zero, rc);
        return NULL;
    }
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= r->nchunks || atomic_load(&j->rc) != 0)
            break;
        struct cuda_chunk *c = &r->chunks[i];
        char *p = (char *)r->base.addr + c->off;
        CU_CALL(g, rc, MemHostRegister, p, c->len,
                CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
        if (rc == 0) {
            c->registered = true;
            CUdeviceptr dp = 0;
            CU_CALL(g, rc, MemHostGetDevicePointer, &dp, p, 0);
            c->devptr = dp;
        }
        if (rc) {
            pf_error("pinning host memory: chunk %zu of %zu (%llu bytes at %p) failed: %s", i + 1,
                     r->nchunks, (unsigned long long)c->len, (void *)p, strerror(-rc));
            int zero = 0;
            atomic_compare_exchange_strong(&j->rc, &zero, rc);
            break;
        }
        size_t done = atomic_fetch_add(&j->done, 1) + 1;
        if (r->nchunks > 1)
            pf_info("pinning host memory: %zu of %zu chunks (%.1f GiB) done after %.1f s", done,
                    r->nchunks, (double)c->len / (double)(1ull << 30),
                    (double)(pf_now_ns() - j->t0) / 1e9);
    }
    return NULL;
}

/* Cuts addr..addr+len into chunks of <= reg_chunk on CUDA_REG_ALIGN boundaries. */
static int reg_plan(struct cuda_reg *r, uint64_t addr, uint64_t len)
{
    uint64_t chunk = reg_chunk;
    if (chunk > CUDA_REG_ALIGN)
        chunk &= ~(CUDA_REG_ALIGN - 1);
    size_t cap = (size_t)(len / chunk) + 2;
    r->chunks = calloc(cap, sizeof(*r->chunks));
    if (!r->chunks)
        return -ENOMEM;
    uint64_t off = 0;
    while (off < len) {
        uint64_t end = len - off <= chunk ? len : off + chunk;
        if (end < len && chunk >= CUDA_REG_ALIGN) {
            uint64_t abs = (addr + end) & ~(CUDA_REG_ALIGN - 1); /* boundary on a huge page */
            if (abs > addr + off)
                end = abs - addr;
        }
        r->chunks[r->nchunks++] = (struct cuda_chunk){.off = off, .len = end - off};
        off = end;
    }
    return 0;
}

static void reg_release(struct cuda_gpu *g, struct cuda_reg *r)
{
    if (!cuda_is_dead(g) && cuda_ctx(g, 0) == 0) {
        for (size_t i = 0; i < r->nchunks; i++) {
            if (!r->chunks[i].registered)
                continue;
            int rc;
            CU_CALL(g, rc, MemHostUnregister, (char *)r->base.addr + r->chunks[i].off);
            (void)rc;
        }
    }
    free(r->chunks);
    free(r);
}

int cuda_host_register(struct pf_gpu *pg, void *addr, size_t len, struct pf_gpu_host_reg **r_p)
{
    struct cuda_gpu *g = cg(pg);
    if (!addr || !len)
        return -EINVAL;
    if (cuda_is_dead(g))
        return -ENOTRECOVERABLE;
    struct cuda_reg *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->base.gpu = pg;
    r->base.addr = addr;
    r->base.len = len;
    int rc = reg_plan(r, (uint64_t)(uintptr_t)addr, len);
    if (rc) {
        free(r);
        return rc;
    }
    struct reg_job j = {.g = g, .r = r, .t0 = pf_now_ns()};
    unsigned nt = r->nchunks < CUDA_REG_THREADS ? (unsigned)r->nchunks : CUDA_REG_THREADS;
    pthread_t th[CUDA_REG_THREADS];
    unsigned started = 0;
    if (nt > 1) {
        pf_info("pinning %.1f GiB of host memory at %p: %zu chunks of <= %.1f GiB, %u threads",
                (double)len / (double)(1ull << 30), addr, r->nchunks,
                (double)reg_chunk / (double)(1ull << 30), nt);
        for (; started < nt; started++)
            if (pthread_create(&th[started], NULL, reg_worker, &j) != 0)
                break;
    }
    if (started == 0)
        reg_worker(&j); /* one chunk, or no thread could start: this thread does it all */
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    rc = atomic_load(&j.rc);
    if (rc) {
        reg_release(g, r);
        return rc;
    }
    for (size_t i = 0; i < r->nchunks; i++)
        r->chunks[i].id = cuda_new_id(g);
    double s = (double)(pf_now_ns() - j.t0) / 1e9;
    pf_info("pinned %.2f GiB of host memory at %p in %zu chunk(s) in %.2f s",
            (double)len / (double)(1ull << 30), addr, r->nchunks, s);
    pthread_rwlock_wrlock(&g->lock);
    r->next = g->regs;
    g->regs = r;
    pthread_rwlock_unlock(&g->lock);
    *r_p = &r->base;
    return 0;
}

void cuda_host_unregister(struct pf_gpu_host_reg *rp)
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
    reg_release(g, r);
}

static size_t reg_chunk_of(const struct cuda_reg *r, uint64_t off)
{
    size_t lo = 0, hi = r->nchunks - 1;
    while (lo < hi) {
        size_t mid = (lo + hi + 1) / 2;
        if (r->chunks[mid].off <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static bool reg_holds(const struct cuda_reg *r, uint64_t p, uint64_t len)
{
    uint64_t b = (uint64_t)(uintptr_t)r->base.addr;
    return p >= b && len <= r->base.len && p - b <= r->base.len - len;
}

const struct cuda_reg *cuda_find_reg(struct cuda_gpu *g, uint64_t p, uint64_t len,
                                     const struct cuda_reg *hint, size_t *chunk_p)
{
    const struct cuda_reg *r = hint && reg_holds(hint, p, len) ? hint : NULL;
    for (const struct cuda_reg *x = g->regs; !r && x; x = x->next)
        if (reg_holds(x, p, len))
            r = x;
    if (r)
        *chunk_p = reg_chunk_of(r, p - (uint64_t)(uintptr_t)r->base.addr);
    return r;
}

/* Helpers for the SSD store unit tests: a temporary directory, a small pinned pool (no
 * GPU), sealed blocks with seeded bytes in pool memory, a store over uring (optionally
 * gated or faulty) and byte-exact block comparison. Header-only (static functions). */
#ifndef PF_TEST_SSDTEST_H
#define PF_TEST_SSDTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gate.h"
#include "pf/block.h"
#include "pf/clock.h"
#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/pool.h"
#include "pf/ssd.h"
#include "pftest.h"

struct ssdt {
    char dir[256];
    struct pf_pool *pool;
    struct pf_blk *blk; /* the gate (over faulty:uring when a plan is given) */
    struct gate_blk *gate;
    struct pf_fault_plan *plan;
    struct pf_ssd *ssd;
};

static inline void ssdt_init(struct ssdt *t, uint64_t pool_size, const char *fault_spec)
{
    memset(t, 0, sizeof(*t));
    pf_log_set_level(PF_LOG_ERROR);
    snprintf(t->dir, sizeof(t->dir), "/tmp/pf-test-ssd.XXXXXX");
    assert_non_null(mkdtemp(t->dir));
    struct pf_pool_config pc = {.size = pool_size, .shards = 1, .skip_memcheck = true};
    char err[256];
    assert_int_equal(pf_pool_create(&pc, &t->pool, err, sizeof(err)), 0);
    pf_hal_init();
    if (fault_spec)
        assert_int_equal(pf_fault_plan_parse(fault_spec, &t->plan, err, sizeof(err)), 0);
    struct pf_blk_config bc = {.faults = t->plan};
    struct pf_blk *inner;
    int rc = pf_hal_blk_open("uring", &bc, &inner, NULL, 0, err, sizeof(err));
    if (rc == -ENODEV) {
        printf("SKIP: io_uring is not usable on this host (%s)\n", err);
        exit(77);
    }
    assert_int_equal(rc, 0);
    t->gate = gate_wrap(inner);
    assert_non_null(t->gate);
    t->blk = &t->gate->base;
}

/* Default store configuration over t's backend and pool: one file of capacity bytes. */
static inline struct pf_ssd_config ssdt_config(struct ssdt *t, uint64_t capacity)
{
    static char path[300];
    snprintf(path, sizeof(path), "%s/cache.dat", t->dir);
    static const char *paths[1];
    paths[0] = path;
    struct pf_ssd_config c = {
        .paths = paths,
        .npaths = 1,
        .capacity = capacity,
        .integrity = true,
        .io_timeout_ms = 10000,
        .blk = t->blk,
        .pool = t->pool,
    };
    return c;
}

static inline void ssdt_open(struct ssdt *t, const struct pf_ssd_config *c)
{
    char err[512];
    int rc = pf_ssd_create(c, &t->ssd, err, sizeof(err));
    if (rc)
        fprintf(stderr, "pf_ssd_create: %s\n", err);
    assert_int_equal(rc, 0);
    /* count only the tier's block I/O: not the superblock read and write of the start */
    atomic_store(&t->gate->submitted[PF_BLK_READ], 0);
    atomic_store(&t->gate->submitted[PF_BLK_WRITE], 0);
}

static inline void ssdt_fini(struct ssdt *t)
{
    pf_ssd_destroy(t->ssd);
    t->ssd = NULL;
    pf_blk_close(t->blk);
    assert_int_equal(pf_pool_used(t->pool), 0); /* every staging/block byte came back */
    pf_pool_destroy(t->pool);
    pf_fault_plan_free(t->plan);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    assert_int_equal(system(cmd), 0);
}

static inline struct pf_block_key ssdt_key(uint32_t id)
{
    uint8_t h[32];
    pft_fill(h, sizeof(h), 42, id);
    struct pf_block_key k;
    uint32_t ns;
    /* an interned namespace: records carry its name, recovery interns it again */
    assert_int_equal(pf_ns_intern("ssdtest", &ns), 0);
    assert_int_equal(pf_key_make(ns, h, sizeof(h), &k), 0);
    return k;
}

/* A pointer to (a copy of) block b's key, for calls that take a key pointer. */
#define SSDT_KEY(b) ((struct pf_block_key[]){pf_block_key(b)})

/* A sealed block of nslots slots of nseg segments of seg_len bytes (stride rounded up to
 * 512), bytes from (seed, id). scatter: one allocation per segment with a gap after each
 * (no two segments adjacent); else one allocation for the whole block in disk order. */
static inline struct pf_block *ssdt_block(struct ssdt *t, uint32_t id, uint16_t nslots,
                                          uint32_t seg_len, uint8_t nseg, bool scatter)
{
    struct pf_block_key k = ssdt_key(id);
    struct pf_slot sl[64];
    memset(sl, 0, sizeof(sl));
    uint32_t stride = (seg_len + 511) / 512 * 512;
    struct pf_alloc *whole = NULL, *pads[2 * 64];
    size_t npads = 0;
    assert_true(nslots <= 64);
    if (!scatter)
        assert_int_equal(pf_pool_alloc(t->pool, (uint64_t)stride * nseg * nslots, -1, &whole), 0);
    for (uint16_t i = 0; i < nslots; i++) {
        struct pf_slot *s = &sl[i];
        s->seg_len = seg_len;
        s->seg_stride = stride;
        s->nseg = nseg;
        s->numa = (int16_t)(i % 2 ? 0 : -1);
        for (uint8_t g = 0; g < nseg; g++) {
            struct pf_alloc *a;
            uint8_t *p;
            if (scatter) {
                /* a pad allocation after each segment keeps segments apart */
                assert_int_equal(pf_pool_alloc(t->pool, stride, -1, &a), 0);
                assert_int_equal(pf_pool_alloc(t->pool, 512, -1, &pads[npads++]), 0);
                p = a->ptr;
            } else {
                a = whole;
                pf_alloc_get(a);
                p = (uint8_t *)whole->ptr + ((size_t)i * nseg + g) * stride;
            }
            pft_fill(p, stride, 7 + id, (uint64_t)i * 2 + g);
            if (g == 0) {
                s->k = p;
                s->ka = a;
            } else {
                s->v = p;
                s->va = a;
            }
        }
    }
    pf_alloc_put(whole);
    for (size_t i = 0; i < npads; i++)
        pf_alloc_put(pads[i]);
    pf_slots_checksum(sl, nslots);
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, nslots, sl, &b), 0);
    return b;
}

/* Same key, geometry and data bytes (seg_len of each segment). */
static inline bool ssdt_same(const struct pf_block *a, const struct pf_block *b)
{
    struct pf_block_key ka = pf_block_key(a);
    if (!pf_block_key_eq(b, &ka) || a->nslots != b->nslots)
        return false;
    for (uint16_t i = 0; i < a->nslots; i++) {
        struct pf_slot xs, ys, *x = &xs, *y = &ys;
        pf_block_slot(a, i, x);
        pf_block_slot(b, i, y);
        if (x->seg_len != y->seg_len || x->seg_stride != y->seg_stride || x->nseg != y->nseg ||
            x->numa != y->numa || x->checksum != y->checksum || x->has_checksum != y->has_checksum)
            return false;
        if (memcmp(x->k, y->k, x->seg_len) != 0)
            return false;
        if (x->nseg == 2 && memcmp(x->v, y->v, x->seg_len) != 0)
            return false;
    }
    return true;
}

static inline double ssdt_metric(const char *name)
{
    return pf_metric_value_of(name, NULL);
}

/* Offers blocks as one batch and waits for the writer. */
static inline void ssdt_write(struct ssdt *t, struct pf_block **b, size_t n)
{
    assert_int_equal(pf_ssd_offer(t->ssd, b, n), 0);
    assert_int_equal(pf_ssd_flush(t->ssd, 10000), 0);
}

static inline struct pf_ssd_stats ssdt_stats(struct ssdt *t)
{
    struct pf_ssd_stats st;
    pf_ssd_stats(t->ssd, &st);
    return st;
}

/* Waits (bounded) until cond(t) holds. */
#define SSDT_WAIT(cond)                                                                            \
    do {                                                                                           \
        uint64_t dl_ = pf_now_ns() + 10000 * PF_NS_PER_MS;                                         \
        while (!(cond)) {                                                                          \
            assert_true(pf_now_ns() < dl_);                                                        \
            usleep(1000);                                                                          \
        }                                                                                          \
    } while (0)

#endif

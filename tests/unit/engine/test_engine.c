/* The engine in-process with the sim GPU: sealing (a block is visible only when every slot
 * of every rank arrived), duplicate and late saves, in-flight GC, backing tiers and prefetch
 * tasks (Loading -> Ready, promotion class, promoted callback, misses), hooks, and
 * unregister dropping leases. */
#include <errno.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/pegaflow.h"
#include "engine/engine_internal.h"
#include "pf/hal.h"
#include "pf/metrics.h"

#define SEG 4096
#define NB  32

struct fx {
    struct pf_gpu *g;
    struct pf_engine *e;
    struct pf_simkv *kv[2];
    uint32_t ns;
};

static struct fx F;

static int setup(void **st)
{
    char chosen[32], err[256];
    struct pf_gpu_config gc = {.sim_default_devices = 2};
    pf_hal_init();
    assert_int_equal(pf_hal_gpu_open("sim", &gc, &F.g, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    struct pf_engine_config ec = {.gpu = F.g,
                                  .pool_size = 16 << 20,
                                  .integrity = true,
                                  .skip_memcheck = true,
                                  .inflight_ttl_ns = 300 * PF_NS_PER_MS,
                                  /* saves of 3+ blocks copy and checksum in chunks */
                                  .save_chunk_bytes = 2 * SEG + 1};
    assert_int_equal(pf_engine_create(&ec, &F.e, err, sizeof(err)), 0);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(pf_simkv_create(NB * SEG, r, &F.kv[r]), 0);
        uint8_t *p = pf_simkv_ptr(F.kv[r]);
        for (size_t i = 0; i < NB * SEG; i++)
            p[i] = (uint8_t)(i * 13 + r);
    }
    return 0;
}

static int teardown(void **st)
{
    pf_engine_destroy(F.e);
    pf_gpu_close(F.g);
    pf_simkv_destroy(F.kv[0]);
    pf_simkv_destroy(F.kv[1]);
    return 0;
}

static int reg(const char *inst, const char *ns, int rank, int world, const char *version)
{
    struct pf_engine_layer l = {
        .name = "ALL_LAYERS", .num_blocks = NB, .bytes_per_block = SEG, .segments = 1};
    l.ipc.kind = PF_IPC_SIM_SHM;
    l.ipc.size = NB * SEG;
    l.ipc.sim_device = rank;
    snprintf(l.ipc.shm_name, sizeof(l.ipc.shm_name), "%s", pf_simkv_name(F.kv[rank]));
    struct pf_engine_register r = {.instance_id = inst,
                                   .namespace_ = ns,
                                   .client_version = version ? version : PF_VERSION,
                                   .tp_rank = (uint32_t)rank,
                                   .tp_size = (uint32_t)world,
                                   .world_size = (uint32_t)world,
                                   .device_id = rank,
                                   .layers = &l,
                                   .nlayers = 1};
    char err[256];
    return pf_engine_register(F.e, &r, err, sizeof(err));
}

static uint8_t H[64][32];

static int save(const char *inst, int rank, uint32_t first, size_t n)
{
    uint32_t ids[64];
    struct pf_bytes hs[64];
    for (size_t i = 0; i < n; i++) {
        ids[i] = (uint32_t)(first + i);
        hs[i] = (struct pf_bytes){H[first + i], 32};
    }
    struct pf_engine_save_layer sl = {
        .name = "ALL_LAYERS", .block_ids = ids, .nids = n, .hashes = hs, .nhashes = n};
    char err[256];
    return pf_engine_save(F.e, inst, (uint32_t)rank, 0, rank, &sl, 1, err, sizeof(err));
}

static int query(const char *inst, const char *req, uint32_t first, size_t n,
                 struct pf_engine_query_result *res)
{
    struct pf_bytes hs[64];
    for (size_t i = 0; i < n; i++)
        hs[i] = (struct pf_bytes){H[first + i], 32};
    struct pf_engine_query q = {.instance_id = inst, .req_id = req, .hashes = hs, .n = n};
    char err[256];
    return pf_engine_query(F.e, &q, res, err, sizeof(err));
}

static void release(struct pf_engine_query_result *res)
{
    if (res->has_lease) {
        struct pf_bytes l = {res->lease, 16};
        char err[64];
        pf_engine_release(F.e, &l, err, sizeof(err));
    }
}

static void test_sealing(void **st)
{
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 32; j++)
            H[i][j] = (uint8_t)(i * 7 + j + 1);
    assert_int_equal(reg("i1", "ns", 0, 2, "9.9.9"), -EPERM);
    assert_int_equal(reg("i1", "ns", 0, 2, NULL), 0);
    assert_int_equal(save("i1", 0, 0, 4), -EINVAL); /* not sealed yet */
    assert_int_equal(reg("i1", "ns", 1, 2, NULL), 0);
    assert_int_equal(save("i1", 0, 0, 4), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    struct pf_engine_query_result res;
    assert_int_equal(query("i1", "r", 0, 4, &res), 0);
    assert_int_equal(res.num_hit_blocks, 0); /* rank 1's slots missing: not visible */
    assert_true(pf_metric_value_of("pegaflow_inflight_bytes", NULL) >= 4 * SEG);
    assert_int_equal(save("i1", 1, 0, 2), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    assert_int_equal(query("i1", "r", 0, 4, &res), 0);
    assert_int_equal(res.num_hit_blocks, 2);
    release(&res);
    /* late duplicate of a resident block and a replica slot are dropped */
    assert_int_equal(save("i1", 1, 0, 4), 0);
    assert_int_equal(save("i1", 0, 0, 4), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    assert_int_equal(query("i1", "r", 0, 4, &res), 0);
    assert_int_equal(res.num_hit_blocks, 4);
    /* every block's slots carry the checksum of their bytes (the 4-block saves were copied
     * and checksummed in chunks of 3 slots and 1) */
    struct pf_block *b[4];
    struct pf_block_key k[4];
    uint32_t ns;
    assert_int_equal(pf_ns_lookup("ns", &ns), 0);
    for (int i = 0; i < 4; i++)
        pf_key_make(ns, H[i], 32, &k[i]);
    assert_int_equal(pf_cache_prefix(pf_engine_cache(F.e), k, 4, b), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(b[i]->nslots, 2);
        for (int s = 0; s < 2; s++) {
            struct pf_slot sl;
            pf_block_slot(b[i], (uint16_t)s, &sl);
            assert_true(sl.has_checksum);
            assert_true(pf_slot_verify(&sl, sl.checksum));
            /* slot = tp_rank, block i = block id i */
            assert_memory_equal(sl.k, (uint8_t *)pf_simkv_ptr(F.kv[s]) + i * SEG, SEG);
        }
        pf_block_put(b[i]);
    }
    release(&res);
}

/* One-slot blocks seal without an in-flight record while nothing is in flight; while a
 * block is, they take the in-flight path, so a one-slot save of a key that another layout
 * (two slots) has in flight is refused, not sealed over it. */
static void test_one_slot_blocks(void **st)
{
    struct pf_engine_query_result res;
    assert_int_equal(reg("one", "ns1", 0, 1, NULL), 0);
    assert_int_equal(save("one", 0, 10, 2), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    assert_int_equal(query("one", "r1", 10, 2, &res), 0);
    assert_int_equal(res.num_hit_blocks, 2);
    release(&res);
    uint32_t ns;
    assert_int_equal(pf_ns_lookup("ns1", &ns), 0);
    for (int i = 10; i < 12; i++) {
        struct pf_block_key k;
        struct pf_block *b;
        pf_key_make(ns, H[i], 32, &k);
        assert_int_equal(pf_cache_prefix(pf_engine_cache(F.e), &k, 1, &b), 1);
        assert_int_equal(b->nslots, 1);
        struct pf_slot sl;
        pf_block_slot(b, 0, &sl);
        assert_true(sl.has_checksum && pf_slot_verify(&sl, sl.checksum));
        assert_memory_equal(sl.k, (uint8_t *)pf_simkv_ptr(F.kv[0]) + i * SEG, SEG);
        pf_block_put(b);
    }
    /* a two-slot instance of the same namespace has block 20 in flight (rank 1 missing) */
    assert_int_equal(reg("two", "ns1", 0, 2, NULL), 0);
    assert_int_equal(reg("two", "ns1", 1, 2, NULL), 0);
    assert_int_equal(save("two", 0, 20, 1), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    assert_int_equal(save("one", 0, 20, 1), 0); /* the mismatching slot: dropped */
    assert_int_equal(save("one", 0, 22, 1), 0); /* another key: sealed on the in-flight path */
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    assert_int_equal(query("one", "r2", 20, 1, &res), 0);
    assert_int_equal(res.num_hit_blocks, 0);
    assert_int_equal(query("one", "r3", 22, 1, &res), 0);
    assert_int_equal(res.num_hit_blocks, 1);
    release(&res);
    assert_int_equal(save("two", 1, 20, 1), 0); /* block 20 completes as two slots */
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    assert_int_equal(query("two", "r4", 20, 1, &res), 0);
    assert_int_equal(res.num_hit_blocks, 1);
    release(&res);
    struct pf_block_key k;
    struct pf_block *b;
    pf_key_make(ns, H[20], 32, &k);
    assert_int_equal(pf_cache_prefix(pf_engine_cache(F.e), &k, 1, &b), 1);
    assert_int_equal(b->nslots, 2);
    pf_block_put(b);
    char err[256];
    assert_int_equal(pf_engine_unregister(F.e, "one", err, sizeof(err)), 0);
    assert_int_equal(pf_engine_unregister(F.e, "two", err, sizeof(err)), 0);
}

static void test_inflight_gc(void **st)
{
    double before = pf_metric_value_of("pegaflow_inflight_gc_cleaned", NULL);
    assert_int_equal(save("i1", 0, 10, 3), 0); /* rank 1 never saves these */
    for (int i = 0; i < 200; i++) {
        if (pf_metric_value_of("pegaflow_inflight_gc_cleaned", NULL) >= before + 3)
            break;
        usleep(10000);
    }
    assert_true(pf_metric_value_of("pegaflow_inflight_gc_cleaned", NULL) >= before + 3);
    assert_int_equal(save("i1", 1, 10, 3), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    struct pf_engine_query_result res;
    assert_int_equal(query("i1", "gc", 10, 3, &res), 0);
    assert_int_equal(res.num_hit_blocks, 0); /* the halves never meet */
}

/* ---- a fake tier serving hashes 40..49 ---- */
static int promoted_calls;
static size_t tier_probe(void *ctx, const char *req, const struct pf_block_key *k, size_t n,
                         bool full)
{
    size_t c = 0;
    for (; c < n; c++) {
        bool known = false;
        for (int i = 40; i < 50; i++)
            known |= memcmp(k[c].hash, H[i], 32) == 0;
        if (!known)
            break;
    }
    return strcmp(req, "tier-miss") == 0 ? n : c;
}
static atomic_bool shared_gate; /* holds the fetch of req "shared" until opened */
static size_t tier_fetch(void *ctx, const char *req, const struct pf_block_key *k, size_t n,
                         bool all, struct pf_block **out)
{
    if (strcmp(req, "tier-miss") == 0)
        return 0;
    for (int i = 0; strcmp(req, "shared") == 0 && !atomic_load(&shared_gate) && i < 5000; i++)
        usleep(1000);
    size_t c = tier_probe(ctx, req, k, n, all);
    for (size_t i = 0; i < c; i++) {
        struct pf_alloc *a;
        assert_int_equal(pf_engine_alloc(F.e, SEG, -1, &a), 0);
        struct pf_slot sl[2];
        for (int s = 0; s < 2; s++) {
            if (s)
                pf_alloc_get(a);
            sl[s] = (struct pf_slot){
                .k = a->ptr, .ka = a, .seg_len = SEG, .seg_stride = SEG, .nseg = 1};
        }
        memset(a->ptr, 0x40 + (int)i, SEG);
        pf_slots_checksum(sl, 2);
        assert_int_equal(pf_block_pack(NULL, &k[i], 2, sl, &out[i]), 0);
    }
    return c;
}
static void tier_promoted(void *ctx, struct pf_block *const *b, size_t n)
{
    promoted_calls += (int)n;
}

static void test_tier(void **st)
{
    struct pf_tier t = {.name = "fake",
                        .cls = PF_CLASS_RECLAIMABLE,
                        .probe = tier_probe,
                        .fetch = tier_fetch,
                        .promoted = tier_promoted};
    assert_int_equal(pf_engine_add_tier(F.e, &t), 0);
    /* RAM has 0..3; the tier has 40..49. Ask for [0, 1, 40, 41, 42] */
    struct pf_bytes hs[5] = {{H[0], 32}, {H[1], 32}, {H[40], 32}, {H[41], 32}, {H[42], 32}};
    struct pf_engine_query q = {.instance_id = "i1", .req_id = "req-t", .hashes = hs, .n = 5};
    struct pf_engine_query_result res;
    char err[200];
    assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
    assert_true(res.loading);
    int polls = 0;
    do {
        usleep(2000);
        assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
    } while (res.loading && ++polls < 2000);
    assert_false(res.loading);
    assert_int_equal(res.num_hit_blocks, 5);
    assert_true(res.has_lease);
    assert_int_equal(promoted_calls, 3);
    release(&res);
    /* promoted blocks are resident now (reclaimable): a new req_id hits in RAM */
    q.req_id = "req-t2";
    assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
    assert_false(res.loading);
    assert_int_equal(res.num_hit_blocks, 5);
    release(&res);
    struct pf_cache_stats cs;
    pf_cache_stats(pf_engine_cache(F.e), &cs);
    assert_int_equal(cs.blocks[PF_CLASS_RECLAIMABLE], 3);
    /* a tier that finds nothing: Loading, then Ready with the RAM prefix only; the task
     * answers with its original hashes even when the caller's changed (reference quirk) */
    struct pf_bytes miss[3] = {{H[0], 32}, {H[60], 32}, {H[61], 32}};
    q.req_id = "tier-miss";
    q.hashes = miss;
    q.n = 3;
    assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
    assert_true(res.loading);
    struct pf_bytes drift[3] = {{H[0], 32}, {H[1], 32}, {H[60], 32}};
    q.hashes = drift;
    polls = 0;
    do {
        usleep(2000);
        assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
    } while (res.loading && ++polls < 2000);
    assert_int_equal(res.num_hit_blocks, 1);
    release(&res);
    /* a RAM-only miss leaves no state: the same req_id later answers from RAM */
    q.req_id = "plain";
    assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
    assert_false(res.loading);
    assert_int_equal(res.num_hit_blocks, 2);
    release(&res);
    /* tasks belong to (instance, req_id): another instance, in another namespace, asking
     * with the same req_id while i1's task runs neither waits on it nor gets its blocks */
    assert_int_equal(reg("i9", "ns-9", 0, 1, NULL), 0);
    assert_int_equal(query("i1", "shared", 43, 2, &res), 0);
    assert_true(res.loading);
    assert_int_equal(query("i9", "shared", 0, 1, &res), 0);
    assert_false(res.loading);
    assert_int_equal(res.num_hit_blocks, 0);
    assert_false(res.has_lease);
    atomic_store(&shared_gate, true);
    polls = 0;
    do {
        usleep(2000);
        assert_int_equal(query("i1", "shared", 43, 2, &res), 0);
    } while (res.loading && ++polls < 2000);
    assert_int_equal(res.num_hit_blocks, 2);
    release(&res);
    /* a request larger than any pool shard fails at once, without emptying the cache */
    struct pf_cache_stats before, after;
    pf_cache_stats(pf_engine_cache(F.e), &before);
    assert_true(before.blocks[0] + before.blocks[1] > 0);
    struct pf_alloc *a;
    assert_int_equal(pf_engine_alloc(F.e, 17 << 20, -1, &a), -ENOMEM);
    pf_cache_stats(pf_engine_cache(F.e), &after);
    assert_int_equal(after.blocks[0] + after.blocks[1], before.blocks[0] + before.blocks[1]);
}

static int sealed_seen, evicted_seen;
static void on_sealed(void *ctx, struct pf_block *const *b, size_t n)
{
    sealed_seen += (int)n;
}
static void on_evicted(void *ctx, struct pf_block *const *b, size_t n)
{
    evicted_seen += (int)n;
}

static void test_hooks_and_unregister(void **st)
{
    struct pf_engine_hooks h = {.sealed = on_sealed, .evicted = on_evicted};
    assert_int_equal(pf_engine_add_hooks(F.e, &h), 0);
    assert_int_equal(save("i1", 0, 20, 5), 0);
    assert_int_equal(save("i1", 1, 20, 5), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    assert_int_equal(sealed_seen, 5);
    struct pf_engine_query_result res;
    assert_int_equal(query("i1", "held", 20, 5, &res), 0);
    assert_int_equal(res.num_hit_blocks, 5);
    /* an abandoned prefetch: 44 is in RAM, 45 and 46 in the tier; the client never asks
     * again. The task pins 44 (and what it fetches) only until its instance goes. */
    struct pf_engine_query_result ab;
    assert_int_equal(query("i1", "abandon", 44, 3, &ab), 0);
    assert_true(ab.loading);
    assert_true(atomic_load(&F.e->pf_pinned) > 0);
    char err[200];
    assert_int_equal(pf_engine_unregister(F.e, "i1", err, sizeof(err)), 0);
    /* the fetch may still be running: its reference goes when it returns */
    for (int i = 0; i < 500 && atomic_load(&F.e->pf_pinned) != 0; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&F.e->pf_pinned), 0);
    /* the lease died with the instance */
    struct pf_bytes l = {res.lease, 16};
    assert_int_equal(pf_engine_release(F.e, &l, err, sizeof(err)), -ESTALE);
    assert_int_equal(pf_engine_unregister(F.e, "i1", err, sizeof(err)), -ENOENT);
    struct pf_engine_cleanup_result cr;
    pf_engine_cleanup_memory(F.e, &cr);
    assert_true(cr.evicted_blocks >= 12);
    assert_int_equal(evicted_seen, (int)cr.evicted_blocks);
    assert_int_equal(cr.still_referenced_blocks, 0);
    /* the fake tier's blocks share one allocation between their two slots */
    assert_true(cr.reclaimed_bytes > 0 && cr.reclaimed_bytes <= cr.evicted_bytes);
    /* what is left are the unsealed halves of test_inflight_gc until their TTL */
    for (int i = 0; i < 300 && pf_pool_used(pf_engine_pool(F.e)) != 0; i++)
        usleep(10000);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), 0);
}

/* A page-first save (one page per block holding both layers: two descriptors per slot) is
 * never cut into checksum chunks by slot count: every page holds both layers' bytes and
 * carries their checksum. */
static void test_page_first_checksums(void **st)
{
    struct pf_engine_layer l[2];
    for (int i = 0; i < 2; i++) {
        l[i] = (struct pf_engine_layer){
            .name = i ? "m.1" : "m.0", .num_blocks = NB / 2, .bytes_per_block = SEG, .segments = 1};
        l[i].ipc.kind = PF_IPC_SIM_SHM;
        l[i].ipc.offset = (uint64_t)i * (NB / 2) * SEG;
        l[i].ipc.size = (NB / 2) * SEG;
        l[i].ipc.sim_device = 0;
        snprintf(l[i].ipc.shm_name, sizeof(l[i].ipc.shm_name), "%s", pf_simkv_name(F.kv[0]));
    }
    struct pf_engine_register r = {.instance_id = "pf",
                                   .namespace_ = "pf-ns",
                                   .client_version = PF_VERSION,
                                   .tp_size = 1,
                                   .world_size = 1,
                                   .page_first = true,
                                   .layers = l,
                                   .nlayers = 2};
    char err[256];
    assert_int_equal(pf_engine_register(F.e, &r, err, sizeof(err)), 0);
    uint32_t ids[4];
    struct pf_bytes hs[4];
    for (int i = 0; i < 4; i++) {
        ids[i] = (uint32_t)i;
        hs[i] = (struct pf_bytes){H[50 + i], 32};
    }
    struct pf_engine_save_layer sl[2] = {
        {.name = "m.0", .block_ids = ids, .nids = 4, .hashes = hs, .nhashes = 4},
        {.name = "m.1", .block_ids = ids, .nids = 4, .hashes = hs, .nhashes = 4}};
    assert_int_equal(pf_engine_save(F.e, "pf", 0, 0, 0, sl, 2, err, sizeof(err)), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    uint32_t ns;
    assert_int_equal(pf_ns_lookup("pf-ns", &ns), 0);
    const uint8_t *kv = pf_simkv_ptr(F.kv[0]);
    for (int i = 0; i < 4; i++) {
        struct pf_block_key k;
        pf_key_make(ns, H[50 + i], 32, &k);
        struct pf_block *b;
        assert_int_equal(pf_cache_prefix(pf_engine_cache(F.e), &k, 1, &b), 1);
        assert_int_equal(b->nslots, 1);
        struct pf_slot s0;
        pf_block_slot(b, 0, &s0);
        assert_true(s0.has_checksum);
        assert_true(pf_slot_verify(&s0, s0.checksum));
        const uint8_t *page = s0.k;
        assert_memory_equal(page, kv + i * SEG, SEG);
        assert_memory_equal(page + SEG, kv + (NB / 2) * SEG + i * SEG, SEG);
        pf_block_put(b);
    }
    assert_int_equal(pf_engine_unregister(F.e, "pf", err, sizeof(err)), 0);
}

/* Query keys are built the way saves build them for every hash length: the 16- and 32-byte
 * fast path and pf_group_key for the rest; a hash that only shares a shorter hash's bytes
 * (same first 16 bytes, longer) does not hit it. */
static void test_hash_lengths(void **st)
{
    assert_int_equal(reg("ilen", "nslen", 0, 1, NULL), 0);
    static const size_t lens[6] = {16, 32, 1, 17, 31, 40};
    uint8_t hb[6][40];
    struct pf_bytes hs[6];
    uint32_t ids[6];
    for (size_t i = 0; i < 6; i++) {
        for (size_t j = 0; j < 40; j++)
            hb[i][j] = (uint8_t)(i * 31 + j * 3 + 5);
        hs[i] = (struct pf_bytes){hb[i], lens[i]};
        ids[i] = (uint32_t)i;
    }
    struct pf_engine_save_layer sl = {
        .name = "ALL_LAYERS", .block_ids = ids, .nids = 6, .hashes = hs, .nhashes = 6};
    char err[256];
    assert_int_equal(pf_engine_save(F.e, "ilen", 0, 0, 0, &sl, 1, err, sizeof(err)), 0);
    assert_int_equal(pf_engine_flush(F.e, 5000), 0);
    struct pf_engine_query_result res;
    struct pf_engine_query q = {.instance_id = "ilen", .req_id = "rl", .hashes = hs, .n = 6};
    assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
    assert_int_equal(res.num_hit_blocks, 6);
    release(&res);
    for (size_t i = 0; i < 6; i++) { /* each on its own, too */
        q.hashes = &hs[i];
        q.n = 1;
        assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
        assert_int_equal(res.num_hit_blocks, 1);
        release(&res);
    }
    /* hb[0]'s 16 bytes followed by 16 more: a 32-byte hash that is not resident */
    uint8_t longer[32];
    memcpy(longer, hb[0], 16);
    memset(longer + 16, 0, 16);
    struct pf_bytes miss[2] = {{longer, 32}, {hb[0], 15}};
    for (size_t i = 0; i < 2; i++) {
        q.hashes = &miss[i];
        q.n = 1;
        assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), 0);
        assert_int_equal(res.num_hit_blocks, 0);
        assert_false(res.has_lease);
    }
    struct pf_bytes empty = {hb[0], 0};
    q.hashes = &empty;
    assert_int_equal(pf_engine_query(F.e, &q, &res, err, sizeof(err)), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sealing),
        cmocka_unit_test(test_one_slot_blocks),
        cmocka_unit_test(test_inflight_gc),
        cmocka_unit_test(test_tier),
        cmocka_unit_test(test_hooks_and_unregister),
        cmocka_unit_test(test_page_first_checksums),
        cmocka_unit_test(test_hash_lengths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

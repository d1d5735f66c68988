/* RAM cache (prefix, membership, classes, eviction order and skipping referenced blocks,
 * cleanup, reclaimable hints), TinyLFU sketch and admission, leases with a fake clock, and
 * block strong/weak reference semantics. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/block.h"
#include "pf/cache.h"
#include "pf/lease.h"
#include "pf/pool.h"
#include "pftest.h"

static struct pf_block_key key(uint32_t ns, uint32_t i)
{
    struct pf_block_key k;
    uint8_t h[32];
    memset(h, 0, sizeof(h));
    memcpy(h, &i, sizeof(i));
    pf_key_make(ns, h, sizeof(h), &k);
    return k;
}

/* Blocks of one 100-byte slot in a static stand-in allocation whose count never drops to 0
 * (no pool behind it). */
static uint8_t fake_mem[4096];
static struct pf_alloc fake = {.ptr = fake_mem, .size = sizeof(fake_mem), .refs = 1u << 30};

static struct pf_block *blk_key(const struct pf_block_key *k)
{
    pf_alloc_get(&fake);
    struct pf_slot s = {.k = fake_mem, .ka = &fake, .seg_len = 100, .seg_stride = 100, .nseg = 1};
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, k, 1, &s, &b), 0);
    return b;
}

static struct pf_block *blk(uint32_t ns, uint32_t i)
{
    struct pf_block_key k = key(ns, i);
    pf_alloc_get(&fake);
    struct pf_slot s = {.k = fake_mem, .ka = &fake, .seg_len = 100, .seg_stride = 100, .nseg = 1};
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 1, &s, &b), 0);
    return b;
}

static void test_prefix_and_classes(void **st)
{
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    for (uint32_t i = 0; i < 10; i++) {
        struct pf_block *b = blk(1, i);
        assert_int_equal(pf_cache_insert(c, b, i < 5 ? PF_CLASS_RETAINED : PF_CLASS_RECLAIMABLE),
                         1);
        assert_int_equal(pf_cache_insert(c, b, PF_CLASS_RETAINED), 0); /* already resident */
        pf_block_put(b);
    }
    struct pf_cache_stats s;
    pf_cache_stats(c, &s);
    assert_int_equal(s.blocks[PF_CLASS_RETAINED], 5);
    assert_int_equal(s.blocks[PF_CLASS_RECLAIMABLE], 5);
    assert_int_equal(s.bytes[0], 500);
    struct pf_block_key keys[12];
    for (uint32_t i = 0; i < 12; i++)
        keys[i] = key(1, i);
    struct pf_block *out[12];
    assert_int_equal(pf_cache_prefix(c, keys, 12, out), 10);
    for (int i = 0; i < 10; i++) {
        assert_true(pf_block_key_eq(out[i], &keys[i]));
        assert_int_equal(pf_block_strong(out[i]), 2);
        pf_block_put(out[i]);
    }
    struct pf_block_key gap[3] = {keys[0], key(1, 99), keys[2]};
    assert_int_equal(pf_cache_prefix(c, gap, 3, NULL), 1);
    assert_int_equal(pf_cache_lookup_each(c, gap, 3, out), 2);
    assert_null(out[1]);
    pf_block_put(out[0]);
    pf_block_put(out[2]);
    /* namespaces isolate keys */
    struct pf_block_key other = key(2, 0);
    assert_false(pf_cache_contains(c, &other));
    assert_true(pf_cache_contains(c, &keys[3]));
    pf_cache_destroy(c);
}

static void test_eviction_order(void **st)
{
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    for (uint32_t i = 0; i < 6; i++) {
        struct pf_block *b = blk(1, i);
        pf_cache_insert(c, b, i % 2 ? PF_CLASS_RECLAIMABLE : PF_CLASS_RETAINED);
        pf_block_put(b);
    }
    /* touch 0: it becomes the most recent retained block */
    struct pf_block_key k0 = key(1, 0);
    assert_int_equal(pf_cache_prefix(c, &k0, 1, NULL), 1);
    /* pin 1 (reclaimable) with an extra reference: eviction must skip it */
    struct pf_block_key k1 = key(1, 1);
    struct pf_block *pin;
    assert_int_equal(pf_cache_prefix(c, &k1, 1, &pin), 1);
    struct pf_block *ev[10];
    size_t skipped;
    size_t n = pf_cache_evict(c, 3, ev, &skipped);
    assert_int_equal(n, 3);
    assert_int_equal(skipped, 1);
    /* reclaimable first (3, 5; 1 is pinned), then the oldest retained (2) */
    uint32_t got[3];
    for (size_t i = 0; i < n; i++) {
        memcpy(&got[i], pf_block_key(ev[i]).hash, 4);
        pf_block_put(ev[i]);
    }
    assert_int_equal(got[0], 3);
    assert_int_equal(got[1], 5);
    assert_int_equal(got[2], 2);
    assert_true(pf_cache_contains(c, &k1)); /* referenced block stays hittable */
    n = pf_cache_evict(c, 10, ev, &skipped);
    assert_int_equal(n, 2); /* 4 and 0; 1 still pinned */
    for (size_t i = 0; i < n; i++)
        pf_block_put(ev[i]);
    pf_block_put(pin);
    n = pf_cache_evict(c, 10, ev, &skipped);
    assert_int_equal(n, 1);
    pf_block_put(ev[0]);
    pf_cache_destroy(c);
}

/* The allocator's first pass passes over blocks queued for SSD (an extra weak reference),
 * in place; the plain pass takes them, oldest first. */
static void test_eviction_spares_queued(void **st)
{
    (void)st;
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    struct pf_block *bs[5];
    for (uint32_t i = 0; i < 5; i++) {
        bs[i] = blk(1, i);
        pf_cache_insert(c, bs[i], PF_CLASS_RETAINED);
    }
    /* 0 and 2 (the oldest and a middle one) wait in the SSD write queue */
    pf_block_weak_get(bs[0]);
    pf_block_weak_get(bs[2]);
    for (uint32_t i = 0; i < 5; i++)
        pf_block_put(bs[i]); /* the cache holds them alone now; the queue only weakly */
    struct pf_block *ev[10];
    size_t skipped;
    size_t n = pf_cache_evict_sparing(c, 2, ev, &skipped);
    assert_int_equal(n, 2);
    assert_int_equal(skipped, 0);
    uint32_t got[5];
    for (size_t i = 0; i < n; i++) {
        memcpy(&got[i], pf_block_key(ev[i]).hash, 4);
        pf_block_put(ev[i]);
    }
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], 3);
    n = pf_cache_evict_sparing(c, 10, ev, &skipped);
    assert_int_equal(n, 1);
    memcpy(&got[0], pf_block_key(ev[0]).hash, 4);
    assert_int_equal(got[0], 4);
    pf_block_put(ev[0]);
    assert_int_equal(pf_cache_evict_sparing(c, 10, ev, &skipped), 0);
    /* queued blocks kept their order: the plain pass takes 0 then 2 */
    n = pf_cache_evict(c, 10, ev, &skipped);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++)
        memcpy(&got[i], pf_block_key(ev[i]).hash, 4);
    assert_int_equal(got[0], 0);
    assert_int_equal(got[1], 2);
    for (size_t i = 0; i < n; i++) {
        pf_block_put(ev[i]);      /* strong 0: data released */
        pf_block_weak_put(ev[i]); /* the queue's reference: struct freed */
    }
    pf_cache_destroy(c);
}

static void test_cleanup_and_hints(void **st)
{
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    struct pf_block_key keys[4];
    for (uint32_t i = 0; i < 4; i++) {
        struct pf_block *b = blk(1, i);
        keys[i] = pf_block_key(b);
        pf_cache_insert(c, b, PF_CLASS_RETAINED);
        pf_block_put(b);
    }
    assert_int_equal(pf_cache_mark_reclaimable(c, keys, 2), 2);
    assert_int_equal(pf_cache_mark_reclaimable(c, keys, 2), 0);
    struct pf_cache_stats s;
    pf_cache_stats(c, &s);
    assert_int_equal(s.blocks[PF_CLASS_RECLAIMABLE], 2);
    struct pf_block *held;
    assert_int_equal(pf_cache_prefix(c, keys + 3, 1, &held), 1);
    struct pf_block **all;
    size_t n = pf_cache_remove_all(c, &all);
    assert_int_equal(n, 4); /* referenced or not */
    for (size_t i = 0; i < n; i++)
        pf_block_put(all[i]);
    free(all);
    assert_false(pf_cache_contains(c, &keys[3]));
    assert_int_equal(pf_block_strong(held), 1); /* still alive for its holder */
    pf_block_put(held);
    pf_cache_destroy(c);
}

/* A TinyLFU cache (64 items) holding block (1, 1) of blk(), looked up ten times: a newcomer
 * seen once is refused beside it. The caller puts *hot_p and destroys the cache. */
static struct pf_cache *lfu_with_hot_block(struct pf_block **hot_p)
{
    struct pf_cache *c;
    struct pf_cache_config cfg = {.lfu_items = 64};
    assert_int_equal(pf_cache_create(&cfg, &c), 0);
    struct pf_block *hot = blk(1, 1);
    assert_int_equal(pf_cache_insert(c, hot, PF_CLASS_RETAINED), 1);
    struct pf_block_key hk = pf_block_key(hot);
    for (int i = 0; i < 10; i++)
        pf_cache_prefix(c, &hk, 1, NULL);
    *hot_p = hot;
    return c;
}

static void test_tinylfu(void **st)
{
    struct pf_tinylfu *t;
    assert_int_equal(pf_tinylfu_create(100, &t), 0);
    for (int i = 0; i < 50; i++)
        pf_tinylfu_touch(t, 42);
    uint32_t before = pf_tinylfu_estimate(t, 42);
    assert_true(before >= 50);
    assert_true(pf_tinylfu_estimate(t, 43) <= 1);
    /* 8 * n touches halve everything */
    for (int i = 0; i < 750; i++)
        pf_tinylfu_touch(t, 1000 + (uint64_t)i * 7919);
    assert_int_equal(pf_tinylfu_resets(t), 1);
    uint32_t after = pf_tinylfu_estimate(t, 42);
    assert_true(after <= before / 2 + 8 && after >= before / 2 - 1);
    pf_tinylfu_destroy(t);

    /* admission: a one-hit wonder is refused in favour of a popular victim */
    struct pf_block *hot;
    struct pf_cache *c = lfu_with_hot_block(&hot);
    struct pf_block *cold = blk(1, 2);
    assert_int_equal(pf_cache_insert(c, cold, PF_CLASS_RETAINED), -EACCES);
    struct pf_block_key ck = pf_block_key(cold);
    assert_false(pf_cache_contains(c, &ck));
    pf_block_put(hot);
    pf_block_put(cold);
    pf_cache_destroy(c);
}

static void test_block_refs(void **st)
{
    struct pf_pool *p;
    char err[128];
    struct pf_pool_config pc = {.size = 1 << 20};
    assert_int_equal(pf_pool_create(&pc, &p, err, sizeof(err)), 0);
    struct pf_alloc *a;
    assert_int_equal(pf_pool_alloc(p, 4096, -1, &a), 0);
    struct pf_block_key k = key(1, 1);
    struct pf_slot s =
        (struct pf_slot){.k = a->ptr, .ka = a, .seg_len = 4096, .seg_stride = 4096, .nseg = 1};
    memset(a->ptr, 7, 4096);
    pf_slots_checksum(&s, 1);
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 1, &s, &b), 0);
    assert_null(s.ka); /* the block took the reference */
    assert_true(pf_block_slot_verify(b, 0));
    ((char *)a->ptr)[100] ^= 1;
    assert_false(pf_block_slot_verify(b, 0));
    pf_block_weak_get(b);
    assert_true(pf_block_upgrade(b));
    pf_block_put(b);
    pf_block_put(b); /* last strong: memory back to the pool, struct kept for the weak ref */
    assert_int_equal(pf_pool_used(p), 0);
    assert_false(pf_block_upgrade(b));
    pf_block_weak_put(b);
    pf_pool_destroy(p);
    uint8_t big[41];
    struct pf_block_key kk;
    assert_int_equal(pf_key_make(1, big, 41, &kk), -EINVAL);
    assert_int_equal(pf_key_make(1, big, 0, &kk), -EINVAL);
    uint32_t id1, id2, id3;
    assert_int_equal(pf_ns_intern("alpha", &id1), 0);
    assert_int_equal(pf_ns_intern("beta", &id2), 0);
    assert_int_equal(pf_ns_intern("alpha", &id3), 0);
    assert_int_equal(id1, id3);
    assert_int_not_equal(id1, id2);
    assert_string_equal(pf_ns_name(id2), "beta");
    assert_int_equal(pf_ns_lookup("gamma", &id3), -ENOENT);
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Key i: random length (4..PF_HASH_MAX bytes, i in the first four), namespace 1..3. */
static struct pf_block_key rand_key(uint32_t i)
{
    uint8_t h[PF_HASH_MAX];
    for (size_t j = 0; j < sizeof(h); j++)
        h[j] = (uint8_t)rnd();
    memcpy(h, &i, sizeof(i));
    struct pf_block_key k;
    pf_key_make(1 + (uint32_t)(rnd() % 3), h, 4 + rnd() % (PF_HASH_MAX - 3), &k);
    return k;
}

/* Batched lookups (the software pipeline over thousands of keys, chains at load factor up
 * to 1) against one pf_cache_contains per key: prefix length, the blocks returned, one
 * reference per hit and none past a prefix's first miss, recency marks only up to it; and
 * near-miss keys (same bytes in another namespace, one byte shorter, one bit off) miss. */
static void test_batched_lookups(void **st)
{
    rng_state = pft_seed() | 1;
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    enum { N = 6000, Q = 3000 };
    struct pf_block_key *res = malloc(N * sizeof(*res));
    struct pf_block **blocks = malloc(N * sizeof(*blocks));
    for (size_t i = 0; i < N; i++) {
        res[i] = rand_key((uint32_t)i);
        blocks[i] = blk_key(&res[i]);
        assert_int_equal(pf_cache_insert(c, blocks[i], PF_CLASS_RETAINED), 1);
    }
    struct pf_block_key *q = malloc(Q * sizeof(*q));
    struct pf_block **out = malloc(Q * sizeof(*out));
    size_t *idx = malloc(Q * sizeof(*idx));
    for (int round = 0; round < 40; round++) {
        size_t n = round == 0 ? 1 : 1 + rnd() % Q;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rnd() % 100;
            idx[i] = rnd() % N;
            q[i] = res[idx[i]];
            if (r < 3 && i > 0) { /* some prefixes end early, on a near miss */
                if (r == 0)
                    q[i].ns += 10;
                else if (r == 1)
                    q[i].hash[--q[i].len] = 0;
                else
                    q[i].hash[rnd() % q[i].len] ^= 1;
                if (pf_cache_contains(c, &q[i])) /* happens to be another resident key */
                    q[i] = res[idx[i]];
                else
                    idx[i] = SIZE_MAX;
            }
        }
        size_t want = 0;
        while (want < n && idx[want] != SIZE_MAX)
            want++;
        for (size_t i = 0; i < N; i++)
            blocks[i]->accessed = 0;
        size_t got = pf_cache_prefix(c, q, n, out);
        assert_int_equal(got, want);
        for (size_t i = 0; i < got; i++) {
            assert_ptr_equal(out[i], blocks[idx[i]]);
            assert_int_equal(out[i]->accessed, 1);
        }
        /* references: ours, the cache's, one per hit position (a block may repeat) */
        for (size_t i = 0; i < N; i++) {
            uint32_t refs = 2;
            for (size_t j = 0; j < got; j++)
                refs += idx[j] == i;
            assert_int_equal(pf_block_strong(blocks[i]), refs);
            if (refs == 2)
                assert_int_equal(blocks[i]->accessed, 0);
        }
        for (size_t i = 0; i < got; i++)
            pf_block_put(out[i]);
        assert_int_equal(pf_cache_prefix(c, q, n, NULL), want);
        /* membership: every position on its own */
        size_t hits = pf_cache_lookup_each(c, q, n, out), nhit = 0;
        for (size_t i = 0; i < n; i++) {
            bool in = pf_cache_contains(c, &q[i]);
            assert_int_equal(in, idx[i] != SIZE_MAX);
            if (in) {
                assert_ptr_equal(out[i], blocks[idx[i]]);
                nhit++;
                pf_block_put(out[i]);
            } else {
                assert_null(out[i]);
            }
        }
        assert_int_equal(hits, nhit);
    }
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(pf_block_strong(blocks[i]), 2);
        pf_block_put(blocks[i]);
    }
    /* an empty cache answers without touching its index */
    struct pf_cache *e;
    assert_int_equal(pf_cache_create(NULL, &e), 0);
    assert_int_equal(pf_cache_prefix(e, q, 5, out), 0);
    assert_int_equal(pf_cache_lookup_each(e, q, 5, out), 0);
    for (size_t i = 0; i < 5; i++)
        assert_null(out[i]);
    pf_cache_destroy(e);
    pf_cache_destroy(c);
    free(res);
    free(blocks);
    free(q);
    free(out);
    free(idx);
}

static void test_leases(void **st)
{
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 1000);
    struct pf_lease_table *t;
    assert_int_equal(pf_lease_table_create(&clk.base, 600 * PF_NS_PER_SEC, &t), 0);
    struct pf_block *b[2] = {blk(1, 1), blk(1, 2)};
    pf_block_get(b[0]);
    pf_block_get(b[1]);
    uint8_t id[16];
    assert_int_equal(pf_lease_create(t, "inst", b, 2, 2, id), 0);
    assert_int_equal(pf_block_strong(b[0]), 2);
    struct pf_block **got;
    size_t n;
    char msg[128];
    /* wrong instance: refused, share not consumed */
    assert_int_equal(pf_lease_consume(t, id, 16, "other", &got, &n, msg, sizeof(msg)), -EPERM);
    assert_non_null(strstr(msg, "belongs to instance inst"));
    assert_int_equal(pf_lease_consume(t, id, 15, "inst", &got, &n, msg, sizeof(msg)), -EINVAL);
    /* peek: the same references, no share taken (any number of times) */
    for (int k = 0; k < 3; k++) {
        assert_int_equal(pf_lease_peek(t, id, 16, "inst", &got, &n, msg, sizeof(msg)), 0);
        assert_int_equal(n, 2);
        assert_ptr_equal(got[1], b[1]);
        for (size_t i = 0; i < n; i++)
            pf_block_put(got[i]);
        free(got);
    }
    assert_int_equal(pf_lease_peek(t, id, 16, "other", &got, &n, msg, sizeof(msg)), -EPERM);
    assert_int_equal(pf_lease_commit(t, id, 15), -EINVAL);
    /* commit takes a share: one commit and one consume use both up */
    assert_int_equal(pf_lease_commit(t, id, 16), 0);
    assert_int_equal(pf_lease_count(t), 1);
    assert_int_equal(pf_lease_consume(t, id, 16, "inst", &got, &n, msg, sizeof(msg)), 0);
    for (size_t i = 0; i < n; i++)
        pf_block_put(got[i]);
    free(got);
    assert_int_equal(pf_lease_count(t), 0);
    assert_int_equal(pf_lease_commit(t, id, 16), -ESTALE);
    assert_int_equal(pf_block_strong(b[0]), 1);
    pf_block_get(b[0]);
    pf_block_get(b[1]);
    assert_int_equal(pf_lease_create(t, "inst", b, 2, 2, id), 0);
    for (int share = 0; share < 2; share++) {
        assert_int_equal(pf_lease_consume(t, id, 16, "inst", &got, &n, msg, sizeof(msg)), 0);
        assert_int_equal(n, 2);
        for (size_t i = 0; i < n; i++)
            pf_block_put(got[i]);
        free(got);
    }
    assert_int_equal(pf_lease_consume(t, id, 16, "inst", &got, &n, msg, sizeof(msg)), -ESTALE);
    assert_non_null(strstr(msg, "unknown or expired"));
    assert_int_equal(pf_block_strong(b[0]), 1); /* the lease's references are gone */
    /* expiry */
    pf_block_get(b[0]);
    assert_int_equal(pf_lease_create(t, "inst", b, 1, 1, id), 0);
    pf_fake_clock_advance(&clk, 599 * PF_NS_PER_SEC);
    assert_int_equal(pf_lease_sweep(t), 0);
    pf_fake_clock_advance(&clk, 1 * PF_NS_PER_SEC);
    assert_int_equal(pf_lease_consume(t, id, 16, "inst", &got, &n, msg, sizeof(msg)), -ESTALE);
    assert_int_equal(pf_lease_count(t), 0);
    assert_int_equal(pf_block_strong(b[0]), 1);
    /* release and instance drop */
    pf_block_get(b[0]);
    assert_int_equal(pf_lease_create(t, "inst", b, 1, 4, id), 0);
    assert_int_equal(pf_lease_release(t, id, 16), 0);
    assert_int_equal(pf_lease_release(t, id, 16), -ESTALE);
    assert_int_equal(pf_lease_release(t, id, 3), -EINVAL);
    pf_block_get(b[0]);
    pf_block_get(b[1]);
    assert_int_equal(pf_lease_create(t, "x", b, 1, 1, id), 0);
    assert_int_equal(pf_lease_create(t, "y", b + 1, 1, 1, id), 0);
    assert_int_equal(pf_lease_drop_instance(t, "x"), 1);
    assert_int_equal(pf_lease_count(t), 1);
    pf_lease_table_destroy(t);
    assert_int_equal(pf_block_strong(b[0]), 1);
    assert_int_equal(pf_block_strong(b[1]), 1);
    pf_block_put(b[0]);
    pf_block_put(b[1]);
}

/* Per-namespace bytes and namespace-restricted eviction (tenant quotas, src/tenant): only
 * the named namespaces' unreferenced blocks go, oldest first; the others keep their place. */
static void test_evict_by_namespace(void **st)
{
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    assert_int_equal(pf_cache_ns_bytes(c, 7), 0);
    for (uint32_t i = 0; i < 6; i++) { /* interleaved: 7, 8, 7, 8, ... */
        struct pf_block *b = blk(7 + (i & 1), i);
        assert_int_equal(pf_cache_insert(c, b, PF_CLASS_RETAINED), 1);
        pf_block_put(b);
    }
    struct pf_block *far = blk(300, 1); /* an id past the table's first growth */
    assert_int_equal(pf_cache_insert(c, far, PF_CLASS_RECLAIMABLE), 1);
    pf_block_put(far);
    assert_int_equal(pf_cache_ns_bytes(c, 7), 300);
    assert_int_equal(pf_cache_ns_bytes(c, 8), 300);
    assert_int_equal(pf_cache_ns_bytes(c, 300), 100);
    assert_int_equal(pf_cache_ns_bytes(c, 9), 0);
    /* a referenced block of namespace 7 is skipped */
    struct pf_block_key k4 = key(7, 4);
    struct pf_block *held[1];
    assert_int_equal(pf_cache_lookup_each(c, &k4, 1, held), 1);
    uint32_t ns7 = 7;
    struct pf_block *out[8];
    size_t skipped = 9;
    assert_int_equal(pf_cache_evict_ns(c, &ns7, 1, 0, out, &skipped), 0);
    assert_int_equal(pf_cache_evict_ns(c, &ns7, 0, 8, out, &skipped), 0);
    assert_int_equal(skipped, 0);
    size_t n = pf_cache_evict_ns(c, &ns7, 1, 8, out, &skipped);
    assert_int_equal(n, 2);
    assert_int_equal(skipped, 1);
    struct pf_block_key k0 = key(7, 0), k2 = key(7, 2);
    assert_true(pf_block_key_eq(out[0], &k0)); /* oldest first */
    assert_true(pf_block_key_eq(out[1], &k2));
    for (size_t i = 0; i < n; i++)
        pf_block_put(out[i]);
    assert_int_equal(pf_cache_ns_bytes(c, 7), 100); /* the held one */
    assert_int_equal(pf_cache_ns_bytes(c, 8), 300); /* untouched */
    for (uint32_t i = 1; i < 6; i += 2) {
        struct pf_block_key k = key(8, i);
        assert_true(pf_cache_contains(c, &k));
    }
    /* two namespaces at once, reclaimable first as always */
    uint32_t two[2] = {8, 300};
    n = pf_cache_evict_ns(c, two, 2, 2, out, NULL);
    assert_int_equal(n, 2);
    assert_int_equal(pf_block_ns(out[0]), 300);
    assert_int_equal(pf_block_ns(out[1]), 8);
    for (size_t i = 0; i < n; i++)
        pf_block_put(out[i]);
    assert_int_equal(pf_cache_ns_bytes(c, 300), 0);
    assert_int_equal(pf_cache_ns_bytes(c, 8), 200);
    pf_block_put(held[0]);
    pf_cache_destroy(c);
}

/* The batched membership and insert calls agree with the one-key calls, across their lock
 * chunks (more keys than one hold takes) and with the table growing under the insert:
 * resident keys, keys repeated in one batch, and a TinyLFU refusal. */
static void test_batched_insert(void **st)
{
    rng_state = pft_seed() | 1;
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    enum { N = 2600 };
    struct pf_block_key *keys = malloc(N * sizeof(*keys));
    struct pf_block **bl = malloc(N * sizeof(*bl));
    int *rc = malloc(N * sizeof(*rc));
    bool *in = malloc(N);
    for (size_t i = 0; i < N; i++)
        keys[i] = rand_key((uint32_t)i);
    /* an empty cache: nothing resident, nothing looked at */
    memset(in, 1, N);
    assert_int_equal(pf_cache_contains_each(c, keys, N, in), 0);
    for (size_t i = 0; i < N; i++)
        assert_false(in[i]);
    /* every third key resident beforehand */
    for (size_t i = 0; i < N; i += 3) {
        struct pf_block *b = blk_key(&keys[i]);
        assert_int_equal(pf_cache_insert(c, b, PF_CLASS_RETAINED), 1);
        pf_block_put(b);
    }
    assert_int_equal(pf_cache_contains_each(c, keys, N, in), (N + 2) / 3);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(in[i], i % 3 == 0);
    /* a batch of all N keys, key 7 twice (at 7 and at N - 1: the later one is refused) */
    for (size_t i = 0; i < N; i++)
        bl[i] = blk_key(i == N - 1 ? &keys[7] : &keys[i]);
    size_t want = 0;
    for (size_t i = 0; i < N - 1; i++)
        want += i % 3 != 0;
    assert_int_equal(pf_cache_insert_each(c, bl, N, PF_CLASS_RECLAIMABLE, rc), want);
    for (size_t i = 0; i < N; i++) {
        int expect = i == N - 1 ? 0 : i % 3 == 0 ? 0 : 1;
        if (rc[i] != expect)
            fail_msg("block %zu: insert_each returned %d, expected %d", i, rc[i], expect);
        /* inserted: ours and the cache's reference; refused: ours only */
        assert_int_equal(pf_block_strong(bl[i]), expect == 1 ? 2 : 1);
    }
    assert_int_equal(pf_cache_contains_each(c, keys, N - 1, in), N - 1);
    struct pf_cache_stats cs;
    pf_cache_stats(c, &cs);
    assert_int_equal(cs.blocks[PF_CLASS_RETAINED], (N + 2) / 3);
    assert_int_equal(cs.blocks[PF_CLASS_RECLAIMABLE], want);
    for (size_t i = 0; i < N; i++)
        pf_block_put(bl[i]);
    pf_cache_destroy(c);
    /* admission applies per block: a cold newcomer is refused beside a popular victim */
    struct pf_block *hot;
    c = lfu_with_hot_block(&hot);
    struct pf_block *two[2] = {blk(1, 1), blk(1, 2)};
    assert_int_equal(pf_cache_insert_each(c, two, 2, PF_CLASS_RETAINED, rc), 0);
    assert_int_equal(rc[0], 0);
    assert_int_equal(rc[1], -EACCES);
    pf_block_put(two[0]);
    pf_block_put(two[1]);
    pf_block_put(hot);
    pf_cache_destroy(c);
    free(keys);
    free(bl);
    free(rc);
    free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_and_classes),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_eviction_spares_queued),
        cmocka_unit_test(test_evict_by_namespace),
        cmocka_unit_test(test_cleanup_and_hints),
        cmocka_unit_test(test_tinylfu),
        cmocka_unit_test(test_block_refs),
        cmocka_unit_test(test_leases),
        cmocka_unit_test(test_batched_lookups),
        cmocka_unit_test(test_batched_insert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

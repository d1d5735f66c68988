/* Lease pins in the RAM cache (pf_cache_prefix_pin, pf_cache_unpin, pf_cache_pins_to_refs,
 * pf_lease_create_pinned): a pinned block is never evicted, survives pf_cache_remove_all
 * until its last unpin, a lease over pins unpins on consume / release / expiry / instance
 * drop / table destroy, a saturated pin count ends the prefix, and a race of queries
 * (pin + lease + consume), eviction and cleanup never frees a leased block (each consumed
 * block still carries its key and its own allocation; run under TSan with `make SAN=thread`
 * for the data-race side; one query thread looks up raw hashes, as QueryPrefetch does); and
 * the raw-hash lookup matches one pf_cache_contains per key. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    for (int j = 0; j < 32; j++)
        h[j] = (uint8_t)(i * 31 + (uint32_t)j);
    memcpy(h, &i, sizeof(i));
    pf_key_make(ns, h, sizeof(h), &k);
    return k;
}

/* A block over its own allocation a (refs counts the block's reference: a->refs drops by
 * one exactly when the block's data is released). */
static struct pf_block *blk_in(struct pf_alloc *a, uint32_t i)
{
    struct pf_block_key k = key(1, i);
    pf_alloc_get(a);
    struct pf_slot s = {.k = a->ptr, .ka = a, .seg_len = 64, .seg_stride = 64, .nseg = 1};
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 1, &s, &b), 0);
    return b;
}

static uint8_t mem[16][64];
static struct pf_alloc allocs[16];

static void allocs_init(void)
{
    for (int i = 0; i < 16; i++)
        allocs[i] = (struct pf_alloc){.ptr = mem[i], .size = 64, .refs = 1};
}

static struct pf_cache *fill(struct pf_block_key *keys, size_t n)
{
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    for (uint32_t i = 0; i < n; i++) {
        struct pf_block *b = blk_in(&allocs[i], i);
        assert_int_equal(pf_cache_insert(c, b, PF_CLASS_RETAINED), 1);
        pf_block_put(b); /* the cache's reference only */
        keys[i] = key(1, i);
    }
    return c;
}

static void test_pin_blocks_eviction(void **st)
{
    allocs_init();
    struct pf_block_key keys[8];
    struct pf_cache *c = fill(keys, 8);
    struct pf_block *got[8];
    assert_int_equal(pf_cache_prefix_pin(c, keys, 4, got), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pf_cache_pins(c, got[i]), 1);
        assert_int_equal(pf_block_strong(got[i]), 1); /* no reference was taken */
    }
    /* a prefix stops at the first miss and pins nothing after it */
    struct pf_block_key gap[3] = {keys[5], key(1, 99), keys[6]};
    struct pf_block *g2[3];
    assert_int_equal(pf_cache_prefix_pin(c, gap, 3, g2), 1);
    pf_cache_unpin(c, g2, 1);
    /* eviction takes the four unpinned blocks only, then finds nothing more */
    struct pf_block *ev[8];
    size_t skipped;
    assert_int_equal(pf_cache_evict(c, 8, ev, &skipped), 4);
    assert_int_equal(skipped, 4);
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++)
            assert_ptr_not_equal(ev[i], got[j]);
        pf_block_put(ev[i]);
    }
    assert_int_equal(pf_cache_evict(c, 8, ev, NULL), 0);
    /* unpinned: evictable, data released with the eviction's put */
    pf_cache_unpin(c, got, 4);
    assert_int_equal(pf_cache_pins(c, got[0]), 0);
    assert_int_equal(pf_cache_evict(c, 8, ev, NULL), 4);
    for (int i = 0; i < 4; i++)
        pf_block_put(ev[i]);
    for (int i = 0; i < 8; i++)
        assert_int_equal(allocs[i].refs, 1);
    pf_cache_destroy(c);
}

/* Cleanup (remove_all) of pinned blocks: they leave the index but stay alive, readable,
 * until the last unpin releases them. */
static void test_pin_survives_remove_all(void **st)
{
    allocs_init();
    struct pf_block_key keys[4];
    struct pf_cache *c = fill(keys, 4);
    struct pf_block *got[4], *twice[2];
    assert_int_equal(pf_cache_prefix_pin(c, keys, 4, got), 4);
    assert_int_equal(pf_cache_prefix_pin(c, keys, 2, twice), 2); /* a second pin on 0, 1 */
    struct pf_block **all;
    size_t n = pf_cache_remove_all(c, &all);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++)
        pf_block_put(all[i]);
    free(all);
    assert_int_equal(pf_cache_prefix_pin(c, keys, 4, got + 0), 0); /* gone from the index */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(allocs[i].refs, 2); /* still alive: the pins hold it */
        struct pf_block_key k = pf_block_key(got[i]);
        assert_true(pf_key_eq(&k, &keys[i]));
    }
    pf_cache_unpin(c, got, 4);
    assert_int_equal(allocs[0].refs, 2); /* one pin left on 0 and 1 */
    assert_int_equal(allocs[2].refs, 1); /* released with its last pin */
    assert_int_equal(allocs[3].refs, 1);
    pf_cache_unpin(c, twice, 2);
    assert_int_equal(allocs[0].refs, 1);
    assert_int_equal(allocs[1].refs, 1);
    pf_cache_destroy(c);
}

static void test_pins_to_refs(void **st)
{
    allocs_init();
    struct pf_block_key keys[2];
    struct pf_cache *c = fill(keys, 2);
    struct pf_block *got[2];
    assert_int_equal(pf_cache_prefix_pin(c, keys, 2, got), 2);
    pf_cache_pins_to_refs(c, got, 2);
    assert_int_equal(pf_cache_pins(c, got[0]), 0);
    assert_int_equal(pf_block_strong(got[0]), 2);
    /* references, not pins: cleanup then the caller's put release the data */
    struct pf_block **all;
    size_t n = pf_cache_remove_all(c, &all);
    for (size_t i = 0; i < n; i++)
        pf_block_put(all[i]);
    free(all);
    assert_int_equal(allocs[0].refs, 2);
    pf_block_put(got[0]);
    pf_block_put(got[1]);
    assert_int_equal(allocs[0].refs, 1);
    assert_int_equal(allocs[1].refs, 1);
    pf_cache_destroy(c);
}

/* A pinned lease: consume hands out new references and the last share unpins; release,
 * expiry, instance drop and table destroy unpin too. */
static void test_pinned_leases(void **st)
{
    allocs_init();
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 1000);
    struct pf_lease_table *t;
    assert_int_equal(pf_lease_table_create(&clk.base, 600 * PF_NS_PER_SEC, &t), 0);
    struct pf_block_key keys[3];
    struct pf_cache *c = fill(keys, 3);
    struct pf_block *got[3];
    uint8_t id[16];
    assert_int_equal(pf_cache_prefix_pin(c, keys, 3, got), 3);
    assert_int_equal(pf_lease_create_pinned(t, c, "inst", got, 3, 2, id), 0);
    struct pf_block **out;
    size_t n;
    char msg[128];
    for (int share = 0; share < 2; share++) {
        assert_int_equal(pf_lease_consume(t, id, 16, "inst", &out, &n, msg, sizeof(msg)), 0);
        assert_int_equal(n, 3);
        assert_int_equal(pf_cache_pins(c, out[2]), share == 0 ? 1 : 0);
        for (size_t i = 0; i < n; i++)
            pf_block_put(out[i]);
        free(out);
    }
    assert_int_equal(pf_lease_count(t), 0);
    /* release */
    assert_int_equal(pf_cache_prefix_pin(c, keys, 3, got), 3);
    assert_int_equal(pf_lease_create_pinned(t, c, "inst", got, 3, 1, id), 0);
    assert_int_equal(pf_lease_release(t, id, 16), 0);
    assert_int_equal(pf_cache_pins(c, got[0]), 0);
    /* expiry */
    assert_int_equal(pf_cache_prefix_pin(c, keys, 1, got), 1);
    assert_int_equal(pf_lease_create_pinned(t, c, "inst", got, 1, 1, id), 0);
    pf_fake_clock_advance(&clk, 600 * PF_NS_PER_SEC);
    assert_int_equal(pf_lease_sweep(t), 1);
    assert_int_equal(pf_cache_pins(c, got[0]), 0);
    /* instance drop, then table destroy with a lease left */
    assert_int_equal(pf_cache_prefix_pin(c, keys, 2, got), 2);
    assert_int_equal(pf_lease_create_pinned(t, c, "x", got, 1, 1, id), 0);
    assert_int_equal(pf_lease_create_pinned(t, c, "y", got + 1, 1, 1, id), 0);
    assert_int_equal(pf_lease_drop_instance(t, "x"), 1);
    assert_int_equal(pf_cache_pins(c, got[0]), 0);
    assert_int_equal(pf_cache_pins(c, got[1]), 1);
    pf_lease_table_destroy(t);
    assert_int_equal(pf_cache_pins(c, got[1]), 0);
    pf_cache_destroy(c);
    for (int i = 0; i < 3; i++)
        assert_int_equal(allocs[i].refs, 1);
}

/* The pin count saturates: the hit it cannot pin ends the prefix (a miss), nothing wraps. */
static void test_pin_saturation(void **st)
{
    allocs_init();
    struct pf_block_key keys[2];
    struct pf_cache *c = fill(keys, 2);
    struct pf_block *b = NULL, *pair[2];
    for (uint32_t i = 0; i < PF_CACHE_PIN_MAX; i++)
        assert_int_equal(pf_cache_prefix_pin(c, keys + 1, 1, &b), 1);
    assert_int_equal(pf_cache_pins(c, b), PF_CACHE_PIN_MAX);
    assert_int_equal(pf_cache_prefix_pin(c, keys, 2, pair), 1); /* key 1 cannot be pinned */
    pf_cache_unpin(c, pair, 1);
    assert_int_equal(pf_cache_prefix_pin(c, keys + 1, 1, pair), 0);
    assert_int_equal(pf_cache_pins(c, b), PF_CACHE_PIN_MAX);
    for (uint32_t i = 0; i < PF_CACHE_PIN_MAX; i++)
        pf_cache_unpin(c, &b, 1);
    assert_int_equal(pf_cache_pins(c, b), 0);
    pf_cache_destroy(c);
}

/* ---- the race: queries pin and lease, others evict, clean up and refill ---- */

#define RN      64 /* keys */
#define R_ITERS 3000

struct race {
    struct pf_cache *c;
    struct pf_lease_table *t;
    struct pf_alloc a[RN]; /* one per key: a block's data names its key */
    uint8_t data[RN][64];
    _Atomic int bad;
    _Atomic int stop;
    _Atomic uint64_t consumed;
    _Atomic uint64_t consumed_raw; /* of those, by the raw-hash query thread */
    _Atomic int nquery;            /* query threads started: odd ones look up raw hashes */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct pf_block *race_blk(struct race *r, uint32_t i)
{
    struct pf_block_key k = key(1, i);
    pf_alloc_get(&r->a[i]);
    struct pf_slot s = {
        .k = r->data[i], .ka = &r->a[i], .seg_len = 64, .seg_stride = 64, .nseg = 1};
    struct pf_block *b;
    if (pf_block_pack(NULL, &k, 1, &s, &b) != 0)
        return NULL;
    return b;
}

static void *race_query(void *arg)
{
    struct race *r = arg;
    struct pf_block_key keys[RN];
    for (uint32_t i = 0; i < RN; i++)
        keys[i] = key(1, i);
    struct pf_bytes raw[RN];
    for (uint32_t i = 0; i < RN; i++)
        raw[i] = (struct pf_bytes){keys[i].hash, keys[i].len};
    bool use_raw = atomic_fetch_add(&r->nquery, 1) % 2 == 1; /* QueryPrefetch's form */
    struct pf_block *got[RN];
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uintptr_t)&keys;
    /* R_ITERS rounds, and on until this thread consumed a lease (a loaded machine may run
     * them all while the evictor has the cache empty), 30 s at most */
    uint64_t mine = 0, deadline = mono_ns() + 30000000000ull;
    for (int it = 0; it < R_ITERS || (mine == 0 && mono_ns() < deadline); it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = 1 + x % RN;
        size_t hits = use_raw ? pf_cache_prefix_pin_hashes(r->c, 1, raw, n, got)
                              : pf_cache_prefix_pin(r->c, keys, n, got);
        if (hits == 0)
            continue;
        uint8_t id[16];
        if (pf_lease_create_pinned(r->t, r->c, "inst", got, hits, 2, id) != 0)
            continue;
        for (int share = 0; share < 2; share++) {
            struct pf_block **out;
            size_t m;
            if (pf_lease_consume(r->t, id, 16, "inst", &out, &m, NULL, 0) != 0) {
                atomic_store(&r->bad, 1); /* a live lease of ours must answer */
                break;
            }
            for (size_t i = 0; i < m; i++) {
                /* a freed (and recycled) record would carry another key or allocation */
                struct pf_block_key k = pf_block_key(out[i]);
                struct pf_slot s;
                pf_block_slot(out[i], 0, &s);
                if (!pf_key_eq(&k, &keys[i]) || s.k != r->data[i])
                    atomic_store(&r->bad, 1);
                pf_block_put(out[i]);
            }
            free(out);
            atomic_fetch_add(&r->consumed, 1);
            if (use_raw)
                atomic_fetch_add(&r->consumed_raw, 1);
            mine++;
        }
    }
    return NULL;
}

static void *race_evict(void *arg)
{
    struct race *r = arg;
    struct pf_block *ev[RN];
    uint32_t round = 0;
    while (!atomic_load(&r->stop)) {
        size_t n;
        struct pf_block **all = NULL;
        if (++round % 8 == 0) {
            n = pf_cache_remove_all(r->c, &all); /* cleanup: pinned blocks leave too */
        } else {
            n = pf_cache_evict(r->c, RN / 2, ev, NULL);
            for (size_t i = 0; i < n; i++)
                if (pf_cache_pins(r->c, ev[i]) != 0)
                    atomic_store(&r->bad, 2); /* eviction took a pinned block */
        }
        for (size_t i = 0; i < n; i++)
            pf_block_put(all ? all[i] : ev[i]);
        free(all);
        /* refill what is missing with fresh blocks */
        for (uint32_t i = 0; i < RN; i++) {
            struct pf_block_key k = key(1, i);
            if (pf_cache_contains(r->c, &k))
                continue;
            struct pf_block *b = race_blk(r, i);
            if (b) {
                pf_cache_insert(r->c, b, PF_CLASS_RETAINED);
                pf_block_put(b);
            }
        }
    }
    return NULL;
}

static void test_pin_evict_race(void **st)
{
    struct race *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    for (int i = 0; i < RN; i++)
        r->a[i] = (struct pf_alloc){.ptr = r->data[i], .size = 64, .refs = 1};
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 1000);
    assert_int_equal(pf_cache_create(NULL, &r->c), 0);
    assert_int_equal(pf_lease_table_create(&clk.base, 600 * PF_NS_PER_SEC, &r->t), 0);
    for (uint32_t i = 0; i < RN; i++) { /* resident before the threads start */
        struct pf_block *b = race_blk(r, i);
        assert_non_null(b);
        assert_int_equal(pf_cache_insert(r->c, b, PF_CLASS_RETAINED), 1);
        pf_block_put(b);
    }
    pthread_t q[2], ev;
    assert_int_equal(pthread_create(&ev, NULL, race_evict, r), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&q[i], NULL, race_query, r), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(q[i], NULL);
    atomic_store(&r->stop, 1);
    pthread_join(ev, NULL);
    assert_int_equal(atomic_load(&r->bad), 0);
    assert_true(atomic_load(&r->consumed) > atomic_load(&r->consumed_raw));
    assert_true(atomic_load(&r->consumed_raw) > 0); /* both lookup forms took part */
    assert_int_equal(pf_lease_count(r->t), 0);
    pf_lease_table_destroy(r->t);
    pf_cache_destroy(r->c);
    for (int i = 0; i < RN; i++)
        assert_int_equal(r->a[i].refs, 1); /* every block released exactly once */
    free(r);
}

/* pf_cache_prefix_pin_hashes (raw request hashes of one namespace, no keys built) against
 * pf_cache_contains of the keys it stands for, over seeded random batches at load factor up
 * to 1: the same prefix length, the same blocks (one pin each, recency marked), nothing
 * pinned past the first miss; hashes of other namespaces' blocks, one byte short, one bit
 * off, of length 0 or above PF_HASH_MAX all miss; pf_hash_of equals pf_key_hash. */
static uint64_t rng = 1;
static uint64_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void test_pin_raw_hashes(void **st)
{
    rng = pft_seed() | 1;
    enum { N = 6000, Q = 3000, NS = 3 };
    struct pf_cache *c;
    assert_int_equal(pf_cache_create(NULL, &c), 0);
    static uint8_t data[64];
    struct pf_alloc a = {.ptr = data, .size = sizeof(data), .refs = 1};
    struct pf_block_key *res = malloc(N * sizeof(*res));
    struct pf_block **blocks = malloc(N * sizeof(*blocks));
    for (uint32_t i = 0; i < N; i++) {
        uint8_t h[PF_HASH_MAX];
        for (size_t j = 0; j < sizeof(h); j++)
            h[j] = (uint8_t)rnd();
        memcpy(h, &i, sizeof(i)); /* distinct keys */
        size_t len = i % 4 == 0 ? 32 : i % 4 == 1 ? 16 : 4 + rnd() % (PF_HASH_MAX - 3);
        assert_int_equal(pf_key_make(1 + i % NS, h, len, &res[i]), 0);
        assert_int_equal(pf_hash_of(res[i].ns, res[i].hash, len), pf_key_hash(&res[i]));
        pf_alloc_get(&a);
        struct pf_slot s = {.k = data, .ka = &a, .seg_len = 64, .seg_stride = 64, .nseg = 1};
        assert_int_equal(pf_block_pack(NULL, &res[i], 1, &s, &blocks[i]), 0);
        assert_int_equal(pf_cache_insert(c, blocks[i], PF_CLASS_RETAINED), 1);
    }
    uint8_t(*buf)[PF_HASH_MAX + 8] = malloc(Q * sizeof(*buf)); /* the "request bytes" */
    struct pf_bytes *raw = malloc(Q * sizeof(*raw));
    struct pf_block **out = malloc(Q * sizeof(*out));
    size_t *idx = malloc(Q * sizeof(*idx));
    for (int round = 0; round < 40; round++) {
        uint32_t ns = 1 + (uint32_t)(rnd() % NS);
        size_t n = round == 0 ? 1 : 1 + rnd() % Q, want = SIZE_MAX;
        for (size_t i = 0; i < n; i++) {
            size_t j;
            do
                j = rnd() % N;
            while (res[j].ns != ns);
            idx[i] = j;
            memcpy(buf[i], res[j].hash, res[j].len);
            raw[i] = (struct pf_bytes){buf[i], res[j].len};
            uint64_t r = rnd() % 200;
            if (i == 0 || r >= 6)
                continue;
            /* a near miss: another namespace's block, one byte short, one bit off, empty,
             * longer than any key */
            if (r == 0) {
                do
                    j = rnd() % N;
                while (res[j].ns == ns);
                memcpy(buf[i], res[j].hash, res[j].len);
                raw[i].len = res[j].len;
            } else if (r == 1) {
                raw[i].len--;
            } else if (r == 2) {
                buf[i][rnd() % raw[i].len] ^= 1;
            } else if (r == 3) {
                raw[i].len = 0;
            } else {
                memset(buf[i] + raw[i].len, 0, sizeof(buf[i]) - raw[i].len);
                raw[i].len = PF_HASH_MAX + 1 + rnd() % 8;
            }
            struct pf_block_key k;
            bool in = pf_key_make(ns, raw[i].data, raw[i].len, &k) == 0 && pf_cache_contains(c, &k);
            if (!in)
                idx[i] = SIZE_MAX;
            else /* another resident key by chance: find which */
                for (j = 0; j < N; j++)
                    if (pf_key_eq(&k, &res[j]))
                        idx[i] = j;
        }
        for (size_t i = 0; i < n && want == SIZE_MAX; i++)
            if (idx[i] == SIZE_MAX)
                want = i;
        if (want == SIZE_MAX)
            want = n;
        for (size_t i = 0; i < N; i++)
            blocks[i]->accessed = 0;
        size_t got = pf_cache_prefix_pin_hashes(c, ns, raw, n, out);
        assert_int_equal(got, want);
        for (size_t i = 0; i < got; i++) {
            assert_ptr_equal(out[i], blocks[idx[i]]);
            assert_int_equal(out[i]->accessed, 1);
        }
        /* one pin per hit position (a block may repeat), none past the prefix */
        for (size_t i = 0; i < N; i++) {
            size_t pins = 0;
            for (size_t j = 0; j < got; j++)
                pins += idx[j] == i;
            assert_int_equal(pf_cache_pins(c, blocks[i]), pins);
            assert_int_equal(pf_block_strong(blocks[i]), 2);
            if (pins == 0)
                assert_int_equal(blocks[i]->accessed, 0);
        }
        pf_cache_unpin(c, out, got);
    }
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(pf_cache_pins(c, blocks[i]), 0);
        pf_block_put(blocks[i]);
    }
    /* an empty cache answers 0 without touching its index */
    struct pf_cache *e;
    assert_int_equal(pf_cache_create(NULL, &e), 0);
    assert_int_equal(pf_cache_prefix_pin_hashes(e, 1, raw, 5, out), 0);
    pf_cache_destroy(e);
    pf_cache_destroy(c);
    assert_int_equal(a.refs, 1);
    free(idx);
    free(out);
    free(raw);
    free(buf);
    free(blocks);
    free(res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_blocks_eviction), cmocka_unit_test(test_pin_survives_remove_all),
        cmocka_unit_test(test_pins_to_refs),        cmocka_unit_test(test_pinned_leases),
        cmocka_unit_test(test_pin_saturation),      cmocka_unit_test(test_pin_evict_race),
        cmocka_unit_test(test_pin_raw_hashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SSD index accounting per namespace (src/ssd/index.c; the SSD quotas of docs/security.md
 * "Tenants"): live bytes per namespace through a write (reserved, committed, failed), the
 * ring overwriting, drops, recovery inserts (superseded records, age order after the scan),
 * and ssd_index_shed: a namespace's oldest committed entries only, never another
 * namespace's, never a write in flight. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "pf/pool.h"
#include "ssd/ssd_internal.h"

#define NS_A 1
#define NS_B 2

static uint8_t fake_mem[1 << 14];
static struct pf_alloc fake = {.ptr = fake_mem, .size = sizeof(fake_mem), .refs = 1u << 30};

/* A one-slot block of namespace ns with a 1 KiB segment (the index only reads geometry). */
static struct pf_block *mkblock(uint32_t ns, uint32_t id)
{
    struct pf_block_key k;
    assert_int_equal(pf_key_make(ns, &id, sizeof(id), &k), 0);
    pf_alloc_get(&fake);
    struct pf_slot s = {.k = fake_mem,
                        .ka = &fake,
                        .seg_len = 1024,
                        .seg_stride = 1024,
                        .nseg = 1,
                        .checksum = id,
                        .has_checksum = 1};
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 1, &s, &b), 0);
    return b;
}

/* A write of b as one record of 1 KiB (no header), committed when commit. */
static struct ssd_place put(struct ssd_index *x, struct pf_block *b, uint64_t seq, bool commit)
{
    struct ssd_rec_slot rs = {.checksum = 1, .seg_len = 1024, .seg_stride = 1024, .nseg = 1};
    struct ssd_place p;
    assert_int_equal(ssd_index_begin(x, b, &rs, 0, 1024, seq, &p), 0);
    if (commit) {
        struct pf_block_key k = pf_block_key(b);
        assert_int_equal(ssd_index_commit(x, &k, &p), 0);
    }
    return p;
}

static bool has(struct ssd_index *x, struct pf_block *b)
{
    struct pf_block_key k = pf_block_key(b);
    return ssd_index_find(x, &k) != NULL;
}

static void test_write_accounting(void **st)
{
    (void)st;
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 1, 16 * 1024, 0), 0);
    struct pf_block *a0 = mkblock(NS_A, 0), *a1 = mkblock(NS_A, 1), *b0 = mkblock(NS_B, 0);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 0);
    assert_int_equal(ssd_index_ns_bytes(&x, 77), 0); /* never seen */
    struct ssd_place pa0 = put(&x, a0, 1, false);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 1024); /* reserved while in flight */
    struct pf_block_key ka0 = pf_block_key(a0);
    assert_int_equal(ssd_index_commit(&x, &ka0, &pa0), 0);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 1024); /* committing does not count twice */
    struct ssd_place pa1 = put(&x, a1, 2, false);
    put(&x, b0, 3, true);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 2048);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_B), 1024);
    /* a failed write stops counting */
    struct pf_block_key ka1 = pf_block_key(a1);
    assert_true(ssd_index_remove(&x, &ka1, &pa1));
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 1024);
    /* a dropped entry too (e.g. a recovered record replaced by another geometry) */
    ssd_index_drop(&x, ssd_index_find(&x, &ka0));
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 0);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_B), 1024);
    ssd_index_destroy(&x);
    pf_block_put(a0);
    pf_block_put(a1);
    pf_block_put(b0);
}

static void test_ring_overwrite(void **st)
{
    (void)st;
    /* 4 records per lap: writing 6 of A then 2 of B leaves A's newest 2 and B's 2 */
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 1, 4096, 0), 0);
    struct pf_block *a[6], *b[2];
    uint64_t seq = 1;
    for (uint32_t i = 0; i < 6; i++) {
        a[i] = mkblock(NS_A, i);
        put(&x, a[i], seq++, true);
        assert_true(ssd_index_ns_bytes(&x, NS_A) <= 4096);
    }
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 4096);
    for (uint32_t i = 0; i < 2; i++) {
        b[i] = mkblock(NS_B, i);
        put(&x, b[i], seq++, true);
    }
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 2048);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_B), 2048);
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(has(&x, a[i]), i >= 4);
    ssd_index_destroy(&x);
    for (int i = 0; i < 6; i++)
        pf_block_put(a[i]);
    for (int i = 0; i < 2; i++)
        pf_block_put(b[i]);
}

static void test_shed(void **st)
{
    (void)st;
    /* two shards, round-robin: A's entries alternate shards; its oldest go first across
     * them, B's never */
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 2, 16 * 1024, 0), 0);
    struct pf_block *a[6], *b[4];
    uint64_t seq = 1;
    for (uint32_t i = 0; i < 4; i++) {
        a[i] = mkblock(NS_A, i);
        put(&x, a[i], seq++, true);
        b[i] = mkblock(NS_B, i);
        put(&x, b[i], seq++, true);
    }
    a[4] = mkblock(NS_A, 4);
    put(&x, a[4], seq++, false); /* in flight: never shed */
    a[5] = mkblock(NS_A, 5);
    put(&x, a[5], seq++, true);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 6 * 1024);
    uint32_t ids[1] = {NS_A};
    uint64_t bytes = 0;
    assert_int_equal(ssd_index_shed(&x, ids, 1, 3 * 1024, &bytes), 3);
    assert_int_equal(bytes, 3 * 1024);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 3 * 1024);
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(has(&x, a[i]), i >= 3);
    for (uint32_t i = 0; i < 4; i++)
        assert_true(has(&x, b[i]));
    assert_int_equal(ssd_index_ns_bytes(&x, NS_B), 4 * 1024);
    /* under the goal already: nothing */
    assert_int_equal(ssd_index_shed(&x, ids, 1, 3 * 1024, &bytes), 0);
    assert_int_equal(bytes, 0);
    /* to 0: the committed ones go, the write in flight stays (and still counts) */
    assert_int_equal(ssd_index_shed(&x, ids, 1, 0, NULL), 2);
    assert_true(has(&x, a[4]));
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 1024);
    /* two namespaces under one quota: B's oldest first, then by age across both */
    uint32_t both[2] = {NS_A, NS_B};
    assert_int_equal(ssd_index_shed(&x, both, 2, 3 * 1024, NULL), 2);
    assert_false(has(&x, b[0]));
    assert_false(has(&x, b[1]));
    assert_true(has(&x, b[2]));
    ssd_index_destroy(&x);
    for (int i = 0; i < 6; i++)
        pf_block_put(a[i]);
    for (int i = 0; i < 4; i++)
        pf_block_put(b[i]);
}

/* A recovered entry as the scan builds it (recover.c index_record). */
static struct ssd_entry *recovered(uint32_t ns, uint32_t id, uint32_t shard, uint64_t start,
                                   uint64_t seq)
{
    struct ssd_entry *e = calloc(1, sizeof(*e) + sizeof(e->slots[0]));
    assert_non_null(e);
    assert_int_equal(pf_key_make(ns, &id, sizeof(id), &e->key), 0);
    e->shard = shard;
    e->state = SSD_COMMITTED;
    e->recovered = 1;
    e->nslots = 1;
    e->start = start;
    e->off = start + 4096;
    e->len = 1024;
    e->span = 4096 + 1024;
    e->seq = seq;
    return e;
}

static void test_recovery(void **st)
{
    (void)st;
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 2, 64 * 1024, 0), 0);
    /* disk order per shard is not age order across shards */
    uint64_t seqs[6] = {5, 1, 9, 2, 4, 8};
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(ssd_index_insert(&x, recovered(NS_A, i, i / 3, (i % 3) * 5120, seqs[i])),
                         0);
    assert_int_equal(ssd_index_insert(&x, recovered(NS_B, 0, 0, 3 * 5120, 3)), 0);
    assert_int_equal(x.ncommitted, 7);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 6 * 5120);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_B), 5120);
    /* a newer record of key A/1 supersedes the older one (as index_record does) */
    struct ssd_entry *n = recovered(NS_A, 1, 1, 3 * 5120, 10);
    struct ssd_entry *old = ssd_index_find(&x, &n->key);
    assert_non_null(old);
    ssd_index_drop(&x, old);
    assert_int_equal(ssd_index_insert(&x, n), 0);
    assert_int_equal(ssd_index_ns_bytes(&x, NS_A), 6 * 5120);
    assert_int_equal(ssd_index_ns_sort(&x), 0);
    /* shedding takes A's records by age: seqs 2, 4, 5 (ids 3, 4, 0) */
    uint32_t ids[1] = {NS_A};
    assert_int_equal(ssd_index_shed(&x, ids, 1, 3 * 5120, NULL), 3);
    uint32_t gone[3] = {3, 4, 0}, kept[3] = {1, 2, 5};
    for (int i = 0; i < 3; i++) {
        struct pf_block_key k;
        assert_int_equal(pf_key_make(NS_A, &gone[i], sizeof(gone[i]), &k), 0);
        assert_null(ssd_index_find(&x, &k));
        assert_int_equal(pf_key_make(NS_A, &kept[i], sizeof(kept[i]), &k), 0);
        assert_non_null(ssd_index_find(&x, &k));
    }
    assert_int_equal(ssd_index_ns_bytes(&x, NS_B), 5120);
    ssd_index_destroy(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_accounting),
        cmocka_unit_test(test_ring_overwrite),
        cmocka_unit_test(test_shed),
        cmocka_unit_test(test_recovery),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

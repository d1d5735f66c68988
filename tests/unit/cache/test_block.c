/* Block record encoding (src/cache/block.c): wide slots packed into the compact record and
 * decoded back field for field and pointer for pointer, with slots from several allocations,
 * allocation tables shared through a packer, mixed and wide geometry, reference widths at
 * their limits, refused encodings, long and short keys, and the documented record sizes.
 * Allocations are stand-ins over one PROT_NONE reservation (offsets up to 8 GiB without
 * memory); their counts start at 1 (the test's own) so they never reach 0. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "pf/block.h"
#include "pf/pool.h"

#define RESERVE (9ull << 30)
#define NA      8

static char *space;
static struct pf_alloc fa[NA];

static uint32_t refs(int i)
{
    return atomic_load(&fa[i].refs);
}

static int setup(void **st)
{
    (void)st;
    space = mmap(NULL, RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(space != MAP_FAILED);
    for (int i = 0; i < NA; i++) {
        fa[i].ptr = space + (uint64_t)i * (1ull << 30); /* 1 GiB apart, the last 2 GiB */
        fa[i].size = 1ull << 30;
        atomic_init(&fa[i].refs, 1);
    }
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    for (int i = 0; i < NA; i++)
        assert_int_equal(refs(i), 1); /* every reference a block took came back */
    munmap(space, RESERVE);
    return 0;
}

static struct pf_block_key mkkey(size_t len, uint8_t seed)
{
    uint8_t h[PF_HASH_MAX];
    for (size_t i = 0; i < sizeof(h); i++)
        h[i] = (uint8_t)(seed * 31 + i * 7 + 1);
    struct pf_block_key k;
    assert_int_equal(pf_key_make(3, h, len, &k), 0);
    return k;
}

/* A one- or two-segment slot at (alloc ka, offset ko) and (va, vo), with references. */
static struct pf_slot mkslot(int ka, uint64_t ko, int va, uint64_t vo, uint8_t nseg, uint32_t len,
                             uint32_t stride, int16_t numa, uint64_t csum)
{
    struct pf_slot s = {.k = (char *)fa[ka].ptr + ko,
                        .ka = &fa[ka],
                        .seg_len = len,
                        .seg_stride = stride,
                        .numa = numa,
                        .nseg = nseg,
                        .checksum = csum,
                        .has_checksum = csum != 0};
    pf_alloc_get(&fa[ka]);
    if (nseg == 2) {
        s.v = (char *)fa[va].ptr + vo;
        s.va = &fa[va];
        pf_alloc_get(&fa[va]);
    }
    return s;
}

/* Every decoded field equals the wide slot it was packed from. */
static void check_same(const struct pf_block *b, const struct pf_slot *want, uint16_t n)
{
    assert_int_equal(b->nslots, n);
    uint64_t fp = 0;
    for (uint16_t i = 0; i < n; i++) {
        struct pf_slot s;
        pf_block_slot(b, i, &s);
        assert_ptr_equal(s.k, want[i].k);
        assert_ptr_equal(pf_slot_k(b, i), want[i].k);
        assert_ptr_equal(s.v, want[i].nseg == 2 ? want[i].v : NULL);
        assert_ptr_equal(pf_slot_v(b, i), s.v);
        assert_int_equal(s.seg_len, want[i].seg_len);
        assert_int_equal(s.seg_stride, want[i].seg_stride);
        assert_int_equal(s.numa, want[i].numa);
        assert_int_equal(s.nseg, want[i].nseg);
        assert_int_equal(s.has_checksum, want[i].has_checksum);
        if (want[i].has_checksum)
            assert_true(s.checksum == want[i].checksum);
        fp += (uint64_t)want[i].seg_stride * want[i].nseg;
    }
    assert_true(pf_block_footprint(b) == fp);
}

static void test_several_allocations(void **st)
{
    (void)st;
    enum { N = 8 };
    struct pf_slot s[N], want[N];
    uint32_t seed = 12345;
    printf("seed %u\n", seed);
    srand(seed);
    for (int i = 0; i < N; i++)
        s[i] = mkslot(i % 4, (uint64_t)(rand() % 100000) * 64, (i + 1) % 4,
                      (uint64_t)(rand() % 100000) * 64, 2, 4096, 4096, 0,
                      ((uint64_t)rand() << 32) | (uint64_t)rand() | 1);
    memcpy(want, s, sizeof(s));
    struct pf_block_key k = mkkey(32, 1);
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, N, s, &b), 0);
    for (int i = 0; i < N; i++)
        assert_null(s[i].ka); /* moved into the block */
    for (int i = 0; i < 4; i++)
        assert_int_equal(refs(i), 2); /* ours + the block's table */
    assert_false(b->fmt & (PF_BLK_SINGLE | PF_BLK_GEO_SLOT | PF_BLK_GEO_WIDE | PF_BLK_REF8));
    assert_true(b->fmt & PF_BLK_TWOSEG);
    assert_true(b->fmt & PF_BLK_CSUM);
    check_same(b, want, N);
    assert_true(pf_block_key_eq(b, &k));
    assert_int_equal(pf_block_record_size(b), 92 + N * 8 + 8 + N * 2 * 4);
    /* a weak reference keeps the record, not the data */
    pf_block_weak_get(b);
    pf_block_put(b);
    for (int i = 0; i < 4; i++)
        assert_int_equal(refs(i), 1);
    assert_false(pf_block_upgrade(b));
    pf_block_weak_put(b);
}

static void test_packer_shares_tables(void **st)
{
    (void)st;
    struct pf_block_packer pk = {0};
    struct pf_block *b[3];
    for (int j = 0; j < 3; j++) {
        struct pf_slot s[3];
        int base = j == 2 ? 3 : 0; /* the third block uses other allocations */
        for (int i = 0; i < 3; i++)
            s[i] = mkslot(base + i, (uint64_t)j * 512, 0, 0, 1, 512, 512, -1, 0);
        struct pf_block_key k = mkkey(32, (uint8_t)(10 + j));
        assert_int_equal(pf_block_pack(&pk, &k, 3, s, &b[j]), 0);
        assert_false(b[j]->fmt & PF_BLK_CSUM); /* no slot has a checksum */
        assert_int_equal(pf_block_record_size(b[j]), 92 + 8 + 3 * 4);
    }
    assert_ptr_equal(b[0]->allocs, b[1]->allocs);
    assert_ptr_not_equal(b[1]->allocs, b[2]->allocs);
    assert_int_equal(refs(0), 2); /* one table reference for two blocks */
    assert_int_equal(refs(3), 2);
    assert_int_equal(refs(4), 2);
    pf_block_packer_done(&pk);
    pf_block_put(b[0]);
    assert_int_equal(refs(1), 2); /* b[1] still holds the table */
    assert_true(pf_slot_k(b[1], 1) == (char *)fa[1].ptr + 512);
    pf_block_put(b[1]);
    pf_block_put(b[2]);
    assert_int_equal(refs(1), 1);
    assert_int_equal(refs(5), 1);
    /* one allocation: referenced directly, no table */
    struct pf_slot one = mkslot(6, 4096, 0, 0, 1, 100, 100, 1, 7);
    struct pf_block_key k = mkkey(32, 20);
    struct pf_block *d;
    assert_int_equal(pf_block_pack(&pk, &k, 1, &one, &d), 0);
    assert_true(d->fmt & PF_BLK_SINGLE);
    assert_ptr_equal(d->allocs, &fa[6]);
    assert_null(pk.last);
    pf_block_put(d);
}

static void test_mixed_and_wide_geometry(void **st)
{
    (void)st;
    struct pf_slot s[5], want[5];
    s[0] = mkslot(0, 0, 1, 0, 2, 1000, 1024, 0, 11);
    s[1] = mkslot(0, 2048, 0, 0, 1, 700, 1024, -1, 0); /* no checksum, one segment */
    s[2] = mkslot(1, 4096, 1, 8192, 2, 4096, 4096, 1, 13);
    s[3] = mkslot(2, 0, 0, 0, 1, 5, 5, 63, 14);
    s[4] = mkslot(2, 64, 0, 0, 1, 1, 1, -1, 15);
    memcpy(want, s, sizeof(s));
    struct pf_block_key k = mkkey(16, 2);
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 5, s, &b), 0);
    assert_true(b->fmt & PF_BLK_GEO_SLOT);
    assert_false(b->fmt & PF_BLK_GEO_WIDE);
    check_same(b, want, 5);
    pf_block_put(b);
    /* a stride 64 KiB past the data, or a NUMA node past 63: 12-byte records */
    struct pf_slot w[2], ww[2];
    w[0] = mkslot(3, 0, 3, 1u << 20, 2, 100, 100 + 65536, 0, 21);
    w[1] = mkslot(3, 2u << 20, 3, 3u << 20, 2, 100, 100 + 65536, 0, 22);
    memcpy(ww, w, sizeof(w));
    assert_int_equal(pf_block_pack(NULL, &k, 2, w, &b), 0);
    assert_true(b->fmt & PF_BLK_GEO_WIDE);
    assert_false(b->fmt & PF_BLK_GEO_SLOT); /* both agree */
    check_same(b, ww, 2);
    pf_block_put(b);
    w[0] = mkslot(3, 0, 0, 0, 1, 512, 512, 100, 0);
    w[1] = mkslot(3, 512, 0, 0, 1, 512, 512, -1, 0);
    memcpy(ww, w, sizeof(w));
    assert_int_equal(pf_block_pack(NULL, &k, 2, w, &b), 0);
    assert_true(b->fmt & PF_BLK_GEO_WIDE);
    assert_true(b->fmt & PF_BLK_GEO_SLOT);
    check_same(b, ww, 2);
    pf_block_put(b);
}

static void pack_one(int na, uint64_t off, bool ref8)
{
    struct pf_slot s[2], want[2];
    s[0] = mkslot(0, off, 0, 0, 1, 64, 64, 0, 1);
    s[1] = mkslot(na > 1 ? 1 : 0, 0, 0, 0, 1, 64, 64, 0, 2);
    memcpy(want, s, sizeof(s));
    struct pf_block_key k = mkkey(32, 3);
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 2, s, &b), 0);
    assert_int_equal(!!(b->fmt & PF_BLK_REF8), ref8);
    check_same(b, want, 2);
    pf_block_put(b);
}

static void test_reference_limits(void **st)
{
    (void)st;
    /* one allocation: 32 offset bits in 4 bytes */
    pack_one(1, UINT32_MAX, false);
    pack_one(1, 1ull << 32, true);
    /* two allocations: one index bit leaves 31 */
    pack_one(2, (1ull << 31) - 1, false);
    pack_one(2, 1ull << 31, true);
    pack_one(2, (1ull << 33) - 64, true);
}

static void test_refused(void **st)
{
    (void)st;
    struct pf_block_key k = mkkey(32, 4);
    struct pf_block *b = NULL;
    /* an offset that does not fit 64 bits beside the index bits (not real memory: the
     * encoding is refused before anything is dereferenced) */
    struct pf_alloc lo = {.ptr = (void *)(uintptr_t)4096, .size = 1};
    atomic_init(&lo.refs, 2);
    struct pf_slot s[2] = {
        {.k = (void *)(uintptr_t)(4096 + (1ull << 63)),
         .ka = &lo,
         .seg_len = 8,
         .seg_stride = 8,
         .nseg = 1},
        {.k = fa[0].ptr, .ka = &fa[0], .seg_len = 8, .seg_stride = 8, .nseg = 1}};
    pf_alloc_get(&fa[0]);
    assert_int_equal(pf_block_pack(NULL, &k, 2, s, &b), -ERANGE);
    assert_null(b);
    assert_ptr_equal(s[0].ka, &lo); /* the caller keeps its references */
    assert_int_equal(atomic_load(&lo.refs), 2);
    assert_int_equal(refs(0), 2);
    pf_alloc_put(&fa[0]);
    /* slots that break the rules */
    struct pf_slot bad[7];
    bad[0] = (struct pf_slot){.k = fa[1].ptr, .ka = &fa[1], .seg_len = 8, .seg_stride = 8};
    bad[1] = bad[0];
    bad[1].nseg = 3;
    bad[2] = bad[0];
    bad[2].nseg = 2; /* no V */
    bad[3] = bad[0];
    bad[3].nseg = 1;
    bad[3].seg_stride = 4; /* stride below the data */
    bad[4] = bad[3];
    bad[4].seg_stride = 8;
    bad[4].k = (char *)fa[2].ptr - 64; /* before its allocation */
    bad[4].ka = &fa[2];
    bad[5] = bad[4];
    bad[5].k = fa[2].ptr;
    bad[5].ka = NULL;
    bad[6] = bad[5];
    bad[6].ka = &fa[2];
    for (int i = 0; i < 6; i++) {
        assert_int_equal(pf_block_pack(NULL, &k, 1, &bad[i], &b), -EINVAL);
        assert_null(b);
    }
    assert_int_equal(pf_block_pack(NULL, &k, 0, &bad[6], &b), -EINVAL);
    struct pf_block_key k0 = k;
    k0.len = 0;
    assert_int_equal(pf_block_pack(NULL, &k0, 1, &bad[6], &b), -EINVAL);
    k0.len = PF_HASH_MAX + 1;
    assert_int_equal(pf_block_pack(NULL, &k0, 1, &bad[6], &b), -EINVAL);
    assert_null(b);
    for (int i = 1; i < 3; i++)
        assert_int_equal(refs(i), 1);
}

static void test_keys_and_sizes(void **st)
{
    (void)st;
    static const size_t lens[] = {1, 16, 31, 32, 33, 36, PF_HASH_MAX};
    for (size_t j = 0; j < sizeof(lens) / sizeof(lens[0]); j++) {
        struct pf_block_key k = mkkey(lens[j], (uint8_t)(40 + j));
        struct pf_slot s = mkslot(0, 0, 0, 0, 1, 64, 64, 0, 9);
        struct pf_block *b;
        assert_int_equal(pf_block_pack(NULL, &k, 1, &s, &b), 0);
        struct pf_block_key got = pf_block_key(b);
        assert_true(pf_key_eq(&got, &k));
        assert_true(pf_block_key_eq(b, &k));
        assert_true(pf_block_key_hash(b) == pf_key_hash(&k));
        assert_int_equal(pf_block_ns(b), 3);
        struct pf_block_key other = k;
        other.hash[lens[j] - 1] ^= 1; /* the last byte (inline or in the tail) */
        assert_false(pf_block_key_eq(b, &other));
        other = k;
        other.ns = 4;
        assert_false(pf_block_key_eq(b, &other));
        size_t extra = lens[j] > 32 ? lens[j] - 32 : 0;
        assert_int_equal(pf_block_record_size(b), 92 + extra + 8 + 8 + 4);
        pf_block_put(b);
    }
    /* the documented sizes: one slot 112 bytes, 32 one-segment layer slots 484 */
    struct pf_slot s[32];
    for (int i = 0; i < 32; i++)
        s[i] = mkslot(i % NA, (uint64_t)i * 16, 0, 0, 1, 16, 16, 0, 5);
    struct pf_block_key k = mkkey(32, 50);
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 32, s, &b), 0);
    assert_int_equal(pf_block_record_size(b), 484);
    pf_block_put(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_several_allocations),
        cmocka_unit_test(test_packer_shares_tables),
        cmocka_unit_test(test_mixed_and_wide_geometry),
        cmocka_unit_test(test_reference_limits),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_keys_and_sizes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* SSD index (src/ssd/index.c): the two-phase state machine, duplicates, FIFO invalidation
 * of overwritten entries, round-robin shard placement, oversize blocks, prefix lookup. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "pf/pool.h"
#include "ssd/ssd_internal.h"

#define SSDT_KEY(b) ((struct pf_block_key[]){pf_block_key(b)})

/* A block with geometry only (the index never touches data): its slots point into a static
 * stand-in allocation whose count never drops to 0. */
static uint8_t fake_mem[1 << 16];
static struct pf_alloc fake = {.ptr = fake_mem, .size = sizeof(fake_mem), .refs = 1u << 30};

static struct pf_block *mkblock(uint32_t id, uint16_t nslots, uint32_t stride)
{
    struct pf_block_key k;
    assert_int_equal(pf_key_make(1, &id, sizeof(id), &k), 0);
    struct pf_slot s[16];
    assert_true(nslots <= 16);
    for (uint16_t i = 0; i < nslots; i++) {
        pf_alloc_get(&fake);
        s[i] = (struct pf_slot){.k = fake_mem,
                                .ka = &fake,
                                .seg_len = stride - 7,
                                .seg_stride = stride,
                                .nseg = (uint8_t)(1 + i % 2),
                                .numa = (int16_t)(i % 3 - 1),
                                .checksum = 0x1000u + id * 16u + i,
                                .has_checksum = 1};
        if (s[i].nseg == 2) {
            pf_alloc_get(&fake);
            s[i].v = fake_mem + stride;
            s[i].va = &fake;
        }
    }
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, nslots, s, &b), 0);
    return b;
}

static uint64_t disk_len(const struct pf_block *b)
{
    return pf_block_footprint(b);
}

/* ssd_index_begin with the block's own slot geometry and no record header (the index only
 * does ring arithmetic over the lengths it is given). */
static int begin(struct ssd_index *x, const struct pf_block *b, uint64_t len, struct ssd_place *p)
{
    struct ssd_rec_slot rs[16];
    for (uint16_t i = 0; i < b->nslots && i < 16; i++) {
        struct pf_slot sv;
        pf_block_slot(b, i, &sv);
        rs[i] = (struct ssd_rec_slot){.checksum = sv.checksum,
                                      .seg_len = sv.seg_len,
                                      .seg_stride = sv.seg_stride,
                                      .numa = sv.numa,
                                      .nseg = sv.nseg};
    }
    return ssd_index_begin(x, b, rs, 0, len, 1, p);
}

static void test_two_phase(void **st)
{
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 1, 8192, 0), 0);
    struct pf_block *b = mkblock(1, 3, 512);
    struct pf_block_key bk = pf_block_key(b);
    struct ssd_place p;
    assert_int_equal(begin(&x, b, disk_len(b), &p), 0);
    assert_int_equal(p.len, 3 * 512 + 512);
    struct ssd_entry *e = ssd_index_find(&x, &bk);
    assert_non_null(e);
    assert_int_equal(e->state, SSD_WRITING);
    /* geometry, NUMA and checksums are kept per slot */
    assert_int_equal(e->nslots, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(e->slots[i].seg_len, 505);
        assert_int_equal(e->slots[i].seg_stride, 512);
        assert_int_equal(e->slots[i].nseg, 1 + i % 2);
        assert_int_equal(e->slots[i].numa, i % 3 - 1);
        assert_int_equal(e->slots[i].checksum, 0x1010u + i);
    }
    /* WRITING is not readable */
    assert_int_equal(ssd_index_prefix(&x, &bk, 1), 0);
    /* duplicates are refused in both states */
    struct ssd_place p2;
    assert_int_equal(begin(&x, b, disk_len(b), &p2), -EEXIST);
    assert_int_equal(ssd_index_commit(&x, &bk, &p), 0);
    assert_int_equal(ssd_index_find(&x, &bk)->state, SSD_COMMITTED);
    assert_int_equal(ssd_index_prefix(&x, &bk, 1), 1);
    assert_int_equal(begin(&x, b, disk_len(b), &p2), -EEXIST);
    /* committing twice is refused */
    assert_int_equal(ssd_index_commit(&x, &bk, &p), -ENOENT);
    assert_int_equal(x.ncommitted, 1);
    assert_int_equal(x.nwriting, 0);
    ssd_index_destroy(&x);
    pf_block_put(b);
}

static void test_failed_write_removed(void **st)
{
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 1, 8192, 0), 0);
    struct pf_block *b = mkblock(2, 1, 1024);
    struct pf_block_key bk = pf_block_key(b);
    struct ssd_place p;
    assert_int_equal(begin(&x, b, 1024, &p), 0);
    /* a place that is not this write's is not touched */
    struct ssd_place other = p;
    other.start += 512;
    assert_false(ssd_index_remove(&x, &bk, &other));
    assert_int_equal(ssd_index_commit(&x, &bk, &other), -ENOENT);
    assert_true(ssd_index_remove(&x, &bk, &p));
    assert_null(ssd_index_find(&x, &bk));
    assert_int_equal(x.nwriting, 0);
    /* and the key can be written again */
    assert_int_equal(begin(&x, b, 1024, &p), 0);
    assert_int_equal(p.start, 1024); /* the ring does not reuse the failed range */
    ssd_index_destroy(&x);
    pf_block_put(b);
}

static void test_fifo_invalidation(void **st)
{
    /* 4 blocks of 1 KiB per lap */
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 1, 4096, 0), 0);
    struct pf_block *b[10];
    struct ssd_place p[10];
    for (uint32_t i = 0; i < 10; i++) {
        b[i] = mkblock(100 + i, 1, 1024);
        assert_int_equal(begin(&x, b[i], 1024, &p[i]), 0);
        assert_int_equal(p[i].off, (i % 4) * 1024);
        assert_int_equal(ssd_index_commit(&x, SSDT_KEY(b[i]), &p[i]), 0);
        /* never more than a lap of entries */
        assert_true(x.ncommitted <= 4);
    }
    for (uint32_t i = 0; i < 10; i++) {
        bool live = i >= 6;
        assert_int_equal(ssd_index_find(&x, SSDT_KEY(b[i])) != NULL, live);
        assert_int_equal(ssd_index_intact(&x, &p[i]), live);
    }
    /* an overwritten key can be written again */
    assert_int_equal(begin(&x, b[0], 1024, &p[0]), 0);
    assert_null(ssd_index_find(&x, SSDT_KEY(b[6]))); /* which overwrote the oldest live one */
    ssd_index_destroy(&x);
    for (int i = 0; i < 10; i++)
        pf_block_put(b[i]);
}

static void test_overtaken_writing(void **st)
{
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 1, 2048, 0), 0);
    struct pf_block *a = mkblock(7, 1, 1024), *b = mkblock(8, 1, 2048);
    struct pf_block_key bk = pf_block_key(b);
    struct ssd_place pa, pb;
    assert_int_equal(begin(&x, a, 1024, &pa), 0);
    /* peek tells the writer that b would overtake a */
    uint32_t sh;
    uint64_t start, tail;
    assert_int_equal(ssd_index_peek(&x, 2048, &sh, &start, &tail), 0);
    assert_int_equal(start, 2048);
    assert_true(tail > pa.start);
    assert_int_equal(begin(&x, b, 2048, &pb), 0);
    /* a was pruned while WRITING: its commit fails, b's works */
    assert_int_equal(x.overtaken, 1);
    assert_int_equal(ssd_index_commit(&x, SSDT_KEY(a), &pa), -ENOENT);
    assert_int_equal(ssd_index_commit(&x, &bk, &pb), 0);
    ssd_index_destroy(&x);
    pf_block_put(a);
    pf_block_put(b);
}

static void test_round_robin_and_oversize(void **st)
{
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 3, 4096, 0), 0);
    struct pf_block *b[7];
    for (uint32_t i = 0; i < 6; i++) {
        b[i] = mkblock(200 + i, 1, 1024);
        struct ssd_place p;
        assert_int_equal(begin(&x, b[i], 1024, &p), 0);
        assert_int_equal(p.shard, i % 3);
        assert_int_equal(p.off, (i / 3) * 1024);
    }
    b[6] = mkblock(300, 5, 1024);
    struct ssd_place p;
    uint32_t sh;
    uint64_t start, tail;
    assert_int_equal(ssd_index_peek(&x, 5120, &sh, &start, &tail), -E2BIG);
    assert_int_equal(begin(&x, b[6], 5120, &p), -E2BIG);
    assert_null(ssd_index_find(&x, SSDT_KEY(b[6])));
    /* an oversize block does not consume a turn */
    assert_int_equal(ssd_index_peek(&x, 1024, &sh, &start, &tail), 0);
    assert_int_equal(sh, 0);
    ssd_index_destroy(&x);
    for (int i = 0; i < 7; i++)
        pf_block_put(b[i]);
}

static void test_prefix(void **st)
{
    struct ssd_index x;
    assert_int_equal(ssd_index_init(&x, 2, 1 << 20, 0), 0);
    struct pf_block *b[6];
    struct pf_block_key keys[6];
    struct ssd_place p[6];
    for (uint32_t i = 0; i < 6; i++) {
        b[i] = mkblock(400 + i, 2, 512);
        keys[i] = pf_block_key(b[i]);
        if (i != 4)
            assert_int_equal(begin(&x, b[i], disk_len(b[i]), &p[i]), 0);
        if (i != 2 && i != 4)
            assert_int_equal(ssd_index_commit(&x, &keys[i], &p[i]), 0);
    }
    assert_int_equal(ssd_index_prefix(&x, keys, 6), 2); /* stops at the WRITING one */
    assert_int_equal(ssd_index_commit(&x, &keys[2], &p[2]), 0);
    assert_int_equal(ssd_index_prefix(&x, keys, 6), 4); /* stops at the absent one */
    assert_int_equal(ssd_index_prefix(&x, keys + 5, 1), 1);
    assert_int_equal(ssd_index_prefix(&x, keys + 4, 2), 0);
    assert_int_equal(ssd_index_prefix(&x, keys, 0), 0);
    ssd_index_destroy(&x);
    for (int i = 0; i < 6; i++)
        pf_block_put(b[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_phase),
        cmocka_unit_test(test_failed_write_removed),
        cmocka_unit_test(test_fifo_invalidation),
        cmocka_unit_test(test_overtaken_writing),
        cmocka_unit_test(test_round_robin_and_oversize),
        cmocka_unit_test(test_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

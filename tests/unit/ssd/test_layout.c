/* Block serialization for the SSD (src/ssd/layout.c): disk length and O_DIRECT eligibility,
 * segment lists in slot order with adjacent segments merged, rebuild and checksum
 * verification, and a byte-exact round trip of varied geometries through a real store. */
#include "ssdtest.h"

#include "ssd/ssd_internal.h"

static void test_disk_len_and_iov(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20, NULL);
    /* contiguous: one allocation in disk order -> one segment */
    struct pf_block *a = ssdt_block(&t, 1, 3, 1000, 2, false);
    assert_int_equal(ssd_block_disk_len(a), 3 * 2 * 1024);
    struct iovec iov[6];
    assert_int_equal(ssd_block_iov(a, iov), 1);
    assert_ptr_equal(iov[0].iov_base, a->slots[0].k);
    assert_int_equal(iov[0].iov_len, 6 * 1024);
    /* scattered: one segment per K and V, in slot order K then V */
    struct pf_block *b = ssdt_block(&t, 2, 3, 512, 2, true);
    assert_int_equal(ssd_block_disk_len(b), 3 * 2 * 512);
    assert_int_equal(ssd_block_iov(b, iov), 6);
    for (int i = 0; i < 3; i++) {
        assert_ptr_equal(iov[2 * i].iov_base, b->slots[i].k);
        assert_ptr_equal(iov[2 * i + 1].iov_base, b->slots[i].v);
        assert_int_equal(iov[2 * i].iov_len, 512);
    }
    /* not eligible for O_DIRECT: a stride or an address not 512-aligned, no segments */
    struct pf_block *c = ssdt_block(&t, 3, 2, 512, 1, false);
    c->slots[1].seg_stride = 700;
    assert_int_equal(ssd_block_disk_len(c), 0);
    c->slots[1].seg_stride = 512;
    assert_int_equal(ssd_block_disk_len(c), 2 * 512);
    uint8_t *k = c->slots[1].k;
    c->slots[1].k = k + 8;
    assert_int_equal(ssd_block_disk_len(c), 0);
    c->slots[1].k = k;
    c->slots[1].nseg = 0;
    assert_int_equal(ssd_block_disk_len(c), 0);
    c->slots[1].nseg = 1;
    pf_block_put(a);
    pf_block_put(b);
    pf_block_put(c);
    ssdt_fini(&t);
}

static void test_rebuild_verify(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20, NULL);
    struct pf_block *src = ssdt_block(&t, 4, 3, 1500, 2, true);
    struct ssd_slot_meta m[3];
    for (int i = 0; i < 3; i++)
        m[i] = (struct ssd_slot_meta){src->slots[i].checksum,   src->slots[i].seg_len,
                                      src->slots[i].seg_stride, src->slots[i].numa,
                                      src->slots[i].nseg,       src->slots[i].has_checksum};
    /* stage the disk image in one allocation, as the reader does */
    uint64_t len = ssd_block_disk_len(src);
    struct pf_alloc *a;
    assert_int_equal(pf_pool_alloc(t.pool, len, -1, &a), 0);
    uint8_t *base[3];
    struct pf_alloc *allocs[3] = {a, a, a};
    for (int i = 0; i < 3; i++) {
        base[i] = (uint8_t *)a->ptr + (size_t)i * 2 * src->slots[i].seg_stride;
        memcpy(base[i], src->slots[i].k, src->slots[i].seg_stride);
        memcpy(base[i] + src->slots[i].seg_stride, src->slots[i].v, src->slots[i].seg_stride);
    }
    struct pf_block *b = ssd_block_rebuild(&src->key, m, 3, base, allocs);
    pf_alloc_put(a); /* the block holds its own references */
    assert_non_null(b);
    assert_true(ssdt_same(src, b));
    assert_int_equal(b->footprint, src->footprint);
    assert_int_equal(ssd_block_verify(b), -1);
    /* a flipped data byte is found in its slot; padding is not checksummed */
    ((uint8_t *)b->slots[2].v)[b->slots[2].seg_len - 1] ^= 1;
    assert_int_equal(ssd_block_verify(b), 2);
    ((uint8_t *)b->slots[2].v)[b->slots[2].seg_len - 1] ^= 1;
    ((uint8_t *)b->slots[1].k)[b->slots[1].seg_len] ^= 1;
    assert_int_equal(ssd_block_verify(b), -1);
    /* slots without a checksum are not verified */
    b->slots[0].has_checksum = 0;
    ((uint8_t *)b->slots[0].k)[0] ^= 1;
    assert_int_equal(ssd_block_verify(b), -1);
    pf_block_put(b);
    pf_block_put(src);
    ssdt_fini(&t);
}

static void test_roundtrip_through_store(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 32 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 16 << 20);
    ssdt_open(&t, &c);
    enum { N = 8 };
    static const struct {
        uint16_t nslots;
        uint32_t seg;
        uint8_t nseg;
        bool scatter;
    } geo[N] = {{1, 512, 1, false}, {1, 4096, 2, true},  {4, 1000, 2, false},
                {4, 1000, 2, true}, {7, 333, 1, true},   {2, 65536, 2, false},
                {3, 513, 2, true},  {16, 2048, 1, false}};
    struct pf_block *b[N];
    struct pf_block_key keys[N];
    for (uint32_t i = 0; i < N; i++) {
        b[i] = ssdt_block(&t, 100 + i, geo[i].nslots, geo[i].seg, geo[i].nseg, geo[i].scatter);
        keys[i] = b[i]->key;
    }
    ssdt_write(&t, b, N);
    assert_int_equal(ssdt_stats(&t).committed, N);
    assert_int_equal(pf_ssd_probe(t.ssd, keys, N), N);
    struct pf_block *out[N];
    assert_int_equal(pf_ssd_fetch(t.ssd, keys, N, false, out), N);
    for (int i = 0; i < N; i++) {
        assert_true(ssdt_same(b[i], out[i]));
        assert_ptr_not_equal(out[i]->slots[0].k, b[i]->slots[0].k); /* staging copy */
        pf_block_put(out[i]);
        pf_block_put(b[i]);
    }
    ssdt_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disk_len_and_iov),
        cmocka_unit_test(test_rebuild_verify),
        cmocka_unit_test(test_roundtrip_through_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

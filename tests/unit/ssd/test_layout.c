/* Block serialization for the SSD (src/ssd/layout.c): disk length and O_DIRECT eligibility,
 * segment lists in slot order with adjacent segments merged, rebuild and checksum
 * verification, and a byte-exact round trip of varied geometries through a real store. */
#include "ssdtest.h"

#include "ssd/ssd_internal.h"

/* c repacked with slot i's stride and K address changed (references taken anew). */
static struct pf_block *variant(const struct pf_block *c, uint16_t i, uint32_t stride,
                                size_t kshift, int *rc_p)
{
    struct pf_slot s[8];
    assert_true(c->nslots <= 8);
    for (uint16_t j = 0; j < c->nslots; j++) {
        pf_block_slot(c, j, &s[j]);
        pf_alloc_get(s[j].ka);
        if (s[j].nseg == 2)
            pf_alloc_get(s[j].va);
        else
            s[j].va = NULL;
    }
    s[i].seg_stride = stride;
    s[i].k = (uint8_t *)s[i].k + kshift;
    struct pf_block_key k = pf_block_key(c);
    struct pf_block *b = NULL;
    *rc_p = pf_block_pack(NULL, &k, c->nslots, s, &b);
    if (*rc_p)
        for (uint16_t j = 0; j < c->nslots; j++) {
            pf_alloc_put(s[j].ka);
            pf_alloc_put(s[j].va);
        }
    return b;
}

static void test_disk_len_and_iov(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20, NULL);
    /* contiguous: one allocation in disk order -> one segment */
    struct pf_block *a = ssdt_block(&t, 1, 3, 1000, 2, false);
    assert_int_equal(ssd_block_disk_len(a), 3 * 2 * 1024);
    struct iovec iov[6];
    assert_int_equal(ssd_block_iov(a, iov), 1);
    assert_ptr_equal(iov[0].iov_base, pf_slot_k(a, 0));
    assert_int_equal(iov[0].iov_len, 6 * 1024);
    /* scattered: one segment per K and V, in slot order K then V */
    struct pf_block *b = ssdt_block(&t, 2, 3, 512, 2, true);
    assert_int_equal(ssd_block_disk_len(b), 3 * 2 * 512);
    assert_int_equal(ssd_block_iov(b, iov), 6);
    for (int i = 0; i < 3; i++) {
        assert_ptr_equal(iov[2 * i].iov_base, pf_slot_k(b, (uint16_t)i));
        assert_ptr_equal(iov[2 * i + 1].iov_base, pf_slot_v(b, (uint16_t)i));
        assert_int_equal(iov[2 * i].iov_len, 512);
    }
    /* not eligible for O_DIRECT: a stride or an address not 512-aligned, no segments */
    struct pf_block *c = ssdt_block(&t, 3, 2, 512, 1, false);
    assert_int_equal(ssd_block_disk_len(c), 2 * 512);
    int rc;
    struct pf_block *v = variant(c, 1, 700, 0, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(ssd_block_disk_len(v), 0);
    pf_block_put(v);
    v = variant(c, 1, 512, 8, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(ssd_block_disk_len(v), 0);
    pf_block_put(v);
    /* a stride below the data length never becomes a block */
    assert_null(variant(c, 1, 100, 0, &rc));
    assert_int_equal(rc, -EINVAL);
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
    struct pf_slot ss[3];
    for (int i = 0; i < 3; i++) {
        pf_block_slot(src, (uint16_t)i, &ss[i]);
        m[i] = (struct ssd_slot_meta){ss[i].checksum, ss[i].seg_len, ss[i].seg_stride,
                                      ss[i].numa,     ss[i].nseg,    ss[i].has_checksum};
    }
    /* stage the disk image in one allocation, as the reader does */
    uint64_t len = ssd_block_disk_len(src);
    struct pf_alloc *a;
    assert_int_equal(pf_pool_alloc(t.pool, len, -1, &a), 0);
    uint8_t *base[3];
    struct pf_alloc *allocs[3] = {a, a, a};
    for (int i = 0; i < 3; i++) {
        base[i] = (uint8_t *)a->ptr + (size_t)i * 2 * ss[i].seg_stride;
        memcpy(base[i], ss[i].k, ss[i].seg_stride);
        memcpy(base[i] + ss[i].seg_stride, ss[i].v, ss[i].seg_stride);
    }
    struct pf_block_key skey = pf_block_key(src);
    struct pf_block *b = ssd_block_rebuild(&skey, m, 3, base, allocs);
    assert_non_null(b);
    assert_true(ssdt_same(src, b));
    assert_int_equal(pf_block_footprint(b), pf_block_footprint(src));
    assert_int_equal(ssd_block_verify(b), -1);
    /* a flipped data byte is found in its slot; padding is not checksummed */
    struct pf_slot s1, s2;
    pf_block_slot(b, 1, &s1);
    pf_block_slot(b, 2, &s2);
    ((uint8_t *)s2.v)[s2.seg_len - 1] ^= 1;
    assert_int_equal(ssd_block_verify(b), 2);
    ((uint8_t *)s2.v)[s2.seg_len - 1] ^= 1;
    ((uint8_t *)s1.k)[s1.seg_len] ^= 1;
    assert_int_equal(ssd_block_verify(b), -1);
    /* slots without a checksum are not verified */
    m[0].has_checksum = 0;
    struct pf_block *nc = ssd_block_rebuild(&skey, m, 3, base, allocs);
    pf_alloc_put(a); /* the blocks hold their own references */
    assert_non_null(nc);
    base[0][0] ^= 1;
    assert_int_equal(ssd_block_verify(nc), -1);
    assert_int_equal(ssd_block_verify(b), 0);
    pf_block_put(nc);
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
        keys[i] = pf_block_key(b[i]);
    }
    ssdt_write(&t, b, N);
    assert_int_equal(ssdt_stats(&t).committed, N);
    assert_int_equal(pf_ssd_probe(t.ssd, keys, N), N);
    struct pf_block *out[N];
    assert_int_equal(pf_ssd_fetch(t.ssd, keys, N, false, out), N);
    for (int i = 0; i < N; i++) {
        assert_true(ssdt_same(b[i], out[i]));
        assert_ptr_not_equal(pf_slot_k(out[i], 0), pf_slot_k(b[i], 0)); /* staging copy */
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

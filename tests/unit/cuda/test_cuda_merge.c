/* Range merging and kernel descriptor building of the CUDA backend (hw/cuda/cuda_merge.c).
 * Pure functions: no GPU needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifdef PF_TEST_HAVE_CUDA
#include "cuda_internal.h"

#define DEV  0x7f0000000000ull
#define HOST 0x100000000ull

static struct pf_cuda_span sp(uint64_t dev, uint64_t host, uint64_t len)
{
    return (struct pf_cuda_span){
        .dev = dev, .host = host, .len = len, .dev_alloc = 1, .host_alloc = 1};
}

static void assert_span(const struct pf_cuda_span *s, uint64_t dev, uint64_t host, uint64_t len)
{
    assert_int_equal(s->dev, dev);
    assert_int_equal(s->host, host);
    assert_int_equal(s->len, len);
}

static void test_adjacent_both_sides_merge(void **st)
{
    struct pf_cuda_span s[4];
    for (int i = 0; i < 4; i++)
        s[i] = sp(DEV + 4096u * i, HOST + 4096u * i, 4096);
    assert_int_equal(pf_cuda_spans_merge(s, 4, UINT64_MAX), 1);
    assert_span(&s[0], DEV, HOST, 4 * 4096);
}

static void test_adjacent_one_side_only(void **st)
{
    struct pf_cuda_span s[] = {
        sp(DEV, HOST, 100), sp(DEV + 100, HOST + 200, 100), /* device adjacent, host not */
        sp(DEV + 300, HOST + 300, 100),                     /* host adjacent, device not */
        sp(DEV + 200, HOST + 100, 100),                     /* neither (backwards) */
    };
    assert_int_equal(pf_cuda_spans_merge(s, 4, UINT64_MAX), 4);
    assert_span(&s[0], DEV, HOST, 100);
    assert_span(&s[1], DEV + 100, HOST + 200, 100);
    assert_span(&s[2], DEV + 300, HOST + 300, 100);
    assert_span(&s[3], DEV + 200, HOST + 100, 100);
}

static void test_split_kv_pairs(void **st)
{
    /* split layout: K of blocks 0,1,2 then V of blocks 0,1,2; host K and V regions of one
     * save are contiguous -> two runs */
    const uint64_t seg = 8192, kv = 1 << 20, hv = 3 * seg;
    struct pf_cuda_span s[6];
    for (int i = 0; i < 3; i++) {
        s[i] = sp(DEV + seg * i, HOST + seg * i, seg);
        s[3 + i] = sp(DEV + kv + seg * i, HOST + hv + seg * i, seg);
    }
    /* K2 ends at HOST+3*seg where V0 starts on the host, but not on the device */
    assert_int_equal(pf_cuda_spans_merge(s, 6, UINT64_MAX), 2);
    assert_span(&s[0], DEV, HOST, 3 * seg);
    assert_span(&s[1], DEV + kv, HOST + hv, 3 * seg);
}

static void test_zero_length_dropped(void **st)
{
    struct pf_cuda_span s[] = {
        sp(DEV, HOST, 0),
        sp(DEV, HOST, 64),
        sp(DEV + 64, HOST + 64, 0), /* empty between two adjacent spans */
        sp(DEV + 64, HOST + 64, 64),
        sp(DEV + 999, HOST + 999, 0),
    };
    assert_int_equal(pf_cuda_spans_merge(s, 5, UINT64_MAX), 1);
    assert_span(&s[0], DEV, HOST, 128);
    struct pf_cuda_span z[] = {sp(DEV, HOST, 0), sp(DEV, HOST, 0)};
    assert_int_equal(pf_cuda_spans_merge(z, 2, UINT64_MAX), 0);
    assert_int_equal(pf_cuda_spans_merge(NULL, 0, UINT64_MAX), 0);
}

static void test_max_len_cap(void **st)
{
    struct pf_cuda_span s[6];
    for (int i = 0; i < 6; i++)
        s[i] = sp(DEV + 1000u * i, HOST + 1000u * i, 1000);
    /* cap 2500: runs of at most two spans */
    assert_int_equal(pf_cuda_spans_merge(s, 6, 2500), 3);
    for (int i = 0; i < 3; i++)
        assert_span(&s[i], DEV + 2000u * i, HOST + 2000u * i, 2000);
    /* exactly at the cap still merges */
    for (int i = 0; i < 6; i++)
        s[i] = sp(DEV + 1000u * i, HOST + 1000u * i, 1000);
    assert_int_equal(pf_cuda_spans_merge(s, 6, 3000), 2);
    assert_span(&s[0], DEV, HOST, 3000);
    assert_span(&s[1], DEV + 3000, HOST + 3000, 3000);
    /* a single span over the cap is kept whole, and nothing joins it */
    struct pf_cuda_span b[] = {sp(DEV, HOST, 5000), sp(DEV + 5000, HOST + 5000, 10)};
    assert_int_equal(pf_cuda_spans_merge(b, 2, 4096), 2);
    assert_span(&b[0], DEV, HOST, 5000);
    assert_span(&b[1], DEV + 5000, HOST + 5000, 10);
}

static void test_no_overflow_at_cap(void **st)
{
    struct pf_cuda_span s[] = {sp(0, 0, UINT64_MAX - 10), sp(UINT64_MAX - 10, UINT64_MAX - 10, 5),
                               sp(UINT64_MAX - 5, UINT64_MAX - 5, 5)};
    assert_int_equal(pf_cuda_spans_merge(s, 3, UINT64_MAX), 1);
    assert_int_equal(s[0].len, UINT64_MAX);
}

static void test_allocation_boundaries(void **st)
{
    struct pf_cuda_span s[] = {
        sp(DEV, HOST, 64),
        sp(DEV + 64, HOST + 64, 64),
        sp(DEV + 128, HOST + 128, 64),
        sp(DEV + 192, HOST + 192, 64),
    };
    s[1].dev_alloc = 2; /* another device allocation that happens to be adjacent */
    s[2].dev_alloc = 2;
    s[3].host_alloc = 7; /* another host registration */
    assert_int_equal(pf_cuda_spans_merge(s, 4, UINT64_MAX), 3);
    assert_span(&s[0], DEV, HOST, 64);
    assert_span(&s[1], DEV + 64, HOST + 64, 128);
    assert_int_equal(s[1].dev_alloc, 2);
    assert_span(&s[2], DEV + 192, HOST + 192, 64);
    assert_int_equal(s[2].host_alloc, 7);
}

static void test_order_preserved(void **st)
{
    /* a shuffled list with some adjacent pairs: output keeps input order, only
     * neighbours in the list merge */
    struct pf_cuda_span s[] = {
        sp(DEV + 5 * 64, HOST + 5 * 64, 64), sp(DEV + 6 * 64, HOST + 6 * 64, 64),
        sp(DEV + 0 * 64, HOST + 0 * 64, 64), sp(DEV + 9 * 64, HOST + 9 * 64, 64),
        sp(DEV + 1 * 64, HOST + 1 * 64, 64), sp(DEV + 2 * 64, HOST + 2 * 64, 64),
    };
    assert_int_equal(pf_cuda_spans_merge(s, 6, UINT64_MAX), 4);
    assert_span(&s[0], DEV + 5 * 64, HOST + 5 * 64, 128);
    assert_span(&s[1], DEV + 0 * 64, HOST + 0 * 64, 64);
    assert_span(&s[2], DEV + 9 * 64, HOST + 9 * 64, 64);
    assert_span(&s[3], DEV + 1 * 64, HOST + 1 * 64, 128);
}

static void test_random_merge_preserves_bytes(void **st)
{
    /* seeded random descriptor lists: the merged list covers exactly the same
     * (dev, host) byte pairs in the same order */
    unsigned seed = 20261129;
    printf("seed %u\n", seed);
    srand(seed);
    enum { N = 2000 };
    static struct pf_cuda_span in[N], out[N];
    for (int round = 0; round < 50; round++) {
        uint64_t d = DEV, h = HOST;
        for (int i = 0; i < N; i++) {
            uint64_t len = (uint64_t)(rand() % 4) * 512; /* zero lengths too */
            if (rand() % 3 == 0)
                d += 4096; /* gap on the device side */
            if (rand() % 3 == 0)
                h += 4096; /* gap on the host side */
            in[i] = sp(d, h, len);
            d += len;
            h += len;
        }
        memcpy(out, in, sizeof(in));
        size_t n = pf_cuda_spans_merge(out, N, 1 << 14);
        size_t j = 0;
        uint64_t off = 0;
        for (int i = 0; i < N; i++) {
            if (in[i].len == 0)
                continue;
            assert_true(j < n);
            assert_int_equal(in[i].dev, out[j].dev + off);
            assert_int_equal(in[i].host, out[j].host + off);
            assert_true(out[j].len <= (1 << 14));
            off += in[i].len;
            if (off == out[j].len) {
                j++;
                off = 0;
            }
        }
        assert_int_equal(j, n);
        assert_int_equal(off, 0);
        for (size_t k = 1; k < n; k++) /* maximal: no two neighbours could still merge */
            assert_false(out[k - 1].dev + out[k - 1].len == out[k].dev &&
                         out[k - 1].host + out[k - 1].len == out[k].host &&
                         out[k - 1].len + out[k].len <= (1 << 14));
    }
}

static void test_kdesc_chunks(void **st)
{
    const uint64_t C = 4096;
    struct pf_cuda_span s[] = {sp(DEV, HOST, 3 * C), sp(DEV + 100000, HOST + 50000, C + 17),
                               sp(DEV + 200000, HOST + 90000, 5)};
    assert_int_equal(pf_cuda_kdesc_count(s, 3, C), 3 + 2 + 1);
    struct pf_cuda_kdesc k[6];
    assert_int_equal(pf_cuda_kdesc_build(s, 3, C, 1, k), 6);
    for (int i = 0; i < 3; i++) { /* D2H: dst is host */
        assert_int_equal(k[i].dst, HOST + C * i);
        assert_int_equal(k[i].src, DEV + C * i);
        assert_int_equal(k[i].len, C);
    }
    assert_int_equal(k[3].dst, HOST + 50000);
    assert_int_equal(k[3].len, C);
    assert_int_equal(k[4].dst, HOST + 50000 + C);
    assert_int_equal(k[4].src, DEV + 100000 + C);
    assert_int_equal(k[4].len, 17);
    assert_int_equal(k[5].len, 5);
    /* H2D swaps the sides */
    assert_int_equal(pf_cuda_kdesc_build(s, 1, C, 0, k), 3);
    assert_int_equal(k[2].dst, DEV + 2 * C);
    assert_int_equal(k[2].src, HOST + 2 * C);
    /* zero spans, zero descriptors */
    assert_int_equal(pf_cuda_kdesc_count(s, 0, C), 0);
    /* pieces of an aligned span keep 16-byte alignment */
    struct pf_cuda_span a = sp(DEV + 256, HOST + 512, 10 * PF_CUDA_KERNEL_CHUNK + 48);
    size_t n = pf_cuda_kdesc_count(&a, 1, PF_CUDA_KERNEL_CHUNK);
    assert_int_equal(n, 11);
    struct pf_cuda_kdesc *kk = calloc(n, sizeof(*kk));
    assert_non_null(kk);
    assert_int_equal(pf_cuda_kdesc_build(&a, 1, PF_CUDA_KERNEL_CHUNK, 0, kk), n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal((kk[i].dst | kk[i].src) & 15, 0);
        total += kk[i].len;
    }
    assert_int_equal(total, a.len);
    free(kk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adjacent_both_sides_merge),
        cmocka_unit_test(test_adjacent_one_side_only),
        cmocka_unit_test(test_split_kv_pairs),
        cmocka_unit_test(test_zero_length_dropped),
        cmocka_unit_test(test_max_len_cap),
        cmocka_unit_test(test_no_overflow_at_cap),
        cmocka_unit_test(test_allocation_boundaries),
        cmocka_unit_test(test_order_preserved),
        cmocka_unit_test(test_random_merge_preserves_bytes),
        cmocka_unit_test(test_kdesc_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit (HAVE_CUDA=0), hw/cuda is not compiled\n");
    return 77;
}
#endif

/* Layout validation and addressing (reference §3.1): every accepted shape and every
 * rejection. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine_internal.h"

#define BASE 0x8000010000000000ull

static void expect_err(uint64_t size, uint64_t nb, uint64_t seg, uint64_t kvs, uint32_t segs,
                       const char *want)
{
    struct pf_layout l;
    char err[256] = "";
    assert_int_equal(pf_layout_init(&l, BASE, size, nb, seg, kvs, segs, false, err, sizeof(err)),
                     -EINVAL);
    if (!strstr(err, want))
        fail_msg("error '%s' does not contain '%s'", err, want);
}

static void test_contiguous(void **st)
{
    struct pf_layout l;
    char err[200];
    assert_int_equal(pf_layout_init(&l, BASE, 64 * 1000, 64, 1000, 0, 1, false, err, sizeof(err)),
                     0);
    assert_int_equal(l.nseg, 1);
    assert_int_equal(l.copy_len, 1000);
    assert_int_equal(l.host_stride, 1000);
    assert_int_equal(pf_layout_addr(&l, 5, 0), BASE + 5000);
    /* 512 padding with SSD */
    assert_int_equal(pf_layout_init(&l, BASE, 64 * 1000, 64, 1000, 0, 1, true, err, sizeof(err)),
                     0);
    assert_int_equal(l.host_stride, 1024);
    assert_int_equal(l.copy_len, 1000);
    /* K and V adjacent: one copy of both */
    assert_int_equal(
        pf_layout_init(&l, BASE, 2 * 64 * 1000, 64, 1000, 1000, 2, false, err, sizeof(err)), 0);
    assert_int_equal(l.nseg, 1);
    assert_int_equal(l.copy_len, 2000);
    assert_int_equal(pf_layout_addr(&l, 3, 0), BASE + 6000);
}

static void test_split(void **st)
{
    struct pf_layout l;
    char err[200];
    /* KV-first: all K blocks, then all V blocks */
    assert_int_equal(
        pf_layout_init(&l, BASE, 2 * 64 * 1000, 64, 1000, 64 * 1000, 2, false, err, sizeof(err)),
        0);
    assert_int_equal(l.nseg, 2);
    assert_int_equal(l.copy_len, 1000);
    assert_int_equal(pf_layout_addr(&l, 7, 0), BASE + 7000);
    assert_int_equal(pf_layout_addr(&l, 7, 1), BASE + 64000 + 7000);
    /* a larger storage than needed is fine */
    assert_int_equal(
        pf_layout_init(&l, BASE, 1 << 20, 64, 1000, 64 * 1000, 2, false, err, sizeof(err)), 0);
}

static void test_rejections(void **st)
{
    expect_err(0, 1, 1, 0, 1, "empty");
    expect_err(100, 0, 1, 0, 1, "must be > 0");
    expect_err(100, 1, 0, 0, 1, "must be > 0");
    expect_err(100, 1, 1, 0, 0, "must be > 0");
    expect_err(64 * 1000 - 1, 64, 1000, 0, 1, "layout needs 64000 bytes");
    expect_err(1 << 20, 4, 1000, 0, 2, "need kv_stride_bytes > 0");
    expect_err(1 << 20, 4, 1000, 999, 2, "would overlap");
    expect_err(1 << 20, 4, 1000, 4000, 3, "exactly 2 segments");
    /* split whose V region starts inside the K region */
    expect_err(1 << 20, 64, 1000, 32 * 1000, 2, "overlaps K of block 32");
    expect_err(1 << 20, 64, 1000, 32 * 1000 + 500, 2, "overlaps K of block 32");
    /* V of the last block beyond the storage */
    expect_err(2 * 64 * 1000 - 1, 64, 1000, 64 * 1000, 2, "layout needs");
    expect_err(UINT64_MAX, UINT64_MAX / 2, 1000, 0, 1, "overflows");
    expect_err(1ull << 40, 1, 5ull << 30, 0, 1, "exceeds 4 GiB");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_rejections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

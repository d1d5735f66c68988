/* SSD ring arithmetic (src/ssd/ring.c): placement, wrap skip, tail and validity,
 * oversize and empty allocations. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "ssd/ssd_internal.h"

static void test_sequential(void **st)
{
    struct ssd_ring r;
    ssd_ring_init(&r, 4096);
    uint64_t start, off;
    assert_int_equal(ssd_ring_alloc(&r, 1024, &start, &off), 0);
    assert_int_equal(start, 0);
    assert_int_equal(off, 0);
    assert_int_equal(ssd_ring_alloc(&r, 2048, &start, &off), 0);
    assert_int_equal(start, 1024);
    assert_int_equal(off, 1024);
    assert_int_equal(ssd_ring_tail(&r), 0);
    assert_true(ssd_ring_valid(&r, 0));
    /* exactly fills the ring: still the first lap */
    assert_int_equal(ssd_ring_alloc(&r, 1024, &start, &off), 0);
    assert_int_equal(start, 3072);
    assert_int_equal(off, 3072);
    assert_int_equal(r.head, 4096);
    assert_int_equal(ssd_ring_tail(&r), 0);
    assert_true(ssd_ring_valid(&r, 0));
}

static void test_wrap_skip(void **st)
{
    struct ssd_ring r;
    ssd_ring_init(&r, 4096);
    uint64_t start, off, tail;
    assert_int_equal(ssd_ring_alloc(&r, 3072, &start, &off), 0);
    /* 2048 does not fit in the last 1024: skip them, start at the wrap point */
    assert_int_equal(ssd_ring_plan(&r, 2048, &start, &tail), 0);
    assert_int_equal(start, 4096);
    assert_int_equal(tail, 2048);
    assert_int_equal(r.head, 3072); /* plan does not allocate */
    assert_int_equal(ssd_ring_alloc(&r, 2048, &start, &off), 0);
    assert_int_equal(start, 4096);
    assert_int_equal(off, 0);
    assert_int_equal(r.head, 6144);
    assert_int_equal(ssd_ring_tail(&r), 2048);
    /* the first block [0, 3072) overlaps the new one physically: invalid */
    assert_false(ssd_ring_valid(&r, 0));
    assert_true(ssd_ring_valid(&r, 4096));
    /* a block that fits exactly at the end does not skip */
    assert_int_equal(ssd_ring_alloc(&r, 2048, &start, &off), 0);
    assert_int_equal(start, 6144);
    assert_int_equal(off, 2048);
    assert_int_equal(ssd_ring_tail(&r), 4096);
    assert_true(ssd_ring_valid(&r, 4096));
}

static void test_overwrite_invalidation(void **st)
{
    /* 8 blocks of 512 per lap; after 1.5 laps the first half of lap 1 is gone */
    struct ssd_ring r;
    ssd_ring_init(&r, 4096);
    uint64_t starts[12], off;
    for (int i = 0; i < 12; i++) {
        assert_int_equal(ssd_ring_alloc(&r, 512, &starts[i], &off), 0);
        assert_int_equal(off, (uint64_t)(i % 8) * 512);
    }
    for (int i = 0; i < 12; i++)
        assert_int_equal(ssd_ring_valid(&r, starts[i]), i >= 4);
}

static void test_many_laps(void **st)
{
    struct ssd_ring r;
    ssd_ring_init(&r, 10 * 512);
    uint64_t start, off, prev_end = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t len = (uint64_t)(1 + i % 4) * 512;
        assert_int_equal(ssd_ring_alloc(&r, len, &start, &off), 0);
        assert_true(start >= prev_end);         /* logical positions never repeat */
        assert_true(off + len <= r.cap);        /* never crosses the physical end */
        assert_int_equal(off, start % r.cap);   /* physical = logical mod cap */
        assert_true(ssd_ring_valid(&r, start)); /* the newest block is always valid */
        assert_int_equal(r.head, start + len);
        prev_end = start + len;
    }
}

static void test_oversize_and_empty(void **st)
{
    struct ssd_ring r;
    ssd_ring_init(&r, 4096);
    uint64_t start = 77, off = 77, tail = 77;
    assert_int_equal(ssd_ring_alloc(&r, 4608, &start, &off), -E2BIG);
    assert_int_equal(ssd_ring_plan(&r, 4608, &start, &tail), -E2BIG);
    assert_int_equal(ssd_ring_alloc(&r, 0, &start, &off), -EINVAL);
    assert_int_equal(start, 77);
    assert_int_equal(off, 77);
    assert_int_equal(r.head, 0);
    /* a block the size of the ring is fine, and invalidates everything before it */
    assert_int_equal(ssd_ring_alloc(&r, 512, &start, &off), 0);
    assert_int_equal(ssd_ring_alloc(&r, 4096, &start, &off), 0);
    assert_int_equal(start, 4096);
    assert_int_equal(off, 0);
    assert_false(ssd_ring_valid(&r, 0));
    assert_true(ssd_ring_valid(&r, 4096));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential),
        cmocka_unit_test(test_wrap_skip),
        cmocka_unit_test(test_overwrite_invalidation),
        cmocka_unit_test(test_many_laps),
        cmocka_unit_test(test_oversize_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

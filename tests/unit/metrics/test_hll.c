/* HyperLogLog accuracy, identity stability and sliding windows under a fake clock. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "pf/hll.h"

static void test_accuracy(void **st)
{
    struct pf_hll *h = pf_hll_new(16);
    assert_true(pf_hll_estimate(h) < 0.5);
    for (uint64_t i = 0; i < 100000; i++) {
        uint8_t b[8];
        memcpy(b, &i, 8);
        pf_hll_add(h, pf_hll_identity("ns", b, 8));
        pf_hll_add(h, pf_hll_identity("ns", b, 8)); /* duplicates do not count */
    }
    double e = pf_hll_estimate(h);
    assert_true(fabs(e - 100000) / 100000 < 0.02);
    pf_hll_free(h);
    h = pf_hll_new(16);
    for (uint64_t i = 0; i < 100; i++)
        pf_hll_add(h, pf_hll_identity("ns", (uint8_t *)&i, 8));
    assert_true(fabs(pf_hll_estimate(h) - 100) < 2); /* linear counting range */
    pf_hll_free(h);
    /* identity depends on the namespace and the hash */
    uint8_t x[4] = {1, 2, 3, 4};
    assert_int_equal(pf_hll_identity("a", x, 4), pf_hll_identity("a", x, 4));
    assert_int_not_equal(pf_hll_identity("a", x, 4), pf_hll_identity("b", x, 4));
    assert_int_not_equal(pf_hll_identity("ab", x, 3), pf_hll_identity("a", x, 4));
}

static void test_windows(void **st)
{
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 1000 * PF_NS_PER_SEC);
    struct pf_hll_set *s;
    assert_int_equal(pf_hll_set_create("2m,1h", 14, &clk.base, &s), 0);
    uint8_t hs[50][8];
    const uint8_t *hp[50];
    size_t lens[50];
    for (int i = 0; i < 50; i++) {
        memset(hs[i], i, 8);
        hp[i] = hs[i];
        lens[i] = 8;
    }
    pf_hll_record(s, "ns", hp, lens, 50, 200);
    assert_true(fabs(pf_hll_cardinality(s, 0) - 50) < 2);
    assert_int_equal(pf_hll_total(s, 0), 200);
    pf_fake_clock_advance(&clk, 61 * PF_NS_PER_SEC);
    pf_hll_record(s, "ns", hp, lens, 10, 40); /* the same 10 again: still 50 distinct */
    assert_true(fabs(pf_hll_cardinality(s, 0) - 50) < 2);
    assert_int_equal(pf_hll_total(s, 0), 240);
    /* after the 2-minute window passed only the second slot's data is left */
    pf_fake_clock_advance(&clk, 61 * PF_NS_PER_SEC);
    assert_true(fabs(pf_hll_cardinality(s, 0) - 10) < 1.5);
    assert_int_equal(pf_hll_total(s, 0), 40);
    pf_fake_clock_advance(&clk, 120 * PF_NS_PER_SEC);
    assert_int_equal(pf_hll_total(s, 0), 0);
    assert_true(pf_hll_cardinality(s, 0) < 0.5);
    /* the hour window still remembers everything */
    assert_int_equal(pf_hll_total(s, 1), 240);
    assert_true(fabs(pf_hll_cardinality(s, 1) - 50) < 2);
    pf_hll_set_destroy(s);
    assert_int_not_equal(pf_hll_set_create("2m", 3, &clk.base, &s), 0);
    assert_int_not_equal(pf_hll_set_create("30s", 10, &clk.base, &s), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accuracy),
        cmocka_unit_test(test_windows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

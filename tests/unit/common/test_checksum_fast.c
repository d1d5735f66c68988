/* pf_checksum2 (libxxhash's run-time dispatched xxh3) gives the same values as the inlined
 * xxh3 of the streaming checksum API (pf_checksum_*) for one and two segments of every size
 * class (empty, short, the 240-byte and stripe boundaries, blocks), and as a slot checksum
 * over K then V. Seeded random bytes (PF_TEST_SEED replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "pf/block.h"
#include "pf/util.h"

static uint64_t seed;

static void fill(uint8_t *p, size_t n, uint64_t s)
{
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (uint8_t)s;
    }
}

static uint64_t streaming(const void *a, size_t la, const void *b, size_t lb)
{
    struct pf_checksum c;
    assert_int_equal(pf_checksum_init(&c), 0);
    pf_checksum_update(&c, a, la);
    if (b)
        pf_checksum_update(&c, b, lb);
    uint64_t v = pf_checksum_final(&c);
    pf_checksum_destroy(&c);
    return v;
}

static void test_same_values(void **st)
{
    static const size_t sizes[] = {0,   1,   16,   17,   128,       129,
                                   240, 241, 1024, 1025, 65536 + 3, 1 << 20};
    uint8_t *a = malloc(1 << 20), *b = malloc(1 << 20);
    assert_non_null(a);
    assert_non_null(b);
    fill(a, 1 << 20, seed | 1);
    fill(b, 1 << 20, (seed << 1) | 1);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        assert_true(pf_checksum2(a, n, NULL, 0) == streaming(a, n, NULL, 0));
        for (size_t j = 0; j < sizeof(sizes) / sizeof(sizes[0]); j++) {
            size_t m = sizes[j];
            assert_true(pf_checksum2(a + 1, n ? n - 1 : 0, b, m) ==
                        streaming(a + 1, n ? n - 1 : 0, b, m));
        }
    }
    /* a changed byte changes the value */
    uint64_t v = pf_checksum2(a, 4096, b, 4096);
    b[4095] ^= 1;
    assert_true(pf_checksum2(a, 4096, b, 4096) != v);
    /* slots: K then V; one segment ignores V */
    struct pf_slot s = {.k = a, .v = b, .seg_len = 65536, .nseg = 2};
    assert_true(pf_slot_compute_checksum(&s) == streaming(a, 65536, b, 65536));
    s.nseg = 1;
    assert_true(pf_slot_compute_checksum(&s) == streaming(a, 65536, NULL, 0));
    free(a);
    free(b);
}

int main(void)
{
    const char *e = getenv("PF_TEST_SEED");
    seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
    printf("test seed: %llu (replay with PF_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

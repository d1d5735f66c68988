/* Offset allocator: exact fits, splitting and coalescing, fragmentation, exhaustion, node
 * limits, and a randomized model check against a bitmap of used units. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/pool.h"

static void test_basic(void **st)
{
    struct pf_offalloc *a;
    assert_int_equal(pf_offalloc_create(0, 0, &a), -EINVAL);
    assert_int_equal(pf_offalloc_create(1000, 16, &a), 0);
    assert_int_equal(pf_offalloc_free_units(a), 1000);
    assert_int_equal(pf_offalloc_largest_free(a), 1000);
    uint32_t n1, o1, n2, o2, n3, o3;
    assert_int_equal(pf_offalloc_alloc(a, 100, &n1, &o1), 0);
    assert_int_equal(pf_offalloc_alloc(a, 200, &n2, &o2), 0);
    assert_int_equal(pf_offalloc_alloc(a, 700, &n3, &o3), 0);
    assert_int_equal(pf_offalloc_free_units(a), 0);
    uint32_t nx, ox;
    assert_int_equal(pf_offalloc_alloc(a, 1, &nx, &ox), -ENOMEM);
    assert_true(o1 + 100 <= o2 || o2 + 200 <= o1);
    /* free the middle: a hole of 200 that a 201 request cannot use */
    pf_offalloc_free(a, n2);
    assert_int_equal(pf_offalloc_largest_free(a), 200);
    assert_int_equal(pf_offalloc_alloc(a, 201, &nx, &ox), -ENOMEM);
    assert_int_equal(pf_offalloc_alloc(a, 200, &nx, &ox), 0);
    assert_int_equal(ox, o2);
    pf_offalloc_free(a, nx);
    /* freeing the neighbours coalesces everything back */
    pf_offalloc_free(a, n1);
    pf_offalloc_free(a, n3);
    assert_int_equal(pf_offalloc_free_units(a), 1000);
    assert_int_equal(pf_offalloc_largest_free(a), 1000);
    assert_int_equal(pf_offalloc_live(a), 0);
    assert_int_equal(pf_offalloc_alloc(a, 1000, &nx, &ox), 0);
    assert_int_equal(ox, 0);
    pf_offalloc_free(a, nx);
    assert_int_equal(pf_offalloc_alloc(a, 0, &nx, &ox), -ENOMEM);
    assert_int_equal(pf_offalloc_alloc(a, 1001, &nx, &ox), -ENOMEM);
    pf_offalloc_destroy(a);
}

static void test_fragmentation(void **st)
{
    struct pf_offalloc *a;
    assert_int_equal(pf_offalloc_create(64, 0, &a), 0);
    uint32_t node[64], off[64];
    for (int i = 0; i < 64; i++)
        assert_int_equal(pf_offalloc_alloc(a, 1, &node[i], &off[i]), 0);
    for (int i = 0; i < 64; i += 2)
        pf_offalloc_free(a, node[i]);
    assert_int_equal(pf_offalloc_free_units(a), 32);
    assert_int_equal(pf_offalloc_largest_free(a), 1);
    uint32_t nx, ox;
    assert_int_equal(pf_offalloc_alloc(a, 2, &nx, &ox), -ENOMEM);
    pf_offalloc_free(a, node[1]);
    assert_int_equal(pf_offalloc_largest_free(a), 3);
    assert_int_equal(pf_offalloc_alloc(a, 3, &nx, &ox), 0);
    assert_int_equal(ox, 0);
    pf_offalloc_destroy(a);
}

static void test_node_limit(void **st)
{
    struct pf_offalloc *a;
    assert_int_equal(pf_offalloc_create(1000, 4, &a), 0);
    uint32_t n, o;
    int ok = 0;
    while (pf_offalloc_alloc(a, 1, &n, &o) == 0)
        ok++;
    assert_true(ok >= 4 && ok < 1000); /* bounded by the node table, not the capacity */
    pf_offalloc_destroy(a);
}

static void test_model(void **st)
{
    const uint32_t cap = 4096;
    struct pf_offalloc *a;
    assert_int_equal(pf_offalloc_create(cap, 0, &a), 0);
    uint8_t used[4096] = {0};
    struct {
        uint32_t node, off, len;
    } live[512];
    size_t nlive = 0;
    srand(12345);
    for (int step = 0; step < 200000; step++) {
        if (nlive < 512 && (rand() % 3 != 0 || nlive == 0)) {
            uint32_t len = 1 + (uint32_t)(rand() % 64);
            uint32_t n, o;
            uint32_t largest = pf_offalloc_largest_free(a);
            int rc = pf_offalloc_alloc(a, len, &n, &o);
            if (rc == 0) {
                assert_true(o + len <= cap);
                for (uint32_t i = 0; i < len; i++) {
                    assert_int_equal(used[o + i], 0); /* never double-allocated */
                    used[o + i] = 1;
                }
                live[nlive].node = n;
                live[nlive].off = o;
                live[nlive++].len = len;
            } else {
                assert_true(len > largest); /* refused only when no hole is large enough */
            }
        } else {
            size_t k = (size_t)rand() % nlive;
            for (uint32_t i = 0; i < live[k].len; i++)
                used[live[k].off + i] = 0;
            pf_offalloc_free(a, live[k].node);
            live[k] = live[--nlive];
        }
        uint32_t free_units = 0;
        if (step % 1000 == 0) {
            for (uint32_t i = 0; i < cap; i++)
                free_units += !used[i];
            assert_int_equal(pf_offalloc_free_units(a), free_units);
        }
    }
    while (nlive)
        pf_offalloc_free(a, live[--nlive].node);
    assert_int_equal(pf_offalloc_largest_free(a), cap);
    pf_offalloc_destroy(a);
}

static void test_pool(void **st)
{
    struct pf_pool *p;
    char err[256];
    struct pf_pool_config c = {.size = 1 << 20, .hint = 1000, .shards = 2};
    assert_int_equal(pf_pool_create(&c, &p, err, sizeof(err)), 0);
    assert_int_equal(pf_pool_unit(p), 1024); /* hint rounded up to 512 */
    assert_true(pf_pool_capacity(p) <= (1u << 20) && pf_pool_capacity(p) > (1u << 20) - 4096);
    struct pf_alloc *a, *b;
    assert_int_equal(pf_pool_alloc(p, 1, -1, &a), 0);
    assert_int_equal(a->size, 1024);
    assert_int_equal(pf_pool_used(p), 1024);
    memset(a->ptr, 0xab, a->size); /* real memory */
    pf_alloc_get(a);
    pf_alloc_put(a);
    assert_int_equal(pf_pool_used(p), 1024);
    pf_alloc_put(a);
    assert_int_equal(pf_pool_used(p), 0);
    /* shards: a request larger than one shard fails even when the total is free */
    assert_int_equal(pf_pool_alloc(p, 600 * 1024, -1, &b), -ENOMEM);
    assert_int_equal(pf_pool_alloc(p, 500 * 1024, -1, &b), 0);
    pf_alloc_put(b);
    pf_pool_destroy(p);
    /* a pool the machine cannot hold is refused with the flag named */
    c = (struct pf_pool_config){.size = 1ull << 50};
    assert_int_equal(pf_pool_create(&c, &p, err, sizeof(err)), -ENOMEM);
    assert_non_null(strstr(err, "--pool-size"));
    assert_non_null(strstr(err, "MemAvailable"));
    c = (struct pf_pool_config){.size = 1 << 20, .hugepages = true};
    int rc = pf_pool_create(&c, &p, err, sizeof(err));
    if (rc == 0) {
        pf_pool_destroy(p); /* this machine has hugepages reserved */
    } else {
        assert_int_equal(rc, -ENOMEM);
        assert_non_null(strstr(err, "/proc/sys/vm/nr_hugepages"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),      cmocka_unit_test(test_fragmentation),
        cmocka_unit_test(test_node_limit), cmocka_unit_test(test_model),
        cmocka_unit_test(test_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Client command coalescing: last write wins per (namespace, hash), duplicates collapse,
 * inserts before removes, grouping per namespace, chunks of at most max_chunk. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/meta_client.h"

#define H(s) ((struct pf_meta_hash){sizeof(s) - 1, (const uint8_t *)(s)})

static bool has(const struct pf_meta_batch *b, const char *key)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->hashes[i].len == strlen(key) &&
            memcmp(b->hashes[i].data, key, b->hashes[i].len) == 0)
            return true;
    return false;
}

static void test_last_write_wins(void **st)
{
    struct pf_meta_hash a[] = {H("a"), H("b"), H("c")};
    struct pf_meta_hash r[] = {H("a"), H("b")};
    struct pf_meta_hash a2[] = {H("b"), H("d")};
    struct pf_meta_cmd cmds[] = {
        {PF_META_OP_INSERT, "ns", a, 3},
        {PF_META_OP_REMOVE, "ns", r, 2},
        {PF_META_OP_INSERT, "ns", a2, 2},
    };
    struct pf_meta_plan p;
    assert_int_equal(pf_meta_coalesce(cmds, 3, 16384, &p), 0);
    assert_int_equal(p.nbatches, 2);
    /* inserts first: b (re-inserted), c, d in order of first appearance */
    assert_int_equal(p.batches[0].op, PF_META_OP_INSERT);
    assert_string_equal(p.batches[0].ns, "ns");
    assert_int_equal(p.batches[0].n, 3);
    assert_memory_equal(p.batches[0].hashes[0].data, "b", 1);
    assert_memory_equal(p.batches[0].hashes[1].data, "c", 1);
    assert_memory_equal(p.batches[0].hashes[2].data, "d", 1);
    assert_int_equal(p.batches[1].op, PF_META_OP_REMOVE);
    assert_int_equal(p.batches[1].n, 1);
    assert_true(has(&p.batches[1], "a"));
    pf_meta_plan_free(&p);
}

static void test_remove_then_insert_and_duplicates(void **st)
{
    struct pf_meta_hash r[] = {H("x"), H("x"), H("y")};
    struct pf_meta_hash a[] = {H("x"), H("x")};
    struct pf_meta_cmd cmds[] = {
        {PF_META_OP_REMOVE, "ns", r, 3},
        {PF_META_OP_INSERT, "ns", a, 2},
    };
    struct pf_meta_plan p;
    assert_int_equal(pf_meta_coalesce(cmds, 2, 16384, &p), 0);
    assert_int_equal(p.nbatches, 2);
    assert_int_equal(p.batches[0].op, PF_META_OP_INSERT);
    assert_int_equal(p.batches[0].n, 1);
    assert_true(has(&p.batches[0], "x"));
    assert_int_equal(p.batches[1].op, PF_META_OP_REMOVE);
    assert_int_equal(p.batches[1].n, 1);
    assert_true(has(&p.batches[1], "y"));
    pf_meta_plan_free(&p);
}

static void test_namespaces_are_distinct(void **st)
{
    struct pf_meta_hash k[] = {H("k")};
    char ns1[] = "one", ns1b[] = "one"; /* equal strings at different addresses */
    struct pf_meta_cmd cmds[] = {
        {PF_META_OP_INSERT, ns1, k, 1},
        {PF_META_OP_INSERT, "two", k, 1},
        {PF_META_OP_REMOVE, ns1b, k, 1},
        {PF_META_OP_REMOVE, "three", k, 1},
    };
    struct pf_meta_plan p;
    assert_int_equal(pf_meta_coalesce(cmds, 4, 16384, &p), 0);
    assert_int_equal(p.nbatches, 3);
    assert_int_equal(p.batches[0].op, PF_META_OP_INSERT);
    assert_string_equal(p.batches[0].ns, "two");
    assert_int_equal(p.batches[1].op, PF_META_OP_REMOVE);
    assert_string_equal(p.batches[1].ns, "one");
    assert_int_equal(p.batches[2].op, PF_META_OP_REMOVE);
    assert_string_equal(p.batches[2].ns, "three");
    pf_meta_plan_free(&p);
}

static void test_chunking(void **st)
{
    enum { N = 40000 };
    char(*buf)[16] = malloc(N * 16);
    struct pf_meta_hash *h = malloc(N * sizeof(*h));
    for (int i = 0; i < N; i++) {
        int l = snprintf(buf[i], 16, "h%d", i);
        h[i] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)buf[i]};
    }
    struct pf_meta_cmd cmds[] = {
        {PF_META_OP_REMOVE, "ns", h, 100},
        {PF_META_OP_INSERT, "ns", h, N},            /* overrides the 100 removes */
        {PF_META_OP_REMOVE, "ns", h + 39000, 1000}, /* the last 1000 become removes */
    };
    struct pf_meta_plan p;
    assert_int_equal(pf_meta_coalesce(cmds, 3, PF_META_CLIENT_CHUNK, &p), 0);
    assert_int_equal(p.nbatches, 4);
    size_t want[] = {16384, 16384, 39000 - 2 * 16384, 1000};
    size_t total = 0;
    for (size_t b = 0; b < 4; b++) {
        assert_int_equal(p.batches[b].n, want[b]);
        assert_int_equal(p.batches[b].op, b < 3 ? PF_META_OP_INSERT : PF_META_OP_REMOVE);
        assert_true(p.batches[b].n <= PF_META_CLIENT_CHUNK);
        total += p.batches[b].n;
    }
    assert_int_equal(total, N);
    /* order of first appearance within the insert group */
    assert_memory_equal(p.batches[0].hashes[0].data, "h0", 2);
    assert_memory_equal(p.batches[1].hashes[0].data, "h16384", 6);
    pf_meta_plan_free(&p);
    /* small chunks */
    assert_int_equal(pf_meta_coalesce(cmds + 1, 1, 7, &p), 0);
    assert_int_equal(p.nbatches, (N + 6) / 7);
    assert_int_equal(p.batches[p.nbatches - 1].n, N % 7 ? N % 7 : 7);
    pf_meta_plan_free(&p);
    free(h);
    free(buf);
}

static void test_edge_cases(void **st)
{
    struct pf_meta_plan p;
    assert_int_equal(pf_meta_coalesce(NULL, 0, 10, &p), 0);
    assert_int_equal(p.nbatches, 0);
    pf_meta_plan_free(&p);
    struct pf_meta_hash k[] = {H("k")};
    struct pf_meta_cmd c = {PF_META_OP_INSERT, "ns", k, 1};
    assert_int_equal(pf_meta_coalesce(&c, 1, 0, &p), -EINVAL);
    pf_meta_plan_free(NULL);
    /* hashes that share a prefix or differ only in length are distinct */
    struct pf_meta_hash ks[] = {H("ab"), H("abc"), H("a")};
    c.hashes = ks;
    c.n = 3;
    assert_int_equal(pf_meta_coalesce(&c, 1, 10, &p), 0);
    assert_int_equal(p.nbatches, 1);
    assert_int_equal(p.batches[0].n, 3);
    pf_meta_plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_write_wins),
        cmocka_unit_test(test_remove_then_insert_and_duplicates),
        cmocka_unit_test(test_namespaces_are_distinct),
        cmocka_unit_test(test_chunking),
        cmocka_unit_test(test_edge_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

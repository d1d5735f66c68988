/* src/common building blocks the server's threads rely on: the bounded/unbounded queue
 * (full, timeout, close with items left, wake-up of a blocked pop), the hash table (growth
 * keeps every node findable, removal), the slab (zeroed memory, reuse, sizes that would
 * wrap), big allocations (overflowing products refused) and UUID text forms. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pf/common.h"
#include "pf/htable.h"
#include "pf/slab.h"
#include "pf/thread.h"
#include "pf/util.h"

static void test_queue_bounded(void **st)
{
    struct pf_queue q;
    assert_int_equal(pf_queue_init(&q, 2), 0);
    int a = 1, b = 2, c = 3;
    void *it;
    assert_int_equal(pf_queue_pop(&q, &it, 10), -ETIMEDOUT);
    assert_int_equal(pf_queue_push(&q, &a), 0);
    assert_int_equal(pf_queue_push(&q, &b), 0);
    assert_int_equal(pf_queue_push(&q, &c), -EAGAIN); /* bounded */
    assert_int_equal(pf_queue_len(&q), 2);
    assert_int_equal(pf_queue_pop(&q, &it, 0), 0);
    assert_ptr_equal(it, &a); /* FIFO */
    assert_int_equal(pf_queue_push(&q, &c), 0);
    /* closing refuses pushes; what is queued still comes out, then -ESHUTDOWN */
    pf_queue_close(&q);
    assert_int_equal(pf_queue_push(&q, &a), -ESHUTDOWN);
    void *out[4];
    assert_int_equal(pf_queue_drain(&q, out, 4), 2);
    assert_ptr_equal(out[0], &b);
    assert_ptr_equal(out[1], &c);
    assert_int_equal(pf_queue_pop(&q, &it, UINT64_MAX), -ESHUTDOWN);
    pf_queue_destroy(&q);
}

static void test_queue_unbounded_grows(void **st)
{
    struct pf_queue q;
    assert_int_equal(pf_queue_init(&q, 0), 0);
    static int v[1000];
    for (int i = 0; i < 1000; i++)
        assert_int_equal(pf_queue_push(&q, &v[i]), 0);
    for (int i = 0; i < 1000; i++) {
        void *it;
        assert_int_equal(pf_queue_pop(&q, &it, 0), 0);
        assert_ptr_equal(it, &v[i]);
    }
    pf_queue_destroy(&q);
}

struct popper {
    struct pf_queue *q;
    int rc;
};

static void *pop_forever(void *arg)
{
    struct popper *p = arg;
    void *it;
    p->rc = pf_queue_pop(p->q, &it, UINT64_MAX);
    return NULL;
}

static void test_queue_close_wakes_pop(void **st)
{
    struct pf_queue q;
    assert_int_equal(pf_queue_init(&q, 4), 0);
    struct popper p = {.q = &q, .rc = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pop_forever, &p), 0);
    pf_queue_close(&q); /* whether the thread is already waiting or not, it must return */
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(p.rc, -ESHUTDOWN);
    pf_queue_destroy(&q);
}

struct item {
    struct pf_hnode node;
    uint64_t key;
};

static struct item *ht_find(struct pf_htable *t, uint64_t key)
{
    uint64_t h = pf_hash64(&key, sizeof(key));
    struct pf_hnode *n;
    pf_htable_for_each_hash(t, n, h)
    {
        struct item *it = pf_container_of(n, struct item, node);
        if (it->key == key)
            return it;
    }
    return NULL;
}

static void test_htable_growth_and_removal(void **st)
{
    struct pf_htable t;
    assert_int_equal(pf_htable_init(&t, 1), 0);
    assert_int_equal(t.mask + 1, 16); /* rounded up to the minimum */
    enum { N = 5000 };
    struct item *items = calloc(N, sizeof(*items));
    assert_non_null(items);
    for (uint64_t i = 0; i < N; i++) {
        items[i].key = i * 7919;
        pf_htable_insert(&t, &items[i].node, pf_hash64(&items[i].key, sizeof(uint64_t)));
    }
    assert_int_equal(t.count, N);
    assert_true(t.mask + 1 >= N / 4); /* it grew */
    for (uint64_t i = 0; i < N; i++)
        assert_ptr_equal(ht_find(&t, i * 7919), &items[i]);
    for (uint64_t i = 0; i < N; i += 2)
        pf_htable_remove(&t, &items[i].node);
    assert_int_equal(t.count, N / 2);
    for (uint64_t i = 0; i < N; i++)
        assert_true((ht_find(&t, i * 7919) != NULL) == (i % 2 == 1));
    size_t seen = 0;
    pf_htable_for_each(&t, b, n) seen++;
    assert_int_equal(seen, N / 2);
    pf_htable_destroy(&t);
    free(items);
}

static void test_slab(void **st)
{
    uint8_t *p = pf_slab_alloc(100);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(p[i], 0);
    memset(p, 0xab, 100);
    pf_slab_free(p, 100);
    uint8_t *q = pf_slab_alloc(128); /* same 128-byte class: reused, and zeroed again */
    for (int i = 0; i < 128; i++)
        assert_int_equal(q[i], 0);
    pf_slab_free(q, 128);
    /* sizes that would round up past SIZE_MAX are refused, not shrunk to 64 bytes */
    assert_null(pf_slab_alloc(SIZE_MAX - 9));
    assert_null(pf_slab_alloc(SIZE_MAX));
    void *big = pf_slab_alloc(1 << 20); /* beyond the classes: plain aligned memory */
    assert_non_null(big);
    pf_slab_free(big, 1 << 20);
    assert_null(pf_big_calloc(SIZE_MAX / 2, 3));
    size_t n = 1 << 16;
    uint64_t *a = pf_big_calloc(n, sizeof(uint64_t));
    assert_non_null(a);
    assert_int_equal(a[n - 1], 0);
    pf_big_free(a, n, sizeof(uint64_t));
}

static void test_uuid(void **st)
{
    uint8_t raw[16], back[16];
    char s[PF_UUID_STR_LEN];
    assert_int_equal(pf_uuid_v4(raw), 0);
    pf_uuid_format(raw, s);
    assert_int_equal(strlen(s), 36);
    assert_int_equal(s[14], '4');
    assert_int_equal(pf_uuid_parse(s, back), 0);
    assert_memory_equal(raw, back, 16);
    char simple[33];
    pf_hex_encode(raw, 16, simple);
    assert_int_equal(pf_uuid_parse(simple, back), 0);
    assert_memory_equal(raw, back, 16);
    assert_int_equal(pf_uuid_parse("", back), -EINVAL);
    assert_int_equal(pf_uuid_parse("zzzzzzzz-zzzz-4zzz-zzzz-zzzzzzzzzzzz", back), -EINVAL);
    s[8] = 'x';
    assert_int_equal(pf_uuid_parse(s, back), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_bounded),
        cmocka_unit_test(test_queue_unbounded_grows),
        cmocka_unit_test(test_queue_close_wakes_pop),
        cmocka_unit_test(test_htable_growth_and_removal),
        cmocka_unit_test(test_slab),
        cmocka_unit_test(test_uuid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

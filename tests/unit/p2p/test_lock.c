/* Transfer-lock manager with a fake clock: sessions hold strong references until released
 * or expired, unknown and repeated releases answer -ENOENT, expiry happens exactly at the
 * timeout, the metrics move by deltas (several managers in one process add up), shutdown
 * releases everything, and concurrent acquire/release/expire keep the counts consistent
 * (run under SAN=thread too). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/block.h"
#include "pf/pool.h"
#include "pf/metrics.h"
#include "pf/p2p.h"

#define SEC PF_NS_PER_SEC

/* Blocks of one slot in a static stand-in allocation whose count never drops to 0. */
static uint8_t fake_mem[64];
static struct pf_alloc fake = {.ptr = fake_mem, .size = sizeof(fake_mem), .refs = 1u << 30};

static struct pf_block *mkblock(int i)
{
    struct pf_block_key k;
    uint8_t h[8] = {(uint8_t)i, (uint8_t)(i >> 8), 1, 2, 3, 4, 5, 6};
    pf_key_make(0, h, sizeof(h), &k);
    pf_alloc_get(&fake);
    struct pf_slot s = {.k = fake_mem, .ka = &fake, .seg_len = 64, .seg_stride = 64, .nseg = 1};
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, &k, 1, &s, &b), 0);
    return b;
}

static double active(void)
{
    return pf_metric_value_of("pegaflow_transfer_lock_active", NULL);
}

static double timeouts(void)
{
    return pf_metric_value_of("pegaflow_transfer_lock_timeouts_total", NULL);
}

static void test_acquire_release(void **st)
{
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 100 * SEC);
    struct pf_p2p_locks *l;
    assert_int_equal(pf_p2p_locks_create(&clk.base, 120 * SEC, &l), 0);
    double a0 = active();
    struct pf_block *b[3] = {mkblock(1), mkblock(2), mkblock(3)};
    for (int i = 0; i < 3; i++)
        pf_block_get(b[i]); /* the session takes these */
    char id[PF_UUID_STR_LEN], id2[PF_UUID_STR_LEN];
    assert_int_equal(pf_p2p_locks_acquire(l, b, 3, id), 0);
    assert_int_equal(strlen(id), 36);
    uint8_t raw[16];
    assert_int_equal(pf_uuid_parse(id, raw), 0);
    assert_int_equal(raw[6] >> 4, 4); /* UUID v4 */
    assert_int_equal(pf_block_strong(b[0]), 2);
    assert_int_equal(pf_p2p_locks_sessions(l), 1);
    assert_int_equal(pf_p2p_locks_blocks(l), 3);
    assert_true(active() == a0 + 3);
    /* an empty session is a session too (the reference creates one when nothing is found) */
    assert_int_equal(pf_p2p_locks_acquire(l, NULL, 0, id2), 0);
    assert_string_not_equal(id, id2);
    assert_int_equal(pf_p2p_locks_sessions(l), 2);

    size_t n = 99;
    assert_int_equal(pf_p2p_locks_release(l, "no-such-session", &n), -ENOENT);
    assert_int_equal(n, 99); /* untouched on error */
    assert_int_equal(pf_p2p_locks_release(l, NULL, &n), -ENOENT);
    char longid[200];
    memset(longid, 'a', sizeof(longid) - 1);
    longid[sizeof(longid) - 1] = '\0';
    assert_int_equal(pf_p2p_locks_release(l, longid, &n), -ENOENT);
    assert_int_equal(pf_p2p_locks_release(l, id, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(pf_block_strong(b[0]), 1);
    assert_true(active() == a0);
    /* exactly once: a second release of the same session is unknown */
    assert_int_equal(pf_p2p_locks_release(l, id, &n), -ENOENT);
    assert_int_equal(pf_p2p_locks_release(l, id2, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(pf_p2p_locks_sessions(l), 0);
    pf_p2p_locks_destroy(l);
    for (int i = 0; i < 3; i++)
        pf_block_put(b[i]);
}

static void test_expiry(void **st)
{
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 5 * SEC);
    struct pf_p2p_locks *l;
    assert_int_equal(pf_p2p_locks_create(&clk.base, 10 * SEC, &l), 0);
    double a0 = active(), t0 = timeouts();
    struct pf_block *b = mkblock(7);
    char id1[PF_UUID_STR_LEN], id2[PF_UUID_STR_LEN];
    pf_block_get(b);
    assert_int_equal(pf_p2p_locks_acquire(l, &b, 1, id1), 0);
    pf_fake_clock_advance(&clk, 4 * SEC);
    pf_block_get(b);
    assert_int_equal(pf_p2p_locks_acquire(l, &b, 1, id2), 0);
    assert_int_equal(pf_block_strong(b), 3);
    pf_fake_clock_advance(&clk, 6 * SEC - 1); /* id1 is 1 ns short of its timeout */
    assert_int_equal(pf_p2p_locks_expire(l), 0);
    pf_fake_clock_advance(&clk, 1);
    assert_int_equal(pf_p2p_locks_expire(l), 1);
    assert_true(timeouts() == t0 + 1);
    assert_true(active() == a0 + 1);
    assert_int_equal(pf_block_strong(b), 2);
    size_t n;
    assert_int_equal(pf_p2p_locks_release(l, id1, &n), -ENOENT); /* expired: unknown */
    pf_fake_clock_advance(&clk, 4 * SEC);
    assert_int_equal(pf_p2p_locks_expire(l), 1);
    assert_true(timeouts() == t0 + 2);
    assert_int_equal(pf_p2p_locks_sessions(l), 0);
    assert_int_equal(pf_block_strong(b), 1);
    assert_true(active() == a0);
    /* an expiry pass whose clock reading predates a session (read before the session was
     * inserted) must not see it as 2^64 ns old */
    pf_block_get(b);
    assert_int_equal(pf_p2p_locks_acquire(l, &b, 1, id2), 0);
    atomic_store(&clk.ns, atomic_load(&clk.ns) - 1);
    assert_int_equal(pf_p2p_locks_expire(l), 0);
    assert_true(timeouts() == t0 + 2);
    assert_int_equal(pf_p2p_locks_release(l, id2, &n), 0);
    pf_fake_clock_advance(&clk, 1);
    /* a block removed from everything else lives exactly as long as its lock */
    pf_block_get(b);
    assert_int_equal(pf_p2p_locks_acquire(l, &b, 1, id1), 0);
    pf_block_put(b); /* the "cache" reference */
    assert_int_equal(pf_block_strong(b), 1);
    pf_fake_clock_advance(&clk, 10 * SEC);
    assert_int_equal(pf_p2p_locks_expire(l), 1); /* frees the block */
    pf_p2p_locks_destroy(l);
}

static void test_release_all_and_many(void **st)
{
    struct pf_p2p_locks *l;
    assert_int_equal(pf_p2p_locks_create(NULL, 60 * SEC, &l), 0);
    assert_int_equal(pf_p2p_locks_create(NULL, 0, &l), -EINVAL);
    double a0 = active();
    enum { N = 300 };
    char ids[N][PF_UUID_STR_LEN];
    for (int i = 0; i < N; i++) {
        struct pf_block *b = mkblock(i);
        assert_int_equal(pf_p2p_locks_acquire(l, &b, 1, ids[i]), 0); /* owns the only ref */
    }
    for (int i = 0; i < N; i += 3) {
        size_t n;
        assert_int_equal(pf_p2p_locks_release(l, ids[i], &n), 0);
        assert_int_equal(n, 1);
    }
    assert_int_equal(pf_p2p_locks_sessions(l), N - N / 3);
    assert_int_equal(pf_p2p_locks_release_all(l), N - N / 3);
    assert_int_equal(pf_p2p_locks_sessions(l), 0);
    assert_true(active() == a0);
    pf_p2p_locks_destroy(l);
    pf_p2p_locks_destroy(NULL);
}

/* ---- concurrency ---- */

struct conc {
    struct pf_p2p_locks *l;
    struct pf_fake_clock *clk;
    struct pf_block *blocks[8];
    int released;
};

static void *worker(void *arg)
{
    struct conc *c = arg;
    for (int i = 0; i < 2000; i++) {
        char id[PF_UUID_STR_LEN];
        struct pf_block *b[8];
        for (int k = 0; k < 8; k++) {
            b[k] = c->blocks[k];
            pf_block_get(b[k]);
        }
        assert_int_equal(pf_p2p_locks_acquire(c->l, b, 8, id), 0);
        size_t n = 0;
        if (pf_p2p_locks_release(c->l, id, &n) == 0) {
            assert_int_equal(n, 8);
            c->released++;
        }
    }
    return NULL;
}

static void *expirer(void *arg)
{
    struct conc *c = arg;
    for (int i = 0; i < 2000; i++) {
        pf_fake_clock_advance(c->clk, PF_NS_PER_MS);
        pf_p2p_locks_expire(c->l);
    }
    return NULL;
}

static void test_concurrent(void **st)
{
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 0);
    struct pf_p2p_locks *l;
    assert_int_equal(pf_p2p_locks_create(&clk.base, PF_NS_PER_MS, &l), 0);
    double a0 = active(), t0 = timeouts();
    struct conc c[3];
    struct pf_block *shared[8];
    for (int k = 0; k < 8; k++)
        shared[k] = mkblock(1000 + k);
    pthread_t t[4];
    for (int i = 0; i < 3; i++) {
        memset(&c[i], 0, sizeof(c[i]));
        c[i].l = l;
        c[i].clk = &clk;
        memcpy(c[i].blocks, shared, sizeof(shared));
        pthread_create(&t[i], NULL, worker, &c[i]);
    }
    pthread_create(&t[3], NULL, expirer, &c[0]);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    pf_fake_clock_advance(&clk, PF_NS_PER_SEC);
    size_t left = pf_p2p_locks_expire(l);
    int released = c[0].released + c[1].released + c[2].released;
    double expired = timeouts() - t0;
    /* every session ended exactly once: released or expired */
    assert_true((double)released + expired == 3 * 2000);
    assert_true(left <= (size_t)expired);
    assert_true(active() == a0);
    for (int k = 0; k < 8; k++) {
        assert_int_equal(pf_block_strong(shared[k]), 1);
        pf_block_put(shared[k]);
    }
    pf_p2p_locks_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_release),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_release_all_and_many),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The READ engine against the scripted NET backend: byte-exact delivery spread over NICs and
 * QPs with the outstanding work bounded, -EAGAIN retried, and every failure (error
 * completion, post error, deadline, abort, unexpected completion) invalidating every QP
 * before it returns; a READ for a NIC without a QP is refused before anything is posted. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mock_net.h"
#include "p2p/p2p_internal.h"

#define NR   600
#define MAXL 9000

struct fx {
    struct mnet m;
    struct pf_net_qp *qps[8];
    size_t nqps;
    uint8_t *src, *dst;
    struct p2p_read reads[NR];
    uint64_t off[NR];
};

static void fx_init(struct fx *f, int nnics, int qps_per_nic, bool connect)
{
    memset(f, 0, sizeof(*f));
    mn_init(&f->m, nnics);
    for (int k = 0; k < nnics; k++)
        for (int j = 0; j < qps_per_nic; j++) {
            struct pf_net_qp *q;
            assert_int_equal(pf_net_qp_create(&f->m.base, k, &q), 0);
            if (connect)
                assert_int_equal(pf_net_qp_connect(q, "MQP\0\0\0\0\0", 8), 0);
            f->qps[f->nqps++] = q;
        }
    f->src = malloc((size_t)NR * MAXL);
    f->dst = calloc(NR, MAXL);
    unsigned s = 12345;
    for (size_t i = 0; i < (size_t)NR * MAXL; i++) {
        s = s * 1103515245u + 12345u;
        f->src[i] = (uint8_t)(s >> 16);
    }
    for (int i = 0; i < NR; i++) {
        uint64_t len = 1 + (uint64_t)(i * 7919) % (MAXL - 1);
        f->off[i] = (uint64_t)i * MAXL;
        f->reads[i] = (struct p2p_read){.local = f->dst + f->off[i],
                                        .len = len,
                                        .lkey = 1,
                                        .raddr = (uint64_t)(uintptr_t)(f->src + f->off[i]),
                                        .rkey = 2,
                                        .nic = i % nnics};
    }
}

static void fx_free(struct fx *f)
{
    for (size_t i = 0; i < f->nqps; i++)
        pf_net_qp_destroy(f->qps[i]);
    free(f->src);
    free(f->dst);
}

static struct p2p_xfer mkx(struct fx *f, uint64_t tmo_ms, unsigned depth)
{
    return (struct p2p_xfer){.qps = f->qps,
                             .nqps = f->nqps,
                             .deadline_ns = pf_now_ns() + tmo_ms * PF_NS_PER_MS,
                             .depth = depth,
                             .rotate = 3};
}

static void count_read(void *ctx, size_t i, bool digested)
{
    ((int *)ctx)[i]++;
}

static void test_spread_and_bound(void **st)
{
    struct fx f;
    fx_init(&f, 2, 2, true);
    struct p2p_xfer x = mkx(&f, 10000, 16);
    static int seen[NR];
    memset(seen, 0, sizeof(seen));
    x.on_read = count_read;
    x.ctx = seen;
    assert_int_equal(p2p_xfer_run(&x, f.reads, NR), 0);
    for (int i = 0; i < NR; i++)
        assert_int_equal(seen[i], 1); /* each completed READ reported once */
    assert_int_equal(x.posted, NR);
    assert_int_equal(x.completed, NR);
    uint64_t bytes = 0;
    for (int i = 0; i < NR; i++) {
        assert_memory_equal(f.dst + f.off[i], f.src + f.off[i], f.reads[i].len);
        bytes += f.reads[i].len;
    }
    assert_int_equal(x.bytes, bytes);
    assert_true(f.m.max_out <= 16);
    assert_int_equal(f.m.nics_used[0], NR / 2); /* READs stay on their NIC */
    assert_int_equal(f.m.nics_used[1], NR / 2);
    assert_int_equal(f.m.invalidates, 0);
    fx_free(&f);
}

static int g_seen[NR];
static void count_seen(void *ctx, size_t i, bool digested)
{
    (void)ctx;
    g_seen[i]++;
}

/* xfer reroute (fetch.c reroute_read): the READ moves to NIC nic with that NIC's keys */
static int reroute_to(void *ctx, size_t i, int nic)
{
    struct fx *f = ctx;
    f->reads[i].nic = nic;
    f->reads[i].lkey = 10 + (uint32_t)nic;
    f->reads[i].rkey = 20 + (uint32_t)nic;
    return 0;
}

/* NIC 1's link goes down under a transfer over 2 NICs x 2 QPs: its QPs' READs fail (one
 * -ETIMEDOUT each, the rest flushed), only those two QPs are invalidated, every READ of
 * NIC 1 is re-posted on NIC 0 with NIC 0's keys, and every byte lands (before: the first
 * error completion failed the whole transfer and invalidated all four QPs). */
static void test_rail_failover(void **st)
{
    struct fx f;
    fx_init(&f, 2, 2, true);
    f.m.dead_nic = 2;
    struct p2p_xfer y = mkx(&f, 10000, 8);
    memset(g_seen, 0, sizeof(g_seen));
    y.on_read = count_seen;
    y.reroute = reroute_to;
    y.ctx = &f;
    assert_int_equal(p2p_xfer_run(&y, f.reads, NR), 0);
    assert_int_equal(y.completed, NR);
    assert_int_equal(f.m.invalidates, 2); /* NIC 1's two QPs, not NIC 0's */
    uint64_t want = 0;
    for (size_t q = 0; q < f.nqps; q++)
        if (f.qps[q]->nic == 1)
            want |= 1ull << q;
    assert_true(y.failed == want);
    for (int i = 0; i < NR; i++) {
        assert_memory_equal(f.dst + f.off[i], f.src + f.off[i], f.reads[i].len);
        assert_int_equal(f.reads[i].nic, 0);
        if (i % 2) /* NIC 1's READs, with NIC 0's keys now */
            assert_int_equal(f.reads[i].lkey, 10);
        assert_int_equal(g_seen[i], 1); /* each reported once, rerouted or not */
    }
    fx_free(&f);
}

/* Without a surviving rail the transfer fails as before (every QP invalidated), and a
 * remote access error is not rerouted: it would fail the same on every rail. */
static void test_rail_failover_limits(void **st)
{
    struct fx f;
    fx_init(&f, 2, 1, true);
    f.m.dead_nic = 2;
    struct p2p_xfer x = mkx(&f, 10000, 8);
    x.reroute = reroute_to;
    x.ctx = &f;
    f.m.complete_err_nth = 200; /* then NIC 0 fails too */
    f.m.complete_err = -EIO;
    f.m.drop_from_nth = 201;
    assert_int_equal(p2p_xfer_run(&x, f.reads, NR), -EIO);
    /* each QP as it failed (NIC 1's, then NIC 0's), then every QP before returning */
    assert_int_equal(f.m.invalidates, 2 + (int)f.nqps);
    assert_true(x.completed < NR);
    fx_free(&f);

    fx_init(&f, 2, 2, true);
    x = mkx(&f, 10000, 8);
    x.reroute = reroute_to;
    x.ctx = &f;
    f.m.complete_err_nth = 40;
    f.m.complete_err = -EREMOTEIO;
    f.m.drop_from_nth = 41;
    assert_int_equal(p2p_xfer_run(&x, f.reads, NR), -EREMOTEIO);
    assert_int_equal(f.m.invalidates, (int)f.nqps);
    assert_true(x.failed == 0);
    fx_free(&f);
}

static void test_eagain_retried(void **st)
{
    struct fx f;
    fx_init(&f, 1, 1, true);
    f.m.eagain_nth = 3;
    struct p2p_xfer x = mkx(&f, 10000, PF_P2P_QP_DEPTH);
    assert_int_equal(p2p_xfer_run(&x, f.reads, 50), 0);
    assert_int_equal(x.completed, 50);
    assert_true(f.m.max_out <= PF_P2P_QP_DEPTH);
    fx_free(&f);
}

static void test_error_completion_invalidates(void **st)
{
    struct fx f;
    fx_init(&f, 2, 2, true);
    f.m.complete_err_nth = 40;
    f.m.complete_err = -EREMOTEIO;
    f.m.drop_from_nth = 41; /* nothing after it completes: as an RC QP in error */
    struct p2p_xfer x = mkx(&f, 10000, 8);
    assert_int_equal(p2p_xfer_run(&x, f.reads, NR), -EREMOTEIO);
    assert_int_equal(f.m.invalidates, (int)f.nqps); /* every QP, before returning */
    assert_true(x.completed < NR);
    fx_free(&f);
}

/* A READ failing with -ETIMEDOUT (verbs: transport retries exhausted after the holder died,
 * seen over soft-RoCE) is a peer error, not the fetch deadline: -EHOSTUNREACH, so the fetch
 * counts it as an error and not as a timeout. */
static void test_transport_timeout_is_not_deadline(void **st)
{
    struct fx f;
    fx_init(&f, 1, 1, true);
    f.m.complete_err_nth = 5;
    f.m.complete_err = -ETIMEDOUT;
    f.m.drop_from_nth = 6;
    struct p2p_xfer x = mkx(&f, 10000, 8);
    assert_int_equal(p2p_xfer_run(&x, f.reads, NR), -EHOSTUNREACH);
    assert_int_equal(f.m.invalidates, (int)f.nqps);
    fx_free(&f);
}

static void test_timeout_invalidates(void **st)
{
    struct fx f;
    fx_init(&f, 1, 2, true);
    f.m.drop_from_nth = 10;
    struct p2p_xfer x = mkx(&f, 150, PF_P2P_QP_DEPTH);
    assert_int_equal(p2p_xfer_run(&x, f.reads, 100), -ETIMEDOUT);
    assert_int_equal(f.m.invalidates, 2);
    assert_int_equal(x.completed, 9);
    fx_free(&f);
}

static void test_post_error(void **st)
{
    struct fx f;
    fx_init(&f, 1, 2, true);
    f.m.post_fail_nth = 4;
    f.m.post_fail_err = -EINVAL;
    f.m.post_fail_times = 1;
    struct p2p_xfer x = mkx(&f, 10000, PF_P2P_QP_DEPTH);
    assert_int_equal(p2p_xfer_run(&x, f.reads, 100), -EINVAL);
    assert_int_equal(x.posted, 3);
    assert_int_equal(f.m.invalidates, 2);
    fx_free(&f);
}

static void test_not_connected(void **st)
{
    struct fx f;
    fx_init(&f, 1, 1, false);
    struct p2p_xfer x = mkx(&f, 10000, PF_P2P_QP_DEPTH);
    assert_int_equal(p2p_xfer_run(&x, f.reads, 10), -ENOTCONN);
    assert_int_equal(x.posted, 0);
    assert_int_equal(x.completed, 0);
    fx_free(&f);
}

static void test_nic_without_qp(void **st)
{
    struct fx f;
    fx_init(&f, 2, 1, true);
    struct p2p_xfer x = mkx(&f, 10000, PF_P2P_QP_DEPTH);
    x.nqps = 1; /* only NIC 0's QP, but half the READs are for NIC 1 */
    assert_int_equal(p2p_xfer_run(&x, f.reads, 10), -EINVAL);
    assert_int_equal(f.m.posts, 0);
    assert_int_equal(f.m.invalidates, 0);
    struct p2p_read bad = f.reads[0];
    bad.nic = 7;
    assert_int_equal(p2p_xfer_run(&x, &bad, 1), -EINVAL);
    assert_int_equal(p2p_xfer_run(&x, f.reads, 0), 0);
    fx_free(&f);
}

static void *set_abort(void *arg)
{
    usleep(50000);
    atomic_store((_Atomic bool *)arg, true);
    return NULL;
}

static void test_abort_flag(void **st)
{
    struct fx f;
    fx_init(&f, 1, 1, true);
    f.m.drop_from_nth = 1;
    static _Atomic bool stop;
    atomic_store(&stop, false);
    struct p2p_xfer x = mkx(&f, 60000, PF_P2P_QP_DEPTH);
    x.abort = &stop;
    pthread_t t;
    pthread_create(&t, NULL, set_abort, &stop);
    assert_int_equal(p2p_xfer_run(&x, f.reads, 20), -ECANCELED);
    pthread_join(t, NULL);
    assert_int_equal(f.m.invalidates, 1);
    fx_free(&f);
}

static void test_unexpected_completion(void **st)
{
    struct fx f;
    fx_init(&f, 1, 1, true);
    struct mqp *q = (struct mqp *)f.qps[0];
    q->cq[q->ncq++] = (struct pf_net_cqe){.wr_id = 5, .status = 0, .bytes = 1}; /* never posted */
    f.m.drop_from_nth = 1;
    struct p2p_xfer x = mkx(&f, 10000, PF_P2P_QP_DEPTH);
    assert_int_equal(p2p_xfer_run(&x, f.reads, 3), -EPROTO);
    assert_int_equal(f.m.invalidates, 1);
    fx_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spread_and_bound),
        cmocka_unit_test(test_eagain_retried),
        cmocka_unit_test(test_rail_failover),
        cmocka_unit_test(test_rail_failover_limits),
        cmocka_unit_test(test_error_completion_invalidates),
        cmocka_unit_test(test_timeout_invalidates),
        cmocka_unit_test(test_transport_timeout_is_not_deadline),
        cmocka_unit_test(test_post_error),
        cmocka_unit_test(test_not_connected),
        cmocka_unit_test(test_nic_without_qp),
        cmocka_unit_test(test_abort_flag),
        cmocka_unit_test(test_unexpected_completion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

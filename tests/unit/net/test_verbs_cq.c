/* verbs NET backend (hw/verbs/verbs_cq.c, verbs_qp.c) against the fake HCA (fake_hca.h):
 * chained posts (post_reads: one ibv_post_send for a chain, every READ signalled, the chain
 * cut at a refused READ, at the send-queue bound and at the provider's bad_wr; p2p_xfer_run
 * posting through it), shared CQs per NIC (completions of several QPs drained by one
 * ibv_poll_cq and routed by qp_num, under concurrent pollers that sleep on the shared
 * channel; an error completion and flushes of one QP never reach another), and CQ sizing
 * (QPs per CQ from max_cqe, no overrun with every send queue full and nothing polled).
 * Skipped (77) when the backend is not compiled. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pf/clock.h"
#include "pf/common.h"
#include "pf/hal.h"
#include "pf/log.h"

#include "fake_hca.h"

#if HAVE_IBV_HEADERS

#include "p2p/p2p_internal.h"

/* nq QPs on NIC name (one device), connected pairwise (0<->1, 2<->3, ...), a buffer. */
#define MAXQ 12
struct qset {
    struct pf_net *n;
    struct pf_net_qp *q[MAXQ];
    struct fake_qp *f[MAXQ];
    int nq;
    uint8_t *buf;
    struct pf_net_mr *mr;
};

static void qset_open(struct qset *s, const char *name, int nq)
{
    struct pf_net_config cfg = {.nics = (const char *[]){name}, .nnics = 1};
    assert_int_equal(pf_verbs_open_api(&fake_api, &cfg, &s->n), 0);
    s->nq = nq;
    s->buf = calloc(1, 1 << 20);
    assert_int_equal(pf_net_reg_mem(s->n, 0, s->buf, 1 << 20,
                                    PF_NET_ACCESS_LOCAL_WRITE | PF_NET_ACCESS_REMOTE_READ, &s->mr),
                     0);
    for (int i = 0; i < nq; i++) {
        assert_int_equal(pf_net_qp_create(s->n, 0, &s->q[i]), 0);
        s->f[i] = F.qps[F.nqps - 1];
    }
    for (int i = 0; i + 1 < nq; i += 2) {
        uint8_t ea[PF_NET_EP_MAX], eb[PF_NET_EP_MAX];
        size_t la, lb;
        assert_int_equal(pf_net_qp_local_endpoint(s->q[i], ea, sizeof(ea), &la), 0);
        assert_int_equal(pf_net_qp_local_endpoint(s->q[i + 1], eb, sizeof(eb), &lb), 0);
        assert_int_equal(pf_net_qp_connect(s->q[i], eb, lb), 0);
        assert_int_equal(pf_net_qp_connect(s->q[i + 1], ea, la), 0);
    }
}

static void qset_close(struct qset *s)
{
    for (int i = 0; i < s->nq; i++)
        pf_net_qp_destroy(s->q[i]);
    pf_net_dereg_mem(s->mr);
    pf_net_close(s->n);
    free(s->buf);
    assert_int_equal(F.cq_live, 0);
    assert_int_equal(F.ch_live, 0);
    assert_int_equal(F.ctx_live, 0);
}

/* ---------------------------------------------------------------- chained posts */

static void test_chain_one_post_send(void **st)
{
    (void)st;
    struct qset s;
    qset_open(&s, "mlx5_0", 2);
    struct pf_net_qp *q = s.q[1];
    struct fake_qp *f = s.f[1];
    struct pf_net_sge sge[40];
    struct pf_net_read rd[40];
    for (int i = 0; i < 40; i++) {
        sge[i] = (struct pf_net_sge){s.buf + 4096 * i, 100 + (uint64_t)i, s.mr->lkey};
        rd[i] = (struct pf_net_read){
            &sge[i], 1, 0x10000 + 0x1000 * (uint64_t)i, 0x55, 1000 + (uint64_t)i, NULL};
    }
    size_t k;
    F.post_sends = 0;
    assert_int_equal(pf_net_post_reads(q, rd, 8, &k), 0);
    assert_int_equal(k, 8);
    assert_int_equal(F.post_sends, 1); /* one ibv_post_send for the chain */
    assert_int_equal(f->nposted, 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(f->wr[i].chain, i);
        assert_int_equal(f->wr[i].wr_id, 1000 + i);
        assert_int_equal(f->wr[i].opcode, IBV_WR_RDMA_READ);
        assert_true(f->wr[i].flags & IBV_SEND_SIGNALED); /* a completion per READ */
        assert_int_equal(f->wr[i].raddr, 0x10000 + 0x1000 * i);
        assert_int_equal(f->wr[i].sge[0].length, 100 + i);
    }
    fake_complete(f, 8, IBV_WC_SUCCESS);
    struct pf_net_cqe c[40];
    assert_int_equal(pf_net_poll(q, c, 40, 0), 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(c[i].wr_id, 1000 + i);
        assert_int_equal(c[i].status, 0);
        assert_int_equal(c[i].bytes, 100 + i);
    }

    /* a refused READ cuts the chain: the front is posted, the call returns its error */
    struct pf_net_sge bad = {s.buf, 16, s.mr->lkey + 99};
    struct pf_net_read rb[5];
    memcpy(rb, rd, sizeof(rb));
    rb[3].sge = &bad;
    F.post_sends = 0;
    assert_int_equal(pf_net_post_reads(q, rb, 5, &k), -EINVAL);
    assert_int_equal(k, 3);
    assert_int_equal(pf_net_post_reads(q, rb + 3, 2, &k), -EINVAL);
    assert_int_equal(k, 0);
    assert_int_equal(F.post_sends, 1);
    assert_int_equal(f->nposted, 11);

    /* the provider refuses the 3rd WR of a chain (ibv_post_send(3) bad_wr): 2 posted, and
     * only those 2 are outstanding */
    F.post_fail_at = 3;
    assert_int_equal(pf_net_post_reads(q, rd + 20, 5, &k), -EAGAIN);
    assert_int_equal(k, 2);
    F.post_fail_at = 0;
    assert_int_equal(f->nposted, 13);
    fake_complete(f, 5, IBV_WC_SUCCESS);
    assert_int_equal(pf_net_poll(q, c, 40, 0), 5);
    assert_int_equal(c[3].wr_id, 1020);
    assert_int_equal(c[4].wr_id, 1021);
    assert_int_equal(c[4].bytes, 121);
    assert_int_equal(pf_net_poll(q, c, 40, 0), 0);

    /* chains of at most PF_VERBS_POST_CHAIN WRs per ibv_post_send; the send queue bound
     * cuts a chain with -EAGAIN */
    F.post_sends = 0;
    assert_int_equal(pf_net_post_reads(q, rd, 40, &k), 0);
    assert_int_equal(k, 40);
    assert_int_equal(F.post_sends, 2);
    assert_int_equal(f->wr[13 + PF_VERBS_POST_CHAIN - 1].chain, PF_VERBS_POST_CHAIN - 1);
    assert_int_equal(f->wr[13 + PF_VERBS_POST_CHAIN].chain, 0);
    int out = 40;
    while (out + 7 <= PF_VERBS_SQ_DEPTH) {
        assert_int_equal(pf_net_post_reads(q, rd, 7, &k), 0);
        out += 7;
    }
    assert_true(PF_VERBS_SQ_DEPTH - out > 0);
    assert_int_equal(pf_net_post_reads(q, rd, 8, &k), -EAGAIN); /* cut short */
    assert_int_equal(k, PF_VERBS_SQ_DEPTH - out);
    assert_int_equal(pf_net_post_reads(q, rd, 8, &k), -EAGAIN);
    assert_int_equal(k, 0);
    /* a broken QP: -ENOTCONN for the whole chain */
    pf_net_qp_invalidate(q);
    assert_int_equal(pf_net_post_reads(q, rd, 4, &k), -ENOTCONN);
    assert_int_equal(k, 0);
    qset_close(&s);
}

/* Completes every pending WR of the set's QPs, a few at a time, until stop. */
struct completer {
    struct qset *s;
    _Atomic bool stop;
    unsigned seed;
};

static void *completer_main(void *arg)
{
    struct completer *c = arg;
    while (!atomic_load(&c->stop)) {
        bool any = false;
        for (int i = 0; i < c->s->nq; i++) {
            struct fake_qp *f = c->s->f[i];
            pthread_mutex_lock(&F.mu);
            bool pend = f->ncompleted < f->nposted;
            pthread_mutex_unlock(&F.mu);
            if (pend) {
                fake_complete(f, 1 + (int)(rand_r(&c->seed) % 3), IBV_WC_SUCCESS);
                any = true;
            }
        }
        if (!any) {
            struct timespec ts = {0, 20000}; /* pacing only: nothing pending */
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

/* p2p_xfer_run posts through post_reads: its first post on a QP is one chain of 16. */
static void test_xfer_posts_chains(void **st)
{
    (void)st;
    struct qset s;
    qset_open(&s, "mlx5_0", 4); /* READs go on QPs 0 and 2 (connected to 1 and 3) */
    struct p2p_read reads[96];
    for (int i = 0; i < 96; i++)
        reads[i] = (struct p2p_read){.local = s.buf + 1024 * i,
                                     .len = 1024,
                                     .lkey = s.mr->lkey,
                                     .raddr = 0x100000 + 1024 * (uint64_t)i,
                                     .rkey = 9,
                                     .nic = 0};
    struct pf_net_qp *qps[2] = {s.q[0], s.q[2]};
    struct p2p_xfer x = {
        .qps = qps, .nqps = 2, .depth = 32, .deadline_ns = pf_now_ns() + 60 * PF_NS_PER_SEC};
    F.post_sends = 0;
    struct completer c = {.s = &s, .seed = 7};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, completer_main, &c), 0);
    int rc = p2p_xfer_run(&x, reads, 96);
    atomic_store(&c.stop, true);
    pthread_join(t, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(x.completed, 96);
    assert_int_equal(x.bytes, 96 * 1024);
    assert_int_equal(s.f[0]->nposted + s.f[2]->nposted, 96);
    assert_true(F.post_sends < 96);
    for (int i = 0; i < 16; i++) /* the first post on QP 0: one chain of 16 WRs */
        assert_int_equal(s.f[0]->wr[i].chain, i);
    qset_close(&s);
}

/* ---------------------------------------------------------------- shared CQs */

/* Two QPs of a NIC share a CQ: one ibv_poll_cq drains both QPs' completions and each QP's
 * poll returns only its own. */
static void test_shared_cq_routing(void **st)
{
    (void)st;
    struct qset s;
    qset_open(&s, "mlx5_0", 4);
    for (int i = 1; i < 4; i++)
        assert_ptr_equal(s.f[i]->cq, s.f[0]->cq); /* one CQ for the NIC's QPs */
    assert_int_equal(F.cq_live, 1);
    assert_int_equal(s.f[0]->cq->cq.cqe, PF_VERBS_CQ_QPS * PF_VERBS_QP_CQE);
    struct pf_net_sge g = {s.buf, 64, s.mr->lkey};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pf_net_post_read(s.q[0], &g, 1, 0x1000, 1, 100 + (uint64_t)i), 0);
        assert_int_equal(pf_net_post_read(s.q[2], &g, 1, 0x1000, 1, 200 + (uint64_t)i), 0);
    }
    /* interleaved in the CQ: q2, q0, q2, q0, ... */
    for (int i = 0; i < 3; i++) {
        fake_complete(s.f[2], 1, IBV_WC_SUCCESS);
        fake_complete(s.f[0], 1, IBV_WC_SUCCESS);
    }
    F.poll_cqs = 0;
    struct pf_net_cqe c[8];
    assert_int_equal(pf_net_poll(s.q[0], c, 8, 0), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(c[i].wr_id, 100 + i);
    assert_int_equal(F.poll_cqs, 1); /* one ibv_poll_cq drained both QPs' completions */
    assert_int_equal(pf_net_poll(s.q[2], c, 8, 0), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(c[i].wr_id, 200 + i);
    assert_int_equal(F.poll_cqs, 1); /* q2's were already routed to it */
    assert_int_equal(pf_net_poll(s.q[0], c, 8, 0), 0);
    assert_int_equal(pf_net_poll(s.q[2], c, 8, 0), 0);
    qset_close(&s);
}

/* An error completion and the flushes of one QP stay with it; the QP beside it on the CQ
 * keeps working (rail failover invalidates only the failed QP). */
static void test_shared_cq_error_isolated(void **st)
{
    (void)st;
    struct qset s;
    qset_open(&s, "mlx5_0", 4);
    struct pf_net_sge g = {s.buf, 64, s.mr->lkey};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pf_net_post_read(s.q[0], &g, 1, 0x1000, 1, 10 + (uint64_t)i), 0);
        assert_int_equal(pf_net_post_read(s.q[2], &g, 1, 0x1000, 1, 20 + (uint64_t)i), 0);
    }
    fake_complete(s.f[2], 1, IBV_WC_RETRY_EXC_ERR); /* q2's rail died */
    fake_complete(s.f[0], 1, IBV_WC_SUCCESS);
    struct pf_net_cqe c[8];
    /* q0's poll drains the CQ: it gets its own success, not q2's error */
    assert_int_equal(pf_net_poll(s.q[0], c, 8, 0), 1);
    assert_int_equal(c[0].wr_id, 10);
    assert_int_equal(c[0].status, 0);
    assert_int_equal(pf_net_post_read(s.q[0], &g, 1, 0x1000, 1, 14), 0); /* q0 still RTS */
    assert_int_equal(pf_net_post_read(s.q[2], &g, 1, 0x1000, 1, 99), -ENOTCONN);
    /* failover invalidates q2: its flushes are routed to q2 while q0's READs are untouched */
    pf_net_qp_invalidate(s.q[2]);
    assert_int_equal(s.f[0]->state, IBV_QPS_RTS);
    assert_int_equal(pf_net_poll(s.q[0], c, 8, 0), 0);
    assert_int_equal(pf_net_poll(s.q[2], c, 8, 0), 4);
    assert_int_equal(c[0].wr_id, 20);
    assert_int_equal(c[0].status, -ETIMEDOUT);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(c[i].wr_id, 20 + i);
        assert_int_equal(c[i].status, -ECANCELED);
    }
    assert_int_equal(pf_net_poll(s.q[2], c, 8, 0), -ENOTCONN);
    /* q0's remaining READs complete normally, and only to q0 */
    fake_complete(s.f[0], 4, IBV_WC_SUCCESS);
    assert_int_equal(pf_net_poll(s.q[2], c, 8, 0), -ENOTCONN);
    assert_int_equal(pf_net_poll(s.q[0], c, 8, 0), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(c[i].wr_id, 11 + i);
        assert_int_equal(c[i].status, 0);
    }
    qset_close(&s);
}

/* Several threads, each posting chains to and polling its own QP (blocking polls that sleep
 * on the shared channel), while another thread completes READs of all of them in a random
 * interleaving: every thread gets exactly its own completions, in post order. A lost
 * wake-up would leave a poll returning 0 at its 30 s timeout. */
#define CONC_QPS   4
#define CONC_READS 480
struct worker {
    struct qset *s;
    int qi;
    int rc;
    int got;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct pf_net_qp *q = w->s->q[w->qi];
    struct pf_net_sge g = {w->s->buf + 4096 * w->qi, 64 + (uint64_t)w->qi, w->s->mr->lkey};
    uint64_t base = (uint64_t)w->qi << 32;
    int posted = 0;
    while (w->got < CONC_READS) {
        struct pf_net_read rd[16];
        int m = 0;
        while (m < 16 && posted + m < CONC_READS && posted + m - w->got < 64) {
            rd[m] = (struct pf_net_read){&g, 1, 0x2000, 3, base + (uint64_t)(posted + m), NULL};
            m++;
        }
        if (m > 0) {
            size_t k = 0;
            int rc = pf_net_post_reads(q, rd, (size_t)m, &k);
            if (rc && rc != -EAGAIN) {
                w->rc = rc;
                return NULL;
            }
            posted += (int)k;
        }
        struct pf_net_cqe c[32];
        int n = pf_net_poll(q, c, 32, 30000);
        if (n <= 0) {
            w->rc = n == 0 ? -ETIMEDOUT : n;
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            if (c[i].wr_id != base + (uint64_t)w->got || c[i].status != 0 ||
                c[i].bytes != 64 + (uint64_t)w->qi) {
                w->rc = -EPROTO;
                return NULL;
            }
            w->got++;
        }
    }
    return NULL;
}

static void test_shared_cq_concurrent(void **st)
{
    (void)st;
    struct qset s;
    qset_open(&s, "mlx5_0", 2 * CONC_QPS); /* even QPs post; odd ones are their peers */
    assert_int_equal(F.cq_live, 1);
    struct qset view = s; /* the completer completes the posting QPs */
    view.nq = CONC_QPS;
    for (int i = 0; i < CONC_QPS; i++)
        view.f[i] = s.f[2 * i];
    struct completer c = {.s = &view, .seed = 11};
    struct worker w[CONC_QPS];
    pthread_t tw[CONC_QPS], tc;
    assert_int_equal(pthread_create(&tc, NULL, completer_main, &c), 0);
    for (int i = 0; i < CONC_QPS; i++) {
        w[i] = (struct worker){.s = &s, .qi = 2 * i};
        assert_int_equal(pthread_create(&tw[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < CONC_QPS; i++)
        pthread_join(tw[i], NULL);
    atomic_store(&c.stop, true);
    pthread_join(tc, NULL);
    for (int i = 0; i < CONC_QPS; i++) {
        assert_int_equal(w[i].rc, 0);
        assert_int_equal(w[i].got, CONC_READS);
    }
    qset_close(&s);
}

/* QPs per CQ from max_cqe (ib0: 600 -> 4 QPs of 129 entries), a new CQ once one is full, on
 * the next completion vector; with every send queue full and nothing polled no CQ overruns
 * (fake_push fails the test on an overrun). */
static void test_cq_sizing(void **st)
{
    (void)st;
    struct qset s;
    qset_open(&s, "ib0", 10);
    assert_int_equal(F.cq_live, 3); /* 4 + 4 + 2 */
    for (int i = 0; i < 10; i++) {
        assert_ptr_equal(s.f[i]->cq, s.f[i / 4 * 4]->cq);
        assert_true(s.f[i]->cq->cq.cqe <= F.devs[1].attr.max_cqe);
        assert_int_equal(s.f[i]->cq->cq.cqe, 4 * PF_VERBS_QP_CQE);
    }
    assert_int_equal(s.f[0]->cq->vector, 0);
    assert_int_equal(s.f[4]->cq->vector, 1);
    assert_int_equal(s.f[8]->cq->vector, 2);
    /* the sum of the send-queue depths (and recv queues) of a CQ's QPs fits its entries */
    for (int i = 0; i < 10; i += 4) {
        int depth = 0;
        for (int j = i; j < i + 4 && j < 10; j++)
            depth += (int)(s.f[j]->init.cap.max_send_wr + s.f[j]->init.cap.max_recv_wr);
        assert_true(depth <= s.f[i]->cq->cq.cqe);
    }
    /* every send queue full, every READ completed, nothing polled: no overrun */
    struct pf_net_sge g = {s.buf, 64, s.mr->lkey};
    for (int i = 0; i < 10; i++) {
        int k = 0;
        while (pf_net_post_read(s.q[i], &g, 1, 0x1000, 1, (uint64_t)k) == 0)
            k++;
        assert_int_equal(k, PF_VERBS_SQ_DEPTH);
    }
    for (int i = 0; i < 10; i++)
        fake_complete(s.f[i], PF_VERBS_SQ_DEPTH, IBV_WC_SUCCESS);
    assert_int_equal(F.cq_max_seen, 4 * PF_VERBS_SQ_DEPTH);
    struct pf_net_cqe c[PF_VERBS_SQ_DEPTH];
    for (int i = 0; i < 10; i++)
        assert_int_equal(pf_net_poll(s.q[i], c, PF_VERBS_SQ_DEPTH, 0), PF_VERBS_SQ_DEPTH);
    /* a destroyed QP frees its slot: the next QP fills the CQ with room, no 4th CQ */
    pf_net_qp_destroy(s.q[1]);
    assert_int_equal(pf_net_qp_create(s.n, 0, &s.q[1]), 0);
    s.f[1] = F.qps[F.nqps - 1];
    assert_int_equal(F.cq_live, 3);
    /* a device whose max_cqe is below one QP's need: the CQ is refused by name */
    qset_close(&s);
    F.devs[1].attr.max_cqe = 100;
    struct pf_net_config cfg = {.nics = (const char *[]){"ib0"}, .nnics = 1};
    struct pf_net *n;
    assert_int_equal(pf_verbs_open_api(&fake_api, &cfg, &n), 0);
    struct pf_net_qp *q;
    assert_int_equal(pf_net_qp_create(n, 0, &q), -EINVAL);
    assert_int_equal(F.cq_live, 0);
    pf_net_close(n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_chain_one_post_send, fake_setup),
        cmocka_unit_test_setup(test_xfer_posts_chains, fake_setup),
        cmocka_unit_test_setup(test_shared_cq_routing, fake_setup),
        cmocka_unit_test_setup(test_shared_cq_error_isolated, fake_setup),
        cmocka_unit_test_setup(test_shared_cq_concurrent, fake_setup),
        cmocka_unit_test_setup(test_cq_sizing, fake_setup),
    };
    return FAKE_HCA_RUN(tests);
}

#endif

/* A scripted NET backend for the p2p unit tests (header-only). READs copy straight from the
 * remote address (the "remote" memory lives in the test process) when they are delivered;
 * the script can fail the N-th post, complete the N-th READ with an error, corrupt it, or
 * drop READs (never complete: only qp_invalidate flushes them, with -ECANCELED). The mock
 * keeps the HAL contract itself: at most 128 outstanding per QP (-EAGAIN), -ENOTCONN on a QP
 * that is not connected or was invalidated, and nothing written after qp_invalidate. It
 * can hand out at most poll_max completions per poll (so a test sees completions arrive one
 * by one while other work runs) and counts them (mn_wait_delivered). It
 * records every call, and calls on_invalidate (before flushing) so a test can check what
 * still exists at that moment (e.g. that the staging memory is still allocated). With
 * `digests` set it honours receive-path digest requests (post_read_digest) as the TCP fabric
 * does: xxh3 of each range of the bytes as they landed (after a scripted corruption). */
#ifndef PF_TEST_MOCK_NET_H
#define PF_TEST_MOCK_NET_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pf/clock.h"
#include "pf/hal_net.h"
#include "pf/util.h"

#define MN_DEPTH 128
#define MN_MAXQ  512

struct mn_wr {
    uint64_t wr_id;
    void *dst;
    const void *src;
    uint64_t len;
    int err;      /* completion status when delivered */
    bool dropped; /* never completes */
    bool corrupt;
    bool digested;
};

struct mnet;

struct mqp {
    struct pf_net_qp base;
    struct mnet *n;
    int id;
    int state; /* 0 init, 1 connected, 2 error */
    struct mn_wr out[MN_MAXQ];
    int nout; /* posted, not yet polled (completed or not) */
    struct pf_net_cqe cq[MN_MAXQ];
    int ncq;
    pthread_cond_t cv;
    bool destroyed;
    int nerr; /* READs failed on this QP (dead_nic) */
};

struct mnet {
    struct pf_net base;
    int nnics;
    int numa[4];
    pthread_mutex_t mu;
    /* script (1-based counters over all QPs; 0 = off) */
    int post_fail_nth, post_fail_err, post_fail_times;
    int complete_err_nth, complete_err;
    int corrupt_nth;
    bool digests;     /* honour post_read_digest */
    int digest_reads; /* READs whose digests were computed */
    int drop_from_nth;
    int drop_every; /* every k-th READ is dropped */
    int connect_err;
    int eagain_nth; /* the k-th post returns -EAGAIN (once) */
    /* NIC + 1 whose link is down (0 = none): a READ posted to one of its QPs never lands;
     * the QP's first one completes with -ETIMEDOUT (verbs: RETRY_EXC_ERR, retries exhausted)
     * and the rest are flushed (-ECANCELED), as an RC QP in error does */
    int dead_nic;
    int reg_fail_nic;     /* NIC + 1 whose reg_mem fails with -ENOMEM (0 = none) */
    bool reg_rendezvous;  /* reg_mem waits (2 s at most, else -ETIMEDOUT) until every NIC
                           * has a registration in progress: passes only when the caller
                           * registers on all NICs at once */
    unsigned reg_started; /* NICs whose registration began (bit per NIC) */
    pthread_cond_t reg_cv;
    int poll_max;   /* at most this many completions per poll (0 = as many as asked) */
    int hold_after; /* poll hands out no more than this many completions in all until
                     * mn_open_gate (0 = off); the READs themselves complete as usual */
    bool gate_open;
    /* records */
    int posts, reads, invalidates, creates, destroys, connects, regs, deregs, polls;
    int delivered; /* completions handed out by poll (dcv is signalled on each) */
    pthread_cond_t dcv;
    int live_qps;
    int max_out;
    int nics_used[4];
    bool wrote_after_invalidate;
    void (*on_invalidate)(void *ctx, struct mqp *q);
    void *ctx;
    int next_id;
    uint32_t next_key;
};

static inline struct mnet *mn_of(struct pf_net *n)
{
    return (struct mnet *)n;
}

static inline int mn_nic_count(struct pf_net *n)
{
    return mn_of(n)->nnics;
}

static inline int mn_nic_info(struct pf_net *n, int nic, struct pf_net_nic_info *i)
{
    memset(i, 0, sizeof(*i));
    snprintf(i->name, sizeof(i->name), "mock%d", nic);
    snprintf(i->addr, sizeof(i->addr), "10.0.0.%d", nic + 1);
    i->numa_node = mn_of(n)->numa[nic];
    i->active = true;
    return 0;
}

static inline int mn_reg(struct pf_net *n, int nic, void *addr, uint64_t len, unsigned access,
                         struct pf_net_mr **mr_p)
{
    struct mnet *m = mn_of(n);
    if (m->reg_fail_nic && nic == m->reg_fail_nic - 1)
        return -ENOMEM;
    if (m->reg_rendezvous) {
        struct timespec ts = pf_deadline_ms(2000);
        pthread_mutex_lock(&m->mu);
        m->reg_started |= 1u << nic;
        pthread_cond_broadcast(&m->reg_cv);
        int w = 0;
        while (m->reg_started != (1u << m->nnics) - 1 && w != ETIMEDOUT)
            w = pthread_cond_timedwait(&m->reg_cv, &m->mu, &ts);
        bool all = m->reg_started == (1u << m->nnics) - 1;
        pthread_mutex_unlock(&m->mu);
        if (!all)
            return -ETIMEDOUT;
    }
    struct pf_net_mr *mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    pthread_mutex_lock(&m->mu);
    *mr = (struct pf_net_mr){n, nic, addr, len, ++m->next_key, 0x1000 + m->next_key};
    m->regs++;
    pthread_mutex_unlock(&m->mu);
    *mr_p = mr;
    return 0;
}

static inline void mn_dereg(struct pf_net_mr *mr)
{
    struct mnet *m = mn_of(mr->net);
    pthread_mutex_lock(&m->mu);
    m->deregs++;
    pthread_mutex_unlock(&m->mu);
    free(mr);
}

static inline int mn_qp_create(struct pf_net *n, int nic, struct pf_net_qp **qp_p)
{
    struct mnet *m = mn_of(n);
    struct mqp *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    q->base = (struct pf_net_qp){n, nic};
    q->n = m;
    pf_cond_init(&q->cv);
    pthread_mutex_lock(&m->mu);
    q->id = ++m->next_id;
    m->creates++;
    m->live_qps++;
    pthread_mutex_unlock(&m->mu);
    *qp_p = &q->base;
    return 0;
}

static inline int mn_ep(struct pf_net_qp *qp, void *buf, size_t cap, size_t *len_p)
{
    struct mqp *q = (struct mqp *)qp;
    if (cap < 8)
        return -ENOSPC;
    memset(buf, 0, 8);
    memcpy(buf, "MQP", 3);
    memcpy((char *)buf + 4, &q->id, 4);
    *len_p = 8;
    return 0;
}

static inline int mn_connect(struct pf_net_qp *qp, const void *ep, size_t len)
{
    struct mqp *q = (struct mqp *)qp;
    struct mnet *m = q->n;
    pthread_mutex_lock(&m->mu);
    m->connects++;
    int rc = m->connect_err;
    if (len != 8 || memcmp(ep, "MQP", 3) != 0)
        rc = -EINVAL;
    if (rc == 0 && q->state == 0)
        q->state = 1;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* ep_check (hal_net.h): an endpoint whose 4th byte is 'F' stands for a verbs peer that chose
 * another GID family (hw/verbs pf_verbs_ep_check), refused by name before any connect. */
static inline int mn_ep_check(struct pf_net_qp *qp, const void *ep, size_t len, char *why,
                              size_t whylen)
{
    (void)qp;
    if (len == 8 && ((const uint8_t *)ep)[3] == 'F') {
        snprintf(why, whylen, "GID family mismatch: peer GID is IPv6 RoCE v2, ours IPv4 RoCE v2");
        return -EPROTO;
    }
    return 0;
}

static inline int mn_post_common(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                                 uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                                 const struct pf_net_digest *d)
{
    struct mqp *q = (struct mqp *)qp;
    struct mnet *m = q->n;
    if (nsge != 1 || !sge[0].addr || !sge[0].len)
        return -EINVAL;
    pthread_mutex_lock(&m->mu);
    int k = ++m->posts;
    int rc = 0;
    if (m->post_fail_nth && k >= m->post_fail_nth && m->post_fail_times > 0) {
        m->post_fail_times--;
        rc = m->post_fail_err;
    } else if (m->eagain_nth && k == m->eagain_nth) {
        rc = -EAGAIN;
    } else if (q->state != 1) {
        rc = -ENOTCONN;
    } else if (q->nout >= MN_DEPTH) {
        rc = -EAGAIN;
    }
    if (rc) {
        pthread_mutex_unlock(&m->mu);
        return rc;
    }
    int r = ++m->reads;
    struct mn_wr *w = &q->out[q->nout++];
    *w = (struct mn_wr){wr_id, sge[0].addr, (const void *)(uintptr_t)raddr, sge[0].len, 0, false,
                        false, false};
    if (m->complete_err_nth && r == m->complete_err_nth)
        w->err = m->complete_err;
    if (m->dead_nic && qp->nic == m->dead_nic - 1)
        w->err = q->nerr++ == 0 ? -ETIMEDOUT : -ECANCELED;
    if (m->corrupt_nth && r == m->corrupt_nth)
        w->corrupt = true;
    if ((m->drop_from_nth && r >= m->drop_from_nth) || (m->drop_every && r % m->drop_every == 0))
        w->dropped = true;
    if (q->nout > m->max_out)
        m->max_out = q->nout;
    m->nics_used[qp->nic & 3]++;
    /* delivered READs land now and complete in posting order */
    if (!w->dropped) {
        if (!w->err) {
            memcpy(w->dst, w->src, w->len);
            if (w->corrupt)
                ((uint8_t *)w->dst)[w->len / 2] ^= 0x5a;
            if (d && m->digests) {
                uint64_t off = 0;
                for (uint32_t j = 0; j < d->n; j++) {
                    uint64_t l = d->lens[j] & ~PF_NET_DIGEST_SKIP;
                    if (!(d->lens[j] & PF_NET_DIGEST_SKIP))
                        d->out[j] = pf_checksum2((const uint8_t *)w->dst + off, l, NULL, 0);
                    off += l;
                }
                w->digested = true;
                m->digest_reads++;
            }
        }
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&m->mu);
    (void)rkey;
    return 0;
}

static inline int mn_post(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                          uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    return mn_post_common(qp, sge, nsge, raddr, rkey, wr_id, NULL);
}

static inline int mn_post_digest(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                                 uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                                 const struct pf_net_digest *d)
{
    /* the TCP fabric's rules (sim/net/tcpnet_qp.c post_read): ranges of at least a byte,
     * together within the READ, results somewhere to go */
    uint64_t sum = 0;
    if (!d || d->n == 0 || !d->lens || !d->out || nsge != 1)
        return -EINVAL;
    for (uint32_t k = 0; k < d->n; k++) {
        uint64_t l = d->lens[k] & ~PF_NET_DIGEST_SKIP;
        if (l == 0 || (sum += l) > sge[0].len)
            return -EINVAL;
    }
    return mn_post_common(qp, sge, nsge, raddr, rkey, wr_id, d);
}

/* Moves completed WRs (in order, stopping at the first dropped one) to the CQ. */
static inline void mn_reap_locked(struct mqp *q)
{
    int i = 0;
    while (i < q->nout && !q->out[i].dropped && q->ncq < MN_MAXQ) {
        struct mn_wr *w = &q->out[i];
        q->cq[q->ncq++] =
            (struct pf_net_cqe){w->wr_id, w->err, w->err ? 0 : w->len, w->digested && !w->err};
        i++;
    }
    memmove(q->out, q->out + i, (size_t)(q->nout - i) * sizeof(q->out[0]));
    q->nout -= i;
}

static inline int mn_poll(struct pf_net_qp *qp, struct pf_net_cqe *out, size_t max,
                          uint64_t timeout_ms)
{
    struct mqp *q = (struct mqp *)qp;
    struct mnet *m = q->n;
    struct timespec ts = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&m->mu);
    m->polls++;
    for (;;) {
        if (q->state != 2)
            mn_reap_locked(q);
        if (q->ncq && (!m->hold_after || m->gate_open || m->delivered < m->hold_after))
            break;
        if (q->state == 2 && q->nout == 0) {
            pthread_mutex_unlock(&m->mu);
            return -ENOTCONN;
        }
        if (timeout_ms == 0 || pthread_cond_timedwait(&q->cv, &m->mu, &ts) == ETIMEDOUT) {
            if (q->state != 2)
                mn_reap_locked(q);
            break;
        }
    }
    size_t n = 0;
    if (m->poll_max && max > (size_t)m->poll_max)
        max = (size_t)m->poll_max;
    if (m->hold_after && !m->gate_open)
        max = m->delivered < m->hold_after && max > (size_t)(m->hold_after - m->delivered)
                  ? (size_t)(m->hold_after - m->delivered)
              : m->delivered < m->hold_after ? max
                                             : 0;
    while (n < max && (int)n < q->ncq) {
        out[n] = q->cq[n];
        n++;
    }
    memmove(q->cq, q->cq + n, (size_t)(q->ncq - (int)n) * sizeof(q->cq[0]));
    q->ncq -= (int)n;
    m->delivered += (int)n;
    if (n)
        pthread_cond_broadcast(&m->dcv);
    pthread_mutex_unlock(&m->mu);
    return (int)n;
}

static inline void mn_invalidate(struct pf_net_qp *qp)
{
    struct mqp *q = (struct mqp *)qp;
    struct mnet *m = q->n;
    if (m->on_invalidate)
        m->on_invalidate(m->ctx, q);
    pthread_mutex_lock(&m->mu);
    m->invalidates++;
    if (q->state != 2) {
        mn_reap_locked(q); /* finished READs keep their success */
        for (int i = 0; i < q->nout && q->ncq < MN_MAXQ; i++)
            q->cq[q->ncq++] = (struct pf_net_cqe){q->out[i].wr_id, -ECANCELED, 0, 0};
        q->nout = 0;
        q->state = 2;
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&m->mu);
}

static inline void mn_qp_destroy(struct pf_net_qp *qp)
{
    struct mqp *q = (struct mqp *)qp;
    struct mnet *m = q->n;
    mn_invalidate(qp);
    pthread_mutex_lock(&m->mu);
    m->destroys++;
    m->live_qps--;
    pthread_mutex_unlock(&m->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

static inline void mn_close(struct pf_net *n)
{
    (void)n;
}

static const struct pf_net_ops mn_ops = {
    .name = "mock",
    .nic_count = mn_nic_count,
    .nic_info = mn_nic_info,
    .reg_mem = mn_reg,
    .dereg_mem = mn_dereg,
    .qp_create = mn_qp_create,
    .qp_local_endpoint = mn_ep,
    .qp_connect = mn_connect,
    .ep_check = mn_ep_check,
    .post_read = mn_post,
    .post_read_digest = mn_post_digest,
    .poll = mn_poll,
    .qp_invalidate = mn_invalidate,
    .qp_destroy = mn_qp_destroy,
    .close = mn_close,
};

/* Waits until poll handed out at least n completions or timeout_ms passed: true if so. */
static inline bool mn_wait_delivered(struct mnet *m, int n, uint64_t timeout_ms)
{
    struct timespec ts = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&m->mu);
    while (m->delivered < n && pthread_cond_timedwait(&m->dcv, &m->mu, &ts) != ETIMEDOUT)
        ;
    bool ok = m->delivered >= n;
    pthread_mutex_unlock(&m->mu);
    return ok;
}

/* Lets poll hand out the completions held back by hold_after (pollers waiting in poll see
 * them at their next wake-up, bounded by their timeout). */
static inline void mn_open_gate(struct mnet *m)
{
    pthread_mutex_lock(&m->mu);
    m->gate_open = true;
    pthread_mutex_unlock(&m->mu);
}

/* Number of posts so far (readable while other threads post). */
static inline int mn_posts(struct mnet *m)
{
    pthread_mutex_lock(&m->mu);
    int n = m->posts;
    pthread_mutex_unlock(&m->mu);
    return n;
}

static inline void mn_init(struct mnet *m, int nnics)
{
    memset(m, 0, sizeof(*m));
    m->base.ops = &mn_ops;
    m->nnics = nnics;
    for (int i = 0; i < 4; i++)
        m->numa[i] = -1;
    pthread_mutex_init(&m->mu, NULL);
    pf_cond_init(&m->reg_cv);
    pf_cond_init(&m->dcv);
}

#endif

/* verbs NET backend, shared completion queues (design: the header comment of verbs.c).
 *
 * The QPs of a NIC share CQs: a CQ serves up to nic->cq_qps QPs and has PF_VERBS_QP_CQE
 * entries per QP it may serve, so even with every QP's send queue full and nothing polled the
 * CQ cannot overrun (ibv_create_cq(3): an overrun CQ raises IBV_EVENT_CQ_ERR and its
 * completions are lost). A poll of any of its QPs drains it (one ibv_poll_cq for the
 * completions of all of them) into the QPs' software queues by wc.qp_num (ibv_poll_cq(3): a
 * work completion names its local QP), so each QP's poll returns only its own completions,
 * error and flush completions included; an unknown qp_num is dropped with a warning.
 *
 * Sleeping: one completion channel per CQ. A poller arms the CQ (once per event), marks its
 * QP waiting and sleeps on the channel and its QP's eventfd. A drain that queues a completion
 * for a waiting QP writes that QP's eventfd; whoever takes the channel event wakes the other
 * waiting QPs of the CQ, so the CQ is re-armed by one of them and no sleeper is left on an
 * unarmed CQ. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PF_LOG_MOD "verbs"
#include "pf/log.h"

#include "verbs_internal.h"

static void verbs_cq_free(struct verbscq *cq)
{
    const struct pf_verbs_api *api = cq->nic->net->api;
    if (cq->cq) {
        int rc = verbs_rc(api->destroy_cq(cq->cq));
        if (rc)
            pf_error("verbs %s: ibv_destroy_cq: %s", cq->nic->name, strerror(-rc));
    }
    if (cq->ch)
        api->destroy_comp_channel(cq->ch);
    pthread_mutex_destroy(&cq->mu);
    free(cq);
}

static int verbs_cq_new(struct verbsnic *nic, struct verbscq **cq_p)
{
    const struct pf_verbs_api *api = nic->net->api;
    struct verbscq *cq = calloc(1, sizeof(*cq));
    if (!cq)
        return -ENOMEM;
    cq->nic = nic;
    cq->cap = nic->cq_qps;
    cq->entries = cq->cap * PF_VERBS_QP_CQE;
    pthread_mutex_init(&cq->mu, NULL);
    int rc;
    errno = 0;
    cq->ch = api->create_comp_channel(nic->ctx);
    if (!cq->ch) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: create completion channel: %s", nic->name, strerror(-rc));
        goto err;
    }
    int fl = fcntl(cq->ch->fd, F_GETFL);
    if (fl < 0 || fcntl(cq->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        rc = -errno;
        goto err;
    }
    int nvec = nic->ctx->num_comp_vectors;
    int vec = nvec > 0 ? (int)(nic->cqs_made % (unsigned)nvec) : 0;
    errno = 0;
    cq->cq = api->create_cq(nic->ctx, cq->entries, cq, cq->ch, vec);
    if (!cq->cq) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: create CQ of %d entries (max_cqe %d): %s", nic->name, cq->entries,
                 nic->max_cqe, strerror(-rc));
        goto err;
    }
    nic->cqs_made++;
    pf_debug("verbs %s: CQ of %d entries for up to %d QPs, vector %d", nic->name, cq->entries,
             cq->cap, vec);
    *cq_p = cq;
    return 0;
err:
    verbs_cq_free(cq);
    return rc;
}

int pf_verbs_cq_get(struct verbsnic *nic, struct verbscq **cq_p)
{
    pthread_mutex_lock(&nic->cq_mu);
    struct verbscq *cq = nic->cqs;
    while (cq && cq->nres >= cq->cap)
        cq = cq->next;
    int rc = 0;
    if (!cq) {
        rc = verbs_cq_new(nic, &cq);
        if (rc == 0) {
            cq->next = nic->cqs;
            nic->cqs = cq;
        }
    }
    if (rc == 0) {
        cq->nres++;
        *cq_p = cq;
    }
    pthread_mutex_unlock(&nic->cq_mu);
    return rc;
}

void pf_verbs_cq_put(struct verbscq *cq)
{
    struct verbsnic *nic = cq->nic;
    pthread_mutex_lock(&nic->cq_mu);
    bool last = --cq->nres == 0;
    if (last) {
        struct verbscq **pp = &nic->cqs;
        while (*pp != cq)
            pp = &(*pp)->next;
        *pp = cq->next;
    }
    pthread_mutex_unlock(&nic->cq_mu);
    if (last)
        verbs_cq_free(cq);
}

void pf_verbs_cq_attach(struct verbscq *cq, struct verbsqp *q)
{
    pthread_mutex_lock(&cq->mu);
    cq->qps[cq->nqps++] = q; /* nqps <= nres <= cap */
    pthread_mutex_unlock(&cq->mu);
}

void pf_verbs_cq_detach(struct verbscq *cq, struct verbsqp *q)
{
    pthread_mutex_lock(&cq->mu);
    for (int i = 0; i < cq->nqps; i++)
        if (cq->qps[i] == q) {
            cq->qps[i] = cq->qps[--cq->nqps];
            break;
        }
    pthread_mutex_unlock(&cq->mu);
}

struct pf_net_cqe pf_verbs_take(struct verbsqp *q, const struct ibv_wc *wc)
{
    struct pf_net_cqe c = {.wr_id = wc->wr_id, .status = pf_verbs_wc_errno(wc->status)};
    uint32_t k = 0;
    while (k < q->out_count && q->out[(q->out_head + k) % PF_VERBS_SQ_DEPTH].wr_id != wc->wr_id)
        k++;
    if (k < q->out_count) {
        uint32_t at = (q->out_head + k) % PF_VERBS_SQ_DEPTH;
        if (c.status == 0)
            c.bytes = q->out[at].len;
        /* RC completes in order: k is 0 unless wr_ids repeat; keep the ring compact */
        for (uint32_t j = k; j > 0; j--)
            q->out[(q->out_head + j) % PF_VERBS_SQ_DEPTH] =
                q->out[(q->out_head + j - 1) % PF_VERBS_SQ_DEPTH];
        q->out_head = (q->out_head + 1) % PF_VERBS_SQ_DEPTH;
        q->out_count--;
    }
    if (c.status && c.status != -ECANCELED && q->state != VQ_ERR) {
        pf_log_ratelimited(
            PF_LOG_WARN, 1000, "verbs %s: QP 0x%x READ failed: %s (%s): QP in error state",
            q->nic->name, q->qpn, ibv_wc_status_str(wc->status), strerror(-c.status));
        q->state = VQ_ERR;
    }
    return c;
}

/* Queues one completion for its QP. Caller holds cq->mu. */
static void verbs_route(struct verbscq *cq, const struct ibv_wc *wc)
{
    struct verbsqp *t = NULL;
    for (int i = 0; i < cq->nqps && !t; i++)
        if (cq->qps[i]->qpn == wc->qp_num)
            t = cq->qps[i];
    if (!t) {
        pf_log_ratelimited(PF_LOG_WARN, 1000,
                           "verbs %s: completion (wr_id %llu, %s) for QP 0x%x, not on this CQ: "
                           "dropped",
                           cq->nic->name, (unsigned long long)wc->wr_id,
                           ibv_wc_status_str(wc->status), wc->qp_num);
        return;
    }
    pthread_mutex_lock(&t->mu);
    bool wake = false;
    if (!t->qp) {
        /* destroyed by an invalidate whose flushes never came: its WRs were reported */
    } else if (t->sw_count >= PF_VERBS_SQ_DEPTH) {
        /* cannot happen: a QP has at most PF_VERBS_SQ_DEPTH WRs posted or unpolled */
        pf_error("verbs %s: QP 0x%x: completion queue of the QP full: wr_id %llu dropped",
                 cq->nic->name, t->qpn, (unsigned long long)wc->wr_id);
    } else {
        t->sw[(t->sw_head + t->sw_count) % PF_VERBS_SQ_DEPTH] = pf_verbs_take(t, wc);
        t->sw_count++;
        wake = t->waiting;
        t->waiting = false; /* one wake-up per sleep */
    }
    pthread_mutex_unlock(&t->mu);
    uint64_t one = 1;
    if (wake && write(t->evfd, &one, sizeof(one)) < 0)
        pf_debug("verbs %s: waking poller: %s", cq->nic->name, strerror(errno));
}

int pf_verbs_cq_drain(struct verbscq *cq)
{
    const struct pf_verbs_api *api = cq->nic->net->api;
    struct ibv_wc wc[32];
    int rc = 0;
    pthread_mutex_lock(&cq->mu);
    /* bounded: the CQ holds at most entries completions */
    for (int got = 0; got <= cq->entries;) {
        int n = api->poll_cq(cq->cq, 32, wc);
        if (n < 0) {
            rc = -EIO;
            break;
        }
        for (int i = 0; i < n; i++)
            verbs_route(cq, &wc[i]);
        got += n;
        if (n < 32)
            break;
    }
    pthread_mutex_unlock(&cq->mu);
    return rc;
}

int pf_verbs_cq_arm(struct verbscq *cq)
{
    pthread_mutex_lock(&cq->mu);
    int rc = 0;
    if (!cq->armed) {
        rc = verbs_rc(cq->nic->net->api->req_notify_cq(cq->cq, 0));
        if (rc == 0) {
            cq->armed = true;
            rc = 1;
        }
    }
    pthread_mutex_unlock(&cq->mu);
    return rc;
}

void pf_verbs_cq_event(struct verbscq *cq, struct verbsqp *self)
{
    const struct pf_verbs_api *api = cq->nic->net->api;
    struct ibv_cq *ecq;
    void *ectx;
    pthread_mutex_lock(&cq->mu);
    if (api->get_cq_event(cq->ch, &ecq, &ectx) == 0) {
        api->ack_cq_events(ecq, 1);
        cq->armed = false;
        /* the others sleeping on this CQ would stay asleep on an unarmed CQ */
        for (int i = 0; i < cq->nqps; i++) {
            struct verbsqp *t = cq->qps[i];
            if (t == self)
                continue;
            pthread_mutex_lock(&t->mu);
            bool wake = t->waiting;
            t->waiting = false;
            pthread_mutex_unlock(&t->mu);
            uint64_t one = 1;
            if (wake && write(t->evfd, &one, sizeof(one)) < 0)
                pf_debug("verbs %s: waking poller: %s", cq->nic->name, strerror(errno));
        }
    }
    pthread_mutex_unlock(&cq->mu);
}

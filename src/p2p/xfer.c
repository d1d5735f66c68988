/* The READ engine of one fetch. The fetching thread drives its QPs itself (it holds them
 * exclusively, see conn.c): READs are queued per NIC and pulled by whichever QP of that NIC
 * has room (at most `depth` outstanding per QP, the HAL's send-queue bound), completions are
 * drained without waiting, and when a round made no progress the thread sleeps in poll on
 * the busiest QP (1 ms when several QPs are busy, so none is left unpolled for long; up to
 * 100 ms with one). No busy-polling; the NET backend's own threads move the bytes.
 *
 * Any failure (deadline, error completion, post error, unexpected completion) invalidates
 * every QP of the set before returning: qp_invalidate returns only when no completion can
 * write local memory, so the caller may free the staging buffers right after (the reference
 * frees them while timed-out READs can still land: its #403). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/clock.h"
#include "pf/log.h"

#define CQE_BATCH 64

struct xstate {
    struct p2p_xfer *x;
    const struct p2p_read *reads;
    size_t n;
    unsigned *out;   /* outstanding per QP */
    uint32_t *owner; /* QP a READ was posted to (+1), 0 = not posted */
    uint8_t *done;
    size_t *order;  /* READ indices grouped by NIC */
    size_t *cursor; /* per NIC: next position in order */
    size_t *end;    /* per NIC: end position in order */
    int nnics;
};

static int handle(struct xstate *s, size_t q, const struct pf_net_cqe *c, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t r = c[i].wr_id;
        if (r >= s->n || s->owner[r] != q + 1 || s->done[r]) {
            pf_warn("READ completion for wr_id %llu that QP %zu did not post",
                    (unsigned long long)r, q);
            return -EPROTO;
        }
        /* -ETIMEDOUT from the NIC is its transport giving up on the peer (verbs: retries
         * exhausted, as when the holder died); it must not read as our own deadline */
        if (c[i].status == -ETIMEDOUT)
            return -EHOSTUNREACH;
        if (c[i].status)
            return c[i].status < 0 ? c[i].status : -EIO;
        if (c[i].bytes != s->reads[r].len) {
            pf_warn("READ %llu completed with %llu of %llu bytes", (unsigned long long)r,
                    (unsigned long long)c[i].bytes, (unsigned long long)s->reads[r].len);
            return -EIO;
        }
        s->done[r] = 1;
        s->out[q]--;
        s->x->completed++;
        s->x->bytes += s->reads[r].len;
        if (s->x->on_read)
            s->x->on_read(s->x->ctx, r);
    }
    return 0;
}

static int post_some(struct xstate *s, size_t q, bool *progress)
{
    struct p2p_xfer *x = s->x;
    int nic = x->qps[q]->nic;
    while (s->out[q] < x->depth && s->cursor[nic] < s->end[nic]) {
        size_t r = s->order[s->cursor[nic]];
        const struct p2p_read *rd = &s->reads[r];
        struct pf_net_sge sge = {.addr = rd->local, .len = rd->len, .lkey = rd->lkey};
        int rc = pf_net_post_read(x->qps[q], &sge, 1, rd->raddr, rd->rkey, r);
        if (rc == -EAGAIN)
            break;
        if (rc)
            return rc;
        s->owner[r] = (uint32_t)q + 1;
        s->out[q]++;
        s->cursor[nic]++;
        x->posted++;
        *progress = true;
    }
    return 0;
}

static int run(struct xstate *s)
{
    struct p2p_xfer *x = s->x;
    struct pf_net_cqe cqe[CQE_BATCH];
    while (x->completed < s->n) {
        uint64_t now = pf_now_ns();
        if (now >= x->deadline_ns)
            return -ETIMEDOUT;
        if (x->abort && atomic_load(x->abort))
            return -ECANCELED;
        bool progress = false;
        for (size_t k = 0; k < x->nqps; k++) {
            size_t q = (k + x->rotate) % x->nqps;
            int rc = post_some(s, q, &progress);
            if (rc)
                return rc;
        }
        size_t busy = 0, busiest = 0;
        for (size_t q = 0; q < x->nqps; q++) {
            if (!s->out[q])
                continue;
            int n = pf_net_poll(x->qps[q], cqe, CQE_BATCH, 0);
            if (n < 0)
                return n;
            int rc = handle(s, q, cqe, n);
            if (rc)
                return rc;
            if (n > 0)
                progress = true;
            if (s->out[q]) {
                if (busy == 0 || s->out[q] > s->out[busiest])
                    busiest = q;
                busy++;
            }
        }
        if (progress || busy == 0)
            continue;
        uint64_t left_ms = (x->deadline_ns - now + PF_NS_PER_MS - 1) / PF_NS_PER_MS;
        uint64_t wait = busy > 1 ? 1 : 100;
        int n = pf_net_poll(x->qps[busiest], cqe, CQE_BATCH, wait < left_ms ? wait : left_ms);
        if (n < 0)
            return n;
        int rc = handle(s, busiest, cqe, n);
        if (rc)
            return rc;
    }
    return 0;
}

int p2p_xfer_run(struct p2p_xfer *x, const struct p2p_read *reads, size_t n)
{
    x->posted = x->completed = 0;
    x->bytes = 0;
    if (n == 0)
        return 0;
    if (x->nqps == 0 || x->depth == 0)
        return -EINVAL;
    struct xstate s = {.x = x, .reads = reads, .n = n};
    for (size_t q = 0; q < x->nqps; q++)
        if (x->qps[q]->nic + 1 > s.nnics)
            s.nnics = x->qps[q]->nic + 1;
    int rc = -ENOMEM;
    s.out = calloc(x->nqps, sizeof(*s.out));
    s.owner = calloc(n, sizeof(*s.owner));
    s.done = calloc(n, 1);
    s.order = malloc(n * sizeof(*s.order));
    s.cursor = calloc((size_t)s.nnics, sizeof(*s.cursor));
    s.end = calloc((size_t)s.nnics, sizeof(*s.end));
    if (!s.out || !s.owner || !s.done || !s.order || !s.cursor || !s.end)
        goto out;
    /* group READ indices by NIC (counting sort); every NIC needs a QP */
    for (size_t i = 0; i < n; i++) {
        if (reads[i].nic < 0 || reads[i].nic >= s.nnics) {
            rc = -EINVAL;
            goto out;
        }
        s.end[reads[i].nic]++;
    }
    for (int k = 0; k < s.nnics; k++) {
        bool has = s.end[k] == 0;
        for (size_t q = 0; q < x->nqps && !has; q++)
            has = x->qps[q]->nic == k;
        if (!has) {
            rc = -EINVAL;
            goto out;
        }
    }
    size_t acc = 0;
    for (int k = 0; k < s.nnics; k++) {
        size_t c = s.end[k];
        s.cursor[k] = s.end[k] = acc;
        acc += c;
    }
    for (size_t i = 0; i < n; i++)
        s.order[s.end[reads[i].nic]++] = i;
    rc = run(&s);
    if (rc) {
        /* nothing may land in the caller's buffers once we return */
        for (size_t q = 0; q < x->nqps; q++)
            pf_net_qp_invalidate(x->qps[q]);
    }
out:
    free(s.out);
    free(s.owner);
    free(s.done);
    free(s.order);
    free(s.cursor);
    free(s.end);
    return rc;
}

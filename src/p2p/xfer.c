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

#define CQE_BATCH  64
#define POST_CHAIN 16 /* READs per pf_net_post_reads */

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
    uint8_t *dead;  /* per QP: failed, left out (x->reroute) */
    unsigned rr;    /* failover round-robin */
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
            s->x->on_read(s->x->ctx, r, c[i].digested != 0);
    }
    return 0;
}

/* Queues the READs that are neither done nor outstanding by NIC (counting sort into order). */
static void requeue(struct xstate *s)
{
    for (int k = 0; k < s->nnics; k++)
        s->end[k] = 0;
    for (size_t i = 0; i < s->n; i++)
        if (!s->done[i] && !s->owner[i])
            s->end[s->reads[i].nic]++;
    size_t acc = 0;
    for (int k = 0; k < s->nnics; k++) {
        size_t c = s->end[k];
        s->cursor[k] = s->end[k] = acc;
        acc += c;
    }
    for (size_t i = 0; i < s->n; i++)
        if (!s->done[i] && !s->owner[i])
            s->order[s->end[s->reads[i].nic]++] = i;
}

/* Errors of one QP or its rail (the link, the peer's QP), which the other rails survive. A
 * remote access error (-EREMOTEIO: keys or bounds the holder refuses) would fail the same
 * way anywhere. */
static bool rail_error(int rc)
{
    return rc == -EHOSTUNREACH || rc == -EIO || rc == -ECANCELED || rc == -ENOTCONN ||
           rc == -ECONNRESET || rc == -ENETDOWN || rc == -EPIPE;
}

/* QP q failed with rc. With reroute: q is invalidated (none of its READs can land any more),
 * left out, and its unfinished READs and those of a NIC without a QP now go to the NICs that
 * still have one; 0 then. rc when there is no failover, nothing is left or a READ cannot
 * move. */
static int qp_failed(struct xstate *s, size_t q, int rc)
{
    struct p2p_xfer *x = s->x;
    if (!x->reroute || !rail_error(rc) || q >= 64 || s->nnics > 64 || s->dead[q])
        return rc;
    pf_net_qp_invalidate(x->qps[q]);
    s->dead[q] = 1;
    x->failed |= 1ull << q;
    s->out[q] = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->owner[i] == q + 1 && !s->done[i])
            s->owner[i] = 0;
    int cand[64], nc = 0;
    bool live[64] = {false};
    for (size_t k = 0; k < x->nqps; k++)
        if (!s->dead[k] && x->qps[k]->nic < 64)
            live[x->qps[k]->nic] = true;
    for (int k = 0; k < s->nnics && k < 64; k++)
        if (live[k])
            cand[nc++] = k;
    if (nc == 0)
        return rc;
    for (size_t i = 0; i < s->n; i++) {
        if (s->done[i] || s->owner[i] || live[s->reads[i].nic])
            continue;
        int nic = cand[s->rr++ % (unsigned)nc];
        if (x->reroute(x->ctx, i, nic) != 0 || s->reads[i].nic != nic)
            return rc;
    }
    requeue(s);
    pf_debug("QP %zu (NIC %d) failed (%s): its READs go on over %d NIC(s)", q, x->qps[q]->nic,
             strerror(-rc), nc);
    return 0;
}

/* Posts the next READs of q's NIC while q has room, as chains of up to POST_CHAIN
 * (pf_net_post_reads: one ibv_post_send per chain on verbs, one by one elsewhere). */
static int post_some(struct xstate *s, size_t q, bool *progress)
{
    struct p2p_xfer *x = s->x;
    int nic = x->qps[q]->nic;
    struct pf_net_sge sge[POST_CHAIN];
    struct pf_net_read rd[POST_CHAIN];
    while (s->out[q] < x->depth && s->cursor[nic] < s->end[nic]) {
        size_t m = 0;
        while (m < POST_CHAIN && s->out[q] + m < x->depth && s->cursor[nic] + m < s->end[nic]) {
            size_t r = s->order[s->cursor[nic] + m];
            const struct p2p_read *p = &s->reads[r];
            sge[m] = (struct pf_net_sge){.addr = p->local, .len = p->len, .lkey = p->lkey};
            rd[m] = (struct pf_net_read){.sge = &sge[m],
                                         .nsge = 1,
                                         .raddr = p->raddr,
                                         .rkey = p->rkey,
                                         .wr_id = r,
                                         .digest = p->dig};
            m++;
        }
        size_t k = 0;
        int rc = pf_net_post_reads(x->qps[q], rd, m, &k);
        for (size_t i = 0; i < k; i++) {
            s->owner[rd[i].wr_id] = (uint32_t)q + 1;
            s->out[q]++;
            s->cursor[nic]++;
            x->posted++;
        }
        if (k > 0)
            *progress = true;
        if (rc == -EAGAIN)
            break;
        if (rc)
            return rc;
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
            if (s->dead[q])
                continue;
            int rc = post_some(s, q, &progress);
            if (rc && (rc = qp_failed(s, q, rc)) != 0)
                return rc;
        }
        size_t busy = 0, busiest = 0;
        for (size_t q = 0; q < x->nqps; q++) {
            if (!s->out[q] || s->dead[q])
                continue;
            int n = pf_net_poll(x->qps[q], cqe, CQE_BATCH, 0);
            int rc = n < 0 ? n : handle(s, q, cqe, n);
            if (rc) {
                if ((rc = qp_failed(s, q, rc)) != 0)
                    return rc;
                progress = true;
                continue;
            }
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
        int rc = n < 0 ? n : handle(s, busiest, cqe, n);
        if (rc && (rc = qp_failed(s, busiest, rc)) != 0)
            return rc;
    }
    return 0;
}

int p2p_xfer_run(struct p2p_xfer *x, const struct p2p_read *reads, size_t n)
{
    x->posted = x->completed = 0;
    x->bytes = 0;
    x->failed = 0;
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
    s.dead = calloc(x->nqps, 1);
    if (!s.out || !s.owner || !s.done || !s.order || !s.cursor || !s.end || !s.dead)
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
    free(s.dead);
    return rc;
}

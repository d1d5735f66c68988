/* faulty:<inner> NET decorator. Ops: net.reg_mem, net.connect (qp_connect) and net.read
 * (post_read). READ faults: error at post; error at completion (not submitted: a
 * synthetic error completion is returned, so no byte lands); drop (not submitted, never
 * completes: the requester's deadline must fire; qp_invalidate flushes it with -ECANCELED
 * like any outstanding READ); delay (submitted, completion held back);
 * corrupt (submitted, local bytes flipped when the READ completes successfully); stall (the
 * post blocks its caller that long before it submits, like a full send queue: later READs of
 * the same thread go out after it); fatal.
 * qp_invalidate forwards to the inner backend (its guarantee is what protects local
 * memory) and turns held completions into -ECANCELED; a READ polled after it is never
 * corrupted (its buffer may already be freed). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "fault"
#include "hal/fault_track.h"
#include "pf/clock.h"
#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/log.h"
#include "pf/util.h"

struct fnet {
    struct pf_net base;
    struct pf_net *inner;
    struct pf_fault_plan *plan;
    _Atomic bool dead;
};

struct fmr {
    struct pf_net_mr base;
    struct pf_net_mr *inner;
};

struct fqp {
    struct pf_net_qp base;
    struct pf_net_qp *inner;
    pthread_mutex_t mu;
    struct ftrack_set ts;
    bool invalidated;
};

static struct fnet *fn(struct pf_net *n)
{
    return pf_container_of(n, struct fnet, base);
}

static int check(struct fnet *f, const char *op, struct pf_fault_hit *h)
{
    if (atomic_load(&f->dead))
        return -EIO;
    if (!pf_fault_check(f->plan, op, h))
        return 0;
    if (h->fatal) {
        atomic_store(&f->dead, true);
        pf_error("injected fatal fault on %s: NIC unusable from now on", op);
        return -EIO;
    }
    if (h->error && !h->at_complete)
        return h->error;
    return 0;
}

static int f_nic_count(struct pf_net *n)
{
    return pf_net_nic_count(fn(n)->inner);
}

static int f_nic_info(struct pf_net *n, int nic, struct pf_net_nic_info *info_p)
{
    return pf_net_nic_info(fn(n)->inner, nic, info_p);
}

static int f_reg(struct pf_net *n, int nic, void *addr, uint64_t len, unsigned access,
                 struct pf_net_mr **mr_p)
{
    struct fnet *f = fn(n);
    struct pf_fault_hit h;
    int rc = check(f, "net.reg_mem", &h);
    if (rc)
        return rc;
    if (h.error)
        return h.error;
    struct fmr *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    rc = pf_net_reg_mem(f->inner, nic, addr, len, access, &m->inner);
    if (rc) {
        free(m);
        return rc;
    }
    m->base = *m->inner;
    m->base.net = n;
    *mr_p = &m->base;
    return 0;
}

static void f_dereg(struct pf_net_mr *mp)
{
    struct fmr *m = pf_container_of(mp, struct fmr, base);
    pf_net_dereg_mem(m->inner);
    free(m);
}

static int f_qp_create(struct pf_net *n, int nic, struct pf_net_qp **qp_p)
{
    struct fnet *f = fn(n);
    if (atomic_load(&f->dead))
        return -EIO;
    struct fqp *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    int rc = pf_net_qp_create(f->inner, nic, &q->inner);
    if (rc) {
        free(q);
        return rc;
    }
    pthread_mutex_init(&q->mu, NULL);
    q->base.net = n;
    q->base.nic = nic;
    *qp_p = &q->base;
    return 0;
}

static struct fqp *fq(struct pf_net_qp *qp)
{
    return pf_container_of(qp, struct fqp, base);
}

static int f_ep(struct pf_net_qp *qp, void *buf, size_t cap, size_t *len_p)
{
    return pf_net_qp_local_endpoint(fq(qp)->inner, buf, cap, len_p);
}

static int f_connect(struct pf_net_qp *qp, const void *ep, size_t len)
{
    struct pf_fault_hit h;
    int rc = check(fn(qp->net), "net.connect", &h);
    if (rc)
        return rc;
    if (h.delay_ms)
        pf_sleep_ms(h.delay_ms);
    if (h.error)
        return h.error;
    return pf_net_qp_connect(fq(qp)->inner, ep, len);
}

static int f_read_common(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                         uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                         const struct pf_net_digest *dg)
{
    struct fqp *q = fq(qp);
    struct fnet *f = fn(qp->net);
    struct pf_fault_hit h;
    int rc = check(f, "net.read", &h);
    if (rc)
        return rc;
    if (h.stall_ms) /* a stalled submission: the caller's thread waits here, nothing is posted */
        pf_sleep_ms(h.stall_ms);
    pthread_mutex_lock(&q->mu);
    if (h.drop) { /* completes only when qp_invalidate flushes it (-ECANCELED) */
        rc = fdone_add(&q->ts, wr_id, -ECANCELED, q->invalidated ? 0 : UINT64_MAX);
        goto out;
    }
    if (h.error && h.at_complete) {
        rc = fdone_add(&q->ts, wr_id, h.error, 0);
        goto out;
    }
    if (h.corrupt || h.delay_ms) {
        struct ftrack t = {.id = wr_id, .corrupt = h.corrupt};
        if (h.delay_ms)
            t.release_ns = pf_now_ns() + h.delay_ms * PF_NS_PER_MS;
        if (h.corrupt && dg && q->inner->net->ops->post_read_digest) {
            t.ndig = dg->n;
            t.dig_lens = dg->lens;
            t.dig_out = dg->out;
        }
        if (h.corrupt) {
            t.iov = calloc(nsge, sizeof(*t.iov));
            if (!t.iov) {
                rc = -ENOMEM;
                goto out;
            }
            for (size_t i = 0; i < nsge; i++)
                t.iov[i] = (struct iovec){sge[i].addr, sge[i].len};
            t.niov = nsge;
        }
        rc = ftrack_add(&q->ts, &t);
        if (rc) {
            free(t.iov);
            goto out;
        }
    }
    rc = dg && q->inner->net->ops->post_read_digest
             ? q->inner->net->ops->post_read_digest(q->inner, sge, nsge, raddr, rkey, wr_id, dg)
             : pf_net_post_read(q->inner, sge, nsge, raddr, rkey, wr_id);
    if (rc) {
        struct ftrack t;
        if (ftrack_take(&q->ts, wr_id, &t))
            free(t.iov);
    }
out:
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static int f_read(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge, uint64_t raddr,
                  uint32_t rkey, uint64_t wr_id)
{
    return f_read_common(qp, sge, nsge, raddr, rkey, wr_id, NULL);
}

static int f_read_digest(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                         uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                         const struct pf_net_digest *d)
{
    return f_read_common(qp, sge, nsge, raddr, rkey, wr_id, d);
}

/* A corrupted READ's digests as a receiver hashing the landed bytes would have computed
 * them: over the bytes after the corruption (it stands for damage before they landed). */
static void redigest(const struct ftrack *t)
{
    size_t k = 0, off = 0;
    for (uint32_t r = 0; r < t->ndig; r++) {
        bool skip = (t->dig_lens[r] & PF_NET_DIGEST_SKIP) != 0;
        uint64_t len = t->dig_lens[r] & ~PF_NET_DIGEST_SKIP;
        struct pf_checksum c = {0};
        bool hashing = !skip && pf_checksum_init(&c) == 0;
        while (len > 0 && k < t->niov) {
            size_t take = t->iov[k].iov_len - off < len ? t->iov[k].iov_len - off : len;
            if (hashing)
                pf_checksum_update(&c, (const uint8_t *)t->iov[k].iov_base + off, take);
            len -= take;
            off += take;
            if (off == t->iov[k].iov_len) {
                k++;
                off = 0;
            }
        }
        if (hashing) {
            t->dig_out[r] = pf_checksum_final(&c);
            pf_checksum_destroy(&c);
        } else if (!skip) {
            t->dig_out[r] = ~0ull; /* no memory to hash with: a digest that cannot match */
        }
    }
}

static int f_poll(struct pf_net_qp *qp, struct pf_net_cqe *out, size_t max, uint64_t timeout_ms)
{
    struct fqp *q = fq(qp);
    struct fnet *f = fn(qp->net);
    uint64_t deadline = pf_now_ns() + timeout_ms * PF_NS_PER_MS;
    size_t got = 0;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        struct fdone d;
        uint64_t now = pf_now_ns();
        while (got < max && fdone_pop_ready(&q->ts, now, &d))
            out[got++] = (struct pf_net_cqe){d.id, (int)(d.res < 0 ? d.res : 0),
                                             (uint64_t)(d.res > 0 ? d.res : 0),
                                             (uint8_t)(d.res >= 0 && d.digested)};
        uint64_t next = fdone_next_release(&q->ts);
        pthread_mutex_unlock(&q->mu);
        if (got == max)
            return (int)got;
        uint64_t wait_ms = 0;
        if (got == 0 && now < deadline) {
            uint64_t until = next < deadline ? next : deadline;
            wait_ms = until > now ? (until - now + PF_NS_PER_MS - 1) / PF_NS_PER_MS : 0;
        }
        struct pf_net_cqe buf[32];
        size_t want = max - got < 32 ? max - got : 32;
        int n = pf_net_poll(q->inner, buf, want, wait_ms);
        if (n < 0)
            return got ? (int)got : n;
        pthread_mutex_lock(&q->mu);
        for (int i = 0; i < n; i++) {
            struct ftrack t;
            if (!ftrack_take(&q->ts, buf[i].wr_id, &t)) {
                out[got++] = buf[i];
                continue;
            }
            /* after qp_invalidate the caller may have freed the buffer: never touch it */
            if (t.corrupt && buf[i].status == 0 && !q->invalidated) {
                for (size_t k = 0; k < t.niov; k++)
                    pf_fault_corrupt(f->plan, t.iov[k].iov_base, t.iov[k].iov_len);
                if (buf[i].digested && t.ndig)
                    redigest(&t);
            }
            free(t.iov);
            if (t.release_ns > pf_now_ns() && !q->invalidated)
                fdone_add_digested(&q->ts, buf[i].wr_id,
                                   buf[i].status ? buf[i].status : (int64_t)buf[i].bytes,
                                   t.release_ns, buf[i].digested);
            else
                out[got++] = buf[i];
        }
        pthread_mutex_unlock(&q->mu);
        if (got > 0 || pf_now_ns() >= deadline)
            return (int)got;
    }
}

static void f_invalidate(struct pf_net_qp *qp)
{
    struct fqp *q = fq(qp);
    pf_net_qp_invalidate(q->inner);
    pthread_mutex_lock(&q->mu);
    q->invalidated = true;
    for (size_t i = 0; i < q->ts.nd; i++) {
        q->ts.d[i].res = -ECANCELED;
        q->ts.d[i].release_ns = 0;
    }
    pthread_mutex_unlock(&q->mu);
}

static void f_qp_destroy(struct pf_net_qp *qp)
{
    struct fqp *q = fq(qp);
    pf_net_qp_destroy(q->inner);
    ftrack_set_free(&q->ts);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

static int f_ep_host(struct pf_net *n, const void *ep, size_t len, char *host, size_t hostlen)
{
    return pf_net_ep_host(fn(n)->inner, ep, len, host, hostlen);
}

static int f_ep_check(struct pf_net_qp *qp, const void *ep, size_t len, char *why, size_t whylen)
{
    return pf_net_ep_check(fq(qp)->inner, ep, len, why, whylen);
}

static void f_close(struct pf_net *n)
{
    struct fnet *f = fn(n);
    pf_net_close(f->inner);
    free(f);
}

static const struct pf_net_ops fnet_ops = {
    .name = "faulty",
    .nic_count = f_nic_count,
    .nic_info = f_nic_info,
    .reg_mem = f_reg,
    .dereg_mem = f_dereg,
    .qp_create = f_qp_create,
    .qp_local_endpoint = f_ep,
    .qp_connect = f_connect,
    .ep_host = f_ep_host,
    .ep_check = f_ep_check,
    .post_read = f_read,
    .post_read_digest = f_read_digest,
    .poll = f_poll,
    .qp_invalidate = f_invalidate,
    .qp_destroy = f_qp_destroy,
    .close = f_close,
};

int pf_fault_net_wrap(struct pf_net *inner, struct pf_fault_plan *plan, struct pf_net **n_p)
{
    struct fnet *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    f->base.ops = &fnet_ops;
    f->inner = inner;
    f->plan = plan;
    *n_p = &f->base;
    return 0;
}

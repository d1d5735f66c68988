/* faulty:<inner> BLK decorator. Ops: blk.open (file_open), blk.write and blk.read (submit).
 * Faults: error at post; error at completion (not submitted, synthetic completion);
 * drop (never completes); delay (completion held back); corrupt (reads: buffers flipped
 * after a successful read; writes: a corrupted aligned bounce copy is written instead, so
 * the file holds wrong bytes while the caller's memory stays intact); fatal. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "fault"
#include "hal/fault_track.h"
#include "pf/clock.h"
#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/log.h"

struct fblk {
    struct pf_blk base;
    struct pf_blk *inner;
    struct pf_fault_plan *plan;
    _Atomic bool dead;
};

struct ffile {
    struct pf_blk_file base;
    struct pf_blk_file *inner;
};

struct fqueue {
    struct pf_blk_queue base;
    struct pf_blk_queue *inner;
    struct ftrack_set ts;
};

static struct fblk *fb(struct pf_blk *b)
{
    return pf_container_of(b, struct fblk, base);
}

static int check(struct fblk *f, const char *op, struct pf_fault_hit *h)
{
    if (atomic_load(&f->dead))
        return -EIO;
    if (!pf_fault_check(f->plan, op, h))
        return 0;
    if (h->fatal) {
        atomic_store(&f->dead, true);
        pf_error("injected fatal fault on %s: disk unusable from now on", op);
        return -EIO;
    }
    if (h->error && !h->at_complete)
        return h->error;
    return 0;
}

static int f_open(struct pf_blk *b, const char *path, uint64_t size, unsigned flags,
                  struct pf_blk_file **f_p)
{
    struct fblk *f = fb(b);
    struct pf_fault_hit h;
    int rc = check(f, "blk.open", &h);
    if (rc)
        return rc;
    if (h.error)
        return h.error;
    struct ffile *ff = calloc(1, sizeof(*ff));
    if (!ff)
        return -ENOMEM;
    rc = pf_blk_file_open(f->inner, path, size, flags, &ff->inner);
    if (rc) {
        free(ff);
        return rc;
    }
    ff->base = *ff->inner;
    ff->base.blk = b;
    *f_p = &ff->base;
    return 0;
}

static void f_fclose(struct pf_blk_file *fp)
{
    struct ffile *ff = pf_container_of(fp, struct ffile, base);
    pf_blk_file_close(ff->inner);
    free(ff);
}

static int f_qcreate(struct pf_blk *b, unsigned depth, struct pf_blk_queue **q_p)
{
    struct fblk *f = fb(b);
    if (atomic_load(&f->dead))
        return -EIO;
    struct fqueue *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    int rc = pf_blk_queue_create(f->inner, depth, &q->inner);
    if (rc) {
        free(q);
        return rc;
    }
    q->base.blk = b;
    *q_p = &q->base;
    return 0;
}

static void f_qdestroy(struct pf_blk_queue *qp)
{
    struct fqueue *q = pf_container_of(qp, struct fqueue, base);
    pf_blk_queue_destroy(q->inner);
    ftrack_set_free(&q->ts);
    free(q);
}

static int f_submit(struct pf_blk_queue *qp, struct pf_blk_file *fp, enum pf_blk_op op,
                    uint64_t offset, const struct iovec *iov, int iovcnt, uint64_t tag)
{
    struct fqueue *q = pf_container_of(qp, struct fqueue, base);
    struct ffile *ff = pf_container_of(fp, struct ffile, base);
    struct fblk *f = fb(qp->blk);
    struct pf_fault_hit h;
    int rc = check(f, op == PF_BLK_WRITE ? "blk.write" : "blk.read", &h);
    if (rc)
        return rc;
    if (h.drop)
        return 0;
    if (h.error && h.at_complete)
        return fdone_add(&q->ts, tag, h.error, 0);
    struct ftrack t = {.id = tag};
    struct iovec one;
    const struct iovec *sub = iov;
    int subcnt = iovcnt;
    if (h.delay_ms)
        t.release_ns = pf_now_ns() + h.delay_ms * PF_NS_PER_MS;
    if (h.corrupt && op == PF_BLK_READ) {
        t.corrupt = true;
        t.iov = malloc((size_t)iovcnt * sizeof(*iov));
        if (!t.iov)
            return -ENOMEM;
        memcpy(t.iov, iov, (size_t)iovcnt * sizeof(*iov));
        t.niov = (size_t)iovcnt;
    } else if (h.corrupt) {
        size_t total = 0;
        for (int i = 0; i < iovcnt; i++)
            total += iov[i].iov_len;
        if (posix_memalign(&t.bounce, PF_BLK_ALIGN, total ? total : PF_BLK_ALIGN) != 0)
            return -ENOMEM;
        size_t off = 0;
        for (int i = 0; i < iovcnt; i++) {
            memcpy((char *)t.bounce + off, iov[i].iov_base, iov[i].iov_len);
            off += iov[i].iov_len;
        }
        pf_fault_corrupt(f->plan, t.bounce, total);
        one = (struct iovec){t.bounce, total};
        sub = &one;
        subcnt = 1;
    }
    bool tracked = t.corrupt || t.release_ns || t.bounce;
    if (tracked && (rc = ftrack_add(&q->ts, &t)) != 0) {
        free(t.iov);
        free(t.bounce);
        return rc;
    }
    rc = pf_blk_submit(q->inner, ff->inner, op, offset, sub, subcnt, tag);
    if (rc && tracked) {
        struct ftrack u;
        if (ftrack_take(&q->ts, tag, &u)) {
            free(u.iov);
            free(u.bounce);
        }
    }
    return rc;
}

static int f_poll(struct pf_blk_queue *qp, struct pf_blk_cqe *out, size_t max, uint64_t timeout_ms)
{
    struct fqueue *q = pf_container_of(qp, struct fqueue, base);
    struct fblk *f = fb(qp->blk);
    uint64_t deadline = pf_now_ns() + timeout_ms * PF_NS_PER_MS;
    size_t got = 0;
    for (;;) {
        struct fdone d;
        uint64_t now = pf_now_ns();
        while (got < max && fdone_pop_ready(&q->ts, now, &d))
            out[got++] = (struct pf_blk_cqe){d.id, d.res};
        if (got == max)
            return (int)got;
        uint64_t wait_ms = 0, next = fdone_next_release(&q->ts);
        if (got == 0 && now < deadline) {
            uint64_t until = next < deadline ? next : deadline;
            wait_ms = until > now ? (until - now + PF_NS_PER_MS - 1) / PF_NS_PER_MS : 0;
        }
        struct pf_blk_cqe buf[32];
        size_t want = max - got < 32 ? max - got : 32;
        int n = pf_blk_poll(q->inner, buf, want, wait_ms);
        if (n < 0)
            return got ? (int)got : n;
        for (int i = 0; i < n; i++) {
            struct ftrack t;
            if (!ftrack_take(&q->ts, buf[i].tag, &t)) {
                out[got++] = buf[i];
                continue;
            }
            if (t.corrupt && buf[i].res > 0)
                for (size_t k = 0; k < t.niov; k++)
                    pf_fault_corrupt(f->plan, t.iov[k].iov_base, t.iov[k].iov_len);
            free(t.iov);
            free(t.bounce);
            if (t.release_ns > pf_now_ns())
                fdone_add(&q->ts, buf[i].tag, buf[i].res, t.release_ns);
            else
                out[got++] = buf[i];
        }
        if (got > 0 || pf_now_ns() >= deadline)
            return (int)got;
    }
}

static void f_close(struct pf_blk *b)
{
    struct fblk *f = fb(b);
    pf_blk_close(f->inner);
    free(f);
}

static const struct pf_blk_ops fblk_ops = {
    .name = "faulty",
    .file_open = f_open,
    .file_close = f_fclose,
    .queue_create = f_qcreate,
    .queue_destroy = f_qdestroy,
    .submit = f_submit,
    .poll = f_poll,
    .close = f_close,
};

int pf_fault_blk_wrap(struct pf_blk *inner, struct pf_fault_plan *plan, struct pf_blk **b_p)
{
    struct fblk *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    f->base.ops = &fblk_ops;
    f->inner = inner;
    f->plan = plan;
    *b_p = &f->base;
    return 0;
}

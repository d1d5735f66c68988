/* A BLK decorator for SSD unit tests: holds the completions of reads or writes until the
 * test opens the gate, so "a read is still in flight while X happens" is a state the test
 * creates, not a race it hopes for. Each queue is classified by the first op submitted on
 * it (the SSD store uses one queue for writes and one for reads). Submissions are counted
 * per op. Header-only. */
#ifndef PF_TEST_SSD_GATE_H
#define PF_TEST_SSD_GATE_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "pf/common.h"
#include "pf/hal_blk.h"

struct gate_blk {
    struct pf_blk base;
    struct pf_blk *inner;
    _Atomic bool hold[2];          /* PF_BLK_READ, PF_BLK_WRITE */
    _Atomic unsigned submitted[2]; /* accepted submissions per op */
};

struct gate_file {
    struct pf_blk_file base;
    struct pf_blk_file *inner;
};

struct gate_queue {
    struct pf_blk_queue base;
    struct pf_blk_queue *inner;
    int op; /* -1 until the first submission */
};

static inline struct gate_blk *gate_of(struct pf_blk *b)
{
    return pf_container_of(b, struct gate_blk, base);
}

static inline int gate_file_open(struct pf_blk *b, const char *path, uint64_t size, unsigned flags,
                                 struct pf_blk_file **f_p)
{
    struct gate_file *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    int rc = pf_blk_file_open(gate_of(b)->inner, path, size, flags, &f->inner);
    if (rc) {
        free(f);
        return rc;
    }
    f->base.blk = b;
    f->base.size = f->inner->size;
    *f_p = &f->base;
    return 0;
}

static inline void gate_file_close(struct pf_blk_file *fp)
{
    struct gate_file *f = pf_container_of(fp, struct gate_file, base);
    pf_blk_file_close(f->inner);
    free(f);
}

static inline int gate_queue_create(struct pf_blk *b, unsigned depth, struct pf_blk_queue **q_p)
{
    struct gate_queue *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    int rc = pf_blk_queue_create(gate_of(b)->inner, depth, &q->inner);
    if (rc) {
        free(q);
        return rc;
    }
    q->op = -1;
    q->base.blk = b;
    *q_p = &q->base;
    return 0;
}

static inline void gate_queue_destroy(struct pf_blk_queue *qp)
{
    struct gate_queue *q = pf_container_of(qp, struct gate_queue, base);
    pf_blk_queue_destroy(q->inner);
    free(q);
}

static inline int gate_submit(struct pf_blk_queue *qp, struct pf_blk_file *fp, enum pf_blk_op op,
                              uint64_t offset, const struct iovec *iov, int iovcnt, uint64_t tag)
{
    struct gate_queue *q = pf_container_of(qp, struct gate_queue, base);
    struct gate_file *f = pf_container_of(fp, struct gate_file, base);
    if (q->op < 0)
        q->op = (int)op;
    int rc = pf_blk_submit(q->inner, f->inner, op, offset, iov, iovcnt, tag);
    if (rc == 0)
        atomic_fetch_add(&gate_of(qp->blk)->submitted[op], 1);
    return rc;
}

static inline int gate_poll(struct pf_blk_queue *qp, struct pf_blk_cqe *out, size_t max,
                            uint64_t timeout_ms)
{
    struct gate_queue *q = pf_container_of(qp, struct gate_queue, base);
    if (q->op >= 0 && atomic_load(&gate_of(qp->blk)->hold[q->op])) {
        usleep((useconds_t)(timeout_ms < 5 ? timeout_ms : 5) * 1000);
        return 0;
    }
    return pf_blk_poll(q->inner, out, max, timeout_ms);
}

static inline void gate_close(struct pf_blk *b)
{
    struct gate_blk *g = gate_of(b);
    pf_blk_close(g->inner);
    free(g);
}

static const struct pf_blk_ops gate_ops = {
    .name = "gate",
    .file_open = gate_file_open,
    .file_close = gate_file_close,
    .queue_create = gate_queue_create,
    .queue_destroy = gate_queue_destroy,
    .submit = gate_submit,
    .poll = gate_poll,
    .close = gate_close,
};

/* Wraps inner (ownership passes to the gate). */
static inline struct gate_blk *gate_wrap(struct pf_blk *inner)
{
    struct gate_blk *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->base.ops = &gate_ops;
    g->inner = inner;
    return g;
}

static inline void gate_hold(struct gate_blk *g, enum pf_blk_op op, bool hold)
{
    atomic_store(&g->hold[op], hold);
}

static inline unsigned gate_submitted(struct gate_blk *g, enum pf_blk_op op)
{
    return atomic_load(&g->submitted[op]);
}

#endif

/* Block-storage abstraction for the SSD tier: O_DIRECT files and asynchronous vectored
 * I/O with completion records.
 *
 * Backends: "uring" (sim and production alike: io_uring on files) and "faulty:<inner>".
 * Every submission is checked for O_DIRECT alignment (file offset, every buffer address and
 * every iovec length multiple of PF_BLK_ALIGN) and refused with -EINVAL otherwise.
 *
 * Threading: a queue is used by one thread at a time (submit + poll). Files may be shared
 * by several queues. */
#ifndef PF_HAL_BLK_H
#define PF_HAL_BLK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define PF_BLK_ALIGN 512u

struct pf_blk;

struct pf_blk_file {
    struct pf_blk *blk;
    uint64_t size;
};

struct pf_blk_queue {
    struct pf_blk *blk;
};

enum pf_blk_op {
    PF_BLK_READ = 0,
    PF_BLK_WRITE = 1,
};

struct pf_blk_cqe {
    uint64_t tag;
    int64_t res; /* bytes transferred or -errno */
};

#define PF_BLK_OPEN_CREATE   0x1u /* create (and parent directories) if missing */
#define PF_BLK_OPEN_TRUNCATE 0x2u /* start empty */

struct pf_blk_ops {
    const char *name;
    /* Opens path with O_DIRECT and sizes it to size bytes (multiple of PF_BLK_ALIGN).
     * Errors: -ENOENT/-EACCES (cannot open), -EINVAL (file system refuses O_DIRECT),
     * -ENOSPC (size exceeds the free space). */
    int (*file_open)(struct pf_blk *b, const char *path, uint64_t size, unsigned flags,
                     struct pf_blk_file **f_p);
    void (*file_close)(struct pf_blk_file *f);
    int (*queue_create)(struct pf_blk *b, unsigned depth, struct pf_blk_queue **q_p);
    /* Waits for outstanding I/O, then frees. Accepts NULL. */
    void (*queue_destroy)(struct pf_blk_queue *q);
    /* Queues one vectored read or write at offset. -EAGAIN when depth requests are
     * outstanding, -EINVAL for misaligned requests. The iovec array is copied; the
     * buffers must stay valid until the completion is polled. */
    int (*submit)(struct pf_blk_queue *q, struct pf_blk_file *f, enum pf_blk_op op, uint64_t offset,
                  const struct iovec *iov, int iovcnt, uint64_t tag);
    /* Returns up to max completions, waiting up to timeout_ms for the first. */
    int (*poll)(struct pf_blk_queue *q, struct pf_blk_cqe *out, size_t max, uint64_t timeout_ms);
    void (*close)(struct pf_blk *b);
};

struct pf_blk {
    const struct pf_blk_ops *ops;
};

struct pf_blk_config {
    struct pf_fault_plan *faults;
};

static inline int pf_blk_file_open(struct pf_blk *b, const char *path, uint64_t size,
                                   unsigned flags, struct pf_blk_file **f_p)
{
    return b->ops->file_open(b, path, size, flags, f_p);
}
static inline void pf_blk_file_close(struct pf_blk_file *f)
{
    if (f)
        f->blk->ops->file_close(f);
}
static inline int pf_blk_queue_create(struct pf_blk *b, unsigned depth, struct pf_blk_queue **q_p)
{
    return b->ops->queue_create(b, depth, q_p);
}
static inline void pf_blk_queue_destroy(struct pf_blk_queue *q)
{
    if (q)
        q->blk->ops->queue_destroy(q);
}
static inline int pf_blk_submit(struct pf_blk_queue *q, struct pf_blk_file *f, enum pf_blk_op op,
                                uint64_t offset, const struct iovec *iov, int iovcnt, uint64_t tag)
{
    return q->blk->ops->submit(q, f, op, offset, iov, iovcnt, tag);
}
static inline int pf_blk_poll(struct pf_blk_queue *q, struct pf_blk_cqe *out, size_t max,
                              uint64_t timeout_ms)
{
    return q->blk->ops->poll(q, out, max, timeout_ms);
}
static inline void pf_blk_close(struct pf_blk *b)
{
    if (b)
        b->ops->close(b);
}

#endif

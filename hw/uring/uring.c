/* io_uring BLK backend ("uring"): O_DIRECT files and vectored reads/writes on io_uring rings.
 *
 * Files: file_open creates the parent directories (PF_BLK_OPEN_CREATE), opens the file
 * O_RDWR|O_DIRECT (never falls back to buffered I/O: a file system that refuses O_DIRECT is
 * an error), checks that the requested size fits the free space of the file system
 * (statvfs, counting blocks the file already owns), sizes it with fallocate (ftruncate when
 * the file system cannot preallocate) and probes one 512-byte O_DIRECT read. Every failure
 * is logged once here, naming the path and the cause.
 *
 * Queues: one io_uring ring each (no SQPOLL), depth = the caller's bound on outstanding
 * requests. submit validates alignment (file offset, every buffer address and every iovec
 * length multiple of PF_BLK_ALIGN) and the file bounds, copies the iovec array into a
 * per-request slot (kept until the completion is reaped) and submits at once. If the
 * kernel refuses the submission for a transient reason the SQE stays queued and is pushed
 * again by the next submit or poll. poll waits with io_uring_wait_cqe_timeout and reaps a
 * batch. Completions carry the caller's tag and the byte count or -errno. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define PF_LOG_MOD "uring"
#include "pf/clock.h"
#include "pf/common.h"
#include "pf/config.h"
#include "pf/hal.h"
#include "pf/log.h"

#define URING_INLINE_IOV      8
#define URING_MAX_DEPTH       4096u
#define URING_DESTROY_WAIT_MS 60000u

struct uring_blk {
    struct pf_blk base;
};

struct uring_file {
    struct pf_blk_file base;
    int fd;
    char path[];
};

struct uring_req {
    uint64_t tag;
    struct iovec *iov; /* inl or malloc'ed */
    struct iovec inl[URING_INLINE_IOV];
};

struct uring_queue {
    struct pf_blk_queue base;
    struct io_uring ring;
    unsigned depth;
    unsigned inflight; /* requests handed to the ring and not reaped */
    struct uring_req *reqs;
    unsigned *free_ids; /* stack of free request slots */
    unsigned nfree;
};

static const struct pf_blk_ops uring_ops;

/* ---- files ---- */

/* mkdir -p of the directory part of path. */
static int make_parents(const char *path)
{
    char *dup = strdup(path);
    if (!dup)
        return -ENOMEM;
    int rc = 0;
    char *slash = strrchr(dup, '/');
    if (!slash || slash == dup)
        goto out;
    *slash = '\0';
    for (char *p = dup + 1;; p++) {
        bool last = *p == '\0';
        if (*p != '/' && !last)
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(dup, 0755) != 0 && errno != EEXIST) {
            rc = -errno;
            pf_error("%s: cannot create directory %s: %s", path, dup, strerror(errno));
            goto out;
        }
        *p = saved;
        if (last)
            break;
    }
    struct stat st;
    if (stat(dup, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = -ENOTDIR;
        pf_error("%s: %s is not a directory", path, dup);
    }
out:
    free(dup);
    return rc;
}

/* Fails when the file system cannot take `size` more bytes for this file. */
static int check_space(int fd, const char *path, uint64_t size)
{
    struct statvfs vfs;
    struct stat st;
    if (fstatvfs(fd, &vfs) != 0 || fstat(fd, &st) != 0) {
        int e = errno;
        pf_error("%s: cannot query the file system: %s", path, strerror(e));
        return -e;
    }
    uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
    uint64_t owned = (uint64_t)st.st_blocks * 512u;
    uint64_t need = size > owned ? size - owned : 0;
    if (need > avail) {
        char cap[32], fr[32];
        pf_format_size(size, cap, sizeof(cap));
        pf_format_size(avail + owned, fr, sizeof(fr));
        pf_error("%s: SSD cache size %s exceeds the free space of its file system (%s available)",
                 path, cap, fr);
        return -ENOSPC;
    }
    return 0;
}

static int size_file(int fd, const char *path, uint64_t size)
{
    if (fallocate(fd, 0, 0, (off_t)size) != 0) {
        int e = errno;
        if (e == ENOSPC) {
            pf_error("%s: cannot preallocate %llu bytes: no space left on the file system", path,
                     (unsigned long long)size);
            return -ENOSPC;
        }
        if (e != EOPNOTSUPP && e != ENOSYS && e != EINVAL) {
            pf_error("%s: fallocate failed: %s", path, strerror(e));
            return -e;
        }
        pf_debug("%s: fallocate unsupported (%s), sizing with ftruncate", path, strerror(e));
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        pf_error("%s: cannot size the file to %llu bytes: %s", path, (unsigned long long)size,
                 strerror(e));
        return -e;
    }
    return 0;
}

/* One aligned 512-byte O_DIRECT read: some file systems accept the flag at open and refuse
 * the I/O, or need a larger alignment than PF_BLK_ALIGN. */
static int probe_direct(int fd, const char *path)
{
    void *buf;
    if (posix_memalign(&buf, 4096, PF_BLK_ALIGN) != 0)
        return -ENOMEM;
    int rc = 0;
    ssize_t n = pread(fd, buf, PF_BLK_ALIGN, 0);
    if (n < 0) {
        rc = -errno;
        if (errno == EINVAL)
            pf_error("%s: the file system refuses %u-byte O_DIRECT I/O (buffered I/O is never "
                     "used for the SSD cache)",
                     path, PF_BLK_ALIGN);
        else
            pf_error("%s: O_DIRECT read failed: %s", path, strerror(errno));
    }
    free(buf);
    return rc;
}

static int uring_file_open(struct pf_blk *b, const char *path, uint64_t size, unsigned flags,
                           struct pf_blk_file **f_p)
{
    if (!path || !*path) {
        pf_error("empty SSD cache path");
        return -EINVAL;
    }
    if (size == 0 || size % PF_BLK_ALIGN != 0) {
        pf_error("%s: size %llu is not a positive multiple of %u", path, (unsigned long long)size,
                 PF_BLK_ALIGN);
        return -EINVAL;
    }
    int rc;
    if (flags & PF_BLK_OPEN_CREATE) {
        rc = make_parents(path);
        if (rc)
            return rc;
    }
    int oflags = O_RDWR | O_DIRECT | O_CLOEXEC;
    if (flags & PF_BLK_OPEN_CREATE)
        oflags |= O_CREAT;
    if (flags & PF_BLK_OPEN_TRUNCATE)
        oflags |= O_TRUNC;
    int fd = open(path, oflags, 0644);
    if (fd < 0) {
        rc = -errno;
        if (errno == EINVAL)
            pf_error("%s: the file system does not support O_DIRECT (buffered I/O is never used "
                     "for the SSD cache)",
                     path);
        else
            pf_error("%s: cannot open: %s", path, strerror(errno));
        return rc;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        pf_error("%s: not a regular file", path);
        rc = -EINVAL;
        goto err_fd;
    }
    rc = check_space(fd, path, size);
    if (rc)
        goto err_fd;
    rc = size_file(fd, path, size);
    if (rc)
        goto err_fd;
    rc = probe_direct(fd, path);
    if (rc)
        goto err_fd;
    size_t plen = strlen(path) + 1;
    struct uring_file *f = calloc(1, sizeof(*f) + plen);
    if (!f) {
        rc = -ENOMEM;
        goto err_fd;
    }
    memcpy(f->path, path, plen);
    f->fd = fd;
    f->base.blk = b;
    f->base.size = size;
    *f_p = &f->base;
    return 0;
err_fd:
    close(fd);
    return rc;
}

static void uring_file_close(struct pf_blk_file *fp)
{
    if (!fp)
        return;
    struct uring_file *f = pf_container_of(fp, struct uring_file, base);
    close(f->fd);
    free(f);
}

/* ---- queues ---- */

static int uring_queue_create(struct pf_blk *b, unsigned depth, struct pf_blk_queue **q_p)
{
    if (depth == 0 || depth > URING_MAX_DEPTH)
        return -EINVAL;
    struct uring_queue *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    q->reqs = calloc(depth, sizeof(*q->reqs));
    q->free_ids = calloc(depth, sizeof(*q->free_ids));
    int rc = -ENOMEM;
    if (!q->reqs || !q->free_ids)
        goto err_free;
    rc = io_uring_queue_init(depth, &q->ring, 0);
    if (rc < 0) {
        pf_error("io_uring_queue_init(%u): %s", depth, strerror(-rc));
        goto err_free;
    }
    for (unsigned i = 0; i < depth; i++)
        q->free_ids[i] = depth - 1 - i;
    q->nfree = depth;
    q->depth = depth;
    q->base.blk = b;
    *q_p = &q->base;
    return 0;
err_free:
    free(q->reqs);
    free(q->free_ids);
    free(q);
    return rc;
}

static void req_release(struct uring_queue *q, unsigned id)
{
    struct uring_req *r = &q->reqs[id];
    if (r->iov != r->inl)
        free(r->iov);
    r->iov = NULL;
    q->free_ids[q->nfree++] = id;
    q->inflight--;
}

/* Reaps up to max completions without waiting. */
static int reap(struct uring_queue *q, struct pf_blk_cqe *out, size_t max)
{
    size_t got = 0;
    struct io_uring_cqe *cqe;
    while (got < max && io_uring_peek_cqe(&q->ring, &cqe) == 0 && cqe) {
        unsigned id = (unsigned)cqe->user_data;
        int64_t res = cqe->res;
        io_uring_cqe_seen(&q->ring, cqe);
        if (id >= q->depth || q->reqs[id].iov == NULL)
            continue; /* not ours (cannot happen: every SQE carries a slot id) */
        if (out)
            out[got] = (struct pf_blk_cqe){q->reqs[id].tag, res};
        got++;
        req_release(q, id);
    }
    return (int)got;
}

static void flush_sq(struct uring_queue *q)
{
    if (io_uring_sq_ready(&q->ring) > 0) {
        int rc = io_uring_submit(&q->ring);
        if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && rc != -EINTR)
            pf_log_ratelimited(PF_LOG_WARN, 5000, "io_uring_submit: %s", strerror(-rc));
    }
}

static void uring_queue_destroy(struct pf_blk_queue *qp)
{
    if (!qp)
        return;
    struct uring_queue *q = pf_container_of(qp, struct uring_queue, base);
    uint64_t deadline = pf_now_ns() + URING_DESTROY_WAIT_MS * PF_NS_PER_MS;
    while (q->inflight > 0 && pf_now_ns() < deadline) {
        flush_sq(q);
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
        io_uring_wait_cqe_timeout(&q->ring, &cqe, &ts);
        reap(q, NULL, SIZE_MAX);
    }
    if (q->inflight > 0)
        pf_warn("destroying an io_uring queue with %u request(s) still outstanding after %u s",
                q->inflight, URING_DESTROY_WAIT_MS / 1000);
    io_uring_queue_exit(&q->ring);
    for (unsigned i = 0; i < q->depth; i++)
        if (q->reqs[i].iov && q->reqs[i].iov != q->reqs[i].inl)
            free(q->reqs[i].iov);
    free(q->reqs);
    free(q->free_ids);
    free(q);
}

static int uring_submit(struct pf_blk_queue *qp, struct pf_blk_file *fp, enum pf_blk_op op,
                        uint64_t offset, const struct iovec *iov, int iovcnt, uint64_t tag)
{
    struct uring_queue *q = pf_container_of(qp, struct uring_queue, base);
    struct uring_file *f = pf_container_of(fp, struct uring_file, base);
    if (op != PF_BLK_READ && op != PF_BLK_WRITE)
        return -EINVAL;
    if (iovcnt <= 0 || iovcnt > IOV_MAX || !iov)
        return -EINVAL;
    if (offset % PF_BLK_ALIGN != 0)
        return -EINVAL;
    uint64_t total = 0;
    for (int i = 0; i < iovcnt; i++) {
        if ((uintptr_t)iov[i].iov_base % PF_BLK_ALIGN != 0 || iov[i].iov_len % PF_BLK_ALIGN != 0)
            return -EINVAL;
        total += iov[i].iov_len;
    }
    uint64_t end;
    if (total == 0 || !pf_add_ok(offset, total, &end) || end > f->base.size)
        return -EINVAL;
    if (q->nfree == 0)
        return -EAGAIN;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
    if (!sqe) {
        flush_sq(q);
        sqe = io_uring_get_sqe(&q->ring);
        if (!sqe)
            return -EAGAIN;
    }
    unsigned id = q->free_ids[q->nfree - 1];
    struct uring_req *r = &q->reqs[id];
    if (iovcnt <= URING_INLINE_IOV) {
        r->iov = r->inl;
    } else {
        r->iov = malloc((size_t)iovcnt * sizeof(*iov));
        if (!r->iov) {
            /* the SQE is already taken: turn it into a no-op nobody waits for */
            io_uring_prep_nop(sqe);
            io_uring_sqe_set_data64(sqe, UINT64_MAX);
            flush_sq(q);
            return -ENOMEM;
        }
    }
    memcpy(r->iov, iov, (size_t)iovcnt * sizeof(*iov));
    r->tag = tag;
    q->nfree--;
    q->inflight++;
    if (op == PF_BLK_READ)
        io_uring_prep_readv(sqe, f->fd, r->iov, (unsigned)iovcnt, offset);
    else
        io_uring_prep_writev(sqe, f->fd, r->iov, (unsigned)iovcnt, offset);
    io_uring_sqe_set_data64(sqe, id);
    /* a transient refusal leaves the SQE queued: flush_sq retries on the next call */
    flush_sq(q);
    return 0;
}

static int uring_poll(struct pf_blk_queue *qp, struct pf_blk_cqe *out, size_t max,
                      uint64_t timeout_ms)
{
    struct uring_queue *q = pf_container_of(qp, struct uring_queue, base);
    if (max == 0)
        return 0;
    flush_sq(q);
    int got = reap(q, out, max);
    if (got > 0 || timeout_ms == 0)
        return got;
    uint64_t deadline = pf_now_ns() + timeout_ms * PF_NS_PER_MS;
    for (;;) {
        uint64_t now = pf_now_ns();
        if (now >= deadline)
            return 0;
        uint64_t left = deadline - now;
        struct __kernel_timespec ts = {.tv_sec = (long long)(left / PF_NS_PER_SEC),
                                       .tv_nsec = (long long)(left % PF_NS_PER_SEC)};
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe_timeout(&q->ring, &cqe, &ts);
        if (rc == 0) {
            got = reap(q, out, max);
            if (got > 0)
                return got;
            continue; /* a stray no-op completion */
        }
        if (rc == -ETIME)
            return 0;
        if (rc != -EINTR && rc != -EAGAIN) {
            pf_log_ratelimited(PF_LOG_WARN, 5000, "io_uring_wait_cqe_timeout: %s", strerror(-rc));
            return rc;
        }
        flush_sq(q);
    }
}

/* ---- backend ---- */

static void uring_close(struct pf_blk *b)
{
    free(pf_container_of(b, struct uring_blk, base));
}

static const struct pf_blk_ops uring_ops = {
    .name = "uring",
    .file_open = uring_file_open,
    .file_close = uring_file_close,
    .queue_create = uring_queue_create,
    .queue_destroy = uring_queue_destroy,
    .submit = uring_submit,
    .poll = uring_poll,
    .close = uring_close,
};

static int uring_open(const struct pf_blk_config *cfg, struct pf_blk **b_p)
{
    /* io_uring may be disabled (kernel.io_uring_disabled, seccomp): say so at open */
    struct io_uring probe;
    int rc = io_uring_queue_init(2, &probe, 0);
    if (rc < 0) {
        pf_error("io_uring is not usable on this host: %s", strerror(-rc));
        return -ENODEV;
    }
    io_uring_queue_exit(&probe);
    struct uring_blk *u = calloc(1, sizeof(*u));
    if (!u)
        return -ENOMEM;
    u->base.ops = &uring_ops;
    *b_p = &u->base;
    return 0;
}

int pf_uring_register(void)
{
    static const struct pf_blk_backend be = {
        .name = "uring",
        .hardware = 0,
        .ops = &uring_ops,
        .open = uring_open,
    };
    return pf_hal_register_blk(&be);
}

/* Simulated GPU backend ("sim").
 *
 * Device memory is any POSIX shared-memory object a client created (shm_open+ftruncate)
 * and described with an IpcTensor of kind SIM_SHM. ipc_open maps it and hands out device
 * addresses of the form SIMGPU_ADDR_TAG | map_id << 40 | offset: non-canonical x86-64
 * addresses, so a core bug that dereferences device memory faults immediately instead of
 * silently working.
 *
 * Streams own an engine thread each; copy_batch validates every descriptor against the
 * mapping table (device side) and the host registrations (host side) before anything is
 * queued, so a violation is -EFAULT and never a stray write. Mappings are refcounted: a
 * copy in flight keeps its mapping alive even if ipc_close runs concurrently. Consecutive
 * descriptors adjacent on both sides are copied as one (up to MERGE_MAX bytes), with
 * non-temporal stores from PF_COPY_NT_MIN bytes on (pf_copy_bulk: the server chooses them,
 * no GLIBC_TUNABLES needed). copy_batch_hash (D2H) copies each descriptor in L2-sized
 * chunks and hashes every chunk from the destination right after writing it, one XXH3
 * state per hash run (pf_copy_hash), so a save with integrity on reads its bytes once.
 * An optional per-device bandwidth cap (bytes/s) models a PCIe link shared by the
 * device's streams. */
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PF_LOG_MOD "simgpu"
#include "pf/clock.h"
#include "pf/copy.h"
#include "pf/guard.h"
#include "pf/hal.h"
#include "pf/log.h"
#include "pf/thread.h"

#define SIMGPU_ADDR_TAG     0x8000000000000000ull
#define SIMGPU_ID_SHIFT     40
#define SIMGPU_OFF_MASK     ((1ull << SIMGPU_ID_SHIFT) - 1)
#define SIMGPU_MAX_MAPS     4096
#define SIMGPU_MAX_DEVS     64
#define SIMGPU_DEFAULT_DEVS 8

struct simdev {
    int index;
    int numa;
    pthread_mutex_t link_mu;
    uint64_t busy_until_ns; /* bandwidth model */
};

struct simmap {
    struct pf_gpu_mapping base;
    _Atomic int refs;
    uint32_t id;
    void *host; /* mmap of the whole object */
    size_t maplen;
    uint64_t offset; /* tensor storage offset inside the object */
    char name[256];
};

struct simreg {
    struct pf_gpu_host_reg base;
    struct simreg *next;
};

struct simgpu {
    struct pf_gpu base;
    int ndev;
    struct simdev devs[SIMGPU_MAX_DEVS];
    uint64_t bw;
    pthread_rwlock_t lock; /* maps[] and regs */
    struct simmap *maps[SIMGPU_MAX_MAPS];
    uint32_t next_id;
    struct simreg *regs;
};

/* Batches of at least this many bytes are split between two copy lanes (the stream's engine
 * thread and a helper), as a GPU runs a transfer on more than one copy engine: a single
 * CPU thread's memcpy (and, with integrity on, its xxh3) is not the memory's limit. */
#define LANE_MIN (512ull << 10)

/* Descriptors adjacent on both sides (consecutive blocks of one layer into one allocation)
 * merge into one copy while it stays below this: a block-sized memcpy loop runs well below
 * one large memcpy (glibc uses non-temporal stores only for large calls). */
#define MERGE_MAX (64ull << 20)

struct copy_op {
    struct simmap *map;
    void *dev; /* resolved host-side address of the device range */
    void *host;
    uint64_t len;
};

struct batch {
    struct batch *next;
    enum pf_copy_dir dir;
    const uint8_t *join; /* copy_batch_hash: ops[i] is descriptor i, never merged */
    uint64_t *sums;
    size_t n;
    struct copy_op ops[];
};

struct simstream {
    struct pf_gpu_stream base;
    struct simgpu *g;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct batch *head, *tail;
    uint64_t submitted, completed;
    int first_err;
    bool stop;
    struct pf_hash_state *hash; /* the engine thread's, for copy_batch_hash */
    /* the second copy lane: a helper thread that runs the back half of a large batch */
    pthread_t lane_thr;
    bool lane_started, lane_stop; /* lane_stop: set after the engine thread ended */
    pthread_cond_t lane_cv;       /* under mu */
    struct lane_job *job;         /* posted by the engine thread, NULL when idle */
    struct pf_hash_state *lane_hash;
};

/* A part of a batch's ops for one lane: ops[from, to) of b (split points at hash-run
 * boundaries), or for a plain batch of one large op, the tail range in `part`. */
struct lane_job {
    struct batch *b;
    size_t from, to;
    struct copy_op part; /* len > 0: copy this range instead of ops[from, to) */
    int err;
    bool done;
};

static const struct pf_gpu_ops simgpu_ops;

static struct simgpu *sg(struct pf_gpu *g)
{
    return pf_container_of(g, struct simgpu, base);
}

static void map_put(struct simmap *m)
{
    if (atomic_fetch_sub(&m->refs, 1) == 1) {
        munmap(m->host, m->maplen);
        free(m);
    }
}

static int s_count(struct pf_gpu *g)
{
    return sg(g)->ndev;
}

static int s_info(struct pf_gpu *g, int dev, struct pf_gpu_dev_info *info)
{
    struct simgpu *s = sg(g);
    if (dev < 0 || dev >= s->ndev)
        return -ENODEV;
    memset(info, 0, sizeof(*info));
    info->index = s->devs[dev].index;
    info->numa_node = s->devs[dev].numa;
    memcpy(info->uuid, "PFSIMGPU", 8);
    info->uuid[15] = (uint8_t)s->devs[dev].index;
    snprintf(info->name, sizeof(info->name), "PegaFlow sim GPU %d", s->devs[dev].index);
    snprintf(info->pci_bus_id, sizeof(info->pci_bus_id), "sim:%02x", s->devs[dev].index);
    return 0;
}

static int dev_ordinal(struct simgpu *s, int index)
{
    for (int i = 0; i < s->ndev; i++)
        if (s->devs[i].index == index)
            return i;
    return -1;
}

static int s_ipc_open(struct pf_gpu *g, const struct pf_ipc_desc *d, struct pf_gpu_mapping **m_p)
{
    struct simgpu *s = sg(g);
    if (d->kind != PF_IPC_SIM_SHM) {
        pf_warn("refusing IpcTensor of kind %d: the sim GPU backend maps SIM_SHM descriptors "
                "only",
                d->kind);
        return -EINVAL;
    }
    int ord = dev_ordinal(s, d->sim_device);
    if (ord < 0) {
        pf_warn("IpcTensor names sim device %d, which this server did not open", d->sim_device);
        return -ENODEV;
    }
    if (d->shm_name[0] != '/' || strchr(d->shm_name + 1, '/') || d->size == 0)
        return -EINVAL;
    int fd = shm_open(d->shm_name, O_RDWR, 0);
    if (fd < 0) {
        int e = errno;
        pf_warn("cannot open sim GPU memory %s: %s", d->shm_name, strerror(e));
        return -e;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto err_close;
    }
    uint64_t end;
    if (!pf_add_ok(d->offset, d->size, &end) || end > (uint64_t)st.st_size) {
        pf_warn("IpcTensor range [%llu, +%llu) exceeds sim GPU memory %s of %lld bytes",
                (unsigned long long)d->offset, (unsigned long long)d->size, d->shm_name,
                (long long)st.st_size);
        rc = -ERANGE;
        goto err_close;
    }
    if (end > SIMGPU_OFF_MASK) {
        rc = -ERANGE;
        goto err_close;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        goto err_close;
    }
    close(fd);
    struct simmap *m = calloc(1, sizeof(*m));
    if (!m) {
        munmap(p, (size_t)st.st_size);
        return -ENOMEM;
    }
    m->host = p;
    m->maplen = (size_t)st.st_size;
    m->offset = d->offset;
    atomic_init(&m->refs, 1);
    snprintf(m->name, sizeof(m->name), "%s", d->shm_name);
    pthread_rwlock_wrlock(&s->lock);
    uint32_t id = 0;
    for (uint32_t i = 0; i < SIMGPU_MAX_MAPS - 1; i++) {
        uint32_t cand = 1 + (s->next_id + i) % (SIMGPU_MAX_MAPS - 1);
        if (!s->maps[cand]) {
            id = cand;
            break;
        }
    }
    if (id == 0) {
        pthread_rwlock_unlock(&s->lock);
        munmap(p, m->maplen);
        free(m);
        return -ENOSPC;
    }
    s->next_id = id;
    m->id = id;
    s->maps[id] = m;
    pthread_rwlock_unlock(&s->lock);
    m->base.gpu = g;
    m->base.device = ord;
    m->base.base = SIMGPU_ADDR_TAG | (uint64_t)id << SIMGPU_ID_SHIFT | d->offset;
    m->base.size = d->size;
    pf_debug("mapped %s [%llu, +%llu) on sim device %d as 0x%llx", d->shm_name,
             (unsigned long long)d->offset, (unsigned long long)d->size, d->sim_device,
             (unsigned long long)m->base.base);
    *m_p = &m->base;
    return 0;
err_close:
    close(fd);
    return rc;
}

static void s_ipc_close(struct pf_gpu_mapping *mp)
{
    struct simmap *m = pf_container_of(mp, struct simmap, base);
    struct simgpu *s = sg(mp->gpu);
    pthread_rwlock_wrlock(&s->lock);
    if (s->maps[m->id] == m)
        s->maps[m->id] = NULL;
    pthread_rwlock_unlock(&s->lock);
    map_put(m);
}

static int s_host_register(struct pf_gpu *g, void *addr, size_t len, struct pf_gpu_host_reg **r_p)
{
    struct simgpu *s = sg(g);
    if (!addr || !len)
        return -EINVAL;
    struct simreg *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->base.gpu = g;
    r->base.addr = addr;
    r->base.len = len;
    pthread_rwlock_wrlock(&s->lock);
    r->next = s->regs;
    s->regs = r;
    pthread_rwlock_unlock(&s->lock);
    *r_p = &r->base;
    return 0;
}

static void s_host_unregister(struct pf_gpu_host_reg *rp)
{
    struct simgpu *s = sg(rp->gpu);
    pthread_rwlock_wrlock(&s->lock);
    for (struct simreg **pp = &s->regs; *pp; pp = &(*pp)->next) {
        if (&(*pp)->base == rp) {
            struct simreg *r = *pp;
            *pp = r->next;
            free(r);
            break;
        }
    }
    pthread_rwlock_unlock(&s->lock);
}

/* caller holds s->lock (read) */
static bool host_registered(struct simgpu *s, const void *p, uint64_t len)
{
    uintptr_t a = (uintptr_t)p;
    for (struct simreg *r = s->regs; r; r = r->next) {
        uintptr_t b = (uintptr_t)r->base.addr;
        if (a >= b && len <= r->base.len && a - b <= r->base.len - len)
            return true;
    }
    return false;
}

static void throttle(struct simgpu *s, struct simdev *d, uint64_t len)
{
    if (!s->bw)
        return;
    uint64_t dur = (uint64_t)((double)len * 1e9 / (double)s->bw);
    pthread_mutex_lock(&d->link_mu);
    uint64_t now = pf_now_ns();
    uint64_t start = d->busy_until_ns > now ? d->busy_until_ns : now;
    d->busy_until_ns = start + dur;
    pthread_mutex_unlock(&d->link_mu);
    uint64_t end = start + dur;
    now = pf_now_ns();
    if (end > now) {
        struct timespec ts = pf_ns_to_timespec(end);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
}

struct guarded_op {
    struct copy_op *op;
    enum pf_copy_dir dir;
    struct pf_hash_state *hash; /* NULL: plain copy */
};

static void run_op(void *arg)
{
    struct guarded_op *g = arg;
    struct copy_op *op = g->op;
    if (g->hash)
        pf_copy_hash(op->host, op->dev, op->len, g->hash);
    else if (g->dir == PF_COPY_D2H)
        pf_copy_bulk(op->host, op->dev, op->len);
    else
        pf_copy_bulk(op->dev, op->host, op->len);
}

/* Copies ops[from, to) of b (or j->part) on the calling thread; the first fault ends the
 * range with -EFAULT. Hash runs never cross a lane's range. */
static int run_range(struct batch *b, size_t from, size_t to, const struct copy_op *part,
                     struct pf_hash_state *hash)
{
    for (size_t i = from; i < to; i++) {
        struct copy_op *op = part ? (struct copy_op *)part : &b->ops[i];
        /* the device side is a client's shm object: a client that shrinks it must fail
         * this batch, not kill the server (SIGBUS contained by pf_guard_call) */
        struct guarded_op g = {op, b->dir, b->sums ? hash : NULL};
        if (g.hash && (i == from || !b->join[i]))
            pf_hash_reset(g.hash);
        if (pf_guard_call(run_op, &g) != 0) {
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "%s copy %zu of %zu faulted: sim GPU memory %s is no longer "
                               "backed at offset %llu (+%llu bytes; the client shrank or "
                               "removed it)",
                               b->dir == PF_COPY_D2H ? "D2H" : "H2D", i, b->n, op->map->name,
                               (unsigned long long)((char *)op->dev - (char *)op->map->host),
                               (unsigned long long)op->len);
            return -EFAULT;
        }
        if (g.hash && (i + 1 == b->n || !b->join[i + 1]))
            b->sums[i] = pf_hash_digest(g.hash);
    }
    return 0;
}

static void *lane_main(void *arg)
{
    struct simstream *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->lane_stop && (!st->job || st->job->done))
            pthread_cond_wait(&st->lane_cv, &st->mu);
        if (!st->job || st->job->done)
            break; /* lane_stop */
        struct lane_job *j = st->job;
        pthread_mutex_unlock(&st->mu);
        int err = run_range(j->b, j->from, j->to, j->part.len ? &j->part : NULL, st->lane_hash);
        pthread_mutex_lock(&st->mu);
        j->err = err;
        j->done = true;
        pthread_cond_broadcast(&st->lane_cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Where a batch of total bytes splits between the two lanes: *j describes the second
 * lane's share, the first lane keeps ops[0, *mid_p) (and, for a single plain op, its head
 * of *head_p bytes). False: too small to be worth a second thread, or no split point. */
static bool split(struct batch *b, uint64_t total, struct lane_job *j, size_t *mid_p,
                  uint64_t *head_p)
{
    if (total < LANE_MIN)
        return false;
    *j = (struct lane_job){.b = b};
    if (!b->sums && b->n == 1) { /* one large (merged) plain copy: halves of it */
        uint64_t head = (b->ops[0].len / 2 + 4095) & ~4095ull;
        j->part = b->ops[0];
        j->part.dev = (char *)j->part.dev + head;
        j->part.host = (char *)j->part.host + head;
        j->part.len -= head;
        j->from = 0;
        j->to = 1;
        *mid_p = 1;
        *head_p = head;
        return j->part.len > 0;
    }
    uint64_t acc = 0;
    size_t mid = 0;
    for (size_t i = 0; i < b->n; i++) {
        bool boundary = !b->sums || !b->join[i];
        if (boundary && acc >= total / 2) {
            mid = i;
            break;
        }
        acc += b->ops[i].len;
    }
    if (mid == 0)
        return false;
    j->from = mid;
    j->to = b->n;
    *mid_p = mid;
    *head_p = 0;
    return true;
}

static void *stream_main(void *arg)
{
    struct simstream *st = arg;
    struct simdev *dev = &st->g->devs[st->base.device];
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->head && !st->stop)
            pthread_cond_wait(&st->cv, &st->mu);
        if (!st->head)
            break;
        struct batch *b = st->head;
        pthread_mutex_unlock(&st->mu);
        uint64_t bytes = 0;
        for (size_t i = 0; i < b->n; i++)
            bytes += b->ops[i].len;
        struct lane_job job;
        size_t mid = b->n;
        uint64_t head = 0;
        int err;
        if (st->lane_started && split(b, bytes, &job, &mid, &head)) {
            pthread_mutex_lock(&st->mu);
            st->job = &job;
            pthread_cond_broadcast(&st->lane_cv);
            pthread_mutex_unlock(&st->mu);
            struct copy_op first = b->ops[0];
            first.len = head;
            err = run_range(b, 0, mid, head ? &first : NULL, st->hash);
            pthread_mutex_lock(&st->mu);
            while (!job.done)
                pthread_cond_wait(&st->lane_cv, &st->mu);
            st->job = NULL;
            pthread_mutex_unlock(&st->mu);
            if (!err)
                err = job.err;
        } else {
            err = run_range(b, 0, b->n, NULL, st->hash);
        }
        for (size_t i = 0; i < b->n; i++)
            map_put(b->ops[i].map);
        throttle(st->g, dev, bytes);
        pthread_mutex_lock(&st->mu);
        if (err && !st->first_err)
            st->first_err = err;
        st->head = b->next;
        if (!st->head)
            st->tail = NULL;
        st->completed++;
        free(b);
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Ends the lane thread (the engine thread is gone or never started) and frees its state. */
static void lane_stop(struct simstream *st)
{
    if (st->lane_started) {
        pthread_mutex_lock(&st->mu);
        st->lane_stop = true;
        pthread_cond_broadcast(&st->lane_cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->lane_thr, NULL);
        st->lane_started = false;
    }
    pf_hash_state_free(st->lane_hash);
    st->lane_hash = NULL;
}

static int s_stream_create(struct pf_gpu *g, int dev, struct pf_gpu_stream **s_p)
{
    struct simgpu *s = sg(g);
    if (dev < 0 || dev >= s->ndev)
        return -ENODEV;
    struct simstream *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->base.gpu = g;
    st->base.device = dev;
    st->g = s;
    st->hash = pf_hash_state_new();
    if (!st->hash) {
        free(st);
        return -ENOMEM;
    }
    pthread_mutex_init(&st->mu, NULL);
    int rc = pf_cond_init(&st->cv);
    if (rc)
        goto err_free;
    rc = pf_cond_init(&st->lane_cv);
    if (rc)
        goto err_cond;
    char name[16];
    /* the second lane is an optimisation: without its thread the stream copies alone */
    st->lane_hash = pf_hash_state_new();
    snprintf(name, sizeof(name), "simgpu%d-b", s->devs[dev].index);
    st->lane_started = st->lane_hash &&
                       pf_thread_start(&st->lane_thr, name, s->devs[dev].numa, lane_main, st) == 0;
    snprintf(name, sizeof(name), "simgpu%d", s->devs[dev].index);
    rc = pf_thread_start(&st->thr, name, s->devs[dev].numa, stream_main, st);
    if (rc)
        goto err_lane;
    *s_p = &st->base;
    return 0;
err_lane:
    lane_stop(st);
    pthread_cond_destroy(&st->lane_cv);
err_cond:
    pthread_cond_destroy(&st->cv);
err_free:
    pthread_mutex_destroy(&st->mu);
    pf_hash_state_free(st->hash);
    free(st);
    return rc;
}

static void s_stream_destroy(struct pf_gpu_stream *sp)
{
    struct simstream *st = pf_container_of(sp, struct simstream, base);
    pthread_mutex_lock(&st->mu);
    st->stop = true;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thr, NULL); /* drains queued batches first */
    lane_stop(st);
    pthread_cond_destroy(&st->lane_cv);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    pf_hash_state_free(st->hash);
    free(st);
}

static int enqueue(struct simstream *st, enum pf_copy_dir dir, const struct pf_copy_desc *d,
                   size_t n, const uint8_t *join, uint64_t *sums);

static int s_copy(struct pf_gpu_stream *sp, enum pf_copy_dir dir, enum pf_copy_mode mode,
                  const struct pf_copy_desc *d, size_t n)
{
    return enqueue(pf_container_of(sp, struct simstream, base), dir, d, n, NULL, NULL);
}

static int s_copy_hash(struct pf_gpu_stream *sp, enum pf_copy_dir dir, enum pf_copy_mode mode,
                       const struct pf_copy_desc *d, size_t n, const uint8_t *join, uint64_t *sums)
{
    if (dir != PF_COPY_D2H || (n && (!join || !sums)))
        return -EINVAL;
    return enqueue(pf_container_of(sp, struct simstream, base), dir, d, n, join, sums);
}

/* Validates every descriptor, then queues one batch (sums != NULL: hashed, unmerged). */
static int enqueue(struct simstream *st, enum pf_copy_dir dir, const struct pf_copy_desc *d,
                   size_t n, const uint8_t *join, uint64_t *sums)
{
    struct pf_gpu_stream *sp = &st->base;
    struct simgpu *s = st->g;
    if (dir != PF_COPY_D2H && dir != PF_COPY_H2D)
        return -EINVAL;
    if (n == 0)
        return 0;
    struct batch *b = malloc(sizeof(*b) + n * sizeof(struct copy_op));
    if (!b)
        return -ENOMEM;
    b->next = NULL;
    b->dir = dir;
    b->join = join;
    b->sums = sums;
    b->n = 0;
    int rc = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        uint64_t a = d[i].dev;
        uint32_t id = (uint32_t)((a & ~SIMGPU_ADDR_TAG) >> SIMGPU_ID_SHIFT);
        uint64_t off = a & SIMGPU_OFF_MASK, end;
        struct simmap *m = (a & SIMGPU_ADDR_TAG) && id < SIMGPU_MAX_MAPS ? s->maps[id] : NULL;
        if (!m || m->base.device != sp->device || off < m->offset ||
            !pf_add_ok(off, d[i].len, &end) || end > m->offset + m->base.size) {
            pf_warn("copy %zu of %zu: device range 0x%llx+%llu is outside every mapping of sim "
                    "device %d",
                    i, n, (unsigned long long)a, (unsigned long long)d[i].len,
                    s->devs[sp->device].index);
            rc = -EFAULT;
            break;
        }
        if (!host_registered(s, d[i].host, d[i].len)) {
            pf_warn("copy %zu of %zu: host range %p+%llu is not registered memory", i, n, d[i].host,
                    (unsigned long long)d[i].len);
            rc = -EFAULT;
            break;
        }
        char *dev = (char *)m->host + off;
        struct copy_op *prev = b->n ? &b->ops[b->n - 1] : NULL;
        if (prev && !sums && prev->map == m && (char *)prev->dev + prev->len == dev &&
            (char *)prev->host + prev->len == (char *)d[i].host && prev->len <= MERGE_MAX) {
            prev->len += d[i].len; /* adjacent on both sides: one larger copy */
            continue;
        }
        atomic_fetch_add(&m->refs, 1);
        b->ops[b->n++] = (struct copy_op){m, dev, d[i].host, d[i].len};
    }
    pthread_rwlock_unlock(&s->lock);
    if (rc) {
        for (size_t i = 0; i < b->n; i++)
            map_put(b->ops[i].map);
        free(b);
        return rc;
    }
    pthread_mutex_lock(&st->mu);
    if (st->tail)
        st->tail->next = b;
    else
        st->head = b;
    st->tail = b;
    st->submitted++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return 0;
}

static int s_sync(struct pf_gpu_stream *sp, uint64_t timeout_ms)
{
    struct simstream *st = pf_container_of(sp, struct simstream, base);
    struct timespec dl = pf_deadline_ms(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    uint64_t target = st->submitted;
    while (st->completed < target) {
        if (pthread_cond_timedwait(&st->cv, &st->mu, &dl) == ETIMEDOUT && st->completed < target) {
            rc = -ETIMEDOUT;
            goto out;
        }
    }
    rc = st->first_err;
    st->first_err = 0;
out:
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void s_close(struct pf_gpu *g)
{
    struct simgpu *s = sg(g);
    for (uint32_t i = 0; i < SIMGPU_MAX_MAPS; i++)
        if (s->maps[i])
            map_put(s->maps[i]);
    while (s->regs) {
        struct simreg *r = s->regs;
        s->regs = r->next;
        free(r);
    }
    for (int i = 0; i < s->ndev; i++)
        pthread_mutex_destroy(&s->devs[i].link_mu);
    pthread_rwlock_destroy(&s->lock);
    free(s);
}

static int s_open(const struct pf_gpu_config *cfg, struct pf_gpu **g_p)
{
    int grc = pf_guard_init();
    if (grc) {
        pf_error("cannot install the SIGBUS guard for client memory: %s", strerror(-grc));
        return grc;
    }
    struct simgpu *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    pthread_rwlock_init(&s->lock, NULL);
    int nnodes = numa_available() >= 0 ? numa_max_node() + 1 : 1;
    size_t n = cfg && cfg->devices
                   ? cfg->ndevices
                   : (size_t)(cfg && cfg->sim_default_devices > 0 ? cfg->sim_default_devices
                                                                  : SIMGPU_DEFAULT_DEVS);
    if (n == 0 || n > SIMGPU_MAX_DEVS) {
        pthread_rwlock_destroy(&s->lock);
        free(s);
        return -EINVAL;
    }
    s->ndev = (int)n;
    for (size_t i = 0; i < n; i++) {
        int idx = cfg && cfg->devices ? cfg->devices[i] : (int)i;
        s->devs[i].index = idx;
        /* spread devices over NUMA nodes in order, as on a real multi-socket host */
        s->devs[i].numa = (int)(i * (size_t)nnodes / n);
        pthread_mutex_init(&s->devs[i].link_mu, NULL);
    }
    s->bw = cfg ? cfg->sim_bandwidth : 0;
    s->base.ops = &simgpu_ops;
    *g_p = &s->base;
    return 0;
}

static const struct pf_gpu_ops simgpu_ops = {
    .name = "sim",
    .device_count = s_count,
    .device_info = s_info,
    .ipc_open = s_ipc_open,
    .ipc_close = s_ipc_close,
    .host_register = s_host_register,
    .host_unregister = s_host_unregister,
    .stream_create = s_stream_create,
    .stream_destroy = s_stream_destroy,
    .copy_batch = s_copy,
    .stream_sync = s_sync,
    .close = s_close,
    .copy_batch_hash = s_copy_hash,
};

static const struct pf_gpu_backend simgpu_backend = {
    .name = "sim",
    .hardware = 0,
    .ops = &simgpu_ops,
    .open = s_open,
};

int pf_simgpu_register(void)
{
    return pf_hal_register_gpu(&simgpu_backend);
}

/* Copy threads per GPU, shared by every instance registered on it: for saves (D2H) and for
 * loads (H2D), each thread with its own HAL stream, bound to the GPU's NUMA node, draining
 * its direction's FIFO of transfer batches. A direction has as many threads as the backend
 * asks for (pf_gpu_dev_info.copy_streams, at least 1, at most PF_COPY_STREAMS_MAX): with
 * two, the next batch is submitted (its descriptors uploaded, its copies or kernel
 * enqueued) while the previous one still drains, so scattered small batches do not leave
 * the copy engine idle between them. Batches of one direction may therefore complete out
 * of order: every caller waits for each of its own batches (save_copy chunk by chunk, a
 * Load's one batch). The thread count is fixed by the devices in use, never by how many
 * instances clients register. A batch is submitted with one copy_batch call and
 * synchronised once (a cancellable one, in chunks: see run_batch); the stream wait is bounded
 * (PF_XFER_MAX_MS): a copy that never completes fails the batch with -ETIMEDOUT, and its host
 * memory is deliberately leaked rather than freed under a possibly still running DMA.
 *
 * Each instance's worker is a lane: a handle counting its batches in flight, so that
 * unregistering one instance waits only for its own batches (its GPU mappings close after)
 * while the device threads keep serving the others. Devices are refcounted by lanes in a
 * process-wide table keyed by (gpu, hal device); the last lane stops the threads. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "gpu-worker"
#include "engine/engine_internal.h"
#include "pf/clock.h"
#include "pf/log.h"

#define PF_XFER_MAX_MS 120000

struct gpu_dev;

/* One direction of a device: its queue and the threads (one stream each) that drain it. */
struct copy_thread {
    struct gpu_dev *d;
    pthread_t thr[PF_COPY_STREAMS_MAX];
    size_t nthr; /* threads started */
    struct pf_queue q;
    bool started;
    enum pf_copy_dir dir;
};

struct gpu_dev {
    struct gpu_dev *next; /* devs list, under devs_mu */
    int refs;             /* lanes, under devs_mu */
    struct pf_gpu *gpu;
    int hal_dev;
    int numa;
    int32_t device_id;    /* the first lane's, for logs */
    _Atomic bool no_hash; /* the backend answered copy_batch_hash with -EOPNOTSUPP */
    struct copy_thread save, load;
};

struct pf_gpu_worker {
    struct gpu_dev *d;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t pending; /* batches queued or running */
};

/* a queued batch and the lane it belongs to */
struct lane_item {
    struct pf_xfer *x;
    struct pf_gpu_worker *lane;
};

static pthread_mutex_t devs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gpu_dev *devs;

struct pf_xfer *pf_xfer_new(enum pf_copy_dir dir, enum pf_copy_mode mode, size_t ndescs)
{
    struct pf_xfer *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    x->descs = calloc(ndescs ? ndescs : 1, sizeof(*x->descs));
    if (!x->descs) {
        free(x);
        return NULL;
    }
    atomic_init(&x->refs, 1);
    x->dir = dir;
    x->mode = mode;
    pthread_mutex_init(&x->mu, NULL);
    pf_cond_init(&x->cv);
    return x;
}

void pf_xfer_put(struct pf_xfer *x)
{
    if (!x || atomic_fetch_sub(&x->refs, 1) != 1)
        return;
    if (x->free_fn)
        x->free_fn(x);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free((void *)x->hjoin);
    free(x->hsums);
    free(x->descs);
    free(x);
}

int pf_xfer_wait(struct pf_xfer *x, uint64_t timeout_ms)
{
    struct timespec dl = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&x->mu);
    while (!x->done) {
        if (pthread_cond_timedwait(&x->cv, &x->mu, &dl) == ETIMEDOUT && !x->done) {
            pthread_mutex_unlock(&x->mu);
            return -ETIMEDOUT;
        }
    }
    int rc = x->result;
    pthread_mutex_unlock(&x->mu);
    return rc;
}

/* Submits descs[0..n) and waits for them (bounded by PF_XFER_MAX_MS). The whole batch of
 * a transfer with hsums goes through the backend's fused copy + hash when it has one. */
static int run_chunk(struct gpu_dev *d, struct pf_gpu_stream *s, struct pf_xfer *x,
                     struct pf_copy_desc *descs, size_t n)
{
    int rc = -EOPNOTSUPP;
    if (x->hsums && descs == x->descs && n == x->n &&
        !atomic_load_explicit(&d->no_hash, memory_order_relaxed)) {
        rc = pf_gpu_copy_batch_hash(s, x->dir, x->mode, descs, n, x->hjoin, x->hsums);
        if (rc == -EOPNOTSUPP)
            atomic_store_explicit(&d->no_hash, true, memory_order_relaxed);
        x->hashed = rc == 0;
    }
    if (rc == -EOPNOTSUPP)
        rc = pf_gpu_copy_batch(s, x->dir, x->mode, descs, n);
    /* even after a submission error part of the batch may be queued: always sync */
    uint64_t waited = 0;
    int src;
    while ((src = pf_gpu_stream_sync(s, 1000)) == -ETIMEDOUT) {
        waited += 1000;
        if (waited >= PF_XFER_MAX_MS) {
            pf_error("GPU %d: %s batch of %zu copies did not complete in %d s; its host memory "
                     "is leaked to stay safe",
                     s->device, x->dir == PF_COPY_D2H ? "D2H" : "H2D", n, PF_XFER_MAX_MS / 1000);
            return -ETIMEDOUT;
        }
    }
    return rc ? rc : src;
}

size_t pf_xfer_chunk_end(const struct pf_xfer *x, size_t i)
{
    size_t j = i;
    uint64_t bytes = 0, want = x->chunk_bytes ? x->chunk_bytes : PF_XFER_CHUNK_BYTES;
    while (j < x->n && j - i < PF_XFER_CHUNK_MAX && (j - i < PF_XFER_CHUNK || bytes < want))
        bytes += x->descs[j++].len;
    return j;
}

/* A cancellable batch (cancel_fn) goes in chunks (pf_xfer_chunk_end), each synchronised
 * before the next is asked for: once cancel_fn said yes nothing more is submitted, and
 * everything submitted has completed when the batch returns. */
static int run_batch(struct gpu_dev *d, struct pf_gpu_stream *s, struct pf_xfer *x)
{
    x->hashed = false;
    if (x->n == 0)
        return 0;
    if (!x->cancel_fn)
        return run_chunk(d, s, x, x->descs, x->n);
    for (size_t i = 0; i < x->n;) {
        if (x->cancel_fn(x))
            return -ECANCELED;
        size_t end = pf_xfer_chunk_end(x, i);
        int rc = run_chunk(d, s, x, x->descs + i, end - i);
        if (rc)
            return rc;
        i = end;
    }
    return 0;
}

static void lane_done(struct pf_gpu_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->pending--;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu); /* last access: the lane may be freed after this */
}

static void *copy_main(void *arg)
{
    struct copy_thread *t = arg;
    struct gpu_dev *d = t->d;
    struct pf_gpu_stream *s = NULL;
    int srs = pf_gpu_stream_create(d->gpu, d->hal_dev, &s);
    if (srs)
        pf_error("GPU %d: cannot create a copy stream: %s", d->device_id, strerror(-srs));
    for (;;) {
        void *item;
        if (pf_queue_pop(&t->q, &item, UINT64_MAX) != 0)
            break;
        struct lane_item *li = item;
        struct pf_xfer *x = li->x;
        struct pf_gpu_worker *lane = li->lane;
        free(li);
        int rc = s ? run_batch(d, s, x) : srs;
        if (rc && rc != -ETIMEDOUT && rc != -ECANCELED)
            pf_warn("GPU %d: %s batch of %zu copies failed: %s", d->device_id,
                    x->dir == PF_COPY_D2H ? "D2H" : "H2D", x->n, strerror(-rc));
        pthread_mutex_lock(&x->mu);
        x->result = rc;
        pthread_mutex_unlock(&x->mu);
        if (x->done_fn)
            x->done_fn(x);
        pthread_mutex_lock(&x->mu);
        x->done = true;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        if (rc != -ETIMEDOUT)
            pf_xfer_put(x);
        /* a timed-out batch keeps its reference: its memory must never be reused */
        lane_done(lane);
    }
    pf_gpu_stream_destroy(s);
    return NULL;
}

static int thread_start(struct gpu_dev *d, struct copy_thread *t, enum pf_copy_dir dir, size_t nthr)
{
    t->d = d;
    t->dir = dir;
    t->nthr = 0;
    int rc = pf_queue_init(&t->q, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < nthr; i++) {
        char name[32]; /* pf_thread_start keeps the first 15 bytes (the kernel's limit) */
        snprintf(name, sizeof(name), "%s-gpu%d.%u", dir == PF_COPY_D2H ? "save" : "load",
                 (int)(d->device_id & 0xffff), (unsigned)(i & 0xf));
        rc = pf_thread_start(&t->thr[i], name, d->numa, copy_main, t);
        if (rc)
            goto err_threads;
        t->nthr++;
    }
    t->started = true;
    return 0;
err_threads:
    pf_queue_close(&t->q);
    for (size_t i = 0; i < t->nthr; i++)
        pthread_join(t->thr[i], NULL);
    pf_queue_destroy(&t->q);
    return rc;
}

static void thread_stop(struct copy_thread *t)
{
    if (!t->started)
        return;
    pf_queue_close(&t->q);
    for (size_t i = 0; i < t->nthr; i++)
        pthread_join(t->thr[i], NULL);
    pf_queue_destroy(&t->q);
    t->started = false;
}

/* Streams per direction the backend asks for, clamped to [1, PF_COPY_STREAMS_MAX]. */
static size_t copy_streams(struct pf_gpu *gpu, int hal_dev)
{
    struct pf_gpu_dev_info info;
    if (pf_gpu_device_info(gpu, hal_dev, &info) != 0 || info.copy_streams < 1)
        return 1;
    return info.copy_streams > PF_COPY_STREAMS_MAX ? PF_COPY_STREAMS_MAX
                                                   : (size_t)info.copy_streams;
}

/* The shared device of (gpu, hal_dev), started on first use; under devs_mu. */
static int dev_get_locked(struct pf_gpu *gpu, int hal_dev, int numa, int32_t device_id,
                          struct gpu_dev **d_p)
{
    for (struct gpu_dev *d = devs; d; d = d->next)
        if (d->gpu == gpu && d->hal_dev == hal_dev) {
            d->refs++;
            *d_p = d;
            return 0;
        }
    struct gpu_dev *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->gpu = gpu;
    d->hal_dev = hal_dev;
    d->numa = numa;
    d->device_id = device_id;
    size_t nthr = copy_streams(gpu, hal_dev);
    int rc = thread_start(d, &d->save, PF_COPY_D2H, nthr);
    if (rc)
        goto err_free;
    rc = thread_start(d, &d->load, PF_COPY_H2D, nthr);
    if (rc)
        goto err_save;
    d->refs = 1;
    d->next = devs;
    devs = d;
    *d_p = d;
    return 0;
err_save:
    thread_stop(&d->save);
err_free:
    free(d);
    return rc;
}

int pf_gpu_worker_create(struct pf_gpu *gpu, int hal_dev, int numa, int32_t device_id,
                         struct pf_gpu_worker **w_p)
{
    struct pf_gpu_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    pthread_mutex_init(&w->mu, NULL);
    int rc = pf_cond_init(&w->cv);
    if (rc)
        goto err_mu;
    pthread_mutex_lock(&devs_mu);
    rc = dev_get_locked(gpu, hal_dev, numa, device_id, &w->d);
    pthread_mutex_unlock(&devs_mu);
    if (rc)
        goto err_cv;
    *w_p = w;
    return 0;
err_cv:
    pthread_cond_destroy(&w->cv);
err_mu:
    pthread_mutex_destroy(&w->mu);
    free(w);
    return rc;
}

void pf_gpu_worker_destroy(struct pf_gpu_worker *w)
{
    if (!w)
        return;
    /* this lane's batches first: each is bounded by PF_XFER_MAX_MS on its stream */
    pthread_mutex_lock(&w->mu);
    while (w->pending > 0)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    struct gpu_dev *d = w->d, *gone = NULL;
    pthread_mutex_lock(&devs_mu);
    if (--d->refs == 0) {
        for (struct gpu_dev **pp = &devs; *pp; pp = &(*pp)->next)
            if (*pp == d) {
                *pp = d->next;
                break;
            }
        gone = d;
    }
    pthread_mutex_unlock(&devs_mu);
    if (gone) {
        thread_stop(&gone->save);
        thread_stop(&gone->load);
        free(gone);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int pf_gpu_worker_submit(struct pf_gpu_worker *w, struct pf_xfer *x)
{
    struct copy_thread *t = x->dir == PF_COPY_D2H ? &w->d->save : &w->d->load;
    struct lane_item *li = malloc(sizeof(*li));
    if (!li)
        return -ENOMEM;
    *li = (struct lane_item){x, w};
    atomic_fetch_add(&x->refs, 1);
    pthread_mutex_lock(&w->mu);
    w->pending++;
    pthread_mutex_unlock(&w->mu);
    int rc = pf_queue_push(&t->q, li);
    if (rc) {
        atomic_fetch_sub(&x->refs, 1);
        free(li);
        pthread_mutex_lock(&w->mu);
        w->pending--;
        pthread_mutex_unlock(&w->mu);
    }
    return rc;
}

bool pf_gpu_worker_can_hash(const struct pf_gpu_worker *w)
{
    return !atomic_load_explicit(&w->d->no_hash, memory_order_relaxed);
}

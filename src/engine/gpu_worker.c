/* Per-(instance, GPU) copy threads: one for saves (D2H), one for loads (H2D), each with its
 * own HAL stream, bound to the GPU's NUMA node, draining an unbounded FIFO of transfer
 * batches. A batch is submitted with one copy_batch call and synchronised once; the
 * stream wait is bounded (PF_XFER_MAX_MS): a copy that never completes fails the batch
 * with -ETIMEDOUT, and its host memory is deliberately leaked rather than freed under a
 * possibly still running DMA. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "gpu-worker"
#include "engine/engine_internal.h"
#include "pf/clock.h"
#include "pf/log.h"

#define PF_XFER_MAX_MS 120000

struct copy_thread {
    struct pf_gpu_worker *w;
    pthread_t thr;
    struct pf_queue q;
    bool started;
    enum pf_copy_dir dir;
};

struct pf_gpu_worker {
    struct pf_gpu *gpu;
    int hal_dev;
    int numa;
    int32_t device_id;
    struct copy_thread save, load;
};

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

static int run_batch(struct pf_gpu_stream *s, struct pf_xfer *x)
{
    if (x->n == 0)
        return 0;
    int rc = pf_gpu_copy_batch(s, x->dir, x->mode, x->descs, x->n);
    /* even after a submission error part of the batch may be queued: always sync */
    uint64_t waited = 0;
    int src;
    while ((src = pf_gpu_stream_sync(s, 1000)) == -ETIMEDOUT) {
        waited += 1000;
        if (waited >= PF_XFER_MAX_MS) {
            pf_error("GPU %d: %s batch of %zu copies did not complete in %d s; its host memory "
                     "is leaked to stay safe",
                     s->device, x->dir == PF_COPY_D2H ? "D2H" : "H2D", x->n, PF_XFER_MAX_MS / 1000);
            return -ETIMEDOUT;
        }
    }
    return rc ? rc : src;
}

static void *copy_main(void *arg)
{
    struct copy_thread *t = arg;
    struct pf_gpu_worker *w = t->w;
    struct pf_gpu_stream *s = NULL;
    int srs = pf_gpu_stream_create(w->gpu, w->hal_dev, &s);
    if (srs)
        pf_error("GPU %d: cannot create a copy stream: %s", w->device_id, strerror(-srs));
    for (;;) {
        void *item;
        if (pf_queue_pop(&t->q, &item, UINT64_MAX) != 0)
            break;
        struct pf_xfer *x = item;
        int rc = s ? run_batch(s, x) : srs;
        if (rc && rc != -ETIMEDOUT)
            pf_warn("GPU %d: %s batch of %zu copies failed: %s", w->device_id,
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
    }
    pf_gpu_stream_destroy(s);
    return NULL;
}

static int thread_start(struct pf_gpu_worker *w, struct copy_thread *t, enum pf_copy_dir dir)
{
    t->w = w;
    t->dir = dir;
    int rc = pf_queue_init(&t->q, 0);
    if (rc)
        return rc;
    char name[16];
    snprintf(name, sizeof(name), "%s-gpu%d", dir == PF_COPY_D2H ? "save" : "load", w->device_id);
    rc = pf_thread_start(&t->thr, name, w->numa, copy_main, t);
    if (rc) {
        pf_queue_destroy(&t->q);
        return rc;
    }
    t->started = true;
    return 0;
}

static void thread_stop(struct copy_thread *t)
{
    if (!t->started)
        return;
    pf_queue_close(&t->q);
    pthread_join(t->thr, NULL);
    pf_queue_destroy(&t->q);
    t->started = false;
}

int pf_gpu_worker_create(struct pf_gpu *gpu, int hal_dev, int numa, int32_t device_id,
                         struct pf_gpu_worker **w_p)
{
    struct pf_gpu_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->gpu = gpu;
    w->hal_dev = hal_dev;
    w->numa = numa;
    w->device_id = device_id;
    int rc = thread_start(w, &w->save, PF_COPY_D2H);
    if (rc)
        goto err_free;
    rc = thread_start(w, &w->load, PF_COPY_H2D);
    if (rc)
        goto err_save;
    *w_p = w;
    return 0;
err_save:
    thread_stop(&w->save);
err_free:
    free(w);
    return rc;
}

void pf_gpu_worker_destroy(struct pf_gpu_worker *w)
{
    if (!w)
        return;
    thread_stop(&w->save);
    thread_stop(&w->load);
    free(w);
}

int pf_gpu_worker_submit(struct pf_gpu_worker *w, struct pf_xfer *x)
{
    struct copy_thread *t = x->dir == PF_COPY_D2H ? &w->save : &w->load;
    atomic_fetch_add(&x->refs, 1);
    int rc = pf_queue_push(&t->q, x);
    if (rc)
        atomic_fetch_sub(&x->refs, 1);
    return rc;
}

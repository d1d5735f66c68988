/* Thread start helper with names and NUMA binding; the pointer FIFO used by every
 * background worker (insert thread, SSD writer, MetaServer client, load threads). */
#include <errno.h>
#include <numa.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "pf/clock.h"
#include "pf/log.h"
#include "pf/thread.h"

struct start_ctx {
    void *(*fn)(void *);
    void *arg;
    char name[16];
    int numa;
};

static void *trampoline(void *p)
{
    struct start_ctx c = *(struct start_ctx *)p;
    free(p);
    pthread_setname_np(pthread_self(), c.name);
    if (c.numa >= 0)
        pf_thread_bind_numa(c.numa);
    return c.fn(c.arg);
}

int pf_thread_start(pthread_t *t_p, const char *name, int numa_node, void *(*fn)(void *), void *arg)
{
    struct start_ctx *c = malloc(sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->fn = fn;
    c->arg = arg;
    c->numa = numa_node;
    snprintf(c->name, sizeof(c->name), "%s", name);
    int rc = pthread_create(t_p, NULL, trampoline, c);
    if (rc) {
        free(c);
        return -rc;
    }
    return 0;
}

/* libnuma caches node CPU masks lazily without locking: serialize our calls into it. */
static pthread_mutex_t numa_mu = PTHREAD_MUTEX_INITIALIZER;

int pf_thread_bind_numa(int node)
{
    if (numa_available() < 0 || node < 0 || node > numa_max_node())
        return -EINVAL;
    pthread_mutex_lock(&numa_mu);
    int rc = numa_run_on_node(node);
    int e = errno;
    if (rc == 0)
        numa_set_preferred(node);
    pthread_mutex_unlock(&numa_mu);
    if (rc != 0) {
        pf_log_ratelimited(PF_LOG_WARN, 60000, "cannot bind thread to NUMA node %d: %s", node,
                           strerror(e));
        return -e;
    }
    return 0;
}

int pf_queue_init(struct pf_queue *q, size_t cap)
{
    memset(q, 0, sizeof(*q));
    q->cap = cap;
    q->size = cap ? cap : 64;
    q->ring = calloc(q->size, sizeof(void *));
    if (!q->ring)
        return -ENOMEM;
    pthread_mutex_init(&q->mu, NULL);
    int rc = pf_cond_init(&q->not_empty);
    if (rc) {
        free(q->ring);
        pthread_mutex_destroy(&q->mu);
        return rc;
    }
    return 0;
}

void pf_queue_destroy(struct pf_queue *q)
{
    if (!q || !q->ring)
        return;
    free(q->ring);
    q->ring = NULL;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->not_empty);
}

static int grow(struct pf_queue *q)
{
    size_t ns = q->size * 2;
    void **nr = malloc(ns * sizeof(void *));
    if (!nr)
        return -ENOMEM;
    for (size_t i = 0; i < q->count; i++)
        nr[i] = q->ring[(q->head + i) % q->size];
    free(q->ring);
    q->ring = nr;
    q->size = ns;
    q->head = 0;
    return 0;
}

int pf_queue_push(struct pf_queue *q, void *item)
{
    int rc = 0;
    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    if (q->count == q->size) {
        if (q->cap) {
            rc = -EAGAIN;
            goto out;
        }
        rc = grow(q);
        if (rc)
            goto out;
    }
    q->ring[(q->head + q->count) % q->size] = item;
    q->count++;
    pthread_cond_signal(&q->not_empty);
out:
    pthread_mutex_unlock(&q->mu);
    return rc;
}

int pf_queue_pop(struct pf_queue *q, void **item_p, uint64_t timeout_ms)
{
    int rc = 0;
    struct timespec dl = pf_deadline_ms(timeout_ms == UINT64_MAX ? 0 : timeout_ms);
    pthread_mutex_lock(&q->mu);
    while (q->count == 0) {
        if (q->closed) {
            rc = -ESHUTDOWN;
            goto out;
        }
        if (timeout_ms == UINT64_MAX) {
            pthread_cond_wait(&q->not_empty, &q->mu);
        } else if (pthread_cond_timedwait(&q->not_empty, &q->mu, &dl) == ETIMEDOUT) {
            if (q->count == 0) {
                rc = q->closed ? -ESHUTDOWN : -ETIMEDOUT;
                goto out;
            }
        }
    }
    *item_p = q->ring[q->head];
    q->head = (q->head + 1) % q->size;
    q->count--;
out:
    pthread_mutex_unlock(&q->mu);
    return rc;
}

size_t pf_queue_drain(struct pf_queue *q, void **out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&q->mu);
    while (n < max && q->count > 0) {
        out[n++] = q->ring[q->head];
        q->head = (q->head + 1) % q->size;
        q->count--;
    }
    pthread_mutex_unlock(&q->mu);
    return n;
}

size_t pf_queue_len(struct pf_queue *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->count;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void pf_queue_close(struct pf_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->not_empty);
    pthread_mutex_unlock(&q->mu);
}

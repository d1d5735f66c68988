/* Prefetch tasks: when a prefix query misses in RAM and a backing tier may hold the rest,
 * a task keyed by (instance, req_id) fetches it in the background (a small pool of prefetch
 * threads) while queries for that req_id answer Loading. The next query after completion consumes
 * the task (query.c promotes the blocks and creates the lease). Tasks are refcounted
 * between the registry and the worker running them, so a task dropped by the stale GC
 * while a fetch is still running is freed when the fetch returns. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "prefetch"
#include "engine/engine_internal.h"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/util.h"

/* Tasks are keyed by (instance, req_id): request ids are only unique within one vLLM
 * instance, and a task's blocks belong to that instance's namespace. */
static uint64_t req_hash(const char *instance, const char *req_id)
{
    uint64_t a = pf_hash64(instance, strlen(instance)), b = pf_hash64(req_id, strlen(req_id));
    return a ^ (b * 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
}

static uint64_t blocks_bytes(struct pf_block *const *b, size_t n)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += b[i] ? pf_block_footprint(b[i]) : 0;
    return sum;
}

/* Adds add and takes sub from the pinned-bytes gauge. */
static void pinned_add(struct pf_engine *e, uint64_t add, uint64_t sub)
{
    uint64_t v = add ? atomic_fetch_add(&e->pf_pinned, add) + add
                     : atomic_fetch_sub(&e->pf_pinned, sub) - sub;
    pf_metric_set(e->m_pf_pinned, (double)v);
}

void pf_prefetch_task_put(struct pf_prefetch_task *t)
{
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    if (t->pinned && t->e)
        pinned_add(t->e, 0, t->pinned);
    for (size_t i = 0; i < t->nprefix; i++)
        pf_block_put(t->prefix[i]);
    for (size_t i = 0; i < t->nfetched; i++)
        pf_block_put(t->fetched[i]);
    free(t->prefix);
    free(t->fetched);
    free(t->keys);
    free(t->req_id);
    free(t->instance);
    free(t);
}

static struct pf_prefetch_task *find_locked(struct pf_engine *e, const char *instance,
                                            const char *req_id)
{
    uint64_t h = req_hash(instance, req_id);
    struct pf_hnode *n;
    pf_htable_for_each_hash(&e->pf_tasks, n, h)
    {
        struct pf_prefetch_task *t = pf_container_of(n, struct pf_prefetch_task, hnode);
        if (strcmp(t->req_id, req_id) == 0 && strcmp(t->instance, instance) == 0)
            return t;
    }
    return NULL;
}

int pf_prefetch_probe(struct pf_engine *e, const char *req_id, const struct pf_block_key *keys,
                      size_t n, bool wait_full, size_t *count_p)
{
    for (size_t i = 0; i < e->ntiers; i++) {
        size_t c = e->tiers[i].probe(e->tiers[i].ctx, req_id, keys, n, wait_full);
        if (c > 0 && (!wait_full || c == n)) {
            *count_p = c;
            return (int)i;
        }
    }
    return -1;
}

static void run_task(struct pf_engine *e, struct pf_prefetch_task *t)
{
    struct pf_block **out = calloc(t->n, sizeof(*out));
    size_t got = 0;
    int tier = -1;
    if (out) {
        for (size_t i = 0; i < e->ntiers && got == 0; i++) {
            struct pf_tier *tr = &e->tiers[i];
            if (tr->probe(tr->ctx, t->req_id, t->keys, t->n, t->wait_full) == 0)
                continue;
            got = tr->fetch(tr->ctx, t->req_id, t->keys, t->n, t->wait_full, out);
            if (got > t->n)
                got = t->n;
            if (got)
                tier = (int)i;
        }
    }
    uint64_t fb = blocks_bytes(out, got);
    pthread_mutex_lock(&e->pf_mu);
    t->fetched = out;
    t->nfetched = got;
    t->tier = tier;
    t->done = true;
    t->done_ns = pf_now_ns();
    t->pinned += fb;
    pthread_mutex_unlock(&e->pf_mu);
    pinned_add(e, fb, 0);
    pf_debug("prefetch %s: %zu of %zu block(s) from %s", t->req_id, got, t->n,
             tier >= 0 ? e->tiers[tier].name : "no tier");
}

static void *worker_main(void *arg)
{
    struct pf_engine *e = arg;
    for (;;) {
        void *item;
        if (pf_queue_pop(&e->pf_q, &item, UINT64_MAX) != 0)
            break;
        struct pf_prefetch_task *t = item;
        run_task(e, t);
        pf_prefetch_task_put(t);
    }
    return NULL;
}

int pf_prefetch_take(struct pf_engine *e, const char *instance, const char *req_id,
                     struct pf_prefetch_task **task_p)
{
    int r = 0;
    pthread_mutex_lock(&e->pf_mu);
    struct pf_prefetch_task *t = find_locked(e, instance, req_id);
    if (t && !t->done) {
        r = 1;
    } else if (t) {
        pf_htable_remove(&e->pf_tasks, &t->hnode);
        t->attached = false; /* the registry's reference passes to the caller */
        *task_p = t;
        r = 2;
    }
    pthread_mutex_unlock(&e->pf_mu);
    return r;
}

int pf_prefetch_begin(struct pf_engine *e, const char *instance, const char *req_id,
                      const struct pf_block_key *keys, size_t n, struct pf_block **prefix,
                      size_t nprefix, bool wait_full)
{
    struct pf_prefetch_task *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->req_id = strdup(req_id);
    t->instance = strdup(instance);
    t->keys = malloc(n * sizeof(*keys));
    t->prefix = malloc((nprefix ? nprefix : 1) * sizeof(*prefix));
    if (!t->req_id || !t->instance || !t->keys || !t->prefix) {
        free(t->req_id);
        free(t->instance);
        free(t->keys);
        free(t->prefix);
        free(t);
        return -ENOMEM;
    }
    memcpy(t->keys, keys, n * sizeof(*keys));
    memcpy(t->prefix, prefix, nprefix * sizeof(*prefix));
    t->n = n;
    t->nprefix = nprefix;
    t->wait_full = wait_full;
    t->created_ns = pf_now_ns();
    t->e = e;
    atomic_init(&t->refs, 2); /* registry + worker */
    pthread_mutex_lock(&e->pf_mu);
    if (find_locked(e, instance, req_id)) {
        pthread_mutex_unlock(&e->pf_mu);
        t->nprefix = 0; /* references stay with the caller */
        atomic_store(&t->refs, 1);
        pf_prefetch_task_put(t);
        return -EEXIST;
    }
    t->attached = true;
    t->pinned = blocks_bytes(prefix, nprefix);
    pf_htable_insert(&e->pf_tasks, &t->hnode, req_hash(instance, req_id));
    pthread_mutex_unlock(&e->pf_mu);
    pinned_add(e, t->pinned, 0);
    int rc = pf_queue_push(&e->pf_q, t);
    if (rc) {
        pthread_mutex_lock(&e->pf_mu);
        pf_htable_remove(&e->pf_tasks, &t->hnode);
        pthread_mutex_unlock(&e->pf_mu);
        t->nprefix = 0;
        atomic_store(&t->refs, 1);
        pf_prefetch_task_put(t);
        return rc;
    }
    return 0;
}

size_t pf_prefetch_gc(struct pf_engine *e, uint64_t max_age_ns, const char *instance)
{
    uint64_t now = pf_now_ns();
    struct pf_prefetch_task *drop[64];
    size_t n = 0, total = 0;
    do {
        n = 0;
        pthread_mutex_lock(&e->pf_mu);
        for (size_t b = 0; e->pf_tasks.buckets && b <= e->pf_tasks.mask && n < 64; b++) {
            struct pf_hnode *h = e->pf_tasks.buckets[b];
            while (h && n < 64) {
                struct pf_hnode *next = h->next;
                struct pf_prefetch_task *t = pf_container_of(h, struct pf_prefetch_task, hnode);
                bool unpolled = t->done && now - t->done_ns >= PF_PREFETCH_UNPOLLED_NS;
                bool mine = instance && strcmp(t->instance, instance) == 0;
                if (now - t->created_ns >= max_age_ns || unpolled || mine) {
                    pf_htable_remove(&e->pf_tasks, h);
                    t->attached = false;
                    drop[n++] = t;
                }
                h = next;
            }
        }
        pthread_mutex_unlock(&e->pf_mu);
        for (size_t i = 0; i < n; i++)
            pf_prefetch_task_put(drop[i]);
        total += n;
    } while (n == 64);
    if (total) {
        pf_metric_add(e->m_stale_gc, (double)total);
        if (instance)
            pf_info("dropped %zu prefetch task(s) of instance %s", total, instance);
        else
            pf_info("dropped %zu prefetch task(s) nobody collected", total);
    }
    return total;
}

int pf_prefetch_start(struct pf_engine *e)
{
    pthread_mutex_init(&e->pf_mu, NULL);
    e->m_stale_gc = pf_metric_counter("pegaflow_prefetch_stale_gc_total",
                                      "Stale prefetch entries removed by background GC", NULL);
    e->m_pf_pinned =
        pf_metric_gauge("pegaflow_prefetch_pinned_bytes",
                        "Bytes of cached blocks held by prefetch tasks not yet collected", NULL);
    int rc = pf_htable_init(&e->pf_tasks, 64);
    if (rc)
        return rc;
    rc = pf_queue_init(&e->pf_q, 0);
    if (rc) {
        pf_htable_destroy(&e->pf_tasks);
        return rc;
    }
    for (size_t i = 0; i < PF_PREFETCH_THREADS; i++) {
        if (pf_thread_start(&e->pf_thr[i], "pegaflow-prefch", -1, worker_main, e) != 0)
            break;
        e->pf_nthr++;
    }
    return e->pf_nthr ? 0 : -EAGAIN;
}

void pf_prefetch_stop(struct pf_engine *e)
{
    pf_queue_close(&e->pf_q);
    for (size_t i = 0; i < e->pf_nthr; i++)
        pthread_join(e->pf_thr[i], NULL);
    pf_prefetch_gc(e, 0, NULL);
    pf_queue_destroy(&e->pf_q);
    pf_htable_destroy(&e->pf_tasks);
    pthread_mutex_destroy(&e->pf_mu);
}

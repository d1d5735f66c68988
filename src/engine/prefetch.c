/* Prefetch tasks: when a prefix query misses in RAM, pf_prefetch_plan decides at query time
 * which tier serves which run of the rest (own SSD before peers, the MetaServer asked once
 * with a short deadline); a plan with anything beyond RAM starts a task keyed by
 * (instance, req_id) that executes it in the background while queries for that req_id answer
 * Loading. Runs of local tiers execute on the local pool, runs of remote tiers on the remote
 * pool (separate threads behind separate bounded queues); a task moves between them as its
 * runs change tier. A short answer falls back, for exactly the blocks still missing, to the
 * next holder and then to the local tiers (or from the SSD to a holder); execution stops at
 * the first block nobody delivered, so nothing beyond the contiguous prefix is fetched. The
 * next query after completion consumes the task (query.c promotes the blocks and creates the
 * lease). Tasks are refcounted between the registry and the worker running them, so a task
 * dropped by the stale GC while a fetch is still running is freed when the fetch returns. */
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
    for (size_t i = 0; t->work && i < t->pos; i++)
        pf_block_put(t->work[i]);
    free(t->prefix);
    free(t->fetched);
    free(t->fetched_tier);
    free(t->work);
    free(t->work_tier);
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

static bool tier_remote(const struct pf_tier *t)
{
    return t->discover != NULL;
}

/* The first local tier (registration order) holding keys[0]: its index and run length. */
static int local_run(struct pf_engine *e, const char *req_id, const struct pf_block_key *keys,
                     size_t n, bool wait_full, size_t *len_p)
{
    for (size_t i = 0; i < e->ntiers; i++) {
        const struct pf_tier *t = &e->tiers[i];
        if (tier_remote(t) || !t->probe)
            continue;
        size_t c = t->probe(t->ctx, req_id, keys, n, wait_full);
        if (c > 0) {
            *len_p = c < n ? c : n;
            return (int)i;
        }
    }
    return -1;
}

static int remote_tier(const struct pf_engine *e)
{
    for (size_t i = 0; i < e->ntiers; i++)
        if (tier_remote(&e->tiers[i]))
            return (int)i;
    return -1;
}

/* How far from pos the live holders (not down, not failed) reach: 0 when none holds pos. */
static size_t remote_reach(const struct pf_tier_source *src, size_t nsrc, const bool *failed,
                           size_t pos)
{
    size_t best = 0;
    for (size_t k = 0; k < nsrc; k++)
        if (!src[k].down && !(failed && failed[k]) && src[k].len > pos && src[k].len > best)
            best = src[k].len;
    return best;
}

bool pf_prefetch_plan_start(struct pf_engine *e, const char *req_id,
                            const struct pf_block_key *keys, size_t n, struct pf_plan *plan)
{
    memset(plan, 0, sizeof(*plan));
    int remote = remote_tier(e);
    if (remote < 0 || !e->tiers[remote].discover_start)
        return false;
    const struct pf_tier *t = &e->tiers[remote];
    plan->dop = t->discover_start(t->ctx, req_id, keys, n);
    plan->dstarted = true;
    return plan->dop != NULL;
}

void pf_prefetch_plan(struct pf_engine *e, const char *req_id, const struct pf_block_key *keys,
                      size_t n, bool wait_full, struct pf_plan *plan)
{
    int remote = remote_tier(e);
    bool avail = false;
    if (remote >= 0) {
        const struct pf_tier *t = &e->tiers[remote];
        int r = !plan->dstarted
                    ? t->discover(t->ctx, req_id, keys, n, plan->src, PF_TIER_SOURCES_MAX)
                : plan->dop ? t->discover_finish(t->ctx, plan->dop, plan->src, PF_TIER_SOURCES_MAX)
                            : -1;
        plan->dop = NULL;
        if (r >= 0) {
            avail = true;
            plan->nsrc = (size_t)r < PF_TIER_SOURCES_MAX ? (size_t)r : PF_TIER_SOURCES_MAX;
        }
    }
    size_t pos = 0;
    /* half the segments for the plan, the rest for fallbacks during execution */
    while (pos < n && plan->nsegs < PF_PLAN_SEGS_MAX / 2) {
        size_t len = 0;
        int tier = local_run(e, req_id, keys + pos, n - pos, wait_full, &len);
        if (tier < 0 && remote >= 0) {
            size_t reach = remote_reach(plan->src, plan->nsrc, NULL, pos);
            if (reach) {
                tier = remote;
                len = (reach < n ? reach : n) - pos;
            }
        }
        if (tier < 0)
            break;
        plan->segs[plan->nsegs++] =
            (struct pf_plan_seg){(uint32_t)pos, (uint32_t)(pos + len), (int8_t)tier, false, false};
        plan->planned[tier] += (uint32_t)len;
        pos += len;
    }
    plan->covered = pos;
    if (!wait_full || pos == n)
        return;
    /* all or nothing: the local runs from the start, then (discovery available) one run of
     * the remote tier waiting for a holder of the whole rest; else nothing */
    size_t keep = 0, upto = 0;
    while (keep < plan->nsegs && plan->segs[keep].tier != remote) {
        upto = plan->segs[keep].end;
        keep++;
    }
    memset(plan->planned, 0, sizeof(plan->planned));
    if (!avail) {
        plan->nsegs = 0;
        plan->covered = 0;
        return;
    }
    plan->nsegs = keep;
    for (size_t i = 0; i < keep; i++)
        plan->planned[plan->segs[i].tier] += plan->segs[i].end - plan->segs[i].start;
    plan->segs[plan->nsegs++] =
        (struct pf_plan_seg){(uint32_t)upto, (uint32_t)n, (int8_t)remote, true, false};
    plan->planned[remote] += (uint32_t)(n - upto);
    plan->covered = n;
}

size_t pf_engine_fill_local(struct pf_engine *e, const struct pf_block_key *keys, size_t n,
                            uint64_t timeout_ms, struct pf_block **out, size_t *held_p)
{
    if (held_p)
        *held_p = 0;
    const struct pf_tier *t = NULL;
    size_t held = 0;
    for (size_t i = 0; i < e->ntiers && n; i++) {
        const struct pf_tier *c = &e->tiers[i];
        if (tier_remote(c) || !c->probe || !c->fetch_within)
            continue;
        held = c->probe(c->ctx, "", keys, n, false);
        if (held) {
            t = c;
            break;
        }
    }
    if (!t)
        return 0;
    held = held < n ? held : n;
    if (held_p)
        *held_p = held;
    size_t got = t->fetch_within(t->ctx, keys, held, timeout_ms, out);
    if (got > held)
        got = held;
    struct pf_block **fresh = malloc((got ? got : 1) * sizeof(*fresh));
    size_t nfresh = 0;
    for (size_t i = 0; i < got; i++) {
        int rc = pf_cache_insert(e->cache, out[i], (enum pf_block_class)t->cls);
        if (rc == 1 && fresh) {
            fresh[nfresh++] = out[i];
        } else if (rc == 0) {
            /* resident meanwhile (a save or a local prefetch): serve the resident block */
            struct pf_block_key k = pf_block_key(out[i]);
            struct pf_block *r = NULL;
            pf_cache_lookup_each(e->cache, &k, 1, &r);
            if (r) {
                pf_block_put(out[i]);
                out[i] = r;
            }
        } /* refused by admission or memory: served from our reference, not resident */
    }
    pf_engine_run_sealed_hooks(e, fresh, nfresh);
    free(fresh);
    if (got && t->promoted)
        t->promoted(t->ctx, out, got);
    return got;
}

/* The segment holding position pos, or -1. */
static int seg_at(const struct pf_prefetch_task *t, size_t pos)
{
    for (size_t i = 0; i < t->nsegs; i++)
        if (t->segs[i].start <= pos && pos < t->segs[i].end)
            return (int)i;
    return -1;
}

/* Segment si ended short at pos: truncates it there and inserts, for exactly the blocks it
 * still owed, a run of the other kind of tier (remote -> the first local tier holding pos;
 * local -> the live holders' reach) when one holds pos. A fallback does not fall back. */
static void fall_back(struct pf_engine *e, struct pf_prefetch_task *t, size_t si, size_t pos)
{
    struct pf_plan_seg s = t->segs[si];
    t->segs[si].end = (uint32_t)pos;
    if (s.fallback || s.poll || pos >= s.end || t->nsegs >= PF_PLAN_SEGS_MAX)
        return;
    size_t want = s.end - pos, len = 0;
    int tier = -1;
    if (tier_remote(&e->tiers[s.tier])) {
        tier = local_run(e, t->req_id, t->keys + pos, want, false, &len);
    } else if (!t->remote_off && (tier = remote_tier(e)) >= 0) {
        size_t reach = remote_reach(t->src, t->nsrc, t->src_failed, pos);
        if (!reach)
            tier = -1;
        else
            len = (reach < s.end ? reach : s.end) - pos;
    }
    if (tier < 0)
        return;
    memmove(&t->segs[si + 2], &t->segs[si + 1], (t->nsegs - si - 1) * sizeof(t->segs[0]));
    t->segs[si + 1] =
        (struct pf_plan_seg){(uint32_t)pos, (uint32_t)(pos + len), (int8_t)tier, false, true};
    t->nsegs++;
    pf_debug("prefetch %s: blocks %zu..%zu fall back to %s", t->req_id, pos, pos + len,
             e->tiers[tier].name);
}

/* A remote run [pos, end): the holders in rank order, each for what it advertised of the
 * blocks still missing; a short or failed holder is not asked again by this task. */
static size_t remote_step(struct pf_prefetch_task *t, const struct pf_tier *tr, int tier,
                          size_t pos, size_t end)
{
    size_t at = pos;
    for (size_t k = 0; k < t->nsrc && at < end; k++) {
        if (t->src_failed[k] || t->src[k].len <= at)
            continue;
        size_t upto = t->src[k].len < end ? t->src[k].len : end, from = at;
        const char *why = NULL;
        size_t g = tr->fetch_from(tr->ctx, t->req_id, &t->src[k], t->keys + at, upto - at,
                                  t->work + at, &why);
        if (g > upto - at)
            g = upto - at;
        for (size_t i = 0; i < g; i++)
            t->work_tier[at + i] = (int8_t)tier;
        at += g;
        if (at < upto) {
            t->src_failed[k] = true;
            t->why[tier] = why ? why : "evicted";
            pf_debug("prefetch %s: holder %s delivered %zu of %zu block(s) (%s): next holder",
                     t->req_id, t->src[k].node, g, upto - from, t->why[tier]);
        }
    }
    return at - pos;
}

/* Counts delivered and shortfall, publishes the result. */
static void finish(struct pf_engine *e, struct pf_prefetch_task *t)
{
    size_t got = t->pos;
    uint32_t delivered[PF_MAX_TIERS] = {0};
    for (size_t i = 0; i < got; i++)
        if (t->work_tier[i] >= 0)
            delivered[t->work_tier[i]]++;
    if (t->wait_full && got < t->n) { /* all or nothing */
        for (size_t i = 0; i < got; i++)
            pf_block_put(t->work[i]);
        for (size_t i = 0; i < e->ntiers; i++)
            if (delivered[i] && !t->why[i])
                t->why[i] = "incomplete";
        memset(delivered, 0, sizeof(delivered));
        got = 0;
    }
    for (size_t i = 0; i < e->ntiers; i++) {
        const char *name = e->tiers[i].name;
        if (delivered[i])
            pf_child_add(pf_metric_child1(e->m_delivered, name), delivered[i]);
        if (t->planned[i] > delivered[i])
            pf_child_add(pf_metric_child2(e->m_shortfall, name, t->why[i] ? t->why[i] : "gap"),
                         t->planned[i] - delivered[i]);
    }
    uint64_t fb = blocks_bytes(t->work, got);
    pthread_mutex_lock(&e->pf_mu);
    t->fetched = t->work;
    t->fetched_tier = t->work_tier;
    t->nfetched = got;
    t->work = NULL;
    t->work_tier = NULL;
    t->pos = 0;
    t->done = true;
    t->done_ns = pf_now_ns();
    t->pinned += fb;
    pthread_mutex_unlock(&e->pf_mu);
    pinned_add(e, fb, 0);
    pf_debug("prefetch %s: %zu of %zu block(s) delivered", t->req_id, got, t->n);
}

/* Executes t's plan from t->pos on pool `pool`. true: finished; false: t moved to the other
 * pool's queue (with the caller's reference). */
static bool run_task(struct pf_engine *e, struct pf_prefetch_task *t, int pool)
{
    while (t->pos < t->n) {
        int si = seg_at(t, t->pos);
        if (si < 0)
            break;
        struct pf_plan_seg *s = &t->segs[si];
        const struct pf_tier *tr = &e->tiers[s->tier];
        int want = tier_remote(tr) ? PF_PREFETCH_REMOTE : PF_PREFETCH_LOCAL;
        if (want == PF_PREFETCH_REMOTE && t->remote_off) {
            t->why[s->tier] = "queue_full";
            fall_back(e, t, (size_t)si, t->pos);
            continue;
        }
        if (want != pool) {
            struct pf_prefetch_pool *pp = &e->pf_pool[want];
            int rc = pf_queue_push(&pp->q, t);
            if (rc == 0)
                return false;
            if (rc == -EAGAIN)
                pf_child_add(pp->c_full, 1);
            if (want == PF_PREFETCH_REMOTE) {
                pf_log_ratelimited(PF_LOG_WARN, 10000,
                                   "the remote prefetch queue is full: requests fall back to "
                                   "local tiers (pegaflow_prefetch_queue_full_total)");
                t->remote_off = true;
                continue;
            }
            /* the local queue is full: a local run is bounded, it runs here */
        }
        size_t pos = t->pos, len = s->end - pos, got;
        if (tier_remote(tr) && !s->poll) {
            got = remote_step(t, tr, s->tier, pos, s->end);
        } else {
            got = tr->fetch(tr->ctx, t->req_id, t->keys + pos, len, s->poll, t->work + pos);
            if (got > len)
                got = len;
            for (size_t i = 0; i < got; i++)
                t->work_tier[pos + i] = s->tier;
            if (got < len && !t->why[s->tier])
                t->why[s->tier] = s->poll ? "timeout" : "evicted";
        }
        t->pos += got;
        if (got < len)
            fall_back(e, t, (size_t)si, t->pos);
    }
    finish(e, t);
    return true;
}

static void *worker_main(void *arg)
{
    struct pf_prefetch_pool *pp = arg;
    for (;;) {
        void *item;
        if (pf_queue_pop(&pp->q, &item, UINT64_MAX) != 0)
            break;
        struct pf_prefetch_task *t = item;
        if (run_task(pp->e, t, pp->kind))
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
                      size_t nprefix, bool wait_full, const struct pf_plan *plan)
{
    if (plan->nsegs == 0)
        return -EINVAL;
    struct pf_prefetch_task *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->req_id = strdup(req_id);
    t->instance = strdup(instance);
    t->keys = malloc(n * sizeof(*keys));
    t->prefix = malloc((nprefix ? nprefix : 1) * sizeof(*prefix));
    t->work = calloc(n, sizeof(*t->work));
    t->work_tier = malloc(n);
    if (!t->req_id || !t->instance || !t->keys || !t->prefix || !t->work || !t->work_tier) {
        free(t->req_id);
        free(t->instance);
        free(t->keys);
        free(t->prefix);
        free(t->work);
        free(t->work_tier);
        free(t);
        return -ENOMEM;
    }
    memcpy(t->keys, keys, n * sizeof(*keys));
    memcpy(t->prefix, prefix, nprefix * sizeof(*prefix));
    memset(t->work_tier, -1, n);
    t->n = n;
    t->nprefix = nprefix;
    t->wait_full = wait_full;
    t->created_ns = pf_now_ns();
    t->e = e;
    memcpy(t->segs, plan->segs, plan->nsegs * sizeof(plan->segs[0]));
    t->nsegs = plan->nsegs;
    memcpy(t->src, plan->src, plan->nsrc * sizeof(plan->src[0]));
    t->nsrc = plan->nsrc;
    memcpy(t->planned, plan->planned, sizeof(t->planned));
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
    int pool = e->tiers[plan->segs[0].tier].discover ? PF_PREFETCH_REMOTE : PF_PREFETCH_LOCAL;
    int rc = pf_queue_push(&e->pf_pool[pool].q, t);
    if (rc) {
        if (rc == -EAGAIN)
            pf_child_add(e->pf_pool[pool].c_full, 1);
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
    static const char *const names[PF_PREFETCH_POOLS] = {"local", "remote"};
    pthread_mutex_init(&e->pf_mu, NULL);
    e->m_stale_gc = pf_metric_counter("pegaflow_prefetch_stale_gc_total",
                                      "Stale prefetch entries removed by background GC", NULL);
    e->m_pf_pinned =
        pf_metric_gauge("pegaflow_prefetch_pinned_bytes",
                        "Bytes of cached blocks held by prefetch tasks not yet collected", NULL);
    e->m_delivered =
        pf_metric_counter("pegaflow_cache_tier_blocks_delivered",
                          "Blocks a prefetch task fetched into the request's prefix, by the tier "
                          "that delivered them",
                          "tier");
    e->m_shortfall = pf_metric_counter(
        "pegaflow_prefetch_shortfall_blocks",
        "Blocks the query-time plan assigned to a tier that the tier did not deliver",
        "tier,reason");
    e->m_qfull = pf_metric_counter("pegaflow_prefetch_queue_full",
                                   "Prefetch tasks a full pool queue turned away", "pool");
    int rc = pf_htable_init(&e->pf_tasks, 64);
    if (rc)
        return rc;
    size_t depth = e->cfg.prefetch_queue_depth ? e->cfg.prefetch_queue_depth : PF_PREFETCH_QDEPTH;
    size_t ok = 0;
    for (int k = 0; k < PF_PREFETCH_POOLS; k++) {
        struct pf_prefetch_pool *pp = &e->pf_pool[k];
        pp->e = e;
        pp->kind = k;
        pp->c_full = pf_metric_child1(e->m_qfull, names[k]);
        pf_child_add(pp->c_full, 0);
        rc = pf_queue_init(&pp->q, depth);
        if (rc) {
            for (int j = 0; j < k; j++)
                pf_queue_destroy(&e->pf_pool[j].q);
            pf_htable_destroy(&e->pf_tasks);
            return rc;
        }
    }
    for (int k = 0; k < PF_PREFETCH_POOLS; k++) {
        struct pf_prefetch_pool *pp = &e->pf_pool[k];
        for (size_t i = 0; i < PF_PREFETCH_THREADS; i++) {
            if (pf_thread_start(&pp->thr[i], k ? "pegaflow-pfrem" : "pegaflow-pfloc", -1,
                                worker_main, pp) != 0)
                break;
            pp->nthr++;
        }
        ok += pp->nthr ? 1 : 0;
    }
    return ok == PF_PREFETCH_POOLS ? 0 : -EAGAIN;
}

void pf_prefetch_stop(struct pf_engine *e)
{
    for (int k = 0; k < PF_PREFETCH_POOLS; k++)
        pf_queue_close(&e->pf_pool[k].q);
    for (int k = 0; k < PF_PREFETCH_POOLS; k++)
        for (size_t i = 0; i < e->pf_pool[k].nthr; i++)
            pthread_join(e->pf_pool[k].thr[i], NULL);
    /* tasks a closed queue still held (moved between pools at shutdown) */
    for (int k = 0; k < PF_PREFETCH_POOLS; k++) {
        void *items[64];
        size_t m;
        while ((m = pf_queue_drain(&e->pf_pool[k].q, items, 64)) > 0)
            for (size_t i = 0; i < m; i++)
                pf_prefetch_task_put(items[i]);
    }
    pf_prefetch_gc(e, 0, NULL);
    for (int k = 0; k < PF_PREFETCH_POOLS; k++)
        pf_queue_destroy(&e->pf_pool[k].q);
    pf_htable_destroy(&e->pf_tasks);
    pthread_mutex_destroy(&e->pf_mu);
}

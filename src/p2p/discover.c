/* The requester's discovery side of the "rdma" tier (docs/p2p.md "The plan"): the req_id
 * blacklist, holder health (recent failures: the down window; fetches in flight: the load),
 * and the query-time discovery (p2p_tier_discover_start/finish: the query thread does its
 * local work while the MetaServer answers) that asks within the plan deadline and ranks the
 * holders. The fetch itself is in fetch.c. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/clock.h"
#include "pf/engine.h"
#include "pf/log.h"
#include "pf/meta_client.h"

/* ------------------------------------------------------------------ blacklist */

struct bl_ent {
    struct pf_hnode node;
    uint64_t until_ns;
    char id[];
};

#define BL_MAX (1u << 20)

static struct bl_ent *bl_find_locked(struct pf_p2p *p, const char *id, uint64_t h)
{
    struct pf_hnode *n;
    pf_htable_for_each_hash(&p->bl, n, h)
    {
        struct bl_ent *b = pf_container_of(n, struct bl_ent, node);
        if (strcmp(b->id, id) == 0)
            return b;
    }
    return NULL;
}

void p2p_blacklist_add(struct pf_p2p *p, const char *req_id)
{
    uint64_t h = pf_hash64(req_id, strlen(req_id));
    uint64_t until = pf_clock_now(p->cfg.clock) + p->cfg.blacklist_ms * PF_NS_PER_MS;
    pthread_mutex_lock(&p->bl_mu);
    struct bl_ent *b = bl_find_locked(p, req_id, h);
    if (!b && p->bl.count < BL_MAX) {
        size_t l = strlen(req_id);
        b = malloc(sizeof(*b) + l + 1);
        if (b) {
            memcpy(b->id, req_id, l + 1);
            pf_htable_insert(&p->bl, &b->node, h);
        }
    }
    if (b)
        b->until_ns = until;
    pthread_mutex_unlock(&p->bl_mu);
    if (b)
        pf_debug("req %s: remote fetch disabled for %llu s (failed peer); later queries fall "
                 "through to the next tier",
                 req_id, (unsigned long long)(p->cfg.blacklist_ms / 1000));
}

bool pf_p2p_blacklisted(struct pf_p2p *p, const char *req_id)
{
    uint64_t h = pf_hash64(req_id, strlen(req_id));
    uint64_t now = pf_clock_now(p->cfg.clock);
    pthread_mutex_lock(&p->bl_mu);
    struct bl_ent *b = bl_find_locked(p, req_id, h);
    bool r = b && now < b->until_ns;
    pthread_mutex_unlock(&p->bl_mu);
    return r;
}

static size_t bl_sweep(struct pf_p2p *p, bool all)
{
    uint64_t now = pf_clock_now(p->cfg.clock);
    struct bl_ent *drop[256];
    size_t total = 0, k;
    do {
        k = 0;
        pthread_mutex_lock(&p->bl_mu);
        for (size_t b = 0; p->bl.buckets && b <= p->bl.mask && k < PF_ARRAY_SIZE(drop); b++) {
            struct pf_hnode *h = p->bl.buckets[b];
            while (h && k < PF_ARRAY_SIZE(drop)) {
                struct pf_hnode *next = h->next;
                struct bl_ent *e = pf_container_of(h, struct bl_ent, node);
                if (all || now >= e->until_ns) {
                    pf_htable_remove(&p->bl, h);
                    drop[k++] = e;
                }
                h = next;
            }
        }
        pthread_mutex_unlock(&p->bl_mu);
        for (size_t i = 0; i < k; i++)
            free(drop[i]);
        total += k;
    } while (k == PF_ARRAY_SIZE(drop));
    return total;
}

static size_t holders_sweep(struct pf_p2p *p, bool all);

size_t p2p_blacklist_gc(struct pf_p2p *p)
{
    holders_sweep(p, false);
    return bl_sweep(p, false);
}

void p2p_blacklist_free(struct pf_p2p *p)
{
    holders_sweep(p, true);
    bl_sweep(p, true);
}

/* ------------------------------------------------------------------ tier */

bool p2p_fetch_available(struct pf_p2p *p, const char *req_id)
{
    if (!atomic_load_explicit(&p->fetch_enabled, memory_order_acquire) || atomic_load(&p->stopping))
        return false;
    /* MetaServer known unreachable (its client has no session): no remote discovery, and no
     * Loading round trip for the client either */
    if (p->meta && !pf_meta_client_connected(p->meta))
        return false;
    return !pf_p2p_blacklisted(p, req_id);
}

/* ------------------------------------------------------------------ holder health */

struct holder {
    struct pf_hnode node;
    uint64_t fail_until; /* clock ns: inside the down window before */
    uint32_t inflight;   /* fetches from it in flight */
    char addr[];
};

#define HOLDERS_MAX 4096

static struct holder *holder_find_locked(struct pf_p2p *p, const char *addr, uint64_t h)
{
    struct pf_hnode *n;
    pf_htable_for_each_hash(&p->holders, n, h)
    {
        struct holder *x = pf_container_of(n, struct holder, node);
        if (strcmp(x->addr, addr) == 0)
            return x;
    }
    return NULL;
}

static struct holder *holder_get_locked(struct pf_p2p *p, const char *addr)
{
    uint64_t h = pf_hash64(addr, strlen(addr));
    struct holder *x = holder_find_locked(p, addr, h);
    if (x || p->holders.count >= HOLDERS_MAX)
        return x;
    size_t l = strlen(addr);
    x = calloc(1, sizeof(*x) + l + 1);
    if (x) {
        memcpy(x->addr, addr, l + 1);
        pf_htable_insert(&p->holders, &x->node, h);
    }
    return x;
}

bool p2p_holder_state(struct pf_p2p *p, const char *addr, uint64_t now, uint32_t *load_p)
{
    pthread_mutex_lock(&p->hold_mu);
    struct holder *x = holder_find_locked(p, addr, pf_hash64(addr, strlen(addr)));
    bool down = x && now < x->fail_until;
    *load_p = x ? x->inflight : 0;
    pthread_mutex_unlock(&p->hold_mu);
    return down;
}

void p2p_holder_note(struct pf_p2p *p, const char *addr, int d, bool failed)
{
    pthread_mutex_lock(&p->hold_mu);
    struct holder *x = holder_get_locked(p, addr);
    if (x) {
        if (d > 0 || x->inflight > 0)
            x->inflight = (uint32_t)((int)x->inflight + d);
        if (failed)
            x->fail_until = pf_clock_now(p->cfg.clock) + p->cfg.peer_down_ms * PF_NS_PER_MS;
    }
    pthread_mutex_unlock(&p->hold_mu);
}

static size_t holders_sweep(struct pf_p2p *p, bool all)
{
    uint64_t now = pf_clock_now(p->cfg.clock);
    struct holder *drop[256];
    size_t total = 0, k;
    do {
        k = 0;
        pthread_mutex_lock(&p->hold_mu);
        for (size_t b = 0; p->holders.buckets && b <= p->holders.mask && k < PF_ARRAY_SIZE(drop);
             b++) {
            struct pf_hnode *h = p->holders.buckets[b];
            while (h && k < PF_ARRAY_SIZE(drop)) {
                struct pf_hnode *next = h->next;
                struct holder *x = pf_container_of(h, struct holder, node);
                if (all || (x->inflight == 0 && now >= x->fail_until)) {
                    pf_htable_remove(&p->holders, h);
                    drop[k++] = x;
                }
                h = next;
            }
        }
        pthread_mutex_unlock(&p->hold_mu);
        for (size_t i = 0; i < k; i++)
            free(drop[i]);
        total += k;
    } while (k == PF_ARRAY_SIZE(drop));
    return total;
}

struct ranked {
    struct pf_tier_source s;
    uint32_t load;
};

static int ranked_cmp(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->s.down != y->s.down)
        return x->s.down ? 1 : -1;
    if (x->s.len != y->s.len)
        return x->s.len > y->s.len ? -1 : 1;
    if (x->load != y->load)
        return x->load < y->load ? -1 : 1;
    return strcmp(x->s.node, y->s.node);
}

/* Whether a holder other than this node advertised all of the first `head` hashes. */
static bool head_held(const struct pf_p2p *p, const struct pf_meta_prefix *res, size_t nres,
                      size_t head)
{
    for (size_t i = 0; i < nres; i++)
        if (res[i].prefix_len >= head && strcmp(res[i].node, p->self_addr) != 0)
            return true;
    return false;
}

/* The plan's discovery within cfg.plan_timeout_ms: QueryPrefixBlocks for the first
 * PF_P2P_PLAN_HEAD hashes (a pure miss costs one small RPC, not the whole suffix's bytes),
 * sent by p2p_tier_discover_start and collected by p2p_tier_discover_finish (the query thread
 * works in between); only when a holder has all of them, a second one for the whole suffix
 * with the time left (else, or when it fails, the head's answer stands). A transport without
 * the split phase asks at finish. Holds p2p_meta_enter from start to finish. */
struct p2p_discovery {
    struct pf_p2p *p;
    const char *req_id;              /* the caller's, valid until finish */
    const struct pf_block_key *keys; /* the caller's, valid until finish */
    const char *ns;
    struct pf_meta_hash *h; /* the head's, then (a second query) all n */
    size_t n, head;
    uint64_t t0;
    void *op; /* the transport's head query in flight */
    int rc;   /* its start's error */
};

static void discovery_free(struct p2p_discovery *d)
{
    p2p_meta_exit(d->p);
    if (d->h != (struct pf_meta_hash *)(d + 1))
        free(d->h);
    free(d);
}

/* The whole suffix's hashes (for the second query); false without memory. */
static bool discovery_all(struct p2p_discovery *d)
{
    struct pf_meta_hash *h = malloc(d->n * sizeof(*h));
    if (!h)
        return false;
    for (size_t i = 0; i < d->n; i++)
        h[i] = (struct pf_meta_hash){d->keys[i].len, d->keys[i].hash};
    d->h = h;
    return true;
}

void *p2p_tier_discover_start(void *ctx, const char *req_id, const struct pf_block_key *keys,
                              size_t n)
{
    struct pf_p2p *p = ctx;
    if (n == 0 || !p2p_fetch_available(p, req_id))
        return NULL;
    size_t head = n < PF_P2P_PLAN_HEAD ? n : PF_P2P_PLAN_HEAD;
    /* the head's hashes only: the whole suffix's are needed (and built) only for a second
     * query, and reading 4,096 keys here would delay the first */
    struct p2p_discovery *d = calloc(1, sizeof(*d) + head * sizeof(*d->h));
    if (!d)
        return NULL;
    if (!p2p_meta_enter(p)) { /* stopping */
        free(d);
        return NULL;
    }
    d->h = (struct pf_meta_hash *)(d + 1);
    for (size_t i = 0; i < head; i++)
        d->h[i] = (struct pf_meta_hash){keys[i].len, keys[i].hash};
    d->p = p;
    d->req_id = req_id;
    d->keys = keys;
    d->ns = pf_ns_name(keys[0].ns);
    d->n = n;
    d->head = head;
    d->t0 = pf_now_ns();
    if (p->tr->query_prefix_start)
        d->rc = p->tr->query_prefix_start(p->tr->ctx, d->ns, d->h, d->head, p->cfg.plan_timeout_ms,
                                          &d->op);
    return d;
}

/* The head's answer (and the whole suffix's when a holder has all the head). */
static int plan_query_finish(struct p2p_discovery *d, struct pf_meta_prefix **res_p, size_t *nres_p)
{
    struct pf_p2p *p = d->p;
    uint64_t budget = p->cfg.plan_timeout_ms;
    int rc = d->rc;
    if (d->op)
        rc = p->tr->query_prefix_finish(p->tr->ctx, d->op, res_p, nres_p);
    else if (!p->tr->query_prefix_start)
        rc = p->tr->query_prefix(p->tr->ctx, d->ns, d->h, d->head, budget, res_p, nres_p);
    d->op = NULL;
    if (rc == 0 && d->head < d->n && head_held(p, *res_p, *nres_p, d->head)) {
        uint64_t spent = (pf_now_ns() - d->t0) / PF_NS_PER_MS;
        struct pf_meta_prefix *all = NULL;
        size_t nall = 0;
        if (spent < budget && discovery_all(d) &&
            p->tr->query_prefix(p->tr->ctx, d->ns, d->h, d->n, budget - spent, &all, &nall) == 0) {
            free(*res_p);
            *res_p = all;
            *nres_p = nall;
        }
    }
    return rc;
}

int p2p_tier_discover_finish(void *ctx, void *op, struct pf_tier_source *src, size_t max)
{
    struct pf_p2p *p = ctx;
    struct p2p_discovery *d = op;
    if (!src || max == 0) { /* dropped: the answer is not wanted */
        if (d->op)
            p->tr->query_prefix_finish(p->tr->ctx, d->op, NULL, NULL);
        discovery_free(d);
        return -1;
    }
    struct pf_meta_prefix *res = NULL;
    size_t nres = 0, n = d->n;
    int qrc = plan_query_finish(d, &res, &nres);
    const char *req_id = d->req_id;
    discovery_free(d);
    if (qrc) {
        pf_debug("req %s: MetaServer query failed: %s", req_id, strerror(-qrc));
        pf_log_ratelimited(PF_LOG_WARN, 10000,
                           "MetaServer query failed or exceeded the %llu ms plan deadline (%s): "
                           "requests are planned from local tiers only",
                           (unsigned long long)p->cfg.plan_timeout_ms, strerror(-qrc));
        return -1;
    }
    struct ranked *r = malloc((nres ? nres : 1) * sizeof(*r));
    if (!r) {
        free(res);
        return -1;
    }
    size_t k = 0;
    uint64_t now = pf_clock_now(p->cfg.clock);
    for (size_t i = 0; i < nres; i++) {
        size_t l = strlen(res[i].node);
        if (res[i].prefix_len == 0 || l == 0 || l >= sizeof(r[k].s.node) || l >= P2P_ADDR_MAX ||
            strcmp(res[i].node, p->self_addr) == 0)
            continue;
        memcpy(r[k].s.node, res[i].node, l + 1);
        size_t len = res[i].prefix_len < n ? res[i].prefix_len : n;
        r[k].s.len = (uint32_t)(len < PF_P2P_MAX_HASHES ? len : PF_P2P_MAX_HASHES);
        r[k].s.down = p2p_holder_state(p, r[k].s.node, now, &r[k].load);
        k++;
    }
    free(res);
    qsort(r, k, sizeof(*r), ranked_cmp);
    size_t m = k < max ? k : max;
    for (size_t i = 0; i < m; i++)
        src[i] = r[i].s;
    free(r);
    if (m)
        pf_debug("req %s: %zu holder(s), best %s with %u of %zu block(s)%s", req_id, m, src[0].node,
                 src[0].len, n, src[0].down ? " (down)" : "");
    return (int)m;
}

int p2p_tier_discover(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                      struct pf_tier_source *src, size_t max)
{
    if (max == 0)
        return -1;
    void *d = p2p_tier_discover_start(ctx, req_id, keys, n);
    return d ? p2p_tier_discover_finish(ctx, d, src, max) : -1;
}

/* Step 1 of a fetch (fetch.c): the holder with the longest advertised prefix. */
int p2p_discover_holder(struct pf_p2p *p, const char *req_id, const struct pf_block_key *keys,
                        size_t n, bool all_or_nothing, char *peer, size_t peerlen, size_t *want_p)
{
    size_t want = 0;
    struct pf_meta_hash *h = malloc(n * sizeof(*h));
    if (!h)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        h[i] = (struct pf_meta_hash){keys[i].len, keys[i].hash};
    const char *ns = pf_ns_name(keys[0].ns);
    uint64_t until = pf_now_ns() + p->cfg.full_prefix_wait_ms * PF_NS_PER_MS;
    int rc = -ENOENT;
    bool waited = false;
    for (;;) {
        struct pf_meta_prefix *res = NULL;
        size_t nres = 0;
        if (!p2p_meta_enter(p)) {
            rc = -ECANCELED;
            break;
        }
        int qrc = p->tr->query_prefix(p->tr->ctx, ns, h, n, PF_P2P_META_TIMEOUT_MS, &res, &nres);
        p2p_meta_exit(p);
        if (qrc) {
            /* a MetaServer error means "no remote", even with wait_for_full_prefix: polling a
             * dead or hung MetaServer would hold the request for the whole wait */
            pf_debug("req %s: MetaServer query failed: %s", req_id, strerror(-qrc));
            pf_log_ratelimited(PF_LOG_WARN, 10000,
                               "MetaServer query failed (%s): no remote discovery, the request "
                               "proceeds without remote blocks",
                               strerror(-qrc));
            break;
        } else {
            ptrdiff_t b = pf_meta_prefix_best(res, nres, p->self_addr);
            if (b >= 0 && strlen(res[b].node) < peerlen &&
                (!all_or_nothing || res[b].prefix_len >= n)) {
                snprintf(peer, peerlen, "%s", res[b].node);
                want = res[b].prefix_len < n ? (size_t)res[b].prefix_len : n;
                rc = 0;
            }
        }
        free(res);
        if (rc == 0 || !all_or_nothing)
            break;
        if (atomic_load(&p->stopping)) {
            rc = -ECANCELED;
            break;
        }
        if (pf_now_ns() >= until) {
            pf_debug("req %s: no peer advertised all %zu block(s) within %llu ms "
                     "(wait_for_full_prefix)",
                     req_id, n, (unsigned long long)p->cfg.full_prefix_wait_ms);
            break;
        }
        waited = true;
        pf_sleep_ms(p->cfg.full_prefix_poll_ms);
    }
    if (rc == 0 && waited)
        pf_debug("req %s: %s advertises the full suffix (wait_for_full_prefix)", req_id, peer);
    free(h);
    if (want > PF_P2P_MAX_HASHES)
        want = PF_P2P_MAX_HASHES;
    *want_p = want;
    return rc;
}

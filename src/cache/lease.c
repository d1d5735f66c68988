/* Lease table: hash map id -> lease under one mutex, plus an expiry sweep. A lease holds its
 * blocks either as strong references or as pins in the RAM cache (pf_cache_prefix_pin: the
 * query's hot path, no atomic per block); freeing it puts or unpins them outside the table
 * lock. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "lease"
#include "pf/cache.h"
#include "pf/lease.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/util.h"

struct lease {
    struct pf_hnode hnode;
    uint8_t id[PF_LEASE_ID_LEN];
    char *instance;
    struct pf_block **blocks;
    size_t n;
    struct pf_cache *pinned; /* the blocks are pins in this cache, else strong references */
    uint32_t shares;
    bool want;               /* scratch of pf_lease_commit_all, under the table lock */
    struct lease *gone_next; /* pf_lease_commit_all's list of leases to free */
    uint64_t expires_ns;
};

struct pf_lease_table {
    pthread_mutex_t mu;
    struct pf_htable map;
    const struct pf_clock *clk;
    uint64_t ttl_ns;
    _Atomic uint64_t next_sweep_ns; /* opportunistic sweeps at most once a second */
    struct pf_metric *m_active;
};

static void lease_free(struct lease *l)
{
    if (l->pinned)
        pf_cache_unpin(l->pinned, l->blocks, l->n);
    else
        for (size_t i = 0; i < l->n; i++)
            pf_block_put(l->blocks[i]);
    free(l->blocks);
    free(l->instance);
    free(l);
}

int pf_lease_table_create(const struct pf_clock *clk, uint64_t ttl_ns, struct pf_lease_table **t_p)
{
    struct pf_lease_table *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    int rc = pf_htable_init(&t->map, 256);
    if (rc) {
        free(t);
        return rc;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->clk = clk;
    t->ttl_ns = ttl_ns;
    t->m_active = pf_metric_gauge("pegaflow_leases_active", "Query leases alive", NULL);
    *t_p = t;
    return 0;
}

/* Collects every lease matching pred into a private list (lock held), to free outside. */
static struct lease *unlink_where(struct pf_lease_table *t, bool (*pred)(struct lease *, void *),
                                  void *arg)
{
    struct lease *out = NULL;
    for (size_t b = 0; t->map.buckets && b <= t->map.mask; b++) {
        struct pf_hnode *n = t->map.buckets[b];
        while (n) {
            struct pf_hnode *next = n->next;
            struct lease *l = pf_container_of(n, struct lease, hnode);
            if (pred(l, arg)) {
                pf_htable_remove(&t->map, n);
                l->hnode.next = out ? &out->hnode : NULL;
                out = l;
            }
            n = next;
        }
    }
    pf_metric_set(t->m_active, (double)t->map.count);
    return out;
}

static size_t free_list(struct lease *l)
{
    size_t n = 0;
    while (l) {
        struct lease *next =
            l->hnode.next ? pf_container_of(l->hnode.next, struct lease, hnode) : NULL;
        lease_free(l);
        l = next;
        n++;
    }
    return n;
}

static bool pred_all(struct lease *l, void *arg)
{
    return true;
}

void pf_lease_table_destroy(struct pf_lease_table *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    struct lease *l = unlink_where(t, pred_all, NULL);
    pthread_mutex_unlock(&t->mu);
    free_list(l);
    pf_htable_destroy(&t->map);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static uint64_t id_hash(const uint8_t *id)
{
    return pf_hash64(id, PF_LEASE_ID_LEN);
}

static struct lease *find(struct pf_lease_table *t, const uint8_t *id)
{
    uint64_t h = id_hash(id);
    struct pf_hnode *n;
    pf_htable_for_each_hash(&t->map, n, h)
    {
        struct lease *l = pf_container_of(n, struct lease, hnode);
        if (memcmp(l->id, id, PF_LEASE_ID_LEN) == 0)
            return l;
    }
    return NULL;
}

static bool pred_expired(struct lease *l, void *arg)
{
    return l->expires_ns <= *(uint64_t *)arg;
}

/* Opportunistic sweep on the request paths: a full scan at most once a second, so a table
 * with many live leases does not cost O(leases) per query. */
static void sweep_maybe(struct pf_lease_table *t)
{
    uint64_t now = pf_clock_now(t->clk);
    uint64_t next = atomic_load_explicit(&t->next_sweep_ns, memory_order_relaxed);
    if (now < next)
        return;
    if (atomic_compare_exchange_strong(&t->next_sweep_ns, &next, now + PF_NS_PER_SEC))
        pf_lease_sweep(t);
}

size_t pf_lease_sweep(struct pf_lease_table *t)
{
    uint64_t now = pf_clock_now(t->clk);
    pthread_mutex_lock(&t->mu);
    struct lease *l = unlink_where(t, pred_expired, &now);
    pthread_mutex_unlock(&t->mu);
    size_t n = free_list(l);
    if (n)
        pf_debug("expired %zu lease(s)", n);
    return n;
}

static int lease_new(struct pf_lease_table *t, struct pf_cache *pinned, const char *instance_id,
                     struct pf_block **blocks, size_t n, uint32_t shares,
                     uint8_t id_out[PF_LEASE_ID_LEN]);

int pf_lease_create(struct pf_lease_table *t, const char *instance_id, struct pf_block **blocks,
                    size_t n, uint32_t shares, uint8_t id_out[PF_LEASE_ID_LEN])
{
    return lease_new(t, NULL, instance_id, blocks, n, shares, id_out);
}

int pf_lease_create_pinned(struct pf_lease_table *t, struct pf_cache *c, const char *instance_id,
                           struct pf_block **blocks, size_t n, uint32_t shares,
                           uint8_t id_out[PF_LEASE_ID_LEN])
{
    return lease_new(t, c, instance_id, blocks, n, shares, id_out);
}

static int lease_new(struct pf_lease_table *t, struct pf_cache *pinned, const char *instance_id,
                     struct pf_block **blocks, size_t n, uint32_t shares,
                     uint8_t id_out[PF_LEASE_ID_LEN])
{
    struct lease *l = calloc(1, sizeof(*l));
    int rc = -ENOMEM;
    if (!l)
        goto err_put;
    l->instance = strdup(instance_id);
    l->blocks = malloc((n ? n : 1) * sizeof(*l->blocks));
    if (!l->instance || !l->blocks)
        goto err_free;
    memcpy(l->blocks, blocks, n * sizeof(*blocks));
    l->n = n;
    l->pinned = pinned;
    l->shares = shares ? shares : 1;
    rc = pf_uuid_v4(l->id);
    if (rc) {
        l->n = 0;
        goto err_free;
    }
    l->expires_ns = pf_clock_now(t->clk) + t->ttl_ns;
    /* Copy the id out before publishing: once inserted, another thread may release and free
     * the lease (its holder learns the id by other means than this return). */
    memcpy(id_out, l->id, PF_LEASE_ID_LEN);
    uint64_t h = id_hash(l->id);
    sweep_maybe(t);
    pthread_mutex_lock(&t->mu);
    pf_htable_insert(&t->map, &l->hnode, h);
    pf_metric_set(t->m_active, (double)t->map.count);
    pthread_mutex_unlock(&t->mu);
    return 0;
err_free:
    if (l) {
        free(l->blocks);
        free(l->instance);
        free(l);
    }
err_put:
    if (pinned)
        pf_cache_unpin(pinned, blocks, n);
    else
        for (size_t i = 0; i < n; i++)
            pf_block_put(blocks[i]);
    return rc;
}

static int lease_take(struct pf_lease_table *t, const uint8_t *id, size_t idlen,
                      const char *instance_id, bool share, struct pf_block ***blocks_p, size_t *n_p,
                      char *msg, size_t msglen)
{
    if (idlen != PF_LEASE_ID_LEN) {
        if (msg)
            snprintf(msg, msglen, "query lease must be %d bytes, got %zu", PF_LEASE_ID_LEN, idlen);
        return -EINVAL;
    }
    sweep_maybe(t);
    uint64_t now = pf_clock_now(t->clk);
    struct lease *gone = NULL;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    struct lease *l = find(t, id);
    if (!l || l->expires_ns <= now) {
        if (msg)
            snprintf(msg, msglen, "query lease is unknown or expired");
        rc = -ESTALE;
        goto out;
    }
    if (strcmp(l->instance, instance_id) != 0) {
        if (msg)
            snprintf(msg, msglen, "query lease belongs to instance %s", l->instance);
        rc = -EPERM;
        goto out;
    }
    struct pf_block **copy = malloc((l->n ? l->n : 1) * sizeof(*copy));
    if (!copy) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < l->n; i++) {
        pf_block_get(l->blocks[i]);
        copy[i] = l->blocks[i];
    }
    *blocks_p = copy;
    *n_p = l->n;
    if (share && --l->shares == 0) {
        pf_htable_remove(&t->map, &l->hnode);
        gone = l;
        pf_metric_set(t->m_active, (double)t->map.count);
    }
out:
    pthread_mutex_unlock(&t->mu);
    if (gone)
        lease_free(gone);
    return rc;
}

int pf_lease_consume(struct pf_lease_table *t, const uint8_t *id, size_t idlen,
                     const char *instance_id, struct pf_block ***blocks_p, size_t *n_p, char *msg,
                     size_t msglen)
{
    return lease_take(t, id, idlen, instance_id, true, blocks_p, n_p, msg, msglen);
}

int pf_lease_peek(struct pf_lease_table *t, const uint8_t *id, size_t idlen,
                  const char *instance_id, struct pf_block ***blocks_p, size_t *n_p, char *msg,
                  size_t msglen)
{
    return lease_take(t, id, idlen, instance_id, false, blocks_p, n_p, msg, msglen);
}

int pf_lease_commit(struct pf_lease_table *t, const uint8_t *id, size_t idlen)
{
    if (idlen != PF_LEASE_ID_LEN)
        return -EINVAL;
    struct lease *gone = NULL;
    int rc = 0;
    uint64_t now = pf_clock_now(t->clk);
    pthread_mutex_lock(&t->mu);
    struct lease *l = find(t, id);
    if (!l || l->expires_ns <= now) {
        rc = -ESTALE;
    } else if (--l->shares == 0) {
        pf_htable_remove(&t->map, &l->hnode);
        gone = l;
        pf_metric_set(t->m_active, (double)t->map.count);
    }
    pthread_mutex_unlock(&t->mu);
    if (gone)
        lease_free(gone);
    return rc;
}

int pf_lease_commit_all(struct pf_lease_table *t, const struct pf_lease_ref *ids, size_t n,
                        size_t *bad_p)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i].len != PF_LEASE_ID_LEN) {
            *bad_p = i;
            return -EINVAL;
        }
    struct lease *gone_head = NULL;
    int rc = 0;
    size_t i;
    uint64_t now = pf_clock_now(t->clk);
    pthread_mutex_lock(&t->mu);
    /* first pass: count what each lease is asked for; nothing is taken yet */
    for (i = 0; i < n; i++) {
        struct lease *l = find(t, ids[i].id);
        if (!l || l->expires_ns <= now) {
            rc = -ESTALE;
            break;
        }
        if (l->want) {
            rc = -EEXIST; /* the same lease twice in one request */
            break;
        }
        l->want = true; /* a live lease has at least one share */
    }
    if (rc) {
        *bad_p = i;
        for (size_t k = 0; k < i; k++)
            find(t, ids[k].id)->want = false;
        pthread_mutex_unlock(&t->mu);
        return rc;
    }
    /* second pass: take the shares */
    for (i = 0; i < n; i++) {
        struct lease *l = find(t, ids[i].id);
        l->want = false;
        if (--l->shares == 0) {
            pf_htable_remove(&t->map, &l->hnode);
            l->gone_next = gone_head;
            gone_head = l;
        }
    }
    pf_metric_set(t->m_active, (double)t->map.count);
    pthread_mutex_unlock(&t->mu);
    while (gone_head) {
        struct lease *l = gone_head;
        gone_head = l->gone_next;
        lease_free(l);
    }
    return 0;
}

int pf_lease_release(struct pf_lease_table *t, const uint8_t *id, size_t idlen)
{
    if (idlen != PF_LEASE_ID_LEN)
        return -EINVAL;
    uint64_t now = pf_clock_now(t->clk);
    pthread_mutex_lock(&t->mu);
    struct lease *l = find(t, id);
    bool expired = l && l->expires_ns <= now;
    if (l) {
        pf_htable_remove(&t->map, &l->hnode);
        pf_metric_set(t->m_active, (double)t->map.count);
    }
    pthread_mutex_unlock(&t->mu);
    if (l)
        lease_free(l);
    return !l || expired ? -ESTALE : 0;
}

static bool pred_instance(struct lease *l, void *arg)
{
    return strcmp(l->instance, (const char *)arg) == 0;
}

size_t pf_lease_drop_instance(struct pf_lease_table *t, const char *instance_id)
{
    pthread_mutex_lock(&t->mu);
    struct lease *l = unlink_where(t, pred_instance, (void *)instance_id);
    pthread_mutex_unlock(&t->mu);
    return free_list(l);
}

size_t pf_lease_count(struct pf_lease_table *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->map.count;
    pthread_mutex_unlock(&t->mu);
    return n;
}

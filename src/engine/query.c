/* QueryPrefetch and Release (reference §2.3, §2.4). Group 0 is a prefix query: the longest
 * run of resident blocks from the first hash. A Ready answer with hits pins those blocks
 * with a lease (one share per worker of the instance): RAM hits are cache pins
 * (pf_cache_prefix_pin, no atomic per block), turned into strong references only when a
 * background task may take the prefix over. A RAM miss leaves no state behind,
 * so the same req_id can hit later. After the RAM prefix the query plans the rest across the
 * backing tiers at once (pf_prefetch_plan: the local SSD index, one MetaServer discovery with
 * a short deadline) and counts the plan in pegaflow_cache_tier_block_requests_total; a plan
 * with nothing beyond RAM (a pure miss) answers Ready at once with no task, otherwise a
 * per-req_id background task executes the plan and the query answers Loading.
 *
 * Storage groups g > 0 (hybrid models) key blocks by hash + big-endian g. Without
 * wait_for_full_prefix the query is a membership test against RAM: every position answers
 * on its own, hit_positions lists the hits ascending and the lease pins exactly those
 * blocks in that order. With it the query is an all-or-nothing want-set through the same
 * prefetch machinery (its task keyed apart from the request's group-0 task): Ready with a
 * lease and hit_positions 0..n-1 when every block is there, else Ready with the count
 * found, no lease and no positions. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "query"
#include "engine/engine_internal.h"
#include "pf/log.h"

/* Reuse estimator: total asked for, identities of the misses. */
static void record_hll(struct pf_engine *e, struct pf_instance *in, const struct pf_block_key *miss,
                       size_t nmiss, uint64_t total)
{
    const uint8_t *h[256];
    size_t l[256];
    size_t done = 0;
    do {
        size_t k = nmiss - done < 256 ? nmiss - done : 256;
        for (size_t i = 0; i < k; i++) {
            h[i] = miss[done + i].hash;
            l[i] = miss[done + i].len;
        }
        pf_hll_record(e->hll, in->ns, h, l, k, done == 0 ? total : 0);
        done += k;
    } while (done < nmiss);
}

/* The reuse estimator's identities of keys[0..n), or NULL (no estimator, no memory). */
static uint64_t *hll_ids(struct pf_engine *e, struct pf_instance *in,
                         const struct pf_block_key *keys, size_t n)
{
    uint64_t *ids = e->hll && n ? malloc(n * sizeof(*ids)) : NULL;
    if (!ids)
        return NULL;
    const uint8_t *h[256];
    size_t l[256];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 256 ? n - done : 256;
        for (size_t i = 0; i < k; i++) {
            h[i] = keys[done + i].hash;
            l[i] = keys[done + i].len;
        }
        pf_hll_identities(in->ns, h, l, k, ids + done);
        done += k;
    }
    return ids;
}

/* Gives up blocks a lookup returned: pins (pf_cache_prefix_pin) or strong references. */
static void drop_blocks(struct pf_engine *e, struct pf_block **blocks, size_t n, bool pinned)
{
    if (pinned) {
        pf_cache_unpin(e->cache, blocks, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        pf_block_put(blocks[i]);
}

/* hit_positions 0..n-1 (want-set answers). */
static int positions_all(struct pf_engine_query_result *res, size_t n)
{
    res->hit_positions = malloc((n ? n : 1) * sizeof(*res->hit_positions));
    if (!res->hit_positions)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        res->hit_positions[i] = (uint32_t)i;
    res->nhit_positions = n;
    return 0;
}

static int finish_task_lease(struct pf_engine *e, struct pf_instance *in,
                             struct pf_prefetch_task *t, size_t total,
                             struct pf_engine_query_result *res, char *err, size_t errlen);

/* A complete want-set: positions 0..n-1 and a lease over the whole set. */
static int lease_all(struct pf_engine *e, struct pf_instance *in, struct pf_prefetch_task *t,
                     size_t total, struct pf_engine_query_result *res, char *err, size_t errlen)
{
    int rc = positions_all(res, total);
    return rc ? rc : finish_task_lease(e, in, t, total, res, err, errlen);
}

/* Promotes a finished task's blocks into RAM and answers Ready with a lease over the RAM
 * prefix at task start plus the fetched run. */
static int finish_task(struct pf_engine *e, struct pf_instance *in, struct pf_prefetch_task *t,
                       bool want_set, struct pf_engine_query_result *res, char *err, size_t errlen)
{
    size_t total = t->nprefix + t->nfetched;
    if (t->nfetched) {
        struct pf_block **fresh = malloc(t->nfetched * sizeof(*fresh));
        size_t nfresh = 0;
        for (size_t i = 0; i < t->nfetched; i++) {
            const struct pf_tier *tier = &e->tiers[t->fetched_tier[i]];
            if (pf_cache_insert(e->cache, t->fetched[i], (enum pf_block_class)tier->cls) == 1 &&
                fresh)
                fresh[nfresh++] = t->fetched[i];
        }
        /* newly resident blocks are advertised like sealed ones (the reference forgets
         * promoted blocks, so peers could not discover them) */
        pf_engine_run_sealed_hooks(e, fresh, nfresh);
        free(fresh);
        /* each tier's promoted callback, for its runs */
        for (size_t i = 0; i < t->nfetched;) {
            size_t j = i;
            while (j < t->nfetched && t->fetched_tier[j] == t->fetched_tier[i])
                j++;
            const struct pf_tier *tier = &e->tiers[t->fetched_tier[i]];
            if (tier->promoted)
                tier->promoted(tier->ctx, t->fetched + i, j - i);
            i = j;
        }
    }
    res->num_hit_blocks = (uint32_t)total;
    if (want_set)
        return total == t->nprefix + t->n ? lease_all(e, in, t, total, res, err, errlen) : 0;
    record_hll(e, in, t->keys + t->nfetched, t->n - t->nfetched, t->nprefix + t->n);
    if (total == 0)
        return 0;
    return finish_task_lease(e, in, t, total, res, err, errlen);
}

/* A lease over the task's RAM prefix and fetched run (the lease takes the references). */
static int finish_task_lease(struct pf_engine *e, struct pf_instance *in,
                             struct pf_prefetch_task *t, size_t total,
                             struct pf_engine_query_result *res, char *err, size_t errlen)
{
    struct pf_block **all = malloc(total * sizeof(*all));
    if (!all)
        return -ENOMEM;
    memcpy(all, t->prefix, t->nprefix * sizeof(*all));
    memcpy(all + t->nprefix, t->fetched, t->nfetched * sizeof(*all));
    t->nprefix = t->nfetched = 0; /* the lease takes the references */
    int rc = pf_lease_create(e->leases, in->id, all, total, in->world_size, res->lease);
    free(all);
    if (rc) {
        snprintf(err, errlen, "cannot create a lease: %s", strerror(-rc));
        return rc;
    }
    res->has_lease = true;
    return 0;
}

/* Group > 0 without wait_for_full_prefix: each position on its own, against RAM. */
static int query_members(struct pf_engine *e, struct pf_instance *in,
                         const struct pf_block_key *keys, struct pf_block **blocks, size_t n,
                         struct pf_engine_query_result *res, char *err, size_t errlen)
{
    size_t hits = pf_cache_lookup_each(e->cache, keys, n, blocks);
    pf_child_add(pf_metric_child1(e->m_tier, "ram"), (double)hits);
    pf_child_add(pf_metric_child1(e->m_tier, "miss"), (double)(n - hits));
    res->num_hit_blocks = (uint32_t)hits;
    if (hits == 0)
        return 0;
    res->hit_positions = malloc(hits * sizeof(*res->hit_positions));
    if (!res->hit_positions) {
        for (size_t i = 0; i < n; i++)
            pf_block_put(blocks[i]);
        return -ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (blocks[i]) {
            res->hit_positions[k] = (uint32_t)i;
            blocks[k++] = blocks[i];
        }
    res->nhit_positions = k;
    int rc = pf_lease_create(e->leases, in->id, blocks, k, in->world_size, res->lease);
    if (rc) {
        snprintf(err, errlen, "cannot create a lease: %s", strerror(-rc));
        return rc;
    }
    res->has_lease = true;
    return 0;
}

/* Keys of q's hashes [from, n) into a new array (*keys_p, caller frees); lengths already
 * checked against pf_group_hash_max. */
static int make_keys(const struct pf_instance *in, const struct pf_engine_query *q, size_t from,
                     struct pf_block_key **keys_p)
{
    uint32_t g = q->group_id;
    struct pf_block_key *keys = malloc((q->n - from) * sizeof(*keys));
    if (!keys)
        return -ENOMEM;
    for (size_t i = from; i < q->n; i++) {
        struct pf_block_key *k = &keys[i - from];
        const struct pf_bytes *h = &q->hashes[i];
        if (g == 0 && (h->len == 32 || h->len == 16)) {
            /* pf_key_make for vLLM's hash sizes (sha256, xxh3-128) with constant-size
             * copies: its variable-size memcpy and memset cost ~6 ns a hash, these ~2 */
            k->ns = in->ns_id;
            k->len = (uint8_t)h->len;
            if (h->len == 32) {
                memcpy(k->hash, h->data, 32);
                memset(k->hash + 32, 0, PF_HASH_MAX - 32);
            } else {
                memcpy(k->hash, h->data, 16);
                memset(k->hash + 16, 0, PF_HASH_MAX - 16);
            }
        } else if (pf_group_key(in->ns_id, h->data, h->len, g, k) != 0) {
            free(keys); /* lengths were checked: not reached */
            return -EINVAL;
        }
    }
    *keys_p = keys;
    return 0;
}

int pf_engine_query(struct pf_engine *e, const struct pf_engine_query *q,
                    struct pf_engine_query_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    if (!q->req_id || !*q->req_id) {
        snprintf(err, errlen, "req_id must not be empty");
        return -EINVAL;
    }
    if (!q->instance_id || !*q->instance_id) {
        snprintf(err, errlen, "instance_id must not be empty");
        return -EINVAL;
    }
    struct pf_instance *in = pf_engine_instance_get(e, q->instance_id);
    if (!in) {
        snprintf(err, errlen, "instance %s not found", q->instance_id);
        return -ENOENT;
    }
    int rc = 0;
    struct pf_block_key *keys = NULL;
    struct pf_block **blocks = NULL;
    char *task_req = NULL;
    uint64_t *ids = NULL; /* the misses' reuse-estimator identities, when computed early */
    uint32_t g = q->group_id;
    if (g != 0) {
        rc = pf_instance_check_sealed(e, in, err, errlen);
        if (rc)
            goto out;
        if (g >= in->ngroups) {
            snprintf(err, errlen,
                     "group_id %u is not a storage group of instance %s (it has %u: "
                     "0..%u)",
                     g, in->id, in->ngroups, in->ngroups - 1);
            rc = -EINVAL;
            goto out;
        }
    }
    if (q->n == 0)
        goto out; /* Ready, 0 hits, no lease */
    for (size_t i = 0; i < q->n; i++)
        if (q->hashes[i].len == 0 || q->hashes[i].len > pf_group_hash_max(g)) {
            snprintf(err, errlen, "block hash %zu has %zu bytes (1..%zu allowed)", i,
                     q->hashes[i].len, pf_group_hash_max(g));
            rc = -EINVAL;
            goto out;
        }
    blocks = malloc(q->n * sizeof(*blocks));
    /* group 0 looks the request's hashes up in place and builds keys only for the part past
     * its RAM prefix (below); other groups' keys carry the group bytes */
    if (!blocks) {
        rc = -ENOMEM;
        goto out;
    }
    if (g != 0 && (rc = make_keys(in, q, 0, &keys)) != 0)
        goto out;
    if (g != 0 && !q->wait_for_full_prefix) {
        rc = query_members(e, in, keys, blocks, q->n, res, err, errlen);
        goto out;
    }
    bool want_set = g != 0;
    const char *req = q->req_id;
    if (want_set) {
        /* the want-set of group g has its own task next to the request's prefix task */
        size_t len = strlen(q->req_id) + 24;
        task_req = malloc(len);
        if (!task_req) {
            rc = -ENOMEM;
            goto out;
        }
        snprintf(task_req, len, "%s\x1fgroup%u", q->req_id, g);
        req = task_req;
    }
    /* a finished background fetch for this req_id answers first (with its original
     * hashes, as the reference does); a running one answers Loading */
    struct pf_prefetch_task *t = NULL;
    int st = e->ntiers ? pf_prefetch_take(e, q->instance_id, req, &t) : 0;
    if (st == 2 && t->n && t->keys[0].ns != in->ns_id) {
        /* left by an earlier registration of this instance id in another namespace */
        pf_prefetch_task_put(t);
        t = NULL;
        st = 0;
    }
    if (st == 1) {
        res->loading = true;
        goto out;
    }
    if (st == 2) {
        rc = finish_task(e, in, t, want_set, res, err, errlen);
        pf_prefetch_task_put(t);
        goto out;
    }
    /* the hits are pinned (no atomic per block); a lease takes the pins over */
    size_t hits = g == 0 ? pf_cache_prefix_pin_hashes(e->cache, in->ns_id, q->hashes, q->n, blocks)
                         : pf_cache_prefix_pin(e->cache, keys, q->n, blocks);
    bool pinned = true;
    /* the keys of the rest (tiers, reuse estimator): group 0 builds them now */
    const struct pf_block_key *rest = keys ? keys + hits : NULL;
    if (g == 0 && hits < q->n) {
        if ((rc = make_keys(in, q, hits, &keys)) != 0) {
            pf_cache_unpin(e->cache, blocks, hits);
            goto out;
        }
        rest = keys;
    }
    if (!want_set) {
        pf_metric_add(e->m_hits, (double)hits);
        pf_metric_add(e->m_misses, (double)(q->n - hits));
    }
    pf_child_add(pf_metric_child1(e->m_tier, "ram"), (double)hits);
    if (hits < q->n && e->ntiers) {
        /* the plan: which tier serves which run of the rest, decided now (one bounded
         * discovery), counted now (ram + tiers + miss = asked) */
        /* a background task may take the prefix over: it holds strong references */
        pf_cache_pins_to_refs(e->cache, blocks, hits);
        pinned = false;
        bool full = q->wait_for_full_prefix;
        struct pf_plan plan;
        /* while the remote tier's discovery travels, this thread computes the misses'
         * identities for the reuse estimator: a Ready answer records them without another
         * pass (bench/README.md, the pure-miss row) */
        if (pf_prefetch_plan_start(e, req, rest, q->n - hits, &plan) && !want_set)
            ids = hll_ids(e, in, rest, q->n - hits);
        pf_prefetch_plan(e, req, rest, q->n - hits, full, &plan);
        if (plan.nsegs) {
            for (size_t i = 0; i < e->ntiers; i++)
                if (plan.planned[i])
                    pf_child_add(pf_metric_child1(e->m_tier, e->tiers[i].name),
                                 (double)plan.planned[i]);
            pf_child_add(pf_metric_child1(e->m_tier, "miss"), (double)(q->n - hits - plan.covered));
            int brc = pf_prefetch_begin(e, q->instance_id, req, rest, q->n - hits, blocks, hits,
                                        full, &plan);
            if (brc == 0) {
                res->loading = true;
                goto out; /* the task owns the prefix references now */
            }
            /* no task (queue full, memory): the plan is not delivered */
            for (size_t i = 0; i < e->ntiers; i++)
                if (plan.planned[i])
                    pf_child_add(pf_metric_child2(e->m_shortfall, e->tiers[i].name,
                                                  brc == -EAGAIN ? "queue_full" : "error"),
                                 (double)plan.planned[i]);
            goto answer;
        }
    }
    pf_child_add(pf_metric_child1(e->m_tier, "miss"), (double)(q->n - hits));
answer:
    res->num_hit_blocks = (uint32_t)hits;
    if (want_set && hits < q->n) {
        drop_blocks(e, blocks, hits, pinned); /* a partial want-set is a miss: no lease */
        goto out;
    }
    if (!want_set && ids)
        pf_hll_record_ids(e->hll, ids, q->n - hits, q->n);
    else if (!want_set)
        record_hll(e, in, rest, q->n - hits, q->n);
    if (want_set && (rc = positions_all(res, hits)) != 0) {
        drop_blocks(e, blocks, hits, pinned);
        goto out;
    }
    if (hits > 0) {
        rc = pinned ? pf_lease_create_pinned(e->leases, e->cache, in->id, blocks, hits,
                                             in->world_size, res->lease)
                    : pf_lease_create(e->leases, in->id, blocks, hits, in->world_size, res->lease);
        if (rc) {
            snprintf(err, errlen, "cannot create a lease: %s", strerror(-rc));
            goto out;
        }
        res->has_lease = true;
    }
    pf_trace("query %s/%s group %u: %zu of %zu blocks resident", q->instance_id, q->req_id, g, hits,
             q->n);
out:
    if (rc) {
        free(res->hit_positions);
        res->hit_positions = NULL;
        res->nhit_positions = 0;
    }
    free(task_req);
    free(ids);
    free(keys);
    free(blocks);
    pf_instance_put(in);
    return rc;
}

int pf_engine_release(struct pf_engine *e, const struct pf_bytes *lease, char *err, size_t errlen)
{
    int rc = pf_lease_release(e->leases, lease->data, lease->len);
    if (rc == -EINVAL)
        snprintf(err, errlen, "query lease must be %d bytes, got %zu", PF_LEASE_ID_LEN, lease->len);
    else if (rc)
        snprintf(err, errlen, "query lease is unknown or expired");
    return rc;
}

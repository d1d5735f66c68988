/* QueryPrefetch and Release (reference §2.3, §2.4). Group 0 is a prefix query: the longest
 * run of resident blocks from the first hash. A Ready answer with hits pins those blocks
 * with a lease (one share per worker of the instance). A RAM miss leaves no state behind,
 * so the same req_id can hit later. Backing tiers (SSD, peers) start a per-req_id
 * background task and answer Loading; without them the answer is Ready at once. */
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

/* Promotes a finished task's blocks into RAM and answers Ready with a lease over the RAM
 * prefix at task start plus the fetched run. */
static int finish_task(struct pf_engine *e, struct pf_instance *in, struct pf_prefetch_task *t,
                       struct pf_engine_query_result *res, char *err, size_t errlen)
{
    size_t total = t->nprefix + t->nfetched;
    if (t->nfetched && t->tier >= 0) {
        const struct pf_tier *tier = &e->tiers[t->tier];
        struct pf_block **fresh = malloc(t->nfetched * sizeof(*fresh));
        size_t nfresh = 0;
        for (size_t i = 0; i < t->nfetched; i++)
            if (pf_cache_insert(e->cache, t->fetched[i], (enum pf_block_class)tier->cls) == 1 &&
                fresh)
                fresh[nfresh++] = t->fetched[i];
        /* newly resident blocks are advertised like sealed ones (the reference forgets
         * promoted blocks, so peers could not discover them) */
        pf_engine_run_sealed_hooks(e, fresh, nfresh);
        free(fresh);
        if (tier->promoted)
            tier->promoted(tier->ctx, t->fetched, t->nfetched);
    }
    res->num_hit_blocks = (uint32_t)total;
    record_hll(e, in, t->keys + t->nfetched, t->n - t->nfetched, t->nprefix + t->n);
    if (total == 0)
        return 0;
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
    if (q->group_id != 0) {
        snprintf(err, errlen, "group_id %u: hybrid cache groups are not supported yet",
                 q->group_id);
        rc = -EINVAL;
        goto out;
    }
    if (q->n == 0)
        goto out; /* Ready, 0 hits, no lease */
    keys = malloc(q->n * sizeof(*keys));
    blocks = malloc(q->n * sizeof(*blocks));
    if (!keys || !blocks) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < q->n; i++) {
        if (pf_key_make(in->ns_id, q->hashes[i].data, q->hashes[i].len, &keys[i]) != 0) {
            snprintf(err, errlen, "block hash %zu has %zu bytes (1..%d allowed)", i,
                     q->hashes[i].len, PF_HASH_MAX);
            rc = -EINVAL;
            goto out;
        }
    }
    /* a finished background fetch for this req_id answers first (with its original
     * hashes, as the reference does); a running one answers Loading */
    struct pf_prefetch_task *t = NULL;
    int st = e->ntiers ? pf_prefetch_take(e, q->instance_id, q->req_id, &t) : 0;
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
        rc = finish_task(e, in, t, res, err, errlen);
        pf_prefetch_task_put(t);
        goto out;
    }
    size_t hits = pf_cache_prefix(e->cache, keys, q->n, blocks);
    pf_metric_add(e->m_hits, (double)hits);
    pf_metric_add(e->m_misses, (double)(q->n - hits));
    pf_child_add(pf_metric_child1(e->m_tier, "ram"), (double)hits);
    if (hits < q->n && e->ntiers) {
        size_t cnt = 0;
        int tier = pf_prefetch_probe(e, q->req_id, keys + hits, q->n - hits,
                                     q->wait_for_full_prefix, &cnt);
        if (tier >= 0 && pf_prefetch_begin(e, q->instance_id, q->req_id, keys + hits, q->n - hits,
                                           blocks, hits, q->wait_for_full_prefix) == 0) {
            pf_child_add(pf_metric_child1(e->m_tier, e->tiers[tier].name), (double)cnt);
            pf_child_add(pf_metric_child1(e->m_tier, "miss"), (double)(q->n - hits - cnt));
            res->loading = true;
            goto out; /* the task owns the prefix references now */
        }
    }
    pf_child_add(pf_metric_child1(e->m_tier, "miss"), (double)(q->n - hits));
    record_hll(e, in, keys + hits, q->n - hits, q->n);
    res->num_hit_blocks = (uint32_t)hits;
    if (hits > 0) {
        rc = pf_lease_create(e->leases, in->id, blocks, hits, in->world_size, res->lease);
        if (rc) {
            snprintf(err, errlen, "cannot create a lease: %s", strerror(-rc));
            goto out;
        }
        res->has_lease = true;
    }
    pf_trace("query %s/%s: %zu of %zu blocks resident", q->instance_id, q->req_id, hits, q->n);
out:
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

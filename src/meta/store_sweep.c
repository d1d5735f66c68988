/* MetaServer memory store, the sweep (layout: store.c, store_internal.h): expired owners
 * and stale sessions dropped shard by shard, ids freed when nothing references them, the
 * redundancy snapshot, and the store's stats. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "metastore"
#include "meta/meta_internal.h"
#include "meta/store_internal.h"
#include "meta/store_tables.h"
#include "pf/log.h"
#include "pf/meta.h"
#include "pf/metrics.h"

/* ------------------------------------------------------------------ sweep */

struct sweep_snap {
    uint32_t nsess, nns;
    uint8_t *sess_flags; /* bit0 kept, bit1 visible, bit2 GC candidate */
    uint64_t *sess_refs;
    uint64_t *ns_keys;
    uint64_t epoch;
    uint64_t now;
    uint32_t now_s;
};

#define SF_KEPT      1u
#define SF_VISIBLE   2u
#define SF_CANDIDATE 4u

void pf_meta_store_sweep(struct pf_meta_store *st, struct pf_meta_sweep_stats *stats_p)
{
    if (st->ops) {
        st->ops->sweep(st->impl, stats_p);
        return;
    }
    struct pf_meta_sweep_stats stats = {0};
    struct sweep_snap sn = {0};
    pthread_mutex_lock(&st->sweep_mu);

    /* 1. node records past the TTL; snapshot session states */
    pthread_rwlock_wrlock(&st->reg);
    sn.epoch = ++st->sweep_epoch;
    sn.now = now_ns(st);
    sn.now_s = now_secs(st, sn.now);
    for (uint32_t i = 0; i < st->addrs.hw; i++) {
        struct maddr *a = st->addrs.v[i];
        if (!a || a->cur == NO_ID)
            continue;
        uint64_t seen = atomic_load(&a->last_seen_ns);
        if (sn.now > seen && sn.now - seen > st->ttl_ns) {
            a->cur = NO_ID;
            stats.removed_nodes++;
            pf_info("sweep: node %s dropped (no heartbeat for %llu s)", a->name,
                    (unsigned long long)((sn.now - seen) / PF_NS_PER_SEC));
        }
    }
    sn.nsess = st->sessions.hw;
    sn.nns = st->nss.hw;
    sn.sess_flags = calloc(sn.nsess ? sn.nsess : 1, 1);
    sn.sess_refs = calloc(sn.nsess ? sn.nsess : 1, sizeof(uint64_t));
    sn.ns_keys = calloc(sn.nns ? sn.nns : 1, sizeof(uint64_t));
    bool gc = sn.sess_flags && sn.sess_refs && sn.ns_keys;
    for (uint32_t i = 0; i < sn.nsess && sn.sess_flags; i++) {
        struct msess *s = st->sessions.v[i];
        if (!s) {
            /* a free id may be reused by a session created during the scan: keep its owners */
            sn.sess_flags[i] = SF_KEPT | SF_VISIBLE;
            continue;
        }
        struct maddr *a = addr_at(st, s->addr);
        uint8_t f = 0;
        if (a->cur != NO_ID)
            f |= SF_KEPT; /* the record exists and is within the TTL (checked above) */
        if (owner_visible(st, i, sn.now))
            f |= SF_VISIBLE;
        if (a->cur != i)
            f |= SF_CANDIDATE;
        sn.sess_flags[i] = f;
    }
    pthread_rwlock_unlock(&st->reg);
    if (!sn.sess_flags) {
        pf_warn("sweep skipped: out of memory");
        goto out;
    }

    /* 2. keys, shard by shard */
    uint64_t red[4] = {0}, copies = 0;
    uint64_t ttl_s = st->cfg.ttl_secs;
    for (size_t si = 0; si < NSHARDS; si++) {
        struct shard *s = &st->shards[si];
        pthread_mutex_lock(&s->mu);
        size_t i = 0;
        while (i < s->n) {
            uint32_t v = s->ix[i];
            if (!v) {
                i++;
                continue;
            }
            struct eview e;
            entry_view(s, v & OFF_MASK, &e);
            struct owner *o = e.own;
            size_t keep = 0, vis = 0, nown = 0;
            for (size_t k = 0; k < e.cap && o[k].sess != NO_ID; k++) {
                nown++;
                uint32_t sid = o[k].sess;
                uint8_t f = sid < sn.nsess ? sn.sess_flags[sid] : SF_KEPT | SF_VISIBLE;
                int64_t age = (int64_t)sn.now_s - (int64_t)o[k].reg_s;
                if (!(f & SF_KEPT) || age > (int64_t)ttl_s)
                    continue;
                if (f & SF_VISIBLE)
                    vis++;
                o[keep++] = o[k];
            }
            size_t dropped = nown - keep;
            stats.removed_owners += dropped;
            s->owners -= dropped;
            if (keep == 0) {
                meta_store_entry_free(s, v & OFF_MASK);
                meta_store_shard_del_slot(s, i);
                stats.removed_keys++;
                continue;
            }
            if (dropped) {
                for (size_t k = keep; k < nown; k++)
                    o[k] = (struct owner){NO_ID, 0};
                meta_store_entry_maybe_shrink(s, i);
                entry_view(s, s->ix[i] & OFF_MASK, &e);
                o = e.own;
            }
            for (size_t k = 0; k < keep; k++)
                if (o[k].sess < sn.nsess)
                    sn.sess_refs[o[k].sess]++;
            if (e.ns < sn.nns)
                sn.ns_keys[e.ns]++;
            if (vis) {
                red[vis >= 4 ? 3 : vis - 1]++;
                copies += vis;
            }
            i++;
        }
        meta_store_shard_maybe_shrink(s);
        pthread_mutex_unlock(&s->mu);
    }
    for (int k = 0; k < 4; k++)
        atomic_store(&st->red[k], red[k]);
    atomic_store(&st->red_copies, copies);

    /* 3. unreferenced sessions, addresses and namespaces */
    if (gc) {
        pthread_rwlock_wrlock(&st->reg);
        for (uint32_t i = 0; i < sn.nsess; i++) {
            struct msess *s = st->sessions.v[i];
            if (!s || !(sn.sess_flags[i] & SF_CANDIDATE) || sn.sess_refs[i] ||
                s->cur_epoch >= sn.epoch)
                continue;
            struct maddr *a = addr_at(st, s->addr);
            if (a->cur == i)
                continue;
            meta_idtab_del(&st->sessions, i);
            a->nsess--;
            free(s);
        }
        for (uint32_t i = 0; i < st->addrs.hw; i++) {
            struct maddr *a = st->addrs.v[i];
            if (!a || a->cur != NO_ID || a->nsess)
                continue;
            meta_idtab_del(&st->addrs, i);
            free(a->name);
            free(a);
        }
        for (uint32_t i = 0; i < sn.nns; i++) {
            struct mns *n = st->nss.v[i];
            if (!n || sn.ns_keys[i] || atomic_load(&n->used_epoch) >= sn.epoch)
                continue;
            meta_idtab_del(&st->nss, i);
            free(n->name);
            free(n);
        }
        meta_idtab_reindex(&st->sessions, sess_hashv);
        meta_idtab_reindex(&st->addrs, addr_hashv);
        meta_idtab_reindex(&st->nss, ns_hashv);
        pthread_rwlock_unlock(&st->reg);
    }
    pf_metric_add(st->c_sw_owners, (double)stats.removed_owners);
    pf_metric_add(st->c_sw_keys, (double)stats.removed_keys);
    pf_metric_add(st->c_sw_nodes, (double)stats.removed_nodes);
    pf_metric_add(st->c_sweeps, 1);
    if (stats.removed_owners || stats.removed_keys || stats.removed_nodes)
        pf_info("sweep: removed %llu owners, %llu keys, %llu nodes",
                (unsigned long long)stats.removed_owners, (unsigned long long)stats.removed_keys,
                (unsigned long long)stats.removed_nodes);
out:
    free(sn.sess_flags);
    free(sn.sess_refs);
    free(sn.ns_keys);
    pthread_mutex_unlock(&st->sweep_mu);
    if (stats_p)
        *stats_p = stats;
}

void pf_meta_store_get_stats(struct pf_meta_store *st, struct pf_meta_store_stats *out)
{
    if (st->ops) {
        st->ops->get_stats(st->impl, out);
        return;
    }
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < NSHARDS; i++) {
        struct shard *s = &st->shards[i];
        pthread_mutex_lock(&s->mu);
        out->entries += s->count;
        out->owners += s->owners;
        out->bytes += meta_arena_bytes(&s->arena) + s->big_bytes + (size_t)s->n * sizeof(*s->ix);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_rwlock_rdlock(&st->reg);
    uint64_t now = now_ns(st);
    for (uint32_t i = 0; i < st->addrs.hw; i++) {
        struct maddr *a = st->addrs.v[i];
        if (!a || a->cur == NO_ID)
            continue;
        if (owner_visible(st, a->cur, now))
            out->nodes_active++;
        else
            out->nodes_stale++;
    }
    out->sessions = st->sessions.live;
    out->namespaces = st->nss.live;
    pthread_rwlock_unlock(&st->reg);
    for (int k = 0; k < 4; k++)
        out->redundancy[k] = atomic_load(&st->red[k]);
    out->visible_copies = atomic_load(&st->red_copies);
}

uint64_t pf_meta_store_stale_secs(const struct pf_meta_store *st)
{
    return st->cfg.node_stale_secs;
}

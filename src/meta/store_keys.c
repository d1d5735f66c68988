/* MetaServer memory store, keys (layout: store.c, store_internal.h): insert and remove of
 * a node's block hashes, and prefix queries over the owners still visible. */
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

/* ------------------------------------------------------------------ keys */

/* Shared lock held; validates the session and resolves the namespace (interning it when
 * intern is set, which may drop and retake the lock). */
static int begin_write(struct pf_meta_store *st, const char *ns, const char *node,
                       const uint8_t node_id[16], bool intern, uint64_t *now_p, struct msess **s_p,
                       struct mns **n_p)
{
    size_t nlen, nslen;
    if (!meta_store_valid_str(node, PF_META_NODE_MAX, &nlen) ||
        !meta_store_valid_str(ns, PF_META_NS_MAX, &nslen) || !node_id)
        return -EINVAL;
    for (int attempt = 0;; attempt++) {
        uint64_t now = now_ns(st);
        int rc = meta_store_session_check(st, node, nlen, node_id, now, s_p);
        if (rc)
            return rc;
        struct mns *n = meta_store_ns_find(st, ns, nslen);
        if (n || !intern) {
            if (n && atomic_load_explicit(&n->used_epoch, memory_order_relaxed) != st->sweep_epoch)
                atomic_store(&n->used_epoch, st->sweep_epoch);
            *now_p = now;
            *n_p = n;
            return 0;
        }
        if (attempt > 0)
            return -ENOMEM;
        pthread_rwlock_unlock(&st->reg);
        pthread_rwlock_wrlock(&st->reg);
        rc = meta_store_ns_intern(st, ns, nslen, &n);
        pthread_rwlock_unlock(&st->reg);
        pthread_rwlock_rdlock(&st->reg);
        if (rc)
            return rc;
    }
}

int pf_meta_store_insert(struct pf_meta_store *st, const char *ns, const struct pf_meta_hash *h,
                         size_t n, const char *node, const uint8_t node_id[16], bool *reclaimable)
{
    if (st->ops)
        return st->ops->insert(st->impl, ns, h, n, node, node_id, reclaimable);
    int rc = meta_store_check_hashes(h, n);
    if (rc)
        return rc;
    uint64_t now;
    struct msess *sess;
    struct mns *nsp;
    pthread_rwlock_rdlock(&st->reg);
    rc = begin_write(st, ns, node, node_id, true, &now, &sess, &nsp);
    if (rc)
        goto out;
    uint32_t now_s = now_secs(st, now), sid = sess->id, aid = sess->addr;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *key = h[i].data;
        size_t len = h[i].len;
        uint64_t kh = key_hash(nsp->id, key, len);
        struct shard *s = shard_of(st, kh);
        bool is_new = false;
        pthread_mutex_lock(&s->mu);
        size_t empty = 0; /* set by meta_store_shard_find on a miss */
        ptrdiff_t at = meta_store_shard_find(s, kh, nsp->id, key, len, &empty);
        if (at < 0) {
            if ((s->count + 1) * 5 > (size_t)s->n * 4) {
                uint32_t grown = s->n + (s->n / 2 > 16 ? s->n / 2 : 16);
                if (meta_store_shard_resize(s, grown) == 0)
                    meta_store_shard_find(s, kh, nsp->id, key, len, &empty);
                else if (s->count + 1 >= s->n) {
                    pthread_mutex_unlock(&s->mu);
                    rc = -ENOMEM;
                    goto out;
                }
            }
            uint32_t off = meta_store_entry_new(s, nsp->id, key, len, (struct owner){sid, now_s});
            if (!off) {
                pthread_mutex_unlock(&s->mu);
                rc = -ENOMEM;
                goto out;
            }
            s->ix[empty] = tag_of(kh) << OFF_BITS | off;
            at = (ptrdiff_t)empty;
            s->count++;
            s->owners++;
            is_new = true;
        } else {
            struct eview e;
            entry_view(s, s->ix[at] & OFF_MASK, &e);
            uint32_t k;
            for (k = 0; k < e.cap && e.own[k].sess != NO_ID; k++)
                if (sess_at(st, e.own[k].sess)->addr == aid)
                    break;
            if (k < e.cap && e.own[k].sess != NO_ID) {
                is_new = e.own[k].sess != sid;
                e.own[k].sess = sid;
                e.own[k].reg_s = now_s;
            } else if (k == OWNERS_MAX) {
                pthread_mutex_unlock(&s->mu);
                rc = -ENOSPC;
                goto out;
            } else {
                if (k == e.cap && meta_store_entry_set_cap(s, (size_t)at, e.cap * 2)) {
                    pthread_mutex_unlock(&s->mu);
                    rc = -ENOMEM;
                    goto out;
                }
                entry_view(s, s->ix[at] & OFF_MASK, &e);
                e.own[k] = (struct owner){sid, now_s};
                s->owners++;
                is_new = true;
            }
        }
        if (reclaimable) {
            bool r = false;
            if (is_new) {
                struct eview e;
                entry_view(s, s->ix[at] & OFF_MASK, &e);
                unsigned vis = 0;
                for (size_t k = 0; k < e.cap && e.own[k].sess != NO_ID && vis < 3; k++)
                    if (owner_visible(st, e.own[k].sess, now))
                        vis++;
                r = vis >= 3;
            }
            reclaimable[i] = r;
        }
        pthread_mutex_unlock(&s->mu);
    }
out:
    pthread_rwlock_unlock(&st->reg);
    return rc;
}

int pf_meta_store_remove(struct pf_meta_store *st, const char *ns, const struct pf_meta_hash *h,
                         size_t n, const char *node, const uint8_t node_id[16], uint64_t *removed_p)
{
    if (st->ops)
        return st->ops->remove(st->impl, ns, h, n, node, node_id, removed_p);
    int rc = meta_store_check_hashes(h, n);
    if (rc)
        return rc;
    uint64_t now, removed = 0;
    struct msess *sess;
    struct mns *nsp;
    pthread_rwlock_rdlock(&st->reg);
    rc = begin_write(st, ns, node, node_id, false, &now, &sess, &nsp);
    if (rc || !nsp)
        goto out;
    uint32_t sid = sess->id;
    for (size_t i = 0; i < n; i++) {
        uint64_t kh = key_hash(nsp->id, h[i].data, h[i].len);
        struct shard *s = shard_of(st, kh);
        pthread_mutex_lock(&s->mu);
        ptrdiff_t at = meta_store_shard_find(s, kh, nsp->id, h[i].data, h[i].len, NULL);
        if (at >= 0) {
            struct eview e;
            entry_view(s, s->ix[at] & OFF_MASK, &e);
            size_t k;
            for (k = 0; k < e.cap && e.own[k].sess != NO_ID && e.own[k].sess != sid; k++)
                ;
            if (k < e.cap && e.own[k].sess == sid) {
                removed++;
                if (meta_store_entry_drop_owner(s, (size_t)at, k))
                    meta_store_shard_maybe_shrink(s);
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
out:
    pthread_rwlock_unlock(&st->reg);
    if (rc == 0)
        *removed_p = removed;
    return rc;
}

/* pf_meta_store_query_prefix's pipeline distances (hashes ahead of the one looked up) */
#define QP_SLOT  8 /* hashed, index slot prefetched */
#define QP_ENTRY 4 /* its tag probed in the index under the shard lock, entry prefetched */

/* Prefetches, under the shard's lock, the entries whose index slots carry hash kh's tag on
 * its probe sequence (usually the one entry; a false tag match 1 in 64): reads only the
 * index, whose slot line the QP_SLOT stage prefetched, so it does not wait for an entry. */
static void entry_prefetch(struct pf_meta_store *st, uint64_t kh)
{
    struct shard *s = shard_of(st, kh);
    uint32_t tag = tag_of(kh);
    pthread_mutex_lock(&s->mu);
    if (s->n) {
        size_t i = home_of(kh, s->n);
        for (uint32_t v; (v = s->ix[i]) != 0;) {
            if ((v >> OFF_BITS) == tag) {
                const char *p = (const char *)meta_arena_at(&s->arena, v & OFF_MASK);
                __builtin_prefetch(p);
                __builtin_prefetch(p + 63);
            }
            if (++i == s->n)
                i = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

struct prefix_acc {
    uint32_t addr;
    uint64_t len;
};

int pf_meta_store_query_prefix(struct pf_meta_store *st, const char *ns,
                               const struct pf_meta_hash *h, size_t n,
                               struct pf_meta_prefix **res_p, size_t *nres_p)
{
    if (st->ops)
        return st->ops->query_prefix(st->impl, ns, h, n, res_p, nres_p);
    size_t nslen;
    if (!meta_store_valid_str(ns, PF_META_NS_MAX, &nslen))
        return -EINVAL;
    int rc = meta_store_check_hashes(h, n);
    if (rc)
        return rc;
    struct prefix_acc stackacc[16], *acc = stackacc;
    size_t nacc = 0, capacc = PF_ARRAY_SIZE(stackacc);
    struct pf_meta_prefix *res = NULL;
    size_t nres = 0;
    pthread_rwlock_rdlock(&st->reg);
    uint64_t now = now_ns(st);
    struct mns *nsp = meta_store_ns_find(st, ns, nslen);
    /* A two-stage pipeline, because the entry read is a dependent miss that no lock-free
     * prefetch can start (its offset is in the index, which only the shard's lock keeps
     * mapped): hash i + QP_SLOT is hashed and its index slot prefetched (lock-free hint; a
     * prefetch of a stale one cannot fault, it loads the wrong line); for hash i + QP_ENTRY
     * the entries its tag points at are prefetched (entry_prefetch: the index only, under
     * its shard's lock); hash i is looked up as before, on lines that have arrived (a
     * concurrent change between the stages only makes a prefetch useless: the lookup itself
     * runs under the lock). A query that misses early wastes at most QP_SLOT hashes and
     * QP_ENTRY probes (well under a microsecond next to the RPC). */
    uint64_t khs[QP_SLOT];
    for (size_t j = 0; nsp && j < n && j < QP_SLOT; j++) {
        khs[j] = key_hash(nsp->id, h[j].data, h[j].len);
        shard_prefetch(shard_of(st, khs[j]), khs[j]);
    }
    for (size_t j = 0; nsp && j < n && j < QP_ENTRY; j++)
        entry_prefetch(st, khs[j]);
    for (size_t i = 0; nsp && i < n; i++) {
        uint64_t kh = khs[i % QP_SLOT];
        struct shard *s = shard_of(st, kh);
        if (i + QP_ENTRY < n)
            entry_prefetch(st, khs[(i + QP_ENTRY) % QP_SLOT]);
        if (i + QP_SLOT < n) {
            uint64_t ka = key_hash(nsp->id, h[i + QP_SLOT].data, h[i + QP_SLOT].len);
            khs[i % QP_SLOT] = ka;
            shard_prefetch(shard_of(st, ka), ka);
        }
        bool any = false;
        size_t alive = 0;
        pthread_mutex_lock(&s->mu);
        ptrdiff_t at = meta_store_shard_find(s, kh, nsp->id, h[i].data, h[i].len, NULL);
        if (at >= 0) {
            struct eview e;
            entry_view(s, s->ix[at] & OFF_MASK, &e);
            for (size_t k = 0; k < e.cap && e.own[k].sess != NO_ID; k++) {
                if (!owner_visible(st, e.own[k].sess, now))
                    continue;
                any = true;
                uint32_t aid = sess_at(st, e.own[k].sess)->addr;
                size_t j;
                for (j = 0; j < nacc && acc[j].addr != aid; j++)
                    ;
                if (j < nacc) {
                    if (acc[j].len == i) {
                        acc[j].len++;
                        alive++;
                    }
                } else if (i == 0) {
                    if (nacc == capacc) {
                        size_t nc = capacc * 2;
                        struct prefix_acc *na = malloc(nc * sizeof(*na));
                        if (!na) {
                            pthread_mutex_unlock(&s->mu);
                            rc = -ENOMEM;
                            goto out;
                        }
                        memcpy(na, acc, nacc * sizeof(*na));
                        if (acc != stackacc)
                            free(acc);
                        acc = na;
                        capacc = nc;
                    }
                    acc[nacc].addr = aid;
                    acc[nacc].len = 1;
                    nacc++;
                    alive++;
                }
            }
        }
        pthread_mutex_unlock(&s->mu);
        if (!any || alive == 0)
            break;
    }
    /* one allocation: the array, then the node strings */
    size_t bytes = 0;
    for (size_t j = 0; j < nacc; j++)
        bytes += sizeof(*res) + addr_at(st, acc[j].addr)->len + 1;
    if (nacc) {
        res = malloc(bytes);
        if (!res) {
            rc = -ENOMEM;
            goto out;
        }
        char *p = (char *)(res + nacc);
        for (size_t j = 0; j < nacc; j++) {
            struct maddr *a = addr_at(st, acc[j].addr);
            memcpy(p, a->name, a->len + 1);
            res[j].node = p;
            res[j].prefix_len = acc[j].len;
            p += a->len + 1;
        }
        nres = nacc;
    }
out:
    pthread_rwlock_unlock(&st->reg);
    if (acc != stackacc)
        free(acc);
    if (rc == 0) {
        *res_p = res;
        *nres_p = nres;
    }
    return rc;
}

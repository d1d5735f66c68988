/* MetaServer store: (namespace, block hash) -> owners, plus the node/session registry.
 *
 * Layout, chosen for memory per key and scan speed (see docs/metaserver.md):
 *   - Strings are interned: namespaces, node addresses and node sessions (address + UUID)
 *     get small integer ids in a registry guarded by one reader/writer lock (writer-
 *     preferring). Request paths hold it shared for the whole request; it is taken
 *     exclusively only to create a node/session/namespace, take over or unregister a node,
 *     and at the start and end of a sweep.
 *   - Keys live in 256 shards (top 8 bits of the key's xxh3), each a mutex and a linear-
 *     probing table of 8-byte slots: the entry pointer with 16 hash bits in its unused top
 *     bits, so a probe dereferences an entry only on a 1/65536 false match. Deletion is by
 *     backward shift (no tombstones).
 *   - An entry is one allocation: {u32 key hash, u32 namespace id, u16 hash length, u16
 *     owner count, u16 owner capacity, hash bytes, owners}; an owner is {u32 session id, u32
 *     register second}. Capacity starts at 2 (a block usually gains a second owner: no
 *     reallocation then) and doubles. Entries come from a per-shard slab with 8-byte size
 *     classes, so a 32-byte hash with one or two owners costs 64 bytes.
 *   - A session id identifies (address, node_id); the address's node record says which
 *     session is current and when it was last seen, so visibility is two array lookups.
 *
 * Session and namespace ids are freed only by the sweep, and only when they were already
 * unusable when the sweep started (non-current session / unused namespace) and no entry
 * references them, so an id is never reused while an entry still points to it. */
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

/* ------------------------------------------------------------------ entries */

/* ------------------------------------------------------------------ shards */

int meta_store_shard_resize(struct shard *s, size_t nslots)
{
    uint64_t *ns = calloc(nslots, sizeof(*ns));
    if (!ns)
        return -ENOMEM;
    size_t mask = nslots - 1;
    for (size_t i = 0; s->slots && i <= s->mask; i++) {
        uint64_t v = s->slots[i];
        if (!v)
            continue;
        size_t j = slot_entry(v)->khash & mask;
        while (ns[j])
            j = (j + 1) & mask;
        ns[j] = v;
    }
    free(s->slots);
    s->slots = ns;
    s->mask = mask;
    return 0;
}

/* Removes slot i by backward shift. */
void meta_store_shard_del_slot(struct shard *s, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & s->mask;
        uint64_t v = s->slots[j];
        if (!v)
            break;
        size_t home = slot_entry(v)->khash & s->mask;
        /* v may move to i unless its home lies cyclically in (i, j] */
        bool stay = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stay) {
            s->slots[i] = v;
            i = j;
        }
    }
    s->slots[i] = 0;
    s->count--;
}

void meta_store_shard_maybe_shrink(struct shard *s)
{
    size_t n = s->mask + 1;
    if (n > 64 && s->count < n / 8) {
        size_t want = 64;
        while (want < s->count * 4)
            want <<= 1;
        meta_store_shard_resize(s, want); /* failure keeps the bigger table */
    }
}

void meta_store_entry_free(struct shard *s, struct entry *e)
{
    meta_slab_free(&s->slab, e, entry_size(e->hlen, e->cap));
}

/* ------------------------------------------------------------------ registry */

static uint64_t str_hash(const char *s, size_t len)
{
    return XXH3_64bits(s, len);
}

static uint64_t sess_hash(uint32_t addr, const uint8_t uuid[16])
{
    return XXH3_64bits_withSeed(uuid, 16, addr);
}

/* ------------------------------------------------------------------ store */

static struct maddr *addr_find(struct pf_meta_store *st, const char *name, size_t len)
{
    struct idtab *t = &st->addrs;
    if (!t->ix)
        return NULL;
    uint64_t h = str_hash(name, len);
    for (size_t i = h & t->ixmask; t->ix[i] != NO_ID; i = (i + 1) & t->ixmask) {
        struct maddr *a = t->v[t->ix[i]];
        if (a->h == h && a->len == len && memcmp(a->name, name, len) == 0)
            return a;
    }
    return NULL;
}

static struct msess *sess_find(struct pf_meta_store *st, uint32_t addr, const uint8_t uuid[16])
{
    struct idtab *t = &st->sessions;
    if (!t->ix)
        return NULL;
    uint64_t h = sess_hash(addr, uuid);
    for (size_t i = h & t->ixmask; t->ix[i] != NO_ID; i = (i + 1) & t->ixmask) {
        struct msess *s = t->v[t->ix[i]];
        if (s->h == h && s->addr == addr && memcmp(s->uuid, uuid, 16) == 0)
            return s;
    }
    return NULL;
}

struct mns *meta_store_ns_find(struct pf_meta_store *st, const char *name, size_t len)
{
    struct idtab *t = &st->nss;
    if (!t->ix)
        return NULL;
    uint64_t h = str_hash(name, len);
    for (size_t i = h & t->ixmask; t->ix[i] != NO_ID; i = (i + 1) & t->ixmask) {
        struct mns *n = t->v[t->ix[i]];
        if (n->h == h && n->len == len && memcmp(n->name, name, len) == 0)
            return n;
    }
    return NULL;
}

/* Exclusive lock held. */
static int addr_intern(struct pf_meta_store *st, const char *name, size_t len, struct maddr **a_p)
{
    struct maddr *a = addr_find(st, name, len);
    if (a) {
        *a_p = a;
        return 0;
    }
    a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->name = strndup(name, len);
    if (!a->name)
        goto err_free;
    a->len = len;
    a->h = str_hash(name, len);
    a->cur = NO_ID;
    if (meta_idtab_add(&st->addrs, a, a->h, addr_hashv, &a->id))
        goto err_name;
    *a_p = a;
    return 0;
err_name:
    free(a->name);
err_free:
    free(a);
    return -ENOMEM;
}

static int sess_intern(struct pf_meta_store *st, struct maddr *a, const uint8_t uuid[16],
                       struct msess **s_p)
{
    struct msess *s = sess_find(st, a->id, uuid);
    if (s) {
        *s_p = s;
        return 0;
    }
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    memcpy(s->uuid, uuid, 16);
    s->addr = a->id;
    s->h = sess_hash(a->id, uuid);
    if (meta_idtab_add(&st->sessions, s, s->h, sess_hashv, &s->id)) {
        free(s);
        return -ENOMEM;
    }
    a->nsess++;
    *s_p = s;
    return 0;
}

int meta_store_ns_intern(struct pf_meta_store *st, const char *name, size_t len, struct mns **n_p)
{
    struct mns *n = meta_store_ns_find(st, name, len);
    if (n) {
        *n_p = n;
        return 0;
    }
    n = calloc(1, sizeof(*n));
    if (!n)
        return -ENOMEM;
    n->name = strndup(name, len);
    if (!n->name) {
        free(n);
        return -ENOMEM;
    }
    n->len = len;
    n->h = str_hash(name, len);
    atomic_store(&n->used_epoch, st->sweep_epoch);
    if (meta_idtab_add(&st->nss, n, n->h, ns_hashv, &n->id)) {
        free(n->name);
        free(n);
        return -ENOMEM;
    }
    *n_p = n;
    return 0;
}

bool meta_store_valid_str(const char *s, size_t max, size_t *len_p)
{
    if (!s)
        return false;
    size_t len = strnlen(s, max + 1);
    if (len == 0 || len > max)
        return false;
    *len_p = len;
    return true;
}

int meta_store_check_hashes(const struct pf_meta_hash *h, size_t n)
{
    if (n == 0 || !h)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (h[i].len == 0 || h[i].len > PF_META_HASH_MAX || !h[i].data)
            return -EINVAL;
    return 0;
}

/* ------------------------------------------------------------------ metrics */

static void collect_simple(void *ctx, pf_metric_emit_fn emit, void *ectx, int which)
{
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(ctx, &s);
    double v = which == 0 ? (double)s.entries : which == 1 ? (double)s.owners : (double)s.bytes;
    emit(ectx, NULL, v);
}

static void collect_entries(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    collect_simple(ctx, emit, ectx, 0);
}

static void collect_bytes(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    collect_simple(ctx, emit, ectx, 2);
}

static void collect_owners(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    collect_simple(ctx, emit, ectx, 1);
}

static void collect_nodes(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(ctx, &s);
    const char *a[] = {"active"}, *b[] = {"stale"};
    emit(ectx, a, (double)s.nodes_active);
    emit(ectx, b, (double)s.nodes_stale);
}

static void collect_red(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    struct pf_meta_store *st = ctx;
    static const char *const labels[4] = {"1", "2", "3", ">=4"};
    for (int i = 0; i < 4; i++) {
        const char *v[] = {labels[i]};
        emit(ectx, v, (double)atomic_load(&st->red[i]));
    }
}

static void collect_red_avg(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    struct pf_meta_store *st = ctx;
    uint64_t keys = 0;
    for (int i = 0; i < 4; i++)
        keys += atomic_load(&st->red[i]);
    emit(ectx, NULL, keys ? (double)atomic_load(&st->red_copies) / (double)keys : 0.0);
}

static void metrics_register(struct pf_meta_store *st)
{
    st->g_entries = pf_metric_gauge_fn("pegaflow_metaserver_store_entries",
                                       "Keys (namespace, block hash) in the MetaServer store", "",
                                       collect_entries, st);
    st->g_bytes = pf_metric_gauge_fn("pegaflow_metaserver_store_bytes",
                                     "Memory held by the store's key tables and entries", "",
                                     collect_bytes, st);
    st->g_owners = pf_metric_gauge_fn("pegaflow_metaserver_block_owners",
                                      "Owner entries over all keys", "", collect_owners, st);
    st->g_nodes =
        pf_metric_gauge_fn("pegaflow_metaserver_nodes", "Node records by heartbeat freshness",
                           "state", collect_nodes, st);
    st->g_red = pf_metric_gauge_fn("pegaflow_metaserver_block_redundancy",
                                   "Keys by number of visible owners (last sweep)", "owners",
                                   collect_red, st);
    st->g_red_avg = pf_metric_gauge_fn("pegaflow_metaserver_block_redundancy_avg",
                                       "Average visible owners per key with one (last sweep)", "",
                                       collect_red_avg, st);
    st->c_sw_owners = pf_metric_counter("pegaflow_metaserver_sweep_removed_owners",
                                        "Owner entries removed by the sweep", "");
    st->c_sw_keys = pf_metric_counter("pegaflow_metaserver_sweep_removed_keys",
                                      "Keys removed by the sweep", "");
    st->c_sw_nodes = pf_metric_counter("pegaflow_metaserver_sweep_removed_nodes",
                                       "Node records removed by the sweep", "");
    st->c_sweeps = pf_metric_counter("pegaflow_metaserver_sweeps", "Sweeps run", "");
}

static void metrics_unregister(struct pf_meta_store *st)
{
    pf_metric_gauge_fn_clear(st->g_entries, st);
    pf_metric_gauge_fn_clear(st->g_owners, st);
    pf_metric_gauge_fn_clear(st->g_bytes, st);
    pf_metric_gauge_fn_clear(st->g_nodes, st);
    pf_metric_gauge_fn_clear(st->g_red, st);
    pf_metric_gauge_fn_clear(st->g_red_avg, st);
}

/* ------------------------------------------------------------------ lifecycle */

int pf_meta_store_create(const struct pf_meta_store_config *cfg, struct pf_meta_store **st_p)
{
    if (!cfg || cfg->node_stale_secs == 0 || cfg->ttl_secs == 0 ||
        cfg->node_stale_secs > UINT64_MAX / PF_NS_PER_SEC ||
        cfg->ttl_secs > UINT64_MAX / PF_NS_PER_SEC)
        return -EINVAL;
    struct pf_meta_store *st = aligned_alloc(64, (sizeof(*st) + 63) & ~(size_t)63);
    if (!st)
        return -ENOMEM;
    memset(st, 0, sizeof(*st));
    st->cfg = *cfg;
    if (cfg->store && strcmp(cfg->store, "memory") != 0) {
        int orc = pf_meta_redis_store_open(cfg, &st->ops, &st->impl);
        if (orc) {
            free(st);
            return orc;
        }
        *st_p = st;
        return 0;
    }
    st->stale_ns = cfg->node_stale_secs * PF_NS_PER_SEC;
    st->ttl_ns = cfg->ttl_secs * PF_NS_PER_SEC;
    st->epoch_ns = now_ns(st);
    int rc = -ENOMEM;
    size_t i;
    for (i = 0; i < NSHARDS; i++) {
        pthread_mutex_init(&st->shards[i].mu, NULL);
        if (meta_store_shard_resize(&st->shards[i], 16))
            goto err_shards;
    }
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&st->reg, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&st->sweep_mu, NULL);
    st->sweep_epoch = 1;
    metrics_register(st);
    *st_p = st;
    return 0;
err_shards:
    for (size_t j = 0; j <= i && j < NSHARDS; j++) {
        free(st->shards[j].slots);
        pthread_mutex_destroy(&st->shards[j].mu);
    }
    free(st);
    return rc;
}

void pf_meta_store_destroy(struct pf_meta_store *st)
{
    if (!st)
        return;
    if (st->ops) {
        st->ops->destroy(st->impl);
        free(st);
        return;
    }
    metrics_unregister(st);
    for (size_t i = 0; i < NSHARDS; i++) {
        struct shard *s = &st->shards[i];
        for (size_t j = 0; j <= s->mask; j++) {
            uint64_t v = s->slots[j];
            if (v && meta_slab_is_big(entry_size(slot_entry(v)->hlen, slot_entry(v)->cap)))
                meta_store_entry_free(s, slot_entry(v)); /* malloc'ed */
        }
        free(s->slots);
        meta_slab_destroy(&s->slab);
        pthread_mutex_destroy(&s->mu);
    }
    for (uint32_t i = 0; i < st->addrs.hw; i++) {
        struct maddr *a = st->addrs.v[i];
        if (a) {
            free(a->name);
            free(a);
        }
    }
    for (uint32_t i = 0; i < st->sessions.hw; i++)
        free(st->sessions.v[i]);
    for (uint32_t i = 0; i < st->nss.hw; i++) {
        struct mns *n = st->nss.v[i];
        if (n) {
            free(n->name);
            free(n);
        }
    }
    meta_idtab_destroy(&st->addrs);
    meta_idtab_destroy(&st->sessions);
    meta_idtab_destroy(&st->nss);
    pthread_rwlock_destroy(&st->reg);
    pthread_mutex_destroy(&st->sweep_mu);
    free(st);
}

/* ------------------------------------------------------------------ nodes */

int pf_meta_store_heartbeat(struct pf_meta_store *st, const char *node, const uint8_t node_id[16])
{
    if (st->ops)
        return st->ops->heartbeat(st->impl, node, node_id);
    size_t len;
    if (!meta_store_valid_str(node, PF_META_NODE_MAX, &len) || !node_id)
        return -EINVAL;
    uint64_t now = now_ns(st);
    /* fast path: refresh of the current session under the shared lock */
    pthread_rwlock_rdlock(&st->reg);
    struct maddr *a = addr_find(st, node, len);
    if (a && a->cur != NO_ID && memcmp(sess_at(st, a->cur)->uuid, node_id, 16) == 0) {
        atomic_store(&a->last_seen_ns, now);
        pthread_rwlock_unlock(&st->reg);
        return 0;
    }
    pthread_rwlock_unlock(&st->reg);

    pthread_rwlock_wrlock(&st->reg);
    now = now_ns(st);
    int rc = addr_intern(st, node, len, &a);
    if (rc)
        goto out;
    if (a->cur != NO_ID && memcmp(sess_at(st, a->cur)->uuid, node_id, 16) != 0) {
        uint64_t seen = atomic_load(&a->last_seen_ns);
        if (now >= seen && now - seen > st->stale_ns) {
            pf_info("node %s: session %02x%02x%02x%02x... takes over a stale session", node,
                    node_id[0], node_id[1], node_id[2], node_id[3]);
        } else {
            rc = -ESTALE;
            goto out;
        }
    }
    struct msess *s;
    rc = sess_intern(st, a, node_id, &s);
    if (rc)
        goto out;
    if (a->cur != s->id) {
        if (a->cur == NO_ID)
            pf_debug("node %s registered", node);
        a->cur = s->id;
        s->cur_epoch = st->sweep_epoch;
    }
    atomic_store(&a->last_seen_ns, now);
out:
    pthread_rwlock_unlock(&st->reg);
    return rc;
}

/* Shared lock held. Validates and refreshes (node, node_id); returns the session. */
int meta_store_session_check(struct pf_meta_store *st, const char *node, size_t len,
                             const uint8_t node_id[16], uint64_t now, struct msess **s_p)
{
    struct maddr *a = addr_find(st, node, len);
    if (!a || a->cur == NO_ID)
        return -ENOENT;
    struct msess *s = sess_at(st, a->cur);
    if (memcmp(s->uuid, node_id, 16) != 0)
        return -ESTALE;
    atomic_store(&a->last_seen_ns, now);
    *s_p = s;
    return 0;
}

/* Moves the entry in slot i to a smaller allocation when it uses a quarter of its owner
 * slots or less (shard locked; without memory it stays as it is). */
void meta_store_entry_maybe_shrink(struct shard *s, size_t i)
{
    uint64_t v = s->slots[i];
    struct entry *e = slot_entry(v);
    size_t cap = e->cap;
    while (cap > 2 && (size_t)e->nown * 4 <= cap)
        cap /= 2;
    if (cap == e->cap)
        return;
    struct entry *ne = meta_slab_alloc(&s->slab, entry_size(e->hlen, cap));
    if (!ne)
        return;
    memcpy(ne, e, entry_size(e->hlen, e->nown));
    ne->cap = (uint16_t)cap;
    s->slots[i] = (v & ~PTR_MASK) | (uint64_t)(uintptr_t)ne;
    meta_store_entry_free(s, e);
}

/* Drops owner k of the entry in slot i (shard locked). Returns true when the key went away
 * (the slot then holds a shifted entry or is empty). */
bool meta_store_entry_drop_owner(struct shard *s, size_t i, size_t k)
{
    struct entry *e = slot_entry(s->slots[i]);
    struct owner *o = entry_owners(e);
    s->owners--;
    if (e->nown == 1) {
        meta_store_entry_free(s, e);
        meta_store_shard_del_slot(s, i);
        return true;
    }
    memmove(o + k, o + k + 1, (e->nown - k - 1u) * sizeof(*o));
    e->nown--;
    meta_store_entry_maybe_shrink(s, i);
    return false;
}

/* Removes every owner entry of session sid from shard s. Shard locked. */
static uint64_t shard_purge_session(struct shard *s, uint32_t sid)
{
    uint64_t removed = 0;
    size_t i = 0;
    while (i <= s->mask) {
        if (i + 8 <= s->mask && s->slots[i + 8])
            __builtin_prefetch(slot_entry(s->slots[i + 8]));
        uint64_t v = s->slots[i];
        if (!v) {
            i++;
            continue;
        }
        struct entry *e = slot_entry(v);
        struct owner *o = entry_owners(e);
        size_t k;
        for (k = 0; k < e->nown && o[k].sess != sid; k++)
            ;
        if (k == e->nown) {
            i++;
            continue;
        }
        removed++;
        if (!meta_store_entry_drop_owner(s, i, k))
            i++;
        /* else slot i now holds a shifted entry (or is empty): look at it again */
    }
    return removed;
}

int pf_meta_store_unregister(struct pf_meta_store *st, const char *node, const uint8_t node_id[16],
                             uint64_t *removed_owners_p)
{
    if (st->ops)
        return st->ops->unregister(st->impl, node, node_id, removed_owners_p);
    size_t len;
    if (!meta_store_valid_str(node, PF_META_NODE_MAX, &len) || !node_id)
        return -EINVAL;
    uint32_t sid = NO_ID;
    pthread_rwlock_wrlock(&st->reg);
    struct maddr *a = addr_find(st, node, len);
    if (a) {
        struct msess *s = sess_find(st, a->id, node_id);
        if (s) {
            sid = s->id;
            if (a->cur == sid) {
                a->cur = NO_ID;
                pf_debug("node %s unregistered", node);
            }
        }
    }
    pthread_rwlock_unlock(&st->reg);
    uint64_t removed = 0;
    if (sid != NO_ID) {
        for (size_t i = 0; i < NSHARDS; i++) {
            struct shard *s = &st->shards[i];
            pthread_mutex_lock(&s->mu);
            removed += shard_purge_session(s, sid);
            meta_store_shard_maybe_shrink(s);
            pthread_mutex_unlock(&s->mu);
        }
    }
    *removed_owners_p = removed;
    return 0;
}

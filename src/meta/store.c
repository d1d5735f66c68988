/* MetaServer store: (namespace, block hash) -> owners, plus the node/session registry.
 *
 * Layout, chosen for memory per key and scan speed (see docs/metaserver.md):
 *   - Strings are interned: namespaces, node addresses and node sessions (address + UUID)
 *     get small integer ids in a registry guarded by one reader/writer lock (writer-
 *     preferring). Request paths hold it shared for the whole request; it is taken
 *     exclusively only to create a node/session/namespace, take over or unregister a node,
 *     and at the start and end of a sweep.
 *   - Keys live in 256 shards (top 8 bits of the key's xxh3), each a mutex, an arena of
 *     entries and a linear-probing index of 4-byte slots: the entry's arena offset (26 bits,
 *     in 4-byte units) with 6 more hash bits on top, so a probe dereferences an entry only
 *     on a 1/64 false match. Any slot count works (home = multiply-shift of 32 hash bits);
 *     the index grows by 1.5x at 0.8 load, so it costs 5-7.5 bytes a key. Nothing stores
 *     the key's hash: resizing and deletion (backward shift, no tombstones) recompute it.
 *   - A small entry (hash <= 127 bytes, <= 16 owner slots) is {u32 header: namespace id
 *     (22 bits), hash length (7 bits), log2 owner capacity (3 bits); hash bytes padded to 4;
 *     owners}; an owner is {u32 session id, u32 register second}, and unused owner slots
 *     hold NO_ID (owners in use come first), so no count is stored. Capacity starts at 2
 *     (a block usually gains a second owner: no move then) and doubles; a 32-byte hash with
 *     one or two owners costs 52 bytes. Longer hashes and more owners make a big entry: a
 *     12-byte stub in the arena pointing to a malloc'ed {hash length, capacity, hash,
 *     owners}.
 *   - A session id identifies (address, node_id); the address's node record says which
 *     session is current and when it was last seen, so visibility is two array lookups.
 *
 * Session and namespace ids are freed only by the sweep, and only when they were already
 * unusable when the sweep started (non-current session / unused namespace) and no entry
 * references them, so an id is never reused while an entry still points to it. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
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

static uint64_t entry_hash(const struct shard *s, uint32_t off)
{
    struct eview e;
    entry_view(s, off, &e);
    return key_hash(e.ns, e.key, e.hlen);
}

static uint32_t entry_units(const struct eview *e)
{
    return e->big ? STUB_UNITS : small_units(e->hlen, e->cap);
}

/* Lays out an entry for (ns, key, len) with room for cap owners, copies nown owners from
 * src (may point into the arena: it is read after the allocation, through srcoff) and
 * returns its offset (0 on ENOMEM). */
static uint32_t entry_build(struct shard *s, uint32_t ns, const uint8_t *key, size_t len,
                            uint32_t cap, uint32_t srcoff, const struct owner *first, uint32_t nown)
{
    bool small = fits_small(len, cap);
    struct big *b = NULL;
    if (!small) {
        b = malloc(big_size(len, cap));
        if (!b)
            return 0;
    }
    uint32_t off = meta_arena_alloc(&s->arena, small ? small_units(len, cap) : STUB_UNITS);
    if (!off) {
        free(b);
        return 0;
    }
    struct eview src = {0};
    if (srcoff) {
        entry_view(s, srcoff, &src); /* the arena may have moved */
        key = src.key;
    }
    uint8_t *p = meta_arena_at(&s->arena, off);
    uint8_t *kp;
    struct owner *o;
    uint32_t hdr = ns;
    if (small) {
        hdr |= (uint32_t)len << NS_BITS | (uint32_t)__builtin_ctz(cap) << (NS_BITS + HL_BITS);
        kp = p + 4;
        o = (struct owner *)(void *)(p + 4 + pad4(len));
    } else {
        b->hlen = (uint32_t)len;
        b->cap = cap;
        memcpy(p + 4, &b, sizeof(b));
        kp = b->data;
        o = (struct owner *)(void *)(b->data + pad4(len));
        s->big_bytes += big_size(len, cap);
    }
    memcpy(p, &hdr, sizeof(hdr));
    memmove(kp, key, len);
    memset(kp + len, 0, pad4(len) - len);
    if (srcoff)
        memcpy(o, src.own, nown * sizeof(*o));
    else if (nown)
        o[0] = *first;
    for (uint32_t k = nown; k < cap; k++)
        o[k] = (struct owner){NO_ID, 0};
    return off;
}

uint32_t meta_store_entry_new(struct shard *s, uint32_t ns, const uint8_t *key, size_t len,
                              struct owner first)
{
    return entry_build(s, ns, key, len, 2, 0, &first, 1);
}

void meta_store_entry_free(struct shard *s, uint32_t off)
{
    struct eview e;
    entry_view(s, off, &e);
    if (e.big) {
        s->big_bytes -= big_size(e.hlen, e.cap);
        free(e.big);
    }
    meta_arena_free(&s->arena, off, entry_units(&e));
}

int meta_store_entry_set_cap(struct shard *s, size_t i, uint32_t cap)
{
    uint32_t v = s->ix[i], off = v & OFF_MASK;
    struct eview e;
    entry_view(s, off, &e);
    uint32_t nown = view_nown(&e);
    uint32_t noff = entry_build(s, e.ns, NULL, e.hlen, cap, off, NULL, nown);
    if (!noff)
        return -ENOMEM;
    meta_store_entry_free(s, off);
    s->ix[i] = (v & ~OFF_MASK) | noff;
    return 0;
}

/* ------------------------------------------------------------------ shards */

int meta_store_shard_resize(struct shard *s, uint32_t nslots)
{
    uint32_t *ns = meta_region_alloc((size_t)nslots * sizeof(*ns));
    if (!ns)
        return -ENOMEM;
    for (size_t i = 0; s->ix && i < s->n; i++) {
        if (i + 8 < s->n && s->ix[i + 8])
            __builtin_prefetch(meta_arena_at(&s->arena, s->ix[i + 8] & OFF_MASK));
        uint32_t v = s->ix[i];
        if (!v)
            continue;
        size_t j = home_of(entry_hash(s, v & OFF_MASK), nslots);
        while (ns[j])
            if (++j == nslots)
                j = 0;
        ns[j] = v;
    }
    meta_region_free(s->ix, (size_t)s->n * sizeof(*s->ix));
    s->ix = ns;
    s->n = nslots;
    atomic_store_explicit(&s->ix_hint, ns, memory_order_relaxed);
    atomic_store_explicit(&s->n_hint, nslots, memory_order_relaxed);
    return 0;
}

/* Removes slot i by backward shift. */
void meta_store_shard_del_slot(struct shard *s, size_t i)
{
    size_t j = i;
    for (;;) {
        if (++j == s->n)
            j = 0;
        uint32_t v = s->ix[j];
        if (!v)
            break;
        size_t home = home_of(entry_hash(s, v & OFF_MASK), s->n);
        /* v may move to i unless its home lies cyclically in (i, j] */
        bool stay = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stay) {
            s->ix[i] = v;
            i = j;
        }
    }
    s->ix[i] = 0;
    s->count--;
}

void meta_store_shard_maybe_shrink(struct shard *s)
{
    if (s->n > 64 && s->count < s->n / 8) {
        size_t want = s->count * 2 < 64 ? 64 : s->count * 2;
        meta_store_shard_resize(s, (uint32_t)want); /* failure keeps the bigger table */
    }
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
    if (st->nss.nfree == 0 && st->nss.hw >= NS_LIMIT)
        return -ENOSPC; /* entries hold namespace ids in NS_BITS */
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

void pf_meta_store_redact(const char *store, char *out, size_t len)
{
    if (!len)
        return;
    const char *sep = store ? strstr(store, "://") : NULL;
    const char *rest = sep ? sep + 3 : NULL, *at = rest ? strrchr(rest, '@') : NULL;
    if (!at) {
        snprintf(out, len, "%s", store ? store : "");
        return;
    }
    /* userinfo "[user:]password": keep the user of "user:password", hide the rest */
    const char *colon = memchr(rest, ':', (size_t)(at - rest));
    int ulen = colon ? (int)(colon - rest) : 0;
    snprintf(out, len, "%.*s%.*s%s***%s", (int)(rest - store), store, ulen, rest, colon ? ":" : "",
             at);
}

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
        meta_region_free(st->shards[j].ix, (size_t)st->shards[j].n * sizeof(uint32_t));
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
        for (size_t j = 0; j < s->n; j++)
            if (s->ix[j])
                meta_store_entry_free(s, s->ix[j] & OFF_MASK); /* frees big entries */
        meta_region_free(s->ix, (size_t)s->n * sizeof(*s->ix));
        meta_arena_destroy(&s->arena);
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
    return pf_meta_store_heartbeat_replace(st, node, node_id, false);
}

int pf_meta_store_heartbeat_replace(struct pf_meta_store *st, const char *node,
                                    const uint8_t node_id[16], bool replace)
{
    if (st->ops)
        return st->ops->heartbeat(st->impl, node, node_id, replace);
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
        } else if (replace) {
            pf_info("node %s: session %02x%02x%02x%02x... replaces the previous life's (restart)",
                    node, node_id[0], node_id[1], node_id[2], node_id[3]);
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
    struct eview e;
    entry_view(s, s->ix[i] & OFF_MASK, &e);
    uint32_t nown = view_nown(&e), cap = e.cap;
    while (cap > 2 && nown * 4 <= cap)
        cap /= 2;
    if (cap != e.cap)
        meta_store_entry_set_cap(s, i, cap);
}

/* Drops owner k of the entry in slot i (shard locked). Returns true when the key went away
 * (the slot then holds a shifted entry or is empty). */
bool meta_store_entry_drop_owner(struct shard *s, size_t i, size_t k)
{
    uint32_t off = s->ix[i] & OFF_MASK;
    struct eview e;
    entry_view(s, off, &e);
    uint32_t nown = view_nown(&e);
    s->owners--;
    if (nown == 1) {
        meta_store_entry_free(s, off);
        meta_store_shard_del_slot(s, i);
        return true;
    }
    memmove(e.own + k, e.own + k + 1, (nown - k - 1u) * sizeof(*e.own));
    e.own[nown - 1] = (struct owner){NO_ID, 0};
    meta_store_entry_maybe_shrink(s, i);
    return false;
}

/* Removes every owner entry of session sid from shard s. Shard locked. */
static uint64_t shard_purge_session(struct shard *s, uint32_t sid)
{
    uint64_t removed = 0;
    size_t i = 0;
    while (i < s->n) {
        if (i + 8 < s->n && s->ix[i + 8])
            __builtin_prefetch(meta_arena_at(&s->arena, s->ix[i + 8] & OFF_MASK));
        uint32_t v = s->ix[i];
        if (!v) {
            i++;
            continue;
        }
        struct eview e;
        entry_view(s, v & OFF_MASK, &e);
        size_t k;
        for (k = 0; k < e.cap && e.own[k].sess != NO_ID && e.own[k].sess != sid; k++)
            ;
        if (k == e.cap || e.own[k].sess != sid) {
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

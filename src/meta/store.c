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

#define XXH_INLINE_ALL
#include <xxhash.h>

#define PF_LOG_MOD "metastore"
#include "meta/meta_internal.h"
#include "meta/store_tables.h"
#include "pf/log.h"
#include "pf/meta.h"
#include "pf/metrics.h"

#define NSHARDS_BITS 8
#define NSHARDS      (1u << NSHARDS_BITS)
#define NO_ID        UINT32_MAX
#define PTR_BITS     48
#define PTR_MASK     ((1ull << PTR_BITS) - 1)
#define TAG_OF(h)    (((h) >> 32) & 0xffffull)

_Static_assert(sizeof(void *) == 8, "the slot encoding needs 64-bit pointers");

/* ------------------------------------------------------------------ entries */

struct owner {
    uint32_t sess;
    uint32_t reg_s;
};

struct entry {
    uint32_t khash; /* low 32 bits of the key hash: home bucket on rehash/delete */
    uint32_t ns;
    uint16_t hlen;
    uint16_t nown;
    uint16_t cap;   /* owner slots allocated (>= 2: most keys get a second owner) */
    uint8_t data[]; /* hash bytes, then owners (4-aligned) */
};

static inline size_t owners_off(size_t hlen)
{
    return (offsetof(struct entry, data) + hlen + 3) & ~(size_t)3;
}
static inline size_t entry_size(size_t hlen, size_t nown)
{
    return owners_off(hlen) + nown * sizeof(struct owner);
}
static inline struct owner *entry_owners(struct entry *e)
{
    return (struct owner *)((uint8_t *)e + owners_off(e->hlen));
}

/* ------------------------------------------------------------------ shards */

struct shard {
    pthread_mutex_t mu;
    uint64_t *slots;
    size_t mask;
    size_t count;  /* keys */
    size_t owners; /* owner entries */
    struct slab slab;
} __attribute__((aligned(64)));

static inline struct entry *slot_entry(uint64_t v)
{
    return (struct entry *)(uintptr_t)(v & PTR_MASK);
}
static inline uint64_t slot_make(struct entry *e, uint64_t h)
{
    return (uint64_t)(uintptr_t)e | (TAG_OF(h) << PTR_BITS);
}

static int shard_resize(struct shard *s, size_t nslots)
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

/* Index of the key's slot, or -1 with *empty_p = the slot where it would go. */
static ptrdiff_t shard_find(const struct shard *s, uint64_t h, uint32_t ns, const uint8_t *key,
                            size_t len, size_t *empty_p)
{
    uint64_t tag = TAG_OF(h);
    size_t i = h & s->mask;
    for (;;) {
        uint64_t v = s->slots[i];
        if (!v) {
            if (empty_p)
                *empty_p = i;
            return -1;
        }
        if ((v >> PTR_BITS) == tag) {
            const struct entry *e = slot_entry(v);
            if (e->ns == ns && e->hlen == len && memcmp(e->data, key, len) == 0)
                return (ptrdiff_t)i;
        }
        i = (i + 1) & s->mask;
    }
}

/* Removes slot i by backward shift. */
static void shard_del_slot(struct shard *s, size_t i)
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

static void shard_maybe_shrink(struct shard *s)
{
    size_t n = s->mask + 1;
    if (n > 64 && s->count < n / 8) {
        size_t want = 64;
        while (want < s->count * 4)
            want <<= 1;
        shard_resize(s, want); /* failure keeps the bigger table */
    }
}

static void entry_free(struct shard *s, struct entry *e)
{
    meta_slab_free(&s->slab, e, entry_size(e->hlen, e->cap));
}

/* ------------------------------------------------------------------ registry */

struct maddr {
    char *name;
    size_t len;
    uint64_t h;
    uint32_t id;
    uint32_t cur; /* current session (the node record), NO_ID when there is no record */
    _Atomic uint64_t last_seen_ns;
    uint32_t nsess; /* sessions referencing this address */
};

struct msess {
    uint8_t uuid[16];
    uint32_t addr;
    uint32_t id;
    uint64_t h;
    uint64_t cur_epoch; /* sweep epoch when it last became current */
};

struct mns {
    char *name;
    size_t len;
    uint64_t h;
    uint32_t id;
    _Atomic uint64_t used_epoch;
};

static uint64_t addr_hashv(const void *o)
{
    return ((const struct maddr *)o)->h;
}
static uint64_t sess_hashv(const void *o)
{
    return ((const struct msess *)o)->h;
}
static uint64_t ns_hashv(const void *o)
{
    return ((const struct mns *)o)->h;
}

static uint64_t str_hash(const char *s, size_t len)
{
    return XXH3_64bits(s, len);
}
static uint64_t sess_hash(uint32_t addr, const uint8_t uuid[16])
{
    return XXH3_64bits_withSeed(uuid, 16, addr);
}

/* ------------------------------------------------------------------ store */

struct pf_meta_store {
    /* another backend (--store redis://...): every call goes to ops with impl */
    const struct pf_meta_store_ops *ops;
    void *impl;
    struct pf_meta_store_config cfg;
    uint64_t stale_ns, ttl_ns;
    uint64_t epoch_ns; /* clock at creation: register seconds count from here */
    struct shard shards[NSHARDS];

    pthread_rwlock_t reg;
    struct idtab addrs, sessions, nss;
    uint64_t sweep_epoch; /* written under the exclusive registry lock */

    pthread_mutex_t sweep_mu; /* one sweep at a time */
    /* redundancy snapshot of the last sweep */
    _Atomic uint64_t red[4];
    _Atomic uint64_t red_copies;

    struct pf_metric *g_entries, *g_owners, *g_bytes, *g_nodes, *g_red, *g_red_avg;
    struct pf_metric *c_sw_owners, *c_sw_keys, *c_sw_nodes, *c_sweeps;
};

static inline uint64_t now_ns(const struct pf_meta_store *st)
{
    return pf_clock_now(st->cfg.clock);
}
static inline uint32_t now_secs(const struct pf_meta_store *st, uint64_t ns)
{
    return ns > st->epoch_ns ? (uint32_t)((ns - st->epoch_ns) / PF_NS_PER_SEC) : 0;
}

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

static struct mns *ns_find(struct pf_meta_store *st, const char *name, size_t len)
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

static int ns_intern(struct pf_meta_store *st, const char *name, size_t len, struct mns **n_p)
{
    struct mns *n = ns_find(st, name, len);
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

static inline struct msess *sess_at(struct pf_meta_store *st, uint32_t id)
{
    return st->sessions.v[id];
}
static inline struct maddr *addr_at(struct pf_meta_store *st, uint32_t id)
{
    return st->addrs.v[id];
}

/* Shared or exclusive registry lock held. */
static inline bool owner_visible(struct pf_meta_store *st, uint32_t sess, uint64_t now)
{
    struct maddr *a = addr_at(st, sess_at(st, sess)->addr);
    if (a->cur != sess)
        return false;
    uint64_t seen = atomic_load_explicit(&a->last_seen_ns, memory_order_relaxed);
    return now < seen || now - seen <= st->stale_ns;
}

static inline uint64_t key_hash(uint32_t ns, const uint8_t *key, size_t len)
{
    return XXH3_64bits_withSeed(key, len, 0x9e3779b97f4a7c15ull ^ ns);
}
static inline struct shard *shard_of(struct pf_meta_store *st, uint64_t h)
{
    return &st->shards[h >> (64 - NSHARDS_BITS)];
}

static bool valid_str(const char *s, size_t max, size_t *len_p)
{
    if (!s)
        return false;
    size_t len = strnlen(s, max + 1);
    if (len == 0 || len > max)
        return false;
    *len_p = len;
    return true;
}

static int check_hashes(const struct pf_meta_hash *h, size_t n)
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
        if (shard_resize(&st->shards[i], 16))
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
                entry_free(s, slot_entry(v)); /* malloc'ed */
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
    if (!valid_str(node, PF_META_NODE_MAX, &len) || !node_id)
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
static int session_check(struct pf_meta_store *st, const char *node, size_t len,
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
static void entry_maybe_shrink(struct shard *s, size_t i)
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
    entry_free(s, e);
}

/* Drops owner k of the entry in slot i (shard locked). Returns true when the key went away
 * (the slot then holds a shifted entry or is empty). */
static bool entry_drop_owner(struct shard *s, size_t i, size_t k)
{
    struct entry *e = slot_entry(s->slots[i]);
    struct owner *o = entry_owners(e);
    s->owners--;
    if (e->nown == 1) {
        entry_free(s, e);
        shard_del_slot(s, i);
        return true;
    }
    memmove(o + k, o + k + 1, (e->nown - k - 1u) * sizeof(*o));
    e->nown--;
    entry_maybe_shrink(s, i);
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
        if (!entry_drop_owner(s, i, k))
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
    if (!valid_str(node, PF_META_NODE_MAX, &len) || !node_id)
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
            shard_maybe_shrink(s);
            pthread_mutex_unlock(&s->mu);
        }
    }
    *removed_owners_p = removed;
    return 0;
}

/* ------------------------------------------------------------------ keys */

/* Shared lock held; validates the session and resolves the namespace (interning it when
 * intern is set, which may drop and retake the lock). */
static int begin_write(struct pf_meta_store *st, const char *ns, const char *node,
                       const uint8_t node_id[16], bool intern, uint64_t *now_p, struct msess **s_p,
                       struct mns **n_p)
{
    size_t nlen, nslen;
    if (!valid_str(node, PF_META_NODE_MAX, &nlen) || !valid_str(ns, PF_META_NS_MAX, &nslen) ||
        !node_id)
        return -EINVAL;
    for (int attempt = 0;; attempt++) {
        uint64_t now = now_ns(st);
        int rc = session_check(st, node, nlen, node_id, now, s_p);
        if (rc)
            return rc;
        struct mns *n = ns_find(st, ns, nslen);
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
        rc = ns_intern(st, ns, nslen, &n);
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
    int rc = check_hashes(h, n);
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
        size_t empty;
        ptrdiff_t at = shard_find(s, kh, nsp->id, key, len, &empty);
        struct entry *e;
        if (at < 0) {
            if ((s->count + 1) * 5 > (s->mask + 1) * 4) {
                if (shard_resize(s, (s->mask + 1) * 2) == 0)
                    shard_find(s, kh, nsp->id, key, len, &empty);
                else if (s->count + 1 > s->mask) {
                    pthread_mutex_unlock(&s->mu);
                    rc = -ENOMEM;
                    goto out;
                }
            }
            e = meta_slab_alloc(&s->slab, entry_size(len, 2));
            if (!e || ((uintptr_t)e >> PTR_BITS) != 0) {
                pthread_mutex_unlock(&s->mu);
                rc = -ENOMEM;
                goto out;
            }
            e->khash = (uint32_t)kh;
            e->ns = nsp->id;
            e->hlen = (uint16_t)len;
            e->nown = 1;
            e->cap = 2;
            memcpy(e->data, key, len);
            struct owner *o = entry_owners(e);
            o[0].sess = sid;
            o[0].reg_s = now_s;
            s->slots[empty] = slot_make(e, kh);
            s->count++;
            s->owners++;
            is_new = true;
        } else {
            e = slot_entry(s->slots[at]);
            struct owner *o = entry_owners(e);
            size_t k;
            for (k = 0; k < e->nown; k++)
                if (sess_at(st, o[k].sess)->addr == aid)
                    break;
            if (k < e->nown) {
                is_new = o[k].sess != sid;
                o[k].sess = sid;
                o[k].reg_s = now_s;
            } else if (e->nown == UINT16_MAX) {
                pthread_mutex_unlock(&s->mu);
                rc = -ENOSPC;
                goto out;
            } else {
                if (e->nown == e->cap) {
                    size_t cap = e->cap * 2u > UINT16_MAX ? UINT16_MAX : e->cap * 2u;
                    struct entry *ne = meta_slab_alloc(&s->slab, entry_size(len, cap));
                    if (!ne || ((uintptr_t)ne >> PTR_BITS) != 0) {
                        pthread_mutex_unlock(&s->mu);
                        rc = -ENOMEM;
                        goto out;
                    }
                    memcpy(ne, e, entry_size(len, e->nown));
                    ne->cap = (uint16_t)cap;
                    s->slots[at] = slot_make(ne, kh);
                    entry_free(s, e);
                    e = ne;
                }
                struct owner *no = entry_owners(e);
                no[e->nown].sess = sid;
                no[e->nown].reg_s = now_s;
                e->nown++;
                s->owners++;
                is_new = true;
            }
        }
        if (reclaimable) {
            bool r = false;
            if (is_new) {
                struct owner *o = entry_owners(e);
                unsigned vis = 0;
                for (size_t k = 0; k < e->nown && vis < 3; k++)
                    if (owner_visible(st, o[k].sess, now))
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
    int rc = check_hashes(h, n);
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
        ptrdiff_t at = shard_find(s, kh, nsp->id, h[i].data, h[i].len, NULL);
        if (at >= 0) {
            struct entry *e = slot_entry(s->slots[at]);
            struct owner *o = entry_owners(e);
            size_t k;
            for (k = 0; k < e->nown && o[k].sess != sid; k++)
                ;
            if (k < e->nown) {
                removed++;
                if (entry_drop_owner(s, (size_t)at, k))
                    shard_maybe_shrink(s);
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
    if (!valid_str(ns, PF_META_NS_MAX, &nslen))
        return -EINVAL;
    int rc = check_hashes(h, n);
    if (rc)
        return rc;
    struct prefix_acc stackacc[16], *acc = stackacc;
    size_t nacc = 0, capacc = PF_ARRAY_SIZE(stackacc);
    struct pf_meta_prefix *res = NULL;
    size_t nres = 0;
    pthread_rwlock_rdlock(&st->reg);
    uint64_t now = now_ns(st);
    struct mns *nsp = ns_find(st, ns, nslen);
    for (size_t i = 0; nsp && i < n; i++) {
        uint64_t kh = key_hash(nsp->id, h[i].data, h[i].len);
        struct shard *s = shard_of(st, kh);
        bool any = false;
        size_t alive = 0;
        pthread_mutex_lock(&s->mu);
        ptrdiff_t at = shard_find(s, kh, nsp->id, h[i].data, h[i].len, NULL);
        if (at >= 0) {
            struct entry *e = slot_entry(s->slots[at]);
            struct owner *o = entry_owners(e);
            for (size_t k = 0; k < e->nown; k++) {
                if (!owner_visible(st, o[k].sess, now))
                    continue;
                any = true;
                uint32_t aid = sess_at(st, o[k].sess)->addr;
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
        while (i <= s->mask) {
            uint64_t v = s->slots[i];
            if (!v) {
                i++;
                continue;
            }
            struct entry *e = slot_entry(v);
            struct owner *o = entry_owners(e);
            size_t keep = 0, vis = 0;
            for (size_t k = 0; k < e->nown; k++) {
                uint32_t sid = o[k].sess;
                uint8_t f = sid < sn.nsess ? sn.sess_flags[sid] : SF_KEPT | SF_VISIBLE;
                int64_t age = (int64_t)sn.now_s - (int64_t)o[k].reg_s;
                if (!(f & SF_KEPT) || age > (int64_t)ttl_s)
                    continue;
                if (f & SF_VISIBLE)
                    vis++;
                o[keep++] = o[k];
            }
            size_t dropped = e->nown - keep;
            stats.removed_owners += dropped;
            s->owners -= dropped;
            if (keep == 0) {
                entry_free(s, e);
                shard_del_slot(s, i);
                stats.removed_keys++;
                continue;
            }
            if (dropped) {
                e->nown = (uint16_t)keep;
                entry_maybe_shrink(s, i);
                e = slot_entry(s->slots[i]);
            }
            o = entry_owners(e);
            for (size_t k = 0; k < e->nown; k++)
                if (o[k].sess < sn.nsess)
                    sn.sess_refs[o[k].sess]++;
            if (e->ns < sn.nns)
                sn.ns_keys[e->ns]++;
            if (vis) {
                red[vis >= 4 ? 3 : vis - 1]++;
                copies += vis;
            }
            i++;
        }
        shard_maybe_shrink(s);
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
        out->bytes += s->slab.bytes + (s->mask + 1) * sizeof(*s->slots);
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

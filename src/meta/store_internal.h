/* Private to the MetaServer memory store (store.c: registry, lifecycle, nodes, metrics;
 * store_keys.c: insert, remove, prefix queries; store_sweep.c: the sweep and stats): its
 * layout (described in store.c), the small helpers every part uses and the functions
 * store.c shares with the other two. Not thread-safe on its own: callers hold the locks
 * the layout comment names (the registry lock shared or exclusive, the shard mutex). */
#ifndef PF_META_STORE_INTERNAL_H
#define PF_META_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "meta/meta_internal.h"
#include "meta/store_tables.h"
#include "pf/meta.h"
#include "pf/metrics.h"

#define NSHARDS_BITS 8

#define NSHARDS (1u << NSHARDS_BITS)

#define NO_ID UINT32_MAX

/* index slot: 0 = empty, else TAG_BITS hash bits over the entry's arena offset */
#define OFF_BITS 26
#define OFF_MASK ((1u << OFF_BITS) - 1)
#define TAG_BITS (32 - OFF_BITS)

_Static_assert(ARENA_LIMIT_UNITS == 1u << OFF_BITS, "arena offsets fill the slot's low bits");

static inline uint32_t tag_of(uint64_t h)
{
    return (uint32_t)(h >> 40) & ((1u << TAG_BITS) - 1);
}

/* home slot of hash h in a table of n slots (any n: multiply-shift of the low 32 bits) */
static inline uint32_t home_of(uint64_t h, uint32_t n)
{
    return (uint32_t)(((uint64_t)(uint32_t)h * n) >> 32);
}

/* Entry header (u32): namespace id in the low NS_BITS, then the hash length (1..127; 0:
 * a big entry), then log2 of the owner capacity (small entries). A small entry is
 * {header, hash bytes padded to 4, owners[capacity]}; a big one (a hash over 127 bytes or
 * more than SMALL_CAP owners) is {header, pointer to a struct big} in the arena. Owners in
 * use come first; the rest have sess == NO_ID, so the owner count is where they end. */
#define NS_BITS        22
#define NS_LIMIT       (1u << NS_BITS) /* namespace ids are below this */
#define HL_BITS        7
#define SMALL_HLEN_MAX ((1u << HL_BITS) - 1)
#define SMALL_CAP      16u
#define STUB_UNITS     3u /* header + pointer */
#define OWNERS_MAX     UINT16_MAX

struct owner {
    uint32_t sess;
    uint32_t reg_s;
};

struct big {
    uint32_t hlen;
    uint32_t cap;
    uint8_t data[]; /* hash bytes padded to 4, owners[cap] */
};

static inline size_t pad4(size_t n)
{
    return (n + 3) & ~(size_t)3;
}

static inline uint32_t small_units(size_t hlen, size_t cap)
{
    return (uint32_t)((4 + pad4(hlen) + cap * sizeof(struct owner)) / ARENA_UNIT);
}

static inline size_t big_size(size_t hlen, size_t cap)
{
    return sizeof(struct big) + pad4(hlen) + cap * sizeof(struct owner);
}

static inline bool fits_small(size_t hlen, size_t cap)
{
    return hlen <= SMALL_HLEN_MAX && cap <= SMALL_CAP;
}

_Static_assert(4 + 128 + SMALL_CAP * 8 <= ARENA_MAX_UNITS * ARENA_UNIT,
               "the largest small entry fits the arena's classes");

/* An entry, decoded. Pointers stay valid until the shard's next allocation or free. */
struct eview {
    uint32_t ns, hlen, cap;
    const uint8_t *key;
    struct owner *own;
    struct big *big; /* NULL for a small entry */
};

struct shard {
    pthread_mutex_t mu;
    uint32_t *ix; /* n slots, load <= 0.8 */
    uint32_t n;
    size_t count;     /* keys */
    size_t owners;    /* owner entries */
    size_t big_bytes; /* struct big allocations */
    struct arena arena;
    /* ix and n for prefetching without the mutex (may be stale: a prefetch never faults) */
    _Atomic(uint32_t *) ix_hint;
    _Atomic uint32_t n_hint;
} __attribute__((aligned(64)));

/* Starts loading the index slot where hash h's probe begins; no lock needed. */
static inline void shard_prefetch(struct shard *s, uint64_t h)
{
    uint32_t *ix = atomic_load_explicit(&s->ix_hint, memory_order_relaxed);
    uint32_t n = atomic_load_explicit(&s->n_hint, memory_order_relaxed);
    __builtin_prefetch(ix + home_of(h, n));
}

static inline void entry_view(const struct shard *s, uint32_t off, struct eview *v)
{
    const uint8_t *p = meta_arena_at(&s->arena, off);
    uint32_t hdr;
    memcpy(&hdr, p, sizeof(hdr));
    v->ns = hdr & (NS_LIMIT - 1);
    uint32_t hl = (hdr >> NS_BITS) & SMALL_HLEN_MAX;
    if (hl) {
        v->hlen = hl;
        v->cap = 1u << (hdr >> (NS_BITS + HL_BITS));
        v->key = p + 4;
        v->own = (struct owner *)(uintptr_t)(p + 4 + pad4(hl));
        v->big = NULL;
    } else {
        struct big *b;
        memcpy(&b, p + 4, sizeof(b));
        v->hlen = b->hlen;
        v->cap = b->cap;
        v->key = b->data;
        v->own = (struct owner *)(void *)(b->data + pad4(b->hlen));
        v->big = b;
    }
}

/* owners in use */
static inline uint32_t view_nown(const struct eview *v)
{
    uint32_t k = 0;
    while (k < v->cap && v->own[k].sess != NO_ID)
        k++;
    return k;
}

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

static inline uint64_t addr_hashv(const void *o)
{
    return ((const struct maddr *)o)->h;
}

static inline uint64_t sess_hashv(const void *o)
{
    return ((const struct msess *)o)->h;
}

static inline uint64_t ns_hashv(const void *o)
{
    return ((const struct mns *)o)->h;
}

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

/* hot: probing stays inline in every file */
/* Index of the key's slot, or -1 with *empty_p = the slot where it would go. */
static inline ptrdiff_t meta_store_shard_find(const struct shard *s, uint64_t h, uint32_t ns,
                                              const uint8_t *key, size_t len, size_t *empty_p)
{
    uint32_t tag = tag_of(h);
    uint32_t want = len <= SMALL_HLEN_MAX ? ns | (uint32_t)len << NS_BITS : UINT32_MAX;
    uint32_t hmask = (1u << (NS_BITS + HL_BITS)) - 1;
    size_t i = home_of(h, s->n);
    for (;;) {
        uint32_t v = s->ix[i];
        if (!v) {
            if (empty_p)
                *empty_p = i;
            return -1;
        }
        if ((v >> OFF_BITS) == tag) {
            const uint8_t *p = meta_arena_at(&s->arena, v & OFF_MASK);
            uint32_t hdr;
            memcpy(&hdr, p, sizeof(hdr));
            if ((hdr & hmask) == want) {
                if (memcmp(p + 4, key, len) == 0)
                    return (ptrdiff_t)i;
            } else if (!(hdr & (SMALL_HLEN_MAX << NS_BITS)) && (hdr & (NS_LIMIT - 1)) == ns) {
                struct eview e;
                entry_view(s, v & OFF_MASK, &e);
                if (e.hlen == len && memcmp(e.key, key, len) == 0)
                    return (ptrdiff_t)i;
            }
        }
        if (++i == s->n)
            i = 0;
    }
}

/* Shared by the three files (store.c). Shard functions need the shard mutex; registry
 * lookups the registry lock shared, interning it exclusive. */
int meta_store_shard_resize(struct shard *s, uint32_t nslots);
void meta_store_shard_del_slot(struct shard *s, size_t i);
void meta_store_shard_maybe_shrink(struct shard *s);
/* A new entry (capacity 2) with one owner: its arena offset, or 0 on ENOMEM. */
uint32_t meta_store_entry_new(struct shard *s, uint32_t ns, const uint8_t *key, size_t len,
                              struct owner first);
void meta_store_entry_free(struct shard *s, uint32_t off);
/* Moves the entry in slot i to one with room for cap owners (>= those in use): 0 or
 * -ENOMEM (the entry is unchanged then). */
int meta_store_entry_set_cap(struct shard *s, size_t i, uint32_t cap);
struct mns *meta_store_ns_find(struct pf_meta_store *st, const char *name, size_t len);
int meta_store_ns_intern(struct pf_meta_store *st, const char *name, size_t len, struct mns **n_p);
bool meta_store_valid_str(const char *s, size_t max, size_t *len_p);
int meta_store_check_hashes(const struct pf_meta_hash *h, size_t n);
int meta_store_session_check(struct pf_meta_store *st, const char *node, size_t len,
                             const uint8_t node_id[16], uint64_t now, struct msess **s_p);
void meta_store_entry_maybe_shrink(struct shard *s, size_t i);
bool meta_store_entry_drop_owner(struct shard *s, size_t i, size_t k);

#endif

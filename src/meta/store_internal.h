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

#define PTR_BITS 48

#define PTR_MASK ((1ull << PTR_BITS) - 1)

#define TAG_OF(h) (((h) >> 32) & 0xffffull)

_Static_assert(sizeof(void *) == 8, "the slot encoding needs 64-bit pointers");

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

/* Shared by the three files (store.c). Shard functions need the shard mutex; registry
 * lookups the registry lock shared, interning it exclusive. */
int meta_store_shard_resize(struct shard *s, size_t nslots);
void meta_store_shard_del_slot(struct shard *s, size_t i);
void meta_store_shard_maybe_shrink(struct shard *s);
void meta_store_entry_free(struct shard *s, struct entry *e);
struct mns *meta_store_ns_find(struct pf_meta_store *st, const char *name, size_t len);
int meta_store_ns_intern(struct pf_meta_store *st, const char *name, size_t len, struct mns **n_p);
bool meta_store_valid_str(const char *s, size_t max, size_t *len_p);
int meta_store_check_hashes(const struct pf_meta_hash *h, size_t n);
int meta_store_session_check(struct pf_meta_store *st, const char *node, size_t len,
                             const uint8_t node_id[16], uint64_t now, struct msess **s_p);
void meta_store_entry_maybe_shrink(struct shard *s, size_t i);
bool meta_store_entry_drop_owner(struct shard *s, size_t i, size_t k);

#endif

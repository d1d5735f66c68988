/* KV blocks in pinned host memory.
 *
 * A block is the unit the cache indexes: key (namespace id, hash bytes) -> total_slots
 * slots in slot order, each slot one worker's share of one layer (or of the cross-layer
 * pseudo-layer): one segment (K, or the whole block) or two (K and V). Slot bytes live in
 * pool allocations that the block references (several blocks may share one allocation).
 * Each slot carries an xxh3-64 checksum of its data bytes (K then V), computed when the
 * block is sealed (DESIGN §5).
 *
 * Sealed blocks are immutable and refcounted like Rust's Arc: `strong` references keep the
 * data alive; `weak` references (the SSD write queue) keep only the struct alive and can be
 * upgraded while strong > 0. The cache owns one strong reference while the block is
 * resident. The struct is 112 bytes + 56 bytes per slot, 64-byte aligned. */
#ifndef PF_BLOCK_H
#define PF_BLOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/htable.h"
#include "pf/list.h"

#define PF_HASH_MAX 40 /* vLLM hashes are 32 (sha256) or 16 (xxh3-128) bytes, + 4 group bytes */

struct pf_alloc;

struct pf_block_key {
    uint32_t ns;
    uint8_t len;
    uint8_t hash[PF_HASH_MAX];
};

struct pf_slot {
    void *k;             /* segment 0 (K, or the whole slot) */
    void *v;             /* segment 1 (V), NULL for one segment */
    struct pf_alloc *ka; /* allocation holding k (one reference) */
    struct pf_alloc *va; /* allocation holding v (one reference), NULL when v is NULL */
    uint64_t checksum;   /* xxh3-64 of k[0..seg_len) then v[0..seg_len) */
    uint32_t seg_len;    /* data bytes per segment */
    uint32_t seg_stride; /* bytes reserved per segment (>= seg_len; 512-padded with SSD) */
    int16_t numa;
    uint8_t nseg;
    uint8_t has_checksum;
};

enum pf_block_class {
    PF_CLASS_RETAINED = 0,    /* saved locally or promoted from SSD */
    PF_CLASS_RECLAIMABLE = 1, /* fetched from a peer or redundant in the cluster */
};

/* Layout: everything a cache lookup touches (index node, reference count, access mark, key
 * up to a 32-byte hash) sits in the first 64 bytes, and blocks are 64-byte aligned, so a hit
 * costs one cache line of the block. */
struct pf_block {
    struct pf_hnode hnode; /* cache index (owned by the cache) */
    _Atomic uint32_t strong;
    uint8_t accessed; /* hit since it was last examined by eviction (cache lock) */
    uint8_t cls;
    uint8_t resident; /* in the cache index (cache lock) */
    uint8_t pad0;
    struct pf_block_key key;
    /* -- second cache line -- */
    _Atomic uint32_t weak;
    uint16_t nslots;
    struct pf_list lru; /* class recency list (owned by the cache) */
    uint64_t inserted_ns;
    uint64_t footprint; /* sum of seg_stride over segments */
    struct pf_slot slots[];
};

/* Allocates a block with nslots empty slots: strong = 1, weak = 1 (the implicit weak
 * reference of the strong holders). NULL on ENOMEM. */
struct pf_block *pf_block_new(const struct pf_block_key *key, uint16_t nslots);

static inline void pf_block_get(struct pf_block *b)
{
    atomic_fetch_add_explicit(&b->strong, 1, memory_order_relaxed);
}
/* Drops a strong reference; the last one releases the slots' allocations. Accepts NULL. */
void pf_block_put(struct pf_block *b);
static inline void pf_block_weak_get(struct pf_block *b)
{
    atomic_fetch_add_explicit(&b->weak, 1, memory_order_relaxed);
}
void pf_block_weak_put(struct pf_block *b);
/* Takes a strong reference if the block is still alive. */
bool pf_block_upgrade(struct pf_block *b);
static inline uint32_t pf_block_strong(const struct pf_block *b)
{
    return atomic_load_explicit(&((struct pf_block *)b)->strong, memory_order_acquire);
}

/* Weak references beyond the strong holders' implicit one: the SSD write queue's. */
static inline uint32_t pf_block_weak(const struct pf_block *b)
{
    return atomic_load_explicit(&((struct pf_block *)b)->weak, memory_order_acquire);
}

/* Computes the slot checksums (xxh3 of each slot's data bytes). */
void pf_block_checksum(struct pf_block *b);
/* Verifies slot i against `expected`; false on mismatch. */
bool pf_slot_verify(const struct pf_slot *s, uint64_t expected);
uint64_t pf_slot_compute_checksum(const struct pf_slot *s);
/* Recomputes the footprint from the slots. */
void pf_block_finish(struct pf_block *b);

/* Keys. */
uint64_t pf_key_hash(const struct pf_block_key *k);
static inline bool pf_key_eq(const struct pf_block_key *a, const struct pf_block_key *b)
{
    return a->ns == b->ns && a->len == b->len && __builtin_memcmp(a->hash, b->hash, a->len) == 0;
}
/* Builds a key; -EINVAL when len is 0 or above PF_HASH_MAX. */
int pf_key_make(uint32_t ns, const void *hash, size_t len, struct pf_block_key *k_p);

/* Namespace interning: process-wide, thread-safe, ids never reused. */
int pf_ns_intern(const char *ns, uint32_t *id_p);
/* Returns the id of an already interned namespace or -ENOENT (never interns). */
int pf_ns_lookup(const char *ns, uint32_t *id_p);
const char *pf_ns_name(uint32_t id);

#endif

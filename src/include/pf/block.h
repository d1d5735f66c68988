/* KV blocks in pinned host memory.
 *
 * A block is the unit the cache indexes: key (namespace id, hash bytes) -> nslots slots in
 * slot order, each slot one worker's share of one layer (or of the cross-layer
 * pseudo-layer): one segment (K, or the whole block) or two (K and V). Slot bytes live in
 * pool allocations that the block references (several blocks may share one allocation).
 * Each slot carries an xxh3-64 checksum of its data bytes (K then V), computed before the
 * block is packed (DESIGN §5).
 *
 * Sealed blocks are immutable and refcounted like Rust's Arc: `strong` references keep the
 * data alive; `weak` references (the SSD write queue) keep only the record alive and can be
 * upgraded while strong > 0. The cache owns one strong reference while the block is
 * resident.
 *
 * Record encoding. Builders describe slots in the wide form (struct pf_slot, 56 bytes) and
 * pf_block_pack() encodes them into one compact record; readers decode with
 * pf_block_slot() / pf_slot_k() / pf_slot_v(), never touching the layout:
 *   - a 92-byte header (struct pf_block) whose first 56 bytes hold what a lookup touches
 *     (chain link, 32-bit hash, namespace id, strong count, key length, up to 32 hash
 *     bytes inline); longer hashes put their remaining bytes first in the tail;
 *   - the allocations: the distinct pool allocations the slots use, in first-use order; one
 *     is referenced directly, several through a refcounted table (struct pf_allocset) that
 *     blocks with the same allocations share (pf_block_packer: all blocks of one Save call);
 *   - per slot 8 bytes of checksum (no checksum array when no slot has one);
 *   - geometry (seg_len, seg_stride, numa, nseg, has_checksum): one 8-byte record when
 *     every slot agrees, else one per slot; 12-byte records when a stride exceeds seg_len
 *     by 64 KiB or more or a NUMA node is outside [-1, 63];
 *   - per slot one reference per segment (two when any slot has two): allocation index in
 *     the high bits, byte offset in that allocation in the low `refbits` bits; 4 bytes when
 *     every reference fits 32 bits, else 8 bytes. Packing refuses (-ERANGE) an offset that
 *     does not fit 64 bits minus the index bits.
 * Records come from the slab in 16-byte classes. One cross-layer slot with a 32-byte hash
 * and a checksum: 92 + 8 + 8 + 4 = 112 bytes; 32 one-segment layer slots: 92 + 32 * 8 + 8 +
 * 32 * 4 = 484 (496 with the class), vs 192 and 1,920 for the former 56-byte slot records.
 * The cache index adds 8 bytes of bucket per block. */
#ifndef PF_BLOCK_H
#define PF_BLOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/htable.h"
#include "pf/list.h"

#define PF_HASH_MAX          40 /* vLLM hashes are 32 (sha256) or 16 (xxh3-128) bytes, + 4 group bytes */
#define PF_BLOCK_HASH_INLINE 32 /* hash bytes kept in the header; the rest go to the tail */

struct pf_alloc;

struct pf_block_key {
    uint32_t ns;
    uint8_t len;
    uint8_t hash[PF_HASH_MAX];
};

/* The wide slot form builders fill and pf_block_slot() returns. */
struct pf_slot {
    void *k;             /* segment 0 (K, or the whole slot) */
    void *v;             /* segment 1 (V), NULL for one segment */
    struct pf_alloc *ka; /* allocation holding k (builders: one reference) */
    struct pf_alloc *va; /* allocation holding v (builders: one reference), NULL when v is NULL */
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

/* Format bits (pf_block.fmt). */
#define PF_BLK_SINGLE   0x01 /* allocs is one struct pf_alloc *, else a struct pf_allocset * */
#define PF_BLK_CSUM     0x02 /* the tail has nslots checksums */
#define PF_BLK_GEO_SLOT 0x04 /* one geometry record per slot, else one for all */
#define PF_BLK_GEO_WIDE 0x08 /* 12-byte geometry records, else 8-byte */
#define PF_BLK_REF8     0x10 /* 8-byte references, else 4-byte */
#define PF_BLK_TWOSEG   0x20 /* two references per slot, else one */

struct pf_block {
    struct pf_hnode hnode; /* cache index (owned by the cache); hnode.user = namespace id */
    _Atomic uint32_t strong;
    uint8_t keylen;
    uint8_t accessed : 1; /* hit since it was last examined by eviction (cache lock) */
    uint8_t cls : 1;
    uint8_t resident : 1; /* in the cache index (cache lock) */
    uint8_t pinref : 1;   /* the cache holds a strong reference for the pins (cache lock) */
    uint16_t pins;        /* lease pins (pf_cache_prefix_pin; cache lock, not atomic) */
    uint8_t hash[PF_BLOCK_HASH_INLINE]; /* key bytes [0, min(keylen, 32)) */
    _Atomic uint32_t weak;
    uint32_t inserted; /* pf_now_ns() >> 24 when inserted (cache; ~16.8 ms units) */
    /* -- second cache line -- */
    struct pf_list lru; /* class recency list (owned by the cache) */
    void *allocs;       /* see PF_BLK_SINGLE */
    uint16_t nslots;
    uint8_t fmt;
    uint8_t refbits; /* offset bits of a reference */
    uint8_t tail[];  /* [hash overflow][checksums][geometry][references] */
};

/* A table of distinct allocations shared by blocks (one reference on each allocation). */
struct pf_allocset {
    _Atomic uint32_t refs;
    uint32_t n;
    struct pf_alloc *a[];
};

/* Remembers the last allocation table built so that blocks with the same allocations share
 * it. Zero-initialise; release with pf_block_packer_done. Not thread-safe (one per thread or
 * call). */
struct pf_block_packer {
    struct pf_allocset *last;
};
void pf_block_packer_done(struct pf_block_packer *pk);

/* Packs nslots wide slots into a new block: strong = 1, weak = 1 (the implicit weak
 * reference of the strong holders). Each slot needs k and ka (ka->ptr <= k), nseg 1 or 2
 * and, with two, v and va. On success the block owns the slots' allocation references and
 * slots[i].ka/va are set to NULL; on failure the caller keeps them. pk may be NULL.
 * Errors: -EINVAL (a slot breaks the rules above; nslots 0; key length 0 or above
 * PF_HASH_MAX), -ERANGE (an offset does not fit the reference encoding), -ENOMEM. */
int pf_block_pack(struct pf_block_packer *pk, const struct pf_block_key *key, uint16_t nslots,
                  struct pf_slot *slots, struct pf_block **b_p);

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

/* Decodes slot i (i < nslots) into the wide form; ka/va name the allocations without a
 * reference (valid while the caller holds a strong reference). */
void pf_block_slot(const struct pf_block *b, uint16_t i, struct pf_slot *s);
/* Segment 0 / segment 1 (NULL for one segment) of slot i. */
void *pf_slot_k(const struct pf_block *b, uint16_t i);
void *pf_slot_v(const struct pf_block *b, uint16_t i);
/* Sum of seg_stride * nseg over the slots (the bytes the block pins). */
uint64_t pf_block_footprint(const struct pf_block *b);
/* Record bytes (what the slab hands out for it). */
size_t pf_block_record_size(const struct pf_block *b);

static inline uint32_t pf_block_ns(const struct pf_block *b)
{
    return b->hnode.user;
}
/* The block's key. */
struct pf_block_key pf_block_key(const struct pf_block *b);
/* Whether the block's key is (ns, hash[0..len)), the hash bytes compared a word at a time
 * (no memcmp call: the cache's chain walk is the hot loop of a query). Any len is allowed
 * (one no block has never matches); hash is read only when ns and len match. */
static inline bool pf_block_hash_eq(const struct pf_block *b, uint32_t ns, const uint8_t *hash,
                                    size_t len)
{
    if (b->hnode.user != ns || b->keylen != len)
        return false;
    size_t in = len < PF_BLOCK_HASH_INLINE ? len : PF_BLOCK_HASH_INLINE;
    uint64_t diff = 0;
    size_t i = 0;
    for (; i + 8 <= in; i += 8) {
        uint64_t x, y;
        __builtin_memcpy(&x, b->hash + i, 8);
        __builtin_memcpy(&y, hash + i, 8);
        diff |= x ^ y;
    }
    for (; i < in; i++)
        diff |= (uint64_t)(b->hash[i] ^ hash[i]);
    for (size_t j = 0; in + j < len; j++) /* past the inline bytes: the tail's first */
        diff |= (uint64_t)(b->tail[j] ^ hash[in + j]);
    return diff == 0;
}
/* pf_key_eq against the block's key. */
static inline bool pf_block_key_eq(const struct pf_block *b, const struct pf_block_key *k)
{
    return pf_block_hash_eq(b, k->ns, k->hash, k->len);
}
/* pf_key_hash of the block's key. */
uint64_t pf_block_key_hash(const struct pf_block *b);

/* Residence stamp (pf_now_ns() units): set when inserted; age in ns, correct up to ~2.28
 * years. */
static inline void pf_block_stamp(struct pf_block *b, uint64_t now_ns)
{
    b->inserted = (uint32_t)(now_ns >> 24);
}
static inline uint64_t pf_block_age_ns(const struct pf_block *b, uint64_t now_ns)
{
    return (uint64_t)(uint32_t)((uint32_t)(now_ns >> 24) - b->inserted) << 24;
}

/* Checksum of a wide slot's data bytes; verification against `expected`. */
bool pf_slot_verify(const struct pf_slot *s, uint64_t expected);
uint64_t pf_slot_compute_checksum(const struct pf_slot *s);
/* Sets checksum and has_checksum on every slot of a wide array (builders). */
void pf_slots_checksum(struct pf_slot *slots, size_t n);
/* Verifies slot i of a block against its stored checksum; true when it has none. */
bool pf_block_slot_verify(const struct pf_block *b, uint16_t i);

/* Keys. */
uint64_t pf_key_hash(const struct pf_block_key *k);
/* pf_key_hash of the key (ns, hash[0..len)) without building it (any len: the hash of a
 * length no key has is just a number). */
uint64_t pf_hash_of(uint32_t ns, const void *hash, size_t len);
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
/* Namespaces interned so far: ids are 0 .. pf_ns_count() - 1. */
uint32_t pf_ns_count(void);

#endif

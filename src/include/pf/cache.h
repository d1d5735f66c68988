/* RAM cache: the index of resident sealed blocks.
 *
 * One mutex guards a hash index (key -> block) and two recency lists, one per class
 * (retained, reclaimable); the list head is the most recent end. The cache holds one strong
 * reference per resident block. Capacity is not a byte budget: eviction is driven by
 * allocation failure (pf_cache_evict), reclaimable blocks first, and skips blocks that
 * somebody else references (a lease, a transfer lock, an SSD write, an in-flight load):
 * those move to the recent end and stay indexed and hittable.
 *
 * Optional TinyLFU admission (count-min sketch of 8-bit counters, halved after 8n
 * increments): a new key is rejected when its estimated frequency is below that of the
 * block eviction would pick next.
 *
 * Thread-safe. No function calls back into other modules while holding the lock. */
#ifndef PF_CACHE_H
#define PF_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/block.h"
#include "pf/bytes.h"

struct pf_cache;

struct pf_cache_config {
    uint64_t lfu_items; /* TinyLFU sized for this many items; 0 = plain LRU */
};

struct pf_cache_stats {
    uint64_t blocks[2]; /* per class */
    uint64_t bytes[2];
};

int pf_cache_create(const struct pf_cache_config *cfg, struct pf_cache **c_p);
/* Drops every resident block. Accepts NULL. */
void pf_cache_destroy(struct pf_cache *c);

/* Longest run of resident keys from keys[0]. Hits refresh recency and TinyLFU. When out is
 * not NULL each hit's strong reference is taken into out[i] (caller puts). */
size_t pf_cache_prefix(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                       struct pf_block **out);
/* Lease pins (QueryPrefetch's hot path): like pf_cache_prefix, but each hit is pinned
 * instead of referenced: a plain 16-bit count in the block record, changed under the cache
 * lock on the line the key comparison already loaded, where a strong reference is a locked
 * instruction per block. out (not NULL) gets the pinned blocks, no references. A pinned
 * block is never evicted (eviction passes over it as over a referenced one); when it leaves
 * the index anyway (pf_cache_remove_all: cleanup, shutdown) the cache takes one strong
 * reference for all its pins, put by the last unpin, so a pinned block stays alive until
 * then. A hit already pinned PF_CACHE_PIN_MAX times ends the prefix as a miss would. Every
 * pin is dropped by pf_cache_unpin, or turned into a strong reference by
 * pf_cache_pins_to_refs, on this same cache, before it is destroyed. */
#define PF_CACHE_PIN_MAX 0xffffu
size_t pf_cache_prefix_pin(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                           struct pf_block **out);
/* pf_cache_prefix_pin of the keys (ns, hashes[i]) without building them (QueryPrefetch's
 * hit path reads the request's hash bytes in place). A hash of a length no key has (0, above
 * PF_HASH_MAX) is a miss; hashes[i].data must be readable for hashes[i].len bytes. */
size_t pf_cache_prefix_pin_hashes(struct pf_cache *c, uint32_t ns, const struct pf_bytes *hashes,
                                  size_t n, struct pf_block **out);
/* Drops one pin of each block (the same block may appear several times, once per pin). */
void pf_cache_unpin(struct pf_cache *c, struct pf_block *const *blocks, size_t n);
/* Trades one pin of each block for a strong reference the caller owns (puts). */
void pf_cache_pins_to_refs(struct pf_cache *c, struct pf_block *const *blocks, size_t n);
/* The pin count of b (tests). */
size_t pf_cache_pins(struct pf_cache *c, const struct pf_block *b);
/* Looks up every key independently (membership); hits refresh recency. out[i] gets a
 * strong reference or NULL. Returns the number of hits. */
size_t pf_cache_lookup_each(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                            struct pf_block **out);
/* Membership only: no refresh, no reference. */
bool pf_cache_contains(struct pf_cache *c, const struct pf_block_key *key);
/* pf_cache_contains for each key: out[i] true when keys[i] is resident. The lookups run
 * through the prefetching pipeline, a few hundred keys per lock hold. Returns the number of
 * resident keys. */
size_t pf_cache_contains_each(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                              bool *out);

/* Inserts b with class cls, taking the cache's own strong reference. Returns 1 when
 * inserted, 0 when the key was already resident (recency refreshed, class unchanged, b not
 * taken), -EACCES when TinyLFU rejected it, -ENOMEM when the per-namespace byte table
 * cannot grow (b not taken). */
int pf_cache_insert(struct pf_cache *c, struct pf_block *b, enum pf_block_class cls);
/* pf_cache_insert for each block in order (a few hundred per lock hold, buckets prefetched
 * ahead), with rc[i] (may be NULL) its result as pf_cache_insert's (a key repeated in the
 * batch: the later block gets 0). Returns the number inserted (rc 1). */
size_t pf_cache_insert_each(struct pf_cache *c, struct pf_block *const *blocks, size_t n,
                            enum pf_block_class cls, int *rc);

/* Removes up to max evictable blocks, oldest first, reclaimable class first. The removed
 * blocks are stored in out with the cache's reference transferred to the caller. Returns
 * how many; *skipped_p (may be NULL) counts referenced blocks passed over. */
size_t pf_cache_evict(struct pf_cache *c, size_t max, struct pf_block **out, size_t *skipped_p);
/* As pf_cache_evict, but also passes over blocks still queued for their SSD write (a weak
 * reference beyond the implicit one), leaving them in place: the allocator asks this first so
 * that a burst of saves evicts blocks already on SSD, or not bound for it, before it drops
 * writes still waiting in the queue. */
size_t pf_cache_evict_sparing(struct pf_cache *c, size_t max, struct pf_block **out,
                              size_t *skipped_p);
/* As pf_cache_evict, restricted to blocks whose namespace id is in ns[0..nns) (a tenant's
 * namespaces, src/tenant): blocks of other namespaces are passed over and keep their place.
 * nns 0 evicts nothing. */
size_t pf_cache_evict_ns(struct pf_cache *c, const uint32_t *ns, size_t nns, size_t max,
                         struct pf_block **out, size_t *skipped_p);
/* Footprint (pf_block_footprint) of the resident blocks of namespace id ns. */
uint64_t pf_cache_ns_bytes(struct pf_cache *c, uint32_t ns);
/* Removes every resident block regardless of references; *out_p is a malloc'ed array the
 * caller frees after putting each block. Returns the count (0 and *out_p NULL if empty). */
size_t pf_cache_remove_all(struct pf_cache *c, struct pf_block ***out_p);
/* Moves resident keys to the reclaimable class (MetaServer redundancy hint). */
size_t pf_cache_mark_reclaimable(struct pf_cache *c, const struct pf_block_key *keys, size_t n);

void pf_cache_stats(struct pf_cache *c, struct pf_cache_stats *s);
/* Calls fn for every resident block under the lock; fn must not call into the cache. */
void pf_cache_for_each(struct pf_cache *c, void (*fn)(void *ctx, const struct pf_block *b),
                       void *ctx);

/* ---- TinyLFU sketch (exposed for unit tests) ---- */
struct pf_tinylfu;
int pf_tinylfu_create(uint64_t items, struct pf_tinylfu **t_p);
void pf_tinylfu_destroy(struct pf_tinylfu *t);
void pf_tinylfu_touch(struct pf_tinylfu *t, uint64_t hash);
uint32_t pf_tinylfu_estimate(const struct pf_tinylfu *t, uint64_t hash);
uint64_t pf_tinylfu_resets(const struct pf_tinylfu *t);

#endif

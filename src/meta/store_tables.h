/* Containers of the MetaServer's memory store (store_tables.c), private to src/meta:
 *   - an arena: one private anonymous mapping per shard holding the shard's entries,
 *     addressed by offsets in 4-byte units (u32; 0 is never handed out), with a free list
 *     per size up to ARENA_MAX_UNITS; it grows by mapping a larger region and copying, so
 *     offsets stay valid across growth (2x) but pointers into it do not survive an allocation;
 *     never shrinks (freed entries are reused); not thread-safe (under the shard's mutex);
 *   - regions: zeroed tables, mapped (not malloc'ed) from 256 KiB up, so a large table
 *     freed on resize goes back to the system; smaller ones come from calloc (a mapping
 *     each would cost a page fault per page and a TLB shootdown per resize);
 *   - an id table: id -> object array with a free-id stack and an open-addressing index of
 *     ids by the objects' hashes (hash function given per call); not thread-safe (under
 *     the registry lock). */
#ifndef PF_META_STORE_TABLES_H
#define PF_META_STORE_TABLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define META_NO_ID        UINT32_MAX
#define ARENA_UNIT        4u
#define ARENA_MAX_UNITS   72u        /* largest entry the arena holds, in units */
#define ARENA_LIMIT_UNITS (1u << 26) /* 256 MiB a shard: offsets fit in 26 bits */

struct arena {
    uint8_t *mem;
    uint32_t top; /* units handed out (bump); 1 once mapped (unit 0 is never used) */
    uint32_t cap; /* units mapped */
    uint32_t free[ARENA_MAX_UNITS + 1];
};

static inline void *meta_arena_at(const struct arena *a, uint32_t off)
{
    return a->mem + (size_t)off * ARENA_UNIT;
}

/* units (1..ARENA_MAX_UNITS) of uninitialized memory: its offset, or 0 when the shard's
 * 256 MiB are used up or memory is short. May move the arena. */
uint32_t meta_arena_alloc(struct arena *a, uint32_t units);
/* Returns off (allocated with the same units) to its free list. */
void meta_arena_free(struct arena *a, uint32_t off, uint32_t units);
/* Bytes of the pages the arena has touched (what it adds to the RSS). */
size_t meta_arena_bytes(const struct arena *a);
void meta_arena_destroy(struct arena *a);

/* bytes of zeroed memory; NULL on ENOMEM. Free with the same bytes. */
void *meta_region_alloc(size_t bytes);
void meta_region_free(void *p, size_t bytes);

struct idtab {
    void **v;
    uint32_t hw; /* high water: ids < hw were handed out */
    uint32_t cap;
    uint32_t *freeids;
    uint32_t nfree, freecap;
    uint32_t live;
    uint32_t *ix; /* open addressing over ids, META_NO_ID = empty; sized 2^k >= 2 * live */
    size_t ixmask;
};

typedef uint64_t (*meta_idtab_hash_fn)(const void *obj);

/* Adds obj (hash h) and writes its id. 0 or -ENOMEM. */
int meta_idtab_add(struct idtab *t, void *obj, uint64_t h, meta_idtab_hash_fn hf, uint32_t *id_p);
/* Frees id (the object stays the caller's). */
void meta_idtab_del(struct idtab *t, uint32_t id);
/* Rebuilds the index from the live objects. */
void meta_idtab_reindex(struct idtab *t, meta_idtab_hash_fn hf);
void meta_idtab_destroy(struct idtab *t);

#endif

/* Containers of the MetaServer's memory store (store_tables.c), private to src/meta:
 *   - a slab: 8-byte size classes up to SLAB_MAX bytes carved from 16 KiB pages, larger
 *     sizes from malloc; not thread-safe (one per shard, under the shard's mutex);
 *   - an id table: id -> object array with a free-id stack and an open-addressing index of
 *     ids by the objects' hashes (hash function given per call); not thread-safe (under
 *     the registry lock). */
#ifndef PF_META_STORE_TABLES_H
#define PF_META_STORE_TABLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define META_NO_ID   UINT32_MAX
#define SLAB_PAGE    (16u << 10)
#define SLAB_MAX     512u /* larger entries use malloc */
#define SLAB_CLASSES (SLAB_MAX / 8 + 1)

struct slab_page {
    struct slab_page *next;
    uint8_t mem[] __attribute__((aligned(8)));
};

struct slab {
    void *free[SLAB_CLASSES];
    uint8_t *bump;
    size_t bump_left;
    struct slab_page *pages;
    size_t bytes; /* pages + large entries */
};

static inline bool meta_slab_is_big(size_t size)
{
    return ((size + 7) & ~(size_t)7) > SLAB_MAX;
}

/* size bytes (8-byte rounded); NULL on ENOMEM. */
void *meta_slab_alloc(struct slab *sl, size_t size);
/* Returns p (allocated with the same size) to its class or to malloc. */
void meta_slab_free(struct slab *sl, void *p, size_t size);
/* Frees every page and the slab's bookkeeping (not large entries: their owner frees them). */
void meta_slab_destroy(struct slab *sl);

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

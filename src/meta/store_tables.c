/* The memory store's containers: the arena, regions and the id table (store_tables.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "meta/store_tables.h"

#define NO_ID META_NO_ID

/* ------------------------------------------------------------------ regions */

#define REGION_MIN  (256u << 10) /* smaller tables come from calloc */
#define ARENA_FIRST (64u << 10)  /* first mapping (virtual: pages count once touched) */
#define PAGE_BYTES  4096u

void *meta_region_alloc(size_t bytes)
{
    if (bytes < REGION_MIN)
        return calloc(1, bytes ? bytes : 1);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void meta_region_free(void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes < REGION_MIN)
        free(p);
    else
        munmap(p, bytes);
}

/* ------------------------------------------------------------------ arena */

static int arena_grow(struct arena *a, uint32_t need)
{
    if (need > ARENA_LIMIT_UNITS)
        return -ENOMEM;
    uint64_t ncap = a->cap ? (uint64_t)a->cap * 2 : (ARENA_FIRST / ARENA_UNIT);
    if (ncap < need)
        ncap = need;
    ncap = (ncap + PAGE_BYTES / ARENA_UNIT - 1) & ~(uint64_t)(PAGE_BYTES / ARENA_UNIT - 1);
    if (ncap > ARENA_LIMIT_UNITS)
        ncap = ARENA_LIMIT_UNITS;
    size_t bytes = (size_t)ncap * ARENA_UNIT;
    uint8_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    if (a->mem) {
        memcpy(m, a->mem, (size_t)a->top * ARENA_UNIT);
        munmap(a->mem, (size_t)a->cap * ARENA_UNIT);
    } else {
        a->top = 1;
    }
    a->mem = m;
    a->cap = (uint32_t)ncap;
    return 0;
}

uint32_t meta_arena_alloc(struct arena *a, uint32_t units)
{
    if (units == 0 || units > ARENA_MAX_UNITS)
        return 0;
    uint32_t off = a->free[units];
    if (off) {
        memcpy(&a->free[units], meta_arena_at(a, off), sizeof(uint32_t));
        return off;
    }
    if (!a->mem || (uint64_t)a->top + units > a->cap) {
        if (arena_grow(a, (a->mem ? a->top : 1) + units))
            return 0;
    }
    off = a->top;
    a->top += units;
    return off;
}

void meta_arena_free(struct arena *a, uint32_t off, uint32_t units)
{
    memcpy(meta_arena_at(a, off), &a->free[units], sizeof(uint32_t));
    a->free[units] = off;
}

size_t meta_arena_bytes(const struct arena *a)
{
    if (!a->mem)
        return 0;
    return ((size_t)a->top * ARENA_UNIT + PAGE_BYTES - 1) & ~(size_t)(PAGE_BYTES - 1);
}

void meta_arena_destroy(struct arena *a)
{
    if (a->mem)
        munmap(a->mem, (size_t)a->cap * ARENA_UNIT);
    memset(a, 0, sizeof(*a));
}

static int idtab_ix_put(struct idtab *t, uint32_t id, uint64_t h)
{
    size_t i = h & t->ixmask;
    while (t->ix[i] != NO_ID)
        i = (i + 1) & t->ixmask;
    t->ix[i] = id;
    return 0;
}

static int idtab_ix_rebuild(struct idtab *t, size_t nslots, meta_idtab_hash_fn hf)
{
    uint32_t *ix = malloc(nslots * sizeof(*ix));
    if (!ix)
        return -ENOMEM;
    memset(ix, 0xff, nslots * sizeof(*ix));
    free(t->ix);
    t->ix = ix;
    t->ixmask = nslots - 1;
    for (uint32_t id = 0; id < t->hw; id++)
        if (t->v[id])
            idtab_ix_put(t, id, hf(t->v[id]));
    return 0;
}

int meta_idtab_add(struct idtab *t, void *obj, uint64_t h, meta_idtab_hash_fn hf, uint32_t *id_p)
{
    if (!t->ix || (size_t)(t->live + 1) * 2 > t->ixmask + 1) {
        size_t n = t->ix ? (t->ixmask + 1) * 2 : 16;
        int rc = idtab_ix_rebuild(t, n, hf);
        if (rc)
            return rc;
    }
    uint32_t id;
    if (t->nfree) {
        id = t->freeids[--t->nfree];
    } else {
        if (t->hw == t->cap) {
            if (t->cap >= NO_ID / 2)
                return -ENOMEM;
            uint32_t ncap = t->cap ? t->cap * 2 : 16;
            void **nv = realloc(t->v, ncap * sizeof(*nv));
            if (!nv)
                return -ENOMEM;
            t->v = nv;
            /* the free-id stack can hold every id, so deleting never allocates */
            uint32_t *nf = realloc(t->freeids, ncap * sizeof(*nf));
            if (!nf)
                return -ENOMEM;
            t->freeids = nf;
            t->cap = ncap;
        }
        id = t->hw++;
    }
    t->v[id] = obj;
    t->live++;
    idtab_ix_put(t, id, h);
    *id_p = id;
    return 0;
}

/* Frees id; the index is stale until meta_idtab_reindex (deletions happen in batches, in the
 * sweep, under the exclusive lock). */
void meta_idtab_del(struct idtab *t, uint32_t id)
{
    t->v[id] = NULL;
    t->live--;
    t->freeids[t->nfree++] = id;
}

void meta_idtab_reindex(struct idtab *t, meta_idtab_hash_fn hf)
{
    if (!t->ix)
        return;
    if (idtab_ix_rebuild(t, t->ixmask + 1, hf) == 0)
        return;
    /* no memory for a new index: rebuild in place */
    memset(t->ix, 0xff, (t->ixmask + 1) * sizeof(*t->ix));
    for (uint32_t id = 0; id < t->hw; id++)
        if (t->v[id])
            idtab_ix_put(t, id, hf(t->v[id]));
}

void meta_idtab_destroy(struct idtab *t)
{
    free(t->v);
    free(t->freeids);
    free(t->ix);
    memset(t, 0, sizeof(*t));
}

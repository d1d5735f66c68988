/* The memory store's containers: the size-class slab and the id table (store_tables.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/store_tables.h"

#define NO_ID META_NO_ID

/* ------------------------------------------------------------------ slab */

void *meta_slab_alloc(struct slab *sl, size_t size)
{
    size = (size + 7) & ~(size_t)7;
    if (size > SLAB_MAX) {
        void *big = malloc(size);
        if (big)
            sl->bytes += size;
        return big;
    }
    size_t c = size / 8;
    void *p = sl->free[c];
    if (p) {
        memcpy(&sl->free[c], p, sizeof(void *));
        return p;
    }
    if (sl->bump_left < size) {
        /* the tail of the old page goes to its size class */
        if (sl->bump_left >= 16) {
            size_t tc = sl->bump_left / 8;
            memcpy(sl->bump, &sl->free[tc], sizeof(void *));
            sl->free[tc] = sl->bump;
        }
        struct slab_page *pg = malloc(SLAB_PAGE);
        if (!pg)
            return NULL;
        pg->next = sl->pages;
        sl->pages = pg;
        sl->bytes += SLAB_PAGE;
        sl->bump = pg->mem;
        sl->bump_left = SLAB_PAGE - offsetof(struct slab_page, mem);
    }
    p = sl->bump;
    sl->bump += size;
    sl->bump_left -= size;
    return p;
}

void meta_slab_free(struct slab *sl, void *p, size_t size)
{
    size = (size + 7) & ~(size_t)7;
    if (size > SLAB_MAX) {
        free(p);
        sl->bytes -= size;
        return;
    }
    size_t c = size / 8;
    memcpy(p, &sl->free[c], sizeof(void *));
    sl->free[c] = p;
}

void meta_slab_destroy(struct slab *sl)
{
    /* malloc'ed (large) entries are freed by the caller's walk */
    struct slab_page *pg = sl->pages;
    while (pg) {
        struct slab_page *n = pg->next;
        free(pg);
        pg = n;
    }
    memset(sl, 0, sizeof(*sl));
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

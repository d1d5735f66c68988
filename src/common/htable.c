/* Chained hash table with power-of-two buckets; full rehash when count exceeds buckets. */
#include <errno.h>
#include <stdlib.h>

#include "pf/htable.h"
#include "pf/slab.h"

int pf_htable_init(struct pf_htable *t, size_t initial)
{
    size_t n = 16;
    while (n < initial)
        n <<= 1;
    t->buckets = pf_big_calloc(n, sizeof(*t->buckets));
    if (!t->buckets)
        return -ENOMEM;
    t->mask = n - 1;
    t->count = 0;
    return 0;
}

void pf_htable_destroy(struct pf_htable *t)
{
    if (!t)
        return;
    if (t->buckets)
        pf_big_free(t->buckets, t->mask + 1, sizeof(*t->buckets));
    t->buckets = NULL;
    t->mask = 0;
    t->count = 0;
}

static void grow(struct pf_htable *t)
{
    size_t n = (t->mask + 1) * 2;
    struct pf_hnode **nb = pf_big_calloc(n, sizeof(*nb));
    if (!nb)
        return;
    for (size_t i = 0; i <= t->mask; i++) {
        struct pf_hnode *e = t->buckets[i];
        while (e) {
            struct pf_hnode *next = e->next;
            size_t b = e->hash & (n - 1);
            e->next = nb[b];
            nb[b] = e;
            e = next;
        }
    }
    pf_big_free(t->buckets, t->mask + 1, sizeof(*t->buckets));
    t->buckets = nb;
    t->mask = n - 1;
}

void pf_htable_insert(struct pf_htable *t, struct pf_hnode *n, uint64_t hash)
{
    if (!t->buckets && pf_htable_init(t, 16) != 0)
        abort(); /* 128 bytes: nothing sensible to do */
    if (t->count >= t->mask + 1)
        grow(t);
    n->hash = (uint32_t)hash;
    size_t b = hash & t->mask;
    n->next = t->buckets[b];
    t->buckets[b] = n;
    t->count++;
}

void pf_htable_remove(struct pf_htable *t, struct pf_hnode *n)
{
    struct pf_hnode **pp = &t->buckets[n->hash & t->mask];
    while (*pp && *pp != n)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = n->next;
        n->next = NULL;
        t->count--;
    }
}

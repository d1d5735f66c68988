/* Intrusive chained hash table keyed by a caller-computed 64-bit hash.
 * The table stores nodes embedded in the caller's objects; key comparison is the caller's
 * (walk the chain with pf_htable_for_each_hash). Grows by doubling at load factor 1.
 * Not thread-safe: callers lock. Memory: 8 bytes per bucket + 16 bytes per node. A node keeps
 * the low 32 bits of the hash (chains compare those before the caller compares keys; buckets
 * are chosen from them, so a table stays below 2^32 buckets) and leaves 4 bytes (`user`) to
 * the embedding object, which the table never touches. */
#ifndef PF_HTABLE_H
#define PF_HTABLE_H

#include <stddef.h>
#include <stdint.h>

struct pf_hnode {
    struct pf_hnode *next;
    uint32_t hash; /* low 32 bits of the caller's hash */
    uint32_t user; /* the embedding object's (the block cache keeps the namespace id here) */
};

struct pf_htable {
    struct pf_hnode **buckets;
    size_t mask; /* nbuckets - 1 */
    size_t count;
};

/* Returns 0 or -ENOMEM. initial is rounded up to a power of two (min 16). */
int pf_htable_init(struct pf_htable *t, size_t initial);
/* Frees the bucket array; nodes are the caller's. Accepts a zeroed table. */
void pf_htable_destroy(struct pf_htable *t);
/* Inserts n with the given hash (duplicates allowed; callers check first). Never fails:
 * if growing fails the table just gets longer chains. */
void pf_htable_insert(struct pf_htable *t, struct pf_hnode *n, uint64_t hash);
/* Removes n, which must be in the table. */
void pf_htable_remove(struct pf_htable *t, struct pf_hnode *n);

static inline struct pf_hnode *pf_htable_bucket(const struct pf_htable *t, uint64_t hash)
{
    return t->buckets ? t->buckets[hash & t->mask] : NULL;
}

/* Iterate nodes whose stored hash equals h: for (n = ...; n; n = next-with-same-hash) */
#define pf_htable_for_each_hash(t, n, h)                                                           \
    for ((n) = pf_htable_bucket((t), (h)); (n); (n) = (n)->next)                                   \
        if ((n)->hash == (uint32_t)(h))

/* Visits every node; fn may not modify the table. */
#define pf_htable_for_each(t, i, n)                                                                \
    for (size_t i = 0; (t)->buckets && i <= (t)->mask; i++)                                        \
        for (struct pf_hnode *n = (t)->buckets[i]; n; n = n->next)

#endif

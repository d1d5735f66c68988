/* Two-level segregated-fit offset allocator over 32-bit unit offsets (O(1) alloc/free).
 *
 * Free ranges are binned by a tiny floating-point encoding of their size (3 mantissa bits,
 * 5 exponent bits: 248 bins, at most 12.5 % apart). A free range is filed under the bin of
 * its size rounded down; a request searches from the bin of its size rounded up, so any
 * range found fits; when none does, the request's own bin is scanned for a range that is
 * still large enough (exact fit). Two bitmaps (32 top bins x 8 leaf bins) find the first non-empty
 * bin with a couple of bit scans. Ranges keep physical neighbour links so a freed range coalesces
 * with free neighbours immediately. Nodes live in a preallocated table whose size bounds the number
 * of live allocations. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pf/pool.h"

#define MANT_BITS 3u
#define MANT_VAL  (1u << MANT_BITS)
#define MANT_MASK (MANT_VAL - 1u)
#define NBINS     256u
#define NONE      0xffffffffu

struct node {
    uint32_t off, size;
    uint32_t bin_prev, bin_next;
    uint32_t nb_prev, nb_next;
    uint8_t used;
};

struct pf_offalloc {
    uint32_t capacity;
    uint32_t max_nodes;
    struct node *nodes;
    uint32_t *free_ids; /* stack of unused node slots */
    uint32_t nfree_ids;
    uint32_t bins[NBINS];
    uint32_t top_mask;
    uint8_t leaf_mask[32];
    uint32_t free_units;
    uint32_t live;
};

static uint32_t bin_round_down(uint32_t size)
{
    if (size < MANT_VAL)
        return size;
    uint32_t h = 31u - (uint32_t)__builtin_clz(size);
    uint32_t start = h - MANT_BITS;
    return ((start + 1) << MANT_BITS) + ((size >> start) & MANT_MASK);
}

static uint32_t bin_round_up(uint32_t size)
{
    if (size < MANT_VAL)
        return size;
    uint32_t h = 31u - (uint32_t)__builtin_clz(size);
    uint32_t start = h - MANT_BITS;
    uint32_t bin = ((start + 1) << MANT_BITS) + ((size >> start) & MANT_MASK);
    if (size & ((1u << start) - 1))
        bin++; /* a mantissa carry moves into the exponent: still correct */
    return bin;
}

static int lowest_bit_from(uint32_t mask, uint32_t from)
{
    if (from >= 32)
        return -1;
    uint32_t m = mask & ~((1u << from) - 1u);
    return m ? __builtin_ctz(m) : -1;
}

static void bin_insert(struct pf_offalloc *a, uint32_t id)
{
    struct node *n = &a->nodes[id];
    uint32_t bin = bin_round_down(n->size);
    uint32_t top = bin >> MANT_BITS, leaf = bin & MANT_MASK;
    if (a->bins[bin] == NONE) {
        a->leaf_mask[top] |= (uint8_t)(1u << leaf);
        a->top_mask |= 1u << top;
    }
    n->bin_prev = NONE;
    n->bin_next = a->bins[bin];
    if (n->bin_next != NONE)
        a->nodes[n->bin_next].bin_prev = id;
    a->bins[bin] = id;
    a->free_units += n->size;
}

static void bin_remove(struct pf_offalloc *a, uint32_t id)
{
    struct node *n = &a->nodes[id];
    if (n->bin_prev != NONE) {
        a->nodes[n->bin_prev].bin_next = n->bin_next;
    } else {
        uint32_t bin = bin_round_down(n->size);
        a->bins[bin] = n->bin_next;
        if (n->bin_next == NONE) {
            uint32_t top = bin >> MANT_BITS, leaf = bin & MANT_MASK;
            a->leaf_mask[top] &= (uint8_t) ~(1u << leaf);
            if (!a->leaf_mask[top])
                a->top_mask &= ~(1u << top);
        }
    }
    if (n->bin_next != NONE)
        a->nodes[n->bin_next].bin_prev = n->bin_prev;
    a->free_units -= n->size;
}

static uint32_t node_new(struct pf_offalloc *a, uint32_t off, uint32_t size)
{
    uint32_t id = a->free_ids[--a->nfree_ids];
    struct node *n = &a->nodes[id];
    memset(n, 0, sizeof(*n));
    n->off = off;
    n->size = size;
    n->bin_prev = n->bin_next = n->nb_prev = n->nb_next = NONE;
    return id;
}

static void node_release(struct pf_offalloc *a, uint32_t id)
{
    a->free_ids[a->nfree_ids++] = id;
}

int pf_offalloc_create(uint32_t capacity, uint32_t max_allocs, struct pf_offalloc **a_p)
{
    if (capacity == 0)
        return -EINVAL;
    if (max_allocs == 0)
        max_allocs = 4000000;
    struct pf_offalloc *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->capacity = capacity;
    /* live allocations + one free range between each pair + the tail */
    a->max_nodes = max_allocs * 2 + 2;
    a->nodes = malloc((size_t)a->max_nodes * sizeof(*a->nodes));
    a->free_ids = malloc((size_t)a->max_nodes * sizeof(*a->free_ids));
    if (!a->nodes || !a->free_ids) {
        pf_offalloc_destroy(a);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < a->max_nodes; i++)
        a->free_ids[i] = a->max_nodes - 1 - i;
    a->nfree_ids = a->max_nodes;
    for (uint32_t i = 0; i < NBINS; i++)
        a->bins[i] = NONE;
    bin_insert(a, node_new(a, 0, capacity));
    *a_p = a;
    return 0;
}

void pf_offalloc_destroy(struct pf_offalloc *a)
{
    if (!a)
        return;
    free(a->nodes);
    free(a->free_ids);
    free(a);
}

int pf_offalloc_alloc(struct pf_offalloc *a, uint32_t units, uint32_t *node_p, uint32_t *off_p)
{
    if (units == 0 || units > a->capacity || a->nfree_ids < 2)
        return -ENOMEM;
    uint32_t min_bin = bin_round_up(units);
    uint32_t top = min_bin >> MANT_BITS, leaf = min_bin & MANT_MASK;
    int l = -1;
    if (top < 32 && (a->top_mask & (1u << top)))
        l = lowest_bit_from(a->leaf_mask[top], leaf);
    uint32_t id = NONE;
    if (l < 0) {
        int t = lowest_bit_from(a->top_mask, top + 1);
        if (t >= 0) {
            top = (uint32_t)t;
            l = __builtin_ctz(a->leaf_mask[top]);
        }
    }
    if (l >= 0) {
        id = a->bins[(top << MANT_BITS) | (uint32_t)l];
    } else {
        /* exact-fit fallback: a range in the request's own (rounded-down) bin may still be
         * large enough; scanning that one list keeps a nearly full pool usable */
        for (uint32_t c = a->bins[bin_round_down(units)]; c != NONE; c = a->nodes[c].bin_next)
            if (a->nodes[c].size >= units) {
                id = c;
                break;
            }
        if (id == NONE)
            return -ENOMEM;
    }
    bin_remove(a, id);
    struct node *n = &a->nodes[id];
    uint32_t rest = n->size - units;
    n->size = units;
    n->used = 1;
    if (rest) {
        uint32_t rid = node_new(a, n->off + units, rest);
        n = &a->nodes[id]; /* (table is fixed; kept for clarity) */
        struct node *r = &a->nodes[rid];
        r->nb_prev = id;
        r->nb_next = n->nb_next;
        if (n->nb_next != NONE)
            a->nodes[n->nb_next].nb_prev = rid;
        n->nb_next = rid;
        bin_insert(a, rid);
    }
    a->live++;
    *node_p = id;
    *off_p = n->off;
    return 0;
}

void pf_offalloc_free(struct pf_offalloc *a, uint32_t id)
{
    struct node *n = &a->nodes[id];
    n->used = 0;
    a->live--;
    if (n->nb_prev != NONE && !a->nodes[n->nb_prev].used) {
        uint32_t pid = n->nb_prev;
        struct node *p = &a->nodes[pid];
        bin_remove(a, pid);
        n->off = p->off;
        n->size += p->size;
        n->nb_prev = p->nb_prev;
        if (p->nb_prev != NONE)
            a->nodes[p->nb_prev].nb_next = id;
        node_release(a, pid);
    }
    if (n->nb_next != NONE && !a->nodes[n->nb_next].used) {
        uint32_t nid = n->nb_next;
        struct node *x = &a->nodes[nid];
        bin_remove(a, nid);
        n->size += x->size;
        n->nb_next = x->nb_next;
        if (x->nb_next != NONE)
            a->nodes[x->nb_next].nb_prev = id;
        node_release(a, nid);
    }
    bin_insert(a, id);
}

uint32_t pf_offalloc_free_units(const struct pf_offalloc *a)
{
    return a->free_units;
}

uint32_t pf_offalloc_live(const struct pf_offalloc *a)
{
    return a->live;
}

uint32_t pf_offalloc_largest_free(const struct pf_offalloc *a)
{
    if (!a->top_mask)
        return 0;
    uint32_t top = 31u - (uint32_t)__builtin_clz(a->top_mask);
    uint32_t leaf = 7u - (uint32_t)__builtin_clz((uint32_t)a->leaf_mask[top] << 24);
    uint32_t best = 0;
    for (uint32_t id = a->bins[(top << MANT_BITS) | leaf]; id != NONE; id = a->nodes[id].bin_next)
        if (a->nodes[id].size > best)
            best = a->nodes[id].size;
    return best;
}

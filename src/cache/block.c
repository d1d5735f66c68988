/* Block lifetime (strong/weak counts), checksums, keys and namespace interning. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pf/block.h"
#include "pf/pool.h"
#include "pf/slab.h"
#include "pf/util.h"

struct pf_block *pf_block_new(const struct pf_block_key *key, uint16_t nslots)
{
    struct pf_block *b = pf_slab_alloc(sizeof(*b) + (size_t)nslots * sizeof(struct pf_slot));
    if (!b)
        return NULL;
    atomic_init(&b->strong, 1);
    atomic_init(&b->weak, 1);
    pf_list_init(&b->lru);
    b->nslots = nslots;
    b->key = *key;
    return b;
}

static void release_data(struct pf_block *b)
{
    for (uint16_t i = 0; i < b->nslots; i++) {
        pf_alloc_put(b->slots[i].ka);
        pf_alloc_put(b->slots[i].va);
        b->slots[i].ka = b->slots[i].va = NULL;
    }
}

void pf_block_weak_put(struct pf_block *b)
{
    if (b && atomic_fetch_sub_explicit(&b->weak, 1, memory_order_acq_rel) == 1)
        pf_slab_free(b, sizeof(*b) + (size_t)b->nslots * sizeof(struct pf_slot));
}

void pf_block_put(struct pf_block *b)
{
    if (!b)
        return;
    if (atomic_fetch_sub_explicit(&b->strong, 1, memory_order_acq_rel) != 1)
        return;
    release_data(b);
    pf_block_weak_put(b);
}

bool pf_block_upgrade(struct pf_block *b)
{
    uint32_t s = atomic_load_explicit(&b->strong, memory_order_relaxed);
    while (s != 0) {
        if (atomic_compare_exchange_weak_explicit(&b->strong, &s, s + 1, memory_order_acq_rel,
                                                  memory_order_relaxed))
            return true;
    }
    return false;
}

uint64_t pf_slot_compute_checksum(const struct pf_slot *s)
{
    return pf_checksum2(s->k, s->seg_len, s->nseg > 1 ? s->v : NULL,
                        s->nseg > 1 && s->v ? s->seg_len : 0);
}

void pf_block_checksum(struct pf_block *b)
{
    for (uint16_t i = 0; i < b->nslots; i++) {
        b->slots[i].checksum = pf_slot_compute_checksum(&b->slots[i]);
        b->slots[i].has_checksum = 1;
    }
}

bool pf_slot_verify(const struct pf_slot *s, uint64_t expected)
{
    return pf_slot_compute_checksum(s) == expected;
}

void pf_block_finish(struct pf_block *b)
{
    uint64_t f = 0;
    for (uint16_t i = 0; i < b->nslots; i++)
        f += (uint64_t)b->slots[i].seg_stride * b->slots[i].nseg;
    b->footprint = f;
}

uint64_t pf_key_hash(const struct pf_block_key *k)
{
    return XXH3_64bits_withSeed(k->hash, k->len, k->ns);
}

int pf_key_make(uint32_t ns, const void *hash, size_t len, struct pf_block_key *k_p)
{
    if (len == 0 || len > PF_HASH_MAX)
        return -EINVAL;
    k_p->ns = ns;
    k_p->len = (uint8_t)len;
    memcpy(k_p->hash, hash, len);
    if (len < PF_HASH_MAX)
        memset(k_p->hash + len, 0, PF_HASH_MAX - len);
    return 0;
}

/* ---- namespaces ---- */

static pthread_mutex_t ns_mu = PTHREAD_MUTEX_INITIALIZER;
static char **ns_names;
static uint32_t ns_count, ns_cap;

static int find_locked(const char *ns, uint32_t *id_p)
{
    for (uint32_t i = 0; i < ns_count; i++)
        if (strcmp(ns_names[i], ns) == 0) {
            *id_p = i;
            return 0;
        }
    return -ENOENT;
}

int pf_ns_lookup(const char *ns, uint32_t *id_p)
{
    pthread_mutex_lock(&ns_mu);
    int rc = find_locked(ns, id_p);
    pthread_mutex_unlock(&ns_mu);
    return rc;
}

int pf_ns_intern(const char *ns, uint32_t *id_p)
{
    int rc = 0;
    pthread_mutex_lock(&ns_mu);
    if (find_locked(ns, id_p) == 0)
        goto out;
    if (ns_count == ns_cap) {
        uint32_t nc = ns_cap ? ns_cap * 2 : 16;
        char **nn = realloc(ns_names, nc * sizeof(*nn));
        if (!nn) {
            rc = -ENOMEM;
            goto out;
        }
        ns_names = nn;
        ns_cap = nc;
    }
    ns_names[ns_count] = strdup(ns);
    if (!ns_names[ns_count]) {
        rc = -ENOMEM;
        goto out;
    }
    *id_p = ns_count++;
out:
    pthread_mutex_unlock(&ns_mu);
    return rc;
}

const char *pf_ns_name(uint32_t id)
{
    pthread_mutex_lock(&ns_mu);
    const char *n = id < ns_count ? ns_names[id] : "";
    pthread_mutex_unlock(&ns_mu);
    return n;
}

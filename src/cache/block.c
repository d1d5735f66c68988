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

/* ---- record layout (see pf/block.h) ---- */

#define HDR offsetof(struct pf_block, tail)
/* the lookup fields (through the inline hash bytes) stay in the first 56 bytes and the
 * header at 92 bytes (record sizes, docs/architecture.md) */
_Static_assert(offsetof(struct pf_block, hash) + PF_BLOCK_HASH_INLINE == 56, "lookup fields");
_Static_assert(offsetof(struct pf_block, tail) == 92, "block header size");
#define GEO_SMALL 8
#define GEO_WIDE  12
#define PAD_MAX   0xffffu
#define NUMA_MIN  (-1)
#define NUMA_MAX  63

struct geo {
    uint32_t seg_len, seg_stride;
    int16_t numa;
    uint8_t nseg, has_checksum;
};

static size_t key_extra(uint8_t keylen)
{
    return keylen > PF_BLOCK_HASH_INLINE ? keylen - PF_BLOCK_HASH_INLINE : 0;
}
static size_t csum_off(const struct pf_block *b)
{
    return key_extra(b->keylen);
}
static size_t geo_off(const struct pf_block *b)
{
    return csum_off(b) + (b->fmt & PF_BLK_CSUM ? (size_t)b->nslots * 8 : 0);
}
static size_t geo_size(uint8_t fmt)
{
    return fmt & PF_BLK_GEO_WIDE ? GEO_WIDE : GEO_SMALL;
}
static size_t ref_off(const struct pf_block *b)
{
    return geo_off(b) + geo_size(b->fmt) * (b->fmt & PF_BLK_GEO_SLOT ? b->nslots : 1);
}
static size_t ref_size(uint8_t fmt)
{
    return fmt & PF_BLK_REF8 ? 8 : 4;
}
static size_t refs_per_slot(uint8_t fmt)
{
    return fmt & PF_BLK_TWOSEG ? 2 : 1;
}
static size_t record_size(uint8_t keylen, uint16_t nslots, uint8_t fmt)
{
    return HDR + key_extra(keylen) + (fmt & PF_BLK_CSUM ? (size_t)nslots * 8 : 0) +
           geo_size(fmt) * (fmt & PF_BLK_GEO_SLOT ? nslots : 1) +
           ref_size(fmt) * refs_per_slot(fmt) * nslots;
}

size_t pf_block_record_size(const struct pf_block *b)
{
    return record_size(b->keylen, b->nslots, b->fmt);
}

static void geo_put(uint8_t *p, uint8_t fmt, const struct geo *g)
{
    if (fmt & PF_BLK_GEO_WIDE) {
        memcpy(p, &g->seg_len, 4);
        memcpy(p + 4, &g->seg_stride, 4);
        memcpy(p + 8, &g->numa, 2);
        p[10] = g->nseg;
        p[11] = g->has_checksum;
        return;
    }
    uint16_t pad = (uint16_t)(g->seg_stride - g->seg_len);
    memcpy(p, &g->seg_len, 4);
    memcpy(p + 4, &pad, 2);
    p[6] = (uint8_t)(int8_t)g->numa;
    p[7] = (uint8_t)(g->nseg | (g->has_checksum ? 4 : 0));
}

static void geo_get(const struct pf_block *b, uint16_t i, struct geo *g)
{
    const uint8_t *p = b->tail + geo_off(b);
    if (b->fmt & PF_BLK_GEO_SLOT)
        p += (size_t)i * geo_size(b->fmt);
    if (b->fmt & PF_BLK_GEO_WIDE) {
        memcpy(&g->seg_len, p, 4);
        memcpy(&g->seg_stride, p + 4, 4);
        memcpy(&g->numa, p + 8, 2);
        g->nseg = p[10];
        g->has_checksum = p[11];
        return;
    }
    uint16_t pad;
    memcpy(&g->seg_len, p, 4);
    memcpy(&pad, p + 4, 2);
    g->seg_stride = g->seg_len + pad;
    g->numa = (int8_t)p[6];
    g->nseg = p[7] & 3;
    g->has_checksum = (p[7] >> 2) & 1;
}

static bool geo_small_ok(const struct geo *g)
{
    return g->seg_stride - g->seg_len <= PAD_MAX && g->numa >= NUMA_MIN && g->numa <= NUMA_MAX;
}

static bool geo_eq(const struct geo *a, const struct geo *b)
{
    return a->seg_len == b->seg_len && a->seg_stride == b->seg_stride && a->numa == b->numa &&
           a->nseg == b->nseg && a->has_checksum == b->has_checksum;
}

static struct pf_alloc *alloc_at(const struct pf_block *b, uint32_t idx)
{
    if (b->fmt & PF_BLK_SINGLE)
        return b->allocs;
    const struct pf_allocset *set = b->allocs;
    return idx < set->n ? set->a[idx] : NULL;
}

static uint64_t ref_get(const struct pf_block *b, uint16_t i, unsigned seg)
{
    const uint8_t *p =
        b->tail + ref_off(b) + ((size_t)i * refs_per_slot(b->fmt) + seg) * ref_size(b->fmt);
    if (b->fmt & PF_BLK_REF8) {
        uint64_t r;
        memcpy(&r, p, 8);
        return r;
    }
    uint32_t r;
    memcpy(&r, p, 4);
    return r;
}

static void *ref_ptr(const struct pf_block *b, uint64_t r, struct pf_alloc **a_p)
{
    uint64_t mask = b->refbits >= 64 ? UINT64_MAX : (UINT64_C(1) << b->refbits) - 1;
    struct pf_alloc *a = alloc_at(b, b->refbits >= 64 ? 0 : (uint32_t)(r >> b->refbits));
    if (a_p)
        *a_p = a;
    return (char *)a->ptr + (r & mask);
}

void *pf_slot_k(const struct pf_block *b, uint16_t i)
{
    return ref_ptr(b, ref_get(b, i, 0), NULL);
}

void *pf_slot_v(const struct pf_block *b, uint16_t i)
{
    struct geo g;
    geo_get(b, i, &g);
    return g.nseg > 1 ? ref_ptr(b, ref_get(b, i, 1), NULL) : NULL;
}

void pf_block_slot(const struct pf_block *b, uint16_t i, struct pf_slot *s)
{
    struct geo g;
    geo_get(b, i, &g);
    *s = (struct pf_slot){.seg_len = g.seg_len,
                          .seg_stride = g.seg_stride,
                          .numa = g.numa,
                          .nseg = g.nseg,
                          .has_checksum = g.has_checksum};
    if (b->fmt & PF_BLK_CSUM)
        memcpy(&s->checksum, b->tail + csum_off(b) + (size_t)i * 8, 8);
    s->k = ref_ptr(b, ref_get(b, i, 0), &s->ka);
    if (g.nseg > 1)
        s->v = ref_ptr(b, ref_get(b, i, 1), &s->va);
}

uint64_t pf_block_footprint(const struct pf_block *b)
{
    struct geo g;
    if (!(b->fmt & PF_BLK_GEO_SLOT)) {
        geo_get(b, 0, &g);
        return (uint64_t)g.seg_stride * g.nseg * b->nslots;
    }
    uint64_t f = 0;
    for (uint16_t i = 0; i < b->nslots; i++) {
        geo_get(b, i, &g);
        f += (uint64_t)g.seg_stride * g.nseg;
    }
    return f;
}

struct pf_block_key pf_block_key(const struct pf_block *b)
{
    struct pf_block_key k = {.ns = b->hnode.user, .len = b->keylen};
    size_t in = b->keylen < PF_BLOCK_HASH_INLINE ? b->keylen : PF_BLOCK_HASH_INLINE;
    memcpy(k.hash, b->hash, in);
    memcpy(k.hash + in, b->tail, key_extra(b->keylen));
    return k;
}

uint64_t pf_block_key_hash(const struct pf_block *b)
{
    if (b->keylen <= PF_BLOCK_HASH_INLINE)
        return XXH3_64bits_withSeed(b->hash, b->keylen, b->hnode.user);
    struct pf_block_key k = pf_block_key(b);
    return pf_key_hash(&k);
}

/* ---- packing ---- */

static void allocset_put(struct pf_allocset *set)
{
    if (!set || atomic_fetch_sub_explicit(&set->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (uint32_t i = 0; i < set->n; i++)
        pf_alloc_put(set->a[i]);
    free(set);
}

void pf_block_packer_done(struct pf_block_packer *pk)
{
    if (!pk)
        return;
    allocset_put(pk->last);
    pk->last = NULL;
}

static unsigned bits_for(uint64_t v) /* bits to hold values 0..v */
{
    return v ? 64u - (unsigned)__builtin_clzll(v) : 0;
}

static bool slot_ok(const struct pf_slot *s)
{
    if (!s->k || !s->ka || (uintptr_t)s->k < (uintptr_t)s->ka->ptr || s->seg_stride < s->seg_len)
        return false;
    if (s->nseg == 1)
        return true;
    return s->nseg == 2 && s->v && s->va && (uintptr_t)s->v >= (uintptr_t)s->va->ptr;
}

/* Index of a in the distinct list, appending it when new; *hint is where the last search
 * ended (slots usually name their allocations in order). */
static uint32_t alloc_index(struct pf_alloc **list, uint32_t *n, struct pf_alloc *a, uint32_t *hint)
{
    for (uint32_t j = *hint; j < *n; j++)
        if (list[j] == a)
            return *hint = j;
    for (uint32_t j = 0; j < *hint && j < *n; j++)
        if (list[j] == a)
            return *hint = j;
    list[*n] = a;
    return *hint = (*n)++;
}

int pf_block_pack(struct pf_block_packer *pk, const struct pf_block_key *key, uint16_t nslots,
                  struct pf_slot *slots, struct pf_block **b_p)
{
    if (nslots == 0 || key->len == 0 || key->len > PF_HASH_MAX)
        return -EINVAL;
    uint8_t fmt = 0;
    struct geo g0 = {0};
    uint64_t maxoff = 0;
    bool csum = false;
    for (uint16_t i = 0; i < nslots; i++) {
        const struct pf_slot *s = &slots[i];
        if (!slot_ok(s))
            return -EINVAL;
        struct geo g = {s->seg_len, s->seg_stride, s->numa, s->nseg, s->has_checksum ? 1 : 0};
        if (i == 0)
            g0 = g;
        else if (!geo_eq(&g, &g0))
            fmt |= PF_BLK_GEO_SLOT;
        if (!geo_small_ok(&g))
            fmt |= PF_BLK_GEO_WIDE;
        if (s->nseg == 2)
            fmt |= PF_BLK_TWOSEG;
        csum |= s->has_checksum != 0;
        uint64_t ko = (uint64_t)((uintptr_t)s->k - (uintptr_t)s->ka->ptr);
        maxoff = ko > maxoff ? ko : maxoff;
        if (s->nseg == 2) {
            uint64_t vo = (uint64_t)((uintptr_t)s->v - (uintptr_t)s->va->ptr);
            maxoff = vo > maxoff ? vo : maxoff;
        }
    }
    if (csum)
        fmt |= PF_BLK_CSUM;

    /* distinct allocations, first use first */
    size_t nref = (size_t)nslots * ((fmt & PF_BLK_TWOSEG) ? 2 : 1);
    struct pf_alloc *stack_list[64];
    uint32_t stack_idx[64];
    struct pf_alloc **list = stack_list;
    uint32_t *idx = stack_idx;
    if (nref > 64) {
        list = malloc(nref * sizeof(*list));
        idx = malloc(nref * sizeof(*idx));
        if (!list || !idx) {
            free(list);
            free(idx);
            return -ENOMEM;
        }
    }
    uint32_t n = 0, hint = 0;
    for (uint16_t i = 0; i < nslots; i++) {
        idx[(size_t)i * (nref / nslots)] = alloc_index(list, &n, slots[i].ka, &hint);
        if (fmt & PF_BLK_TWOSEG)
            idx[(size_t)i * 2 + 1] =
                slots[i].nseg == 2 ? alloc_index(list, &n, slots[i].va, &hint) : 0;
    }
    unsigned ibits = bits_for(n - 1);
    unsigned obits = bits_for(maxoff);
    int rc = 0;
    uint8_t refbits;
    if (ibits + obits <= 32) {
        refbits = (uint8_t)(32 - ibits);
    } else if (ibits + obits <= 64) {
        fmt |= PF_BLK_REF8;
        refbits = (uint8_t)(64 - ibits);
    } else {
        rc = -ERANGE;
        goto out;
    }
    if (n == 1)
        fmt |= PF_BLK_SINGLE;

    size_t size = record_size(key->len, nslots, fmt);
    struct pf_block *b = pf_slab_alloc(size);
    if (!b) {
        rc = -ENOMEM;
        goto out;
    }
    struct pf_allocset *set = NULL;
    if (n > 1) {
        struct pf_allocset *last = pk ? pk->last : NULL;
        if (last && last->n == n && memcmp(last->a, list, n * sizeof(*list)) == 0) {
            set = last;
            atomic_fetch_add_explicit(&set->refs, 1, memory_order_relaxed);
        } else {
            set = malloc(sizeof(*set) + n * sizeof(set->a[0]));
            if (!set) {
                pf_slab_free(b, size);
                rc = -ENOMEM;
                goto out;
            }
            atomic_init(&set->refs, 1);
            set->n = n;
            for (uint32_t j = 0; j < n; j++) {
                set->a[j] = list[j];
                pf_alloc_get(list[j]); /* the table's reference */
            }
            if (pk) {
                allocset_put(pk->last);
                atomic_fetch_add_explicit(&set->refs, 1, memory_order_relaxed);
                pk->last = set;
            }
        }
    } else {
        pf_alloc_get(list[0]); /* the block's reference */
    }

    atomic_init(&b->strong, 1);
    atomic_init(&b->weak, 1);
    pf_list_init(&b->lru);
    b->hnode.user = key->ns;
    b->keylen = key->len;
    b->nslots = nslots;
    b->fmt = fmt;
    b->refbits = refbits;
    b->allocs = n > 1 ? (void *)set : (void *)list[0];
    size_t in = key->len < PF_BLOCK_HASH_INLINE ? key->len : PF_BLOCK_HASH_INLINE;
    memcpy(b->hash, key->hash, in);
    memcpy(b->tail, key->hash + in, key_extra(key->len));
    uint8_t *cs = b->tail + csum_off(b), *gp = b->tail + geo_off(b), *rp = b->tail + ref_off(b);
    size_t rs = ref_size(fmt);
    for (uint16_t i = 0; i < nslots; i++) {
        struct pf_slot *s = &slots[i];
        if (fmt & PF_BLK_CSUM) {
            uint64_t c = s->has_checksum ? s->checksum : 0;
            memcpy(cs + (size_t)i * 8, &c, 8);
        }
        if (i == 0 || (fmt & PF_BLK_GEO_SLOT)) {
            struct geo g = {s->seg_len, s->seg_stride, s->numa, s->nseg, s->has_checksum ? 1 : 0};
            geo_put(gp + (size_t)i * geo_size(fmt) * ((fmt & PF_BLK_GEO_SLOT) ? 1 : 0), fmt, &g);
        }
        for (unsigned seg = 0; seg < refs_per_slot(fmt); seg++) {
            uint64_t r = 0;
            if (seg < s->nseg) {
                const void *p = seg ? s->v : s->k;
                struct pf_alloc *a = seg ? s->va : s->ka;
                if (refbits < 64) /* 64: one allocation, the whole reference is offset */
                    r = (uint64_t)idx[(size_t)i * refs_per_slot(fmt) + seg] << refbits;
                r |= (uint64_t)((uintptr_t)p - (uintptr_t)a->ptr);
            }
            uint8_t *q = rp + ((size_t)i * refs_per_slot(fmt) + seg) * rs;
            if (rs == 8) {
                memcpy(q, &r, 8);
            } else {
                uint32_t r32 = (uint32_t)r;
                memcpy(q, &r32, 4);
            }
        }
    }
    /* the block (or its table) now holds one reference per distinct allocation */
    for (uint16_t i = 0; i < nslots; i++) {
        pf_alloc_put(slots[i].ka);
        pf_alloc_put(slots[i].nseg == 2 ? slots[i].va : NULL);
        slots[i].ka = slots[i].va = NULL;
    }
    *b_p = b;
out:
    if (list != stack_list) {
        free(list);
        free(idx);
    }
    return rc;
}

static void release_data(struct pf_block *b)
{
    if (b->fmt & PF_BLK_SINGLE)
        pf_alloc_put(b->allocs);
    else
        allocset_put(b->allocs);
    b->allocs = NULL;
}

void pf_block_weak_put(struct pf_block *b)
{
    if (b && atomic_fetch_sub_explicit(&b->weak, 1, memory_order_acq_rel) == 1)
        pf_slab_free(b, pf_block_record_size(b));
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

void pf_slots_checksum(struct pf_slot *slots, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        slots[i].checksum = pf_slot_compute_checksum(&slots[i]);
        slots[i].has_checksum = 1;
    }
}

bool pf_slot_verify(const struct pf_slot *s, uint64_t expected)
{
    return pf_slot_compute_checksum(s) == expected;
}

bool pf_block_slot_verify(const struct pf_block *b, uint16_t i)
{
    struct pf_slot s;
    pf_block_slot(b, i, &s);
    return !s.has_checksum || pf_slot_verify(&s, s.checksum);
}

uint64_t pf_key_hash(const struct pf_block_key *k)
{
    return XXH3_64bits_withSeed(k->hash, k->len, k->ns);
}

uint64_t pf_hash_of(uint32_t ns, const void *hash, size_t len)
{
    return XXH3_64bits_withSeed(hash, len, ns);
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

uint32_t pf_ns_count(void)
{
    pthread_mutex_lock(&ns_mu);
    uint32_t n = ns_count;
    pthread_mutex_unlock(&ns_mu);
    return n;
}

const char *pf_ns_name(uint32_t id)
{
    pthread_mutex_lock(&ns_mu);
    const char *n = id < ns_count ? ns_names[id] : "";
    pthread_mutex_unlock(&ns_mu);
    return n;
}

/* RAM cache: hash index + per-class recency lists under one mutex (see pf/cache.h).
 *
 * Recency is tracked CLOCK-style: a hit only sets the block's `accessed` mark (in the cache
 * line the lookup already loaded); eviction walks a class list from its old end and gives
 * marked blocks a second chance (mark cleared, moved to the recent end). This approximates
 * LRU without touching two neighbouring blocks on every hit. Lookups of many keys run
 * through a software pipeline (below) that prefetches buckets and blocks ahead of the
 * comparisons, so a prefix query over thousands of hashes runs at the machine's
 * memory-level parallelism rather than one memory latency after another. */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define PF_LOG_MOD "cache"
#include "pf/cache.h"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/metrics.h"

struct pf_cache {
    pthread_mutex_t mu;
    struct pf_htable index;
    struct pf_list cls[2];
    uint64_t nblocks[2], nbytes[2];
    uint64_t *ns_bytes; /* resident footprint per namespace id, ns_cap entries */
    uint32_t ns_cap;
    struct pf_tinylfu *lfu;
    struct pf_metric_child *m_blocks[2];
    struct pf_metric *m_bytes, *m_inserts, *m_rejects;
};

static const char *const class_names[2] = {"retained", "reclaimable"};

int pf_cache_create(const struct pf_cache_config *cfg, struct pf_cache **c_p)
{
    struct pf_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    int rc = pf_htable_init(&c->index, 1024);
    if (rc)
        goto err_free;
    if (cfg && cfg->lfu_items) {
        rc = pf_tinylfu_create(cfg->lfu_items, &c->lfu);
        if (rc)
            goto err_index;
    }
    pthread_mutex_init(&c->mu, NULL);
    pf_list_init(&c->cls[0]);
    pf_list_init(&c->cls[1]);
    struct pf_metric *mb = pf_metric_gauge("pegaflow_cache_resident_blocks",
                                           "Blocks resident in the RAM cache", "class");
    for (int i = 0; i < 2; i++) {
        c->m_blocks[i] = pf_metric_child1(mb, class_names[i]);
        pf_child_set(c->m_blocks[i], 0);
    }
    c->m_bytes = pf_metric_gauge("pegaflow_cache_resident_bytes",
                                 "Bytes of blocks resident in the RAM cache", NULL);
    pf_metric_set(c->m_bytes, 0);
    c->m_inserts = pf_metric_counter("pegaflow_cache_block_insertions",
                                     "Blocks inserted into the RAM cache", NULL);
    c->m_rejects = pf_metric_counter("pegaflow_cache_block_admission_rejections",
                                     "Blocks refused by TinyLFU admission", NULL);
    *c_p = c;
    return 0;
err_index:
    pf_htable_destroy(&c->index);
err_free:
    free(c);
    return rc;
}

static void publish(struct pf_cache *c)
{
    pf_child_set(c->m_blocks[0], (double)c->nblocks[0]);
    pf_child_set(c->m_blocks[1], (double)c->nblocks[1]);
    pf_metric_set(c->m_bytes, (double)(c->nbytes[0] + c->nbytes[1]));
}

static struct pf_block *find(struct pf_cache *c, const struct pf_block_key *k, uint64_t h)
{
    struct pf_hnode *n;
    pf_htable_for_each_hash(&c->index, n, h)
    {
        struct pf_block *b = pf_container_of(n, struct pf_block, hnode);
        if (pf_block_key_eq(b, k))
            return b;
    }
    return NULL;
}

static void unlink_block(struct pf_cache *c, struct pf_block *b)
{
    pf_htable_remove(&c->index, &b->hnode);
    pf_list_del(&b->lru);
    c->nblocks[b->cls]--;
    uint64_t fp = pf_block_footprint(b);
    c->nbytes[b->cls] -= fp;
    if (pf_block_ns(b) < c->ns_cap)
        c->ns_bytes[pf_block_ns(b)] -= fp;
    b->resident = 0;
    if (b->pins && !b->pinref) {
        /* leaving the index while leased: the pins keep the block alive from now on (the
         * caller takes over the cache's reference); the last unpin drops this one */
        pf_block_get(b);
        b->pinref = 1;
    }
}

/* Room for namespace id ns in ns_bytes (cache lock). */
static int ns_reserve(struct pf_cache *c, uint32_t ns)
{
    if (ns < c->ns_cap)
        return 0;
    uint32_t cap = c->ns_cap ? c->ns_cap : 16;
    while (cap <= ns)
        cap *= 2;
    uint64_t *v = realloc(c->ns_bytes, (size_t)cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    memset(v + c->ns_cap, 0, (size_t)(cap - c->ns_cap) * sizeof(*v));
    c->ns_bytes = v;
    c->ns_cap = cap;
    return 0;
}

static void hit(struct pf_cache *c, struct pf_block *b, uint64_t h)
{
    if (!b->accessed)
        b->accessed = 1;
    if (c->lfu)
        pf_tinylfu_touch(c->lfu, h);
}

/* Batched lookups run the keys through a software pipeline, each stage a fixed distance
 * ahead of the key being compared, so the misses of the next keys overlap with the current
 * one's work instead of each key paying its chain of dependent loads (distances measured on
 * a 10^6-block index with bench/query_cpu: 24/16/8 and 48/32/16 ran within noise of these;
 * a prefix that misses early hashes up to PIPE_HASH keys it never compares, ~3 ns each):
 *   key i + PIPE_HASH:   hash it (xxh3 inlined here; a raw 32-byte hash with its length a
 *                        constant), prefetch its bucket;
 *   key i + PIPE_BUCKET: read the bucket (arrived by now), prefetch the first node;
 *   key i + PIPE_SKIP:   if the first node carries another hash (the table runs at load
 *                        factor up to 1, so about a third of the hits are not first in
 *                        their chain), step to the next node and prefetch it;
 *   key i:               walk the rest of the chain and compare keys.
 * Stages only read the index: hits (recency mark, reference) are applied in key order by the
 * caller, so a prefix lookup has no effect past its first miss. Tried and measured worse
 * (bench/query_cpu, A/B interleaved): prefetching only a first node's first line until its
 * 32 hash bits matched (saves a line for a non-matching first node, but the key's own
 * second line then arrives late). */
#define PIPE        64 /* ring of keys in flight (a power of two > PIPE_HASH) */
#define PIPE_HASH   40
#define PIPE_BUCKET 24
#define PIPE_SKIP   12

/* The keys a pipeline looks up: built keys, or the raw hashes of one namespace (a
 * QueryPrefetch's request bytes: no key is built for a hit). */
struct pipe {
    const struct pf_block_key *keys; /* NULL: raw[i] in namespace ns */
    const struct pf_bytes *raw;
    uint32_t ns;
    size_t n;
    uint64_t h[PIPE];
    struct pf_hnode *at[PIPE];
};

static inline __attribute__((always_inline)) bool pipe_eq(const struct pipe *p,
                                                          const struct pf_block *b, size_t i)
{
    if (p->keys)
        return pf_block_key_eq(b, &p->keys[i]);
    return pf_block_hash_eq(b, p->ns, p->raw[i].data, p->raw[i].len);
}

/* A block's lookup fields are its first 56 bytes; records are 16-byte aligned, so they may
 * straddle two cache lines: fetch both. */
static inline void prefetch_block(const struct pf_hnode *x)
{
    __builtin_prefetch(x);
    __builtin_prefetch((const char *)x + 55);
}

static inline void stage_hash(const struct pf_cache *c, struct pipe *p, size_t i)
{
    uint64_t h;
    if (p->keys)
        h = pf_key_hash(&p->keys[i]);
    else if (p->raw[i].len == 32) /* pf_hash_of inlined, vLLM's sha256 length a constant */
        h = XXH3_64bits_withSeed(p->raw[i].data, 32, p->ns);
    else
        h = XXH3_64bits_withSeed(p->raw[i].data, p->raw[i].len, p->ns);
    p->h[i % PIPE] = h;
    __builtin_prefetch(&c->index.buckets[h & c->index.mask]);
}

static inline void stage_bucket(const struct pf_cache *c, struct pipe *p, size_t i)
{
    struct pf_hnode *x = c->index.buckets[p->h[i % PIPE] & c->index.mask];
    p->at[i % PIPE] = x;
    if (x)
        prefetch_block(x);
}

static inline void stage_skip(struct pipe *p, size_t i)
{
    struct pf_hnode *x = p->at[i % PIPE];
    if (x && x->hash != (uint32_t)p->h[i % PIPE]) { /* nodes keep 32 bits of the hash */
        x = x->next;
        p->at[i % PIPE] = x;
        if (x)
            prefetch_block(x);
    }
}

/* Fills the pipeline for p's n keys; the index must be non-empty (buckets allocated). */
static void pipe_start(const struct pf_cache *c, struct pipe *p)
{
    size_t n = p->n;
    for (size_t i = 0; i < n && i < PIPE_HASH; i++)
        stage_hash(c, p, i);
    for (size_t i = 0; i < n && i < PIPE_BUCKET; i++)
        stage_bucket(c, p, i);
    for (size_t i = 0; i < n && i < PIPE_SKIP; i++)
        stage_skip(p, i);
}

/* The block of key i or NULL; advances the later keys' stages. Call for i = 0, 1, ... */
static inline __attribute__((always_inline)) struct pf_block *pipe_find(const struct pf_cache *c,
                                                                        struct pipe *p, size_t i)
{
    if (i + PIPE_HASH < p->n)
        stage_hash(c, p, i + PIPE_HASH);
    if (i + PIPE_BUCKET < p->n)
        stage_bucket(c, p, i + PIPE_BUCKET);
    if (i + PIPE_SKIP < p->n)
        stage_skip(p, i + PIPE_SKIP);
    uint32_t h = (uint32_t)p->h[i % PIPE];
    for (struct pf_hnode *x = p->at[i % PIPE]; x; x = x->next) {
        struct pf_block *b = pf_container_of(x, struct pf_block, hnode);
        if (x->hash == h && pipe_eq(p, b, i))
            return b;
    }
    return NULL;
}

void pf_cache_destroy(struct pf_cache *c)
{
    if (!c)
        return;
    struct pf_block **all = NULL;
    size_t n = pf_cache_remove_all(c, &all);
    for (size_t i = 0; i < n; i++)
        pf_block_put(all[i]);
    free(all);
    pf_htable_destroy(&c->index);
    pf_tinylfu_destroy(c->lfu);
    pthread_mutex_destroy(&c->mu);
    free(c->ns_bytes);
    free(c);
}

/* What a prefix lookup takes on each hit. */
enum take {
    TAKE_NOTHING, /* membership (recency marks only) */
    TAKE_REF,     /* a strong reference each */
    TAKE_PIN,     /* a lease pin each */
};

/* The longest run of hits from p's first key (pf_cache_prefix / _pin / _pin_hashes; inlined
 * into each, so the key form and what is taken are constants there). */
static inline __attribute__((always_inline)) size_t prefix(struct pf_cache *c, struct pipe *p,
                                                           struct pf_block **out, enum take take)
{
    size_t i = 0;
    pthread_mutex_lock(&c->mu);
    if (c->index.count == 0 || p->n == 0)
        goto out;
    pipe_start(c, p);
    for (; i < p->n; i++) {
        struct pf_block *b = pipe_find(c, p, i);
        if (!b || (take == TAKE_PIN && b->pins == PF_CACHE_PIN_MAX))
            break; /* a hit that cannot be pinned ends the prefix like a miss */
        hit(c, b, p->h[i % PIPE]);
        if (take == TAKE_PIN)
            b->pins++; /* a plain add on the line the comparison loaded: no locked insn */
        if (take != TAKE_NOTHING)
            out[i] = b;
    }
    /* references after the lookups: a locked increment waits for every load before it, so
     * inside the pipeline each one would stall on the next keys' pending loads */
    for (size_t j = 0; take == TAKE_REF && j < i; j++)
        pf_block_get(out[j]);
out:
    pthread_mutex_unlock(&c->mu);
    return i;
}

size_t pf_cache_prefix(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                       struct pf_block **out)
{
    struct pipe p = {.keys = keys, .n = n};
    return prefix(c, &p, out, out ? TAKE_REF : TAKE_NOTHING);
}

size_t pf_cache_prefix_pin(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                           struct pf_block **out)
{
    struct pipe p = {.keys = keys, .n = n};
    return prefix(c, &p, out, TAKE_PIN);
}

size_t pf_cache_prefix_pin_hashes(struct pf_cache *c, uint32_t ns, const struct pf_bytes *hashes,
                                  size_t n, struct pf_block **out)
{
    struct pipe p = {.raw = hashes, .ns = ns, .n = n};
    return prefix(c, &p, out, TAKE_PIN);
}

/* Drops one pin of b (cache lock); returns b when the pins' own reference must be put. */
static struct pf_block *unpin_locked(struct pf_block *b)
{
    assert(b->pins > 0);
    if (--b->pins == 0 && b->pinref) {
        b->pinref = 0;
        return b;
    }
    return NULL;
}

/* Puts the references unpin_locked handed back (outside the lock: a put may free). */
static void put_released(struct pf_block **rel, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pf_block_put(rel[i]);
}

#define UNPIN_BATCH 256

/* Drops one pin of each block, taking a strong reference for the caller first when to_refs
 * (never a moment unowned). At most UNPIN_BATCH blocks a lock hold: every one may hand back
 * the pins' reference, put outside the lock. */
static void unpin(struct pf_cache *c, struct pf_block *const *blocks, size_t n, bool to_refs)
{
    struct pf_block *rel[UNPIN_BATCH];
    for (size_t done = 0; done < n;) {
        size_t nrel = 0;
        pthread_mutex_lock(&c->mu);
        size_t end = n - done < UNPIN_BATCH ? n : done + UNPIN_BATCH;
        for (; done < end; done++) {
            if (to_refs)
                pf_block_get(blocks[done]);
            struct pf_block *r = unpin_locked(blocks[done]);
            if (r)
                rel[nrel++] = r;
        }
        pthread_mutex_unlock(&c->mu);
        put_released(rel, nrel);
    }
}

void pf_cache_unpin(struct pf_cache *c, struct pf_block *const *blocks, size_t n)
{
    unpin(c, blocks, n, false);
}

void pf_cache_pins_to_refs(struct pf_cache *c, struct pf_block *const *blocks, size_t n)
{
    unpin(c, blocks, n, true);
}

size_t pf_cache_pins(struct pf_cache *c, const struct pf_block *b)
{
    pthread_mutex_lock(&c->mu);
    size_t v = b->pins;
    pthread_mutex_unlock(&c->mu);
    return v;
}

size_t pf_cache_lookup_each(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                            struct pf_block **out)
{
    struct pipe p = {.keys = keys, .n = n};
    size_t hits = 0;
    pthread_mutex_lock(&c->mu);
    if (c->index.count == 0) {
        for (size_t i = 0; i < n; i++)
            out[i] = NULL;
        goto out;
    }
    pipe_start(c, &p);
    for (size_t i = 0; i < n; i++) {
        struct pf_block *b = pipe_find(c, &p, i);
        if (b) {
            hit(c, b, p.h[i % PIPE]);
            hits++;
        }
        out[i] = b;
    }
    for (size_t i = 0; i < n; i++) /* after the lookups, as in pf_cache_prefix */
        if (out[i])
            pf_block_get(out[i]);
out:
    pthread_mutex_unlock(&c->mu);
    return hits;
}

/* Keys per lock hold of the batched calls (pf_cache_contains_each, pf_cache_insert_each):
 * a few tens of microseconds, so a query or the insert thread waits at most that long
 * behind a Save's thousands of keys. */
#define EACH_CHUNK 512

size_t pf_cache_contains_each(struct pf_cache *c, const struct pf_block_key *keys, size_t n,
                              bool *out)
{
    size_t hits = 0;
    for (size_t base = 0; base < n; base += EACH_CHUNK) {
        struct pipe p = {.keys = keys + base, .n = n - base < EACH_CHUNK ? n - base : EACH_CHUNK};
        pthread_mutex_lock(&c->mu);
        if (c->index.count == 0) {
            pthread_mutex_unlock(&c->mu);
            for (size_t i = base; i < n; i++)
                out[i] = false;
            break;
        }
        pipe_start(c, &p);
        for (size_t i = 0; i < p.n; i++) {
            out[base + i] = pipe_find(c, &p, i) != NULL;
            hits += out[base + i];
        }
        pthread_mutex_unlock(&c->mu);
    }
    return hits;
}

bool pf_cache_contains(struct pf_cache *c, const struct pf_block_key *key)
{
    uint64_t h = pf_key_hash(key);
    pthread_mutex_lock(&c->mu);
    bool r = find(c, key, h) != NULL;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* The block eviction would pick next (reclaimable tail, else retained tail). */
static struct pf_block *victim(struct pf_cache *c)
{
    struct pf_block *v = pf_list_last(&c->cls[PF_CLASS_RECLAIMABLE], struct pf_block, lru);
    return v ? v : pf_list_last(&c->cls[PF_CLASS_RETAINED], struct pf_block, lru);
}

/* pf_cache_insert under the lock, for b with key hash h; the caller publishes the gauges
 * and counts the insertions (once per call, not per block). */
static int insert_locked(struct pf_cache *c, struct pf_block *b, uint64_t h,
                         enum pf_block_class cls, uint64_t now)
{
    struct pf_block_key key = pf_block_key(b);
    struct pf_block *old = find(c, &key, h);
    if (old) {
        hit(c, old, h);
        return 0;
    }
    if (c->lfu) {
        pf_tinylfu_touch(c->lfu, h);
        struct pf_block *v = victim(c);
        if (v &&
            pf_tinylfu_estimate(c->lfu, h) < pf_tinylfu_estimate(c->lfu, pf_block_key_hash(v))) {
            pf_metric_add(c->m_rejects, 1);
            return -EACCES;
        }
    }
    if (ns_reserve(c, pf_block_ns(b)) != 0)
        return -ENOMEM;
    uint64_t footprint = pf_block_footprint(b);
    c->ns_bytes[pf_block_ns(b)] += footprint;
    pf_block_get(b);
    b->cls = (uint8_t)cls;
    b->resident = 1;
    pf_block_stamp(b, now);
    pf_htable_insert(&c->index, &b->hnode, h);
    pf_list_add(&c->cls[cls], &b->lru);
    c->nblocks[cls]++;
    c->nbytes[cls] += footprint;
    return 1;
}

int pf_cache_insert(struct pf_cache *c, struct pf_block *b, enum pf_block_class cls)
{
    uint64_t h = pf_block_key_hash(b), now = pf_now_ns();
    pthread_mutex_lock(&c->mu);
    int rc = insert_locked(c, b, h, cls, now);
    if (rc == 1) {
        pf_metric_add(c->m_inserts, 1);
        publish(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* How far ahead the batched insert hashes a block and prefetches its bucket (stage one),
 * and reads the bucket and prefetches its first node (stage two). The chain is walked
 * again at the block's turn (earlier inserts may have changed it or grown the table):
 * the stages are hints only. */
#define INS_RING   32 /* a power of two > INS_HASH */
#define INS_HASH   16
#define INS_BUCKET 8

static inline void ins_hash(const struct pf_cache *c, struct pf_block *const *bl, uint64_t *hs,
                            size_t i)
{
    hs[i % INS_RING] = pf_block_key_hash(bl[i]);
    if (c->index.buckets)
        __builtin_prefetch(&c->index.buckets[hs[i % INS_RING] & c->index.mask]);
}

static inline void ins_bucket(const struct pf_cache *c, const uint64_t *hs, size_t i)
{
    if (!c->index.buckets)
        return;
    struct pf_hnode *x = c->index.buckets[hs[i % INS_RING] & c->index.mask];
    if (x)
        prefetch_block(x);
}

size_t pf_cache_insert_each(struct pf_cache *c, struct pf_block *const *blocks, size_t n,
                            enum pf_block_class cls, int *rc)
{
    uint64_t now = pf_now_ns(), hs[INS_RING];
    size_t inserted = 0;
    for (size_t base = 0; base < n; base += EACH_CHUNK) {
        size_t m = n - base < EACH_CHUNK ? n - base : EACH_CHUNK, got = 0;
        struct pf_block *const *bl = blocks + base;
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < m && i < INS_HASH; i++)
            ins_hash(c, bl, hs, i);
        for (size_t i = 0; i < m && i < INS_BUCKET; i++)
            ins_bucket(c, hs, i);
        for (size_t i = 0; i < m; i++) {
            if (i + INS_HASH < m)
                ins_hash(c, bl, hs, i + INS_HASH);
            if (i + INS_BUCKET < m)
                ins_bucket(c, hs, i + INS_BUCKET);
            int r = insert_locked(c, bl[i], hs[i % INS_RING], cls, now);
            got += r == 1;
            if (rc)
                rc[base + i] = r;
        }
        if (got) {
            pf_metric_add(c->m_inserts, (double)got);
            publish(c);
        }
        pthread_mutex_unlock(&c->mu);
        inserted += got;
    }
    return inserted;
}

static bool ns_in(uint32_t ns, const uint32_t *set, size_t nset)
{
    for (size_t i = 0; i < nset; i++)
        if (set[i] == ns)
            return true;
    return false;
}

/* set == NULL: every namespace; else only blocks whose namespace is in set[0..nset). */
static size_t evict(struct pf_cache *c, size_t max, struct pf_block **out, size_t *skipped_p,
                    bool spare_queued, const uint32_t *set, size_t nset)
{
    size_t n = 0, skipped = 0;
    pthread_mutex_lock(&c->mu);
    static const int order[2] = {PF_CLASS_RECLAIMABLE, PF_CLASS_RETAINED};
    for (int oi = 0; oi < 2 && n < max; oi++) {
        struct pf_list *l = &c->cls[order[oi]];
        /* examine each block of this class at most once, from the old end; blocks moved to
         * the recent end are reached again last */
        uint64_t budget = c->nblocks[order[oi]];
        struct pf_list *pos = l->prev;
        while (n < max && budget-- > 0 && pos != l) {
            struct pf_block *b = pf_list_entry(pos, struct pf_block, lru);
            struct pf_list *prev = pos->prev;
            if (set && !ns_in(pf_block_ns(b), set, nset)) {
                pos = prev; /* another namespace's block: untouched, keeps its place */
                continue;
            }
            if (b->accessed) {
                b->accessed = 0; /* recently hit: second chance */
                pf_list_move(l, &b->lru);
                budget++; /* examined again after its mark is gone */
                pos = prev == l ? l->prev : prev;
                continue;
            }
            if (pf_block_strong(b) > 1 || b->pins) {
                pf_list_move(l, &b->lru); /* referenced or leased: keep it, look further */
                skipped++;
                pos = prev == l ? l->prev : prev;
                continue;
            }
            if (spare_queued && pf_block_weak(b) > 1) {
                pos = prev; /* waits for its SSD write: passed over, keeps its place */
                continue;
            }
            unlink_block(c, b);
            out[n++] = b;
            pos = prev;
        }
    }
    if (n)
        publish(c);
    pthread_mutex_unlock(&c->mu);
    if (skipped_p)
        *skipped_p = skipped;
    return n;
}

size_t pf_cache_evict(struct pf_cache *c, size_t max, struct pf_block **out, size_t *skipped_p)
{
    return evict(c, max, out, skipped_p, false, NULL, 0);
}

size_t pf_cache_evict_sparing(struct pf_cache *c, size_t max, struct pf_block **out,
                              size_t *skipped_p)
{
    return evict(c, max, out, skipped_p, true, NULL, 0);
}

size_t pf_cache_evict_ns(struct pf_cache *c, const uint32_t *ns, size_t nns, size_t max,
                         struct pf_block **out, size_t *skipped_p)
{
    if (nns == 0) {
        if (skipped_p)
            *skipped_p = 0;
        return 0;
    }
    return evict(c, max, out, skipped_p, false, ns, nns);
}

uint64_t pf_cache_ns_bytes(struct pf_cache *c, uint32_t ns)
{
    pthread_mutex_lock(&c->mu);
    uint64_t v = ns < c->ns_cap ? c->ns_bytes[ns] : 0;
    pthread_mutex_unlock(&c->mu);
    return v;
}

size_t pf_cache_remove_all(struct pf_cache *c, struct pf_block ***out_p)
{
    pthread_mutex_lock(&c->mu);
    size_t total = c->nblocks[0] + c->nblocks[1];
    struct pf_block **arr = total ? malloc(total * sizeof(*arr)) : NULL;
    size_t n = 0;
    if (arr) {
        for (int k = 0; k < 2; k++) {
            while (!pf_list_empty(&c->cls[k])) {
                struct pf_block *b = pf_list_last(&c->cls[k], struct pf_block, lru);
                unlink_block(c, b);
                arr[n++] = b;
            }
        }
        publish(c);
    }
    pthread_mutex_unlock(&c->mu);
    *out_p = arr;
    return n;
}

size_t pf_cache_mark_reclaimable(struct pf_cache *c, const struct pf_block_key *keys, size_t n)
{
    size_t moved = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        struct pf_block *b = find(c, &keys[i], pf_key_hash(&keys[i]));
        if (!b || b->cls == PF_CLASS_RECLAIMABLE)
            continue;
        uint64_t footprint = pf_block_footprint(b);
        pf_list_del(&b->lru);
        c->nblocks[b->cls]--;
        c->nbytes[b->cls] -= footprint;
        b->cls = PF_CLASS_RECLAIMABLE;
        pf_list_add(&c->cls[b->cls], &b->lru);
        c->nblocks[b->cls]++;
        c->nbytes[b->cls] += footprint;
        moved++;
    }
    if (moved)
        publish(c);
    pthread_mutex_unlock(&c->mu);
    return moved;
}

void pf_cache_stats(struct pf_cache *c, struct pf_cache_stats *s)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < 2; i++) {
        s->blocks[i] = c->nblocks[i];
        s->bytes[i] = c->nbytes[i];
    }
    pthread_mutex_unlock(&c->mu);
}

void pf_cache_for_each(struct pf_cache *c, void (*fn)(void *ctx, const struct pf_block *b),
                       void *ctx)
{
    pthread_mutex_lock(&c->mu);
    for (int k = 0; k < 2; k++) {
        struct pf_list *pos, *tmp;
        pf_list_for_each_safe(pos, tmp, &c->cls[k])
            fn(ctx, pf_list_entry(pos, struct pf_block, lru));
    }
    pthread_mutex_unlock(&c->mu);
}

/* The insert thread: assembles saved slots into blocks and publishes sealed blocks.
 *
 * Save handlers post one batch per Save call (key, slot index, slot memory). This single
 * thread owns the in-flight map (key -> partially filled block). A block becomes visible
 * only when every slot of it has arrived; a slot the Save handler has not checksummed (it
 * checksums slots chunk by chunk while they are copied) is checksummed here; the block is
 * then inserted into the RAM cache as retained and handed to the sealed-block hooks
 * (MetaServer advertisement, SSD write). Slots for keys already resident and slots already
 * filled (late duplicates, replicas) are dropped. In-flight blocks older than the in-flight
 * TTL (5 min) are garbage-collected. One-slot blocks arriving while nothing is in flight
 * are sealed at once, without in-flight records (the common cross-layer save), and a run
 * of them enters the cache in one batched insert. An in-flight block
 * keeps its slots in the wide form (struct pf_slot); sealing packs them into the compact block
 * record, sharing one allocation table among the blocks of a batch (pf_block_packer). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "insert"
#include "engine/engine_internal.h"
#include "pf/clock.h"
#include "pf/fault.h"
#include "pf/log.h"
#include "pf/slab.h"

struct pf_inflight {
    struct pf_hnode hnode;
    uint64_t created_ns;
    uint32_t remaining;
    uint16_t nslots;
    uint64_t bytes;
    struct pf_block_key key;
    struct pf_slot slots[]; /* filled as they arrive (ka != NULL) */
};

static void slot_release(struct pf_slot *s)
{
    pf_alloc_put(s->ka);
    pf_alloc_put(s->va);
    s->ka = s->va = NULL;
}

static struct pf_inflight *inflight_find(struct pf_engine *e, const struct pf_block_key *k,
                                         uint64_t h)
{
    struct pf_hnode *n;
    pf_htable_for_each_hash(&e->inflight, n, h)
    {
        struct pf_inflight *f = pf_container_of(n, struct pf_inflight, hnode);
        if (pf_key_eq(&f->key, k))
            return f;
    }
    return NULL;
}

static void inflight_drop(struct pf_engine *e, struct pf_inflight *f)
{
    pf_htable_remove(&e->inflight, &f->hnode);
    e->inflight_bytes -= f->bytes;
    for (uint16_t i = 0; i < f->nslots; i++)
        slot_release(&f->slots[i]);
    free(f);
}

/* Packs and publishes a block whose nslots slots all arrived (the slots' references go to
 * the block, or are released when it cannot be packed). Newly resident blocks are
 * collected (with a reference) for the sealed hooks. */
static void seal_slots(struct pf_engine *e, struct pf_block_packer *pk,
                       const struct pf_block_key *key, uint16_t nslots, struct pf_slot *slots,
                       struct pf_block **pub, size_t *npub)
{
    if (e->cfg.integrity) /* Save checksums its slots as they land; anything else here */
        for (uint16_t i = 0; i < nslots; i++)
            if (!slots[i].has_checksum) {
                slots[i].checksum = pf_slot_compute_checksum(&slots[i]);
                slots[i].has_checksum = 1;
            }
    struct pf_block *b;
    int rc = pf_block_pack(pk, key, nslots, slots, &b);
    if (rc) {
        pf_log_ratelimited(PF_LOG_ERROR, 10000, "cannot pack a sealed block: %s", strerror(-rc));
        for (uint16_t i = 0; i < nslots; i++)
            slot_release(&slots[i]);
        return;
    }
    rc = pf_cache_insert(e->cache, b, PF_CLASS_RETAINED);
    if (rc == 1 && pub) {
        pub[(*npub)++] = b; /* keep our reference for the hooks */
        return;
    }
    if (rc < 0)
        pf_debug("sealed block rejected by admission");
    pf_block_put(b);
}

/* A run of one-slot items with nothing in flight (not even under their keys in another
 * slot count): each packed into a block, then all inserted into the cache in one batched
 * pass (pf_cache_insert_each). A late duplicate of a resident block is packed and dropped
 * there, refreshing the resident one, as a sealed in-flight block's would be. blocks and rcs
 * have room for n. */
static void seal_run(struct pf_engine *e, struct pf_block_packer *pk, struct pf_insert_item *items,
                     size_t n, struct pf_block **blocks, int *rcs, struct pf_block **pub,
                     size_t *npub)
{
    size_t nb = 0;
    for (size_t i = 0; i < n; i++) {
        struct pf_slot *s = &items[i].s;
        if (e->cfg.integrity && !s->has_checksum) {
            s->checksum = pf_slot_compute_checksum(s);
            s->has_checksum = 1;
        }
        int rc = pf_block_pack(pk, &items[i].key, 1, s, &blocks[nb]);
        if (rc) {
            pf_log_ratelimited(PF_LOG_ERROR, 10000, "cannot pack a sealed block: %s",
                               strerror(-rc));
            slot_release(s);
            continue;
        }
        nb++;
    }
    pf_cache_insert_each(e->cache, blocks, nb, PF_CLASS_RETAINED, rcs);
    for (size_t i = 0; i < nb; i++) {
        if (rcs[i] == 1 && pub) {
            pub[(*npub)++] = blocks[i]; /* keep our reference for the hooks */
            continue;
        }
        if (rcs[i] < 0)
            pf_debug("sealed block rejected by admission");
        pf_block_put(blocks[i]);
    }
}

static bool one_slot_now(const struct pf_engine *e, const struct pf_insert_item *it)
{
    return it->nslots == 1 && it->slot == 0 && e->inflight.count == 0;
}

/* seal_slots for a completed in-flight block; frees f. */
static void seal(struct pf_engine *e, struct pf_block_packer *pk, struct pf_inflight *f,
                 struct pf_block **pub, size_t *npub)
{
    seal_slots(e, pk, &f->key, f->nslots, f->slots, pub, npub);
    free(f);
}

static void handle_items(struct pf_engine *e, struct pf_insert_batch *bt)
{
    uint64_t now = pf_now_ns();
    struct pf_block **pub = e->nhooks ? malloc(bt->n * sizeof(*pub)) : NULL;
    size_t npub = 0;
    struct pf_block_packer pk = {0};
    struct pf_block **run = malloc(bt->n * sizeof(*run));
    int *rcs = malloc(bt->n * sizeof(*rcs));
    for (size_t i = 0; i < bt->n; i++) {
        struct pf_insert_item *it = &bt->items[i];
        if (one_slot_now(e, it)) {
            /* one-slot blocks with nothing in flight (no partial block of another slot
             * count under their keys either): sealed at once, without in-flight records */
            if (!run || !rcs) { /* no room for the batch: one by one */
                if (pf_cache_contains(e->cache, &it->key))
                    slot_release(&it->s); /* late duplicate of a resident block */
                else
                    seal_slots(e, &pk, &it->key, 1, &it->s, pub, &npub);
                continue;
            }
            size_t j = i + 1; /* a run adds nothing in flight: the condition holds along it */
            while (j < bt->n && one_slot_now(e, &bt->items[j]))
                j++;
            seal_run(e, &pk, it, j - i, run, rcs, pub, &npub);
            i = j - 1;
            continue;
        }
        uint64_t h = pf_key_hash(&it->key);
        struct pf_inflight *f = inflight_find(e, &it->key, h);
        /* only a slot that would start a block asks the cache (one lock and hash per block,
         * not per slot); a key that became resident while its block was in flight is
         * dropped when that block seals (the cache keeps the resident one) */
        if (!f && pf_cache_contains(e->cache, &it->key)) {
            slot_release(&it->s); /* late duplicate of a resident block */
            continue;
        }
        if (!f) {
            f = calloc(1, sizeof(*f) + (size_t)it->nslots * sizeof(f->slots[0]));
            if (!f) {
                slot_release(&it->s);
                pf_log_ratelimited(PF_LOG_ERROR, 10000, "out of memory assembling a block");
                continue;
            }
            f->key = it->key;
            f->nslots = it->nslots;
            f->created_ns = now;
            f->remaining = it->nslots;
            pf_htable_insert(&e->inflight, &f->hnode, h);
        } else if (f->nslots != it->nslots) {
            pf_log_ratelimited(PF_LOG_WARN, 10000,
                               "slot count mismatch for an in-flight block (%u vs %u): the "
                               "namespace is shared by incompatible KV layouts; dropping",
                               f->nslots, it->nslots);
            slot_release(&it->s);
            continue;
        }
        struct pf_slot *dst = &f->slots[it->slot];
        if (dst->ka) {
            slot_release(&it->s); /* already filled (replica or duplicate save) */
            continue;
        }
        *dst = it->s;
        uint64_t bytes = (uint64_t)it->s.seg_stride * it->s.nseg;
        f->bytes += bytes;
        e->inflight_bytes += bytes;
        if (--f->remaining == 0) {
            e->inflight_bytes -= f->bytes;
            pf_htable_remove(&e->inflight, &f->hnode);
            seal(e, &pk, f, pub, &npub);
        }
    }
    pf_block_packer_done(&pk);
    free(run);
    free(rcs);
    pf_metric_set(e->m_inflight_bytes, (double)e->inflight_bytes);
    if (npub) {
        pf_engine_run_sealed_hooks(e, pub, npub);
        for (size_t i = 0; i < npub; i++)
            pf_block_put(pub[i]);
    }
    free(pub);
}

static void gc(struct pf_engine *e)
{
    uint64_t now = pf_now_ns(), ttl = e->cfg.inflight_ttl_ns;
    size_t dropped = 0;
    for (size_t b = 0; e->inflight.buckets && b <= e->inflight.mask; b++) {
        struct pf_hnode *n = e->inflight.buckets[b];
        while (n) {
            struct pf_hnode *next = n->next;
            struct pf_inflight *f = pf_container_of(n, struct pf_inflight, hnode);
            if (now - f->created_ns >= ttl) {
                inflight_drop(e, f);
                dropped++;
            }
            n = next;
        }
    }
    if (dropped) {
        pf_metric_add(e->m_inflight_gc, (double)dropped);
        pf_metric_set(e->m_inflight_bytes, (double)e->inflight_bytes);
        pf_info("dropped %zu unsealed block(s) older than %llu s", dropped,
                (unsigned long long)(ttl / PF_NS_PER_SEC));
    }
}

static void barrier_put(struct pf_insert_barrier *br)
{
    if (atomic_fetch_sub(&br->refs, 1) == 1) {
        pthread_mutex_destroy(&br->mu);
        pthread_cond_destroy(&br->cv);
        free(br);
    }
}

static void *insert_main(void *arg)
{
    struct pf_engine *e = arg;
    uint64_t last_gc = pf_now_ns();
    for (;;) {
        void *item;
        int rc = pf_queue_pop(&e->insert_q, &item, 1000);
        if (rc == -ESHUTDOWN)
            break;
        if (rc == 0) {
            struct pf_insert_batch *b = item;
            if (b->kind == 1) {
                struct pf_insert_barrier *br = b->barrier;
                pthread_mutex_lock(&br->mu);
                br->done = true;
                pthread_cond_broadcast(&br->cv);
                pthread_mutex_unlock(&br->mu);
                barrier_put(br);
            } else {
                struct pf_fault_hit hit;
                if (pf_fault_check(e->cfg.faults, "engine.seal", &hit) && hit.delay_ms)
                    pf_sleep_ms(hit.delay_ms);
                handle_items(e, b);
            }
            pf_insert_batch_free(b);
        }
        uint64_t now = pf_now_ns();
        if (now - last_gc >= PF_MIN_OF(e->cfg.inflight_ttl_ns / 4, 10 * PF_NS_PER_SEC)) {
            gc(e);
            last_gc = now;
        }
    }
    /* shutdown: drop everything still in flight */
    for (size_t b = 0; e->inflight.buckets && b <= e->inflight.mask; b++) {
        struct pf_hnode *n = e->inflight.buckets[b];
        while (n) {
            struct pf_hnode *next = n->next;
            inflight_drop(e, pf_container_of(n, struct pf_inflight, hnode));
            n = next;
        }
    }
    return NULL;
}

int pf_insert_start(struct pf_engine *e)
{
    int rc = pf_queue_init(&e->insert_q, 0);
    if (rc)
        return rc;
    rc = pf_htable_init(&e->inflight, 1024);
    if (rc)
        goto err_q;
    rc = pf_thread_start(&e->insert_thr, "pegaflow-insert", -1, insert_main, e);
    if (rc)
        goto err_ht;
    return 0;
err_ht:
    pf_htable_destroy(&e->inflight);
err_q:
    pf_queue_destroy(&e->insert_q);
    return rc;
}

void pf_insert_stop(struct pf_engine *e)
{
    pf_queue_close(&e->insert_q);
    pthread_join(e->insert_thr, NULL);
    /* batches left in the queue after close were drained by the thread before exit */
    pf_htable_destroy(&e->inflight);
    pf_queue_destroy(&e->insert_q);
}

static size_t batch_bytes(size_t cap)
{
    return sizeof(struct pf_insert_batch) + cap * sizeof(struct pf_insert_item);
}

struct pf_insert_batch *pf_insert_batch_new(size_t cap)
{
    if (cap > (SIZE_MAX - sizeof(struct pf_insert_batch)) / sizeof(struct pf_insert_item))
        return NULL;
    struct pf_insert_batch *b = pf_big_calloc(1, batch_bytes(cap));
    if (b)
        b->cap = cap;
    return b;
}

void pf_insert_batch_free(struct pf_insert_batch *b)
{
    if (b)
        pf_big_free(b, 1, batch_bytes(b->cap));
}

int pf_insert_post(struct pf_engine *e, struct pf_insert_batch *b)
{
    int rc = pf_queue_push(&e->insert_q, b);
    if (rc) {
        for (size_t i = 0; i < b->n; i++)
            slot_release(&b->items[i].s);
        pf_insert_batch_free(b);
    }
    return rc;
}

int pf_engine_flush(struct pf_engine *e, uint64_t timeout_ms)
{
    struct pf_insert_barrier *br = calloc(1, sizeof(*br));
    struct pf_insert_batch *b = pf_insert_batch_new(0);
    if (!br || !b) {
        free(br);
        pf_insert_batch_free(b);
        return -ENOMEM;
    }
    pthread_mutex_init(&br->mu, NULL);
    pf_cond_init(&br->cv);
    atomic_init(&br->refs, 2);
    b->kind = 1;
    b->barrier = br;
    int rc = pf_queue_push(&e->insert_q, b);
    if (rc) {
        pf_insert_batch_free(b);
        atomic_fetch_sub(&br->refs, 1);
        barrier_put(br);
        return rc;
    }
    struct timespec dl = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&br->mu);
    while (!br->done && rc == 0)
        if (pthread_cond_timedwait(&br->cv, &br->mu, &dl) == ETIMEDOUT && !br->done)
            rc = -ETIMEDOUT;
    pthread_mutex_unlock(&br->mu);
    barrier_put(br);
    return rc;
}

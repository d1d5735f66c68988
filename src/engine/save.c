/* Save (reference §2.2, §3.3, §3.5): validate, drop blocks already resident, allocate pinned
 * memory (layer-first: one allocation per layer per segment for the whole call, or one per
 * block with --blockwise-alloc; page-first: one page per block holding every layer of the
 * worker's shard), run the D2H copies on the device's save thread and wait for them (with
 * integrity on: in chunks, each chunk's slots checksummed here while the next one copies),
 * then hand the slots to the insert thread, which seals blocks when all their slots arrived.
 * Keys carry the layer's storage group (pf_group_key) and every slot its group's slot count,
 * so each storage group seals against its own slots. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define PF_LOG_MOD "save"
#include "engine/engine_internal.h"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/log.h"

struct save_ctx {
    struct pf_alloc **allocs;
    size_t nallocs;
};

static void save_free(struct pf_xfer *x)
{
    struct save_ctx *c = x->ctx;
    if (!c)
        return;
    for (size_t i = 0; i < c->nallocs; i++)
        pf_alloc_put(c->allocs[i]);
    free(c->allocs);
    free(c);
}

static void chunk_free(struct pf_xfer *c)
{
    pf_xfer_put(c->ctx); /* the whole save's transfer, owner of the allocations */
}

static void checksum_items(struct pf_insert_batch *b, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        b->items[i].s.checksum = pf_slot_compute_checksum(&b->items[i].s);
        b->items[i].s.has_checksum = 1;
    }
}

/* Integrity on, layer-first: one batch copied and hashed in one pass by the backend (item
 * i's nseg descriptors form one hash run: k then v, as pf_slot_compute_checksum hashes
 * them). Returns 0 with every item's checksum written (hashed here when the backend has
 * no fused copy: then the copy ran as a plain copy_batch), or the first error. join and sums
 * belong to x from here on (pf_xfer_put frees them: a copy that outlives a timed-out wait
 * may still write sums). */
static int save_copy_hashed(struct pf_engine *e, struct pf_worker *w, struct pf_xfer *x,
                            struct pf_insert_batch *b, bool *queued_p)
{
    *queued_p = false;
    uint8_t *join = malloc(x->n ? x->n : 1);
    uint64_t *sums = malloc((x->n ? x->n : 1) * sizeof(*sums));
    if (!join || !sums) {
        free(join);
        free(sums);
        return -ENOMEM;
    }
    size_t d = 0;
    for (size_t i = 0; i < b->n; i++)
        for (uint8_t g = 0; g < b->items[i].s.nseg; g++)
            join[d++] = g != 0;
    x->hjoin = join;
    x->hsums = sums;
    int rc = pf_gpu_worker_submit(w->gw, x);
    if (rc)
        return rc;
    *queued_p = true;
    rc = pf_xfer_wait(x, e->cfg.copy_timeout_ms);
    if (rc)
        return rc;
    if (!x->hashed) {
        checksum_items(b, 0, b->n);
        return 0;
    }
    d = 0;
    for (size_t i = 0; i < b->n; i++) {
        d += b->items[i].s.nseg;
        b->items[i].s.checksum = sums[d - 1];
        b->items[i].s.has_checksum = 1;
    }
    return 0;
}

/* Runs x's copies on the device's save thread and waits; with integrity on, also writes each
 * item's checksum (pipelined by chunk). Each chunk holds a reference to x, so x's
 * allocations outlive every chunk, also one that never completes. *queued_p is false when
 * nothing could be queued. Returns 0 or the first chunk's error. */
static int save_copy(struct pf_engine *e, struct pf_worker *w, struct pf_xfer *x,
                     struct pf_insert_batch *b, bool *queued_p)
{
    *queued_p = true;
    int rc;
    /* chunks are cut at item boundaries: only when item i owns exactly its nseg descriptors,
     * in order (layer-first saves; a page-first page has one descriptor per layer) */
    size_t per_item = 0;
    for (size_t i = 0; i < b->n; i++)
        per_item += b->items[i].s.nseg;
    if (e->cfg.integrity && per_item == x->n && pf_gpu_worker_can_hash(w->gw))
        return save_copy_hashed(e, w, x, b, queued_p);
    if (!e->cfg.integrity || x->bytes <= e->cfg.save_chunk_bytes || per_item != x->n) {
        rc = pf_gpu_worker_submit(w->gw, x);
        if (rc) {
            *queued_p = false;
            return rc;
        }
        rc = pf_xfer_wait(x, e->cfg.copy_timeout_ms);
        if (rc == 0 && e->cfg.integrity)
            checksum_items(b, 0, b->n);
        return rc;
    }
    struct pf_xfer **ch = calloc(b->n, sizeof(*ch));
    size_t *end = calloc(b->n, sizeof(*end));
    if (!ch || !end) {
        free(ch);
        free(end);
        *queued_p = false;
        return -ENOMEM;
    }
    size_t nch = 0, d = 0;
    rc = 0;
    for (size_t i = 0; i < b->n;) {
        size_t d0 = d;
        uint64_t bytes = 0;
        while (i < b->n && (bytes == 0 || bytes < e->cfg.save_chunk_bytes)) {
            for (uint8_t g = 0; g < b->items[i].s.nseg; g++)
                bytes += x->descs[d++].len;
            i++;
        }
        struct pf_xfer *c = pf_xfer_new(x->dir, x->mode, d - d0);
        if (!c) {
            rc = -ENOMEM;
            break;
        }
        memcpy(c->descs, x->descs + d0, (d - d0) * sizeof(*c->descs));
        c->n = d - d0;
        c->bytes = bytes;
        atomic_fetch_add(&x->refs, 1);
        c->ctx = x;
        c->free_fn = chunk_free;
        rc = pf_gpu_worker_submit(w->gw, c);
        if (rc) {
            pf_xfer_put(c);
            break;
        }
        ch[nch] = c;
        end[nch++] = i;
    }
    if (nch == 0)
        *queued_p = false;
    size_t from = 0;
    for (size_t k = 0; k < nch; k++) {
        if (rc == 0) {
            rc = pf_xfer_wait(ch[k], e->cfg.copy_timeout_ms);
            if (rc == 0)
                checksum_items(b, from, end[k]);
        }
        from = end[k];
        pf_xfer_put(ch[k]); /* a chunk still running keeps the worker's reference */
    }
    free(ch);
    free(end);
    return rc;
}

/* One layer's share of the save after dedup. */
struct plan {
    struct pf_layer_reg *l;
    int slot;
    uint32_t group;
    uint16_t nslots; /* slots of the blocks this layer saves into */
    size_t n;
    uint32_t *ids;
    struct pf_block_key *keys;
};

static void plans_free(struct plan *p, size_t n)
{
    for (size_t i = 0; p && i < n; i++) {
        free(p[i].ids);
        free(p[i].keys);
    }
    free(p);
}

static int validate(struct pf_engine *e, struct pf_instance *in, struct pf_worker *w,
                    uint32_t tp_rank, const struct pf_engine_save_layer *layers, size_t nlayers,
                    struct plan *plans, size_t *total_p, char *err, size_t errlen)
{
    size_t total = 0;
    if (nlayers > PF_ENGINE_MAX_LAYERS) {
        snprintf(err, errlen, "%zu layers in one save; the limit is %u", nlayers,
                 PF_ENGINE_MAX_LAYERS);
        return -E2BIG;
    }
    /* one flag per registered layer: duplicates found in one pass */
    bool *seen = calloc(w->nlayers ? w->nlayers : 1, sizeof(*seen));
    if (!seen)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < nlayers; i++) {
        const struct pf_engine_save_layer *L = &layers[i];
        if (!L->name || !*L->name) {
            snprintf(err, errlen, "save layer %zu has an empty name", i);
            rc = -EINVAL;
            goto out;
        }
        if (L->nids != L->nhashes) {
            snprintf(err, errlen, "layer %s: %zu block_ids but %zu block_hashes", L->name, L->nids,
                     L->nhashes);
            rc = -EINVAL;
            goto out;
        }
        struct pf_layer_reg *l = pf_worker_layer(w, L->name);
        if (!l) {
            snprintf(err, errlen, "layer %s is not registered on device %d of instance %s", L->name,
                     w->device_id, in->id);
            rc = -EINVAL;
            goto out;
        }
        if (seen[l - w->layers]) {
            snprintf(err, errlen, "layer %s appears twice in one save", L->name);
            rc = -EINVAL;
            goto out;
        }
        seen[l - w->layers] = true;
        plans[i].l = l;
        plans[i].group = in->topo[l->layer_id].group;
        plans[i].slot = (int)pf_instance_slot_of(in, l->layer_id, tp_rank);
        plans[i].nslots = (uint16_t)pf_instance_group_slots(in, plans[i].group);
        plans[i].ids = malloc((L->nids ? L->nids : 1) * sizeof(uint32_t));
        plans[i].keys = malloc((L->nids ? L->nids : 1) * sizeof(struct pf_block_key));
        if (!plans[i].ids || !plans[i].keys) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t j = 0; j < L->nids; j++) {
            if (L->block_ids[j] >= l->lay.num_blocks) {
                snprintf(err, errlen, "layer %s: block id %u out of range (num_blocks %llu)",
                         L->name, L->block_ids[j], (unsigned long long)l->lay.num_blocks);
                rc = -EINVAL;
                goto out;
            }
            if (pf_group_key(in->ns_id, L->hashes[j].data, L->hashes[j].len, plans[i].group,
                             &plans[i].keys[j]) != 0) {
                snprintf(err, errlen, "layer %s: block hash %zu has %zu bytes (1..%zu allowed)",
                         L->name, j, L->hashes[j].len, pf_group_hash_max(plans[i].group));
                rc = -EINVAL;
                goto out;
            }
            plans[i].ids[j] = L->block_ids[j];
        }
        plans[i].n = L->nids;
        total += L->nids;
    }
    *total_p = total;
out:
    free(seen);
    return rc;
}

/* Drops blocks whose key is already resident in the RAM cache (one batched lookup per
 * layer). Returns the blocks left, or -ENOMEM (as a negative ssize_t). */
static ssize_t dedup(struct pf_engine *e, struct plan *plans, size_t nplans)
{
    size_t left = 0, most = 0;
    for (size_t i = 0; i < nplans; i++)
        most = plans[i].n > most ? plans[i].n : most;
    bool *resident = malloc(most ? most : 1);
    if (!resident)
        return -ENOMEM;
    for (size_t i = 0; i < nplans; i++) {
        size_t k = 0;
        pf_cache_contains_each(e->cache, plans[i].keys, plans[i].n, resident);
        for (size_t j = 0; j < plans[i].n; j++) {
            if (resident[j])
                continue;
            plans[i].ids[k] = plans[i].ids[j];
            plans[i].keys[k] = plans[i].keys[j];
            k++;
        }
        plans[i].n = k;
        left += k;
    }
    free(resident);
    return (ssize_t)left;
}

/* A page-first save writes whole pages: every layer of the worker's shard, all with the
 * same block list (reference §3.2). */
static int check_pages(struct pf_worker *w, const struct pf_engine_save_layer *layers,
                       size_t nlayers, const struct plan *plans, char *err, size_t errlen)
{
    if (nlayers != w->nlayers) {
        const char *missing = "?";
        for (size_t k = 0; k < w->nlayers; k++) {
            bool named = false;
            for (size_t i = 0; i < nlayers && !named; i++)
                named = plans[i].l == &w->layers[k];
            if (!named) {
                missing = w->layers[k].name;
                break;
            }
        }
        snprintf(err, errlen,
                 "page_first: a save must cover all %zu layers of device %d's shard, got %zu "
                 "(layer %s is missing)",
                 w->nlayers, w->device_id, nlayers, missing);
        return -EINVAL;
    }
    for (size_t i = 1; i < nlayers; i++) {
        bool same = plans[i].n == plans[0].n;
        for (size_t j = 0; same && j < plans[0].n; j++)
            same = plans[i].ids[j] == plans[0].ids[j] &&
                   pf_key_eq(&plans[i].keys[j], &plans[0].keys[j]);
        if (!same) {
            snprintf(err, errlen,
                     "page_first: layer %s saves another block list than layer %s (every layer "
                     "of a page-first save needs the same block ids and hashes)",
                     layers[i].name, layers[0].name);
            return -EINVAL;
        }
    }
    return 0;
}

static int add_alloc(struct save_ctx *c, struct pf_alloc *a, size_t cap)
{
    if (c->nallocs == cap)
        return -ENOSPC;
    c->allocs[c->nallocs++] = a;
    return 0;
}

/* Page-first: one page allocation per block (reference §3.3) holding every layer of the
 * worker's shard at its offset; the padding between layers is zeroed so the slot checksum
 * covers defined bytes. */
static int build_pages(struct pf_engine *e, struct pf_instance *in, struct pf_worker *w,
                       const struct plan *plans, size_t nlayers, int numa, struct pf_xfer *x,
                       struct save_ctx *sc, size_t cap, struct pf_insert_batch *batch)
{
    uint64_t page = in->shard_bytes[w->shard];
    for (size_t j = 0; j < plans[0].n; j++) {
        struct pf_alloc *a;
        int rc = pf_engine_alloc(e, page, numa, &a);
        if (rc == 0)
            rc = add_alloc(sc, a, cap);
        if (rc)
            return rc;
        pf_alloc_get(a); /* the slot's reference */
        struct pf_insert_item *it = &batch->items[batch->n++];
        it->key = plans[0].keys[j];
        it->slot = (uint16_t)w->shard;
        it->nslots = (uint16_t)in->nshards;
        it->s = (struct pf_slot){.k = a->ptr,
                                 .ka = a,
                                 .seg_len = (uint32_t)page,
                                 .seg_stride = (uint32_t)page,
                                 .nseg = 1,
                                 .numa = (int16_t)w->numa};
        for (size_t i = 0; i < nlayers; i++) {
            const struct pf_layout *lay = &plans[i].l->lay;
            const struct pf_topo_layer *t = &in->topo[plans[i].l->layer_id];
            char *host = (char *)a->ptr + t->offset;
            if (t->bytes > lay->copy_len)
                memset(host + lay->copy_len, 0, t->bytes - lay->copy_len);
            x->descs[x->n++] = (struct pf_copy_desc){
                .dev = pf_layout_addr(lay, plans[0].ids[j], 0), .host = host, .len = lay->copy_len};
            x->bytes += lay->copy_len;
        }
    }
    return 0;
}

int pf_engine_save(struct pf_engine *e, const char *instance_id, uint32_t tp_rank, uint32_t pp_rank,
                   int32_t device_id, const struct pf_engine_save_layer *layers, size_t nlayers,
                   char *err, size_t errlen)
{
    uint64_t t0 = pf_now_ns();
    if (!instance_id || !*instance_id) {
        snprintf(err, errlen, "instance_id must not be empty");
        return -EINVAL;
    }
    struct pf_instance *in = pf_engine_instance_get(e, instance_id);
    if (!in) {
        snprintf(err, errlen, "instance %s not found", instance_id);
        return -ENOENT;
    }
    int rc = 0;
    struct plan *plans = NULL;
    struct pf_xfer *x = NULL;
    struct pf_insert_batch *batch = NULL;
    rc = pf_instance_check_sealed(e, in, err, errlen);
    if (rc)
        goto out;
    struct pf_worker *w = pf_instance_worker(in, device_id);
    if (!w) {
        snprintf(err, errlen, "device %d is not registered for instance %s", device_id,
                 instance_id);
        rc = -ENOENT;
        goto out;
    }
    if (w->tp_rank != tp_rank || w->pp_rank != pp_rank) {
        snprintf(err, errlen,
                 "device %d of instance %s is registered as tp_rank %u pp_rank %u, not tp_rank "
                 "%u pp_rank %u",
                 device_id, instance_id, w->tp_rank, w->pp_rank, tp_rank, pp_rank);
        rc = -EPERM;
        goto out;
    }
    plans = calloc(nlayers ? nlayers : 1, sizeof(*plans));
    if (!plans) {
        rc = -ENOMEM;
        goto out;
    }
    size_t total;
    rc = validate(e, in, w, tp_rank, layers, nlayers, plans, &total, err, errlen);
    if (rc)
        goto out;
    if (in->page_first && nlayers > 0) { /* an empty save stays a no-op */
        rc = check_pages(w, layers, nlayers, plans, err, errlen);
        if (rc)
            goto out;
    }
    /* page-first: every plan names the same blocks, the first one stands for the pages */
    size_t nplans = in->page_first ? 1 : nlayers;
    ssize_t nleft = dedup(e, plans, nplans);
    if (nleft < 0) {
        rc = (int)nleft;
        goto out;
    }
    size_t left = (size_t)nleft;
    if (left == 0)
        goto out;                 /* everything already resident (or empty save) */
    uint64_t need = 0, piece = 0; /* all new bytes; the largest contiguous piece */
    if (in->page_first) {
        piece = in->shard_bytes[w->shard];
        need = (uint64_t)left * piece;
    }
    for (size_t i = 0; i < nplans && !in->page_first; i++) {
        uint64_t seg = (uint64_t)plans[i].n * plans[i].l->lay.host_stride;
        need += seg * plans[i].l->lay.nseg;
        piece = seg > piece ? seg : piece;
    }
    if (e->quota.check) {
        rc = e->quota.check(e->quota.ctx, e, in->ns_id, need, err, errlen);
        if (rc)
            goto out;
    }
    if (need > pf_pool_capacity(e->pool)) {
        /* no eviction can make room: fail before touching the cache */
        char nd[32], cp[32];
        pf_format_size(need, nd, sizeof(nd));
        pf_format_size(pf_pool_capacity(e->pool), cp, sizeof(cp));
        snprintf(err, errlen,
                 "save of %zu new blocks needs %s of pinned memory but the whole pool is %s "
                 "(--pool-size): save fewer blocks per call",
                 left, nd, cp);
        rc = -ENOSPC;
        goto out;
    }

    /* allocations and copy descriptors */
    size_t ndesc = 0;
    for (size_t i = 0; i < nlayers; i++)
        ndesc += plans[in->page_first ? 0 : i].n * plans[i].l->lay.nseg;
    x = pf_xfer_new(PF_COPY_D2H, w->mode, ndesc);
    struct save_ctx *sc = calloc(1, sizeof(*sc));
    size_t cap = in->page_first ? left : e->cfg.blockwise_alloc ? ndesc : nlayers * 2;
    if (sc)
        sc->allocs = calloc(cap ? cap : 1, sizeof(*sc->allocs));
    if (!x || !sc || !sc->allocs) {
        if (sc)
            free(sc->allocs);
        free(sc);
        rc = -ENOMEM;
        goto out;
    }
    x->ctx = sc;
    x->free_fn = save_free;
    batch = pf_insert_batch_new(left);
    if (!batch) {
        rc = -ENOMEM;
        goto out;
    }
    int numa = pf_pool_region_index(e->pool, w->numa) >= 0 ? w->numa : -1;
    if (in->page_first) {
        rc = build_pages(e, in, w, plans, nlayers, numa, x, sc, cap, batch);
        if (rc)
            goto alloc_fail;
    }
    for (size_t i = 0; i < nlayers && !in->page_first; i++) {
        struct plan *p = &plans[i];
        const struct pf_layout *lay = &p->l->lay;
        if (p->n == 0)
            continue;
        struct pf_alloc *seg_alloc[2] = {NULL, NULL};
        if (!e->cfg.blockwise_alloc) {
            for (uint32_t s = 0; s < lay->nseg; s++) {
                rc = pf_engine_alloc(e, p->n * lay->host_stride, numa, &seg_alloc[s]);
                if (rc == 0)
                    rc = add_alloc(sc, seg_alloc[s], cap);
                if (rc)
                    goto alloc_fail;
            }
        }
        for (size_t j = 0; j < p->n; j++) {
            struct pf_insert_item *it = &batch->items[batch->n++];
            it->key = p->keys[j];
            it->slot = (uint16_t)p->slot;
            it->nslots = p->nslots;
            it->s.seg_len = (uint32_t)lay->copy_len;
            it->s.seg_stride = (uint32_t)lay->host_stride;
            it->s.nseg = (uint8_t)lay->nseg;
            it->s.numa = (int16_t)w->numa;
            for (uint32_t s = 0; s < lay->nseg; s++) {
                struct pf_alloc *a;
                char *host;
                if (e->cfg.blockwise_alloc) {
                    rc = pf_engine_alloc(e, lay->host_stride, numa, &a);
                    if (rc == 0)
                        rc = add_alloc(sc, a, cap);
                    if (rc)
                        goto alloc_fail;
                    host = a->ptr;
                } else {
                    a = seg_alloc[s];
                    host = (char *)a->ptr + j * lay->host_stride;
                }
                pf_alloc_get(a); /* the slot's reference */
                if (s == 0) {
                    it->s.k = host;
                    it->s.ka = a;
                } else {
                    it->s.v = host;
                    it->s.va = a;
                }
                x->descs[x->n++] = (struct pf_copy_desc){
                    .dev = pf_layout_addr(lay, p->ids[j], s), .host = host, .len = lay->copy_len};
                x->bytes += lay->copy_len;
            }
        }
    }
    bool queued;
    rc = save_copy(e, w, x, batch, &queued);
    if (rc && !queued) {
        snprintf(err, errlen, "cannot queue the D2H copy: %s", strerror(-rc));
        goto out;
    }
    if (rc == -ENOTRECOVERABLE) {
        /* a sticky CUDA error: the device is lost for this process (hal_gpu.h) */
        char why[256] = "";
        pf_gpu_health(e->gpu, why, sizeof(why));
        snprintf(err, errlen,
                 "instance %s device %d: the server lost its GPU context (%s); nothing was "
                 "saved, the server is unhealthy and must be restarted",
                 instance_id, device_id, why[0] ? why : "sticky CUDA error");
        goto out;
    }
    if (rc == -EFAULT) {
        /* the client's memory, not the server: it shrank or removed a registered tensor */
        snprintf(err, errlen,
                 "instance %s device %d: the KV cache memory could not be read (the client "
                 "shrank or removed a registered KV tensor; the server log names the memory "
                 "object); nothing was saved",
                 instance_id, device_id);
        goto out;
    }
    if (rc) {
        snprintf(err, errlen, "D2H copy on device %d %s: %s", device_id,
                 rc == -ETIMEDOUT ? "timed out" : "failed", strerror(-rc));
        if (rc != -ETIMEDOUT)
            rc = -EIO;
        goto out;
    }
    pf_metric_add(e->m_save_bytes, (double)x->bytes);
    rc = pf_insert_post(e, batch);
    batch = NULL;
    if (rc) {
        snprintf(err, errlen, "insert thread unavailable: %s", strerror(-rc));
        goto out;
    }
    pf_metric_observe(e->m_save_dur, (double)(pf_now_ns() - t0) / 1e9);
    goto out;
alloc_fail:
    if (rc == -ENOMEM) {
        char nd[32], pc[32], sz[32], cp[32], mx[32];
        pf_format_size(need, nd, sizeof(nd));
        pf_format_size(piece, pc, sizeof(pc));
        pf_format_size(pf_pool_used(e->pool), sz, sizeof(sz));
        pf_format_size(pf_pool_capacity(e->pool), cp, sizeof(cp));
        uint64_t maxa = pf_pool_max_alloc(e->pool, numa);
        pf_format_size(maxa, mx, sizeof(mx));
        if (!e->cfg.blockwise_alloc && piece > maxa)
            snprintf(err, errlen,
                     "save needs one contiguous piece of %s of pinned memory per layer, but one "
                     "pool shard holds at most %s (fewer --pool-shards, or fewer blocks per call)",
                     pc, mx);
        else
            snprintf(err, errlen,
                     "pinned pool exhausted: the save needs %s; %s of %s is in use (this save's "
                     "own allocations included) and nothing more can be evicted (the rest is "
                     "held by leases, loads, transfers or saves in flight)",
                     nd, sz, cp);
        rc = -ENOSPC;
    }
out:
    if (batch) {
        for (size_t i = 0; i < batch->n; i++) {
            pf_alloc_put(batch->items[i].s.ka);
            pf_alloc_put(batch->items[i].s.va);
        }
        pf_insert_batch_free(batch);
    }
    pf_xfer_put(x);
    plans_free(plans, nlayers);
    pf_instance_put(in);
    return rc;
}

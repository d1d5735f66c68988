/* Load (reference §2.5): attach the caller's load_state_shm, consume one share of each
 * lease, check counts and slot shapes, build the H2D copy list and hand it to the device's
 * load thread, then return at once. The load thread sets the shared state to 1 (success)
 * or -1 (failure) after the copies, or -2 when the client asked to cancel (state 2) before
 * one of its chunks: nothing is copied after that (loadstate.h); an error before submission sets -1
 * and returns the error. The task holds its own block references until the copies completed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "load"
#include "engine/engine_internal.h"
#include "engine/loadstate.h"
#include "pf/clock.h"
#include "pf/log.h"

struct load_ctx {
    struct pf_engine *e;
    struct pf_loadstate_map shm;
    struct pf_block **blocks;
    size_t nblocks, capblocks;
    uint64_t t0;
};

static void load_free(struct pf_xfer *x)
{
    struct load_ctx *c = x->ctx;
    for (size_t i = 0; i < c->nblocks; i++)
        pf_block_put(c->blocks[i]);
    free(c->blocks);
    pf_loadstate_detach(&c->shm);
    free(c);
}

static bool load_cancelled(struct pf_xfer *x)
{
    struct load_ctx *c = x->ctx;
    return pf_loadstate_cancel_requested(&c->shm);
}

static void load_done(struct pf_xfer *x)
{
    struct load_ctx *c = x->ctx;
    struct pf_engine *e = c->e;
    if (x->result == -ECANCELED) {
        /* every copy submitted before the cancel was seen has completed */
        pf_metric_add(e->m_load_cancelled, 1);
        pf_loadstate_set(&c->shm, PF_LOADSTATE_CANCELLED);
        return;
    }
    if (x->result == 0) {
        pf_metric_add(e->m_load_bytes, (double)x->bytes);
        pf_metric_observe(e->m_load_dur, (double)(pf_now_ns() - c->t0) / 1e9);
    } else {
        pf_metric_add(e->m_load_fail, 1);
    }
    pf_loadstate_set(&c->shm, x->result == 0 ? 1 : -1);
}

static int keep_blocks(struct load_ctx *c, struct pf_block **b, size_t n)
{
    if (c->nblocks + n > c->capblocks) {
        size_t nc = (c->nblocks + n) * 2;
        struct pf_block **nb = realloc(c->blocks, nc * sizeof(*nb));
        if (!nb)
            return -ENOMEM;
        c->blocks = nb;
        c->capblocks = nc;
    }
    memcpy(c->blocks + c->nblocks, b, n * sizeof(*b));
    c->nblocks += n;
    return 0;
}

/* A layer of the request's groups, resolved once per Load (not once per block). */
struct lay_ref {
    struct pf_layer_reg *lr;
    const struct pf_topo_layer *tl;
    uint16_t slot; /* its slot in the blocks of its storage group, for this tp_rank */
};

/* Validates one lease's blocks against the request and appends their copy descriptors to x
 * (room for them ensured by the caller). lay[goff[g] .. goff[g] + groups[g].n) are layer
 * group g's layers; gsg[g] is its storage group (-1: the group names no layer). A block is
 * checked only against the layer groups it has a destination in: the lease of a group-1
 * query carries "no destination" for the attention groups and the other way round. */
static int plan_lease(struct pf_instance *in, const struct pf_engine_load *l, const int64_t *gsg,
                      const struct lay_ref *lay, const size_t *goff,
                      const struct pf_engine_load_lease *ll, struct pf_block **blocks, size_t nb,
                      struct pf_xfer *x, char *err, size_t errlen)
{
    if (ll->ngroups != l->ngroups) {
        snprintf(err, errlen,
                 "lease load has %zu block id groups but the request has %zu "
                 "layer groups",
                 ll->ngroups, l->ngroups);
        return -EINVAL;
    }
    for (size_t g = 0; g < l->ngroups; g++) {
        const struct pf_engine_load_targets *t = &ll->by_group[g];
        if (t->n != nb) {
            snprintf(err, errlen,
                     "query lease block count %zu does not match destination block count %zu", nb,
                     t->n);
            return -EINVAL;
        }
        if (gsg[g] < 0)
            continue;
        uint32_t want_slots = pf_instance_group_slots(in, (uint32_t)gsg[g]);
        for (size_t j = 0; j < nb; j++) {
            int64_t target = t->block_ids[j];
            if (target < 0)
                continue;
            if (blocks[j]->nslots != want_slots) {
                snprintf(err, errlen,
                         "leased block has %u slots but storage group %lld of instance %s has "
                         "%u: the lease belongs to another storage group, or the namespace is "
                         "shared by incompatible KV layouts",
                         blocks[j]->nslots, (long long)gsg[g], in->id, want_slots);
                return -EINVAL;
            }
            for (size_t k = 0; k < l->groups[g].n; k++) {
                const struct lay_ref *r = &lay[goff[g] + k];
                const struct pf_layout *lo = &r->lr->lay;
                struct pf_slot sv, *s = &sv;
                pf_block_slot(blocks[j], r->slot, s);
                if ((uint64_t)target >= lo->num_blocks) {
                    snprintf(err, errlen,
                             "layer %s: destination block id %lld out of range "
                             "(num_blocks %llu)",
                             r->lr->name, (long long)target, (unsigned long long)lo->num_blocks);
                    return -EINVAL;
                }
                bool fits = in->page_first
                                ? s->nseg == 1 && s->seg_len == in->shard_bytes[r->tl->index]
                                : s->seg_len == lo->copy_len && s->nseg == lo->nseg;
                if (!fits || !s->k) {
                    if (in->page_first)
                        snprintf(err, errlen,
                                 "layer %s: stored page (%u x %u bytes) does not match the "
                                 "registered shard page (%llu bytes)",
                                 r->lr->name, s->nseg, s->seg_len,
                                 (unsigned long long)in->shard_bytes[r->tl->index]);
                    else
                        snprintf(err, errlen,
                                 "layer %s: stored slot (%u x %u bytes) does not match the "
                                 "registered layout (%u x %llu bytes)",
                                 r->lr->name, s->nseg, s->seg_len, lo->nseg,
                                 (unsigned long long)lo->copy_len);
                    return -EINVAL;
                }
                for (uint32_t seg = 0; seg < lo->nseg; seg++) {
                    char *host = in->page_first ? (char *)s->k + r->tl->offset : seg ? s->v : s->k;
                    x->descs[x->n++] =
                        (struct pf_copy_desc){.dev = pf_layout_addr(lo, (uint64_t)target, seg),
                                              .host = host,
                                              .len = lo->copy_len};
                    x->bytes += lo->copy_len;
                }
            }
        }
    }
    return 0;
}

int pf_engine_load(struct pf_engine *e, const struct pf_engine_load *l, char *err, size_t errlen)
{
    struct load_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->e = e;
    c->t0 = pf_now_ns();
    pf_loadstate_init(&c->shm);
    int rc = pf_loadstate_attach(l->load_state_shm, &c->shm, err, errlen);
    if (rc) {
        free(c);
        pf_metric_add(e->m_load_fail, 1);
        /* the client names the object: a missing or foreign one is its mistake */
        return rc == -EINVAL || rc == -ENOENT || rc == -EACCES ? rc : -EIO;
    }
    struct pf_instance *in = NULL;
    struct pf_xfer *x = NULL;
    struct {
        struct pf_block **b;
        size_t n;
    } *leased = NULL;
    size_t nleased = 0;
    bool *seen = NULL;    /* per registered layer: named by the request */
    int64_t *gsg = NULL;  /* per layer group: its storage group, -1 while it names no layer */
    size_t *goff = NULL;  /* per layer group: its first layer in lay */
    size_t *gsegs = NULL; /* per layer group: copy descriptors per block (segments of its layers) */
    struct lay_ref *lay = NULL; /* the groups' layers, resolved */
    if (!l->instance_id || !*l->instance_id) {
        snprintf(err, errlen, "instance_id must not be empty");
        rc = -EINVAL;
        goto fail;
    }
    in = pf_engine_instance_get(e, l->instance_id);
    if (!in) {
        snprintf(err, errlen, "instance %s not found", l->instance_id);
        rc = -ENOENT;
        goto fail;
    }
    rc = pf_instance_check_sealed(e, in, err, errlen);
    if (rc)
        goto fail;
    struct pf_worker *w = pf_instance_worker(in, l->device_id);
    if (!w) {
        snprintf(err, errlen, "device %d is not registered for instance %s", l->device_id,
                 l->instance_id);
        rc = -ENOENT;
        goto fail;
    }
    if (w->tp_rank != l->tp_rank) {
        snprintf(err, errlen, "device %d of instance %s is registered as tp_rank %u, not %u",
                 l->device_id, l->instance_id, w->tp_rank, l->tp_rank);
        rc = -EPERM;
        goto fail;
    }
    if (l->ngroups == 0) {
        snprintf(err, errlen, "load needs at least one layer group");
        rc = -EINVAL;
        goto fail;
    }
    seen = calloc(w->nlayers ? w->nlayers : 1, sizeof(*seen));
    gsg = malloc(l->ngroups * sizeof(*gsg));
    goff = malloc(l->ngroups * sizeof(*goff));
    gsegs = calloc(l->ngroups, sizeof(*gsegs));
    size_t nlay = 0;
    for (size_t g = 0; g < l->ngroups; g++)
        nlay += l->groups[g].n;
    lay = malloc((nlay ? nlay : 1) * sizeof(*lay));
    if (!seen || !gsg || !goff || !gsegs || !lay) {
        rc = -ENOMEM;
        goto fail;
    }
    nlay = 0;
    for (size_t g = 0; g < l->ngroups; g++) {
        gsg[g] = -1;
        goff[g] = nlay;
        for (size_t k = 0; k < l->groups[g].n; k++) {
            const char *name = l->groups[g].layer_names[k];
            struct pf_layer_reg *lr = name ? pf_worker_layer(w, name) : NULL;
            if (!lr) {
                snprintf(err, errlen, "layer %s is not registered on device %d",
                         name ? name : "<null>", l->device_id);
                rc = -EINVAL;
                goto fail;
            }
            if (seen[lr - w->layers]) {
                snprintf(err, errlen, "layer %s appears twice in the load groups", name);
                rc = -EINVAL;
                goto fail;
            }
            seen[lr - w->layers] = true;
            int64_t sg = in->topo[lr->layer_id].group;
            if (gsg[g] >= 0 && gsg[g] != sg) {
                snprintf(err, errlen,
                         "load group %zu mixes storage groups: layer %s is in group %lld, layer "
                         "%s in group %lld",
                         g, l->groups[g].layer_names[0], (long long)gsg[g], name, (long long)sg);
                rc = -EINVAL;
                goto fail;
            }
            gsg[g] = sg;
            lay[nlay++] = (struct lay_ref){
                .lr = lr,
                .tl = &in->topo[lr->layer_id],
                .slot = (uint16_t)pf_instance_slot_of(in, lr->layer_id, l->tp_rank)};
            gsegs[g] += lr->lay.nseg;
        }
    }
    leased = calloc(l->nloads ? l->nloads : 1, sizeof(*leased));
    if (!leased) {
        rc = -ENOMEM;
        goto fail;
    }
    /* every lease is checked against the request before any share is taken: a rejected
     * Load leaves its leases as they were (the caller may retry it corrected). The copy
     * list is built in the same pass, into room for every block of every group. */
    size_t room = 0;
    for (size_t i = 0; i < l->nloads; i++) {
        rc = pf_lease_peek(e->leases, l->loads[i].lease.data, l->loads[i].lease.len, in->id,
                           &leased[i].b, &leased[i].n, err, errlen);
        if (rc)
            goto fail;
        nleased = i + 1;
        for (size_t g = 0; g < l->ngroups; g++)
            room += leased[i].n * gsegs[g];
    }
    x = pf_xfer_new(PF_COPY_H2D, w->mode, room ? room : 1);
    if (!x) {
        rc = -ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < l->nloads; i++) {
        rc = plan_lease(in, l, gsg, lay, goff, &l->loads[i], leased[i].b, leased[i].n, x, err,
                        errlen);
        if (rc)
            goto fail;
    }
    if (l->nloads) {
        struct pf_lease_ref *refs = malloc(l->nloads * sizeof(*refs));
        if (!refs) {
            rc = -ENOMEM;
            goto fail;
        }
        for (size_t i = 0; i < l->nloads; i++)
            refs[i] = (struct pf_lease_ref){l->loads[i].lease.data, l->loads[i].lease.len};
        size_t bad = 0;
        rc = pf_lease_commit_all(e->leases, refs, l->nloads, &bad);
        free(refs);
        if (rc == -EEXIST) {
            snprintf(err, errlen, "loads[%zu] names a lease that an earlier entry already names",
                     bad);
            rc = -EINVAL;
            goto fail;
        }
        if (rc) {
            snprintf(err, errlen,
                     "query lease %zu expired or was used up by a concurrent load; no lease of "
                     "this request was consumed",
                     bad);
            goto fail;
        }
    }
    if (x->n == 0) {
        pf_loadstate_set(&c->shm, 1);
        rc = 0;
        goto fail; /* nothing to copy: success, release everything */
    }
    for (size_t i = 0; i < l->nloads; i++) {
        rc = keep_blocks(c, leased[i].b, leased[i].n);
        if (rc)
            goto fail;
        free(leased[i].b);
        leased[i].b = NULL;
        leased[i].n = 0;
    }
    x->ctx = c;
    x->done_fn = load_done;
    x->free_fn = load_free;
    x->cancel_fn = load_cancelled;
    x->chunk_bytes = e->cfg.load_chunk_bytes;
    c = NULL; /* owned by the task now */
    rc = pf_gpu_worker_submit(w->gw, x);
    if (rc) {
        snprintf(err, errlen, "cannot queue the H2D copy: %s", strerror(-rc));
        pf_loadstate_set(&((struct load_ctx *)x->ctx)->shm, -1);
    }
    pf_xfer_put(x);
    free(leased);
    free(seen);
    free(gsg);
    free(goff);
    free(gsegs);
    free(lay);
    pf_instance_put(in);
    return rc;
fail:
    if (rc)
        pf_metric_add(e->m_load_fail, 1);
    if (c) {
        if (rc)
            pf_loadstate_set(&c->shm, -1);
        for (size_t i = 0; i < c->nblocks; i++)
            pf_block_put(c->blocks[i]);
        free(c->blocks);
        pf_loadstate_detach(&c->shm);
        free(c);
    }
    for (size_t i = 0; leased && i < nleased; i++) {
        for (size_t j = 0; j < leased[i].n; j++)
            pf_block_put(leased[i].b[j]);
        free(leased[i].b);
    }
    free(leased);
    free(seen);
    free(gsg);
    free(goff);
    free(gsegs);
    free(lay);
    pf_xfer_put(x);
    pf_instance_put(in);
    return rc;
}

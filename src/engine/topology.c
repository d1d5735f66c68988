/* Instance topology (reference §3.2): the sealing step that turns the workers' registered
 * layers into layer ids, storage groups and slots, and the slot and key arithmetic the
 * save, query and load paths use.
 *
 * Sealing checks, in order: per layer, identical geometry on every device that registered
 * it and one storage group; storage group ids dense 0..N-1; then either the layer-first
 * rules (every (layer, tp_rank) has an owner, owners of one (layer, tp_rank) agree on
 * pp_rank, slots per group within 16 bits) or the page-first rules (tp_size 1, one storage
 * group, no split K/V layer, every two workers' layer sets identical or disjoint, replicas
 * agree on pp_rank, pages within 32 bits). Every rejection is -EINVAL with a message naming
 * the layers, devices or ids involved. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "pf/common.h"

struct pf_layer_reg *pf_worker_layer(struct pf_worker *w, const char *name)
{
    size_t lo = 0, hi = w->by_name ? w->nlayers : 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        struct pf_layer_reg *l = &w->layers[w->by_name[mid]];
        int c = strcmp(l->name, name);
        if (c == 0)
            return l;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Index sort without qsort_r: the comparator reaches the names through a thread-local
 * pointer that pf_worker_index_layers sets around its qsort call. */
static _Thread_local const struct pf_layer_reg *sort_layers;

static int cmp_layer_idx(const void *a, const void *b)
{
    return strcmp(sort_layers[*(const uint32_t *)a].name, sort_layers[*(const uint32_t *)b].name);
}

int pf_worker_index_layers(struct pf_worker *w)
{
    w->by_name = malloc((w->nlayers ? w->nlayers : 1) * sizeof(*w->by_name));
    if (!w->by_name)
        return -ENOMEM;
    for (size_t i = 0; i < w->nlayers; i++)
        w->by_name[i] = (uint32_t)i;
    sort_layers = w->layers;
    qsort(w->by_name, w->nlayers, sizeof(*w->by_name), cmp_layer_idx);
    sort_layers = NULL;
    return 0;
}

int pf_instance_layer_id(const struct pf_instance *in, const char *name)
{
    size_t lo = 0, hi = in->nlayer_names;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(in->layer_names[mid], name);
        if (c == 0)
            return (int)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int pf_instance_slot(const struct pf_instance *in, const char *layer, uint32_t tp_rank)
{
    int li = pf_instance_layer_id(in, layer);
    if (li < 0 || tp_rank >= in->tp_size)
        return -1;
    return (int)pf_instance_slot_of(in, li, tp_rank);
}

int pf_group_key(uint32_t ns, const void *hash, size_t len, uint32_t g, struct pf_block_key *k_p)
{
    if (g == 0)
        return pf_key_make(ns, hash, len, k_p);
    if (len == 0 || len > PF_HASH_MAX - 4)
        return -EINVAL;
    uint8_t buf[PF_HASH_MAX];
    memcpy(buf, hash, len);
    buf[len] = (uint8_t)(g >> 24);
    buf[len + 1] = (uint8_t)(g >> 16);
    buf[len + 2] = (uint8_t)(g >> 8);
    buf[len + 3] = (uint8_t)g;
    return pf_key_make(ns, buf, len + 4, k_p);
}

void pf_topology_free(struct pf_instance *in)
{
    for (size_t i = 0; i < in->nlayer_names; i++)
        free(in->layer_names[i]);
    free(in->layer_names);
    free(in->topo);
    free(in->group_slots);
    free(in->shard_bytes);
    in->layer_names = NULL;
    in->nlayer_names = 0;
    in->topo = NULL;
    in->group_slots = NULL;
    in->shard_bytes = NULL;
    in->ngroups = in->nshards = in->total_slots = 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Layer ids of w's layers, ascending (by_name order is name order = layer-id order). */
static int worker_layer_id(const struct pf_instance *in, const struct pf_worker *w, size_t k)
{
    return pf_instance_layer_id(in, w->layers[w->by_name[k]].name);
}

/* Same layer set? Both lists are ascending, so element-wise. */
static bool same_set(const struct pf_worker *a, const struct pf_worker *b)
{
    if (a->nlayers != b->nlayers)
        return false;
    for (size_t k = 0; k < a->nlayers; k++)
        if (strcmp(a->layers[a->by_name[k]].name, b->layers[b->by_name[k]].name) != 0)
            return false;
    return true;
}

/* Per layer: geometry and group agree on every device; layer-first coverage and pp. */
static int check_layers(struct pf_instance *in, char *err, size_t errlen)
{
    for (size_t li = 0; li < in->nlayer_names; li++) {
        const char *name = in->layer_names[li];
        const struct pf_layer_reg *first = NULL;
        const struct pf_worker *fw = NULL;
        uint32_t first_pp[256];
        bool covered[256] = {false};
        for (size_t i = 0; i < in->nworkers; i++) {
            struct pf_worker *w = in->workers[i];
            struct pf_layer_reg *l = pf_worker_layer(w, name);
            if (!l)
                continue;
            if (!first) {
                first = l;
                fw = w;
            } else if (l->lay.copy_len != first->lay.copy_len || l->lay.nseg != first->lay.nseg ||
                       l->lay.host_stride != first->lay.host_stride) {
                snprintf(err, errlen,
                         "layer %s is registered with different block geometry on different "
                         "devices (device %d and device %d)",
                         name, fw->device_id, w->device_id);
                return -EINVAL;
            } else if (l->group != first->group) {
                snprintf(err, errlen,
                         "layer %s is registered in storage group %u on device %d but in group "
                         "%u on device %d (layer_group_ids must agree)",
                         name, first->group, fw->device_id, l->group, w->device_id);
                return -EINVAL;
            }
            uint32_t slot_rank = in->page_first ? 0 : w->tp_rank; /* page-first: replicas */
            if (covered[slot_rank] && first_pp[slot_rank] != w->pp_rank) {
                snprintf(err, errlen,
                         "layer %s tp_rank %u is registered by devices with different pp_rank",
                         name, w->tp_rank);
                return -EINVAL;
            }
            covered[slot_rank] = true;
            first_pp[slot_rank] = w->pp_rank;
        }
        in->topo[li].group = first->group;
        /* page-first pages pad every layer to 512 bytes whether or not this server has an
         * SSD tier, so a page means the same on every node (P2P) */
        in->topo[li].bytes = in->page_first ? pf_round_up(first->lay.copy_len, 512)
                                            : first->lay.host_stride * first->lay.nseg;
        if (in->page_first)
            continue;
        for (uint32_t r = 0; r < in->tp_size; r++)
            if (!covered[r]) {
                snprintf(err, errlen, "layer %s has no registration for tp_rank %u", name, r);
                return -EINVAL;
            }
    }
    return 0;
}

/* Storage group ids must be 0..N-1 with none missing. */
static int check_groups(struct pf_instance *in, char *err, size_t errlen)
{
    size_t n = in->nlayer_names;
    uint32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (!ids)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        ids[i] = in->topo[i].group;
    qsort(ids, n, sizeof(*ids), cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || ids[u - 1] != ids[i])
            ids[u++] = ids[i];
    int rc = 0;
    if (u && ids[u - 1] != u - 1) {
        int off = snprintf(err, errlen,
                           "layer_group_ids must be dense 0..N-1, but the registered storage "
                           "groups are {");
        for (size_t i = 0; i < u && off > 0 && (size_t)off < errlen; i++)
            off += snprintf(err + off, errlen - (size_t)off, "%s%u", i ? ", " : "", ids[i]);
        if (off > 0 && (size_t)off < errlen)
            snprintf(err + off, errlen - (size_t)off, "}");
        rc = -EINVAL;
    }
    in->ngroups = (uint32_t)u;
    free(ids);
    return rc;
}

static int seal_layer_first(struct pf_instance *in, char *err, size_t errlen)
{
    in->group_slots = calloc(in->ngroups, sizeof(*in->group_slots));
    if (!in->group_slots)
        return -ENOMEM;
    for (size_t li = 0; li < in->nlayer_names; li++) {
        struct pf_topo_layer *t = &in->topo[li];
        t->index = in->group_slots[t->group]++; /* count of the group's layers so far */
    }
    for (uint32_t g = 0; g < in->ngroups; g++) {
        uint64_t slots = (uint64_t)in->group_slots[g] * in->tp_size;
        if (slots > UINT16_MAX) {
            snprintf(err, errlen,
                     "storage group %u: %u layers x tp_size %u exceed %u slots per block", g,
                     in->group_slots[g], in->tp_size, UINT16_MAX);
            return -EINVAL;
        }
        in->group_slots[g] = (uint32_t)slots;
    }
    in->total_slots = in->group_slots[0];
    return 0;
}

struct shard {
    int min_layer;
    struct pf_worker *w; /* the first worker with this layer set */
};

static int cmp_shard(const void *a, const void *b)
{
    return ((const struct shard *)a)->min_layer - ((const struct shard *)b)->min_layer;
}

static int seal_page_first(struct pf_instance *in, char *err, size_t errlen)
{
    if (in->tp_size != 1) {
        snprintf(err, errlen,
                 "page_first needs tp_size 1 (MLA KV is identical on every TP rank: register "
                 "every rank with tp_rank 0, tp_size 1 and world_size = the number of ranks), "
                 "got tp_size %u",
                 in->tp_size);
        return -EINVAL;
    }
    if (in->ngroups > 1) {
        snprintf(err, errlen,
                 "page_first does not support hybrid storage groups (layer_group_ids name %u "
                 "groups)",
                 in->ngroups);
        return -EINVAL;
    }
    for (size_t i = 0; i < in->nworkers; i++) {
        struct pf_worker *w = in->workers[i];
        for (size_t k = 0; k < w->nlayers; k++)
            if (w->layers[k].lay.nseg > 1) {
                snprintf(err, errlen,
                         "page_first does not support split K/V layers (layer %s on device %d "
                         "has K and V %llu bytes apart)",
                         w->layers[k].name, w->device_id,
                         (unsigned long long)w->layers[k].lay.kv_stride);
                return -EINVAL;
            }
    }
    size_t n = in->nlayer_names;
    int *owner = malloc((n ? n : 1) * sizeof(*owner)); /* worker index of the layer's shard */
    struct shard *sh = calloc(in->nworkers ? in->nworkers : 1, sizeof(*sh));
    int rc = 0;
    if (!owner || !sh) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t li = 0; li < n; li++)
        owner[li] = -1;
    size_t nsh = 0;
    for (size_t i = 0; i < in->nworkers && rc == 0; i++) {
        struct pf_worker *w = in->workers[i];
        bool replica = false;
        for (size_t s = 0; s < nsh && !replica; s++)
            replica = same_set(sh[s].w, w);
        if (replica)
            continue;
        for (size_t k = 0; k < w->nlayers; k++) {
            int li = worker_layer_id(in, w, k);
            if (owner[li] >= 0) {
                struct pf_worker *o = in->workers[owner[li]];
                snprintf(err, errlen,
                         "page_first: the layer sets of device %d (%zu layers) and device %d "
                         "(%zu layers) overlap in layer %s; layer sets must be identical "
                         "(replicas) or disjoint (layer split)",
                         o->device_id, o->nlayers, w->device_id, w->nlayers, in->layer_names[li]);
                rc = -EINVAL;
                break;
            }
            owner[li] = (int)i;
        }
        sh[nsh].w = w;
        sh[nsh].min_layer = worker_layer_id(in, w, 0);
        nsh++;
    }
    if (rc)
        goto out;
    for (size_t li = 0; li < n; li++)
        if (owner[li] < 0) { /* cannot happen: every name comes from some worker */
            snprintf(err, errlen, "page_first: layer %s belongs to no shard", in->layer_names[li]);
            rc = -EINVAL;
            goto out;
        }
    if (nsh > UINT16_MAX) {
        snprintf(err, errlen, "page_first: %zu shards exceed %u slots per block", nsh, UINT16_MAX);
        rc = -EINVAL;
        goto out;
    }
    qsort(sh, nsh, sizeof(*sh), cmp_shard);
    in->shard_bytes = calloc(nsh, sizeof(*in->shard_bytes));
    if (!in->shard_bytes) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t s = 0; s < nsh; s++) {
        struct pf_worker *w = sh[s].w;
        uint64_t off = 0;
        for (size_t k = 0; k < w->nlayers; k++) { /* layer-id order */
            struct pf_topo_layer *t = &in->topo[worker_layer_id(in, w, k)];
            t->index = (uint32_t)s;
            t->offset = off;
            off += t->bytes;
        }
        if (off > UINT32_MAX) {
            snprintf(err, errlen,
                     "page_first: the page of device %d's %zu layers is %llu bytes (at "
                     "most %u per block)",
                     w->device_id, w->nlayers, (unsigned long long)off, UINT32_MAX);
            rc = -EINVAL;
            goto out;
        }
        in->shard_bytes[s] = off;
    }
    for (size_t i = 0; i < in->nworkers; i++) {
        struct pf_worker *w = in->workers[i];
        w->shard = in->topo[worker_layer_id(in, w, 0)].index;
    }
    in->nshards = (uint32_t)nsh;
    in->total_slots = (uint32_t)nsh;
out:
    free(owner);
    free(sh);
    return rc;
}

int pf_topology_seal(struct pf_instance *in, char *err, size_t errlen)
{
    size_t cap = 0;
    for (size_t i = 0; i < in->nworkers; i++)
        cap += in->workers[i]->nlayers;
    char **names = calloc(cap ? cap : 1, sizeof(*names));
    if (!names)
        return -ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < in->nworkers; i++)
        for (size_t j = 0; j < in->workers[i]->nlayers; j++)
            names[n++] = in->workers[i]->layers[j].name;
    qsort(names, n, sizeof(*names), cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0)
            names[u++] = names[i];
    int rc = 0;
    in->layer_names = calloc(u ? u : 1, sizeof(*in->layer_names));
    in->topo = calloc(u ? u : 1, sizeof(*in->topo));
    if (!in->layer_names || !in->topo) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < u; i++) {
        in->layer_names[i] = strdup(names[i]);
        if (!in->layer_names[i]) {
            rc = -ENOMEM;
            goto out;
        }
        in->nlayer_names = i + 1;
    }
    if (u == 0) {
        snprintf(err, errlen, "no layers registered");
        rc = -EINVAL;
        goto out;
    }
    rc = check_layers(in, err, errlen);
    if (rc == 0)
        rc = check_groups(in, err, errlen);
    if (rc == 0)
        rc = in->page_first ? seal_page_first(in, err, errlen) : seal_layer_first(in, err, errlen);
    if (rc)
        goto out;
    for (size_t i = 0; i < in->nworkers; i++)
        for (size_t j = 0; j < in->workers[i]->nlayers; j++)
            in->workers[i]->layers[j].layer_id =
                pf_instance_layer_id(in, in->workers[i]->layers[j].name);
out:
    free(names);
    if (rc)
        pf_topology_free(in);
    return rc;
}

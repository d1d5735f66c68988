/* Instances: registration (IPC import, layout validation, rollback), the registering ->
 * sealed lifecycle (reference §2.1), lookup and removal. Sealing itself (layer ids, storage
 * groups, page-first shards, slots; reference §3.2) is topology.c.
 *
 * The instance table is guarded by an rwlock; lookups take a reference that RPC handlers
 * drop when done, so an instance removed while a request uses it is destroyed by the last
 * user. Destroying an instance drains its copy threads before closing its GPU mappings, so
 * no queued copy can touch an unmapped tensor. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "engine"
#include "engine/engine_internal.h"
#include "pf/log.h"

static void layer_reg_free(struct pf_layer_reg *l)
{
    pf_gpu_ipc_close(l->map);
    free(l->name);
}

static size_t worker_free(struct pf_worker *w)
{
    if (!w)
        return 0;
    pf_gpu_worker_destroy(w->gw);
    size_t n = 0;
    for (size_t i = 0; i < w->nlayers; i++) {
        if (w->layers[i].map)
            n++;
        layer_reg_free(&w->layers[i]);
    }
    free(w->layers);
    free(w->by_name);
    free(w);
    return n;
}

static size_t instance_free(struct pf_instance *in)
{
    size_t n = 0;
    for (size_t i = 0; i < in->nworkers; i++)
        n += worker_free(in->workers[i]);
    pf_topology_free(in);
    free(in->workers);
    free(in->id);
    free(in->ns);
    free(in);
    return n;
}

void pf_instance_put(struct pf_instance *in)
{
    if (in && atomic_fetch_sub(&in->refs, 1) == 1) {
        size_t n = instance_free(in);
        if (n)
            pf_debug("closed %zu GPU mapping(s)", n);
    }
}

static struct pf_instance *find_locked(struct pf_engine *e, const char *id, size_t *idx_p)
{
    for (size_t i = 0; i < e->ninsts; i++)
        if (strcmp(e->insts[i]->id, id) == 0) {
            if (idx_p)
                *idx_p = i;
            return e->insts[i];
        }
    return NULL;
}

struct pf_instance *pf_engine_instance_get(struct pf_engine *e, const char *id)
{
    pthread_rwlock_rdlock(&e->inst_lock);
    struct pf_instance *in = find_locked(e, id, NULL);
    if (in)
        atomic_fetch_add(&in->refs, 1);
    pthread_rwlock_unlock(&e->inst_lock);
    return in;
}

struct pf_worker *pf_instance_worker(struct pf_instance *in, int32_t device_id)
{
    for (size_t i = 0; i < in->nworkers; i++)
        if (in->workers[i]->device_id == device_id)
            return in->workers[i];
    return NULL;
}

int pf_instance_check_sealed(struct pf_engine *e, struct pf_instance *in, char *err, size_t errlen)
{
    if (atomic_load_explicit(&in->sealed, memory_order_acquire))
        return 0;
    pthread_rwlock_rdlock(&e->inst_lock);
    size_t nw = in->nworkers;
    pthread_rwlock_unlock(&e->inst_lock);
    snprintf(err, errlen, "registration incomplete: %zu/%u workers registered", nw, in->world_size);
    return -EINVAL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int find_device(struct pf_engine *e, int32_t device_id, int *hal_p, int *numa_p)
{
    int n = pf_gpu_device_count(e->gpu);
    for (int i = 0; i < n; i++) {
        struct pf_gpu_dev_info info;
        if (pf_gpu_device_info(e->gpu, i, &info) == 0 && info.index == device_id) {
            *hal_p = i;
            *numa_p = info.numa_node;
            return 0;
        }
    }
    return -ENODEV;
}

static int import_layers(struct pf_engine *e, const struct pf_engine_register *r,
                         struct pf_worker *w, char *err, size_t errlen)
{
    w->layers = calloc(r->nlayers, sizeof(*w->layers));
    if (!w->layers)
        return -ENOMEM;
    for (size_t i = 0; i < r->nlayers; i++) {
        const struct pf_engine_layer *L = &r->layers[i];
        struct pf_layer_reg *l = &w->layers[i];
        char why[256];
        l->name = strdup(L->name);
        if (!l->name)
            return -ENOMEM;
        w->nlayers = i + 1;
        l->group = L->group_id;
        int rc = pf_gpu_ipc_open(e->gpu, &L->ipc, &l->map);
        if (rc) {
            snprintf(err, errlen, "register tensor failed for layer %s: %s%s", L->name,
                     strerror(-rc),
                     rc == -EINVAL ? " (descriptor does not match this server's GPU backend)" : "");
            return rc == -ENOMEM || rc == -EIO ? rc : -EINVAL;
        }
        if (l->map->device != w->hal_dev) {
            snprintf(err, errlen, "layer %s: tensor lives on another GPU than device_id %d",
                     L->name, r->device_id);
            return -EINVAL;
        }
        rc = pf_layout_init(&l->lay, l->map->base, l->map->size, L->num_blocks, L->bytes_per_block,
                            L->kv_stride_bytes, L->segments, e->cfg.pad_512, why, sizeof(why));
        if (rc) {
            snprintf(err, errlen, "layer %s: %s", L->name, why);
            return rc;
        }
    }
    return 0;
}

/* The page-first rules one registration can break on its own (the rest is checked when the
 * instance seals, pf_topology_seal). */
static int check_page_first(const struct pf_worker *w, char *err, size_t errlen)
{
    for (size_t i = 0; i < w->nlayers; i++) {
        const struct pf_layer_reg *l = &w->layers[i];
        if (l->lay.nseg > 1) {
            snprintf(err, errlen,
                     "page_first does not support split K/V layers (layer %s on device %d has K "
                     "and V %llu bytes apart)",
                     l->name, w->device_id, (unsigned long long)l->lay.kv_stride);
            return -EINVAL;
        }
        if (l->group != 0) {
            snprintf(err, errlen,
                     "page_first does not support hybrid storage groups (layer %s has "
                     "layer_group_id %u)",
                     l->name, l->group);
            return -EINVAL;
        }
    }
    return 0;
}

static int check_request(struct pf_engine *e, const struct pf_engine_register *r, char *err,
                         size_t errlen)
{
    const char *cv = r->client_version && *r->client_version ? r->client_version : "<missing>";
    if (!r->client_version || strcmp(r->client_version, e->cfg.version) != 0) {
        snprintf(err, errlen, "PegaFlow version mismatch: client=%s server=%s", cv, e->cfg.version);
        return -EPERM;
    }
    if (!r->instance_id || !*r->instance_id) {
        snprintf(err, errlen, "instance_id must not be empty");
        return -EINVAL;
    }
    if (!r->namespace_ || !*r->namespace_) {
        snprintf(err, errlen, "namespace must not be empty");
        return -EINVAL;
    }
    if (r->device_id < 0 || r->tp_size == 0 || r->world_size == 0 || r->tp_rank >= r->tp_size) {
        snprintf(err, errlen,
                 "invalid topology: device_id=%d tp_rank=%u tp_size=%u world_size=%u (need "
                 "device_id >= 0, tp_size > 0, world_size > 0, tp_rank < tp_size)",
                 r->device_id, r->tp_rank, r->tp_size, r->world_size);
        return -EINVAL;
    }
    if (r->tp_size > 256 || r->world_size > 4096) {
        snprintf(err, errlen, "tp_size %u / world_size %u too large", r->tp_size, r->world_size);
        return -EINVAL;
    }
    if (r->page_first && r->tp_size != 1) {
        snprintf(err, errlen,
                 "page_first needs tp_size 1 (MLA KV is identical on every TP rank: register "
                 "every rank with tp_rank 0, tp_size 1 and world_size = the number of ranks), "
                 "got tp_size %u",
                 r->tp_size);
        return -EINVAL;
    }
    if (r->transfer_mode != PF_COPY_MODE_DIRECT && r->transfer_mode != PF_COPY_MODE_KERNEL) {
        snprintf(err, errlen, "unknown transfer_mode %d", r->transfer_mode);
        return -EINVAL;
    }
    if (r->nlayers == 0) {
        snprintf(err, errlen, "no layers to register");
        return -EINVAL;
    }
    if (r->nlayers > PF_ENGINE_MAX_LAYERS) {
        snprintf(err, errlen, "%zu layers in one registration; the limit is %u", r->nlayers,
                 PF_ENGINE_MAX_LAYERS);
        return -E2BIG;
    }
    for (size_t i = 0; i < r->nlayers; i++) {
        if (!r->layers[i].name || !*r->layers[i].name) {
            snprintf(err, errlen, "layer %zu has an empty name", i);
            return -EINVAL;
        }
        if (r->layers[i].group_id >= PF_ENGINE_MAX_LAYERS) {
            snprintf(err, errlen,
                     "layer %s has storage group %u; layer_group_ids must be dense 0..N-1 with "
                     "N <= %u",
                     r->layers[i].name, r->layers[i].group_id, PF_ENGINE_MAX_LAYERS);
            return -EINVAL;
        }
    }
    /* duplicates: sort the names once (n log n), never compare every pair */
    const char **names = malloc(r->nlayers * sizeof(*names));
    if (!names)
        return -ENOMEM;
    for (size_t i = 0; i < r->nlayers; i++)
        names[i] = r->layers[i].name;
    qsort(names, r->nlayers, sizeof(*names), cmp_str);
    int rc = 0;
    for (size_t i = 1; i < r->nlayers && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            snprintf(err, errlen, "duplicate layer name %s", names[i]);
            rc = -EINVAL;
        }
    free(names);
    return rc;
}

int pf_engine_register(struct pf_engine *e, const struct pf_engine_register *r, char *err,
                       size_t errlen)
{
    int rc = check_request(e, r, err, errlen);
    if (rc)
        return rc;
    struct pf_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->device_id = r->device_id;
    w->tp_rank = r->tp_rank;
    w->pp_rank = r->pp_rank;
    w->mode = (enum pf_copy_mode)r->transfer_mode;
    if (find_device(e, r->device_id, &w->hal_dev, &w->numa) != 0) {
        snprintf(err, errlen, "device %d is not managed by this server (see --devices)",
                 r->device_id);
        rc = -EINVAL;
        goto err_worker;
    }
    /* every instance owns copy threads per device: a client must not be able to make the
     * server start threads without bound */
    pthread_rwlock_rdlock(&e->inst_lock);
    size_t ninsts = e->ninsts;
    bool known = find_locked(e, r->instance_id, NULL) != NULL;
    pthread_rwlock_unlock(&e->inst_lock);
    if (!known && ninsts >= PF_ENGINE_MAX_INSTANCES) {
        snprintf(err, errlen,
                 "%zu instances are registered; the limit is %u (unregister instances that are "
                 "gone, or run another server)",
                 ninsts, PF_ENGINE_MAX_INSTANCES);
        rc = -ENOSPC;
        goto err_worker;
    }
    rc = import_layers(e, r, w, err, errlen);
    if (rc == 0 && r->page_first)
        rc = check_page_first(w, err, errlen);
    if (rc == 0)
        rc = pf_worker_index_layers(w);
    if (rc)
        goto err_worker;
    rc = pf_gpu_worker_create(e->gpu, w->hal_dev, w->numa, w->device_id, &w->gw);
    if (rc) {
        snprintf(err, errlen, "cannot start copy threads for device %d: %s", r->device_id,
                 strerror(-rc));
        goto err_worker;
    }

    pthread_rwlock_wrlock(&e->inst_lock);
    size_t idx;
    struct pf_instance *in = find_locked(e, r->instance_id, &idx);
    bool created = false;
    if (in) {
        if (in->tp_size != r->tp_size || in->world_size != r->world_size ||
            in->page_first != r->page_first) {
            snprintf(err, errlen,
                     "topology mismatch for instance %s: registered tp_size=%u world_size=%u "
                     "page_first=%d, request tp_size=%u world_size=%u page_first=%d",
                     in->id, in->tp_size, in->world_size, in->page_first, r->tp_size, r->world_size,
                     r->page_first);
            rc = -EPERM;
            goto err_unlock;
        }
        if (strcmp(in->ns, r->namespace_) != 0) {
            snprintf(err, errlen,
                     "namespace mismatch for instance %s: registered in namespace %s, request "
                     "names %s",
                     in->id, in->ns, r->namespace_);
            rc = -EPERM;
            goto err_unlock;
        }
        if (pf_instance_worker(in, r->device_id)) {
            snprintf(err, errlen, "GPU context for device %d already exists in instance %s",
                     r->device_id, in->id);
            rc = -EINVAL;
            goto err_unlock;
        }
        if (in->sealed) {
            snprintf(err, errlen, "instance %s is already fully registered (%u workers)", in->id,
                     in->world_size);
            rc = -EINVAL;
            goto err_unlock;
        }
    } else {
        if (e->ninsts >= PF_ENGINE_MAX_INSTANCES) { /* raced past the check above */
            snprintf(err, errlen, "%zu instances are registered; the limit is %u", e->ninsts,
                     PF_ENGINE_MAX_INSTANCES);
            rc = -ENOSPC;
            goto err_unlock;
        }
        if (e->ninsts == e->capinsts) {
            size_t nc = e->capinsts ? e->capinsts * 2 : 8;
            struct pf_instance **ni = realloc(e->insts, nc * sizeof(*ni));
            if (!ni) {
                rc = -ENOMEM;
                goto err_unlock;
            }
            e->insts = ni;
            e->capinsts = nc;
        }
        in = calloc(1, sizeof(*in));
        if (!in) {
            rc = -ENOMEM;
            goto err_unlock;
        }
        atomic_init(&in->refs, 1);
        in->id = strdup(r->instance_id);
        in->ns = strdup(r->namespace_);
        in->tp_size = r->tp_size;
        in->world_size = r->world_size;
        in->page_first = r->page_first;
        in->workers = calloc(r->world_size, sizeof(*in->workers));
        if (!in->id || !in->ns || !in->workers || pf_ns_intern(r->namespace_, &in->ns_id) != 0) {
            instance_free(in);
            rc = -ENOMEM;
            goto err_unlock;
        }
        e->insts[e->ninsts++] = in;
        idx = e->ninsts - 1;
        created = true;
    }
    in->workers[in->nworkers++] = w;
    size_t nworkers = in->nworkers; /* for the log line, read under the lock */
    if (in->nworkers == in->world_size) {
        rc = pf_topology_seal(in, err, errlen);
        if (rc) {
            in->workers[--in->nworkers] = NULL;
            if (created) {
                e->insts[idx] = e->insts[--e->ninsts];
                pthread_rwlock_unlock(&e->inst_lock);
                pf_instance_put(in);
                goto err_worker;
            }
            goto err_unlock;
        }
        atomic_store_explicit(&in->sealed, true, memory_order_release);
        if (in->page_first)
            pf_info("instance %s sealed: namespace %s, page-first, %zu layer(s) in %u shard(s) "
                    "= %u slot(s) per block, %u worker(s)",
                    in->id, in->ns, in->nlayer_names, in->nshards, in->nshards, in->world_size);
        else
            pf_info("instance %s sealed: namespace %s, %zu layer(s) x tp %u, %u storage "
                    "group(s), group 0 = %u slot(s) per block, %u worker(s)",
                    in->id, in->ns, in->nlayer_names, in->tp_size, in->ngroups, in->total_slots,
                    in->world_size);
    }
    pthread_rwlock_unlock(&e->inst_lock);
    pf_info("registered instance %s device %d (tp_rank %u pp_rank %u): %zu layer(s), %zu/%u "
            "workers",
            r->instance_id, r->device_id, r->tp_rank, r->pp_rank, r->nlayers, nworkers,
            r->world_size);
    return 0;
err_unlock:
    pthread_rwlock_unlock(&e->inst_lock);
err_worker:
    worker_free(w);
    pf_debug("register %s device %d rejected: %s", r->instance_id, r->device_id, err);
    return rc;
}

int pf_engine_remove_instance(struct pf_engine *e, const char *id, size_t *ntensors_p)
{
    pthread_rwlock_wrlock(&e->inst_lock);
    size_t idx;
    struct pf_instance *in = find_locked(e, id, &idx);
    if (in)
        e->insts[idx] = e->insts[--e->ninsts];
    pthread_rwlock_unlock(&e->inst_lock);
    if (!in)
        return -ENOENT;
    size_t nleases = pf_lease_drop_instance(e->leases, id);
    pf_prefetch_gc(e, 300 * PF_NS_PER_SEC, id); /* its tasks pin blocks nobody will collect */
    size_t nt = 0;
    for (size_t i = 0; i < in->nworkers; i++)
        nt += in->workers[i]->nlayers;
    pf_info("unregistered instance %s: dropped %zu CUDA tensors and %zu lease(s)", id, nt, nleases);
    if (ntensors_p)
        *ntensors_p = nt;
    pf_instance_put(in);
    return 0;
}

int pf_engine_unregister(struct pf_engine *e, const char *instance_id, char *err, size_t errlen)
{
    if (!instance_id || !*instance_id) {
        snprintf(err, errlen, "instance_id must not be empty");
        return -EINVAL;
    }
    int rc = pf_engine_remove_instance(e, instance_id, NULL);
    if (rc)
        snprintf(err, errlen, "instance %s not found", instance_id);
    return rc;
}

size_t pf_engine_list_instances(struct pf_engine *e, char ***ids_p)
{
    pthread_rwlock_rdlock(&e->inst_lock);
    size_t n = e->ninsts;
    char **ids = calloc(n ? n : 1, sizeof(*ids));
    for (size_t i = 0; ids && i < n; i++)
        ids[i] = strdup(e->insts[i]->id);
    pthread_rwlock_unlock(&e->inst_lock);
    *ids_p = ids;
    return ids ? n : 0;
}

int pf_engine_cleanup_instances(struct pf_engine *e, const char *id, char ***removed_p,
                                size_t *nremoved_p, size_t *ntensors_p)
{
    char **ids = NULL;
    size_t n;
    if (id) {
        ids = calloc(1, sizeof(*ids));
        if (!ids)
            return -ENOMEM;
        ids[0] = strdup(id);
        n = 1;
    } else {
        n = pf_engine_list_instances(e, &ids);
    }
    size_t removed = 0, tensors = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nt = 0;
        if (ids[i] && pf_engine_remove_instance(e, ids[i], &nt) == 0) {
            ids[removed++] = ids[i];
            tensors += nt;
        } else {
            free(ids[i]);
        }
    }
    *removed_p = ids;
    *nremoved_p = removed;
    *ntensors_p = tensors;
    return id && removed == 0 ? -ENOENT : 0;
}

/* ---- sessions ---- */

int pf_engine_session_open(struct pf_engine *e, const char *instance_id, uint64_t *token_p)
{
    pthread_mutex_lock(&e->sess_mu);
    uint64_t tok = ++e->next_token;
    for (size_t i = 0; i < e->nsessions; i++)
        if (strcmp(e->sessions[i].instance, instance_id) == 0) {
            e->sessions[i].token = tok;
            goto out;
        }
    if (e->nsessions == e->capsessions) {
        size_t nc = e->capsessions ? e->capsessions * 2 : 8;
        struct pf_session_ent *ns = realloc(e->sessions, nc * sizeof(*ns));
        if (!ns) {
            pthread_mutex_unlock(&e->sess_mu);
            return -ENOMEM;
        }
        e->sessions = ns;
        e->capsessions = nc;
    }
    e->sessions[e->nsessions].instance = strdup(instance_id);
    if (!e->sessions[e->nsessions].instance) {
        pthread_mutex_unlock(&e->sess_mu);
        return -ENOMEM;
    }
    e->sessions[e->nsessions++].token = tok;
out:
    pthread_mutex_unlock(&e->sess_mu);
    *token_p = tok;
    return 0;
}

void pf_engine_session_close(struct pf_engine *e, const char *instance_id, uint64_t token)
{
    bool current = false;
    pthread_mutex_lock(&e->sess_mu);
    for (size_t i = 0; i < e->nsessions; i++)
        if (strcmp(e->sessions[i].instance, instance_id) == 0) {
            current = e->sessions[i].token == token;
            if (current) {
                free(e->sessions[i].instance);
                e->sessions[i] = e->sessions[--e->nsessions];
            }
            break;
        }
    pthread_mutex_unlock(&e->sess_mu);
    if (!current) {
        pf_debug("session of instance %s ended but was superseded: no cleanup", instance_id);
        return;
    }
    size_t nt = 0;
    if (pf_engine_remove_instance(e, instance_id, &nt) == 0)
        pf_info("session of instance %s ended: instance cleaned up (%zu tensors)", instance_id, nt);
    else
        pf_info("session of instance %s ended (instance not registered)", instance_id);
}

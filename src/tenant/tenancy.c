/* Live tenant state (pf/tenant.h): the current parsed file behind a rwlock (replaced whole by
 * a reload), the instance -> tenant bindings made at Register, the Save quota hook and the
 * per-tenant metrics.
 *
 * Quota (RAM): a tenant's resident bytes are the footprints of the RAM cache's blocks in the
 * namespaces the tenant's rules match (pf_cache_ns_bytes per interned namespace). A Save
 * that would take the tenant past its quota first waits (bounded) for its earlier saves to
 * be sealed, then evicts the tenant's own unreferenced blocks, oldest first
 * (pf_engine_evict_namespaces: other tenants' blocks are never touched); when that cannot
 * make room it is refused with -ENOSPC (RESOURCE_EXHAUSTED).
 *
 * Quota (SSD): the SSD writer asks ssd_lookup before writing a record of a tenant's
 * namespace and drops the tenant's own oldest SSD index entries until it fits
 * (pf_ssd_quota in pf/ssd.h); the quota is read per record, so a reload applies at the next
 * write. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "tenant"
#include "pf/block.h"
#include "pf/cache.h"
#include "pf/config.h"
#include "pf/engine.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/ssd.h"
#include "pf/tenant.h"

#define QUOTA_FLUSH_MS 2000

struct binding {
    char *instance;
    char tenant[PF_TENANT_NAME_MAX + 1];
};

struct pf_tenancy {
    char *path;
    pthread_rwlock_t lk; /* cur */
    struct pf_tenants *cur;
    pthread_mutex_t bmu;   /* bindings */
    pthread_mutex_t regmu; /* pf_tenancy_register_lock */
    struct binding *b;
    size_t nb, capb;
    struct pf_engine *engine;
    struct pf_metric *m_hits, *m_evict_blocks, *m_evict_bytes, *m_refusals, *m_reloads, *m_ram;
    struct pf_ssd *ssd;
    struct pf_metric *m_ssd, *m_ssd_evict_blocks, *m_ssd_evict_bytes, *m_ssd_refused;
};

int pf_tenancy_create(const char *path, struct pf_tenancy **tc_p, char *err, size_t errlen)
{
    struct pf_tenancy *tc = calloc(1, sizeof(*tc));
    if (!tc || !(tc->path = strdup(path))) {
        free(tc);
        snprintf(err, errlen, "--tenants-file: out of memory");
        return -ENOMEM;
    }
    int rc = pf_tenants_load(path, &tc->cur, err, errlen);
    if (rc) {
        free(tc->path);
        free(tc);
        return rc;
    }
    pthread_rwlock_init(&tc->lk, NULL);
    pthread_mutex_init(&tc->bmu, NULL);
    pthread_mutex_init(&tc->regmu, NULL);
    tc->m_hits = pf_metric_counter("pegaflow_tenant_hit_blocks",
                                   "Blocks a tenant's queries found in the cache", "tenant");
    tc->m_evict_blocks =
        pf_metric_counter("pegaflow_tenant_evicted_blocks",
                          "A tenant's blocks evicted to keep its RAM quota", "tenant");
    tc->m_evict_bytes = pf_metric_counter("pegaflow_tenant_evicted_bytes",
                                          "Bytes of a tenant's blocks evicted to keep its RAM "
                                          "quota",
                                          "tenant");
    tc->m_refusals = pf_metric_counter("pegaflow_tenant_refusals",
                                       "Worker RPCs refused by the tenant checks", "tenant,reason");
    tc->m_ssd_evict_blocks = pf_metric_counter(
        "pegaflow_tenant_ssd_evicted_blocks",
        "A tenant's blocks dropped from the SSD index to keep its SSD quota", "tenant");
    tc->m_ssd_evict_bytes = pf_metric_counter(
        "pegaflow_tenant_ssd_evicted_bytes",
        "SSD bytes of a tenant's blocks dropped from the SSD index to keep its SSD quota",
        "tenant");
    tc->m_ssd_refused = pf_metric_counter(
        "pegaflow_tenant_ssd_refused_blocks",
        "A tenant's blocks not written to SSD: larger than its SSD quota, or its writes in "
        "flight already fill it",
        "tenant");
    tc->m_reloads = pf_metric_counter("pegaflow_tenant_reloads",
                                      "Reloads of --tenants-file (SIGHUP)", "result");
    pf_info("tenants: %zu tenant(s) from %s", tc->cur->n, path);
    *tc_p = tc;
    return 0;
}

/* Namespace ids (interned so far) of tenant t; malloc'ed, *n_p entries. Read lock held. */
static uint32_t *tenant_ns_ids(const struct pf_tenant *t, size_t *n_p)
{
    size_t n = 0, cap = 16;
    uint32_t *v = malloc(cap * sizeof(*v));
    uint32_t count = pf_ns_count();
    for (uint32_t id = 0; v && id < count; id++) {
        const char *name = pf_ns_name(id);
        if (!pf_tenant_allows(t, name))
            continue;
        if (n == cap) {
            uint32_t *m = realloc(v, 2 * cap * sizeof(*v));
            if (!m) {
                free(v);
                return NULL;
            }
            v = m;
            cap *= 2;
        }
        v[n++] = id;
    }
    *n_p = n;
    return v;
}

static uint64_t ns_bytes(struct pf_engine *e, const uint32_t *ids, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += pf_cache_ns_bytes(pf_engine_cache(e), ids[i]);
    return s;
}

static void refuse(struct pf_tenancy *tc, const char *tenant, const char *reason)
{
    pf_child_add(pf_metric_child2(tc->m_refusals, tenant, reason), 1);
}

static int quota_check(void *ctx, struct pf_engine *e, uint32_t ns, uint64_t need, char *err,
                       size_t errlen)
{
    struct pf_tenancy *tc = ctx;
    const char *nsname = pf_ns_name(ns);
    int rc = 0;
    pthread_rwlock_rdlock(&tc->lk);
    const struct pf_tenant *t = pf_tenants_by_namespace(tc->cur, nsname);
    if (!t || t->ram_quota == 0)
        goto out;
    char name[PF_TENANT_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%s", t->name);
    uint64_t quota = t->ram_quota;
    char q[32], nd[32];
    pf_format_size(quota, q, sizeof(q));
    pf_format_size(need, nd, sizeof(nd));
    if (need > quota) {
        snprintf(err, errlen,
                 "tenant %s: the save needs %s of pinned memory but its RAM quota is %s: save "
                 "fewer blocks per call",
                 name, nd, q);
        refuse(tc, name, "quota");
        rc = -ENOSPC;
        goto out;
    }
    size_t nids = 0;
    uint32_t *ids = tenant_ns_ids(t, &nids);
    if (!ids) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    pthread_rwlock_unlock(&tc->lk); /* the flush and the eviction may take a while */
    uint64_t used = ns_bytes(e, ids, nids);
    if (used + need > quota) {
        /* blocks of the tenant's earlier saves may still wait for the insert thread:
         * count (and evict) them once they are in the cache */
        pf_engine_flush(e, QUOTA_FLUSH_MS);
        used = ns_bytes(e, ids, nids);
    }
    if (used + need > quota) {
        uint64_t nblk = 0;
        uint64_t freed = pf_engine_evict_namespaces(e, ids, nids, used + need - quota, &nblk);
        if (nblk) {
            pf_child_add(pf_metric_child1(tc->m_evict_blocks, name), (double)nblk);
            pf_child_add(pf_metric_child1(tc->m_evict_bytes, name), (double)freed);
            pf_debug("tenant %s: evicted %llu block(s) (%llu bytes) for its RAM quota", name,
                     (unsigned long long)nblk, (unsigned long long)freed);
        }
        used = ns_bytes(e, ids, nids);
    }
    free(ids);
    if (used + need > quota) {
        char u[32];
        pf_format_size(used, u, sizeof(u));
        snprintf(err, errlen,
                 "tenant %s: RAM quota %s exceeded: %s resident (held by leases, loads or "
                 "transfers) and the save needs %s",
                 name, q, u, nd);
        refuse(tc, name, "quota");
        return -ENOSPC;
    }
    return 0;
out:
    pthread_rwlock_unlock(&tc->lk);
    return rc;
}

static void collect_ram(void *ctx, pf_metric_emit_fn emit, void *emit_ctx)
{
    struct pf_tenancy *tc = ctx;
    pthread_rwlock_rdlock(&tc->lk);
    for (size_t i = 0; tc->engine && i < tc->cur->n; i++) {
        size_t n = 0;
        uint32_t *ids = tenant_ns_ids(&tc->cur->t[i], &n);
        if (!ids)
            continue;
        const char *lv[1] = {tc->cur->t[i].name};
        emit(emit_ctx, lv, (double)ns_bytes(tc->engine, ids, n));
        free(ids);
    }
    pthread_rwlock_unlock(&tc->lk);
}

void pf_tenancy_attach(struct pf_tenancy *tc, struct pf_engine *e)
{
    tc->engine = e;
    struct pf_engine_quota q = {.check = quota_check, .ctx = tc};
    pf_engine_set_quota(e, &q);
    tc->m_ram = pf_metric_gauge_fn("pegaflow_tenant_ram_bytes",
                                   "Bytes of a tenant's blocks resident in the RAM pool", "tenant",
                                   collect_ram, tc);
}

/* pf_ssd_quota.lookup: the SSD quota of the tenant owning namespace id ns. */
static uint64_t ssd_lookup(void *ctx, uint32_t ns, uint32_t **ids_p, size_t *nids_p, char *tenant,
                           size_t tlen)
{
    struct pf_tenancy *tc = ctx;
    uint64_t quota = 0;
    pthread_rwlock_rdlock(&tc->lk);
    const struct pf_tenant *t = pf_tenants_by_namespace(tc->cur, pf_ns_name(ns));
    if (t && t->ssd_quota) {
        quota = t->ssd_quota;
        snprintf(tenant, tlen, "%s", t->name);
        *ids_p = tenant_ns_ids(t, nids_p);
    }
    pthread_rwlock_unlock(&tc->lk);
    return quota;
}

static void ssd_shed(void *ctx, const char *tenant, uint64_t blocks, uint64_t bytes)
{
    struct pf_tenancy *tc = ctx;
    pf_child_add(pf_metric_child1(tc->m_ssd_evict_blocks, tenant), (double)blocks);
    pf_child_add(pf_metric_child1(tc->m_ssd_evict_bytes, tenant), (double)bytes);
    pf_debug("tenant %s: dropped %llu block(s) (%llu bytes) from the SSD for its SSD quota", tenant,
             (unsigned long long)blocks, (unsigned long long)bytes);
}

static void ssd_refused(void *ctx, const char *tenant, uint64_t bytes)
{
    struct pf_tenancy *tc = ctx;
    (void)bytes;
    pf_child_add(pf_metric_child1(tc->m_ssd_refused, tenant), 1);
}

static void collect_ssd(void *ctx, pf_metric_emit_fn emit, void *emit_ctx)
{
    struct pf_tenancy *tc = ctx;
    pthread_rwlock_rdlock(&tc->lk);
    for (size_t i = 0; tc->ssd && i < tc->cur->n; i++) {
        size_t n = 0;
        uint32_t *ids = tenant_ns_ids(&tc->cur->t[i], &n);
        if (!ids)
            continue;
        uint64_t b = 0;
        for (size_t k = 0; k < n; k++)
            b += pf_ssd_ns_bytes(tc->ssd, ids[k]);
        const char *lv[1] = {tc->cur->t[i].name};
        emit(emit_ctx, lv, (double)b);
        free(ids);
    }
    pthread_rwlock_unlock(&tc->lk);
}

void pf_tenancy_attach_ssd(struct pf_tenancy *tc, struct pf_ssd *s)
{
    tc->ssd = s;
    struct pf_ssd_quota q = {
        .lookup = ssd_lookup, .shed = ssd_shed, .refused = ssd_refused, .ctx = tc};
    pf_ssd_set_quota(s, &q);
    tc->m_ssd = pf_metric_gauge_fn("pegaflow_tenant_ssd_bytes",
                                   "SSD bytes (record headers included) of a tenant's blocks the "
                                   "SSD index holds",
                                   "tenant", collect_ssd, tc);
}

int pf_tenancy_reload(struct pf_tenancy *tc, char *err, size_t errlen)
{
    struct pf_tenants *n;
    int rc = pf_tenants_load(tc->path, &n, err, errlen);
    if (rc) {
        pf_child_add(pf_metric_child1(tc->m_reloads, "error"), 1);
        pf_error("tenants: reload failed, the previous %s stays in force: %s", tc->path, err);
        return rc;
    }
    pthread_rwlock_wrlock(&tc->lk);
    struct pf_tenants *old = tc->cur;
    tc->cur = n;
    pthread_rwlock_unlock(&tc->lk);
    pf_tenants_free(old);
    pf_child_add(pf_metric_child1(tc->m_reloads, "ok"), 1);
    pf_info("tenants reloaded from %s: %zu tenant(s)", tc->path, n->n);
    return 0;
}

void pf_tenancy_destroy(struct pf_tenancy *tc)
{
    if (!tc)
        return;
    if (tc->engine)
        pf_engine_set_quota(tc->engine, NULL);
    if (tc->m_ram)
        pf_metric_gauge_fn_clear(tc->m_ram, tc);
    if (tc->ssd)
        pf_ssd_set_quota(tc->ssd, NULL); /* waits for a lookup in progress */
    if (tc->m_ssd)
        pf_metric_gauge_fn_clear(tc->m_ssd, tc);
    for (size_t i = 0; i < tc->nb; i++)
        free(tc->b[i].instance);
    free(tc->b);
    pf_tenants_free(tc->cur);
    pthread_rwlock_destroy(&tc->lk);
    pthread_mutex_destroy(&tc->bmu);
    pthread_mutex_destroy(&tc->regmu);
    free(tc->path);
    free(tc);
}

static struct binding *find_binding(struct pf_tenancy *tc, const char *instance)
{
    for (size_t i = 0; i < tc->nb; i++)
        if (strcmp(tc->b[i].instance, instance) == 0)
            return &tc->b[i];
    return NULL;
}

static bool instance_live(struct pf_engine *e, const char *instance)
{
    if (!e)
        return true; /* no engine to ask: treat the binding as live */
    char **ids = NULL;
    size_t n = pf_engine_list_instances(e, &ids);
    bool live = false;
    for (size_t i = 0; i < n; i++) {
        live = live || strcmp(ids[i], instance) == 0;
        free(ids[i]);
    }
    free(ids);
    return live;
}

int pf_tenancy_check(struct pf_tenancy *tc, enum pf_tenant_op op, const void *tok, size_t len,
                     const char *instance_id, const char *ns, char *tenant, char *err,
                     size_t errlen)
{
    char name[PF_TENANT_NAME_MAX + 1];
    pthread_rwlock_rdlock(&tc->lk);
    const struct pf_tenant *t = tok ? pf_tenants_by_token(tc->cur, tok, len) : NULL;
    if (t)
        snprintf(name, sizeof(name), "%s", t->name);
    bool allowed = t && pf_tenant_allows(t, ns);
    pthread_rwlock_unlock(&tc->lk);
    if (!t) {
        snprintf(err, errlen,
                 tok ? "tenant token not in --tenants-file (%s metadata)"
                     : "this server has --tenants-file: worker RPCs need a tenant token (%s "
                       "metadata; libpegaflow: PEGAFLOW_TENANT_TOKEN_FILE)",
                 PF_TENANT_MD);
        refuse(tc, "", tok ? "unknown_token" : "no_token");
        return -ENOKEY;
    }
    if (op == PF_TENANT_OP_REGISTER && !allowed) {
        snprintf(err, errlen, "namespace '%s' is not allowed for tenant %s", ns ? ns : "", name);
        refuse(tc, name, "namespace");
        return -EACCES;
    }
    if (op != PF_TENANT_OP_ANY) {
        const char *id = instance_id ? instance_id : "";
        pthread_mutex_lock(&tc->bmu);
        struct binding *b = find_binding(tc, id);
        char owner[PF_TENANT_NAME_MAX + 1] = "";
        if (b)
            snprintf(owner, sizeof(owner), "%s", b->tenant);
        pthread_mutex_unlock(&tc->bmu);
        bool mine = b && strcmp(owner, name) == 0;
        /* Register may take over an id whose instance is gone; everything else (Session
         * included: closing one may unregister the instance) needs the instance to be this
         * tenant's */
        /* (the engine is asked only for a Register of an id bound to another tenant: never
         * on the query path) */
        bool ok = mine || (op == PF_TENANT_OP_REGISTER && (!b || !instance_live(tc->engine, id)));
        if (!ok) {
            snprintf(err, errlen, "instance %s does not belong to tenant %s", id, name);
            refuse(tc, name, "instance");
            return -EACCES;
        }
    }
    if (tenant)
        snprintf(tenant, PF_TENANT_NAME_MAX + 1, "%s", name);
    return 0;
}

void pf_tenancy_bind(struct pf_tenancy *tc, const char *instance_id, const char *tenant)
{
    pthread_mutex_lock(&tc->bmu);
    struct binding *b = find_binding(tc, instance_id);
    if (!b && tc->nb == tc->capb) {
        /* drop bindings of instances that are gone before growing */
        size_t k = 0;
        for (size_t i = 0; i < tc->nb; i++) {
            if (instance_live(tc->engine, tc->b[i].instance))
                tc->b[k++] = tc->b[i];
            else
                free(tc->b[i].instance);
        }
        tc->nb = k;
        if (tc->nb == tc->capb) {
            size_t nc = tc->capb ? tc->capb * 2 : 16;
            struct binding *m = realloc(tc->b, nc * sizeof(*m));
            if (!m)
                goto out;
            tc->b = m;
            tc->capb = nc;
        }
    }
    if (!b) {
        char *id = strdup(instance_id);
        if (!id)
            goto out;
        b = &tc->b[tc->nb++];
        b->instance = id;
    }
    snprintf(b->tenant, sizeof(b->tenant), "%s", tenant);
out:
    pthread_mutex_unlock(&tc->bmu);
}

void pf_tenancy_count_hits(struct pf_tenancy *tc, const char *tenant, uint64_t hits)
{
    if (hits)
        pf_child_add(pf_metric_child1(tc->m_hits, tenant), (double)hits);
}

void pf_tenancy_register_lock(struct pf_tenancy *tc)
{
    pthread_mutex_lock(&tc->regmu);
}

void pf_tenancy_register_unlock(struct pf_tenancy *tc)
{
    pthread_mutex_unlock(&tc->regmu);
}

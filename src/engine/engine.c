/* Engine object: construction (pool, cache, leases, insert and GC threads), the evicting
 * allocator, eviction bookkeeping and the memory-cleanup admin operation. Request paths
 * live in save.c, query.c and load.c; instances in instance.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "engine"
#include "engine/engine_internal.h"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/common.h"
#include "pf/log.h"

static const double residence_buckets[] = {1,   5,    10,   30,   60,    120,   300,
                                           600, 1800, 3600, 7200, 21600, 43200, 86400};

static void init_metrics(struct pf_engine *e)
{
    e->m_alloc_fail = pf_metric_counter("pegaflow_pool_alloc_failures",
                                        "Pinned allocations that failed after eviction", NULL);
    e->m_inflight_bytes = pf_metric_gauge(
        "pegaflow_inflight_bytes", "Bytes of saved slots waiting for their block to seal", NULL);
    e->m_inflight_gc = pf_metric_counter("pegaflow_inflight_gc_cleaned",
                                         "Unsealed blocks dropped after the in-flight TTL", NULL);
    e->m_hits = pf_metric_counter("pegaflow_cache_block_hits",
                                  "Blocks hit by group-0 prefix queries (legacy)", NULL);
    e->m_misses = pf_metric_counter("pegaflow_cache_block_misses",
                                    "Blocks missed by group-0 prefix queries (legacy)", NULL);
    e->m_tier =
        pf_metric_counter("pegaflow_cache_tier_block_requests",
                          "Queried blocks by the tier that was chosen to serve them", "tier");
    e->m_evictions = pf_metric_counter("pegaflow_cache_block_evictions",
                                       "Blocks evicted from the RAM cache", NULL);
    e->m_evict_class = pf_metric_counter("pegaflow_cache_block_evictions_by_class",
                                         "Blocks evicted from the RAM cache by class", "class");
    e->m_evict_still_ref = pf_metric_counter(
        "pegaflow_cache_block_evictions_still_referenced",
        "Blocks removed by a memory cleanup while still referenced elsewhere", NULL);
    e->m_evict_queued = pf_metric_counter(
        "pegaflow_cache_block_evictions_ssd_queued",
        "Blocks evicted under pressure while still queued for their SSD write", NULL);
    e->m_reclaimed = pf_metric_counter("pegaflow_cache_eviction_reclaimed_bytes",
                                       "Pinned bytes returned to the pool by evictions", NULL);
    e->m_residence = pf_metric_histogram("pegaflow_cache_residence_duration_seconds",
                                         "Time blocks stayed resident before eviction", "reason",
                                         residence_buckets, PF_ARRAY_SIZE(residence_buckets));
    e->m_save_bytes = pf_metric_counter("pegaflow_save_bytes", "Bytes copied GPU -> host", NULL);
    e->m_load_bytes = pf_metric_counter("pegaflow_load_bytes", "Bytes copied host -> GPU", NULL);
    e->m_save_dur = pf_metric_histogram("pegaflow_save_duration_seconds",
                                        "Save RPC time (validation, allocation, D2H copy)", NULL,
                                        pf_buckets_io_seconds, pf_buckets_io_seconds_n);
    e->m_load_dur = pf_metric_histogram("pegaflow_load_duration_seconds",
                                        "Load time from submission to the end of the H2D copy",
                                        NULL, pf_buckets_io_seconds, pf_buckets_io_seconds_n);
    e->m_load_fail = pf_metric_counter("pegaflow_load_failures", "Loads that failed", NULL);
    e->m_load_cancelled =
        pf_metric_counter("pegaflow_load_cancelled",
                          "Loads stopped before a copy chunk because the client cancelled", NULL);
    pf_child_add(pf_metric_child1(e->m_tier, "ram"), 0);
    pf_child_add(pf_metric_child1(e->m_tier, "miss"), 0);
}

int pf_engine_add_tier(struct pf_engine *e, const struct pf_tier *t)
{
    if (e->ntiers == PF_MAX_TIERS)
        return -ENOSPC;
    if (!t->discover_start != !t->discover_finish || (t->discover_start && !t->discover))
        return -EINVAL; /* the two halves come together, and with discover */
    e->tiers[e->ntiers++] = *t;
    pf_child_add(pf_metric_child1(e->m_tier, t->name), 0);
    return 0;
}

int pf_engine_add_hooks(struct pf_engine *e, const struct pf_engine_hooks *h)
{
    if (e->nhooks == PF_MAX_HOOKS)
        return -ENOSPC;
    e->hooks[e->nhooks++] = *h;
    return 0;
}

void pf_engine_run_sealed_hooks(struct pf_engine *e, struct pf_block *const *b, size_t n)
{
    for (size_t i = 0; i < e->nhooks && n; i++)
        if (e->hooks[i].sealed)
            e->hooks[i].sealed(e->hooks[i].ctx, b, n);
}

static void run_evicted_hooks(struct pf_engine *e, struct pf_block *const *b, size_t n)
{
    for (size_t i = 0; i < e->nhooks && n; i++)
        if (e->hooks[i].evicted)
            e->hooks[i].evicted(e->hooks[i].ctx, b, n);
}

void pf_engine_evicted(struct pf_engine *e, struct pf_block **blocks, size_t n, const char *reason)
{
    run_evicted_hooks(e, blocks, n);
    uint64_t now = pf_now_ns();
    static const char *const cls[2] = {"retained", "reclaimable"};
    struct pf_metric_child *res = pf_metric_child1(e->m_residence, reason);
    bool pressure = strcmp(reason, "pressure") == 0;
    for (size_t i = 0; i < n; i++) {
        pf_child_observe(res, (double)pf_block_age_ns(blocks[i], now) / 1e9);
        if (pressure)
            pf_child_add(pf_metric_child1(e->m_evict_class, cls[blocks[i]->cls & 1]), 1);
    }
    if (pressure)
        pf_metric_add(e->m_evictions, (double)n);
    uint64_t before = pf_pool_used(e->pool);
    for (size_t i = 0; i < n; i++)
        pf_block_put(blocks[i]);
    uint64_t after = pf_pool_used(e->pool);
    if (before > after)
        pf_metric_add(e->m_reclaimed, (double)(before - after));
}

void pf_engine_set_quota(struct pf_engine *e, const struct pf_engine_quota *q)
{
    e->quota = q ? *q : (struct pf_engine_quota){0};
}

uint64_t pf_engine_evict_namespaces(struct pf_engine *e, const uint32_t *ns, size_t nns,
                                    uint64_t goal, uint64_t *nblocks_p)
{
    uint64_t freed = 0, nblocks = 0;
    struct pf_block *batch[64];
    pthread_mutex_lock(&e->evict_mu);
    while (freed < goal) {
        /* one block at a time while close to the goal: evict no more than needed */
        size_t want = goal - freed > (1u << 26) ? PF_ARRAY_SIZE(batch) : 1;
        size_t n = pf_cache_evict_ns(e->cache, ns, nns, want, batch, NULL);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++)
            freed += pf_block_footprint(batch[i]);
        nblocks += n;
        pf_engine_evicted(e, batch, n, "quota");
    }
    pthread_mutex_unlock(&e->evict_mu);
    if (nblocks_p)
        *nblocks_p = nblocks;
    return freed;
}

#define PF_ALLOC_FLUSH_MS 2000 /* bound of the wait for pending inserts on a full pool */

int pf_engine_alloc(struct pf_engine *e, uint64_t size, int numa, struct pf_alloc **a_p)
{
    int rc = pf_pool_alloc(e->pool, size, numa, a_p);
    if (rc != -ENOMEM)
        return rc;
    if (size > pf_pool_max_alloc(e->pool, numa)) {
        /* no eviction can make room: do not empty the cache trying */
        pf_metric_add(e->m_alloc_fail, 1);
        char sz[32], max[32];
        pf_format_size(size, sz, sizeof(sz));
        pf_format_size(pf_pool_max_alloc(e->pool, numa), max, sizeof(max));
        pf_log_ratelimited(PF_LOG_ERROR, 5000,
                           "cannot allocate %s of pinned memory in one piece: the largest pool "
                           "shard holds %s (fewer --pool-shards, or smaller saves per call)",
                           sz, max);
        return -ENOMEM;
    }
    struct pf_block *batch[512];
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            /* nothing evictable: blocks of earlier saves may still wait for the insert
             * thread (a Save answers before they are in the cache, where they become
             * evictable). Let it catch up, bounded, then try once more. Never called on the
             * insert thread (saves, SSD and peer fetches allocate). */
            pf_engine_flush(e, PF_ALLOC_FLUSH_MS);
        }
        pthread_mutex_lock(&e->evict_mu);
        for (;;) {
            rc = pf_pool_alloc(e->pool, size, numa, a_p);
            if (rc != -ENOMEM)
                break;
            size_t skipped = 0;
            /* blocks still queued for their SSD write go last: evicting one drops its write
             * (the writer finds it freed), so only when nothing else is left */
            size_t n = pf_cache_evict_sparing(e->cache, PF_ARRAY_SIZE(batch), batch, &skipped);
            if (n == 0) {
                n = pf_cache_evict(e->cache, PF_ARRAY_SIZE(batch), batch, &skipped);
                pf_metric_add(e->m_evict_queued, (double)n);
            }
            if (n == 0)
                break;
            total += n;
            pf_engine_evicted(e, batch, n, "pressure");
        }
        pthread_mutex_unlock(&e->evict_mu);
        if (rc != -ENOMEM)
            break;
    }
    if (rc == -ENOMEM) {
        pf_metric_add(e->m_alloc_fail, 1);
        char sz[32], cap[32], used[32];
        pf_format_size(size, sz, sizeof(sz));
        pf_format_size(pf_pool_capacity(e->pool), cap, sizeof(cap));
        pf_format_size(pf_pool_used(e->pool), used, sizeof(used));
        pf_log_ratelimited(PF_LOG_ERROR, 5000,
                           "pinned pool exhausted: cannot allocate %s (%s of %s in use, "
                           "nothing left to evict)",
                           sz, used, cap);
    } else if (total) {
        pf_debug("evicted %zu block(s) to allocate %llu bytes", total, (unsigned long long)size);
    }
    return rc;
}

void pf_engine_cleanup_memory(struct pf_engine *e, struct pf_engine_cleanup_result *r)
{
    memset(r, 0, sizeof(*r));
    pf_lease_sweep(e->leases);
    struct pf_block **all = NULL;
    uint64_t before = pf_pool_used(e->pool);
    size_t n = pf_cache_remove_all(e->cache, &all);
    run_evicted_hooks(e, all, n);
    uint64_t now = pf_now_ns();
    struct pf_metric_child *res = pf_metric_child1(e->m_residence, "cleanup");
    for (size_t i = 0; i < n; i++) {
        r->evicted_bytes += pf_block_footprint(all[i]);
        if (pf_block_strong(all[i]) > 1)
            r->still_referenced_blocks++;
        pf_child_observe(res, (double)pf_block_age_ns(all[i], now) / 1e9);
        pf_block_put(all[i]);
    }
    free(all);
    uint64_t after = pf_pool_used(e->pool);
    r->evicted_blocks = n;
    r->reclaimed_bytes = before > after ? before - after : 0;
    pf_metric_add(e->m_evict_still_ref, (double)r->still_referenced_blocks);
    pf_info("memory cleanup: %llu block(s), %llu bytes evicted, %llu bytes reclaimed, %llu "
            "still referenced",
            (unsigned long long)r->evicted_blocks, (unsigned long long)r->evicted_bytes,
            (unsigned long long)r->reclaimed_bytes, (unsigned long long)r->still_referenced_blocks);
}

/* Background GC: leases every 30 s; prefetch tasks older than 5 min every 60 s. */
static void *gc_main(void *arg)
{
    struct pf_engine *e = arg;
    unsigned tick = 0;
    pthread_mutex_lock(&e->gc_mu);
    while (!e->stopping) {
        struct timespec dl = pf_deadline_ms(PF_GC_TICK_MS);
        pthread_cond_timedwait(&e->gc_cv, &e->gc_mu, &dl);
        if (e->stopping)
            break;
        pthread_mutex_unlock(&e->gc_mu);
        if (++tick % 6 == 0)
            pf_lease_sweep(e->leases);
        pf_prefetch_gc(e, 300 * PF_NS_PER_SEC, NULL);
        pthread_mutex_lock(&e->gc_mu);
    }
    pthread_mutex_unlock(&e->gc_mu);
    return NULL;
}

struct pf_pool *pf_engine_pool(struct pf_engine *e)
{
    return e->pool;
}

struct pf_cache *pf_engine_cache(struct pf_engine *e)
{
    return e->cache;
}

int pf_engine_create(const struct pf_engine_config *cfg, struct pf_engine **e_p, char *err,
                     size_t errlen)
{
    struct pf_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->cfg = *cfg;
    if (!e->cfg.lease_ttl_ns)
        e->cfg.lease_ttl_ns = 600 * PF_NS_PER_SEC;
    if (!e->cfg.inflight_ttl_ns)
        e->cfg.inflight_ttl_ns = 300 * PF_NS_PER_SEC;
    if (!e->cfg.copy_timeout_ms)
        e->cfg.copy_timeout_ms = 60000;
    if (!e->cfg.save_chunk_bytes)
        e->cfg.save_chunk_bytes = PF_SAVE_CHUNK_BYTES;
    if (!e->cfg.load_chunk_bytes)
        e->cfg.load_chunk_bytes = PF_XFER_CHUNK_BYTES;
    if (!e->cfg.version)
        e->cfg.version = PF_VERSION;
    e->gpu = cfg->gpu;
    pthread_rwlock_init(&e->inst_lock, NULL);
    pthread_mutex_init(&e->sess_mu, NULL);
    pthread_mutex_init(&e->gc_mu, NULL);
    pthread_mutex_init(&e->evict_mu, NULL);
    pf_cond_init(&e->gc_cv);
    init_metrics(e);

    /* NUMA regions where the GPUs are */
    int nodes[64];
    size_t nn = 0;
    int ndev = pf_gpu_device_count(e->gpu);
    for (int i = 0; i < ndev && nn < 64; i++) {
        struct pf_gpu_dev_info info;
        if (pf_gpu_device_info(e->gpu, i, &info) == 0 && info.numa_node >= 0)
            nodes[nn++] = info.numa_node;
    }
    struct pf_pool_config pc = {
        .size = cfg->pool_size,
        .hint = cfg->hint_value_size,
        .hugepages = cfg->use_hugepages,
        .numa_affinity = cfg->numa_affinity,
        .numa_nodes = nn ? nodes : NULL,
        .nnuma_nodes = nn,
        .shards = cfg->pool_shards,
        .gpu = cfg->gpu,
        .skip_memcheck = cfg->skip_memcheck,
    };
    int rc = pf_pool_create(&pc, &e->pool, err, errlen);
    if (rc)
        goto err_free;
    struct pf_cache_config cc = {0};
    if (cfg->lfu_admission) {
        uint64_t per = cfg->hint_value_size ? cfg->hint_value_size : (128ull << 20);
        cc.lfu_items = cfg->pool_size / per ? cfg->pool_size / per : 1;
    }
    rc = pf_cache_create(&cc, &e->cache);
    if (rc) {
        snprintf(err, errlen, "cannot create the RAM cache: %s", strerror(-rc));
        goto err_pool;
    }
    rc = pf_hll_set_create(cfg->hll_windows ? cfg->hll_windows : "15m,1h,1d",
                           cfg->hll_bits ? cfg->hll_bits : 16, cfg->clock, &e->hll);
    if (rc) {
        snprintf(err, errlen, "--metric-hll-windows/--metric-hll-bucket-bits: %s", strerror(-rc));
        goto err_cache;
    }
    rc = pf_lease_table_create(e->cfg.clock, e->cfg.lease_ttl_ns, &e->leases);
    if (rc) {
        snprintf(err, errlen, "cannot create the lease table: %s", strerror(-rc));
        goto err_cache;
    }
    rc = pf_insert_start(e);
    if (rc) {
        snprintf(err, errlen, "cannot start the insert thread: %s", strerror(-rc));
        goto err_leases;
    }
    rc = pf_prefetch_start(e);
    if (rc) {
        snprintf(err, errlen, "cannot start the prefetch threads: %s", strerror(-rc));
        goto err_insert;
    }
    rc = pf_thread_start(&e->gc_thr, "pegaflow-gc", -1, gc_main, e);
    if (rc) {
        snprintf(err, errlen, "cannot start the GC thread: %s", strerror(-rc));
        goto err_prefetch;
    }
    *e_p = e;
    return 0;
err_prefetch:
    pf_prefetch_stop(e);
err_insert:
    pf_insert_stop(e);
err_leases:
    pf_lease_table_destroy(e->leases);
err_cache:
    pf_hll_set_destroy(e->hll);
    pf_cache_destroy(e->cache);
err_pool:
    pf_pool_destroy(e->pool);
err_free:
    free(e);
    return rc;
}

int pf_engine_health(struct pf_engine *e, char *why, size_t whylen)
{
    return pf_gpu_health(e->gpu, why, whylen);
}

void pf_engine_destroy(struct pf_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->gc_mu);
    e->stopping = true;
    pthread_cond_broadcast(&e->gc_cv);
    pthread_mutex_unlock(&e->gc_mu);
    pthread_join(e->gc_thr, NULL);
    /* instances first: their copy threads drain and close the GPU mappings */
    char **ids = NULL;
    size_t n = pf_engine_list_instances(e, &ids);
    for (size_t i = 0; i < n; i++) {
        pf_engine_remove_instance(e, ids[i], NULL);
        free(ids[i]);
    }
    free(ids);
    pf_prefetch_stop(e);
    pf_insert_stop(e);
    pf_lease_table_destroy(e->leases);
    pf_cache_destroy(e->cache);
    pf_hll_set_destroy(e->hll);
    for (size_t i = 0; i < e->nsessions; i++)
        free(e->sessions[i].instance);
    free(e->sessions);
    free(e->insts);
    uint64_t used = pf_pool_used(e->pool);
    if (used)
        pf_warn("%llu pinned bytes still referenced at shutdown", (unsigned long long)used);
    else
        pf_pool_destroy(e->pool);
    pthread_rwlock_destroy(&e->inst_lock);
    pthread_mutex_destroy(&e->sess_mu);
    pthread_mutex_destroy(&e->gc_mu);
    pthread_mutex_destroy(&e->evict_mu);
    pthread_cond_destroy(&e->gc_cv);
    free(e);
}

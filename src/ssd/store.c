/* The SSD store: shard files, the index lock, the bounded write and prefetch queues, the
 * engine wiring (tier + sealed hook) and the SSD metrics.
 *
 * Locks (never nested except budget_mu alone): mu guards the index and the rings (the
 * writer, the reader, probe and fetch hold it for lookups only, never across I/O); wq_mu
 * the write queue and flush sequence; rq_mu the prefetch queue and batch completion;
 * budget_mu the prefetch budget. Threads: one writer and one reader, each owning one BLK
 * queue; the engine's insert thread offers, its query threads probe and its prefetch
 * threads fetch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "ssd"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/engine.h"
#include "pf/log.h"
#include "pf/thread.h"
#include "ssd/ssd_internal.h"

#define SSD_DEFAULT_TIMEOUT_MS 30000

static const double tput_buckets[] = {1e7, 5e7, 1e8,    2.5e8,  5e8,    1e9, 2e9,
                                      4e9, 8e9, 1.6e10, 2.4e10, 3.2e10, 4e10};

void ssd_metrics_init(struct ssd_metrics *m)
{
    m->r_blocks = pf_metric_gauge("pegaflow_ssd_recovered_blocks",
                                  "Blocks the recovery scan put back in the SSD index (net of "
                                  "those since replaced or dropped for their geometry)",
                                  NULL);
    m->r_bytes =
        pf_metric_gauge("pegaflow_ssd_recovered_bytes",
                        "Payload bytes of the blocks in pegaflow_ssd_recovered_blocks", NULL);
    m->r_scanned = pf_metric_gauge("pegaflow_ssd_recovery_scanned_bytes",
                                   "Bytes of the SSD files the recovery scan has read", NULL);
    m->r_total = pf_metric_gauge("pegaflow_ssd_recovery_scan_bytes",
                                 "Bytes of the SSD files the recovery scan reads in all (0: "
                                 "nothing to recover)",
                                 NULL);
    m->r_seconds = pf_metric_gauge("pegaflow_ssd_recovery_seconds",
                                   "Seconds from start-up to the end of the recovery scan", NULL);
    m->r_state =
        pf_metric_gauge("pegaflow_ssd_recovery_state",
                        "Recovery scan: 1 scanning, 2 finished (or nothing to scan)", NULL);
    struct pf_metric *drop = pf_metric_counter(
        "pegaflow_ssd_recovery_dropped_records",
        "SSD records the recovery scan (or a later geometry check) did not index, by reason",
        "reason");
    for (int r = 0; r < SSD_DROP_NREASONS; r++)
        m->r_drop[r] = pf_metric_child1(drop, ssd_drop_reason[r]);
    m->w_bytes =
        pf_metric_counter("pegaflow_ssd_write_bytes", "Bytes written to the SSD cache", NULL);
    m->w_blocks = pf_metric_counter("pegaflow_ssd_write_blocks",
                                    "Block records written to the SSD cache and committed", NULL);
    m->w_fail = pf_metric_counter("pegaflow_ssd_write_failures",
                                  "Block writes to the SSD cache that failed", NULL);
    m->w_qfull = pf_metric_counter("pegaflow_ssd_write_queue_full",
                                   "Sealed-block batches dropped because the SSD write queue "
                                   "was full",
                                   NULL);
    m->w_pending = pf_metric_gauge("pegaflow_ssd_write_queue_pending",
                                   "Blocks offered to the SSD writer and not yet placed", NULL);
    m->w_inflight = pf_metric_gauge(
        "pegaflow_ssd_write_inflight",
        "Block writes placed and not yet committed (in flight or waiting for a request)", NULL);
    m->w_tput = pf_metric_histogram("pegaflow_ssd_write_throughput_bytes_per_second",
                                    "Throughput of each block write to the SSD", NULL, tput_buckets,
                                    PF_ARRAY_SIZE(tput_buckets));
    m->p_staging = pf_metric_gauge("pegaflow_ssd_prefetch_staging_bytes",
                                   "Staging memory of SSD prefetch reads not yet handed to their "
                                   "fetch (at most --ssd-prefetch-staging)",
                                   NULL);
    m->p_staging_limited =
        pf_metric_counter("pegaflow_ssd_prefetch_staging_limited_blocks",
                          "Committed SSD blocks left out of a prefetch because its staging "
                          "would exceed --ssd-prefetch-staging (a shorter run is returned)",
                          NULL);
    m->p_bytes = pf_metric_counter("pegaflow_ssd_prefetch_bytes",
                                   "Bytes prefetched from the SSD cache and accepted", NULL);
    m->p_success = pf_metric_counter("pegaflow_ssd_prefetch_success",
                                     "Blocks prefetched from the SSD cache and accepted", NULL);
    m->p_fail = pf_metric_counter("pegaflow_ssd_prefetch_failures",
                                  "Reserved SSD prefetch blocks not delivered (I/O error, short "
                                  "read, overwritten, checksum mismatch, staging failure, "
                                  "queue full, after a gap)",
                                  NULL);
    m->p_qfull = pf_metric_counter("pegaflow_ssd_prefetch_queue_full",
                                   "SSD prefetch batches refused because the queue was full", NULL);
    m->p_backpressure =
        pf_metric_counter("pegaflow_ssd_prefetch_backpressure_blocks",
                          "Committed SSD blocks not prefetched because --max-prefetch-blocks "
                          "was exhausted",
                          NULL);
    m->p_inflight =
        pf_metric_gauge("pegaflow_ssd_prefetch_inflight",
                        "SSD read requests in flight (each up to --ssd-read-merge blocks)", NULL);
    m->p_tput = pf_metric_histogram("pegaflow_ssd_prefetch_throughput_bytes_per_second",
                                    "Throughput of each SSD read request with an accepted block",
                                    NULL, tput_buckets, PF_ARRAY_SIZE(tput_buckets));
    struct pf_metric *integ = pf_metric_counter(
        "pegaflow_integrity_failures_total",
        "Blocks whose checksum did not verify after a read or fetch (treated as misses)", "tier");
    m->integrity = pf_metric_child1(integ, "ssd");
}

double ssd_rate(uint64_t bytes, uint64_t ns)
{
    return (double)bytes * 1e9 / (double)(ns ? ns : 1);
}

/* ---- files ---- */

static int shard_paths(struct pf_ssd *s, char *err, size_t errlen)
{
    const struct pf_ssd_config *c = &s->cfg;
    s->paths = calloc(s->nshards, sizeof(*s->paths));
    if (!s->paths)
        return -ENOMEM;
    for (size_t p = 0; p < c->npaths; p++) {
        if (!c->paths[p] || !*c->paths[p]) {
            snprintf(err, errlen, "--ssd-cache-path: empty path");
            return -EINVAL;
        }
        for (size_t q = 0; q < p; q++)
            if (strcmp(c->paths[p], c->paths[q]) == 0) {
                snprintf(err, errlen, "--ssd-cache-path %s: given twice", c->paths[p]);
                return -EINVAL;
            }
        for (uint32_t l = 0; l < c->shards_per_path; l++) {
            uint32_t id = (uint32_t)p * c->shards_per_path + l;
            char buf[4096];
            if (s->nshards == 1) {
                snprintf(buf, sizeof(buf), "%s", c->paths[p]);
            } else {
                size_t n = strlen(c->paths[p]);
                bool slash = n > 0 && c->paths[p][n - 1] == '/';
                snprintf(buf, sizeof(buf), "%s%sshard-%06u.dat", c->paths[p], slash ? "" : "/", id);
            }
            s->paths[id] = strdup(buf);
            if (!s->paths[id])
                return -ENOMEM;
        }
    }
    return 0;
}

static const char *open_reason(int rc)
{
    switch (rc) {
    case -ENOSPC:
        return "capacity exceeds the free space of its file system";
    case -EINVAL:
        return "the file system does not support O_DIRECT I/O (or the path is not a regular file)";
    case -ENOENT:
    case -EACCES:
    case -EPERM:
    case -ENOTDIR:
    case -EROFS:
    case -EISDIR:
        return "cannot create or open the file";
    default:
        return "cannot open the file";
    }
}

static int open_files(struct pf_ssd *s, char *err, size_t errlen)
{
    s->files = calloc(s->nshards, sizeof(*s->files));
    if (!s->files)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->nshards; i++) {
        int rc = pf_blk_file_open(s->cfg.blk, s->paths[i], s->shard_cap, PF_BLK_OPEN_CREATE,
                                  &s->files[i]);
        if (rc) {
            snprintf(err, errlen, "--ssd-cache-path %s: %s (%s)", s->paths[i], open_reason(rc),
                     strerror(-rc));
            return rc;
        }
    }
    return 0;
}

/* ---- lifecycle ---- */

static void defaults(struct pf_ssd_config *c)
{
    if (!c->shards_per_path)
        c->shards_per_path = 1;
    if (!c->write_queue_depth)
        c->write_queue_depth = 8;
    if (!c->prefetch_queue_depth)
        c->prefetch_queue_depth = 2;
    if (!c->write_inflight)
        c->write_inflight = 2;
    if (!c->write_merge)
        c->write_merge = 8;
    if (c->write_merge > 64)
        c->write_merge = 64;
    if (!c->prefetch_inflight)
        c->prefetch_inflight = 16;
    if (!c->read_merge)
        c->read_merge = 8;
    if (c->read_merge > 64)
        c->read_merge = 64;
    if (!c->max_prefetch_blocks)
        c->max_prefetch_blocks = 800;
    if (!c->prefetch_staging_bytes)
        c->prefetch_staging_bytes = 1ull << 30;
}

static void log_config(const struct pf_ssd *s, const char *backend)
{
    char cap[32], shard[32];
    pf_format_size(s->cfg.capacity, cap, sizeof(cap));
    pf_format_size(s->shard_cap, shard, sizeof(shard));
    pf_info("SSD cache: %s in %u shard(s) of %s (%zu path(s) x %u), BLK backend %s, O_DIRECT", cap,
            s->nshards, shard, s->cfg.npaths, s->cfg.shards_per_path, backend);
    for (uint32_t i = 0; i < s->nshards; i++)
        pf_info("  shard %u: %s", i, s->paths[i]);
    pf_info("SSD cache: write queue %u batch(es), %u write(s) in flight of up to %u record(s); "
            "prefetch queue %u batch(es), %u read(s) in flight of up to %u record(s), max %u "
            "prefetching block(s), "
            "staging at most %llu bytes; integrity %s; I/O timeout %llu ms",
            s->cfg.write_queue_depth, s->cfg.write_inflight, s->cfg.write_merge,
            s->cfg.prefetch_queue_depth, s->cfg.prefetch_inflight, s->cfg.read_merge,
            s->cfg.max_prefetch_blocks, (unsigned long long)s->cfg.prefetch_staging_bytes,
            s->cfg.integrity ? "checked" : "off", (unsigned long long)s->io_timeout_ms);
    pf_info("SSD cache: recovery %s", s->cfg.recover
                                          ? "on (the index is rebuilt from the files)"
                                          : "off (--ssd-recover off: files start empty)");
}

static void destroy_sync(struct pf_ssd *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->wq_mu);
    pthread_mutex_destroy(&s->rq_mu);
    pthread_mutex_destroy(&s->budget_mu);
    pthread_cond_destroy(&s->wq_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->rq_cv);
    pthread_cond_destroy(&s->rdone_cv);
    pthread_mutex_destroy(&s->scan_mu);
    pthread_mutex_destroy(&s->quota_mu);
    pthread_cond_destroy(&s->scan_cv);
}

int pf_ssd_create(const struct pf_ssd_config *cfg, struct pf_ssd **s_p, char *err, size_t errlen)
{
    if (!cfg->blk || !cfg->paths || cfg->npaths == 0) {
        snprintf(err, errlen, "SSD cache: no path or no BLK backend");
        return -EINVAL;
    }
    struct pf_ssd *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->cfg = *cfg;
    defaults(&s->cfg);
    s->io_timeout_ms = cfg->io_timeout_ms ? cfg->io_timeout_ms : SSD_DEFAULT_TIMEOUT_MS;
    uint64_t nshards = (uint64_t)s->cfg.npaths * s->cfg.shards_per_path;
    int rc = -EINVAL;
    if (nshards > 1u << 20) {
        snprintf(err, errlen, "SSD cache: %llu shards is too many", (unsigned long long)nshards);
        goto err_free;
    }
    s->nshards = (uint32_t)nshards;
    s->shard_cap = s->cfg.capacity / s->nshards / PF_BLK_ALIGN * PF_BLK_ALIGN;
    if (s->shard_cap <= SSD_SB_SIZE) {
        snprintf(err, errlen,
                 "--ssd-cache-capacity %llu bytes is too small for %u shard(s) of more than %u "
                 "bytes",
                 (unsigned long long)s->cfg.capacity, s->nshards, SSD_SB_SIZE);
        goto err_free;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->wq_mu, NULL);
    pthread_mutex_init(&s->rq_mu, NULL);
    pthread_mutex_init(&s->budget_mu, NULL);
    pf_cond_init(&s->wq_cv);
    pf_cond_init(&s->done_cv);
    pf_cond_init(&s->rq_cv);
    pf_cond_init(&s->rdone_cv);
    pthread_mutex_init(&s->scan_mu, NULL);
    pthread_mutex_init(&s->quota_mu, NULL);
    pf_cond_init(&s->scan_cv);
    s->budget.max = s->cfg.max_prefetch_blocks;
    atomic_init(&s->next_io_id, 1);
    ssd_metrics_init(&s->m);
    rc = shard_paths(s, err, errlen);
    if (rc)
        goto err_paths;
    rc = open_files(s, err, errlen);
    if (rc)
        goto err_files;
    rc = ssd_format_open(s, err, errlen);
    if (rc)
        goto err_files;
    rc = ssd_index_init(&s->idx, s->nshards, s->shard_cap - SSD_SB_SIZE, SSD_SB_SIZE);
    if (rc) {
        snprintf(err, errlen, "SSD cache: cannot create the index: %s", strerror(-rc));
        goto err_files;
    }
    s->wq_cap = s->cfg.write_queue_depth;
    s->rq_cap = s->cfg.prefetch_queue_depth;
    s->wq = calloc(s->wq_cap, sizeof(*s->wq));
    s->rq = calloc(s->rq_cap, sizeof(*s->rq));
    rc = -ENOMEM;
    if (!s->wq || !s->rq) {
        snprintf(err, errlen, "SSD cache: out of memory");
        goto err_index;
    }
    unsigned wdepth = PF_MIN_OF(4096u, s->cfg.write_inflight * 4u + 4u);
    unsigned rdepth = PF_MIN_OF(4096u, s->cfg.prefetch_inflight * 4u + 4u);
    rc = pf_blk_queue_create(s->cfg.blk, wdepth, &s->wqueue);
    if (rc == 0)
        rc = pf_blk_queue_create(s->cfg.blk, rdepth, &s->rqueue);
    if (rc) {
        snprintf(err, errlen, "SSD cache: cannot create an I/O queue: %s", strerror(-rc));
        goto err_queues;
    }
    rc = pf_thread_start(&s->writer, "pegaflow-ssdw", -1, ssd_writer_main, s);
    if (rc) {
        snprintf(err, errlen, "SSD cache: cannot start the writer thread: %s", strerror(-rc));
        goto err_queues;
    }
    s->writer_started = true;
    rc = pf_thread_start(&s->reader, "pegaflow-ssdr", -1, ssd_reader_main, s);
    if (rc) {
        snprintf(err, errlen, "SSD cache: cannot start the reader thread: %s", strerror(-rc));
        goto err_writer;
    }
    s->reader_started = true;
    log_config(s, s->cfg.blk->ops->name);
    rc = ssd_recover_start(s, err, errlen);
    if (rc)
        goto err_reader;
    *s_p = s;
    return 0;
err_reader:
    pthread_mutex_lock(&s->rq_mu);
    s->r_stop = true;
    pthread_cond_broadcast(&s->rq_cv);
    pthread_mutex_unlock(&s->rq_mu);
    pthread_join(s->reader, NULL);
err_writer:
    atomic_store(&s->stopped, true);
    pthread_mutex_lock(&s->wq_mu);
    s->w_stop = true;
    pthread_cond_broadcast(&s->wq_cv);
    pthread_mutex_unlock(&s->wq_mu);
    pthread_join(s->writer, NULL); /* destroys wqueue */
err_queues:
    pf_blk_queue_destroy(s->wqueue);
    pf_blk_queue_destroy(s->rqueue);
err_index:
    free(s->wq);
    free(s->rq);
    ssd_index_destroy(&s->idx);
err_files:
    for (uint32_t i = 0; s->files && i < s->nshards; i++)
        pf_blk_file_close(s->files[i]);
    free(s->files);
    free(s->sb);
    free(s->need_scan);
err_paths:
    for (uint32_t i = 0; s->paths && i < s->nshards; i++)
        free(s->paths[i]);
    free(s->paths);
    destroy_sync(s);
err_free:
    free(s);
    return rc;
}

void pf_ssd_stop(struct pf_ssd *s)
{
    if (!s || atomic_exchange(&s->stopped, true))
        return;
    pthread_mutex_lock(&s->wq_mu);
    s->w_stop = true;
    pthread_cond_broadcast(&s->wq_cv);
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->wq_mu);
    pthread_mutex_lock(&s->rq_mu);
    s->r_stop = true;
    pthread_cond_broadcast(&s->rq_cv);
    pthread_mutex_unlock(&s->rq_mu);
    ssd_recover_stop(s);
    if (s->writer_started)
        pthread_join(s->writer, NULL);
    if (s->reader_started)
        pthread_join(s->reader, NULL);
    s->writer_started = s->reader_started = false;
    pf_info("SSD cache stopped (%llu committed block(s) on disk)",
            (unsigned long long)s->idx.ncommitted);
}

void pf_ssd_destroy(struct pf_ssd *s)
{
    if (!s)
        return;
    pf_ssd_stop(s);
    ssd_index_destroy(&s->idx);
    for (uint32_t i = 0; i < s->nshards; i++) {
        pf_blk_file_close(s->files[i]);
        free(s->paths[i]);
    }
    free(s->files);
    free(s->paths);
    free(s->sb);
    free(s->need_scan);
    free(s->fps);
    free(s->wq);
    free(s->rq);
    destroy_sync(s);
    free(s);
}

/* ---- write side ---- */

int pf_ssd_offer(struct pf_ssd *s, struct pf_block *const *blocks, size_t n)
{
    if (n == 0)
        return 0;
    if (atomic_load(&s->stopped))
        return -ESHUTDOWN;
    struct ssd_wbatch *b = malloc(sizeof(*b) + n * sizeof(b->b[0]));
    if (!b) {
        pf_log_ratelimited(PF_LOG_WARN, 5000, "out of memory offering blocks to the SSD writer");
        return -ENOMEM;
    }
    b->n = n;
    for (size_t i = 0; i < n; i++) {
        b->b[i] = blocks[i];
        pf_block_weak_get(blocks[i]);
    }
    int rc = 0;
    pthread_mutex_lock(&s->wq_mu);
    if (s->w_stop) {
        rc = -ESHUTDOWN;
    } else if (s->wq_count == s->wq_cap) {
        rc = -EAGAIN;
    } else {
        b->seq = ++s->seq_enq;
        s->wq[(s->wq_head + s->wq_count) % s->wq_cap] = b;
        s->wq_count++;
        pf_metric_add(s->m.w_pending, (double)n);
        pthread_cond_signal(&s->wq_cv);
    }
    pthread_mutex_unlock(&s->wq_mu);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            pf_block_weak_put(blocks[i]);
        free(b);
        if (rc == -EAGAIN) {
            pf_metric_add(s->m.w_qfull, 1);
            pf_log_ratelimited(PF_LOG_DEBUG, 5000,
                               "SSD write queue full: %zu sealed block(s) not written", n);
        }
    }
    return rc;
}

int pf_ssd_flush(struct pf_ssd *s, uint64_t timeout_ms)
{
    int rc = 0;
    struct timespec dl = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&s->wq_mu);
    uint64_t target = s->seq_enq;
    while (s->seq_done < target && !s->w_stop)
        if (pthread_cond_timedwait(&s->done_cv, &s->wq_mu, &dl) == ETIMEDOUT &&
            s->seq_done < target) {
            rc = -ETIMEDOUT;
            break;
        }
    if (s->w_stop)
        rc = -ESHUTDOWN;
    pthread_mutex_unlock(&s->wq_mu);
    return rc;
}

int pf_ssd_drain(struct pf_ssd *s, uint64_t timeout_ms)
{
    if (!s || atomic_load(&s->stopped))
        return -ESHUTDOWN;
    uint64_t t0 = pf_now_ns(), dl = t0 + timeout_ms * PF_NS_PER_MS;
    int rc = 0;
    if (s->engine)
        rc = pf_engine_flush(s->engine, timeout_ms);
    pthread_mutex_lock(&s->wq_mu);
    uint64_t pending = s->seq_enq - s->seq_done;
    pthread_mutex_unlock(&s->wq_mu);
    uint64_t now = pf_now_ns();
    if (rc == 0 || rc == -ETIMEDOUT)
        rc = pf_ssd_flush(s, now < dl ? (dl - now) / PF_NS_PER_MS : 0);
    double ms = (double)(pf_now_ns() - t0) / 1e6;
    if (rc == 0)
        pf_info("SSD drain: %llu pending batch(es) written in %.0f ms", (unsigned long long)pending,
                ms);
    else
        pf_warn("SSD drain: %s after %.0f ms (bound %llu ms): what is not written is not "
                "recovered by the next start",
                strerror(-rc), ms, (unsigned long long)timeout_ms);
    return rc;
}

/* ---- read side ---- */

size_t pf_ssd_probe(struct pf_ssd *s, const struct pf_block_key *keys, size_t n)
{
    if (atomic_load(&s->stopped))
        return 0;
    pthread_mutex_lock(&s->mu);
    size_t c = ssd_index_prefix(&s->idx, keys, n);
    pthread_mutex_unlock(&s->mu);
    return c;
}

void pf_ssd_set_promoted(struct pf_ssd *s, pf_ssd_promoted_fn fn, void *ctx)
{
    s->promoted_fn = fn;
    s->promoted_ctx = ctx;
}

void ssd_quota_enforce_all(struct pf_ssd *s)
{
    pthread_mutex_lock(&s->mu);
    uint32_t nns = s->idx.nns;
    pthread_mutex_unlock(&s->mu);
    for (uint32_t ns = 0; ns < nns && !atomic_load(&s->stopped); ns++) {
        if (pf_ssd_ns_bytes(s, ns) == 0)
            continue;
        uint32_t *ids = NULL;
        size_t nids = 0;
        char tenant[128] = "";
        uint64_t quota = 0;
        pthread_mutex_lock(&s->quota_mu);
        if (s->quota.lookup)
            quota = s->quota.lookup(s->quota.ctx, ns, &ids, &nids, tenant, sizeof(tenant));
        pthread_mutex_unlock(&s->quota_mu);
        if (!quota || !ids) {
            free(ids);
            continue;
        }
        uint64_t bytes = 0;
        pthread_mutex_lock(&s->mu);
        uint64_t n = ssd_index_shed(&s->idx, ids, nids, quota, &bytes);
        pthread_mutex_unlock(&s->mu);
        free(ids);
        if (!n)
            continue;
        pthread_mutex_lock(&s->quota_mu);
        if (s->quota.shed)
            s->quota.shed(s->quota.ctx, tenant, n, bytes);
        pthread_mutex_unlock(&s->quota_mu);
        pf_info("SSD: tenant %s: %llu recovered block(s) (%llu bytes) over its SSD quota dropped "
                "from the index",
                tenant, (unsigned long long)n, (unsigned long long)bytes);
    }
}

void pf_ssd_set_quota(struct pf_ssd *s, const struct pf_ssd_quota *q)
{
    pthread_mutex_lock(&s->quota_mu);
    if (q)
        s->quota = *q;
    else
        memset(&s->quota, 0, sizeof(s->quota));
    pthread_mutex_unlock(&s->quota_mu);
    if (!q)
        return;
    /* the recovered records are held to the quotas once the scan is done (by the scan when
     * it finishes after this) */
    pthread_mutex_lock(&s->scan_mu);
    bool done = s->scan_done;
    pthread_mutex_unlock(&s->scan_mu);
    if (done)
        ssd_quota_enforce_all(s);
}

uint64_t pf_ssd_ns_bytes(struct pf_ssd *s, uint32_t ns)
{
    pthread_mutex_lock(&s->mu);
    uint64_t b = ssd_index_ns_bytes(&s->idx, ns);
    pthread_mutex_unlock(&s->mu);
    return b;
}

void pf_ssd_stats(struct pf_ssd *s, struct pf_ssd_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->shards = s->nshards;
    st->shard_capacity = s->shard_cap;
    pthread_mutex_lock(&s->mu);
    st->writing = s->idx.nwriting;
    st->committed = s->idx.ncommitted;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->scan_mu);
    st->recovery_done = s->scan_done;
    pthread_mutex_unlock(&s->scan_mu);
    pthread_mutex_lock(&s->budget_mu);
    st->prefetch_reserved = s->budget.used;
    pthread_mutex_unlock(&s->budget_mu);
}

/* ---- engine wiring ---- */

static size_t tier_probe(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                         bool wait_for_full_prefix)
{
    return pf_ssd_probe(ctx, keys, n);
}

static size_t tier_fetch(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                         bool all_or_nothing, struct pf_block **out)
{
    return pf_ssd_fetch(ctx, keys, n, all_or_nothing, out);
}

static size_t tier_fetch_within(void *ctx, const struct pf_block_key *keys, size_t n,
                                uint64_t timeout_ms, struct pf_block **out)
{
    return pf_ssd_fetch_within(ctx, keys, n, false, timeout_ms, out);
}

static void tier_promoted(void *ctx, struct pf_block *const *blocks, size_t n)
{
    struct pf_ssd *s = ctx;
    if (s->promoted_fn)
        s->promoted_fn(s->promoted_ctx, blocks, n);
}

static void hook_sealed(void *ctx, struct pf_block *const *blocks, size_t n)
{
    pf_ssd_offer(ctx, blocks, n);
}

int pf_ssd_attach(struct pf_ssd *s, struct pf_engine *e)
{
    if (s->engine)
        return -EBUSY;
    struct pf_tier t = {
        .name = "ssd",
        .cls = PF_CLASS_RETAINED,
        .probe = tier_probe,
        .fetch = tier_fetch,
        .fetch_within = tier_fetch_within,
        .promoted = tier_promoted,
        .ctx = s,
    };
    s->engine = e;
    int rc = pf_engine_add_tier(e, &t);
    if (rc) {
        pf_error("cannot register the SSD tier with the engine: %s", strerror(-rc));
        return rc;
    }
    struct pf_engine_hooks h = {.sealed = hook_sealed, .ctx = s};
    rc = pf_engine_add_hooks(e, &h);
    if (rc)
        pf_error("cannot register the SSD write hook with the engine: %s", strerror(-rc));
    return rc;
}

/* The P2P module object: NIC registration of the pinned pool, the "rdma" tier, the p2p
 * thread and shutdown.
 *
 * At start-up every pool region is registered on every NIC with local-write and remote-read
 * access (no remote write: peers only READ); the keys are copied so that requests racing a
 * shutdown never touch a deregistered MR object.
 *
 * The p2p thread ("pegaflow-p2p") sends the ReleaseTransferLock calls the requester queues
 * (fire-and-forget for the fetch, which thus does not wait a round trip; exactly one per
 * session) and, every housekeeping period, expires transfer locks and blacklist entries.
 * After stop, releases are sent synchronously by whoever queues them.
 *
 * Shutdown (server.c): pf_p2p_stop after the RPC server stopped (no handler runs any more):
 * the tier turns off, every connection is dropped (in-flight transfers fail at once, their
 * fetches still clean up and queue their releases), queued releases are sent (bounded), the
 * locks held for peers are released, the pool is deregistered. pf_p2p_destroy after the
 * engine (whose prefetch threads may still be inside the tier until then). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/config.h"
#include "pf/engine.h"
#include "pf/log.h"
#include "pf/pool.h"
#include "pf/thread.h"

#define STOP_DRAIN_MS     3000 /* queued releases at shutdown, all together */
#define SYNC_RELEASE_MS   2000
#define QUEUED_RELEASE_MS 5000

static const double fetch_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25,   0.5,   1,      2.5,   5,    10,    30,   60};

int p2p_local_region(const struct pf_p2p *p, const void *addr, uint64_t len)
{
    uintptr_t a = (uintptr_t)addr;
    for (size_t r = 0; r < p->nregions; r++) {
        uintptr_t b = (uintptr_t)p->rbase[r];
        if (a >= b && a - b <= p->rlen[r] && len <= p->rlen[r] - (a - b))
            return (int)r;
    }
    return -1;
}

/* ------------------------------------------------------------------ lock releases */

static void send_release(struct pf_p2p *p, const char *peer, const char *session,
                         uint64_t timeout_ms)
{
    Pegaflow__ReleaseTransferLockRequest req = PEGAFLOW__RELEASE_TRANSFER_LOCK_REQUEST__INIT;
    req.transfer_session_id = (char *)session;
    ProtobufCMessage *resp = NULL;
    char err[P2P_ERRLEN];
    int rc = p->tr->call(p->tr->ctx, peer, PF_P2P_RELEASE_LOCK, &req.base, timeout_ms, &resp, err,
                         sizeof(err));
    if (rc) {
        atomic_fetch_add(&p->st_rel_failed, 1);
        pf_log_ratelimited(PF_LOG_WARN, 5000,
                           "ReleaseTransferLock %s failed: %s (the holder's lock expires by "
                           "itself)",
                           session, err);
        return;
    }
    atomic_fetch_add(&p->st_rel_sent, 1);
    const Pegaflow__ReleaseTransferLockResponse *r = (const void *)resp;
    pf_debug("transfer lock %s on %s released (%llu block(s))", session, peer,
             (unsigned long long)r->released_blocks);
    protobuf_c_message_free_unpacked(resp, NULL);
}

void p2p_release_lock(struct pf_p2p *p, const char *peer, const char *session)
{
    struct p2p_release *r = calloc(1, sizeof(*r));
    pthread_mutex_lock(&p->wk_mu);
    bool queue = r && p->thr_started && !p->wk_stop;
    if (queue) {
        snprintf(r->peer, sizeof(r->peer), "%s", peer);
        snprintf(r->session, sizeof(r->session), "%s", session);
        pf_list_add_tail(&p->rel_q, &r->link);
        p->rel_queued++;
        pthread_cond_broadcast(&p->wk_cv);
    }
    pthread_mutex_unlock(&p->wk_mu);
    if (!queue) {
        free(r);
        send_release(p, peer, session, SYNC_RELEASE_MS);
    }
}

int pf_p2p_flush_releases(struct pf_p2p *p, uint64_t timeout_ms)
{
    struct timespec dl = pf_deadline_ms(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&p->wk_mu);
    uint64_t target = p->rel_queued;
    while (p->rel_done < target && rc == 0)
        if (pthread_cond_timedwait(&p->wk_cv, &p->wk_mu, &dl) == ETIMEDOUT)
            rc = p->rel_done < target ? -ETIMEDOUT : 0;
    pthread_mutex_unlock(&p->wk_mu);
    return rc;
}

static void *p2p_main(void *arg)
{
    struct pf_p2p *p = arg;
    uint64_t next = pf_now_ns() + p->cfg.housekeeping_ms * PF_NS_PER_MS;
    uint64_t drain_until = 0;
    pthread_mutex_lock(&p->wk_mu);
    for (;;) {
        /* stopping: what is left of the queue shares STOP_DRAIN_MS (checked on every pass:
         * stop may come while a release is being sent) */
        if (p->wk_stop && !drain_until)
            drain_until = pf_now_ns() + STOP_DRAIN_MS * PF_NS_PER_MS;
        struct pf_list *n = pf_list_empty(&p->rel_q) ? NULL : p->rel_q.next;
        if (n) {
            pf_list_del(n);
            pthread_mutex_unlock(&p->wk_mu);
            struct p2p_release *r = pf_container_of(n, struct p2p_release, link);
            uint64_t tmo = QUEUED_RELEASE_MS;
            if (drain_until) {
                uint64_t now = pf_now_ns();
                tmo = now < drain_until ? (drain_until - now) / PF_NS_PER_MS + 1 : 1;
            }
            send_release(p, r->peer, r->session, tmo);
            free(r);
            pthread_mutex_lock(&p->wk_mu);
            p->rel_done++;
            pthread_cond_broadcast(&p->wk_cv);
            continue;
        }
        if (p->wk_stop)
            break;
        uint64_t now = pf_now_ns();
        if (now >= next) {
            pthread_mutex_unlock(&p->wk_mu);
            p2p_hb_regions(p, false);
            pf_p2p_locks_expire(p->locks);
            p2p_blacklist_gc(p);
            p2p_conns_evict_idle(p);
            pthread_mutex_lock(&p->wk_mu);
            next = pf_now_ns() + p->cfg.housekeeping_ms * PF_NS_PER_MS;
            continue;
        }
        struct timespec ts = pf_ns_to_timespec(next);
        pthread_cond_timedwait(&p->wk_cv, &p->wk_mu, &ts);
    }
    pthread_mutex_unlock(&p->wk_mu);
    return NULL;
}

void p2p_hb_regions(struct pf_p2p *p, bool release)
{
    for (size_t r = 0; r < p->nregions; r++) {
        if (release)
            pf_hb_release(p->rbase[r]);
        else
            pf_hb_acquire(p->rbase[r]);
    }
}

bool p2p_meta_enter(struct pf_p2p *p)
{
    pthread_mutex_lock(&p->wk_mu);
    bool ok = !p->stopped;
    if (ok)
        p->meta_users++;
    pthread_mutex_unlock(&p->wk_mu);
    return ok;
}

void p2p_meta_exit(struct pf_p2p *p)
{
    pthread_mutex_lock(&p->wk_mu);
    /* only pf_p2p_stop waits for this (it set stopped first, under wk_mu): waking the
     * housekeeping thread on every query-time discovery cost each cold query a futex
     * round on its own path (bench/README.md, the pure-miss row) */
    if (--p->meta_users == 0 && p->stopped)
        pthread_cond_broadcast(&p->wk_cv);
    pthread_mutex_unlock(&p->wk_mu);
}

/* ------------------------------------------------------------------ lifecycle */

static void init_metrics(struct pf_p2p *p)
{
    p->m_fetch =
        pf_metric_counter("pegaflow_rdma_fetch_total",
                          "Remote fetches by outcome (ok, partial, error, timeout)", "status");
    p->c_ok = pf_metric_child1(p->m_fetch, "ok");
    p->c_partial = pf_metric_child1(p->m_fetch, "partial");
    p->c_error = pf_metric_child1(p->m_fetch, "error");
    p->c_timeout = pf_metric_child1(p->m_fetch, "timeout");
    pf_child_add(p->c_ok, 0);
    pf_child_add(p->c_partial, 0);
    pf_child_add(p->c_error, 0);
    pf_child_add(p->c_timeout, 0);
    p->m_dur = pf_metric_histogram("pegaflow_rdma_fetch_duration_seconds",
                                   "Remote fetch time from peer selection to sealed blocks", NULL,
                                   fetch_buckets, PF_ARRAY_SIZE(fetch_buckets));
    p->m_bytes = pf_metric_counter("pegaflow_rdma_fetch_bytes", "Bytes fetched from peers", NULL);
    p->m_qps =
        pf_metric_gauge("pegaflow_rdma_qps", "Live queue pairs to peers (both directions)", NULL);
    p->m_integrity =
        pf_metric_counter("pegaflow_integrity_failures_total",
                          "Blocks whose checksum did not verify (turned into misses)", "tier");
    p->c_integrity = pf_metric_child1(p->m_integrity, "remote");
    pf_child_add(p->c_integrity, 0);
    p->m_verified = pf_metric_counter(
        "pegaflow_p2p_verified_blocks_total",
        "Fetched blocks whose checksums were checked, by where: receive (the fabric hashed the "
        "bytes as they landed) or worker (a verification pass over the staging memory)",
        "path");
    p->c_ver_receive = pf_metric_child1(p->m_verified, "receive");
    p->c_ver_worker = pf_metric_child1(p->m_verified, "worker");
    pf_child_add(p->c_ver_receive, 0);
    pf_child_add(p->c_ver_worker, 0);
    p->m_serve_ssd = pf_metric_counter(
        "pegaflow_p2p_serve_ssd_blocks_total",
        "Blocks a peer asked for that were only on this node's SSD: read into RAM and served "
        "(served) or not (failed: SSD error, timeout, checksum, budget)",
        "result");
    p->c_serve_ssd_ok = pf_metric_child1(p->m_serve_ssd, "served");
    p->c_serve_ssd_failed = pf_metric_child1(p->m_serve_ssd, "failed");
    pf_child_add(p->c_serve_ssd_ok, 0);
    pf_child_add(p->c_serve_ssd_failed, 0);
    p->m_rail_fail = pf_metric_counter(
        "pegaflow_rdma_rail_failures_total",
        "Rails (NICs) of a peer connection marked dead after a READ on them failed; the READs "
        "were re-posted on the connection's other rails (docs/net.md \"Per-NIC health\")",
        "nic");
}

static void dereg_all(struct pf_p2p *p)
{
    if (!p->mrs)
        return;
    for (size_t i = 0; i < (size_t)p->nnics * p->nregions; i++) {
        pf_net_dereg_mem(p->mrs[i]);
        p->mrs[i] = NULL;
    }
}

struct reg_job {
    struct pf_p2p *p;
    int nic;
    int rc;        /* 0 or the failed registration's -errno */
    size_t region; /* the region that failed */
};

/* Registers every pool region on one NIC (register_pool runs one per NIC at once). */
static void *reg_nic_main(void *arg)
{
    struct reg_job *j = arg;
    struct pf_p2p *p = j->p;
    int k = j->nic;
    for (size_t r = 0; r < p->nregions; r++) {
        size_t i = (size_t)k * p->nregions + r;
        int rc = pf_net_reg_mem(p->net, k, p->rbase[r], p->rlen[r],
                                PF_NET_ACCESS_LOCAL_WRITE | PF_NET_ACCESS_REMOTE_READ, &p->mrs[i]);
        if (rc) {
            p->mrs[i] = NULL;
            j->rc = rc;
            j->region = r;
            return NULL;
        }
        p->lkey[i] = p->mrs[i]->lkey;
        p->rkey[i] = p->mrs[i]->rkey;
        pf_debug("memory registration: pool region %zu (%p, %llu bytes, NUMA node %d) on NIC %s: "
                 "rkey 0x%08x",
                 r, p->rbase[r], (unsigned long long)p->rlen[r], p->rnuma[r], p->nics[k].name,
                 p->rkey[i]);
    }
    return NULL;
}

static int register_pool(struct pf_p2p *p, char *err, size_t errlen)
{
    p->nregions = pf_pool_region_count(p->pool);
    size_t nm = (size_t)p->nnics * p->nregions;
    p->rbase = calloc(p->nregions, sizeof(*p->rbase));
    p->rlen = calloc(p->nregions, sizeof(*p->rlen));
    p->rnuma = calloc(p->nregions, sizeof(*p->rnuma));
    p->mrs = calloc(nm, sizeof(*p->mrs));
    p->lkey = calloc(nm, sizeof(*p->lkey));
    p->rkey = calloc(nm, sizeof(*p->rkey));
    if (!p->rbase || !p->rlen || !p->rnuma || !p->mrs || !p->lkey || !p->rkey) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    uint64_t total = 0;
    for (size_t r = 0; r < p->nregions; r++) {
        pf_pool_region_info(p->pool, r, &p->rbase[r], &p->rlen[r], &p->rnuma[r]);
        total += p->rlen[r];
    }
    /* one thread per NIC (each pins the whole pool again: ib_umem_get walks and pins every
     * page, seconds per NIC for a large pool), joined; a failure is reported by NIC name */
    uint64_t t0 = pf_now_ns();
    struct reg_job jobs[P2P_NIC_MAX];
    pthread_t th[P2P_NIC_MAX];
    bool started[P2P_NIC_MAX] = {false};
    for (int k = 0; k < p->nnics; k++) {
        jobs[k] = (struct reg_job){.p = p, .nic = k};
        started[k] = p->nnics > 1 && pthread_create(&th[k], NULL, reg_nic_main, &jobs[k]) == 0;
        if (!started[k])
            reg_nic_main(&jobs[k]);
    }
    int rc = 0;
    char also[160] = "";
    for (int k = 0; k < p->nnics; k++) {
        if (started[k])
            pthread_join(th[k], NULL);
        if (!jobs[k].rc)
            continue;
        if (rc == 0) {
            char sz[32];
            size_t r = jobs[k].region;
            rc = jobs[k].rc;
            pf_format_size(p->rlen[r], sz, sizeof(sz));
            snprintf(err, errlen, "--nics: cannot register pool region %zu (%s) on NIC %s: %s", r,
                     sz, p->nics[k].name, strerror(-rc));
        } else {
            snprintf(also + strlen(also), sizeof(also) - strlen(also), "%s%s", also[0] ? ", " : "",
                     p->nics[k].name);
        }
    }
    if (rc) {
        if (also[0] && strlen(err) + 1 < errlen)
            snprintf(err + strlen(err), errlen - strlen(err), " (also failed on %s)", also);
        return rc; /* the regions that were registered are deregistered by the caller */
    }
    char sz[32];
    pf_format_size(total, sz, sizeof(sz));
    pf_info("P2P: %zu pool region(s), %s, registered on %d NIC(s) in %.1f ms (%s backend, %u "
            "QP(s) per NIC per peer, transfer locks expire after %llu s)",
            p->nregions, sz, p->nnics, (double)(pf_now_ns() - t0) / 1e6, p->backend, p->qpn,
            (unsigned long long)(p->lock_timeout_ms / 1000));
    return 0;
}

static void p2p_free(struct pf_p2p *p)
{
    dereg_all(p);
    p2p_verify_free(p);
    p2p_conns_free(p);
    p2p_blacklist_free(p);
    pf_htable_destroy(&p->peers);
    pf_htable_destroy(&p->bl);
    pf_htable_destroy(&p->holders);
    p2p_grpc_free(p);
    pf_p2p_locks_destroy(p->locks);
    free(p->rbase);
    free(p->rlen);
    free(p->rnuma);
    free(p->mrs);
    free(p->lkey);
    free(p->rkey);
    pthread_mutex_destroy(&p->conn_mu);
    pthread_cond_destroy(&p->conn_cv);
    pthread_mutex_destroy(&p->bl_mu);
    pthread_mutex_destroy(&p->hold_mu);
    pthread_mutex_destroy(&p->wk_mu);
    pthread_cond_destroy(&p->wk_cv);
    pthread_mutex_destroy(&p->chan_mu);
    free(p);
}

int pf_p2p_create(const struct pf_p2p_config *cfg, struct pf_p2p **p_p, char *err, size_t errlen)
{
    if (!cfg->engine || !cfg->net) {
        snprintf(err, errlen, "P2P needs an engine and opened NICs");
        return -EINVAL;
    }
    struct pf_p2p *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    p->cfg = *cfg;
    struct pf_p2p_config *c = &p->cfg;
    if (!c->qps_per_peer)
        c->qps_per_peer = PF_P2P_DEFAULT_QPS;
    if (!c->lock_timeout_secs)
        c->lock_timeout_secs = PF_P2P_DEFAULT_LOCK_SECS;
    if (!c->fetch_margin_ms)
        c->fetch_margin_ms = 60000;
    if (!c->fetch_min_ms)
        c->fetch_min_ms = 10000;
    if (!c->full_prefix_poll_ms)
        c->full_prefix_poll_ms = 10;
    if (!c->full_prefix_wait_ms)
        c->full_prefix_wait_ms = 30000;
    if (!c->blacklist_ms)
        c->blacklist_ms = PF_P2P_BLACKLIST_SECS * 1000ull;
    if (!c->housekeeping_ms)
        c->housekeeping_ms = 1000;
    if (!c->qp_wait_ms)
        c->qp_wait_ms = 30000;
    if (!c->peer_down_ms)
        c->peer_down_ms = 5000;
    if (!c->plan_timeout_ms)
        c->plan_timeout_ms = PF_P2P_PLAN_TIMEOUT_MS;
    if (!c->conn_idle_ms)
        c->conn_idle_ms = 600000;
    c->transport = NULL;
    const char *b = cfg->backend ? cfg->backend : "";
    if (strncmp(b, "faulty:", 7) == 0)
        b += 7;
    snprintf(p->backend, sizeof(p->backend), "%s", b);
    p->engine = cfg->engine;
    p->pool = pf_engine_pool(cfg->engine);
    p->cache = pf_engine_cache(cfg->engine);
    p->net = cfg->net;
    p->qpn = c->qps_per_peer;
    p->lock_timeout_ms = c->lock_timeout_secs * 1000;
    /* 1 MiB READs beat 4 MiB merges on the TCP fabric (bench/README.md "Serving threads:
     * waiting in place"); a segment larger than this still travels in one READ */
    p->max_read = c->read_merge ? c->read_merge : PF_P2P_READ_MERGE;
    const char *mr = getenv("PEGAFLOW_P2P_MAX_READ");
    uint64_t v;
    p->kv_pairs = true;
    if (mr && pf_parse_size(mr, &v) == 0 && v >= 1 && v <= (1ull << 31)) {
        p->max_read = v;
        p->kv_pairs = false; /* a set cap is strict (tests: one READ per segment) */
    }
    pthread_mutex_init(&p->conn_mu, NULL);
    pthread_mutex_init(&p->bl_mu, NULL);
    pthread_mutex_init(&p->hold_mu, NULL);
    pthread_mutex_init(&p->wk_mu, NULL);
    pthread_mutex_init(&p->chan_mu, NULL);
    pf_cond_init(&p->conn_cv);
    pf_cond_init(&p->wk_cv);
    pf_list_init(&p->rel_q);
    init_metrics(p);
    int rc = -EINVAL;
    p->nnics = pf_net_nic_count(p->net);
    if (p->nnics <= 0 || p->nnics > P2P_NIC_MAX || p->qpn > 64 ||
        (size_t)p->nnics * p->qpn > 1024) {
        snprintf(err, errlen, "--nics: %d NIC(s) with %u QP(s) each (1..%d NICs, 1..64 QPs)",
                 p->nnics, p->qpn, P2P_NIC_MAX);
        goto err_free;
    }
    for (int k = 0; k < p->nnics; k++) {
        rc = pf_net_nic_info(p->net, k, &p->nics[k]);
        if (rc) {
            snprintf(err, errlen, "--nics: NIC %d: %s", k, strerror(-rc));
            goto err_free;
        }
        /* merged READs stay within what every NIC takes in one message (verbs: the port's
         * max_msg_sz); one block segment (up to PF_P2P_MAX_READ) must fit */
        uint64_t mm = p->nics[k].max_msg;
        if (mm && mm < PF_P2P_MAX_READ) {
            snprintf(err, errlen,
                     "--nics: NIC %s takes READs of at most %llu bytes, below the "
                     "%u-byte block segments P2P reads",
                     p->nics[k].name, (unsigned long long)mm, (unsigned)PF_P2P_MAX_READ);
            rc = -EINVAL;
            goto err_free;
        }
        if (mm && p->max_read > mm)
            p->max_read = mm;
    }
    uint8_t raw[16];
    rc = pf_uuid_v4(raw);
    if (rc) {
        snprintf(err, errlen, "no randomness for the node id: %s", strerror(-rc));
        goto err_free;
    }
    pf_uuid_format(raw, p->node_id);
    rc = pf_htable_init(&p->peers, 16);
    if (rc == 0)
        rc = pf_htable_init(&p->bl, 64);
    if (rc == 0)
        rc = pf_htable_init(&p->holders, 16);
    if (rc == 0)
        rc = pf_p2p_locks_create(c->clock, c->lock_timeout_secs * PF_NS_PER_SEC, &p->locks);
    if (rc) {
        snprintf(err, errlen, "out of memory");
        goto err_free;
    }
    rc = register_pool(p, err, errlen);
    if (rc)
        goto err_free;
    if (c->lock_timeout_secs * 1000 <= c->fetch_min_ms)
        pf_warn("--transfer-lock-timeout-secs %llu: peers' transfers may run %llu s, longer "
                "than this node keeps their blocks locked (expired locks let the memory be "
                "reused mid-transfer; checksums then turn such blocks into misses)",
                (unsigned long long)c->lock_timeout_secs,
                (unsigned long long)(c->fetch_min_ms / 1000));
    if (cfg->transport) {
        p->tr = cfg->transport;
    } else {
        p->grpc_tr = (struct pf_p2p_transport){p2p_grpc_call, p2p_grpc_query_prefix, p,
                                               p2p_grpc_query_start, p2p_grpc_query_finish};
        p->tr = &p->grpc_tr;
    }
    rc = p2p_verify_start(p);
    if (rc) {
        snprintf(err, errlen, "cannot start the P2P verification workers: %s", strerror(-rc));
        goto err_free;
    }
    rc = pf_thread_start(&p->thr, "pegaflow-p2p", -1, p2p_main, p);
    if (rc) {
        snprintf(err, errlen, "cannot start the p2p thread: %s", strerror(-rc));
        goto err_free;
    }
    p->thr_started = true;
    struct pf_tier t = {
        .name = "rdma",
        .cls = PF_CLASS_RECLAIMABLE,
        .fetch = p2p_tier_fetch,
        .discover = p2p_tier_discover,
        .discover_start = p2p_tier_discover_start,
        .discover_finish = p2p_tier_discover_finish,
        .fetch_from = p2p_tier_fetch_from,
        .ctx = p,
    };
    rc = pf_engine_add_tier(p->engine, &t);
    if (rc) {
        snprintf(err, errlen, "cannot register the rdma tier: %s", strerror(-rc));
        goto err_thread;
    }
    *p_p = p;
    return 0;
err_thread:
    pthread_mutex_lock(&p->wk_mu);
    p->wk_stop = true;
    pthread_cond_broadcast(&p->wk_cv);
    pthread_mutex_unlock(&p->wk_mu);
    pthread_join(p->thr, NULL);
err_free:
    p2p_free(p);
    return rc;
}

void pf_p2p_enable_fetch(struct pf_p2p *p, struct pf_meta_client *meta, const char *self_addr)
{
    p->meta = meta;
    snprintf(p->self_addr, sizeof(p->self_addr), "%s", self_addr ? self_addr : "");
    atomic_store_explicit(&p->fetch_enabled, true, memory_order_release);
    pf_info("P2P fetch enabled: this node is %s (node id %s)", p->self_addr, p->node_id);
}

void pf_p2p_stop(struct pf_p2p *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->wk_mu);
    bool first = !p->stopped;
    p->stopped = true;
    pthread_mutex_unlock(&p->wk_mu);
    if (!first)
        return;
    atomic_store(&p->fetch_enabled, false);
    atomic_store(&p->stopping, true);
    p2p_conns_drop_all(p);
    pthread_mutex_lock(&p->wk_mu);
    p->wk_stop = true;
    pthread_cond_broadcast(&p->wk_cv);
    /* discovery in flight uses the MetaServer client, which the caller destroys next: wait
     * for it (bounded by the query deadline) */
    struct timespec dl = pf_deadline_ms(PF_P2P_META_TIMEOUT_MS + 2000);
    while (p->meta_users > 0)
        if (pthread_cond_timedwait(&p->wk_cv, &p->wk_mu, &dl) == ETIMEDOUT) {
            pf_error("MetaServer query still in flight at shutdown");
            break;
        }
    pthread_mutex_unlock(&p->wk_mu);
    if (p->thr_started)
        pthread_join(p->thr, NULL);
    p2p_verify_stop(p); /* fetches still unwinding verify inline from here */
    p2p_hb_regions(p, false);
    size_t n = pf_p2p_locks_release_all(p->locks);
    if (n)
        pf_info("released %zu transfer lock(s) held for peers", n);
    dereg_all(p);
}

void pf_p2p_destroy(struct pf_p2p *p)
{
    if (!p)
        return;
    pf_p2p_stop(p);
    p2p_free(p);
}

void pf_p2p_get_stats(struct pf_p2p *p, struct pf_p2p_stats *s)
{
    memset(s, 0, sizeof(*s));
    s->lock_sessions = pf_p2p_locks_sessions(p->locks);
    s->locked_blocks = pf_p2p_locks_blocks(p->locks);
    pthread_mutex_lock(&p->conn_mu);
    s->conns = p->nconns;
    s->qps = p->nqps;
    pthread_mutex_unlock(&p->conn_mu);
    s->handshakes_out = atomic_load(&p->st_hs_out);
    s->handshakes_in = atomic_load(&p->st_hs_in);
    s->releases_sent = atomic_load(&p->st_rel_sent);
    s->releases_failed = atomic_load(&p->st_rel_failed);
    s->fetches = atomic_load(&p->st_fetches);
    s->fetched_blocks = atomic_load(&p->st_blocks);
    s->fetched_bytes = atomic_load(&p->st_bytes);
    s->fetch_failures = atomic_load(&p->st_fail);
    s->integrity_failures = atomic_load(&p->st_integrity);
    s->rail_failures = atomic_load(&p->st_rail_fail);
    pthread_mutex_lock(&p->bl_mu);
    s->blacklisted = p->bl.count;
    pthread_mutex_unlock(&p->bl_mu);
}

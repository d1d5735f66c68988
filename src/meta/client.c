/* Server-side MetaServer client, the asynchronous side (contract in pf/meta_client.h;
 * prefix queries are in client_query.c).
 *
 * Callers only copy their hashes into one allocation and push its pointer into a bounded
 * ring under a mutex that the client thread holds only to swap the ring out, so a slow or
 * absent MetaServer never reaches them. The thread sleeps until a command, a flush, stop,
 * the next heartbeat or the next refresh; then it heartbeats if due (probe + HeartbeatNode),
 * runs a pending resync, drains and coalesces the ring, sends, refreshes if due, and
 * acknowledges flushes. Session state is the thread's alone; `connected` mirrors it for
 * observers. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "metaclient"
#include "engine.pb-c.h"
#include "pf/log.h"
#include "meta/meta_internal.h"
#include "pf/meta_client.h"
#include "pf/metrics.h"
#include "pf/rpc.h"
#include "pf/thread.h"
#include "pf/util.h"

#define BACKOFF_MIN_MS   100u
#define BACKOFF_MAX_MS   30000u
#define UNREGISTER_MS    3000u
#define HEARTBEAT_MIN_MS 1000u

struct cmd {
    enum pf_meta_op op;
    size_t n;
    const char *ns;
    struct pf_meta_hash *hashes;
    /* ns bytes, hash array and hash bytes follow */
};

struct pf_meta_client {
    char *target, *advertise;
    uint64_t rpc_timeout_ms;
    uint64_t refresh_ms;
    uint64_t stale_secs;
    void (*apply_reclaimable)(void *, const char *, const struct pf_meta_hash *, size_t);
    int (*enumerate_resident)(void *, pf_meta_emit_fn, void *);
    void *cb_ctx;

    uint8_t uuid[16];
    char node_id[PF_UUID_STR_LEN];
    struct pf_meta_targets *tg; /* replicas, current one, their channels */

    pthread_mutex_t mu;
    pthread_cond_t wake;    /* thread: work arrived */
    pthread_cond_t flushed; /* callers: flush_done advanced */
    struct cmd **ring;
    struct cmd **batch; /* the thread's drained copy of the ring */
    size_t cap, head, count;
    uint64_t flush_req, flush_done;
    bool stop;
    bool joined;
    bool probe_req; /* a query found the MetaServer unreachable: heartbeat now to confirm */
    pthread_t th;

    /* thread-owned */
    bool session;
    bool had_session; /* a session existed at some point: unregister at stop */
    bool resync_pending;
    bool resync_req; /* pf_meta_client_resync (under mu) */
    uint64_t next_hb_ns, next_refresh_ns, backoff_ms;

    _Atomic bool connected;
};

/* ------------------------------------------------------------------ metrics */

static struct pf_metric *m_reg_blocks, *m_reg_fail, *m_reg_full, *m_rem_blocks, *m_rem_fail,
    *m_rem_full, *m_hb_fail, *m_resets, *m_unreg_fail, *m_resync, *m_refresh, *m_query_fail;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_init(void)
{
    m_reg_blocks = pf_metric_counter("pegaflow_metaserver_registration_blocks",
                                     "Block hashes registered with the MetaServer", "");
    m_reg_fail =
        pf_metric_counter("pegaflow_metaserver_registration_failures",
                          "Block registrations dropped after a failed or skipped send", "");
    m_reg_full = pf_metric_counter("pegaflow_metaserver_registration_queue_full",
                                   "Registration commands dropped: queue full", "");
    m_rem_blocks = pf_metric_counter("pegaflow_metaserver_removal_blocks",
                                     "Block hashes removed from the MetaServer", "");
    m_rem_fail = pf_metric_counter("pegaflow_metaserver_removal_failures",
                                   "Block removals dropped after a failed or skipped send", "");
    m_rem_full = pf_metric_counter("pegaflow_metaserver_removal_queue_full",
                                   "Removal commands dropped: queue full", "");
    m_hb_fail = pf_metric_counter("pegaflow_metaserver_heartbeat_failures",
                                  "Failed MetaServer heartbeats", "");
    m_resets = pf_metric_counter("pegaflow_metaserver_session_resets",
                                 "MetaServer sessions reset after FAILED_PRECONDITION", "");
    m_unreg_fail = pf_metric_counter("pegaflow_metaserver_unregister_failures",
                                     "Failed UnregisterNode calls at shutdown", "");
    m_resync =
        pf_metric_counter("pegaflow_metaserver_resync_blocks",
                          "Resident blocks re-registered after a session was established", "");
    m_refresh = pf_metric_counter("pegaflow_metaserver_refresh_blocks",
                                  "Resident blocks re-registered to renew their TTL", "");
    m_query_fail = pf_metric_counter("pegaflow_metaserver_query_failures",
                                     "Failed QueryPrefixBlocks calls", "");
}

/* ------------------------------------------------------------------ helpers */

static uint64_t ms_to_ns(uint64_t ms)
{
    return ms > UINT64_MAX / PF_NS_PER_MS ? UINT64_MAX : ms * PF_NS_PER_MS;
}

/* Monotonic time ms from now, saturating. */
static uint64_t after_ms(uint64_t ms)
{
    uint64_t now = pf_now_ns(), d = ms_to_ns(ms);
    return d > UINT64_MAX - now ? UINT64_MAX : now + d;
}

static bool stopping(struct pf_meta_client *c)
{
    pthread_mutex_lock(&c->mu);
    bool s = c->stop;
    pthread_mutex_unlock(&c->mu);
    return s;
}

static void count_dropped(enum pf_meta_op op, size_t n)
{
    pf_metric_add(op == PF_META_OP_INSERT ? m_reg_fail : m_rem_fail, (double)n);
}

/* The session is gone (FAILED_PRECONDITION): heartbeat again at once. */
static void session_reset(struct pf_meta_client *c, const char *why)
{
    pf_metric_add(m_resets, 1);
    pf_warn("MetaServer session reset (%s); re-registering", why);
    c->session = false;
    atomic_store(&c->connected, false);
    c->next_hb_ns = pf_now_ns();
    c->backoff_ms = BACKOFF_MIN_MS;
}

/* The MetaServer did not answer: retry the heartbeat with backoff. */
static void session_lost(struct pf_meta_client *c, const struct pf_rpc_status *st)
{
    if (c->session)
        pf_warn("MetaServer %s unreachable (%s: %s); registrations are dropped until it is "
                "back",
                c->target, pf_grpc_code_name(st->code), st->msg);
    c->session = false;
    atomic_store(&c->connected, false);
    c->next_hb_ns = after_ms(c->backoff_ms);
    c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
}

/* Insert or Remove of one batch. 0; -EPERM on FAILED_PRECONDITION (session reset done);
 * -EPROTO on a rejected request (not session related); other -errno: transport failure
 * (session lost). Reclaimable hints are applied. accepted_p: hashes the server took. */
static int send_batch(struct pf_meta_client *c, enum pf_meta_op op, const char *ns,
                      const struct pf_meta_hash *h, size_t n)
{
    struct pf_rpc_status st = {0};
    ProtobufCMessage *resp = NULL;
    int rc;
    size_t ti = pf_meta_targets_current(c->tg);
    if (op == PF_META_OP_INSERT) {
        Pegaflow__InsertBlockHashesRequest req = PEGAFLOW__INSERT_BLOCK_HASHES_REQUEST__INIT;
        req.namespace_ = (char *)ns;
        req.n_block_hashes = n;
        req.block_hashes = (ProtobufCBinaryData *)h;
        req.node = c->advertise;
        req.node_id = c->node_id;
        rc = pf_rpc_unary(pf_meta_targets_reg(c->tg, ti), "/pegaflow.MetaServer/InsertBlockHashes",
                          &req.base, &pegaflow__insert_block_hashes_response__descriptor,
                          c->rpc_timeout_ms, &resp, &st);
    } else {
        Pegaflow__RemoveBlockHashesRequest req = PEGAFLOW__REMOVE_BLOCK_HASHES_REQUEST__INIT;
        req.namespace_ = (char *)ns;
        req.n_block_hashes = n;
        req.block_hashes = (ProtobufCBinaryData *)h;
        req.node = c->advertise;
        req.node_id = c->node_id;
        rc = pf_rpc_unary(pf_meta_targets_reg(c->tg, ti), "/pegaflow.MetaServer/RemoveBlockHashes",
                          &req.base, &pegaflow__remove_block_hashes_response__descriptor,
                          c->rpc_timeout_ms, &resp, &st);
    }
    if (rc) {
        if (st.code == PF_GRPC_FAILED_PRECONDITION) {
            session_reset(c, st.msg);
            return -EPERM;
        }
        if (st.code == PF_GRPC_INVALID_ARGUMENT || st.code == PF_GRPC_RESOURCE_EXHAUSTED) {
            pf_log_ratelimited(PF_LOG_WARN, 10000, "MetaServer rejected %zu hashes: %s: %s", n,
                               pf_grpc_code_name(st.code), st.msg);
            return -EPROTO;
        }
        pf_meta_targets_failed(c->tg, ti, st.code);
        session_lost(c, &st);
        return rc;
    }
    Pegaflow__ResponseStatus *rs = op == PF_META_OP_INSERT
                                       ? ((Pegaflow__InsertBlockHashesResponse *)resp)->status
                                       : ((Pegaflow__RemoveBlockHashesResponse *)resp)->status;
    if (rs && !rs->ok) {
        pf_log_ratelimited(PF_LOG_WARN, 10000, "MetaServer refused %zu hashes: %s", n,
                           rs->message ? rs->message : "");
        rc = -EPROTO;
    } else if (op == PF_META_OP_INSERT) {
        Pegaflow__InsertBlockHashesResponse *ir = (Pegaflow__InsertBlockHashesResponse *)resp;
        if (ir->n_reclaimable_hashes && c->apply_reclaimable)
            c->apply_reclaimable(c->cb_ctx, ns, (const struct pf_meta_hash *)ir->reclaimable_hashes,
                                 ir->n_reclaimable_hashes);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* ------------------------------------------------------------------ heartbeat */

/* Connects the query channel of replica ti before the session is announced: the query-time
 * plan gives QueryPrefixBlocks a deadline of tens of milliseconds, which a first call that
 * must also connect (TCP, HTTP/2 preface) can exceed. One QueryPrefixBlocks for a namespace
 * nobody uses; its answer (or error) is ignored. */
static void query_warmup(struct pf_meta_client *c, size_t ti)
{
    static uint8_t h = 0;
    ProtobufCBinaryData hb = {1, &h};
    Pegaflow__QueryPrefixBlocksRequest req = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    req.namespace_ = (char *)"pegaflow.warmup";
    req.n_block_hashes = 1;
    req.block_hashes = &hb;
    ProtobufCMessage *m = NULL;
    struct pf_rpc_status st = {0};
    if (pf_rpc_unary(pf_meta_targets_query(c->tg, ti), "/pegaflow.MetaServer/QueryPrefixBlocks",
                     &req.base, &pegaflow__query_prefix_blocks_response__descriptor,
                     c->rpc_timeout_ms, &m, &st) == 0)
        protobuf_c_message_free_unpacked(m, NULL);
}

static void heartbeat(struct pf_meta_client *c)
{
    struct pf_rpc_status st = {0};
    ProtobufCMessage *resp = NULL;
    if (c->session) {
        /* session probe: answers "unknown node" once the MetaServer lost us (restart) */
        static const uint8_t zero = 0;
        struct pf_meta_hash probe = {.len = 1, .data = &zero};
        int rc = send_batch(c, PF_META_OP_REMOVE, PF_META_PROBE_NAMESPACE, &probe, 1);
        if (rc && rc != -EPERM && rc != -EPROTO) {
            pf_metric_add(m_hb_fail, 1);
            return; /* session_lost scheduled the retry */
        }
    }
    Pegaflow__HeartbeatNodeRequest req = PEGAFLOW__HEARTBEAT_NODE_REQUEST__INIT;
    req.node = c->advertise;
    req.node_id = c->node_id;
    /* this process never had a session: it is new, its address's session is a former life's */
    req.replace = !c->had_session;
    size_t ti = pf_meta_targets_current(c->tg);
    int rc = pf_rpc_unary(pf_meta_targets_reg(c->tg, ti), "/pegaflow.MetaServer/HeartbeatNode",
                          &req.base, &pegaflow__heartbeat_node_response__descriptor,
                          c->rpc_timeout_ms, &resp, &st);
    if (rc) {
        pf_metric_add(m_hb_fail, 1);
        if (st.code == PF_GRPC_FAILED_PRECONDITION)
            pf_log_ratelimited(PF_LOG_WARN, 10000,
                               "MetaServer refused heartbeat for %s: %s (another process "
                               "with this address holds a live session; retrying)",
                               c->advertise, st.msg);
        else
            pf_log_ratelimited(PF_LOG_WARN, 10000, "MetaServer %s heartbeat failed: %s: %s",
                               pf_meta_targets_name(c->tg, ti), pf_grpc_code_name(st.code), st.msg);
        pf_meta_targets_failed(c->tg, ti, st.code);
        session_lost(c, &st);
        return;
    }
    uint64_t stale = ((Pegaflow__HeartbeatNodeResponse *)resp)->stale_after_secs;
    protobuf_c_message_free_unpacked(resp, NULL);
    if (stale)
        c->stale_secs = stale > 86400 ? 86400 : stale;
    uint64_t period_ms = c->stale_secs * 1000 / 2;
    if (period_ms < HEARTBEAT_MIN_MS)
        period_ms = HEARTBEAT_MIN_MS;
    c->next_hb_ns = after_ms(period_ms);
    c->backoff_ms = BACKOFF_MIN_MS;
    if (!c->session) {
        query_warmup(c, ti);
        pf_info("MetaServer session established with %s as %s (node_id %s); heartbeat every "
                "%llu ms",
                pf_meta_targets_name(c->tg, ti), c->advertise, c->node_id,
                (unsigned long long)period_ms);
        c->session = true;
        c->had_session = true;
        c->resync_pending = true;
        atomic_store(&c->connected, true);
    }
}

/* ------------------------------------------------------------------ resync / refresh */

struct resident {
    char **nss;
    size_t nns, capns;
    struct rkey {
        uint32_t ns;
        uint32_t len;
        size_t off;
    } * keys;
    size_t nkeys, capkeys;
    uint8_t *bytes;
    size_t nbytes, capbytes;
    uint32_t last_ns;
};

static int resident_emit(void *ctx, const char *ns, const void *hash, size_t len)
{
    struct resident *r = ctx;
    if (!ns || !*ns || !hash || len == 0 || len > PF_META_HASH_MAX)
        return 0; /* not registrable: skip */
    uint32_t nsi;
    if (r->nns && strcmp(r->nss[r->last_ns], ns) == 0) {
        nsi = r->last_ns;
    } else {
        for (nsi = 0; nsi < r->nns && strcmp(r->nss[nsi], ns) != 0; nsi++)
            ;
        if (nsi == r->nns) {
            if (r->nns == r->capns) {
                size_t nc = r->capns ? r->capns * 2 : 4;
                char **n = realloc(r->nss, nc * sizeof(*n));
                if (!n)
                    return -ENOMEM;
                r->nss = n;
                r->capns = nc;
            }
            r->nss[r->nns] = strdup(ns);
            if (!r->nss[r->nns])
                return -ENOMEM;
            r->nns++;
        }
        r->last_ns = nsi;
    }
    if (r->nkeys == r->capkeys) {
        size_t nc = r->capkeys ? r->capkeys * 2 : 1024;
        struct rkey *k = realloc(r->keys, nc * sizeof(*k));
        if (!k)
            return -ENOMEM;
        r->keys = k;
        r->capkeys = nc;
    }
    if (r->nbytes + len > r->capbytes) {
        size_t nc = r->capbytes ? r->capbytes * 2 : 32768;
        while (nc < r->nbytes + len)
            nc *= 2;
        uint8_t *b = realloc(r->bytes, nc);
        if (!b)
            return -ENOMEM;
        r->bytes = b;
        r->capbytes = nc;
    }
    memcpy(r->bytes + r->nbytes, hash, len);
    r->keys[r->nkeys].ns = nsi;
    r->keys[r->nkeys].len = (uint32_t)len;
    r->keys[r->nkeys].off = r->nbytes;
    r->nkeys++;
    r->nbytes += len;
    return 0;
}

static void resident_free(struct resident *r)
{
    for (size_t i = 0; i < r->nns; i++)
        free(r->nss[i]);
    free(r->nss);
    free(r->keys);
    free(r->bytes);
}

/* Re-inserts every resident block. Returns the number the MetaServer accepted. */
static uint64_t reregister_all(struct pf_meta_client *c, const char *what)
{
    if (!c->enumerate_resident)
        return 0;
    struct resident r = {0};
    uint64_t t0 = pf_now_ns(), sent = 0;
    int rc = c->enumerate_resident(c->cb_ctx, resident_emit, &r);
    if (rc) {
        pf_warn("%s skipped: enumerating resident blocks failed: %s", what, strerror(-rc));
        goto out;
    }
    struct pf_meta_hash *chunk = malloc(PF_META_CLIENT_CHUNK * sizeof(*chunk));
    if (!chunk) {
        pf_warn("%s skipped: out of memory", what);
        goto out;
    }
    bool aborted = false;
    for (uint32_t ns = 0; ns < r.nns && !aborted; ns++) {
        size_t k = 0;
        while (k < r.nkeys && !aborted) {
            size_t n = 0;
            for (; k < r.nkeys && n < PF_META_CLIENT_CHUNK; k++)
                if (r.keys[k].ns == ns)
                    chunk[n++] = (struct pf_meta_hash){r.keys[k].len, r.bytes + r.keys[k].off};
            if (n == 0)
                break;
            if (stopping(c) || !c->session) {
                aborted = true;
                break;
            }
            if (pf_now_ns() >= c->next_hb_ns) {
                heartbeat(c); /* keep the session alive during a long resync */
                if (!c->session) {
                    aborted = true;
                    break;
                }
            }
            rc = send_batch(c, PF_META_OP_INSERT, r.nss[ns], chunk, n);
            if (rc == 0)
                sent += n;
            else if (rc != -EPROTO)
                aborted = true;
        }
    }
    free(chunk);
    double ms = (double)(pf_now_ns() - t0) / 1e6;
    if (aborted)
        pf_warn("%s interrupted after %llu of %zu blocks (%.0f ms)", what, (unsigned long long)sent,
                r.nkeys, ms);
    else if (r.nkeys)
        pf_info("%s: re-registered %llu of %zu resident blocks in %.0f ms", what,
                (unsigned long long)sent, r.nkeys, ms);
out:
    resident_free(&r);
    return sent;
}

/* ------------------------------------------------------------------ commands */

static void process(struct pf_meta_client *c, struct cmd **cmds, size_t n)
{
    if (!c->session) {
        for (size_t i = 0; i < n; i++)
            count_dropped(cmds[i]->op, cmds[i]->n);
        return;
    }
    struct pf_meta_cmd *views = malloc(n * sizeof(*views));
    struct pf_meta_plan plan;
    int rc = -ENOMEM;
    if (views) {
        for (size_t i = 0; i < n; i++)
            views[i] = (struct pf_meta_cmd){cmds[i]->op, cmds[i]->ns, cmds[i]->hashes, cmds[i]->n};
        rc = pf_meta_coalesce(views, n, PF_META_CLIENT_CHUNK, &plan);
    }
    if (rc) {
        pf_log_ratelimited(PF_LOG_WARN, 10000, "dropping %zu MetaServer commands: %s", n,
                           strerror(-rc));
        for (size_t i = 0; i < n; i++)
            count_dropped(cmds[i]->op, cmds[i]->n);
        free(views);
        return;
    }
    bool failed = false;
    for (size_t b = 0; b < plan.nbatches; b++) {
        const struct pf_meta_batch *bt = &plan.batches[b];
        if (failed || !c->session || stopping(c)) {
            count_dropped(bt->op, bt->n);
            continue;
        }
        rc = send_batch(c, bt->op, bt->ns, bt->hashes, bt->n);
        if (rc == 0) {
            pf_metric_add(bt->op == PF_META_OP_INSERT ? m_reg_blocks : m_rem_blocks, (double)bt->n);
            continue;
        }
        count_dropped(bt->op, bt->n);
        if (rc != -EPROTO)
            failed = true; /* reset or unreachable: drop the rest of the round */
    }
    pf_meta_plan_free(&plan);
    free(views);
}

static void *client_main(void *arg)
{
    struct pf_meta_client *c = arg;
    struct cmd **batch = c->batch;
    c->backoff_ms = BACKOFF_MIN_MS;
    c->next_hb_ns = pf_now_ns();
    c->next_refresh_ns = c->refresh_ms == UINT64_MAX ? UINT64_MAX : after_ms(c->refresh_ms);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        for (;;) {
            uint64_t now = pf_now_ns();
            uint64_t wake = c->next_hb_ns < c->next_refresh_ns ? c->next_hb_ns : c->next_refresh_ns;
            if (c->resync_req) {
                c->resync_req = false;
                c->resync_pending = true;
            }
            if (c->probe_req) {
                c->probe_req = false;
                c->next_hb_ns = now;
                break;
            }
            if (c->stop || c->count || c->flush_req != c->flush_done || now >= wake ||
                (c->resync_pending && c->session))
                break;
            struct timespec ts = pf_ns_to_timespec(wake);
            pthread_cond_timedwait(&c->wake, &c->mu, &ts);
        }
        if (c->stop) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        size_t n = 0;
        while (c->count) {
            batch[n++] = c->ring[c->head];
            c->head = (c->head + 1) % c->cap;
            c->count--;
        }
        uint64_t seq = c->flush_req;
        pthread_mutex_unlock(&c->mu);

        if (pf_now_ns() >= c->next_hb_ns)
            heartbeat(c);
        if (c->resync_pending && c->session) {
            c->resync_pending = false;
            uint64_t n_ok = reregister_all(c, "resync");
            pf_metric_add(m_resync, (double)n_ok);
            if (c->refresh_ms != UINT64_MAX)
                c->next_refresh_ns = after_ms(c->refresh_ms);
        }
        if (n)
            process(c, batch, n);
        for (size_t i = 0; i < n; i++)
            free(batch[i]);
        if (pf_now_ns() >= c->next_refresh_ns) {
            if (c->session) {
                uint64_t n_ok = reregister_all(c, "refresh");
                pf_metric_add(m_refresh, (double)n_ok);
            }
            c->next_refresh_ns = after_ms(c->refresh_ms);
        }

        pthread_mutex_lock(&c->mu);
        c->flush_done = seq;
        pthread_cond_broadcast(&c->flushed);
        pthread_mutex_unlock(&c->mu);
    }
    /* stop: drop what is queued, then leave the MetaServer */
    pthread_mutex_lock(&c->mu);
    while (c->count) {
        struct cmd *cm = c->ring[c->head];
        c->head = (c->head + 1) % c->cap;
        c->count--;
        count_dropped(cm->op, cm->n);
        free(cm);
    }
    c->flush_done = c->flush_req;
    pthread_cond_broadcast(&c->flushed);
    pthread_mutex_unlock(&c->mu);
    if (c->had_session) {
        /* also after a lost session: the MetaServer may still hold our entries */
        Pegaflow__UnregisterNodeRequest req = PEGAFLOW__UNREGISTER_NODE_REQUEST__INIT;
        req.node = c->advertise;
        req.node_id = c->node_id;
        struct pf_rpc_status st = {0};
        ProtobufCMessage *resp = NULL;
        /* UNAVAILABLE may be a connection to a MetaServer that restarted since (Redis store:
         * nothing else noticed): once more on the next replica (or the same one), all within
         * UNREGISTER_MS */
        size_t ti = 0;
        int rc = -ENOTCONN;
        uint64_t t_end = pf_now_ns() + ms_to_ns(UNREGISTER_MS);
        for (size_t a = 0; a <= pf_meta_targets_count(c->tg) && pf_now_ns() < t_end; a++) {
            ti = pf_meta_targets_current(c->tg);
            rc = pf_rpc_unary(pf_meta_targets_reg(c->tg, ti), "/pegaflow.MetaServer/UnregisterNode",
                              &req.base, &pegaflow__unregister_node_response__descriptor,
                              (t_end - pf_now_ns()) / PF_NS_PER_MS + 1, &resp, &st);
            if (!rc || st.code != PF_GRPC_UNAVAILABLE)
                break;
            pf_meta_targets_failed(c->tg, ti, st.code);
        }
        if (rc) {
            pf_metric_add(m_unreg_fail, 1);
            pf_warn("UnregisterNode failed: %s: %s", pf_grpc_code_name(st.code), st.msg);
        } else {
            pf_info("unregistered from MetaServer %s (%llu owner entries removed)",
                    pf_meta_targets_name(c->tg, ti),
                    (unsigned long long)((Pegaflow__UnregisterNodeResponse *)resp)->removed_owners);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        c->session = false;
        atomic_store(&c->connected, false);
    }
    return NULL;
}

/* ------------------------------------------------------------------ API */

int pf_meta_client_create(const struct pf_meta_client_config *cfg, struct pf_meta_client **c_p)
{
    if (!cfg || !cfg->target || !*cfg->target || !cfg->advertise_addr || !*cfg->advertise_addr ||
        strlen(cfg->advertise_addr) > PF_META_NODE_MAX || cfg->queue_depth > (1u << 24))
        return -EINVAL;
    pthread_once(&metrics_once, metrics_init);
    struct pf_meta_client *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    int rc = -ENOMEM;
    c->target = strdup(cfg->target);
    c->advertise = strdup(cfg->advertise_addr);
    c->cap = cfg->queue_depth ? cfg->queue_depth : PF_META_CLIENT_QUEUE_DEFAULT;
    c->ring = calloc(c->cap, sizeof(*c->ring));
    c->batch = calloc(c->cap, sizeof(*c->batch));
    if (!c->target || !c->advertise || !c->ring || !c->batch)
        goto err_free;
    c->rpc_timeout_ms = cfg->rpc_timeout_ms ? cfg->rpc_timeout_ms : 5000;
    c->stale_secs = cfg->stale_secs_hint ? cfg->stale_secs_hint : 30;
    uint64_t rs =
        cfg->refresh_interval_secs ? cfg->refresh_interval_secs : PF_META_CLIENT_REFRESH_DEFAULT;
    c->refresh_ms = rs == UINT64_MAX || rs > UINT64_MAX / 1000000 ? UINT64_MAX : rs * 1000;
    c->apply_reclaimable = cfg->apply_reclaimable;
    c->enumerate_resident = cfg->enumerate_resident;
    c->cb_ctx = cfg->cb_ctx;
    rc = pf_uuid_v4(c->uuid);
    if (rc)
        goto err_free;
    pf_uuid_format(c->uuid, c->node_id);
    rc = pf_meta_targets_open(c->target, &c->tg);
    if (rc)
        goto err_free;
    pthread_mutex_init(&c->mu, NULL);
    if ((rc = pf_cond_init(&c->wake)) != 0)
        goto err_mu;
    if ((rc = pf_cond_init(&c->flushed)) != 0)
        goto err_wake;
    rc = pf_thread_start(&c->th, "pf-metaclient", -1, client_main, c);
    if (rc)
        goto err_flushed;
    pf_info("MetaServer client for %s: advertising %s, node_id %s, queue depth %zu, refresh "
            "every %llu s",
            c->target, c->advertise, c->node_id, c->cap,
            (unsigned long long)(c->refresh_ms == UINT64_MAX ? 0 : c->refresh_ms / 1000));
    *c_p = c;
    return 0;
err_flushed:
    pthread_cond_destroy(&c->flushed);
err_wake:
    pthread_cond_destroy(&c->wake);
err_mu:
    pthread_mutex_destroy(&c->mu);
    pf_meta_targets_close(c->tg);
err_free:
    free(c->batch);
    free(c->ring);
    free(c->advertise);
    free(c->target);
    free(c);
    return rc;
}

static int enqueue(struct pf_meta_client *c, enum pf_meta_op op, const char *ns,
                   const struct pf_meta_hash *h, size_t n)
{
    if (!c || !ns || !*ns || n == 0 || !h)
        return -EINVAL;
    size_t nslen = strlen(ns), bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (h[i].len == 0 || !h[i].data)
            return -EINVAL;
        bytes += h[i].len;
    }
    size_t hoff = (sizeof(struct cmd) + nslen + 1 + 7) & ~(size_t)7;
    struct cmd *cm = malloc(hoff + n * sizeof(struct pf_meta_hash) + bytes);
    if (!cm)
        return -ENOMEM;
    char *nsp = (char *)(cm + 1);
    memcpy(nsp, ns, nslen + 1);
    cm->op = op;
    cm->n = n;
    cm->ns = nsp;
    cm->hashes = (struct pf_meta_hash *)((char *)cm + hoff);
    uint8_t *p = (uint8_t *)(cm->hashes + n);
    for (size_t i = 0; i < n; i++) {
        memcpy(p, h[i].data, h[i].len);
        cm->hashes[i].len = h[i].len;
        cm->hashes[i].data = p;
        p += h[i].len;
    }
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (c->stop) {
        rc = -ESHUTDOWN;
    } else if (c->count == c->cap) {
        rc = -EAGAIN;
    } else {
        c->ring[(c->head + c->count) % c->cap] = cm;
        if (c->count++ == 0)
            pthread_cond_signal(&c->wake);
    }
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        free(cm);
        if (rc == -EAGAIN) {
            pf_metric_add(op == PF_META_OP_INSERT ? m_reg_full : m_rem_full, 1);
            pf_log_ratelimited(PF_LOG_WARN, 10000,
                               "MetaServer command queue full (%zu): %s of %zu hashes dropped",
                               c->cap, op == PF_META_OP_INSERT ? "registration" : "removal", n);
        }
    }
    return rc;
}

int pf_meta_client_insert(struct pf_meta_client *c, const char *ns,
                          const struct pf_meta_hash *hashes, size_t n)
{
    return enqueue(c, PF_META_OP_INSERT, ns, hashes, n);
}

int pf_meta_client_remove(struct pf_meta_client *c, const char *ns,
                          const struct pf_meta_hash *hashes, size_t n)
{
    return enqueue(c, PF_META_OP_REMOVE, ns, hashes, n);
}

int pf_meta_client_flush(struct pf_meta_client *c, uint64_t timeout_ms)
{
    struct timespec dl = pf_deadline_ms(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (c->stop) {
        pthread_mutex_unlock(&c->mu);
        return -ESHUTDOWN;
    }
    uint64_t my = ++c->flush_req;
    pthread_cond_signal(&c->wake);
    while (c->flush_done < my && !c->stop) {
        if (pthread_cond_timedwait(&c->flushed, &c->mu, &dl) == ETIMEDOUT) {
            rc = c->flush_done >= my ? 0 : -ETIMEDOUT;
            break;
        }
    }
    if (rc == 0 && c->flush_done < my)
        rc = -ESHUTDOWN;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void pf_meta_client_resync(struct pf_meta_client *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->resync_req = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
}

void pf_meta_client_stop(struct pf_meta_client *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->wake);
    pthread_cond_broadcast(&c->flushed);
    bool join = !c->joined;
    c->joined = true;
    pthread_mutex_unlock(&c->mu);
    if (join)
        pthread_join(c->th, NULL);
}

void pf_meta_client_destroy(struct pf_meta_client *c)
{
    if (!c)
        return;
    pf_meta_client_stop(c);
    pf_meta_targets_close(c->tg);
    pthread_cond_destroy(&c->flushed);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->mu);
    free(c->batch);
    free(c->ring);
    free(c->advertise);
    free(c->target);
    free(c);
}

const char *pf_meta_client_node_id(const struct pf_meta_client *c)
{
    return c->node_id;
}

bool pf_meta_client_connected(const struct pf_meta_client *c)
{
    return atomic_load(&((struct pf_meta_client *)c)->connected);
}

/* ------------------------------------------------------------------ for client_query.c */

bool pf_meta_client_stopping(struct pf_meta_client *c)
{
    return stopping(c);
}

struct pf_meta_targets *pf_meta_client_targets(struct pf_meta_client *c)
{
    return c->tg;
}

void pf_meta_client_query_failed(struct pf_meta_client *c, bool unreachable)
{
    pf_metric_add(m_query_fail, 1);
    /* unreachable or hung: let the heartbeat confirm at once, so that further queries are
     * skipped (pf_meta_client_connected) instead of each waiting its deadline */
    if (!unreachable || !atomic_load(&c->connected))
        return;
    pthread_mutex_lock(&c->mu);
    c->probe_req = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
}

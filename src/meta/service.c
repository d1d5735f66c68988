/* Handlers of service pegaflow.MetaServer over the store, and the sweep thread.
 *
 * Every request field is validated before the store sees it; errors name the field.
 * Store errors map to gRPC codes: -ENOENT -> FAILED_PRECONDITION "unknown node",
 * -ESTALE -> FAILED_PRECONDITION "stale node session", -ENOMEM/-ENOSPC ->
 * RESOURCE_EXHAUSTED, -ENOTCONN (Redis store unreachable) -> UNAVAILABLE. Empty Insert/Remove lists
 * get an OK RPC with status.ok=false "block_hashes cannot be empty" (reference behaviour); an empty
 * QueryPrefixBlocks list is INVALID_ARGUMENT. */
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "metaserver"
#include "engine.pb-c.h"
#include "pf/log.h"
#include "pf/meta.h"
#include "pf/thread.h"
#include "pf/util.h"
#include "rpc/wire_decode.h"

_Static_assert(sizeof(struct pf_meta_hash) == sizeof(ProtobufCBinaryData) &&
                   offsetof(struct pf_meta_hash, len) == offsetof(ProtobufCBinaryData, len) &&
                   offsetof(struct pf_meta_hash, data) == offsetof(ProtobufCBinaryData, data),
               "pf_meta_hash must match ProtobufCBinaryData");

static int fail_store(struct pf_rpc_call *call, int rc, const char *node)
{
    switch (rc) {
    case -ENOENT:
        return pf_rpc_fail(call, PF_GRPC_FAILED_PRECONDITION, "unknown node");
    case -ESTALE:
        return pf_rpc_fail(call, PF_GRPC_FAILED_PRECONDITION, "stale node session");
    case -ENOMEM:
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "MetaServer out of memory");
    case -ENOSPC:
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED,
                           "store limit: 65535 owners for one block, 4194304 namespaces");
    case -EINVAL:
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "invalid request from node '%s'", node);
    case -ENOTCONN:
        return pf_rpc_fail(call, PF_GRPC_UNAVAILABLE, "metadata store (Redis) unreachable");
    case -EPROTO:
        return pf_rpc_fail(call, PF_GRPC_INTERNAL, "metadata store (Redis) answered unexpectedly");
    default:
        return pf_rpc_fail(call, PF_GRPC_INTERNAL, "store error %d", rc);
    }
}

/* node (the advertised address) and node_id (UUID). */
static int check_node(struct pf_rpc_call *call, const char *node, const char *node_id,
                      uint8_t id[16])
{
    if (!node_id || pf_uuid_parse(node_id, id) != 0)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                           "node_id: '%.64s' is not a UUID (expected "
                           "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                           node_id ? node_id : "");
    if (!node || !*node)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                           "node: must not be empty (the node's advertised host:port)");
    if (strnlen(node, PF_META_NODE_MAX + 1) > PF_META_NODE_MAX)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "node: longer than %u bytes",
                           PF_META_NODE_MAX);
    return 0;
}

static int check_ns(struct pf_rpc_call *call, const char *ns)
{
    if (!ns || !*ns)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "namespace: must not be empty");
    if (strnlen(ns, PF_META_NS_MAX + 1) > PF_META_NS_MAX)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "namespace: longer than %u bytes",
                           PF_META_NS_MAX);
    return 0;
}

static int check_hashes(struct pf_rpc_call *call, const ProtobufCBinaryData *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (h[i].len == 0)
            return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                               "block_hashes[%zu]: empty hash (0 bytes)", i);
        if (h[i].len > PF_META_HASH_MAX)
            return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                               "block_hashes[%zu]: %zu bytes, longer than %u", i, h[i].len,
                               PF_META_HASH_MAX);
    }
    return 0;
}

/* The host part of "host:port", "[v6]:port", or of a gRPC peer ("ipv4:h:p", "ipv6:[h]:p",
 * brackets possibly percent-encoded), lower-cased into out; false when there is none. */
static bool host_part(const char *a, char *out, size_t cap)
{
    if (strncmp(a, "ipv4:", 5) == 0 || strncmp(a, "ipv6:", 5) == 0)
        a += 5;
    else if (strncmp(a, "unix:", 5) == 0)
        return false;
    size_t n = 0;
    const char *end = strrchr(a, ':');
    if (!end || end == a)
        return false;
    for (const char *p = a; p < end && n + 1 < cap; p++) {
        if (*p == '[' || *p == ']')
            continue;
        if (p[0] == '%' && (strncmp(p, "%5B", 3) == 0 || strncmp(p, "%5D", 3) == 0 ||
                            strncmp(p, "%5b", 3) == 0 || strncmp(p, "%5d", 3) == 0)) {
            p += 2;
            continue;
        }
        out[n++] = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    }
    out[n] = '\0';
    return n > 0;
}

static bool is_loopback(const char *h)
{
    return strncmp(h, "127.", 4) == 0 || strcmp(h, "::1") == 0;
}

/* A restarted server asks to replace its previous life's session at once (replace). Only a
 * caller that connects from the very host it advertises may: a stranger elsewhere cannot
 * evict a live node, and where the MetaServer requires the cluster token or client
 * certificates only a member gets this far. Otherwise the previous session must go stale. */
static bool may_replace(struct pf_rpc_call *call, const char *node)
{
    char want[PF_META_NODE_MAX + 1], got[PF_META_NODE_MAX + 1];
    if (!host_part(node, want, sizeof(want)) ||
        !host_part(pf_rpc_call_peer(call), got, sizeof(got)))
        return false;
    /* loopback names this host whatever address of 127/8 the kernel picked as the source */
    return strcmp(want, got) == 0 || (is_loopback(want) && is_loopback(got));
}

static int h_heartbeat(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *msg)
{
    struct pf_meta_store *st = ctx;
    const Pegaflow__HeartbeatNodeRequest *req = (const Pegaflow__HeartbeatNodeRequest *)msg;
    uint8_t id[16];
    int rc = check_node(call, req->node, req->node_id, id);
    if (rc)
        return rc;
    bool replace = req->replace && may_replace(call, req->node);
    if (req->replace && !replace)
        pf_log_ratelimited(PF_LOG_WARN, 10000,
                           "node %s asked to replace its session from %s, another host: refused "
                           "(the previous session must go stale)",
                           req->node, pf_rpc_call_peer(call));
    rc = pf_meta_store_heartbeat_replace(st, req->node, id, replace);
    if (rc)
        return fail_store(call, rc, req->node);
    Pegaflow__HeartbeatNodeResponse resp = PEGAFLOW__HEARTBEAT_NODE_RESPONSE__INIT;
    resp.stale_after_secs = pf_meta_store_stale_secs(st);
    return pf_rpc_respond(call, &resp.base);
}

static int h_unregister(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *msg)
{
    struct pf_meta_store *st = ctx;
    const Pegaflow__UnregisterNodeRequest *req = (const Pegaflow__UnregisterNodeRequest *)msg;
    uint8_t id[16];
    int rc = check_node(call, req->node, req->node_id, id);
    if (rc)
        return rc;
    uint64_t removed = 0;
    rc = pf_meta_store_unregister(st, req->node, id, &removed);
    if (rc)
        return fail_store(call, rc, req->node);
    pf_info("node %s (session %s) unregistered: %llu owner entries removed", req->node,
            req->node_id, (unsigned long long)removed);
    Pegaflow__UnregisterNodeResponse resp = PEGAFLOW__UNREGISTER_NODE_RESPONSE__INIT;
    resp.removed_owners = removed;
    return pf_rpc_respond(call, &resp.base);
}

static int h_insert(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *msg)
{
    struct pf_meta_store *st = ctx;
    const Pegaflow__InsertBlockHashesRequest *req = (const Pegaflow__InsertBlockHashesRequest *)msg;
    uint8_t id[16];
    int rc = check_node(call, req->node, req->node_id, id);
    if (!rc)
        rc = check_ns(call, req->namespace_);
    if (rc)
        return rc;
    Pegaflow__ResponseStatus status = PEGAFLOW__RESPONSE_STATUS__INIT;
    Pegaflow__InsertBlockHashesResponse resp = PEGAFLOW__INSERT_BLOCK_HASHES_RESPONSE__INIT;
    resp.status = &status;
    if (req->n_block_hashes == 0) {
        status.ok = 0;
        status.message = "block_hashes cannot be empty";
        return pf_rpc_respond(call, &resp.base);
    }
    rc = check_hashes(call, req->block_hashes, req->n_block_hashes);
    if (rc)
        return rc;
    size_t n = req->n_block_hashes;
    bool *recl = malloc(n * sizeof(*recl));
    ProtobufCBinaryData *out = NULL;
    if (!recl)
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "MetaServer out of memory");
    rc = pf_meta_store_insert(st, req->namespace_, (const struct pf_meta_hash *)req->block_hashes,
                              n, req->node, id, recl);
    if (rc) {
        rc = fail_store(call, rc, req->node);
        goto out;
    }
    size_t nrecl = 0;
    for (size_t i = 0; i < n; i++)
        nrecl += recl[i];
    if (nrecl) {
        out = malloc(nrecl * sizeof(*out));
        if (!out) {
            rc = pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "MetaServer out of memory");
            goto out;
        }
        size_t j = 0;
        for (size_t i = 0; i < n; i++)
            if (recl[i])
                out[j++] = req->block_hashes[i];
    }
    pf_debug("InsertBlockHashes from %s: %zu hashes in namespace %s (%zu reclaimable)", req->node,
             n, req->namespace_, nrecl);
    status.ok = 1;
    status.message = "";
    resp.inserted_count = n;
    resp.n_reclaimable_hashes = nrecl;
    resp.reclaimable_hashes = out;
    rc = pf_rpc_respond(call, &resp.base);
out:
    free(out);
    free(recl);
    return rc;
}

static int h_remove(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *msg)
{
    struct pf_meta_store *st = ctx;
    const Pegaflow__RemoveBlockHashesRequest *req = (const Pegaflow__RemoveBlockHashesRequest *)msg;
    uint8_t id[16];
    int rc = check_node(call, req->node, req->node_id, id);
    if (!rc)
        rc = check_ns(call, req->namespace_);
    if (rc)
        return rc;
    Pegaflow__ResponseStatus status = PEGAFLOW__RESPONSE_STATUS__INIT;
    Pegaflow__RemoveBlockHashesResponse resp = PEGAFLOW__REMOVE_BLOCK_HASHES_RESPONSE__INIT;
    resp.status = &status;
    if (req->n_block_hashes == 0) {
        status.ok = 0;
        status.message = "block_hashes cannot be empty";
        return pf_rpc_respond(call, &resp.base);
    }
    rc = check_hashes(call, req->block_hashes, req->n_block_hashes);
    if (rc)
        return rc;
    uint64_t removed = 0;
    rc = pf_meta_store_remove(st, req->namespace_, (const struct pf_meta_hash *)req->block_hashes,
                              req->n_block_hashes, req->node, id, &removed);
    if (rc)
        return fail_store(call, rc, req->node);
    pf_debug("RemoveBlockHashes from %s: %zu hashes in namespace %s (%llu removed)", req->node,
             req->n_block_hashes, req->namespace_, (unsigned long long)removed);
    status.ok = 1;
    status.message = "";
    resp.removed_count = removed;
    return pf_rpc_respond(call, &resp.base);
}

/* Raw: the request (pf_rpc_validate's rules already checked by the server) is decoded in
 * place (rpc/wire_decode.h), the hashes pointing into the request bytes. */
static int h_query(void *ctx, struct pf_rpc_call *call, const uint8_t *data, size_t len)
{
    struct pf_meta_store *st = ctx;
    struct pf_wire_prefix_query req;
    int rc = pf_wire_decode_prefix_query(data, len, &req);
    if (rc == -ENOMEM)
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "MetaServer out of memory");
    if (rc)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                           "malformed QueryPrefixBlocksRequest (protobuf decoding failed)");
    rc = check_ns(call, req.ns);
    if (rc)
        goto out_req;
    if (req.n == 0) {
        rc = pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "block_hashes cannot be empty");
        goto out_req;
    }
    rc = check_hashes(call, (const ProtobufCBinaryData *)req.hashes, req.n);
    if (rc)
        goto out_req;
    struct pf_meta_prefix *res = NULL;
    size_t nres = 0;
    rc = pf_meta_store_query_prefix(st, req.ns, req.hashes, req.n, &res, &nres);
    if (rc) {
        rc = fail_store(call, rc, "");
        goto out_req;
    }
    Pegaflow__NodePrefix *np = NULL, **npp = NULL;
    if (nres) {
        np = calloc(nres, sizeof(*np));
        npp = calloc(nres, sizeof(*npp));
        if (!np || !npp) {
            rc = pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "MetaServer out of memory");
            goto out;
        }
        for (size_t i = 0; i < nres; i++) {
            pegaflow__node_prefix__init(&np[i]);
            np[i].node = res[i].node;
            /* uint32 on the wire (the reference's type); a prefix is one request's hashes */
            np[i].prefix_len =
                res[i].prefix_len > UINT32_MAX ? UINT32_MAX : (uint32_t)res[i].prefix_len;
            npp[i] = &np[i];
        }
    }
    Pegaflow__QueryPrefixBlocksResponse resp = PEGAFLOW__QUERY_PREFIX_BLOCKS_RESPONSE__INIT;
    resp.n_nodes = nres;
    resp.nodes = npp;
    rc = pf_rpc_respond(call, &resp.base);
out:
    free(npp);
    free(np);
    free(res);
out_req:
    pf_wire_prefix_query_free(&req);
    return rc;
}

const struct pf_rpc_method pf_meta_methods[] = {
    {.path = "/pegaflow.MetaServer/HeartbeatNode",
     .metric_name = "heartbeat_node",
     .req_desc = &pegaflow__heartbeat_node_request__descriptor,
     .unary = h_heartbeat},
    {.path = "/pegaflow.MetaServer/UnregisterNode",
     .metric_name = "unregister_node",
     .req_desc = &pegaflow__unregister_node_request__descriptor,
     .unary = h_unregister},
    {.path = "/pegaflow.MetaServer/InsertBlockHashes",
     .metric_name = "insert_block_hashes",
     .req_desc = &pegaflow__insert_block_hashes_request__descriptor,
     .unary = h_insert},
    {.path = "/pegaflow.MetaServer/RemoveBlockHashes",
     .metric_name = "remove_block_hashes",
     .req_desc = &pegaflow__remove_block_hashes_request__descriptor,
     .unary = h_remove},
    {.path = "/pegaflow.MetaServer/QueryPrefixBlocks",
     .metric_name = "query_prefix_blocks",
     .req_desc = &pegaflow__query_prefix_blocks_request__descriptor,
     .raw = h_query},
};
const size_t pf_meta_nmethods = PF_ARRAY_SIZE(pf_meta_methods);

/* ------------------------------------------------------------------ sweeper */

struct pf_meta_sweeper {
    struct pf_meta_store *st;
    uint64_t interval_ms;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
};

static void *sweeper_main(void *arg)
{
    struct pf_meta_sweeper *sw = arg;
    pthread_mutex_lock(&sw->mu);
    for (;;) {
        struct timespec dl = pf_deadline_ms(sw->interval_ms);
        while (!sw->stop && pthread_cond_timedwait(&sw->cv, &sw->mu, &dl) != ETIMEDOUT)
            ;
        if (sw->stop)
            break;
        pthread_mutex_unlock(&sw->mu);
        uint64_t t0 = pf_now_ns();
        pf_meta_store_sweep(sw->st, NULL);
        pf_debug("sweep took %.1f ms", (double)(pf_now_ns() - t0) / 1e6);
        pthread_mutex_lock(&sw->mu);
    }
    pthread_mutex_unlock(&sw->mu);
    return NULL;
}

int pf_meta_sweeper_start(struct pf_meta_store *st, uint64_t interval_secs,
                          struct pf_meta_sweeper **sw_p)
{
    if (!st || interval_secs == 0 || interval_secs > UINT64_MAX / 1000)
        return -EINVAL;
    struct pf_meta_sweeper *sw = calloc(1, sizeof(*sw));
    if (!sw)
        return -ENOMEM;
    sw->st = st;
    sw->interval_ms = interval_secs * 1000;
    pthread_mutex_init(&sw->mu, NULL);
    int rc = pf_cond_init(&sw->cv);
    if (rc)
        goto err_mu;
    rc = pf_thread_start(&sw->th, "pf-meta-sweep", -1, sweeper_main, sw);
    if (rc)
        goto err_cv;
    *sw_p = sw;
    return 0;
err_cv:
    pthread_cond_destroy(&sw->cv);
err_mu:
    pthread_mutex_destroy(&sw->mu);
    free(sw);
    return rc;
}

void pf_meta_sweeper_stop(struct pf_meta_sweeper *sw)
{
    if (!sw)
        return;
    pthread_mutex_lock(&sw->mu);
    sw->stop = true;
    pthread_cond_signal(&sw->cv);
    pthread_mutex_unlock(&sw->mu);
    pthread_join(sw->th, NULL);
    pthread_cond_destroy(&sw->cv);
    pthread_mutex_destroy(&sw->mu);
    free(sw);
}

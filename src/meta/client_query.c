/* Server-side MetaServer client, the synchronous side (contract in pf/meta_client.h):
 * QueryPrefixBlocks against the current replica (failing over on UNAVAILABLE) and the choice
 * of the best holder. Registration, heartbeats and the command thread are in client.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "metaclient"
#include "engine.pb-c.h"
#include "pf/log.h"
#include "meta/meta_internal.h"
#include "pf/meta_client.h"
#include "pf/rpc.h"

struct pf_meta_query {
    struct pf_meta_client *c;
    struct pf_meta_targets *tg;
    Pegaflow__QueryPrefixBlocksRequest req; /* points at the caller's ns and hashes */
    uint64_t timeout_ms;
    size_t ti;       /* replica the pending call went to */
    size_t attempts; /* replicas tried so far */
    struct pf_rpc_pending *call;
};

#define QUERY_PATH "/pegaflow.MetaServer/QueryPrefixBlocks"

static void query_failed(struct pf_meta_query *q, const struct pf_rpc_status *st)
{
    pf_log_ratelimited(PF_LOG_DEBUG, 5000, "QueryPrefixBlocks failed: %s: %s",
                       pf_grpc_code_name(st->code), st->msg);
    pf_meta_client_query_failed(q->c, st->code == PF_GRPC_UNAVAILABLE ||
                                          st->code == PF_GRPC_DEADLINE_EXCEEDED);
}

/* Starts the call on the current replica. */
static int query_send(struct pf_meta_query *q, struct pf_rpc_status *st)
{
    q->ti = pf_meta_targets_current(q->tg);
    q->attempts++;
    return pf_rpc_unary_start(pf_meta_targets_query(q->tg, q->ti), QUERY_PATH, &q->req.base,
                              q->timeout_ms, &q->call, st);
}

int pf_meta_client_query_prefix_start(struct pf_meta_client *c, const char *ns,
                                      const struct pf_meta_hash *hashes, size_t n,
                                      uint64_t timeout_ms, struct pf_meta_query **q_p)
{
    if (!c || !ns || !*ns || n == 0 || !hashes)
        return -EINVAL;
    if (pf_meta_client_stopping(c))
        return -ESHUTDOWN;
    struct pf_meta_query *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    q->c = c;
    q->tg = pf_meta_client_targets(c);
    q->req = (Pegaflow__QueryPrefixBlocksRequest)PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    q->req.namespace_ = (char *)ns;
    q->req.n_block_hashes = n;
    q->req.block_hashes = (ProtobufCBinaryData *)hashes;
    q->timeout_ms = timeout_ms;
    struct pf_rpc_status st = {0};
    int rc = query_send(q, &st);
    if (rc) {
        query_failed(q, &st);
        free(q);
        return rc;
    }
    *q_p = q;
    return 0;
}

/* The answer's holders with a prefix, as one malloc'ed block. */
static int to_prefixes(const Pegaflow__QueryPrefixBlocksResponse *resp,
                       struct pf_meta_prefix **res_p, size_t *nres_p)
{
    size_t bytes = 0, nres = 0;
    for (size_t i = 0; i < resp->n_nodes; i++)
        if (resp->nodes[i]->node && resp->nodes[i]->prefix_len) {
            bytes += strlen(resp->nodes[i]->node) + 1;
            nres++;
        }
    struct pf_meta_prefix *res = NULL;
    if (nres) {
        res = malloc(nres * sizeof(*res) + bytes);
        if (!res)
            return -ENOMEM;
        char *p = (char *)(res + nres);
        size_t j = 0;
        for (size_t i = 0; i < resp->n_nodes; i++) {
            const Pegaflow__NodePrefix *np = resp->nodes[i];
            if (!np->node || !np->prefix_len)
                continue;
            size_t l = strlen(np->node) + 1;
            memcpy(p, np->node, l);
            res[j].node = p;
            res[j].prefix_len = np->prefix_len;
            p += l;
            j++;
        }
    }
    *res_p = res;
    *nres_p = nres;
    return 0;
}

int pf_meta_client_query_prefix_finish(struct pf_meta_query *q, struct pf_meta_prefix **res_p,
                                       size_t *nres_p)
{
    struct pf_rpc_status st = {0};
    ProtobufCMessage *m = NULL;
    int rc = pf_rpc_unary_finish(q->call, &pegaflow__query_prefix_blocks_response__descriptor,
                                 res_p ? &m : NULL, &st);
    if (!res_p) {
        free(q);
        return rc;
    }
    /* on UNAVAILABLE the next replica is tried at once (each at most once) */
    while (rc && pf_meta_targets_failed(q->tg, q->ti, st.code) && st.code == PF_GRPC_UNAVAILABLE &&
           q->attempts < pf_meta_targets_count(q->tg)) {
        rc = query_send(q, &st);
        if (!rc)
            rc = pf_rpc_unary_finish(q->call, &pegaflow__query_prefix_blocks_response__descriptor,
                                     &m, &st);
    }
    if (rc) {
        query_failed(q, &st);
        free(q);
        return rc;
    }
    free(q);
    rc = to_prefixes((Pegaflow__QueryPrefixBlocksResponse *)m, res_p, nres_p);
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}

int pf_meta_client_query_prefix(struct pf_meta_client *c, const char *ns,
                                const struct pf_meta_hash *hashes, size_t n, uint64_t timeout_ms,
                                struct pf_meta_prefix **res_p, size_t *nres_p)
{
    struct pf_meta_query *q;
    int rc = pf_meta_client_query_prefix_start(c, ns, hashes, n, timeout_ms, &q);
    return rc ? rc : pf_meta_client_query_prefix_finish(q, res_p, nres_p);
}

ptrdiff_t pf_meta_prefix_best(const struct pf_meta_prefix *res, size_t n, const char *exclude)
{
    ptrdiff_t best = -1;
    for (size_t i = 0; i < n; i++) {
        if (res[i].prefix_len == 0 || (exclude && strcmp(res[i].node, exclude) == 0))
            continue;
        if (best < 0 || res[i].prefix_len > res[best].prefix_len)
            best = (ptrdiff_t)i;
    }
    return best;
}

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

int pf_meta_client_query_prefix(struct pf_meta_client *c, const char *ns,
                                const struct pf_meta_hash *hashes, size_t n, uint64_t timeout_ms,
                                struct pf_meta_prefix **res_p, size_t *nres_p)
{
    if (!c || !ns || !*ns || n == 0 || !hashes)
        return -EINVAL;
    if (pf_meta_client_stopping(c))
        return -ESHUTDOWN;
    struct pf_meta_targets *tg = pf_meta_client_targets(c);
    Pegaflow__QueryPrefixBlocksRequest req = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    req.namespace_ = (char *)ns;
    req.n_block_hashes = n;
    req.block_hashes = (ProtobufCBinaryData *)hashes;
    struct pf_rpc_status st = {0};
    ProtobufCMessage *m = NULL;
    /* on UNAVAILABLE the next replica is tried at once (each at most once) */
    int rc = -ENOTCONN;
    for (size_t attempt = 0; attempt < pf_meta_targets_count(tg); attempt++) {
        size_t ti = pf_meta_targets_current(tg);
        rc = pf_rpc_unary(pf_meta_targets_query(tg, ti), "/pegaflow.MetaServer/QueryPrefixBlocks",
                          &req.base, &pegaflow__query_prefix_blocks_response__descriptor,
                          timeout_ms, &m, &st);
        if (!rc || !pf_meta_targets_failed(tg, ti, st.code) || st.code != PF_GRPC_UNAVAILABLE)
            break;
    }
    if (rc) {
        pf_log_ratelimited(PF_LOG_DEBUG, 5000, "QueryPrefixBlocks failed: %s: %s",
                           pf_grpc_code_name(st.code), st.msg);
        pf_meta_client_query_failed(c, st.code == PF_GRPC_UNAVAILABLE ||
                                           st.code == PF_GRPC_DEADLINE_EXCEEDED);
        return rc;
    }
    Pegaflow__QueryPrefixBlocksResponse *resp = (Pegaflow__QueryPrefixBlocksResponse *)m;
    size_t bytes = 0, nres = 0;
    for (size_t i = 0; i < resp->n_nodes; i++)
        if (resp->nodes[i]->node && resp->nodes[i]->prefix_len) {
            bytes += strlen(resp->nodes[i]->node) + 1;
            nres++;
        }
    struct pf_meta_prefix *res = NULL;
    if (nres) {
        res = malloc(nres * sizeof(*res) + bytes);
        if (!res) {
            protobuf_c_message_free_unpacked(m, NULL);
            return -ENOMEM;
        }
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
    protobuf_c_message_free_unpacked(m, NULL);
    *res_p = res;
    *nres_p = nres;
    return 0;
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

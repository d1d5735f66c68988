/* QueryPrefixBlocks for tests and benches (pfmeta.h). */
#include <stdlib.h>
#include <string.h>

#include "engine.pb-c.h"
#include "pf/rpc.h"
#include "pfmeta.h"

long pft_meta_prefix(struct pf_rpc_channel *ch, const char *ns, const uint8_t *hashes,
                     size_t hash_len, size_t n, const char *node_addr, long *others_max,
                     uint64_t timeout_ms)
{
    ProtobufCBinaryData *b = malloc((n ? n : 1) * sizeof(*b));
    if (!b)
        return -1;
    for (size_t i = 0; i < n; i++)
        b[i] = (ProtobufCBinaryData){hash_len, (uint8_t *)hashes + i * hash_len};
    Pegaflow__QueryPrefixBlocksRequest req = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    req.namespace_ = (char *)ns;
    req.n_block_hashes = n;
    req.block_hashes = b;
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st;
    long v = -1;
    if (pf_rpc_unary(ch, "/pegaflow.MetaServer/QueryPrefixBlocks", &req.base,
                     &pegaflow__query_prefix_blocks_response__descriptor, timeout_ms, &resp,
                     &st) == 0) {
        const Pegaflow__QueryPrefixBlocksResponse *r = (const void *)resp;
        v = 0;
        for (size_t i = 0; i < r->n_nodes; i++)
            if (strcmp(r->nodes[i]->node, node_addr) == 0)
                v = (long)r->nodes[i]->prefix_len;
            else if (others_max && (long)r->nodes[i]->prefix_len > *others_max)
                *others_max = (long)r->nodes[i]->prefix_len;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    free(b);
    return v;
}

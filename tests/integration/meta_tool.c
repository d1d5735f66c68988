/* meta_tool: sends one MetaServer RPC and prints the answer, for the integration scripts.
 *
 *   meta_tool TARGET heartbeat NODE NODE_ID
 *   meta_tool TARGET unregister NODE NODE_ID
 *   meta_tool TARGET insert NS NODE NODE_ID HASH...
 *   meta_tool TARGET remove NS NODE NODE_ID HASH...
 *   meta_tool TARGET query NS HASH...
 *
 * HASH: "-" is an empty (0-byte) hash; "@NAME:A-B" expands to the ASCII keys NAME-A ..
 * NAME-B; anything else is taken as the hash's bytes. NS "-" is the empty namespace.
 * Output: "ok ..." (query: "ok nodes=K" then "NODE PREFIX_LEN" lines, sorted) and exit 0,
 * or "error CODE: message" and exit 3. Usage errors exit 2. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.pb-c.h"
#include "pf/rpc.h"

static ProtobufCBinaryData *hashes;
static size_t nhashes, caphashes;

static void add_hash(const void *data, size_t len)
{
    if (nhashes == caphashes) {
        caphashes = caphashes ? caphashes * 2 : 64;
        hashes = realloc(hashes, caphashes * sizeof(*hashes));
        if (!hashes)
            exit(2);
    }
    uint8_t *p = malloc(len ? len : 1);
    if (!p)
        exit(2);
    memcpy(p, data, len);
    hashes[nhashes].data = p;
    hashes[nhashes].len = len;
    nhashes++;
}

static void parse_hashes(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-") == 0) {
            add_hash("", 0);
        } else if (a[0] == '@' && strchr(a, ':')) {
            const char *colon = strrchr(a, ':');
            char name[256];
            snprintf(name, sizeof(name), "%.*s", (int)(colon - a - 1), a + 1);
            unsigned long lo, hi;
            if (sscanf(colon + 1, "%lu-%lu", &lo, &hi) != 2 || hi < lo) {
                fprintf(stderr, "bad range %s\n", a);
                exit(2);
            }
            for (unsigned long k = lo; k <= hi; k++) {
                char key[300];
                int n = snprintf(key, sizeof(key), "%s-%lu", name, k);
                add_hash(key, (size_t)n);
            }
        } else {
            add_hash(a, strlen(a));
        }
    }
}

static int report(int rc, const struct pf_rpc_status *st)
{
    if (rc == 0)
        return 0;
    printf("error %s: %s\n", pf_grpc_code_name(st->code), st->msg);
    return 3;
}

static int cmp_lines(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: meta_tool TARGET heartbeat|unregister|insert|remove|query ...\n");
        return 2;
    }
    struct pf_rpc_channel *ch;
    if (pf_rpc_channel_open(argv[1], &ch) != 0) {
        fprintf(stderr, "cannot open channel to %s\n", argv[1]);
        return 2;
    }
    const char *cmd = argv[2];
    struct pf_rpc_status st = {0};
    ProtobufCMessage *resp = NULL;
    int rc, ex = 0;
    const uint64_t tmo = 10000;
    if (strcmp(cmd, "heartbeat") == 0 && argc == 5) {
        Pegaflow__HeartbeatNodeRequest req = PEGAFLOW__HEARTBEAT_NODE_REQUEST__INIT;
        req.node = argv[3];
        req.node_id = argv[4];
        rc = pf_rpc_unary(ch, "/pegaflow.MetaServer/HeartbeatNode", &req.base,
                          &pegaflow__heartbeat_node_response__descriptor, tmo, &resp, &st);
        if (!(ex = report(rc, &st)))
            printf("ok stale_after_secs=%llu\n",
                   (unsigned long long)((Pegaflow__HeartbeatNodeResponse *)resp)->stale_after_secs);
    } else if (strcmp(cmd, "unregister") == 0 && argc == 5) {
        Pegaflow__UnregisterNodeRequest req = PEGAFLOW__UNREGISTER_NODE_REQUEST__INIT;
        req.node = argv[3];
        req.node_id = argv[4];
        rc = pf_rpc_unary(ch, "/pegaflow.MetaServer/UnregisterNode", &req.base,
                          &pegaflow__unregister_node_response__descriptor, tmo, &resp, &st);
        if (!(ex = report(rc, &st)))
            printf("ok removed_owners=%llu\n",
                   (unsigned long long)((Pegaflow__UnregisterNodeResponse *)resp)->removed_owners);
    } else if ((strcmp(cmd, "insert") == 0 || strcmp(cmd, "remove") == 0) && argc >= 6) {
        parse_hashes(argc - 6, argv + 6);
        char *ns = strcmp(argv[3], "-") == 0 ? "" : argv[3];
        if (cmd[0] == 'i') {
            Pegaflow__InsertBlockHashesRequest req = PEGAFLOW__INSERT_BLOCK_HASHES_REQUEST__INIT;
            req.namespace_ = ns;
            req.node = argv[4];
            req.node_id = argv[5];
            req.n_block_hashes = nhashes;
            req.block_hashes = hashes;
            rc = pf_rpc_unary(ch, "/pegaflow.MetaServer/InsertBlockHashes", &req.base,
                              &pegaflow__insert_block_hashes_response__descriptor, tmo, &resp, &st);
            if (!(ex = report(rc, &st))) {
                Pegaflow__InsertBlockHashesResponse *r = (void *)resp;
                printf("ok status.ok=%d inserted=%llu reclaimable=%zu message=%s\n",
                       r->status ? r->status->ok : -1, (unsigned long long)r->inserted_count,
                       r->n_reclaimable_hashes,
                       r->status && r->status->message ? r->status->message : "");
            }
        } else {
            Pegaflow__RemoveBlockHashesRequest req = PEGAFLOW__REMOVE_BLOCK_HASHES_REQUEST__INIT;
            req.namespace_ = ns;
            req.node = argv[4];
            req.node_id = argv[5];
            req.n_block_hashes = nhashes;
            req.block_hashes = hashes;
            rc = pf_rpc_unary(ch, "/pegaflow.MetaServer/RemoveBlockHashes", &req.base,
                              &pegaflow__remove_block_hashes_response__descriptor, tmo, &resp, &st);
            if (!(ex = report(rc, &st))) {
                Pegaflow__RemoveBlockHashesResponse *r = (void *)resp;
                printf("ok status.ok=%d removed=%llu message=%s\n", r->status ? r->status->ok : -1,
                       (unsigned long long)r->removed_count,
                       r->status && r->status->message ? r->status->message : "");
            }
        }
    } else if (strcmp(cmd, "query") == 0 && argc >= 4) {
        parse_hashes(argc - 4, argv + 4);
        Pegaflow__QueryPrefixBlocksRequest req = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
        req.namespace_ = strcmp(argv[3], "-") == 0 ? "" : argv[3];
        req.n_block_hashes = nhashes;
        req.block_hashes = hashes;
        rc = pf_rpc_unary(ch, "/pegaflow.MetaServer/QueryPrefixBlocks", &req.base,
                          &pegaflow__query_prefix_blocks_response__descriptor, tmo, &resp, &st);
        if (!(ex = report(rc, &st))) {
            Pegaflow__QueryPrefixBlocksResponse *r = (void *)resp;
            char **lines = calloc(r->n_nodes + 1, sizeof(*lines));
            for (size_t i = 0; i < r->n_nodes; i++) {
                lines[i] = malloc(strlen(r->nodes[i]->node) + 32);
                sprintf(lines[i], "%s %llu", r->nodes[i]->node,
                        (unsigned long long)r->nodes[i]->prefix_len);
            }
            qsort(lines, r->n_nodes, sizeof(*lines), cmp_lines);
            printf("ok nodes=%zu\n", r->n_nodes);
            for (size_t i = 0; i < r->n_nodes; i++) {
                printf("%s\n", lines[i]);
                free(lines[i]);
            }
            free(lines);
        }
    } else {
        fprintf(stderr, "bad command or arguments\n");
        ex = 2;
    }
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    for (size_t i = 0; i < nhashes; i++)
        free(hashes[i].data);
    free(hashes);
    pf_rpc_channel_close(ch);
    return ex;
}

/* auth_tool: one gRPC call with chosen credentials, for the security tests (test_auth.sh).
 *
 *   auth_tool TARGET METHOD [--ca FILE] [--cert FILE --key FILE] [--token TOKEN] [--tls]
 *             [--timeout-ms N]
 *
 * METHOD: Health, Shutdown, Save, Load, QueryPrefetch, Release, UnregisterContext,
 * RegisterContextBatch, Session, QueryBlocksForTransfer, ReleaseTransferLock, RdmaHandshake
 * (service pegaflow.Engine), or meta.Name for pegaflow.MetaServer (meta.QueryPrefixBlocks,
 * meta.HeartbeatNode, ...). The request is an empty message of the method's type with the
 * required strings filled with harmless values (an instance/namespace nobody uses), so an
 * authorised call gets an application answer (OK, NOT_FOUND, INVALID_ARGUMENT, ...) and a
 * refused one gets UNAUTHENTICATED / PERMISSION_DENIED / UNAVAILABLE (TLS handshake failed).
 * Prints the status code name (OK, UNAUTHENTICATED, ...) and the message on one line; exit 0
 * whenever a status came back, 2 on usage errors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/rpc.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: auth_tool TARGET METHOD [--ca F] [--cert F --key F] [--token T] "
                        "[--tls] [--timeout-ms N]\n");
        return 2;
    }
    struct pf_rpc_channel_opts o = {0};
    uint64_t tmo = 5000;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--tls") == 0) {
            o.tls = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--ca") == 0)
            o.ca_pem = slurp(v), o.tls = true;
        else if (strcmp(a, "--cert") == 0)
            o.cert_pem = slurp(v);
        else if (strcmp(a, "--key") == 0)
            o.key_pem = slurp(v);
        else if (strcmp(a, "--token") == 0)
            o.token = v;
        else if (strcmp(a, "--timeout-ms") == 0)
            tmo = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
    }
    const char *m = argv[2];
    char path[128];
    const ProtobufCMessageDescriptor *rd = NULL;
    ProtobufCMessage *req = NULL;
    /* requests (all static: one call per process) */
    static Pegaflow__HealthRequest health = PEGAFLOW__HEALTH_REQUEST__INIT;
    static Pegaflow__ShutdownRequest shut = PEGAFLOW__SHUTDOWN_REQUEST__INIT;
    static Pegaflow__UnregisterRequest unreg = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    static Pegaflow__SessionRequest sess = PEGAFLOW__SESSION_REQUEST__INIT;
    static Pegaflow__SaveRequest save = PEGAFLOW__SAVE_REQUEST__INIT;
    static Pegaflow__QueryBlocksForTransferRequest qb =
        PEGAFLOW__QUERY_BLOCKS_FOR_TRANSFER_REQUEST__INIT;
    static Pegaflow__ReleaseTransferLockRequest rl = PEGAFLOW__RELEASE_TRANSFER_LOCK_REQUEST__INIT;
    static Pegaflow__RdmaHandshakeRequest hs = PEGAFLOW__RDMA_HANDSHAKE_REQUEST__INIT;
    static Pegaflow__QueryPrefixBlocksRequest qp = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    static Pegaflow__HeartbeatNodeRequest hb = PEGAFLOW__HEARTBEAT_NODE_REQUEST__INIT;
    bool stream = false;
    if (strncmp(m, "meta.", 5) == 0) {
        snprintf(path, sizeof(path), "/pegaflow.MetaServer/%s", m + 5);
        if (strcmp(m + 5, "QueryPrefixBlocks") == 0) {
            qp.namespace_ = (char *)"auth-tool";
            req = &qp.base;
            rd = &pegaflow__query_prefix_blocks_response__descriptor;
        } else if (strcmp(m + 5, "HeartbeatNode") == 0) {
            hb.node = (char *)"192.0.2.1:1";
            hb.node_id = (char *)"auth-tool";
            req = &hb.base;
            rd = &pegaflow__heartbeat_node_response__descriptor;
        }
    } else {
        snprintf(path, sizeof(path), "/pegaflow.Engine/%s", m);
        if (strcmp(m, "Health") == 0) {
            req = &health.base;
            rd = &pegaflow__health_response__descriptor;
        } else if (strcmp(m, "Shutdown") == 0) {
            req = &shut.base;
            rd = &pegaflow__shutdown_response__descriptor;
        } else if (strcmp(m, "UnregisterContext") == 0) {
            unreg.instance_id = (char *)"auth-tool-nobody";
            req = &unreg.base;
            rd = &pegaflow__unregister_response__descriptor;
        } else if (strcmp(m, "Save") == 0) {
            save.instance_id = (char *)"auth-tool-nobody";
            req = &save.base;
            rd = &pegaflow__save_response__descriptor;
        } else if (strcmp(m, "Session") == 0) {
            sess.instance_id = (char *)"auth-tool-nobody";
            req = &sess.base;
            stream = true;
        } else if (strcmp(m, "QueryBlocksForTransfer") == 0) {
            qb.namespace_ = (char *)"auth-tool";
            qb.requester_id = (char *)"auth-tool";
            req = &qb.base;
            rd = &pegaflow__query_blocks_for_transfer_response__descriptor;
        } else if (strcmp(m, "ReleaseTransferLock") == 0) {
            rl.transfer_session_id = (char *)"00000000-0000-4000-8000-000000000000";
            req = &rl.base;
            rd = &pegaflow__release_transfer_lock_response__descriptor;
        } else if (strcmp(m, "RdmaHandshake") == 0) {
            hs.requester_id = (char *)"192.0.2.1:1";
            req = &hs.base;
            rd = &pegaflow__rdma_handshake_response__descriptor;
        }
    }
    if (!req) {
        fprintf(stderr, "unknown method %s\n", m);
        return 2;
    }
    struct pf_rpc_channel *ch;
    int rc = pf_rpc_channel_open_opts(argv[1], &o, &ch);
    if (rc) {
        fprintf(stderr, "channel: %s\n", strerror(-rc));
        return 2;
    }
    struct pf_rpc_status st = {0};
    if (stream) {
        struct pf_rpc_stream *s = NULL;
        rc = pf_rpc_stream_open(ch, path, req, tmo, &s, &st);
        pf_rpc_stream_close(s);
    } else {
        ProtobufCMessage *resp = NULL;
        rc = pf_rpc_unary(ch, path, req, rd, tmo, &resp, &st);
        if (resp)
            protobuf_c_message_free_unpacked(resp, NULL);
    }
    printf("%s %s\n", pf_grpc_code_name(st.code), st.msg);
    fflush(stdout);
    pf_rpc_channel_close(ch);
    free((void *)o.ca_pem);
    free((void *)o.cert_pem);
    free((void *)o.key_pem);
    return 0;
}

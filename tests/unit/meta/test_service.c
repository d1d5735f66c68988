/* MetaServer gRPC handlers over an in-process server: validation errors name the field,
 * store errors map to FAILED_PRECONDITION, empty lists are answered as the reference does,
 * reclaimable hashes come back, and the sweeper thread runs and stops promptly. Runs against
 * the memory store, then the Redis store (a redis-server started here; SKIP line for that
 * half without one), plus UNAVAILABLE (not INTERNAL) when that Redis is gone. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.pb-c.h"
#include "pf/meta.h"
#include "pf/metrics.h"
#include "pfredis.h"

static struct pft_redis g_redis;
static const char *g_store; /* NULL: memory store */

#define U1 "11111111-1111-4111-8111-111111111111"
#define U2 "22222222-2222-4222-8222-222222222222"

struct fx {
    struct pf_meta_store *st;
    struct pf_rpc_server *rpc;
    struct pf_rpc_channel *ch;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct pf_meta_store_config cfg = {.node_stale_secs = 30, .ttl_secs = 600, .store = g_store};
    if (g_store)
        assert_int_equal(pft_redis_cmd(&g_redis, "FLUSHALL"), 0);
    assert_int_equal(pf_meta_store_create(&cfg, &f->st), 0);
    struct pf_rpc_server_config rc = {.addr = "127.0.0.1:0",
                                      .threads = 2,
                                      .methods = pf_meta_methods,
                                      .nmethods = pf_meta_nmethods,
                                      .ctx = f->st,
                                      .metric_prefix = "pegaflow_metaserver"};
    char err[256], target[64];
    int port;
    assert_int_equal(pf_rpc_server_start(&rc, &f->rpc, &port, err, sizeof(err)), 0);
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    assert_int_equal(pf_rpc_channel_open(target, &f->ch), 0);
    /* the first connection may time out on a slow (sanitized) build: wait until it answers */
    uint64_t dl = pf_now_ns() + 20 * PF_NS_PER_SEC;
    for (;;) {
        Pegaflow__HeartbeatNodeRequest req = PEGAFLOW__HEARTBEAT_NODE_REQUEST__INIT;
        req.node = "";
        req.node_id = "";
        ProtobufCMessage *r = NULL;
        struct pf_rpc_status st;
        int urc = pf_rpc_unary(f->ch, "/pegaflow.MetaServer/HeartbeatNode", &req.base,
                               &pegaflow__heartbeat_node_response__descriptor, 5000, &r, &st);
        if (urc != -ECONNREFUSED || pf_now_ns() > dl)
            break;
        pf_sleep_ms(50);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    pf_rpc_channel_close(f->ch);
    pf_rpc_server_stop(f->rpc);
    pf_meta_store_destroy(f->st);
    free(f);
    return 0;
}

static int call(struct fx *f, const char *m, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *d, ProtobufCMessage **resp,
                struct pf_rpc_status *st)
{
    char path[128];
    snprintf(path, sizeof(path), "/pegaflow.MetaServer/%s", m);
    *resp = NULL;
    return pf_rpc_unary(f->ch, path, req, d, 5000, resp, st);
}

static int heartbeat_r(struct fx *f, const char *node, const char *id, bool replace,
                       struct pf_rpc_status *st)
{
    Pegaflow__HeartbeatNodeRequest req = PEGAFLOW__HEARTBEAT_NODE_REQUEST__INIT;
    req.node = (char *)node;
    req.node_id = (char *)id;
    req.replace = replace;
    ProtobufCMessage *r;
    int rc =
        call(f, "HeartbeatNode", &req.base, &pegaflow__heartbeat_node_response__descriptor, &r, st);
    if (rc == 0) {
        assert_int_equal(((Pegaflow__HeartbeatNodeResponse *)r)->stale_after_secs, 30);
        protobuf_c_message_free_unpacked(r, NULL);
    }
    return rc;
}

static int insert(struct fx *f, const char *ns, const char *node, const char *id,
                  ProtobufCBinaryData *h, size_t n, Pegaflow__InsertBlockHashesResponse **resp,
                  struct pf_rpc_status *st)
{
    Pegaflow__InsertBlockHashesRequest req = PEGAFLOW__INSERT_BLOCK_HASHES_REQUEST__INIT;
    req.namespace_ = (char *)ns;
    req.node = (char *)node;
    req.node_id = (char *)id;
    req.block_hashes = h;
    req.n_block_hashes = n;
    return call(f, "InsertBlockHashes", &req.base,
                &pegaflow__insert_block_hashes_response__descriptor, (ProtobufCMessage **)resp, st);
}

static int heartbeat(struct fx *f, const char *node, const char *id, struct pf_rpc_status *st)
{
    return heartbeat_r(f, node, id, false, st);
}

#define BIN(s) ((ProtobufCBinaryData){sizeof(s) - 1, (uint8_t *)(s)})

/* A restarted server (new node_id, replace) takes its address's fresh session at once, but
 * only when it calls from the host it advertises (this test calls from 127.0.0.1). */
static void test_replace_from_own_host(void **state)
{
    struct fx *f = *state;
    struct pf_rpc_status st;
    assert_int_equal(heartbeat(f, "127.0.0.1:7", U1, &st), 0);
    assert_int_not_equal(heartbeat(f, "127.0.0.1:7", U2, &st), 0);
    assert_int_equal(st.code, PF_GRPC_FAILED_PRECONDITION);
    assert_int_equal(heartbeat_r(f, "127.0.0.1:7", U2, true, &st), 0);
    /* the previous life is out; the new one refreshes without replace */
    assert_int_not_equal(heartbeat(f, "127.0.0.1:7", U1, &st), 0);
    assert_int_equal(st.code, PF_GRPC_FAILED_PRECONDITION);
    assert_int_equal(heartbeat(f, "127.0.0.1:7", U2, &st), 0);
    /* another host's address: replace is refused, its session stays */
    assert_int_equal(heartbeat(f, "10.1.2.3:7", U1, &st), 0);
    assert_int_not_equal(heartbeat_r(f, "10.1.2.3:7", U2, true, &st), 0);
    assert_int_equal(st.code, PF_GRPC_FAILED_PRECONDITION);
    assert_int_equal(heartbeat(f, "10.1.2.3:7", U1, &st), 0);
    /* a loopback address other than the caller's source names this host too */
    assert_int_equal(heartbeat(f, "127.0.0.3:7", U1, &st), 0);
    assert_int_equal(heartbeat_r(f, "127.0.0.3:7", U2, true, &st), 0);
    assert_int_equal(heartbeat(f, "[::1]:7", U1, &st), 0);
    assert_int_equal(heartbeat_r(f, "[::1]:7", U2, true, &st), 0); /* loopback, v4 caller */
}

static void test_validation(void **state)
{
    struct fx *f = *state;
    struct pf_rpc_status st;
    assert_int_equal(heartbeat(f, "n:1", "nope", &st), -EINVAL);
    assert_int_equal(st.code, PF_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "node_id"));
    assert_int_equal(heartbeat(f, "", U1, &st), -EINVAL);
    assert_non_null(strstr(st.msg, "node:"));
    ProtobufCBinaryData h[2] = {BIN("a"), {0, (uint8_t *)""}};
    Pegaflow__InsertBlockHashesResponse *r;
    assert_int_equal(insert(f, "ns", "n:1", U1, h, 1, &r, &st), -EPERM);
    assert_int_equal(st.code, PF_GRPC_FAILED_PRECONDITION);
    assert_string_equal(st.msg, "unknown node");
    assert_int_equal(heartbeat(f, "n:1", U1, &st), 0);
    assert_int_equal(heartbeat(f, "n:1", U2, &st), -EPERM);
    assert_string_equal(st.msg, "stale node session");
    assert_int_equal(insert(f, "", "n:1", U1, h, 1, &r, &st), -EINVAL);
    assert_non_null(strstr(st.msg, "namespace"));
    assert_int_equal(insert(f, "ns", "n:1", U1, h, 2, &r, &st), -EINVAL);
    assert_non_null(strstr(st.msg, "block_hashes[1]"));
    /* empty list: OK with status.ok = false */
    assert_int_equal(insert(f, "ns", "n:1", U1, h, 0, &r, &st), 0);
    assert_false(r->status->ok);
    assert_string_equal(r->status->message, "block_hashes cannot be empty");
    protobuf_c_message_free_unpacked(&r->base, NULL);
    Pegaflow__RemoveBlockHashesRequest rr = PEGAFLOW__REMOVE_BLOCK_HASHES_REQUEST__INIT;
    rr.namespace_ = "ns";
    rr.node = "n:1";
    rr.node_id = U1;
    ProtobufCMessage *m;
    assert_int_equal(call(f, "RemoveBlockHashes", &rr.base,
                          &pegaflow__remove_block_hashes_response__descriptor, &m, &st),
                     0);
    assert_false(((Pegaflow__RemoveBlockHashesResponse *)m)->status->ok);
    protobuf_c_message_free_unpacked(m, NULL);
    Pegaflow__QueryPrefixBlocksRequest q = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    q.namespace_ = "ns";
    assert_int_equal(call(f, "QueryPrefixBlocks", &q.base,
                          &pegaflow__query_prefix_blocks_response__descriptor, &m, &st),
                     -EINVAL);
    assert_string_equal(st.msg, "block_hashes cannot be empty");
    Pegaflow__UnregisterNodeRequest ur = PEGAFLOW__UNREGISTER_NODE_REQUEST__INIT;
    ur.node = "n:1";
    ur.node_id = "x";
    assert_int_equal(call(f, "UnregisterNode", &ur.base,
                          &pegaflow__unregister_node_response__descriptor, &m, &st),
                     -EINVAL);
}

static void test_insert_query_reclaimable(void **state)
{
    struct fx *f = *state;
    struct pf_rpc_status st;
    const char *nodes[] = {"a:1", "b:1", "c:1"};
    const char *ids[] = {U1, U2, "33333333-3333-4333-8333-333333333333"};
    ProtobufCBinaryData h[3] = {BIN("k0"), BIN("k1"), BIN("k2")};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(heartbeat(f, nodes[i], ids[i], &st), 0);
        Pegaflow__InsertBlockHashesResponse *r;
        assert_int_equal(insert(f, "ns", nodes[i], ids[i], h, (size_t)(3 - i), &r, &st), 0);
        assert_true(r->status->ok);
        assert_int_equal(r->inserted_count, 3 - i);
        assert_int_equal(r->n_reclaimable_hashes, i == 2 ? 1 : 0);
        if (i == 2)
            assert_memory_equal(r->reclaimable_hashes[0].data, "k0", 2);
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    Pegaflow__QueryPrefixBlocksRequest q = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    q.namespace_ = "ns";
    q.block_hashes = h;
    q.n_block_hashes = 3;
    ProtobufCMessage *m;
    assert_int_equal(call(f, "QueryPrefixBlocks", &q.base,
                          &pegaflow__query_prefix_blocks_response__descriptor, &m, &st),
                     0);
    Pegaflow__QueryPrefixBlocksResponse *qr = (void *)m;
    assert_int_equal(qr->n_nodes, 3);
    uint64_t total = 0;
    for (size_t i = 0; i < qr->n_nodes; i++)
        total += qr->nodes[i]->prefix_len;
    assert_int_equal(total, 6);
    protobuf_c_message_free_unpacked(m, NULL);
    Pegaflow__UnregisterNodeRequest ur = PEGAFLOW__UNREGISTER_NODE_REQUEST__INIT;
    ur.node = "a:1";
    ur.node_id = U1;
    assert_int_equal(call(f, "UnregisterNode", &ur.base,
                          &pegaflow__unregister_node_response__descriptor, &m, &st),
                     0);
    assert_int_equal(((Pegaflow__UnregisterNodeResponse *)m)->removed_owners, 3);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_sweeper(void **state)
{
    struct fx *f = *state;
    struct pf_meta_sweeper *sw;
    assert_int_equal(pf_meta_sweeper_start(f->st, 0, &sw), -EINVAL);
    double before = pf_metric_value_of("pegaflow_metaserver_sweeps", NULL);
    assert_int_equal(pf_meta_sweeper_start(f->st, 1, &sw), 0);
    uint64_t dl = pf_now_ns() + 20 * PF_NS_PER_SEC;
    while (pf_metric_value_of("pegaflow_metaserver_sweeps", NULL) <= before && pf_now_ns() < dl)
        pf_sleep_ms(20);
    assert_true(pf_metric_value_of("pegaflow_metaserver_sweeps", NULL) > before);
    pf_meta_sweeper_stop(sw); /* returns without waiting for the next interval */
    pf_meta_sweeper_stop(NULL);
}

/* Redis gone: every RPC that needs it is UNAVAILABLE, never INTERNAL; validation errors
 * still come first (INVALID_ARGUMENT without touching Redis). */
static void test_redis_down_unavailable(void **state)
{
    struct fx *f = *state;
    assert_int_equal(pft_redis_kill(&g_redis), 0);
    Pegaflow__HeartbeatNodeRequest hb = PEGAFLOW__HEARTBEAT_NODE_REQUEST__INIT;
    hb.node = "10.0.0.1:1";
    hb.node_id = U1;
    ProtobufCMessage *r = NULL;
    struct pf_rpc_status st;
    assert_int_not_equal(pf_rpc_unary(f->ch, "/pegaflow.MetaServer/HeartbeatNode", &hb.base,
                                      &pegaflow__heartbeat_node_response__descriptor, 5000, &r,
                                      &st),
                         0);
    assert_int_equal(st.code, PF_GRPC_UNAVAILABLE);
    Pegaflow__QueryPrefixBlocksRequest q = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    ProtobufCBinaryData h = {1, (uint8_t *)"x"};
    q.namespace_ = "ns";
    q.n_block_hashes = 1;
    q.block_hashes = &h;
    assert_int_not_equal(pf_rpc_unary(f->ch, "/pegaflow.MetaServer/QueryPrefixBlocks", &q.base,
                                      &pegaflow__query_prefix_blocks_response__descriptor, 5000, &r,
                                      &st),
                         0);
    assert_int_equal(st.code, PF_GRPC_UNAVAILABLE);
    q.namespace_ = "";
    assert_int_not_equal(pf_rpc_unary(f->ch, "/pegaflow.MetaServer/QueryPrefixBlocks", &q.base,
                                      &pegaflow__query_prefix_blocks_response__descriptor, 5000, &r,
                                      &st),
                         0);
    assert_int_equal(st.code, PF_GRPC_INVALID_ARGUMENT);
    assert_int_equal(pft_redis_restart(&g_redis, NULL), 0);
}

int main(void)
{
    pf_rpc_global_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_from_own_host, setup, teardown),
        cmocka_unit_test_setup_teardown(test_insert_query_reclaimable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sweeper, setup, teardown),
    };
    int rc = cmocka_run_group_tests_name("memory store", tests, NULL, NULL);
    if (!pft_redis_available()) {
        printf("SKIP redis store half: redis-server not installed (ci/install-deps.sh)\n");
    } else if (pft_redis_start(&g_redis, NULL) != 0) {
        printf("FAIL: could not start redis-server\n");
        rc = 1;
    } else {
        g_store = g_redis.url;
        rc |= cmocka_run_group_tests_name("redis store", tests, NULL, NULL);
        const struct CMUnitTest down[] = {
            cmocka_unit_test_setup_teardown(test_redis_down_unavailable, setup, teardown),
        };
        rc |= cmocka_run_group_tests_name("redis store down", down, NULL, NULL);
        pft_redis_stop(&g_redis);
    }
    pf_rpc_global_shutdown();
    return rc;
}

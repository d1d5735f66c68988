/* End-to-end engine scenarios against a real pegaflow-server process with the sim GPU,
 * driven through libpegaflow exactly as a vLLM-like client would:
 *   roundtrip   2 TP ranks x several layers, every layout: save -> query -> load into zeroed
 *               caches of another instance -> compare every block byte for byte
 *   eviction    a pool 4x smaller than the working set: every save succeeds, evicted
 *               blocks miss, resident ones load correctly
 *   errors      every validation error answered with the right gRPC code and message while
 *               the server keeps serving
 *   session     kill -9 of the client holding the Session stream cleans the instance up
 *               within 5 s; its cached blocks still serve a new instance
 *   http        /health, /instances, cleanup endpoints, 404/405
 *   gpulost     the GPU is lost as after a sticky CUDA error (fault plan: gpu.d2h fatal):
 *               the save fails saying so, /health answers 503 and the Health RPC
 *               UNAVAILABLE, and later saves fail the same way (hal_gpu.h "Lost device")
 * Usage: engine_e2e <scenario>... (default: all). Seed: PF_TEST_SEED. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "engine.pb-c.h"
#include "kvsim.h"
#include "pf/rpc.h"
#include "world.h"
#include "pftest.h"

#define TMO  10000
#define MAXR 4
#define MAXL 8
#define HLEN 32

static uint64_t seed;

static void roundtrip_one(struct pf_client *c, enum kv_layout lay, int tp, int nlayers,
                          uint64_t seg, const char *tag)
{
    char ida[64], idb[64], ns[64];
    snprintf(ida, sizeof(ida), "A-%s", tag);
    snprintf(idb, sizeof(idb), "B-%s", tag);
    snprintf(ns, sizeof(ns), "ns-%s", tag);
    const size_t N = 24;
    const uint64_t nblocks = 64;
    struct world A, B;
    world_init(&A, ida, ns, tp, nlayers, lay, nblocks, seg, true);
    world_init(&B, idb, ns, tp, nlayers, lay, nblocks, seg, false);
    world_register(c, &A);
    world_register(c, &B);
    uint64_t h0 = (uint64_t)lay * 100000 + (uint64_t)nlayers * 1000 + (uint64_t)tp * 10;
    PFT_CHECK(world_save(c, &A, h0, 1, N) == 0, "save: %s", pf_last_error_message());
    wait_sealed(c, A.id, h0, N);
    /* saving the same blocks again is a no-op (all resident) */
    PFT_CHECK(world_save(c, &A, h0, 1, N) == 0, "resave: %s", pf_last_error_message());

    struct pf_query_result res;
    PFT_CHECK(query(c, B.id, "req-B", h0, N, &res) == 0, "query B: %s", pf_last_error_message());
    PFT_CHECK(!res.loading && res.num_hit_blocks == N && res.lease_len == PF_LEASE_LEN,
              "query B: loading=%d hits=%u lease=%u", res.loading, res.num_hit_blocks,
              res.lease_len);
    PFT_CHECK(world_load(c, &B, res.lease, N, 30, NULL) == 0, "load B: %s",
              pf_last_error_message());
    compare(&A, 1, &B, 30, N);
    for (int r = 0; r < tp; r++)
        for (int l = 0; l < nlayers; l++) {
            PFT_CHECK(kvt_block_zero(&B.kv[r][l], 0) && kvt_block_zero(&B.kv[r][l], 29) &&
                          kvt_block_zero(&B.kv[r][l], 30 + N),
                      "load wrote outside its target blocks (rank %d layer %d)", r, l);
        }
    /* the lease had tp shares: all consumed, a further load fails */
    int64_t st = 0;
    int rc = world_load(c, &B, res.lease, N, 30, &st);
    PFT_CHECK(rc == -ESTALE || rc == -EPERM, "consumed lease accepted again: rc=%d", rc);
    PFT_CHECK(st == -1, "failed load must set state -1, got %lld", (long long)st);
    PFT_CHECK(strstr(pf_last_error_message(), "unknown or expired"), "message: %s",
              pf_last_error_message());

    /* partial prefix: a gap stops the prefix */
    uint8_t hs[4 * HLEN];
    hash_of(h0, hs);
    hash_of(h0 + 1, hs + HLEN);
    hash_of(999999999, hs + 2 * HLEN);
    hash_of(h0 + 3, hs + 3 * HLEN);
    PFT_CHECK(pf_client_query(c, B.id, "gap", hs, NULL, HLEN, 4, 0, 0, &res, NULL, 0, TMO) == 0,
              "gap query");
    PFT_CHECK(res.num_hit_blocks == 2, "gap query hits %u, want 2", res.num_hit_blocks);
    /* a partial-prefix lease loads exactly the prefix */
    PFT_CHECK(world_load(c, &B, res.lease, 2, 50, NULL) == 0, "partial load: %s",
              pf_last_error_message());
    compare(&A, 1, &B, 50, 2);
    /* first block missing -> 0 hits, no lease */
    PFT_CHECK(pf_client_query(c, B.id, "miss", hs + 2 * HLEN, NULL, HLEN, 2, 0, 0, &res, NULL, 0,
                              TMO) == 0,
              "miss query");
    PFT_CHECK(res.num_hit_blocks == 0 && res.lease_len == 0, "miss query hits %u lease %u",
              res.num_hit_blocks, res.lease_len);
    /* empty list -> Ready 0 */
    PFT_CHECK(pf_client_query(c, B.id, "empty", NULL, NULL, HLEN, 0, 0, 0, &res, NULL, 0, TMO) == 0,
              "empty query");
    PFT_CHECK(res.num_hit_blocks == 0 && !res.loading && res.lease_len == 0, "empty query");

    PFT_CHECK(pf_client_unregister(c, A.id, TMO) == 0, "unregister A");
    PFT_CHECK(pf_client_unregister(c, B.id, TMO) == 0, "unregister B");
    world_free(&A);
    world_free(&B);
    fprintf(stderr, "  roundtrip %s: %zu blocks x %d layers x tp %d byte-exact\n", tag, N, nlayers,
            tp);
}

static void sc_roundtrip(void)
{
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", "128mb", "--sim-gpus", "4", NULL};
    struct pft_proc s;
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    roundtrip_one(c, KV_CONTIG, 2, 3, 4096, "contig-tp2");
    roundtrip_one(c, KV_SPLIT, 2, 3, 2048, "split-tp2");
    roundtrip_one(c, KV_ADJACENT, 2, 2, 1536, "adjacent-tp2");
    roundtrip_one(c, KV_CONTIG, 1, 1, 65536, "crosslayer-tp1");
    roundtrip_one(c, KV_SPLIT, 4, 2, 1000, "split-tp4-odd");
    PFT_CHECK(pf_client_health(c, TMO) == 0, "health");
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");

    const char *args2[] = {"--gpu-backend",     "sim", "--pool-size", "64mb",
                           "--blockwise-alloc", NULL};
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args2) == 0, "start server");
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    roundtrip_one(c, KV_SPLIT, 2, 2, 4096, "blockwise-split");
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGINT, 15000) == 0, "server exit code");
}

static void sc_eviction(void)
{
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", "4mb", NULL};
    struct pft_proc s;
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    const uint64_t seg = 64 * 1024, nblocks = 256;
    world_init(&A, "evict-A", "ns-evict", 1, 1, KV_CONTIG, nblocks, seg, true);
    world_init(&B, "evict-B", "ns-evict", 1, 1, KV_CONTIG, nblocks, seg, false);
    world_register(c, &A);
    world_register(c, &B);
    /* 16 MiB of blocks through a 4 MiB pool, 16 blocks (1 MiB) per save */
    for (uint32_t b = 0; b < 256; b += 16) {
        PFT_CHECK(world_save(c, &A, 5000 + b, b, 16) == 0, "save %u under pressure: %s", b,
                  pf_last_error_message());
        wait_sealed(c, A.id, 5000 + b, 16);
    }
    struct pf_query_result res;
    PFT_CHECK(query(c, B.id, "old", 5000, 16, &res) == 0, "query old");
    PFT_CHECK(res.num_hit_blocks == 0, "oldest blocks should have been evicted, %u hit",
              res.num_hit_blocks);
    PFT_CHECK(query(c, B.id, "new", 5000 + 240, 16, &res) == 0, "query new");
    PFT_CHECK(res.num_hit_blocks == 16, "newest blocks should be resident, %u hit",
              res.num_hit_blocks);
    PFT_CHECK(world_load(c, &B, res.lease, 16, 100, NULL) == 0, "load: %s",
              pf_last_error_message());
    compare(&A, 240, &B, 100, 16);
    double ev = metric(&s, "pegaflow_cache_block_evictions_total");
    PFT_CHECK(ev >= 192, "evictions metric %g", ev);
    /* leased blocks survive pressure and stay hittable */
    PFT_CHECK(query(c, B.id, "pin", 5000 + 240, 16, &res) == 0, "query pin");
    PFT_CHECK(res.num_hit_blocks == 16, "pin hits %u", res.num_hit_blocks);
    uint8_t lease[16];
    memcpy(lease, res.lease, 16);
    PFT_CHECK(world_save(c, &A, 9000, 0, 16) == 0 && world_save(c, &A, 9016, 16, 16) == 0 &&
                  world_save(c, &A, 9032, 32, 16) == 0,
              "saves while pinned: %s", pf_last_error_message());
    wait_sealed(c, A.id, 9032, 16);
    PFT_CHECK(query(c, B.id, "pin2", 5000 + 240, 16, &res) == 0, "query pin2");
    PFT_CHECK(res.num_hit_blocks == 16, "leased blocks were evicted: %u hit", res.num_hit_blocks);
    pf_client_release(c, res.lease, 16, TMO);
    PFT_CHECK(world_load(c, &B, lease, 16, 200, NULL) == 0, "load pinned: %s",
              pf_last_error_message());
    compare(&A, 240, &B, 200, 16);
    pf_client_close(c);
    world_free(&A);
    world_free(&B);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr, "  eviction: 16 MiB through a 4 MiB pool, %g evictions, byte-exact\n", ev);
}

static void sc_errors(void)
{
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", "32mb", "--sim-gpus", "2", NULL};
    struct pft_proc s;
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world W;
    world_init(&W, "err-inst", "ns-err", 2, 2, KV_SPLIT, 16, 1024, true);
    struct pf_layer_desc d[2] = {kvt_desc(&W.kv[0][0], W.names[0]),
                                 kvt_desc(&W.kv[0][1], W.names[1])};
    struct pf_register_args a = {.instance_id = "err-inst",
                                 .namespace_ = "ns-err",
                                 .tp_rank = 0,
                                 .tp_size = 2,
                                 .world_size = 2,
                                 .device_id = 0,
                                 .layers = d,
                                 .nlayers = 2};
    enum { INV = 3, FP = 9, INT = 13, UNIMPL = 12 };
    /* registration */
    struct pf_register_args b = a;
    b.client_version = "0.0.1";
    EXPECT(pf_client_register(c, &b, TMO), FP, "version mismatch");
    b = a;
    b.tp_rank = 2;
    EXPECT(pf_client_register(c, &b, TMO), INV, "tp_rank < tp_size");
    b = a;
    b.device_id = 7;
    EXPECT(pf_client_register(c, &b, TMO), INV, "device 7 is not managed");
    b = a;
    b.page_first = 1;
    EXPECT(pf_client_register(c, &b, TMO), INV, "page_first needs tp_size 1");
    b.tp_size = 1;
    b.world_size = 1;
    EXPECT(pf_client_register(c, &b, TMO), INV, "page_first does not support split K/V layers");
    struct pf_layer_desc bad[2] = {d[0], d[1]};
    bad[1].group_id = 4096;
    b = a;
    b.layers = bad;
    EXPECT(pf_client_register(c, &b, TMO), INV, "must be dense 0..N-1");
    bad[1] = d[1];
    bad[1].num_blocks = 17;
    EXPECT(pf_client_register(c, &b, TMO), INV, "layout needs");
    bad[1] = d[1];
    bad[1].kv_stride_bytes = 512;
    EXPECT(pf_client_register(c, &b, TMO), INV, "overlap");
    uint8_t junk[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    bad[1] = d[1];
    bad[1].ipc = junk;
    bad[1].ipc_len = sizeof(junk);
    EXPECT(pf_client_register(c, &b, TMO), INV, "not a serialized IpcTensor");
    uint8_t pickle[4] = {0x80, 0x04, 0x95, 0x00};
    bad[1].ipc = pickle;
    bad[1].ipc_len = sizeof(pickle);
    EXPECT(pf_client_register(c, &b, TMO), INV, "pickle");
    uint8_t ipc[512];
    size_t ipclen;
    pf_client_ipc_sim("/pf_no_such_shm_object", 0, 0, 4096, ipc, sizeof(ipc), &ipclen);
    bad[1] = d[1];
    bad[1].ipc = ipc;
    bad[1].ipc_len = ipclen;
    EXPECT(pf_client_register(c, &b, TMO), INV, "register tensor failed for layer model.layers.1");
    uint8_t handle[64] = {0};
    pf_client_ipc_cuda((const uint8_t *)"0123456789abcdef", handle, 0, 4096, ipc, sizeof(ipc),
                       &ipclen);
    bad[1].ipc_len = ipclen;
    EXPECT(pf_client_register(c, &b, TMO), INV, "does not match");
    bad[1] = d[0];
    EXPECT(pf_client_register(c, &b, TMO), INV, "duplicate layer name");
    b = a;
    b.nlayers = 0;
    EXPECT(pf_client_register(c, &b, TMO), INV, "layer_names must not be empty");
    PFT_CHECK(pf_client_register(c, &a, TMO) == 0, "register rank 0: %s", pf_last_error_message());
    EXPECT(pf_client_register(c, &a, TMO), INV, "already exists");
    struct pf_layer_desc d1[2] = {kvt_desc(&W.kv[1][0], W.names[0]),
                                  kvt_desc(&W.kv[1][1], W.names[1])};
    b = a;
    b.world_size = 3;
    b.device_id = 1;
    b.tp_rank = 1;
    b.layers = d1;
    EXPECT(pf_client_register(c, &b, TMO), FP, "topology mismatch");
    b.world_size = 2;
    b.namespace_ = "ns-elsewhere";
    EXPECT(pf_client_register(c, &b, TMO), FP, "namespace mismatch");
    b.namespace_ = a.namespace_;
    b.device_id = 0;
    EXPECT(pf_client_register(c, &b, TMO), INV, "another GPU");

    /* save before the instance is sealed */
    uint32_t ids[2] = {1, 2};
    uint8_t hs[2 * HLEN];
    hash_of(1, hs);
    hash_of(2, hs + HLEN);
    struct pf_save_layer sl = {
        .name = W.names[0], .block_ids = ids, .hashes = hs, .hash_len = HLEN, .n = 2};
    EXPECT(pf_client_save(c, "err-inst", 0, 0, 0, &sl, 1, TMO), INV, "registration incomplete");
    PFT_CHECK(world_register_rank(c, &W, 1, NULL) == 0, "register rank 1: %s",
              pf_last_error_message());
    EXPECT(pf_client_save(c, "nope", 0, 0, 0, &sl, 1, TMO), FP, "instance nope not found");
    EXPECT(pf_client_save(c, "err-inst", 1, 0, 0, &sl, 1, TMO), FP, "registered as tp_rank 0");
    EXPECT(pf_client_save(c, "err-inst", 0, 0, 5, &sl, 1, TMO), FP, "device 5 is not registered");
    uint32_t oob[2] = {1, 16};
    struct pf_save_layer s2 = sl;
    s2.block_ids = oob;
    EXPECT(pf_client_save(c, "err-inst", 0, 0, 0, &s2, 1, TMO), INV, "out of range");
    s2 = sl;
    s2.name = "l9";
    EXPECT(pf_client_save(c, "err-inst", 0, 0, 0, &s2, 1, TMO), INV, "not registered on device");
    uint32_t lens[2] = {HLEN, 0};
    s2 = sl;
    s2.hash_lens = lens;
    EXPECT(pf_client_save(c, "err-inst", 0, 0, 0, &s2, 1, TMO), INV, "block hash 1 has 0 bytes");
    struct pf_save_layer dup[2] = {sl, sl};
    EXPECT(pf_client_save(c, "err-inst", 0, 0, 0, dup, 2, TMO), INV, "appears twice");

    /* queries */
    struct pf_query_result res;
    EXPECT(pf_client_query(c, "err-inst", "", hs, NULL, HLEN, 2, 0, 0, &res, NULL, 0, TMO), INV,
           "req_id must not be empty");
    EXPECT(pf_client_query(c, "nope", "r", hs, NULL, HLEN, 2, 0, 0, &res, NULL, 0, TMO), FP,
           "not found");
    EXPECT(pf_client_query(c, "err-inst", "r", hs, NULL, HLEN, 2, 0, 3, &res, NULL, 0, TMO), INV,
           "group_id 3 is not a storage group");
    uint32_t biglen[1] = {41};
    uint8_t big[41] = {0};
    EXPECT(pf_client_query(c, "err-inst", "r", big, biglen, 0, 1, 0, 0, &res, NULL, 0, TMO), INV,
           "41 bytes");

    /* loads and leases */
    PFT_CHECK(world_save(c, &W, 1, 1, 2) == 0, "save: %s", pf_last_error_message());
    wait_sealed(c, "err-inst", 1, 2);
    PFT_CHECK(query(c, "err-inst", "q", 1, 2, &res) == 0 && res.num_hit_blocks == 2, "query");
    const char *names[2] = {W.names[0], W.names[1]};
    size_t gsz = 2, cnt = 3;
    int64_t targets[3] = {5, 6, 7};
    struct pf_load_item it = {
        .lease = res.lease, .lease_len = 16, .targets = targets, .group_counts = &cnt};
    struct pf_loadstate *ls;
    PFT_CHECK(pf_loadstate_create(&ls) == 0, "loadstate");
    EXPECT(pf_client_load(c, "err-inst", 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1, TMO),
           INV, "does not match destination block count 3");
    PFT_CHECK(pf_loadstate_get(ls) == -1, "state after a rejected load: %lld",
              (long long)pf_loadstate_get(ls));
    pf_loadstate_destroy(ls);
    PFT_CHECK(pf_loadstate_create(&ls) == 0, "loadstate");
    it.lease_len = 15;
    EXPECT(pf_client_load(c, "err-inst", 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1, TMO),
           INV, "16 bytes");
    EXPECT(pf_client_load(c, "err-inst", 0, 0, "no/such", names, &gsz, 1, &it, 1, TMO), INV,
           "invalid characters");
    EXPECT(pf_client_load(c, "err-inst", 0, 0, "pega_load_missing", names, &gsz, 1, &it, 1, TMO),
           FP, "cannot open load_state_shm");
    it.lease_len = 16;
    const char *badnames[1] = {"zzz"};
    size_t one = 1;
    EXPECT(
        pf_client_load(c, "err-inst", 0, 0, pf_loadstate_name(ls), badnames, &one, 1, &it, 1, TMO),
        INV, "layer zzz is not registered");
    pf_loadstate_destroy(ls);
    /* the rejected loads took no share: every rank still loads the lease, byte-exact */
    PFT_CHECK(world_load(c, &W, res.lease, 2, 5, NULL) == 0, "load after rejected loads: %s",
              pf_last_error_message());
    compare(&W, 1, &W, 5, 2);
    EXPECT(pf_client_release(c, (const uint8_t *)"0123456789abcdef", 16, TMO), FP,
           "unknown or expired");
    EXPECT(pf_client_unregister(c, "nope", TMO), FP, "not found");
    /* a lease used by another instance */
    struct world V;
    world_init(&V, "err-other", "ns-err", 1, 2, KV_SPLIT, 16, 1024, false);
    world_register(c, &V);
    PFT_CHECK(query(c, "err-inst", "q2", 1, 2, &res) == 0 && res.num_hit_blocks == 2, "query");
    int64_t st;
    PFT_CHECK(world_load(c, &V, res.lease, 2, 3, &st) != 0, "foreign lease accepted");
    PFT_CHECK(strstr(pf_last_error_message(), "belongs to instance err-inst") &&
                  pf_last_error_code() == FP,
              "foreign lease: %s", pf_last_error_message());
    PFT_CHECK(st == -1, "state %lld", (long long)st);
    /* the share was not consumed: both workers of err-inst can still load */
    PFT_CHECK(world_load(c, &W, res.lease, 2, 9, NULL) == 0, "owner load after foreign attempt: %s",
              pf_last_error_message());
    compare(&W, 1, &W, 9, 2);
    PFT_CHECK(pf_client_release(c, res.lease, 16, TMO) != 0, "lease gone after last share");

    /* malformed protobuf is answered with INVALID_ARGUMENT naming the message; an IpcTensor's
     * field 1 is a varint where these requests have a string */
    struct pf_rpc_channel *ch;
    PFT_CHECK(pf_rpc_channel_open(s.addr, &ch) == 0, "channel");
    Pegaflow__IpcTensor junkmsg = PEGAFLOW__IPC_TENSOR__INIT;
    junkmsg.kind = PEGAFLOW__IPC_TENSOR__KIND__SIM_SHM;
    const char *paths[3] = {"/pegaflow.Engine/QueryPrefetch", "/pegaflow.Engine/Save",
                            "/pegaflow.Engine/RegisterContextBatch"};
    const char *names_[3] = {"QueryRequest", "SaveRequest", "RegisterContextRequest"};
    for (int i = 0; i < 3; i++) {
        struct pf_rpc_status rs;
        ProtobufCMessage *resp = NULL;
        int rc = pf_rpc_unary(ch, paths[i], &junkmsg.base, &pegaflow__health_response__descriptor,
                              TMO, &resp, &rs);
        PFT_CHECK(rc == -EINVAL && strstr(rs.msg, names_[i]) && strstr(rs.msg, "malformed"),
                  "%s with garbage: rc=%d '%s'", paths[i], rc, rs.msg);
    }
    pf_rpc_channel_close(ch);
    PFT_CHECK(pf_client_health(c, TMO) == 0, "health after errors: %s", pf_last_error_message());
    world_free(&W);
    world_free(&V);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr, "  errors: every validation error answered, server kept serving\n");
}

static void sc_session(void)
{
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", "32mb", NULL};
    struct pft_proc s;
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
    int pfd[2];
    PFT_CHECK(pipe(pfd) == 0, "pipe");
    pid_t child = fork();
    if (child == 0) {
        close(pfd[0]);
        struct pf_client *c;
        if (pf_client_connect(s.addr, &c))
            _exit(2);
        struct world W;
        world_init(&W, "sess-inst", "ns-sess", 1, 2, KV_CONTIG, 32, 4096, true);
        world_register(c, &W);
        struct pf_session *ss;
        if (pf_client_session_open(c, "sess-inst", "ns-sess", 1, 1, TMO, &ss) != 0)
            _exit(3);
        if (world_save(c, &W, 700, 0, 8) != 0)
            _exit(4);
        wait_sealed(c, "sess-inst", 700, 8);
        char names[2 * 64];
        snprintf(names, sizeof(names), "%s %s\n", pf_simkv_name(W.kv[0][0].shm),
                 pf_simkv_name(W.kv[0][1].shm));
        if (write(pfd[1], names, strlen(names)) < 0)
            _exit(5);
        for (;;)
            pause();
    }
    close(pfd[1]);
    char buf[256] = "";
    ssize_t n = read(pfd[0], buf, sizeof(buf) - 1);
    PFT_CHECK(n > 0, "child did not get ready");
    buf[n] = '\0';
    char shm1[64], shm2[64];
    PFT_CHECK(sscanf(buf, "%63s %63s", shm1, shm2) == 2, "child said '%s'", buf);
    char *body = NULL;
    PFT_CHECK(pft_http(s.http_host, s.http_port, "GET", "/instances", &body) == 200 &&
                  strstr(body, "sess-inst"),
              "instance not listed: %s", body);
    free(body);
    kill(child, SIGKILL);
    uint64_t t0 = pft_now_ms();
    waitpid(child, NULL, 0);
    bool gone = false;
    while (pft_now_ms() - t0 < 5000) {
        body = NULL;
        int st = pft_http(s.http_host, s.http_port, "GET", "/instances", &body);
        gone = st == 200 && !strstr(body, "sess-inst");
        free(body);
        if (gone)
            break;
        usleep(20000);
    }
    PFT_CHECK(gone, "instance still registered 5 s after its client was killed");
    fprintf(stderr, "  session: instance cleaned %llu ms after kill -9\n",
            (unsigned long long)(pft_now_ms() - t0));
    shm_unlink(shm1);
    shm_unlink(shm2);
    /* blocks stay cached: a new instance of the same namespace hits and loads them */
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world R, N2;
    world_init(&R, "sess-ref", "ns-sess-ref", 1, 2, KV_CONTIG, 32, 4096, true); /* same data */
    world_init(&N2, "sess-new", "ns-sess", 1, 2, KV_CONTIG, 32, 4096, false);
    world_register(c, &N2);
    struct pf_query_result res;
    PFT_CHECK(query(c, "sess-new", "after", 700, 8, &res) == 0 && res.num_hit_blocks == 8,
              "blocks lost with the instance: %u hits", res.num_hit_blocks);
    PFT_CHECK(world_load(c, &N2, res.lease, 8, 10, NULL) == 0, "load: %s", pf_last_error_message());
    compare(&R, 0, &N2, 10, 8);
    world_free(&R);
    world_free(&N2);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
}

static void sc_http(void)
{
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", "32mb", NULL};
    struct pft_proc s;
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    char *body = NULL;
    const char *H = s.http_host;
    int P = s.http_port;
    PFT_CHECK(pft_http(H, P, "GET", "/health", &body) == 200 && strcmp(body, "ok") == 0,
              "health: %s", body);
    free(body);
    PFT_CHECK(pft_http(H, P, "POST", "/health", NULL) == 405, "POST /health");
    PFT_CHECK(pft_http(H, P, "GET", "/nope", NULL) == 404, "GET /nope");
    PFT_CHECK(pft_http(H, P, "GET", "/instances/cleanup", NULL) == 405, "GET cleanup");
    PFT_CHECK(pft_http(H, P, "POST", "/instances/cleanup?id=", &body) == 400 &&
                  strstr(body, "id is empty"),
              "empty id: %s", body);
    free(body);
    PFT_CHECK(pft_http(H, P, "POST", "/instances/cleanup?id=unknown", &body) == 404,
              "cleanup unknown id: %s", body);
    free(body);
    struct world W;
    world_init(&W, "http-inst", "ns-http", 1, 1, KV_CONTIG, 16, 8192, true);
    world_register(c, &W);
    PFT_CHECK(world_save(c, &W, 300, 0, 8) == 0, "save");
    wait_sealed(c, "http-inst", 300, 8);
    PFT_CHECK(pft_http(H, P, "GET", "/instances", &body) == 200 &&
                  strstr(body, "{\"instances\":[\"http-inst\"]}"),
              "instances: %s", body);
    free(body);
    struct pf_query_result res;
    PFT_CHECK(query(c, "http-inst", "pin", 300, 2, &res) == 0 && res.num_hit_blocks == 2, "pin");
    PFT_CHECK(pft_http(H, P, "POST", "/cache/memory/cleanup", &body) == 200, "memory cleanup");
    PFT_CHECK(strstr(body, "\"evicted_blocks\":8") && strstr(body, "\"evicted_bytes\":65536") &&
                  strstr(body, "\"still_referenced_blocks\":2") &&
                  strstr(body, "\"reclaimed_bytes\":"),
              "memory cleanup body: %s", body);
    free(body);
    PFT_CHECK(query(c, "http-inst", "after", 300, 8, &res) == 0 && res.num_hit_blocks == 0,
              "blocks still resident after cleanup");
    PFT_CHECK(pft_http(H, P, "POST", "/instances/cleanup?id=http-inst", &body) == 200 &&
                  strstr(body, "\"removed_instances\":[\"http-inst\"]") &&
                  strstr(body, "\"removed_tensors\":1"),
              "cleanup id: %s", body);
    free(body);
    PFT_CHECK(pf_client_save(c, "http-inst", 0, 0, 0, NULL, 0, TMO) != 0 &&
                  pf_last_error_code() == 9,
              "instance still usable after cleanup");
    world_register(c, &W);
    PFT_CHECK(pft_http(H, P, "POST", "/instances/cleanup", &body) == 200 &&
                  strstr(body, "http-inst"),
              "cleanup all: %s", body);
    free(body);
    PFT_CHECK(pft_http(H, P, "GET", "/metrics", &body) == 200 &&
                  strstr(body, "pegaflow_rpc_requests_total{method=\"save\",status=\"ok\"}") &&
                  strstr(body, "pegaflow_pool_capacity_bytes"),
              "metrics");
    free(body);
    world_free(&W);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr, "  http: endpoints answer as documented\n");
}

static void sc_gpulost(void)
{
    const char *args[] = {"--gpu-backend",  "sim",          "--pool-size",     "32mb",
                          "--enable-debug", "--fault-spec", "gpu.d2h:fatal=1", NULL};
    struct pft_proc s;
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    char *body = NULL;
    PFT_CHECK(pft_http(s.http_host, s.http_port, "GET", "/health", &body) == 200, "health");
    free(body);
    PFT_CHECK(pf_client_health(c, TMO) == 0, "Health RPC before");
    struct world W;
    world_init(&W, "lost-inst", "ns-lost", 1, 1, KV_CONTIG, 16, 8192, true);
    world_register(c, &W);
    PFT_CHECK(world_save(c, &W, 500, 0, 4) != 0, "save on a lost GPU succeeded");
    const char *msg = pf_last_error_message();
    /* a server fault that a restart cures: UNAVAILABLE (14), never INTERNAL */
    PFT_CHECK(pf_last_error_code() == 14, "save on a lost GPU: code %d, want UNAVAILABLE",
              pf_last_error_code());
    PFT_CHECK(strstr(msg, "lost its GPU context") && strstr(msg, "restarted") &&
                  !strstr(msg, "shrank"),
              "save error: %s", msg);
    PFT_CHECK(pft_http(s.http_host, s.http_port, "GET", "/health", &body) == 503 &&
                  strstr(body, "unhealthy") && strstr(body, "GPU context lost"),
              "health after the loss: %s", body ? body : "(none)");
    free(body);
    PFT_CHECK(pf_client_health(c, TMO) != 0 && pf_last_error_code() == 14,
              "Health RPC after the loss: code %d", pf_last_error_code());
    PFT_CHECK(world_save(c, &W, 600, 0, 4) != 0 &&
                  strstr(pf_last_error_message(), "lost its GPU context"),
              "second save: %s", pf_last_error_message());
    world_free(&W);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr, "  gpulost: the lost GPU is reported by save, /health and Health\n");
}

int main(int argc, char **argv)
{
    seed = world_seed = pft_seed();
    static const struct pft_scenario sc[] = {{"roundtrip", sc_roundtrip}, {"eviction", sc_eviction},
                                             {"errors", sc_errors},       {"session", sc_session},
                                             {"http", sc_http},           {"gpulost", sc_gpulost}};
    return pft_run_scenarios(sc, sizeof(sc) / sizeof(sc[0]), argv + 1, argc - 1);
}

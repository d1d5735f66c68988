/* The serving side of the P2P RPCs through pf_p2p_serve (what the gRPC handlers run), with a
 * real engine and the scripted NET backend: every pool region registered on every NIC at
 * creation; QueryBlocksForTransfer (non-prefix lookup in order, per-slot addresses, sizes,
 * NUMA node and checksums, a lock session holding strong references even across a memory
 * cleanup, sessions for unknown namespaces, validation errors); ReleaseTransferLock (exactly
 * once, unknown -> 0 and ok); expiry by the p2p thread; RdmaHandshake (metadata answered,
 * a repeated handshake from the same requester replaces its connection, malformed and
 * mismatched metadata rejected); shutdown answers UNAVAILABLE; blocks only on a local tier
 * (the SSD) are read into RAM before the answer (pf_engine_fill_local), a short or failed
 * read answers what RAM has, namespaces stay apart. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mock_net.h"
#include "p2p/p2p_internal.h"
#include "pf/cache.h"
#include "pf/engine.h"
#include "pf/hal.h"
#include "pf/metrics.h"
#include "pf/pool.h"
#include "pf/rpc.h"

#define NB  10
#define SEG 2048

struct fx {
    struct pf_gpu *g;
    struct pf_engine *e;
    struct mnet m;
    struct pf_p2p *p;
    uint32_t ns;
    uint8_t h[NB][32];
    struct pf_block *b[NB]; /* borrowed pointers (the cache owns them) */
};

static struct fx F;

static void up(uint64_t lock_secs, int nnics)
{
    memset(&F, 0, sizeof(F));
    char chosen[32], err[256];
    pf_hal_init();
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    assert_int_equal(pf_hal_gpu_open("sim", &gc, &F.g, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    struct pf_engine_config ec = {
        .gpu = F.g, .pool_size = 4 << 20, .integrity = true, .skip_memcheck = true};
    assert_int_equal(pf_engine_create(&ec, &F.e, err, sizeof(err)), 0);
    mn_init(&F.m, nnics);
    F.m.numa[0] = 0;
    struct pf_p2p_config pc = {.engine = F.e,
                               .net = &F.m.base,
                               .backend = "mock",
                               .qps_per_peer = 2,
                               .lock_timeout_secs = lock_secs,
                               .integrity = true,
                               .housekeeping_ms = 20};
    assert_int_equal(pf_p2p_create(&pc, &F.p, err, sizeof(err)), 0);
    assert_int_equal(F.m.regs, nnics * (int)pf_pool_region_count(pf_engine_pool(F.e)));
    assert_int_equal(pf_ns_intern("ns-serve", &F.ns), 0);
    for (int i = 0; i < NB; i++) {
        for (int k = 0; k < 32; k++)
            F.h[i][k] = (uint8_t)(i * 17 + k);
        struct pf_block_key key;
        pf_key_make(F.ns, F.h[i], 32, &key);
        struct pf_slot sl[2];
        struct pf_alloc *a;
        assert_int_equal(pf_engine_alloc(F.e, 3 * SEG, -1, &a), 0);
        memset(a->ptr, i + 1, 3 * SEG);
        sl[0] = (struct pf_slot){.k = a->ptr,
                                 .v = (uint8_t *)a->ptr + SEG,
                                 .ka = a,
                                 .va = a,
                                 .seg_len = SEG,
                                 .seg_stride = SEG,
                                 .numa = 0,
                                 .nseg = 2};
        pf_alloc_get(a); /* three segment references: the allocation's own + 2 */
        pf_alloc_get(a);
        sl[1] = (struct pf_slot){.k = (uint8_t *)a->ptr + 2 * SEG,
                                 .ka = a,
                                 .seg_len = SEG,
                                 .seg_stride = SEG,
                                 .numa = -1, /* unknown: PF_WIRE_NUMA_NONE on the wire */
                                 .nseg = 1};
        pf_slots_checksum(sl, 2);
        struct pf_block *b;
        assert_int_equal(pf_block_pack(NULL, &key, 2, sl, &b), 0); /* mixed geometry */
        assert_true(b->fmt & PF_BLK_GEO_SLOT);
        assert_int_equal(pf_cache_insert(pf_engine_cache(F.e), b, PF_CLASS_RETAINED), 1);
        F.b[i] = b;
        pf_block_put(b);
    }
}

static void down(void)
{
    pf_p2p_stop(F.p);
    pf_engine_destroy(F.e);
    pf_p2p_destroy(F.p);
    assert_int_equal(F.m.live_qps, 0);
    assert_int_equal(F.m.deregs, F.m.regs);
    pf_gpu_close(F.g);
}

static ProtobufCMessage *serve(enum pf_p2p_method m, const ProtobufCMessage *req, int *code,
                               char *err)
{
    static const ProtobufCMessageDescriptor *const d[] = {
        &pegaflow__rdma_handshake_response__descriptor,
        &pegaflow__query_blocks_for_transfer_response__descriptor,
        &pegaflow__release_transfer_lock_response__descriptor};
    uint8_t *buf = NULL;
    size_t len = 0;
    err[0] = '\0';
    int rc = pf_p2p_serve(F.p, m, req, &buf, &len, code, err, 256);
    if (rc)
        return NULL;
    ProtobufCMessage *r = protobuf_c_message_unpack(d[m], NULL, len, buf);
    free(buf);
    assert_non_null(r);
    return r;
}

static Pegaflow__QueryBlocksForTransferResponse *query(const char *ns, const int *idx, size_t n,
                                                       int *code, char *err)
{
    ProtobufCBinaryData hs[16];
    uint8_t miss[32] = {0xee};
    for (size_t i = 0; i < n; i++)
        hs[i] =
            idx[i] >= 0 ? (ProtobufCBinaryData){32, F.h[idx[i]]} : (ProtobufCBinaryData){32, miss};
    Pegaflow__QueryBlocksForTransferRequest r = PEGAFLOW__QUERY_BLOCKS_FOR_TRANSFER_REQUEST__INIT;
    r.namespace_ = (char *)ns;
    r.n_block_hashes = n;
    r.block_hashes = hs;
    r.requester_id = "10.0.0.2:50055";
    return (void *)serve(PF_P2P_QUERY_BLOCKS, &r.base, code, err);
}

static uint64_t release(const char *id, int *code)
{
    Pegaflow__ReleaseTransferLockRequest r = PEGAFLOW__RELEASE_TRANSFER_LOCK_REQUEST__INIT;
    r.transfer_session_id = (char *)id;
    char err[256];
    Pegaflow__ReleaseTransferLockResponse *resp =
        (void *)serve(PF_P2P_RELEASE_LOCK, &r.base, code, err);
    assert_non_null(resp);
    assert_true(resp->status && resp->status->ok);
    uint64_t n = resp->released_blocks;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return n;
}

static void test_query_and_release(void **st)
{
    up(120, 1);
    int code;
    char err[256];
    double a0 = pf_metric_value_of("pegaflow_transfer_lock_active", NULL);
    const int idx[] = {0, 1, -1, 3, 4};
    Pegaflow__QueryBlocksForTransferResponse *r = query("ns-serve", idx, 5, &code, err);
    assert_non_null(r);
    assert_true(r->status && r->status->ok);
    assert_int_equal(r->lock_timeout_secs, 120);
    uint8_t raw[16];
    assert_int_equal(pf_uuid_parse(r->transfer_session_id, raw), 0);
    assert_int_equal(r->n_blocks, 4); /* the miss is skipped, order kept */
    const int want[] = {0, 1, 3, 4};
    for (size_t j = 0; j < 4; j++) {
        const Pegaflow__TransferBlockInfo *b = r->blocks[j];
        struct pf_block *blk = F.b[want[j]];
        assert_int_equal(b->block_hash.len, 32);
        assert_memory_equal(b->block_hash.data, F.h[want[j]], 32);
        assert_int_equal(b->n_slots, 2);
        const Pegaflow__TransferSlotInfo *s0 = b->slots[0], *s1 = b->slots[1];
        struct pf_slot b0, b1;
        pf_block_slot(blk, 0, &b0);
        pf_block_slot(blk, 1, &b1);
        assert_true(s0->k_ptr == (uint64_t)(uintptr_t)b0.k);
        assert_true(s0->v_ptr == (uint64_t)(uintptr_t)b0.v);
        assert_int_equal(s0->k_size, SEG);
        assert_int_equal(s0->v_size, SEG);
        assert_int_equal(s0->numa_node, 0);
        assert_true(s0->has_checksum);
        assert_true(s0->checksum == b0.checksum);
        assert_true(s1->numa_node == PF_WIRE_NUMA_NONE);
        assert_int_equal(s1->v_ptr, 0); /* one segment */
        assert_int_equal(s1->v_size, 0);
        assert_true(s1->checksum == b1.checksum);
        assert_int_equal(pf_block_strong(blk), 2); /* cache + lock */
    }
    assert_true(pf_metric_value_of("pegaflow_transfer_lock_active", NULL) == a0 + 4);
    /* the lock keeps the memory alive through a memory cleanup */
    uint64_t used = pf_pool_used(pf_engine_pool(F.e));
    struct pf_engine_cleanup_result cr;
    pf_engine_cleanup_memory(F.e, &cr);
    assert_int_equal(cr.still_referenced_blocks, 4);
    assert_true(pf_pool_used(pf_engine_pool(F.e)) == used * 4 / NB);
    assert_int_equal(release(r->transfer_session_id, &code), 4);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), 0);
    assert_true(pf_metric_value_of("pegaflow_transfer_lock_active", NULL) == a0);
    /* exactly once; unknown sessions are ok with 0 */
    assert_int_equal(release(r->transfer_session_id, &code), 0);
    assert_int_equal(release("no-such-session", &code), 0);
    assert_int_equal(release("", &code), 0);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    down();
}

static void test_query_edge_cases(void **st)
{
    up(120, 1);
    int code;
    char err[256];
    /* unknown namespace: a session with nothing in it */
    const int idx[] = {0, 1};
    Pegaflow__QueryBlocksForTransferResponse *r = query("ns-unknown-x", idx, 2, &code, err);
    assert_non_null(r);
    assert_int_equal(r->n_blocks, 0);
    assert_true(r->transfer_session_id && *r->transfer_session_id);
    struct pf_p2p_stats s;
    pf_p2p_get_stats(F.p, &s);
    assert_int_equal(s.lock_sessions, 1);
    assert_int_equal(release(r->transfer_session_id, &code), 0);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* validation */
    assert_null(query("", idx, 2, &code, err));
    assert_int_equal(code, PF_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "namespace must not be empty"));
    Pegaflow__QueryBlocksForTransferRequest q = PEGAFLOW__QUERY_BLOCKS_FOR_TRANSFER_REQUEST__INIT;
    ProtobufCBinaryData hs[2] = {{32, F.h[0]}, {0, NULL}};
    q.namespace_ = "ns-serve";
    q.n_block_hashes = 2;
    q.block_hashes = hs;
    assert_null(serve(PF_P2P_QUERY_BLOCKS, &q.base, &code, err));
    assert_int_equal(code, PF_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "block_hashes[1]: 0 bytes"));
    q.n_block_hashes = PF_P2P_MAX_HASHES + 1;
    assert_null(serve(PF_P2P_QUERY_BLOCKS, &q.base, &code, err));
    assert_int_equal(code, PF_GRPC_INVALID_ARGUMENT);
    /* an empty request is a (tiny) session too */
    q.n_block_hashes = 0;
    Pegaflow__QueryBlocksForTransferResponse *e =
        (void *)serve(PF_P2P_QUERY_BLOCKS, &q.base, &code, err);
    assert_non_null(e);
    assert_int_equal(e->n_blocks, 0);
    protobuf_c_message_free_unpacked(&e->base, NULL);
    down(); /* releases the session left over */
}

/* A local tier standing in for the SSD (src/ssd/store.c's tier: probe counts the
 * consecutive keys it holds, fetch_within returns up to n sealed blocks with their slot
 * checksums, fewer on a failure). It holds NT keys of ns-serve; deliver caps a fetch. */
#define NT 8
struct ftier {
    uint32_t ns;
    uint8_t h[NT][32];
    size_t deliver;
    uint64_t timeout_ms;
    int fetches;
};
static struct ftier T;

static int ft_index(const struct pf_block_key *k)
{
    for (int i = 0; i < NT; i++)
        if (k->ns == T.ns && k->len == 32 && memcmp(k->hash, T.h[i], 32) == 0)
            return i;
    return -1;
}

static size_t ft_probe(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                       bool wait_full)
{
    size_t c = 0;
    while (c < n && ft_index(&keys[c]) >= 0)
        c++;
    return c;
}

static size_t ft_fetch(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                       bool all_or_nothing, struct pf_block **out)
{
    fail(); /* the serving side uses fetch_within only */
    return 0;
}

static size_t ft_fetch_within(void *ctx, const struct pf_block_key *keys, size_t n,
                              uint64_t timeout_ms, struct pf_block **out)
{
    T.fetches++;
    T.timeout_ms = timeout_ms;
    size_t got = 0;
    for (; got < n && got < T.deliver; got++) {
        int i = ft_index(&keys[got]);
        assert_true(i >= 0);
        struct pf_alloc *a;
        assert_int_equal(pf_engine_alloc(F.e, 2 * SEG, 0, &a), 0);
        memset(a->ptr, 0xa0 + i, 2 * SEG);
        pf_alloc_get(a); /* two segment references */
        struct pf_slot sl = {.k = a->ptr,
                             .v = (uint8_t *)a->ptr + SEG,
                             .ka = a,
                             .va = a,
                             .seg_len = SEG,
                             .seg_stride = SEG,
                             .numa = 0,
                             .nseg = 2};
        pf_slots_checksum(&sl, 1);
        assert_int_equal(pf_block_pack(NULL, &keys[got], 1, &sl, &out[got]), 0);
    }
    return got;
}

static Pegaflow__QueryBlocksForTransferResponse *query_h(const char *ns, const uint8_t *const *h,
                                                         size_t n)
{
    ProtobufCBinaryData hs[16];
    for (size_t i = 0; i < n; i++)
        hs[i] = (ProtobufCBinaryData){32, (uint8_t *)h[i]};
    Pegaflow__QueryBlocksForTransferRequest r = PEGAFLOW__QUERY_BLOCKS_FOR_TRANSFER_REQUEST__INIT;
    r.namespace_ = (char *)ns;
    r.n_block_hashes = n;
    r.block_hashes = hs;
    r.requester_id = "10.0.0.2:50055";
    int code;
    char err[256];
    Pegaflow__QueryBlocksForTransferResponse *resp =
        (void *)serve(PF_P2P_QUERY_BLOCKS, &r.base, &code, err);
    assert_non_null(resp);
    assert_true(resp->status && resp->status->ok);
    return resp;
}

static double serve_ssd(const char *result)
{
    const char *v[] = {result};
    return pf_metric_value_of("pegaflow_p2p_serve_ssd_blocks_total", v);
}

static void test_query_fills_from_local_tier(void **st)
{
    up(120, 1);
    memset(&T, 0, sizeof(T));
    T.ns = F.ns;
    for (int i = 0; i < NT; i++)
        for (int k = 0; k < 32; k++)
            T.h[i][k] = (uint8_t)(0x80 + i * 7 + k);
    struct pf_tier t = {.name = "ssd",
                        .cls = PF_CLASS_RETAINED,
                        .probe = ft_probe,
                        .fetch = ft_fetch,
                        .fetch_within = ft_fetch_within};
    assert_int_equal(pf_engine_add_tier(F.e, &t), 0);
    double ok0 = serve_ssd("served"), bad0 = serve_ssd("failed");
    int code;
    /* two holes in RAM, both on the tier: filled, order kept, bytes are the tier's */
    T.deliver = NT;
    const uint8_t *q1[] = {T.h[0], T.h[1], F.h[0], T.h[2], T.h[3]};
    Pegaflow__QueryBlocksForTransferResponse *r = query_h("ns-serve", q1, 5);
    assert_int_equal(r->n_blocks, 5);
    assert_int_equal(T.fetches, 2);
    assert_true(T.timeout_ms > 0 && T.timeout_ms <= PF_P2P_SERVE_SSD_MS);
    const int tix[] = {0, 1, -1, 2, 3};
    for (size_t j = 0; j < 5; j++) {
        assert_memory_equal(r->blocks[j]->block_hash.data, q1[j], 32);
        if (tix[j] < 0)
            continue;
        const Pegaflow__TransferSlotInfo *s0 = r->blocks[j]->slots[0];
        uint8_t want[SEG];
        memset(want, 0xa0 + tix[j], SEG);
        assert_int_equal(s0->k_size, SEG);
        assert_memory_equal((const void *)(uintptr_t)s0->k_ptr, want, SEG);
        assert_memory_equal((const void *)(uintptr_t)s0->v_ptr, want, SEG);
        assert_true(s0->has_checksum);
        struct pf_block_key k;
        pf_key_make(F.ns, T.h[tix[j]], 32, &k);
        assert_true(pf_cache_contains(pf_engine_cache(F.e), &k)); /* promoted into RAM */
    }
    assert_true(serve_ssd("served") == ok0 + 4 && serve_ssd("failed") == bad0);
    assert_int_equal(release(r->transfer_session_id, &code), 5);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* now in RAM: no read */
    r = query_h("ns-serve", q1, 5);
    assert_int_equal(r->n_blocks, 5);
    assert_int_equal(T.fetches, 2);
    assert_int_equal(release(r->transfer_session_id, &code), 5);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* a short read (an SSD error or timeout after the first block): the answer has what was
     * read and what RAM has; nothing past the first unfilled hole is read */
    T.deliver = 1;
    const uint8_t *q2[] = {T.h[4], T.h[5], F.h[0], T.h[6]};
    r = query_h("ns-serve", q2, 4);
    assert_int_equal(r->n_blocks, 2);
    assert_memory_equal(r->blocks[0]->block_hash.data, T.h[4], 32);
    assert_memory_equal(r->blocks[1]->block_hash.data, F.h[0], 32);
    assert_int_equal(T.fetches, 3);
    assert_true(serve_ssd("served") == ok0 + 5 && serve_ssd("failed") == bad0 + 1);
    assert_int_equal(release(r->transfer_session_id, &code), 2);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* a failed read: RAM only (nothing) */
    T.deliver = 0;
    const uint8_t *q3[] = {T.h[6], T.h[7]};
    r = query_h("ns-serve", q3, 2);
    assert_int_equal(r->n_blocks, 0);
    assert_true(serve_ssd("served") == ok0 + 5 && serve_ssd("failed") == bad0 + 3);
    assert_int_equal(release(r->transfer_session_id, &code), 0);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* the same hashes in another namespace are not the tier's: not read */
    T.deliver = NT;
    uint32_t other;
    assert_int_equal(pf_ns_intern("ns-serve-other", &other), 0);
    int before = T.fetches;
    r = query_h("ns-serve-other", q3, 2);
    assert_int_equal(r->n_blocks, 0);
    assert_int_equal(T.fetches, before);
    assert_int_equal(release(r->transfer_session_id, &code), 0);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    down();
}

static void test_lock_expiry_by_thread(void **st)
{
    up(1, 1);
    int code;
    char err[256];
    double t0 = pf_metric_value_of("pegaflow_transfer_lock_timeouts_total", NULL);
    const int idx[] = {5, 6, 7};
    Pegaflow__QueryBlocksForTransferResponse *r = query("ns-serve", idx, 3, &code, err);
    assert_non_null(r);
    assert_int_equal(pf_block_strong(F.b[5]), 2);
    struct pf_p2p_stats s;
    for (int i = 0; i < 300; i++) { /* 1 s timeout, 20 ms housekeeping: bounded wait */
        pf_p2p_get_stats(F.p, &s);
        if (s.lock_sessions == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(s.lock_sessions, 0);
    assert_int_equal(pf_block_strong(F.b[5]), 1);
    assert_true(pf_metric_value_of("pegaflow_transfer_lock_timeouts_total", NULL) == t0 + 1);
    assert_int_equal(release(r->transfer_session_id, &code), 0); /* too late: unknown */
    protobuf_c_message_free_unpacked(&r->base, NULL);
    down();
}

static ProtobufCMessage *handshake(const char *who, const char *backend, uint32_t qps, size_t nnics,
                                   int *code, char *err)
{
    Pegaflow__HandshakeMetadata md = PEGAFLOW__HANDSHAKE_METADATA__INIT;
    Pegaflow__HandshakeNic nic[2], *nicp[2];
    Pegaflow__HandshakeMemRegion reg = PEGAFLOW__HANDSHAKE_MEM_REGION__INIT, *regp = &reg;
    ProtobufCBinaryData ep[4];
    uint8_t epb[8] = {'M', 'Q', 'P', 0, 9};
    for (int i = 0; i < 4; i++)
        ep[i] = (ProtobufCBinaryData){8, epb};
    reg.addr = 0x10000;
    reg.length = 0x10000;
    reg.rkey = 5;
    for (size_t k = 0; k < nnics; k++) {
        pegaflow__handshake_nic__init(&nic[k]);
        nic[k].n_endpoints = qps;
        nic[k].endpoints = ep;
        nic[k].n_regions = 1;
        nic[k].regions = &regp;
        nicp[k] = &nic[k];
    }
    md.backend = (char *)backend;
    md.n_nics = nnics;
    md.nics = nicp;
    md.qps_per_nic = qps;
    md.node_id = "22222222-2222-4222-8222-222222222222";
    uint8_t buf[1024];
    size_t len = pegaflow__handshake_metadata__pack(&md, buf);
    Pegaflow__RdmaHandshakeRequest r = PEGAFLOW__RDMA_HANDSHAKE_REQUEST__INIT;
    r.requester_id = (char *)who;
    r.handshake_metadata = (ProtobufCBinaryData){len, buf};
    return serve(PF_P2P_HANDSHAKE, &r.base, code, err);
}

static void test_handshake(void **st)
{
    up(120, 2);
    int code;
    char err[256];
    Pegaflow__RdmaHandshakeResponse *r =
        (void *)handshake("10.0.0.2:50055", "mock", 2, 2, &code, err);
    assert_non_null(r);
    assert_true(r->status && r->status->ok);
    Pegaflow__HandshakeMetadata *md = pegaflow__handshake_metadata__unpack(
        NULL, r->handshake_metadata.len, r->handshake_metadata.data);
    assert_non_null(md);
    assert_int_equal(pf_p2p_meta_validate(md, "mock", 2, 2, err, sizeof(err)), 0);
    assert_int_equal(strlen(md->node_id), 36);
    void *base;
    uint64_t len;
    int numa;
    pf_pool_region_info(pf_engine_pool(F.e), 0, &base, &len, &numa);
    assert_true(md->nics[1]->regions[0]->addr == (uint64_t)(uintptr_t)base);
    assert_true(md->nics[1]->regions[0]->length == len);
    assert_int_equal(md->nics[0]->numa_node, 0);
    assert_string_equal(md->nics[1]->name, "mock1");
    pegaflow__handshake_metadata__free_unpacked(md, NULL);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    assert_int_equal(F.m.connects, 4);
    assert_int_equal(F.m.live_qps, 4);
    /* the same requester again (it lost its side): its old connection is replaced */
    r = (void *)handshake("10.0.0.2:50055", "mock", 2, 2, &code, err);
    assert_non_null(r);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    assert_int_equal(F.m.live_qps, 4);
    struct pf_p2p_stats s;
    pf_p2p_get_stats(F.p, &s);
    assert_int_equal(s.conns, 1);
    assert_int_equal(s.handshakes_in, 2);
    /* another requester gets its own */
    r = (void *)handshake("10.0.0.3:50055", "mock", 2, 2, &code, err);
    assert_non_null(r);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    assert_int_equal(F.m.live_qps, 8);
    /* refused */
    assert_null(handshake("10.0.0.2:50055", "tcp", 2, 2, &code, err));
    assert_int_equal(code, PF_GRPC_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "NET backend mismatch"));
    assert_null(handshake("10.0.0.2:50055", "mock", 1, 2, &code, err));
    assert_non_null(strstr(err, "QPs per NIC mismatch"));
    /* a requester with one NIC (this node has two) is accepted on rail 0 alone, which is
     * all the answer offers (docs/net.md "Per-NIC health") */
    r = (void *)handshake("10.0.0.5:50055", "mock", 2, 1, &code, err);
    assert_non_null(r);
    md = pegaflow__handshake_metadata__unpack(NULL, r->handshake_metadata.len,
                                              r->handshake_metadata.data);
    assert_non_null(md);
    assert_int_equal(md->n_nics, 2);
    assert_int_equal(md->nics[0]->n_endpoints, 2);
    assert_int_equal(md->nics[1]->n_endpoints, 0);
    assert_int_equal(md->nics[1]->n_regions, 0);
    pegaflow__handshake_metadata__free_unpacked(md, NULL);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    assert_int_equal(F.m.live_qps, 10);
    assert_null(handshake("", "mock", 2, 2, &code, err));
    assert_non_null(strstr(err, "requester_id"));
    Pegaflow__RdmaHandshakeRequest bad = PEGAFLOW__RDMA_HANDSHAKE_REQUEST__INIT;
    bad.requester_id = "10.0.0.2:50055";
    bad.handshake_metadata = (ProtobufCBinaryData){3, (uint8_t *)"\xff\xff\xff"};
    assert_null(serve(PF_P2P_HANDSHAKE, &bad.base, &code, err));
    assert_int_equal(code, PF_GRPC_INVALID_ARGUMENT);
    bad.handshake_metadata = (ProtobufCBinaryData){0, NULL};
    assert_null(serve(PF_P2P_HANDSHAKE, &bad.base, &code, err));
    assert_non_null(strstr(err, "empty"));
    F.m.connect_err = -ECONNREFUSED; /* cannot reach the requester's NIC */
    assert_null(handshake("10.0.0.4:50055", "mock", 2, 2, &code, err));
    assert_int_equal(F.m.live_qps, 10);
    F.m.connect_err = 0;
    pf_p2p_get_stats(F.p, &s);
    assert_int_equal(s.conns, 3);
    /* shutting down: refused, UNAVAILABLE */
    pf_p2p_stop(F.p);
    assert_int_equal(F.m.live_qps, 0);
    assert_null(handshake("10.0.0.2:50055", "mock", 2, 2, &code, err));
    assert_int_equal(code, PF_GRPC_UNAVAILABLE);
    const int idx[] = {0};
    assert_null(query("ns-serve", idx, 1, &code, err));
    assert_int_equal(code, PF_GRPC_UNAVAILABLE);
    down();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_and_release),
        cmocka_unit_test(test_query_edge_cases),
        cmocka_unit_test(test_query_fills_from_local_tier),
        cmocka_unit_test(test_lock_expiry_by_thread),
        cmocka_unit_test(test_handshake),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

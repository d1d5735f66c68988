/* The requester state machine (the rdma tier's fetch) against the scripted NET backend and
 * a scripted peer/MetaServer transport, with a real engine (sim GPU) for staging: byte-exact
 * blocks with verified checksums, READ merging, connection reuse; MetaServer, handshake and
 * query failures; partial answers (evicted blocks, malformed descriptors); timeouts and error
 * completions (QPs invalidated while the staging memory is still allocated, freed after);
 * checksum mismatches; staging allocation failure (the connection survives); a stale
 * connection replaced once; wait_for_full_prefix; shutdown during a transfer. After every
 * test each session the peer issued was released exactly once. */
#include <errno.h>
#include <pthread.h>
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
#include "pf/engine.h"
#include "pf/hal.h"
#include "pf/meta_client.h"
#include "pf/metrics.h"
#include "pf/log.h"
#include "pf/pool.h"

#define NBLK    16
#define SLOTS   2
#define SEGLEN  4096
#define GAP     4096 /* between remote segments: no READ merging unless gap == 0 */
#define SELF    "10.0.0.9:1"
#define PEER    "10.0.0.1:50055"
#define MAXSESS 64

/* ------------------------------------------------------------------ the scripted peer */

struct peer {
    pthread_mutex_t mu;
    uint8_t *mem; /* the peer's "pool" */
    size_t memlen;
    uint64_t gap;
    uint64_t segoff[NBLK][SLOTS][2];
    uint64_t csum[NBLK][SLOTS];
    bool present[NBLK];
    int bad_slot_block;  /* block whose slot 0 is malformed (-1 none) */
    int huge_slot_block; /* block whose slot 0 claims 4 GiB - 1 (beyond one READ; -1 none) */
    int nosum_block;     /* block sent without checksums (-1 none) */
    /* MetaServer */
    int meta_rc;
    const char *meta_node;
    size_t meta_prefix;
    int meta_full_after; /* answer the full prefix from this query on (0 = always) */
    int meta_calls;
    uint64_t meta_timeout;                      /* the deadline of the last QueryPrefixBlocks */
    int meta_start_rc;                          /* T_SPLIT: start's answer */
    int meta_starts, meta_finishes, meta_drops; /* T_SPLIT */
    size_t meta_start_n;                        /* hashes the last start sent */
    /* RPCs */
    int hs_rc, hs_calls;
    int q_rc, q_calls;
    bool q_status_fail;
    uint64_t lock_secs;
    int rel_calls;
    char sess[MAXSESS][40];
    int sess_released[MAXSESS];
    int nsess;
    int nnics, qpn;
    bool ep_family_mismatch;
    int down_nic; /* NIC + 1 the peer has down: offered without endpoints or regions (0: none) */
};

static struct peer P;

static void peer_layout(uint64_t gap)
{
    P.gap = gap;
    uint64_t off = 0;
    for (int b = 0; b < NBLK; b++)
        for (int s = 0; s < SLOTS; s++)
            for (int v = 0; v < 2; v++) {
                P.segoff[b][s][v] = off;
                off += SEGLEN + gap;
            }
    P.memlen = off;
    free(P.mem);
    P.mem = malloc(P.memlen);
    for (size_t i = 0; i < P.memlen; i++)
        P.mem[i] = (uint8_t)(i * 31 + (i >> 9) + 7);
    for (int b = 0; b < NBLK; b++)
        for (int s = 0; s < SLOTS; s++) {
            struct pf_slot sl = {.k = P.mem + P.segoff[b][s][0],
                                 .v = P.mem + P.segoff[b][s][1],
                                 .seg_len = SEGLEN,
                                 .nseg = 2};
            P.csum[b][s] = pf_slot_compute_checksum(&sl);
        }
}

static void hash_of(int i, uint8_t *h)
{
    for (int k = 0; k < 32; k++)
        h[k] = (uint8_t)(i * 13 + k * 7 + 1);
}

static int block_of(const ProtobufCBinaryData *h)
{
    for (int i = 0; i < NBLK; i++) {
        uint8_t x[32];
        hash_of(i, x);
        if (h->len == 32 && memcmp(h->data, x, 32) == 0)
            return i;
    }
    return -1;
}

/* pack + unpack: what the wire would do */
static ProtobufCMessage *wire(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *r = protobuf_c_message_unpack(m->descriptor, NULL, len, buf);
    free(buf);
    return r;
}

static ProtobufCMessage *handshake_reply(void)
{
    Pegaflow__HandshakeMetadata md = PEGAFLOW__HANDSHAKE_METADATA__INIT;
    Pegaflow__HandshakeNic nics[2], *nicp[2];
    Pegaflow__HandshakeMemRegion reg[2], *regp[2];
    ProtobufCBinaryData eps[8];
    uint8_t epb[8][8];
    for (int i = 0; i < 8; i++) {
        memset(epb[i], 0, 8);
        memcpy(epb[i], "MQP", 3);
        if (P.ep_family_mismatch)
            epb[i][3] = 'F'; /* mock_net.h mn_ep_check refuses it */
        epb[i][4] = (uint8_t)(100 + i);
        eps[i] = (ProtobufCBinaryData){8, epb[i]};
    }
    for (int k = 0; k < P.nnics; k++) {
        pegaflow__handshake_nic__init(&nics[k]);
        pegaflow__handshake_mem_region__init(&reg[k]);
        reg[k].addr = (uint64_t)(uintptr_t)P.mem;
        reg[k].length = P.memlen;
        reg[k].rkey = 77 + (uint32_t)k;
        regp[k] = &reg[k];
        bool down = P.down_nic == k + 1;
        nics[k].n_endpoints = down ? 0 : (size_t)P.qpn;
        nics[k].endpoints = eps + k * P.qpn;
        nics[k].n_regions = down ? 0 : 1;
        nics[k].regions = &regp[k];
        nics[k].numa_node = -1;
        nicp[k] = &nics[k];
    }
    md.backend = "mock";
    md.n_nics = (size_t)P.nnics;
    md.nics = nicp;
    md.qps_per_nic = (uint32_t)P.qpn;
    md.node_id = "11111111-1111-4111-8111-111111111111";
    size_t len = pegaflow__handshake_metadata__get_packed_size(&md);
    uint8_t *buf = malloc(len);
    pegaflow__handshake_metadata__pack(&md, buf);
    Pegaflow__ResponseStatus ok = PEGAFLOW__RESPONSE_STATUS__INIT;
    ok.ok = true;
    Pegaflow__RdmaHandshakeResponse r = PEGAFLOW__RDMA_HANDSHAKE_RESPONSE__INIT;
    r.status = &ok;
    r.handshake_metadata = (ProtobufCBinaryData){len, buf};
    ProtobufCMessage *m = wire(&r.base);
    free(buf);
    return m;
}

static ProtobufCMessage *query_reply(const Pegaflow__QueryBlocksForTransferRequest *q)
{
    Pegaflow__TransferBlockInfo bi[NBLK], *bp[NBLK];
    Pegaflow__TransferSlotInfo si[NBLK][SLOTS], *sp[NBLK][SLOTS];
    size_t k = 0;
    for (size_t i = 0; i < q->n_block_hashes && k < NBLK; i++) {
        int b = block_of(&q->block_hashes[i]);
        if (b < 0 || !P.present[b])
            continue;
        pegaflow__transfer_block_info__init(&bi[k]);
        bi[k].block_hash = q->block_hashes[i];
        for (int s = 0; s < SLOTS; s++) {
            Pegaflow__TransferSlotInfo *x = &si[k][s];
            pegaflow__transfer_slot_info__init(x);
            x->k_ptr = (uint64_t)(uintptr_t)(P.mem + P.segoff[b][s][0]);
            x->v_ptr = (uint64_t)(uintptr_t)(P.mem + P.segoff[b][s][1]);
            x->k_size = x->v_size = SEGLEN;
            x->numa_node = 0;
            x->checksum = P.csum[b][s];
            x->has_checksum = true;
            if (b == P.bad_slot_block && s == 0)
                x->v_size = SEGLEN / 2; /* K and V sizes differ: malformed */
            if (b == P.huge_slot_block && s == 0)
                x->k_size = x->v_size = UINT32_MAX; /* its 512-byte stride would wrap */
            if (b == P.nosum_block)
                x->has_checksum = false;
            sp[k][s] = x;
        }
        bi[k].n_slots = SLOTS;
        bi[k].slots = sp[k];
        bp[k] = &bi[k];
        k++;
    }
    Pegaflow__ResponseStatus st = PEGAFLOW__RESPONSE_STATUS__INIT;
    st.ok = !P.q_status_fail;
    st.message = P.q_status_fail ? "refused" : "";
    Pegaflow__QueryBlocksForTransferResponse r = PEGAFLOW__QUERY_BLOCKS_FOR_TRANSFER_RESPONSE__INIT;
    r.status = &st;
    r.n_blocks = k;
    r.blocks = bp;
    assert_true(P.nsess < MAXSESS);
    snprintf(P.sess[P.nsess], sizeof(P.sess[0]), "sess-%d", P.nsess);
    r.transfer_session_id = P.sess[P.nsess++];
    r.lock_timeout_secs = P.lock_secs;
    return wire(&r.base);
}

static int t_call(void *ctx, const char *peer, enum pf_p2p_method m, const ProtobufCMessage *req,
                  uint64_t timeout_ms, ProtobufCMessage **resp_p, char *err, size_t errlen)
{
    pthread_mutex_lock(&P.mu);
    int rc = 0;
    assert_string_equal(peer, PEER);
    switch (m) {
    case PF_P2P_HANDSHAKE: {
        P.hs_calls++;
        const Pegaflow__RdmaHandshakeRequest *r = (const void *)req;
        assert_string_equal(r->requester_id, SELF);
        Pegaflow__HandshakeMetadata *md = pegaflow__handshake_metadata__unpack(
            NULL, r->handshake_metadata.len, r->handshake_metadata.data);
        assert_non_null(md);
        char e[256];
        assert_int_equal(
            pf_p2p_meta_validate(md, "mock", (size_t)P.nnics, (uint32_t)P.qpn, e, sizeof(e)), 0);
        pegaflow__handshake_metadata__free_unpacked(md, NULL);
        rc = P.hs_rc;
        if (!rc)
            *resp_p = handshake_reply();
        break;
    }
    case PF_P2P_QUERY_BLOCKS:
        P.q_calls++;
        rc = P.q_rc;
        if (!rc)
            *resp_p = query_reply((const void *)req);
        break;
    case PF_P2P_RELEASE_LOCK: {
        P.rel_calls++;
        const Pegaflow__ReleaseTransferLockRequest *r = (const void *)req;
        for (int i = 0; i < P.nsess; i++)
            if (strcmp(P.sess[i], r->transfer_session_id) == 0)
                P.sess_released[i]++;
        Pegaflow__ReleaseTransferLockResponse resp = PEGAFLOW__RELEASE_TRANSFER_LOCK_RESPONSE__INIT;
        *resp_p = wire(&resp.base);
        break;
    }
    }
    pthread_mutex_unlock(&P.mu);
    if (rc)
        snprintf(err, errlen, "scripted failure %d", rc);
    return rc;
}

static int t_prefix(void *ctx, const char *ns, const struct pf_meta_hash *h, size_t n,
                    uint64_t timeout_ms, struct pf_meta_prefix **res_p, size_t *nres_p)
{
    pthread_mutex_lock(&P.mu);
    int call = ++P.meta_calls;
    P.meta_timeout = timeout_ms;
    int rc = P.meta_rc;
    size_t pl = P.meta_prefix;
    if (P.meta_full_after && call < P.meta_full_after && pl >= n)
        pl = n - 1;
    pthread_mutex_unlock(&P.mu);
    if (rc)
        return rc;
    const char *node = P.meta_node;
    struct pf_meta_prefix *r = malloc(2 * sizeof(*r) + 64 + 64);
    char *s1 = (char *)(r + 2), *s2 = s1 + 64;
    snprintf(s1, 64, "%s", SELF);
    snprintf(s2, 64, "%s", node);
    r[0] = (struct pf_meta_prefix){s1, n}; /* ourselves: must be excluded */
    r[1] = (struct pf_meta_prefix){s2, pl < n ? pl : n};
    *res_p = r;
    *nres_p = 2;
    return 0;
}

static const struct pf_p2p_transport T = {.call = t_call, .query_prefix = t_prefix};

/* The split phase of the MetaServer query (as the gRPC transport has): start keeps the
 * request, finish answers it as t_prefix would have when it was sent. */
struct tq {
    const char *ns;
    const struct pf_meta_hash *h;
    size_t n;
    uint64_t timeout_ms;
};

static int t_start(void *ctx, const char *ns, const struct pf_meta_hash *h, size_t n,
                   uint64_t timeout_ms, void **op_p)
{
    pthread_mutex_lock(&P.mu);
    int rc = P.meta_start_rc;
    P.meta_starts++;
    P.meta_start_n = n;
    pthread_mutex_unlock(&P.mu);
    if (rc)
        return rc;
    struct tq *q = malloc(sizeof(*q));
    assert_non_null(q);
    *q = (struct tq){ns, h, n, timeout_ms};
    *op_p = q;
    return 0;
}

static int t_finish(void *ctx, void *op, struct pf_meta_prefix **res_p, size_t *nres_p)
{
    struct tq *q = op;
    int rc = -ECANCELED;
    if (res_p)
        rc = t_prefix(ctx, q->ns, q->h, q->n, q->timeout_ms, res_p, nres_p);
    pthread_mutex_lock(&P.mu);
    if (res_p)
        P.meta_finishes++;
    else
        P.meta_drops++;
    pthread_mutex_unlock(&P.mu);
    free(q);
    return rc;
}

static const struct pf_p2p_transport T_SPLIT = {.call = t_call,
                                                .query_prefix = t_prefix,
                                                .query_prefix_start = t_start,
                                                .query_prefix_finish = t_finish};

/* ------------------------------------------------------------------ fixture */

struct fx {
    struct pf_gpu *g;
    struct pf_engine *e;
    struct mnet m;
    struct pf_p2p *p;
    uint32_t ns;
    struct pf_block_key keys[NBLK];
    uint64_t base_used;
    uint64_t used_at_invalidate;
    int invalidates_seen;
    bool heal_on_inval;
};

static struct fx F;
static uint64_t F_idle_ms;    /* fx_up's conn_idle_ms (0: the default) */
static bool F_reg_rendezvous; /* fx_up: mock registration needs every NIC at once */
static int F_reg_fail_nic;    /* fx_up: NIC + 1 whose registration fails; create must fail */
static char F_create_err[256];
static int F_vthreads;    /* fx_up's verify_threads (0: the default) */
static uint64_t F_merge;  /* fx_up's read_merge (0: the default) */
static uint64_t F_min_ms; /* fx_up's fetch_min_ms (0: 300) */
static void (*F_vhook)(void *, size_t);

static pthread_mutex_t inval_mu = PTHREAD_MUTEX_INITIALIZER;

static void on_inval(void *ctx, struct mqp *q)
{
    if (F.heal_on_inval) { /* the scripted fault ends with the broken connection */
        pthread_mutex_lock(&F.m.mu);
        F.m.complete_err_nth = F.m.drop_from_nth = 0;
        pthread_mutex_unlock(&F.m.mu);
    }
    uint64_t u = pf_pool_used(pf_engine_pool(F.e));
    pthread_mutex_lock(&inval_mu);
    F.invalidates_seen++;
    if (u > F.used_at_invalidate)
        F.used_at_invalidate = u;
    pthread_mutex_unlock(&inval_mu);
}

static void fx_up(int nnics, uint64_t pool, uint64_t gap)
{
    memset(&P, 0, sizeof(P));
    pthread_mutex_init(&P.mu, NULL);
    P.nnics = nnics;
    P.qpn = 2;
    P.meta_node = PEER;
    P.meta_prefix = NBLK;
    P.lock_secs = 120;
    P.bad_slot_block = P.huge_slot_block = P.nosum_block = -1;
    for (int i = 0; i < NBLK; i++)
        P.present[i] = true;
    peer_layout(gap);
    memset(&F, 0, sizeof(F));
    char chosen[32], err[256];
    pf_hal_init();
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    assert_int_equal(pf_hal_gpu_open("sim", &gc, &F.g, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    struct pf_engine_config ec = {
        .gpu = F.g, .pool_size = pool, .integrity = true, .skip_memcheck = true};
    assert_int_equal(pf_engine_create(&ec, &F.e, err, sizeof(err)), 0);
    mn_init(&F.m, nnics);
    F.m.on_invalidate = on_inval;
    F.m.reg_rendezvous = F_reg_rendezvous;
    F.m.reg_fail_nic = F_reg_fail_nic;
    struct pf_p2p_config pc = {
        .engine = F.e,
        .net = &F.m.base,
        .backend = "faulty:mock",
        .qps_per_peer = 2,
        .integrity = true,
        .transport = &T,
        .fetch_margin_ms = 1000000, /* deadline = fetch_min_ms */
        .fetch_min_ms = F_min_ms ? F_min_ms : 300,
        .full_prefix_poll_ms = 5,
        .full_prefix_wait_ms = 200,
        .housekeeping_ms = 50,
        .qp_wait_ms = 2000,
        .peer_down_ms = 1,
        .plan_timeout_ms = 7,
        .conn_idle_ms = F_idle_ms,
        .verify_threads = F_vthreads,
        .verify_hook = F_vhook,
        .read_merge = F_merge,
    };
    int crc = pf_p2p_create(&pc, &F.p, err, sizeof(err));
    if (F_reg_fail_nic) {
        assert_int_not_equal(crc, 0);
        snprintf(F_create_err, sizeof(F_create_err), "%s", err);
        return;
    }
    assert_int_equal(crc, 0);
    assert_int_equal(F.m.regs, nnics); /* one pool region per NIC */
    pf_p2p_enable_fetch(F.p, NULL, SELF);
    assert_int_equal(pf_ns_intern("ns-fetch", &F.ns), 0);
    for (int i = 0; i < NBLK; i++) {
        uint8_t h[32];
        hash_of(i, h);
        pf_key_make(F.ns, h, 32, &F.keys[i]);
    }
    F.base_used = pf_pool_used(pf_engine_pool(F.e));
}

/* Checks the exactly-once rule and tears down in server order. */
static void fx_down(void)
{
    assert_int_equal(pf_p2p_flush_releases(F.p, 5000), 0);
    for (int i = 0; i < P.nsess; i++)
        assert_int_equal(P.sess_released[i], 1);
    assert_int_equal(P.rel_calls, P.nsess);
    pf_p2p_stop(F.p);
    pf_engine_destroy(F.e);
    pf_p2p_destroy(F.p);
    assert_int_equal(F.m.live_qps, 0);
    assert_int_equal(F.m.deregs, F.m.regs);
    pf_gpu_close(F.g);
    free(P.mem);
    P.mem = NULL;
}

static size_t fetch(const char *req, size_t n, bool all, struct pf_block **out)
{
    if (!p2p_fetch_available(F.p, req))
        return 0;
    return p2p_tier_fetch(F.p, req, F.keys, n, all, out);
}

static void check_blocks(struct pf_block **out, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        assert_true(pf_block_key_eq(out[j], &F.keys[j]));
        assert_int_equal(out[j]->nslots, SLOTS);
        for (int s = 0; s < SLOTS; s++) {
            struct pf_slot slv, *sl = &slv;
            pf_block_slot(out[j], (uint16_t)s, sl);
            assert_int_equal(sl->nseg, 2);
            assert_int_equal(sl->seg_len, SEGLEN);
            assert_int_equal(sl->seg_stride % 512, 0);
            assert_int_equal((uintptr_t)sl->k % 512, 0);
            assert_memory_equal(sl->k, P.mem + P.segoff[j][s][0], SEGLEN);
            assert_memory_equal(sl->v, P.mem + P.segoff[j][s][1], SEGLEN);
            assert_true(sl->has_checksum);
            assert_true(sl->checksum == P.csum[j][s]);
            assert_non_null(sl->ka);
        }
    }
}

static void put_all(struct pf_block **out, size_t n)
{
    for (size_t j = 0; j < n; j++)
        pf_block_put(out[j]);
}

static double m(const char *name, const char *label)
{
    const char *v[1] = {label};
    return pf_metric_value_of(name, label ? v : NULL);
}

/* ------------------------------------------------------------------ tests */

static void test_success_and_reuse(void **st)
{
    fx_up(1, 16 << 20, GAP);
    double ok0 = m("pegaflow_rdma_fetch_total", "ok");
    double by0 = m("pegaflow_rdma_fetch_bytes", NULL);
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("r1", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    assert_true(pf_pool_used(pf_engine_pool(F.e)) > F.base_used);
    assert_int_equal(P.hs_calls, 1);
    assert_int_equal(P.q_calls, 1);
    assert_true(m("pegaflow_rdma_fetch_total", "ok") == ok0 + 1);
    assert_true(m("pegaflow_rdma_fetch_bytes", NULL) == by0 + (double)NBLK * SLOTS * 2 * SEGLEN);
    assert_int_equal(F.m.reads, NBLK * SLOTS * 2); /* gaps: one READ per segment */
    assert_int_equal(F.invalidates_seen, 0);
    put_all(out, NBLK);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used);
    /* the connection is reused: no second handshake */
    assert_int_equal(fetch("r2", 4, false, out), 4);
    check_blocks(out, 4);
    put_all(out, 4);
    assert_int_equal(P.hs_calls, 1);
    struct pf_p2p_stats s;
    pf_p2p_get_stats(F.p, &s);
    assert_int_equal(s.conns, 1);
    assert_int_equal(s.qps, 2);
    assert_int_equal(s.handshakes_out, 1);
    assert_false(pf_p2p_blacklisted(F.p, "r1"));
    fx_down();
}

static void test_merged_reads_two_nics(void **st)
{
    fx_up(2, 16 << 20, 0); /* contiguous remote segments merge into large READs */
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("m1", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    assert_true(F.m.reads < NBLK * SLOTS * 2);
    assert_true(F.m.nics_used[0] > 0 || F.m.nics_used[1] > 0);
    put_all(out, NBLK);
    fx_down();
}

/* One-READ fetches rotate over the NICs (the round-robin starts where the last fetch's
 * did, plus one; it restarted at 0 per fetch, piling small fetches onto one rail). */
static void test_small_fetches_spread_over_nics(void **st)
{
    fx_up(2, 16 << 20, 0);
    struct pf_block *out[NBLK];
    for (int i = 0; i < 4; i++) {
        int r0 = F.m.reads;
        char req[16];
        snprintf(req, sizeof(req), "n%d", i);
        assert_int_equal(fetch(req, 1, false, out), 1);
        check_blocks(out, 1);
        put_all(out, 1);
        assert_int_equal(F.m.reads - r0, 1); /* one merged READ per fetch */
    }
    assert_true(F.m.nics_used[0] >= 1);
    assert_true(F.m.nics_used[1] >= 1);
    fx_down();
}

/* A lease takes half of each NIC's free QPs (rounded up), NIC by NIC: a lone fetch reaches
 * every NIC, a second fetch to the same peer gets the rest and runs alongside, a third
 * waits (here: until its deadline) until QPs come back. */
static void test_leases_share_qps(void **st)
{
    fx_up(2, 16 << 20, GAP);
    char err[P2P_ERRLEN];
    struct p2p_lease l1, l2, l3;
    uint64_t dl = pf_now_ns() + 2000 * PF_NS_PER_MS;
    assert_int_equal(p2p_conn_acquire(F.p, PEER, dl, &l1, err, sizeof(err)), 0);
    assert_int_equal(l1.nqps, 2);
    assert_int_equal(l1.qps[0]->nic, 0);
    assert_int_equal(l1.qps[1]->nic, 1);
    assert_int_equal(p2p_conn_acquire(F.p, PEER, dl, &l2, err, sizeof(err)), 0);
    assert_int_equal(l2.nqps, 2);
    assert_int_equal(l2.qps[0]->nic, 0);
    assert_int_equal(l2.qps[1]->nic, 1);
    assert_true(l2.qps[0] != l1.qps[0] && l2.qps[1] != l1.qps[1]);
    assert_int_equal(P.hs_calls, 1);
    assert_int_equal(
        p2p_conn_acquire(F.p, PEER, pf_now_ns() + 50 * PF_NS_PER_MS, &l3, err, sizeof(err)),
        -ETIMEDOUT);
    p2p_lease_return(F.p, &l1);
    assert_int_equal(p2p_conn_acquire(F.p, PEER, dl, &l3, err, sizeof(err)), 0);
    assert_int_equal(l3.nqps, 2);
    p2p_lease_return(F.p, &l3);
    p2p_lease_return(F.p, &l2);
    fx_down();
}

/* A connection no fetch used for conn_idle_ms is closed by housekeeping (its QPs destroyed),
 * and the next fetch handshakes again; one in use is never evicted. */
static void test_idle_connection_evicted(void **st)
{
    F_idle_ms = 150;
    fx_up(1, 16 << 20, GAP);
    F_idle_ms = 0;
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("i1", 2, false, out), 2);
    check_blocks(out, 2);
    put_all(out, 2);
    /* held by a lease: not evicted however long it stays idle */
    char err[P2P_ERRLEN];
    struct p2p_lease l;
    assert_int_equal(
        p2p_conn_acquire(F.p, PEER, pf_now_ns() + 2000 * PF_NS_PER_MS, &l, err, sizeof(err)), 0);
    uint64_t until = pf_now_ns() + 400 * PF_NS_PER_MS; /* > idle + housekeeping periods */
    while (pf_now_ns() < until)
        usleep(10000);
    pthread_mutex_lock(&F.m.mu);
    int live = F.m.live_qps;
    pthread_mutex_unlock(&F.m.mu);
    assert_int_equal(live, 2);
    p2p_lease_return(F.p, &l);
    /* given back: closed once idle */
    uint64_t dl = pf_now_ns() + 10 * PF_NS_PER_SEC;
    for (;;) {
        pthread_mutex_lock(&F.m.mu);
        live = F.m.live_qps;
        pthread_mutex_unlock(&F.m.mu);
        if (live == 0)
            break;
        assert_true(pf_now_ns() < dl);
        usleep(10000);
    }
    assert_int_equal(P.hs_calls, 1);
    assert_int_equal(fetch("i2", 2, false, out), 2);
    check_blocks(out, 2);
    put_all(out, 2);
    assert_int_equal(P.hs_calls, 2);
    fx_down();
}

static void test_metaserver_down_and_no_peer(void **st)
{
    fx_up(1, 16 << 20, GAP);
    double err0 = m("pegaflow_rdma_fetch_total", "error");
    struct pf_block *out[NBLK];
    P.meta_rc = -ECONNREFUSED;
    assert_int_equal(fetch("md", NBLK, false, out), 0);
    assert_int_equal(P.hs_calls, 0);
    assert_false(pf_p2p_blacklisted(F.p, "md")); /* nobody failed: not blacklisted */
    P.meta_rc = 0;
    P.meta_node = SELF; /* only this node holds them */
    assert_int_equal(fetch("self", NBLK, false, out), 0);
    P.meta_node = PEER;
    P.meta_prefix = 0;
    assert_int_equal(fetch("none", NBLK, false, out), 0);
    assert_int_equal(P.hs_calls, 0);
    assert_true(m("pegaflow_rdma_fetch_total", "error") == err0);
    fx_down();
}

static void test_handshake_and_query_failures(void **st)
{
    fx_up(1, 16 << 20, GAP);
    struct pf_block *out[NBLK];
    P.hs_rc = -ECONNREFUSED;
    assert_int_equal(fetch("hs", NBLK, false, out), 0);
    assert_true(pf_p2p_blacklisted(F.p, "hs"));
    assert_int_equal(fetch("hs", NBLK, false, out), 0); /* probe says no now */
    assert_int_equal(P.hs_calls, 1);
    assert_int_equal(F.m.live_qps, 0); /* the aborted handshake's QPs are gone */
    P.hs_rc = 0;
    usleep(5000); /* past the (1 ms) peer-down window */
    P.q_rc = -ETIMEDOUT;
    assert_int_equal(fetch("q", NBLK, false, out), 0);
    assert_true(pf_p2p_blacklisted(F.p, "q"));
    assert_int_equal(P.nsess, 0); /* no session: nothing to release */
    P.q_rc = 0;
    P.q_status_fail = true; /* refused, but with a session id: released anyway */
    assert_int_equal(fetch("qs", NBLK, false, out), 0);
    assert_int_equal(P.nsess, 1);
    P.q_status_fail = false;
    /* the connection made for "q" still works */
    assert_int_equal(fetch("q2", 2, false, out), 2);
    check_blocks(out, 2);
    put_all(out, 2);
    assert_int_equal(P.hs_calls, 2);
    fx_down();
}

static void test_unreachable_peer_skipped(void **st)
{
    fx_up(1, 16 << 20, GAP);
    F.p->cfg.peer_down_ms = 60000; /* test-only: the window is read at each failure */
    struct pf_block *out[NBLK];
    P.hs_rc = -ETIMEDOUT; /* a black-holed peer: each attempt would cost the RPC deadline */
    assert_int_equal(fetch("u1", NBLK, false, out), 0);
    assert_int_equal(fetch("u2", NBLK, false, out), 0);
    assert_int_equal(fetch("u3", NBLK, false, out), 0);
    assert_int_equal(P.hs_calls, 1); /* later fetches fail at once */
    assert_true(pf_p2p_blacklisted(F.p, "u3"));
    fx_down();
}

static void test_partial_answers(void **st)
{
    fx_up(1, 16 << 20, GAP);
    double part0 = m("pegaflow_rdma_fetch_total", "partial");
    struct pf_block *out[NBLK];
    P.present[5] = false; /* evicted on the holder between discovery and fetch */
    assert_int_equal(fetch("p1", NBLK, false, out), 5);
    check_blocks(out, 5);
    put_all(out, 5);
    assert_true(pf_p2p_blacklisted(F.p, "p1"));
    assert_true(m("pegaflow_rdma_fetch_total", "partial") == part0 + 1);
    /* all_or_nothing: a partial run is nothing */
    assert_int_equal(fetch("p2", NBLK, true, out), 0);
    P.present[5] = true;
    P.present[0] = false;
    assert_int_equal(fetch("p3", NBLK, false, out), 0);
    P.present[0] = true;
    P.bad_slot_block = 3;
    assert_int_equal(fetch("p4", NBLK, false, out), 3);
    check_blocks(out, 3);
    put_all(out, 3);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used);
    assert_int_equal(P.nsess, 4);
    /* a slot larger than one READ: the run ends before it, nothing staged for it */
    P.bad_slot_block = -1;
    P.huge_slot_block = 2;
    assert_int_equal(fetch("p5", NBLK, false, out), 2);
    check_blocks(out, 2);
    put_all(out, 2);
    /* with --integrity on, a block sent without checksums is not taken unverified */
    P.huge_slot_block = -1;
    P.nosum_block = 4;
    assert_int_equal(fetch("p6", NBLK, false, out), 4);
    check_blocks(out, 4);
    put_all(out, 4);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used);
    fx_down();
}

static void test_timeout_invalidates_before_free(void **st)
{
    fx_up(1, 16 << 20, GAP);
    double tmo0 = m("pegaflow_rdma_fetch_total", "timeout");
    struct pf_block *out[NBLK];
    F.m.drop_from_nth = 5; /* READs 5.. never complete */
    assert_int_equal(fetch("t1", NBLK, false, out), 0);
    assert_true(m("pegaflow_rdma_fetch_total", "timeout") == tmo0 + 1);
    assert_true(F.invalidates_seen >= 2);
    /* at the first invalidate the staging (NBLK * SLOTS * 2 segments) was still allocated */
    assert_true(F.used_at_invalidate >= F.base_used + (uint64_t)NBLK * SLOTS * 2 * SEGLEN);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used); /* freed after */
    assert_int_equal(F.m.live_qps, 0); /* the connection was dropped */
    assert_true(pf_p2p_blacklisted(F.p, "t1"));
    assert_int_equal(P.nsess, 1); /* force-released below (fx_down checks it) */
    /* the next fetch re-handshakes */
    F.m.drop_from_nth = 0;
    assert_int_equal(fetch("t2", 4, false, out), 4);
    check_blocks(out, 4);
    put_all(out, 4);
    assert_int_equal(P.hs_calls, 2);
    fx_down();
}

static void test_error_completion(void **st)
{
    fx_up(1, 16 << 20, GAP);
    double e0 = m("pegaflow_rdma_fetch_total", "error");
    struct pf_block *out[NBLK];
    F.m.complete_err_nth = 3;
    F.m.complete_err = -EREMOTEIO;
    F.m.drop_from_nth = 4;
    assert_int_equal(fetch("e1", NBLK, false, out), 0);
    assert_true(m("pegaflow_rdma_fetch_total", "error") == e0 + 1);
    assert_true(F.used_at_invalidate > F.base_used);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used);
    assert_int_equal(F.m.live_qps, 0);
    fx_down();
}

static void test_checksum_mismatch(void **st)
{
    fx_up(1, 16 << 20, GAP);
    double i0 = m("pegaflow_integrity_failures_total", "remote");
    struct pf_block *out[NBLK];
    F.m.corrupt_nth = 2 * SLOTS * 2 + 1; /* block 2, slot 0, K */
    assert_int_equal(fetch("c1", NBLK, false, out), 2);
    check_blocks(out, 2);
    put_all(out, 2);
    assert_true(m("pegaflow_integrity_failures_total", "remote") == i0 + 1);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used);
    assert_int_equal(F.invalidates_seen, 0); /* the transfer itself succeeded */
    assert_true(pf_p2p_blacklisted(F.p, "c1"));
    fx_down();
}

/* Fetches all NBLK blocks byte-exact with receive-path digests on; *dr / *dw: the blocks
 * verified in the receive path / by the workers during it. */
static void fetch_all_verified(const char *req, double *dr, double *dw)
{
    F.m.digests = true;
    double r0 = m("pegaflow_p2p_verified_blocks_total", "receive"),
           w0 = m("pegaflow_p2p_verified_blocks_total", "worker");
    struct pf_block *out[NBLK];
    assert_int_equal(fetch(req, NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    *dr = m("pegaflow_p2p_verified_blocks_total", "receive") - r0;
    *dw = m("pegaflow_p2p_verified_blocks_total", "worker") - w0;
}

/* Receive-path digests (a fabric that hashes the bytes as they land, as the TCP one does):
 * with contiguous remote segments a READ carries whole slots (K then V), whose digests
 * decide their blocks with no pass over staging; with gaps every segment is its own READ, a
 * slot's K and V in two, so every block goes to the verification pass. Byte-exact either way;
 * each block verified exactly once. */
static void test_receive_path_digests(void **st)
{
    static const uint64_t gaps[2] = {0, GAP};
    for (int g = 0; g < 2; g++) {
        fx_up(1, 16 << 20, gaps[g]);
        double dr, dw;
        fetch_all_verified(g ? "dg1" : "dg0", &dr, &dw);
        assert_true(dr + dw == NBLK);
        if (g == 0) {
            assert_true(F.m.digest_reads > 0);
            assert_true(dr == NBLK); /* contiguous: every slot travels whole in a READ */
        } else {
            assert_int_equal(F.m.digest_reads, 0); /* no READ carries a whole slot */
            assert_true(dr == 0 && dw == NBLK);
        }
        fx_down();
    }
}

/* READs stop at the merge size, but a slot's V joins the READ that ends with its K (up to
 * PF_P2P_MAX_READ) so its checksum is still taken as it lands: with the merge at one segment,
 * one READ per slot (K + V), every block decided in the receive path. A cap set through
 * PEGAFLOW_P2P_MAX_READ is strict: one READ per segment, no whole slot in any READ, every
 * block verified by the workers. Bytes exact either way. */
static void test_read_merge_keeps_kv_pairs(void **st)
{
    for (int strict = 0; strict < 2; strict++) {
        F_merge = SEGLEN;
        if (strict)
            setenv("PEGAFLOW_P2P_MAX_READ", "4096", 1);
        fx_up(1, 16 << 20, 0);
        unsetenv("PEGAFLOW_P2P_MAX_READ");
        F_merge = 0;
        double dr, dw;
        fetch_all_verified(strict ? "kv1" : "kv0", &dr, &dw);
        if (!strict) {
            assert_int_equal(F.m.reads, NBLK * SLOTS);
            assert_int_equal(F.m.digest_reads, NBLK * SLOTS);
            assert_true(dr == NBLK && dw == 0);
        } else {
            assert_int_equal(F.m.reads, NBLK * SLOTS * 2);
            assert_int_equal(F.m.digest_reads, 0);
            assert_true(dr == 0 && dw == NBLK);
        }
        fx_down();
    }
}

/* A READ corrupted as it lands, its digests computed over the damaged bytes: the mismatch
 * is found in the receive path (no verification pass for it), the run ends before that
 * block, counted as an integrity failure. */
static void test_receive_path_digest_mismatch(void **st)
{
    fx_up(1, 16 << 20, 0);
    F.m.digests = true;
    F.m.corrupt_nth = 1; /* the first READ: it carries block 0's slots */
    double i0 = m("pegaflow_integrity_failures_total", "remote"),
           w0 = m("pegaflow_p2p_verified_blocks_total", "worker");
    struct pf_block *out[NBLK];
    size_t got = fetch("dgc", NBLK, false, out);
    assert_true(got < NBLK);
    check_blocks(out, got);
    put_all(out, got);
    assert_true(m("pegaflow_integrity_failures_total", "remote") == i0 + 1);
    assert_true(F.m.digest_reads > 0);
    /* every block, the corrupted one included, was decided by its digests */
    assert_true(m("pegaflow_p2p_verified_blocks_total", "worker") == w0);
    fx_down();
}

static void test_alloc_failure_keeps_connection(void **st)
{
    fx_up(1, 64 << 10, GAP); /* 64 KiB pool: NBLK * 16 KiB does not fit */
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("a1", NBLK, false, out), 0);
    assert_int_equal(P.nsess, 1);
    assert_int_equal(F.invalidates_seen, 0); /* the reference drops the connection here: #401 */
    assert_int_equal(F.m.live_qps, 2);
    assert_false(pf_p2p_blacklisted(F.p, "a1"));
    assert_int_equal(fetch("a2", 2, false, out), 2); /* fits: same connection */
    check_blocks(out, 2);
    put_all(out, 2);
    assert_int_equal(P.hs_calls, 1);
    fx_down();
}

static void test_stale_connection_replaced_once(void **st)
{
    fx_up(1, 16 << 20, GAP);
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("s1", 2, false, out), 2);
    put_all(out, 2);
    /* the peer dropped its side meanwhile: the next post fails at once */
    F.m.post_fail_nth = F.m.posts + 1;
    F.m.post_fail_err = -ENOTCONN;
    F.m.post_fail_times = 1;
    assert_int_equal(fetch("s2", 4, false, out), 4);
    check_blocks(out, 4);
    put_all(out, 4);
    assert_int_equal(P.hs_calls, 2);
    assert_int_equal(P.nsess, 2); /* one session per fetch, each released once */
    /* a fresh connection failing the same way is not retried */
    F.m.post_fail_nth = F.m.posts + 1;
    F.m.post_fail_times = 5;
    P.hs_rc = 0;
    assert_int_equal(fetch("s3", 4, false, out), 0);
    fx_down();
}

/* Retries exhausted (a -ETIMEDOUT completion, which the transfer reads as -EHOSTUNREACH)
 * on a reused connection before any READ completed: the peer's QP is gone (it dropped its
 * side, or the rail bounced). Replaced once, as the TCP fabric's -ENOTCONN is, instead of
 * failing the fetch and blacklisting the request. */
static void test_stale_retry_exhausted_replaced_once(void **st)
{
    fx_up(1, 16 << 20, GAP);
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("x1", 2, false, out), 2);
    put_all(out, 2);
    pthread_mutex_lock(&F.m.mu);
    F.m.complete_err_nth = F.m.reads + 1;
    F.m.complete_err = -ETIMEDOUT;
    F.m.drop_from_nth = F.m.reads + 2; /* nothing else completes on the dead connection */
    pthread_mutex_unlock(&F.m.mu);
    F.heal_on_inval = true;
    assert_int_equal(fetch("x2", 4, false, out), 4);
    check_blocks(out, 4);
    put_all(out, 4);
    assert_int_equal(P.hs_calls, 2);
    assert_false(pf_p2p_blacklisted(F.p, "x2"));
    fx_down();
}

/* A holder with fewer NICs than this node, or with a rail down, is accepted: rails pair by
 * index where both sides have one up (docs/net.md "Per-NIC health"), the fetch runs on those
 * and is byte-exact; only the paired rails get connected QPs (before: "NIC count mismatch",
 * and a miss). */
static void test_peer_fewer_nics_or_rail_down(void **st)
{
    fx_up(2, 16 << 20, GAP);
    P.nnics = 1; /* the holder has one NIC */
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("f1", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    assert_int_equal(F.m.nics_used[1], 0);
    assert_true(F.m.nics_used[0] > 0);
    assert_int_equal(F.m.connects, 2); /* rail 0's two QPs; rail 1's were destroyed */
    assert_int_equal(F.m.live_qps, 2);
    fx_down();

    fx_up(2, 16 << 20, GAP);
    P.down_nic = 1; /* the holder's NIC 0 is down */
    assert_int_equal(fetch("f2", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    assert_int_equal(F.m.nics_used[0], 0);
    assert_true(F.m.nics_used[1] > 0);
    assert_int_equal(F.m.connects, 2);
    fx_down();
}

/* NIC 1's link goes down under a fetch: the failed READs are re-posted on NIC 0 and every
 * block arrives byte-exact (checksums verified), the rail is marked dead (counted, by name)
 * without a new handshake, and the next fetch skips it. When the last rail fails too, the
 * connection goes, the fetch reconnects once and the new handshake brings rail 1 back (here
 * NIC 0 fails then, and its READs move to NIC 1). Before: the first error completion failed
 * the fetch (a miss) and dropped the connection. */
static void test_rail_dead_failover(void **st)
{
    fx_up(2, 16 << 20, GAP);
    double c0 = m("pegaflow_rdma_rail_failures_total", "mock1");
    double c1 = m("pegaflow_rdma_rail_failures_total", "mock0");
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("d1", NBLK, false, out), NBLK);
    put_all(out, NBLK);
    pthread_mutex_lock(&F.m.mu);
    F.m.dead_nic = 2;
    pthread_mutex_unlock(&F.m.mu);
    assert_int_equal(fetch("d2", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    struct pf_p2p_stats s;
    pf_p2p_get_stats(F.p, &s);
    assert_int_equal(s.rail_failures, 1);
    assert_true(m("pegaflow_rdma_rail_failures_total", "mock1") == c0 + 1);
    assert_int_equal(P.hs_calls, 1);
    assert_false(pf_p2p_blacklisted(F.p, "d2"));
    pthread_mutex_lock(&F.m.mu);
    int used1 = F.m.nics_used[1];
    pthread_mutex_unlock(&F.m.mu);
    assert_int_equal(fetch("d3", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    assert_int_equal(F.m.nics_used[1], used1); /* the dead rail is skipped */
    assert_int_equal(P.hs_calls, 1);
    /* the last rail fails: reconnect once; the new connection has both rails again */
    pthread_mutex_lock(&F.m.mu);
    F.m.dead_nic = 1;
    pthread_mutex_unlock(&F.m.mu);
    assert_int_equal(fetch("d4", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    assert_int_equal(P.hs_calls, 2);
    assert_true(F.m.nics_used[1] > used1);
    pf_p2p_get_stats(F.p, &s);
    assert_int_equal(s.rail_failures, 2);
    assert_true(m("pegaflow_rdma_rail_failures_total", "mock0") == c1 + 1);
    fx_down();
}

/* The pool is registered on every NIC at once, one thread per NIC (the mock's registration
 * waits for a registration on every NIC to be in progress: a serial loop fails the create
 * with -ETIMEDOUT), and the node fetches as usual. */
static void test_registration_parallel_per_nic(void **st)
{
    F_reg_rendezvous = true;
    fx_up(2, 16 << 20, GAP);
    F_reg_rendezvous = false;
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("reg1", NBLK, false, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    fx_down();
}

/* A registration failing on one NIC fails the create naming that NIC; what the other NIC
 * registered meanwhile is deregistered. */
static void test_registration_failure_named(void **st)
{
    F_reg_fail_nic = 2;
    fx_up(2, 16 << 20, GAP);
    F_reg_fail_nic = 0;
    if (!strstr(F_create_err, "on NIC mock1: Cannot allocate memory"))
        fail_msg("the error does not name the NIC: %s", F_create_err);
    assert_int_equal(F.m.regs, 1); /* NIC 0's region, registered meanwhile */
    assert_int_equal(F.m.deregs, F.m.regs);
    pf_engine_destroy(F.e);
    pf_gpu_close(F.g);
    free(P.mem);
    P.mem = NULL;
}

/* A holder whose endpoints the backend refuses (verbs: another GID family) fails the
 * handshake by name, before any QP connects; the fetch is a miss. */
static void test_endpoint_refused_by_name(void **st)
{
    fx_up(1, 16 << 20, GAP);
    P.ep_family_mismatch = true;
    char path[] = "/tmp/pf-fetch-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    pf_log_set_fd(fd);
    struct pf_block *out[NBLK];
    size_t got = fetch("g1", 4, false, out);
    pf_log_set_fd(2);
    assert_int_equal(got, 0);
    assert_int_equal(F.m.connects, 0);
    char log[4096] = "";
    assert_true(pread(fd, log, sizeof(log) - 1, 0) > 0);
    close(fd);
    if (!strstr(log, "GID family mismatch"))
        fail_msg("the fetch log does not name the mismatch: %s", log);
    fx_down();
}

static void test_wait_for_full_prefix(void **st)
{
    fx_up(1, 16 << 20, GAP);
    struct pf_block *out[NBLK];
    P.meta_full_after = 4; /* the full suffix is advertised from the 4th poll on */
    assert_int_equal(fetch("w1", NBLK, true, out), NBLK);
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    assert_int_equal(P.meta_calls, 4);
    /* never advertised in full within full_prefix_wait_ms: nothing, no handshake */
    P.meta_calls = 0;
    P.meta_full_after = 1000000;
    assert_int_equal(fetch("w2", NBLK, true, out), 0);
    assert_true(P.meta_calls > 2);
    assert_int_equal(P.q_calls, 1);
    /* MetaServer unreachable: asked once, then no remote (no polling through errors) */
    P.meta_calls = 0;
    P.meta_rc = -ECONNREFUSED;
    assert_int_equal(fetch("w3", NBLK, true, out), 0);
    assert_int_equal(P.meta_calls, 1);
    fx_down();
}

struct bg {
    size_t got;
    struct pf_block *out[NBLK];
};

static void *bg_fetch(void *arg)
{
    struct bg *b = arg;
    b->got = fetch("bg", NBLK, false, b->out);
    return NULL;
}

static void test_stop_during_transfer(void **st)
{
    fx_up(1, 16 << 20, GAP);
    F.m.drop_from_nth = 3;
    struct bg b = {0};
    pthread_t t;
    pthread_create(&t, NULL, bg_fetch, &b);
    for (int i = 0; i < 500 && mn_posts(&F.m) < 3; i++)
        usleep(2000);
    pf_p2p_stop(F.p); /* drops the connection: the transfer fails at once */
    pthread_join(t, NULL);
    assert_int_equal(b.got, 0);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used);
    assert_int_equal(P.nsess, 1); /* released synchronously after the p2p thread stopped */
    assert_false(p2p_fetch_available(F.p, "x"));
    fx_down();
}

/* n keys of hash_of(0..n-1) in the fixture's namespace (a suffix longer than the plan's
 * first query). */
static void make_keys(struct pf_block_key *k, int n)
{
    for (int i = 0; i < n; i++) {
        uint8_t hh[32];
        hash_of(i, hh);
        assert_int_equal(pf_key_make(F.ns, hh, 32, &k[i]), 0);
    }
}

/* The query-time discovery: one QueryPrefixBlocks with the plan deadline, this node excluded;
 * a MetaServer error (down, or past the deadline) is "unavailable" (-1), not a wait. A holder
 * whose fetch failed is inside its down window: ranked as down and not contacted again by
 * fetch_from until the window passes. */
static void test_discover_deadline_and_down_window(void **st)
{
    fx_up(1, 16 << 20, GAP);
    struct pf_tier_source src[PF_TIER_SOURCES_MAX];
    P.meta_prefix = 12;
    assert_int_equal(p2p_tier_discover(F.p, "d1", F.keys, NBLK, src, PF_TIER_SOURCES_MAX), 1);
    assert_int_equal(P.meta_calls, 1);
    assert_int_equal(P.meta_timeout, 7); /* the plan deadline, not PF_P2P_META_TIMEOUT_MS */
    assert_string_equal(src[0].node, PEER);
    assert_int_equal(src[0].len, 12);
    assert_false(src[0].down);
    P.meta_rc = -ETIMEDOUT;
    assert_int_equal(p2p_tier_discover(F.p, "d2", F.keys, NBLK, src, PF_TIER_SOURCES_MAX), -1);
    P.meta_rc = 0;
    /* a fetch_from for exactly what is asked (blocks 0..5 of the 12 advertised) */
    struct pf_block *out[NBLK];
    const char *why = NULL;
    src[0].len = 12;
    assert_int_equal(p2p_tier_fetch_from(F.p, "d3", &src[0], F.keys, 6, out, &why), 6);
    check_blocks(out, 6);
    put_all(out, 6);
    /* the holder fails: its down window starts */
    F.p->cfg.peer_down_ms = 600000;
    P.q_rc = -EIO;
    assert_int_equal(p2p_tier_fetch_from(F.p, "d4", &src[0], F.keys, 6, out, &why), 0);
    assert_string_equal(why, "error");
    int q_calls = P.q_calls;
    assert_int_equal(p2p_tier_discover(F.p, "d5", F.keys, NBLK, src, PF_TIER_SOURCES_MAX), 1);
    assert_true(src[0].down);
    P.q_rc = 0;
    assert_int_equal(p2p_tier_fetch_from(F.p, "d6", &src[0], F.keys, 6, out, &why), 0);
    assert_string_equal(why, "down");
    assert_int_equal(P.q_calls, q_calls); /* not contacted */
    F.p->cfg.peer_down_ms = 1;
    /* 100 keys: the first 64 are asked first; the whole suffix only when a holder has all 64 */
    struct pf_block_key many[100];
    make_keys(many, 100);
    int calls = P.meta_calls;
    P.meta_prefix = 0; /* nobody: one small query */
    assert_int_equal(p2p_tier_discover(F.p, "h1", many, 100, src, PF_TIER_SOURCES_MAX), 0);
    assert_int_equal(P.meta_calls, calls + 1);
    P.meta_prefix = 10; /* a short holder: its answer to the head stands */
    assert_int_equal(p2p_tier_discover(F.p, "h2", many, 100, src, PF_TIER_SOURCES_MAX), 1);
    assert_int_equal(P.meta_calls, calls + 2);
    assert_int_equal(src[0].len, 10);
    P.meta_prefix = 80; /* holds the whole head: a second query for all 100 */
    assert_int_equal(p2p_tier_discover(F.p, "h3", many, 100, src, PF_TIER_SOURCES_MAX), 1);
    assert_int_equal(P.meta_calls, calls + 4);
    assert_int_equal(src[0].len, 80);
    fx_down();
}

static int meta_users(void)
{
    pthread_mutex_lock(&F.p->wk_mu);
    int u = F.p->meta_users;
    pthread_mutex_unlock(&F.p->wk_mu);
    return u;
}

/* The discovery in two halves (the query thread's way with the gRPC transport): start sends
 * the head's query, finish collects and ranks it; a dropped one is cancelled; a failed start
 * is "unavailable"; a holder of the whole head gets the second query at finish; each holds
 * the MetaServer client (stop waits) from start to finish. Without the transport's split,
 * finish asks whole. */
static void test_discover_split_phase(void **st)
{
    fx_up(1, 16 << 20, GAP);
    F.p->tr = &T_SPLIT;
    struct pf_tier_source src[PF_TIER_SOURCES_MAX];
    P.meta_prefix = 12;
    void *d = p2p_tier_discover_start(F.p, "s1", F.keys, NBLK);
    assert_non_null(d);
    assert_int_equal(P.meta_starts, 1);
    assert_int_equal(P.meta_calls, 0); /* sent, not answered yet */
    assert_int_equal(meta_users(), 1);
    assert_int_equal(p2p_tier_discover_finish(F.p, d, src, PF_TIER_SOURCES_MAX), 1);
    assert_int_equal(P.meta_finishes, 1);
    assert_int_equal(P.meta_timeout, 7); /* the plan deadline */
    assert_string_equal(src[0].node, PEER);
    assert_int_equal(src[0].len, 12);
    assert_int_equal(meta_users(), 0);
    /* dropped */
    d = p2p_tier_discover_start(F.p, "s2", F.keys, NBLK);
    assert_non_null(d);
    assert_int_equal(p2p_tier_discover_finish(F.p, d, NULL, 0), -1);
    assert_int_equal(P.meta_drops, 1);
    assert_int_equal(meta_users(), 0);
    /* start fails (no MetaServer session): unavailable, no answer waited for */
    P.meta_start_rc = -ENOTCONN;
    d = p2p_tier_discover_start(F.p, "s3", F.keys, NBLK);
    assert_non_null(d);
    assert_int_equal(p2p_tier_discover_finish(F.p, d, src, PF_TIER_SOURCES_MAX), -1);
    assert_int_equal(P.meta_finishes, 1);
    P.meta_start_rc = 0;
    /* 100 keys: the head's 64 sent at start; a holder of all of them gets the whole suffix
     * asked at finish */
    struct pf_block_key many[100];
    make_keys(many, 100);
    int calls = P.meta_calls;
    P.meta_prefix = 80;
    d = p2p_tier_discover_start(F.p, "s4", many, 100);
    assert_int_equal(P.meta_start_n, PF_P2P_PLAN_HEAD);
    assert_int_equal(p2p_tier_discover_finish(F.p, d, src, PF_TIER_SOURCES_MAX), 1);
    assert_int_equal(P.meta_calls, calls + 2);
    assert_int_equal(src[0].len, 80);
    /* nothing to discover: no handle */
    assert_null(p2p_tier_discover_start(F.p, "s5", F.keys, 0));
    /* without the transport's split: one whole query at finish */
    F.p->tr = &T;
    calls = P.meta_calls;
    int starts = P.meta_starts;
    P.meta_prefix = 5;
    d = p2p_tier_discover_start(F.p, "s6", F.keys, NBLK);
    assert_int_equal(P.meta_calls, calls);
    assert_int_equal(p2p_tier_discover_finish(F.p, d, src, PF_TIER_SOURCES_MAX), 1);
    assert_int_equal(P.meta_calls, calls + 1);
    assert_int_equal(P.meta_starts, starts);
    assert_int_equal(src[0].len, 5);
    assert_int_equal(meta_users(), 0);
    fx_down();
}

/* Verification overlaps the READs (issue 23 item 2): the mock hands out one completion per
 * poll and holds back all but the first 4 (block 0's READs) until block 0's verification has
 * started (the hook opens the gate), and that verification then waits until every READ's
 * completion was handed out. Only a poller that keeps running while block 0 is being
 * verified gets there; verified on the posting thread (verify_threads < 0, the code path
 * before the workers), the wait runs out instead. Either way the blocks come out byte-exact
 * and verified. */
static struct {
    pthread_t poster;
    uint64_t wait_ms;
    bool overlapped, on_poster, called;
} OV;

static void overlap_hook(void *ctx, size_t block)
{
    (void)ctx;
    if (block != 0)
        return;
    OV.called = true;
    OV.on_poster = pthread_equal(pthread_self(), OV.poster);
    mn_open_gate(&F.m);
    OV.overlapped = mn_wait_delivered(&F.m, NBLK * SLOTS * 2, OV.wait_ms);
}

static void overlap_run(int vthreads, uint64_t wait_ms)
{
    F_vthreads = vthreads;
    F_vhook = overlap_hook;
    F_min_ms = 20000;
    fx_up(1, 16 << 20, GAP);
    F_vthreads = 0;
    F_vhook = NULL;
    F_min_ms = 0;
    memset(&OV, 0, sizeof(OV));
    OV.poster = pthread_self();
    OV.wait_ms = wait_ms;
    F.m.poll_max = 1;
    F.m.hold_after = 4;
    struct pf_block *out[NBLK];
    assert_int_equal(fetch("ov", NBLK, false, out), NBLK);
    assert_int_equal(F.m.reads, NBLK * SLOTS * 2); /* no merging with GAP: 4 READs a block */
    check_blocks(out, NBLK);
    put_all(out, NBLK);
    assert_true(OV.called);
    fx_down();
}

static void test_verify_overlaps_reads(void **st)
{
    overlap_run(1, 10000);
    assert_true(OV.overlapped);
    assert_false(OV.on_poster);
    /* the same condition cannot hold when the posting thread verifies */
    overlap_run(-1, 100);
    assert_false(OV.overlapped);
    assert_true(OV.on_poster);
}

/* A corrupt byte with verification inline (verify_threads < 0) and on workers (the
 * default, test_checksum_mismatch): the same miss either way. */
static void test_checksum_mismatch_inline(void **st)
{
    F_vthreads = -1;
    fx_up(1, 16 << 20, GAP);
    F_vthreads = 0;
    struct pf_block *out[NBLK];
    F.m.corrupt_nth = 3 * SLOTS * 2 + 2; /* block 3, slot 0, V */
    assert_int_equal(fetch("ci", NBLK, false, out), 3);
    check_blocks(out, 3);
    put_all(out, 3);
    assert_int_equal(pf_pool_used(pf_engine_pool(F.e)), F.base_used);
    fx_down();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_success_and_reuse),
        cmocka_unit_test(test_merged_reads_two_nics),
        cmocka_unit_test(test_metaserver_down_and_no_peer),
        cmocka_unit_test(test_handshake_and_query_failures),
        cmocka_unit_test(test_unreachable_peer_skipped),
        cmocka_unit_test(test_partial_answers),
        cmocka_unit_test(test_timeout_invalidates_before_free),
        cmocka_unit_test(test_error_completion),
        cmocka_unit_test(test_checksum_mismatch),
        cmocka_unit_test(test_receive_path_digests),
        cmocka_unit_test(test_read_merge_keeps_kv_pairs),
        cmocka_unit_test(test_receive_path_digest_mismatch),
        cmocka_unit_test(test_checksum_mismatch_inline),
        cmocka_unit_test(test_verify_overlaps_reads),
        cmocka_unit_test(test_alloc_failure_keeps_connection),
        cmocka_unit_test(test_stale_connection_replaced_once),
        cmocka_unit_test(test_stale_retry_exhausted_replaced_once),
        cmocka_unit_test(test_small_fetches_spread_over_nics),
        cmocka_unit_test(test_endpoint_refused_by_name),
        cmocka_unit_test(test_peer_fewer_nics_or_rail_down),
        cmocka_unit_test(test_rail_dead_failover),
        cmocka_unit_test(test_registration_parallel_per_nic),
        cmocka_unit_test(test_registration_failure_named),
        cmocka_unit_test(test_leases_share_qps),
        cmocka_unit_test(test_idle_connection_evicted),
        cmocka_unit_test(test_wait_for_full_prefix),
        cmocka_unit_test(test_stop_during_transfer),
        cmocka_unit_test(test_discover_deadline_and_down_window),
        cmocka_unit_test(test_discover_split_phase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

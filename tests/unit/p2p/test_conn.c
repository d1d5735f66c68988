/* Connections and the handshake. Metadata validation (every rule, the first problem named),
 * the peer-region rkey lookup, and two real nodes in one process (engines on the sim GPU,
 * the TCP fabric on 127.0.0.1, an in-process transport calling the other node's serving
 * side): both nodes handshake with each other at the same moment (the transport holds both
 * RdmaHandshake calls until the other one is in flight; the reference can crash here, its
 * #402), both fetches succeed byte-exact, both connections stay usable in both directions
 * without further handshakes, and a restarted peer (new incarnation, new endpoints) is
 * reconnected transparently: the stale connections are dropped and one handshake replaces
 * them. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../../sim/net/tcpnet_wire.h"

#include "p2p/p2p_internal.h"
#include "pf/cache.h"
#include "pf/engine.h"
#include "pf/hal.h"
#include "pf/meta_client.h"
#include "pf/pool.h"

/* ------------------------------------------------------------------ metadata */

struct md {
    Pegaflow__HandshakeMetadata m;
    Pegaflow__HandshakeNic nic[2], *nicp[2];
    Pegaflow__HandshakeMemRegion reg[2][3], *regp[2][3];
    ProtobufCBinaryData ep[2][2];
    uint8_t epb[8];
};

static void md_init(struct md *d)
{
    memset(d, 0, sizeof(*d));
    pegaflow__handshake_metadata__init(&d->m);
    d->m.backend = "tcp";
    d->m.n_nics = 2;
    d->m.nics = d->nicp;
    d->m.qps_per_nic = 2;
    for (int k = 0; k < 2; k++) {
        pegaflow__handshake_nic__init(&d->nic[k]);
        d->nicp[k] = &d->nic[k];
        d->nic[k].n_endpoints = 2;
        d->nic[k].endpoints = d->ep[k];
        for (int j = 0; j < 2; j++)
            d->ep[k][j] = (ProtobufCBinaryData){8, d->epb};
        d->nic[k].n_regions = 3;
        d->nic[k].regions = d->regp[k];
        for (int r = 0; r < 3; r++) {
            pegaflow__handshake_mem_region__init(&d->reg[k][r]);
            d->reg[k][r].addr = 0x100000 * (uint64_t)(3 - r); /* unsorted on purpose */
            d->reg[k][r].length = 0x100000;
            d->reg[k][r].rkey = (uint32_t)(k * 10 + r);
            d->regp[k][r] = &d->reg[k][r];
        }
    }
}

static void expect_bad(struct md *d, const char *substr)
{
    char err[256] = "";
    assert_int_equal(pf_p2p_meta_validate(&d->m, "tcp", 2, 2, err, sizeof(err)), -EINVAL);
    if (!strstr(err, substr))
        fail_msg("message '%s' lacks '%s'", err, substr);
}

static void test_meta_validate(void **st)
{
    struct md d;
    char err[256];
    md_init(&d);
    assert_int_equal(pf_p2p_meta_validate(&d.m, "tcp", 2, 2, err, sizeof(err)), 0);
    d.m.backend = "faulty:tcp"; /* a fault-injected peer is wire-compatible */
    assert_int_equal(pf_p2p_meta_validate(&d.m, "tcp", 2, 2, err, sizeof(err)), 0);
    d.m.backend = "verbs";
    expect_bad(&d, "NET backend mismatch: peer uses 'verbs'");
    /* a peer with fewer NICs, or with a rail down (no endpoints, no regions), is accepted:
     * rails pair by index (docs/net.md "Per-NIC health"); none in common is refused */
    md_init(&d);
    d.m.n_nics = 1;
    assert_int_equal(pf_p2p_meta_validate(&d.m, "tcp", 2, 2, err, sizeof(err)), 0);
    md_init(&d);
    d.nic[0].n_endpoints = 0;
    d.nic[0].n_regions = 0;
    assert_int_equal(pf_p2p_meta_validate(&d.m, "tcp", 2, 2, err, sizeof(err)), 0);
    assert_int_equal(pf_p2p_meta_validate(&d.m, "tcp", 1, 2, err, sizeof(err)), -EINVAL);
    if (!strstr(err, "no rail in common"))
        fail_msg("message '%s'", err);
    d.nic[1].n_endpoints = 0;
    d.nic[1].n_regions = 0;
    expect_bad(&d, "no rail in common");
    md_init(&d);
    d.nic[0].n_endpoints = 0; /* no endpoints but regions: malformed */
    expect_bad(&d, "nics[0]: 0 endpoints, expected 2");
    md_init(&d);
    d.m.n_nics = 0;
    expect_bad(&d, "0 NICs");
    md_init(&d);
    d.m.qps_per_nic = 3;
    expect_bad(&d, "QPs per NIC mismatch");
    md_init(&d);
    d.nic[1].n_endpoints = 1;
    expect_bad(&d, "nics[1]: 1 endpoints, expected 2");
    md_init(&d);
    d.ep[0][1].len = 0;
    expect_bad(&d, "nics[0].endpoints[1]: 0 bytes");
    md_init(&d);
    d.ep[0][0].len = PF_NET_EP_MAX + 1;
    expect_bad(&d, "nics[0].endpoints[0]");
    md_init(&d);
    d.nic[0].n_regions = 0;
    expect_bad(&d, "nics[0]: 0 memory regions");
    md_init(&d);
    d.reg[1][2].length = 0;
    expect_bad(&d, "nics[1].regions[2]: empty");
    md_init(&d);
    d.reg[0][0].addr = UINT64_MAX - 10;
    expect_bad(&d, "wraps around");
    md_init(&d);
    d.reg[1][1].addr = 0x100000 * 3 - 1; /* overlaps the region at 3 MiB by one byte */
    expect_bad(&d, "nics[1]: memory regions overlap");
    md_init(&d);
    d.reg[1][1].addr = 0x100000 * 4; /* adjacent is fine */
    assert_int_equal(pf_p2p_meta_validate(&d.m, "tcp", 2, 2, err, sizeof(err)), 0);
}

static void test_rkey_lookup(void **st)
{
    struct p2p_region r0[3] = {{0x1000, 0x1000, 1}, {0x3000, 0x1000, 2}, {0x4000, 0x10, 3}};
    struct p2p_region *regs[1] = {r0};
    size_t nr[1] = {3};
    struct p2p_conn c = {.regions = regs, .nregions = nr};
    uint32_t k = 0;
    assert_true(p2p_conn_rkey(&c, 0, 0x1000, 0x1000, &k) && k == 1);
    assert_true(p2p_conn_rkey(&c, 0, 0x1800, 0x10, &k) && k == 1);
    assert_false(p2p_conn_rkey(&c, 0, 0x1800, 0x1000, &k)); /* runs past the end */
    assert_false(p2p_conn_rkey(&c, 0, 0x2000, 1, &k));      /* in the hole */
    assert_false(p2p_conn_rkey(&c, 0, 0xfff, 2, &k));       /* below the first */
    assert_true(p2p_conn_rkey(&c, 0, 0x3fff, 1, &k) && k == 2);
    assert_false(p2p_conn_rkey(&c, 0, 0x3fff, 2, &k)); /* spans two regions */
    assert_true(p2p_conn_rkey(&c, 0, 0x400f, 1, &k) && k == 3);
    assert_false(p2p_conn_rkey(&c, 0, 0x4010, 1, &k));
    assert_false(p2p_conn_rkey(&c, 0, UINT64_MAX, 2, &k));
}

/* ------------------------------------------------------------------ two real nodes */

#define NB  12
#define SEG 8192

struct node {
    const char *addr;
    struct pf_gpu *g;
    struct pf_engine *e;
    struct pf_net *net;
    struct pf_p2p *p;
    struct pf_p2p_transport tr;
    struct node *other;
    uint32_t ns;
    struct pf_block_key keys[NB];
    uint8_t data[NB][2][SEG];
};

static struct node N1 = {.addr = "127.0.0.1:1001"}, N2 = {.addr = "127.0.0.1:1002"};
static pthread_barrier_t hs_bar;
static _Atomic bool hs_sync;

static int tr_call(void *ctx, const char *peer, enum pf_p2p_method m, const ProtobufCMessage *req,
                   uint64_t timeout_ms, ProtobufCMessage **resp_p, char *err, size_t errlen)
{
    struct node *self = ctx, *t = self->other;
    if (strcmp(peer, t->addr) != 0) {
        snprintf(err, errlen, "unknown peer %s", peer);
        return -ECONNREFUSED;
    }
    if (m == PF_P2P_HANDSHAKE && atomic_load(&hs_sync))
        pthread_barrier_wait(&hs_bar); /* both handshakes in flight before either is served */
    static const ProtobufCMessageDescriptor *const d[] = {
        &pegaflow__rdma_handshake_response__descriptor,
        &pegaflow__query_blocks_for_transfer_response__descriptor,
        &pegaflow__release_transfer_lock_response__descriptor};
    uint8_t *buf = NULL;
    size_t len = 0;
    int code = 0;
    int rc = pf_p2p_serve(t->p, m, req, &buf, &len, &code, err, errlen);
    if (rc)
        return rc;
    *resp_p = protobuf_c_message_unpack(d[m], NULL, len, buf);
    free(buf);
    return *resp_p ? 0 : -EPROTO;
}

static int tr_prefix(void *ctx, const char *ns, const struct pf_meta_hash *h, size_t n,
                     uint64_t timeout_ms, struct pf_meta_prefix **res_p, size_t *nres_p)
{
    struct node *self = ctx;
    struct pf_meta_prefix *r = malloc(sizeof(*r) + 64);
    r->node = (char *)(r + 1);
    snprintf(r->node, 64, "%s", self->other->addr);
    r->prefix_len = n;
    *res_p = r;
    *nres_p = 1;
    return 0;
}

static void node_up(struct node *n, int tag)
{
    char chosen[32], err[256];
    pf_hal_init();
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    assert_int_equal(pf_hal_gpu_open("sim", &gc, &n->g, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    struct pf_engine_config ec = {
        .gpu = n->g, .pool_size = 8 << 20, .integrity = true, .skip_memcheck = true};
    assert_int_equal(pf_engine_create(&ec, &n->e, err, sizeof(err)), 0);
    const char *nic = "127.0.0.1";
    struct pf_net_config nc = {.nics = &nic, .nnics = 1};
    assert_int_equal(pf_hal_net_open("tcp", &nc, &n->net, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    n->tr = (struct pf_p2p_transport){.call = tr_call, .query_prefix = tr_prefix, .ctx = n};
    struct pf_p2p_config pc = {.engine = n->e,
                               .net = n->net,
                               .backend = chosen,
                               .qps_per_peer = 2,
                               .integrity = true,
                               .transport = &n->tr,
                               .fetch_min_ms = 5000,
                               .housekeeping_ms = 50};
    assert_int_equal(pf_p2p_create(&pc, &n->p, err, sizeof(err)), 0);
    pf_p2p_enable_fetch(n->p, NULL, n->addr);
    assert_int_equal(pf_ns_intern("ns-conn", &n->ns), 0);
    /* NB resident blocks of one slot (K and V) with seeded bytes */
    for (int i = 0; i < NB; i++) {
        uint8_t h[32];
        for (int k = 0; k < 32; k++)
            h[k] = (uint8_t)(tag * 101 + i * 3 + k);
        pf_key_make(n->ns, h, 32, &n->keys[i]);
        struct pf_alloc *a;
        assert_int_equal(pf_engine_alloc(n->e, 2 * SEG, -1, &a), 0);
        for (int v = 0; v < 2; v++)
            for (int j = 0; j < SEG; j++)
                n->data[i][v][j] = (uint8_t)(j * 7 + i * 13 + v * 5 + tag);
        memcpy(a->ptr, n->data[i][0], SEG);
        memcpy((uint8_t *)a->ptr + SEG, n->data[i][1], SEG);
        struct pf_slot sl = {0}, *s = &sl;
        s->k = a->ptr;
        s->v = (uint8_t *)a->ptr + SEG;
        s->ka = a;
        s->va = a;
        pf_alloc_get(a);
        s->seg_len = s->seg_stride = SEG;
        s->nseg = 2;
        s->numa = -1;
        pf_slots_checksum(s, 1);
        struct pf_block *b;
        assert_int_equal(pf_block_pack(NULL, &n->keys[i], 1, s, &b), 0);
        assert_int_equal(pf_cache_insert(pf_engine_cache(n->e), b, PF_CLASS_RETAINED), 1);
        pf_block_put(b);
    }
}

static void node_down(struct node *n)
{
    pf_p2p_stop(n->p);
    pf_engine_destroy(n->e);
    pf_p2p_destroy(n->p);
    pf_net_close(n->net);
    pf_gpu_close(n->g);
    n->p = NULL;
}

struct job {
    struct node *self;
    const char *req;
    size_t got;
    struct pf_block *out[NB];
};

static void *job_fetch(void *arg)
{
    struct job *j = arg;
    struct node *o = j->self->other;
    j->got = p2p_tier_fetch(j->self->p, j->req, o->keys, NB, false, j->out);
    return NULL;
}

static void check_from(struct job *j)
{
    struct node *o = j->self->other;
    assert_int_equal(j->got, NB);
    for (int i = 0; i < NB; i++) {
        assert_true(pf_block_key_eq(j->out[i], &o->keys[i]));
        assert_memory_equal(pf_slot_k(j->out[i], 0), o->data[i][0], SEG);
        assert_memory_equal(pf_slot_v(j->out[i], 0), o->data[i][1], SEG);
        pf_block_put(j->out[i]);
    }
}

static void both_fetch(const char *r1, const char *r2)
{
    struct job a = {.self = &N1, .req = r1}, b = {.self = &N2, .req = r2};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, job_fetch, &a);
    pthread_create(&t2, NULL, job_fetch, &b);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    check_from(&a);
    check_from(&b);
}

static void test_two_nodes_mutual_handshake(void **st)
{
    N1.other = &N2;
    N2.other = &N1;
    node_up(&N1, 1);
    node_up(&N2, 2);
    pthread_barrier_init(&hs_bar, NULL, 2);
    atomic_store(&hs_sync, true);
    both_fetch("m1", "m2"); /* simultaneous mutual handshake */
    atomic_store(&hs_sync, false);
    struct pf_p2p_stats s1, s2;
    pf_p2p_get_stats(N1.p, &s1);
    pf_p2p_get_stats(N2.p, &s2);
    assert_int_equal(s1.handshakes_out, 1);
    assert_int_equal(s1.handshakes_in, 1);
    assert_int_equal(s2.handshakes_out, 1);
    assert_int_equal(s2.handshakes_in, 1);
    assert_int_equal(s1.conns, 2); /* its own and the peer's: both alive */
    assert_int_equal(s2.conns, 2);
    assert_int_equal(s1.qps, 4);
    /* reused in both directions: no further handshakes, concurrently too */
    both_fetch("m3", "m4");
    both_fetch("m5", "m6");
    pf_p2p_get_stats(N1.p, &s1);
    pf_p2p_get_stats(N2.p, &s2);
    assert_int_equal(s1.handshakes_out + s1.handshakes_in, 2);
    assert_int_equal(s2.handshakes_out + s2.handshakes_in, 2);
    assert_int_equal(pf_p2p_flush_releases(N1.p, 5000), 0);
    assert_int_equal(pf_p2p_flush_releases(N2.p, 5000), 0);
    pf_p2p_get_stats(N1.p, &s1);
    pf_p2p_get_stats(N2.p, &s2);
    assert_int_equal(s1.lock_sessions, 0); /* every lock released by the requester */
    assert_int_equal(s2.lock_sessions, 0);
    assert_int_equal(s1.releases_sent, 3);
    assert_int_equal(s2.releases_sent, 3);

    /* N2 restarts (new incarnation, new endpoints, same address): N1's connections to it
     * are stale; N1's next fetch drops them and handshakes once */
    node_down(&N2);
    node_up(&N2, 2);
    struct job a = {.self = &N1, .req = "after-restart"};
    job_fetch(&a);
    check_from(&a);
    pf_p2p_get_stats(N1.p, &s1);
    assert_int_equal(s1.handshakes_out, 2);
    assert_int_equal(s1.conns, 1);
    /* and N2 fetches over that connection (no handshake of its own) */
    struct job b = {.self = &N2, .req = "from-new"};
    job_fetch(&b);
    check_from(&b);
    pf_p2p_get_stats(N2.p, &s2);
    assert_int_equal(s2.handshakes_out, 0);
    assert_int_equal(s2.handshakes_in, 1);
    node_down(&N1);
    node_down(&N2);
    pthread_barrier_destroy(&hs_bar);
}

/* A peer registered under one address whose handshake answer names endpoints on another
 * host is refused before any QP connects (security.md, peer handshakes). The nodes are
 * registered under an address of one of this host's interfaces while their NICs listen on
 * 127.0.0.1, so without the check the handshake (and the fetch) would succeed. */
static void test_endpoint_elsewhere_refused(void **st)
{
    static char a1[80], a2[80];
    struct ifaddrs *ifa = NULL;
    assert_int_equal(getifaddrs(&ifa), 0);
    char ip[INET_ADDRSTRLEN] = "";
    for (struct ifaddrs *i = ifa; i && !ip[0]; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        const struct in_addr *a = &((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if ((ntohl(a->s_addr) >> 24) != 127)
            inet_ntop(AF_INET, a, ip, sizeof(ip));
    }
    freeifaddrs(ifa);
    if (!ip[0]) {
        fprintf(stderr, "SKIP: no non-loopback IPv4 interface address on this host\n");
        skip();
    }
    snprintf(a1, sizeof(a1), "%s:1001", ip);
    snprintf(a2, sizeof(a2), "%s:1002", ip);
    struct node s1 = N1, s2 = N2;
    N1.addr = a1;
    N2.addr = a2;
    N1.other = &N2;
    N2.other = &N1;
    node_up(&N1, 1);
    node_up(&N2, 2);
    struct job j = {.self = &N1, .req = "elsewhere"};
    job_fetch(&j);
    assert_int_equal(j.got, 0); /* a miss, no bytes from a host nobody vouched for */
    struct pf_p2p_stats st1, st2;
    pf_p2p_get_stats(N1.p, &st1);
    pf_p2p_get_stats(N2.p, &st2);
    assert_int_equal(st1.handshakes_out, 0);
    assert_int_equal(st1.conns, 0);
    node_down(&N1);
    node_down(&N2);
    N1 = s1;
    N2 = s2;
}

/* Serving side (peer_auth.c): requester_id and every endpoint must be addresses the caller
 * proved; malformed endpoints and unresolvable requester ids are refused too. */
static void test_handshake_authorize(void **st)
{
    N1.other = &N2;
    node_up(&N1, 1);
    uint8_t ep[2][TCPNET_EP_LEN];
    struct tcpnet_ep e = {.port = 7, .token = 1};
    inet_pton(AF_INET, "10.1.1.1", e.ip);
    tcpnet_ep_encode(ep[0], &e);
    inet_pton(AF_INET, "10.2.2.2", e.ip);
    tcpnet_ep_encode(ep[1], &e);
    ProtobufCBinaryData eps[2] = {{TCPNET_EP_LEN, ep[0]}, {TCPNET_EP_LEN, ep[1]}};
    Pegaflow__HandshakeNic nic = PEGAFLOW__HANDSHAKE_NIC__INIT, *nicp = &nic;
    nic.n_endpoints = 2;
    nic.endpoints = eps;
    Pegaflow__HandshakeMetadata md = PEGAFLOW__HANDSHAKE_METADATA__INIT;
    md.n_nics = 1;
    md.nics = &nicp;
    uint8_t blob[256];
    Pegaflow__RdmaHandshakeRequest r = PEGAFLOW__RDMA_HANDSHAKE_REQUEST__INIT;
    r.handshake_metadata =
        (ProtobufCBinaryData){pegaflow__handshake_metadata__pack(&md, blob), blob};
    char ids[2][PF_AUTH_IP_MAX] = {"10.1.1.1", "10.2.2.2"}, err[P2P_ERRLEN];
    const char(*c)[PF_AUTH_IP_MAX] = (const char(*)[PF_AUTH_IP_MAX])ids;
    r.requester_id = (char *)"10.1.1.1:5000";
    assert_int_equal(p2p_handshake_authorize(N1.p, &r, c, 2, err, sizeof(err)), 0);
    /* an endpoint on an address the caller did not prove */
    assert_int_equal(p2p_handshake_authorize(N1.p, &r, c, 1, err, sizeof(err)), -EACCES);
    assert_non_null(strstr(err, "nics[0].endpoints[1] names 10.2.2.2"));
    /* requester_id naming another node */
    r.requester_id = (char *)"10.3.3.3:5000";
    assert_int_equal(p2p_handshake_authorize(N1.p, &r, c, 2, err, sizeof(err)), -EACCES);
    assert_non_null(strstr(err, "not an address the caller proved"));
    /* a caller without an IP (no identities) proves nothing */
    r.requester_id = (char *)"10.1.1.1:5000";
    assert_int_equal(p2p_handshake_authorize(N1.p, &r, c, 0, err, sizeof(err)), -EACCES);
    r.requester_id = (char *)"not an address";
    assert_int_equal(p2p_handshake_authorize(N1.p, &r, c, 2, err, sizeof(err)), -EINVAL);
    /* no name lookup on the request path (issue 26): a requester_id naming a host is refused
     * before any resolution, even one that would resolve to the caller's proven address
     * (localhost -> 127.0.0.1 in /etc/hosts; resolved, it was accepted) */
    char lo[1][PF_AUTH_IP_MAX] = {"127.0.0.1"};
    r.requester_id = (char *)"localhost:5000";
    r.handshake_metadata.len = 0;
    assert_int_equal(
        p2p_handshake_authorize(N1.p, &r, (const char(*)[PF_AUTH_IP_MAX])lo, 1, err, sizeof(err)),
        -EINVAL);
    assert_non_null(strstr(err, "not a numeric ip:port"));
    r.requester_id = (char *)"127.0.0.1:5000"; /* the same address, numeric: accepted */
    assert_int_equal(
        p2p_handshake_authorize(N1.p, &r, (const char(*)[PF_AUTH_IP_MAX])lo, 1, err, sizeof(err)),
        0);
    r.handshake_metadata =
        (ProtobufCBinaryData){pegaflow__handshake_metadata__pack(&md, blob), blob};
    /* a malformed endpoint */
    r.requester_id = (char *)"10.1.1.1:5000";
    ep[1][0] ^= 0xff;
    r.handshake_metadata.len = pegaflow__handshake_metadata__pack(&md, blob);
    assert_int_equal(p2p_handshake_authorize(N1.p, &r, c, 2, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "malformed endpoint"));
    /* requester-side helper: a name resolves to its addresses */
    char hs[4][PF_AUTH_IP_MAX];
    size_t n = 0;
    assert_int_equal(p2p_host_ips("localhost:1", hs, 4, &n), 0);
    assert_true(n >= 1);
    assert_int_equal(p2p_host_ips("10.9.8.7:1", hs, 4, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(hs[0], "10.9.8.7");
    assert_int_equal(p2p_host_ips("nohostport", hs, 4, &n), -EINVAL);
    /* serving-side helper: numeric only */
    assert_int_equal(p2p_numeric_ips("localhost:1", hs, 4, &n), -EINVAL);
    assert_int_equal(p2p_numeric_ips("10.9.8.7:1", hs, 4, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(hs[0], "10.9.8.7");
    assert_int_equal(p2p_numeric_ips("[::1]:1", hs, 4, &n), 0);
    assert_string_equal(hs[0], "::1");
    node_down(&N1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_validate),
        cmocka_unit_test(test_rkey_lookup),
        cmocka_unit_test(test_two_nodes_mutual_handshake),
        cmocka_unit_test(test_endpoint_elsewhere_refused),
        cmocka_unit_test(test_handshake_authorize),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

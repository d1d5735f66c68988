/* The query-time tier plan (docs/p2p.md "The plan") against a fake local tier ("ssd": a set
 * of held keys, probe without I/O as pf_ssd_probe) and a fake remote tier ("rdma": a scripted
 * MetaServer answer of ranked holders, fetch_from per holder as p2p_tier_fetch_from), with a
 * real engine on the sim GPU: a pure miss answers Ready(0) at once with no task and one
 * discovery; k of n held remotely with j delivered counts requested/delivered/shortfall
 * exactly; a failed best holder falls to the next one, a short holder to the SSD for exactly
 * the missing blocks; own SSD before peers (also with wait_for_full_prefix); a stalled peer
 * does not hold up another request's SSD hit; a full remote queue answers at once. The
 * remote tier discovers whole or (setup_split, as the P2P tier) in two halves around the
 * query thread's own work. Every delivered block is checked byte by byte against the pattern
 * of its key. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/pegaflow.h"
#include "engine/engine_internal.h"
#include "pf/hal.h"
#include "pf/metrics.h"

#define SEG  4096
#define NB   8
#define NKEY 200

static uint8_t H[NKEY][32];

/* ------------------------------------------------------------------ fake tiers */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct fholder {
    const char *node;
    uint32_t len;      /* advertised run from the query's first key */
    int deliver;       /* blocks it really delivers per call (-1 = all asked) */
    const char *why;   /* its reason when short */
    atomic_bool *gate; /* waits (bounded) until true */
};

static struct {
    /* remote */
    int discover_rc; /* -1 unavailable, else answer the holders */
    struct fholder h[4];
    int nh;
    int discover_calls;
    int dstart, dfinish, ddrop; /* split-phase discoveries (setup_split) */
    int from_calls, from_first[16], from_n[16];
    const char *from_node[16];
    int poll_calls;
    /* local */
    bool held[NKEY];
    int probe_calls, fetch_calls, fetch_first[16], fetch_n[16];
} T;

static int key_idx(const struct pf_block_key *k)
{
    return k->hash[0] | (k->hash[1] << 8);
}

/* A block with 2 slots whose bytes are a pattern of its key index. */
static struct pf_block *make_block(struct pf_engine *e, const struct pf_block_key *k)
{
    struct pf_alloc *a;
    assert_int_equal(pf_engine_alloc(e, 2 * SEG, -1, &a), 0);
    int idx = key_idx(k);
    uint8_t *p = a->ptr;
    for (size_t i = 0; i < 2 * SEG; i++)
        p[i] = (uint8_t)(idx * 31 + i * 7 + (i >> 12));
    struct pf_slot sl[2];
    for (int s = 0; s < 2; s++) {
        if (s)
            pf_alloc_get(a);
        sl[s] = (struct pf_slot){
            .k = p + s * SEG, .ka = a, .seg_len = SEG, .seg_stride = SEG, .nseg = 1};
    }
    pf_slots_checksum(sl, 2);
    struct pf_block *b;
    assert_int_equal(pf_block_pack(NULL, k, 2, sl, &b), 0);
    return b;
}

static bool block_ok(const struct pf_block *b, int idx)
{
    for (uint16_t s = 0; s < 2; s++) {
        struct pf_slot sl;
        pf_block_slot(b, s, &sl);
        const uint8_t *p = sl.k;
        for (size_t i = 0; i < SEG; i++) {
            size_t off = s * SEG + i;
            if (p[i] != (uint8_t)(idx * 31 + off * 7 + (off >> 12)))
                return false;
        }
        if (!sl.has_checksum || !pf_slot_verify(&sl, sl.checksum))
            return false;
    }
    return true;
}

static struct pf_engine *E;

static size_t l_probe(void *ctx, const char *req, const struct pf_block_key *k, size_t n, bool full)
{
    pthread_mutex_lock(&mu);
    T.probe_calls++;
    size_t c = 0;
    while (c < n && T.held[key_idx(&k[c])])
        c++;
    pthread_mutex_unlock(&mu);
    return c;
}

static size_t l_fetch(void *ctx, const char *req, const struct pf_block_key *k, size_t n, bool all,
                      struct pf_block **out)
{
    pthread_mutex_lock(&mu);
    if (T.fetch_calls < 16) {
        T.fetch_first[T.fetch_calls] = key_idx(&k[0]);
        T.fetch_n[T.fetch_calls] = (int)n;
    }
    T.fetch_calls++;
    size_t c = 0;
    while (c < n && T.held[key_idx(&k[c])])
        c++;
    pthread_mutex_unlock(&mu);
    if (all && c < n)
        return 0;
    for (size_t i = 0; i < c; i++)
        out[i] = make_block(E, &k[i]);
    return c;
}

static int r_discover(void *ctx, const char *req, const struct pf_block_key *k, size_t n,
                      struct pf_tier_source *src, size_t max)
{
    pthread_mutex_lock(&mu);
    T.discover_calls++;
    int rc = T.discover_rc;
    size_t m = 0;
    for (int i = 0; rc >= 0 && i < T.nh && m < max; i++) {
        snprintf(src[m].node, sizeof(src[m].node), "%s", T.h[i].node);
        src[m].len = T.h[i].len < n ? T.h[i].len : (uint32_t)n;
        src[m].down = false;
        m++;
    }
    pthread_mutex_unlock(&mu);
    return rc < 0 ? -1 : (int)m;
}

/* The split phase (setup_split): start keeps the keys and the thread, finish checks both
 * (same thread, keys unchanged: the engine's contract) and answers as r_discover. */
struct dop {
    const char *req;
    const struct pf_block_key *k;
    struct pf_block_key first; /* k[0] as it was at start */
    size_t n;
    pthread_t thr;
};

static void *r_discover_start(void *ctx, const char *req, const struct pf_block_key *k, size_t n)
{
    struct dop *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    *d = (struct dop){req, k, k[0], n, pthread_self()};
    pthread_mutex_lock(&mu);
    T.dstart++;
    pthread_mutex_unlock(&mu);
    return d;
}

static int r_discover_finish(void *ctx, void *op, struct pf_tier_source *src, size_t max)
{
    struct dop *d = op;
    assert_true(pthread_equal(d->thr, pthread_self()));
    assert_memory_equal(&d->k[0], &d->first, sizeof(d->first));
    int rc = -1;
    if (src)
        rc = r_discover(ctx, d->req, d->k, d->n, src, max);
    pthread_mutex_lock(&mu);
    if (src)
        T.dfinish++;
    else
        T.ddrop++;
    pthread_mutex_unlock(&mu);
    free(d);
    return rc;
}

static size_t r_fetch_from(void *ctx, const char *req, const struct pf_tier_source *src,
                           const struct pf_block_key *k, size_t n, struct pf_block **out,
                           const char **why)
{
    pthread_mutex_lock(&mu);
    struct fholder *h = NULL;
    for (int i = 0; i < T.nh; i++)
        if (strcmp(T.h[i].node, src->node) == 0)
            h = &T.h[i];
    assert_non_null(h);
    assert_true(n <= src->len); /* never asked beyond what it advertised */
    if (T.from_calls < 16) {
        T.from_first[T.from_calls] = key_idx(&k[0]);
        T.from_n[T.from_calls] = (int)n;
        T.from_node[T.from_calls] = h->node;
    }
    T.from_calls++;
    atomic_bool *gate = h->gate;
    size_t c = h->deliver < 0 || (size_t)h->deliver > n ? n : (size_t)h->deliver;
    const char *w = h->why;
    pthread_mutex_unlock(&mu);
    for (int i = 0; gate && !atomic_load(gate) && i < 10000; i++)
        usleep(1000);
    for (size_t i = 0; i < c; i++)
        out[i] = make_block(E, &k[i]);
    if (c < n)
        *why = w;
    return c;
}

static size_t r_poll(void *ctx, const char *req, const struct pf_block_key *k, size_t n, bool all,
                     struct pf_block **out)
{
    pthread_mutex_lock(&mu);
    T.poll_calls++;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* ------------------------------------------------------------------ fixture */

static struct pf_gpu *G;
static bool split; /* the remote tier discovers in two halves (as the P2P tier does) */

static int setup(void **st)
{
    memset(&T, 0, sizeof(T));
    for (int i = 0; i < NKEY; i++)
        for (int j = 0; j < 32; j++)
            H[i][j] = j == 0   ? (uint8_t)(i & 0xff)
                      : j == 1 ? (uint8_t)(i >> 8)
                               : (uint8_t)(j * 5 + 3);
    char chosen[32], err[256];
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    pf_hal_init();
    assert_int_equal(pf_hal_gpu_open("sim", &gc, &G, chosen, sizeof(chosen), err, sizeof(err)), 0);
    struct pf_engine_config ec = {.gpu = G,
                                  .pool_size = 64 << 20,
                                  .integrity = true,
                                  .skip_memcheck = true,
                                  .prefetch_queue_depth = (uint32_t)(uintptr_t)*st};
    assert_int_equal(pf_engine_create(&ec, &E, err, sizeof(err)), 0);
    /* registration order as the server's: the remote tier first, then the SSD */
    struct pf_tier r = {.name = "rdma",
                        .cls = PF_CLASS_RECLAIMABLE,
                        .fetch = r_poll,
                        .discover = r_discover,
                        .discover_start = split ? r_discover_start : NULL,
                        .discover_finish = split ? r_discover_finish : NULL,
                        .fetch_from = r_fetch_from};
    struct pf_tier l = {
        .name = "ssd", .cls = PF_CLASS_RETAINED, .probe = l_probe, .fetch = l_fetch};
    assert_int_equal(pf_engine_add_tier(E, &r), 0);
    assert_int_equal(pf_engine_add_tier(E, &l), 0);
    return 0;
}

static int setup_split(void **st)
{
    split = true;
    return setup(st);
}

static int teardown(void **st)
{
    /* every discovery started was finished once, by a query thread */
    assert_int_equal(T.dstart, T.dfinish + T.ddrop);
    assert_true(!split || T.dstart > 0);
    split = false;
    pf_engine_destroy(E);
    pf_gpu_close(G);
    return 0;
}

/* The engine needs a registered instance to answer queries: one rank over a sim KV. */
static struct pf_simkv *KV;
static void reg(void)
{
    assert_int_equal(pf_simkv_create(NB * SEG, 0, &KV), 0);
    struct pf_engine_layer l = {
        .name = "ALL_LAYERS", .num_blocks = NB, .bytes_per_block = SEG, .segments = 1};
    l.ipc.kind = PF_IPC_SIM_SHM;
    l.ipc.size = NB * SEG;
    l.ipc.sim_device = 0;
    snprintf(l.ipc.shm_name, sizeof(l.ipc.shm_name), "%s", pf_simkv_name(KV));
    struct pf_engine_register r = {.instance_id = "i",
                                   .namespace_ = "ns-plan",
                                   .client_version = PF_VERSION,
                                   .tp_rank = 0,
                                   .tp_size = 1,
                                   .world_size = 1,
                                   .device_id = 0,
                                   .layers = &l,
                                   .nlayers = 1};
    char err[256];
    assert_int_equal(pf_engine_register(E, &r, err, sizeof(err)), 0);
}

static void unreg(void)
{
    char err[256];
    assert_int_equal(pf_engine_unregister(E, "i", err, sizeof(err)), 0);
    pf_simkv_destroy(KV);
}

static int q(const char *req, int first, size_t n, bool full, struct pf_engine_query_result *res)
{
    struct pf_bytes hs[NKEY];
    for (size_t i = 0; i < n; i++)
        hs[i] = (struct pf_bytes){H[first + i], 32};
    struct pf_engine_query qq = {
        .instance_id = "i", .req_id = req, .hashes = hs, .n = n, .wait_for_full_prefix = full};
    char err[256];
    return pf_engine_query(E, &qq, res, err, sizeof(err));
}

/* Polls until Ready; returns the number of polls it took (first query = 1). */
static int until_ready(const char *req, int first, size_t n, bool full,
                       struct pf_engine_query_result *res)
{
    int polls = 0;
    do {
        if (polls)
            usleep(1000);
        assert_int_equal(q(req, first, n, full, res), 0);
        polls++;
    } while (res->loading && polls < 20000);
    assert_false(res->loading);
    return polls;
}

static void release(struct pf_engine_query_result *res)
{
    if (res->has_lease) {
        struct pf_bytes l = {res->lease, 16};
        char err[64];
        assert_int_equal(pf_engine_release(E, &l, err, sizeof(err)), 0);
    }
}

/* The blocks [first, first+n) are resident with their pattern, and first+n is not. */
static void check_resident(int first, size_t n)
{
    uint32_t ns;
    assert_int_equal(pf_ns_lookup("ns-plan", &ns), 0);
    struct pf_block_key k[NKEY];
    struct pf_block *b[NKEY];
    for (size_t i = 0; i <= n; i++)
        pf_key_make(ns, H[first + i], 32, &k[i]);
    assert_int_equal(pf_cache_prefix(pf_engine_cache(E), k, n + 1, b), n);
    for (size_t i = 0; i < n; i++) {
        assert_true(block_ok(b[i], first + (int)i));
        pf_block_put(b[i]);
    }
}

static double M(const char *name, const char *a, const char *b)
{
    const char *v[2] = {a, b};
    return pf_metric_value_of(name, v);
}
#define REQ(t)      M("pegaflow_cache_tier_block_requests", t, NULL)
#define DELIV(t)    M("pegaflow_cache_tier_blocks_delivered", t, NULL)
#define SHORT(t, r) M("pegaflow_prefetch_shortfall_blocks", t, r)

static size_t ntasks(void)
{
    pthread_mutex_lock(&E->pf_mu);
    size_t n = E->pf_tasks.count;
    pthread_mutex_unlock(&E->pf_mu);
    return n;
}

/* ------------------------------------------------------------------ tests */

/* Nobody holds anything: Ready(0) at the first query, no task, one discovery, all miss. */
static void test_pure_miss_ready_at_once(void **st)
{
    reg();
    double miss = REQ("miss"), rdma = REQ("rdma"), ssd = REQ("ssd");
    struct pf_engine_query_result res;
    uint64_t total = pf_hll_total(E->hll, 0);
    double card = pf_hll_cardinality(E->hll, 0);
    assert_int_equal(q("pm", 0, 48, false, &res), 0);
    assert_false(res.loading);
    assert_int_equal(res.num_hit_blocks, 0);
    assert_false(res.has_lease);
    assert_int_equal(ntasks(), 0);
    assert_int_equal(T.discover_calls, 1);
    assert_int_equal(T.dstart, split ? 1 : 0);
    /* the reuse estimator got the 48 misses (with split discovery: identities computed
     * while it travelled), the same as without */
    assert_int_equal(pf_hll_total(E->hll, 0), total + 48);
    assert_true(pf_hll_cardinality(E->hll, 0) - card > 47.0 &&
                pf_hll_cardinality(E->hll, 0) - card < 49.0);
    assert_int_equal(T.fetch_calls + T.from_calls + T.poll_calls, 0);
    assert_true(REQ("miss") - miss == 48);
    assert_true(REQ("rdma") - rdma == 0 && REQ("ssd") - ssd == 0);
    /* the MetaServer unavailable (down, slow past the plan deadline): local tiers only */
    T.discover_rc = -1;
    T.held[60] = T.held[61] = true;
    assert_int_equal(q("pm2", 60, 4, false, &res), 0);
    assert_true(res.loading);
    until_ready("pm2", 60, 4, false, &res);
    assert_int_equal(res.num_hit_blocks, 2);
    release(&res);
    check_resident(60, 2);
    assert_int_equal(T.from_calls, 0);
    assert_int_equal(q("pm3", 70, 4, false, &res), 0); /* and a pure miss is still at once */
    assert_false(res.loading);
    assert_int_equal(res.num_hit_blocks, 0);
    assert_int_equal(ntasks(), 0);
    unreg();
}

/* 48 asked, a holder advertises 32 and delivers 20: the plan says rdma 32, miss 16; 20 are
 * delivered, 12 are short ("evicted"); nothing past the gap at 32 is fetched, although the
 * SSD holds 40..47. */
static void test_counts_k_of_n_j_delivered(void **st)
{
    reg();
    T.h[0] = (struct fholder){"10.0.0.1:1", 32, 20, "evicted", NULL};
    T.nh = 1;
    for (int i = 40; i < 48; i++)
        T.held[i] = true;
    double miss = REQ("miss"), rdma = REQ("rdma"), ssd = REQ("ssd"), dr = DELIV("rdma"),
           ds = DELIV("ssd"), sh = SHORT("rdma", "evicted");
    struct pf_engine_query_result res;
    assert_int_equal(q("kn", 0, 48, false, &res), 0);
    assert_true(res.loading);
    assert_true(REQ("rdma") - rdma == 32);
    assert_true(REQ("miss") - miss == 16);
    assert_true(REQ("ssd") - ssd == 0);
    until_ready("kn", 0, 48, false, &res);
    assert_int_equal(res.num_hit_blocks, 20);
    assert_true(res.has_lease);
    release(&res);
    assert_true(DELIV("rdma") - dr == 20);
    assert_true(DELIV("ssd") - ds == 0);
    assert_true(SHORT("rdma", "evicted") - sh == 12);
    assert_int_equal(T.discover_calls, 1); /* nothing asked twice */
    assert_int_equal(T.from_calls, 1);
    assert_int_equal(T.from_first[0], 0);
    assert_int_equal(T.from_n[0], 32);
    assert_int_equal(T.fetch_calls, 0); /* 20..31 are not on the SSD, 40.. lie past the gap */
    check_resident(0, 20);
    unreg();
}

/* The best holder fails: the next holder serves every block, counted once. */
static void test_second_holder_serves_all(void **st)
{
    reg();
    T.h[0] = (struct fholder){"10.0.0.1:1", 16, 0, "error", NULL};
    T.h[1] = (struct fholder){"10.0.0.2:1", 16, -1, NULL, NULL};
    T.nh = 2;
    double rdma = REQ("rdma"), dr = DELIV("rdma"), sh = SHORT("rdma", "error");
    struct pf_engine_query_result res;
    assert_int_equal(q("two", 0, 16, false, &res), 0);
    assert_true(res.loading);
    until_ready("two", 0, 16, false, &res);
    assert_int_equal(res.num_hit_blocks, 16);
    release(&res);
    assert_int_equal(T.from_calls, 2);
    assert_string_equal(T.from_node[0], "10.0.0.1:1");
    assert_string_equal(T.from_node[1], "10.0.0.2:1");
    assert_int_equal(T.from_first[1], 0);
    assert_int_equal(T.from_n[1], 16);
    assert_true(REQ("rdma") - rdma == 16);
    assert_true(DELIV("rdma") - dr == 16);
    assert_true(SHORT("rdma", "error") - sh == 0);
    check_resident(0, 16);
    unreg();
}

/* A holder answers 5 of 16: the SSD serves exactly the 11 still missing. */
static void test_short_holder_falls_to_ssd(void **st)
{
    reg();
    T.h[0] = (struct fholder){"10.0.0.1:1", 16, 5, "evicted", NULL};
    T.nh = 1;
    for (int i = 5; i < 16; i++)
        T.held[i] = true;
    double rdma = REQ("rdma"), dr = DELIV("rdma"), ds = DELIV("ssd"), sh = SHORT("rdma", "evicted");
    struct pf_engine_query_result res;
    assert_int_equal(q("fb", 0, 16, false, &res), 0);
    assert_true(res.loading);
    assert_true(REQ("rdma") - rdma == 16);
    until_ready("fb", 0, 16, false, &res);
    assert_int_equal(res.num_hit_blocks, 16);
    release(&res);
    assert_int_equal(T.fetch_calls, 1);
    assert_int_equal(T.fetch_first[0], 5);
    assert_int_equal(T.fetch_n[0], 11);
    assert_true(DELIV("rdma") - dr == 5);
    assert_true(DELIV("ssd") - ds == 11);
    assert_true(SHORT("rdma", "evicted") - sh == 11);
    check_resident(0, 16);
    unreg();
}

/* Own SSD before peers: the whole prefix on the SSD and on a peer, wait_for_full_prefix:
 * the SSD serves it, no peer is asked and nothing polls. SSD 0..7 and nobody else with
 * wait_for_full_prefix: one polling run for the rest, then all or nothing. */
static void test_own_ssd_first_wait_full(void **st)
{
    reg();
    T.h[0] = (struct fholder){"10.0.0.1:1", 16, -1, NULL, NULL};
    T.nh = 1;
    for (int i = 0; i < 16; i++)
        T.held[i] = true;
    double ssd = REQ("ssd"), rdma = REQ("rdma");
    struct pf_engine_query_result res;
    assert_int_equal(q("own", 0, 16, true, &res), 0);
    assert_true(res.loading);
    assert_true(REQ("ssd") - ssd == 16 && REQ("rdma") - rdma == 0);
    until_ready("own", 0, 16, true, &res);
    assert_int_equal(res.num_hit_blocks, 16);
    release(&res);
    assert_int_equal(T.fetch_calls, 1);
    assert_int_equal(T.fetch_n[0], 16);
    assert_int_equal(T.from_calls + T.poll_calls, 0);
    check_resident(0, 16);
    /* 100..107 on the SSD, nobody holds 108..115 */
    T.nh = 0;
    for (int i = 100; i < 108; i++)
        T.held[i] = true;
    double inc = SHORT("ssd", "incomplete"), tmo = SHORT("rdma", "timeout");
    assert_int_equal(q("part", 100, 16, true, &res), 0);
    assert_true(res.loading);
    until_ready("part", 100, 16, true, &res);
    assert_int_equal(res.num_hit_blocks, 0);
    assert_false(res.has_lease);
    assert_int_equal(T.poll_calls, 1);
    assert_true(SHORT("ssd", "incomplete") - inc == 8);
    assert_true(SHORT("rdma", "timeout") - tmo == 8);
    unreg();
}

static atomic_bool gate;

static void wait_from_calls(int n)
{
    for (int i = 0; i < 5000; i++) {
        pthread_mutex_lock(&mu);
        int c = T.from_calls;
        pthread_mutex_unlock(&mu);
        if (c >= n)
            return;
        usleep(1000);
    }
    fail_msg("the remote fetches did not start");
}

/* Every remote prefetch thread stalled on a slow peer: another request's SSD hit and a pure
 * miss are answered while the peer still stalls. */
static void test_stalled_peer_does_not_delay_ssd_hit(void **st)
{
    reg();
    atomic_store(&gate, false);
    T.h[0] = (struct fholder){"10.0.0.1:1", 2, -1, NULL, &gate};
    T.nh = 1;
    struct pf_engine_query_result res;
    char req[16];
    for (int i = 0; i < PF_PREFETCH_THREADS; i++) {
        snprintf(req, sizeof(req), "slow%d", i);
        assert_int_equal(q(req, 20 + 2 * i, 2, false, &res), 0);
        assert_true(res.loading);
    }
    wait_from_calls(PF_PREFETCH_THREADS);
    T.nh = 0; /* the next requests: nobody remote */
    for (int i = 150; i < 154; i++)
        T.held[i] = true;
    assert_int_equal(q("fast", 150, 4, false, &res), 0);
    assert_true(res.loading);
    until_ready("fast", 150, 4, false, &res);
    assert_int_equal(res.num_hit_blocks, 4);
    release(&res);
    assert_false(atomic_load(&gate)); /* the peer still stalls */
    assert_int_equal(q("miss", 160, 4, false, &res), 0);
    assert_false(res.loading);
    check_resident(150, 4);
    atomic_store(&gate, true);
    for (int i = 0; i < PF_PREFETCH_THREADS; i++) {
        snprintf(req, sizeof(req), "slow%d", i);
        until_ready(req, 20 + 2 * i, 2, false, &res);
        assert_int_equal(res.num_hit_blocks, 2);
        release(&res);
    }
    unreg();
}

/* A full remote queue (depth 1): the request is answered at once from RAM, its plan counted
 * short as queue_full. */
static void test_remote_queue_full(void **st)
{
    reg();
    atomic_store(&gate, false);
    T.h[0] = (struct fholder){"10.0.0.1:1", 2, -1, NULL, &gate};
    T.nh = 1;
    struct pf_engine_query_result res;
    char req[16];
    for (int i = 0; i < PF_PREFETCH_THREADS; i++) {
        snprintf(req, sizeof(req), "busy%d", i);
        assert_int_equal(q(req, 20 + 2 * i, 2, false, &res), 0);
        assert_true(res.loading);
        wait_from_calls(i + 1); /* a thread took it: the queue is empty again */
    }
    assert_int_equal(q("queued", 40, 2, false, &res), 0); /* the queue's one place */
    assert_true(res.loading);
    double qf = SHORT("rdma", "queue_full"),
           full = M("pegaflow_prefetch_queue_full", "remote", NULL);
    assert_int_equal(q("turned", 50, 2, false, &res), 0);
    assert_false(res.loading);
    assert_int_equal(res.num_hit_blocks, 0);
    assert_true(SHORT("rdma", "queue_full") - qf == 2);
    assert_true(M("pegaflow_prefetch_queue_full", "remote", NULL) - full == 1);
    atomic_store(&gate, true);
    for (int i = 0; i < PF_PREFETCH_THREADS; i++) {
        snprintf(req, sizeof(req), "busy%d", i);
        until_ready(req, 20 + 2 * i, 2, false, &res);
        release(&res);
    }
    until_ready("queued", 40, 2, false, &res);
    assert_int_equal(res.num_hit_blocks, 2);
    release(&res);
    unreg();
}

/* A tier's two discovery halves come together, and with discover. */
static void test_add_tier_split_halves(void **st)
{
    size_t n = E->ntiers;
    struct pf_tier t = {.name = "x",
                        .fetch = r_poll,
                        .discover = r_discover,
                        .fetch_from = r_fetch_from,
                        .discover_start = r_discover_start};
    assert_int_equal(pf_engine_add_tier(E, &t), -EINVAL);
    t.discover_start = NULL;
    t.discover_finish = r_discover_finish;
    assert_int_equal(pf_engine_add_tier(E, &t), -EINVAL);
    t.discover_start = r_discover_start;
    t.discover = NULL;
    assert_int_equal(pf_engine_add_tier(E, &t), -EINVAL);
    assert_int_equal(E->ntiers, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_add_tier_split_halves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pure_miss_ready_at_once, setup_split, teardown),
        cmocka_unit_test_setup_teardown(test_counts_k_of_n_j_delivered, setup_split, teardown),
        cmocka_unit_test_setup_teardown(test_second_holder_serves_all, setup_split, teardown),
        cmocka_unit_test_setup_teardown(test_own_ssd_first_wait_full, setup_split, teardown),
        cmocka_unit_test_setup_teardown(test_pure_miss_ready_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counts_k_of_n_j_delivered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_holder_serves_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_holder_falls_to_ssd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_own_ssd_first_wait_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stalled_peer_does_not_delay_ssd_hit, setup, teardown),
        cmocka_unit_test_prestate_setup_teardown(test_remote_queue_full, setup, teardown,
                                                 (void *)(uintptr_t)1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

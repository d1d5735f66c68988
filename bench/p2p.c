/* bench/p2p: remote fetch through the production path (pegaflow-server processes, the
 * MetaServer, libpegaflow queries) against a plain TCP stream over the same link, in the same
 * run; and the latency of fetching a 16-block prefix.
 *
 * Topology: as root, two network namespaces joined by one veth pair (addresses only inside
 * them; both deleted at exit): node A (holder) and the MetaServer in one, node B (requester)
 * and this process (the client) in the other, each node's fabric NIC named by its veth.
 * Otherwise (or --loopback) A and the MetaServer on 127.0.0.2, B on 127.0.0.3.
 *
 * Throughput: for each block size (default 256 KiB, 1 MiB, 4 MiB) A saves --size bytes
 * (default 1 GiB) of seeded random KV as one layer of that block size; each round drops B's
 * RAM cache (POST /cache/memory/cleanup), then times B's QueryPrefetch from the first
 * answer (Loading) to Ready with every block: MetaServer discovery, QueryBlocksForTransfer,
 * staging allocation, the READs, verification of every slot's xxh3 checksum (a full byte
 * check) and the sealed blocks. Rounds alternate with the raw baseline (ABBA: odd rounds
 * raw first): --size bytes sent from A's namespace to B's over as many parallel TCP
 * connections as the servers use QPs per peer (--qps), with the same huge-page advice as
 * the servers' pools, the fastest of block-size, 256 KiB, 1 MiB, 4 MiB and single calls. The table
 * reports medians and their ratio.
 *
 * Verification on vs off (--verify-row on, the default with --integrity on): a second
 * requester next to B runs with --integrity off; every round fetches the same blocks on
 * both, ABBA-interleaved, each after the other's copies were withdrawn from the MetaServer
 * (both read from A). --concurrent N: each fetch is N QueryPrefetch runs started together
 * on one requester, 1/N of the blocks each (N fetches from one peer at once); the JSON's
 * top-level "concurrent" says which. Every round's fetched blocks are loaded back and
 * compared byte for byte with A's (outside the timed part).
 *
 * Pure miss (p2p_miss.h): QueryPrefetch of 4096 hashes nobody holds on B vs a node without
 * P2P, both Ready(0) at once (target p50 <= 1.3x).
 *
 * Latency: per block size, --lat-reps times: A saves 16 fresh blocks, they are advertised,
 * then B's QueryPrefetch is repeated back to back from Loading until Ready (client view), next
 * to B's own fetch time (pegaflow_rdma_fetch_duration_seconds) and an empty Health round trip.
 *
 * With --backend verbs the nodes use the verbs backend on --nics A,B (default rxe0,rxe1) at
 * --addrs A,B (default 10.77.0.1,10.77.0.2: the soft-RoCE guest of ci/rxe-vm.sh), all in
 * this network namespace, and the raw baseline is a raw verbs READ loop on the same two
 * devices (bench/rawverbs.h) instead of the TCP stream.
 *
 * Usage: p2p [--size 1g] [--blocks 256k,1m,4m] [--reps 3] [--lat-reps 10] [--qps 2]
 *            [--integrity on|off] [--loopback] [--backend tcp|verbs] [--nics A,B]
 *            [--addrs A,B] [--json p2p.json] [--tls] [--concurrent 1]
 *            [--verify-row on|off] [--plan-timeout-ms N] [--poll-us 1000]  (PF_BIN: the
 * binaries, default build/rel/bin)
 *
 * --poll-us N: the client asks QueryPrefetch again N µs after a Loading answer (default 1000,
 * about one fast scheduler step; vLLM's connector asks again at its next step), 0 = back to
 * back. Every fetch time therefore includes up to N µs of the last pause; the "fetch GB/s"
 * and "server mean ms" columns are the requester's own fetch time, without it.
 *
 * --plan-timeout-ms N: every node's --p2p-plan-timeout-ms. Under emulation (make bench-rxe)
 * the query-time MetaServer plan takes longer than the 50 ms default, and a request planned
 * from local tiers only measures nothing (fetch_on retries it, up to 5 times).
 *
 * --tls: a fresh test PKI (tests/integration/certs.sh, openssl; PF_TOP: the source tree)
 * and --tls-cert/--tls-key/--tls-ca on the MetaServer and both nodes: gRPC and the TCP
 * fabric run TLS 1.3 (docs/security.md "Fabric TLS"); this process uses the same
 * certificate (libpegaflow's PEGAFLOW_TLS_* environment).
 *
 * Layout: main is the list of phases (options, set-up, raw sender, nodes, clients,
 * throughput, latency, pure miss, JSON); the processes, the topology and the raw TCP
 * baseline are in p2p_env.h, the pure-miss row in p2p_miss.h; options, medians and the
 * JSON result (libcjson) come from benchutil.h. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/rpc.h"
#include "pfnetns.h"
#include "pfmeta.h"
#include "pftest.h"
#include "benchutil.h"
#include "rawverbs.h"

#define MAX_BLOCKS 8
/* the raw streams also run in calls of these sizes at every block size: which call size is
 * fastest depends on the day's VM (2026-12-01: 256 KiB, 5.7 vs 4.5 GB/s in 4 MiB calls;
 * 2026-12-02: 1 MiB, 2.0-2.2 vs 1.6-1.8 GB/s in 256 KiB or 4 MiB calls) */
static const uint64_t raw_calls[] = {256ull << 10, 1ull << 20, 4ull << 20};
#define MAX_REPS 32
#define HLEN     32
#define TMO      60000
#define NSTR     "ns-bench-p2p"

struct opts {
    uint64_t size;
    uint64_t blocks[MAX_BLOCKS];
    int nblocks;
    int reps, lat_reps, qps;
    bool loopback;
    const char *backend;
    char nics[2][64], addrs[2][40];
    const char *integrity;
    const char *json;
    bool tls;            /* --tls: every process with --tls-cert/--tls-key/--tls-ca (fabric TLS) */
    int concurrent;      /* --concurrent N: N fetches from A at once, each 1/N of the blocks */
    bool verify_row;     /* --verify-row on|off: the same fetches on a requester with
                          * --integrity off, interleaved (verification on vs off) */
    int poll_us;         /* --poll-us N: pause after a Loading answer (0: back to back) */
    const char *plan_ms; /* --plan-timeout-ms N: the nodes' --p2p-plan-timeout-ms (default:
                          * the server's); the emulated rxe guest needs more than 50 ms */
};

#include "p2p_env.h"

/* ------------------------------------------------------------------ the client side */

static struct pf_client *ca, *cb;
static struct pf_simkv *kv_a, *kv_b;

static void reg(struct pf_client *c, const char *id, struct pf_simkv *kv, uint64_t nblocks,
                uint64_t bs)
{
    if (bu_register(c, id, NSTR, kv, nblocks, bs, TMO))
        die("register %s: %s", id, pf_last_error_message());
}

static void save(const char *inst, uint64_t space, uint64_t h0, uint32_t first, size_t n)
{
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 256 ? n - done : 256;
        uint32_t ids[256];
        uint8_t hs[256 * HLEN];
        for (size_t i = 0; i < k; i++) {
            ids[i] = first + (uint32_t)(done + i);
            hash_of(space, h0 + done + i, hs + i * HLEN);
        }
        struct pf_save_layer sl = {
            .name = "ALL_LAYERS", .block_ids = ids, .hashes = hs, .hash_len = HLEN, .n = k};
        if (pf_client_save(ca, inst, 0, 0, 0, &sl, 1, TMO))
            die("save: %s", pf_last_error_message());
        done += k;
    }
}

/* --poll-us: pause after a Loading answer before asking again. vLLM's connector asks again
 * at its next scheduler step (python/pegaflow/connector/scheduler.py _lookup: "ask again
 * later"); asking back to back makes the client and the requester's RPC threads burn the
 * CPU the fetch itself needs (measured: 0.7 + ~1.1 s/GiB on 2 vCPUs, bench/README.md). */
static unsigned poll_us = 1000;

/* QueryPrefetch on B until Ready, every poll_us; returns seconds from the first call. */
static double fetch_once(struct pf_client *c, const char *inst, const char *req, uint64_t space,
                         uint64_t h0, size_t n, uint32_t *hits_p)
{
    uint8_t *hs = malloc(n * HLEN);
    for (size_t i = 0; i < n; i++)
        hash_of(space, h0 + i, hs + i * HLEN);
    struct pf_query_result r;
    uint64_t t0 = pf_now_ns(), dl = pft_now_ms() + 120000;
    for (;;) {
        if (pf_client_query(c, inst, req, hs, NULL, HLEN, n, 0, 0, &r, NULL, 0, TMO))
            die("query: %s", pf_last_error_message());
        if (!r.loading)
            break;
        if (pft_now_ms() > dl)
            die("still Loading after 120 s");
        if (poll_us)
            usleep(poll_us);
    }
    double s = (double)(pf_now_ns() - t0) / 1e9;
    if (r.lease_len)
        pf_client_release(c, r.lease, r.lease_len, TMO);
    free(hs);
    *hits_p = r.num_hit_blocks;
    return s;
}

/* fetch_once, repeated (up to 5 times, a fresh request id each) while it answers Ready with
 * no block at all: on a loaded machine (or the emulated rxe guest) the query-time plan's
 * MetaServer deadline (--p2p-plan-timeout-ms) can pass, and the request is then planned from
 * local tiers only (docs/p2p.md "The plan"); that round measures nothing. */
static double fetch_on(struct pf_client *c, const char *inst, const char *req, uint64_t space,
                       uint64_t h0, size_t n, uint32_t *hits_p)
{
    double s = fetch_once(c, inst, req, space, h0, n, hits_p);
    for (int a = 1; a < 5 && *hits_p == 0 && n > 0; a++) {
        char r2[96];
        snprintf(r2, sizeof(r2), "%s-again%d", req, a);
        fprintf(stderr,
                "p2p bench: %s: Ready without blocks (the plan's MetaServer deadline "
                "passed?): again as %s\n",
                req, r2);
        s = fetch_once(c, inst, r2, space, h0, n, hits_p);
    }
    return s;
}

static double fetch_on_b(const char *inst, const char *req, uint64_t space, uint64_t h0, size_t n,
                         uint32_t *hits_p)
{
    return fetch_on(cb, inst, req, space, h0, n, hits_p);
}

/* --concurrent: one requester thread per slice of the blocks, all started together */
struct conc {
    struct pf_client *c;
    const char *inst;
    char req[80];
    uint64_t space, h0;
    size_t n;
    uint32_t hits;
    pthread_t t;
};

static void *conc_main(void *arg)
{
    struct conc *k = arg;
    fetch_on(k->c, k->inst, k->req, k->space, k->h0, k->n, &k->hits);
    return NULL;
}

/* n blocks fetched as nc concurrent QueryPrefetch runs from one peer (slices of n/nc);
 * returns the wall time in seconds, *hits_p the blocks every run got together. */
static double fetch_conc(struct pf_client *c, const char *inst, const char *req, uint64_t space,
                         size_t n, int nc, uint32_t *hits_p)
{
    if (nc <= 1)
        return fetch_on(c, inst, req, space, 0, n, hits_p);
    struct conc k[16];
    uint64_t t0 = pf_now_ns();
    for (int i = 0; i < nc; i++) {
        size_t a = n * (size_t)i / (size_t)nc, b = n * (size_t)(i + 1) / (size_t)nc;
        k[i] = (struct conc){.c = c, .inst = inst, .space = space, .h0 = a, .n = b - a};
        snprintf(k[i].req, sizeof(k[i].req), "%s-c%d", req, i);
        if (pthread_create(&k[i].t, NULL, conc_main, &k[i]))
            die("pthread_create");
    }
    *hits_p = 0;
    for (int i = 0; i < nc; i++) {
        pthread_join(k[i].t, NULL);
        *hits_p += k[i].hits;
    }
    return (double)(pf_now_ns() - t0) / 1e9;
}

/* The fetched blocks themselves, not only the integrity metric: loads B's copies of blocks
 * [h0, h0+n) of A (block i of kv_a) into kv_b, one kv_b-full at a time, and compares every
 * byte with A's memory. Outside the timed rounds. */
static void verify_on(struct pf_client *c, struct pf_simkv *kv, const char *inst, uint64_t space,
                      uint64_t h0, uint64_t n, uint64_t bs)
{
    uint64_t per = (16ull << 20) / bs;
    uint8_t *hs = malloc(per * HLEN);
    int64_t *targets = malloc(per * sizeof(*targets));
    const char *names[] = {"ALL_LAYERS"};
    for (uint64_t off = 0; off < n; off += per) {
        uint64_t m = n - off < per ? n - off : per;
        for (uint64_t i = 0; i < m; i++) {
            hash_of(space, h0 + off + i, hs + i * HLEN);
            targets[i] = (int64_t)i;
        }
        memset(pf_simkv_ptr(kv), 0, m * bs);
        struct pf_query_result r;
        if (pf_client_query(c, inst, "verify", hs, NULL, HLEN, m, 0, 0, &r, NULL, 0, TMO))
            die("verify query: %s", pf_last_error_message());
        if (r.loading || r.num_hit_blocks != m || !r.lease_len)
            die("verify: %u of %llu fetched blocks resident on B", r.num_hit_blocks,
                (unsigned long long)m);
        size_t gsz = 1, cnt = m;
        struct pf_load_item it = {
            .lease = r.lease, .lease_len = r.lease_len, .targets = targets, .group_counts = &cnt};
        struct pf_loadstate *ls;
        if (pf_loadstate_create(&ls))
            die("load state");
        if (pf_client_load(c, inst, 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1, TMO) ||
            pf_loadstate_wait(ls, TMO) != 1)
            die("verify load: %s", pf_last_error_message());
        pf_loadstate_destroy(ls);
        pf_client_release(c, r.lease, r.lease_len, TMO);
        const uint8_t *want = (const uint8_t *)pf_simkv_ptr(kv_a) + off * bs;
        for (uint64_t i = 0; i < m; i++)
            if (memcmp((const uint8_t *)pf_simkv_ptr(kv) + i * bs, want + i * bs, bs) != 0)
                die("block %llu of %llu KiB fetched by B differs from A's bytes",
                    (unsigned long long)(off + i), (unsigned long long)(bs >> 10));
    }
    free(hs);
    free(targets);
}

static void cleanup_node(struct proc *p)
{
    char *body = NULL;
    if (pft_http(np.ip[1], p->http_port, "POST", "/cache/memory/cleanup", &body) != 200)
        die("%s cleanup failed", p->tag);
    free(body);
}

static void cleanup_b(void)
{
    cleanup_node(&NB);
}

#include "p2p_miss.h"

/* One round on the requester with --integrity off: the same fetch (and concurrency) as B's,
 * its bytes compared with A's after; seconds of the fetch. Leaves its copies withdrawn. */
static double fetch_noverify(struct pf_client *cv, struct pf_simkv *kv, const char *iv, uint64_t bs,
                             uint64_t n, int k, const struct opts *o, double *cpu_p)
{
    char req[64];
    snprintf(req, sizeof(req), "nov-%llu-%d", (unsigned long long)bs, k);
    uint32_t hits = 0;
    double c0 = proc_cpu_s(NA.pid) + proc_cpu_s(NV.pid) + proc_cpu_s(0);
    double s = fetch_conc(cv, iv, req, bs, n, o->concurrent, &hits);
    *cpu_p += proc_cpu_s(NA.pid) + proc_cpu_s(NV.pid) + proc_cpu_s(0) - c0;
    if (hits != n)
        die("%s: %u of %llu blocks fetched", req, hits, (unsigned long long)n);
    verify_on(cv, kv, iv, bs, 0, n, bs);
    cleanup_node(&NV);
    wait_only_a(bs, 0, n);
    return s;
}

#define USAGE                                                                                      \
    "p2p [--size BYTES] [--blocks 256k,1m,4m] [--reps N] [--lat-reps N] [--qps N] "                \
    "[--integrity on|off] [--loopback] [--backend tcp|verbs] [--nics A,B] [--addrs A,B] "          \
    "[--json PATH] [--tls] [--concurrent 1..16] [--verify-row on|off] [--plan-timeout-ms "         \
    "1..10000] [--poll-us 0..100000]"

static void usage_exit(const char *why)
{
    fprintf(stderr, "%s\nusage: %s\n", why, USAGE);
    exit(2);
}

/* The option table (bench/benchutil.h), then the ranges and lists it does not check. */
static void parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.size = 1ull << 30,
                       .blocks = {256u << 10, 1u << 20, 4u << 20},
                       .nblocks = 3,
                       .reps = 3,
                       .lat_reps = 10,
                       .qps = 2,
                       .integrity = "on",
                       .backend = "tcp",
                       .nics = {"rxe0", "rxe1"},
                       .addrs = {"10.77.0.1", "10.77.0.2"},
                       .json = "p2p.json",
                       .concurrent = 1,
                       .verify_row = true,
                       .poll_us = 1000};
    const char *blocks = NULL, *nics = NULL, *addrs = NULL, *vrow = NULL;
    const struct bu_opt table[] = {
        {"--size", BU_SIZE, &o->size},
        {"--blocks", BU_STR, &blocks},
        {"--reps", BU_INT, &o->reps},
        {"--lat-reps", BU_INT, &o->lat_reps},
        {"--qps", BU_INT, &o->qps},
        {"--integrity", BU_STR, &o->integrity},
        {"--loopback", BU_FLAG, &o->loopback},
        {"--backend", BU_STR, &o->backend},
        {"--nics", BU_STR, &nics},
        {"--addrs", BU_STR, &addrs},
        {"--json", BU_STR, &o->json},
        {"--tls", BU_FLAG, &o->tls},
        {"--concurrent", BU_INT, &o->concurrent},
        {"--verify-row", BU_STR, &vrow},
        {"--plan-timeout-ms", BU_STR, &o->plan_ms},
        {"--poll-us", BU_INT, &o->poll_us},
        {NULL, 0, NULL},
    };
    bu_parse_opts(argc, argv, table, USAGE);
    if (o->size == 0)
        usage_exit("--size: must be > 0");
    if (o->reps < 1 || o->reps > MAX_REPS)
        usage_exit("--reps: 1..32");
    if (o->lat_reps < 1 || o->lat_reps > 200)
        usage_exit("--lat-reps: 1..200");
    if (o->qps < 1 || o->qps > 64)
        usage_exit("--qps: 1..64");
    if (o->concurrent < 1 || o->concurrent > 16)
        usage_exit("--concurrent: 1..16");
    if (o->poll_us < 0 || o->poll_us > 100000)
        usage_exit("--poll-us: 0..100000");
    poll_us = (unsigned)o->poll_us;
    if (vrow && strcmp(vrow, "on") && strcmp(vrow, "off"))
        usage_exit("--verify-row: on or off");
    if (vrow)
        o->verify_row = !strcmp(vrow, "on");
    if (o->plan_ms) {
        char *end = NULL;
        long ms = strtol(o->plan_ms, &end, 10);
        if (!end || *end || end == o->plan_ms || ms < 1 || ms > 10000) /* the server's range */
            usage_exit("--plan-timeout-ms: 1..10000");
    }
    if (strcmp(o->backend, "tcp") && strcmp(o->backend, "verbs"))
        usage_exit("--backend: tcp or verbs");
    if (nics && sscanf(nics, "%63[^,],%63s", o->nics[0], o->nics[1]) != 2)
        usage_exit("--nics: A,B");
    if (addrs && sscanf(addrs, "%39[^,],%39s", o->addrs[0], o->addrs[1]) != 2)
        usage_exit("--addrs: A,B");
    if (blocks) {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", blocks);
        o->nblocks = 0;
        for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (o->nblocks == MAX_BLOCKS || pf_parse_size(t, &o->blocks[o->nblocks]) ||
                o->blocks[o->nblocks] < 4096 || o->blocks[o->nblocks] % 512)
                usage_exit("--blocks: up to 8 sizes, each >= 4k and a multiple of 512");
            o->nblocks++;
        }
        if (o->nblocks == 0)
            usage_exit("--blocks: at least one size");
    }
    /* the latency phase fetches a 16-block prefix of each size out of --size bytes */
    for (int i = 0; i < o->nblocks; i++)
        if (o->size < 16 * o->blocks[i])
            usage_exit("--size: at least 16 blocks of the largest --blocks size (the latency "
                       "phase fetches a 16-block prefix), e.g. 64m for 4m blocks");
}

/* ------------------------------------------------------------------ the phases */

struct result {
    uint64_t block;
    double p2p[MAX_REPS], raw[MAX_REPS], srv[MAX_REPS], nov[MAX_REPS];
    double p2p_med, raw_med, srv_med, nov_med;
    /* CPU seconds of every process doing the work (P2P: A, B and this client; raw: the
     * sender and this process's receiving streams), summed over the rounds */
    double p2p_cpu, raw_cpu;
    double cpu_a, cpu_b, cpu_client; /* p2p_cpu split by process */
    double nov_cpu;                  /* the --integrity off requester's fetches: A, it, client */
    double lat[200], lat_srv_ms, lat_p50, lat_p99;
};

/* What the phases share: the topology, the clients and their simulated KV memory. */
struct run {
    struct opts o;
    struct topo t;
    struct rv rawv; /* --backend verbs: the raw READ baseline */
    uint8_t *rawsrc;
    struct pf_client *cv; /* the --integrity off requester (verification row) */
    struct pf_simkv *kv_v;
    struct result res[MAX_BLOCKS];
    double health_p50_ms;
    struct miss_result miss;
};

/* This process joins B's namespace; the raw receive buffer, the verbs baseline, the
 * clients and the simulated KV memory (A's filled with seeded random bytes). */
static void connect_clients(struct run *R)
{
    const struct opts *o = &R->o;
    if (R->t.netns && pft_netns_enter(np.ns[1]))
        die("cannot enter %s", np.ns[1]);
    raw_dst = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw_dst == MAP_FAILED)
        die("mmap");
    madvise(raw_dst, o->size, MADV_HUGEPAGE); /* the same page advice as the servers' pools */
    memset(raw_dst, 0, o->size);
    if (R->t.verbs) { /* the baseline: READs between the same two devices, no server involved */
        R->rawsrc = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (R->rawsrc == MAP_FAILED)
            die("mmap");
        pft_fill(R->rawsrc, o->size, seed, 1);
        int e = rv_open(&R->rawv, R->t.nic_a, R->t.nic_b, R->rawsrc, raw_dst, o->size);
        if (e)
            die("raw verbs baseline on %s -> %s: %s", R->t.nic_a, R->t.nic_b, strerror(-e));
    }
    if (pf_client_connect(NA.addr, &ca) || pf_client_connect(NB.addr, &cb))
        die("connect");
    if (pf_simkv_create(o->size, 0, &kv_a) || pf_simkv_create(16ull << 20, 0, &kv_b))
        die("simkv");
    if (R->t.vrow &&
        (pf_client_connect(NV.addr, &R->cv) || pf_simkv_create(16ull << 20, 0, &R->kv_v)))
        die("connect / simkv of %s", NV.tag);
    pft_fill(pf_simkv_ptr(kv_a), o->size, seed, 1);
}

/* The raw TCP baseline of one round: seconds of the fastest of block-size calls, whole-buffer
 * calls and the raw_calls sizes (each distinct size once); *cpu_p the CPU seconds of that
 * variant (sender + receiver). */
static double raw_best(const struct opts *o, uint64_t bs, double *cpu_p)
{
    uint64_t chunk[2 + PF_ARRAY_SIZE(raw_calls)];
    int n = 0;
    chunk[n++] = bs;
    chunk[n++] = o->size;
    for (size_t k = 0; k < PF_ARRAY_SIZE(raw_calls); k++) {
        bool seen = false;
        for (int j = 0; j < n; j++)
            seen = seen || chunk[j] == raw_calls[k];
        if (!seen && raw_calls[k] < o->size)
            chunk[n++] = raw_calls[k];
    }
    double best = 0;
    for (int i = 0; i < n; i++) {
        double c0 = proc_cpu_s(raw_pid) + proc_cpu_s(0);
        double s = raw_round(o->size, chunk[i], o->qps);
        double c = proc_cpu_s(raw_pid) + proc_cpu_s(0) - c0;
        if (i == 0 || s < best) {
            best = s;
            *cpu_p = c;
        }
    }
    return best;
}

/* Throughput at one block size: A saves --size bytes, then --reps rounds, each a P2P fetch
 * on B ABBA with the raw baseline (and with the --integrity off requester), every fetched
 * byte compared after. */
static void throughput_block(struct run *R, struct result *r, uint64_t bs)
{
    const struct opts *o = &R->o;
    uint64_t n = o->size / bs;
    r->block = bs;
    char ia[64], ib[64], iv[64];
    snprintf(ia, sizeof(ia), "a-%llu", (unsigned long long)bs);
    snprintf(ib, sizeof(ib), "b-%llu", (unsigned long long)bs);
    snprintf(iv, sizeof(iv), "v-%llu", (unsigned long long)bs);
    reg(ca, ia, kv_a, n, bs);
    reg(cb, ib, kv_b, (16ull << 20) / bs, bs);
    if (R->t.vrow)
        reg(R->cv, iv, R->kv_v, (16ull << 20) / bs, bs);
    save(ia, bs, 0, 0, n);
    wait_advertised(bs, 0, n);
    for (int k = 0; k < o->reps; k++) {
        cleanup_b();
        if (R->t.vrow) {
            cleanup_node(&NV);
            wait_only_a(bs, 0, n);
            if (k % 2 == 1) /* ABBA with the verifying requester */
                r->nov[k] = (double)o->size /
                            fetch_noverify(R->cv, R->kv_v, iv, bs, n, k, o, &r->nov_cpu) / 1e9;
        }
        char req[64];
        snprintf(req, sizeof(req), "tput-%llu-%d", (unsigned long long)bs, k);
        double raw_s = 0, raw_c = 0;
        if (!R->t.verbs && k % 2 == 1) /* ABBA: odd rounds measure the raw streams first */
            raw_s = raw_best(o, bs, &raw_c);
        double ok0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_total{status=\"ok\"}");
        double d0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_sum");
        uint32_t hits = 0;
        double a0 = proc_cpu_s(NA.pid), b0 = proc_cpu_s(NB.pid), s0 = proc_cpu_s(0);
        double s = fetch_conc(cb, ib, req, bs, n, o->concurrent, &hits);
        r->cpu_a += proc_cpu_s(NA.pid) - a0;
        r->cpu_b += proc_cpu_s(NB.pid) - b0;
        r->cpu_client += proc_cpu_s(0) - s0;
        r->p2p_cpu = r->cpu_a + r->cpu_b + r->cpu_client;
        if (hits != n)
            die("%s: %u of %llu blocks fetched", req, hits, (unsigned long long)n);
        if (metric(&NB, np.ip[1], "pegaflow_rdma_fetch_total{status=\"ok\"}") !=
            ok0 + o->concurrent)
            die("%s: not %d successful remote fetch(es)", req, o->concurrent);
        r->p2p[k] = (double)o->size / s / 1e9;
        r->srv[k] = (double)o->size /
                    (metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_sum") - d0) / 1e9;
        if (R->t.verbs) {
            double v = rv_round(&R->rawv, o->size, bs);
            if (v <= 0)
                die("raw verbs READ loop failed");
            raw_s = v;
        } else if (k % 2 == 0) {
            raw_s = raw_best(o, bs, &raw_c);
        }
        r->raw[k] = (double)o->size / raw_s / 1e9;
        r->raw_cpu += raw_c;
        /* every round's fetched blocks, every byte (outside the timed part) */
        verify_on(cb, kv_b, ib, bs, 0, n, bs);
        if (R->t.vrow && k % 2 == 0) {
            cleanup_b();
            wait_only_a(bs, 0, n);
            r->nov[k] = (double)o->size /
                        fetch_noverify(R->cv, R->kv_v, iv, bs, n, k, o, &r->nov_cpu) / 1e9;
        }
    }
    r->p2p_med = bu_median(r->p2p, o->reps);
    r->raw_med = bu_median(r->raw, o->reps);
    r->srv_med = bu_median(r->srv, o->reps);
    r->nov_med = R->t.vrow ? bu_median(r->nov, o->reps) : 0;
    double gib = (double)o->size * o->reps / (double)(1u << 30);
    printf("%-6lluk %10.3f %10.3f %7.2f %10.3f %10.3f %7.2f %8.2f %8.2f %8.2f  ",
           (unsigned long long)(bs >> 10), r->p2p_med, r->raw_med, r->p2p_med / r->raw_med,
           r->srv_med, r->nov_med, R->t.vrow ? r->p2p_med / r->nov_med : 0.0, r->p2p_cpu / gib,
           r->raw_cpu / gib, r->nov_cpu / gib);
    for (int k = 0; k < o->reps; k++)
        printf(" %.3f", r->p2p[k]);
    printf("\n");
    fflush(stdout);
}

static void throughput_phase(struct run *R)
{
    const struct opts *o = &R->o;
    printf("\n%d concurrent fetch(es) from A%s\n", o->concurrent,
           R->t.vrow ? "; no-verify = the same fetches on a requester with --integrity off" : "");
    printf("%-8s %10s %10s %7s %10s %10s %7s %8s %8s %8s   %s\n", "block", "p2p GB/s", "raw GB/s",
           "ratio", "fetch GB/s", "no-verify", "on/off", "p2p CPU", "raw CPU", "nov CPU",
           "p2p runs (GB/s)");
    for (int bi = 0; bi < o->nblocks; bi++)
        throughput_block(R, &R->res[bi], o->blocks[bi]);
    if (metric_or(&NB, np.ip[1], "pegaflow_integrity_failures_total{tier=\"remote\"}", -1) != 0)
        die("integrity failures during the benchmark (or the series is missing)");
    if (R->t.verbs)
        printf("method: %d rounds per block size, ABBA with a raw verbs READ loop between the same "
               "two devices; p2p = B's QueryPrefetch Loading -> Ready (discovery, lock, READs, "
               "every slot's checksum verified, sealed); medians\n",
               o->reps);
    else
        printf("method: %d rounds per block size, ABBA with raw TCP: %d parallel streams over the "
               "same veth pair, same huge-page advice, the fastest of block-size, 256 KiB, 1 MiB, "
               "4 MiB and single calls; p2p = B's QueryPrefetch Loading -> Ready (discovery, lock, "
               "READs, "
               "every slot's checksum verified with --integrity on, sealed); every fetched block "
               "counted, and after every round loaded on the requester and compared byte for byte "
               "with A's; medians; CPU = CPU (run-time) seconds per GiB moved, summed over the "
               "rounds: P2P of A, B and this client during the fetches, raw of the sender and "
               "the receiving streams in the fastest variant, nov of A, the no-verify "
               "requester and this client\n",
               o->reps, o->qps);
}

/* A 16-block prefix, --lat-reps times per block size, next to an empty Health round trip. */
static void latency_phase(struct run *R)
{
    const struct opts *o = &R->o;
    double health[50];
    for (int i = 0; i < 50; i++) {
        double t0 = bu_now();
        pf_client_health(cb, TMO);
        health[i] = (bu_now() - t0) * 1e3;
    }
    R->health_p50_ms = bu_median(health, 50);
    printf("\n16-block prefix fetch latency (%d runs each; Health RPC round trip p50 %.3f ms)\n",
           o->lat_reps, R->health_p50_ms);
    printf("%-8s %10s %10s %14s\n", "block", "p50 ms", "p99 ms", "server mean ms");
    for (int bi = 0; bi < o->nblocks; bi++) {
        struct result *r = &R->res[bi];
        uint64_t bs = r->block;
        char ia[64], ib[64];
        snprintf(ia, sizeof(ia), "a-%llu", (unsigned long long)bs);
        snprintf(ib, sizeof(ib), "b-%llu", (unsigned long long)bs);
        double s0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_sum");
        double c0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_count");
        for (int k = 0; k < o->lat_reps; k++) {
            uint64_t h0 = 1000000 + (uint64_t)k * 16;
            save(ia, bs, h0, 0, 16);
            wait_advertised(bs, h0, 16);
            char req[64];
            snprintf(req, sizeof(req), "lat-%llu-%d", (unsigned long long)bs, k);
            uint32_t hits = 0;
            r->lat[k] = fetch_on_b(ib, req, bs, h0, 16, &hits) * 1e3;
            if (hits != 16)
                die("%s: %u of 16 blocks", req, hits);
        }
        double s1 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_sum");
        double c1 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_count");
        r->lat_p50 = bu_median(r->lat, o->lat_reps);
        r->lat_p99 = bu_pct(r->lat, (size_t)o->lat_reps, 0.99);
        r->lat_srv_ms = c1 > c0 ? (s1 - s0) / (c1 - c0) * 1e3 : 0;
        printf("%-6lluk %10.3f %10.3f %14.3f\n", (unsigned long long)(bs >> 10), r->lat_p50,
               r->lat_p99, r->lat_srv_ms);
    }
}

/* The JSON result (bench/report.py and bench/curves.py read these keys). */
static void write_json(const struct run *R)
{
    const struct opts *o = &R->o;
    cJSON *root = bu_json_obj(NULL, NULL);
    bu_json_bool(root, "tls", o->tls);
    bu_json_num(root, "concurrent", o->concurrent);
    bu_json_bool(root, "verify_row", R->t.vrow);
    bu_json_str(root, "topology", R->t.verbs ? "verbs" : R->t.netns ? "netns-veth" : "loopback");
    bu_json_num(root, "size", (double)o->size);
    bu_json_num(root, "qps_per_peer", o->qps);
    bu_json_num(root, "poll_us", o->poll_us);
    bu_json_num(root, "seed", (double)seed);
    bu_json_num(root, "health_rtt_p50_ms", R->health_p50_ms);
    cJSON *tp = bu_json_check(cJSON_AddArrayToObject(root, "throughput"));
    cJSON *lat = NULL;
    for (int bi = 0; bi < o->nblocks; bi++) {
        const struct result *r = &R->res[bi];
        cJSON *e = bu_json_obj(NULL, NULL);
        cJSON_AddItemToArray(tp, e);
        bu_json_num(e, "block", (double)r->block);
        bu_json_num(e, "p2p_gbps", r->p2p_med);
        bu_json_num(e, "raw_gbps", r->raw_med);
        bu_json_num(e, "ratio", r->p2p_med / r->raw_med);
        bu_json_num(e, "fetch_gbps", r->srv_med);
        bu_json_nums(e, "p2p_runs", r->p2p, o->reps);
        bu_json_nums(e, "raw_runs", r->raw, o->reps);
        double gib = (double)o->size * o->reps / (double)(1u << 30);
        bu_json_num(e, "p2p_cpu_s_per_gib", r->p2p_cpu / gib);
        bu_json_num(e, "raw_cpu_s_per_gib", r->raw_cpu / gib);
        bu_json_num(e, "p2p_cpu_holder_s_per_gib", r->cpu_a / gib);
        bu_json_num(e, "p2p_cpu_requester_s_per_gib", r->cpu_b / gib);
        bu_json_num(e, "p2p_cpu_client_s_per_gib", r->cpu_client / gib);
        if (R->t.vrow) {
            bu_json_num(e, "p2p_noverify_gbps", r->nov_med);
            bu_json_num(e, "verify_ratio", r->p2p_med / r->nov_med);
            bu_json_nums(e, "noverify_runs", r->nov, o->reps);
            bu_json_num(e, "p2p_noverify_cpu_s_per_gib",
                        r->nov_cpu / ((double)o->size * o->reps / (double)(1u << 30)));
        }
    }
    lat = bu_json_check(cJSON_AddArrayToObject(root, "latency_16_blocks"));
    for (int bi = 0; bi < o->nblocks; bi++) {
        const struct result *r = &R->res[bi];
        cJSON *e = bu_json_obj(NULL, NULL);
        cJSON_AddItemToArray(lat, e);
        bu_json_num(e, "block", (double)r->block);
        bu_json_num(e, "p50_ms", r->lat_p50);
        bu_json_num(e, "p99_ms", r->lat_p99);
        bu_json_num(e, "server_mean_ms", r->lat_srv_ms);
        bu_json_nums(e, "runs_ms", r->lat, o->lat_reps);
    }
    cJSON *m = bu_json_obj(root, "pure_miss");
    bu_json_num(m, "hashes", MISS_HASHES);
    bu_json_num(m, "runs", R->miss.reps);
    bu_json_num(m, "p2p_p50_us", R->miss.p2p_p50_us);
    bu_json_num(m, "p2p_p99_us", R->miss.p2p_p99_us);
    bu_json_num(m, "plain_p50_us", R->miss.plain_p50_us);
    bu_json_num(m, "plain_p99_us", R->miss.plain_p99_us);
    bu_json_num(m, "ratio", R->miss.p2p_p50_us / R->miss.plain_p50_us);
    bu_json_write(root, o->json);
    printf("\nJSON: %s\n", o->json);
}

static void teardown(struct run *R)
{
    pf_client_close(ca);
    pf_client_close(cb);
    if (R->cv)
        pf_client_close(R->cv);
    if (R->kv_v)
        pf_simkv_destroy(R->kv_v);
    pf_simkv_destroy(kv_a);
    pf_simkv_destroy(kv_b);
    kill_all();
    if (R->t.verbs)
        rv_close(&R->rawv);
}

int main(int argc, char **argv)
{
    static struct run R;
    parse_opts(argc, argv, &R.o);
    setup(&R.o, &R.t);
    start_raw_sender(&R.o);
    start_nodes(&R.o, &R.t);
    connect_clients(&R);
    throughput_phase(&R);
    latency_phase(&R);
    pure_miss_bench(&R.miss);
    write_json(&R);
    teardown(&R);
    return 0;
}

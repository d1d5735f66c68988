/* P2P end-to-end scenarios with real processes: a MetaServer and pegaflow-server nodes (sim
 * GPU, TCP fabric), each node in its own network namespace when p2p_netns.sh could create
 * them (else on 127.0.0.x), driven through libpegaflow as vLLM would. Every scenario starts
 * fresh processes, fills the holder's sim KV caches with seeded random bytes and compares
 * every byte a requester loads.
 *
 *   basic      A saves; B: QueryPrefetch -> Loading -> Ready, load, byte-exact; metrics and
 *              debug logs (registration, handshake, fetch); the blocks are then RAM hits on
 *              B; a suffix nobody has ends Ready with the prefix; the reverse direction
 *              reuses the connection (no second handshake); wait_for_full_prefix waits for
 *              blocks A saves later
 *   mutual     A and B fetch from each other at the same moment (simultaneous handshakes)
 *   three      B and C fetch the same blocks from A at once
 *   metaserver issue 4 with real servers: A's blocks listed with A's address; A silent
 *              (SIGSTOP) -> hidden after the stale period, back after SIGCONT; MetaServer
 *              killed: saves and queries still answer, no remote discovery, no error;
 *              restarted: A's blocks discoverable again without a new save, B fetches them
 *   kill       A killed (SIGKILL) while B's fetch is in flight: a full miss on B, no hang
 *   timeout    READs delayed beyond the deadline: B times out, invalidates, force-releases
 *              the lock (A's lock count back to 0), logs an error, full miss
 *   expire     B killed mid-transfer: A's transfer lock expires (timeouts_total)
 *   corrupt    a READ corrupted in flight: the checksum catches it, the run before it loads
 *              byte-exact, integrity_failures_total{tier="remote"} counts it
 *   evict      A evicts part of the blocks between B's discovery and B's fetch: B gets the
 *              blocks A still has, byte-exact
 *   auth       (needs PF_P2P_SECURITY_DIR, see test_auth.sh) with mutual TLS, a cluster
 *              token and an admin token everywhere: a P2P fetch byte-exact; then wrong
 *              certificate, no certificate, plaintext, no token and wrong token are refused
 *              by the MetaServer and a node; worker RPCs from another host need the token,
 *              the Unix socket listener serves them without; RdmaHandshake with a spoofed
 *              requester_id or an endpoint naming another host is refused; HTTP POST needs
 *              the admin token, GET /health and /metrics do not; a node with the wrong
 *              cluster token gets no MetaServer session
 *   layouts    issue 15: MLA page-first replicas (striped saves), layer-split shards and a
 *              hybrid model (attention prefix + recurrent want-set) fetched by B from A,
 *              byte-exact on every device; A has an SSD tier (padded host segments), B none
 *   redis      issue 14: two MetaServer replicas on one redis-server (--store redis://) in
 *              the MetaServer's namespace, nodes list both; A saves, B fetches byte-exact;
 *              replica 1 killed (SIGKILL): B discovers and fetches new blocks through
 *              replica 2; Redis killed: saves and queries answer, no discovery; Redis back
 *              (empty): A re-registers by itself and B fetches again
 *
 * Security (PF_P2P_SECURITY_DIR=DIR, made by certs.sh): every process is started with
 * DIR/<tag>.crt/.key, DIR/ca.crt and DIR/token (servers also DIR/admin-token); this
 * client takes its credentials from PEGAFLOW_TLS_CA/CERT/KEY and PEGAFLOW_TOKEN_FILE.
 *
 * Topology from the environment (p2p_netns.sh): PF_P2P_NS_{MS,A,B,C} network namespaces
 * (empty: none), PF_P2P_IP_{MS,A,B,C} addresses, PF_P2P_NIC_{A,B,C} --nics values.
 * Usage: p2p_e2e <scenario>... (default: all). Seed: PF_TEST_SEED. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <linux/io_uring.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "client/pegaflow.h"
#include "../../sim/net/tcpnet_wire.h"
#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/rpc.h"
#include "pftest.h"
#include "world.h"
#include "layouts.h"

#define TMO  10000
#define NSTR "ns-p2p"

static const char *net_backend = "tcp";

/* ------------------------------------------------------------------ processes */

struct node {
    const char *tag;
    char ns[64], ip[40], nic[64];
    char sock[300]; /* its --local-addr (with PF_P2P_SECURITY_DIR) */
    struct pft_proc p;
};

static struct node MS = {.tag = "ms"}, NA = {.tag = "a"}, NB = {.tag = "b"}, NC = {.tag = "c"};
static struct node MS2 = {.tag = "ms2"}, RD = {.tag = "redis"};
static struct node *all_nodes[] = {&MS, &NA, &NB, &NC, &MS2, &RD};
static char meta_addrs[256]; /* --metaserver-addr of the nodes when set (else MS's) */

static void kill_all(void)
{
    for (size_t i = 0; i < PF_ARRAY_SIZE(all_nodes); i++)
        if (all_nodes[i]->p.pid > 0) {
            kill(all_nodes[i]->p.pid, SIGKILL);
            waitpid(all_nodes[i]->p.pid, NULL, 0);
            all_nodes[i]->p.pid = 0;
        }
}

static void env_node(struct node *n, const char *up)
{
    char k[64];
    const char *v;
    snprintf(k, sizeof(k), "PF_P2P_NS_%s", up);
    v = getenv(k);
    snprintf(n->ns, sizeof(n->ns), "%s", v ? v : "");
    snprintf(k, sizeof(k), "PF_P2P_IP_%s", up);
    v = getenv(k);
    PFT_CHECK(v && *v, "%s is not set (run through p2p_netns.sh)", k);
    snprintf(n->ip, sizeof(n->ip), "%s", v);
    snprintf(k, sizeof(k), "PF_P2P_NIC_%s", up);
    v = getenv(k);
    snprintf(n->nic, sizeof(n->nic), "%s", v ? v : n->ip);
}

static const char *sec_dir;        /* PF_P2P_SECURITY_DIR */
static const char *token_override; /* cluster token file of the next spawn (auth scenario) */

/* Starts bin in the node's namespace with args (NULL-terminated, --addr/--http-addr added on
 * port gport/0 of the node's IP; the security flags with PF_P2P_SECURITY_DIR) and waits for
 * its "ready" line. */
static void spawn(struct node *n, const char *bin, int gport, const char *const *args)
{
    char sec[6][600];
    static int seq;
    const char *dir = getenv("PF_BIN"), *logdir = getenv("PF_TEST_LOGDIR");
    char path[512], addr[96], haddr[96];
    snprintf(path, sizeof(path), "%s/%s", dir ? dir : "build/rel/bin", bin);
    snprintf(addr, sizeof(addr), "%s:%d", n->ip, gport);
    snprintf(haddr, sizeof(haddr), "%s:0", n->ip);
    memset(&n->p, 0, sizeof(n->p));
    snprintf(n->p.log, sizeof(n->p.log), "%s/%s-%d.log", logdir ? logdir : "/tmp", n->tag, seq++);
    const char *argv[64];
    size_t k = 0;
    if (n->ns[0]) {
        argv[k++] = "ip";
        argv[k++] = "netns";
        argv[k++] = "exec";
        argv[k++] = n->ns;
    }
    argv[k++] = path;
    argv[k++] = "--addr";
    argv[k++] = addr;
    argv[k++] = "--http-addr";
    argv[k++] = haddr;
    if (sec_dir) {
        snprintf(sec[0], sizeof(sec[0]), "--tls-cert=%s/%s.crt", sec_dir, n->tag);
        snprintf(sec[1], sizeof(sec[1]), "--tls-key=%s/%s.key", sec_dir, n->tag);
        snprintf(sec[2], sizeof(sec[2]), "--tls-ca=%s/ca.crt", sec_dir);
        snprintf(sec[3], sizeof(sec[3]), "--cluster-token-file=%s",
                 token_override ? token_override : "");
        if (!token_override)
            snprintf(sec[3], sizeof(sec[3]), "--cluster-token-file=%s/token", sec_dir);
        snprintf(sec[4], sizeof(sec[4]), "--admin-token-file=%s/admin-token", sec_dir);
        snprintf(n->sock, sizeof(n->sock), "unix:%s/%s-%d.sock", logdir ? logdir : "/tmp", n->tag,
                 seq);
        snprintf(sec[5], sizeof(sec[5]), "--local-addr=%s", n->sock);
        bool server = strcmp(bin, "pegaflow-server") == 0;
        for (int i = 0; i < (server ? 6 : 4); i++)
            argv[k++] = sec[i];
    }
    for (size_t i = 0; args && args[i] && k < 62; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    pid_t pid = fork();
    PFT_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        FILE *f = freopen(n->p.log, "w", stdout);
        if (f)
            dup2(fileno(stdout), 2);
        if (n->ns[0])
            execvp("ip", (char *const *)argv);
        else
            execv(path, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    n->p.pid = pid;
    snprintf(n->p.http_host, sizeof(n->p.http_host), "%s", n->ip);
    uint64_t dl = pft_now_ms() + 30000;
    for (;;) {
        char *log = pft_read_file(n->p.log);
        if (log) {
            n->p.grpc_port = pft_port_after(log, "gRPC listening on");
            n->p.http_port = pft_port_after(log, "HTTP listening on");
            bool ready = strstr(log, ": ready\n") != NULL;
            free(log);
            if (ready && n->p.grpc_port && n->p.http_port)
                break;
        }
        int st;
        bool dead = waitpid(pid, &st, WNOHANG) == pid;
        if (dead || pft_now_ms() >= dl) {
            char *l = pft_read_file(n->p.log);
            fprintf(stderr, "%s did not start; log:\n%s\n", n->tag, l ? l : "");
            free(l);
            if (dead)
                n->p.pid = 0;
            PFT_CHECK(false, "%s (%s) did not start", n->tag, bin);
        }
        usleep(20000);
    }
    snprintf(n->p.addr, sizeof(n->p.addr), "%s:%d", n->ip, n->p.grpc_port);
    fprintf(stderr, "  %s: %s on %s (http %d)%s%s\n", n->tag, bin, n->p.addr, n->p.http_port,
            n->ns[0] ? " in netns " : "", n->ns);
}

static void start_ms(int port, const char *stale)
{
    const char *args[] = {"--node-stale-secs", stale, "--log-level", "debug", NULL};
    spawn(&MS, "pegaflow-metaserver", port, args);
}

/* extra: more flags (NULL-terminated), e.g. the fault spec */
static void start_node(struct node *n, const char *const *extra)
{
    char meta[256];
    if (meta_addrs[0])
        snprintf(meta, sizeof(meta), "%s", meta_addrs);
    else
        snprintf(meta, sizeof(meta), "http://%s", MS.p.addr);
    const char *args[48] = {"--gpu-backend", "sim",   "--sim-gpus",        "2",
                            "--nics",        n->nic,  "--net-backend",     net_backend,
                            "--log-level",   "debug", "--metaserver-addr", meta};
    size_t k = 12;
    bool pool = false;
    for (size_t i = 0; extra && extra[i] && k < 44; i++) {
        pool |= strcmp(extra[i], "--pool-size") == 0;
        args[k++] = extra[i];
    }
    if (!pool) {
        args[k++] = "--pool-size";
        args[k++] = "64mb";
    }
    args[k] = NULL;
    spawn(n, "pegaflow-server", 0, args);
    /* fetching needs the node's own MetaServer session (no discovery without it) */
    PFT_CHECK(pft_wait_log(&n->p, "MetaServer session established", 20000),
              "%s: no MetaServer session", n->tag);
}

static void stop(struct node *n, int sig)
{
    if (n->p.pid <= 0)
        return;
    int rc = pft_stop(&n->p, sig, 20000);
    if (sig == SIGTERM || sig == SIGINT)
        PFT_CHECK(rc == 0, "%s exited with %d after SIG%s", n->tag, rc,
                  sig == SIGTERM ? "TERM" : "INT");
    n->p.pid = 0;
}

/* A series of n's /metrics; 0 while it has not been exposed yet. */
static double node_metric(struct node *n, const char *name)
{
    return metric_or(&n->p, name, 0);
}

static void wait_metric(struct node *n, const char *name, double want, bool at_least,
                        uint64_t timeout_ms)
{
    uint64_t dl = pft_now_ms() + timeout_ms;
    double v;
    for (;;) {
        v = node_metric(n, name);
        if (at_least ? v >= want : v == want)
            return;
        PFT_CHECK(pft_now_ms() < dl, "%s: %s = %g after %llu ms, want %s%g", n->tag, name, v,
                  (unsigned long long)timeout_ms, at_least ? ">= " : "", want);
        usleep(20000);
    }
}

static int log_count(struct node *n, const char *s)
{
    char *l = pft_read_file(n->p.log);
    int c = 0;
    for (char *p = l; p && (p = strstr(p, s)); p++)
        c++;
    free(l);
    return c;
}

static void wait_log(struct node *n, const char *s, uint64_t timeout_ms)
{
    PFT_CHECK(pft_wait_log(&n->p, s, timeout_ms), "%s never logged '%s' (log %s)", n->tag, s,
              n->p.log);
}

/* ------------------------------------------------------------------ KV worlds */

/* Worlds come from world.h: split K/V layout, this test's namespace, a tag per source world. */
static void pworld(struct world *w, const char *id, int tp, int nlayers, uint64_t nblocks,
                   uint64_t seg, uint64_t tag, bool fill)
{
    world_init_tagged(w, id, NSTR, tp, nlayers, KV_SPLIT, nblocks, seg, tag, fill);
}

/* Queries until Ready (deadline timeout_ms); *loading_p counts Loading answers. Every
 * QueryPrefetch itself must answer within its RPC deadline (TMO). */
static struct pf_query_result query_until_ready(struct pf_client *c, const char *inst,
                                                const char *req, uint64_t h0, size_t n,
                                                int wait_full, uint64_t timeout_ms, int *loading_p)
{
    struct pf_query_result res;
    uint64_t dl = pft_now_ms() + timeout_ms;
    int loading = 0;
    for (;;) {
        uint64_t t0 = pft_now_ms();
        int rc = query_wf(c, inst, req, h0, n, wait_full, &res);
        PFT_CHECK(rc == 0, "query %s/%s: %s", inst, req, pf_last_error_message());
        PFT_CHECK(pft_now_ms() - t0 < TMO, "QueryPrefetch took %llu ms",
                  (unsigned long long)(pft_now_ms() - t0));
        if (!res.loading)
            break;
        loading++;
        PFT_CHECK(pft_now_ms() < dl, "query %s/%s still Loading after %llu ms", inst, req,
                  (unsigned long long)timeout_ms);
        usleep(5000);
    }
    if (loading_p)
        *loading_p = loading;
    return res;
}

/* Query on the requester until Ready, check the hit count, load and compare every byte. */
static uint32_t fetch_check(struct pf_client *c, struct world *dst, const char *req, uint64_t h0,
                            size_t n, int wait_full, struct world *src, uint32_t src_first,
                            uint32_t dst_first, long want_hits, uint64_t timeout_ms)
{
    int loading = 0;
    struct pf_query_result res =
        query_until_ready(c, dst->id, req, h0, n, wait_full, timeout_ms, &loading);
    if (want_hits >= 0)
        PFT_CHECK(res.num_hit_blocks == (uint32_t)want_hits, "%s: %u hits, want %ld", req,
                  res.num_hit_blocks, want_hits);
    if (res.num_hit_blocks) {
        PFT_CHECK(res.lease_len == PF_LEASE_LEN, "%s: hits without a lease", req);
        world_load_ok(c, dst, res.lease, res.num_hit_blocks, dst_first);
        compare(src, src_first, dst, dst_first, res.num_hit_blocks);
    }
    fprintf(stderr, "    %s: %u of %zu block(s) after %d Loading answer(s)%s\n", req,
            res.num_hit_blocks, n, loading, res.num_hit_blocks ? ", byte-exact" : "");
    return res.num_hit_blocks;
}

static struct pf_client *connect_to(struct node *n)
{
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(n->p.addr, &c) == 0, "connect %s", n->p.addr);
    return c;
}

/* MetaServer QueryPrefixBlocks: prefix_len of node addr for hashes [h0, h0+n), 0 if absent. */
static long meta_prefix_ns(const char *ns, const char *node_addr, uint64_t h0, size_t n)
{
    struct pf_rpc_channel *ch;
    PFT_CHECK(pf_rpc_channel_open(MS.p.addr, &ch) == 0, "channel");
    uint8_t *hs = malloc(n * HLEN);
    ProtobufCBinaryData *b = malloc(n * sizeof(*b));
    for (size_t i = 0; i < n; i++) {
        hash_of(h0 + i, hs + i * HLEN);
        b[i] = (ProtobufCBinaryData){HLEN, hs + i * HLEN};
    }
    Pegaflow__QueryPrefixBlocksRequest req = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    req.namespace_ = (char *)ns;
    req.n_block_hashes = n;
    req.block_hashes = b;
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st;
    long v = -1;
    if (pf_rpc_unary(ch, "/pegaflow.MetaServer/QueryPrefixBlocks", &req.base,
                     &pegaflow__query_prefix_blocks_response__descriptor, 3000, &resp, &st) == 0) {
        const Pegaflow__QueryPrefixBlocksResponse *r = (const void *)resp;
        v = 0;
        for (size_t i = 0; i < r->n_nodes; i++)
            if (strcmp(r->nodes[i]->node, node_addr) == 0)
                v = (long)r->nodes[i]->prefix_len;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    free(hs);
    free(b);
    pf_rpc_channel_close(ch);
    return v;
}

static void wait_meta_ns(const char *ns, const char *node_addr, uint64_t h0, size_t n, long want,
                         uint64_t tmo)
{
    uint64_t dl = pft_now_ms() + tmo;
    long v;
    while ((v = meta_prefix_ns(ns, node_addr, h0, n)) != want) {
        PFT_CHECK(pft_now_ms() < dl, "MetaServer lists %s with prefix %ld, want %ld", node_addr, v,
                  want);
        usleep(20000);
    }
}

static void wait_meta(const char *node_addr, uint64_t h0, size_t n, long want, uint64_t tmo)
{
    wait_meta_ns(NSTR, node_addr, h0, n, want, tmo);
}

static void sync_pair_start(void)
{
    start_ms(0, "30");
    start_node(&NA, NULL);
    start_node(&NB, NULL);
}

static void stop_all(void)
{
    stop(&NB, SIGTERM);
    stop(&NC, SIGTERM);
    stop(&NA, SIGTERM);
    stop(&MS, SIGTERM);
}

#define SEG 16384 /* bytes per segment: a block is tp * layers * 2 * SEG */

/* ------------------------------------------------------------------ scenarios */

static void sc_basic(void)
{
    sync_pair_start();
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 24;
    pworld(&wa, "inst-A", 2, 2, 128, SEG, 1, true);
    pworld(&wb, "inst-B", 2, 2, 128, SEG, 2, true);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 0, 0, N);
    wait_meta(NA.p.addr, 0, N, (long)N, 20000);
    fprintf(stderr, "    MetaServer lists %s with all %zu blocks\n", NA.p.addr, N);

    int loading = 0;
    struct pf_query_result r = query_until_ready(cb, wb.id, "req-1", 0, N, 0, 30000, &loading);
    PFT_CHECK(loading >= 1, "the first query must answer Loading while the fetch runs");
    PFT_CHECK(r.num_hit_blocks == N, "req-1: %u hits, want %zu", r.num_hit_blocks, N);
    world_load_ok(cb, &wb, r.lease, N, 32);
    compare(&wa, 0, &wb, 32, N);
    fprintf(stderr, "    req-1: Loading x%d -> Ready %zu, byte-exact\n", loading, N);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}") == 1, "fetch ok != 1");
    double bytes = node_metric(&NB, "pegaflow_rdma_fetch_bytes_total");
    PFT_CHECK(bytes == (double)N * 2 * 2 * 2 * SEG, "fetch bytes %g", bytes);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_qps") == 2, "B: rdma_qps != 2");
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_duration_seconds_count") == 1,
              "duration count");
    wait_metric(&NA, "pegaflow_transfer_lock_active", 0, false, 10000);
    wait_metric(&NA, "pegaflow_rpc_requests_total{method=\"release_transfer_lock\",status=\"ok\"}",
                1, false, 10000);
    /* --log-level debug shows registration, handshake and fetch */
    PFT_CHECK(pft_log_contains(&NA.p, "memory registration: pool region"), "A: registration log");
    PFT_CHECK(pft_log_contains(&NB.p, "RDMA handshake with"), "B: handshake log");
    PFT_CHECK(pft_log_contains(&NA.p, "RDMA handshake from"), "A: handshake log");
    PFT_CHECK(pft_log_contains(&NB.p, "RDMA fetch req req-1"), "B: fetch log");
    PFT_CHECK(pft_log_contains(&NA.p, "MetaServer registration"), "A: MetaServer registration");
    char topo[96];
    snprintf(topo, sizeof(topo), "topology: 1 NIC(s) on backend %s", net_backend);
    PFT_CHECK(pft_log_contains(&NB.p, topo), "B: topology log '%s'", topo);

    /* every metric family a P2P node exposes is documented */
    {
        char path[512], *body = NULL;
        const char *top = getenv("PF_TOP");
        snprintf(path, sizeof(path), "%s/docs/metrics.md", top ? top : ".");
        char *doc = pft_read_file(path);
        PFT_CHECK(doc, "cannot read %s", path);
        PFT_CHECK(pft_http(NB.p.http_host, NB.p.http_port, "GET", "/metrics", &body) == 200,
                  "metrics");
        int families = 0;
        for (char *l = strstr(body, "# TYPE "); l; l = strstr(l + 1, "# TYPE ")) {
            char name[128], quoted[140];
            if (sscanf(l, "# TYPE %127s", name) != 1)
                continue;
            snprintf(quoted, sizeof(quoted), "`%s`", name);
            PFT_CHECK(strstr(doc, quoted), "metric %s is not documented in docs/metrics.md", name);
            families++;
        }
        fprintf(stderr, "    all %d metric families of B are documented\n", families);
        free(body);
        free(doc);
    }

    /* now RAM hits on B (promoted, reclaimable), no second fetch */
    fetch_check(cb, &wb, "req-2", 0, N, 0, &wa, 0, 64, (long)N, 10000);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}") == 1, "refetched");
    PFT_CHECK(node_metric(&NB, "pegaflow_cache_resident_blocks{class=\"reclaimable\"}") == N,
              "fetched blocks must be reclaimable on B");
    /* B re-advertises what it fetched */
    wait_meta(NB.p.addr, 0, N, (long)N, 20000);
    /* a suffix nobody has: Ready with the RAM prefix */
    fetch_check(cb, &wb, "req-3", 0, N + 8, 0, &wa, 0, 88, (long)N, 10000);

    /* the other direction reuses the connection A opened to B: no handshake by B->A */
    world_save_ok(cb, &wb, 1000, 112, 8);
    wait_meta(NB.p.addr, 1000, 8, 8, 20000);
    fetch_check(ca, &wa, "req-rev", 1000, 8, 0, &wb, 112, 32, 8, 30000);
    PFT_CHECK(!pft_log_contains(&NA.p, "RDMA handshake with"),
              "A handshook although B's connection exists");
    PFT_CHECK(node_metric(&NA, "pegaflow_rdma_fetch_total{status=\"ok\"}") == 1, "A fetch ok");

    /* wait_for_full_prefix: Loading until some node advertises the whole suffix */
    struct pf_query_result w;
    PFT_CHECK(query_wf(cb, wb.id, "req-full", 2000, 6, 1, &w) == 0 && w.loading,
              "wait_for_full_prefix must answer Loading");
    usleep(200000); /* nothing advertised yet: still Loading (not a timing assertion) */
    PFT_CHECK(query_wf(cb, wb.id, "req-full", 2000, 6, 1, &w) == 0 && w.loading,
              "still Loading while nobody holds the suffix");
    world_save_ok(ca, &wa, 2000, 40, 6);
    fetch_check(cb, &wb, "req-full", 2000, 6, 1, &wa, 40, 120, 6, 30000);

    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    PFT_CHECK(pft_log_contains(&NB.p, "stopped"), "B did not stop cleanly");
    world_free(&wa);
    world_free(&wb);
}

struct fetch_arg {
    struct pf_client *c;
    struct world *dst, *src;
    const char *req;
    uint64_t h0;
    size_t n;
    pthread_barrier_t *bar;
    uint32_t hits;
};

static void *fetch_thread(void *p)
{
    struct fetch_arg *a = p;
    pthread_barrier_wait(a->bar);
    a->hits = fetch_check(a->c, a->dst, a->req, a->h0, a->n, 0, a->src, 0, 0, -1, 60000);
    return NULL;
}

static void sc_mutual(void)
{
    sync_pair_start();
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb, ra, rb;
    const size_t N = 16;
    pworld(&wa, "inst-A", 1, 2, 32, SEG, 3, true);
    pworld(&wb, "inst-B", 1, 2, 32, SEG, 4, true);
    pworld(&ra, "inst-A2", 1, 2, 32, SEG, 0, false);
    pworld(&rb, "inst-B2", 1, 2, 32, SEG, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_register(ca, &ra);
    world_register(cb, &rb);
    world_save_ok(ca, &wa, 100, 0, N);
    world_save_ok(cb, &wb, 200, 0, N);
    wait_meta(NA.p.addr, 100, N, (long)N, 20000);
    wait_meta(NB.p.addr, 200, N, (long)N, 20000);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    struct fetch_arg x = {ca, &ra, &wb, "mutual-A", 200, N, &bar, 0};
    struct fetch_arg y = {cb, &rb, &wa, "mutual-B", 100, N, &bar, 0};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, fetch_thread, &x);
    pthread_create(&t2, NULL, fetch_thread, &y);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    PFT_CHECK(x.hits == N && y.hits == N, "mutual fetch: %u and %u of %zu", x.hits, y.hits, N);
    /* both connections work afterwards, in both directions */
    world_save_ok(ca, &wa, 300, 16, 4);
    world_save_ok(cb, &wb, 400, 16, 4);
    wait_meta(NA.p.addr, 300, 4, 4, 20000);
    wait_meta(NB.p.addr, 400, 4, 4, 20000);
    fetch_check(cb, &rb, "mutual-B2", 300, 4, 0, &wa, 16, 20, 4, 30000);
    fetch_check(ca, &ra, "mutual-A2", 400, 4, 0, &wb, 16, 20, 4, 30000);
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    pthread_barrier_destroy(&bar);
    world_free(&wa);
    world_free(&wb);
    world_free(&ra);
    world_free(&rb);
}

static void sc_three(void)
{
    sync_pair_start();
    start_node(&NC, NULL);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB), *cc = connect_to(&NC);
    struct world wa, wb, wc;
    const size_t N = 32;
    pworld(&wa, "inst-A", 1, 2, 64, 32768, 5, true);
    pworld(&wb, "inst-B", 1, 2, 64, 32768, 0, false);
    pworld(&wc, "inst-C", 1, 2, 64, 32768, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_register(cc, &wc);
    world_save_ok(ca, &wa, 500, 0, N);
    wait_meta(NA.p.addr, 500, N, (long)N, 20000);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    struct fetch_arg x = {cb, &wb, &wa, "three-B", 500, N, &bar, 0};
    struct fetch_arg y = {cc, &wc, &wa, "three-C", 500, N, &bar, 0};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, fetch_thread, &x);
    pthread_create(&t2, NULL, fetch_thread, &y);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    /* B may have fetched from A and C from B (B re-advertises), or both from A */
    PFT_CHECK(x.hits == N && y.hits == N, "B got %u, C got %u of %zu", x.hits, y.hits, N);
    wait_metric(&NA, "pegaflow_transfer_lock_active", 0, false, 10000);
    PFT_CHECK(node_metric(&NA, "pegaflow_rpc_requests_total{method=\"rdma_handshake\","
                               "status=\"ok\"}") >= 1,
              "A served no handshake");
    pf_client_close(ca);
    pf_client_close(cb);
    pf_client_close(cc);
    stop_all();
    pthread_barrier_destroy(&bar);
    world_free(&wa);
    world_free(&wb);
    world_free(&wc);
}

static void sc_metaserver(void)
{
    start_ms(0, "2");
    start_node(&NA, NULL);
    start_node(&NB, NULL);
    int msport = MS.p.grpc_port;
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 8;
    pworld(&wa, "inst-A", 1, 1, 64, SEG, 6, true);
    pworld(&wb, "inst-B", 1, 1, 64, SEG, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 600, 0, N);
    wait_meta(NA.p.addr, 600, N, (long)N, 20000);
    fprintf(stderr, "    QueryPrefixBlocks lists A (%s) with %zu blocks\n", NA.p.addr, N);
    /* A silent: hidden after the stale period, back when it resumes */
    kill(NA.p.pid, SIGSTOP);
    wait_meta(NA.p.addr, 600, N, 0, 20000);
    fprintf(stderr, "    A stopped (SIGSTOP): hidden after the stale period\n");
    kill(NA.p.pid, SIGCONT);
    wait_meta(NA.p.addr, 600, N, (long)N, 20000);
    fprintf(stderr, "    A resumed: listed again\n");

    /* MetaServer gone: saves and queries keep answering, no remote discovery, no error */
    stop(&MS, SIGKILL);
    uint64_t t0 = pft_now_ms();
    world_save_ok(ca, &wa, 700, 10, N);
    uint64_t tsave = pft_now_ms() - t0;
    t0 = pft_now_ms();
    fetch_check(cb, &wb, "no-meta", 700, N, 0, &wa, 10, 0, 0, 30000);
    fprintf(stderr, "    MetaServer killed: save %llu ms, query -> Ready 0 in %llu ms\n",
            (unsigned long long)tsave, (unsigned long long)(pft_now_ms() - t0));
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"error\"}") == 0,
              "no fetch should have been attempted without discovery");
    /* once B's client knows the MetaServer is gone, no discovery is even attempted: Ready at
     * the first answer, no Loading round trip */
    wait_log(&NB, "unreachable", 20000);
    int loading = -1;
    struct pf_query_result r0 =
        query_until_ready(cb, wb.id, "no-meta-2", 700, N, 0, 10000, &loading);
    PFT_CHECK(r0.num_hit_blocks == 0 && loading == 0, "no-meta-2: %u hits after %d Loading",
              r0.num_hit_blocks, loading);
    fprintf(stderr, "    MetaServer known unreachable: Ready at once, no discovery\n");
    /* restarted on the same port: A's blocks discoverable again without a new save */
    start_ms(msport, "2");
    wait_meta(NA.p.addr, 600, N, (long)N, 30000);
    wait_meta(NA.p.addr, 700, N, (long)N, 30000);
    fprintf(stderr, "    MetaServer restarted: A's blocks listed again (resync, no new save)\n");
    /* B discovers again once its own MetaServer session is back */
    uint64_t dl = pft_now_ms() + 40000;
    while (log_count(&NB, "MetaServer session established") < 2) {
        PFT_CHECK(pft_now_ms() < dl, "B never re-established its MetaServer session");
        usleep(20000);
    }
    /* B's query channel may still be backing off from the outage (its first discovery then
     * fails fast, a plain miss): new requests until one is served */
    dl = pft_now_ms() + 30000;
    for (int k = 0;; k++) {
        char req[32];
        snprintf(req, sizeof(req), "after-restart-%d", k);
        if (fetch_check(cb, &wb, req, 700, N, 0, &wa, 10, 0, -1, 30000) == N)
            break;
        PFT_CHECK(pft_now_ms() < dl, "B never fetched A's blocks after the restart");
        usleep(50000);
    }
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
}

/* A holder killed while the requester's fetch is in flight: B's second READ is dropped by
 * the fault plan so the transfer cannot finish before the kill. */
static void sc_kill(void)
{
    start_ms(0, "30");
    start_node(&NA, NULL);
    const char *f[] = {"--enable-debug", "--fault-spec", "net.read:nth=2,drop=1,times=1", NULL};
    setenv("PEGAFLOW_P2P_MAX_READ", "1", 1); /* one READ per segment */
    start_node(&NB, f);
    unsetenv("PEGAFLOW_P2P_MAX_READ");
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 16;
    pworld(&wa, "inst-A", 1, 1, 64, 65536, 7, true);
    pworld(&wb, "inst-B", 1, 1, 64, 65536, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 800, 0, N);
    wait_meta(NA.p.addr, 800, N, (long)N, 20000);
    struct pf_query_result r;
    PFT_CHECK(query_wf(cb, wb.id, "kill-1", 800, N, 0, &r) == 0 && r.loading, "Loading");
    wait_log(&NB, "RDMA fetch req kill-1: reading", 20000);
    stop(&NA, SIGKILL);
    fprintf(stderr, "    A killed (SIGKILL) during B's transfer\n");
    fetch_check(cb, &wb, "kill-1", 800, N, 0, &wa, 0, 0, 0, 30000);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"error\"}") == 1, "error != 1");
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"timeout\"}") == 0,
              "the kill must be noticed before the deadline");
    /* B keeps serving; the blacklisted req falls through, a new one fails fast */
    fetch_check(cb, &wb, "kill-1", 800, N, 0, &wa, 0, 0, 0, 10000);
    fetch_check(cb, &wb, "kill-2", 800, N, 0, &wa, 0, 0, 0, 30000);
    PFT_CHECK(pf_client_health(cb, TMO) == 0, "B unhealthy");
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
}

static void sc_timeout(void)
{
    start_ms(0, "30");
    /* lock (30 s) outlives the transfer deadline (max(30 - 60, 10) = 10 s) */
    const char *la[] = {"--transfer-lock-timeout-secs", "30", NULL};
    start_node(&NA, la);
    const char *f[] = {"--enable-debug", "--fault-spec", "net.read:delay=15000", NULL};
    start_node(&NB, f);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 8;
    pworld(&wa, "inst-A", 1, 1, 64, SEG, 8, true);
    pworld(&wb, "inst-B", 1, 1, 64, SEG, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 900, 0, N);
    wait_meta(NA.p.addr, 900, N, (long)N, 20000);
    uint64_t t0 = pft_now_ms();
    fetch_check(cb, &wb, "tmo-1", 900, N, 0, &wa, 0, 0, 0, 40000);
    fprintf(stderr, "    deadline max(30 s - 60 s, 10 s): Ready 0 after %llu ms\n",
            (unsigned long long)(pft_now_ms() - t0));
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"timeout\"}") == 1,
              "timeout != 1");
    PFT_CHECK(pft_log_contains(&NB.p, "ERROR p2p: RDMA fetch req tmo-1"), "no error logged");
    PFT_CHECK(pft_log_contains(&NB.p, "connection invalidated, transfer lock"),
              "the error must say the connection was invalidated and the lock force-released");
    wait_metric(&NA, "pegaflow_transfer_lock_active", 0, false, 10000);
    PFT_CHECK(node_metric(&NA, "pegaflow_transfer_lock_timeouts_total") == 0,
              "the lock must have been released, not expired");
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_qps") == 0, "the timed-out connection is gone");
    PFT_CHECK(pf_client_health(cb, TMO) == 0, "B unhealthy");
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
}

static void sc_expire(void)
{
    start_ms(0, "30");
    const char *la[] = {"--transfer-lock-timeout-secs", "3", NULL};
    start_node(&NA, la);
    const char *f[] = {"--enable-debug", "--fault-spec", "net.read:drop=1", NULL};
    start_node(&NB, f);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 8;
    pworld(&wa, "inst-A", 1, 1, 64, SEG, 9, true);
    pworld(&wb, "inst-B", 1, 1, 64, SEG, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 1100, 0, N);
    wait_meta(NA.p.addr, 1100, N, (long)N, 20000);
    struct pf_query_result r;
    PFT_CHECK(query_wf(cb, wb.id, "exp-1", 1100, N, 0, &r) == 0 && r.loading, "Loading");
    wait_log(&NB, "RDMA fetch req exp-1: reading", 20000);
    wait_metric(&NA, "pegaflow_transfer_lock_active", (double)N, false, 5000);
    stop(&NB, SIGKILL);
    fprintf(stderr, "    B killed (SIGKILL) holding a transfer lock on A\n");
    wait_metric(&NA, "pegaflow_transfer_lock_timeouts_total", 1, false, 20000);
    wait_metric(&NA, "pegaflow_transfer_lock_active", 0, false, 5000);
    PFT_CHECK(pft_log_contains(&NA.p, "expired after 3 s: the requester never released"),
              "expiry not logged");
    fprintf(stderr, "    A's lock expired\n");
    /* A still serves its blocks locally */
    struct world wa2;
    pworld(&wa2, "inst-A2", 1, 1, 64, SEG, 0, false);
    world_register(ca, &wa2);
    fetch_check(ca, &wa2, "local", 1100, N, 0, &wa, 0, 0, (long)N, 10000);
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wa2);
    world_free(&wb);
}

static void sc_corrupt(void)
{
    start_ms(0, "30");
    start_node(&NA, NULL);
    const char *f[] = {"--enable-debug", "--fault-spec", "net.read:corrupt=1,nth=4,times=1", NULL};
    setenv("PEGAFLOW_P2P_MAX_READ", "1", 1); /* one READ per segment */
    start_node(&NB, f);
    unsetenv("PEGAFLOW_P2P_MAX_READ");
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 12;
    /* one layer, K and V: 2 READs per block */
    pworld(&wa, "inst-A", 1, 1, 64, 65536, 10, true);
    pworld(&wb, "inst-B", 1, 1, 64, 65536, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 1200, 0, N);
    wait_meta(NA.p.addr, 1200, N, (long)N, 20000);
    uint32_t hits = fetch_check(cb, &wb, "cor-1", 1200, N, 0, &wa, 0, 0, -1, 30000);
    PFT_CHECK(hits < N, "a corrupted block was accepted (%u hits)", hits);
    PFT_CHECK(node_metric(&NB, "pegaflow_integrity_failures_total{tier=\"remote\"}") >= 1,
              "integrity failure not counted");
    PFT_CHECK(pft_log_contains(&NB.p, "failed checksum verification"), "not logged");
    wait_metric(&NA, "pegaflow_transfer_lock_active", 0, false, 10000);
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
}

static void sc_evict(void)
{
    start_ms(0, "30");
    const char *la[] = {"--pool-size", "4mb", NULL};
    start_node(&NA, la);
    const char *f[] = {"--enable-debug", "--fault-spec", "net.connect:delay=3000", NULL};
    start_node(&NB, f);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 16;
    pworld(&wa, "inst-A", 1, 1, 256, 32768, 11, true); /* 64 KiB blocks */
    pworld(&wb, "inst-B", 1, 1, 64, 32768, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 1300, 0, N);
    wait_meta(NA.p.addr, 1300, N, (long)N, 20000);
    /* A's own lease keeps blocks 0..7 resident through the eviction below */
    struct pf_query_result pin = query_until_ready(ca, wa.id, "pin", 1300, 8, 0, 10000, NULL);
    PFT_CHECK(pin.num_hit_blocks == 8, "pin %u", pin.num_hit_blocks);
    struct pf_query_result r;
    PFT_CHECK(query_wf(cb, wb.id, "ev-1", 1300, N, 0, &r) == 0 && r.loading, "Loading");
    /* B discovered A and is connecting (its QP connect is delayed 3 s): evict on A now */
    wait_log(&NB, "RDMA handshake with", 20000);
    for (uint32_t b = 0; b < 96; b += 16)
        world_save_ok(ca, &wa, 5000 + b, 32 + b, 16); /* 6 MiB through a 4 MiB pool */
    PFT_CHECK(node_metric(&NA, "pegaflow_cache_block_evictions_total") >= 8, "no eviction on A");
    fprintf(stderr, "    A evicted %g block(s) while B was connecting\n",
            node_metric(&NA, "pegaflow_cache_block_evictions_total"));
    fetch_check(cb, &wb, "ev-1", 1300, N, 0, &wa, 0, 0, 8, 30000);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"partial\"}") == 1,
              "partial != 1");
    wait_metric(&NA, "pegaflow_transfer_lock_active", 0, false, 10000);
    pf_client_release(ca, pin.lease, PF_LEASE_LEN, TMO);
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
}

/* ------------------------------------------------------------------ auth */

static char *sec_file(const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", sec_dir, name);
    char *t = pft_read_file(path);
    PFT_CHECK(t, "cannot read %s", path);
    return t;
}

/* Credentials of one attempt: which certificate (NULL: none), which token (NULL: none). */
struct cred {
    const char *what;
    bool tls;
    const char *cert; /* "t" (ours), "rogue" (another CA) or NULL */
    const char *token;
};

/* One unary call to target with cred; returns the gRPC code (message in msg). */
static int call_as(const char *target, const struct cred *c, const char *path,
                   const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd, char *msg,
                   size_t msglen)
{
    struct pf_rpc_channel_opts o = {.tls = c->tls, .token = c->token};
    char *ca = NULL, *crt = NULL, *key = NULL;
    if (c->tls)
        o.ca_pem = ca = sec_file("ca.crt");
    if (c->cert) {
        char f[64];
        snprintf(f, sizeof(f), "%s.crt", c->cert);
        o.cert_pem = crt = sec_file(f);
        snprintf(f, sizeof(f), "%s.key", c->cert);
        o.key_pem = key = sec_file(f);
    }
    struct pf_rpc_channel *ch;
    PFT_CHECK(pf_rpc_channel_open_opts(target, &o, &ch) == 0, "channel %s", target);
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st = {0};
    pf_rpc_unary(ch, path, req, rd, 5000, &resp, &st);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    pf_rpc_channel_close(ch);
    snprintf(msg, msglen, "%s", st.msg);
    free(ca);
    free(crt);
    free(key);
    return st.code;
}

static void expect_code(const char *target, const struct cred *c, const char *path,
                        const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd, int want,
                        const char *want_msg)
{
    char msg[PF_RPC_ERRMSG];
    int code = call_as(target, c, path, req, rd, msg, sizeof(msg));
    PFT_CHECK(code == want, "%s %s as '%s': %s (%s), want %s", target, path, c->what,
              pf_grpc_code_name(code), msg, pf_grpc_code_name(want));
    PFT_CHECK(!want_msg || strstr(msg, want_msg), "%s %s as '%s': message '%s' lacks '%s'", target,
              path, c->what, msg, want_msg);
    fprintf(stderr, "    %-44s %-26s -> %s\n", path + 10, c->what, pf_grpc_code_name(code));
}

/* HTTP status of curl -X method on n's path with an optional bearer token. */
static int http_as(struct node *n, const char *method, const char *path, const char *bearer)
{
    char cmd[1024], out[16] = "";
    snprintf(cmd, sizeof(cmd),
             "curl -s -o /dev/null -w '%%{http_code}' -X %s %s%s%s 'http://%s:%d%s'", method,
             bearer ? "-H 'Authorization: Bearer " : "", bearer ? bearer : "", bearer ? "'" : "",
             n->p.http_host, n->p.http_port, path);
    FILE *f = popen(cmd, "r");
    PFT_CHECK(f, "popen curl");
    if (!fgets(out, sizeof(out), f))
        out[0] = '\0';
    pclose(f);
    return atoi(out);
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = '\0';
}

static void sc_auth(void)
{
    PFT_CHECK(sec_dir, "the auth scenario needs PF_P2P_SECURITY_DIR (run test_auth.sh)");
    bool netns = NA.ns[0] != '\0';
    char *tok = sec_file("token"), *wrong = sec_file("wrong-token"),
         *admin = sec_file("admin-token");
    trim(tok);
    trim(wrong);
    trim(admin);

    /* TLS and tokens end to end: A saves, B discovers it at the MetaServer and fetches */
    sync_pair_start();
    PFT_CHECK(pft_log_contains(&MS.p, "mutual TLS") && pft_log_contains(&NA.p, "mutual TLS"),
              "listeners without mutual TLS");
    PFT_CHECK(!pft_log_contains(&NA.p, "without authentication") &&
                  !pft_log_contains(&MS.p, "without authentication"),
              "a secured listener warned that it is open");
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 8;
    pworld(&wa, "inst-A", 1, 2, 32, SEG, 1, true);
    pworld(&wb, "inst-B", 1, 2, 32, SEG, 2, true);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 0, 0, N);
    wait_meta(NA.p.addr, 0, N, (long)N, 20000);
    fetch_check(cb, &wb, "req-auth", 0, N, 0, &wa, 0, 0, (long)N, 30000);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}") == 1, "no P2P fetch");

    /* the MetaServer and a node's peer RPCs: every wrong credential is refused */
    const struct cred good = {"mTLS + token", true, "t", tok},
                      notok = {"mTLS, no token", true, "t", NULL},
                      badtok = {"mTLS, wrong token", true, "t", wrong},
                      rogue = {"cert of another CA + token", true, "rogue", tok},
                      nocert = {"TLS without cert + token", true, NULL, tok},
                      plain = {"plaintext + token", false, NULL, tok};
    uint8_t h[HLEN];
    hash_of(0, h);
    ProtobufCBinaryData hb = {HLEN, h};
    Pegaflow__QueryPrefixBlocksRequest qp = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    qp.namespace_ = (char *)NSTR;
    qp.n_block_hashes = 1;
    qp.block_hashes = &hb;
    Pegaflow__ReleaseTransferLockRequest rl = PEGAFLOW__RELEASE_TRANSFER_LOCK_REQUEST__INIT;
    rl.transfer_session_id = (char *)"00000000-0000-4000-8000-000000000000";
    struct {
        const char *target, *path;
        const ProtobufCMessage *req;
        const ProtobufCMessageDescriptor *rd;
    } peer_rpcs[] = {
        {MS.p.addr, "/pegaflow.MetaServer/QueryPrefixBlocks", &qp.base,
         &pegaflow__query_prefix_blocks_response__descriptor},
        {NA.p.addr, "/pegaflow.Engine/ReleaseTransferLock", &rl.base,
         &pegaflow__release_transfer_lock_response__descriptor},
    };
    for (size_t i = 0; i < PF_ARRAY_SIZE(peer_rpcs); i++) {
        const char *t = peer_rpcs[i].target, *pa = peer_rpcs[i].path;
        expect_code(t, &good, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_OK, NULL);
        expect_code(t, &notok, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAUTHENTICATED,
                    "needs the cluster token");
        expect_code(t, &badtok, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAUTHENTICATED,
                    "wrong cluster token");
        expect_code(t, &rogue, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAVAILABLE, NULL);
        expect_code(t, &nocert, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAVAILABLE, NULL);
        expect_code(t, &plain, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAVAILABLE, NULL);
    }

    /* worker RPCs: from another host only with the token; over the Unix socket without */
    Pegaflow__UnregisterRequest ur = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    ur.instance_id = (char *)"nobody";
    Pegaflow__ShutdownRequest sd = PEGAFLOW__SHUTDOWN_REQUEST__INIT;
    const char *unreg = "/pegaflow.Engine/UnregisterContext";
    char msg[PF_RPC_ERRMSG];
    int code = call_as(NA.p.addr, &good, unreg, &ur.base,
                       &pegaflow__unregister_response__descriptor, msg, sizeof(msg));
    PFT_CHECK(code != PF_GRPC_PERMISSION_DENIED && code != PF_GRPC_UNAUTHENTICATED &&
                  code != PF_GRPC_UNAVAILABLE,
              "UnregisterContext with the token: %s (%s)", pf_grpc_code_name(code), msg);
    if (netns) {
        expect_code(NA.p.addr, &notok, unreg, &ur.base, &pegaflow__unregister_response__descriptor,
                    PF_GRPC_PERMISSION_DENIED, "only served to callers on this host");
        expect_code(NA.p.addr, &notok, "/pegaflow.Engine/Shutdown", &sd.base,
                    &pegaflow__shutdown_response__descriptor, PF_GRPC_PERMISSION_DENIED, NULL);
        PFT_CHECK(kill(NA.p.pid, 0) == 0 && !pft_log_contains(&NA.p, "Shutdown requested"),
                  "A obeyed a refused Shutdown");
    }
    if (netns) {
        /* Session (a parked stream) from another host without the token: refused, and the
         * refusal is a status, not an accepted stream */
        struct pf_rpc_channel_opts so = {.tls = true};
        char *sca = sec_file("ca.crt"), *scrt = sec_file("t.crt"), *skey = sec_file("t.key");
        so.ca_pem = sca;
        so.cert_pem = scrt;
        so.key_pem = skey;
        struct pf_rpc_channel *sch;
        PFT_CHECK(pf_rpc_channel_open_opts(NA.p.addr, &so, &sch) == 0, "channel");
        Pegaflow__SessionRequest sr = PEGAFLOW__SESSION_REQUEST__INIT;
        sr.instance_id = (char *)"inst-A";
        struct pf_rpc_stream *ss = NULL;
        struct pf_rpc_status sst = {0};
        int src = pf_rpc_stream_open(sch, "/pegaflow.Engine/Session", &sr.base, 5000, &ss, &sst);
        PFT_CHECK(src != 0 && sst.code == PF_GRPC_PERMISSION_DENIED,
                  "Session from another host without the token: rc %d %s (%s)", src,
                  pf_grpc_code_name(sst.code), sst.msg);
        pf_rpc_channel_close(sch);
        free(sca);
        free(scrt);
        free(skey);
        fprintf(stderr, "    %-44s %-26s -> %s\n", "Engine/Session", "mTLS, no token",
                pf_grpc_code_name(sst.code));
    }
    const struct cred unix_none = {"unix socket, nothing", false, NULL, NULL};
    code = call_as(NA.sock, &unix_none, unreg, &ur.base, &pegaflow__unregister_response__descriptor,
                   msg, sizeof(msg));
    PFT_CHECK(code != PF_GRPC_PERMISSION_DENIED && code != PF_GRPC_UNAUTHENTICATED &&
                  code != PF_GRPC_UNAVAILABLE,
              "UnregisterContext over %s: %s (%s)", NA.sock, pf_grpc_code_name(code), msg);
    fprintf(stderr, "    UnregisterContext over the Unix socket, no credentials -> %s\n",
            pf_grpc_code_name(code));

    /* RdmaHandshake: requester_id must be the caller's proven address, endpoints too */
    if (netns) {
        uint8_t ep[TCPNET_EP_LEN];
        struct tcpnet_ep e = {.port = 9, .token = 1};
        inet_pton(AF_INET, MS.ip, e.ip); /* another host than the caller */
        tcpnet_ep_encode(ep, &e);
        ProtobufCBinaryData eps[2] = {{sizeof(ep), ep}, {sizeof(ep), ep}};
        Pegaflow__HandshakeMemRegion reg = PEGAFLOW__HANDSHAKE_MEM_REGION__INIT, *regp = &reg;
        reg.addr = 4096;
        reg.length = 4096;
        Pegaflow__HandshakeNic nic = PEGAFLOW__HANDSHAKE_NIC__INIT, *nicp = &nic;
        nic.n_endpoints = 2;
        nic.endpoints = eps;
        nic.n_regions = 1;
        nic.regions = &regp;
        Pegaflow__HandshakeMetadata md = PEGAFLOW__HANDSHAKE_METADATA__INIT;
        md.backend = (char *)"tcp";
        md.n_nics = 1;
        md.nics = &nicp;
        md.qps_per_nic = 2;
        uint8_t blob[512];
        size_t blen = pegaflow__handshake_metadata__pack(&md, blob);
        Pegaflow__RdmaHandshakeRequest hs = PEGAFLOW__RDMA_HANDSHAKE_REQUEST__INIT;
        hs.handshake_metadata = (ProtobufCBinaryData){blen, blob};
        hs.requester_id = NB.p.addr; /* spoofed: we are not B */
        expect_code(NA.p.addr, &good, "/pegaflow.Engine/RdmaHandshake", &hs.base,
                    &pegaflow__rdma_handshake_response__descriptor, PF_GRPC_PERMISSION_DENIED,
                    "not an address the caller proved");
        char self[64];
        snprintf(self, sizeof(self), "%s:9", getenv("PF_P2P_IP_T") ? getenv("PF_P2P_IP_T") : "");
        hs.requester_id = self;
        expect_code(NA.p.addr, &good, "/pegaflow.Engine/RdmaHandshake", &hs.base,
                    &pegaflow__rdma_handshake_response__descriptor, PF_GRPC_PERMISSION_DENIED,
                    MS.ip);
        /* proven by the certificate only (test_auth.sh puts 10.77.0.200 in t's
         * subjectAltName; no host has it): authorised, so A tries the endpoint, which names
         * the client's own address where nothing listens on port 9 */
        inet_pton(AF_INET, getenv("PF_P2P_IP_T"), e.ip);
        tcpnet_ep_encode(ep, &e);
        hs.handshake_metadata.len = pegaflow__handshake_metadata__pack(&md, blob);
        hs.requester_id = (char *)"10.77.0.200:9";
        expect_code(NA.p.addr, &good, "/pegaflow.Engine/RdmaHandshake", &hs.base,
                    &pegaflow__rdma_handshake_response__descriptor, PF_GRPC_UNAVAILABLE,
                    "cannot connect QP");
    }

    /* HTTP: POST needs the admin token; GET /health and /metrics stay open */
    PFT_CHECK(http_as(&NA, "POST", "/cache/memory/cleanup", NULL) == 401, "POST without token");
    PFT_CHECK(http_as(&NA, "POST", "/cache/memory/cleanup", wrong) == 401, "POST wrong token");
    PFT_CHECK(http_as(&NA, "POST", "/instances/cleanup?id=nobody", tok) == 401,
              "POST with the cluster token instead of the admin token");
    PFT_CHECK(http_as(&NA, "POST", "/cache/memory/cleanup", admin) == 200, "POST admin token");
    PFT_CHECK(http_as(&NA, "GET", "/health", NULL) == 200, "GET /health");
    PFT_CHECK(http_as(&NA, "GET", "/metrics", NULL) == 200, "GET /metrics");
    fprintf(stderr, "    HTTP: POST 401 without/with a wrong token, 200 with it; GET open\n");

    /* a node with the wrong cluster token gets no MetaServer session */
    char wpath[600];
    snprintf(wpath, sizeof(wpath), "%s/wrong-token", sec_dir);
    token_override = wpath;
    char meta[128];
    snprintf(meta, sizeof(meta), "http://%s", MS.p.addr);
    const char *cargs[] = {"--gpu-backend",
                           "sim",
                           "--sim-gpus",
                           "1",
                           "--nics",
                           NC.nic,
                           "--net-backend",
                           "tcp",
                           "--pool-size",
                           "16mb",
                           "--metaserver-addr",
                           meta,
                           NULL};
    spawn(&NC, "pegaflow-server", 0, cargs);
    token_override = NULL;
    wait_log(&NC, "heartbeat failed: UNAUTHENTICATED", 20000);
    PFT_CHECK(!pft_log_contains(&NC.p, "MetaServer session established"),
              "C got a session with the wrong token");
    fprintf(stderr, "    node with the wrong cluster token: heartbeat UNAUTHENTICATED\n");

    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
    free(tok);
    free(wrong);
    free(admin);
}

/* redis-server in the MetaServer's namespace on its IP (port 7379 in a fresh namespace, a
 * free port on loopback), started or restarted on the same port; waits for PING. */
static void redis_start(int *port_p)
{
    char ports[16], dir[512];
    const char *logdir = getenv("PF_TEST_LOGDIR");
    snprintf(dir, sizeof(dir), "%s/redis", logdir ? logdir : "/tmp"); /* kept with the logs */
    if (!*port_p) {
        *port_p = 7379;
        if (!MS.ns[0]) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET};
            socklen_t l = sizeof(a);
            inet_pton(AF_INET, MS.ip, &a.sin_addr);
            PFT_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                          getsockname(fd, (struct sockaddr *)&a, &l) == 0,
                      "free port");
            *port_p = ntohs(a.sin_port);
            close(fd);
        }
    }
    PFT_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST, "mkdir %s", dir);
    snprintf(ports, sizeof(ports), "%d", *port_p);
    const char *argv[] = {"ip",           "netns",  "exec", MS.ns,
                          "redis-server", "--port", ports,  "--bind",
                          MS.ip,          "--save", "",     "--appendonly",
                          "no",           "--dir",  dir,    "--protected-mode",
                          "no",           NULL};
    const char *const *av = MS.ns[0] ? argv : argv + 4;
    pid_t pid = fork();
    PFT_CHECK(pid >= 0, "fork");
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout))
            _exit(127);
        execvp(av[0], (char *const *)av);
        _exit(127);
    }
    RD.p.pid = pid;
    uint64_t dl = pft_now_ms() + 10000;
    for (;;) {
        struct timeval tv = {1, 0};
        redisContext *c = redisConnectWithTimeout(MS.ip, *port_p, tv);
        redisReply *r = c && !c->err ? redisCommand(c, "PING") : NULL;
        bool ok = r && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
        if (c)
            redisFree(c);
        if (ok)
            break;
        PFT_CHECK(pft_now_ms() < dl, "redis-server on %s:%d did not answer", MS.ip, *port_p);
        usleep(20000);
    }
    fprintf(stderr, "  redis: redis-server on %s:%d%s%s\n", MS.ip, *port_p,
            MS.ns[0] ? " in netns " : "", MS.ns);
}

static void sc_redis(void)
{
    int rport = 0;
    redis_start(&rport);
    char store[96];
    snprintf(store, sizeof(store), "redis://%s:%d", MS.ip, rport);
    const char *args[] = {"--node-stale-secs", "2", "--store", store, NULL};
    spawn(&MS, "pegaflow-metaserver", 0, args);
    MS2.ns[0] = 0;
    snprintf(MS2.ns, sizeof(MS2.ns), "%s", MS.ns);
    snprintf(MS2.ip, sizeof(MS2.ip), "%s", MS.ip);
    spawn(&MS2, "pegaflow-metaserver", 0, args);
    snprintf(meta_addrs, sizeof(meta_addrs), "http://%s,http://%s", MS.p.addr, MS2.p.addr);
    start_node(&NA, NULL);
    start_node(&NB, NULL);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 8;
    pworld(&wa, "inst-A", 1, 1, 64, SEG, 9, true);
    pworld(&wb, "inst-B", 1, 1, 64, SEG, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 900, 0, N);
    wait_meta(NA.p.addr, 900, N, (long)N, 20000);
    fetch_check(cb, &wb, "redis-1", 900, N, 0, &wa, 0, 0, (long)N, 30000);
    /* replica 1 dies: the nodes move to replica 2, discovery goes on */
    stop(&MS, SIGKILL);
    struct node dead = MS;
    MS = MS2; /* wait_meta asks MS */
    MS2 = dead;
    world_save_ok(ca, &wa, 1000, 10, N);
    wait_meta(NA.p.addr, 1000, N, (long)N, 30000);
    uint64_t dl = pft_now_ms() + 30000;
    for (int k = 0;; k++) {
        char req[32];
        snprintf(req, sizeof(req), "redis-failover-%d", k);
        if (fetch_check(cb, &wb, req, 1000, N, 0, &wa, 10, 8, -1, 30000) == N)
            break;
        PFT_CHECK(pft_now_ms() < dl, "B never fetched through replica 2");
        usleep(50000);
    }
    fprintf(stderr, "    replica 1 killed: B discovered and fetched through replica 2\n");
    /* Redis dies: saves and queries keep answering, no discovery */
    kill(RD.p.pid, SIGKILL);
    waitpid(RD.p.pid, NULL, 0);
    RD.p.pid = 0;
    world_save_ok(ca, &wa, 1100, 20, N);
    fetch_check(cb, &wb, "redis-down", 1100, N, 0, &wa, 20, 16, 0, 30000);
    wait_log(&NB, "unreachable", 20000);
    fprintf(stderr, "    Redis killed: B degrades to local-only (Ready, 0 hits)\n");
    /* Redis back, empty: the nodes re-register by themselves, B fetches again */
    redis_start(&rport);
    wait_meta(NA.p.addr, 1100, N, (long)N, 40000);
    dl = pft_now_ms() + 40000;
    for (int k = 0;; k++) {
        char req[32];
        snprintf(req, sizeof(req), "redis-back-%d", k);
        if (fetch_check(cb, &wb, req, 1100, N, 0, &wa, 20, 24, -1, 30000) == N)
            break;
        PFT_CHECK(pft_now_ms() < dl, "B never fetched again after Redis came back");
        usleep(50000);
    }
    fprintf(stderr, "    Redis back: A re-registered, B fetched byte-exact again\n");
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    meta_addrs[0] = 0;
    kill(RD.p.pid, SIGKILL);
    waitpid(RD.p.pid, NULL, 0);
    RD.p.pid = 0;
    world_free(&wa);
    world_free(&wb);
}

/* Issue 15 §2 layouts across nodes: B fetches from A, in one namespace per layout, pages of
 * MLA page-first replicas (striped saves), layer-split shards, and a hybrid model's
 * attention prefix and recurrent want-set; every device of B loads byte-exact. */
static bool io_uring_usable(void)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    long fd = syscall(__NR_io_uring_setup, 2, &p);
    if (fd < 0)
        return false;
    close((int)fd);
    return true;
}

static void sc_layouts(void)
{
    /* A has an SSD tier (512-padded host segments), B has none: a page must mean the same
     * on both (the split layout's 1000-byte layer) */
    char dir[512] = "", ssd[600] = "";
    const char *logdir = getenv("PF_TEST_LOGDIR");
    snprintf(dir, sizeof(dir), "%s/layouts-ssd.XXXXXX", logdir ? logdir : "/tmp");
    bool with_ssd = io_uring_usable() && mkdtemp(dir) != NULL;
    if (!with_ssd)
        fprintf(stderr, "    SKIP (SSD on A only): io_uring is not usable here; A runs "
                        "without an SSD tier\n");
    snprintf(ssd, sizeof(ssd), "%s/a.dat", dir);
    const char *ssd_args[] = {"--ssd-cache-path", ssd, "--ssd-cache-capacity", "64mb", NULL};
    start_ms(0, "30");
    start_node(&NA, with_ssd ? ssd_args : NULL);
    start_node(&NB, NULL);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    const size_t N = 16;
    uint32_t ids[16];
    uint64_t hp[16];
    for (size_t i = 0; i < N; i++) {
        ids[i] = (uint32_t)i + 1;
        hp[i] = ids[i];
    }
    static const char *const ns[2] = {"ns-p2p-mla", "ns-p2p-split"};
    for (int split = 0; split < 2; split++) {
        struct lworld a, b;
        lw_mla(&a, split ? "split-A" : "mla-A", ns[split], 2, split, 64, 11 + (uint64_t)split,
               true);
        lw_mla(&b, split ? "split-B" : "mla-B", ns[split], 2, split, 64, 11 + (uint64_t)split,
               false);
        lw_register(ca, &a);
        lw_register(cb, &b);
        lw_save_striped(ca, &a, ids, N);
        lw_wait_sealed(ca, a.id, hp, N);
        wait_meta_ns(ns[split], NA.p.addr, 1, N, (long)N, 20000);
        int loading = lw_fetch_all(cb, &b, &a, split ? "lay-split" : "lay-mla", ids, N, 20);
        PFT_CHECK(loading >= 1, "%s: B must fetch from A (answer Loading)", ns[split]);
        fprintf(stderr, "    %s: %zu pages fetched from A, byte-exact on both devices of B\n",
                split ? "layer-split shards" : "page-first replicas", N);
        lw_free(&a);
        lw_free(&b);
    }
    struct lworld ha, hb;
    lw_hybrid(&ha, "hy-A", "ns-p2p-hy", 2, 64, 13, true);
    lw_hybrid(&hb, "hy-B", "ns-p2p-hy", 2, 64, 13, false);
    lw_register(ca, &ha);
    lw_register(cb, &hb);
    uint64_t rpos[3] = {1, 4, 6}, apos[8];
    uint32_t rid[3] = {20, 21, 22};
    for (size_t i = 0; i < 8; i++)
        apos[i] = i;
    lw_hybrid_save(ca, &ha, 8, rpos, rid, 3);
    lw_wait_sealed(ca, ha.id, apos, 8);
    wait_meta_ns("ns-p2p-hy", NA.p.addr, 0, 8, 8, 20000);
    int ld[2];
    lw_hybrid_fetch(cb, &hb, &ha, "lay-hy", 8, rpos, rid, 3, 0, ld);
    PFT_CHECK(ld[0] >= 1 && ld[1] >= 1,
              "both groups must come from A (Loading answers: attention %d, recurrent %d)", ld[0],
              ld[1]);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}") == 4,
              "B: %g successful fetches, want 4",
              node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}"));
    fprintf(stderr, "    hybrid: attention prefix and recurrent want-set fetched from A, "
                    "byte-exact\n");
    lw_free(&ha);
    lw_free(&hb);
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    if (with_ssd) {
        unlink(ssd);
        rmdir(dir);
    }
}

static const struct pft_scenario scenarios[] = {
    {"basic", sc_basic},   {"mutual", sc_mutual},
    {"three", sc_three},   {"metaserver", sc_metaserver},
    {"kill", sc_kill},     {"timeout", sc_timeout},
    {"expire", sc_expire}, {"corrupt", sc_corrupt},
    {"evict", sc_evict},   {"auth", sc_auth},
    {"redis", sc_redis},   {"layouts", sc_layouts},
};

int main(int argc, char **argv)
{
    world_seed = pft_seed();
    world_hash_base = 7000000;
    world_tmo = TMO;
    atexit(kill_all);
    env_node(&MS, "MS");
    env_node(&NA, "A");
    env_node(&NB, "B");
    env_node(&NC, "C");
    const char *eb = getenv("PF_P2P_NET_BACKEND");
    if (eb && *eb)
        net_backend = eb;
    int a = 1;
    for (; a + 1 < argc && strncmp(argv[a], "--", 2) == 0; a += 2) {
        if (strcmp(argv[a], "--net-backend") == 0) {
            net_backend = argv[a + 1];
        } else if (strcmp(argv[a], "--nics") == 0) {
            struct node *nodes[] = {&NA, &NB, &NC};
            char buf[256];
            snprintf(buf, sizeof(buf), "%s", argv[a + 1]);
            char *save = NULL, *tok = strtok_r(buf, ",", &save);
            for (size_t i = 0; tok && i < PF_ARRAY_SIZE(nodes);
                 i++, tok = strtok_r(NULL, ",", &save))
                snprintf(nodes[i]->nic, sizeof(nodes[i]->nic), "%s", tok);
        } else {
            fprintf(stderr, "unknown option %s\n", argv[a]);
            return 2;
        }
    }
    fprintf(stderr, "net backend %s, NICs a=%s b=%s c=%s\n", net_backend, NA.nic, NB.nic, NC.nic);
    signal(SIGPIPE, SIG_IGN);
    sec_dir = getenv("PF_P2P_SECURITY_DIR");
    if (sec_dir && !*sec_dir)
        sec_dir = NULL;
    if (sec_dir) {
        /* this process's own channels (MetaServer queries) use libpegaflow's environment */
        struct pf_auth_env env;
        struct pf_rpc_channel_opts o;
        char err[256];
        PFT_CHECK(pf_auth_env_load(&env, &o, err, sizeof(err)) == 0, "%s", err);
        PFT_CHECK(o.tls && o.cert_pem && o.token,
                  "PF_P2P_SECURITY_DIR needs PEGAFLOW_TLS_CA/CERT/KEY and PEGAFLOW_TOKEN_FILE");
        PFT_CHECK(pf_rpc_set_default_channel_opts(&o) == 0, "channel defaults");
        pf_auth_env_free(&env);
    }
    return pft_run_scenarios(scenarios, PF_ARRAY_SIZE(scenarios), argv + a, argc - a);
}

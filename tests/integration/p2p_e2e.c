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
 *   plan       issue 24: the query-time tier plan (p2p_plan.h): a pure miss Ready at once,
 *              48 asked / 32 on a peer counted rdma 32 + miss 16, wait_for_full_prefix from
 *              the own SSD, the best of two holders killed -9, a stopped peer vs an SSD hit
 *   redis      issue 14: two MetaServer replicas on one redis-server (--store redis://) in
 *              the MetaServer's namespace, nodes list both; A saves, B fetches byte-exact;
 *              replica 1 killed (SIGKILL): B discovers and fetches new blocks through
 *              replica 2; Redis killed: saves and queries answer, no discovery; Redis back
 *              (empty): A re-registers by itself and B fetches again
 *   tenants    two tenants (--tenants-file) with equal hashes in their own namespaces:
 *              each fetches its own bytes from A, byte-exact (p2p_tenants.h)
 *
 *   rail_down  issue 23 (the rxe guest: test_rxe.sh sets PF_P2P_NIC_A=rxe0,rxe2,
 *              PF_P2P_NIC_B=rxe1,rxe3 and PF_P2P_RAIL_DOWN/_UP/_NIC): B fetches from A over
 *              both rails; B's rail 1 is taken down under the live connection
 *              (PF_P2P_RAIL_DOWN, `ip link set veth3 down`); B's next fetch, whose READs
 *              on that rail fail in flight (retries exhausted), is re-posted on rail 0 and
 *              byte-exact, the rail counted dead by name
 *              (pegaflow_rdma_rail_failures_total{nic}), no new handshake; a third fetch
 *              skips the rail
 *
 *   ssdrestart issue 25: A killed with its blocks on SSD and restarted on the same file:
 *              recovered, re-registered with the MetaServer, fetched by B byte-exact
 *              while only on A's SSD (A reads them into RAM to answer); a record corrupted
 *              on disk after recovery: B gets the run before it, counts the shortfall
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
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <linux/io_uring.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "client/pegaflow.h"
#include "../../sim/net/tcpnet_wire.h"
#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/rpc.h"
#include "pfmeta.h"
#include "pftest.h"
#include "world.h"
#include "layouts.h"
#include "p2p_cluster.h"
#include "p2p_auth.h"
#include "p2p_redis.h"
#include "p2p_tenants.h"

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
    /* every block checked once; K and V of a slot are separate READs here (per-layer K and
     * V regions), so no receive-path digest can cover a slot: the verification pass does */
    double vrx = node_metric(&NB, "pegaflow_p2p_verified_blocks_total{path=\"receive\"}"),
           vwk = node_metric(&NB, "pegaflow_p2p_verified_blocks_total{path=\"worker\"}");
    PFT_CHECK(vrx == 0 && vwk == (double)N, "verified %g (receive) + %g (worker), want 0 + %zu",
              vrx, vwk, N);
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

/* Wall-clock ms of the first line of n's log containing s (its leading ISO-8601 UTC stamp),
 * 0 when none. */
static uint64_t log_line_ms(struct node *n, const char *s)
{
    char *l = pft_read_file(n->p.log);
    char *hit = l ? strstr(l, s) : NULL;
    uint64_t ms = 0;
    if (hit) {
        while (hit > l && hit[-1] != '\n')
            hit--;
        struct tm tm = {0};
        unsigned frac = 0;
        if (sscanf(hit, "%d-%d-%dT%d:%d:%d.%3uZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                   &tm.tm_min, &tm.tm_sec, &frac) == 7) {
            tm.tm_year -= 1900;
            tm.tm_mon -= 1;
            ms = (uint64_t)timegm(&tm) * 1000 + frac;
        }
    }
    free(l);
    return ms;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A holder killed while the requester's fetch is in flight. B's second READ is dropped by
 * the fault plan (it never completes: the transfer cannot finish on its own) and its third
 * READ's post stalls KILL_STALL_MS, so READs 3.. are submitted after A is dead whatever the
 * link's speed: the kill is noticed from them (ECONNRESET on the TCP fabric, retries exceeded
 * on RoCE), before the deadline. Without the stall a fast link finished READs 1 and 3.. before
 * the kill, leaving only the dropped one, which nothing but the deadline ends. */
#define KILL_STALL_MS 8000
static void sc_kill(void)
{
    start_ms(0, "30");
    start_node(&NA, NULL);
    char spec[96];
    snprintf(spec, sizeof(spec), "net.read:nth=2,drop=1,times=1;net.read:nth=3,stall=%d,times=1",
             KILL_STALL_MS);
    const char *f[] = {"--enable-debug", "--fault-spec", spec, NULL};
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
    /* READ 2 dropped; READ 3's stall starts right after that line */
    wait_log(&NB, "drop=1", 20000);
    stop(&NA, SIGKILL);
    uint64_t t_drop = log_line_ms(&NB, "drop=1"), t_dead = wall_ms();
    PFT_CHECK(t_drop && t_dead < t_drop + KILL_STALL_MS,
              "A was dead %lld ms after READ 3's stall began, not within its %d ms: this run "
              "cannot tell the kill from the stall's end (a machine this slow needs a longer "
              "KILL_STALL_MS)",
              (long long)(t_dead - t_drop), KILL_STALL_MS);
    fprintf(stderr, "    A killed (SIGKILL) during B's transfer, %llu ms into READ 3's stall\n",
            (unsigned long long)(t_dead - t_drop));
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

/* One READ corrupted in flight (the fault plan flips bytes of the 4th): the block it
 * carried must not be served, whichever check finds it. KV_SPLIT (all K blocks, then all V
 * blocks): K and V of a slot travel in separate READs, so the verification pass over the
 * staging memory finds it. KV_ADJACENT (K then V per block): on the TCP fabric the slot's
 * xxh3 is computed as its bytes land (receive path) and the mismatch is found there, no pass
 * over staging at all; over verbs the pass finds it. */
static void corrupt_case(enum kv_layout lay, uint64_t h0)
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
    world_init_tagged(&wa, "inst-A", NSTR, 1, 1, lay, 64, 65536, 10, true);
    world_init_tagged(&wb, "inst-B", NSTR, 1, 1, lay, 64, 65536, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, h0, 0, N);
    wait_meta(NA.p.addr, h0, N, (long)N, 20000);
    uint32_t hits = fetch_check(cb, &wb, "cor-1", h0, N, 0, &wa, 0, 0, -1, 30000);
    PFT_CHECK(hits < N, "a corrupted block was accepted (%u hits)", hits);
    PFT_CHECK(node_metric(&NB, "pegaflow_integrity_failures_total{tier=\"remote\"}") >= 1,
              "integrity failure not counted");
    PFT_CHECK(pft_log_contains(&NB.p, "failed checksum verification"), "not logged");
    double vrx = node_metric(&NB, "pegaflow_p2p_verified_blocks_total{path=\"receive\"}"),
           vwk = node_metric(&NB, "pegaflow_p2p_verified_blocks_total{path=\"worker\"}");
    bool rx = lay == KV_ADJACENT && strcmp(net_backend, "tcp") == 0;
    PFT_CHECK(rx ? vwk == 0 && vrx == (double)N : vrx == 0 && vwk == (double)N,
              "%s: verified %g in the receive path, %g by the pass (want all %zu by the %s)",
              lay == KV_ADJACENT ? "K|V adjacent" : "K, V split", vrx, vwk, N,
              rx ? "receive path" : "pass");
    fprintf(stderr, "    %s: %u of %zu blocks, the corrupted one refused by the %s\n",
            lay == KV_ADJACENT ? "K|V adjacent" : "K, V split", hits, N,
            rx ? "receive-path digest" : "verification pass");
    wait_metric(&NA, "pegaflow_transfer_lock_active", 0, false, 10000);
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
}

static void sc_corrupt(void)
{
    corrupt_case(KV_SPLIT, 1200);
    corrupt_case(KV_ADJACENT, 1250);
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
    /* the order this scenario needs: the evicting saves done inside B's connect delay */
    uint64_t t_hs = log_line_ms(&NB, "RDMA handshake with"), t_saved = wall_ms();
    PFT_CHECK(t_hs && t_saved < t_hs + 3000 && log_count(&NB, "RDMA fetch req ev-1: reading") == 0,
              "A's evicting saves ended %lld ms after B's handshake began, past B's 3 s connect "
              "delay (or B already reads): this run cannot order the eviction before the fetch",
              (long long)(t_saved - t_hs));
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

#include "p2p_plan.h"

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
        /* page-first pages and layer shards travel whole in one READ each: on the TCP
         * fabric every one is checked as it lands, none by a pass over staging */
        double vrx = node_metric(&NB, "pegaflow_p2p_verified_blocks_total{path=\"receive\"}"),
               vwk = node_metric(&NB, "pegaflow_p2p_verified_blocks_total{path=\"worker\"}");
        bool tcp = strcmp(net_backend, "tcp") == 0;
        PFT_CHECK(tcp ? vrx == (double)(N * (size_t)(split + 1)) && vwk == 0 : vrx == 0,
                  "%s: verified %g in the receive path, %g by the pass", ns[split], vrx, vwk);
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

/* Flips one payload byte of the SSD record of hash index h in file path: the record header
 * holds the key hash at offset 64 and is 4096 bytes for one slot (docs/ssd.md, "On-disk
 * format"); the payload follows it. */
static void corrupt_record(const char *path, uint64_t h)
{
    uint8_t hash[HLEN];
    hash_of(h, hash);
    int fd = open(path, O_RDWR);
    PFT_CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    struct stat st;
    PFT_CHECK(fstat(fd, &st) == 0, "fstat");
    uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    PFT_CHECK(m != MAP_FAILED, "mmap %s", path);
    size_t hits = 0, at = 0;
    for (size_t off = 4096; off + 4096 + 4096 <= (size_t)st.st_size; off += 512)
        if (memcmp(m + off, "PFSSDREC", 8) == 0 && memcmp(m + off + 64, hash, HLEN) == 0) {
            hits++;
            at = off;
        }
    PFT_CHECK(hits == 1, "record of hash %llu found %zu time(s) in %s", (unsigned long long)h, hits,
              path);
    m[at + 4096 + 100] ^= 0x5a; /* payload byte 100: slot 0's K data */
    PFT_CHECK(msync(m, (size_t)st.st_size, MS_SYNC) == 0, "msync");
    munmap(m, (size_t)st.st_size);
    PFT_CHECK(fsync(fd) == 0, "fsync");
    close(fd);
}

static void sc_ssdrestart(void)
{
    /* issue 25: A is killed (SIGKILL) with its blocks on its SSD and restarted on the same
     * file: its recovery scan rebuilds the SSD index and the recovered blocks are
     * re-registered with the MetaServer (A's RAM is empty); B discovers them through the
     * MetaServer and fetches them byte-exact: A's QueryBlocksForTransfer reads them from its
     * SSD into RAM first. A record corrupted on disk after recovery: A answers the run before
     * it, B counts the shortfall and gets those blocks byte-exact, never wrong bytes. */
    if (!io_uring_usable()) {
        fprintf(stderr, "    SKIP (ssdrestart): io_uring is not usable here\n");
        return;
    }
    char dir[512], ssd[600];
    const char *logdir = getenv("PF_TEST_LOGDIR");
    snprintf(dir, sizeof(dir), "%s/ssdrestart.XXXXXX", logdir ? logdir : "/tmp");
    PFT_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(ssd, sizeof(ssd), "%s/a.dat", dir);
    const char *ssd_args[] = {"--ssd-cache-path", ssd, "--ssd-cache-capacity", "64mb", NULL};
    start_ms(0, "3"); /* the killed A's session goes stale fast: the restarted A takes over */
    start_node(&NA, ssd_args);
    start_node(&NB, NULL);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    const size_t N = 16, BAD = 8; /* group 2's block BAD gets corrupted on disk */
    struct world wa, wb;
    pworld(&wa, "inst-A", 1, 1, 64, 65536, 25, true);
    pworld(&wb, "inst-B", 1, 1, 64, 65536, 0, false);
    world_register(ca, &wa);
    world_save_ok(ca, &wa, 2500, 0, N);
    world_save_ok(ca, &wa, 2600, (uint32_t)N, N);
    wait_metric(&NA, "pegaflow_ssd_write_blocks_total", (double)(2 * N), true, 20000);
    pf_client_close(ca);
    int port = NA.p.grpc_port;
    stop(&NA, SIGKILL);
    next_node_port = port; /* restarted on its address, as a node keeps its --addr */
    start_node(&NA, ssd_args);
    wait_metric(&NA, "pegaflow_ssd_recovery_state", 2, false, 20000);
    PFT_CHECK(node_metric(&NA, "pegaflow_ssd_recovered_blocks") == (double)(2 * N), "recovered %g",
              node_metric(&NA, "pegaflow_ssd_recovered_blocks"));
    /* the MetaServer learns them from A's SSD index */
    wait_meta(NA.p.addr, 2500, N, (long)N, 20000);
    wait_meta(NA.p.addr, 2600, N, (long)N, 20000);
    wait_metric(&NA, "pegaflow_metaserver_resync_blocks_total", (double)(2 * N), true, 20000);
    fprintf(stderr, "    A restarted: %zu SSD block(s) recovered and listed by the MetaServer\n",
            2 * N);
    /* nothing of them is in A's RAM: B's fetch makes A read them from its SSD */
    PFT_CHECK(node_metric(&NA, "pegaflow_cache_resident_bytes") == 0 &&
                  metric_or(&NA.p, "pegaflow_cache_resident_blocks{class=\"retained\"}", -1) == 0 &&
                  metric_or(&NA.p, "pegaflow_cache_resident_blocks{class=\"reclaimable\"}", -1) ==
                      0,
              "A's RAM is not empty");
    world_register(cb, &wb);
    fetch_check(cb, &wb, "ssdr-b", 2500, N, 0, &wa, 0, 0, (long)N, 30000);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}") >= 1,
              "B did not fetch from A");
    PFT_CHECK(node_metric(&NA, "pegaflow_p2p_serve_ssd_blocks_total{result=\"served\"}") ==
                  (double)N,
              "A served %g block(s) from its SSD, want %zu",
              node_metric(&NA, "pegaflow_p2p_serve_ssd_blocks_total{result=\"served\"}"), N);
    PFT_CHECK(node_metric(&NA, "pegaflow_cache_resident_blocks{class=\"retained\"}") == (double)N,
              "A's RAM holds %g block(s) after serving, want %zu (promoted)",
              node_metric(&NA, "pegaflow_cache_resident_blocks{class=\"retained\"}"), N);
    fprintf(stderr, "    A served %zu SSD-only block(s) to B (read into RAM on demand)\n", N);
    /* failure path: group 2's record BAD flipped on disk after recovery indexed it */
    corrupt_record(ssd, 2600 + BAD);
    fetch_check(cb, &wb, "ssdr-bad", 2600, N, 0, &wa, (uint32_t)N, (uint32_t)N, (long)BAD, 30000);
    PFT_CHECK(node_metric(&NA, "pegaflow_integrity_failures_total{tier=\"ssd\"}") == 1,
              "A: %g SSD integrity failure(s), want 1",
              node_metric(&NA, "pegaflow_integrity_failures_total{tier=\"ssd\"}"));
    PFT_CHECK(node_metric(&NA, "pegaflow_p2p_serve_ssd_blocks_total{result=\"served\"}") ==
                      (double)(N + BAD) &&
                  node_metric(&NA, "pegaflow_p2p_serve_ssd_blocks_total{result=\"failed\"}") ==
                      (double)(N - BAD),
              "A: SSD serve served %g failed %g, want %zu and %zu",
              node_metric(&NA, "pegaflow_p2p_serve_ssd_blocks_total{result=\"served\"}"),
              node_metric(&NA, "pegaflow_p2p_serve_ssd_blocks_total{result=\"failed\"}"), N + BAD,
              N - BAD);
    PFT_CHECK(
        node_metric(&NB,
                    "pegaflow_prefetch_shortfall_blocks_total{tier=\"rdma\",reason=\"evicted\"}") ==
            (double)(N - BAD),
        "B: shortfall %g, want %zu",
        node_metric(&NB,
                    "pegaflow_prefetch_shortfall_blocks_total{tier=\"rdma\",reason=\"evicted\"}"),
        N - BAD);
    fprintf(stderr,
            "    corrupted record: A answered the %zu block(s) before it, B counted the "
            "shortfall\n",
            BAD);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
    unlink(ssd);
    rmdir(dir);
}

static void sc_rail_down(void)
{
    const char *down = getenv("PF_P2P_RAIL_DOWN"), *up = getenv("PF_P2P_RAIL_UP");
    const char *nic = getenv("PF_P2P_RAIL_NIC");
    PFT_CHECK(down && *down && up && *up && nic && *nic,
              "rail_down needs PF_P2P_RAIL_DOWN, PF_P2P_RAIL_UP and PF_P2P_RAIL_NIC "
              "(tests/integration/test_rxe.sh)");
    PFT_CHECK(strchr(NA.nic, ',') && strchr(NB.nic, ','), "rail_down needs two NICs per node");
    start_ms(0, "120");
    /* the transfer deadline (lock timeout - 60 s) outlasts rxe's retry exhaustion (~7.5 s) */
    const char *f[] = {"--transfer-lock-timeout-secs", "120", NULL};
    start_node(&NA, f);
    setenv("PEGAFLOW_P2P_MAX_READ", "1", 1); /* one READ per segment: both rails carry some */
    start_node(&NB, f);
    unsetenv("PEGAFLOW_P2P_MAX_READ");
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 16;
    pworld(&wa, "inst-A", 1, 1, 64, 65536, 11, true);
    pworld(&wb, "inst-B", 1, 1, 64, 65536, 0, false);
    world_register(ca, &wa);
    world_register(cb, &wb);
    char series[160];
    snprintf(series, sizeof(series), "pegaflow_rdma_rail_failures_total{nic=\"%s\"}", nic);
    for (int round = 0; round < 3; round++) {
        uint64_t h0 = 1100 + 100 * (uint64_t)round;
        uint32_t first = (uint32_t)(round * N);
        char req[32];
        snprintf(req, sizeof(req), "rail-%d", round + 1);
        world_save_ok(ca, &wa, h0, first, N);
        wait_meta(NA.p.addr, h0, N, (long)N, 20000);
        if (round == 1) {
            PFT_CHECK(system(down) == 0, "'%s' failed", down);
            fprintf(stderr, "    B's rail %s taken down (%s) under the live connection\n", nic,
                    down);
        }
        fetch_check(cb, &wb, req, h0, N, 0, &wa, first, first, (long)N, 90000);
        fprintf(stderr, "    %s: %zu blocks byte-exact, %s = %g\n", req, N, series,
                node_metric(&NB, series));
        if (round == 0)
            PFT_CHECK(node_metric(&NB, "pegaflow_rdma_qps") == 4, "B: 2 rails x 2 QPs expected");
    }
    PFT_CHECK(system(up) == 0, "'%s' failed", up);
    PFT_CHECK(node_metric(&NB, series) == 1, "%s = %g, want 1", series, node_metric(&NB, series));
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}") == 3, "B: 3 fetches ok");
    /* one handshake logs "RDMA handshake with" twice (start, done): no reconnect */
    PFT_CHECK(log_count(&NB, "RDMA handshake with") == 2, "B handshook again");
    char dead[96];
    snprintf(dead, sizeof(dead), "rail %s of connection", nic);
    PFT_CHECK(pft_log_contains(&NB.p, dead), "B's log does not name the dead rail");
    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
}

static const struct pft_scenario scenarios[] = {
    {"basic", sc_basic},
    {"mutual", sc_mutual},
    {"three", sc_three},
    {"metaserver", sc_metaserver},
    {"kill", sc_kill},
    {"timeout", sc_timeout},
    {"expire", sc_expire},
    {"corrupt", sc_corrupt},
    {"evict", sc_evict},
    {"auth", sc_auth},
    {"redis", sc_redis},
    {"layouts", sc_layouts},
    {"plan", sc_plan},
    {"tenants", sc_tenants},
    {"ssdrestart", sc_ssdrestart},
    {"rail_down", sc_rail_down},
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
    } else if (getenv("PF_CLUSTER_TOKEN_FILE")) {
        /* protected by default: the nodes have the run's token; this process's MetaServer
         * probes and worker calls (from its own namespace) send it (PEGAFLOW_TOKEN_FILE) */
        struct pf_auth_env env;
        struct pf_rpc_channel_opts o;
        char err[256];
        PFT_CHECK(pf_auth_env_load(&env, &o, err, sizeof(err)) == 0, "%s", err);
        PFT_CHECK(o.token, "PF_CLUSTER_TOKEN_FILE needs PEGAFLOW_TOKEN_FILE (p2p_netns.sh)");
        PFT_CHECK(pf_rpc_set_default_channel_opts(&o) == 0, "channel defaults");
        pf_auth_env_free(&env);
    }
    return pft_run_scenarios(scenarios, PF_ARRAY_SIZE(scenarios), argv + a, argc - a);
}

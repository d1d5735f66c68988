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
 * the servers' pools, the fastest of block-size, 256 KiB and single calls. The table reports
 * medians and their ratio.
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
 *            [--verify-row on|off] [--plan-timeout-ms N]  (PF_BIN: the binaries, default
 * build/rel/bin)
 *
 * --plan-timeout-ms N: every node's --p2p-plan-timeout-ms. Under emulation (make bench-rxe)
 * the query-time MetaServer plan takes longer than the 50 ms default, and a request planned
 * from local tiers only measures nothing (fetch_on retries it, up to 5 times).
 *
 * --tls: a fresh test PKI (tests/integration/certs.sh, openssl; PF_TOP: the source tree)
 * and --tls-cert/--tls-key/--tls-ca on the MetaServer and both nodes: gRPC and the TCP
 * fabric run TLS 1.3 (docs/security.md "Fabric TLS"); this process uses the same
 * certificate (libpegaflow's PEGAFLOW_TLS_* environment). */
#include <arpa/inet.h>
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
#include "pftest.h"
#include "benchutil.h"
#include "rawverbs.h"

#define MAX_BLOCKS 8
/* the raw streams also run in calls of this size at every block size: on this VM two TCP
 * streams in 256 KiB calls beat 4 MiB and whole-buffer calls (5.7 vs 4.5 GB/s) */
#define RAW_SMALL (256ull << 10)
#define MAX_REPS  32
#define HLEN      32
#define TMO       60000
#define NSTR      "ns-bench-p2p"

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
    const char *plan_ms; /* --plan-timeout-ms N: the nodes' --p2p-plan-timeout-ms (default:
                          * the server's); the emulated rxe guest needs more than 50 ms */
};

static struct pft_netpair np;
static uint64_t seed;

/* ------------------------------------------------------------------ processes */

struct proc {
    const char *tag;
    const char *ns;
    pid_t pid;
    char log[320], addr[64];
    int grpc_port, http_port;
};

static struct proc MS = {.tag = "metaserver"}, NA = {.tag = "node-a"}, NB = {.tag = "node-b"},
                   NP = {.tag = "node-plain"}, /* without P2P: the pure-miss baseline */
    NV = {.tag = "node-b-noverify"};           /* B with --integrity off: verification off */
static pid_t raw_pid;
static char logdir[64];

/* async-signal-safe: kill(2) and waitpid(2) only */
static void kill_procs(void)
{
    struct proc *all[] = {&NV, &NP, &NB, &NA, &MS};
    for (int i = 0; i < 5; i++)
        if (all[i]->pid > 0) {
            kill(all[i]->pid, SIGKILL);
            waitpid(all[i]->pid, NULL, 0);
            all[i]->pid = 0;
        }
    if (raw_pid > 0) {
        kill(raw_pid, SIGKILL);
        waitpid(raw_pid, NULL, 0);
        raw_pid = 0;
    }
}

static void kill_all(void)
{
    kill_procs();
    pft_netpair_cleanup(&np);
}

static void on_signal(int sig)
{
    kill_procs();
    pft_netpair_cleanup_signal(&np);
    _exit(128 + sig);
}

static void die(const char *fmt, ...) PF_PRINTF(1, 2);
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "p2p bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (logs in %s)\n", logdir);
    va_end(ap);
    kill_all();
    exit(1);
}

static void spawn(struct proc *p, const char *bin, const char *ip, const char *const *args)
{
    const char *dir = getenv("PF_BIN");
    char path[512], addr[64], haddr[64];
    snprintf(path, sizeof(path), "%s/%s", dir ? dir : "build/rel/bin", bin);
    snprintf(addr, sizeof(addr), "%s:0", ip);
    snprintf(haddr, sizeof(haddr), "%s:0", ip);
    snprintf(p->log, sizeof(p->log), "%s/%s.log", logdir, p->tag);
    const char *argv[64];
    size_t k = 0;
    if (p->ns) {
        argv[k++] = "ip";
        argv[k++] = "netns";
        argv[k++] = "exec";
        argv[k++] = p->ns;
    }
    argv[k++] = path;
    argv[k++] = "--addr";
    argv[k++] = addr;
    argv[k++] = "--http-addr";
    argv[k++] = haddr;
    for (size_t i = 0; args[i] && k < 60; i++)
        argv[k++] = args[i];
    const char *tok = getenv("PF_CLUSTER_TOKEN_FILE"); /* main: pft_cluster_token */
    if (tok) {
        argv[k++] = "--cluster-token-file";
        argv[k++] = tok;
    }
    argv[k] = NULL;
    p->pid = fork();
    if (p->pid < 0)
        die("fork: %s", strerror(errno));
    if (p->pid == 0) {
        int fd = open(p->log, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (p->ns)
            execvp("ip", (char *const *)argv);
        else
            execv(path, (char *const *)argv);
        _exit(127);
    }
    uint64_t dl = pft_now_ms() + 120000; /* pools of 1 GiB pre-fault slowly on small VMs */
    for (;;) {
        char *l = pft_read_file(p->log);
        bool ready = false;
        if (l) {
            p->grpc_port = pft_port_after(l, "gRPC listening on");
            p->http_port = pft_port_after(l, "HTTP listening on");
            ready = strstr(l, ": ready\n") != NULL;
            free(l);
        }
        if (ready && p->grpc_port && p->http_port)
            break;
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            die("%s exited during start-up", p->tag);
        }
        if (pft_now_ms() > dl)
            die("%s did not start", p->tag);
        usleep(20000);
    }
    snprintf(p->addr, sizeof(p->addr), "%s:%d", ip, p->grpc_port);
}

/* One series of p's /metrics; absent reads as dflt. */
static double metric_or(struct proc *p, const char *ip, const char *name, double dflt)
{
    char *body = NULL;
    if (pft_http(ip, p->http_port, "GET", "/metrics", &body) != 200)
        die("%s /metrics failed", p->tag);
    double v = bu_metric_in(body, name);
    free(body);
    return v < 0 ? dflt : v;
}

static double metric(struct proc *p, const char *ip, const char *name)
{
    return metric_or(p, ip, name, 0);
}

/* ------------------------------------------------------------------ namespaces */

/* ------------------------------------------------------------------ raw TCP baseline */

/* Child in A's namespace: streams size bytes per connection in the chunk the reader names. */
static void raw_sender(int ctl, uint64_t size)
{
    if (np.made && pft_netns_enter(np.ns[0]))
        _exit(1);
    uint8_t *src = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED)
        _exit(1);
    madvise(src, size, MADV_HUGEPAGE); /* the same page advice as the servers' pools */
    pft_fill(src, size, seed, 99);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, np.ip[0], &sa.sin_addr);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 64))
        _exit(1);
    socklen_t sl = sizeof(sa);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    uint16_t port = ntohs(sa.sin_port);
    if (write(ctl, &port, sizeof(port)) != sizeof(port))
        _exit(1);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            _exit(0);
        uint64_t hdr[3] = {0, 0, 0}; /* chunk, offset, length */
        if (recv(fd, hdr, sizeof(hdr), MSG_WAITALL) == sizeof(hdr) && hdr[0] &&
            hdr[1] + hdr[2] <= size) {
            uint64_t chunk = hdr[0], off = hdr[1], end = hdr[1] + hdr[2];
            while (off < end) {
                uint64_t want = end - off < chunk ? end - off : chunk;
                ssize_t n = send(fd, src + off, want, MSG_NOSIGNAL);
                if (n <= 0)
                    break;
                off += (uint64_t)n;
            }
        }
        char c;
        while (recv(fd, &c, 1, 0) > 0)
            ;
        close(fd);
    }
}

static uint16_t raw_port;
static uint8_t *raw_dst;

struct raw_stream {
    uint64_t chunk, off, len;
    pthread_t t;
};

static void *raw_stream_main(void *arg)
{
    struct raw_stream *r = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(raw_port)};
    inet_pton(AF_INET, np.ip[0], &sa.sin_addr);
    uint64_t hdr[3] = {r->chunk, r->off, r->len};
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
        send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) != sizeof(hdr))
        die("raw connect: %s", strerror(errno));
    uint64_t off = r->off, end = r->off + r->len;
    while (off < end) {
        uint64_t want = end - off < r->chunk ? end - off : r->chunk;
        ssize_t n = recv(fd, raw_dst + off, want, MSG_WAITALL);
        if (n <= 0)
            die("raw recv: %s", strerror(errno));
        off += (uint64_t)n;
    }
    close(fd);
    return NULL;
}

/* size bytes over nstreams parallel TCP connections (one per QP the servers use), each
 * read in chunk-sized calls; returns seconds. Like for like with the P2P path. */
static double raw_round(uint64_t size, uint64_t chunk, int nstreams)
{
    struct raw_stream rs[64];
    uint64_t per = size / (uint64_t)nstreams;
    uint64_t t0 = pf_now_ns();
    for (int i = 0; i < nstreams; i++) {
        rs[i] = (struct raw_stream){.chunk = chunk,
                                    .off = per * (uint64_t)i,
                                    .len = i == nstreams - 1 ? size - per * (uint64_t)i : per};
        pthread_create(&rs[i].t, NULL, raw_stream_main, &rs[i]);
    }
    for (int i = 0; i < nstreams; i++)
        pthread_join(rs[i].t, NULL);
    return (double)(pf_now_ns() - t0) / 1e9;
}

/* ------------------------------------------------------------------ the client side */

static struct pf_client *ca, *cb;
static struct pf_simkv *kv_a, *kv_b;

static void hash_of(uint64_t space, uint64_t i, uint8_t *h)
{
    pft_fill(h, HLEN, seed, space << 32 | i);
}

static void reg(struct pf_client *c, const char *id, struct pf_simkv *kv, uint64_t nblocks,
                uint64_t bs)
{
    uint8_t ipc[512];
    size_t ipc_len = 0;
    if (pf_simkv_ipc(kv, 0, nblocks * bs, ipc, sizeof(ipc), &ipc_len))
        die("simkv ipc");
    struct pf_layer_desc d = {.name = "ALL_LAYERS",
                              .ipc = ipc,
                              .ipc_len = ipc_len,
                              .num_blocks = nblocks,
                              .bytes_per_block = bs,
                              .segments = 1};
    struct pf_register_args a = {.instance_id = id,
                                 .namespace_ = NSTR,
                                 .tp_size = 1,
                                 .world_size = 1,
                                 .layers = &d,
                                 .nlayers = 1};
    if (pf_client_register(c, &a, TMO))
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

/* Prefix the MetaServer lists for A over [h0, h0+n); *others_p (optional) the longest
 * prefix it lists for any other node. */
static long meta_prefix2(uint64_t space, uint64_t h0, size_t n, long *others_p)
{
    static struct pf_rpc_channel *ch;
    if (!ch && pf_rpc_channel_open(MS.addr, &ch))
        die("channel");
    uint8_t *hs = malloc(n * HLEN);
    ProtobufCBinaryData *b = malloc(n * sizeof(*b));
    for (size_t i = 0; i < n; i++) {
        hash_of(space, h0 + i, hs + i * HLEN);
        b[i] = (ProtobufCBinaryData){HLEN, hs + i * HLEN};
    }
    Pegaflow__QueryPrefixBlocksRequest req = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    req.namespace_ = (char *)NSTR;
    req.n_block_hashes = n;
    req.block_hashes = b;
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st;
    long v = -1;
    if (pf_rpc_unary(ch, "/pegaflow.MetaServer/QueryPrefixBlocks", &req.base,
                     &pegaflow__query_prefix_blocks_response__descriptor, 5000, &resp, &st) == 0) {
        const Pegaflow__QueryPrefixBlocksResponse *r = (const void *)resp;
        v = 0;
        for (size_t i = 0; i < r->n_nodes; i++)
            if (strcmp(r->nodes[i]->node, NA.addr) == 0)
                v = (long)r->nodes[i]->prefix_len;
            else if (others_p && (long)r->nodes[i]->prefix_len > *others_p)
                *others_p = (long)r->nodes[i]->prefix_len;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    free(hs);
    free(b);
    return v;
}

static long meta_prefix(uint64_t space, uint64_t h0, size_t n)
{
    return meta_prefix2(space, h0, n, NULL);
}

static void wait_advertised(uint64_t space, uint64_t h0, size_t n)
{
    uint64_t dl = pft_now_ms() + 60000;
    while (meta_prefix(space, h0, n) != (long)n) {
        if (pft_now_ms() > dl)
            die("A's blocks never showed up at the MetaServer");
        usleep(2000);
    }
}

/* Waits until the MetaServer lists A with all n blocks and no other node with any (the
 * requesters' copies from an earlier round withdrawn), so every fetch reads from A. */
static void wait_only_a(uint64_t space, uint64_t h0, size_t n)
{
    uint64_t dl = pft_now_ms() + 60000;
    for (;;) {
        long others = 0;
        if (meta_prefix2(space, h0, n, &others) == (long)n && others == 0)
            return;
        if (pft_now_ms() > dl)
            die("the requesters' copies stayed advertised after their cache cleanup");
        usleep(2000);
    }
}

/* QueryPrefetch on B back to back until Ready; returns seconds from the first call. */
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
                             uint64_t n, int k, const struct opts *o)
{
    char req[64];
    snprintf(req, sizeof(req), "nov-%llu-%d", (unsigned long long)bs, k);
    uint32_t hits = 0;
    double s = fetch_conc(cv, iv, req, bs, n, o->concurrent, &hits);
    if (hits != n)
        die("%s: %u of %llu blocks fetched", req, hits, (unsigned long long)n);
    verify_on(cv, kv, iv, bs, 0, n, bs);
    cleanup_node(&NV);
    wait_only_a(bs, 0, n);
    return s;
}

static int parse_opts(int argc, char **argv, struct opts *o)
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
                       .verify_row = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tls")) {
            o->tls = true;
            continue;
        }
        if (!strcmp(a, "--loopback")) {
            o->loopback = true;
            continue;
        }
        if (!v)
            goto usage;
        i++;
        if (!strcmp(a, "--size")) {
            if (pf_parse_size(v, &o->size) || o->size == 0)
                goto usage;
        } else if (!strcmp(a, "--reps")) {
            o->reps = atoi(v);
            if (o->reps < 1 || o->reps > MAX_REPS)
                goto usage;
        } else if (!strcmp(a, "--lat-reps")) {
            o->lat_reps = atoi(v);
            if (o->lat_reps < 1 || o->lat_reps > 200)
                goto usage;
        } else if (!strcmp(a, "--qps")) {
            o->qps = atoi(v);
            if (o->qps < 1 || o->qps > 64)
                goto usage;
        } else if (!strcmp(a, "--concurrent")) {
            o->concurrent = atoi(v);
            if (o->concurrent < 1 || o->concurrent > 16)
                goto usage;
        } else if (!strcmp(a, "--verify-row")) {
            if (strcmp(v, "on") && strcmp(v, "off"))
                goto usage;
            o->verify_row = !strcmp(v, "on");
        } else if (!strcmp(a, "--plan-timeout-ms")) {
            char *end = NULL;
            long ms = strtol(v, &end, 10);
            if (!end || *end || ms < 1 || ms > 10000) /* the server's range */
                goto usage;
            o->plan_ms = v;
        } else if (!strcmp(a, "--json")) {
            o->json = v;
        } else if (!strcmp(a, "--integrity")) {
            o->integrity = v;
        } else if (!strcmp(a, "--backend")) {
            if (strcmp(v, "tcp") && strcmp(v, "verbs"))
                goto usage;
            o->backend = v;
        } else if (!strcmp(a, "--nics")) {
            if (sscanf(v, "%63[^,],%63s", o->nics[0], o->nics[1]) != 2)
                goto usage;
        } else if (!strcmp(a, "--addrs")) {
            if (sscanf(v, "%39[^,],%39s", o->addrs[0], o->addrs[1]) != 2)
                goto usage;
        } else if (!strcmp(a, "--blocks")) {
            char buf[256];
            snprintf(buf, sizeof(buf), "%s", v);
            o->nblocks = 0;
            for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->nblocks == MAX_BLOCKS || pf_parse_size(t, &o->blocks[o->nblocks]) ||
                    o->blocks[o->nblocks] < 4096 || o->blocks[o->nblocks] % 512)
                    goto usage;
                o->nblocks++;
            }
        } else {
            goto usage;
        }
    }
    return 0;
usage:
    fprintf(stderr, "usage: p2p [--size BYTES] [--blocks 256k,1m,4m] [--reps N] [--lat-reps N] "
                    "[--qps N] [--integrity on|off] [--loopback] [--backend tcp|verbs] "
                    "[--nics A,B] [--addrs A,B] [--json PATH] [--tls] [--concurrent 1..16] "
                    "[--verify-row on|off] [--plan-timeout-ms 1..10000]\n");
    return -1;
}

struct result {
    uint64_t block;
    double p2p[MAX_REPS], raw[MAX_REPS], srv[MAX_REPS], nov[MAX_REPS];
    double p2p_med, raw_med, srv_med, nov_med;
    double lat[200], lat_srv_ms, lat_p50, lat_p99;
};

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_opts(argc, argv, &o))
        return 2;
    seed = pft_seed();
    snprintf(logdir, sizeof(logdir), "/tmp/pf-bench-p2p.XXXXXX");
    if (!mkdtemp(logdir))
        return 1;
    char tokpath[128]; /* P2P nodes need a cluster token (protected by default) */
    if (pft_cluster_token(logdir, tokpath, sizeof(tokpath)) != 0)
        die("cannot write the cluster token in %s", logdir);
    { /* this process's own MetaServer probes send it too (libpegaflow's environment) */
        struct pf_auth_env env;
        struct pf_rpc_channel_opts co;
        char aerr[256];
        if (pf_auth_env_load(&env, &co, aerr, sizeof(aerr)) != 0 ||
            pf_rpc_set_default_channel_opts(&co) != 0)
            die("cluster token: %s", aerr);
        pf_auth_env_free(&env);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    bool verbs = strcmp(o.backend, "verbs") == 0;
    bool netns =
        !verbs && !o.loopback && geteuid() == 0 && pft_netpair_setup(&np, "pfp2p", 214) == 0;
    const char *nic_a = np.ip[0], *nic_b = np.ip[1];
    if (verbs) {
        snprintf(np.ip[0], sizeof(np.ip[0]), "%s", o.addrs[0]);
        snprintf(np.ip[1], sizeof(np.ip[1]), "%s", o.addrs[1]);
        nic_a = o.nics[0];
        nic_b = o.nics[1];
    } else if (netns) {
        NA.ns = MS.ns = np.ns[0];
        NB.ns = np.ns[1];
        nic_a = np.veth[0];
        nic_b = np.veth[1];
    } else {
        snprintf(np.ip[0], sizeof(np.ip[0]), "127.0.0.2");
        snprintf(np.ip[1], sizeof(np.ip[1]), "127.0.0.3");
    }
    char szs[32];
    pf_format_size(o.size, szs, sizeof(szs));
    char topo[200];
    snprintf(topo, sizeof(topo), "verbs %s (A, %s) -> %s (B, %s), raw verbs READ baseline", nic_a,
             np.ip[0], nic_b, np.ip[1]);
    printf("p2p bench: %s, %s per fetch, blocks",
           verbs   ? topo
           : netns ? "two namespaces + veth"
                   : "loopback",
           szs);
    for (int i = 0; i < o.nblocks; i++)
        printf(" %lluk", (unsigned long long)(o.blocks[i] >> 10));
    printf(", %d rounds, %d QP(s) per peer, logs %s\n", o.reps, o.qps, logdir);
    fflush(stdout);

    int ctl[2];
    if (pipe(ctl))
        return 1;
    raw_pid = fork();
    if (raw_pid == 0) {
        close(ctl[0]);
        raw_sender(ctl[1], o.size);
    }
    close(ctl[1]);
    if (pft_read_full(ctl[0], &raw_port, sizeof(raw_port)))
        die("raw sender did not start");

    static char tls_crt[300], tls_key[300], tls_ca[300];
    const char *tls_flags[9] = {NULL};
    if (o.tls) {
        char cmd[1200];
        const char *top = getenv("PF_TOP") ? getenv("PF_TOP") : ".";
        snprintf(cmd, sizeof(cmd),
                 "bash -c '. \"%s/tests/integration/certs.sh\" && make_certs \"%s/pki\" "
                 "node=%s,%s' >/dev/null 2>&1",
                 top, logdir, np.ip[0], np.ip[1]);
        if (system(cmd) != 0)
            die("--tls: certs.sh failed (openssl installed? PF_TOP=%s)", top);
        snprintf(tls_crt, sizeof(tls_crt), "%s/pki/node.crt", logdir);
        snprintf(tls_key, sizeof(tls_key), "%s/pki/node.key", logdir);
        snprintf(tls_ca, sizeof(tls_ca), "%s/pki/ca.crt", logdir);
        /* the nodes: this client registers from the other namespace (locality rule with TLS) */
        const char *f[] = {"--tls-cert", tls_crt, "--tls-key",    tls_key,
                           "--tls-ca",   tls_ca,  "--local-rpcs", "any"};
        memcpy(tls_flags, f, sizeof(f));
        setenv("PEGAFLOW_TLS_CA", tls_ca, 1);
        setenv("PEGAFLOW_TLS_CERT", tls_crt, 1);
        setenv("PEGAFLOW_TLS_KEY", tls_key, 1);
        struct pf_auth_env env;
        struct pf_rpc_channel_opts co;
        char err[256];
        if (pf_auth_env_load(&env, &co, err, sizeof(err)) ||
            pf_rpc_set_default_channel_opts(&co)) /* the MetaServer probes' channel */
            die("--tls: %s", err);
        pf_auth_env_free(&env);
        printf("TLS: gRPC and the TCP fabric with a test PKI in %s/pki\n", logdir);
    }
    /* the nodes' optional flags: TLS (8 entries or none), then the plan deadline */
    const char *node_flags[11] = {NULL};
    size_t nf = 0;
    for (; tls_flags[nf]; nf++)
        node_flags[nf] = tls_flags[nf];
    if (o.plan_ms) {
        node_flags[nf++] = "--p2p-plan-timeout-ms";
        node_flags[nf++] = o.plan_ms;
    }
    char pool[32], qps[8], meta[96];
    pf_format_size(o.size + (64ull << 20), pool, sizeof(pool));
    snprintf(qps, sizeof(qps), "%d", o.qps);
    const char *ms_args[] = {"--node-stale-secs", "30",         tls_flags[0],
                             tls_flags[1],        tls_flags[2], tls_flags[3],
                             tls_flags[4],        tls_flags[5], NULL};
    spawn(&MS, "pegaflow-metaserver", np.ip[0], ms_args);
    snprintf(meta, sizeof(meta), "http://%s", MS.addr);
    const char *a_args[] = {"--gpu-backend",
                            "sim",
                            "--sim-gpus",
                            "1",
                            "--pool-size",
                            pool,
                            "--nics",
                            nic_a,
                            "--net-backend",
                            o.backend,
                            "--metaserver-addr",
                            meta,
                            "--qps-per-peer",
                            qps,
                            "--integrity",
                            o.integrity,
                            node_flags[0],
                            node_flags[1],
                            node_flags[2],
                            node_flags[3],
                            node_flags[4],
                            node_flags[5],
                            node_flags[6],
                            node_flags[7],
                            node_flags[8],
                            node_flags[9],
                            NULL};
    spawn(&NA, "pegaflow-server", np.ip[0], a_args);
    const char *b_args[] = {"--gpu-backend",
                            "sim",
                            "--sim-gpus",
                            "1",
                            "--pool-size",
                            pool,
                            "--nics",
                            nic_b,
                            "--net-backend",
                            o.backend,
                            "--metaserver-addr",
                            meta,
                            "--qps-per-peer",
                            qps,
                            "--integrity",
                            o.integrity,
                            node_flags[0],
                            node_flags[1],
                            node_flags[2],
                            node_flags[3],
                            node_flags[4],
                            node_flags[5],
                            node_flags[6],
                            node_flags[7],
                            node_flags[8],
                            node_flags[9],
                            NULL};
    spawn(&NB, "pegaflow-server", np.ip[1], b_args);
    bool vrow = o.verify_row && strcmp(o.integrity, "on") == 0;
    if (vrow) { /* the same requester with verification off, next to B */
        for (size_t i = 0; b_args[i]; i++)
            if (!strcmp(b_args[i], "--integrity"))
                b_args[i + 1] = "off";
        NV.ns = NB.ns;
        spawn(&NV, "pegaflow-server", np.ip[1], b_args);
    }
    if (netns && pft_netns_enter(np.ns[1]))
        die("cannot enter %s", np.ns[1]);
    raw_dst = mmap(NULL, o.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(raw_dst, o.size, MADV_HUGEPAGE); /* the same page advice as the servers' pools */
    memset(raw_dst, 0, o.size);
    struct rv rawv;
    uint8_t *rawsrc = NULL;
    if (verbs) { /* the baseline: READs between the same two devices, no server involved */
        rawsrc = mmap(NULL, o.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (rawsrc == MAP_FAILED)
            die("mmap");
        pft_fill(rawsrc, o.size, seed, 1);
        int e = rv_open(&rawv, nic_a, nic_b, rawsrc, raw_dst, o.size);
        if (e)
            die("raw verbs baseline on %s -> %s: %s", nic_a, nic_b, strerror(-e));
    }
    if (pf_client_connect(NA.addr, &ca) || pf_client_connect(NB.addr, &cb))
        die("connect");
    if (pf_simkv_create(o.size, 0, &kv_a) || pf_simkv_create(16ull << 20, 0, &kv_b))
        die("simkv");
    struct pf_client *cv = NULL;
    struct pf_simkv *kv_v = NULL;
    if (vrow && (pf_client_connect(NV.addr, &cv) || pf_simkv_create(16ull << 20, 0, &kv_v)))
        die("connect / simkv of %s", NV.tag);
    pft_fill(pf_simkv_ptr(kv_a), o.size, seed, 1);

    struct result res[MAX_BLOCKS];
    memset(res, 0, sizeof(res));
    printf("\n%d concurrent fetch(es) from A%s\n", o.concurrent,
           vrow ? "; no-verify = the same fetches on a requester with --integrity off" : "");
    printf("%-8s %10s %10s %7s %10s %10s %7s   %s\n", "block", "p2p GB/s", "raw GB/s", "ratio",
           "fetch GB/s", "no-verify", "on/off", "p2p runs (GB/s)");
    for (int bi = 0; bi < o.nblocks; bi++) {
        struct result *r = &res[bi];
        uint64_t bs = r->block = o.blocks[bi], n = o.size / bs;
        char ia[64], ib[64];
        snprintf(ia, sizeof(ia), "a-%llu", (unsigned long long)bs);
        snprintf(ib, sizeof(ib), "b-%llu", (unsigned long long)bs);
        reg(ca, ia, kv_a, n, bs);
        reg(cb, ib, kv_b, (16ull << 20) / bs, bs);
        char iv[64];
        snprintf(iv, sizeof(iv), "v-%llu", (unsigned long long)bs);
        if (vrow)
            reg(cv, iv, kv_v, (16ull << 20) / bs, bs);
        save(ia, bs, 0, 0, n);
        wait_advertised(bs, 0, n);
        for (int k = 0; k < o.reps; k++) {
            cleanup_b();
            if (vrow) {
                cleanup_node(&NV);
                wait_only_a(bs, 0, n);
                if (k % 2 == 1) /* ABBA with the verifying requester */
                    r->nov[k] = (double)o.size / fetch_noverify(cv, kv_v, iv, bs, n, k, &o) / 1e9;
            }
            char req[64];
            snprintf(req, sizeof(req), "tput-%llu-%d", (unsigned long long)bs, k);
            double c = 0, w = 0, m = 0;
            if (!verbs && k % 2 == 1) { /* ABBA: odd rounds measure the raw streams first */
                c = raw_round(o.size, bs, o.qps);
                w = raw_round(o.size, o.size, o.qps);
                m = bs == RAW_SMALL ? c : raw_round(o.size, RAW_SMALL, o.qps);
            }
            double ok0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_total{status=\"ok\"}");
            double d0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_sum");
            uint32_t hits = 0;
            double s = fetch_conc(cb, ib, req, bs, n, o.concurrent, &hits);
            if (hits != n)
                die("%s: %u of %llu blocks fetched", req, hits, (unsigned long long)n);
            if (metric(&NB, np.ip[1], "pegaflow_rdma_fetch_total{status=\"ok\"}") !=
                ok0 + o.concurrent)
                die("%s: not %d successful remote fetch(es)", req, o.concurrent);
            r->p2p[k] = (double)o.size / s / 1e9;
            r->srv[k] = (double)o.size /
                        (metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_sum") - d0) /
                        1e9;
            if (verbs) {
                double v = rv_round(&rawv, o.size, bs);
                if (v <= 0)
                    die("raw verbs READ loop failed");
                r->raw[k] = (double)o.size / v / 1e9;
            } else {
                if (k % 2 == 0) {
                    c = raw_round(o.size, bs, o.qps);
                    w = raw_round(o.size, o.size, o.qps);
                    m = bs == RAW_SMALL ? c : raw_round(o.size, RAW_SMALL, o.qps);
                }
                double best = c < w ? c : w;
                r->raw[k] = (double)o.size / (m < best ? m : best) / 1e9;
            }
            /* every round's fetched blocks, every byte (outside the timed part) */
            verify_on(cb, kv_b, ib, bs, 0, n, bs);
            if (vrow && k % 2 == 0) {
                cleanup_b();
                wait_only_a(bs, 0, n);
                r->nov[k] = (double)o.size / fetch_noverify(cv, kv_v, iv, bs, n, k, &o) / 1e9;
            }
        }
        r->p2p_med = bu_median(r->p2p, o.reps);
        r->raw_med = bu_median(r->raw, o.reps);
        r->srv_med = bu_median(r->srv, o.reps);
        r->nov_med = vrow ? bu_median(r->nov, o.reps) : 0;
        printf("%-6lluk %10.3f %10.3f %7.2f %10.3f %10.3f %7.2f  ", (unsigned long long)(bs >> 10),
               r->p2p_med, r->raw_med, r->p2p_med / r->raw_med, r->srv_med, r->nov_med,
               vrow ? r->p2p_med / r->nov_med : 0.0);
        for (int k = 0; k < o.reps; k++)
            printf(" %.3f", r->p2p[k]);
        printf("\n");
        fflush(stdout);
    }
    if (metric_or(&NB, np.ip[1], "pegaflow_integrity_failures_total{tier=\"remote\"}", -1) != 0)
        die("integrity failures during the benchmark (or the series is missing)");

    /* latency of a 16-block prefix */
    if (verbs)
        printf("method: %d rounds per block size, ABBA with a raw verbs READ loop between the same "
               "two devices; p2p = B's QueryPrefetch Loading -> Ready (discovery, lock, READs, "
               "every slot's checksum verified, sealed); medians\n",
               o.reps);
    else
        printf("method: %d rounds per block size, ABBA with raw TCP: %d parallel streams over the "
               "same veth pair, same huge-page advice, the fastest of block-size, 256 KiB and "
               "single calls; p2p = B's QueryPrefetch Loading -> Ready (discovery, lock, READs, "
               "every slot's checksum verified with --integrity on, sealed); every fetched block "
               "counted, and after every round loaded on the requester and compared byte for byte "
               "with A's; "
               "medians\n",
               o.reps, o.qps);
    double health[50];
    for (int i = 0; i < 50; i++) {
        uint64_t t0 = pf_now_ns();
        pf_client_health(cb, TMO);
        health[i] = (double)(pf_now_ns() - t0) / 1e6;
    }
    double hp50 = bu_median(health, 50);
    printf("\n16-block prefix fetch latency (%d runs each; Health RPC round trip p50 %.3f ms)\n",
           o.lat_reps, hp50);
    printf("%-8s %10s %10s %14s\n", "block", "p50 ms", "p99 ms", "server mean ms");
    for (int bi = 0; bi < o.nblocks; bi++) {
        struct result *r = &res[bi];
        uint64_t bs = r->block;
        char ia[64], ib[64];
        snprintf(ia, sizeof(ia), "a-%llu", (unsigned long long)bs);
        snprintf(ib, sizeof(ib), "b-%llu", (unsigned long long)bs);
        double s0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_sum");
        double c0 = metric(&NB, np.ip[1], "pegaflow_rdma_fetch_duration_seconds_count");
        for (int k = 0; k < o.lat_reps; k++) {
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
        r->lat_p50 = bu_median(r->lat, o.lat_reps);
        r->lat_p99 = bu_pct(r->lat, (size_t)o.lat_reps, 0.99);
        r->lat_srv_ms = c1 > c0 ? (s1 - s0) / (c1 - c0) * 1e3 : 0;
        printf("%-6lluk %10.3f %10.3f %14.3f\n", (unsigned long long)(bs >> 10), r->lat_p50,
               r->lat_p99, r->lat_srv_ms);
    }

    struct miss_result mr;
    pure_miss_bench(&mr);

    FILE *j = fopen(o.json, "w");
    if (j) {
        fprintf(j,
                "{\"tls\":%s,\"concurrent\":%d,\"verify_row\":%s,\"topology\":\"%s\","
                "\"size\":%llu,\"qps_per_peer\":%d,\"seed\":%llu,",
                o.tls ? "true" : "false", o.concurrent, vrow ? "true" : "false",
                verbs   ? "verbs"
                : netns ? "netns-veth"
                        : "loopback",
                (unsigned long long)o.size, o.qps, (unsigned long long)seed);
        fprintf(j, "\"health_rtt_p50_ms\":%.4f,\"throughput\":[", hp50);
        for (int bi = 0; bi < o.nblocks; bi++) {
            struct result *r = &res[bi];
            fprintf(j,
                    "%s{\"block\":%llu,\"p2p_gbps\":%.4f,\"raw_gbps\":%.4f,\"ratio\":%.4f,"
                    "\"fetch_gbps\":%.4f,",
                    bi ? "," : "", (unsigned long long)r->block, r->p2p_med, r->raw_med,
                    r->p2p_med / r->raw_med, r->srv_med);
            fprintf(j, "\"p2p_runs\":[");
            for (int k = 0; k < o.reps; k++)
                fprintf(j, "%s%.4f", k ? "," : "", r->p2p[k]);
            fprintf(j, "],\"raw_runs\":[");
            for (int k = 0; k < o.reps; k++)
                fprintf(j, "%s%.4f", k ? "," : "", r->raw[k]);
            fprintf(j, "]");
            if (vrow) {
                fprintf(j, ",\"p2p_noverify_gbps\":%.4f,\"verify_ratio\":%.4f,\"noverify_runs\":[",
                        r->nov_med, r->p2p_med / r->nov_med);
                for (int k = 0; k < o.reps; k++)
                    fprintf(j, "%s%.4f", k ? "," : "", r->nov[k]);
                fprintf(j, "]");
            }
            fprintf(j, "}");
        }
        fprintf(j, "],\"latency_16_blocks\":[");
        for (int bi = 0; bi < o.nblocks; bi++) {
            struct result *r = &res[bi];
            fprintf(j,
                    "%s{\"block\":%llu,\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"server_mean_ms\":%.4f,"
                    "\"runs_ms\":[",
                    bi ? "," : "", (unsigned long long)r->block, r->lat_p50, r->lat_p99,
                    r->lat_srv_ms);
            for (int k = 0; k < o.lat_reps; k++)
                fprintf(j, "%s%.4f", k ? "," : "", r->lat[k]);
            fprintf(j, "]}");
        }
        fprintf(j,
                "],\"pure_miss\":{\"hashes\":%d,\"runs\":%d,\"p2p_p50_us\":%.1f,"
                "\"p2p_p99_us\":%.1f,\"plain_p50_us\":%.1f,\"plain_p99_us\":%.1f,"
                "\"ratio\":%.4f}}\n",
                MISS_HASHES, mr.reps, mr.p2p_p50_us, mr.p2p_p99_us, mr.plain_p50_us,
                mr.plain_p99_us, mr.p2p_p50_us / mr.plain_p50_us);
        fclose(j);
        printf("\nJSON: %s\n", o.json);
    }
    pf_client_close(ca);
    pf_client_close(cb);
    if (cv)
        pf_client_close(cv);
    if (kv_v)
        pf_simkv_destroy(kv_v);
    pf_simkv_destroy(kv_a);
    pf_simkv_destroy(kv_b);
    kill_all();
    if (verbs)
        rv_close(&rawv);
    return 0;
}

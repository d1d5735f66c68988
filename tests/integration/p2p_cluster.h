/* The cluster p2p_e2e drives: node processes (MetaServer, servers A/B/C, a second replica,
 * redis-server) started in their namespaces from the environment p2p_netns.sh sets, their
 * metrics and logs, and the KV worlds and MetaServer probes the scenarios share.
 * Header-only (static functions), included once by p2p_e2e.c after its system headers. */
#ifndef PF_TEST_P2P_CLUSTER_H
#define PF_TEST_P2P_CLUSTER_H

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
 * port gport/0 of the node's IP; the security flags with PF_P2P_SECURITY_DIR, else the run's
 * --cluster-token-file PF_CLUSTER_TOKEN_FILE) and waits for its "ready" line. */
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
    } else if (getenv("PF_CLUSTER_TOKEN_FILE")) {
        /* protected by default: the run's token (p2p_netns.sh, pf_cluster_token) */
        snprintf(sec[0], sizeof(sec[0]), "--cluster-token-file=%s",
                 token_override ? token_override : getenv("PF_CLUSTER_TOKEN_FILE"));
        argv[k++] = sec[0];
        if (getenv("PF_ADMIN_TOKEN_FILE") && strcmp(bin, "pegaflow-server") == 0) {
            /* POSTs from the test (outside the node's namespace) carry this token (pft_http) */
            snprintf(sec[1], sizeof(sec[1]), "--admin-token-file=%s",
                     getenv("PF_ADMIN_TOKEN_FILE"));
            argv[k++] = sec[1];
        }
    }
    /* The query-time MetaServer lookup's deadline (--p2p-plan-timeout-ms, 50 ms by default)
     * is not what these scenarios test (unit/engine/test_plan and unit/p2p/test_fetch do):
     * give it room so a loaded CI machine or the TCG rxe guest still plans the remote tier
     * (unless the scenario gives its own) */
    bool own_plan_tmo = false;
    for (size_t i = 0; args && args[i]; i++)
        own_plan_tmo |= strncmp(args[i], "--p2p-plan-timeout-ms", 21) == 0;
    if (strcmp(bin, "pegaflow-server") == 0 && !own_plan_tmo)
        argv[k++] = "--p2p-plan-timeout-ms=3000";
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

/* gRPC port of the next start_node (0: any; a restart on the same address sets it) */
static int next_node_port;

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
    spawn(n, "pegaflow-server", next_node_port, args);
    next_node_port = 0;
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
    for (size_t i = 0; i < n; i++)
        hash_of(h0 + i, hs + i * HLEN);
    long v = pft_meta_prefix(ch, ns, hs, HLEN, n, node_addr, NULL, 3000);
    free(hs);
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

#endif

/* bench/p2p's environment (included by p2p.c, which owns the options and the phases): the
 * MetaServer and pegaflow-server children, each in its network namespace when there is one,
 * started with their logs in logdir and waited for until ready; die() (kills every child,
 * removes the namespaces, exits); /metrics reads and per-process CPU seconds; the
 * MetaServer's view of A's blocks (advertised, no other holder); the raw baseline, a forked
 * sender in A's namespace streaming --size bytes of seeded random data over N parallel TCP
 * connections into this process's buffer; and the set-up phases (topology, raw sender, TLS
 * PKI, nodes). */
#ifndef PF_BENCH_P2P_ENV_H
#define PF_BENCH_P2P_ENV_H

static struct pft_netpair np;
static uint64_t seed;

/* ------------------------------------------------------------------ processes */

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

/* CPU seconds used so far by pid, in nanoseconds of run time: this process (pid 0) from
 * CLOCK_PROCESS_CPUTIME_ID (its exited threads included), another one as the sum of its
 * threads' /proc/PID/task/TID/schedstat (the servers' threads live as long as they do; the
 * raw sender has one). Clock ticks (10 ms) would be too coarse for one round. */
static double proc_cpu_s(pid_t pid)
{
    if (!pid) {
        struct timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    double ns = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char sp[384];
        snprintf(sp, sizeof(sp), "%s/%s/schedstat", path, e->d_name);
        FILE *f = fopen(sp, "r");
        unsigned long long run = 0;
        if (f && fscanf(f, "%llu", &run) == 1)
            ns += (double)run;
        if (f)
            fclose(f);
    }
    closedir(d);
    return ns / 1e9;
}

/* The nodes' TLS flags with --tls (8 entries, NULL-terminated), else empty. */
static const char *tls_flags[9];

/* ------------------------------------------------------------------ the MetaServer's view */

/* The 32-byte hash of block i of a block-size series (space). */
static void hash_of(uint64_t space, uint64_t i, uint8_t *h)
{
    pft_fill(h, HLEN, seed, space << 32 | i);
}

/* Prefix the MetaServer lists for A over [h0, h0+n); *others_p (optional) the longest
 * prefix it lists for any other node. */
static long meta_prefix2(uint64_t space, uint64_t h0, size_t n, long *others_p)
{
    static struct pf_rpc_channel *ch;
    if (!ch && pf_rpc_channel_open(MS.addr, &ch))
        die("channel");
    uint8_t *hs = malloc(n * HLEN);
    for (size_t i = 0; i < n; i++)
        hash_of(space, h0 + i, hs + i * HLEN);
    long v = pft_meta_prefix(ch, NSTR, hs, HLEN, n, NA.addr, others_p, 5000);
    free(hs);
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

/* ------------------------------------------------------------------ set-up */

/* The topology and which rows run. */
struct topo {
    bool verbs, netns, vrow;
    const char *nic_a, *nic_b; /* the nodes' --nics */
};

/* Seed, log directory, cluster token, signals and the topology (namespaces + veth as root,
 * else loopback; verbs: the given devices). */
static void setup(const struct opts *o, struct topo *R)
{
    seed = pft_seed();
    snprintf(logdir, sizeof(logdir), "/tmp/pf-bench-p2p.XXXXXX");
    if (!mkdtemp(logdir))
        exit(1);
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
    R->verbs = strcmp(o->backend, "verbs") == 0;
    R->netns =
        !R->verbs && !o->loopback && geteuid() == 0 && pft_netpair_setup(&np, "pfp2p", 214) == 0;
    R->nic_a = np.ip[0];
    R->nic_b = np.ip[1];
    if (R->verbs) {
        snprintf(np.ip[0], sizeof(np.ip[0]), "%.*s", (int)sizeof(np.ip[0]) - 1, o->addrs[0]);
        snprintf(np.ip[1], sizeof(np.ip[1]), "%.*s", (int)sizeof(np.ip[1]) - 1, o->addrs[1]);
        R->nic_a = o->nics[0];
        R->nic_b = o->nics[1];
    } else if (R->netns) {
        NA.ns = MS.ns = np.ns[0];
        NB.ns = np.ns[1];
        R->nic_a = np.veth[0];
        R->nic_b = np.veth[1];
    } else {
        snprintf(np.ip[0], sizeof(np.ip[0]), "127.0.0.2");
        snprintf(np.ip[1], sizeof(np.ip[1]), "127.0.0.3");
    }
    char szs[32];
    pf_format_size(o->size, szs, sizeof(szs));
    char topo[200];
    snprintf(topo, sizeof(topo), "verbs %s (A, %s) -> %s (B, %s), raw verbs READ baseline",
             R->nic_a, np.ip[0], R->nic_b, np.ip[1]);
    printf("p2p bench: %s, %s per fetch, blocks",
           R->verbs   ? topo
           : R->netns ? "two namespaces + veth"
                      : "loopback",
           szs);
    for (int i = 0; i < o->nblocks; i++)
        printf(" %lluk", (unsigned long long)(o->blocks[i] >> 10));
    printf(", %d rounds, %d QP(s) per peer, logs %s\n", o->reps, o->qps, logdir);
    fflush(stdout);
}

/* The raw TCP sender, forked into A's namespace; waits for its port. */
static void start_raw_sender(const struct opts *o)
{
    int ctl[2];
    if (pipe(ctl))
        die("pipe: %s", strerror(errno));
    raw_pid = fork();
    if (raw_pid == 0) {
        close(ctl[0]);
        raw_sender(ctl[1], o->size);
    }
    close(ctl[1]);
    if (pft_read_full(ctl[0], &raw_port, sizeof(raw_port)))
        die("raw sender did not start");
    close(ctl[0]);
}

/* --tls: a fresh test PKI; flags[0..8) the nodes' TLS flags (NULL-terminated, else empty). */
static void setup_tls(const struct opts *o)
{
    const char **flags = tls_flags;
    static char crt[300], key[300], cafile[300];
    memset(flags, 0, 9 * sizeof(flags[0]));
    if (!o->tls)
        return;
    char cmd[1200];
    const char *top = getenv("PF_TOP") ? getenv("PF_TOP") : ".";
    snprintf(cmd, sizeof(cmd),
             "bash -c '. \"%s/tests/integration/certs.sh\" && make_certs \"%s/pki\" "
             "node=%s,%s' >/dev/null 2>&1",
             top, logdir, np.ip[0], np.ip[1]);
    if (system(cmd) != 0)
        die("--tls: certs.sh failed (openssl installed? PF_TOP=%s)", top);
    snprintf(crt, sizeof(crt), "%s/pki/node.crt", logdir);
    snprintf(key, sizeof(key), "%s/pki/node.key", logdir);
    snprintf(cafile, sizeof(cafile), "%s/pki/ca.crt", logdir);
    /* the nodes: this client registers from the other namespace (locality rule with TLS) */
    const char *f[] = {"--tls-cert", crt,    "--tls-key",    key,
                       "--tls-ca",   cafile, "--local-rpcs", "any"};
    memcpy(flags, f, sizeof(f));
    setenv("PEGAFLOW_TLS_CA", cafile, 1);
    setenv("PEGAFLOW_TLS_CERT", crt, 1);
    setenv("PEGAFLOW_TLS_KEY", key, 1);
    struct pf_auth_env env;
    struct pf_rpc_channel_opts co;
    char err[256];
    if (pf_auth_env_load(&env, &co, err, sizeof(err)) ||
        pf_rpc_set_default_channel_opts(&co)) /* the MetaServer probes' channel */
        die("--tls: %s", err);
    pf_auth_env_free(&env);
    printf("TLS: gRPC and the TCP fabric with a test PKI in %s/pki\n", logdir);
}

/* The MetaServer, A, B and (verification row) B's --integrity off twin. */
static void start_nodes(const struct opts *o, struct topo *R)
{
    setup_tls(o);
    const char **tls = tls_flags;
    /* the nodes' optional flags: TLS (8 entries or none), then the plan deadline */
    const char *extra[11] = {NULL};
    size_t nf = 0;
    for (; tls[nf]; nf++)
        extra[nf] = tls[nf];
    if (o->plan_ms) {
        extra[nf++] = "--p2p-plan-timeout-ms";
        extra[nf++] = o->plan_ms;
    }
    char pool[32], qps[8], meta[96];
    pf_format_size(o->size + (64ull << 20), pool, sizeof(pool));
    snprintf(qps, sizeof(qps), "%d", o->qps);
    const char *ms_args[] = {
        "--node-stale-secs", "30", tls[0], tls[1], tls[2], tls[3], tls[4], tls[5], NULL};
    spawn(&MS, "pegaflow-metaserver", np.ip[0], ms_args);
    snprintf(meta, sizeof(meta), "http://%s", MS.addr);
    const char *args[32] = {
        "--gpu-backend",  "sim",    "--sim-gpus",    "1",         "--pool-size",       pool,
        "--nics",         R->nic_a, "--net-backend", o->backend,  "--metaserver-addr", meta,
        "--qps-per-peer", qps,      "--integrity",   o->integrity};
    size_t na = 16;
    for (size_t i = 0; i < nf; i++)
        args[na++] = extra[i];
    spawn(&NA, "pegaflow-server", np.ip[0], args);
    args[7] = R->nic_b;
    spawn(&NB, "pegaflow-server", np.ip[1], args);
    R->vrow = o->verify_row && strcmp(o->integrity, "on") == 0;
    if (R->vrow) { /* the same requester with verification off, next to B */
        args[15] = "off";
        NV.ns = NB.ns;
        spawn(&NV, "pegaflow-server", np.ip[1], args);
    }
}

#endif

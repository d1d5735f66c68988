/* p2p_e2e's redis scenario (see p2p_e2e.c): MetaServer replicas on one redis-server.
 * Header-only, included once by p2p_e2e.c after p2p_cluster.h. */
#ifndef PF_TEST_P2P_REDIS_H
#define PF_TEST_P2P_REDIS_H

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

#endif

/* bench/p2p's pure-miss row (issue 24): QueryPrefetch of 4096 hashes nobody holds on B (a P2P
 * node with a MetaServer session: its query-time plan asks the MetaServer once, with the
 * --p2p-plan-timeout-ms deadline) against the same query on a node without P2P in the same
 * namespace, alternating (ABBA), each answered Ready(0) at once (checked). Target: p50 ratio
 * <= 1.3. Included by p2p.c after its helpers. */
#ifndef PF_BENCH_P2P_MISS_H
#define PF_BENCH_P2P_MISS_H

#define MISS_HASHES 4096
#define MISS_REPS   200

struct miss_result {
    double p2p_p50_us, p2p_p99_us, plain_p50_us, plain_p99_us;
    int reps;
};

static double miss_query_us(struct pf_client *c, const char *inst, const uint8_t *hs, int k)
{
    char req[48];
    snprintf(req, sizeof(req), "miss-%d", k);
    struct pf_query_result r;
    uint64_t t0 = pf_now_ns();
    if (pf_client_query(c, inst, req, hs, NULL, HLEN, MISS_HASHES, 0, 0, &r, NULL, 0, TMO))
        die("pure-miss query: %s", pf_last_error_message());
    double us = (double)(pf_now_ns() - t0) / 1e3;
    if (r.loading || r.num_hit_blocks != 0)
        die("a pure miss of %d hashes answered %s with %u hits (want Ready(0) at once)",
            MISS_HASHES, r.loading ? "Loading" : "Ready", r.num_hit_blocks);
    return us;
}

static void pure_miss_bench(struct miss_result *m)
{
    const char *args[16] = {"--gpu-backend", "sim", "--sim-gpus", "1", "--pool-size", "64mb"};
    for (size_t i = 0; tls_flags[i]; i++) /* --tls: this client speaks TLS to every node */
        args[6 + i] = tls_flags[i];
    NP.ns = NB.ns;
    spawn(&NP, "pegaflow-server", np.ip[1], args);
    struct pf_client *cp;
    if (pf_client_connect(NP.addr, &cp))
        die("connect %s", NP.addr);
    reg(cp, "miss-plain", kv_b, 16, 1 << 20);
    reg(cb, "miss-p2p", kv_b, 16, 1 << 20);
    uint8_t *hs = malloc((size_t)MISS_HASHES * HLEN);
    for (int i = 0; i < MISS_HASHES; i++)
        hash_of(0xfeed, (uint64_t)i, hs + (size_t)i * HLEN);
    static double a[MISS_REPS], b[MISS_REPS];
    for (int k = 0; k < 20; k++) { /* warm both channels and servers */
        miss_query_us(cb, "miss-p2p", hs, -1 - k);
        miss_query_us(cp, "miss-plain", hs, -1 - k);
    }
    for (int k = 0; k < MISS_REPS; k++) {
        if (k % 2) {
            b[k] = miss_query_us(cp, "miss-plain", hs, k);
            a[k] = miss_query_us(cb, "miss-p2p", hs, k);
        } else {
            a[k] = miss_query_us(cb, "miss-p2p", hs, k);
            b[k] = miss_query_us(cp, "miss-plain", hs, k);
        }
    }
    m->reps = MISS_REPS;
    m->p2p_p50_us = bu_median(a, MISS_REPS);
    m->p2p_p99_us = bu_pct(a, MISS_REPS, 0.99);
    m->plain_p50_us = bu_median(b, MISS_REPS);
    m->plain_p99_us = bu_pct(b, MISS_REPS, 0.99);
    free(hs);
    pf_client_close(cp);
    printf("\npure miss: QueryPrefetch of %d hashes nobody holds, %d runs each, ABBA, Ready(0) "
           "at once checked\n",
           MISS_HASHES, MISS_REPS);
    printf("%-28s %10s %10s\n", "node", "p50 us", "p99 us");
    printf("%-28s %10.0f %10.0f\n", "B (P2P, MetaServer)", m->p2p_p50_us, m->p2p_p99_us);
    printf("%-28s %10.0f %10.0f\n", "without P2P", m->plain_p50_us, m->plain_p99_us);
    printf("ratio p50 %.2f (target <= 1.3)\n", m->p2p_p50_us / m->plain_p50_us);
    fflush(stdout);
}

#endif

/* The "plan" scenario of p2p_e2e.c (issue 24 items 1-5, docs/p2p.md "The plan"): A and C
 * hold blocks, B (with an SSD tier when io_uring works) asks.
 *   - a pure miss on the P2P node B is answered Ready(0) at the first QueryPrefetch;
 *   - 48 asked, 32 held by A: B's plan counts rdma 32 and miss 16, 32 are delivered, the
 *     load is byte-exact, nothing is counted short;
 *   - wait_for_full_prefix on a prefix on B's own SSD (RAM emptied): Loading, and once B counts
 *     the SSD delivery the next poll is Ready with every block, byte-exact; no peer polled;
 *   - A and C hold the same blocks, A (ranked first) killed -9: C serves every block;
 *   - C stopped (SIGSTOP) with every remote prefetch thread of B waiting on it: B's own SSD
 *     hit for another request is Ready before any of those fetches ended.
 * Included by p2p_e2e.c after its helpers. */
#ifndef PF_TEST_P2P_PLAN_H
#define PF_TEST_P2P_PLAN_H

static double tier_req(struct node *n, const char *tier)
{
    char s[128];
    snprintf(s, sizeof(s), "pegaflow_cache_tier_block_requests_total{tier=\"%s\"}", tier);
    return node_metric(n, s);
}

static double tier_deliv(struct node *n, const char *tier)
{
    char s[128];
    snprintf(s, sizeof(s), "pegaflow_cache_tier_blocks_delivered_total{tier=\"%s\"}", tier);
    return node_metric(n, s);
}

static double rdma_fetches(struct node *n)
{
    return node_metric(n, "pegaflow_rdma_fetch_total{status=\"ok\"}") +
           node_metric(n, "pegaflow_rdma_fetch_total{status=\"partial\"}") +
           node_metric(n, "pegaflow_rdma_fetch_total{status=\"error\"}") +
           node_metric(n, "pegaflow_rdma_fetch_total{status=\"timeout\"}");
}

/* Waits until B's SSD wrote at least `bytes` more than `before` and has nothing pending. */
static void wait_ssd_written(struct node *n, double before, double bytes)
{
    wait_metric(n, "pegaflow_ssd_write_bytes_total", before + bytes, true, 20000);
    wait_metric(n, "pegaflow_ssd_write_queue_pending", 0, false, 20000);
    wait_metric(n, "pegaflow_ssd_write_inflight", 0, false, 20000);
}

static void sc_plan(void)
{
    char dir[512] = "", ssd[600] = "";
    const char *logdir = getenv("PF_TEST_LOGDIR");
    snprintf(dir, sizeof(dir), "%s/plan-ssd.XXXXXX", logdir ? logdir : "/tmp");
    bool with_ssd = io_uring_usable() && mkdtemp(dir) != NULL;
    if (!with_ssd)
        fprintf(stderr, "    SKIP (the own-SSD parts): io_uring is not usable here\n");
    snprintf(ssd, sizeof(ssd), "%s/b.dat", dir);
    const char *ssd_args[] = {"--ssd-cache-path", ssd, "--ssd-cache-capacity", "64mb", NULL};
    start_ms(0, "30");
    start_node(&NA, NULL);
    start_node(&NB, with_ssd ? ssd_args : NULL);
    start_node(&NC, NULL);
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB), *cc = connect_to(&NC);
    struct world wa, wb, wc;
    pworld(&wa, "inst-A", 1, 1, 160, SEG, 21, true);
    pworld(&wb, "inst-B", 1, 1, 160, SEG, 22, true);
    pworld(&wc, "inst-C", 1, 1, 160, SEG, 21, true); /* C's bytes are A's */
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_register(cc, &wc);

    /* 1. a pure miss: Ready(0) at the first answer */
    int loading = -1;
    struct pf_query_result r =
        query_until_ready(cb, wb.id, "plan-miss", 90000, 256, 0, 10000, &loading);
    PFT_CHECK(r.num_hit_blocks == 0 && loading == 0,
              "pure miss on a P2P node: %u hits after %d Loading answer(s), want Ready(0) at once",
              r.num_hit_blocks, loading);
    fprintf(stderr, "    plan-miss: 256 hashes nobody holds: Ready(0) at the first answer\n");

    /* 2. 48 asked, 32 on A */
    world_save_ok(ca, &wa, 100, 0, 32);
    wait_meta(NA.p.addr, 100, 32, 32, 20000);
    double rd = tier_req(&NB, "rdma"), mi = tier_req(&NB, "miss"), ra = tier_req(&NB, "ram"),
           dr = tier_deliv(&NB, "rdma");
    fetch_check(cb, &wb, "plan-48", 100, 48, 0, &wa, 0, 0, 32, 30000);
    PFT_CHECK(tier_req(&NB, "rdma") - rd == 32, "rdma +%g, want +32", tier_req(&NB, "rdma") - rd);
    PFT_CHECK(tier_req(&NB, "miss") - mi == 16, "miss +%g, want +16", tier_req(&NB, "miss") - mi);
    PFT_CHECK(tier_req(&NB, "ram") - ra == 0, "ram +%g, want +0", tier_req(&NB, "ram") - ra);
    PFT_CHECK(tier_deliv(&NB, "rdma") - dr == 32, "delivered rdma +%g, want +32",
              tier_deliv(&NB, "rdma") - dr);
    fprintf(stderr, "    plan-48: requested rdma +32, miss +16; delivered rdma +32\n");

    /* 3. wait_for_full_prefix on B's own SSD */
    if (with_ssd) {
        /* the blocks B fetched in 2. were offered to its SSD too: let those writes finish */
        wait_ssd_written(&NB, 0, 0);
        double w0 = node_metric(&NB, "pegaflow_ssd_write_bytes_total");
        world_save_ok(cb, &wb, 300, 40, 28); /* 300..315 for 3., 320..327 for 5. */
        wait_ssd_written(&NB, w0, 28.0 * 2 * SEG);
        char *body = NULL;
        PFT_CHECK(
            pft_http(NB.p.http_host, NB.p.http_port, "POST", "/cache/memory/cleanup", &body) == 200,
            "B: memory cleanup: %s", body ? body : "");
        free(body);
        double ds = tier_deliv(&NB, "ssd"), polls0 = rdma_fetches(&NB);
        struct pf_query_result w;
        PFT_CHECK(query_wf(cb, wb.id, "plan-own", 300, 16, 1, &w) == 0, "plan-own: %s",
                  pf_last_error_message());
        int answers = 1;
        if (w.loading) {
            /* the SSD run is done when B counts it; the next poll must then be Ready */
            wait_metric(&NB, "pegaflow_cache_tier_blocks_delivered_total{tier=\"ssd\"}", ds + 16,
                        true, 20000);
            PFT_CHECK(query_wf(cb, wb.id, "plan-own", 300, 16, 1, &w) == 0, "plan-own: %s",
                      pf_last_error_message());
            answers++;
        }
        PFT_CHECK(!w.loading && w.num_hit_blocks == 16,
                  "plan-own: %s with %u hits at answer %d, want Ready(16) at the first or second",
                  w.loading ? "Loading" : "Ready", w.num_hit_blocks, answers);
        world_load_ok(cb, &wb, w.lease, 16, 80);
        compare(&wb, 40, &wb, 80, 16);
        PFT_CHECK(rdma_fetches(&NB) == polls0, "plan-own: a peer was asked");
        fprintf(stderr,
                "    plan-own: wait_for_full_prefix from B's own SSD: Ready(16) at answer %d, "
                "byte-exact, no peer asked\n",
                answers);
    }

    /* 4. two holders, the best killed -9: the second serves every block */
    world_save_ok(ca, &wa, 700, 50, 16);
    world_save_ok(cc, &wc, 700, 50, 16);
    wait_meta(NA.p.addr, 700, 16, 16, 20000);
    wait_meta(NC.p.addr, 700, 16, 16, 20000);
    /* equal prefixes and loads rank by address: A before C */
    PFT_CHECK(strcmp(NA.p.addr, NC.p.addr) < 0, "A (%s) must rank before C (%s)", NA.p.addr,
              NC.p.addr);
    stop(&NA, SIGKILL);
    fprintf(stderr, "    A killed (SIGKILL); the MetaServer still lists it\n");
    fetch_check(cb, &wb, "plan-two", 700, 16, 0, &wc, 50, 96, 16, 30000);
    char tried[256];
    snprintf(tried, sizeof(tried), "prefetch plan-two: holder %s delivered 0 of 16", NA.p.addr);
    PFT_CHECK(pft_log_contains(&NB.p, tried), "B never tried A first ('%s')", tried);
    fprintf(stderr, "    plan-two: A failed, C served all 16 blocks byte-exact\n");

    /* 5. C stopped: every remote prefetch thread of B waits on it; B's own SSD hit of
     * another request is Ready before any of those fetches ended */
    if (with_ssd) {
        world_save_ok(cc, &wc, 500, 0, 10);
        wait_meta(NC.p.addr, 500, 10, 10, 20000);
        double f0 = rdma_fetches(&NB);
        kill(NC.p.pid, SIGSTOP);
        char req[32];
        for (int i = 0; i < 5; i++) { /* 4 remote threads and one queued behind them */
            snprintf(req, sizeof(req), "plan-slow%d", i);
            struct pf_query_result s;
            PFT_CHECK(query_wf(cb, wb.id, req, 500 + 2 * (uint64_t)i, 2, 0, &s) == 0 && s.loading,
                      "%s must answer Loading (C holds it)", req);
        }
        fetch_check(cb, &wb, "plan-ssd", 320, 8, 0, &wb, 60, 112, 8, 20000);
        double f1 = rdma_fetches(&NB);
        kill(NC.p.pid, SIGCONT);
        PFT_CHECK(f1 == f0, "B's SSD hit waited for %g stalled peer fetch(es)", f1 - f0);
        fprintf(stderr, "    plan-ssd: Ready from B's SSD while C was stopped and every remote "
                        "prefetch thread waited on it\n");
        for (int i = 0; i < 5; i++) {
            snprintf(req, sizeof(req), "plan-slow%d", i);
            fetch_check(cb, &wb, req, 500 + 2 * (uint64_t)i, 2, 0, &wc, 2 * (uint32_t)i,
                        120 + 2 * (uint32_t)i, -1, 30000);
        }
    }
    pf_client_close(ca);
    pf_client_close(cb);
    pf_client_close(cc);
    stop_all();
    world_free(&wa);
    world_free(&wb);
    world_free(&wc);
}

#endif

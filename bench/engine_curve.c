/* bench/engine_curve: how the engine's cost grows with the number of resident blocks.
 * At each point of --points (default 10^4, 10^5, 10^6, 10^7 resident blocks of --block-size
 * bytes, 64 B by default: the curve is of per-block bookkeeping, not of bytes):
 *   - Save RPC latency (p50 / p99 over --iters calls of --save-batch new blocks; these calls
 *     are the last blocks that bring the count to the point),
 *   - QueryPrefetch latency of 1 and of 4096 resident hashes (p50 / p99 over --iters calls,
 *     every hash a hit, checked),
 *   - server memory per resident block: RSS delta since before the first measured block /
 *     blocks (the pool is pre-touched at start, so this is bookkeeping, not block bytes),
 *   - the fill rate (blocks/s until the point's last block is queryable).
 * Points go up in order, adding blocks; one warm-up Save of --fill-batch blocks (so the RPC
 * threads' buffers exist) precedes the first RSS reading and stays resident. Before each point
 * the memory it needs is estimated from the last point's bytes per block (x1.5, plus the
 * blocks' bytes) against MemAvailable less --reserve (default 4 GiB: other work shares the
 * machine), and its time from the last fill rate against what is left of --budget seconds.
 * The first point that does not fit ends the curve: the JSON names it ("stopped_at") and why.
 * Evictions end the measurement with an error (the pool is sized for the largest point).
 * Usage: engine_curve [--points N,N,...] [--block-size B] [--iters N] [--save-batch N]
 *                     [--fill-batch N] [--reserve SIZE] [--budget SECONDS] [--json FILE]
 * The server runs as a separate process ($PF_BIN/pegaflow-server), with its default flags. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "pftest.h"
#include "benchutil.h"

#define TMO        120000
#define MAX_POINTS 16
#define TAG        11
#define REGION     16384 /* registered blocks; block ids wrap: every save has a new hash */

struct curve {
    uint64_t points[MAX_POINTS];
    int npoints;
    uint64_t bs, reserve;
    int iters;
    long save_batch, fill_batch;
    double budget;
    const char *json, *points_arg;
    struct pft_proc s;
    struct pf_client *c;
    struct pf_simkv *kv;
    uint64_t have; /* measured blocks saved so far (after the warm-up) */
    long rss0_kb;
    double t0, ev0;
};

static void parse(int argc, char **argv, struct curve *k)
{
    *k = (struct curve){.bs = 64,
                        .reserve = 4ull << 30,
                        .iters = 50,
                        .save_batch = 64,
                        .fill_batch = 4096,
                        .budget = 150,
                        .points_arg = "10000,100000,1000000,10000000"};
    const char *usage = "engine_curve [--points N,N,...] [--block-size B] [--iters N] "
                        "[--save-batch N] [--fill-batch N] [--reserve SIZE] [--budget SECONDS] "
                        "[--json FILE]";
    const struct bu_opt opts[] = {{"--points", BU_STR, &k->points_arg},
                                  {"--block-size", BU_SIZE, &k->bs},
                                  {"--iters", BU_INT, &k->iters},
                                  {"--save-batch", BU_LONG, &k->save_batch},
                                  {"--fill-batch", BU_LONG, &k->fill_batch},
                                  {"--reserve", BU_SIZE, &k->reserve},
                                  {"--budget", BU_DOUBLE, &k->budget},
                                  {"--json", BU_STR, &k->json},
                                  {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, usage);
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", k->points_arg);
    uint64_t last = 0;
    for (char *sv, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
        char *end;
        double v = strtod(t, &end);
        if (*end || v < 1 || k->npoints == MAX_POINTS || (uint64_t)v <= last) {
            fprintf(stderr, "--points: increasing block counts, at most %d\nusage: %s\n",
                    MAX_POINTS, usage);
            exit(2);
        }
        last = k->points[k->npoints++] = (uint64_t)v;
    }
    if (!k->npoints || k->iters < 3 || k->save_batch < 1 || k->fill_batch < 1 || k->bs < 16 ||
        k->budget <= 0) {
        fprintf(stderr, "bad parameters (iters >= 3, batches >= 1, block size >= 16)\nusage: %s\n",
                usage);
        exit(2);
    }
}

/* The server with a pool for the largest point (x1.25) and one registered layer. */
static void start(struct curve *k)
{
    uint64_t top = k->points[k->npoints - 1] + (uint64_t)k->fill_batch;
    char pool[32];
    snprintf(pool, sizeof(pool), "%llumb",
             (unsigned long long)(((top * k->bs) * 5 / 4 >> 20) + 256));
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", pool, "--log-level", "info", NULL};
    if (pft_start(&k->s, "pegaflow-server", "127.0.0.1", args))
        exit(1);
    if (pf_client_connect(k->s.addr, &k->c))
        bu_die("engine_curve", "connect");
    if (pf_simkv_create(REGION * k->bs, 0, &k->kv))
        bu_die("engine_curve", "simkv");
    pft_fill(pf_simkv_ptr(k->kv), REGION * k->bs, 5, 5);
    if (bu_register(k->c, "curve", "bench", k->kv, REGION, k->bs, TMO))
        bu_die("engine_curve", "register");
    /* warm-up: one Save of the fill size (its own hashes, series TAG + 1), resident */
    bu_save_range(k->c, "curve", TAG + 1, 0, (uint64_t)k->fill_batch, (uint64_t)k->fill_batch,
                  REGION, TMO, NULL);
    bu_wait_resident(k->c, "curve", TAG + 1, 0, (uint64_t)k->fill_batch, TMO);
    k->rss0_kb = bu_rss_kb(k->s.pid);
    k->ev0 = bu_metric(&k->s, "pegaflow_cache_block_evictions_total");
    if (k->ev0 < 0)
        bu_die("engine_curve", "no pegaflow_cache_block_evictions_total in /metrics");
    k->t0 = bu_now();
}

/* Why point n cannot be measured (a sentence in why), or 0 when it fits. */
static int does_not_fit(const struct curve *k, uint64_t n, double per_block, double fill_rate,
                        char *why, size_t len)
{
    double add = (double)(n - k->have);
    double need = add * (per_block * 1.5 + (double)k->bs);
    double avail = bu_mem_available() - (double)k->reserve;
    if (per_block > 0 && need > avail) {
        snprintf(why, len,
                 "memory: %llu blocks need ~%.1f GiB more (%.0f B a block measured), "
                 "MemAvailable less the %.0f GiB reserve is %.1f GiB",
                 (unsigned long long)n, need / (1 << 30), per_block, (double)k->reserve / (1 << 30),
                 avail / (1 << 30));
        return 1;
    }
    double left = k->budget - (bu_now() - k->t0);
    if (fill_rate > 0 && add / fill_rate > left) {
        snprintf(why, len,
                 "time: %llu blocks need ~%.0f s more at the measured %.0f blocks/s, %.0f s of "
                 "the %.0f s budget left",
                 (unsigned long long)n, add / fill_rate, fill_rate, left < 0 ? 0 : left, k->budget);
        return 1;
    }
    return 0;
}

/* p50 / p99 (microseconds) of the query of `hashes` resident hashes, iters calls. */
static void query_lat(struct curve *k, uint64_t hashes, double *lat, double out[2])
{
    for (int i = 0; i < k->iters; i++) {
        uint64_t first = ((uint64_t)i * 7919) % (k->have - hashes + 1);
        if (bu_query_n(k->c, "curve", TAG, first, hashes, NULL, &lat[i], TMO) != hashes)
            bu_die("engine_curve", "query missed resident blocks");
    }
    out[0] = bu_median(lat, k->iters) * 1e6;
    out[1] = bu_pct(lat, (size_t)k->iters, 0.99) * 1e6;
}

/* Brings the measured blocks to n (the last iters x save_batch of them timed one Save call
 * at a time) and measures the point; returns its JSON object. */
static cJSON *point(struct curve *k, uint64_t n, double *per_block_p, double *fill_rate_p)
{
    uint64_t timed = (uint64_t)k->iters * (uint64_t)k->save_batch;
    if (timed > n - k->have)
        timed = 0; /* too few new blocks for the timed saves: fill only */
    uint64_t fill = n - k->have - timed;
    double *lat = malloc((size_t)k->iters * sizeof(double));
    double s[2] = {0, 0}, t = bu_now();
    bu_save_range(k->c, "curve", TAG, k->have, fill, (uint64_t)k->fill_batch, REGION, TMO, NULL);
    if (timed) {
        bu_save_range(k->c, "curve", TAG, k->have + fill, timed, (uint64_t)k->save_batch, REGION,
                      TMO, lat);
        s[0] = bu_median(lat, k->iters) * 1e6;
        s[1] = bu_pct(lat, (size_t)k->iters, 0.99) * 1e6;
    }
    bu_wait_resident(k->c, "curve", TAG, k->have, n - k->have, TMO);
    *fill_rate_p = (double)(n - k->have) / (bu_now() - t);
    k->have = n;
    long rss = bu_rss_kb(k->s.pid);
    if (bu_metric(&k->s, "pegaflow_cache_block_evictions_total") != k->ev0)
        bu_die("engine_curve", "evictions during the curve (the pool is too small)");
    *per_block_p = (double)(rss - k->rss0_kb) * 1024.0 / (double)n;
    double q1[2], q4k[2];
    uint64_t qn = n < 4096 ? n : 4096;
    query_lat(k, 1, lat, q1);
    query_lat(k, qn, lat, q4k);
    free(lat);
    printf("%12llu %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.0f %12.0f\n",
           (unsigned long long)n, s[0], s[1], q1[0], q1[1], q4k[0], q4k[1], *per_block_p,
           *fill_rate_p);
    fflush(stdout);
    cJSON *o = bu_json_obj(NULL, NULL);
    bu_json_num(o, "blocks", (double)n);
    bu_json_num(o, "save_batch", timed ? (double)k->save_batch : 0);
    if (timed) {
        bu_json_num(o, "save_p50_us", s[0]);
        bu_json_num(o, "save_p99_us", s[1]);
    }
    bu_json_num(o, "query1_p50_us", q1[0]);
    bu_json_num(o, "query1_p99_us", q1[1]);
    bu_json_num(o, "query_hashes", (double)qn);
    bu_json_num(o, "query_p50_us", q4k[0]);
    bu_json_num(o, "query_p99_us", q4k[1]);
    bu_json_num(o, "bytes_per_block", *per_block_p);
    bu_json_num(o, "fill_blocks_per_s", *fill_rate_p);
    return o;
}

int main(int argc, char **argv)
{
    struct curve k;
    parse(argc, argv, &k);
    start(&k);
    printf("engine curve: blocks of %llu B, Save calls of %ld, %d calls per latency\n",
           (unsigned long long)k.bs, k.save_batch, k.iters);
    printf("%12s %10s %10s %10s %10s %10s %10s %10s %12s\n", "blocks", "save p50", "save p99",
           "q1 p50", "q1 p99", "q4096 p50", "q4096 p99", "B/block", "fill blk/s");
    cJSON *root = bu_json_obj(NULL, NULL);
    bu_json_num(root, "block_bytes", (double)k.bs);
    bu_json_num(root, "iters", k.iters);
    bu_json_num(root, "warmup_blocks", (double)k.fill_batch);
    bu_json_num(root, "budget_s", k.budget);
    cJSON *pts = bu_json_check(cJSON_AddArrayToObject(root, "points"));
    double per_block = 0, fill_rate = 0;
    char why[256] = "";
    for (int i = 0; i < k.npoints; i++) {
        if (does_not_fit(&k, k.points[i], per_block, fill_rate, why, sizeof(why))) {
            printf("stopped at %llu blocks: %s\n", (unsigned long long)k.points[i], why);
            bu_json_num(root, "stopped_at", (double)k.points[i]);
            bu_json_str(root, "stopped_why", why);
            break;
        }
        cJSON_AddItemToArray(pts, point(&k, k.points[i], &per_block, &fill_rate));
    }
    bu_json_num(root, "seconds", bu_now() - k.t0);
    printf("method: points in order, adding blocks; latencies in us over %d calls; B/block = "
           "server RSS delta since before the first measured block / blocks (pool pre-touched)\n",
           k.iters);
    bu_json_write(root, k.json);
    pf_client_close(k.c);
    pf_simkv_destroy(k.kv);
    pft_stop(&k.s, SIGTERM, 60000);
    return 0;
}

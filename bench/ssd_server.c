/* bench/ssd_server: the SSD tier through a real pegaflow-server (sim GPU, default SSD flags:
 * 2 write and 16 read requests in flight, each up to 8 consecutive records) against raw
 * O_DIRECT io_uring I/O of the same bytes, in block-size requests at the same request
 * depths, on the same file system, same run.
 *   server write  Save of --total bytes of seeded KV (one contiguous layer, --block-size
 *                 blocks) in saves of 1/32 of it, back to back, timed from the first Save
 *                 until the SSD writer has written every block (pegaflow_ssd_write_blocks_total,
 *                 scraped adaptively): copy into the pool, seal with checksums, queue, write. The
 *                 pool holds the whole set (1.25x), so no block can be evicted before its
 *                 write, and the write queue holds all 32 saves (--ssd-write-queue-depth 64;
 *                 the default 8 drops sealed batches of a burst faster than the disk): the
 *                 bench never waits between saves, and polls nothing until the last one
 *   server read   after POST /cache/memory/cleanup (RAM empty, SSD copies stay): windows of
 *                 1/8 of the blocks, each its own request, are queried until Ready (SSD
 *                 prefetch with checksum verification) and loaded into a second instance;
 *                 before a window is loaded the next --lookahead (default 1) windows are
 *                 asked once, so the disk reads the next request while this one is copied,
 *                 as with a scheduler's several waiting requests (0: strictly one at a
 *                 time); timed from the first query to the last load done
 *   raw write     the same bytes to a file of the same file system, O_DIRECT, one block per
 *                 request, 2 in flight: the faster of writing from the source KV memory and
 *                 from a huge-page-advised buffer like the pool (physically contiguous memory
 *                 makes fewer segments per request)
 *   raw read      that file back, 16 in flight: the faster of reading into the destination KV
 *                 memory and into the huge-page buffer (both compared with the source)
 * Rounds alternate who goes first (ABBA) and each read comes two phases after its write.
 * Every round compares every loaded byte (server and raw) with the source and clears the
 * destination before the next read. Ratios are min/median/max of the per-round ratios.
 * Usage: ssd_server [--dir DIR] [--total SIZE] [--block-size SIZE] [--rounds N] [--lookahead N]
 *                   [--poll-us US (1000: a Loading window is asked again after this pause, as
 *                   a connector asks once a scheduler step; 200 and 1000 measured alike)]
 *                   [--fresh-file (the server's cache file new, not pre-written: see prewrite)]
 *                   [--json FILE]
 *                   [--server-arg ARG]... (up to 8 more pegaflow-server arguments, e.g. to
 *                   try other --ssd-write-inflight depths; the raw side keeps 2 and 16)
 * The server is $PF_BIN/pegaflow-server (default build/rel/bin). */
#include <signal.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "benchutil.h"
#include "pf/config.h"

#define TMO     120000
#define WBLOCKS "pegaflow_ssd_write_blocks_total"
#define WFAIL   "pegaflow_ssd_write_failures_total"
#define WFULL   "pegaflow_ssd_write_queue_full_total"

static void die(const char *what)
{
    bu_die("ssd_server", what);
}

static void hash_of(uint64_t tag, uint64_t i, uint8_t *h)
{
    pft_fill(h, 32, tag, i);
}

/* Blocks the SSD writer has written since base (exits on write failures or drops). */
static double written(const struct pft_proc *s, double base, uint64_t bs)
{
    char *m = bu_metrics(s);
    double fail = bu_metric_in(m, WFAIL), full = bu_metric_in(m, WFULL);
    double w = bu_metric_in(m, WBLOCKS) - base; /* records: header + block */
    (void)bs;
    free(m);
    if (fail > 0 || full > 0) {
        fprintf(stderr, "bench/ssd_server: SSD writes failed or were dropped (%s %.0f, %s %.0f)\n",
                WFAIL, fail, WFULL, full);
        pft_fail_cleanup();
        exit(1);
    }
    return w;
}

/* Waits until n blocks are on SSD. Every /metrics scrape costs the server several ms of CPU
 * (measured 2026-12-02: 300 scrapes took 2.1 s of server CPU on the loaded 2-core VM, the
 * HLL estimates of the cache metrics), so polling every millisecond kept a core busy
 * while the SSD writer drained; the next scrape comes after a quarter of the time the rate
 * so far says is left (1 ms at least, 50 ms at most): ~20 scrapes for a drain of ~0.5 s,
 * and the end is still seen within ~1 ms. */
static void wait_written(const struct pft_proc *s, double base, uint64_t bs, uint64_t n)
{
    double dl = bu_now() + 60;
    double w0 = written(s, base, bs), t0 = bu_now(), w;
    while ((w = written(s, base, bs)) < (double)n - 0.01) {
        double t = bu_now();
        double rate = t > t0 && w > w0 ? (w - w0) / (t - t0) : 0; /* blocks/s */
        double left = rate > 0 ? ((double)n - w) / rate : 0.004;
        double nap = left / 4 < 0.001 ? 0.001 : left / 4 > 0.05 ? 0.05 : left / 4;
        if (bu_now() > dl) {
            fprintf(stderr,
                    "bench/ssd_server: %.1f of %llu blocks written after 60 s (pending %.0f, "
                    "in flight %.0f, insertions %.0f, rejections %.0f, used %.0f)\n",
                    written(s, base, bs), (unsigned long long)n,
                    bu_metric(s, "pegaflow_ssd_write_queue_pending"),
                    bu_metric(s, "pegaflow_ssd_write_inflight"),
                    bu_metric(s, "pegaflow_cache_block_insertions_total"),
                    bu_metric(s, "pegaflow_cache_block_admission_rejections_total"),
                    bu_metric(s, "pegaflow_pool_used_bytes"));
            die("SSD writer did not finish");
        }
        usleep((useconds_t)(nap * 1e6));
    }
}

/* Saves blocks [0, nb) (block id i, hash (tag, i)) in chunks; returns seconds until all of
 * them are on SSD. */
/* Seconds the last server_write took until every save had returned (the rest of the write
 * is the SSD writer draining), for the breakdown. */
static double g_saves_s;
/* GB/s of the last server_write until the last save returned (blocks on SSD by then over
 * that time) and after it (the writer draining the rest), for the breakdown. */
static double g_write_during_gbs, g_write_drain_gbs;

static double server_write(struct pf_client *c, const struct pft_proc *s, uint64_t tag, uint64_t nb,
                           uint64_t bs, uint64_t chunk)
{
    uint32_t *ids = malloc(chunk * sizeof(*ids));
    uint8_t *hs = malloc(chunk * 32);
    double base = bu_metric(s, WBLOCKS);
    double t0 = bu_now();
    for (uint64_t h = 0; h < nb; h += chunk) {
        uint64_t k = nb - h < chunk ? nb - h : chunk;
        for (uint64_t i = 0; i < k; i++) {
            ids[i] = (uint32_t)(h + i);
            hash_of(tag, h + i, hs + i * 32);
        }
        struct pf_save_layer sl = {
            .name = "ALL_LAYERS", .block_ids = ids, .hashes = hs, .hash_len = 32, .n = k};
        if (pf_client_save(c, "src", 0, 0, 0, &sl, 1, TMO))
            die("save");
    }
    g_saves_s = bu_now() - t0;
    double w_at = written(s, base, bs), t_at = bu_now() - t0;
    wait_written(s, base, bs, nb);
    double t = bu_now() - t0;
    g_write_during_gbs = w_at * (double)bs / t_at / 1e9;
    g_write_drain_gbs = t > t_at ? ((double)nb - w_at) * (double)bs / (t - t_at) / 1e9 : 0;
    free(ids);
    free(hs);
    return t;
}

/* Seconds the last server_read spent waiting for windows to be Ready (SSD prefetch and
 * promotion, not hidden behind a load) and in loads (the copy into the second instance),
 * for the breakdown. */
static double g_read_query_s, g_read_load_s;
/* --poll-us: pause between two QueryPrefetch of a window that answered Loading */
static unsigned g_poll_us = 1000;

/* One window of the read: its own req_id (one request of a scheduler), its hashes and
 * destination block ids, and its last answer. */
struct window {
    uint64_t first, n;
    char req[32];
    uint8_t *hs;
    int64_t *targets;
    bool asked, ready, loading;
    struct pf_query_result r;
};

/* One QueryPrefetch of w; a Ready answer is kept (its lease pins the blocks until the
 * window's load), Loading means its SSD prefetch runs in the server. */
static void ask(struct pf_client *c, struct window *w)
{
    if (pf_client_query(c, "dst", w->req, w->hs, NULL, 32, w->n, 0, 0, &w->r, NULL, 0, TMO))
        die("query");
    w->asked = true;
    w->loading |= w->r.loading != 0;
    w->ready = !w->r.loading;
}

/* Reads windows of blocks (tag, 0..nb) into "dst" block ids 0..nb, each queried until
 * Ready (asked again every --poll-us) and then loaded; before a window is loaded the next
 * `lookahead` windows are asked once, so their prefetch runs while this one loads, as a
 * scheduler's next waiting requests do (0: one window at a time). Returns seconds;
 * *via_ssd_p counts windows that answered Loading first. */
static double server_read(struct pf_client *c, uint64_t tag, uint64_t nb, uint64_t win,
                          int lookahead, int *via_ssd_p)
{
    g_read_query_s = g_read_load_s = 0;
    size_t nw = (nb + win - 1) / win;
    struct window *ws = calloc(nw, sizeof(*ws));
    if (!ws)
        die("window table");
    for (size_t j = 0; j < nw; j++) {
        struct window *w = &ws[j];
        w->first = j * win;
        w->n = nb - w->first < win ? nb - w->first : win;
        snprintf(w->req, sizeof(w->req), "bench-w%zu", j);
        w->hs = malloc(w->n * 32);
        w->targets = malloc(w->n * sizeof(*w->targets));
        if (!w->hs || !w->targets)
            die("window");
        for (uint64_t i = 0; i < w->n; i++) {
            hash_of(tag, w->first + i, w->hs + i * 32);
            w->targets[i] = (int64_t)(w->first + i);
        }
    }
    const char *names[1] = {"ALL_LAYERS"};
    int via = 0;
    double t0 = bu_now();
    for (size_t j = 0; j < nw; j++) {
        struct window *w = &ws[j];
        double tq = bu_now(), dl = tq + 60;
        if (!w->asked)
            ask(c, w);
        while (!w->ready) {
            if (bu_now() > dl)
                die("query still Loading after 60 s");
            usleep(g_poll_us);
            ask(c, w);
        }
        via += w->loading;
        if (w->r.num_hit_blocks != w->n) {
            fprintf(stderr, "bench/ssd_server: window at %llu: %u of %llu blocks hit\n",
                    (unsigned long long)w->first, w->r.num_hit_blocks, (unsigned long long)w->n);
            pft_fail_cleanup();
            exit(1);
        }
        double tl = bu_now();
        g_read_query_s += tl - tq;
        for (size_t a = j + 1; a < nw && a <= j + (size_t)lookahead; a++)
            if (!ws[a].asked)
                ask(c, &ws[a]);
        size_t gsz = 1, cnt = w->n;
        struct pf_load_item it = {.lease = w->r.lease,
                                  .lease_len = w->r.lease_len,
                                  .targets = w->targets,
                                  .group_counts = &cnt};
        struct pf_loadstate *ls;
        if (pf_loadstate_create(&ls))
            die("load state");
        if (pf_client_load(c, "dst", 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1, TMO))
            die("load");
        if (pf_loadstate_wait(ls, TMO) != 1)
            die("load did not complete");
        pf_loadstate_destroy(ls);
        g_read_load_s += bu_now() - tl;
    }
    double t = bu_now() - t0;
    for (size_t j = 0; j < nw; j++) {
        free(ws[j].hs);
        free(ws[j].targets);
    }
    free(ws);
    *via_ssd_p = via;
    return t;
}

static void check_bytes(const uint8_t *want, uint8_t *got, uint64_t len, const char *what)
{
    if (memcmp(want, got, len) != 0) {
        uint64_t i = 0;
        while (want[i] == got[i])
            i++;
        fprintf(stderr, "bench/ssd_server: %s: byte %llu differs\n", what, (unsigned long long)i);
        pft_fail_cleanup();
        exit(1);
    }
    memset(got, 0, len);
}

/* Seconds of the faster raw write of the same bytes: from the KV memory, or from the
 * huge-page buffer; 2 in flight like the tier. */
static double raw_write(const char *path, uint8_t *kv, uint8_t *thp, uint64_t total, uint64_t bs)
{
    double a = bu_raw_uring(path, 1, kv, total, bs, 2),
           b = bu_raw_uring(path, 1, thp, total, bs, 2);
    return (double)total / (a > b ? a : b);
}

/* Seconds of the faster raw read of the file: into the KV memory or into the huge-page
 * buffer; 16 in flight like the tier; both checked against the source and cleared. */
static double raw_read(const char *path, const uint8_t *src, uint8_t *kv, uint8_t *thp,
                       uint64_t total, uint64_t bs)
{
    double a = bu_raw_uring(path, 0, kv, total, bs, 16);
    check_bytes(src, kv, total, "raw read into the KV memory");
    double b = bu_raw_uring(path, 0, thp, total, bs, 16);
    if (memcmp(thp, src, total) != 0)
        die("raw read into the huge-page buffer: wrong bytes");
    return (double)total / (a > b ? a : b);
}

#define USAGE                                                                                      \
    "ssd_server [--dir DIR] [--total SIZE] [--block-size SIZE] [--rounds N] [--lookahead 0..7] "   \
    "[--poll-us US] [--fresh-file] [--json FILE] "                                                 \
    "[--server-arg ARG]..."

static void usage(void)
{
    fprintf(stderr, "usage: %s\n", USAGE);
    exit(2);
}

/* ---- the phases of a run ---- */

struct run {
    const char *dir, *json;
    uint64_t total, bs, nb, pool, chunk, win, seed;
    int rounds, lookahead, poll_us;
    bool fresh_file;
    struct bu_strs extra;
    char spath[1024], rpath[1024];
    struct pft_proc s;
    struct pf_client *c;
    struct pf_simkv *src, *dst;
    uint8_t *sp, *dp, *thp;
    /* per round: server / raw write and read GB/s, their ratios */
    double sw[99], rw[99], sr[99], rr[99], wr[99], rdr[99];
};

static void parse(int argc, char **argv, struct run *R)
{
    const char *tmp = getenv("TMPDIR");
    R->dir = tmp ? tmp : "/tmp";
    R->total = 1ull << 30;
    R->bs = 1 << 20;
    R->rounds = 3;
    R->lookahead = 1;
    R->poll_us = 1000;
    const struct bu_opt opts[] = {
        {"--lookahead", BU_INT, &R->lookahead},    {"--poll-us", BU_INT, &R->poll_us},
        {"--fresh-file", BU_FLAG, &R->fresh_file}, {"--dir", BU_STR, &R->dir},
        {"--total", BU_SIZE, &R->total},           {"--block-size", BU_SIZE, &R->bs},
        {"--rounds", BU_INT, &R->rounds},          {"--json", BU_STR, &R->json},
        {"--server-arg", BU_STRS, &R->extra},      {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, USAGE);
    if (R->bs < 4096 || R->bs % 4096 || R->total < 16 * R->bs || R->rounds < 1 || R->rounds > 99 ||
        R->lookahead < 0 || R->lookahead > 7 || R->poll_us < 0 || R->poll_us > 100000)
        usage();
    g_poll_us = (unsigned)R->poll_us;
    R->nb = R->total / R->bs;
    R->total = R->nb * R->bs;
    R->pool = R->total + R->total / 4;
    R->chunk = R->nb / 32;
    R->win = R->nb / 8;
}

/* Writes bytes of zeros to path with O_DIRECT, so that every extent of the file is written
 * before the server opens it. The raw side writes its file once untimed before its timed
 * writes (the warm-up round), so it always overwrites written extents; a file the server
 * creates is preallocated (fallocate: unwritten extents on ext4 and XFS), and the first pass
 * of its ring over them pays the file system's extent conversion at every write completion
 * (this VM's ext4: 7-10 % at depth 1 with dd, ~20 % through the server). Both sides then
 * write over written space, as a server does once its ring has wrapped; --fresh-file skips
 * this to measure a new file's first pass. An all-zero file has no superblock: the server
 * formats it as a new file. */
static void prewrite(const char *path, uint64_t bytes)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0)
        die("open the SSD cache file for pre-writing");
    const size_t chunk = 8u << 20;
    void *z = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (z == MAP_FAILED)
        die("mmap");
    memset(z, 0, chunk);
    for (uint64_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? (size_t)(bytes - off) : chunk;
        if (pwrite(fd, z, n, (off_t)off) != (ssize_t)n)
            die("pre-write the SSD cache file");
    }
    if (fsync(fd) != 0)
        die("fsync the SSD cache file");
    munmap(z, chunk);
    close(fd);
}

/* The server (pool 1.25x the data, SSD 2x, write queue 64 batches, --server-arg extras),
 * the two instances on seeded / zeroed KV memory and the huge-page copy of the source. */
static void start(struct run *R)
{
    uint64_t total = R->total;
    char poolarg[32], cap[32];
    snprintf(poolarg, sizeof(poolarg), "%llu", (unsigned long long)R->pool);
    snprintf(cap, sizeof(cap), "%llu", (unsigned long long)(2 * total));
    snprintf(R->spath, sizeof(R->spath), "%s/pf-bench-ssd-server.dat", R->dir);
    snprintf(R->rpath, sizeof(R->rpath), "%s/pf-bench-ssd-server-raw.dat", R->dir);
    if (!R->fresh_file)
        prewrite(R->spath, 2 * total);
    else
        unlink(R->spath);
    const char *args[12 + BU_STRS_MAX + 1] = {
        "--gpu-backend",           "sim",    "--pool-size",          poolarg,
        "--ssd-cache-path",        R->spath, "--ssd-cache-capacity", cap,
        "--ssd-write-queue-depth", "64",     "--log-level",          "info"};
    for (int i = 0; i < R->extra.n; i++)
        args[12 + i] = R->extra.v[i];
    if (pft_start(&R->s, "pegaflow-server", "127.0.0.1", args))
        exit(1);
    if (pf_client_connect(R->s.addr, &R->c))
        die("connect");
    if (pf_simkv_create(total, 0, &R->src) || pf_simkv_create(total, 0, &R->dst))
        die("simkv");
    R->sp = pf_simkv_ptr(R->src);
    R->dp = pf_simkv_ptr(R->dst);
    R->seed = pft_seed();
    pft_fill(R->sp, total, R->seed, 1);
    memset(R->dp, 0, total);
    if (bu_register(R->c, "src", "bench", R->src, R->nb, R->bs, TMO) ||
        bu_register(R->c, "dst", "bench", R->dst, R->nb, R->bs, TMO))
        die("register");
    fprintf(stderr,
            "bench/ssd_server: %s, %llu MiB in %llu KiB blocks, pool %llu MiB, %d round(s), "
            "seed %llu\n",
            R->dir, (unsigned long long)(total >> 20), (unsigned long long)(R->bs >> 10),
            (unsigned long long)(R->pool >> 20), R->rounds, (unsigned long long)R->seed);
    /* the same bytes in memory of the pool's kind (anonymous, huge pages advised): raw I/O
     * from/into it is faster when the KV memory's pages are scattered (more segments per
     * request); each round's raw figure is the faster of the two */
    R->thp = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (R->thp == MAP_FAILED)
        die("mmap");
    madvise(R->thp, total, MADV_HUGEPAGE);
    memcpy(R->thp, R->sp, total);
}

/* One round (r < 0: the untimed warm-up): server and raw write, then read, ABBA order. */
static void round_run(struct run *R, int r)
{
    struct pf_client *c = R->c;
    const struct pft_proc *s = &R->s;
    uint64_t total = R->total, bs = R->bs, nb = R->nb;
    uint8_t *sp = R->sp, *dp = R->dp, *thp = R->thp;
    const char *rpath = R->rpath;
    uint64_t tag = 1000 + (uint64_t)(r + 1);
    double tsw, trw, tsr, trr;
    int via = 0;
    bool raw_first = r >= 0 && r % 2 == 0;
    if (raw_first) {
        trw = raw_write(rpath, sp, thp, total, bs);
        tsw = server_write(c, s, tag, nb, bs, R->chunk);
        trr = raw_read(rpath, sp, dp, thp, total, bs);
        if (pft_http(s->http_host, s->http_port, "POST", "/cache/memory/cleanup", NULL) != 200)
            die("memory cleanup");
        tsr = server_read(c, tag, nb, R->win, R->lookahead, &via);
        check_bytes(sp, dp, total, "server load from SSD");
    } else {
        tsw = server_write(c, s, tag, nb, bs, R->chunk);
        trw = raw_write(rpath, sp, thp, total, bs);
        if (pft_http(s->http_host, s->http_port, "POST", "/cache/memory/cleanup", NULL) != 200)
            die("memory cleanup");
        tsr = server_read(c, tag, nb, R->win, R->lookahead, &via);
        check_bytes(sp, dp, total, "server load from SSD");
        trr = raw_read(rpath, sp, dp, thp, total, bs);
    }
    if (via == 0)
        die("no window went through the SSD tier (RAM cleanup did not take?)");
    pft_http(s->http_host, s->http_port, "POST", "/cache/memory/cleanup", NULL);
    if (r < 0)
        return;
    R->sw[r] = (double)total / tsw / 1e9;
    R->rw[r] = (double)total / trw / 1e9;
    R->sr[r] = (double)total / tsr / 1e9;
    R->rr[r] = (double)total / trr / 1e9;
    R->wr[r] = R->sw[r] / R->rw[r];
    R->rdr[r] = R->sr[r] / R->rr[r];
    fprintf(stderr,
            "  round %d: write server %.2f raw %.2f GB/s, read server %.2f raw %.2f GB/s "
            "(saves returned at %.0f%% of the write: %.2f GB/s until then, %.2f GB/s after; "
            "%d window(s) via SSD; query -> Ready %.0f%%, load %.0f%% of the read)\n",
            r + 1, R->sw[r], R->rw[r], R->sr[r], R->rr[r], 100 * g_saves_s / tsw,
            g_write_during_gbs, g_write_drain_gbs, via, 100 * g_read_query_s / tsr,
            100 * g_read_load_s / tsr);
}

/* The table, the method line and the JSON (--json). */
static void report(const struct run *R)
{
    int rounds = R->rounds;
    double msw[3], mrw[3], msr[3], mrr[3], mwr[3], mrd[3];
    bu_spread(R->sw, rounds, msw);
    bu_spread(R->rw, rounds, mrw);
    bu_spread(R->sr, rounds, msr);
    bu_spread(R->rr, rounds, mrr);
    bu_spread(R->wr, rounds, mwr);
    bu_spread(R->rdr, rounds, mrd);
    printf("%-34s %11s %9s %6s %6s %6s\n", "phase", "server GB/s", "raw GB/s", "min", "median",
           "max");
    printf("%-34s %11.3f %9.3f %6.2f %6.2f %6.2f\n", "save -> on SSD (2 writes in flight)", msw[1],
           mrw[1], mwr[0], mwr[1], mwr[2]);
    printf("%-34s %11.3f %9.3f %6.2f %6.2f %6.2f\n", "evict -> load from SSD (16 reads)", msr[1],
           mrr[1], mrd[0], mrd[1], mrd[2]);
    printf("method: %d rounds ABBA (even rounds raw first), warm-up round untimed; %llu MiB in "
           "%llu KiB blocks, pool %llu MiB, server defaults (integrity on, 2 write / 16 read "
           "requests in flight, each up to 8 records) but a write queue of 64 batches (the "
           "bench's 32 saves never wait); reads in windows of 1/8 of the blocks, %d asked ahead "
           "of each load; raw = io_uring O_DIRECT one block per request at the "
           "same request depths, the faster "
           "of from/into the same KV memory and from/into huge-page-advised memory, a file of %s; "
           "every round memcmp's all loaded bytes; %s\n",
           rounds, (unsigned long long)(R->total >> 20), (unsigned long long)(R->bs >> 10),
           (unsigned long long)(R->pool >> 20), R->lookahead, R->dir,
           R->fresh_file ? "the server's cache file new (fallocated, its first pass over the ring)"
                         : "both files fully written before the first round (written extents)");
    if (!R->json)
        return;
    cJSON *root = bu_json_obj(NULL, NULL);
    bu_json_str(root, "bench", "ssd_server");
    bu_json_str(root, "dir", R->dir);
    bu_json_num(root, "block_bytes", (double)R->bs);
    bu_json_num(root, "bytes", (double)R->total);
    bu_json_num(root, "rounds", rounds);
    bu_json_num(root, "lookahead", R->lookahead);
    cJSON_AddBoolToObject(root, "fresh_file", R->fresh_file);
    bu_json_num(root, "seed", (double)R->seed);
    cJSON *w = bu_json_obj(root, "write");
    bu_json_num(w, "server_gbs", msw[1]);
    bu_json_num(w, "raw_gbs", mrw[1]);
    bu_json_nums(w, "ratio", mwr, 3);
    cJSON *rd = bu_json_obj(root, "read");
    bu_json_num(rd, "server_gbs", msr[1]);
    bu_json_num(rd, "raw_gbs", mrr[1]);
    bu_json_nums(rd, "ratio", mrd, 3);
    bu_json_write(root, R->json);
}

static int stop(struct run *R)
{
    pf_client_close(R->c);
    pf_simkv_destroy(R->src);
    pf_simkv_destroy(R->dst);
    munmap(R->thp, R->total);
    int rc = pft_stop(&R->s, SIGTERM, 60000);
    unlink(R->spath);
    unlink(R->rpath);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    static struct run R;
    parse(argc, argv, &R);
    start(&R);
    for (int r = -1; r < R.rounds; r++) /* round -1: warm-up (first faults, file layout) */
        round_run(&R, r);
    report(&R);
    return stop(&R);
}

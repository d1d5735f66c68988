/* bench/engine: the engine's data and control paths against this machine's own limits,
 * measured in the same run.
 *   1. save and load throughput of 1 GiB in 64 KiB, 512 KiB and 2 MiB blocks through the sim
 *      GPU, vs single-thread memcpy of the same bytes (target >= 0.7)
 *   2. xxh3 checksum throughput (the insert thread's per-block cost) vs memcpy
 *   3. QueryPrefetch p50/p99 for 1 and 4096 hashes with 10^6 resident blocks, vs an empty
 *      Health RPC (target p50 <= 2x Health)
 *   4. server memory per resident block at 10^6 blocks (RSS delta / blocks, target <= 256 B)
 * Usage: engine [--json FILE] [--quick]. The server runs as a separate process
 * ($PF_BIN/pegaflow-server, default build/rel/bin). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "client/pegaflow.h"
#include "pftest.h"

#define TMO 120000

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof(*v), cmpd);
    return v[(size_t)(p * (double)(n - 1))];
}

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            v = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

/* Best of two single-thread copies of len bytes in bs-sized memcpy calls: the copies the sim
 * GPU backend itself has to make (glibc switches to non-temporal stores only for one call far
 * larger than a block, so a 1 GiB memcpy is faster than the same bytes in blocks). */
static double chunked_memcpy_gbs(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    double best = 0;
    for (int r = 0; r < 2; r++) {
        double t = now_s();
        for (uint64_t o = 0; o < len; o += bs)
            memcpy(dst + o, src + o, bs);
        double g = (double)len / (now_s() - t) / 1e9;
        if (g > best)
            best = g;
    }
    return best;
}

static void die(const char *what)
{
    fprintf(stderr, "bench: %s: %s (%d)\n", what, pf_last_error_message(), pf_last_error_code());
    pft_fail_cleanup();
    exit(1);
}

static void hash_of(uint64_t tag, uint64_t i, uint8_t *h)
{
    pft_fill(h, 32, tag, i);
}

static int reg(struct pf_client *c, const char *inst, struct pf_simkv *kv, uint64_t nb, uint64_t bs)
{
    uint8_t ipc[512];
    size_t ipclen;
    pf_simkv_ipc(kv, 0, nb * bs, ipc, sizeof(ipc), &ipclen);
    struct pf_layer_desc d = {.name = "ALL_LAYERS",
                              .ipc = ipc,
                              .ipc_len = ipclen,
                              .num_blocks = nb,
                              .bytes_per_block = bs,
                              .segments = 1};
    struct pf_register_args a = {.instance_id = inst,
                                 .namespace_ = "bench",
                                 .tp_size = 1,
                                 .world_size = 1,
                                 .device_id = 0,
                                 .layers = &d,
                                 .nlayers = 1};
    return pf_client_register(c, &a, TMO);
}

/* Saves [first, first+n) in batches of `batch`; returns seconds. */
static double save_range(struct pf_client *c, const char *inst, uint64_t tag, uint64_t first,
                         uint64_t n, uint64_t batch, uint64_t id_mod)
{
    uint32_t *ids = malloc(batch * sizeof(*ids));
    uint8_t *hs = malloc(batch * 32);
    double t = 0;
    for (uint64_t b = 0; b < n; b += batch) {
        uint64_t k = n - b < batch ? n - b : batch;
        for (uint64_t i = 0; i < k; i++) {
            ids[i] = (uint32_t)((first + b + i) % id_mod);
            hash_of(tag, first + b + i, hs + i * 32);
        }
        struct pf_save_layer sl = {
            .name = "ALL_LAYERS", .block_ids = ids, .hashes = hs, .hash_len = 32, .n = k};
        double t0 = now_s();
        if (pf_client_save(c, inst, 0, 0, 0, &sl, 1, TMO))
            die("save");
        t += now_s() - t0;
    }
    free(ids);
    free(hs);
    return t;
}

static uint32_t query_n(struct pf_client *c, const char *inst, uint64_t tag, uint64_t first,
                        uint64_t n, uint8_t *lease, double *secs)
{
    uint8_t *hs = malloc(n * 32);
    for (uint64_t i = 0; i < n; i++)
        hash_of(tag, first + i, hs + i * 32);
    struct pf_query_result r;
    double t0 = now_s();
    if (pf_client_query(c, inst, "bench", hs, NULL, 32, n, 0, 0, &r, NULL, 0, TMO))
        die("query");
    if (secs)
        *secs = now_s() - t0;
    free(hs);
    if (lease && r.lease_len)
        memcpy(lease, r.lease, 16);
    else if (r.lease_len)
        pf_client_release(c, r.lease, 16, TMO);
    return r.num_hit_blocks;
}

static void wait_resident(struct pf_client *c, const char *inst, uint64_t tag, uint64_t first,
                          uint64_t n)
{
    double dl = now_s() + 60;
    while (query_n(c, inst, tag, first + n - 1, 1, NULL, NULL) != 1) {
        if (now_s() > dl)
            die("blocks not sealed in 60 s");
        usleep(1000);
    }
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else {
            fprintf(stderr, "usage: engine [--quick] [--json FILE]\n");
            return 2;
        }
    }
    const uint64_t TOTAL = quick ? (128ull << 20) : (1ull << 30);
    const uint64_t NBLK_META = quick ? 100000 : 1000000;
    FILE *js = json ? fopen(json, "w") : NULL;
    if (js)
        fprintf(js, "{\n");

    /* ---- machine limits ---- */
    uint8_t *a = aligned_alloc(4096, TOTAL), *b = aligned_alloc(4096, TOTAL);
    pft_fill(a, TOTAL, 1, 1);
    memset(b, 0, TOTAL); /* both buffers faulted in before timing */
    double memcpy_gbs = 0, t0;
    for (int r = 0; r < 3; r++) { /* best of 3: the machine's single-thread limit */
        t0 = now_s();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, TOTAL);
        double g = (double)TOTAL / (now_s() - t0) / 1e9;
        if (g > memcpy_gbs)
            memcpy_gbs = g;
    }
    t0 = now_s();
    volatile uint64_t sink = XXH3_64bits(a, TOTAL);
    (void)sink;
    double xxh_gbs = (double)TOTAL / (now_s() - t0) / 1e9;
    free(a);
    free(b);
    printf("machine: memcpy %.2f GB/s (1 thread), xxh3 %.2f GB/s (%.2fx memcpy)\n", memcpy_gbs,
           xxh_gbs, xxh_gbs / memcpy_gbs);

    /* ---- server ---- */
    char pool[32];
    snprintf(pool, sizeof(pool), "%llumb", (unsigned long long)(TOTAL * 5 / 4 >> 20));
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", pool, "--log-level", "info", NULL};
    struct pft_proc s;
    if (pft_start(&s, "pegaflow-server", "127.0.0.1", args))
        return 1;
    struct pf_client *c;
    if (pf_client_connect(s.addr, &c))
        die("connect");
    struct pf_simkv *src, *dst;
    if (pf_simkv_create(TOTAL, 0, &src) || pf_simkv_create(TOTAL, 0, &dst))
        die("simkv");
    pft_fill(pf_simkv_ptr(src), TOTAL, 2, 2);
    memset(pf_simkv_ptr(dst), 0, TOTAL);

    /* host buffer of the pinned pool's kind (anonymous, huge pages advised) for the per-block
     * baselines */
    uint8_t *hostbuf =
        mmap(NULL, TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hostbuf == MAP_FAILED)
        die("mmap baseline buffer");
    madvise(hostbuf, TOTAL, MADV_HUGEPAGE);
    memset(hostbuf, 0, TOTAL);
    printf("\n%-9s %9s %8s %8s %9s %9s %8s %8s %9s\n", "block", "save GB/s", "xblkcpy", "xmemcpy",
           "blkcpy", "load GB/s", "xblkcpy", "xmemcpy", "blkcpy");
    if (js)
        fprintf(js, "  \"memcpy_gbs\": %.3f,\n  \"xxh3_gbs\": %.3f,\n  \"throughput\": [\n",
                memcpy_gbs, xxh_gbs);
    const uint64_t sizes[3] = {64 << 10, 512 << 10, 2 << 20};
    for (int si = 0; si < 3; si++) {
        uint64_t bs = sizes[si], nb = TOTAL / bs;
        char src_id[32], dst_id[32];
        snprintf(src_id, sizeof(src_id), "src-%d", si);
        snprintf(dst_id, sizeof(dst_id), "dst-%d", si);
        if (reg(c, src_id, src, nb, bs) || reg(c, dst_id, dst, nb, bs))
            die("register");
        uint64_t tag = 100 + (uint64_t)si;
        /* warm-up round (untimed): the server's first touch of each page of the freshly
         * mapped "GPU" memory is a page fault a real GPU does not have */
        save_range(c, src_id, tag + 1000, 0, nb, nb < 4096 ? nb : 4096, nb);
        wait_resident(c, src_id, tag + 1000, 0, nb);
        {
            uint8_t wl[16];
            if (query_n(c, dst_id, tag + 1000, 0, nb, wl, NULL) != nb)
                die("warm-up query");
            int64_t *tg = malloc(nb * sizeof(*tg));
            for (uint64_t i = 0; i < nb; i++)
                tg[i] = (int64_t)i;
            const char *nm[1] = {"ALL_LAYERS"};
            size_t g1 = 1, c1 = nb;
            struct pf_load_item w = {
                .lease = wl, .lease_len = 16, .targets = tg, .group_counts = &c1};
            struct pf_loadstate *wls;
            pf_loadstate_create(&wls);
            if (pf_client_load(c, dst_id, 0, 0, pf_loadstate_name(wls), nm, &g1, 1, &w, 1, TMO) ||
                pf_loadstate_wait(wls, TMO) != 1)
                die("warm-up load");
            pf_loadstate_destroy(wls);
            free(tg);
            pft_http(s.http_host, s.http_port, "POST", "/cache/memory/cleanup", NULL);
        }
        double bsave = chunked_memcpy_gbs(hostbuf, pf_simkv_ptr(src), TOTAL, bs);
        double ts = save_range(c, src_id, tag, 0, nb, nb < 4096 ? nb : 4096, nb);
        wait_resident(c, src_id, tag, 0, nb);
        uint8_t lease[16];
        if (query_n(c, dst_id, tag, 0, nb, lease, NULL) != nb)
            die("query after save");
        int64_t *targets = malloc(nb * sizeof(*targets));
        for (uint64_t i = 0; i < nb; i++)
            targets[i] = (int64_t)i;
        const char *names[1] = {"ALL_LAYERS"};
        size_t gsz = 1, cnt = nb;
        struct pf_load_item it = {
            .lease = lease, .lease_len = 16, .targets = targets, .group_counts = &cnt};
        struct pf_loadstate *ls;
        pf_loadstate_create(&ls);
        double bload = chunked_memcpy_gbs(pf_simkv_ptr(dst), hostbuf, TOTAL, bs);
        memset(pf_simkv_ptr(dst), 0, TOTAL);
        t0 = now_s();
        if (pf_client_load(c, dst_id, 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1, TMO))
            die("load");
        if (pf_loadstate_wait(ls, TMO) != 1)
            die("load state");
        double tl = now_s() - t0;
        pf_loadstate_destroy(ls);
        free(targets);
        if (memcmp(pf_simkv_ptr(src), pf_simkv_ptr(dst), TOTAL) != 0)
            die("loaded bytes differ");
        memset(pf_simkv_ptr(dst), 0, TOTAL);
        double sg = (double)TOTAL / ts / 1e9, lg = (double)TOTAL / tl / 1e9;
        printf("%6lluKiB %9.2f %8.2f %8.2f %9.2f %9.2f %8.2f %8.2f %9.2f\n",
               (unsigned long long)(bs >> 10), sg, sg / bsave, sg / memcpy_gbs, bsave, lg,
               lg / bload, lg / memcpy_gbs, bload);
        if (js)
            fprintf(js,
                    "    {\"block_bytes\": %llu, \"save_gbs\": %.3f, \"save_ratio\": %.3f, "
                    "\"save_blkcpy_gbs\": %.3f, \"save_ratio_blkcpy\": %.3f, "
                    "\"load_gbs\": %.3f, \"load_ratio\": %.3f, \"load_blkcpy_gbs\": %.3f, "
                    "\"load_ratio_blkcpy\": %.3f}%s\n",
                    (unsigned long long)bs, sg, sg / memcpy_gbs, bsave, sg / bsave, lg,
                    lg / memcpy_gbs, bload, lg / bload, si < 2 ? "," : "");
        pft_http(s.http_host, s.http_port, "POST", "/cache/memory/cleanup", NULL);
        pf_client_unregister(c, src_id, TMO);
        pf_client_unregister(c, dst_id, TMO);
    }
    munmap(hostbuf, TOTAL);
    printf("(xblkcpy: vs single-thread memcpy of the same bytes in block-sized calls between the\n"
           " same kinds of memory, measured just before; xmemcpy: vs one %llu MiB memcpy call)\n",
           (unsigned long long)(TOTAL >> 20));
    if (js)
        fprintf(js, "  ],\n");

    /* ---- 10^6 resident blocks: memory per block, query latency ---- */
    const uint64_t mbs = 512;
    struct pf_simkv *small;
    if (pf_simkv_create(16384 * mbs, 0, &small))
        die("simkv small");
    pft_fill(pf_simkv_ptr(small), 16384 * mbs, 3, 3);
    if (reg(c, "meta", small, 16384, mbs))
        die("register meta");
    pf_client_save(c, "meta", 0, 0, 0, NULL, 0, TMO); /* warm the path */
    long rss0 = rss_kb(s.pid);
    double tsave = save_range(c, "meta", 7, 0, NBLK_META, 16384, 16384);
    wait_resident(c, "meta", 7, 0, NBLK_META);
    long rss1 = rss_kb(s.pid);
    double per_block = (double)(rss1 - rss0) * 1024.0 / (double)NBLK_META;
    printf("\n%llu resident blocks of %llu B: %.0f bytes of server memory per block "
           "(RSS delta), saved at %.0f blocks/s\n",
           (unsigned long long)NBLK_META, (unsigned long long)mbs, per_block,
           (double)NBLK_META / tsave);
    int iters = quick ? 300 : 2000;
    double *lat = malloc((size_t)iters * sizeof(double));
    for (int i = 0; i < 50; i++)
        pf_client_health(c, TMO);
    for (int i = 0; i < iters; i++) {
        double t1 = now_s();
        if (pf_client_health(c, TMO))
            die("health");
        lat[i] = now_s() - t1;
    }
    double h50 = pct(lat, (size_t)iters, 0.5), h99 = pct(lat, (size_t)iters, 0.99);
    printf("\n%-26s %10s %10s %10s\n", "RPC", "p50 us", "p99 us", "p50/Health");
    printf("%-26s %10.1f %10.1f %10.2f\n", "Health (empty)", h50 * 1e6, h99 * 1e6, 1.0);
    if (js)
        fprintf(js,
                "  \"resident_blocks\": %llu,\n  \"bytes_per_block\": %.1f,\n  \"health_p50_us\": "
                "%.1f,\n  \"health_p99_us\": %.1f,\n  \"query\": [\n",
                (unsigned long long)NBLK_META, per_block, h50 * 1e6, h99 * 1e6);
    const uint64_t qn[2] = {1, 4096};
    for (int qi = 0; qi < 2; qi++) {
        for (int i = 0; i < iters; i++) {
            uint64_t first = ((uint64_t)i * 7919) % (NBLK_META - qn[qi]);
            uint32_t hits = query_n(c, "meta", 7, first, qn[qi], NULL, &lat[i]);
            if (hits != qn[qi])
                die("query missed resident blocks");
        }
        double q50 = pct(lat, (size_t)iters, 0.5), q99 = pct(lat, (size_t)iters, 0.99);
        char label[64];
        snprintf(label, sizeof(label), "QueryPrefetch %llu hash%s", (unsigned long long)qn[qi],
                 qn[qi] > 1 ? "es" : "");
        printf("%-26s %10.1f %10.1f %10.2f\n", label, q50 * 1e6, q99 * 1e6, q50 / h50);
        if (js)
            fprintf(js,
                    "    {\"hashes\": %llu, \"p50_us\": %.1f, \"p99_us\": %.1f, \"p50_vs_health\": "
                    "%.3f}%s\n",
                    (unsigned long long)qn[qi], q50 * 1e6, q99 * 1e6, q50 / h50,
                    qi == 0 ? "," : "");
    }
    if (js) {
        fprintf(js, "  ]\n}\n");
        fclose(js);
    }
    free(lat);
    pf_client_close(c);
    pf_simkv_destroy(src);
    pf_simkv_destroy(dst);
    pf_simkv_destroy(small);
    pft_stop(&s, SIGTERM, 60000);
    return 0;
}

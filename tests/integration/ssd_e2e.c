/* SSD tier scenarios against a real pegaflow-server process (sim GPU, SSD files under a
 * temporary directory), driven through libpegaflow:
 *   spill      a working set 4x the pinned pool: every block is written to SSD, most are
 *              evicted from RAM; windows of it answer Loading then Ready and load
 *              byte-exact (split and contiguous layouts, padded odd segment sizes, TP 2)
 *   wrap       a ring smaller than the working set: overwritten entries are gone (plain
 *              misses, never Loading), the surviving ones load byte-exact
 *   faults     injected EIO on writes (at post and at completion), EIO on a read and a
 *              corrupted read: misses where the faults hit, the metrics count them
 *              (pegaflow_integrity_failures_total{tier="ssd"} for the corruption), the
 *              other blocks load byte-exact, the server keeps serving
 *   queuefull  a write that never completes stalls the writer: further sealed batches
 *              are dropped and counted in pegaflow_ssd_write_queue_full_total
 *   restart    a restarted server starts with an empty SSD cache
 * Usage: ssd_e2e <dir> [scenario...]. Seed: PF_TEST_SEED. No timing assertions: every
 * wait polls a condition with a deadline. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "kvsim.h"
#include "pf/common.h"
#include "pftest.h"

#define TMO  20000
#define MAXR 2
#define MAXL 4
#define HLEN 32

static uint64_t seed;
static const char *dir;

struct world {
    const char *id;
    const char *ns;
    int tp;
    int nlayers;
    struct kvt kv[MAXR][MAXL];
    char names[MAXL][32];
};

static void hash_of(uint64_t i, uint8_t *h)
{
    pft_fill(h, HLEN, seed, 5000000 + i);
}

static void world_init(struct world *w, const char *id, const char *ns, int tp, int nlayers,
                       enum kv_layout lay, uint64_t nblocks, uint64_t seg, bool fill)
{
    memset(w, 0, sizeof(*w));
    w->id = id;
    w->ns = ns;
    w->tp = tp;
    w->nlayers = nlayers;
    for (int l = 0; l < nlayers; l++)
        snprintf(w->names[l], sizeof(w->names[l]), "model.layers.%d", l);
    for (int r = 0; r < tp; r++)
        for (int l = 0; l < nlayers; l++) {
            PFT_CHECK(kvt_create(&w->kv[r][l], lay, nblocks, seg, r) == 0, "simkv create");
            if (fill)
                for (uint64_t b = 0; b < nblocks; b++)
                    kvt_fill_block(&w->kv[r][l], b, seed,
                                   (uint64_t)r << 40 | (uint64_t)l << 32 | b);
        }
}

static void world_free(struct world *w)
{
    for (int r = 0; r < w->tp; r++)
        for (int l = 0; l < w->nlayers; l++)
            kvt_destroy(&w->kv[r][l]);
}

static void world_register(struct pf_client *c, struct world *w)
{
    for (int r = 0; r < w->tp; r++) {
        struct pf_layer_desc d[MAXL];
        for (int l = 0; l < w->nlayers; l++)
            d[l] = kvt_desc(&w->kv[r][l], w->names[l]);
        struct pf_register_args a = {
            .instance_id = w->id,
            .namespace_ = w->ns,
            .tp_rank = (uint32_t)r,
            .tp_size = (uint32_t)w->tp,
            .world_size = (uint32_t)w->tp,
            .device_id = r,
            .layers = d,
            .nlayers = (size_t)w->nlayers,
        };
        PFT_CHECK(pf_client_register(c, &a, TMO) == 0, "register %s rank %d: %s", w->id, r,
                  pf_last_error_message());
    }
}

/* Saves hashes [h0, h0+n) from block ids first_id.. on every rank. */
static void world_save(struct pf_client *c, struct world *w, uint64_t h0, uint32_t first_id,
                       size_t n)
{
    uint32_t *ids = malloc(n * sizeof(*ids));
    uint8_t *hs = malloc(n * HLEN);
    for (size_t i = 0; i < n; i++) {
        ids[i] = first_id + (uint32_t)i;
        hash_of(h0 + i, hs + i * HLEN);
    }
    for (int r = 0; r < w->tp; r++) {
        struct pf_save_layer sl[MAXL];
        for (int l = 0; l < w->nlayers; l++)
            sl[l] = (struct pf_save_layer){
                .name = w->names[l], .block_ids = ids, .hashes = hs, .hash_len = HLEN, .n = n};
        PFT_CHECK(pf_client_save(c, w->id, (uint32_t)r, 0, r, sl, (size_t)w->nlayers, TMO) == 0,
                  "save %zu block(s) from hash %llu: %s", n, (unsigned long long)h0,
                  pf_last_error_message());
    }
    free(ids);
    free(hs);
}

static int query(struct pf_client *c, const char *inst, const char *req, uint64_t h0, size_t n,
                 struct pf_query_result *res)
{
    uint8_t *hs = malloc(n * HLEN + 1);
    for (size_t i = 0; i < n; i++)
        hash_of(h0 + i, hs + i * HLEN);
    int rc = pf_client_query(c, inst, req, hs, NULL, HLEN, n, 0, 0, res, NULL, 0, TMO);
    free(hs);
    return rc;
}

/* Queries until Ready (deadline). Returns whether any answer was Loading. */
static bool query_ready(struct pf_client *c, const char *inst, const char *req, uint64_t h0,
                        size_t n, struct pf_query_result *res)
{
    uint64_t dl = pft_now_ms() + TMO;
    bool loading = false;
    for (;;) {
        PFT_CHECK(query(c, inst, req, h0, n, res) == 0, "query %s: %s", req,
                  pf_last_error_message());
        if (!res->loading)
            return loading;
        loading = true;
        PFT_CHECK(pft_now_ms() < dl, "query %s still Loading after %d ms", req, TMO);
        usleep(2000);
    }
}

static void wait_sealed(struct pf_client *c, const char *inst, uint64_t h0, size_t n)
{
    uint64_t dl = pft_now_ms() + TMO;
    struct pf_query_result res;
    for (;;) {
        PFT_CHECK(query(c, inst, "probe", h0, n, &res) == 0, "probe: %s", pf_last_error_message());
        if (res.lease_len)
            pf_client_release(c, res.lease, res.lease_len, TMO);
        if (!res.loading && res.num_hit_blocks == n)
            return;
        PFT_CHECK(pft_now_ms() < dl, "only %u of %zu blocks sealed after %d ms", res.num_hit_blocks,
                  n, TMO);
        usleep(2000);
    }
}

/* Loads the lease's n blocks into dst block ids first_dst.. on every rank of w. */
static void world_load(struct pf_client *c, struct world *w, const uint8_t *lease, size_t n,
                       uint32_t first_dst)
{
    int64_t *targets = malloc(n * sizeof(*targets));
    for (size_t i = 0; i < n; i++)
        targets[i] = first_dst + (int64_t)i;
    const char *names[MAXL];
    for (int l = 0; l < w->nlayers; l++)
        names[l] = w->names[l];
    size_t gsz = (size_t)w->nlayers, cnt = n;
    struct pf_load_item it = {
        .lease = lease, .lease_len = PF_LEASE_LEN, .targets = targets, .group_counts = &cnt};
    for (int r = 0; r < w->tp; r++) {
        struct pf_loadstate *ls;
        PFT_CHECK(pf_loadstate_create(&ls) == 0, "loadstate");
        int rc = pf_client_load(c, w->id, (uint32_t)r, r, pf_loadstate_name(ls), names, &gsz, 1,
                                &it, 1, TMO);
        PFT_CHECK(rc == 0, "load rank %d: %s", r, pf_last_error_message());
        int64_t st = pf_loadstate_wait(ls, TMO);
        PFT_CHECK(st == 1, "load rank %d finished with state %lld", r, (long long)st);
        pf_loadstate_destroy(ls);
    }
    free(targets);
}

static void compare(struct world *src, uint32_t src_first, struct world *dst, uint32_t dst_first,
                    size_t n)
{
    for (int r = 0; r < src->tp; r++)
        for (int l = 0; l < src->nlayers; l++)
            for (size_t i = 0; i < n; i++)
                PFT_CHECK(
                    kvt_block_equal(&src->kv[r][l], src_first + i, &dst->kv[r][l], dst_first + i),
                    "rank %d layer %d block %zu (source %zu) differs after load", r, l, i,
                    src_first + i);
}

static double metric(struct pft_proc *s, const char *name)
{
    char *body = NULL;
    int st = pft_http(s->http_host, s->http_port, "GET", "/metrics", &body);
    PFT_CHECK(st == 200, "/metrics status %d", st);
    double v = 0;
    char key[256];
    snprintf(key, sizeof(key), "\n%s ", name);
    char *p = strstr(body, key);
    if (p)
        v = strtod(p + strlen(key), NULL);
    free(body);
    return v;
}

#define WBYTES "pegaflow_ssd_write_bytes_total"
#define WFAIL  "pegaflow_ssd_write_failures_total"

/* Waits until the SSD writer has handled `blocks` more blocks (committed or failed) than
 * base_* recorded, i.e. bytes/blk_bytes + failures. */
static void wait_written(struct pft_proc *s, double base_bytes, double base_fail,
                         uint64_t blk_bytes, size_t blocks)
{
    uint64_t dl = pft_now_ms() + TMO;
    for (;;) {
        double done =
            (metric(s, WBYTES) - base_bytes) / (double)blk_bytes + (metric(s, WFAIL) - base_fail);
        if (done >= (double)blocks - 0.01)
            return;
        PFT_CHECK(pft_now_ms() < dl, "SSD writer handled %.1f of %zu block(s) after %d ms", done,
                  blocks, TMO);
        usleep(5000);
    }
}

static void cleanup_ram(struct pft_proc *s)
{
    char *body = NULL;
    PFT_CHECK(pft_http(s->http_host, s->http_port, "POST", "/cache/memory/cleanup", &body) == 200,
              "memory cleanup: %s", body ? body : "");
    free(body);
}

static void start(struct pft_proc *s, const char *pool, const char *path, const char *cap,
                  const char *const *extra)
{
    const char *args[40] = {"--gpu-backend",        "sim", "--pool-size",      pool,
                            "--sim-gpus",           "2",   "--ssd-cache-path", path,
                            "--ssd-cache-capacity", cap};
    size_t n = 10;
    for (size_t i = 0; extra && extra[i] && n < 38; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    PFT_CHECK(pft_start(s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
}

static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
}

/* ---- spill ---- */

/* Bytes a block of this world occupies in the pool and on SSD (512-padded host strides). */
static uint64_t blk_bytes(enum kv_layout lay, int tp, int nlayers, uint64_t seg)
{
    uint64_t nseg = lay == KV_SPLIT ? 2 : 1;
    uint64_t copy = lay == KV_ADJACENT ? 2 * seg : seg;
    return (uint64_t)tp * (uint64_t)nlayers * nseg * ((copy + 511) / 512 * 512);
}

static void spill_one(enum kv_layout lay, int tp, int nlayers, uint64_t seg, const char *tag)
{
    char path[512], ida[64], idb[64], ns[64];
    path_of(path, sizeof(path), tag);
    snprintf(ida, sizeof(ida), "A-%s", tag);
    snprintf(idb, sizeof(idb), "B-%s", tag);
    snprintf(ns, sizeof(ns), "ns-%s", tag);
    const uint64_t blk = blk_bytes(lay, tp, nlayers, seg);
    const uint64_t pool = 8ull << 20;
    const size_t total = (size_t)(4 * pool / blk); /* working set 4x the pool */
    const size_t chunk = (size_t)(pool / 4 / blk);
    const size_t win = (size_t)(pool / 2 / blk);
    char poolarg[32];
    snprintf(poolarg, sizeof(poolarg), "%llu", (unsigned long long)pool);
    struct pft_proc s;
    start(&s, poolarg, path, "64mb", NULL);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    world_init(&A, ida, ns, tp, nlayers, lay, total, seg, true);
    world_init(&B, idb, ns, tp, nlayers, lay, win, seg, false);
    world_register(c, &A);
    world_register(c, &B);
    double b0 = metric(&s, WBYTES), f0 = metric(&s, WFAIL);
    /* the writer keeps up with one chunk (a quarter of the pool) at a time, so every block
     * reaches the SSD before pressure can evict it */
    for (size_t h = 0; h < total; h += chunk) {
        size_t n = PF_MIN_OF(chunk, total - h);
        world_save(c, &A, h, (uint32_t)h, n);
        wait_sealed(c, A.id, h, n);
        wait_written(&s, b0, f0, blk, h + n);
    }
    PFT_CHECK(metric(&s, WFAIL) == f0, "SSD write failures without faults");
    PFT_CHECK(metric(&s, WBYTES) - b0 == (double)(total * blk), "SSD bytes written %.0f, want %llu",
              metric(&s, WBYTES) - b0, (unsigned long long)(total * blk));
    double ev = metric(&s, "pegaflow_cache_block_evictions_total");
    PFT_CHECK(ev >= (double)(total / 2), "only %.0f evictions for a working set 4x the pool", ev);
    /* every window of the working set loads byte-exact, through SSD where RAM lost it */
    size_t via_ssd = 0;
    for (size_t h = 0; h < total; h += win) {
        size_t n = PF_MIN_OF(win, total - h);
        char req[64];
        snprintf(req, sizeof(req), "spill-%s-%zu", tag, h);
        struct pf_query_result res;
        bool loading = query_ready(c, B.id, req, h, n, &res);
        PFT_CHECK(res.num_hit_blocks == n && res.lease_len == PF_LEASE_LEN,
                  "window %zu: %u of %zu hit (loading=%d)", h, res.num_hit_blocks, n, loading);
        world_load(c, &B, res.lease, n, 0);
        compare(&A, (uint32_t)h, &B, 0, n);
        via_ssd += loading;
    }
    double got = metric(&s, "pegaflow_ssd_prefetch_success_total");
    PFT_CHECK(via_ssd >= 4 && got >= (double)(total / 2),
              "%zu window(s) went through SSD, %.0f block(s) prefetched", via_ssd, got);
    PFT_CHECK(metric(&s, "pegaflow_ssd_prefetch_failures_total") == 0, "prefetch failures");
    PFT_CHECK(metric(&s, "pegaflow_integrity_failures_total{tier=\"ssd\"}") == 0,
              "integrity failures");
    PFT_CHECK(metric(&s, "pegaflow_ssd_write_queue_pending") == 0 &&
                  metric(&s, "pegaflow_ssd_write_inflight") == 0 &&
                  metric(&s, "pegaflow_ssd_prefetch_inflight") == 0,
              "SSD gauges not back to 0");
    pf_client_close(c);
    world_free(&A);
    world_free(&B);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr,
            "  spill %s: %zu blocks of %llu bytes through an 8 MiB pool, %.0f evictions, %zu "
            "window(s) via SSD (%.0f blocks prefetched), byte-exact\n",
            tag, total, (unsigned long long)blk, ev, via_ssd, got);
}

static void sc_spill(void)
{
    spill_one(KV_SPLIT, 1, 2, 16384, "split-tp1");
    spill_one(KV_CONTIG, 2, 3, 5000, "contig-tp2-odd"); /* padded strides */
}

/* ---- wrap ---- */

static void sc_wrap(void)
{
    char path[512];
    path_of(path, sizeof(path), "wrap.dat");
    const uint64_t blk = blk_bytes(KV_SPLIT, 1, 2, 16384); /* 64 KiB */
    const size_t ring = (8u << 20) / blk, total = 3 * ring, chunk = 16;
    struct pft_proc s;
    start(&s, "4mb", path, "8mb", NULL);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    world_init(&A, "wrap-A", "ns-wrap", 1, 2, KV_SPLIT, total, 16384, true);
    world_init(&B, "wrap-B", "ns-wrap", 1, 2, KV_SPLIT, 32, 16384, false);
    world_register(c, &A);
    world_register(c, &B);
    double b0 = metric(&s, WBYTES), f0 = metric(&s, WFAIL);
    for (size_t h = 0; h < total; h += chunk) {
        world_save(c, &A, h, (uint32_t)h, chunk);
        wait_sealed(c, A.id, h, chunk);
        wait_written(&s, b0, f0, blk, h + chunk);
    }
    cleanup_ram(&s);
    /* overwritten laps: plain misses, no SSD attempt */
    struct pf_query_result res;
    for (size_t h = 0; h < 2 * ring; h += 32) {
        char req[64];
        snprintf(req, sizeof(req), "wrap-old-%zu", h);
        PFT_CHECK(query(c, B.id, req, h, 32, &res) == 0, "query old");
        PFT_CHECK(!res.loading && res.num_hit_blocks == 0 && res.lease_len == 0,
                  "overwritten blocks %zu.. answered loading=%d hits=%u", h, res.loading,
                  res.num_hit_blocks);
    }
    /* the last lap is intact */
    for (size_t h = 2 * ring; h < total; h += 32) {
        char req[64];
        snprintf(req, sizeof(req), "wrap-new-%zu", h);
        bool loading = query_ready(c, B.id, req, h, 32, &res);
        PFT_CHECK(loading && res.num_hit_blocks == 32, "last lap %zu: loading=%d hits=%u", h,
                  loading, res.num_hit_blocks);
        world_load(c, &B, res.lease, 32, 0);
        compare(&A, (uint32_t)h, &B, 0, 32);
    }
    /* a block whose range was overwritten is never served, even if asked after a live one */
    char req[64];
    snprintf(req, sizeof(req), "wrap-edge");
    bool loading = query_ready(c, B.id, req, 2 * ring - 1, 2, &res);
    PFT_CHECK(!loading && res.num_hit_blocks == 0, "edge: loading=%d hits=%u", loading,
              res.num_hit_blocks);
    PFT_CHECK(metric(&s, "pegaflow_integrity_failures_total{tier=\"ssd\"}") == 0, "integrity");
    pf_client_close(c);
    world_free(&A);
    world_free(&B);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr,
            "  wrap: %zu blocks through a %zu-block ring: old laps miss, last lap "
            "byte-exact\n",
            total, ring);
}

/* ---- faults ---- */

struct fault_case {
    const char *spec;
    const char *tag;
    size_t n;              /* blocks saved */
    size_t first_hits;     /* hits of the first full query after RAM cleanup */
    size_t write_failures; /* expected pegaflow_ssd_write_failures */
    double integrity;      /* expected integrity failures */
    bool read_fault;       /* a second query (new req) hits more than the first */
    size_t second_hits;
};

static void fault_one(const struct fault_case *fc)
{
    char path[512], ida[64], idb[64], ns[64];
    path_of(path, sizeof(path), fc->tag);
    snprintf(ida, sizeof(ida), "A-%s", fc->tag);
    snprintf(idb, sizeof(idb), "B-%s", fc->tag);
    snprintf(ns, sizeof(ns), "ns-%s", fc->tag);
    const uint64_t blk = blk_bytes(KV_SPLIT, 1, 2, 8192);
    const char *extra[] = {"--enable-debug", "--fault-spec", fc->spec, NULL};
    struct pft_proc s;
    start(&s, "16mb", path, "16mb", extra);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    world_init(&A, ida, ns, 1, 2, KV_SPLIT, fc->n, 8192, true);
    world_init(&B, idb, ns, 1, 2, KV_SPLIT, fc->n, 8192, false);
    world_register(c, &A);
    world_register(c, &B);
    /* one block per save: the injected write faults hit known blocks */
    for (size_t h = 0; h < fc->n; h++) {
        world_save(c, &A, h, (uint32_t)h, 1);
        wait_sealed(c, A.id, h, 1);
        wait_written(&s, 0, 0, blk, h + 1);
    }
    double wf = metric(&s, WFAIL);
    PFT_CHECK(wf == (double)fc->write_failures, "%s: %.0f write failures, want %zu", fc->tag, wf,
              fc->write_failures);
    cleanup_ram(&s);
    struct pf_query_result res;
    char req[64];
    snprintf(req, sizeof(req), "%s-1", fc->tag);
    bool loading = query_ready(c, B.id, req, 0, fc->n, &res);
    PFT_CHECK(res.num_hit_blocks == fc->first_hits, "%s: first query hit %u, want %zu (loading=%d)",
              fc->tag, res.num_hit_blocks, fc->first_hits, loading);
    if (res.num_hit_blocks) {
        world_load(c, &B, res.lease, res.num_hit_blocks, 0);
        compare(&A, 0, &B, 0, res.num_hit_blocks);
    }
    /* the faulty blocks are misses; the blocks after them are still on SSD */
    size_t after = fc->first_hits + (fc->write_failures ? fc->write_failures : 1);
    if (after < fc->n) {
        snprintf(req, sizeof(req), "%s-after", fc->tag);
        query_ready(c, B.id, req, after, fc->n - after, &res);
        PFT_CHECK(res.num_hit_blocks == fc->n - after, "%s: blocks after the fault hit %u of %zu",
                  fc->tag, res.num_hit_blocks, fc->n - after);
        world_load(c, &B, res.lease, res.num_hit_blocks, (uint32_t)after);
        compare(&A, (uint32_t)after, &B, (uint32_t)after, res.num_hit_blocks);
    }
    snprintf(req, sizeof(req), "%s-2", fc->tag);
    query_ready(c, B.id, req, 0, fc->n, &res);
    PFT_CHECK(res.num_hit_blocks == fc->second_hits, "%s: second query hit %u, want %zu", fc->tag,
              res.num_hit_blocks, fc->second_hits);
    if (res.lease_len)
        pf_client_release(c, res.lease, res.lease_len, TMO);
    double integ = metric(&s, "pegaflow_integrity_failures_total{tier=\"ssd\"}");
    PFT_CHECK(integ == fc->integrity, "%s: integrity failures %.0f, want %.0f", fc->tag, integ,
              fc->integrity);
    if (fc->read_fault || fc->integrity > 0)
        PFT_CHECK(metric(&s, "pegaflow_ssd_prefetch_failures_total") >= 1, "%s: prefetch failures",
                  fc->tag);
    PFT_CHECK(pf_client_health(c, TMO) == 0, "%s: health after faults", fc->tag);
    pf_client_close(c);
    world_free(&A);
    world_free(&B);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr,
            "  faults %s: first query %zu hit(s), write failures %zu, integrity failures %.0f, "
            "server kept serving\n",
            fc->tag, fc->first_hits, fc->write_failures, integ);
}

static void sc_faults(void)
{
    static const struct fault_case cases[] = {
        /* writes 5 and 6 fail at submission: blocks 4, 5 never reach the SSD */
        {"seed=1;blk.write:nth=5,times=2,error=EIO", "wr-eio", 12, 4, 2, 0, false, 4},
        /* write 3 fails at completion */
        {"seed=2;blk.write:nth=3,times=1,error=EIO,at=complete", "wr-eio-complete", 10, 2, 1, 0,
         false, 2},
        /* read 2 of the first prefetch fails: 1 hit; the entry stays, a retry hits all */
        {"seed=3;blk.read:nth=2,times=1,error=EIO", "rd-eio", 10, 1, 0, 0, true, 10},
        /* read 3 is corrupted: checksum mismatch, 2 hits, the entry is dropped */
        {"seed=4;blk.read:nth=3,times=1,corrupt=1", "rd-corrupt", 10, 2, 0, 1, true, 2},
    };
    for (size_t i = 0; i < PF_ARRAY_SIZE(cases); i++)
        fault_one(&cases[i]);
}

/* ---- queue full ---- */

static void sc_queuefull(void)
{
    char path[512];
    path_of(path, sizeof(path), "qfull.dat");
    /* the first write never completes: the writer holds the rest of that batch, one batch
     * waits in the queue, every later one is dropped */
    const char *extra[] = {"--enable-debug",
                           "--fault-spec",
                           "seed=5;blk.write:nth=1,times=1,drop=1",
                           "--ssd-write-queue-depth",
                           "1",
                           "--ssd-write-inflight",
                           "1",
                           NULL};
    struct pft_proc s;
    start(&s, "16mb", path, "16mb", extra);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A;
    world_init(&A, "qf-A", "ns-qf", 1, 2, KV_SPLIT, 16, 8192, true);
    world_register(c, &A);
    for (size_t h = 0; h < 16; h += 2) {
        world_save(c, &A, h, (uint32_t)h, 2);
        wait_sealed(c, A.id, h, 2);
        uint64_t dl = pft_now_ms() + TMO;
        while (h == 0 && metric(&s, "pegaflow_ssd_write_inflight") < 1)
            PFT_CHECK(pft_now_ms() < dl, "the writer did not start the first write");
    }
    double qf = metric(&s, "pegaflow_ssd_write_queue_full_total");
    PFT_CHECK(qf == 6, "queue-full drops %.0f, want 6 (8 batches: 1 writing, 1 queued)", qf);
    PFT_CHECK(metric(&s, "pegaflow_ssd_write_queue_pending") == 3,
              "pending %.0f, want 3 (1 of the writing batch + 2 queued)",
              metric(&s, "pegaflow_ssd_write_queue_pending"));
    /* the server keeps serving from RAM */
    struct pf_query_result res;
    PFT_CHECK(query(c, A.id, "qf", 0, 16, &res) == 0 && !res.loading && res.num_hit_blocks == 16,
              "RAM query while the writer is stalled: hits %u", res.num_hit_blocks);
    pf_client_release(c, res.lease, res.lease_len, TMO);
    PFT_CHECK(pf_client_health(c, TMO) == 0, "health");
    pf_client_close(c);
    world_free(&A);
    /* shutdown gives up on the lost write after a bounded grace */
    PFT_CHECK(pft_stop(&s, SIGTERM, 20000) == 0, "server exit code");
    fprintf(stderr, "  queuefull: %.0f batch(es) dropped and counted while the writer stalled\n",
            qf);
}

/* ---- restart ---- */

static void sc_restart(void)
{
    char path[512];
    path_of(path, sizeof(path), "restart/cache.dat");
    const uint64_t blk = blk_bytes(KV_SPLIT, 1, 2, 8192);
    struct pft_proc s;
    start(&s, "16mb", path, "8mb", NULL);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A;
    world_init(&A, "rs-A", "ns-rs", 1, 2, KV_SPLIT, 16, 8192, true);
    world_register(c, &A);
    world_save(c, &A, 0, 0, 16);
    wait_sealed(c, A.id, 0, 16);
    wait_written(&s, 0, 0, blk, 16);
    cleanup_ram(&s);
    struct pf_query_result res;
    bool loading = query_ready(c, A.id, "rs-1", 0, 16, &res);
    PFT_CHECK(loading && res.num_hit_blocks == 16, "before restart: loading=%d hits=%u", loading,
              res.num_hit_blocks);
    pf_client_release(c, res.lease, res.lease_len, TMO);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGINT, 15000) == 0, "server exit code");

    start(&s, "16mb", path, "8mb", NULL);
    PFT_CHECK(pft_log_contains(&s, "a restart begins with an empty SSD cache"),
              "start-up log does not say the SSD cache starts empty");
    struct stat st;
    PFT_CHECK(stat(path, &st) == 0 && st.st_size == 8 << 20, "cache file size %lld",
              (long long)st.st_size);
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    world_register(c, &A);
    PFT_CHECK(query(c, A.id, "rs-2", 0, 16, &res) == 0, "query");
    PFT_CHECK(!res.loading && res.num_hit_blocks == 0, "after restart: loading=%d hits=%u",
              res.loading, res.num_hit_blocks);
    pf_client_close(c);
    world_free(&A);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr, "  restart: the SSD cache starts empty (file truncated and resized)\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ssd_e2e <dir> [scenario...]\n");
        return 2;
    }
    dir = argv[1];
    seed = pft_seed();
    static const struct {
        const char *name;
        void (*fn)(void);
    } sc[] = {{"spill", sc_spill},
              {"wrap", sc_wrap},
              {"faults", sc_faults},
              {"queuefull", sc_queuefull},
              {"restart", sc_restart}};
    for (size_t i = 0; i < PF_ARRAY_SIZE(sc); i++) {
        bool run = argc < 3;
        for (int a = 2; a < argc; a++)
            run |= strcmp(argv[a], sc[i].name) == 0;
        if (!run)
            continue;
        fprintf(stderr, "scenario %s\n", sc[i].name);
        sc[i].fn();
    }
    fprintf(stderr, "all scenarios passed\n");
    return 0;
}

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
 *   spare      pressure eviction takes blocks already on SSD before blocks still queued
 *              for their write; with only queued blocks left it evicts them, counted
 *   restart    kill -9 after the writes, restart on the same file: every block served
 *              from the SSD byte-exact; --ssd-recover off starts empty
 *   sigterm    SIGTERM while the writer is busy: the drain writes every sealed block,
 *              all recovered byte-exact
 *   crashloop  20 rounds (PF_SSD_CRASH_ROUNDS) of kill -9 at a seeded random point of a
 *              write burst: committed blocks always come back, 0 wrong bytes ever
 *   geometry   another block size in the same namespace: the old records are dropped
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
#include "world.h"
#include "pf/common.h"
#include "pftest.h"

#define TMO 20000

static uint64_t seed;
static const char *dir;

#define WBYTES  "pegaflow_ssd_write_bytes_total"
#define WBLOCKS "pegaflow_ssd_write_blocks_total"
/* The record header in front of every block on SSD: 4 KiB for the worlds here (few slots,
 * short namespaces; docs/ssd.md, "On-disk format"). */
#define REC_HDR 4096
#define WFAIL   "pegaflow_ssd_write_failures_total"

/* Waits until the SSD writer has handled `blocks` more blocks (committed or failed) than
 * base_* recorded. */
static void wait_written(struct pft_proc *s, double base_blocks, double base_fail,
                         uint64_t blk_bytes, size_t blocks)
{
    (void)blk_bytes;
    uint64_t dl = pft_now_ms() + TMO;
    for (;;) {
        double done = (metric(s, WBLOCKS) - base_blocks) + (metric(s, WFAIL) - base_fail);
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
    double b0 = metric(&s, WBYTES), k0 = metric(&s, WBLOCKS), f0 = metric(&s, WFAIL);
    /* the writer keeps up with one chunk (a quarter of the pool) at a time, so every block
     * reaches the SSD before pressure can evict it */
    for (size_t h = 0; h < total; h += chunk) {
        size_t n = PF_MIN_OF(chunk, total - h);
        world_save_ok(c, &A, h, (uint32_t)h, n);
        wait_sealed(c, A.id, h, n);
        wait_written(&s, k0, f0, blk, h + n);
    }
    PFT_CHECK(metric(&s, WFAIL) == f0, "SSD write failures without faults");
    PFT_CHECK(metric(&s, WBYTES) - b0 == (double)(total * (blk + REC_HDR)),
              "SSD bytes written %.0f, want %llu", metric(&s, WBYTES) - b0,
              (unsigned long long)(total * (blk + REC_HDR)));
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
        world_load_ok(c, &B, res.lease, n, 0);
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
    /* records that fit one lap: the file holds a superblock, then records of header + block */
    const size_t ring = ((8u << 20) - 4096) / (blk + REC_HDR), total = 3 * ring, chunk = 16;
    struct pft_proc s;
    start(&s, "4mb", path, "8mb", NULL);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    world_init(&A, "wrap-A", "ns-wrap", 1, 2, KV_SPLIT, total, 16384, true);
    world_init(&B, "wrap-B", "ns-wrap", 1, 2, KV_SPLIT, 32, 16384, false);
    world_register(c, &A);
    world_register(c, &B);
    double b0 = metric(&s, WBLOCKS), f0 = metric(&s, WFAIL);
    for (size_t h = 0; h < total; h += chunk) {
        size_t n = PF_MIN_OF(chunk, total - h);
        world_save_ok(c, &A, h, (uint32_t)h, n);
        wait_sealed(c, A.id, h, n);
        wait_written(&s, b0, f0, blk, h + n);
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
        size_t n = PF_MIN_OF(32, total - h);
        snprintf(req, sizeof(req), "wrap-new-%zu", h);
        bool loading = query_ready(c, B.id, req, h, n, &res);
        PFT_CHECK(loading && res.num_hit_blocks == n, "last lap %zu: loading=%d hits=%u", h,
                  loading, res.num_hit_blocks);
        world_load_ok(c, &B, res.lease, n, 0);
        compare(&A, (uint32_t)h, &B, 0, n);
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
    const char *read_merge; /* --ssd-read-merge (NULL: the default, 8 records a read) */
};

static void fault_one(const struct fault_case *fc)
{
    char path[512], ida[64], idb[64], ns[64];
    path_of(path, sizeof(path), fc->tag);
    snprintf(ida, sizeof(ida), "A-%s", fc->tag);
    snprintf(idb, sizeof(idb), "B-%s", fc->tag);
    snprintf(ns, sizeof(ns), "ns-%s", fc->tag);
    const uint64_t blk = blk_bytes(KV_SPLIT, 1, 2, 8192);
    const char *extra[] = {"--enable-debug", "--fault-spec",
                           fc->spec,         fc->read_merge ? "--ssd-read-merge" : NULL,
                           fc->read_merge,   NULL};
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
        world_save_ok(c, &A, h, (uint32_t)h, 1);
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
        world_load_ok(c, &B, res.lease, res.num_hit_blocks, 0);
        compare(&A, 0, &B, 0, res.num_hit_blocks);
    }
    /* the faulty blocks are misses; the blocks after them are still on SSD */
    size_t after = fc->first_hits + (fc->write_failures ? fc->write_failures : 1);
    if (after < fc->n) {
        snprintf(req, sizeof(req), "%s-after", fc->tag);
        query_ready(c, B.id, req, after, fc->n - after, &res);
        PFT_CHECK(res.num_hit_blocks == fc->n - after, "%s: blocks after the fault hit %u of %zu",
                  fc->tag, res.num_hit_blocks, fc->n - after);
        world_load_ok(c, &B, res.lease, res.num_hit_blocks, (uint32_t)after);
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
        /* (write 1 and read 1 are the superblock's at start-up)
         * writes 6 and 7 fail at submission: blocks 4, 5 never reach the SSD */
        {"seed=1;blk.write:nth=6,times=2,error=EIO", "wr-eio", 12, 4, 2, 0, false, 4, NULL},
        /* write 4 (block 2) fails at completion */
        {"seed=2;blk.write:nth=4,times=1,error=EIO,at=complete", "wr-eio-complete", 10, 2, 1, 0,
         false, 2, NULL},
        /* one block per read (--ssd-read-merge 1), so that the read faults hit known blocks:
         * read 2 of the first prefetch fails: 1 hit; the entry stays, a retry hits all */
        {"seed=3;blk.read:nth=3,times=1,error=EIO", "rd-eio", 10, 1, 0, 0, true, 10, "1"},
        /* read 4 (block 2) is corrupted: checksum mismatch, 2 hits, the entry is dropped */
        {"seed=4;blk.read:nth=4,times=1,corrupt=1", "rd-corrupt", 10, 2, 0, 1, true, 2, "1"},
        /* vectored reads (the default): the first prefetch reads blocks 0..7 in one request
         * (read 2), which fails: no hit, every entry stays (blocks 1..9 hit from a query
         * that starts after block 0, a retry hits all ten) */
        {"seed=6;blk.read:nth=2,times=1,error=EIO", "rd-eio-vec", 10, 0, 0, 0, true, 10, NULL},
    };
    for (size_t i = 0; i < PF_ARRAY_SIZE(cases); i++)
        fault_one(&cases[i]);
}

/* ---- queue full ---- */

static void sc_queuefull(void)
{
    char path[512];
    path_of(path, sizeof(path), "qfull.dat");
    /* the first write request never completes: the writer holds the first batch (10
     * blocks: 8 placed, the FIFO of 8 x --ssd-write-inflight slots full, 2 not yet
     * placed), one batch waits in the queue, every later one is dropped */
    const char *extra[] = {"--enable-debug",
                           "--fault-spec",
                           "seed=5;blk.write:nth=2,times=1,drop=1", /* 1: the superblock */
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
    world_save_ok(c, &A, 0, 0, 10);
    wait_sealed(c, A.id, 0, 10);
    uint64_t dl = pft_now_ms() + TMO;
    while (metric(&s, "pegaflow_ssd_write_inflight") < 8)
        PFT_CHECK(pft_now_ms() < dl, "the writer did not place the first 8 writes");
    for (size_t h = 10; h < 16; h += 2) {
        world_save_ok(c, &A, h, (uint32_t)h, 2);
        wait_sealed(c, A.id, h, 2);
    }
    double qf = metric(&s, "pegaflow_ssd_write_queue_full_total");
    PFT_CHECK(qf == 2, "queue-full drops %.0f, want 2 (4 batches: 1 writing, 1 queued)", qf);
    PFT_CHECK(metric(&s, "pegaflow_ssd_write_queue_pending") == 4,
              "pending %.0f, want 4 (2 of the writing batch + 2 queued)",
              metric(&s, "pegaflow_ssd_write_queue_pending"));
    PFT_CHECK(metric(&s, "pegaflow_ssd_write_inflight") == 8, "placed writes %.0f, want 8",
              metric(&s, "pegaflow_ssd_write_inflight"));
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

/* ---- spare ---- */

/* Pressure eviction takes blocks already on SSD before blocks still queued for their write.
 * The writer is stalled for good (one write in flight that never completes) right after
 * chunk 1 is on SSD; chunk 2 is saved and waits in the queue; chunk 1 is hit (second chance,
 * so plain LRU would take chunk 2 first); saving chunk 3 must evict chunk 1, leaving every
 * block of chunk 2 resident. Chunk 4 then finds only queued blocks: those are evicted (the
 * reference's behaviour), counted, and the save succeeds. */
static void sc_spare(void)
{
    char path[512];
    path_of(path, sizeof(path), "spare.dat");
    const uint64_t seg = 8192, blk = blk_bytes(KV_SPLIT, 1, 2, seg);
    const size_t n = 192; /* 6 MiB a chunk in a 16 MiB pool */
    char fault[96];
    snprintf(fault, sizeof(fault), "seed=9;blk.write:nth=%zu,times=1,drop=1", n + 2);
    const char *extra[] = {"--enable-debug", "--fault-spec", fault, "--ssd-write-inflight", "1",
                           /* one record per write request: write n + 2 is chunk 2's first block */
                           "--ssd-write-merge", "1", NULL};
    struct pft_proc s;
    start(&s, "16mb", path, "64mb", extra);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    world_init(&A, "sp-A", "ns-sp", 1, 2, KV_SPLIT, 4 * n, seg, true);
    world_init(&B, "sp-B", "ns-sp", 1, 2, KV_SPLIT, n, seg, false);
    world_register(c, &A);
    world_register(c, &B);
    world_save_ok(c, &A, 0, 0, n);
    wait_sealed(c, A.id, 0, n);
    wait_written(&s, 0, 0, blk, n);
    world_save_ok(c, &A, n, (uint32_t)n, n);
    wait_sealed(c, A.id, n, n);
    uint64_t dl = pft_now_ms() + TMO;
    while (metric(&s, "pegaflow_ssd_write_inflight") < 1 ||
           metric(&s, "pegaflow_ssd_write_queue_pending") < (double)(n - 1))
        PFT_CHECK(pft_now_ms() < dl, "chunk 2 not queued behind the stalled write");
    PFT_CHECK(metric(&s, WBYTES) == (double)(n * (blk + REC_HDR)), "chunk 2 reached the SSD");
    struct pf_query_result res; /* hit chunk 1: its blocks get a second chance */
    PFT_CHECK(query(c, A.id, "sp-hit", 0, n, &res) == 0 && res.num_hit_blocks == n,
              "chunk 1 hits %u", res.num_hit_blocks);
    pf_client_release(c, res.lease, res.lease_len, TMO);
    double ev0 = metric(&s, "pegaflow_cache_block_evictions_total");
    world_save_ok(c, &A, 2 * n, (uint32_t)(2 * n), n);
    wait_sealed(c, A.id, 2 * n, n);
    double ev = metric(&s, "pegaflow_cache_block_evictions_total") - ev0;
    PFT_CHECK(ev >= (double)n, "chunk 3 evicted only %.0f block(s)", ev);
    PFT_CHECK(metric(&s, "pegaflow_cache_block_evictions_ssd_queued_total") == 0,
              "blocks queued for SSD were evicted while chunk 1 (on SSD) was evictable");
    PFT_CHECK(query(c, B.id, "sp-2", n, n, &res) == 0 && !res.loading && res.num_hit_blocks == n,
              "chunk 2 after the pressure: %u of %zu resident (loading=%d)", res.num_hit_blocks, n,
              res.loading);
    world_load_ok(c, &B, res.lease, n, 0);
    compare(&A, (uint32_t)n, &B, 0, n);
    /* only queued blocks are left to evict: they go, counted, and the save succeeds */
    world_save_ok(c, &A, 3 * n, (uint32_t)(3 * n), n);
    wait_sealed(c, A.id, 3 * n, n);
    double q = metric(&s, "pegaflow_cache_block_evictions_ssd_queued_total");
    PFT_CHECK(q >= 1, "chunk 4 fitted without evicting a queued block");
    PFT_CHECK(query(c, B.id, "sp-4", 3 * n, n, &res) == 0 && res.num_hit_blocks == n,
              "chunk 4 hits %u", res.num_hit_blocks);
    world_load_ok(c, &B, res.lease, n, 0);
    compare(&A, (uint32_t)(3 * n), &B, 0, n);
    PFT_CHECK(pf_client_health(c, TMO) == 0, "health");
    pf_client_close(c);
    world_free(&A);
    world_free(&B);
    PFT_CHECK(pft_stop(&s, SIGTERM, 20000) == 0, "server exit code");
    fprintf(stderr,
            "  spare: queued chunk kept resident under pressure (%.0f evictions took the chunk "
            "on SSD); with nothing else left, %.0f queued block(s) evicted and counted\n",
            ev, q);
}

/* ---- restart ---- */

#define RSTATE  "pegaflow_ssd_recovery_state"
#define RBLOCKS "pegaflow_ssd_recovered_blocks"

/* Waits until the recovery scan of a fresh start is finished (state 2). */
static void wait_recovered(struct pft_proc *s)
{
    uint64_t dl = pft_now_ms() + TMO;
    while (metric(s, RSTATE) != 2) {
        PFT_CHECK(pft_now_ms() < dl, "SSD recovery not finished after %d ms", TMO);
        usleep(5000);
    }
}

static uint64_t rng_state;
static uint64_t rnd(uint64_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return n ? rng_state % n : 0;
}

/* Queries A's blocks [h0, h0 + n) through B (fresh RAM: every hit comes from the SSD) and
 * loads every hit run: byte-exact or the test fails. present[i] (may be NULL) gets whether
 * block h0 + i was served. Returns the number served. */
static size_t check_served(struct pf_client *c, struct world *A, struct world *B, uint64_t h0,
                           size_t n, const char *tag, bool *present)
{
    size_t served = 0;
    uint64_t h = h0;
    while (h < h0 + n) {
        char req[96];
        snprintf(req, sizeof(req), "%s-%llu", tag, (unsigned long long)h);
        struct pf_query_result res;
        bool loading = query_ready(c, B->id, req, h, (size_t)(h0 + n - h), &res);
        size_t k = res.num_hit_blocks;
        if (k == 0) {
            if (present)
                present[h - h0] = false;
            h++;
            continue;
        }
        PFT_CHECK(loading, "%s: %zu block(s) from %llu hit without an SSD load", tag, k,
                  (unsigned long long)h);
        world_load_ok(c, B, res.lease, k, (uint32_t)h);
        compare(A, (uint32_t)h, B, (uint32_t)h, k);
        for (size_t i = 0; present && i < k; i++)
            present[h - h0 + i] = true;
        served += k;
        h += k;
    }
    return served;
}

static void sc_restart(void)
{
    /* N blocks on SSD, kill -9, restart on the same file: every block served from the SSD,
     * byte-exact; then --ssd-recover off starts it empty */
    char path[512];
    path_of(path, sizeof(path), "restart/cache.dat");
    enum { N = 24 };
    struct pft_proc s;
    start(&s, "16mb", path, "8mb", NULL);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    world_init(&A, "rs-A", "ns-rs", 1, 2, KV_SPLIT, N, 8192, true);
    world_init(&B, "rs-B", "ns-rs", 1, 2, KV_SPLIT, N, 8192, false);
    world_register(c, &A);
    world_save_ok(c, &A, 0, 0, N);
    wait_sealed(c, A.id, 0, N);
    wait_written(&s, 0, 0, 0, N);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGKILL, 15000) == 128 + SIGKILL, "kill -9");

    start(&s, "16mb", path, "8mb", NULL);
    PFT_CHECK(pft_log_contains(&s, "recovering it in the background"),
              "start-up log does not announce the recovery");
    wait_recovered(&s);
    PFT_CHECK(metric(&s, RBLOCKS) == N, "recovered %.0f block(s), want %d", metric(&s, RBLOCKS), N);
    PFT_CHECK(pft_wait_log(&s, "SSD recovery done: 24 block(s)", TMO), "no end-of-scan log line");
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    world_register(c, &B);
    struct pf_query_result res;
    bool loading = query_ready(c, B.id, "rs-1", 0, N, &res);
    PFT_CHECK(loading && res.num_hit_blocks == N, "after kill -9: loading=%d hits=%u", loading,
              res.num_hit_blocks);
    world_load_ok(c, &B, res.lease, N, 0);
    compare(&A, 0, &B, 0, N);
    PFT_CHECK(metric(&s, "pegaflow_integrity_failures_total{tier=\"ssd\"}") == 0, "integrity");
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");

    const char *off[] = {"--ssd-recover", "off", NULL};
    start(&s, "16mb", path, "8mb", off);
    PFT_CHECK(pft_log_contains(&s, "formatted empty (--ssd-recover off)"),
              "start-up log does not say the SSD cache starts empty");
    struct stat st;
    PFT_CHECK(stat(path, &st) == 0 && st.st_size == 8 << 20, "cache file size %lld",
              (long long)st.st_size);
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    world_register(c, &B);
    PFT_CHECK(query(c, B.id, "rs-2", 0, N, &res) == 0, "query");
    PFT_CHECK(!res.loading && res.num_hit_blocks == 0, "--ssd-recover off: loading=%d hits=%u",
              res.loading, res.num_hit_blocks);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    world_free(&A);
    world_free(&B);
    fprintf(stderr,
            "  restart: %d blocks served from the SSD after kill -9, byte-exact; "
            "--ssd-recover off starts empty\n",
            N);
}

static void sc_sigterm(void)
{
    /* SIGTERM while the writer is busy: the drain writes every sealed block before exit,
     * and all of them come back after the restart */
    char path[512];
    path_of(path, sizeof(path), "sigterm.dat");
    enum { N = 96, CH = 8 };
    const char *extra[] = {"--ssd-write-queue-depth",
                           "1024",
                           "--ssd-write-inflight",
                           "1",
                           "--ssd-drain-timeout-secs",
                           "60",
                           NULL};
    struct pft_proc s;
    start(&s, "16mb", path, "16mb", extra);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, B;
    world_init(&A, "st-A", "ns-st", 1, 2, KV_SPLIT, N, 8192, true);
    world_init(&B, "st-B", "ns-st", 1, 2, KV_SPLIT, N, 8192, false);
    world_register(c, &A);
    for (size_t h = 0; h < N; h += CH)
        world_save_ok(c, &A, h, (uint32_t)h, CH);
    wait_sealed(c, A.id, 0, N);
    double before = metric(&s, WBLOCKS);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 60000) == 0, "server exit code");
    PFT_CHECK(pft_log_contains(&s, "SSD drain"), "no drain log line");
    start(&s, "16mb", path, "16mb", extra);
    wait_recovered(&s);
    PFT_CHECK(metric(&s, RBLOCKS) == N, "recovered %.0f of %d block(s) after SIGTERM",
              metric(&s, RBLOCKS), N);
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    world_register(c, &B);
    size_t got = check_served(c, &A, &B, 0, N, "st", NULL);
    PFT_CHECK(got == N, "served %zu of %d after SIGTERM", got, N);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    world_free(&A);
    world_free(&B);
    fprintf(stderr,
            "  sigterm: %.0f of %d block(s) written when SIGTERM came, all %d after the drain "
            "and restart, byte-exact\n",
            before, N, N);
}

static void sc_crashloop(void)
{
    /* rounds of: restart on the same file, check every block saved so far (those the
     * writer had committed before the kill must all be served; whatever else is served must
     * be byte-exact), save a burst, kill -9 at a random point of it */
    char path[512];
    path_of(path, sizeof(path), "crash.dat");
    const char *env = getenv("PF_SSD_CRASH_ROUNDS");
    const size_t rounds = env ? strtoul(env, NULL, 10) : 20, burst = 32;
    const size_t total = rounds * burst;
    rng_state = seed ? seed : 88172645463325252ull;
    struct world A, B;
    world_init(&A, "cl-A", "ns-cl", 1, 1, KV_SPLIT, total, 4096, true);
    world_init(&B, "cl-B", "ns-cl", 1, 1, KV_SPLIT, total, 4096, false);
    bool *durable = calloc(total, sizeof(bool)), *present = calloc(total, sizeof(bool));
    PFT_CHECK(durable && present, "oom");
    size_t served_total = 0, recovered_total = 0;
    for (size_t r = 0; r <= rounds; r++) {
        struct pft_proc s;
        /* a deep write queue: no batch is dropped, so blocks commit in save order and the
         * first w of the burst are the committed ones */
        const char *deep[] = {"--ssd-write-queue-depth", "4096", NULL};
        start(&s, "8mb", path, "16mb", deep);
        wait_recovered(&s);
        double rec = metric(&s, RBLOCKS);
        recovered_total += (size_t)rec;
        struct pf_client *c;
        PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
        world_register(c, &A);
        world_register(c, &B);
        size_t done = r * burst;
        char tag[32];
        snprintf(tag, sizeof(tag), "cl%zu", r);
        size_t got = done ? check_served(c, &A, &B, 0, done, tag, present) : 0;
        for (size_t i = 0; i < done; i++)
            PFT_CHECK(!durable[i] || present[i],
                      "round %zu: block %zu was committed before the kill but is not served", r, i);
        PFT_CHECK(got == (size_t)rec, "round %zu: %zu block(s) served, %.0f recovered", r, got,
                  rec);
        served_total += got;
        if (r == rounds) {
            pf_client_close(c);
            PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
            break;
        }
        /* the burst: one block per save, the kill after a random number of commits */
        double w0 = metric(&s, WBLOCKS);
        size_t kill_after = (size_t)rnd(burst + 1);
        for (size_t i = 0; i < burst; i++)
            world_save_ok(c, &A, done + i, (uint32_t)(done + i), 1);
        uint64_t dl = pft_now_ms() + TMO;
        double w = 0;
        while ((w = metric(&s, WBLOCKS) - w0) < (double)kill_after) {
            if (pft_now_ms() >= dl)
                break; /* dropped as queue-full: kill anyway */
            usleep(500);
        }
        /* every block committed by now is durable (its write completed) */
        for (size_t i = 0; i < (size_t)w && i < burst; i++)
            durable[done + i] = true;
        pf_client_close(c);
        PFT_CHECK(pft_stop(&s, SIGKILL, 15000) == 128 + SIGKILL, "kill -9");
    }
    free(durable);
    free(present);
    world_free(&A);
    world_free(&B);
    fprintf(stderr,
            "  crashloop: %zu round(s) of kill -9 during a %zu-block burst: %zu block(s) "
            "recovered in all, %zu served, 0 wrong bytes\n",
            rounds, burst, recovered_total, served_total);
}

static void sc_geometry(void)
{
    /* the same namespace and hashes with another block size: once the new run seals a
     * block, the old records are dropped (never Loading, never served) */
    char path[512];
    path_of(path, sizeof(path), "geometry.dat");
    enum { N = 8 };
    struct pft_proc s;
    start(&s, "16mb", path, "8mb", NULL);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct world A, A2, B2;
    world_init(&A, "geo-A", "ns-geo", 1, 2, KV_SPLIT, N, 8192, true);
    world_register(c, &A);
    world_save_ok(c, &A, 0, 0, N);
    wait_sealed(c, A.id, 0, N);
    wait_written(&s, 0, 0, 0, N);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    start(&s, "16mb", path, "8mb", NULL);
    wait_recovered(&s);
    PFT_CHECK(metric(&s, RBLOCKS) == N, "recovered %.0f", metric(&s, RBLOCKS));
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    world_init(&A2, "geo-A2", "ns-geo", 1, 2, KV_SPLIT, N + 1, 4096, true);
    world_init(&B2, "geo-B2", "ns-geo", 1, 2, KV_SPLIT, N + 1, 4096, false);
    world_register(c, &A2);
    world_register(c, &B2);
    world_save_ok(c, &A2, N, N, 1); /* a new hash in the new geometry */
    wait_sealed(c, A2.id, N, 1);
    wait_written(&s, 0, 0, 0, 1);
    PFT_CHECK(metric(&s, "pegaflow_ssd_recovery_dropped_records_total{reason=\"geometry\"}") == N,
              "geometry drops %.0f, want %d",
              metric(&s, "pegaflow_ssd_recovery_dropped_records_total{reason=\"geometry\"}"), N);
    struct pf_query_result res;
    PFT_CHECK(query(c, B2.id, "geo-1", 0, N, &res) == 0, "query");
    PFT_CHECK(!res.loading && res.num_hit_blocks == 0, "old geometry: loading=%d hits=%u",
              res.loading, res.num_hit_blocks);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    world_free(&A);
    world_free(&A2);
    world_free(&B2);
    fprintf(stderr, "  geometry: %d records of another block size dropped, never served\n", N);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ssd_e2e <dir> [scenario...]\n");
        return 2;
    }
    dir = argv[1];
    seed = world_seed = pft_seed();
    world_hash_base = 5000000;
    world_tmo = TMO;
    static const struct pft_scenario sc[] = {
        {"spill", sc_spill},         {"wrap", sc_wrap},           {"faults", sc_faults},
        {"queuefull", sc_queuefull}, {"spare", sc_spare},         {"restart", sc_restart},
        {"sigterm", sc_sigterm},     {"crashloop", sc_crashloop}, {"geometry", sc_geometry}};
    return pft_run_scenarios(sc, PF_ARRAY_SIZE(sc), argv + 2, argc - 2);
}

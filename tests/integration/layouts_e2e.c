/* Model layouts end to end against a real pegaflow-server (sim GPUs), driven through
 * libpegaflow (reference §2.3, §3.2, §3.3; issue 15 §2):
 *   mla      MLA-like TP=4, page-first replicas (tp_size 1, world 4) with striped saves (each
 *            rank saves the blocks with id % 4 == rank): every block stored once (resident
 *            blocks +N, pool and footprint 1/4 of the same layers registered layer-first with
 *            tp_size 4), every rank loads every block byte-exact; partial-layer and
 *            mismatched-list page-first saves are INVALID_ARGUMENT
 *   split    MLA layer-split shards (two disjoint layer sets, each on two replicas): a block
 *            is visible only when both shards saved it; every device loads its own layers
 *            byte-exact; overlapping layer sets are INVALID_ARGUMENT
 *   hybrid   attention group (0, KV-first split) and recurrent group (1, one segment) on
 *            TP=2: a mixed-group Save, sparse recurrent saves; group-1 membership answers
 *            exactly the saved positions (hit_positions, lease of those blocks), the
 *            want-set (wait_for_full_prefix) is all-or-nothing with positions 0..n-1, an
 *            unknown group is INVALID_ARGUMENT; one Load of two leases restores both groups
 *            byte-exact; a recurrent lease aimed at attention layers is refused
 *   ssd      (needs --ssd-dir DIR) page-first replicas, layer-split shards and the hybrid
 *            model written to SSD, RAM dropped (POST /cache/memory/cleanup), then loaded
 *            back from SSD (Loading -> Ready) byte-exact
 * Usage: layouts_e2e [--ssd-dir DIR] [scenario...]. Seed: PF_TEST_SEED. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "layouts.h"
#include "pf/common.h"
#include "pftest.h"
#include "world.h"

#define TMO 20000
enum { INV = 3, FP = 9 };

static const char *ssd_dir;

static void start(struct pft_proc *s, const char *gpus, const char *pool, bool ssd)
{
    char path[512];
    const char *args[16] = {"--gpu-backend", "sim", "--sim-gpus", gpus, "--pool-size", pool};
    size_t n = 6;
    if (ssd) {
        snprintf(path, sizeof(path), "%s/layouts-%d.dat", ssd_dir, getpid());
        args[n++] = "--ssd-cache-path";
        args[n++] = path;
        args[n++] = "--ssd-cache-capacity";
        args[n++] = "64mb";
    }
    args[n] = NULL;
    PFT_CHECK(pft_start(s, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
}

static void ids_range(uint32_t *ids, uint64_t *hp, size_t n, uint32_t first)
{
    for (size_t i = 0; i < n; i++) {
        ids[i] = first + (uint32_t)i;
        if (hp)
            hp[i] = ids[i];
    }
}

#define RETAINED "pegaflow_cache_resident_blocks{class=\"retained\"}"
#define RBYTES   "pegaflow_cache_resident_bytes"
#define PUSED    "pegaflow_pool_used_bytes"

/* ---- mla ---- */

static void sc_mla(void)
{
    struct pft_proc s;
    start(&s, "4", "64mb", false);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    const size_t N = 32;
    const uint64_t page = 4096 + 2 * 2048 + 12288; /* m.0, m.1 (K/V adjacent), m.2 */
    struct lworld S, D, U;
    lw_mla(&S, "mla-src", "ns-mla", 4, false, 64, 1, true);
    lw_register(c, &S);

    /* a page-first save writes whole pages */
    uint32_t ids[64];
    uint64_t hp[64];
    ids_range(ids, hp, N, 1);
    EXPECT(lw_save(c, &S, 0, 1u, ids, hp, 2), INV,
           "page_first: a save must cover all 3 layers of device 0's shard, got 1 (layer m.1 "
           "is missing)");
    {
        uint8_t h[3 * HLEN];
        for (int i = 0; i < 3; i++)
            hash_of(1 + (uint64_t)i, h + i * HLEN);
        uint32_t a[2] = {1, 2}, b[2] = {1, 3};
        struct pf_save_layer sl[3] = {
            {.name = "m.0", .block_ids = a, .hashes = h, .hash_len = HLEN, .n = 2},
            {.name = "m.1", .block_ids = b, .hashes = h, .hash_len = HLEN, .n = 2},
            {.name = "m.2", .block_ids = a, .hashes = h, .hash_len = HLEN, .n = 2}};
        EXPECT(pf_client_save(c, S.id, 0, 0, 0, sl, 3, TMO), INV,
               "page_first: layer m.1 saves another block list than layer m.0");
    }

    double b0 = metric(&s, RETAINED), y0 = metric(&s, RBYTES), p0 = metric(&s, PUSED);
    lw_save_striped(c, &S, ids, N);
    lw_wait_sealed(c, S.id, hp, N);
    double b1 = metric(&s, RETAINED), y1 = metric(&s, RBYTES), p1 = metric(&s, PUSED);
    PFT_CHECK(b1 - b0 == (double)N, "page-first: %.0f blocks resident, want %zu (stored once)",
              b1 - b0, N);
    PFT_CHECK(y1 - y0 == (double)(N * page), "page-first footprint %.0f, want %llu", y1 - y0,
              (unsigned long long)(N * page));
    PFT_CHECK(p1 - p0 == (double)(N * page), "page-first pool usage %.0f, want %llu", p1 - p0,
              (unsigned long long)(N * page));
    /* a replica saving the same pages again stores nothing more */
    PFT_CHECK(lw_save(c, &S, 3, ~0u, ids, hp, N) == 0, "replica re-save: %s",
              pf_last_error_message());
    lw_wait_sealed(c, S.id, hp, N);
    PFT_CHECK(metric(&s, PUSED) == p1 && metric(&s, RETAINED) == b1, "a re-save stored again");

    /* the same layers layer-first on TP=4: one copy per rank */
    lw_mla_uncollapsed(&U, "mla-tp4", "ns-mla-tp4", 4, 64, 1);
    lw_register(c, &U);
    for (int r = 0; r < 4; r++)
        PFT_CHECK(lw_save(c, &U, r, ~0u, ids, hp, N) == 0, "layer-first save: %s",
                  pf_last_error_message());
    lw_wait_sealed(c, U.id, hp, N);
    double b2 = metric(&s, RETAINED), y2 = metric(&s, RBYTES), p2 = metric(&s, PUSED);
    PFT_CHECK(b2 - b1 == (double)N, "layer-first: %.0f blocks", b2 - b1);
    PFT_CHECK(y2 - y1 == 4 * (y1 - y0), "footprint: page-first %.0f, layer-first TP4 %.0f", y1 - y0,
              y2 - y1);
    PFT_CHECK(p2 - p1 == 4 * (p1 - p0), "pool usage: page-first %.0f, layer-first TP4 %.0f",
              p1 - p0, p2 - p1);
    fprintf(stderr,
            "  mla: %zu blocks stored once: pool +%.0f bytes page-first vs +%.0f layer-first "
            "TP4 (ratio %.2f)\n",
            N, p1 - p0, p2 - p1, (p1 - p0) / (p2 - p1));

    /* every rank of another instance loads every block (saved by any rank) byte-exact */
    lw_mla(&D, "mla-dst", "ns-mla", 4, false, 64, 1, false);
    lw_register(c, &D);
    lw_fetch_all(c, &D, &S, "mla-1", ids, N, 16);
    for (int r = 0; r < 4; r++)
        for (int l = 0; l < D.nl; l++)
            PFT_CHECK(lw_zero(&D, r, l, 0) && lw_zero(&D, r, l, 16),
                      "device %d layer %d: a block outside the targets was written", r, l);
    fprintf(stderr, "  mla: 4 ranks x %zu blocks loaded byte-exact\n", N);
    /* the topology is fixed: a page-first instance cannot gain a layer-first worker */
    {
        struct lworld X;
        lw_mla(&X, "mla-dst", "ns-mla", 1, false, 4, 9, false);
        X.page_first = false;
        EXPECT(lw_register_dev(c, &X, 0), FP, "topology mismatch");
        lw_free(&X);
    }
    lw_free(&S);
    lw_free(&D);
    lw_free(&U);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
}

/* ---- split ---- */

static void sc_split(void)
{
    struct pft_proc s;
    start(&s, "4", "64mb", false);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    const size_t N = 24;
    struct lworld S, D;
    lw_mla(&S, "split-src", "ns-split", 4, true, 64, 2, true);
    lw_register(c, &S);
    uint32_t ids[64], half[4] = {60, 61, 62, 63};
    uint64_t hp[64], hhalf[4] = {100, 101, 102, 103};
    ids_range(ids, hp, N, 1);
    /* device 0's shard only (m.0, m.1) for hashes 100..103: never visible. The insert thread
     * handles saves in order, so once the later saves are sealed this one was handled too. */
    PFT_CHECK(lw_save(c, &S, 0, ~0u, half, hhalf, 4) == 0, "half save: %s",
              pf_last_error_message());
    lw_save_striped(c, &S, ids, N);
    lw_wait_sealed(c, S.id, hp, N);
    struct pf_query_result res;
    PFT_CHECK(lw_query(c, S.id, "half", 0, hhalf, 4, 0, &res, NULL) == 0 && res.num_hit_blocks == 0,
              "a block with one of two shards saved is visible (%u hits)", res.num_hit_blocks);
    lw_mla(&D, "split-dst", "ns-split", 4, true, 64, 2, false);
    lw_register(c, &D);
    lw_fetch_all(c, &D, &S, "split-1", ids, N, 30);
    fprintf(stderr, "  split: 2 shards x 2 replicas, %zu blocks byte-exact on every device\n", N);

    /* overlapping layer sets are refused when the instance seals */
    struct lworld O;
    lw_init(&O, "split-bad", "ns-split-bad", 2, 1, true, true, 8, 3);
    lw_layer(&O, "m.0", KV_CONTIG, 4096, 0, 1u);
    lw_layer(&O, "m.1", KV_CONTIG, 4096, 0, 3u);
    lw_layer(&O, "m.2", KV_CONTIG, 4096, 0, 2u);
    lw_create(&O, false);
    PFT_CHECK(lw_register_dev(c, &O, 0) == 0, "register: %s", pf_last_error_message());
    EXPECT(lw_register_dev(c, &O, 1), INV, "overlap in layer m.1");
    /* a split K/V layer is refused at once */
    struct lworld K;
    lw_init(&K, "split-kv", "ns-split-kv", 1, 1, true, true, 8, 3);
    lw_layer(&K, "m.0", KV_SPLIT, 4096, 0, 1u);
    lw_create(&K, false);
    EXPECT(lw_register_dev(c, &K, 0), INV, "page_first does not support split K/V layers");
    lw_free(&O);
    lw_free(&K);
    lw_free(&S);
    lw_free(&D);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
}

/* ---- hybrid ---- */

static void wait_members(struct pf_client *c, const char *inst, const uint64_t *pos, size_t n)
{
    uint64_t dl = pft_now_ms() + TMO;
    for (;;) {
        struct pf_query_result r;
        PFT_CHECK(lw_query(c, inst, "members", 1, pos, n, 0, &r, NULL) == 0, "members: %s",
                  pf_last_error_message());
        if (r.lease_len)
            pf_client_release(c, r.lease, r.lease_len, TMO);
        if (r.num_hit_blocks == n)
            return;
        PFT_CHECK(pft_now_ms() < dl, "recurrent blocks not sealed");
        usleep(2000);
    }
}

static void sc_hybrid(void)
{
    struct pft_proc s;
    start(&s, "2", "64mb", false);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct lworld S, D;
    lw_hybrid(&S, "hy-src", "ns-hy", 2, 64, 3, true);
    lw_register(c, &S);
    const size_t NA = 8;
    uint64_t rpos[3] = {2, 5, 7}, apos[8];
    uint32_t rid[3] = {20, 21, 22};
    for (size_t i = 0; i < NA; i++)
        apos[i] = i;
    lw_hybrid_save(c, &S, NA, rpos, rid, 3);
    lw_wait_sealed(c, S.id, apos, NA);
    wait_members(c, S.id, rpos, 3);

    /* membership: exactly the saved positions, although group 0 holds every hash */
    struct pf_query_result r;
    uint32_t pos[8];
    PFT_CHECK(lw_query(c, S.id, "m", 1, apos, NA, 0, &r, pos) == 0, "membership: %s",
              pf_last_error_message());
    PFT_CHECK(!r.loading && r.num_hit_blocks == 3 && r.nhit_positions == 3 && r.lease_len,
              "membership: %u hits, %u positions", r.num_hit_blocks, r.nhit_positions);
    PFT_CHECK(pos[0] == 2 && pos[1] == 5 && pos[2] == 7, "positions %u %u %u", pos[0], pos[1],
              pos[2]);
    pf_client_release(c, r.lease, r.lease_len, TMO);
    uint64_t none_pos[3] = {0, 1, 3};
    PFT_CHECK(lw_query(c, S.id, "m0", 1, none_pos, 3, 0, &r, pos) == 0 && r.num_hit_blocks == 0 &&
                  r.nhit_positions == 0 && r.lease_len == 0,
              "membership of unsaved positions: %u hits", r.num_hit_blocks);
    EXPECT(lw_query(c, S.id, "g2", 2, apos, 2, 0, &r, NULL), INV,
           "group_id 2 is not a storage group of instance hy-src (it has 2: 0..1)");
    /* want-set: all or nothing */
    PFT_CHECK(lw_query(c, S.id, "w", 1, rpos, 3, 1, &r, pos) == 0 && !r.loading &&
                  r.num_hit_blocks == 3 && r.lease_len && r.nhit_positions == 3 && pos[0] == 0 &&
                  pos[2] == 2,
              "want-set: %u hits, %u positions, lease %u", r.num_hit_blocks, r.nhit_positions,
              r.lease_len);
    pf_client_release(c, r.lease, r.lease_len, TMO);
    uint64_t part[3] = {2, 3, 5};
    PFT_CHECK(lw_query(c, S.id, "wp", 1, part, 3, 1, &r, pos) == 0 && !r.loading &&
                  r.num_hit_blocks == 1 && r.lease_len == 0 && r.nhit_positions == 0,
              "partial want-set: %u hits, lease %u, %u positions (want 1, none, none)",
              r.num_hit_blocks, r.lease_len, r.nhit_positions);
    fprintf(stderr, "  hybrid: membership {2,5,7}, want-set all-or-nothing, group 2 refused\n");

    lw_hybrid(&D, "hy-dst", "ns-hy", 2, 64, 3, false);
    lw_register(c, &D);
    lw_hybrid_fetch(c, &D, &S, "hy-1", NA, rpos, rid, 3, 0, NULL);
    /* the membership lease loads too: positions {2,5,7} into 50..52 */
    PFT_CHECK(lw_query(c, D.id, "hy-2", 1, apos, NA, 0, &r, pos) == 0 && r.num_hit_blocks == 3,
              "membership on dst");
    int64_t rdst[3] = {50, 51, 52}, bad[3] = {33, 34, 35};
    struct lw_item wrong = {.lease = r.lease, .n = 3, .targets = {bad, NULL}};
    EXPECT(lw_load(c, &D, 0, 2, &wrong, 1, NULL), INV, "does not match the registered layout");
    {
        /* one layer group must stay inside one storage group */
        const char *names[2] = {"a.0", "r.conv"};
        size_t gsz = 2, cnt = 3;
        struct pf_load_item li = {
            .lease = r.lease, .lease_len = PF_LEASE_LEN, .targets = rdst, .group_counts = &cnt};
        struct pf_loadstate *ls;
        PFT_CHECK(pf_loadstate_create(&ls) == 0, "loadstate");
        EXPECT(pf_client_load(c, D.id, 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &li, 1, TMO),
               INV,
               "load group 0 mixes storage groups: layer a.0 is in group 0, layer r.conv in "
               "group 1");
        PFT_CHECK(pf_loadstate_get(ls) == -1, "a refused load must set the state to -1");
        pf_loadstate_destroy(ls);
    }
    struct lw_item it = {.lease = r.lease, .n = 3, .targets = {NULL, rdst}};
    for (int d = 0; d < 2; d++) {
        lw_load_ok(c, &D, d, 2, &it, 1);
        for (int l = 0; l < D.nl; l++)
            if (D.L[l].group == 1)
                lw_compare(&S, d, &D, d, l, rid, rdst, 3);
            else
                PFT_CHECK(lw_zero(&D, d, l, 33), "attention block written by a recurrent lease");
    }
    fprintf(stderr, "  hybrid: two-lease load and membership lease byte-exact on 2 ranks\n");
    lw_free(&S);
    lw_free(&D);
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
}

/* ---- ssd ---- */

#define WBYTES "pegaflow_ssd_write_bytes_total"
/* the SSD record header in front of every block (docs/ssd.md "Record header": 4 KiB for
 * the few slots these layouts have); the write counter counts header + block */
#define REC_HDR 4096.0

static void wait_written(struct pft_proc *s, double want)
{
    uint64_t dl = pft_now_ms() + TMO;
    while (metric(s, WBYTES) < want) {
        PFT_CHECK(pft_now_ms() < dl, "SSD writer wrote %.0f of %.0f bytes", metric(s, WBYTES),
                  want);
        usleep(5000);
    }
    PFT_CHECK(metric(s, WBYTES) == want, "SSD bytes %.0f, want %.0f", metric(s, WBYTES), want);
}

static void cleanup_ram(struct pft_proc *s)
{
    char *body = NULL;
    PFT_CHECK(pft_http(s->http_host, s->http_port, "POST", "/cache/memory/cleanup", &body) == 200,
              "memory cleanup");
    free(body);
    PFT_CHECK(metric(s, RETAINED) == 0, "blocks still resident after cleanup");
}

static void sc_ssd(void)
{
    if (!ssd_dir) {
        fprintf(stderr, "  SKIP: ssd scenario needs --ssd-dir (io_uring usable)\n");
        return;
    }
    struct pft_proc s;
    start(&s, "4", "32mb", true);
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    const size_t N = 16;
    uint32_t ids[64];
    uint64_t hp[64];
    ids_range(ids, hp, N, 1);
    double w = 0;
    /* page-first replicas (pages of 512-padded layers) */
    struct lworld S, D;
    lw_mla(&S, "ssd-mla", "ns-ssd-mla", 4, false, 40, 4, true);
    lw_register(c, &S);
    lw_save_striped(c, &S, ids, N);
    lw_wait_sealed(c, S.id, hp, N);
    w += (double)N * (4096 + 4096 + 12288 + REC_HDR);
    /* layer-split shards (an odd size padded inside the page) */
    struct lworld S2, D2;
    lw_mla(&S2, "ssd-split", "ns-ssd-split", 4, true, 40, 5, true);
    lw_register(c, &S2);
    lw_save_striped(c, &S2, ids, N);
    lw_wait_sealed(c, S2.id, hp, N);
    w += (double)N * (4096 + 1024 + 4096 + 8192 + REC_HDR);
    wait_written(&s, w);
    cleanup_ram(&s);
    lw_mla(&D, "ssd-mla-dst", "ns-ssd-mla", 4, false, 40, 4, false);
    lw_register(c, &D);
    int l1 = lw_fetch_all(c, &D, &S, "ssd-mla-1", ids, N, 16);
    PFT_CHECK(l1 >= 1, "the page-first query must load from SSD (answer Loading)");
    lw_mla(&D2, "ssd-split-dst", "ns-ssd-split", 4, true, 40, 5, false);
    lw_register(c, &D2);
    int l2 = lw_fetch_all(c, &D2, &S2, "ssd-split-1", ids, N, 16);
    PFT_CHECK(l2 >= 1, "the layer-split query must load from SSD (answer Loading)");
    fprintf(stderr, "  ssd: page-first replicas and layer-split pages back from SSD byte-exact\n");
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");

    /* hybrid: both groups through SSD, the recurrent one as a want-set */
    start(&s, "2", "32mb", true);
    PFT_CHECK(pf_client_connect(s.addr, &c) == 0, "connect");
    struct lworld H, HD;
    lw_hybrid(&H, "ssd-hy", "ns-ssd-hy", 2, 64, 6, true);
    lw_register(c, &H);
    uint64_t rpos[3] = {1, 4, 6}, apos[8];
    uint32_t rid[3] = {20, 21, 22};
    for (size_t i = 0; i < 8; i++)
        apos[i] = i;
    lw_hybrid_save(c, &H, 8, rpos, rid, 3);
    lw_wait_sealed(c, H.id, apos, 8);
    wait_members(c, H.id, rpos, 3);
    wait_written(&s, 8.0 * (2 * 2 * 2 * 2048 + REC_HDR) + 3.0 * (2 * (1536 + 8192) + REC_HDR));
    cleanup_ram(&s);
    struct pf_query_result r;
    PFT_CHECK(lw_query(c, H.id, "ram-only", 1, rpos, 3, 0, &r, NULL) == 0 && !r.loading &&
                  r.num_hit_blocks == 0,
              "membership queries RAM only");
    lw_hybrid(&HD, "ssd-hy-dst", "ns-ssd-hy", 2, 64, 6, false);
    lw_register(c, &HD);
    int ld[2];
    lw_hybrid_fetch(c, &HD, &H, "ssd-hy-1", 8, rpos, rid, 3, 30, ld);
    PFT_CHECK(ld[0] >= 1 && ld[1] >= 1,
              "both groups must load from SSD (Loading answers: attention %d, recurrent %d)", ld[0],
              ld[1]);
    fprintf(stderr, "  ssd: hybrid attention prefix and recurrent want-set back from SSD "
                    "byte-exact\n");
    pf_client_close(c);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    lw_free(&S);
    lw_free(&D);
    lw_free(&S2);
    lw_free(&D2);
    lw_free(&H);
    lw_free(&HD);
}

int main(int argc, char **argv)
{
    world_seed = pft_seed();
    world_tmo = TMO;
    int a = 1;
    if (a + 1 < argc && strcmp(argv[a], "--ssd-dir") == 0) {
        ssd_dir = argv[a + 1];
        a += 2;
    }
    static const struct pft_scenario sc[] = {
        {"mla", sc_mla}, {"split", sc_split}, {"hybrid", sc_hybrid}, {"ssd", sc_ssd}};
    return pft_run_scenarios(sc, PF_ARRAY_SIZE(sc), argv + a, argc - a);
}

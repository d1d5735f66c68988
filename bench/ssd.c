/* bench/ssd: SSD tier throughput against raw O_DIRECT I/O on the same file system, same
 * block size, same run (DESIGN §8).
 *
 *   raw write/read  io_uring on an O_DIRECT file: one block-size write/read per request,
 *                   no copies, no checks; the fastest of the variants bench/ssd_server's
 *                   baseline tries (buffers in the same pinned pool as the tier's, or a
 *                   huge-page-advised anonymous buffer) at every depth 1, 2, 4, ..., 32,
 *                   picked per direction in a calibration pass of a quarter of the data
 *                   (printed), then measured in every round. Raw writes go to a file of
 *                   their own; raw reads read the tier's file (the bytes the tier reads in
 *                   that round), into a pool allocation made and freed around each run so
 *                   it lands where the staging lands. Raw reads into a small malloc'ed hot
 *                   buffer at the tier's read depth are printed for reference
 *   tier write      pf_ssd_offer of sealed blocks (slots x K/V segments in pool memory,
 *                   one vectored write per block) until pf_ssd_flush: queueing, placement,
 *                   index, commit
 *   tier read       pf_ssd_fetch of the committed blocks from several threads (like the
 *                   engine's prefetch threads): budget, staging allocation, vectored reads,
 *                   ring check and per-slot xxh3 verification
 * Every round writes bytes of its own (the source slots are refilled with a round pattern and
 * re-checksummed), checks that every block of the round is in the index (a prefix probe of
 * its keys), compares every byte of every fetched block with the round's source inside the
 * timed tier read, and the untimed read-hot pass compares every block of the tier's file.
 * Phases alternate raw/tier for --rounds rounds (ABBA order: even rounds raw first, odd
 * rounds tier first, each read two phases after its write); the table shows the median of
 * each and the tier/raw ratio (target >= 0.85). Then the store is reopened on its file with
 * recovery on (as after a restart): the recovery scan's rate against raw sequential 8 MiB
 * O_DIRECT reads of the same ring (one and four in flight; target >= 0.8) and the time from
 * pf_ssd_create to the first SSD hit. A JSON result goes to --json (default stdout after
 * the table).
 *
 * Usage: ssd [--dir DIR] [--block-size SIZE] [--slots N] [--total SIZE] [--rounds N]
 *            [--write-inflight N] [--prefetch-inflight N] [--fetchers N] [--fetch-blocks N]
 *            [--integrity on|off] [--json FILE] */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pf/block.h"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/hal.h"
#include "pf/log.h"
#include "pf/pool.h"
#include "pf/ssd.h"
#include "benchutil.h"
#include "ssd/format.h"

struct opts {
    const char *dir;
    uint64_t block;
    uint32_t slots;
    uint64_t total;
    int rounds;
    uint32_t winflight, rinflight;
    uint32_t wmerge, rmerge; /* --write-merge / --read-merge (0: the tier's default, 8) */
    int fetchers;
    uint32_t fetch_blocks;
    bool integrity;
    const char *json;
    uint64_t depth_bytes; /* bytes per phase of the depth curve (0: no curve) */
};

static void die(const char *what, int err)
{
    fprintf(stderr, "bench/ssd: %s: %s\n", what, strerror(err < 0 ? -err : err));
    exit(1);
}

static double secs(uint64_t ns)
{
    return (double)ns / 1e9;
}

/* ---- raw O_DIRECT through io_uring ---- */

/* Transfers total bytes of path in bs requests, qd in flight, from/into nbuf rotating
 * block-size buffers of buf. Reads with expect compare every block, as it completes, with
 * expect (bs bytes; every block of the file holds the same image) and clear it. */
/* Block i is at file offset off0 + i * pitch (raw files: 0, bs; the tier's file: after the
 * superblock and each record's header). */
static uint64_t off0 = 0, pitch = 0;

static double raw_run(const char *path, bool wr, uint64_t total, uint64_t bs, unsigned qd,
                      uint8_t *buf, uint64_t nbuf, const uint8_t *expect)
{
    uint64_t o0 = wr ? 0 : off0, pt = wr ? bs : pitch;
    int fd = open(path, (wr ? O_RDWR | O_CREAT : O_RDONLY) | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0)
        die(path, errno);
    if (wr && fallocate(fd, 0, 0, (off_t)total) != 0 && ftruncate(fd, (off_t)total) != 0)
        die("size raw file", errno);
    struct io_uring ring;
    int rc = io_uring_queue_init(qd, &ring, 0);
    if (rc < 0)
        die("io_uring_queue_init", rc);
    uint64_t n = total / bs, sub = 0, done = 0;
    unsigned inflight = 0;
    uint64_t t0 = pf_now_ns();
    while (done < n) {
        while (inflight < qd && sub < n) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            void *p = buf + (sub % nbuf) * bs;
            if (wr)
                io_uring_prep_write(sqe, fd, p, (unsigned)bs, o0 + sub * pt);
            else
                io_uring_prep_read(sqe, fd, p, (unsigned)bs, o0 + sub * pt);
            io_uring_sqe_set_data64(sqe, sub);
            sub++;
            inflight++;
        }
        rc = io_uring_submit_and_wait(&ring, 1);
        if (rc < 0 && rc != -EINTR)
            die("io_uring_submit_and_wait", rc);
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            if (cqe->res != (int)bs)
                die("raw I/O", cqe->res < 0 ? cqe->res : EIO);
            if (expect) {
                uint8_t *p = buf + (io_uring_cqe_get_data64(cqe) % nbuf) * bs;
                if (memcmp(p, expect, bs) != 0) {
                    fprintf(stderr, "bench/ssd: raw read of block %llu: wrong bytes\n",
                            (unsigned long long)io_uring_cqe_get_data64(cqe));
                    exit(1);
                }
                memset(p, 0, 64); /* a stale buffer cannot pass the next check */
            }
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            done++;
        }
    }
    uint64_t t1 = pf_now_ns();
    io_uring_queue_exit(&ring);
    close(fd);
    return (double)(n * bs) / secs(t1 - t0);
}

/* ---- the tier ---- */

struct tier;
static double raw_read_staged(struct tier *t, const char *path, uint64_t total, uint64_t nbuf,
                              unsigned qd);

struct tier {
    struct opts *o;
    struct pf_pool *pool;
    struct pf_blk *blk;
    struct pf_ssd *ssd;
    struct pf_alloc **src; /* one allocation per slot (K and V), shared by all blocks */
    uint64_t stride;
    uint8_t *img; /* this round's bytes of one block as the tier lays it out on disk */
};

static uint32_t bench_ns; /* an interned namespace: records carry its name */

static struct pf_block_key key_of(uint64_t id)
{
    struct pf_block_key k;
    pf_key_make(bench_ns, &id, sizeof(id), &k);
    return k;
}

/* A sealed block over the shared source memory (distinct key, same bytes). */
static struct pf_block *make_block(struct tier *t, uint64_t id, const uint64_t *sums)
{
    struct pf_block_key k = key_of(id);
    struct pf_slot *sl = calloc(t->o->slots, sizeof(*sl));
    if (!sl)
        die("block", ENOMEM);
    for (uint32_t i = 0; i < t->o->slots; i++) {
        struct pf_slot *s = &sl[i];
        s->k = t->src[i]->ptr;
        s->v = (uint8_t *)t->src[i]->ptr + t->stride;
        s->ka = s->va = t->src[i];
        pf_alloc_get(t->src[i]);
        pf_alloc_get(t->src[i]);
        s->seg_len = s->seg_stride = (uint32_t)t->stride;
        s->nseg = 2;
        s->numa = -1;
        s->checksum = sums[i];
        s->has_checksum = 1;
    }
    struct pf_block *b;
    int rc = pf_block_pack(NULL, &k, (uint16_t)t->o->slots, sl, &b);
    if (rc)
        die("block", -rc);
    free(sl);
    return b;
}

static double tier_write(struct tier *t, uint64_t first_id, uint64_t n, const uint64_t *sums)
{
    enum { BATCH = 8 };
    /* the cache keeps sealed blocks resident (strong references) while the writer works */
    struct pf_block **blocks = calloc(n, sizeof(*blocks));
    if (!blocks)
        die("blocks", ENOMEM);
    for (uint64_t i = 0; i < n; i++)
        blocks[i] = make_block(t, first_id + i, sums);
    uint64_t t0 = pf_now_ns();
    for (uint64_t i = 0; i < n; i += BATCH) {
        size_t m = n - i < BATCH ? (size_t)(n - i) : BATCH;
        /* the engine would drop a batch on a full queue; the bench waits for room */
        while (pf_ssd_offer(t->ssd, blocks + i, m) == -EAGAIN)
            usleep(50);
    }
    int rc = pf_ssd_flush(t->ssd, 600000);
    if (rc)
        die("pf_ssd_flush", rc);
    double rate = (double)(n * t->o->block) / secs(pf_now_ns() - t0);
    /* every block of this round is in the index (a prefix probe of the round's own keys;
     * tier_read then fetches each and compares every byte) */
    struct pf_block_key *keys = malloc(n * sizeof(*keys));
    for (uint64_t i = 0; i < n; i++)
        keys[i] = key_of(first_id + i);
    size_t have = pf_ssd_probe(t->ssd, keys, n);
    free(keys);
    if (have != n) {
        fprintf(stderr, "bench/ssd: only %zu of %llu blocks of this round committed\n", have,
                (unsigned long long)n);
        exit(1);
    }
    for (uint64_t i = 0; i < n; i++)
        pf_block_put(blocks[i]);
    free(blocks);
    return rate;
}

struct fetch_job {
    struct tier *t;
    uint64_t first_id, n;
    _Atomic uint64_t *next; /* next block index to fetch */
    uint64_t got;
};

static void *fetch_main(void *arg)
{
    struct fetch_job *j = arg;
    uint32_t fb = j->t->o->fetch_blocks;
    struct pf_block_key *keys = calloc(fb, sizeof(*keys));
    struct pf_block **out = calloc(fb, sizeof(*out));
    for (;;) {
        uint64_t i = atomic_fetch_add(j->next, fb);
        if (i >= j->n)
            break;
        size_t m = j->n - i < fb ? (size_t)(j->n - i) : fb;
        for (size_t k = 0; k < m; k++)
            keys[k] = key_of(j->first_id + i + k);
        size_t got = pf_ssd_fetch(j->t->ssd, keys, m, false, out);
        if (got != m) {
            fprintf(stderr, "bench/ssd: fetch got %zu of %zu blocks\n", got, m);
            exit(1);
        }
        for (size_t k = 0; k < got; k++) {
            /* every byte of every fetched block against this round's source */
            const struct pf_block *b = out[k];
            for (uint16_t sl = 0; sl < b->nslots; sl++) {
                const uint8_t *want = j->t->img + (uint64_t)sl * 2 * j->t->stride;
                if (memcmp(pf_slot_k(b, sl), want, j->t->stride) != 0 ||
                    memcmp(pf_slot_v(b, sl), want + j->t->stride, j->t->stride) != 0) {
                    fprintf(stderr, "bench/ssd: fetched block %llu slot %u: wrong bytes\n",
                            (unsigned long long)(j->first_id + i + k), sl);
                    exit(1);
                }
            }
            pf_block_put(out[k]);
        }
        j->got += got;
    }
    free(keys);
    free(out);
    return NULL;
}

static double tier_read(struct tier *t, uint64_t first_id, uint64_t n)
{
    _Atomic uint64_t next = 0;
    struct fetch_job jobs[16];
    pthread_t thr[16];
    int nf = t->o->fetchers;
    uint64_t t0 = pf_now_ns();
    for (int i = 0; i < nf; i++) {
        jobs[i] = (struct fetch_job){.t = t, .first_id = first_id, .n = n, .next = &next};
        pthread_create(&thr[i], NULL, fetch_main, &jobs[i]);
    }
    for (int i = 0; i < nf; i++)
        pthread_join(thr[i], NULL);
    return (double)(n * t->o->block) / secs(pf_now_ns() - t0);
}

/* Raw reads into a pool allocation made like the tier's staging (freed right after), so
 * both land in the same part of the pool. */
static double raw_read_staged(struct tier *t, const char *path, uint64_t total, uint64_t nbuf,
                              unsigned qd)
{
    struct pf_alloc *a;
    if (pf_pool_alloc(t->pool, nbuf * t->o->block, -1, &a) != 0)
        die("raw read buffer in the pool", ENOMEM);
    double r = raw_run(path, false, total, t->o->block, qd, a->ptr, nbuf, NULL);
    pf_alloc_put(a);
    return r;
}

/* The raw baseline tries what bench/ssd_server's does and every depth from 1 to 32: from or
 * into the pinned pool, or a huge-page-advised anonymous buffer (physically contiguous
 * memory splits requests less), at 1, 2, 4, ..., 32 requests in flight. One calibration
 * pass of a quarter of the data picks the fastest variant per direction; every round then
 * measures that one, so the tier is never compared with a weaker baseline than the
 * machine offers. */
#define RAW_QD_MAX 32
static const unsigned raw_qds[] = {1, 2, 4, 8, 16, 32};

struct raw_variant {
    unsigned qd;
    bool thp;
};

struct raw_bufs {
    uint8_t *wbuf;  /* RAW_QD_MAX blocks in the pool */
    uint8_t *thp;   /* RAW_QD_MAX blocks, huge pages advised */
    uint64_t rbufs; /* pool buffers for reads (>= RAW_QD_MAX) */
};

static double raw_write_v(const char *path, uint64_t total, uint64_t bs, struct raw_variant v,
                          const struct raw_bufs *b)
{
    return raw_run(path, true, total, bs, v.qd, v.thp ? b->thp : b->wbuf, RAW_QD_MAX, NULL);
}

static double raw_read_v(struct tier *t, const char *path, uint64_t total, struct raw_variant v,
                         const struct raw_bufs *b)
{
    if (v.thp)
        return raw_run(path, false, total, t->o->block, v.qd, b->thp, RAW_QD_MAX, NULL);
    return raw_read_staged(t, path, total, b->rbufs, v.qd);
}

static struct raw_variant raw_pick(struct tier *t, const char *path, bool wr,
                                   const struct raw_bufs *b)
{
    uint64_t bs = t->o->block, cal = t->o->total / 4 / bs * bs;
    if (cal < RAW_QD_MAX * bs)
        cal = t->o->total;
    struct raw_variant best = {0};
    double bps = 0;
    for (int m = 0; m < 2; m++)
        for (size_t i = 0; i < sizeof(raw_qds) / sizeof(raw_qds[0]); i++) {
            struct raw_variant v = {raw_qds[i], m == 1};
            double r = wr ? raw_write_v(path, cal, bs, v, b) : raw_read_v(t, path, cal, v, b);
            if (r > bps) {
                bps = r;
                best = v;
            }
        }
    fprintf(stderr, "  raw %s: fastest variant depth %u %s (%.2f GB/s in the calibration pass)\n",
            wr ? "write" : "read", best.qd, best.thp ? "huge-page buffer" : "pool buffer",
            bps / 1e9);
    return best;
}

/* The depth curve: tier and raw throughput at 1, 2, 4, ..., 32 requests in flight, for
 * write and read, o->depth_bytes a phase. The tier is recreated (a new file) per depth with
 * write-inflight = prefetch-inflight = depth; raw runs use the buffer kind calibrated per
 * direction (wv, rv) at the same depth. The same checks as a round (index probe, every
 * fetched byte). One object per depth in arr. */
static void depth_curve(struct tier *t, struct pf_ssd_config *sc, const char *tier_path,
                        const char *raw_path, const uint64_t *sums, struct raw_variant wv,
                        struct raw_variant rv, const struct raw_bufs *b, cJSON *arr)
{
    uint64_t bs = t->o->block, nq = t->o->depth_bytes / bs, bytes = nq * bs;
    char err[512];
    fprintf(stderr, "  depth curve: %llu MiB a phase\n", (unsigned long long)(bytes >> 20));
    for (size_t i = 0; i < sizeof(raw_qds) / sizeof(raw_qds[0]); i++) {
        unsigned d = raw_qds[i];
        pf_ssd_destroy(t->ssd);
        t->ssd = NULL;
        unlink(tier_path);
        sc->recover = false;
        sc->write_inflight = d;
        sc->prefetch_inflight = d;
        if (pf_ssd_create(sc, &t->ssd, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench/ssd: depth %u: %s\n", d, err);
            exit(1);
        }
        uint64_t first = (uint64_t)(100 + i) * nq * 4;
        double tw = tier_write(t, first, nq, sums);
        double rw = raw_write_v(raw_path, bytes, bs, (struct raw_variant){d, wv.thp}, b);
        double tr = tier_read(t, first, nq);
        double rr = raw_read_v(t, tier_path, bytes, (struct raw_variant){d, rv.thp}, b);
        fprintf(stderr,
                "  depth %2u: write raw %.2f tier %.2f GB/s, read raw %.2f tier %.2f GB/s\n", d,
                rw / 1e9, tw / 1e9, rr / 1e9, tr / 1e9);
        cJSON *o = bu_json_obj(NULL, NULL);
        cJSON_AddItemToArray(arr, o);
        bu_json_num(o, "depth", d);
        bu_json_num(o, "tier_write_bytes_per_s", tw);
        bu_json_num(o, "raw_write_bytes_per_s", rw);
        bu_json_num(o, "tier_read_bytes_per_s", tr);
        bu_json_num(o, "raw_read_bytes_per_s", rr);
    }
}

#define USAGE                                                                                      \
    "ssd [--dir DIR] [--block-size SIZE] [--slots N] [--total SIZE] [--rounds N] "                 \
    "[--write-inflight N] [--prefetch-inflight N] [--write-merge N] [--read-merge N] "             \
    "[--fetchers N] [--fetch-blocks N] [--integrity on|off] [--depth-curve SIZE (0: none)] "       \
    "[--json FILE]"

/* ---- the phases of a run ---- */

struct run {
    struct opts o;
    struct tier t;
    uint64_t n, *sums, hbufs;
    char tier_path[1024], raw_path[1024];
    const char *paths[1];
    struct pf_ssd_config sc;
    struct pf_alloc *wa;
    uint8_t *hbuf;
    struct raw_bufs rb;
    struct raw_variant wv, rv;
    double rw[99], tw[99], rr[99], tr[99], rh[99]; /* per round, bytes/s */
    double mrw, mtw, mrr, mtr, mrh;                /* their medians */
    uint64_t ring, scan_ns, first_hit;             /* recovery */
    double scan, seq1, seq4;
};

static void parse(int argc, char **argv, struct opts *op)
{
    const char *tmp = getenv("TMPDIR");
    struct opts o = {
        .dir = tmp ? tmp : "/tmp",
        .block = 1 << 20,
        .slots = 32,
        .total = 1ull << 30,
        .rounds = 4,
        .winflight = 2,
        .rinflight = 16,
        .fetchers = 4,
        .fetch_blocks = 32,
        .integrity = true,
    };
    const char *integ = "on";
    o.depth_bytes = UINT64_MAX; /* default: a quarter of --total */
    const struct bu_opt opts[] = {{"--dir", BU_STR, &o.dir},
                                  {"--block-size", BU_SIZE, &o.block},
                                  {"--slots", BU_U32, &o.slots},
                                  {"--total", BU_SIZE, &o.total},
                                  {"--rounds", BU_INT, &o.rounds},
                                  {"--write-inflight", BU_U32, &o.winflight},
                                  {"--prefetch-inflight", BU_U32, &o.rinflight},
                                  {"--write-merge", BU_U32, &o.wmerge},
                                  {"--read-merge", BU_U32, &o.rmerge},
                                  {"--fetchers", BU_INT, &o.fetchers},
                                  {"--fetch-blocks", BU_U32, &o.fetch_blocks},
                                  {"--integrity", BU_STR, &integ},
                                  {"--depth-curve", BU_SIZE, &o.depth_bytes},
                                  {"--json", BU_STR, &o.json},
                                  {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, USAGE);
    o.integrity = strcmp(integ, "off") != 0;
    if (o.depth_bytes == UINT64_MAX)
        o.depth_bytes = o.total / 4;
    if (o.slots == 0 || o.block % (1024ull * o.slots) != 0 || o.rounds < 1 || o.rounds > 99 ||
        o.fetchers < 1 || o.fetchers > 16 || o.fetch_blocks == 0 || o.winflight == 0 ||
        o.rinflight == 0 || o.wmerge > 64 || o.rmerge > 64 || o.total < o.block ||
        (o.depth_bytes && o.depth_bytes < RAW_QD_MAX * o.block)) {
        fprintf(stderr,
                "bench/ssd: the block size must be a multiple of 1 KiB x slots; "
                "rounds 1..99, fetchers 1..16, merges 0..64; --depth-curve 0 or >= 32 blocks\n");
        exit(2);
    }
    *op = o;
}

/* The pool (source slots, staging for every fetcher's batch, the raw buffers), the block
 * device, the tier's file and the store on it. */
static void setup_tier(struct run *R)
{
    struct opts *o = &R->o;
    struct tier *t = &R->t;
    R->n = o->total / o->block;
    o->total = R->n * o->block;
    uint64_t n = R->n;
    *t = (struct tier){.o = o, .stride = o->block / o->slots / 2};
    uint64_t pool_size = o->block + 2ull * o->fetchers * o->fetch_blocks * o->block +
                         (uint64_t)o->winflight * o->block + 2ull * RAW_QD_MAX * o->block +
                         (64 << 20);
    struct pf_pool_config pc = {.size = pool_size, .shards = 1, .skip_memcheck = true};
    char err[512];
    int rc = pf_pool_create(&pc, &t->pool, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "bench/ssd: pool: %s\n", err);
        exit(1);
    }
    t->src = calloc(o->slots, sizeof(*t->src));
    R->sums = calloc(o->slots, sizeof(*R->sums));
    for (uint32_t i = 0; i < o->slots; i++)
        if (pf_pool_alloc(t->pool, 2 * t->stride, -1, &t->src[i]) != 0)
            die("source slot", ENOMEM);
    t->img = malloc(o->block);
    if (!t->img)
        die("block image", ENOMEM);
    pf_hal_init();
    char chosen[64];
    rc = pf_hal_blk_open("uring", NULL, &t->blk, chosen, sizeof(chosen), err, sizeof(err));
    if (rc) {
        fprintf(stderr, "bench/ssd: %s\n", err);
        exit(1);
    }
    snprintf(R->tier_path, sizeof(R->tier_path), "%s/pf-bench-ssd-tier.dat", o->dir);
    snprintf(R->raw_path, sizeof(R->raw_path), "%s/pf-bench-ssd-raw.dat", o->dir);
    R->paths[0] = R->tier_path;
    /* the tier's file: a superblock, then n records (header + block): one lap a round */
    if (pf_ns_intern("bench-ssd", &bench_ns) != 0)
        die("namespace", ENOMEM);
    uint64_t hdr = ssd_rec_hdr_len(strlen("bench-ssd"), (uint16_t)o->slots);
    off0 = SSD_SB_SIZE + hdr;
    pitch = ssd_rec_span(hdr, o->block);
    R->sc = (struct pf_ssd_config){
        .paths = R->paths,
        .npaths = 1,
        .capacity = SSD_SB_SIZE + n * pitch,
        .write_queue_depth = 8,
        .prefetch_queue_depth = (uint32_t)o->fetchers,
        .write_inflight = o->winflight,
        .prefetch_inflight = o->rinflight,
        .write_merge = o->wmerge,
        .read_merge = o->rmerge,
        .max_prefetch_blocks = (uint32_t)o->fetchers * o->fetch_blocks,
        .integrity = o->integrity,
        .io_timeout_ms = 60000,
        .blk = t->blk,
        .pool = t->pool,
    };
    rc = pf_ssd_create(&R->sc, &t->ssd, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "bench/ssd: %s\n", err);
        exit(1);
    }
    fprintf(stderr,
            "bench/ssd: %s, block %llu KiB (%u slots x K/V of %llu KiB), %llu MiB per phase, "
            "%d round(s), write inflight %u (merge %u), read inflight %u (merge %u), %d "
            "fetcher(s) x %u blocks, integrity %s\n",
            o->dir, (unsigned long long)(o->block >> 10), o->slots,
            (unsigned long long)(t->stride >> 10), (unsigned long long)(o->total >> 20), o->rounds,
            o->winflight, R->sc.write_merge ? R->sc.write_merge : 8, o->rinflight,
            R->sc.read_merge ? R->sc.read_merge : 8, o->fetchers, o->fetch_blocks,
            o->integrity ? "on" : "off");
}

/* Raw buffers in the same pinned pool the tier uses (the physical layout of the memory
 * decides how many segments an O_DIRECT request has, hence how the block layer splits and
 * merges it): writes from write-inflight blocks (the tier writes from a few hot source slots
 * too); reads into as much rotating memory as the tier stages at once (fetchers x
 * fetch-blocks blocks: a cache lands every block in distinct memory). For reference only,
 * raw reads into a freshly malloc'ed hot buffer of read-inflight blocks (usually physically
 * contiguous, so requests split less and merge more). */
static void setup_raw(struct run *R)
{
    const struct opts *o = &R->o;
    uint64_t wbufs = RAW_QD_MAX, rbufs = (uint64_t)o->fetchers * o->fetch_blocks;
    R->hbufs = o->rinflight;
    if (rbufs < RAW_QD_MAX)
        rbufs = RAW_QD_MAX;
    if (pf_pool_alloc(R->t.pool, wbufs * o->block, -1, &R->wa) != 0)
        die("raw buffers in the pool", ENOMEM);
    uint8_t *wbuf = R->wa->ptr;
    if (posix_memalign((void **)&R->hbuf, 4096, R->hbufs * o->block) != 0)
        die("raw buffers", ENOMEM);
    for (uint64_t i = 0; i < wbufs * o->block; i++)
        wbuf[i] = (uint8_t)(i * 131 + 7);
    memset(R->hbuf, 0, R->hbufs * o->block);
    R->rb = (struct raw_bufs){.wbuf = wbuf, .rbufs = rbufs};
    R->rb.thp = mmap(NULL, RAW_QD_MAX * o->block, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (R->rb.thp == MAP_FAILED)
        die("huge-page raw buffer", errno);
    madvise(R->rb.thp, RAW_QD_MAX * o->block, MADV_HUGEPAGE);
    memcpy(R->rb.thp, wbuf, RAW_QD_MAX * o->block);
}

/* Round r: its own bytes, then raw and tier write and read in ABBA order, and the raw read
 * into the hot buffer. */
static void round_run(struct run *R, int r)
{
    const struct opts *o = &R->o;
    struct tier *t = &R->t;
    uint64_t n = R->n;
    /* this round's bytes (and checksums): a block of an earlier round cannot pass */
    for (uint32_t i = 0; i < o->slots; i++) {
        uint8_t *p = t->src[i]->ptr;
        for (uint64_t j = 0; j < 2 * t->stride; j++)
            p[j] = (uint8_t)(j * 29 + i * 7 + 1 + (uint64_t)r * 13 + (j >> 12) * r);
        struct pf_slot sl = {.k = p, .v = p + t->stride, .seg_len = (uint32_t)t->stride, .nseg = 2};
        R->sums[i] = pf_slot_compute_checksum(&sl);
        memcpy(t->img + (uint64_t)i * 2 * t->stride, p, 2 * t->stride);
    }
    /* ABBA: who goes first alternates, and each read is two phases after its write,
     * so device caching and drift favour neither side */
    if (r == 0)
        R->wv = raw_pick(t, R->raw_path, true, &R->rb);
    if (r % 2 == 0) {
        R->rw[r] = raw_write_v(R->raw_path, o->total, o->block, R->wv, &R->rb);
        R->tw[r] = tier_write(t, (uint64_t)r * n, n, R->sums);
        if (r == 0)
            R->rv = raw_pick(t, R->tier_path, false, &R->rb); /* the tier's file holds data */
        R->rr[r] = raw_read_v(t, R->tier_path, o->total, R->rv, &R->rb);
        R->tr[r] = tier_read(t, (uint64_t)r * n, n);
    } else {
        R->tw[r] = tier_write(t, (uint64_t)r * n, n, R->sums);
        R->rw[r] = raw_write_v(R->raw_path, o->total, o->block, R->wv, &R->rb);
        R->tr[r] = tier_read(t, (uint64_t)r * n, n);
        R->rr[r] = raw_read_v(t, R->tier_path, o->total, R->rv, &R->rb);
    }
    R->rh[r] =
        raw_run(R->tier_path, false, o->total, o->block, o->rinflight, R->hbuf, R->hbufs, t->img);
    fprintf(stderr,
            "  round %d: write raw %.2f tier %.2f GB/s, read raw %.2f tier %.2f GB/s "
            "(raw into a hot %llu MiB buffer %.2f)\n",
            r + 1, R->rw[r] / 1e9, R->tw[r] / 1e9, R->rr[r] / 1e9, R->tr[r] / 1e9,
            (unsigned long long)(R->hbufs * o->block >> 20), R->rh[r] / 1e9);
}

/* The rounds' medians and their table. */
static void report_rounds(struct run *R)
{
    int rounds = R->o.rounds;
    R->mrw = bu_median(R->rw, rounds);
    R->mtw = bu_median(R->tw, rounds);
    R->mrr = bu_median(R->rr, rounds);
    R->mtr = bu_median(R->tr, rounds);
    R->mrh = bu_median(R->rh, rounds);
    printf("%-10s %14s %14s %8s\n", "phase", "raw GB/s", "tier GB/s", "ratio");
    printf("%-10s %14.3f %14.3f %8.3f\n", "write", R->mrw / 1e9, R->mtw / 1e9, R->mtw / R->mrw);
    printf("%-10s %14.3f %14.3f %8.3f\n", "read", R->mrr / 1e9, R->mtr / 1e9, R->mtr / R->mrr);
    printf("%-10s %14.3f %14.3f %8.3f   (raw into a hot %llu MiB buffer, reference only)\n",
           "read-hot", R->mrh / 1e9, R->mtr / 1e9, R->mtr / R->mrh,
           (unsigned long long)(R->hbufs * R->o.block >> 20));
}

/* Recovery after a restart: the store is closed and reopened on its file with recovery on;
 * the scan rate against raw sequential O_DIRECT reads of the same ring (8 MiB requests, one
 * in flight as the scan, and four in flight), and the time from pf_ssd_create to the first
 * SSD hit (a block of the last round). */
static void recovery(struct run *R)
{
    struct tier *t = &R->t;
    uint64_t n = R->n;
    const uint64_t CH = 8ull << 20;
    R->ring = n * pitch;
    uint64_t seq_total = R->ring / CH * CH;
    pf_ssd_destroy(t->ssd);
    t->ssd = NULL;
    uint8_t *sbuf;
    if (posix_memalign((void **)&sbuf, 4096, 4 * CH) != 0)
        die("sequential read buffer", ENOMEM);
    uint64_t so = off0, sp = pitch;
    off0 = SSD_SB_SIZE;
    pitch = CH;
    R->seq1 = seq_total ? raw_run(R->tier_path, false, seq_total, CH, 1, sbuf, 4, NULL) : 0;
    R->seq4 = seq_total ? raw_run(R->tier_path, false, seq_total, CH, 4, sbuf, 4, NULL) : 0;
    off0 = so;
    pitch = sp;
    free(sbuf);
    R->sc.recover = true;
    struct pf_block_key k0 = key_of((uint64_t)(R->o.rounds - 1) * n);
    uint64_t r0 = pf_now_ns(), first_hit = 0;
    char err[512];
    if (pf_ssd_create(&R->sc, &t->ssd, err, sizeof(err))) {
        fprintf(stderr, "bench/ssd: reopen: %s\n", err);
        exit(1);
    }
    struct pf_ssd_stats st;
    for (;;) {
        if (!first_hit && pf_ssd_probe(t->ssd, &k0, 1) == 1)
            first_hit = pf_now_ns() - r0;
        pf_ssd_stats(t->ssd, &st);
        if (st.recovery_done)
            break;
        usleep(200);
    }
    uint64_t scan_ns = pf_now_ns() - r0;
    if (!first_hit && pf_ssd_probe(t->ssd, &k0, 1) == 1)
        first_hit = scan_ns;
    if (st.committed != n || !first_hit) {
        fprintf(stderr, "bench/ssd: recovery found %llu of %llu blocks\n",
                (unsigned long long)st.committed, (unsigned long long)n);
        exit(1);
    }
    R->scan_ns = scan_ns;
    R->first_hit = first_hit;
    R->scan = (double)R->ring / secs(scan_ns);
    printf("%-10s %14.3f %14.3f %8.3f   (recovery scan of %llu MiB vs raw 8 MiB reads, 1 in "
           "flight; 4 in flight: %.3f GB/s, ratio %.3f; first SSD hit after %.1f ms)\n",
           "recover", R->seq1 / 1e9, R->scan / 1e9, R->scan / R->seq1,
           (unsigned long long)(R->ring >> 20), R->seq4 / 1e9, R->scan / R->seq4,
           (double)first_hit / 1e6);
}

/* The JSON result (--json, else stdout), the depth curve's figures in it. */
static void write_json(struct run *R)
{
    const struct opts *o = &R->o;
    cJSON *root = bu_json_obj(NULL, NULL);
    bu_json_str(root, "bench", "ssd");
    bu_json_str(root, "dir", o->dir);
    bu_json_num(root, "block_bytes", (double)o->block);
    bu_json_num(root, "slots", o->slots);
    bu_json_num(root, "bytes_per_phase", (double)o->total);
    bu_json_num(root, "rounds", o->rounds);
    bu_json_num(root, "write_inflight", o->winflight);
    bu_json_num(root, "prefetch_inflight", o->rinflight);
    bu_json_num(root, "write_merge", o->wmerge ? o->wmerge : 8);
    bu_json_num(root, "read_merge", o->rmerge ? o->rmerge : 8);
    bu_json_num(root, "fetchers", o->fetchers);
    bu_json_num(root, "fetch_blocks", o->fetch_blocks);
    bu_json_bool(root, "integrity", o->integrity);
    cJSON *jw = bu_json_obj(root, "write");
    bu_json_num(jw, "raw_bytes_per_s", R->mrw);
    bu_json_num(jw, "tier_bytes_per_s", R->mtw);
    bu_json_num(jw, "ratio", R->mtw / R->mrw);
    cJSON *jr = bu_json_obj(root, "read");
    bu_json_num(jr, "raw_bytes_per_s", R->mrr);
    bu_json_num(jr, "tier_bytes_per_s", R->mtr);
    bu_json_num(jr, "ratio", R->mtr / R->mrr);
    cJSON *jh = bu_json_obj(root, "read_hot_buffer");
    bu_json_num(jh, "raw_bytes_per_s", R->mrh);
    bu_json_num(jh, "ratio", R->mtr / R->mrh);
    cJSON *jv = bu_json_obj(root, "raw_write_variant");
    bu_json_num(jv, "depth", R->wv.qd);
    bu_json_bool(jv, "huge_page_buffer", R->wv.thp);
    jv = bu_json_obj(root, "raw_read_variant");
    bu_json_num(jv, "depth", R->rv.qd);
    bu_json_bool(jv, "huge_page_buffer", R->rv.thp);
    cJSON *jrec = bu_json_obj(root, "recovery");
    bu_json_num(jrec, "ring_bytes", (double)R->ring);
    bu_json_num(jrec, "scan_seconds", secs(R->scan_ns));
    bu_json_num(jrec, "scan_bytes_per_s", R->scan);
    bu_json_num(jrec, "raw_seq_qd1_bytes_per_s", R->seq1);
    bu_json_num(jrec, "raw_seq_qd4_bytes_per_s", R->seq4);
    bu_json_num(jrec, "ratio_qd1", R->scan / R->seq1);
    bu_json_num(jrec, "ratio_qd4", R->scan / R->seq4);
    bu_json_num(jrec, "first_hit_seconds", secs(R->first_hit));
    bu_json_num(jrec, "target_ratio", 0.8);
    bu_json_num(root, "target_ratio", 0.85);
    if (o->depth_bytes) {
        cJSON *arr = bu_json_check(cJSON_AddArrayToObject(root, "depths"));
        depth_curve(&R->t, &R->sc, R->tier_path, R->raw_path, R->sums, R->wv, R->rv, &R->rb, arr);
    }
    bu_json_write(root, o->json);
}

static void teardown(struct run *R)
{
    struct tier *t = &R->t;
    pf_ssd_destroy(t->ssd);
    pf_blk_close(t->blk);
    for (uint32_t i = 0; i < R->o.slots; i++)
        pf_alloc_put(t->src[i]);
    pf_alloc_put(R->wa);
    pf_pool_destroy(t->pool);
    free(t->src);
    free(t->img);
    free(R->sums);
    free(R->hbuf);
    munmap(R->rb.thp, RAW_QD_MAX * R->o.block);
    unlink(R->tier_path);
    unlink(R->raw_path);
}

int main(int argc, char **argv)
{
    static struct run R;
    parse(argc, argv, &R.o);
    pf_log_set_level(PF_LOG_WARN);
    setup_tier(&R);
    setup_raw(&R);
    for (int r = 0; r < R.o.rounds; r++)
        round_run(&R, r);
    report_rounds(&R);
    recovery(&R);
    write_json(&R); /* runs the depth curve (--depth-curve) into the JSON */
    teardown(&R);
    return 0;
}

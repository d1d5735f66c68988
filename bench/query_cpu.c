/* bench/query_cpu: server-side CPU cost of one QueryPrefetch of 1 and 4096 hashes with 10^6
 * resident blocks, in process (no network, no scheduler wake-ups), split into:
 *   - request decode: the server's zero-copy wire reader over protobuf-c's bytes;
 *   - engine query: pf_engine_query (hash lookup in place, pins, lease, reuse estimator);
 *   - the RAM cache's prefix lookup alone, in the same iterations: pinning the raw hashes of
 *     a range the engine did not just touch (cold: the engine's own lookup), then on the
 *     engine's range (warm lines: a lower bound) with references (pf_cache_prefix) and with
 *     pins from built keys (pf_cache_prefix_pin) and from raw hashes
 *     (pf_cache_prefix_pin_hashes, the query's path), and the unpin that a Release pays.
 * Means and per-iteration medians (a loaded VM's preemptions move the means). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/pegaflow.h"
#include "engine.pb-c.h"
#include "pf/block.h"
#include "pf/cache.h"
#include "pf/engine.h"
#include "pf/hal.h"
#include "pf/pool.h"
#include "rpc/wire.h"
#include "benchutil.h"

#define USAGE                                                                                      \
    "query_cpu [--blocks N (>= 8192, default 1000000)] [--iters N (4096-hash queries, default "    \
    "300)] [--json FILE]"

/* Resident blocks need an allocation: one static stand-in whose count never drops to 0. */
static uint8_t fake_mem[64];
static struct pf_alloc fake = {.ptr = fake_mem, .size = sizeof(fake_mem), .refs = 1u << 30};

struct qc {
    size_t n; /* resident blocks */
    int iters4096;
    struct pf_gpu *g;
    struct pf_engine *e;
    struct pf_simkv *kv;
    uint32_t ns;
    uint8_t (*hs)[32];         /* block i's hash */
    struct pf_block_key *keys; /* block i's key */
    struct pf_block **hit;     /* 4096 lookup results */
};

/* What one query size measured: per-iteration seconds of each part. */
enum part { DECODE, ENGINE, COLD_PIN_RAW, REF, PIN, PIN_RAW, UNPIN, NPART };
static const char *const part_names[NPART] = {"decode",    "engine",        "cold_pin_raw", "cache",
                                              "cache_pin", "cache_pin_raw", "unpin"};
struct row {
    size_t hashes;
    int iters;
    double *v[NPART];
    double mean[NPART], p50[NPART];
};

/* 1: an engine over the sim GPU with one registered instance. */
static void setup_engine(struct qc *q)
{
    char chosen[32], err[256];
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    pf_hal_init();
    if (pf_hal_gpu_open("sim", &gc, &q->g, chosen, sizeof(chosen), err, sizeof(err)))
        bu_die("query_cpu", err);
    struct pf_engine_config ec = {.gpu = q->g, .pool_size = 64 << 20, .skip_memcheck = true};
    if (pf_engine_create(&ec, &q->e, err, sizeof(err)))
        bu_die("query_cpu", err);
    if (pf_simkv_create(1 << 20, 0, &q->kv))
        bu_die("query_cpu", "simkv");
    struct pf_engine_layer l = {
        .name = "ALL_LAYERS", .num_blocks = 256, .bytes_per_block = 4096, .segments = 1};
    l.ipc.kind = PF_IPC_SIM_SHM;
    l.ipc.size = 1 << 20;
    snprintf(l.ipc.shm_name, sizeof(l.ipc.shm_name), "%s", pf_simkv_name(q->kv));
    struct pf_engine_register r = {.instance_id = "q",
                                   .namespace_ = "nsq",
                                   .client_version = PF_VERSION,
                                   .tp_size = 1,
                                   .world_size = 1,
                                   .layers = &l,
                                   .nlayers = 1};
    if (pf_engine_register(q->e, &r, err, sizeof(err)))
        bu_die("query_cpu", err);
    if (pf_ns_lookup("nsq", &q->ns))
        bu_die("query_cpu", "namespace");
}

/* 2: n resident blocks of 32-byte hashes in the instance's namespace. */
static void fill_cache(struct qc *q)
{
    q->hs = malloc(q->n * 32);
    q->keys = malloc(q->n * sizeof(*q->keys));
    q->hit = malloc(4096 * sizeof(*q->hit));
    if (!q->hs || !q->keys || !q->hit)
        bu_die("query_cpu", "out of memory");
    for (size_t i = 0; i < q->n; i++) {
        for (int j = 0; j < 32; j++)
            q->hs[i][j] = (uint8_t)(i * 131 + (size_t)j * 7 + (i >> 8));
        memcpy(q->hs[i], &i, sizeof(i));
        pf_key_make(q->ns, q->hs[i], 32, &q->keys[i]);
        pf_alloc_get(&fake);
        struct pf_slot s = {.k = fake_mem, .ka = &fake, .seg_len = 64, .seg_stride = 64, .nseg = 1};
        struct pf_block *b;
        if (pf_block_pack(NULL, &q->keys[i], 1, &s, &b) != 0)
            bu_die("query_cpu", "pack");
        pf_cache_insert(pf_engine_cache(q->e), b, PF_CLASS_RETAINED);
        pf_block_put(b);
    }
}

/* The request bytes of a query of hashes [first, first + k), as protobuf-c packs them. */
static uint8_t *pack_query(struct qc *q, size_t first, size_t k, ProtobufCBinaryData *bd,
                           size_t *len_p)
{
    Pegaflow__QueryRequest m = PEGAFLOW__QUERY_REQUEST__INIT;
    m.instance_id = "q";
    m.req_id = "r";
    m.n_block_hashes = k;
    for (size_t i = 0; i < k; i++)
        bd[i] = (ProtobufCBinaryData){32, q->hs[first + i]};
    m.block_hashes = bd;
    *len_p = protobuf_c_message_get_packed_size(&m.base);
    uint8_t *buf = malloc(*len_p);
    if (!buf)
        bu_die("query_cpu", "out of memory");
    protobuf_c_message_pack(&m.base, buf);
    return buf;
}

/* The raw hashes of [first, first + k) as the decoder hands them to the engine. */
static void raw_of(struct qc *q, size_t first, size_t k, struct pf_bytes *pb)
{
    for (size_t i = 0; i < k; i++)
        pb[i] = (struct pf_bytes){q->hs[first + i], 32};
}

static void expect_hits(size_t got, size_t k, const char *what)
{
    if (got != k) {
        fprintf(stderr, "bench/query_cpu: %s of %zu resident hashes found %zu\n", what, k, got);
        exit(1);
    }
}

/* One iteration: every part once, over the range at first (cold over another range). */
static void iteration(struct qc *q, struct row *r, int it, ProtobufCBinaryData *bd,
                      struct pf_bytes *pb)
{
    struct pf_cache *c = pf_engine_cache(q->e);
    size_t k = r->hashes, span = q->n - k;
    size_t first = ((size_t)it * 7919) % span, cold = (first + q->n / 2) % span;
    char err[256];
    size_t len;
    uint8_t *buf = pack_query(q, first, k, bd, &len);
    /* decoded as the server does: the wire reader, hashes pointing into the buffer */
    double t0 = bu_now();
    struct pf_wire w = {buf, buf + len};
    struct pf_wire_field f = {0};
    size_t nh = 0;
    while (pf_wire_next(&w, &f) == 1)
        if (f.number == 2 && nh < k)
            pb[nh++] = (struct pf_bytes){f.data, f.len};
    double t1 = bu_now();
    struct pf_engine_query eq = {.instance_id = "q", .req_id = "r", .hashes = pb, .n = nh};
    struct pf_engine_query_result res;
    if (pf_engine_query(q->e, &eq, &res, err, sizeof(err)))
        bu_die("query_cpu", err);
    double t2 = bu_now();
    r->v[DECODE][it] = t1 - t0;
    r->v[ENGINE][it] = t2 - t1;
    expect_hits(res.num_hit_blocks, k, "the engine's query");
    struct pf_bytes lease = {res.lease, 16};
    pf_engine_release(q->e, &lease, err, sizeof(err));
    free(buf);
    /* the cache's part alone: first cold (a range the engine did not just touch) */
    raw_of(q, cold, k, pb);
    t0 = bu_now();
    size_t got = pf_cache_prefix_pin_hashes(c, q->ns, pb, k, q->hit);
    r->v[COLD_PIN_RAW][it] = bu_now() - t0;
    expect_hits(got, k, "cold raw pinning lookup");
    pf_cache_unpin(c, q->hit, got);
    /* then warm, on the engine's range: references (and their puts, as a lease's) */
    t0 = bu_now();
    got = pf_cache_prefix(c, q->keys + first, k, q->hit);
    r->v[REF][it] = bu_now() - t0;
    expect_hits(got, k, "referencing lookup");
    for (size_t i = 0; i < got; i++)
        pf_block_put(q->hit[i]);
    /* pins from built keys */
    t0 = bu_now();
    got = pf_cache_prefix_pin(c, q->keys + first, k, q->hit);
    r->v[PIN][it] = bu_now() - t0;
    expect_hits(got, k, "pinning lookup");
    pf_cache_unpin(c, q->hit, got);
    /* pins from the raw hashes (the query's path), and the unpin a Release pays */
    raw_of(q, first, k, pb);
    t0 = bu_now();
    got = pf_cache_prefix_pin_hashes(c, q->ns, pb, k, q->hit);
    t1 = bu_now();
    pf_cache_unpin(c, q->hit, got);
    r->v[PIN_RAW][it] = t1 - t0;
    r->v[UNPIN][it] = bu_now() - t1;
    expect_hits(got, k, "raw pinning lookup");
}

/* 3: iters queries of k hashes. */
static void measure(struct qc *q, size_t k, int iters, struct row *r)
{
    memset(r, 0, sizeof(*r));
    r->hashes = k;
    r->iters = iters;
    for (int p = 0; p < NPART; p++)
        if (!(r->v[p] = malloc((size_t)iters * sizeof(double))))
            bu_die("query_cpu", "out of memory");
    ProtobufCBinaryData *bd = malloc(k * sizeof(*bd));
    struct pf_bytes *pb = malloc(k * sizeof(*pb));
    if (!bd || !pb)
        bu_die("query_cpu", "out of memory");
    for (int it = 0; it < iters; it++)
        iteration(q, r, it, bd, pb);
    for (int p = 0; p < NPART; p++) {
        double sum = 0;
        for (int it = 0; it < iters; it++)
            sum += r->v[p][it];
        r->mean[p] = sum / iters;
        r->p50[p] = bu_median(r->v[p], iters);
    }
    free(bd);
    free(pb);
}

/* 4: a table (us and ns a hash, mean and median) and the JSON figures. */
static void report(const struct row *rows, int nrows, size_t n, const char *json)
{
    printf("%zu resident blocks; per query: mean / median us (median ns a hash)\n", n);
    printf("%-6s %-14s %10s %10s %10s\n", "hashes", "part", "mean us", "p50 us", "p50 ns/h");
    for (int i = 0; i < nrows; i++)
        for (int p = 0; p < NPART; p++)
            printf("%-6zu %-14s %10.1f %10.1f %10.1f\n", rows[i].hashes, part_names[p],
                   rows[i].mean[p] * 1e6, rows[i].p50[p] * 1e6,
                   rows[i].p50[p] * 1e9 / (double)rows[i].hashes);
    printf("method: in process, %d / %d iterations; engine = pf_engine_query (lookup of the "
           "request's hashes in place, pins, lease, estimator); cold_pin_raw = the same lookup "
           "over a range the engine did not just touch; cache* = the lookup alone on the "
           "engine's range (warm lines), by references / pins of built keys / pins of raw "
           "hashes; unpin = what a Release pays\n",
           rows[0].iters, rows[nrows - 1].iters);
    if (!json)
        return;
    cJSON *root = bu_json_obj(NULL, NULL);
    bu_json_str(root, "bench", "query_cpu");
    bu_json_num(root, "resident", (double)n);
    char key[64];
    for (int i = 0; i < nrows; i++)
        for (int p = 0; p < NPART; p++) {
            snprintf(key, sizeof(key), "%s_us_%zu", part_names[p], rows[i].hashes);
            bu_json_num(root, key, rows[i].mean[p] * 1e6);
            snprintf(key, sizeof(key), "%s_p50_us_%zu", part_names[p], rows[i].hashes);
            bu_json_num(root, key, rows[i].p50[p] * 1e6);
        }
    bu_json_write(root, json);
}

static void teardown(struct qc *q, struct row *rows, int nrows)
{
    for (int i = 0; i < nrows; i++)
        for (int p = 0; p < NPART; p++)
            free(rows[i].v[p]);
    free(q->keys);
    free(q->hit);
    free(q->hs);
    pf_engine_destroy(q->e);
    pf_gpu_close(q->g);
    pf_simkv_destroy(q->kv);
}

int main(int argc, char **argv)
{
    long nb = 1000000;
    struct qc q = {.iters4096 = 300};
    const char *json = NULL;
    const struct bu_opt opts[] = {{"--blocks", BU_LONG, &nb},
                                  {"--iters", BU_INT, &q.iters4096},
                                  {"--json", BU_STR, &json},
                                  {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, USAGE);
    if (nb < 8192 || q.iters4096 < 1) {
        fprintf(stderr, "usage: %s\n", USAGE);
        return 2;
    }
    q.n = (size_t)nb;
    struct row rows[2];
    setup_engine(&q);
    fill_cache(&q);
    measure(&q, 1, 20000, &rows[0]);
    measure(&q, 4096, q.iters4096, &rows[1]);
    report(rows, 2, q.n, json);
    teardown(&q, rows, 2);
    return 0;
}

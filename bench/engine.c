/* bench/engine: the engine's data and control paths against this machine's own limits,
 * measured in the same run, interleaved.
 *   1. save and load throughput of 1 GiB in 64 KiB, 512 KiB and 2 MiB blocks through the sim
 *      GPU with the server's default flags (integrity on). A save counts when its blocks are
 *      queryable (sealed, checksummed), a load when its load state says done. Baseline: the
 *      fastest single-thread copy of the same bytes between the same kinds of memory (glibc
 *      memcpy in block-sized calls with a lowered non-temporal threshold, an AVX2 streaming
 *      copy in block-sized calls, one memcpy of everything), each measured in every run;
 *      runs alternate project-first and baseline-first (ABBA); every repeat checks every byte
 *      (targets: save >= 0.85, load >= 0.90 of the best copy, medians)
 *   2. xxh3 checksum throughput (the insert thread's per-block cost) vs memcpy
 *   3. QueryPrefetch p50/p99 for 1 and 4096 hashes with 10^6 resident blocks, vs an RPC
 *      carrying the same request bytes (target p50 <= 1.5x for 4096 hashes)
 *   4. server memory per resident block at 10^6 blocks (RSS delta / blocks), with one
 *      cross-layer slot and with 32 per-layer slots
 * Usage: engine [--json FILE] [--quick] [--runs N] [--query-only | --meta] (--query-only: only
 * 4: the 10^6 blocks and the query latencies, without 1, 2 and the 32-slot metadata; --meta:
 * 3 and 4 with both metadata cases, without 1 and 2; a few GiB less memory). The
 * server runs as a separate process ($PF_BIN/pegaflow-server, default build/rel/bin).
 * PF_BENCH_VERBOSE=1 adds the server's own mean handling time per RPC (its
 * pegaflow_rpc_duration_seconds) next to the query latencies. */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <immintrin.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include "client/pegaflow.h"
#include "engine.pb-c.h"
#include "pf/rpc.h"
#include "pftest.h"
#include "benchutil.h"

#define TMO 120000

/* CPU time of the server's threads (ns, from /proc/PID/task/TID/schedstat), summed by thread
 * name (numbered threads of one kind, "rpc-3", count as "rpc"); for PF_BENCH_VERBOSE's split
 * of where a save's CPU goes, which a busy machine distorts far less than wall time. */
#define CPU_KINDS 24
struct cpu_split {
    size_t n;
    char name[CPU_KINDS][20];
    uint64_t ns[CPU_KINDS];
};

static void server_cpu(pid_t pid, struct cpu_split *c)
{
    char dir[64], path[384], comm[32];
    memset(c, 0, sizeof(*c));
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        unsigned long long ns = 0;
        snprintf(path, sizeof(path), "%s/%s/schedstat", dir, de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int ok = fscanf(f, "%llu", &ns) == 1;
        fclose(f);
        snprintf(path, sizeof(path), "%s/%s/comm", dir, de->d_name);
        f = fopen(path, "r");
        if (!f || !ok || !fgets(comm, sizeof(comm), f)) {
            if (f)
                fclose(f);
            continue;
        }
        fclose(f);
        comm[strcspn(comm, "\n")] = 0;
        size_t l = strlen(comm);
        while (l > 0 && ((comm[l - 1] >= '0' && comm[l - 1] <= '9') || comm[l - 1] == '-'))
            comm[--l] = 0;
        size_t k = 0;
        while (k < c->n && strcmp(c->name[k], comm) != 0)
            k++;
        if (k == c->n) {
            if (c->n == CPU_KINDS)
                continue;
            snprintf(c->name[c->n++], sizeof(c->name[0]), "%s", comm);
        }
        c->ns[k] += ns;
    }
    if (d)
        closedir(d);
}

/* Prints after - before per thread kind (kinds above 1 ms). */
static void print_cpu(const struct cpu_split *before, const struct cpu_split *after)
{
    uint64_t total = 0;
    char line[512];
    size_t o = 0;
    for (size_t k = 0; k < after->n; k++) {
        uint64_t b = 0;
        for (size_t j = 0; j < before->n; j++)
            if (strcmp(before->name[j], after->name[k]) == 0)
                b = before->ns[j];
        uint64_t d = after->ns[k] - b;
        total += d;
        if (d >= 1000000 && o < sizeof(line) - 40)
            o += (size_t)snprintf(line + o, sizeof(line) - o, " %s %.1f", after->name[k],
                                  (double)d / 1e6);
    }
    line[o] = 0;
    fprintf(stderr, "    server CPU %.1f ms:%s\n", (double)total / 1e6, line);
}

/* ---- baseline copies: the same bytes, single thread, the same memory kinds ---- */

static void copy_memcpy_blk(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    for (uint64_t o = 0; o < len; o += bs)
        memcpy(dst + o, src + o, bs);
}

/* Non-temporal stores in block-sized pieces (both sides are page aligned). */
__attribute__((target("avx2"))) static void copy_nt_blk(uint8_t *dst, const uint8_t *src,
                                                        uint64_t len, uint64_t bs)
{
    for (uint64_t o = 0; o < len; o += bs) {
        const __m256i *s = (const __m256i *)(src + o);
        __m256i *d = (__m256i *)(dst + o);
        for (uint64_t i = 0; i < bs / 32; i += 4) {
            __m256i x0 = _mm256_load_si256(s + i), x1 = _mm256_load_si256(s + i + 1);
            __m256i x2 = _mm256_load_si256(s + i + 2), x3 = _mm256_load_si256(s + i + 3);
            _mm256_stream_si256(d + i, x0);
            _mm256_stream_si256(d + i + 1, x1);
            _mm256_stream_si256(d + i + 2, x2);
            _mm256_stream_si256(d + i + 3, x3);
        }
    }
    _mm_sfence();
}

static void copy_memcpy_one(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    (void)bs;
    memcpy(dst, src, len);
}

static const struct {
    const char *name;
    void (*fn)(uint8_t *, const uint8_t *, uint64_t, uint64_t);
} copies[] = {
    {"memcpy-blk", copy_memcpy_blk}, {"nt-blk", copy_nt_blk}, {"memcpy-1", copy_memcpy_one}};
#define NCOPIES (sizeof(copies) / sizeof(copies[0]))

/* Every baseline once (dst cleared and checked each time); the best GB/s and its name. */
static double best_copy(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs,
                        const char **name_p)
{
    double best = 0;
    for (size_t k = 0; k < NCOPIES; k++) {
        memset(dst, 0, len);
        double t = bu_now();
        copies[k].fn(dst, src, len, bs);
        double g = (double)len / (bu_now() - t) / 1e9;
        if (memcmp(dst, src, len) != 0) {
            fprintf(stderr, "bench: baseline %s copied wrong bytes\n", copies[k].name);
            exit(1);
        }
        if (g > best) {
            best = g;
            *name_p = copies[k].name;
        }
    }
    return best;
}

/* median of v[0..n) (the mean of the middle two for an even n), with min and max */
static double median3(const double *v, size_t n, double *min_p, double *max_p)
{
    double m[3];
    bu_spread(v, (int)n, m);
    *min_p = m[0];
    *max_p = m[2];
    return m[1];
}

static void hash_of(uint64_t tag, uint64_t i, uint8_t *h)
{
    pft_fill(h, 32, tag, i);
}

static int reg(struct pf_client *c, const char *inst, struct pf_simkv *kv, uint64_t nb, uint64_t bs)
{
    return bu_register(c, inst, "bench", kv, nb, bs, TMO);
}

#define NL32 32 /* layers of the per-layer metadata case (vLLM's one-tensor-per-layer path) */

/* Registers NL32 layers "L0".. of nb blocks of bs bytes each, layer l at l*nb*bs of kv. */
static int reg32(struct pf_client *c, const char *inst, struct pf_simkv *kv, uint64_t nb,
                 uint64_t bs)
{
    static uint8_t ipc[NL32][512];
    static char names[NL32][8];
    struct pf_layer_desc d[NL32];
    for (int l = 0; l < NL32; l++) {
        size_t ipclen;
        pf_simkv_ipc(kv, (uint64_t)l * nb * bs, nb * bs, ipc[l], sizeof(ipc[l]), &ipclen);
        snprintf(names[l], sizeof(names[l]), "L%d", l);
        d[l] = (struct pf_layer_desc){.name = names[l],
                                      .ipc = ipc[l],
                                      .ipc_len = ipclen,
                                      .num_blocks = nb,
                                      .bytes_per_block = bs,
                                      .segments = 1};
    }
    struct pf_register_args a = {.instance_id = inst,
                                 .namespace_ = "bench",
                                 .tp_size = 1,
                                 .world_size = 1,
                                 .device_id = 0,
                                 .layers = d,
                                 .nlayers = NL32};
    return pf_client_register(c, &a, TMO);
}

/* Saves [first, first+n) of every one of the NL32 layers in batches; returns seconds. */
static double save_range32(struct pf_client *c, const char *inst, uint64_t tag, uint64_t n,
                           uint64_t batch, uint64_t id_mod)
{
    uint32_t *ids = malloc(batch * sizeof(*ids));
    uint8_t *hs = malloc(batch * 32);
    char names[NL32][8];
    struct pf_save_layer sl[NL32];
    double t = 0;
    for (uint64_t b = 0; b < n; b += batch) {
        uint64_t k = n - b < batch ? n - b : batch;
        for (uint64_t i = 0; i < k; i++) {
            ids[i] = (uint32_t)((b + i) % id_mod);
            hash_of(tag, b + i, hs + i * 32);
        }
        for (int l = 0; l < NL32; l++) {
            snprintf(names[l], sizeof(names[l]), "L%d", l);
            sl[l] = (struct pf_save_layer){
                .name = names[l], .block_ids = ids, .hashes = hs, .hash_len = 32, .n = k};
        }
        double t0 = bu_now();
        if (pf_client_save(c, inst, 0, 0, 0, sl, NL32, TMO))
            bu_die("engine", "save (32 layers)");
        t += bu_now() - t0;
    }
    free(ids);
    free(hs);
    return t;
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
        double t0 = bu_now();
        if (pf_client_save(c, inst, 0, 0, 0, &sl, 1, TMO))
            bu_die("engine", "save");
        t += bu_now() - t0;
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
    double t0 = bu_now();
    if (pf_client_query(c, inst, "bench", hs, NULL, 32, n, 0, 0, &r, NULL, 0, TMO))
        bu_die("engine", "query");
    if (secs)
        *secs = bu_now() - t0;
    free(hs);
    if (lease && r.lease_len)
        memcpy(lease, r.lease, 16);
    else if (r.lease_len)
        pf_client_release(c, r.lease, 16, TMO);
    return r.num_hit_blocks;
}

/* The QueryRequest bytes query_n sends (malloc'ed, length returned). */
static size_t query_bytes(const char *inst, uint64_t tag, uint64_t first, uint64_t n, uint8_t **out)
{
    uint8_t *hs = malloc(n * 32);
    ProtobufCBinaryData *b = malloc(n * sizeof(*b));
    for (uint64_t i = 0; i < n; i++) {
        hash_of(tag, first + i, hs + i * 32);
        b[i] = (ProtobufCBinaryData){32, hs + i * 32};
    }
    Pegaflow__QueryRequest q = PEGAFLOW__QUERY_REQUEST__INIT;
    q.instance_id = (char *)inst;
    q.req_id = "bench";
    q.block_hashes = b;
    q.n_block_hashes = n;
    size_t len = pegaflow__query_request__get_packed_size(&q);
    *out = malloc(len);
    pegaflow__query_request__pack(&q, *out);
    free(b);
    free(hs);
    return len;
}

static void wait_resident(struct pf_client *c, const char *inst, uint64_t tag, uint64_t first,
                          uint64_t n)
{
    double dl = bu_now() + 60;
    while (query_n(c, inst, tag, first + n - 1, 1, NULL, NULL) != 1) {
        if (bu_now() > dl)
            bu_die("engine", "blocks not sealed in 60 s");
        usleep(1000);
    }
}

/* The server's mean handling time per method so far (its rpc_duration histogram). */
static void server_times(const struct pft_proc *s)
{
    char *mb = NULL;
    pft_http(s->http_host, s->http_port, "GET", "/metrics", &mb);
    static const char *const methods[] = {"query_prefetch", "health", "release"};
    for (size_t m = 0; m < 3; m++) {
        double sum = 0, cnt = 0;
        for (char *l = mb; l && (l = strstr(l, "rpc_duration_seconds_")) != NULL; l++) {
            const char *eol = strchr(l, '\n');
            const char *meth = strstr(l, methods[m]);
            if (!meth || (eol && meth > eol) || !strstr(l, "status=\"ok\"") ||
                (eol && strstr(l, "status=\"ok\"") > eol))
                continue;
            const char *v = strchr(l, '}');
            if (!v || (eol && v > eol))
                continue;
            if (strncmp(l, "rpc_duration_seconds_sum", 24) == 0)
                sum += strtod(v + 1, NULL);
            else if (strncmp(l, "rpc_duration_seconds_count", 26) == 0)
                cnt += strtod(v + 1, NULL);
        }
        if (cnt > 0)
            fprintf(stderr, "  server: %s %.0f calls, mean %.1f us\n", methods[m], cnt,
                    sum / cnt * 1e6);
    }
    free(mb);
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int quick = 0, runs = 0, query_only = 0, meta_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--query-only") == 0)
            query_only = 1;
        else if (strcmp(argv[i], "--meta") == 0)
            meta_only = 1;
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: engine [--quick] [--runs N] [--query-only | --meta] [--json FILE]\n");
            return 2;
        }
    }
    if (runs < 1)
        runs = 3; /* also --quick: one run per size is too noisy on a shared VM */
    /* the baseline's memcpy runs with glibc's non-temporal threshold at one block (the
     * fastest block-sized memcpy on this machine): re-exec once with the tunable set */
    if (!getenv("GLIBC_TUNABLES") && !getenv("PF_BENCH_REEXEC")) {
        setenv("GLIBC_TUNABLES", "glibc.cpu.x86_non_temporal_threshold=0x10000", 1);
        setenv("PF_BENCH_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
        /* exec failed: go on with the default threshold (the method line says so) */
    }
    /* glibc read the tunable at this process's start; the server must not inherit it: it is
     * measured as every user starts it (its sim copy chooses non-temporal stores itself) */
    char tunables[160];
    snprintf(tunables, sizeof(tunables), "%s",
             getenv("GLIBC_TUNABLES") ? getenv("GLIBC_TUNABLES") : "default");
    unsetenv("GLIBC_TUNABLES");
    unsetenv("PF_BENCH_REEXEC");
    const uint64_t TOTAL = quick ? (128ull << 20) : (1ull << 30);
    const uint64_t NBLK_META = quick ? 100000 : 1000000;
    FILE *js = json ? fopen(json, "w") : NULL;
    if (js)
        fprintf(js, "{\n");

    /* ---- machine limits ---- */
    double memcpy_gbs = 0, xxh_gbs = 0;
    if (!query_only && !meta_only) {
        uint8_t *a = aligned_alloc(4096, TOTAL), *b = aligned_alloc(4096, TOTAL);
        pft_fill(a, TOTAL, 1, 1);
        memset(b, 0, TOTAL); /* both buffers faulted in before timing */
        double t0;
        for (int r = 0; r < 3; r++) { /* best of 3: the machine's single-thread limit */
            t0 = bu_now();
            memcpy(r % 2 ? a : b, r % 2 ? b : a, TOTAL);
            double g = (double)TOTAL / (bu_now() - t0) / 1e9;
            if (g > memcpy_gbs)
                memcpy_gbs = g;
        }
        t0 = bu_now();
        volatile uint64_t sink = XXH3_64bits_dispatch(a, TOTAL); /* as the server's checksums */
        (void)sink;
        xxh_gbs = (double)TOTAL / (bu_now() - t0) / 1e9;
        free(a);
        free(b);
        printf("machine: memcpy %.2f GB/s (1 thread), xxh3 %.2f GB/s (%.2fx memcpy)\n", memcpy_gbs,
               xxh_gbs, xxh_gbs / memcpy_gbs);
    }
    /* ---- server ---- */
    char pool[32];
    /* room for the throughput data and, next to it, both metadata sets (512 B blocks plus
     * their warm-up, 32 x 16 B slots): --quick's 128 MiB alone would evict during those */
    uint64_t meta_need = (8 * 16384 + NBLK_META) * 512 + NBLK_META * NL32 * 16;
    snprintf(pool, sizeof(pool), "%llumb",
             (unsigned long long)((TOTAL * 5 / 4 + meta_need * 5 / 4) >> 20));
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", pool, "--log-level", "info", NULL};
    struct pft_proc s;
    if (pft_start(&s, "pegaflow-server", "127.0.0.1", args))
        return 1;
    bu_check_env_clean(s.pid, "GLIBC_TUNABLES");
    struct pf_client *c;
    if (pf_client_connect(s.addr, &c))
        bu_die("engine", "connect");
    struct pf_simkv *src = NULL, *dst = NULL;
    if (!query_only && !meta_only) {
        if (pf_simkv_create(TOTAL, 0, &src) || pf_simkv_create(TOTAL, 0, &dst))
            bu_die("engine", "simkv");
        pft_fill(pf_simkv_ptr(src), TOTAL, 2, 2);
        memset(pf_simkv_ptr(dst), 0, TOTAL);

        /* host buffer of the pinned pool's kind (anonymous, huge pages advised) for the per-block
         * baselines */
        uint8_t *hostbuf =
            mmap(NULL, TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (hostbuf == MAP_FAILED)
            bu_die("engine", "mmap baseline buffer");
        madvise(hostbuf, TOTAL, MADV_HUGEPAGE);
        memset(hostbuf, 0, TOTAL);
        printf("\n%-9s %9s %9s %6s %6s %6s %9s %9s %6s %6s %6s  %s\n", "block", "save GB/s",
               "best cp", "min", "median", "max", "load GB/s", "best cp", "min", "median", "max",
               "fastest baseline (save/load)");
        if (js)
            fprintf(js,
                    "  \"memcpy_gbs\": %.3f,\n  \"xxh3_gbs\": %.3f,\n  \"runs\": %d,\n"
                    "  \"throughput\": [\n",
                    memcpy_gbs, xxh_gbs, runs);
        const uint64_t sizes[3] = {64 << 10, 512 << 10, 2 << 20};
        double *sv = calloc((size_t)runs, sizeof(double)),
               *lv = calloc((size_t)runs, sizeof(double));
        double *sb = calloc((size_t)runs, sizeof(double)),
               *lb = calloc((size_t)runs, sizeof(double));
        double *sr = calloc((size_t)runs, sizeof(double)),
               *lr = calloc((size_t)runs, sizeof(double));
        int64_t *targets = malloc((TOTAL / sizes[0]) * sizeof(*targets));
        for (uint64_t i = 0; i < TOTAL / sizes[0]; i++)
            targets[i] = (int64_t)i;
        for (int si = 0; si < 3; si++) {
            uint64_t bs = sizes[si], nb = TOTAL / bs;
            char src_id[32], dst_id[32];
            snprintf(src_id, sizeof(src_id), "src-%d", si);
            snprintf(dst_id, sizeof(dst_id), "dst-%d", si);
            if (reg(c, src_id, src, nb, bs) || reg(c, dst_id, dst, nb, bs))
                bu_die("engine", "register");
            /* warm-up round (untimed): the server's first touch of each page of the freshly
             * mapped "GPU" memory is a page fault a real GPU does not have */
            const char *names[1] = {"ALL_LAYERS"};
            const char *sname = "", *lname = "";
            for (int r = -1; r < runs; r++) {
                uint64_t tag = 100 + (uint64_t)si * 1000 + (uint64_t)(r + 1);
                bool base_first = r >= 0 && r % 2 == 1; /* ABBA */
                double bsave = 0, bload = 0;
                if (base_first && r >= 0) {
                    bsave = best_copy(hostbuf, pf_simkv_ptr(src), TOTAL, bs, &sname);
                    bload = best_copy(pf_simkv_ptr(dst), hostbuf, TOTAL, bs, &lname);
                    memset(pf_simkv_ptr(dst), 0, TOTAL);
                }
                /* save: from the first Save call until the last block is queryable (sealed with
                 * its checksum: the insert thread seals in order) */
                struct cpu_split c0, c1;
                bool verbose = getenv("PF_BENCH_VERBOSE") != NULL;
                if (verbose)
                    server_cpu(s.pid, &c0);
                double t = bu_now();
                double trpc = save_range(c, src_id, tag, 0, nb, nb < 4096 ? nb : 4096, nb);
                wait_resident(c, src_id, tag, 0, nb);
                double ts = bu_now() - t;
                if (verbose) {
                    server_cpu(s.pid, &c1);
                    fprintf(stderr,
                            "  %lluKiB run %d: Save RPCs %.1f ms, until queryable %.1f ms\n",
                            (unsigned long long)(bs >> 10), r, trpc * 1e3, ts * 1e3);
                    print_cpu(&c0, &c1);
                }
                uint8_t lease[16];
                if (query_n(c, dst_id, tag, 0, nb, lease, NULL) != nb)
                    bu_die("engine", "query after save");
                size_t gsz = 1, cnt = nb;
                struct pf_load_item it = {
                    .lease = lease, .lease_len = 16, .targets = targets, .group_counts = &cnt};
                struct pf_loadstate *ls;
                pf_loadstate_create(&ls);
                t = bu_now();
                if (pf_client_load(c, dst_id, 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1,
                                   TMO))
                    bu_die("engine", "load");
                if (pf_loadstate_wait(ls, TMO) != 1)
                    bu_die("engine", "load state");
                double tl = bu_now() - t;
                pf_loadstate_destroy(ls);
                if (verbose) {
                    server_cpu(s.pid, &c0);
                    fprintf(stderr, "  %lluKiB run %d: load %.1f ms\n",
                            (unsigned long long)(bs >> 10), r, tl * 1e3);
                    print_cpu(&c1, &c0);
                }
                /* every repeat checks every byte the save and the load moved */
                if (memcmp(pf_simkv_ptr(src), pf_simkv_ptr(dst), TOTAL) != 0)
                    bu_die("engine", "loaded bytes differ");
                memset(pf_simkv_ptr(dst), 0, TOTAL);
                pft_http(s.http_host, s.http_port, "POST", "/cache/memory/cleanup", NULL);
                if (r < 0)
                    continue;
                if (!base_first) {
                    bsave = best_copy(hostbuf, pf_simkv_ptr(src), TOTAL, bs, &sname);
                    bload = best_copy(pf_simkv_ptr(dst), hostbuf, TOTAL, bs, &lname);
                    memset(pf_simkv_ptr(dst), 0, TOTAL);
                }
                sv[r] = (double)TOTAL / ts / 1e9;
                lv[r] = (double)TOTAL / tl / 1e9;
                sb[r] = bsave;
                lb[r] = bload;
                sr[r] = sv[r] / bsave;
                lr[r] = lv[r] / bload;
            }
            double d0, d1, smin, smax, lmin, lmax;
            double sg = median3(sv, (size_t)runs, &d0, &d1),
                   lg = median3(lv, (size_t)runs, &d0, &d1);
            double sbm = median3(sb, (size_t)runs, &d0, &d1),
                   lbm = median3(lb, (size_t)runs, &d0, &d1);
            double srm = median3(sr, (size_t)runs, &smin, &smax);
            double lrm = median3(lr, (size_t)runs, &lmin, &lmax);
            printf("%6lluKiB %9.2f %9.2f %6.2f %6.2f %6.2f %9.2f %9.2f %6.2f %6.2f %6.2f  %s/%s\n",
                   (unsigned long long)(bs >> 10), sg, sbm, smin, srm, smax, lg, lbm, lmin, lrm,
                   lmax, sname, lname);
            if (js)
                fprintf(
                    js,
                    "    {\"block_bytes\": %llu, \"save_gbs\": %.3f, \"save_baseline_gbs\": %.3f, "
                    "\"save_ratio\": [%.3f, %.3f, %.3f], \"load_gbs\": %.3f, "
                    "\"load_baseline_gbs\": %.3f, \"load_ratio\": [%.3f, %.3f, %.3f]}%s\n",
                    (unsigned long long)bs, sg, sbm, smin, srm, smax, lg, lbm, lmin, lrm, lmax,
                    si < 2 ? "," : "");
            pf_client_unregister(c, src_id, TMO);
            pf_client_unregister(c, dst_id, TMO);
        }
        free(targets);
        free(sv);
        free(lv);
        free(sb);
        free(lb);
        free(sr);
        free(lr);
        munmap(hostbuf, TOTAL);
        printf(
            "method: %d runs per size, ABBA (odd runs baseline first); save timed until the last "
            "block is queryable, default flags (integrity on); load until its state is done; "
            "baseline = fastest of memcpy in block calls (GLIBC_TUNABLES non-temporal threshold "
            "%s), AVX2 streaming copy in block calls, one %llu MiB memcpy, simkv shm <-> "
            "THP-advised anonymous memory; every repeat memcmp's all bytes; ratios min/median/max "
            "of per-run ratios\n",
            runs, tunables, (unsigned long long)(TOTAL >> 20));
        if (js)
            fprintf(js, "  ],\n");
    }

    /* ---- 10^6 resident blocks: memory per block, query latency ---- */
    const uint64_t mbs = 512;
    struct pf_simkv *small;
    if (pf_simkv_create(16384 * mbs, 0, &small))
        bu_die("engine", "simkv small");
    pft_fill(pf_simkv_ptr(small), 16384 * mbs, 3, 3);
    if (reg(c, "meta", small, 16384, mbs))
        bu_die("engine", "register meta");
    /* warm-up: saves of the measured request size (blocks that stay resident, other hashes),
     * eight, so that the RPC threads' request buffers and heap arenas, which do not grow with
     * the blocks, exist before the first RSS reading */
    save_range(c, "meta", 6, 0, 8 * 16384, 16384, 16384);
    wait_resident(c, "meta", 6, 0, 8 * 16384);
    long rss0 = bu_rss_kb(s.pid);
    double tsave = save_range(c, "meta", 7, 0, NBLK_META, 16384, 16384);
    wait_resident(c, "meta", 7, 0, NBLK_META);
    long rss1 = bu_rss_kb(s.pid);
    double per_block = (double)(rss1 - rss0) * 1024.0 / (double)NBLK_META;
    printf("\n%llu resident blocks of %llu B: %.0f bytes of server memory per block "
           "(RSS delta), saved at %.0f blocks/s\n",
           (unsigned long long)NBLK_META, (unsigned long long)mbs, per_block,
           (double)NBLK_META / tsave);
    struct pf_simkv *k32 = NULL;
    if (!query_only) {
        /* the same count of blocks with 32 per-layer slots each (16 B per layer, so the pool
         * holds both sets: no eviction may free metadata between the two RSS readings) */
        const uint64_t lbs = 16;
        if (pf_simkv_create(16384 * lbs * NL32, 0, &k32))
            bu_die("engine", "simkv 32 layers");
        pft_fill(pf_simkv_ptr(k32), 16384 * lbs * NL32, 4, 4);
        if (reg32(c, "meta32", k32, 16384, lbs))
            bu_die("engine", "register 32 layers");
        char *mbody = NULL;
        pft_http(s.http_host, s.http_port, "GET", "/metrics", &mbody);
        const char *ev = mbody ? strstr(mbody, "\npegaflow_cache_block_evictions_total ") : NULL;
        double ev0 = ev ? strtod(ev + 39, NULL) : -1;
        free(mbody);
        long rss2 = bu_rss_kb(s.pid);
        double tsave32 = save_range32(c, "meta32", 8, NBLK_META, 4096, 16384);
        wait_resident(c, "meta32", 8, 0, NBLK_META);
        long rss3 = bu_rss_kb(s.pid);
        mbody = NULL;
        pft_http(s.http_host, s.http_port, "GET", "/metrics", &mbody);
        ev = mbody ? strstr(mbody, "\npegaflow_cache_block_evictions_total ") : NULL;
        double ev1 = ev ? strtod(ev + 39, NULL) : -2;
        free(mbody);
        if (ev0 < 0 || ev1 != ev0)
            bu_die("engine", "evictions during the metadata measurement (the pool is too small)");
        double per_block32 = (double)(rss3 - rss2) * 1024.0 / (double)NBLK_META;
        printf("%llu resident blocks of %d layers x %llu B: %.0f bytes of server memory per block "
               "(%.0f per layer slot), saved at %.0f blocks/s\n",
               (unsigned long long)NBLK_META, NL32, (unsigned long long)lbs, per_block32,
               per_block32 / NL32, (double)NBLK_META / tsave32);
        printf("method: server RSS delta over saving the blocks (new hashes, no eviction between "
               "the readings; 8 warm-up saves of the same request size before the first reading, "
               "their blocks resident) / blocks; one slot = one cross-layer tensor, 32 slots = one "
               "tensor per "
               "layer\n");
        if (js)
            fprintf(js, "  \"bytes_per_block_32_layers\": %.1f,\n", per_block32);
    }
    int iters = quick ? 300 : 2000;
    double *lat = malloc((size_t)iters * sizeof(double));
    for (int i = 0; i < 50; i++)
        pf_client_health(c, TMO);
    for (int i = 0; i < iters; i++) {
        double t1 = bu_now();
        if (pf_client_health(c, TMO))
            bu_die("engine", "health");
        lat[i] = bu_now() - t1;
    }
    double h50 = bu_median(lat, (int)iters), h99 = bu_pct(lat, (size_t)iters, 0.99);
    printf("\n%-26s %10s %10s %10s %12s %10s\n", "RPC", "p50 us", "p99 us", "p50/Health",
           "same-bytes", "ratio");
    printf("%-26s %10.1f %10.1f %10.2f\n", "Health (empty)", h50 * 1e6, h99 * 1e6, 1.0);
    if (js)
        fprintf(js,
                "  \"resident_blocks\": %llu,\n  \"bytes_per_block\": %.1f,\n  \"health_p50_us\": "
                "%.1f,\n  \"health_p99_us\": %.1f,\n  \"query\": [\n",
                (unsigned long long)NBLK_META, per_block, h50 * 1e6, h99 * 1e6);
    const uint64_t qn[2] = {1, 4096};
    double *blat = malloc((size_t)iters * sizeof(double));
    struct pf_rpc_channel *rch;
    if (pf_rpc_channel_open(s.addr, &rch))
        bu_die("engine", "channel");
    for (int qi = 0; qi < 2; qi++) {
        /* interleaved: each QueryPrefetch is followed by a Health RPC carrying the very same
         * request bytes (validated on the wire, never decoded), the RPC path's own cost */
        for (int i = 0; i < iters; i++) {
            uint64_t first = ((uint64_t)i * 7919) % (NBLK_META - qn[qi]);
            uint32_t hits = query_n(c, "meta", 7, first, qn[qi], NULL, &lat[i]);
            if (hits != qn[qi])
                bu_die("engine", "query missed resident blocks");
            uint8_t *req;
            size_t reqlen = query_bytes("meta", 7, first, qn[qi], &req);
            struct pf_rpc_status st;
            ProtobufCMessage *resp = NULL;
            double t1 = bu_now();
            if (pf_rpc_unary_raw(rch, "/pegaflow.Engine/Health", req, reqlen,
                                 &pegaflow__health_response__descriptor, TMO, &resp, &st))
                bu_die("engine", "health with the query's bytes");
            blat[i] = bu_now() - t1;
            protobuf_c_message_free_unpacked(resp, NULL);
            free(req);
        }
        if (getenv("PF_BENCH_VERBOSE"))
            server_times(&s);
        double q50 = bu_median(lat, (int)iters), q99 = bu_pct(lat, (size_t)iters, 0.99);
        double b50 = bu_median(blat, (int)iters);
        char label[64];
        snprintf(label, sizeof(label), "QueryPrefetch %llu hash%s", (unsigned long long)qn[qi],
                 qn[qi] > 1 ? "es" : "");
        printf("%-26s %10.1f %10.1f %10.2f %12.1f %10.2f\n", label, q50 * 1e6, q99 * 1e6, q50 / h50,
               b50 * 1e6, q50 / b50);
        if (js)
            fprintf(js,
                    "    {\"hashes\": %llu, \"p50_us\": %.1f, \"p99_us\": %.1f, \"p50_vs_health\": "
                    "%.3f, \"same_bytes_p50_us\": %.1f, \"p50_vs_same_bytes\": %.3f}%s\n",
                    (unsigned long long)qn[qi], q50 * 1e6, q99 * 1e6, q50 / h50, b50 * 1e6,
                    q50 / b50, qi == 0 ? "," : "");
    }
    printf("method: p50/p99 over %d calls; each QueryPrefetch interleaved with a Health RPC "
           "carrying the same request bytes (same-bytes p50); targets: 4096 hashes <= 1.5x "
           "same-bytes\n",
           iters);
    pf_rpc_channel_close(rch);
    free(blat);
    if (js) {
        fprintf(js, "  ]\n}\n");
        fclose(js);
    }
    free(lat);
    pf_client_close(c);
    pf_simkv_destroy(src);
    pf_simkv_destroy(dst);
    pf_simkv_destroy(small);
    pf_simkv_destroy(k32);
    pft_stop(&s, SIGTERM, 60000);
    return 0;
}

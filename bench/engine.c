/* bench/engine: the engine's data and control paths against this machine's own limits,
 * measured in the same run, interleaved.
 *   1. save and load throughput of 1 GiB in 64 KiB, 512 KiB and 2 MiB blocks through the sim
 *      GPU with the server's default flags (integrity on). A save counts when its blocks are
 *      queryable (sealed, checksummed), a load when its load state says done. Baseline: the
 *      fastest copy of the same bytes between the same kinds of memory on one thread (glibc
 *      memcpy in block-sized calls with a lowered non-temporal threshold, an AVX2 streaming
 *      copy in block-sized calls, one memcpy of everything) or on two (the two block-call
 *      copies split in halves: the sim GPU copies on two lanes), each measured in every run;
 *      runs alternate project-first and baseline-first (ABBA); every repeat checks every byte
 *      (targets: save >= 0.85 from 512 KiB blocks, >= 0.80 below; load >= 0.90 of the best
 *      copy; medians)
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
#include <pthread.h>
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

/* The server's minor + major page faults so far (/proc/PID/stat fields 10 and 12). */
static unsigned long long server_faults(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long minflt = 0, majflt = 0;
    if (p)
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %llu %*u %llu", &minflt, &majflt);
    return minflt + majflt;
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

/* ---- baseline copies: the same bytes, one or two threads, the same memory kinds ---- */

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

/* The same with four source streams in flight: each 16 KiB of a block as four 4 KiB
 * strides copied side by side, 128 bytes of each in turn (AVX-512 where the CPU has it);
 * 12-15 % faster than one sequential stream here (bench/README.md "Save: the hash
 * beside the copy"). Blocks are multiples of 16 KiB. */
__attribute__((target("avx512f"))) static void nt4_512(uint8_t *d, const uint8_t *s, uint64_t bs)
{
    for (uint64_t g = 0; g < bs; g += 16384)
        for (uint64_t o = 0; o < 4096; o += 128)
            for (uint64_t w = 0; w < 4; w++) {
                const uint8_t *sp = s + g + w * 4096 + o;
                uint8_t *dp = d + g + w * 4096 + o;
                __m512i x0 = _mm512_load_si512(sp), x1 = _mm512_load_si512(sp + 64);
                _mm512_stream_si512((__m512i *)dp, x0);
                _mm512_stream_si512((__m512i *)(dp + 64), x1);
            }
}

__attribute__((target("avx2"))) static void nt4_256(uint8_t *d, const uint8_t *s, uint64_t bs)
{
    for (uint64_t g = 0; g < bs; g += 16384)
        for (uint64_t o = 0; o < 4096; o += 128)
            for (uint64_t w = 0; w < 4; w++) {
                const __m256i *sp = (const __m256i *)(s + g + w * 4096 + o);
                __m256i *dp = (__m256i *)(d + g + w * 4096 + o);
                __m256i x0 = _mm256_load_si256(sp), x1 = _mm256_load_si256(sp + 1);
                __m256i x2 = _mm256_load_si256(sp + 2), x3 = _mm256_load_si256(sp + 3);
                _mm256_stream_si256(dp, x0);
                _mm256_stream_si256(dp + 1, x1);
                _mm256_stream_si256(dp + 2, x2);
                _mm256_stream_si256(dp + 3, x3);
            }
}

static void copy_nt4_blk(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    bool wide = __builtin_cpu_supports("avx512f");
    for (uint64_t o = 0; o < len; o += bs) {
        if (wide)
            nt4_512(dst + o, src + o, bs);
        else
            nt4_256(dst + o, src + o, bs);
    }
    _mm_sfence();
}

static void copy_memcpy_one(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    (void)bs;
    memcpy(dst, src, len);
}

/* The same copy split at a block boundary between this thread and one more: the sim GPU
 * copies a batch from 512 KiB on two lanes (two threads, as a GPU uses more than one copy
 * engine), so the machine's best copy is measured with two threads as well (the thread's
 * start is inside the timed part; the lanes are started once). */
typedef void (*copy_fn)(uint8_t *, const uint8_t *, uint64_t, uint64_t);
struct half {
    copy_fn fn;
    uint8_t *dst;
    const uint8_t *src;
    uint64_t len, bs;
};

static void *half_main(void *arg)
{
    struct half *h = arg;
    h->fn(h->dst, h->src, h->len, h->bs);
    return NULL;
}

static void copy_two(copy_fn fn, uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    uint64_t first = len / bs / 2 * bs;
    struct half h = {fn, dst + first, src + first, len - first, bs};
    pthread_t t;
    if (first == 0 || pthread_create(&t, NULL, half_main, &h) != 0) {
        fn(dst, src, len, bs);
        return;
    }
    fn(dst, src, first, bs);
    pthread_join(t, NULL);
}

static void copy_memcpy_blk2(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    copy_two(copy_memcpy_blk, dst, src, len, bs);
}

static void copy_nt_blk2(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    copy_two(copy_nt_blk, dst, src, len, bs);
}

static void copy_nt4_blk2(uint8_t *dst, const uint8_t *src, uint64_t len, uint64_t bs)
{
    copy_two(copy_nt4_blk, dst, src, len, bs);
}

static const struct {
    const char *name;
    copy_fn fn;
} copies[] = {{"memcpy-blk", copy_memcpy_blk}, {"nt-blk", copy_nt_blk},
              {"memcpy-1", copy_memcpy_one},   {"memcpy-blk-2t", copy_memcpy_blk2},
              {"nt-blk-2t", copy_nt_blk2},     {"nt4-blk", copy_nt4_blk},
              {"nt4-blk-2t", copy_nt4_blk2}};
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
            bu_hash_of(tag, b + i, hs + i * 32);
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

/* The QueryRequest bytes query_n sends (malloc'ed, length returned). */
static size_t query_bytes(const char *inst, uint64_t tag, uint64_t first, uint64_t n, uint8_t **out)
{
    uint8_t *hs = malloc(n * 32);
    ProtobufCBinaryData *b = malloc(n * sizeof(*b));
    for (uint64_t i = 0; i < n; i++) {
        bu_hash_of(tag, first + i, hs + i * 32);
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

/* ---- the phases of a run ---- */

struct eng {
    bool quick, query_only, meta_only;
    int runs;
    const char *json;
    char tunables[160]; /* the baseline's GLIBC_TUNABLES ("default" when none) */
    uint64_t total;     /* bytes per throughput run */
    uint64_t nblk_meta; /* resident blocks of the metadata and query phases */
    double memcpy_gbs;  /* the machine's single-thread memcpy */
    struct pft_proc s;  /* the measured server */
    struct pf_client *c;
    struct pf_simkv *small, *k32;
    cJSON *root; /* the JSON result */
};

/* The baseline's memcpy runs with glibc's non-temporal threshold at one block (the fastest
 * block-sized memcpy on this machine): re-exec once with the tunable set. glibc read it at
 * this process's start; the server must not inherit it: it is measured as every user starts
 * it (its sim copy chooses non-temporal stores itself). */
static void tunables_for_the_baseline(struct eng *e, char **argv)
{
    if (!getenv("GLIBC_TUNABLES") && !getenv("PF_BENCH_REEXEC")) {
        setenv("GLIBC_TUNABLES", "glibc.cpu.x86_non_temporal_threshold=0x10000", 1);
        setenv("PF_BENCH_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
        /* exec failed: go on with the default threshold (the method line says so) */
    }
    snprintf(e->tunables, sizeof(e->tunables), "%s",
             getenv("GLIBC_TUNABLES") ? getenv("GLIBC_TUNABLES") : "default");
    unsetenv("GLIBC_TUNABLES");
    unsetenv("PF_BENCH_REEXEC");
}

/* 1 and 2's machine limits: single-thread memcpy (best of 3) and xxh3 of TOTAL bytes. */
static void phase_machine(struct eng *e)
{
    uint64_t total = e->total;
    uint8_t *a = aligned_alloc(4096, total), *b = aligned_alloc(4096, total);
    pft_fill(a, total, 1, 1);
    memset(b, 0, total); /* both buffers faulted in before timing */
    double t0, xxh_gbs;
    for (int r = 0; r < 3; r++) { /* best of 3: the machine's single-thread limit */
        t0 = bu_now();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, total);
        double g = (double)total / (bu_now() - t0) / 1e9;
        if (g > e->memcpy_gbs)
            e->memcpy_gbs = g;
    }
    t0 = bu_now();
    volatile uint64_t sink = XXH3_64bits_dispatch(a, total); /* as the server's checksums */
    (void)sink;
    xxh_gbs = (double)total / (bu_now() - t0) / 1e9;
    free(a);
    free(b);
    printf("machine: memcpy %.2f GB/s (1 thread), xxh3 %.2f GB/s (%.2fx memcpy)\n", e->memcpy_gbs,
           xxh_gbs, xxh_gbs / e->memcpy_gbs);
    bu_json_num(e->root, "memcpy_gbs", e->memcpy_gbs);
    bu_json_num(e->root, "xxh3_gbs", xxh_gbs);
    bu_json_num(e->root, "runs", e->runs);
}

/* The server with the default flags and a pool that holds the throughput data and, next to
 * it, both metadata sets (512 B blocks plus their warm-up, 32 x 16 B slots): --quick's
 * 128 MiB alone would evict during those. */
static void start_server(struct eng *e)
{
    char pool[32];
    uint64_t meta_need = (8 * 16384 + e->nblk_meta) * 512 + e->nblk_meta * NL32 * 16;
    snprintf(pool, sizeof(pool), "%llumb",
             (unsigned long long)((e->total * 5 / 4 + meta_need * 5 / 4) >> 20));
    const char *args[] = {"--gpu-backend", "sim", "--pool-size", pool, "--log-level", "info", NULL};
    if (pft_start(&e->s, "pegaflow-server", "127.0.0.1", args))
        exit(1);
    bu_check_env_clean(e->s.pid, "GLIBC_TUNABLES");
    if (pf_client_connect(e->s.addr, &e->c))
        bu_die("engine", "connect");
}

/* One throughput run of block size bs: save until queryable and load until done, with the
 * best copy before (base_first) or after; fills the run's figures. r < 0: the warm-up. */
struct tp_run {
    double save_gbs, load_gbs, save_base, load_base;
};

static void throughput_run(struct eng *e, struct pf_simkv *src, struct pf_simkv *dst,
                           uint8_t *hostbuf, int64_t *targets, int si, int r, uint64_t bs,
                           const char **sname, const char **lname, struct tp_run *out)
{
    struct pf_client *c = e->c;
    uint64_t total = e->total, nb = total / bs;
    char src_id[32], dst_id[32];
    snprintf(src_id, sizeof(src_id), "src-%d", si);
    snprintf(dst_id, sizeof(dst_id), "dst-%d", si);
    const char *names[1] = {"ALL_LAYERS"};
    uint64_t tag = 100 + (uint64_t)si * 1000 + (uint64_t)(r + 1);
    bool base_first = r >= 0 && r % 2 == 1; /* ABBA */
    double bsave = 0, bload = 0;
    if (base_first) {
        bsave = best_copy(hostbuf, pf_simkv_ptr(src), total, bs, sname);
        bload = best_copy(pf_simkv_ptr(dst), hostbuf, total, bs, lname);
        memset(pf_simkv_ptr(dst), 0, total);
    }
    /* save: from the first Save call until the last block is queryable (sealed with its
     * checksum: the insert thread seals in order) */
    struct cpu_split c0, c1;
    bool verbose = getenv("PF_BENCH_VERBOSE") != NULL;
    unsigned long long f0 = 0, f1 = 0;
    if (verbose) {
        server_cpu(e->s.pid, &c0);
        f0 = server_faults(e->s.pid);
    }
    double t = bu_now();
    uint64_t batch = nb < 4096 ? nb : 4096, ncalls = (nb + batch - 1) / batch;
    double *per_call = verbose ? calloc(ncalls, sizeof(*per_call)) : NULL;
    double trpc = bu_save_range(c, src_id, tag, 0, nb, batch, nb, TMO, per_call);
    bu_wait_resident(c, src_id, tag, 0, nb, TMO);
    double ts = bu_now() - t;
    if (verbose) {
        server_cpu(e->s.pid, &c1);
        f1 = server_faults(e->s.pid);
        fprintf(stderr,
                "  %lluKiB run %d: Save RPCs %.1f ms, until queryable %.1f ms, %llu server page "
                "faults\n",
                (unsigned long long)(bs >> 10), r, trpc * 1e3, ts * 1e3, f1 - f0);
        if (per_call && ncalls > 1) { /* each call's round trip, as the client saw it */
            fprintf(stderr, "    Save calls of %llu blocks (ms):", (unsigned long long)batch);
            for (uint64_t i = 0; i < ncalls; i++)
                fprintf(stderr, " %.1f", per_call[i] * 1e3);
            fprintf(stderr, "\n");
        }
        print_cpu(&c0, &c1);
    }
    free(per_call);
    uint8_t lease[16];
    if (bu_query_n(c, dst_id, tag, 0, nb, lease, NULL, TMO) != nb)
        bu_die("engine", "query after save");
    size_t gsz = 1, cnt = nb;
    struct pf_load_item it = {
        .lease = lease, .lease_len = 16, .targets = targets, .group_counts = &cnt};
    struct pf_loadstate *ls;
    pf_loadstate_create(&ls);
    t = bu_now();
    if (pf_client_load(c, dst_id, 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1, TMO))
        bu_die("engine", "load");
    if (pf_loadstate_wait(ls, TMO) != 1)
        bu_die("engine", "load state");
    double tl = bu_now() - t;
    pf_loadstate_destroy(ls);
    if (verbose) {
        server_cpu(e->s.pid, &c0);
        fprintf(stderr, "  %lluKiB run %d: load %.1f ms, %llu server page faults\n",
                (unsigned long long)(bs >> 10), r, tl * 1e3, server_faults(e->s.pid) - f1);
        print_cpu(&c1, &c0);
    }
    /* every repeat checks every byte the save and the load moved */
    if (memcmp(pf_simkv_ptr(src), pf_simkv_ptr(dst), total) != 0)
        bu_die("engine", "loaded bytes differ");
    memset(pf_simkv_ptr(dst), 0, total);
    pft_http(e->s.http_host, e->s.http_port, "POST", "/cache/memory/cleanup", NULL);
    if (r < 0)
        return;
    if (!base_first) {
        bsave = best_copy(hostbuf, pf_simkv_ptr(src), total, bs, sname);
        bload = best_copy(pf_simkv_ptr(dst), hostbuf, total, bs, lname);
        memset(pf_simkv_ptr(dst), 0, total);
    }
    *out = (struct tp_run){(double)total / ts / 1e9, (double)total / tl / 1e9, bsave, bload};
}

/* 1: save and load throughput at 64 KiB, 512 KiB and 2 MiB against the best copy. */
static void phase_throughput(struct eng *e)
{
    uint64_t total = e->total;
    int runs = e->runs;
    struct pf_simkv *src = NULL, *dst = NULL;
    if (pf_simkv_create(total, 0, &src) || pf_simkv_create(total, 0, &dst))
        bu_die("engine", "simkv");
    pft_fill(pf_simkv_ptr(src), total, 2, 2);
    memset(pf_simkv_ptr(dst), 0, total);
    /* host buffer of the pinned pool's kind (anonymous, huge pages advised) for the
     * per-block baselines */
    uint8_t *hostbuf =
        mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hostbuf == MAP_FAILED)
        bu_die("engine", "mmap baseline buffer");
    madvise(hostbuf, total, MADV_HUGEPAGE);
    memset(hostbuf, 0, total);
    printf("\n%-9s %9s %9s %6s %6s %6s %9s %9s %6s %6s %6s  %s\n", "block", "save GB/s", "best cp",
           "min", "median", "max", "load GB/s", "best cp", "min", "median", "max",
           "fastest baseline (save/load)");
    cJSON *arr = bu_json_check(cJSON_AddArrayToObject(e->root, "throughput"));
    const uint64_t sizes[3] = {64 << 10, 512 << 10, 2 << 20};
    double *v = calloc(6 * (size_t)runs, sizeof(double));
    double *sv = v, *lv = v + runs, *sb = v + 2 * runs, *lb = v + 3 * runs, *sr = v + 4 * runs,
           *lr = v + 5 * runs;
    int64_t *targets = malloc((total / sizes[0]) * sizeof(*targets));
    for (uint64_t i = 0; i < total / sizes[0]; i++)
        targets[i] = (int64_t)i;
    for (int si = 0; si < 3; si++) {
        uint64_t bs = sizes[si], nb = total / bs;
        char src_id[32], dst_id[32];
        snprintf(src_id, sizeof(src_id), "src-%d", si);
        snprintf(dst_id, sizeof(dst_id), "dst-%d", si);
        if (reg(e->c, src_id, src, nb, bs) || reg(e->c, dst_id, dst, nb, bs))
            bu_die("engine", "register");
        /* warm-up round (r = -1, untimed): the server's first touch of each page of the
         * freshly mapped "GPU" memory is a page fault a real GPU does not have */
        const char *sname = "", *lname = "";
        for (int r = -1; r < runs; r++) {
            struct tp_run t;
            throughput_run(e, src, dst, hostbuf, targets, si, r, bs, &sname, &lname, &t);
            if (r < 0)
                continue;
            sv[r] = t.save_gbs;
            lv[r] = t.load_gbs;
            sb[r] = t.save_base;
            lb[r] = t.load_base;
            sr[r] = t.save_gbs / t.save_base;
            lr[r] = t.load_gbs / t.load_base;
        }
        double srs[3], lrs[3];
        bu_spread(sr, runs, srs);
        bu_spread(lr, runs, lrs);
        double sg = bu_median(sv, runs), lg = bu_median(lv, runs);
        double sbm = bu_median(sb, runs), lbm = bu_median(lb, runs);
        printf("%6lluKiB %9.2f %9.2f %6.2f %6.2f %6.2f %9.2f %9.2f %6.2f %6.2f %6.2f  %s/%s\n",
               (unsigned long long)(bs >> 10), sg, sbm, srs[0], srs[1], srs[2], lg, lbm, lrs[0],
               lrs[1], lrs[2], sname, lname);
        cJSON *o = bu_json_obj(NULL, NULL);
        cJSON_AddItemToArray(arr, o);
        bu_json_num(o, "block_bytes", (double)bs);
        bu_json_num(o, "save_gbs", sg);
        bu_json_num(o, "save_baseline_gbs", sbm);
        bu_json_nums(o, "save_ratio", srs, 3);
        bu_json_num(o, "load_gbs", lg);
        bu_json_num(o, "load_baseline_gbs", lbm);
        bu_json_nums(o, "load_ratio", lrs, 3);
        pf_client_unregister(e->c, src_id, TMO);
        pf_client_unregister(e->c, dst_id, TMO);
    }
    free(targets);
    free(v);
    munmap(hostbuf, total);
    pf_simkv_destroy(src);
    pf_simkv_destroy(dst);
    printf("method: %d runs per size, ABBA (odd runs baseline first); save timed until the last "
           "block is queryable, default flags (integrity on); load until its state is done; "
           "baseline = fastest of memcpy in block calls (GLIBC_TUNABLES non-temporal threshold "
           "%s), AVX2 streaming copy in block calls, a four-stream streaming copy in block calls "
           "(4 KiB strides side by side, AVX-512 where present), one %llu MiB memcpy, and the "
           "three block-call copies on two threads (the sim GPU's two lanes), simkv shm <-> "
           "THP-advised anonymous memory; every repeat memcmp's all bytes; ratios min/median/max "
           "of per-run ratios\n",
           runs, e->tunables, (unsigned long long)(total >> 20));
}

static double evictions(const struct pft_proc *s)
{
    return bu_metric(s, "pegaflow_cache_block_evictions_total");
}

/* 4: server memory per resident block at nblk_meta blocks of 512 B (one slot) and, unless
 * --query-only, of 32 per-layer slots of 16 B. The one-slot blocks stay for phase 3. */
static void phase_metadata(struct eng *e)
{
    const uint64_t mbs = 512, n = e->nblk_meta;
    struct pf_client *c = e->c;
    if (pf_simkv_create(16384 * mbs, 0, &e->small))
        bu_die("engine", "simkv small");
    pft_fill(pf_simkv_ptr(e->small), 16384 * mbs, 3, 3);
    if (reg(c, "meta", e->small, 16384, mbs))
        bu_die("engine", "register meta");
    /* warm-up: saves of the measured request size (blocks that stay resident, other hashes),
     * eight, so that the RPC threads' request buffers and heap arenas, which do not grow with
     * the blocks, exist before the first RSS reading */
    bu_save_range(c, "meta", 6, 0, 8 * 16384, 16384, 16384, TMO, NULL);
    bu_wait_resident(c, "meta", 6, 0, 8 * 16384, TMO);
    long rss0 = bu_rss_kb(e->s.pid);
    double tsave = bu_save_range(c, "meta", 7, 0, n, 16384, 16384, TMO, NULL);
    bu_wait_resident(c, "meta", 7, 0, n, TMO);
    long rss1 = bu_rss_kb(e->s.pid);
    double per_block = (double)(rss1 - rss0) * 1024.0 / (double)n;
    printf("\n%llu resident blocks of %llu B: %.0f bytes of server memory per block "
           "(RSS delta), saved at %.0f blocks/s\n",
           (unsigned long long)n, (unsigned long long)mbs, per_block, (double)n / tsave);
    bu_json_num(e->root, "resident_blocks", (double)n);
    bu_json_num(e->root, "bytes_per_block", per_block);
    if (e->query_only)
        return;
    /* the same count of blocks with 32 per-layer slots each (16 B per layer, so the pool
     * holds both sets: no eviction may free metadata between the two RSS readings) */
    const uint64_t lbs = 16;
    if (pf_simkv_create(16384 * lbs * NL32, 0, &e->k32))
        bu_die("engine", "simkv 32 layers");
    pft_fill(pf_simkv_ptr(e->k32), 16384 * lbs * NL32, 4, 4);
    if (reg32(c, "meta32", e->k32, 16384, lbs))
        bu_die("engine", "register 32 layers");
    double ev0 = evictions(&e->s);
    long rss2 = bu_rss_kb(e->s.pid);
    double tsave32 = save_range32(c, "meta32", 8, n, 4096, 16384);
    bu_wait_resident(c, "meta32", 8, 0, n, TMO);
    long rss3 = bu_rss_kb(e->s.pid);
    double ev1 = evictions(&e->s);
    if (ev0 < 0 || ev1 != ev0)
        bu_die("engine", "evictions during the metadata measurement (the pool is too small)");
    double per_block32 = (double)(rss3 - rss2) * 1024.0 / (double)n;
    printf("%llu resident blocks of %d layers x %llu B: %.0f bytes of server memory per block "
           "(%.0f per layer slot), saved at %.0f blocks/s\n",
           (unsigned long long)n, NL32, (unsigned long long)lbs, per_block32, per_block32 / NL32,
           (double)n / tsave32);
    printf("method: server RSS delta over saving the blocks (new hashes, no eviction between "
           "the readings; 8 warm-up saves of the same request size before the first reading, "
           "their blocks resident) / blocks; one slot = one cross-layer tensor, 32 slots = one "
           "tensor per layer\n");
    bu_json_num(e->root, "bytes_per_block_32_layers", per_block32);
}

/* 3: Health and QueryPrefetch of 1 and 4096 hashes over the phase-4 blocks, each query
 * interleaved with a Health RPC carrying the very same request bytes. */
static void phase_query(struct eng *e)
{
    struct pf_client *c = e->c;
    int iters = e->quick ? 300 : 2000;
    double *lat = malloc((size_t)iters * sizeof(double));
    for (int i = 0; i < 50; i++)
        pf_client_health(c, TMO);
    for (int i = 0; i < iters; i++) {
        double t1 = bu_now();
        if (pf_client_health(c, TMO))
            bu_die("engine", "health");
        lat[i] = bu_now() - t1;
    }
    double h50 = bu_median(lat, iters), h99 = bu_pct(lat, (size_t)iters, 0.99);
    printf("\n%-26s %10s %10s %10s %12s %10s\n", "RPC", "p50 us", "p99 us", "p50/Health",
           "same-bytes", "ratio");
    printf("%-26s %10.1f %10.1f %10.2f\n", "Health (empty)", h50 * 1e6, h99 * 1e6, 1.0);
    bu_json_num(e->root, "health_p50_us", h50 * 1e6);
    bu_json_num(e->root, "health_p99_us", h99 * 1e6);
    cJSON *arr = bu_json_check(cJSON_AddArrayToObject(e->root, "query"));
    const uint64_t qn[2] = {1, 4096};
    double *blat = malloc((size_t)iters * sizeof(double));
    struct pf_rpc_channel *rch;
    if (pf_rpc_channel_open(e->s.addr, &rch))
        bu_die("engine", "channel");
    for (int qi = 0; qi < 2; qi++) {
        for (int i = 0; i < iters; i++) {
            uint64_t first = ((uint64_t)i * 7919) % (e->nblk_meta - qn[qi]);
            if (bu_query_n(c, "meta", 7, first, qn[qi], NULL, &lat[i], TMO) != qn[qi])
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
            server_times(&e->s);
        double q50 = bu_median(lat, iters), q99 = bu_pct(lat, (size_t)iters, 0.99);
        double b50 = bu_median(blat, iters);
        char label[64];
        snprintf(label, sizeof(label), "QueryPrefetch %llu hash%s", (unsigned long long)qn[qi],
                 qn[qi] > 1 ? "es" : "");
        printf("%-26s %10.1f %10.1f %10.2f %12.1f %10.2f\n", label, q50 * 1e6, q99 * 1e6, q50 / h50,
               b50 * 1e6, q50 / b50);
        cJSON *o = bu_json_obj(NULL, NULL);
        cJSON_AddItemToArray(arr, o);
        bu_json_num(o, "hashes", (double)qn[qi]);
        bu_json_num(o, "p50_us", q50 * 1e6);
        bu_json_num(o, "p99_us", q99 * 1e6);
        bu_json_num(o, "p50_vs_health", q50 / h50);
        bu_json_num(o, "same_bytes_p50_us", b50 * 1e6);
        bu_json_num(o, "p50_vs_same_bytes", q50 / b50);
    }
    printf("method: p50/p99 over %d calls; each QueryPrefetch interleaved with a Health RPC "
           "carrying the same request bytes (same-bytes p50); targets: 4096 hashes <= 1.5x "
           "same-bytes\n",
           iters);
    pf_rpc_channel_close(rch);
    free(blat);
    free(lat);
}

#define USAGE "engine [--quick] [--runs N] [--query-only | --meta] [--json FILE]"

int main(int argc, char **argv)
{
    struct eng e = {0};
    const struct bu_opt opts[] = {{"--json", BU_STR, &e.json},
                                  {"--quick", BU_FLAG, &e.quick},
                                  {"--query-only", BU_FLAG, &e.query_only},
                                  {"--meta", BU_FLAG, &e.meta_only},
                                  {"--runs", BU_INT, &e.runs},
                                  {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, USAGE);
    if (e.runs < 1)
        e.runs = 3; /* also --quick: one run per size is too noisy on a shared VM */
    bool throughput = !e.query_only && !e.meta_only;
    tunables_for_the_baseline(&e, argv);
    e.total = e.quick ? (128ull << 20) : (1ull << 30);
    e.nblk_meta = e.quick ? 100000 : 1000000;
    e.root = bu_json_obj(NULL, NULL);
    if (throughput)
        phase_machine(&e);
    start_server(&e);
    if (throughput)
        phase_throughput(&e);
    phase_metadata(&e);
    phase_query(&e);
    if (e.json)
        bu_json_write(e.root, e.json);
    else
        cJSON_Delete(e.root);
    pf_client_close(e.c);
    pf_simkv_destroy(e.small);
    pf_simkv_destroy(e.k32);
    pft_stop(&e.s, SIGTERM, 60000);
    return 0;
}

/* Helpers shared by the benchmarks (header-only: every bench/<name>.c is its own program).
 * Timing, medians / percentiles / spreads of per-run figures (an even count has the mean of
 * the two middle values as its median), process RSS and free memory, option parsing from a
 * table, the measured server's environment, JSON results through libcjson, /metrics
 * reading, raw O_DIRECT io_uring transfers, registering one contiguous sim-GPU layer and
 * saving / querying / waiting for ranges of seeded hashes on it. No bench keeps its own copy
 * of these. Every helper
 * exits the program with a message on failure (a benchmark has no recovery path). */
#ifndef PF_BENCHUTIL_H
#define PF_BENCHUTIL_H

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "pf/config.h"
#include "pftest.h"

static inline double bu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline int bu_cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* min / median / max of v[0..n) (v is not reordered). */
static inline void bu_spread(const double *v, int n, double out[3])
{
    double *c = malloc((size_t)n * sizeof(*c));
    memcpy(c, v, (size_t)n * sizeof(*c));
    qsort(c, (size_t)n, sizeof(*c), bu_cmpd);
    out[0] = c[0];
    out[1] = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    out[2] = c[n - 1];
    free(c);
}

/* The median of v[0..n) (n >= 1; v is not reordered): the middle value, or the mean of the
 * two middle values for an even n. */
static inline double bu_median(const double *v, int n)
{
    double s[3];
    bu_spread(v, n, s);
    return s[1];
}

/* The q-quantile (0..1) of v[0..n) by nearest rank (v is not reordered). */
static inline double bu_pct(const double *v, size_t n, double q)
{
    double *c = malloc(n * sizeof(*c));
    memcpy(c, v, n * sizeof(*c));
    qsort(c, n, sizeof(*c), bu_cmpd);
    double r = c[(size_t)(q * (double)(n - 1) + 0.5)];
    free(c);
    return r;
}

/* VmRSS of pid in KiB, -1 when unreadable. */
static inline long bu_rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long v = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* MemAvailable of this machine in bytes (/proc/meminfo), -1 when unreadable. */
static inline double bu_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb < 0 ? -1 : (double)kb * 1024.0;
}

/* ---- options: one table per bench ---- */

enum bu_opt_kind {
    BU_FLAG,   /* bool, no value */
    BU_INT,    /* int */
    BU_LONG,   /* long */
    BU_U32,    /* uint32_t */
    BU_DOUBLE, /* double */
    BU_SIZE,   /* uint64_t, pf_parse_size syntax (4k, 1m, 2g) */
    BU_STR,    /* const char * (points into argv) */
    BU_STRS,   /* struct bu_strs: the option may repeat, each value appended */
};

#define BU_STRS_MAX 8
struct bu_strs {
    const char *v[BU_STRS_MAX];
    int n;
};

struct bu_opt {
    const char *name; /* "--json"; NULL ends the table */
    enum bu_opt_kind kind;
    void *dst;
};

/* Parses argv[1..argc) against opts (a NULL name ends the table). An unknown option, a
 * missing value or a value that is not a number of the option's kind prints "usage: USAGE"
 * with the offending argument and exits 2. Range checks stay with the bench. */
static inline void bu_parse_opts(int argc, char **argv, const struct bu_opt *opts,
                                 const char *usage)
{
    for (int i = 1; i < argc; i++) {
        const struct bu_opt *o = opts;
        while (o->name && strcmp(o->name, argv[i]) != 0)
            o++;
        if (!o->name) {
            fprintf(stderr, "unknown option %s\nusage: %s\n", argv[i], usage);
            exit(2);
        }
        if (o->kind == BU_FLAG) {
            *(bool *)o->dst = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s needs a value\nusage: %s\n", o->name, usage);
            exit(2);
        }
        const char *v = argv[++i];
        char *end = NULL;
        errno = 0;
        switch (o->kind) {
        case BU_INT:
            *(int *)o->dst = (int)strtol(v, &end, 10);
            break;
        case BU_LONG:
            *(long *)o->dst = strtol(v, &end, 10);
            break;
        case BU_U32:
            *(uint32_t *)o->dst = (uint32_t)strtoul(v, &end, 10);
            break;
        case BU_DOUBLE:
            *(double *)o->dst = strtod(v, &end);
            break;
        case BU_SIZE:
            end = pf_parse_size(v, (uint64_t *)o->dst) == 0 ? (char *)"" : (char *)v;
            break;
        case BU_STRS: {
            struct bu_strs *l = o->dst;
            if (l->n == BU_STRS_MAX) {
                fprintf(stderr, "%s: at most %d\nusage: %s\n", o->name, BU_STRS_MAX, usage);
                exit(2);
            }
            l->v[l->n++] = v;
            end = (char *)"";
            break;
        }
        default:
            *(const char **)o->dst = v;
            end = (char *)"";
            break;
        }
        if (errno || !end || *end || end == v) {
            fprintf(stderr, "%s: bad value '%s'\nusage: %s\n", o->name, v, usage);
            exit(2);
        }
    }
}

/* Exits when the environment of process pid holds name= (the measured server must run as a
 * user starts it: nothing the bench set for its own baselines may leak into it). */
static inline void bu_check_env_clean(pid_t pid, const char *name)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench: cannot read %s: %s\n", path, strerror(errno));
        pft_fail_cleanup();
        exit(1);
    }
    char buf[4096];
    size_t nl = strlen(name), len = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (c != 0 && len + 1 < sizeof(buf)) {
            buf[len++] = (char)c;
            continue;
        }
        buf[len] = 0;
        if (len > nl && strncmp(buf, name, nl) == 0 && buf[nl] == '=') {
            fprintf(stderr, "bench: the measured server (pid %d) inherited %s\n", (int)pid, buf);
            fclose(f);
            pft_fail_cleanup();
            exit(1);
        }
        len = 0;
    }
    fclose(f);
}

/* ---- JSON results (libcjson): build a tree, write it once ---- */

static inline cJSON *bu_json_check(cJSON *j)
{
    if (!j) {
        fprintf(stderr, "bench: out of memory building the JSON result\n");
        exit(1);
    }
    return j;
}

/* A new object named k inside o (o NULL: a new root). */
static inline cJSON *bu_json_obj(cJSON *o, const char *k)
{
    cJSON *c = bu_json_check(cJSON_CreateObject());
    if (o)
        cJSON_AddItemToObject(o, k, c);
    return c;
}

static inline void bu_json_num(cJSON *o, const char *k, double v)
{
    bu_json_check(cJSON_AddNumberToObject(o, k, v));
}

static inline void bu_json_str(cJSON *o, const char *k, const char *v)
{
    bu_json_check(cJSON_AddStringToObject(o, k, v));
}

static inline void bu_json_bool(cJSON *o, const char *k, int v)
{
    bu_json_check(cJSON_AddBoolToObject(o, k, v));
}

/* k: [v[0], ..., v[n-1]] */
static inline void bu_json_nums(cJSON *o, const char *k, const double *v, int n)
{
    cJSON_AddItemToObject(o, k, bu_json_check(cJSON_CreateDoubleArray(v, n)));
}

/* Writes root (one line) to path, or to stdout when path is NULL or "-"; frees root.
 * Exits when the file cannot be written. */
static inline void bu_json_write(cJSON *root, const char *path)
{
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!txt) {
        fprintf(stderr, "bench: out of memory printing the JSON result\n");
        exit(1);
    }
    FILE *f = path && strcmp(path, "-") != 0 ? fopen(path, "w") : stdout;
    if (!f || fprintf(f, "%s\n", txt) < 0 || (f != stdout && fclose(f) != 0)) {
        fprintf(stderr, "bench: cannot write %s: %s\n", path ? path : "stdout", strerror(errno));
        exit(1);
    }
    cJSON_free(txt);
}

static inline void bu_die(const char *bench, const char *what)
{
    fprintf(stderr, "bench/%s: %s: %s (%d)\n", bench, what, pf_last_error_message(),
            pf_last_error_code());
    pft_fail_cleanup();
    exit(1);
}

/* GET /metrics (malloc'ed body; exits on failure). */
static inline char *bu_metrics(const struct pft_proc *s)
{
    char *body = NULL;
    int st = -1;
    for (int i = 0; i < 50 && st != 200; i++) { /* a busy server may refuse a connection */
        free(body);
        body = NULL;
        st = pft_http(s->http_host, s->http_port, "GET", "/metrics", &body);
        if (st != 200)
            usleep(10000);
    }
    if (st != 200 || !body) {
        fprintf(stderr, "bench: GET /metrics failed (status %d): %s\n", st, strerror(errno));
        pft_fail_cleanup();
        exit(1);
    }
    return body;
}

/* The value of one series (name with labels as exposed) in a /metrics body; -1 if absent. */
__attribute__((noinline)) static double bu_metric_in(const char *body, const char *name)
{
    char key[256];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(body, key);
    if (!p)
        return -1;
    size_t off = (size_t)(p - body) + strlen(key);
    return strtod(body + off, NULL);
}

static inline double bu_metric(const struct pft_proc *s, const char *name)
{
    char *body = bu_metrics(s);
    double v = bu_metric_in(body, name);
    free(body);
    return v;
}

/* Registers one contiguous layer "ALL_LAYERS" of nb blocks of bs bytes over kv. */
static inline int bu_register(struct pf_client *c, const char *inst, const char *ns,
                              struct pf_simkv *kv, uint64_t nb, uint64_t bs, uint64_t tmo)
{
    uint8_t ipc[512];
    size_t ipclen;
    if (pf_simkv_ipc(kv, 0, nb * bs, ipc, sizeof(ipc), &ipclen))
        return -EINVAL;
    struct pf_layer_desc d = {.name = "ALL_LAYERS",
                              .ipc = ipc,
                              .ipc_len = ipclen,
                              .num_blocks = nb,
                              .bytes_per_block = bs,
                              .segments = 1};
    struct pf_register_args a = {.instance_id = inst,
                                 .namespace_ = ns,
                                 .tp_size = 1,
                                 .world_size = 1,
                                 .device_id = 0,
                                 .layers = &d,
                                 .nlayers = 1};
    return pf_client_register(c, &a, tmo);
}

/* Raw O_DIRECT transfer of len bytes of path at offset 0 in bs-sized io_uring requests, qd in
 * flight, from/into buf (len bytes, page aligned). Returns bytes/s; exits on any error or
 * short transfer. */
static inline double bu_raw_uring(const char *path, int write, uint8_t *buf, uint64_t len,
                                  uint64_t bs, unsigned qd)
{
    int fd = open(path, (write ? O_RDWR | O_CREAT : O_RDONLY) | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "bench: open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    if (write && fallocate(fd, 0, 0, (off_t)len) != 0 && ftruncate(fd, (off_t)len) != 0) {
        fprintf(stderr, "bench: size %s: %s\n", path, strerror(errno));
        exit(1);
    }
    struct io_uring ring;
    int rc = io_uring_queue_init(qd, &ring, 0);
    if (rc < 0) {
        fprintf(stderr, "bench: io_uring_queue_init: %s\n", strerror(-rc));
        exit(1);
    }
    uint64_t n = len / bs, sub = 0, done = 0;
    unsigned inflight = 0;
    double t0 = bu_now();
    while (done < n) {
        while (inflight < qd && sub < n) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (write)
                io_uring_prep_write(sqe, fd, buf + sub * bs, (unsigned)bs, sub * bs);
            else
                io_uring_prep_read(sqe, fd, buf + sub * bs, (unsigned)bs, sub * bs);
            sub++;
            inflight++;
        }
        rc = io_uring_submit_and_wait(&ring, 1);
        if (rc < 0 && rc != -EINTR) {
            fprintf(stderr, "bench: io_uring_submit_and_wait: %s\n", strerror(-rc));
            exit(1);
        }
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            if (cqe->res != (int)bs) {
                fprintf(stderr, "bench: raw I/O on %s: %s\n", path,
                        cqe->res < 0 ? strerror(-cqe->res) : "short transfer");
                exit(1);
            }
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            done++;
        }
    }
    double t = bu_now() - t0;
    io_uring_queue_exit(&ring);
    close(fd);
    return (double)(n * bs) / t;
}

/* ---- ranges of seeded hashes on one registered layer "ALL_LAYERS" ---- */

/* The 32-byte hash of block i of series tag. */
static inline void bu_hash_of(uint64_t tag, uint64_t i, uint8_t *h)
{
    pft_fill(h, 32, tag, i);
}

/* Saves the blocks of hashes [first, first+n) of series tag in Save calls of `batch`, block
 * ids (first + i) % id_mod; returns the seconds spent inside the calls, and the seconds of
 * each call in per_call[0..ceil(n/batch)) when per_call is not NULL. Exits on a failure. */
static inline double bu_save_range(struct pf_client *c, const char *inst, uint64_t tag,
                                   uint64_t first, uint64_t n, uint64_t batch, uint64_t id_mod,
                                   uint64_t tmo, double *per_call)
{
    uint32_t *ids = malloc(batch * sizeof(*ids));
    uint8_t *hs = malloc(batch * 32);
    double t = 0;
    for (uint64_t b = 0; b < n; b += batch) {
        uint64_t k = n - b < batch ? n - b : batch;
        for (uint64_t i = 0; i < k; i++) {
            ids[i] = (uint32_t)((first + b + i) % id_mod);
            bu_hash_of(tag, first + b + i, hs + i * 32);
        }
        struct pf_save_layer sl = {
            .name = "ALL_LAYERS", .block_ids = ids, .hashes = hs, .hash_len = 32, .n = k};
        double t0 = bu_now();
        if (pf_client_save(c, inst, 0, 0, 0, &sl, 1, tmo))
            bu_die("bench", "save");
        double d = bu_now() - t0;
        if (per_call)
            per_call[b / batch] = d;
        t += d;
    }
    free(ids);
    free(hs);
    return t;
}

/* QueryPrefetch of hashes [first, first+n) of series tag in namespace "bench": the hit
 * count; the call's seconds in *secs (if not NULL); the lease copied to lease (16 bytes,
 * if not NULL), else released. Exits on a failure. */
static inline uint32_t bu_query_n(struct pf_client *c, const char *inst, uint64_t tag,
                                  uint64_t first, uint64_t n, uint8_t *lease, double *secs,
                                  uint64_t tmo)
{
    uint8_t *hs = malloc(n * 32);
    for (uint64_t i = 0; i < n; i++)
        bu_hash_of(tag, first + i, hs + i * 32);
    struct pf_query_result r;
    double t0 = bu_now();
    if (pf_client_query(c, inst, "bench", hs, NULL, 32, n, 0, 0, &r, NULL, 0, tmo))
        bu_die("bench", "query");
    if (secs)
        *secs = bu_now() - t0;
    free(hs);
    if (lease && r.lease_len)
        memcpy(lease, r.lease, 16);
    else if (r.lease_len)
        pf_client_release(c, r.lease, 16, tmo);
    return r.num_hit_blocks;
}

/* Waits (60 s at most, else exits) until the last block of [first, first+n) is queryable:
 * the insert thread seals in order, so then all are. Polls every 100 us: the wait ends
 * within about a query's round trip of the seal, and the polling leaves the CPU to the
 * server's insert thread. */
static inline void bu_wait_resident(struct pf_client *c, const char *inst, uint64_t tag,
                                    uint64_t first, uint64_t n, uint64_t tmo)
{
    double dl = bu_now() + 60;
    while (bu_query_n(c, inst, tag, first + n - 1, 1, NULL, NULL, tmo) != 1) {
        if (bu_now() > dl)
            bu_die("bench", "blocks not sealed in 60 s");
        usleep(100);
    }
}

#endif

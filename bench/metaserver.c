/* bench/metaserver: MetaServer throughput and memory at 10^6 keys.
 *
 * Part 1 (RPC, the real binary): spawns pegaflow-metaserver on port 0, simulates N nodes
 * (one thread and one channel each) that heartbeat and register their blocks with
 * InsertBlockHashes in chunks of 16384 (the client's chunk size), then runs concurrent
 * QueryPrefixBlocks calls over prefixes of L blocks for a fixed time, next to the same
 * number of one-hash queries on an unknown namespace (an empty round trip: the RPC floor of
 * this machine), reads the server's RSS before and after registration (memory per key), and
 * times UnregisterNode of one node (a full scan of the store).
 * Part 2 (in-process store, no RPC): the same registration, query and unregister work
 * directly on pf_meta_store, i.e. the store's own ceiling.
 *
 * With --store redis the same two parts run a second time against the Redis store
 * (pegaflow-metaserver --store redis://...; the in-process part on pf_meta_store over Redis)
 * on a redis-server the benchmark starts on a free loopback port, and memory per key is the
 * redis-server's RSS delta (and Redis' own used_memory delta) over the registered keys.
 *
 * Keys are 32-byte hashes (vLLM's sha256 block hashes). Blocks come in runs of 256
 * consecutive hashes (one request's prefix); run r is owned by nodes r % N and
 * (r + 1) % N .. (owners per key = --owners). Prints a table and writes JSON (--json). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine.pb-c.h"
#include "pf/clock.h"
#include "pf/meta.h"
#include "pf/rpc.h"
#include "pf/util.h"
#include "benchutil.h"
#include "pfredis.h"

extern char **environ;

#define RUN   256u
#define CHUNK 16384u
#define HLEN  32u

static long nkeys = 1000000, nnodes = 8, nowners = 2, qlen = 64;
static double qsecs = 3.0;
static const char *ms_path, *json_path;
static const char *store_url; /* NULL: memory store; else the Redis store on bredis */
static struct pft_redis bredis;

static uint8_t *keybytes; /* nkeys x HLEN, generated once before timing */

static void key_of(long k, uint8_t out[HLEN])
{
    for (unsigned i = 0; i < HLEN / 8; i++) {
        uint64_t v = XXH3_64bits_withSeed(&k, sizeof(k), i + 1);
        memcpy(out + 8 * i, &v, 8);
    }
}

static const uint8_t *key_at(long k)
{
    return keybytes + (size_t)k * HLEN;
}

static bool owns(long node, long key)
{
    long run = key / RUN;
    for (long o = 0; o < nowners; o++)
        if ((run + o) % nnodes == node)
            return true;
    return false;
}

/* The keys node owns, in order (ProtobufCBinaryData and pf_meta_hash share a layout). */
static ProtobufCBinaryData *owned_keys(long node, size_t *n_p)
{
    size_t n = 0;
    for (long key = 0; key < nkeys; key++)
        n += owns(node, key);
    ProtobufCBinaryData *h = malloc((n ? n : 1) * sizeof(*h));
    size_t j = 0;
    for (long key = 0; key < nkeys; key++)
        if (owns(node, key))
            h[j++] = (ProtobufCBinaryData){HLEN, (uint8_t *)key_at(key)};
    *n_p = n;
    return h;
}

static void node_name(long i, char *buf, size_t n)
{
    snprintf(buf, n, "10.0.0.%ld:50055", i + 1);
}

static void node_uuid(long i, char out[PF_UUID_STR_LEN])
{
    uint8_t u[16] = {0};
    u[0] = (uint8_t)(i + 1);
    u[6] = 0x40;
    u[8] = 0x80;
    pf_uuid_format(u, out);
}

static double secs_since(uint64_t t0)
{
    return (double)(pf_now_ns() - t0) / 1e9;
}

/* ------------------------------------------------------------------ RPC part */

struct rpc_node {
    long id;
    char target[64];
    struct pf_rpc_channel *ch;
    long registered;
    int err;
    bool warm; /* one chunk in the warm-up namespace, not counted */
    pthread_barrier_t *start;
};

static void *rpc_register(void *arg)
{
    struct rpc_node *n = arg;
    char name[64], uuid[PF_UUID_STR_LEN];
    node_name(n->id, name, sizeof(name));
    node_uuid(n->id, uuid);
    size_t total;
    ProtobufCBinaryData *h = owned_keys(n->id, &total);
    pthread_barrier_wait(n->start);
    for (size_t off = 0; off < total; off += CHUNK) {
        size_t k = total - off < CHUNK ? total - off : CHUNK;
        Pegaflow__InsertBlockHashesRequest req = PEGAFLOW__INSERT_BLOCK_HASHES_REQUEST__INIT;
        req.namespace_ = n->warm ? "bench-warmup" : "bench";
        req.node = name;
        req.node_id = uuid;
        req.n_block_hashes = k;
        req.block_hashes = h + off;
        ProtobufCMessage *resp = NULL;
        struct pf_rpc_status st;
        int rc =
            pf_rpc_unary(n->ch, "/pegaflow.MetaServer/InsertBlockHashes", &req.base,
                         &pegaflow__insert_block_hashes_response__descriptor, 60000, &resp, &st);
        if (rc) {
            fprintf(stderr, "insert: %s: %s\n", pf_grpc_code_name(st.code), st.msg);
            n->err = rc;
            break;
        }
        protobuf_c_message_free_unpacked(resp, NULL);
        if (n->warm)
            break;
        n->registered += (long)k;
    }
    free(h);
    return NULL;
}

struct q_thread {
    struct pf_rpc_channel *ch;
    bool ping;
    uint64_t deadline;
    unsigned seed;
    long queries, hashes, bad;
};

static void *rpc_query(void *arg)
{
    struct q_thread *q = arg;
    ProtobufCBinaryData *h = malloc((size_t)qlen * sizeof(*h));
    while (pf_now_ns() < q->deadline) {
        long runs = nkeys / RUN;
        long run = (long)(rand_r(&q->seed) % (unsigned)(runs ? runs : 1));
        long start = run * RUN + (long)(rand_r(&q->seed) % (RUN - (unsigned)qlen + 1));
        long n = q->ping ? 1 : qlen;
        for (long i = 0; i < n; i++) {
            h[i].data = (uint8_t *)key_at(start + i);
            h[i].len = HLEN;
        }
        Pegaflow__QueryPrefixBlocksRequest req = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
        req.namespace_ = q->ping ? "none" : "bench";
        req.n_block_hashes = (size_t)n;
        req.block_hashes = h;
        ProtobufCMessage *m = NULL;
        struct pf_rpc_status st;
        int rc = pf_rpc_unary(q->ch, "/pegaflow.MetaServer/QueryPrefixBlocks", &req.base,
                              &pegaflow__query_prefix_blocks_response__descriptor, 10000, &m, &st);
        if (rc) {
            q->bad++;
            continue;
        }
        Pegaflow__QueryPrefixBlocksResponse *r = (void *)m;
        if (!q->ping &&
            (r->n_nodes != (size_t)nowners || r->nodes[0]->prefix_len != (uint64_t)qlen))
            q->bad++;
        protobuf_c_message_free_unpacked(m, NULL);
        q->queries++;
        q->hashes += n;
    }
    free(h);
    return NULL;
}

static int run_queries(struct pf_rpc_channel **chs, bool ping, double secs, double *qps,
                       double *hps, long *bad)
{
    struct q_thread *q = calloc((size_t)nnodes, sizeof(*q));
    pthread_t *th = calloc((size_t)nnodes, sizeof(*th));
    uint64_t t0 = pf_now_ns(), dl = t0 + (uint64_t)(secs * 1e9);
    for (long i = 0; i < nnodes; i++) {
        q[i] = (struct q_thread){.ch = chs[i], .ping = ping, .deadline = dl, .seed = (unsigned)i};
        pthread_create(&th[i], NULL, rpc_query, &q[i]);
    }
    long nq = 0, nh = 0;
    *bad = 0;
    for (long i = 0; i < nnodes; i++) {
        pthread_join(th[i], NULL);
        nq += q[i].queries;
        nh += q[i].hashes;
        *bad += q[i].bad;
    }
    double s = secs_since(t0);
    *qps = (double)nq / s;
    *hps = (double)nh / s;
    free(q);
    free(th);
    return 0;
}

struct results {
    double rpc_insert_s, rpc_insert_per_s, rpc_q_per_s, rpc_qh_per_s, rpc_ping_per_s;
    double rpc_unregister_ms, rss_bytes_per_key;
    long rss0_kb, rss1_kb, removed_owners, q_bad;
    double redis_rss_bytes_per_key; /* Redis store: redis-server RSS delta / keys */
    double st_insert_s, st_insert_per_s, st_q_per_s, st_unregister_ms, st_bytes_per_key;
    double q_vs_empty[3];  /* min/median/max of the per-slice query/empty-RTT rate ratios */
    double st_q_spread[3]; /* in-process queries/s: min/median/max over the slices */
};

#define QSLICES 4 /* query measurements alternate with their baseline: ABBA slices */

static int spawn_metaserver(pid_t *pid_p, int *port_p, char *logpath)
{
    snprintf(logpath, 128, "/tmp/pf-bench-metaserver.%d.log", (int)getpid());
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    char *argv[] = {(char *)ms_path,
                    "--addr",
                    "127.0.0.1:0",
                    "--http-addr",
                    "127.0.0.1:0",
                    "--rpc-threads",
                    "8",
                    store_url ? "--store" : NULL,
                    (char *)store_url,
                    NULL};
    int rc = posix_spawn(pid_p, ms_path, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) {
        fprintf(stderr, "cannot start %s: %s\n", ms_path, strerror(rc));
        return -rc;
    }
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(logpath, "r");
        char line[512];
        while (f && fgets(line, sizeof(line), f)) {
            char *p = strstr(line, "gRPC listening on");
            if (p && (p = strstr(p, "(port ")) && sscanf(p, "(port %d)", port_p) == 1) {
                fclose(f);
                return 0;
            }
        }
        if (f)
            fclose(f);
        pf_sleep_ms(50);
    }
    fprintf(stderr, "metaserver did not report its port (log %s)\n", logpath);
    kill(*pid_p, SIGKILL);
    return -ETIMEDOUT;
}

static int rpc_part(struct results *r)
{
    pid_t pid;
    int port;
    char logpath[128];
    int rc = spawn_metaserver(&pid, &port, logpath);
    if (rc)
        return rc;
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    struct rpc_node *nodes = calloc((size_t)nnodes, sizeof(*nodes));
    struct pf_rpc_channel **chs = calloc((size_t)nnodes, sizeof(*chs));
    for (long i = 0; i < nnodes; i++) {
        nodes[i].id = i;
        pf_rpc_channel_open(target, &nodes[i].ch);
        chs[i] = nodes[i].ch;
        char name[64], uuid[PF_UUID_STR_LEN];
        node_name(i, name, sizeof(name));
        node_uuid(i, uuid);
        Pegaflow__HeartbeatNodeRequest hb = PEGAFLOW__HEARTBEAT_NODE_REQUEST__INIT;
        hb.node = name;
        hb.node_id = uuid;
        ProtobufCMessage *m = NULL;
        struct pf_rpc_status st;
        if (pf_rpc_unary(nodes[i].ch, "/pegaflow.MetaServer/HeartbeatNode", &hb.base,
                         &pegaflow__heartbeat_node_response__descriptor, 10000, &m, &st)) {
            fprintf(stderr, "heartbeat: %s\n", st.msg);
            rc = -EIO;
            goto out;
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    /* warm-up: one full-size insert per node, all at once, into another namespace, so that
     * the server's per-connection and gRPC buffers exist before the first RSS reading (they
     * do not grow with the keys; counting them put ~18 B/key of fixed cost into the figure) */
    {
        pthread_t *wt = calloc((size_t)nnodes, sizeof(*wt));
        pthread_barrier_t wb;
        pthread_barrier_init(&wb, NULL, (unsigned)nnodes + 1);
        for (long i = 0; i < nnodes; i++) {
            nodes[i].start = &wb;
            nodes[i].warm = true;
            pthread_create(&wt[i], NULL, rpc_register, &nodes[i]);
        }
        pthread_barrier_wait(&wb);
        for (long i = 0; i < nnodes; i++) {
            pthread_join(wt[i], NULL);
            nodes[i].warm = false;
            if (nodes[i].err)
                rc = nodes[i].err;
        }
        free(wt);
        pthread_barrier_destroy(&wb);
        if (rc)
            goto out;
    }
    pf_sleep_ms(200);
    r->rss0_kb = bu_rss_kb(pid);
    long redis0 = store_url ? bu_rss_kb(bredis.pid) : 0;
    pthread_t *th = calloc((size_t)nnodes, sizeof(*th));
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nnodes + 1);
    for (long i = 0; i < nnodes; i++) {
        nodes[i].start = &start;
        pthread_create(&th[i], NULL, rpc_register, &nodes[i]);
    }
    pthread_barrier_wait(&start); /* every node has its keys ready */
    uint64_t t0 = pf_now_ns();
    long total = 0;
    for (long i = 0; i < nnodes; i++) {
        pthread_join(th[i], NULL);
        total += nodes[i].registered;
        if (nodes[i].err)
            rc = nodes[i].err;
    }
    free(th);
    pthread_barrier_destroy(&start);
    r->rpc_insert_s = secs_since(t0);
    r->rpc_insert_per_s = (double)total / r->rpc_insert_s;
    pf_sleep_ms(200);
    r->rss1_kb = bu_rss_kb(pid);
    r->rss_bytes_per_key = (double)(r->rss1_kb - r->rss0_kb) * 1024.0 / (double)nkeys;
    if (store_url)
        r->redis_rss_bytes_per_key =
            (double)(bu_rss_kb(bredis.pid) - redis0) * 1024.0 / (double)nkeys;
    if (rc)
        goto out;

    /* prefix queries and the empty round trip in alternating slices (ABBA): load drift on
     * this shared machine moves both alike */
    double qv[QSLICES], hv[QSLICES], pv[QSLICES], rv[QSLICES], dummy, sp[3];
    r->q_bad = 0;
    for (int k = 0; k < QSLICES; k++) {
        long bad = 0, bad2;
        bool ping_first = k % 2 == 1;
        if (ping_first)
            run_queries(chs, true, qsecs / QSLICES, &pv[k], &dummy, &bad2);
        run_queries(chs, false, qsecs / QSLICES, &qv[k], &hv[k], &bad);
        if (!ping_first)
            run_queries(chs, true, qsecs / QSLICES, &pv[k], &dummy, &bad2);
        r->q_bad += bad;
        rv[k] = pv[k] > 0 ? qv[k] / pv[k] : 0;
    }
    bu_spread(qv, QSLICES, sp);
    r->rpc_q_per_s = sp[1];
    bu_spread(hv, QSLICES, sp);
    r->rpc_qh_per_s = sp[1];
    bu_spread(pv, QSLICES, sp);
    r->rpc_ping_per_s = sp[1];
    bu_spread(rv, QSLICES, r->q_vs_empty);

    /* UnregisterNode of node 0: a full scan */
    char name[64], uuid[PF_UUID_STR_LEN];
    node_name(0, name, sizeof(name));
    node_uuid(0, uuid);
    Pegaflow__UnregisterNodeRequest ur = PEGAFLOW__UNREGISTER_NODE_REQUEST__INIT;
    ur.node = name;
    ur.node_id = uuid;
    ProtobufCMessage *m = NULL;
    struct pf_rpc_status st;
    t0 = pf_now_ns();
    if (pf_rpc_unary(nodes[0].ch, "/pegaflow.MetaServer/UnregisterNode", &ur.base,
                     &pegaflow__unregister_node_response__descriptor, 60000, &m, &st) == 0) {
        r->rpc_unregister_ms = secs_since(t0) * 1e3;
        r->removed_owners = (long)((Pegaflow__UnregisterNodeResponse *)m)->removed_owners;
        protobuf_c_message_free_unpacked(m, NULL);
    } else {
        fprintf(stderr, "unregister: %s\n", st.msg);
        rc = -EIO;
    }
out:
    for (long i = 0; i < nnodes; i++)
        pf_rpc_channel_close(nodes[i].ch);
    free(nodes);
    free(chs);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(logpath);
    return rc;
}

/* ------------------------------------------------------------------ store part */

struct st_thread {
    struct pf_meta_store *st;
    long id;
    uint64_t deadline;
    long n;   /* registrations / queries whose answer was checked and right */
    long bad; /* failed calls and wrong answers: never counted in n */
    pthread_barrier_t *start;
};

static void *st_register(void *arg)
{
    struct st_thread *t = arg;
    char name[64];
    uint8_t id[16] = {0};
    id[0] = (uint8_t)(t->id + 1);
    node_name(t->id, name, sizeof(name));
    size_t total;
    ProtobufCBinaryData *h = owned_keys(t->id, &total);
    pthread_barrier_wait(t->start);
    for (size_t off = 0; off < total; off += CHUNK) {
        size_t k = total - off < CHUNK ? total - off : CHUNK;
        if (pf_meta_store_insert(t->st, "bench", (const struct pf_meta_hash *)(h + off), k, name,
                                 id, NULL) != 0) {
            t->bad++;
            continue;
        }
        t->n += (long)k;
    }
    free(h);
    return NULL;
}

static void *st_query(void *arg)
{
    struct st_thread *t = arg;
    struct pf_meta_hash *h = malloc((size_t)qlen * sizeof(*h));
    unsigned seed = (unsigned)t->id;
    while (pf_now_ns() < t->deadline) {
        long runs = nkeys / RUN;
        long start = (long)(rand_r(&seed) % (unsigned)(runs ? runs : 1)) * RUN +
                     (long)(rand_r(&seed) % (RUN - (unsigned)qlen + 1));
        for (long i = 0; i < qlen; i++)
            h[i] = (struct pf_meta_hash){HLEN, key_at(start + i)};
        struct pf_meta_prefix *res;
        size_t nres;
        if (pf_meta_store_query_prefix(t->st, "bench", h, (size_t)qlen, &res, &nres) != 0) {
            t->bad++;
            continue;
        }
        /* every key of a run has the same nowners owners: each holds the whole prefix */
        bool ok = nres == (size_t)nowners;
        for (size_t i = 0; ok && i < nres; i++)
            ok = res[i].prefix_len == (uint64_t)qlen;
        free(res);
        if (ok)
            t->n++;
        else
            t->bad++;
    }
    free(h);
    return NULL;
}

static void store_part(struct results *r)
{
    struct pf_meta_store *st;
    struct pf_meta_store_config cfg = {.node_stale_secs = 30, .ttl_secs = 7200, .store = store_url};
    if (store_url)
        pft_redis_cmd(&bredis, "FLUSHALL");
    if (pf_meta_store_create(&cfg, &st)) {
        fprintf(stderr, "cannot create the store\n");
        return;
    }
    for (long i = 0; i < nnodes; i++) {
        char name[64];
        uint8_t id[16] = {0};
        id[0] = (uint8_t)(i + 1);
        node_name(i, name, sizeof(name));
        pf_meta_store_heartbeat(st, name, id);
    }
    struct pf_meta_store_stats ss0;
    pf_meta_store_get_stats(st, &ss0);
    uint64_t bytes0 = ss0.bytes;
    struct st_thread *t = calloc((size_t)nnodes, sizeof(*t));
    pthread_t *th = calloc((size_t)nnodes, sizeof(*th));
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nnodes + 1);
    for (long i = 0; i < nnodes; i++) {
        t[i] = (struct st_thread){.st = st, .id = i, .start = &start};
        pthread_create(&th[i], NULL, st_register, &t[i]);
    }
    pthread_barrier_wait(&start);
    uint64_t t0 = pf_now_ns();
    long total = 0;
    for (long i = 0; i < nnodes; i++) {
        pthread_join(th[i], NULL);
        total += t[i].n;
        r->q_bad += t[i].bad;
    }
    pthread_barrier_destroy(&start);
    if (total != nkeys * nowners) { /* each key registered by its nowners owners */
        fprintf(stderr, "store: %ld of %ld registrations succeeded\n", total, nkeys * nowners);
        r->q_bad += nkeys * nowners - total;
    }
    r->st_insert_s = secs_since(t0);
    r->st_insert_per_s = (double)total / r->st_insert_s;
    struct pf_meta_store_stats ss;
    pf_meta_store_get_stats(st, &ss);
    r->st_bytes_per_key = (double)(ss.bytes - bytes0) / (double)nkeys;
    double qv[QSLICES];
    for (int k = 0; k < QSLICES; k++) {
        t0 = pf_now_ns();
        uint64_t dl = t0 + (uint64_t)(qsecs / QSLICES * 1e9);
        long nq = 0;
        for (long i = 0; i < nnodes; i++) {
            t[i] = (struct st_thread){.st = st, .id = i + k * nnodes, .deadline = dl};
            pthread_create(&th[i], NULL, st_query, &t[i]);
        }
        for (long i = 0; i < nnodes; i++) {
            pthread_join(th[i], NULL);
            nq += t[i].n;
            r->q_bad += t[i].bad;
        }
        qv[k] = (double)nq / secs_since(t0);
    }
    bu_spread(qv, QSLICES, r->st_q_spread);
    r->st_q_per_s = r->st_q_spread[1];
    char name[64];
    uint8_t id[16] = {0};
    id[0] = 1;
    node_name(0, name, sizeof(name));
    uint64_t removed;
    t0 = pf_now_ns();
    pf_meta_store_unregister(st, name, id, &removed);
    r->st_unregister_ms = secs_since(t0) * 1e3;
    pf_meta_store_destroy(st);
    free(t);
    free(th);
}

/* The table of one run: the memory store, then the Redis store when rr is not NULL. */
static void print_results(const struct results *r, const struct results *rr)
{
    char unreg_label[64];
    snprintf(unreg_label, sizeof(unreg_label), "UnregisterNode at %ld keys (ms)", nkeys);
    double regs = (double)nkeys * (double)nowners;
    printf("\n%-44s %14s %14s\n", "", "gRPC", "store only");
    printf("%-44s %14.0f %14.0f\n", "InsertBlockHashes registrations/s", r->rpc_insert_per_s,
           r->st_insert_per_s);
    printf("%-44s %14.2f %14.2f\n", "  time to register all (s)", r->rpc_insert_s, r->st_insert_s);
    printf("%-44s %14.0f %14.0f\n", "QueryPrefixBlocks queries/s", r->rpc_q_per_s, r->st_q_per_s);
    printf("%-44s %14.0f %14.0f\n", "  hashes looked up/s", r->rpc_qh_per_s,
           r->st_q_per_s * (double)qlen);
    printf("%-44s %14.0f %14s\n", "  empty round trip (1-hash miss) queries/s", r->rpc_ping_per_s,
           "-");
    printf("%-44s %14.2f %14s\n", "  query cost vs empty round trip",
           r->rpc_ping_per_s / (r->rpc_q_per_s ? r->rpc_q_per_s : 1), "-");
    printf("%-44s %4.2f/%4.2f/%4.2f %14s\n", "  query/empty rate, min/median/max of slices",
           r->q_vs_empty[0], r->q_vs_empty[1], r->q_vs_empty[2], "-");
    printf("%-44s %14.1f %14.1f\n", unreg_label, r->rpc_unregister_ms, r->st_unregister_ms);
    printf("%-44s %14.1f %14s\n", "memory per key: server RSS delta / keys (B)",
           r->rss_bytes_per_key, "-");
    printf("%-44s %14s %14.1f\n", "memory per key: store tables+entries (B)", "-",
           r->st_bytes_per_key);
    printf("%-44s %14.1f %14s\n", "  per owner entry (bytes)",
           r->rss_bytes_per_key * (double)nkeys / regs, "-");
    printf("%-44s %14ld %14s\n", "  server RSS after registration (MiB)", r->rss1_kb / 1024, "-");
    printf("%-44s %14ld %14s\n", "UnregisterNode removed owner entries", r->removed_owners, "-");
    printf("%-44s %14ld %14s\n", "wrong query answers", r->q_bad, "-");
    printf("method: %ld keys of %u B, %ld owners each, %ld node threads; gRPC prefix queries of "
           "%ld hashes and the empty round trip (1-hash query on an unknown namespace) in %d "
           "alternating slices (ABBA) of %.2f s, medians and min/median/max of the per-slice "
           "ratios; every answer checked (owners, prefix length); memory = server RSS delta over "
           "registration (after one warm-up chunk per node in another namespace) / keys; "
           "in-process = pf_meta_store calls from the same threads, %d "
           "slices\n",
           nkeys, HLEN, nowners, nnodes, qlen, QSLICES, qsecs / QSLICES, QSLICES);
    if (rr) {
        printf("\nRedis store (one redis-server, same keys and nodes)\n");
        printf("%-44s %14s %14s\n", "", "gRPC", "store only");
        printf("%-44s %14.0f %14.0f\n", "InsertBlockHashes registrations/s", rr->rpc_insert_per_s,
               rr->st_insert_per_s);
        printf("%-44s %14.2f %14.2f\n", "  time to register all (s)", rr->rpc_insert_s,
               rr->st_insert_s);
        printf("%-44s %14.0f %14.0f\n", "QueryPrefixBlocks queries/s", rr->rpc_q_per_s,
               rr->st_q_per_s);
        printf("%-44s %14.2f %14s\n", "  vs memory store over gRPC",
               rr->rpc_q_per_s / (r->rpc_q_per_s ? r->rpc_q_per_s : 1), "-");
        printf("%-44s %14.1f %14.1f\n", unreg_label, rr->rpc_unregister_ms, rr->st_unregister_ms);
        printf("%-44s %14.1f %14s\n", "memory per key: redis-server RSS delta (B)",
               rr->redis_rss_bytes_per_key, "-");
        printf("%-44s %14s %14.1f\n", "memory per key: Redis used_memory delta (B)", "-",
               rr->st_bytes_per_key);
        printf("%-44s %14.1f %14s\n", "memory per key: MetaServer RSS delta (B)",
               rr->rss_bytes_per_key, "-");
        printf("%-44s %14ld %14s\n", "wrong query answers", rr->q_bad, "-");
    }
}

/* The JSON result of one run (rr: the Redis store's, or NULL), to --json and stdout. */
static void write_results(const struct results *r, const struct results *rr)
{
    cJSON *root = bu_json_obj(NULL, NULL);
    bu_json_str(root, "bench", "metaserver");
    bu_json_num(root, "keys", (double)nkeys);
    bu_json_num(root, "nodes", (double)nnodes);
    bu_json_num(root, "owners_per_key", (double)nowners);
    bu_json_num(root, "query_len", (double)qlen);
    bu_json_num(root, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON *rpc = bu_json_obj(root, "rpc");
    bu_json_num(rpc, "insert_registrations_per_s", r->rpc_insert_per_s);
    bu_json_num(rpc, "insert_seconds", r->rpc_insert_s);
    bu_json_num(rpc, "query_per_s", r->rpc_q_per_s);
    bu_json_num(rpc, "query_hashes_per_s", r->rpc_qh_per_s);
    bu_json_num(rpc, "empty_rtt_per_s", r->rpc_ping_per_s);
    bu_json_num(rpc, "unregister_ms", r->rpc_unregister_ms);
    bu_json_num(rpc, "removed_owners", (double)r->removed_owners);
    bu_json_num(rpc, "rss_bytes_per_key", r->rss_bytes_per_key);
    bu_json_num(rpc, "rss_after_kb", (double)r->rss1_kb);
    bu_json_num(rpc, "wrong_answers", (double)r->q_bad);
    bu_json_nums(rpc, "query_vs_empty", r->q_vs_empty, 3);
    cJSON *store = bu_json_obj(root, "store");
    bu_json_num(store, "insert_registrations_per_s", r->st_insert_per_s);
    bu_json_num(store, "query_per_s", r->st_q_per_s);
    bu_json_nums(store, "query_per_s_spread", r->st_q_spread, 3);
    bu_json_num(store, "unregister_ms", r->st_unregister_ms);
    bu_json_num(store, "store_bytes_per_key", r->st_bytes_per_key);
    if (rr) {
        cJSON *red = bu_json_obj(root, "redis");
        bu_json_num(red, "rpc_insert_registrations_per_s", rr->rpc_insert_per_s);
        bu_json_num(red, "rpc_query_per_s", rr->rpc_q_per_s);
        bu_json_num(red, "rpc_unregister_ms", rr->rpc_unregister_ms);
        bu_json_num(red, "redis_rss_bytes_per_key", rr->redis_rss_bytes_per_key);
        bu_json_num(red, "metaserver_rss_bytes_per_key", rr->rss_bytes_per_key);
        bu_json_num(red, "store_insert_registrations_per_s", rr->st_insert_per_s);
        bu_json_num(red, "store_query_per_s", rr->st_q_per_s);
        bu_json_num(red, "used_memory_bytes_per_key", rr->st_bytes_per_key);
        bu_json_num(red, "wrong_answers", (double)rr->q_bad);
    }
    printf("\n");
    if (json_path)
        bu_json_write(cJSON_Duplicate(root, 1), json_path);
    bu_json_write(root, NULL); /* the table is followed by the JSON, as before */
}

#define USAGE                                                                                      \
    "metaserver [--keys N] [--nodes N] [--owners N] [--query-len L] [--query-secs S] "             \
    "[--metaserver PATH] [--store memory|redis] [--json FILE]"

int main(int argc, char **argv)
{
    static char defpath[4096];
    const char *bin = getenv("PF_BIN");
    snprintf(defpath, sizeof(defpath), "%s/pegaflow-metaserver", bin ? bin : "build/rel/bin");
    ms_path = defpath;
    const char *store = "memory";
    const struct bu_opt opts[] = {{"--keys", BU_LONG, &nkeys},
                                  {"--nodes", BU_LONG, &nnodes},
                                  {"--owners", BU_LONG, &nowners},
                                  {"--query-len", BU_LONG, &qlen},
                                  {"--query-secs", BU_DOUBLE, &qsecs},
                                  {"--metaserver", BU_STR, &ms_path},
                                  {"--json", BU_STR, &json_path},
                                  {"--store", BU_STR, &store},
                                  {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, USAGE);
    if (strcmp(store, "memory") != 0 && strcmp(store, "redis") != 0) {
        fprintf(stderr, "--store: memory or redis\nusage: %s\n", USAGE);
        return 2;
    }
    bool want_redis = !strcmp(store, "redis");
    if (nkeys < (long)RUN || nnodes < 1 || nnodes > 200 || nowners < 1 || nowners > nnodes ||
        qlen < 1 || qlen > (long)RUN) {
        fprintf(stderr, "bad parameters\n");
        return 2;
    }
    pf_rpc_global_init();
    keybytes = malloc((size_t)nkeys * HLEN);
    for (long k = 0; k < nkeys; k++)
        key_of(k, keybytes + (size_t)k * HLEN);
    struct results r = {0};
    printf("MetaServer benchmark: %ld keys (32-byte hashes), %ld nodes, %ld owners per key, "
           "queries of %ld blocks, %ld CPUs\n",
           nkeys, nnodes, nowners, qlen, sysconf(_SC_NPROCESSORS_ONLN));
    int rc = rpc_part(&r);
    if (rc) {
        fprintf(stderr, "RPC part failed: %d\n", rc);
        return 1;
    }
    store_part(&r);
    struct results rr = {0};
    if (want_redis) {
        if (pft_redis_start(&bredis, NULL)) {
            fprintf(stderr, "--store redis: cannot start redis-server\n");
            return 1;
        }
        store_url = bredis.url;
        printf("Redis store on %s (redis-server pid %d)\n", store_url, (int)bredis.pid);
        rc = rpc_part(&rr);
        if (rc) {
            fprintf(stderr, "RPC part (Redis store) failed: %d\n", rc);
            pft_redis_stop(&bredis);
            return 1;
        }
        store_part(&rr);
        pft_redis_stop(&bredis);
        r.q_bad += rr.q_bad;
    }
    print_results(&r, want_redis ? &rr : NULL);
    write_results(&r, want_redis ? &rr : NULL);
    pf_rpc_global_shutdown();
    return r.q_bad ? 1 : 0;
}

/* Tenants bound to credentials (docs/security.md "Tenants") against a real pegaflow-server
 * with --tenants-file and the sim GPU, through libpegaflow (PEGAFLOW_TENANT_TOKEN_FILE):
 *   isolation  tenants A and B save different bytes under equal block hashes in their own
 *              namespaces: each one's Query and Load see only its own blocks, byte-exact
 *              (B's query before B saved misses although A's blocks are resident); a
 *              namespace outside a tenant's rules, another tenant's instance (Register,
 *              Save, Query, Load, Unregister, Session) and another instance's lease are
 *              refused; no token and a token not in the file are UNAUTHENTICATED; Shutdown
 *              with a tenant token is refused; per-tenant metrics
 *   quota      SIGHUP reload (waited for on pegaflow_tenant_reloads_total) gives A a RAM
 *              quota of 8 blocks: A's next save evicts A's own oldest blocks while B's stay
 *              resident and load byte-exact; a save larger than the quota and a save whose
 *              room is held by a lease are RESOURCE_EXHAUSTED; a bad file keeps the old set;
 *              a tenant removed by a reload is refused
 *   ssd-quota  with the SSD on: a reload gives A an SSD quota of 4 records; A's next saves
 *              drop A's own oldest SSD entries (a load after a RAM cleanup misses them)
 *              while B's SSD blocks load byte-exact; pegaflow_tenant_ssd_bytes <= quota; a
 *              record larger than the quota is not written; a restart recovers the
 *              records (dropped ones too) and holds them to the quota again
 * Usage: tenant_e2e [scenario...]. Seed: PF_TEST_SEED. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "kvsim.h"
#include "pf/rpc.h"
#include "pftest.h"
#include "world.h"

#define TMO   10000
#define TOK_A "tenant-A-token-0123456789"
#define TOK_B "tenant-B-token-9876543210"
#define TOK_C "tenant-C-token-5555555555"

static char dir[256];

static void write_text(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    char tmp[520];
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    FILE *f = fopen(tmp, "w");
    PFT_CHECK(f != NULL, "cannot write %s", tmp);
    fputs(text, f);
    fclose(f);
    chmod(tmp, 0600);
    PFT_CHECK(rename(tmp, p) == 0, "rename %s", p); /* a reload never sees half a file */
}

static void setup_dir(void)
{
    const char *base = getenv("PF_TEST_LOGDIR") ? getenv("PF_TEST_LOGDIR") : "/tmp";
    snprintf(dir, sizeof(dir), "%s/tenants.XXXXXX", base);
    PFT_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    write_text("a.tok", TOK_A "\n");
    write_text("b.tok", TOK_B "\n");
    write_text("c.tok", TOK_C "\n");
    write_text("x.tok", "not-a-tenant-token-at-all\n");
}

/* A client whose calls carry the tenant token in file tokname (NULL: none). */
static struct pf_client *connect_as(const struct pft_proc *s, const char *tokname)
{
    char p[512];
    if (tokname) {
        snprintf(p, sizeof(p), "%s/%s", dir, tokname);
        setenv("PEGAFLOW_TENANT_TOKEN_FILE", p, 1);
    } else {
        unsetenv("PEGAFLOW_TENANT_TOKEN_FILE");
    }
    struct pf_client *c;
    PFT_CHECK(pf_client_connect(s->addr, &c) == 0, "connect as %s: %s", tokname ? tokname : "-",
              pf_last_error_message());
    unsetenv("PEGAFLOW_TENANT_TOKEN_FILE");
    return c;
}

static double tmetric(struct pft_proc *s, const char *name, const char *labels)
{
    char k[200];
    snprintf(k, sizeof(k), "%.90s{%.100s}", name, labels);
    return metric_or(s, k, 0);
}

/* Waits (deadline) until the series reaches at least want. */
static void wait_metric(struct pft_proc *s, const char *name, const char *labels, double want)
{
    uint64_t dl = pft_now_ms() + TMO;
    double v;
    while ((v = tmetric(s, name, labels)) < want) {
        PFT_CHECK(pft_now_ms() < dl, "%s{%s} is %g after %d ms, want %g", name, labels, v, TMO,
                  want);
        usleep(10000);
    }
}

static const char *start_args[] = {
    "--gpu-backend",      "sim", "--pool-size", "64mb", "--sim-gpus", "2", "--tenants-file",
    NULL /* set below */, NULL};

static void start(struct pft_proc *s)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/tenants", dir);
    start_args[7] = path;
    PFT_CHECK(pft_start(s, "pegaflow-server", "127.0.0.1", start_args) == 0, "start server");
}

#define N 8

/* A Load the tenant check refuses (before the engine sees it: the load state stays 0).
 * Returns the call's result. */
static int load_refused(struct pf_client *c, struct world *w, const uint8_t *lease, size_t n)
{
    int64_t targets[N];
    for (size_t i = 0; i < n && i < N; i++)
        targets[i] = 1 + (int64_t)i;
    const char *names[MAXL];
    for (int l = 0; l < w->nlayers; l++)
        names[l] = w->names[l];
    size_t gsz = (size_t)w->nlayers, cnt = n;
    struct pf_load_item it = {
        .lease = lease, .lease_len = PF_LEASE_LEN, .targets = targets, .group_counts = &cnt};
    struct pf_loadstate *ls;
    PFT_CHECK(pf_loadstate_create(&ls) == 0, "loadstate");
    int rc = pf_client_load(c, w->id, 0, 0, pf_loadstate_name(ls), names, &gsz, 1, &it, 1, TMO);
    pf_loadstate_destroy(ls);
    return rc;
}

static void sc_isolation(void)
{
    setup_dir();
    write_text("tenants", "# test tenants\n"
                          "tenant=A token=" TOK_A " namespaces=ns-a,ns-a-*\n"
                          "tenant=B token=" TOK_B " namespaces=ns-b\n");
    struct pft_proc s;
    start(&s);
    struct pf_client *ca = connect_as(&s, "a.tok"), *cb = connect_as(&s, "b.tok");
    struct pf_client *cx = connect_as(&s, "x.tok"), *c0 = connect_as(&s, NULL);

    struct world A, A2, B, B2, W;
    world_init_tagged(&A, "inst-A", "ns-a", 1, 2, KV_SPLIT, 32, 2048, 1, true);
    world_init_tagged(&A2, "inst-A2", "ns-a-load", 1, 2, KV_SPLIT, 32, 2048, 1, false);
    world_init_tagged(&B, "inst-B", "ns-b", 1, 2, KV_SPLIT, 32, 2048, 2, true);
    world_init_tagged(&B2, "inst-B2", "ns-b", 1, 2, KV_SPLIT, 32, 2048, 2, false);
    world_init_tagged(&W, "inst-W", "ns-b", 1, 2, KV_SPLIT, 32, 2048, 3, false);

    /* credentials first */
    EXPECT(world_register_rank(c0, &B, 0, NULL), PF_GRPC_UNAUTHENTICATED,
           "worker RPCs need a tenant token");
    EXPECT(world_register_rank(cx, &B, 0, NULL), PF_GRPC_UNAUTHENTICATED,
           "tenant token not in --tenants-file");
    struct world AB; /* A asks for B's namespace */
    world_init_tagged(&AB, "inst-AB", "ns-b", 1, 2, KV_SPLIT, 32, 2048, 1, false);
    EXPECT(world_register_rank(ca, &AB, 0, NULL), PF_GRPC_PERMISSION_DENIED,
           "namespace 'ns-b' is not allowed for tenant A");
    AB.ns = "ns-ab"; /* not matched by "ns-a-*" */
    EXPECT(world_register_rank(ca, &AB, 0, NULL), PF_GRPC_PERMISSION_DENIED,
           "namespace 'ns-ab' is not allowed for tenant A");

    world_register(ca, &A);
    world_register(ca, &A2);
    world_register(cb, &B);
    world_register(cb, &B2);
    /* B cannot take over A's registered instance id */
    struct world BA;
    world_init_tagged(&BA, "inst-A", "ns-b", 1, 2, KV_SPLIT, 32, 2048, 2, false);
    EXPECT(world_register_rank(cb, &BA, 0, NULL), PF_GRPC_PERMISSION_DENIED,
           "instance inst-A does not belong to tenant B");

    const uint64_t h0 = 500;
    world_save_ok(ca, &A, h0, 1, N);
    wait_sealed(ca, A.id, h0, N);
    /* equal hashes, B's namespace: A's resident blocks are not B's */
    struct pf_query_result res;
    PFT_CHECK(query(cb, B.id, "b-before", h0, N, &res) == 0, "query B: %s",
              pf_last_error_message());
    PFT_CHECK(res.num_hit_blocks == 0 && res.lease_len == 0,
              "B sees %u of A's blocks with equal hashes", res.num_hit_blocks);
    /* B cannot reach A's instance */
    EXPECT(query(cb, A.id, "b-on-a", h0, N, &res), PF_GRPC_PERMISSION_DENIED,
           "instance inst-A does not belong to tenant B");
    EXPECT(world_save(cb, &A, h0, 1, N), PF_GRPC_PERMISSION_DENIED,
           "instance inst-A does not belong to tenant B");
    EXPECT(pf_client_unregister(cb, A.id, TMO), PF_GRPC_PERMISSION_DENIED,
           "instance inst-A does not belong to tenant B");
    struct pf_session *sess;
    EXPECT(pf_client_session_open(cb, A.id, "ns-b", 1, 1, TMO, &sess), PF_GRPC_PERMISSION_DENIED,
           "instance inst-A does not belong to tenant B");
    EXPECT(pf_client_shutdown(cb, TMO), PF_GRPC_PERMISSION_DENIED, "Shutdown is not a tenant RPC");
    /* a Session for an id nobody registered: closing it could end a later owner's instance */
    EXPECT(pf_client_session_open(cb, "inst-nobody", "ns-b", 1, 1, TMO, &sess),
           PF_GRPC_PERMISSION_DENIED, "instance inst-nobody does not belong to tenant B");

    world_save_ok(cb, &B, h0, 1, N);
    wait_sealed(cb, B.id, h0, N);

    /* each tenant loads its own bytes */
    PFT_CHECK(query(ca, A2.id, "a-load", h0, N, &res) == 0 && res.num_hit_blocks == 0,
              "A2 is another namespace of A: %u hits", res.num_hit_blocks);
    PFT_CHECK(query(ca, A.id, "a-load", h0, N, &res) == 0 && res.num_hit_blocks == N,
              "query A: %u hits: %s", res.num_hit_blocks, pf_last_error_message());
    uint8_t lease_a[PF_LEASE_LEN];
    memcpy(lease_a, res.lease, PF_LEASE_LEN);
    /* B cannot load A's lease into its own instance, nor load into A's instance */
    int64_t st = 0;
    PFT_CHECK(world_load(cb, &B2, lease_a, N, 1, &st) != 0 && st == -1,
              "B loaded A's lease: st=%lld", (long long)st);
    EXPECT(load_refused(cb, &A, lease_a, N), PF_GRPC_PERMISSION_DENIED,
           "instance inst-A does not belong to tenant B");
    world_load_ok(ca, &A, lease_a, N, 20); /* A's own instance, blocks 20.. */
    compare(&A, 1, &A, 20, N);

    PFT_CHECK(query(cb, B2.id, "b-load", h0, N, &res) == 0 && res.num_hit_blocks == N,
              "query B2: %u hits: %s", res.num_hit_blocks, pf_last_error_message());
    world_load_ok(cb, &B2, res.lease, N, 1);
    compare(&B, 1, &B2, 1, N); /* B's bytes, byte-exact */
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < N; i++)
            PFT_CHECK(!kvt_block_equal(&A.kv[0][l], 1 + i, &B2.kv[0][l], 1 + i),
                      "layer %d block %zu: B loaded A's bytes", l, i);

    /* Release needs a valid token; the lease is the capability */
    PFT_CHECK(query(ca, A.id, "a-rel", h0, N, &res) == 0, "query");
    EXPECT(pf_client_release(cx, res.lease, res.lease_len, TMO), PF_GRPC_UNAUTHENTICATED,
           "not in --tenants-file");
    PFT_CHECK(pf_client_release(ca, res.lease, res.lease_len, TMO) == 0, "release: %s",
              pf_last_error_message());

    /* metrics */
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_hit_blocks_total", "tenant=\"B\"") >= N, "B hits");
    PFT_CHECK(
        tmetric(&s, "pegaflow_tenant_refusals_total", "tenant=\"\",reason=\"unknown_token\"") >= 2,
        "unknown-token refusals");
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_refusals_total", "tenant=\"A\",reason=\"namespace\"") ==
                  2,
              "namespace refusals of A");
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_refusals_total", "tenant=\"B\",reason=\"instance\"") >=
                  6,
              "instance refusals of B");
    double ra = tmetric(&s, "pegaflow_tenant_ram_bytes", "tenant=\"A\"");
    double rb = tmetric(&s, "pegaflow_tenant_ram_bytes", "tenant=\"B\"");
    PFT_CHECK(ra > 0 && ra == rb, "RAM bytes A %g B %g (equal saves)", ra, rb);

    /* the owner may unregister; the id is then free for another tenant */
    PFT_CHECK(pf_client_unregister(ca, A.id, TMO) == 0, "unregister A");
    PFT_CHECK(world_register_rank(cb, &BA, 0, NULL) == 0, "B takes the free id: %s",
              pf_last_error_message());
    PFT_CHECK(query(cb, "inst-A", "b-now", h0, N, &res) == 0 && res.num_hit_blocks == N,
              "inst-A is B's now: %u hits (B's blocks)", res.num_hit_blocks);
    pf_client_release(cb, res.lease, res.lease_len, TMO);
    EXPECT(query(ca, "inst-A", "a-gone", h0, N, &res), PF_GRPC_PERMISSION_DENIED,
           "instance inst-A does not belong to tenant A");

    /* the owner's own Session opens (its close ends inst-A2, which is done) */
    PFT_CHECK(pf_client_session_open(ca, A2.id, "ns-a-load", 1, 1, TMO, &sess) == 0,
              "A's own session: %s", pf_last_error_message());
    pf_client_session_close(sess);
    pf_client_close(ca);
    pf_client_close(cb);
    pf_client_close(cx);
    pf_client_close(c0);
    world_free(&A);
    world_free(&A2);
    world_free(&B);
    world_free(&B2);
    world_free(&W);
    world_free(&AB);
    world_free(&BA);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr, "  isolation: equal hashes in two tenants' namespaces, byte-exact, refusals\n");
}

static void sc_quota(void)
{
    setup_dir();
    write_text("tenants", "tenant=A token=" TOK_A " namespaces=qa\n"
                          "tenant=B token=" TOK_B " namespaces=qb\n"
                          "tenant=C token=" TOK_C " namespaces=qc\n");
    struct pft_proc s;
    start(&s);
    struct pf_client *ca = connect_as(&s, "a.tok"), *cb = connect_as(&s, "b.tok"),
                     *cc = connect_as(&s, "c.tok");
    struct world A, B, B2, C;
    world_init_tagged(&A, "qa-1", "qa", 1, 2, KV_SPLIT, 64, 4096, 1, true);
    world_init_tagged(&B, "qb-1", "qb", 1, 2, KV_SPLIT, 64, 4096, 2, true);
    world_init_tagged(&B2, "qb-2", "qb", 1, 2, KV_SPLIT, 64, 4096, 2, false);
    world_init_tagged(&C, "qc-1", "qc", 1, 2, KV_SPLIT, 64, 4096, 3, true);
    world_register(ca, &A);
    world_register(cb, &B);
    world_register(cb, &B2);
    world_register(cc, &C);
    const uint64_t h0 = 9000;
    world_save_ok(ca, &A, h0, 1, N);
    wait_sealed(ca, A.id, h0, N);
    world_save_ok(cb, &B, h0, 1, N);
    wait_sealed(cb, B.id, h0, N);
    double fp8 = tmetric(&s, "pegaflow_tenant_ram_bytes", "tenant=\"A\"");
    PFT_CHECK(fp8 > 0, "A's RAM bytes %g", fp8);

    /* a broken file: the old set stays */
    write_text("tenants", "tenant=A token=" TOK_A " namespaces=qa ram=\n");
    PFT_CHECK(kill(s.pid, SIGHUP) == 0, "SIGHUP");
    wait_metric(&s, "pegaflow_tenant_reloads_total", "result=\"error\"", 1);
    PFT_CHECK(pft_log_contains(&s, "reload failed, the previous"), "reload error logged");
    PFT_CHECK(pft_log_contains(&s, ":1: ram='' is not a size"), "line-numbered reload error");
    PFT_CHECK(world_save(cc, &C, h0, 1, 1) == 0, "C still in force: %s", pf_last_error_message());

    /* quota of exactly 8 blocks for A; C removed */
    char text[512];
    snprintf(text, sizeof(text),
             "tenant=A token=" TOK_A " namespaces=qa ram=%.0f\n"
             "tenant=B token=" TOK_B " namespaces=qb\n",
             fp8);
    write_text("tenants", text);
    PFT_CHECK(kill(s.pid, SIGHUP) == 0, "SIGHUP");
    wait_metric(&s, "pegaflow_tenant_reloads_total", "result=\"ok\"", 1);
    EXPECT(world_save(cc, &C, h0 + 1, 2, 1), PF_GRPC_UNAUTHENTICATED,
           "tenant token not in --tenants-file");

    /* A's next 8 blocks evict A's first 8, B's stay */
    world_save_ok(ca, &A, h0 + N, 1 + N, N);
    wait_sealed(ca, A.id, h0 + N, N);
    struct pf_query_result res;
    PFT_CHECK(query(ca, A.id, "a-old", h0, N, &res) == 0 && res.num_hit_blocks == 0,
              "A's oldest blocks still resident: %u hits", res.num_hit_blocks);
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_evicted_blocks_total", "tenant=\"A\"") == N,
              "A's quota evictions %g",
              tmetric(&s, "pegaflow_tenant_evicted_blocks_total", "tenant=\"A\""));
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_evicted_blocks_total", "tenant=\"B\"") == 0,
              "B evicted");
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_ram_bytes", "tenant=\"A\"") <= fp8, "A over quota");
    PFT_CHECK(query(cb, B2.id, "b-all", h0, N, &res) == 0 && res.num_hit_blocks == N,
              "B lost blocks to A's quota: %u hits", res.num_hit_blocks);
    world_load_ok(cb, &B2, res.lease, N, 1);
    compare(&B, 1, &B2, 1, N);

    /* larger than the quota in one call */
    EXPECT(world_save(ca, &A, h0 + 100, 1, N + 1), PF_GRPC_RESOURCE_EXHAUSTED, "its RAM quota is");
    /* A's blocks pinned by a lease: nothing of A's can be evicted */
    PFT_CHECK(query(ca, A.id, "a-pin", h0 + N, N, &res) == 0 && res.num_hit_blocks == N,
              "pin: %u hits", res.num_hit_blocks);
    EXPECT(world_save(ca, &A, h0 + 200, 1, 1), PF_GRPC_RESOURCE_EXHAUSTED, "RAM quota");
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_refusals_total", "tenant=\"A\",reason=\"quota\"") == 2,
              "quota refusals");
    PFT_CHECK(pf_client_release(ca, res.lease, res.lease_len, TMO) == 0, "release");
    world_save_ok(ca, &A, h0 + 200, 1, 1); /* room again: one of A's evicted */
    /* B (no quota) is unaffected throughout */
    world_save_ok(cb, &B, h0 + N, 1 + N, N);

    pf_client_close(ca);
    pf_client_close(cb);
    pf_client_close(cc);
    world_free(&A);
    world_free(&B);
    world_free(&B2);
    world_free(&C);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    fprintf(stderr, "  quota: %g bytes for 8 blocks, own blocks evicted, others untouched\n", fp8);
}

/* Waits (deadline) until the SSD writer has written `blocks` blocks in all and has nothing
 * pending or in flight. */
static void wait_ssd_written(struct pft_proc *s, double blocks)
{
    uint64_t dl = pft_now_ms() + TMO;
    for (;;) {
        double w = metric_or(s, "pegaflow_ssd_write_blocks_total", 0);
        if (w >= blocks && metric_or(s, "pegaflow_ssd_write_queue_pending", 0) == 0 &&
            metric_or(s, "pegaflow_ssd_write_inflight", 0) == 0)
            return;
        PFT_CHECK(pft_now_ms() < dl, "SSD writer wrote %g of %g block(s) after %d ms", w, blocks,
                  TMO);
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

/* The n blocks from h0 of instance inst load from the SSD into dst (blocks first_dst..)
 * after a RAM cleanup: the query answers Loading, then all n hit. */
static void load_from_ssd(struct pf_client *c, struct world *dst, uint64_t h0, size_t n,
                          uint32_t first_dst, const char *req)
{
    struct pf_query_result res;
    bool loading = query_ready(c, dst->id, req, h0, n, &res);
    PFT_CHECK(loading && res.num_hit_blocks == n, "%s: loading=%d hits=%u of %zu", req, loading,
              res.num_hit_blocks, n);
    world_load_ok(c, dst, res.lease, n, first_dst);
}

/* SSD quotas: A (ssd=unlimited first) and B (no SSD quota) write 8 blocks each to the SSD;
 * a reload gives A an SSD quota of 4 records; A's next 8 blocks drop A's own oldest SSD
 * entries (12 of them) while B's stay. After a RAM cleanup A's dropped blocks miss, A's
 * newest 4 and all of B's load from the SSD byte-exact; the gauge is within the quota. */
static void sc_ssd_quota(void)
{
    setup_dir();
    write_text("tenants", "tenant=A token=" TOK_A " namespaces=sa ssd=unlimited\n"
                          "tenant=B token=" TOK_B " namespaces=sb\n");
    char tpath[512], spath[512];
    snprintf(tpath, sizeof(tpath), "%s/tenants", dir);
    snprintf(spath, sizeof(spath), "%s/ssd.dat", dir);
    const char *args[] = {"--gpu-backend",
                          "sim",
                          "--pool-size",
                          "64mb",
                          "--sim-gpus",
                          "2",
                          "--tenants-file",
                          tpath,
                          "--ssd-cache-path",
                          spath,
                          "--ssd-cache-capacity",
                          "64mb",
                          NULL};
    struct pft_proc s;
    if (pft_start(&s, "pegaflow-server", "127.0.0.1", args) != 0) {
        PFT_CHECK(pft_log_contains(&s, "io_uring is not usable"), "start server with an SSD");
        fprintf(stderr, "  SKIP ssd-quota: io_uring is not usable on this host\n");
        return;
    }
    struct pf_client *ca = connect_as(&s, "a.tok"), *cb = connect_as(&s, "b.tok");
    struct world A, A2, B, B2;
    world_init_tagged(&A, "sa-1", "sa", 1, 2, KV_SPLIT, 32, 4096, 1, true);
    world_init_tagged(&A2, "sa-2", "sa", 1, 2, KV_SPLIT, 32, 4096, 1, false);
    world_init_tagged(&B, "sb-1", "sb", 1, 2, KV_SPLIT, 32, 4096, 2, true);
    world_init_tagged(&B2, "sb-2", "sb", 1, 2, KV_SPLIT, 32, 4096, 2, false);
    world_register(ca, &A);
    world_register(ca, &A2);
    world_register(cb, &B);
    world_register(cb, &B2);
    const uint64_t h0 = 7000;
    world_save_ok(ca, &A, h0, 1, N);
    wait_sealed(ca, A.id, h0, N);
    world_save_ok(cb, &B, h0, 1, N);
    wait_sealed(cb, B.id, h0, N);
    wait_ssd_written(&s, 2 * N);
    double a8 = tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"A\"");
    double b8 = tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"B\"");
    PFT_CHECK(a8 > 0 && a8 == b8, "SSD bytes A %g B %g (equal saves)", a8, b8);
    double rec = a8 / N; /* one record: header + block */

    /* A's SSD quota: 4 records, from the next write on */
    char text[512];
    snprintf(text, sizeof(text),
             "tenant=A token=" TOK_A " namespaces=sa ssd=%.0f\n"
             "tenant=B token=" TOK_B " namespaces=sb\n",
             4 * rec);
    write_text("tenants", text);
    PFT_CHECK(kill(s.pid, SIGHUP) == 0, "SIGHUP");
    wait_metric(&s, "pegaflow_tenant_reloads_total", "result=\"ok\"", 1);
    world_save_ok(ca, &A, h0 + N, 1 + N, N);
    wait_sealed(ca, A.id, h0 + N, N);
    wait_ssd_written(&s, 3 * N);
    double a = tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"A\"");
    PFT_CHECK(a <= 4 * rec && a > 0, "A's SSD bytes %g, quota %g", a, 4 * rec);
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"B\"") == b8, "B's SSD bytes");
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_ssd_evicted_blocks_total", "tenant=\"A\"") == N + 4,
              "A's SSD quota evictions %g",
              tmetric(&s, "pegaflow_tenant_ssd_evicted_blocks_total", "tenant=\"A\""));
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_ssd_evicted_blocks_total", "tenant=\"B\"") == 0,
              "B's SSD evictions");

    /* RAM gone: what is left of A's is its newest 4; B keeps all */
    cleanup_ram(&s);
    struct pf_query_result res;
    for (size_t i = 0; i < N + 4; i += 4) {
        char req[64];
        snprintf(req, sizeof(req), "a-dropped-%zu", i);
        bool loading = query_ready(ca, A2.id, req, h0 + i, 4, &res);
        PFT_CHECK(!loading && res.num_hit_blocks == 0,
                  "A's blocks %zu.. dropped for the SSD quota answered loading=%d hits=%u", i,
                  loading, res.num_hit_blocks);
    }
    load_from_ssd(ca, &A2, h0 + N + 4, 4, 1, "a-kept");
    compare(&A, 1 + N + 4, &A2, 1, 4);
    load_from_ssd(cb, &B2, h0, N, 1, "b-all");
    compare(&B, 1, &B2, 1, N);

    /* a record larger than the quota is not written */
    snprintf(text, sizeof(text),
             "tenant=A token=" TOK_A " namespaces=sa ssd=%.0f\n"
             "tenant=B token=" TOK_B " namespaces=sb\n",
             rec / 2);
    write_text("tenants", text);
    PFT_CHECK(kill(s.pid, SIGHUP) == 0, "SIGHUP");
    wait_metric(&s, "pegaflow_tenant_reloads_total", "result=\"ok\"", 2);
    double w0 = metric_or(&s, "pegaflow_ssd_write_blocks_total", 0);
    world_save_ok(ca, &A, h0 + 100, 1, 1);
    wait_sealed(ca, A.id, h0 + 100, 1);
    wait_metric(&s, "pegaflow_tenant_ssd_refused_blocks_total", "tenant=\"A\"", 1);
    PFT_CHECK(metric_or(&s, "pegaflow_ssd_write_blocks_total", 0) == w0, "a refused block written");
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"A\"") == a, "A's SSD bytes");

    pf_client_close(ca);
    pf_client_close(cb);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    /* a restart recovers every record still on disk (A's dropped ones too): the recovered
     * ones count and are held to the quota (now 2 records: A's newest 2 stay) */
    snprintf(text, sizeof(text),
             "tenant=A token=" TOK_A " namespaces=sa ssd=%.0f\n"
             "tenant=B token=" TOK_B " namespaces=sb\n",
             2 * rec);
    write_text("tenants", text);
    PFT_CHECK(pft_start(&s, "pegaflow-server", "127.0.0.1", args) == 0, "restart");
    uint64_t dl = pft_now_ms() + TMO;
    while (metric_or(&s, "pegaflow_ssd_recovery_state", 0) != 2) {
        PFT_CHECK(pft_now_ms() < dl, "SSD recovery not done after %d ms", TMO);
        usleep(10000);
    }
    PFT_CHECK(metric_or(&s, "pegaflow_ssd_recovered_blocks", 0) >= 3 * N, "recovered %g blocks",
              metric_or(&s, "pegaflow_ssd_recovered_blocks", 0));
    /* the quota hook may be installed after the scan: wait for its pass */
    wait_metric(&s, "pegaflow_tenant_ssd_evicted_blocks_total", "tenant=\"A\"", 1);
    PFT_CHECK(tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"A\"") == 2 * rec &&
                  tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"B\"") == b8,
              "recovered SSD bytes A %g (want %g) B %g (want %g)",
              tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"A\""), 2 * rec,
              tmetric(&s, "pegaflow_tenant_ssd_bytes", "tenant=\"B\""), b8);
    ca = connect_as(&s, "a.tok");
    cb = connect_as(&s, "b.tok");
    world_register(ca, &A2);
    world_register(cb, &B2);
    for (size_t i = 0; i < N + 6; i += 2) {
        char req[64];
        snprintf(req, sizeof(req), "a-gone-%zu", i);
        bool loading = query_ready(ca, A2.id, req, h0 + i, 2, &res);
        PFT_CHECK(!loading && res.num_hit_blocks == 0,
                  "A's blocks %zu.. over the quota after recovery: loading=%d hits=%u", i, loading,
                  res.num_hit_blocks);
    }
    load_from_ssd(ca, &A2, h0 + N + 6, 2, 10, "a-recovered");
    compare(&A, 1 + N + 6, &A2, 10, 2);
    load_from_ssd(cb, &B2, h0, N, 10, "b-recovered");
    compare(&B, 1, &B2, 10, N);
    pf_client_close(ca);
    pf_client_close(cb);
    PFT_CHECK(pft_stop(&s, SIGTERM, 15000) == 0, "server exit code");
    world_free(&A);
    world_free(&A2);
    world_free(&B);
    world_free(&B2);
    fprintf(stderr, "  ssd-quota: %g bytes per record, A's oldest dropped, B's byte-exact\n", rec);
}

int main(int argc, char **argv)
{
    world_seed = pft_seed();
    static const struct pft_scenario sc[] = {
        {"isolation", sc_isolation},
        {"quota", sc_quota},
        {"ssd-quota", sc_ssd_quota},
    };
    return pft_run_scenarios(sc, sizeof(sc) / sizeof(sc[0]), argv + 1, argc - 1);
}

/* Test "worlds": an instance's sim KV caches over TP ranks and layers, and the
 * register/save/query/load/compare steps every engine scenario repeats. Header-only; the
 * including test sets world_seed (and may change world_hash_base, world_tmo). */
#ifndef PF_TEST_WORLD_H
#define PF_TEST_WORLD_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "kvsim.h"
#include "pftest.h"

#define MAXR 4
#define MAXL 8
#define HLEN 32

/* expr must fail with gRPC code and a message containing substr. */
#define EXPECT(expr, code, substr)                                                                 \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        PFT_CHECK(rc_ != 0 && pf_last_error_code() == (code) &&                                    \
                      strstr(pf_last_error_message(), (substr)),                                   \
                  "%s: rc=%d code=%d msg='%s' (want code %d, '%s')", #expr, rc_,                   \
                  pf_last_error_code(), pf_last_error_message(), (code), (substr));                \
    } while (0)

static uint64_t world_seed;
static uint64_t world_hash_base = 1000000;
static uint64_t world_tmo = 10000;

struct world {
    const char *id;
    const char *ns;
    int tp;
    int nlayers;
    uint64_t tag; /* mixed into the fill pattern: worlds with other tags hold other bytes */
    struct kvt kv[MAXR][MAXL];
    char names[MAXL][32];
};

static inline void hash_of(uint64_t i, uint8_t *h)
{
    pft_fill(h, HLEN, world_seed, world_hash_base + i);
}

static inline void world_init_tagged(struct world *w, const char *id, const char *ns, int tp,
                                     int nlayers, enum kv_layout lay, uint64_t nblocks,
                                     uint64_t seg, uint64_t tag, bool fill)
{
    memset(w, 0, sizeof(*w));
    w->id = id;
    w->tag = tag;
    w->ns = ns;
    w->tp = tp;
    w->nlayers = nlayers;
    for (int l = 0; l < nlayers; l++)
        snprintf(w->names[l], sizeof(w->names[l]), nlayers == 1 ? "ALL_LAYERS" : "model.layers.%d",
                 l);
    for (int r = 0; r < tp; r++)
        for (int l = 0; l < nlayers; l++) {
            PFT_CHECK(kvt_create(&w->kv[r][l], lay, nblocks, seg, r) == 0, "simkv create");
            if (fill)
                for (uint64_t b = 0; b < nblocks; b++)
                    kvt_fill_block(&w->kv[r][l], b, world_seed,
                                   tag << 48 | (uint64_t)r << 40 | (uint64_t)l << 32 | b);
        }
}

static inline void world_init(struct world *w, const char *id, const char *ns, int tp, int nlayers,
                              enum kv_layout lay, uint64_t nblocks, uint64_t seg, bool fill)
{
    world_init_tagged(w, id, ns, tp, nlayers, lay, nblocks, seg, 0, fill);
}

static inline void world_free(struct world *w)
{
    for (int r = 0; r < w->tp; r++)
        for (int l = 0; l < w->nlayers; l++)
            kvt_destroy(&w->kv[r][l]);
}

static inline int world_register_rank(struct pf_client *c, struct world *w, int r,
                                      const char *version)
{
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
        .client_version = version,
        .layers = d,
        .nlayers = (size_t)w->nlayers,
    };
    return pf_client_register(c, &a, world_tmo);
}

static inline void world_register(struct pf_client *c, struct world *w)
{
    for (int r = 0; r < w->tp; r++) {
        int rc = world_register_rank(c, w, r, NULL);
        PFT_CHECK(rc == 0, "register %s rank %d: %s", w->id, r, pf_last_error_message());
    }
}

/* Saves hashes [h0, h0+n) from block ids first_id.. on every rank. */
static inline int world_save(struct pf_client *c, struct world *w, uint64_t h0, uint32_t first_id,
                             size_t n)
{
    uint32_t *ids = malloc(n * sizeof(*ids));
    uint8_t *hs = malloc(n * HLEN);
    for (size_t i = 0; i < n; i++) {
        ids[i] = first_id + (uint32_t)i;
        hash_of(h0 + i, hs + i * HLEN);
    }
    int rc = 0;
    for (int r = 0; r < w->tp && rc == 0; r++) {
        struct pf_save_layer sl[MAXL];
        for (int l = 0; l < w->nlayers; l++)
            sl[l] = (struct pf_save_layer){
                .name = w->names[l], .block_ids = ids, .hashes = hs, .hash_len = HLEN, .n = n};
        rc = pf_client_save(c, w->id, (uint32_t)r, 0, r, sl, (size_t)w->nlayers, world_tmo);
    }
    free(ids);
    free(hs);
    return rc;
}

/* One QueryPrefetch for hashes [h0, h0+n); wait_full as in the RPC. */
static inline int query_wf(struct pf_client *c, const char *inst, const char *req, uint64_t h0,
                           size_t n, int wait_full, struct pf_query_result *res)
{
    uint8_t *hs = malloc(n * HLEN + 1);
    for (size_t i = 0; i < n; i++)
        hash_of(h0 + i, hs + i * HLEN);
    int rc =
        pf_client_query(c, inst, req, hs, NULL, HLEN, n, wait_full, 0, res, NULL, 0, world_tmo);
    free(hs);
    return rc;
}

static inline int query(struct pf_client *c, const char *inst, const char *req, uint64_t h0,
                        size_t n, struct pf_query_result *res)
{
    return query_wf(c, inst, req, h0, n, 0, res);
}

/* Polls until the n blocks from h0 are all queryable (the insert thread seals them
 * asynchronously after Save returns). Releases the probe lease. */
static inline void wait_sealed(struct pf_client *c, const char *inst, uint64_t h0, size_t n)
{
    uint64_t dl = pft_now_ms() + world_tmo;
    struct pf_query_result res;
    for (;;) {
        PFT_CHECK(query(c, inst, "probe", h0, n, &res) == 0, "probe: %s", pf_last_error_message());
        if (res.lease_len)
            pf_client_release(c, res.lease, res.lease_len, world_tmo);
        if (res.num_hit_blocks == n)
            return;
        PFT_CHECK(pft_now_ms() < dl, "only %u of %zu blocks sealed after %llu ms",
                  res.num_hit_blocks, n, (unsigned long long)world_tmo);
        usleep(2000);
    }
}

/* Loads the lease's n blocks into dst block ids first_dst.. on every rank of w. */
static inline int world_load(struct pf_client *c, struct world *w, const uint8_t *lease, size_t n,
                             uint32_t first_dst, int64_t *state_out)
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
    int rc = 0;
    for (int r = 0; r < w->tp && rc == 0; r++) {
        struct pf_loadstate *ls;
        PFT_CHECK(pf_loadstate_create(&ls) == 0, "loadstate");
        rc = pf_client_load(c, w->id, (uint32_t)r, r, pf_loadstate_name(ls), names, &gsz, 1, &it, 1,
                            world_tmo);
        int64_t st = pf_loadstate_wait(ls, world_tmo);
        if (state_out)
            *state_out = st;
        if (rc == 0 && st != 1)
            rc = -EIO;
        pf_loadstate_destroy(ls);
    }
    free(targets);
    return rc;
}

static inline void compare(struct world *src, uint32_t src_first, struct world *dst,
                           uint32_t dst_first, size_t n)
{
    for (int r = 0; r < src->tp; r++)
        for (int l = 0; l < src->nlayers; l++)
            for (size_t i = 0; i < n; i++)
                PFT_CHECK(
                    kvt_block_equal(&src->kv[r][l], src_first + i, &dst->kv[r][l], dst_first + i),
                    "rank %d layer %d block %zu differs after load (%s <- %s)", r, l, i, dst->id,
                    src->id);
}

/* Checked variants: the test fails with the server's message. */
static inline void world_save_ok(struct pf_client *c, struct world *w, uint64_t h0,
                                 uint32_t first_id, size_t n)
{
    PFT_CHECK(world_save(c, w, h0, first_id, n) == 0, "save %zu block(s) from hash %llu: %s", n,
              (unsigned long long)h0, pf_last_error_message());
}

static inline void world_load_ok(struct pf_client *c, struct world *w, const uint8_t *lease,
                                 size_t n, uint32_t first_dst)
{
    int64_t st = 0;
    int rc = world_load(c, w, lease, n, first_dst, &st);
    PFT_CHECK(rc == 0 && st == 1, "load of %zu block(s): rc=%d state=%lld: %s", n, rc,
              (long long)st, pf_last_error_message());
}

/* Queries until Ready (deadline). Returns whether any answer was Loading. */
static inline bool query_ready(struct pf_client *c, const char *inst, const char *req, uint64_t h0,
                               size_t n, struct pf_query_result *res)
{
    uint64_t dl = pft_now_ms() + world_tmo;
    bool loading = false;
    for (;;) {
        PFT_CHECK(query(c, inst, req, h0, n, res) == 0, "query %s: %s", req,
                  pf_last_error_message());
        if (!res->loading)
            return loading;
        loading = true;
        PFT_CHECK(pft_now_ms() < dl, "query %s still Loading after %llu ms", req,
                  (unsigned long long)world_tmo);
        usleep(2000);
    }
}

/* The value of one series of /metrics (name with its labels, as exposed), or absent when the
 * series is not there. */
static inline double metric_or(struct pft_proc *s, const char *name, double absent)
{
    char *body = NULL;
    int st = pft_http(s->http_host, s->http_port, "GET", "/metrics", &body);
    PFT_CHECK(st == 200, "/metrics status %d", st);
    double v = absent;
    char key[256];
    snprintf(key, sizeof(key), "\n%s ", name);
    char *p = strstr(body, key);
    if (p)
        v = strtod(p + strlen(key), NULL);
    free(body);
    return v;
}

static inline double metric(struct pft_proc *s, const char *name)
{
    return metric_or(s, name, -1);
}

#endif

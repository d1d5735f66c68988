/* Layout worlds for integration tests: instances whose devices register chosen layer sets
 * (MLA page-first replicas and layer-split shards, hybrid storage groups), with seeded
 * fills, per-device saves of chosen block ids, group queries with hit positions, multi-group
 * loads and byte-exact comparison. Header-only (static functions); the including test sets
 * world_seed (world.h). */
#ifndef PF_TEST_LAYOUTS_H
#define PF_TEST_LAYOUTS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/pegaflow.h"
#include "kvsim.h"
#include "pftest.h"
#include "world.h"

#define LW_MAXD 4
#define LW_MAXL 8

struct lw_layer {
    char name[32];
    enum kv_layout lay;
    uint64_t seg;
    uint32_t group;
    unsigned devs; /* bit r: device r registers the layer */
};

struct lworld {
    const char *id, *ns;
    int ndev;
    uint32_t tp_size;
    uint32_t tp_rank[LW_MAXD];
    bool page_first;
    bool replicated; /* every device holds the same bytes for a layer (MLA) */
    uint64_t nblocks, tag;
    int nl;
    struct lw_layer L[LW_MAXL];
    struct kvt kv[LW_MAXD][LW_MAXL];
};

/* ndev devices with tp_rank r % tp_size; layers are added with lw_layer, then lw_create. */
static inline void lw_init(struct lworld *w, const char *id, const char *ns, int ndev,
                           uint32_t tp_size, bool page_first, bool replicated, uint64_t nblocks,
                           uint64_t tag)
{
    memset(w, 0, sizeof(*w));
    w->id = id;
    w->ns = ns;
    w->ndev = ndev;
    w->tp_size = tp_size;
    for (int r = 0; r < ndev; r++)
        w->tp_rank[r] = (uint32_t)r % tp_size;
    w->page_first = page_first;
    w->replicated = replicated;
    w->nblocks = nblocks;
    w->tag = tag;
}

static inline void lw_layer(struct lworld *w, const char *name, enum kv_layout lay, uint64_t seg,
                            uint32_t group, unsigned devs)
{
    struct lw_layer *l = &w->L[w->nl++];
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->lay = lay;
    l->seg = seg;
    l->group = group;
    l->devs = devs;
}

static inline bool lw_has(const struct lworld *w, int r, int l)
{
    return (w->L[l].devs >> r) & 1u;
}

/* Creates every (device, layer) tensor; fill: seeded bytes (tag, layer, block and, unless
 * replicated, device), else zeros. */
static inline void lw_create(struct lworld *w, bool fill)
{
    for (int r = 0; r < w->ndev; r++)
        for (int l = 0; l < w->nl; l++) {
            if (!lw_has(w, r, l))
                continue;
            PFT_CHECK(kvt_create(&w->kv[r][l], w->L[l].lay, w->nblocks, w->L[l].seg, r) == 0,
                      "simkv create");
            uint64_t dev = w->replicated ? 0 : (uint64_t)r;
            for (uint64_t b = 0; fill && b < w->nblocks; b++)
                kvt_fill_block(&w->kv[r][l], b, world_seed,
                               w->tag << 48 | dev << 40 | (uint64_t)l << 32 | b);
        }
}

static inline void lw_free(struct lworld *w)
{
    for (int r = 0; r < w->ndev; r++)
        for (int l = 0; l < w->nl; l++)
            if (lw_has(w, r, l))
                kvt_destroy(&w->kv[r][l]);
}

static inline int lw_register_dev(struct pf_client *c, struct lworld *w, int r)
{
    struct pf_layer_desc d[LW_MAXL];
    size_t n = 0;
    for (int l = 0; l < w->nl; l++)
        if (lw_has(w, r, l)) {
            d[n] = kvt_desc(&w->kv[r][l], w->L[l].name);
            d[n++].group_id = w->L[l].group;
        }
    struct pf_register_args a = {
        .instance_id = w->id,
        .namespace_ = w->ns,
        .tp_rank = w->tp_rank[r],
        .tp_size = w->tp_size,
        .world_size = (uint32_t)w->ndev,
        .device_id = r,
        .page_first = w->page_first,
        .layers = d,
        .nlayers = n,
    };
    return pf_client_register(c, &a, world_tmo);
}

static inline void lw_register(struct pf_client *c, struct lworld *w)
{
    for (int r = 0; r < w->ndev; r++)
        PFT_CHECK(lw_register_dev(c, w, r) == 0, "register %s device %d: %s", w->id, r,
                  pf_last_error_message());
}

/* Device r saves, for every layer it registered whose bit is in lmask, block ids[i] under
 * the hash of position hpos[i] (hash_of). */
static inline int lw_save(struct pf_client *c, struct lworld *w, int r, unsigned lmask,
                          const uint32_t *ids, const uint64_t *hpos, size_t n)
{
    uint8_t *hs = malloc(n * HLEN + 1);
    for (size_t i = 0; i < n; i++)
        hash_of(hpos[i], hs + i * HLEN);
    struct pf_save_layer sl[LW_MAXL];
    size_t k = 0;
    for (int l = 0; l < w->nl; l++)
        if (lw_has(w, r, l) && ((lmask >> l) & 1u))
            sl[k++] = (struct pf_save_layer){
                .name = w->L[l].name, .block_ids = ids, .hashes = hs, .hash_len = HLEN, .n = n};
    int rc = pf_client_save(c, w->id, w->tp_rank[r], 0, r, sl, k, world_tmo);
    free(hs);
    return rc;
}

static inline unsigned lw_group_mask(const struct lworld *w, uint32_t g)
{
    unsigned m = 0;
    for (int l = 0; l < w->nl; l++)
        if (w->L[l].group == g)
            m |= 1u << l;
    return m;
}

/* QueryPrefetch of group g over the hashes of positions hpos[0..n); positions (may be NULL,
 * room for n) receive hit_positions. */
static inline int lw_query(struct pf_client *c, const char *inst, const char *req, uint32_t g,
                           const uint64_t *hpos, size_t n, int wait_full,
                           struct pf_query_result *res, uint32_t *positions)
{
    uint8_t *hs = malloc(n * HLEN + 1);
    for (size_t i = 0; i < n; i++)
        hash_of(hpos[i], hs + i * HLEN);
    int rc = pf_client_query(c, inst, req, hs, NULL, HLEN, n, wait_full, g, res, positions,
                             positions ? n : 0, world_tmo);
    free(hs);
    return rc;
}

/* Queries until Ready (deadline world_tmo); returns how many answers were Loading. */
static inline int lw_query_ready(struct pf_client *c, const char *inst, const char *req, uint32_t g,
                                 const uint64_t *hpos, size_t n, int wait_full,
                                 struct pf_query_result *res, uint32_t *positions)
{
    uint64_t dl = pft_now_ms() + world_tmo;
    int loading = 0;
    for (;;) {
        PFT_CHECK(lw_query(c, inst, req, g, hpos, n, wait_full, res, positions) == 0,
                  "query %s/%s group %u: %s", inst, req, g, pf_last_error_message());
        if (!res->loading)
            return loading;
        loading++;
        PFT_CHECK(pft_now_ms() < dl, "query %s/%s group %u still Loading after %llu ms", inst, req,
                  g, (unsigned long long)world_tmo);
        usleep(2000);
    }
}

/* Polls a group-0 prefix query until all n positions hit (sealing is asynchronous). */
static inline void lw_wait_sealed(struct pf_client *c, const char *inst, const uint64_t *hpos,
                                  size_t n)
{
    uint64_t dl = pft_now_ms() + world_tmo;
    for (;;) {
        struct pf_query_result res;
        PFT_CHECK(lw_query(c, inst, "lw-probe", 0, hpos, n, 0, &res, NULL) == 0, "probe: %s",
                  pf_last_error_message());
        if (res.lease_len)
            pf_client_release(c, res.lease, res.lease_len, world_tmo);
        if (res.num_hit_blocks == n)
            return;
        PFT_CHECK(pft_now_ms() < dl, "only %u of %zu blocks sealed", res.num_hit_blocks, n);
        usleep(2000);
    }
}

/* One lease of a multi-group load: targets[g][i] is the destination of the lease's block i
 * in layer group g (-1 none). */
struct lw_item {
    const uint8_t *lease;
    size_t n;
    const int64_t *targets[4];
};

/* Device r loads the items with layer groups = the storage groups 0..ngroups-1 of w (its
 * own layers of each group). Returns 0 when the RPC succeeded and the state became 1;
 * *state_p (may be NULL) gets the final state. */
static inline int lw_load(struct pf_client *c, struct lworld *w, int r, uint32_t ngroups,
                          const struct lw_item *items, size_t nitems, int64_t *state_p)
{
    const char *names[LW_MAXL];
    size_t gsz[4] = {0}, k = 0;
    for (uint32_t g = 0; g < ngroups; g++)
        for (int l = 0; l < w->nl; l++)
            if (w->L[l].group == g && lw_has(w, r, l)) {
                names[k++] = w->L[l].name;
                gsz[g]++;
            }
    struct pf_load_item it[8];
    int64_t *flat[8];
    size_t cnt[8][4];
    for (size_t i = 0; i < nitems; i++) {
        flat[i] = malloc((items[i].n * ngroups + 1) * sizeof(int64_t));
        for (uint32_t g = 0; g < ngroups; g++) {
            cnt[i][g] = items[i].n;
            for (size_t j = 0; j < items[i].n; j++)
                flat[i][g * items[i].n + j] = items[i].targets[g] ? items[i].targets[g][j] : -1;
        }
        it[i] = (struct pf_load_item){.lease = items[i].lease,
                                      .lease_len = PF_LEASE_LEN,
                                      .targets = flat[i],
                                      .group_counts = cnt[i]};
    }
    struct pf_loadstate *ls;
    PFT_CHECK(pf_loadstate_create(&ls) == 0, "loadstate");
    int rc = pf_client_load(c, w->id, w->tp_rank[r], r, pf_loadstate_name(ls), names, gsz, ngroups,
                            it, nitems, world_tmo);
    int64_t st = rc == 0 ? pf_loadstate_wait(ls, world_tmo) : pf_loadstate_get(ls);
    if (state_p)
        *state_p = st;
    if (rc == 0 && st != 1)
        rc = -EIO;
    pf_loadstate_destroy(ls);
    for (size_t i = 0; i < nitems; i++)
        free(flat[i]);
    return rc;
}

static inline void lw_load_ok(struct pf_client *c, struct lworld *w, int r, uint32_t ngroups,
                              const struct lw_item *items, size_t nitems)
{
    int64_t st = 0;
    int rc = lw_load(c, w, r, ngroups, items, nitems, &st);
    PFT_CHECK(rc == 0 && st == 1, "load on %s device %d: rc=%d state=%lld: %s", w->id, r, rc,
              (long long)st, pf_last_error_message());
}

/* Layer l of device r of dst holds, in blocks dids[i], what device sr of src holds in blocks
 * sids[i]. */
static inline void lw_compare(const struct lworld *src, int sr, const struct lworld *dst, int r,
                              int l, const uint32_t *sids, const int64_t *dids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        PFT_CHECK(kvt_block_equal(&src->kv[sr][l], sids[i], &dst->kv[r][l], (uint64_t)dids[i]),
                  "%s device %d layer %s block %lld differs from %s device %d block %u", dst->id, r,
                  dst->L[l].name, (long long)dids[i], src->id, sr, sids[i]);
}

static inline bool lw_zero(const struct lworld *w, int r, int l, uint64_t b)
{
    return kvt_block_zero(&w->kv[r][l], b);
}

/* ---- the model families ---- */

/* An MLA-like page-first instance: ndev replicas of layers m.0..m.2 (distinct sizes, one of
 * them K/V adjacent), or with split, a layer split: devices of even index hold m.0, m.1,
 * devices of odd index m.2, m.3 (each half replicated over ndev/2 devices). */
static inline void lw_mla(struct lworld *w, const char *id, const char *ns, int ndev, bool split,
                          uint64_t nblocks, uint64_t tag, bool fill)
{
    lw_init(w, id, ns, ndev, 1, true, true, nblocks, tag);
    unsigned all = (1u << ndev) - 1, even = 0x5u & all, odd = 0xau & all;
    if (!split) {
        lw_layer(w, "m.0", KV_CONTIG, 4096, 0, all);
        lw_layer(w, "m.1", KV_ADJACENT, 2048, 0, all);
        lw_layer(w, "m.2", KV_CONTIG, 12288, 0, all);
    } else {
        lw_layer(w, "m.0", KV_CONTIG, 4096, 0, even);
        lw_layer(w, "m.1", KV_CONTIG, 1000, 0, even);
        lw_layer(w, "m.2", KV_ADJACENT, 2048, 0, odd);
        lw_layer(w, "m.3", KV_CONTIG, 8192, 0, odd);
    }
    lw_create(w, fill);
}

/* The same layers registered layer-first with tp_size ndev: every rank stores its own copy
 * (the layout page-first collapses). */
static inline void lw_mla_uncollapsed(struct lworld *w, const char *id, const char *ns, int ndev,
                                      uint64_t nblocks, uint64_t tag)
{
    lw_init(w, id, ns, ndev, (uint32_t)ndev, false, true, nblocks, tag);
    unsigned all = (1u << ndev) - 1;
    lw_layer(w, "m.0", KV_CONTIG, 4096, 0, all);
    lw_layer(w, "m.1", KV_ADJACENT, 2048, 0, all);
    lw_layer(w, "m.2", KV_CONTIG, 12288, 0, all);
    lw_create(w, true);
}

/* Striped page-first saves: each device saves the blocks ids[i] with
 * ids[i] % replicas == its index among the devices holding the same layer set (the
 * connector's _block_shard), every layer of its shard, hash of position ids[i]. */
static inline void lw_save_striped(struct pf_client *c, struct lworld *w, const uint32_t *ids,
                                   size_t n)
{
    for (int r = 0; r < w->ndev; r++) {
        unsigned mine = 0;
        for (int l = 0; l < w->nl; l++)
            mine |= (unsigned)lw_has(w, r, l) << l;
        int k = 0, m = 0;
        for (int q = 0; q < w->ndev; q++) {
            unsigned other = 0;
            for (int l = 0; l < w->nl; l++)
                other |= (unsigned)lw_has(w, q, l) << l;
            if (other == mine) {
                if (q < r)
                    k++;
                m++;
            }
        }
        uint32_t sid[256];
        uint64_t hp[256];
        size_t k2 = 0;
        for (size_t i = 0; i < n; i++)
            if (ids[i] % (uint32_t)m == (uint32_t)k) {
                sid[k2] = ids[i];
                hp[k2++] = ids[i];
            }
        PFT_CHECK(lw_save(c, w, r, ~0u, sid, hp, k2) == 0, "striped save on device %d: %s", r,
                  pf_last_error_message());
    }
}

/* On dst: query (group 0) the hashes of positions ids[0..n) until Ready, expect all n, load
 * them on every device into ids[i] + off and compare every layer with src. Returns how
 * many answers were Loading. */
static inline int lw_fetch_all(struct pf_client *c, struct lworld *dst, const struct lworld *src,
                               const char *req, const uint32_t *ids, size_t n, int64_t off)
{
    uint64_t hp[256];
    uint32_t sid[256];
    int64_t did[256];
    for (size_t i = 0; i < n; i++) {
        hp[i] = ids[i];
        sid[i] = ids[i];
        did[i] = ids[i] + off;
    }
    struct pf_query_result res;
    int loading = lw_query_ready(c, dst->id, req, 0, hp, n, 0, &res, NULL);
    PFT_CHECK(res.num_hit_blocks == n && res.lease_len == PF_LEASE_LEN,
              "%s: %u of %zu blocks hit (lease %u)", req, res.num_hit_blocks, n, res.lease_len);
    struct lw_item it = {.lease = res.lease, .n = n, .targets = {did}};
    for (int r = 0; r < dst->ndev; r++) {
        lw_load_ok(c, dst, r, 1, &it, 1);
        for (int l = 0; l < dst->nl; l++) {
            if (!lw_has(dst, r, l))
                continue;
            int sr = 0;
            while (!lw_has(src, sr, l))
                sr++;
            lw_compare(src, sr, dst, r, l, sid, did, n);
        }
    }
    return loading;
}

/* A hybrid model: attention layers a.0, a.1 (group 0, KV-first split) and recurrent layers
 * r.conv, r.ssm (group 1, one segment each), on ndev TP ranks. */
static inline void lw_hybrid(struct lworld *w, const char *id, const char *ns, int ndev,
                             uint64_t nblocks, uint64_t tag, bool fill)
{
    lw_init(w, id, ns, ndev, (uint32_t)ndev, false, false, nblocks, tag);
    unsigned all = (1u << ndev) - 1;
    lw_layer(w, "a.0", KV_SPLIT, 2048, 0, all);
    lw_layer(w, "r.conv", KV_CONTIG, 1536, 1, all);
    lw_layer(w, "a.1", KV_SPLIT, 2048, 0, all);
    lw_layer(w, "r.ssm", KV_CONTIG, 8192, 1, all);
    lw_create(w, fill);
}

/* The hybrid saves: attention blocks at ids 1..natt under positions 0..natt-1; recurrent
 * state for the sparse positions rpos[0..nr) from ids rid[]. Device 0 saves both groups in
 * one Save (each layer with its own block list), the others one Save per group. */
static inline void lw_hybrid_save(struct pf_client *c, struct lworld *w, size_t natt,
                                  const uint64_t *rpos, const uint32_t *rid, size_t nr)
{
    uint32_t aid[64];
    uint64_t apos[64];
    uint8_t ah[64 * HLEN], rh[16 * HLEN];
    for (size_t i = 0; i < natt; i++) {
        aid[i] = (uint32_t)i + 1;
        apos[i] = i;
        hash_of(i, ah + i * HLEN);
    }
    for (size_t i = 0; i < nr; i++)
        hash_of(rpos[i], rh + i * HLEN);
    unsigned ga = lw_group_mask(w, 0), gr = lw_group_mask(w, 1);
    struct pf_save_layer sl[LW_MAXL];
    size_t k = 0;
    for (int l = 0; l < w->nl; l++) {
        bool att = w->L[l].group == 0;
        sl[k++] = (struct pf_save_layer){.name = w->L[l].name,
                                         .block_ids = att ? aid : rid,
                                         .hashes = att ? ah : rh,
                                         .hash_len = HLEN,
                                         .n = att ? natt : nr};
    }
    PFT_CHECK(pf_client_save(c, w->id, w->tp_rank[0], 0, 0, sl, k, world_tmo) == 0,
              "mixed-group save on device 0: %s", pf_last_error_message());
    for (int r = 1; r < w->ndev; r++) {
        PFT_CHECK(lw_save(c, w, r, gr, rid, rpos, nr) == 0, "recurrent save: %s",
                  pf_last_error_message());
        PFT_CHECK(lw_save(c, w, r, ga, aid, apos, natt) == 0, "attention save: %s",
                  pf_last_error_message());
    }
}

/* On dst: the attention prefix (group 0, natt positions) and the recurrent want-set
 * (group 1, wait_for_full_prefix, positions rpos) until Ready, then one Load of both leases
 * on every device (attention to ids 1+aoff.., recurrent to 40..), compared with src.
 * loading_p (may be NULL) gets the number of Loading answers of each query. */
static inline void lw_hybrid_fetch(struct pf_client *c, struct lworld *dst,
                                   const struct lworld *src, const char *req, size_t natt,
                                   const uint64_t *rpos, const uint32_t *rid, size_t nr,
                                   int64_t aoff, int *loading_p)
{
    uint64_t apos[64];
    uint32_t asrc[64];
    int64_t adst[64], rdst[16], none[64];
    for (size_t i = 0; i < natt; i++) {
        apos[i] = i;
        asrc[i] = (uint32_t)i + 1;
        adst[i] = (int64_t)i + 1 + aoff;
        none[i] = -1;
    }
    for (size_t i = 0; i < nr; i++)
        rdst[i] = 40 + (int64_t)i;
    struct pf_query_result ra, rr;
    uint32_t posv[16];
    int la = lw_query_ready(c, dst->id, req, 0, apos, natt, 0, &ra, NULL);
    PFT_CHECK(ra.num_hit_blocks == natt && ra.lease_len, "%s attention: %u of %zu hit", req,
              ra.num_hit_blocks, natt);
    int lr = lw_query_ready(c, dst->id, req, 1, rpos, nr, 1, &rr, posv);
    if (loading_p) {
        loading_p[0] = la;
        loading_p[1] = lr;
    }
    PFT_CHECK(rr.num_hit_blocks == nr && rr.lease_len && rr.nhit_positions == nr,
              "%s recurrent want-set: %u of %zu hit, %u positions", req, rr.num_hit_blocks, nr,
              rr.nhit_positions);
    for (size_t i = 0; i < nr; i++)
        PFT_CHECK(posv[i] == i, "want-set position %zu is %u", i, posv[i]);
    struct lw_item it[2] = {{.lease = ra.lease, .n = natt, .targets = {adst, none}},
                            {.lease = rr.lease, .n = nr, .targets = {none, rdst}}};
    for (int r = 0; r < dst->ndev; r++) {
        lw_load_ok(c, dst, r, 2, it, 2);
        for (int l = 0; l < dst->nl; l++) {
            if (dst->L[l].group == 0)
                lw_compare(src, r, dst, r, l, asrc, adst, natt);
            else
                lw_compare(src, r, dst, r, l, rid, rdst, nr);
        }
    }
}

#endif

/* Glue between the engine and the server-side MetaServer client: sealed (and promoted)
 * blocks are advertised, evicted ones withdrawn, reclaimable hints applied to the RAM cache,
 * and resync/refresh enumerate the resident blocks. Runs of blocks of one namespace become
 * one command each; the client copies what it queues, so nothing here blocks. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "server"
#include "app/server_meta.h"
#include "pf/block.h"
#include "pf/cache.h"
#include "pf/log.h"
#include "pf/ssd.h"

static void send_runs(struct pf_meta_client *mc, struct pf_block *const *b, size_t n, bool insert)
{
    struct pf_meta_hash hs[512];
    struct pf_block_key keys[512]; /* block records keep long hashes in two pieces */
    size_t i = 0;
    while (i < n) {
        uint32_t ns = pf_block_ns(b[i]);
        size_t k = 0;
        while (i < n && pf_block_ns(b[i]) == ns && k < PF_ARRAY_SIZE(hs)) {
            keys[k] = pf_block_key(b[i]);
            hs[k].data = keys[k].hash;
            hs[k].len = keys[k].len;
            k++;
            i++;
        }
        const char *name = pf_ns_name(ns);
        int rc = insert ? pf_meta_client_insert(mc, name, hs, k)
                        : pf_meta_client_remove(mc, name, hs, k);
        if (rc == 0)
            pf_debug("MetaServer %s: %zu block(s) of %s queued",
                     insert ? "registration" : "removal", k, name);
        if (rc && rc != -EAGAIN)
            pf_log_ratelimited(PF_LOG_WARN, 60000, "MetaServer %s of %zu block(s) not queued: %s",
                               insert ? "registration" : "removal", k, strerror(-rc));
    }
}

struct glue {
    struct pf_engine *e;
    /* set once the client exists (after the gRPC bind); hooks run before that see NULL and
     * skip: the client's first session resyncs every resident block anyway */
    _Atomic(struct pf_meta_client *) mc;
    struct pf_ssd *ssd; /* set before the client starts */
};

static void on_sealed(void *ctx, struct pf_block *const *b, size_t n)
{
    struct glue *g = ctx;
    struct pf_meta_client *mc = atomic_load_explicit(&g->mc, memory_order_acquire);
    if (mc)
        send_runs(mc, b, n, true);
}

static void on_evicted(void *ctx, struct pf_block *const *b, size_t n)
{
    struct glue *g = ctx;
    struct pf_meta_client *mc = atomic_load_explicit(&g->mc, memory_order_acquire);
    if (mc)
        send_runs(mc, b, n, false);
}

static struct glue the_glue; /* one engine per server process */

static void apply_reclaimable(void *ctx, const char *ns, const struct pf_meta_hash *hashes,
                              size_t n)
{
    struct glue *g = ctx;
    uint32_t id;
    if (pf_ns_lookup(ns, &id) != 0)
        return;
    struct pf_block_key *keys = malloc((n ? n : 1) * sizeof(*keys));
    if (!keys)
        return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (pf_key_make(id, hashes[i].data, hashes[i].len, &keys[k]) == 0)
            k++;
    size_t moved = pf_cache_mark_reclaimable(pf_engine_cache(g->e), keys, k);
    free(keys);
    if (moved)
        pf_debug("%zu block(s) of %s are redundant in the cluster: now reclaimable", moved, ns);
}

struct enum_ctx {
    pf_meta_emit_fn emit;
    void *emit_ctx;
    int rc;
};

static void emit_block(void *ctx, const struct pf_block *b)
{
    struct enum_ctx *ec = ctx;
    if (ec->rc != 0)
        return;
    struct pf_block_key key = pf_block_key(b);
    ec->rc = ec->emit(ec->emit_ctx, pf_ns_name(key.ns), key.hash, key.len);
}

static int emit_key(void *ctx, const struct pf_block_key *k)
{
    struct enum_ctx *ec = ctx;
    ec->rc = ec->emit(ec->emit_ctx, pf_ns_name(k->ns), k->hash, k->len);
    return ec->rc;
}

static int enumerate_resident(void *ctx, pf_meta_emit_fn emit, void *emit_ctx)
{
    struct glue *g = ctx;
    struct enum_ctx ec = {emit, emit_ctx, 0};
    pf_cache_for_each(pf_engine_cache(g->e), emit_block, &ec);
    /* and the node's SSD blocks (a key in both is registered twice: inserts are idempotent) */
    if (ec.rc == 0 && g->ssd)
        pf_ssd_for_each_key(g->ssd, emit_key, &ec);
    return ec.rc;
}

static void on_recovered(void *ctx, uint64_t blocks)
{
    struct glue *g = ctx;
    struct pf_meta_client *mc = atomic_load_explicit(&g->mc, memory_order_acquire);
    pf_info("SSD recovery: %llu block(s) to register with the MetaServer%s",
            (unsigned long long)blocks, mc ? "" : " (at the first session)");
    if (mc)
        pf_meta_client_resync(mc);
}

void pf_server_meta_set_ssd(struct pf_ssd *ssd)
{
    the_glue.ssd = ssd;
    pf_ssd_set_recovered(ssd, on_recovered, &the_glue);
}

int pf_server_meta_hooks(struct pf_engine *e)
{
    the_glue.e = e;
    struct pf_engine_hooks h = {.sealed = on_sealed, .evicted = on_evicted, .ctx = &the_glue};
    return pf_engine_add_hooks(e, &h);
}

int pf_server_meta_start(struct pf_engine *e, const char *target, const char *advertise,
                         size_t queue_depth, struct pf_meta_client **mc_p)
{
    struct glue *g = &the_glue;
    g->e = e;
    struct pf_meta_client_config cfg = {
        .target = target,
        .advertise_addr = advertise,
        .queue_depth = queue_depth,
        .apply_reclaimable = apply_reclaimable,
        .enumerate_resident = enumerate_resident,
        .cb_ctx = g,
    };
    struct pf_meta_client *mc;
    int rc = pf_meta_client_create(&cfg, &mc);
    if (rc)
        return rc;
    atomic_store_explicit(&g->mc, mc, memory_order_release);
    pf_info("MetaServer client: %s, advertising %s as node %s", target, advertise,
            pf_meta_client_node_id(mc));
    *mc_p = mc;
    return 0;
}

void pf_server_meta_detach(void)
{
    atomic_store_explicit(&the_glue.mc, NULL, memory_order_release);
}

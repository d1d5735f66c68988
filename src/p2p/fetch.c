/* The requester: the "rdma" tier (reference §7.4, §7.6, §7.7), a remote tier of the engine's
 * query-time plan (docs/p2p.md "The plan").
 *
 * discover (query thread, discover.c): while fetching is enabled, the MetaServer client has a
 * session and the req_id is not blacklisted, QueryPrefixBlocks within the short plan deadline
 * (--p2p-plan-timeout-ms): the first PF_P2P_PLAN_HEAD hashes, and the whole suffix only when
 * a holder has all of those; this node excluded, the holders ranked: live before those
 * inside their down window (a failed handshake or fetch within peer_down_ms), then the
 * longest advertised prefix, then the fewest fetches in flight from this node. The MetaServer
 * answers only nodes whose heartbeat is within its stale window. Otherwise -1: the plan uses
 * local tiers only, without waiting.
 *
 * fetch_from (remote prefetch pool): steps 2-7 below against one ranked holder, for exactly
 * the blocks the engine still misses; a holder inside its down window is not contacted.
 *
 * fetch (the polling run of wait_for_full_prefix), one round:
 *   1. discovery: QueryPrefixBlocks for the suffix, this node excluded, the node with the
 *      longest prefix wins (wait_for_full_prefix: only a node holding the whole suffix, polled
 *      every 10 ms for up to 30 s). MetaServer errors mean "no remote" (logged, rate-limited).
 *   2. lease QPs of a connection to that node (handshake on first use, single-flight);
 *   3. QueryBlocksForTransfer for the advertised prefix: the holder locks what it still has
 *      and answers per-slot addresses and checksums; only the run matching our keys from the
 *      first one is used. From here exactly one ReleaseTransferLock is queued, whatever
 *      happens (single exit below).
 *   4. staging: segments are grouped by NUMA node and sorted by remote address, then
 *      bump-allocated from this node's pool (pf_engine_alloc, chunks of at most 256 MiB
 *      sized to what remains) with seg_stride = round_up(seg_len, 512); an allocation
 *      failure aborts the fetch but keeps the connection (the reference drops it: #401).
 *   5. READs: remote-contiguous segments that are also contiguous in staging merge into one
 *      READ of at most 1 MiB (PEGAFLOW_P2P_MAX_READ; a larger segment, up to 4 MiB, is one
 *      READ of its own, and unless the variable is set a slot's V joins the READ that ends
 *      with its K up to 4 MiB, for the receive-path checksum) inside one remote region;
 *      each READ goes to a
 * NIC on the staging memory's NUMA node (else any), round-robin, and then to whichever leased QP of
 * that NIC has room; deadline max(lock timeout - 60 s, 10 s). A connection that turns out to be
 * stale (a reused one failing before any READ completed) is replaced once.
 *   6. on error or timeout the QPs are invalidated inside p2p_xfer_run before it returns,
 *      the connection leaves the table, and only then is the staging memory released; the
 *      timeout is logged as an error ("connection invalidated, transfer lock force-released").
 *   7. every slot is verified against the holder's checksum, each block as soon as its last
 *      READ landed, by the verification workers NUMA-local to its staging memory (verify.c;
 *      the posting thread keeps posting and polling meanwhile), and the transfer returns
 *      only after every verdict is in; the first mismatch ends the
 *      fetched run (a miss, never wrong bytes; pegaflow_integrity_failures_total{tier="remote"});
 *      the verified blocks are built as sealed blocks referencing the staging chunks.
 * A fetch that got less than the holder advertised blacklists the req_id for remote fetch
 * for 5 minutes, so the next query for it falls through to SSD (reference "failed remote"). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/cache.h"
#include "pf/clock.h"
#include "pf/engine.h"
#include "pf/log.h"
#include "pf/meta_client.h"
#include "pf/pool.h"

struct seg {
    uint64_t raddr;
    uint8_t *local;
    uint32_t len, stride;
    uint32_t block;
    uint16_t slot;
    uint8_t v; /* 0 = K, 1 = V */
    int16_t numa;
    uint32_t chunk;
};

struct chunk {
    struct pf_alloc *a;
    uint64_t used;
    int region;
    int numa;
};

struct fetch {
    struct pf_p2p *p;
    const char *req_id;
    const struct pf_block_key *keys;
    char peer[P2P_ADDR_MAX];
    size_t want; /* blocks the peer advertised (and we asked for) */
    Pegaflow__QueryBlocksForTransferResponse *resp;
    char session[PF_P2P_SESSION_ID_MAX + 1];
    uint64_t lock_ms;
    size_t k; /* blocks of the reply we use: the run matching keys[0..) */
    struct seg *segs;
    size_t nsegs;
    struct chunk *chunks;
    size_t nchunks, capchunks;
    struct p2p_read *reads;
    size_t nreads;
    struct p2p_lease lease;
    uint64_t bytes;
    /* (block, slot, K/V) -> segment: where[spos[sbase[block] + slot] + v] */
    size_t *where, *sbase, *spos;
    uint32_t *pending; /* per block: segments not landed yet (this attempt) */
    int8_t *verdict;   /* per block: 1 verified, -1 checksum mismatch, 0 not checked yet */
    uint16_t *bad_slot;
    struct p2p_vjob *vjobs; /* per block: its verification job (verify.c) */
    /* receive-path digests (integrity on): per READ its request, per range its lengths,
     * results and the (block, slot) it checks; per block the slots a digest verified */
    struct pf_net_digest *digs;
    uint32_t *dig_lens, *dig_block;
    uint16_t *dig_slot;
    uint64_t *dig_out;
    uint16_t *dig_ok;
    struct p2p_vgroup vg;
    bool vg_init;
    char err[2 * P2P_ERRLEN];
};

static const char *ns_of(const struct pf_block_key *k)
{
    return pf_ns_name(k->ns);
}

/* 1. Discovery (discover.c). 0 with f->peer / f->want set, or -ENOENT, -ECANCELED. */
static int discover(struct fetch *f, size_t n, bool all_or_nothing)
{
    return p2p_discover_holder(f->p, f->req_id, f->keys, n, all_or_nothing, f->peer,
                               sizeof(f->peer), &f->want);
}

/* A slot descriptor this node can READ: sizes within one READ (so its stride cannot wrap),
 * V the size of K when present. */
static bool slot_ok(const Pegaflow__TransferSlotInfo *s)
{
    if (s->k_ptr == 0 || s->k_size == 0 || s->k_size > PF_P2P_MAX_READ)
        return false;
    if (s->v_ptr == 0)
        return s->v_size == 0;
    return s->v_size == s->k_size;
}

/* 3. QueryBlocksForTransfer; sets session, lock_ms and the usable run k. */
static int query_blocks(struct fetch *f)
{
    struct pf_p2p *p = f->p;
    ProtobufCBinaryData *hs = malloc(f->want * sizeof(*hs));
    if (!hs)
        return -ENOMEM;
    for (size_t i = 0; i < f->want; i++)
        hs[i] = (ProtobufCBinaryData){f->keys[i].len, (uint8_t *)f->keys[i].hash};
    Pegaflow__QueryBlocksForTransferRequest req = PEGAFLOW__QUERY_BLOCKS_FOR_TRANSFER_REQUEST__INIT;
    req.namespace_ = (char *)ns_of(&f->keys[0]);
    req.n_block_hashes = f->want;
    req.block_hashes = hs;
    req.requester_id = p->self_addr;
    ProtobufCMessage *resp = NULL;
    char e2[P2P_ERRLEN];
    int rc = p->tr->call(p->tr->ctx, f->peer, PF_P2P_QUERY_BLOCKS, &req.base, PF_P2P_RPC_TIMEOUT_MS,
                         &resp, e2, sizeof(e2));
    free(hs);
    if (rc) {
        snprintf(f->err, sizeof(f->err), "QueryBlocksForTransfer failed: %s", e2);
        return rc;
    }
    f->resp = (void *)resp;
    const Pegaflow__QueryBlocksForTransferResponse *r = f->resp;
    if (r->transfer_session_id && *r->transfer_session_id &&
        strlen(r->transfer_session_id) <= PF_P2P_SESSION_ID_MAX)
        snprintf(f->session, sizeof(f->session), "%s", r->transfer_session_id);
    if (r->status && !r->status->ok) {
        snprintf(f->err, sizeof(f->err), "QueryBlocksForTransfer refused: %s",
                 r->status->message ? r->status->message : "");
        return -EIO;
    }
    f->lock_ms = (r->lock_timeout_secs ? r->lock_timeout_secs : PF_P2P_DEFAULT_LOCK_SECS) * 1000;
    size_t k = 0;
    while (k < r->n_blocks && k < f->want) {
        const Pegaflow__TransferBlockInfo *b = r->blocks[k];
        if (b->block_hash.len != f->keys[k].len ||
            memcmp(b->block_hash.data, f->keys[k].hash, b->block_hash.len) != 0)
            break; /* the holder lost this one: the run ends here */
        bool ok = b->n_slots > 0 && b->n_slots <= UINT16_MAX;
        for (size_t s = 0; ok && s < b->n_slots; s++)
            ok = slot_ok(b->slots[s]);
        if (!ok) {
            pf_log_ratelimited(PF_LOG_WARN, 10000,
                               "%s answered a malformed transfer descriptor for block %zu; "
                               "fetching only the blocks before it",
                               f->peer, k);
            break;
        }
        /* with --integrity on, bytes that cannot be verified are not taken (a holder
         * running with --integrity off sends no checksums) */
        bool sums = true;
        for (size_t s = 0; p->cfg.integrity && s < b->n_slots; s++)
            sums = sums && b->slots[s]->has_checksum;
        if (!sums) {
            pf_log_ratelimited(PF_LOG_WARN, 10000,
                               "%s sent block %zu without checksums (is it running with "
                               "--integrity off?); with --integrity on this node fetches only "
                               "verifiable blocks",
                               f->peer, k);
            break;
        }
        k++;
    }
    f->k = k;
    return 0;
}

static int seg_cmp(const void *a, const void *b)
{
    const struct seg *x = a, *y = b;
    if (x->numa != y->numa)
        return x->numa < y->numa ? -1 : 1;
    return x->raddr < y->raddr ? -1 : x->raddr > y->raddr;
}

static int add_chunk(struct fetch *f, uint64_t size, int numa)
{
    struct pf_p2p *p = f->p;
    if (f->nchunks == f->capchunks) {
        size_t nc = f->capchunks ? f->capchunks * 2 : 8;
        struct chunk *c = realloc(f->chunks, nc * sizeof(*c));
        if (!c)
            return -ENOMEM;
        f->chunks = c;
        f->capchunks = nc;
    }
    struct pf_alloc *a;
    int rc = pf_engine_alloc(p->engine, size, numa, &a);
    if (rc)
        return rc;
    int r = p2p_local_region(p, a->ptr, a->size);
    if (r < 0) { /* cannot happen: every pool allocation lies in a region */
        pf_alloc_put(a);
        return -EFAULT;
    }
    f->chunks[f->nchunks++] = (struct chunk){a, 0, r, p->rnuma[r]};
    return 0;
}

/* 4. Staging: every segment of the k blocks gets its place in this node's pool. */
static int plan_staging(struct fetch *f)
{
    struct pf_p2p *p = f->p;
    const Pegaflow__QueryBlocksForTransferResponse *r = f->resp;
    size_t n = 0;
    for (size_t j = 0; j < f->k; j++)
        for (size_t s = 0; s < r->blocks[j]->n_slots; s++)
            n += r->blocks[j]->slots[s]->v_ptr ? 2 : 1;
    f->segs = malloc(n * sizeof(*f->segs));
    if (!f->segs)
        return -ENOMEM;
    for (size_t j = 0; j < f->k; j++)
        for (size_t s = 0; s < r->blocks[j]->n_slots; s++) {
            const Pegaflow__TransferSlotInfo *si = r->blocks[j]->slots[s];
            /* PF_WIRE_NUMA_NONE, or a node this pool has no region on: no NUMA preference */
            int numa = si->numa_node > INT32_MAX ? -1 : (int)si->numa_node;
            if (numa < 0 || pf_pool_region_index(p->pool, numa) < 0)
                numa = -1;
            for (int v = 0; v < (si->v_ptr ? 2 : 1); v++)
                f->segs[f->nsegs++] = (struct seg){
                    .raddr = v ? si->v_ptr : si->k_ptr,
                    .len = (uint32_t)si->k_size,
                    .stride = (uint32_t)pf_round_up(si->k_size, 512),
                    .block = (uint32_t)j,
                    .slot = (uint16_t)s,
                    .v = (uint8_t)v,
                    .numa = (int16_t)numa,
                };
        }
    qsort(f->segs, f->nsegs, sizeof(*f->segs), seg_cmp);
    size_t i = 0;
    while (i < f->nsegs) {
        size_t g = i;
        uint64_t left = 0;
        while (g < f->nsegs && f->segs[g].numa == f->segs[i].numa)
            left += f->segs[g++].stride;
        struct chunk *c = NULL;
        for (; i < g; i++) {
            struct seg *s = &f->segs[i];
            if (!c || c->used + s->stride > c->a->size) {
                uint64_t want = left < PF_P2P_STAGING_CHUNK ? left : PF_P2P_STAGING_CHUNK;
                if (want < s->stride)
                    want = s->stride;
                int rc = add_chunk(f, want, s->numa);
                if (rc)
                    return rc;
                c = &f->chunks[f->nchunks - 1];
            }
            s->local = (uint8_t *)c->a->ptr + c->used;
            s->chunk = (uint32_t)(f->nchunks - 1);
            c->used += s->stride;
            left -= s->stride;
            f->bytes += s->len;
        }
    }
    /* segs are sorted by remote address: map (block, slot, K/V) back to them. spos[] is
     * the position of each slot's first segment in block-major, slot-major, K-then-V order */
    size_t nslots = 0;
    for (size_t j = 0; j < f->k; j++)
        nslots += r->blocks[j]->n_slots;
    f->where = malloc((f->nsegs ? f->nsegs : 1) * sizeof(*f->where));
    f->sbase = malloc((f->k + 1) * sizeof(*f->sbase));
    f->spos = malloc((nslots ? nslots : 1) * sizeof(*f->spos));
    f->pending = calloc(f->k, sizeof(*f->pending));
    f->verdict = calloc(f->k, sizeof(*f->verdict));
    f->bad_slot = calloc(f->k, sizeof(*f->bad_slot));
    f->vjobs = calloc(f->k, sizeof(*f->vjobs));
    f->dig_ok = calloc(f->k, sizeof(*f->dig_ok));
    if (!f->where || !f->sbase || !f->spos || !f->pending || !f->verdict || !f->bad_slot ||
        !f->vjobs || !f->dig_ok)
        return -ENOMEM;
    size_t si = 0, pos = 0;
    for (size_t j = 0; j < f->k; j++) {
        f->sbase[j] = si;
        for (size_t s = 0; s < r->blocks[j]->n_slots; s++) {
            f->spos[si++] = pos;
            pos += r->blocks[j]->slots[s]->v_ptr ? 2 : 1;
        }
    }
    for (size_t k = 0; k < f->nsegs; k++) {
        const struct seg *s = &f->segs[k];
        f->where[f->spos[f->sbase[s->block] + s->slot] + s->v] = k;
    }
    return 0;
}

/* Verifies block j's slots against the holder's checksums (those it sent): 1 or -1. */
static int8_t verify_block(struct fetch *f, size_t j)
{
    const Pegaflow__TransferBlockInfo *bi = f->resp->blocks[j];
    size_t pos = f->spos[f->sbase[j]];
    for (size_t s = 0; s < bi->n_slots; s++) {
        const Pegaflow__TransferSlotInfo *si = bi->slots[s];
        const struct seg *k = &f->segs[f->where[pos++]];
        struct pf_slot sl = {.k = k->local, .seg_len = k->len, .nseg = 1};
        if (si->v_ptr) {
            sl.v = f->segs[f->where[pos++]].local;
            sl.nseg = 2;
        }
        if (si->has_checksum && !pf_slot_verify(&sl, si->checksum)) {
            f->bad_slot[j] = (uint16_t)s;
            return -1;
        }
    }
    return 1;
}

/* A block's verification job (worker or inline): its verdict and, on a mismatch, the slot. */
static void verify_job(void *ctx, size_t j)
{
    struct fetch *f = ctx;
    if (f->p->cfg.verify_hook)
        f->p->cfg.verify_hook(f->p->cfg.verify_hook_ctx, j);
    f->verdict[j] = verify_block(f, j);
    pf_child_add(f->p->c_ver_worker, 1);
}

/* READ i's receive-path digests against the holder's checksums: a matching slot counts
 * in dig_ok, a mismatch decides its block (-1). */
static void check_digests(struct fetch *f, const struct p2p_read *rd)
{
    const struct pf_net_digest *d = rd->dig;
    size_t r0 = (size_t)(d->lens - f->dig_lens);
    for (uint32_t k = 0; k < d->n; k++) {
        if (d->lens[k] & PF_NET_DIGEST_SKIP)
            continue;
        uint32_t b = f->dig_block[r0 + k];
        uint16_t sl = f->dig_slot[r0 + k];
        const Pegaflow__TransferSlotInfo *si = f->resp->blocks[b]->slots[sl];
        if (!si->has_checksum || d->out[k] == si->checksum) {
            f->dig_ok[b]++;
        } else if (f->verdict[b] == 0) {
            f->verdict[b] = -1;
            f->bad_slot[b] = sl;
        }
    }
}

/* READ i landed: the blocks it completed go to the verification workers (NUMA-local to
 * the staging memory) while this thread keeps posting and polling the other READs; without
 * workers they are verified here, between polls. Nothing reads a verdict before
 * p2p_verify_wait (transfer). */
static void on_read(void *ctx, size_t i, bool digested)
{
    struct fetch *f = ctx;
    const struct p2p_read *rd = &f->reads[i];
    if (digested && rd->dig)
        check_digests(f, rd);
    for (uint32_t s = rd->seg0; s < rd->seg0 + rd->nseg; s++) {
        uint32_t b = f->segs[s].block;
        if (--f->pending[b] != 0 || !f->p->cfg.integrity)
            continue;
        if (f->verdict[b] == 0 && f->dig_ok[b] == f->resp->blocks[b]->n_slots) {
            f->verdict[b] = 1; /* every slot checked as it landed: no second pass */
            pf_child_add(f->p->c_ver_receive, 1);
            continue;
        }
        if (f->verdict[b] != 0) { /* a digest mismatch decided it */
            pf_child_add(f->p->c_ver_receive, 1);
            continue;
        }
        struct p2p_vjob *j = &f->vjobs[b];
        *j = (struct p2p_vjob){.g = &f->vg, .fn = verify_job, .ctx = f, .arg = b};
        p2p_verify_submit(f->p, f->chunks[f->segs[s].chunk].numa, j);
    }
}

/* Receive-path digest requests (HAL struct pf_net_digest) for the READs just built: a
 * slot whose segments all travel in one READ, in order (K then V, adjacent: a READ's
 * segments are contiguous), gets one range whose xxh3 is the slot's checksum; segments of
 * slots split across READs are skipped ranges (their blocks keep the verification pass).
 * A READ with nothing to check asks for no digest. */
_Static_assert(2 * PF_P2P_MAX_READ < PF_NET_DIGEST_SKIP, "a slot's K + V fits a digest range");
static int plan_digests(struct fetch *f)
{
    free(f->digs);
    free(f->dig_lens);
    free(f->dig_block);
    free(f->dig_slot);
    free(f->dig_out);
    size_t cap = f->nsegs ? f->nsegs : 1;
    f->digs = calloc(f->nreads ? f->nreads : 1, sizeof(*f->digs));
    f->dig_lens = malloc(cap * sizeof(*f->dig_lens));
    f->dig_block = malloc(cap * sizeof(*f->dig_block));
    f->dig_slot = malloc(cap * sizeof(*f->dig_slot));
    f->dig_out = malloc(cap * sizeof(*f->dig_out));
    if (!f->digs || !f->dig_lens || !f->dig_block || !f->dig_slot || !f->dig_out)
        return -ENOMEM;
    size_t nr = 0;
    for (size_t i = 0; i < f->nreads; i++) {
        struct p2p_read *rd = &f->reads[i];
        size_t r0 = nr, end = (size_t)rd->seg0 + rd->nseg;
        bool any = false;
        for (size_t t = rd->seg0; t < end;) {
            const struct seg *s = &f->segs[t];
            const Pegaflow__TransferSlotInfo *si = f->resp->blocks[s->block]->slots[s->slot];
            uint64_t len = s->len;
            size_t used = 1;
            bool whole = false;
            if (s->v == 0 && !si->v_ptr) {
                whole = true;
            } else if (s->v == 0 && t + 1 < end && f->segs[t + 1].block == s->block &&
                       f->segs[t + 1].slot == s->slot && f->segs[t + 1].v == 1) {
                len += f->segs[t + 1].len;
                used = 2;
                whole = true;
            }
            if (!whole) {
                if (nr > r0 && (f->dig_lens[nr - 1] & PF_NET_DIGEST_SKIP) &&
                    (f->dig_lens[nr - 1] & ~PF_NET_DIGEST_SKIP) + len < PF_NET_DIGEST_SKIP) {
                    f->dig_lens[nr - 1] += (uint32_t)len; /* one skipped range */
                } else {
                    f->dig_lens[nr] = (uint32_t)len | PF_NET_DIGEST_SKIP;
                    nr++;
                }
                t += used;
                continue;
            }
            f->dig_lens[nr] = (uint32_t)len;
            f->dig_block[nr] = s->block;
            f->dig_slot[nr] = s->slot;
            nr++;
            any = true;
            t += used;
        }
        if (!any) {
            nr = r0; /* nothing to check here: a plain READ */
            rd->dig = NULL;
            continue;
        }
        f->digs[i] = (struct pf_net_digest){
            .n = (uint32_t)(nr - r0), .lens = f->dig_lens + r0, .out = f->dig_out + r0};
        rd->dig = &f->digs[i];
    }
    return 0;
}

/* 5. READ descriptors for the leased QPs (rebuilt when the connection is replaced). */
static int build_reads(struct fetch *f)
{
    struct pf_p2p *p = f->p;
    const struct p2p_conn *c = f->lease.conn;
    bool has[P2P_NIC_MAX] = {false};
    for (size_t i = 0; i < f->lease.nqps; i++)
        has[f->lease.qps[i]->nic] = true;
    free(f->reads);
    f->nreads = 0;
    f->reads = malloc((f->nsegs ? f->nsegs : 1) * sizeof(*f->reads));
    if (!f->reads)
        return -ENOMEM;
    /* the NIC round-robin starts where the previous fetch's did plus one, so one-READ
     * fetches do not all land on the first rail */
    unsigned rr = atomic_fetch_add_explicit(&p->read_rr, 1, memory_order_relaxed);
    struct p2p_read *cur = NULL;
    uint32_t cur_chunk = 0;
    for (size_t i = 0; i < f->nsegs; i++) {
        const struct seg *s = &f->segs[i];
        uint32_t rkey;
        /* a slot's V right after its K may take a READ past max_read (never past
         * PF_P2P_MAX_READ) unless the cap was set: the pair's checksum is then computed as
         * its bytes land (plan_digests) instead of by a second pass over staging */
        const struct seg *prev = cur ? &f->segs[i - 1] : NULL;
        bool kv_pair = p->kv_pairs && prev && prev->block == s->block && prev->slot == s->slot &&
                       prev->v == 0 && s->v == 1;
        uint64_t cap = kv_pair ? PF_P2P_MAX_READ : p->max_read;
        if (cur && cur_chunk == s->chunk && cur->raddr + cur->len == s->raddr &&
            (uint8_t *)cur->local + cur->len == s->local && cur->len + s->len <= cap &&
            p2p_conn_rkey(c, cur->nic, cur->raddr, cur->len + s->len, &rkey) && rkey == cur->rkey) {
            cur->len += s->len;
            cur->nseg++;
            continue;
        }
        /* a new READ: a NIC on the staging memory's NUMA node, else any leased one */
        const struct chunk *ch = &f->chunks[s->chunk];
        int cand[P2P_NIC_MAX], nc = 0;
        for (int k = 0; k < p->nnics; k++)
            if (has[k] && p->nics[k].numa_node == ch->numa && ch->numa >= 0)
                cand[nc++] = k;
        if (nc == 0)
            for (int k = 0; k < p->nnics; k++)
                if (has[k])
                    cand[nc++] = k;
        int nic = cand[rr++ % (unsigned)nc];
        if (!p2p_conn_rkey(c, nic, s->raddr, s->len, &rkey)) {
            snprintf(f->err, sizeof(f->err),
                     "the holder's descriptor 0x%llx+%u lies outside its registered memory",
                     (unsigned long long)s->raddr, s->len);
            return -EPROTO;
        }
        cur = &f->reads[f->nreads++];
        *cur = (struct p2p_read){
            .local = s->local,
            .len = s->len,
            .lkey = p->lkey[(size_t)nic * p->nregions + (size_t)ch->region],
            .raddr = s->raddr,
            .rkey = rkey,
            .nic = nic,
            .seg0 = (uint32_t)i,
            .nseg = 1,
        };
        cur_chunk = s->chunk;
    }
    return p->cfg.integrity ? plan_digests(f) : 0;
}

/* p2p_xfer reroute (rail failover): READ i moves to NIC nic, with that NIC's keys (the pool
 * and the holder's regions are registered on every NIC with the same layout). */
static int reroute_read(void *ctx, size_t i, int nic)
{
    struct fetch *f = ctx;
    struct p2p_read *rd = &f->reads[i];
    uint32_t rkey;
    if (!p2p_conn_rkey(f->lease.conn, nic, rd->raddr, rd->len, &rkey))
        return -EPROTO;
    rd->lkey = f->p->lkey[(size_t)nic * f->p->nregions +
                          (size_t)f->chunks[f->segs[rd->seg0].chunk].region];
    rd->rkey = rkey;
    rd->nic = nic;
    return 0;
}

/* 7. Builds the verified run of blocks into out; returns its length. */
static size_t build_blocks(struct fetch *f, struct pf_block **out, size_t *bad_p)
{
    struct pf_p2p *p = f->p;
    const Pegaflow__QueryBlocksForTransferResponse *r = f->resp;
    size_t got = 0, bad = 0, first_bad = SIZE_MAX;
    for (size_t j = 0; j < f->k; j++) {
        if (p->cfg.integrity && f->verdict[j] == 0) /* not checked during the transfer */
            f->verdict[j] = verify_block(f, j);
        if (f->verdict[j] < 0) {
            bad++;
            if (first_bad == SIZE_MAX)
                first_bad = j;
        }
    }
    for (size_t j = 0; j < f->k && j < first_bad; j++) {
        const Pegaflow__TransferBlockInfo *bi = r->blocks[j];
        struct pf_slot *slots = calloc(bi->n_slots ? bi->n_slots : 1, sizeof(*slots));
        if (!slots)
            break;
        size_t pos = f->spos[f->sbase[j]];
        for (size_t s = 0; s < bi->n_slots; s++) {
            const Pegaflow__TransferSlotInfo *si = bi->slots[s];
            struct pf_slot *sl = &slots[s];
            const struct seg *k = &f->segs[f->where[pos++]];
            sl->k = k->local;
            sl->ka = f->chunks[k->chunk].a;
            pf_alloc_get(sl->ka);
            sl->seg_len = k->len;
            sl->seg_stride = k->stride;
            sl->numa = (int16_t)f->chunks[k->chunk].numa;
            sl->nseg = 1;
            if (si->v_ptr) {
                const struct seg *v = &f->segs[f->where[pos++]];
                sl->v = v->local;
                sl->va = f->chunks[v->chunk].a;
                pf_alloc_get(sl->va);
                sl->nseg = 2;
            }
            if (si->has_checksum) { /* verified above when integrity is on (and required) */
                sl->checksum = si->checksum;
                sl->has_checksum = 1;
            } else if (p->cfg.integrity) {
                sl->checksum = pf_slot_compute_checksum(sl); /* for the SSD tier */
                sl->has_checksum = 1;
            }
        }
        struct pf_block *b = NULL;
        int prc = pf_block_pack(NULL, &f->keys[j], (uint16_t)bi->n_slots, slots, &b);
        if (prc) {
            for (size_t s = 0; s < bi->n_slots; s++) {
                pf_alloc_put(slots[s].ka);
                pf_alloc_put(slots[s].va);
            }
            free(slots);
            pf_log_ratelimited(PF_LOG_WARN, 10000, "fetched block cannot be packed: %s",
                               strerror(-prc));
            break;
        }
        free(slots);
        out[got++] = b;
    }
    if (bad) {
        atomic_fetch_add(&p->st_integrity, bad);
        pf_child_add(p->c_integrity, (double)bad);
        pf_error("integrity: %zu of %zu block(s) fetched from %s failed checksum verification "
                 "(first: block %zu, slot %u): treated as misses, %zu block(s) kept",
                 bad, f->k, f->peer, first_bad, (unsigned)f->bad_slot[first_bad], got);
    }
    *bad_p = bad;
    return got;
}

static void fetch_cleanup(struct fetch *f)
{
    /* no verification job may read the staging chunks released below */
    if (f->vg_init) {
        p2p_verify_wait(f->p, &f->vg);
        p2p_vgroup_destroy(&f->vg);
    }
    /* the lease first: after an error its QPs were invalidated already (p2p_xfer_run), so
     * nothing can land in the chunks released below */
    p2p_lease_return(f->p, &f->lease);
    for (size_t i = 0; i < f->nchunks; i++)
        pf_alloc_put(f->chunks[i].a);
    if (f->session[0])
        p2p_release_lock(f->p, f->peer, f->session);
    if (f->resp)
        protobuf_c_message_free_unpacked(&f->resp->base, NULL);
    free(f->chunks);
    free(f->segs);
    free(f->reads);
    free(f->where);
    free(f->sbase);
    free(f->spos);
    free(f->pending);
    free(f->verdict);
    free(f->bad_slot);
    free(f->vjobs);
    free(f->dig_ok);
    free(f->digs);
    free(f->dig_lens);
    free(f->dig_block);
    free(f->dig_slot);
    free(f->dig_out);
}

/* 5./6. The transfer, replacing a stale reused connection once. */
static int transfer(struct fetch *f)
{
    struct pf_p2p *p = f->p;
    uint64_t tmo = f->lock_ms > p->cfg.fetch_margin_ms ? f->lock_ms - p->cfg.fetch_margin_ms : 0;
    if (tmo < p->cfg.fetch_min_ms)
        tmo = p->cfg.fetch_min_ms;
    uint64_t deadline = pf_now_ns() + tmo * PF_NS_PER_MS;
    for (int attempt = 0;; attempt++) {
        bool fresh = f->lease.fresh, stale = false;
        int rc = build_reads(f);
        if (rc == -EPROTO && !fresh && attempt == 0) {
            /* the descriptors lie outside what this connection's handshake registered:
             * the peer restarted since (new pool addresses) */
            p2p_lease_return(p, &f->lease);
            stale = true;
        } else if (rc) {
            return rc;
        } else {
            pf_debug("RDMA fetch req %s: reading %zu block(s), %llu bytes in %zu READ(s) from "
                     "%s over %zu QP(s), deadline %llu ms",
                     f->req_id, f->k, (unsigned long long)f->bytes, f->nreads, f->peer,
                     f->lease.nqps, (unsigned long long)tmo);
            uint32_t rot = 0;
            pf_random_bytes(&rot, sizeof(rot));
            memset(f->pending, 0, f->k * sizeof(*f->pending));
            memset(f->verdict, 0, f->k * sizeof(*f->verdict));
            memset(f->dig_ok, 0, f->k * sizeof(*f->dig_ok));
            for (size_t i = 0; i < f->nsegs; i++)
                f->pending[f->segs[i].block]++;
            struct p2p_xfer x = {
                .qps = f->lease.qps,
                .nqps = f->lease.nqps,
                .deadline_ns = deadline,
                .depth = PF_P2P_QP_DEPTH,
                .rotate = rot,
                .abort = &p->stopping,
                .on_read = on_read,
                .ctx = f,
                .reroute = reroute_read,
            };
            rc = p2p_xfer_run(&x, f->reads, f->nreads);
            p2p_verify_wait(p, &f->vg); /* verdicts final; nothing reads staging after */
            if (rc == 0) {
                if (x.failed) /* rails left out on the way: dead until the next handshake */
                    p2p_lease_fail_rails(p, &f->lease, x.failed);
                return 0;
            }
            /* the QPs are invalidated: drop the connection before anything else */
            p2p_lease_fail(p, &f->lease);
            if (rc == -ETIMEDOUT) {
                snprintf(f->err, sizeof(f->err),
                         "transfer timed out after %llu ms (%zu of %zu READ(s) completed)",
                         (unsigned long long)tmo, x.completed, f->nreads);
                return rc;
            }
            /* a reused connection failing before anything completed: the peer restarted
             * or dropped it meanwhile */
            stale = x.completed == 0 && !fresh && attempt == 0 &&
                    (rc == -ENOTCONN || rc == -ECONNRESET || rc == -ECANCELED ||
                     rc == -EHOSTUNREACH); /* verbs: retries exhausted on a dead peer QP */
            if (!stale || atomic_load(&p->stopping)) {
                snprintf(f->err, sizeof(f->err),
                         "transfer failed: %s (%zu of %zu READ(s) completed)", strerror(-rc),
                         x.completed, f->nreads);
                return rc;
            }
        }
        pf_debug("connection to %s was stale (%s): reconnecting once", f->peer,
                 rc == -EPROTO ? "unknown memory regions" : strerror(-rc));
        p2p_peer_drop(p, f->peer); /* the other direction's connection is as dead */
        char e2[P2P_ERRLEN];
        rc = p2p_conn_acquire(p, f->peer, deadline, &f->lease, e2, sizeof(e2));
        if (rc) {
            snprintf(f->err, sizeof(f->err), "reconnect failed: %s", e2);
            return rc;
        }
        f->err[0] = '\0';
    }
}

/* Steps 2-7 against f->peer for f->want blocks: the verified run into out, its length;
 * *rc_p the error (0 when the holder answered, perhaps short), *why_p a shortfall reason. */
static size_t fetch_run(struct fetch *f, struct pf_block **out, int *rc_p, const char **why_p)
{
    struct pf_p2p *p = f->p;
    const char *req_id = f->req_id;
    atomic_fetch_add(&p->fetches_inflight, 1);
    uint64_t t0 = pf_now_ns();
    size_t got = 0, bad = 0;
    struct pf_metric_child *status = p->c_error;
    char e2[P2P_ERRLEN];
    int rc = p2p_vgroup_init(&f->vg);
    if (rc) {
        snprintf(f->err, sizeof(f->err), "cannot set up verification: %s", strerror(-rc));
        goto out;
    }
    f->vg_init = true;
    rc = p2p_conn_acquire(p, f->peer, pf_now_ns() + p->cfg.qp_wait_ms * PF_NS_PER_MS, &f->lease, e2,
                          sizeof(e2));
    if (rc) {
        snprintf(f->err, sizeof(f->err), "cannot connect: %s", e2);
        goto out;
    }
    uint64_t t_conn = pf_now_ns();
    rc = query_blocks(f);
    if (rc)
        goto out;
    uint64_t t_query = pf_now_ns();
    if (f->k == 0) {
        status = p->c_partial;
        snprintf(f->err, sizeof(f->err), "the holder no longer has block 0 (evicted)");
        goto out;
    }
    rc = plan_staging(f);
    if (rc) {
        snprintf(f->err, sizeof(f->err), "cannot allocate %llu bytes of staging memory: %s",
                 (unsigned long long)f->bytes, strerror(-rc));
        goto out;
    }
    uint64_t t_stage = pf_now_ns();
    rc = transfer(f);
    if (rc) {
        if (rc == -ETIMEDOUT)
            status = p->c_timeout;
        goto out;
    }
    uint64_t t_xfer = pf_now_ns();
    p2p_lease_return(p, &f->lease); /* all READs completed: the QPs are free again */
    got = build_blocks(f, out, &bad);
    pf_debug("RDMA fetch req %s: connection %.2f ms, QueryBlocksForTransfer %.2f ms, staging "
             "%.2f ms, READs + verification %.2f ms, sealing %.2f ms",
             req_id, (double)(t_conn - t0) / 1e6, (double)(t_query - t_conn) / 1e6,
             (double)(t_stage - t_query) / 1e6, (double)(t_xfer - t_stage) / 1e6,
             (double)(pf_now_ns() - t_xfer) / 1e6);
    status = got == f->want ? p->c_ok : p->c_partial;
    if (bad && got == 0)
        status = p->c_error;
out:
    fetch_cleanup(f);
    double secs = (double)(pf_now_ns() - t0) / 1e9;
    pf_child_add(status, 1);
    pf_metric_observe(p->m_dur, secs);
    atomic_fetch_add(&p->st_fetches, 1);
    if (got) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < got; i++)
            for (uint16_t s = 0; s < out[i]->nslots; s++) {
                struct pf_slot sl;
                pf_block_slot(out[i], s, &sl);
                bytes += (uint64_t)sl.seg_len * sl.nseg;
            }
        pf_metric_add(p->m_bytes, (double)bytes);
        atomic_fetch_add(&p->st_blocks, got);
        atomic_fetch_add(&p->st_bytes, bytes);
        pf_debug("RDMA fetch req %s: %zu of %zu block(s), %llu bytes from %s in %.2f ms "
                 "(%.2f GB/s)",
                 req_id, got, f->want, (unsigned long long)bytes, f->peer, secs * 1e3,
                 secs > 0 ? (double)bytes / secs / 1e9 : 0.0);
    }
    *why_p = status == p->c_timeout           ? "timeout"
             : status == p->c_partial && !bad ? "evicted"
             : bad                            ? "integrity"
                                              : "error";
    if (got < f->want) {
        atomic_fetch_add(&p->st_fail, 1);
        if (status == p->c_timeout)
            pf_error("RDMA fetch req %s from %s: %s: connection invalidated, transfer lock %s "
                     "force-released; the request proceeds without remote blocks",
                     req_id, f->peer, f->err, f->session[0] ? f->session : "(none)");
        else if (f->err[0])
            pf_warn("RDMA fetch req %s from %s aborted after %zu of %zu block(s): %s; the "
                    "request proceeds without them",
                    req_id, f->peer, got, f->want, f->err);
        else
            pf_debug("RDMA fetch req %s: %s had only %zu of the %zu block(s) it advertised "
                     "(evicted since)",
                     req_id, f->peer, got, f->want);
    }
    atomic_fetch_sub(&p->fetches_inflight, 1);
    *rc_p = rc;
    return got;
}

/* A holder's failure that says something about it (not a local cause, not a shutdown). */
static bool holder_fault(struct pf_p2p *p, int rc, const char *why)
{
    if (atomic_load(&p->stopping) || rc == -ENOMEM)
        return false;
    return rc != 0 || strcmp(why, "integrity") == 0;
}

size_t p2p_tier_fetch(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                      bool all_or_nothing, struct pf_block **out)
{
    struct pf_p2p *p = ctx;
    if (n == 0 || !p2p_fetch_available(p, req_id))
        return 0;
    struct fetch f = {.p = p, .req_id = req_id, .keys = keys};
    int rc = discover(&f, n, all_or_nothing);
    if (rc) {
        if (rc == -ENOENT)
            pf_debug("req %s: no peer holds the %zu missing block(s)", req_id, n);
        return 0;
    }
    pf_debug("RDMA fetch req %s: %s advertises %zu of %zu block(s)", req_id, f.peer, f.want, n);
    const char *why = NULL;
    size_t want = f.want;
    char peer[P2P_ADDR_MAX];
    snprintf(peer, sizeof(peer), "%s", f.peer);
    p2p_holder_note(p, peer, +1, false);
    size_t got = fetch_run(&f, out, &rc, &why);
    p2p_holder_note(p, peer, -1, got < want && holder_fault(p, rc, why));
    /* a failed or short peer: the next query for this request skips remote fetch (not
     * for local causes: staging memory, shutdown) */
    if (got < want && rc != -ENOMEM && !atomic_load(&p->stopping))
        p2p_blacklist_add(p, req_id);
    if (all_or_nothing && got < n) {
        for (size_t i = 0; i < got; i++)
            pf_block_put(out[i]);
        got = 0;
    }
    return got;
}

size_t p2p_tier_fetch_from(void *ctx, const char *req_id, const struct pf_tier_source *src,
                           const struct pf_block_key *keys, size_t n, struct pf_block **out,
                           const char **why_p)
{
    struct pf_p2p *p = ctx;
    const char *why = "error";
    size_t got = 0;
    uint32_t load;
    if (n == 0 || !atomic_load_explicit(&p->fetch_enabled, memory_order_acquire) ||
        atomic_load(&p->stopping) || strlen(src->node) >= P2P_ADDR_MAX)
        goto out;
    if (p2p_holder_state(p, src->node, pf_clock_now(p->cfg.clock), &load)) {
        why = "down"; /* failed meanwhile: not contacted inside its down window */
        goto out;
    }
    struct fetch f = {.p = p, .req_id = req_id, .keys = keys};
    snprintf(f.peer, sizeof(f.peer), "%s", src->node);
    f.want = n < src->len ? n : src->len;
    if (f.want > PF_P2P_MAX_HASHES)
        f.want = PF_P2P_MAX_HASHES;
    int rc = 0;
    p2p_holder_note(p, src->node, +1, false);
    got = fetch_run(&f, out, &rc, &why);
    p2p_holder_note(p, src->node, -1, got < f.want && holder_fault(p, rc, why));
out:
    if (why_p)
        *why_p = why;
    return got;
}

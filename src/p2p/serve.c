/* The serving side of the three P2P RPCs (reference §7.3–§7.5) and the default gRPC
 * transport of the requester.
 *
 * QueryBlocksForTransfer looks every hash up independently (missing ones are skipped, the
 * order is kept, hits refresh recency), locks the found blocks in a new session (created even
 * when nothing is found, as the reference does) and answers per slot the raw addresses of K
 * and V inside the registered pool, their size, the NUMA node and the xxh3 checksum. The reply
 * is built in one arena with copies of the hashes, so nothing in it depends on the blocks
 * once the lock owns them. Replies stop before they would exceed 48 MiB (gRPC allows 64).
 * A contiguous run from the first requested hash that is not in RAM but on this node's SSD
 * (after a restart the MetaServer lists recovered SSD blocks under this node) is read into
 * RAM first through the engine's local tiers (pf_engine_fill_local: the SSD prefetch path,
 * its budget, staging bound and checksums), all holes together waiting at most
 * PF_P2P_SERVE_SSD_MS, well under the requester's PF_P2P_RPC_TIMEOUT_MS; an SSD error or
 * timeout just leaves the answer short (what RAM has), counted in
 * pegaflow_p2p_serve_ssd_blocks_total{result}. Only the contiguous prefix is filled: the
 * requester uses nothing past its first gap.
 * ReleaseTransferLock always answers ok; an unknown session releases 0 and is logged.
 *
 * Every handler is bounded: the handshake connects fresh QPs (the backend's connect timeout),
 * the others only touch the cache and the lock table. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/cache.h"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/meta_client.h"
#include "pf/rpc.h"

#define REPLY_BUDGET    (48ull << 20)
#define SLOT_WIRE_COST  64 /* upper bound of an encoded TransferSlotInfo with framing */
#define BLOCK_WIRE_COST (PF_HASH_MAX + 16)

static Pegaflow__ResponseStatus ok_status = {
    PROTOBUF_C_MESSAGE_INIT(&pegaflow__response_status__descriptor), 1, (char *)""};

struct hs_mem {
    Pegaflow__RdmaHandshakeResponse resp;
    uint8_t *meta;
};

/* Fills the holes of found[0..n) from this node's SSD, in order, while each is filled
 * completely (the requester takes the longest contiguous prefix), within one deadline. */
static void fill_from_ssd(struct pf_p2p *p, const struct pf_block_key *keys, size_t n,
                          struct pf_block **found)
{
    if (!p->engine)
        return;
    uint64_t dl = pf_now_ns() + (uint64_t)PF_P2P_SERVE_SSD_MS * PF_NS_PER_MS;
    size_t i = 0;
    while (i < n) {
        while (i < n && found[i])
            i++;
        size_t end = i;
        while (end < n && !found[end])
            end++;
        uint64_t now = pf_now_ns();
        if (i == n || now >= dl)
            return;
        uint64_t left_ms = (dl - now + PF_NS_PER_MS - 1) / PF_NS_PER_MS;
        size_t held = 0;
        size_t got = pf_engine_fill_local(p->engine, keys + i, end - i, left_ms, found + i, &held);
        if (held)
            pf_debug("QueryBlocksForTransfer: %zu of %zu SSD block(s) read into RAM", got, held);
        pf_child_add(p->c_serve_ssd_ok, (double)got);
        pf_child_add(p->c_serve_ssd_failed, (double)(held - got));
        if (got < end - i)
            return;
        i = end;
    }
}

struct query_arena {
    Pegaflow__QueryBlocksForTransferResponse resp;
    char session[PF_UUID_STR_LEN];
    /* followed by blocks, block pointers, slots, slot pointers, hash bytes */
};

static int serve_query(struct pf_p2p *p, const Pegaflow__QueryBlocksForTransferRequest *r,
                       struct query_arena **out_p, char *err, size_t errlen)
{
    const char *ns = r->namespace_ ? r->namespace_ : "";
    if (!*ns) {
        snprintf(err, errlen, "namespace must not be empty");
        return -EINVAL;
    }
    if (r->n_block_hashes > PF_P2P_MAX_HASHES) {
        snprintf(err, errlen, "block_hashes: %zu hashes, at most %d per request", r->n_block_hashes,
                 PF_P2P_MAX_HASHES);
        return -EINVAL;
    }
    for (size_t i = 0; i < r->n_block_hashes; i++)
        if (r->block_hashes[i].len == 0 || r->block_hashes[i].len > PF_HASH_MAX) {
            snprintf(err, errlen, "block_hashes[%zu]: %zu bytes (1..%d allowed)", i,
                     r->block_hashes[i].len, PF_HASH_MAX);
            return -EINVAL;
        }
    if (atomic_load(&p->stopping)) {
        snprintf(err, errlen, "shutting down");
        return -ESHUTDOWN;
    }
    size_t n = r->n_block_hashes;
    struct pf_block_key *keys = malloc((n ? n : 1) * sizeof(*keys));
    struct pf_block **found = calloc(n ? n : 1, sizeof(*found));
    struct query_arena *a = NULL;
    int rc = -ENOMEM;
    if (!keys || !found)
        goto out;
    uint32_t nsid;
    size_t k = 0;
    if (n && pf_ns_lookup(ns, &nsid) == 0) {
        for (size_t i = 0; i < n; i++)
            pf_key_make(nsid, r->block_hashes[i].data, r->block_hashes[i].len, &keys[i]);
        pf_cache_lookup_each(p->cache, keys, n, found);
        fill_from_ssd(p, keys, n, found);
        for (size_t i = 0; i < n; i++) /* compact, keeping the order */
            if (found[i])
                found[k++] = found[i];
    }
    /* stay within the reply budget */
    size_t nslots = 0, keep = 0;
    uint64_t cost = 0;
    for (; keep < k; keep++) {
        uint64_t c = BLOCK_WIRE_COST + (uint64_t)found[keep]->nslots * SLOT_WIRE_COST;
        if (cost + c > REPLY_BUDGET)
            break;
        cost += c;
        nslots += found[keep]->nslots;
    }
    if (keep < k)
        pf_log_ratelimited(PF_LOG_WARN, 10000,
                           "QueryBlocksForTransfer from %s: answering %zu of %zu block(s) (reply "
                           "size limit)",
                           r->requester_id ? r->requester_id : "?", keep, k);
    for (size_t i = keep; i < k; i++)
        pf_block_put(found[i]);
    k = keep;
    size_t sz = sizeof(*a) + k * (sizeof(Pegaflow__TransferBlockInfo) + sizeof(void *)) +
                nslots * (sizeof(Pegaflow__TransferSlotInfo) + sizeof(void *)) + k * PF_HASH_MAX;
    a = calloc(1, sz);
    if (!a)
        goto err_put;
    Pegaflow__TransferBlockInfo *bi = (void *)(a + 1);
    Pegaflow__TransferBlockInfo **bp = (void *)(bi + k);
    Pegaflow__TransferSlotInfo *si = (void *)(bp + k);
    Pegaflow__TransferSlotInfo **sp = (void *)(si + nslots);
    uint8_t *hb = (void *)(sp + nslots);
    size_t s = 0;
    for (size_t j = 0; j < k; j++) {
        const struct pf_block *b = found[j];
        pegaflow__transfer_block_info__init(&bi[j]);
        struct pf_block_key key = pf_block_key(b);
        memcpy(hb + j * PF_HASH_MAX, key.hash, key.len);
        bi[j].block_hash = (ProtobufCBinaryData){key.len, hb + j * PF_HASH_MAX};
        bi[j].n_slots = b->nslots;
        bi[j].slots = sp + s;
        for (uint16_t q = 0; q < b->nslots; q++, s++) {
            struct pf_slot slv, *sl = &slv;
            pf_block_slot(b, q, sl);
            pegaflow__transfer_slot_info__init(&si[s]);
            si[s].k_ptr = (uint64_t)(uintptr_t)sl->k;
            si[s].k_size = sl->seg_len;
            if (sl->nseg > 1 && sl->v) {
                si[s].v_ptr = (uint64_t)(uintptr_t)sl->v;
                si[s].v_size = sl->seg_len;
            }
            si[s].numa_node = sl->numa < 0 ? PF_WIRE_NUMA_NONE : (uint32_t)sl->numa;
            si[s].checksum = sl->checksum;
            si[s].has_checksum = sl->has_checksum != 0;
            sp[s] = &si[s];
        }
        bp[j] = &bi[j];
    }
    rc = pf_p2p_locks_acquire(p->locks, found, k, a->session);
    if (rc) {
        snprintf(err, errlen, "cannot create a transfer lock: %s", strerror(-rc));
        free(a);
        a = NULL;
        goto err_put;
    }
    p2p_hb_regions(p, true); /* the addresses are about to be published */
    pegaflow__query_blocks_for_transfer_response__init(&a->resp);
    a->resp.status = &ok_status;
    a->resp.n_blocks = k;
    a->resp.blocks = bp;
    a->resp.transfer_session_id = a->session;
    a->resp.lock_timeout_secs =
        p->lock_timeout_ms / 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(p->lock_timeout_ms / 1000);
    pf_debug("QueryBlocksForTransfer from %s: %zu of %zu block(s) of %s locked in session %s",
             r->requester_id ? r->requester_id : "?", k, n, ns, a->session);
    *out_p = a;
    rc = 0;
    goto out;
err_put:
    for (size_t i = 0; i < k; i++)
        pf_block_put(found[i]);
out:
    free(keys);
    free(found);
    return rc;
}

static int serve_release(struct pf_p2p *p, const Pegaflow__ReleaseTransferLockRequest *r,
                         uint64_t *released_p)
{
    const char *id = r->transfer_session_id ? r->transfer_session_id : "";
    size_t n = 0;
    p2p_hb_regions(p, false); /* the peer's READs of these blocks are over */
    if (pf_p2p_locks_release(p->locks, id, &n) != 0) {
        pf_warn("ReleaseTransferLock: unknown session '%.64s' (already released or expired)", id);
        n = 0;
    } else {
        pf_debug("transfer lock %s released (%zu block(s))", id, n);
    }
    *released_p = n;
    return 0;
}

static int code_of(int rc)
{
    switch (rc) {
    case -ESHUTDOWN:
    /* the requester's QPs cannot be reached (handshake): its network, not our fault */
    case -ENETUNREACH:
    case -EHOSTUNREACH:
    case -ENETDOWN:
    case -EHOSTDOWN:
    case -ECONNRESET:
    case -ECONNABORTED:
        return PF_GRPC_UNAVAILABLE;
    default:
        break;
    }
    if (rc == -ENOMEM)
        return PF_GRPC_RESOURCE_EXHAUSTED;
    return pf_grpc_code_from_errno(rc);
}

/* Serves one request: *resp_p points into *mem_p (free() it after packing). */
static int serve_msg(struct pf_p2p *p, enum pf_p2p_method m, const ProtobufCMessage *req,
                     const ProtobufCMessage **resp_p, void **mem_p, char *err, size_t errlen)
{
    switch (m) {
    case PF_P2P_HANDSHAKE: {
        struct hs_mem *h = calloc(1, sizeof(*h));
        if (!h) {
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        size_t len = 0;
        int rc = p2p_serve_handshake(p, (const void *)req, &h->meta, &len, err, errlen);
        if (rc) {
            free(h);
            return rc;
        }
        pegaflow__rdma_handshake_response__init(&h->resp);
        h->resp.status = &ok_status;
        h->resp.handshake_metadata = (ProtobufCBinaryData){len, h->meta};
        *resp_p = &h->resp.base;
        *mem_p = h;
        return 0;
    }
    case PF_P2P_QUERY_BLOCKS: {
        struct query_arena *a = NULL;
        int rc = serve_query(p, (const void *)req, &a, err, errlen);
        if (rc)
            return rc;
        *resp_p = &a->resp.base;
        *mem_p = a;
        return 0;
    }
    case PF_P2P_RELEASE_LOCK: {
        Pegaflow__ReleaseTransferLockResponse *resp = malloc(sizeof(*resp));
        if (!resp) {
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        pegaflow__release_transfer_lock_response__init(resp);
        resp->status = &ok_status;
        serve_release(p, (const void *)req, &resp->released_blocks);
        *resp_p = &resp->base;
        *mem_p = resp;
        return 0;
    }
    }
    snprintf(err, errlen, "unknown P2P method %d", (int)m);
    return -EINVAL;
}

static void free_mem(enum pf_p2p_method m, void *mem)
{
    if (m == PF_P2P_HANDSHAKE && mem)
        free(((struct hs_mem *)mem)->meta);
    free(mem);
}

static int rpc(struct pf_p2p *p, enum pf_p2p_method m, struct pf_rpc_call *call,
               const ProtobufCMessage *req)
{
    char err[P2P_ERRLEN] = "";
    const ProtobufCMessage *resp = NULL;
    void *mem = NULL;
    int rc = serve_msg(p, m, req, &resp, &mem, err, sizeof(err));
    if (rc)
        return pf_rpc_fail(call, code_of(rc), "%s", err[0] ? err : strerror(-rc));
    pf_rpc_respond(call, resp);
    free_mem(m, mem);
    return 0;
}

int pf_p2p_rpc_handshake(struct pf_p2p *p, struct pf_rpc_call *call, const ProtobufCMessage *req)
{
    char ids[8][PF_AUTH_IP_MAX], err[P2P_ERRLEN];
    size_t nids = 0;
    pf_rpc_call_identities(call, ids, PF_ARRAY_SIZE(ids), &nids);
    int rc = p2p_handshake_authorize(p, (const void *)req, (const char(*)[PF_AUTH_IP_MAX])ids, nids,
                                     err, sizeof(err));
    if (rc) {
        pf_log_ratelimited(PF_LOG_WARN, 5000, "RdmaHandshake from %s refused: %s",
                           pf_rpc_call_peer(call), err);
        return pf_rpc_fail(
            call, rc == -EACCES ? PF_GRPC_PERMISSION_DENIED : PF_GRPC_INVALID_ARGUMENT, "%s", err);
    }
    return rpc(p, PF_P2P_HANDSHAKE, call, req);
}

int pf_p2p_rpc_query_blocks(struct pf_p2p *p, struct pf_rpc_call *call, const ProtobufCMessage *req)
{
    return rpc(p, PF_P2P_QUERY_BLOCKS, call, req);
}

int pf_p2p_rpc_release_lock(struct pf_p2p *p, struct pf_rpc_call *call, const ProtobufCMessage *req)
{
    return rpc(p, PF_P2P_RELEASE_LOCK, call, req);
}

int pf_p2p_serve(struct pf_p2p *p, enum pf_p2p_method m, const ProtobufCMessage *req,
                 uint8_t **resp_p, size_t *len_p, int *code_p, char *err, size_t errlen)
{
    const ProtobufCMessage *resp = NULL;
    void *mem = NULL;
    int rc = serve_msg(p, m, req, &resp, &mem, err, errlen);
    if (rc) {
        if (code_p)
            *code_p = code_of(rc);
        return rc;
    }
    size_t len = protobuf_c_message_get_packed_size(resp);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        free_mem(m, mem);
        snprintf(err, errlen, "out of memory");
        if (code_p)
            *code_p = PF_GRPC_RESOURCE_EXHAUSTED;
        return -ENOMEM;
    }
    protobuf_c_message_pack(resp, buf);
    free_mem(m, mem);
    if (code_p)
        *code_p = PF_GRPC_OK;
    *resp_p = buf;
    *len_p = len;
    return 0;
}

/* ------------------------------------------------------------------ gRPC transport */

struct p2p_chan {
    struct p2p_chan *next;
    char *addr;
    struct pf_rpc_channel *ch;
};

static struct pf_rpc_channel *chan_get(struct pf_p2p *p, const char *addr)
{
    pthread_mutex_lock(&p->chan_mu);
    struct p2p_chan *c = p->chans;
    while (c && strcmp(c->addr, addr) != 0)
        c = c->next;
    if (!c) {
        c = calloc(1, sizeof(*c));
        if (c && (!(c->addr = strdup(addr)) || pf_rpc_channel_open_lean(addr, &c->ch) != 0)) {
            free(c->addr);
            free(c);
            c = NULL;
        }
        if (c) {
            c->next = p->chans;
            p->chans = c;
        }
    }
    pthread_mutex_unlock(&p->chan_mu);
    return c ? c->ch : NULL;
}

int p2p_grpc_call(void *ctx, const char *peer, enum pf_p2p_method m, const ProtobufCMessage *req,
                  uint64_t timeout_ms, ProtobufCMessage **resp_p, char *err, size_t errlen)
{
    static const char *const paths[] = {"/pegaflow.Engine/RdmaHandshake",
                                        "/pegaflow.Engine/QueryBlocksForTransfer",
                                        "/pegaflow.Engine/ReleaseTransferLock"};
    static const ProtobufCMessageDescriptor *const descs[] = {
        &pegaflow__rdma_handshake_response__descriptor,
        &pegaflow__query_blocks_for_transfer_response__descriptor,
        &pegaflow__release_transfer_lock_response__descriptor};
    struct pf_p2p *p = ctx;
    struct pf_rpc_channel *ch = chan_get(p, peer);
    if (!ch) {
        snprintf(err, errlen, "cannot open a channel to %s", peer);
        return -ENOMEM;
    }
    struct pf_rpc_status st = {0};
    int rc = pf_rpc_unary(ch, paths[m], req, descs[m], timeout_ms, resp_p, &st);
    if (rc)
        snprintf(err, errlen, "%s %s: %s (%s)", peer, paths[m] + 17, st.msg,
                 pf_grpc_code_name(st.code));
    return rc;
}

int p2p_grpc_query_prefix(void *ctx, const char *ns, const struct pf_meta_hash *hashes, size_t n,
                          uint64_t timeout_ms, struct pf_meta_prefix **res_p, size_t *nres_p)
{
    struct pf_p2p *p = ctx;
    if (!p->meta)
        return -ENOTCONN;
    return pf_meta_client_query_prefix(p->meta, ns, hashes, n, timeout_ms, res_p, nres_p);
}

int p2p_grpc_query_start(void *ctx, const char *ns, const struct pf_meta_hash *hashes, size_t n,
                         uint64_t timeout_ms, void **op_p)
{
    struct pf_p2p *p = ctx;
    if (!p->meta)
        return -ENOTCONN;
    struct pf_meta_query *q;
    int rc = pf_meta_client_query_prefix_start(p->meta, ns, hashes, n, timeout_ms, &q);
    if (rc == 0)
        *op_p = q;
    return rc;
}

int p2p_grpc_query_finish(void *ctx, void *op, struct pf_meta_prefix **res_p, size_t *nres_p)
{
    return pf_meta_client_query_prefix_finish(op, res_p, nres_p);
}

void p2p_grpc_free(struct pf_p2p *p)
{
    struct p2p_chan *c = p->chans;
    while (c) {
        struct p2p_chan *n = c->next;
        pf_rpc_channel_close(c->ch);
        free(c->addr);
        free(c);
        c = n;
    }
    p->chans = NULL;
}

/* P2P: cross-node KV sharing. A node that lacks blocks asks the MetaServer who holds them
 * and reads them from that node's pinned pool with one-sided READs over the NET HAL
 * (verbs or the TCP fabric). Reference §7; user contract seeds/p2p.md; docs/p2p.md.
 *
 * Serving side (every node started with --nics):
 *   - every pinned pool region is registered on every NIC at start-up (remote read);
 *   - RdmaHandshake: validates the requester's metadata (same backend and QPs per NIC, a
 *     rail in common: NIC k pairs with NIC k where both have it up; one endpoint per QP;
 *     non-empty, non-overlapping regions), replaces any
 *     incoming connection from that requester (and outgoing ones to an older incarnation
 *     of it), creates and connects fresh QPs and answers with its own metadata;
 *   - QueryBlocksForTransfer: non-prefix lookup (the contiguous run from the first hash
 *     that is only on this node's SSD read into RAM first, bounded by PF_P2P_SERVE_SSD_MS;
 *     any SSD error or timeout answers what RAM has), a transfer-lock session holding strong
 *     references to the found blocks, per-slot K/V addresses, sizes, NUMA node and checksum;
 *   - ReleaseTransferLock: releases a session (unknown session -> released 0, logged).
 *   Sessions expire after --transfer-lock-timeout-secs (pegaflow_transfer_lock_timeouts_total).
 *
 * Requester side: a tier ("rdma", class reclaimable) registered with the engine. probe
 * answers the whole suffix while fetching is enabled, the MetaServer client has a session
 * and the req_id is not blacklisted;
 * fetch asks the MetaServer (QueryPrefixBlocks, excluding this node), picks the node with
 * the longest prefix, connects once per peer (single-flight; the connection table is keyed
 * by peer address and used in both directions), queries and locks the blocks, stages them in
 * this node's pool per NUMA node, READs them spread over NICs and QPs with a deadline of
 * max(lock timeout - 60 s, 10 s), verifies every slot checksum and returns sealed blocks.
 * Exactly one ReleaseTransferLock is sent per session on every exit path. On a transfer
 * error or timeout the QPs are invalidated (qp_invalidate returns only when nothing can land
 * in local memory any more) BEFORE the staging memory is freed, the connection is dropped,
 * and the req_id is blacklisted for remote fetch for 5 minutes.
 *
 * Threads: the tier runs on the engine's prefetch threads, the RPC handlers on RPC threads;
 * one "pegaflow-p2p" thread sends lock releases and expires locks and blacklist entries
 * (every second). Every function here is thread-safe unless stated. */
#ifndef PF_P2P_H
#define PF_P2P_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "pf/clock.h"
#include "pf/util.h"

struct pf_engine;
struct pf_net;
struct pf_block;
struct pf_meta_client;
struct pf_meta_hash;
struct pf_meta_prefix;
struct pf_rpc_call;
struct pf_p2p;

#define PF_P2P_DEFAULT_QPS       2
#define PF_P2P_DEFAULT_LOCK_SECS 120
/* TransferSlotInfo.numa_node when the slot's NUMA node is unknown: the reference's
 * NumaNode::UNKNOWN (u32::MAX); the field is uint32 on the wire, as in the reference */
#define PF_WIRE_NUMA_NONE           UINT32_MAX
#define PF_P2P_BLACKLIST_SECS       300
#define PF_P2P_MAX_HASHES           65536 /* hashes per QueryBlocksForTransfer */
#define PF_P2P_SESSION_ID_MAX       64    /* longer session ids are unknown by definition */
#define PF_P2P_STAGING_CHUNK        (256ull << 20)
#define PF_P2P_MAX_READ             (4ull << 20) /* merged READs never exceed this */
#define PF_P2P_READ_MERGE           (1ull << 20) /* ... and stop here unless told otherwise */
#define PF_P2P_QP_DEPTH             128          /* outstanding READs per QP (HAL bound) */
#define PF_P2P_HANDSHAKE_TIMEOUT_MS 10000
#define PF_P2P_RPC_TIMEOUT_MS       5000
#define PF_P2P_META_TIMEOUT_MS      1000 /* a healthy QueryPrefixBlocks takes < 1 ms */
#define PF_P2P_PLAN_TIMEOUT_MS      50   /* query-time discovery (the plan): default deadline */
#define PF_P2P_PLAN_HEAD            64   /* ... asks for this many hashes first */
/* serving side: a QueryBlocksForTransfer waits at most this long for SSD-only blocks to be
 * read into RAM (well under the requester's PF_P2P_RPC_TIMEOUT_MS); then answers with RAM */
#define PF_P2P_SERVE_SSD_MS 1000

/* ------------------------------------------------------------------ transfer locks */

/* Sessions of strong block references held for peers while they READ the blocks. A session
 * id is a UUID v4 string. Expiry is driven by the caller (pf_p2p_locks_expire) against the
 * injected clock. Metrics (shared by every lock manager of the process, updated by deltas):
 * pegaflow_transfer_lock_active (locked blocks), pegaflow_transfer_lock_timeouts_total
 * (sessions expired). Thread-safe; block references are dropped outside the lock. */
struct pf_p2p_locks;

/* clock may be NULL (monotonic); timeout_ns > 0. 0 or -ENOMEM / -EINVAL. */
int pf_p2p_locks_create(const struct pf_clock *clock, uint64_t timeout_ns,
                        struct pf_p2p_locks **l_p);
/* Releases every session. Accepts NULL. */
void pf_p2p_locks_destroy(struct pf_p2p_locks *l);
/* Creates a session holding blocks[0..n) (n may be 0): the caller's strong references pass
 * to the session on success (on error they stay the caller's). Writes the id. 0 or
 * -ENOMEM / -EIO (no randomness). */
int pf_p2p_locks_acquire(struct pf_p2p_locks *l, struct pf_block *const *blocks, size_t n,
                         char id_p[PF_UUID_STR_LEN]);
/* Releases a session: *released_p = its block count. -ENOENT when unknown (already released,
 * expired, or never issued). */
int pf_p2p_locks_release(struct pf_p2p_locks *l, const char *id, size_t *released_p);
/* Expires sessions older than the timeout; returns how many. */
size_t pf_p2p_locks_expire(struct pf_p2p_locks *l);
/* Releases everything (shutdown); returns the number of sessions. */
size_t pf_p2p_locks_release_all(struct pf_p2p_locks *l);
size_t pf_p2p_locks_sessions(struct pf_p2p_locks *l);
size_t pf_p2p_locks_blocks(struct pf_p2p_locks *l);

/* ------------------------------------------------------------------ the P2P module */

enum pf_p2p_method {
    PF_P2P_HANDSHAKE = 0,
    PF_P2P_QUERY_BLOCKS = 1,
    PF_P2P_RELEASE_LOCK = 2,
};

/* How the requester reaches peers and the MetaServer. The default (NULL in the config) is
 * gRPC (one cached channel per peer address) and the MetaServer client given to
 * pf_p2p_enable_fetch. Tests and benchmarks plug in-process transports. */
struct pf_p2p_transport {
    /* One unary call of method m on peer `peer` ("ip:port") with a deadline. On success
     * *resp_p is the unpacked response (protobuf_c_message_free_unpacked(*resp_p, NULL)).
     * -errno with a one-line message otherwise. */
    int (*call)(void *ctx, const char *peer, enum pf_p2p_method m, const ProtobufCMessage *req,
                uint64_t timeout_ms, ProtobufCMessage **resp_p, char *err, size_t errlen);
    /* QueryPrefixBlocks (pf_meta_client_query_prefix semantics). */
    int (*query_prefix)(void *ctx, const char *ns, const struct pf_meta_hash *hashes, size_t n,
                        uint64_t timeout_ms, struct pf_meta_prefix **res_p, size_t *nres_p);
    void *ctx;
    /* Optional, both or neither: query_prefix in two halves
     * (pf_meta_client_query_prefix_start/finish semantics and contract; *op_p is the
     * transport's handle). The plan sends its discovery with start and collects it after the
     * query thread's local work; without them it asks with query_prefix at that point. */
    int (*query_prefix_start)(void *ctx, const char *ns, const struct pf_meta_hash *hashes,
                              size_t n, uint64_t timeout_ms, void **op_p);
    int (*query_prefix_finish)(void *ctx, void *op, struct pf_meta_prefix **res_p, size_t *nres_p);
};

struct pf_p2p_config {
    struct pf_engine *engine;     /* the tier is registered on it */
    struct pf_net *net;           /* opened NICs; owned by the caller, closed after destroy */
    const char *backend;          /* NET backend name ("tcp", "verbs"; "faulty:" is ignored) */
    uint32_t qps_per_peer;        /* QPs per NIC per peer; 0 = PF_P2P_DEFAULT_QPS */
    uint64_t lock_timeout_secs;   /* transfer-lock expiry; 0 = PF_P2P_DEFAULT_LOCK_SECS */
    bool integrity;               /* verify fetched slots against the holder's checksums */
    const struct pf_clock *clock; /* lock expiry and blacklist; NULL = monotonic */
    const struct pf_p2p_transport *transport; /* NULL = gRPC + MetaServer client */
    /* tuning (0 = default); tests shrink them */
    uint64_t fetch_margin_ms;     /* transfer deadline = max(lock timeout - margin, min): 60000 */
    uint64_t fetch_min_ms;        /* 10000 */
    uint64_t full_prefix_poll_ms; /* wait_for_full_prefix MetaServer polling period: 10 */
    uint64_t full_prefix_wait_ms; /* ... for at most: 30000 */
    uint64_t blacklist_ms;        /* a failed peer blocks remote fetch for a req_id: 300000 */
    uint64_t housekeeping_ms;     /* lock expiry / blacklist GC period: 1000 */
    uint64_t qp_wait_ms;          /* wait for a busy connection's QPs: 30000 */
    uint64_t peer_down_ms;        /* after a failed handshake the peer is skipped: 5000; a
                                   * failed fetch ranks the holder last for as long */
    uint64_t plan_timeout_ms;     /* query-time discovery deadline (--p2p-plan-timeout-ms) */
    uint64_t conn_idle_ms;        /* a connection no fetch leased this long is closed: 600000 */
    /* checksum verification workers per NUMA node of the pool (docs/p2p.md
     * "Verification"): 0 = default (online CPUs / nodes / 4, 1..8); < 0 = verify on the
     * fetching thread between polls (no workers; benches compare the two) */
    int verify_threads;
    /* test hook: runs on the verifying thread just before block `block` of a fetch is
     * verified (NULL in production) */
    void (*verify_hook)(void *ctx, size_t block);
    void *verify_hook_ctx;
    /* bytes a merged READ stops at (0: PF_P2P_READ_MERGE); a slot's V still joins the READ
     * ending with its K up to PF_P2P_MAX_READ. PEGAFLOW_P2P_MAX_READ overrides both: a strict
     * cap, no pairing (docs/p2p.md) */
    uint64_t read_merge;
};

/* Registers every pool region on every NIC, registers the "rdma" tier with the engine
 * (disabled until pf_p2p_enable_fetch) and starts the p2p thread. Must run before the
 * engine serves traffic. Errors with a one-line reason in err: -EINVAL (no NIC, bad
 * config), -ENOMEM, or the NET backend's registration error. */
int pf_p2p_create(const struct pf_p2p_config *cfg, struct pf_p2p **p_p, char *err, size_t errlen);
/* Turns remote fetch on: discovery through meta (may be NULL with a custom transport),
 * self_addr = this node's advertised "ip:port" (requester_id, excluded from discovery).
 * Call once, before queries that should fetch. */
void pf_p2p_enable_fetch(struct pf_p2p *p, struct pf_meta_client *meta, const char *self_addr);
/* Shutdown, step 1 (after the RPC server stopped, before the MetaServer client and the
 * engine are destroyed): disables the tier, drops every connection (invalidating its QPs:
 * in-flight fetches fail at once), waits for MetaServer queries in flight (bounded by their
 * deadline), sends queued lock releases (3 s at most), releases every transfer lock this node
 * holds for peers and deregisters the pool. Idempotent. */
void pf_p2p_stop(struct pf_p2p *p);
/* Step 2 (after the engine is destroyed: no fetch can run any more): frees. Accepts NULL.
 * Calls pf_p2p_stop when needed. */
void pf_p2p_destroy(struct pf_p2p *p);

/* RPC handlers of the three P2P methods (pf_rpc_unary_fn contract: respond and return 0,
 * or return pf_rpc_fail(...)). */
int pf_p2p_rpc_handshake(struct pf_p2p *p, struct pf_rpc_call *call, const ProtobufCMessage *req);
int pf_p2p_rpc_query_blocks(struct pf_p2p *p, struct pf_rpc_call *call,
                            const ProtobufCMessage *req);
int pf_p2p_rpc_release_lock(struct pf_p2p *p, struct pf_rpc_call *call,
                            const ProtobufCMessage *req);

/* Serves one P2P request of method m on p, as the RPC handlers do, for in-process
 * transports: req is the request message; *resp_p gets a packed copy of the response
 * (malloc'ed; *len_p bytes). Errors: -errno with the message the RPC would carry; *code_p
 * (may be NULL) gets the gRPC status code. */
int pf_p2p_serve(struct pf_p2p *p, enum pf_p2p_method m, const ProtobufCMessage *req,
                 uint8_t **resp_p, size_t *len_p, int *code_p, char *err, size_t errlen);

/* For tests, benchmarks and admin output. */
struct pf_p2p_stats {
    uint64_t lock_sessions, locked_blocks;
    uint64_t conns, qps;                    /* live connections and their QPs */
    uint64_t handshakes_out, handshakes_in; /* completed */
    uint64_t releases_sent, releases_failed;
    uint64_t fetches, fetched_blocks, fetched_bytes;
    uint64_t fetch_failures, integrity_failures;
    uint64_t blacklisted;
    uint64_t rail_failures; /* rails marked dead after a failed READ (docs/net.md) */
};
void pf_p2p_get_stats(struct pf_p2p *p, struct pf_p2p_stats *s);
/* Whether req_id is blacklisted for remote fetch now. */
bool pf_p2p_blacklisted(struct pf_p2p *p, const char *req_id);
/* Waits until every queued lock release was sent (or failed); 0 or -ETIMEDOUT. */
int pf_p2p_flush_releases(struct pf_p2p *p, uint64_t timeout_ms);

/* ------------------------------------------------------------------ handshake metadata */

struct Pegaflow__HandshakeMetadata;
/* Validates a peer's handshake metadata against this node's expectations: backend equal,
 * nnics NICs, qps endpoints per NIC (1..PF_NET_EP_MAX bytes each), 1..1024 regions per NIC,
 * each non-empty, not wrapping around, not overlapping another of the same NIC. 0 or -EINVAL
 * with the first problem named in err. */
int pf_p2p_meta_validate(const struct Pegaflow__HandshakeMetadata *m, const char *backend,
                         size_t nnics, uint32_t qps, char *err, size_t errlen);

#endif

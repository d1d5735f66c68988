/* Server-side MetaServer client: advertises this node's resident blocks to the MetaServer
 * and asks it who holds a prefix (pegaflow-server --metaserver-addr).
 *
 * One background thread owns the registration channel and the node session:
 *   - node_id: a UUID v4 per client (per process); heartbeats every max(stale/2, 1 s), where
 *     stale is the server's stale_after_secs (stale_secs_hint until the first answer);
 *     exponential backoff 100 ms -> 30 s while the MetaServer is unreachable.
 *   - Commands (insert/remove) wait in a bounded queue (queue_depth commands). Each wake-up
 *     drains the whole queue, nets it last-write-wins per (namespace, hash), and sends the
 *     inserts before the removes in chunks of at most PF_META_CLIENT_CHUNK hashes. Nothing
 *     is retried: a failed chunk and the rest of the round are dropped and counted; while no
 *     session is established a drained round is dropped (the resync below restores it).
 *   - FAILED_PRECONDITION from the MetaServer ("unknown node", "stale node session") resets
 *     the session (pegaflow_metaserver_session_resets_total) and re-heartbeats at once.
 *   - Resync (beyond the reference): whenever a session is (re-)established — first contact,
 *     MetaServer restart, session reset, reconnection after an outage — the client calls
 *     enumerate_resident and re-registers every block the node holds, in chunks
 *     (pegaflow_metaserver_resync_blocks_total). A MetaServer restart is detected even when
 *     no RPC failed: before each heartbeat the client sends a session probe (a
 *     RemoveBlockHashes of one reserved key in the reserved namespace
 *     PF_META_PROBE_NAMESPACE), which answers "unknown node" once the MetaServer has lost
 *     the node.
 *   - Refresh (beyond the reference): every refresh_interval_secs the client re-inserts every
 *     resident block, which renews its register time before the MetaServer's TTL would drop
 *     it (pegaflow_metaserver_refresh_blocks_total). The interval must be shorter than the
 *     MetaServer's --ttl-minutes (default 30 min against a default TTL of 120 min).
 *
 * Queries (pf_meta_client_query_prefix) use a second channel, from any thread, with their
 * own deadline; they never wait for the background thread.
 *
 * Metrics (counters, names as exposed): pegaflow_metaserver_registration_blocks_total,
 * _registration_failures_total, _registration_queue_full_total, _removal_blocks_total,
 * _removal_failures_total, _removal_queue_full_total, _heartbeat_failures_total,
 * _session_resets_total, _unregister_failures_total, _resync_blocks_total,
 * _refresh_blocks_total, _query_failures_total. *_blocks count hashes the MetaServer
 * accepted, *_failures hashes dropped after a failed or skipped send, *_queue_full commands
 * (calls) dropped because the queue was full. */
#ifndef PF_META_CLIENT_H
#define PF_META_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/meta.h"

#define PF_META_CLIENT_CHUNK           16384u /* hashes per Insert/Remove RPC */
#define PF_META_CLIENT_QUEUE_DEFAULT   4096u
#define PF_META_CLIENT_REFRESH_DEFAULT 1800u /* seconds */
#define PF_META_PROBE_NAMESPACE        "__pegaflow_session_probe__"

/* emit: copies (ns, hash) for the client; returns 0, or -ENOMEM to stop the enumeration. */
typedef int (*pf_meta_emit_fn)(void *emit_ctx, const char *ns, const void *hash, size_t len);

struct pf_meta_client_config {
    const char *target;             /* MetaServer "host:port", or replicas "host:port,host:port,..."
                                     * (copied): sticky failover to the next on UNAVAILABLE/deadline */
    const char *advertise_addr;     /* this node's routable "ip:port" as peers reach it (copied) */
    size_t queue_depth;             /* commands; 0 = PF_META_CLIENT_QUEUE_DEFAULT; at most 2^24 */
    uint64_t stale_secs_hint;       /* heartbeat period before the server answers; 0 = 30 */
    uint64_t refresh_interval_secs; /* 0 = PF_META_CLIENT_REFRESH_DEFAULT; UINT64_MAX = never */
    uint64_t rpc_timeout_ms;        /* deadline of each registration RPC; 0 = 5000 */

    /* Called on the client thread with the hashes the MetaServer flagged reclaimable (this
     * node became their third-or-later visible owner). May be NULL. Must not block long. */
    void (*apply_reclaimable)(void *cb_ctx, const char *ns, const struct pf_meta_hash *hashes,
                              size_t n);
    /* Called on the client thread for resync and refresh: call emit once per resident
     * (namespace, hash). emit only copies (it may be called under the caller's locks and
     * never touches the network). Returns 0 or -errno (the round is then skipped). May be
     * NULL (no resync/refresh). */
    int (*enumerate_resident)(void *cb_ctx, pf_meta_emit_fn emit, void *emit_ctx);
    void *cb_ctx;
};

struct pf_meta_client;

/* Copies cfg, generates the node_id, opens both channels (lazily connected) and starts the
 * thread. Does not wait for the MetaServer. 0, -EINVAL (missing target/address) or
 * -ENOMEM. */
int pf_meta_client_create(const struct pf_meta_client_config *cfg, struct pf_meta_client **c_p);

/* Enqueue registrations / removals of (ns, hashes[0..n)). Never blocks on the network: the
 * hashes are copied and queued. 0; -EAGAIN when the queue is full (dropped and counted);
 * -ESHUTDOWN after stop; -EINVAL for an empty namespace, n == 0 or an empty hash; -ENOMEM.
 * Thread-safe. */
int pf_meta_client_insert(struct pf_meta_client *c, const char *ns,
                          const struct pf_meta_hash *hashes, size_t n);
int pf_meta_client_remove(struct pf_meta_client *c, const char *ns,
                          const struct pf_meta_hash *hashes, size_t n);

/* QueryPrefixBlocks on the query channel with a deadline of timeout_ms. On success *res_p
 * is one malloc'ed block (free()) of *nres_p entries (NULL when 0). Errors: -errno mapped
 * from the gRPC status (-ECONNREFUSED unreachable, -ETIMEDOUT deadline, -EINVAL, ...).
 * Thread-safe, blocks up to timeout_ms. */
int pf_meta_client_query_prefix(struct pf_meta_client *c, const char *ns,
                                const struct pf_meta_hash *hashes, size_t n, uint64_t timeout_ms,
                                struct pf_meta_prefix **res_p, size_t *nres_p);
/* pf_meta_client_query_prefix in two halves, for a caller with local work to do while the
 * query travels (the query-time plan). start sends the query and returns at once (0, or
 * -errno and nothing to finish); finish waits for the answer with query_prefix's results,
 * failing over to the next replica on UNAVAILABLE as query_prefix does, and frees q.
 * Contract (pf_rpc_unary_start's): finish on the starting thread, exactly once; res_p NULL
 * cancels (-ECANCELED). ns and hashes stay valid and unchanged until finish returns. */
struct pf_meta_query;
int pf_meta_client_query_prefix_start(struct pf_meta_client *c, const char *ns,
                                      const struct pf_meta_hash *hashes, size_t n,
                                      uint64_t timeout_ms, struct pf_meta_query **q_p);
int pf_meta_client_query_prefix_finish(struct pf_meta_query *q, struct pf_meta_prefix **res_p,
                                       size_t *nres_p);

/* Index of the entry with the largest prefix_len whose node is not exclude (this node's
 * own address), or -1 when none has prefix_len > 0. */
ptrdiff_t pf_meta_prefix_best(const struct pf_meta_prefix *res, size_t n, const char *exclude);

/* Barrier: returns 0 once every command enqueued before the call has been attempted (sent
 * or dropped), -ETIMEDOUT after timeout_ms, -ESHUTDOWN when stopped. */
int pf_meta_client_flush(struct pf_meta_client *c, uint64_t timeout_ms);

/* Stops the thread: queued commands are dropped, then UnregisterNode is sent with a 3 s
 * deadline when a session was ever established. Bounded by the RPC in flight
 * (rpc_timeout_ms) + 3 s.
 * Idempotent. */
/* Asks for a re-registration of every resident block (enumerate_resident, in chunks, with
 * heartbeats, as the resync after a new session) at the next opportunity: e.g. once the SSD
 * tier has recovered its blocks. Any thread; never blocks. */
void pf_meta_client_resync(struct pf_meta_client *c);
void pf_meta_client_stop(struct pf_meta_client *c);
/* stop + free. Accepts NULL. */
void pf_meta_client_destroy(struct pf_meta_client *c);

/* This client's node_id (canonical UUID text) and whether a session is established now. */
const char *pf_meta_client_node_id(const struct pf_meta_client *c);
bool pf_meta_client_connected(const struct pf_meta_client *c);

/* ------------------------------------------------ coalescing (pure, exposed for tests) */

enum pf_meta_op { PF_META_OP_INSERT = 1, PF_META_OP_REMOVE = 2 };

struct pf_meta_cmd {
    enum pf_meta_op op;
    const char *ns;
    const struct pf_meta_hash *hashes;
    size_t n;
};

/* One RPC's worth: hashes point into the commands' memory. */
struct pf_meta_batch {
    enum pf_meta_op op;
    const char *ns;
    const struct pf_meta_hash *hashes;
    size_t n;
};

struct pf_meta_plan {
    struct pf_meta_batch *batches; /* all inserts first, then all removes */
    size_t nbatches;
    struct pf_meta_hash *hashes; /* storage the batches point into */
};

/* Nets cmds last-write-wins per (namespace, hash) and splits the survivors into batches of
 * at most max_chunk hashes (namespaces in order of first appearance, hashes in order of
 * their first appearance). Duplicates collapse to one. 0 or -ENOMEM / -EINVAL
 * (max_chunk 0). Free the plan with pf_meta_plan_free. */
int pf_meta_coalesce(const struct pf_meta_cmd *cmds, size_t ncmds, size_t max_chunk,
                     struct pf_meta_plan *plan_p);
void pf_meta_plan_free(struct pf_meta_plan *plan);

#endif

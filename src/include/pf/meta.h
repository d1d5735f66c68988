/* MetaServer: the cluster-wide registry of which node holds which (namespace, block hash).
 *
 * Store (src/meta/store.c): in memory only. Keys (namespace, hash) map to owners
 * {node address, node session (UUID), register time}; a node table maps each node address
 * to its current session and last heartbeat. Semantics follow the reference (v0.23.12):
 *
 *   visible  owner's address has a node record whose current session is the owner's, and
 *            now - last_seen <= stale (--node-stale-secs).          (QueryPrefix, reclaimable)
 *   kept     the address has a node record, now - register_time <= ttl and
 *            now - last_seen <= ttl (--ttl-minutes).                      (sweep retention)
 *
 * Heartbeat creates a record, refreshes it (same session) or takes it over (different
 * session, only when the current one is stale; else -ESTALE). Insert/Remove validate the
 * session (-ENOENT "unknown node", -ESTALE "stale node session") and refresh last_seen.
 * Register times have one-second resolution.
 *
 * Threads: every function is thread-safe. Keys live in 256 shards, each with its own mutex
 * and open-addressing table; a reader/writer lock guards the small node/session/namespace
 * registry (writers only on node creation, takeover, unregister and sweep). No function
 * blocks on anything but these locks. Times come from the injected clock (NULL = monotonic).
 *
 * Errors: 0 or -errno: -EINVAL (malformed argument), -ENOENT (unknown node), -ESTALE (stale
 * node session), -ENOMEM; with a Redis store also -ENOTCONN and -EPROTO (see config.store). */
#ifndef PF_META_H
#define PF_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/clock.h"
#include "pf/rpc.h"

/* A block hash. Same layout as ProtobufCBinaryData so request arrays pass through. */
struct pf_meta_hash {
    size_t len;
    const uint8_t *data;
};

#define PF_META_HASH_MAX 65535u /* longest accepted block hash, bytes */
#define PF_META_NODE_MAX 1024u  /* longest accepted node address */
#define PF_META_NS_MAX   4096u  /* longest accepted namespace */
#define PF_META_NO_VALUE UINT64_MAX

struct pf_meta_store_config {
    uint64_t node_stale_secs;     /* > 0 */
    uint64_t ttl_secs;            /* > 0 */
    const struct pf_clock *clock; /* NULL = real clock; must outlive the store */
    /* NULL or "memory": this process's memory. "redis://[[USER:]PASSWORD@]HOST:PORT[,...]":
     * Redis or Redis Cluster (src/meta/store_redis.c; the real clock is then the wall
     * clock, shared by every MetaServer replica). Any call on a Redis store may also fail
     * with -ENOTCONN (Redis unreachable: UNAVAILABLE) or -EPROTO (unexpected answer). */
    const char *store;
    /* Redis AUTH password from elsewhere than the URL (--redis-password-file,
     * PEGAFLOW_REDIS_PASSWORD); NULL: the URL's, if any. Both at once: -EINVAL. Copied; the
     * copies are wiped (explicit_bzero) when freed. */
    const char *redis_password;
};

/* store with the password of a redis:// URL replaced by "***" (user and hosts kept), for
 * every message that names the store: the password is never logged. Other strings are
 * copied unchanged (truncated to len). */
void pf_meta_store_redact(const char *store, char *out, size_t len);

/* One node's answer to a prefix query. */
struct pf_meta_prefix {
    char *node; /* points into the result allocation */
    uint64_t prefix_len;
};

struct pf_meta_sweep_stats {
    uint64_t removed_owners;
    uint64_t removed_keys;
    uint64_t removed_nodes;
};

struct pf_meta_store_stats {
    uint64_t entries;      /* keys */
    uint64_t owners;       /* owner entries over all keys */
    uint64_t nodes_active; /* node records with a fresh heartbeat */
    uint64_t nodes_stale;  /* node records older than the stale period */
    /* Redundancy snapshot of the last sweep (zero before the first sweep). */
    uint64_t redundancy[4];  /* keys with 1, 2, 3, >= 4 visible owners */
    uint64_t visible_copies; /* sum of visible owners over those keys */
    uint64_t sessions;       /* node sessions known (current or still referenced) */
    uint64_t bytes;          /* memory held by the key tables and entries */
    uint64_t namespaces;
};

struct pf_meta_store;

/* Creates an empty store. -EINVAL when a period is 0, -ENOMEM. Registers the store gauges
 * (pegaflow_metaserver_store_entries, _block_owners, _nodes{state}, _block_redundancy{owners},
 * _block_redundancy_avg) and sweep counters; destroy unregisters the gauges. */
int pf_meta_store_create(const struct pf_meta_store_config *cfg, struct pf_meta_store **st_p);
/* Frees everything. No call may be in flight. Accepts NULL. */
void pf_meta_store_destroy(struct pf_meta_store *st);

/* HeartbeatNode. node: non-empty address (<= PF_META_NODE_MAX bytes). Another node_id
 * holding a fresh session for node: -ESTALE. */
int pf_meta_store_heartbeat(struct pf_meta_store *st, const char *node, const uint8_t node_id[16]);
/* The same; replace: node_id takes node's session at once even when the previous one is
 * still fresh (a restarted server whose claim to the address the caller has checked:
 * service.c h_heartbeat). */
int pf_meta_store_heartbeat_replace(struct pf_meta_store *st, const char *node,
                                    const uint8_t node_id[16], bool replace);

/* UnregisterNode: drops the node record when its current session is node_id, then removes
 * every owner entry of (node, node_id) and keys left empty (a full scan). Never fails for an
 * unknown node or session (removed 0). */
int pf_meta_store_unregister(struct pf_meta_store *st, const char *node, const uint8_t node_id[16],
                             uint64_t *removed_owners_p);

/* InsertBlockHashes: validates and refreshes the session, then upserts (node, node_id) as
 * owner of every (ns, hash[i]) with register time now. When reclaimable is not NULL,
 * reclaimable[i] is set to true iff this call made the node a new owner of hash i and the
 * key then has >= 3 visible owners (false otherwise). n may not be 0; no hash may be empty.
 * -ENOSPC when a key would get a 65536th owner, or (memory store) a new namespace would be
 * the 2^22nd live one; -ENOMEM without memory (hashes before the failing one stay in). */
int pf_meta_store_insert(struct pf_meta_store *st, const char *ns, const struct pf_meta_hash *h,
                         size_t n, const char *node, const uint8_t node_id[16], bool *reclaimable);

/* RemoveBlockHashes: validates and refreshes the session, then deletes the owner entries of
 * exactly (node, node_id) for each hash; keys left without owners are deleted. */
int pf_meta_store_remove(struct pf_meta_store *st, const char *ns, const struct pf_meta_hash *h,
                         size_t n, const char *node, const uint8_t node_id[16],
                         uint64_t *removed_p);

/* QueryPrefixBlocks: walks h in order and stops at the first hash without a visible owner;
 * each node's prefix_len is the number of consecutive hashes from index 0 it owns (visibly);
 * nodes with 0 are omitted, order unspecified. *res_p is one malloc'ed block (free()),
 * NULL when *nres_p is 0. Refreshes nothing. */
int pf_meta_store_query_prefix(struct pf_meta_store *st, const char *ns,
                               const struct pf_meta_hash *h, size_t n,
                               struct pf_meta_prefix **res_p, size_t *nres_p);

/* One sweep: drops node records whose last_seen is older than the TTL, owners that are not
 * kept, keys left empty, unreferenced sessions/namespaces, and recomputes the redundancy
 * snapshot. Counts into the sweep counters. stats_p may be NULL. */
void pf_meta_store_sweep(struct pf_meta_store *st, struct pf_meta_sweep_stats *stats_p);

/* The configured stale period (HeartbeatNodeResponse.stale_after_secs). */
uint64_t pf_meta_store_stale_secs(const struct pf_meta_store *st);

/* Point-in-time counters (entries/owners exact, nodes computed now, redundancy from the
 * last sweep). */
void pf_meta_store_get_stats(struct pf_meta_store *st, struct pf_meta_store_stats *out);

/* --------------------------------------------------------------- service */

/* Method table of service pegaflow.MetaServer (src/meta/service.c). The server's ctx must
 * be a struct pf_meta_store *. Handlers validate every field (INVALID_ARGUMENT naming it),
 * map -ENOENT/-ESTALE to FAILED_PRECONDITION "unknown node"/"stale node session", and
 * answer empty Insert/Remove lists with an OK response whose status.ok is false. */
extern const struct pf_rpc_method pf_meta_methods[];
extern const size_t pf_meta_nmethods;

/* Background sweeper: one thread calling pf_meta_store_sweep every interval_secs.
 * stop wakes and joins it (returns promptly). */
struct pf_meta_sweeper;
int pf_meta_sweeper_start(struct pf_meta_store *st, uint64_t interval_secs,
                          struct pf_meta_sweeper **sw_p);
void pf_meta_sweeper_stop(struct pf_meta_sweeper *sw);

#endif

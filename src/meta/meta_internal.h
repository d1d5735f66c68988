/* Private interfaces of the MetaServer module: the store backend table (store.c dispatches
 * to it when --store is not "memory") and the Redis / Redis Cluster client the Redis store
 * runs on (redis_cluster.c). */
#ifndef PF_META_INTERNAL_H
#define PF_META_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/meta.h"

/* A store backend. Same contracts as the pf_meta_store_* functions of pf/meta.h; in
 * addition any call may fail with -ENOTCONN (backend unreachable or not serving: the
 * service answers UNAVAILABLE) or -EPROTO (unexpected backend answer: INTERNAL). */
struct pf_meta_store_ops {
    void (*destroy)(void *impl);
    int (*heartbeat)(void *impl, const char *node, const uint8_t node_id[16], bool replace);
    int (*unregister)(void *impl, const char *node, const uint8_t node_id[16],
                      uint64_t *removed_owners_p);
    int (*insert)(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n,
                  const char *node, const uint8_t node_id[16], bool *reclaimable);
    int (*remove)(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n,
                  const char *node, const uint8_t node_id[16], uint64_t *removed_p);
    int (*query_prefix)(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n,
                        struct pf_meta_prefix **res_p, size_t *nres_p);
    void (*sweep)(void *impl, struct pf_meta_sweep_stats *stats_p);
    void (*get_stats)(void *impl, struct pf_meta_store_stats *out);
};

/* Opens the Redis store (store_redis.c) for cfg->store ("redis://..."). Does not need
 * Redis to be reachable (it connects lazily and reconnects by itself). -EINVAL with a log
 * line naming the problem for a malformed URL, -ENOMEM. */
int pf_meta_redis_store_open(const struct pf_meta_store_config *cfg,
                             const struct pf_meta_store_ops **ops_p, void **impl_p);

/* ------------------------------------------------------------ Redis client */

/* A Redis or Redis Cluster deployment behind one handle (redis_cluster.c).
 *
 * Seeds are "host:port" pairs. On first use (and after a connection failure or a MOVED
 * answer) the client asks a reachable seed or known node for CLUSTER SLOTS; an instance
 * without cluster support is used as the owner of every slot. Commands are routed by the
 * key's slot (CRC16 with hash tags, as Redis), grouped per owning node and pipelined: one
 * round trip per node per pf_redis_exec (map refreshes at most every 100 ms, backing off to
 * 2 s while nothing answers). MOVED updates the slot map and re-sends; ASK
 * re-sends once to the named node preceded by ASKING; at most 4 redirect rounds.
 *
 * Each node has a few connections (each behind its own mutex); connect and command
 * timeouts are timeout_ms. A node that failed is not retried for a back-off period
 * (100 ms doubling to 2 s), so calls fail fast while Redis is down and recover on their
 * own once it is back. Scripts given at open are loaded (SCRIPT LOAD) on every new
 * connection. Thread-safe. */
struct pf_redis;

struct pf_redis_config {
    const char *seeds;          /* "host:port[,host:port...]" */
    const char *password;       /* NULL: no AUTH */
    const char *user;           /* NULL: AUTH password only */
    uint32_t timeout_ms;        /* connect and command timeout, > 0 */
    const char *const *scripts; /* Lua sources, loaded on every connection */
    size_t nscripts;
};

/* One command of a batch. argv/argvlen are the caller's; slot is the routing slot (use
 * pf_redis_slot of the command's key; commands without a key can be sent with
 * pf_redis_exec_node). reply is set by pf_redis_exec (a redisReply *, freed by
 * pf_redis_cmds_reset or the caller with freeReplyObject). */
struct pf_redis_cmd {
    int argc;
    const char **argv;
    const size_t *argvlen;
    uint16_t slot;
    void *reply;
};

int pf_redis_open(const struct pf_redis_config *cfg, struct pf_redis **r_p);
void pf_redis_close(struct pf_redis *r);

/* Redis Cluster's slot of a key (hash tags honoured). */
uint16_t pf_redis_slot(const void *key, size_t len);
/* A short string whose slot is `slot` (for per-slot helper keys: "{tag}"). */
const char *pf_redis_slot_tag(uint16_t slot);

/* Sends every command and collects every reply. 0: each cmds[i].reply is set (it may be an
 * error reply of the command itself: REDIS_REPLY_ERROR); -ENOTCONN: a node could not be
 * reached, answered CLUSTERDOWN/LOADING/TRYAGAIN/MASTERDOWN or the cluster map is unknown
 * (replies of the batch freed); -ENOMEM; -EPROTO: too many redirects. */
int pf_redis_exec(struct pf_redis *r, struct pf_redis_cmd *cmds, size_t n);
/* Frees the replies of cmds[0..n). */
void pf_redis_cmds_reset(struct pf_redis_cmd *cmds, size_t n);
/* The script hashes (hex SHA1, 40 chars) of cfg->scripts, once a connection loaded them;
 * NULL before the first successful connection. */
const char *pf_redis_script_sha(struct pf_redis *r, size_t i);

/* Number of master nodes in the current map (1 for a plain Redis, 0 when unknown). */
size_t pf_redis_nmasters(struct pf_redis *r);
/* Runs one command on master i (SCAN, DBSIZE, INFO ...). 0 and *reply_p, or -ENOTCONN,
 * -ENOENT (no master i). */
int pf_redis_exec_master(struct pf_redis *r, size_t i, int argc, const char **argv,
                         const size_t *argvlen, void **reply_p);

/* ------------------------------------------------------------ client replicas */

/* The MetaServer replicas a node talks to (client_targets.c): "host:port[,host:port...]",
 * a registration and a query channel each (lazily connected), and the current one. Sticky
 * failover: callers use pf_meta_targets_current; after a failed RPC on replica i they call
 * pf_meta_targets_failed(t, i, code), which moves every caller to the next replica when code
 * is UNAVAILABLE or DEADLINE_EXCEEDED and there is more than one (returns true then: the
 * caller may retry at once on the new current one). Thread-safe. */
struct pf_meta_targets;
struct pf_rpc_channel;
int pf_meta_targets_open(const char *list, struct pf_meta_targets **t_p);
void pf_meta_targets_close(struct pf_meta_targets *t);
size_t pf_meta_targets_count(const struct pf_meta_targets *t);
size_t pf_meta_targets_current(struct pf_meta_targets *t);
const char *pf_meta_targets_name(const struct pf_meta_targets *t, size_t i);
struct pf_rpc_channel *pf_meta_targets_reg(const struct pf_meta_targets *t, size_t i);
struct pf_rpc_channel *pf_meta_targets_query(const struct pf_meta_targets *t, size_t i);
bool pf_meta_targets_failed(struct pf_meta_targets *t, size_t i, int grpc_code);

/* The node's MetaServer client (client.c) as client_query.c uses it: whether stop was
 * called; its replica set (owned by the client); a failed query (counted; when unreachable
 * is set and a session is up, the heartbeat runs at once to confirm the outage). */
struct pf_meta_client;
bool pf_meta_client_stopping(struct pf_meta_client *c);
struct pf_meta_targets *pf_meta_client_targets(struct pf_meta_client *c);
void pf_meta_client_query_failed(struct pf_meta_client *c, bool unreachable);

#endif

/* The engine: instances (registered GPU KV caches), save, query/prefetch, load, leases,
 * the RAM cache and the pinned pool, plus the hooks later tiers (SSD, MetaServer, peers)
 * attach to.
 *
 * Every request function validates its input and returns 0 or -errno with a one-line
 * message in `err` that names the problem. Error classes (mapped to gRPC codes by the
 * service, pf_grpc_code_from_errno):
 *   -EINVAL            bad argument                           -> INVALID_ARGUMENT
 *   -ENOENT / -EPERM / -ESTALE  unknown instance or worker, version or topology
 *                      mismatch, unknown lease                -> FAILED_PRECONDITION
 *   others (-ENOMEM, -EIO, -ETIMEDOUT)  internal failures     -> INTERNAL / DEADLINE
 * Functions are thread-safe and may be called concurrently from the RPC threads. */
#ifndef PF_ENGINE_H
#define PF_ENGINE_H

/* Request caps (docs/server.md "Request limits"); past them a request is INVALID_ARGUMENT
 * naming the cap. String and repeated-field caps are enforced on the wire (src/rpc). */
#define PF_ENGINE_MAX_LAYERS    4096u /* layers in one registration, save or load */
#define PF_ENGINE_MAX_INSTANCES 32u   /* registered instances (each owns copy threads) */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/bytes.h"
#include "pf/clock.h"
#include "pf/hal_gpu.h"

struct pf_engine;
struct pf_pool;
struct pf_cache;
struct pf_block;
struct pf_fault_plan;

struct pf_engine_config {
    struct pf_gpu *gpu;
    /* pool */
    uint64_t pool_size;
    uint64_t hint_value_size;
    bool use_hugepages;
    bool numa_affinity;
    uint32_t pool_shards;
    bool skip_memcheck; /* tests */
    /* cache */
    bool lfu_admission;
    /* save */
    bool blockwise_alloc;
    bool integrity; /* checksum sealed blocks (verification happens in SSD/P2P tiers) */
    bool pad_512;   /* host segment strides rounded to 512 bytes (SSD enabled) */
    /* timing (0 = defaults) */
    uint64_t lease_ttl_ns;         /* 600 s */
    uint64_t inflight_ttl_ns;      /* 300 s */
    uint64_t copy_timeout_ms;      /* save waits at most this for its D2H copy: 60 s */
    uint64_t save_chunk_bytes;     /* integrity on: copy+checksum pipeline chunk, 8 MiB */
    uint64_t load_chunk_bytes;     /* a Load's cancellable chunk (PF_XFER_CHUNK_BYTES) */
    const struct pf_clock *clock;  /* NULL = monotonic */
    const char *version;           /* required client_version (PF_VERSION) */
    const char *hll_windows;       /* reuse estimator windows, NULL = "15m,1h,1d" */
    unsigned hll_bits;             /* 0 = 16 */
    uint32_t prefetch_queue_depth; /* tasks waiting per prefetch pool (local, remote): 256 */
    struct pf_fault_plan *faults;  /* NULL = none; the engine checks "engine.seal" */
};

int pf_engine_create(const struct pf_engine_config *cfg, struct pf_engine **e_p, char *err,
                     size_t errlen);
/* Stops every background thread, unregisters every instance, frees. Accepts NULL. */
void pf_engine_destroy(struct pf_engine *e);

struct pf_engine_layer {
    const char *name;
    struct pf_ipc_desc ipc;
    uint64_t num_blocks;
    uint64_t bytes_per_block;
    uint64_t kv_stride_bytes;
    uint32_t segments;
    uint32_t group_id;
};

struct pf_engine_register {
    const char *instance_id;
    const char *namespace_;
    const char *client_version;
    uint32_t tp_rank, tp_size, world_size, pp_rank;
    int32_t device_id;
    int transfer_mode;
    bool page_first;
    const struct pf_engine_layer *layers;
    size_t nlayers;
};

int pf_engine_register(struct pf_engine *e, const struct pf_engine_register *r, char *err,
                       size_t errlen);

struct pf_engine_save_layer {
    const char *name;
    const uint32_t *block_ids;
    size_t nids;
    const struct pf_bytes *hashes;
    size_t nhashes;
};

int pf_engine_save(struct pf_engine *e, const char *instance_id, uint32_t tp_rank, uint32_t pp_rank,
                   int32_t device_id, const struct pf_engine_save_layer *layers, size_t nlayers,
                   char *err, size_t errlen);

struct pf_engine_query {
    const char *instance_id;
    const char *req_id;
    const struct pf_bytes *hashes;
    size_t n;
    bool wait_for_full_prefix;
    uint32_t group_id;
};

struct pf_engine_query_result {
    bool loading;
    uint32_t num_hit_blocks;
    bool has_lease;
    uint8_t lease[16];
    uint32_t *hit_positions; /* malloc'ed (caller frees), may be NULL */
    size_t nhit_positions;
};

int pf_engine_query(struct pf_engine *e, const struct pf_engine_query *q,
                    struct pf_engine_query_result *res, char *err, size_t errlen);
int pf_engine_release(struct pf_engine *e, const struct pf_bytes *lease, char *err, size_t errlen);

struct pf_engine_load_group {
    const char *const *layer_names;
    size_t n;
};

struct pf_engine_load_targets {
    const int64_t *block_ids; /* -1 = no destination */
    size_t n;
};

struct pf_engine_load_lease {
    struct pf_bytes lease;
    const struct pf_engine_load_targets *by_group;
    size_t ngroups;
};

struct pf_engine_load {
    const char *instance_id;
    uint32_t tp_rank;
    int32_t device_id;
    const char *load_state_shm;
    const struct pf_engine_load_group *groups;
    size_t ngroups;
    const struct pf_engine_load_lease *loads;
    size_t nloads;
};

/* Submits the H2D copies and returns; the load thread sets the shm state to 1 or -1.
 * Any error before submission sets the state to -1 (when the record could be attached). */
int pf_engine_load(struct pf_engine *e, const struct pf_engine_load *l, char *err, size_t errlen);

int pf_engine_unregister(struct pf_engine *e, const char *instance_id, char *err, size_t errlen);

/* Session streams: open returns a token; close(token) cleans the instance up only when the
 * token is still the instance's current one (a newer session supersedes older ones). */
int pf_engine_session_open(struct pf_engine *e, const char *instance_id, uint64_t *token_p);
void pf_engine_session_close(struct pf_engine *e, const char *instance_id, uint64_t token);

/* Admin (HTTP). */
/* 0 while the engine can serve; -ENOTRECOVERABLE with a sentence in why once its GPU
 * backend lost a device (hal_gpu.h "Lost device"): GET /health then answers 503. */
int pf_engine_health(struct pf_engine *e, char *why, size_t whylen);
/* Malloc'ed array of malloc'ed ids; returns count. */
size_t pf_engine_list_instances(struct pf_engine *e, char ***ids_p);
/* Unregisters one instance (id != NULL) or all; fills the removed ids (malloc'ed array of
 * malloc'ed strings) and the number of GPU mappings closed. -ENOENT when id is unknown. */
int pf_engine_cleanup_instances(struct pf_engine *e, const char *id, char ***removed_p,
                                size_t *nremoved_p, size_t *ntensors_p);

struct pf_engine_cleanup_result {
    uint64_t evicted_blocks;
    uint64_t evicted_bytes;
    uint64_t reclaimed_bytes;
    uint64_t still_referenced_blocks;
};
void pf_engine_cleanup_memory(struct pf_engine *e, struct pf_engine_cleanup_result *r);

/* Waits until every save handed to the insert thread so far is sealed (tests, P/D). */
int pf_engine_flush(struct pf_engine *e, uint64_t timeout_ms);

/* ---- backing tiers and hooks ----
 *
 * A tier is a place the query path can fetch a missing suffix from (SSD, a peer node).
 * When a group-0 query misses in RAM the engine makes a plan for the rest at query time
 * (docs/p2p.md "The plan"): local tiers (no discover) are asked with probe (no I/O), remote
 * tiers with one bounded discover; each position of the suffix is assigned to the first tier
 * that holds it, own SSD before peers, up to the first position nobody holds. A plan with
 * nothing beyond RAM answers Ready at once (no task). Otherwise a background task for that
 * req_id executes the plan on the tier's pool (local and remote tiers have separate bounded
 * work queues) and queries answer Loading; a short answer falls back to the next holder, then
 * the local tiers, for exactly the blocks still missing. The next query for the req_id
 * inserts the fetched blocks into the RAM cache with the tier's class and answers Ready with a
 * lease over RAM prefix + the contiguous fetched run. Tasks older than 5 minutes are dropped
 * (pegaflow_prefetch_stale_gc_total). */
struct pf_block_key;

/* One holder of a run of the suffix, as a remote tier's discover ranked it (best first). */
#define PF_TIER_NODE_MAX 256
struct pf_tier_source {
    char node[PF_TIER_NODE_MAX]; /* the holder's address */
    uint32_t len;                /* consecutive keys from keys[0] it advertised */
    bool down;                   /* inside its down window (ranked after every live holder) */
};
#define PF_TIER_SOURCES_MAX 8

struct pf_tier {
    const char *name; /* "ssd", "rdma": also the tier label of pegaflow_cache_tier_block_requests */
    int cls;          /* enum pf_block_class the fetched blocks get when promoted */
    /* Called on the query thread, must not block: how many consecutive keys from keys[0]
     * the tier holds (0 = none). Local tiers only (a tier with discover is not probed). */
    size_t (*probe)(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                    bool wait_for_full_prefix);
    /* Runs on a prefetch thread. Fetches up to n consecutive blocks from keys[0] into out[]
     * (strong references, sealed, checksums verified) and returns how many. Must bound every
     * wait. all_or_nothing: return n or 0. A remote tier's fetch discovers by itself and, with
     * all_or_nothing, waits (bounded) for a holder of all n (wait_for_full_prefix). */
    size_t (*fetch)(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                    bool all_or_nothing, struct pf_block **out);
    /* Optional, local tiers: fetch's contract (never all-or-nothing) waiting at most
     * timeout_ms, on any thread (pf_engine_fill_local: a peer's QueryBlocksForTransfer). */
    size_t (*fetch_within)(void *ctx, const struct pf_block_key *keys, size_t n,
                           uint64_t timeout_ms, struct pf_block **out);
    /* Optional: blocks of this tier were promoted into RAM (e.g. to re-advertise them). */
    void (*promoted)(void *ctx, struct pf_block *const *blocks, size_t n);
    /* Optional, makes the tier remote: discovery at query time on the query thread, bounded by
     * the tier's own short deadline and never waiting when the directory is known down. Fills
     * up to max holders of runs from keys[0], ranked best first, and returns how many (0:
     * nobody holds keys[0]); -1 when discovery is unavailable now (disabled, directory down or
     * slow, req_id blacklisted): the plan then uses local tiers only. */
    int (*discover)(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                    struct pf_tier_source *src, size_t max);
    /* Optional with discover: discover in two halves, so the query thread does its local
     * work (the reuse estimator's identities) while the directory answers. discover_start
     * begins it (sends the query) and returns a handle, or NULL when discovery is unavailable
     * now (discover's -1). discover_finish waits (bounded as discover) and returns discover's
     * result; src NULL drops the discovery (returns -1). Contract: finish on the thread that
     * started, exactly once per handle; keys valid and unchanged until then. */
    void *(*discover_start)(void *ctx, const char *req_id, const struct pf_block_key *keys,
                            size_t n);
    int (*discover_finish)(void *ctx, void *op, struct pf_tier_source *src, size_t max);
    /* Required with discover: fetches up to n consecutive blocks from keys[0] from one holder
     * (prefetch thread, bounded); returns how many (fetch's contract, never all-or-nothing).
     * A failure counts against the holder (its down window). *why_p (may be NULL) gets a
     * static reason for a short answer: "evicted", "error", "timeout", "down". */
    size_t (*fetch_from)(void *ctx, const char *req_id, const struct pf_tier_source *src,
                         const struct pf_block_key *keys, size_t n, struct pf_block **out,
                         const char **why_p);
    void *ctx;
};
/* Registers a tier (before serving traffic). 0, -ENOSPC, or -EINVAL (discover_start
 * without discover_finish or discover, or the reverse). */
int pf_engine_add_tier(struct pf_engine *e, const struct pf_tier *t);

/* Serving a peer (P2P QueryBlocksForTransfer): reads up to n consecutive blocks from keys[0]
 * from the first local tier with fetch_within that holds keys[0] (the SSD), waiting at most
 * timeout_ms, and promotes them into RAM as a finished prefetch does (cache insert with the
 * tier's class, sealed hooks, the tier's promoted callback). out[] gets strong references
 * (the resident block when the key became resident meanwhile); returns how many, 0 on any
 * error or timeout. *held_p (may be NULL) = how many the tier said it holds (so held - ret
 * were lost to an error, a timeout, a budget or a checksum). Any thread; bounded. */
size_t pf_engine_fill_local(struct pf_engine *e, const struct pf_block_key *keys, size_t n,
                            uint64_t timeout_ms, struct pf_block **out, size_t *held_p);

/* Hooks; called without engine locks held; must not block. */
struct pf_engine_hooks {
    /* on the insert thread: newly sealed blocks that became resident */
    void (*sealed)(void *ctx, struct pf_block *const *blocks, size_t n);
    /* blocks removed from RAM residency (pressure eviction or memory cleanup) */
    void (*evicted)(void *ctx, struct pf_block *const *blocks, size_t n);
    void *ctx;
};
int pf_engine_add_hooks(struct pf_engine *e, const struct pf_engine_hooks *h);

/* Quota of a Save (tenants, src/tenant): called by pf_engine_save once it knows the new
 * pinned bytes `need` (blocks not already resident) of a save by an instance in namespace id
 * ns, before allocating. Returns 0 to proceed, or -ENOSPC (RESOURCE_EXHAUSTED) with a
 * message in err. Runs on the RPC thread without engine locks; may call
 * pf_engine_evict_namespaces and pf_engine_flush. */
struct pf_engine_quota {
    int (*check)(void *ctx, struct pf_engine *e, uint32_t ns, uint64_t need, char *err,
                 size_t errlen);
    void *ctx;
};
/* Installs the quota hook (before serving traffic; NULL check = none). */
void pf_engine_set_quota(struct pf_engine *e, const struct pf_engine_quota *q);
/* Evicts resident, unreferenced RAM blocks of the namespace ids ns[0..nns), oldest first,
 * until their footprint reaches goal bytes or nothing more of them is evictable; blocks of
 * other namespaces are never touched. Evictions run the evicted hooks (reason "quota").
 * Returns the bytes of footprint evicted; *nblocks_p (may be NULL) the blocks. */
uint64_t pf_engine_evict_namespaces(struct pf_engine *e, const uint32_t *ns, size_t nns,
                                    uint64_t goal, uint64_t *nblocks_p);

/* Accessors for tiers and tests. */
struct pf_pool *pf_engine_pool(struct pf_engine *e);
struct pf_cache *pf_engine_cache(struct pf_engine *e);
/* The evicting allocator: pool allocation, evicting RAM blocks under pressure. */
struct pf_alloc;
int pf_engine_alloc(struct pf_engine *e, uint64_t size, int numa, struct pf_alloc **a_p);

#endif

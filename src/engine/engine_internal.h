/* Private structures of the engine module. */
#ifndef PF_ENGINE_INTERNAL_H
#define PF_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pf/block.h"
#include "pf/cache.h"
#include "pf/engine.h"
#include "pf/hll.h"
#include "pf/hal_gpu.h"
#include "pf/lease.h"
#include "pf/metrics.h"
#include "pf/pool.h"
#include "pf/thread.h"

/* ---- layout (layout.c) ---- */

/* One registered layer's addressing: segment s of block i lives at
 * base + i * block_stride + s * kv_stride. A copy moves copy_len bytes per segment copy:
 * contiguous layouts copy the whole block (K and V adjacent) once, split layouts copy K
 * and V separately (nseg = 2). */
struct pf_layout {
    pf_devptr_t base;
    uint64_t size;
    uint64_t num_blocks;
    uint64_t seg_bytes;
    uint64_t kv_stride;
    uint32_t segments;
    uint64_t block_stride;
    uint32_t nseg;        /* segment copies per block: 1 contiguous, 2 split */
    uint64_t copy_len;    /* bytes per segment copy */
    uint64_t host_stride; /* host bytes reserved per segment copy (512-padded with SSD) */
};

int pf_layout_init(struct pf_layout *l, pf_devptr_t base, uint64_t size, uint64_t num_blocks,
                   uint64_t seg_bytes, uint64_t kv_stride, uint32_t segments, bool pad512,
                   char *err, size_t errlen);

static inline pf_devptr_t pf_layout_addr(const struct pf_layout *l, uint64_t block, uint32_t seg)
{
    return l->base + block * l->block_stride + (seg ? l->kv_stride : 0);
}

/* ---- per-(instance, GPU) copy threads (gpu_worker.c) ---- */

/* With integrity on, a save's copy runs in chunks of about this many bytes (whole slots) and
 * the Save handler checksums each chunk's slots while the device copies the next one (the
 * bytes are hashed right after they land, still in cache; the insert thread only inserts).
 * 2 MiB chunks cost more in hand-offs than they saved with 64 KiB blocks (bench/README.md).
 * pf_engine_config.save_chunk_bytes overrides it (tests). */
#define PF_SAVE_CHUNK_BYTES (8u << 20)

struct pf_xfer;
typedef void (*pf_xfer_done_fn)(struct pf_xfer *x);

/* One batch of copies. Refcounted: the submitter and the worker each hold a reference.
 * `done_fn` runs on the worker thread once the copies finished (result in x->result). */
struct pf_xfer {
    _Atomic int refs;
    enum pf_copy_dir dir;
    enum pf_copy_mode mode;
    struct pf_copy_desc *descs;
    size_t n;
    uint64_t bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int result;
    pf_xfer_done_fn done_fn;
    void (*free_fn)(struct pf_xfer *x); /* releases what the task owns, then frees */
    /* optional: asked before each chunk (PF_XFER_CHUNK*, the first included); true
     * stops the batch there (result -ECANCELED, every submitted copy completed first) */
    bool (*cancel_fn)(struct pf_xfer *x);
    uint64_t chunk_bytes; /* with cancel_fn: a chunk's bytes (0: PF_XFER_CHUNK_BYTES) */
    void *ctx;
    /* D2H with integrity on: when hsums is set the copy thread asks the backend for the
     * fused copy + xxh3 (pf_gpu_copy_batch_hash, hash runs as hjoin says; both malloc'ed
     * by the submitter). hashed tells, once done, whether
     * hsums holds the checksums; false when the backend has no fused copy (then the copy
     * ran as a plain copy_batch and the submitter hashes the host bytes itself). pf_xfer_put
     * frees hjoin and hsums. */
    const uint8_t *hjoin;
    uint64_t *hsums;
    bool hashed;
};

/* A batch that can be cancelled (cancel_fn) is submitted in chunks, each synchronised
 * before cancel_fn is asked again: a chunk ends once it holds at least PF_XFER_CHUNK
 * copies and x->chunk_bytes (default PF_XFER_CHUNK_BYTES, --load-cancel-chunk) bytes, or
 * PF_XFER_CHUNK_MAX copies (pf_xfer_chunk_end). Every synchronisation is a pause of the
 * copy engine (64 KiB blocks, sim GPU, 1 GiB Loads: 4 MiB chunks 0.78-0.81 of the best
 * copy, 32 MiB 0.87-0.89, 64 MiB (1,024 copies) 0.96-0.97); a cancel waits for at most one chunk
 * (128 MiB: about 5 ms at PCIe 4 speed). */
#define PF_XFER_CHUNK       64
#define PF_XFER_CHUNK_BYTES (128ull << 20)
#define PF_XFER_CHUNK_MAX   1024

/* Where the chunk of x that starts at descriptor i ends (exclusive; > i when i < x->n). */
size_t pf_xfer_chunk_end(const struct pf_xfer *x, size_t i);

/* Upper bound of the copy threads (streams) per device and direction (gpu_worker.c). */
#define PF_COPY_STREAMS_MAX 4

struct pf_gpu_worker;

int pf_gpu_worker_create(struct pf_gpu *gpu, int hal_dev, int numa, int32_t device_id,
                         struct pf_gpu_worker **w_p);
/* Finishes queued work, joins the threads. Accepts NULL. */
void pf_gpu_worker_destroy(struct pf_gpu_worker *w);
/* Whether w's backend may offer the fused copy + hash: true until a copy_batch_hash on its
 * device answered -EOPNOTSUPP. */
bool pf_gpu_worker_can_hash(const struct pf_gpu_worker *w);
/* Queues x on the save (D2H) or load (H2D) thread; takes a reference. */
int pf_gpu_worker_submit(struct pf_gpu_worker *w, struct pf_xfer *x);

struct pf_xfer *pf_xfer_new(enum pf_copy_dir dir, enum pf_copy_mode mode, size_t ndescs);
void pf_xfer_put(struct pf_xfer *x);
/* Waits until the copies finished; returns x->result or -ETIMEDOUT. */
int pf_xfer_wait(struct pf_xfer *x, uint64_t timeout_ms);

/* ---- instances (instance.c) ---- */

struct pf_layer_reg {
    char *name;
    struct pf_gpu_mapping *map;
    struct pf_layout lay;
    uint32_t group;
    int layer_id; /* rank in the sorted layer names, after sealing */
};

struct pf_worker {
    int32_t device_id;
    int hal_dev;
    int numa;
    uint32_t tp_rank, pp_rank;
    enum pf_copy_mode mode;
    struct pf_layer_reg *layers;
    size_t nlayers;
    uint32_t *by_name; /* indices of layers sorted by name (pf_worker_layer bisects) */
    uint32_t shard;    /* page-first: the shard (slot) its layer set forms, after sealing */
    struct pf_gpu_worker *gw;
};

/* Where one layer (by layer id) of a sealed instance lives in a block (topology.c). */
struct pf_topo_layer {
    uint32_t group;  /* storage group (layer_group_ids) */
    uint32_t index;  /* layer-first: rank among its group's layers; page-first: its shard */
    uint64_t offset; /* page-first: byte offset of the layer in its shard's page */
    uint64_t bytes;  /* host bytes per block: layer-first host_stride x segments, page-first
                      * the copy length padded to 512 */
};

struct pf_instance {
    char *id;
    char *ns;
    uint32_t ns_id;
    uint32_t tp_size, world_size;
    bool page_first;
    struct pf_worker **workers; /* fixed capacity world_size; grows under inst_lock */
    size_t nworkers;
    /* Set (release) once the topology is complete; from then on the instance is immutable,
     * so request paths read its fields without the lock after an acquire load of it. */
    _Atomic bool sealed;
    char **layer_names; /* sorted, after sealing */
    size_t nlayer_names;
    struct pf_topo_layer *topo; /* per layer id, after sealing */
    uint32_t ngroups;           /* storage groups (dense ids 0..ngroups-1) */
    uint32_t *group_slots;      /* slots per block of each storage group */
    uint32_t nshards;           /* page-first: shards (= slots per block) */
    uint64_t *shard_bytes;      /* page-first: bytes of each shard's page */
    uint32_t total_slots;       /* group 0's slots per block */
    _Atomic int refs;
};

/* ---- insert thread (insert.c) ---- */

struct pf_insert_item {
    struct pf_block_key key;
    uint16_t slot;
    uint16_t nslots;  /* slots of the block (its storage group's slot count) */
    struct pf_slot s; /* holds allocation references */
};

struct pf_insert_barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    _Atomic int refs;
};

struct pf_insert_batch {
    size_t n;
    size_t cap; /* items allocated (pf_insert_batch_new) */
    int kind;   /* 0 items, 1 barrier */
    struct pf_engine *e;
    struct pf_insert_barrier *barrier;
    struct pf_insert_item items[];
};

/* ---- prefetch tasks (prefetch.c) ---- */

#define PF_MAX_TIERS 4
#define PF_MAX_HOOKS 4
/* Prefetch pools (docs/p2p.md "Isolation"): local tiers (SSD) and remote tiers (peers) run
 * on separate threads behind separate bounded queues, so a slow peer cannot hold up another
 * request's SSD hit. */
#define PF_PREFETCH_LOCAL   0
#define PF_PREFETCH_REMOTE  1
#define PF_PREFETCH_POOLS   2
#define PF_PREFETCH_THREADS 4 /* per pool */
#define PF_PREFETCH_QDEPTH                                                                         \
    256                     /* tasks waiting per pool (pf_engine_config.prefetch_queue_depth)      \
                             */
#define PF_PLAN_SEGS_MAX 32 /* runs of one plan, fallbacks included */

/* A run [start, end) of the suffix assigned to one tier. poll: the remote tier's own fetch
 * waiting for a holder of the whole run (wait_for_full_prefix). fallback: added after a
 * short answer (not counted in the plan, never falls back again). */
struct pf_plan_seg {
    uint32_t start, end;
    int8_t tier;
    bool poll, fallback;
};

struct pf_prefetch_pool {
    struct pf_queue q;
    pthread_t thr[PF_PREFETCH_THREADS];
    size_t nthr;
    struct pf_engine *e;
    int kind;
    struct pf_metric_child *c_full; /* pegaflow_prefetch_queue_full_total{pool} */
};

struct pf_prefetch_task {
    struct pf_hnode hnode;
    _Atomic int refs;
    char *req_id;
    char *instance; /* the key is (instance, req_id) */
    uint64_t created_ns;
    struct pf_block_key *keys; /* the suffix after the RAM prefix */
    size_t n;
    struct pf_block **prefix; /* RAM prefix at task start (strong references) */
    size_t nprefix;
    bool wait_full;
    bool attached; /* still in the registry */
    struct pf_engine *e;
    uint64_t pinned; /* bytes of the blocks this task references (prefetch_pinned gauge) */
    /* the plan (query time) and its execution (one worker at a time) */
    struct pf_plan_seg segs[PF_PLAN_SEGS_MAX];
    size_t nsegs;
    struct pf_tier_source src[PF_TIER_SOURCES_MAX]; /* the remote tier's holders, ranked */
    size_t nsrc;
    bool src_failed[PF_TIER_SOURCES_MAX];
    bool remote_off; /* the remote queue was full: local tiers only from here */
    uint32_t planned[PF_MAX_TIERS], delivered[PF_MAX_TIERS];
    const char *why[PF_MAX_TIERS]; /* shortfall reason per tier */
    struct pf_block **work;        /* n slots, work[0..pos) fetched so far */
    int8_t *work_tier;             /* the tier each work block came from */
    size_t pos;
    /* result, under the registry lock */
    bool done;
    uint64_t done_ns;
    struct pf_block **fetched;
    int8_t *fetched_tier;
    size_t nfetched;
};

/* The plan of a prefix query's suffix (query time, query thread). */
struct pf_plan {
    struct pf_plan_seg segs[PF_PLAN_SEGS_MAX];
    size_t nsegs;
    struct pf_tier_source src[PF_TIER_SOURCES_MAX];
    size_t nsrc;
    size_t covered; /* positions [0, covered) have a tier */
    uint32_t planned[PF_MAX_TIERS];
    void *dop;     /* the remote tier's discovery in flight (pf_prefetch_plan_start) */
    bool dstarted; /* dop came from discover_start (NULL: discovery unavailable) */
};

/* ---- the engine ---- */

struct pf_inflight;

struct pf_session_ent {
    char *instance;
    uint64_t token;
};

struct pf_engine {
    struct pf_engine_config cfg;
    struct pf_gpu *gpu;
    struct pf_pool *pool;
    struct pf_cache *cache;
    struct pf_lease_table *leases;

    pthread_rwlock_t inst_lock;
    struct pf_instance **insts;
    size_t ninsts, capinsts;

    pthread_mutex_t sess_mu;
    struct pf_session_ent *sessions;
    size_t nsessions, capsessions;
    uint64_t next_token;

    /* insert thread */
    struct pf_queue insert_q;
    pthread_t insert_thr;
    struct pf_htable inflight; /* insert thread only */
    uint64_t inflight_bytes;

    /* background GC */
    pthread_t gc_thr;
    pthread_mutex_t gc_mu;
    pthread_cond_t gc_cv;
    bool stopping;

    pthread_mutex_t evict_mu; /* one evictor at a time */

    /* tiers, hooks, prefetch */
    struct pf_tier tiers[PF_MAX_TIERS];
    size_t ntiers;
    struct pf_engine_hooks hooks[PF_MAX_HOOKS];
    size_t nhooks;
    struct pf_engine_quota quota; /* set before serving (pf_engine_set_quota) */
    pthread_mutex_t pf_mu;
    struct pf_htable pf_tasks;
    struct pf_prefetch_pool pf_pool[PF_PREFETCH_POOLS];
    struct pf_metric *m_delivered, *m_shortfall, *m_qfull;
    struct pf_metric *m_stale_gc;
    struct pf_metric *m_pf_pinned; /* gauge: bytes referenced by prefetch tasks */
    _Atomic uint64_t pf_pinned;
    struct pf_hll_set *hll;

    /* metrics */
    struct pf_metric *m_alloc_fail, *m_inflight_bytes, *m_inflight_gc, *m_hits, *m_misses, *m_tier,
        *m_evictions, *m_evict_class, *m_evict_still_ref, *m_evict_queued, *m_reclaimed,
        *m_residence, *m_save_bytes, *m_load_bytes, *m_save_dur, *m_load_dur, *m_load_fail,
        *m_load_cancelled;
};

/* instance.c */
struct pf_instance *pf_engine_instance_get(struct pf_engine *e, const char *id);
void pf_instance_put(struct pf_instance *in);
struct pf_worker *pf_instance_worker(struct pf_instance *in, int32_t device_id);
/* 0 when every worker of the instance has registered (sealed, acquire); else -EINVAL with
 * "registration incomplete: n/world_size workers registered" in err. */
int pf_instance_check_sealed(struct pf_engine *e, struct pf_instance *in, char *err, size_t errlen);
struct pf_layer_reg *pf_worker_layer(struct pf_worker *w, const char *name);
int pf_engine_remove_instance(struct pf_engine *e, const char *id, size_t *ntensors_p);

/* topology.c: sealing and slot arithmetic (reference §3.2).
 *
 * Layer-first (default): layer id = rank of the name among all registered names; a layer of
 * storage group g that is the k-th of g's layers (in layer-id order) has slot
 * k * tp_size + tp_rank, and a block of group g has group_slots[g] = layers(g) * tp_size
 * slots. Page-first (MLA): every distinct layer set a worker registered is a shard (equal
 * sets are replicas, disjoint sets a layer split), shards ordered by their smallest layer id;
 * a block has one slot per shard, a page holding the shard's layers in layer-id order at
 * prefix sums of their sizes padded to 512 bytes (whether or not the server has an SSD
 * tier, so that a page means the same on every node). */

/* Builds w->by_name (the name index pf_worker_layer bisects). 0 or -ENOMEM. */
int pf_worker_index_layers(struct pf_worker *w);
/* Seals the topology of in from its workers: validates it (messages name the layers,
 * devices or ids at fault; -EINVAL) and fills layer_names, topo, groups, shards, the
 * workers' layer ids and shards. On error nothing is left allocated. -ENOMEM possible. */
int pf_topology_seal(struct pf_instance *in, char *err, size_t errlen);
/* Frees what pf_topology_seal allocated. */
void pf_topology_free(struct pf_instance *in);
/* Layer id of name in a sealed instance, or -1. */
int pf_instance_layer_id(const struct pf_instance *in, const char *name);
/* Slot of (layer id, tp_rank) inside blocks of the layer's storage group. */
static inline uint32_t pf_instance_slot_of(const struct pf_instance *in, int layer_id,
                                           uint32_t tp_rank)
{
    const struct pf_topo_layer *t = &in->topo[layer_id];
    return in->page_first ? t->index : t->index * in->tp_size + tp_rank;
}
/* Slots per block of storage group g (g < ngroups). */
static inline uint32_t pf_instance_group_slots(const struct pf_instance *in, uint32_t g)
{
    return in->page_first ? in->nshards : in->group_slots[g];
}
/* Slot of (layer name, tp_rank) in a sealed instance, or -1. */
int pf_instance_slot(const struct pf_instance *in, const char *layer, uint32_t tp_rank);
/* The cache key of hash in storage group g: the hash itself for group 0, the hash with the
 * 4-byte big-endian group id appended for g > 0 (reference §2.3). -EINVAL when the hash is
 * empty or the key would exceed PF_HASH_MAX bytes. */
int pf_group_key(uint32_t ns, const void *hash, size_t len, uint32_t g, struct pf_block_key *k_p);
/* The longest hash pf_group_key accepts for group g. */
static inline size_t pf_group_hash_max(uint32_t g)
{
    return g ? PF_HASH_MAX - 4 : PF_HASH_MAX;
}

/* insert.c */
int pf_insert_start(struct pf_engine *e);
void pf_insert_stop(struct pf_engine *e);
int pf_insert_post(struct pf_engine *e, struct pf_insert_batch *b);
/* A zeroed batch with room for cap items, or NULL. Large batches (a Save of thousands of
 * blocks x layers: ~112 bytes a slot) are mapped and unmapped whole, so a backlog of them
 * does not stay in the heap once processed. pf_insert_batch_free accepts NULL. */
struct pf_insert_batch *pf_insert_batch_new(size_t cap);
void pf_insert_batch_free(struct pf_insert_batch *b);

/* prefetch.c */
int pf_prefetch_start(struct pf_engine *e);
void pf_prefetch_stop(struct pf_engine *e);
/* Looks (instance, req_id) up: 0 no task, 1 running (answer Loading), 2 done (*task_p
 * detached and returned with a reference). Another instance's task of the same req_id is
 * never seen. */
int pf_prefetch_take(struct pf_engine *e, const char *instance, const char *req_id,
                     struct pf_prefetch_task **task_p);
/* Starts the plan for keys[0..n): clears it and, when the remote tier discovers in two
 * halves, sends its discovery; returns whether one is in flight (the caller may do local
 * work until pf_prefetch_plan, on this thread; keys stay unchanged until then). */
bool pf_prefetch_plan_start(struct pf_engine *e, const char *req_id,
                            const struct pf_block_key *keys, size_t n, struct pf_plan *plan);
/* Makes the plan started by pf_prefetch_plan_start for the same keys[0..n) (the suffix after
 * the RAM prefix): local tiers by probe, the remote tier by one bounded discovery (the one in
 * flight, or discover now), own SSD before peers, up to the first position nobody holds.
 * wait_full: a plan that does not cover all n is replaced by local runs plus one polling run
 * of the remote tier for the rest (when discovery is available), else it is empty. Never
 * blocks beyond the remote tier's discovery deadline. */
void pf_prefetch_plan(struct pf_engine *e, const char *req_id, const struct pf_block_key *keys,
                      size_t n, bool wait_full, struct pf_plan *plan);
/* Starts a task of (instance, req_id) executing plan, owning prefix[0..nprefix) references;
 * returns 0 or -errno (then the references are still the caller's; -EAGAIN: the first
 * pool's queue is full). */
int pf_prefetch_begin(struct pf_engine *e, const char *instance, const char *req_id,
                      const struct pf_block_key *keys, size_t n, struct pf_block **prefix,
                      size_t nprefix, bool wait_full, const struct pf_plan *plan);
void pf_prefetch_task_put(struct pf_prefetch_task *t);
/* Drops tasks nobody will collect: every task older than max_age_ns, every finished task
 * not collected within PF_PREFETCH_UNPOLLED_NS of finishing, and (instance != NULL) every
 * task of that instance. Returns how many. */
size_t pf_prefetch_gc(struct pf_engine *e, uint64_t max_age_ns, const char *instance);
/* A finished task whose client never asked again (request aborted, worker died) is dropped
 * this long after it finished; the maintenance thread checks every PF_GC_TICK_MS. */
#define PF_PREFETCH_UNPOLLED_NS (10 * PF_NS_PER_SEC)
#define PF_GC_TICK_MS           5000
/* engine.c */
void pf_engine_run_sealed_hooks(struct pf_engine *e, struct pf_block *const *b, size_t n);
void pf_engine_evicted(struct pf_engine *e, struct pf_block **blocks, size_t n, const char *reason);

#endif

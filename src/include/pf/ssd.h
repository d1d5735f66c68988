/* SSD tier: sealed KV blocks spilled to O_DIRECT files through the BLK HAL, and fetched back
 * into RAM on a prefix miss (reference §5; docs/ssd.md).
 *
 * Files: with one path and one shard the path is the cache file; otherwise each path is a
 * directory holding shard-NNNNNN.dat files (global id = path index x shards + local index).
 * Files are created (with their parent directories) and sized to capacity / shards rounded
 * down to 512 bytes. Each starts with a superblock and every record with a self-describing
 * header (docs/ssd.md, "On-disk format"): with recover set, a background scan rebuilds the
 * index from the files while the tier serves (the writer starts after it); otherwise the
 * files get a new identity and start empty. A file of another format is refused unless
 * reformat is set.
 *
 * Write pipeline: the engine's `sealed` hook offers newly resident blocks as weak
 * references into a bounded queue of write_queue_depth batches (never blocks; a full queue
 * drops the batch and counts pegaflow_ssd_write_queue_full). One writer thread upgrades
 * each weak reference when it takes the block (blocks freed meanwhile are skipped), places
 * it in the next shard's ring (round-robin) as a WRITING index entry, keeps at most
 * write_inflight write requests in flight (each up to 8 records that follow each other in
 * the ring, one vectored write) and commits the blocks in order.
 *
 * Prefetch: a struct pf_tier ("ssd", promoted as retained). probe counts the consecutive
 * COMMITTED keys (query thread, no I/O). fetch (a prefetch thread) reserves
 * min(found, available) blocks of the global max_prefetch_blocks budget (all or nothing
 * when asked), submits one batch to a bounded queue of prefetch_queue_depth batches (full
 * -> nothing fetched), and waits (bounded) for the reader thread, which stages the blocks
 * in one pool allocation per NUMA node (the engine's evicting allocator) and keeps at most
 * prefetch_inflight read requests in flight (each up to read_merge records that follow each
 * other in the ring, headers included, as one vectored read into the staging blocks and a
 * scratch buffer for the headers). A block is returned only when the read length
 * matches, its ring range was not overwritten meanwhile, its record header verifies and
 * names it (checksum, key, sequence number, layout) and every slot checksum verifies;
 * a mismatch counts pegaflow_integrity_failures_total{tier="ssd"}, is logged, and drops the
 * entry.
 *
 * Every wait is bounded (io_timeout_ms). Memory handed to the device is kept referenced
 * until its completion is reaped, even after a timeout. */
#ifndef PF_SSD_H
#define PF_SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pf_blk;
struct pf_block;
struct pf_block_key;
struct pf_engine;
struct pf_pool;
struct pf_ssd;

struct pf_ssd_config {
    const char *const *paths; /* --ssd-cache-path (>= 1) */
    size_t npaths;
    uint64_t capacity;               /* --ssd-cache-capacity, all shards together */
    uint32_t shards_per_path;        /* --ssd-cache-shards (0 = 1) */
    uint32_t write_queue_depth;      /* batches (0 = 8) */
    uint32_t prefetch_queue_depth;   /* batches (0 = 2) */
    uint32_t write_inflight;         /* write requests, each up to write_merge records (0 = 2) */
    uint32_t write_merge;            /* records one write request may carry (0 = 8, max 64) */
    uint32_t prefetch_inflight;      /* read requests, each up to read_merge records (0 = 16) */
    uint32_t read_merge;             /* records one read request may carry (0 = 8, max 64) */
    uint32_t max_prefetch_blocks;    /* global budget (0 = 800) */
    uint64_t prefetch_staging_bytes; /* staging memory of reads not yet handed back (0 = 1 GiB) */
    bool integrity;                  /* verify slot checksums after reads */
    bool recover;  /* --ssd-recover: rebuild the index from the files at start (else empty) */
    bool reformat; /* --ssd-reformat: overwrite files of another format (else refuse them) */
    uint64_t io_timeout_ms; /* bound on one block I/O and on a fetch (0 = 30 s) */
    struct pf_blk *blk;     /* opened BLK backend, not owned */
    /* Staging memory before (or without) pf_ssd_attach: plain allocations from pool
     * (tests). After attach: the engine's evicting allocator. */
    struct pf_pool *pool;
};

/* Opens (creates, sizes) every shard file, reads its superblock, starts the writer and
 * reader threads and the recovery scan. Logs the configuration. Errors (-EPROTO a file of
 * another format without reformat, (-EINVAL bad configuration, -ENOSPC capacity
 * larger than the free space, -ENOENT/-EACCES/-ENOTDIR unopenable path, -EINVAL a file
 * system without O_DIRECT, others) come with a one-line message naming the path in err. */
int pf_ssd_create(const struct pf_ssd_config *cfg, struct pf_ssd **s_p, char *err, size_t errlen);
/* Registers the tier and the sealed hook with the engine (before it serves traffic) and
 * stages prefetches through pf_engine_alloc from then on. Once per store. 0, -EBUSY
 * (already attached) or the engine's error. */
int pf_ssd_attach(struct pf_ssd *s, struct pf_engine *e);
/* Stops the threads: queued writes are dropped, writes and reads in flight are waited for
 * (bounded), waiting fetches return empty. Afterwards offers are ignored, probe answers 0
 * and fetch returns 0, so the engine may still call the tier until it is destroyed.
 * Call before pf_engine_destroy (the store holds block references). Idempotent. */
void pf_ssd_stop(struct pf_ssd *s);
/* Stops (if needed) and frees; closes the files. Call after pf_engine_destroy when the
 * store was attached. Accepts NULL. */
void pf_ssd_destroy(struct pf_ssd *s);

/* The sealed hook: offers blocks for writing without blocking. The caller keeps its strong
 * references. 0, -EAGAIN (queue full: dropped and counted), -ESHUTDOWN, -ENOMEM. */
int pf_ssd_offer(struct pf_ssd *s, struct pf_block *const *blocks, size_t n);
/* Waits until every batch offered before the call is committed or dropped. 0, -ETIMEDOUT
 * or -ESHUTDOWN (the store is stopping or stopped). Any thread. */
int pf_ssd_flush(struct pf_ssd *s, uint64_t timeout_ms);

/* Shutdown drain (SIGTERM): waits until every save the engine accepted is sealed and every
 * batch offered so far is written (or dropped), bounded by timeout_ms in all, and logs
 * what it did. What is not written by then is simply not recovered by the next start.
 * 0 or -ETIMEDOUT / -ESHUTDOWN. Call before pf_ssd_stop, once traffic has stopped. */
int pf_ssd_drain(struct pf_ssd *s, uint64_t timeout_ms);

/* Tier operations (also usable directly by tests); see struct pf_tier in pf/engine.h. */
size_t pf_ssd_probe(struct pf_ssd *s, const struct pf_block_key *keys, size_t n);
size_t pf_ssd_fetch(struct pf_ssd *s, const struct pf_block_key *keys, size_t n,
                    bool all_or_nothing, struct pf_block **out);
/* pf_ssd_fetch waiting at most timeout_ms for the reader (pf_ssd_fetch: 2 x io_timeout_ms);
 * on timeout the batch is abandoned (the reader drops its blocks) and 0 is returned. For
 * callers with a short deadline of their own (a peer's QueryBlocksForTransfer). */
size_t pf_ssd_fetch_within(struct pf_ssd *s, const struct pf_block_key *keys, size_t n,
                           bool all_or_nothing, uint64_t timeout_ms, struct pf_block **out);

/* Called (on the query thread, must not block) with blocks promoted from SSD into RAM, so
 * a MetaServer client can re-advertise them. Set before serving traffic; fn may be NULL. */
typedef void (*pf_ssd_promoted_fn)(void *ctx, struct pf_block *const *blocks, size_t n);
void pf_ssd_set_promoted(struct pf_ssd *s, pf_ssd_promoted_fn fn, void *ctx);

/* Called once on the recovery thread when the scan has finished and recovered at least one
 * block (e.g. to re-register them with the MetaServer); must not block. Set any time. */
typedef void (*pf_ssd_recovered_fn)(void *ctx, uint64_t blocks);
void pf_ssd_set_recovered(struct pf_ssd *s, pf_ssd_recovered_fn fn, void *ctx);
/* Calls fn for every committed key (under the index lock: fn must be quick and must not
 * call the tier) until it returns non-zero, which is returned. */
int pf_ssd_for_each_key(struct pf_ssd *s, int (*fn)(void *ctx, const struct pf_block_key *k),
                        void *ctx);

/* SSD byte quotas (tenants, src/tenant; docs/security.md "Tenants"). Before writing a block
 * of namespace id ns the writer asks lookup, outside the store's locks: it returns the quota
 * in bytes of the tenant owning ns (0: no quota; then nothing else is set) and the namespace
 * ids the quota covers (malloc'ed into *ids_p, *nids_p entries; the caller frees) and the
 * tenant's name (into tenant, tlen bytes). When the tenant's live bytes (pf_ssd_ns_bytes over
 * the ids) plus the record would exceed the quota, the tenant's own oldest committed index
 * entries are dropped until it fits (never another namespace's; counted by shed); a record
 * that still does not fit, or is larger than the quota, is not written (refused). The
 * callbacks run on the writer thread and must not call the store. */
struct pf_ssd_quota {
    uint64_t (*lookup)(void *ctx, uint32_t ns, uint32_t **ids_p, size_t *nids_p, char *tenant,
                       size_t tlen);
    void (*shed)(void *ctx, const char *tenant, uint64_t blocks, uint64_t bytes);
    void (*refused)(void *ctx, const char *tenant, uint64_t bytes);
    void *ctx;
};
/* Installs (q) or removes (NULL) the quota hook; any time. Returns once no call of the
 * previous hook is running, so its context may be freed after a removal. */
void pf_ssd_set_quota(struct pf_ssd *s, const struct pf_ssd_quota *q);
/* Live SSD bytes of namespace id ns: the ring bytes (record header + payload) of every block
 * the index holds for it (writes in flight included), 0 when none. */
uint64_t pf_ssd_ns_bytes(struct pf_ssd *s, uint32_t ns);

struct pf_ssd_stats {
    uint32_t shards;
    uint64_t shard_capacity;
    uint64_t writing, committed; /* index entries */
    uint64_t prefetch_reserved;  /* budget in use */
    bool recovery_done;          /* the recovery scan finished (or none was needed) */
};
void pf_ssd_stats(struct pf_ssd *s, struct pf_ssd_stats *st);

#endif

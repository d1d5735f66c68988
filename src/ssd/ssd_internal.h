/* Private structures of the SSD tier (src/ssd/). See pf/ssd.h for the public contract and
 * docs/ssd.md for the design. Nothing here is thread-safe on its own: the store's locks
 * (store.c) guard the index and the rings. */
#ifndef PF_SSD_INTERNAL_H
#define PF_SSD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "pf/block.h"
#include "pf/hal_blk.h"
#include "pf/htable.h"
#include "pf/list.h"
#include "pf/metrics.h"
#include "pf/ssd.h"
#include "ssd/format.h"

/* ---- ring arithmetic (ring.c) ----
 *
 * A shard is a log-structured ring of cap bytes. head counts every byte ever allocated
 * (logical, never wraps); a block occupies one contiguous logical range [start, start+len)
 * stored at file offset start % cap. A block that does not fit before the physical end
 * skips the remainder and starts at the wrap point. tail = head - cap (0 before the first
 * lap): a range whose start is below tail has been (or is being) overwritten. */
struct ssd_ring {
    uint64_t cap; /* bytes, multiple of PF_BLK_ALIGN */
    uint64_t head;
};

void ssd_ring_init(struct ssd_ring *r, uint64_t cap);
static inline uint64_t ssd_ring_tail(const struct ssd_ring *r)
{
    return r->head > r->cap ? r->head - r->cap : 0;
}
/* Whether the range starting at start is still intact. */
static inline bool ssd_ring_valid(const struct ssd_ring *r, uint64_t start)
{
    return start >= ssd_ring_tail(r);
}
/* Where the next len bytes would go (logical start, including any wrap skip) and the tail
 * after that allocation. -E2BIG when len exceeds the ring, -EINVAL when len is 0. */
int ssd_ring_plan(const struct ssd_ring *r, uint64_t len, uint64_t *start_p, uint64_t *tail_p);
/* Allocates len bytes: logical start and file offset. Errors as ssd_ring_plan. */
int ssd_ring_alloc(struct ssd_ring *r, uint64_t len, uint64_t *start_p, uint64_t *off_p);

/* ---- index (index.c) ----
 *
 * key -> entry, two-phase: WRITING (space reserved, write in flight, not readable) ->
 * COMMITTED (readable while its range is valid). Each shard keeps its entries in a FIFO by
 * logical start, so entries overtaken by the ring tail are pruned from the front whenever
 * space is allocated. Duplicate keys (in either state) are refused. Shards are chosen
 * round-robin. */
enum ssd_state {
    SSD_WRITING = 1,
    SSD_COMMITTED = 2,
};

struct ssd_slot_meta {
    uint64_t checksum;
    uint32_t seg_len;
    uint32_t seg_stride;
    int16_t numa;
    uint8_t nseg;
    uint8_t has_checksum;
};

struct ssd_entry {
    struct pf_hnode hnode;
    struct pf_list fifo;
    struct pf_list nsfifo; /* the namespace's entries, by sequence number */
    struct pf_block_key key;
    uint32_t shard;
    uint8_t state;
    uint8_t recovered; /* rebuilt by the recovery scan (not written by this process) */
    uint16_t nslots;
    uint64_t start; /* logical start of the record (header) */
    uint64_t off;   /* file offset of the payload */
    uint64_t len;   /* payload bytes */
    uint64_t seq;   /* record sequence number */
    uint64_t fp;    /* layout fingerprint (ssd_layout_fp) */
    uint64_t span;  /* ring bytes of the record (header + payload, ssd_rec_span) */
    struct ssd_slot_meta slots[];
};

/* Where a block lives: enough to read it back and to re-check it, without the entry. */
struct ssd_place {
    uint32_t shard;
    uint32_t hdr_len; /* record header bytes before off */
    uint64_t start, off, len;
    uint64_t span; /* prefetch: ring bytes of the record */
    uint64_t seq;  /* prefetch: the record's sequence number, checked against its header */
    uint64_t fp;   /* prefetch: layout fingerprint, checked against the header */
};

struct ssd_index_shard {
    struct ssd_ring ring;
    struct pf_list fifo;
};

/* Live bytes of one namespace: the spans of its indexed entries (WRITING ones included:
 * their space is reserved), and the entries oldest first. */
struct ssd_ns {
    uint64_t bytes;
    uint64_t entries;
    struct pf_list fifo;
};

struct ssd_index {
    struct pf_htable table;
    struct ssd_ns **ns; /* by namespace id, allocated on first use */
    uint32_t nns;
    struct ssd_index_shard *shards;
    uint32_t nshards;
    uint32_t next_shard;
    uint64_t nwriting, ncommitted;
    uint64_t overtaken; /* WRITING entries pruned by the tail (never happens with one writer
                         * that drains before overtaking its own writes) */
    uint64_t ring_off;  /* file offset of ring offset 0 (the superblock before it) */
};

/* shard_cap: ring bytes per shard, which start at file offset ring_off. */
int ssd_index_init(struct ssd_index *x, uint32_t nshards, uint64_t shard_cap, uint64_t ring_off);
void ssd_index_destroy(struct ssd_index *x);
struct ssd_entry *ssd_index_find(struct ssd_index *x, const struct pf_block_key *k);
/* The shard and placement the next ssd_index_begin of len bytes would use, and the tail it
 * would leave there (to avoid overtaking writes still in flight). -E2BIG: larger than a
 * shard. */
int ssd_index_peek(const struct ssd_index *x, uint64_t len, uint32_t *shard_p, uint64_t *start_p,
                   uint64_t *tail_p);
/* Starts a write of b (a record of hdr_len + len bytes on disk, slots[] its geometry and
 * checksums): -EEXIST when the key is indexed (either state), -E2BIG when larger than a
 * shard, -ENOMEM. Allocates ring space on the next shard, prunes overtaken entries, inserts
 * a WRITING entry. p_p->off is the payload offset (the header goes at off - hdr_len). */
int ssd_index_begin(struct ssd_index *x, const struct pf_block *b, const struct ssd_rec_slot *slots,
                    uint32_t hdr_len, uint64_t len, uint64_t seq, struct ssd_place *p_p);
/* Removes entry e whatever its state. */
void ssd_index_drop(struct ssd_index *x, struct ssd_entry *e);
/* Inserts a COMMITTED entry built by the recovery scan (key, shard, start, span, seq set;
 * the key not indexed yet) at the end of its shard's FIFO. -ENOMEM (e not inserted). */
int ssd_index_insert(struct ssd_index *x, struct ssd_entry *e);
/* Orders every namespace's entries by sequence number (after the recovery scan, which
 * inserts in disk order). */
int ssd_index_ns_sort(struct ssd_index *x);
/* Live bytes (entry spans) of namespace ns: every entry the index holds counts, from
 * ssd_index_begin / ssd_index_insert until it is dropped, removed, superseded or overtaken
 * by the ring. */
uint64_t ssd_index_ns_bytes(const struct ssd_index *x, uint32_t ns);
/* Drops the COMMITTED entries of the namespaces ns[0..nns), oldest (lowest sequence number)
 * first, until their live bytes are at most goal or none is left to drop (WRITING entries
 * are never dropped). Returns the entries dropped; *bytes_p (may be NULL) their spans. */
uint64_t ssd_index_shed(struct ssd_index *x, const uint32_t *ns, size_t nns, uint64_t goal,
                        uint64_t *bytes_p);
/* WRITING -> COMMITTED for the entry of key at place. 0, or -ENOENT when it is gone
 * (overtaken) or not the same write. */
int ssd_index_commit(struct ssd_index *x, const struct pf_block_key *k, const struct ssd_place *p);
/* Removes the entry of key at place, whatever its state (failed write, corrupt data). */
bool ssd_index_remove(struct ssd_index *x, const struct pf_block_key *k, const struct ssd_place *p);
/* Consecutive keys from keys[0] that are COMMITTED and intact. */
size_t ssd_index_prefix(struct ssd_index *x, const struct pf_block_key *keys, size_t n);
/* Whether place's range is still intact (not overtaken by the ring since it was read). */
bool ssd_index_intact(const struct ssd_index *x, const struct ssd_place *p);

/* ---- serialization (layout.c) ----
 *
 * On disk a block is all its slots in slot order, each slot's segments in order (K then V),
 * each segment seg_stride bytes (512-padded host strides); the index entry keeps each slot's
 * seg_len, seg_stride, nseg, NUMA node and checksum. */

/* Bytes the block occupies on disk, or 0 when it cannot be written with O_DIRECT (a segment
 * address or stride not aligned to PF_BLK_ALIGN, or no data). */
uint64_t ssd_block_disk_len(const struct pf_block *b);
/* Segments of b in disk order, adjacent ones merged. Returns the count (<= 2 * nslots);
 * iov must have room for 2 * nslots entries. */
int ssd_block_iov(const struct pf_block *b, struct iovec *iov);
/* Bytes of one slot on disk. */
static inline uint64_t ssd_slot_disk_len(const struct ssd_slot_meta *m)
{
    return (uint64_t)m->seg_stride * m->nseg;
}
/* Rebuilds a sealed block from its entry geometry and the staging addresses of each slot
 * (slot i's bytes at base[i], segments seg_stride apart) inside allocs[i] (a reference is
 * taken per segment). NULL on ENOMEM or when the entry's geometry cannot be packed. */
struct pf_block *ssd_block_rebuild(const struct pf_block_key *key, const struct ssd_slot_meta *m,
                                   uint16_t nslots, uint8_t *const *base,
                                   struct pf_alloc *const *allocs);
/* Index of the first slot whose checksum does not verify, or -1 (slots without a checksum
 * are skipped). */
int ssd_block_verify(const struct pf_block *b);

/* ---- prefetch budget (fetch.c) ---- */
struct ssd_budget {
    uint64_t max;
    uint64_t used;
};
/* Reserves min(found, available) blocks, or (strict) found or nothing. Returns the count. */
uint64_t ssd_budget_reserve(struct ssd_budget *b, uint64_t found, bool strict);
void ssd_budget_release(struct ssd_budget *b, uint64_t n);

/* ---- multi-part vectored I/O (io.c) ----
 *
 * One block = one readv/writev, split into parts of at most SSD_IOV_MAX iovecs when it has
 * more segments than the kernel takes at once. Tags are id << 16 | part. */
#define SSD_IOV_MAX    1024
#define SSD_TAG_SHIFT  16
#define SSD_PARTS_MAX  (1u << SSD_TAG_SHIFT)
#define SSD_POLL_BATCH 64

struct ssd_io {
    uint64_t id;
    enum pf_blk_op op;
    struct pf_blk_file *file;
    uint64_t off, len;
    struct iovec *iov; /* malloc'ed */
    int niov;
    uint32_t nparts, submitted, completed;
    uint64_t next_off; /* file offset of the next part to submit */
    uint64_t bytes;
    int err;
    uint64_t t0_ns;
};

static inline uint32_t ssd_io_parts(int niov)
{
    return (uint32_t)((niov + SSD_IOV_MAX - 1) / SSD_IOV_MAX);
}
/* Submits the parts not yet submitted. 0 (all or some submitted; -EAGAIN leaves the rest
 * for later) or -errno: the part failed to submit, io->err is set and no further parts
 * will be submitted. */
int ssd_io_submit(struct pf_blk_queue *q, struct ssd_io *io);
/* Records the completion of one part. */
void ssd_io_complete(struct ssd_io *io, int64_t res);
/* All submitted parts completed and nothing left to submit (or submission failed). */
static inline bool ssd_io_done(const struct ssd_io *io)
{
    return io->completed == io->submitted && (io->submitted == io->nparts || io->err);
}
static inline bool ssd_io_ok(const struct ssd_io *io)
{
    return io->err == 0 && io->bytes == io->len;
}
/* Parts still owned by the device (submitted, not completed). */
static inline uint32_t ssd_io_outstanding(const struct ssd_io *io)
{
    return io->submitted - io->completed;
}

/* ---- the store (store.c, writer.c, prefetch.c, fetch.c) ---- */

enum ssd_drop {
    SSD_DROP_TORN,     /* header verifies, payload does not (or runs past the ring end) */
    SSD_DROP_HEADER,   /* record magic, header checksum or fields do not verify */
    SSD_DROP_VERSION,  /* record version this build does not read */
    SSD_DROP_IDENTITY, /* intact record of another file identity (a reset, another file) */
    SSD_DROP_OLDER,    /* an older record of a key that a newer record replaces */
    SSD_DROP_GEOMETRY, /* layout no longer matches its namespace */
    SSD_DROP_NREASONS
};
extern const char *const ssd_drop_reason[SSD_DROP_NREASONS];

struct ssd_metrics {
    struct pf_metric *r_blocks, *r_bytes, *r_scanned, *r_total, *r_seconds, *r_state;
    struct pf_metric_child *r_drop[SSD_DROP_NREASONS];
    struct pf_metric *w_bytes, *w_blocks, *w_fail, *w_qfull, *w_pending, *w_inflight, *w_tput;
    struct pf_metric *p_staging, *p_staging_limited;
    struct pf_metric *p_bytes, *p_success, *p_fail, *p_qfull, *p_backpressure, *p_inflight, *p_tput;
    struct pf_metric_child *integrity;
};

/* A batch of sealed blocks offered for writing (weak references). */
struct ssd_wbatch {
    uint64_t seq;
    size_t n;
    struct pf_block *b[];
};

/* A prefetch batch: shared by the fetching thread and the reader (two references). */
struct ssd_rbatch {
    _Atomic int refs;
    size_t n; /* reserved keys */
    struct pf_block_key *keys;
    struct pf_block **out;   /* per key: the rebuilt block once its read was accepted
                              * (length and ring checked), else NULL */
    struct ssd_place *place; /* per key, for the first `planned` keys */
    size_t planned;          /* keys found COMMITTED when the reader dispatched the batch */
    uint64_t staged;         /* reader: staging bytes of the planned blocks */
    bool staging_short;      /* reader: planning stopped at the staging bound */
    size_t next_submit;      /* reader: next planned block to read */
    size_t remaining;        /* reader: planned reads not finished */
    bool done;               /* under rq_mu */
    bool abandoned;          /* the fetcher gave up waiting (under rq_mu) */
    uint8_t *accepted;       /* per key, under rq_mu: out[i] holds its accepted read (the
                              * fetcher may verify it while later reads are in flight) */
    size_t naccepted;        /* under rq_mu */
};

struct pf_ssd {
    struct pf_ssd_config cfg;
    struct pf_engine *engine; /* set by pf_ssd_attach before traffic */
    char **paths;             /* file per shard */
    uint32_t nshards;
    uint64_t shard_cap;
    struct pf_blk_file **files;
    uint64_t io_timeout_ms;

    pthread_mutex_t mu; /* index and rings */
    struct ssd_index idx;

    /* write side */
    pthread_mutex_t wq_mu;
    pthread_cond_t wq_cv;   /* the writer waits for batches */
    pthread_cond_t done_cv; /* flushes wait for seq_done */
    struct ssd_wbatch **wq;
    size_t wq_cap, wq_head, wq_count;
    uint64_t seq_enq, seq_done;
    bool w_stop;
    pthread_t writer;
    bool writer_started;
    struct pf_blk_queue *wqueue;

    /* read side */
    pthread_mutex_t rq_mu;
    pthread_cond_t rq_cv;    /* the reader waits for batches */
    pthread_cond_t rdone_cv; /* fetchers wait for their batch */
    struct ssd_rbatch **rq;
    size_t rq_cap, rq_head, rq_count;
    bool r_stop;
    pthread_t reader;
    bool reader_started;
    struct pf_blk_queue *rqueue;
    pthread_mutex_t budget_mu;
    struct ssd_budget budget;

    /* on-disk format and recovery (recover.c) */
    struct ssd_superblock *sb; /* per shard */
    bool *need_scan;           /* per shard: an own file of this format to scan */
    _Atomic uint64_t next_seq; /* next record sequence number */
    pthread_mutex_t scan_mu;
    pthread_cond_t scan_cv; /* the writer waits for the scan */
    bool scan_done;         /* under scan_mu; set when no scan is needed */
    pthread_t scanner;
    bool scanner_started;
    pf_ssd_recovered_fn recovered_fn; /* under scan_mu */
    void *recovered_ctx;
    struct ssd_fpset *fps; /* learned layout fingerprints (under mu) */
    size_t nfps, capfps;

    pthread_mutex_t quota_mu; /* quota: held across its calls */
    struct pf_ssd_quota quota;

    _Atomic bool stopped;
    _Atomic uint64_t next_io_id;
    pf_ssd_promoted_fn promoted_fn;
    void *promoted_ctx;
    struct ssd_metrics m;
};

void ssd_metrics_init(struct ssd_metrics *m);
/* Throughput (bytes/s) of a transfer of bytes that took ns. */
double ssd_rate(uint64_t bytes, uint64_t ns);

/* recover.c */
/* Reads (and when needed writes) every shard's superblock after the files are opened:
 * decides which shards are scanned. Errors come with a one-line message in err. */
int ssd_format_open(struct pf_ssd *s, char *err, size_t errlen);
/* Starts the background scan (or marks it done when nothing is to be scanned). */
int ssd_recover_start(struct pf_ssd *s, char *err, size_t errlen);
void ssd_recover_stop(struct pf_ssd *s);
/* Writer: waits until the scan is finished or the store stops. true when it finished. */
bool ssd_recover_wait(struct pf_ssd *s, uint64_t timeout_ms);
/* A sealed block of layout fp in (ns, keylen, nslots) was offered: learn it (under mu). */
void ssd_fp_learn(struct pf_ssd *s, const struct pf_block_key *k, uint16_t nslots, uint64_t fp);

/* store.c: holds every tenant's indexed records to its SSD quota (pf_ssd_quota), dropping
 * its oldest entries; after the recovery scan and when a quota hook is installed. */
void ssd_quota_enforce_all(struct pf_ssd *s);

/* writer.c */
void *ssd_writer_main(void *arg);
/* prefetch.c */
void *ssd_reader_main(void *arg);
void ssd_rbatch_put(struct ssd_rbatch *rb);
/* Staging allocation for a prefetch (the engine's evicting allocator, or the pool). */
int ssd_stage_alloc(struct pf_ssd *s, uint64_t size, int numa, struct pf_alloc **a_p);

#endif

/* SSD prefetch: the reader thread of the tier (the fetch call and the budget are in
 * fetch.c).
 *
 * The reader thread takes a batch from the queue only when every batch it holds has all
 * its reads submitted (so a busy reader lets the queue fill and further requests miss).
 * It looks the keys up again (the committed prefix may have shrunk), copies each entry's
 * geometry, makes one staging allocation per NUMA node for the whole batch (through the
 * engine's evicting allocator; any failure fails the batch), rebuilds each block over its
 * staging bytes and reads the blocks with vectored reads: consecutive keys whose records
 * follow each other in one shard's ring go in one request of up to read_merge records (8
 * MiB, one part), read from the first record's header to the last payload's end (payloads
 * into the staging blocks, headers and gaps into a scratch buffer), at most
 * prefetch_inflight requests in flight over all batches. Each block of a request is judged
 * on its own: accepted when the request transferred it whole, its ring range is still
 * intact afterwards and (integrity on) its header verifies and names it; a header that
 * does not drops the entry (an integrity failure). After a rejected block the batch's later
 * blocks are not read (only the run from the first key is returned). Accepted blocks are
 * published to the fetcher as each request completes, so it verifies their slot checksums
 * while later reads are in flight.
 *
 * A read outliving io_timeout_ms fails its blocks, whose staging memory stays referenced
 * until the device completes the read. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "ssd"
#include "pf/clock.h"
#include "pf/engine.h"
#include "pf/log.h"
#include "pf/pool.h"
#include "pf/util.h"
#include "ssd/ssd_internal.h"

#define R_STOP_GRACE_MS 5000

/* ---- batches ---- */

void ssd_rbatch_put(struct ssd_rbatch *rb)
{
    if (!rb || atomic_fetch_sub(&rb->refs, 1) != 1)
        return;
    for (size_t i = 0; i < rb->n; i++)
        pf_block_put(rb->out[i]);
    free(rb->out);
    free(rb->place);
    free(rb->keys);
    free(rb->accepted);
    free(rb);
}

int ssd_stage_alloc(struct pf_ssd *s, uint64_t size, int numa, struct pf_alloc **a_p)
{
    if (s->engine)
        return pf_engine_alloc(s->engine, size, numa, a_p);
    if (!s->cfg.pool)
        return -ENOMEM;
    return pf_pool_alloc(s->cfg.pool, size, numa, a_p);
}

/* NUMA node a staging allocation for `numa` is made on: its own region, else anywhere. */
static int stage_numa(struct pf_ssd *s, int numa)
{
    struct pf_pool *p = s->engine ? pf_engine_pool(s->engine) : s->cfg.pool;
    if (numa < 0 || !p || pf_pool_region_index(p, numa) < 0)
        return -1;
    return numa;
}

/* ---- the reader ---- */

/* One block of a read request: its staging block (a strong reference while the device owns
 * the staging bytes), where its payload lands in the request and where its header lands in
 * the request's scratch buffer. */
struct rpart {
    struct pf_block *b;
    uint64_t roff; /* payload offset within the request */
    uint64_t hoff; /* header offset within scratch */
};

/* One read request: k consecutive planned blocks of one batch whose records follow each
 * other in one shard's ring, read from the first record's header to the last payload's end
 * (the headers and the gaps between records into scratch). */
struct rio {
    struct ssd_io io;
    struct ssd_rbatch *rb; /* the reader's reference is shared by all its rios */
    size_t idx;            /* the run's first key */
    size_t k;
    struct rpart *parts; /* malloc'ed, k */
    uint8_t *scratch;    /* malloc'ed (aligned): headers and gaps */
};

/* A request carries at most R_RUN_BYTES unless a single record is larger, and (for more than
 * one record) one part of at most SSD_IOV_MAX iovecs. 1 MiB, not more: requests in flight
 * together complete together, and a batch's checksums are verified as its requests
 * complete, so a batch must be many requests for the hashing to overlap the later reads.
 * With 8 MiB requests a 64 MiB batch was 8 requests that all completed within ~1 ms of each
 * other at ~30 ms, and its verification (8-12 ms) ran after the last read; with 1 MiB, 48 of
 * its 64 blocks were verified while reads were in flight and the batch ended ~2 ms after its
 * last read (bench/README.md "ssd_server"). Merging still pays for small records (8 of 64
 * KiB in one request). */
#define R_RUN_BYTES (1ull << 20)

struct reader {
    struct pf_ssd *s;
    struct ssd_rbatch **active; /* dispatched batches, FIFO */
    size_t nactive, capactive;
    struct rio *ios; /* reads in flight */
    size_t nios, cap;
    struct rio *lost; /* timed out, still owned by the device */
    size_t nlost, caplost;
    uint64_t staged;             /* staging bytes of the active batches */
    struct ssd_rbatch *deferred; /* taken, waiting for staging to free up */
};

#define STAGE_GROUPS 16

struct stage_group {
    int numa;
    uint64_t size, cursor;
    struct pf_alloc *a;
};

/* The group of numa, added when new; beyond STAGE_GROUPS - 1 nodes the rest share the
 * "any node" group. */
static size_t group_of(struct stage_group *g, size_t *n, int numa)
{
    for (size_t i = 0; i < *n; i++)
        if (g[i].numa == numa)
            return i;
    if (*n >= STAGE_GROUPS - 1 && numa != -1)
        return group_of(g, n, -1);
    g[*n] = (struct stage_group){.numa = numa};
    return (*n)++;
}

/* Looks the batch's keys up, stages and rebuilds the committed prefix, at most avail bytes
 * of staging (rb->staging_short when the bound cut it). Sets rb->planned and rb->staged. */
static void plan(struct reader *r, struct ssd_rbatch *rb, uint64_t avail)
{
    struct pf_ssd *s = r->s;
    struct ssd_entry **meta = calloc(rb->n, sizeof(*meta));
    if (!meta)
        return;
    size_t planned = 0;
    rb->staged = 0;
    rb->staging_short = false;
    pthread_mutex_lock(&s->mu);
    for (; planned < rb->n; planned++) {
        struct ssd_entry *e = ssd_index_find(&s->idx, &rb->keys[planned]);
        if (!e || e->state != SSD_COMMITTED ||
            !ssd_ring_valid(&s->idx.shards[e->shard].ring, e->start))
            break;
        if (rb->staged + e->len > avail) {
            rb->staging_short = true; /* the rest waits for a later fetch (bounded staging) */
            break;
        }
        rb->staged += e->len;
        size_t sz = sizeof(*e) + (size_t)e->nslots * sizeof(e->slots[0]);
        meta[planned] = malloc(sz);
        if (!meta[planned])
            break;
        memcpy(meta[planned], e, sz);
        const struct ssd_ring *ring = &s->idx.shards[e->shard].ring;
        rb->place[planned] = (struct ssd_place){
            .shard = e->shard,
            /* a record never wraps: its header ends where its payload starts */
            .hdr_len = (uint32_t)(e->off - s->idx.ring_off - e->start % ring->cap),
            .start = e->start,
            .off = e->off,
            .len = e->len,
            .span = e->span,
            .seq = e->seq,
            .fp = e->fp,
        };
    }
    pthread_mutex_unlock(&s->mu);

    /* one staging allocation per NUMA node */
    struct stage_group groups[STAGE_GROUPS];
    size_t ngroups = 0;
    size_t maxslots = 0;
    for (size_t i = 0; i < planned; i++) {
        maxslots = PF_MAX_OF(maxslots, meta[i]->nslots);
        for (uint16_t j = 0; j < meta[i]->nslots; j++) {
            size_t g = group_of(groups, &ngroups, stage_numa(s, meta[i]->slots[j].numa));
            groups[g].size += ssd_slot_disk_len(&meta[i]->slots[j]);
        }
    }
    bool ok = planned > 0;
    for (size_t g = 0; g < ngroups && ok; g++) {
        int rc = ssd_stage_alloc(s, groups[g].size, groups[g].numa, &groups[g].a);
        if (rc) {
            pf_log_ratelimited(PF_LOG_WARN, 5000,
                               "cannot stage %llu bytes for an SSD prefetch: %s (batch of %zu "
                               "block(s) missed)",
                               (unsigned long long)groups[g].size, strerror(-rc), planned);
            ok = false;
        }
    }
    uint8_t **base = ok ? malloc(maxslots * sizeof(*base)) : NULL;
    struct pf_alloc **allocs = ok ? malloc(maxslots * sizeof(*allocs)) : NULL;
    size_t built = 0;
    if (base && allocs) {
        for (; built < planned; built++) {
            struct ssd_entry *e = meta[built];
            for (uint16_t j = 0; j < e->nslots; j++) {
                size_t g = group_of(groups, &ngroups, stage_numa(s, e->slots[j].numa));
                base[j] = (uint8_t *)groups[g].a->ptr + groups[g].cursor;
                allocs[j] = groups[g].a;
                groups[g].cursor += ssd_slot_disk_len(&e->slots[j]);
            }
            rb->out[built] = ssd_block_rebuild(&e->key, e->slots, e->nslots, base, allocs);
            if (!rb->out[built])
                break;
        }
    }
    free(base);
    free(allocs);
    for (size_t g = 0; g < ngroups; g++)
        pf_alloc_put(groups[g].a); /* the blocks hold their own references */
    for (size_t i = 0; i < planned; i++)
        free(meta[i]);
    free(meta);
    rb->planned = built;
    rb->remaining = built;
}

/* Marks the batch finished and hands it to its fetcher (or cleans up an abandoned one). */
static void finish_batch(struct pf_ssd *s, struct ssd_rbatch *rb)
{
    pthread_mutex_lock(&s->rq_mu);
    rb->done = true;
    bool abandoned = rb->abandoned;
    pthread_cond_broadcast(&s->rdone_cv);
    pthread_mutex_unlock(&s->rq_mu);
    if (abandoned)
        for (size_t i = 0; i < rb->n; i++) {
            pf_block_put(rb->out[i]);
            rb->out[i] = NULL;
        }
    ssd_rbatch_put(rb);
}

static void lost_add(struct reader *r, struct rio *io)
{
    if (r->nlost == r->caplost) {
        size_t nc = r->caplost ? r->caplost * 2 : 8;
        struct rio *nl = realloc(r->lost, nc * sizeof(*nl));
        if (!nl) {
            pf_error("out of memory tracking a timed-out SSD read; its staging memory is "
                     "leaked");
            return;
        }
        r->lost = nl;
        r->caplost = nc;
    }
    r->lost[r->nlost++] = *io;
}

static void rio_release(struct rio *io)
{
    for (size_t j = 0; io->parts && j < io->k; j++)
        pf_block_put(io->parts[j].b);
    free(io->parts);
    free(io->scratch);
    free(io->io.iov);
    io->parts = NULL;
    io->scratch = NULL;
    io->io.iov = NULL;
}

/* Whether the header read in front of block j of io names the record the index placed
 * there: it decodes (magic, fields, header checksum), and its length, payload length,
 * sequence number, layout fingerprint, file identity, key and namespace are the entry's. */
static bool header_ok(struct pf_ssd *s, const struct rio *io, size_t j)
{
    const struct ssd_place *p = &io->rb->place[io->idx + j];
    if (p->hdr_len == 0)
        return true; /* a record without a header (index tests only) */
    struct ssd_rec_hdr h;
    if (ssd_rec_decode(io->scratch + io->parts[j].hoff, p->hdr_len, &h) != SSD_PARSE_OK)
        return false;
    struct pf_block_key key = pf_block_key(io->parts[j].b);
    return h.hdr_len == p->hdr_len && h.payload_len == p->len && h.seq == p->seq &&
           h.layout_fp == p->fp && memcmp(h.uuid, s->sb[p->shard].uuid, sizeof(h.uuid)) == 0 &&
           h.key.len == key.len && memcmp(h.key.hash, key.hash, key.len) == 0 &&
           strcmp(h.ns, pf_ns_name(key.ns)) == 0;
}

static void log_bad_header(struct pf_ssd *s, const struct pf_block *b, const struct ssd_place *p)
{
    char hex[2 * PF_HASH_MAX + 1];
    struct pf_block_key key = pf_block_key(b);
    pf_hex_encode(key.hash, key.len < 8 ? key.len : 8, hex);
    pf_log_ratelimited(PF_LOG_WARN, 1000,
                       "integrity: block %s... (namespace %s) read from %s at offset %llu: its "
                       "record header does not verify or names another record: treated as a "
                       "miss, SSD entry dropped",
                       hex, pf_ns_name(key.ns), s->paths[p->shard],
                       (unsigned long long)(p->off - p->hdr_len));
}

/* A read request finished (or timed out): accept or reject each of its blocks, retire the
 * rio. Block j is accepted when the request transferred it whole (every part completed
 * without error, or, in a one-part request, its last byte lies within the bytes the device
 * returned), its ring range is still intact and (integrity on) its header verifies; a
 * header that does not verify drops that block's entry and counts an integrity failure.
 * After the first rejected block the batch's unsubmitted blocks are not read. */
static void retire(struct reader *r, size_t k, bool timed_out)
{
    struct pf_ssd *s = r->s;
    struct rio *io = &r->ios[k];
    struct ssd_rbatch *rb = io->rb;
    bool one_part = io->io.nparts == 1;
    size_t nok = 0, nio_bad = 0;
    bool any_bad = false;
    /* per block: 0 rejected, 1 accepted, 2 header does not verify */
    uint8_t *st = io->parts ? calloc(io->k, 1) : NULL;
    if (st && !timed_out) {
        for (size_t j = 0; j < io->k; j++) {
            const struct ssd_place *p = &rb->place[io->idx + j];
            bool whole = one_part ? io->io.err == 0 && io->parts[j].roff + p->len <= io->io.bytes
                                  : ssd_io_ok(&io->io);
            st[j] = whole;
            nio_bad += !whole;
        }
        pthread_mutex_lock(&s->mu);
        for (size_t j = 0; j < io->k; j++)
            if (st[j] && !ssd_index_intact(&s->idx, &rb->place[io->idx + j])) {
                st[j] = 0;
                pf_debug("SSD read of a block overwritten by the ring meanwhile: rejected");
            }
        pthread_mutex_unlock(&s->mu);
        for (size_t j = 0; j < io->k; j++)
            if (st[j] && s->cfg.integrity && !header_ok(s, io, j))
                st[j] = 2;
    } else {
        nio_bad = io->k;
    }
    for (size_t j = 0; j < io->k; j++) {
        const struct ssd_place *p = &rb->place[io->idx + j];
        if (!io->parts) {
            /* the request could not be built: its blocks are still the batch's */
            pf_block_put(rb->out[io->idx + j]);
            rb->out[io->idx + j] = NULL;
            any_bad = true;
            continue;
        }
        if (st && st[j] == 1) {
            rb->out[io->idx + j] = io->parts[j].b;
            io->parts[j].b = NULL;
            nok++;
            continue;
        }
        any_bad = true;
        if (st && st[j] == 2) {
            pf_child_add(s->m.integrity, 1);
            log_bad_header(s, io->parts[j].b, p);
            struct pf_block_key key = pf_block_key(io->parts[j].b);
            pthread_mutex_lock(&s->mu);
            ssd_index_remove(&s->idx, &key, p);
            pthread_mutex_unlock(&s->mu);
        }
    }
    if (nio_bad > 0) {
        const char *why = timed_out    ? "no completion within the I/O timeout"
                          : io->io.err ? strerror(-io->io.err)
                          : !st        ? "out of memory"
                                       : "short read";
        pf_log_ratelimited(PF_LOG_WARN, 5000,
                           "SSD read of %llu bytes (%zu block(s)) from %s at offset %llu failed: "
                           "%s (%zu block(s) missed)",
                           (unsigned long long)io->io.len, io->k,
                           s->paths[rb->place[io->idx].shard], (unsigned long long)io->io.off, why,
                           nio_bad);
    }
    if (nok > 0) {
        /* the fetcher verifies these while the batch's later reads are in flight */
        pthread_mutex_lock(&s->rq_mu);
        for (size_t j = 0; j < io->k; j++)
            if (st[j] == 1)
                rb->accepted[io->idx + j] = 1;
        rb->naccepted += nok;
        pthread_cond_broadcast(&s->rdone_cv);
        pthread_mutex_unlock(&s->rq_mu);
        pf_metric_observe(s->m.p_tput, ssd_rate(io->io.len, pf_now_ns() - io->io.t0_ns));
    }
    free(st);
    if (ssd_io_outstanding(&io->io) > 0)
        lost_add(r, io); /* keeps the blocks (staging memory) and the scratch */
    else
        rio_release(io);
    pf_metric_add(s->m.p_inflight, -1);
    size_t retired = io->k;
    r->ios[k] = r->ios[--r->nios];
    if (any_bad && rb->next_submit < rb->planned) {
        /* only the run from the first key is useful: do not read past a failure */
        for (size_t i = rb->next_submit; i < rb->planned; i++) {
            pf_block_put(rb->out[i]);
            rb->out[i] = NULL;
        }
        rb->remaining -= rb->planned - rb->next_submit;
        rb->planned = rb->next_submit;
    }
    rb->remaining -= retired;
    if (rb->remaining == 0) {
        r->staged -= rb->staged;
        pf_metric_set(s->m.p_staging, (double)r->staged);
        for (size_t i = 0; i < r->nactive; i++)
            if (r->active[i] == rb) {
                memmove(&r->active[i], &r->active[i + 1],
                        (r->nactive - i - 1) * sizeof(*r->active));
                r->nactive--;
                break;
            }
        finish_batch(s, rb);
    }
}

static void lost_release(struct rio *io)
{
    rio_release(io);
}

static void dispatch(struct reader *r, const struct pf_blk_cqe *c)
{
    uint64_t id = c->tag >> SSD_TAG_SHIFT;
    for (size_t i = 0; i < r->nios; i++) {
        if (r->ios[i].io.id != id)
            continue;
        ssd_io_complete(&r->ios[i].io, c->res);
        if (ssd_io_done(&r->ios[i].io))
            retire(r, i, false);
        return;
    }
    for (size_t i = 0; i < r->nlost; i++) {
        if (r->lost[i].io.id != id)
            continue;
        ssd_io_complete(&r->lost[i].io, c->res);
        if (ssd_io_outstanding(&r->lost[i].io) == 0) {
            lost_release(&r->lost[i]);
            r->lost[i] = r->lost[--r->nlost];
        }
        return;
    }
}

/* File offset where the record of place p starts (its header). */
static uint64_t rec_off(const struct ssd_place *p)
{
    return p->off - p->hdr_len;
}

/* How many planned blocks from i one request reads: the records follow each other in the
 * same shard file (the next record starts where the previous one's span ends), at most
 * read_merge of them, R_RUN_BYTES and (beyond one record) SSD_IOV_MAX iovecs. */
static size_t run_length(const struct pf_ssd *s, const struct ssd_rbatch *rb, size_t i)
{
    const struct ssd_place *p0 = &rb->place[i];
    uint64_t bytes = p0->hdr_len + p0->len;
    size_t niov = 1 + (size_t)rb->out[i]->nslots * 2;
    size_t k = 1;
    while (i + k < rb->planned && k < s->cfg.read_merge) {
        const struct ssd_place *pv = &rb->place[i + k - 1], *nx = &rb->place[i + k];
        uint64_t pv_end = pv->off + pv->len;
        size_t add = 1 + (size_t)rb->out[i + k]->nslots * 2;
        if (nx->shard != pv->shard || rec_off(nx) != rec_off(pv) + pv->span ||
            rec_off(nx) < pv_end || niov + add > SSD_IOV_MAX ||
            bytes + (nx->off + nx->len - pv_end) > R_RUN_BYTES)
            break;
        niov += add;
        bytes += nx->off + nx->len - pv_end;
        k++;
    }
    return k;
}

/* Builds the request of blocks [i, i + k) of rb into io (iovecs, scratch for the headers and
 * gaps, parts). -ENOMEM, or -EINVAL when a block's geometry does not match its entry. */
static int rio_build(struct rio *io, struct ssd_rbatch *rb, size_t i, size_t k)
{
    const struct ssd_place *p0 = &rb->place[i], *pl = &rb->place[i + k - 1];
    io->parts = calloc(k, sizeof(*io->parts));
    if (!io->parts)
        return -ENOMEM;
    size_t niov = 0;
    uint64_t sbytes = 0;
    for (size_t j = 0; j < k; j++) {
        io->parts[j].b = rb->out[i + j]; /* the rio owns it until the read is accepted */
        rb->out[i + j] = NULL;
        niov += 1 + (size_t)io->parts[j].b->nslots * 2;
        const struct ssd_place *p = &rb->place[i + j];
        sbytes += j == 0 ? p->hdr_len
                         : rec_off(p) - (rb->place[i + j - 1].off + rb->place[i + j - 1].len) +
                               p->hdr_len;
    }
    io->io.off = io->io.next_off = rec_off(p0);
    io->io.len = pl->off + pl->len - rec_off(p0);
    io->io.iov = malloc(niov * sizeof(struct iovec));
    if (!io->io.iov)
        return -ENOMEM;
    if (sbytes && posix_memalign((void **)&io->scratch, SSD_REC_ALIGN, sbytes) != 0) {
        io->scratch = NULL;
        return -ENOMEM;
    }
    int n = 0;
    uint64_t soff = 0, roff = 0;
    for (size_t j = 0; j < k; j++) {
        const struct ssd_place *p = &rb->place[i + j];
        uint64_t gap = j == 0 ? p->hdr_len
                              : rec_off(p) - (rb->place[i + j - 1].off + rb->place[i + j - 1].len) +
                                    p->hdr_len;
        if (gap) {
            io->io.iov[n++] = (struct iovec){io->scratch + soff, gap};
            soff += gap;
            roff += gap;
        }
        io->parts[j].hoff = soff - p->hdr_len;
        io->parts[j].roff = roff;
        if (ssd_block_disk_len(io->parts[j].b) != p->len)
            return -EINVAL;
        n += ssd_block_iov(io->parts[j].b, io->io.iov + n);
        roff += p->len;
    }
    io->io.niov = n;
    io->io.nparts = ssd_io_parts(n);
    if (io->io.nparts > SSD_PARTS_MAX || (k > 1 && io->io.nparts != 1))
        return -EINVAL;
    return 0;
}

/* Starts the next planned read request (a run of records) of the oldest batch that has
 * one. */
static bool submit_next(struct reader *r)
{
    struct pf_ssd *s = r->s;
    for (size_t a = 0; a < r->nactive; a++) {
        struct ssd_rbatch *rb = r->active[a];
        if (rb->next_submit == rb->planned)
            continue;
        size_t i = rb->next_submit;
        size_t k = run_length(s, rb, i);
        rb->next_submit += k;
        struct rio *io = &r->ios[r->nios++];
        memset(io, 0, sizeof(*io));
        io->rb = rb;
        io->idx = i;
        io->k = k;
        io->io.id = atomic_fetch_add(&s->next_io_id, 1);
        io->io.op = PF_BLK_READ;
        io->io.file = s->files[rb->place[i].shard];
        io->io.t0_ns = pf_now_ns();
        int rc = rio_build(io, rb, i, k);
        if (rc) {
            io->io.err = rc;
            io->io.nparts = 0; /* nothing submitted: done */
        }
        pf_metric_add(s->m.p_inflight, 1);
        if (!io->io.err)
            ssd_io_submit(s->rqueue, &io->io);
        if (ssd_io_done(&io->io))
            retire(r, r->nios - 1, false);
        return true;
    }
    return false;
}

static bool has_unsubmitted(const struct reader *r)
{
    for (size_t a = 0; a < r->nactive; a++)
        if (r->active[a]->next_submit < r->active[a]->planned)
            return true;
    return false;
}

static int activate(struct reader *r, struct ssd_rbatch *rb)
{
    if (r->nactive == r->capactive) {
        size_t nc = r->capactive ? r->capactive * 2 : 4;
        struct ssd_rbatch **na = realloc(r->active, nc * sizeof(*na));
        if (!na)
            return -ENOMEM;
        r->active = na;
        r->capactive = nc;
    }
    r->active[r->nactive++] = rb;
    return 0;
}

static void poll_device(struct reader *r, uint64_t timeout_ms)
{
    struct pf_blk_cqe cq[SSD_POLL_BATCH];
    int n = pf_blk_poll(r->s->rqueue, cq, SSD_POLL_BATCH, timeout_ms);
    for (int i = 0; i < n; i++)
        dispatch(r, &cq[i]);
}

static void expire(struct reader *r, bool all)
{
    uint64_t now = pf_now_ns();
    for (size_t i = 0; i < r->nios;) {
        struct rio *io = &r->ios[i];
        if (all || now - io->io.t0_ns >= r->s->io_timeout_ms * PF_NS_PER_MS)
            retire(r, i, true); /* moves the last rio into slot i */
        else
            i++;
    }
}

/* Takes one queued batch (waiting up to wait_ms). False when the reader must stop. */
static bool take_batch(struct reader *r, uint64_t wait_ms)
{
    struct pf_ssd *s = r->s;
    const uint64_t bound = s->cfg.prefetch_staging_bytes;
    struct ssd_rbatch *rb = r->deferred;
    r->deferred = NULL;
    bool stop = false;
    if (!rb && r->staged >= bound)
        return true; /* at the bound: batches wait in the queue */
    if (!rb) {
        pthread_mutex_lock(&s->rq_mu);
        if (s->rq_count == 0 && !s->r_stop && wait_ms) {
            struct timespec dl = pf_deadline_ms(wait_ms);
            pthread_cond_timedwait(&s->rq_cv, &s->rq_mu, &dl);
        }
        stop = s->r_stop;
        if (!stop && s->rq_count > 0) {
            rb = s->rq[s->rq_head];
            s->rq_head = (s->rq_head + 1) % s->rq_cap;
            s->rq_count--;
        }
        pthread_mutex_unlock(&s->rq_mu);
    }
    if (!rb)
        return !stop;
    plan(r, rb, bound - r->staged);
    if (rb->planned == 0 && rb->staging_short && r->nactive > 0) {
        r->deferred = rb; /* retried when an active batch returns its staging */
        return true;
    }
    if (rb->staging_short)
        pf_metric_add(s->m.p_staging_limited, (double)(rb->n - rb->planned));
    if (rb->planned > 0 && activate(r, rb) == 0) {
        r->staged += rb->staged;
        pf_metric_set(s->m.p_staging, (double)r->staged);
    } else {
        for (size_t i = 0; i < rb->planned; i++) {
            pf_block_put(rb->out[i]);
            rb->out[i] = NULL;
        }
        rb->planned = 0;
        finish_batch(s, rb);
    }
    return true;
}

static void shutdown_reader(struct reader *r)
{
    struct pf_ssd *s = r->s;
    if (r->deferred) {
        finish_batch(s, r->deferred); /* nothing of it was planned */
        r->deferred = NULL;
    }
    /* queued batches resolve empty */
    for (;;) {
        pthread_mutex_lock(&s->rq_mu);
        struct ssd_rbatch *rb = NULL;
        if (s->rq_count > 0) {
            rb = s->rq[s->rq_head];
            s->rq_head = (s->rq_head + 1) % s->rq_cap;
            s->rq_count--;
        }
        pthread_mutex_unlock(&s->rq_mu);
        if (!rb)
            break;
        finish_batch(s, rb);
    }
    /* unsubmitted reads are dropped; in-flight ones get a grace period */
    for (size_t a = 0; a < r->nactive; a++) {
        struct ssd_rbatch *rb = r->active[a];
        for (size_t i = rb->next_submit; i < rb->planned; i++) {
            pf_block_put(rb->out[i]);
            rb->out[i] = NULL;
            rb->remaining--;
        }
        rb->planned = rb->next_submit;
    }
    uint64_t grace = PF_MIN_OF(s->io_timeout_ms, R_STOP_GRACE_MS);
    uint64_t deadline = pf_now_ns() + grace * PF_NS_PER_MS;
    while (r->nios > 0 && pf_now_ns() < deadline)
        poll_device(r, 20);
    expire(r, true);
    /* batches whose reads all finished before (remaining already 0) */
    while (r->nactive > 0) {
        struct ssd_rbatch *rb = r->active[--r->nactive];
        finish_batch(s, rb);
    }
    pf_blk_queue_destroy(s->rqueue);
    s->rqueue = NULL;
    for (size_t i = 0; i < r->nlost; i++)
        lost_release(&r->lost[i]);
    r->nlost = 0;
}

void *ssd_reader_main(void *arg)
{
    struct reader r = {.s = arg};
    struct pf_ssd *s = r.s;
    r.cap = s->cfg.prefetch_inflight;
    r.ios = calloc(r.cap, sizeof(*r.ios));
    if (!r.ios) {
        pf_error("SSD reader: out of memory; SSD prefetch disabled");
        pthread_mutex_lock(&s->rq_mu);
        while (!s->r_stop)
            pthread_cond_wait(&s->rq_cv, &s->rq_mu);
        pthread_mutex_unlock(&s->rq_mu);
        shutdown_reader(&r);
        return NULL;
    }
    for (;;) {
        if (atomic_load(&s->stopped))
            break;
        if (!has_unsubmitted(&r)) {
            bool idle = r.nios == 0 && r.nlost == 0;
            if (!take_batch(&r, idle ? 200 : 0))
                break;
        }
        while (r.nios < r.cap && submit_next(&r))
            ;
        for (size_t i = 0; i < r.nios; i++)
            if (!r.ios[i].io.err && r.ios[i].io.submitted < r.ios[i].io.nparts)
                ssd_io_submit(s->rqueue, &r.ios[i].io);
        if (r.nios > 0 || r.nlost > 0) {
            poll_device(&r, has_unsubmitted(&r) ? 100 : 10);
            expire(&r, false);
        }
    }
    shutdown_reader(&r);
    free(r.ios);
    free(r.lost);
    free(r.active);
    return NULL;
}

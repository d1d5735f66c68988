/* The SSD writer thread.
 *
 * It takes one offered batch (weak references) only when the previous one is fully
 * handed out, and upgrades each weak reference right before placing that block, so a
 * block evicted and freed while it waited is skipped and never pinned by the queue.
 * Placement: duplicates (key already WRITING or COMMITTED), blocks larger than a shard and
 * blocks not laid out for O_DIRECT are skipped; otherwise the next shard (round-robin)
 * reserves ring space and a WRITING entry. Placed writes wait in a FIFO of write_inflight
 * x write_merge slots; at most write_inflight write requests are in flight, each carrying
 * up to write_merge (8) records that follow each other in the ring as one vectored write (the
 * gaps between records from a zero page), so a depth of 2 keeps several blocks queued at
 * the device. Each record keeps its own header and checksums; a request's completion is
 * shared out by byte offset (a short write fails the records past its end). Results are
 * committed in submission order (COMMITTED on a full-length
 * write, entry removed otherwise). A placement whose new ring tail would overtake a write
 * still owned by the device waits until that write completes, so two writes never race
 * for the same bytes. A write outliving io_timeout_ms fails (entry removed) but its block
 * stays referenced until the device completes it. Flushes wait on seq_done: the sequence
 * number of the last batch whose every block is committed or dropped. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "ssd"
#include "pf/clock.h"
#include "pf/log.h"
#include "ssd/ssd_internal.h"

#define W_STOP_GRACE_MS 5000

struct wslot {
    struct ssd_io io;   /* in a run: io.id is the run's (its first record's) id */
    struct pf_block *b; /* strong reference for the duration of the write */
    uint8_t *hdr;       /* the record header (O_DIRECT-aligned), written before the payload */
    struct ssd_place place;
    uint64_t seq;
    bool in_run;      /* written by a request of several records */
    uint64_t run_off; /* in a run: this record's byte offset within the request */
};

/* A write request carries up to cfg.write_merge records that follow each other in the ring
 * (W_RUN_BYTES at most unless a single record is larger, one part: at most SSD_IOV_MAX
 * iovecs), the gaps between them (a record's span past its bytes, < 4 KiB) written from
 * zero_pad. */
#define W_RUN_BYTES (8ull << 20)
static uint8_t zero_pad[SSD_REC_ALIGN] __attribute__((aligned(SSD_REC_ALIGN)));

struct writer {
    struct pf_ssd *s;
    struct ssd_wbatch *cur; /* batch being handed out */
    size_t ipend;
    struct wslot *fifo; /* in-flight writes, submission order */
    size_t cap, head, count;
    struct wslot *lost; /* timed out, still owned by the device */
    size_t nlost, caplost;
    uint64_t last_taken;
};

enum { W_STARTED, W_SKIPPED, W_BLOCKED };

static struct wslot *fifo_at(struct writer *w, size_t i)
{
    return &w->fifo[(w->head + i) % w->cap];
}

static void slot_release(struct wslot *sl)
{
    pf_block_put(sl->b);
    free(sl->io.iov);
    free(sl->hdr);
    sl->b = NULL;
    sl->io.iov = NULL;
    sl->hdr = NULL;
}

enum { OV_NONE, OV_INFLIGHT, OV_LOST };

/* Would placing up to new_tail on shard sh overtake a write the device still owns: one in
 * flight (it completes or times out soon), or one that timed out and never completed
 * (OV_LOST: its space is unusable until it does, which may be never)? */
static int overtakes(struct writer *w, uint32_t sh, uint64_t new_tail)
{
    for (size_t i = 0; i < w->count; i++) {
        struct wslot *sl = fifo_at(w, i);
        if (sl->place.shard == sh && sl->place.start < new_tail)
            return OV_INFLIGHT;
    }
    for (size_t i = 0; i < w->nlost; i++)
        if (w->lost[i].place.shard == sh && w->lost[i].place.start < new_tail)
            return OV_LOST;
    return OV_NONE;
}

/* The record header of b (payload len bytes): slot geometry and checksums (computed here
 * for slots sealed without one, so every record can be verified by the recovery scan) and
 * an aligned buffer for the encoded header. The caller encodes it once seq and the shard
 * identity are known. */
static int build_header(const struct pf_block *b, const struct pf_block_key *key, uint64_t len,
                        struct ssd_rec_hdr *h, struct ssd_rec_slot **rs_p, uint8_t **hdr_p)
{
    memset(h, 0, sizeof(*h));
    const char *ns = pf_ns_name(key->ns);
    size_t ns_len = strlen(ns);
    if (ns_len > SSD_NS_MAX || b->nslots > SSD_REC_SLOTS_MAX) {
        pf_log_ratelimited(PF_LOG_WARN, 10000,
                           "block with a %zu-byte namespace or %u slots does not fit an SSD "
                           "record header: not written to SSD",
                           ns_len, b->nslots);
        return -EINVAL;
    }
    struct ssd_rec_slot *rs = calloc(b->nslots, sizeof(*rs));
    if (!rs)
        return -ENOMEM;
    for (uint16_t i = 0; i < b->nslots; i++) {
        struct pf_slot sv;
        pf_block_slot(b, i, &sv);
        rs[i] = (struct ssd_rec_slot){
            .checksum = sv.has_checksum ? sv.checksum : pf_slot_compute_checksum(&sv),
            .seg_len = sv.seg_len,
            .seg_stride = sv.seg_stride,
            .numa = sv.numa,
            .nseg = sv.nseg,
        };
    }
    memcpy(h->ns, ns, ns_len + 1);
    h->key = *key;
    h->nslots = b->nslots;
    h->payload_len = len;
    h->hdr_len = ssd_rec_hdr_len(ns_len, b->nslots);
    h->layout_fp = ssd_layout_fp(rs, b->nslots);
    if (posix_memalign((void **)hdr_p, SSD_REC_ALIGN, h->hdr_len) != 0) {
        free(rs);
        return -ENOMEM;
    }
    *rs_p = rs;
    return 0;
}

/* The SSD quota of one record's tenant (pf_ssd_quota). */
struct quota {
    uint64_t quota; /* 0: none */
    uint32_t *ids;
    size_t nids;
    char tenant[128];
    uint64_t shed_blocks, shed_bytes;
    bool counted;
};

static void quota_lookup(struct pf_ssd *s, uint32_t ns, struct quota *q)
{
    pthread_mutex_lock(&s->quota_mu);
    if (s->quota.lookup)
        q->quota =
            s->quota.lookup(s->quota.ctx, ns, &q->ids, &q->nids, q->tenant, sizeof(q->tenant));
    pthread_mutex_unlock(&s->quota_mu);
    if (q->quota && !q->ids) {
        q->quota = 0; /* out of memory: the namespace of this record alone */
        q->nids = 0;
    }
}

/* Counts (once) what the quota did for one record: shed entries, and refused bytes (0:
 * the record is written). */
static void quota_count(struct pf_ssd *s, struct quota *q, uint64_t blocks, uint64_t bytes,
                        uint64_t refused)
{
    if (!q->quota || q->counted)
        return;
    q->counted = true;
    pthread_mutex_lock(&s->quota_mu);
    if (blocks && s->quota.shed)
        s->quota.shed(s->quota.ctx, q->tenant, blocks, bytes);
    if (refused && s->quota.refused)
        s->quota.refused(s->quota.ctx, q->tenant, refused);
    pthread_mutex_unlock(&s->quota_mu);
}

static int start_write(struct writer *w, struct pf_block *b)
{
    struct pf_ssd *s = w->s;
    struct ssd_rec_slot *rs = NULL;
    uint8_t *hdr = NULL;
    struct quota q = {0};
    if (!pf_block_upgrade(b)) {
        pf_block_weak_put(b); /* freed while queued */
        return W_SKIPPED;
    }
    uint64_t len = ssd_block_disk_len(b);
    if (len == 0) {
        pf_log_ratelimited(PF_LOG_WARN, 10000,
                           "block not laid out for O_DIRECT (512-byte strides and addresses): not "
                           "written to SSD");
        goto skip;
    }
    struct pf_block_key key = pf_block_key(b);
    struct ssd_rec_hdr h;
    if (build_header(b, &key, len, &h, &rs, &hdr) != 0)
        goto skip;
    uint64_t total = ssd_rec_span(h.hdr_len, len); /* ring bytes, 4 KiB-aligned */
    quota_lookup(s, key.ns, &q);
    if (q.quota && total > q.quota) {
        quota_count(s, &q, 0, 0, total);
        pf_log_ratelimited(PF_LOG_WARN, 10000,
                           "tenant %s: a block of %llu SSD bytes is larger than its SSD quota "
                           "(%llu bytes): not written to SSD",
                           q.tenant, (unsigned long long)total, (unsigned long long)q.quota);
        goto skip;
    }
    pthread_mutex_lock(&s->mu);
    ssd_fp_learn(s, &key, b->nslots, h.layout_fp);
    struct ssd_entry *old = ssd_index_find(&s->idx, &key);
    if (old && old->recovered && old->state == SSD_COMMITTED && old->fp != h.layout_fp) {
        /* a recovered record of another geometry is replaced by this block */
        ssd_index_drop(&s->idx, old);
        pf_child_add(s->m.r_drop[SSD_DROP_GEOMETRY], 1);
        old = NULL;
    }
    if (old) {
        pthread_mutex_unlock(&s->mu);
        goto skip; /* duplicates are not rewritten */
    }
    if (q.quota) {
        /* the tenant's own oldest blocks leave the SSD index until this record fits */
        q.shed_blocks = ssd_index_shed(&s->idx, q.ids, q.nids, q.quota - total, &q.shed_bytes);
        uint64_t used = 0;
        for (size_t i = 0; i < q.nids; i++)
            used += ssd_index_ns_bytes(&s->idx, q.ids[i]);
        if (used + total > q.quota && w->count > 0) {
            /* what is left are writes placed and not committed yet (up to write_inflight x
             * write_merge of them): wait for them, once committed they can be shed */
            pthread_mutex_unlock(&s->mu);
            quota_count(s, &q, q.shed_blocks, q.shed_bytes, 0);
            free(q.ids);
            free(rs);
            free(hdr);
            pf_block_put(b); /* keep the weak reference: retried after completions */
            return W_BLOCKED;
        }
        if (used + total > q.quota) {
            pthread_mutex_unlock(&s->mu); /* cannot happen with nothing in flight: refused */
            quota_count(s, &q, q.shed_blocks, q.shed_bytes, total);
            goto skip;
        }
    }
    uint32_t sh;
    uint64_t start, tail;
    int rc, ov = OV_NONE;
    /* a shard stuck behind a lost write is passed over (the next shard takes the block);
     * only when every shard is stuck is the block left out */
    for (uint32_t tries = 0; tries < s->idx.nshards; tries++) {
        rc = ssd_index_peek(&s->idx, total, &sh, &start, &tail);
        if (rc) {
            pthread_mutex_unlock(&s->mu);
            pf_log_ratelimited(PF_LOG_WARN, 10000,
                               "block of %llu bytes is larger than an SSD shard (%llu bytes): "
                               "not written to SSD",
                               (unsigned long long)len, (unsigned long long)s->shard_cap);
            goto skip;
        }
        ov = overtakes(w, sh, tail);
        if (ov != OV_LOST)
            break;
        pf_log_ratelimited(PF_LOG_WARN, 10000,
                           "SSD shard %u: a timed-out write never completed; its space is not "
                           "reused until it does, other shards take the writes",
                           sh);
        s->idx.next_shard = (sh + 1) % s->idx.nshards;
    }
    if (ov == OV_INFLIGHT) {
        pthread_mutex_unlock(&s->mu);
        quota_count(s, &q, q.shed_blocks, q.shed_bytes, 0);
        free(q.ids);
        free(rs);
        free(hdr);
        pf_block_put(b); /* keep the weak reference: retried after completions */
        return W_BLOCKED;
    }
    if (ov == OV_LOST) {
        pthread_mutex_unlock(&s->mu);
        pf_metric_add(s->m.w_fail, 1);
        goto skip; /* every shard is stuck: the block stays in RAM only */
    }
    struct ssd_place place;
    h.seq = atomic_fetch_add(&s->next_seq, 1);
    memcpy(h.uuid, s->sb[sh].uuid, sizeof(h.uuid));
    rc = ssd_rec_encode(&h, rs, hdr, h.hdr_len);
    if (rc == 0)
        rc = ssd_index_begin(&s->idx, b, rs, h.hdr_len, len, h.seq, &place);
    pthread_mutex_unlock(&s->mu);
    quota_count(s, &q, q.shed_blocks, q.shed_bytes, 0);
    free(rs);
    rs = NULL;
    if (rc) {
        pf_log_ratelimited(PF_LOG_WARN, 10000, "cannot index an SSD write: %s", strerror(-rc));
        pf_metric_add(s->m.w_fail, 1);
        goto skip;
    }
    free(q.ids);
    q.ids = NULL;
    struct wslot *sl = fifo_at(w, w->count);
    memset(sl, 0, sizeof(*sl));
    sl->b = b;
    sl->hdr = hdr;
    sl->place = place;
    sl->seq = w->cur->seq;
    sl->io.iov = malloc(((size_t)b->nslots * 2 + 1) * sizeof(struct iovec));
    sl->io.id = atomic_fetch_add(&s->next_io_id, 1);
    sl->io.op = PF_BLK_WRITE;
    sl->io.file = s->files[place.shard];
    sl->io.off = sl->io.next_off = place.off - place.hdr_len;
    sl->io.len = place.hdr_len + len;
    sl->io.t0_ns = pf_now_ns(); /* again when submitted (submit_runs) */
    if (!sl->io.iov) {
        sl->io.err = -ENOMEM;
    } else {
        sl->io.iov[0] = (struct iovec){hdr, place.hdr_len};
        sl->io.niov = 1 + ssd_block_iov(b, sl->io.iov + 1);
        sl->io.nparts = ssd_io_parts(sl->io.niov);
        if (sl->io.nparts > SSD_PARTS_MAX)
            sl->io.err = -E2BIG;
    }
    w->count++;
    pf_metric_add(s->m.w_inflight, 1);
    pf_block_weak_put(b);
    return W_STARTED; /* submitted by submit_runs, possibly with its neighbours */
skip:
    quota_count(s, &q, q.shed_blocks, q.shed_bytes, 0);
    free(q.ids);
    free(rs);
    free(hdr);
    pf_block_put(b);
    pf_block_weak_put(b);
    return W_SKIPPED;
}

/* Ring bytes of a slot's record (the request bytes plus the gap to the next record). */
static uint64_t rec_span(const struct wslot *sl)
{
    return (sl->io.len + SSD_REC_ALIGN - 1) / SSD_REC_ALIGN * SSD_REC_ALIGN;
}

/* Requests the device holds for the FIFO (a run's records are adjacent in it). */
static uint32_t requests_in_flight(struct writer *w)
{
    uint32_t n = 0;
    uint64_t last = UINT64_MAX;
    for (size_t i = 0; i < w->count; i++) {
        struct wslot *sl = fifo_at(w, i);
        if (ssd_io_outstanding(&sl->io) > 0 && sl->io.id != last) {
            n++;
            last = sl->io.id;
        }
    }
    return n;
}

/* How many FIFO slots from i (unsubmitted, one part each, on the same file, each starting
 * where the previous one's span ends) one request can carry; *niov_p its iovecs. */
static size_t run_length(struct writer *w, size_t i, int *niov_p)
{
    struct wslot *sl = fifo_at(w, i);
    int niov = sl->io.niov;
    uint64_t bytes = rec_span(sl);
    size_t k = 1;
    while (sl->io.nparts == 1 && i + k < w->count && k < w->s->cfg.write_merge) {
        struct wslot *pv = fifo_at(w, i + k - 1), *nx = fifo_at(w, i + k);
        int add = nx->io.niov + (rec_span(pv) > pv->io.len ? 1 : 0);
        if (nx->io.err || nx->io.submitted || nx->io.nparts != 1 || nx->io.file != sl->io.file ||
            nx->io.off != pv->io.off + rec_span(pv) || niov + add > SSD_IOV_MAX ||
            bytes + rec_span(nx) > W_RUN_BYTES)
            break;
        niov += add;
        bytes += rec_span(nx);
        k++;
    }
    *niov_p = niov;
    return k;
}

/* Submits the FIFO's unsubmitted writes in order, consecutive records merged into one
 * request, while fewer than write_inflight requests are in flight (and the remaining parts
 * of multi-part records). A full device queue leaves the rest for the next call. */
static void submit_runs(struct writer *w)
{
    struct pf_ssd *s = w->s;
    uint32_t reqs = requests_in_flight(w);
    uint64_t now = pf_now_ns();
    for (size_t i = 0; i < w->count;) {
        struct wslot *sl = fifo_at(w, i);
        if (sl->io.err || sl->io.submitted > 0) {
            if (!sl->io.err && sl->io.submitted < sl->io.nparts)
                ssd_io_submit(s->wqueue, &sl->io);
            i++;
            continue;
        }
        if (reqs >= s->cfg.write_inflight)
            return;
        int niov;
        size_t k = run_length(w, i, &niov);
        if (k == 1) {
            sl->io.t0_ns = now;
            ssd_io_submit(s->wqueue, &sl->io);
            if (sl->io.submitted == 0 && !sl->io.err)
                return; /* device queue full */
            reqs += sl->io.submitted > 0;
            i++;
            continue;
        }
        struct iovec *iov = malloc((size_t)niov * sizeof(*iov));
        if (!iov)
            return; /* retried on the next call */
        int n = 0;
        for (size_t j = 0; j < k; j++) {
            struct wslot *m = fifo_at(w, i + j);
            memcpy(iov + n, m->io.iov, (size_t)m->io.niov * sizeof(*iov));
            n += m->io.niov;
            m->run_off = m->io.off - sl->io.off;
            if (j + 1 < k && rec_span(m) > m->io.len)
                iov[n++] = (struct iovec){zero_pad, rec_span(m) - m->io.len};
        }
        int rc = pf_blk_submit(s->wqueue, sl->io.file, PF_BLK_WRITE, sl->io.off, iov, n,
                               sl->io.id << SSD_TAG_SHIFT);
        free(iov); /* the backend copies the iovec array */
        if (rc == -EAGAIN)
            return;
        for (size_t j = 0; j < k; j++) {
            struct wslot *m = fifo_at(w, i + j);
            m->in_run = true;
            m->io.id = sl->io.id;
            m->io.t0_ns = now;
            if (rc) {
                m->io.err = rc;
            } else {
                m->io.submitted = 1;
                m->io.next_off = m->io.off + m->io.len;
            }
        }
        reqs += rc == 0;
        i += k;
    }
}

/* One completion for sl: its own, or its share of its run's (res counts the whole
 * request's bytes: the record got those past its offset, up to its length). */
static void complete_slot(struct wslot *sl, int64_t res)
{
    if (!sl->in_run || res < 0) {
        ssd_io_complete(&sl->io, res);
        return;
    }
    uint64_t got = (uint64_t)res > sl->run_off ? (uint64_t)res - sl->run_off : 0;
    ssd_io_complete(&sl->io, (int64_t)(got < sl->io.len ? got : sl->io.len));
}

static void lost_add(struct writer *w, struct wslot *sl)
{
    if (w->nlost == w->caplost) {
        size_t nc = w->caplost ? w->caplost * 2 : 8;
        struct wslot *nl = realloc(w->lost, nc * sizeof(*nl));
        if (!nl) {
            /* cannot track it: leak the reference rather than free memory the device owns */
            pf_error("out of memory tracking a timed-out SSD write; its block is leaked");
            return;
        }
        w->lost = nl;
        w->caplost = nc;
    }
    w->lost[w->nlost++] = *sl;
}

/* Commits (or fails) finished writes at the FIFO front, in order. */
static void commit_front(struct writer *w, bool force)
{
    struct pf_ssd *s = w->s;
    uint64_t now = pf_now_ns();
    while (w->count > 0) {
        struct wslot *sl = fifo_at(w, 0);
        /* a write not submitted yet waits for the request depth, not for the device */
        bool timed_out =
            sl->io.submitted > 0 && now - sl->io.t0_ns >= s->io_timeout_ms * PF_NS_PER_MS;
        if (!ssd_io_done(&sl->io) && !timed_out && !force)
            break;
        bool ok = ssd_io_done(&sl->io) && ssd_io_ok(&sl->io);
        struct pf_block_key key = pf_block_key(sl->b);
        pthread_mutex_lock(&s->mu);
        int rc = ok ? ssd_index_commit(&s->idx, &key, &sl->place) : -EIO;
        if (rc)
            ssd_index_remove(&s->idx, &key, &sl->place);
        pthread_mutex_unlock(&s->mu);
        if (ok && rc == 0) {
            pf_metric_add(s->m.w_bytes, (double)sl->io.len);
            pf_metric_add(s->m.w_blocks, 1);
            pf_metric_observe(s->m.w_tput, ssd_rate(sl->io.len, now - sl->io.t0_ns));
        } else if (ok) {
            pf_debug("SSD write on shard %u overtaken by the ring before it committed",
                     sl->place.shard);
        } else {
            pf_metric_add(s->m.w_fail, 1);
            const char *why = !ssd_io_done(&sl->io) ? "no completion within the I/O timeout"
                              : sl->io.err          ? strerror(-sl->io.err)
                                                    : "short write";
            pf_log_ratelimited(PF_LOG_WARN, 5000,
                               "SSD write of %llu bytes to %s at offset %llu failed: %s (block "
                               "stays in RAM only)",
                               (unsigned long long)sl->io.len, s->paths[sl->place.shard],
                               (unsigned long long)sl->place.off, why);
        }
        if (ssd_io_outstanding(&sl->io) > 0)
            lost_add(w, sl);
        else
            slot_release(sl);
        pf_metric_add(s->m.w_inflight, -1);
        w->head = (w->head + 1) % w->cap;
        w->count--;
    }
}

/* A completion goes to every slot of its request: one record, or a run's records (which
 * may be split between the FIFO and the timed-out list). */
static void dispatch(struct writer *w, const struct pf_blk_cqe *c)
{
    uint64_t id = c->tag >> SSD_TAG_SHIFT;
    for (size_t i = 0; i < w->count; i++) {
        struct wslot *sl = fifo_at(w, i);
        if (sl->io.id == id && ssd_io_outstanding(&sl->io) > 0)
            complete_slot(sl, c->res);
    }
    for (size_t i = w->nlost; i-- > 0;) {
        if (w->lost[i].io.id != id || ssd_io_outstanding(&w->lost[i].io) == 0)
            continue;
        complete_slot(&w->lost[i], c->res);
        if (ssd_io_outstanding(&w->lost[i].io) == 0) {
            slot_release(&w->lost[i]);
            w->lost[i] = w->lost[--w->nlost];
        }
    }
}

static void publish_done(struct writer *w)
{
    struct pf_ssd *s = w->s;
    uint64_t done;
    if (w->count > 0)
        done = fifo_at(w, 0)->seq - 1;
    else if (w->cur)
        done = w->cur->seq - 1;
    else
        done = w->last_taken;
    pthread_mutex_lock(&s->wq_mu);
    if (done > s->seq_done) {
        s->seq_done = done;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->wq_mu);
}

static void drop_cur(struct writer *w)
{
    if (!w->cur)
        return;
    size_t left = w->cur->n - w->ipend;
    for (size_t i = w->ipend; i < w->cur->n; i++)
        pf_block_weak_put(w->cur->b[i]);
    pf_metric_add(w->s->m.w_pending, -(double)left);
    free(w->cur);
    w->cur = NULL;
}

/* Takes the next batch; waits up to wait_ms when there is nothing else to do. Returns false
 * when the writer must stop. */
static bool take_batch(struct writer *w, uint64_t wait_ms)
{
    struct pf_ssd *s = w->s;
    pthread_mutex_lock(&s->wq_mu);
    if (s->wq_count == 0 && !s->w_stop && wait_ms) {
        struct timespec dl = pf_deadline_ms(wait_ms);
        pthread_cond_timedwait(&s->wq_cv, &s->wq_mu, &dl);
    }
    bool stop = s->w_stop;
    if (!stop && s->wq_count > 0) {
        w->cur = s->wq[s->wq_head];
        s->wq_head = (s->wq_head + 1) % s->wq_cap;
        s->wq_count--;
        w->ipend = 0;
        w->last_taken = w->cur->seq;
    }
    pthread_mutex_unlock(&s->wq_mu);
    return !stop;
}

static void poll_device(struct writer *w, uint64_t timeout_ms)
{
    struct pf_blk_cqe cq[SSD_POLL_BATCH];
    int n = pf_blk_poll(w->s->wqueue, cq, SSD_POLL_BATCH, timeout_ms);
    for (int i = 0; i < n; i++)
        dispatch(w, &cq[i]);
}

static void shutdown_writer(struct writer *w)
{
    struct pf_ssd *s = w->s;
    drop_cur(w);
    pthread_mutex_lock(&s->wq_mu);
    while (s->wq_count > 0) {
        struct ssd_wbatch *b = s->wq[s->wq_head];
        s->wq_head = (s->wq_head + 1) % s->wq_cap;
        s->wq_count--;
        for (size_t i = 0; i < b->n; i++)
            pf_block_weak_put(b->b[i]);
        pf_metric_add(s->m.w_pending, -(double)b->n);
        free(b);
    }
    pthread_mutex_unlock(&s->wq_mu);
    uint64_t grace = PF_MIN_OF(s->io_timeout_ms, W_STOP_GRACE_MS);
    uint64_t deadline = pf_now_ns() + grace * PF_NS_PER_MS;
    while (w->count > 0 && pf_now_ns() < deadline) {
        submit_runs(w);
        poll_device(w, 20);
        commit_front(w, false);
    }
    commit_front(w, true);
    /* the queue waits for what the device still owns; then the blocks can go */
    pf_blk_queue_destroy(s->wqueue);
    s->wqueue = NULL;
    for (size_t i = 0; i < w->nlost; i++)
        slot_release(&w->lost[i]);
    w->nlost = 0;
    pthread_mutex_lock(&s->wq_mu);
    s->seq_done = s->seq_enq;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->wq_mu);
}

void *ssd_writer_main(void *arg)
{
    struct writer w = {.s = arg};
    struct pf_ssd *s = w.s;
    w.cap = (size_t)s->cfg.write_inflight * s->cfg.write_merge; /* placed: in flight or waiting */
    w.fifo = calloc(w.cap, sizeof(*w.fifo));
    if (!w.fifo) {
        pf_error("SSD writer: out of memory; SSD writes disabled");
        pthread_mutex_lock(&s->wq_mu);
        while (!s->w_stop)
            pthread_cond_wait(&s->wq_cv, &s->wq_mu);
        pthread_mutex_unlock(&s->wq_mu);
        shutdown_writer(&w);
        return NULL;
    }
    /* nothing is written before the recovery scan has placed the ring head after the
     * newest record (offers meanwhile queue up, then are dropped as queue-full) */
    while (!atomic_load(&s->stopped) && !ssd_recover_wait(s, 200))
        ;
    for (;;) {
        if (atomic_load(&s->stopped))
            break;
        if (!w.cur) {
            /* idle: wait for work; busy: just look */
            bool idle = w.count == 0 && w.nlost == 0;
            if (!take_batch(&w, idle ? 200 : 0))
                break;
        }
        bool blocked = false;
        while (w.cur && w.count < w.cap && !blocked) {
            if (w.ipend == w.cur->n) {
                free(w.cur);
                w.cur = NULL;
                break;
            }
            int r = start_write(&w, w.cur->b[w.ipend]);
            if (r == W_BLOCKED) {
                blocked = true;
                break;
            }
            w.ipend++;
            pf_metric_add(s->m.w_pending, -1);
        }
        if (w.cur && w.ipend == w.cur->n) {
            free(w.cur);
            w.cur = NULL;
        }
        /* the placed writes, merged into requests up to the depth (and parts left
         * unsubmitted by a full device queue) */
        submit_runs(&w);
        if (w.count > 0 || w.nlost > 0) {
            /* completions wake the poll early; without pending work also look at the
             * queue regularly */
            poll_device(&w, w.cur ? 100 : 10);
            commit_front(&w, false);
        }
        publish_done(&w);
    }
    shutdown_writer(&w);
    free(w.fifo);
    free(w.lost);
    return NULL;
}

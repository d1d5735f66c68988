/* Superblocks and the recovery scan of the SSD tier (docs/ssd.md, "Recovery").
 *
 * At start-up every shard's superblock is read: an all-zero one (a new file) is formatted
 * with a new random identity; one of ours with the same geometry is scanned (recovery on)
 * or given a new identity (recovery off: every old record is then ignored); one of ours
 * with another geometry is reformatted with a warning; one of another format version or
 * not ours is refused (or reformatted with --ssd-reformat).
 *
 * The scan runs on its own thread while the server serves: it reads each scanned shard
 * sequentially in large O_DIRECT reads, verifies every record (header checksum, identity,
 * fields, payload slot checksums) and inserts it COMMITTED into the index as it goes (the
 * newest sequence number wins per key), so SSD hits appear while it proceeds. When a
 * shard is done its ring head is placed right after its newest record, so new writes
 * overwrite the oldest records first. The writer starts only when the scan is finished. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define PF_LOG_MOD "ssd"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/log.h"
#include "pf/thread.h"
#include "ssd/ssd_internal.h"

#define SCAN_CHUNK (8u << 20)

const char *const ssd_drop_reason[SSD_DROP_NREASONS] = {
    [SSD_DROP_TORN] = "torn",        [SSD_DROP_HEADER] = "header",
    [SSD_DROP_VERSION] = "version",  [SSD_DROP_IDENTITY] = "identity",
    [SSD_DROP_OLDER] = "superseded", [SSD_DROP_GEOMETRY] = "geometry",
};

struct ssd_fpset {
    uint32_t ns;
    uint8_t keylen;
    uint16_t nslots;
    uint64_t fp;
};

/* ---- synchronous I/O on a private queue (start-up and the scanner only) ---- */

static int sync_io(struct pf_ssd *s, struct pf_blk_queue *q, struct pf_blk_file *f,
                   enum pf_blk_op op, uint64_t off, void *buf, uint64_t len)
{
    struct iovec iov = {buf, len};
    int rc = pf_blk_submit(q, f, op, off, &iov, 1, 1);
    if (rc)
        return rc;
    struct pf_blk_cqe c;
    int n = pf_blk_poll(q, &c, 1, s->io_timeout_ms);
    if (n <= 0)
        return n < 0 ? n : -ETIMEDOUT; /* the queue's destroy waits for it */
    if (c.res < 0)
        return (int)c.res;
    return (uint64_t)c.res == len ? 0 : -EIO;
}

/* ---- superblocks ---- */

static int format_shard(struct pf_ssd *s, struct pf_blk_queue *q, uint32_t i, uint8_t *buf)
{
    struct ssd_superblock *sb = &s->sb[i];
    memset(sb, 0, sizeof(*sb));
    sb->version = SSD_FORMAT_VERSION;
    sb->file_size = s->shard_cap;
    sb->ring_off = SSD_SB_SIZE;
    sb->ring_cap = s->shard_cap - SSD_SB_SIZE;
    sb->shard = i;
    sb->nshards = s->nshards;
    if (getrandom(sb->uuid, sizeof(sb->uuid), 0) != (ssize_t)sizeof(sb->uuid))
        return -errno;
    ssd_sb_encode(sb, buf);
    return sync_io(s, q, s->files[i], PF_BLK_WRITE, 0, buf, SSD_SB_SIZE);
}

int ssd_format_open(struct pf_ssd *s, char *err, size_t errlen)
{
    s->sb = calloc(s->nshards, sizeof(*s->sb));
    s->need_scan = calloc(s->nshards, sizeof(*s->need_scan));
    uint8_t *buf = NULL;
    struct pf_blk_queue *q = NULL;
    if (!s->sb || !s->need_scan || posix_memalign((void **)&buf, PF_BLK_ALIGN, SSD_SB_SIZE)) {
        snprintf(err, errlen, "SSD cache: out of memory");
        return -ENOMEM;
    }
    int rc = pf_blk_queue_create(s->cfg.blk, 4, &q);
    if (rc) {
        snprintf(err, errlen, "SSD cache: cannot create an I/O queue: %s", strerror(-rc));
        goto out;
    }
    for (uint32_t i = 0; i < s->nshards; i++) {
        const char *path = s->paths[i];
        rc = sync_io(s, q, s->files[i], PF_BLK_READ, 0, buf, SSD_SB_SIZE);
        if (rc) {
            snprintf(err, errlen, "--ssd-cache-path %s: cannot read the superblock: %s", path,
                     strerror(-rc));
            goto out;
        }
        struct ssd_superblock sb;
        uint32_t version = 0;
        int d = ssd_sb_decode(buf, &sb, &version);
        const char *why = NULL;
        if (d == -ENODATA) {
            why = "new file";
        } else if (d == -EPROTO || d == -EBADMSG) {
            char what[96];
            if (d == -EPROTO)
                snprintf(what, sizeof(what),
                         "an SSD cache file of format version %u (this build "
                         "reads version %u)",
                         version, SSD_FORMAT_VERSION);
            else
                snprintf(what, sizeof(what),
                         "not a PegaFlow SSD cache file (or its superblock is corrupt)");
            if (!s->cfg.reformat) {
                snprintf(err, errlen,
                         "--ssd-cache-path %s: %s; refusing to overwrite it (move it away, or "
                         "start with --ssd-reformat to discard its contents)",
                         path, what);
                rc = -EPROTO;
                goto out;
            }
            pf_warn("--ssd-cache-path %s: %s; --ssd-reformat: starting it empty", path, what);
            why = "reformatted";
        } else if (sb.file_size != s->shard_cap || sb.ring_cap != s->shard_cap - SSD_SB_SIZE ||
                   sb.shard != i || sb.nshards != s->nshards) {
            pf_warn("--ssd-cache-path %s: written with another geometry (file %llu bytes, shard "
                    "%u of %u; now %llu bytes, shard %u of %u): starting it empty",
                    path, (unsigned long long)sb.file_size, sb.shard, sb.nshards,
                    (unsigned long long)s->shard_cap, i, s->nshards);
            why = "geometry changed";
        } else if (!s->cfg.recover) {
            why = "--ssd-recover off";
        } else {
            s->sb[i] = sb;
            s->need_scan[i] = true;
            pf_info("SSD shard %u: %s has a superblock of format %u: recovering it in the "
                    "background",
                    i, path, version);
            continue;
        }
        rc = format_shard(s, q, i, buf);
        if (rc) {
            snprintf(err, errlen, "--ssd-cache-path %s: cannot write the superblock: %s", path,
                     strerror(-rc));
            goto out;
        }
        pf_info("SSD shard %u: %s formatted empty (%s)", i, path, why);
    }
    rc = 0;
out:
    pf_blk_queue_destroy(q);
    free(buf);
    return rc;
}

/* ---- learned layouts ---- */

static bool fp_known(const struct pf_ssd *s, uint32_t ns, uint8_t keylen, uint16_t nslots,
                     uint64_t fp, bool *any_p)
{
    bool any = false;
    for (size_t i = 0; i < s->nfps; i++) {
        const struct ssd_fpset *f = &s->fps[i];
        if (f->ns != ns || f->keylen != keylen || f->nslots != nslots)
            continue;
        any = true;
        if (f->fp == fp)
            return true;
    }
    *any_p = any;
    return false;
}

void ssd_fp_learn(struct pf_ssd *s, const struct pf_block_key *k, uint16_t nslots, uint64_t fp)
{
    bool any;
    if (fp_known(s, k->ns, k->len, nslots, fp, &any))
        return;
    if (s->nfps == s->capfps) {
        size_t nc = s->capfps ? s->capfps * 2 : 8;
        struct ssd_fpset *n = realloc(s->fps, nc * sizeof(*n));
        if (!n)
            return; /* not learning only keeps records that the load path checks anyway */
        s->fps = n;
        s->capfps = nc;
    }
    s->fps[s->nfps++] = (struct ssd_fpset){k->ns, k->len, nslots, fp};
    /* recovered records of this namespace and shape whose layout no block sealed in this
     * process has: written by a run with another geometry */
    uint64_t dropped = 0;
    for (uint32_t sh = 0; sh < s->idx.nshards; sh++) {
        struct pf_list *pos, *tmp;
        pf_list_for_each_safe(pos, tmp, &s->idx.shards[sh].fifo)
        {
            struct ssd_entry *e = pf_list_entry(pos, struct ssd_entry, fifo);
            if (!e->recovered || e->key.ns != k->ns || e->key.len != k->len ||
                e->nslots != nslots || fp_known(s, k->ns, k->len, nslots, e->fp, &any))
                continue;
            ssd_index_drop(&s->idx, e);
            dropped++;
        }
    }
    if (dropped) {
        pf_child_add(s->m.r_drop[SSD_DROP_GEOMETRY], (double)dropped);
        pf_metric_add(s->m.r_blocks, -(double)dropped);
        pf_warn("SSD: %llu recovered block(s) of namespace %s have another block geometry than "
                "this run's: dropped",
                (unsigned long long)dropped, pf_ns_name(k->ns));
    }
}

/* ---- the scan ---- */

struct scan {
    struct pf_ssd *s;
    struct pf_blk_queue *q;
    uint32_t sh;
    uint64_t cap; /* ring bytes */
    uint8_t *buf; /* window: ring bytes [wpos, wpos + wlen) */
    uint64_t bufcap, wpos, wlen;
    uint64_t max_seq, newest_end; /* of this shard */
    bool any;
    uint64_t blocks, bytes, scanned, drop[SSD_DROP_NREASONS];
    int err;
    /* read-ahead: the next chunk is read while the window is verified; ring bytes
     * [ra_off + ra_used, ra_off + ra_len) once ready. ra belongs to the scan thread and
     * is freed only after the queue is destroyed (the device may own it) */
    uint8_t *ra;
    uint64_t ra_off, ra_len, ra_used;
    bool ra_pending, ra_ready;
};

static void ra_issue(struct scan *c, uint64_t off)
{
    if (!c->ra || c->ra_pending || c->ra_ready || off >= c->cap)
        return;
    uint64_t n = PF_MIN_OF(SCAN_CHUNK, c->cap - off);
    struct iovec iov = {c->ra, n};
    if (pf_blk_submit(c->q, c->s->files[c->sh], PF_BLK_READ, SSD_SB_SIZE + off, &iov, 1, 2) != 0)
        return; /* no read-ahead this time: the window reads synchronously */
    c->ra_pending = true;
    c->ra_off = off;
    c->ra_len = n;
    c->ra_used = 0;
}

/* Waits for the read-ahead in flight. 0 (ready) or -errno (then it is not used; after a
 * timeout the device may still own the buffer: the scan stops and the queue's destroy
 * waits for it). */
static int ra_wait(struct scan *c)
{
    struct pf_blk_cqe cqe;
    int k = pf_blk_poll(c->q, &cqe, 1, c->s->io_timeout_ms);
    if (k <= 0) {
        c->ra = NULL; /* never touched again by this scan */
        return k < 0 ? k : -ETIMEDOUT;
    }
    c->ra_pending = false;
    if (cqe.res < 0)
        return (int)cqe.res;
    if ((uint64_t)cqe.res != c->ra_len)
        return -EIO;
    c->ra_ready = true;
    return 0;
}

/* Reads ring bytes [at, at + n) into dst: from the read-ahead when it holds them, else
 * synchronously; then starts the read-ahead of what follows. */
static int fill(struct scan *c, uint64_t at, uint8_t *dst, uint64_t n, uint64_t *got_p)
{
    if (c->ra_pending && c->ra_off == at) {
        int rc = ra_wait(c);
        if (rc)
            return rc;
    }
    if (c->ra_ready && c->ra_off + c->ra_used == at) {
        uint64_t k = PF_MIN_OF(n, c->ra_len - c->ra_used);
        memcpy(dst, c->ra + c->ra_used, k);
        c->ra_used += k;
        *got_p = k;
        if (c->ra_used == c->ra_len) {
            c->ra_ready = false;
            ra_issue(c, c->ra_off + c->ra_len);
        }
        return 0;
    }
    if (c->ra_pending) { /* a jump: the read-ahead is of no use */
        int rc = ra_wait(c);
        if (rc)
            return rc;
    }
    c->ra_ready = false;
    int rc = sync_io(c->s, c->q, c->s->files[c->sh], PF_BLK_READ, SSD_SB_SIZE + at, dst, n);
    if (rc)
        return rc;
    *got_p = n;
    ra_issue(c, at + n);
    return 0;
}

static void drop(struct scan *c, enum ssd_drop r)
{
    c->drop[r]++;
    pf_child_add(c->s->m.r_drop[r], 1);
}

/* Makes ring bytes [pos, pos + need) present in the window (need is capped at the ring
 * end). false on an I/O error (c->err) or when the store stops. */
static bool ensure(struct scan *c, uint64_t pos, uint64_t need)
{
    if (pos + need > c->cap)
        need = c->cap - pos;
    if (pos >= c->wpos && pos + need <= c->wpos + c->wlen)
        return true;
    if (need > c->bufcap) {
        uint64_t nc = (need + SCAN_CHUNK - 1) / SCAN_CHUNK * SCAN_CHUNK;
        uint8_t *nb;
        if (posix_memalign((void **)&nb, PF_BLK_ALIGN, nc)) {
            c->err = -ENOMEM;
            return false;
        }
        if (pos >= c->wpos && pos < c->wpos + c->wlen)
            memcpy(nb, c->buf + (pos - c->wpos), c->wpos + c->wlen - pos);
        free(c->buf);
        c->buf = nb;
        c->bufcap = nc;
        if (pos >= c->wpos && pos < c->wpos + c->wlen) {
            c->wlen = c->wpos + c->wlen - pos;
        } else {
            c->wlen = 0;
        }
        c->wpos = pos;
    } else if (pos >= c->wpos && pos < c->wpos + c->wlen) {
        uint64_t keep = c->wpos + c->wlen - pos;
        memmove(c->buf, c->buf + (pos - c->wpos), keep);
        c->wpos = pos;
        c->wlen = keep;
    } else {
        c->wpos = pos;
        c->wlen = 0;
    }
    while (c->wlen < need) {
        if (atomic_load(&c->s->stopped))
            return false;
        uint64_t n = PF_MIN_OF(c->bufcap - c->wlen, c->cap - (c->wpos + c->wlen));
        int rc = fill(c, c->wpos + c->wlen, c->buf + c->wlen, n, &n);
        if (rc) {
            c->err = rc;
            return false;
        }
        c->wlen += n;
        c->scanned += n;
        pf_metric_add(c->s->m.r_scanned, (double)n);
    }
    return true;
}

static void index_record(struct scan *c, const struct ssd_rec_hdr *h, uint64_t pos)
{
    struct pf_ssd *s = c->s;
    struct pf_block_key key = h->key;
    if (pf_ns_intern(h->ns, &key.ns) != 0)
        return;
    struct ssd_entry *e = calloc(1, sizeof(*e) + (size_t)h->nslots * sizeof(e->slots[0]));
    if (!e)
        return;
    e->key = key;
    e->shard = c->sh;
    e->state = SSD_COMMITTED;
    e->recovered = 1;
    e->nslots = h->nslots;
    e->start = pos;
    e->off = SSD_SB_SIZE + pos + h->hdr_len;
    e->len = h->payload_len;
    e->seq = h->seq;
    e->fp = h->layout_fp;
    e->span = ssd_rec_span(h->hdr_len, h->payload_len);
    for (uint16_t i = 0; i < h->nslots; i++) {
        struct ssd_rec_slot rs;
        ssd_rec_slot_at(h, i, &rs);
        e->slots[i] = (struct ssd_slot_meta){.checksum = rs.checksum,
                                             .seg_len = rs.seg_len,
                                             .seg_stride = rs.seg_stride,
                                             .numa = rs.numa,
                                             .nseg = rs.nseg,
                                             .has_checksum = 1};
    }
    pthread_mutex_lock(&s->mu);
    struct ssd_entry *old = ssd_index_find(&s->idx, &key);
    bool keep = true;
    if (old && old->seq > e->seq) {
        keep = false;
    } else if (old) {
        pf_metric_add(s->m.r_blocks, -1);
        pf_metric_add(s->m.r_bytes, -(double)old->len);
        ssd_index_drop(&s->idx, old);
    }
    if (keep && ssd_index_insert(&s->idx, e) != 0)
        keep = false;
    if (keep) {
        pf_metric_add(s->m.r_blocks, 1);
        pf_metric_add(s->m.r_bytes, (double)e->len);
    }
    pthread_mutex_unlock(&s->mu);
    if (old)
        drop(c, SSD_DROP_OLDER);
    if (!keep) {
        free(e);
        return;
    }
    c->blocks++;
    c->bytes += h->payload_len;
}

/* Largest header a record can have. */
static uint64_t hdr_max(void)
{
    return ssd_rec_hdr_len(SSD_NS_MAX, SSD_REC_SLOTS_MAX);
}

static void scan_shard(struct scan *c)
{
    struct pf_ssd *s = c->s;
    const uint8_t *uuid = s->sb[c->sh].uuid;
    uint64_t pos = 0;
    while (pos < c->cap) {
        if (!ensure(c, pos, SSD_REC_ALIGN))
            return;
        struct ssd_rec_hdr h;
        uint64_t avail = c->wpos + c->wlen - pos;
        enum ssd_parse r = ssd_rec_decode(c->buf + (pos - c->wpos), avail, &h);
        if (r == SSD_PARSE_SHORT) {
            if (!ensure(c, pos, hdr_max()))
                return;
            avail = c->wpos + c->wlen - pos;
            r = ssd_rec_decode(c->buf + (pos - c->wpos), avail, &h);
            if (r == SSD_PARSE_SHORT)
                r = SSD_PARSE_CHECKSUM; /* runs past the ring end */
        }
        switch (r) {
        case SSD_PARSE_NONE:
            pos += SSD_REC_ALIGN;
            continue;
        case SSD_PARSE_VERSION:
            drop(c, SSD_DROP_VERSION);
            pos += SSD_REC_ALIGN;
            continue;
        case SSD_PARSE_CHECKSUM:
        case SSD_PARSE_INVALID:
        case SSD_PARSE_SHORT:
            drop(c, SSD_DROP_HEADER);
            pos += SSD_REC_ALIGN;
            continue;
        case SSD_PARSE_OK:
            break;
        }
        if (memcmp(h.uuid, uuid, sizeof(h.uuid)) != 0) {
            /* an older identity's record: its payload is not trusted to delimit anything */
            drop(c, SSD_DROP_IDENTITY);
            pos += SSD_REC_ALIGN;
            continue;
        }
        uint64_t rec = h.hdr_len + h.payload_len;
        if (h.payload_len > c->cap || pos + rec > c->cap) {
            drop(c, SSD_DROP_TORN);
            pos += SSD_REC_ALIGN;
            continue;
        }
        /* the header lives in the window: copy it before ensure() may move the window */
        uint8_t *hcopy = malloc(h.hdr_len);
        if (!hcopy) {
            c->err = -ENOMEM;
            return;
        }
        memcpy(hcopy, c->buf + (pos - c->wpos), h.hdr_len);
        h.slots_raw = hcopy + (h.slots_raw - (c->buf + (pos - c->wpos)));
        bool ok = ensure(c, pos, rec);
        if (ok && ssd_rec_payload_ok(&h, c->buf + (pos - c->wpos) + h.hdr_len)) {
            index_record(c, &h, pos);
            uint64_t span = PF_MIN_OF(ssd_rec_span(h.hdr_len, h.payload_len), c->cap - pos);
            if (!c->any || h.seq > c->max_seq) {
                c->any = true;
                c->max_seq = h.seq;
                c->newest_end = pos + span;
            }
            pos += span;
        } else if (ok) {
            drop(c, SSD_DROP_TORN);
            pos += SSD_REC_ALIGN;
        }
        free(hcopy);
        if (!ok)
            return;
    }
}

/* Places the ring head right after the newest record and gives every entry the logical
 * start that keeps the overwrite order: records after the newest one are one lap older. */
static void place_head(struct scan *c)
{
    struct pf_ssd *s = c->s;
    if (!c->any)
        return;
    pthread_mutex_lock(&s->mu);
    struct ssd_index_shard *xs = &s->idx.shards[c->sh];
    uint64_t cap = xs->ring.cap, end = c->newest_end;
    struct pf_list older, newer, *pos, *tmp;
    pf_list_init(&older);
    pf_list_init(&newer);
    pf_list_for_each_safe(pos, tmp, &xs->fifo)
    {
        struct ssd_entry *e = pf_list_entry(pos, struct ssd_entry, fifo);
        pf_list_del(&e->fifo);
        if (e->start >= end) {
            pf_list_add_tail(&older, &e->fifo);
        } else {
            e->start += cap;
            pf_list_add_tail(&newer, &e->fifo);
        }
    }
    pf_list_for_each_safe(pos, tmp, &older)
    {
        pf_list_del(pos);
        pf_list_add_tail(&xs->fifo, pos);
    }
    pf_list_for_each_safe(pos, tmp, &newer)
    {
        pf_list_del(pos);
        pf_list_add_tail(&xs->fifo, pos);
    }
    xs->ring.head = cap + end;
    pthread_mutex_unlock(&s->mu);
}

static void finish(struct pf_ssd *s, uint64_t blocks)
{
    pthread_mutex_lock(&s->scan_mu);
    s->scan_done = true;
    pthread_cond_broadcast(&s->scan_cv);
    pf_ssd_recovered_fn fn = s->recovered_fn;
    void *ctx = s->recovered_ctx;
    pthread_mutex_unlock(&s->scan_mu);
    if (fn && blocks)
        fn(ctx, blocks);
}

void pf_ssd_set_recovered(struct pf_ssd *s, pf_ssd_recovered_fn fn, void *ctx)
{
    pthread_mutex_lock(&s->scan_mu);
    s->recovered_fn = fn;
    s->recovered_ctx = ctx;
    pthread_mutex_unlock(&s->scan_mu);
}

int pf_ssd_for_each_key(struct pf_ssd *s, int (*fn)(void *ctx, const struct pf_block_key *k),
                        void *ctx)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t sh = 0; sh < s->idx.nshards && rc == 0; sh++) {
        struct pf_list *pos, *tmp;
        pf_list_for_each_safe(pos, tmp, &s->idx.shards[sh].fifo)
        {
            struct ssd_entry *e = pf_list_entry(pos, struct ssd_entry, fifo);
            if (e->state != SSD_COMMITTED)
                continue;
            rc = fn(ctx, &e->key);
            if (rc)
                break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void *scan_main(void *arg)
{
    struct pf_ssd *s = arg;
    uint64_t t0 = pf_now_ns();
    struct scan tot = {0};
    uint32_t nscanned = 0;
    uint64_t max_seq = 0;
    int err = 0;
    struct pf_blk_queue *q = NULL;
    err = pf_blk_queue_create(s->cfg.blk, 4, &q);
    uint8_t *ra = NULL;
    if (posix_memalign((void **)&ra, PF_BLK_ALIGN, SCAN_CHUNK) != 0)
        ra = NULL; /* no read-ahead */
    bool ra_lost = false;
    for (uint32_t sh = 0; !err && !ra_lost && sh < s->nshards && !atomic_load(&s->stopped); sh++) {
        if (!s->need_scan[sh])
            continue;
        struct scan c = {.s = s, .q = q, .sh = sh, .cap = s->shard_cap - SSD_SB_SIZE, .ra = ra};
        scan_shard(&c);
        if (c.ra_pending && c.ra && ra_wait(&c) != 0)
            ra_lost = true;
        if (!c.ra && ra)
            ra_lost = true; /* timed out: the device may still own it */
        if (!c.err && !atomic_load(&s->stopped))
            place_head(&c);
        else if (c.err) {
            /* nothing after the failure point is known: keep what was verified, write after
             * the newest record seen so far */
            pf_error("SSD recovery of %s stopped at ring offset %llu: %s", s->paths[sh],
                     (unsigned long long)(c.wpos + c.wlen), strerror(-c.err));
            place_head(&c);
            err = 0;
        }
        free(c.buf);
        nscanned++;
        if (c.any && c.max_seq > max_seq)
            max_seq = c.max_seq;
        tot.blocks += c.blocks;
        tot.bytes += c.bytes;
        tot.scanned += c.scanned;
        for (int r = 0; r < SSD_DROP_NREASONS; r++)
            tot.drop[r] += c.drop[r];
    }
    pf_blk_queue_destroy(q); /* waits for whatever the device still owns */
    free(ra);
    /* the scan inserted in disk order: the per-namespace quota order is by age */
    pthread_mutex_lock(&s->mu);
    if (ssd_index_ns_sort(&s->idx) != 0)
        pf_warn("SSD recovery: out of memory ordering the recovered blocks by age: SSD quota "
                "evictions may take them in disk order");
    pthread_mutex_unlock(&s->mu);
    if (err)
        pf_error("SSD recovery: cannot create an I/O queue: %s", strerror(-err));
    /* never reuse a sequence number of a record still on disk */
    uint64_t next = atomic_load(&s->next_seq);
    if (max_seq + 1 > next)
        atomic_store(&s->next_seq, max_seq + 1);
    double secs = (double)(pf_now_ns() - t0) / 1e9;
    pf_metric_set(s->m.r_seconds, secs);
    pf_metric_set(s->m.r_state, 2);
    char bytes[32], scanned[32];
    pf_format_size(tot.bytes, bytes, sizeof(bytes));
    pf_format_size(tot.scanned, scanned, sizeof(scanned));
    pf_info("SSD recovery %s: %llu block(s) (%s) recovered from %u shard(s) in %.3f s (%s "
            "scanned, %.0f MB/s); dropped: torn %llu, header %llu, version %llu, identity %llu, "
            "superseded %llu",
            atomic_load(&s->stopped) ? "interrupted" : "done", (unsigned long long)tot.blocks,
            bytes, nscanned, secs, scanned, (double)tot.scanned / 1e6 / (secs > 0 ? secs : 1e-9),
            (unsigned long long)tot.drop[SSD_DROP_TORN],
            (unsigned long long)tot.drop[SSD_DROP_HEADER],
            (unsigned long long)tot.drop[SSD_DROP_VERSION],
            (unsigned long long)tot.drop[SSD_DROP_IDENTITY],
            (unsigned long long)tot.drop[SSD_DROP_OLDER]);
    /* quotas before the recovered blocks are announced; again after scan_done, for a hook
     * installed in between (pf_ssd_set_quota enforces only once the scan is done) */
    if (!atomic_load(&s->stopped))
        ssd_quota_enforce_all(s);
    finish(s, atomic_load(&s->stopped) ? 0 : tot.blocks);
    if (!atomic_load(&s->stopped))
        ssd_quota_enforce_all(s);
    return NULL;
}

int ssd_recover_start(struct pf_ssd *s, char *err, size_t errlen)
{
    atomic_store(&s->next_seq, 1);
    uint64_t total = 0;
    for (uint32_t i = 0; i < s->nshards; i++)
        if (s->need_scan[i])
            total += s->shard_cap - SSD_SB_SIZE;
    pf_metric_set(s->m.r_total, (double)total);
    if (total == 0) {
        pf_metric_set(s->m.r_state, 2);
        finish(s, 0);
        return 0;
    }
    pf_metric_set(s->m.r_state, 1);
    int rc = pf_thread_start(&s->scanner, "pegaflow-ssdscan", -1, scan_main, s);
    if (rc) {
        snprintf(err, errlen, "SSD cache: cannot start the recovery thread: %s", strerror(-rc));
        return rc;
    }
    s->scanner_started = true;
    return 0;
}

void ssd_recover_stop(struct pf_ssd *s)
{
    if (s->scanner_started)
        pthread_join(s->scanner, NULL);
    s->scanner_started = false;
}

bool ssd_recover_wait(struct pf_ssd *s, uint64_t timeout_ms)
{
    struct timespec dl = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&s->scan_mu);
    while (!s->scan_done)
        if (pthread_cond_timedwait(&s->scan_cv, &s->scan_mu, &dl) == ETIMEDOUT)
            break;
    bool done = s->scan_done;
    pthread_mutex_unlock(&s->scan_mu);
    return done;
}

/* SSD prefetch: the global budget and the fetch call of the tier (an engine prefetch
 * thread; the reader thread is prefetch.c).
 *
 * fetch counts the committed prefix, reserves up to that many blocks of the
 * max_prefetch_blocks budget (the rest is backpressure), pushes one batch into the bounded
 * prefetch queue and waits, bounded, for the reader. While it waits it verifies the slot
 * checksums of each block the reader has accepted (reads of the same batch still in flight;
 * the hashing spreads over the prefetch threads), then drops the entry of a block that does
 * not verify and returns the accepted run from the first key. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "ssd"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/util.h"
#include "ssd/ssd_internal.h"

/* ---- budget ---- */

uint64_t ssd_budget_reserve(struct ssd_budget *b, uint64_t found, bool strict)
{
    uint64_t avail = b->max > b->used ? b->max - b->used : 0;
    uint64_t r = found <= avail ? found : strict ? 0 : avail;
    b->used += r;
    return r;
}

void ssd_budget_release(struct ssd_budget *b, uint64_t n)
{
    b->used = n <= b->used ? b->used - n : 0;
}

/* ---- batches ---- */

static struct ssd_rbatch *rbatch_new(const struct pf_block_key *keys, size_t n)
{
    struct ssd_rbatch *rb = calloc(1, sizeof(*rb));
    if (!rb)
        return NULL;
    rb->keys = malloc(n * sizeof(*keys));
    rb->out = calloc(n, sizeof(*rb->out));
    rb->place = calloc(n, sizeof(*rb->place));
    rb->accepted = calloc(n, sizeof(*rb->accepted));
    if (!rb->keys || !rb->out || !rb->place || !rb->accepted) {
        free(rb->keys);
        free(rb->out);
        free(rb->place);
        free(rb->accepted);
        free(rb);
        return NULL;
    }
    memcpy(rb->keys, keys, n * sizeof(*keys));
    rb->n = n;
    atomic_init(&rb->refs, 2);
    return rb;
}

/* ---- fetch (engine prefetch thread) ---- */

static void log_integrity(struct pf_ssd *s, const struct pf_block *b, int slot,
                          const struct ssd_place *p)
{
    char hex[2 * PF_HASH_MAX + 1];
    struct pf_block_key key = pf_block_key(b);
    pf_hex_encode(key.hash, key.len < 8 ? key.len : 8, hex);
    pf_log_ratelimited(PF_LOG_WARN, 1000,
                       "integrity: block %s... (namespace %s) read from %s at offset %llu fails "
                       "its checksum in slot %d: treated as a miss, SSD entry dropped",
                       hex, pf_ns_name(key.ns), s->paths[p->shard], (unsigned long long)p->off,
                       slot);
}

size_t pf_ssd_fetch(struct pf_ssd *s, const struct pf_block_key *keys, size_t n,
                    bool all_or_nothing, struct pf_block **out)
{
    /* bounded: reads time out individually; twice that covers a batch waiting its turn */
    return pf_ssd_fetch_within(s, keys, n, all_or_nothing, 2 * s->io_timeout_ms, out);
}

size_t pf_ssd_fetch_within(struct pf_ssd *s, const struct pf_block_key *keys, size_t n,
                           bool all_or_nothing, uint64_t timeout_ms, struct pf_block **out)
{
    if (atomic_load(&s->stopped) || n == 0)
        return 0;
    pthread_mutex_lock(&s->mu);
    size_t found = ssd_index_prefix(&s->idx, keys, n);
    pthread_mutex_unlock(&s->mu);
    if (found == 0 || (all_or_nothing && found < n))
        return 0;
    pthread_mutex_lock(&s->budget_mu);
    uint64_t reserved = ssd_budget_reserve(&s->budget, found, all_or_nothing);
    pthread_mutex_unlock(&s->budget_mu);
    if (reserved < found)
        pf_metric_add(s->m.p_backpressure, (double)(found - reserved));
    if (reserved == 0)
        return 0;
    size_t got = 0;
    uint64_t bytes = 0;
    struct ssd_rbatch *rb = rbatch_new(keys, reserved);
    if (!rb)
        goto out;
    pthread_mutex_lock(&s->rq_mu);
    bool queued = !s->r_stop && s->rq_count < s->rq_cap;
    if (queued) {
        s->rq[(s->rq_head + s->rq_count) % s->rq_cap] = rb;
        s->rq_count++;
        pthread_cond_signal(&s->rq_cv);
    }
    pthread_mutex_unlock(&s->rq_mu);
    if (!queued) {
        pf_metric_add(s->m.p_qfull, 1);
        pf_log_ratelimited(PF_LOG_DEBUG, 5000, "SSD prefetch queue full: %llu block(s) missed",
                           (unsigned long long)reserved);
        atomic_store(&rb->refs, 1);
        ssd_rbatch_put(rb);
        goto out;
    }
    /* per key: the first slot whose checksum does not verify, -1 when all do, -2 not
     * verified yet */
    int *bad = malloc(rb->n * sizeof(*bad));
    for (size_t i = 0; bad && i < rb->n; i++)
        bad[i] = -2;
    size_t verified = 0, lo = 0;
    struct timespec dl = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&s->rq_mu);
    while (!rb->done) {
        if (bad && s->cfg.integrity && verified < rb->naccepted) {
            /* a read accepted meanwhile: hash it while the later reads are in flight */
            while (lo < rb->n && bad[lo] != -2)
                lo++;
            size_t j = lo;
            while (j < rb->n && !(rb->accepted[j] && bad[j] == -2))
                j++;
            if (j < rb->n) {
                verified++;
                pthread_mutex_unlock(&s->rq_mu);
                bad[j] = ssd_block_verify(rb->out[j]);
                pthread_mutex_lock(&s->rq_mu);
                continue;
            }
        }
        if (pthread_cond_timedwait(&s->rdone_cv, &s->rq_mu, &dl) == ETIMEDOUT && !rb->done) {
            rb->abandoned = true;
            break;
        }
    }
    bool done = rb->done;
    pthread_mutex_unlock(&s->rq_mu);
    if (!done) {
        pf_log_ratelimited(PF_LOG_WARN, 5000,
                           "SSD prefetch of %llu block(s) did not finish in %llu ms: missed",
                           (unsigned long long)reserved, (unsigned long long)timeout_ms);
        free(bad);
        ssd_rbatch_put(rb);
        goto out;
    }
    for (size_t i = 0; i < rb->n && rb->out[i]; i++) {
        struct pf_block *b = rb->out[i];
        int slot = !s->cfg.integrity ? -1 : bad && bad[i] != -2 ? bad[i] : ssd_block_verify(b);
        if (slot >= 0) {
            pf_child_add(s->m.integrity, 1);
            log_integrity(s, b, slot, &rb->place[i]);
            struct pf_block_key key = pf_block_key(b);
            pthread_mutex_lock(&s->mu);
            ssd_index_remove(&s->idx, &key, &rb->place[i]);
            pthread_mutex_unlock(&s->mu);
            break;
        }
        out[got++] = b;
        bytes += rb->place[i].len;
        rb->out[i] = NULL;
    }
    free(bad);
    ssd_rbatch_put(rb); /* puts the blocks after a gap or a mismatch */
out:
    pthread_mutex_lock(&s->budget_mu);
    ssd_budget_release(&s->budget, reserved);
    pthread_mutex_unlock(&s->budget_mu);
    if (all_or_nothing && got < n) {
        for (size_t i = 0; i < got; i++)
            pf_block_put(out[i]);
        got = 0;
        bytes = 0;
    }
    pf_metric_add(s->m.p_success, (double)got);
    pf_metric_add(s->m.p_bytes, (double)bytes);
    pf_metric_add(s->m.p_fail, (double)(reserved - got));
    return got;
}

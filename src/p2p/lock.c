/* Transfer locks (reference §7.5): a session is a UUID v4 string naming a set of strong
 * block references held for a peer while it READs them, so locked blocks are neither evicted
 * nor freed even if they leave the RAM index. Sessions live in a chained hash table under
 * one mutex; expiry compares each session's creation time with the injected clock and is
 * driven by the caller (the p2p thread, every second). Block references are always dropped
 * after the mutex is released (the last put returns memory to the pool). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "pf/block.h"
#include "pf/htable.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/p2p.h"

struct lock_session {
    struct pf_hnode node;
    char id[PF_UUID_STR_LEN];
    uint64_t created_ns;
    size_t n;
    struct pf_block *blocks[];
};

struct pf_p2p_locks {
    pthread_mutex_t mu;
    struct pf_htable t;
    const struct pf_clock *clock;
    uint64_t timeout_ns;
    size_t nblocks;
    struct pf_metric *m_active, *m_timeouts;
};

static uint64_t id_hash(const char *id)
{
    return pf_hash64(id, strlen(id));
}

int pf_p2p_locks_create(const struct pf_clock *clock, uint64_t timeout_ns,
                        struct pf_p2p_locks **l_p)
{
    if (timeout_ns == 0)
        return -EINVAL;
    struct pf_p2p_locks *l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    int rc = pf_htable_init(&l->t, 64);
    if (rc) {
        free(l);
        return rc;
    }
    pthread_mutex_init(&l->mu, NULL);
    l->clock = clock;
    l->timeout_ns = timeout_ns;
    l->m_active = pf_metric_gauge("pegaflow_transfer_lock_active",
                                  "Blocks held by transfer-lock sessions for peers", NULL);
    l->m_timeouts = pf_metric_counter("pegaflow_transfer_lock_timeouts_total",
                                      "Transfer-lock sessions expired before their release", NULL);
    *l_p = l;
    return 0;
}

static void session_free(struct lock_session *s)
{
    for (size_t i = 0; i < s->n; i++)
        pf_block_put(s->blocks[i]);
    free(s);
}

/* Moves up to max sessions matching (all, or expired at now) out of the table. */
static size_t take_locked(struct pf_p2p_locks *l, bool all, uint64_t now, struct lock_session **out,
                          size_t max, size_t *blocks_p)
{
    size_t k = 0;
    for (size_t b = 0; l->t.buckets && b <= l->t.mask && k < max; b++) {
        struct pf_hnode *h = l->t.buckets[b];
        while (h && k < max) {
            struct pf_hnode *next = h->next;
            struct lock_session *s = pf_container_of(h, struct lock_session, node);
            /* now was read before the lock: a session created since is younger, not
             * 2^64 ns old */
            if (all || (now > s->created_ns && now - s->created_ns >= l->timeout_ns)) {
                pf_htable_remove(&l->t, h);
                l->nblocks -= s->n;
                *blocks_p += s->n;
                out[k++] = s;
            }
            h = next;
        }
    }
    return k;
}

static size_t drop_sessions(struct pf_p2p_locks *l, bool all)
{
    struct lock_session *batch[64];
    size_t total = 0, nblocks = 0, k;
    char first[PF_UUID_STR_LEN] = "";
    do {
        size_t blocks = 0;
        uint64_t now = pf_clock_now(l->clock);
        pthread_mutex_lock(&l->mu);
        k = take_locked(l, all, now, batch, PF_ARRAY_SIZE(batch), &blocks);
        pthread_mutex_unlock(&l->mu);
        if (k)
            pf_metric_add(l->m_active, -(double)blocks);
        nblocks += blocks;
        for (size_t i = 0; i < k; i++) {
            if (!first[0])
                memcpy(first, batch[i]->id, sizeof(first));
            pf_debug("transfer lock %s %s (%zu block(s))", batch[i]->id,
                     all ? "dropped" : "expired", batch[i]->n);
            session_free(batch[i]);
        }
        total += k;
    } while (k == PF_ARRAY_SIZE(batch));
    if (total && !all)
        pf_warn("%zu transfer lock(s) (%zu block(s), e.g. %s) expired after %llu s: the "
                "requester never released them",
                total, nblocks, first, (unsigned long long)(l->timeout_ns / PF_NS_PER_SEC));
    return total;
}

void pf_p2p_locks_destroy(struct pf_p2p_locks *l)
{
    if (!l)
        return;
    drop_sessions(l, true);
    pf_htable_destroy(&l->t);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

int pf_p2p_locks_acquire(struct pf_p2p_locks *l, struct pf_block *const *blocks, size_t n,
                         char id_p[PF_UUID_STR_LEN])
{
    struct lock_session *s = malloc(sizeof(*s) + n * sizeof(s->blocks[0]));
    if (!s)
        return -ENOMEM;
    uint8_t raw[16];
    int rc = pf_uuid_v4(raw);
    if (rc) {
        free(s);
        return rc;
    }
    pf_uuid_format(raw, s->id);
    s->n = n;
    if (n)
        memcpy(s->blocks, blocks, n * sizeof(s->blocks[0]));
    s->created_ns = pf_clock_now(l->clock);
    char id[PF_UUID_STR_LEN];
    memcpy(id, s->id, sizeof(id)); /* once inserted, s may expire and vanish at any time */
    pf_metric_add(l->m_active, (double)n);
    pthread_mutex_lock(&l->mu);
    pf_htable_insert(&l->t, &s->node, id_hash(s->id));
    l->nblocks += n;
    pthread_mutex_unlock(&l->mu);
    memcpy(id_p, id, PF_UUID_STR_LEN);
    return 0;
}

int pf_p2p_locks_release(struct pf_p2p_locks *l, const char *id, size_t *released_p)
{
    if (!id || strlen(id) >= PF_UUID_STR_LEN)
        return -ENOENT;
    uint64_t h = id_hash(id);
    struct lock_session *found = NULL;
    pthread_mutex_lock(&l->mu);
    struct pf_hnode *n;
    pf_htable_for_each_hash(&l->t, n, h)
    {
        struct lock_session *s = pf_container_of(n, struct lock_session, node);
        if (strcmp(s->id, id) == 0) {
            found = s;
            break;
        }
    }
    if (found) {
        pf_htable_remove(&l->t, &found->node);
        l->nblocks -= found->n;
    }
    pthread_mutex_unlock(&l->mu);
    if (!found)
        return -ENOENT;
    pf_metric_add(l->m_active, -(double)found->n);
    *released_p = found->n;
    session_free(found);
    return 0;
}

size_t pf_p2p_locks_expire(struct pf_p2p_locks *l)
{
    size_t k = drop_sessions(l, false);
    if (k)
        pf_metric_add(l->m_timeouts, (double)k);
    return k;
}

size_t pf_p2p_locks_release_all(struct pf_p2p_locks *l)
{
    return drop_sessions(l, true);
}

size_t pf_p2p_locks_sessions(struct pf_p2p_locks *l)
{
    pthread_mutex_lock(&l->mu);
    size_t n = l->t.count;
    pthread_mutex_unlock(&l->mu);
    return n;
}

size_t pf_p2p_locks_blocks(struct pf_p2p_locks *l)
{
    pthread_mutex_lock(&l->mu);
    size_t n = l->nblocks;
    pthread_mutex_unlock(&l->mu);
    return n;
}

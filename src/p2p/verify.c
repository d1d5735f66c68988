/* Checksum verification workers of the requester (docs/p2p.md "Verification"): fetched
 * blocks are verified off the thread that posts READs and polls completions, so one core no
 * longer caps a fetch and verification overlaps the READs still in flight.
 *
 * One FIFO per NUMA node the pool has regions on, each served by verify_threads workers
 * bound to that node (the staging memory a block landed in is node-local to them; pages
 * stay hot in that node's caches). A fetch submits one job per block whose last READ
 * landed; the job writes that block's verdict and then decrements the fetch's group
 * counter under the group's mutex, which orders the verdict before p2p_verify_wait's
 * return. A waiter does not only sleep: it runs queued jobs itself (any fetch's: a job's
 * memory lives until its group drained), so a wait lasts at most as long as the jobs
 * already running on workers, and a submit that finds the queues closed (shutdown) or
 * cannot queue runs the job inline. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/thread.h"

struct p2p_vq {
    int numa; /* -1: no NUMA preference */
    struct pf_queue q;
    bool q_init;
    pthread_t *thr;
    int nthr;
};

static void run_job(struct p2p_vjob *j)
{
    struct p2p_vgroup *g = j->g;
    j->fn(j->ctx, j->arg);
    pthread_mutex_lock(&g->mu);
    if (--g->pending == 0)
        pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void *verify_main(void *arg)
{
    struct p2p_vq *vq = arg;
    for (;;) {
        void *j;
        int rc = pf_queue_pop(&vq->q, &j, UINT64_MAX);
        if (rc == -ESHUTDOWN)
            return NULL;
        if (rc == 0)
            run_job(j);
    }
}

static int default_threads(size_t nq)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    long n = ncpu > 0 ? ncpu / (long)nq / 4 : 1;
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

int p2p_verify_start(struct pf_p2p *p)
{
    if (p->cfg.verify_threads < 0 || !p->cfg.integrity)
        return 0; /* inline on the fetching thread */
    int nodes[P2P_REGIONS_MAX];
    size_t nq = 0;
    for (size_t r = 0; r < p->nregions; r++) {
        int n = p->rnuma[r] < 0 ? -1 : p->rnuma[r];
        bool seen = false;
        for (size_t i = 0; i < nq && !seen; i++)
            seen = nodes[i] == n;
        if (!seen && nq < P2P_REGIONS_MAX)
            nodes[nq++] = n;
    }
    if (nq == 0)
        nodes[nq++] = -1;
    p->vq = calloc(nq, sizeof(*p->vq));
    if (!p->vq)
        return -ENOMEM;
    p->nvq = nq;
    int per = p->cfg.verify_threads ? p->cfg.verify_threads : default_threads(nq);
    for (size_t i = 0; i < nq; i++) {
        struct p2p_vq *vq = &p->vq[i];
        vq->numa = nodes[i];
        int rc = pf_queue_init(&vq->q, 0);
        if (rc)
            return rc;
        vq->q_init = true;
        vq->thr = calloc((size_t)per, sizeof(*vq->thr));
        if (!vq->thr)
            return -ENOMEM;
        for (int t = 0; t < per; t++) {
            rc = pf_thread_start(&vq->thr[t], "pf-p2p-verify", vq->numa, verify_main, vq);
            if (rc)
                return rc;
            vq->nthr++;
        }
    }
    pf_debug("P2P verification: %d worker(s) on each of %zu NUMA node(s)", per, nq);
    return 0;
}

void p2p_verify_stop(struct pf_p2p *p)
{
    for (size_t i = 0; i < p->nvq; i++) {
        struct p2p_vq *vq = &p->vq[i];
        if (!vq->q_init)
            continue;
        pf_queue_close(&vq->q);
        for (int t = 0; t < vq->nthr; t++)
            pthread_join(vq->thr[t], NULL);
        vq->nthr = 0;
    }
}

void p2p_verify_free(struct pf_p2p *p)
{
    p2p_verify_stop(p);
    for (size_t i = 0; i < p->nvq; i++) {
        if (p->vq[i].q_init)
            pf_queue_destroy(&p->vq[i].q);
        free(p->vq[i].thr);
    }
    free(p->vq);
    p->vq = NULL;
    p->nvq = 0;
}

bool p2p_verify_async(const struct pf_p2p *p)
{
    return p->nvq > 0;
}

int p2p_vgroup_init(struct p2p_vgroup *g)
{
    g->pending = 0;
    int rc = pf_cond_init(&g->cv);
    if (rc)
        return rc;
    pthread_mutex_init(&g->mu, NULL);
    return 0;
}

void p2p_vgroup_destroy(struct p2p_vgroup *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

void p2p_verify_submit(struct pf_p2p *p, int numa, struct p2p_vjob *j)
{
    struct p2p_vgroup *g = j->g;
    pthread_mutex_lock(&g->mu);
    g->pending++;
    pthread_mutex_unlock(&g->mu);
    struct p2p_vq *vq = NULL;
    for (size_t i = 0; i < p->nvq && !vq; i++)
        if (p->vq[i].numa == numa)
            vq = &p->vq[i];
    if (!vq && p->nvq)
        vq = &p->vq[(size_t)(numa < 0 ? 0 : numa) % p->nvq];
    if (!vq || pf_queue_push(&vq->q, j) != 0)
        run_job(j); /* no workers, closed at shutdown, or out of memory */
}

/* Runs one queued job of any fetch; false when every queue was empty. */
static bool help_one(struct pf_p2p *p)
{
    for (size_t i = 0; i < p->nvq; i++) {
        void *j;
        if (pf_queue_drain(&p->vq[i].q, &j, 1) == 1) {
            run_job(j);
            return true;
        }
    }
    return false;
}

void p2p_verify_wait(struct pf_p2p *p, struct p2p_vgroup *g)
{
    pthread_mutex_lock(&g->mu);
    while (g->pending) {
        pthread_mutex_unlock(&g->mu);
        bool ran = help_one(p);
        pthread_mutex_lock(&g->mu);
        if (!ran && g->pending) {
            /* only jobs running on workers are left: CPU work over memory this fetch still
             * holds, finishing without any external event; the timed wait re-checks the
             * queues (a job queued after our scan) */
            struct timespec dl = pf_deadline_ms(10);
            pthread_cond_timedwait(&g->cv, &g->mu, &dl);
        }
    }
    pthread_mutex_unlock(&g->mu);
}

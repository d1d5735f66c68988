/* TCP fabric, requesting side (design: tcpnet_internal.h): RC queue pairs, their
 * connection and receive thread, post_read, completions, invalidation. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#define PF_LOG_MOD "tcpnet"
#include "pf/clock.h"
#include "pf/hal.h"
#include "pf/htable.h"
#include "pf/log.h"
#include "pf/thread.h"
#include "pf/util.h"

#include "tcpnet_internal.h"

/* ---------------------------------------------------------------- QPs */

int pf_tcpnet_qp_create(struct pf_net *n, int nicidx, struct pf_net_qp **qp_p)
{
    struct tcpnet *t = tcpnet_of(n);
    if (nicidx < 0 || nicidx >= t->nnics)
        return -EINVAL;
    struct tcpnic *nic = &t->nics[nicidx];
    struct tcpqp *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    int rc = pf_random_bytes(&q->token, sizeof(q->token));
    if (rc)
        goto err_free;
    rc = pf_cond_init(&q->cv);
    if (rc)
        goto err_free;
    pthread_mutex_init(&q->mu, NULL);
    pthread_mutex_init(&q->tx_mu, NULL);
    pthread_mutex_init(&q->life_mu, NULL);
    q->base.net = n;
    q->base.nic = nicidx;
    q->nic = nic;
    q->fd = -1;
    atomic_init(&q->state, TQ_INIT);
    pthread_mutex_lock(&nic->qp_mu);
    q->next = nic->qps;
    nic->qps = q;
    pthread_mutex_unlock(&nic->qp_mu);
    *qp_p = &q->base;
    return 0;

err_free:
    free(q);
    return rc;
}

int pf_tcpnet_qp_local_endpoint(struct pf_net_qp *qpb, void *buf, size_t cap, size_t *len_p)
{
    struct tcpqp *q = tcpnet_qp(qpb);
    if (!buf || cap < TCPNET_EP_LEN)
        return -ENOSPC;
    struct tcpnet_ep ep = {.port = q->nic->port, .token = q->token};
    memcpy(ep.ip, &q->nic->ip, 4);
    tcpnet_ep_encode(buf, &ep);
    *len_p = TCPNET_EP_LEN;
    return 0;
}

/* Completes the oldest outstanding WR. Caller holds q->mu. */
static void tcpnet_complete_head(struct tcpqp *q, int status)
{
    struct tcpwr *w = &q->wr[q->wr_head];
    for (uint32_t k = 0; k < w->nsge; k++)
        atomic_fetch_sub(&w->mr[k]->inflight, 1);
    q->cq[(q->cq_head + q->cq_count) % TCPNET_SQ_DEPTH] =
        (struct pf_net_cqe){.wr_id = w->wr_id,
                            .status = status,
                            .bytes = status ? 0 : w->len,
                            .digested = status == 0 && w->dig.n > 0};
    q->cq_count++;
    q->wr_head = (q->wr_head + 1) % TCPNET_SQ_DEPTH;
    q->wr_count--;
}

/* Error state: the first outstanding WR gets err (when given), the others -ECANCELED.
 * Caller holds q->mu and guarantees no thread writes into their SGEs any more. */
static void tcpnet_flush(struct tcpqp *q, int err)
{
    if (q->wr_count && err)
        tcpnet_complete_head(q, err);
    while (q->wr_count)
        tcpnet_complete_head(q, -ECANCELED);
    pthread_cond_broadcast(&q->cv);
}

/* Receives exactly the WR's bytes into its SGE list. 0, -ECANCELED (QP entered the error
 * state), -ECONNRESET or -errno. */
static int tcpnet_recv_sge(struct tcpqp *q, int fd, struct iovec *iov, int niov)
{
    while (niov > 0) {
        if (atomic_load(&q->state) == TQ_ERR)
            return -ECANCELED;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = recvmsg(fd, &msg, MSG_WAITALL);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        size_t left = (size_t)n;
        while (niov > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            niov--;
        }
        if (niov > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* Receive-path digests (struct pf_net_digest): each range is received in pieces of at
 * most RX_DIGEST_PIECE bytes and every piece hashed right after it landed, while it is in
 * this core's cache (a later pass over the staging memory reads it back from DRAM). */
#define RX_DIGEST_PIECE (256u << 10)

/* Receives the next len bytes of the WR into (*iov_p, *niov_p) (advanced past them), hashing
 * them into st when st is not NULL. */
static int tcpnet_recv_part(struct tcpqp *q, int fd, struct iovec **iov_p, int *niov_p,
                            uint64_t len, XXH3_state_t *st)
{
    while (len > 0) {
        struct iovec sub[TCPNET_MAX_SGE], keep[TCPNET_MAX_SGE];
        int ns = 0;
        uint64_t want = len < RX_DIGEST_PIECE ? len : RX_DIGEST_PIECE, got = 0;
        struct iovec *iov = *iov_p;
        int niov = *niov_p;
        while (got < want && niov > 0) {
            uint64_t take = iov->iov_len < want - got ? iov->iov_len : want - got;
            sub[ns] = keep[ns] = (struct iovec){iov->iov_base, take};
            ns++;
            got += take;
            if (take == iov->iov_len) {
                iov++;
                niov--;
            } else {
                iov->iov_base = (uint8_t *)iov->iov_base + take;
                iov->iov_len -= take;
            }
        }
        if (got < want)
            return -EPROTO; /* ranges past the SGEs: refused at post */
        int rc = tcpnet_recv_sge(q, fd, sub, ns);
        if (rc)
            return rc;
        if (st)
            for (int k = 0; k < ns; k++)
                XXH3_64bits_update_dispatch(st, keep[k].iov_base, keep[k].iov_len);
        *iov_p = iov;
        *niov_p = niov;
        len -= want;
    }
    return 0;
}

/* Receives the WR's bytes, range by range of its digest request, into out[]. */
static int tcpnet_recv_digest(struct tcpqp *q, int fd, struct iovec *iov, int niov, uint64_t total,
                              const struct pf_net_digest *d)
{
    XXH3_state_t st;
    uint64_t done = 0;
    for (uint32_t r = 0; r < d->n; r++) {
        bool skip = (d->lens[r] & PF_NET_DIGEST_SKIP) != 0;
        uint64_t len = d->lens[r] & ~PF_NET_DIGEST_SKIP;
        if (!skip)
            XXH3_64bits_reset(&st);
        int rc = tcpnet_recv_part(q, fd, &iov, &niov, len, skip ? NULL : &st);
        if (rc)
            return rc;
        if (!skip)
            d->out[r] = XXH3_64bits_digest(&st);
        done += len;
    }
    return tcpnet_recv_part(q, fd, &iov, &niov, total - done, NULL);
}

static int tcpnet_status_errno(uint32_t st)
{
    switch (st) {
    case TCPNET_ST_RKEY:
    case TCPNET_ST_ACCESS:
    case TCPNET_ST_BOUNDS:
        return -EREMOTEIO;
    default:
        return -EPROTO;
    }
}

static void *tcpnet_rx_main(void *arg)
{
    struct tcpqp *q = arg;
    int fd = q->fd; /* stable until this thread is joined */
    int err = 0;
    for (;;) {
        uint8_t h[TCPNET_RESP_LEN];
        err = pf_tcpnet_recv_full(fd, h, sizeof(h));
        if (err)
            break;
        uint32_t st = tcpnet_get32(h + 4);
        uint64_t seq = tcpnet_get64(h + 8), len = tcpnet_get64(h + 16);
        struct iovec iov[TCPNET_MAX_SGE];
        uint32_t nsge = 0;
        pthread_mutex_lock(&q->mu);
        if (atomic_load(&q->state) == TQ_ERR) {
            pthread_mutex_unlock(&q->mu);
            err = -ECANCELED;
            break;
        }
        const struct tcpwr *w = q->wr_count ? &q->wr[q->wr_head] : NULL;
        if (tcpnet_get32(h) != TCPNET_RESP_MAGIC || !w || w->seq != seq ||
            (st == TCPNET_ST_OK && len != w->len) || (st != TCPNET_ST_OK && len != 0)) {
            pthread_mutex_unlock(&q->mu);
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "NIC %s: corrupt response stream (seq %llu len %llu status %u)",
                               q->nic->name, (unsigned long long)seq, (unsigned long long)len, st);
            err = -EPROTO;
            break;
        }
        if (st != TCPNET_ST_OK) {
            pthread_mutex_unlock(&q->mu);
            pf_log_ratelimited(PF_LOG_DEBUG, 1000, "NIC %s: READ refused by peer (status %u)",
                               q->nic->name, st);
            err = tcpnet_status_errno(st);
            break;
        }
        nsge = w->nsge;
        memcpy(iov, w->iov, nsge * sizeof(iov[0]));
        struct pf_net_digest dig = w->dig;
        uint64_t wlen = w->len;
        pthread_mutex_unlock(&q->mu);

        err = dig.n ? tcpnet_recv_digest(q, fd, iov, (int)nsge, wlen, &dig)
                    : tcpnet_recv_sge(q, fd, iov, (int)nsge);
        if (err)
            break;
        pthread_mutex_lock(&q->mu);
        if (atomic_load(&q->state) == TQ_ERR) {
            pthread_mutex_unlock(&q->mu);
            err = -ECANCELED;
            break;
        }
        tcpnet_complete_head(q, 0);
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
    }
    /* No more writes into SGE memory from here on: publish the errors. */
    pthread_mutex_lock(&q->mu);
    bool first = atomic_load(&q->state) != TQ_ERR;
    atomic_store(&q->state, TQ_ERR);
    if (first && err != -ECANCELED)
        pf_log_ratelimited(PF_LOG_DEBUG, 1000, "NIC %s: QP %016llx enters error state: %s",
                           q->nic->name, (unsigned long long)q->token, strerror(-err));
    tcpnet_flush(q, first ? err : 0);
    pthread_mutex_unlock(&q->mu);
    shutdown(fd, SHUT_RDWR);
    return NULL;
}

int pf_tcpnet_qp_connect(struct pf_net_qp *qpb, const void *remote_ep, size_t len)
{
    struct tcpqp *q = tcpnet_qp(qpb);
    struct tcpnic *nic = q->nic;
    struct tcpnet *t = nic->net;
    struct tcpnet_ep ep;
    if (tcpnet_ep_decode(remote_ep, len, &ep)) {
        pf_warn("NIC %s: qp_connect: malformed endpoint (%zu bytes)", nic->name, len);
        return -EINVAL;
    }
    pthread_mutex_lock(&q->mu);
    if (atomic_load(&q->state) != TQ_INIT || q->connecting) {
        int rc = atomic_load(&q->state) == TQ_ERR ? -ENOTCONN : -EISCONN;
        pthread_mutex_unlock(&q->mu);
        return rc;
    }
    q->connecting = true;
    q->peer_token = ep.token;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? -errno : 0;
    q->fd = fd; /* visible to qp_invalidate, which may shut it down to abort the connect */
    pthread_mutex_unlock(&q->mu);
    if (rc)
        goto err_state;

    pf_tcpnet_sockopts(t, fd);
    struct sockaddr_in local = {.sin_family = AF_INET, .sin_addr = nic->ip};
    if (bind(fd, (struct sockaddr *)&local, sizeof(local)) < 0) {
        rc = -errno;
        pf_warn("NIC %s: bind %s: %s", nic->name, nic->addrstr, strerror(-rc));
        goto err_close;
    }
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(ep.port)};
    memcpy(&peer.sin_addr, ep.ip, 4);
    char pstr[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, ep.ip, pstr, sizeof(pstr));
    uint64_t deadline = pf_now_ns() + t->connect_ms * PF_NS_PER_MS;
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&peer, sizeof(peer)) < 0) {
        if (errno != EINPROGRESS) {
            rc = -errno;
            goto err_log;
        }
        rc = pf_tcpnet_wait_fd(fd, POLLOUT, deadline);
        if (rc)
            goto err_log;
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            rc = -soerr;
            goto err_log;
        }
    }
    fcntl(fd, F_SETFL, fl);
    if (t->tls) {
        /* the relay owns the TCP socket from here; the QP talks plaintext to the relay */
        int app = -1;
        rc = pf_tcpnet_tls_client(t->tls, fd, pstr, deadline, &app);
        pthread_mutex_lock(&q->mu);
        q->fd = rc ? -1 : app;
        pthread_mutex_unlock(&q->mu);
        if (rc)
            goto err_state;
        fd = app;
    }
    uint8_t hello[TCPNET_HELLO_LEN];
    tcpnet_put32(hello, TCPNET_HELLO_MAGIC);
    tcpnet_put32(hello + 4, TCPNET_VERSION);
    tcpnet_put64(hello + 8, ep.token);
    tcpnet_put64(hello + 16, q->token);
    rc = pf_tcpnet_send_full(fd, hello, sizeof(hello));
    if (rc)
        goto err_log;
    uint8_t ack[TCPNET_ACK_LEN];
    rc = pf_tcpnet_wait_fd(fd, POLLIN, deadline);
    if (rc == 0)
        rc = pf_tcpnet_recv_full(fd, ack, sizeof(ack));
    if (rc)
        goto err_log;
    if (tcpnet_get32(ack) != TCPNET_ACK_MAGIC) {
        rc = -EPROTO;
        goto err_log;
    }
    if (tcpnet_get32(ack + 4) != TCPNET_ST_OK) {
        pf_warn("NIC %s: peer %s:%u refused QP %016llx (status %u)", nic->name, pstr, ep.port,
                (unsigned long long)ep.token, tcpnet_get32(ack + 4));
        rc = -ECONNREFUSED;
        goto err_close;
    }

    pthread_mutex_lock(&q->mu);
    if (atomic_load(&q->state) == TQ_ERR) { /* invalidated while connecting */
        pthread_mutex_unlock(&q->mu);
        rc = -ENOTCONN;
        goto err_close;
    }
    rc = pf_thread_start(&q->rx, "pf-tcpnet-rx", nic->numa, tcpnet_rx_main, q);
    if (rc) {
        pthread_mutex_unlock(&q->mu);
        pf_error("NIC %s: cannot start receive thread: %s", nic->name, strerror(-rc));
        goto err_close;
    }
    q->rx_running = true;
    q->connecting = false;
    atomic_store(&q->state, TQ_RTS);
    pthread_mutex_unlock(&q->mu);
    pf_debug("NIC %s: QP %016llx connected to %s:%u QP %016llx", nic->name,
             (unsigned long long)q->token, pstr, ep.port, (unsigned long long)ep.token);
    return 0;

err_log:
    pf_warn("NIC %s: connect to %s:%u: %s", nic->name, pstr, ep.port, strerror(-rc));
err_close:
    pthread_mutex_lock(&q->mu);
    q->fd = -1;
    close(fd);
    pthread_mutex_unlock(&q->mu);
err_state:
    pthread_mutex_lock(&q->mu);
    q->connecting = false;
    q->peer_token = 0;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static int post_read(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                     uint64_t raddr, uint32_t rkey, uint64_t wr_id, const struct pf_net_digest *d)
{
    struct tcpqp *q = tcpnet_qp(qpb);
    struct tcpnic *nic = q->nic;
    if (!sge || nsge == 0 || nsge > TCPNET_MAX_SGE)
        return -EINVAL;
    uint64_t total = 0;
    for (size_t i = 0; i < nsge; i++)
        if (!sge[i].addr || sge[i].len == 0 || !pf_add_ok(total, sge[i].len, &total))
            return -EINVAL;
    if (total > TCPNET_MAX_READ)
        return -EINVAL;
    if (d) { /* ranges of at least a byte, together within the READ */
        uint64_t sum = 0;
        if (d->n == 0 || !d->lens || !d->out)
            return -EINVAL;
        for (uint32_t r = 0; r < d->n; r++) {
            uint64_t l = d->lens[r] & ~PF_NET_DIGEST_SKIP;
            if (l == 0 || (sum += l) > total)
                return -EINVAL;
        }
    }

    int rc = 0;
    pthread_mutex_lock(&q->tx_mu);
    pthread_mutex_lock(&q->mu);
    if (atomic_load(&q->state) != TQ_RTS) {
        rc = -ENOTCONN;
        goto out_unlock;
    }
    if (q->wr_count + q->cq_count >= TCPNET_SQ_DEPTH) {
        rc = -EAGAIN;
        goto out_unlock;
    }
    struct tcpwr *w = &q->wr[(q->wr_head + q->wr_count) % TCPNET_SQ_DEPTH];
    pthread_rwlock_rdlock(&nic->mr_lock);
    for (size_t i = 0; i < nsge; i++) {
        struct tcpmr *m = pf_tcpnet_mr_by_lkey(nic, sge[i].lkey);
        uint64_t a = (uint64_t)(uintptr_t)sge[i].addr, end;
        uint64_t b = m ? (uint64_t)(uintptr_t)m->base.addr : 0;
        if (!m || !(m->access & PF_NET_ACCESS_LOCAL_WRITE) || a < b ||
            !pf_add_ok(a, sge[i].len, &end) || end > b + m->base.len) {
            for (size_t k = 0; k < i; k++)
                atomic_fetch_sub(&w->mr[k]->inflight, 1);
            pthread_rwlock_unlock(&nic->mr_lock);
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "NIC %s: post_read: SGE %zu (%p+%llu lkey 0x%08x) is not inside "
                               "a locally writable region",
                               nic->name, i, sge[i].addr, (unsigned long long)sge[i].len,
                               sge[i].lkey);
            rc = -EINVAL;
            goto out_unlock;
        }
        atomic_fetch_add(&m->inflight, 1);
        w->mr[i] = m;
        w->iov[i] = (struct iovec){sge[i].addr, sge[i].len};
    }
    pthread_rwlock_unlock(&nic->mr_lock);
    w->nsge = (uint32_t)nsge;
    w->dig = d ? *d : (struct pf_net_digest){0};
    w->wr_id = wr_id;
    w->len = total;
    w->seq = q->next_seq++;
    q->wr_count++;
    int fd = q->fd;
    uint8_t req[TCPNET_READ_LEN];
    tcpnet_put32(req, TCPNET_READ_MAGIC);
    tcpnet_put32(req + 4, rkey);
    tcpnet_put64(req + 8, w->seq);
    tcpnet_put64(req + 16, raddr);
    tcpnet_put64(req + 24, total);
    pthread_mutex_unlock(&q->mu);

    /* The WR is queued: from here on any failure is reported by its completion. */
    int src = pf_tcpnet_send_full(fd, req, sizeof(req));
    if (src) {
        pf_log_ratelimited(PF_LOG_DEBUG, 1000, "NIC %s: sending READ request: %s", nic->name,
                           strerror(-src));
        shutdown(fd, SHUT_RDWR); /* the receive thread sees it, fails and flushes */
    }
    pthread_mutex_unlock(&q->tx_mu);
    return 0;

out_unlock:
    pthread_mutex_unlock(&q->mu);
    pthread_mutex_unlock(&q->tx_mu);
    return rc;
}

int pf_tcpnet_post_read(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                        uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    return post_read(qpb, sge, nsge, raddr, rkey, wr_id, NULL);
}

int pf_tcpnet_post_read_digest(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                               uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                               const struct pf_net_digest *d)
{
    return post_read(qpb, sge, nsge, raddr, rkey, wr_id, d);
}

int pf_tcpnet_poll(struct pf_net_qp *qpb, struct pf_net_cqe *out, size_t max, uint64_t timeout_ms)
{
    struct tcpqp *q = tcpnet_qp(qpb);
    if (max == 0)
        return 0;
    if (!out)
        return -EINVAL;
    uint64_t deadline = timeout_ms > UINT64_MAX / PF_NS_PER_MS / 2
                            ? UINT64_MAX / 2
                            : pf_now_ns() + timeout_ms * PF_NS_PER_MS;
    struct timespec ts = pf_ns_to_timespec(deadline);
    pthread_mutex_lock(&q->mu);
    while (q->cq_count == 0) {
        if (atomic_load(&q->state) == TQ_ERR && q->wr_count == 0) {
            pthread_mutex_unlock(&q->mu);
            return -ENOTCONN;
        }
        if (timeout_ms == 0 || pf_now_ns() >= deadline) {
            pthread_mutex_unlock(&q->mu);
            return 0;
        }
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    }
    size_t n = 0;
    while (n < max && q->cq_count) {
        out[n++] = q->cq[q->cq_head];
        q->cq_head = (q->cq_head + 1) % TCPNET_SQ_DEPTH;
        q->cq_count--;
    }
    pthread_mutex_unlock(&q->mu);
    return (int)n;
}

void pf_tcpnet_qp_invalidate(struct pf_net_qp *qpb)
{
    struct tcpqp *q = tcpnet_qp(qpb);
    pthread_mutex_lock(&q->life_mu);
    pthread_mutex_lock(&q->mu);
    atomic_store(&q->state, TQ_ERR);
    if (q->fd >= 0)
        shutdown(q->fd, SHUT_RDWR); /* wakes the receive thread (and an ongoing connect) */
    bool join = q->rx_running;
    q->rx_running = false;
    pthread_mutex_unlock(&q->mu);
    if (join)
        pthread_join(q->rx, NULL); /* the only writer of SGE memory is gone */
    pf_tcpnet_kill_served(q->nic, q->token);
    pthread_mutex_lock(&q->tx_mu);
    pthread_mutex_lock(&q->mu);
    if (join && q->fd >= 0) { /* a connecting qp_connect closes its own socket */
        close(q->fd);
        q->fd = -1;
    }
    tcpnet_flush(q, 0);
    pthread_mutex_unlock(&q->mu);
    pthread_mutex_unlock(&q->tx_mu);
    pthread_mutex_unlock(&q->life_mu);
}

void pf_tcpnet_qp_free(struct tcpqp *q)
{
    pf_tcpnet_qp_invalidate(&q->base);
    pthread_mutex_lock(&q->mu);
    while (q->connecting) { /* a qp_connect still unwinding on another thread */
        pthread_mutex_unlock(&q->mu);
        pf_sleep_ms(1);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    pthread_mutex_destroy(&q->tx_mu);
    pthread_mutex_destroy(&q->life_mu);
    free(q);
}

void pf_tcpnet_qp_destroy(struct pf_net_qp *qpb)
{
    if (!qpb)
        return;
    struct tcpqp *q = tcpnet_qp(qpb);
    struct tcpnic *nic = q->nic;
    pthread_mutex_lock(&nic->qp_mu);
    for (struct tcpqp **pp = &nic->qps; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    pthread_mutex_unlock(&nic->qp_mu);
    pf_tcpnet_qp_free(q);
}

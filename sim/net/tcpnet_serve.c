/* TCP fabric, serving side (design: tcpnet_internal.h): accepted connections, HELLO,
 * READ requests answered from registered memory by the NIC's serving threads. */
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

#define PF_LOG_MOD "tcpnet"
#include "pf/clock.h"
#include "pf/hal.h"
#include "pf/htable.h"
#include "pf/log.h"
#include "pf/thread.h"
#include "pf/util.h"

#include "tcpnet_internal.h"

/* ---------------------------------------------------------------- serving side */

void pf_tcpnet_sconn_close(struct sconn *c)
{
    struct tcpnic *nic = c->nic;
    pthread_mutex_lock(&nic->conn_mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        nic->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    epoll_ctl(nic->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    pthread_mutex_unlock(&nic->conn_mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Serving side of HELLO: find the paired QP on this NIC. */
static uint32_t tcpnet_hello_check(struct tcpnic *nic, uint64_t target, uint64_t src)
{
    uint32_t st = TCPNET_ST_NOQP;
    pthread_mutex_lock(&nic->qp_mu);
    for (struct tcpqp *q = nic->qps; q; q = q->next) {
        if (q->token != target)
            continue;
        pthread_mutex_lock(&q->mu);
        if (atomic_load(&q->state) == TQ_ERR || (q->peer_token && q->peer_token != src))
            st = TCPNET_ST_QPSTATE;
        else
            st = TCPNET_ST_OK;
        pthread_mutex_unlock(&q->mu);
        break;
    }
    pthread_mutex_unlock(&nic->qp_mu);
    return st;
}

/* Parses buffered input. 0 or -EPROTO. */
static int tcpnet_sconn_parse(struct sconn *c)
{
    size_t pos = 0;
    if (!c->hello_done) {
        if (c->in_len < TCPNET_HELLO_LEN)
            return 0;
        const uint8_t *p = c->in;
        if (tcpnet_get32(p) != TCPNET_HELLO_MAGIC)
            return -EPROTO;
        /* Record the pairing before checking the QP: a concurrent qp_invalidate either
         * makes the check fail or finds this connection in pf_tcpnet_kill_served. */
        pthread_mutex_lock(&c->nic->conn_mu);
        c->token = tcpnet_get64(p + 8);
        c->hello_done = true;
        pthread_mutex_unlock(&c->nic->conn_mu);
        uint32_t st;
        if (tcpnet_get32(p + 4) != TCPNET_VERSION)
            st = TCPNET_ST_VERSION;
        else
            st = tcpnet_hello_check(c->nic, c->token, tcpnet_get64(p + 16));
        tcpnet_put32(c->ack, TCPNET_ACK_MAGIC);
        tcpnet_put32(c->ack + 4, st);
        c->ack_len = TCPNET_ACK_LEN;
        c->ack_off = 0;
        c->ack_fatal = st != TCPNET_ST_OK;
        pos = TCPNET_HELLO_LEN;
        if (st != TCPNET_ST_OK)
            pf_debug("NIC %s: refused connection to QP %016llx (status %u)", c->nic->name,
                     (unsigned long long)c->token, st);
    }
    while (!c->ack_fatal && c->in_len - pos >= TCPNET_READ_LEN && c->q_count < TCPNET_SREQ_CAP) {
        const uint8_t *p = c->in + pos;
        if (tcpnet_get32(p) != TCPNET_READ_MAGIC)
            return -EPROTO;
        struct sreq *r = &c->q[(c->q_head + c->q_count) % TCPNET_SREQ_CAP];
        r->rkey = tcpnet_get32(p + 4);
        r->seq = tcpnet_get64(p + 8);
        r->raddr = tcpnet_get64(p + 16);
        r->len = tcpnet_get64(p + 24);
        c->q_count++;
        pos += TCPNET_READ_LEN;
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    return 0;
}

/* Reads what the socket has. 0 (would block or input full), -ECONNRESET or -errno. */
static int tcpnet_sconn_read(struct sconn *c)
{
    for (;;) {
        int rc = tcpnet_sconn_parse(c);
        if (rc)
            return rc;
        if (c->in_len == sizeof(c->in) || c->ack_fatal)
            return 0;
        ssize_t n = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, MSG_DONTWAIT);
        if (n > 0) {
            c->in_len += (size_t)n;
            continue;
        }
        if (n == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -errno;
    }
}

/* Starts the response to the oldest queued request: checks rkey, access and bounds. */
static void tcpnet_sconn_prepare(struct sconn *c)
{
    struct tcpnic *nic = c->nic;
    struct sreq r = c->q[c->q_head];
    c->q_head = (c->q_head + 1) % TCPNET_SREQ_CAP;
    c->q_count--;
    uint32_t st = TCPNET_ST_OK;
    uint64_t end;
    pthread_rwlock_rdlock(&nic->mr_lock);
    struct tcpmr *m = pf_tcpnet_mr_by_rkey(nic, r.rkey);
    if (!m)
        st = TCPNET_ST_RKEY;
    else if (!(m->access & PF_NET_ACCESS_REMOTE_READ))
        st = TCPNET_ST_ACCESS;
    else if (r.len == 0 || r.len > TCPNET_MAX_READ || !pf_add_ok(r.raddr, r.len, &end) ||
             r.raddr < (uint64_t)(uintptr_t)m->base.addr ||
             end > (uint64_t)(uintptr_t)m->base.addr + m->base.len)
        st = TCPNET_ST_BOUNDS;
    if (st == TCPNET_ST_OK) {
        c->mr_uid = m->uid;
        c->data = (uint8_t *)(uintptr_t)r.raddr;
        c->len = r.len;
    } else {
        c->mr_uid = 0;
        c->data = NULL;
        c->len = 0;
    }
    pthread_rwlock_unlock(&nic->mr_lock);
    if (st != TCPNET_ST_OK)
        pf_log_ratelimited(PF_LOG_DEBUG, 1000,
                           "NIC %s: refused READ rkey 0x%08x %llx+%llu (status %u)", nic->name,
                           r.rkey, (unsigned long long)r.raddr, (unsigned long long)r.len, st);
    c->rkey = r.rkey;
    c->data_off = 0;
    c->hdr_off = 0;
    tcpnet_put32(c->hdr, TCPNET_RESP_MAGIC);
    tcpnet_put32(c->hdr + 4, st);
    tcpnet_put64(c->hdr + 8, r.seq);
    tcpnet_put64(c->hdr + 16, c->len);
    c->cur = true;
}

/* Waits for c's full socket to take more, at most *wait_ns (decremented by the time spent),
 * as a blocking send would: a wake-up through the shared epoll set costs the stream more
 * (bench/README.md "Serving threads: waiting in place"). true: writable (or an error a send will
 * report), false: the time is spent. */
static bool tcpnet_sconn_wait_out(struct sconn *c, uint64_t *wait_ns)
{
    while (*wait_ns > 0) {
        uint64_t t0 = pf_now_ns();
        struct timespec ts = {.tv_sec = (time_t)(*wait_ns / 1000000000u),
                              .tv_nsec = (long)(*wait_ns % 1000000000u)};
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
        int n = ppoll(&pfd, 1, &ts, NULL);
        uint64_t spent = pf_now_ns() - t0;
        *wait_ns = spent >= *wait_ns ? 0 : *wait_ns - spent;
        if (n > 0)
            return true;
        if (n < 0 && errno != EINTR)
            return false;
    }
    return false;
}

/* Sends as much of the current response as the socket takes, waiting in place up to
 * *wait_ns in total when it is full. 1: would block, 0: response done, -errno: connection
 * must close. *sent_p accumulates payload bytes sent. */
static int tcpnet_sconn_send_cur(struct sconn *c, uint64_t *sent_p, uint64_t *wait_ns)
{
    struct tcpnic *nic = c->nic;
    for (;;) {
        struct iovec iov[2];
        int niov = 0;
        void *sync = NULL; /* TSan: the region's published contents (see pf_hb_acquire) */
        if (c->hdr_off < TCPNET_RESP_LEN)
            iov[niov++] = (struct iovec){c->hdr + c->hdr_off, TCPNET_RESP_LEN - c->hdr_off};
        pthread_rwlock_rdlock(&nic->mr_lock);
        if (c->data_off < c->len) {
            struct tcpmr *m = pf_tcpnet_mr_by_rkey(nic, c->rkey);
            if (!m || m->uid != c->mr_uid) {
                pthread_rwlock_unlock(&nic->mr_lock);
                if (c->hdr_off == 0) { /* nothing promised yet: answer with an error */
                    c->len = 0;
                    tcpnet_put32(c->hdr + 4, TCPNET_ST_RKEY);
                    tcpnet_put64(c->hdr + 16, 0);
                    continue;
                }
                pf_debug("NIC %s: region deregistered mid-response: dropping connection",
                         nic->name);
                return -ESTALE;
            }
            size_t chunk = c->len - c->data_off > SSIZE_MAX ? SSIZE_MAX : c->len - c->data_off;
            iov[niov++] = (struct iovec){c->data + c->data_off, chunk};
            /* like a NIC's DMA, this read is ordered with the owner's writes by the protocol
             * (handle published, request received from the peer), which TSan cannot see
             * across processes: the application releases the region after publishing
             * handles to it and acquires it before reusing memory a peer may have read */
            sync = m->base.addr;
            pf_hb_acquire(sync);
        }
        if (niov == 0) {
            pthread_rwlock_unlock(&nic->mr_lock);
            c->cur = false;
            return 0;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        int e = errno;
        if (sync)
            pf_hb_release(sync);
        pthread_rwlock_unlock(&nic->mr_lock);
        if (n < 0) {
            if (e == EINTR)
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK) {
                if (tcpnet_sconn_wait_out(c, wait_ns))
                    continue;
                return 1;
            }
            return -e;
        }
        size_t h = TCPNET_RESP_LEN - c->hdr_off;
        if ((size_t)n < h) {
            c->hdr_off += (size_t)n;
            continue;
        }
        c->hdr_off = TCPNET_RESP_LEN;
        c->data_off += (size_t)n - h;
        *sent_p += (size_t)n - h;
        if (c->data_off == c->len) {
            c->cur = false;
            return 0;
        }
    }
}

/* 1: would block (want EPOLLOUT), 0: idle, 2: budget spent, -errno: close. */
static int tcpnet_sconn_write(struct sconn *c, uint64_t *budget, uint64_t *wait_ns)
{
    while (c->ack_off < c->ack_len) {
        ssize_t n =
            send(c->fd, c->ack + c->ack_off, c->ack_len - c->ack_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 1;
            return -errno;
        }
        c->ack_off += (size_t)n;
    }
    if (c->ack_fatal)
        return -ECONNREFUSED;
    for (;;) {
        if (!c->cur) {
            if (c->q_count == 0)
                return 0;
            tcpnet_sconn_prepare(c);
        }
        uint64_t sent = 0;
        int rc = tcpnet_sconn_send_cur(c, &sent, wait_ns);
        *budget = sent >= *budget ? 0 : *budget - sent;
        if (rc)
            return rc;
        if (*budget == 0)
            return 2;
    }
}

static void tcpnet_sconn_serve(struct sconn *c, uint32_t events)
{
    pthread_mutex_lock(&c->mu);
    if (events & EPOLLERR)
        goto err_close;
    uint64_t budget = TCPNET_SERVE_BUDGET, wait_ns = c->nic->net->send_wait_ns;
    bool want_out = false;
    for (;;) {
        int rc = tcpnet_sconn_read(c);
        if (rc)
            goto err_close;
        rc = tcpnet_sconn_write(c, &budget, &wait_ns);
        if (rc < 0)
            goto err_close;
        if (rc > 0) {
            want_out = true;
            break;
        }
        /* idle: stop unless the input buffer was full (more requests may be waiting) */
        if (c->in_len < sizeof(c->in) && c->q_count == 0)
            break;
    }
    struct epoll_event ev = {.events = EPOLLONESHOT | EPOLLRDHUP, .data.ptr = c};
    if (c->q_count < TCPNET_SREQ_CAP && c->in_len < sizeof(c->in))
        ev.events |= EPOLLIN;
    if (want_out)
        ev.events |= EPOLLOUT;
    if (epoll_ctl(c->nic->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
err_close:
    pthread_mutex_unlock(&c->mu);
    pf_tcpnet_sconn_close(c);
}

static void tcpnet_accept_all(struct tcpnic *nic)
{
    for (;;) {
        int fd = accept4(nic->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                pf_log_ratelimited(PF_LOG_WARN, 5000, "NIC %s: accept: %s", nic->name,
                                   strerror(errno));
            return;
        }
        struct sconn *c = calloc(1, sizeof(*c));
        if (!c) {
            pf_log_ratelimited(PF_LOG_WARN, 5000, "NIC %s: out of memory accepting", nic->name);
            close(fd);
            continue;
        }
        pf_tcpnet_sockopts(nic->net, fd);
        if (nic->net->tls) {
            /* the relay owns the TCP socket and does the handshake; a peer that fails it is
             * refused there and this end reads end-of-file */
            int app = -1;
            if (pf_tcpnet_tls_server(nic->net->tls, fd, &app) != 0) {
                pf_log_ratelimited(PF_LOG_WARN, 5000, "NIC %s: cannot start a TLS relay",
                                   nic->name);
                free(c);
                continue;
            }
            fd = app;
        }
        c->nic = nic;
        c->fd = fd;
        pthread_mutex_init(&c->mu, NULL);
        pthread_mutex_lock(&nic->conn_mu);
        c->next = nic->conns;
        if (nic->conns)
            nic->conns->prev = c;
        nic->conns = c;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
        int rc = epoll_ctl(nic->epfd, EPOLL_CTL_ADD, fd, &ev);
        pthread_mutex_unlock(&nic->conn_mu);
        if (rc < 0) {
            pf_log_ratelimited(PF_LOG_WARN, 5000, "NIC %s: epoll_ctl: %s", nic->name,
                               strerror(errno));
            pf_tcpnet_sconn_close(c);
        }
    }
}

void *pf_tcpnet_serve_main(void *arg)
{
    struct tcpnic *nic = arg;
    struct epoll_event ev[16];
    while (!atomic_load(&nic->stop)) {
        int n = epoll_wait(nic->epfd, ev, PF_ARRAY_SIZE(ev), -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            pf_error("NIC %s: epoll_wait: %s: serving thread stops", nic->name, strerror(errno));
            break;
        }
        for (int i = 0; i < n && !atomic_load(&nic->stop); i++) {
            void *p = ev[i].data.ptr;
            if (p == &nic->efd_tag)
                continue;
            if (p == &nic->lfd_tag)
                tcpnet_accept_all(nic);
            else
                tcpnet_sconn_serve(p, ev[i].events);
        }
    }
    return NULL;
}

/* Shuts down the accepted connections paired with a local QP (its peer's READs then fail,
 * as against an RC QP in the error state). */
void pf_tcpnet_kill_served(struct tcpnic *nic, uint64_t token)
{
    pthread_mutex_lock(&nic->conn_mu);
    for (struct sconn *c = nic->conns; c; c = c->next)
        if (c->hello_done && c->token == token)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&nic->conn_mu);
}

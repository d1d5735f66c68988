/* TCP fabric: the "tcp" NET backend. RDMA semantics (memory regions with rkeys, RC queue
 * pairs, one-sided READ, polled completions) over plain TCP, usable in production on
 * clusters without RDMA and strict enough to catch core bugs in simulation.
 *
 * NICs. Each --nics entry is an interface name whose IPv4 address the NIC binds, or a
 * literal IPv4 address (loopback simulations: 127.0.0.2), optionally followed by ":port"
 * (default: an ephemeral port). Each NIC has a listening socket, a memory-region table
 * (random 32-bit rkeys and lkeys) and a pool of serving threads.
 *
 * Serving (the "NIC" side of one-sided READ). The serving threads share one epoll set of
 * the NIC's listener and accepted connections (EPOLLONESHOT: one thread per connection at
 * a time). A connection starts with HELLO naming the local QP it is paired with (rejected
 * unless that QP is live and, once connected, paired with that requester). READ requests
 * are answered in order: rkey, access and bounds are checked against the live region table
 * on every request; a bad request gets an error response and never data. Data is sent
 * straight from registered memory with non-blocking sendmsg; every sendmsg runs under the
 * region table's read lock after re-looking the region up, so dereg_mem (write lock) returns
 * only when no send from that region is in progress and none can start (a response cut
 * short by dereg_mem kills the connection, as a remote access error kills an RC QP).
 * The application is never involved.
 *
 * Requesting. A connected QP owns one TCP connection (TCP_NODELAY) and one receive thread.
 * post_read validates the local SGEs against the lkey table, queues a work request and
 * sends a 32-byte READ request (pipelined: up to TCPNET_SQ_DEPTH outstanding). The receive
 * thread reads each response header, matches it with the oldest outstanding WR and
 * receives the payload straight into the WR's SGE list (recvmsg MSG_WAITALL, no copy),
 * then queues the completion; poll waits on a condition variable with its timeout.
 * Errors follow RC hardware: the first failed WR completes with the error (-EREMOTEIO for
 * rkey/bounds/access, -ECONNRESET when the peer or its QP went away, -EPROTO for a corrupt
 * stream) and the QP enters the error state: every other outstanding WR completes with
 * -ECANCELED and post_read returns -ENOTCONN.
 *
 * Invalidation guarantee. qp_invalidate sets the error state, shuts the connection down
 * (which wakes the receive thread out of recvmsg) and joins the receive thread: when it
 * returns, the only thread that ever writes into SGE memory for that QP has exited, so no
 * byte can land afterwards. Completions are published only after their bytes are written
 * (success) or after the receive thread has stopped (errors, -ECANCELED). Invalidating a
 * QP also shuts down the connections its peer opened to it, so the peer's READs fail as
 * they would against an RC QP in the error state. dereg_mem of a local region with READs
 * in flight into it invalidates the QPs carrying them first.
 *
 * Locks: qp->tx_mu (sending requests) before qp->mu (state, WR and completion rings);
 * nic->qp_mu (QP list) before a QP's locks; nic->mr_lock (region table, writer-preferring
 * rwlock) and nic->conn_mu (accepted connections) are leaves. */
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

#include "tcpnet_wire.h"

#define TCPNET_MAX_NICS        16
#define TCPNET_SQ_DEPTH        128 /* outstanding READs per QP (posted, not yet polled) */
#define TCPNET_MAX_SGE         16
#define TCPNET_SREQ_CAP        256           /* queued requests per serving connection */
#define TCPNET_SERVE_BUDGET    (16ull << 20) /* bytes served per wake before yielding */
#define TCPNET_DEFAULT_THREADS 2
#define TCPNET_CONNECT_MS      5000
#define TCPNET_USER_TIMEOUT_MS 30000

struct tcpnic;

struct tcpmr {
    struct pf_net_mr base;
    struct tcpnic *nic;
    unsigned access;
    uint64_t uid; /* never reused: a re-registration with the same rkey is another region */
    _Atomic uint64_t inflight; /* SGEs of local READs in flight into this region */
    struct pf_hnode rnode, lnode;
};

struct tcpwr {
    uint64_t wr_id, seq, len;
    uint32_t nsge;
    struct iovec iov[TCPNET_MAX_SGE];
    struct tcpmr *mr[TCPNET_MAX_SGE];
};

enum tcpqp_state { TQ_INIT, TQ_RTS, TQ_ERR };

struct tcpqp {
    struct pf_net_qp base;
    struct tcpnic *nic;
    uint64_t token, peer_token;
    struct tcpqp *next;      /* nic->qps */
    pthread_mutex_t life_mu; /* serialises connect / invalidate / destroy */
    pthread_mutex_t tx_mu;   /* request sending; taken before mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int state;
    bool connecting;
    int fd; /* -1 when none; closed only with tx_mu and mu held after rx is joined */
    pthread_t rx;
    bool rx_running; /* started and not yet joined */
    uint64_t next_seq;
    uint32_t wr_head, wr_count; /* WRs posted and not completed (FIFO) */
    uint32_t cq_head, cq_count; /* completions not yet polled */
    struct tcpwr wr[TCPNET_SQ_DEPTH];
    struct pf_net_cqe cq[TCPNET_SQ_DEPTH];
};

struct sreq {
    uint64_t seq, raddr, len;
    uint32_t rkey;
};

/* One accepted connection on the serving side. Owned by whichever serving thread epoll
 * handed it to (EPOLLONESHOT); freed by that thread. */
struct sconn {
    struct tcpnic *nic;
    int fd;
    /* Held while a serving thread handles the connection, re-arm (EPOLL_CTL_MOD) included.
     * EPOLLONESHOT already gives one thread at a time; the (uncontended) mutex states the
     * hand-over ordering in C11 terms, which TSan cannot infer from epoll re-arming. */
    pthread_mutex_t mu;
    bool hello_done;
    uint64_t token; /* local QP this connection is paired with */
    struct sconn *prev, *next;
    uint8_t in[TCPNET_READ_LEN * 64];
    size_t in_len;
    uint8_t ack[TCPNET_ACK_LEN];
    size_t ack_off, ack_len;
    bool ack_fatal;
    struct sreq q[TCPNET_SREQ_CAP];
    uint32_t q_head, q_count;
    /* response in progress */
    bool cur;
    uint8_t hdr[TCPNET_RESP_LEN];
    size_t hdr_off;
    uint32_t rkey;
    uint64_t mr_uid;
    uint8_t *data;
    uint64_t len, data_off;
};

struct tcpnic {
    struct tcpnet *net;
    int index;
    char name[64];
    char ifname[IF_NAMESIZE]; /* empty for a literal address */
    char addrstr[INET_ADDRSTRLEN];
    struct in_addr ip;
    uint16_t port;
    int numa;
    int lfd, efd, epfd;
    int nthreads, nstarted;
    pthread_t *thr;
    _Atomic bool stop;
    char lfd_tag, efd_tag; /* epoll data pointers */

    pthread_rwlock_t mr_lock;
    struct pf_htable by_rkey, by_lkey;
    uint64_t next_uid;

    pthread_mutex_t qp_mu;
    struct tcpqp *qps;

    pthread_mutex_t conn_mu;
    struct sconn *conns;
};

struct tcpnet {
    struct pf_net base;
    int nnics;
    struct tcpnic *nics;
    int sockbuf;
    uint64_t connect_ms;
};

static const struct pf_net_ops tcpnet_ops;

static struct tcpnet *tcpnet_of(struct pf_net *n)
{
    return pf_container_of(n, struct tcpnet, base);
}

static struct tcpqp *tcpnet_qp(struct pf_net_qp *qp)
{
    return pf_container_of(qp, struct tcpqp, base);
}

static uint64_t tcpnet_key_hash(uint32_t key)
{
    uint64_t x = key;
    x ^= x >> 16;
    x *= 0x7feb352dull;
    x ^= x >> 15;
    return x;
}

static uint64_t tcpnet_env_u64(const char *name, uint64_t dflt, uint64_t max)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) {
        pf_warn("ignoring %s=%s (want an integer <= %llu)", name, s, (unsigned long long)max);
        return dflt;
    }
    return v;
}

/* ---------------------------------------------------------------- socket helpers */

static void tcpnet_sockopts(struct tcpnet *t, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    int idle = 10, intvl = 2, cnt = 5;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    unsigned uto = TCPNET_USER_TIMEOUT_MS;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
    if (t->sockbuf > 0) {
        /* FORCE variants pass net.core.[rw]mem_max when we have CAP_NET_ADMIN */
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &t->sockbuf, sizeof(t->sockbuf)))
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &t->sockbuf, sizeof(t->sockbuf));
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &t->sockbuf, sizeof(t->sockbuf)))
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &t->sockbuf, sizeof(t->sockbuf));
    }
}

/* Blocking send of the whole buffer. 0 or -errno. */
static int tcpnet_send_full(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Blocking receive of exactly len bytes. 0, -ECONNRESET (orderly close) or -errno. */
static int tcpnet_recv_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_WAITALL);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Waits for fd to become ready for events until deadline. 0, -ETIMEDOUT or -errno. */
static int tcpnet_wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = pf_now_ns();
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        uint64_t ms = (deadline_ns - now + PF_NS_PER_MS - 1) / PF_NS_PER_MS;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r > 0)
            return 0;
    }
}

/* ---------------------------------------------------------------- NIC resolution */

static int tcpnet_read_numa(const char *ifname)
{
    if (!ifname[0])
        return -1;
    char path[128];
    snprintf(path, sizeof(path), "/sys/class/net/%s/device/numa_node", ifname);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1)
        node = -1;
    fclose(f);
    return node < 0 ? -1 : node;
}

/* Splits "name[:port]" and resolves name (IPv4 literal or interface with an IPv4 address). */
static int tcpnet_resolve(const char *spec, struct tcpnic *nic)
{
    char name[64];
    if (!spec || !*spec || strlen(spec) >= sizeof(name)) {
        pf_error("invalid NIC name '%s'", spec ? spec : "");
        return -EINVAL;
    }
    snprintf(nic->name, sizeof(nic->name), "%s", spec);
    snprintf(name, sizeof(name), "%s", spec);
    nic->port = 0;
    char *colon = strrchr(name, ':');
    if (colon) {
        char *end = NULL;
        errno = 0;
        unsigned long p = strtoul(colon + 1, &end, 10);
        if (errno || end == colon + 1 || *end || p > 65535) {
            pf_error("NIC '%s': bad port after ':'", spec);
            return -EINVAL;
        }
        nic->port = (uint16_t)p;
        *colon = '\0';
    }
    nic->ifname[0] = '\0';
    if (inet_pton(AF_INET, name, &nic->ip) == 1) {
        inet_ntop(AF_INET, &nic->ip, nic->addrstr, sizeof(nic->addrstr));
        return 0;
    }
    if (strlen(name) >= IF_NAMESIZE) {
        pf_error("NIC '%s': not an IPv4 address and too long for an interface name", spec);
        return -ENODEV;
    }
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) < 0) {
        int e = errno;
        pf_error("getifaddrs: %s", strerror(e));
        return -e;
    }
    bool seen = false, found = false;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        if (!i->ifa_name || strcmp(i->ifa_name, name) != 0)
            continue;
        seen = true;
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            nic->ip = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
            found = true;
            break;
        }
    }
    freeifaddrs(ifa);
    if (!found) {
        if (seen)
            pf_error("NIC '%s': interface has no IPv4 address", spec);
        else
            pf_error("NIC '%s': no such network interface (and not an IPv4 address)", spec);
        return seen ? -EADDRNOTAVAIL : -ENODEV;
    }
    memcpy(nic->ifname, name, strlen(name) + 1); /* length checked above */
    inet_ntop(AF_INET, &nic->ip, nic->addrstr, sizeof(nic->addrstr));
    return 0;
}

static bool tcpnet_if_active(const struct tcpnic *nic)
{
    if (!nic->ifname[0])
        return true;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", nic->ifname);
    bool up = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP) &&
              (ifr.ifr_flags & IFF_RUNNING);
    close(fd);
    return up;
}

/* ---------------------------------------------------------------- memory regions */

/* Caller holds mr_lock (read or write). */
static struct tcpmr *tcpnet_mr_by_rkey(struct tcpnic *nic, uint32_t rkey)
{
    struct pf_hnode *n;
    uint64_t h = tcpnet_key_hash(rkey);
    pf_htable_for_each_hash(&nic->by_rkey, n, h)
    {
        struct tcpmr *m = pf_container_of(n, struct tcpmr, rnode);
        if (m->base.rkey == rkey)
            return m;
    }
    return NULL;
}

static struct tcpmr *tcpnet_mr_by_lkey(struct tcpnic *nic, uint32_t lkey)
{
    struct pf_hnode *n;
    uint64_t h = tcpnet_key_hash(lkey);
    pf_htable_for_each_hash(&nic->by_lkey, n, h)
    {
        struct tcpmr *m = pf_container_of(n, struct tcpmr, lnode);
        if (m->base.lkey == lkey)
            return m;
    }
    return NULL;
}

static int tcpnet_new_key(struct tcpnic *nic, bool remote, uint32_t *key_p)
{
    for (int tries = 0; tries < 64; tries++) {
        uint32_t k;
        int rc = pf_random_bytes(&k, sizeof(k));
        if (rc)
            return rc;
        if (k == 0)
            continue;
        if (remote ? tcpnet_mr_by_rkey(nic, k) == NULL : tcpnet_mr_by_lkey(nic, k) == NULL) {
            *key_p = k;
            return 0;
        }
    }
    return -EAGAIN;
}

static int tcpnet_reg_mem(struct pf_net *n, int nicidx, void *addr, uint64_t len, unsigned access,
                          struct pf_net_mr **mr_p)
{
    struct tcpnet *t = tcpnet_of(n);
    const unsigned known =
        PF_NET_ACCESS_LOCAL_WRITE | PF_NET_ACCESS_REMOTE_READ | PF_NET_ACCESS_REMOTE_WRITE;
    uint64_t end;
    if (nicidx < 0 || nicidx >= t->nnics || !addr || len == 0 || (access & ~known) ||
        !pf_add_ok((uint64_t)(uintptr_t)addr, len, &end))
        return -EINVAL;
    struct tcpnic *nic = &t->nics[nicidx];
    struct tcpmr *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->base.net = n;
    m->base.nic = nicidx;
    m->base.addr = addr;
    m->base.len = len;
    m->nic = nic;
    m->access = access;
    pthread_rwlock_wrlock(&nic->mr_lock);
    int rc = tcpnet_new_key(nic, true, &m->base.rkey);
    if (rc == 0)
        rc = tcpnet_new_key(nic, false, &m->base.lkey);
    if (rc) {
        pthread_rwlock_unlock(&nic->mr_lock);
        free(m);
        return rc;
    }
    m->uid = ++nic->next_uid;
    pf_htable_insert(&nic->by_rkey, &m->rnode, tcpnet_key_hash(m->base.rkey));
    pf_htable_insert(&nic->by_lkey, &m->lnode, tcpnet_key_hash(m->base.lkey));
    pthread_rwlock_unlock(&nic->mr_lock);
    pf_debug("NIC %s: registered %p+%llu access 0x%x rkey 0x%08x", nic->name, addr,
             (unsigned long long)len, access, m->base.rkey);
    *mr_p = &m->base;
    return 0;
}

static void tcpnet_qp_invalidate(struct pf_net_qp *qpb);

static bool tcpnet_qp_uses_mr(struct tcpqp *q, struct tcpmr *m)
{
    bool uses = false;
    pthread_mutex_lock(&q->mu);
    for (uint32_t i = 0; i < q->wr_count && !uses; i++) {
        const struct tcpwr *w = &q->wr[(q->wr_head + i) % TCPNET_SQ_DEPTH];
        for (uint32_t k = 0; k < w->nsge; k++)
            if (w->mr[k] == m)
                uses = true;
    }
    pthread_mutex_unlock(&q->mu);
    return uses;
}

static void tcpnet_dereg_mem(struct pf_net_mr *mrb)
{
    if (!mrb)
        return;
    struct tcpmr *m = pf_container_of(mrb, struct tcpmr, base);
    struct tcpnic *nic = m->nic;
    /* After the write lock: no serving send from this region is running, none can start
     * (lookups fail), and no post_read can take a new reference. */
    pthread_rwlock_wrlock(&nic->mr_lock);
    pf_htable_remove(&nic->by_rkey, &m->rnode);
    pf_htable_remove(&nic->by_lkey, &m->lnode);
    pthread_rwlock_unlock(&nic->mr_lock);
    if (atomic_load(&m->inflight) > 0) {
        pthread_mutex_lock(&nic->qp_mu);
        for (struct tcpqp *q = nic->qps; q; q = q->next)
            if (tcpnet_qp_uses_mr(q, m)) {
                pf_warn("NIC %s: region %p deregistered with READs in flight into it: "
                        "invalidating its QP",
                        nic->name, m->base.addr);
                tcpnet_qp_invalidate(&q->base);
            }
        pthread_mutex_unlock(&nic->qp_mu);
        /* QPs being destroyed concurrently (already off the list) flush on their own */
        while (atomic_load(&m->inflight) > 0)
            pf_sleep_ms(1);
    }
    pf_debug("NIC %s: deregistered %p rkey 0x%08x", nic->name, m->base.addr, m->base.rkey);
    free(m);
}

/* ---------------------------------------------------------------- serving side */

static void tcpnet_sconn_close(struct sconn *c)
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
         * makes the check fail or finds this connection in tcpnet_kill_served. */
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
    struct tcpmr *m = tcpnet_mr_by_rkey(nic, r.rkey);
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

/* Sends as much of the current response as the socket takes. 1: would block, 0: response
 * done, -errno: connection must close. *sent_p accumulates payload bytes sent. */
static int tcpnet_sconn_send_cur(struct sconn *c, uint64_t *sent_p)
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
            struct tcpmr *m = tcpnet_mr_by_rkey(nic, c->rkey);
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
            if (e == EAGAIN || e == EWOULDBLOCK)
                return 1;
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
static int tcpnet_sconn_write(struct sconn *c, uint64_t *budget)
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
        int rc = tcpnet_sconn_send_cur(c, &sent);
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
    uint64_t budget = TCPNET_SERVE_BUDGET;
    bool want_out = false;
    for (;;) {
        int rc = tcpnet_sconn_read(c);
        if (rc)
            goto err_close;
        rc = tcpnet_sconn_write(c, &budget);
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
    tcpnet_sconn_close(c);
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
        c->nic = nic;
        c->fd = fd;
        pthread_mutex_init(&c->mu, NULL);
        tcpnet_sockopts(nic->net, fd);
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
            tcpnet_sconn_close(c);
        }
    }
}

static void *tcpnet_serve_main(void *arg)
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
static void tcpnet_kill_served(struct tcpnic *nic, uint64_t token)
{
    pthread_mutex_lock(&nic->conn_mu);
    for (struct sconn *c = nic->conns; c; c = c->next)
        if (c->hello_done && c->token == token)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&nic->conn_mu);
}

/* ---------------------------------------------------------------- QPs */

static int tcpnet_qp_create(struct pf_net *n, int nicidx, struct pf_net_qp **qp_p)
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

static int tcpnet_qp_local_endpoint(struct pf_net_qp *qpb, void *buf, size_t cap, size_t *len_p)
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
        (struct pf_net_cqe){.wr_id = w->wr_id, .status = status, .bytes = status ? 0 : w->len};
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
        err = tcpnet_recv_full(fd, h, sizeof(h));
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
        pthread_mutex_unlock(&q->mu);

        err = tcpnet_recv_sge(q, fd, iov, (int)nsge);
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

static int tcpnet_qp_connect(struct pf_net_qp *qpb, const void *remote_ep, size_t len)
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

    tcpnet_sockopts(t, fd);
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
        rc = tcpnet_wait_fd(fd, POLLOUT, deadline);
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
    uint8_t hello[TCPNET_HELLO_LEN];
    tcpnet_put32(hello, TCPNET_HELLO_MAGIC);
    tcpnet_put32(hello + 4, TCPNET_VERSION);
    tcpnet_put64(hello + 8, ep.token);
    tcpnet_put64(hello + 16, q->token);
    rc = tcpnet_send_full(fd, hello, sizeof(hello));
    if (rc)
        goto err_log;
    uint8_t ack[TCPNET_ACK_LEN];
    rc = tcpnet_wait_fd(fd, POLLIN, deadline);
    if (rc == 0)
        rc = tcpnet_recv_full(fd, ack, sizeof(ack));
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

static int tcpnet_post_read(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                            uint64_t raddr, uint32_t rkey, uint64_t wr_id)
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
        struct tcpmr *m = tcpnet_mr_by_lkey(nic, sge[i].lkey);
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
    int src = tcpnet_send_full(fd, req, sizeof(req));
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

static int tcpnet_poll(struct pf_net_qp *qpb, struct pf_net_cqe *out, size_t max,
                       uint64_t timeout_ms)
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

static void tcpnet_qp_invalidate(struct pf_net_qp *qpb)
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
    tcpnet_kill_served(q->nic, q->token);
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

static void tcpnet_qp_free(struct tcpqp *q)
{
    tcpnet_qp_invalidate(&q->base);
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

static void tcpnet_qp_destroy(struct pf_net_qp *qpb)
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
    tcpnet_qp_free(q);
}

/* ---------------------------------------------------------------- NIC lifetime */

static int tcpnet_nic_count(struct pf_net *n)
{
    return tcpnet_of(n)->nnics;
}

static int tcpnet_nic_info(struct pf_net *n, int nicidx, struct pf_net_nic_info *info_p)
{
    struct tcpnet *t = tcpnet_of(n);
    if (nicidx < 0 || nicidx >= t->nnics || !info_p)
        return -EINVAL;
    struct tcpnic *nic = &t->nics[nicidx];
    memset(info_p, 0, sizeof(*info_p));
    snprintf(info_p->name, sizeof(info_p->name), "%s", nic->name);
    snprintf(info_p->addr, sizeof(info_p->addr), "%s", nic->addrstr);
    info_p->numa_node = nic->numa;
    info_p->active = tcpnet_if_active(nic);
    return 0;
}

static void tcpnet_nic_fini(struct tcpnic *nic)
{
    if (nic->thr) {
        atomic_store(&nic->stop, true);
        uint64_t one = 1;
        if (write(nic->efd, &one, sizeof(one)) < 0)
            pf_warn("NIC %s: waking serving threads: %s", nic->name, strerror(errno));
        for (int i = 0; i < nic->nstarted; i++)
            pthread_join(nic->thr[i], NULL);
        free(nic->thr);
        nic->thr = NULL;
    }
    while (nic->qps) {
        struct tcpqp *q = nic->qps;
        nic->qps = q->next;
        pf_warn("NIC %s: QP %016llx still open at close", nic->name, (unsigned long long)q->token);
        tcpnet_qp_free(q);
    }
    while (nic->conns)
        tcpnet_sconn_close(nic->conns);
    for (;;) { /* leftover regions (the table may not change while it is walked) */
        struct tcpmr *m = NULL;
        pf_htable_for_each(&nic->by_rkey, i, hn)
        {
            if (!m)
                m = pf_container_of(hn, struct tcpmr, rnode);
        }
        if (!m)
            break;
        pf_warn("NIC %s: region %p still registered at close", nic->name, m->base.addr);
        pf_htable_remove(&nic->by_rkey, &m->rnode);
        pf_htable_remove(&nic->by_lkey, &m->lnode);
        free(m);
    }
    pf_htable_destroy(&nic->by_rkey);
    pf_htable_destroy(&nic->by_lkey);
    if (nic->epfd >= 0)
        close(nic->epfd);
    if (nic->efd >= 0)
        close(nic->efd);
    if (nic->lfd >= 0)
        close(nic->lfd);
    pthread_rwlock_destroy(&nic->mr_lock);
    pthread_mutex_destroy(&nic->qp_mu);
    pthread_mutex_destroy(&nic->conn_mu);
}

static int tcpnet_nic_init(struct tcpnet *t, struct tcpnic *nic, int index, const char *spec,
                           int nthreads)
{
    nic->net = t;
    nic->index = index;
    nic->lfd = nic->efd = nic->epfd = -1;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* serving threads take the read lock per sendmsg: keep dereg/reg from starving */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&nic->mr_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&nic->qp_mu, NULL);
    pthread_mutex_init(&nic->conn_mu, NULL);

    int rc = tcpnet_resolve(spec, nic); /* logs its own errors */
    if (rc)
        return rc;
    nic->numa = tcpnet_read_numa(nic->ifname);
    const char *what = "region tables";
    rc = pf_htable_init(&nic->by_rkey, 16);
    if (rc == 0)
        rc = pf_htable_init(&nic->by_lkey, 16);
    if (rc)
        goto err_log;

    what = "listen";
    nic->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (nic->lfd < 0)
        goto err_errno;
    int one = 1;
    setsockopt(nic->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (t->sockbuf > 0) /* accepted sockets inherit the listener's buffers */
        tcpnet_sockopts(t, nic->lfd);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_addr = nic->ip, .sin_port = htons(nic->port)};
    if (bind(nic->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(nic->lfd, 256) < 0)
        goto err_errno;
    socklen_t sl = sizeof(sa);
    getsockname(nic->lfd, (struct sockaddr *)&sa, &sl);
    nic->port = ntohs(sa.sin_port);

    what = "epoll set";
    nic->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    nic->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (nic->efd < 0 || nic->epfd < 0)
        goto err_errno;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &nic->efd_tag};
    if (epoll_ctl(nic->epfd, EPOLL_CTL_ADD, nic->efd, &ev) < 0)
        goto err_errno;
    ev.data.ptr = &nic->lfd_tag;
    if (epoll_ctl(nic->epfd, EPOLL_CTL_ADD, nic->lfd, &ev) < 0)
        goto err_errno;

    what = "serving threads";
    nic->nthreads = nthreads;
    nic->thr = calloc((size_t)nthreads, sizeof(*nic->thr));
    rc = -ENOMEM;
    if (!nic->thr)
        goto err_log;
    for (int i = 0; i < nthreads; i++) {
        char tn[32];
        snprintf(tn, sizeof(tn), "pf-tcpnet%d.%d", index % 100, i % 100);
        rc = pf_thread_start(&nic->thr[i], tn, nic->numa, tcpnet_serve_main, nic);
        if (rc)
            goto err_log;
        nic->nstarted++;
    }
    return 0;

err_errno:
    rc = -errno;
err_log:
    pf_error("tcp fabric NIC %s (%s:%u): %s: %s", nic->name, nic->addrstr, nic->port, what,
             strerror(-rc));
    return rc; /* tcpnet_nic_fini undoes what was set up */
}

static void tcpnet_close(struct pf_net *n)
{
    if (!n)
        return;
    struct tcpnet *t = tcpnet_of(n);
    for (int i = 0; i < t->nnics; i++)
        tcpnet_nic_fini(&t->nics[i]);
    free(t->nics);
    free(t);
}

static int tcpnet_open(const struct pf_net_config *cfg, struct pf_net **n_p)
{
    if (!cfg || cfg->nnics == 0 || !cfg->nics) {
        pf_error("tcp fabric: no NICs given (--nics names interfaces or IPv4 addresses)");
        return -EINVAL;
    }
    if (cfg->nnics > TCPNET_MAX_NICS) {
        pf_error("tcp fabric: %zu NICs given, at most %d supported", cfg->nnics, TCPNET_MAX_NICS);
        return -EINVAL;
    }
    struct tcpnet *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->base.ops = &tcpnet_ops;
    t->sockbuf = (int)tcpnet_env_u64("PEGAFLOW_TCPNET_SOCKBUF", 0, 1u << 30);
    t->connect_ms =
        tcpnet_env_u64("PEGAFLOW_TCPNET_CONNECT_TIMEOUT_MS", TCPNET_CONNECT_MS, 3600u * 1000u);
    int nthreads = (int)tcpnet_env_u64("PEGAFLOW_TCPNET_THREADS", TCPNET_DEFAULT_THREADS, 64);
    if (nthreads < 1)
        nthreads = 1;
    t->nics = calloc(cfg->nnics, sizeof(*t->nics));
    if (!t->nics) {
        free(t);
        return -ENOMEM;
    }
    int rc = 0;
    for (size_t i = 0; i < cfg->nnics; i++) {
        t->nnics = (int)i + 1;
        rc = tcpnet_nic_init(t, &t->nics[i], (int)i, cfg->nics[i], nthreads);
        if (rc)
            goto err_close;
        struct tcpnic *nic = &t->nics[i];
        pf_info("tcp fabric NIC %zu: %s address %s port %u NUMA node %d (%d serving threads)", i,
                nic->name, nic->addrstr, nic->port, nic->numa, nthreads);
    }
    *n_p = &t->base;
    return 0;

err_close:
    tcpnet_close(&t->base);
    return rc;
}

static int tcpnet_ep_host(struct pf_net *n, const void *remote_ep, size_t len, char *host,
                          size_t hostlen)
{
    struct tcpnet_ep ep;
    if (tcpnet_ep_decode(remote_ep, len, &ep))
        return -EINVAL;
    return inet_ntop(AF_INET, ep.ip, host, (socklen_t)hostlen) ? 0 : -ENOSPC;
}

static const struct pf_net_ops tcpnet_ops = {
    .name = "tcp",
    .nic_count = tcpnet_nic_count,
    .nic_info = tcpnet_nic_info,
    .reg_mem = tcpnet_reg_mem,
    .dereg_mem = tcpnet_dereg_mem,
    .qp_create = tcpnet_qp_create,
    .qp_local_endpoint = tcpnet_qp_local_endpoint,
    .qp_connect = tcpnet_qp_connect,
    .ep_host = tcpnet_ep_host,
    .post_read = tcpnet_post_read,
    .poll = tcpnet_poll,
    .qp_invalidate = tcpnet_qp_invalidate,
    .qp_destroy = tcpnet_qp_destroy,
    .close = tcpnet_close,
};

static const struct pf_net_backend tcpnet_backend = {
    .name = "tcp",
    .hardware = 0,
    .ops = &tcpnet_ops,
    .open = tcpnet_open,
};

int pf_tcpnet_register(void)
{
    return pf_hal_register_net(&tcpnet_backend);
}

/* Private to sim/net: the TCP fabric's types and the functions its three files share.
 *   tcpnet.c        NIC resolution, socket helpers, memory regions, NIC lifetime, the ops table
 *   tcpnet_serve.c  the serving side of one-sided READ (the "NIC" answering requests)
 *   tcpnet_qp.c     the requesting side: RC queue pairs, post_read, completions
 *
 TCP fabric: the "tcp" NET backend. RDMA semantics (memory regions with rkeys, RC queue
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
 * straight from registered memory with non-blocking sendmsg (a full socket is waited for in
 * place, at most send_wait_ns per wake, before the connection is re-armed in epoll); every
 * sendmsg runs under the region table's read lock after re-looking the region up (the wait
 * does not hold it), so dereg_mem (write lock) returns
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
#ifndef PF_SIM_TCPNET_INTERNAL_H
#define PF_SIM_TCPNET_INTERNAL_H

#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "pf/hal.h"
#include "pf/htable.h"
#include "pf/util.h"

#include "tcpnet_wire.h"

#include "tcpnet_wire.h"

#define TCPNET_MAX_NICS        16
#define TCPNET_SQ_DEPTH        128 /* outstanding READs per QP (posted, not yet polled) */
#define TCPNET_MAX_SGE         16
#define TCPNET_SREQ_CAP        256           /* queued requests per serving connection */
#define TCPNET_SERVE_BUDGET    (16ull << 20) /* bytes served per wake before yielding */
#define TCPNET_SEND_WAIT_US    5000 /* in-place wait for a full socket per wake (see above) */
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
    struct pf_net_digest dig; /* dig.n == 0: no digest request */
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

struct tcpnet_tls;

struct tcpnet {
    struct pf_net base;
    int nnics;
    struct tcpnic *nics;
    int sockbuf;
    uint64_t send_wait_ns; /* TCPNET_SEND_WAIT_US */
    uint64_t connect_ms;
    struct tcpnet_tls *tls; /* TLS on every connection (tcpnet_tls.c), or NULL */
};

/* ---- TLS (tcpnet_tls.c) ----
 * create: contexts from the PEM texts of cfg (-EINVAL with a message naming the flag).
 * client: TLS handshake on a connected socket fd towards peer_ip (bounded by deadline_ns),
 *   then a relay thread owns fd; *app_p is a blocking stream socket carrying the plaintext.
 *   -ECONNREFUSED (handshake or certificate failed) or -ETIMEDOUT; fd is closed on failure.
 * server: a relay thread owns the accepted socket fd and does the handshake (bounded);
 *   *app_p is a non-blocking stream socket (end-of-file when the peer is refused).
 * destroy: waits (bounded) for the relays, whose fabric ends must be closed by then. */
int pf_tcpnet_tls_create(const struct pf_net_config *cfg, struct tcpnet_tls **tls_p, char *err,
                         size_t errlen);
bool pf_tcpnet_tls_mutual(const struct tcpnet_tls *t);
void pf_tcpnet_tls_destroy(struct tcpnet_tls *t);
int pf_tcpnet_tls_client(struct tcpnet_tls *t, int fd, const char *peer_ip, uint64_t deadline_ns,
                         int *app_p);
int pf_tcpnet_tls_server(struct tcpnet_tls *t, int fd, int *app_p);

static const struct pf_net_ops tcpnet_ops;
static inline struct tcpnet *tcpnet_of(struct pf_net *n)
{
    return pf_container_of(n, struct tcpnet, base);
}

static inline struct tcpqp *tcpnet_qp(struct pf_net_qp *qp)
{
    return pf_container_of(qp, struct tcpqp, base);
}

static inline uint64_t tcpnet_key_hash(uint32_t key)
{
    uint64_t x = key;
    x ^= x >> 16;
    x *= 0x7feb352dull;
    x ^= x >> 15;
    return x;
}

/* TCP_NODELAY, keep-alive/user timeout and the configured socket buffers on fd. */
void pf_tcpnet_sockopts(struct tcpnet *t, int fd);

/* Blocking send/receive of exactly len bytes: 0, or -errno (-ECONNRESET on EOF). */
int pf_tcpnet_send_full(int fd, const void *buf, size_t len);
int pf_tcpnet_recv_full(int fd, void *buf, size_t len);

/* Waits until fd is ready for events or deadline_ns (CLOCK_MONOTONIC) passes: 0,
 * -ETIMEDOUT or -errno. */
int pf_tcpnet_wait_fd(int fd, short events, uint64_t deadline_ns);

/* Region lookups; the caller holds nic->mr_lock (read or write). NULL when absent. */
struct tcpmr *pf_tcpnet_mr_by_rkey(struct tcpnic *nic, uint32_t rkey);
struct tcpmr *pf_tcpnet_mr_by_lkey(struct tcpnic *nic, uint32_t lkey);

/* Serving side (tcpnet_serve.c). sconn_close unlinks, closes and frees an accepted
 * connection; serve_main is a serving thread (arg: the NIC); kill_served shuts down every
 * accepted connection paired with the local QP token. */
void pf_tcpnet_sconn_close(struct sconn *c);
void *pf_tcpnet_serve_main(void *arg);
void pf_tcpnet_kill_served(struct tcpnic *nic, uint64_t token);

/* Requesting side (tcpnet_qp.c): the pf_net_ops QP entries. qp_free releases a QP that
 * was never connected or whose receive thread was joined. */
int pf_tcpnet_qp_create(struct pf_net *n, int nicidx, struct pf_net_qp **qp_p);
int pf_tcpnet_qp_local_endpoint(struct pf_net_qp *qpb, void *buf, size_t cap, size_t *len_p);
int pf_tcpnet_qp_connect(struct pf_net_qp *qpb, const void *remote_ep, size_t len);
int pf_tcpnet_post_read(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                        uint64_t raddr, uint32_t rkey, uint64_t wr_id);
int pf_tcpnet_post_read_digest(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                               uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                               const struct pf_net_digest *d);
int pf_tcpnet_poll(struct pf_net_qp *qpb, struct pf_net_cqe *out, size_t max, uint64_t timeout_ms);
void pf_tcpnet_qp_invalidate(struct pf_net_qp *qpb);
void pf_tcpnet_qp_free(struct tcpqp *q);
void pf_tcpnet_qp_destroy(struct pf_net_qp *qpb);

#endif

/* NIC hardware abstraction: RDMA semantics (memory regions, RC queue pairs, one-sided READ,
 * completions).
 *
 * Backends: "verbs" (hw/verbs, rdma-core; mlx5 or soft-RoCE), "tcp" (sim/net: a fabric with
 * the same semantics over TCP, where a NIC thread on the serving node answers READs from
 * registered memory without involving the application), and "faulty:<inner>".
 *
 * Model:
 *  - pf_hal_net_open opens the NICs named by --nics (index i = i-th name). Peers pair NICs
 *    by index: rail k is NIC k on both sides, where both have it up (a peer with fewer NICs
 *    uses the first ones; docs/net.md "Per-NIC health").
 *  - reg_mem registers [addr, addr+len) on one NIC; the returned rkey lets peers READ it.
 *    The backend checks rkey, bounds and access on every remote request (the TCP fabric is
 *    stricter than hardware: it never serves bytes outside a live region).
 *  - A QP is one end of a reliable connection: qp_create (INIT), exchange the local endpoint
 *    blobs out of band (the RdmaHandshake RPC), qp_connect (ready).
 *  - post_read READs len bytes from the peer's (raddr, rkey) into the local SGE list; the
 *    completion {wr_id, status, bytes} is returned later by poll. Completions are records
 *    the core polls; backends never call into the core.
 *  - qp_invalidate moves the QP to the error state and returns only when no completion for
 *    it can write local memory any more (outstanding READs are flushed with -ECANCELED and
 *    can still be polled). This is what makes freeing staging memory after a timeout safe.
 *
 * Threading: ops on different QPs may run concurrently, and so may reg_mem/dereg_mem on
 * different NICs (P2P registers the pool on every NIC at once). One QP is posted to and
 * polled by one thread at a time; qp_invalidate may be called from any thread. */
#ifndef PF_HAL_NET_H
#define PF_HAL_NET_H

#include <stdbool.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#define PF_NET_EP_MAX 256 /* max bytes of a local endpoint blob */

#define PF_NET_ACCESS_LOCAL_WRITE  0x1u
#define PF_NET_ACCESS_REMOTE_READ  0x2u
#define PF_NET_ACCESS_REMOTE_WRITE 0x4u

struct pf_net;

struct pf_net_nic_info {
    char name[64];
    int numa_node; /* -1 when unknown */
    char addr[64]; /* printable address (IP for tcp, GID for verbs) */
    bool active;
    uint64_t max_msg; /* largest READ the NIC takes (verbs: port max_msg_sz); 0 = no limit */
};

struct pf_net_mr {
    struct pf_net *net;
    int nic;
    void *addr;
    uint64_t len;
    uint32_t lkey, rkey;
};

struct pf_net_qp {
    struct pf_net *net;
    int nic;
};

struct pf_net_sge {
    void *addr;
    uint64_t len;
    uint32_t lkey;
};

/* A digest request of one READ (post_read_digest): the READ's bytes, in order, split into
 * n consecutive ranges of lens[i] bytes (together at most the READ's length); a backend
 * that honours it writes XXH3_64bits (seed 0, pf_checksum2's value) of range i into out[i]
 * as the bytes land, while they are in cache, and reports the completion with digested = 1.
 * A range whose length has PF_NET_DIGEST_SKIP set is received but not hashed. lens and out
 * must stay valid until the READ's completion has been polled (or flushed). The digests
 * are of the bytes as they landed in local memory: the receiver's own check, not the
 * wire's. */
#define PF_NET_DIGEST_SKIP 0x80000000u
struct pf_net_digest {
    uint32_t n;
    const uint32_t *lens;
    uint64_t *out;
};

/* One READ of a chain (post_reads): as post_read's arguments; digest as post_read_digest's
 * (NULL: none; a backend may ignore it, its completion then says digested = 0). */
struct pf_net_read {
    const struct pf_net_sge *sge;
    size_t nsge;
    uint64_t raddr;
    uint32_t rkey;
    uint64_t wr_id;
    const struct pf_net_digest *digest;
};

struct pf_net_cqe {
    uint64_t wr_id;
    int status; /* 0 or -errno (-EREMOTEIO: remote access error, -ECANCELED: flushed) */
    uint64_t bytes;
    uint8_t digested; /* status 0 and the READ's digest request was honoured */
};

struct pf_net_ops {
    const char *name;
    int (*nic_count)(struct pf_net *n);
    int (*nic_info)(struct pf_net *n, int nic, struct pf_net_nic_info *info_p);
    int (*reg_mem)(struct pf_net *n, int nic, void *addr, uint64_t len, unsigned access,
                   struct pf_net_mr **mr_p);
    /* After return, remote requests against this region fail. Accepts NULL. */
    void (*dereg_mem)(struct pf_net_mr *mr);
    int (*qp_create)(struct pf_net *n, int nic, struct pf_net_qp **qp_p);
    /* Writes the endpoint blob the peer needs for qp_connect. 0 or -ENOSPC. */
    int (*qp_local_endpoint)(struct pf_net_qp *qp, void *buf, size_t cap, size_t *len_p);
    int (*qp_connect)(struct pf_net_qp *qp, const void *remote_ep, size_t len);
    /* Optional: the IP address ("10.0.0.2") qp_connect with this remote endpoint would open
     * a connection to, so the P2P layer can refuse endpoints naming another host
     * (docs/security.md). -EINVAL for a malformed endpoint; NULL (-EOPNOTSUPP) when the
     * backend does not connect by IP address (verbs: the fabric routes by GID). */
    int (*ep_host)(struct pf_net *n, const void *remote_ep, size_t len, char *host, size_t hostlen);
    /* Optional: whether qp_connect(qp, remote_ep) can work, with the reason when not
     * (verbs: the two GIDs differ in family or RoCE version, so the QP would never reach
     * RTR/RTS; link layers differ). 0, or -EPROTO / -EINVAL with why filled. NULL: no check. */
    int (*ep_check)(struct pf_net_qp *qp, const void *remote_ep, size_t len, char *why,
                    size_t whylen);
    /* Posts one READ of sum(sge[i].len) bytes from (raddr, rkey). -EAGAIN when the send
     * queue is full (poll, then retry), -ENOTCONN when the QP is not connected or broken. */
    int (*post_read)(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                     uint64_t raddr, uint32_t rkey, uint64_t wr_id);
    /* Optional: posts reads[0..n) in order as chains (verbs: the WRs linked through wr.next,
     * one ibv_post_send per up to 32). Each READ is exactly a post_read of its own: it
     * reports its own completion {wr_id, status, bytes} through poll. *posted_p = how many
     * were posted from the front; returns 0 when all n were, else the error (post_read's
     * codes: -EAGAIN when the send queue filled up) of reads[*posted_p], the first one not
     * posted. NULL: pf_net_post_reads posts them one at a time. */
    int (*post_reads)(struct pf_net_qp *qp, const struct pf_net_read *reads, size_t n,
                      size_t *posted_p);
    /* Optional: post_read with a digest request (struct pf_net_digest). NULL: the request
     * cannot be honoured (verbs: the NIC writes memory, no CPU sees the bytes land);
     * pf_net_post_reads then posts a plain READ and its completion says digested = 0. */
    int (*post_read_digest)(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                            uint64_t raddr, uint32_t rkey, uint64_t wr_id,
                            const struct pf_net_digest *d);
    /* Returns up to max completions (>= 0), waiting up to timeout_ms for the first one
     * (0 = do not wait). -errno on a broken QP with nothing left to report. */
    int (*poll)(struct pf_net_qp *qp, struct pf_net_cqe *out, size_t max, uint64_t timeout_ms);
    void (*qp_invalidate)(struct pf_net_qp *qp);
    /* Invalidates if needed, then frees. Accepts NULL. */
    void (*qp_destroy)(struct pf_net_qp *qp);
    void (*close)(struct pf_net *n);
};

struct pf_net {
    const struct pf_net_ops *ops;
};

/* RDMA transport settings (--rdma-* flags, docs/net.md "Flags"); backends without RDMA
 * ignore them. pf_net_rdma_defaults fills the defaults. */
struct pf_net_rdma_opts {
    int gid_index;          /* --rdma-gid-index: -1 = choose (docs/net.md "GID choice") */
    const char *gid_subnet; /* --rdma-gid-subnet: CIDR the GID must be in; NULL = any */
    int traffic_class;      /* --rdma-traffic-class: GRH traffic class (DSCP << 2 | ECN) */
    int sl;                 /* --rdma-sl: service level (IB SL / RoCE PCP) */
    int pkey_index;         /* --rdma-pkey-index */
    int timeout;            /* --rdma-timeout: local ACK timeout, 4.096 us * 2^timeout */
    int retry_cnt;          /* --rdma-retry-cnt: transport retries (0..7) */
    int rnr_retry;          /* --rdma-rnr-retry: RNR retries (0..7, 7 = forever) */
};

#define PF_NET_RDMA_TC      106 /* DSCP 26 (the lossless class of NCCL/Mooncake setups), ECT(0) */
#define PF_NET_RDMA_SL      0
#define PF_NET_RDMA_TIMEOUT 18 /* 4.096 us * 2^18 = 1.07 s per try */
#define PF_NET_RDMA_RETRY   7
#define PF_NET_RDMA_RNR     7

static inline struct pf_net_rdma_opts pf_net_rdma_defaults(void)
{
    return (struct pf_net_rdma_opts){.gid_index = -1,
                                     .traffic_class = PF_NET_RDMA_TC,
                                     .sl = PF_NET_RDMA_SL,
                                     .timeout = PF_NET_RDMA_TIMEOUT,
                                     .retry_cnt = PF_NET_RDMA_RETRY,
                                     .rnr_retry = PF_NET_RDMA_RNR};
}

struct pf_net_config {
    const char *const *nics; /* --nics */
    size_t nnics;
    struct pf_fault_plan *faults;
    /* TLS of the TCP fabric (docs/security.md "Fabric TLS"): the node certificate chain,
     * its key and the cluster CA as PEM text (--tls-cert/--tls-key/--tls-ca). With a
     * certificate every fabric connection is TLS 1.3, or refused; NULL: plaintext. Backends
     * that cannot encrypt (verbs: RDMA READs bypass the host) ignore them. */
    const char *tls_cert_pem, *tls_key_pem, *tls_ca_pem;
    const struct pf_net_rdma_opts *rdma; /* NULL = pf_net_rdma_defaults() */
    /* Bytes the caller will register on every NIC (the pool): verbs checks RLIMIT_MEMLOCK
     * against pin_bytes x NICs at open (0 = no check). */
    uint64_t pin_bytes;
};

static inline int pf_net_nic_count(struct pf_net *n)
{
    return n->ops->nic_count(n);
}
static inline int pf_net_nic_info(struct pf_net *n, int nic, struct pf_net_nic_info *info_p)
{
    return n->ops->nic_info(n, nic, info_p);
}
static inline int pf_net_reg_mem(struct pf_net *n, int nic, void *addr, uint64_t len,
                                 unsigned access, struct pf_net_mr **mr_p)
{
    return n->ops->reg_mem(n, nic, addr, len, access, mr_p);
}
static inline void pf_net_dereg_mem(struct pf_net_mr *mr)
{
    if (mr)
        mr->net->ops->dereg_mem(mr);
}
static inline int pf_net_qp_create(struct pf_net *n, int nic, struct pf_net_qp **qp_p)
{
    return n->ops->qp_create(n, nic, qp_p);
}
static inline int pf_net_qp_local_endpoint(struct pf_net_qp *qp, void *buf, size_t cap,
                                           size_t *len_p)
{
    return qp->net->ops->qp_local_endpoint(qp, buf, cap, len_p);
}
static inline int pf_net_qp_connect(struct pf_net_qp *qp, const void *ep, size_t len)
{
    return qp->net->ops->qp_connect(qp, ep, len);
}
static inline int pf_net_ep_host(struct pf_net *n, const void *ep, size_t len, char *host,
                                 size_t hostlen)
{
    return n->ops->ep_host ? n->ops->ep_host(n, ep, len, host, hostlen) : -EOPNOTSUPP;
}
static inline int pf_net_ep_check(struct pf_net_qp *qp, const void *ep, size_t len, char *why,
                                  size_t whylen)
{
    return qp->net->ops->ep_check ? qp->net->ops->ep_check(qp, ep, len, why, whylen) : 0;
}
static inline int pf_net_post_read(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge,
                                   uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    return qp->net->ops->post_read(qp, sge, nsge, raddr, rkey, wr_id);
}
/* post_read with a digest request; -EOPNOTSUPP when the backend cannot honour one. */
static inline int pf_net_post_read_digest(struct pf_net_qp *qp, const struct pf_net_sge *sge,
                                          size_t nsge, uint64_t raddr, uint32_t rkey,
                                          uint64_t wr_id, const struct pf_net_digest *d)
{
    if (!qp->net->ops->post_read_digest)
        return -EOPNOTSUPP;
    return qp->net->ops->post_read_digest(qp, sge, nsge, raddr, rkey, wr_id, d);
}
static inline int pf_net_post_reads(struct pf_net_qp *qp, const struct pf_net_read *reads, size_t n,
                                    size_t *posted_p)
{
    *posted_p = 0;
    if (qp->net->ops->post_reads)
        return qp->net->ops->post_reads(qp, reads, n, posted_p);
    for (size_t k = 0; k < n; k++) {
        int rc =
            reads[k].digest && qp->net->ops->post_read_digest
                ? qp->net->ops->post_read_digest(qp, reads[k].sge, reads[k].nsge, reads[k].raddr,
                                                 reads[k].rkey, reads[k].wr_id, reads[k].digest)
                : qp->net->ops->post_read(qp, reads[k].sge, reads[k].nsge, reads[k].raddr,
                                          reads[k].rkey, reads[k].wr_id);
        if (rc)
            return rc;
        *posted_p = k + 1;
    }
    return 0;
}
static inline int pf_net_poll(struct pf_net_qp *qp, struct pf_net_cqe *out, size_t max,
                              uint64_t timeout_ms)
{
    return qp->net->ops->poll(qp, out, max, timeout_ms);
}
static inline void pf_net_qp_invalidate(struct pf_net_qp *qp)
{
    if (qp)
        qp->net->ops->qp_invalidate(qp);
}
static inline void pf_net_qp_destroy(struct pf_net_qp *qp)
{
    if (qp)
        qp->net->ops->qp_destroy(qp);
}
static inline void pf_net_close(struct pf_net *n)
{
    if (n)
        n->ops->close(n);
}

#endif

/* Private interface of the verbs NET backend, for its unit tests.
 *
 * verbs.c reaches rdma-core only through struct pf_verbs_api (the production table wraps the
 * real ibv_* functions, including the static inline ones such as ibv_post_send), so tests
 * can run the backend against a fake HCA: GID and port selection, QP state transitions,
 * invalidate draining and error translation, on machines without an RDMA device. */
#ifndef PF_HW_VERBS_INTERNAL_H
#define PF_HW_VERBS_INTERNAL_H

#include <stdint.h>

#include <infiniband/verbs.h>

#include "pf/hal_net.h"

#define PF_VERBS_SQ_DEPTH  128 /* send queue WRs per QP (reference §7.3) */
#define PF_VERBS_MAX_SGE   16
#define PF_VERBS_RD_ATOMIC 16
#define PF_VERBS_MIN_RNR   12
#define PF_VERBS_HOP_LIMIT 64
#define PF_VERBS_EP_LEN    40
/* Endpoint blob, version 2 (little-endian): 0 magic "PFVE", 4 version, 5 active MTU,
 * 6 link layer, 7 GID type (IBV_GID_TYPE_*), 8..23 GID, 24 QPN, 28 PSN, 32 LID,
 * 34 responder resources (the max_dest_rd_atomic this QP accepts), 35 GID family
 * (4 IPv4-mapped, 6 IPv6, 0 InfiniBand), 36..39 zero. */
#define PF_VERBS_EP_RD_ATOM 34
#define PF_VERBS_EP_FAMILY  35
#define PF_VERBS_EP_GIDTYPE 7
#define PF_VERBS_DRAIN_MS   5000 /* invalidate: wait this long for flushes, then destroy */
/* poll: CQ polls on an empty CQ before arming it and sleeping on the completion channel (a
 * bounded spin: about 1-2 us of ibv_poll_cq on mlx5; counted, not timed) */
#define PF_VERBS_SPIN_POLLS 32
/* Shared CQs (verbs_cq.c): the QPs of a NIC share CQs, each serving at most PF_VERBS_CQ_QPS
 * QPs (fewer when the device's max_cqe is small) and sized PF_VERBS_QP_CQE entries per QP it
 * may serve: a QP's send queue plus its (never posted) 1-entry recv queue, so the CQ holds
 * every completion its QPs can have outstanding and cannot overrun (ibv_create_cq(3)). */
#define PF_VERBS_CQ_QPS     16
#define PF_VERBS_QP_CQE     (PF_VERBS_SQ_DEPTH + 1)
#define PF_VERBS_POST_CHAIN 32 /* WRs linked into one ibv_post_send (post_reads) at most */

/* Soft-RoCE (rdma_rxe) reports this vendor ID and, unlike the IB spec and mlx5, takes a
 * retry_cnt of 7 to mean "retry forever": a READ to a peer QP that went to the error state
 * then never completes. The backend uses 6 there (measured in the rxe guest, ci/rxe-vm.sh:
 * 470 retransmissions in 30 s and no error with 7; an error completion with 6). */

#define PF_VERBS_SOFT_ROCE_VENDOR 0xffffffu
#define PF_VERBS_SOFT_ROCE_RETRY  6

struct pf_verbs_api {
    struct ibv_device **(*get_device_list)(int *num_devices);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    /* 0, or an errno (ENODATA: empty entry) */
    int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *entry);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx,
                                struct ibv_comp_channel *ch, int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
    int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
    /* Async events (ibv_get_async_event(3)): 0 and an event to acknowledge, or -1 with
     * errno EAGAIN when none is pending (the context's async_fd is made non-blocking at
     * open, as the man page's example does to poll it). Optional. */
    int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
    void (*ack_async_event)(struct ibv_async_event *ev);
    /* State of the net device behind a RoCE GID (ibv_gid_entry.ndev_ifindex):
     * 1 up, 0 down, -1 unknown (no such index, or 0: no net device). */
    int (*ifindex_up)(uint32_t ifindex);
    /* RLIMIT_MEMLOCK soft limit in bytes (UINT64_MAX: unlimited); 0 or -errno. */
    int (*memlock_limit)(uint64_t *bytes_p);
    /* Whether the process has CAP_IPC_LOCK in its effective set (pinning is then not
     * charged against RLIMIT_MEMLOCK: the kernel's ib_umem_get). */
    bool (*cap_ipc_lock)(void);
    const char *sysfs_root; /* "/sys" */
    uint64_t drain_ms;      /* invalidate's flush deadline (PF_VERBS_DRAIN_MS) */
};

/* The rdma-core table used by the registered "verbs" backend. */
extern const struct pf_verbs_api pf_verbs_real_api;

/* Opens the backend on an explicit API table. Same contract as the backend's open:
 * -ENODEV when there is no RDMA device or a named one is missing, -ENETDOWN when a device
 * has no ACTIVE port, -EINVAL without NICs. */
int pf_verbs_open_api(const struct pf_verbs_api *api, const struct pf_net_config *cfg,
                      struct pf_net **n_p);

/* What the operator asked of the GID (--rdma-gid-index, --rdma-gid-subnet). */
struct pf_verbs_gid_rule {
    int index;       /* -1: choose */
    int family;      /* 0: any subnet; 4 or 6: the GID must lie in net/prefix */
    uint8_t net[16]; /* IPv4 in net[0..3], IPv6 in net[0..15] */
    int prefix;
};

/* Parses "10.0.0.0/24" or "2001:db8::/64" into r (index untouched). 0 or -EINVAL. */
int pf_verbs_parse_subnet(const char *cidr, struct pf_verbs_gid_rule *r);

/* GID choice over one port's table (entries with an all-zero GID are empty; up[i] is the
 * state of entry i's net device: 1 up, 0 down, -1 unknown, counted as up; up may be NULL).
 * With rule->index >= 0 that entry (it must be non-empty and inside rule's subnet). Else the
 * best-ranked entry inside the subnet (if any), first index on ties:
 *   1 RoCE v2, IPv4-mapped, device up   2 RoCE v2, global IPv6, device up
 *   3 InfiniBand GID                     4 RoCE v1, not link-local, device up
 *   5 RoCE v2 link-local, device up      6 anything else on an up device   7 anything else
 * and on equal rank an entry on the net device of entry 0 (the port's default GID, on the
 * port's own netdev) before one on a VLAN/bond/macvlan device stacked on it (as NCCL's
 * ncclIbGetGidIndex prefers RoCE v2 of the wanted family, NCCL_IB_ADDR_FAMILY defaulting to
 * IPv4, and skips link-local GIDs). Returns the index or -ENOENT. */
int pf_verbs_pick_gid(const struct ibv_gid_entry *ents, const int8_t *up, int n,
                      const struct pf_verbs_gid_rule *rule);

/* The GID's family as the endpoint carries it: 4 (IPv4-mapped), 6 (IPv6), 0 (IB type). */
int pf_verbs_gid_family(const struct ibv_gid_entry *e);

/* Work-completion status -> -errno (0 for success, -ECANCELED for flushed WRs,
 * -EREMOTEIO for remote access/operation errors, -ETIMEDOUT for retry exhaustion). */
int pf_verbs_wc_errno(enum ibv_wc_status st);

/* ---- shared by verbs.c (devices, regions, ops table) and verbs_qp.c (queue pairs) */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "pf/common.h"
#include "pf/util.h"

#define VERBS_EP_MAGIC   0x45564650u /* "PFVE" */
#define VERBS_EP_VERSION 2u
#define VERBS_MAX_NICS   16
#define VERBS_MAX_READ   (1ull << 31)

struct verbsnic;

struct verbsmr {
    struct pf_net_mr base;
    struct verbsnic *nic;
    struct ibv_mr *mr;
    unsigned access;
    struct verbsmr *next;
};

struct verbsnic {
    struct verbsnet *net;
    char name[64];
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    uint8_t port;
    struct ibv_port_attr port_attr;
    union ibv_gid gid;
    int gid_index;
    uint8_t gid_type;   /* IBV_GID_TYPE_* */
    uint8_t gid_family; /* pf_verbs_gid_family */
    int numa;
    int max_sge;
    int rd_resp;      /* responder resources: incoming READs outstanding (max_qp_rd_atom) */
    int rd_init;      /* initiator depth: our READs outstanding (max_qp_init_rd_atom) */
    uint64_t max_msg; /* port max_msg_sz, at most VERBS_MAX_READ */
    int retry_cnt;    /* RC retry count for this device (see PF_VERBS_SOFT_ROCE_VENDOR) */
    pthread_rwlock_t mr_lock;
    struct verbsmr *mrs;
    _Atomic uint64_t async_events; /* async events read so far */
    _Atomic bool port_err;         /* the last port event was IBV_EVENT_PORT_ERR */
    /* Port and GID chosen (port, port_attr, gid*, max_msg are set, then never change).
     * false for a NIC that had no ACTIVE port at open: pf_verbs_nic_ready retries at each
     * qp_create (each handshake) under up_mu and sets it once the port is ACTIVE. */
    _Atomic bool ready;
    pthread_mutex_t up_mu;
    int nports;  /* phys_port_cnt */
    int max_cqe; /* device max_cqe (ibv_query_device(3)) */
    int cq_qps;  /* QPs one CQ serves: min(PF_VERBS_CQ_QPS, max_cqe / PF_VERBS_QP_CQE), >= 1 */
    pthread_mutex_t cq_mu; /* cqs, each CQ's nres */
    struct verbscq *cqs;
    unsigned cqs_made; /* completion vector of the next CQ: cqs_made % num_comp_vectors */
};

/* 0 when the NIC has an ACTIVE port and a GID (choosing them now, under up_mu, for a NIC
 * that was down until now: the rail comes back), -ENETDOWN while it has none, or the GID
 * choice's error (-ENOENT). */
int pf_verbs_nic_ready(struct verbsnic *nic);

/* Reads and acknowledges the NIC's pending async events, logging each (port and GID changes,
 * QP and CQ errors, device fatal); called at each qp_create and nic_info. */
void pf_verbs_drain_async(struct verbsnic *nic);

struct verbsnet {
    struct pf_net base;
    const struct pf_verbs_api *api;
    struct pf_net_rdma_opts opts;
    struct pf_verbs_gid_rule rule; /* from opts, for NICs whose GID is chosen late */
    int nnics;
    struct verbsnic *nics;
};

enum verbsqp_state { VQ_INIT, VQ_RTS, VQ_ERR };

struct verbsout {
    uint64_t wr_id, len;
};

/* A CQ shared by up to cap QPs of one NIC, with its completion channel. Whoever polls one of
 * its QPs drains it for all of them: each completion goes to its QP's software queue by
 * wc.qp_num (pf_verbs_cq_drain), so a QP's poll sees only its own. Lock order: mu, then a
 * QP's mu. */
struct verbscq {
    struct verbsnic *nic;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    int entries;        /* asked of ibv_create_cq: cap * PF_VERBS_QP_CQE (<= max_cqe) */
    int cap;            /* QPs it may serve */
    int nres;           /* QPs on it or being created (nic->cq_mu) */
    pthread_mutex_t mu; /* ibv_poll_cq, arming, the channel's events, qps */
    bool armed;         /* ibv_req_notify_cq called, its event not yet taken */
    int nqps;
    struct verbsqp *qps[PF_VERBS_CQ_QPS];
    struct verbscq *next; /* nic->cqs */
};

struct verbsqp {
    struct pf_net_qp base;
    struct verbsnic *nic;
    const struct pf_verbs_api *api;
    struct verbscq *vcq; /* shared with other QPs of the NIC */
    struct ibv_qp *qp;
    uint32_t qpn; /* qp->qp_num, kept: qp is NULL once destroyed by invalidate */
    uint32_t psn;
    uint16_t lid; /* the port's LID and active MTU when this QP was created (re-queried */
    uint8_t mtu;  /* at every qp_create, i.e. at every handshake) */
    int evfd;
    pthread_mutex_t mu;
    int state;
    bool waiting;                 /* its poll sleeps: a drain that queues for it writes evfd */
    uint32_t out_head, out_count; /* posted, not completed (post order) */
    struct verbsout out[PF_VERBS_SQ_DEPTH];
    uint32_t sw_head, sw_count; /* completed, not yet returned by poll */
    struct pf_net_cqe sw[PF_VERBS_SQ_DEPTH];
};

static inline struct verbsnet *verbs_of(struct pf_net *n)
{
    return pf_container_of(n, struct verbsnet, base);
}

static inline struct verbsqp *verbs_qp(struct pf_net_qp *q)
{
    return pf_container_of(q, struct verbsqp, base);
}

/* ibv functions return an errno (positive), or -1 with errno set, depending on provider. */
static inline int verbs_rc(int rc)
{
    if (rc == 0)
        return 0;
    if (rc > 0)
        return -rc;
    return errno ? -errno : -EIO;
}

/* Queue pairs (verbs_qp.c): the pf_net_ops QP entries, as documented in verbs.c. */
int pf_verbs_qp_create(struct pf_net *n, int i, struct pf_net_qp **qp_p);
int pf_verbs_qp_local_endpoint(struct pf_net_qp *qpb, void *buf, size_t cap, size_t *len_p);
int pf_verbs_qp_connect(struct pf_net_qp *qpb, const void *ep, size_t len);
int pf_verbs_ep_check(struct pf_net_qp *qpb, const void *ep, size_t len, char *why, size_t whylen);
int pf_verbs_post_read(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                       uint64_t raddr, uint32_t rkey, uint64_t wr_id);
int pf_verbs_poll(struct pf_net_qp *qpb, struct pf_net_cqe *out, size_t max, uint64_t timeout_ms);
void pf_verbs_qp_invalidate(struct pf_net_qp *qpb);
void pf_verbs_qp_destroy(struct pf_net_qp *qpb);
int pf_verbs_post_reads(struct pf_net_qp *qpb, const struct pf_net_read *reads, size_t n,
                        size_t *posted_p);

/* Shared CQs (verbs_cq.c). */
/* A CQ of nic with room for one more QP (an existing one, else a new one with its channel),
 * reserved for it. 0 or -errno. */
int pf_verbs_cq_get(struct verbsnic *nic, struct verbscq **cq_p);
/* Gives the reservation back; the last one destroys the CQ. */
void pf_verbs_cq_put(struct verbscq *cq);
/* Adds the created QP (q->qpn set) to its CQ's routing table / takes it out (before free). */
void pf_verbs_cq_attach(struct verbscq *cq, struct verbsqp *q);
void pf_verbs_cq_detach(struct verbscq *cq, struct verbsqp *q);
/* Polls the CQ empty, each completion into its QP's software queue (waking that QP's
 * sleeping poller). 0 or -EIO (ibv_poll_cq failed). */
int pf_verbs_cq_drain(struct verbscq *cq);
/* Arms the CQ unless it is armed: 1 when it armed it now (poll once more before sleeping:
 * a completion may have raced the arming), 0 when it was, or -errno. */
int pf_verbs_cq_arm(struct verbscq *cq);
/* Takes a pending channel event (non-blocking) and wakes the other sleeping pollers of the
 * CQ so one of them re-arms it. */
void pf_verbs_cq_event(struct verbscq *cq, struct verbsqp *self);
/* A work completion as the QP's record, matched with (and removed from) its posted WRs;
 * an error completion moves the QP to VQ_ERR. Caller holds q->mu. */
struct pf_net_cqe pf_verbs_take(struct verbsqp *q, const struct ibv_wc *wc);

#endif

/* Private structures of the p2p module. */
#ifndef PF_P2P_INTERNAL_H
#define PF_P2P_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/block.h"
#include "pf/hal_net.h"
#include "pf/htable.h"
#include "pf/list.h"
#include "pf/metrics.h"
#include "pf/engine.h"
#include "pf/p2p.h"

#define P2P_ADDR_MAX    256
#define P2P_REGIONS_MAX 1024
#define P2P_NIC_MAX     16
#define P2P_ERRLEN      320

/* ---- connections (conn.c) ---- */

/* A peer's registered region on one NIC (from its handshake metadata). */
struct p2p_region {
    uint64_t addr, len;
    uint32_t rkey;
};

/* Rail states of a connection (p2p_conn.rail[k], k = this node's NIC index; the rail is
 * NIC k here paired with the peer's NIC k, docs/net.md "Per-NIC health"). */
enum { P2P_RAIL_UP = 0, P2P_RAIL_DOWN = 1, P2P_RAIL_DEAD = 2 };

/* One RC connection to a peer: qps_per_peer QPs per NIC (index nic * qpn + j), paired with
 * the peer's QP of the same index; a rail that was not paired at the handshake (down on
 * either side, or past the peer's NIC count) has no QPs (NULL). Fields below `busy` are
 * immutable after connect. */
struct p2p_conn {
    struct p2p_peer *peer;
    uint64_t id;   /* for logs */
    bool outgoing; /* we initiated the handshake */
    /* under p2p.conn_mu */
    bool dead; /* no longer in the table: never handed out again */
    int refs;  /* the table's (while !dead) + one per lease */
    bool *busy;
    uint8_t *rail;         /* per NIC: P2P_RAIL_* (DOWN fixed at connect; UP -> DEAD) */
    uint64_t last_used_ns; /* installed, or a lease given back (monotonic) */
    /* immutable */
    size_t nqps;
    struct pf_net_qp **qps;
    char node_id[PF_UUID_STR_LEN]; /* the peer's incarnation ("" when it sent none) */
    struct p2p_region **regions;   /* per NIC, sorted by addr */
    size_t *nregions;
};

/* Connection state of one peer address. Entries live until the module is destroyed. */
struct p2p_peer {
    struct pf_hnode node;
    char *addr;
    struct p2p_conn *out; /* connection this node initiated */
    struct p2p_conn *in;  /* connection the peer initiated */
    bool connecting;      /* an outgoing handshake is in flight (single-flight) */
    uint64_t down_until;  /* a handshake failed: no new attempt before (monotonic ns) */
};

/* The QPs of one connection a fetch holds exclusively (posting and polling). */
struct p2p_lease {
    struct p2p_conn *conn;
    bool fresh; /* the acquiring fetch made the handshake itself */
    size_t nqps;
    size_t idx[64];            /* indices into conn->qps */
    struct pf_net_qp *qps[64]; /* the same QPs */
};

/* ---- READ engine (xfer.c) ---- */

struct p2p_read {
    void *local;
    uint64_t len;
    uint32_t lkey; /* of `nic` */
    uint64_t raddr;
    uint32_t rkey; /* of `nic` */
    int nic;
    uint32_t seg0, nseg;             /* the caller's bookkeeping (segments this READ carries) */
    const struct pf_net_digest *dig; /* receive-path digests asked for (NULL: none) */
};

struct p2p_xfer {
    struct pf_net_qp *const *qps; /* qps[i]->nic is its NIC */
    size_t nqps;
    uint64_t deadline_ns;      /* CLOCK_MONOTONIC */
    unsigned depth;            /* outstanding READs per QP (<= PF_P2P_QP_DEPTH) */
    unsigned rotate;           /* first QP to post to */
    const _Atomic bool *abort; /* optional: checked between rounds (-ECANCELED) */
    /* optional: READ i completed successfully (its bytes are in place); runs on the calling
     * thread between polls, so the caller can work on landed data while the rest flows */
    void (*on_read)(void *ctx, size_t i, bool digested); /* digested: the cqe's flag */
    void *ctx;
    /* optional rail failover (docs/net.md "Per-NIC health"): when a QP fails with a transport
     * error (an error completion other than a remote access error, a broken-QP poll, a post
     * refused with -ENOTCONN), only that QP is invalidated and the transfer goes on without
     * it: its unfinished READs, and those queued for a NIC that has no QP left, are handed to
     * the NICs that still have one, round-robin, after reroute(ctx, i, nic) rewrote reads[i]
     * (lkey, rkey, nic: the caller owns the array) for NIC nic (0, or -errno: it cannot go
     * there, and the transfer fails). NULL: any failure fails the transfer. */
    int (*reroute)(void *ctx, size_t i, int nic);
    /* results */
    size_t posted, completed;
    uint64_t bytes;
    uint64_t failed; /* bit q: QP q failed and the transfer went on without it (reroute) */
};

/* Runs every READ to completion. READ i of NIC k goes to whichever QP of NIC k has room
 * (at most depth outstanding each). With reroute, a failed QP is left out (above) and the
 * transfer fails only when no QP is left. Returns 0 when every READ completed successfully;
 * otherwise -ETIMEDOUT (deadline, and only then), -ECANCELED (abort flag), the first failed
 * completion's status (-EHOSTUNREACH for a completion with -ETIMEDOUT: the NIC's transport
 * retries were exhausted, the peer is unreachable), a post error, -EPROTO (a completion nobody
 * posted) or -EINVAL (a READ of a NIC without QP; nothing is posted then). On every error return,
 * pf_net_qp_invalidate has returned for every QP of the set: no READ can write its local buffer any
 * more. */
int p2p_xfer_run(struct p2p_xfer *x, const struct p2p_read *reads, size_t n);

/* ---- verification workers (verify.c) ---- */

/* The verification jobs of one fetch: pending counts jobs submitted and not finished. */
struct p2p_vgroup {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t pending;
};

/* One job: fn(ctx, arg) on a worker (or inline); owned by the submitter, untouched after
 * the group drained. */
struct p2p_vjob {
    struct p2p_vgroup *g;
    void (*fn)(void *ctx, size_t arg);
    void *ctx;
    size_t arg;
};

struct p2p_vq;

/* ---- the module ---- */

struct p2p_release {
    struct pf_list link;
    char peer[P2P_ADDR_MAX];
    char session[PF_P2P_SESSION_ID_MAX + 1];
};

struct p2p_chan; /* default transport: cached gRPC channel per peer */

struct pf_p2p {
    struct pf_p2p_config cfg;
    char backend[32];
    struct pf_engine *engine;
    struct pf_pool *pool;
    struct pf_cache *cache;
    struct pf_net *net;
    int nnics;
    uint32_t qpn;
    struct pf_net_nic_info nics[P2P_NIC_MAX];
    char node_id[PF_UUID_STR_LEN];

    /* local pool regions, registered on every NIC: mrs[nic * nregions + r] */
    size_t nregions;
    void **rbase;
    uint64_t *rlen;
    int *rnuma;
    struct pf_net_mr **mrs;
    uint32_t *lkey, *rkey; /* copies of the keys, valid until destroy */

    struct pf_p2p_locks *locks;
    uint64_t lock_timeout_ms;
    uint64_t max_read;        /* merged READs stay below this (PEGAFLOW_P2P_MAX_READ) */
    bool kv_pairs;            /* a slot's K and V may share a READ past max_read (default) */
    _Atomic unsigned read_rr; /* where the next fetch's NIC round-robin starts */

    const struct pf_p2p_transport *tr;
    struct pf_p2p_transport grpc_tr;
    pthread_mutex_t chan_mu;
    struct p2p_chan *chans;

    /* requester */
    struct pf_meta_client *meta;
    char self_addr[P2P_ADDR_MAX];
    _Atomic bool fetch_enabled;
    _Atomic bool stopping;
    _Atomic int fetches_inflight;

    /* connection table */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;
    struct pf_htable peers;
    uint64_t next_conn_id;
    uint64_t nconns, nqps; /* live, under conn_mu */

    /* req_id blacklist */
    pthread_mutex_t bl_mu;
    struct pf_htable bl;
    /* holder health (fetch.c): recent failures and fetches in flight per holder address */
    pthread_mutex_t hold_mu;
    struct pf_htable holders;

    /* the p2p thread: lock releases, expiry */
    pthread_t thr;
    bool thr_started;
    pthread_mutex_t wk_mu;
    pthread_cond_t wk_cv;
    struct pf_list rel_q;
    bool wk_stop;
    uint64_t rel_queued, rel_done; /* under wk_mu */
    int meta_users;                /* discovery calls in flight (under wk_mu) */
    bool stopped;

    /* stats */
    _Atomic uint64_t st_hs_out, st_hs_in, st_rel_sent, st_rel_failed, st_fetches, st_blocks,
        st_bytes, st_fail, st_integrity;
    _Atomic uint64_t st_rail_fail; /* rails marked dead after a failed READ (conn.c) */

    /* metrics */
    struct pf_metric *m_fetch, *m_dur, *m_bytes, *m_qps, *m_integrity;
    struct pf_metric_child *c_ok, *c_partial, *c_error, *c_timeout, *c_integrity;
    /* verification workers: one queue per NUMA node of the pool (none: inline) */
    struct p2p_vq *vq;
    size_t nvq;

    struct pf_metric *m_verified; /* pegaflow_p2p_verified_blocks_total{path} */
    struct pf_metric_child *c_ver_receive, *c_ver_worker;
    struct pf_metric *m_serve_ssd; /* pegaflow_p2p_serve_ssd_blocks_total{result} */
    struct pf_metric *m_rail_fail; /* pegaflow_rdma_rail_failures_total{nic} */
    struct pf_metric_child *c_serve_ssd_ok, *c_serve_ssd_failed;
};

/* conn.c */
int p2p_conn_acquire(struct pf_p2p *p, const char *peer, uint64_t deadline_ns, struct p2p_lease *l,
                     char *err, size_t errlen);
/* Gives the lease's QPs back (the connection stays usable). */
void p2p_lease_return(struct pf_p2p *p, struct p2p_lease *l);
/* Closes connections no lease holds and none was given back for conn_idle_ms (QPs and their
 * per-connection memory are not free on either side; a peer that still READs over the other
 * end sees a stale connection and reconnects once). Called by housekeeping. */
void p2p_conns_evict_idle(struct pf_p2p *p);
/* The lease's QPs in failed (bit i: l->qps[i]) had an error completion that the transfer
 * survived by re-posting on the other rails: their rails (NICs) are marked dead in the
 * connection (later leases skip them until a handshake re-establishes them), the QPs are
 * invalidated, the lease is given back. When no rail of the connection is left, it is
 * dropped (the next fetch handshakes again). */
void p2p_lease_fail_rails(struct pf_p2p *p, struct p2p_lease *l, uint64_t failed);
/* The connection failed: it leaves the table, every QP is invalidated, the lease is given
 * back. Returns only after the invalidation. */
void p2p_lease_fail(struct pf_p2p *p, struct p2p_lease *l);
/* Drops every connection to peer (it restarted or the link broke). */
void p2p_peer_drop(struct pf_p2p *p, const char *peer);
/* Finds the rkey of [addr, addr+len) among the peer's regions on nic; false if outside. */
/* conn_meta.c: regions by address (qsort); this node's metadata for the QPs of c (the rails
 * of c that are UP, the others empty; *buf_p is malloc'ed); a peer's unpacked and validated
 * (pf_p2p_meta_validate) into *m_p, or -errno with err filled. */
int p2p_region_cmp(const void *a, const void *b);
int p2p_meta_build(struct pf_p2p *p, const struct p2p_conn *c, uint8_t **buf_p, size_t *len_p);
int p2p_meta_parse(struct pf_p2p *p, const ProtobufCBinaryData *b,
                   Pegaflow__HandshakeMetadata **m_p, char *err, size_t errlen);
bool p2p_conn_rkey(const struct p2p_conn *c, int nic, uint64_t addr, uint64_t len,
                   uint32_t *rkey_p);
/* Serves RdmaHandshake: *meta_p (malloc'ed, *len_p bytes) is this node's metadata. */
int p2p_serve_handshake(struct pf_p2p *p, const Pegaflow__RdmaHandshakeRequest *r, uint8_t **meta_p,
                        size_t *len_p, char *err, size_t errlen);
/* Drops every connection (shutdown). */
void p2p_conns_drop_all(struct pf_p2p *p);
void p2p_conns_free(struct pf_p2p *p);

/* fetch.c: the tier (struct pf_tier contracts in pf/engine.h) */
/* Whether remote fetch may run for req_id now: enabled, not stopping, the MetaServer client
 * has a session, req_id not blacklisted. Never blocks. */
bool p2p_fetch_available(struct pf_p2p *p, const char *req_id);
int p2p_tier_discover(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                      struct pf_tier_source *src, size_t max);
void *p2p_tier_discover_start(void *ctx, const char *req_id, const struct pf_block_key *keys,
                              size_t n);
int p2p_tier_discover_finish(void *ctx, void *op, struct pf_tier_source *src, size_t max);
size_t p2p_tier_fetch_from(void *ctx, const char *req_id, const struct pf_tier_source *src,
                           const struct pf_block_key *keys, size_t n, struct pf_block **out,
                           const char **why_p);
size_t p2p_tier_fetch(void *ctx, const char *req_id, const struct pf_block_key *keys, size_t n,
                      bool all_or_nothing, struct pf_block **out);
/* discover.c: blacklist, holder health, discovery */
/* A fetch's discovery (fetch.c step 1): QueryPrefixBlocks for keys[0..n), this node
 * excluded, the best holder into peer and its usable prefix (<= n, <= PF_P2P_MAX_HASHES)
 * into *want_p; with all_or_nothing only a holder of all n, polled for up to
 * full_prefix_wait_ms. 0, -ENOENT (none; MetaServer errors too), -ECANCELED (stopping). */
int p2p_discover_holder(struct pf_p2p *p, const char *req_id, const struct pf_block_key *keys,
                        size_t n, bool all_or_nothing, char *peer, size_t peerlen, size_t *want_p);
void p2p_blacklist_add(struct pf_p2p *p, const char *req_id);
/* Whether holder addr is inside its down window at now (clock ns); *load_p its fetches in
 * flight from this node. */
bool p2p_holder_state(struct pf_p2p *p, const char *addr, uint64_t now, uint32_t *load_p);
/* d = +1 / -1 fetches from addr in flight; failed: its down window starts now. */
void p2p_holder_note(struct pf_p2p *p, const char *addr, int d, bool failed);
size_t p2p_blacklist_gc(struct pf_p2p *p);
void p2p_blacklist_free(struct pf_p2p *p);

/* verify.c. start: the workers (cfg.verify_threads per NUMA node of the pool regions; none
 * when < 0 or integrity is off). stop: closes the queues and joins the workers (jobs
 * submitted afterwards run inline); free: stop + memory. async: whether workers run. */
int p2p_verify_start(struct pf_p2p *p);
void p2p_verify_stop(struct pf_p2p *p);
void p2p_verify_free(struct pf_p2p *p);
bool p2p_verify_async(const struct pf_p2p *p);
int p2p_vgroup_init(struct p2p_vgroup *g);
void p2p_vgroup_destroy(struct p2p_vgroup *g);
/* Queues j (j->g set) for the workers of NUMA node numa (else any); runs it inline when no
 * worker can take it. Never blocks on another job. */
void p2p_verify_submit(struct pf_p2p *p, int numa, struct p2p_vjob *j);
/* Returns when every job of g finished; runs queued jobs itself meanwhile. */
void p2p_verify_wait(struct pf_p2p *p, struct p2p_vgroup *g);

/* p2p.c */
/* Queues one ReleaseTransferLock for the p2p thread (sent synchronously after stop). */
void p2p_release_lock(struct pf_p2p *p, const char *peer, const char *session);
/* Brackets a MetaServer query: false once stopping (do not query); pf_p2p_stop waits
 * until every bracketed query returned, so the MetaServer client can be destroyed after. */
bool p2p_meta_enter(struct pf_p2p *p);
void p2p_meta_exit(struct pf_p2p *p);
/* TSan happens-before annotations on every pool region (no-ops otherwise): release after
 * handing block addresses to a peer, acquire before dropping the references that kept the
 * memory a peer may have READ (the NET backend's serving side does the opposite). */
void p2p_hb_regions(struct pf_p2p *p, bool release);
/* Local region index containing [addr, addr+len), or -1. */
int p2p_local_region(const struct pf_p2p *p, const void *addr, uint64_t len);

/* serve.c: the gRPC transport */
int p2p_grpc_call(void *ctx, const char *peer, enum pf_p2p_method m, const ProtobufCMessage *req,
                  uint64_t timeout_ms, ProtobufCMessage **resp_p, char *err, size_t errlen);
int p2p_grpc_query_prefix(void *ctx, const char *ns, const struct pf_meta_hash *hashes, size_t n,
                          uint64_t timeout_ms, struct pf_meta_prefix **res_p, size_t *nres_p);
int p2p_grpc_query_start(void *ctx, const char *ns, const struct pf_meta_hash *hashes, size_t n,
                         uint64_t timeout_ms, void **op_p);
int p2p_grpc_query_finish(void *ctx, void *op, struct pf_meta_prefix **res_p, size_t *nres_p);
void p2p_grpc_free(struct pf_p2p *p);

/* ---- handshake address checks (peer_auth.c) ---- */

/* The IPs addr's host ("ip:port" or "name:port") stands for (up to max). 0, -EINVAL,
 * -EHOSTUNREACH. */
int p2p_host_ips(const char *addr, char (*ips)[PF_AUTH_IP_MAX], size_t max, size_t *n_p);
/* p2p_host_ips for a numeric address only (getaddrinfo AI_NUMERICHOST: no name lookup), for
 * what a caller sends: -EINVAL for a host name. */
int p2p_numeric_ips(const char *addr, char (*ips)[PF_AUTH_IP_MAX], size_t max, size_t *n_p);
/* 0 when every endpoint of m names one of hosts (or the backend does not connect by
 * address, or same_host and it is an address of this host); -EACCES (or -EINVAL for a
 * malformed endpoint) with a message naming it. who names the peer in the message. */
int p2p_endpoints_check(struct pf_p2p *p, const Pegaflow__HandshakeMetadata *m,
                        const char (*hosts)[PF_AUTH_IP_MAX], size_t nhosts, bool same_host,
                        const char *who, char *err, size_t errlen);
/* Serving side: requester_id and every endpoint must be addresses the caller proved (ids:
 * pf_rpc_call_identities). 0, -EACCES or -EINVAL with a message. */
int p2p_handshake_authorize(struct pf_p2p *p, const Pegaflow__RdmaHandshakeRequest *r,
                            const char (*ids)[PF_AUTH_IP_MAX], size_t nids, char *err,
                            size_t errlen);

#endif

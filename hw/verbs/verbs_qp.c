/* verbs NET backend, queue pairs (design: the header comment of verbs.c): RC QP creation,
 * the endpoint blob, INIT -> RTR -> RTS, post_read, poll, invalidate and destroy. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define PF_LOG_MOD "verbs"
#include "pf/clock.h"
#include "pf/hal.h"
#include "pf/log.h"
#include "pf/util.h"

#include "verbs_internal.h"

/* ---------------------------------------------------------------- QPs */

int pf_verbs_qp_create(struct pf_net *n, int i, struct pf_net_qp **qp_p)
{
    struct verbsnet *v = verbs_of(n);
    const struct pf_verbs_api *api = v->api;
    if (i < 0 || i >= v->nnics)
        return -EINVAL;
    struct verbsnic *nic = &v->nics[i];
    /* the port as it is now, not as it was at open: a link that went down since fails this
     * handshake by name; a LID the subnet manager reassigned or a changed MTU is used */
    pf_verbs_drain_async(nic);
    int rrc = pf_verbs_nic_ready(nic); /* a NIC down since open: its port may be back */
    if (rrc) {
        pf_log_ratelimited(PF_LOG_WARN, 1000, "verbs %s: %s: no new QPs on this NIC", nic->name,
                           rrc == -ENETDOWN ? "no ACTIVE port" : strerror(-rrc));
        return rrc;
    }
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    int prc = verbs_rc(api->query_port(nic->ctx, nic->port, &pa));
    if (prc || pa.state != IBV_PORT_ACTIVE) {
        pf_log_ratelimited(PF_LOG_WARN, 1000, "verbs %s: port %u is %s: no new QPs on this NIC",
                           nic->name, nic->port,
                           prc ? strerror(-prc) : ibv_port_state_str(pa.state));
        return -ENETDOWN;
    }
    struct verbsqp *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    q->lid = pa.lid;
    q->mtu = (uint8_t)pa.active_mtu;
    q->nic = nic;
    q->api = api;
    q->base.net = n;
    q->base.nic = i;
    int rc = pf_random_bytes(&q->psn, sizeof(q->psn));
    if (rc)
        goto err_free;
    q->psn &= 0xffffff;
    q->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (q->evfd < 0) {
        rc = -errno;
        goto err_free;
    }
    rc = pf_verbs_cq_get(nic, &q->vcq);
    if (rc)
        goto err_evfd;
    struct ibv_qp_init_attr ia = {
        .send_cq = q->vcq->cq,
        .recv_cq = q->vcq->cq,
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
        .cap = {.max_send_wr = PF_VERBS_SQ_DEPTH,
                .max_recv_wr = 1,
                .max_send_sge = (uint32_t)nic->max_sge,
                .max_recv_sge = 1},
    };
    errno = 0;
    q->qp = api->create_qp(nic->pd, &ia);
    if (!q->qp) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: create RC QP: %s", nic->name, strerror(-rc));
        goto err_cq;
    }
    q->qpn = q->qp->qp_num;
    pthread_mutex_init(&q->mu, NULL);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .pkey_index = (uint16_t)v->opts.pkey_index,
                            .port_num = nic->port,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                               IBV_ACCESS_REMOTE_WRITE};
    rc = verbs_rc(api->modify_qp(
        q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    if (rc) {
        pf_error("verbs %s: QP to INIT: %s", nic->name, strerror(-rc));
        goto err_qp;
    }
    q->state = VQ_INIT;
    pf_verbs_cq_attach(q->vcq, q);
    *qp_p = &q->base;
    return 0;

err_qp:
    api->destroy_qp(q->qp);
    pthread_mutex_destroy(&q->mu);
err_cq:
    pf_verbs_cq_put(q->vcq);
err_evfd:
    close(q->evfd);
err_free:
    free(q);
    return rc;
}

int pf_verbs_qp_local_endpoint(struct pf_net_qp *qpb, void *buf, size_t cap, size_t *len_p)
{
    struct verbsqp *q = verbs_qp(qpb);
    if (!buf || cap < PF_VERBS_EP_LEN)
        return -ENOSPC;
    if (!q->qp) /* destroyed by an invalidate whose flushes never came */
        return -ENOTCONN;
    uint8_t *p = buf;
    memset(p, 0, PF_VERBS_EP_LEN);
    uint32_t magic = VERBS_EP_MAGIC, qpn = q->qp->qp_num, psn = q->psn;
    uint16_t lid = q->lid;
    for (int k = 0; k < 4; k++) {
        p[k] = (uint8_t)(magic >> (8 * k));
        p[24 + k] = (uint8_t)(qpn >> (8 * k));
        p[28 + k] = (uint8_t)(psn >> (8 * k));
    }
    p[4] = VERBS_EP_VERSION;
    p[5] = q->mtu;
    p[6] = q->nic->port_attr.link_layer;
    p[PF_VERBS_EP_GIDTYPE] = q->nic->gid_type;
    memcpy(p + 8, q->nic->gid.raw, 16);
    p[32] = (uint8_t)lid;
    p[33] = (uint8_t)(lid >> 8);
    p[PF_VERBS_EP_RD_ATOM] = (uint8_t)q->nic->rd_resp;
    p[PF_VERBS_EP_FAMILY] = q->nic->gid_family;
    *len_p = PF_VERBS_EP_LEN;
    return 0;
}

static const char *verbs_family_str(int fam, int type)
{
    if (type == IBV_GID_TYPE_IB)
        return "InfiniBand";
    if (fam == 4)
        return type == IBV_GID_TYPE_ROCE_V1 ? "IPv4 RoCE v1" : "IPv4 RoCE v2";
    return type == IBV_GID_TYPE_ROCE_V1 ? "IPv6 RoCE v1" : "IPv6 RoCE v2";
}

int pf_verbs_ep_check(struct pf_net_qp *qpb, const void *ep, size_t len, char *why, size_t whylen)
{
    struct verbsqp *q = verbs_qp(qpb);
    struct verbsnic *nic = q->nic;
    const uint8_t *p = ep;
    char tmp[8];
    if (!why || whylen == 0) {
        why = tmp;
        whylen = sizeof(tmp);
    }
    why[0] = '\0';
    if (!ep || len < 5) {
        snprintf(why, whylen, "malformed verbs endpoint (%zu bytes)", len);
        return -EINVAL;
    }
    uint32_t magic =
        (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (magic != VERBS_EP_MAGIC) {
        snprintf(why, whylen, "not a verbs endpoint (the peer runs another --net-backend?)");
        return -EINVAL;
    }
    if (p[4] != VERBS_EP_VERSION || len != PF_VERBS_EP_LEN) {
        snprintf(why, whylen,
                 "peer's verbs endpoint is version %u (%zu bytes), this node's %u: "
                 "run the same release on both",
                 p[4], len, VERBS_EP_VERSION);
        return -EPROTO;
    }
    enum ibv_mtu mtu = (enum ibv_mtu)p[5];
    if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096 || p[PF_VERBS_EP_RD_ATOM] == 0 || p[37] || p[38] ||
        p[39]) {
        snprintf(why, whylen, "malformed verbs endpoint");
        return -EINVAL;
    }
    if (p[6] != nic->port_attr.link_layer) {
        snprintf(why, whylen, "link layer mismatch: peer %s, NIC %s %s",
                 p[6] == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand", nic->name,
                 nic->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)"
                                                                      : "InfiniBand");
        return -EPROTO;
    }
    if (nic->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        int ptype = p[PF_VERBS_EP_GIDTYPE], pfam = p[PF_VERBS_EP_FAMILY];
        /* the family byte must agree with the GID itself */
        static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        int gfam = memcmp(p + 8, pre, 12) == 0 ? 4 : 6;
        if ((ptype != IBV_GID_TYPE_ROCE_V1 && ptype != IBV_GID_TYPE_ROCE_V2) || pfam != gfam) {
            snprintf(why, whylen, "malformed verbs endpoint (GID type %d, family %d)", ptype, pfam);
            return -EINVAL;
        }
        if (ptype != nic->gid_type || pfam != nic->gid_family) {
            char pg[INET6_ADDRSTRLEN] = "?", og[INET6_ADDRSTRLEN] = "?";
            inet_ntop(AF_INET6, p + 8, pg, sizeof(pg));
            inet_ntop(AF_INET6, nic->gid.raw, og, sizeof(og));
            snprintf(why, whylen,
                     "GID family mismatch: peer GID %s is %s, NIC %s GID[%d] %s is %s (the QP "
                     "would never reach RTR): pick the same family on both with "
                     "--rdma-gid-subnet or --rdma-gid-index",
                     pg, verbs_family_str(pfam, ptype), nic->name, nic->gid_index, og,
                     verbs_family_str(nic->gid_family, nic->gid_type));
            return -EPROTO;
        }
    }
    return 0;
}

int pf_verbs_qp_connect(struct pf_net_qp *qpb, const void *ep, size_t len)
{
    struct verbsqp *q = verbs_qp(qpb);
    struct verbsnic *nic = q->nic;
    const struct pf_net_rdma_opts *o = &nic->net->opts;
    const uint8_t *p = ep;
    char why[320];
    int crc = pf_verbs_ep_check(qpb, ep, len, why, sizeof(why));
    if (crc) {
        pf_warn("verbs %s: qp_connect: %s", nic->name, why);
        return crc;
    }
    uint32_t qpn = 0, psn = 0;
    for (int k = 3; k >= 0; k--) {
        qpn = qpn << 8 | p[24 + k];
        psn = psn << 8 | p[28 + k];
    }
    uint16_t lid = (uint16_t)(p[32] | p[33] << 8);
    enum ibv_mtu mtu = (enum ibv_mtu)p[5];
    int peer_resp = p[PF_VERBS_EP_RD_ATOM];
    if (psn > 0xffffff || qpn > 0xffffff) {
        pf_warn("verbs %s: qp_connect: malformed endpoint", nic->name);
        return -EINVAL;
    }
    pthread_mutex_lock(&q->mu);
    int rc = 0;
    if (q->state != VQ_INIT) {
        rc = q->state == VQ_ERR ? -ENOTCONN : -EISCONN;
        goto out;
    }
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu < (enum ibv_mtu)q->mtu ? mtu : (enum ibv_mtu)q->mtu;
    a.dest_qp_num = qpn;
    a.rq_psn = psn;
    a.max_dest_rd_atomic = (uint8_t)nic->rd_resp;
    a.min_rnr_timer = PF_VERBS_MIN_RNR;
    a.ah_attr.dlid = lid;
    a.ah_attr.sl = (uint8_t)o->sl;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = nic->port;
    if (nic->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, p + 8, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)nic->gid_index;
        a.ah_attr.grh.hop_limit = PF_VERBS_HOP_LIMIT;
        a.ah_attr.grh.traffic_class = (uint8_t)o->traffic_class;
    }
    rc = verbs_rc(q->api->modify_qp(q->qp, &a,
                                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                        IBV_QP_MIN_RNR_TIMER));
    if (rc) {
        pf_warn("verbs %s: QP 0x%x to RTR: %s", nic->name, q->qp->qp_num, strerror(-rc));
        goto out;
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = (uint8_t)o->timeout;
    a.retry_cnt = (uint8_t)nic->retry_cnt;
    a.rnr_retry = (uint8_t)o->rnr_retry;
    a.sq_psn = q->psn;
    /* our outstanding READs are bounded by what the peer's QP answers (its max_dest_rd_atomic,
     * carried in the endpoint) and by our own initiator depth: the min of the two */
    a.max_rd_atomic = (uint8_t)(peer_resp < nic->rd_init ? peer_resp : nic->rd_init);
    rc =
        verbs_rc(q->api->modify_qp(q->qp, &a,
                                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
    if (rc) {
        pf_warn("verbs %s: QP 0x%x to RTS: %s", nic->name, q->qp->qp_num, strerror(-rc));
        goto out;
    }
    q->state = VQ_RTS;
    pf_debug("verbs %s: QP 0x%x connected to QP 0x%x (LID %u)", nic->name, q->qp->qp_num, qpn, lid);
out:
    pthread_mutex_unlock(&q->mu);
    return rc;
}

/* Checks one READ's local SGEs against the NIC's regions and fills its WR (unlinked).
 * Caller holds nic->mr_lock for reading. 0, -EINVAL or -EMSGSIZE. */
static int verbs_build_wr(struct verbsnic *nic, const struct pf_net_read *rd,
                          struct ibv_send_wr *wr, struct ibv_sge *isge, uint64_t *total_p)
{
    if (!rd->sge || rd->nsge == 0 || rd->nsge > (size_t)nic->max_sge)
        return -EINVAL;
    uint64_t total = 0;
    for (size_t i = 0; i < rd->nsge; i++) {
        const struct pf_net_sge *g = &rd->sge[i];
        uint64_t a = (uint64_t)(uintptr_t)g->addr, end;
        bool ok = g->addr && g->len > 0 && g->len <= UINT32_MAX && pf_add_ok(a, g->len, &end) &&
                  pf_add_ok(total, g->len, &total);
        const struct verbsmr *m = nic->mrs;
        for (; ok && m; m = m->next)
            if (m->base.lkey == g->lkey && (m->access & PF_NET_ACCESS_LOCAL_WRITE) &&
                a >= (uint64_t)(uintptr_t)m->base.addr &&
                end <= (uint64_t)(uintptr_t)m->base.addr + m->base.len)
                break;
        if (!ok || !m) {
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "verbs %s: post_read: SGE %zu (%p+%llu lkey 0x%08x) is not "
                               "inside a locally writable region",
                               nic->name, i, g->addr, (unsigned long long)g->len, g->lkey);
            return -EINVAL;
        }
        isge[i] = (struct ibv_sge){.addr = a, .length = (uint32_t)g->len, .lkey = g->lkey};
    }
    if (total > nic->max_msg) {
        pf_log_ratelimited(PF_LOG_WARN, 1000,
                           "verbs %s: post_read: %llu bytes past the port's max_msg_sz %llu",
                           nic->name, (unsigned long long)total, (unsigned long long)nic->max_msg);
        return -EMSGSIZE;
    }
    memset(wr, 0, sizeof(*wr));
    wr->wr_id = rd->wr_id;
    wr->sg_list = isge;
    wr->num_sge = (int)rd->nsge;
    wr->opcode = IBV_WR_RDMA_READ;
    /* every READ is signalled: the HAL reports a completion per READ (hal_net.h post_read) */
    wr->send_flags = IBV_SEND_SIGNALED;
    wr->wr.rdma.remote_addr = rd->raddr;
    wr->wr.rdma.rkey = rd->rkey;
    *total_p = total;
    return 0;
}

/* Posts up to PF_VERBS_POST_CHAIN reads as one chain: *posted_p of them; 0 when all were,
 * else the error of the first one not posted. */
static int verbs_post_chain(struct verbsqp *q, const struct pf_net_read *reads, size_t n,
                            size_t *posted_p)
{
    struct verbsnic *nic = q->nic;
    struct ibv_send_wr wr[PF_VERBS_POST_CHAIN];
    struct ibv_sge isge[PF_VERBS_POST_CHAIN][PF_VERBS_MAX_SGE];
    uint64_t len[PF_VERBS_POST_CHAIN];
    size_t m = 0;
    int rc = 0;
    *posted_p = 0;
    pthread_rwlock_rdlock(&nic->mr_lock);
    for (; m < n; m++) {
        rc = verbs_build_wr(nic, &reads[m], &wr[m], isge[m], &len[m]);
        if (rc)
            break; /* post the valid front; this one's error is the result */
    }
    pthread_rwlock_unlock(&nic->mr_lock);
    if (m == 0)
        return rc;
    pthread_mutex_lock(&q->mu);
    uint32_t room = PF_VERBS_SQ_DEPTH - q->out_count - q->sw_count;
    if (q->state != VQ_RTS) {
        rc = -ENOTCONN;
    } else if (room == 0) {
        rc = -EAGAIN;
    } else {
        if (m > room) {
            m = room;
            rc = -EAGAIN;
        }
        for (size_t i = 0; i + 1 < m; i++)
            wr[i].next = &wr[i + 1];
        wr[m - 1].next = NULL;
        struct ibv_send_wr *bad = NULL;
        int prc = verbs_rc(q->api->post_send(q->qp, wr, &bad));
        /* ibv_post_send(3): on failure bad_wr is the first WR not posted, the ones before it
         * were posted */
        size_t posted = prc == 0 ? m : bad >= wr && bad < wr + m ? (size_t)(bad - wr) : 0;
        for (size_t i = 0; i < posted; i++) {
            q->out[(q->out_head + q->out_count) % PF_VERBS_SQ_DEPTH] =
                (struct verbsout){wr[i].wr_id, len[i]};
            q->out_count++;
        }
        *posted_p = posted;
        if (prc == -ENOMEM) /* send queue full in the provider */
            prc = -EAGAIN;
        if (prc && prc != -EAGAIN)
            pf_log_ratelimited(PF_LOG_WARN, 1000, "verbs %s: ibv_post_send: %s", nic->name,
                               strerror(-prc));
        if (prc)
            rc = prc;
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

int pf_verbs_post_reads(struct pf_net_qp *qpb, const struct pf_net_read *reads, size_t n,
                        size_t *posted_p)
{
    struct verbsqp *q = verbs_qp(qpb);
    *posted_p = 0;
    if (!reads && n)
        return -EINVAL;
    while (*posted_p < n) {
        size_t left = n - *posted_p, k = 0;
        int rc = verbs_post_chain(q, reads + *posted_p,
                                  left < PF_VERBS_POST_CHAIN ? left : PF_VERBS_POST_CHAIN, &k);
        *posted_p += k;
        if (rc)
            return rc;
    }
    return 0;
}

int pf_verbs_post_read(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                       uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    struct pf_net_read rd = {
        .sge = sge, .nsge = nsge, .raddr = raddr, .rkey = rkey, .wr_id = wr_id};
    size_t k;
    return pf_verbs_post_reads(qpb, &rd, 1, &k);
}

/* Takes up to max of q's queued completions. Caller holds q->mu. */
static size_t verbs_pop(struct verbsqp *q, struct pf_net_cqe *out, size_t max)
{
    size_t n = 0;
    while (n < max && q->sw_count) {
        out[n++] = q->sw[q->sw_head];
        q->sw_head = (q->sw_head + 1) % PF_VERBS_SQ_DEPTH;
        q->sw_count--;
    }
    return n;
}

int pf_verbs_poll(struct pf_net_qp *qpb, struct pf_net_cqe *out, size_t max, uint64_t timeout_ms)
{
    struct verbsqp *q = verbs_qp(qpb);
    struct verbscq *cq = q->vcq;
    if (max == 0)
        return 0;
    if (!out)
        return -EINVAL;
    uint64_t deadline = timeout_ms > UINT64_MAX / PF_NS_PER_MS / 2
                            ? UINT64_MAX / 2
                            : pf_now_ns() + timeout_ms * PF_NS_PER_MS;
    /* completions a poll of another QP on the CQ already routed here: no ibv_poll_cq */
    pthread_mutex_lock(&q->mu);
    size_t n = verbs_pop(q, out, max);
    pthread_mutex_unlock(&q->mu);
    if (n > 0)
        return (int)n;
    unsigned spins = 0;
    for (;;) {
        int rc = pf_verbs_cq_drain(cq);
        pthread_mutex_lock(&q->mu);
        n = verbs_pop(q, out, max);
        if (n > 0 || rc) {
            pthread_mutex_unlock(&q->mu);
            return n > 0 ? (int)n : rc;
        }
        if (q->state == VQ_ERR && q->out_count == 0) {
            pthread_mutex_unlock(&q->mu);
            return -ENOTCONN;
        }
        uint64_t now = pf_now_ns();
        if (timeout_ms == 0 || now >= deadline) {
            pthread_mutex_unlock(&q->mu);
            return 0;
        }
        bool live = q->qp != NULL;
        if (live && spins < PF_VERBS_SPIN_POLLS) {
            /* a short bounded spin before arming: a completion due within a few polls
             * (back-to-back READs) is taken without the notify, event and wake-up */
            spins++;
            pthread_mutex_unlock(&q->mu);
            continue;
        }
        q->waiting = true; /* a drain queueing for us from now on writes evfd */
        pthread_mutex_unlock(&q->mu);
        if (live) {
            rc = pf_verbs_cq_arm(cq);
            if (rc) {
                pthread_mutex_lock(&q->mu);
                q->waiting = false;
                pthread_mutex_unlock(&q->mu);
                if (rc < 0)
                    return rc;
                continue; /* armed now: poll once more, a completion may have raced it */
            }
        }
        uint64_t ms = (deadline - now + PF_NS_PER_MS - 1) / PF_NS_PER_MS;
        struct pollfd pf[2] = {{.fd = cq->ch->fd, .events = POLLIN},
                               {.fd = q->evfd, .events = POLLIN}};
        int r = poll(pf, 2, ms > 60000 ? 60000 : (int)ms);
        int perr = errno;
        pthread_mutex_lock(&q->mu);
        q->waiting = false;
        pthread_mutex_unlock(&q->mu);
        if (r < 0 && perr != EINTR)
            return -perr;
        if (r > 0 && (pf[0].revents & POLLIN))
            pf_verbs_cq_event(cq, q);
        if (r > 0 && (pf[1].revents & POLLIN)) {
            uint64_t v;
            if (read(q->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                return -errno;
        }
    }
}

void pf_verbs_qp_invalidate(struct pf_net_qp *qpb)
{
    struct verbsqp *q = verbs_qp(qpb);
    struct verbsnic *nic = q->nic;
    pthread_mutex_lock(&q->mu);
    bool was_err = q->state == VQ_ERR;
    q->state = VQ_ERR;
    int rc = 0;
    bool drain = q->qp && (!was_err || q->out_count);
    if (drain) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        rc = verbs_rc(q->api->modify_qp(q->qp, &a, IBV_QP_STATE));
        if (rc)
            pf_error("verbs %s: QP 0x%x to ERR: %s", nic->name, q->qpn, strerror(-rc));
    }
    pthread_mutex_unlock(&q->mu);
    if (drain) {
        /* every outstanding WR completes or flushes; until then the HCA may still DMA. The
         * drains route the flushes (and other QPs' completions) through the shared CQ. */
        uint64_t deadline = pf_now_ns() + q->api->drain_ms * PF_NS_PER_MS;
        unsigned sleep_us = 10;
        pthread_mutex_lock(&q->mu);
        uint32_t left = q->out_count;
        pthread_mutex_unlock(&q->mu);
        while (left > 0 && rc == 0) {
            if (pf_verbs_cq_drain(q->vcq)) {
                rc = -EIO;
                break;
            }
            pthread_mutex_lock(&q->mu);
            uint32_t now_left = q->out_count;
            pthread_mutex_unlock(&q->mu);
            if (now_left == 0)
                break;
            if (pf_now_ns() >= deadline) {
                rc = -ETIMEDOUT;
                break;
            }
            if (now_left == left) {
                struct timespec ts = {0, (long)sleep_us * 1000};
                nanosleep(&ts, NULL);
                sleep_us = sleep_us < 1000 ? sleep_us * 2 : 1000;
            }
            left = now_left;
        }
        pthread_mutex_lock(&q->mu);
        if (q->out_count > 0 && q->qp) {
            /* no flush: destroying the QP is the remaining way to stop the HCA (and its
             * completions leave the CQ with it: verbs_route drops any for a QP without qp) */
            pf_error("verbs %s: QP 0x%x: %u WRs not flushed (%s): destroying the QP", nic->name,
                     q->qpn, q->out_count, strerror(-(rc ? rc : -ETIMEDOUT)));
            int drc = verbs_rc(q->api->destroy_qp(q->qp));
            if (drc)
                pf_error("verbs %s: ibv_destroy_qp: %s", nic->name, strerror(-drc));
            q->qp = NULL;
            while (q->out_count > 0) {
                struct ibv_wc wc = {.wr_id = q->out[q->out_head].wr_id,
                                    .status = IBV_WC_WR_FLUSH_ERR};
                q->sw[(q->sw_head + q->sw_count) % PF_VERBS_SQ_DEPTH] = pf_verbs_take(q, &wc);
                q->sw_count++;
            }
        }
        pthread_mutex_unlock(&q->mu);
    }
    uint64_t one = 1;
    if (write(q->evfd, &one, sizeof(one)) < 0)
        pf_debug("verbs %s: waking poller: %s", nic->name, strerror(errno));
}

void pf_verbs_qp_destroy(struct pf_net_qp *qpb)
{
    if (!qpb)
        return;
    struct verbsqp *q = verbs_qp(qpb);
    const struct pf_verbs_api *api = q->api;
    pf_verbs_qp_invalidate(qpb);
    pf_verbs_cq_detach(q->vcq, q); /* no drain routes to q from here on */
    if (q->qp) {
        int rc = verbs_rc(api->destroy_qp(q->qp));
        if (rc)
            pf_error("verbs %s: ibv_destroy_qp: %s", q->nic->name, strerror(-rc));
    }
    pf_verbs_cq_put(q->vcq);
    close(q->evfd);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

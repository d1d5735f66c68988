/* The fake HCA of tests/unit/net/test_verbs.c: a struct pf_verbs_api (hw/verbs/verbs_internal.h)
 * as strict as rdma-core and the kernel where the backend depends on it: QP state transitions
 * ibv_modify_qp(3) allows, the send queue bound, completions in post order, flushes on ERR,
 * the completion channel, ibv_query_gid_ex(3) entries (GID type, net device) with ENODATA
 * for empty ones, async events on a non-blocking async_fd (ibv_get_async_event(3)), and
 * ibv_reg_mr(3) access flags, ibv_post_send(3) chains (WRs linked by next, posted in order, on
 * failure *bad_wr the first WR not posted and the ones before it posted), ibv_create_cq(3)
 * sizes (EINVAL past the device's max_cqe) and CQ overrun (a completion arriving at a full CQ
 * fails the test: the real CQ would raise IBV_EVENT_CQ_ERR and lose it), ibv_poll_cq(3) work
 * completions naming their QP (wc.qp_num). Included once per test file (test_verbs.c,
 * test_verbs_rails.c, test_verbs_cq.c) after cmocka.h. It includes verbs_internal.h when the
 * rdma-core headers are installed and sets HAVE_IBV_HEADERS; without them it defines the
 * file's main (a SKIP line, exit 77) and nothing else, so a test file wraps its own code in
 * #if HAVE_IBV_HEADERS. */
#ifndef PF_TEST_FAKE_HCA_H
#define PF_TEST_FAKE_HCA_H

#if __has_include(<infiniband/verbs.h>)
#include "../../../hw/verbs/verbs_internal.h"
#define HAVE_IBV_HEADERS 1
/* Weak: when configure found no libibverbs, verbs_absent.c is linked and this is NULL. */
#pragma weak pf_verbs_open_api
#else
#define HAVE_IBV_HEADERS 0
int main(void)
{
    printf("SKIP: rdma-core headers (infiniband/verbs.h) not installed\n");
    return 77;
}
#endif

#if HAVE_IBV_HEADERS

/* ---------------------------------------------------------------- the fake HCA */

#define FAKE_MAX_WR 512

struct fake_dev {
    struct ibv_device dev;
    struct ibv_device_attr attr;
    int nports;
    struct ibv_port_attr port[4]; /* 1-based */
    struct ibv_gid_entry gid[4][8];
    int ngid[4];
};

struct fake_ctx {
    struct ibv_context ctx;
    struct fake_dev *dev;
};

struct fake_cq {
    struct ibv_cq cq;
    struct fake_ch *ch;
    bool armed;
    struct ibv_wc *q; /* cq.cqe entries */
    int head, n;
    int vector;
};

struct fake_ch {
    struct ibv_comp_channel ch;
    struct fake_cq *cq;
};

struct fake_wr {
    uint64_t wr_id, raddr;
    uint32_t rkey;
    int opcode, flags, nsge;
    int chain; /* position in its ibv_post_send chain (0: first) */
    struct ibv_sge sge[16];
    bool done;
};

struct fake_qp {
    struct ibv_qp qp;
    struct fake_cq *cq;
    struct ibv_qp_init_attr init;
    enum ibv_qp_state state;
    enum ibv_qp_state trans[8];
    int ntrans;
    struct ibv_qp_attr init_attr, rtr, rts;
    int init_mask, rtr_mask, rts_mask;
    struct fake_wr wr[FAKE_MAX_WR];
    int nposted, ncompleted;
    int flush_polls; /* >0: flush after that many poll_cq calls once in ERR; -1: never */
    bool flush_pending;
    bool destroyed;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct fake_dev devs[2];
    int ndev;
    bool no_list;
    int flush_polls;                 /* copied into each new QP */
    struct ibv_async_event async[8]; /* queued async events (all NICs) */
    int nasync, async_out, async_acked;
    int last_access; /* of the last ibv_reg_mr */
    bool reject_ro;
    int8_t ifup[16];  /* net device state by ifindex (1 up, 0 down), for ifindex_up */
    uint64_t memlock; /* RLIMIT_MEMLOCK (UINT64_MAX: unlimited) */
    bool cap_ipc_lock;
    struct fake_qp *qps[64];
    int nqps;
    uint32_t next_key, next_qpn;
    int mrs_live, pds_live, ctx_live, cq_live, ch_live;
    int acked_events;
    int notifies;            /* ibv_req_notify_cq calls */
    int post_sends;          /* ibv_post_send calls */
    int poll_cqs;            /* ibv_poll_cq calls */
    int post_fail_at;        /* >0: ibv_post_send fails (ENOMEM) at the n-th WR of a chain */
    int cq_max_seen;         /* most completions ever queued in one CQ */
    int complete_after_poll; /* >0: the n-th poll_cq from now (any CQ) first completes the
                              * oldest pending WR on that CQ (a READ finishing while the
                              * poller spins) */
} F = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static struct ibv_device *fake_list[4];

static struct ibv_device **f_get_device_list(int *n)
{
    if (F.no_list) {
        errno = ENOSYS;
        return NULL;
    }
    for (int i = 0; i < F.ndev; i++)
        fake_list[i] = &F.devs[i].dev;
    fake_list[F.ndev] = NULL;
    *n = F.ndev;
    return fake_list;
}
static void f_free_device_list(struct ibv_device **l)
{
    (void)l;
}
static const char *f_get_device_name(struct ibv_device *d)
{
    return d->name;
}
static struct ibv_context *f_open_device(struct ibv_device *d)
{
    struct fake_ctx *c = calloc(1, sizeof(*c));
    c->dev = pf_container_of(d, struct fake_dev, dev);
    c->ctx.async_fd = eventfd(0, EFD_CLOEXEC); /* a real fd: the backend makes it non-blocking */
    c->ctx.num_comp_vectors = 4;
    F.ctx_live++;
    return &c->ctx;
}
static int f_close_device(struct ibv_context *c)
{
    close(c->async_fd);
    F.ctx_live--;
    free(pf_container_of(c, struct fake_ctx, ctx));
    return 0;
}
static struct fake_dev *fdev(struct ibv_context *c)
{
    return pf_container_of(c, struct fake_ctx, ctx)->dev;
}
static int f_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
    *a = fdev(c)->attr;
    return 0;
}
static int f_query_port(struct ibv_context *c, uint8_t p, struct ibv_port_attr *a)
{
    struct fake_dev *d = fdev(c);
    if (p < 1 || p > d->nports)
        return EINVAL;
    *a = d->port[p];
    return 0;
}
static int f_query_gid_ex(struct ibv_context *c, uint32_t p, uint32_t i, struct ibv_gid_entry *e)
{
    struct fake_dev *d = fdev(c);
    if (p < 1 || (int)p > d->nports || (int)i >= d->ngid[p])
        return ENODATA;
    *e = d->gid[p][i];
    return 0;
}
static struct ibv_pd *f_alloc_pd(struct ibv_context *c)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    pd->context = c;
    F.pds_live++;
    return pd;
}
static int f_dealloc_pd(struct ibv_pd *pd)
{
    F.pds_live--;
    free(pd);
    return 0;
}
static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    F.last_access = access;
    if (F.reject_ro && (access & IBV_ACCESS_RELAXED_ORDERING)) { /* a kernel before 5.8 */
        errno = EINVAL;
        return NULL;
    }
    struct ibv_mr *m = calloc(1, sizeof(*m));
    m->pd = pd;
    m->addr = addr;
    m->length = len;
    m->lkey = ++F.next_key;
    m->rkey = 0x1000 + F.next_key;
    F.mrs_live++;
    return m;
}
static int f_dereg_mr(struct ibv_mr *m)
{
    F.mrs_live--;
    free(m);
    return 0;
}
static struct ibv_comp_channel *f_create_ch(struct ibv_context *c)
{
    struct fake_ch *ch = calloc(1, sizeof(*ch));
    ch->ch.context = c;
    ch->ch.fd = eventfd(0, EFD_CLOEXEC);
    F.ch_live++;
    return &ch->ch;
}
static int f_destroy_ch(struct ibv_comp_channel *ch)
{
    close(ch->fd);
    F.ch_live--;
    free(pf_container_of(ch, struct fake_ch, ch));
    return 0;
}
static struct ibv_cq *f_create_cq(struct ibv_context *c, int cqe, void *ctx,
                                  struct ibv_comp_channel *ch, int vec)
{
    /* ibv_create_cq(3): cqe at least 1 and at most the device's max_cqe, else EINVAL; the
     * completion vector below the context's num_comp_vectors */
    if (cqe < 1 || cqe > fdev(c)->attr.max_cqe || vec < 0 ||
        (vec > 0 && vec >= c->num_comp_vectors)) {
        errno = EINVAL;
        return NULL;
    }
    struct fake_cq *cq = calloc(1, sizeof(*cq));
    cq->q = calloc((size_t)cqe, sizeof(*cq->q));
    cq->vector = vec;
    cq->cq.context = c;
    cq->cq.cq_context = ctx;
    cq->cq.cqe = cqe;
    cq->ch = pf_container_of(ch, struct fake_ch, ch);
    cq->ch->cq = cq;
    F.cq_live++;
    return &cq->cq;
}
static int f_destroy_cq(struct ibv_cq *cq)
{
    F.cq_live--;
    free(pf_container_of(cq, struct fake_cq, cq)->q);
    free(pf_container_of(cq, struct fake_cq, cq));
    return 0;
}
static struct fake_cq *fcq(struct ibv_cq *cq)
{
    return pf_container_of(cq, struct fake_cq, cq);
}
static int f_req_notify(struct ibv_cq *cq, int so)
{
    pthread_mutex_lock(&F.mu);
    F.notifies++;
    fcq(cq)->armed = true;
    pthread_cond_broadcast(&F.cv);
    pthread_mutex_unlock(&F.mu);
    return 0;
}
static int f_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx)
{
    uint64_t v;
    if (read(ch->fd, &v, sizeof(v)) != sizeof(v))
        return -1;
    struct fake_cq *c = pf_container_of(ch, struct fake_ch, ch)->cq;
    *cq = &c->cq;
    *ctx = c->cq.cq_context;
    return 0;
}
static void f_ack(struct ibv_cq *cq, unsigned n)
{
    F.acked_events += (int)n;
}
static struct ibv_qp *f_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    struct fake_qp *q = calloc(1, sizeof(*q));
    q->init = *a;
    q->cq = fcq(a->send_cq);
    q->qp.qp_num = ++F.next_qpn;
    q->qp.pd = pd;
    q->state = IBV_QPS_RESET;
    q->flush_polls = F.flush_polls;
    F.qps[F.nqps++] = q;
    return &q->qp;
}
static struct fake_qp *fqp(struct ibv_qp *qp)
{
    return pf_container_of(qp, struct fake_qp, qp);
}
static int f_destroy_qp(struct ibv_qp *qp)
{
    fqp(qp)->destroyed = true; /* kept for the test's assertions */
    return 0;
}

/* Caller holds F.mu. */
static void fake_push(struct fake_qp *q, struct fake_wr *w, enum ibv_wc_status st)
{
    struct fake_cq *c = q->cq;
    if (c->n >= c->cq.cqe)
        fail_msg("CQ overrun: a completion for QP 0x%x arrived at a full CQ of %d entries "
                 "(IBV_EVENT_CQ_ERR, completion lost)",
                 q->qp.qp_num, c->cq.cqe);
    struct ibv_wc *wc = &c->q[(c->head + c->n) % c->cq.cqe];
    memset(wc, 0, sizeof(*wc));
    wc->wr_id = w->wr_id;
    wc->status = st;
    wc->opcode = IBV_WC_RDMA_READ;
    wc->qp_num = q->qp.qp_num;
    c->n++;
    if (c->n > F.cq_max_seen)
        F.cq_max_seen = c->n;
    w->done = true;
    q->ncompleted++;
    if (c->armed) {
        c->armed = false;
        uint64_t one = 1;
        assert_int_equal(write(c->ch->ch.fd, &one, sizeof(one)), sizeof(one));
    }
}

static void fake_flush(struct fake_qp *q)
{
    for (int i = 0; i < q->nposted; i++)
        if (!q->wr[i].done)
            fake_push(q, &q->wr[i], IBV_WC_WR_FLUSH_ERR);
    q->flush_pending = false;
}

static int f_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    struct fake_qp *q = fqp(qp);
    pthread_mutex_lock(&F.mu);
    int rc = 0;
    if (!(mask & IBV_QP_STATE)) {
        rc = EINVAL;
        goto out;
    }
    enum ibv_qp_state to = a->qp_state;
    bool legal = to == IBV_QPS_ERR || (q->state == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
                 (q->state == IBV_QPS_INIT && to == IBV_QPS_RTR) ||
                 (q->state == IBV_QPS_RTR && to == IBV_QPS_RTS);
    if (!legal) {
        rc = EINVAL;
        goto out;
    }
    if (to == IBV_QPS_INIT) {
        q->init_attr = *a;
        q->init_mask = mask;
    } else if (to == IBV_QPS_RTR) {
        q->rtr = *a;
        q->rtr_mask = mask;
    } else if (to == IBV_QPS_RTS) {
        q->rts = *a;
        q->rts_mask = mask;
    }
    q->state = to;
    q->trans[q->ntrans++] = to;
    if (to == IBV_QPS_ERR) {
        if (q->flush_polls == 0)
            fake_flush(q);
        else if (q->flush_polls > 0)
            q->flush_pending = true;
    }
out:
    pthread_mutex_unlock(&F.mu);
    return rc;
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct fake_qp *q = fqp(qp);
    pthread_mutex_lock(&F.mu);
    F.post_sends++;
    int rc = 0, k = 0;
    /* ibv_post_send(3): the chain wr, wr->next, ... in order; on failure *bad_wr is the first
     * WR that was not posted (the ones before it were) */
    for (; wr && rc == 0; wr = wr->next, k++) {
        if (q->state != IBV_QPS_RTS) {
            rc = EINVAL;
        } else if (q->nposted - q->ncompleted >= (int)q->init.cap.max_send_wr ||
                   q->nposted == FAKE_MAX_WR || (F.post_fail_at > 0 && k + 1 == F.post_fail_at)) {
            rc = ENOMEM;
        } else if (wr->num_sge < 0 || wr->num_sge > (int)q->init.cap.max_send_sge) {
            rc = EINVAL;
        } else {
            struct fake_wr *w = &q->wr[q->nposted++];
            w->wr_id = wr->wr_id;
            w->raddr = wr->wr.rdma.remote_addr;
            w->rkey = wr->wr.rdma.rkey;
            w->opcode = wr->opcode;
            w->flags = (int)wr->send_flags;
            w->nsge = wr->num_sge;
            w->chain = k;
            memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(struct ibv_sge));
        }
        if (rc)
            *bad = wr;
    }
    pthread_mutex_unlock(&F.mu);
    return rc;
}

static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    struct fake_cq *c = fcq(cq);
    pthread_mutex_lock(&F.mu);
    F.poll_cqs++;
    if (F.complete_after_poll > 0 && --F.complete_after_poll == 0)
        for (int i = 0; i < F.nqps; i++) {
            struct fake_qp *q = F.qps[i];
            int w = 0;
            while (q->cq == c && w < q->nposted && q->wr[w].done)
                w++;
            if (q->cq == c && w < q->nposted) {
                fake_push(q, &q->wr[w], IBV_WC_SUCCESS);
                break;
            }
        }
    for (int i = 0; i < F.nqps; i++) {
        struct fake_qp *q = F.qps[i];
        if (q->cq == c && q->flush_pending && --q->flush_polls == 0)
            fake_flush(q);
    }
    int k = 0;
    while (k < n && c->n) {
        wc[k++] = c->q[c->head];
        c->head = (c->head + 1) % c->cq.cqe;
        c->n--;
    }
    pthread_mutex_unlock(&F.mu);
    return k;
}

/* Completes the oldest n pending WRs of q with st. */
static inline void fake_complete(struct fake_qp *q, int n, enum ibv_wc_status st)
{
    pthread_mutex_lock(&F.mu);
    for (int i = 0; i < q->nposted && n > 0; i++)
        if (!q->wr[i].done) {
            fake_push(q, &q->wr[i], st);
            n--;
        }
    pthread_mutex_unlock(&F.mu);
}

/* ibv_get_async_event(3) on a non-blocking async_fd: the next queued event, else -1/EAGAIN;
 * every event returned must be acknowledged (ibv_ack_async_event) */
static int f_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
    pthread_mutex_lock(&F.mu);
    int rc = -1;
    if (!(fcntl(c->async_fd, F_GETFL) & O_NONBLOCK)) {
        fail_msg("ibv_get_async_event on a blocking async_fd would block the caller");
    } else if (F.nasync > 0) {
        *ev = F.async[0];
        memmove(F.async, F.async + 1, (size_t)--F.nasync * sizeof(*ev));
        F.async_out++;
        rc = 0;
    } else {
        errno = EAGAIN;
    }
    pthread_mutex_unlock(&F.mu);
    return rc;
}
static void f_ack_async_event(struct ibv_async_event *ev)
{
    (void)ev;
    pthread_mutex_lock(&F.mu);
    F.async_out--;
    F.async_acked++;
    pthread_mutex_unlock(&F.mu);
}

/* ibv_gid_entry.ndev_ifindex -> the net device's state (rdma-core ibv_query_gid_ex(3)) */
static int f_ifindex_up(uint32_t ifindex)
{
    return ifindex < 16 && ifindex > 0 ? F.ifup[ifindex] : -1;
}
static int f_memlock(uint64_t *b)
{
    *b = F.memlock;
    return 0;
}
static bool f_cap(void)
{
    return F.cap_ipc_lock;
}

static char sysfs_dir[64];

static const struct pf_verbs_api fake_api_template = {
    .get_device_list = f_get_device_list,
    .free_device_list = f_free_device_list,
    .get_device_name = f_get_device_name,
    .open_device = f_open_device,
    .close_device = f_close_device,
    .query_device = f_query_device,
    .query_port = f_query_port,
    .query_gid_ex = f_query_gid_ex,
    .alloc_pd = f_alloc_pd,
    .dealloc_pd = f_dealloc_pd,
    .reg_mr = f_reg_mr,
    .dereg_mr = f_dereg_mr,
    .create_comp_channel = f_create_ch,
    .destroy_comp_channel = f_destroy_ch,
    .create_cq = f_create_cq,
    .destroy_cq = f_destroy_cq,
    .req_notify_cq = f_req_notify,
    .get_cq_event = f_get_cq_event,
    .ack_cq_events = f_ack,
    .create_qp = f_create_qp,
    .destroy_qp = f_destroy_qp,
    .modify_qp = f_modify_qp,
    .post_send = f_post_send,
    .poll_cq = f_poll_cq,
    .get_async_event = f_get_async_event,
    .ack_async_event = f_ack_async_event,
    .ifindex_up = f_ifindex_up,
    .memlock_limit = f_memlock,
    .cap_ipc_lock = f_cap,
    .drain_ms = 2000,
};
static struct pf_verbs_api fake_api;

static void gid_set(struct ibv_gid_entry *e, const char *txt, uint32_t type)
{
    memset(e, 0, sizeof(*e));
    e->gid_type = type;
    if (txt)
        assert_int_equal(inet_pton(AF_INET6, txt, e->gid.raw), 1);
}

static void gid_dev(struct ibv_gid_entry *e, const char *txt, uint32_t type, uint32_t ifindex)
{
    gid_set(e, txt, type);
    e->ndev_ifindex = ifindex;
}

/* One RoCE device "mlx5_0" (port 1 DOWN, port 2 ACTIVE) and one IB device "ib0".
 * mlx5_0's port 2 GID table is laid out as mlx5 fills it (boot order, a v1 and a v2 entry
 * per address: rdma-core's show_gids): link-local, a SLAAC IPv6 global, a VLAN address on
 * a net device that is down (ifindex 5), then the routable IPv4 address (ifindex 2). */
static void fake_reset(void)
{
    for (int i = 0; i < F.nqps; i++)
        free(F.qps[i]);
    F.nqps = 0;
    F.mrs_live = F.pds_live = F.ctx_live = F.cq_live = F.ch_live = 0; /* no cascades */
    F.no_list = false;
    F.flush_polls = 0;
    memset(F.devs, 0, sizeof(F.devs));
    F.ndev = 2;
    struct fake_dev *d = &F.devs[0];
    snprintf(d->dev.name, sizeof(d->dev.name), "mlx5_0");
    d->attr.phys_port_cnt = 2;
    d->attr.max_sge = 30;
    d->attr.max_sge_rd = 30;
    d->attr.max_qp_rd_atom = 16;
    d->attr.max_qp_init_rd_atom = 16;
    d->attr.max_pkeys = 4;
    d->nports = 2;
    d->port[1].state = IBV_PORT_DOWN;
    d->port[1].link_layer = IBV_LINK_LAYER_ETHERNET;
    d->port[2].state = IBV_PORT_ACTIVE;
    d->port[2].link_layer = IBV_LINK_LAYER_ETHERNET;
    d->port[2].active_mtu = IBV_MTU_4096;
    d->port[2].max_msg_sz = 1u << 30; /* mlx5 */
    d->port[2].gid_tbl_len = 8;
    d->ngid[2] = 8;
    gid_dev(&d->gid[2][0], "fe80::1", IBV_GID_TYPE_ROCE_V1, 2);
    gid_dev(&d->gid[2][1], "fe80::1", IBV_GID_TYPE_ROCE_V2, 2);
    gid_dev(&d->gid[2][2], "2001:db8::1", IBV_GID_TYPE_ROCE_V1, 2);
    gid_dev(&d->gid[2][3], "2001:db8::1", IBV_GID_TYPE_ROCE_V2, 2);
    gid_dev(&d->gid[2][4], "::ffff:192.168.5.1", IBV_GID_TYPE_ROCE_V1, 5);
    gid_dev(&d->gid[2][5], "::ffff:192.168.5.1", IBV_GID_TYPE_ROCE_V2, 5);
    gid_dev(&d->gid[2][6], "::ffff:10.0.0.1", IBV_GID_TYPE_ROCE_V1, 2);
    gid_dev(&d->gid[2][7], "::ffff:10.0.0.1", IBV_GID_TYPE_ROCE_V2, 2);
    memset(F.ifup, 0, sizeof(F.ifup));
    F.ifup[2] = 1;
    F.ifup[5] = 0; /* the VLAN device is down */
    F.memlock = UINT64_MAX;
    F.cap_ipc_lock = false;
    F.nasync = F.async_out = F.async_acked = 0;
    F.reject_ro = false;
    F.notifies = 0;
    F.complete_after_poll = 0;
    F.post_sends = F.poll_cqs = F.post_fail_at = F.cq_max_seen = 0;
    d->attr.max_cqe = 4194303; /* mlx5 (ConnectX-6) */
    d = &F.devs[1];
    snprintf(d->dev.name, sizeof(d->dev.name), "ib0");
    d->attr.phys_port_cnt = 1;
    d->attr.max_sge = 4;
    d->attr.max_sge_rd = 1;
    d->attr.max_qp_rd_atom = 8;
    d->attr.max_qp_init_rd_atom = 128;
    d->attr.max_pkeys = 128;
    d->attr.max_cqe = 600; /* small: 4 QPs of 129 entries per CQ */
    d->nports = 1;
    d->port[1].state = IBV_PORT_ACTIVE;
    d->port[1].link_layer = IBV_LINK_LAYER_INFINIBAND;
    d->port[1].lid = 7;
    d->port[1].active_mtu = IBV_MTU_2048;
    d->port[1].gid_tbl_len = 2;
    d->ngid[1] = 2;
    gid_set(&d->gid[1][0], "fe80::2:c903:a:1", IBV_GID_TYPE_IB);
    gid_set(&d->gid[1][1], NULL, IBV_GID_TYPE_IB);
    fake_api = fake_api_template;
    fake_api.sysfs_root = sysfs_dir;
}

/* cmocka setup of a fake-HCA test: a fresh fake. */
__attribute__((unused)) static int fake_setup(void **st)
{
    (void)st;
    fake_reset();
    return 0;
}

/* The body of a fake-HCA test file's main: 77 with a SKIP line when the verbs backend is not
 * compiled (configure found no libibverbs: verbs_absent.c is linked), else the group's result;
 * the fake is reset after the group. */
#define FAKE_HCA_RUN(tests) fake_hca_run(tests, sizeof(tests) / sizeof((tests)[0]))
static int fake_hca_run(const struct CMUnitTest *tests, size_t n)
{
    int (*volatile reg)(void) = pf_verbs_register; /* pulls in verbs.c or verbs_absent.c */
    (void)reg;
    if (!pf_verbs_open_api) {
        printf("SKIP: verbs backend not compiled (configure found no libibverbs)\n");
        return 77;
    }
    int rc = _cmocka_run_group_tests("tests", tests, n, NULL, NULL);
    fake_reset();
    return rc;
}

#endif /* HAVE_IBV_HEADERS */
#endif

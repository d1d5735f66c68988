/* The raw verbs baseline of bench/fabric and bench/p2p: a READ loop written directly against
 * rdma-core (through the backend's pf_verbs_real_api table, so no extra link dependency and
 * no HAL, no engine, no checks), on the same two RDMA devices the measured path uses: a
 * source region registered on device A, a destination on device B, one RC QP on each,
 * connected to each other (port 1, the GID the backend picks: pf_verbs_pick_gid), and READs of one
 * block size keeping up to RV_DEPTH outstanding, completions taken as they come (busy poll, then a
 * wait on the completion channel). Over soft-RoCE the work is the kernel's (rxe) on both ends, so
 * the loop measures what the devices can do.
 *
 *   rv_open(&rv, "rxe0", "rxe1", src, dst, len)  0, or -errno (-ENOSYS: verbs not built)
 *   rv_round(&rv, len, blk)                      seconds for len bytes, or < 0 (also when
 *                                                the destination, cleared before the timed
 *                                                part, is not the source byte for byte after)
 *   rv_close(&rv) */
#ifndef PF_BENCH_RAWVERBS_H
#define PF_BENCH_RAWVERBS_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pf/clock.h"
#include "pf/hal.h"

#if __has_include(<infiniband/verbs.h>)
#include "../hw/verbs/verbs_internal.h"
#pragma weak pf_verbs_real_api
#pragma weak pf_verbs_pick_gid
#define RV_HAVE_VERBS 1
#else
#define RV_HAVE_VERBS 0
#endif

#define RV_DEPTH 128

struct rv_side {
#if RV_HAVE_VERBS
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_mr *mr;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_port_attr port;
    union ibv_gid gid;
    int gid_index;
#endif
    int unused;
};

struct rv {
    struct rv_side a, b; /* a: holder (source), b: reader (destination) */
    void *src, *dst;
    int rd_atomic;
};

#if RV_HAVE_VERBS
static const struct pf_verbs_api *rv_api(void)
{
    return &pf_verbs_real_api ? &pf_verbs_real_api : NULL;
}

static int rv_side_open(struct rv_side *s, const char *dev, void *buf, uint64_t len, int access,
                        int *rd_atomic)
{
    const struct pf_verbs_api *api = rv_api();
    int n = 0;
    struct ibv_device **l = api->get_device_list(&n);
    for (int i = 0; l && i < n; i++)
        if (strcmp(api->get_device_name(l[i]), dev) == 0)
            s->ctx = api->open_device(l[i]);
    if (l)
        api->free_device_list(l);
    if (!s->ctx)
        return -ENODEV;
    struct ibv_device_attr da;
    if (api->query_device(s->ctx, &da) || api->query_port(s->ctx, 1, &s->port))
        return -EIO;
    int rd =
        da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom : da.max_qp_init_rd_atom;
    if (rd < *rd_atomic)
        *rd_atomic = rd < 1 ? 1 : rd;
    /* the backend's own choice (pf_verbs_pick_gid over the whole table, ndev up/down as the
     * backend sees it): an own-rolled "first RoCE v2 that is not link-local" took rxe0's
     * 2001:db8:77::1 in the guest (ci/rxe-vm.sh lists IPv6 and VLAN GIDs ahead of the
     * veth's ::ffff:10.77.0.x), an address pair that is routed through lo, where no rxe
     * device listens: every READ was lost and retried to IBV_WC_RETRY_EXC_ERR */
    int ng = s->port.gid_tbl_len;
    struct ibv_gid_entry *ents = ng > 0 ? calloc((size_t)ng, sizeof(*ents)) : NULL;
    int8_t *up = ng > 0 ? calloc((size_t)ng, sizeof(*up)) : NULL;
    if (!ents || !up) {
        free(ents);
        free(up);
        return ng > 0 ? -ENOMEM : -ENODEV;
    }
    for (int i = 0; i < ng; i++) {
        if (api->query_gid_ex(s->ctx, 1, (uint32_t)i, &ents[i])) {
            memset(&ents[i], 0, sizeof(ents[i])); /* empty: never chosen */
            continue;
        }
        up[i] =
            (int8_t)(ents[i].ndev_ifindex && api->ifindex_up ? api->ifindex_up(ents[i].ndev_ifindex)
                                                             : -1);
    }
    struct pf_verbs_gid_rule any = {.index = -1};
    s->gid_index = pf_verbs_pick_gid(ents, up, ng, &any);
    free(ents);
    free(up);
    if (s->gid_index < 0)
        return -ENOENT;
    struct ibv_gid_entry e;
    if (api->query_gid_ex(s->ctx, 1, (uint32_t)s->gid_index, &e))
        return -EIO;
    s->gid = e.gid;
    s->pd = api->alloc_pd(s->ctx);
    s->mr = s->pd ? api->reg_mr(s->pd, buf, len, access) : NULL;
    s->ch = api->create_comp_channel(s->ctx);
    s->cq = s->ch ? api->create_cq(s->ctx, RV_DEPTH + 1, NULL, s->ch, 0) : NULL;
    if (!s->mr || !s->cq)
        return -ENOMEM;
    struct ibv_qp_init_attr qa = {
        .send_cq = s->cq,
        .recv_cq = s->cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = RV_DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
    s->qp = api->create_qp(s->pd, &qa);
    if (!s->qp)
        return -ENOMEM;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE};
    return api->modify_qp(s->qp, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
               ? -EIO
               : 0;
}

static int rv_connect(struct rv_side *s, const struct rv_side *peer, int rd_atomic)
{
    const struct pf_verbs_api *api = rv_api();
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu =
        s->port.active_mtu < peer->port.active_mtu ? s->port.active_mtu : peer->port.active_mtu;
    a.dest_qp_num = peer->qp->qp_num;
    a.rq_psn = 1;
    a.max_dest_rd_atomic = (uint8_t)rd_atomic;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = 1;
    a.ah_attr.dlid = peer->port.lid;
    if (s->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = peer->gid;
        a.ah_attr.grh.sgid_index = (uint8_t)s->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    if (api->modify_qp(s->qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -EIO;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 6;
    a.rnr_retry = 7;
    a.sq_psn = 1;
    a.max_rd_atomic = (uint8_t)rd_atomic;
    return api->modify_qp(s->qp, &a,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)
               ? -EIO
               : 0;
}

static void rv_side_close(struct rv_side *s)
{
    const struct pf_verbs_api *api = rv_api();
    if (s->qp)
        api->destroy_qp(s->qp);
    if (s->cq)
        api->destroy_cq(s->cq);
    if (s->ch)
        api->destroy_comp_channel(s->ch);
    if (s->mr)
        api->dereg_mr(s->mr);
    if (s->pd)
        api->dealloc_pd(s->pd);
    if (s->ctx)
        api->close_device(s->ctx);
    memset(s, 0, sizeof(*s));
}

static void rv_close(struct rv *r)
{
    if (!rv_api())
        return;
    rv_side_close(&r->b);
    rv_side_close(&r->a);
}

static int rv_open(struct rv *r, const char *dev_a, const char *dev_b, void *src, void *dst,
                   uint64_t len)
{
    memset(r, 0, sizeof(*r));
    int (*volatile reg)(void) = pf_verbs_register; /* pulls in verbs.c or verbs_absent.c */
    (void)reg;
    if (!rv_api())
        return -ENOSYS;
    r->src = src;
    r->dst = dst;
    r->rd_atomic = 16;
    int rc = rv_side_open(&r->a, dev_a, src, len, IBV_ACCESS_REMOTE_READ, &r->rd_atomic);
    if (!rc)
        rc = rv_side_open(&r->b, dev_b, dst, len, IBV_ACCESS_LOCAL_WRITE, &r->rd_atomic);
    if (!rc)
        rc = rv_connect(&r->a, &r->b, r->rd_atomic);
    if (!rc)
        rc = rv_connect(&r->b, &r->a, r->rd_atomic);
    if (rc)
        rv_close(r);
    return rc;
}

/* Waits (at most 10 s) until b's CQ has something: arm, poll once more, sleep on the channel. */
static int rv_wait(struct rv *r, struct ibv_wc *wc, int n)
{
    const struct pf_verbs_api *api = rv_api();
    int k = api->poll_cq(r->b.cq, n, wc);
    if (k)
        return k;
    if (api->req_notify_cq(r->b.cq, 0))
        return -EIO;
    k = api->poll_cq(r->b.cq, n, wc);
    if (k)
        return k;
    struct pollfd p = {.fd = r->b.ch->fd, .events = POLLIN};
    if (poll(&p, 1, 10000) <= 0)
        return -ETIMEDOUT;
    struct ibv_cq *cq;
    void *cctx;
    if (api->get_cq_event(r->b.ch, &cq, &cctx))
        return -EIO;
    api->ack_cq_events(cq, 1);
    return api->poll_cq(r->b.cq, n, wc);
}

static double rv_round(struct rv *r, uint64_t len, uint64_t blk)
{
    const struct pf_verbs_api *api = rv_api();
    uint64_t n = (len + blk - 1) / blk, posted = 0, done = 0, out = 0;
    memset(r->dst, 0, len); /* outside the timing, as the byte check after it */
    uint64_t t0 = pf_now_ns();
    while (done < n) {
        while (posted < n && out < RV_DEPTH) {
            uint64_t off = posted * blk, l = len - off < blk ? len - off : blk;
            struct ibv_sge sge = {
                .addr = (uintptr_t)r->dst + off, .length = (uint32_t)l, .lkey = r->b.mr->lkey};
            struct ibv_send_wr wr = {.wr_id = posted,
                                     .sg_list = &sge,
                                     .num_sge = 1,
                                     .opcode = IBV_WR_RDMA_READ,
                                     .send_flags = IBV_SEND_SIGNALED},
                               *bad;
            wr.wr.rdma.remote_addr = (uintptr_t)r->src + off;
            wr.wr.rdma.rkey = r->a.mr->rkey;
            if (api->post_send(r->b.qp, &wr, &bad))
                return -1;
            posted++;
            out++;
        }
        struct ibv_wc wc[64];
        int k = rv_wait(r, wc, 64);
        if (k < 0)
            return -1;
        for (int i = 0; i < k; i++)
            if (wc[i].status != IBV_WC_SUCCESS) {
                fprintf(stderr, "raw verbs READ %llu: work completion status %d\n",
                        (unsigned long long)wc[i].wr_id, (int)wc[i].status);
                return -1;
            }
        done += (uint64_t)k;
        out -= (uint64_t)k;
    }
    double secs = (double)(pf_now_ns() - t0) / 1e9;
    if (memcmp(r->dst, r->src, len) != 0) {
        fprintf(stderr, "raw verbs READ: %llu bytes completed but differ from the source\n",
                (unsigned long long)len);
        return -1;
    }
    return secs;
}
#else
static int rv_open(struct rv *r, const char *dev_a, const char *dev_b, void *src, void *dst,
                   uint64_t len)
{
    (void)r, (void)dev_a, (void)dev_b, (void)src, (void)dst, (void)len;
    return -ENOSYS;
}
static double rv_round(struct rv *r, uint64_t len, uint64_t blk)
{
    (void)r, (void)len, (void)blk;
    return -1;
}
static void rv_close(struct rv *r)
{
    (void)r;
}
#endif

#endif

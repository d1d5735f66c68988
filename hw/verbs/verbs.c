/* verbs NET backend ("verbs", hardware): rdma-core RC queue pairs, one-sided RDMA READ.
 *
 * NICs: each --nics name is an RDMA device (mlx5_0, rxe0); it is opened with one protection
 * domain, its first ACTIVE port (an InfiniBand port must have a LID), a GID chosen by
 * pf_verbs_pick_gid and its NUMA node from /sys/class/infiniband/<dev>/device/numa_node.
 * reg_mem is ibv_reg_mr on that PD; the backend also keeps its own region list so post_read
 * rejects SGEs outside a locally writable region (-EINVAL) instead of producing a local
 * protection error.
 *
 * QPs follow the reference (§7.3): RC, send queue 128 WRs, up to 16 SGEs (bounded by the
 * device's max_sge_rd), a recv queue of 1, its own CQ with a completion channel,
 * max_rd_atomic = max_dest_rd_atomic = 16 (bounded by the device), min_rnr_timer 12,
 * timeout 14, retry 7 (6 on soft-RoCE, where 7 means forever), rnr retry 7; over Ethernet (RoCE)
 * the address vector uses the remote GID, the local GID index and hop limit 64. The endpoint blob
 * carries GID, LID, QPN, PSN, MTU and link layer; qp_connect moves INIT -> RTR -> RTS with path MTU
 * = min of both ends.
 *
 * post_read posts one signalled IBV_WR_RDMA_READ; at most 128 WRs are outstanding (posted and
 * not yet polled) per QP, else -EAGAIN. poll drains the CQ (RC completes in order, so each
 * completion is matched with the oldest posted WR for its length) and otherwise sleeps on
 * the completion channel and an eventfd until the timeout. An error completion moves the QP
 * to the error state (as the hardware does): later posts get -ENOTCONN.
 *
 * qp_invalidate moves the QP to ERR and polls the CQ until every outstanding WR has
 * completed or been flushed (the flushed ones become -ECANCELED completions that poll still
 * returns). Only then can no DMA for that QP reach local memory, which is what makes freeing
 * staging memory safe (the reference's use-after-free). If flushes do not arrive within
 * drain_ms the QP is destroyed, which also stops the HCA, and the rest is reported
 * -ECANCELED. */
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

#define VERBS_EP_MAGIC   0x45564650u /* "PFVE" */
#define VERBS_EP_VERSION 1u
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
    int numa;
    int max_sge;
    int rd_atomic;
    int retry_cnt; /* RC retry count for this device (see PF_VERBS_SOFT_ROCE_VENDOR) */
    pthread_rwlock_t mr_lock;
    struct verbsmr *mrs;
};

struct verbsnet {
    struct pf_net base;
    const struct pf_verbs_api *api;
    int nnics;
    struct verbsnic *nics;
};

enum verbsqp_state { VQ_INIT, VQ_RTS, VQ_ERR };

struct verbsout {
    uint64_t wr_id, len;
};

struct verbsqp {
    struct pf_net_qp base;
    struct verbsnic *nic;
    const struct pf_verbs_api *api;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t psn;
    int evfd;
    pthread_mutex_t mu;
    int state;
    bool armed;
    uint32_t out_head, out_count; /* posted, not completed (post order) */
    struct verbsout out[PF_VERBS_SQ_DEPTH];
    uint32_t sw_head, sw_count; /* completed, not yet returned by poll */
    struct pf_net_cqe sw[PF_VERBS_SQ_DEPTH];
};

static const struct pf_net_ops verbs_ops;

static struct verbsnet *verbs_of(struct pf_net *n)
{
    return pf_container_of(n, struct verbsnet, base);
}

static struct verbsqp *verbs_qp(struct pf_net_qp *q)
{
    return pf_container_of(q, struct verbsqp, base);
}

/* ibv functions return an errno (positive), or -1 with errno set, depending on provider. */
static int verbs_rc(int rc)
{
    if (rc == 0)
        return 0;
    if (rc > 0)
        return -rc;
    return errno ? -errno : -EIO;
}

/* ---------------------------------------------------------------- pure helpers */

static bool verbs_gid_zero(const union ibv_gid *g)
{
    static const uint8_t z[16];
    return memcmp(g->raw, z, 16) == 0;
}

static bool verbs_gid_link_local(const union ibv_gid *g)
{
    return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
}

int pf_verbs_pick_gid(const struct ibv_gid_entry *ents, int n)
{
    for (int i = 0; i < n; i++)
        if (!verbs_gid_zero(&ents[i].gid) && ents[i].gid_type == IBV_GID_TYPE_ROCE_V2 &&
            !verbs_gid_link_local(&ents[i].gid))
            return i;
    for (int i = 0; i < n; i++)
        if (!verbs_gid_zero(&ents[i].gid) && ents[i].gid_type == IBV_GID_TYPE_IB)
            return i;
    for (int i = 0; i < n; i++)
        if (!verbs_gid_zero(&ents[i].gid) && !verbs_gid_link_local(&ents[i].gid))
            return i;
    return 0;
}

int pf_verbs_wc_errno(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
        return 0;
    case IBV_WC_WR_FLUSH_ERR:
        return -ECANCELED;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_INV_EEC_STATE_ERR:
        return -EREMOTEIO;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
        return -ETIMEDOUT;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_MW_BIND_ERR:
        return -EFAULT;
    case IBV_WC_LOC_LEN_ERR:
        return -EMSGSIZE;
    case IBV_WC_BAD_RESP_ERR:
        return -EPROTO;
    default:
        return -EIO;
    }
}

static int verbs_read_numa(const struct pf_verbs_api *api, const char *dev)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/class/infiniband/%s/device/numa_node",
             api->sysfs_root ? api->sysfs_root : "/sys", dev);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1)
        node = -1;
    fclose(f);
    return node < 0 ? -1 : node;
}

static void verbs_gid_str(const union ibv_gid *g, char *out, size_t len)
{
    if (!inet_ntop(AF_INET6, g->raw, out, (socklen_t)len))
        snprintf(out, len, "?");
}

/* ---------------------------------------------------------------- NIC open */

static int verbs_pick_port(struct verbsnic *nic, const struct pf_verbs_api *api,
                           const struct ibv_device_attr *da)
{
    for (int p = 1; p <= da->phys_port_cnt; p++) {
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof(pa));
        int rc = verbs_rc(api->query_port(nic->ctx, (uint8_t)p, &pa));
        if (rc) {
            pf_warn("verbs %s: query port %d: %s", nic->name, p, strerror(-rc));
            continue;
        }
        if (pa.state != IBV_PORT_ACTIVE)
            continue;
        if (pa.link_layer != IBV_LINK_LAYER_ETHERNET && pa.lid == 0) {
            pf_warn("verbs %s: port %d is ACTIVE InfiniBand without a LID (no subnet manager?)",
                    nic->name, p);
            continue;
        }
        nic->port = (uint8_t)p;
        nic->port_attr = pa;
        return 0;
    }
    pf_error("verbs %s: no ACTIVE port among %d", nic->name, da->phys_port_cnt);
    return -ENETDOWN;
}

static int verbs_pick_gid_of(struct verbsnic *nic, const struct pf_verbs_api *api)
{
    int n = nic->port_attr.gid_tbl_len;
    if (n <= 0) {
        pf_error("verbs %s: port %u has an empty GID table", nic->name, nic->port);
        return -ENODEV;
    }
    struct ibv_gid_entry *e = calloc((size_t)n, sizeof(*e));
    if (!e)
        return -ENOMEM;
    for (int i = 0; i < n; i++)
        if (api->query_gid_ex(nic->ctx, nic->port, (uint32_t)i, &e[i]) != 0)
            memset(&e[i], 0, sizeof(e[i])); /* empty or unreadable: never chosen */
    nic->gid_index = pf_verbs_pick_gid(e, n);
    nic->gid = e[nic->gid_index].gid;
    free(e);
    return 0;
}

static void verbs_nic_fini(struct verbsnic *nic, const struct pf_verbs_api *api)
{
    while (nic->mrs) {
        struct verbsmr *m = nic->mrs;
        nic->mrs = m->next;
        pf_warn("verbs %s: region %p still registered at close", nic->name, m->base.addr);
        api->dereg_mr(m->mr);
        free(m);
    }
    if (nic->pd)
        api->dealloc_pd(nic->pd);
    if (nic->ctx)
        api->close_device(nic->ctx);
    nic->pd = NULL;
    nic->ctx = NULL;
    pthread_rwlock_destroy(&nic->mr_lock);
}

static int verbs_nic_init(struct verbsnet *v, struct verbsnic *nic, struct ibv_device *dev)
{
    const struct pf_verbs_api *api = v->api;
    nic->net = v;
    pthread_rwlock_init(&nic->mr_lock, NULL);
    nic->ctx = api->open_device(dev);
    if (!nic->ctx) {
        int e = errno ? errno : ENODEV;
        pf_error("verbs %s: cannot open device: %s", nic->name, strerror(e));
        return -e;
    }
    struct ibv_device_attr da;
    memset(&da, 0, sizeof(da));
    int rc = verbs_rc(api->query_device(nic->ctx, &da));
    if (rc) {
        pf_error("verbs %s: query device: %s", nic->name, strerror(-rc));
        return rc;
    }
    rc = verbs_pick_port(nic, api, &da);
    if (rc)
        return rc;
    rc = verbs_pick_gid_of(nic, api);
    if (rc)
        return rc;
    nic->pd = api->alloc_pd(nic->ctx);
    if (!nic->pd) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: alloc PD: %s", nic->name, strerror(-rc));
        return rc;
    }
    int sge = da.max_sge_rd > 0 && da.max_sge_rd < da.max_sge ? da.max_sge_rd : da.max_sge;
    nic->max_sge = sge < 1 ? 1 : sge > PF_VERBS_MAX_SGE ? PF_VERBS_MAX_SGE : sge;
    int rd =
        da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom : da.max_qp_init_rd_atom;
    nic->rd_atomic = rd <= 0 ? 1 : rd > PF_VERBS_RD_ATOMIC ? PF_VERBS_RD_ATOMIC : rd;
    nic->retry_cnt =
        da.vendor_id == PF_VERBS_SOFT_ROCE_VENDOR ? PF_VERBS_SOFT_ROCE_RETRY : PF_VERBS_RETRY;
    nic->numa = verbs_read_numa(api, nic->name);
    char g[64];
    verbs_gid_str(&nic->gid, g, sizeof(g));
    pf_info("verbs NIC %s: port %u (%s, LID %u, MTU %d) GID[%d] %s NUMA node %d, %d SGEs, "
            "rd_atomic %d, vendor 0x%x, retry %d",
            nic->name, nic->port,
            nic->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet/RoCE" : "InfiniBand",
            nic->port_attr.lid, 128 << nic->port_attr.active_mtu, nic->gid_index, g, nic->numa,
            nic->max_sge, nic->rd_atomic, da.vendor_id, nic->retry_cnt);
    return 0;
}

static void verbs_close(struct pf_net *n)
{
    if (!n)
        return;
    struct verbsnet *v = verbs_of(n);
    for (int i = 0; i < v->nnics; i++)
        verbs_nic_fini(&v->nics[i], v->api);
    free(v->nics);
    free(v);
}

int pf_verbs_open_api(const struct pf_verbs_api *api, const struct pf_net_config *cfg,
                      struct pf_net **n_p)
{
    int ndev = 0;
    errno = 0;
    struct ibv_device **list = api->get_device_list(&ndev);
    if (!list || ndev <= 0) {
        int e = errno;
        pf_info("verbs: no RDMA device (%s)", list ? "empty device list"
                                              : e  ? strerror(e)
                                                   : "no device list");
        if (list)
            api->free_device_list(list);
        return -ENODEV;
    }
    int rc;
    if (!cfg || !cfg->nics || cfg->nnics == 0 || cfg->nnics > VERBS_MAX_NICS) {
        pf_error("verbs: --nics must name 1 to %d RDMA devices", VERBS_MAX_NICS);
        rc = -EINVAL;
        goto err_list;
    }
    struct verbsnet *v = calloc(1, sizeof(*v));
    if (!v) {
        rc = -ENOMEM;
        goto err_list;
    }
    v->base.ops = &verbs_ops;
    v->api = api;
    v->nics = calloc(cfg->nnics, sizeof(*v->nics));
    if (!v->nics) {
        rc = -ENOMEM;
        goto err_net;
    }
    for (size_t i = 0; i < cfg->nnics; i++) {
        struct ibv_device *dev = NULL;
        for (int d = 0; d < ndev && !dev; d++)
            if (strcmp(api->get_device_name(list[d]), cfg->nics[i]) == 0)
                dev = list[d];
        if (!dev) {
            char have[256] = "";
            for (int d = 0; d < ndev; d++)
                snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s", d ? ", " : "",
                         api->get_device_name(list[d]));
            pf_error("verbs: no RDMA device named '%s' (devices: %s)", cfg->nics[i], have);
            rc = -ENODEV;
            goto err_net;
        }
        v->nnics = (int)i + 1;
        snprintf(v->nics[i].name, sizeof(v->nics[i].name), "%s", cfg->nics[i]);
        rc = verbs_nic_init(v, &v->nics[i], dev);
        if (rc)
            goto err_net;
    }
    api->free_device_list(list);
    *n_p = &v->base;
    return 0;

err_net:
    verbs_close(&v->base);
err_list:
    api->free_device_list(list);
    return rc;
}

/* ---------------------------------------------------------------- NIC info, regions */

static int verbs_nic_count(struct pf_net *n)
{
    return verbs_of(n)->nnics;
}

static int verbs_nic_info(struct pf_net *n, int i, struct pf_net_nic_info *info_p)
{
    struct verbsnet *v = verbs_of(n);
    if (i < 0 || i >= v->nnics || !info_p)
        return -EINVAL;
    struct verbsnic *nic = &v->nics[i];
    memset(info_p, 0, sizeof(*info_p));
    snprintf(info_p->name, sizeof(info_p->name), "%s", nic->name);
    verbs_gid_str(&nic->gid, info_p->addr, sizeof(info_p->addr));
    info_p->numa_node = nic->numa;
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    info_p->active =
        v->api->query_port(nic->ctx, nic->port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
    return 0;
}

static int verbs_reg_mem(struct pf_net *n, int i, void *addr, uint64_t len, unsigned access,
                         struct pf_net_mr **mr_p)
{
    struct verbsnet *v = verbs_of(n);
    const unsigned known =
        PF_NET_ACCESS_LOCAL_WRITE | PF_NET_ACCESS_REMOTE_READ | PF_NET_ACCESS_REMOTE_WRITE;
    uint64_t end;
    if (i < 0 || i >= v->nnics || !addr || len == 0 || (access & ~known) ||
        !pf_add_ok((uint64_t)(uintptr_t)addr, len, &end))
        return -EINVAL;
    struct verbsnic *nic = &v->nics[i];
    int ia = 0;
    if (access & PF_NET_ACCESS_LOCAL_WRITE)
        ia |= IBV_ACCESS_LOCAL_WRITE;
    if (access & PF_NET_ACCESS_REMOTE_READ)
        ia |= IBV_ACCESS_REMOTE_READ;
    if (access & PF_NET_ACCESS_REMOTE_WRITE)
        ia |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE; /* verbs requires both */
    struct verbsmr *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    errno = 0;
    m->mr = v->api->reg_mr(nic->pd, addr, len, ia);
    if (!m->mr) {
        int rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: ibv_reg_mr %p+%llu: %s", nic->name, addr, (unsigned long long)len,
                 strerror(-rc));
        free(m);
        return rc;
    }
    m->nic = nic;
    m->access = access;
    m->base.net = n;
    m->base.nic = i;
    m->base.addr = addr;
    m->base.len = len;
    m->base.lkey = m->mr->lkey;
    m->base.rkey = m->mr->rkey;
    pthread_rwlock_wrlock(&nic->mr_lock);
    m->next = nic->mrs;
    nic->mrs = m;
    pthread_rwlock_unlock(&nic->mr_lock);
    pf_debug("verbs %s: registered %p+%llu rkey 0x%08x", nic->name, addr, (unsigned long long)len,
             m->base.rkey);
    *mr_p = &m->base;
    return 0;
}

static void verbs_dereg_mem(struct pf_net_mr *mrb)
{
    if (!mrb)
        return;
    struct verbsmr *m = pf_container_of(mrb, struct verbsmr, base);
    struct verbsnic *nic = m->nic;
    pthread_rwlock_wrlock(&nic->mr_lock);
    for (struct verbsmr **pp = &nic->mrs; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    pthread_rwlock_unlock(&nic->mr_lock);
    int rc = verbs_rc(nic->net->api->dereg_mr(m->mr));
    if (rc)
        pf_error("verbs %s: ibv_dereg_mr %p: %s", nic->name, m->base.addr, strerror(-rc));
    free(m);
}

/* ---------------------------------------------------------------- QPs */

static int verbs_qp_create(struct pf_net *n, int i, struct pf_net_qp **qp_p)
{
    struct verbsnet *v = verbs_of(n);
    const struct pf_verbs_api *api = v->api;
    if (i < 0 || i >= v->nnics)
        return -EINVAL;
    struct verbsnic *nic = &v->nics[i];
    struct verbsqp *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
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
    errno = 0;
    q->ch = api->create_comp_channel(nic->ctx);
    if (!q->ch) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: create completion channel: %s", nic->name, strerror(-rc));
        goto err_evfd;
    }
    int fl = fcntl(q->ch->fd, F_GETFL);
    if (fl < 0 || fcntl(q->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        rc = -errno;
        goto err_ch;
    }
    q->cq = api->create_cq(nic->ctx, PF_VERBS_SQ_DEPTH + 1, q, q->ch, 0);
    if (!q->cq) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: create CQ: %s", nic->name, strerror(-rc));
        goto err_ch;
    }
    struct ibv_qp_init_attr ia = {
        .send_cq = q->cq,
        .recv_cq = q->cq,
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
        .cap = {.max_send_wr = PF_VERBS_SQ_DEPTH,
                .max_recv_wr = 1,
                .max_send_sge = (uint32_t)nic->max_sge,
                .max_recv_sge = 1},
    };
    q->qp = api->create_qp(nic->pd, &ia);
    if (!q->qp) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: create RC QP: %s", nic->name, strerror(-rc));
        goto err_cq;
    }
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .pkey_index = 0,
                            .port_num = nic->port,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                               IBV_ACCESS_REMOTE_WRITE};
    rc = verbs_rc(api->modify_qp(
        q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    if (rc) {
        pf_error("verbs %s: QP to INIT: %s", nic->name, strerror(-rc));
        goto err_qp;
    }
    pthread_mutex_init(&q->mu, NULL);
    q->state = VQ_INIT;
    *qp_p = &q->base;
    return 0;

err_qp:
    api->destroy_qp(q->qp);
err_cq:
    api->destroy_cq(q->cq);
err_ch:
    api->destroy_comp_channel(q->ch);
err_evfd:
    close(q->evfd);
err_free:
    free(q);
    return rc;
}

static int verbs_qp_local_endpoint(struct pf_net_qp *qpb, void *buf, size_t cap, size_t *len_p)
{
    struct verbsqp *q = verbs_qp(qpb);
    if (!buf || cap < PF_VERBS_EP_LEN)
        return -ENOSPC;
    if (!q->qp) /* destroyed by an invalidate whose flushes never came */
        return -ENOTCONN;
    uint8_t *p = buf;
    memset(p, 0, PF_VERBS_EP_LEN);
    uint32_t magic = VERBS_EP_MAGIC, qpn = q->qp->qp_num, psn = q->psn;
    uint16_t lid = q->nic->port_attr.lid;
    for (int k = 0; k < 4; k++) {
        p[k] = (uint8_t)(magic >> (8 * k));
        p[24 + k] = (uint8_t)(qpn >> (8 * k));
        p[28 + k] = (uint8_t)(psn >> (8 * k));
    }
    p[4] = VERBS_EP_VERSION;
    p[5] = (uint8_t)q->nic->port_attr.active_mtu;
    p[6] = q->nic->port_attr.link_layer;
    memcpy(p + 8, q->nic->gid.raw, 16);
    p[32] = (uint8_t)lid;
    p[33] = (uint8_t)(lid >> 8);
    *len_p = PF_VERBS_EP_LEN;
    return 0;
}

static int verbs_qp_connect(struct pf_net_qp *qpb, const void *ep, size_t len)
{
    struct verbsqp *q = verbs_qp(qpb);
    struct verbsnic *nic = q->nic;
    const uint8_t *p = ep;
    if (!ep || len != PF_VERBS_EP_LEN)
        return -EINVAL;
    uint32_t magic = 0, qpn = 0, psn = 0;
    for (int k = 3; k >= 0; k--) {
        magic = magic << 8 | p[k];
        qpn = qpn << 8 | p[24 + k];
        psn = psn << 8 | p[28 + k];
    }
    uint16_t lid = (uint16_t)(p[32] | p[33] << 8);
    enum ibv_mtu mtu = (enum ibv_mtu)p[5];
    if (magic != VERBS_EP_MAGIC || p[4] != VERBS_EP_VERSION || mtu < IBV_MTU_256 ||
        mtu > IBV_MTU_4096 || psn > 0xffffff || qpn > 0xffffff) {
        pf_warn("verbs %s: qp_connect: malformed endpoint", nic->name);
        return -EINVAL;
    }
    if (p[6] != nic->port_attr.link_layer) {
        pf_warn("verbs %s: qp_connect: peer link layer %u differs from ours (%u)", nic->name, p[6],
                nic->port_attr.link_layer);
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
    a.path_mtu = mtu < nic->port_attr.active_mtu ? mtu : nic->port_attr.active_mtu;
    a.dest_qp_num = qpn;
    a.rq_psn = psn;
    a.max_dest_rd_atomic = (uint8_t)nic->rd_atomic;
    a.min_rnr_timer = PF_VERBS_MIN_RNR;
    a.ah_attr.dlid = lid;
    a.ah_attr.sl = 0;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = nic->port;
    if (nic->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, p + 8, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)nic->gid_index;
        a.ah_attr.grh.hop_limit = PF_VERBS_HOP_LIMIT;
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
    a.timeout = PF_VERBS_TIMEOUT;
    a.retry_cnt = (uint8_t)nic->retry_cnt;
    a.rnr_retry = PF_VERBS_RNR_RETRY;
    a.sq_psn = q->psn;
    a.max_rd_atomic = (uint8_t)nic->rd_atomic;
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

static int verbs_post_read(struct pf_net_qp *qpb, const struct pf_net_sge *sge, size_t nsge,
                           uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    struct verbsqp *q = verbs_qp(qpb);
    struct verbsnic *nic = q->nic;
    if (!sge || nsge == 0 || nsge > (size_t)nic->max_sge)
        return -EINVAL;
    struct ibv_sge isge[PF_VERBS_MAX_SGE];
    uint64_t total = 0;
    pthread_rwlock_rdlock(&nic->mr_lock);
    for (size_t i = 0; i < nsge; i++) {
        uint64_t a = (uint64_t)(uintptr_t)sge[i].addr, end;
        bool ok = sge[i].addr && sge[i].len > 0 && sge[i].len <= UINT32_MAX &&
                  pf_add_ok(a, sge[i].len, &end) && pf_add_ok(total, sge[i].len, &total);
        const struct verbsmr *m = nic->mrs;
        for (; ok && m; m = m->next)
            if (m->base.lkey == sge[i].lkey && (m->access & PF_NET_ACCESS_LOCAL_WRITE) &&
                a >= (uint64_t)(uintptr_t)m->base.addr &&
                end <= (uint64_t)(uintptr_t)m->base.addr + m->base.len)
                break;
        if (!ok || !m) {
            pthread_rwlock_unlock(&nic->mr_lock);
            pf_log_ratelimited(PF_LOG_WARN, 1000,
                               "verbs %s: post_read: SGE %zu (%p+%llu lkey 0x%08x) is not "
                               "inside a locally writable region",
                               nic->name, i, sge[i].addr, (unsigned long long)sge[i].len,
                               sge[i].lkey);
            return -EINVAL;
        }
        isge[i] = (struct ibv_sge){.addr = a, .length = (uint32_t)sge[i].len, .lkey = sge[i].lkey};
    }
    pthread_rwlock_unlock(&nic->mr_lock);
    if (total > VERBS_MAX_READ)
        return -EINVAL;
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = isge;
    wr.num_sge = (int)nsge;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    int rc = 0;
    pthread_mutex_lock(&q->mu);
    if (q->state != VQ_RTS) {
        rc = -ENOTCONN;
    } else if (q->out_count + q->sw_count >= PF_VERBS_SQ_DEPTH) {
        rc = -EAGAIN;
    } else {
        rc = verbs_rc(q->api->post_send(q->qp, &wr, &bad));
        if (rc == -ENOMEM) /* send queue full in the provider */
            rc = -EAGAIN;
        if (rc == 0) {
            q->out[(q->out_head + q->out_count) % PF_VERBS_SQ_DEPTH] =
                (struct verbsout){wr_id, total};
            q->out_count++;
        } else if (rc != -EAGAIN) {
            pf_log_ratelimited(PF_LOG_WARN, 1000, "verbs %s: ibv_post_send: %s", nic->name,
                               strerror(-rc));
        }
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

/* Turns a work completion into a record, matching it with its posted WR. Caller holds mu. */
static struct pf_net_cqe verbs_take(struct verbsqp *q, const struct ibv_wc *wc)
{
    struct pf_net_cqe c = {.wr_id = wc->wr_id, .status = pf_verbs_wc_errno(wc->status)};
    uint32_t k = 0;
    while (k < q->out_count && q->out[(q->out_head + k) % PF_VERBS_SQ_DEPTH].wr_id != wc->wr_id)
        k++;
    if (k < q->out_count) {
        uint32_t at = (q->out_head + k) % PF_VERBS_SQ_DEPTH;
        if (c.status == 0)
            c.bytes = q->out[at].len;
        /* RC completes in order: k is 0 unless wr_ids repeat; keep the ring compact */
        for (uint32_t j = k; j > 0; j--)
            q->out[(q->out_head + j) % PF_VERBS_SQ_DEPTH] =
                q->out[(q->out_head + j - 1) % PF_VERBS_SQ_DEPTH];
        q->out_head = (q->out_head + 1) % PF_VERBS_SQ_DEPTH;
        q->out_count--;
    }
    if (c.status && c.status != -ECANCELED && q->state != VQ_ERR) {
        pf_log_ratelimited(PF_LOG_WARN, 1000,
                           "verbs %s: QP 0x%x READ failed: %s (%s): QP in error state",
                           q->nic->name, q->qp ? q->qp->qp_num : 0, ibv_wc_status_str(wc->status),
                           strerror(-c.status));
        q->state = VQ_ERR;
    }
    return c;
}

/* Moves completions from the CQ to the software queue. Caller holds mu. 0 or -errno. */
static int verbs_drain_cq(struct verbsqp *q)
{
    if (!q->qp)
        return 0;
    struct ibv_wc wc[32];
    for (;;) {
        int room = PF_VERBS_SQ_DEPTH - (int)q->sw_count;
        if (room <= 0)
            return 0;
        int n = q->api->poll_cq(q->cq, room < 32 ? room : 32, wc);
        if (n < 0)
            return -EIO;
        for (int i = 0; i < n; i++) {
            q->sw[(q->sw_head + q->sw_count) % PF_VERBS_SQ_DEPTH] = verbs_take(q, &wc[i]);
            q->sw_count++;
        }
        if (n < 32)
            return 0;
    }
}

static int verbs_poll(struct pf_net_qp *qpb, struct pf_net_cqe *out, size_t max,
                      uint64_t timeout_ms)
{
    struct verbsqp *q = verbs_qp(qpb);
    if (max == 0)
        return 0;
    if (!out)
        return -EINVAL;
    uint64_t deadline = timeout_ms > UINT64_MAX / PF_NS_PER_MS / 2
                            ? UINT64_MAX / 2
                            : pf_now_ns() + timeout_ms * PF_NS_PER_MS;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int rc = verbs_drain_cq(q);
        size_t n = 0;
        while (n < max && q->sw_count) {
            out[n++] = q->sw[q->sw_head];
            q->sw_head = (q->sw_head + 1) % PF_VERBS_SQ_DEPTH;
            q->sw_count--;
        }
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
        if (!q->armed && q->qp) {
            rc = verbs_rc(q->api->req_notify_cq(q->cq, 0));
            if (rc) {
                pthread_mutex_unlock(&q->mu);
                return rc;
            }
            q->armed = true;
            pthread_mutex_unlock(&q->mu);
            continue; /* poll once more: a completion may have raced the arming */
        }
        pthread_mutex_unlock(&q->mu);
        uint64_t ms = (deadline - now + PF_NS_PER_MS - 1) / PF_NS_PER_MS;
        struct pollfd pf[2] = {{.fd = q->ch->fd, .events = POLLIN},
                               {.fd = q->evfd, .events = POLLIN}};
        int r = poll(pf, 2, ms > 60000 ? 60000 : (int)ms);
        if (r < 0 && errno != EINTR)
            return -errno;
        if (r > 0 && (pf[0].revents & POLLIN)) {
            struct ibv_cq *ecq;
            void *ectx;
            pthread_mutex_lock(&q->mu);
            if (q->api->get_cq_event(q->ch, &ecq, &ectx) == 0) {
                q->api->ack_cq_events(ecq, 1);
                q->armed = false;
            }
            pthread_mutex_unlock(&q->mu);
        }
        if (r > 0 && (pf[1].revents & POLLIN)) {
            uint64_t v;
            if (read(q->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                return -errno;
        }
    }
}

static void verbs_qp_invalidate(struct pf_net_qp *qpb)
{
    struct verbsqp *q = verbs_qp(qpb);
    struct verbsnic *nic = q->nic;
    pthread_mutex_lock(&q->mu);
    bool was_err = q->state == VQ_ERR;
    q->state = VQ_ERR;
    if (q->qp && (!was_err || q->out_count)) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        int rc = verbs_rc(q->api->modify_qp(q->qp, &a, IBV_QP_STATE));
        if (rc)
            pf_error("verbs %s: QP 0x%x to ERR: %s", nic->name, q->qp->qp_num, strerror(-rc));
        /* every outstanding WR completes or flushes; until then the HCA may still DMA */
        uint64_t deadline = pf_now_ns() + q->api->drain_ms * PF_NS_PER_MS;
        unsigned sleep_us = 10;
        while (q->out_count > 0 && rc == 0) {
            uint32_t before = q->out_count;
            if (verbs_drain_cq(q)) {
                rc = -EIO;
                break;
            }
            if (q->out_count == 0)
                break;
            if (pf_now_ns() >= deadline) {
                rc = -ETIMEDOUT;
                break;
            }
            if (q->out_count == before) {
                struct timespec ts = {0, (long)sleep_us * 1000};
                nanosleep(&ts, NULL);
                sleep_us = sleep_us < 1000 ? sleep_us * 2 : 1000;
            }
        }
        if (q->out_count > 0) {
            /* no flush: destroying the QP is the remaining way to stop the HCA */
            pf_error("verbs %s: QP 0x%x: %u WRs not flushed (%s): destroying the QP", nic->name,
                     q->qp->qp_num, q->out_count, strerror(-rc));
            int drc = verbs_rc(q->api->destroy_qp(q->qp));
            if (drc)
                pf_error("verbs %s: ibv_destroy_qp: %s", nic->name, strerror(-drc));
            q->qp = NULL;
            while (q->out_count > 0) {
                struct ibv_wc wc = {.wr_id = q->out[q->out_head].wr_id,
                                    .status = IBV_WC_WR_FLUSH_ERR};
                q->sw[(q->sw_head + q->sw_count) % PF_VERBS_SQ_DEPTH] = verbs_take(q, &wc);
                q->sw_count++;
            }
        }
    }
    pthread_mutex_unlock(&q->mu);
    uint64_t one = 1;
    if (write(q->evfd, &one, sizeof(one)) < 0)
        pf_debug("verbs %s: waking poller: %s", nic->name, strerror(errno));
}

static void verbs_qp_destroy(struct pf_net_qp *qpb)
{
    if (!qpb)
        return;
    struct verbsqp *q = verbs_qp(qpb);
    const struct pf_verbs_api *api = q->api;
    verbs_qp_invalidate(qpb);
    if (q->qp) {
        int rc = verbs_rc(api->destroy_qp(q->qp));
        if (rc)
            pf_error("verbs %s: ibv_destroy_qp: %s", q->nic->name, strerror(-rc));
    }
    int rc = verbs_rc(api->destroy_cq(q->cq));
    if (rc)
        pf_error("verbs %s: ibv_destroy_cq: %s", q->nic->name, strerror(-rc));
    api->destroy_comp_channel(q->ch);
    close(q->evfd);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

static const struct pf_net_ops verbs_ops = {
    .name = "verbs",
    .nic_count = verbs_nic_count,
    .nic_info = verbs_nic_info,
    .reg_mem = verbs_reg_mem,
    .dereg_mem = verbs_dereg_mem,
    .qp_create = verbs_qp_create,
    .qp_local_endpoint = verbs_qp_local_endpoint,
    .qp_connect = verbs_qp_connect,
    .post_read = verbs_post_read,
    .poll = verbs_poll,
    .qp_invalidate = verbs_qp_invalidate,
    .qp_destroy = verbs_qp_destroy,
    .close = verbs_close,
};

/* ---------------------------------------------------------------- rdma-core table */

static const char *verbs_real_device_name(struct ibv_device *d)
{
    return ibv_get_device_name(d);
}
static int verbs_real_query_port(struct ibv_context *c, uint8_t p, struct ibv_port_attr *a)
{
    return ibv_query_port(c, p, a);
}
static int verbs_real_query_gid_ex(struct ibv_context *c, uint32_t p, uint32_t i,
                                   struct ibv_gid_entry *e)
{
    return ibv_query_gid_ex(c, p, i, e, 0);
}
static struct ibv_mr *verbs_real_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int acc)
{
    return ibv_reg_mr(pd, addr, len, acc);
}
static int verbs_real_req_notify(struct ibv_cq *cq, int so)
{
    return ibv_req_notify_cq(cq, so);
}
static int verbs_real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return ibv_post_send(qp, wr, bad);
}
static int verbs_real_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    return ibv_poll_cq(cq, n, wc);
}

const struct pf_verbs_api pf_verbs_real_api = {
    .get_device_list = ibv_get_device_list,
    .free_device_list = ibv_free_device_list,
    .get_device_name = verbs_real_device_name,
    .open_device = ibv_open_device,
    .close_device = ibv_close_device,
    .query_device = ibv_query_device,
    .query_port = verbs_real_query_port,
    .query_gid_ex = verbs_real_query_gid_ex,
    .alloc_pd = ibv_alloc_pd,
    .dealloc_pd = ibv_dealloc_pd,
    .reg_mr = verbs_real_reg_mr,
    .dereg_mr = ibv_dereg_mr,
    .create_comp_channel = ibv_create_comp_channel,
    .destroy_comp_channel = ibv_destroy_comp_channel,
    .create_cq = ibv_create_cq,
    .destroy_cq = ibv_destroy_cq,
    .req_notify_cq = verbs_real_req_notify,
    .get_cq_event = ibv_get_cq_event,
    .ack_cq_events = ibv_ack_cq_events,
    .create_qp = ibv_create_qp,
    .destroy_qp = ibv_destroy_qp,
    .modify_qp = ibv_modify_qp,
    .post_send = verbs_real_post_send,
    .poll_cq = verbs_real_poll_cq,
    .sysfs_root = "/sys",
    .drain_ms = PF_VERBS_DRAIN_MS,
};

static int verbs_open(const struct pf_net_config *cfg, struct pf_net **n_p)
{
    return pf_verbs_open_api(&pf_verbs_real_api, cfg, n_p);
}

static int verbs_probe(void)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (l)
        ibv_free_device_list(l);
    return l && n > 0 ? 0 : -ENODEV;
}

static const struct pf_net_backend verbs_backend = {
    .name = "verbs",
    .hardware = 1,
    .ops = &verbs_ops,
    .open = verbs_open,
    .probe = verbs_probe,
};

int pf_verbs_register(void)
{
    return pf_hal_register_net(&verbs_backend);
}

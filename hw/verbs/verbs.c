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
 * device's max_sge_rd), a recv queue of 1, max_rd_atomic = max_dest_rd_atomic = 16 (bounded by
 * the device), min_rnr_timer 12, timeout 14, retry 7 (6 on soft-RoCE, where 7 means forever),
 * rnr retry 7; over Ethernet (RoCE) the address vector uses the remote GID, the local GID
 * index and hop limit 64. The endpoint blob carries GID, LID, QPN, PSN, MTU and link layer;
 * qp_connect moves INIT -> RTR -> RTS with path MTU = min of both ends.
 *
 * CQs are shared by the QPs of a NIC (verbs_cq.c): up to 16 QPs per CQ (fewer when max_cqe
 * is small), 129 entries per QP served so the CQ cannot overrun, one completion channel per
 * CQ, CQs spread over the completion vectors. A poll of any QP drains the CQ for all of them
 * and routes each completion by qp_num to its QP's software queue; a QP's poll returns only
 * its own completions.
 *
 * post_read posts one signalled IBV_WR_RDMA_READ; post_reads links them (each signalled: the
 * HAL reports every READ) into chains of up to 32, one ibv_post_send each. At most 128 WRs are
 * outstanding (posted and not yet polled) per QP, else -EAGAIN. poll returns what is queued
 * for the QP, else drains the CQ (RC completes in order, so each completion is matched with
 * the oldest posted WR for its length), spins 32 polls, then arms the CQ and sleeps on its
 * channel and the QP's eventfd until the timeout. An error completion moves its QP (only
 * that one) to the error state (as the hardware does): later posts get -ENOTCONN.
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
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#define PF_LOG_MOD "verbs"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/hal.h"
#include "pf/log.h"
#include "pf/util.h"

#include "verbs_internal.h"

static const struct pf_net_ops verbs_ops;

/* ---------------------------------------------------------------- pure helpers */

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

/* The first ACTIVE port (an InfiniBand one needs a LID) into nic->port/port_attr; 0, or
 * -ENETDOWN when there is none (nic->port/port_attr then hold port 1 as it is, so the port's
 * max_msg_sz is known; the caller decides how loudly to say so). */
static int verbs_pick_port(struct verbsnic *nic, const struct pf_verbs_api *api, bool quiet)
{
    for (int p = 1; p <= nic->nports; p++) {
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof(pa));
        int rc = verbs_rc(api->query_port(nic->ctx, (uint8_t)p, &pa));
        if (rc) {
            if (!quiet)
                pf_warn("verbs %s: query port %d: %s", nic->name, p, strerror(-rc));
            continue;
        }
        if (p == 1 && !atomic_load(&nic->ready)) {
            nic->port = 1;
            nic->port_attr = pa;
        }
        if (pa.state != IBV_PORT_ACTIVE)
            continue;
        if (pa.link_layer != IBV_LINK_LAYER_ETHERNET && pa.lid == 0) {
            if (!quiet)
                pf_warn("verbs %s: port %d is ACTIVE InfiniBand without a LID (no subnet "
                        "manager?)",
                        nic->name, p);
            continue;
        }
        nic->port = (uint8_t)p;
        nic->port_attr = pa;
        return 0;
    }
    return -ENETDOWN;
}

/* ibv_query_port(3) max_msg_sz: the largest message (READ) the port takes */
static uint64_t verbs_max_msg(const struct ibv_port_attr *pa)
{
    uint64_t mm = pa->max_msg_sz;
    return mm == 0 || mm > VERBS_MAX_READ ? VERBS_MAX_READ : mm;
}

static const char *verbs_gid_type_str(uint32_t t)
{
    return t == IBV_GID_TYPE_IB        ? "IB"
           : t == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
           : t == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2"
                                       : "?";
}

static int verbs_pick_gid_of(struct verbsnic *nic, const struct pf_verbs_api *api,
                             const struct pf_verbs_gid_rule *rule, const char *subnet)
{
    int n = nic->port_attr.gid_tbl_len;
    if (n <= 0) {
        pf_error("verbs %s: port %u has an empty GID table", nic->name, nic->port);
        return -ENODEV;
    }
    struct ibv_gid_entry *e = calloc((size_t)n, sizeof(*e));
    int8_t *up = calloc((size_t)n, sizeof(*up));
    int rc = -ENOMEM;
    if (!e || !up)
        goto out;
    for (int i = 0; i < n; i++) {
        if (api->query_gid_ex(nic->ctx, nic->port, (uint32_t)i, &e[i]) != 0) {
            memset(&e[i], 0, sizeof(e[i])); /* empty or unreadable: never chosen */
            continue;
        }
        up[i] = (int8_t)(e[i].ndev_ifindex && api->ifindex_up ? api->ifindex_up(e[i].ndev_ifindex)
                                                              : -1);
    }
    int i = pf_verbs_pick_gid(e, up, n, rule);
    if (i < 0) {
        char want[96];
        if (rule->index >= 0)
            snprintf(want, sizeof(want), "--rdma-gid-index %d%s%s", rule->index,
                     subnet ? " in --rdma-gid-subnet " : "", subnet ? subnet : "");
        else
            snprintf(want, sizeof(want), "%s%s", subnet ? "--rdma-gid-subnet " : "a usable GID",
                     subnet ? subnet : "");
        pf_error("verbs %s: port %u has no GID matching %s (%d entries; list them with "
                 "'rdma link show' / show_gids)",
                 nic->name, nic->port, want, n);
        rc = -ENOENT;
        goto out;
    }
    nic->gid_index = i;
    nic->gid = e[i].gid;
    nic->gid_type = (uint8_t)e[i].gid_type;
    nic->gid_family = (uint8_t)pf_verbs_gid_family(&e[i]);
    if (up[i] == 0)
        pf_warn("verbs %s: GID[%d] (%s) is on a net device that is down", nic->name, i,
                verbs_gid_type_str(e[i].gid_type));
    rc = 0;
out:
    free(e);
    free(up);
    return rc;
}

void pf_verbs_drain_async(struct verbsnic *nic)
{
    const struct pf_verbs_api *api = nic->net->api;
    if (!api->get_async_event || !nic->ctx)
        return;
    struct ibv_async_event ev;
    for (int n = 0; n < 64 && api->get_async_event(nic->ctx, &ev) == 0; n++) {
        atomic_fetch_add(&nic->async_events, 1);
        const char *what = ibv_event_type_str(ev.event_type);
        switch (ev.event_type) {
        case IBV_EVENT_PORT_ERR:
            atomic_store(&nic->port_err, true);
            pf_warn("verbs %s: async event: %s (port %d): new handshakes skip this NIC until "
                    "it is ACTIVE again",
                    nic->name, what, ev.element.port_num);
            break;
        case IBV_EVENT_PORT_ACTIVE:
            atomic_store(&nic->port_err, false);
            pf_info("verbs %s: async event: %s (port %d)", nic->name, what, ev.element.port_num);
            break;
        case IBV_EVENT_GID_CHANGE:
        case IBV_EVENT_LID_CHANGE:
        case IBV_EVENT_PKEY_CHANGE:
        case IBV_EVENT_SM_CHANGE:
        case IBV_EVENT_CLIENT_REREGISTER:
            pf_info("verbs %s: async event: %s (port %d)", nic->name, what, ev.element.port_num);
            break;
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_PATH_MIG_ERR:
            pf_warn("verbs %s: async event: %s on QP 0x%x (its READs complete in error)", nic->name,
                    what, ev.element.qp ? ev.element.qp->qp_num : 0);
            break;
        case IBV_EVENT_DEVICE_FATAL:
            pf_error("verbs %s: async event: %s: the device must be reopened (restart the "
                     "server)",
                     nic->name, what);
            break;
        default:
            pf_debug("verbs %s: async event: %s", nic->name, what);
            break;
        }
        api->ack_async_event(&ev);
    }
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
    if (nic->cqs) /* QPs still alive at close: their CQs go with the context */
        pf_warn("verbs %s: CQs of live QPs at close", nic->name);
    pthread_rwlock_destroy(&nic->mr_lock);
    pthread_mutex_destroy(&nic->up_mu);
    pthread_mutex_destroy(&nic->cq_mu);
}

static void verbs_log_nic(const struct verbsnic *nic, const struct ibv_device_attr *dap);

static int verbs_nic_init(struct verbsnet *v, struct verbsnic *nic, struct ibv_device *dev,
                          const struct pf_verbs_gid_rule *rule)
{
    const struct pf_verbs_api *api = v->api;
    nic->net = v;
    nic->gid_index = -1;
    pthread_rwlock_init(&nic->mr_lock, NULL);
    pthread_mutex_init(&nic->up_mu, NULL);
    pthread_mutex_init(&nic->cq_mu, NULL);
    nic->ctx = api->open_device(dev);
    if (!nic->ctx) {
        int e = errno ? errno : ENODEV;
        pf_error("verbs %s: cannot open device: %s", nic->name, strerror(e));
        return -e;
    }
    if (api->get_async_event) { /* polled, never blocking (ibv_get_async_event(3)) */
        int fl = fcntl(nic->ctx->async_fd, F_GETFL);
        if (fl < 0 || fcntl(nic->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            int e = errno;
            pf_error("verbs %s: async event fd: %s", nic->name, strerror(e));
            return -e;
        }
    }
    struct ibv_device_attr da;
    memset(&da, 0, sizeof(da));
    int rc = verbs_rc(api->query_device(nic->ctx, &da));
    if (rc) {
        pf_error("verbs %s: query device: %s", nic->name, strerror(-rc));
        return rc;
    }
    nic->nports = da.phys_port_cnt;
    rc = verbs_pick_port(nic, api, false);
    if (rc == 0) {
        rc = verbs_pick_gid_of(nic, api, rule, v->opts.gid_subnet);
        if (rc)
            return rc;
        atomic_store(&nic->ready, true);
    } else {
        /* a rail that is down at open does not fail the open (another NIC may be ACTIVE;
         * pf_verbs_open_api refuses when none is): its handshakes skip it until it is back */
        pf_warn("verbs %s: no ACTIVE port among %d: opened as down (nic_info reports it "
                "inactive; it is used from the first handshake after its port is ACTIVE)",
                nic->name, da.phys_port_cnt);
    }
    if (v->opts.pkey_index >= (da.max_pkeys > 0 ? da.max_pkeys : 1)) {
        pf_error("verbs %s: --rdma-pkey-index %d is past the device's P_Key table (%u entries)",
                 nic->name, v->opts.pkey_index, da.max_pkeys);
        return -EINVAL;
    }
    nic->pd = api->alloc_pd(nic->ctx);
    if (!nic->pd) {
        rc = errno ? -errno : -ENOMEM;
        pf_error("verbs %s: alloc PD: %s", nic->name, strerror(-rc));
        return rc;
    }
    int sge = da.max_sge_rd > 0 && da.max_sge_rd < da.max_sge ? da.max_sge_rd : da.max_sge;
    nic->max_sge = sge < 1 ? 1 : sge > PF_VERBS_MAX_SGE ? PF_VERBS_MAX_SGE : sge;
    /* ibv_query_device(3): max_qp_rd_atom is what one QP answers as a responder,
     * max_qp_init_rd_atom what it may have outstanding as an initiator */
    int rd = da.max_qp_rd_atom, ri = da.max_qp_init_rd_atom;
    nic->rd_resp = rd <= 0 ? 1 : rd > PF_VERBS_RD_ATOMIC ? PF_VERBS_RD_ATOMIC : rd;
    nic->rd_init = ri <= 0 ? 1 : ri > PF_VERBS_RD_ATOMIC ? PF_VERBS_RD_ATOMIC : ri;
    nic->max_msg = verbs_max_msg(&nic->port_attr);
    /* shared CQs: as many QPs per CQ as max_cqe holds at PF_VERBS_QP_CQE each (at least
     * one: a device below that fails ibv_create_cq by name, as it always did) */
    nic->max_cqe = da.max_cqe;
    int per = da.max_cqe / PF_VERBS_QP_CQE;
    nic->cq_qps = per < 1 ? 1 : per > PF_VERBS_CQ_QPS ? PF_VERBS_CQ_QPS : per;
    nic->retry_cnt = v->opts.retry_cnt;
    if (da.vendor_id == PF_VERBS_SOFT_ROCE_VENDOR && nic->retry_cnt > PF_VERBS_SOFT_ROCE_RETRY)
        nic->retry_cnt = PF_VERBS_SOFT_ROCE_RETRY;
    nic->numa = verbs_read_numa(api, nic->name);
    verbs_log_nic(nic, &da);
    return 0;
}

static void verbs_log_nic(const struct verbsnic *nic, const struct ibv_device_attr *dap)
{
    const struct verbsnet *v = nic->net;
    const struct ibv_device_attr da = *dap;
    char g[64];
    if (!atomic_load(&nic->ready)) {
        pf_info("verbs NIC %s: down (%d port(s), none ACTIVE), NUMA node %d, %d SGEs, "
                "rd_atomic %d/%d, vendor 0x%x",
                nic->name, da.phys_port_cnt, nic->numa, nic->max_sge, nic->rd_init, nic->rd_resp,
                da.vendor_id);
        return;
    }
    verbs_gid_str(&nic->gid, g, sizeof(g));
    pf_info("verbs NIC %s: port %u (%s, LID %u, MTU %d) GID[%d] %s (%s) NUMA node %d, %d SGEs, "
            "rd_atomic %d/%d, max_msg %llu, vendor 0x%x, tc %d sl %d pkey_index %d timeout %d "
            "retry %d rnr_retry %d",
            nic->name, nic->port,
            nic->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet/RoCE" : "InfiniBand",
            nic->port_attr.lid, 128 << nic->port_attr.active_mtu, nic->gid_index, g,
            verbs_gid_type_str(nic->gid_type), nic->numa, nic->max_sge, nic->rd_init, nic->rd_resp,
            (unsigned long long)nic->max_msg, da.vendor_id, v->opts.traffic_class, v->opts.sl,
            v->opts.pkey_index, v->opts.timeout, nic->retry_cnt, v->opts.rnr_retry);
}

int pf_verbs_nic_ready(struct verbsnic *nic)
{
    if (atomic_load_explicit(&nic->ready, memory_order_acquire))
        return 0;
    struct verbsnet *v = nic->net;
    pthread_mutex_lock(&nic->up_mu);
    int rc = 0;
    if (atomic_load(&nic->ready))
        goto out;
    rc = verbs_pick_port(nic, v->api, true);
    if (rc)
        goto out;
    rc = verbs_pick_gid_of(nic, v->api, &v->rule, v->opts.gid_subnet);
    if (rc)
        goto out;
    nic->max_msg = verbs_max_msg(&nic->port_attr);
    struct ibv_device_attr da;
    memset(&da, 0, sizeof(da));
    if (verbs_rc(v->api->query_device(nic->ctx, &da)) != 0)
        da.phys_port_cnt = (uint8_t)nic->nports;
    pf_warn("verbs %s: port %u is ACTIVE now: the rail is used from this handshake on", nic->name,
            nic->port);
    verbs_log_nic(nic, &da);
    atomic_store_explicit(&nic->ready, true, memory_order_release);
out:
    pthread_mutex_unlock(&nic->up_mu);
    return rc;
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

static int verbs_check_opts(const struct pf_net_rdma_opts *o, struct pf_verbs_gid_rule *rule)
{
    /* ranges of struct ibv_qp_attr / ibv_ah_attr (ibv_modify_qp(3)): timeout is 5 bits
     * (0 = wait forever, refused here), retry_cnt and rnr_retry 3 bits, SL 4 bits */
    const char *bad = o->traffic_class < 0 || o->traffic_class > 255 ? "--rdma-traffic-class 0..255"
                      : o->sl < 0 || o->sl > 15                      ? "--rdma-sl 0..15"
                      : o->pkey_index < 0 || o->pkey_index > 0xffff  ? "--rdma-pkey-index"
                      : o->timeout < 1 || o->timeout > 31            ? "--rdma-timeout 1..31"
                      : o->retry_cnt < 0 || o->retry_cnt > 7         ? "--rdma-retry-cnt 0..7"
                      : o->rnr_retry < 0 || o->rnr_retry > 7         ? "--rdma-rnr-retry 0..7"
                      : o->gid_index < -1                            ? "--rdma-gid-index"
                                                                     : NULL;
    if (bad) {
        pf_error("verbs: out of range: %s", bad);
        return -EINVAL;
    }
    if (o->gid_subnet && pf_verbs_parse_subnet(o->gid_subnet, rule) != 0) {
        pf_error("verbs: --rdma-gid-subnet '%s' is not an IPv4 or IPv6 CIDR (10.0.0.0/24, "
                 "2001:db8::/64)",
                 o->gid_subnet);
        return -EINVAL;
    }
    return 0;
}

/* Every ibv_reg_mr pins its pages and the kernel charges them to RLIMIT_MEMLOCK per
 * registration (ib_umem_get: pinned_vm against the limit unless CAP_IPC_LOCK), so the pool
 * registered on N NICs needs N x its size. Refused here with what to raise, instead of a
 * bare ENOMEM from the Nth ibv_reg_mr. */
static int verbs_check_memlock(const struct pf_verbs_api *api, uint64_t pin, size_t nnics)
{
    if (pin == 0 || !api->memlock_limit)
        return 0;
    uint64_t lim = 0, need;
    if (api->memlock_limit(&lim) != 0 || lim == UINT64_MAX)
        return 0;
    if (api->cap_ipc_lock && api->cap_ipc_lock())
        return 0;
    need = nnics && pin > UINT64_MAX / nnics ? UINT64_MAX : pin * nnics;
    if (need <= lim)
        return 0;
    char ps[32], ls[32], ns[32];
    pf_format_size(pin, ps, sizeof(ps));
    pf_format_size(lim, ls, sizeof(ls));
    pf_format_size(need, ns, sizeof(ns));
    pf_error("verbs: locked-memory limit (RLIMIT_MEMLOCK) is %s but the pool (%s) is registered "
             "on %zu NIC(s), which pins %s: raise it (ulimit -l unlimited; systemd "
             "LimitMEMLOCK=infinity; docker --ulimit memlock=-1), grant CAP_IPC_LOCK, or use a "
             "smaller --pool-size or fewer --nics",
             ls, ps, nnics, ns);
    return -ENOMEM;
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
    struct pf_net_rdma_opts opts = cfg->rdma ? *cfg->rdma : pf_net_rdma_defaults();
    struct pf_verbs_gid_rule rule = {.index = opts.gid_index};
    rc = verbs_check_opts(&opts, &rule);
    if (rc)
        goto err_list;
    rc = verbs_check_memlock(api, cfg->pin_bytes, cfg->nnics);
    if (rc)
        goto err_list;
    struct verbsnet *v = calloc(1, sizeof(*v));
    if (!v) {
        rc = -ENOMEM;
        goto err_list;
    }
    v->base.ops = &verbs_ops;
    v->api = api;
    v->opts = opts;
    v->rule = rule;
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
        rc = verbs_nic_init(v, &v->nics[i], dev, &rule);
        if (rc)
            goto err_net;
    }
    int nready = 0;
    char down[256] = "";
    for (int i = 0; i < v->nnics; i++) {
        if (atomic_load(&v->nics[i].ready))
            nready++;
        else
            snprintf(down + strlen(down), sizeof(down) - strlen(down), "%s%s", down[0] ? ", " : "",
                     v->nics[i].name);
    }
    if (nready == 0) {
        pf_error("verbs: no NIC has an ACTIVE port (%s): check the links (ibv_devinfo, 'rdma link "
                 "show')",
                 down);
        rc = -ENETDOWN;
        goto err_net;
    }
    if (down[0])
        pf_warn("verbs: %d of %d NIC(s) down at open (%s): P2P runs on the others",
                v->nnics - nready, v->nnics, down);
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
    info_p->numa_node = nic->numa;
    pthread_mutex_lock(&nic->up_mu); /* the GID of a NIC that was down may be chosen now */
    bool ready = atomic_load(&nic->ready);
    if (ready)
        verbs_gid_str(&nic->gid, info_p->addr, sizeof(info_p->addr));
    info_p->max_msg = nic->max_msg;
    pthread_mutex_unlock(&nic->up_mu);
    pf_verbs_drain_async(nic);
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    info_p->active =
        ready && v->api->query_port(nic->ctx, nic->port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
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
    /* ibv_reg_mr(3): IBV_ACCESS_RELAXED_ORDERING lets the HCA write READ data with PCIe
     * relaxed ordering (NCCL enables it where supported, NCCL_IB_PCI_RELAXED_ORDERING);
     * completions still order everything, and data is only ever used after its completion.
     * It is an optional hint that devices may ignore; a kernel that refuses it (EINVAL, older
     * than 5.8) gets the registration without it. */
    errno = 0;
    m->mr = v->api->reg_mr(nic->pd, addr, len, ia | IBV_ACCESS_RELAXED_ORDERING);
    if (!m->mr && errno == EINVAL) {
        pf_debug("verbs %s: ibv_reg_mr refused relaxed ordering: registering without it",
                 nic->name);
        errno = 0;
        m->mr = v->api->reg_mr(nic->pd, addr, len, ia);
    }
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

static const struct pf_net_ops verbs_ops = {
    .name = "verbs",
    .nic_count = verbs_nic_count,
    .nic_info = verbs_nic_info,
    .reg_mem = verbs_reg_mem,
    .dereg_mem = verbs_dereg_mem,
    .qp_create = pf_verbs_qp_create,
    .qp_local_endpoint = pf_verbs_qp_local_endpoint,
    .qp_connect = pf_verbs_qp_connect,
    .ep_check = pf_verbs_ep_check,
    .post_read = pf_verbs_post_read,
    .post_reads = pf_verbs_post_reads,
    .poll = pf_verbs_poll,
    .qp_invalidate = pf_verbs_qp_invalidate,
    .qp_destroy = pf_verbs_qp_destroy,
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

static int verbs_real_ifindex_up(uint32_t ifindex)
{
    char name[IF_NAMESIZE], path[64 + IF_NAMESIZE], st[32] = "";
    if (!if_indextoname(ifindex, name))
        return -1;
    snprintf(path, sizeof(path), "/sys/class/net/%s/operstate", name);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    if (!fgets(st, sizeof(st), f))
        st[0] = '\0';
    fclose(f);
    /* "unknown" is what virtual devices without carrier reporting (veth peers, rxe
     * test rigs) show while working */
    return strncmp(st, "down", 4) == 0 || strncmp(st, "lowerlayerdown", 14) == 0 ? 0 : 1;
}

static int verbs_real_memlock(uint64_t *bytes_p)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return -errno;
    *bytes_p = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    return 0;
}

/* CapEff of /proc/self/status, bit CAP_IPC_LOCK (14, linux/capability.h) */
static bool verbs_real_cap_ipc_lock(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return false;
    char line[256];
    bool has = false;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "CapEff:", 7) == 0) {
            unsigned long long caps = strtoull(line + 7, NULL, 16);
            has = (caps >> 14) & 1;
            break;
        }
    fclose(f);
    return has;
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
    .get_async_event = ibv_get_async_event,
    .ack_async_event = ibv_ack_async_event,
    .ifindex_up = verbs_real_ifindex_up,
    .memlock_limit = verbs_real_memlock,
    .cap_ipc_lock = verbs_real_cap_ipc_lock,
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

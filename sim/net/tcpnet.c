/* TCP fabric: the "tcp" NET backend (design: tcpnet_internal.h). This file: NIC
 * resolution, socket helpers, memory regions, NIC lifetime and the backend's ops table. */
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

#include "tcpnet_internal.h"

static const struct pf_net_ops tcpnet_ops;

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

void pf_tcpnet_sockopts(struct tcpnet *t, int fd)
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
int pf_tcpnet_send_full(int fd, const void *buf, size_t len)
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
int pf_tcpnet_recv_full(int fd, void *buf, size_t len)
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
int pf_tcpnet_wait_fd(int fd, short events, uint64_t deadline_ns)
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
struct tcpmr *pf_tcpnet_mr_by_rkey(struct tcpnic *nic, uint32_t rkey)
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

struct tcpmr *pf_tcpnet_mr_by_lkey(struct tcpnic *nic, uint32_t lkey)
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
        if (remote ? pf_tcpnet_mr_by_rkey(nic, k) == NULL : pf_tcpnet_mr_by_lkey(nic, k) == NULL) {
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

void pf_tcpnet_qp_invalidate(struct pf_net_qp *qpb);

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
                pf_tcpnet_qp_invalidate(&q->base);
            }
        pthread_mutex_unlock(&nic->qp_mu);
        /* QPs being destroyed concurrently (already off the list) flush on their own */
        while (atomic_load(&m->inflight) > 0)
            pf_sleep_ms(1);
    }
    pf_debug("NIC %s: deregistered %p rkey 0x%08x", nic->name, m->base.addr, m->base.rkey);
    free(m);
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
        pf_tcpnet_qp_free(q);
    }
    while (nic->conns)
        pf_tcpnet_sconn_close(nic->conns);
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
        pf_tcpnet_sockopts(t, nic->lfd);
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
        rc = pf_thread_start(&nic->thr[i], tn, nic->numa, pf_tcpnet_serve_main, nic);
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
    pf_tcpnet_tls_destroy(t->tls); /* after the NICs: their connections closed the relays */
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
    t->send_wait_ns =
        tcpnet_env_u64("PEGAFLOW_TCPNET_SEND_WAIT_US", TCPNET_SEND_WAIT_US, 1000u * 1000u) * 1000u;
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
    if (cfg->tls_cert_pem) {
        char err[256];
        rc = pf_tcpnet_tls_create(cfg, &t->tls, err, sizeof(err));
        if (rc) {
            pf_error("tcp fabric TLS: %s", err);
            goto err_close;
        }
        pf_info("tcp fabric: TLS 1.3 on every connection (%s)",
                pf_tcpnet_tls_mutual(t->tls) ? "mutual: peers need a certificate of --tls-ca"
                                             : "servers verified against the system roots");
    }
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
    .qp_create = pf_tcpnet_qp_create,
    .qp_local_endpoint = pf_tcpnet_qp_local_endpoint,
    .qp_connect = pf_tcpnet_qp_connect,
    .ep_host = tcpnet_ep_host,
    .post_read = pf_tcpnet_post_read,
    .post_read_digest = pf_tcpnet_post_read_digest,
    .poll = pf_tcpnet_poll,
    .qp_invalidate = pf_tcpnet_qp_invalidate,
    .qp_destroy = pf_tcpnet_qp_destroy,
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

/* Connections to peers and the RdmaHandshake (reference §7.3).
 *
 * The table maps a peer's advertised address to at most two live connections: `out`, which
 * this node initiated (its requester handshook), and `in`, which the peer initiated (our
 * handler accepted). RC QPs are bidirectional, so a fetch uses either: when A fetched from B,
 * B later fetches from A over the connection A created. Keeping the two directions in
 * separate slots is what makes a simultaneous mutual handshake safe (the reference can panic
 * there, its #402): A's outgoing handshake and B's outgoing handshake each produce their own
 * QP pair and neither side's handler touches the other pair.
 *
 *  - Requester: one outgoing handshake per peer at a time (`connecting`; other fetches wait
 *    on the condition variable, bounded). After a failed handshake the peer is skipped for
 *    5 s (fetches fail at once instead of each waiting for an unreachable peer). Fresh QPs are
 * created, their endpoints and our regions sent, the reply validated and our QPs connected; the new
 * connection replaces the previous outgoing one.
 *  - Handler: the requester's metadata is validated, fresh QPs are created and connected to
 *    its endpoints, and the connection replaces the previous incoming one from that address
 *    (a requester re-handshakes when its side broke). Both sides also drop connections made
 *    with an older incarnation (node_id) of the peer: it restarted, those QPs are dead.
 *  - A fetch leases the free QPs of one connection exclusively (one thread posts to and
 *    polls a QP at a time, HAL rule); concurrent fetches to one peer share the QPs that are
 *    free or wait for them. A failed connection leaves the table and its QPs are
 *    invalidated at once; they are destroyed when the last lease is returned.
 *
 * Lock order: conn_mu only; QPs are created, connected, invalidated and destroyed outside
 * it (the backends block there). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/clock.h"
#include "pf/log.h"

static uint64_t addr_hash(const char *a)
{
    return pf_hash64(a, strlen(a));
}

static struct p2p_peer *peer_find_locked(struct pf_p2p *p, const char *addr)
{
    uint64_t h = addr_hash(addr);
    struct pf_hnode *n;
    pf_htable_for_each_hash(&p->peers, n, h)
    {
        struct p2p_peer *e = pf_container_of(n, struct p2p_peer, node);
        if (strcmp(e->addr, addr) == 0)
            return e;
    }
    return NULL;
}

static struct p2p_peer *peer_get_locked(struct pf_p2p *p, const char *addr)
{
    struct p2p_peer *e = peer_find_locked(p, addr);
    if (e)
        return e;
    e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->addr = strdup(addr);
    if (!e->addr) {
        free(e);
        return NULL;
    }
    pf_htable_insert(&p->peers, &e->node, addr_hash(addr));
    return e;
}

/* ------------------------------------------------------------------ connection objects */

static void conn_free(struct pf_p2p *p, struct p2p_conn *c)
{
    if (!c)
        return;
    size_t live = 0;
    for (size_t i = 0; i < c->nqps; i++)
        if (c->qps[i]) {
            pf_net_qp_destroy(c->qps[i]);
            live++;
        }
    if (live) {
        pthread_mutex_lock(&p->conn_mu);
        p->nqps -= live;
        pthread_mutex_unlock(&p->conn_mu);
        pf_metric_add(p->m_qps, -(double)live);
    }
    for (int k = 0; c->regions && k < p->nnics; k++)
        free(c->regions[k]);
    free(c->regions);
    free(c->nregions);
    free(c->qps);
    free(c->busy);
    free(c->rail);
    free(c);
}

/* Destroys the QPs of rail k of a connection not yet installed (never connected, or the
 * handler did not pair the rail) and marks it DOWN. */
static void conn_rail_drop(struct pf_p2p *p, struct p2p_conn *c, int k)
{
    size_t live = 0;
    for (size_t j = 0; j < p->qpn; j++) {
        struct pf_net_qp **q = &c->qps[(size_t)k * p->qpn + j];
        if (*q) {
            pf_net_qp_destroy(*q);
            *q = NULL;
            live++;
        }
    }
    c->rail[k] = P2P_RAIL_DOWN;
    if (live) {
        pthread_mutex_lock(&p->conn_mu);
        p->nqps -= live;
        pthread_mutex_unlock(&p->conn_mu);
        pf_metric_add(p->m_qps, -(double)live);
    }
}

static size_t conn_rails_up(const struct pf_p2p *p, const struct p2p_conn *c, char *names,
                            size_t nlen)
{
    size_t up = 0;
    if (names && nlen)
        names[0] = '\0';
    for (int k = 0; k < p->nnics; k++) {
        if (c->rail[k] == P2P_RAIL_UP)
            up++;
        else if (names && strlen(names) + 1 < nlen)
            snprintf(names + strlen(names), nlen - strlen(names), "%s%s", names[0] ? ", " : "",
                     p->nics[k].name);
    }
    return up;
}

/* Creates the QPs of a new connection on every NIC k with want[k] (want NULL: all). A NIC
 * whose QPs cannot be created (verbs: its port is not ACTIVE now, -ENETDOWN) leaves its rail
 * DOWN; -ENETDOWN when no rail is left. */
static int conn_new(struct pf_p2p *p, bool outgoing, const bool *want, struct p2p_conn **c_p)
{
    struct p2p_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->outgoing = outgoing;
    c->nqps = (size_t)p->nnics * p->qpn;
    c->qps = calloc(c->nqps, sizeof(*c->qps));
    c->busy = calloc(c->nqps, sizeof(*c->busy));
    c->rail = calloc((size_t)p->nnics, sizeof(*c->rail));
    c->regions = calloc((size_t)p->nnics, sizeof(*c->regions));
    c->nregions = calloc((size_t)p->nnics, sizeof(*c->nregions));
    int rc = -ENOMEM;
    if (!c->qps || !c->busy || !c->rail || !c->regions || !c->nregions)
        goto err_free;
    size_t made = 0;
    for (int k = 0; k < p->nnics; k++) {
        if (want && !want[k]) {
            c->rail[k] = P2P_RAIL_DOWN;
            continue;
        }
        for (size_t j = 0; j < p->qpn; j++) {
            int qrc = pf_net_qp_create(p->net, k, &c->qps[(size_t)k * p->qpn + j]);
            if (qrc) {
                pf_log_ratelimited(PF_LOG_WARN, 1000,
                                   "cannot create a QP on NIC %s: %s: the rail is skipped by this "
                                   "handshake",
                                   p->nics[k].name, strerror(-qrc));
                rc = qrc;
                c->rail[k] = P2P_RAIL_DOWN;
                break;
            }
            made++;
        }
    }
    pthread_mutex_lock(&p->conn_mu);
    c->id = ++p->next_conn_id;
    p->nqps += made;
    pthread_mutex_unlock(&p->conn_mu);
    pf_metric_add(p->m_qps, (double)made);
    for (int k = 0; k < p->nnics; k++)
        if (c->rail[k] == P2P_RAIL_DOWN)
            conn_rail_drop(p, c, k); /* QPs created before the one that failed */
    if (conn_rails_up(p, c, NULL, 0) == 0) {
        rc = rc == -ENOMEM ? rc : -ENETDOWN;
        goto err_free;
    }
    *c_p = c;
    return 0;
err_free:
    conn_free(p, c);
    return rc;
}

/* Drops a reference (conn_mu held); returns the connection to free outside the lock. */
static struct p2p_conn *conn_unref_locked(struct pf_p2p *p, struct p2p_conn *c)
{
    if (--c->refs > 0)
        return NULL;
    p->nconns--;
    return c;
}

/* Takes c out of the table (conn_mu held). Returns true when it was in it; the caller
 * invalidates its QPs and drops the table's reference. */
static bool conn_detach_locked(struct pf_p2p *p, struct p2p_conn *c)
{
    if (c->dead)
        return false;
    c->dead = true;
    if (c->peer->out == c)
        c->peer->out = NULL;
    if (c->peer->in == c)
        c->peer->in = NULL;
    pthread_cond_broadcast(&p->conn_cv);
    return true;
}

static void conn_invalidate(struct p2p_conn *c)
{
    for (size_t i = 0; i < c->nqps; i++)
        pf_net_qp_invalidate(c->qps[i]);
}

/* Detaches c (if still attached), invalidates it and drops the table's reference. */
static void conn_kill(struct pf_p2p *p, struct p2p_conn *c, const char *why)
{
    if (!c)
        return;
    pthread_mutex_lock(&p->conn_mu);
    bool was = conn_detach_locked(p, c);
    pthread_mutex_unlock(&p->conn_mu);
    if (!was)
        return;
    pf_debug("connection %llu to %s (%s, %zu QPs) dropped: %s", (unsigned long long)c->id,
             c->peer->addr, c->outgoing ? "outgoing" : "incoming", c->nqps, why);
    conn_invalidate(c);
    pthread_mutex_lock(&p->conn_mu);
    struct p2p_conn *f = conn_unref_locked(p, c);
    pthread_mutex_unlock(&p->conn_mu);
    conn_free(p, f);
}

/* Copies the peer's regions and incarnation into c and connects QP i to the peer's QP i on
 * every rail both sides have up. A rail of c the peer offers no endpoints for (down there, or
 * past its NIC count) is dropped here; -ENETDOWN when none is left. */
static int conn_apply(struct pf_p2p *p, struct p2p_conn *c, const Pegaflow__HandshakeMetadata *m,
                      char *err, size_t errlen)
{
    snprintf(c->node_id, sizeof(c->node_id), "%s", m->node_id ? m->node_id : "");
    for (int k = 0; k < p->nnics; k++) {
        const Pegaflow__HandshakeNic *nic = (size_t)k < m->n_nics ? m->nics[k] : NULL;
        if (c->rail[k] == P2P_RAIL_UP && (!nic || nic->n_endpoints == 0))
            conn_rail_drop(p, c, k); /* up here, not there */
        if (c->rail[k] != P2P_RAIL_UP)
            continue;
        c->regions[k] = malloc(nic->n_regions * sizeof(struct p2p_region));
        if (!c->regions[k]) {
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        for (size_t j = 0; j < nic->n_regions; j++)
            c->regions[k][j] = (struct p2p_region){nic->regions[j]->addr, nic->regions[j]->length,
                                                   nic->regions[j]->rkey};
        qsort(c->regions[k], nic->n_regions, sizeof(struct p2p_region), p2p_region_cmp);
        c->nregions[k] = nic->n_regions;
    }
    char down[160];
    if (conn_rails_up(p, c, down, sizeof(down)) == 0) {
        snprintf(err, errlen,
                 "no rail both sides have up (this node's NICs without a rail: %s; the peer "
                 "offers %zu NIC(s))",
                 down, m->n_nics);
        return -ENETDOWN;
    }
    for (size_t i = 0; i < c->nqps; i++) {
        if (c->rail[i / p->qpn] != P2P_RAIL_UP)
            continue;
        const ProtobufCBinaryData *ep = &m->nics[i / p->qpn]->endpoints[i % p->qpn];
        /* refused by name before connecting (verbs: GID family / RoCE version mismatch) */
        int off = snprintf(err, errlen, "NIC %s: ", p->nics[i / p->qpn].name);
        if (off < 0 || (size_t)off >= errlen)
            off = 0;
        int rc = pf_net_ep_check(c->qps[i], ep->data, ep->len, err + off, errlen - (size_t)off);
        if (rc) {
            if (!err[off])
                snprintf(err + off, errlen - (size_t)off, "%s", strerror(-rc));
            return rc;
        }
        err[0] = '\0';
        rc = pf_net_qp_connect(c->qps[i], ep->data, ep->len);
        if (rc) {
            snprintf(err, errlen, "cannot connect QP %zu on NIC %s: %s", i % p->qpn,
                     p->nics[i / p->qpn].name, strerror(-rc));
            return rc;
        }
    }
    if (down[0])
        pf_warn("connection %llu (%s): rails without a pair at this handshake: %s (down here or "
                "on the peer, or past its %zu NIC(s)); P2P runs on the others",
                (unsigned long long)c->id, c->outgoing ? "outgoing" : "incoming", down, m->n_nics);
    return 0;
}

/* Installs c as the peer's `out` or `in` connection and drops the connections it replaces:
 * the previous one of the same direction, and any made with another incarnation. While
 * stopping, c is dropped instead. */
static void conn_install(struct pf_p2p *p, struct p2p_peer *e, struct p2p_conn *c)
{
    struct p2p_conn *old[2] = {NULL, NULL};
    pthread_mutex_lock(&p->conn_mu);
    c->peer = e;
    c->refs = 1;
    p->nconns++;
    if (atomic_load(&p->stopping)) {
        c->dead = true;
        pthread_mutex_unlock(&p->conn_mu);
        conn_invalidate(c);
        pthread_mutex_lock(&p->conn_mu);
        struct p2p_conn *f = conn_unref_locked(p, c);
        pthread_mutex_unlock(&p->conn_mu);
        conn_free(p, f);
        return;
    }
    c->last_used_ns = pf_now_ns();
    struct p2p_conn **slot = c->outgoing ? &e->out : &e->in;
    struct p2p_conn **other = c->outgoing ? &e->in : &e->out;
    old[0] = *slot;
    if (*other && strcmp((*other)->node_id, c->node_id) != 0) {
        old[1] = *other;
        *other = NULL;
    }
    *slot = c;
    for (int i = 0; i < 2; i++)
        if (old[i])
            old[i]->dead = true;
    pthread_cond_broadcast(&p->conn_cv);
    pthread_mutex_unlock(&p->conn_mu);
    for (int i = 0; i < 2; i++) {
        if (!old[i])
            continue;
        pf_debug("connection %llu to %s (%s) replaced by connection %llu%s",
                 (unsigned long long)old[i]->id, e->addr,
                 old[i]->outgoing ? "outgoing" : "incoming", (unsigned long long)c->id,
                 i ? " (the peer restarted)" : "");
        conn_invalidate(old[i]);
        pthread_mutex_lock(&p->conn_mu);
        struct p2p_conn *f = conn_unref_locked(p, old[i]);
        pthread_mutex_unlock(&p->conn_mu);
        conn_free(p, f);
    }
}

/* ------------------------------------------------------------------ requester */

static int handshake_out(struct pf_p2p *p, struct p2p_peer *e, struct p2p_conn **c_p, char *err,
                         size_t errlen)
{
    struct p2p_conn *c = NULL;
    uint8_t *meta = NULL;
    size_t mlen = 0;
    ProtobufCMessage *resp = NULL;
    Pegaflow__HandshakeMetadata *pm = NULL;
    uint64_t t0 = pf_now_ns();
    int rc = conn_new(p, true, NULL, &c);
    if (rc) {
        snprintf(err, errlen, "cannot create QPs: %s", strerror(-rc));
        return rc;
    }
    rc = p2p_meta_build(p, c, &meta, &mlen);
    if (rc) {
        snprintf(err, errlen, "cannot build handshake metadata: %s", strerror(-rc));
        goto err_conn;
    }
    Pegaflow__RdmaHandshakeRequest req = PEGAFLOW__RDMA_HANDSHAKE_REQUEST__INIT;
    req.requester_id = p->self_addr;
    req.handshake_metadata = (ProtobufCBinaryData){mlen, meta};
    pf_debug("RDMA handshake with %s: %zu QP(s) on %d NIC(s), %zu region(s) each", e->addr, c->nqps,
             p->nnics, p->nregions);
    char e2[P2P_ERRLEN];
    rc = p->tr->call(p->tr->ctx, e->addr, PF_P2P_HANDSHAKE, &req.base, PF_P2P_HANDSHAKE_TIMEOUT_MS,
                     &resp, e2, sizeof(e2));
    if (rc) {
        snprintf(err, errlen, "RdmaHandshake RPC failed: %s", e2);
        goto err_meta;
    }
    const Pegaflow__RdmaHandshakeResponse *r = (const void *)resp;
    if (r->status && !r->status->ok) {
        snprintf(err, errlen, "RdmaHandshake refused: %s",
                 r->status->message ? r->status->message : "");
        rc = -EPERM;
        goto err_meta;
    }
    rc = p2p_meta_parse(p, &r->handshake_metadata, &pm, e2, sizeof(e2));
    if (rc) {
        snprintf(err, errlen, "peer's handshake metadata rejected: %s", e2);
        goto err_meta;
    }
    /* connect only to the address the peer is registered under (peer_auth.c) */
    char known[8][PF_AUTH_IP_MAX];
    size_t nknown = 0;
    p2p_host_ips(e->addr, known, PF_ARRAY_SIZE(known), &nknown);
    rc = p2p_endpoints_check(p, pm, (const char(*)[PF_AUTH_IP_MAX])known, nknown, false, e->addr,
                             e2, sizeof(e2));
    if (rc) {
        snprintf(err, errlen, "peer's handshake metadata refused: %s", e2);
        pf_warn("RDMA handshake with %s: %s", e->addr, err);
        goto err_meta;
    }
    rc = conn_apply(p, c, pm, e2, sizeof(e2));
    if (rc) {
        snprintf(err, errlen, "%s", e2);
        goto err_meta;
    }
    pegaflow__handshake_metadata__free_unpacked(pm, NULL);
    protobuf_c_message_free_unpacked(resp, NULL);
    free(meta);
    atomic_fetch_add(&p->st_hs_out, 1);
    pf_debug("RDMA handshake with %s done in %.1f ms: connection %llu, %zu QP(s) connected",
             e->addr, (double)(pf_now_ns() - t0) / 1e6, (unsigned long long)c->id, c->nqps);
    *c_p = c;
    return 0;
err_meta:
    if (pm)
        pegaflow__handshake_metadata__free_unpacked(pm, NULL);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    free(meta);
err_conn:
    conn_free(p, c);
    return rc;
}

/* Leases a share of c's free QPs (conn_mu held): from every NIC half of its free QPs,
 * rounded up, taken NIC by NIC in turn (QP j of NIC 0, QP j of NIC 1, ...) and at most
 * PF_ARRAY_SIZE(l->idx) in all. A lone fetch reaches every NIC (8 NICs x 16 QPs no longer
 * fill the lease with NICs 0-3), and a second fetch to the same peer finds QPs free and runs
 * alongside instead of waiting for the first. false when none is free. */
static bool lease_take_locked(const struct pf_p2p *p, struct p2p_conn *c, struct p2p_lease *l)
{
    size_t qpn = p->qpn ? p->qpn : 1, nn = c->nqps / qpn;
    size_t want[P2P_NIC_MAX], pos[P2P_NIC_MAX];
    for (size_t k = 0; k < nn && k < P2P_NIC_MAX; k++) {
        size_t nfree = 0;
        for (size_t j = 0; j < qpn && c->rail[k] == P2P_RAIL_UP; j++)
            nfree += !c->busy[k * qpn + j];
        want[k] = (nfree + 1) / 2;
        pos[k] = 0;
    }
    l->nqps = 0;
    for (bool more = true; more && l->nqps < PF_ARRAY_SIZE(l->idx);) {
        more = false;
        for (size_t k = 0; k < nn && k < P2P_NIC_MAX && l->nqps < PF_ARRAY_SIZE(l->idx); k++) {
            if (want[k] == 0)
                continue;
            while (pos[k] < qpn && c->busy[k * qpn + pos[k]]) /* want[k] > 0: rail UP */
                pos[k]++;
            if (pos[k] == qpn)
                continue;
            size_t i = k * qpn + pos[k]++;
            c->busy[i] = true;
            l->idx[l->nqps] = i;
            l->qps[l->nqps++] = c->qps[i];
            more |= --want[k] > 0;
        }
    }
    if (l->nqps == 0)
        return false;
    c->refs++;
    l->conn = c;
    return true;
}

int p2p_conn_acquire(struct pf_p2p *p, const char *peer, uint64_t deadline_ns, struct p2p_lease *l,
                     char *err, size_t errlen)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_lock(&p->conn_mu);
    struct p2p_peer *e = peer_get_locked(p, peer);
    if (!e) {
        pthread_mutex_unlock(&p->conn_mu);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = 0;
    bool did_hs = false;
    for (;;) {
        if (atomic_load(&p->stopping)) {
            snprintf(err, errlen, "shutting down");
            rc = -ESHUTDOWN;
            break;
        }
        if ((e->out && lease_take_locked(p, e->out, l)) ||
            (e->in && lease_take_locked(p, e->in, l))) {
            l->fresh = did_hs;
            break;
        }
        if (!e->out && !e->in && !e->connecting) {
            uint64_t now = pf_now_ns();
            if (now < e->down_until) {
                snprintf(err, errlen, "the last handshake failed; next attempt in %llu ms",
                         (unsigned long long)((e->down_until - now) / PF_NS_PER_MS));
                rc = -EHOSTDOWN;
                break;
            }
            e->connecting = true;
            pthread_mutex_unlock(&p->conn_mu);
            struct p2p_conn *c = NULL;
            rc = handshake_out(p, e, &c, err, errlen);
            if (rc == 0)
                conn_install(p, e, c);
            pthread_mutex_lock(&p->conn_mu);
            e->connecting = false;
            e->down_until = rc ? pf_now_ns() + p->cfg.peer_down_ms * PF_NS_PER_MS : 0;
            pthread_cond_broadcast(&p->conn_cv);
            if (rc)
                break;
            did_hs = true;
            continue;
        }
        /* a handshake is in flight, or every QP is leased: wait */
        struct timespec ts = pf_ns_to_timespec(deadline_ns);
        if (pf_now_ns() >= deadline_ns) {
            snprintf(err, errlen, "%s",
                     e->connecting ? "handshake in progress by another fetch"
                                   : "all QPs to the peer are busy");
            rc = -ETIMEDOUT;
            break;
        }
        pthread_cond_timedwait(&p->conn_cv, &p->conn_mu, &ts);
    }
    pthread_mutex_unlock(&p->conn_mu);
    return rc;
}

void p2p_lease_return(struct pf_p2p *p, struct p2p_lease *l)
{
    if (!l->conn)
        return;
    pthread_mutex_lock(&p->conn_mu);
    for (size_t i = 0; i < l->nqps; i++)
        l->conn->busy[l->idx[i]] = false;
    l->conn->last_used_ns = pf_now_ns();
    struct p2p_conn *f = conn_unref_locked(p, l->conn);
    pthread_cond_broadcast(&p->conn_cv);
    pthread_mutex_unlock(&p->conn_mu);
    conn_free(p, f);
    l->conn = NULL;
    l->nqps = 0;
}

/* Kills c, which the caller pinned with a temporary reference (conn_mu held when taken). */
static void conn_kill_pinned(struct pf_p2p *p, struct p2p_conn *c, const char *why)
{
    conn_kill(p, c, why);
    pthread_mutex_lock(&p->conn_mu);
    struct p2p_conn *f = conn_unref_locked(p, c);
    pthread_mutex_unlock(&p->conn_mu);
    conn_free(p, f);
}

void p2p_peer_drop(struct pf_p2p *p, const char *peer)
{
    struct p2p_conn *c[2] = {NULL, NULL};
    pthread_mutex_lock(&p->conn_mu);
    struct p2p_peer *e = peer_find_locked(p, peer);
    if (e) {
        c[0] = e->out;
        c[1] = e->in;
    }
    for (int i = 0; i < 2; i++)
        if (c[i])
            c[i]->refs++;
    pthread_mutex_unlock(&p->conn_mu);
    for (int i = 0; i < 2; i++)
        if (c[i])
            conn_kill_pinned(p, c[i], "stale");
}

void p2p_lease_fail(struct pf_p2p *p, struct p2p_lease *l)
{
    if (!l->conn)
        return;
    conn_kill(p, l->conn, "transfer failed");
    /* killed or not (someone else may have replaced it), our QPs must be dead now */
    for (size_t i = 0; i < l->nqps; i++)
        pf_net_qp_invalidate(l->qps[i]);
    p2p_lease_return(p, l);
}

void p2p_lease_fail_rails(struct pf_p2p *p, struct p2p_lease *l, uint64_t failed)
{
    struct p2p_conn *c = l->conn;
    if (!c || failed == 0) {
        p2p_lease_return(p, l);
        return;
    }
    bool newly[P2P_NIC_MAX] = {false};
    for (size_t i = 0; i < l->nqps && i < 64; i++)
        if (failed >> i & 1)
            pf_net_qp_invalidate(l->qps[i]); /* done by the transfer already; idempotent */
    pthread_mutex_lock(&p->conn_mu);
    for (size_t i = 0; i < l->nqps && i < 64; i++) {
        int k = l->qps[i]->nic;
        if ((failed >> i & 1) && k >= 0 && k < p->nnics && c->rail[k] == P2P_RAIL_UP) {
            c->rail[k] = P2P_RAIL_DEAD;
            newly[k] = true;
        }
    }
    size_t up = conn_rails_up(p, c, NULL, 0);
    pthread_mutex_unlock(&p->conn_mu);
    for (int k = 0; k < p->nnics; k++) {
        if (!newly[k])
            continue;
        pf_child_add(pf_metric_child1(p->m_rail_fail, p->nics[k].name), 1);
        atomic_fetch_add(&p->st_rail_fail, 1);
        pf_warn("rail %s of connection %llu to %s (%s) marked dead: a READ on it failed and was "
                "re-posted on the other rails; %zu rail(s) left, later fetches skip it until the "
                "next handshake",
                p->nics[k].name, (unsigned long long)c->id, c->peer->addr,
                c->outgoing ? "outgoing" : "incoming", up);
    }
    if (up == 0)
        conn_kill(p, c, "every rail failed");
    p2p_lease_return(p, l);
}

/* ------------------------------------------------------------------ handler */

int p2p_serve_handshake(struct pf_p2p *p, const Pegaflow__RdmaHandshakeRequest *r, uint8_t **meta_p,
                        size_t *len_p, char *err, size_t errlen)
{
    const char *who = r->requester_id ? r->requester_id : "";
    size_t wl = strlen(who);
    if (wl == 0 || wl >= P2P_ADDR_MAX || !strchr(who, ':')) {
        snprintf(err, errlen, "requester_id: '%.64s' is not the requester's ip:port", who);
        return -EINVAL;
    }
    if (atomic_load(&p->stopping)) {
        snprintf(err, errlen, "shutting down");
        return -ESHUTDOWN;
    }
    Pegaflow__HandshakeMetadata *pm = NULL;
    char e2[P2P_ERRLEN];
    int rc = p2p_meta_parse(p, &r->handshake_metadata, &pm, e2, sizeof(e2));
    if (rc) {
        snprintf(err, errlen, "handshake from %s rejected: %s", who, e2);
        pf_warn("%s", err);
        return rc;
    }
    /* QPs for the rails the requester offers and this node has up (pairing by index) */
    bool want[P2P_NIC_MAX];
    for (int k = 0; k < p->nnics; k++)
        want[k] = (size_t)k < pm->n_nics && pm->nics[k]->n_endpoints > 0;
    struct p2p_conn *c = NULL;
    rc = conn_new(p, false, want, &c);
    if (rc) {
        snprintf(err, errlen, "cannot create QPs: %s", strerror(-rc));
        goto out;
    }
    rc = conn_apply(p, c, pm, e2, sizeof(e2));
    if (rc == 0)
        rc = p2p_meta_build(p, c, meta_p, len_p);
    if (rc) {
        snprintf(err, errlen, "handshake from %s failed: %s", who, e2);
        pf_warn("%s", err);
        conn_free(p, c);
        goto out;
    }
    pthread_mutex_lock(&p->conn_mu);
    struct p2p_peer *e = peer_get_locked(p, who);
    pthread_mutex_unlock(&p->conn_mu);
    if (!e) {
        free(*meta_p);
        conn_free(p, c);
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    conn_install(p, e, c);
    atomic_fetch_add(&p->st_hs_in, 1);
    pf_debug("RDMA handshake from %s accepted: connection %llu, %zu QP(s) connected", who,
             (unsigned long long)c->id, c->nqps);
out:
    pegaflow__handshake_metadata__free_unpacked(pm, NULL);
    return rc;
}

/* ------------------------------------------------------------------ shutdown */

void p2p_conns_drop_all(struct pf_p2p *p)
{
    for (;;) {
        struct p2p_conn *c = NULL;
        pthread_mutex_lock(&p->conn_mu);
        pf_htable_for_each(&p->peers, i, n)
        {
            struct p2p_peer *e = pf_container_of(n, struct p2p_peer, node);
            if (!c && (e->out || e->in))
                c = e->out ? e->out : e->in;
        }
        if (c)
            c->refs++;
        pthread_mutex_unlock(&p->conn_mu);
        if (!c)
            break;
        conn_kill_pinned(p, c, "shutting down");
    }
}

void p2p_conns_evict_idle(struct pf_p2p *p)
{
    uint64_t now = pf_now_ns(), idle = p->cfg.conn_idle_ms * PF_NS_PER_MS;
    for (;;) {
        struct p2p_conn *c = NULL;
        pthread_mutex_lock(&p->conn_mu);
        pf_htable_for_each(&p->peers, i, n)
        {
            struct p2p_peer *e = pf_container_of(n, struct p2p_peer, node);
            struct p2p_conn *cand[2] = {e->out, e->in};
            for (int k = 0; k < 2 && !c; k++)
                if (cand[k] && cand[k]->refs == 1 && now > cand[k]->last_used_ns &&
                    now - cand[k]->last_used_ns >= idle)
                    c = cand[k];
        }
        if (c)
            c->refs++;
        pthread_mutex_unlock(&p->conn_mu);
        if (!c)
            return;
        pf_info("closing idle connection %llu to %s (%s, %zu QPs): no fetch for %llu s",
                (unsigned long long)c->id, c->peer->addr, c->outgoing ? "outgoing" : "incoming",
                c->nqps, (unsigned long long)(p->cfg.conn_idle_ms / 1000));
        conn_kill_pinned(p, c, "idle");
    }
}

void p2p_conns_free(struct pf_p2p *p)
{
    p2p_conns_drop_all(p);
    struct p2p_peer *all[64];
    size_t n;
    do {
        n = 0;
        pf_htable_for_each(&p->peers, i, h)
        {
            if (n < PF_ARRAY_SIZE(all))
                all[n++] = pf_container_of(h, struct p2p_peer, node);
        }
        for (size_t i = 0; i < n; i++) {
            pf_htable_remove(&p->peers, &all[i]->node);
            free(all[i]->addr);
            free(all[i]);
        }
    } while (n);
}

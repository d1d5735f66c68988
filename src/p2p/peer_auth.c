/* Which addresses a handshake may make this node connect to (docs/security.md).
 *
 * A handshake blob names the NET endpoints the other side wants our QPs connected to; for a
 * backend that connects by IP (tcp: pf_net_ep_host) an unchecked blob would make this node
 * open connections to any address an anonymous caller chooses. So every endpoint must name
 * an address the peer is known by:
 *   - requesting side: the address the peer is registered under (its MetaServer address,
 *     resolved);
 *   - serving side: an address the caller proved (its transport IP, or with mutual TLS an IP
 *     subjectAltName of its certificate); requester_id, the address we would later fetch
 *     from and file the connection under, must be one of them too. requester_id must be
 *     numeric: nothing a caller sends is resolved (no name lookup on the request path).
 * Loopback addresses count as one host (single-host simulations on 127.0.0.x); on the
 * serving side, a caller connecting from an address of this host may name any address of
 * this host (several nodes in one namespace, e.g. on veth pairs). */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"
#include "pf/config.h"
#include "pf/log.h"

/* numeric: AI_NUMERICHOST, never a name lookup (what a caller sends is never resolved: a
 * handshake must not make this node query DNS for a name of the caller's choosing) */
static int host_ips(const char *addr, bool numeric, char (*ips)[PF_AUTH_IP_MAX], size_t max,
                    size_t *n_p)
{
    char host[P2P_ADDR_MAX];
    uint16_t port;
    if (pf_addr_split(addr, host, sizeof(host), &port) != 0)
        return -EINVAL;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = numeric ? AI_NUMERICHOST : 0},
                    *res = NULL;
    int g = getaddrinfo(host, NULL, &hints, &res);
    if (g != 0)
        return numeric && g == EAI_NONAME ? -EINVAL : -EHOSTUNREACH;
    size_t n = 0;
    for (struct addrinfo *r = res; r && n < max; r = r->ai_next) {
        const void *a = r->ai_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)r->ai_addr)->sin_addr
                        : r->ai_family == AF_INET6
                            ? (const void *)&((struct sockaddr_in6 *)r->ai_addr)->sin6_addr
                            : NULL;
        if (a && inet_ntop(r->ai_family, a, ips[n], PF_AUTH_IP_MAX))
            n++;
    }
    freeaddrinfo(res);
    *n_p = n;
    return n ? 0 : -EHOSTUNREACH;
}

int p2p_host_ips(const char *addr, char (*ips)[PF_AUTH_IP_MAX], size_t max, size_t *n_p)
{
    return host_ips(addr, false, ips, max, n_p);
}

int p2p_numeric_ips(const char *addr, char (*ips)[PF_AUTH_IP_MAX], size_t max, size_t *n_p)
{
    return host_ips(addr, true, ips, max, n_p);
}

int p2p_endpoints_check(struct pf_p2p *p, const Pegaflow__HandshakeMetadata *m,
                        const char (*hosts)[PF_AUTH_IP_MAX], size_t nhosts, bool same_host,
                        const char *who, char *err, size_t errlen)
{
    for (size_t k = 0; k < m->n_nics; k++) {
        const Pegaflow__HandshakeNic *nic = m->nics[k];
        for (size_t j = 0; nic && j < nic->n_endpoints; j++) {
            char h[PF_AUTH_IP_MAX];
            int rc =
                pf_net_ep_host(p->net, nic->endpoints[j].data, nic->endpoints[j].len, h, sizeof(h));
            if (rc == -EOPNOTSUPP)
                return 0; /* the backend does not connect by address */
            if (rc) {
                snprintf(err, errlen, "nics[%zu].endpoints[%zu]: malformed endpoint", k, j);
                return -EINVAL;
            }
            if (!pf_auth_ip_in(h, hosts, nhosts) && !(same_host && pf_auth_ip_local(h))) {
                snprintf(err, errlen,
                         "nics[%zu].endpoints[%zu] names %s, which is not an address %s is "
                         "known by (%s%s)",
                         k, j, h, who, nhosts ? hosts[0] : "none", nhosts > 1 ? ", ..." : "");
                return -EACCES;
            }
        }
    }
    return 0;
}

int p2p_handshake_authorize(struct pf_p2p *p, const Pegaflow__RdmaHandshakeRequest *r,
                            const char (*ids)[PF_AUTH_IP_MAX], size_t nids, char *err,
                            size_t errlen)
{
    const char *who = r->requester_id ? r->requester_id : "";
    char req_ips[8][PF_AUTH_IP_MAX];
    size_t nreq = 0;
    if (p2p_numeric_ips(who, req_ips, PF_ARRAY_SIZE(req_ips), &nreq) != 0) {
        snprintf(err, errlen,
                 "requester_id: '%.64s' is not a numeric ip:port (host names are not resolved)",
                 who);
        return -EINVAL;
    }
    /* a caller on this host may speak for any of this host's addresses: nodes on veth pairs
     * in one namespace connect from whichever local address the kernel picks */
    bool local = nids > 0 && pf_auth_ip_local(ids[0]);
    bool proven = false;
    for (size_t i = 0; i < nreq && !proven; i++)
        proven = pf_auth_ip_in(req_ips[i], ids, nids) || (local && pf_auth_ip_local(req_ips[i]));
    if (!proven) {
        snprintf(err, errlen,
                 "requester_id %.64s is not an address the caller proved (it connected from "
                 "%s)",
                 who, nids ? ids[0] : "a non-IP transport");
        return -EACCES;
    }
    if (!r->handshake_metadata.len)
        return 0; /* rejected as empty by the handshake itself */
    Pegaflow__HandshakeMetadata *m = pegaflow__handshake_metadata__unpack(
        NULL, r->handshake_metadata.len, r->handshake_metadata.data);
    if (!m)
        return 0; /* rejected as malformed by the handshake itself */
    int rc = p2p_endpoints_check(p, m, ids, nids, local, who, err, errlen);
    pegaflow__handshake_metadata__free_unpacked(m, NULL);
    return rc;
}

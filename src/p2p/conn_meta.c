/* Handshake metadata (reference §7.3): validation of a peer's, packing of this node's, and
 * the peer-region rkey lookup. Rails without a pair travel as NICs with no endpoints and no
 * regions (docs/net.md "Per-NIC health"); the connection objects are in conn.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "p2p"
#include "p2p/p2p_internal.h"

int p2p_region_cmp(const void *a, const void *b)
{
    const struct p2p_region *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

int pf_p2p_meta_validate(const Pegaflow__HandshakeMetadata *m, const char *backend, size_t nnics,
                         uint32_t qps, char *err, size_t errlen)
{
    const char *b = m->backend ? m->backend : "";
    if (strncmp(b, "faulty:", 7) == 0)
        b += 7;
    if (strcmp(b, backend) != 0) {
        snprintf(err, errlen, "NET backend mismatch: peer uses '%s', this node '%s'", b, backend);
        return -EINVAL;
    }
    /* a peer with another NIC count, or with some rails down, is accepted: rails pair by
     * index where both sides have one up (docs/net.md "Per-NIC health") */
    if (m->n_nics == 0 || m->n_nics > P2P_NIC_MAX) {
        snprintf(err, errlen, "%zu NICs (1..%d allowed)", m->n_nics, P2P_NIC_MAX);
        return -EINVAL;
    }
    if (m->qps_per_nic != qps) {
        snprintf(err, errlen,
                 "QPs per NIC mismatch: peer uses %u, this node %u (--qps-per-peer must match)",
                 m->qps_per_nic, qps);
        return -EINVAL;
    }
    size_t common = 0;
    for (size_t i = 0; i < m->n_nics; i++) {
        const Pegaflow__HandshakeNic *nic = m->nics[i];
        if (nic->n_endpoints == 0 && nic->n_regions == 0)
            continue; /* a rail the peer has down */
        if (i < nnics)
            common++;
        if (nic->n_endpoints != qps) {
            snprintf(err, errlen, "nics[%zu]: %zu endpoints, expected %u (or none: rail down)", i,
                     nic->n_endpoints, qps);
            return -EINVAL;
        }
        for (size_t j = 0; j < nic->n_endpoints; j++)
            if (nic->endpoints[j].len == 0 || nic->endpoints[j].len > PF_NET_EP_MAX) {
                snprintf(err, errlen, "nics[%zu].endpoints[%zu]: %zu bytes (1..%d allowed)", i, j,
                         nic->endpoints[j].len, PF_NET_EP_MAX);
                return -EINVAL;
            }
        if (nic->n_regions == 0 || nic->n_regions > P2P_REGIONS_MAX) {
            snprintf(err, errlen, "nics[%zu]: %zu memory regions (1..%d allowed)", i,
                     nic->n_regions, P2P_REGIONS_MAX);
            return -EINVAL;
        }
        struct p2p_region *r = malloc(nic->n_regions * sizeof(*r));
        if (!r) {
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        int rc = 0;
        for (size_t j = 0; j < nic->n_regions && rc == 0; j++) {
            const Pegaflow__HandshakeMemRegion *g = nic->regions[j];
            uint64_t end;
            if (g->length == 0 || !pf_add_ok(g->addr, g->length, &end)) {
                snprintf(err, errlen, "nics[%zu].regions[%zu]: %s (addr 0x%llx, %llu bytes)", i, j,
                         g->length ? "wraps around" : "empty", (unsigned long long)g->addr,
                         (unsigned long long)g->length);
                rc = -EINVAL;
            }
            r[j] = (struct p2p_region){g->addr, g->length, g->rkey};
        }
        if (rc == 0) {
            qsort(r, nic->n_regions, sizeof(*r), p2p_region_cmp);
            for (size_t j = 1; j < nic->n_regions && rc == 0; j++)
                if (r[j - 1].addr + r[j - 1].len > r[j].addr) {
                    snprintf(err, errlen,
                             "nics[%zu]: memory regions overlap (0x%llx+%llu and 0x%llx+%llu)", i,
                             (unsigned long long)r[j - 1].addr, (unsigned long long)r[j - 1].len,
                             (unsigned long long)r[j].addr, (unsigned long long)r[j].len);
                    rc = -EINVAL;
                }
        }
        free(r);
        if (rc)
            return rc;
    }
    if (common == 0) {
        snprintf(err, errlen,
                 "no rail in common: the peer offers none of its %zu NIC(s) below this node's "
                 "%zu (rail k pairs NIC k on both sides; the others are down or absent)",
                 m->n_nics, nnics);
        return -EINVAL;
    }
    return 0;
}

int p2p_meta_build(struct pf_p2p *p, const struct p2p_conn *c, uint8_t **buf_p, size_t *len_p)
{
    int rc = -ENOMEM;
    size_t nnics = (size_t)p->nnics;
    Pegaflow__HandshakeMetadata m = PEGAFLOW__HANDSHAKE_METADATA__INIT;
    Pegaflow__HandshakeNic *nics = calloc(nnics, sizeof(*nics));
    Pegaflow__HandshakeNic **nicp = calloc(nnics, sizeof(*nicp));
    ProtobufCBinaryData *eps = calloc(c->nqps, sizeof(*eps));
    uint8_t *epbuf = malloc(c->nqps * PF_NET_EP_MAX);
    Pegaflow__HandshakeMemRegion *regs = calloc(nnics * p->nregions, sizeof(*regs));
    Pegaflow__HandshakeMemRegion **regp = calloc(nnics * p->nregions, sizeof(*regp));
    uint8_t *buf = NULL;
    if (!nics || !nicp || !eps || !epbuf || !regs || !regp)
        goto out;
    for (size_t i = 0; i < c->nqps; i++) {
        size_t l = 0;
        if (c->rail[i / p->qpn] != P2P_RAIL_UP)
            continue;
        rc = pf_net_qp_local_endpoint(c->qps[i], epbuf + i * PF_NET_EP_MAX, PF_NET_EP_MAX, &l);
        if (rc)
            goto out;
        eps[i] = (ProtobufCBinaryData){l, epbuf + i * PF_NET_EP_MAX};
    }
    for (size_t k = 0; k < nnics; k++) {
        bool up = c->rail[k] == P2P_RAIL_UP; /* a rail down: no endpoints, no regions */
        pegaflow__handshake_nic__init(&nics[k]);
        nics[k].n_endpoints = up ? p->qpn : 0;
        nics[k].endpoints = eps + k * p->qpn;
        nics[k].n_regions = up ? p->nregions : 0;
        nics[k].regions = regp + k * p->nregions;
        nics[k].numa_node = p->nics[k].numa_node;
        nics[k].name = p->nics[k].name;
        for (size_t r = 0; r < p->nregions; r++) {
            Pegaflow__HandshakeMemRegion *g = &regs[k * p->nregions + r];
            pegaflow__handshake_mem_region__init(g);
            g->addr = (uint64_t)(uintptr_t)p->rbase[r];
            g->length = p->rlen[r];
            g->rkey = p->rkey[k * p->nregions + r];
            regp[k * p->nregions + r] = g;
        }
        nicp[k] = &nics[k];
    }
    m.backend = p->backend;
    m.n_nics = nnics;
    m.nics = nicp;
    m.qps_per_nic = p->qpn;
    m.node_id = p->node_id;
    size_t len = pegaflow__handshake_metadata__get_packed_size(&m);
    buf = malloc(len ? len : 1);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    pegaflow__handshake_metadata__pack(&m, buf);
    *buf_p = buf;
    *len_p = len;
    rc = 0;
out:
    free(nics);
    free(nicp);
    free(eps);
    free(epbuf);
    free(regs);
    free(regp);
    return rc;
}

int p2p_meta_parse(struct pf_p2p *p, const ProtobufCBinaryData *b,
                   Pegaflow__HandshakeMetadata **m_p, char *err, size_t errlen)
{
    if (b->len == 0) {
        snprintf(err, errlen, "handshake_metadata is empty");
        return -EINVAL;
    }
    Pegaflow__HandshakeMetadata *m = pegaflow__handshake_metadata__unpack(NULL, b->len, b->data);
    if (!m) {
        snprintf(err, errlen, "handshake_metadata is not a serialized HandshakeMetadata");
        return -EINVAL;
    }
    int rc = pf_p2p_meta_validate(m, p->backend, (size_t)p->nnics, p->qpn, err, errlen);
    if (rc) {
        pegaflow__handshake_metadata__free_unpacked(m, NULL);
        return rc;
    }
    *m_p = m;
    return 0;
}

bool p2p_conn_rkey(const struct p2p_conn *c, int nic, uint64_t addr, uint64_t len, uint32_t *rkey_p)
{
    const struct p2p_region *r = c->regions[nic];
    size_t lo = 0, hi = c->nregions[nic];
    while (lo < hi) { /* first region with addr > target */
        size_t mid = (lo + hi) / 2;
        if (r[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return false;
    const struct p2p_region *g = &r[lo - 1];
    uint64_t end;
    if (!pf_add_ok(addr, len, &end) || end > g->addr + g->len)
        return false;
    *rkey_p = g->rkey;
    return true;
}

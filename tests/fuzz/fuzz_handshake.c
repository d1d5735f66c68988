/* Fuzz target: RDMA handshake metadata (src/p2p/conn_meta.c), the bytes a peer sends in
 * RdmaHandshakeRequest/Response.handshake_metadata.
 *
 * Input: byte 0 gives this node's NIC count (1 + (b & 3)), byte 1 its QPs per NIC
 * (1 + (b & 7)), byte 2 its NET backend (bit 0: "verbs", else "tcp"); the rest is the
 * serialized HandshakeMetadata, unpacked by the generated code and checked by
 * pf_p2p_meta_validate exactly as both handshake directions do. When it is accepted, the
 * target asserts everything conn_apply and the transfer path then rely on without further
 * checks: the NIC and endpoint counts, endpoint sizes, 1..P2P_REGIONS_MAX non-empty regions
 * per NIC that neither wrap nor overlap; tcp endpoints are decoded (tcpnet_ep_decode, what
 * the TCP fabric's qp_connect does first; nothing is connected). Then the regions are
 * installed sorted, as conn_apply does, and p2p_conn_rkey (which bounds every remote READ)
 * is compared with a linear scan for addresses at, around and inside every region. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../sim/net/tcpnet_wire.h"
#include "engine.pb-c.h"
#include "fuzz.h"
#include "p2p/p2p_internal.h"
#include "pf/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int region_cmp(const void *a, const void *b)
{
    const struct p2p_region *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Reference: the region containing [addr, addr+len), by linear scan. */
static bool ref_rkey(const struct p2p_region *r, size_t n, uint64_t addr, uint64_t len,
                     uint32_t *rkey_p)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t end;
        if (addr >= r[i].addr && pf_add_ok(addr, len, &end) && end <= r[i].addr + r[i].len) {
            *rkey_p = r[i].rkey;
            return true;
        }
    }
    return false;
}

static void check_lookup(const struct p2p_conn *c, int nic, uint64_t addr, uint64_t len)
{
    uint32_t a = 0, b = 0;
    bool got = p2p_conn_rkey(c, nic, addr, len, &a);
    bool want = ref_rkey(c->regions[nic], c->nregions[nic], addr, len, &b);
    if (got != want || (got && a != b))
        fz_fail("p2p_conn_rkey(nic %d, 0x%llx, %llu) = %d/%u, expected %d/%u", nic,
                (unsigned long long)addr, (unsigned long long)len, got, a, want, b);
}

static void check_accepted(const Pegaflow__HandshakeMetadata *m, size_t nnics, uint32_t qps,
                           bool tcp)
{
    /* a peer may have another NIC count and rails down (docs/net.md "Per-NIC health"): rail
     * k pairs NIC k on both sides, a down rail has neither endpoints nor regions, and at
     * least one rail the peer has up must exist on this node */
    if (m->n_nics == 0 || m->n_nics > P2P_NIC_MAX)
        fz_fail("accepted %zu NICs (1..%d)", m->n_nics, P2P_NIC_MAX);
    struct p2p_region *regs[P2P_NIC_MAX] = {0};
    size_t nregs[P2P_NIC_MAX] = {0};
    size_t common = 0;
    for (size_t k = 0; k < m->n_nics; k++) {
        const Pegaflow__HandshakeNic *nic = m->nics[k];
        if (nic->n_endpoints == 0 && nic->n_regions == 0)
            continue; /* down on the peer */
        if (k < nnics)
            common++;
        if (nic->n_endpoints != qps)
            fz_fail("nic %zu: accepted %zu endpoints, expected %u", k, nic->n_endpoints, qps);
        for (size_t j = 0; j < nic->n_endpoints; j++) {
            const ProtobufCBinaryData *ep = &nic->endpoints[j];
            if (ep->len == 0 || ep->len > PF_NET_EP_MAX)
                fz_fail("nic %zu: accepted a %zu-byte endpoint", k, ep->len);
            struct tcpnet_ep e;
            if (tcp)
                (void)tcpnet_ep_decode(ep->data, ep->len, &e);
        }
        size_t n = nic->n_regions;
        if (n == 0 || n > P2P_REGIONS_MAX)
            fz_fail("nic %zu: accepted %zu regions", k, n);
        regs[k] = malloc(n * sizeof(*regs[k]));
        if (!regs[k])
            fz_fail("out of memory");
        for (size_t j = 0; j < n; j++) {
            const Pegaflow__HandshakeMemRegion *g = nic->regions[j];
            uint64_t end;
            if (g->length == 0 || !pf_add_ok(g->addr, g->length, &end))
                fz_fail("nic %zu: accepted region %zu (0x%llx+%llu)", k, j,
                        (unsigned long long)g->addr, (unsigned long long)g->length);
            regs[k][j] = (struct p2p_region){g->addr, g->length, g->rkey};
        }
        qsort(regs[k], n, sizeof(*regs[k]), region_cmp);
        for (size_t j = 1; j < n; j++)
            if (regs[k][j - 1].addr + regs[k][j - 1].len > regs[k][j].addr)
                fz_fail("nic %zu: accepted overlapping regions", k);
        nregs[k] = n;
    }
    if (common == 0)
        fz_fail("accepted a peer with no rail in common (%zu NICs, this node %zu)", m->n_nics,
                nnics);
    struct p2p_conn c = {.regions = regs, .nregions = nregs};
    for (size_t k = 0; k < m->n_nics; k++) {
        for (size_t j = 0; j < nregs[k] && j < 64; j++) {
            const struct p2p_region *r = &regs[k][j];
            uint64_t probes[][2] = {{r->addr, 1},
                                    {r->addr, r->len},
                                    {r->addr, r->len + 1},
                                    {r->addr + r->len - 1, 1},
                                    {r->addr + r->len - 1, 2},
                                    {r->addr + r->len, 1},
                                    {r->addr ? r->addr - 1 : 0, 2},
                                    {r->addr + r->len / 2, r->len / 2},
                                    {r->addr, UINT64_MAX}};
            for (size_t p = 0; p < PF_ARRAY_SIZE(probes); p++)
                check_lookup(&c, (int)k, probes[p][0], probes[p][1]);
        }
        free(regs[k]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    size_t nnics = 1 + (data[0] & 3);
    uint32_t qps = 1 + (data[1] & 7);
    bool tcp = !(data[2] & 1);
    const char *backend = tcp ? "tcp" : "verbs";
    Pegaflow__HandshakeMetadata *m = pegaflow__handshake_metadata__unpack(NULL, size - 3, data + 3);
    if (!m)
        return 0; /* "handshake_metadata is not a serialized HandshakeMetadata" */
    char err[P2P_ERRLEN] = "";
    int rc = pf_p2p_meta_validate(m, backend, nnics, qps, err, sizeof(err));
    if (rc == 0)
        check_accepted(m, nnics, qps, tcp);
    else if (rc != -EINVAL || !err[0])
        fz_fail("pf_p2p_meta_validate returned %d (%s)", rc, err);
    pegaflow__handshake_metadata__free_unpacked(m, NULL);
    return 0;
}

/* verbs NET backend, GID choice (design: docs/net.md "GID choice"; contract:
 * pf_verbs_pick_gid in verbs_internal.h): GID families, --rdma-gid-subnet parsing and the
 * ranking over one port's table as ibv_query_gid_ex(3) reports it. Pure functions. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_internal.h"

static bool verbs_gid_zero(const union ibv_gid *g)
{
    static const uint8_t z[16];
    return memcmp(g->raw, z, 16) == 0;
}

static bool verbs_gid_link_local(const union ibv_gid *g)
{
    return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
}

static bool verbs_gid_v4mapped(const union ibv_gid *g)
{
    static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, pre, 12) == 0;
}

int pf_verbs_gid_family(const struct ibv_gid_entry *e)
{
    if (e->gid_type == IBV_GID_TYPE_IB)
        return 0;
    return verbs_gid_v4mapped(&e->gid) ? 4 : 6;
}

int pf_verbs_parse_subnet(const char *cidr, struct pf_verbs_gid_rule *r)
{
    char buf[INET6_ADDRSTRLEN + 8];
    if (!cidr || strlen(cidr) >= sizeof(buf))
        return -EINVAL;
    snprintf(buf, sizeof(buf), "%s", cidr);
    char *slash = strchr(buf, '/');
    if (!slash)
        return -EINVAL;
    *slash = '\0';
    char *end = NULL;
    errno = 0;
    long pl = strtol(slash + 1, &end, 10);
    if (errno || !end || *end || end == slash + 1)
        return -EINVAL;
    uint8_t net[16] = {0};
    int fam;
    if (inet_pton(AF_INET, buf, net) == 1)
        fam = 4;
    else if (inet_pton(AF_INET6, buf, net) == 1)
        fam = 6;
    else
        return -EINVAL;
    if (pl < 0 || pl > (fam == 4 ? 32 : 128))
        return -EINVAL;
    r->family = fam;
    r->prefix = (int)pl;
    memcpy(r->net, net, 16);
    return 0;
}

static bool verbs_prefix_eq(const uint8_t *a, const uint8_t *b, int bits)
{
    int full = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)full) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t m = (uint8_t)(0xff << (8 - rest));
    return (a[full] & m) == (b[full] & m);
}

static bool verbs_in_subnet(const struct ibv_gid_entry *e, const struct pf_verbs_gid_rule *r)
{
    if (!r || r->family == 0)
        return true;
    if (e->gid_type == IBV_GID_TYPE_IB)
        return r->family == 6 && verbs_prefix_eq(e->gid.raw, r->net, r->prefix);
    if (r->family == 4)
        return verbs_gid_v4mapped(&e->gid) && verbs_prefix_eq(e->gid.raw + 12, r->net, r->prefix);
    return !verbs_gid_v4mapped(&e->gid) && verbs_prefix_eq(e->gid.raw, r->net, r->prefix);
}

static int verbs_gid_rank(const struct ibv_gid_entry *e, int up)
{
    bool live = up != 0, ll = verbs_gid_link_local(&e->gid);
    if (e->gid_type == IBV_GID_TYPE_IB)
        return 3;
    if (live && e->gid_type == IBV_GID_TYPE_ROCE_V2 && verbs_gid_v4mapped(&e->gid))
        return 1;
    if (live && e->gid_type == IBV_GID_TYPE_ROCE_V2 && !ll)
        return 2;
    if (live && !ll)
        return 4;
    if (live && e->gid_type == IBV_GID_TYPE_ROCE_V2)
        return 5;
    return live ? 6 : 7;
}

int pf_verbs_pick_gid(const struct ibv_gid_entry *ents, const int8_t *up, int n,
                      const struct pf_verbs_gid_rule *rule)
{
    if (rule && rule->index >= 0) {
        int i = rule->index;
        if (i >= n || verbs_gid_zero(&ents[i].gid) || !verbs_in_subnet(&ents[i], rule))
            return -ENOENT;
        return i;
    }
    /* entry 0 is the port's default GID, on the port's own net device (mlx5's PF or VF,
     * rxe's netdev): on equal rank its addresses win over those of VLAN, macvlan or bond
     * devices stacked on it, which the kernel lists too and brings up with it */
    uint32_t own = n > 0 && !verbs_gid_zero(&ents[0].gid) ? ents[0].ndev_ifindex : 0;
    int best = -ENOENT, best_rank = 99;
    for (int i = 0; i < n; i++) {
        if (verbs_gid_zero(&ents[i].gid) || !verbs_in_subnet(&ents[i], rule))
            continue;
        int rk = 2 * verbs_gid_rank(&ents[i], up ? up[i] : -1) +
                 (own && ents[i].ndev_ifindex != own ? 1 : 0);
        if (rk < best_rank) {
            best_rank = rk;
            best = i;
        }
    }
    return best;
}

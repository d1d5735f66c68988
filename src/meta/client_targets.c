/* MetaServer client: the list of MetaServer replicas (--metaserver-addr A,B,...), a
 * registration and a query channel per replica, and which replica is current.
 *
 * Sticky failover: every RPC goes to the current replica; a transport failure
 * (UNAVAILABLE, DEADLINE_EXCEEDED: pf_meta_targets_failed) moves every caller to the next
 * one, in list order, wrapping around. The move is a compare-and-swap from the index the
 * failed call used, so concurrent failures of one replica advance once. Healthy replicas are
 * never left, so load does not flap. Contract in meta/meta_internal.h. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "metaclient"
#include "meta/meta_internal.h"
#include "pf/log.h"
#include "pf/metrics.h"

struct pf_meta_targets {
    size_t n;
    char **name;
    struct pf_rpc_channel **reg, **query;
    _Atomic size_t cur;
    struct pf_metric *c_failover;
};

int pf_meta_targets_open(const char *list, struct pf_meta_targets **t_p)
{
    if (!list || !*list)
        return -EINVAL;
    struct pf_meta_targets *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    size_t cap = 1;
    for (const char *p = list; *p; p++)
        cap += *p == ',';
    int rc = -ENOMEM;
    t->name = calloc(cap, sizeof(*t->name));
    t->reg = calloc(cap, sizeof(*t->reg));
    t->query = calloc(cap, sizeof(*t->query));
    if (!t->name || !t->reg || !t->query)
        goto err;
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0) {
            rc = -EINVAL;
            goto err;
        }
        rc = -ENOMEM;
        if (!(t->name[t->n] = strndup(p, len)))
            goto err;
        t->n++;
        rc = pf_rpc_channel_open(t->name[t->n - 1], &t->reg[t->n - 1]);
        if (!rc)
            rc = pf_rpc_channel_open_lean(t->name[t->n - 1], &t->query[t->n - 1]);
        if (rc)
            goto err;
        p += len + (e ? 1 : 0);
    }
    t->c_failover = pf_metric_counter("pegaflow_metaserver_failovers",
                                      "Switches to the next --metaserver-addr replica", "");
    *t_p = t;
    return 0;
err:
    pf_meta_targets_close(t);
    return rc;
}

void pf_meta_targets_close(struct pf_meta_targets *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        pf_rpc_channel_close(t->query ? t->query[i] : NULL);
        pf_rpc_channel_close(t->reg ? t->reg[i] : NULL);
        free(t->name[i]);
    }
    free(t->name);
    free(t->reg);
    free(t->query);
    free(t);
}

size_t pf_meta_targets_count(const struct pf_meta_targets *t)
{
    return t->n;
}

size_t pf_meta_targets_current(struct pf_meta_targets *t)
{
    return atomic_load(&t->cur);
}

const char *pf_meta_targets_name(const struct pf_meta_targets *t, size_t i)
{
    return t->name[i % t->n];
}

struct pf_rpc_channel *pf_meta_targets_reg(const struct pf_meta_targets *t, size_t i)
{
    return t->reg[i % t->n];
}

struct pf_rpc_channel *pf_meta_targets_query(const struct pf_meta_targets *t, size_t i)
{
    return t->query[i % t->n];
}

bool pf_meta_targets_failed(struct pf_meta_targets *t, size_t i, int grpc_code)
{
    if (t->n < 2 || (grpc_code != PF_GRPC_UNAVAILABLE && grpc_code != PF_GRPC_DEADLINE_EXCEEDED))
        return false;
    size_t seen = i;
    if (!atomic_compare_exchange_strong(&t->cur, &seen, (i + 1) % t->n))
        return true; /* someone else moved on already */
    pf_metric_add(t->c_failover, 1);
    pf_warn("MetaServer %s failed (%s); switching to %s", t->name[i % t->n],
            pf_grpc_code_name(grpc_code), t->name[(i + 1) % t->n]);
    return true;
}

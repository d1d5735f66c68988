/* Security glue of both binaries (docs/security.md): the process's channel identity, the
 * --local-rpcs policy, and the start-up warning for listeners other hosts can reach without
 * authentication. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "auth"
#include "app/app.h"
#include "pf/auth.h"
#include "pf/config.h"
#include "pf/log.h"

int pf_app_auth_channels(const struct pf_auth *a)
{
    struct pf_rpc_channel_opts o;
    pf_auth_channel_opts(a, &o);
    return pf_rpc_set_default_channel_opts(&o);
}

/* Loopback (127/8, ::1, localhost) or a Unix socket: only this host can connect. */
bool pf_app_addr_is_host_only(const char *addr)
{
    if (strncmp(addr, "unix:", 5) == 0)
        return true;
    char host[256];
    uint16_t port;
    if (pf_addr_split(addr, host, sizeof(host), &port) != 0)
        return false;
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcmp(host, "localhost") == 0;
}

void pf_app_warn_open(const char *what, const char *addr, bool authenticated, const char *how)
{
    if (authenticated || pf_app_addr_is_host_only(addr))
        return;
    pf_warn("%s on %s is reachable from the network without authentication; %s", what, addr, how);
}

int pf_app_local_rpcs(const char *v, const struct pf_auth *a, bool *local_only_p)
{
    (void)a;
    if (strcmp(v, "host") == 0)
        *local_only_p = true;
    else if (strcmp(v, "any") == 0)
        *local_only_p = false;
    else if (strcmp(v, "auto") == 0)
        *local_only_p = true; /* protected by default (issue 26): whatever else is configured */
    else
        return -EINVAL;
    return 0;
}

bool pf_app_cluster_authenticated(const struct pf_auth *a)
{
    return a->cluster_token || a->ca_pem;
}

uint64_t pf_app_insecure_warn_secs(bool debug)
{
    const char *v = debug ? getenv("PEGAFLOW_INSECURE_WARN_SECS") : NULL;
    uint64_t secs;
    if (v && pf_parse_u64(v, &secs) == 0 && secs >= 1 && secs <= PF_APP_INSECURE_WARN_SECS)
        return secs;
    return PF_APP_INSECURE_WARN_SECS;
}

void pf_app_warn_insecure(const char *what)
{
    pf_warn("--insecure-cluster: %s runs without a cluster token or mutual TLS: anyone who "
            "reaches it may call the peer and MetaServer RPCs (QueryBlocksForTransfer hands out "
            "pool addresses); set --cluster-token-file FILE on every node and the MetaServer",
            what);
}

void pf_app_warn_local_rpcs_any(const char *addr, const struct pf_auth *a)
{
    if (pf_app_addr_is_host_only(addr))
        return;
    pf_warn("--local-rpcs any: the worker RPCs (Save, Load, Shutdown, ...) on %s answer every "
            "caller that reaches it%s; drop --local-rpcs any (default: this host only, or "
            "callers with the cluster token)",
            addr, a->cluster_token ? ", with or without the cluster token" : "");
}

/* pegaflow-metaserver flags (reference §9.2) plus --rpc-threads. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "app/app.h"

#define F(n_, t_, field_, def_, meta_, help_, ...)                                                 \
    {                                                                                              \
        .name = n_, .type = t_, .off = offsetof(struct pf_meta_config, field_), .defval = def_,    \
        .metavar = meta_, .help = help_, __VA_ARGS__                                               \
    }

const struct pf_flag pf_meta_flags[] = {
    F("addr", PF_FLAG_ADDR, addr, "127.0.0.1:50056", "HOST:PORT", "gRPC bind address"),
    F("http-addr", PF_FLAG_ADDR, http_addr, "0.0.0.0:9092", "HOST:PORT",
      "HTTP address for /health and /metrics"),
    F("log-level", PF_FLAG_LOGLEVEL, log_level, "info", "LEVEL",
      "Log level: trace, debug, info, warn, error"),
    F("node-stale-secs", PF_FLAG_U64, node_stale_secs, "30", "SECS",
      "A node whose last heartbeat is older than this is hidden from queries", .min = 1,
      .max = 86400),
    F("ttl-minutes", PF_FLAG_U64, ttl_minutes, "120", "MINUTES",
      "Cache entry TTL: ownership older than this is swept", .max = 525600),
    F("sweep-interval-secs", PF_FLAG_U64, sweep_interval_secs, "600", "SECS",
      "How often expired entries are swept", .max = 86400),
    F("rpc-threads", PF_FLAG_U64, rpc_threads, "8", "N", "gRPC handler threads", .min = 1,
      .max = 256),
    F("tls-cert", PF_FLAG_STR, tls_cert, NULL, "FILE", "PEM certificate: TLS on the gRPC listener"),
    F("tls-key", PF_FLAG_STR, tls_key, NULL, "FILE", "PEM private key of --tls-cert"),
    F("tls-ca", PF_FLAG_STR, tls_ca, NULL, "FILE",
      "PEM CA: require client certificates it signed (mutual TLS)"),
    F("cluster-token-file", PF_FLAG_STR, cluster_token_file, NULL, "FILE",
      "Shared secret every RPC must carry (pf-cluster-token metadata)"),
    F("store", PF_FLAG_STR, store, "memory", "memory|redis://HOST:PORT[,HOST:PORT...]",
      "Where the registry lives: this process's memory, or Redis / Redis Cluster (stateless "
      "MetaServer replicas; redis://[[USER:]PASSWORD@]HOST:PORT,... for AUTH)"),
};
const size_t pf_meta_nflags = PF_ARRAY_SIZE(pf_meta_flags);

int pf_meta_config_parse(struct pf_meta_config *cfg, int argc, char **argv, char *err,
                         size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    int rc = pf_flags_parse(pf_meta_flags, pf_meta_nflags, cfg, argc, argv, err, errlen);
    if (rc)
        return rc;
    if (cfg->ttl_minutes == 0) {
        snprintf(err, errlen, "--ttl-minutes: must be greater than 0");
        return -EINVAL;
    }
    if (cfg->sweep_interval_secs == 0) {
        snprintf(err, errlen, "--sweep-interval-secs: must be greater than 0");
        return -EINVAL;
    }
    if (strcmp(cfg->store, "memory") != 0 && strncmp(cfg->store, "redis://", 8) != 0 &&
        strncmp(cfg->store, "rediss://", 9) != 0) {
        snprintf(err, errlen, "--store: '%.200s' is neither memory nor redis://HOST:PORT[,...]",
                 cfg->store);
        return -EINVAL;
    }
    if (cfg->ttl_minutes * 60 < cfg->node_stale_secs) {
        snprintf(err, errlen,
                 "--ttl-minutes: %llu minutes is shorter than --node-stale-secs %llu; raise "
                 "--ttl-minutes to at least %llu or lower --node-stale-secs",
                 (unsigned long long)cfg->ttl_minutes, (unsigned long long)cfg->node_stale_secs,
                 (unsigned long long)((cfg->node_stale_secs + 59) / 60));
        return -EINVAL;
    }
    struct pf_auth_config ac = {
        .tls_cert = cfg->tls_cert,
        .tls_key = cfg->tls_key,
        .tls_ca = cfg->tls_ca,
        .cluster_token_file = cfg->cluster_token_file,
    };
    if (pf_auth_load(&ac, &cfg->auth, err, errlen) != 0)
        return -EINVAL;
    return 0;
}

void pf_meta_config_free(struct pf_meta_config *cfg)
{
    pf_flags_free(pf_meta_flags, pf_meta_nflags, cfg);
    pf_auth_free(&cfg->auth);
}

/* pegaflow-metaserver flags (reference §9.2) plus --rpc-threads. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "pf/meta.h"

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
    F("insecure-cluster", PF_FLAG_BOOL, insecure_cluster, "false", NULL,
      "Allow an --addr other hosts can reach without a cluster token or mutual TLS (warned "
      "at start and hourly)"),
    F("redis-password-file", PF_FLAG_STR, redis_password_file, NULL, "FILE",
      "Redis AUTH password of --store (first line; instead of one in the URL; else "
      "PEGAFLOW_REDIS_PASSWORD)"),
};
const size_t pf_meta_nflags = PF_ARRAY_SIZE(pf_meta_flags);

/* The Redis password from --redis-password-file (the token files' checks: first line,
 * printable, a file others can read is warned about), else PEGAFLOW_REDIS_PASSWORD (its value
 * is wiped from the environment once copied). Only with a redis:// store. */
static int redis_password(struct pf_meta_config *cfg, char *err, size_t errlen)
{
    const char *env = getenv("PEGAFLOW_REDIS_PASSWORD");
    bool redis = strcmp(cfg->store, "memory") != 0;
    if (cfg->redis_password_file) {
        if (!redis) {
            snprintf(err, errlen, "--redis-password-file: needs a redis:// --store");
            return -EINVAL;
        }
        if (pf_auth_read_token(cfg->redis_password_file, "--redis-password-file",
                               &cfg->redis_password, err, errlen) != 0)
            return -EINVAL;
    } else if (env && *env && redis) {
        if (!(cfg->redis_password = strdup(env)))
            return -ENOMEM;
    }
    if (env) { /* never left for children or /proc/PID/environ */
        explicit_bzero((char *)env, strlen(env));
        unsetenv("PEGAFLOW_REDIS_PASSWORD");
    }
    return 0;
}

/* Overwrites the password of a URL ("SCHEME://[USER:]PASSWORD@...", also a misspelt
 * scheme) in s with '*' (in place). */
static void hide_password(char *s)
{
    char *u = strstr(s, "://");
    char *rest = u ? u + 3 : NULL, *at = rest ? strrchr(rest, '@') : NULL;
    if (!at)
        return;
    char *colon = memchr(rest, ':', (size_t)(at - rest));
    char *p = colon ? colon + 1 : rest;
    memset(p, '*', (size_t)(at - p));
}

int pf_meta_config_parse(struct pf_meta_config *cfg, int argc, char **argv, char *err,
                         size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    int rc = pf_flags_parse(pf_meta_flags, pf_meta_nflags, cfg, argc, argv, err, errlen);
    /* once copied, a URL's password leaves argv (ps, /proc/PID/cmdline) and every message */
    for (int i = 1; i < argc; i++)
        hide_password(argv[i]);
    if (rc) {
        hide_password(err);
        return rc;
    }
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
        char shown[256];
        pf_meta_store_redact(cfg->store, shown, sizeof(shown));
        snprintf(err, errlen, "--store: '%.200s' is neither memory nor redis://HOST:PORT[,...]",
                 shown);
        return -EINVAL;
    }
    int prc = redis_password(cfg, err, errlen);
    if (prc)
        return prc;
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
    /* protected by default (docs/security.md): loopback needs nothing, a reachable --addr a
     * token (or mutual TLS) or the explicit opt-out */
    if (!pf_app_addr_is_host_only(cfg->addr) && !pf_app_cluster_authenticated(&cfg->auth) &&
        !cfg->insecure_cluster) {
        snprintf(err, errlen,
                 "--addr %s: other hosts can reach it, so the MetaServer needs a cluster token: "
                 "give it and every node --cluster-token-file FILE (one secret, e.g. head -c 32 "
                 "/dev/urandom | base64 > FILE; chmod 600), or mutual TLS with --tls-ca, or add "
                 "--insecure-cluster to run unprotected",
                 cfg->addr);
        return -EINVAL;
    }
    return 0;
}

void pf_meta_config_free(struct pf_meta_config *cfg)
{
    if (cfg->store) /* the URL may hold the Redis password */
        explicit_bzero(cfg->store, strlen(cfg->store));
    if (cfg->redis_password) {
        explicit_bzero(cfg->redis_password, strlen(cfg->redis_password));
        free(cfg->redis_password);
        cfg->redis_password = NULL;
    }
    pf_flags_free(pf_meta_flags, pf_meta_nflags, cfg);
    pf_auth_free(&cfg->auth);
}

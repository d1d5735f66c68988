/* pegaflow-metaserver process lifecycle: flags -> store + sweeper -> HTTP -> gRPC, then
 * wait for SIGINT/SIGTERM and stop in reverse order (gRPC first, so no handler runs when
 * the store is freed). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#define PF_LOG_MOD "metaserver"
#include "app/app.h"
#include "pf/http.h"
#include "pf/log.h"
#include "pf/meta.h"
#include "pf/rpc.h"

static const struct pf_http_route meta_routes[] = {
    {"GET", "/health", pf_http_health, NULL},
    {"GET", "/metrics", pf_http_metrics, NULL},
};

int pf_metaserver_main(int argc, char **argv)
{
    struct pf_meta_config cfg;
    char err[512];
    int rc = pf_meta_config_parse(&cfg, argc, argv, err, sizeof(err));
    if (rc == 1) {
        pf_flags_usage(stdout, "pegaflow-metaserver",
                       "PegaFlow MetaServer: cluster-wide registry of which node holds which KV "
                       "block.",
                       pf_meta_flags, pf_meta_nflags);
        pf_meta_config_free(&cfg);
        return 0;
    }
    if (rc == 2) {
        printf("%s\n", PF_VERSION);
        pf_meta_config_free(&cfg);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "pegaflow-metaserver: %s\n", err);
        pf_meta_config_free(&cfg);
        return 2;
    }
    pf_log_set_level(cfg.log_level);
    pf_info("pegaflow-metaserver %s starting (pid %d)", PF_VERSION, (int)getpid());
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &set, SFD_CLOEXEC);
    int exit_code = 1;
    struct pf_http_server *http = NULL;
    struct pf_rpc_server *rpc = NULL;
    struct pf_meta_store *store = NULL;
    struct pf_meta_sweeper *sweeper = NULL;
    int port = 0;
    if (sfd < 0) {
        pf_error("signalfd: %s", strerror(errno));
        goto out;
    }
    struct pf_meta_store_config scfg = {
        .node_stale_secs = cfg.node_stale_secs,
        .ttl_secs = cfg.ttl_minutes * 60,
        .store = cfg.store,
        .redis_password = cfg.redis_password,
    };
    rc = pf_meta_store_create(&scfg, &store);
    if (rc) {
        pf_error("cannot create the store: %s", strerror(-rc));
        goto out;
    }
    rc = pf_meta_sweeper_start(store, cfg.sweep_interval_secs, &sweeper);
    if (rc) {
        pf_error("cannot start the sweep thread: %s", strerror(-rc));
        goto out;
    }
    if (strcmp(cfg.store, "memory") != 0) {
        char shown[512];
        pf_meta_store_redact(cfg.store, shown, sizeof(shown));
        pf_info("store: Redis at %s (stateless: replicas may share it)%s", shown,
                cfg.redis_password ? ", password from --redis-password-file/PEGAFLOW_REDIS_PASSWORD"
                                   : "");
    }
    pf_info("node stale after %llu s, ownership TTL %llu min, sweep every %llu s",
            (unsigned long long)cfg.node_stale_secs, (unsigned long long)cfg.ttl_minutes,
            (unsigned long long)cfg.sweep_interval_secs);
    rc = pf_http_server_start(cfg.http_addr, meta_routes, PF_ARRAY_SIZE(meta_routes), NULL, &http,
                              &port, err, sizeof(err));
    if (rc) {
        pf_error("--http-addr: %s", err);
        goto out;
    }
    pf_info("HTTP listening on %s (port %d)", cfg.http_addr, port);
    struct pf_rpc_server_config rcfg = {
        .addr = cfg.addr,
        .threads = (int)cfg.rpc_threads,
        .methods = pf_meta_methods,
        .nmethods = pf_meta_nmethods,
        .ctx = store,
        .metric_prefix = "pegaflow_metaserver",
        .auth = &cfg.auth,
    };
    rc = pf_rpc_server_start(&rcfg, &rpc, &port, err, sizeof(err));
    if (rc) {
        pf_error("--addr: %s", err);
        goto out;
    }
    pf_info("gRPC listening on %s (port %d)%s", cfg.addr, port,
            cfg.auth.ca_pem     ? ", mutual TLS"
            : cfg.auth.cert_pem ? ", TLS"
                                : "");
    pf_info("security: cluster token %s", cfg.auth.cluster_token ? "required" : "off");
    pf_app_warn_open("gRPC", cfg.addr, cfg.auth.ca_pem || cfg.auth.cluster_token,
                     "set --cluster-token-file and/or --tls-cert/--tls-key/--tls-ca");
    bool insecure = !pf_app_addr_is_host_only(cfg.addr) && !pf_app_cluster_authenticated(&cfg.auth);
    if (insecure)
        pf_app_warn_insecure("this MetaServer");
    pf_info("ready");
    struct pollfd p = {.fd = sfd, .events = POLLIN};
    for (;;) {
        int n = poll(&p, 1, insecure ? PF_APP_INSECURE_WARN_SECS * 1000 : -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0) { /* the hourly reminder of --insecure-cluster */
            pf_app_warn_insecure("this MetaServer");
            continue;
        }
        break;
    }
    struct signalfd_siginfo si;
    if (read(sfd, &si, sizeof(si)) == sizeof(si))
        pf_info("received %s, shutting down", strsignal((int)si.ssi_signo));
    exit_code = 0;
out:
    pf_rpc_server_stop(rpc);
    pf_http_server_stop(http);
    pf_meta_sweeper_stop(sweeper);
    pf_meta_store_destroy(store);
    if (sfd >= 0)
        close(sfd);
    pf_meta_config_free(&cfg);
    pf_info("stopped");
    return exit_code;
}

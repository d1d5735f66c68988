/* pegaflow-server process lifecycle: flags -> logging -> fault plan -> HAL -> engine ->
 * NICs + P2P (--nics) -> HTTP -> gRPC -> MetaServer client (advertising the bound port);
 * then wait for SIGINT, SIGTERM or the Shutdown RPC and tear down in
 * reverse order. Signals are blocked in every thread and read from a signalfd by the
 * main thread; the Shutdown RPC writes an eventfd. */
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#define PF_LOG_MOD "server"
#include "app/app.h"
#include "app/server_meta.h"
#include "pf/engine.h"
#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/http.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/p2p.h"
#include "pf/rpc.h"
#include "pf/service.h"
#include "pf/ssd.h"

struct server_app {
    struct pf_server_config cfg;
    struct pf_fault_plan *faults;
    struct pf_gpu *gpu;
    char gpu_backend[64];
    struct pf_blk *blk;
    struct pf_ssd *ssd;
    struct pf_http_server *http;
    struct pf_rpc_server *rpc;
    struct pf_engine_service svc;
    struct pf_otlp_exporter *otlp;
    struct pf_meta_client *meta;
    struct pf_net *net;
    char net_backend[64];
    struct pf_p2p *p2p;
    int grpc_port;
    char advertise[300]; /* --addr with the bound port: what peers and the MetaServer see */
    int efd;
    int sfd;
};

static void request_shutdown(void *p)
{
    struct server_app *a = p;
    uint64_t one = 1;
    if (write(a->efd, &one, sizeof(one)) < 0)
        pf_warn("shutdown eventfd write failed: %s", strerror(errno));
}

static void log_topology(struct server_app *a)
{
    int n = pf_gpu_device_count(a->gpu);
    pf_info("topology: %d GPU(s) on backend %s", n, a->gpu_backend);
    for (int i = 0; i < n; i++) {
        struct pf_gpu_dev_info info;
        if (pf_gpu_device_info(a->gpu, i, &info) == 0)
            pf_info("  GPU %d: %s, NUMA node %d, PCI %s", info.index, info.name, info.numa_node,
                    info.pci_bus_id);
    }
}

static int open_hal(struct server_app *a)
{
    char err[256];
    a->faults = a->cfg.faults;
    if (a->faults)
        pf_warn("fault injection enabled: spec='%s' seed=%llu (set seed=N in the spec to replay)",
                pf_fault_plan_spec(a->faults), (unsigned long long)pf_fault_plan_seed(a->faults));
    pf_hal_init();
    struct pf_gpu_config gc = {
        .devices = a->cfg.device_ids,
        .ndevices = a->cfg.ndevice_ids,
        .sim_bandwidth = a->cfg.sim_gpu_bandwidth,
        .sim_default_devices = (int)a->cfg.sim_gpus,
        .faults = a->faults,
        .gpu_copy_batch = a->cfg.gpu_copy_batch_mode,
    };
    int rc = pf_hal_gpu_open(a->cfg.gpu_backend, &gc, &a->gpu, a->gpu_backend,
                             sizeof(a->gpu_backend), err, sizeof(err));
    if (rc) {
        pf_error("--gpu-backend %s: %s", a->cfg.gpu_backend, err);
        return rc;
    }
    if (pf_gpu_device_count(a->gpu) <= 0) {
        pf_error("--gpu-backend %s: no GPU devices", a->gpu_backend);
        return -ENODEV;
    }
    log_topology(a);
    return 0;
}

/* NICs for P2P (--nics): open the NET backend, log which GPU is near which NIC, register
 * the pool on every NIC and serve the P2P RPCs. */
static int start_p2p(struct server_app *a)
{
    char err[512];
    struct pf_net_rdma_opts ro = pf_net_rdma_defaults();
    const char *gix = a->cfg.rdma_gid_index;
    if (gix && strcmp(gix, "auto") != 0) {
        char *end = NULL;
        errno = 0;
        long v = strtol(gix, &end, 10);
        if (errno || end == gix || *end || v < 0 || v > 65535) {
            pf_error("--rdma-gid-index: '%s' is neither auto nor a GID table index", gix);
            return -EINVAL;
        }
        ro.gid_index = (int)v;
    }
    ro.gid_subnet = a->cfg.rdma_gid_subnet;
    ro.traffic_class = (int)a->cfg.rdma_traffic_class;
    ro.sl = (int)a->cfg.rdma_sl;
    ro.pkey_index = (int)a->cfg.rdma_pkey_index;
    ro.timeout = (int)a->cfg.rdma_timeout;
    ro.retry_cnt = (int)a->cfg.rdma_retry_cnt;
    ro.rnr_retry = (int)a->cfg.rdma_rnr_retry;
    struct pf_net_config nc = {
        .nics = (const char *const *)a->cfg.nics.v,
        .nnics = a->cfg.nics.n,
        .faults = a->faults,
        .tls_cert_pem = a->cfg.auth.cert_pem,
        .tls_key_pem = a->cfg.auth.key_pem,
        .tls_ca_pem = a->cfg.auth.ca_pem,
        .rdma = &ro,
        .pin_bytes = a->cfg.pool_size,
    };
    int rc = pf_hal_net_open(a->cfg.net_backend, &nc, &a->net, a->net_backend,
                             sizeof(a->net_backend), err, sizeof(err));
    if (rc) {
        pf_error("--net-backend %s / --nics: %s", a->cfg.net_backend, err);
        return rc;
    }
    int nnics = pf_net_nic_count(a->net), ngpus = pf_gpu_device_count(a->gpu);
    pf_info("topology: %d NIC(s) on backend %s", nnics, a->net_backend);
    for (int i = 0; i < nnics; i++) {
        struct pf_net_nic_info ni;
        if (pf_net_nic_info(a->net, i, &ni) != 0)
            continue;
        char near[128] = "";
        size_t off = 0;
        for (int g = 0; g < ngpus && off < sizeof(near) - 8; g++) {
            struct pf_gpu_dev_info gi;
            if (pf_gpu_device_info(a->gpu, g, &gi) == 0 && ni.numa_node >= 0 &&
                gi.numa_node == ni.numa_node)
                off += (size_t)snprintf(near + off, sizeof(near) - off, "%s%d", off ? "," : "",
                                        gi.index);
        }
        pf_info("  NIC %d: %s (%s), NUMA node %d, %s%s%s", i, ni.name, ni.addr, ni.numa_node,
                ni.numa_node < 0 ? "NUMA node unknown: no GPU affinity"
                : off            ? "nearest GPU(s): "
                                 : "no GPU on its NUMA node (cross-NUMA transfers)",
                near, ni.active ? "" : ", link DOWN");
    }
    struct pf_p2p_config pc = {
        .engine = a->svc.engine,
        .net = a->net,
        .backend = a->net_backend,
        .qps_per_peer = (uint32_t)a->cfg.qps_per_peer,
        .lock_timeout_secs = a->cfg.transfer_lock_timeout_secs,
        .integrity = a->cfg.integrity,
        .plan_timeout_ms = a->cfg.p2p_plan_timeout_ms,
    };
    rc = pf_p2p_create(&pc, &a->p2p, err, sizeof(err));
    if (rc) {
        pf_error("%s", err);
        return rc;
    }
    a->svc.p2p = a->p2p;
    return 0;
}

/* The address this node advertises: --addr with the port actually bound (--addr HOST:0). */
static void set_advertise(struct server_app *a)
{
    char host[256];
    uint16_t port;
    if (pf_addr_split(a->cfg.addr, host, sizeof(host), &port) != 0 || a->grpc_port <= 0) {
        snprintf(a->advertise, sizeof(a->advertise), "%s", a->cfg.addr);
        return;
    }
    snprintf(a->advertise, sizeof(a->advertise), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
             a->grpc_port);
}

static const char *const cleanup_params[] = {"id", NULL};
static const struct pf_http_route routes_prom[] = {
    {"GET", "/health", pf_http_engine_health, NULL},
    {"GET", "/metrics", pf_http_metrics, NULL},
    {"GET", "/instances", pf_http_instances, NULL},
    {"POST", "/instances/cleanup", pf_http_instances_cleanup, cleanup_params},
    {"POST", "/cache/memory/cleanup", pf_http_memory_cleanup, NULL},
};
static const struct pf_http_route routes_noprom[] = {
    {"GET", "/health", pf_http_engine_health, NULL},
    {"GET", "/instances", pf_http_instances, NULL},
    {"POST", "/instances/cleanup", pf_http_instances_cleanup, cleanup_params},
    {"POST", "/cache/memory/cleanup", pf_http_memory_cleanup, NULL},
};

static int start_engine(struct server_app *a)
{
    char err[512];
    struct pf_engine_config ec = {
        .gpu = a->gpu,
        .pool_size = a->cfg.pool_size,
        .hint_value_size = a->cfg.hint_value_size,
        .use_hugepages = a->cfg.use_hugepages,
        .numa_affinity = !a->cfg.disable_numa_affinity,
        .pool_shards = (uint32_t)a->cfg.pool_shards,
        .lfu_admission = a->cfg.enable_lfu_admission,
        .blockwise_alloc = a->cfg.blockwise_alloc,
        .load_chunk_bytes = a->cfg.load_cancel_chunk,
        .integrity = a->cfg.integrity,
        .pad_512 = a->cfg.ssd_cache_path.n > 0,
        .version = PF_VERSION,
        .hll_windows = a->cfg.metric_hll_windows,
        .hll_bits = (unsigned)a->cfg.metric_hll_bucket_bits,
        .faults = a->faults,
    };
    int rc = pf_engine_create(&ec, &a->svc.engine, err, sizeof(err));
    if (rc) {
        pf_error("%s", err);
        return rc;
    }
    if (a->cfg.tenancy) {
        pf_tenancy_attach(a->cfg.tenancy, a->svc.engine);
        a->svc.tenancy = a->cfg.tenancy;
    }
    return 0;
}

/* SSD tier (--ssd-cache-path): the uring BLK backend (wrapped by faulty: when the fault
 * plan names blk.*) and the store, opened before the pool is pre-touched so a bad path
 * fails fast; attached to the engine (tier + sealed hook) once the engine exists. */
static int start_ssd(struct server_app *a)
{
    if (a->cfg.ssd_cache_path.n == 0)
        return 0;
    char err[512], chosen[64];
    struct pf_blk_config bc = {.faults = a->faults};
    int rc = pf_hal_blk_open("uring", &bc, &a->blk, chosen, sizeof(chosen), err, sizeof(err));
    if (rc) {
        pf_error("--ssd-cache-path: %s", err);
        return rc;
    }
    struct pf_ssd_config sc = {
        .paths = (const char *const *)a->cfg.ssd_cache_path.v,
        .npaths = a->cfg.ssd_cache_path.n,
        .capacity = a->cfg.ssd_cache_capacity,
        .shards_per_path = (uint32_t)a->cfg.ssd_cache_shards,
        .write_queue_depth = (uint32_t)a->cfg.ssd_write_queue_depth,
        .prefetch_queue_depth = (uint32_t)a->cfg.ssd_prefetch_queue_depth,
        .write_inflight = (uint32_t)a->cfg.ssd_write_inflight,
        .write_merge = (uint32_t)a->cfg.ssd_write_merge,
        .prefetch_inflight = (uint32_t)a->cfg.ssd_prefetch_inflight,
        .read_merge = (uint32_t)a->cfg.ssd_read_merge,
        .max_prefetch_blocks = (uint32_t)a->cfg.max_prefetch_blocks,
        .integrity = a->cfg.integrity,
        .recover = a->cfg.ssd_recover,
        .reformat = a->cfg.ssd_reformat,
        .prefetch_staging_bytes = a->cfg.ssd_prefetch_staging,
        .blk = a->blk,
    };
    rc = pf_ssd_create(&sc, &a->ssd, err, sizeof(err));
    if (rc)
        pf_error("%s", err);
    return rc;
}

static int start_services(struct server_app *a)
{
    char err[256];
    int port = 0;
    int rc = pf_http_server_start_auth(
        a->cfg.http_addr, a->cfg.enable_prometheus ? routes_prom : routes_noprom,
        a->cfg.enable_prometheus ? PF_ARRAY_SIZE(routes_prom) : PF_ARRAY_SIZE(routes_noprom),
        &a->svc.engine, a->cfg.auth.admin_token, &a->http, &port, err, sizeof(err));
    if (rc) {
        pf_error("--http-addr: %s", err);
        return rc;
    }
    pf_info("HTTP listening on %s (port %d)", a->cfg.http_addr, port);
    /* protected by default: without an admin token the POST endpoints refuse remote callers
     * (403), so nothing is open to warn about */
    if (!a->cfg.auth.admin_token)
        pf_info("HTTP POST /instances/cleanup, /cache/memory/cleanup: callers on this host only "
                "(--admin-token-file serves remote callers with a bearer token)");
    a->svc.request_shutdown = request_shutdown;
    a->svc.app = a;
    struct pf_rpc_server_config rc_cfg = {
        .addr = a->cfg.addr,
        .threads = (int)a->cfg.rpc_threads,
        .methods = pf_engine_methods,
        .nmethods = pf_engine_nmethods,
        .ctx = &a->svc,
        .metric_prefix = "pegaflow",
        .auth = &a->cfg.auth,
        .rules = pf_engine_access,
        .nrules = pf_engine_naccess,
        .local_only = a->cfg.local_only,
        .local_addr = a->cfg.local_addr,
        .local_gid_set = a->cfg.local_gid_set,
        .local_gid = a->cfg.local_gid,
    };
    rc = pf_rpc_server_start(&rc_cfg, &a->rpc, &port, err, sizeof(err));
    if (rc) {
        pf_error("--addr: %s", err);
        return rc;
    }
    const struct pf_auth *au = &a->cfg.auth;
    pf_info("gRPC listening on %s (port %d), %llu RPC threads%s", a->cfg.addr, port,
            (unsigned long long)a->cfg.rpc_threads,
            au->ca_pem     ? ", mutual TLS"
            : au->cert_pem ? ", TLS"
                           : "");
    if (a->cfg.local_addr)
        pf_info("gRPC local listener on %s (mode 0660%s%s)", a->cfg.local_addr,
                a->cfg.local_addr_group ? ", group " : "",
                a->cfg.local_addr_group ? a->cfg.local_addr_group : "");
    pf_info("security: cluster token %s, admin token %s, worker RPCs from %s",
            au->cluster_token ? "required" : "off", au->admin_token ? "required" : "off",
            a->cfg.local_only ? "this host (or the cluster token)" : "anyone");
    pf_app_warn_open("gRPC", a->cfg.addr, au->ca_pem || au->cluster_token,
                     "set --cluster-token-file and/or --tls-cert/--tls-key/--tls-ca");
    if (!a->cfg.local_only)
        pf_app_warn_local_rpcs_any(a->cfg.addr, au);
    if (a->cfg.metaserver_addr && !pf_app_cluster_authenticated(au))
        pf_app_warn_insecure("this node"); /* --insecure-cluster (the parse refused otherwise) */
    a->grpc_port = port;
    return 0;
}

static int wait_for_stop(struct server_app *a)
{
    struct pollfd p[2] = {{.fd = a->sfd, .events = POLLIN}, {.fd = a->efd, .events = POLLIN}};
    bool insecure = a->cfg.metaserver_addr && !pf_app_cluster_authenticated(&a->cfg.auth);
    int period_ms = (int)pf_app_insecure_warn_secs(a->cfg.enable_debug) * 1000;
    for (;;) {
        int n = poll(p, 2, insecure ? period_ms : -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0) { /* the hourly reminder of --insecure-cluster */
            pf_app_warn_insecure("this node");
            continue;
        }
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            if (read(a->sfd, &si, sizeof(si)) != sizeof(si))
                continue;
            if (si.ssi_signo == SIGHUP) { /* only in the set with --tenants-file */
                char err[512];
                (void)pf_tenancy_reload(a->cfg.tenancy, err, sizeof(err));
                continue;
            }
            pf_info("received %s, shutting down", strsignal((int)si.ssi_signo));
            return 0;
        }
        if (p[1].revents & POLLIN) {
            pf_info("shutting down (Shutdown RPC)");
            return 0;
        }
    }
}

int pf_app_malloc_settings(const char *tunables)
{
    if (tunables &&
        (strstr(tunables, "malloc.mmap_threshold") || strstr(tunables, "malloc.trim_threshold"))) {
        pf_info("malloc thresholds from GLIBC_TUNABLES (%s)", tunables);
        return 1;
    }
    if (!mallopt(M_MMAP_THRESHOLD, PF_APP_MALLOC_MMAP_MIN) ||
        !mallopt(M_TRIM_THRESHOLD, PF_APP_MALLOC_TRIM)) {
        pf_warn("mallopt failed: glibc's default malloc thresholds stay");
        return -EINVAL;
    }
    return 0;
}

int pf_server_main(int argc, char **argv)
{
    static struct server_app app;
    struct server_app *a = &app;
    char err[512];
    a->efd = a->sfd = -1;
    int rc = pf_server_config_parse(&a->cfg, argc, argv, err, sizeof(err));
    if (rc == 1) {
        pf_flags_usage_grouped(stdout, "pegaflow-server",
                               "PegaFlow KV-cache server: saves vLLM KV blocks to pinned host "
                               "memory, loads them back,\nspills to SSD and shares them across "
                               "nodes.",
                               pf_server_flags, pf_server_nflags, pf_server_flag_groups,
                               pf_server_nflag_groups);
        pf_server_config_free(&a->cfg);
        return 0;
    }
    if (rc == 2) {
        printf("%s\n", PF_VERSION);
        pf_server_config_free(&a->cfg);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "pegaflow-server: %s\n", err);
        pf_server_config_free(&a->cfg);
        return 2;
    }
    pf_log_set_level(a->cfg.log_level);
    pf_info("pegaflow-server %s starting (pid %d)", PF_VERSION, (int)getpid());
    pf_app_malloc_settings(getenv("GLIBC_TUNABLES"));

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (a->cfg.tenancy)
        sigaddset(&set, SIGHUP); /* reloads --tenants-file */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    a->sfd = signalfd(-1, &set, SFD_CLOEXEC);
    a->efd = eventfd(0, EFD_CLOEXEC);
    int exit_code = 1;
    if (a->sfd < 0 || a->efd < 0) {
        pf_error("cannot create signal/event fds: %s", strerror(errno));
        goto out;
    }
    if (pf_app_auth_channels(&a->cfg.auth) != 0) {
        pf_error("cannot set up the channel credentials: out of memory");
        goto out;
    }
    if (open_hal(a) != 0)
        goto out;
    if (start_ssd(a) != 0)
        goto out;
    if (start_engine(a) != 0)
        goto out;
    /* tiers are tried in registration order: peers first, then the SSD (as the reference) */
    if (a->cfg.nics.n && start_p2p(a) != 0)
        goto out;
    if (a->ssd && pf_ssd_attach(a->ssd, a->svc.engine) != 0)
        goto out;
    if (a->ssd && a->cfg.tenancy)
        pf_tenancy_attach_ssd(a->cfg.tenancy, a->ssd);
    if (a->cfg.metaserver_addr && pf_server_meta_hooks(a->svc.engine) != 0) {
        pf_error("--metaserver-addr: cannot hook the MetaServer client into the engine");
        goto out;
    }
    if (a->cfg.metaserver_addr && a->ssd)
        pf_server_meta_set_ssd(a->ssd); /* recovered SSD blocks are registered too */
    if (a->cfg.metrics_otel_endpoint) {
        char err2[256];
        if (pf_otlp_start(a->cfg.metrics_otel_endpoint, (enum pf_otlp_protocol)a->cfg.otlp_protocol,
                          a->cfg.metrics_period_secs, "pegaflow-server", &a->otlp, err2,
                          sizeof(err2)) != 0) {
            pf_error("%s", err2);
            goto out;
        }
    }
    if (start_services(a) != 0)
        goto out;
    set_advertise(a);
    /* after the bind, so that --addr HOST:0 advertises the real port (the hooks were
     * registered before serving; blocks sealed before the client exists are registered by
     * its first resync) */
    if (a->cfg.metaserver_addr) {
        int mrc = pf_server_meta_start(a->svc.engine, a->cfg.metaserver_target, a->advertise,
                                       a->cfg.metaserver_queue_depth, &a->meta);
        if (mrc) {
            pf_error("--metaserver-addr: cannot start the MetaServer client: %s", strerror(-mrc));
            goto out;
        }
    }
    if (a->p2p)
        pf_p2p_enable_fetch(a->p2p, a->meta, a->advertise);
    pf_info("ready");
    if (wait_for_stop(a) == 0)
        exit_code = 0;
out:
    a->svc.stopping = true;
    pf_rpc_server_stop(a->rpc);
    a->svc.tenancy = NULL;
    pf_tenancy_destroy(a->cfg.tenancy); /* before the engine: it holds the quota hook */
    a->cfg.tenancy = NULL;
    pf_http_server_stop(a->http);
    pf_otlp_stop(a->otlp);
    /* stop the clients before the engine (their threads call into it); the engine's hooks
     * and tiers may still call them afterwards: detached or stopped, they refuse */
    pf_p2p_stop(a->p2p); /* connections dropped, locks released, pool deregistered */
    if (a->meta)
        pf_server_meta_detach();
    /* UnregisterNode, bounded by 3 s; the memory stays until the engine's threads are gone:
     * a hook that loaded the client just before the detach may still call it (and is
     * refused, -ESHUTDOWN) */
    pf_meta_client_stop(a->meta);
    if (a->ssd && exit_code == 0 && a->cfg.ssd_drain_timeout_secs)
        pf_ssd_drain(a->ssd, a->cfg.ssd_drain_timeout_secs * 1000); /* bounded, logged */
    pf_ssd_stop(a->ssd); /* releases its blocks; the engine may still call the tier */
    pf_engine_destroy(a->svc.engine);
    pf_p2p_destroy(a->p2p); /* after the prefetch threads (inside the tier until then) */
    pf_meta_client_destroy(a->meta);
    pf_ssd_destroy(a->ssd);
    pf_blk_close(a->blk);
    pf_net_close(a->net);
    pf_gpu_close(a->gpu);
    if (a->sfd >= 0)
        close(a->sfd);
    if (a->efd >= 0)
        close(a->efd);
    pf_server_config_free(&a->cfg);
    pf_info("stopped");
    return exit_code;
}

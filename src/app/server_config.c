/* pegaflow-server flags: every flag of seeds/server.md with its documented default, the
 * reference's extra flags, and ours (backends, fault injection, RPC threads). Cross-flag
 * rules (P2P flags together, routable --addr, fault injection needs --enable-debug) are
 * checked after parsing. */
#include <errno.h>
#include <grp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "pf/fault.h"
#include "pf/hal_gpu.h"
#include "pf/metrics.h"

#define F(n_, t_, field_, def_, meta_, help_, ...)                                                 \
    {                                                                                              \
        .name = n_, .type = t_, .off = offsetof(struct pf_server_config, field_), .defval = def_,  \
        .metavar = meta_, .help = help_, __VA_ARGS__                                               \
    }

const struct pf_flag pf_server_flags[] = {
    F("addr", PF_FLAG_ADDR, addr, "127.0.0.1:50055", "HOST:PORT",
      "gRPC bind address; also the address peers use for P2P"),
    F("devices", PF_FLAG_STRLIST, devices, NULL, "IDS",
      "GPU device IDs to initialize, comma-separated (default: all detected; with the sim "
      "backend: --sim-gpus devices)",
      .flags = PF_FLAGF_MULTI),
    F("pool-size", PF_FLAG_SIZE, pool_size, "30gb", "SIZE",
      "Pinned memory pool size (kb, mb, gb, tb)", .min = 1),
    F("hint-value-size", PF_FLAG_SIZE, hint_value_size, NULL, "SIZE",
      "Typical value size, tunes the allocator unit and TinyLFU sizing (optional)", .min = 1),
    F("use-hugepages", PF_FLAG_BOOL, use_hugepages, "false", NULL,
      "Use huge pages for pinned memory (requires /proc/sys/vm/nr_hugepages)"),
    F("enable-lfu-admission", PF_FLAG_BOOL, enable_lfu_admission, "false", NULL,
      "Enable TinyLFU cache admission (off: every block is admitted)"),
    F("disable-numa-affinity", PF_FLAG_BOOL, disable_numa_affinity, "false", NULL,
      "Disable NUMA-aware memory allocation"),
    F("blockwise-alloc", PF_FLAG_BOOL, blockwise_alloc, "false", NULL,
      "Allocate each block separately instead of one contiguous allocation per save"),
    F("log-level", PF_FLAG_LOGLEVEL, log_level, "info", "LEVEL",
      "Log level: trace, debug, info, warn, error"),
    F("http-addr", PF_FLAG_ADDR, http_addr, "0.0.0.0:9091", "HOST:PORT",
      "HTTP address for /health, /metrics and the admin endpoints (always enabled)"),
    F("enable-prometheus", PF_FLAG_BOOL, enable_prometheus, "true", NULL,
      "Serve Prometheus metrics on GET /metrics (--enable-prometheus=false disables)"),
    F("metrics-otel-endpoint", PF_FLAG_STR, metrics_otel_endpoint, NULL, "URL",
      "OTLP metrics export endpoint, e.g. http://collector:4317 (grpc) or "
      "http://collector:4318 (http/*) (optional)"),
    F("metrics-otel-protocol", PF_FLAG_STR, metrics_otel_protocol, "grpc", "PROTOCOL",
      "OTLP protocol: grpc, http/protobuf or http/json (unset: OTEL_EXPORTER_OTLP_PROTOCOL, "
      "else grpc)"),
    F("metrics-period-secs", PF_FLAG_U64, metrics_period_secs, "10", "SECS",
      "OTLP export period in seconds", .min = 1, .max = 86400),
    F("ssd-cache-path", PF_FLAG_STRLIST, ssd_cache_path, NULL, "PATH",
      "Enable the SSD cache: a file, or (several paths or shards) directories of "
      "shard-NNNNNN.dat files; repeatable",
      .flags = PF_FLAGF_MULTI),
    F("ssd-cache-capacity", PF_FLAG_SIZE, ssd_cache_capacity, "512gb", "SIZE",
      "SSD cache capacity (all shards together)", .min = 1),
    F("ssd-cache-shards", PF_FLAG_U64, ssd_cache_shards, "1", "N", "SSD shards per path", .min = 1,
      .max = 1024),
    F("ssd-write-queue-depth", PF_FLAG_U64, ssd_write_queue_depth, "8", "N",
      "Max pending SSD write batches", .min = 1, .max = 1 << 20),
    F("ssd-prefetch-queue-depth", PF_FLAG_U64, ssd_prefetch_queue_depth, "2", "N",
      "Max pending SSD prefetch batches", .min = 1, .max = 1 << 20),
    F("ssd-write-inflight", PF_FLAG_U64, ssd_write_inflight, "2", "N",
      "Max concurrent SSD write requests (each up to --ssd-write-merge blocks)", .min = 1,
      .max = 4096),
    F("ssd-write-merge", PF_FLAG_U64, ssd_write_merge, "8", "N",
      "Max consecutive SSD records written by one request (1: one block per write)", .min = 1,
      .max = 64),
    F("ssd-prefetch-inflight", PF_FLAG_U64, ssd_prefetch_inflight, "16", "N",
      "Max concurrent SSD read requests (each up to --ssd-read-merge blocks)", .min = 1,
      .max = 4096),
    F("ssd-read-merge", PF_FLAG_U64, ssd_read_merge, "8", "N",
      "Max consecutive SSD records read by one prefetch request (1: one block per read)", .min = 1,
      .max = 64),
    F("ssd-prefetch-staging", PF_FLAG_SIZE, ssd_prefetch_staging, "1gb", "SIZE",
      "Max staging memory of SSD prefetch reads at once (larger prefetches are cut, later "
      "ones wait)",
      .min = 4096),
    F("ssd-recover", PF_FLAG_BOOL, ssd_recover, "on", "on|off",
      "Rebuild the SSD index from the cache files at start-up (off: start them empty)"),
    F("ssd-drain-timeout-secs", PF_FLAG_U64, ssd_drain_timeout_secs, "5", "SECS",
      "On SIGTERM/SIGINT, wait up to this long for queued SSD writes before exit (0: none)",
      .max = 3600),
    F("ssd-reformat", PF_FLAG_BOOL, ssd_reformat, "off", "on|off",
      "Overwrite SSD cache files of another format version or not written by PegaFlow "
      "(off: refuse to start)"),
    F("max-prefetch-blocks", PF_FLAG_U64, max_prefetch_blocks, "800", "N",
      "Max blocks being prefetched from SSD at once (backpressure)", .min = 1, .max = 1u << 30),
    F("nics", PF_FLAG_STRLIST, nics, NULL, "NAMES",
      "NICs for inter-node transfer (e.g. mlx5_0,mlx5_1, or network interfaces with "
      "--net-backend tcp); requires --metaserver-addr",
      .flags = PF_FLAGF_MULTI),
    F("metaserver-addr", PF_FLAG_STR, metaserver_addr, NULL, "URL[,URL...]",
      "MetaServer address (e.g. http://10.0.0.100:50056), or several replicas sharing one "
      "Redis store, comma-separated (sticky failover); requires --nics and a routable --addr"),
    F("transfer-lock-timeout-secs", PF_FLAG_U64, transfer_lock_timeout_secs, "120", "SECS",
      "Max time blocks stay locked for a cross-node transfer", .min = 1, .max = 86400),
    F("metaserver-queue-depth", PF_FLAG_U64, metaserver_queue_depth, "4096", "N",
      "Max pending MetaServer registration commands", .min = 1, .max = 1u << 24),
    F("p2p-plan-timeout-ms", PF_FLAG_U64, p2p_plan_timeout_ms, "50", "MS",
      "Deadline of the query-time MetaServer lookup that plans a request across tiers; slower "
      "or down: local tiers only (docs/p2p.md)",
      .min = 1, .max = 10000),
    F("rdma-gid-index", PF_FLAG_STR, rdma_gid_index, "auto", "auto|N",
      "RDMA GID table index on every NIC (auto: an IPv4-mapped RoCE v2 GID on an up device "
      "first, docs/net.md)"),
    F("rdma-gid-subnet", PF_FLAG_STR, rdma_gid_subnet, NULL, "CIDR",
      "Only GIDs inside this IPv4 or IPv6 subnet, e.g. 10.0.0.0/16 (optional)"),
    F("rdma-traffic-class", PF_FLAG_U64, rdma_traffic_class, "106", "TC",
      "RoCE traffic class (DSCP << 2 | ECN); 106 = DSCP 26, the usual lossless class", .min = 0,
      .max = 255),
    F("rdma-sl", PF_FLAG_U64, rdma_sl, "0", "SL", "Service level (InfiniBand SL, RoCE priority)",
      .min = 0, .max = 15),
    F("rdma-pkey-index", PF_FLAG_U64, rdma_pkey_index, "0", "N", "P_Key table index", .min = 0,
      .max = 65535),
    F("rdma-timeout", PF_FLAG_U64, rdma_timeout, "18", "T",
      "QP local ACK timeout, 4.096 us * 2^T per try (18 = 1.07 s)", .min = 1, .max = 31),
    F("rdma-retry-cnt", PF_FLAG_U64, rdma_retry_cnt, "7", "N", "QP transport retries", .min = 0,
      .max = 7),
    F("rdma-rnr-retry", PF_FLAG_U64, rdma_rnr_retry, "7", "N", "QP RNR retries (7 = forever)",
      .min = 0, .max = 7),
    F("qps-per-peer", PF_FLAG_U64, qps_per_peer, "2", "N",
      "Queue pairs per NIC per peer (must match peers)", .min = 1, .max = 64),
    F("pool-shards", PF_FLAG_U64, pool_shards, "1", "N", "Independent sub-pools per pool", .min = 1,
      .max = 64),
    F("metric-hll-windows", PF_FLAG_STR, metric_hll_windows, "15m,1h,1d", "LIST",
      "Reuse-estimator windows (s/m/h/d units, >= 1m)"),
    F("metric-hll-bucket-bits", PF_FLAG_U64, metric_hll_bucket_bits, "16", "BITS",
      "HyperLogLog registers = 2^BITS", .min = 4, .max = 18),
    F("trace-sample-rate", PF_FLAG_DOUBLE, trace_sample_rate, "1.0", "RATE",
      "Trace sampling rate (accepted for compatibility; tracing is not built)", .dmin = 0,
      .dmax = 1),
    F("gpu-backend", PF_FLAG_STR, gpu_backend, "auto", "NAME",
      "GPU backend: auto, cuda or sim (auto = cuda when a GPU is present)"),
    F("load-cancel-chunk", PF_FLAG_SIZE, load_cancel_chunk, "128mb", "SIZE",
      "Bytes a cancellable Load submits between two looks at its cancel flag (at least 64 "
      "copies): larger copies faster, smaller stops a cancelled Load sooner",
      .min = 1),
    F("gpu-copy-batch", PF_FLAG_STR, gpu_copy_batch, "auto", "MODE",
      "cuda: direct copies of scattered ranges as one cuMemcpyBatchAsync (auto = where the "
      "driver has it, CUDA 12.8+; on = required; off = one copy per range)"),
    F("net-backend", PF_FLAG_STR, net_backend, "auto", "NAME",
      "NIC backend: auto, verbs or tcp (auto = verbs when an RDMA device is present)"),
    F("rpc-threads", PF_FLAG_U64, rpc_threads, "8", "N", "gRPC handler threads", .min = 1,
      .max = 256),
    F("fault-spec", PF_FLAG_STR, fault_spec, NULL, "SPEC",
      "Fault injection plan (also PEGAFLOW_FAULTS); requires --enable-debug"),
    F("enable-debug", PF_FLAG_BOOL, enable_debug, "false", NULL,
      "Allow debugging aids such as fault injection (never in production)"),
    F("sim-gpu-bandwidth", PF_FLAG_SIZE, sim_gpu_bandwidth, "0", "BYTES_PER_SEC",
      "Sim GPU copy bandwidth per device, to model PCIe (0 = unlimited)"),
    F("sim-gpus", PF_FLAG_U64, sim_gpus, "8", "N", "Number of sim GPUs when --devices is not given",
      .min = 1, .max = 64),
    F("integrity", PF_FLAG_BOOL, integrity, "on", "on|off",
      "Checksum every sealed block and verify after SSD reads and remote fetches"),
    F("tls-cert", PF_FLAG_STR, tls_cert, NULL, "FILE",
      "PEM certificate: TLS on the gRPC listener (also this node's client certificate)"),
    F("tls-key", PF_FLAG_STR, tls_key, NULL, "FILE", "PEM private key of --tls-cert"),
    F("tls-ca", PF_FLAG_STR, tls_ca, NULL, "FILE",
      "PEM CA: verify servers and require client certificates it signed (mutual TLS)"),
    F("cluster-token-file", PF_FLAG_STR, cluster_token_file, NULL, "FILE",
      "Shared secret that peer and MetaServer RPCs carry (pf-cluster-token metadata)"),
    F("admin-token-file", PF_FLAG_STR, admin_token_file, NULL, "FILE",
      "Secret the HTTP POST endpoints require as 'Authorization: Bearer TOKEN'"),
    F("local-addr", PF_FLAG_STR, local_addr, NULL, "unix:PATH",
      "Second gRPC listener on a Unix socket for local vLLM workers (plaintext)"),
    F("local-rpcs", PF_FLAG_STR, local_rpcs, "auto", "auto|host|any",
      "Who may call the worker RPCs (Save, Load, Shutdown, ...): host = this host or the "
      "cluster token; any = every caller (warned); auto = host"),
    F("insecure-cluster", PF_FLAG_BOOL, insecure_cluster, "false", NULL,
      "Allow P2P (--metaserver-addr) without a cluster token or mutual TLS (warned at start "
      "and hourly; never on a shared network)"),
    F("local-addr-group", PF_FLAG_STR, local_addr_group, NULL, "GROUP",
      "Group (name or GID) that owns the --local-addr socket; the socket is mode 0660, so "
      "workers of this group may connect"),
    F("tenants-file", PF_FLAG_STR, tenants_file, NULL, "FILE",
      "Tenants: token -> tenant, allowed namespaces, RAM quota (reloaded on SIGHUP; "
      "docs/security.md \"Tenants\")"),
};
const size_t pf_server_nflags = PF_ARRAY_SIZE(pf_server_flags);

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})
const struct pf_flag_group pf_server_flag_groups[] = {
    {"Server",
     NAMES("addr", "devices", "pool-size", "hint-value-size", "use-hugepages",
           "enable-lfu-admission", "disable-numa-affinity", "blockwise-alloc", "log-level")},
    {"HTTP & Metrics", NAMES("http-addr", "enable-prometheus", "metrics-otel-endpoint",
                             "metrics-otel-protocol", "metrics-period-secs", "metric-hll-windows",
                             "metric-hll-bucket-bits", "trace-sample-rate")},
    {"SSD Cache",
     NAMES("ssd-cache-path", "ssd-cache-capacity", "ssd-cache-shards", "ssd-write-queue-depth",
           "ssd-prefetch-queue-depth", "ssd-write-inflight", "ssd-write-merge",
           "ssd-prefetch-inflight", "ssd-read-merge", "ssd-prefetch-staging", "ssd-recover",
           "ssd-reformat", "ssd-drain-timeout-secs", "max-prefetch-blocks")},
    {"Cross-Node (Multi-Node Setup; --nics and --metaserver-addr together)",
     NAMES("nics", "metaserver-addr", "transfer-lock-timeout-secs", "metaserver-queue-depth",
           "p2p-plan-timeout-ms", "qps-per-peer", "rdma-gid-index", "rdma-gid-subnet",
           "rdma-traffic-class", "rdma-sl", "rdma-pkey-index", "rdma-timeout", "rdma-retry-cnt",
           "rdma-rnr-retry")},
    {"Engine and backends", NAMES("pool-shards", "integrity", "gpu-backend", "gpu-copy-batch",
                                  "load-cancel-chunk", "net-backend", "rpc-threads")},
    {"Security (docs/security.md)",
     NAMES("tls-cert", "tls-key", "tls-ca", "cluster-token-file", "admin-token-file", "local-addr",
           "local-rpcs", "insecure-cluster", "local-addr-group")},
    {"Tenants (docs/security.md)", NAMES("tenants-file")},
    {"Testing and debugging", NAMES("enable-debug", "fault-spec", "sim-gpus", "sim-gpu-bandwidth")},
};
const size_t pf_server_nflag_groups = PF_ARRAY_SIZE(pf_server_flag_groups);
#undef NAMES

/* the one-line P2P start that works, printed with every refusal of the P2P flags */
#define P2P_EXAMPLE                                                                                \
    "pegaflow-server --addr 10.0.0.1:50055 --nics mlx5_0 --metaserver-addr "                       \
    "http://10.0.0.100:50056 --cluster-token-file /etc/pegaflow/cluster-token"

static int parse_devices(struct pf_server_config *cfg, char *err, size_t errlen)
{
    if (cfg->devices.n == 0)
        return 0;
    cfg->device_ids = calloc(cfg->devices.n, sizeof(int));
    if (!cfg->device_ids)
        return -ENOMEM;
    for (size_t i = 0; i < cfg->devices.n; i++) {
        uint64_t v;
        if (pf_parse_u64(cfg->devices.v[i], &v) != 0 || v > 1023) {
            snprintf(err, errlen, "--devices: '%s' is not a device ID (0..1023)",
                     cfg->devices.v[i]);
            return -EINVAL;
        }
        for (size_t j = 0; j < i; j++)
            if (cfg->device_ids[j] == (int)v) {
                snprintf(err, errlen, "--devices: device %llu listed twice", (unsigned long long)v);
                return -EINVAL;
            }
        cfg->device_ids[i] = (int)v;
    }
    cfg->ndevice_ids = cfg->devices.n;
    return 0;
}

/* "15m,1h,1d": units s/m/h/d, each >= 1 minute, no duplicates. */
static int check_hll_windows(const char *s, char *err, size_t errlen)
{
    uint64_t seen[16];
    size_t n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9') { /* strtoull would accept "-1m" as a huge number */
            snprintf(err, errlen, "--metric-hll-windows: '%s' is not a list like 15m,1h,1d", s);
            return -EINVAL;
        }
        unsigned long long v = strtoull(p, &end, 10);
        uint64_t mult;
        switch (*end) {
        case 's':
            mult = 1;
            break;
        case 'm':
            mult = 60;
            break;
        case 'h':
            mult = 3600;
            break;
        case 'd':
            mult = 86400;
            break;
        default:
            snprintf(err, errlen, "--metric-hll-windows: '%s' is not a list like 15m,1h,1d", s);
            return -EINVAL;
        }
        if (end == p || v > UINT64_MAX / 86400 || v * mult < 60 || n == PF_ARRAY_SIZE(seen)) {
            snprintf(err, errlen, "--metric-hll-windows: each window must be at least 1m (%s)", s);
            return -EINVAL;
        }
        for (size_t i = 0; i < n; i++)
            if (seen[i] == v * mult) {
                snprintf(err, errlen, "--metric-hll-windows: duplicate window in %s", s);
                return -EINVAL;
            }
        seen[n++] = v * mult;
        p = end + 1;
        if (*p == ',')
            p++;
        else if (*p) {
            snprintf(err, errlen, "--metric-hll-windows: '%s' is not a list like 15m,1h,1d", s);
            return -EINVAL;
        }
    }
    if (n == 0) {
        snprintf(err, errlen, "--metric-hll-windows: empty");
        return -EINVAL;
    }
    return 0;
}

/* --metrics-otel-protocol, else OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, else
 * OTEL_EXPORTER_OTLP_PROTOCOL (the OpenTelemetry SDK variables), else grpc */
static int resolve_otlp_protocol(struct pf_server_config *cfg, char *err, size_t errlen)
{
    const char *what = "--metrics-otel-protocol";
    /* the variables only matter when exporting: an unrelated value never stops the server */
    if (cfg->metrics_otel_endpoint &&
        !pf_flags_given(pf_server_flags, pf_server_nflags, "metrics-otel-protocol")) {
        static const char *const envs[] = {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
                                           "OTEL_EXPORTER_OTLP_PROTOCOL"};
        for (size_t i = 0; i < PF_ARRAY_SIZE(envs); i++) {
            const char *v = getenv(envs[i]);
            if (v && *v) {
                char *dup = strdup(v);
                if (!dup)
                    return -ENOMEM;
                free(cfg->metrics_otel_protocol);
                cfg->metrics_otel_protocol = dup;
                what = envs[i];
                break;
            }
        }
    }
    enum pf_otlp_protocol p;
    if (pf_otlp_protocol_parse(cfg->metrics_otel_protocol, &p) != 0) {
        snprintf(err, errlen,
                 "%s: unknown OTLP protocol '%s'; use grpc (collectors on :4317), http/protobuf "
                 "or http/json (on :4318)",
                 what, cfg->metrics_otel_protocol);
        return -EINVAL;
    }
    if (p == PF_OTLP_GRPC && cfg->metrics_otel_endpoint &&
        strncmp(cfg->metrics_otel_endpoint, "https://", 8) == 0) {
        snprintf(err, errlen,
                 "--metrics-otel-endpoint %s: TLS is not supported with OTLP/gRPC (%s grpc); use "
                 "a plain http://host:4317 collector, or add --metrics-otel-protocol "
                 "http/protobuf for an https:// endpoint",
                 cfg->metrics_otel_endpoint, what);
        return -EINVAL;
    }
    cfg->otlp_protocol = (int)p;
    return 0;
}

static bool known_backend(const char *v, const char *const *names)
{
    const char *b = strncmp(v, "faulty:", 7) == 0 ? v + 7 : v;
    for (; *names; names++)
        if (strcmp(b, *names) == 0)
            return true;
    return false;
}

/* --metaserver-addr URL[,URL...] (MetaServer replicas) -> metaserver_target
 * "host:port[,host:port...]". */
static int server_meta_targets(struct pf_server_config *cfg, char *err, size_t errlen)
{
    size_t used = 0;
    cfg->metaserver_target[0] = 0;
    for (const char *p = cfg->metaserver_addr;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char url[256], t[256], e2[160];
        if (len == 0 || len >= sizeof(url)) {
            snprintf(err, errlen, "--metaserver-addr: empty or overlong entry in '%.200s'",
                     cfg->metaserver_addr);
            return -EINVAL;
        }
        memcpy(url, p, len);
        url[len] = 0;
        if (pf_url_to_target(url, t, sizeof(t)) != 0) {
            snprintf(err, errlen,
                     "--metaserver-addr: '%s' is not a MetaServer address like "
                     "http://10.0.0.100:50056",
                     url);
            return -EINVAL;
        }
        if (pf_addr_check(t, e2, sizeof(e2)) != 0) {
            snprintf(err, errlen, "--metaserver-addr: %s", e2);
            return -EINVAL;
        }
        size_t tl = strlen(t);
        if (used + tl + 2 > sizeof(cfg->metaserver_target)) {
            snprintf(err, errlen, "--metaserver-addr: too many replicas (at most %zu bytes)",
                     sizeof(cfg->metaserver_target) - 1);
            return -EINVAL;
        }
        if (used)
            cfg->metaserver_target[used++] = ',';
        memcpy(cfg->metaserver_target + used, t, tl + 1);
        used += tl;
        if (!e)
            return 0;
        p = e + 1;
    }
}

int pf_server_config_parse(struct pf_server_config *cfg, int argc, char **argv, char *err,
                           size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    int rc = pf_flags_parse(pf_server_flags, pf_server_nflags, cfg, argc, argv, err, errlen);
    if (rc)
        return rc;
    rc = parse_devices(cfg, err, errlen);
    if (rc)
        return rc;
    static const char *const gpu_names[] = {"auto", "cuda", "sim", NULL};
    static const char *const net_names[] = {"auto", "verbs", "tcp", NULL};
    if (!known_backend(cfg->gpu_backend, gpu_names)) {
        snprintf(err, errlen, "--gpu-backend: unknown backend '%s' (auto, cuda, sim)",
                 cfg->gpu_backend);
        return -EINVAL;
    }
    static const char *const batch_names[] = {"auto", "on", "off", NULL};
    if (!known_backend(cfg->gpu_copy_batch, batch_names)) {
        snprintf(err, errlen, "--gpu-copy-batch: unknown mode '%s' (auto, on, off)",
                 cfg->gpu_copy_batch);
        return -EINVAL;
    }
    cfg->gpu_copy_batch_mode = strcmp(cfg->gpu_copy_batch, "on") == 0    ? PF_GPU_COPY_BATCH_ON
                               : strcmp(cfg->gpu_copy_batch, "off") == 0 ? PF_GPU_COPY_BATCH_OFF
                                                                         : PF_GPU_COPY_BATCH_AUTO;
    if (!known_backend(cfg->net_backend, net_names)) {
        snprintf(err, errlen, "--net-backend: unknown backend '%s' (auto, verbs, tcp)",
                 cfg->net_backend);
        return -EINVAL;
    }
    bool has_nics = cfg->nics.n > 0, has_meta = cfg->metaserver_addr != NULL;
    if (has_nics != has_meta) {
        snprintf(err, errlen,
                 "%s without %s: P2P needs --nics and --metaserver-addr together, with a routable "
                 "--addr; e.g. " P2P_EXAMPLE,
                 has_nics ? "--nics" : "--metaserver-addr",
                 has_nics ? "--metaserver-addr" : "--nics");
        return -EINVAL;
    }
    if (has_meta) {
        rc = server_meta_targets(cfg, err, errlen);
        if (rc)
            return rc;
        if (pf_addr_is_unroutable(cfg->addr)) {
            snprintf(err, errlen,
                     "--addr: %s is not routable; with --nics and --metaserver-addr other nodes "
                     "connect to it (use this host's IP, not 0.0.0.0 or 127.0.0.1); "
                     "e.g. " P2P_EXAMPLE,
                     cfg->addr);
            return -EINVAL;
        }
    }
    if (cfg->metrics_otel_endpoint) {
        char t[256];
        if (pf_url_to_target(cfg->metrics_otel_endpoint, t, sizeof(t)) != 0 &&
            strncmp(cfg->metrics_otel_endpoint, "http://", 7) != 0 &&
            strncmp(cfg->metrics_otel_endpoint, "https://", 8) != 0) {
            snprintf(err, errlen,
                     "--metrics-otel-endpoint: '%s' is not an http://host:port URL (or "
                     "https:// with an http/* --metrics-otel-protocol)",
                     cfg->metrics_otel_endpoint);
            return -EINVAL;
        }
    }
    rc = resolve_otlp_protocol(cfg, err, errlen);
    if (rc)
        return rc;
    rc = check_hll_windows(cfg->metric_hll_windows, err, errlen);
    if (rc)
        return rc;
    if (cfg->local_addr && (strncmp(cfg->local_addr, "unix:", 5) != 0 || !cfg->local_addr[5])) {
        snprintf(err, errlen, "--local-addr: '%s' is not unix:PATH", cfg->local_addr);
        return -EINVAL;
    }
    if (cfg->local_addr_group) {
        if (!cfg->local_addr) {
            snprintf(err, errlen, "--local-addr-group: needs --local-addr unix:PATH");
            return -EINVAL;
        }
        uint64_t gid;
        struct group gr, *grp = NULL;
        char buf[4096];
        if (pf_parse_u64(cfg->local_addr_group, &gid) == 0 && gid < 0xffffffffull) {
            cfg->local_gid = (unsigned)gid;
        } else if (getgrnam_r(cfg->local_addr_group, &gr, buf, sizeof(buf), &grp) == 0 && grp) {
            cfg->local_gid = (unsigned)grp->gr_gid;
        } else {
            snprintf(err, errlen, "--local-addr-group: no group '%s' (a name or a GID)",
                     cfg->local_addr_group);
            return -EINVAL;
        }
        cfg->local_gid_set = true;
    }
    struct pf_auth_config ac = {
        .tls_cert = cfg->tls_cert,
        .tls_key = cfg->tls_key,
        .tls_ca = cfg->tls_ca,
        .cluster_token_file = cfg->cluster_token_file,
        .admin_token_file = cfg->admin_token_file,
    };
    rc = pf_auth_load(&ac, &cfg->auth, err, errlen);
    if (rc)
        return -EINVAL;
    if (pf_app_local_rpcs(cfg->local_rpcs, &cfg->auth, &cfg->local_only) != 0) {
        snprintf(err, errlen, "--local-rpcs: '%s' is not auto, host or any", cfg->local_rpcs);
        return -EINVAL;
    }
    /* protected by default (docs/security.md): a P2P node's --addr is routable */
    if (has_meta && !pf_app_cluster_authenticated(&cfg->auth) && !cfg->insecure_cluster) {
        snprintf(err, errlen,
                 "--metaserver-addr: P2P needs a cluster token: write one secret (e.g. head -c 32 "
                 "/dev/urandom | base64 > /etc/pegaflow/cluster-token; chmod 600) and give every "
                 "node and the MetaServer --cluster-token-file /etc/pegaflow/cluster-token (or "
                 "mutual TLS with --tls-ca), or add --insecure-cluster to run unprotected");
        return -EINVAL;
    }
    if (cfg->tenants_file) {
        rc = pf_tenancy_create(cfg->tenants_file, &cfg->tenancy, err, errlen);
        if (rc)
            return -EINVAL;
    }
    const char *env_faults = getenv("PEGAFLOW_FAULTS");
    const char *spec = cfg->fault_spec ? cfg->fault_spec : env_faults;
    const char *what = cfg->fault_spec ? "--fault-spec" : "PEGAFLOW_FAULTS";
    if (spec && *spec) {
        if (!cfg->enable_debug) {
            snprintf(err, errlen,
                     "%s: fault injection is refused unless --enable-debug is given; add "
                     "--enable-debug (test machines only), e.g. pegaflow-server --enable-debug "
                     "--fault-spec '%s'",
                     what, spec);
            return -EINVAL;
        }
        char e2[300];
        if (pf_fault_plan_parse(spec, &cfg->faults, e2, sizeof(e2)) != 0) {
            snprintf(err, errlen, "%s: %s", what, e2);
            return -EINVAL;
        }
    }
    return 0;
}

void pf_server_config_free(struct pf_server_config *cfg)
{
    pf_flags_free(pf_server_flags, pf_server_nflags, cfg);
    free(cfg->device_ids);
    cfg->device_ids = NULL;
    pf_fault_plan_free(cfg->faults);
    cfg->faults = NULL;
    pf_auth_free(&cfg->auth);
    pf_tenancy_destroy(cfg->tenancy);
    cfg->tenancy = NULL;
}

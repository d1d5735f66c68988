/* Application layer: flag tables and process lifecycle of pegaflow-server and
 * pegaflow-metaserver (the src/bin main files only call pf_server_main / pf_metaserver_main). */
#ifndef PF_APP_H
#define PF_APP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/auth.h"
#include "pf/config.h"
#include "pf/log.h"
#include "pf/tenant.h"

struct pf_server_config {
    /* seeds/server.md */
    char *addr;
    struct pf_strlist devices;
    uint64_t pool_size;
    uint64_t hint_value_size;
    bool use_hugepages;
    bool enable_lfu_admission;
    bool disable_numa_affinity;
    bool blockwise_alloc;
    uint64_t load_cancel_chunk;
    enum pf_log_level log_level;
    char *http_addr;
    bool enable_prometheus;
    char *metrics_otel_endpoint;
    char *metrics_otel_protocol; /* resolved: the flag, else OTEL_EXPORTER_OTLP_*PROTOCOL */
    int otlp_protocol;           /* enum pf_otlp_protocol of metrics_otel_protocol */
    uint64_t metrics_period_secs;
    struct pf_strlist ssd_cache_path;
    uint64_t ssd_cache_capacity;
    uint64_t ssd_cache_shards;
    uint64_t ssd_write_queue_depth;
    uint64_t ssd_prefetch_queue_depth;
    uint64_t ssd_write_inflight;
    uint64_t ssd_write_merge;
    uint64_t ssd_prefetch_inflight;
    uint64_t ssd_read_merge;
    uint64_t ssd_prefetch_staging;
    bool ssd_recover;
    bool ssd_reformat;
    uint64_t ssd_drain_timeout_secs;
    uint64_t max_prefetch_blocks;
    struct pf_strlist nics;
    char *metaserver_addr;
    uint64_t transfer_lock_timeout_secs;
    uint64_t p2p_plan_timeout_ms;
    uint64_t metaserver_queue_depth;
    /* RDMA transport (docs/net.md "Flags") */
    char *rdma_gid_index, *rdma_gid_subnet;
    uint64_t rdma_traffic_class, rdma_sl, rdma_pkey_index, rdma_timeout, rdma_retry_cnt,
        rdma_rnr_retry;
    /* reference-only flags */
    uint64_t qps_per_peer;
    uint64_t pool_shards;
    char *metric_hll_windows;
    uint64_t metric_hll_bucket_bits;
    double trace_sample_rate;
    /* ours (docs/server.md) */
    char *gpu_backend;
    char *gpu_copy_batch;    /* --gpu-copy-batch auto|on|off */
    int gpu_copy_batch_mode; /* enum pf_gpu_copy_batch, from gpu_copy_batch */
    char *net_backend;
    uint64_t rpc_threads;
    char *fault_spec;
    bool enable_debug;
    uint64_t sim_gpu_bandwidth;
    uint64_t sim_gpus;
    bool integrity;
    /* security (docs/security.md) */
    char *tls_cert, *tls_key, *tls_ca;
    char *cluster_token_file;
    char *admin_token_file;
    char *local_addr;
    char *local_rpcs;
    bool insecure_cluster;  /* --insecure-cluster: P2P without a cluster token */
    char *local_addr_group; /* --local-addr-group: group of the 0660 Unix socket */

    char *tenants_file; /* --tenants-file (src/tenant) */

    /* derived by pf_server_config_parse */
    struct pf_auth auth;        /* the files above, read */
    struct pf_tenancy *tenancy; /* --tenants-file, loaded; NULL without */
    bool local_only;            /* --local-rpcs resolved */
    bool local_gid_set;         /* --local-addr-group resolved */
    unsigned local_gid;
    struct pf_fault_plan *faults;
    int *device_ids;
    size_t ndevice_ids;
    char metaserver_target[256];
};

extern const struct pf_flag pf_server_flags[];
extern const size_t pf_server_nflags;
/* --help sections, as seeds/server.md groups the flags (server, HTTP & metrics, SSD,
 * cross-node), then ours; every flag of pf_server_flags is in exactly one. */
extern const struct pf_flag_group pf_server_flag_groups[];
extern const size_t pf_server_nflag_groups;

/* Parses and validates argv. Returns 0, 1 (--help printed), 2 (--version printed) or
 * -EINVAL with a one-line message in err (the binary prints it and exits 2). */
int pf_server_config_parse(struct pf_server_config *cfg, int argc, char **argv, char *err,
                           size_t errlen);
void pf_server_config_free(struct pf_server_config *cfg);

int pf_server_main(int argc, char **argv);
/* glibc malloc for a server, set at start: blocks below PF_APP_MALLOC_MMAP_MIN come from
 * the arenas, and an arena keeps up to PF_APP_MALLOC_TRIM free at its top instead of handing
 * it back. With glibc's defaults (thresholds that start at 128 KiB and follow the largest
 * block freed) the 0.3-0.5 MiB arrays of every large query went back to the kernel (madvise)
 * and came back as fresh zeroed pages on the next: 20-40 us of a 4,096-hash QueryPrefetch
 * (bench/README.md "The cold query's round trip"). tunables: GLIBC_TUNABLES; one naming
 * either threshold wins (returns 1, logged). 0 when set, -EINVAL when mallopt refused. */
#define PF_APP_MALLOC_MMAP_MIN (4 << 20)
#define PF_APP_MALLOC_TRIM     (8 << 20)
int pf_app_malloc_settings(const char *tunables);

struct pf_meta_config {
    char *addr;
    char *http_addr;
    enum pf_log_level log_level;
    uint64_t node_stale_secs;
    uint64_t ttl_minutes;
    uint64_t sweep_interval_secs;
    uint64_t rpc_threads;
    char *store; /* "memory" or "redis://..." */
    char *tls_cert, *tls_key, *tls_ca;
    char *cluster_token_file;
    bool insecure_cluster; /* --insecure-cluster: a routable --addr without a token */
    char *redis_password_file;
    /* derived */
    struct pf_auth auth;
    /* Redis AUTH password from --redis-password-file or PEGAFLOW_REDIS_PASSWORD (NULL: the
     * URL's or none); wiped by pf_meta_config_free, like the --store URL */
    char *redis_password;
};

extern const struct pf_flag pf_meta_flags[];
extern const size_t pf_meta_nflags;

int pf_meta_config_parse(struct pf_meta_config *cfg, int argc, char **argv, char *err,
                         size_t errlen);
void pf_meta_config_free(struct pf_meta_config *cfg);

int pf_metaserver_main(int argc, char **argv);

/* src/app/auth_setup.c: security glue shared by both binaries. */
/* Makes this process's outgoing channels use a's TLS identity and cluster token. */
int pf_app_auth_channels(const struct pf_auth *a);
/* Logs one warning when the listener `what` on addr is reachable from other hosts (not a
 * loopback or unix: address) while `authenticated` is false; `how` says what would fix it. */
void pf_app_warn_open(const char *what, const char *addr, bool authenticated, const char *how);
/* --local-rpcs value -> enforce locality: "host" and "auto" (the default: protected
 * whatever else is configured) true, "any" false. -EINVAL for another value. */
int pf_app_local_rpcs(const char *v, const struct pf_auth *a, bool *local_only_p);
/* Is addr loopback (127/8, ::1, localhost) or unix:PATH: only this host can connect? */
bool pf_app_addr_is_host_only(const char *addr);
/* Are peer/MetaServer callers authenticated: a cluster token or mutual TLS (--tls-ca)? */
bool pf_app_cluster_authenticated(const struct pf_auth *a);
/* The --insecure-cluster warning (at start and every PF_APP_INSECURE_WARN_SECS); what names
 * the listener ("this node", "this MetaServer"). */
#define PF_APP_INSECURE_WARN_SECS 3600
void pf_app_warn_insecure(const char *what);
/* The period of that warning: PF_APP_INSECURE_WARN_SECS, or with debug (--enable-debug) the
 * test knob PEGAFLOW_INSECURE_WARN_SECS (1..3600). */
uint64_t pf_app_insecure_warn_secs(bool debug);
/* The warning of --local-rpcs any on a listener other hosts can reach (with or without a
 * cluster token: worker RPCs are then open to every caller). */
void pf_app_warn_local_rpcs_any(const char *addr, const struct pf_auth *a);

#endif

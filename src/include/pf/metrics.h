/* Metrics registry: counters, gauges and histograms with optional labels, rendered as
 * Prometheus text (exposition format 0.0.4).
 *
 * Names are the exposed names. Counters get a "_total" suffix when their name does not
 * already end in "_total" (pegaflow_save_bytes -> pegaflow_save_bytes_total); histograms
 * are named with their unit (pegaflow_save_duration_seconds). Label names are given once per
 * family as a comma-separated list ("method,status"); children are looked up by values.
 *
 * Registration is idempotent: asking twice for the same name and kind returns the same
 * family, so several engines in one test process share metrics. Updates are lock-free
 * atomics; child lookup takes the family mutex (cache the child on hot paths).
 * The registry is process-global and lives until exit. */
#ifndef PF_METRICS_H
#define PF_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct pf_metric;       /* family */
struct pf_metric_child; /* one label-value combination */

#define PF_METRIC_MAX_LABELS 4

struct pf_metric *pf_metric_counter(const char *name, const char *help, const char *labels);
struct pf_metric *pf_metric_gauge(const char *name, const char *help, const char *labels);
/* buckets: ascending upper bounds (+Inf implied). */
struct pf_metric *pf_metric_histogram(const char *name, const char *help, const char *labels,
                                      const double *buckets, size_t nbuckets);

/* A gauge computed at scrape time. fn is called with the family's label values emitter. */
typedef void (*pf_metric_emit_fn)(void *emit_ctx, const char *const *label_values, double v);
typedef void (*pf_metric_collect_fn)(void *ctx, pf_metric_emit_fn emit, void *emit_ctx);
struct pf_metric *pf_metric_gauge_fn(const char *name, const char *help, const char *labels,
                                     pf_metric_collect_fn fn, void *ctx);
/* Removes a callback gauge's callback (the family stays, rendering nothing). */
void pf_metric_gauge_fn_clear(struct pf_metric *m, void *ctx);

/* Child for the given label values (as many as the family has labels). Never NULL for a
 * valid family (allocation failure returns a shared sink child whose updates are dropped). */
struct pf_metric_child *pf_metric_child(struct pf_metric *m, const char *const *values);
struct pf_metric_child *pf_metric_child1(struct pf_metric *m, const char *v0);
struct pf_metric_child *pf_metric_child2(struct pf_metric *m, const char *v0, const char *v1);

void pf_child_add(struct pf_metric_child *c, double v);     /* counter/gauge */
void pf_child_set(struct pf_metric_child *c, double v);     /* gauge */
void pf_child_observe(struct pf_metric_child *c, double v); /* histogram */
double pf_child_value(struct pf_metric_child *c);           /* counter/gauge value, hist count */

/* Unlabelled shorthands (family with no labels). */
void pf_metric_add(struct pf_metric *m, double v);
void pf_metric_set(struct pf_metric *m, double v);
void pf_metric_observe(struct pf_metric *m, double v);
double pf_metric_value(struct pf_metric *m);
/* Value of a labelled child; 0 when absent. For tests and admin output. */
double pf_metric_value_of(const char *name, const char *const *values);

/* Renders every family. *out is malloc'ed text (caller frees). 0 or -ENOMEM. */
int pf_metrics_render(char **out, size_t *len);

/* Renders every family as an OTLP/JSON ExportMetricsServiceRequest (counters as monotonic
 * cumulative sums, gauges as gauges, histograms as cumulative explicit-bucket histograms).
 * start_ns is the process start (wall clock). *out is malloc'ed. */
int pf_metrics_render_otlp(const char *service, uint64_t start_ns, char **out, size_t *len);

/* The same as a binary protobuf ExportMetricsServiceRequest (proto/otlp_metrics.proto, the
 * published OTLP field numbers). *out is malloc'ed. 0 or -ENOMEM. */
int pf_metrics_render_otlp_pb(const char *service, uint64_t start_ns, uint8_t **out, size_t *len);

/* OTLP exporter protocols (OTEL_EXPORTER_OTLP_PROTOCOL values). */
enum pf_otlp_protocol {
    PF_OTLP_GRPC,          /* "grpc": MetricsService/Export over gRPC (collectors on :4317) */
    PF_OTLP_HTTP_PROTOBUF, /* "http/protobuf": POST <endpoint>/v1/metrics, protobuf body */
    PF_OTLP_HTTP_JSON,     /* "http/json": POST <endpoint>/v1/metrics, OTLP/JSON body */
};
/* "grpc", "http/protobuf", "http/json" -> 0 and *p; anything else -EINVAL. */
int pf_otlp_protocol_parse(const char *s, enum pf_otlp_protocol *p);
const char *pf_otlp_protocol_name(enum pf_otlp_protocol p);

/* OTLP exporter: a thread that exports the registry every period. endpoint is
 * "http://host:port[/base]" (or "host:port"); with gRPC the path is ignored, with HTTP the
 * request goes to <base>/v1/metrics. Failures are logged (rate-limited) and counted in
 * pegaflow_otlp_export_failures_total; they never affect serving. Each export is bounded by
 * 5 s. */
struct pf_otlp_exporter;
int pf_otlp_start(const char *endpoint, enum pf_otlp_protocol protocol, uint64_t period_secs,
                  const char *service, struct pf_otlp_exporter **x_p, char *err, size_t errlen);
/* One export now (also used by tests); 0 or -errno. */
int pf_otlp_export_once(struct pf_otlp_exporter *x);
/* Exports a last time (bounded by the 5 s timeouts), stops the thread. Accepts NULL. */
void pf_otlp_stop(struct pf_otlp_exporter *x);

/* Standard bucket sets. */
extern const double pf_buckets_rpc_seconds[]; /* 0.5 ms .. 2 s */
extern const size_t pf_buckets_rpc_seconds_n;
extern const double pf_buckets_io_seconds[]; /* 0.01 .. 60 s */
extern const size_t pf_buckets_io_seconds_n;

#endif

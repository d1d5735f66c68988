/* OTLP metrics exporter: every period, render the registry and send it to the collector in
 * one of the three OTLP protocols: gRPC (MetricsService/Export with the protobuf
 * ExportMetricsServiceRequest, over the gRPC C core channel of src/rpc, deadline 5 s), or
 * HTTP POST to <endpoint>/v1/metrics with a protobuf or JSON body with libcurl (one handle
 * per exporter, so the connection is reused; http:// or https://; environment proxies are
 * not used; the whole request bounded by 5 s). A collector that is down
 * only costs a rate-limited warning and a counter. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#define PF_LOG_MOD "otlp"
#include "pf/auth.h"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/rpc.h"
#include "pf/thread.h"

#include "otlp_metrics.pb-c.h"

#define OTLP_GRPC_EXPORT "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"

#define IO_TIMEOUT_MS 5000

struct pf_otlp_exporter {
    enum pf_otlp_protocol protocol;
    struct pf_rpc_channel *ch; /* gRPC */
    CURL *curl;                /* HTTP, created on the first export */
    char url[600];             /* HTTP: scheme://host:port<base>/v1/metrics */
    char host[256];
    uint16_t port;
    char path[256];
    uint64_t period_ms;
    char *service;
    uint64_t start_ns;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    struct pf_metric *m_fail, *m_ok;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t discard_body(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return size * n;
}

static int curl_errno(CURLcode cc)
{
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
        return -EHOSTUNREACH;
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    default:
        return -EIO;
    }
}

/* HTTP: one POST of body to the endpoint URL with libcurl (connection kept for the next) */
static int export_http(struct pf_otlp_exporter *x, const char *body, size_t blen, const char *ctype)
{
    if (!x->curl && !(x->curl = curl_easy_init()))
        return -ENOMEM;
    CURL *c = x->curl;
    curl_easy_reset(c);
    char ct[64];
    snprintf(ct, sizeof(ct), "Content-Type: %s", ctype);
    struct curl_slist *h = curl_slist_append(NULL, ct), *h2 = NULL;
    if (h)
        h2 = curl_slist_append(h, "Expect:"); /* no 100-continue round trip */
    if (!h2) {
        curl_slist_free_all(h);
        return -ENOMEM;
    }
    h = h2;
    curl_easy_setopt(c, CURLOPT_URL, x->url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, ""); /* straight to the collector, never a proxy */
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)IO_TIMEOUT_MS);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)IO_TIMEOUT_MS);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard_body);
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    if (cc != CURLE_OK) {
        pf_log_ratelimited(PF_LOG_WARN, 60000, "OTLP collector %s: %s", x->url,
                           curl_easy_strerror(cc));
        return curl_errno(cc);
    }
    if (status < 200 || status >= 300) {
        pf_log_ratelimited(PF_LOG_WARN, 60000, "OTLP collector %s answered HTTP %ld", x->url,
                           status);
        return -EPROTO;
    }
    return 0;
}

static const char *const protocol_names[] = {
    [PF_OTLP_GRPC] = "grpc",
    [PF_OTLP_HTTP_PROTOBUF] = "http/protobuf",
    [PF_OTLP_HTTP_JSON] = "http/json",
};

int pf_otlp_protocol_parse(const char *s, enum pf_otlp_protocol *p)
{
    for (size_t i = 0; s && i < sizeof(protocol_names) / sizeof(protocol_names[0]); i++)
        if (strcmp(s, protocol_names[i]) == 0) {
            *p = (enum pf_otlp_protocol)i;
            return 0;
        }
    return -EINVAL;
}

const char *pf_otlp_protocol_name(enum pf_otlp_protocol p)
{
    return (unsigned)p < sizeof(protocol_names) / sizeof(protocol_names[0]) ? protocol_names[p]
                                                                            : "?";
}

/* gRPC: one MetricsService/Export call with the protobuf request */
static int export_grpc(struct pf_otlp_exporter *x)
{
    uint8_t *buf;
    size_t len;
    int rc = pf_metrics_render_otlp_pb(x->service, x->start_ns, &buf, &len);
    if (rc)
        return rc;
    /* pf_rpc_unary packs a message: unpack ours once (cheap next to the network) */
    ProtobufCMessage *req = protobuf_c_message_unpack(
        &opentelemetry__proto__metrics__v1__export_metrics_service_request__descriptor, NULL, len,
        buf);
    free(buf);
    if (!req)
        return -ENOMEM;
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st = {0};
    rc = pf_rpc_unary(
        x->ch, OTLP_GRPC_EXPORT, req,
        &opentelemetry__proto__metrics__v1__export_metrics_service_response__descriptor,
        IO_TIMEOUT_MS, &resp, &st);
    protobuf_c_message_free_unpacked(req, NULL);
    if (rc) {
        pf_log_ratelimited(PF_LOG_WARN, 60000, "OTLP collector %s:%u (gRPC) answered %s: %s",
                           x->host, x->port, pf_grpc_code_name(st.code), st.msg);
        return rc;
    }
    const Opentelemetry__Proto__Metrics__V1__ExportMetricsServiceResponse *r = (void *)resp;
    if (r->partial_success && r->partial_success->rejected_data_points > 0)
        pf_log_ratelimited(
            PF_LOG_WARN, 60000, "OTLP collector %s:%u rejected %lld data point(s): %s", x->host,
            x->port, (long long)r->partial_success->rejected_data_points,
            r->partial_success->error_message ? r->partial_success->error_message : "");
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

int pf_otlp_export_once(struct pf_otlp_exporter *x)
{
    char *body;
    size_t blen;
    int rc;
    if (x->protocol == PF_OTLP_GRPC) {
        rc = export_grpc(x);
        body = NULL;
        goto out;
    }
    const char *ctype;
    if (x->protocol == PF_OTLP_HTTP_PROTOBUF) {
        rc = pf_metrics_render_otlp_pb(x->service, x->start_ns, (uint8_t **)&body, &blen);
        ctype = "application/x-protobuf";
    } else {
        rc = pf_metrics_render_otlp(x->service, x->start_ns, &body, &blen);
        ctype = "application/json";
    }
    if (rc)
        return rc;
    rc = export_http(x, body, blen, ctype);
out:
    free(body);
    if (rc) {
        pf_metric_add(x->m_fail, 1);
        pf_log_ratelimited(PF_LOG_WARN, 60000, "OTLP export (%s) to %s:%u%s failed: %s",
                           pf_otlp_protocol_name(x->protocol), x->host, x->port,
                           x->protocol == PF_OTLP_GRPC ? "" : x->path, strerror(-rc));
    } else {
        pf_metric_add(x->m_ok, 1);
    }
    return rc;
}

static void *otlp_main(void *arg)
{
    struct pf_otlp_exporter *x = arg;
    pthread_mutex_lock(&x->mu);
    while (!x->stop) {
        struct timespec dl = pf_deadline_ms(x->period_ms);
        pthread_cond_timedwait(&x->cv, &x->mu, &dl);
        if (x->stop)
            break;
        pthread_mutex_unlock(&x->mu);
        pf_otlp_export_once(x);
        pthread_mutex_lock(&x->mu);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

int pf_otlp_start(const char *endpoint, enum pf_otlp_protocol protocol, uint64_t period_secs,
                  const char *service, struct pf_otlp_exporter **x_p, char *err, size_t errlen)
{
    if ((unsigned)protocol > PF_OTLP_HTTP_JSON) {
        snprintf(err, errlen, "--metrics-otel-protocol: unknown protocol %d", (int)protocol);
        return -EINVAL;
    }
    struct pf_otlp_exporter *x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    x->protocol = protocol;
    const char *p = endpoint, *scheme = "http";
    if (strncmp(p, "http://", 7) == 0) {
        p += 7;
    } else if (strncmp(p, "https://", 8) == 0) {
        p += 8;
        scheme = "https";
        if (protocol == PF_OTLP_GRPC) {
            snprintf(err, errlen,
                     "--metrics-otel-endpoint: TLS is not supported with OTLP/gRPC ('%s'); use "
                     "http://host:4317 (e.g. a local collector) or --metrics-otel-protocol "
                     "http/protobuf with https://",
                     endpoint);
            free(x);
            return -EINVAL;
        }
    }
    const char *slash = strchr(p, '/');
    char hp[300];
    snprintf(hp, sizeof(hp), "%.*s", (int)(slash ? (size_t)(slash - p) : strlen(p)), p);
    if (pf_addr_split(hp, x->host, sizeof(x->host), &x->port) != 0 || x->port == 0) {
        snprintf(err, errlen, "--metrics-otel-endpoint: '%s' is not http://host:port[/path]",
                 endpoint);
        free(x);
        return -EINVAL;
    }
    const char *base = slash ? slash : "";
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] == '/')
        bl--;
    snprintf(x->path, sizeof(x->path), "%.*s/v1/metrics", (int)bl, base);
    bool v6 = strchr(x->host, ':') != NULL;
    snprintf(x->url, sizeof(x->url), "%s://%s%s%s:%u%s", scheme, v6 ? "[" : "", x->host,
             v6 ? "]" : "", x->port, x->path);
    pthread_once(&curl_once, curl_init_once);
    if (protocol == PF_OTLP_GRPC) {
        char target[300];
        snprintf(target, sizeof(target), "%s:%u", x->host, x->port);
        /* plaintext and without the cluster token, whatever this process's peer channels
         * use: the collector is not a cluster member (docs/security.md) */
        static const struct pf_rpc_channel_opts plain = {0};
        int crc = pf_rpc_channel_open_opts(target, &plain, &x->ch);
        if (crc) {
            snprintf(err, errlen, "--metrics-otel-endpoint: cannot open a gRPC channel to %s: %s",
                     target, strerror(-crc));
            free(x);
            return crc;
        }
    }
    x->period_ms = (period_secs ? period_secs : 10) * 1000;
    x->service = strdup(service);
    x->start_ns = pf_wall_ns();
    x->m_fail =
        pf_metric_counter("pegaflow_otlp_export_failures", "OTLP metric exports that failed", NULL);
    x->m_ok = pf_metric_counter("pegaflow_otlp_exports", "OTLP metric exports delivered", NULL);
    pthread_mutex_init(&x->mu, NULL);
    pf_cond_init(&x->cv);
    int rc = pf_thread_start(&x->thr, "pegaflow-otlp", -1, otlp_main, x);
    if (rc) {
        snprintf(err, errlen, "cannot start the OTLP exporter: %s", strerror(-rc));
        pf_rpc_channel_close(x->ch);
        free(x->service);
        free(x);
        return rc;
    }
    if (protocol == PF_OTLP_GRPC)
        pf_info("exporting metrics over OTLP/gRPC to %s:%u every %llu s", x->host, x->port,
                (unsigned long long)(x->period_ms / 1000));
    else
        pf_info("exporting metrics over OTLP/%s to %s every %llu s",
                protocol == PF_OTLP_HTTP_JSON ? "HTTP (JSON)" : "HTTP (protobuf)", x->url,
                (unsigned long long)(x->period_ms / 1000));
    *x_p = x;
    return 0;
}

void pf_otlp_stop(struct pf_otlp_exporter *x)
{
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    x->stop = true;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thr, NULL);
    pf_otlp_export_once(x); /* flush the final values */
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    pf_rpc_channel_close(x->ch);
    if (x->curl)
        curl_easy_cleanup(x->curl);
    free(x->service);
    free(x);
}

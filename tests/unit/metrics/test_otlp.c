/* OTLP/HTTP export against a fake collector: the request line, content type, a JSON body
 * with our metrics, the success counter; a collector answering 500 or absent counts a
 * failure without blocking beyond the timeouts. The protobuf rendering decodes with the
 * OTLP descriptors into the same values; http/protobuf posts it as application/x-protobuf.
 * Protocol names parse as OTEL_EXPORTER_OTLP_PROTOCOL spells them. (gRPC export against a
 * real gRPC collector: tests/integration/test_otlp.sh.) */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "otlp_metrics.pb-c.h"
#include "pf/metrics.h"

struct collector {
    int lfd;
    int port;
    const char *answer;
    char req[1 << 20];
    size_t len;
};

static void *serve_one(void *p)
{
    struct collector *c = p;
    int fd = accept(c->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    size_t want = 0;
    for (;;) {
        ssize_t n = read(fd, c->req + c->len, sizeof(c->req) - 1 - c->len);
        if (n <= 0)
            break;
        c->len += (size_t)n;
        c->req[c->len] = '\0';
        char *hdr_end = strstr(c->req, "\r\n\r\n");
        char *cl = strstr(c->req, "Content-Length: ");
        if (hdr_end && cl && !want)
            want = (size_t)(hdr_end + 4 - c->req) + strtoul(cl + 16, NULL, 10);
        if (want && c->len >= want)
            break;
    }
    if (write(fd, c->answer, strlen(c->answer)) < 0)
        perror("write");
    close(fd);
    return NULL;
}

static void start_collector(struct collector *c, const char *answer)
{
    memset(c, 0, sizeof(*c));
    c->answer = answer;
    c->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(c->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t sl = sizeof(a);
    getsockname(c->lfd, (struct sockaddr *)&a, &sl);
    c->port = ntohs(a.sin_port);
    listen(c->lfd, 4);
}

static void test_export(void **st)
{
    pf_metric_add(pf_metric_counter("otlp_test_things", "Things", NULL), 7);
    const double b[] = {1};
    pf_metric_observe(pf_metric_histogram("otlp_test_seconds", "Lat", "op", b, 1), 0.5);
    pf_child_observe(
        pf_metric_child1(pf_metric_histogram("otlp_test_seconds", "", "op", b, 1), "save"), 2);
    struct collector c;
    start_collector(&c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    pthread_t t;
    pthread_create(&t, NULL, serve_one, &c);
    char ep[64], err[128];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d/otel/", c.port);
    struct pf_otlp_exporter *x;
    assert_int_equal(pf_otlp_start(ep, PF_OTLP_HTTP_JSON, 3600, "unit", &x, err, sizeof(err)), 0);
    assert_int_equal(pf_otlp_export_once(x), 0);
    pthread_join(t, NULL);
    assert_non_null(strstr(c.req, "POST /otel/v1/metrics HTTP/1.1\r\n"));
    assert_non_null(strstr(c.req, "Content-Type: application/json"));
    assert_non_null(strstr(c.req, "\"name\":\"otlp_test_things_total\""));
    assert_non_null(strstr(c.req, "\"isMonotonic\":true"));
    assert_non_null(strstr(c.req, "\"asDouble\":7"));
    assert_non_null(strstr(c.req, "\"stringValue\":\"save\""));
    assert_non_null(strstr(c.req, "\"bucketCounts\":[\"0\",\"1\"]"));
    assert_non_null(strstr(c.req, "\"service.name\""));
    assert_int_equal(pf_metric_value_of("pegaflow_otlp_exports", NULL), 1);

    /* a collector answering 500 is a counted failure */
    c.len = 0;
    c.answer = "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n";
    pthread_create(&t, NULL, serve_one, &c);
    assert_int_not_equal(pf_otlp_export_once(x), 0);
    pthread_join(t, NULL);
    assert_int_equal(pf_metric_value_of("pegaflow_otlp_export_failures", NULL), 1);
    close(c.lfd);
    /* nobody listening: connection refused, counted, no hang (the final flush in stop too) */
    assert_int_not_equal(pf_otlp_export_once(x), 0);
    pf_otlp_stop(x);
    assert_true(pf_metric_value_of("pegaflow_otlp_export_failures", NULL) >= 3);
    assert_int_equal(pf_otlp_start("ftp://x", PF_OTLP_HTTP_JSON, 1, "u", &x, err, sizeof(err)),
                     -EINVAL);
}

typedef Opentelemetry__Proto__Metrics__V1__ExportMetricsServiceRequest req_t;
typedef Opentelemetry__Proto__Metrics__V1__Metric metric_t;

static const metric_t *find_metric(const req_t *r, const char *name)
{
    assert_int_equal(r->n_resource_metrics, 1);
    const Opentelemetry__Proto__Metrics__V1__ResourceMetrics *rm = r->resource_metrics[0];
    assert_int_equal(rm->n_scope_metrics, 1);
    for (size_t i = 0; i < rm->scope_metrics[0]->n_metrics; i++)
        if (strcmp(rm->scope_metrics[0]->metrics[i]->name, name) == 0)
            return rm->scope_metrics[0]->metrics[i];
    fail_msg("metric %s not exported", name);
    return NULL;
}

static void check_pb(const uint8_t *buf, size_t len)
{
    req_t *r =
        opentelemetry__proto__metrics__v1__export_metrics_service_request__unpack(NULL, len, buf);
    assert_non_null(r);
    const Opentelemetry__Proto__Metrics__V1__Resource *res = r->resource_metrics[0]->resource;
    assert_int_equal(res->n_attributes, 1);
    assert_string_equal(res->attributes[0]->key, "service.name");
    assert_string_equal(res->attributes[0]->value->string_value, "unit");
    const metric_t *m = find_metric(r, "otlp_test_things_total");
    assert_int_equal(m->data_case, OPENTELEMETRY__PROTO__METRICS__V1__METRIC__DATA_SUM);
    assert_true(m->sum->is_monotonic);
    assert_int_equal(
        m->sum->aggregation_temporality,
        OPENTELEMETRY__PROTO__METRICS__V1__AGGREGATION_TEMPORALITY__AGGREGATION_TEMPORALITY_CUMULATIVE);
    assert_int_equal(m->sum->n_data_points, 1);
    assert_true(m->sum->data_points[0]->as_double == 7);
    assert_true(m->sum->data_points[0]->time_unix_nano >
                m->sum->data_points[0]->start_time_unix_nano);
    m = find_metric(r, "otlp_test_seconds");
    assert_int_equal(m->data_case, OPENTELEMETRY__PROTO__METRICS__V1__METRIC__DATA_HISTOGRAM);
    bool saw_save = false;
    for (size_t i = 0; i < m->histogram->n_data_points; i++) {
        const Opentelemetry__Proto__Metrics__V1__HistogramDataPoint *p =
            m->histogram->data_points[i];
        assert_int_equal(p->n_explicit_bounds, 1);
        assert_true(p->explicit_bounds[0] == 1);
        assert_int_equal(p->n_bucket_counts, 2);
        assert_int_equal(p->bucket_counts[0] + p->bucket_counts[1], p->count);
        if (p->n_attributes == 1 && strcmp(p->attributes[0]->value->string_value, "save") == 0) {
            assert_string_equal(p->attributes[0]->key, "op");
            assert_int_equal(p->count, 1);
            assert_int_equal(p->bucket_counts[1], 1); /* 2 > the bound 1 */
            assert_true(p->sum == 2);
            saw_save = true;
        }
    }
    assert_true(saw_save);
    opentelemetry__proto__metrics__v1__export_metrics_service_request__free_unpacked(r, NULL);
}

static void test_protobuf(void **st)
{
    struct collector c;
    start_collector(&c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    pthread_t t;
    pthread_create(&t, NULL, serve_one, &c);
    char ep[64], err[128];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", c.port);
    struct pf_otlp_exporter *x;
    assert_int_equal(pf_otlp_start(ep, PF_OTLP_HTTP_PROTOBUF, 3600, "unit", &x, err, sizeof(err)),
                     0);
    assert_int_equal(pf_otlp_export_once(x), 0);
    pthread_join(t, NULL);
    assert_non_null(strstr(c.req, "POST /v1/metrics HTTP/1.1\r\n"));
    assert_non_null(strstr(c.req, "Content-Type: application/x-protobuf\r\n"));
    const char *hdr_end = strstr(c.req, "\r\n\r\n");
    assert_non_null(hdr_end);
    size_t off = (size_t)(hdr_end + 4 - c.req);
    assert_int_equal(strtoul(strstr(c.req, "Content-Length: ") + 16, NULL, 10), c.len - off);
    check_pb((const uint8_t *)c.req + off, c.len - off);
    close(c.lfd); /* the final flush in stop finds nobody: counted, not fatal */
    pf_otlp_stop(x);
}

static void test_protobuf_values(void **st)
{
    pf_metric_add(pf_metric_counter("otlp_test_things", "Things", NULL), 0);
    uint8_t *buf;
    size_t len;
    assert_int_equal(pf_metrics_render_otlp_pb("unit", 1, &buf, &len), 0);
    check_pb(buf, len);
    free(buf);
}

static void test_protocol_names(void **st)
{
    enum pf_otlp_protocol p;
    assert_int_equal(pf_otlp_protocol_parse("grpc", &p), 0);
    assert_int_equal(p, PF_OTLP_GRPC);
    assert_int_equal(pf_otlp_protocol_parse("http/protobuf", &p), 0);
    assert_int_equal(p, PF_OTLP_HTTP_PROTOBUF);
    assert_int_equal(pf_otlp_protocol_parse("http/json", &p), 0);
    assert_int_equal(p, PF_OTLP_HTTP_JSON);
    assert_int_equal(pf_otlp_protocol_parse("http", &p), -EINVAL);
    assert_int_equal(pf_otlp_protocol_parse(NULL, &p), -EINVAL);
    assert_string_equal(pf_otlp_protocol_name(PF_OTLP_HTTP_PROTOBUF), "http/protobuf");
    /* TLS: libcurl speaks https for the HTTP protocols, the gRPC channel is plaintext only */
    struct pf_otlp_exporter *x;
    char err[256];
    assert_int_equal(
        pf_otlp_start("https://127.0.0.1:1", PF_OTLP_GRPC, 3600, "u", &x, err, sizeof(err)),
        -EINVAL);
    assert_non_null(strstr(err, "TLS is not supported with OTLP/gRPC"));
    assert_int_equal(pf_otlp_start("https://127.0.0.1:1/b", PF_OTLP_HTTP_PROTOBUF, 3600, "u", &x,
                                   err, sizeof(err)),
                     0);
    assert_int_not_equal(pf_otlp_export_once(x), 0); /* nobody on port 1: counted, no hang */
    pf_otlp_stop(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export), cmocka_unit_test(test_protobuf_values),
        cmocka_unit_test(test_protobuf), cmocka_unit_test(test_protocol_names)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

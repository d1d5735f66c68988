/* OTLP/HTTP export against a fake collector: the request line, content type, a JSON body
 * with our metrics, the success counter; a collector answering 500 or absent counts a
 * failure without blocking beyond the timeouts. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

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
    assert_int_equal(pf_otlp_start(ep, 3600, "unit", &x, err, sizeof(err)), 0);
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
    assert_int_equal(pf_otlp_start("ftp://x", 1, "u", &x, err, sizeof(err)), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_export)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* gRPC plumbing: unary calls, status codes and messages, malformed requests, unknown and
 * not-yet-built methods, deadlines, parked streams (stream_closed fires exactly once when the
 * client goes away), busy ports, and the errno <-> status mappings. Also the metric
 * registry's Prometheus rendering. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/clock.h"
#include "pf/metrics.h"
#include "pf/rpc.h"
#include "pf/util.h"

static int h_echo(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    const Pegaflow__UnregisterRequest *r = (const void *)m;
    if (strcmp(r->instance_id, "bad") == 0)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "instance %s is bad", r->instance_id);
    if (strcmp(r->instance_id, "slow") == 0)
        pf_sleep_ms(500);
    if (strcmp(r->instance_id, "silent") == 0)
        return 0; /* forgot to respond */
    Pegaflow__ResponseStatus st = PEGAFLOW__RESPONSE_STATUS__INIT;
    st.ok = 1;
    st.message = r->instance_id;
    Pegaflow__UnregisterResponse resp = PEGAFLOW__UNREGISTER_RESPONSE__INIT;
    resp.status = &st;
    return pf_rpc_respond(call, &resp.base);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int opened, closed, closed_cancelled;

static int s_open(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m, void **sc)
{
    const Pegaflow__SessionRequest *r = (const void *)m;
    if (strcmp(r->instance_id, "") == 0)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "instance_id must not be empty");
    pthread_mutex_lock(&mu);
    opened++;
    pthread_mutex_unlock(&mu);
    *sc = (void *)0x1234;
    return 0;
}

static void s_closed(void *ctx, void *sc, bool cancelled)
{
    assert_ptr_equal(sc, (void *)0x1234);
    pthread_mutex_lock(&mu);
    closed++;
    closed_cancelled += cancelled;
    pthread_mutex_unlock(&mu);
}

static const struct pf_rpc_method methods[] = {
    {.path = "/pegaflow.Engine/UnregisterContext",
     .metric_name = "echo",
     .req_desc = &pegaflow__unregister_request__descriptor,
     .unary = h_echo},
    {.path = "/pegaflow.Engine/Session",
     .metric_name = "session",
     .req_desc = &pegaflow__session_request__descriptor,
     .stream_open = s_open,
     .stream_closed = s_closed},
};

static struct pf_rpc_server *srv;
static struct pf_rpc_channel *ch;
static char target[64];

static int setup(void **st)
{
    struct pf_rpc_server_config c = {.addr = "127.0.0.1:0",
                                     .threads = 3,
                                     .methods = methods,
                                     .nmethods = 2,
                                     .metric_prefix = "pftest"};
    char err[200];
    int port;
    assert_int_equal(pf_rpc_server_start(&c, &srv, &port, err, sizeof(err)), 0);
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    assert_int_equal(pf_rpc_channel_open(target, &ch), 0);
    return 0;
}

static int teardown(void **st)
{
    pf_rpc_channel_close(ch);
    pf_rpc_server_stop(srv);
    return 0;
}

static int call_echo(const char *id, uint64_t tmo, struct pf_rpc_status *s, char *out, size_t n)
{
    Pegaflow__UnregisterRequest req = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    req.instance_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    int rc = pf_rpc_unary(ch, "/pegaflow.Engine/UnregisterContext", &req.base,
                          &pegaflow__unregister_response__descriptor, tmo, &resp, s);
    if (rc == 0) {
        snprintf(out, n, "%s", ((Pegaflow__UnregisterResponse *)resp)->status->message);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return rc;
}

/* One call of each outcome on ch: ok (answer "hello"), INVALID_ARGUMENT with the handler's
 * message, INTERNAL for a handler that answers nothing, DEADLINE_EXCEEDED, and ok again
 * after the deadline. */
static void check_outcomes(void)
{
    struct pf_rpc_status s;
    char out[64];
    assert_int_equal(call_echo("hello", 5000, &s, out, sizeof(out)), 0);
    assert_string_equal(out, "hello");
    assert_int_equal(s.code, 0);
    assert_int_equal(call_echo("bad", 5000, &s, out, sizeof(out)), -EINVAL);
    assert_int_equal(s.code, PF_GRPC_INVALID_ARGUMENT);
    assert_string_equal(s.msg, "instance bad is bad");
    assert_int_equal(call_echo("silent", 5000, &s, out, sizeof(out)), -EIO);
    assert_int_equal(s.code, PF_GRPC_INTERNAL);
    assert_int_equal(call_echo("slow", 100, &s, out, sizeof(out)), -ETIMEDOUT);
    assert_int_equal(s.code, PF_GRPC_DEADLINE_EXCEEDED);
    /* concurrent requests still served after a deadline */
    assert_int_equal(call_echo("again", 5000, &s, out, sizeof(out)), 0);
}

static void test_unary(void **st)
{
    struct pf_rpc_status s;
    char out[64];
    check_outcomes();
    /* "forever" deadlines do not wrap into the past */
    assert_int_equal(call_echo("forever", UINT64_MAX, &s, out, sizeof(out)), 0);
    assert_int_equal(call_echo("huge", 1ull << 63, &s, out, sizeof(out)), 0);
    const char *v[2] = {"echo", "INVALID_ARGUMENT"};
    assert_int_equal(pf_metric_value_of("pftest_rpc_requests", v), 1);
}

/* The per-call work libpegaflow's calls leave out (bench/README.md "connector"): abseil's
 * Mutex deadlock detection is off in every process that initialised gRPC through pf_rpc
 * (Debian's libabsl has it on: a global lock-graph lookup on each of the ~20 absl::Mutex
 * locks of a unary call), and a lean_calls channel (no retry filter, no channelz) keeps
 * every status, message and deadline of a plain one. */
static void test_lean_calls(void **st)
{
    assert_true(pf_rpc_absl_deadlock_checks_off());
    const struct pf_rpc_channel_opts o = {.lean_calls = true};
    struct pf_rpc_channel *lean;
    assert_int_equal(pf_rpc_channel_open_opts(target, &o, &lean), 0);
    struct pf_rpc_channel *plain = ch;
    ch = lean;
    for (int i = 0; i < 3; i++)
        check_outcomes();
    ch = plain;
    pf_rpc_channel_close(lean);
}

static struct pf_rpc_pending *start_echo(const char *id, uint64_t tmo)
{
    Pegaflow__UnregisterRequest req = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    req.instance_id = (char *)id;
    struct pf_rpc_pending *p = NULL;
    struct pf_rpc_status s;
    assert_int_equal(
        pf_rpc_unary_start(ch, "/pegaflow.Engine/UnregisterContext", &req.base, tmo, &p, &s), 0);
    assert_non_null(p);
    return p;
}

static int finish_echo(struct pf_rpc_pending *p, struct pf_rpc_status *s, char *out, size_t n)
{
    ProtobufCMessage *resp = NULL;
    int rc = pf_rpc_unary_finish(p, &pegaflow__unregister_response__descriptor, &resp, s);
    if (rc == 0) {
        snprintf(out, n, "%s", ((Pegaflow__UnregisterResponse *)resp)->status->message);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return rc;
}

/* Split-phase calls: several in flight on one thread's queue, finished in another order
 * than started, each with its own outcome; a deadline; a cancelled call; the channel and the
 * server serve on. The request is packed at start (the caller's message may go). */
static void test_split_phase(void **st)
{
    struct pf_rpc_status s;
    char out[64];
    struct pf_rpc_pending *a = start_echo("first", 5000);
    struct pf_rpc_pending *b = start_echo("slow", 5000);
    struct pf_rpc_pending *c = start_echo("bad", 5000);
    struct pf_rpc_pending *d = start_echo("silent", 5000);
    assert_int_equal(finish_echo(c, &s, out, sizeof(out)), -EINVAL);
    assert_int_equal(s.code, PF_GRPC_INVALID_ARGUMENT);
    assert_string_equal(s.msg, "instance bad is bad");
    assert_int_equal(finish_echo(b, &s, out, sizeof(out)), 0);
    assert_string_equal(out, "slow");
    assert_int_equal(finish_echo(d, &s, out, sizeof(out)), -EIO);
    assert_int_equal(s.code, PF_GRPC_INTERNAL);
    assert_int_equal(finish_echo(a, &s, out, sizeof(out)), 0);
    assert_string_equal(out, "first");
    /* the deadline holds for a call collected late */
    struct pf_rpc_pending *e = start_echo("slow", 100);
    assert_int_equal(finish_echo(e, &s, out, sizeof(out)), -ETIMEDOUT);
    assert_int_equal(s.code, PF_GRPC_DEADLINE_EXCEEDED);
    /* a caller that no longer wants the answer */
    struct pf_rpc_pending *f = start_echo("slow", 5000);
    assert_int_equal(pf_rpc_unary_finish(f, &pegaflow__unregister_response__descriptor, NULL, &s),
                     -ECANCELED);
    assert_int_equal(s.code, PF_GRPC_CANCELLED);
    check_outcomes();
}

/* The server's channel to the MetaServer and to peers: every outcome as on a plain one. */
static void test_lean_open(void **st)
{
    struct pf_rpc_channel *lean;
    assert_int_equal(pf_rpc_channel_open_lean(target, &lean), 0);
    struct pf_rpc_channel *plain = ch;
    ch = lean;
    check_outcomes();
    struct pf_rpc_status s;
    char out[64];
    assert_int_equal(finish_echo(start_echo("split", 5000), &s, out, sizeof(out)), 0);
    assert_string_equal(out, "split");
    ch = plain;
    pf_rpc_channel_close(lean);
}

/* The method path is the caller's, and may be gone after the call (libpegaflow builds it in
 * a stack buffer): grpc_channel_create_call refs the slice it is given, and chttp2's HPACK
 * compressor keeps the :path of earlier calls to index repeats, so a path handed over as a
 * static slice was compared, calls later, against whatever that buffer held by then (a
 * stack-buffer-overflow under ASan; a wrong method on the wire when the buffer held the next
 * path). Each call here reuses one buffer for another method, on a lean and a plain channel. */
static void test_transient_path(void **st)
{
    const struct pf_rpc_channel_opts o = {.lean_calls = true};
    struct pf_rpc_channel *chans[2] = {ch, NULL};
    assert_int_equal(pf_rpc_channel_open_opts(target, &o, &chans[1]), 0);
    Pegaflow__UnregisterRequest req = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    req.instance_id = "path";
    for (int c = 0; c < 2; c++) {
        char *path = malloc(64);
        for (int i = 0; i < 6; i++) {
            bool served = i % 2 == 0;
            snprintf(path, 64, "/pegaflow.Engine/%s", served ? "UnregisterContext" : "Unregister");
            struct pf_rpc_status s;
            ProtobufCMessage *resp = NULL;
            int rc = pf_rpc_unary(chans[c], path, &req.base,
                                  &pegaflow__unregister_response__descriptor, 5000, &resp, &s);
            if (served) {
                assert_int_equal(rc, 0);
                protobuf_c_message_free_unpacked(resp, NULL);
            } else {
                assert_int_equal(rc, -EOPNOTSUPP);
                assert_non_null(strstr(s.msg, "unknown method /pegaflow.Engine/Unregister"));
            }
            memset(path, 'x', 63); /* what the caller does with its buffer after the call */
        }
        free(path);
    }
    pf_rpc_channel_close(chans[1]);
}

static void test_malformed_and_unknown(void **st)
{
    struct pf_rpc_status s;
    /* an IpcTensor's field 1 is a varint: not a string, so UnregisterRequest fails to decode */
    Pegaflow__IpcTensor bad = PEGAFLOW__IPC_TENSOR__INIT;
    bad.kind = PEGAFLOW__IPC_TENSOR__KIND__SIM_SHM;
    ProtobufCMessage *resp = NULL;
    assert_int_equal(pf_rpc_unary(ch, "/pegaflow.Engine/UnregisterContext", &bad.base,
                                  &pegaflow__unregister_response__descriptor, 5000, &resp, &s),
                     -EINVAL);
    assert_non_null(strstr(s.msg, "malformed UnregisterRequest"));
    Pegaflow__HealthRequest h = PEGAFLOW__HEALTH_REQUEST__INIT;
    /* a method of the service this test server does not serve */
    assert_int_equal(pf_rpc_unary(ch, "/pegaflow.Engine/Save", &h.base,
                                  &pegaflow__save_response__descriptor, 5000, &resp, &s),
                     -EOPNOTSUPP);
    assert_non_null(strstr(s.msg, "unknown method /pegaflow.Engine/Save"));
    assert_int_equal(pf_rpc_unary(ch, "/pegaflow.Engine/Nope", &h.base,
                                  &pegaflow__save_response__descriptor, 5000, &resp, &s),
                     -EOPNOTSUPP);
    assert_non_null(strstr(s.msg, "unknown method /pegaflow.Engine/Nope"));
}

static void test_parked_stream(void **st)
{
    Pegaflow__SessionRequest r = PEGAFLOW__SESSION_REQUEST__INIT;
    r.instance_id = "";
    struct pf_rpc_stream *s;
    struct pf_rpc_status stt;
    assert_int_equal(pf_rpc_stream_open(ch, "/pegaflow.Engine/Session", &r.base, 5000, &s, &stt),
                     -EINVAL);
    assert_string_equal(stt.msg, "instance_id must not be empty");
    r.instance_id = "i";
    for (int round = 0; round < 3; round++) {
        assert_int_equal(
            pf_rpc_stream_open(ch, "/pegaflow.Engine/Session", &r.base, 5000, &s, &stt), 0);
        assert_true(pf_rpc_stream_alive(s));
        pf_rpc_stream_close(s);
        uint64_t dl = pf_now_ns() + 5 * PF_NS_PER_SEC;
        for (;;) {
            pthread_mutex_lock(&mu);
            int c = closed;
            pthread_mutex_unlock(&mu);
            if (c == round + 1 || pf_now_ns() > dl)
                break;
            pf_sleep_ms(5);
        }
        pthread_mutex_lock(&mu);
        assert_int_equal(opened, round + 1);
        assert_int_equal(closed, round + 1);
        assert_int_equal(closed_cancelled, round + 1);
        pthread_mutex_unlock(&mu);
    }
    /* a stream still open when the server stops is closed (cancelled) exactly once */
    assert_int_equal(pf_rpc_stream_open(ch, "/pegaflow.Engine/Session", &r.base, 5000, &s, &stt),
                     0);
    pf_rpc_server_stop(srv);
    srv = NULL;
    pthread_mutex_lock(&mu);
    assert_int_equal(closed, 4);
    pthread_mutex_unlock(&mu);
    uint64_t dl = pf_now_ns() + 5 * PF_NS_PER_SEC;
    while (pf_rpc_stream_alive(s) && pf_now_ns() < dl)
        pf_sleep_ms(5);
    assert_false(pf_rpc_stream_alive(s));
    pf_rpc_stream_close(s);
    pf_rpc_channel_close(ch);
    setup(NULL); /* restart for later tests */
}

static void test_busy_port(void **st)
{
    struct pf_rpc_server_config c = {
        .addr = target, .threads = 1, .methods = methods, .nmethods = 1};
    struct pf_rpc_server *s2;
    char err[200];
    assert_int_equal(pf_rpc_server_start(&c, &s2, NULL, err, sizeof(err)), -EADDRINUSE);
    assert_non_null(strstr(err, "cannot bind"));
    c.addr = "nohost";
    assert_int_equal(pf_rpc_server_start(&c, &s2, NULL, err, sizeof(err)), -EINVAL);
}

static void test_mappings(void **st)
{
    assert_int_equal(pf_grpc_code_from_errno(-EINVAL), PF_GRPC_INVALID_ARGUMENT);
    assert_int_equal(pf_grpc_code_from_errno(-ENOENT), PF_GRPC_FAILED_PRECONDITION);
    assert_int_equal(pf_grpc_code_from_errno(-EPERM), PF_GRPC_FAILED_PRECONDITION);
    assert_int_equal(pf_grpc_code_from_errno(-ESTALE), PF_GRPC_FAILED_PRECONDITION);
    assert_int_equal(pf_grpc_code_from_errno(-ENOMEM), PF_GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(pf_grpc_code_from_errno(-EIO), PF_GRPC_INTERNAL);
    assert_int_equal(pf_grpc_code_from_errno(-ETIMEDOUT), PF_GRPC_DEADLINE_EXCEEDED);
    assert_int_equal(pf_grpc_code_from_errno(0), PF_GRPC_OK);
    for (int c = 0; c <= 16; c++) {
        int e = pf_errno_from_grpc_code(c);
        assert_true(c == 0 ? e == 0 : e < 0);
    }
    assert_int_equal(pf_errno_from_grpc_code(PF_GRPC_UNAVAILABLE), -ECONNREFUSED);
    assert_int_equal(pf_errno_from_grpc_code(PF_GRPC_FAILED_PRECONDITION), -EPERM);
    assert_string_equal(pf_grpc_code_name(9), "FAILED_PRECONDITION");
    assert_string_equal(pf_grpc_code_name(99), "UNKNOWN");
}

/* docs/server.md "Error codes" and pf_errno_codes are the same table, row for row. */
static void test_errno_table_matches_docs(void **st)
{
    const char *top = getenv("PF_TOP");
    assert_non_null(top); /* set by tests/run.sh; a run without it must not pass */
    char path[1024];
    snprintf(path, sizeof(path), "%s/docs/server.md", top);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    size_t rows = 0;
    bool seen[64] = {false};
    assert_true(pf_errno_ncodes <= 64);
    while (fgets(line, sizeof(line), f)) {
        char en[32], code[40];
        if (sscanf(line, "| `%31[A-Z0-9]` | `%39[A-Z_]` |", en, code) != 2)
            continue;
        int err;
        assert_int_equal(pf_errno_parse(en, &err), 0);
        int got = pf_grpc_code_from_errno(-err);
        if (strcmp(pf_grpc_code_name(got), code) != 0)
            fail_msg("docs say %s -> %s, the code says %s", en, code, pf_grpc_code_name(got));
        for (size_t i = 0; i < pf_errno_ncodes; i++)
            if (pf_errno_codes[i].err == err)
                seen[i] = true;
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, pf_errno_ncodes);
    for (size_t i = 0; i < pf_errno_ncodes; i++)
        if (!seen[i])
            fail_msg("errno %s is in pf_errno_codes but not in docs/server.md",
                     pf_errno_name(pf_errno_codes[i].err));
}

static void test_metrics_render(void **st)
{
    struct pf_metric *c = pf_metric_counter("t_things", "Things\nseen", "kind");
    pf_child_add(pf_metric_child1(c, "a\"b"), 3);
    struct pf_metric *t = pf_metric_counter("t_done_total", "Done", NULL);
    pf_metric_add(t, 1);
    const double b[] = {1, 10};
    struct pf_metric *h = pf_metric_histogram("t_lat_seconds", "Latency", NULL, b, 2);
    pf_metric_observe(h, 0.5);
    pf_metric_observe(h, 5);
    pf_metric_observe(h, 50);
    assert_ptr_equal(pf_metric_counter("t_things", "x", "kind"), c); /* idempotent */
    assert_null(pf_metric_gauge("t_things", "x", NULL));             /* kind conflict */
    char *out;
    size_t len;
    assert_int_equal(pf_metrics_render(&out, &len), 0);
    assert_non_null(strstr(out, "# TYPE t_things_total counter\n"));
    assert_non_null(strstr(out, "t_things_total{kind=\"a\\\"b\"} 3\n"));
    assert_non_null(strstr(out, "\nt_done_total 1\n")); /* no double _total */
    assert_non_null(strstr(out, "t_lat_seconds_bucket{le=\"1\"} 1\n"));
    assert_non_null(strstr(out, "t_lat_seconds_bucket{le=\"10\"} 2\n"));
    assert_non_null(strstr(out, "t_lat_seconds_bucket{le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(out, "t_lat_seconds_sum 55.5\n"));
    assert_non_null(strstr(out, "t_lat_seconds_count 3\n"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),          cmocka_unit_test(test_malformed_and_unknown),
        cmocka_unit_test(test_parked_stream),  cmocka_unit_test(test_busy_port),
        cmocka_unit_test(test_mappings),       cmocka_unit_test(test_errno_table_matches_docs),
        cmocka_unit_test(test_metrics_render), cmocka_unit_test(test_lean_calls),
        cmocka_unit_test(test_transient_path), cmocka_unit_test(test_split_phase),
        cmocka_unit_test(test_lean_open),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

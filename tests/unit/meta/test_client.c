/* MetaServer client against an in-process MetaServer (store + gRPC service on a port of
 * 127.0.0.1): registration through the queue, resync after a session loss and after a
 * MetaServer restart, periodic refresh, reclaimable hints, queue full while the MetaServer
 * hangs, drops while it is absent, queries, UnregisterNode on stop, malformed calls.
 * Conditions are awaited with deadlines, never with fixed sleeps. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "pf/meta_client.h"
#include "pf/metrics.h"
#include "pf/util.h"

#define ADDR "10.9.8.7:50055"

struct srv {
    struct pf_meta_store *st;
    struct pf_rpc_server *rpc;
    int port;
};

static void srv_start(struct srv *s, int port)
{
    struct pf_meta_store_config cfg = {.node_stale_secs = 2, .ttl_secs = 3600};
    assert_int_equal(pf_meta_store_create(&cfg, &s->st), 0);
    char addr[64], err[256];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    struct pf_rpc_server_config rc = {.addr = addr,
                                      .threads = 2,
                                      .methods = pf_meta_methods,
                                      .nmethods = pf_meta_nmethods,
                                      .ctx = s->st,
                                      .metric_prefix = "pegaflow_metaserver"};
    int rcode = -1;
    for (int tries = 0; tries < 50 && rcode; tries++) {
        rcode = pf_rpc_server_start(&rc, &s->rpc, &s->port, err, sizeof(err));
        if (rcode)
            pf_sleep_ms(100); /* the old socket of a restarted server may linger */
    }
    assert_int_equal(rcode, 0);
}

static void srv_stop(struct srv *s)
{
    pf_rpc_server_stop(s->rpc);
    pf_meta_store_destroy(s->st);
    s->rpc = NULL;
    s->st = NULL;
}

/* resident set shared with the client's callbacks */
struct resident {
    pthread_mutex_t mu;
    int lo, hi;
    int reclaimed;
    char last_reclaimed[32];
};

static int enum_resident(void *ctx, pf_meta_emit_fn emit, void *ectx)
{
    struct resident *r = ctx;
    pthread_mutex_lock(&r->mu);
    for (int i = r->lo; i <= r->hi; i++) {
        char k[32];
        int l = snprintf(k, sizeof(k), "blk-%d", i);
        emit(ectx, "ns", k, (size_t)l);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void apply_recl(void *ctx, const char *ns, const struct pf_meta_hash *h, size_t n)
{
    struct resident *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->reclaimed += (int)n;
    snprintf(r->last_reclaimed, sizeof(r->last_reclaimed), "%.*s", (int)h[0].len, h[0].data);
    pthread_mutex_unlock(&r->mu);
}

static struct pf_meta_client *client(int port, struct resident *r, size_t depth, uint64_t refresh,
                                     uint64_t timeout_ms)
{
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    struct pf_meta_client_config cfg = {.target = target,
                                        .advertise_addr = ADDR,
                                        .queue_depth = depth,
                                        .stale_secs_hint = 2,
                                        .refresh_interval_secs = refresh,
                                        .rpc_timeout_ms = timeout_ms,
                                        .apply_reclaimable = r ? apply_recl : NULL,
                                        .enumerate_resident = r ? enum_resident : NULL,
                                        .cb_ctx = r};
    struct pf_meta_client *c;
    assert_int_equal(pf_meta_client_create(&cfg, &c), 0);
    return c;
}

/* prefix_len of ADDR over blk-lo..blk-hi in the store */
static uint64_t visible(struct pf_meta_store *st, int lo, int hi)
{
    char kb[256][32];
    struct pf_meta_hash h[256];
    for (int i = lo; i <= hi; i++) {
        int l = snprintf(kb[i - lo], 32, "blk-%d", i);
        h[i - lo] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[i - lo]};
    }
    struct pf_meta_prefix *res;
    size_t nres;
    if (pf_meta_store_query_prefix(st, "ns", h, (size_t)(hi - lo + 1), &res, &nres))
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < nres; i++)
        if (strcmp(res[i].node, ADDR) == 0)
            v = res[i].prefix_len;
    free(res);
    return v;
}

static bool wait_visible(struct pf_meta_store *st, int lo, int hi, uint64_t want)
{
    uint64_t dl = pf_now_ns() + 20 * PF_NS_PER_SEC;
    while (pf_now_ns() < dl) {
        if (visible(st, lo, hi) == want)
            return true;
        pf_sleep_ms(20);
    }
    printf("visible(%d..%d) = %llu, want %llu\n", lo, hi, (unsigned long long)visible(st, lo, hi),
           (unsigned long long)want);
    return false;
}

static double metric(const char *name)
{
    return pf_metric_value_of(name, NULL);
}

static bool wait_metric_above(const char *name, double v)
{
    uint64_t dl = pf_now_ns() + 20 * PF_NS_PER_SEC;
    while (pf_now_ns() < dl) {
        if (metric(name) > v)
            return true;
        pf_sleep_ms(20);
    }
    return false;
}

static int insert_range(struct pf_meta_client *c, int lo, int hi, bool remove)
{
    char kb[256][32];
    struct pf_meta_hash h[256];
    for (int i = lo; i <= hi; i++) {
        int l = snprintf(kb[i - lo], 32, "blk-%d", i);
        h[i - lo] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[i - lo]};
    }
    return remove ? pf_meta_client_remove(c, "ns", h, (size_t)(hi - lo + 1))
                  : pf_meta_client_insert(c, "ns", h, (size_t)(hi - lo + 1));
}

static void test_register_and_remove(void **state)
{
    struct srv s = {0};
    srv_start(&s, 0);
    struct pf_meta_client *c = client(s.port, NULL, 0, 0, 0);
    /* commands drained before the first session are dropped (no resident set here) */
    uint64_t dl = pf_now_ns() + 20 * PF_NS_PER_SEC;
    while (!pf_meta_client_connected(c) && pf_now_ns() < dl)
        pf_sleep_ms(10);
    assert_true(pf_meta_client_connected(c));
    double blocks0 = metric("pegaflow_metaserver_registration_blocks");
    assert_int_equal(insert_range(c, 0, 99, false), 0);
    assert_int_equal(pf_meta_client_flush(c, 10000), 0);
    assert_true(wait_visible(s.st, 0, 99, 100));
    assert_true(pf_meta_client_connected(c));
    assert_true(metric("pegaflow_metaserver_registration_blocks") >= blocks0 + 100);
    /* insert+remove of the same key in one round nets to the last write */
    assert_int_equal(insert_range(c, 50, 59, true), 0);
    assert_int_equal(insert_range(c, 55, 59, false), 0);
    assert_int_equal(pf_meta_client_flush(c, 10000), 0);
    assert_true(wait_visible(s.st, 0, 99, 50));
    assert_int_equal(visible(s.st, 55, 99), 45);
    /* queries through the client */
    char kb[3][16] = {"blk-0", "blk-1", "nope"};
    struct pf_meta_hash q[3] = {
        {5, (uint8_t *)kb[0]}, {5, (uint8_t *)kb[1]}, {4, (uint8_t *)kb[2]}};
    struct pf_meta_prefix *res;
    size_t nres;
    assert_int_equal(pf_meta_client_query_prefix(c, "ns", q, 3, 5000, &res, &nres), 0);
    assert_int_equal(nres, 1);
    assert_string_equal(res[0].node, ADDR);
    assert_int_equal(res[0].prefix_len, 2);
    assert_int_equal(pf_meta_prefix_best(res, nres, NULL), 0);
    assert_int_equal(pf_meta_prefix_best(res, nres, ADDR), -1);
    free(res);
    assert_int_equal(pf_meta_client_query_prefix(c, "ns", q, 0, 5000, &res, &nres), -EINVAL);
    /* split phase: two in flight on this thread, collected in reverse; one dropped */
    struct pf_meta_query *qa, *qb, *qc;
    assert_int_equal(pf_meta_client_query_prefix_start(c, "ns", q, 3, 5000, &qa), 0);
    assert_int_equal(pf_meta_client_query_prefix_start(c, "ns", q + 1, 2, 5000, &qb), 0);
    assert_int_equal(pf_meta_client_query_prefix_start(c, "ns", q, 2, 5000, &qc), 0);
    assert_int_equal(pf_meta_client_query_prefix_finish(qc, NULL, NULL), -ECANCELED);
    assert_int_equal(pf_meta_client_query_prefix_finish(qb, &res, &nres), 0);
    assert_int_equal(nres, 1);
    assert_int_equal(res[0].prefix_len, 1); /* blk-1, then nope */
    free(res);
    assert_int_equal(pf_meta_client_query_prefix_finish(qa, &res, &nres), 0);
    assert_int_equal(nres, 1);
    assert_string_equal(res[0].node, ADDR);
    assert_int_equal(res[0].prefix_len, 2);
    free(res);
    assert_int_equal(pf_meta_client_query_prefix_start(c, "ns", q, 0, 5000, &qa), -EINVAL);
    assert_int_equal(pf_meta_client_query_prefix_start(c, "", q, 1, 5000, &qa), -EINVAL);
    /* stop unregisters: nothing of ours is left */
    pf_meta_client_destroy(c);
    struct pf_meta_store_stats ss;
    pf_meta_store_get_stats(s.st, &ss);
    assert_int_equal(ss.owners, 0);
    srv_stop(&s);
}

/* The resync counter is added once a resync finished, after its blocks are already visible:
 * wait for it (bounded) instead of reading it once. */
static bool wait_metric_at_least(const char *name, double want)
{
    uint64_t dl = pf_now_ns() + 20 * PF_NS_PER_SEC;
    while (pf_now_ns() < dl) {
        if (metric(name) >= want)
            return true;
        pf_sleep_ms(20);
    }
    printf("%s = %g, want >= %g\n", name, metric(name), want);
    return false;
}

static void test_resync_after_session_loss(void **state)
{
    struct srv s = {0};
    srv_start(&s, 0);
    struct resident r = {.mu = PTHREAD_MUTEX_INITIALIZER, .lo = 0, .hi = 199};
    double resets0 = metric("pegaflow_metaserver_session_resets");
    double resync0 = metric("pegaflow_metaserver_resync_blocks");
    struct pf_meta_client *c = client(s.port, &r, 0, 0, 0);
    /* first contact registers the resident set without any insert call */
    assert_true(wait_visible(s.st, 0, 199, 200));
    /* the MetaServer forgets the node (as if it had been dropped) */
    uint8_t id[16];
    assert_int_equal(pf_uuid_parse(pf_meta_client_node_id(c), id), 0);
    uint64_t removed;
    assert_int_equal(pf_meta_store_unregister(s.st, ADDR, id, &removed), 0);
    assert_int_equal(removed, 200);
    assert_int_equal(visible(s.st, 0, 199), 0);
    /* the session probe notices, the session is reset and everything is re-registered */
    assert_true(wait_visible(s.st, 0, 199, 200));
    assert_true(metric("pegaflow_metaserver_session_resets") >= resets0 + 1);
    assert_true(wait_metric_at_least("pegaflow_metaserver_resync_blocks", resync0 + 400));
    pf_meta_client_destroy(c);
    srv_stop(&s);
}

static void test_resync_after_restart(void **state)
{
    struct srv s = {0};
    srv_start(&s, 0);
    int port = s.port;
    struct resident r = {.mu = PTHREAD_MUTEX_INITIALIZER, .lo = 0, .hi = 99};
    struct pf_meta_client *c = client(port, &r, 0, 0, 0);
    assert_true(wait_visible(s.st, 0, 99, 100));
    /* blocks saved later through the queue are part of the resident set too */
    assert_int_equal(insert_range(c, 100, 149, false), 0);
    pthread_mutex_lock(&r.mu);
    r.hi = 149;
    pthread_mutex_unlock(&r.mu);
    assert_int_equal(pf_meta_client_flush(c, 10000), 0);
    assert_true(wait_visible(s.st, 0, 149, 150));
    /* restart: a new, empty MetaServer on the same port */
    srv_stop(&s);
    srv_start(&s, port);
    assert_int_equal(visible(s.st, 0, 149), 0);
    assert_true(wait_visible(s.st, 0, 149, 150));
    pf_meta_client_destroy(c);
    srv_stop(&s);
}

static void test_refresh(void **state)
{
    struct srv s = {0};
    srv_start(&s, 0);
    struct resident r = {.mu = PTHREAD_MUTEX_INITIALIZER, .lo = 0, .hi = 9};
    double refresh0 = metric("pegaflow_metaserver_refresh_blocks");
    struct pf_meta_client *c = client(s.port, &r, 0, 1, 0);
    assert_true(wait_visible(s.st, 0, 9, 10));
    assert_true(wait_metric_above("pegaflow_metaserver_refresh_blocks", refresh0 + 19));
    pf_meta_client_destroy(c);
    srv_stop(&s);
}

static void test_reclaimable_hint(void **state)
{
    struct srv s = {0};
    srv_start(&s, 0);
    const char *nodes[] = {"p1:1", "p2:1", "p3:1"};
    uint8_t ids[3][16] = {{1}, {2}, {3}};
    struct pf_meta_hash k = {5, (const uint8_t *)"blk-7"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pf_meta_store_heartbeat(s.st, nodes[i], ids[i]), 0);
        assert_int_equal(pf_meta_store_insert(s.st, "ns", &k, 1, nodes[i], ids[i], NULL), 0);
    }
    struct resident r = {.mu = PTHREAD_MUTEX_INITIALIZER, .lo = 0, .hi = -1};
    struct pf_meta_client *c = client(s.port, &r, 0, 0, 0);
    uint64_t dl = pf_now_ns() + 20 * PF_NS_PER_SEC;
    while (!pf_meta_client_connected(c) && pf_now_ns() < dl)
        pf_sleep_ms(10);
    for (int i = 0; i < 3; i++) /* keep the three peers fresh */
        assert_int_equal(pf_meta_store_heartbeat(s.st, nodes[i], ids[i]), 0);
    assert_int_equal(pf_meta_client_insert(c, "ns", &k, 1), 0);
    assert_int_equal(pf_meta_client_flush(c, 10000), 0);
    /* the hint is applied on the client thread before the flush is acknowledged */
    pthread_mutex_lock(&r.mu);
    int got = r.reclaimed;
    pthread_mutex_unlock(&r.mu);
    assert_int_equal(got, 1);
    assert_string_equal(r.last_reclaimed, "blk-7");
    pf_meta_client_destroy(c);
    srv_stop(&s);
}

/* A MetaServer that completes the HTTP/2 handshake (it sends SETTINGS and acknowledges the
 * client's) but never answers a call: every RPC to it waits for its deadline. */
struct hole {
    int lfd, port;
    int stop[2];
    pthread_t th;
    _Atomic size_t rx; /* bytes received: a call is in flight once the client spoke */
};

static void *hole_main(void *arg)
{
    struct hole *h = arg;
    static const uint8_t settings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
    static const uint8_t ack[9] = {0, 0, 0, 4, 1, 0, 0, 0, 0};
    int conns[64], nconns = 0;
    for (;;) {
        struct pollfd p[66];
        p[0] = (struct pollfd){.fd = h->stop[0], .events = POLLIN};
        p[1] = (struct pollfd){.fd = h->lfd, .events = POLLIN};
        for (int i = 0; i < nconns; i++)
            p[2 + i] = (struct pollfd){.fd = conns[i], .events = POLLIN};
        if (poll(p, (nfds_t)(2 + nconns), -1) < 0)
            continue;
        if (p[0].revents)
            break;
        if ((p[1].revents & POLLIN) && nconns < 64) {
            int fd = accept(h->lfd, NULL, NULL);
            if (fd >= 0) {
                /* a failed write means the client went away: poll sees the hang-up */
                bool sent = write(fd, settings, sizeof(settings)) == (ssize_t)sizeof(settings) &&
                            write(fd, ack, sizeof(ack)) == (ssize_t)sizeof(ack);
                (void)sent;
                conns[nconns++] = fd;
            }
        }
        for (int i = 0; i < nconns; i++) {
            if (!(p[2 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[4096];
            ssize_t r = read(conns[i], buf, sizeof(buf));
            if (r > 0)
                atomic_fetch_add(&h->rx, (size_t)r);
            if (r <= 0) {
                close(conns[i]);
                conns[i] = conns[--nconns];
                break; /* poll again with the shrunk set */
            }
        }
    }
    for (int i = 0; i < nconns; i++)
        close(conns[i]);
    return NULL;
}

static void hole_start(struct hole *h)
{
    h->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(h->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(h->lfd, 16), 0);
    socklen_t l = sizeof(a);
    getsockname(h->lfd, (struct sockaddr *)&a, &l);
    h->port = ntohs(a.sin_port);
    assert_int_equal(pipe(h->stop), 0);
    assert_int_equal(pthread_create(&h->th, NULL, hole_main, h), 0);
}

static void hole_stop(struct hole *h)
{
    assert_int_equal(write(h->stop[1], "x", 1), 1);
    pthread_join(h->th, NULL);
    close(h->stop[0]);
    close(h->stop[1]);
    close(h->lfd);
}

static void test_hung_metaserver_never_blocks_callers(void **state)
{
    struct hole h = {0};
    hole_start(&h);
    double full0 = metric("pegaflow_metaserver_registration_queue_full");
    double rfull0 = metric("pegaflow_metaserver_removal_queue_full");
    /* the thread's first heartbeat hangs until its 5 s deadline */
    struct pf_meta_client *c = client(h.port, NULL, 4, 0, 5000);
    uint64_t dl = pf_now_ns() + 10 * PF_NS_PER_SEC;
    while (atomic_load(&h.rx) == 0 && pf_now_ns() < dl)
        pf_sleep_ms(5);
    assert_true(atomic_load(&h.rx) > 0); /* the thread is inside its heartbeat RPC */
    int ok = 0, full = 0;
    uint64_t worst = 0;
    for (int i = 0; i < 200; i++) {
        uint64_t t0 = pf_now_ns();
        int rc = insert_range(c, i, i + 15, i % 2 == 1);
        uint64_t dt = pf_now_ns() - t0;
        worst = dt > worst ? dt : worst;
        if (rc == 0)
            ok++;
        else if (rc == -EAGAIN)
            full++;
        else
            fail_msg("unexpected rc %d", rc);
    }
    /* the thread is still inside its first RPC: nothing was drained, nothing failed yet */
    assert_false(pf_meta_client_connected(c));
    assert_int_equal(ok, 4);
    assert_int_equal(full, 196);
    assert_true(metric("pegaflow_metaserver_registration_queue_full") +
                    metric("pegaflow_metaserver_removal_queue_full") >=
                full0 + rfull0 + 196);
    printf("200 enqueues against a hung MetaServer: worst call %.1f us\n", (double)worst / 1e3);
    pf_meta_client_destroy(c); /* waits for the hung heartbeat's deadline */
    hole_stop(&h);
}

static void test_absent_then_present(void **state)
{
    struct srv s = {0};
    srv_start(&s, 0);
    int port = s.port;
    srv_stop(&s); /* nothing listens on port now */
    struct resident r = {.mu = PTHREAD_MUTEX_INITIALIZER, .lo = 0, .hi = 29};
    double fail0 = metric("pegaflow_metaserver_registration_failures");
    double hbf0 = metric("pegaflow_metaserver_heartbeat_failures");
    struct pf_meta_client *c = client(port, &r, 0, 0, 0);
    assert_true(wait_metric_above("pegaflow_metaserver_heartbeat_failures", hbf0));
    assert_int_equal(insert_range(c, 0, 29, false), 0);
    assert_int_equal(pf_meta_client_flush(c, 10000), 0);
    /* attempted while no session: dropped and counted */
    assert_true(metric("pegaflow_metaserver_registration_failures") >= fail0 + 30);
    assert_false(pf_meta_client_connected(c));
    /* queries fail with an error, they do not hang */
    struct pf_meta_hash q = {5, (const uint8_t *)"blk-0"};
    struct pf_meta_prefix *res;
    size_t nres;
    assert_true(pf_meta_client_query_prefix(c, "ns", &q, 1, 2000, &res, &nres) < 0);
    /* the MetaServer comes up: the backoff heartbeat finds it, resync registers all */
    srv_start(&s, port);
    assert_true(wait_visible(s.st, 0, 29, 30));
    pf_meta_client_destroy(c);
    srv_stop(&s);
}

/* Two replicas (two gRPC servers over one store, as two MetaServers over one Redis): the
 * client sticks to the first; when it dies queries go to the second at once, registration
 * follows (resync re-registers what the lost round dropped), the switch is counted. */
static void rpc_on(struct srv *s, struct pf_meta_store *st)
{
    char err[256];
    struct pf_rpc_server_config rc = {.addr = "127.0.0.1:0",
                                      .threads = 2,
                                      .methods = pf_meta_methods,
                                      .nmethods = pf_meta_nmethods,
                                      .ctx = st,
                                      .metric_prefix = "pegaflow_metaserver"};
    assert_int_equal(pf_rpc_server_start(&rc, &s->rpc, &s->port, err, sizeof(err)), 0);
}

static uint64_t query_len(struct pf_meta_client *c, int hi, bool split)
{
    char kb[64][32];
    struct pf_meta_hash h[64];
    for (int i = 0; i <= hi; i++) {
        int l = snprintf(kb[i], 32, "blk-%d", i);
        h[i] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[i]};
    }
    struct pf_meta_prefix *res;
    size_t nres;
    struct pf_meta_query *q;
    /* split phase (the query-time plan's way): the failover happens inside finish */
    if (split && pf_meta_client_query_prefix_start(c, "ns", h, (size_t)hi + 1, 5000, &q))
        return UINT64_MAX;
    if (split ? pf_meta_client_query_prefix_finish(q, &res, &nres)
              : pf_meta_client_query_prefix(c, "ns", h, (size_t)hi + 1, 5000, &res, &nres))
        return UINT64_MAX;
    uint64_t v = nres ? res[0].prefix_len : 0;
    free(res);
    return v;
}

static void test_failover_between_replicas(void **state)
{
    struct srv a = {0}, b = {0};
    srv_start(&a, 0);
    rpc_on(&b, a.st);
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d,127.0.0.1:%d", a.port, b.port);
    struct resident r = {.mu = PTHREAD_MUTEX_INITIALIZER, .lo = 0, .hi = 19};
    struct pf_meta_client_config cfg = {.target = target,
                                        .advertise_addr = ADDR,
                                        .stale_secs_hint = 2,
                                        .refresh_interval_secs = UINT64_MAX,
                                        .enumerate_resident = enum_resident,
                                        .cb_ctx = &r};
    struct pf_meta_client *c;
    assert_int_equal(pf_meta_client_create(&cfg, &c), 0);
    assert_true(wait_visible(a.st, 0, 19, 20));
    assert_int_equal(query_len(c, 19, false), 20);
    double fo0 = metric("pegaflow_metaserver_failovers");
    pf_rpc_server_stop(a.rpc); /* replica A dies; the store lives on behind B */
    a.rpc = NULL;
    assert_int_equal(query_len(c, 19, true), 20); /* retried on B within the call */
    assert_true(metric("pegaflow_metaserver_failovers") >= fo0 + 1);
    pthread_mutex_lock(&r.mu);
    r.hi = 39;
    pthread_mutex_unlock(&r.mu);
    assert_int_equal(insert_range(c, 20, 39, false), 0);
    assert_true(wait_visible(a.st, 0, 39, 40));
    assert_int_equal(query_len(c, 39, false), 40);
    /* both gone: queries fail promptly with an error */
    pf_rpc_server_stop(b.rpc);
    b.rpc = NULL;
    assert_true(query_len(c, 0, false) == UINT64_MAX);
    assert_true(query_len(c, 0, true) == UINT64_MAX);
    pf_meta_client_destroy(c);
    srv_stop(&a);
}

static void test_malformed_api(void **state)
{
    struct pf_meta_client *c;
    struct pf_meta_client_config cfg = {.target = NULL, .advertise_addr = ADDR};
    assert_int_equal(pf_meta_client_create(&cfg, &c), -EINVAL);
    cfg.target = "127.0.0.1:1";
    cfg.advertise_addr = "";
    assert_int_equal(pf_meta_client_create(&cfg, &c), -EINVAL);
    cfg.advertise_addr = ADDR;
    cfg.queue_depth = (1u << 24) + 1;
    assert_int_equal(pf_meta_client_create(&cfg, &c), -EINVAL);
    cfg.queue_depth = 0;
    cfg.rpc_timeout_ms = 500;
    assert_int_equal(pf_meta_client_create(&cfg, &c), 0);
    struct pf_meta_hash good = {1, (const uint8_t *)"x"},
                        bad[2] = {{1, (const uint8_t *)"x"}, {0, (const uint8_t *)""}};
    assert_int_equal(pf_meta_client_insert(c, "ns", &good, 0), -EINVAL);
    assert_int_equal(pf_meta_client_insert(c, "", &good, 1), -EINVAL);
    assert_int_equal(pf_meta_client_insert(c, NULL, &good, 1), -EINVAL);
    assert_int_equal(pf_meta_client_remove(c, "ns", bad, 2), -EINVAL);
    assert_int_equal(pf_meta_client_insert(c, "ns", &good, 1), 0);
    pf_meta_client_stop(c);
    pf_meta_client_stop(c); /* idempotent */
    assert_int_equal(pf_meta_client_insert(c, "ns", &good, 1), -ESHUTDOWN);
    assert_int_equal(pf_meta_client_flush(c, 100), -ESHUTDOWN);
    pf_meta_client_destroy(c);
    pf_meta_client_destroy(NULL);
}

int main(void)
{
    pf_rpc_global_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_and_remove),
        cmocka_unit_test(test_resync_after_session_loss),
        cmocka_unit_test(test_resync_after_restart),
        cmocka_unit_test(test_refresh),
        cmocka_unit_test(test_reclaimable_hint),
        cmocka_unit_test(test_hung_metaserver_never_blocks_callers),
        cmocka_unit_test(test_absent_then_present),
        cmocka_unit_test(test_failover_between_replicas),
        cmocka_unit_test(test_malformed_api),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pf_rpc_global_shutdown();
    return rc;
}

/* RPC server limits: wire validation before decoding (NUL bytes, string and repeated caps),
 * the decode memory budget, the bounded class of network-waiting handlers (server-wide and
 * per caller) that can never occupy the threads other calls need, call expiry, and the undo
 * of a cancelled call (pf_rpc_call_on_cancel), and the decode arena of large requests
 * (directly and through the server, every byte of a 3 MB request checked). */
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
#include "pf/clock.h"
#include "pf/rpc.h"
#include "pf/thread.h"
#include "rpc/rpc_internal.h"
#include "rpc/validate.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv; /* monotonic (pf_cond_init), as pf_deadline_ms expects */
static int entered, released_flag, saw_expired;
static int undone, undo_bytes_ok, undo_go, reg_rc[3]; /* undo_go: the client gave up */

static int respond_ok(struct pf_rpc_call *call, const char *msg)
{
    Pegaflow__ResponseStatus st = PEGAFLOW__RESPONSE_STATUS__INIT;
    st.ok = 1;
    st.message = (char *)msg;
    Pegaflow__UnregisterResponse resp = PEGAFLOW__UNREGISTER_RESPONSE__INIT;
    resp.status = &st;
    return pf_rpc_respond(call, &resp.base);
}

static int h_echo(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    const Pegaflow__UnregisterRequest *r = (const void *)m;
    return respond_ok(call, r->instance_id);
}

/* a "network" handler that hangs until the test releases it (a peer that never answers) */
static int h_hang(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    pthread_mutex_lock(&mu);
    entered++;
    pthread_cond_broadcast(&cv);
    while (!released_flag)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return respond_ok(call, "released");
}

/* blocks (bounded) until the test saw its client give up */
static void wait_go(void)
{
    struct timespec dl = pf_deadline_ms(10000);
    pthread_mutex_lock(&mu);
    while (!undo_go && pthread_cond_timedwait(&cv, &mu, &dl) == 0)
        ;
    pthread_mutex_unlock(&mu);
}

/* waits (bounded) for its caller's deadline to pass and reports what it saw */
static int h_expiry(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    uint64_t dl = pf_now_ns() + 5000000000ull;
    while (!pf_rpc_call_expired(call) && pf_now_ns() < dl)
        pf_sleep_ms(5);
    pthread_mutex_lock(&mu);
    saw_expired = pf_rpc_call_expired(call) ? 1 : -1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    wait_go(); /* an answer sent before the client's own timer fired would reach it */
    return respond_ok(call, "late");
}

static void undo(void *ctx, const void *arg, size_t len)
{
    static const uint8_t want[16] = "lease-0123456789";
    pthread_mutex_lock(&mu);
    undone++;
    undo_bytes_ok = ctx == (void *)&undone && len == 16 && memcmp(arg, want, 16) == 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* instance_id picks when the undo is registered: "fast" (answer at once), "before" (then
 * block until the caller has given up), "after" (block until then, and until the call
 * counts as expired here too, then register: the undo may run at registration) */
static int h_undo(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    const Pegaflow__UnregisterRequest *r = (const void *)m;
    uint8_t big[PF_RPC_UNDO_MAX + 1] = {0};
    bool after = strcmp(r->instance_id, "after") == 0;
    uint64_t dl = pf_now_ns() + 10000000000ull;
    if (after) {
        wait_go();
        while (!pf_rpc_call_expired(call) && pf_now_ns() < dl)
            pf_sleep_ms(5);
    }
    int a = pf_rpc_call_on_cancel(call, undo, &undone, big, sizeof(big));
    int b = pf_rpc_call_on_cancel(call, undo, &undone, "lease-0123456789", 16);
    int c = pf_rpc_call_on_cancel(call, undo, &undone, "lease-0123456789", 16);
    pthread_mutex_lock(&mu);
    reg_rc[0] = a, reg_rc[1] = b, reg_rc[2] = c;
    pthread_mutex_unlock(&mu);
    if (strcmp(r->instance_id, "before") == 0)
        wait_go();
    return respond_ok(call, "answer");
}

/* Layer name i of the large request: 1000 bytes from (seed, i). */
static void big_name(char *s, uint32_t seed, size_t i)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
    for (size_t j = 0; j < 1000; j++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        s[j] = (char)('a' + x % 26);
    }
    s[1000] = 0;
}

static uint32_t big_seed;

/* checks every name of a large RegisterContextRequest and answers "<n> ok" or the first bad
 * index */
static int h_names(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    const Pegaflow__RegisterContextRequest *r = (const void *)m;
    char want[1001], msg[64];
    size_t bad = SIZE_MAX;
    for (size_t i = 0; i < r->n_layer_names && bad == SIZE_MAX; i++) {
        big_name(want, big_seed, i);
        if (strcmp(r->layer_names[i], want) != 0)
            bad = i;
    }
    if (bad == SIZE_MAX)
        snprintf(msg, sizeof(msg), "%zu ok", r->n_layer_names);
    else
        snprintf(msg, sizeof(msg), "bad at %zu", bad);
    return respond_ok(call, msg);
}

static const struct pf_rpc_method methods[] = {
    {.path = "/pegaflow.Engine/UnregisterContext",
     .metric_name = "echo",
     .req_desc = &pegaflow__unregister_request__descriptor,
     .unary = h_echo},
    {.path = "/pegaflow.Engine/RdmaHandshake",
     .metric_name = "hang",
     .req_desc = &pegaflow__unregister_request__descriptor,
     .unary = h_hang,
     .network = true},
    {.path = "/pegaflow.Engine/Release",
     .metric_name = "expiry",
     .req_desc = &pegaflow__unregister_request__descriptor,
     .unary = h_expiry},
    {.path = "/pegaflow.Engine/QueryPrefetch",
     .metric_name = "undo",
     .req_desc = &pegaflow__unregister_request__descriptor,
     .unary = h_undo},
    {.path = "/pegaflow.Engine/RegisterContextBatch",
     .metric_name = "register",
     .req_desc = &pegaflow__register_context_request__descriptor,
     .unary = h_echo},
    {.path = "/pegaflow.Engine/Save",
     .metric_name = "names",
     .req_desc = &pegaflow__register_context_request__descriptor,
     .unary = h_names},
};

struct srv {
    struct pf_rpc_server *s;
    struct pf_rpc_channel *ch;
};

static void start(struct srv *v, int threads, int net_slots, uint64_t req_memory)
{
    struct pf_rpc_server_config c = {.addr = "127.0.0.1:0",
                                     .threads = threads,
                                     .methods = methods,
                                     .nmethods = sizeof(methods) / sizeof(methods[0]),
                                     .metric_prefix = "pftest",
                                     .network_slots = net_slots,
                                     .request_memory = req_memory};
    char err[200], target[64];
    int port;
    assert_int_equal(pf_rpc_server_start(&c, &v->s, &port, err, sizeof(err)), 0);
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    assert_int_equal(pf_rpc_channel_open(target, &v->ch), 0);
    pthread_mutex_lock(&mu);
    entered = released_flag = saw_expired = undone = undo_bytes_ok = undo_go = 0;
    pthread_mutex_unlock(&mu);
}

static void stop(struct srv *v)
{
    pf_rpc_channel_close(v->ch);
    pf_rpc_server_stop(v->s);
}

static int call(struct srv *v, const char *path, const char *id, uint64_t tmo,
                struct pf_rpc_status *st)
{
    Pegaflow__UnregisterRequest req = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    req.instance_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    int rc = pf_rpc_unary(v->ch, path, &req.base, &pegaflow__unregister_response__descriptor, tmo,
                          &resp, st);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* ---- network-class bound */

#define NCALLERS 64

struct caller {
    struct srv *v;
    pthread_t t;
    int rc;
    struct pf_rpc_status st;
};

static int done_callers;

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    c->rc = call(c->v, "/pegaflow.Engine/RdmaHandshake", "peer", 20000, &c->st);
    pthread_mutex_lock(&mu);
    done_callers++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static bool wait_until(int *var, int want, uint64_t ms)
{
    struct timespec dl = pf_deadline_ms(ms);
    pthread_mutex_lock(&mu);
    while (*var < want && pthread_cond_timedwait(&cv, &mu, &dl) == 0)
        ;
    bool ok = *var >= want;
    pthread_mutex_unlock(&mu);
    return ok;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void run_hanging(int net_slots, int want_in, const char *bound)
{
    struct srv v;
    start(&v, 8, net_slots, 0);
    done_callers = 0;
    struct caller *cs = calloc(NCALLERS, sizeof(*cs));
    for (int i = 0; i < NCALLERS; i++) {
        cs[i].v = &v;
        assert_int_equal(pthread_create(&cs[i].t, NULL, caller_main, &cs[i]), 0);
    }
    /* every caller beyond the bound is answered at once, while the others still hang */
    assert_true(wait_until(&done_callers, NCALLERS - want_in, 15000));
    assert_true(wait_until(&entered, want_in, 15000));
    pthread_mutex_lock(&mu);
    assert_int_equal(entered, want_in);
    assert_int_equal(done_callers, NCALLERS - want_in);
    pthread_mutex_unlock(&mu);
    /* the hanging handlers do not hold the threads other calls need */
    struct pf_rpc_status st;
    uint64_t lat[200];
    for (int i = 0; i < 200; i++) {
        uint64_t t0 = pf_now_ns();
        assert_int_equal(call(&v, "/pegaflow.Engine/UnregisterContext", "local", 5000, &st), 0);
        lat[i] = pf_now_ns() - t0;
    }
    /* a figure for the record, not an assertion: local calls while network handlers hang */
    qsort(lat, 200, sizeof(lat[0]), cmp_u64);
    fprintf(stderr, "local calls with %d hanging network handlers: p50 %.2f ms, p99 %.2f ms\n",
            want_in, lat[100] / 1e6, lat[197] / 1e6);
    pthread_mutex_lock(&mu);
    released_flag = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    int ok = 0, exhausted = 0;
    for (int i = 0; i < NCALLERS; i++) {
        pthread_join(cs[i].t, NULL);
        if (cs[i].rc == 0) {
            ok++;
        } else {
            assert_int_equal(cs[i].st.code, PF_GRPC_RESOURCE_EXHAUSTED);
            assert_non_null(strstr(cs[i].st.msg, bound));
            assert_non_null(strstr(cs[i].st.msg, "too many hang calls"));
            exhausted++;
        }
    }
    assert_int_equal(ok, want_in);
    assert_int_equal(exhausted, NCALLERS - want_in);
    /* slots come back: a new network call enters and completes (released stays set) */
    assert_int_equal(call(&v, "/pegaflow.Engine/RdmaHandshake", "again", 5000, &st), 0);
    free(cs);
    stop(&v);
}

static void test_network_bound_per_caller(void **state)
{
    run_hanging(6, PF_RPC_NET_PER_PEER, "per-caller");
}

static void test_network_bound_server_wide(void **state)
{
    run_hanging(1, 1, "server-wide");
}

/* ---- wire validation through the server */

static void test_nul_and_long_strings(void **state)
{
    struct srv v;
    start(&v, 2, 0, 0);
    /* "<id>\0junk" as field 1: a ReleaseRequest's bytes field has the same number */
    Pegaflow__ReleaseRequest rr = PEGAFLOW__RELEASE_REQUEST__INIT;
    static const char nul[] = "inst\0junk";
    rr.lease.data = (uint8_t *)nul;
    rr.lease.len = sizeof(nul) - 1;
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st;
    int rc = pf_rpc_unary(v.ch, "/pegaflow.Engine/UnregisterContext", &rr.base,
                          &pegaflow__unregister_response__descriptor, 5000, &resp, &st);
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(st.msg, "UnregisterRequest.instance_id contains a NUL byte"));
    char *big = malloc(PF_RPC_MAX_STRING + 2);
    memset(big, 'a', PF_RPC_MAX_STRING + 1);
    big[PF_RPC_MAX_STRING + 1] = '\0';
    assert_int_equal(call(&v, "/pegaflow.Engine/UnregisterContext", big, 5000, &st), -EINVAL);
    assert_non_null(strstr(st.msg, "limited to 1023 bytes"));
    big[PF_RPC_MAX_STRING] = '\0';
    assert_int_equal(call(&v, "/pegaflow.Engine/UnregisterContext", big, 5000, &st), 0);
    free(big);
    stop(&v);
}

static void test_memory_budget(void **state)
{
    struct srv v;
    start(&v, 2, 0, 1 << 20); /* 1 MiB of decode budget: a 600 KB request (x4) cannot fit */
    Pegaflow__RegisterContextRequest r = PEGAFLOW__REGISTER_CONTEXT_REQUEST__INIT;
    size_t n = 600;
    char **names = calloc(n, sizeof(*names));
    for (size_t i = 0; i < n; i++) {
        names[i] = malloc(1001);
        memset(names[i], 'x', 1000);
        snprintf(names[i] + 990, 11, "%010zu", i);
    }
    r.layer_names = names;
    r.n_layer_names = n;
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st;
    int rc = pf_rpc_unary(v.ch, "/pegaflow.Engine/RegisterContextBatch", &r.base,
                          &pegaflow__unregister_response__descriptor, 5000, &resp, &st);
    assert_int_equal(rc, -ENOBUFS);
    assert_int_equal(st.code, PF_GRPC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.msg, "request memory budget"));
    /* the budget is returned: small requests still pass */
    assert_int_equal(call(&v, "/pegaflow.Engine/UnregisterContext", "small", 5000, &st), 0);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    stop(&v);
}

static void test_arena_direct(void **state)
{
    struct pf_rpc_arena a = {0};
    ProtobufCAllocator pa;
    assert_null(pf_rpc_arena_open(&a, &pa, PF_RPC_ARENA_MIN - 1)); /* small: plain malloc */
    assert_null(a.base);
    pf_rpc_arena_close(&a);
    ProtobufCAllocator *al = pf_rpc_arena_open(&a, &pa, PF_RPC_ARENA_MIN);
    assert_non_null(al);
    enum { N = 120 };
    void *p[N + 1];
    for (int i = 0; i < N; i++) { /* 120 x 64 KiB: all but the last 512 KiB */
        p[i] = al->alloc(al->allocator_data, (64u << 10) - 1);
        assert_non_null(p[i]);
        assert_true((char *)p[i] >= a.base && (char *)p[i] < a.base + a.cap);
        assert_int_equal((uintptr_t)p[i] % 16, 0);
        memset(p[i], i, (64u << 10) - 1);
    }
    p[N] = al->alloc(al->allocator_data, 1u << 20); /* past the mapping: malloc */
    assert_non_null(p[N]);
    assert_true((char *)p[N] < a.base || (char *)p[N] >= a.base + a.cap);
    memset(p[N], 7, 1u << 20);
    for (int i = 0; i < N; i++)
        assert_int_equal(((unsigned char *)p[i])[(64u << 10) - 2], i);
    for (int i = 0; i <= N; i++)
        al->free(al->allocator_data, p[i]);
    pf_rpc_arena_close(&a);
    assert_null(a.base);
}

static void test_large_request_decodes(void **state)
{
    struct srv v;
    big_seed = (uint32_t)pf_now_ns(); /* before the RPC threads start: they read it */
    start(&v, 2, 0, 0);
    printf("seed %u\n", big_seed);
    Pegaflow__RegisterContextRequest r = PEGAFLOW__REGISTER_CONTEXT_REQUEST__INIT;
    size_t n = 3000; /* ~3 MB: x4 decode budget is past PF_RPC_ARENA_MIN */
    char **names = calloc(n, sizeof(*names));
    for (size_t i = 0; i < n; i++) {
        names[i] = malloc(1001);
        big_name(names[i], big_seed, i);
    }
    r.layer_names = names;
    r.n_layer_names = n;
    for (int rep = 0; rep < 3; rep++) { /* the arena is unmapped and mapped anew each time */
        ProtobufCMessage *resp = NULL;
        struct pf_rpc_status st;
        int rc = pf_rpc_unary(v.ch, "/pegaflow.Engine/Save", &r.base,
                              &pegaflow__unregister_response__descriptor, 20000, &resp, &st);
        assert_int_equal(rc, 0);
        const Pegaflow__UnregisterResponse *u = (const void *)resp;
        assert_non_null(u->status);
        assert_string_equal(u->status->message, "3000 ok");
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    stop(&v);
}

static void test_expired_call(void **state)
{
    struct srv v;
    start(&v, 2, 0, 0);
    struct pf_rpc_status st;
    assert_int_equal(call(&v, "/pegaflow.Engine/Release", "x", 200, &st), -ETIMEDOUT);
    pthread_mutex_lock(&mu);
    undo_go = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    assert_true(wait_until(&saw_expired, 1, 10000));
    pthread_mutex_lock(&mu);
    assert_int_equal(saw_expired, 1);
    pthread_mutex_unlock(&mu);
    stop(&v);
}

/* ---- undo of a cancelled call */

static void test_undo_on_cancel(void **state)
{
    static const char *const modes[] = {"before", "after"};
    for (size_t i = 0; i < 2; i++) {
        struct srv v;
        start(&v, 2, 0, 0);
        struct pf_rpc_status st;
        assert_int_equal(call(&v, "/pegaflow.Engine/QueryPrefetch", modes[i], 200, &st),
                         -ETIMEDOUT);
        pthread_mutex_lock(&mu);
        undo_go = 1; /* the client gave up: the handler may go on */
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
        assert_true(wait_until(&undone, 1, 10000));
        stop(&v); /* every call finished: a second run of the undo would show now */
        pthread_mutex_lock(&mu);
        assert_int_equal(undone, 1);
        assert_true(undo_bytes_ok);
        assert_int_equal(reg_rc[0], -EINVAL);
        assert_int_equal(reg_rc[1], 0);
        assert_int_equal(reg_rc[2], -EBUSY);
        pthread_mutex_unlock(&mu);
    }
    /* answered in time: the undo never runs */
    struct srv v;
    start(&v, 2, 0, 0);
    struct pf_rpc_status st;
    assert_int_equal(call(&v, "/pegaflow.Engine/QueryPrefetch", "fast", 30000, &st), 0);
    stop(&v);
    pthread_mutex_lock(&mu);
    assert_int_equal(undone, 0);
    assert_int_equal(reg_rc[1], 0);
    pthread_mutex_unlock(&mu);
}

/* ---- pf_rpc_validate directly */

static void test_validate_direct(void **state)
{
    char err[256];
    /* nested: an IpcTensor's shm_name with a NUL inside a RegisterContextRequest is bytes,
     * not checked here; a SaveRequest's nested SaveLayer.layer_name is */
    Pegaflow__SaveLayer sl = PEGAFLOW__SAVE_LAYER__INIT;
    sl.layer_name = "model.layers.0";
    Pegaflow__SaveLayer *sls[1] = {&sl};
    Pegaflow__SaveRequest sr = PEGAFLOW__SAVE_REQUEST__INIT;
    sr.instance_id = "i";
    sr.saves = sls;
    sr.n_saves = 1;
    uint8_t buf[256];
    size_t len = pegaflow__save_request__pack(&sr, buf);
    assert_int_equal(
        pf_rpc_validate(&pegaflow__save_request__descriptor, buf, len, err, sizeof(err)), 0);
    /* patch the nested name's first byte to NUL */
    uint8_t *p = memmem(buf, len, "model", 5);
    assert_non_null(p);
    *p = 0;
    assert_int_equal(
        pf_rpc_validate(&pegaflow__save_request__descriptor, buf, len, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "SaveLayer.layer_name contains a NUL byte"));
    /* truncated input */
    *p = 'm';
    assert_int_equal(
        pf_rpc_validate(&pegaflow__save_request__descriptor, buf, len - 3, err, sizeof(err)),
        -EINVAL);
    assert_non_null(strstr(err, "malformed"));
    /* a packed repeated field over the element cap: block_ids as one huge packed run is
     * rejected from its length alone (no allocation happens) */
    size_t big = (size_t)PF_RPC_MAX_REPEATED + 16;
    uint8_t *run = malloc(big + 16);
    size_t o = 0;
    run[o++] = (2 << 3) | 2; /* block_ids, length-delimited */
    size_t v = big;
    while (v >= 0x80) {
        run[o++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    run[o++] = (uint8_t)v;
    memset(run + o, 1, big);
    assert_int_equal(
        pf_rpc_validate(&pegaflow__save_layer__descriptor, run, o + big, err, sizeof(err)), -E2BIG);
    assert_non_null(strstr(err, "SaveLayer.block_ids has more than"));
    free(run);
}

int main(void)
{
    pf_cond_init(&cv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate_direct),
        cmocka_unit_test(test_nul_and_long_strings),
        cmocka_unit_test(test_memory_budget),
        cmocka_unit_test(test_arena_direct),
        cmocka_unit_test(test_large_request_decodes),
        cmocka_unit_test(test_expired_call),
        cmocka_unit_test(test_undo_on_cancel),
        cmocka_unit_test(test_network_bound_per_caller),
        cmocka_unit_test(test_network_bound_server_wide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

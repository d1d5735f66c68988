/* The engine's per-device copy threads (src/engine/gpu_worker.c) against a fake GPU backend
 * whose stream_sync blocks until the test releases the batch: with copy_streams = 2 the
 * second batch of a direction is submitted while the first one still drains (issue 22,
 * "one batch in flight per direction"); with 0 (a backend that asks for nothing) the
 * direction keeps one stream and a second batch waits for the first; batches may complete
 * out of order and each one's completion is its own; a lane's destroy waits for its
 * batches; a cancellable batch goes in chunks of at least PF_XFER_CHUNK copies and
 * PF_XFER_CHUNK_BYTES bytes (at most PF_XFER_CHUNK_MAX copies), the cancel asked before each
 * chunk, nothing submitted after a yes. Every wait in the test is a condition with a deadline,
 * never a sleep. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine_internal.h"
#include "pf/clock.h"
#include "pf/hal.h"
#include "pf/thread.h"

#define WAIT_MS 10000

/* ------------------------------------------------------------------ fake backend */

struct fstream {
    struct pf_gpu_stream base;
    int id;
    size_t submitted; /* batches copy_batch accepted */
    size_t synced;    /* batches stream_sync let finish */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv; /* pf_cond_init: CLOCK_MONOTONIC, as pf_deadline_ms */
static int f_copy_streams;
static int f_nstreams;
static size_t f_in_flight;     /* copy_batch called, stream_sync not yet returned 0 */
static size_t f_max_in_flight; /* per direction, the most seen at once */
static size_t f_released;      /* batches the test lets complete */
static size_t f_completed;
static size_t f_chunk_n[64]; /* copies per copy_batch call, in order */
static size_t f_nchunks;

static int f_count(struct pf_gpu *g)
{
    (void)g;
    return 1;
}

static int f_info(struct pf_gpu *g, int dev, struct pf_gpu_dev_info *info_p)
{
    (void)g;
    if (dev != 0)
        return -ENODEV;
    memset(info_p, 0, sizeof(*info_p));
    info_p->numa_node = -1;
    info_p->copy_streams = f_copy_streams;
    return 0;
}

static int f_stream_create(struct pf_gpu *g, int dev, struct pf_gpu_stream **s_p)
{
    struct fstream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->base.gpu = g;
    s->base.device = dev;
    pthread_mutex_lock(&mu);
    s->id = f_nstreams++;
    pthread_mutex_unlock(&mu);
    *s_p = &s->base;
    return 0;
}

static void f_stream_destroy(struct pf_gpu_stream *s)
{
    free(s);
}

static int f_copy_batch(struct pf_gpu_stream *ps, enum pf_copy_dir dir, enum pf_copy_mode mode,
                        const struct pf_copy_desc *d, size_t n)
{
    (void)dir;
    (void)mode;
    (void)d;
    struct fstream *s = (struct fstream *)ps;
    pthread_mutex_lock(&mu);
    if (f_nchunks < sizeof(f_chunk_n) / sizeof(f_chunk_n[0]))
        f_chunk_n[f_nchunks++] = n;
    s->submitted++;
    f_in_flight++;
    if (f_in_flight > f_max_in_flight)
        f_max_in_flight = f_in_flight;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return 0;
}

/* Completes the stream's batch once the test released one more batch than have completed. */
static int f_stream_sync(struct pf_gpu_stream *ps, uint64_t timeout_ms)
{
    struct fstream *s = (struct fstream *)ps;
    struct timespec dl = pf_deadline_ms(timeout_ms);
    pthread_mutex_lock(&mu);
    while (s->synced < s->submitted && f_released <= f_completed)
        if (pthread_cond_timedwait(&cv, &mu, &dl) == ETIMEDOUT && f_released <= f_completed) {
            pthread_mutex_unlock(&mu);
            return -ETIMEDOUT; /* still running: the worker calls again */
        }
    if (s->synced < s->submitted) {
        s->synced++;
        f_in_flight--;
        f_completed++;
    }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return 0;
}

static const struct pf_gpu_ops f_ops = {
    .name = "fake",
    .device_count = f_count,
    .device_info = f_info,
    .stream_create = f_stream_create,
    .stream_destroy = f_stream_destroy,
    .copy_batch = f_copy_batch,
    .stream_sync = f_stream_sync,
};
static struct pf_gpu f_gpu = {.ops = &f_ops};

static void f_reset(int copy_streams)
{
    pthread_mutex_lock(&mu);
    f_copy_streams = copy_streams;
    f_nstreams = 0;
    f_in_flight = f_max_in_flight = f_released = f_completed = f_nchunks = 0;
    pthread_mutex_unlock(&mu);
}

/* Waits (bounded) until pred() holds under mu; returns whether it did. */
static bool f_wait(bool (*pred)(void), uint64_t ms)
{
    struct timespec dl = pf_deadline_ms(ms);
    pthread_mutex_lock(&mu);
    bool ok;
    while (!(ok = pred()))
        if (pthread_cond_timedwait(&cv, &mu, &dl) == ETIMEDOUT) {
            ok = pred();
            break;
        }
    pthread_mutex_unlock(&mu);
    return ok;
}

static void f_release(size_t k)
{
    pthread_mutex_lock(&mu);
    f_released += k;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static bool two_in_flight(void)
{
    return f_in_flight >= 2;
}

static bool one_in_flight(void)
{
    return f_in_flight >= 1;
}

static bool all_done(void)
{
    return f_completed == f_released;
}

/* the copy threads create their streams as they start, in any order */
static int f_want_streams;
static bool streams_created(void)
{
    return f_nstreams >= f_want_streams;
}

static bool wait_streams(int n)
{
    pthread_mutex_lock(&mu);
    f_want_streams = n;
    pthread_mutex_unlock(&mu);
    return f_wait(streams_created, WAIT_MS);
}

/* ------------------------------------------------------------------ tests */

static struct pf_xfer *batch(enum pf_copy_dir dir, uint64_t tag)
{
    struct pf_xfer *x = pf_xfer_new(dir, PF_COPY_MODE_DIRECT, 1);
    assert_non_null(x);
    x->descs[0] = (struct pf_copy_desc){.dev = 0x1000, .host = NULL, .len = tag};
    x->n = 1;
    x->bytes = tag;
    return x;
}

static void test_two_batches_in_flight_per_direction(void **state)
{
    (void)state;
    f_reset(2);
    struct pf_gpu_worker *w;
    assert_int_equal(pf_gpu_worker_create(&f_gpu, 0, -1, 0, &w), 0);
    struct pf_xfer *a = batch(PF_COPY_D2H, 1), *b = batch(PF_COPY_D2H, 2);
    assert_int_equal(pf_gpu_worker_submit(w, a), 0);
    assert_int_equal(pf_gpu_worker_submit(w, b), 0);
    /* both batches are on their streams while neither has completed */
    assert_true(f_wait(two_in_flight, WAIT_MS));
    assert_int_equal(pf_xfer_wait(a, 0), -ETIMEDOUT);
    assert_int_equal(pf_xfer_wait(b, 0), -ETIMEDOUT);
    f_release(2);
    assert_int_equal(pf_xfer_wait(a, WAIT_MS), 0);
    assert_int_equal(pf_xfer_wait(b, WAIT_MS), 0);
    assert_true(wait_streams(4)); /* two per direction */
    pthread_mutex_lock(&mu);
    assert_int_equal(f_max_in_flight, 2);
    assert_int_equal(f_nstreams, 4);
    pthread_mutex_unlock(&mu);
    pf_xfer_put(a);
    pf_xfer_put(b);
    pf_gpu_worker_destroy(w);
}

static void test_one_stream_when_the_backend_asks_for_none(void **state)
{
    (void)state;
    f_reset(0);
    struct pf_gpu_worker *w;
    assert_int_equal(pf_gpu_worker_create(&f_gpu, 0, -1, 0, &w), 0);
    struct pf_xfer *a = batch(PF_COPY_H2D, 1), *b = batch(PF_COPY_H2D, 2);
    assert_int_equal(pf_gpu_worker_submit(w, a), 0);
    assert_int_equal(pf_gpu_worker_submit(w, b), 0);
    assert_true(f_wait(one_in_flight, WAIT_MS));
    /* one stream: b waits in the queue until a completed */
    assert_true(wait_streams(2));
    pthread_mutex_lock(&mu);
    assert_int_equal(f_in_flight, 1);
    assert_int_equal(f_nstreams, 2);
    pthread_mutex_unlock(&mu);
    f_release(1);
    assert_int_equal(pf_xfer_wait(a, WAIT_MS), 0);
    assert_int_equal(pf_xfer_wait(b, 0), -ETIMEDOUT);
    f_release(1);
    assert_int_equal(pf_xfer_wait(b, WAIT_MS), 0);
    pthread_mutex_lock(&mu);
    assert_int_equal(f_max_in_flight, 1);
    pthread_mutex_unlock(&mu);
    pf_xfer_put(a);
    pf_xfer_put(b);
    pf_gpu_worker_destroy(w);
}

static void test_clamped_and_destroy_waits(void **state)
{
    (void)state;
    f_reset(64); /* more than PF_COPY_STREAMS_MAX */
    struct pf_gpu_worker *w;
    assert_int_equal(pf_gpu_worker_create(&f_gpu, 0, -1, 0, &w), 0);
    struct pf_xfer *x[PF_COPY_STREAMS_MAX + 1];
    for (size_t i = 0; i < PF_COPY_STREAMS_MAX + 1; i++) {
        x[i] = batch(PF_COPY_D2H, i + 1);
        assert_int_equal(pf_gpu_worker_submit(w, x[i]), 0);
    }
    f_release(PF_COPY_STREAMS_MAX + 1);
    assert_true(f_wait(all_done, WAIT_MS));
    for (size_t i = 0; i < PF_COPY_STREAMS_MAX + 1; i++) {
        assert_int_equal(pf_xfer_wait(x[i], WAIT_MS), 0);
        pf_xfer_put(x[i]);
    }
    assert_true(wait_streams(2 * PF_COPY_STREAMS_MAX));
    pthread_mutex_lock(&mu);
    assert_int_equal(f_nstreams, 2 * PF_COPY_STREAMS_MAX);
    assert_true(f_max_in_flight <= PF_COPY_STREAMS_MAX);
    pthread_mutex_unlock(&mu);
    pf_gpu_worker_destroy(w);
}

static size_t cancel_asked, cancel_after; /* cancel_fn says yes from call cancel_after + 1 */
static bool f_cancel(struct pf_xfer *x)
{
    (void)x;
    return ++cancel_asked > cancel_after;
}

/* Runs a cancellable H2D batch of n copies of len bytes (all syncs released up front) and
 * checks the chunks copy_batch saw; returns the batch's result. */
static int run_cancellable(size_t n, uint64_t len, uint64_t chunk_bytes, size_t after,
                           const size_t *want, size_t nwant)
{
    f_reset(1);
    struct pf_gpu_worker *w;
    assert_int_equal(pf_gpu_worker_create(&f_gpu, 0, -1, 0, &w), 0);
    struct pf_xfer *x = pf_xfer_new(PF_COPY_H2D, PF_COPY_MODE_DIRECT, n);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x->descs[i] = (struct pf_copy_desc){.dev = 0x1000 + i * len, .host = NULL, .len = len};
    x->n = n;
    x->bytes = n * len;
    x->cancel_fn = f_cancel;
    x->chunk_bytes = chunk_bytes;
    cancel_asked = 0;
    cancel_after = after;
    f_release(1000);
    assert_int_equal(pf_gpu_worker_submit(w, x), 0);
    int rc = pf_xfer_wait(x, WAIT_MS);
    pthread_mutex_lock(&mu);
    if (f_nchunks != nwant)
        fail_msg("%zu copies of %llu bytes: %zu chunks, want %zu", n, (unsigned long long)len,
                 f_nchunks, nwant);
    for (size_t i = 0; i < nwant; i++)
        if (f_chunk_n[i] != want[i])
            fail_msg("%zu copies of %llu bytes: chunk %zu has %zu copies, want %zu", n,
                     (unsigned long long)len, i, f_chunk_n[i], want[i]);
    pthread_mutex_unlock(&mu);
    pf_xfer_put(x);
    pf_gpu_worker_destroy(w);
    return rc;
}

static void test_cancellable_chunks(void **state)
{
    (void)state;
    /* the default: PF_XFER_CHUNK_BYTES (128 MiB), capped at PF_XFER_CHUNK_MAX copies */
    static const size_t dflt[] = {1024, 1024, 952};
    assert_int_equal(run_cancellable(3000, 64 << 10, 0, 100, dflt, 3), 0);
    static const size_t dflt_big[] = {64, 36};
    assert_int_equal(run_cancellable(100, 8 << 20, 0, 100, dflt_big, 2), 0);
    /* 32 MiB chunks (--load-cancel-chunk 32mb): 512 copies of 64 KiB */
    static const size_t small[] = {512, 488};
    assert_int_equal(run_cancellable(1000, 64 << 10, 32 << 20, 100, small, 2), 0);
    /* 8 MiB copies: PF_XFER_CHUNK copies however few bytes were asked for */
    static const size_t big[] = {64, 36};
    assert_int_equal(run_cancellable(100, 8 << 20, 1, 100, big, 2), 0);
    /* 1 KiB copies: capped at PF_XFER_CHUNK_MAX copies */
    static const size_t tiny[] = {1024, 1024, 452};
    assert_int_equal(run_cancellable(2500, 1 << 10, 0, 100, tiny, 3), 0);
    /* a yes before the second chunk: one chunk submitted, the batch cancelled */
    assert_int_equal(run_cancellable(1000, 64 << 10, 32 << 20, 1, small, 1), -ECANCELED);
    /* a yes before the first: nothing submitted */
    assert_int_equal(run_cancellable(1000, 64 << 10, 32 << 20, 0, NULL, 0), -ECANCELED);
    /* the boundary itself */
    struct pf_xfer *x = pf_xfer_new(PF_COPY_H2D, PF_COPY_MODE_DIRECT, 3);
    assert_non_null(x);
    x->n = 3;
    for (size_t i = 0; i < 3; i++)
        x->descs[i].len = PF_XFER_CHUNK_BYTES;
    assert_int_equal(pf_xfer_chunk_end(x, 0), 3); /* fewer than PF_XFER_CHUNK copies */
    assert_int_equal(pf_xfer_chunk_end(x, 2), 3);
    pf_xfer_put(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_batches_in_flight_per_direction),
        cmocka_unit_test(test_one_stream_when_the_backend_asks_for_none),
        cmocka_unit_test(test_clamped_and_destroy_waits),
        cmocka_unit_test(test_cancellable_chunks),
    };
    if (pf_cond_init(&cv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}

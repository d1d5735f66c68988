/* SSD prefetch (src/ssd/prefetch.c): the global budget and its backpressure accounting,
 * probe and fetch of committed prefixes, the bounded batch queue, reads rejected when the
 * ring overwrote their range meanwhile, checksum mismatches and read errors as misses,
 * all-or-nothing, staging failures, read timeouts and stop, with read completions held by
 * a gate where a test needs reads in flight. */
#include <pthread.h>

#include "ssdtest.h"

#include "ssd/ssd_internal.h"

static void test_budget(void **st)
{
    struct ssd_budget b = {.max = 10};
    assert_int_equal(ssd_budget_reserve(&b, 4, false), 4);
    assert_int_equal(ssd_budget_reserve(&b, 8, false), 6); /* min(found, available) */
    assert_int_equal(b.used, 10);
    assert_int_equal(ssd_budget_reserve(&b, 1, false), 0); /* nothing left */
    ssd_budget_release(&b, 4);
    assert_int_equal(ssd_budget_reserve(&b, 5, true), 0); /* strict: all or nothing */
    assert_int_equal(ssd_budget_reserve(&b, 4, true), 4);
    ssd_budget_release(&b, 10);
    assert_int_equal(b.used, 0);
    ssd_budget_release(&b, 3); /* never below zero */
    assert_int_equal(b.used, 0);
    assert_int_equal(ssd_budget_reserve(&b, 0, false), 0);
}

static struct pf_block *blk(struct ssdt *t, uint32_t id)
{
    return ssdt_block(t, id, 3, 4000, 2, true); /* 24 KiB, scattered */
}

struct setup {
    struct ssdt t;
    struct pf_block *b[16];
    struct pf_block_key k[16];
    size_t n;
};

static void setup_store(struct setup *s, size_t n, uint64_t pool, const char *faults,
                        void (*tweak)(struct pf_ssd_config *))
{
    ssdt_init(&s->t, pool, faults);
    struct pf_ssd_config c = ssdt_config(&s->t, 4 << 20);
    if (tweak)
        tweak(&c);
    ssdt_open(&s->t, &c);
    s->n = n;
    for (uint32_t i = 0; i < n; i++) {
        s->b[i] = blk(&s->t, 500 + i);
        s->k[i] = pf_block_key(s->b[i]);
    }
    ssdt_write(&s->t, s->b, n);
}

static void teardown_store(struct setup *s)
{
    for (size_t i = 0; i < s->n; i++)
        pf_block_put(s->b[i]);
    ssdt_fini(&s->t);
}

static void put_all(struct pf_block **out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pf_block_put(out[i]);
}

static void test_probe_and_fetch(void **st)
{
    struct setup s;
    setup_store(&s, 8, 16 << 20, NULL, NULL);
    assert_int_equal(pf_ssd_probe(s.t.ssd, s.k, 8), 8);
    struct pf_block_key gap[3] = {s.k[0], ssdt_key(9999), s.k[2]};
    assert_int_equal(pf_ssd_probe(s.t.ssd, gap, 3), 1);
    double ok0 = ssdt_metric("pegaflow_ssd_prefetch_success");
    double by0 = ssdt_metric("pegaflow_ssd_prefetch_bytes");
    struct pf_block *out[8];
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 8, false, out), 8);
    for (int i = 0; i < 8; i++)
        assert_true(ssdt_same(s.b[i], out[i]));
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_success") - ok0, 8);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_bytes") - by0, 8 * 3 * 2 * 4096);
    put_all(out, 8);
    /* a gap ends the run; all-or-nothing refuses a partial run */
    assert_int_equal(pf_ssd_fetch(s.t.ssd, gap, 3, false, out), 1);
    put_all(out, 1);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, gap, 3, true, out), 0);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, gap + 1, 2, false, out), 0);
    assert_int_equal(ssdt_stats(&s.t).prefetch_reserved, 0);
    teardown_store(&s);
}

struct fetcher {
    pthread_t thr;
    struct pf_ssd *ssd;
    const struct pf_block_key *keys;
    size_t n;
    bool aon;
    struct pf_block *out[16];
    size_t got;
};

static void *fetch_main(void *arg)
{
    struct fetcher *f = arg;
    f->got = pf_ssd_fetch(f->ssd, f->keys, f->n, f->aon, f->out);
    return NULL;
}

static void fetch_async(struct fetcher *f, struct pf_ssd *ssd, const struct pf_block_key *keys,
                        size_t n)
{
    memset(f, 0, sizeof(*f));
    f->ssd = ssd;
    f->keys = keys;
    f->n = n;
    assert_int_equal(pthread_create(&f->thr, NULL, fetch_main, f), 0);
}

static size_t fetch_join(struct fetcher *f)
{
    pthread_join(f->thr, NULL);
    return f->got;
}

static void budget3(struct pf_ssd_config *c)
{
    c->max_prefetch_blocks = 3;
}

static void test_backpressure(void **st)
{
    struct setup s;
    setup_store(&s, 6, 16 << 20, NULL, budget3);
    double bp0 = ssdt_metric("pegaflow_ssd_prefetch_backpressure_blocks");
    struct pf_block *out[6];
    /* 5 found, 3 available: 3 fetched, 2 counted as backpressure */
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 5, false, out), 3);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_backpressure_blocks") - bp0, 2);
    put_all(out, 3);
    /* strict: all or nothing */
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 5, true, out), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_backpressure_blocks") - bp0, 7);
    /* the budget is global: while a fetch holds it, another gets nothing */
    gate_hold(s.t.gate, PF_BLK_READ, true);
    unsigned r0 = gate_submitted(s.t.gate, PF_BLK_READ);
    struct fetcher a;
    fetch_async(&a, s.t.ssd, s.k, 3);
    SSDT_WAIT(gate_submitted(s.t.gate, PF_BLK_READ) >= r0 + 1);
    assert_int_equal(ssdt_stats(&s.t).prefetch_reserved, 3);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k + 3, 2, false, out), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_backpressure_blocks") - bp0, 9);
    gate_hold(s.t.gate, PF_BLK_READ, false);
    assert_int_equal(fetch_join(&a), 3);
    put_all(a.out, 3);
    /* returned when the fetch ended */
    assert_int_equal(ssdt_stats(&s.t).prefetch_reserved, 0);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k + 3, 2, false, out), 2);
    put_all(out, 2);
    teardown_store(&s);
}

/* One read in flight, one batch queued; one record a read request: A's two blocks are then
 * two requests, the second unsubmitted while the first is held, so the reader keeps A and
 * leaves B queued. (With merged reads A's blocks are one request, A is wholly submitted, and
 * the reader takes B at its next turn: B is queued only for that moment, which a loaded
 * machine's test thread missed under ASan, 2026-12-02.) */
static void narrow(struct pf_ssd_config *c)
{
    c->prefetch_inflight = 1;
    c->prefetch_queue_depth = 1;
    c->read_merge = 1;
}

static size_t rq_count(struct pf_ssd *s)
{
    pthread_mutex_lock(&s->rq_mu);
    size_t n = s->rq_count;
    pthread_mutex_unlock(&s->rq_mu);
    return n;
}

static void test_queue_full(void **st)
{
    struct setup s;
    setup_store(&s, 4, 16 << 20, NULL, narrow);
    double qf0 = ssdt_metric("pegaflow_ssd_prefetch_queue_full");
    double in0 = ssdt_metric("pegaflow_ssd_prefetch_inflight");
    gate_hold(s.t.gate, PF_BLK_READ, true);
    /* A: the reader holds it (one read in flight, one unsubmitted); B: queued; C: full */
    struct fetcher a, b;
    fetch_async(&a, s.t.ssd, s.k, 2);
    SSDT_WAIT(gate_submitted(s.t.gate, PF_BLK_READ) == 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_inflight") - in0, 1);
    fetch_async(&b, s.t.ssd, s.k + 2, 1);
    SSDT_WAIT(rq_count(s.t.ssd) == 1);
    struct pf_block *out[1];
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k + 3, 1, false, out), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_queue_full") - qf0, 1);
    usleep(20000);
    assert_int_equal(gate_submitted(s.t.gate, PF_BLK_READ), 1); /* in-flight limit */
    assert_int_equal(rq_count(s.t.ssd), 1); /* A still holds the reader: B waits */
    gate_hold(s.t.gate, PF_BLK_READ, false);
    assert_int_equal(fetch_join(&a), 2);
    assert_int_equal(fetch_join(&b), 1);
    assert_true(ssdt_same(s.b[0], a.out[0]) && ssdt_same(s.b[1], a.out[1]) &&
                ssdt_same(s.b[2], b.out[0]));
    put_all(a.out, 2);
    put_all(b.out, 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_inflight") - in0, 0);
    teardown_store(&s);
}

static void small_ring(struct pf_ssd_config *c)
{
    c->capacity = SSD_SB_SIZE + 4 * (4096 + 24576); /* exactly four records */
}

static void test_overwritten_during_read(void **st)
{
    struct setup s;
    setup_store(&s, 4, 16 << 20, NULL, small_ring);
    double f0 = ssdt_metric("pegaflow_ssd_prefetch_failures");
    double i0 = pf_metric_value_of("pegaflow_integrity_failures_total", (const char *[]){"ssd"});
    gate_hold(s.t.gate, PF_BLK_READ, true);
    struct fetcher a;
    fetch_async(&a, s.t.ssd, s.k, 1);
    SSDT_WAIT(gate_submitted(s.t.gate, PF_BLK_READ) == 1);
    /* while block 0's read is in flight, a new block takes its place in the ring */
    struct pf_block *n = blk(&s.t, 600);
    ssdt_write(&s.t, &n, 1);
    assert_int_equal(pf_ssd_probe(s.t.ssd, s.k, 1), 0);
    gate_hold(s.t.gate, PF_BLK_READ, false);
    /* the read transferred the full length, but its range is no longer the block's */
    assert_int_equal(fetch_join(&a), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_failures") - f0, 1);
    assert_int_equal(
        pf_metric_value_of("pegaflow_integrity_failures_total", (const char *[]){"ssd"}) - i0, 0);
    /* the survivors are served */
    struct pf_block *out[4];
    struct pf_block_key rest[4] = {s.k[1], s.k[2], s.k[3], pf_block_key(n)};
    assert_int_equal(pf_ssd_fetch(s.t.ssd, rest, 4, false, out), 4);
    assert_true(ssdt_same(s.b[3], out[2]) && ssdt_same(n, out[3]));
    put_all(out, 4);
    pf_block_put(n);
    teardown_store(&s);
}

/* One record per read request (--ssd-read-merge 1): the fault plans below count requests. */
static void merge1(struct pf_ssd_config *c)
{
    c->read_merge = 1;
}

static void test_corruption_is_a_miss(void **st)
{
    struct setup s;
    setup_store(&s, 4, 16 << 20, "seed=11;blk.read:nth=3,times=1,corrupt=1", merge1);
    const char *ssd[] = {"ssd"};
    double i0 = pf_metric_value_of("pegaflow_integrity_failures_total", ssd);
    struct pf_block *out[4];
    /* read 2 (block 1; read 1 was the superblock's) comes back with flipped bytes: block 0 only */
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 4, false, out), 1);
    assert_true(ssdt_same(s.b[0], out[0]));
    put_all(out, 1);
    assert_int_equal(pf_metric_value_of("pegaflow_integrity_failures_total", ssd) - i0, 1);
    /* the entry is dropped; the others stay */
    assert_int_equal(pf_ssd_probe(s.t.ssd, s.k, 4), 1);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k + 2, 2, false, out), 2);
    assert_true(ssdt_same(s.b[2], out[0]) && ssdt_same(s.b[3], out[1]));
    put_all(out, 2);
    teardown_store(&s);
}

static void integrity_off(struct pf_ssd_config *c)
{
    c->integrity = false;
    c->read_merge = 1;
}

static void test_integrity_off(void **st)
{
    struct setup s;
    setup_store(&s, 2, 16 << 20, "seed=12;blk.read:nth=2,times=1,corrupt=1", integrity_off);
    struct pf_block *out[2];
    /* --integrity off: nothing is verified, the corrupted bytes are served */
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 2, false, out), 2);
    assert_false(ssdt_same(s.b[0], out[0]));
    assert_true(ssdt_same(s.b[1], out[1]));
    put_all(out, 2);
    teardown_store(&s);
}

static void test_read_error(void **st)
{
    struct setup s;
    setup_store(&s, 3, 16 << 20,
                "seed=13;blk.read:nth=2,times=1,error=EIO;blk.read:nth=4,times=1,error=EIO,"
                "at=complete",
                merge1);
    double f0 = ssdt_metric("pegaflow_ssd_prefetch_failures");
    struct pf_block *out[3];
    /* read 1 (block 0) is refused: nothing after it is read */
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 3, false, out), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_failures") - f0, 3);
    assert_int_equal(gate_submitted(s.t.gate, PF_BLK_READ), 0);
    /* read errors keep the entries; read 3 (block 1 of this fetch) fails at completion */
    assert_int_equal(pf_ssd_probe(s.t.ssd, s.k, 3), 3);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 3, false, out), 1);
    put_all(out, 1);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 3, false, out), 3);
    put_all(out, 3);
    teardown_store(&s);
}

static void test_staging_failure(void **st)
{
    struct setup s;
    setup_store(&s, 4, 1 << 20, NULL, NULL);
    /* fill the pool so the 96 KiB staging allocation cannot be made */
    struct pf_alloc *hog;
    uint64_t left = pf_pool_capacity(s.t.pool) - pf_pool_used(s.t.pool);
    assert_int_equal(pf_pool_alloc(s.t.pool, left - 64 * 1024, -1, &hog), 0);
    double f0 = ssdt_metric("pegaflow_ssd_prefetch_failures");
    struct pf_block *out[4];
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 4, false, out), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_failures") - f0, 4);
    pf_alloc_put(hog);
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 4, false, out), 4);
    put_all(out, 4);
    teardown_store(&s);
}

static void short_timeout(struct pf_ssd_config *c)
{
    c->io_timeout_ms = 100;
}

static void test_read_timeout(void **st)
{
    struct setup s;
    setup_store(&s, 2, 16 << 20, NULL, short_timeout);
    uint64_t used = pf_pool_used(s.t.pool);
    gate_hold(s.t.gate, PF_BLK_READ, true);
    struct pf_block *out[2];
    /* the read times out: a miss; its staging memory stays until the device is done */
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 2, false, out), 0);
    assert_true(pf_pool_used(s.t.pool) > used);
    gate_hold(s.t.gate, PF_BLK_READ, false);
    SSDT_WAIT(pf_pool_used(s.t.pool) == used);
    teardown_store(&s);
}

static void hour_timeout(struct pf_ssd_config *c)
{
    c->io_timeout_ms = 3600 * 1000;
}

static void test_stop_wakes_a_waiting_fetch(void **st)
{
    /* reads held and an I/O timeout of an hour: only the stop can end the fetch (if it did
     * not, the test would hang until the runner's timeout fails it) */
    struct setup s;
    setup_store(&s, 2, 16 << 20, NULL, hour_timeout);
    uint64_t used = pf_pool_used(s.t.pool);
    gate_hold(s.t.gate, PF_BLK_READ, true);
    unsigned r0 = gate_submitted(s.t.gate, PF_BLK_READ);
    struct fetcher a;
    fetch_async(&a, s.t.ssd, s.k, 2);
    SSDT_WAIT(gate_submitted(s.t.gate, PF_BLK_READ) >= r0 + 1); /* both records, one read */
    pf_ssd_stop(s.t.ssd);
    assert_int_equal(fetch_join(&a), 0);
    assert_int_equal(pf_ssd_probe(s.t.ssd, s.k, 2), 0);
    assert_int_equal(pf_pool_used(s.t.pool), used);
    teardown_store(&s);
}

static void test_fetch_within_deadline(void **st)
{
    /* the caller's deadline, not 2 x the (hour-long) I/O timeout, bounds the wait (a peer's
     * QueryBlocksForTransfer): reads held, a 50 ms fetch returns nothing; the abandoned
     * batch's staging returns once the device is done; then the same fetch delivers */
    struct setup s;
    setup_store(&s, 2, 16 << 20, NULL, hour_timeout);
    uint64_t used = pf_pool_used(s.t.pool);
    double fail0 = ssdt_metric("pegaflow_ssd_prefetch_failures");
    gate_hold(s.t.gate, PF_BLK_READ, true);
    struct pf_block *out[2];
    assert_int_equal(pf_ssd_fetch_within(s.t.ssd, s.k, 2, false, 50, out), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_failures") - fail0, 2);
    gate_hold(s.t.gate, PF_BLK_READ, false);
    SSDT_WAIT(pf_pool_used(s.t.pool) == used);
    assert_int_equal(pf_ssd_fetch_within(s.t.ssd, s.k, 2, false, 10000, out), 2);
    for (int i = 0; i < 2; i++)
        assert_true(ssdt_same(s.b[i], out[i]));
    put_all(out, 2);
    assert_int_equal(ssdt_stats(&s.t).prefetch_reserved, 0);
    teardown_store(&s);
}

static void staging2(struct pf_ssd_config *c)
{
    c->prefetch_staging_bytes = 2 * 24576; /* two blocks */
    c->prefetch_queue_depth = 4;
}

static void test_staging_bound(void **st)
{
    /* --ssd-prefetch-staging: a fetch larger than the bound gets the run that fits (the
     * rest counted); while one fetch holds the whole bound, the next waits and is served
     * once the first returns its staging */
    struct setup s;
    setup_store(&s, 4, 16 << 20, NULL, staging2);
    double l0 = ssdt_metric("pegaflow_ssd_prefetch_staging_limited_blocks");
    struct pf_block *out[4];
    assert_int_equal(pf_ssd_fetch(s.t.ssd, s.k, 4, false, out), 2);
    assert_true(ssdt_same(s.b[0], out[0]) && ssdt_same(s.b[1], out[1]));
    put_all(out, 2);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_staging_limited_blocks") - l0, 2);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_staging_bytes"), 0);
    gate_hold(s.t.gate, PF_BLK_READ, true);
    unsigned r0 = gate_submitted(s.t.gate, PF_BLK_READ);
    struct fetcher a, b;
    fetch_async(&a, s.t.ssd, s.k, 2);
    SSDT_WAIT(gate_submitted(s.t.gate, PF_BLK_READ) == r0 + 1); /* both records, one read */
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_staging_bytes"), 2 * 24576);
    fetch_async(&b, s.t.ssd, s.k + 2, 2);
    usleep(20000);
    /* at the bound: no staging, no read for the second fetch */
    assert_int_equal(gate_submitted(s.t.gate, PF_BLK_READ), r0 + 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_staging_bytes"), 2 * 24576);
    gate_hold(s.t.gate, PF_BLK_READ, false);
    assert_int_equal(fetch_join(&a), 2);
    assert_int_equal(fetch_join(&b), 2);
    assert_true(ssdt_same(s.b[0], a.out[0]) && ssdt_same(s.b[1], a.out[1]) &&
                ssdt_same(s.b[2], b.out[0]) && ssdt_same(s.b[3], b.out[1]));
    put_all(a.out, 2);
    put_all(b.out, 2);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_staging_bytes"), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_staging_limited_blocks") - l0, 2);
    teardown_store(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_probe_and_fetch),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_overwritten_during_read),
        cmocka_unit_test(test_corruption_is_a_miss),
        cmocka_unit_test(test_integrity_off),
        cmocka_unit_test(test_read_error),
        cmocka_unit_test(test_staging_failure),
        cmocka_unit_test(test_read_timeout),
        cmocka_unit_test(test_stop_wakes_a_waiting_fetch),
        cmocka_unit_test(test_fetch_within_deadline),
        cmocka_unit_test(test_staging_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

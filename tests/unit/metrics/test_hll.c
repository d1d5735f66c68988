/* HyperLogLog accuracy, identity stability and sliding windows under a fake clock. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/hll.h"
#include "pf/metrics.h"

/* ---- reference: the full merge as src/metrics/hll.c computed it before the scrape caches
 * (every live slot's registers max-merged into a fresh array, 2^-r by ldexp per register).
 * A record lands in slot (t - start) / slot_len; a window at slot cur covers the slots
 * (cur - nslots, cur]; slot_len = clamp(secs / 24, 60, 3600), nslots = ceil(secs / slot). */
#define REF_MAXREC  4096
#define REF_MAXMISS 24

struct ref_rec {
    uint64_t t, total;
    size_t n;
    uint64_t id[REF_MAXMISS];
};

struct ref {
    unsigned bits;
    uint64_t start;
    size_t nw;
    uint64_t slot_ns[8], nslots[8];
    char label[8][16];
    size_t nrec;
    struct ref_rec rec[REF_MAXREC];
};

static double ref_reg_estimate(const uint8_t *reg, unsigned bits)
{
    size_t m = (size_t)1 << bits;
    double sum = 0;
    size_t zeros = 0;
    for (size_t i = 0; i < m; i++) {
        sum += ldexp(1.0, -reg[i]);
        zeros += reg[i] == 0;
    }
    double alpha = m == 16   ? 0.673
                   : m == 32 ? 0.697
                   : m == 64 ? 0.709
                             : 0.7213 / (1 + 1.079 / (double)m);
    double e = alpha * (double)m * (double)m / sum;
    if (e <= 2.5 * (double)m && zeros)
        e = (double)m * log((double)m / (double)zeros);
    return e;
}

static void ref_reg_add(uint8_t *reg, unsigned bits, uint64_t x)
{
    size_t idx = (size_t)(x >> (64 - bits));
    uint64_t rest = x << bits;
    uint8_t rank = rest ? (uint8_t)(__builtin_clzll(rest) + 1) : (uint8_t)(64 - bits + 1);
    if (rank > reg[idx])
        reg[idx] = rank;
}

static void ref_init(struct ref *r, unsigned bits, uint64_t start, const uint64_t *secs,
                     const char *const *labels, size_t nw)
{
    memset(r, 0, sizeof(*r));
    r->bits = bits;
    r->start = start;
    r->nw = nw;
    for (size_t i = 0; i < nw; i++) {
        uint64_t slot = secs[i] / 24;
        slot = slot < 60 ? 60 : slot > 3600 ? 3600 : slot;
        r->slot_ns[i] = slot * PF_NS_PER_SEC;
        r->nslots[i] = (secs[i] + slot - 1) / slot;
        snprintf(r->label[i], sizeof(r->label[i]), "%s", labels[i]);
    }
}

static void ref_estimate(const struct ref *r, size_t w, uint64_t now, double *card, uint64_t *total)
{
    uint64_t cur = (now - r->start) / r->slot_ns[w];
    uint8_t *merged = calloc((size_t)1 << r->bits, 1);
    assert_non_null(merged);
    *total = 0;
    for (size_t k = 0; k < r->nrec; k++) {
        uint64_t slot = (r->rec[k].t - r->start) / r->slot_ns[w];
        if (slot > cur || slot + r->nslots[w] <= cur)
            continue;
        *total += r->rec[k].total;
        for (size_t j = 0; j < r->rec[k].n; j++)
            ref_reg_add(merged, r->bits, r->rec[k].id[j]);
    }
    *card = ref_reg_estimate(merged, r->bits);
    free(merged);
}

/* Records nmiss hashes (8 bytes each, drawn from pool) and total into both s and r. */
static void both_record(struct pf_hll_set *s, struct ref *r, pthread_mutex_t *rmu, uint64_t now,
                        const uint64_t *keys, size_t nmiss, uint64_t total)
{
    uint8_t hs[REF_MAXMISS][8];
    const uint8_t *hp[REF_MAXMISS];
    size_t lens[REF_MAXMISS];
    assert_true(nmiss <= REF_MAXMISS);
    for (size_t i = 0; i < nmiss; i++) {
        memcpy(hs[i], &keys[i], 8);
        hp[i] = hs[i];
        lens[i] = 8;
    }
    pf_hll_record(s, "ns", hp, lens, nmiss, total);
    if (rmu)
        pthread_mutex_lock(rmu);
    assert_true(r->nrec < REF_MAXREC);
    struct ref_rec *rec = &r->rec[r->nrec++];
    rec->t = now;
    rec->total = total;
    rec->n = nmiss;
    for (size_t i = 0; i < nmiss; i++)
        rec->id[i] = pf_hll_identity("ns", hs[i], 8);
    if (rmu)
        pthread_mutex_unlock(rmu);
}

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* The gauge line for window label in the rendered registry, or NULL. */
static const char *gauge_line(const char *text, const char *name, const char *label)
{
    char key[128];
    snprintf(key, sizeof(key), "%s{window=\"%s\"} ", name, label);
    const char *p = strstr(text, key);
    return p ? p + strlen(key) : NULL;
}

/* Every window of s equals the reference exactly, through the test accessors (twice: the
 * second read is served from the cache) and through the three rendered gauges. */
static void check_all(struct pf_hll_set *s, const struct ref *r, uint64_t now)
{
    char *text;
    size_t len;
    assert_int_equal(pf_metrics_render(&text, &len), 0);
    for (size_t w = 0; w < r->nw; w++) {
        double card;
        uint64_t total;
        ref_estimate(r, w, now, &card, &total);
        for (int rep = 0; rep < 2; rep++) {
            double got = pf_hll_cardinality(s, w);
            if (got != card)
                fail_msg("window %s: cardinality %.17g, full merge %.17g", r->label[w], got, card);
            assert_int_equal(pf_hll_total(s, w), total);
        }
        double rate = total ? 1.0 - card / (double)total : 0;
        rate = rate < 0 ? 0 : rate > 1 ? 1 : rate;
        const double want[3] = {card, (double)total, rate};
        const char *names[3] = {"pegaflow_hll_cardinality", "pegaflow_hll_total_requests",
                                "pegaflow_hll_estimated_hit_rate"};
        for (int g = 0; g < 3; g++) {
            const char *v = gauge_line(text, names[g], r->label[w]);
            assert_non_null(v);
            char exp[64];
            int n = snprintf(exp, sizeof(exp), "%.9g\n", want[g]);
            if (strncmp(v, exp, (size_t)n) != 0)
                fail_msg("%s{window=%s}: rendered %.20s, want %s", names[g], r->label[w], v, exp);
        }
    }
    free(text);
}

static struct ref g_ref;

static void test_accuracy(void **st)
{
    struct pf_hll *h = pf_hll_new(16);
    assert_true(pf_hll_estimate(h) < 0.5);
    for (uint64_t i = 0; i < 100000; i++) {
        uint8_t b[8];
        memcpy(b, &i, 8);
        pf_hll_add(h, pf_hll_identity("ns", b, 8));
        pf_hll_add(h, pf_hll_identity("ns", b, 8)); /* duplicates do not count */
    }
    double e = pf_hll_estimate(h);
    assert_true(fabs(e - 100000) / 100000 < 0.02);
    pf_hll_free(h);
    h = pf_hll_new(16);
    for (uint64_t i = 0; i < 100; i++)
        pf_hll_add(h, pf_hll_identity("ns", (uint8_t *)&i, 8));
    assert_true(fabs(pf_hll_estimate(h) - 100) < 2); /* linear counting range */
    pf_hll_free(h);
    /* identity depends on the namespace and the hash */
    uint8_t x[4] = {1, 2, 3, 4};
    assert_int_equal(pf_hll_identity("a", x, 4), pf_hll_identity("a", x, 4));
    assert_int_not_equal(pf_hll_identity("a", x, 4), pf_hll_identity("b", x, 4));
    assert_int_not_equal(pf_hll_identity("ab", x, 3), pf_hll_identity("a", x, 4));
}

static void test_windows(void **st)
{
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 1000 * PF_NS_PER_SEC);
    struct pf_hll_set *s;
    assert_int_equal(pf_hll_set_create("2m,1h", 14, &clk.base, &s), 0);
    uint8_t hs[50][8];
    const uint8_t *hp[50];
    size_t lens[50];
    for (int i = 0; i < 50; i++) {
        memset(hs[i], i, 8);
        hp[i] = hs[i];
        lens[i] = 8;
    }
    pf_hll_record(s, "ns", hp, lens, 50, 200);
    assert_true(fabs(pf_hll_cardinality(s, 0) - 50) < 2);
    assert_int_equal(pf_hll_total(s, 0), 200);
    pf_fake_clock_advance(&clk, 61 * PF_NS_PER_SEC);
    pf_hll_record(s, "ns", hp, lens, 10, 40); /* the same 10 again: still 50 distinct */
    assert_true(fabs(pf_hll_cardinality(s, 0) - 50) < 2);
    assert_int_equal(pf_hll_total(s, 0), 240);
    /* after the 2-minute window passed only the second slot's data is left */
    pf_fake_clock_advance(&clk, 61 * PF_NS_PER_SEC);
    assert_true(fabs(pf_hll_cardinality(s, 0) - 10) < 1.5);
    assert_int_equal(pf_hll_total(s, 0), 40);
    pf_fake_clock_advance(&clk, 120 * PF_NS_PER_SEC);
    assert_int_equal(pf_hll_total(s, 0), 0);
    assert_true(pf_hll_cardinality(s, 0) < 0.5);
    /* the hour window still remembers everything */
    assert_int_equal(pf_hll_total(s, 1), 240);
    assert_true(fabs(pf_hll_cardinality(s, 1) - 50) < 2);
    pf_hll_set_destroy(s);
    assert_int_not_equal(pf_hll_set_create("2m", 3, &clk.base, &s), 0);
    assert_int_not_equal(pf_hll_set_create("30s", 10, &clk.base, &s), 0);
}

/* Seeded random records over many slot advances (small steps within a slot, steps across
 * slots, jumps that expire whole windows), each window compared with the full merge after
 * every step, including a record right after a read filled the caches. */
static void run_random(const char *windows, const uint64_t *secs, const char *const *labels,
                       size_t nw, unsigned bits, uint64_t seed, int steps, uint64_t pool)
{
    static struct pf_fake_clock clk; /* outlives a set a failed check leaks (gauges stay) */
    uint64_t now = 5000 * PF_NS_PER_SEC;
    pf_fake_clock_init(&clk, now);
    struct pf_hll_set *s;
    assert_int_equal(pf_hll_set_create(windows, bits, &clk.base, &s), 0);
    ref_init(&g_ref, bits, now, secs, labels, nw);
    uint64_t x = seed;
    check_all(s, &g_ref, now); /* nothing recorded: every window empty */
    for (int step = 0; step < steps; step++) {
        uint64_t roll = rng_next(&x) % 100, adv;
        if (roll < 50)
            adv = rng_next(&x) % (20 * PF_NS_PER_SEC); /* mostly the same slot */
        else if (roll < 95)
            adv = rng_next(&x) % (200 * PF_NS_PER_SEC); /* one to a few slots on */
        else
            adv = (rng_next(&x) % 3 + 1) * 3600 * PF_NS_PER_SEC; /* windows expire */
        pf_fake_clock_advance(&clk, adv);
        now += adv;
        int nrec = (int)(rng_next(&x) % 4); /* 0: a step with no record at all */
        for (int k = 0; k < nrec; k++) {
            uint64_t keys[REF_MAXMISS];
            size_t n = (size_t)(rng_next(&x) % (REF_MAXMISS + 1));
            for (size_t i = 0; i < n; i++)
                keys[i] = rng_next(&x) % pool; /* repeats across slots and windows */
            both_record(s, &g_ref, NULL, now, keys, n, n + rng_next(&x) % 8);
        }
        check_all(s, &g_ref, now);
        if (rng_next(&x) % 3 == 0) { /* a record after the caches were filled */
            uint64_t key = rng_next(&x) % pool;
            both_record(s, &g_ref, NULL, now, &key, 1, 1);
            check_all(s, &g_ref, now);
        }
    }
    pf_hll_set_destroy(s);
}

static void test_cached_equals_full_merge(void **st)
{
    /* 2m: 2 slots of 1 min; 7m: 7 of 1 min; 1h: 24 of 150 s */
    const uint64_t secs[] = {120, 420, 3600};
    const char *labels[] = {"2m", "7m", "1h"};
    run_random("2m,7m,1h", secs, labels, 3, 12, 0x9e3779b97f4a7c15ull, 400, 5000);
    /* m = 16 (alpha 0.673) with more distinct keys than 2.5 m: the raw-estimate branch and
     * ranks up to 64 - bits + 1 */
    run_random("2m,7m,1h", secs, labels, 3, 4, 12345, 200, 1u << 20);
    run_random("2m,7m,1h", secs, labels, 3, 5, 777, 100, 1u << 20);
    run_random("2m,7m,1h", secs, labels, 3, 6, 778, 100, 1u << 20);
    /* the server's default: 15m (15 x 1 min), 1h (24 x 150 s), 1d (24 x 1 h), 2^16 */
    const uint64_t dsecs[] = {900, 3600, 86400};
    const char *dlabels[] = {"15m", "1h", "1d"};
    run_random("15m,1h,1d", dsecs, dlabels, 3, 16, 42, 60, 1u << 30);
}

/* A single HLL: the table-driven estimate equals the ldexp one for registers at every rank,
 * including the top one (an identity whose bits past the index are all zero). */
static void test_single_estimate_exact(void **st)
{
    for (unsigned bits = 4; bits <= 18; bits += 7) {
        struct pf_hll *h = pf_hll_new(bits);
        assert_non_null(h);
        size_t m = (size_t)1 << bits;
        uint8_t *reg = calloc(m, 1);
        assert_non_null(reg);
        uint64_t x = 99 + bits;
        for (int round = 0; round < 6; round++) {
            size_t n = round == 0 ? 0 : (size_t)1 << (round * 3);
            for (size_t k = 0; k < n; k++) {
                uint64_t v = rng_next(&x);
                if (k % 97 == 0)
                    v &= ~(UINT64_MAX >> bits); /* rank 64 - bits + 1 */
                pf_hll_add(h, v);
                ref_reg_add(reg, bits, v);
            }
            double got = pf_hll_estimate(h), want = ref_reg_estimate(reg, bits);
            if (got != want)
                fail_msg("bits %u round %d: %.17g, ldexp %.17g", bits, round, got, want);
        }
        free(reg);
        pf_hll_free(h);
    }
}

/* The identity by its definition, byte by byte (splitmix64 of FNV-1a-64 over u64le(len(ns)) ||
 * ns || hash): the value other nodes compute, independent of the library's batched code. */
static uint64_t def_identity(const char *ns, const uint8_t *hash, size_t len)
{
    uint8_t buf[8 + 64 + 64];
    size_t nl = strlen(ns), n = 0;
    for (int i = 0; i < 8; i++)
        buf[n++] = (uint8_t)((uint64_t)nl >> (8 * i));
    memcpy(buf + n, ns, nl);
    n += nl;
    memcpy(buf + n, hash, len);
    n += len;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ buf[i]) * 0x100000001b3ull;
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* pf_hll_record computes the identities in batches (four side by side, outside the lock, a
 * heap buffer past 256): the registers it fills equal those of the defined identity added one
 * by one, for runs of equal lengths, mixed lengths (1..40), counts not a multiple of four and
 * batches over 256. */
static void test_batch_identities(void **st)
{
    enum { N = 1000 };
    static uint8_t hs[N][40];
    const uint8_t *hp[N];
    size_t lens[N];
    uint64_t x = 0x5eed;
    for (size_t i = 0; i < N; i++) {
        for (size_t j = 0; j < 40; j++)
            hs[i][j] = (uint8_t)rng_next(&x);
        hp[i] = hs[i];
        /* runs of 32-byte hashes (vLLM's sha256), then 16, then every length 1..40 mixed */
        lens[i] = i < 600 ? 32 : i < 800 ? 16 : 1 + (size_t)(rng_next(&x) % 40);
    }
    const char *ns = "tenant-a/model";
    assert_int_equal(pf_hll_identity(ns, hs[7], 32), def_identity(ns, hs[7], 32));
    static const size_t counts[] = {1, 3, 4, 5, 255, 256, 257, N};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c];
        for (size_t off = 0; off + n <= N; off += n > 300 ? N : 397) {
            struct pf_fake_clock clk;
            pf_fake_clock_init(&clk, 1000 * PF_NS_PER_SEC);
            struct pf_hll_set *s;
            assert_int_equal(pf_hll_set_create("1h", 14, &clk.base, &s), 0);
            struct pf_hll *h = pf_hll_new(14);
            pf_hll_record(s, ns, hp + off, lens + off, n, n);
            for (size_t i = off; i < off + n; i++)
                pf_hll_add(h, def_identity(ns, hs[i], lens[i]));
            double got = pf_hll_cardinality(s, 0), want = pf_hll_estimate(h);
            if (got != want)
                fail_msg("%zu hashes from %zu: cardinality %.17g, defined identities %.17g", n, off,
                         got, want);
            assert_int_equal(pf_hll_total(s, 0), n);
            /* computed ahead (pf_hll_identities), recorded later (pf_hll_record_ids): the
             * same identities, the same registers */
            static uint64_t ids[N];
            pf_hll_identities(ns, hp + off, lens + off, n, ids);
            for (size_t i = 0; i < n; i++)
                if (ids[i] != def_identity(ns, hs[off + i], lens[off + i]))
                    fail_msg("identity %zu of %zu from %zu differs", i, n, off);
            struct pf_hll_set *s2;
            assert_int_equal(pf_hll_set_create("1h", 14, &clk.base, &s2), 0);
            pf_hll_record_ids(s2, ids, n, n);
            assert_true(pf_hll_cardinality(s2, 0) == want);
            assert_int_equal(pf_hll_total(s2, 0), n);
            pf_hll_set_destroy(s2);
            pf_hll_free(h);
            pf_hll_set_destroy(s);
        }
    }
}

/* Recorders and readers at once (TSan), the clock still within each phase; between phases
 * the clock moves a slot or more on and the result equals the full merge exactly. */
struct conc {
    struct pf_hll_set *s;
    struct ref *r;
    pthread_mutex_t rmu; /* guards r between recorders */
    uint64_t now;
    _Atomic int stop;
    _Atomic int bad; /* a reader saw a negative cardinality or a failed render */
};

struct conc_arg {
    struct conc *c;
    uint64_t seed;
};

static void *conc_recorder(void *arg)
{
    struct conc_arg *a = arg;
    uint64_t x = a->seed;
    for (int k = 0; k < 60; k++) {
        uint64_t keys[8];
        for (int i = 0; i < 8; i++)
            keys[i] = rng_next(&x) % 100000;
        both_record(a->c->s, a->c->r, &a->c->rmu, a->c->now, keys, 8, 16);
    }
    return NULL;
}

static void *conc_reader(void *arg)
{
    struct conc *c = arg;
    char *text;
    size_t len;
    while (!atomic_load(&c->stop)) {
        for (size_t w = 0; w < 2; w++) {
            if (!(pf_hll_cardinality(c->s, w) >= 0))
                atomic_store(&c->bad, 1);
            (void)pf_hll_total(c->s, w);
        }
        if (pf_metrics_render(&text, &len) != 0)
            atomic_store(&c->bad, 1);
        else
            free(text);
    }
    return NULL;
}

static void test_concurrent(void **st)
{
    static struct pf_fake_clock clk; /* outlives a set a failed check leaks (gauges stay) */
    uint64_t start = 7000 * PF_NS_PER_SEC;
    pf_fake_clock_init(&clk, start);
    struct conc c = {.r = &g_ref, .now = start};
    assert_int_equal(pf_hll_set_create("2m,7m", 10, &clk.base, &c.s), 0);
    const uint64_t secs[] = {120, 420};
    const char *labels[] = {"2m", "7m"};
    ref_init(&g_ref, 10, start, secs, labels, 2);
    pthread_mutex_init(&c.rmu, NULL);
    for (int phase = 0; phase < 6; phase++) {
        pthread_t rec[3], rd[2];
        struct conc_arg args[3];
        atomic_store(&c.stop, 0);
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&rd[i], NULL, conc_reader, &c), 0);
        for (int i = 0; i < 3; i++) {
            args[i] = (struct conc_arg){&c, 1000003ull * (uint64_t)(phase * 3 + i + 1)};
            assert_int_equal(pthread_create(&rec[i], NULL, conc_recorder, &args[i]), 0);
        }
        for (int i = 0; i < 3; i++)
            pthread_join(rec[i], NULL);
        atomic_store(&c.stop, 1);
        for (int i = 0; i < 2; i++)
            pthread_join(rd[i], NULL);
        assert_int_equal(atomic_load(&c.bad), 0);
        check_all(c.s, &g_ref, c.now);
        uint64_t adv = (uint64_t)(40 + 50 * phase) * PF_NS_PER_SEC;
        pf_fake_clock_advance(&clk, adv);
        c.now += adv;
        check_all(c.s, &g_ref, c.now);
    }
    pthread_mutex_destroy(&c.rmu);
    pf_hll_set_destroy(c.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accuracy),
        cmocka_unit_test(test_windows),
        cmocka_unit_test(test_cached_equals_full_merge),
        cmocka_unit_test(test_single_estimate_exact),
        cmocka_unit_test(test_batch_identities),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

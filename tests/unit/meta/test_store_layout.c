/* The memory store's compact layout (store_internal.h): entries that outgrow the inline
 * owner slots (more than 16 owners) or the inline hash (over 127 bytes) and come back,
 * removal of a middle owner keeping the others' order, index growth and shrink with
 * entries of many sizes in several namespaces, and a seeded random workload whose every
 * QueryPrefix answer is compared byte for byte (node strings, prefix lengths, order) with
 * a reference model, with sweeps that expire owners by TTL. Memory store only: the Redis
 * store has its own layout (test_store.c runs the shared semantics on both). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "pf/clock.h"
#include "pf/meta.h"
#include "pf/util.h"

#define SEC PF_NS_PER_SEC

struct fx {
    struct pf_fake_clock clk;
    struct pf_meta_store *st;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    pf_fake_clock_init(&f->clk, 1000 * SEC);
    struct pf_meta_store_config cfg = {
        .node_stale_secs = 30, .ttl_secs = 600, .clock = &f->clk.base};
    assert_int_equal(pf_meta_store_create(&cfg, &f->st), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    pf_meta_store_destroy(f->st);
    free(f);
    return 0;
}

static void node_of(int i, char name[32], uint8_t id[16])
{
    snprintf(name, 32, "node%d:1", i);
    memset(id, 0, 16);
    id[0] = (uint8_t)(i + 1);
    id[1] = (uint8_t)((i + 1) >> 8);
}

static void hb(struct fx *f, int i)
{
    char name[32];
    uint8_t id[16];
    node_of(i, name, id);
    assert_int_equal(pf_meta_store_heartbeat(f->st, name, id), 0);
}

static void ins1(struct fx *f, int node, const char *ns, const uint8_t *key, size_t len)
{
    char name[32];
    uint8_t id[16];
    node_of(node, name, id);
    struct pf_meta_hash h = {len, key};
    assert_int_equal(pf_meta_store_insert(f->st, ns, &h, 1, name, id, NULL), 0);
}

static uint64_t rem1(struct fx *f, int node, const char *ns, const uint8_t *key, size_t len)
{
    char name[32];
    uint8_t id[16];
    node_of(node, name, id);
    struct pf_meta_hash h = {len, key};
    uint64_t r = 99;
    assert_int_equal(pf_meta_store_remove(f->st, ns, &h, 1, name, id, &r), 0);
    return r;
}

/* The owners of one key in answer order must be exactly want[0..n). */
static void expect_owners(struct fx *f, const char *ns, const uint8_t *key, size_t len,
                          const int *want, size_t n)
{
    struct pf_meta_hash h = {len, key};
    struct pf_meta_prefix *res = NULL;
    size_t nres = 0;
    assert_int_equal(pf_meta_store_query_prefix(f->st, ns, &h, 1, &res, &nres), 0);
    assert_int_equal(nres, n);
    for (size_t i = 0; i < n; i++) {
        char name[32];
        uint8_t id[16];
        node_of(want[i], name, id);
        assert_string_equal(res[i].node, name);
        assert_int_equal(res[i].prefix_len, 1);
    }
    free(res);
}

static void expect_counts(struct fx *f, uint64_t entries, uint64_t owners)
{
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.entries, entries);
    assert_int_equal(s.owners, owners);
}

/* One key gains 70 owners (past the 16 inline slots: a big entry), loses a middle one and
 * then most of them (back to inline slots), for a short and for a long hash. */
static void test_many_owners_and_middle_removal(void **state)
{
    struct fx *f = *state;
    enum { NN = 70 };
    static uint8_t longkey[300];
    for (size_t i = 0; i < sizeof(longkey); i++)
        longkey[i] = (uint8_t)(i * 31 + 7);
    const uint8_t shortkey[32] = {1, 2, 3};
    struct {
        const uint8_t *k;
        size_t len;
    } keys[] = {
        {shortkey, sizeof(shortkey)}, {longkey, sizeof(longkey)}, {longkey, 127}, {longkey, 128}};
    for (int i = 0; i < NN; i++)
        hb(f, i);
    for (size_t kk = 0; kk < PF_ARRAY_SIZE(keys); kk++) {
        int want[NN];
        size_t n = 0;
        for (int i = 0; i < NN; i++) {
            ins1(f, i, "ns", keys[kk].k, keys[kk].len);
            want[n++] = i;
            if (i == 1 || i == 15 || i == 16 || i == 17 || i == 40 || i == NN - 1)
                expect_owners(f, "ns", keys[kk].k, keys[kk].len, want, n);
        }
        /* re-inserting an existing owner keeps its place */
        ins1(f, 5, "ns", keys[kk].k, keys[kk].len);
        expect_owners(f, "ns", keys[kk].k, keys[kk].len, want, n);
        /* a middle owner goes: the rest keep their order */
        assert_int_equal(rem1(f, 35, "ns", keys[kk].k, keys[kk].len), 1);
        memmove(want + 35, want + 36, (n - 36) * sizeof(int));
        n--;
        expect_owners(f, "ns", keys[kk].k, keys[kk].len, want, n);
        assert_int_equal(rem1(f, 35, "ns", keys[kk].k, keys[kk].len), 0);
        /* drop down to 3 owners, removing from the front, middle and back */
        while (n > 3) {
            size_t at = n % 3 == 0 ? 0 : n % 3 == 1 ? n / 2 : n - 1;
            assert_int_equal(rem1(f, want[at], "ns", keys[kk].k, keys[kk].len), 1);
            memmove(want + at, want + at + 1, (n - at - 1) * sizeof(int));
            n--;
            if (n == 17 || n == 16 || n == 8 || n == 4 || n == 3)
                expect_owners(f, "ns", keys[kk].k, keys[kk].len, want, n);
        }
        /* and grows again past the inline slots */
        for (int i = 0; i < NN; i++) {
            bool have = false;
            for (size_t j = 0; j < n; j++)
                have |= want[j] == i;
            if (!have) {
                ins1(f, i, "ns", keys[kk].k, keys[kk].len);
                want[n++] = i;
            }
        }
        expect_owners(f, "ns", keys[kk].k, keys[kk].len, want, n);
        expect_counts(f, kk + 1, (kk + 1) * NN);
    }
    /* unregistering a node drops it from every big entry */
    char name[32];
    uint8_t id[16];
    node_of(3, name, id);
    uint64_t removed = 0;
    assert_int_equal(pf_meta_store_unregister(f->st, name, id, &removed), 0);
    assert_int_equal(removed, PF_ARRAY_SIZE(keys));
    expect_counts(f, PF_ARRAY_SIZE(keys), PF_ARRAY_SIZE(keys) * (NN - 1));
    /* the TTL sweep empties them all */
    pf_fake_clock_advance(&f->clk, 601 * SEC);
    for (int i = 0; i < NN; i++)
        if (i != 3)
            hb(f, i);
    struct pf_meta_sweep_stats sw;
    pf_meta_store_sweep(f->st, &sw);
    assert_int_equal(sw.removed_keys, PF_ARRAY_SIZE(keys));
    assert_int_equal(sw.removed_owners, PF_ARRAY_SIZE(keys) * (NN - 1));
    expect_counts(f, 0, 0);
}

/* The longest accepted hash (65535 bytes) and one byte, side by side with equal prefixes. */
static void test_hash_lengths(void **state)
{
    struct fx *f = *state;
    hb(f, 0);
    hb(f, 1);
    uint8_t *big = malloc(PF_META_HASH_MAX);
    for (size_t i = 0; i < PF_META_HASH_MAX; i++)
        big[i] = (uint8_t)(i ^ (i >> 8));
    const size_t lens[] = {1, 2, 31, 32, 33, 126, 127, 128, 129, 1000, PF_META_HASH_MAX};
    for (size_t i = 0; i < PF_ARRAY_SIZE(lens); i++)
        ins1(f, (int)(i & 1), "ns", big, lens[i]);
    expect_counts(f, PF_ARRAY_SIZE(lens), PF_ARRAY_SIZE(lens));
    for (size_t i = 0; i < PF_ARRAY_SIZE(lens); i++) {
        int want = (int)(i & 1);
        expect_owners(f, "ns", big, lens[i], &want, 1);
        /* the same bytes in another namespace are another key */
        expect_owners(f, "other", big, lens[i], NULL, 0);
    }
    /* a byte differing at the end is another key */
    big[PF_META_HASH_MAX - 1] ^= 1;
    expect_owners(f, "ns", big, PF_META_HASH_MAX, NULL, 0);
    big[PF_META_HASH_MAX - 1] ^= 1;
    for (size_t i = 0; i < PF_ARRAY_SIZE(lens); i += 2)
        assert_int_equal(rem1(f, (int)(i & 1), "ns", big, lens[i]), 1);
    expect_counts(f, PF_ARRAY_SIZE(lens) / 2, PF_ARRAY_SIZE(lens) / 2);
    free(big);
}

/* 60000 keys of lengths 1..200 in 3 namespaces: the index grows many times, every key
 * stays findable; removing them all shrinks it back. */
static void test_growth_and_shrink(void **state)
{
    struct fx *f = *state;
    enum { NK = 60000, BATCH = 500 };
    const char *nss[] = {"a", "bb", "ccc"};
    hb(f, 0);
    hb(f, 1);
    uint8_t(*kb)[200] = malloc(sizeof(*kb) * BATCH);
    struct pf_meta_hash *h = malloc(sizeof(*h) * BATCH);
    char name[32];
    uint8_t id[16];
    struct pf_meta_store_stats s0, s1, s2;
    pf_meta_store_get_stats(f->st, &s0);
    for (int pass = 0; pass < 3; pass++) {
        for (int k0 = 0; k0 < NK; k0 += BATCH) {
            for (int j = 0; j < BATCH; j++) {
                int k = k0 + j;
                size_t len = 1 + (size_t)(k * 7919u) % 200;
                if (len < 3)
                    len = 3;
                memset(kb[j], 0, 200);
                kb[j][0] = (uint8_t)k;
                kb[j][1] = (uint8_t)(k >> 8);
                kb[j][2] = (uint8_t)(k >> 16);
                kb[j][len - 1] ^= 0x5a;
                h[j] = (struct pf_meta_hash){len, kb[j]};
            }
            const char *ns = nss[(k0 / BATCH) % 3];
            if (pass < 2) {
                node_of(pass, name, id);
                assert_int_equal(pf_meta_store_insert(f->st, ns, h, BATCH, name, id, NULL), 0);
            } else {
                /* every key answers with both owners (node0 first) over the whole batch */
                struct pf_meta_prefix *res;
                size_t nres;
                assert_int_equal(pf_meta_store_query_prefix(f->st, ns, h, BATCH, &res, &nres), 0);
                assert_int_equal(nres, 2);
                assert_string_equal(res[0].node, "node0:1");
                assert_string_equal(res[1].node, "node1:1");
                assert_int_equal(res[0].prefix_len, BATCH);
                assert_int_equal(res[1].prefix_len, BATCH);
                free(res);
                for (int n = 0; n < 2; n++) {
                    node_of(n, name, id);
                    uint64_t r = 0;
                    assert_int_equal(pf_meta_store_remove(f->st, ns, h, BATCH, name, id, &r), 0);
                    assert_int_equal(r, BATCH);
                }
            }
        }
        if (pass == 1) {
            expect_counts(f, NK, 2 * NK);
            pf_meta_store_get_stats(f->st, &s1);
        }
    }
    expect_counts(f, 0, 0);
    pf_meta_store_get_stats(f->st, &s2);
    /* the index shrank (the arena keeps its pages for reuse) */
    assert_true(s2.bytes < s1.bytes);
    assert_true(s1.bytes > s0.bytes);
    free(kb);
    free(h);
}

/* ---------------------------------------------------------------- model */

enum { M_NN = 40, M_NS = 3, M_NK = 1500, M_MAXLEN = 300 };

struct mown {
    uint8_t node;
    uint32_t reg; /* seconds of the fake clock */
};

struct mkey {
    uint8_t n;
    struct mown o[M_NN];
};

static struct mkey g_model[M_NS][M_NK];
static uint8_t g_keys[M_NK][M_MAXLEN];
static size_t g_klen[M_NK];
static const char *const g_ns[M_NS] = {"m0", "m1", "m2"};

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void model_insert(struct mkey *m, int node, uint32_t now)
{
    for (int i = 0; i < m->n; i++)
        if (m->o[i].node == node) {
            m->o[i].reg = now;
            return;
        }
    m->o[m->n++] = (struct mown){(uint8_t)node, now};
}

static int model_remove(struct mkey *m, int node)
{
    for (int i = 0; i < m->n; i++)
        if (m->o[i].node == node) {
            memmove(m->o + i, m->o + i + 1, (size_t)(m->n - i - 1) * sizeof(m->o[0]));
            m->n--;
            return 1;
        }
    return 0;
}

/* The store's QueryPrefix rule over the model (every node is visible here). */
static size_t model_query(int ns, const int *ks, size_t n, int *nodes, uint64_t *lens)
{
    size_t nacc = 0;
    for (size_t i = 0; i < n; i++) {
        const struct mkey *m = &g_model[ns][ks[i]];
        size_t alive = 0;
        for (int k = 0; k < m->n; k++) {
            size_t j;
            for (j = 0; j < nacc && nodes[j] != m->o[k].node; j++)
                ;
            if (j < nacc) {
                if (lens[j] == i) {
                    lens[j]++;
                    alive++;
                }
            } else if (i == 0) {
                nodes[nacc] = m->o[k].node;
                lens[nacc++] = 1;
                alive++;
            }
        }
        if (m->n == 0 || alive == 0)
            break;
    }
    return nacc;
}

static void test_model_exact(void **state)
{
    struct fx *f = *state;
    uint64_t seed = (uint64_t)time(NULL) * 2654435761u + 1;
    const char *env = getenv("PF_TEST_SEED");
    if (env)
        seed = strtoull(env, NULL, 0);
    printf("seed %llu (PF_TEST_SEED=%llu reruns it)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    uint64_t r = seed ? seed : 1;
    memset(g_model, 0, sizeof(g_model));
    for (int k = 0; k < M_NK; k++) {
        uint64_t x = rng_next(&r);
        size_t len = x % 4 == 0 ? 3 + (size_t)(x >> 8) % (M_MAXLEN - 3) : 32;
        g_klen[k] = len;
        for (size_t b = 0; b < len; b++)
            g_keys[k][b] = (uint8_t)rng_next(&r);
        g_keys[k][0] = (uint8_t)k; /* distinct keys */
        g_keys[k][1] = (uint8_t)(k >> 8);
        g_keys[k][2] = 0xee;
    }
    for (int i = 0; i < M_NN; i++)
        hb(f, i);
    uint32_t now = 0; /* seconds since the store's epoch */
    const int OPS = 40000;
    int peak = 0; /* most owners a key had */
    int ks[64];
    struct pf_meta_hash h[64];
    for (int op = 0; op < OPS; op++) {
        uint64_t x = rng_next(&r);
        int ns = (int)(x % M_NS), node = (int)((x >> 8) % M_NN), kind = (int)((x >> 16) % 1000);
        size_t cnt = 1 + (x >> 24) % 64;
        /* runs of consecutive keys (prefixes), from a hot range half of the time so that keys
         * collect many owners */
        int range = (x >> 40) & 1 ? 80 : M_NK;
        int start = (int)((x >> 41) % (uint64_t)range);
        for (size_t i = 0; i < cnt; i++) {
            ks[i] = (start + (int)i) % M_NK;
            h[i] = (struct pf_meta_hash){g_klen[ks[i]], g_keys[ks[i]]};
        }
        char name[32];
        uint8_t id[16];
        node_of(node, name, id);
        if (kind < 450) {
            assert_int_equal(pf_meta_store_insert(f->st, g_ns[ns], h, cnt, name, id, NULL), 0);
            for (size_t i = 0; i < cnt; i++) {
                model_insert(&g_model[ns][ks[i]], node, now);
                if (g_model[ns][ks[i]].n > peak)
                    peak = g_model[ns][ks[i]].n;
            }
        } else if (kind < 600) {
            uint64_t got = 0, want = 0;
            assert_int_equal(pf_meta_store_remove(f->st, g_ns[ns], h, cnt, name, id, &got), 0);
            for (size_t i = 0; i < cnt; i++)
                want += (uint64_t)model_remove(&g_model[ns][ks[i]], node);
            assert_int_equal(got, want);
        } else if (kind < 995) {
            struct pf_meta_prefix *res;
            size_t nres;
            assert_int_equal(pf_meta_store_query_prefix(f->st, g_ns[ns], h, cnt, &res, &nres), 0);
            int nodes[M_NN];
            uint64_t lens[M_NN];
            size_t want = model_query(ns, ks, cnt, nodes, lens);
            if (nres != want)
                fail_msg("op %d (seed %llu): %zu answers, model %zu", op, (unsigned long long)seed,
                         nres, want);
            for (size_t i = 0; i < nres; i++) {
                char wn[32];
                uint8_t wid[16];
                node_of(nodes[i], wn, wid);
                assert_string_equal(res[i].node, wn);
                assert_int_equal(res[i].prefix_len, lens[i]);
            }
            free(res);
        } else if (kind < 998) {
            uint64_t got = 0, want = 0;
            assert_int_equal(pf_meta_store_unregister(f->st, name, id, &got), 0);
            for (int n = 0; n < M_NS; n++)
                for (int k = 0; k < M_NK; k++)
                    want += (uint64_t)model_remove(&g_model[n][k], node);
            assert_int_equal(got, want);
            hb(f, node);
        } else {
            /* time passes (every node heartbeats), then a sweep drops owners past the TTL */
            uint32_t adv = 50 + (uint32_t)((x >> 48) % 400);
            pf_fake_clock_advance(&f->clk, adv * SEC);
            now += adv;
            for (int i = 0; i < M_NN; i++)
                hb(f, i);
            struct pf_meta_sweep_stats sw;
            pf_meta_store_sweep(f->st, &sw);
            uint64_t owners = 0, keys = 0;
            for (int n = 0; n < M_NS; n++)
                for (int k = 0; k < M_NK; k++) {
                    struct mkey *m = &g_model[n][k];
                    int keep = 0, had = m->n;
                    for (int i = 0; i < m->n; i++)
                        if (now - m->o[i].reg <= 600)
                            m->o[keep++] = m->o[i];
                    m->n = (uint8_t)keep;
                    owners += (uint64_t)(had - keep);
                    keys += had && !keep;
                }
            assert_int_equal(sw.removed_owners, owners);
            assert_int_equal(sw.removed_keys, keys);
        }
        /* a tick of the clock now and then, with heartbeats keeping every node visible */
        if (op % 200 == 199) {
            pf_fake_clock_advance(&f->clk, SEC);
            now++;
            for (int i = 0; i < M_NN; i++)
                hb(f, i);
        }
    }
    uint64_t entries = 0, owners = 0;
    int maxown = 0;
    for (int n = 0; n < M_NS; n++)
        for (int k = 0; k < M_NK; k++) {
            entries += g_model[n][k].n > 0;
            owners += g_model[n][k].n;
            if (g_model[n][k].n > maxown)
                maxown = g_model[n][k].n;
        }
    printf("model: %llu keys, %llu owners, up to %d owners a key now, %d at the peak\n",
           (unsigned long long)entries, (unsigned long long)owners, maxown, peak);
    assert_true(peak > 16); /* the workload reached big entries (past the inline slots) */
    expect_counts(f, entries, owners);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_many_owners_and_middle_removal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hash_lengths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_growth_and_shrink, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_exact, setup, teardown),
    };
    return cmocka_run_group_tests_name("memory store layout", tests, NULL, NULL);
}

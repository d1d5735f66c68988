/* MetaServer store semantics with a fake clock: sessions and takeover, visibility vs
 * retention, reclaimable rule, per-node prefix answers, removal matching, TTL sweep,
 * unregister, malformed input, and a randomized model check of the sharded table.
 *
 * Every test runs twice: against the memory store, then against the Redis store on a
 * redis-server this test starts on a free loopback port (flushed before each test). Without
 * redis-server the Redis half prints a SKIP line (the memory half still counts). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "pf/meta.h"
#include "pf/metrics.h"
#include "pfredis.h"

#define SEC PF_NS_PER_SEC

static const uint8_t U1[16] = {1}, U2[16] = {2}, U3[16] = {3}, U4[16] = {4}, U5[16] = {5};

static struct pft_redis g_redis;
static const char *g_store; /* NULL: memory store */

struct fx {
    struct pf_fake_clock clk;
    struct pf_meta_store *st;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    pf_fake_clock_init(&f->clk, 1000 * SEC);
    struct pf_meta_store_config cfg = {
        .node_stale_secs = 30, .ttl_secs = 600, .clock = &f->clk.base, .store = g_store};
    if (g_store)
        assert_int_equal(pft_redis_cmd(&g_redis, "FLUSHALL"), 0);
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

/* keys "k<i>" */
static struct pf_meta_hash *keys(int lo, int hi, char buf[][16])
{
    static struct pf_meta_hash h[256];
    for (int i = lo; i <= hi; i++) {
        int n = snprintf(buf[i - lo], 16, "k%d", i);
        h[i - lo].len = (size_t)n;
        h[i - lo].data = (const uint8_t *)buf[i - lo];
    }
    return h;
}

static int ins(struct fx *f, const char *node, const uint8_t *id, int lo, int hi, bool *recl)
{
    char buf[256][16];
    return pf_meta_store_insert(f->st, "ns", keys(lo, hi, buf), (size_t)(hi - lo + 1), node, id,
                                recl);
}

static uint64_t rem(struct fx *f, const char *node, const uint8_t *id, int lo, int hi, int *rc_p)
{
    char buf[256][16];
    uint64_t removed = 12345;
    int rc = pf_meta_store_remove(f->st, "ns", keys(lo, hi, buf), (size_t)(hi - lo + 1), node, id,
                                  &removed);
    if (rc_p)
        *rc_p = rc;
    return removed;
}

/* prefix_len of node in a query over k<lo>..k<hi>, 0 when absent */
static uint64_t plen(struct fx *f, const char *node, int lo, int hi, size_t *nres_p)
{
    char buf[256][16];
    struct pf_meta_prefix *res = NULL;
    size_t nres = 99;
    assert_int_equal(pf_meta_store_query_prefix(f->st, "ns", keys(lo, hi, buf),
                                                (size_t)(hi - lo + 1), &res, &nres),
                     0);
    uint64_t v = 0;
    for (size_t i = 0; i < nres; i++) {
        assert_true(res[i].prefix_len > 0);
        if (strcmp(res[i].node, node) == 0)
            v = res[i].prefix_len;
    }
    if (nres_p)
        *nres_p = nres;
    free(res);
    return v;
}

static void adv(struct fx *f, uint64_t secs)
{
    pf_fake_clock_advance(&f->clk, secs * SEC);
}

static void test_unknown_and_stale_sessions(void **state)
{
    struct fx *f = *state;
    assert_int_equal(ins(f, "a:1", U1, 0, 0, NULL), -ENOENT);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 3, NULL), 0);
    /* another session on the same address while the first is fresh */
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U2), -ESTALE);
    assert_int_equal(ins(f, "a:1", U2, 0, 0, NULL), -ESTALE);
    int rc;
    rem(f, "a:1", U2, 0, 0, &rc);
    assert_int_equal(rc, -ESTALE);
    /* exactly at the stale limit the session is still fresh */
    adv(f, 30);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U2), -ESTALE);
    adv(f, 31);
    /* stale: the new session takes over; the old one is now stale */
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U2), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 0, NULL), -ESTALE);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), -ESTALE);
    /* the old session's owners are not visible through the new session */
    assert_int_equal(plen(f, "a:1", 0, 3, NULL), 0);
    /* the new session re-inserting makes it visible again */
    assert_int_equal(ins(f, "a:1", U2, 0, 1, NULL), 0);
    assert_int_equal(plen(f, "a:1", 0, 3, NULL), 2);
}

static void test_visibility_vs_retention(void **state)
{
    struct fx *f = *state;
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 4, NULL), 0);
    assert_int_equal(plen(f, "a:1", 0, 4, NULL), 5);
    adv(f, 31); /* no heartbeat: hidden ... */
    size_t nres;
    assert_int_equal(plen(f, "a:1", 0, 4, &nres), 0);
    assert_int_equal(nres, 0);
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.nodes_stale, 1);
    assert_int_equal(s.nodes_active, 0);
    /* ... but retained by the sweep (within the TTL) */
    struct pf_meta_sweep_stats sw;
    pf_meta_store_sweep(f->st, &sw);
    assert_int_equal(sw.removed_owners, 0);
    assert_int_equal(sw.removed_nodes, 0);
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.entries, 5);
    /* a heartbeat of the same session makes them visible again */
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(plen(f, "a:1", 0, 4, NULL), 5);
    /* an insert also refreshes the session */
    adv(f, 31);
    assert_int_equal(plen(f, "a:1", 0, 4, NULL), 0);
    assert_int_equal(ins(f, "a:1", U1, 9, 9, NULL), 0);
    assert_int_equal(plen(f, "a:1", 0, 4, NULL), 5);
}

static void test_reclaimable_rule(void **state)
{
    struct fx *f = *state;
    const char *nodes[] = {"n1:1", "n2:1", "n3:1", "n4:1", "n5:1"};
    const uint8_t *ids[] = {U1, U2, U3, U4, U5};
    for (int i = 0; i < 5; i++)
        assert_int_equal(pf_meta_store_heartbeat(f->st, nodes[i], ids[i]), 0);
    bool r[4] = {true, true, true, true};
    assert_int_equal(ins(f, nodes[0], ids[0], 0, 1, r), 0);
    assert_false(r[0] || r[1]);
    assert_int_equal(ins(f, nodes[1], ids[1], 0, 1, r), 0);
    assert_false(r[0] || r[1]);
    /* third visible owner: reclaimable */
    assert_int_equal(ins(f, nodes[2], ids[2], 0, 0, r), 0);
    assert_true(r[0]);
    /* re-insert by an existing owner: not new, not reclaimable */
    assert_int_equal(ins(f, nodes[2], ids[2], 0, 0, r), 0);
    assert_false(r[0]);
    /* fourth: reclaimable */
    assert_int_equal(ins(f, nodes[3], ids[3], 0, 0, r), 0);
    assert_true(r[0]);
    /* stale owners do not count: n1, n2 go stale; key 1 has n1, n2 (stale) + n5 */
    adv(f, 20);
    assert_int_equal(pf_meta_store_heartbeat(f->st, nodes[4], ids[4]), 0);
    adv(f, 11); /* n1..n4 last seen 31 s ago, n5 11 s ago */
    assert_int_equal(ins(f, nodes[4], ids[4], 1, 1, r), 0);
    assert_false(r[0]);
    /* a new session on the same address counts as a new owner */
    assert_int_equal(pf_meta_store_heartbeat(f->st, nodes[0], U5), 0); /* takeover of n1 */
    assert_int_equal(pf_meta_store_heartbeat(f->st, nodes[1], ids[1]), 0);
    assert_int_equal(ins(f, nodes[0], U5, 1, 1, r), 0);
    assert_true(r[0]); /* n1 (new session), n2 (refreshed), n5 */
    /* several keys in one call: each one's answer is its own (not only the last one's) */
    bool r4[4] = {false, false, false, false};
    assert_int_equal(ins(f, nodes[1], ids[1], 10, 13, r4), 0);
    assert_int_equal(ins(f, nodes[4], ids[4], 10, 13, r4), 0);
    assert_false(r4[0] || r4[1] || r4[2] || r4[3]);
    assert_int_equal(ins(f, nodes[0], U5, 10, 13, r4), 0);
    assert_true(r4[0] && r4[1] && r4[2] && r4[3]);
}

static void test_prefix_several_nodes(void **state)
{
    struct fx *f = *state;
    assert_int_equal(pf_meta_store_heartbeat(f->st, "A:1", U1), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "B:1", U2), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "C:1", U3), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "D:1", U4), 0);
    assert_int_equal(ins(f, "A:1", U1, 0, 9, NULL), 0);
    assert_int_equal(ins(f, "B:1", U2, 0, 4, NULL), 0);
    assert_int_equal(ins(f, "C:1", U3, 0, 2, NULL), 0);
    assert_int_equal(ins(f, "C:1", U3, 5, 9, NULL), 0);
    assert_int_equal(ins(f, "D:1", U4, 1, 9, NULL), 0);
    size_t nres;
    assert_int_equal(plen(f, "A:1", 0, 11, &nres), 10);
    assert_int_equal(nres, 3); /* D omitted: it lacks hash 0 */
    assert_int_equal(plen(f, "B:1", 0, 11, NULL), 5);
    assert_int_equal(plen(f, "C:1", 0, 11, NULL), 3);
    assert_int_equal(plen(f, "D:1", 0, 11, NULL), 0);
    /* the walk stops at the first hash without a visible owner */
    assert_int_equal(pf_meta_store_remove(f->st, "ns",
                                          &(struct pf_meta_hash){2, (const uint8_t *)"k3"}, 1,
                                          "A:1", U1, &(uint64_t){0}),
                     0);
    assert_int_equal(plen(f, "A:1", 0, 11, NULL), 3); /* k3 still owned by B and D */
    assert_int_equal(plen(f, "B:1", 0, 11, NULL), 5);
    assert_int_equal(pf_meta_store_remove(f->st, "ns",
                                          &(struct pf_meta_hash){2, (const uint8_t *)"k3"}, 1,
                                          "B:1", U2, &(uint64_t){0}),
                     0);
    assert_int_equal(pf_meta_store_remove(f->st, "ns",
                                          &(struct pf_meta_hash){2, (const uint8_t *)"k3"}, 1,
                                          "D:1", U4, &(uint64_t){0}),
                     0);
    assert_int_equal(plen(f, "A:1", 0, 11, NULL), 3);
    assert_int_equal(plen(f, "B:1", 0, 11, NULL), 3);
    /* a query starting at k5 sees A, C and D */
    assert_int_equal(plen(f, "C:1", 5, 11, &nres), 5);
    assert_int_equal(nres, 3);
    /* stale D is hidden */
    adv(f, 25);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "A:1", U1), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "C:1", U3), 0);
    adv(f, 10);
    assert_int_equal(plen(f, "D:1", 5, 11, &nres), 0);
    assert_int_equal(nres, 2);
    /* unknown namespace: no answer */
    struct pf_meta_prefix *res = (void *)1;
    assert_int_equal(pf_meta_store_query_prefix(f->st, "other",
                                                &(struct pf_meta_hash){2, (const uint8_t *)"k0"}, 1,
                                                &res, &nres),
                     0);
    assert_int_equal(nres, 0);
    assert_null(res);
}

static void test_remove_matches_node_and_session(void **state)
{
    struct fx *f = *state;
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "b:1", U2), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 9, NULL), 0);
    assert_int_equal(ins(f, "b:1", U2, 0, 4, NULL), 0);
    /* a's new session cannot remove the old session's entries */
    adv(f, 31);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "b:1", U2), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U3), 0);
    assert_int_equal(rem(f, "a:1", U3, 0, 9, NULL), 0);
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.owners, 15);
    /* b removes its own */
    assert_int_equal(rem(f, "b:1", U2, 0, 9, NULL), 5);
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.owners, 10);
    assert_int_equal(s.entries, 10);
    /* re-insert by a's new session replaces the old session's owner entry */
    assert_int_equal(ins(f, "a:1", U3, 0, 4, NULL), 0);
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.owners, 10);
    assert_int_equal(rem(f, "a:1", U3, 0, 9, NULL), 5);
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.entries, 5); /* k5..k9 still owned by the old session */
    /* removing unknown keys / namespaces is fine */
    assert_int_equal(rem(f, "a:1", U3, 50, 60, NULL), 0);
    uint64_t r = 7;
    assert_int_equal(pf_meta_store_remove(f->st, "nope",
                                          &(struct pf_meta_hash){1, (const uint8_t *)"x"}, 1, "a:1",
                                          U3, &r),
                     0);
    assert_int_equal(r, 0);
}

static void test_ttl_sweep(void **state)
{
    struct fx *f = *state; /* stale 30 s, ttl 600 s */
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "b:1", U2), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 9, NULL), 0);
    assert_int_equal(ins(f, "b:1", U2, 0, 4, NULL), 0);
    /* a heartbeats all along but never re-registers: TTL counts from registration */
    for (int i = 0; i < 20; i++) {
        adv(f, 20);
        assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    }
    /* t = 400 s: a re-registers k0..k2 (refresh), b is silent since t = 0 */
    assert_int_equal(ins(f, "a:1", U1, 0, 2, NULL), 0);
    for (int i = 0; i < 11; i++) {
        adv(f, 20);
        assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    }
    /* t = 620 s: b's record is older than the TTL; a's owners k3..k9 too */
    struct pf_meta_sweep_stats sw;
    pf_meta_store_sweep(f->st, &sw);
    assert_int_equal(sw.removed_nodes, 1);
    assert_int_equal(sw.removed_owners, 7 + 5);
    assert_int_equal(sw.removed_keys, 7);
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.owners, 3);
    assert_int_equal(s.nodes_active, 1);
    assert_int_equal(s.nodes_stale, 0);
    assert_int_equal(s.redundancy[0], 3);
    assert_int_equal(s.visible_copies, 3);
    assert_int_equal(plen(f, "a:1", 0, 9, NULL), 3);
    /* b is unknown now; b's session was garbage-collected */
    assert_int_equal(ins(f, "b:1", U2, 0, 0, NULL), -ENOENT);
    assert_int_equal(s.sessions, 1);
    /* metrics */
    assert_true(pf_metric_value_of("pegaflow_metaserver_sweep_removed_nodes", NULL) >= 1);
    assert_true(pf_metric_value_of("pegaflow_metaserver_sweep_removed_owners", NULL) >= 12);
}

static void test_sweep_keeps_stale_within_ttl_and_redundancy(void **state)
{
    struct fx *f = *state;
    const char *nodes[] = {"n1:1", "n2:1", "n3:1", "n4:1", "n5:1"};
    const uint8_t *ids[] = {U1, U2, U3, U4, U5};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(pf_meta_store_heartbeat(f->st, nodes[i], ids[i]), 0);
        assert_int_equal(ins(f, nodes[i], ids[i], 0, i, NULL), 0);
    }
    /* k0: 5 owners, k1: 4, k2: 3, k3: 2, k4: 1 */
    pf_meta_store_sweep(f->st, NULL);
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.redundancy[0], 1);
    assert_int_equal(s.redundancy[1], 1);
    assert_int_equal(s.redundancy[2], 1);
    assert_int_equal(s.redundancy[3], 2);
    assert_int_equal(s.visible_copies, 15);
    /* n5 goes stale: hidden, kept */
    adv(f, 20);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pf_meta_store_heartbeat(f->st, nodes[i], ids[i]), 0);
    adv(f, 20);
    pf_meta_store_sweep(f->st, NULL);
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.owners, 15);
    assert_int_equal(s.visible_copies, 10);
    assert_int_equal(s.redundancy[0] + s.redundancy[1] + s.redundancy[2] + s.redundancy[3], 4);
}

static void test_unregister(void **state)
{
    struct fx *f = *state;
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "b:1", U2), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 99, NULL), 0);
    assert_int_equal(ins(f, "b:1", U2, 50, 149, NULL), 0);
    uint64_t removed = 1;
    /* wrong session: nothing happens, the record stays */
    assert_int_equal(pf_meta_store_unregister(f->st, "a:1", U3, &removed), 0);
    assert_int_equal(removed, 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 0, NULL), 0);
    /* unknown node */
    assert_int_equal(pf_meta_store_unregister(f->st, "zz:1", U3, &removed), 0);
    assert_int_equal(removed, 0);
    assert_int_equal(pf_meta_store_unregister(f->st, "a:1", U1, &removed), 0);
    assert_int_equal(removed, 100);
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.entries, 100);
    assert_int_equal(s.owners, 100);
    assert_int_equal(ins(f, "a:1", U1, 0, 0, NULL), -ENOENT);
    assert_int_equal(plen(f, "b:1", 50, 149, NULL), 100);
    /* the session is collected by the next sweep; a re-registration works */
    pf_meta_store_sweep(f->st, NULL);
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.sessions, 1);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 9, NULL), 0);
    assert_int_equal(plen(f, "a:1", 0, 9, NULL), 10);
}

static void test_malformed(void **state)
{
    struct fx *f = *state;
    assert_int_equal(pf_meta_store_heartbeat(f->st, "", U1), -EINVAL);
    assert_int_equal(pf_meta_store_heartbeat(f->st, NULL, U1), -EINVAL);
    char longnode[PF_META_NODE_MAX + 2];
    memset(longnode, 'x', sizeof(longnode) - 1);
    longnode[sizeof(longnode) - 1] = '\0';
    assert_int_equal(pf_meta_store_heartbeat(f->st, longnode, U1), -EINVAL);
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    struct pf_meta_hash good = {1, (const uint8_t *)"x"}, empty = {0, (const uint8_t *)""};
    struct pf_meta_hash two[2] = {good, empty};
    assert_int_equal(pf_meta_store_insert(f->st, "ns", &good, 0, "a:1", U1, NULL), -EINVAL);
    assert_int_equal(pf_meta_store_insert(f->st, "ns", two, 2, "a:1", U1, NULL), -EINVAL);
    assert_int_equal(pf_meta_store_insert(f->st, "", &good, 1, "a:1", U1, NULL), -EINVAL);
    assert_int_equal(pf_meta_store_insert(f->st, NULL, &good, 1, "a:1", U1, NULL), -EINVAL);
    uint64_t r;
    assert_int_equal(pf_meta_store_remove(f->st, "ns", &good, 0, "a:1", U1, &r), -EINVAL);
    struct pf_meta_prefix *res;
    size_t nres;
    assert_int_equal(pf_meta_store_query_prefix(f->st, "ns", &good, 0, &res, &nres), -EINVAL);
    assert_int_equal(pf_meta_store_query_prefix(f->st, "", &good, 1, &res, &nres), -EINVAL);
    assert_int_equal(pf_meta_store_query_prefix(f->st, "ns", two, 2, &res, &nres), -EINVAL);
    struct pf_meta_store *st2;
    struct pf_meta_store_config bad = {.node_stale_secs = 0, .ttl_secs = 10};
    assert_int_equal(pf_meta_store_create(&bad, &st2), -EINVAL);
    bad.node_stale_secs = 1;
    bad.ttl_secs = 0;
    assert_int_equal(pf_meta_store_create(&bad, &st2), -EINVAL);
    pf_meta_store_destroy(NULL);
    /* long hashes and many owners use the large-entry path */
    uint8_t big[2000];
    memset(big, 7, sizeof(big));
    struct pf_meta_hash bh = {sizeof(big), big};
    assert_int_equal(pf_meta_store_insert(f->st, "ns", &bh, 1, "a:1", U1, NULL), 0);
    assert_int_equal(pf_meta_store_query_prefix(f->st, "ns", &bh, 1, &res, &nres), 0);
    assert_int_equal(nres, 1);
    free(res);
}

/* Randomized: many keys and owners against a simple model (owner bitmap per key). */
static void test_model_random(void **state)
{
    struct fx *f = *state;
    enum { NN = 6 };
    /* fewer operations over Redis (each one is a script call), same coverage of the model */
    const int NK = g_store ? 2000 : 20000, OPS = g_store ? 3000 : 60000;
    unsigned seed = (unsigned)time(NULL);
    printf("seed %u\n", seed);
    srand(seed);
    static uint8_t model[20000];
    memset(model, 0, sizeof(model));
    char names[NN][24];
    uint8_t ids[NN][16];
    for (int n = 0; n < NN; n++) {
        snprintf(names[n], sizeof(names[n]), "node%d:1", n);
        memset(ids[n], 0, 16);
        ids[n][0] = (uint8_t)(n + 10);
        assert_int_equal(pf_meta_store_heartbeat(f->st, names[n], ids[n]), 0);
    }
    char kb[64][24];
    struct pf_meta_hash h[64];
    for (int op = 0; op < OPS; op++) {
        int n = rand() % NN, cnt = 1 + rand() % 64;
        bool insert = rand() % 3 != 0;
        for (int i = 0; i < cnt; i++) {
            int k = rand() % NK;
            int l = snprintf(kb[i], sizeof(kb[i]), "key-%d-%d", k, k * 7919);
            h[i] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[i]};
            if (insert)
                model[k] |= (uint8_t)(1u << n);
            else
                model[k] &= (uint8_t) ~(1u << n);
        }
        if (insert) {
            assert_int_equal(
                pf_meta_store_insert(f->st, "ns", h, (size_t)cnt, names[n], ids[n], NULL), 0);
        } else {
            uint64_t r;
            assert_int_equal(
                pf_meta_store_remove(f->st, "ns", h, (size_t)cnt, names[n], ids[n], &r), 0);
        }
    }
    /* unregister one node midway through the check */
    assert_int_equal(pf_meta_store_unregister(f->st, names[0], ids[0], &(uint64_t){0}), 0);
    uint64_t entries = 0, owners = 0;
    for (int k = 0; k < NK; k++) {
        model[k] &= (uint8_t)~1u;
        if (model[k])
            entries++;
        owners += (uint64_t)__builtin_popcount(model[k]);
        int l = snprintf(kb[0], sizeof(kb[0]), "key-%d-%d", k, k * 7919);
        h[0] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[0]};
        struct pf_meta_prefix *res;
        size_t nres;
        assert_int_equal(pf_meta_store_query_prefix(f->st, "ns", h, 1, &res, &nres), 0);
        uint8_t got = 0;
        for (size_t i = 0; i < nres; i++) {
            int idx = atoi(res[i].node + 4);
            got |= (uint8_t)(1u << idx);
        }
        free(res);
        assert_int_equal(got, model[k]);
    }
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_int_equal(s.entries, entries);
    assert_int_equal(s.owners, owners);
    /* Multi-hash prefix queries against the model (QueryPrefix pipelines its lookups several
     * hashes ahead): up to 64 keys that one node owns, in random order, with a random key
     * spliced in at a random position; every node's prefix is its run of owned keys from the
     * first, and a node that owns none of the first key is absent. */
    static int owned[20000];
    for (int q = 0; q < 2000; q++) {
        int b = 1 + rand() % (NN - 1), no = 0;
        for (int k = 0; k < NK; k++)
            if (model[k] & (1u << b))
                owned[no++] = k;
        if (no == 0)
            continue;
        int len = 1 + rand() % 64, splice = rand() % (len + 8);
        int qk[64];
        for (int i = 0; i < len; i++) {
            qk[i] = i == splice ? rand() % NK : owned[rand() % no];
            int l = snprintf(kb[i], sizeof(kb[i]), "key-%d-%d", qk[i], qk[i] * 7919);
            h[i] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[i]};
        }
        struct pf_meta_prefix *res;
        size_t nres;
        assert_int_equal(pf_meta_store_query_prefix(f->st, "ns", h, (size_t)len, &res, &nres), 0);
        uint64_t got[NN] = {0}, want[NN] = {0};
        for (size_t i = 0; i < nres; i++)
            got[atoi(res[i].node + 4)] = res[i].prefix_len;
        free(res);
        for (int n = 0; n < NN; n++) {
            while (want[n] < (uint64_t)len && (model[qk[want[n]]] & (1u << n)))
                want[n]++;
            assert_int_equal(got[n], want[n]);
        }
    }
}

struct conc {
    struct pf_meta_store *st;
    int id;
};

static void *conc_worker(void *arg)
{
    struct conc *c = arg;
    char node[16];
    uint8_t uid[16] = {0};
    uid[0] = (uint8_t)(100 + c->id);
    snprintf(node, sizeof(node), "c%d:1", c->id);
    pf_meta_store_heartbeat(c->st, node, uid);
    char kb[32][16];
    struct pf_meta_hash h[32];
    for (int round = 0; round < 300; round++) {
        for (int i = 0; i < 32; i++) {
            int l = snprintf(kb[i], sizeof(kb[i]), "x%d", (round * 32 + i) % 2000);
            h[i] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[i]};
        }
        bool r[32];
        pf_meta_store_insert(c->st, "ns", h, 32, node, uid, r);
        struct pf_meta_prefix *res;
        size_t nres;
        if (pf_meta_store_query_prefix(c->st, "ns", h, 32, &res, &nres) == 0)
            free(res);
        if (round % 3 == 0)
            pf_meta_store_remove(c->st, "ns", h, 16, node, uid, &(uint64_t){0});
        if (round % 50 == 0)
            pf_meta_store_sweep(c->st, NULL);
        if (round % 100 == 99)
            pf_meta_store_unregister(c->st, node, uid, &(uint64_t){0}),
                pf_meta_store_heartbeat(c->st, node, uid);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    struct fx *f = *state;
    pthread_t th[4];
    struct conc c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (struct conc){f->st, i};
        pthread_create(&th[i], NULL, conc_worker, &c[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    struct pf_meta_store_stats s;
    pf_meta_store_get_stats(f->st, &s);
    assert_true(s.entries <= 2000);
    assert_true(s.owners >= s.entries);
}

/* Redis store only: Redis dies -> every call fails fast with -ENOTCONN (the service answers
 * UNAVAILABLE); Redis comes back (empty) -> the store works again by itself. */
static void test_redis_down_and_back(void **state)
{
    struct fx *f = *state;
    assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 9, NULL), 0);
    assert_int_equal(pft_redis_kill(&g_redis), 0);
    struct pf_meta_prefix *res;
    size_t nres;
    struct pf_meta_hash h = {2, (const uint8_t *)"k0"};
    for (int i = 0; i < 20; i++) {
        assert_int_equal(pf_meta_store_heartbeat(f->st, "a:1", U1), -ENOTCONN);
        assert_int_equal(ins(f, "a:1", U1, 0, 0, NULL), -ENOTCONN);
        assert_int_equal(pf_meta_store_query_prefix(f->st, "ns", &h, 1, &res, &nres), -ENOTCONN);
    }
    struct pf_meta_sweep_stats sw;
    pf_meta_store_sweep(f->st, &sw); /* fails, logs, counts nothing */
    assert_int_equal(sw.removed_owners, 0);
    assert_int_equal(pft_redis_restart(&g_redis, NULL), 0);
    /* back within the client's back-off (at most 2 s): wait with a deadline */
    uint64_t dl = pf_now_ns() + 20 * SEC;
    int rc;
    while ((rc = pf_meta_store_heartbeat(f->st, "a:1", U1)) == -ENOTCONN && pf_now_ns() < dl)
        pf_sleep_ms(20);
    assert_int_equal(rc, 0);
    assert_int_equal(ins(f, "a:1", U1, 0, 4, NULL), 0);
    assert_int_equal(plen(f, "a:1", 0, 9, NULL), 5); /* the restarted Redis was empty */
}

/* AUTH from the URL (redis://[USER:]PASSWORD@...): the right password works, a wrong one or
 * none fails like an unreachable Redis (-ENOTCONN: UNAVAILABLE, logged "AUTH failed"). */
static void test_redis_auth(void **state)
{
    (void)state;
    struct pft_redis r;
    const char *args[] = {"--requirepass", "s3cret", NULL};
    assert_int_equal(pft_redis_start(&r, args), 0);
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 1000 * SEC);
    const char *urls[] = {"redis://:s3cret@127.0.0.1:%d", "redis://:wrong@127.0.0.1:%d",
                          "redis://127.0.0.1:%d", "redis://default:s3cret@127.0.0.1:%d"};
    const int want[] = {0, -ENOTCONN, -ENOTCONN, 0};
    for (size_t i = 0; i < 4; i++) {
        char url[96];
        snprintf(url, sizeof(url), urls[i], r.port);
        struct pf_meta_store_config cfg = {
            .node_stale_secs = 30, .ttl_secs = 600, .clock = &clk.base, .store = url};
        struct pf_meta_store *st;
        assert_int_equal(pf_meta_store_create(&cfg, &st), 0);
        assert_int_equal(pf_meta_store_heartbeat(st, "a:1", U1), want[i]);
        pf_meta_store_destroy(st);
    }
    struct pf_meta_store_config bad = {
        .node_stale_secs = 30, .ttl_secs = 600, .store = "rediss://127.0.0.1:1"};
    struct pf_meta_store *st;
    assert_int_equal(pf_meta_store_create(&bad, &st), -EINVAL);
    bad.store = "redis://nohostport";
    assert_int_equal(pf_meta_store_create(&bad, &st), -EINVAL);
    bad.store = "http://127.0.0.1:1";
    assert_int_equal(pf_meta_store_create(&bad, &st), -EINVAL);
    pft_redis_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unknown_and_stale_sessions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_visibility_vs_retention, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reclaimable_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_several_nodes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_matches_node_and_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ttl_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sweep_keeps_stale_within_ttl_and_redundancy, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_unregister, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_random, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
    };
    int rc = cmocka_run_group_tests_name("memory store", tests, NULL, NULL);
    if (!pft_redis_available()) {
        printf("SKIP redis store half: redis-server not installed (ci/install-deps.sh)\n");
        return rc;
    }
    if (pft_redis_start(&g_redis, NULL) != 0) {
        printf("FAIL: could not start redis-server\n");
        return 1;
    }
    g_store = g_redis.url;
    printf("redis store on %s\n", g_store);
    rc |= cmocka_run_group_tests_name("redis store", tests, NULL, NULL);
    const struct CMUnitTest redis_only[] = {
        cmocka_unit_test_setup_teardown(test_redis_down_and_back, setup, teardown),
        cmocka_unit_test(test_redis_auth),
    };
    rc |= cmocka_run_group_tests_name("redis store only", redis_only, NULL, NULL);
    pft_redis_stop(&g_redis);
    return rc;
}

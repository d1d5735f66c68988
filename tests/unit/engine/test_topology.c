/* Instance topology (reference §3.2): storage groups and their slots, page-first shards
 * (replicas, layer split, offsets), every sealing rejection with its message, and the
 * group-suffixed cache keys (§2.3). Workers are built in memory: no GPU is involved. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine_internal.h"

struct lspec {
    const char *name;
    uint64_t bytes; /* copy_len */
    uint32_t group;
    bool split;
};

#define MAXW 8

struct topo {
    struct pf_instance in;
    struct pf_worker *w[MAXW];
};

/* Adds a worker (device = index) with the given layers; host_stride = copy_len rounded to
 * 512 when pad. */
static void add_worker(struct topo *t, uint32_t tp_rank, uint32_t pp_rank, const struct lspec *ls,
                       size_t n, bool pad)
{
    struct pf_worker *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    w->device_id = (int32_t)t->in.nworkers;
    w->tp_rank = tp_rank;
    w->pp_rank = pp_rank;
    w->layers = calloc(n, sizeof(*w->layers));
    w->nlayers = n;
    for (size_t i = 0; i < n; i++) {
        struct pf_layer_reg *l = &w->layers[i];
        l->name = strdup(ls[i].name);
        l->group = ls[i].group;
        l->lay.copy_len = ls[i].bytes;
        l->lay.nseg = ls[i].split ? 2 : 1;
        l->lay.kv_stride = ls[i].split ? 1 << 20 : 0;
        l->lay.host_stride = pad ? (ls[i].bytes + 511) / 512 * 512 : ls[i].bytes;
        l->layer_id = -1;
    }
    assert_int_equal(pf_worker_index_layers(w), 0);
    t->w[t->in.nworkers] = w;
    t->in.nworkers++;
}

static void topo_init(struct topo *t, uint32_t tp_size, bool page_first)
{
    memset(t, 0, sizeof(*t));
    t->in.tp_size = tp_size;
    t->in.page_first = page_first;
    t->in.workers = t->w;
}

static void topo_free(struct topo *t)
{
    pf_topology_free(&t->in);
    for (size_t i = 0; i < t->in.nworkers; i++) {
        for (size_t j = 0; j < t->w[i]->nlayers; j++)
            free(t->w[i]->layers[j].name);
        free(t->w[i]->layers);
        free(t->w[i]->by_name);
        free(t->w[i]);
    }
}

static void expect_reject(struct topo *t, const char *want)
{
    char err[512] = "";
    assert_int_equal(pf_topology_seal(&t->in, err, sizeof(err)), -EINVAL);
    if (!strstr(err, want))
        fail_msg("error '%s' does not contain '%s'", err, want);
    /* nothing is left behind by a rejected seal */
    assert_null(t->in.layer_names);
    assert_null(t->in.topo);
    assert_null(t->in.group_slots);
    assert_null(t->in.shard_bytes);
    topo_free(t);
}

static void seal_ok(struct topo *t)
{
    char err[512] = "";
    int rc = pf_topology_seal(&t->in, err, sizeof(err));
    if (rc)
        fail_msg("seal failed: %d %s", rc, err);
}

static int slot(struct topo *t, const char *name, uint32_t rank)
{
    return pf_instance_slot(&t->in, name, rank);
}

static void test_single_group(void **st)
{
    struct topo t;
    topo_init(&t, 2, false);
    struct lspec ls[] = {{"b", 100, 0, false}, {"a", 100, 0, true}};
    add_worker(&t, 0, 0, ls, 2, false);
    add_worker(&t, 1, 0, ls, 2, false);
    seal_ok(&t);
    assert_int_equal(t.in.ngroups, 1);
    assert_int_equal(t.in.total_slots, 4);
    assert_int_equal(pf_instance_group_slots(&t.in, 0), 4);
    assert_int_equal(slot(&t, "a", 0), 0); /* layer rank x tp_size + tp_rank */
    assert_int_equal(slot(&t, "a", 1), 1);
    assert_int_equal(slot(&t, "b", 0), 2);
    assert_int_equal(slot(&t, "b", 1), 3);
    assert_int_equal(slot(&t, "c", 0), -1);
    assert_int_equal(slot(&t, "a", 2), -1);
    assert_int_equal(t.w[0]->layers[0].layer_id, 1); /* "b" */
    topo_free(&t);
}

static void test_hybrid_groups(void **st)
{
    struct topo t;
    topo_init(&t, 2, false);
    /* groups interleave in name order: l0 g0, l1 g1, l2 g0, l3 g1, l4 g0 */
    struct lspec ls[] = {{"l0", 256, 0, true},
                         {"l1", 4096, 1, false},
                         {"l2", 256, 0, true},
                         {"l3", 4096, 1, false},
                         {"l4", 256, 0, true}};
    add_worker(&t, 0, 0, ls, 5, true);
    add_worker(&t, 1, 0, ls, 5, true);
    seal_ok(&t);
    assert_int_equal(t.in.ngroups, 2);
    assert_int_equal(pf_instance_group_slots(&t.in, 0), 6); /* 3 layers x tp 2 */
    assert_int_equal(pf_instance_group_slots(&t.in, 1), 4); /* 2 layers x tp 2 */
    assert_int_equal(t.in.total_slots, 6);
    assert_int_equal(slot(&t, "l0", 1), 1);
    assert_int_equal(slot(&t, "l2", 0), 2);
    assert_int_equal(slot(&t, "l4", 1), 5);
    assert_int_equal(slot(&t, "l1", 0), 0);
    assert_int_equal(slot(&t, "l1", 1), 1);
    assert_int_equal(slot(&t, "l3", 0), 2);
    assert_int_equal(slot(&t, "l3", 1), 3);
    assert_int_equal(t.in.topo[1].group, 1);
    assert_int_equal(t.in.topo[1].bytes, 4096);
    assert_int_equal(t.in.topo[0].bytes, 1024); /* 256 padded to 512, x 2 segments */
    topo_free(&t);

    /* the recurrent group registered only on one rank: each group still needs every rank */
    topo_init(&t, 2, false);
    add_worker(&t, 0, 0, ls, 5, false);
    add_worker(&t, 1, 0, ls, 3, false);
    expect_reject(&t, "layer l3 has no registration for tp_rank 1");
}

static void test_layer_first_rejects(void **st)
{
    struct topo t;
    /* group ids not dense: the message lists the ids */
    topo_init(&t, 1, false);
    struct lspec g02[] = {{"a", 64, 0, false}, {"b", 64, 2, false}, {"c", 64, 2, false}};
    add_worker(&t, 0, 0, g02, 3, false);
    expect_reject(&t, "layer_group_ids must be dense 0..N-1, but the registered storage groups "
                      "are {0, 2}");
    /* no group 0 at all */
    topo_init(&t, 1, false);
    struct lspec g1[] = {{"a", 64, 1, false}};
    add_worker(&t, 0, 0, g1, 1, false);
    expect_reject(&t, "are {1}");
    /* one layer, two groups on two devices */
    topo_init(&t, 2, false);
    struct lspec a0[] = {{"a", 64, 0, false}, {"b", 64, 1, false}};
    struct lspec a1[] = {{"a", 64, 1, false}, {"b", 64, 1, false}};
    add_worker(&t, 0, 0, a0, 2, false);
    add_worker(&t, 1, 0, a1, 2, false);
    expect_reject(&t, "layer a is registered in storage group 0 on device 0 but in group 1 on "
                      "device 1");
    /* geometry differs between devices */
    topo_init(&t, 2, false);
    struct lspec s0[] = {{"a", 64, 0, false}};
    struct lspec s1[] = {{"a", 128, 0, false}};
    add_worker(&t, 0, 0, s0, 1, false);
    add_worker(&t, 1, 0, s1, 1, false);
    expect_reject(&t, "layer a is registered with different block geometry on different devices "
                      "(device 0 and device 1)");
    /* a tp_rank nobody registered */
    topo_init(&t, 2, false);
    add_worker(&t, 0, 0, s0, 1, false);
    add_worker(&t, 0, 0, s0, 1, false);
    expect_reject(&t, "layer a has no registration for tp_rank 1");
    /* replicas of one (layer, tp_rank) on different pipeline stages */
    topo_init(&t, 1, false);
    add_worker(&t, 0, 0, s0, 1, false);
    add_worker(&t, 0, 1, s0, 1, false);
    expect_reject(&t, "layer a tp_rank 0 is registered by devices with different pp_rank");
}

static void test_page_first_replicas(void **st)
{
    struct topo t;
    topo_init(&t, 1, true);
    /* distinct sizes: offsets are prefix sums of the padded sizes in layer-id order */
    struct lspec ls[] = {{"m.2", 1500, 0, false}, {"m.0", 300, 0, false}, {"m.1", 1024, 0, false}};
    for (int r = 0; r < 4; r++)
        add_worker(&t, 0, 0, ls, 3, true);
    seal_ok(&t);
    assert_int_equal(t.in.nshards, 1);
    assert_int_equal(t.in.total_slots, 1);
    assert_int_equal(pf_instance_group_slots(&t.in, 0), 1);
    assert_int_equal(t.in.shard_bytes[0], 512 + 1024 + 1536);
    assert_int_equal(t.in.topo[0].offset, 0);    /* m.0 */
    assert_int_equal(t.in.topo[1].offset, 512);  /* m.1 */
    assert_int_equal(t.in.topo[2].offset, 1536); /* m.2 */
    for (int r = 0; r < 4; r++)
        assert_int_equal(t.w[r]->shard, 0);
    assert_int_equal(slot(&t, "m.2", 0), 0);
    topo_free(&t);

    /* without an SSD tier the page is the same: pages mean the same on every node */
    topo_init(&t, 1, true);
    add_worker(&t, 0, 0, ls, 3, false);
    seal_ok(&t);
    assert_int_equal(t.in.shard_bytes[0], 3072);
    assert_int_equal(t.in.topo[2].offset, 1536);
    topo_free(&t);
}

static void test_page_first_split(void **st)
{
    struct topo t;
    topo_init(&t, 1, true);
    struct lspec hi[] = {{"m.3", 200, 0, false}, {"m.2", 100, 0, false}};
    struct lspec lo[] = {{"m.0", 100, 0, false}, {"m.1", 300, 0, false}};
    /* two replicas of each half; the high half registers first */
    add_worker(&t, 0, 0, hi, 2, false);
    add_worker(&t, 0, 0, lo, 2, false);
    add_worker(&t, 0, 0, hi, 2, false);
    add_worker(&t, 0, 0, lo, 2, false);
    seal_ok(&t);
    assert_int_equal(t.in.nshards, 2);
    assert_int_equal(t.in.total_slots, 2);
    /* shards ordered by their smallest layer id */
    assert_int_equal(t.w[1]->shard, 0);
    assert_int_equal(t.w[3]->shard, 0);
    assert_int_equal(t.w[0]->shard, 1);
    assert_int_equal(t.w[2]->shard, 1);
    assert_int_equal(t.in.shard_bytes[0], 1024); /* 512-padded layers */
    assert_int_equal(t.in.shard_bytes[1], 1024);
    assert_int_equal(slot(&t, "m.1", 0), 0);
    assert_int_equal(slot(&t, "m.2", 0), 1);
    assert_int_equal(t.in.topo[1].offset, 512); /* m.1 after m.0 */
    assert_int_equal(t.in.topo[2].offset, 0);   /* m.2 opens shard 1 */
    assert_int_equal(t.in.topo[3].offset, 512);
    topo_free(&t);
}

static void test_page_first_rejects(void **st)
{
    struct topo t;
    struct lspec a[] = {{"m.0", 64, 0, false}, {"m.1", 64, 0, false}};
    struct lspec b[] = {{"m.1", 64, 0, false}, {"m.2", 64, 0, false}};
    /* overlapping layer sets */
    topo_init(&t, 1, true);
    add_worker(&t, 0, 0, a, 2, false);
    add_worker(&t, 0, 0, b, 2, false);
    expect_reject(&t, "page_first: the layer sets of device 0 (2 layers) and device 1 (2 layers) "
                      "overlap in layer m.1");
    /* a subset is an overlap too */
    topo_init(&t, 1, true);
    add_worker(&t, 0, 0, a, 2, false);
    add_worker(&t, 0, 0, a, 1, false);
    expect_reject(&t, "overlap in layer m.0");
    /* several storage groups */
    topo_init(&t, 1, true);
    struct lspec g[] = {{"m.0", 64, 0, false}, {"m.1", 64, 1, false}};
    add_worker(&t, 0, 0, g, 2, false);
    expect_reject(&t, "page_first does not support hybrid storage groups (layer_group_ids name 2 "
                      "groups)");
    /* split K/V */
    topo_init(&t, 1, true);
    struct lspec s[] = {{"m.0", 64, 0, false}, {"m.1", 64, 0, true}};
    add_worker(&t, 0, 0, s, 2, false);
    expect_reject(&t, "page_first does not support split K/V layers (layer m.1 on device 0");
    /* tp_size above 1 */
    topo_init(&t, 2, true);
    add_worker(&t, 0, 0, a, 2, false);
    add_worker(&t, 1, 0, a, 2, false);
    expect_reject(&t, "page_first needs tp_size 1");
    /* replicas on different pipeline stages */
    topo_init(&t, 1, true);
    add_worker(&t, 0, 0, a, 2, false);
    add_worker(&t, 0, 1, a, 2, false);
    expect_reject(&t, "tp_rank 0 is registered by devices with different pp_rank");
    /* geometry differs between replicas */
    topo_init(&t, 1, true);
    struct lspec a2[] = {{"m.0", 64, 0, false}, {"m.1", 65, 0, false}};
    add_worker(&t, 0, 0, a, 2, false);
    add_worker(&t, 0, 0, a2, 2, false);
    expect_reject(&t, "layer m.1 is registered with different block geometry");
}

static void test_group_keys(void **st)
{
    uint8_t h[40];
    for (int i = 0; i < 40; i++)
        h[i] = (uint8_t)(0xa0 + i);
    struct pf_block_key k0, k1, kb, raw;
    assert_int_equal(pf_group_key(7, h, 32, 0, &k0), 0);
    assert_int_equal(pf_key_make(7, h, 32, &raw), 0);
    assert_true(pf_key_eq(&k0, &raw)); /* group 0: the raw hash */
    assert_int_equal(pf_group_key(7, h, 32, 1, &k1), 0);
    assert_int_equal(k1.len, 36);
    assert_memory_equal(k1.hash, h, 32);
    const uint8_t one[4] = {0, 0, 0, 1};
    assert_memory_equal(k1.hash + 32, one, 4);
    assert_false(pf_key_eq(&k0, &k1));
    assert_int_equal(pf_group_key(7, h, 16, 0x01020304u, &kb), 0); /* big-endian */
    const uint8_t be[4] = {1, 2, 3, 4};
    assert_int_equal(kb.len, 20);
    assert_memory_equal(kb.hash + 16, be, 4);
    assert_int_equal(k1.ns, 7);
    /* lengths: group 0 up to PF_HASH_MAX, groups > 0 leave room for the suffix */
    assert_int_equal(pf_group_key(7, h, 40, 0, &kb), 0);
    assert_int_equal(pf_group_key(7, h, 36, 3, &kb), 0);
    assert_int_equal(pf_group_key(7, h, 37, 3, &kb), -EINVAL);
    assert_int_equal(pf_group_key(7, h, 0, 3, &kb), -EINVAL);
    assert_int_equal(pf_group_key(7, h, 0, 0, &kb), -EINVAL);
    assert_int_equal(pf_group_hash_max(0), PF_HASH_MAX);
    assert_int_equal(pf_group_hash_max(2), PF_HASH_MAX - 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_group),        cmocka_unit_test(test_hybrid_groups),
        cmocka_unit_test(test_layer_first_rejects), cmocka_unit_test(test_page_first_replicas),
        cmocka_unit_test(test_page_first_split),    cmocka_unit_test(test_page_first_rejects),
        cmocka_unit_test(test_group_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

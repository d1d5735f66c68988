/* The SSD store (src/ssd/store.c): configuration errors naming the flag or the path, the
 * file layout (one file, or directories of shard-NNNNNN.dat files sized capacity / shards
 * rounded down to 512), round-robin placement over shards, the restart = empty cache rule,
 * defaults, stats, and the promoted-block forwarding for the MetaServer client. */
#include <sys/stat.h>

#include <string.h>

#include "ssdtest.h"

#include "ssd/ssd_internal.h"

static int create(struct ssdt *t, struct pf_ssd_config *c, char *err, size_t errlen)
{
    return pf_ssd_create(c, &t->ssd, err, errlen);
}

static void test_config_errors(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 4 << 20, NULL);
    char err[512] = "";
    struct pf_ssd_config c = ssdt_config(&t, 1 << 20);
    c.npaths = 0;
    assert_int_equal(create(&t, &c, err, sizeof(err)), -EINVAL);
    /* too small for its shards */
    c = ssdt_config(&t, 1000);
    c.shards_per_path = 2;
    assert_int_equal(create(&t, &c, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--ssd-cache-capacity"));
    /* the same path twice */
    char p[300];
    snprintf(p, sizeof(p), "%s/d", t.dir);
    const char *twice[2] = {p, p};
    c = ssdt_config(&t, 1 << 20);
    c.paths = twice;
    c.npaths = 2;
    assert_int_equal(create(&t, &c, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "given twice"));
    /* larger than the free space: names the file */
    c = ssdt_config(&t, 1ull << 50);
    assert_int_equal(create(&t, &c, err, sizeof(err)), -ENOSPC);
    assert_non_null(strstr(err, c.paths[0]));
    assert_non_null(strstr(err, "free space"));
    /* unopenable: names the file */
    const char *bad[1] = {"/proc/pf-no-such/cache.dat"};
    c = ssdt_config(&t, 1 << 20);
    c.paths = bad;
    assert_int_not_equal(create(&t, &c, err, sizeof(err)), 0);
    assert_non_null(strstr(err, bad[0]));
    /* a later shard failing closes the earlier ones */
    char ok[300], notdir[300];
    snprintf(ok, sizeof(ok), "%s/okdir", t.dir);
    snprintf(notdir, sizeof(notdir), "%s/file", t.dir);
    FILE *f = fopen(notdir, "w");
    assert_non_null(f);
    fclose(f);
    const char *mixed[2] = {ok, notdir};
    c = ssdt_config(&t, 1 << 20);
    c.paths = mixed;
    c.npaths = 2;
    assert_int_equal(create(&t, &c, err, sizeof(err)), -ENOTDIR);
    assert_non_null(strstr(err, "file/shard-000001.dat"));
    assert_null(t.ssd);
    ssdt_fini(&t);
}

static void test_file_layout(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 4 << 20, NULL);
    /* one path, one shard: the path is the file (parent directories created) */
    char file[300];
    snprintf(file, sizeof(file), "%s/x/y/cache.bin", t.dir);
    const char *one[1] = {file};
    struct pf_ssd_config c = ssdt_config(&t, 1000000);
    c.paths = one;
    ssdt_open(&t, &c);
    struct stat sb;
    assert_int_equal(stat(file, &sb), 0);
    assert_int_equal(sb.st_size, 1000000 / 512 * 512);
    struct pf_ssd_stats s = ssdt_stats(&t);
    assert_int_equal(s.shards, 1);
    assert_int_equal(s.shard_capacity, 1000000 / 512 * 512);
    pf_ssd_destroy(t.ssd);
    /* two paths x three shards: directories of shard-NNNNNN.dat, global ids */
    char d0[300], d1[300];
    snprintf(d0, sizeof(d0), "%s/a", t.dir);
    snprintf(d1, sizeof(d1), "%s/b/", t.dir);
    const char *two[2] = {d0, d1};
    c = ssdt_config(&t, 6 * 100000);
    c.paths = two;
    c.npaths = 2;
    c.shards_per_path = 3;
    ssdt_open(&t, &c);
    for (int i = 0; i < 6; i++) {
        char p[400];
        snprintf(p, sizeof(p), "%s/shard-%06d.dat", i < 3 ? d0 : d1, i);
        if (i >= 3)
            snprintf(p, sizeof(p), "%sshard-%06d.dat", d1, i);
        assert_int_equal(stat(p, &sb), 0);
        assert_int_equal(sb.st_size, 100000 / 512 * 512);
    }
    assert_int_equal(ssdt_stats(&t).shards, 6);
    /* blocks go round-robin over the shards */
    struct pf_block *b[12];
    for (uint32_t i = 0; i < 12; i++)
        b[i] = ssdt_block(&t, 700 + i, 1, 4096, 2, false);
    ssdt_write(&t, b, 12);
    /* each record: its header, then the block */
    uint64_t rec = 8192 + ssd_rec_hdr_len(strlen("ssdtest"), 1);
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(t.ssd->idx.shards[i].ring.head, 2 * rec);
    for (int i = 0; i < 12; i++) {
        struct ssd_entry *e = ssd_index_find(&t.ssd->idx, SSDT_KEY(b[i]));
        assert_non_null(e);
        assert_int_equal(e->shard, i % 6);
        pf_block_put(b[i]);
    }
    ssdt_fini(&t);
}

static void read_sb(struct ssdt *t, uint8_t *buf)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/cache.dat", t->dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, SSD_SB_SIZE, f), SSD_SB_SIZE);
    fclose(f);
}

static void test_restart_is_empty(void **st)
{
    /* --ssd-recover off: the file gets a new identity; nothing of the previous run is
     * indexed, and not even a later run with recovery on serves it */
    struct ssdt t;
    ssdt_init(&t, 4 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 1 << 20);
    ssdt_open(&t, &c);
    struct pf_block *b = ssdt_block(&t, 800, 2, 4096, 2, false);
    ssdt_write(&t, &b, 1);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b), 1), 1);
    pf_ssd_destroy(t.ssd);
    uint8_t buf[SSD_SB_SIZE];
    struct ssd_superblock sb1, sb2;
    uint32_t v;
    read_sb(&t, buf);
    assert_int_equal(ssd_sb_decode(buf, &sb1, &v), 0);
    ssdt_open(&t, &c);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b), 1), 0);
    assert_int_equal(ssdt_stats(&t).committed, 0);
    read_sb(&t, buf);
    assert_int_equal(ssd_sb_decode(buf, &sb2, &v), 0);
    assert_memory_not_equal(sb1.uuid, sb2.uuid, sizeof(sb1.uuid));
    pf_ssd_destroy(t.ssd);
    double idrop =
        pf_metric_value_of("pegaflow_ssd_recovery_dropped_records", (const char *[]){"identity"});
    c.recover = true;
    ssdt_open(&t, &c);
    SSDT_WAIT(ssdt_stats(&t).recovery_done);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b), 1), 0);
    assert_int_equal(ssdt_stats(&t).committed, 0);
    assert_int_equal(
        pf_metric_value_of("pegaflow_ssd_recovery_dropped_records", (const char *[]){"identity"}) -
            idrop,
        1);
    pf_block_put(b);
    ssdt_fini(&t);
}

static void test_defaults_and_offer_edges(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 4 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 1 << 20);
    ssdt_open(&t, &c);
    assert_int_equal(t.ssd->cfg.write_queue_depth, 8);
    assert_int_equal(t.ssd->cfg.prefetch_queue_depth, 2);
    assert_int_equal(t.ssd->cfg.write_inflight, 2);
    assert_int_equal(t.ssd->cfg.prefetch_inflight, 16);
    assert_int_equal(t.ssd->cfg.max_prefetch_blocks, 800);
    assert_int_equal(t.ssd->cfg.shards_per_path, 1);
    assert_int_equal(pf_ssd_offer(t.ssd, NULL, 0), 0);
    assert_int_equal(pf_ssd_flush(t.ssd, 1000), 0);
    struct pf_block *none[1];
    assert_int_equal(pf_ssd_fetch(t.ssd, NULL, 0, false, none), 0);
    assert_int_equal(pf_ssd_probe(t.ssd, NULL, 0), 0);
    ssdt_fini(&t);
}

struct promoted_rec {
    size_t calls, blocks;
};

static void on_promoted(void *ctx, struct pf_block *const *b, size_t n)
{
    struct promoted_rec *r = ctx;
    r->calls++;
    r->blocks += n;
}

static void test_promoted_forwarding(void **st)
{
    /* pf_ssd_attach registers tier_promoted, which forwards to the function set here */
    struct ssdt t;
    ssdt_init(&t, 4 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 1 << 20);
    ssdt_open(&t, &c);
    struct promoted_rec rec = {0};
    pf_ssd_set_promoted(t.ssd, on_promoted, &rec);
    assert_ptr_equal(t.ssd->promoted_fn, on_promoted);
    assert_ptr_equal(t.ssd->promoted_ctx, &rec);
    pf_ssd_set_promoted(t.ssd, NULL, NULL);
    assert_null(t.ssd->promoted_fn);
    ssdt_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),       cmocka_unit_test(test_file_layout),
        cmocka_unit_test(test_restart_is_empty),    cmocka_unit_test(test_defaults_and_offer_edges),
        cmocka_unit_test(test_promoted_forwarding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

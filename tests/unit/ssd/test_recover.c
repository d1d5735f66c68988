/* SSD recovery (src/ssd/recover.c, format.c): a store reopened on its files rebuilds the
 * index byte-exact; the ring continues after the newest record; torn, flipped and zeroed
 * records are dropped and counted, never served; a superblock of another version or a file
 * that is not ours is refused (or reformatted with reformat); a geometry change in a
 * namespace drops the old records; the newest record of a key wins. */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "ssdtest.h"

#include "ssd/ssd_internal.h"

/* 2 slots x 2 segments x 4 KiB: a 16 KiB block after a 4 KiB header */
#define PAY    16384u
#define REC    (PAY + 4096u)
#define CAP(n) (SSD_SB_SIZE + (n)*REC)

static struct pf_block *blk(struct ssdt *t, uint32_t id)
{
    return ssdt_block(t, id, 2, 4096, 2, false);
}

static double dropped(const char *reason)
{
    return pf_metric_value_of("pegaflow_ssd_recovery_dropped_records", (const char *[]){reason});
}

static void reopen(struct ssdt *t, struct pf_ssd_config *c)
{
    pf_ssd_destroy(t->ssd);
    t->ssd = NULL;
    c->recover = true;
    ssdt_open(t, c);
    SSDT_WAIT(ssdt_stats(t).recovery_done);
}

/* Fetches key k and compares it with b byte for byte. */
static bool served_exact(struct ssdt *t, struct pf_block *b)
{
    struct pf_block *out[1];
    if (pf_ssd_fetch(t->ssd, SSDT_KEY(b), 1, false, out) != 1)
        return false;
    bool same = ssdt_same(b, out[0]);
    pf_block_put(out[0]);
    return same;
}

static void file_patch(struct ssdt *t, uint64_t off, const void *p, size_t n)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/cache.dat", t->dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, p, n, (off_t)off), (ssize_t)n);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

static void file_read(struct ssdt *t, uint64_t off, void *p, size_t n)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/cache.dat", t->dir);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, p, n, (off_t)off), (ssize_t)n);
    close(fd);
}

static void flip(struct ssdt *t, uint64_t off)
{
    uint8_t c;
    file_read(t, off, &c, 1);
    c ^= 0x5a;
    file_patch(t, off, &c, 1);
}

static void test_restart_serves_everything(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, CAP(16));
    c.recover = true;
    ssdt_open(&t, &c);
    enum { N = 10 };
    struct pf_block *b[N];
    for (uint32_t i = 0; i < N; i++)
        b[i] = blk(&t, 100 + i);
    ssdt_write(&t, b, N);
    double r0 = ssdt_metric("pegaflow_ssd_recovered_blocks");
    reopen(&t, &c);
    assert_int_equal(ssdt_stats(&t).committed, N);
    assert_int_equal(ssdt_metric("pegaflow_ssd_recovery_state"), 2);
    assert_true(ssdt_metric("pegaflow_ssd_recovered_blocks") - r0 == N);
    assert_true(ssdt_metric("pegaflow_ssd_recovery_scanned_bytes") >= CAP(16) - SSD_SB_SIZE);
    struct pf_block_key keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = pf_block_key(b[i]);
    assert_int_equal(pf_ssd_probe(t.ssd, keys, N), N);
    for (int i = 0; i < N; i++)
        assert_true(served_exact(&t, b[i]));
    /* the ring continues after the newest record: a new block goes to record slot N */
    assert_int_equal(t.ssd->idx.shards[0].ring.head % (CAP(16) - SSD_SB_SIZE), N * REC);
    struct pf_block *n = blk(&t, 200);
    ssdt_write(&t, &n, 1);
    assert_int_equal(pf_ssd_probe(t.ssd, keys, N), N);
    assert_true(served_exact(&t, n));
    /* and a third run finds all eleven */
    reopen(&t, &c);
    assert_int_equal(ssdt_stats(&t).committed, N + 1);
    assert_true(served_exact(&t, n) && served_exact(&t, b[0]));
    for (int i = 0; i < N; i++)
        pf_block_put(b[i]);
    pf_block_put(n);
    ssdt_fini(&t);
}

static void test_wrapped_ring(void **st)
{
    /* four records fit: six written, the last four survive; after the restart the next
     * write overwrites the oldest survivor only */
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, CAP(4));
    ssdt_open(&t, &c);
    struct pf_block *b[7];
    for (uint32_t i = 0; i < 7; i++)
        b[i] = blk(&t, 300 + i);
    for (int i = 0; i < 6; i++)
        ssdt_write(&t, &b[i], 1);
    reopen(&t, &c);
    assert_int_equal(ssdt_stats(&t).committed, 4);
    for (int i = 0; i < 6; i++)
        assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[i]), 1), i >= 2);
    for (int i = 2; i < 6; i++)
        assert_true(served_exact(&t, b[i]));
    ssdt_write(&t, &b[6], 1);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[2]), 1), 0);
    for (int i = 3; i < 7; i++)
        assert_true(served_exact(&t, b[i]));
    reopen(&t, &c);
    assert_int_equal(ssdt_stats(&t).committed, 4);
    for (int i = 3; i < 7; i++)
        assert_true(served_exact(&t, b[i]));
    for (int i = 0; i < 7; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

static void test_corruption_dropped(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, CAP(8));
    ssdt_open(&t, &c);
    enum { N = 5 };
    struct pf_block *b[N];
    for (uint32_t i = 0; i < N; i++)
        b[i] = blk(&t, 400 + i);
    ssdt_write(&t, b, N);
    pf_ssd_destroy(t.ssd);
    t.ssd = NULL;
    /* record 1: a payload byte; record 2: a header byte (its key); record 3: a byte of the
     * slot table; record 4 (the tail): its last 4 KiB zeroed */
    flip(&t, SSD_SB_SIZE + 1 * REC + 4096 + 777);
    flip(&t, SSD_SB_SIZE + 2 * REC + 64 + 3);
    flip(&t, SSD_SB_SIZE + 3 * REC + 128 + 8 + 9);
    static uint8_t zeros[4096];
    file_patch(&t, SSD_SB_SIZE + 5 * REC - sizeof(zeros), zeros, sizeof(zeros));
    double torn0 = dropped("torn"), hdr0 = dropped("header");
    reopen(&t, &c);
    assert_int_equal(ssdt_stats(&t).committed, 1);
    assert_true(served_exact(&t, b[0]));
    for (int i = 1; i < N; i++)
        assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[i]), 1), 0);
    assert_int_equal(dropped("torn") - torn0, 2);
    assert_int_equal(dropped("header") - hdr0, 2);
    /* the head follows the newest intact record */
    assert_int_equal(t.ssd->idx.shards[0].ring.head % (CAP(8) - SSD_SB_SIZE), REC);
    for (int i = 0; i < N; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

static void test_foreign_files(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, CAP(8));
    c.recover = true;
    ssdt_open(&t, &c);
    struct pf_block *b = blk(&t, 500);
    ssdt_write(&t, &b, 1);
    pf_ssd_destroy(t.ssd);
    t.ssd = NULL;
    /* another format version */
    uint8_t v2[4] = {2, 0, 0, 0}, v1[4] = {1, 0, 0, 0};
    file_patch(&t, 8, v2, 4);
    char err[512] = "";
    struct pf_ssd *s = NULL;
    assert_int_equal(pf_ssd_create(&c, &s, err, sizeof(err)), -EPROTO);
    assert_non_null(strstr(err, "format version 2"));
    assert_non_null(strstr(err, "--ssd-reformat"));
    assert_non_null(strstr(err, "cache.dat"));
    /* not ours: a superblock that does not verify, or other bytes */
    file_patch(&t, 8, v1, 4);
    flip(&t, 20);
    assert_int_equal(pf_ssd_create(&c, &s, err, sizeof(err)), -EPROTO);
    assert_non_null(strstr(err, "not a PegaFlow SSD cache file"));
    file_patch(&t, 0, "#!/bin/sh\necho hello\n", 21);
    assert_int_equal(pf_ssd_create(&c, &s, err, sizeof(err)), -EPROTO);
    /* --ssd-reformat: started empty with a new identity, the old record never served */
    c.reformat = true;
    ssdt_open(&t, &c);
    SSDT_WAIT(ssdt_stats(&t).recovery_done);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b), 1), 0);
    c.reformat = false;
    reopen(&t, &c); /* now ours again: recovered (empty), and the old record is foreign */
    assert_int_equal(ssdt_stats(&t).committed, 0);
    pf_block_put(b);
    ssdt_fini(&t);
}

static void test_geometry_change(void **st)
{
    /* a run with 4 KiB segments, then one with 2 KiB segments in the same namespace: once
     * this run seals a block of its geometry, the old records are dropped; a block of the
     * same key and the new geometry replaces its old record (and wins after a restart) */
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, CAP(16));
    ssdt_open(&t, &c);
    enum { N = 4 };
    struct pf_block *b[N];
    for (uint32_t i = 0; i < N; i++)
        b[i] = blk(&t, 600 + i);
    ssdt_write(&t, b, N);
    reopen(&t, &c);
    assert_int_equal(ssdt_stats(&t).committed, N);
    double g0 = dropped("geometry"), s0 = dropped("superseded");
    struct pf_block *nb = ssdt_block(&t, 600, 2, 2048, 2, false); /* key of b[0] */
    ssdt_write(&t, &nb, 1);
    assert_int_equal(dropped("geometry") - g0, N);
    for (int i = 1; i < N; i++)
        assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[i]), 1), 0);
    assert_true(served_exact(&t, nb));
    reopen(&t, &c);
    /* both records of key 600 are on disk: the newer one wins */
    assert_int_equal(dropped("superseded") - s0, 1);
    assert_true(served_exact(&t, nb));
    assert_false(served_exact(&t, b[0]));
    for (int i = 0; i < N; i++)
        pf_block_put(b[i]);
    pf_block_put(nb);
    ssdt_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_serves_everything), cmocka_unit_test(test_wrapped_ring),
        cmocka_unit_test(test_corruption_dropped),        cmocka_unit_test(test_foreign_files),
        cmocka_unit_test(test_geometry_change),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

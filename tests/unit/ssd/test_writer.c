/* The SSD write pipeline (src/ssd/writer.c) through a real store over uring, with write
 * completions held by a gate where a test needs writes in flight: weak references upgraded
 * at dequeue (freed blocks skipped, queued blocks not pinned), the bounded batch queue,
 * in-flight limit, flush barrier, duplicates, oversize blocks, failed and timed-out writes,
 * no write ever racing another for the same bytes, a bounded stop, and consecutive records
 * merged into one vectored request (byte-exact, a corrupted record in the middle a miss of
 * its own, a failed request failing exactly its records, records with gaps between them). */
#include <fcntl.h>

#include "ssdtest.h"

#include "ssd/ssd_internal.h"

/* One 32 KiB block on disk: a 4 KiB record header, then the block; CAP(n): a shard of n records
 * after its superblock. */
#define REC    (32768 + 4096)
#define CAP(n) (SSD_SB_SIZE + (n)*REC)

static struct pf_block *blk(struct ssdt *t, uint32_t id)
{
    return ssdt_block(t, id, 2, 8192, 2, false); /* 32 KiB */
}

static void test_weak_refs(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    c.write_inflight = 1;
    ssdt_open(&t, &c);
    /* one request in flight carries up to write_merge (8) placed blocks: the ninth waits */
    struct pf_block *b[9];
    for (uint32_t i = 0; i < 9; i++)
        b[i] = blk(&t, 1 + i);
    uint64_t one = pf_pool_used(t.pool) / 9;
    gate_hold(t.gate, PF_BLK_WRITE, true);
    assert_int_equal(pf_ssd_offer(t.ssd, b, 9), 0);
    /* the writer holds blocks 1-8 (one write in flight); block 9 waits as a weak reference */
    SSDT_WAIT(gate_submitted(t.gate, PF_BLK_WRITE) == 1);
    struct pf_block_key k9 = pf_block_key(b[8]);
    pf_block_put(b[8]); /* evicted and freed while queued: its memory returns now */
    assert_int_equal(pf_pool_used(t.pool), 8 * one);
    gate_hold(t.gate, PF_BLK_WRITE, false);
    assert_int_equal(pf_ssd_flush(t.ssd, 10000), 0);
    assert_int_equal(ssdt_stats(&t).committed, 8);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 1); /* the eight in one request */
    for (int i = 0; i < 8; i++)
        assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[i]), 1), 1);
    assert_int_equal(pf_ssd_probe(t.ssd, &k9, 1), 0);
    /* the writer's strong references ended with the write */
    for (int i = 0; i < 8; i++) {
        assert_int_equal(pf_block_strong(b[i]), 1);
        pf_block_put(b[i]);
    }
    ssdt_fini(&t);
}

static void test_queue_full_and_inflight(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    c.write_inflight = 2;
    c.write_queue_depth = 1;
    ssdt_open(&t, &c);
    /* 2 requests of up to 8 blocks: 16 placed blocks at most */
    struct pf_block *b[22];
    for (uint32_t i = 0; i < 22; i++)
        b[i] = blk(&t, 10 + i);
    double qf0 = ssdt_metric("pegaflow_ssd_write_queue_full");
    gate_hold(t.gate, PF_BLK_WRITE, true);
    /* batch 1: sixteen placed (two requests of eight), two pending */
    assert_int_equal(pf_ssd_offer(t.ssd, b, 18), 0);
    SSDT_WAIT(gate_submitted(t.gate, PF_BLK_WRITE) == 2);
    SSDT_WAIT(ssdt_metric("pegaflow_ssd_write_inflight") == 16);
    assert_int_equal(pf_ssd_offer(t.ssd, b + 18, 2), 0);       /* batch 2: queued */
    assert_int_equal(pf_ssd_offer(t.ssd, b + 20, 2), -EAGAIN); /* batch 3: dropped */
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_queue_full") - qf0, 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_queue_pending"), 4);
    /* never more than write_inflight requests in flight */
    usleep(20000);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 2);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_inflight"), 16);
    /* the barrier waits for the writes; bounded */
    assert_int_equal(pf_ssd_flush(t.ssd, 30), -ETIMEDOUT);
    gate_hold(t.gate, PF_BLK_WRITE, false);
    assert_int_equal(pf_ssd_flush(t.ssd, 10000), 0);
    assert_int_equal(ssdt_stats(&t).committed, 20);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_queue_pending"), 0);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_inflight"), 0);
    for (int i = 0; i < 22; i++) {
        assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[i]), 1), i < 20);
        pf_block_put(b[i]);
    }
    ssdt_fini(&t);
}

static void test_duplicates_and_oversize(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, CAP(2)); /* two 32 KiB blocks */
    ssdt_open(&t, &c);
    struct pf_block *a = blk(&t, 20);
    double w0 = ssdt_metric("pegaflow_ssd_write_bytes");
    ssdt_write(&t, &a, 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_bytes") - w0, REC);
    /* the same block, and another block object with the same key: not rewritten */
    ssdt_write(&t, &a, 1);
    struct pf_block *a2 = blk(&t, 20);
    ssdt_write(&t, &a2, 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_bytes") - w0, REC);
    assert_int_equal(ssdt_stats(&t).committed, 1);
    /* larger than the shard: dropped, the next one is written */
    struct pf_block *big = ssdt_block(&t, 21, 5, 8192, 2, false); /* 80 KiB */
    struct pf_block *b = blk(&t, 22);
    struct pf_block *two[2] = {big, b};
    ssdt_write(&t, two, 2);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(big), 1), 0);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b), 1), 1);
    assert_int_equal(ssdt_stats(&t).committed, 2);
    pf_block_put(a);
    pf_block_put(a2);
    pf_block_put(big);
    pf_block_put(b);
    ssdt_fini(&t);
}

static void test_failed_writes(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20,
              "seed=3;blk.write:nth=3,times=1,error=EIO;"
              "blk.write:nth=5,times=1,error=EIO,at=complete");
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    ssdt_open(&t, &c);
    struct pf_block *b[5];
    for (uint32_t i = 0; i < 5; i++)
        b[i] = blk(&t, 30 + i);
    double f0 = ssdt_metric("pegaflow_ssd_write_failures");
    for (int i = 0; i < 5; i++)
        ssdt_write(&t, b + i, 1); /* one request each */
    /* write 2 failed at submission, write 4 at completion (every rule counts every write,
     * the superblock's at start-up first) */
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_failures") - f0, 2);
    assert_int_equal(ssdt_stats(&t).committed, 3);
    assert_int_equal(ssdt_stats(&t).writing, 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[i]), 1), i != 1 && i != 3);
    /* a failed block is written again when offered again */
    ssdt_write(&t, &b[1], 1);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[1]), 1), 1);
    for (int i = 0; i < 5; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

static void test_no_overtaking_in_flight(void **st)
{
    /* a ring of two blocks, four writes allowed in flight: the third placement would
     * overwrite the first block's bytes while its write is outstanding, so it waits */
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, CAP(2));
    c.write_inflight = 4;
    ssdt_open(&t, &c);
    struct pf_block *b[4];
    for (uint32_t i = 0; i < 4; i++)
        b[i] = blk(&t, 40 + i);
    gate_hold(t.gate, PF_BLK_WRITE, true);
    assert_int_equal(pf_ssd_offer(t.ssd, b, 4), 0);
    /* blocks 0 and 1 fill the ring (one request); block 2 waits for it */
    SSDT_WAIT(gate_submitted(t.gate, PF_BLK_WRITE) == 1);
    SSDT_WAIT(ssdt_metric("pegaflow_ssd_write_inflight") == 2);
    usleep(20000);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_inflight"), 2);
    gate_hold(t.gate, PF_BLK_WRITE, false);
    assert_int_equal(pf_ssd_flush(t.ssd, 10000), 0);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 2); /* blocks 2, 3 together */
    /* the last lap is intact and byte-exact */
    struct pf_block_key keys[4];
    for (int i = 0; i < 4; i++)
        keys[i] = pf_block_key(b[i]);
    assert_int_equal(pf_ssd_probe(t.ssd, keys, 2), 0);
    struct pf_block *out[2];
    assert_int_equal(pf_ssd_fetch(t.ssd, keys + 2, 2, false, out), 2);
    assert_true(ssdt_same(b[2], out[0]) && ssdt_same(b[3], out[1]));
    pf_block_put(out[0]);
    pf_block_put(out[1]);
    for (int i = 0; i < 4; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

static void test_write_timeout(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    c.io_timeout_ms = 100;
    ssdt_open(&t, &c);
    struct pf_block *b = blk(&t, 50);
    double f0 = ssdt_metric("pegaflow_ssd_write_failures");
    gate_hold(t.gate, PF_BLK_WRITE, true);
    assert_int_equal(pf_ssd_offer(t.ssd, &b, 1), 0);
    /* the write fails after its timeout; the entry goes */
    SSDT_WAIT(ssdt_metric("pegaflow_ssd_write_failures") - f0 == 1);
    assert_int_equal(pf_ssd_flush(t.ssd, 10000), 0);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b), 1), 0);
    assert_int_equal(ssdt_stats(&t).writing, 0);
    /* the device still owns the block's memory: referenced until the completion */
    assert_int_equal(pf_block_strong(b), 2);
    gate_hold(t.gate, PF_BLK_WRITE, false);
    SSDT_WAIT(pf_block_strong(b) == 1);
    pf_block_put(b);
    ssdt_fini(&t);
}

static void test_lost_write_stalls_no_shard_forever(void **st)
{
    /* the first block write (after the two superblocks) never completes (dropped by the device):
     * after its timeout its space on shard 0 cannot be reused, so shard 1 takes the writes that
     * would need it; nothing waits forever and what is written reads back byte-exact */
    struct ssdt t;
    ssdt_init(&t, 16 << 20, "seed=1;blk.write:nth=3,times=1,drop=1");
    struct pf_ssd_config c = ssdt_config(&t, 2 * CAP(2)); /* 2 shards of 2 blocks */
    c.shards_per_path = 2;
    c.io_timeout_ms = 100;
    ssdt_open(&t, &c);
    enum { N = 8 };
    struct pf_block *b[N];
    for (uint32_t i = 0; i < N; i++)
        b[i] = blk(&t, 70 + i);
    double f0 = ssdt_metric("pegaflow_ssd_write_failures");
    for (int i = 0; i < N; i++) /* one at a time: each lands before the next is placed */
        ssdt_write(&t, &b[i], 1);
    assert_true(ssdt_metric("pegaflow_ssd_write_failures") - f0 >= 1);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[0]), 1), 0);
    /* the newest block is on the disk and reads back byte-exact */
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[N - 1]), 1), 1);
    struct pf_block *out[1];
    assert_int_equal(pf_ssd_fetch(t.ssd, SSDT_KEY(b[N - 1]), 1, false, out), 1);
    assert_true(ssdt_same(b[N - 1], out[0]));
    pf_block_put(out[0]);
    assert_true(ssdt_stats(&t).committed >= 2);
    pf_ssd_stop(t.ssd); /* gives up on the lost write */
    for (int i = 0; i < N; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

static void test_stop_is_bounded(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 8 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    c.io_timeout_ms = 200;
    ssdt_open(&t, &c);
    struct pf_block *b[3] = {blk(&t, 60), blk(&t, 61), blk(&t, 62)};
    gate_hold(t.gate, PF_BLK_WRITE, true);
    assert_int_equal(pf_ssd_offer(t.ssd, b, 2), 0);
    assert_int_equal(pf_ssd_offer(t.ssd, b + 2, 1), 0);
    SSDT_WAIT(gate_submitted(t.gate, PF_BLK_WRITE) == 2);
    pf_ssd_stop(t.ssd); /* gives up on the held writes after a grace; drops the queue */
    assert_int_equal(pf_ssd_flush(t.ssd, 1000), -ESHUTDOWN);
    assert_int_equal(pf_ssd_offer(t.ssd, b, 1), -ESHUTDOWN);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[0]), 1), 0);
    struct pf_block *out[1];
    assert_int_equal(pf_ssd_fetch(t.ssd, SSDT_KEY(b[0]), 1, false, out), 0);
    pf_ssd_stop(t.ssd); /* idempotent */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pf_block_strong(b[i]), 1); /* no reference left behind */
        pf_block_put(b[i]);
    }
    ssdt_fini(&t);
}

/* Fetches keys[0..n) and compares each with b[] byte for byte; returns how many served. */
static size_t fetch_exact(struct ssdt *t, struct pf_block **b, size_t n)
{
    struct pf_block_key keys[16];
    struct pf_block *out[16];
    for (size_t i = 0; i < n; i++)
        keys[i] = pf_block_key(b[i]);
    size_t got = pf_ssd_fetch(t->ssd, keys, n, false, out);
    for (size_t i = 0; i < got; i++) {
        assert_true(ssdt_same(b[i], out[i]));
        pf_block_put(out[i]);
    }
    return got;
}

/* Consecutive records (32 KiB blocks, and 1 KiB ones whose 8 KiB span leaves a 3 KiB gap)
 * go out as one vectored request: each record byte-exact, recovered after a restart, and a
 * record corrupted on disk in the middle of that request is a miss of its own (its
 * neighbours on both sides are served). */
static void test_merged_writes(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    ssdt_open(&t, &c);
    struct pf_block *b[6];
    for (uint32_t i = 0; i < 6; i++)
        b[i] = i % 2 ? ssdt_block(&t, 70 + i, 1, 1000, 1, true) : blk(&t, 70 + i);
    gate_hold(t.gate, PF_BLK_WRITE, true);
    assert_int_equal(pf_ssd_offer(t.ssd, b, 6), 0);
    SSDT_WAIT(ssdt_metric("pegaflow_ssd_write_inflight") == 6);
    SSDT_WAIT(gate_submitted(t.gate, PF_BLK_WRITE) == 1);
    gate_hold(t.gate, PF_BLK_WRITE, false);
    assert_int_equal(pf_ssd_flush(t.ssd, 10000), 0);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 1); /* all six in one request */
    assert_int_equal(ssdt_stats(&t).committed, 6);
    assert_int_equal(fetch_exact(&t, b, 6), 6);
    /* the records are laid out as one by one: a restart recovers every one of them */
    pf_ssd_destroy(t.ssd);
    t.ssd = NULL;
    c.recover = true;
    ssdt_open(&t, &c);
    SSDT_WAIT(ssdt_stats(&t).recovery_done);
    assert_int_equal(ssdt_stats(&t).committed, 6);
    assert_int_equal(fetch_exact(&t, b, 6), 6);
    /* flip one payload byte of record 2 on disk */
    pthread_mutex_lock(&t.ssd->mu);
    struct ssd_entry *e = ssd_index_find(&t.ssd->idx, SSDT_KEY(b[2]));
    assert_non_null(e);
    uint64_t off = e->off + 1000;
    pthread_mutex_unlock(&t.ssd->mu);
    int fd = open(c.paths[0], O_RDWR);
    assert_true(fd >= 0);
    uint8_t x;
    assert_int_equal(pread(fd, &x, 1, (off_t)off), 1);
    x ^= 0x5a;
    assert_int_equal(pwrite(fd, &x, 1, (off_t)off), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
    /* a prefix fetch stops at the corrupted record, which becomes a miss; the rest hit */
    assert_int_equal(fetch_exact(&t, b, 6), 2);
    assert_int_equal(pf_ssd_probe(t.ssd, SSDT_KEY(b[2]), 1), 0);
    assert_int_equal(fetch_exact(&t, b + 3, 3), 3);
    assert_int_equal(fetch_exact(&t, b, 2), 2);
    for (int i = 0; i < 6; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

/* write_merge 1: one request per record, write_inflight records placed at most (the
 * behaviour before merging) */
static void test_write_merge_one(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    c.write_merge = 1;
    c.write_inflight = 2;
    ssdt_open(&t, &c);
    struct pf_block *b[4];
    for (uint32_t i = 0; i < 4; i++)
        b[i] = blk(&t, 90 + i);
    gate_hold(t.gate, PF_BLK_WRITE, true);
    assert_int_equal(pf_ssd_offer(t.ssd, b, 4), 0);
    SSDT_WAIT(gate_submitted(t.gate, PF_BLK_WRITE) == 2);
    usleep(20000);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_inflight"), 2);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 2);
    gate_hold(t.gate, PF_BLK_WRITE, false);
    assert_int_equal(pf_ssd_flush(t.ssd, 10000), 0);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 4);
    assert_int_equal(fetch_exact(&t, b, 4), 4);
    for (int i = 0; i < 4; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

/* A merged request that fails fails exactly its records (none is committed); offered
 * again they are written. */
static void test_merged_write_failure(void **st)
{
    struct ssdt t;
    /* write 1 is the superblock's at start-up, write 2 the merged request */
    ssdt_init(&t, 16 << 20, "seed=5;blk.write:nth=2,times=1,error=EIO,at=complete");
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    ssdt_open(&t, &c);
    struct pf_block *b[4];
    for (uint32_t i = 0; i < 4; i++)
        b[i] = blk(&t, 80 + i);
    double f0 = ssdt_metric("pegaflow_ssd_write_failures");
    ssdt_write(&t, b, 4);
    assert_int_equal(gate_submitted(t.gate, PF_BLK_WRITE), 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_write_failures") - f0, 4);
    assert_int_equal(ssdt_stats(&t).committed, 0);
    assert_int_equal(ssdt_stats(&t).writing, 0);
    ssdt_write(&t, b, 4);
    assert_int_equal(ssdt_stats(&t).committed, 4);
    assert_int_equal(fetch_exact(&t, b, 4), 4);
    for (int i = 0; i < 4; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weak_refs),
        cmocka_unit_test(test_queue_full_and_inflight),
        cmocka_unit_test(test_duplicates_and_oversize),
        cmocka_unit_test(test_failed_writes),
        cmocka_unit_test(test_no_overtaking_in_flight),
        cmocka_unit_test(test_write_timeout),
        cmocka_unit_test(test_lost_write_stalls_no_shard_forever),
        cmocka_unit_test(test_stop_is_bounded),
        cmocka_unit_test(test_merged_writes),
        cmocka_unit_test(test_merged_write_failure),
        cmocka_unit_test(test_write_merge_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

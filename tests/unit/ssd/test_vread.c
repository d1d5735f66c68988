/* Vectored SSD prefetch reads (src/ssd/prefetch.c, --ssd-read-merge): consecutive records of
 * one fetch are read by one request from the first record's header to the last payload's end
 * (headers and the gaps between records into a scratch buffer, payloads straight into the
 * staging blocks). Byte-exact with seeded data over records with and without gaps, before and
 * after a restart (recovered entries); the request count follows read_merge and the 1 MiB
 * bound of a request; a record whose payload or header is corrupted in the middle of a request is a
 * miss of its own (its entry dropped, its neighbours kept and served); a short read (the file ends
 * inside the request) serves the records it transferred whole; an -EIO request fails its records
 * only, without dropping their entries. */
#include <fcntl.h>
#include <sys/stat.h>

#include "ssdtest.h"

#include "ssd/ssd_internal.h"

#define N 8

struct vr {
    struct ssdt t;
    struct pf_ssd_config c;
    struct pf_block *b[N];
    struct pf_block_key k[N];
};

/* Even blocks 24 KiB (3 slots x K/V of 4000 bytes in 4 KiB strides, scattered segments): the
 * record spans header + payload exactly; odd blocks 1 KiB (one 1000-byte segment in a 1 KiB
 * stride): their 8 KiB span leaves a 3 KiB gap before the next record's header. */
static void vr_open(struct vr *v, const char *faults, uint32_t read_merge)
{
    ssdt_init(&v->t, 16 << 20, faults);
    v->c = ssdt_config(&v->t, 4 << 20);
    v->c.read_merge = read_merge;
    ssdt_open(&v->t, &v->c);
    for (uint32_t i = 0; i < N; i++) {
        v->b[i] = i % 2 ? ssdt_block(&v->t, 900 + i, 1, 1000, 1, true)
                        : ssdt_block(&v->t, 900 + i, 3, 4000, 2, true);
        v->k[i] = pf_block_key(v->b[i]);
    }
    ssdt_write(&v->t, v->b, N);
    assert_int_equal(ssdt_stats(&v->t).committed, N);
}

static void vr_close(struct vr *v)
{
    for (int i = 0; i < N; i++)
        pf_block_put(v->b[i]);
    ssdt_fini(&v->t);
}

/* Fetches keys [from, from + n) and compares each served block with its source byte for
 * byte; returns how many were served. */
static size_t fetch_exact(struct vr *v, size_t from, size_t n)
{
    struct pf_block *out[N];
    size_t got = pf_ssd_fetch(v->t.ssd, v->k + from, n, false, out);
    for (size_t i = 0; i < got; i++) {
        assert_true(ssdt_same(v->b[from + i], out[i]));
        pf_block_put(out[i]);
    }
    return got;
}

static unsigned reads(struct vr *v)
{
    return gate_submitted(v->t.gate, PF_BLK_READ);
}

/* File offset of record i's payload and its header length. */
static void where(struct vr *v, size_t i, uint64_t *off_p, uint64_t *hdr_p)
{
    pthread_mutex_lock(&v->t.ssd->mu);
    struct ssd_entry *e = ssd_index_find(&v->t.ssd->idx, &v->k[i]);
    assert_non_null(e);
    *off_p = e->off;
    *hdr_p = e->off - v->t.ssd->idx.ring_off - e->start % v->t.ssd->idx.shards[e->shard].ring.cap;
    pthread_mutex_unlock(&v->t.ssd->mu);
}

static void flip_byte(struct vr *v, uint64_t off)
{
    int fd = open(v->c.paths[0], O_RDWR);
    assert_true(fd >= 0);
    uint8_t x;
    assert_int_equal(pread(fd, &x, 1, (off_t)off), 1);
    x ^= 0x5a;
    assert_int_equal(pwrite(fd, &x, 1, (off_t)off), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

static double integrity_failures(void)
{
    return pf_metric_value_of("pegaflow_integrity_failures_total", (const char *[]){"ssd"});
}

static void test_one_request_byte_exact(void **st)
{
    struct vr v;
    vr_open(&v, NULL, 8);
    unsigned r0 = reads(&v);
    assert_int_equal(fetch_exact(&v, 0, N), N);
    assert_int_equal(reads(&v) - r0, 1); /* eight records, one request */
    /* a fetch from the middle: the run starts at that record's header */
    r0 = reads(&v);
    assert_int_equal(fetch_exact(&v, 3, 4), 4);
    assert_int_equal(reads(&v) - r0, 1);
    /* after a restart the entries are the recovery scan's: the same requests, byte-exact */
    pf_ssd_destroy(v.t.ssd);
    v.t.ssd = NULL;
    v.c.recover = true;
    ssdt_open(&v.t, &v.c);
    SSDT_WAIT(ssdt_stats(&v.t).recovery_done);
    assert_int_equal(ssdt_stats(&v.t).committed, N);
    r0 = reads(&v);
    assert_int_equal(fetch_exact(&v, 0, N), N);
    assert_int_equal(reads(&v) - r0, 1);
    vr_close(&v);
}

/* A request carries at most 1 MiB of records (one larger record alone): blocks of 320 KiB
 * (2 slots x K/V of 80 KiB) go 3 to a request whatever read_merge allows, so a batch's
 * early requests complete, and are verified, while its later ones are in flight. */
static void test_byte_bound(void **st)
{
    struct ssdt t;
    ssdt_init(&t, 16 << 20, NULL);
    struct pf_ssd_config c = ssdt_config(&t, 4 << 20);
    c.read_merge = 8;
    ssdt_open(&t, &c);
    struct pf_block *b[N], *out[N];
    struct pf_block_key k[N];
    for (uint32_t i = 0; i < N; i++) {
        b[i] = ssdt_block(&t, 700 + i, 2, 80 << 10, 2, false);
        k[i] = pf_block_key(b[i]);
    }
    ssdt_write(&t, b, N);
    assert_int_equal(ssdt_stats(&t).committed, N);
    unsigned r0 = gate_submitted(t.gate, PF_BLK_READ);
    size_t got = pf_ssd_fetch(t.ssd, k, N, false, out);
    assert_int_equal(got, N);
    for (size_t i = 0; i < got; i++) {
        assert_true(ssdt_same(b[i], out[i]));
        pf_block_put(out[i]);
    }
    assert_int_equal(gate_submitted(t.gate, PF_BLK_READ) - r0, 3); /* 3 + 3 + 2 records */
    for (int i = 0; i < N; i++)
        pf_block_put(b[i]);
    ssdt_fini(&t);
}

static void test_merge_bound(void **st)
{
    struct vr v;
    vr_open(&v, NULL, 3);
    unsigned r0 = reads(&v);
    assert_int_equal(fetch_exact(&v, 0, N), N);
    assert_int_equal(reads(&v) - r0, 3); /* 3 + 3 + 2 records */
    vr_close(&v);
    vr_open(&v, NULL, 1);
    r0 = reads(&v);
    assert_int_equal(fetch_exact(&v, 0, N), N);
    assert_int_equal(reads(&v) - r0, N); /* one record per request, as before */
    vr_close(&v);
}

/* A fetch whose keys are not in ring order: each request covers only records that follow
 * each other on disk, so out-of-order keys are read one by one, still byte-exact. */
static void test_not_adjacent(void **st)
{
    struct vr v;
    vr_open(&v, NULL, 8);
    struct pf_block_key keys[4] = {v.k[5], v.k[2], v.k[3], v.k[0]};
    struct pf_block *src[4] = {v.b[5], v.b[2], v.b[3], v.b[0]};
    struct pf_block *out[4];
    unsigned r0 = reads(&v);
    assert_int_equal(pf_ssd_fetch(v.t.ssd, keys, 4, false, out), 4);
    for (int i = 0; i < 4; i++) {
        assert_true(ssdt_same(src[i], out[i]));
        pf_block_put(out[i]);
    }
    assert_int_equal(reads(&v) - r0, 3); /* 5 | 2 3 | 0 */
    vr_close(&v);
}

static void corrupt_mid(void **st, bool header)
{
    struct vr v;
    vr_open(&v, NULL, 8);
    uint64_t off, hdr;
    where(&v, 3, &off, &hdr);
    assert_true(hdr >= 4096);
    /* a payload byte, or a byte of the header (its checksum then fails) */
    flip_byte(&v, header ? off - hdr + 100 : off + 500);
    double i0 = integrity_failures();
    unsigned r0 = reads(&v);
    /* one request of eight records: the prefix up to the corrupted record is served */
    assert_int_equal(fetch_exact(&v, 0, N), 3);
    assert_int_equal(reads(&v) - r0, 1);
    assert_int_equal(integrity_failures() - i0, 1);
    /* a miss for that record only: its entry is dropped, its neighbours' are kept */
    assert_int_equal(pf_ssd_probe(v.t.ssd, v.k, N), 3);
    assert_int_equal(pf_ssd_probe(v.t.ssd, v.k + 3, 1), 0);
    assert_int_equal(pf_ssd_probe(v.t.ssd, v.k + 4, N - 4), N - 4);
    r0 = reads(&v);
    assert_int_equal(fetch_exact(&v, 4, N - 4), N - 4);
    assert_int_equal(reads(&v) - r0, 1);
    assert_int_equal(fetch_exact(&v, 0, 3), 3);
    assert_int_equal(integrity_failures() - i0, 1);
    vr_close(&v);
}

static void test_corrupt_payload_mid_vector(void **st)
{
    corrupt_mid(st, false);
}

static void test_corrupt_header_mid_vector(void **st)
{
    corrupt_mid(st, true);
}

/* A header that verifies but names another record (a stale index entry) is a miss too:
 * record 3's header is overwritten with record 1's (the same span and placement rules). */
static void test_header_of_another_record(void **st)
{
    struct vr v;
    vr_open(&v, NULL, 8);
    uint64_t off1, hdr1, off3, hdr3;
    where(&v, 1, &off1, &hdr1);
    where(&v, 3, &off3, &hdr3);
    assert_int_equal(hdr1, hdr3);
    int fd = open(v.c.paths[0], O_RDWR);
    assert_true(fd >= 0);
    uint8_t *h = malloc(hdr1);
    assert_non_null(h);
    assert_int_equal(pread(fd, h, hdr1, (off_t)(off1 - hdr1)), (ssize_t)hdr1);
    assert_int_equal(pwrite(fd, h, hdr1, (off_t)(off3 - hdr3)), (ssize_t)hdr1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
    free(h);
    double i0 = integrity_failures();
    assert_int_equal(fetch_exact(&v, 0, N), 3);
    assert_int_equal(integrity_failures() - i0, 1);
    assert_int_equal(pf_ssd_probe(v.t.ssd, v.k + 3, 1), 0);
    assert_int_equal(fetch_exact(&v, 4, N - 4), N - 4);
    vr_close(&v);
}

/* The file ends inside the request (truncated under the store): the device returns a short
 * read; the records it transferred whole are served, the rest are misses whose entries stay
 * (a read error, not corruption). */
static void test_short_read_mid_vector(void **st)
{
    struct vr v;
    vr_open(&v, NULL, 8);
    uint64_t off, hdr;
    where(&v, 4, &off, &hdr);
    assert_int_equal(truncate(v.c.paths[0], (off_t)(off + 8192)), 0); /* inside record 4 */
    double i0 = integrity_failures();
    double f0 = ssdt_metric("pegaflow_ssd_prefetch_failures");
    unsigned r0 = reads(&v);
    assert_int_equal(fetch_exact(&v, 0, N), 4);
    assert_int_equal(reads(&v) - r0, 1);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_failures") - f0, N - 4);
    assert_int_equal(integrity_failures() - i0, 0);
    assert_int_equal(pf_ssd_probe(v.t.ssd, v.k, N), N);
    vr_close(&v);
}

/* read_merge 2: requests (0 1) (2 3) (4 5) (6 7), reads 2..5 of the run (read 1 was the
 * superblock's). The second fails with EIO at completion: blocks 0 and 1 are served, 2 and
 * 3 missed, their entries kept; the next fetch serves all eight. */
static void test_eio_mid_batch(void **st)
{
    struct vr v;
    vr_open(&v, "seed=21;blk.read:nth=3,times=1,error=EIO,at=complete", 2);
    double f0 = ssdt_metric("pegaflow_ssd_prefetch_failures");
    double i0 = integrity_failures();
    assert_int_equal(fetch_exact(&v, 0, N), 2);
    assert_int_equal(ssdt_metric("pegaflow_ssd_prefetch_failures") - f0, N - 2);
    assert_int_equal(integrity_failures() - i0, 0);
    assert_int_equal(pf_ssd_probe(v.t.ssd, v.k, N), N);
    assert_int_equal(fetch_exact(&v, 0, N), N);
    vr_close(&v);
}

/* One request of eight records failing with EIO: all eight are misses, none dropped. */
static void test_eio_whole_vector(void **st)
{
    struct vr v;
    vr_open(&v, "seed=22;blk.read:nth=2,times=1,error=EIO,at=complete", 8);
    assert_int_equal(fetch_exact(&v, 0, N), 0);
    assert_int_equal(pf_ssd_probe(v.t.ssd, v.k, N), N);
    assert_int_equal(fetch_exact(&v, 0, N), N);
    vr_close(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_request_byte_exact),
        cmocka_unit_test(test_merge_bound),
        cmocka_unit_test(test_byte_bound),
        cmocka_unit_test(test_not_adjacent),
        cmocka_unit_test(test_corrupt_payload_mid_vector),
        cmocka_unit_test(test_corrupt_header_mid_vector),
        cmocka_unit_test(test_header_of_another_record),
        cmocka_unit_test(test_short_read_mid_vector),
        cmocka_unit_test(test_eio_mid_batch),
        cmocka_unit_test(test_eio_whole_vector),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

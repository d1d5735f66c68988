/* The uring BLK backend (hw/uring/uring.c) and the faulty: decorator over it: file
 * creation and sizing, the start-up error paths (unopenable path, size larger than the
 * free space, a file system refusing O_DIRECT), submit-time alignment and bounds checks,
 * queue depth, bounded polls, data round trips, and injected faults.
 *
 * O_DIRECT refusal cannot be produced by a real file system here (tmpfs accepts O_DIRECT
 * since Linux 6.6), so open() and pread() are interposed: this executable's definitions
 * take precedence over libc's for the backend linked into it, and forward to the system
 * calls unless a test asks for EINVAL. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/log.h"

static int refuse_direct_open; /* open(O_DIRECT) fails with EINVAL */
static int refuse_direct_io;   /* pread fails with EINVAL */

int open(const char *path, int flags, ...);
int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (refuse_direct_open && (flags & O_DIRECT)) {
        errno = EINVAL;
        return -1;
    }
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off);
ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    if (refuse_direct_io) {
        errno = EINVAL;
        return -1;
    }
    return (ssize_t)syscall(SYS_pread64, fd, buf, n, off);
}

static char tmpdir[256];

static int setup(void **st)
{
    pf_log_set_level(PF_LOG_OFF);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pf-test-uring.XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    pf_hal_init();
    return 0;
}

static int teardown(void **st)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static struct pf_blk *open_blk(const char *name, struct pf_fault_plan *plan)
{
    struct pf_blk_config cfg = {.faults = plan};
    struct pf_blk *b = NULL;
    char chosen[64], err[256];
    int rc = pf_hal_blk_open(name, &cfg, &b, chosen, sizeof(chosen), err, sizeof(err));
    if (rc == -ENODEV) {
        printf("SKIP: io_uring is not usable on this host (%s)\n", err);
        exit(77);
    }
    assert_int_equal(rc, 0);
    return b;
}

static void *abuf(size_t n, int fill)
{
    void *p;
    assert_int_equal(posix_memalign(&p, 4096, n), 0);
    memset(p, fill, n);
    return p;
}

/* Polls until n completions arrived (bounded). */
static void poll_n(struct pf_blk_queue *q, struct pf_blk_cqe *out, int n)
{
    int got = 0;
    for (int tries = 0; got < n && tries < 500; tries++) {
        int r = pf_blk_poll(q, out + got, (size_t)(n - got), 20);
        assert_true(r >= 0);
        got += r;
    }
    assert_int_equal(got, n);
}

static void test_open_creates_and_sizes(void **st)
{
    struct pf_blk *b = open_blk("uring", NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/a/b/c/cache.dat", tmpdir);
    struct pf_blk_file *f = NULL;
    assert_int_equal(
        pf_blk_file_open(b, path, 1 << 20, PF_BLK_OPEN_CREATE | PF_BLK_OPEN_TRUNCATE, &f), 0);
    assert_int_equal(f->size, 1 << 20);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 1 << 20);
    /* write a pattern, reopen without truncation: kept; with truncation: gone */
    struct pf_blk_queue *q;
    assert_int_equal(pf_blk_queue_create(b, 4, &q), 0);
    uint8_t *w = abuf(4096, 0xab);
    struct iovec iov = {w, 4096};
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 8192, &iov, 1, 7), 0);
    struct pf_blk_cqe c;
    poll_n(q, &c, 1);
    assert_int_equal(c.tag, 7);
    assert_int_equal(c.res, 4096);
    pf_blk_queue_destroy(q);
    pf_blk_file_close(f);
    assert_int_equal(pf_blk_file_open(b, path, 1 << 20, 0, &f), 0);
    assert_int_equal(pf_blk_queue_create(b, 4, &q), 0);
    uint8_t *r = abuf(4096, 0);
    iov.iov_base = r;
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_READ, 8192, &iov, 1, 8), 0);
    poll_n(q, &c, 1);
    assert_int_equal(c.res, 4096);
    assert_memory_equal(r, w, 4096);
    pf_blk_queue_destroy(q);
    pf_blk_file_close(f);
    /* a larger existing file is cut to size, truncation empties it */
    assert_int_equal(pf_blk_file_open(b, path, 64 << 10, PF_BLK_OPEN_TRUNCATE, &f), 0);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 64 << 10);
    assert_int_equal(pf_blk_queue_create(b, 4, &q), 0);
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_READ, 8192, &iov, 1, 9), 0);
    poll_n(q, &c, 1);
    uint8_t zero[4096] = {0};
    assert_memory_equal(r, zero, 4096);
    pf_blk_queue_destroy(q);
    pf_blk_file_close(f);
    free(w);
    free(r);
    pf_blk_close(b);
}

static void test_open_errors(void **st)
{
    struct pf_blk *b = open_blk("uring", NULL);
    struct pf_blk_file *f = (struct pf_blk_file *)0x1;
    char path[512];
    const unsigned cf = PF_BLK_OPEN_CREATE | PF_BLK_OPEN_TRUNCATE;
    snprintf(path, sizeof(path), "%s/sz.dat", tmpdir);
    assert_int_equal(pf_blk_file_open(b, path, 1000, cf, &f), -EINVAL); /* not 512-aligned */
    assert_int_equal(pf_blk_file_open(b, path, 0, cf, &f), -EINVAL);
    assert_int_equal(pf_blk_file_open(b, "", 4096, cf, &f), -EINVAL);
    /* unopenable paths */
    assert_int_equal(pf_blk_file_open(b, "/proc/pf-no-such/x.dat", 4096, cf, &f), -ENOENT);
    snprintf(path, sizeof(path), "%s/missing.dat", tmpdir);
    assert_int_equal(pf_blk_file_open(b, path, 4096, 0, &f), -ENOENT); /* no CREATE */
    snprintf(path, sizeof(path), "%s/file", tmpdir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fclose(fp);
    snprintf(path, sizeof(path), "%s/file/x.dat", tmpdir);
    assert_int_equal(pf_blk_file_open(b, path, 4096, cf, &f), -ENOTDIR);
    assert_int_equal(pf_blk_file_open(b, tmpdir, 4096, cf, &f), -EISDIR);
    /* a size larger than the free space of the file system */
    snprintf(path, sizeof(path), "%s/huge.dat", tmpdir);
    assert_int_equal(pf_blk_file_open(b, path, 1ull << 50, cf, &f), -ENOSPC);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 0); /* nothing allocated */
    /* a file system refusing O_DIRECT: at open, or at the first I/O */
    snprintf(path, sizeof(path), "%s/direct.dat", tmpdir);
    refuse_direct_open = 1;
    assert_int_equal(pf_blk_file_open(b, path, 4096, cf, &f), -EINVAL);
    refuse_direct_open = 0;
    refuse_direct_io = 1;
    assert_int_equal(pf_blk_file_open(b, path, 4096, cf, &f), -EINVAL);
    refuse_direct_io = 0;
    assert_ptr_equal(f, (struct pf_blk_file *)0x1); /* never written on failure */
    assert_int_equal(pf_blk_file_open(b, path, 4096, cf, &f), 0);
    pf_blk_file_close(f);
    pf_blk_close(b);
}

static void test_submit_checks(void **st)
{
    struct pf_blk *b = open_blk("uring", NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/align.dat", tmpdir);
    struct pf_blk_file *f;
    assert_int_equal(
        pf_blk_file_open(b, path, 64 << 10, PF_BLK_OPEN_CREATE | PF_BLK_OPEN_TRUNCATE, &f), 0);
    struct pf_blk_queue *q;
    assert_int_equal(pf_blk_queue_create(b, 2, &q), 0);
    uint8_t *buf = abuf(16384, 1);
    struct iovec ok[2] = {{buf, 4096}, {buf + 8192, 512}};
    struct iovec bad_addr[2] = {{buf, 4096}, {buf + 8193, 512}};
    struct iovec bad_len[2] = {{buf, 4096}, {buf + 8192, 1000}};
    struct iovec zero[1] = {{buf, 0}};
    for (int op = 0; op < 2; op++) {
        assert_int_equal(pf_blk_submit(q, f, op, 100, ok, 2, 1), -EINVAL);      /* offset */
        assert_int_equal(pf_blk_submit(q, f, op, 0, bad_addr, 2, 1), -EINVAL);  /* address */
        assert_int_equal(pf_blk_submit(q, f, op, 0, bad_len, 2, 1), -EINVAL);   /* length */
        assert_int_equal(pf_blk_submit(q, f, op, 0, ok, 0, 1), -EINVAL);        /* no iovec */
        assert_int_equal(pf_blk_submit(q, f, op, 0, zero, 1, 1), -EINVAL);      /* no bytes */
        assert_int_equal(pf_blk_submit(q, f, op, 64 << 10, ok, 1, 1), -EINVAL); /* past end */
        assert_int_equal(pf_blk_submit(q, f, op, (64 << 10) - 4096, ok, 2, 1), -EINVAL);
    }
    /* nothing was queued: a poll finds nothing, within its timeout */
    struct pf_blk_cqe c[4];
    assert_int_equal(pf_blk_poll(q, c, 4, 0), 0);
    assert_int_equal(pf_blk_poll(q, c, 4, 10), 0);
    /* depth: the third outstanding request is refused until one is reaped */
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 0, ok, 2, 11), 0);
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 8192, ok, 2, 12), 0);
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 16384, ok, 2, 13), -EAGAIN);
    poll_n(q, c, 2);
    assert_true((c[0].tag == 11 && c[1].tag == 12) || (c[0].tag == 12 && c[1].tag == 11));
    assert_int_equal(c[0].res, 4608);
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 16384, ok, 2, 13), 0);
    /* destroy with a request outstanding waits for it */
    pf_blk_queue_destroy(q);
    pf_blk_file_close(f);
    free(buf);
    pf_blk_close(b);
}

static void test_vectored_roundtrip(void **st)
{
    struct pf_blk *b = open_blk("uring", NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/rt.dat", tmpdir);
    struct pf_blk_file *f;
    assert_int_equal(
        pf_blk_file_open(b, path, 1 << 20, PF_BLK_OPEN_CREATE | PF_BLK_OPEN_TRUNCATE, &f), 0);
    struct pf_blk_queue *q;
    assert_int_equal(pf_blk_queue_create(b, 16, &q), 0);
    /* 12 segments (more than the inline iovec copy) scattered in memory */
    enum { NSEG = 12, SEG = 1536 };
    uint8_t *src = abuf(2 * NSEG * SEG, 0), *dst = abuf(NSEG * SEG, 0);
    struct iovec w[NSEG];
    for (int i = 0; i < NSEG; i++) {
        uint8_t *p = src + (size_t)(NSEG - 1 - i) * 2 * SEG; /* reversed, with gaps */
        for (int j = 0; j < SEG; j++)
            p[j] = (uint8_t)(i * 31 + j * 7);
        w[i] = (struct iovec){p, SEG};
    }
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 512 * 1024, w, NSEG, 100), 0);
    struct pf_blk_cqe c;
    poll_n(q, &c, 1);
    assert_int_equal(c.res, NSEG * SEG);
    struct iovec r[2] = {{dst, 5 * SEG}, {dst + 5 * SEG, 7 * SEG}};
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_READ, 512 * 1024, r, 2, 101), 0);
    poll_n(q, &c, 1);
    assert_int_equal(c.tag, 101);
    assert_int_equal(c.res, NSEG * SEG);
    for (int i = 0; i < NSEG; i++)
        assert_memory_equal(dst + (size_t)i * SEG, w[i].iov_base, SEG);
    pf_blk_queue_destroy(q);
    pf_blk_file_close(f);
    free(src);
    free(dst);
    pf_blk_close(b);
}

static void test_faulty_uring(void **st)
{
    /* every matching rule counts every call (docs/simulation.md): nth counts all writes */
    struct pf_fault_plan *plan;
    char err[256];
    assert_int_equal(pf_fault_plan_parse("seed=9;blk.write:nth=1,times=1,error=EIO;"
                                         "blk.write:nth=3,times=1,error=ENOSPC,at=complete;"
                                         "blk.read:nth=1,times=1,corrupt=1;"
                                         "blk.read:nth=3,times=1,drop=1;"
                                         "blk.open:nth=2,times=1,error=EACCES",
                                         &plan, err, sizeof(err)),
                     0);
    struct pf_blk_config cfg = {.faults = plan};
    struct pf_blk *b = NULL;
    char chosen[64];
    /* the plan names blk.*: the decorator is added around the named backend */
    assert_int_equal(pf_hal_blk_open("uring", &cfg, &b, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    assert_string_equal(chosen, "faulty:uring");
    char path[512];
    snprintf(path, sizeof(path), "%s/faulty.dat", tmpdir);
    struct pf_blk_file *f, *f2;
    const unsigned cf = PF_BLK_OPEN_CREATE | PF_BLK_OPEN_TRUNCATE;
    assert_int_equal(pf_blk_file_open(b, path, 1 << 20, cf, &f), 0);
    assert_int_equal(pf_blk_file_open(b, path, 1 << 20, 0, &f2), -EACCES); /* 2nd open */
    struct pf_blk_queue *q;
    assert_int_equal(pf_blk_queue_create(b, 8, &q), 0);
    uint8_t *w = abuf(8192, 0x5a), *r = abuf(8192, 0);
    struct iovec wi = {w, 8192}, ri = {r, 8192};
    struct pf_blk_cqe c;
    /* write 1: refused at submission */
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 0, &wi, 1, 1), -EIO);
    /* write 2: fine; write 3: fails at completion */
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 0, &wi, 1, 2), 0);
    poll_n(q, &c, 1);
    assert_int_equal(c.res, 8192);
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 8192, &wi, 1, 3), 0);
    poll_n(q, &c, 1);
    assert_int_equal(c.tag, 3);
    assert_int_equal(c.res, -ENOSPC);
    /* the decorator still checks alignment through the inner backend */
    struct iovec mis = {w + 1, 512};
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_WRITE, 0, &mis, 1, 9), -EINVAL);
    /* read 1: full length but corrupted bytes */
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_READ, 0, &ri, 1, 4), 0);
    poll_n(q, &c, 1);
    assert_int_equal(c.res, 8192);
    assert_memory_not_equal(r, w, 8192);
    /* read 2: intact */
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_READ, 0, &ri, 1, 5), 0);
    poll_n(q, &c, 1);
    assert_memory_equal(r, w, 8192);
    /* read 3: dropped, never completes; a bounded poll returns nothing */
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_READ, 0, &ri, 1, 6), 0);
    assert_int_equal(pf_blk_poll(q, &c, 1, 50), 0);
    assert_int_equal(pf_blk_submit(q, f, PF_BLK_READ, 0, &ri, 1, 7), 0);
    poll_n(q, &c, 1);
    assert_int_equal(c.tag, 7);
    assert_true(pf_fault_fired(plan) >= 5);
    pf_blk_queue_destroy(q);
    pf_blk_file_close(f);
    pf_blk_close(b);
    pf_fault_plan_free(plan);
    free(w);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_creates_and_sizes), cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_submit_checks),          cmocka_unit_test(test_vectored_roundtrip),
        cmocka_unit_test(test_faulty_uring),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

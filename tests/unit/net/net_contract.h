/* NET HAL contract tests shared by every backend's test binary (static functions, included
 * once per binary). The including file sets nc_backend and nc_nics_a / nc_nics_b (the two
 * "nodes": two pf_net instances in this process) before running the tests.
 *
 * Each test builds a connected QP pair (A serves, B reads), fills A's region with seeded
 * random bytes and checks what lands in B byte by byte. Every wait has a deadline. */
#ifndef PF_TESTS_NET_CONTRACT_H
#define PF_TESTS_NET_CONTRACT_H

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "pf/clock.h"
#include "pf/common.h"
#include "pf/hal.h"

/* a binary that cannot run the contract (no device) still includes it */
#pragma GCC diagnostic ignored "-Wunused-function"

static const char *nc_backend = "tcp";
static const char *nc_nics_a[1] = {"127.0.0.1"};
static const char *nc_nics_b[1] = {"127.0.0.2"};
static uint64_t nc_seed;

#define NC_DEADLINE_MS 30000u
#define NC_SRC_LEN     (16u << 20)
#define NC_DST_LEN     (16u << 20)
#define NC_SENTINEL    0xA5

/* splitmix64 */
static uint64_t nc_rand_state;
static uint64_t nc_rand(void)
{
    uint64_t z = (nc_rand_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t nc_rand_range(uint64_t lo, uint64_t hi) /* [lo, hi] */
{
    return lo + nc_rand() % (hi - lo + 1);
}
static void nc_fill_random(void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = nc_rand();
        memcpy(p + i, &v, 8);
    }
    for (; i < len; i++)
        p[i] = (uint8_t)nc_rand();
}

static void nc_seed_init(void)
{
    const char *s = getenv("PF_TEST_SEED");
    nc_seed = s ? strtoull(s, NULL, 0) : (pf_wall_ns() ^ (uint64_t)getpid());
    nc_rand_state = nc_seed;
    fprintf(stderr, "net contract tests: backend %s, seed %" PRIu64 " (PF_TEST_SEED replays)\n",
            nc_backend, nc_seed);
}

static bool nc_all_equal(const uint8_t *p, size_t len, uint8_t v)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != v)
            return false;
    return true;
}

static void *nc_map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

struct nc_node {
    struct pf_net *net;
    const char *const *nics;
};

struct nc_pair {
    struct nc_node a, b;
    struct pf_net_qp *qa, *qb; /* qa on A (serves), qb on B (reads) */
    uint8_t *src, *dst;
    struct pf_net_mr *src_mr, *dst_mr;
};

/* TLS PEM texts nc_open hands to every backend it opens (test_tcpnet_tls.c); NULL: none. */
static const char *nc_tls_cert, *nc_tls_key, *nc_tls_ca;

static struct pf_net *nc_open(const char *backend, const char *const *nics)
{
    struct pf_net_config cfg = {.nics = nics,
                                .nnics = 1,
                                .tls_cert_pem = nc_tls_cert,
                                .tls_key_pem = nc_tls_key,
                                .tls_ca_pem = nc_tls_ca};
    struct pf_net *n = NULL;
    char chosen[64], err[256];
    int rc = pf_hal_net_open(backend, &cfg, &n, chosen, sizeof(chosen), err, sizeof(err));
    if (rc)
        fprintf(stderr, "open %s: %s\n", backend, err);
    assert_int_equal(rc, 0);
    return n;
}

/* Creates and connects one QP on each side (both directions, as the handshake does). */
static void nc_connect(struct pf_net *na, struct pf_net *nb, struct pf_net_qp **qa_p,
                       struct pf_net_qp **qb_p)
{
    uint8_t ea[PF_NET_EP_MAX], eb[PF_NET_EP_MAX];
    size_t la = 0, lb = 0;
    assert_int_equal(pf_net_qp_create(na, 0, qa_p), 0);
    assert_int_equal(pf_net_qp_create(nb, 0, qb_p), 0);
    assert_int_equal(pf_net_qp_local_endpoint(*qa_p, ea, sizeof(ea), &la), 0);
    assert_int_equal(pf_net_qp_local_endpoint(*qb_p, eb, sizeof(eb), &lb), 0);
    assert_true(la > 0 && la <= PF_NET_EP_MAX && lb > 0);
    /* holder side first (it answers the handshake), then the requester */
    assert_int_equal(pf_net_qp_connect(*qa_p, eb, lb), 0);
    assert_int_equal(pf_net_qp_connect(*qb_p, ea, la), 0);
}

static void nc_pair_open_backend(struct nc_pair *p, const char *backend)
{
    memset(p, 0, sizeof(*p));
    p->a.nics = nc_nics_a;
    p->b.nics = nc_nics_b;
    p->a.net = nc_open(backend, nc_nics_a);
    p->b.net = nc_open(backend, nc_nics_b);
    p->src = nc_map(NC_SRC_LEN);
    p->dst = nc_map(NC_DST_LEN);
    nc_fill_random(p->src, NC_SRC_LEN);
    memset(p->dst, NC_SENTINEL, NC_DST_LEN);
    assert_int_equal(pf_net_reg_mem(p->a.net, 0, p->src, NC_SRC_LEN,
                                    PF_NET_ACCESS_LOCAL_WRITE | PF_NET_ACCESS_REMOTE_READ,
                                    &p->src_mr),
                     0);
    assert_int_equal(pf_net_reg_mem(p->b.net, 0, p->dst, NC_DST_LEN,
                                    PF_NET_ACCESS_LOCAL_WRITE | PF_NET_ACCESS_REMOTE_READ,
                                    &p->dst_mr),
                     0);
    nc_connect(p->a.net, p->b.net, &p->qa, &p->qb);
}

static void nc_pair_open(struct nc_pair *p)
{
    nc_pair_open_backend(p, nc_backend);
}

/* Replaces the QP pair (after an error moved it to the error state). */
static void nc_pair_reconnect(struct nc_pair *p)
{
    pf_net_qp_destroy(p->qb);
    pf_net_qp_destroy(p->qa);
    nc_connect(p->a.net, p->b.net, &p->qa, &p->qb);
}

static void nc_pair_close(struct nc_pair *p)
{
    pf_net_qp_destroy(p->qb);
    pf_net_qp_destroy(p->qa);
    pf_net_dereg_mem(p->dst_mr);
    pf_net_dereg_mem(p->src_mr);
    pf_net_close(p->b.net);
    pf_net_close(p->a.net);
    munmap(p->src, NC_SRC_LEN);
    munmap(p->dst, NC_DST_LEN);
}

static uint64_t nc_raddr(struct nc_pair *p, uint64_t off)
{
    return (uint64_t)(uintptr_t)p->src + off;
}

/* Collects exactly n completions (fails the test at the deadline). */
static void nc_wait(struct pf_net_qp *qp, struct pf_net_cqe *out, size_t n)
{
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    size_t got = 0;
    while (got < n) {
        assert_true(pf_now_ns() < deadline);
        int r = pf_net_poll(qp, out + got, n - got, 1000);
        if (r < 0)
            fprintf(stderr, "poll: %d after %zu of %zu completions\n", r, got, n);
        assert_true(r >= 0);
        got += (size_t)r;
    }
}

/* Polls until the QP reports it is broken with nothing left (deadline-bounded). */
static void nc_wait_broken(struct pf_net_qp *qp)
{
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    struct pf_net_cqe c[8];
    for (;;) {
        assert_true(pf_now_ns() < deadline);
        int r = pf_net_poll(qp, c, 8, 100);
        if (r < 0)
            return;
    }
}

static int nc_read1(struct nc_pair *p, uint64_t dst_off, uint64_t raddr, uint32_t rkey,
                    uint64_t len, uint64_t wr_id)
{
    struct pf_net_sge s = {p->dst + dst_off, len, p->dst_mr->lkey};
    return pf_net_post_read(p->qb, &s, 1, raddr, rkey, wr_id);
}

/* ---- tests ---- */

/* Many sizes, unaligned offsets on both sides, multi-SGE, up to 32 READs in flight. */
static void nc_test_read_bytes_exact(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    static const uint64_t sizes[] = {
        1,        2,       7,     63,    64,    511,      4095,
        4096,     4097,    65535, 65536, 65537, 1u << 20, (1u << 20) + 3,
        4u << 20, 12345678};
    uint64_t wr = 1;
    for (int round = 0; round < 3; round++) {
        memset(p.dst, NC_SENTINEL, NC_DST_LEN);
        struct {
            uint64_t soff, doff, len;
        } ops[PF_ARRAY_SIZE(sizes)];
        uint64_t dcur = 0;
        size_t nops = 0;
        for (size_t i = 0; i < PF_ARRAY_SIZE(sizes); i++) {
            uint64_t len = sizes[i];
            uint64_t gap = nc_rand_range(0, 100);
            if (dcur + gap + len > NC_DST_LEN)
                break;
            ops[nops].len = len;
            ops[nops].soff = nc_rand_range(0, NC_SRC_LEN - len);
            ops[nops].doff = dcur + gap;
            dcur += gap + len;
            nops++;
        }
        for (size_t i = 0; i < nops; i++) {
            /* split into 1..16 SGEs (never more SGEs than bytes) */
            struct pf_net_sge sge[16];
            size_t ns = (size_t)nc_rand_range(1, ops[i].len < 16 ? ops[i].len : 16);
            if (round == 0)
                ns = 1;
            uint64_t left = ops[i].len, at = ops[i].doff;
            for (size_t k = 0; k < ns; k++) {
                uint64_t l = k + 1 == ns ? left : nc_rand_range(1, left - (ns - 1 - k));
                sge[k] = (struct pf_net_sge){p.dst + at, l, p.dst_mr->lkey};
                at += l;
                left -= l;
            }
            int rc =
                pf_net_post_read(p.qb, sge, ns, nc_raddr(&p, ops[i].soff), p.src_mr->rkey, wr + i);
            if (rc == -EINVAL && ns > 1) { /* backend with fewer SGEs: fall back to one */
                rc = pf_net_post_read(p.qb, sge, 1, nc_raddr(&p, ops[i].soff), p.src_mr->rkey,
                                      wr + i);
                ops[i].len = sge[0].len;
            }
            assert_int_equal(rc, 0);
        }
        struct pf_net_cqe c[PF_ARRAY_SIZE(sizes)];
        nc_wait(p.qb, c, nops);
        for (size_t i = 0; i < nops; i++) {
            assert_int_equal(c[i].status, 0);
            assert_int_equal(c[i].wr_id, wr + i); /* RC: completions in posting order */
            assert_int_equal(c[i].bytes, ops[i].len);
            assert_memory_equal(p.dst + ops[i].doff, p.src + ops[i].soff, ops[i].len);
        }
        /* gaps between destinations untouched */
        for (size_t i = 0; i + 1 < nops; i++) {
            uint64_t e = ops[i].doff + ops[i].len;
            assert_true(nc_all_equal(p.dst + e, ops[i + 1].doff - e, NC_SENTINEL));
        }
        wr += nops;
    }
    nc_pair_close(&p);
}

/* A whole 16 MiB region in 256 KiB pieces, keeping the send queue full. */
static void nc_test_read_pipelined(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    const uint64_t blk = 256u << 10, n = NC_SRC_LEN / blk;
    uint64_t posted = 0, done = 0;
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    while (done < n) {
        assert_true(pf_now_ns() < deadline);
        while (posted < n) {
            int rc =
                nc_read1(&p, posted * blk, nc_raddr(&p, posted * blk), p.src_mr->rkey, blk, posted);
            if (rc == -EAGAIN)
                break;
            assert_int_equal(rc, 0);
            posted++;
        }
        struct pf_net_cqe c[64];
        int r = pf_net_poll(p.qb, c, 64, 1000);
        assert_true(r >= 0);
        for (int i = 0; i < r; i++) {
            assert_int_equal(c[i].status, 0);
            assert_int_equal(c[i].wr_id, done);
            done++;
        }
    }
    assert_memory_equal(p.dst, p.src, NC_SRC_LEN);
    nc_pair_close(&p);
}

static void nc_expect_remote_error(struct nc_pair *p, uint64_t raddr, uint32_t rkey, uint64_t len)
{
    memset(p->dst, NC_SENTINEL, 1u << 20);
    assert_int_equal(nc_read1(p, 0, raddr, rkey, len, 77), 0);
    struct pf_net_cqe c;
    nc_wait(p->qb, &c, 1);
    assert_int_equal(c.wr_id, 77);
    assert_int_equal(c.status, -EREMOTEIO);
    assert_true(nc_all_equal(p->dst, 1u << 20, NC_SENTINEL)); /* never data */
    /* RC semantics: the QP is in the error state now */
    assert_int_equal(nc_read1(p, 0, nc_raddr(p, 0), p->src_mr->rkey, 8, 78), -ENOTCONN);
    nc_wait_broken(p->qb);
    nc_pair_reconnect(p);
    /* a fresh QP works */
    assert_int_equal(nc_read1(p, 0, nc_raddr(p, 0), p->src_mr->rkey, 4096, 79), 0);
    nc_wait(p->qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_memory_equal(p->dst, p->src, 4096);
}

static void nc_test_wrong_rkey(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    nc_expect_remote_error(&p, nc_raddr(&p, 0), p.src_mr->rkey ^ 0x1, 4096);
    nc_expect_remote_error(&p, nc_raddr(&p, 0), p.src_mr->rkey + 0x100, 1u << 20);
    nc_pair_close(&p);
}

static void nc_test_out_of_bounds(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    uint32_t rk = p.src_mr->rkey;
    nc_expect_remote_error(&p, nc_raddr(&p, NC_SRC_LEN - 100), rk, 101); /* one past the end */
    nc_expect_remote_error(&p, nc_raddr(&p, NC_SRC_LEN), rk, 1);         /* at the end */
    nc_expect_remote_error(&p, nc_raddr(&p, 0) - 1, rk, 16);             /* before start */
    nc_expect_remote_error(&p, UINT64_MAX - 8, rk, 64);                  /* wraps */
    nc_pair_close(&p);
}

static void nc_test_deregistered_region(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    struct pf_net_mr *mr2 = NULL;
    uint8_t *buf = nc_map(1u << 20);
    nc_fill_random(buf, 1u << 20);
    assert_int_equal(pf_net_reg_mem(p.a.net, 0, buf, 1u << 20,
                                    PF_NET_ACCESS_LOCAL_WRITE | PF_NET_ACCESS_REMOTE_READ, &mr2),
                     0);
    uint32_t rk = mr2->rkey;
    /* live: works */
    assert_int_equal(nc_read1(&p, 0, (uint64_t)(uintptr_t)buf, rk, 1u << 20, 1), 0);
    struct pf_net_cqe c;
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_memory_equal(p.dst, buf, 1u << 20);
    pf_net_dereg_mem(mr2);
    nc_expect_remote_error(&p, (uint64_t)(uintptr_t)buf, rk, 4096);
    munmap(buf, 1u << 20);
    nc_pair_close(&p);
}

static void nc_test_no_remote_access(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    struct pf_net_mr *mr2 = NULL;
    uint8_t *buf = nc_map(65536);
    assert_int_equal(pf_net_reg_mem(p.a.net, 0, buf, 65536, PF_NET_ACCESS_LOCAL_WRITE, &mr2), 0);
    nc_expect_remote_error(&p, (uint64_t)(uintptr_t)buf, mr2->rkey, 4096);
    pf_net_dereg_mem(mr2);
    munmap(buf, 65536);
    nc_pair_close(&p);
}

static void nc_test_bad_local_sge(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    struct pf_net_sge s = {p.dst, 4096, p.dst_mr->lkey ^ 0x5a5a};
    assert_int_equal(pf_net_post_read(p.qb, &s, 1, nc_raddr(&p, 0), p.src_mr->rkey, 1), -EINVAL);
    s = (struct pf_net_sge){p.dst + NC_DST_LEN - 10, 11, p.dst_mr->lkey}; /* past the MR */
    assert_int_equal(pf_net_post_read(p.qb, &s, 1, nc_raddr(&p, 0), p.src_mr->rkey, 1), -EINVAL);
    assert_int_equal(pf_net_post_read(p.qb, &s, 0, nc_raddr(&p, 0), p.src_mr->rkey, 1), -EINVAL);
    /* the QP is still usable */
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 2), 0);
    struct pf_net_cqe c;
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_memory_equal(p.dst, p.src, 4096);
    nc_pair_close(&p);
}

/* The send queue is bounded: -EAGAIN when full, usable again after polling. */
static void nc_test_send_queue_full(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    size_t posted = 0;
    int rc;
    while ((rc = nc_read1(&p, (posted % 1024) * 64, nc_raddr(&p, posted * 64), p.src_mr->rkey, 64,
                          posted)) == 0) {
        posted++;
        assert_true(posted <= 4096);
    }
    assert_int_equal(rc, -EAGAIN);
    assert_true(posted >= 16);
    struct pf_net_cqe *c = calloc(posted, sizeof(*c));
    nc_wait(p.qb, c, posted);
    for (size_t i = 0; i < posted; i++) {
        assert_int_equal(c[i].status, 0);
        assert_int_equal(c[i].wr_id, i);
    }
    free(c);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 64, 9), 0);
    struct pf_net_cqe one;
    nc_wait(p.qb, &one, 1);
    assert_int_equal(one.status, 0);
    nc_pair_close(&p);
}

/* qp_invalidate with large READs in flight: every outstanding READ completes (0 if it had
 * finished, else -ECANCELED) and no byte lands in local memory after it returns. */
static void nc_test_invalidate_inflight(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    const uint64_t blk = 2u << 20, n = NC_DST_LEN / blk;
    for (int iter = 0; iter < 8; iter++) {
        for (uint64_t i = 0; i < n; i++)
            assert_int_equal(nc_read1(&p, i * blk, nc_raddr(&p, i * blk), p.src_mr->rkey, blk, i),
                             0);
        /* let a varying number complete first */
        uint64_t wait_for = (uint64_t)iter % (n + 1);
        struct pf_net_cqe c[16];
        size_t got = 0;
        if (wait_for)
            nc_wait(p.qb, c, wait_for);
        got = wait_for;
        pf_net_qp_invalidate(p.qb);
        memset(p.dst, NC_SENTINEL, NC_DST_LEN); /* TSan: must not race the receive path */
        assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 8, 99), -ENOTCONN);
        uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
        for (;;) {
            assert_true(pf_now_ns() < deadline);
            struct pf_net_cqe one;
            int r = pf_net_poll(p.qb, &one, 1, 100);
            if (r < 0)
                break;
            if (r == 1) {
                assert_true(got < n);
                c[got++] = one;
            }
        }
        assert_int_equal(got, n);
        for (uint64_t i = wait_for; i < n; i++) {
            assert_int_equal(c[i].wr_id, i);
            assert_true(c[i].status == 0 || c[i].status == -ECANCELED);
        }
        /* The server keeps streaming until it notices: drive a full READ on a fresh QP
         * through the same server so it has moved on, then check nothing landed. */
        struct pf_net_qp *qa2, *qb2;
        nc_connect(p.a.net, p.b.net, &qa2, &qb2);
        uint8_t *tmp = nc_map(4u << 20);
        struct pf_net_mr *tmr;
        assert_int_equal(pf_net_reg_mem(p.b.net, 0, tmp, 4u << 20, PF_NET_ACCESS_LOCAL_WRITE, &tmr),
                         0);
        struct pf_net_sge s = {tmp, 4u << 20, tmr->lkey};
        assert_int_equal(pf_net_post_read(qb2, &s, 1, nc_raddr(&p, 0), p.src_mr->rkey, 5), 0);
        nc_wait(qb2, c, 1);
        assert_int_equal(c[0].status, 0);
        assert_memory_equal(tmp, p.src, 4u << 20);
        assert_true(nc_all_equal(p.dst, NC_DST_LEN, NC_SENTINEL));
        pf_net_qp_destroy(qb2);
        pf_net_qp_destroy(qa2);
        pf_net_dereg_mem(tmr);
        munmap(tmp, 4u << 20);
        pf_net_qp_invalidate(p.qb); /* idempotent */
        nc_pair_reconnect(&p);
    }
    nc_pair_close(&p);
}

/* The holder invalidates its side: the requester's READs fail, poll never hangs. */
static void nc_test_remote_qp_invalidated(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    pf_net_qp_invalidate(p.qa);
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    int posted = 0, errors = 0, done = 0;
    for (;;) {
        assert_true(pf_now_ns() < deadline);
        int rc = nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 1u << 20, 1);
        if (rc == -ENOTCONN)
            break;
        assert_int_equal(rc, 0);
        posted++;
        struct pf_net_cqe c;
        int r = pf_net_poll(p.qb, &c, 1, 1000);
        if (r == 1) {
            done++;
            if (c.status)
                errors++;
        }
    }
    struct pf_net_cqe c[256];
    for (;;) { /* drain */
        assert_true(pf_now_ns() < deadline);
        int r = pf_net_poll(p.qb, c, 256, 100);
        if (r < 0)
            break;
        for (int i = 0; i < r; i++)
            errors += c[i].status != 0;
        done += r;
    }
    assert_int_equal(done, posted);
    /* either the requester noticed before its first post, or its READs failed */
    assert_true(posted == 0 || errors >= 1);
    nc_pair_close(&p);
}

static void nc_test_poll_idle_timeout(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    struct pf_net_cqe c;
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 0), 0);
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 20), 0);
    struct pf_net_qp *q;
    assert_int_equal(pf_net_qp_create(p.b.net, 0, &q), 0); /* not connected */
    assert_int_equal(pf_net_poll(q, &c, 1, 10), 0);
    assert_int_equal(pf_net_post_read(q, &(struct pf_net_sge){p.dst, 8, p.dst_mr->lkey}, 1,
                                      nc_raddr(&p, 0), p.src_mr->rkey, 1),
                     -ENOTCONN);
    pf_net_qp_destroy(q);
    nc_pair_close(&p);
}

static void nc_test_endpoint_errors(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    struct pf_net_qp *q;
    assert_int_equal(pf_net_qp_create(p.b.net, 0, &q), 0);
    uint8_t ep[PF_NET_EP_MAX];
    size_t len = 0;
    assert_int_equal(pf_net_qp_local_endpoint(q, ep, 4, &len), -ENOSPC);
    assert_int_equal(pf_net_qp_local_endpoint(q, ep, sizeof(ep), &len), 0);
    uint8_t junk[16] = {1, 2, 3};
    assert_int_equal(pf_net_qp_connect(q, junk, sizeof(junk)), -EINVAL);
    ep[0] ^= 0xff; /* bad magic */
    assert_int_equal(pf_net_qp_connect(q, ep, len), -EINVAL);
    pf_net_qp_destroy(q);
    /* an already connected QP refuses a second connect */
    uint8_t ea[PF_NET_EP_MAX];
    size_t la;
    assert_int_equal(pf_net_qp_local_endpoint(p.qa, ea, sizeof(ea), &la), 0);
    assert_int_not_equal(pf_net_qp_connect(p.qb, ea, la), 0);
    nc_pair_close(&p);
}

/* Several QPs read concurrently from several threads (exercises locking under TSan). */
struct nc_thr {
    struct nc_pair *p;
    struct pf_net_qp *qa, *qb;
    uint64_t off, len;
    int rc;
};

static void *nc_reader(void *arg)
{
    struct nc_thr *t = arg;
    const uint64_t blk = 64u << 10;
    uint64_t posted = 0, done = 0, n = t->len / blk;
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    while (done < n && pf_now_ns() < deadline) {
        while (posted < n) {
            struct pf_net_sge s = {t->p->dst + t->off + posted * blk, blk, t->p->dst_mr->lkey};
            int rc = pf_net_post_read(t->qb, &s, 1, nc_raddr(t->p, t->off + posted * blk),
                                      t->p->src_mr->rkey, posted);
            if (rc == -EAGAIN)
                break;
            if (rc) {
                t->rc = rc;
                return NULL;
            }
            posted++;
        }
        struct pf_net_cqe c[32];
        int r = pf_net_poll(t->qb, c, 32, 1000);
        if (r < 0) {
            t->rc = r;
            return NULL;
        }
        for (int i = 0; i < r; i++) {
            if (c[i].status || c[i].wr_id != done) {
                t->rc = c[i].status ? c[i].status : -EPROTO;
                return NULL;
            }
            done++;
        }
    }
    t->rc = done == n ? 0 : -ETIMEDOUT;
    return NULL;
}

static void nc_test_concurrent_qps(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    enum { NT = 4 };
    struct nc_thr t[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        t[i] = (struct nc_thr){
            .p = &p, .off = (uint64_t)i * (NC_DST_LEN / NT), .len = NC_DST_LEN / NT};
        nc_connect(p.a.net, p.b.net, &t[i].qa, &t[i].qb);
    }
    for (int i = 0; i < NT; i++)
        assert_int_equal(pthread_create(&th[i], NULL, nc_reader, &t[i]), 0);
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].rc, 0);
        pf_net_qp_destroy(t[i].qb);
        pf_net_qp_destroy(t[i].qa);
    }
    assert_memory_equal(p.dst, p.src, NC_DST_LEN);
    nc_pair_close(&p);
}

/* Both directions on one QP pair (RC QPs are bidirectional): B reads A and A reads B. */
static void nc_test_bidirectional(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    /* A reads B's dst region (B registered it with remote read) into A's src tail */
    nc_fill_random(p.dst, 65536);
    struct pf_net_sge s = {p.src + NC_SRC_LEN - 65536, 65536, p.src_mr->lkey};
    assert_int_equal(pf_net_post_read(p.qa, &s, 1, (uint64_t)(uintptr_t)p.dst, p.dst_mr->rkey, 3),
                     0);
    struct pf_net_cqe c;
    nc_wait(p.qa, &c, 1);
    assert_int_equal(c.status, 0);
    assert_memory_equal(p.src + NC_SRC_LEN - 65536, p.dst, 65536);
    assert_int_equal(nc_read1(&p, 65536, nc_raddr(&p, 0), p.src_mr->rkey, 65536, 4), 0);
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_memory_equal(p.dst + 65536, p.src, 65536);
    nc_pair_close(&p);
}

#define NC_CONTRACT_TESTS                                                                          \
    cmocka_unit_test(nc_test_read_bytes_exact), cmocka_unit_test(nc_test_read_pipelined),          \
        cmocka_unit_test(nc_test_wrong_rkey), cmocka_unit_test(nc_test_out_of_bounds),             \
        cmocka_unit_test(nc_test_deregistered_region), cmocka_unit_test(nc_test_no_remote_access), \
        cmocka_unit_test(nc_test_bad_local_sge), cmocka_unit_test(nc_test_send_queue_full),        \
        cmocka_unit_test(nc_test_invalidate_inflight),                                             \
        cmocka_unit_test(nc_test_remote_qp_invalidated),                                           \
        cmocka_unit_test(nc_test_poll_idle_timeout), cmocka_unit_test(nc_test_endpoint_errors),    \
        cmocka_unit_test(nc_test_concurrent_qps), cmocka_unit_test(nc_test_bidirectional)

#endif

/* The faulty: NET decorator (src/hal/fault_net.c) over a scripted in-process backend, where
 * the timing of completions is exact: corruption lands with a successful completion, but
 * never after qp_invalidate has returned (the caller may have freed the buffer by then).
 * (The decorator over the real TCP fabric is covered in test_tcpnet.c.) */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/clock.h"
#include "pf/common.h"
#include "pf/fault.h"
#include "pf/hal.h"

/* ---- a backend whose READs complete at once (memcpy) and wait in its CQ until polled ---- */

struct mnet {
    struct pf_net base;
};
struct mqp {
    struct pf_net_qp base;
    struct pf_net_cqe cq[16];
    int n;
};

static int m_nic_count(struct pf_net *n)
{
    return 1;
}
static int m_reg(struct pf_net *n, int nic, void *addr, uint64_t len, unsigned acc,
                 struct pf_net_mr **mr_p)
{
    struct pf_net_mr *m = calloc(1, sizeof(*m));
    *m = (struct pf_net_mr){.net = n, .nic = nic, .addr = addr, .len = len, .lkey = 1, .rkey = 2};
    *mr_p = m;
    return 0;
}
static void m_dereg(struct pf_net_mr *mr)
{
    free(mr);
}
static int m_qp_create(struct pf_net *n, int nic, struct pf_net_qp **qp_p)
{
    struct mqp *q = calloc(1, sizeof(*q));
    q->base.net = n;
    *qp_p = &q->base;
    return 0;
}
static int m_read(struct pf_net_qp *qp, const struct pf_net_sge *sge, size_t nsge, uint64_t raddr,
                  uint32_t rkey, uint64_t wr_id)
{
    struct mqp *q = pf_container_of(qp, struct mqp, base);
    const uint8_t *src = (const uint8_t *)(uintptr_t)raddr;
    uint64_t total = 0;
    for (size_t i = 0; i < nsge; i++) {
        memcpy(sge[i].addr, src + total, sge[i].len);
        total += sge[i].len;
    }
    q->cq[q->n++] = (struct pf_net_cqe){.wr_id = wr_id, .status = 0, .bytes = total};
    return 0;
}
static int m_poll(struct pf_net_qp *qp, struct pf_net_cqe *out, size_t max, uint64_t t)
{
    struct mqp *q = pf_container_of(qp, struct mqp, base);
    size_t k = 0;
    while (k < max && q->n) {
        out[k++] = q->cq[0];
        memmove(q->cq, q->cq + 1, (size_t)--q->n * sizeof(q->cq[0]));
    }
    return (int)k;
}
static void m_inval(struct pf_net_qp *qp)
{
    /* every READ already completed (successfully): nothing to flush */
}
static void m_qp_destroy(struct pf_net_qp *qp)
{
    free(pf_container_of(qp, struct mqp, base));
}
static void m_close(struct pf_net *n)
{
    free(pf_container_of(n, struct mnet, base));
}

static const struct pf_net_ops mops = {
    .name = "script",
    .nic_count = m_nic_count,
    .reg_mem = m_reg,
    .dereg_mem = m_dereg,
    .qp_create = m_qp_create,
    .post_read = m_read,
    .poll = m_poll,
    .qp_invalidate = m_inval,
    .qp_destroy = m_qp_destroy,
    .close = m_close,
};

static struct pf_net *faulty_over_script(const char *spec, struct pf_fault_plan **plan_p)
{
    char err[128];
    assert_int_equal(pf_fault_plan_parse(spec, plan_p, err, sizeof(err)), 0);
    struct mnet *m = calloc(1, sizeof(*m));
    m->base.ops = &mops;
    struct pf_net *f = NULL;
    assert_int_equal(pf_fault_net_wrap(&m->base, *plan_p, &f), 0);
    return f;
}

static void test_corrupt_applies_on_success(void **st)
{
    struct pf_fault_plan *plan;
    struct pf_net *n = faulty_over_script("seed=11;net.read:corrupt=1", &plan);
    uint8_t src[4096], dst[4096];
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)(i * 7 + 1);
    struct pf_net_qp *qp;
    struct pf_net_mr *mr;
    assert_int_equal(pf_net_qp_create(n, 0, &qp), 0);
    assert_int_equal(pf_net_reg_mem(n, 0, dst, sizeof(dst), PF_NET_ACCESS_LOCAL_WRITE, &mr), 0);
    struct pf_net_sge s = {dst, sizeof(dst), mr->lkey};
    assert_int_equal(pf_net_post_read(qp, &s, 1, (uint64_t)(uintptr_t)src, 2, 1), 0);
    struct pf_net_cqe c;
    assert_int_equal(pf_net_poll(qp, &c, 1, 0), 1);
    assert_int_equal(c.status, 0);
    assert_true(memcmp(dst, src, sizeof(dst)) != 0);
    pf_net_dereg_mem(mr);
    pf_net_qp_destroy(qp);
    pf_net_close(n);
    pf_fault_plan_free(plan);
}

/* Regression: a READ that completed before qp_invalidate but is polled after it must not be
 * corrupted then: the caller is allowed to have freed (here: reused) the buffer. */
static void test_no_corruption_after_invalidate(void **st)
{
    struct pf_fault_plan *plan;
    struct pf_net *n = faulty_over_script("seed=12;net.read:corrupt=1", &plan);
    uint8_t src[4096], dst[4096];
    memset(src, 0x42, sizeof(src));
    struct pf_net_qp *qp;
    struct pf_net_mr *mr;
    assert_int_equal(pf_net_qp_create(n, 0, &qp), 0);
    assert_int_equal(pf_net_reg_mem(n, 0, dst, sizeof(dst), PF_NET_ACCESS_LOCAL_WRITE, &mr), 0);
    struct pf_net_sge s = {dst, sizeof(dst), mr->lkey};
    assert_int_equal(pf_net_post_read(qp, &s, 1, (uint64_t)(uintptr_t)src, 2, 1), 0);
    pf_net_qp_invalidate(qp);
    memset(dst, 0xA5, sizeof(dst)); /* the buffer belongs to someone else now */
    struct pf_net_cqe c;
    assert_int_equal(pf_net_poll(qp, &c, 1, 0), 1);
    assert_int_equal(c.wr_id, 1);
    for (size_t i = 0; i < sizeof(dst); i++)
        assert_int_equal(dst[i], 0xA5);
    pf_net_dereg_mem(mr);
    pf_net_qp_destroy(qp);
    pf_net_close(n);
    pf_fault_plan_free(plan);
}

/* Regression: a dropped READ never completes by itself, but qp_invalidate flushes it with
 * -ECANCELED like every outstanding READ (the HAL contract), so a caller draining after its
 * deadline accounts for every wr_id. */
static void test_dropped_read_flushed_by_invalidate(void **st)
{
    struct pf_fault_plan *plan;
    struct pf_net *n = faulty_over_script("seed=13;net.read:drop=1,times=1", &plan);
    uint8_t src[64] = {1}, dst[64] = {0};
    struct pf_net_qp *qp;
    struct pf_net_mr *mr;
    assert_int_equal(pf_net_qp_create(n, 0, &qp), 0);
    assert_int_equal(pf_net_reg_mem(n, 0, dst, sizeof(dst), PF_NET_ACCESS_LOCAL_WRITE, &mr), 0);
    struct pf_net_sge s = {dst, sizeof(dst), mr->lkey};
    assert_int_equal(pf_net_post_read(qp, &s, 1, (uint64_t)(uintptr_t)src, 2, 7), 0);
    assert_int_equal(pf_net_post_read(qp, &s, 1, (uint64_t)(uintptr_t)src, 2, 8), 0);
    struct pf_net_cqe c[2];
    assert_int_equal(pf_net_poll(qp, c, 2, 5), 1); /* only the second: the first is dropped */
    assert_int_equal(c[0].wr_id, 8);
    assert_int_equal(pf_net_poll(qp, c, 2, 5), 0);
    pf_net_qp_invalidate(qp);
    assert_int_equal(pf_net_poll(qp, c, 2, 5), 1);
    assert_int_equal(c[0].wr_id, 7);
    assert_int_equal(c[0].status, -ECANCELED);
    assert_int_equal(pf_net_poll(qp, c, 2, 0), 0);
    pf_net_dereg_mem(mr);
    pf_net_qp_destroy(qp);
    pf_net_close(n);
    pf_fault_plan_free(plan);
}

/* stall: the post of the chosen READ returns only after the stall, then the READ is
 * submitted and completes normally, byte-exact; the READs around it are not held. */
static void test_stalled_post_then_submitted(void **st)
{
    struct pf_fault_plan *plan;
    struct pf_net *n = faulty_over_script("net.read:nth=2,stall=60,times=1", &plan);
    uint8_t src[256], dst[3][256];
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)(i * 13 + 5);
    memset(dst, 0, sizeof(dst));
    struct pf_net_qp *qp;
    struct pf_net_mr *mr;
    assert_int_equal(pf_net_qp_create(n, 0, &qp), 0);
    assert_int_equal(pf_net_reg_mem(n, 0, dst, sizeof(dst), PF_NET_ACCESS_LOCAL_WRITE, &mr), 0);
    uint64_t took[3];
    for (int k = 0; k < 3; k++) {
        struct pf_net_sge s = {dst[k], sizeof(src), mr->lkey};
        uint64_t t0 = pf_now_ns();
        assert_int_equal(pf_net_post_read(qp, &s, 1, (uint64_t)(uintptr_t)src, 2, 20 + k), 0);
        took[k] = pf_now_ns() - t0;
    }
    assert_true(took[1] >= 60 * PF_NS_PER_MS); /* slept at least the stall (a lower bound) */
    struct pf_net_cqe c[3];
    assert_int_equal(pf_net_poll(qp, c, 3, 0), 3);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(c[k].wr_id, 20 + k);
        assert_int_equal(c[k].status, 0);
        assert_memory_equal(dst[k], src, sizeof(src));
    }
    pf_net_dereg_mem(mr);
    pf_net_qp_destroy(qp);
    pf_net_close(n);
    pf_fault_plan_free(plan);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corrupt_applies_on_success),
        cmocka_unit_test(test_no_corruption_after_invalidate),
        cmocka_unit_test(test_dropped_read_flushed_by_invalidate),
        cmocka_unit_test(test_stalled_post_then_submitted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* verbs NET backend (hw/verbs/verbs.c), per-NIC health against the fake HCA (fake_hca.h):
 * a NIC whose port is down at open does not fail the open when another NIC is ACTIVE (warned
 * by name, reported inactive by nic_info, no QPs on it), it is used from the first
 * qp_create (handshake) after its port is ACTIVE again (port and GID chosen then), and an
 * open where every NIC is down fails with -ENETDOWN naming them all. And the poll's bounded
 * spin: a completion due within a few CQ polls is returned without arming the CQ; one that
 * is not is waited for on the completion channel. Skipped (77) when the backend is not
 * compiled. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "pf/clock.h"
#include "pf/common.h"
#include "pf/hal.h"
#include "pf/log.h"

#include "fake_hca.h"

#if HAVE_IBV_HEADERS

/* Runs open with the log captured into buf. */
static int open_logged(const char *const *nics, size_t n, struct pf_net **n_p, char *buf,
                       size_t len)
{
    char path[] = "/tmp/pf-verbs-rails-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    pf_log_set_fd(fd);
    struct pf_net_config cfg = {.nics = nics, .nnics = n};
    int rc = pf_verbs_open_api(&fake_api, &cfg, n_p);
    pf_log_set_fd(2);
    ssize_t got = pread(fd, buf, len - 1, 0);
    buf[got > 0 ? got : 0] = '\0';
    close(fd);
    return rc;
}

static void test_nic_down_at_open(void **st)
{
    (void)st;
    F.devs[1].port[1].state = IBV_PORT_DOWN; /* ib0's only port */
    struct pf_net *n = NULL;
    char log[4096];
    const char *nics[] = {"mlx5_0", "ib0"};
    assert_int_equal(open_logged(nics, 2, &n, log, sizeof(log)), 0); /* -ENETDOWN before */
    if (!strstr(log, "ib0: no ACTIVE port") || !strstr(log, "(ib0)"))
        fail_msg("the down NIC is not named in the log: %s", log);
    assert_int_equal(pf_net_nic_count(n), 2);
    struct pf_net_nic_info info;
    assert_int_equal(pf_net_nic_info(n, 0, &info), 0);
    assert_true(info.active);
    assert_string_equal(info.addr, "::ffff:10.0.0.1");
    assert_int_equal(pf_net_nic_info(n, 1, &info), 0);
    assert_string_equal(info.name, "ib0");
    assert_false(info.active);
    assert_string_equal(info.addr, ""); /* no GID chosen while down */
    struct pf_net_qp *q0, *q1;
    assert_int_equal(pf_net_qp_create(n, 0, &q0), 0);
    int before = F.nqps;
    assert_int_equal(pf_net_qp_create(n, 1, &q1), -ENETDOWN);
    assert_int_equal(F.nqps, before); /* no ibv_create_qp on the down NIC */

    /* the rail comes back: the next handshake's qp_create chooses its port and GID */
    F.devs[1].port[1].state = IBV_PORT_ACTIVE;
    assert_int_equal(pf_net_qp_create(n, 1, &q1), 0);
    assert_int_equal(F.qps[F.nqps - 1]->init_attr.port_num, 1);
    assert_int_equal(pf_net_nic_info(n, 1, &info), 0);
    assert_true(info.active);
    assert_string_equal(info.addr, "fe80::2:c903:a:1");
    uint8_t ep[PF_NET_EP_MAX];
    size_t len = 0;
    assert_int_equal(pf_net_qp_local_endpoint(q1, ep, sizeof(ep), &len), 0);
    assert_int_equal(ep[6], IBV_LINK_LAYER_INFINIBAND);
    assert_int_equal(ep[32] | ep[33] << 8, 7); /* the LID of the port as it is now */
    pf_net_qp_destroy(q0);
    pf_net_qp_destroy(q1);
    pf_net_close(n);
    assert_int_equal(F.ctx_live, 0);
    assert_int_equal(F.pds_live, 0);
}

static void test_all_nics_down(void **st)
{
    (void)st;
    F.devs[0].port[2].state = IBV_PORT_DOWN; /* mlx5_0: both ports down */
    F.devs[1].port[1].state = IBV_PORT_INIT; /* ib0: link up, no subnet manager yet */
    struct pf_net *n = NULL;
    char log[4096];
    const char *nics[] = {"mlx5_0", "ib0"};
    assert_int_equal(open_logged(nics, 2, &n, log, sizeof(log)), -ENETDOWN);
    assert_null(n);
    if (!strstr(log, "no NIC has an ACTIVE port (mlx5_0, ib0)"))
        fail_msg("the down NICs are not named: %s", log);
    assert_int_equal(F.ctx_live, 0);
    assert_int_equal(F.pds_live, 0);
    /* one NIC alone, down: the same */
    assert_int_equal(open_logged(nics + 1, 1, &n, log, sizeof(log)), -ENETDOWN);
    assert_non_null(strstr(log, "(ib0)"));
    assert_int_equal(F.ctx_live, 0);
}

/* A GID override that matches nothing still fails the open on an ACTIVE NIC (a
 * configuration error is not a down rail), and is only found later on a NIC that was down. */
static void test_gid_error_not_a_down_rail(void **st)
{
    (void)st;
    struct pf_net_rdma_opts o = pf_net_rdma_defaults();
    o.gid_index = 5; /* mlx5_0 has it, ib0's table has 2 entries */
    F.devs[0].port[2].state = IBV_PORT_DOWN;
    struct pf_net_config cfg = {.nics = (const char *[]){"mlx5_0", "ib0"}, .nnics = 2, .rdma = &o};
    struct pf_net *n = NULL;
    assert_int_equal(pf_verbs_open_api(&fake_api, &cfg, &n), -ENOENT); /* ib0 is ACTIVE */
    F.devs[0].port[2].state = IBV_PORT_ACTIVE;
    F.devs[1].port[1].state = IBV_PORT_DOWN;
    assert_int_equal(pf_verbs_open_api(&fake_api, &cfg, &n), 0);
    F.devs[1].port[1].state = IBV_PORT_ACTIVE;
    struct pf_net_qp *q;
    assert_int_equal(pf_net_qp_create(n, 1, &q), -ENOENT); /* up now, but no GID[5] */
    struct pf_net_nic_info info;
    assert_int_equal(pf_net_nic_info(n, 1, &info), 0);
    assert_false(info.active);
    pf_net_close(n);
    assert_int_equal(F.ctx_live, 0);
}

/* Two QPs of mlx5_0 connected to each other, a registered buffer. */
struct pair {
    struct pf_net *n;
    struct pf_net_qp *qa, *qb;
    void *buf;
    struct pf_net_mr *mr;
};

static void pair_open(struct pair *p)
{
    const char *nics[] = {"mlx5_0"};
    struct pf_net_config cfg = {.nics = nics, .nnics = 1};
    assert_int_equal(pf_verbs_open_api(&fake_api, &cfg, &p->n), 0);
    p->buf = calloc(1, 4096);
    assert_int_equal(pf_net_reg_mem(p->n, 0, p->buf, 4096, PF_NET_ACCESS_LOCAL_WRITE, &p->mr), 0);
    assert_int_equal(pf_net_qp_create(p->n, 0, &p->qa), 0);
    assert_int_equal(pf_net_qp_create(p->n, 0, &p->qb), 0);
    uint8_t ea[PF_NET_EP_MAX], eb[PF_NET_EP_MAX];
    size_t la, lb;
    assert_int_equal(pf_net_qp_local_endpoint(p->qa, ea, sizeof(ea), &la), 0);
    assert_int_equal(pf_net_qp_local_endpoint(p->qb, eb, sizeof(eb), &lb), 0);
    assert_int_equal(pf_net_qp_connect(p->qa, eb, lb), 0);
    assert_int_equal(pf_net_qp_connect(p->qb, ea, la), 0);
}

static void pair_close(struct pair *p)
{
    pf_net_qp_destroy(p->qa);
    pf_net_qp_destroy(p->qb);
    pf_net_dereg_mem(p->mr);
    pf_net_close(p->n);
    free(p->buf);
}

static void *complete_when_armed(void *arg)
{
    struct fake_qp *q = arg;
    pthread_mutex_lock(&F.mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    while (F.notifies == 0)
        if (pthread_cond_timedwait(&F.cv, &F.mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&F.mu);
    fake_complete(q, 1, IBV_WC_SUCCESS);
    return NULL;
}

static void test_poll_spins_before_arming(void **st)
{
    (void)st;
    struct pair p;
    pair_open(&p);
    struct fake_qp *fb = F.qps[F.nqps - 1];
    struct pf_net_sge s = {p.buf, 64, p.mr->lkey};
    /* completes on the 3rd CQ poll: taken by the spin, the CQ never armed (before: the
     * first empty poll armed it, ibv_req_notify_cq each time the CQ ran dry) */
    assert_int_equal(pf_net_post_read(p.qb, &s, 1, 0x1000, 1, 7), 0);
    F.complete_after_poll = 3;
    struct pf_net_cqe c;
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 30000), 1);
    assert_int_equal(c.wr_id, 7);
    assert_int_equal(c.status, 0);
    assert_int_equal(F.notifies, 0);
    /* not within the spin (PF_VERBS_SPIN_POLLS): armed, then woken by the channel */
    assert_int_equal(pf_net_post_read(p.qb, &s, 1, 0x1000, 1, 8), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, complete_when_armed, fb), 0);
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 30000), 1);
    pthread_join(t, NULL);
    assert_int_equal(c.wr_id, 8);
    assert_int_equal(F.notifies, 1);
    /* an idle poll still returns 0 at its timeout */
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 5), 0);
    pair_close(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_nic_down_at_open, fake_setup),
        cmocka_unit_test_setup(test_all_nics_down, fake_setup),
        cmocka_unit_test_setup(test_gid_error_not_a_down_rail, fake_setup),
        cmocka_unit_test_setup(test_poll_spins_before_arming, fake_setup),
    };
    return FAKE_HCA_RUN(tests);
}

#endif

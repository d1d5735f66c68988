/* TCP fabric (sim/net/tcpnet.c): the NET contract over loopback (two fabric instances in
 * this process, 127.0.0.1 serving and 127.0.0.2 reading), plus what only the TCP fabric can
 * be tested for: a scripted misbehaving peer speaking the wire format, a peer process
 * killed mid-transfer, local deregistration with READs in flight, and the faulty: decorator
 * on top. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net_contract.h"

#include "../../../sim/net/tcpnet_wire.h"
#include "pf/fault.h"
#include "pf/util.h"

/* ---- open / NIC info ---- */

static void test_open_and_nic_info(void **st)
{
    struct pf_net *n = nc_open("tcp", (const char *[]){"127.0.0.2"});
    assert_int_equal(pf_net_nic_count(n), 1);
    struct pf_net_nic_info info;
    assert_int_equal(pf_net_nic_info(n, 0, &info), 0);
    assert_string_equal(info.name, "127.0.0.2");
    assert_string_equal(info.addr, "127.0.0.2");
    assert_int_equal(info.numa_node, -1);
    assert_true(info.active);
    assert_int_equal(pf_net_nic_info(n, 1, &info), -EINVAL);
    pf_net_close(n);

    /* an interface name: lo carries 127.0.0.1 */
    n = nc_open("tcp", (const char *[]){"lo"});
    assert_int_equal(pf_net_nic_info(n, 0, &info), 0);
    assert_string_equal(info.name, "lo");
    assert_string_equal(info.addr, "127.0.0.1");
    assert_true(info.numa_node >= -1);
    assert_true(info.active);
    pf_net_close(n);

    /* two NICs, one with a fixed port */
    struct pf_net_config cfg2 = {.nics = (const char *[]){"127.0.0.3", "127.0.0.4:0"}, .nnics = 2};
    assert_int_equal(pf_hal_net_open("tcp", &cfg2, &n, NULL, 0, NULL, 0), 0);
    assert_int_equal(pf_net_nic_count(n), 2);
    assert_int_equal(pf_net_nic_info(n, 1, &info), 0);
    assert_string_equal(info.addr, "127.0.0.4");
    pf_net_close(n);
}

static void test_open_errors(void **st)
{
    struct pf_net *n = NULL;
    char err[256];
    struct pf_net_config cfg = {.nics = (const char *[]){"pfnosuchif0"}, .nnics = 1};
    assert_int_equal(pf_hal_net_open("tcp", &cfg, &n, NULL, 0, err, sizeof(err)), -ENODEV);
    cfg.nics = (const char *[]){"127.0.0.1:99999"};
    assert_int_equal(pf_hal_net_open("tcp", &cfg, &n, NULL, 0, err, sizeof(err)), -EINVAL);
    cfg.nics = (const char *[]){"192.0.2.1"}; /* TEST-NET-1: not a local address */
    assert_int_equal(pf_hal_net_open("tcp", &cfg, &n, NULL, 0, err, sizeof(err)), -EADDRNOTAVAIL);
    cfg.nnics = 0;
    assert_int_equal(pf_hal_net_open("tcp", &cfg, &n, NULL, 0, err, sizeof(err)), -EINVAL);
    assert_null(n);
}

/* With no RDMA device on this machine, auto chooses the TCP fabric. */
static void test_auto_picks_tcp(void **st)
{
    struct pf_net *n = NULL;
    char chosen[64] = "", err[256] = "";
    struct pf_net_config cfg = {.nics = (const char *[]){"127.0.0.1"}, .nnics = 1};
    int rc = pf_hal_net_open("auto", &cfg, &n, chosen, sizeof(chosen), err, sizeof(err));
    assert_int_equal(rc, 0);
    if (strcmp(chosen, "tcp") != 0) {
        fprintf(stderr, "auto chose %s (an RDMA device exists here)\n", chosen);
        assert_string_equal(chosen, "verbs");
    }
    pf_net_close(n);
}

/* ---- a scripted peer speaking the wire format ---- */

struct fake_peer {
    int lfd, fd;
    uint16_t port;
    uint32_t ack_status;
    pthread_t thr;
};

static void *fake_accept(void *arg)
{
    struct fake_peer *f = arg;
    struct pollfd pfd = {.fd = f->lfd, .events = POLLIN};
    f->fd = -1;
    if (poll(&pfd, 1, NC_DEADLINE_MS) != 1)
        return NULL;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    uint8_t hello[TCPNET_HELLO_LEN], ack[TCPNET_ACK_LEN];
    if (recv(fd, hello, sizeof(hello), MSG_WAITALL) != (ssize_t)sizeof(hello) ||
        tcpnet_get32(hello) != TCPNET_HELLO_MAGIC) {
        close(fd);
        return NULL;
    }
    tcpnet_put32(ack, TCPNET_ACK_MAGIC);
    tcpnet_put32(ack + 4, f->ack_status);
    if (send(fd, ack, sizeof(ack), MSG_NOSIGNAL) != (ssize_t)sizeof(ack)) {
        close(fd);
        return NULL;
    }
    f->fd = fd;
    return NULL;
}

/* Listens on 127.0.0.1 and connects qp to it; the peer socket is f->fd afterwards. */
static int fake_connect(struct fake_peer *f, struct pf_net_qp *qp, uint32_t ack_status)
{
    memset(f, 0, sizeof(*f));
    f->ack_status = ack_status;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(f->lfd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f->lfd, 4), 0);
    socklen_t sl = sizeof(sa);
    getsockname(f->lfd, (struct sockaddr *)&sa, &sl);
    f->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&f->thr, NULL, fake_accept, f), 0);
    struct tcpnet_ep ep = {.ip = {127, 0, 0, 1}, .port = f->port, .token = 0x1234};
    uint8_t blob[TCPNET_EP_LEN];
    tcpnet_ep_encode(blob, &ep);
    int rc = pf_net_qp_connect(qp, blob, sizeof(blob));
    pthread_join(f->thr, NULL);
    return rc;
}

static void fake_close(struct fake_peer *f)
{
    if (f->fd >= 0)
        close(f->fd);
    close(f->lfd);
}

static void fake_read_req(struct fake_peer *f, uint64_t *seq_p, uint64_t *len_p)
{
    uint8_t r[TCPNET_READ_LEN];
    assert_int_equal(recv(f->fd, r, sizeof(r), MSG_WAITALL), sizeof(r));
    assert_int_equal(tcpnet_get32(r), TCPNET_READ_MAGIC);
    *seq_p = tcpnet_get64(r + 8);
    *len_p = tcpnet_get64(r + 24);
}

static void fake_send_hdr(struct fake_peer *f, uint32_t magic, uint32_t status, uint64_t seq,
                          uint64_t len)
{
    uint8_t h[TCPNET_RESP_LEN];
    tcpnet_put32(h, magic);
    tcpnet_put32(h + 4, status);
    tcpnet_put64(h + 8, seq);
    tcpnet_put64(h + 16, len);
    assert_int_equal(send(f->fd, h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
}

/* Waits (deadline-bounded) until the peer sees the connection closed. */
static void fake_wait_eof(struct fake_peer *f)
{
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    uint8_t buf[4096];
    for (;;) {
        assert_true(pf_now_ns() < deadline);
        struct pollfd pfd = {.fd = f->fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t n = recv(f->fd, buf, sizeof(buf), 0);
        if (n <= 0)
            return;
    }
}

struct fake_ctx {
    struct pf_net *net;
    struct pf_net_qp *qp;
    uint8_t *dst;
    struct pf_net_mr *mr;
    size_t len;
};

static void fake_ctx_open(struct fake_ctx *c, size_t len)
{
    c->net = nc_open("tcp", (const char *[]){"127.0.0.1"});
    c->len = len;
    c->dst = nc_map(len);
    memset(c->dst, NC_SENTINEL, len);
    assert_int_equal(pf_net_reg_mem(c->net, 0, c->dst, len, PF_NET_ACCESS_LOCAL_WRITE, &c->mr), 0);
    assert_int_equal(pf_net_qp_create(c->net, 0, &c->qp), 0);
}

static void fake_ctx_close(struct fake_ctx *c)
{
    pf_net_qp_destroy(c->qp);
    pf_net_dereg_mem(c->mr);
    pf_net_close(c->net);
    munmap(c->dst, c->len);
}

static int fake_post(struct fake_ctx *c, uint64_t off, uint64_t len, uint64_t wr_id)
{
    struct pf_net_sge s = {c->dst + off, len, c->mr->lkey};
    return pf_net_post_read(c->qp, &s, 1, 0x1000, 0x42, wr_id);
}

/* The receive thread is inside recvmsg for a half-delivered READ when qp_invalidate runs:
 * after it returns, the rest of the payload must not land. */
static void test_invalidate_mid_payload(void **st)
{
    const size_t len = 1u << 20;
    for (int iter = 0; iter < 4; iter++) {
        struct fake_ctx c;
        fake_ctx_open(&c, len);
        struct fake_peer f;
        assert_int_equal(fake_connect(&f, c.qp, TCPNET_ST_OK), 0);
        assert_int_equal(fake_post(&c, 0, len, 11), 0);
        assert_int_equal(fake_post(&c, 0, len, 12), 0);
        uint64_t seq, rlen;
        fake_read_req(&f, &seq, &rlen);
        assert_int_equal(rlen, len);
        fake_send_hdr(&f, TCPNET_RESP_MAGIC, TCPNET_ST_OK, seq, len);
        uint8_t *payload = malloc(len);
        memset(payload, 0x3c, len);
        size_t half = len / 2 + (size_t)iter * 777;
        assert_int_equal(send(f.fd, payload, half, MSG_NOSIGNAL), (ssize_t)half);
        pf_net_qp_invalidate(c.qp);
        memset(c.dst, NC_SENTINEL, len);
        /* the rest of this READ and all of the next: none of it may land */
        (void)!send(f.fd, payload + half, len - half, MSG_NOSIGNAL | MSG_DONTWAIT);
        fake_wait_eof(&f);
        assert_true(nc_all_equal(c.dst, len, NC_SENTINEL));
        struct pf_net_cqe cq[2];
        nc_wait(c.qp, cq, 2);
        assert_int_equal(cq[0].wr_id, 11);
        assert_int_equal(cq[0].status, -ECANCELED);
        assert_int_equal(cq[1].wr_id, 12);
        assert_int_equal(cq[1].status, -ECANCELED);
        assert_int_equal(pf_net_poll(c.qp, cq, 2, 10), -ENOTCONN);
        free(payload);
        fake_close(&f);
        fake_ctx_close(&c);
    }
}

/* A peer that closes mid-payload: the READ fails, the next is flushed, poll does not hang. */
static void test_peer_dies_mid_payload(void **st)
{
    struct fake_ctx c;
    fake_ctx_open(&c, 65536);
    struct fake_peer f;
    assert_int_equal(fake_connect(&f, c.qp, TCPNET_ST_OK), 0);
    assert_int_equal(fake_post(&c, 0, 65536, 1), 0);
    assert_int_equal(fake_post(&c, 0, 4096, 2), 0);
    uint64_t seq, rlen;
    fake_read_req(&f, &seq, &rlen);
    fake_send_hdr(&f, TCPNET_RESP_MAGIC, TCPNET_ST_OK, seq, rlen);
    uint8_t junk[1000] = {0};
    assert_int_equal(send(f.fd, junk, sizeof(junk), MSG_NOSIGNAL), sizeof(junk));
    close(f.fd);
    f.fd = -1;
    struct pf_net_cqe cq[2];
    nc_wait(c.qp, cq, 2);
    assert_int_equal(cq[0].wr_id, 1);
    assert_int_equal(cq[0].status, -ECONNRESET);
    assert_int_equal(cq[1].status, -ECANCELED);
    assert_int_equal(fake_post(&c, 0, 8, 3), -ENOTCONN);
    assert_int_equal(pf_net_poll(c.qp, cq, 2, 10), -ENOTCONN);
    fake_close(&f);
    fake_ctx_close(&c);
}

/* Malformed responses are detected (-EPROTO), never written to memory. */
static void test_corrupt_stream(void **st)
{
    for (int kind = 0; kind < 4; kind++) {
        struct fake_ctx c;
        fake_ctx_open(&c, 65536);
        struct fake_peer f;
        assert_int_equal(fake_connect(&f, c.qp, TCPNET_ST_OK), 0);
        assert_int_equal(fake_post(&c, 0, 4096, 1), 0);
        uint64_t seq, rlen;
        fake_read_req(&f, &seq, &rlen);
        switch (kind) {
        case 0: /* bad magic */
            fake_send_hdr(&f, 0xdeadbeef, 0, seq, rlen);
            break;
        case 1: /* wrong sequence number */
            fake_send_hdr(&f, TCPNET_RESP_MAGIC, 0, seq + 1, rlen);
            break;
        case 2: /* longer than asked */
            fake_send_hdr(&f, TCPNET_RESP_MAGIC, 0, seq, rlen + 1);
            break;
        case 3: /* unknown status */
            fake_send_hdr(&f, TCPNET_RESP_MAGIC, 99, seq, 0);
            break;
        }
        uint8_t payload[4097];
        memset(payload, 0x11, sizeof(payload));
        (void)!send(f.fd, payload, sizeof(payload), MSG_NOSIGNAL | MSG_DONTWAIT);
        struct pf_net_cqe cq;
        nc_wait(c.qp, &cq, 1);
        assert_int_equal(cq.status, -EPROTO);
        fake_wait_eof(&f); /* the fabric dropped the connection */
        assert_true(nc_all_equal(c.dst, 65536, NC_SENTINEL));
        fake_close(&f);
        fake_ctx_close(&c);
    }
}

static void test_connect_refused(void **st)
{
    struct fake_ctx c;
    fake_ctx_open(&c, 4096);
    struct fake_peer f;
    assert_int_equal(fake_connect(&f, c.qp, TCPNET_ST_NOQP), -ECONNREFUSED);
    fake_close(&f);
    /* the QP can still be connected after a failed attempt */
    assert_int_equal(fake_connect(&f, c.qp, TCPNET_ST_OK), 0);
    fake_close(&f);
    pf_net_qp_destroy(c.qp);
    /* nothing listening */
    assert_int_equal(pf_net_qp_create(c.net, 0, &c.qp), 0);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    socklen_t sl = sizeof(sa);
    getsockname(s, (struct sockaddr *)&sa, &sl);
    close(s); /* port now closed */
    struct tcpnet_ep ep = {.ip = {127, 0, 0, 1}, .port = ntohs(sa.sin_port), .token = 1};
    uint8_t blob[TCPNET_EP_LEN];
    tcpnet_ep_encode(blob, &ep);
    assert_int_equal(pf_net_qp_connect(c.qp, blob, sizeof(blob)), -ECONNREFUSED);
    fake_ctx_close(&c);
}

/* A real fabric refuses a HELLO for a QP token it does not have, and one from a requester
 * other than the QP's peer. */
static void test_hello_checks(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    uint8_t ea[PF_NET_EP_MAX];
    size_t la;
    assert_int_equal(pf_net_qp_local_endpoint(p.qa, ea, sizeof(ea), &la), 0);
    struct tcpnet_ep ep = {0};
    assert_int_equal(tcpnet_ep_decode(ea, la, &ep), 0);
    /* a third QP trying to pair with qa (already paired with qb) */
    struct pf_net_qp *q3;
    assert_int_equal(pf_net_qp_create(p.b.net, 0, &q3), 0);
    assert_int_equal(pf_net_qp_connect(q3, ea, la), -ECONNREFUSED);
    pf_net_qp_destroy(q3);
    /* unknown token */
    ep.token ^= 1;
    uint8_t blob[TCPNET_EP_LEN];
    tcpnet_ep_encode(blob, &ep);
    assert_int_equal(pf_net_qp_create(p.b.net, 0, &q3), 0);
    assert_int_equal(pf_net_qp_connect(q3, blob, sizeof(blob)), -ECONNREFUSED);
    pf_net_qp_destroy(q3);
    nc_pair_close(&p);
}

/* A requester that stops reading: the serving thread waits in place for its full socket at
 * most PEGAFLOW_TCPNET_SEND_WAIT_US a wake, then re-arms it in epoll and serves the others
 * (one serving thread here: a wait without that bound would starve the second QP's READ);
 * the stalled response, drained afterwards, arrives whole and byte-exact. */
static void test_stalled_reader_does_not_hold_the_server(void **st)
{
    setenv("PEGAFLOW_TCPNET_THREADS", "1", 1);
    setenv("PEGAFLOW_TCPNET_SEND_WAIT_US", "20000", 1);
    setenv("PEGAFLOW_TCPNET_SOCKBUF", "65536", 1);
    struct nc_pair p;
    nc_pair_open(&p);
    unsetenv("PEGAFLOW_TCPNET_THREADS");
    unsetenv("PEGAFLOW_TCPNET_SEND_WAIT_US");
    unsetenv("PEGAFLOW_TCPNET_SOCKBUF");
    /* a scripted requester paired with a fresh QP of A */
    struct pf_net_qp *qx;
    assert_int_equal(pf_net_qp_create(p.a.net, 0, &qx), 0);
    uint8_t ex[PF_NET_EP_MAX];
    size_t lx;
    assert_int_equal(pf_net_qp_local_endpoint(qx, ex, sizeof(ex), &lx), 0);
    struct tcpnet_ep ep = {0};
    assert_int_equal(tcpnet_ep_decode(ex, lx, &ep), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(ep.port)};
    memcpy(&sa.sin_addr, ep.ip, 4);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    uint8_t hello[TCPNET_HELLO_LEN], ack[TCPNET_ACK_LEN], req[TCPNET_READ_LEN];
    tcpnet_put32(hello, TCPNET_HELLO_MAGIC);
    tcpnet_put32(hello + 4, TCPNET_VERSION);
    tcpnet_put64(hello + 8, ep.token);
    tcpnet_put64(hello + 16, 0x77);
    assert_int_equal(send(fd, hello, sizeof(hello), MSG_NOSIGNAL), sizeof(hello));
    assert_int_equal(recv(fd, ack, sizeof(ack), MSG_WAITALL), sizeof(ack));
    assert_int_equal(tcpnet_get32(ack + 4), TCPNET_ST_OK);
    const uint64_t big = 8u << 20, off = 4096 + 3;
    tcpnet_put32(req, TCPNET_READ_MAGIC);
    tcpnet_put32(req + 4, p.src_mr->rkey);
    tcpnet_put64(req + 8, 5);
    tcpnet_put64(req + 16, nc_raddr(&p, off));
    tcpnet_put64(req + 24, big);
    assert_int_equal(send(fd, req, sizeof(req), MSG_NOSIGNAL), sizeof(req));
    /* nothing read from fd: A's only serving thread finds its socket full; the pair's READ
     * must still be served */
    const uint64_t len = 1u << 20, roff = (8u << 20) + 17;
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, roff), p.src_mr->rkey, len, 9), 0);
    struct pf_net_cqe c;
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.wr_id, 9);
    assert_memory_equal(p.dst, p.src + roff, len);
    /* now drain the stalled response */
    uint8_t h[TCPNET_RESP_LEN];
    assert_int_equal(recv(fd, h, sizeof(h), MSG_WAITALL), sizeof(h));
    assert_int_equal(tcpnet_get32(h), TCPNET_RESP_MAGIC);
    assert_int_equal(tcpnet_get32(h + 4), TCPNET_ST_OK);
    assert_int_equal(tcpnet_get64(h + 8), 5);
    assert_int_equal(tcpnet_get64(h + 16), big);
    uint8_t *got = malloc(big);
    assert_non_null(got);
    assert_int_equal(recv(fd, got, big, MSG_WAITALL), (ssize_t)big);
    assert_memory_equal(got, p.src + off, big);
    free(got);
    close(fd);
    pf_net_qp_destroy(qx);
    nc_pair_close(&p);
}

/* Deregistering a local region with READs in flight into it fences them first. */
static void test_dereg_local_inflight(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    uint8_t *buf = nc_map(NC_SRC_LEN);
    struct pf_net_mr *mr;
    assert_int_equal(pf_net_reg_mem(p.b.net, 0, buf, NC_SRC_LEN, PF_NET_ACCESS_LOCAL_WRITE, &mr),
                     0);
    const uint64_t blk = 2u << 20;
    for (uint64_t i = 0; i < NC_SRC_LEN / blk; i++) {
        struct pf_net_sge s = {buf + i * blk, blk, mr->lkey};
        assert_int_equal(pf_net_post_read(p.qb, &s, 1, nc_raddr(&p, i * blk), p.src_mr->rkey, i),
                         0);
    }
    pf_net_dereg_mem(mr);
    memset(buf, NC_SENTINEL, NC_SRC_LEN);
    struct pf_net_cqe c[16];
    nc_wait(p.qb, c, NC_SRC_LEN / blk);
    for (size_t i = 0; i < NC_SRC_LEN / blk; i++)
        assert_true(c[i].status == 0 || c[i].status == -ECANCELED);
    /* barrier through the same server, then nothing may have landed */
    nc_pair_reconnect(&p);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, NC_DST_LEN, 1), 0);
    nc_wait(p.qb, c, 1);
    assert_int_equal(c[0].status, 0);
    assert_true(nc_all_equal(buf, NC_SRC_LEN, NC_SENTINEL));
    munmap(buf, NC_SRC_LEN);
    nc_pair_close(&p);
}

/* The holder's fabric closes with READs outstanding: errors, not hangs. */
static void test_peer_fabric_closed(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    for (int i = 0; i < 8; i++)
        assert_int_equal(nc_read1(&p, (uint64_t)i * (2u << 20), nc_raddr(&p, 0), p.src_mr->rkey,
                                  2u << 20, (uint64_t)i),
                         0);
    pf_net_close(p.a.net); /* with its QP and region still open, as in a crash */
    p.a.net = NULL;
    p.qa = NULL;
    p.src_mr = NULL;
    int done = 0;
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    struct pf_net_cqe c[8];
    for (;;) {
        assert_true(pf_now_ns() < deadline);
        int r = pf_net_poll(p.qb, c, 8, 100);
        if (r < 0)
            break;
        done += r;
    }
    assert_int_equal(done, 8);
    nc_pair_close(&p);
}

/* A holder process killed with SIGKILL mid-transfer. */
static void test_peer_process_killed(void **st)
{
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    const size_t len = 64u << 20;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        struct pf_net *n = NULL;
        struct pf_net_config cfg = {.nics = (const char *[]){"127.0.0.1"}, .nnics = 1};
        if (pf_hal_net_open("tcp", &cfg, &n, NULL, 0, NULL, 0))
            _exit(2);
        uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memset(buf, 0x5e, len);
        struct pf_net_mr *mr;
        struct pf_net_qp *q;
        uint8_t ep[PF_NET_EP_MAX], peer[PF_NET_EP_MAX];
        size_t el = 0;
        if (pf_net_reg_mem(n, 0, buf, len, PF_NET_ACCESS_REMOTE_READ, &mr) ||
            pf_net_qp_create(n, 0, &q) || pf_net_qp_local_endpoint(q, ep, sizeof(ep), &el))
            _exit(3);
        uint64_t hdr[3] = {(uint64_t)(uintptr_t)buf, mr->rkey, el};
        if (write(up[1], hdr, sizeof(hdr)) != sizeof(hdr) || write(up[1], ep, el) != (ssize_t)el)
            _exit(4);
        uint64_t pl;
        if (read(down[0], &pl, sizeof(pl)) != sizeof(pl) ||
            read(down[0], peer, pl) != (ssize_t)pl || pf_net_qp_connect(q, peer, pl))
            _exit(5);
        if (write(up[1], "k", 1) != 1)
            _exit(6);
        for (;;)
            pause(); /* serve until killed */
    }
    close(up[1]);
    close(down[0]);
    struct pf_net *n = nc_open("tcp", (const char *[]){"127.0.0.2"});
    uint8_t *dst = nc_map(len);
    struct pf_net_mr *mr;
    struct pf_net_qp *q;
    assert_int_equal(pf_net_reg_mem(n, 0, dst, len, PF_NET_ACCESS_LOCAL_WRITE, &mr), 0);
    assert_int_equal(pf_net_qp_create(n, 0, &q), 0);
    uint64_t hdr[3];
    uint8_t ep[PF_NET_EP_MAX], mine[PF_NET_EP_MAX];
    assert_int_equal(read(up[0], hdr, sizeof(hdr)), sizeof(hdr));
    assert_int_equal(read(up[0], ep, hdr[2]), (ssize_t)hdr[2]);
    size_t ml;
    assert_int_equal(pf_net_qp_local_endpoint(q, mine, sizeof(mine), &ml), 0);
    uint64_t ml64 = ml;
    assert_int_equal(write(down[1], &ml64, sizeof(ml64)), sizeof(ml64));
    assert_int_equal(write(down[1], mine, ml), (ssize_t)ml);
    char k;
    assert_int_equal(read(up[0], &k, 1), 1);
    assert_int_equal(pf_net_qp_connect(q, ep, hdr[2]), 0);
    /* one READ completes ... */
    struct pf_net_sge s = {dst, 4096, mr->lkey};
    assert_int_equal(pf_net_post_read(q, &s, 1, hdr[0], (uint32_t)hdr[1], 1), 0);
    struct pf_net_cqe c[16];
    nc_wait(q, c, 1);
    assert_int_equal(c[0].status, 0);
    assert_true(nc_all_equal(dst, 4096, 0x5e));
    /* ... then the holder dies under a pipeline of large READs */
    const uint64_t blk = 4u << 20;
    for (uint64_t i = 0; i < 16; i++) {
        s = (struct pf_net_sge){dst + i * blk, blk, mr->lkey};
        assert_int_equal(pf_net_post_read(q, &s, 1, hdr[0] + i * blk, (uint32_t)hdr[1], i), 0);
    }
    kill(pid, SIGKILL);
    int wst;
    waitpid(pid, &wst, 0);
    int done = 0, errors = 0;
    uint64_t deadline = pf_now_ns() + NC_DEADLINE_MS * PF_NS_PER_MS;
    for (;;) {
        assert_true(pf_now_ns() < deadline);
        int r = pf_net_poll(q, c, 16, 100);
        if (r < 0)
            break;
        for (int i = 0; i < r; i++)
            errors += c[i].status != 0;
        done += r;
    }
    assert_int_equal(done, 16);
    fprintf(stderr, "holder killed: %d of 16 READs failed\n", errors);
    pf_net_qp_destroy(q);
    pf_net_dereg_mem(mr);
    pf_net_close(n);
    munmap(dst, len);
    close(up[0]);
    close(down[1]);
}

/* ---- receive-path digests (post_read_digest) ---- */

/* One READ of 1 MiB + 4 KiB over two SGEs, split into a 100-byte range, a skipped 50-byte
 * range, a 600 KiB range that crosses the SGE boundary and the receive pieces, and a tail
 * past the last range: each digest is xxh3 of those source bytes, every byte lands. */
static void test_digest_ranges(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    const uint64_t off = 12345, len = (1ull << 20) + 4096, cut = 700ull << 10;
    struct pf_net_sge sge[2] = {{p.dst, cut, p.dst_mr->lkey},
                                {p.dst + (2ull << 20), len - cut, p.dst_mr->lkey}};
    uint32_t lens[3] = {100, 50 | PF_NET_DIGEST_SKIP, 600u << 10};
    uint64_t out[3] = {0, 0x5555, 0};
    struct pf_net_digest d = {3, lens, out};
    assert_int_equal(
        pf_net_post_read_digest(p.qb, sge, 2, nc_raddr(&p, off), p.src_mr->rkey, 7, &d), 0);
    struct pf_net_cqe c;
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.bytes, len);
    assert_int_equal(c.digested, 1);
    assert_true(out[0] == pf_checksum2(p.src + off, 100, NULL, 0));
    assert_true(out[1] == 0x5555u); /* skipped: not written */
    assert_true(out[2] == pf_checksum2(p.src + off + 150, 600u << 10, NULL, 0));
    assert_memory_equal(p.dst, p.src + off, cut);
    assert_memory_equal(p.dst + (2ull << 20), p.src + off + cut, len - cut);
    /* a plain READ says it was not digested */
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 8), 0);
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_int_equal(c.digested, 0);
    nc_pair_close(&p);
}

/* Digest requests the READ cannot satisfy are refused at post, and nothing is queued. */
static void test_digest_bad_requests(void **st)
{
    struct nc_pair p;
    nc_pair_open(&p);
    struct pf_net_sge s = {p.dst, 4096, p.dst_mr->lkey};
    uint64_t out[2];
    uint32_t past[2] = {4000, 97}, zero[1] = {0}, skipzero[1] = {PF_NET_DIGEST_SKIP};
    const struct pf_net_digest bad[] = {
        {2, past, out}, {1, zero, out}, {1, skipzero, out}, {0, past, out}, {1, past, NULL}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(
            pf_net_post_read_digest(p.qb, &s, 1, nc_raddr(&p, 0), p.src_mr->rkey, i, &bad[i]),
            -EINVAL);
    struct pf_net_cqe c;
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 50), 0);
    nc_pair_close(&p);
}

/* ---- faulty:tcp ---- */

static struct pf_fault_plan *plan_of(const char *spec)
{
    struct pf_fault_plan *plan = NULL;
    char err[256];
    int rc = pf_fault_plan_parse(spec, &plan, err, sizeof(err));
    if (rc)
        fprintf(stderr, "fault spec '%s': %s\n", spec, err);
    assert_int_equal(rc, 0);
    return plan;
}

/* Pair whose reading side (B) is faulty:tcp with the given plan. */
static void faulty_pair_open(struct nc_pair *p, struct pf_fault_plan *plan)
{
    memset(p, 0, sizeof(*p));
    p->a.net = nc_open("tcp", nc_nics_a);
    struct pf_net *inner = nc_open("tcp", nc_nics_b);
    assert_int_equal(pf_fault_net_wrap(inner, plan, &p->b.net), 0);
    p->src = nc_map(NC_SRC_LEN);
    p->dst = nc_map(NC_DST_LEN);
    nc_fill_random(p->src, NC_SRC_LEN);
    memset(p->dst, NC_SENTINEL, NC_DST_LEN);
    assert_int_equal(
        pf_net_reg_mem(p->a.net, 0, p->src, NC_SRC_LEN, PF_NET_ACCESS_REMOTE_READ, &p->src_mr), 0);
    assert_int_equal(
        pf_net_reg_mem(p->b.net, 0, p->dst, NC_DST_LEN, PF_NET_ACCESS_LOCAL_WRITE, &p->dst_mr), 0);
    nc_connect(p->a.net, p->b.net, &p->qa, &p->qb);
}

static void test_faulty_drop(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=1;net.read:drop=1,times=1");
    struct nc_pair p;
    faulty_pair_open(&p, plan);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 1), 0);
    struct pf_net_cqe c;
    /* never completes: the requester's deadline fires */
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 200), 0);
    assert_true(nc_all_equal(p.dst, 4096, NC_SENTINEL));
    pf_net_qp_invalidate(p.qb); /* flushes the dropped READ like any outstanding one */
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.wr_id, 1);
    assert_int_equal(c.status, -ECANCELED);
    nc_wait_broken(p.qb);
    assert_true(pf_fault_fired(plan) >= 1);
    nc_pair_close(&p);
    pf_fault_plan_free(plan);
}

static void test_faulty_corrupt(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=2;net.read:corrupt=1,times=1");
    struct nc_pair p;
    faulty_pair_open(&p, plan);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 65536, 1), 0);
    assert_int_equal(nc_read1(&p, 65536, nc_raddr(&p, 65536), p.src_mr->rkey, 65536, 2), 0);
    struct pf_net_cqe c[2];
    nc_wait(p.qb, c, 2);
    assert_int_equal(c[0].status, 0);
    assert_int_equal(c[1].status, 0);
    assert_true(memcmp(p.dst, p.src, 65536) != 0);            /* corrupted */
    assert_memory_equal(p.dst + 65536, p.src + 65536, 65536); /* times=1: intact */
    nc_pair_close(&p);
    pf_fault_plan_free(plan);
}

static void test_faulty_error_at_completion(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=3;net.read:error=EIO,at=complete,times=1");
    struct nc_pair p;
    faulty_pair_open(&p, plan);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 65536, 1), 0);
    struct pf_net_cqe c;
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.wr_id, 1);
    assert_int_equal(c.status, -EIO);
    assert_true(nc_all_equal(p.dst, 65536, NC_SENTINEL));
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 65536, 2), 0);
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_memory_equal(p.dst, p.src, 65536);
    nc_pair_close(&p);
    pf_fault_plan_free(plan);
}

static void test_faulty_error_at_post(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=4;net.read:error=ENOMEM,times=1");
    struct nc_pair p;
    faulty_pair_open(&p, plan);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 1), -ENOMEM);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 2), 0);
    struct pf_net_cqe c;
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.wr_id, 2);
    assert_int_equal(c.status, 0);
    nc_pair_close(&p);
    pf_fault_plan_free(plan);
}

static void test_faulty_delay_then_invalidate(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=6;net.read:delay=60000,times=1");
    struct nc_pair p;
    faulty_pair_open(&p, plan);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 65536, 1), 0);
    struct pf_net_cqe c;
    /* the READ is done underneath but its completion is held back */
    assert_int_equal(pf_net_poll(p.qb, &c, 1, 100), 0);
    pf_net_qp_invalidate(p.qb);
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.wr_id, 1);
    assert_int_equal(c.status, -ECANCELED);
    nc_pair_close(&p);
    pf_fault_plan_free(plan);
}

static void test_faulty_fatal(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=7;net.read:fatal=1,nth=2");
    struct nc_pair p;
    faulty_pair_open(&p, plan);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 1), 0);
    struct pf_net_cqe c;
    nc_wait(p.qb, &c, 1);
    assert_int_equal(c.status, 0);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 2), -EIO);
    assert_int_equal(nc_read1(&p, 0, nc_raddr(&p, 0), p.src_mr->rkey, 4096, 3), -EIO);
    nc_pair_close(&p);
    pf_fault_plan_free(plan);
}

/* The decorator stacked by name, as the server does with --fault-spec. */
static void test_faulty_by_name(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=5;net.connect:error=ECONNREFUSED,times=1");
    struct pf_net_config cfg = {.nics = nc_nics_b, .nnics = 1, .faults = plan};
    struct pf_net *n = NULL;
    char chosen[64];
    assert_int_equal(pf_hal_net_open("faulty:tcp", &cfg, &n, chosen, sizeof(chosen), NULL, 0), 0);
    assert_string_equal(chosen, "faulty:tcp");
    struct pf_net *a = nc_open("tcp", nc_nics_a);
    struct pf_net_qp *qa, *qb;
    assert_int_equal(pf_net_qp_create(a, 0, &qa), 0);
    assert_int_equal(pf_net_qp_create(n, 0, &qb), 0);
    uint8_t ea[PF_NET_EP_MAX];
    size_t la;
    assert_int_equal(pf_net_qp_local_endpoint(qa, ea, sizeof(ea), &la), 0);
    assert_int_equal(pf_net_qp_connect(qb, ea, la), -ECONNREFUSED);
    assert_int_equal(pf_net_qp_connect(qb, ea, la), 0);
    pf_net_qp_destroy(qb);
    pf_net_qp_destroy(qa);
    pf_net_close(a);
    pf_net_close(n);
    pf_fault_plan_free(plan);
}

/* faulty:tcp corrupting a digested READ: the digest is of the bytes as they landed, so it
 * no longer matches the source (the receiver sees the damage), and a held (delayed)
 * completion keeps its digested flag. */
static void test_faulty_digest_corrupt_and_delay(void **st)
{
    struct pf_fault_plan *plan = plan_of("seed=3;net.read:corrupt=1,times=1;net.read:delay=50");
    struct nc_pair p;
    faulty_pair_open(&p, plan);
    uint32_t lens[1] = {65536};
    uint64_t out[2][1];
    struct pf_net_digest d0 = {1, lens, out[0]}, d1 = {1, lens, out[1]};
    for (int k = 0; k < 2; k++) {
        struct pf_net_sge s = {p.dst + 65536 * (uint64_t)k, 65536, p.dst_mr->lkey};
        assert_int_equal(pf_net_post_read_digest(p.qb, &s, 1, nc_raddr(&p, 65536 * (uint64_t)k),
                                                 p.src_mr->rkey, (uint64_t)k, k ? &d1 : &d0),
                         0);
    }
    struct pf_net_cqe c[2];
    nc_wait(p.qb, c, 2);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(c[k].status, 0);
        assert_int_equal(c[k].digested, 1);
    }
    assert_true(memcmp(p.dst, p.src, 65536) != 0);                 /* corrupted ... */
    assert_true(out[0][0] == pf_checksum2(p.dst, 65536, NULL, 0)); /* ... and so its digest */
    assert_true(out[0][0] != pf_checksum2(p.src, 65536, NULL, 0));
    assert_memory_equal(p.dst + 65536, p.src + 65536, 65536); /* delayed, intact */
    assert_true(out[1][0] == pf_checksum2(p.src + 65536, 65536, NULL, 0));
    nc_pair_close(&p);
    pf_fault_plan_free(plan);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    nc_backend = "tcp";
    nc_seed_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_and_nic_info),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_auto_picks_tcp),
        NC_CONTRACT_TESTS,
        cmocka_unit_test(test_invalidate_mid_payload),
        cmocka_unit_test(test_peer_dies_mid_payload),
        cmocka_unit_test(test_corrupt_stream),
        cmocka_unit_test(test_connect_refused),
        cmocka_unit_test(test_hello_checks),
        cmocka_unit_test(test_stalled_reader_does_not_hold_the_server),
        cmocka_unit_test(test_dereg_local_inflight),
        cmocka_unit_test(test_peer_fabric_closed),
        cmocka_unit_test(test_peer_process_killed),
        cmocka_unit_test(test_faulty_drop),
        cmocka_unit_test(test_faulty_corrupt),
        cmocka_unit_test(test_faulty_error_at_completion),
        cmocka_unit_test(test_faulty_error_at_post),
        cmocka_unit_test(test_faulty_delay_then_invalidate),
        cmocka_unit_test(test_faulty_fatal),
        cmocka_unit_test(test_faulty_by_name),
        cmocka_unit_test(test_digest_ranges),
        cmocka_unit_test(test_digest_bad_requests),
        cmocka_unit_test(test_faulty_digest_corrupt_and_delay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Fuzz target: the TCP fabric's serving side (sim/net/tcpnet_serve.c), i.e. the frames a remote
 * peer sends to a NIC: HELLO, then READ requests, over a real loopback connection to a
 * "tcp" NIC on 127.0.0.1 with one QP and two 4 KiB regions (one remote-readable, one
 * registered without remote read).
 *
 * Input: byte 0 flags, the rest is sent as is after these patches (so the fuzzer gets past
 * the 64-bit QP token and random rkeys): bit 0: a HELLO's target token becomes the QP's;
 * bit 1: each READ's raddr becomes region + (raddr % 8192) (in and out of bounds); bit 2:
 * each READ's rkey becomes the readable region's, bit 3 (instead) the other region's.
 * Expected answers are computed from the wire format (tcpnet_wire.h): no HELLO magic = the
 * connection closes; a refused HELLO = one error ACK; otherwise an OK ACK and, for every
 * complete READ frame, one response in order with the request's seq: data exactly the
 * region's bytes when rkey, access and bounds allow, else status RKEY / ACCESS / BOUNDS with
 * no data. A frame with a bad magic drops the connection when the NIC parses it, so then
 * the answers may stop early (but those sent are still checked). Anything else (missing,
 * extra or wrong bytes) is a failure. ASan checks that no byte outside a region is ever sent. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../sim/net/tcpnet_wire.h"
#include "fuzz.h"
#include "pf/hal.h"
#include "pf/hal_net.h"
#include "pf/log.h"

#define RLEN 4096

static struct pf_net *net;
static struct pf_net_qp *qp;
static struct pf_net_mr *mr, *mr_noread;
static uint8_t *region, *region2;
static struct tcpnet_ep ep;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char chosen[64], err[256];
    pf_log_set_level(PF_LOG_ERROR);
    pf_hal_init();
    struct pf_net_config cfg = {.nics = (const char *[]){"127.0.0.1"}, .nnics = 1};
    if (pf_hal_net_open("tcp", &cfg, &net, chosen, sizeof(chosen), err, sizeof(err)) != 0)
        fz_fail("tcp fabric: %s", err);
    region = malloc(RLEN); /* heap: ASan redzones around the served memory */
    region2 = malloc(RLEN);
    if (!region || !region2)
        fz_fail("out of memory");
    for (size_t i = 0; i < RLEN; i++) {
        region[i] = (uint8_t)(i * 7 + 1);
        region2[i] = 0xee;
    }
    if (pf_net_reg_mem(net, 0, region, RLEN, PF_NET_ACCESS_REMOTE_READ, &mr) != 0 ||
        pf_net_reg_mem(net, 0, region2, RLEN, PF_NET_ACCESS_LOCAL_WRITE, &mr_noread) != 0)
        fz_fail("reg_mem");
    if (pf_net_qp_create(net, 0, &qp) != 0)
        fz_fail("qp_create");
    uint8_t blob[PF_NET_EP_MAX];
    size_t len;
    if (pf_net_qp_local_endpoint(qp, blob, sizeof(blob), &len) != 0 ||
        tcpnet_ep_decode(blob, len, &ep) != 0)
        fz_fail("local endpoint");
    return 0;
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        fz_fail("socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ep.port)};
    memcpy(&a.sin_addr, ep.ip, 4);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        fz_fail("connect to the NIC: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct linger lg = {1, 0}; /* close with RST: no TIME_WAIT per input */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    return fd;
}

/* Reads exactly len bytes: 1, or 0 when the connection ended first (EOF or reset). A hang
 * is caught by libFuzzer's -timeout. */
static int read_full(int fd, uint8_t *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, buf + got, len - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        got += (size_t)n;
    }
    return 1;
}

static void expect_eof(int fd)
{
    uint8_t b;
    ssize_t n = recv(fd, &b, 1, 0);
    if (n > 0)
        fz_fail("the NIC sent bytes after its last expected answer");
}

static uint32_t expected_status(uint32_t rkey, uint64_t raddr, uint64_t len)
{
    uint64_t end;
    uint8_t *base;
    if (rkey == mr->rkey)
        base = region;
    else if (rkey == mr_noread->rkey)
        return TCPNET_ST_ACCESS;
    else
        return TCPNET_ST_RKEY;
    if (len == 0 || len > TCPNET_MAX_READ || __builtin_add_overflow(raddr, len, &end) ||
        raddr < (uint64_t)(uintptr_t)base || end > (uint64_t)(uintptr_t)base + RLEN)
        return TCPNET_ST_BOUNDS;
    return TCPNET_ST_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, n);
    bool hello = n >= TCPNET_HELLO_LEN && tcpnet_get32(buf) == TCPNET_HELLO_MAGIC;
    if (hello && (flags & 1))
        tcpnet_put64(buf + 8, ep.token);
    for (size_t off = TCPNET_HELLO_LEN; hello && off + TCPNET_READ_LEN <= n;
         off += TCPNET_READ_LEN) {
        if (flags & 2)
            tcpnet_put64(buf + off + 16,
                         (uint64_t)(uintptr_t)region + tcpnet_get64(buf + off + 16) % (2 * RLEN));
        if (flags & 4)
            tcpnet_put32(buf + off + 4, mr->rkey);
        else if (flags & 8)
            tcpnet_put32(buf + off + 4, mr_noread->rkey);
    }
    /* a complete frame with a bad magic after the HELLO: the NIC drops the connection as
     * soon as it parses it, possibly before answering anything before it */
    bool corrupt = false;
    for (size_t off = TCPNET_HELLO_LEN; hello && off + TCPNET_READ_LEN <= n; off += TCPNET_READ_LEN)
        if (tcpnet_get32(buf + off) != TCPNET_READ_MAGIC)
            corrupt = true;
    int fd = dial();
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = send(fd, buf + sent, n - sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            break; /* the NIC already closed (a bad HELLO) */
        sent += (size_t)w;
    }
    if (!hello) {
        if (n >= TCPNET_HELLO_LEN)
            expect_eof(fd); /* bad magic: closed without an answer */
        close(fd);
        free(buf);
        return 0;
    }
    uint8_t ack[TCPNET_ACK_LEN];
    if (!read_full(fd, ack, sizeof(ack))) {
        if (!corrupt)
            fz_fail("no HELLO_ACK");
        close(fd);
        free(buf);
        return 0;
    }
    uint32_t want_ack = tcpnet_get32(buf + 4) != TCPNET_VERSION ? TCPNET_ST_VERSION
                        : tcpnet_get64(buf + 8) != ep.token     ? TCPNET_ST_NOQP
                                                                : TCPNET_ST_OK;
    if (tcpnet_get32(ack) != TCPNET_ACK_MAGIC || tcpnet_get32(ack + 4) != want_ack)
        fz_fail("HELLO_ACK status %u, expected %u", tcpnet_get32(ack + 4), want_ack);
    if (want_ack != TCPNET_ST_OK) {
        expect_eof(fd);
        close(fd);
        free(buf);
        return 0;
    }
    uint8_t *payload = malloc(RLEN);
    if (!payload)
        fz_fail("out of memory");
    for (size_t off = TCPNET_HELLO_LEN; off + TCPNET_READ_LEN <= n; off += TCPNET_READ_LEN) {
        const uint8_t *rq = buf + off;
        if (tcpnet_get32(rq) != TCPNET_READ_MAGIC)
            break; /* corrupt stream: the NIC drops the connection */
        uint32_t rkey = tcpnet_get32(rq + 4);
        uint64_t seq = tcpnet_get64(rq + 8), raddr = tcpnet_get64(rq + 16);
        uint64_t len = tcpnet_get64(rq + 24);
        uint8_t h[TCPNET_RESP_LEN];
        if (!read_full(fd, h, sizeof(h))) {
            if (corrupt)
                break;
            fz_fail("READ at offset %zu (seq %llu) got no response", off, (unsigned long long)seq);
        }
        uint32_t st = tcpnet_get32(h + 4), want = expected_status(rkey, raddr, len);
        if (tcpnet_get32(h) != TCPNET_RESP_MAGIC || tcpnet_get64(h + 8) != seq || st != want)
            fz_fail("READ seq %llu: response seq %llu status %u, expected status %u",
                    (unsigned long long)seq, (unsigned long long)tcpnet_get64(h + 8), st, want);
        uint64_t rlen = tcpnet_get64(h + 16);
        if (st != TCPNET_ST_OK) {
            if (rlen != 0)
                fz_fail("error response carries %llu bytes", (unsigned long long)rlen);
            continue;
        }
        if (rlen != len)
            fz_fail("response of %llu bytes to a READ of %llu", (unsigned long long)rlen,
                    (unsigned long long)len);
        if (!read_full(fd, payload, len)) {
            if (corrupt)
                break;
            fz_fail("response data missing");
        }
        if (memcmp(payload, (uint8_t *)(uintptr_t)raddr, len) != 0)
            fz_fail("response data differs from the region");
    }
    free(payload);
    close(fd);
    free(buf);
    return 0;
}

/* Fuzz target: the TCP fabric's requesting side (sim/net/tcpnet_qp.c qp_connect and the
 * receive thread), i.e. what a remote NIC answers: the HELLO_ACK and the READ response
 * stream. The target plays that remote NIC itself on a loopback listener: a helper thread
 * accepts the QP's connection, reads its HELLO and each READ request, and answers with
 * bytes from the input.
 *
 * Input: byte 0 flags: bit 0 a valid OK ACK (else 8 input bytes), bit 1 each response
 * header gets the RESP magic and the request's seq, bit 2 and also status OK and the
 * request's length with exactly that many payload bytes (padded); byte 1: READs to post
 * (1 + b % 4), byte 2: their length (1 + b % 200 bytes each); the rest is the script the
 * helper answers from, then sends raw before closing. Checks: qp_connect fails cleanly or
 * connects (always, after a valid ACK); every posted READ completes exactly once (none is
 * lost when the stream ends); READ i succeeds exactly when the stream the helper sent holds
 * a valid response for it at its place (a reference reading of tcpnet_wire.h: magic, seq,
 * status OK, the requested length, the whole payload; the first invalid one puts the QP in
 * the error state), with exactly that payload; no byte outside the posted SGEs changes;
 * with flags 7 every READ succeeds. Bit 4 of byte 1: the READs carry receive-path digest
 * requests (post_read_digest: the first half of each READ hashed, the second half hashed on
 * even READs and skipped on odd ones); a successful one then says digested, and each digest
 * is xxh3 of those payload bytes (a skipped range's output untouched). */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
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
#include "pf/util.h"

#define NREAD_MAX 4
#define SLOT      256 /* local bytes per READ; reads are at most 200 */
#define SENTINEL  0xc3

static struct pf_net *net;
static struct pf_net_mr *mr;
static uint8_t *local;
static int lfd;
static uint16_t lport;

struct peer {
    const uint8_t *script;
    size_t len, pos;
    uint8_t flags;
    int nread;
    uint64_t want_len;
    bool got_request; /* the helper read the first READ request */
    uint64_t seq0;    /* its seq (the QP numbers its READs consecutively) */
    uint8_t *stream;  /* every byte sent after the ACK */
    size_t nstream;
};

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
    local = malloc(NREAD_MAX * SLOT);
    if (!local ||
        pf_net_reg_mem(net, 0, local, NREAD_MAX * SLOT, PF_NET_ACCESS_LOCAL_WRITE, &mr) != 0)
        fz_fail("local region");
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 8) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &al) != 0)
        fz_fail("listener: %s", strerror(errno));
    lport = ntohs(a.sin_port);
    return 0;
}

static bool rd(int fd, uint8_t *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, b + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static bool wr(int fd, const uint8_t *b, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t w = send(fd, b + put, n - put, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return false;
        put += (size_t)w;
    }
    return true;
}

static bool send_logged(struct peer *p, int fd, const uint8_t *b, size_t n)
{
    memcpy(p->stream + p->nstream, b, n);
    p->nstream += n;
    return wr(fd, b, n);
}

static size_t take(struct peer *p, uint8_t *out, size_t n)
{
    size_t k = p->len - p->pos < n ? p->len - p->pos : n;
    memcpy(out, p->script + p->pos, k);
    p->pos += k;
    return k;
}

static void *peer_main(void *arg)
{
    struct peer *p = arg;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    uint8_t hello[TCPNET_HELLO_LEN], ack[TCPNET_ACK_LEN] = {0};
    if (!rd(fd, hello, sizeof(hello)))
        goto out;
    if (p->flags & 1) {
        tcpnet_put32(ack, TCPNET_ACK_MAGIC);
        tcpnet_put32(ack + 4, TCPNET_ST_OK);
    } else {
        take(p, ack, sizeof(ack));
    }
    if (!wr(fd, ack, sizeof(ack)))
        goto out;
    for (int i = 0; i < p->nread; i++) {
        uint8_t rq[TCPNET_READ_LEN], h[TCPNET_RESP_LEN] = {0};
        if (!rd(fd, rq, sizeof(rq)))
            goto out;
        if (i == 0) {
            p->seq0 = tcpnet_get64(rq + 8);
            p->got_request = true;
        }
        take(p, h, sizeof(h));
        if (p->flags & 6) {
            tcpnet_put32(h, TCPNET_RESP_MAGIC);
            tcpnet_put64(h + 8, tcpnet_get64(rq + 8));
        }
        if (p->flags & 4) {
            tcpnet_put32(h + 4, TCPNET_ST_OK);
            tcpnet_put64(h + 16, tcpnet_get64(rq + 24));
        }
        uint64_t len = tcpnet_get64(h + 16);
        uint8_t payload[SLOT];
        size_t n = len < SLOT ? (size_t)len : SLOT;
        size_t k = take(p, payload, n);
        if (p->flags & 4) {
            memset(payload + k, 0xab, n - k);
            k = n;
        }
        if (!send_logged(p, fd, h, sizeof(h)) || !send_logged(p, fd, payload, k))
            goto out;
    }
    send_logged(p, fd, p->script + p->pos, p->len - p->pos);
    shutdown(fd, SHUT_WR);
    uint8_t sink[256];
    while (recv(fd, sink, sizeof(sink), 0) > 0) /* until the QP closes its side */
        ;
out:
    close(fd);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    struct peer *p = calloc(1, sizeof(*p));
    if (!p)
        return 0;
    p->flags = data[0];
    p->nread = 1 + data[1] % NREAD_MAX;
    p->want_len = 1 + data[2] % 200;
    p->script = data + 3;
    p->len = size - 3;
    p->stream = malloc(p->len + NREAD_MAX * (TCPNET_RESP_LEN + SLOT) + 1);
    if (!p->stream)
        fz_fail("out of memory");
    int status[NREAD_MAX] = {0};
    bool digested[NREAD_MAX] = {false};
    int nposted = 0;
    /* receive-path digests: [0, half) hashed, [half, want_len) hashed (even i) or skipped */
    const bool dig = (data[1] & 0x10) != 0;
    const uint64_t half = (p->want_len + 1) / 2, rest = p->want_len - half;
    uint32_t lens[NREAD_MAX][2];
    uint64_t outs[NREAD_MAX][2];
    struct pf_net_digest dg[NREAD_MAX];
    for (int i = 0; i < NREAD_MAX; i++) {
        lens[i][0] = (uint32_t)half;
        lens[i][1] = (uint32_t)rest | ((i & 1) ? PF_NET_DIGEST_SKIP : 0);
        outs[i][0] = outs[i][1] = 0x5a5a5a5a5a5a5a5aull;
        dg[i] = (struct pf_net_digest){rest ? 2 : 1, lens[i], outs[i]};
    }
    struct pf_net_qp *qp;
    if (pf_net_qp_create(net, 0, &qp) != 0)
        fz_fail("qp_create");
    struct tcpnet_ep ep = {.ip = {127, 0, 0, 1}, .port = lport, .token = 0x1234};
    uint8_t blob[TCPNET_EP_LEN];
    tcpnet_ep_encode(blob, &ep);
    pthread_t th;
    if (pthread_create(&th, NULL, peer_main, p) != 0)
        fz_fail("thread");
    memset(local, SENTINEL, NREAD_MAX * SLOT);
    int rc = pf_net_qp_connect(qp, blob, sizeof(blob));
    if (rc != 0 && (p->flags & 1))
        fz_fail("qp_connect failed (%d) after a valid HELLO_ACK", rc);
    if (rc == 0) {
        for (int i = 0; i < p->nread; i++) {
            struct pf_net_sge sge = {local + i * SLOT, p->want_len, mr->lkey};
            int prc = dig ? pf_net_post_read_digest(qp, &sge, 1, 0x1000, 7, (uint64_t)i, &dg[i])
                          : pf_net_post_read(qp, &sge, 1, 0x1000, 7, (uint64_t)i);
            if (prc == -ENOTCONN)
                break; /* an earlier answer already broke the stream */
            if (prc != 0)
                fz_fail("post_read %d: %d", i, prc);
            nposted++;
        }
        bool done[NREAD_MAX] = {false};
        int ndone = 0;
        while (ndone < nposted) {
            struct pf_net_cqe cqe[NREAD_MAX];
            int n = pf_net_poll(qp, cqe, NREAD_MAX, 1000);
            if (n < 0)
                fz_fail("poll: %d with %d of %d READs completed", n, ndone, nposted);
            for (int j = 0; j < n; j++) {
                uint64_t i = cqe[j].wr_id;
                if (i >= (uint64_t)nposted || done[i])
                    fz_fail("completion for wr_id %llu (unknown or twice)", (unsigned long long)i);
                done[i] = true;
                ndone++;
                status[i] = cqe[j].status;
                digested[i] = cqe[j].digested != 0;
                if (cqe[j].status == 0 && cqe[j].bytes != p->want_len)
                    fz_fail("READ %llu succeeded with %llu bytes of %llu", (unsigned long long)i,
                            (unsigned long long)cqe[j].bytes, (unsigned long long)p->want_len);
            }
        }
    }
    pf_net_qp_destroy(qp); /* no completion can write local memory after this */
    pthread_join(th, NULL);
    for (int i = 0; i < NREAD_MAX; i++)
        for (size_t b = i < nposted ? p->want_len : 0; b < SLOT; b++)
            if (local[i * SLOT + b] != SENTINEL)
                fz_fail("byte %zu of READ slot %d written outside the posted SGE", b, i);
    /* the reference reading of the stream the helper sent (tcpnet_wire.h): READ i succeeds
     * iff its response header is valid for it and its payload arrived in full */
    size_t pos = 0;
    bool broken = !p->got_request;
    for (int i = 0; i < nposted; i++) {
        bool ok = false;
        if (!broken && p->nstream - pos >= TCPNET_RESP_LEN) {
            const uint8_t *h = p->stream + pos;
            ok = tcpnet_get32(h) == TCPNET_RESP_MAGIC && tcpnet_get64(h + 8) == p->seq0 + i &&
                 tcpnet_get32(h + 4) == TCPNET_ST_OK && tcpnet_get64(h + 16) == p->want_len &&
                 p->nstream - pos - TCPNET_RESP_LEN >= p->want_len;
        }
        if ((status[i] == 0) != ok)
            fz_fail("READ %d %s, but its response in the stream is %s", i,
                    status[i] == 0 ? "succeeded" : "failed", ok ? "valid" : "not valid");
        if (ok && memcmp(local + i * SLOT, p->stream + pos + TCPNET_RESP_LEN, p->want_len) != 0)
            fz_fail("READ %d: data differs from the response payload", i);
        if (status[i] == 0 && digested[i] != dig)
            fz_fail("READ %d: digested %d, asked %d", i, digested[i], dig);
        if (ok && dig) {
            const uint8_t *pl = p->stream + pos + TCPNET_RESP_LEN;
            if (outs[i][0] != pf_checksum2(pl, half, NULL, 0))
                fz_fail("READ %d: digest of [0, %llu) is not xxh3 of those bytes", i,
                        (unsigned long long)half);
            if (rest && !(i & 1) && outs[i][1] != pf_checksum2(pl + half, rest, NULL, 0))
                fz_fail("READ %d: digest of the second range is not xxh3 of those bytes", i);
            if (rest && (i & 1) && outs[i][1] != 0x5a5a5a5a5a5a5a5aull)
                fz_fail("READ %d: a skipped range's digest was written", i);
        }
        if (!ok && (p->flags & 7) == 7)
            fz_fail("READ %d failed although every answer was valid", i);
        if (!ok)
            broken = true; /* the QP is in the error state: the rest are flushed */
        pos += TCPNET_RESP_LEN + p->want_len;
    }
    free(p->stream);
    free(p);
    return 0;
}

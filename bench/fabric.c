/* bench/fabric: READ throughput of the TCP fabric ("tcp" NET backend) against a plain TCP
 * stream between the same two endpoints, in the same run; or (--backend verbs --nics A,B) of
 * the verbs backend between two RDMA devices against a raw verbs READ loop on the same two
 * devices (bench/rawverbs.h), e.g. rxe0 -> rxe1 in the soft-RoCE guest (ci/rxe-vm.sh).
 *
 * Topology: as root, two network namespaces joined by a veth pair (addresses only inside
 * the namespaces; both are deleted at exit), the holder process in one and the reader in the
 * other, each fabric NIC named by its veth interface. Otherwise (or with --loopback) the
 * holder binds 127.0.0.1 and the reader 127.0.0.2.
 *
 * The holder registers --size bytes (default 1 GiB) of seeded random data; the reader
 * fetches all of it with one-sided READs of each block size (default 256 KiB, 1 MiB, 4 MiB),
 * keeping the send queue full, then receives the same number of bytes over plain TCP
 * (blocking senders, receivers writing straight into the same destination buffer): over
 * one connection and over RAW_STREAMS parallel ones (disjoint ranges, as bench/p2p), each
 * written and read in block-size calls and in 256 KiB, 1 MiB and 4 MiB calls, and over one
 * connection in single calls; the fastest is the raw sample of that round. Rounds alternate fabric
 * and raw,
 * --reps times; the table reports medians and the ratio of medians, and the JSON file holds every
 * sample. Every fabric round reads into a cleared destination and its bytes are checked against the
 * holder's checksum (outside the timing).
 *
 * Usage: fabric [--size BYTES] [--blocks 256k,1m,4m] [--reps N] [--qps N] [--loopback]
 *               [--backend tcp|verbs] [--nics HOLDER,READER] [--json PATH]
 *               (default PATH: fabric.json; verbs NICs default rxe0,rxe1) */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pf/clock.h"
#include "pf/config.h"
#include "pf/hal.h"
#include "pf/log.h"
#include "pf/util.h"
#include "pfnetns.h"
#include "benchutil.h"
#include "rawverbs.h"

#define MAX_BLOCKS 8
#define MAX_REPS   32
#define MAX_QPS    16

struct opts {
    uint64_t size;
    uint64_t blocks[MAX_BLOCKS];
    int nblocks;
    int reps;
    int qps;
    bool loopback;
    const char *json;
    const char *backend; /* "tcp" or "verbs" */
    char nics[2][64];    /* verbs: holder's and reader's RDMA device */
};

static const char *backend = "tcp";
static struct rv rawv; /* verbs: the raw READ loop's QPs (reader process) */

/* ---- namespaces ---- */

static struct pft_netpair np;

static void ns_cleanup(void)
{
    pft_netpair_cleanup(&np);
}

static void on_signal(int sig)
{
    pft_netpair_cleanup_signal(&np);
    _exit(128 + sig);
}

/* ---- helpers ---- */

static void *map_prefaulted(uint64_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, len, MADV_HUGEPAGE);
    memset(p, 0, len);
    return p;
}

static void fill_seeded(uint8_t *p, uint64_t len, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (uint64_t i = 0; i + 8 <= len; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

static struct pf_net *open_nic(const char *nic)
{
    struct pf_net_config cfg = {.nics = (const char *[]){nic}, .nnics = 1};
    struct pf_net *n = NULL;
    char chosen[32], err[256];
    if (pf_hal_net_open(backend, &cfg, &n, chosen, sizeof(chosen), err, sizeof(err))) {
        fprintf(stderr, "fabric: %s\n", err);
        return NULL;
    }
    return n;
}

#define RAW_STREAMS     4 /* parallel raw TCP streams (several, as bench/p2p) */
#define RAW_STREAMS_STR "4"
#define RAW_MAX_STREAMS 8
/* the raw streams also try calls of these sizes at every block size (which is fastest
 * depends on the day's VM: 256 KiB on 2026-12-01, 1 MiB on 2026-12-02) */
static const uint64_t raw_calls[] = {256u << 10, 1u << 20, 4u << 20};

/* ---- holder (child) ---- */

struct hello {
    uint64_t src_addr, checksum;
    uint32_t rkey;
    uint16_t raw_port;
    uint16_t nqps;
    uint32_t eplen[MAX_QPS];
    uint8_t ep[MAX_QPS][PF_NET_EP_MAX];
};

struct raw_srv {
    int lfd;
    uint8_t *src;
    uint64_t size;
};

struct raw_conn {
    const struct raw_srv *r;
    int fd;
};

/* One raw stream: the reader names the write size and its byte range of the source. */
static void *raw_conn_main(void *arg)
{
    struct raw_conn *c = arg;
    int fd = c->fd;
    const struct raw_srv *r = c->r;
    free(c);
    uint64_t hdr[3]; /* chunk, offset, length */
    if (recv(fd, hdr, sizeof(hdr), MSG_WAITALL) != sizeof(hdr) || hdr[0] == 0 || hdr[1] > r->size ||
        hdr[2] > r->size - hdr[1]) {
        close(fd);
        return NULL;
    }
    uint64_t off = hdr[1], end = hdr[1] + hdr[2];
    while (off < end) {
        uint64_t want = end - off < hdr[0] ? end - off : hdr[0];
        ssize_t n = send(fd, r->src + off, want, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        off += (uint64_t)n;
    }
    /* wait for the reader to close, so its timing includes the last byte only */
    char ch;
    while (recv(fd, &ch, 1, 0) > 0)
        ;
    close(fd);
    return NULL;
}

static void *raw_server(void *arg)
{
    struct raw_srv *r = arg;
    for (;;) {
        int fd = accept(r->lfd, NULL, NULL);
        if (fd < 0)
            return NULL;
        struct raw_conn *c = malloc(sizeof(*c));
        pthread_t t;
        if (!c) {
            close(fd);
            continue;
        }
        *c = (struct raw_conn){r, fd};
        if (pthread_create(&t, NULL, raw_conn_main, c) != 0) {
            free(c);
            close(fd);
            continue;
        }
        pthread_detach(t);
    }
}

static int holder(const struct opts *o, int ctl, const char *nic, const char *ip)
{
    if (np.made && pft_netns_enter(np.ns[0])) {
        fprintf(stderr, "holder: cannot enter %s\n", np.ns[0]);
        return 1;
    }
    struct pf_net *n = open_nic(nic);
    uint8_t *src = map_prefaulted(o->size);
    if (!n || !src)
        return 1;
    fill_seeded(src, o->size, 0x5eed);
    struct hello h;
    memset(&h, 0, sizeof(h));
    h.checksum = pf_hash64(src, o->size);
    struct pf_net_mr *mr;
    if (pf_net_reg_mem(n, 0, src, o->size, PF_NET_ACCESS_REMOTE_READ, &mr))
        return 1;
    struct pf_net_qp *qp[MAX_QPS];
    h.nqps = (uint16_t)o->qps;
    for (int i = 0; i < o->qps; i++) {
        size_t l = 0;
        if (pf_net_qp_create(n, 0, &qp[i]) ||
            pf_net_qp_local_endpoint(qp[i], h.ep[i], sizeof(h.ep[i]), &l))
            return 1;
        h.eplen[i] = (uint32_t)l;
    }
    h.src_addr = (uint64_t)(uintptr_t)src;
    h.rkey = mr->rkey;
    struct raw_srv rs = {.src = src, .size = o->size};
    rs.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, ip, &sa.sin_addr);
    int one = 1;
    setsockopt(rs.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(rs.lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(rs.lfd, 4))
        return 1;
    socklen_t sl = sizeof(sa);
    getsockname(rs.lfd, (struct sockaddr *)&sa, &sl);
    h.raw_port = ntohs(sa.sin_port);
    pthread_t rt;
    pthread_create(&rt, NULL, raw_server, &rs);
    struct hello peer;
    if (pft_write_full(ctl, &h, sizeof(h)) || pft_read_full(ctl, &peer, sizeof(peer)))
        return 1;
    for (int i = 0; i < o->qps; i++)
        if (pf_net_qp_connect(qp[i], peer.ep[i], peer.eplen[i]))
            return 1;
    char c = 'c';
    if (pft_write_full(ctl, &c, 1))
        return 1;
    /* serve until the reader says quit (or goes away) */
    if (pft_read_full(ctl, &c, 1) == 0 && c == 'q') {
        for (int i = 0; i < o->qps; i++)
            pf_net_qp_destroy(qp[i]);
        pf_net_dereg_mem(mr);
        pf_net_close(n);
    }
    return 0;
}

/* ---- reader (parent) ---- */

struct reader {
    pid_t holder;
    const struct opts *o;
    struct pf_net *net;
    struct pf_net_qp *qp[MAX_QPS];
    struct pf_net_mr *mr;
    uint8_t *dst;
    struct hello h;
    const char *holder_ip;
};

static double fabric_round(struct reader *r, uint64_t blk)
{
    const struct opts *o = r->o;
    uint64_t n = (o->size + blk - 1) / blk, posted = 0, done = 0;
    uint64_t out[MAX_QPS] = {0};
    uint64_t t0 = pf_now_ns();
    while (done < n) {
        /* keep every QP's send queue full, round robin */
        for (bool progress = true; progress && posted < n;) {
            progress = false;
            for (int q = 0; q < o->qps && posted < n; q++) {
                uint64_t off = posted * blk, len = o->size - off < blk ? o->size - off : blk;
                struct pf_net_sge s = {r->dst + off, len, r->mr->lkey};
                int rc = pf_net_post_read(r->qp[(posted) % (uint64_t)o->qps], &s, 1,
                                          r->h.src_addr + off, r->h.rkey, posted);
                if (rc == -EAGAIN)
                    continue;
                if (rc) {
                    fprintf(stderr, "post_read: %s\n", strerror(-rc));
                    return -1;
                }
                out[posted % (uint64_t)o->qps]++;
                posted++;
                progress = true;
            }
        }
        struct pf_net_cqe c[128];
        int got = 0;
        for (int q = 0; q < o->qps; q++) {
            if (!out[q])
                continue;
            int k = pf_net_poll(r->qp[q], c, 128, o->qps == 1 ? 10000 : 0);
            if (k < 0) {
                fprintf(stderr, "poll: %s\n", strerror(-k));
                return -1;
            }
            for (int i = 0; i < k; i++)
                if (c[i].status) {
                    fprintf(stderr, "READ %" PRIu64 " failed: %s\n", c[i].wr_id,
                            strerror(-c[i].status));
                    return -1;
                }
            out[q] -= (uint64_t)k;
            done += (uint64_t)k;
            got += k;
        }
        if (got == 0 && o->qps > 1) /* several QPs: short blocking wait on the first busy one */
            for (int q = 0; q < o->qps; q++)
                if (out[q]) {
                    int k = pf_net_poll(r->qp[q], c, 128, 1);
                    if (k > 0) {
                        out[q] -= (uint64_t)k;
                        done += (uint64_t)k;
                        for (int i = 0; i < k; i++)
                            if (c[i].status)
                                return -1;
                    }
                    break;
                }
    }
    return (double)(pf_now_ns() - t0) / 1e9;
}

/* CPU seconds (user + system, all threads) used so far by this process and the holder. */
static double cpu_s(pid_t holder)
{
    double ticks = 0;
    pid_t pids[2] = {getpid(), holder};
    for (int i = 0; i < 2; i++) {
        char path[64], buf[1024];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pids[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
        unsigned long ut = 0, st = 0;
        if (p &&
            sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
            ticks += (double)(ut + st);
    }
    return ticks / (double)sysconf(_SC_CLK_TCK);
}

static double fabric_round_cpu(struct reader *r, uint64_t blk, double *cpu_p)
{
    double c0 = cpu_s(r->holder);
    double s = fabric_round(r, blk);
    *cpu_p = cpu_s(r->holder) - c0;
    return s;
}

struct raw_stream {
    const struct reader *r;
    uint64_t chunk, off, len;
    int ok;
    pthread_t t;
};

static void *raw_stream_main(void *arg)
{
    struct raw_stream *st = arg;
    const struct reader *r = st->r;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(r->h.raw_port)};
    inet_pton(AF_INET, r->holder_ip, &sa.sin_addr);
    uint64_t hdr[3] = {st->chunk, st->off, st->len};
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
        send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) != sizeof(hdr)) {
        perror("raw connect");
        close(fd);
        return NULL;
    }
    uint64_t off = st->off, end = st->off + st->len;
    while (off < end) {
        uint64_t want = end - off < st->chunk ? end - off : st->chunk;
        ssize_t n = recv(fd, r->dst + off, want, MSG_WAITALL);
        if (n <= 0) {
            perror("raw recv");
            close(fd);
            return NULL;
        }
        off += (uint64_t)n;
    }
    close(fd);
    st->ok = 1;
    return NULL;
}

/* size bytes over nstreams parallel TCP connections (disjoint ranges), each written and
 * read in chunk-sized calls; seconds, -1 on failure. */
static double raw_round(struct reader *r, uint64_t chunk, int nstreams)
{
    struct raw_stream rs[RAW_MAX_STREAMS];
    uint64_t per = r->o->size / (uint64_t)nstreams;
    uint64_t t0 = pf_now_ns();
    for (int i = 0; i < nstreams; i++) {
        rs[i] =
            (struct raw_stream){.r = r,
                                .chunk = chunk,
                                .off = per * (uint64_t)i,
                                .len = i == nstreams - 1 ? r->o->size - per * (uint64_t)i : per};
        pthread_create(&rs[i].t, NULL, raw_stream_main, &rs[i]);
    }
    int ok = 1;
    for (int i = 0; i < nstreams; i++) {
        pthread_join(rs[i].t, NULL);
        ok &= rs[i].ok;
    }
    return ok ? (double)(pf_now_ns() - t0) / 1e9 : -1;
}

/* The raw baseline of one round, so the ratio is never flattered by a weak baseline: the
 * fastest of one stream and RAW_STREAMS parallel streams (as bench/p2p), each written and
 * read in block-size calls and in 256 KiB, 1 MiB and 4 MiB calls (*chunked_p), and one stream in a
 * single call (the kernel's best case, *whole_p). */
static double raw_best(struct reader *r, uint64_t blk, double *chunked_p, double *whole_p,
                       double *cpu_p)
{
    double c0 = cpu_s(r->holder);
    if (strcmp(backend, "verbs") == 0) { /* the raw verbs READ loop, same devices */
        *chunked_p = *whole_p = rv_round(&rawv, r->o->size, blk);
        *cpu_p = cpu_s(r->holder) - c0;
        return *chunked_p;
    }
    *chunked_p = raw_round(r, blk, 1);
    *cpu_p = cpu_s(r->holder) - c0;
    if (*chunked_p <= 0)
        return -1;
    uint64_t chunks[1 + PF_ARRAY_SIZE(raw_calls)] = {blk};
    int nc = 1;
    for (size_t k = 0; k < PF_ARRAY_SIZE(raw_calls); k++)
        if (raw_calls[k] != blk && raw_calls[k] < r->o->size)
            chunks[nc++] = raw_calls[k];
    const int streams[2] = {1, RAW_STREAMS};
    for (int c = 0; c < nc; c++)
        for (int k = 0; k < 2; k++) {
            if (c == 0 && k == 0)
                continue; /* measured above */
            double t = raw_round(r, chunks[c], streams[k]);
            if (t <= 0)
                return -1;
            if (t < *chunked_p)
                *chunked_p = t;
        }
    *whole_p = raw_round(r, r->o->size, 1);
    if (*whole_p <= 0)
        return -1;
    return *chunked_p < *whole_p ? *chunked_p : *whole_p;
}

#define USAGE                                                                                      \
    "fabric [--size BYTES] [--blocks 256k,1m,4m] [--reps N] [--qps N] [--loopback] "               \
    "[--backend tcp|verbs] [--nics A,B] [--json PATH]"

static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.size = 1ull << 30,
                       .blocks = {256u << 10, 1u << 20, 4u << 20},
                       .nblocks = 3,
                       .reps = 3,
                       .qps = 1,
                       .json = "fabric.json",
                       .backend = "tcp",
                       .nics = {"rxe0", "rxe1"}};
    const char *blocks = NULL, *nics = NULL;
    const struct bu_opt opts[] = {{"--loopback", BU_FLAG, &o->loopback},
                                  {"--size", BU_SIZE, &o->size},
                                  {"--reps", BU_INT, &o->reps},
                                  {"--qps", BU_INT, &o->qps},
                                  {"--json", BU_STR, &o->json},
                                  {"--backend", BU_STR, &o->backend},
                                  {"--nics", BU_STR, &nics},
                                  {"--blocks", BU_STR, &blocks},
                                  {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, USAGE);
    if (o->size == 0 || o->reps < 1 || o->reps > MAX_REPS || o->qps < 1 || o->qps > MAX_QPS ||
        (strcmp(o->backend, "tcp") && strcmp(o->backend, "verbs")))
        goto usage;
    if (nics && sscanf(nics, "%63[^,],%63s", o->nics[0], o->nics[1]) != 2)
        goto usage;
    if (blocks) {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", blocks);
        o->nblocks = 0;
        for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (o->nblocks == MAX_BLOCKS || pf_parse_size(t, &o->blocks[o->nblocks]) ||
                o->blocks[o->nblocks] == 0)
                goto usage;
            o->nblocks++;
        }
    }
    return 0;
usage:
    fprintf(stderr, "usage: %s\n", USAGE);
    return -1;
}

/* ---- the phases of a run ---- */

struct run {
    struct opts o;
    bool verbs;
    const char *topo, *nic_a, *nic_b, *hip;
    char topo_buf[320];
    int ctl; /* the socket to the holder process */
    pid_t pid;
    struct reader r;
    uint8_t *rawsrc;
    double fab[MAX_BLOCKS][MAX_REPS], raw[MAX_BLOCKS][MAX_REPS];
    double rawc[MAX_BLOCKS][MAX_REPS], raww[MAX_BLOCKS][MAX_REPS];
    double fabcpu[MAX_BLOCKS][MAX_REPS], rawcpu[MAX_BLOCKS][MAX_REPS];
    bool ok[MAX_BLOCKS];
};

/* Where the two sides run: two RDMA devices (verbs; the raw TCP server stays on loopback),
 * a veth pair between two namespaces (root), or loopback. */
static void choose_topology(struct run *f)
{
    f->topo = "loopback 127.0.0.1 <-> 127.0.0.2";
    f->nic_a = "127.0.0.1";
    f->nic_b = "127.0.0.2";
    f->hip = "127.0.0.1";
    backend = f->o.backend;
    f->verbs = strcmp(backend, "verbs") == 0;
    if (f->verbs) {
        f->nic_a = f->o.nics[0];
        f->nic_b = f->o.nics[1];
        snprintf(f->topo_buf, sizeof(f->topo_buf),
                 "verbs %s (holder) -> %s (reader), against a raw verbs READ loop", f->nic_a,
                 f->nic_b);
        f->topo = f->topo_buf;
    } else if (!f->o.loopback && geteuid() == 0) {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        if (pft_netpair_setup(&np, "pfbench", 213) == 0) {
            atexit(ns_cleanup);
            f->nic_a = np.veth[0];
            f->nic_b = np.veth[1];
            f->hip = np.ip[0];
            snprintf(f->topo_buf, sizeof(f->topo_buf),
                     "veth %s (%s, netns %s) <-> %s (%s, netns %s)", np.veth[0], np.ip[0], np.ns[0],
                     np.veth[1], np.ip[1], np.ns[1]);
            f->topo = f->topo_buf;
        } else {
            fprintf(stderr, "fabric: cannot create network namespaces: using loopback\n");
        }
    }
    printf("fabric: %s, %" PRIu64 " MiB per fetch, %d QP(s), %d reps\n", f->topo, f->o.size >> 20,
           f->o.qps, f->o.reps);
    fflush(stdout);
}

/* Forks the holder process (node A's side); 0 or -1. */
static int start_holder(struct run *f)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        return -1;
    f->pid = fork();
    if (f->pid < 0)
        return -1;
    if (f->pid == 0) {
        close(sv[0]);
        int rc = holder(&f->o, sv[1], f->nic_a, f->hip);
        np.made = false;
        _exit(rc);
    }
    close(sv[1]);
    f->ctl = sv[0];
    f->r = (struct reader){.o = &f->o, .holder_ip = f->hip, .holder = f->pid};
    return 0;
}

/* The reader (node B's side): its NIC, destination memory, QPs connected to the holder's,
 * and for verbs the raw READ loop's source; 0 or -1. */
static int connect_reader(struct run *f)
{
    struct reader *r = &f->r;
    const struct opts *o = &f->o;
    if (np.made && pft_netns_enter(np.ns[1])) {
        fprintf(stderr, "reader: cannot enter %s\n", np.ns[1]);
        return -1;
    }
    r->net = open_nic(f->nic_b);
    r->dst = map_prefaulted(o->size);
    if (!r->net || !r->dst)
        return -1;
    if (pf_net_reg_mem(r->net, 0, r->dst, o->size, PF_NET_ACCESS_LOCAL_WRITE, &r->mr))
        return -1;
    struct hello mine;
    memset(&mine, 0, sizeof(mine));
    mine.nqps = (uint16_t)o->qps;
    for (int i = 0; i < o->qps; i++) {
        size_t l = 0;
        if (pf_net_qp_create(r->net, 0, &r->qp[i]) ||
            pf_net_qp_local_endpoint(r->qp[i], mine.ep[i], sizeof(mine.ep[i]), &l))
            return -1;
        mine.eplen[i] = (uint32_t)l;
    }
    char c;
    if (pft_read_full(f->ctl, &r->h, sizeof(r->h)) || pft_write_full(f->ctl, &mine, sizeof(mine)) ||
        pft_read_full(f->ctl, &c, 1)) {
        fprintf(stderr, "fabric: holder failed to start\n");
        return -1;
    }
    for (int i = 0; i < o->qps; i++)
        if (pf_net_qp_connect(r->qp[i], r->h.ep[i], r->h.eplen[i]))
            return -1;
    if (f->verbs) { /* the baseline's source: the holder's bytes, on the holder's device */
        f->rawsrc = map_prefaulted(o->size);
        if (!f->rawsrc)
            return -1;
        fill_seeded(f->rawsrc, o->size, 0x5eed);
        int e = rv_open(&rawv, f->nic_a, f->nic_b, f->rawsrc, r->dst, o->size);
        if (e) {
            fprintf(stderr, "fabric: raw verbs baseline on %s -> %s: %s\n", f->nic_a, f->nic_b,
                    strerror(-e));
            return -1;
        }
    }
    return 0;
}

/* Every block size, --reps runs of the fabric and of the raw baseline (ABBA order); 0 or -1. */
static int measure(struct run *f)
{
    const struct opts *o = &f->o;
    struct reader *r = &f->r;
    for (int b = 0; b < o->nblocks; b++) {
        for (int k = 0; k < o->reps; k++) {
            /* alternate the order so drift hurts both equally; every fabric round starts
             * from a cleared destination and its bytes are checked (outside the timing) */
            if (k == 0)
                f->ok[b] = true;
            if (k % 2 == 1)
                f->raw[b][k] =
                    raw_best(r, o->blocks[b], &f->rawc[b][k], &f->raww[b][k], &f->rawcpu[b][k]);
            memset(r->dst, 0, o->size);
            f->fab[b][k] = fabric_round_cpu(r, o->blocks[b], &f->fabcpu[b][k]);
            f->ok[b] = f->ok[b] && f->fab[b][k] > 0 && pf_hash64(r->dst, o->size) == r->h.checksum;
            if (k % 2 == 0)
                f->raw[b][k] =
                    raw_best(r, o->blocks[b], &f->rawc[b][k], &f->raww[b][k], &f->rawcpu[b][k]);
            if (f->fab[b][k] <= 0 || f->raw[b][k] <= 0)
                return -1;
        }
    }
    return 0;
}

/* The table and the JSON; 0, or 1 when some block size's bytes did not verify. */
static int report(struct run *f)
{
    const struct opts *o = &f->o;
    bool verbs = f->verbs;
    printf("\n%-10s %14s %14s %14s %8s %8s %9s %9s  %s\n", "block",
           verbs ? "verbs GB/s" : "fabric GB/s", verbs ? "raw verbs GB/s" : "raw TCP GB/s",
           "fabric best", "ratio", "paired", "fab CPU", "raw CPU", "bytes");
    printf("(GB/s = 1e9 bytes/s, medians of %d runs; raw = %s;\n ratio = fabric/raw of the "
           "medians; paired = median of per-run fabric/raw;\n CPU = user+system seconds per GiB "
           "of both processes%s)\n",
           o->reps,
           verbs ? "ibv_post_send READs of the block size, 128 outstanding, on the same devices"
                 : "the fastest, in each run, of 1 and " RAW_STREAMS_STR " parallel streams in "
                   "block-size, 256 KiB, 1 MiB and 4 MiB calls and of one stream in single calls",
           verbs ? " (soft-RoCE's work runs in kernel threads and is not counted)"
                 : ", block-size raw stream");
    cJSON *root = bu_json_obj(NULL, NULL);
    bu_json_str(root, "benchmark", "fabric");
    bu_json_str(root, "backend", backend);
    bu_json_str(root, "topology", f->topo);
    bu_json_num(root, "bytes", (double)o->size);
    bu_json_num(root, "qps", o->qps);
    bu_json_num(root, "reps", o->reps);
    cJSON *res = bu_json_check(cJSON_AddArrayToObject(root, "results"));
    double worst = 1e9;
    int rc = 0;
    for (int b = 0; b < o->nblocks; b++) {
        double fm = bu_median(f->fab[b], o->reps), rm = bu_median(f->raw[b], o->reps);
        double fbest = f->fab[b][0];
        for (int k = 1; k < o->reps; k++)
            fbest = f->fab[b][k] < fbest ? f->fab[b][k] : fbest;
        double fgb = (double)o->size / fm / 1e9, rgb = (double)o->size / rm / 1e9;
        double ratio = rm / fm, paired[MAX_REPS];
        for (int k = 0; k < o->reps; k++) /* same-moment pairs: robust to load drift */
            paired[k] = f->raw[b][k] / f->fab[b][k];
        double pratio = bu_median(paired, o->reps);
        worst = ratio < worst ? ratio : worst;
        char bl[32];
        snprintf(bl, sizeof(bl), "%" PRIu64 " KiB", o->blocks[b] >> 10);
        double gib = (double)o->size / (double)(1ull << 30);
        double fcpu = bu_median(f->fabcpu[b], o->reps) / gib,
               rcpu = bu_median(f->rawcpu[b], o->reps) / gib;
        printf("%-10s %14.3f %14.3f %14.3f %8.3f %8.3f %9.2f %9.2f  %s\n", bl, fgb, rgb,
               (double)o->size / fbest / 1e9, ratio, pratio, fcpu, rcpu,
               f->ok[b] ? "verified" : "MISMATCH");
        cJSON *jb = bu_json_obj(NULL, NULL);
        cJSON_AddItemToArray(res, jb);
        bu_json_num(jb, "block", (double)o->blocks[b]);
        bu_json_num(jb, "fabric_gbps", fgb);
        bu_json_num(jb, "raw_gbps", rgb);
        bu_json_num(jb, "ratio", ratio);
        bu_json_num(jb, "paired_ratio", pratio);
        bu_json_num(jb, "fabric_cpu_s_per_gib", fcpu);
        bu_json_num(jb, "raw_cpu_s_per_gib", rcpu);
        bu_json_bool(jb, "verified", f->ok[b]);
        bu_json_nums(jb, "fabric_s", f->fab[b], o->reps);
        bu_json_nums(jb, "raw_s", f->raw[b], o->reps);
        bu_json_nums(jb, "raw_block_writes_s", f->rawc[b], o->reps);
        bu_json_nums(jb, "raw_single_write_s", f->raww[b], o->reps);
        if (!f->ok[b])
            rc = 1;
    }
    printf("\nworst ratio %s/raw: %.3f (target >= 0.7)\n", verbs ? "verbs" : "fabric", worst);
    bu_json_num(root, "worst_ratio", worst);
    bu_json_write(root, o->json);
    printf("JSON: %s\n", o->json);
    return rc;
}

/* Stops the holder and frees the reader's side. */
static void teardown(struct run *f)
{
    char c = 'q';
    pft_write_full(f->ctl, &c, 1);
    close(f->ctl);
    waitpid(f->pid, NULL, 0);
    for (int i = 0; i < f->o.qps; i++)
        pf_net_qp_destroy(f->r.qp[i]);
    pf_net_dereg_mem(f->r.mr);
    pf_net_close(f->r.net);
    rv_close(&rawv);
    if (f->rawsrc)
        munmap(f->rawsrc, f->o.size);
}

int main(int argc, char **argv)
{
    static struct run f; /* the result arrays: too large for the stack */
    if (parse_opts(argc, argv, &f.o))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    pf_log_set_level(PF_LOG_WARN);
    choose_topology(&f);
    if (start_holder(&f))
        return 1;
    int rc = 1;
    if (connect_reader(&f) == 0 && measure(&f) == 0)
        rc = report(&f);
    teardown(&f);
    return rc;
}

/* meta_node: a simulated pegaflow-server node for the MetaServer scenarios. It runs the
 * real MetaServer client (src/meta/client.c) over a resident set of N blocks
 * ("<prefix>-0" .. "<prefix>-(N-1)" in one namespace), registers them through the queue,
 * serves its own /metrics, and stops (UnregisterNode) on SIGTERM/SIGINT.
 *
 *   meta_node --target HOST:PORT --advertise ADDR [--ns NS] [--blocks N] [--prefix P]
 *             [--refresh-secs S] [--http-addr HOST:PORT] [--storm CALLS]
 *
 * --storm CALLS: instead of waiting for a signal, enqueue CALLS insert/remove commands of 16
 * hashes as fast as possible, print "storm calls=.. ok=.. full=.. max_us=..", flush and
 * exit (used with an absent MetaServer). Prints "HTTP listening on ... (port N)" and
 * "node ready" when registered. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "meta_node"
#include "pf/http.h"
#include "pf/log.h"
#include "pf/meta_client.h"

static const char *ns = "ns0";
static const char *prefix = "blk";
static long nblocks = 64;

static int enum_resident(void *ctx, pf_meta_emit_fn emit, void *ectx)
{
    for (long i = 0; i < nblocks; i++) {
        char k[128];
        int l = snprintf(k, sizeof(k), "%s-%ld", prefix, i);
        int rc = emit(ectx, ns, k, (size_t)l);
        if (rc)
            return rc;
    }
    return 0;
}

static int insert_range(struct pf_meta_client *c, long lo, long n, bool remove)
{
    char kb[256][128];
    struct pf_meta_hash h[256];
    if (n > 256)
        n = 256;
    for (long i = 0; i < n; i++) {
        int l = snprintf(kb[i], sizeof(kb[i]), "%s-%ld", prefix, lo + i);
        h[i] = (struct pf_meta_hash){(size_t)l, (const uint8_t *)kb[i]};
    }
    return remove ? pf_meta_client_remove(c, ns, h, (size_t)n)
                  : pf_meta_client_insert(c, ns, h, (size_t)n);
}

static const struct pf_http_route routes[] = {
    {"GET", "/health", pf_http_health, NULL},
    {"GET", "/metrics", pf_http_metrics, NULL},
};

int main(int argc, char **argv)
{
    const char *target = NULL, *advertise = NULL, *http_addr = "127.0.0.1:0";
    uint64_t refresh = 0;
    long storm = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--target"))
            target = v;
        else if (!strcmp(k, "--advertise"))
            advertise = v;
        else if (!strcmp(k, "--ns"))
            ns = v;
        else if (!strcmp(k, "--blocks"))
            nblocks = atol(v);
        else if (!strcmp(k, "--prefix"))
            prefix = v;
        else if (!strcmp(k, "--refresh-secs"))
            refresh = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--http-addr"))
            http_addr = v;
        else if (!strcmp(k, "--storm"))
            storm = atol(v);
        else {
            fprintf(stderr, "unknown flag %s\n", k);
            return 2;
        }
    }
    if (!target || !advertise) {
        fprintf(stderr, "usage: meta_node --target HOST:PORT --advertise ADDR ...\n");
        return 2;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    struct pf_http_server *http = NULL;
    int port = 0;
    char err[256];
    if (pf_http_server_start(http_addr, routes, PF_ARRAY_SIZE(routes), NULL, &http, &port, err,
                             sizeof(err))) {
        fprintf(stderr, "http: %s\n", err);
        return 1;
    }
    pf_info("HTTP listening on %s (port %d)", http_addr, port);
    struct pf_meta_client_config cfg = {
        .target = target,
        .advertise_addr = advertise,
        .refresh_interval_secs = refresh,
        .rpc_timeout_ms = 3000,
        .enumerate_resident = enum_resident,
    };
    struct pf_meta_client *c;
    int rc = pf_meta_client_create(&cfg, &c);
    if (rc) {
        fprintf(stderr, "client: %s\n", strerror(-rc));
        return 1;
    }
    if (storm) {
        long ok = 0, full = 0, other = 0;
        uint64_t worst = 0, t_all = pf_now_ns();
        for (long i = 0; i < storm; i++) {
            uint64_t t0 = pf_now_ns();
            rc = insert_range(c, (i * 16) % (nblocks > 16 ? nblocks : 16), 16, i % 4 == 3);
            uint64_t dt = pf_now_ns() - t0;
            worst = dt > worst ? dt : worst;
            if (rc == 0)
                ok++;
            else if (rc == -EAGAIN)
                full++;
            else
                other++;
        }
        double total_ms = (double)(pf_now_ns() - t_all) / 1e6;
        printf("storm calls=%ld ok=%ld full=%ld other=%ld max_us=%.1f total_ms=%.1f\n", storm, ok,
               full, other, (double)worst / 1e3, total_ms);
        fflush(stdout);
        rc = pf_meta_client_flush(c, 30000);
        printf("flush rc=%d connected=%d\n", rc, (int)pf_meta_client_connected(c));
        fflush(stdout);
        pf_meta_client_destroy(c);
        pf_http_server_stop(http);
        return other ? 1 : 0;
    }
    for (long lo = 0; lo < nblocks; lo += 256)
        insert_range(c, lo, nblocks - lo, false);
    rc = pf_meta_client_flush(c, 30000);
    pf_info("node ready: %ld blocks queued, flush rc=%d, node_id %s", nblocks, rc,
            pf_meta_client_node_id(c));
    int sig = 0;
    sigwait(&set, &sig);
    pf_info("signal %d: stopping", sig);
    pf_meta_client_destroy(c);
    pf_http_server_stop(http);
    pf_info("stopped");
    return 0;
}

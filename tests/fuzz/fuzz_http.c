/* Fuzz target: the HTTP admin server (src/http: libmicrohttpd request parsing, our exact-path
 * router with its 404/405 answers, the query-string lookup, and the pegaflow-server
 * handlers) with pegaflow-server's route table over a real in-process engine (sim GPU).
 *
 * Input: raw bytes sent on a fresh loopback connection to the server (127.0.0.1, port 0),
 * then the write side is shut down and the answer read to EOF. Checks: when anything comes
 * back it is an HTTP/1.x status line; no answer is 500 (handlers return -errno only for
 * their own failures; a client can never cause one); 405 answers carry an Allow header.
 * Coverage feedback comes from our router and handlers (libmicrohttpd itself is the
 * system's, not instrumented). */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "pf/engine.h"
#include "pf/hal.h"
#include "pf/hal_gpu.h"
#include "pf/http.h"
#include "pf/log.h"

#define RESP_MAX (1 << 20)

static struct pf_engine *engine;
static struct pf_gpu *gpu;
static struct pf_http_server *srv;
static int port;

/* pegaflow-server's table with --enable-prometheus (src/app/server.c routes_prom) */
static const char *const cleanup_params[] = {"id", NULL};
static const struct pf_http_route routes[] = {
    {"GET", "/health", pf_http_health, NULL},
    {"GET", "/metrics", pf_http_metrics, NULL},
    {"GET", "/instances", pf_http_instances, NULL},
    {"POST", "/instances/cleanup", pf_http_instances_cleanup, cleanup_params},
    {"POST", "/cache/memory/cleanup", pf_http_memory_cleanup, NULL},
};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char chosen[32], err[256];
    pf_log_set_level(PF_LOG_ERROR);
    pf_hal_init();
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    if (pf_hal_gpu_open("sim", &gc, &gpu, chosen, sizeof(chosen), err, sizeof(err)) != 0)
        fz_fail("sim GPU: %s", err);
    struct pf_engine_config ec = {.gpu = gpu, .pool_size = 8 << 20, .skip_memcheck = true};
    if (pf_engine_create(&ec, &engine, err, sizeof(err)) != 0)
        fz_fail("engine: %s", err);
    if (pf_http_server_start("127.0.0.1:0", routes, sizeof(routes) / sizeof(routes[0]), &engine,
                             &srv, &port, err, sizeof(err)) != 0)
        fz_fail("HTTP server: %s", err);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        fz_fail("socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        fz_fail("connect: %s", strerror(errno));
    struct linger lg = {1, 0}; /* close with RST: no TIME_WAIT per input */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    size_t sent = 0;
    while (sent < size) {
        ssize_t w = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            break; /* the server closed on a bad request */
        sent += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    char *resp = malloc(RESP_MAX + 1);
    if (!resp)
        fz_fail("out of memory");
    size_t got = 0;
    for (;;) {
        ssize_t r = recv(fd, resp + got, RESP_MAX - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got == RESP_MAX)
            break;
    }
    resp[got] = '\0';
    close(fd);
    /* every answer on the connection (pipelined requests give several) */
    for (char *p = resp; (p = strstr(p, "HTTP/1.")) != NULL; p++) {
        if (p != resp && !(p[-1] == '\n'))
            continue; /* inside a body */
        int code = 0;
        if (sscanf(p, "HTTP/1.%*d %d", &code) != 1)
            fz_fail("malformed status line: %.60s", p);
        if (code == 500)
            fz_fail("answered 500: %.300s", p);
        if (code == 405 && !strcasestr(p, "\nAllow:"))
            fz_fail("405 without an Allow header: %.300s", p);
    }
    if (got && strncmp(resp, "HTTP/1.", 7) != 0)
        fz_fail("answer does not start with a status line: %.60s", resp);
    free(resp);
    return 0;
}

/* libmicrohttpd wrapper: exact-path routing with 404/405, handler bodies owned by the
 * server once returned. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#define PF_LOG_MOD "http"
#include "http/http_internal.h"
#include "pf/config.h"
#include "pf/http.h"
#include "pf/log.h"

#define PF_HTTP_THREADS         2   /* polling threads, fixed */
#define PF_HTTP_MAX_CONNECTIONS 512 /* open connections, all clients */
#define PF_HTTP_MAX_PER_IP      128 /* open connections from one address */

struct pf_http_server {
    struct MHD_Daemon *d;
    const struct pf_http_route *routes;
    size_t nroutes;
    void *ctx;
    char *admin_token; /* NULL: POST endpoints are open */
};

int pf_http_resp_text(struct pf_http_resp *resp, int status, const char *text)
{
    resp->status = status;
    resp->content_type = "text/plain; charset=utf-8";
    resp->body = strdup(text);
    if (!resp->body)
        return -ENOMEM;
    resp->len = strlen(text);
    return 0;
}

const char *pf_http_query(const struct pf_http_req *req, const char *key)
{
    return MHD_lookup_connection_value((struct MHD_Connection *)req->conn, MHD_GET_ARGUMENT_KIND,
                                       key);
}

static enum MHD_Result send_resp(struct MHD_Connection *conn, struct pf_http_resp *r,
                                 const char *allow)
{
    struct MHD_Response *mr =
        MHD_create_response_from_buffer(r->len, r->body ? r->body : (void *)"",
                                        r->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!mr) {
        free(r->body);
        return MHD_NO;
    }
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE,
                            r->content_type ? r->content_type : "text/plain; charset=utf-8");
    if (allow)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)(r->status ? r->status : 200), mr);
    MHD_destroy_response(mr);
    return ret;
}

/* 401 with WWW-Authenticate: Bearer (--admin-token-file, see http/auth.c). */
static enum MHD_Result send_unauthorized(struct MHD_Connection *conn)
{
    static const char body[] = "admin token required: Authorization: Bearer TOKEN\n";
    struct MHD_Response *mr =
        MHD_create_response_from_buffer(sizeof(body) - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!mr)
        return MHD_NO;
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(conn, 401, mr);
    MHD_destroy_response(mr);
    return ret;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

struct param_check {
    const char *const *allowed;
    char bad[256];
};

static enum MHD_Result check_param(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    struct param_check *pc = cls;
    bool known = false;
    for (const char *const *a = pc->allowed; a && *a && !known; a++)
        known = strcmp(*a, key) == 0;
    char ek[64]; /* the client's key, escaped (and cut) for the answer */
    pf_http_printable(key, ek, sizeof(ek));
    if (!known)
        snprintf(pc->bad, sizeof(pc->bad), "unknown query parameter '%s'", ek);
    else if (!value)
        snprintf(pc->bad, sizeof(pc->bad), "query parameter '%s' has no value (use %s=...)", ek,
                 ek);
    return pc->bad[0] ? MHD_NO : MHD_YES;
}

/* Percent-decoding for paths and query values that leaves "%00" as it is: a decoded NUL
 * would end the C string early ("/health%00" would match "/health", "id=a%00b" would name
 * "a"). Returns the new length. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo) != 0) {
            *w++ = (char)(hi << 4 | lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

void pf_http_printable(const char *in, char *out, size_t n)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 5 < n; p++) {
        if (*p >= 0x20 && *p < 0x7f)
            out[o++] = (char)*p;
        else
            o += (size_t)snprintf(out + o, n - o, "\\x%02x", *p);
    }
    out[o] = '\0';
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    struct pf_http_server *s = cls;
    /* first call per request: headers only; consume any body, answer on the last call */
    if (*con_cls == NULL) {
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0; /* bodies are ignored by every endpoint */
        return MHD_YES;
    }
    struct pf_http_resp r = {0};
    char allow[64] = "";
    const struct pf_http_route *hit = NULL;
    for (size_t i = 0; i < s->nroutes; i++) {
        if (strcmp(s->routes[i].path, url) != 0)
            continue;
        if (strcmp(s->routes[i].method, method) == 0) {
            hit = &s->routes[i];
            break;
        }
        snprintf(allow + strlen(allow), sizeof(allow) - strlen(allow), "%s%s", allow[0] ? ", " : "",
                 s->routes[i].method);
    }
    if (!hit) {
        /* the client's bytes go into the answer escaped: a decoded "%0a" in the path must not
         * put a line of the client's choosing into the body */
        char msg[512], em[64], eu[160];
        pf_http_printable(method, em, sizeof(em));
        pf_http_printable(url, eu, sizeof(eu));
        if (allow[0]) {
            snprintf(msg, sizeof(msg), "method %s not allowed on %s (allowed: %s)\n", em, eu,
                     allow);
            pf_http_resp_text(&r, 405, msg);
            return send_resp(conn, &r, allow);
        }
        snprintf(msg, sizeof(msg), "no such endpoint: %s\n", eu);
        pf_http_resp_text(&r, 404, msg);
        return send_resp(conn, &r, NULL);
    }
    int deny = pf_http_admin_check(conn, method, s->admin_token);
    if (deny == 403) {
        char msg[300];
        pf_log_ratelimited(PF_LOG_WARN, 5000,
                           "HTTP %s %s refused: caller not on this host and no --admin-token-file",
                           method, url);
        snprintf(msg, sizeof(msg),
                 "%s %s is only served to callers on this host; start the server with "
                 "--admin-token-file FILE to serve remote callers that send 'Authorization: "
                 "Bearer TOKEN'\n",
                 method, url);
        pf_http_resp_text(&r, 403, msg);
        return send_resp(conn, &r, NULL);
    }
    if (deny != 0) {
        pf_log_ratelimited(PF_LOG_WARN, 5000, "HTTP %s %s refused: missing or wrong admin token",
                           method, url);
        return send_unauthorized(conn);
    }
    struct param_check pc = {.allowed = hit->params};
    /* read-only routes without parameters ignore a query (cache busters); routes that take
     * parameters, and every POST, accept only theirs */
    if (hit->params || strcmp(hit->method, "GET") != 0)
        MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, check_param, &pc);
    if (pc.bad[0]) {
        char msg[400];
        snprintf(msg, sizeof(msg), "%s on %s\n", pc.bad, hit->path);
        pf_http_resp_text(&r, 400, msg);
        return send_resp(conn, &r, NULL);
    }
    struct pf_http_req req = {.method = method, .path = url, .conn = conn};
    r.status = 200;
    int rc = hit->fn(s->ctx, &req, &r);
    if (rc) {
        free(r.body);
        memset(&r, 0, sizeof(r));
        char msg[160];
        snprintf(msg, sizeof(msg), "internal error: %s\n", strerror(-rc));
        pf_http_resp_text(&r, 500, msg);
    }
    return send_resp(conn, &r, NULL);
}

int pf_http_server_start(const char *addr, const struct pf_http_route *routes, size_t nroutes,
                         void *ctx, struct pf_http_server **s_p, int *bound_port_p, char *err,
                         size_t errlen)
{
    return pf_http_server_start_auth(addr, routes, nroutes, ctx, NULL, s_p, bound_port_p, err,
                                     errlen);
}

int pf_http_server_start_auth(const char *addr, const struct pf_http_route *routes, size_t nroutes,
                              void *ctx, const char *admin_token, struct pf_http_server **s_p,
                              int *bound_port_p, char *err, size_t errlen)
{
    char host[256];
    uint16_t port;
    if (pf_addr_split(addr, host, sizeof(host), &port) != 0) {
        snprintf(err, errlen, "'%s' is not host:port", addr);
        return -EINVAL;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(g));
        return -EINVAL;
    }
    struct pf_http_server *s = calloc(1, sizeof(*s));
    if (!s) {
        freeaddrinfo(res);
        return -ENOMEM;
    }
    s->routes = routes;
    s->nroutes = nroutes;
    s->ctx = ctx;
    if (admin_token && !(s->admin_token = strdup(admin_token))) {
        freeaddrinfo(res);
        free(s);
        return -ENOMEM;
    }
    /* a fixed pool of polling threads and connection caps: clients cannot make the server
     * start a thread per connection. poll(), not epoll: with epoll this libmicrohttpd misses
     * a client's half-close after a keep-alive answer and holds the connection until its
     * 30 s timeout (found by tests/fuzz/fuzz_http) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (res->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(
        flags, port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, res->ai_addr,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)PF_HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)PF_HTTP_MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)PF_HTTP_MAX_PER_IP, MHD_OPTION_END);
    freeaddrinfo(res);
    if (!s->d) {
        snprintf(err, errlen, "cannot listen on %s (address in use or not local)", addr);
        free(s->admin_token);
        free(s);
        return -EADDRINUSE;
    }
    if (bound_port_p) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
        *bound_port_p = di ? di->port : port;
    }
    *s_p = s;
    return 0;
}

void pf_http_server_stop(struct pf_http_server *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->d);
    if (s->admin_token) {
        memset(s->admin_token, 0, strlen(s->admin_token));
        free(s->admin_token);
    }
    free(s);
}

/* HTTP admin server (libmicrohttpd, one thread per connection so a slow handler never
 * blocks /health). Routes are (method, exact path) pairs; a path that exists with another
 * method answers 405 with an Allow header, an unknown path 404, both with a plain-text
 * body naming the problem. Handlers run on the connection's thread. */
#ifndef PF_HTTP_H
#define PF_HTTP_H

#include <stddef.h>

struct pf_http_req {
    const char *method;
    const char *path;
    void *conn; /* internal: MHD connection, used by pf_http_query */
};

struct pf_http_resp {
    int status;               /* default 200 */
    const char *content_type; /* default "text/plain; charset=utf-8" (static string) */
    char *body;               /* malloc'ed by the handler; the server frees it */
    size_t len;
};

/* Returns 0 (response filled) or -errno (answered 500 with the error text). */
typedef int (*pf_http_handler_fn)(void *ctx, const struct pf_http_req *req,
                                  struct pf_http_resp *resp);

struct pf_http_route {
    const char *method; /* "GET", "POST" */
    const char *path;
    pf_http_handler_fn fn;
    /* Query parameters the route accepts, NULL-terminated; NULL = none. On a POST route or
     * one with parameters, any other key, or a key without "=value", is answered 400 naming
     * it before the handler runs (a typo never falls back to a default such as "all"); a GET
     * route without parameters ignores the query. */
    const char *const *params;
};

struct pf_http_server;

/* addr: host:port (port 0 = pick; see bound_port). Routes are copied by pointer and must
 * outlive the server. */
int pf_http_server_start(const char *addr, const struct pf_http_route *routes, size_t nroutes,
                         void *ctx, struct pf_http_server **s_p, int *bound_port_p, char *err,
                         size_t errlen);
/* The same with an admin token (NULL: none): POST requests without "Authorization: Bearer
 * <admin_token>" answer 401 (docs/security.md). The token is copied. */
int pf_http_server_start_auth(const char *addr, const struct pf_http_route *routes, size_t nroutes,
                              void *ctx, const char *admin_token, struct pf_http_server **s_p,
                              int *bound_port_p, char *err, size_t errlen);
void pf_http_server_stop(struct pf_http_server *s);

/* Query-string argument of the request, or NULL. */
const char *pf_http_query(const struct pf_http_req *req, const char *key);

/* Sets body to a malloc'ed copy of text. */
int pf_http_resp_text(struct pf_http_resp *resp, int status, const char *text);

/* Shared handlers: GET /health -> "ok", GET /metrics -> Prometheus text. */
int pf_http_health(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp);
int pf_http_metrics(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp);

/* pegaflow-server admin handlers; ctx points to a `struct pf_engine *` variable. */
/* GET /health of pegaflow-server (ctx: struct pf_engine **): 200 "ok", or 503 with the
 * reason once the engine lost its GPU (pf_engine_health), so a supervisor restarts it. */
int pf_http_engine_health(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp);
int pf_http_instances(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp);
int pf_http_instances_cleanup(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp);
int pf_http_memory_cleanup(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp);
#endif

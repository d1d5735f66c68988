/* Handlers shared by both binaries. */
#include <errno.h>

#include "pf/http.h"
#include "pf/metrics.h"

int pf_http_health(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp)
{
    return pf_http_resp_text(resp, 200, "ok");
}

int pf_http_metrics(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp)
{
    char *text;
    size_t len;
    int rc = pf_metrics_render(&text, &len);
    if (rc)
        return rc;
    resp->status = 200;
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp->body = text;
    resp->len = len;
    return 0;
}

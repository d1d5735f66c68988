/* pegaflow-server admin endpoints (reference §8.1), JSON via libcjson:
 *   GET  /instances                     {"instances": [...]}
 *   POST /instances/cleanup[?id=ID]     {"removed_instances": [...], "removed_tensors": N}
 *                                       404 when id names no instance
 *   POST /cache/memory/cleanup          {"evicted_blocks", "evicted_bytes",
 *                                        "reclaimed_bytes", "still_referenced_blocks"} */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "http"
#include "http/http_internal.h"
#include "pf/engine.h"
#include "pf/http.h"
#include "pf/log.h"

static int json_resp(struct pf_http_resp *resp, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s)
        return -ENOMEM;
    resp->status = 200;
    resp->content_type = "application/json";
    resp->body = s;
    resp->len = strlen(s);
    return 0;
}

int pf_http_engine_health(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp)
{
    struct pf_engine *e = *(struct pf_engine **)ctx;
    char why[256] = "";
    if (e && pf_engine_health(e, why, sizeof(why)) != 0) {
        char body[300];
        snprintf(body, sizeof(body), "unhealthy: %s\n", why);
        return pf_http_resp_text(resp, 503, body);
    }
    return pf_http_resp_text(resp, 200, "ok");
}

int pf_http_instances(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp)
{
    struct pf_engine *e = *(struct pf_engine **)ctx;
    if (!e)
        return pf_http_resp_text(resp, 503, "engine is not running\n");
    char **ids = NULL;
    size_t n = pf_engine_list_instances(e, &ids);
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "instances");
    for (size_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(arr, cJSON_CreateString(ids[i]));
        free(ids[i]);
    }
    free(ids);
    return json_resp(resp, j);
}

int pf_http_instances_cleanup(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp)
{
    struct pf_engine *e = *(struct pf_engine **)ctx;
    if (!e)
        return pf_http_resp_text(resp, 503, "engine is not running\n");
    const char *id = pf_http_query(req, "id");
    /* "?id=" (an unset variable in a script) must not mean "every instance" */
    if (id && !*id)
        return pf_http_resp_text(resp, 400,
                                 "id is empty: name an instance, or omit id to remove all\n");
    char **removed = NULL;
    size_t nremoved = 0, ntensors = 0;
    int rc = pf_engine_cleanup_instances(e, id, &removed, &nremoved, &ntensors);
    if (rc == -ENOENT) {
        free(removed);
        char msg[300], eid[200];
        pf_http_printable(id, eid, sizeof(eid));
        snprintf(msg, sizeof(msg), "instance %s not found\n", eid);
        return pf_http_resp_text(resp, 404, msg);
    }
    if (rc)
        return rc;
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "removed_instances");
    for (size_t i = 0; i < nremoved; i++) {
        cJSON_AddItemToArray(arr, cJSON_CreateString(removed[i]));
        free(removed[i]);
    }
    free(removed);
    cJSON_AddNumberToObject(j, "removed_tensors", (double)ntensors);
    pf_info("HTTP cleanup removed %zu instance(s), %zu tensor(s)", nremoved, ntensors);
    return json_resp(resp, j);
}

int pf_http_memory_cleanup(void *ctx, const struct pf_http_req *req, struct pf_http_resp *resp)
{
    struct pf_engine *e = *(struct pf_engine **)ctx;
    if (!e)
        return pf_http_resp_text(resp, 503, "engine is not running\n");
    struct pf_engine_cleanup_result r;
    pf_engine_cleanup_memory(e, &r);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "evicted_blocks", (double)r.evicted_blocks);
    cJSON_AddNumberToObject(j, "evicted_bytes", (double)r.evicted_bytes);
    cJSON_AddNumberToObject(j, "reclaimed_bytes", (double)r.reclaimed_bytes);
    cJSON_AddNumberToObject(j, "still_referenced_blocks", (double)r.still_referenced_blocks);
    return json_resp(resp, j);
}

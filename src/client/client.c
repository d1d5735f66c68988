/* libpegaflow: thin wrappers turning flat C arguments into Engine protobuf requests. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/pegaflow.h"
#include "engine.pb-c.h"
#include "pf/common.h"
#include "pf/config.h"
#include "pf/rpc.h"

struct pf_client {
    struct pf_rpc_channel *ch;
};

static __thread struct pf_rpc_status last_err;

int pf_last_error_code(void)
{
    return last_err.code;
}

const char *pf_last_error_message(void)
{
    return last_err.msg;
}

static void set_err(int code, const char *msg)
{
    last_err.code = code;
    snprintf(last_err.msg, sizeof(last_err.msg), "%s", msg);
}

const char *pf_client_version(void)
{
    return PF_VERSION;
}

int pf_client_connect(const char *target, struct pf_client **c_p)
{
    char t[256];
    int rc = pf_url_to_target(target, t, sizeof(t));
    if (rc) {
        set_err(PF_GRPC_INVALID_ARGUMENT, "target is not host:port or http://host:port");
        return -EINVAL;
    }
    struct pf_client *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    rc = pf_rpc_channel_open(t, &c->ch);
    if (rc) {
        free(c);
        set_err(PF_GRPC_INTERNAL, "cannot create channel");
        return rc;
    }
    *c_p = c;
    return 0;
}

void pf_client_close(struct pf_client *c)
{
    if (!c)
        return;
    pf_rpc_channel_close(c->ch);
    free(c);
}

/* Runs one unary call; on a transport/status error records it for pf_last_error_*. */
static int call(struct pf_client *c, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *rd, uint64_t timeout_ms,
                ProtobufCMessage **resp_p)
{
    char path[96];
    snprintf(path, sizeof(path), "/pegaflow.Engine/%s", method);
    int rc = pf_rpc_unary(c->ch, path, req, rd, timeout_ms, resp_p, &last_err);
    return rc;
}

/* Responses with a ResponseStatus whose ok is false count as INTERNAL errors. */
static int check_status(const Pegaflow__ResponseStatus *st)
{
    if (st && !st->ok) {
        set_err(PF_GRPC_INTERNAL, st->message ? st->message : "server reported failure");
        return -EIO;
    }
    return 0;
}

int pf_client_health(struct pf_client *c, uint64_t timeout_ms)
{
    Pegaflow__HealthRequest req = PEGAFLOW__HEALTH_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    int rc = call(c, "Health", &req.base, &pegaflow__health_response__descriptor, timeout_ms,
                  &resp);
    if (rc)
        return rc;
    rc = check_status(((Pegaflow__HealthResponse *)resp)->status);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int pf_client_shutdown(struct pf_client *c, uint64_t timeout_ms)
{
    Pegaflow__ShutdownRequest req = PEGAFLOW__SHUTDOWN_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    int rc = call(c, "Shutdown", &req.base, &pegaflow__shutdown_response__descriptor,
                  timeout_ms, &resp);
    if (rc)
        return rc;
    rc = check_status(((Pegaflow__ShutdownResponse *)resp)->status);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* Handlers of service pegaflow.Engine. Each handler validates its request, calls the
 * engine, and maps engine errors (-errno + message) to gRPC status codes. */
#include <errno.h>
#include <string.h>

#define PF_LOG_MOD "service"
#include "engine.pb-c.h"
#include "pf/log.h"
#include "pf/service.h"

static int h_health(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *req)
{
    Pegaflow__ResponseStatus st = PEGAFLOW__RESPONSE_STATUS__INIT;
    st.ok = 1;
    st.message = "";
    Pegaflow__HealthResponse resp = PEGAFLOW__HEALTH_RESPONSE__INIT;
    resp.status = &st;
    return pf_rpc_respond(call, &resp.base);
}

static int h_shutdown(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *req)
{
    struct pf_engine_service *svc = ctx;
    pf_info("Shutdown requested over gRPC by %s", pf_rpc_call_peer(call));
    if (svc->request_shutdown)
        svc->request_shutdown(svc->app);
    Pegaflow__ResponseStatus st = PEGAFLOW__RESPONSE_STATUS__INIT;
    st.ok = 1;
    st.message = "";
    Pegaflow__ShutdownResponse resp = PEGAFLOW__SHUTDOWN_RESPONSE__INIT;
    resp.status = &st;
    return pf_rpc_respond(call, &resp.base);
}

const struct pf_rpc_method pf_engine_methods[] = {
    {.path = "/pegaflow.Engine/Health",
     .metric_name = "health",
     .req_desc = &pegaflow__health_request__descriptor,
     .unary = h_health},
    {.path = "/pegaflow.Engine/Shutdown",
     .metric_name = "shutdown",
     .req_desc = &pegaflow__shutdown_request__descriptor,
     .unary = h_shutdown},
};
const size_t pf_engine_nmethods = sizeof(pf_engine_methods) / sizeof(pf_engine_methods[0]);

const char *const pf_engine_unimplemented[] = {
    "/pegaflow.Engine/RegisterContextBatch",
    "/pegaflow.Engine/Save",
    "/pegaflow.Engine/Load",
    "/pegaflow.Engine/QueryPrefetch",
    "/pegaflow.Engine/Release",
    "/pegaflow.Engine/UnregisterContext",
    "/pegaflow.Engine/QueryBlocksForTransfer",
    "/pegaflow.Engine/ReleaseTransferLock",
    "/pegaflow.Engine/RdmaHandshake",
    "/pegaflow.Engine/Session",
};
const size_t pf_engine_nunimplemented =
    sizeof(pf_engine_unimplemented) / sizeof(pf_engine_unimplemented[0]);

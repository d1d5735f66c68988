/* Handlers of service pegaflow.Engine. Each handler converts the protobuf request into the
 * engine's plain structures, calls the engine, and maps engine errors (-errno + message)
 * to gRPC status codes (pf_grpc_code_from_errno). Requests are validated here for shape
 * (parallel arrays, descriptor decoding) and in the engine for meaning. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "service"
#include "engine.pb-c.h"
#include "pf/engine.h"
#include "pf/log.h"
#include "pf/p2p.h"
#include "pf/service.h"
#include "pf/tenant.h"
#include "rpc/validate.h"
#include "rpc/wire.h"
#include "rpc/wire_decode.h"

#define ERRLEN 480

static Pegaflow__ResponseStatus ok_status = {
    PROTOBUF_C_MESSAGE_INIT(&pegaflow__response_status__descriptor), 1, (char *)""};

static int fail_errno(struct pf_rpc_call *call, int rc, const char *msg)
{
    return pf_rpc_fail(call, pf_grpc_code_from_errno(rc), "%s", msg);
}

/* The tenant checks of a worker call (pf/tenant.h); 0 or the gRPC code (status set). With
 * no --tenants-file there is nothing to check. tenant (PF_TENANT_NAME_MAX + 1 bytes) gets
 * the caller's tenant, "" without tenants. */
static int tenant_check(struct pf_engine_service *svc, struct pf_rpc_call *call,
                        enum pf_tenant_op op, const char *instance_id, const char *ns, char *tenant)
{
    tenant[0] = '\0';
    if (!svc->tenancy)
        return 0;
    size_t len;
    const void *tok = pf_rpc_call_metadata(call, PF_TENANT_MD, &len);
    char err[ERRLEN];
    int rc =
        pf_tenancy_check(svc->tenancy, op, tok, len, instance_id, ns, tenant, err, sizeof(err));
    if (rc == 0)
        return 0;
    pf_log_ratelimited(PF_LOG_WARN, 5000, "tenant check refused a call from %s: %s",
                       pf_rpc_call_peer(call), err);
    return pf_rpc_fail(call, rc == -ENOKEY ? PF_GRPC_UNAUTHENTICATED : PF_GRPC_PERMISSION_DENIED,
                       "%s", err);
}

static int need_engine(struct pf_engine_service *svc, struct pf_rpc_call *call)
{
    if (!svc->engine)
        return pf_rpc_fail(call, PF_GRPC_UNAVAILABLE, "engine is not running");
    return 0;
}

/* Raw: the request (HealthRequest has no fields) is validated on the wire and never
 * decoded, so a Health call carrying any request's bytes measures the RPC path alone (the
 * QueryPrefetch benchmark's baseline). */
static int h_health(void *ctx, struct pf_rpc_call *call, const uint8_t *data, size_t len)
{
    struct pf_engine_service *svc = ctx;
    char why[256];
    if (svc->engine && pf_engine_health(svc->engine, why, sizeof(why)) != 0)
        return pf_rpc_fail(call, PF_GRPC_UNAVAILABLE, "unhealthy: %s", why);
    Pegaflow__HealthResponse resp = PEGAFLOW__HEALTH_RESPONSE__INIT;
    resp.status = &ok_status;
    return pf_rpc_respond(call, &resp.base);
}

static int h_shutdown(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *req)
{
    struct pf_engine_service *svc = ctx;
    size_t tl;
    if (svc->tenancy && pf_rpc_call_metadata(call, PF_TENANT_MD, &tl))
        return pf_rpc_fail(call, PF_GRPC_PERMISSION_DENIED,
                           "Shutdown is not a tenant RPC (a call with %s is refused)",
                           PF_TENANT_MD);
    pf_info("Shutdown requested over gRPC by %s", pf_rpc_call_peer(call));
    if (svc->request_shutdown)
        svc->request_shutdown(svc->app);
    Pegaflow__ShutdownResponse resp = PEGAFLOW__SHUTDOWN_RESPONSE__INIT;
    resp.status = &ok_status;
    return pf_rpc_respond(call, &resp.base);
}

/* IpcTensor bytes -> pf_ipc_desc. */
static int decode_ipc(const ProtobufCBinaryData *b, size_t i, struct pf_ipc_desc *d, char *err,
                      size_t errlen)
{
    memset(d, 0, sizeof(*d));
    if (b->len >= 2 && b->data[0] == 0x80 && b->data[1] >= 2 && b->data[1] <= 5) {
        snprintf(err, errlen,
                 "wrapper_bytes[%zu] is a Python pickle (the stock PegaFlow connector); this "
                 "server needs IpcTensor descriptors from this project's pegaflow.connector",
                 i);
        return -EINVAL;
    }
    Pegaflow__IpcTensor *t = pegaflow__ipc_tensor__unpack(NULL, b->len, b->data);
    if (!t) {
        snprintf(err, errlen, "wrapper_bytes[%zu] is not a serialized IpcTensor", i);
        return -EINVAL;
    }
    /* the nested descriptor obeys the same string rules as requests (no NUL, capped) */
    char verr[256];
    if (pf_rpc_validate(&pegaflow__ipc_tensor__descriptor, b->data, b->len, verr, sizeof(verr)) !=
        0) {
        snprintf(err, errlen, "wrapper_bytes[%zu]: %s", i, verr);
        pegaflow__ipc_tensor__free_unpacked(t, NULL);
        return -EINVAL;
    }
    int rc = 0;
    d->offset = t->offset;
    d->size = t->size;
    switch (t->kind) {
    case PEGAFLOW__IPC_TENSOR__KIND__CUDA_IPC:
        d->kind = PF_IPC_CUDA;
        if (t->cuda_ipc_handle.len != 64) {
            snprintf(err, errlen,
                     "wrapper_bytes[%zu]: cuda_ipc_handle has %zu bytes, expected 64 (expandable "
                     "segments / VMM handles are not supported)",
                     i, t->cuda_ipc_handle.len);
            rc = -EINVAL;
            break;
        }
        memcpy(d->cuda_handle, t->cuda_ipc_handle.data, 64);
        if (t->device_uuid.len == 16) {
            memcpy(d->device_uuid, t->device_uuid.data, 16);
            d->has_uuid = true;
        } else if (t->device_uuid.len != 0) {
            snprintf(err, errlen, "wrapper_bytes[%zu]: device_uuid must be 16 bytes", i);
            rc = -EINVAL;
        }
        break;
    case PEGAFLOW__IPC_TENSOR__KIND__SIM_SHM:
        d->kind = PF_IPC_SIM_SHM;
        d->sim_device = t->sim_device;
        if (!t->shm_name || !*t->shm_name || strlen(t->shm_name) >= sizeof(d->shm_name)) {
            snprintf(err, errlen, "wrapper_bytes[%zu]: shm_name is empty or too long", i);
            rc = -EINVAL;
            break;
        }
        snprintf(d->shm_name, sizeof(d->shm_name), "%s", t->shm_name);
        break;
    default:
        snprintf(err, errlen, "wrapper_bytes[%zu]: IpcTensor kind %d is not supported", i,
                 (int)t->kind);
        rc = -EINVAL;
    }
    if (rc == 0 && d->size == 0) {
        snprintf(err, errlen, "wrapper_bytes[%zu]: size must be > 0", i);
        rc = -EINVAL;
    }
    pegaflow__ipc_tensor__free_unpacked(t, NULL);
    return rc;
}

static int register_checked(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    const Pegaflow__RegisterContextRequest *r = (const void *)m;
    char err[ERRLEN] = "";
    char tenant[PF_TENANT_NAME_MAX + 1];
    if (need_engine(svc, call))
        return PF_GRPC_UNAVAILABLE;
    int trc = tenant_check(svc, call, PF_TENANT_OP_REGISTER, r->instance_id, r->namespace_, tenant);
    if (trc)
        return trc;
    size_t n = r->n_layer_names;
    if (n == 0)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "layer_names must not be empty");
    if (r->n_wrapper_bytes != n || r->n_num_blocks != n || r->n_bytes_per_block != n ||
        r->n_kv_stride_bytes != n || r->n_segments != n ||
        (r->n_layer_group_ids != 0 && r->n_layer_group_ids != n))
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                           "per-layer arrays must have the same length: layer_names=%zu "
                           "wrapper_bytes=%zu num_blocks=%zu bytes_per_block=%zu "
                           "kv_stride_bytes=%zu segments=%zu layer_group_ids=%zu",
                           n, r->n_wrapper_bytes, r->n_num_blocks, r->n_bytes_per_block,
                           r->n_kv_stride_bytes, r->n_segments, r->n_layer_group_ids);
    struct pf_engine_layer *layers = calloc(n, sizeof(*layers));
    if (!layers)
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        layers[i].name = r->layer_names[i];
        layers[i].num_blocks = r->num_blocks[i];
        layers[i].bytes_per_block = r->bytes_per_block[i];
        layers[i].kv_stride_bytes = r->kv_stride_bytes[i];
        layers[i].segments = r->segments[i];
        layers[i].group_id = r->n_layer_group_ids ? r->layer_group_ids[i] : 0;
        rc = decode_ipc(&r->wrapper_bytes[i], i, &layers[i].ipc, err, sizeof(err));
    }
    if (rc == 0 && pf_rpc_call_expired(call)) {
        /* the caller gave up: opening its tensors would be work for nobody */
        snprintf(err, sizeof(err), "call cancelled or past its deadline before registration");
        rc = -ETIMEDOUT;
    } else if (rc == 0) {
        struct pf_engine_register reg = {
            .instance_id = r->instance_id,
            .namespace_ = r->namespace_,
            .client_version = r->client_version,
            .tp_rank = r->tp_rank,
            .tp_size = r->tp_size,
            .world_size = r->world_size,
            .pp_rank = r->pp_rank,
            .device_id = r->device_id,
            .transfer_mode = (int)r->transfer_mode,
            .page_first = r->page_first,
            .layers = layers,
            .nlayers = n,
        };
        /* version mismatch is checked first, even before descriptors make sense */
        rc = pf_engine_register(svc->engine, &reg, err, sizeof(err));
    } else if (!r->client_version || strcmp(r->client_version, PF_VERSION) != 0) {
        snprintf(err, sizeof(err), "PegaFlow version mismatch: client=%s server=%s",
                 r->client_version && *r->client_version ? r->client_version : "<missing>",
                 PF_VERSION);
        rc = -EPERM;
    }
    free(layers);
    if (rc)
        return fail_errno(call, rc, err);
    if (svc->tenancy)
        pf_tenancy_bind(svc->tenancy, r->instance_id, tenant);
    Pegaflow__RegisterContextResponse resp = PEGAFLOW__REGISTER_CONTEXT_RESPONSE__INIT;
    resp.status = &ok_status;
    return pf_rpc_respond(call, &resp.base);
}

/* With tenants, a Register holds the tenancy's register lock from its check to its bind. */
static int h_register(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    if (!svc->tenancy)
        return register_checked(ctx, call, m);
    pf_tenancy_register_lock(svc->tenancy);
    int rc = register_checked(ctx, call, m);
    pf_tenancy_register_unlock(svc->tenancy);
    return rc;
}

/* SaveRequest decoded in place (rpc/wire_decode.h): the method is raw, after the server's
 * pf_rpc_validate (string and repeated-field rules) passed. */
static int h_save(void *ctx, struct pf_rpc_call *call, const uint8_t *data, size_t len)
{
    struct pf_engine_service *svc = ctx;
    char err[ERRLEN] = "";
    char tenant[PF_TENANT_NAME_MAX + 1];
    if (need_engine(svc, call))
        return PF_GRPC_UNAVAILABLE;
    struct pf_wire_save r;
    int rc = pf_wire_decode_save(data, len, &r);
    if (rc == -ENOMEM)
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    if (rc)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                           "malformed SaveRequest (protobuf decoding failed)");
    rc = tenant_check(svc, call, PF_TENANT_OP_INSTANCE, r.instance_id, NULL, tenant);
    if (rc) {
        pf_wire_save_free(&r);
        return rc;
    }
    rc = pf_engine_save(svc->engine, r.instance_id, r.tp_rank, r.pp_rank, r.device_id, r.layers,
                        r.nlayers, err, sizeof(err));
    pf_wire_save_free(&r);
    if (rc)
        return fail_errno(call, rc, err[0] ? err : strerror(-rc));
    Pegaflow__SaveResponse resp = PEGAFLOW__SAVE_RESPONSE__INIT;
    resp.status = &ok_status;
    return pf_rpc_respond(call, &resp.base);
}

/* QueryRequest decoded in place: the hashes point into the request buffer (a prefix query
 * may carry thousands; protobuf-c would allocate each). The same pass applies
 * pf_rpc_validate's rules (the method sets checks_request, so the server does not walk the
 * bytes a second time): string fields within PF_RPC_MAX_STRING and without a NUL byte,
 * block_hashes within PF_RPC_MAX_REPEATED, the same errors and messages, the first in wire
 * order; a field of the wrong wire type (protobuf-c's unpack would fail) is malformed, but
 * only once the whole message passed those rules, as when validation ran first. */
static int copy_str(const struct pf_wire_field *f, char *out, size_t cap)
{
    if (f->type != 2 || f->len >= cap)
        return -1;
    memcpy(out, f->data, f->len);
    out[f->len] = '\0';
    return 0;
}

/* pf_rpc_validate's string rule for QueryRequest field f (0 or -errno with its message). */
static int check_str(const struct pf_wire_field *f, char *err, size_t errlen)
{
    const ProtobufCMessageDescriptor *d = &pegaflow__query_request__descriptor;
    const char *name = protobuf_c_message_descriptor_get_field(d, f->number)->name;
    if (f->type != 2)
        return 0;
    if (f->len > PF_RPC_MAX_STRING) {
        snprintf(err, errlen, "%s.%s is %zu bytes; string fields are limited to %u bytes",
                 d->short_name, name, f->len, PF_RPC_MAX_STRING);
        return -EMSGSIZE;
    }
    const uint8_t *nul = memchr(f->data, 0, f->len);
    if (nul) {
        snprintf(err, errlen, "%s.%s contains a NUL byte (at offset %zu)", d->short_name, name,
                 (size_t)(nul - f->data));
        return -EINVAL;
    }
    return 0;
}

static void undo_lease(void *ctx, const void *arg, size_t len)
{
    char err[ERRLEN] = "";
    struct pf_bytes lease = {arg, len};
    if (pf_engine_release(ctx, &lease, err, sizeof(err)) == 0)
        pf_debug("a QueryPrefetch caller went away before its answer: lease released");
}

static int h_query(void *ctx, struct pf_rpc_call *call, const uint8_t *data, size_t len)
{
    struct pf_engine_service *svc = ctx;
    char err[ERRLEN] = "";
    if (need_engine(svc, call))
        return PF_GRPC_UNAVAILABLE;
    char inst[1024] = "", req[1024] = "";
    struct pf_engine_query q = {.instance_id = inst, .req_id = req};
    struct pf_wire w = {data, data + len};
    struct pf_wire_field f = {0};
    /* one pass: room for every hash if they are 32 bytes (34 on the wire), grown if not */
    size_t nh = 0, cap = len / 34 + 16;
    struct pf_bytes *hashes = malloc(cap * sizeof(*hashes));
    if (!hashes)
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    int r, vrc = 0;
    bool ok = true;      /* every field of the wire type protobuf-c expects */
    size_t nfields2 = 0; /* block_hashes elements as pf_rpc_validate counts them */
    while ((r = pf_wire_next(&w, &f)) == 1) {
        switch (f.number) {
        case 1:
        case 3:
            if ((vrc = check_str(&f, err, sizeof(err))) != 0)
                break;
            ok = ok && copy_str(&f, f.number == 1 ? inst : req, sizeof(inst)) == 0;
            break;
        case 2:
            if (++nfields2 > PF_RPC_MAX_REPEATED) {
                snprintf(err, sizeof(err), "QueryRequest.block_hashes has more than %u elements",
                         PF_RPC_MAX_REPEATED);
                vrc = -E2BIG;
                break;
            }
            if (f.type != 2 || !ok) {
                ok = false;
                break;
            }
            if (nh == cap) {
                struct pf_bytes *more = realloc(hashes, 2 * cap * sizeof(*hashes));
                if (!more) {
                    free(hashes);
                    return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "out of memory");
                }
                hashes = more;
                cap *= 2;
            }
            hashes[nh++] = (struct pf_bytes){f.data, f.len};
            break;
        case 4:
            ok = ok && f.type == 0;
            q.wait_for_full_prefix = f.varint != 0;
            break;
        case 5:
            ok = ok && f.type == 0 && f.varint <= UINT32_MAX;
            q.group_id = (uint32_t)f.varint;
            break;
        default:
            break; /* unknown fields are skipped, as protobuf does */
        }
        if (vrc)
            break;
    }
    if (vrc) {
        free(hashes);
        return pf_rpc_fail(call, pf_grpc_code_from_errno(vrc), "%s", err);
    }
    if (r < 0 || !ok) {
        free(hashes);
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT,
                           "malformed QueryRequest (protobuf decoding failed)");
    }
    q.hashes = hashes;
    q.n = nh;
    /* A query whose caller already gave up (a deadline passed while the call waited for a
     * handler thread, or a link that came back late) must not pin blocks: its lease would
     * reach nobody and hold the blocks until the lease TTL. */
    if (pf_rpc_call_expired(call)) {
        free(hashes);
        pf_debug("QueryPrefetch %s/%s arrived past its caller's deadline: not run", inst, req);
        return pf_rpc_fail(call, PF_GRPC_DEADLINE_EXCEEDED,
                           "the caller's deadline passed before the query ran");
    }
    char tenant[PF_TENANT_NAME_MAX + 1];
    int trc = tenant_check(svc, call, PF_TENANT_OP_INSTANCE, inst, NULL, tenant);
    if (trc) {
        free(hashes);
        return trc;
    }
    struct pf_engine_query_result res;
    int rc = pf_engine_query(svc->engine, &q, &res, err, sizeof(err));
    free(hashes);
    if (rc)
        return fail_errno(call, rc, err);
    if (svc->tenancy && !res.loading)
        pf_tenancy_count_hits(svc->tenancy, tenant, res.num_hit_blocks);
    /* a caller that is gone by the time the answer leaves never learns the lease: release
     * it then instead of leaving the blocks pinned until the lease TTL */
    if (res.has_lease)
        (void)pf_rpc_call_on_cancel(call, undo_lease, svc->engine, res.lease, sizeof(res.lease));
    Pegaflow__QueryResponse resp = PEGAFLOW__QUERY_RESPONSE__INIT;
    Pegaflow__QueryLoading loading = PEGAFLOW__QUERY_LOADING__INIT;
    Pegaflow__QueryReady ready = PEGAFLOW__QUERY_READY__INIT;
    if (res.loading) {
        resp.result_case = PEGAFLOW__QUERY_RESPONSE__RESULT_LOADING;
        resp.loading = &loading;
    } else {
        resp.result_case = PEGAFLOW__QUERY_RESPONSE__RESULT_READY;
        resp.ready = &ready;
        ready.num_hit_blocks = res.num_hit_blocks;
        if (res.has_lease) {
            ready.lease.data = res.lease;
            ready.lease.len = sizeof(res.lease);
        }
        ready.hit_positions = res.hit_positions;
        ready.n_hit_positions = res.nhit_positions;
    }
    pf_rpc_respond(call, &resp.base);
    free(res.hit_positions);
    return 0;
}

static int h_release(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    const Pegaflow__ReleaseRequest *r = (const void *)m;
    char err[ERRLEN] = "";
    char tenant[PF_TENANT_NAME_MAX + 1];
    if (need_engine(svc, call))
        return PF_GRPC_UNAVAILABLE;
    int trc = tenant_check(svc, call, PF_TENANT_OP_ANY, NULL, NULL, tenant);
    if (trc)
        return trc;
    struct pf_bytes lease = {r->lease.data, r->lease.len};
    int rc = pf_engine_release(svc->engine, &lease, err, sizeof(err));
    if (rc)
        return fail_errno(call, rc, err);
    Pegaflow__ReleaseResponse resp = PEGAFLOW__RELEASE_RESPONSE__INIT;
    return pf_rpc_respond(call, &resp.base);
}

static int h_load(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    const Pegaflow__LoadRequest *r = (const void *)m;
    char err[ERRLEN] = "";
    char tenant[PF_TENANT_NAME_MAX + 1];
    if (need_engine(svc, call))
        return PF_GRPC_UNAVAILABLE;
    int trc = tenant_check(svc, call, PF_TENANT_OP_INSTANCE, r->instance_id, NULL, tenant);
    if (trc)
        return trc;
    int rc = 0;
    struct pf_engine_load_group *groups = calloc(r->n_groups ? r->n_groups : 1, sizeof(*groups));
    struct pf_engine_load_lease *loads = calloc(r->n_loads ? r->n_loads : 1, sizeof(*loads));
    if (!groups || !loads) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t g = 0; g < r->n_groups; g++) {
        groups[g].layer_names = (const char *const *)r->groups[g]->layer_names;
        groups[g].n = r->groups[g]->n_layer_names;
    }
    for (size_t i = 0; i < r->n_loads; i++) {
        const Pegaflow__LeaseLoad *ll = r->loads[i];
        loads[i].lease = (struct pf_bytes){ll->lease.data, ll->lease.len};
        loads[i].ngroups = ll->n_block_ids_by_group;
        struct pf_engine_load_targets *t =
            calloc(ll->n_block_ids_by_group ? ll->n_block_ids_by_group : 1, sizeof(*t));
        loads[i].by_group = t;
        if (!t) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t g = 0; g < ll->n_block_ids_by_group; g++) {
            const Pegaflow__LoadBlockIds *ids = ll->block_ids_by_group[g];
            int64_t *v = malloc((ids->n_targets ? ids->n_targets : 1) * sizeof(*v));
            if (!v) {
                rc = -ENOMEM;
                goto out;
            }
            for (size_t k = 0; k < ids->n_targets; k++)
                v[k] = ids->targets[k]->target_case == PEGAFLOW__LOAD_BLOCK_TARGET__TARGET_BLOCK_ID
                           ? (int64_t)ids->targets[k]->block_id
                           : -1;
            t[g].block_ids = v;
            t[g].n = ids->n_targets;
        }
    }
    struct pf_engine_load l = {
        .instance_id = r->instance_id,
        .tp_rank = r->tp_rank,
        .device_id = r->device_id,
        .load_state_shm = r->load_state_shm,
        .groups = groups,
        .ngroups = r->n_groups,
        .loads = loads,
        .nloads = r->n_loads,
    };
    rc = pf_engine_load(svc->engine, &l, err, sizeof(err));
out:
    for (size_t i = 0; loads && i < r->n_loads; i++) {
        for (size_t g = 0; loads[i].by_group && g < loads[i].ngroups; g++)
            free((void *)loads[i].by_group[g].block_ids);
        free((void *)loads[i].by_group);
    }
    free(loads);
    free(groups);
    if (rc)
        return fail_errno(call, rc, err[0] ? err : strerror(-rc));
    Pegaflow__LoadResponse resp = PEGAFLOW__LOAD_RESPONSE__INIT;
    resp.status = &ok_status;
    return pf_rpc_respond(call, &resp.base);
}

static int h_unregister(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    const Pegaflow__UnregisterRequest *r = (const void *)m;
    char err[ERRLEN] = "";
    char tenant[PF_TENANT_NAME_MAX + 1];
    if (need_engine(svc, call))
        return PF_GRPC_UNAVAILABLE;
    int trc = tenant_check(svc, call, PF_TENANT_OP_INSTANCE, r->instance_id, NULL, tenant);
    if (trc)
        return trc;
    int rc = pf_engine_unregister(svc->engine, r->instance_id, err, sizeof(err));
    if (rc)
        return fail_errno(call, rc, err);
    Pegaflow__UnregisterResponse resp = PEGAFLOW__UNREGISTER_RESPONSE__INIT;
    resp.status = &ok_status;
    return pf_rpc_respond(call, &resp.base);
}

struct session_ctx {
    char *instance;
    uint64_t token;
    bool watch; /* owns no instance: nothing to clean up */
};

static int s_session_open(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m,
                          void **stream_ctx_p)
{
    struct pf_engine_service *svc = ctx;
    const Pegaflow__SessionRequest *r = (const void *)m;
    if (need_engine(svc, call))
        return PF_GRPC_UNAVAILABLE;
    if (r->watch) {
        /* a worker watching this process's life: ends only with the stream */
        struct session_ctx *w = calloc(1, sizeof(*w));
        if (!w || !(w->instance = strdup(r->instance_id ? r->instance_id : ""))) {
            free(w);
            return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        }
        w->watch = true;
        pf_debug("watch session opened (instance '%s') from %s", w->instance,
                 pf_rpc_call_peer(call));
        *stream_ctx_p = w;
        return 0;
    }
    if (!r->instance_id || !*r->instance_id)
        return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "instance_id must not be empty");
    char tenant[PF_TENANT_NAME_MAX + 1];
    int trc = tenant_check(svc, call, PF_TENANT_OP_SESSION, r->instance_id, NULL, tenant);
    if (trc)
        return trc;
    struct session_ctx *s = calloc(1, sizeof(*s));
    if (!s || !(s->instance = strdup(r->instance_id))) {
        free(s);
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    }
    int rc = pf_engine_session_open(svc->engine, r->instance_id, &s->token);
    if (rc) {
        free(s->instance);
        free(s);
        return pf_rpc_fail(call, PF_GRPC_RESOURCE_EXHAUSTED, "cannot open session");
    }
    pf_info("session opened for instance %s (token %llu) from %s", r->instance_id,
            (unsigned long long)s->token, pf_rpc_call_peer(call));
    *stream_ctx_p = s;
    return 0;
}

static void s_session_closed(void *ctx, void *stream_ctx, bool cancelled)
{
    struct pf_engine_service *svc = ctx;
    struct session_ctx *s = stream_ctx;
    if (svc->engine && !svc->stopping && !s->watch)
        pf_engine_session_close(svc->engine, s->instance, s->token);
    free(s->instance);
    free(s);
}

static int h_p2p_unconfigured(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    return pf_rpc_fail(call, PF_GRPC_FAILED_PRECONDITION,
                       "RDMA transfer engine is not configured on this node (start it with "
                       "--nics and --metaserver-addr)");
}

static int h_handshake(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    if (!svc->p2p)
        return h_p2p_unconfigured(ctx, call, m);
    return pf_p2p_rpc_handshake(svc->p2p, call, m);
}

static int h_query_blocks(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    if (!svc->p2p)
        return h_p2p_unconfigured(ctx, call, m);
    return pf_p2p_rpc_query_blocks(svc->p2p, call, m);
}

static int h_release_lock(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    struct pf_engine_service *svc = ctx;
    if (!svc->p2p)
        return h_p2p_unconfigured(ctx, call, m);
    return pf_p2p_rpc_release_lock(svc->p2p, call, m);
}

const struct pf_rpc_method pf_engine_methods[] = {
    {.path = "/pegaflow.Engine/Health",
     .metric_name = "health",
     .req_desc = &pegaflow__health_request__descriptor,
     .raw = h_health},
    {.path = "/pegaflow.Engine/Shutdown",
     .metric_name = "shutdown",
     .req_desc = &pegaflow__shutdown_request__descriptor,
     .unary = h_shutdown},
    {.path = "/pegaflow.Engine/RegisterContextBatch",
     .metric_name = "register_context_batch",
     .req_desc = &pegaflow__register_context_request__descriptor,
     .unary = h_register},
    {.path = "/pegaflow.Engine/Save",
     .metric_name = "save",
     .req_desc = &pegaflow__save_request__descriptor,
     .raw = h_save},
    {.path = "/pegaflow.Engine/Load",
     .metric_name = "load",
     .req_desc = &pegaflow__load_request__descriptor,
     .unary = h_load},
    {.path = "/pegaflow.Engine/QueryPrefetch",
     .metric_name = "query_prefetch",
     .req_desc = &pegaflow__query_request__descriptor,
     .raw = h_query,
     .checks_request = true},
    {.path = "/pegaflow.Engine/Release",
     .metric_name = "release",
     .req_desc = &pegaflow__release_request__descriptor,
     .unary = h_release},
    {.path = "/pegaflow.Engine/UnregisterContext",
     .metric_name = "unregister_context",
     .req_desc = &pegaflow__unregister_request__descriptor,
     .unary = h_unregister},
    {.path = "/pegaflow.Engine/Session",
     .metric_name = "session",
     .req_desc = &pegaflow__session_request__descriptor,
     .stream_open = s_session_open,
     .stream_closed = s_session_closed},
    {.path = "/pegaflow.Engine/QueryBlocksForTransfer",
     .metric_name = "query_blocks_for_transfer",
     .req_desc = &pegaflow__query_blocks_for_transfer_request__descriptor,
     .unary = h_query_blocks},
    {.path = "/pegaflow.Engine/ReleaseTransferLock",
     .metric_name = "release_transfer_lock",
     .req_desc = &pegaflow__release_transfer_lock_request__descriptor,
     .unary = h_release_lock},
    {.path = "/pegaflow.Engine/RdmaHandshake",
     .metric_name = "rdma_handshake",
     .req_desc = &pegaflow__rdma_handshake_request__descriptor,
     .unary = h_handshake,
     .network = true},
};
const size_t pf_engine_nmethods = sizeof(pf_engine_methods) / sizeof(pf_engine_methods[0]);

/* libpegaflow: thin wrappers turning flat C arguments into Engine protobuf requests. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/pegaflow.h"
#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/common.h"
#include "pf/config.h"
#include "pf/rpc.h"
#include "rpc/wire.h"

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

void pf_clientlib_local_error(int rc, const char *what);

/* A failure decided in this process (no RPC): the status says so, so the thread's previous
 * status never looks like this call's. Returns rc. */
static int local_err(int rc, const char *what)
{
    last_err.code = PF_GRPC_UNKNOWN;
    snprintf(last_err.msg, sizeof(last_err.msg), "%s: %s", what, strerror(rc < 0 ? -rc : rc));
    return rc;
}

void pf_clientlib_local_error(int rc, const char *what)
{
    local_err(rc, what);
}

const char *pf_client_version(void)
{
    return PF_VERSION;
}

int pf_client_connect(const char *target, struct pf_client **c_p)
{
    char t[256];
    int rc;
    if (strncmp(target, "unix:", 5) == 0 && target[5] && strlen(target) < sizeof(t))
        snprintf(t, sizeof(t), "%s", target); /* the server's --local-addr */
    else if ((rc = pf_url_to_target(target, t, sizeof(t))) != 0) {
        set_err(PF_GRPC_INVALID_ARGUMENT, "target is not host:port, http://host:port or unix:PATH");
        return -EINVAL;
    }
    /* security from the environment: PEGAFLOW_TLS_CA, PEGAFLOW_TLS_CERT/KEY,
     * PEGAFLOW_TOKEN_FILE (docs/security.md) */
    struct pf_auth_env env;
    struct pf_rpc_channel_opts o;
    char aerr[PF_RPC_ERRMSG];
    rc = pf_auth_env_load(&env, &o, aerr, sizeof(aerr));
    if (rc) {
        set_err(PF_GRPC_INVALID_ARGUMENT, aerr);
        return -EINVAL; /* matches the recorded status (an unreadable file is a bad setting) */
    }
    /* every failure of a libpegaflow call is final for its caller (the connector turns a
     * failed query into a miss and recomputes what a failed save or load left out), so no
     * call pays for gRPC's retry buffering (pf/auth.h lean_calls) */
    o.lean_calls = true;
    struct pf_client *c = calloc(1, sizeof(*c));
    if (!c) {
        pf_auth_env_free(&env);
        return local_err(-ENOMEM, "pf_client_connect");
    }
    rc = pf_rpc_channel_open_opts(t, &o, &c->ch);
    pf_auth_env_free(&env); /* the channel keeps its own copies */
    if (rc) {
        free(c);
        return local_err(rc, "cannot create a gRPC channel");
    }
    set_err(PF_GRPC_OK, "");
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
    int rc =
        call(c, "Health", &req.base, &pegaflow__health_response__descriptor, timeout_ms, &resp);
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
    int rc =
        call(c, "Shutdown", &req.base, &pegaflow__shutdown_response__descriptor, timeout_ms, &resp);
    if (rc)
        return rc;
    rc = check_status(((Pegaflow__ShutdownResponse *)resp)->status);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* ---- Engine RPCs ---- */

static ProtobufCBinaryData *hash_list(const uint8_t *hashes, const uint32_t *lens, uint32_t len,
                                      size_t n)
{
    ProtobufCBinaryData *v = calloc(n ? n : 1, sizeof(*v));
    if (!v)
        return NULL;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : len;
        v[i].data = (uint8_t *)hashes + off;
        v[i].len = l;
        off += l;
    }
    return v;
}

int pf_client_register(struct pf_client *c, const struct pf_register_args *a, uint64_t timeout_ms)
{
    Pegaflow__RegisterContextRequest req = PEGAFLOW__REGISTER_CONTEXT_REQUEST__INIT;
    size_t n = a->nlayers;
    int rc = -ENOMEM;
    char **names = calloc(n ? n : 1, sizeof(*names));
    ProtobufCBinaryData *wr = calloc(n ? n : 1, sizeof(*wr));
    uint64_t *nb = calloc(n ? n : 1, sizeof(*nb)), *bpb = calloc(n ? n : 1, sizeof(*bpb)),
             *kvs = calloc(n ? n : 1, sizeof(*kvs));
    uint32_t *seg = calloc(n ? n : 1, sizeof(*seg)), *grp = calloc(n ? n : 1, sizeof(*grp));
    if (!names || !wr || !nb || !bpb || !kvs || !seg || !grp) {
        local_err(-ENOMEM, "pf_client_register");
        goto out;
    }
    bool any_group = false;
    for (size_t i = 0; i < n; i++) {
        names[i] = (char *)a->layers[i].name;
        wr[i].data = (uint8_t *)a->layers[i].ipc;
        wr[i].len = a->layers[i].ipc_len;
        nb[i] = a->layers[i].num_blocks;
        bpb[i] = a->layers[i].bytes_per_block;
        kvs[i] = a->layers[i].kv_stride_bytes;
        seg[i] = a->layers[i].segments;
        grp[i] = a->layers[i].group_id;
        any_group |= grp[i] != 0;
    }
    req.instance_id = (char *)a->instance_id;
    req.namespace_ = (char *)a->namespace_;
    req.tp_rank = a->tp_rank;
    req.tp_size = a->tp_size;
    req.world_size = a->world_size;
    req.pp_rank = a->pp_rank;
    req.device_id = a->device_id;
    req.client_version = (char *)(a->client_version ? a->client_version : PF_VERSION);
    req.transfer_mode = (Pegaflow__TransferMode)a->transfer_mode;
    req.page_first = a->page_first != 0;
    req.n_layer_names = n;
    req.layer_names = names;
    req.n_wrapper_bytes = n;
    req.wrapper_bytes = wr;
    req.n_num_blocks = n;
    req.num_blocks = nb;
    req.n_bytes_per_block = n;
    req.bytes_per_block = bpb;
    req.n_kv_stride_bytes = n;
    req.kv_stride_bytes = kvs;
    req.n_segments = n;
    req.segments = seg;
    req.n_layer_group_ids = any_group ? n : 0;
    req.layer_group_ids = grp;
    ProtobufCMessage *resp = NULL;
    rc = call(c, "RegisterContextBatch", &req.base,
              &pegaflow__register_context_response__descriptor, timeout_ms, &resp);
    if (rc == 0) {
        rc = check_status(((Pegaflow__RegisterContextResponse *)resp)->status);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
out:
    free(names);
    free(wr);
    free(nb);
    free(bpb);
    free(kvs);
    free(seg);
    free(grp);
    return rc;
}

int pf_client_save(struct pf_client *c, const char *instance_id, uint32_t tp_rank, uint32_t pp_rank,
                   int32_t device_id, const struct pf_save_layer *layers, size_t nlayers,
                   uint64_t timeout_ms)
{
    Pegaflow__SaveRequest req = PEGAFLOW__SAVE_REQUEST__INIT;
    Pegaflow__SaveLayer *sl = calloc(nlayers ? nlayers : 1, sizeof(*sl));
    Pegaflow__SaveLayer **slp = calloc(nlayers ? nlayers : 1, sizeof(*slp));
    int rc = -ENOMEM;
    if (!sl || !slp) {
        local_err(-ENOMEM, "pf_client_save");
        goto out;
    }
    for (size_t i = 0; i < nlayers; i++) {
        pegaflow__save_layer__init(&sl[i]);
        sl[i].layer_name = (char *)layers[i].name;
        sl[i].n_block_ids = layers[i].n;
        sl[i].block_ids = (uint32_t *)layers[i].block_ids;
        sl[i].n_block_hashes = layers[i].n;
        sl[i].block_hashes =
            hash_list(layers[i].hashes, layers[i].hash_lens, layers[i].hash_len, layers[i].n);
        if (!sl[i].block_hashes)
            goto out;
        slp[i] = &sl[i];
    }
    req.instance_id = (char *)instance_id;
    req.tp_rank = tp_rank;
    req.pp_rank = pp_rank;
    req.device_id = device_id;
    req.n_saves = nlayers;
    req.saves = slp;
    ProtobufCMessage *resp = NULL;
    rc = call(c, "Save", &req.base, &pegaflow__save_response__descriptor, timeout_ms, &resp);
    if (rc == 0) {
        rc = check_status(((Pegaflow__SaveResponse *)resp)->status);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
out:
    if (rc == -ENOMEM)
        local_err(rc, "pf_client_save");
    for (size_t i = 0; sl && i < nlayers; i++)
        free(sl[i].block_hashes);
    free(sl);
    free(slp);
    return rc;
}

int pf_client_query(struct pf_client *c, const char *instance_id, const char *req_id,
                    const uint8_t *hashes, const uint32_t *hash_lens, uint32_t hash_len, size_t n,
                    int wait_for_full_prefix, uint32_t group_id, struct pf_query_result *out,
                    uint32_t *hit_positions, size_t hit_cap, uint64_t timeout_ms)
{
    memset(out, 0, sizeof(*out));
    size_t len = 0;
    uint8_t *req = pf_wire_encode_query(instance_id, req_id, hashes, hash_lens, hash_len, n,
                                        wait_for_full_prefix != 0, group_id, &len);
    if (!req)
        return local_err(-ENOMEM, "pf_client_query");
    ProtobufCMessage *resp = NULL;
    int rc = pf_rpc_unary_take(c->ch, "/pegaflow.Engine/QueryPrefetch", req, len,
                               &pegaflow__query_response__descriptor, timeout_ms, &resp, &last_err);
    if (rc)
        return rc;
    Pegaflow__QueryResponse *r = (Pegaflow__QueryResponse *)resp;
    if (r->result_case == PEGAFLOW__QUERY_RESPONSE__RESULT_LOADING) {
        out->loading = 1;
    } else if (r->result_case == PEGAFLOW__QUERY_RESPONSE__RESULT_READY && r->ready &&
               r->ready->num_hit_blocks > UINT32_MAX) {
        /* uint64 on the wire (the reference's type); one query's hits always fit uint32 */
        set_err(PF_GRPC_INTERNAL, "server returned more hits than a query can hold");
        rc = -EPROTO;
    } else if (r->result_case == PEGAFLOW__QUERY_RESPONSE__RESULT_READY && r->ready) {
        out->num_hit_blocks = (uint32_t)r->ready->num_hit_blocks;
        if (r->ready->lease.len > 0) {
            if (r->ready->lease.len != PF_LEASE_LEN) {
                set_err(PF_GRPC_INTERNAL, "server returned a lease of unexpected length");
                rc = -EPROTO;
            } else {
                memcpy(out->lease, r->ready->lease.data, PF_LEASE_LEN);
                out->lease_len = PF_LEASE_LEN;
            }
        }
        out->nhit_positions = (uint32_t)r->ready->n_hit_positions;
        for (size_t i = 0; hit_positions && i < r->ready->n_hit_positions && i < hit_cap; i++)
            hit_positions[i] = r->ready->hit_positions[i];
    } else {
        set_err(PF_GRPC_INTERNAL, "QueryResponse has neither loading nor ready");
        rc = -EPROTO;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int pf_client_release(struct pf_client *c, const uint8_t *lease, uint32_t lease_len,
                      uint64_t timeout_ms)
{
    Pegaflow__ReleaseRequest req = PEGAFLOW__RELEASE_REQUEST__INIT;
    req.lease.data = (uint8_t *)lease;
    req.lease.len = lease_len;
    ProtobufCMessage *resp = NULL;
    int rc =
        call(c, "Release", &req.base, &pegaflow__release_response__descriptor, timeout_ms, &resp);
    if (rc == 0)
        protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

int pf_client_load(struct pf_client *c, const char *instance_id, uint32_t tp_rank,
                   int32_t device_id, const char *load_state_shm, const char *const *layer_names,
                   const size_t *group_sizes, size_t ngroups, const struct pf_load_item *items,
                   size_t nitems, uint64_t timeout_ms)
{
    Pegaflow__LoadRequest req = PEGAFLOW__LOAD_REQUEST__INIT;
    int rc = -ENOMEM;
    Pegaflow__LoadGroup *groups = calloc(ngroups ? ngroups : 1, sizeof(*groups));
    Pegaflow__LoadGroup **gp = calloc(ngroups ? ngroups : 1, sizeof(*gp));
    Pegaflow__LeaseLoad *loads = calloc(nitems ? nitems : 1, sizeof(*loads));
    Pegaflow__LeaseLoad **lp = calloc(nitems ? nitems : 1, sizeof(*lp));
    size_t ntargets = 0;
    for (size_t i = 0; i < nitems; i++)
        for (size_t g = 0; g < ngroups; g++)
            ntargets += items[i].group_counts[g];
    Pegaflow__LoadBlockIds *ids = calloc(nitems * ngroups + 1, sizeof(*ids));
    Pegaflow__LoadBlockIds **idp = calloc(nitems * ngroups + 1, sizeof(*idp));
    Pegaflow__LoadBlockTarget *tg = calloc(ntargets + 1, sizeof(*tg));
    Pegaflow__LoadBlockTarget **tgp = calloc(ntargets + 1, sizeof(*tgp));
    if (!groups || !gp || !loads || !lp || !ids || !idp || !tg || !tgp) {
        local_err(-ENOMEM, "pf_client_load");
        goto out;
    }
    size_t off = 0;
    for (size_t g = 0; g < ngroups; g++) {
        pegaflow__load_group__init(&groups[g]);
        groups[g].layer_names = (char **)layer_names + off;
        groups[g].n_layer_names = group_sizes[g];
        off += group_sizes[g];
        gp[g] = &groups[g];
    }
    size_t ti = 0;
    for (size_t i = 0; i < nitems; i++) {
        pegaflow__lease_load__init(&loads[i]);
        loads[i].lease.data = (uint8_t *)items[i].lease;
        loads[i].lease.len = items[i].lease_len;
        loads[i].n_block_ids_by_group = ngroups;
        loads[i].block_ids_by_group = &idp[i * ngroups];
        size_t toff = 0;
        for (size_t g = 0; g < ngroups; g++) {
            Pegaflow__LoadBlockIds *b = &ids[i * ngroups + g];
            pegaflow__load_block_ids__init(b);
            b->n_targets = items[i].group_counts[g];
            b->targets = &tgp[ti];
            for (size_t k = 0; k < items[i].group_counts[g]; k++) {
                Pegaflow__LoadBlockTarget *t = &tg[ti];
                pegaflow__load_block_target__init(t);
                int64_t v = items[i].targets[toff + k];
                if (v >= 0) {
                    t->target_case = PEGAFLOW__LOAD_BLOCK_TARGET__TARGET_BLOCK_ID;
                    t->block_id = (uint32_t)v;
                }
                tgp[ti++] = t;
            }
            toff += items[i].group_counts[g];
            idp[i * ngroups + g] = b;
        }
        lp[i] = &loads[i];
    }
    req.instance_id = (char *)instance_id;
    req.tp_rank = tp_rank;
    req.device_id = device_id;
    req.load_state_shm = (char *)load_state_shm;
    req.n_groups = ngroups;
    req.groups = gp;
    req.n_loads = nitems;
    req.loads = lp;
    ProtobufCMessage *resp = NULL;
    rc = call(c, "Load", &req.base, &pegaflow__load_response__descriptor, timeout_ms, &resp);
    if (rc == 0) {
        rc = check_status(((Pegaflow__LoadResponse *)resp)->status);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
out:
    free(groups);
    free(gp);
    free(loads);
    free(lp);
    free(ids);
    free(idp);
    free(tg);
    free(tgp);
    return rc;
}

int pf_client_unregister(struct pf_client *c, const char *instance_id, uint64_t timeout_ms)
{
    Pegaflow__UnregisterRequest req = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    req.instance_id = (char *)instance_id;
    ProtobufCMessage *resp = NULL;
    int rc = call(c, "UnregisterContext", &req.base, &pegaflow__unregister_response__descriptor,
                  timeout_ms, &resp);
    if (rc == 0) {
        rc = check_status(((Pegaflow__UnregisterResponse *)resp)->status);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    return rc;
}

struct pf_session {
    struct pf_rpc_stream *s;
};

/* Opens the Session stream of req (a Session or a watch); *s_p on success. */
static int session_stream_open(struct pf_client *c, Pegaflow__SessionRequest *req, const char *what,
                               uint64_t timeout_ms, struct pf_session **s_p)
{
    struct pf_session *s = calloc(1, sizeof(*s));
    if (!s)
        return local_err(-ENOMEM, what);
    int rc = pf_rpc_stream_open(c->ch, "/pegaflow.Engine/Session", &req->base, timeout_ms, &s->s,
                                &last_err);
    if (rc) {
        free(s);
        return rc;
    }
    *s_p = s;
    return 0;
}

int pf_client_session_open(struct pf_client *c, const char *instance_id, const char *namespace_,
                           uint32_t tp_size, uint32_t world_size, uint64_t timeout_ms,
                           struct pf_session **s_p)
{
    Pegaflow__SessionRequest req = PEGAFLOW__SESSION_REQUEST__INIT;
    req.instance_id = (char *)instance_id;
    req.namespace_ = (char *)namespace_;
    req.tp_size = tp_size;
    req.world_size = world_size;
    return session_stream_open(c, &req, "pf_client_session_open", timeout_ms, s_p);
}

void pf_client_reconnect(struct pf_client *c)
{
    if (c)
        pf_rpc_channel_reconnect(c->ch);
}

int pf_client_watch_open(struct pf_client *c, const char *instance_id, uint64_t timeout_ms,
                         struct pf_session **s_p)
{
    Pegaflow__SessionRequest req = PEGAFLOW__SESSION_REQUEST__INIT;
    req.instance_id = (char *)(instance_id ? instance_id : "");
    req.namespace_ = (char *)"";
    req.watch = 1;
    return session_stream_open(c, &req, "pf_client_watch_open", timeout_ms, s_p);
}

int pf_client_session_alive(struct pf_session *s)
{
    return s && pf_rpc_stream_alive(s->s) ? 1 : 0;
}

void pf_client_session_close(struct pf_session *s)
{
    if (!s)
        return;
    pf_rpc_stream_close(s->s);
    free(s);
}

/* ---- IpcTensor builders ---- */

static int pack_ipc(Pegaflow__IpcTensor *t, uint8_t *buf, size_t cap, size_t *len_p)
{
    size_t n = protobuf_c_message_get_packed_size(&t->base);
    *len_p = n;
    if (n > cap)
        return local_err(-ENOSPC, "IpcTensor buffer too small");
    protobuf_c_message_pack(&t->base, buf);
    set_err(PF_GRPC_OK, "");
    return 0;
}

int pf_client_ipc_cuda(const uint8_t uuid[16], const uint8_t handle[64], uint64_t offset,
                       uint64_t size, uint8_t *buf, size_t cap, size_t *len_p)
{
    Pegaflow__IpcTensor t = PEGAFLOW__IPC_TENSOR__INIT;
    t.kind = PEGAFLOW__IPC_TENSOR__KIND__CUDA_IPC;
    t.device_uuid.data = (uint8_t *)uuid;
    t.device_uuid.len = 16;
    t.cuda_ipc_handle.data = (uint8_t *)handle;
    t.cuda_ipc_handle.len = 64;
    t.offset = offset;
    t.size = size;
    return pack_ipc(&t, buf, cap, len_p);
}

int pf_client_ipc_sim(const char *shm_name, int sim_device, uint64_t offset, uint64_t size,
                      uint8_t *buf, size_t cap, size_t *len_p)
{
    Pegaflow__IpcTensor t = PEGAFLOW__IPC_TENSOR__INIT;
    t.kind = PEGAFLOW__IPC_TENSOR__KIND__SIM_SHM;
    t.shm_name = (char *)shm_name;
    t.sim_device = sim_device;
    t.offset = offset;
    t.size = size;
    return pack_ipc(&t, buf, cap, len_p);
}

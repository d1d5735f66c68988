/* gRPC client side: channels, unary calls with deadlines, held-open server streams.
 * Unary calls use a per-thread pluck completion queue (created on first use, destroyed
 * at thread exit), so concurrent callers never contend on one queue; a split-phase call
 * (pf_rpc_unary_start/finish) is tagged with its own record, so one thread may have several
 * in flight on that queue.
 * Security (pf/auth.h): a channel is plaintext or TLS (with a client certificate for mutual
 * TLS) and may carry the cluster token as initial metadata of every call; channels opened
 * with pf_rpc_channel_open take the process-wide defaults. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#define PF_LOG_MOD "rpc"
#include "pf/auth.h"
#include "pf/log.h"
#include "pf/rpc.h"
#include "rpc/rpc_internal.h"

struct pf_rpc_channel {
    grpc_channel *ch;
    char *target;
    char *token;        /* cluster token sent on every call, or NULL */
    char *tenant_token; /* tenant token (pf-tenant-token), or NULL */
    grpc_metadata md[2];
    size_t nmd;
};

/* process-wide defaults of pf_rpc_channel_open (under def_mu) */
static pthread_mutex_t def_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pf_rpc_channel_opts def_opts;
static char *def_strs[4];

struct pf_rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    grpc_metadata_array imd, tmd;
    grpc_status_code status;
    grpc_slice details;
    grpc_byte_buffer *req;
    bool ended;
    int tag_start, tag_status;
};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int init_refs;

/* absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore), looked up by name
 * (absl is C++; the names are its mangled ones, with the inline namespaces of Debian's and
 * of upstream's release builds). abseil's Mutex checks every Lock against a global graph of
 * lock orders unless built with NDEBUG; Debian's libabsl is built without it, so every
 * absl::Mutex lock inside gRPC (about 20 per unary call) took a global lock and a graph
 * lookup: ~10 % of a client call's instructions (callgrind, bench/README.md "connector").
 * Release builds of abseil default to kIgnore; this makes the process behave as one. */
static bool absl_checks_off; /* under init_mu */

static void absl_deadlock_detection_off(void)
{
    static const char *const names[] = {
        "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl12lts_2022062329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl29SetMutexDeadlockDetectionModeENS_15OnDeadlockCycleE",
    };
    /* the global scope (a program linked with gRPC), else gRPC's own dependencies (this
     * library dlopen()ed RTLD_LOCAL, as Python's ctypes does) */
    void *scopes[2] = {RTLD_DEFAULT, NULL};
    Dl_info info;
    void (*grpc_fn)(void) = grpc_init;
    void *grpc_addr;
    memcpy(&grpc_addr, &grpc_fn, sizeof(grpc_addr));
    if (dladdr(grpc_addr, &info) && info.dli_fname)
        scopes[1] = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    for (size_t k = 0; k < 2; k++) {
        for (size_t i = 0; scopes[k] && i < sizeof(names) / sizeof(names[0]); i++) {
            void *sym = dlsym(scopes[k], names[i]);
            if (sym) {
                void (*set_mode)(int);
                memcpy(&set_mode, &sym, sizeof(set_mode)); /* (object to function pointer) */
                set_mode(0);                               /* OnDeadlockCycle::kIgnore */
                absl_checks_off = true;
                k = 2;
                break;
            }
        }
    }
    if (scopes[1])
        dlclose(scopes[1]);
}

bool pf_rpc_absl_deadlock_checks_off(void)
{
    pthread_mutex_lock(&init_mu);
    bool off = absl_checks_off;
    pthread_mutex_unlock(&init_mu);
    return off;
}

void pf_rpc_global_init(void)
{
    pthread_mutex_lock(&init_mu);
    if (init_refs++ == 0) {
        absl_deadlock_detection_off();
        grpc_init();
    }
    pthread_mutex_unlock(&init_mu);
}

void pf_rpc_global_shutdown(void)
{
    pthread_mutex_lock(&init_mu);
    if (init_refs > 0 && --init_refs == 0)
        grpc_shutdown();
    pthread_mutex_unlock(&init_mu);
}

static pthread_key_t cq_key;
static pthread_once_t cq_once = PTHREAD_ONCE_INIT;

static void cq_destroy(void *p)
{
    grpc_completion_queue *cq = p;
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

static void cq_key_init(void)
{
    pthread_key_create(&cq_key, cq_destroy);
}

static grpc_completion_queue *thread_cq(void)
{
    pthread_once(&cq_once, cq_key_init);
    grpc_completion_queue *cq = pthread_getspecific(cq_key);
    if (!cq) {
        cq = grpc_completion_queue_create_for_pluck(NULL);
        pthread_setspecific(cq_key, cq);
    }
    return cq;
}

static void free_strs(char **v)
{
    for (int i = 0; i < 4; i++) {
        if (v[i]) {
            memset(v[i], 0, strlen(v[i]));
            free(v[i]);
        }
        v[i] = NULL;
    }
}

int pf_rpc_set_default_channel_opts(const struct pf_rpc_channel_opts *o)
{
    char *v[4] = {NULL, NULL, NULL, NULL};
    const char *src[4] = {o ? o->ca_pem : NULL, o ? o->cert_pem : NULL, o ? o->key_pem : NULL,
                          o ? o->token : NULL};
    for (int i = 0; i < 4; i++)
        if (src[i] && !(v[i] = strdup(src[i]))) {
            free_strs(v);
            return -ENOMEM;
        }
    pthread_mutex_lock(&def_mu);
    free_strs(def_strs);
    memcpy(def_strs, v, sizeof(v));
    def_opts = (struct pf_rpc_channel_opts){.tls = o && (o->tls || o->ca_pem),
                                            .ca_pem = v[0],
                                            .cert_pem = v[1],
                                            .key_pem = v[2],
                                            .token = v[3]};
    pthread_mutex_unlock(&def_mu);
    return 0;
}

int pf_rpc_channel_open(const char *target, struct pf_rpc_channel **ch_p)
{
    pthread_mutex_lock(&def_mu);
    int rc = pf_rpc_channel_open_opts(target, &def_opts, ch_p);
    pthread_mutex_unlock(&def_mu);
    return rc;
}

int pf_rpc_channel_open_lean(const char *target, struct pf_rpc_channel **ch_p)
{
    pthread_mutex_lock(&def_mu);
    struct pf_rpc_channel_opts o = def_opts;
    o.lean_calls = true;
    int rc = pf_rpc_channel_open_opts(target, &o, ch_p);
    pthread_mutex_unlock(&def_mu);
    return rc;
}

static grpc_channel_credentials *channel_creds(const char *target,
                                               const struct pf_rpc_channel_opts *o)
{
    bool unix_target = strncmp(target, "unix:", 5) == 0;
    if (!o || unix_target || !(o->tls || o->ca_pem))
        return grpc_insecure_credentials_create();
    grpc_ssl_pem_key_cert_pair kp = {.private_key = o->key_pem, .cert_chain = o->cert_pem};
    return grpc_ssl_credentials_create(o->ca_pem, o->cert_pem ? &kp : NULL, NULL, NULL);
}

int pf_rpc_channel_open_opts(const char *target, const struct pf_rpc_channel_opts *o,
                             struct pf_rpc_channel **ch_p)
{
    if (o && !!o->cert_pem != !!o->key_pem)
        return -EINVAL;
    struct pf_rpc_channel *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->target = strdup(target);
    if (!c->target || (o && o->token && !(c->token = strdup(o->token))) ||
        (o && o->tenant_token && !(c->tenant_token = strdup(o->tenant_token)))) {
        free(c->token);
        free(c->target);
        free(c);
        return -ENOMEM;
    }
    if (c->token) {
        c->md[c->nmd].key = grpc_slice_from_static_string(PF_AUTH_TOKEN_MD);
        c->md[c->nmd++].value = grpc_slice_from_static_string(c->token);
    }
    if (c->tenant_token) {
        c->md[c->nmd].key = grpc_slice_from_static_string(PF_AUTH_TENANT_MD);
        c->md[c->nmd++].value = grpc_slice_from_static_string(c->tenant_token);
    }
    pf_rpc_global_init();
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = PF_RPC_MSG_MAX},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = PF_RPC_MSG_MAX},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = 30000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 20000},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = 100},
        /* in gRPC core this is also the connect timeout: 5 s like the reference; a short
         * value fails slow handshakes (sanitizer builds, loaded hosts) */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, .value.integer = 5000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000},
        /* distinct channels get distinct connections (peers, sessions) */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, .value.integer = 1},
        /* the last two only with o->lean_calls (pf/auth.h) */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ENABLE_RETRIES, .value.integer = 0},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ENABLE_CHANNELZ, .value.integer = 0},
    };
    grpc_channel_args ca = {PF_ARRAY_SIZE(args) - (o && o->lean_calls ? 0 : 2), args};
    grpc_channel_credentials *cr = channel_creds(target, o);
    c->ch = cr ? grpc_channel_create(target, cr, &ca) : NULL;
    if (cr)
        grpc_channel_credentials_release(cr);
    if (!c->ch) {
        pf_rpc_global_shutdown();
        free(c->token);
        free(c->tenant_token);
        free(c->target);
        free(c);
        return -EINVAL;
    }
    *ch_p = c;
    return 0;
}

void pf_rpc_channel_reconnect(struct pf_rpc_channel *ch)
{
    if (ch)
        grpc_channel_reset_connect_backoff(ch->ch);
}

void pf_rpc_channel_close(struct pf_rpc_channel *ch)
{
    if (!ch)
        return;
    grpc_channel_destroy(ch->ch);
    free(ch->target);
    if (ch->token) {
        memset(ch->token, 0, strlen(ch->token));
        free(ch->token);
    }
    if (ch->tenant_token) {
        memset(ch->tenant_token, 0, strlen(ch->tenant_token));
        free(ch->tenant_token);
    }
    free(ch);
    pf_rpc_global_shutdown();
}

const char *pf_rpc_channel_target(const struct pf_rpc_channel *ch)
{
    return ch->target;
}

/* Deadlines are clamped to a day: a huge value (UINT64_MAX as "forever") must not wrap to
 * a negative span and expire at once. */
#define DEADLINE_MAX_MS (24ull * 3600 * 1000)

static gpr_timespec deadline_after(uint64_t ms)
{
    if (ms > DEADLINE_MAX_MS)
        ms = DEADLINE_MAX_MS;
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis((int64_t)ms, GPR_TIMESPAN));
}

static void set_status(struct pf_rpc_status *st, int code, const char *msg, size_t len)
{
    if (!st)
        return;
    st->code = code;
    if (len >= sizeof(st->msg))
        len = sizeof(st->msg) - 1;
    memcpy(st->msg, msg, len);
    st->msg[len] = '\0';
}

static int unary_bb(struct pf_rpc_channel *ch, const char *path, grpc_byte_buffer *reqbb,
                    const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                    ProtobufCMessage **resp_p, struct pf_rpc_status *st);

int pf_rpc_unary(struct pf_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                 ProtobufCMessage **resp_p, struct pf_rpc_status *st)
{
    return unary_bb(ch, path, pf_rpc_pack(req), resp_desc, timeout_ms, resp_p, st);
}

int pf_rpc_unary_raw(struct pf_rpc_channel *ch, const char *path, const uint8_t *data, size_t len,
                     const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                     ProtobufCMessage **resp_p, struct pf_rpc_status *st)
{
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)data, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return unary_bb(ch, path, bb, resp_desc, timeout_ms, resp_p, st);
}

int pf_rpc_unary_take(struct pf_rpc_channel *ch, const char *path, uint8_t *data, size_t len,
                      const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                      ProtobufCMessage **resp_p, struct pf_rpc_status *st)
{
    grpc_slice s = len ? grpc_slice_new(data, len, free) : grpc_empty_slice();
    if (!len)
        free(data);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return unary_bb(ch, path, bb, resp_desc, timeout_ms, resp_p, st);
}

struct pf_rpc_pending {
    grpc_call *call;
    grpc_completion_queue *cq; /* the starting thread's (thread_cq) */
    grpc_byte_buffer *req, *resp;
    grpc_metadata_array imd, tmd;
    grpc_status_code status;
    grpc_slice details;
    uint64_t timeout_ms;
};

/* Takes ownership of reqbb (freed also on error). */
static int start_bb(struct pf_rpc_channel *ch, const char *path, grpc_byte_buffer *reqbb,
                    uint64_t timeout_ms, struct pf_rpc_pending **p_p, struct pf_rpc_status *st)
{
    struct pf_rpc_pending *p = calloc(1, sizeof(*p));
    if (!p) {
        grpc_byte_buffer_destroy(reqbb);
        set_status(st, PF_GRPC_INTERNAL, "out of memory", 13);
        return -ENOMEM;
    }
    p->cq = thread_cq();
    p->req = reqbb;
    p->timeout_ms = timeout_ms;
    p->status = GRPC_STATUS_UNKNOWN;
    p->details = grpc_empty_slice();
    grpc_metadata_array_init(&p->imd);
    grpc_metadata_array_init(&p->tmd);
    /* copied: the call refs the slice, and chttp2's HPACK compressor keeps the :path of
     * earlier calls to compare later ones with, so a static slice of the caller's buffer (a
     * stack array in libpegaflow) was read after the caller had reused or left it */
    grpc_slice method = grpc_slice_from_copied_string(path);
    p->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, p->cq, method, NULL,
                                       deadline_after(timeout_ms), NULL);
    grpc_slice_unref(method);
    int rc = -ENOMEM;
    if (!p->call) {
        set_status(st, PF_GRPC_INTERNAL, "cannot create call", 18);
        goto err_free;
    }
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = ch->nmd;
    ops[0].data.send_initial_metadata.metadata = ch->nmd ? ch->md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = reqbb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &p->imd;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &p->resp;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &p->tmd;
    ops[5].data.recv_status_on_client.status = &p->status;
    ops[5].data.recv_status_on_client.status_details = &p->details;
    /* the tag is the pending call itself: one thread may have several in flight */
    if (grpc_call_start_batch(p->call, ops, 6, p, NULL) != GRPC_CALL_OK) {
        set_status(st, PF_GRPC_INTERNAL, "start_batch failed", 18);
        grpc_call_unref(p->call);
        rc = -EIO;
        goto err_free;
    }
    *p_p = p;
    return 0;
err_free:
    grpc_byte_buffer_destroy(reqbb);
    grpc_metadata_array_destroy(&p->imd);
    grpc_metadata_array_destroy(&p->tmd);
    free(p);
    return rc;
}

int pf_rpc_unary_start(struct pf_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                       uint64_t timeout_ms, struct pf_rpc_pending **p_p, struct pf_rpc_status *st)
{
    return start_bb(ch, path, pf_rpc_pack(req), timeout_ms, p_p, st);
}

int pf_rpc_unary_finish(struct pf_rpc_pending *p, const ProtobufCMessageDescriptor *resp_desc,
                        ProtobufCMessage **resp_p, struct pf_rpc_status *st)
{
    int rc = 0;
    if (!resp_p) /* the caller no longer wants the answer */
        grpc_call_cancel(p->call, NULL);
    /* the call's own deadline bounds this; the extra margin only guards against bugs */
    uint64_t tmo = p->timeout_ms;
    grpc_event ev = grpc_completion_queue_pluck(
        p->cq, p, deadline_after(tmo > DEADLINE_MAX_MS ? DEADLINE_MAX_MS + 5000 : tmo + 5000),
        NULL);
    if (ev.type != GRPC_OP_COMPLETE) {
        grpc_call_cancel(p->call, NULL);
        grpc_completion_queue_pluck(p->cq, p, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        p->status = GRPC_STATUS_DEADLINE_EXCEEDED;
    }
    if (!resp_p) {
        set_status(st, PF_GRPC_CANCELLED, "cancelled by the caller", 23);
        rc = -ECANCELED;
        goto out;
    }
    if (p->status != GRPC_STATUS_OK) {
        set_status(st, p->status, (const char *)GRPC_SLICE_START_PTR(p->details),
                   GRPC_SLICE_LENGTH(p->details));
        rc = pf_errno_from_grpc_code(p->status);
        goto out;
    }
    if (!p->resp) {
        set_status(st, PF_GRPC_INTERNAL, "empty response", 14);
        rc = -EPROTO;
        goto out;
    }
    grpc_slice sl = pf_rpc_bb_to_slice(p->resp);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(resp_desc, NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    if (!m) {
        set_status(st, PF_GRPC_INTERNAL, "malformed response", 18);
        rc = -EPROTO;
        goto out;
    }
    set_status(st, PF_GRPC_OK, "", 0);
    *resp_p = m;
out:
    if (p->resp)
        grpc_byte_buffer_destroy(p->resp);
    grpc_byte_buffer_destroy(p->req);
    grpc_slice_unref(p->details);
    grpc_metadata_array_destroy(&p->imd);
    grpc_metadata_array_destroy(&p->tmd);
    grpc_call_unref(p->call);
    free(p);
    return rc;
}

/* Takes ownership of reqbb. */
static int unary_bb(struct pf_rpc_channel *ch, const char *path, grpc_byte_buffer *reqbb,
                    const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                    ProtobufCMessage **resp_p, struct pf_rpc_status *st)
{
    struct pf_rpc_pending *p;
    int rc = start_bb(ch, path, reqbb, timeout_ms, &p, st);
    return rc ? rc : pf_rpc_unary_finish(p, resp_desc, resp_p, st);
}

static bool md_has_open(const grpc_metadata_array *md)
{
    for (size_t i = 0; i < md->count; i++)
        if (grpc_slice_str_cmp(md->metadata[i].key, "pf-stream") == 0)
            return true;
    return false;
}

int pf_rpc_stream_open(struct pf_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                       uint64_t timeout_ms, struct pf_rpc_stream **s_p, struct pf_rpc_status *st)
{
    struct pf_rpc_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice method = grpc_slice_from_copied_string(path); /* as in unary_bb */
    s->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, method, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_slice_unref(method);
    grpc_metadata_array_init(&s->imd);
    grpc_metadata_array_init(&s->tmd);
    s->details = grpc_empty_slice();
    s->req = pf_rpc_pack(req);
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = ch->nmd;
    ops[0].data.send_initial_metadata.metadata = ch->nmd ? ch->md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->imd;
    grpc_op sop;
    memset(&sop, 0, sizeof(sop));
    sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sop.data.recv_status_on_client.trailing_metadata = &s->tmd;
    sop.data.recv_status_on_client.status = &s->status;
    sop.data.recv_status_on_client.status_details = &s->details;
    int rc = 0;
    if (grpc_call_start_batch(s->call, ops, 4, &s->tag_start, NULL) != GRPC_CALL_OK ||
        grpc_call_start_batch(s->call, &sop, 1, &s->tag_status, NULL) != GRPC_CALL_OK) {
        set_status(st, PF_GRPC_INTERNAL, "start_batch failed", 18);
        rc = -EIO;
        goto err;
    }
    gpr_timespec dl = deadline_after(timeout_ms);
    bool started = false;
    while (!started || (!md_has_open(&s->imd) && !s->ended)) {
        grpc_event ev = grpc_completion_queue_next(s->cq, dl, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            set_status(st, PF_GRPC_DEADLINE_EXCEEDED, "stream not accepted in time", 27);
            rc = -ETIMEDOUT;
            goto err;
        }
        if (ev.tag == &s->tag_start)
            started = true;
        else if (ev.tag == &s->tag_status)
            s->ended = true;
    }
    if (s->ended) {
        int code = s->status == GRPC_STATUS_OK ? PF_GRPC_UNKNOWN : (int)s->status;
        set_status(st, code, (const char *)GRPC_SLICE_START_PTR(s->details),
                   GRPC_SLICE_LENGTH(s->details));
        rc = pf_errno_from_grpc_code(code);
        goto err;
    }
    set_status(st, PF_GRPC_OK, "", 0);
    *s_p = s;
    return 0;
err:
    pf_rpc_stream_close(s);
    return rc;
}

bool pf_rpc_stream_alive(struct pf_rpc_stream *s)
{
    while (!s->ended) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_time_0(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        if (ev.tag == &s->tag_status)
            s->ended = true;
    }
    return !s->ended;
}

void pf_rpc_stream_close(struct pf_rpc_stream *s)
{
    if (!s)
        return;
    if (s->call) {
        grpc_call_cancel(s->call, NULL);
        grpc_call_unref(s->call);
    }
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(s->cq);
    grpc_metadata_array_destroy(&s->imd);
    grpc_metadata_array_destroy(&s->tmd);
    grpc_slice_unref(s->details);
    if (s->req)
        grpc_byte_buffer_destroy(s->req);
    free(s);
}

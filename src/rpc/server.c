/* gRPC C-core server: one completion queue, a pool of RPC threads, a handler table.
 *
 * Call lifecycle (tags: the call pointer for the main path, pointer|1 for the
 * RECV_CLOSE_ON_SERVER watcher, which is the only way the core tells a server that a
 * client went away):
 *   NEW    request_call completed: ask for the next call, start the watcher, look up the
 *          method (unknown -> UNIMPLEMENTED), receive the request message
 *   READ   decode, run the handler on this thread, send reply + status (FINISH)
 *   PARKED a server stream that sends nothing: initial metadata carries "pf-stream: open";
 *          the watcher completing means the client disconnected (or we stop): the
 *          method's stream_closed runs, then the status is sent.
 * A call is freed when both paths released their reference.
 * Pitfalls handled (gRPC 1.51): initial metadata is always sent before a status; message
 * limits raised to 64 MiB; SO_REUSEPORT off. */
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netdb.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#define PF_LOG_MOD "rpc"
#include "pf/auth.h"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/rpc.h"
#include "pf/thread.h"
#include "rpc/rpc_internal.h"
#include "rpc/validate.h"

enum { ST_NEW, ST_READ, ST_PARK_MD, ST_PARKED, ST_FINISH };
/* park state of a streaming call, shared by the handler thread and the watcher */
enum { PS_NONE, PS_OPENING, PS_PARKED, PS_CLOSED_EARLY };

struct pf_rpc_call {
    struct pf_rpc_server *srv;
    _Atomic int st;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *recv;
    grpc_byte_buffer *send;
    int cancelled;
    _Atomic int refs;
    const struct pf_rpc_method *m;
    int code;
    char msg[PF_RPC_ERRMSG];
    uint64_t start_ns;
    void *stream_ctx;
    _Atomic int pstate;
    _Atomic bool gone; /* the caller cancelled or disconnected (pf_rpc_call_expired) */
    /* pf_rpc_call_on_cancel: whoever exchanges undo_fn to NULL first runs it */
    _Atomic(pf_rpc_undo_fn) undo_fn;
    void *undo_ctx;
    bool undo_set;
    size_t undo_len;
    uint8_t undo_arg[PF_RPC_UNDO_MAX];
    char *peer;
    grpc_metadata park_md;
} __attribute__((aligned(8)));

struct pf_rpc_server {
    grpc_server *srv;
    grpc_completion_queue *cq;
    struct pf_rpc_server_config cfg;
    int nthreads;
    pthread_t *thr;
    _Atomic bool stopping;
    struct pf_metric *m_req, *m_dur;
    int shutdown_tag;
    pthread_mutex_t sd_mu;
    pthread_cond_t sd_cv;
    bool sd_done;
    size_t live;                /* call contexts not yet freed (under sd_mu) */
    size_t parked;              /* of which parked streams (under sd_mu) */
    _Atomic uint64_t req_bytes; /* decode budget in use (see request_memory) */
    uint64_t req_budget;
    pthread_mutex_t net_mu; /* network-class handlers in flight, overall and per caller */
    int net_busy, net_slots;
    struct net_peer {
        char addr[64];
        int n;
    } * net_peers; /* net_slots entries */
};

static void request_new(struct pf_rpc_server *s);

/* Every batch of a call goes through here: the completion may run on another RPC thread,
 * and the queue's synchronisation is invisible to ThreadSanitizer, hence the annotation. */
static grpc_call_error start_batch(struct pf_rpc_call *c, const grpc_op *ops, size_t n, void *tag)
{
    grpc_call *call = c->call; /* last access to c before the hand-off */
    pf_hb_release(c);
    return grpc_call_start_batch(call, ops, n, tag, NULL);
}

static void call_free(struct pf_rpc_call *c)
{
    struct pf_rpc_server *s = c->srv;
    pthread_mutex_lock(&s->sd_mu);
    s->live--;
    if (atomic_load(&s->stopping))
        pthread_cond_broadcast(&s->sd_cv);
    pthread_mutex_unlock(&s->sd_mu);
    if (c->recv)
        grpc_byte_buffer_destroy(c->recv);
    if (c->send)
        grpc_byte_buffer_destroy(c->send);
    if (c->call)
        grpc_call_unref(c->call);
    if (c->peer)
        gpr_free(c->peer);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    free(c);
}

static void call_unref(struct pf_rpc_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        call_free(c);
}

int pf_rpc_respond(struct pf_rpc_call *call, const ProtobufCMessage *msg)
{
    if (call->send)
        grpc_byte_buffer_destroy(call->send);
    call->send = pf_rpc_pack(msg);
    return 0;
}

int pf_rpc_fail(struct pf_rpc_call *call, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->msg, sizeof(call->msg), fmt, ap);
    va_end(ap);
    call->code = code ? code : PF_GRPC_INTERNAL;
    return call->code;
}

bool pf_rpc_call_expired(struct pf_rpc_call *call)
{
    if (atomic_load(&call->gone))
        return true;
    gpr_timespec dl = call->details.deadline;
    return gpr_time_cmp(gpr_now(dl.clock_type), dl) > 0;
}

static void run_undo(struct pf_rpc_call *c)
{
    pf_rpc_undo_fn fn = atomic_exchange(&c->undo_fn, (pf_rpc_undo_fn)NULL);
    if (fn)
        fn(c->undo_ctx, c->undo_arg, c->undo_len);
}

int pf_rpc_call_on_cancel(struct pf_rpc_call *call, pf_rpc_undo_fn fn, void *ctx, const void *arg,
                          size_t len)
{
    if (!fn || len > PF_RPC_UNDO_MAX || (len && !arg))
        return -EINVAL;
    if (call->undo_set) /* only the handler registers: a plain flag */
        return -EBUSY;
    call->undo_set = true;
    call->undo_ctx = ctx;
    call->undo_len = len;
    if (len)
        memcpy(call->undo_arg, arg, len);
    atomic_store(&call->undo_fn, fn);
    /* the watcher sets gone before it looks for an undo: either it sees fn, or we see gone */
    if (atomic_load(&call->gone))
        run_undo(call);
    return 0;
}

/* The caller's address without the port ("ipv4:10.0.0.1:5555" -> "ipv4:10.0.0.1"). */
static void peer_host(struct pf_rpc_call *c, char *out, size_t cap)
{
    snprintf(out, cap, "%s", pf_rpc_call_peer(c));
    char *colon = strrchr(out, ':');
    if (colon && colon > out && strchr(out, ':') != colon)
        *colon = '\0';
}

/* Takes a network slot for the call's caller; false when the server-wide or per-caller
 * bound is reached (*why names which). */
static bool net_enter(struct pf_rpc_server *s, const char *host, const char **why)
{
    bool ok = false;
    pthread_mutex_lock(&s->net_mu);
    struct net_peer *free_p = NULL, *mine = NULL;
    for (int i = 0; i < s->net_slots; i++) {
        struct net_peer *p = &s->net_peers[i];
        if (p->n > 0 && strcmp(p->addr, host) == 0)
            mine = p;
        else if (p->n == 0 && !free_p)
            free_p = p;
    }
    if (s->net_busy >= s->net_slots) {
        *why = "server-wide";
    } else if (mine && mine->n >= PF_RPC_NET_PER_PEER) {
        *why = "per-caller";
    } else {
        if (!mine) {
            mine = free_p; /* net_busy < net_slots: a free entry exists */
            snprintf(mine->addr, sizeof(mine->addr), "%s", host);
        }
        mine->n++;
        s->net_busy++;
        ok = true;
    }
    pthread_mutex_unlock(&s->net_mu);
    return ok;
}

static void net_leave(struct pf_rpc_server *s, const char *host)
{
    pthread_mutex_lock(&s->net_mu);
    for (int i = 0; i < s->net_slots; i++)
        if (s->net_peers[i].n > 0 && strcmp(s->net_peers[i].addr, host) == 0) {
            s->net_peers[i].n--;
            break;
        }
    s->net_busy--;
    pthread_mutex_unlock(&s->net_mu);
}

const void *pf_rpc_call_metadata(struct pf_rpc_call *call, const char *key, size_t *len_p)
{
    for (size_t i = 0; i < call->md.count; i++)
        if (grpc_slice_str_cmp(call->md.metadata[i].key, key) == 0) {
            *len_p = GRPC_SLICE_LENGTH(call->md.metadata[i].value);
            return GRPC_SLICE_START_PTR(call->md.metadata[i].value);
        }
    *len_p = 0;
    return NULL;
}

const char *pf_rpc_call_peer(struct pf_rpc_call *call)
{
    if (!call->peer)
        call->peer = grpc_call_get_peer(call->call);
    return call->peer ? call->peer : "";
}

grpc_call *pf_rpc_call_grpc(struct pf_rpc_call *call)
{
    return call->call;
}

static void record(struct pf_rpc_call *c)
{
    struct pf_rpc_server *s = c->srv;
    const char *method = c->m ? c->m->metric_name : "unknown";
    const char *status = c->code == 0 ? "ok" : pf_grpc_code_name(c->code);
    double secs = (double)(pf_now_ns() - c->start_ns) / 1e9;
    pf_child_add(pf_metric_child2(s->m_req, method, status), 1);
    pf_child_observe(pf_metric_child2(s->m_dur, method, status), secs);
    if (c->code && c->code != PF_GRPC_UNIMPLEMENTED)
        pf_debug("%s -> %s: %s", c->m ? c->m->path : "?", pf_grpc_code_name(c->code), c->msg);
}

/* Sends (initial metadata if needed) + reply (when OK) + status; state FINISH. */
static void finish(struct pf_rpc_call *c, bool send_initial_md)
{
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (send_initial_md)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (c->code == 0 && c->send) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->send;
        n++;
    }
    grpc_slice details = grpc_slice_from_copied_string(c->code ? c->msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)c->code;
    ops[n].data.send_status_from_server.status_details = &details;
    n++;
    record(c);
    c->st = ST_FINISH;
    grpc_call_error e = start_batch(c, ops, n, c);
    grpc_slice_unref(details);
    if (e != GRPC_CALL_OK) {
        pf_warn("finish start_batch failed: %d", e);
        call_unref(c);
    }
}

/* The security policy (pf/auth.h) for this call; true when refused (status set). */
static bool auth_refused(struct pf_rpc_call *c)
{
    const struct pf_rpc_server_config *cfg = &c->srv->cfg;
    if (!cfg->local_only && !(cfg->auth && cfg->auth->cluster_token))
        return false; /* nothing to enforce (the default): no per-call cost */
    const void *tok = NULL;
    size_t tlen = 0;
    for (size_t i = 0; i < c->md.count; i++)
        if (grpc_slice_str_cmp(c->md.metadata[i].key, PF_AUTH_TOKEN_MD) == 0) {
            tok = GRPC_SLICE_START_PTR(c->md.metadata[i].value);
            tlen = GRPC_SLICE_LENGTH(c->md.metadata[i].value);
            break;
        }
    int code = pf_auth_check(cfg->auth, cfg->rules, cfg->nrules, cfg->local_only, c->m->path,
                             pf_rpc_call_peer(c), tok, tlen, c->msg, sizeof(c->msg));
    if (code == 0)
        return false;
    c->code = code;
    pf_log_ratelimited(PF_LOG_WARN, 5000, "refused %s: %s", pf_grpc_code_name(code), c->msg);
    return true;
}

static void on_new_call(struct pf_rpc_call *c)
{
    struct pf_rpc_server *s = c->srv;
    if (!atomic_load(&s->stopping))
        request_new(s);
    c->start_ns = pf_now_ns();
    atomic_store(&c->refs, 2);
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (start_batch(c, &op, 1, (char *)c + 1) != GRPC_CALL_OK)
        atomic_store(&c->refs, 1);
    for (size_t i = 0; i < s->cfg.nmethods; i++) {
        if (grpc_slice_str_cmp(c->details.method, s->cfg.methods[i].path) == 0) {
            c->m = &s->cfg.methods[i];
            break;
        }
    }
    if (!c->m) {
        char path[256];
        size_t l = GRPC_SLICE_LENGTH(c->details.method);
        snprintf(path, sizeof(path), "%.*s", (int)(l < 200 ? l : 200),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        pf_rpc_fail(c, PF_GRPC_UNIMPLEMENTED, "unknown method %s", path);
        finish(c, true);
        return;
    }
    if (auth_refused(c)) {
        finish(c, true);
        return;
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (!c->m->stream_open)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &c->recv;
    n++;
    c->st = ST_READ;
    if (start_batch(c, ops, n, c) != GRPC_CALL_OK)
        call_unref(c);
}

/* Returns a request's budget and network slot; gives freed heap back to the system
 * after a large request, so a burst of big decodes does not leave the RSS high. */
static void req_done(struct pf_rpc_server *s, const struct pf_rpc_method *m, const char *host,
                     uint64_t cost)
{
    if (m->network)
        net_leave(s, host);
    atomic_fetch_sub(&s->req_bytes, cost);
    if (cost >= (8u << 20) * PF_RPC_DECODE_FACTOR)
        malloc_trim(0);
}

static void on_request(struct pf_rpc_call *c)
{
    struct pf_rpc_server *s = c->srv;
    const struct pf_rpc_method *m = c->m;
    bool stream = m->stream_open != NULL;
    if (!c->recv) {
        pf_rpc_fail(c, PF_GRPC_INVALID_ARGUMENT, "request message missing");
        finish(c, stream);
        return;
    }
    grpc_slice sl = pf_rpc_bb_to_slice(c->recv);
    grpc_byte_buffer_destroy(c->recv);
    c->recv = NULL;
    size_t len = GRPC_SLICE_LENGTH(sl);
    const uint8_t *data = GRPC_SLICE_START_PTR(sl);
    char verr[PF_RPC_ERRMSG];
    int vrc = m->raw && m->checks_request
                  ? 0
                  : pf_rpc_validate(m->req_desc, data, len, verr, sizeof(verr));
    if (vrc) {
        grpc_slice_unref(sl);
        pf_rpc_fail(c, pf_grpc_code_from_errno(vrc), "%s", verr);
        finish(c, stream);
        return;
    }
    /* decode budget: the decoded form of a request is a few times its encoded size */
    uint64_t cost = (uint64_t)len * PF_RPC_DECODE_FACTOR + 4096;
    if (atomic_fetch_add(&s->req_bytes, cost) + cost > s->req_budget && cost > 4096 + 64) {
        atomic_fetch_sub(&s->req_bytes, cost);
        grpc_slice_unref(sl);
        pf_rpc_fail(c, PF_GRPC_RESOURCE_EXHAUSTED,
                    "%s of %zu bytes does not fit the server's request memory budget (%llu MiB "
                    "for requests in flight); retry later or send smaller requests",
                    m->req_desc->short_name, len, (unsigned long long)(s->req_budget >> 20));
        finish(c, stream);
        return;
    }
    char host[64] = "";
    if (m->network) {
        const char *why = "";
        peer_host(c, host, sizeof(host));
        if (!net_enter(s, host, &why)) {
            atomic_fetch_sub(&s->req_bytes, cost);
            grpc_slice_unref(sl);
            pf_rpc_fail(c, PF_GRPC_RESOURCE_EXHAUSTED,
                        "too many %s calls in progress (%s bound: %d server-wide, %d per caller); "
                        "retry later",
                        m->metric_name, why, s->net_slots, PF_RPC_NET_PER_PEER);
            finish(c, stream);
            return;
        }
    }
    if (m->raw) {
        int rc = m->raw(s->cfg.ctx, c, data, len);
        grpc_slice_unref(sl);
        if (rc == 0 && !c->send)
            pf_rpc_fail(c, PF_GRPC_INTERNAL, "handler produced no response");
        else if (rc != 0 && c->code == 0)
            pf_rpc_fail(c, PF_GRPC_INTERNAL, "handler failed");
        goto done_unary;
    }
    struct pf_rpc_arena ar = {0};
    ProtobufCAllocator pa;
    ProtobufCAllocator *alloc = pf_rpc_arena_open(&ar, &pa, cost);
    ProtobufCMessage *req = protobuf_c_message_unpack(m->req_desc, alloc, len, data);
    grpc_slice_unref(sl);
    if (!req) {
        pf_rpc_arena_close(&ar);
        pf_rpc_fail(c, PF_GRPC_INVALID_ARGUMENT, "malformed %s (protobuf decoding failed)",
                    m->req_desc->short_name);
        if (stream) {
            req_done(s, m, host, cost);
            finish(c, stream);
            return;
        }
        goto done_unary;
    }
    if (!stream) {
        int rc = m->unary(s->cfg.ctx, c, req);
        protobuf_c_message_free_unpacked(req, alloc);
        pf_rpc_arena_close(&ar);
        if (rc == 0 && !c->send)
            pf_rpc_fail(c, PF_GRPC_INTERNAL, "handler produced no response");
        else if (rc != 0 && c->code == 0)
            pf_rpc_fail(c, pf_grpc_code_from_errno(rc < 0 ? rc : -EIO), "handler failed: %s",
                        strerror(rc < 0 ? -rc : EIO));
        goto done_unary;
    }
    req_done(s, m, host, cost); /* a stream's request is consumed by stream_open below */
    atomic_store(&c->pstate, PS_OPENING);
    int rc = m->stream_open(s->cfg.ctx, c, req, &c->stream_ctx);
    protobuf_c_message_free_unpacked(req, alloc);
    pf_rpc_arena_close(&ar);
    if (rc != 0) {
        if (c->code == 0)
            pf_rpc_fail(c, PF_GRPC_INTERNAL, "stream open failed");
        int old = atomic_exchange(&c->pstate, PS_NONE);
        finish(c, true);
        if (old == PS_CLOSED_EARLY)
            call_unref(c); /* the watcher left its reference to us */
        return;
    }
    if (atomic_exchange(&c->pstate, PS_PARKED) == PS_CLOSED_EARLY) {
        /* the client vanished while the stream was being opened */
        m->stream_closed(s->cfg.ctx, c->stream_ctx, true);
        pf_rpc_fail(c, PF_GRPC_CANCELLED, "stream closed");
        finish(c, true);
        call_unref(c);
        return;
    }
    pthread_mutex_lock(&s->sd_mu);
    s->parked++;
    pthread_mutex_unlock(&s->sd_mu);
    /* park: announce acceptance; from now on only the watcher ends the call */
    c->park_md.key = grpc_slice_from_static_string("pf-stream");
    c->park_md.value = grpc_slice_from_static_string("open");
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    op.data.send_initial_metadata.count = 1;
    op.data.send_initial_metadata.metadata = &c->park_md;
    c->st = ST_PARK_MD;
    if (start_batch(c, &op, 1, c) != GRPC_CALL_OK)
        call_unref(c);
    return;
done_unary:
    req_done(s, m, host, cost);
    finish(c, false);
}

/* Watcher completed: the call is over from the client's point of view. */
static void on_closed(struct pf_rpc_call *c)
{
    struct pf_rpc_server *s = c->srv;
    /* the close batch also completes on a normal end of the request stream: only a
     * cancellation means the caller is gone */
    if (c->cancelled) {
        atomic_store(&c->gone, true);
        /* not for the server's own cancel_all at stop: those callers may have their answer */
        if (!atomic_load(&s->stopping))
            run_undo(c);
    }
    int old = atomic_exchange(&c->pstate, PS_CLOSED_EARLY);
    if (old == PS_OPENING)
        return; /* the opening thread sees PS_CLOSED_EARLY and finishes the call */
    if (old == PS_PARKED) {
        pthread_mutex_lock(&s->sd_mu);
        s->parked--;
        pthread_mutex_unlock(&s->sd_mu);
        c->m->stream_closed(s->cfg.ctx, c->stream_ctx, c->cancelled != 0);
        /* finish the parked call; its batch takes over this reference */
        pf_rpc_fail(c, PF_GRPC_CANCELLED, "stream closed");
        finish(c, false);
        return;
    }
    call_unref(c);
}

static void *worker(void *arg)
{
    struct pf_rpc_server *s = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE || !ev.tag)
            continue;
        if (ev.tag == &s->shutdown_tag) {
            pthread_mutex_lock(&s->sd_mu);
            s->sd_done = true;
            pthread_cond_broadcast(&s->sd_cv);
            pthread_mutex_unlock(&s->sd_mu);
            continue;
        }
        if ((uintptr_t)ev.tag & 1) {
            pf_hb_acquire((char *)ev.tag - 1);
            on_closed((struct pf_rpc_call *)((char *)ev.tag - 1));
            continue;
        }
        struct pf_rpc_call *c = ev.tag;
        pf_hb_acquire(c);
        if (!ev.success) {
            if (c->st == ST_NEW)
                call_free(c);
            else
                call_unref(c);
            continue;
        }
        switch (atomic_load(&c->st)) {
        case ST_NEW:
            on_new_call(c);
            break;
        case ST_READ:
            on_request(c);
            break;
        case ST_PARK_MD:
            c->st = ST_PARKED;
            call_unref(c); /* main path done; the watcher keeps the call */
            break;
        case ST_FINISH:
            call_unref(c);
            break;
        default:
            call_unref(c);
        }
    }
    return NULL;
}

static void request_new(struct pf_rpc_server *s)
{
    struct pf_rpc_call *c = calloc(1, sizeof(*c));
    if (!c) {
        pf_error("out of memory accepting a call");
        return;
    }
    c->srv = s;
    c->st = ST_NEW;
    pthread_mutex_lock(&s->sd_mu);
    s->live++;
    pthread_mutex_unlock(&s->sd_mu);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    pf_hb_release(c);
    grpc_call_error e =
        grpc_server_request_call(s->srv, &c->call, &c->details, &c->md, s->cq, s->cq, c);
    if (e != GRPC_CALL_OK)
        call_free(c);
}

/* Binds a plain socket first, only to turn a failure into a precise errno message
 * (gRPC's add_http2_port returns 0 without a reason). */
static int probe_bind(const char *addr, char *err, size_t errlen)
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
    int rc = 0;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
            rc = -errno;
            snprintf(err, errlen, "cannot bind %s: %s", addr, strerror(errno));
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

/* The optional plaintext listener for local workers: only "unix:PATH" (a TCP address would
 * be reachable without TLS). */
static int add_local_listener(struct pf_rpc_server *s, const char *addr, char *err, size_t errlen)
{
    if (!addr)
        return 0;
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    /* gRPC binds the socket here. It is created 0600 (umask 0177 around the call; the
     * threads running at this point of the start-up create no files), then given to its
     * group and opened to it: mode 0660, never wider (docs/security.md) */
    mode_t old = umask(0177);
    int port = grpc_server_add_http2_port(s->srv, addr, cr);
    umask(old);
    grpc_server_credentials_release(cr);
    if (port == 0) {
        snprintf(err, errlen, "cannot listen on %s (directory missing or not writable?)", addr);
        return -EADDRNOTAVAIL;
    }
    const char *path = addr + 5;
    if (s->cfg.local_gid_set && chown(path, (uid_t)-1, (gid_t)s->cfg.local_gid) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot give the socket to group %u: %s", addr, s->cfg.local_gid,
                 strerror(e));
        return -e;
    }
    if (chmod(path, 0660) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot chmod the socket 0660: %s", addr, strerror(e));
        return -e;
    }
    return 0;
}

int pf_rpc_server_start(const struct pf_rpc_server_config *cfg, struct pf_rpc_server **s_p,
                        int *bound_port_p, char *err, size_t errlen)
{
    if (cfg->local_addr && (strncmp(cfg->local_addr, "unix:", 5) != 0 || !cfg->local_addr[5])) {
        snprintf(err, errlen, "local address '%s' is not unix:PATH", cfg->local_addr);
        return -EINVAL;
    }
    int rc = probe_bind(cfg->addr, err, errlen);
    if (rc)
        return rc;
    pf_rpc_global_init();
    struct pf_rpc_server *s = calloc(1, sizeof(*s));
    if (!s) {
        rc = -ENOMEM;
        goto err_init;
    }
    s->cfg = *cfg;
    pthread_mutex_init(&s->sd_mu, NULL);
    pf_cond_init(&s->sd_cv);
    s->nthreads = cfg->threads > 0 ? cfg->threads : 8;
    s->req_budget = cfg->request_memory ? cfg->request_memory : PF_RPC_DEFAULT_REQ_MEMORY;
    s->net_slots =
        cfg->network_slots > 0 ? cfg->network_slots : (s->nthreads / 4 > 1 ? s->nthreads / 4 : 1);
    pthread_mutex_init(&s->net_mu, NULL);
    s->net_peers = calloc((size_t)s->net_slots, sizeof(*s->net_peers));
    if (!s->net_peers) {
        free(s);
        rc = -ENOMEM;
        goto err_init;
    }
    char name[128];
    const char *prefix = cfg->metric_prefix ? cfg->metric_prefix : "pegaflow";
    snprintf(name, sizeof(name), "%s_rpc_requests", prefix);
    s->m_req = pf_metric_counter(name, "RPC requests by method and status", "method,status");
    snprintf(name, sizeof(name), "%s_rpc_duration_seconds", prefix);
    s->m_dur = pf_metric_histogram(name, "RPC handling time by method and status", "method,status",
                                   pf_buckets_rpc_seconds, pf_buckets_rpc_seconds_n);

    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = PF_RPC_MSG_MAX},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = PF_RPC_MSG_MAX},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = 30000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 20000},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         .value.integer = 10000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PING_STRIKES, .value.integer = 0},
    };
    grpc_channel_args ca = {PF_ARRAY_SIZE(args), args};
    s->srv = grpc_server_create(&ca, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->srv, s->cq, NULL);
    grpc_server_credentials *cr = pf_auth_server_creds(cfg->auth);
    int port = cr ? grpc_server_add_http2_port(s->srv, cfg->addr, cr) : 0;
    if (cr)
        grpc_server_credentials_release(cr);
    if (port == 0) {
        snprintf(err, errlen, "cannot listen on %s%s", cfg->addr,
                 cfg->auth && cfg->auth->cert_pem ? " (or the TLS certificate/key is invalid)"
                                                  : "");
        rc = -EADDRNOTAVAIL;
        goto err_srv;
    }
    rc = add_local_listener(s, cfg->local_addr, err, errlen);
    if (rc) {
        /* a server with a listener may only be destroyed after a shutdown */
        grpc_server_shutdown_and_notify(s->srv, s->cq, &s->shutdown_tag);
        goto err_srv;
    }
    grpc_server_start(s->srv);
    s->thr = calloc((size_t)s->nthreads, sizeof(pthread_t));
    if (!s->thr) {
        rc = -ENOMEM;
        goto err_started;
    }
    for (int i = 0; i < s->nthreads; i++)
        request_new(s);
    for (int i = 0; i < s->nthreads; i++) {
        char tn[16];
        snprintf(tn, sizeof(tn), "rpc-%d", i);
        rc = pf_thread_start(&s->thr[i], tn, -1, worker, s);
        if (rc) {
            s->nthreads = i;
            pf_rpc_server_stop(s);
            snprintf(err, errlen, "cannot start RPC threads: %s", strerror(-rc));
            return rc;
        }
    }
    if (bound_port_p)
        *bound_port_p = port;
    *s_p = s;
    return 0;
err_started:
    s->nthreads = 0;
    pf_rpc_server_stop(s);
    return rc;
err_srv:
    grpc_server_destroy(s->srv);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(s->cq);
    pthread_mutex_destroy(&s->net_mu);
    free(s->net_peers);
    free(s);
err_init:
    pf_rpc_global_shutdown();
    return rc;
}

void pf_rpc_server_stop(struct pf_rpc_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    grpc_server_shutdown_and_notify(s->srv, s->cq, &s->shutdown_tag);
    if (s->nthreads > 0) {
        /* let calls in flight (e.g. the reply to a Shutdown RPC) finish for up to 2 s; parked
         * streams only end when cancelled */
        struct timespec dl = pf_deadline_ms(2000);
        pthread_mutex_lock(&s->sd_mu);
        while (s->live > s->parked)
            if (pthread_cond_timedwait(&s->sd_cv, &s->sd_mu, &dl) == ETIMEDOUT)
                break;
        pthread_mutex_unlock(&s->sd_mu);
    }
    grpc_server_cancel_all_calls(s->srv);
    if (s->nthreads == 0) {
        /* no workers: drain here */
        for (;;) {
            grpc_event ev =
                grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->shutdown_tag)
                break;
            if (ev.type != GRPC_OP_COMPLETE || !ev.tag)
                continue;
            if ((uintptr_t)ev.tag & 1) {
                on_closed((struct pf_rpc_call *)((char *)ev.tag - 1));
                continue;
            }
            struct pf_rpc_call *c = ev.tag;
            if (c->st == ST_NEW)
                call_free(c);
            else
                call_unref(c);
        }
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
    } else {
        /* The workers keep serving the queue (finishing cancelled calls, freeing pending
         * requests) until the shutdown tag arrives; only then may the server be destroyed
         * and the queue shut down, which makes the workers exit. */
        /* wait for the shutdown tag and for every call context to be freed: a worker that
         * is still finishing a cancelled call starts batches on the queue */
        pthread_mutex_lock(&s->sd_mu);
        while (!s->sd_done || s->live) {
            struct timespec dl = pf_deadline_ms(5000);
            if (pthread_cond_timedwait(&s->sd_cv, &s->sd_mu, &dl) == ETIMEDOUT &&
                (!s->sd_done || s->live))
                pf_warn("RPC shutdown still waiting for %zu in-flight call(s)", s->live);
        }
        pthread_mutex_unlock(&s->sd_mu);
        grpc_server_destroy(s->srv);
        s->srv = NULL;
        grpc_completion_queue_shutdown(s->cq);
        for (int i = 0; i < s->nthreads; i++)
            pthread_join(s->thr[i], NULL);
    }
    if (s->srv)
        grpc_server_destroy(s->srv);
    grpc_completion_queue_destroy(s->cq);
    pthread_mutex_destroy(&s->sd_mu);
    pthread_cond_destroy(&s->sd_cv);
    pthread_mutex_destroy(&s->net_mu);
    free(s->net_peers);
    free(s->thr);
    free(s);
    pf_rpc_global_shutdown();
}

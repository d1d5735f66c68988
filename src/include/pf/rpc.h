/* gRPC plumbing over the gRPC C core (libgrpc 1.51) with protobuf-c messages.
 *
 * Server: a completion queue drained by a fixed pool of RPC threads. Each call is decoded
 * with its method's request descriptor and handed to the method's handler on the thread
 * that received it; handlers may block on bounded work only. Server-streaming methods
 * that never send ("parked" streams, like Session) hold no thread: the layer watches the
 * call and invokes stream_closed when the client disconnects or the server stops.
 * Messages up to 64 MiB both ways, HTTP/2 keepalive 30 s / 20 s, SO_REUSEPORT off (a busy
 * port is an error). Unknown methods get UNIMPLEMENTED naming the method. Every call is
 * counted in <prefix>_rpc_requests_total{method,status} and timed in
 * <prefix>_rpc_duration_seconds{method,status}.
 *
 * Client: channels with a deadline on every call; gRPC status codes are mapped to -errno
 * for return values and reported verbatim in struct pf_rpc_status. */
#ifndef PF_RPC_H
#define PF_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "pf/common.h"

/* gRPC status codes (values of grpc_status_code), so headers need not include grpc. */
enum pf_grpc_code {
    PF_GRPC_OK = 0,
    PF_GRPC_CANCELLED = 1,
    PF_GRPC_UNKNOWN = 2,
    PF_GRPC_INVALID_ARGUMENT = 3,
    PF_GRPC_DEADLINE_EXCEEDED = 4,
    PF_GRPC_NOT_FOUND = 5,
    PF_GRPC_ALREADY_EXISTS = 6,
    PF_GRPC_PERMISSION_DENIED = 7,
    PF_GRPC_RESOURCE_EXHAUSTED = 8,
    PF_GRPC_FAILED_PRECONDITION = 9,
    PF_GRPC_ABORTED = 10,
    PF_GRPC_OUT_OF_RANGE = 11,
    PF_GRPC_UNIMPLEMENTED = 12,
    PF_GRPC_INTERNAL = 13,
    PF_GRPC_UNAVAILABLE = 14,
    PF_GRPC_DATA_LOSS = 15,
    PF_GRPC_UNAUTHENTICATED = 16,
};

#define PF_RPC_MSG_MAX (64u << 20)
#define PF_RPC_ERRMSG  512

struct pf_rpc_status {
    int code; /* enum pf_grpc_code */
    char msg[PF_RPC_ERRMSG];
};

/* "INVALID_ARGUMENT" etc.; "OK" for 0. */
const char *pf_grpc_code_name(int code);
/* Engine convention: the rows of pf_errno_codes (errno -> status; documented in
 * docs/server.md "Error codes"); 0 -> OK; any errno not in the table -> INTERNAL. */
struct pf_errno_code {
    int err; /* positive errno */
    int code;
};
extern const struct pf_errno_code pf_errno_codes[];
extern const size_t pf_errno_ncodes;
int pf_grpc_code_from_errno(int neg_errno);
/* Client side: OK -> 0, INVALID_ARGUMENT -> -EINVAL, FAILED_PRECONDITION -> -EPERM,
 * DEADLINE_EXCEEDED -> -ETIMEDOUT, UNAVAILABLE -> -ECONNREFUSED, UNIMPLEMENTED ->
 * -EOPNOTSUPP, INTERNAL -> -EIO, NOT_FOUND -> -ENOENT, RESOURCE_EXHAUSTED -> -ENOBUFS,
 * CANCELLED -> -ECANCELED, others -> -EPROTO. */
int pf_errno_from_grpc_code(int code);

/* ------------------------------------------------------------------ server */

struct pf_rpc_call;

/* Handler of a unary method. Either responds with pf_rpc_respond() and returns 0, or
 * returns pf_rpc_fail(...). Runs on an RPC thread. */
typedef int (*pf_rpc_unary_fn)(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *req);
/* Opens a parked server stream. Return 0 to park it (stream_closed fires later, exactly
 * once), or pf_rpc_fail(...) to end the call with that status. */
typedef int (*pf_rpc_stream_open_fn)(void *ctx, struct pf_rpc_call *call,
                                     const ProtobufCMessage *req, void **stream_ctx_p);
/* The parked stream ended: cancelled = the client went away (or the server stops). */
typedef void (*pf_rpc_stream_closed_fn)(void *ctx, void *stream_ctx, bool cancelled);

/* Handler of a unary method that decodes its own request bytes (hot paths avoiding
 * protobuf-c's per-field allocations). data is valid during the call. */
typedef int (*pf_rpc_raw_fn)(void *ctx, struct pf_rpc_call *call, const uint8_t *data, size_t len);

struct pf_rpc_method {
    const char *path;        /* "/pegaflow.Engine/Save" */
    const char *metric_name; /* "save" */
    const ProtobufCMessageDescriptor *req_desc;
    pf_rpc_unary_fn unary;
    pf_rpc_raw_fn raw; /* instead of unary: the request is not unpacked */
    /* raw only: the handler applies pf_rpc_validate's rules to the request in its own pass
     * over the bytes (the same errors and messages, the first in wire order), so the server
     * does not validate it first */
    bool checks_request;
    pf_rpc_stream_open_fn stream_open;
    pf_rpc_stream_closed_fn stream_closed;
    /* The handler may wait on the network (connects to a peer). Such handlers run on at most
     * network_slots RPC threads at once, and at most PF_RPC_NET_PER_PEER per caller address;
     * past either they are answered RESOURCE_EXHAUSTED at once, so they can never occupy the
     * threads local clients need. */
    bool network;
};

#define PF_RPC_NET_PER_PEER 2

struct pf_auth;
struct pf_rpc_access_rule;

struct pf_rpc_server_config {
    const char *addr; /* host:port; port 0 = pick one (see bound_port) */
    int threads;
    const struct pf_rpc_method *methods;
    size_t nmethods;
    void *ctx;                 /* handlers' first argument */
    const char *metric_prefix; /* "pegaflow" or "pegaflow_metaserver" */
    int network_slots;         /* 0: max(1, threads / 4) */
    /* Decode budget: requests in flight may hold at most this many bytes of encoded size
     * x PF_RPC_DECODE_FACTOR; past it a request is RESOURCE_EXHAUSTED. 0: 256 MiB. */
    uint64_t request_memory;
    /* Security (pf/auth.h; all optional). auth: TLS on addr and the cluster token; rules:
     * method classes (NULL: every method is PEER); local_only: LOCAL methods refuse remote
     * callers without the token; local_addr: a second, plaintext listener ("unix:PATH"). */
    const struct pf_auth *auth;
    const struct pf_rpc_access_rule *rules;
    size_t nrules;
    bool local_only;
    const char *local_addr;
    /* the Unix socket of local_addr is created mode 0660 (owner and group read/write; no
     * window with a wider mode); local_gid_set: chown'ed to group local_gid */
    bool local_gid_set;
    unsigned local_gid;
};

#define PF_RPC_DECODE_FACTOR      4
#define PF_RPC_DEFAULT_REQ_MEMORY (256ull << 20)

struct pf_rpc_server;

/* Binds and starts the threads. Errors (-EADDRINUSE, -EINVAL, ...) come with a one-line
 * reason in err. */
int pf_rpc_server_start(const struct pf_rpc_server_config *cfg, struct pf_rpc_server **s_p,
                        int *bound_port_p, char *err, size_t errlen);
/* Cancels every call (parked streams see stream_closed(cancelled=true)), waits for
 * handlers to return, joins the threads and frees. Accepts NULL. */
void pf_rpc_server_stop(struct pf_rpc_server *s);

/* Packs msg as the call's response (msg may live on the handler's stack). Returns 0. */
int pf_rpc_respond(struct pf_rpc_call *call, const ProtobufCMessage *msg);
/* Sets the call's error status and message; returns code (non-zero) for handlers to
 * return directly: return pf_rpc_fail(call, PF_GRPC_INVALID_ARGUMENT, "bad %s", x); */
int pf_rpc_fail(struct pf_rpc_call *call, int code, const char *fmt, ...) PF_PRINTF(3, 4);
/* True once the caller cancelled or went away, or the call's deadline passed: a long
 * handler checks it between steps and stops (its answer would reach nobody). */
bool pf_rpc_call_expired(struct pf_rpc_call *call);
/* Undo for state a handler created that only its answer hands over (a query's lease): if
 * the call ends cancelled (the caller went away or its deadline passed before the answer
 * was delivered), fn(ctx, arg, len) runs once, on an RPC thread, with a copy of arg. If
 * the call is already known cancelled it runs now, on the calling thread. At most one per
 * call. 0; -EINVAL (len > PF_RPC_UNDO_MAX or no fn); -EBUSY (one is already registered).
 * A call the client completed normally never runs it, nor does pf_rpc_server_stop cancelling
 * the calls still open (the process is going away; their callers may have the answer). */
#define PF_RPC_UNDO_MAX 32
typedef void (*pf_rpc_undo_fn)(void *ctx, const void *arg, size_t len);
int pf_rpc_call_on_cancel(struct pf_rpc_call *call, pf_rpc_undo_fn fn, void *ctx, const void *arg,
                          size_t len);
/* The value of the first request metadata entry named key (lower case), its length in
 * *len_p; NULL when absent. Valid during the handler. */
const void *pf_rpc_call_metadata(struct pf_rpc_call *call, const char *key, size_t *len_p);
/* Peer address of the call ("ipv4:1.2.3.4:5678"), valid during the handler. */
const char *pf_rpc_call_peer(struct pf_rpc_call *call);

/* ------------------------------------------------------------------ client */

struct pf_rpc_channel;

/* target: "host:port". Connection is lazy; a failed connect is retried with a short
 * backoff (100 ms .. 1 s) so a restarted server is reachable again quickly. */
int pf_rpc_channel_open(const char *target, struct pf_rpc_channel **ch_p);
/* pf_rpc_channel_open for a caller that takes every failed call as final and has its own
 * fallback (the server's MetaServer queries and peer calls): no gRPC retry buffering or
 * channelz counting on its calls (pf/auth.h lean_calls). */
int pf_rpc_channel_open_lean(const char *target, struct pf_rpc_channel **ch_p);
void pf_rpc_channel_close(struct pf_rpc_channel *ch);
/* Drops the channel's reconnect backoff: the next call connects at once. For a caller
 * that knows the server just came back (a restart); calls in flight are unaffected. */
void pf_rpc_channel_reconnect(struct pf_rpc_channel *ch);
const char *pf_rpc_channel_target(const struct pf_rpc_channel *ch);

/* One unary call with a deadline of timeout_ms. On OK returns 0 and *resp_p is the
 * unpacked response (free with protobuf_c_message_free_unpacked(*resp_p, NULL)). On error
 * returns -errno (pf_errno_from_grpc_code) and fills st (may be NULL). */
int pf_rpc_unary(struct pf_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                 ProtobufCMessage **resp_p, struct pf_rpc_status *st);
/* Like pf_rpc_unary with an already encoded request (any bytes: tests and tools that send
 * what a protobuf encoder would not). */
int pf_rpc_unary_raw(struct pf_rpc_channel *ch, const char *path, const uint8_t *data, size_t len,
                     const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                     ProtobufCMessage **resp_p, struct pf_rpc_status *st);
/* Like pf_rpc_unary_raw with a malloc'ed request it takes over (sent without a copy, freed
 * when gRPC is done with it, also on error). */
int pf_rpc_unary_take(struct pf_rpc_channel *ch, const char *path, uint8_t *data, size_t len,
                      const ProtobufCMessageDescriptor *resp_desc, uint64_t timeout_ms,
                      ProtobufCMessage **resp_p, struct pf_rpc_status *st);

/* A unary call in two halves, for a caller with work to do while the answer travels:
 * pf_rpc_unary_start sends the request and returns at once; pf_rpc_unary_finish waits for
 * the answer (at most the call's deadline) with pf_rpc_unary's results and frees the call.
 * Contract: finish runs on the thread that started the call (the call completes on that
 * thread's completion queue), exactly once per started call; a thread may hold several.
 * finish with resp_p NULL cancels the call and returns -ECANCELED. start returns 0 or
 * -errno with st filled (nothing to finish then). */
struct pf_rpc_pending;
int pf_rpc_unary_start(struct pf_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                       uint64_t timeout_ms, struct pf_rpc_pending **p_p, struct pf_rpc_status *st);
int pf_rpc_unary_finish(struct pf_rpc_pending *p, const ProtobufCMessageDescriptor *resp_desc,
                        ProtobufCMessage **resp_p, struct pf_rpc_status *st);

/* A server-streaming call held open (e.g. Session). Messages are not read; the call stays
 * open until pf_rpc_stream_close or until the server ends it. open waits up to timeout_ms
 * for the server to accept it (its initial metadata) and fails when the server answered
 * with an error status instead. */
struct pf_rpc_stream;
int pf_rpc_stream_open(struct pf_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                       uint64_t timeout_ms, struct pf_rpc_stream **s_p, struct pf_rpc_status *st);
/* True while the server has not ended the call. */
bool pf_rpc_stream_alive(struct pf_rpc_stream *s);
void pf_rpc_stream_close(struct pf_rpc_stream *s);

/* Process-wide gRPC init/shutdown (refcounted, thread-safe). The first init also turns
 * off abseil's Mutex deadlock detection (on in abseil builds without NDEBUG, such as
 * Debian's: a global lock-graph lookup on every absl::Mutex lock inside gRPC), as abseil's
 * release builds have it. */
void pf_rpc_global_init(void);
void pf_rpc_global_shutdown(void);
/* True once an init found abseil's SetMutexDeadlockDetectionMode and set kIgnore. */
bool pf_rpc_absl_deadlock_checks_off(void);

#endif

/* Fake RPC call for the fuzz targets (see fuzz.h): the --wrap'ed pf_rpc_fail,
 * pf_rpc_respond, pf_rpc_call_peer, pf_rpc_call_expired, pf_rpc_call_on_cancel and
 * pf_rpc_call_identities record
 * the handler's answer in struct pf_rpc_call and describe a loopback caller. Every
 * pf_rpc_call_* accessor a handler uses must be wrapped here (and in FUZZ_WRAPS). */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "pf/auth.h"

int __wrap_pf_rpc_respond(struct pf_rpc_call *call, const ProtobufCMessage *msg);
int __wrap_pf_rpc_fail(struct pf_rpc_call *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *__wrap_pf_rpc_call_peer(struct pf_rpc_call *call);
bool __wrap_pf_rpc_call_expired(struct pf_rpc_call *call);
int __wrap_pf_rpc_call_on_cancel(struct pf_rpc_call *call, pf_rpc_undo_fn fn, void *ctx,
                                 const void *arg, size_t len);
void __wrap_pf_rpc_call_identities(struct pf_rpc_call *call, char (*ips)[PF_AUTH_IP_MAX],
                                   size_t max, size_t *n_p);

void (*fz_response_hook)(const ProtobufCMessage *msg);
void (*fz_cleanup_hook)(void);

_Noreturn void fz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FUZZ CHECK FAILED: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (fz_cleanup_hook)
        fz_cleanup_hook();
    abort();
}

void fz_call_reset(struct pf_rpc_call *c)
{
    memset(c, 0, sizeof(*c));
}

int __wrap_pf_rpc_respond(struct pf_rpc_call *call, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        fz_fail("out of memory packing a %s", msg->descriptor->name);
    if (protobuf_c_message_pack(msg, buf) != n)
        fz_fail("%s: packed size differs from get_packed_size", msg->descriptor->name);
    ProtobufCMessage *back = protobuf_c_message_unpack(msg->descriptor, NULL, n, buf);
    if (!back)
        fz_fail("%s: the response does not unpack again", msg->descriptor->name);
    protobuf_c_message_free_unpacked(back, NULL);
    free(buf);
    call->responses++;
    if (fz_response_hook)
        fz_response_hook(msg);
    return 0;
}

int __wrap_pf_rpc_fail(struct pf_rpc_call *call, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->msg, sizeof(call->msg), fmt, ap);
    va_end(ap);
    call->code = code ? code : PF_GRPC_INTERNAL;
    return call->code;
}

const char *__wrap_pf_rpc_call_peer(struct pf_rpc_call *call)
{
    return "ipv4:127.0.0.1:1";
}

/* a fuzzed call never has a caller that went away */
bool __wrap_pf_rpc_call_expired(struct pf_rpc_call *call)
{
    return false;
}

/* ... so an undo never runs; the contract's argument checks still apply */
int __wrap_pf_rpc_call_on_cancel(struct pf_rpc_call *call, pf_rpc_undo_fn fn, void *ctx,
                                 const void *arg, size_t len)
{
    if (!fn || len > PF_RPC_UNDO_MAX || (len && !arg))
        fz_fail("pf_rpc_call_on_cancel with fn=%p len=%zu", (void *)fn, len);
    return 0;
}

/* the caller has proven its loopback transport address, nothing else (no TLS) */
void __wrap_pf_rpc_call_identities(struct pf_rpc_call *call, char (*ips)[PF_AUTH_IP_MAX],
                                   size_t max, size_t *n_p)
{
    size_t n = 0;
    if (max > 0)
        snprintf(ips[n++], PF_AUTH_IP_MAX, "127.0.0.1");
    *n_p = n;
}

static void check_error(const char *method, int rc, const struct pf_rpc_call *c)
{
    if (c->code == 0)
        fz_fail("%s returned %d without setting a status", method, rc);
    if (rc != c->code)
        fz_fail("%s returned %d but set status %s (%s)", method, rc, pf_grpc_code_name(c->code),
                c->msg);
    if (c->code == PF_GRPC_INTERNAL)
        fz_fail("%s answered INTERNAL to a client request: %s", method, c->msg);
    if (!c->msg[0])
        fz_fail("%s answered %s without a message", method, pf_grpc_code_name(c->code));
}

static void trace(const char *method, int rc, const struct pf_rpc_call *c)
{
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("FZ_VERBOSE") != NULL;
    if (verbose)
        fprintf(stderr, "fuzz: %s -> %d %s%s%s\n", method, rc,
                c->code ? pf_grpc_code_name(c->code) : "OK", c->msg[0] ? ": " : "", c->msg);
}

void fz_check_unary(const char *method, int rc, const struct pf_rpc_call *c)
{
    trace(method, rc, c);
    if (rc != 0) {
        check_error(method, rc, c);
        return;
    }
    if (c->code != 0)
        fz_fail("%s returned 0 after failing with %s (%s)", method, pf_grpc_code_name(c->code),
                c->msg);
    if (c->responses != 1)
        fz_fail("%s returned 0 with %d responses", method, c->responses);
}

void fz_check_stream(const char *method, int rc, const struct pf_rpc_call *c)
{
    trace(method, rc, c);
    if (rc != 0) {
        check_error(method, rc, c);
        return;
    }
    if (c->code != 0 || c->responses != 0)
        fz_fail("%s parked a stream after answering (status %d, %d responses)", method, c->code,
                c->responses);
}

/* Shared helpers of the libFuzzer targets (tests/fuzz/fuzz_*.c, built by mk/fuzz.mk).
 *
 * RPC handlers run against a fake call (fake_rpc.c): the targets are linked with
 * -Wl,--wrap=pf_rpc_fail,--wrap=pf_rpc_respond,--wrap=pf_rpc_call_peer, so a handler's
 * answer lands in struct pf_rpc_call below instead of a gRPC call. A response is packed and
 * unpacked again with its own descriptor (a message the server could not serialize is a
 * bug). fz_check_unary() asserts the handler contract the RPC layer relies on: 0 with
 * exactly one response, or a non-zero gRPC code equal to the return value, never INTERNAL
 * (bad client input is never an internal error). A violation aborts with the method, code
 * and message, which libFuzzer reports as a crash. FZ_VERBOSE=1 in the environment prints
 * every handler's answer (replaying one input). */
#ifndef PF_FUZZ_H
#define PF_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/rpc.h"

struct pf_rpc_call {
    int code;
    char msg[PF_RPC_ERRMSG];
    int responses;
};

void fz_call_reset(struct pf_rpc_call *c);
/* Aborts unless (rc == 0, code 0, one response) or (rc == code != 0, code != INTERNAL). */
void fz_check_unary(const char *method, int rc, const struct pf_rpc_call *c);
/* Stream open: 0 with no response sent (parked), or as fz_check_unary for an error. */
void fz_check_stream(const char *method, int rc, const struct pf_rpc_call *c);
/* Called with every response a handler sends (after the checks), when set. */
extern void (*fz_response_hook)(const ProtobufCMessage *msg);
/* Run by fz_fail before it aborts, when set (a target removing its shm objects). */
extern void (*fz_cleanup_hook)(void);
/* Prints the failure and aborts (libFuzzer then saves the input). */
_Noreturn void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

/* Request validation on the wire, before protobuf-c decodes anything: every string field
 * (at any depth) must be valid for C (no NUL byte) and within the string cap; every
 * repeated field within the element cap. protobuf-c itself would accept "<id>\0junk" and
 * hand the handler "<id>", and would allocate whatever a request asks for. */
#ifndef PF_RPC_VALIDATE_H
#define PF_RPC_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Caps every request of both services obeys (docs/server.md "Request limits"). */
#define PF_RPC_MAX_STRING   1023u      /* bytes in one string field */
#define PF_RPC_MAX_REPEATED (1u << 22) /* elements of one repeated field */
#define PF_RPC_MAX_DEPTH    8u         /* nested messages */

/* 0 when the encoded message obeys the rules above, else -EINVAL (malformed or NUL),
 * -EMSGSIZE (string over the cap) or -E2BIG (repeated field over the cap), with a message
 * naming Message.field. Fields unknown to d are skipped (as protobuf does). */
int pf_rpc_validate(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, char *err,
                    size_t errlen);

#endif

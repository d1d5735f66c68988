/* Private helpers of src/rpc: protobuf-c <-> grpc_byte_buffer. */
#ifndef PF_RPC_INTERNAL_H
#define PF_RPC_INTERNAL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <protobuf-c/protobuf-c.h>

struct pf_auth;

/* Packs msg into a new byte buffer (caller destroys). */
grpc_byte_buffer *pf_rpc_pack(const ProtobufCMessage *msg);
/* Flattens a received buffer into one slice (caller unrefs). */
grpc_slice pf_rpc_bb_to_slice(grpc_byte_buffer *bb);
/* Server credentials of a listener: SSL when a has a certificate (requiring a client
 * certificate signed by a->ca_pem when set), else insecure. Caller releases. */
grpc_server_credentials *pf_auth_server_creds(const struct pf_auth *a);
struct pf_rpc_call;
/* The core call behind a handler's call (server.c). */
grpc_call *pf_rpc_call_grpc(struct pf_rpc_call *call);

#endif

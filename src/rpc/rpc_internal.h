/* Private helpers of src/rpc: protobuf-c <-> grpc_byte_buffer. */
#ifndef PF_RPC_INTERNAL_H
#define PF_RPC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

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
/* Decode arena (arena.c): a request of PF_RPC_ARENA_MIN decode-budget bytes or more decodes
 * into one anonymous mapping of its budget (bump allocation, unmapped whole after the
 * handler), so its many small pieces (a Save of 4,096 blocks x 32 layers has 131,072
 * hashes) neither cost a malloc and a free each nor stay behind in the RPC thread's heap.
 * Pieces past the mapping fall back to malloc. Smaller requests use malloc (the mapping's
 * page faults cost more than it saves there). */
#define PF_RPC_ARENA_MIN (8u << 20)
struct pf_rpc_arena {
    char *base;
    size_t cap, used;
};
/* Maps a for a request of budget cost and returns the allocator to decode with; NULL (plain
 * malloc) when cost is below PF_RPC_ARENA_MIN or the mapping fails. */
ProtobufCAllocator *pf_rpc_arena_open(struct pf_rpc_arena *a, ProtobufCAllocator *pa,
                                      uint64_t cost);
/* Unmaps the arena (after protobuf_c_message_free_unpacked with its allocator). Accepts a
 * zeroed arena. */
void pf_rpc_arena_close(struct pf_rpc_arena *a);

struct pf_rpc_call;
/* The core call behind a handler's call (server.c). */
grpc_call *pf_rpc_call_grpc(struct pf_rpc_call *call);

#endif

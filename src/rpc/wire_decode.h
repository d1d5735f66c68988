/* Hot requests decoded in place, without protobuf-c's unpack (which allocates and copies
 * every repeated element: 0.2 ms for 4,096 hashes on the development VM):
 *   - SaveRequest (the engine's Save),
 *   - QueryPrefixBlocksRequest (the MetaServer's prefix query, on every cold query of a P2P
 *     node).
 * Each accepts exactly what protobuf-c's unpack of its message accepts, with the same values:
 * scalar and string fields last-one-wins, unknown fields skipped; a known field of another
 * wire type, a truncated field or varint, or an unterminated packed field is malformed.
 * String rules (length, NUL bytes) and repeated-field caps are pf_rpc_validate's: the server
 * checks them before the handler decodes. tests/unit/rpc/test_wire_decode.c compares both
 * decoders with protobuf-c's on random, hand-made and mutated encodings.
 *
 * SaveRequest (engine.proto) decoded in place: a Save carries a hash and a block id per block
 * and layer, thousands per call; protobuf-c's unpack allocated and copied each hash and took
 * 0.3-0.5 ms for 4,096 blocks on the development VM, about as long as the server's whole
 * planning of the save. Here the hashes point into the request bytes and the block ids are
 * decoded into one array.
 *
 * Every `saves` element is a layer; block_ids packed or not (both may appear); uint32 and
 * int32 values keep the low 32 bits of their varint, as protobuf-c does. */
#ifndef PF_RPC_WIRE_DECODE_H
#define PF_RPC_WIRE_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "pf/bytes.h"
#include "pf/engine.h"
#include "pf/meta.h"

struct pf_wire_save {
    const char *instance_id; /* "" when absent */
    uint32_t tp_rank, pp_rank;
    int32_t device_id;
    struct pf_engine_save_layer *layers; /* names "" when absent */
    size_t nlayers;
    /* storage: one allocation for the layers, ids, hash references and strings */
    void *mem;
};

/* Decodes data[0, len) into *s. The hashes point into data, which must outlive *s. Returns 0,
 * -EBADMSG (malformed), or -ENOMEM. On error *s holds nothing to free. */
int pf_wire_decode_save(const uint8_t *data, size_t len, struct pf_wire_save *s);
void pf_wire_save_free(struct pf_wire_save *s);

/* QueryPrefixBlocksRequest: the namespace copied, the hashes pointing into the request. */
struct pf_wire_prefix_query {
    const char *ns; /* "" when absent */
    struct pf_meta_hash *hashes;
    size_t n;
    void *mem;
};

/* As pf_wire_decode_save, for a QueryPrefixBlocksRequest. */
int pf_wire_decode_prefix_query(const uint8_t *data, size_t len, struct pf_wire_prefix_query *q);
void pf_wire_prefix_query_free(struct pf_wire_prefix_query *q);

#endif

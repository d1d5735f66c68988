/* Minimal protobuf wire-format reader for hot requests decoded without copies (the
 * QueryRequest of a prefix query carries thousands of hashes: protobuf-c would allocate each
 * one). Fields are visited in order; length-delimited values point into the input buffer. */
#ifndef PF_RPC_WIRE_H
#define PF_RPC_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pf_wire {
    const uint8_t *p, *end;
};

struct pf_wire_field {
    uint32_t number;
    uint32_t type; /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t varint;
    const uint8_t *data; /* type 2 */
    size_t len;
};

/* Next field: 1 when one was read, 0 at the end, -1 on malformed input. */
int pf_wire_next(struct pf_wire *w, struct pf_wire_field *f);

#endif

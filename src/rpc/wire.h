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

/* Reads a varint at w->p: 0, or -1 when it is truncated or longer than 10 bytes. */
static inline int pf_wire_get_varint(struct pf_wire *w, uint64_t *v)
{
    uint64_t r = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (w->p >= w->end)
            return -1;
        uint8_t b = *w->p++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -1;
}

/* Next field: 1 when one was read, 0 at the end, -1 on malformed input (truncated varints
 * and lengths, field number 0 or above 2^29-1, the deprecated group wire types). Inline:
 * a QueryRequest's thousands of hash fields are read with it twice (validation, decode). */
static inline int pf_wire_next(struct pf_wire *w, struct pf_wire_field *f)
{
    if (w->p >= w->end)
        return 0;
    uint64_t key;
    if (w->p[0] < 0x80) { /* one-byte key: field numbers 1..15, the common case */
        key = *w->p++;
    } else if (pf_wire_get_varint(w, &key) != 0) {
        return -1;
    }
    f->number = (uint32_t)(key >> 3);
    f->type = (uint32_t)(key & 7);
    if (f->number == 0 || key >> 3 > 0x1fffffff)
        return -1;
    switch (f->type) {
    case 0:
        return pf_wire_get_varint(w, &f->varint) == 0 ? 1 : -1;
    case 1:
        if (w->end - w->p < 8)
            return -1;
        w->p += 8;
        return 1;
    case 5:
        if (w->end - w->p < 4)
            return -1;
        w->p += 4;
        return 1;
    case 2: {
        uint64_t len;
        if (w->p < w->end && w->p[0] < 0x80)
            len = *w->p++;
        else if (pf_wire_get_varint(w, &len) != 0)
            return -1;
        if (len > (uint64_t)(w->end - w->p))
            return -1;
        f->data = w->p;
        f->len = (size_t)len;
        w->p += len;
        return 1;
    }
    default:
        return -1;
    }
}

/* Writer side, for hot requests encoded without protobuf-c's per-element descriptor walk
 * (the client's QueryRequest). The caller sizes the buffer with pf_wire_varint_size /
 * pf_wire_len_field_size; the put functions return the position after what they wrote. */
static inline size_t pf_wire_varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *pf_wire_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Bytes a length-delimited field (key, length, len bytes) of field number `number` takes. */
static inline size_t pf_wire_len_field_size(uint32_t number, size_t len)
{
    return pf_wire_varint_size((uint64_t)number << 3 | 2) + pf_wire_varint_size(len) + len;
}

static inline uint8_t *pf_wire_put_len_field(uint8_t *p, uint32_t number, const void *data,
                                             size_t len)
{
    p = pf_wire_put_varint(p, (uint64_t)number << 3 | 2);
    p = pf_wire_put_varint(p, len);
    if (len)
        __builtin_memcpy(p, data, len);
    return p + len;
}

/* A varint field (key, value). */
static inline size_t pf_wire_varint_field_size(uint32_t number, uint64_t v)
{
    return pf_wire_varint_size((uint64_t)number << 3) + pf_wire_varint_size(v);
}

static inline uint8_t *pf_wire_put_varint_field(uint8_t *p, uint32_t number, uint64_t v)
{
    return pf_wire_put_varint(pf_wire_put_varint(p, (uint64_t)number << 3), v);
}

/* QueryRequest (engine.proto) encoded by hand into one malloc'ed buffer: the same bytes
 * protobuf-c's packer writes (fields in number order, proto3 defaults left out), without its
 * descriptor walk per hash (about 10 ns a hash, more than the server's lookup of it).
 * hashes: n hashes back to back, each hash_lens[i] bytes, or hash_len bytes when hash_lens
 * is NULL; NULL strings count as empty. Returns the buffer (*len_p bytes) or NULL on
 * ENOMEM. */
uint8_t *pf_wire_encode_query(const char *instance_id, const char *req_id, const uint8_t *hashes,
                              const uint32_t *hash_lens, uint32_t hash_len, size_t n,
                              bool wait_for_full_prefix, uint32_t group_id, size_t *len_p);

#endif

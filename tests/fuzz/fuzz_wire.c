/* Fuzz target: the protobuf wire reader (src/rpc/wire.c) against protobuf-c.
 *
 * The input is decoded twice: field by field with pf_wire_next, and by protobuf-c as a
 * HealthRequest (a message without fields, so protobuf-c keeps every field as an unknown
 * field with its tag, wire type and raw bytes). Checks:
 *   - pf_wire_next always makes progress and never points outside the input (ASan sees the
 *     exact-size buffer libFuzzer passes);
 *   - whatever protobuf-c accepts, pf_wire accepts too, with the same fields in the same
 *     order: number, wire type, varint value, length-delimited bytes;
 *   - where they differ it is a known policy difference, not a format bug: pf_wire accepts
 *     keys encoded in 6..10 bytes (protobuf-c refuses them) and refuses field numbers
 *     outside 1..2^29-1 (protobuf-c truncates a 5-byte key to 32 bits).
 * Then the same bytes go through a QueryRequest decode the way h_query reads it (the
 * fast path of QueryPrefetch) and protobuf-c's generated QueryRequest unpacker: when both
 * accept, instance_id, the hashes, req_id and the flags agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.pb-c.h"
#include "fuzz.h"
#include "rpc/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t raw_varint(const uint8_t *p, size_t len)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len && i < 10; i++)
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
    return v;
}

/* Length of the key varint at p (1..10), 0 if none. */
static size_t key_len(const uint8_t *p, const uint8_t *end)
{
    for (size_t i = 0; i < 10 && p + i < end; i++)
        if (!(p[i] & 0x80))
            return i + 1;
    return 0;
}

static void check_fields(const uint8_t *data, size_t size)
{
    struct pf_wire w = {data, data + size};
    struct pf_wire_field f = {0};
    size_t nf = 0;
    bool long_key = false;
    int r;
    const uint8_t *before = w.p;
    while ((r = pf_wire_next(&w, &f)) == 1) {
        if (w.p <= before || w.p > data + size)
            fz_fail("pf_wire_next: no progress or past the end");
        size_t kl = key_len(before, data + size);
        if (kl > 5)
            long_key = true;
        if (f.type == 2 && (f.data < data || f.data + f.len > data + size))
            fz_fail("pf_wire_next: field %u points outside the input", f.number);
        before = w.p;
        nf++;
    }
    if (r != 0 && r != -1)
        fz_fail("pf_wire_next returned %d", r);
    bool wire_ok = r == 0;
    /* protobuf-c truncates a key's 5th byte to 32 bits; pf_wire refuses field numbers
     * outside 1..2^29-1 as the protobuf spec says */
    bool strict_key = false;
    if (!wire_ok) {
        size_t kl = key_len(before, data + size);
        uint64_t key = raw_varint(before, kl);
        strict_key = kl > 0 && (key >> 3 == 0 || key >> 3 > 0x1fffffff);
    }

    ProtobufCMessage *m =
        protobuf_c_message_unpack(&pegaflow__health_request__descriptor, NULL, size, data);
    if (!m)
        return; /* pf_wire may accept more (long keys) */
    if (!wire_ok) {
        if (!long_key && !strict_key)
            fz_fail("protobuf-c accepts %zu bytes that pf_wire refuses", size);
        protobuf_c_message_free_unpacked(m, NULL);
        return;
    }
    if (m->n_unknown_fields != nf)
        fz_fail("protobuf-c sees %u fields, pf_wire %zu", m->n_unknown_fields, nf);
    w = (struct pf_wire){data, data + size};
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
        if (pf_wire_next(&w, &f) != 1)
            fz_fail("field %u: pf_wire ended early", i);
        if (f.number != u->tag || f.type != (uint32_t)u->wire_type)
            fz_fail("field %u: pf_wire %u/%u, protobuf-c %u/%d", i, f.number, f.type, u->tag,
                    (int)u->wire_type);
        if (f.type == 0 && f.varint != raw_varint(u->data, u->len))
            fz_fail("field %u: varint differs", i);
        /* protobuf-c keeps a length-delimited field with its length prefix */
        if (f.type == 2 && (u->len < f.len || raw_varint(u->data, u->len - f.len) != f.len ||
                            memcmp(f.data, u->data + (u->len - f.len), f.len) != 0))
            fz_fail("field %u: bytes differ (%zu vs %zu with prefix)", i, f.len, u->len);
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

/* The QueryRequest reading of h_query (engine_service.c), field by field. */
struct fast_query {
    const uint8_t *inst, *req;
    size_t inst_len, req_len, nh;
    bool wait;
    uint32_t group;
};

static bool fast_decode(const uint8_t *data, size_t size, struct fast_query *q)
{
    memset(q, 0, sizeof(*q));
    struct pf_wire w = {data, data + size};
    struct pf_wire_field f = {0};
    int r;
    while ((r = pf_wire_next(&w, &f)) == 1) {
        switch (f.number) {
        case 1:
        case 3:
            if (f.type != 2 || memchr(f.data, 0, f.len))
                return false;
            if (f.number == 1) {
                q->inst = f.data;
                q->inst_len = f.len;
            } else {
                q->req = f.data;
                q->req_len = f.len;
            }
            break;
        case 2:
            if (f.type != 2)
                return false;
            q->nh++;
            break;
        case 4:
            if (f.type != 0)
                return false;
            q->wait = f.varint != 0;
            break;
        case 5:
            if (f.type != 0 || f.varint > UINT32_MAX)
                return false;
            q->group = (uint32_t)f.varint;
            break;
        default:
            break;
        }
    }
    return r == 0;
}

static bool str_eq(const char *s, const uint8_t *p, size_t n)
{
    if (!p)
        return !s || !*s;
    return s && strlen(s) == n && memcmp(s, p, n) == 0;
}

static void check_query(const uint8_t *data, size_t size)
{
    struct fast_query q;
    if (!fast_decode(data, size, &q))
        return;
    Pegaflow__QueryRequest *m = pegaflow__query_request__unpack(NULL, size, data);
    if (!m)
        return; /* protobuf-c refuses more (e.g. invalid UTF-8 in strings, long keys) */
    if (!str_eq(m->instance_id, q.inst, q.inst_len) || !str_eq(m->req_id, q.req, q.req_len))
        fz_fail("QueryRequest: strings differ between the fast path and protobuf-c");
    if (m->n_block_hashes != q.nh)
        fz_fail("QueryRequest: %zu hashes, protobuf-c %zu", q.nh, m->n_block_hashes);
    struct pf_wire w = {data, data + size};
    struct pf_wire_field f = {0};
    size_t k = 0;
    while (pf_wire_next(&w, &f) == 1)
        if (f.number == 2) {
            const ProtobufCBinaryData *h = &m->block_hashes[k++];
            if (h->len != f.len || (f.len && memcmp(h->data, f.data, f.len) != 0))
                fz_fail("QueryRequest: hash %zu differs", k - 1);
        }
    if (m->wait_for_full_prefix != q.wait || m->group_id != q.group)
        fz_fail("QueryRequest: flags differ (wait %d/%d, group %u/%u)", q.wait,
                m->wait_for_full_prefix, q.group, m->group_id);
    pegaflow__query_request__free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_fields(data, size);
    check_query(data, size);
    return 0;
}

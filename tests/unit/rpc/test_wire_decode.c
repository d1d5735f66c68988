/* The in-place decoders (rpc/wire_decode.h) against protobuf-c's unpack, differentially. The
 * engine's SaveRequest (pf_wire_decode_save): seeded random requests packed by protobuf-c (layers,
 * names, block ids of every varint length, hashes of 0..64 bytes, negative device ids); the same
 * with hand-made encodings protobuf-c's packer never writes (unpacked and mixed block ids, repeated
 * scalar and string fields, unknown fields of every wire type at both levels); and every one of
 * those mutated (bytes flipped, cut short, inserted). For each input both decoders must agree
 * on accepting it and, when they do, on every value. The MetaServer's QueryPrefixBlocksRequest
 * (pf_wire_decode_prefix_query): the same with random namespaces and hashes, repeated
 * namespaces, unknown fields and wrong wire types, and mutations. The server runs the
 * decoders after pf_rpc_validate (which refuses, among others, field numbers above 2^29-1 that
 * protobuf-c would truncate): inputs it refuses never reach them and are not compared. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.pb-c.h"
#include "pftest.h"
#include "rpc/validate.h"
#include "rpc/wire.h"
#include "rpc/wire_decode.h"

static uint64_t rng;

static uint64_t next(void)
{
    return pft_xorshift(&rng);
}

static size_t compared, accepted;

/* What the server does before a raw handler decodes: 0 when the bytes pass validation. */
static int validated(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len)
{
    char err[256];
    return pf_rpc_validate(d, buf, len, err, sizeof(err));
}

static size_t refused_by_validation;

/* Decodes buf both ways; fails the test where they disagree. */
static void compare(const uint8_t *buf, size_t len, const char *what)
{
    if (validated(&pegaflow__save_request__descriptor, buf, len) != 0) {
        refused_by_validation++;
        return;
    }
    Pegaflow__SaveRequest *pb = pegaflow__save_request__unpack(NULL, len, buf);
    struct pf_wire_save ws;
    int rc = pf_wire_decode_save(buf, len, &ws);
    compared++;
    if (!pb) {
        if (rc != -EBADMSG)
            fail_msg("%s (%zu bytes): protobuf-c refuses it, pf_wire_decode_save returned %d", what,
                     len, rc);
        return;
    }
    if (rc != 0)
        fail_msg("%s (%zu bytes): protobuf-c accepts it, pf_wire_decode_save returned %d", what,
                 len, rc);
    accepted++;
    assert_string_equal(ws.instance_id, pb->instance_id);
    assert_int_equal(ws.tp_rank, pb->tp_rank);
    assert_int_equal(ws.pp_rank, pb->pp_rank);
    assert_int_equal(ws.device_id, pb->device_id);
    assert_int_equal(ws.nlayers, pb->n_saves);
    for (size_t i = 0; i < ws.nlayers; i++) {
        const struct pf_engine_save_layer *l = &ws.layers[i];
        const Pegaflow__SaveLayer *p = pb->saves[i];
        assert_string_equal(l->name, p->layer_name);
        assert_int_equal(l->nids, p->n_block_ids);
        assert_int_equal(l->nhashes, p->n_block_hashes);
        for (size_t j = 0; j < l->nids; j++)
            if (l->block_ids[j] != p->block_ids[j])
                fail_msg("%s: layer %zu id %zu: %u, protobuf-c %u", what, i, j, l->block_ids[j],
                         p->block_ids[j]);
        for (size_t j = 0; j < l->nhashes; j++) {
            assert_int_equal(l->hashes[j].len, p->block_hashes[j].len);
            if (l->hashes[j].len)
                assert_memory_equal(l->hashes[j].data, p->block_hashes[j].data, l->hashes[j].len);
        }
    }
    pf_wire_save_free(&ws);
    pegaflow__save_request__free_unpacked(pb, NULL);
}

/* Mutations of a valid encoding: a flipped byte, a cut, an inserted byte, a few times each. */
static void mutate_and_compare(const uint8_t *buf, size_t len)
{
    uint8_t *m = malloc(len + 1);
    for (int k = 0; k < 24 && len; k++) {
        size_t at = next() % len;
        memcpy(m, buf, len);
        switch (k % 3) {
        case 0:
            m[at] ^= (uint8_t)(1u << (next() % 8));
            compare(m, len, "a flipped bit");
            break;
        case 1:
            compare(m, at, "a cut");
            break;
        default:
            memmove(m + at + 1, m + at, len - at);
            m[at] = (uint8_t)next();
            compare(m, len + 1, "an inserted byte");
        }
    }
    free(m);
}

static uint32_t rand_id(void)
{
    switch (next() % 4) { /* every varint length */
    case 0:
        return (uint32_t)(next() % 128);
    case 1:
        return (uint32_t)(next() % 16384);
    case 2:
        return (uint32_t)(next() % 2097152);
    default:
        return (uint32_t)next();
    }
}

/* Random requests packed by protobuf-c. */
static void test_packed_by_protobuf_c(void **st)
{
    rng = pft_seed() | 1;
    for (int round = 0; round < 400; round++) {
        Pegaflow__SaveRequest r = PEGAFLOW__SAVE_REQUEST__INIT;
        char inst[24], names[4][16];
        snprintf(inst, sizeof(inst), round % 7 ? "inst-%d" : "", round);
        r.instance_id = inst;
        r.tp_rank = (uint32_t)(next() % 3 ? next() % 8 : next());
        r.pp_rank = (uint32_t)(next() % 4);
        r.device_id =
            (int32_t)(next() % 5 == 0 ? -(int64_t)(next() % 3) - 1 : (int64_t)(next() % 8));
        size_t nl = next() % 5;
        Pegaflow__SaveLayer layers[4], *lp[4];
        uint8_t *blob = malloc(4 * 300 * 64);
        uint32_t *ids = malloc(4 * 300 * sizeof(*ids));
        ProtobufCBinaryData *bd = malloc(4 * 300 * sizeof(*bd));
        size_t bo = 0, io = 0, ho = 0;
        for (size_t i = 0; i < nl; i++) {
            pegaflow__save_layer__init(&layers[i]);
            snprintf(names[i], sizeof(names[i]), next() % 6 ? "L%zu" : "", i);
            layers[i].layer_name = names[i];
            size_t n = round < 20 ? next() % 3 : next() % 300;
            layers[i].n_block_ids = next() % 10 ? n : n + next() % 3; /* counts may differ */
            layers[i].block_ids = ids + io;
            for (size_t j = 0; j < layers[i].n_block_ids; j++)
                ids[io++] = rand_id();
            layers[i].n_block_hashes = n;
            layers[i].block_hashes = bd + ho;
            for (size_t j = 0; j < n; j++) {
                size_t hl = next() % 8 ? 32 : next() % 65;
                for (size_t b = 0; b < hl; b++)
                    blob[bo + b] = (uint8_t)next();
                bd[ho++] = (ProtobufCBinaryData){hl, blob + bo};
                bo += hl;
            }
            lp[i] = &layers[i];
        }
        r.saves = lp;
        r.n_saves = nl;
        size_t len = pegaflow__save_request__get_packed_size(&r);
        uint8_t *buf = malloc(len ? len : 1);
        assert_int_equal(pegaflow__save_request__pack(&r, buf), len);
        compare(buf, len, "packed by protobuf-c");
        if (round % 4 == 0)
            mutate_and_compare(buf, len);
        free(buf);
        free(blob);
        free(ids);
        free(bd);
    }
    print_message("%zu inputs compared, %zu accepted by both, %zu refused by validation first\n",
                  compared, accepted, refused_by_validation);
}

/* Hand-made encodings protobuf-c's packer does not write, and malformed ones. */
static uint8_t *put_layer(uint8_t *p, int variant)
{
    uint8_t inner[512], *q = inner;
    static const uint8_t h1[32] = {1, 2, 3};
    q = pf_wire_put_len_field(q, 1, "first", 5);
    q = pf_wire_put_varint_field(q, 2, 7);              /* unpacked id */
    q = pf_wire_put_len_field(q, 2, "\x81\x01\x05", 3); /* packed: 129, 5 */
    q = pf_wire_put_varint_field(q, 2, 0x1ffffffffull); /* 33 bits: the low 32 kept */
    q = pf_wire_put_len_field(q, 3, h1, 32);
    q = pf_wire_put_len_field(q, 3, "", 0); /* an empty hash */
    q = pf_wire_put_varint_field(q, 9, 42); /* unknown fields */
    *q++ = 10 << 3 | 1;
    memset(q, 0xab, 8);
    q += 8;
    *q++ = 11 << 3 | 5;
    memset(q, 0xcd, 4);
    q += 4;
    q = pf_wire_put_len_field(q, 12, "zz", 2);
    q = pf_wire_put_len_field(q, 1, "second", 6); /* the last name wins */
    switch (variant) {
    case 1:
        *q++ = 3 << 3 | 0; /* block_hashes as a varint */
        *q++ = 1;
        break;
    case 2:
        q = pf_wire_put_len_field(q, 2, "\x81", 1); /* unterminated packed id */
        break;
    case 3:
        *q++ = 2 << 3 | 5; /* block_ids as fixed32 */
        memset(q, 0, 4);
        q += 4;
        break;
    case 4:
        *q++ = 1 << 3 | 0; /* layer_name as a varint */
        *q++ = 1;
        break;
    case 5:
        *q++ = 13 << 3 | 3; /* a start-group */
        break;
    }
    return pf_wire_put_len_field(p, 4, inner, (size_t)(q - inner));
}

static void test_hand_made(void **st)
{
    rng = pft_seed() | 1;
    for (int variant = 0; variant <= 5; variant++) {
        uint8_t buf[2048], *p = buf;
        p = pf_wire_put_len_field(p, 1, "a", 1);
        p = pf_wire_put_varint_field(p, 3, (uint64_t)(int64_t)-2); /* 10-byte int32 */
        p = put_layer(p, 0);
        p = pf_wire_put_varint_field(p, 2, 3);
        p = pf_wire_put_varint_field(p, 2, 0x100000005ull); /* the last tp_rank wins: 5 */
        p = pf_wire_put_len_field(p, 1, "inst", 4);         /* the last id wins */
        p = pf_wire_put_varint_field(p, 5, 1);
        p = pf_wire_put_varint_field(p, 99, 1); /* unknown */
        p = put_layer(p, variant);
        compare(buf, (size_t)(p - buf), "hand-made");
        mutate_and_compare(buf, (size_t)(p - buf));
        if (variant == 0) { /* check the decoded values themselves once */
            struct pf_wire_save ws;
            assert_int_equal(pf_wire_decode_save(buf, (size_t)(p - buf), &ws), 0);
            assert_string_equal(ws.instance_id, "inst");
            assert_int_equal(ws.tp_rank, 5);
            assert_int_equal(ws.device_id, -2);
            assert_int_equal(ws.pp_rank, 1);
            assert_int_equal(ws.nlayers, 2);
            assert_string_equal(ws.layers[1].name, "second");
            assert_int_equal(ws.layers[1].nids, 4);
            static const uint32_t want[4] = {7, 129, 5, 0xffffffffu};
            assert_memory_equal(ws.layers[1].block_ids, want, sizeof(want));
            assert_int_equal(ws.layers[1].nhashes, 2);
            assert_int_equal(ws.layers[1].hashes[1].len, 0);
            pf_wire_save_free(&ws);
        }
    }
    /* top-level fields of the wrong wire type, and an empty request */
    static const uint8_t bad[][3] = {
        {1 << 3 | 0, 1}, {2 << 3 | 2, 0}, {3 << 3 | 2, 0}, {4 << 3 | 0, 1}, {5 << 3 | 2, 0}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        compare(bad[i], 2, "a wrong wire type");
    compare((const uint8_t *)"", 0, "an empty request");
    struct pf_wire_save ws;
    assert_int_equal(pf_wire_decode_save((const uint8_t *)"", 0, &ws), 0);
    assert_string_equal(ws.instance_id, "");
    assert_int_equal(ws.nlayers, 0);
    pf_wire_save_free(&ws);
}

/* ---- QueryPrefixBlocksRequest */

static void compare_pq(const uint8_t *buf, size_t len, const char *what)
{
    if (validated(&pegaflow__query_prefix_blocks_request__descriptor, buf, len) != 0) {
        refused_by_validation++;
        return;
    }
    Pegaflow__QueryPrefixBlocksRequest *pb =
        pegaflow__query_prefix_blocks_request__unpack(NULL, len, buf);
    struct pf_wire_prefix_query q;
    int rc = pf_wire_decode_prefix_query(buf, len, &q);
    compared++;
    if (!pb) {
        if (rc != -EBADMSG)
            fail_msg("%s (%zu bytes): protobuf-c refuses it, pf_wire_decode_prefix_query "
                     "returned %d",
                     what, len, rc);
        return;
    }
    if (rc != 0)
        fail_msg("%s (%zu bytes): protobuf-c accepts it, pf_wire_decode_prefix_query returned %d",
                 what, len, rc);
    accepted++;
    assert_string_equal(q.ns, pb->namespace_);
    assert_int_equal(q.n, pb->n_block_hashes);
    for (size_t i = 0; i < q.n; i++) {
        assert_int_equal(q.hashes[i].len, pb->block_hashes[i].len);
        if (q.hashes[i].len)
            assert_memory_equal(q.hashes[i].data, pb->block_hashes[i].data, q.hashes[i].len);
    }
    pf_wire_prefix_query_free(&q);
    pegaflow__query_prefix_blocks_request__free_unpacked(pb, NULL);
}

static void test_prefix_query(void **st)
{
    rng = pft_seed() | 1;
    compared = accepted = refused_by_validation = 0;
    for (int round = 0; round < 300; round++) {
        Pegaflow__QueryPrefixBlocksRequest r = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
        char ns[24];
        snprintf(ns, sizeof(ns), round % 9 ? "ns-%d" : "", round);
        r.namespace_ = ns;
        size_t n = round < 20 ? next() % 3 : next() % 400;
        ProtobufCBinaryData *bd = malloc((n ? n : 1) * sizeof(*bd));
        uint8_t *blob = malloc(n * 64 + 1);
        size_t bo = 0;
        for (size_t i = 0; i < n; i++) {
            size_t hl = next() % 8 ? 32 : next() % 65;
            for (size_t b = 0; b < hl; b++)
                blob[bo + b] = (uint8_t)next();
            bd[i] = (ProtobufCBinaryData){hl, blob + bo};
            bo += hl;
        }
        r.block_hashes = bd;
        r.n_block_hashes = n;
        size_t len = pegaflow__query_prefix_blocks_request__get_packed_size(&r);
        uint8_t *buf = malloc(len + 1);
        assert_int_equal(pegaflow__query_prefix_blocks_request__pack(&r, buf), len);
        compare_pq(buf, len, "packed by protobuf-c");
        /* mutated: a flipped bit, a cut, an inserted byte */
        uint8_t *m = malloc(len + 1);
        for (int k = 0; k < 12 && len; k++) {
            size_t at = next() % len;
            memcpy(m, buf, len);
            if (k % 3 == 0) {
                m[at] ^= (uint8_t)(1u << (next() % 8));
                compare_pq(m, len, "a flipped bit");
            } else if (k % 3 == 1) {
                compare_pq(m, at, "a cut");
            } else {
                memmove(m + at + 1, m + at, len - at);
                m[at] = (uint8_t)next();
                compare_pq(m, len + 1, "an inserted byte");
            }
        }
        free(m);
        free(buf);
        free(blob);
        free(bd);
    }
    /* hand-made: the last namespace wins, unknown fields of every wire type are skipped */
    uint8_t buf[512], *p = buf;
    p = pf_wire_put_len_field(p, 1, "first", 5);
    p = pf_wire_put_len_field(p, 2, "abcd", 4);
    p = pf_wire_put_varint_field(p, 7, 3);
    *p++ = 8 << 3 | 1;
    memset(p, 1, 8);
    p += 8;
    *p++ = 9 << 3 | 5;
    memset(p, 2, 4);
    p += 4;
    p = pf_wire_put_len_field(p, 10, "x", 1);
    p = pf_wire_put_len_field(p, 2, "", 0);
    p = pf_wire_put_len_field(p, 1, "second", 6);
    compare_pq(buf, (size_t)(p - buf), "hand-made");
    struct pf_wire_prefix_query q;
    assert_int_equal(pf_wire_decode_prefix_query(buf, (size_t)(p - buf), &q), 0);
    assert_string_equal(q.ns, "second");
    assert_int_equal(q.n, 2);
    assert_memory_equal(q.hashes[0].data, "abcd", 4);
    assert_int_equal(q.hashes[1].len, 0);
    pf_wire_prefix_query_free(&q);
    static const uint8_t bad[][3] = {{1 << 3 | 0, 1}, {2 << 3 | 0, 1}, {2 << 3 | 5, 0}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        compare_pq(bad[i], 2, "a wrong wire type");
    print_message("%zu inputs compared, %zu accepted by both, %zu refused by validation first\n",
                  compared, accepted, refused_by_validation);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_by_protobuf_c),
        cmocka_unit_test(test_hand_made),
        cmocka_unit_test(test_prefix_query),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

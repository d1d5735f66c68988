/* The hand-written QueryRequest encoder (pf_wire_encode_query, what the client sends) against
 * protobuf-c's packer: byte-exact for seeded random requests (hash counts, lengths one for
 * all or per hash, 0 and multi-byte lengths, empty / NULL / long strings, flags, group ids),
 * and the bytes read back field by field with the inline wire reader. */
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
#include "rpc/wire.h"

static uint64_t rng;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A random string of 0..maxlen letters (malloc'ed), or NULL one time in eight. */
static char *rand_str(size_t maxlen)
{
    if (next() % 8 == 0)
        return NULL;
    size_t l = next() % (maxlen + 1);
    char *s = malloc(l + 1);
    for (size_t i = 0; i < l; i++)
        s[i] = (char)('a' + next() % 26);
    s[l] = '\0';
    return s;
}

/* Encodes one request both ways and compares; also reads it back with pf_wire_next. */
static void check_one(const char *inst, const char *req, const uint8_t *hashes,
                      const uint32_t *lens, uint32_t len1, size_t n, bool wfp, uint32_t group)
{
    ProtobufCBinaryData *bd = calloc(n ? n : 1, sizeof(*bd));
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : len1;
        bd[i] = (ProtobufCBinaryData){l, (uint8_t *)hashes + off};
        off += l;
    }
    Pegaflow__QueryRequest q = PEGAFLOW__QUERY_REQUEST__INIT;
    q.instance_id = inst ? (char *)inst : "";
    q.req_id = req ? (char *)req : "";
    q.block_hashes = bd;
    q.n_block_hashes = n;
    q.wait_for_full_prefix = wfp;
    q.group_id = group;
    size_t want_len = pegaflow__query_request__get_packed_size(&q);
    uint8_t *want = malloc(want_len ? want_len : 1);
    pegaflow__query_request__pack(&q, want);
    size_t got_len = 0;
    uint8_t *got = pf_wire_encode_query(inst, req, hashes, lens, len1, n, wfp, group, &got_len);
    assert_non_null(got);
    assert_int_equal(got_len, want_len);
    assert_memory_equal(got, want, want_len);
    /* read back: the hashes in order, pointing at the right bytes */
    struct pf_wire w = {got, got + got_len};
    struct pf_wire_field f = {0};
    size_t k = 0;
    int r;
    off = 0;
    while ((r = pf_wire_next(&w, &f)) == 1) {
        if (f.number != 2)
            continue;
        assert_true(k < n);
        assert_int_equal(f.type, 2);
        assert_int_equal(f.len, bd[k].len);
        assert_memory_equal(f.data, bd[k].data, f.len);
        k++;
    }
    assert_int_equal(r, 0);
    assert_int_equal(k, n);
    free(got);
    free(want);
    free(bd);
}

static void test_matches_protobuf_c(void **st)
{
    rng = pft_seed() | 1;
    for (int round = 0; round < 400; round++) {
        size_t n = next() % 5 == 0 ? 0 : next() % 300;
        bool per_hash = next() % 3 == 0;
        /* one length for all: 32 (sha256), 16 (xxh3-128), or anything incl. 0 and >= 128 */
        uint32_t len1 = next() % 3 == 0 ? 32 : next() % 3 == 0 ? 16 : (uint32_t)(next() % 300);
        uint32_t *lens = per_hash ? malloc((n ? n : 1) * sizeof(*lens)) : NULL;
        size_t total = 0;
        for (size_t i = 0; i < n; i++) {
            size_t l = per_hash ? (lens[i] = (uint32_t)(next() % 200)) : len1;
            total += l;
        }
        uint8_t *hashes = malloc(total ? total : 1);
        for (size_t i = 0; i < total; i++)
            hashes[i] = (uint8_t)next();
        char *inst = rand_str(next() % 2 ? 20 : 300), *req = rand_str(next() % 2 ? 20 : 300);
        uint32_t group = next() % 2 ? 0 : next() % 2 ? (uint32_t)(next() % 10) : (uint32_t)next();
        check_one(inst, req, hashes, lens, len1, n, next() % 2, group);
        free(inst);
        free(req);
        free(hashes);
        free(lens);
    }
}

/* The benchmark's shape: 4096 hashes of 32 bytes. */
static void test_large_query(void **st)
{
    size_t n = 4096;
    uint8_t *hashes = malloc(n * 32);
    pft_fill(hashes, n * 32, pft_seed(), 1);
    check_one("instance", "req-1", hashes, NULL, 32, n, false, 0);
    check_one("instance", "req-1", hashes, NULL, 32, n, true, 7);
    free(hashes);
}

/* The reader refuses what it cannot frame (the server answers INVALID_ARGUMENT). */
static void test_reader_rejects_truncation(void **st)
{
    static const uint8_t cut_len[] = {0x12, 0x05, 'a', 'b'}; /* 5 bytes announced, 2 there */
    static const uint8_t cut_varint[] = {0x20, 0x80};        /* varint without its end */
    static const uint8_t field0[] = {0x02, 0x00};            /* field number 0 */
    static const uint8_t group[] = {0x13};                   /* start-group wire type */
    static const uint8_t cut_key[] = {0x92};                 /* key varint without its end */
    const struct {
        const uint8_t *p;
        size_t n;
    } bad[] = {{cut_len, sizeof(cut_len)},
               {cut_varint, sizeof(cut_varint)},
               {field0, sizeof(field0)},
               {group, sizeof(group)},
               {cut_key, sizeof(cut_key)}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct pf_wire w = {bad[i].p, bad[i].p + bad[i].n};
        struct pf_wire_field f = {0};
        int r;
        while ((r = pf_wire_next(&w, &f)) == 1)
            ;
        assert_int_equal(r, -1);
    }
    /* a two-byte key (field 16) and a two-byte length read whole */
    uint8_t ok2[4 + 200];
    ok2[0] = 0x82;
    ok2[1] = 0x01;
    ok2[2] = 0xc8;
    ok2[3] = 0x01;
    memset(ok2 + 4, 'x', 200);
    struct pf_wire w = {ok2, ok2 + sizeof(ok2)};
    struct pf_wire_field f = {0};
    assert_int_equal(pf_wire_next(&w, &f), 1);
    assert_int_equal(f.number, 16);
    assert_int_equal(f.type, 2);
    assert_int_equal(f.len, 200);
    assert_int_equal(pf_wire_next(&w, &f), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_protobuf_c),
        cmocka_unit_test(test_large_query),
        cmocka_unit_test(test_reader_rejects_truncation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

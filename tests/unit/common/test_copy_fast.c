/* pf_copy_nt / pf_copy_bulk (non-temporal stores chosen by size) copy exactly the bytes of
 * memcpy at every source and destination alignment 0..63, with each streaming loop the CPU
 * has (SSE2, AVX2, AVX-512), and every size edge of the
 * streaming loop (the 64-byte alignment head, the 256-byte body, the tail, the
 * PF_COPY_NT_MIN threshold), touching nothing outside the destination; pf_copy_hash copies
 * the same bytes and its state yields the xxh3-64 of the inlined streaming checksum
 * (pf_checksum_*, an independent implementation) for one call and for two calls chained,
 * across the PF_COPY_HASH_CHUNK boundaries, and for an input cut into many pieces of random
 * lengths (the state's kept head, half stripes, 1 KiB blocks, each ISA's loops): libxxhash's
 * XXH3_64bits of the whole input is the reference. Seeded random bytes (PF_TEST_SEED replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <xxhash.h>

#include "pf/copy.h"
#include "pf/util.h"
#include "pftest.h"

#define CANARY 0xA5

static const size_t sizes[] = {
    0,           1,           31,          32,     33,     63,         64,    127,
    128,         129,         159,         160,    161,    255,        256,   257,
    4095,        4096,        4097,        32767,  383,    384,        385,   511,
    512,         513,         32768,       32769,  65535,  65536,      65537, 65536 + 31,
    65536 + 129, 65536 + 255, 65536 + 257, 131072, 200003, 262144 + 77};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAXLEN (262144 + 77)
#define PAD    128

static uint64_t ref_hash(const void *a, size_t la, const void *b, size_t lb)
{
    struct pf_checksum c;
    assert_int_equal(pf_checksum_init(&c), 0);
    pf_checksum_update(&c, a, la);
    if (b)
        pf_checksum_update(&c, b, lb);
    uint64_t v = pf_checksum_final(&c);
    pf_checksum_destroy(&c);
    return v;
}

typedef void (*copy_fn)(void *, const void *, size_t);

static void check_copy(copy_fn fn, const char *name)
{
    uint64_t seed = pft_seed();
    uint8_t *src, *dst;
    assert_int_equal(posix_memalign((void **)&src, 4096, MAXLEN + 2 * PAD), 0);
    assert_int_equal(posix_memalign((void **)&dst, 4096, MAXLEN + 2 * PAD + 64), 0);
    pft_fill(src, MAXLEN + 2 * PAD, seed, 1);
    for (size_t k = 0; k < NSIZES; k++) {
        size_t len = sizes[k];
        /* every destination alignment (the streaming head), sources at the edges of a
         * vector; a spread of destination alignments for the largest sizes */
        static const size_t srcofs[] = {0, 1, 7, 15, 16, 31, 32, 33, 63};
        size_t step = len > 70000 ? 9 : 1;
        size_t span = 2 * PAD + 64 + len;
        for (size_t si = 0; si < sizeof(srcofs) / sizeof(srcofs[0]); si++) {
            size_t so = srcofs[si];
            for (size_t dofs = 0; dofs < 64; dofs += step) {
                memset(dst, CANARY, span);
                fn(dst + PAD + dofs, src + PAD + so, len);
                if (memcmp(dst + PAD + dofs, src + PAD + so, len) != 0)
                    fail_msg("%s: %zu bytes, src offset %zu, dst offset %zu: bytes differ", name,
                             len, so, dofs);
                for (size_t i = 0; i < PAD + dofs; i++)
                    if (dst[i] != CANARY)
                        fail_msg("%s: %zu bytes at dst offset %zu wrote before the start", name,
                                 len, dofs);
                for (size_t i = PAD + dofs + len; i < span; i++)
                    if (dst[i] != CANARY)
                        fail_msg("%s: %zu bytes at dst offset %zu wrote past the end", name, len,
                                 dofs);
            }
        }
    }
    free(src);
    free(dst);
}

/* every streaming loop this CPU has (the widest is the default; the others are what other
 * CPUs run) */
static void test_copy_nt(void **st)
{
    static const struct {
        enum pf_copy_isa isa;
        const char *name;
    } isas[] = {{PF_COPY_ISA_SSE2, "pf_copy_nt sse2"},
                {PF_COPY_ISA_AVX2, "pf_copy_nt avx2"},
                {PF_COPY_ISA_AVX512, "pf_copy_nt avx512"},
                {PF_COPY_ISA_AUTO, "pf_copy_nt"}};
    int ran = 0;
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
        if (pf_copy_force_isa(isas[i].isa) != 0) {
            print_message("%s: not on this CPU\n", isas[i].name);
            continue;
        }
        check_copy(pf_copy_nt, isas[i].name);
        ran++;
    }
    assert_int_equal(pf_copy_force_isa(PF_COPY_ISA_AUTO), 0);
    assert_true(ran >= 2); /* SSE2 and the default at least */
}

static void test_copy_bulk(void **st)
{
    check_copy(pf_copy_bulk, "pf_copy_bulk");
}

static void copy_hash_one(void *dst, const void *src, size_t len)
{
    struct pf_hash_state *h = pf_hash_state_new();
    assert_non_null(h);
    pf_copy_hash(dst, src, len, h);
    assert_true(pf_hash_digest(h) == ref_hash(src, len, NULL, 0));
    pf_hash_state_free(h);
}

static void test_copy_hash_bytes(void **st)
{
    static const enum pf_copy_isa isas[] = {PF_COPY_ISA_SSE2, PF_COPY_ISA_AVX2, PF_COPY_ISA_AVX512,
                                            PF_COPY_ISA_AUTO};
    static const char *const names[] = {"pf_copy_hash sse2", "pf_copy_hash avx2",
                                        "pf_copy_hash avx512", "pf_copy_hash"};
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++)
        if (pf_copy_force_isa(isas[i]) == 0)
            check_copy(copy_hash_one, names[i]);
    assert_int_equal(pf_copy_force_isa(PF_COPY_ISA_AUTO), 0);
}

/* Two segments into one state hash their concatenation; reset starts over. */
static void test_copy_hash_chained(void **st)
{
    uint64_t seed = pft_seed();
    uint8_t *src = malloc(2 * MAXLEN), *dst = malloc(2 * MAXLEN);
    pft_fill(src, 2 * MAXLEN, seed, 2);
    struct pf_hash_state *h = pf_hash_state_new();
    assert_non_null(h);
    for (size_t a = 0; a < NSIZES; a++) {
        for (size_t b = 0; b < NSIZES; b += 3) {
            size_t la = sizes[a], lb = sizes[b];
            const uint8_t *k = src + (a * 7) % 61, *v = src + MAXLEN + (b * 5) % 59;
            pf_hash_reset(h);
            pf_copy_hash(dst, k, la, h);
            pf_copy_hash(dst + MAXLEN, v, lb, h);
            assert_memory_equal(dst, k, la);
            assert_memory_equal(dst + MAXLEN, v, lb);
            if (pf_hash_digest(h) != ref_hash(k, la, v, lb))
                fail_msg("chained hash of %zu + %zu bytes differs from the reference", la, lb);
            /* the slot checksum helper agrees too (what the engine verifies against) */
            assert_true(pf_hash_digest(h) == pf_checksum2(k, la, v, lb));
        }
    }
    pf_hash_state_free(h);
    free(src);
    free(dst);
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* One input fed in pieces: tiny ones (inside the 240-byte head, across its end, within a
 * stripe), stripe- and block-sized ones, and streaming-sized ones at odd offsets, with each
 * ISA's loops. Every piece's bytes and the final value are checked. */
static void test_copy_hash_pieces(void **st)
{
    enum { TOTAL = 3 * 65536 + 4099 };
    uint64_t seed = pft_seed(), x = seed | 1;
    uint8_t *src, *dst;
    assert_int_equal(posix_memalign((void **)&src, 64, TOTAL), 0);
    assert_int_equal(posix_memalign((void **)&dst, 64, TOTAL), 0);
    pft_fill(src, TOTAL, seed, 3);
    struct pf_hash_state *h = pf_hash_state_new();
    assert_non_null(h);
    static const enum pf_copy_isa isas[] = {PF_COPY_ISA_SSE2, PF_COPY_ISA_AVX2, PF_COPY_ISA_AVX512};
    for (size_t ii = 0; ii < sizeof(isas) / sizeof(isas[0]); ii++) {
        if (pf_copy_force_isa(isas[ii]) != 0)
            continue;
        for (int round = 0; round < 300; round++) {
            size_t len = round < 60 ? (size_t)(rnd(&x) % 2200) : (size_t)(rnd(&x) % TOTAL);
            size_t off = 0;
            pf_hash_reset(h);
            memset(dst, 0, len);
            while (off < len) {
                size_t kind = rnd(&x) % 5, n;
                n = kind == 0   ? rnd(&x) % 80
                    : kind == 1 ? rnd(&x) % 1100
                    : kind == 2 ? 64 * (1 + rnd(&x) % 40)
                    : kind == 3 ? PF_COPY_NT_MIN + rnd(&x) % 70000
                                : PF_COPY_NT_MIN + 16384 * (rnd(&x) % 5); /* whole groups */
                if (n > len - off)
                    n = len - off;
                pf_copy_hash(dst + off, src + off, n, h);
                off += n;
            }
            if (memcmp(dst, src, len) != 0)
                fail_msg("isa %d round %d: %zu bytes in pieces: bytes differ", (int)isas[ii], round,
                         len);
            if (pf_hash_digest(h) != XXH3_64bits(src, len))
                fail_msg("isa %d round %d: %zu bytes in pieces: hash differs from XXH3_64bits",
                         (int)isas[ii], round, len);
        }
    }
    assert_int_equal(pf_copy_force_isa(PF_COPY_ISA_AUTO), 0);
    /* the digest does not change the state: reading it twice, then going on */
    pf_hash_reset(h);
    pf_copy_hash(dst, src, 100000, h);
    uint64_t a = pf_hash_digest(h);
    assert_true(a == pf_hash_digest(h));
    assert_true(a == XXH3_64bits(src, 100000));
    pf_copy_hash(dst + 100000, src + 100000, 7, h);
    assert_true(pf_hash_digest(h) == XXH3_64bits(src, 100007));
    /* a whole number of 16 KiB groups (the four-stream loop keeps the last stripe for the
     * digest), read, then continued by more groups and by a few bytes */
    pf_hash_reset(h);
    pf_copy_hash(dst, src, 65536, h);
    assert_true(pf_hash_digest(h) == XXH3_64bits(src, 65536));
    pf_copy_hash(dst + 65536, src + 65536, 65536 + 16384, h);
    assert_true(pf_hash_digest(h) == XXH3_64bits(src, 2 * 65536 + 16384));
    pf_copy_hash(dst + 2 * 65536 + 16384, src + 2 * 65536 + 16384, 3, h);
    assert_true(pf_hash_digest(h) == XXH3_64bits(src, 2 * 65536 + 16387));
    assert_memory_equal(dst, src, 2 * 65536 + 16387);
    pf_hash_state_free(h);
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_nt),          cmocka_unit_test(test_copy_bulk),
        cmocka_unit_test(test_copy_hash_bytes),  cmocka_unit_test(test_copy_hash_chained),
        cmocka_unit_test(test_copy_hash_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

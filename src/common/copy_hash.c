/* The fused copy + xxh3-64 pass (pf_copy_hash, see pf/copy.h).
 *
 * XXH3-64 (seed 0, default secret) of an input longer than 240 bytes is, by its
 * specification (xxHash's doc/xxhash_spec.md, "XXH3 algorithm, long inputs"):
 *   - eight 64-bit accumulators; every 64-byte stripe that is followed by at least one more
 *     input byte is accumulated with the secret at 8 * (its index within its 1 KiB block);
 *   - after each 16th stripe (a full block followed by more input) the accumulators are
 *     scrambled with the secret's last 64 bytes;
 *   - the last 64 input bytes are accumulated once more with the secret at 121, and the
 *     accumulators are merged with the secret at 11 and the length times PRIME64_1.
 * This file keeps that state itself, so a stripe is accumulated from the very registers
 * that copy it: one load per source line, a streaming store, and a few vector operations
 * that run while the next lines are still on their way from memory. Inputs of at most 240
 * bytes are kept whole and hashed by libxxhash at the end (the short-input algorithms).
 * libxxhash's own value is the reference in tests/unit/common/test_copy_fast.c; its secret
 * and primes come from its header (XXH_INLINE_ALL), not from a copy here. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pf/copy.h"

#define STRIPE          64u
#define BLOCK_STRIPES   16u /* (sizeof secret - 64) / 8 */
#define SECRET_SCRAMBLE 128 /* sizeof secret - 64 */
#define SECRET_LAST     121 /* sizeof secret - 64 - 7 */
#define SECRET_MERGE    11
#define SHORT_MAX       240u  /* XXH3_MIDSIZE_MAX: longer inputs take the stripe path */
#define GROUP_STRIDE    4096u /* the four-stream loop: 4 KiB strides side by side */
#define GROUP_WAYS      4u
#define GROUP_BYTES     (GROUP_STRIDE * GROUP_WAYS)

_Static_assert(sizeof(XXH3_kSecret) == 192, "xxh3's default secret is 192 bytes");

struct pf_hash_state {
    _Alignas(64) uint64_t acc[8];
    unsigned char buf[STRIPE];     /* input not accumulated yet: 1..64 bytes once long */
    unsigned char prev[STRIPE];    /* the last stripe accumulated */
    unsigned char head[SHORT_MAX]; /* the whole input while it is at most 240 bytes */
    uint64_t total;                /* bytes hashed */
    unsigned buffered;             /* bytes in buf */
    unsigned nstripe;              /* stripes accumulated in the current block, 0..15 */
    bool islong;                   /* total > 240: acc, buf and prev are live */
};

struct pf_hash_state *pf_hash_state_new(void)
{
    struct pf_hash_state *h = aligned_alloc(64, sizeof(*h));
    if (h)
        pf_hash_reset(h);
    return h;
}

void pf_hash_state_free(struct pf_hash_state *h)
{
    free(h);
}

void pf_hash_reset(struct pf_hash_state *h)
{
    h->total = 0;
    h->buffered = 0;
    h->nstripe = 0;
    h->islong = false;
}

static void acc_init(uint64_t acc[8])
{
    static const uint64_t init[8] = {XXH_PRIME32_3, XXH_PRIME64_1, XXH_PRIME64_2, XXH_PRIME64_3,
                                     XXH_PRIME64_4, XXH_PRIME32_2, XXH_PRIME64_5, XXH_PRIME32_1};
    memcpy(acc, init, sizeof(init));
}

static inline uint64_t rd64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only (x86-64, the project's target) */
}

/* One stripe into acc with the secret at sec, in plain C (digest and non-x86 builds). */
static void stripe_scalar(uint64_t acc[8], const unsigned char *in, const unsigned char *sec)
{
    for (int i = 0; i < 8; i++) {
        uint64_t v = rd64(in + 8 * i), k = v ^ rd64(sec + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += (k & 0xffffffffu) * (k >> 32);
    }
}

/* What the stripe loops do with the bytes besides hashing them. */
enum sink { SINK_NONE, SINK_STREAM, SINK_STORE };

#if defined(__x86_64__)
#include <immintrin.h>

/* The loops below hash m stripes of s (and copy them to d as sink says: SINK_STREAM needs
 * d 64-byte aligned), scrambling after every 16th, and leave the last stripe in prev. Each
 * stripe asks for the line PF_COPY_AHEAD bytes on: the vector work between the loads
 * fills the reorder window that would otherwise keep more source lines in flight.
 * Always inlined into one wrapper per sink, so the sink tests fold away. */
__attribute__((target("avx512f"), always_inline)) static inline void
run512(struct pf_hash_state *h, char *d, const char *s, size_t m, enum sink sink)
{
    const unsigned char *sec = XXH3_kSecret;
    __m512i acc = _mm512_load_si512(h->acc), x = _mm512_setzero_si512();
    const __m512i prime = _mm512_set1_epi32((int)XXH_PRIME32_1);
    const __m512i skey = _mm512_loadu_si512(sec + SECRET_SCRAMBLE);
    unsigned ns = h->nstripe;
    for (size_t i = 0; i < m; i++) {
        _mm_prefetch(pf_copy_ahead(s, i, m), _MM_HINT_T0);
        x = _mm512_loadu_si512(s + STRIPE * i);
        if (sink == SINK_STREAM)
            _mm512_stream_si512((__m512i *)(d + STRIPE * i), x);
        else if (sink == SINK_STORE)
            _mm512_storeu_si512(d + STRIPE * i, x);
        __m512i dk = _mm512_xor_si512(x, _mm512_loadu_si512(sec + 8 * ns));
        __m512i prod = _mm512_mul_epu32(dk, _mm512_srli_epi64(dk, 32));
        __m512i swap = _mm512_shuffle_epi32(x, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2));
        acc = _mm512_add_epi64(prod, _mm512_add_epi64(acc, swap));
        if (++ns == BLOCK_STRIPES) {
            __m512i a = _mm512_xor_si512(acc, _mm512_srli_epi64(acc, 47));
            a = _mm512_xor_si512(a, skey);
            __m512i lo = _mm512_mul_epu32(a, prime);
            __m512i hi = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), prime);
            acc = _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
            ns = 0;
        }
    }
    _mm512_store_si512(h->acc, acc);
    _mm512_storeu_si512(h->prev, x);
    h->nstripe = ns;
}

__attribute__((target("avx512f"))) static void hash512(struct pf_hash_state *h, const char *s,
                                                       size_t m)
{
    run512(h, NULL, s, m, SINK_NONE);
}
__attribute__((target("avx512f"))) static void stream512(struct pf_hash_state *h, char *d,
                                                         const char *s, size_t m)
{
    run512(h, d, s, m, SINK_STREAM);
}
__attribute__((target("avx512f"))) static void store512(struct pf_hash_state *h, char *d,
                                                        const char *s, size_t m)
{
    run512(h, d, s, m, SINK_STORE);
}

/* The same with two 32-byte halves per stripe (AVX2). */
__attribute__((target("avx2"), always_inline)) static inline void
run256(struct pf_hash_state *h, char *d, const char *s, size_t m, enum sink sink)
{
    const unsigned char *sec = XXH3_kSecret;
    __m256i acc[2], x[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    const __m256i prime = _mm256_set1_epi32((int)XXH_PRIME32_1);
    unsigned ns = h->nstripe;
    for (int j = 0; j < 2; j++)
        acc[j] = _mm256_load_si256((const __m256i *)(h->acc + 4 * j));
    for (size_t i = 0; i < m; i++) {
        _mm_prefetch(pf_copy_ahead(s, i, m), _MM_HINT_T0);
        for (int j = 0; j < 2; j++) {
            size_t o = STRIPE * i + 32 * (size_t)j;
            x[j] = _mm256_loadu_si256((const __m256i *)(s + o));
            if (sink == SINK_STREAM)
                _mm256_stream_si256((__m256i *)(d + o), x[j]);
            else if (sink == SINK_STORE)
                _mm256_storeu_si256((__m256i *)(d + o), x[j]);
            __m256i k = _mm256_loadu_si256((const __m256i *)(sec + 8 * ns + 32 * j));
            __m256i dk = _mm256_xor_si256(x[j], k);
            __m256i prod = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
            __m256i swap = _mm256_shuffle_epi32(x[j], _MM_SHUFFLE(1, 0, 3, 2));
            acc[j] = _mm256_add_epi64(prod, _mm256_add_epi64(acc[j], swap));
        }
        if (++ns == BLOCK_STRIPES) {
            for (int j = 0; j < 2; j++) {
                __m256i k = _mm256_loadu_si256((const __m256i *)(sec + SECRET_SCRAMBLE + 32 * j));
                __m256i a = _mm256_xor_si256(acc[j], _mm256_srli_epi64(acc[j], 47));
                a = _mm256_xor_si256(a, k);
                __m256i lo = _mm256_mul_epu32(a, prime);
                __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), prime);
                acc[j] = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
            }
            ns = 0;
        }
    }
    for (int j = 0; j < 2; j++) {
        _mm256_store_si256((__m256i *)(h->acc + 4 * j), acc[j]);
        _mm256_storeu_si256((__m256i *)(h->prev + 32 * j), x[j]);
    }
    h->nstripe = ns;
}

__attribute__((target("avx2"))) static void hash256(struct pf_hash_state *h, const char *s,
                                                    size_t m)
{
    run256(h, NULL, s, m, SINK_NONE);
}
__attribute__((target("avx2"))) static void stream256(struct pf_hash_state *h, char *d,
                                                      const char *s, size_t m)
{
    run256(h, d, s, m, SINK_STREAM);
}
__attribute__((target("avx2"))) static void store256(struct pf_hash_state *h, char *d,
                                                     const char *s, size_t m)
{
    run256(h, d, s, m, SINK_STORE);
}

/* The same with four 16-byte quarters per stripe (SSE2, every x86-64). */
static inline __attribute__((always_inline)) void run128(struct pf_hash_state *h, char *d,
                                                         const char *s, size_t m, enum sink sink)
{
    const unsigned char *sec = XXH3_kSecret;
    __m128i acc[4], x[4];
    const __m128i prime = _mm_set1_epi32((int)XXH_PRIME32_1);
    unsigned ns = h->nstripe;
    for (int j = 0; j < 4; j++) {
        acc[j] = _mm_load_si128((const __m128i *)(h->acc + 2 * j));
        x[j] = _mm_setzero_si128();
    }
    for (size_t i = 0; i < m; i++) {
        _mm_prefetch(pf_copy_ahead(s, i, m), _MM_HINT_T0);
        for (int j = 0; j < 4; j++) {
            size_t o = STRIPE * i + 16 * (size_t)j;
            x[j] = _mm_loadu_si128((const __m128i *)(s + o));
            if (sink == SINK_STREAM)
                _mm_stream_si128((__m128i *)(d + o), x[j]);
            else if (sink == SINK_STORE)
                _mm_storeu_si128((__m128i *)(d + o), x[j]);
            __m128i k = _mm_loadu_si128((const __m128i *)(sec + 8 * ns + 16 * j));
            __m128i dk = _mm_xor_si128(x[j], k);
            __m128i prod = _mm_mul_epu32(dk, _mm_srli_epi64(dk, 32));
            __m128i swap = _mm_shuffle_epi32(x[j], _MM_SHUFFLE(1, 0, 3, 2));
            acc[j] = _mm_add_epi64(prod, _mm_add_epi64(acc[j], swap));
        }
        if (++ns == BLOCK_STRIPES) {
            for (int j = 0; j < 4; j++) {
                __m128i k = _mm_loadu_si128((const __m128i *)(sec + SECRET_SCRAMBLE + 16 * j));
                __m128i a = _mm_xor_si128(acc[j], _mm_srli_epi64(acc[j], 47));
                a = _mm_xor_si128(a, k);
                __m128i lo = _mm_mul_epu32(a, prime);
                __m128i hi = _mm_mul_epu32(_mm_srli_epi64(a, 32), prime);
                acc[j] = _mm_add_epi64(lo, _mm_slli_epi64(hi, 32));
            }
            ns = 0;
        }
    }
    for (int j = 0; j < 4; j++) {
        _mm_store_si128((__m128i *)(h->acc + 2 * j), acc[j]);
        _mm_storeu_si128((__m128i *)(h->prev + 16 * j), x[j]);
    }
    h->nstripe = ns;
}

static void hash128(struct pf_hash_state *h, const char *s, size_t m)
{
    run128(h, NULL, s, m, SINK_NONE);
}
static void stream128(struct pf_hash_state *h, char *d, const char *s, size_t m)
{
    run128(h, d, s, m, SINK_STREAM);
}
static void store128(struct pf_hash_state *h, char *d, const char *s, size_t m)
{
    run128(h, d, s, m, SINK_STORE);
}

/* Four source streams, as pf_copy_nt's groups (pf/copy.h): within a 1 KiB block XXH3 only
 * adds each stripe's contribution to the accumulators (mod 2^64, lane by lane), so a
 * block's sum does not depend on the others and can be formed in any order. Each 16 KiB
 * group is read as four 4 KiB strides side by side (128 bytes of each in turn, streamed to
 * d), every stride summing its current block in a register; the group's 16 block sums are
 * then folded into the accumulators in input order, each followed by the scramble. Only at
 * a block boundary (nstripe 0), with d 64-byte aligned, and for whole groups of stripes
 * that are all followed by more input (so that every block of the group is scrambled).
 * Each stride asks for its lines GROUP_AHEAD bytes on (two threads, development VM: 0.93 of
 * the four-stream plain copy with 512, 0.88 without, 0.85-0.88 with 1-2 KiB). */
#define GROUP_AHEAD 512u
__attribute__((target("avx512f"), always_inline)) static inline __m512i contrib512(__m512i x,
                                                                                   __m512i key)
{
    __m512i dk = _mm512_xor_si512(x, key);
    __m512i prod = _mm512_mul_epu32(dk, _mm512_srli_epi64(dk, 32));
    return _mm512_add_epi64(prod, _mm512_shuffle_epi32(x, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2)));
}

__attribute__((target("avx512f"))) static void
groups512(struct pf_hash_state *h, char *d, const char *s, size_t ngroups, bool hold_last)
{
    const unsigned char *sec = XXH3_kSecret;
    __m512i acc = _mm512_load_si512(h->acc), last = _mm512_setzero_si512(), before = last;
    const __m512i prime = _mm512_set1_epi32((int)XXH_PRIME32_1);
    const __m512i skey = _mm512_loadu_si512(sec + SECRET_SCRAMBLE);
    __m512i sums[GROUP_BYTES / 1024];
    for (size_t g = 0; g < ngroups; g++, s += GROUP_BYTES, d += GROUP_BYTES) {
        __m512i sum[GROUP_WAYS];
        for (unsigned w = 0; w < GROUP_WAYS; w++)
            sum[w] = _mm512_setzero_si512();
        for (size_t o = 0; o < GROUP_STRIDE; o += 2 * STRIPE) {
            const unsigned char *k = sec + 8 * ((o % 1024) / STRIPE);
            const __m512i k0 = _mm512_loadu_si512(k), k1 = _mm512_loadu_si512(k + 8);
            for (unsigned w = 0; w < GROUP_WAYS; w++) {
                const char *sp = s + w * GROUP_STRIDE + o;
                char *dp = d + w * GROUP_STRIDE + o;
                if (o + GROUP_AHEAD < GROUP_STRIDE) { /* this stride's own lines only */
                    _mm_prefetch(sp + GROUP_AHEAD, _MM_HINT_T0);
                    _mm_prefetch(sp + GROUP_AHEAD + STRIPE, _MM_HINT_T0);
                }
                __m512i x0 = _mm512_loadu_si512(sp), x1 = _mm512_loadu_si512(sp + STRIPE);
                _mm512_stream_si512((__m512i *)dp, x0);
                _mm512_stream_si512((__m512i *)(dp + STRIPE), x1);
                sum[w] = _mm512_add_epi64(sum[w], contrib512(x0, k0));
                sum[w] = _mm512_add_epi64(sum[w], contrib512(x1, k1));
                if (w == GROUP_WAYS - 1) {
                    before = x0;
                    last = x1;
                }
            }
            if ((o + 2 * STRIPE) % 1024 == 0) /* each stride finished a block */
                for (unsigned w = 0; w < GROUP_WAYS; w++) {
                    sums[w * (GROUP_STRIDE / 1024) + o / 1024] = sum[w];
                    sum[w] = _mm512_setzero_si512();
                }
        }
        unsigned nb = GROUP_BYTES / 1024;
        if (hold_last && g + 1 == ngroups)
            nb--; /* the last block: after the loop */
        for (unsigned b = 0; b < nb; b++) {
            __m512i a = _mm512_add_epi64(acc, sums[b]);
            a = _mm512_xor_si512(a, _mm512_srli_epi64(a, 47));
            a = _mm512_xor_si512(a, skey);
            __m512i lo = _mm512_mul_epu32(a, prime);
            __m512i hi = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), prime);
            acc = _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
        }
    }
    if (hold_last) {
        /* the input's last stripe: copied, not accumulated (the digest takes it), so it
         * leaves the last block's sum (a lane-wise sum mod 2^64: subtracting is exact), and
         * that block, not followed by more input yet, is added without the scramble */
        const __m512i k15 = _mm512_loadu_si512(sec + 8 * (BLOCK_STRIPES - 1));
        __m512i part = _mm512_sub_epi64(sums[GROUP_BYTES / 1024 - 1], contrib512(last, k15));
        acc = _mm512_add_epi64(acc, part);
        _mm512_store_si512(h->acc, acc);
        _mm512_storeu_si512(h->prev, before);
        _mm512_storeu_si512(h->buf, last);
        h->nstripe = BLOCK_STRIPES - 1;
        return;
    }
    _mm512_store_si512(h->acc, acc);
    _mm512_storeu_si512(h->prev, last);
}

/* The stripes of the first *m_p (of s, into d) that the four-stream loop takes: whole
 * groups, at a block boundary, streamed to a 64-byte aligned d, with AVX-512. Advances
 * *d_p, *s_p and *m_p past them. When one more stripe, the input's last, completes the
 * last group (tail == 64: a whole number of groups, as a 64 KiB block is), the loop takes
 * it too, copied and kept in buf for the digest: returns true, *m_p 0 and all copied. */
static bool four_streams(struct pf_hash_state *h, char **d_p, const char **s_p, size_t *m_p,
                         size_t tail)
{
    const size_t gs = GROUP_BYTES / STRIPE;
    bool hold = tail == STRIPE && (*m_p + 1) % gs == 0;
    size_t ng = hold ? (*m_p + 1) / gs : *m_p / gs;
    if (ng == 0 || h->nstripe != 0 || ((uintptr_t)*d_p & 63) ||
        pf_copy_isa_now() != PF_COPY_ISA_AVX512)
        return false;
    groups512(h, *d_p, *s_p, ng, hold);
    *d_p += ng * GROUP_BYTES;
    *s_p += ng * GROUP_BYTES;
    *m_p = hold ? 0 : *m_p - ng * gs;
    return hold;
}

/* m (> 0: prev is the m-th) stripes of s into h, copied to d as sink says (d NULL: SINK_NONE). */
static void stripes(struct pf_hash_state *h, char *d, const char *s, size_t m, enum sink sink)
{
    switch (pf_copy_isa_now()) {
    case PF_COPY_ISA_AVX512:
        sink == SINK_STREAM  ? stream512(h, d, s, m)
        : sink == SINK_STORE ? store512(h, d, s, m)
                             : hash512(h, s, m);
        break;
    case PF_COPY_ISA_AVX2:
        sink == SINK_STREAM  ? stream256(h, d, s, m)
        : sink == SINK_STORE ? store256(h, d, s, m)
                             : hash256(h, s, m);
        break;
    default:
        sink == SINK_STREAM  ? stream128(h, d, s, m)
        : sink == SINK_STORE ? store128(h, d, s, m)
                             : hash128(h, s, m);
    }
}

static void fence(void)
{
    _mm_sfence(); /* streaming stores are weakly ordered: visible before we return */
}
#else
static void scramble_scalar(uint64_t acc[8])
{
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i] ^ (acc[i] >> 47);
        acc[i] = (a ^ rd64(XXH3_kSecret + SECRET_SCRAMBLE + 8 * i)) * XXH_PRIME32_1;
    }
}

static bool four_streams(struct pf_hash_state *h, char **d_p, const char **s_p, size_t *m_p,
                         size_t tail)
{
    (void)h;
    (void)d_p;
    (void)s_p;
    (void)m_p;
    (void)tail;
    return false;
}

static void stripes(struct pf_hash_state *h, char *d, const char *s, size_t m, enum sink sink)
{
    if (sink != SINK_NONE)
        memcpy(d, s, m * STRIPE);
    for (size_t i = 0; i < m; i++) {
        stripe_scalar(h->acc, (const unsigned char *)s + STRIPE * i, XXH3_kSecret + 8 * h->nstripe);
        if (++h->nstripe == BLOCK_STRIPES) {
            scramble_scalar(h->acc);
            h->nstripe = 0;
        }
    }
    memcpy(h->prev, s + STRIPE * (m - 1), STRIPE);
}

static void fence(void)
{
}
#endif

/* Bytes already in memory (the destination just written, or the kept head) into a long
 * state: fills buf, accumulates a full buf only once more input follows, then whole
 * stripes straight from p, always keeping the last 1..64 bytes in buf. n > 0. */
static void absorb(struct pf_hash_state *h, const char *p, size_t n)
{
    if (h->buffered) {
        size_t take = STRIPE - h->buffered < n ? STRIPE - h->buffered : n;
        memcpy(h->buf + h->buffered, p, take);
        h->buffered += (unsigned)take;
        p += take;
        n -= take;
        if (n == 0)
            return;
        stripes(h, NULL, (const char *)h->buf, 1, SINK_NONE); /* full, and more follows */
        h->buffered = 0;
    }
    size_t m = (n - 1) / STRIPE; /* the stripes followed by at least one more byte */
    if (m)
        stripes(h, NULL, p, m, SINK_NONE);
    h->buffered = (unsigned)(n - m * STRIPE);
    memcpy(h->buf, p + m * STRIPE, h->buffered);
}

/* The head (at most 240 bytes) becomes the start of a long input. */
static void go_long(struct pf_hash_state *h)
{
    acc_init(h->acc);
    h->islong = true;
    h->buffered = 0;
    h->nstripe = 0;
    if (h->total)
        absorb(h, (const char *)h->head, (size_t)h->total);
}

uint64_t pf_hash_digest(const struct pf_hash_state *h)
{
    if (!h->islong)
        return XXH3_64bits(h->head, (size_t)h->total);
    _Alignas(64) uint64_t acc[8];
    unsigned char last[STRIPE]; /* the input's last 64 bytes */
    memcpy(acc, h->acc, sizeof(acc));
    memcpy(last, h->prev + h->buffered, STRIPE - h->buffered);
    memcpy(last + STRIPE - h->buffered, h->buf, h->buffered);
    stripe_scalar(acc, last, XXH3_kSecret + SECRET_LAST);
    uint64_t r = h->total * XXH_PRIME64_1;
    for (int i = 0; i < 4; i++) {
        const unsigned char *k = XXH3_kSecret + SECRET_MERGE + 16 * i;
        __uint128_t p = (__uint128_t)(acc[2 * i] ^ rd64(k)) * (acc[2 * i + 1] ^ rd64(k + 8));
        r += (uint64_t)p ^ (uint64_t)(p >> 64);
    }
    r ^= r >> 37; /* XXH3_avalanche */
    r *= 0x165667919E3779F9ULL;
    return r ^ (r >> 32);
}

void pf_copy_hash(void *dst, const void *src, size_t len, struct pf_hash_state *h)
{
    char *d = dst;
    const char *s = src;
    if (len == 0)
        return;
    if (!h->islong && h->total + len <= SHORT_MAX) {
        memcpy(d, s, len);
        memcpy(h->head + h->total, d, len); /* the bytes written, not a second source read */
        h->total += len;
        return;
    }
    if (!h->islong)
        go_long(h);
    h->total += len;
    if (len < PF_COPY_NT_MIN) {
        /* cached stores, hashed from L1/L2 right after each chunk is written */
        while (len) {
            size_t c = len < PF_COPY_HASH_CHUNK ? len : PF_COPY_HASH_CHUNK;
            memcpy(d, s, c);
            absorb(h, d, c);
            d += c;
            s += c;
            len -= c;
        }
        return;
    }
    if (h->buffered && h->buffered < STRIPE) { /* complete the stripe a call began */
        size_t take = STRIPE - h->buffered;
        memcpy(d, s, take);
        absorb(h, d, take);
        d += take;
        s += take;
        len -= take;
    }
    if (h->buffered) { /* a full stripe, and len (>= 64 KiB - 63) bytes follow it */
        stripes(h, NULL, (const char *)h->buf, 1, SINK_NONE);
        h->buffered = 0;
    }
    /* fused: each line read once, hashed from its register */
    size_t m = (len - 1) / STRIPE; /* the stripes followed by more input */
    enum sink sink = ((uintptr_t)d & 63) ? SINK_STORE : SINK_STREAM;
    len -= m * STRIPE;
    if (h->nstripe && m >= GROUP_BYTES / STRIPE) { /* on to a block boundary */
        size_t k = BLOCK_STRIPES - h->nstripe;
        stripes(h, d, s, k, sink);
        d += k * STRIPE;
        s += k * STRIPE;
        m -= k;
    }
    if (four_streams(h, &d, &s, &m, len)) { /* the last stripe too: in buf */
        fence();
        h->buffered = STRIPE;
        return;
    }
    if (m) {
        stripes(h, d, s, m, sink);
        d += m * STRIPE;
        s += m * STRIPE;
    }
    fence();
    memcpy(d, s, len); /* 1..64 bytes: kept in buf until more input or the digest */
    h->buffered = (unsigned)len;
    memcpy(h->buf, d, len);
}

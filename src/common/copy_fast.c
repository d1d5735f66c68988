/* Bulk copies: non-temporal stores chosen by size, and the fused copy + xxh3 pass (see
 * pf/copy.h). The project compiles for baseline x86-64; the AVX-512 and AVX2 streaming
 * loops are built with target attributes and chosen at run time, SSE2 (baseline) otherwise. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include "pf/copy.h"

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static void nt_avx2(char *d, const char *s, size_t n)
{
    /* d is 32-byte aligned, n a multiple of 128 */
    for (size_t i = 0; i < n; i += 128) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i x3 = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), x0);
        _mm256_stream_si256((__m256i *)(d + i + 32), x1);
        _mm256_stream_si256((__m256i *)(d + i + 64), x2);
        _mm256_stream_si256((__m256i *)(d + i + 96), x3);
    }
}

static void nt_sse2(char *d, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 128) {
        for (size_t k = 0; k < 128; k += 64) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i + k));
            __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + k + 16));
            __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + k + 32));
            __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + k + 48));
            _mm_stream_si128((__m128i *)(d + i + k), x0);
            _mm_stream_si128((__m128i *)(d + i + k + 16), x1);
            _mm_stream_si128((__m128i *)(d + i + k + 32), x2);
            _mm_stream_si128((__m128i *)(d + i + k + 48), x3);
        }
    }
}

__attribute__((target("avx512f"))) static void nt_avx512(char *d, const char *s, size_t n)
{
    /* d is 64-byte aligned, n a multiple of 256 */
    for (size_t i = 0; i < n; i += 256) {
        __m512i x0 = _mm512_loadu_si512(s + i);
        __m512i x1 = _mm512_loadu_si512(s + i + 64);
        __m512i x2 = _mm512_loadu_si512(s + i + 128);
        __m512i x3 = _mm512_loadu_si512(s + i + 192);
        _mm512_stream_si512((__m512i *)(d + i), x0);
        _mm512_stream_si512((__m512i *)(d + i + 64), x1);
        _mm512_stream_si512((__m512i *)(d + i + 128), x2);
        _mm512_stream_si512((__m512i *)(d + i + 192), x3);
    }
}

/* b[0, n) = s[0, n) (cached stores) and the same bytes streamed to d, one pass over s;
 * d is 64-byte aligned, n a multiple of 256, b any alignment. */
__attribute__((target("avx512f"))) static void two_avx512(char *d, char *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 256) {
        __m512i x0 = _mm512_loadu_si512(s + i);
        __m512i x1 = _mm512_loadu_si512(s + i + 64);
        __m512i x2 = _mm512_loadu_si512(s + i + 128);
        __m512i x3 = _mm512_loadu_si512(s + i + 192);
        _mm512_storeu_si512(b + i, x0);
        _mm512_storeu_si512(b + i + 64, x1);
        _mm512_storeu_si512(b + i + 128, x2);
        _mm512_storeu_si512(b + i + 192, x3);
        _mm512_stream_si512((__m512i *)(d + i), x0);
        _mm512_stream_si512((__m512i *)(d + i + 64), x1);
        _mm512_stream_si512((__m512i *)(d + i + 128), x2);
        _mm512_stream_si512((__m512i *)(d + i + 192), x3);
    }
}

__attribute__((target("avx2"))) static void two_avx2(char *d, char *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 64) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        _mm256_storeu_si256((__m256i *)(b + i), x0);
        _mm256_storeu_si256((__m256i *)(b + i + 32), x1);
        _mm256_stream_si256((__m256i *)(d + i), x0);
        _mm256_stream_si256((__m256i *)(d + i + 32), x1);
    }
}

static bool isa_ok(enum pf_copy_isa isa)
{
    switch (isa) {
    case PF_COPY_ISA_AUTO:
    case PF_COPY_ISA_SSE2:
        return true;
    case PF_COPY_ISA_AVX2:
        return __builtin_cpu_supports("avx2");
    case PF_COPY_ISA_AVX512:
        return __builtin_cpu_supports("avx512f");
    }
    return false;
}

static _Atomic int forced_isa; /* enum pf_copy_isa; AUTO: the widest the CPU has */

int pf_copy_force_isa(enum pf_copy_isa isa)
{
    if (!isa_ok(isa))
        return -ENOTSUP;
    atomic_store_explicit(&forced_isa, (int)isa, memory_order_relaxed);
    return 0;
}

static enum pf_copy_isa isa_now(void)
{
    enum pf_copy_isa isa = atomic_load_explicit(&forced_isa, memory_order_relaxed);
    if (isa != PF_COPY_ISA_AUTO)
        return isa;
    return isa_ok(PF_COPY_ISA_AVX512) ? PF_COPY_ISA_AVX512
           : isa_ok(PF_COPY_ISA_AVX2) ? PF_COPY_ISA_AVX2
                                      : PF_COPY_ISA_SSE2;
}

void pf_copy_nt(void *dst, const void *src, size_t len)
{
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 63); /* bytes until d is 64-byte aligned */
    if (head > len)
        head = len;
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    size_t body = len & ~(size_t)255; /* a multiple of every loop's step */
    if (body) {
        switch (isa_now()) {
        case PF_COPY_ISA_AVX512:
            nt_avx512(d, s, body);
            break;
        case PF_COPY_ISA_AVX2:
            nt_avx2(d, s, body);
            break;
        default:
            nt_sse2(d, s, body);
        }
        _mm_sfence(); /* streaming stores are weakly ordered: visible before we return */
    }
    memcpy(d + body, s + body, len - body);
}
/* memcpy(b, s, n) and memcpy(d, s, n) reading s once (pf_copy_hash's bounce and its
 * destination), d's lines written with non-temporal stores; the caller fences. SSE2 only:
 * the two copies one after the other. */
static void copy_two_ways(char *d, char *b, const char *s, size_t n)
{
    enum pf_copy_isa isa = isa_now();
    if (isa == PF_COPY_ISA_SSE2) {
        memcpy(b, s, n);
        pf_copy_nt(d, b, n);
        return;
    }
    size_t head = (size_t)(-(uintptr_t)d & 63); /* bytes until d is 64-byte aligned */
    if (head > n)
        head = n;
    memcpy(d, s, head);
    memcpy(b, s, head);
    size_t body = (n - head) & ~(size_t)255;
    if (isa == PF_COPY_ISA_AVX512)
        two_avx512(d + head, b + head, s + head, body);
    else
        two_avx2(d + head, b + head, s + head, body);
    size_t done = head + body;
    memcpy(d + done, s + done, n - done);
    memcpy(b + done, s + done, n - done);
}

static void fence(void)
{
    _mm_sfence(); /* streaming stores are weakly ordered: visible before we return */
}
#else
void pf_copy_nt(void *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
}

static void copy_two_ways(char *d, char *b, const char *s, size_t n)
{
    memcpy(b, s, n);
    memcpy(d, b, n);
}

static void fence(void)
{
}

int pf_copy_force_isa(enum pf_copy_isa isa)
{
    return isa == PF_COPY_ISA_AUTO ? 0 : -ENOTSUP;
}
#endif

void pf_copy_bulk(void *dst, const void *src, size_t len)
{
    if (len >= PF_COPY_NT_MIN)
        pf_copy_nt(dst, src, len);
    else
        memcpy(dst, src, len);
}

struct pf_hash_state {
    XXH3_state_t st;
};

struct pf_hash_state *pf_hash_state_new(void)
{
    struct pf_hash_state *h = aligned_alloc(64, sizeof(*h));
    if (h)
        XXH3_64bits_reset(&h->st);
    return h;
}

void pf_hash_state_free(struct pf_hash_state *h)
{
    free(h);
}

void pf_hash_reset(struct pf_hash_state *h)
{
    XXH3_64bits_reset(&h->st);
}

uint64_t pf_hash_digest(const struct pf_hash_state *h)
{
    return XXH3_64bits_digest(&h->st);
}

/* Large copies go through a small bounce buffer that stays in L1: the source chunk is read
 * from memory once, into the bounce and (the same registers) streamed to the destination
 * with non-temporal stores, then hashed from L1. The bytes hashed are exactly the bytes written,
 * even if the source changes meanwhile, and the destination is never read. Small copies (below the
 * streaming threshold) use cached stores and hash the destination while it is in L1/L2. */
#define BOUNCE (16u << 10)
static _Thread_local _Alignas(64) unsigned char bounce[BOUNCE];

void pf_copy_hash(void *dst, const void *src, size_t len, struct pf_hash_state *h)
{
    char *d = dst;
    const char *s = src;
    if (len < PF_COPY_NT_MIN) {
        while (len) {
            size_t c = len < PF_COPY_HASH_CHUNK ? len : PF_COPY_HASH_CHUNK;
            memcpy(d, s, c); /* cached stores: the chunk is hashed from L1/L2 next */
            XXH3_64bits_update_dispatch(&h->st, d, c);
            d += c;
            s += c;
            len -= c;
        }
        return;
    }
    while (len) {
        size_t c = len < BOUNCE ? len : BOUNCE;
        /* one pass over the source fills the bounce and streams the destination (two
         * passes, copy then stream: 7.1-8.4 GB/s a thread here, one: 8.2-9.6) */
        copy_two_ways(d, (char *)bounce, s, c);
        XXH3_64bits_update_dispatch(&h->st, bounce, c);
        d += c;
        s += c;
        len -= c;
    }
    fence();
}

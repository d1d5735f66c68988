/* Bulk copies: non-temporal stores chosen by size (see pf/copy.h; the fused copy + xxh3
 * pass is copy_hash.c). The project compiles for baseline x86-64; the AVX-512 and AVX2 streaming
 * loops are built with target attributes and chosen at run time, SSE2 (baseline) otherwise. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pf/copy.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* The streaming loops copy groups of NT_WAYS strides of NT_STRIDE bytes side by side, a
 * few lines of each stride in turn, then the rest in order: with four source streams in
 * flight two threads copied 24.4-25.5 GB/s on the development VM against 21.3-21.9 for one
 * sequential stream each (bench/README.md "Save: the hash beside the copy"). */
#define NT_STRIDE 4096u
#define NT_WAYS   4u
#define NT_GROUP  (NT_STRIDE * NT_WAYS)

/* 128 bytes from s streamed to d (d 32-byte aligned). */
__attribute__((target("avx2"), always_inline)) static inline void nt128_avx2(char *d, const char *s)
{
    __m256i x0 = _mm256_loadu_si256((const __m256i *)s);
    __m256i x1 = _mm256_loadu_si256((const __m256i *)(s + 32));
    __m256i x2 = _mm256_loadu_si256((const __m256i *)(s + 64));
    __m256i x3 = _mm256_loadu_si256((const __m256i *)(s + 96));
    _mm256_stream_si256((__m256i *)d, x0);
    _mm256_stream_si256((__m256i *)(d + 32), x1);
    _mm256_stream_si256((__m256i *)(d + 64), x2);
    _mm256_stream_si256((__m256i *)(d + 96), x3);
}

__attribute__((target("avx2"))) static void nt_avx2(char *d, const char *s, size_t n)
{
    /* d is 32-byte aligned, n a multiple of 128 */
    size_t i = 0;
    for (; i + NT_GROUP <= n; i += NT_GROUP)
        for (size_t o = 0; o < NT_STRIDE; o += 128)
            for (size_t w = 0; w < NT_WAYS; w++)
                nt128_avx2(d + i + w * NT_STRIDE + o, s + i + w * NT_STRIDE + o);
    for (; i < n; i += 128)
        nt128_avx2(d + i, s + i);
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

/* 128 bytes from s streamed to d (d 64-byte aligned). */
__attribute__((target("avx512f"), always_inline)) static inline void nt128_avx512(char *d,
                                                                                  const char *s)
{
    __m512i x0 = _mm512_loadu_si512(s);
    __m512i x1 = _mm512_loadu_si512(s + 64);
    _mm512_stream_si512((__m512i *)d, x0);
    _mm512_stream_si512((__m512i *)(d + 64), x1);
}

__attribute__((target("avx512f"))) static void nt_avx512(char *d, const char *s, size_t n)
{
    /* d is 64-byte aligned, n a multiple of 256 */
    size_t i = 0;
    for (; i + NT_GROUP <= n; i += NT_GROUP)
        for (size_t o = 0; o < NT_STRIDE; o += 128)
            for (size_t w = 0; w < NT_WAYS; w++)
                nt128_avx512(d + i + w * NT_STRIDE + o, s + i + w * NT_STRIDE + o);
    for (; i < n; i += 128)
        nt128_avx512(d + i, s + i);
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

enum pf_copy_isa pf_copy_isa_now(void)
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
        switch (pf_copy_isa_now()) {
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
#else
void pf_copy_nt(void *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
}

enum pf_copy_isa pf_copy_isa_now(void)
{
    return PF_COPY_ISA_AUTO;
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

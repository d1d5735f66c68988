/* Small helpers shared by every module: container_of, array sizes, alignment, branch hints.
 * Header-only, no state. */
#ifndef PF_COMMON_H
#define PF_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define PF_VERSION "0.23.12"

#define pf_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define PF_ARRAY_SIZE(a)                   (sizeof(a) / sizeof((a)[0]))
#define pf_likely(x)                       __builtin_expect(!!(x), 1)
#define pf_unlikely(x)                     __builtin_expect(!!(x), 0)
#define PF_MIN_OF(a, b)                    ((a) < (b) ? (a) : (b))
#define PF_MAX_OF(a, b)                    ((a) > (b) ? (a) : (b))
#define PF_PRINTF(f, a)                    __attribute__((format(printf, f, a)))
#define PF_UNUSED                          __attribute__((unused))

/* Happens-before annotations for hand-offs through uninstrumented libraries (the gRPC
 * completion queue): ThreadSanitizer cannot see their synchronisation. No-ops otherwise. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define pf_hb_release(p) __tsan_release((void *)(p))
#define pf_hb_acquire(p) __tsan_acquire((void *)(p))
#else
#define pf_hb_release(p) ((void)(p))
#define pf_hb_acquire(p) ((void)(p))
#endif

/* Round x up/down to a multiple of a (a > 0, any value). */
static inline uint64_t pf_round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}
static inline uint64_t pf_round_down(uint64_t x, uint64_t a)
{
    return x / a * a;
}
static inline bool pf_is_aligned(uint64_t x, uint64_t a)
{
    return x % a == 0;
}
/* a + b with overflow detection: returns false on overflow. */
static inline bool pf_add_ok(uint64_t a, uint64_t b, uint64_t *sum_p)
{
    return !__builtin_add_overflow(a, b, sum_p);
}
static inline bool pf_mul_ok(uint64_t a, uint64_t b, uint64_t *prod_p)
{
    return !__builtin_mul_overflow(a, b, prod_p);
}

#endif

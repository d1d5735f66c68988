/* Time: monotonic nanoseconds, wall-clock nanoseconds, and an injectable clock so that
 * expiry logic (leases, transfer locks, MetaServer TTLs) is unit-testable without sleeping.
 * A NULL struct pf_clock pointer means the real monotonic clock. */
#ifndef PF_CLOCK_H
#define PF_CLOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t pf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t pf_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define PF_NS_PER_MS  1000000ull
#define PF_NS_PER_SEC 1000000000ull

struct pf_clock {
    uint64_t (*now_ns)(const struct pf_clock *c);
};

/* A manually advanced clock for tests. */
struct pf_fake_clock {
    struct pf_clock base;
    _Atomic uint64_t ns;
};

static inline uint64_t pf_fake_clock_now_(const struct pf_clock *c)
{
    const struct pf_fake_clock *f = (const struct pf_fake_clock *)c;
    return atomic_load(&((struct pf_fake_clock *)f)->ns);
}
static inline void pf_fake_clock_init(struct pf_fake_clock *f, uint64_t start_ns)
{
    f->base.now_ns = pf_fake_clock_now_;
    atomic_store(&f->ns, start_ns);
}
static inline void pf_fake_clock_advance(struct pf_fake_clock *f, uint64_t ns)
{
    atomic_fetch_add(&f->ns, ns);
}

static inline uint64_t pf_clock_now(const struct pf_clock *c)
{
    return c ? c->now_ns(c) : pf_now_ns();
}

/* Condition variables in this project use CLOCK_MONOTONIC (pf_cond_init). */
int pf_cond_init(pthread_cond_t *cond);
/* Absolute CLOCK_MONOTONIC deadline `ms` milliseconds from now, for pthread_cond_timedwait. */
struct timespec pf_deadline_ms(uint64_t ms);
struct timespec pf_ns_to_timespec(uint64_t mono_ns);
/* Sleeps for ms milliseconds (restarts on EINTR). */
void pf_sleep_ms(uint64_t ms);

#endif

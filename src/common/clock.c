/* Monotonic-clock helpers for condition variables and sleeps. */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "pf/clock.h"

int pf_cond_init(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc)
        return -rc;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return -rc;
}

struct timespec pf_ns_to_timespec(uint64_t mono_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(mono_ns / PF_NS_PER_SEC),
                          .tv_nsec = (long)(mono_ns % PF_NS_PER_SEC)};
    return ts;
}

struct timespec pf_deadline_ms(uint64_t ms)
{
    return pf_ns_to_timespec(pf_now_ns() + ms * PF_NS_PER_MS);
}

void pf_sleep_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Logging: one line per event on stderr, "2026-11-29T10:00:00.123Z LEVEL module: message".
 * Thread-safe (each line is written with one write(2)). The level is process-wide and set
 * once at start-up (pf_log_set_level) but may be changed at any time.
 * Hot paths use pf_log_ratelimited() which prints at most once per interval per call site. */
#ifndef PF_LOG_H
#define PF_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "pf/common.h"

enum pf_log_level {
    PF_LOG_TRACE = 0,
    PF_LOG_DEBUG = 1,
    PF_LOG_INFO = 2,
    PF_LOG_WARN = 3,
    PF_LOG_ERROR = 4,
    PF_LOG_OFF = 5,
};

extern _Atomic int pf_log_level_cur;

void pf_log_set_level(enum pf_log_level lvl);
/* Parses trace|debug|info|warn|error (case-insensitive). Returns 0 or -EINVAL. */
int pf_log_level_parse(const char *s, enum pf_log_level *lvl_p);
const char *pf_log_level_name(enum pf_log_level lvl);
/* Redirects log output to fd (default 2). Tests use it to capture lines. */
void pf_log_set_fd(int fd);

void pf_log_write(enum pf_log_level lvl, const char *mod, const char *fmt, ...) PF_PRINTF(3, 4);

static inline bool pf_log_enabled(enum pf_log_level lvl)
{
    return (int)lvl >= atomic_load_explicit(&pf_log_level_cur, memory_order_relaxed);
}

#ifndef PF_LOG_MOD
#define PF_LOG_MOD "pegaflow"
#endif

#define pf_log(lvl, ...)                                                                           \
    do {                                                                                           \
        if (pf_log_enabled(lvl))                                                                   \
            pf_log_write(lvl, PF_LOG_MOD, __VA_ARGS__);                                            \
    } while (0)
#define pf_trace(...) pf_log(PF_LOG_TRACE, __VA_ARGS__)
#define pf_debug(...) pf_log(PF_LOG_DEBUG, __VA_ARGS__)
#define pf_info(...)  pf_log(PF_LOG_INFO, __VA_ARGS__)
#define pf_warn(...)  pf_log(PF_LOG_WARN, __VA_ARGS__)
#define pf_error(...) pf_log(PF_LOG_ERROR, __VA_ARGS__)

/* Returns true at most once per interval_ms for the given state word (per call site). */
bool pf_log_ratelimit_ok(_Atomic uint64_t *last_ns, uint64_t interval_ms);

#define pf_log_ratelimited(lvl, interval_ms, ...)                                                  \
    do {                                                                                           \
        static _Atomic uint64_t pf_rl_last_;                                                       \
        if (pf_log_enabled(lvl) && pf_log_ratelimit_ok(&pf_rl_last_, (interval_ms)))               \
            pf_log_write(lvl, PF_LOG_MOD, __VA_ARGS__);                                            \
    } while (0)

#endif

/* Logging to stderr (or a test-chosen fd). Lines are formatted into a stack buffer and
 * written with a single write(2) so concurrent threads never interleave within a line. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "pf/log.h"
#include "pf/clock.h"

_Atomic int pf_log_level_cur = PF_LOG_INFO;
static _Atomic int log_fd = 2;

static const char *const level_names[] = {"trace", "debug", "info", "warn", "error", "off"};
static const char *const level_tags[] = {"TRACE", "DEBUG", "INFO ", "WARN ", "ERROR", "OFF  "};

void pf_log_set_level(enum pf_log_level lvl)
{
    atomic_store(&pf_log_level_cur, (int)lvl);
}

void pf_log_set_fd(int fd)
{
    atomic_store(&log_fd, fd);
}

const char *pf_log_level_name(enum pf_log_level lvl)
{
    if ((unsigned)lvl > PF_LOG_OFF)
        return "?";
    return level_names[lvl];
}

int pf_log_level_parse(const char *s, enum pf_log_level *lvl_p)
{
    for (int i = PF_LOG_TRACE; i <= PF_LOG_ERROR; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *lvl_p = (enum pf_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *lvl_p = PF_LOG_WARN;
        return 0;
    }
    return -EINVAL;
}

void pf_log_write(enum pf_log_level lvl, const char *mod, const char *fmt, ...)
{
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(buf, sizeof(buf),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_tags[lvl <= PF_LOG_OFF ? lvl : 0], mod);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(buf) - 2)
        len = sizeof(buf) - 2;
    buf[len++] = '\n';
    int fd = atomic_load(&log_fd);
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += w;
        len -= (size_t)w;
    }
}

bool pf_log_ratelimit_ok(_Atomic uint64_t *last_ns, uint64_t interval_ms)
{
    uint64_t now = pf_now_ns();
    uint64_t last = atomic_load_explicit(last_ns, memory_order_relaxed);
    if (last != 0 && now - last < interval_ms * 1000000ull)
        return false;
    return atomic_compare_exchange_strong(last_ns, &last, now);
}

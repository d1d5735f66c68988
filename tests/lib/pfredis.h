/* Test helper: a throw-away redis-server on a free loopback port (never 6379), started and
 * killed by the test. Needs Debian's redis-server on PATH (or /usr/bin). */
#ifndef PFREDIS_H
#define PFREDIS_H

#include <stdbool.h>
#include <sys/types.h>

struct pft_redis {
    pid_t pid;
    int port;
    char dir[64]; /* its working directory (deleted by stop) */
    char url[64]; /* "redis://127.0.0.1:PORT" */
};

/* Whether a redis-server binary exists. */
bool pft_redis_available(void);
/* Starts redis-server (extra_args NULL-terminated, may be NULL) on a free port and waits
 * (10 s deadline) until it answers PING. 0 or -1 (reason on stderr). */
int pft_redis_start(struct pft_redis *r, const char *const *extra_args);
/* SIGKILLs it, reaps it and removes its directory. Accepts a never-started (pid 0) one. */
void pft_redis_stop(struct pft_redis *r);
/* SIGKILLs it and reaps it (port and directory kept). */
int pft_redis_kill(struct pft_redis *r);
/* Starts it again on the same port and directory (after pft_redis_kill or not). */
int pft_redis_restart(struct pft_redis *r, const char *const *extra_args);
/* Runs one command (FLUSHALL, ...) on it; 0 when it answered without an error. */
int pft_redis_cmd(const struct pft_redis *r, const char *cmd);

#endif

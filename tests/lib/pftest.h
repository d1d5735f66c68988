/* Helpers for integration tests written in C: start/stop server processes, a minimal HTTP
 * client, seeded random data, deadlines and check macros that name what failed. */
#ifndef PFTEST_H
#define PFTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#define PFT_CHECK(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            pft_fail_cleanup();                                                                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct pft_proc {
    pid_t pid;
    char log[256];
    int grpc_port;
    int http_port;
    char addr[64];      /* host:grpc_port */
    char http_host[64]; /* host for HTTP */
};

/* Registers a process to be killed if the test fails. */
void pft_fail_cleanup(void);

/* Starts $PF_BIN/<bin> with args (NULL-terminated) plus --addr/--http-addr on port 0 of
 * host (unless args already contain --addr), waits (deadline) for both "listening" lines.
 * Returns 0 or -1 (the log is printed). */
int pft_start(struct pft_proc *p, const char *bin, const char *host, const char *const *args);
/* Sends sig, waits up to timeout_ms; returns the exit status (or 128+signal), -1 on timeout
 * (then SIGKILLs). */
int pft_stop(struct pft_proc *p, int sig, uint64_t timeout_ms);
/* Waits for exit without signalling. */
int pft_wait_exit(struct pft_proc *p, uint64_t timeout_ms);
/* Whether the log contains s. */
bool pft_log_contains(const struct pft_proc *p, const char *s);
/* Waits until the log contains s. */
bool pft_wait_log(const struct pft_proc *p, const char *s, uint64_t timeout_ms);

/* HTTP/1.0 request; *body_p malloc'ed. Returns the status code or -1. */
int pft_http(const char *host, int port, const char *method, const char *path, char **body_p);

/* Deterministic bytes: fills buf from (seed, stream). */
void pft_fill(void *buf, size_t len, uint64_t seed, uint64_t stream);
uint64_t pft_seed(void); /* PF_TEST_SEED or time; printed */
/* The next value of xorshift64 state *x (non-zero: seed it with pft_seed() | 1). */
static inline uint64_t pft_xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

uint64_t pft_now_ms(void);

/* A named scenario of an integration test. */
struct pft_scenario {
    const char *name;
    void (*fn)(void);
};
/* Runs the scenarios named in names[0..nnames) in table order (every one when nnames is 0),
 * each announced and timed on stderr, then prints "all scenarios passed". An unknown name
 * runs nothing and returns 2 (a misspelt name must not pass by running nothing); else 0. */
int pft_run_scenarios(const struct pft_scenario *sc, size_t n, char *const *names, int nnames);
/* A whole file as a NUL-terminated string (caller frees), or NULL. */
char *pft_read_file(const char *path);
/* The port in "(port N)" after the first occurrence of marker in a server log, or 0. */
int pft_port_after(const char *log, const char *marker);
/* Protected by default (docs/security.md): writes a fresh random cluster token (64 hex
 * digits from /dev/urandom) to dir/cluster-token (mode 0600), its path into path, and sets
 * PF_CLUSTER_TOKEN_FILE and PEGAFLOW_TOKEN_FILE (what this process's libpegaflow clients
 * send) to it. The C twin of tests/integration/lib.sh's pf_cluster_token. 0 or -errno. */
int pft_cluster_token(const char *dir, char *path, size_t len);

#endif

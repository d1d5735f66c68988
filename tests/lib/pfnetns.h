/* Two network namespaces joined by a veth pair, for benchmarks and tests that need two
 * "hosts" on one machine (root only). Addresses live only inside the namespaces made here. */
#ifndef PF_TEST_NETNS_H
#define PF_TEST_NETNS_H

#include <stdbool.h>
#include <stddef.h>

struct pft_netpair {
    char ns[2][64];   /* namespace names: <prefix>-a-<pid>, <prefix>-b-<pid> */
    char veth[2][16]; /* veth ends, one in each namespace */
    char ip[2][32];   /* 10.<octet>.<pid % 250>.1 and .2, /24 */
    bool made;        /* namespaces exist and must be removed */
};

/* Creates the pair. prefix names the namespaces (short: it also names the veth ends), octet
 * is the second octet of the private /24 used. 0, or -1 when a step failed (what was made
 * is removed again; the `ip` command's error is on stderr). */
int pft_netpair_setup(struct pft_netpair *p, const char *prefix, int octet);

/* Removes the namespaces (and with them the veth pair). Idempotent. */
void pft_netpair_cleanup(struct pft_netpair *p);

/* The same, safe to call from a signal handler (fork + exec of `ip`, no stdio, no malloc). */
void pft_netpair_cleanup_signal(struct pft_netpair *p);

/* Moves the calling thread into the named namespace. 0 or -errno. */
int pft_netns_enter(const char *name);

/* Full-length read/write on a stream fd, retrying on EINTR. 0, or -1 on error or EOF. */
int pft_read_full(int fd, void *buf, size_t len);
int pft_write_full(int fd, const void *buf, size_t len);

#endif

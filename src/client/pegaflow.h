/* libpegaflow: C client of the PegaFlow Engine API.
 *
 * Used by the Python connector (through ctypes: plain C types only, no protobuf in the
 * caller), by tests and by tools. Every call takes a deadline in milliseconds. Functions
 * return 0 or -errno; on failure the gRPC status code and message of the last failed call
 * on this thread are available from pf_last_error_code() / pf_last_error_message().
 *   -ECONNREFUSED  server unreachable (UNAVAILABLE)
 *   -ETIMEDOUT     deadline exceeded
 *   -EINVAL        the server rejected an argument (INVALID_ARGUMENT)
 *   -EPERM         failed precondition (unknown instance, version mismatch, ...)
 *   -EIO           server-side internal error
 * A struct pf_client is thread-safe: calls from several threads run concurrently. */
#ifndef PEGAFLOW_H
#define PEGAFLOW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PF_LEASE_LEN 16

struct pf_client;

/* Library version: the string RegisterContextBatch requires as client_version. */
const char *pf_client_version(void);

/* target: "host:port" or "http://host:port". The connection is made lazily. */
int pf_client_connect(const char *target, struct pf_client **c_p);
void pf_client_close(struct pf_client *c);

int pf_client_health(struct pf_client *c, uint64_t timeout_ms);
int pf_client_shutdown(struct pf_client *c, uint64_t timeout_ms);

/* gRPC status code (0 = OK) and message of this thread's last failed call. */
int pf_last_error_code(void);
const char *pf_last_error_message(void);

#ifdef __cplusplus
}
#endif

#endif

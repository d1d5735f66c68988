/* Private helpers of src/http. */
#ifndef PF_HTTP_INTERNAL_H
#define PF_HTTP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

/* 0 when a request with this method may proceed on a server with admin token `token` (NULL:
 * none configured), else the HTTP status to answer: 401 (missing or wrong bearer token),
 * 403 (no token configured and a POST from a caller not on this host). conn is the MHD
 * connection. */
int pf_http_admin_check(void *conn, const char *method, const char *token);
/* Is the client of MHD connection conn on this host (loopback, one of this host's
 * addresses: pf_auth_ip_local)? */
bool pf_http_client_is_local(void *conn);
/* The client's (percent-decoded) bytes in as they may go into an answer or a log line: every
 * byte outside printable ASCII as \xNN, truncated to fit out (n > 4). A decoded "%0a" must
 * not put a line of the client's choosing into a body. */
void pf_http_printable(const char *in, char *out, size_t n);

#endif

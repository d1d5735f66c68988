/* Private helpers of src/http. */
#ifndef PF_HTTP_INTERNAL_H
#define PF_HTTP_INTERNAL_H

/* 0 when a request with this method may proceed on a server with admin token `token` (NULL:
 * none configured), else the HTTP status to answer (401). conn is the MHD connection. */
int pf_http_admin_check(void *conn, const char *method, const char *token);

#endif

/* Admin token of the HTTP servers (--admin-token-file, docs/security.md): POST endpoints
 * want "Authorization: Bearer TOKEN"; the comparison takes the same time wherever the
 * received token differs. GET endpoints (/health, /metrics, /instances) stay open. */
#include <string.h>
#include <strings.h>

#include <microhttpd.h>

#include "http/http_internal.h"
#include "pf/auth.h"

int pf_http_admin_check(void *conn, const char *method, const char *token)
{
    if (!token || strcmp(method, "POST") != 0)
        return 0;
    const char *h = MHD_lookup_connection_value((struct MHD_Connection *)conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 401;
    h += 7;
    while (*h == ' ')
        h++;
    return pf_auth_token_eq(token, h, strlen(h)) ? 0 : 401;
}

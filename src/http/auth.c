/* Admin token of the HTTP servers (--admin-token-file, docs/security.md): POST endpoints
 * want "Authorization: Bearer TOKEN"; the comparison takes the same time wherever the
 * received token differs. Without a token POST endpoints answer only callers on this host
 * (loopback or one of its addresses; protected by default). GET endpoints (/health,
 * /metrics, /instances) stay open. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "http/http_internal.h"
#include "pf/auth.h"

bool pf_http_client_is_local(void *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info((struct MHD_Connection *)conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return false;
    char ip[INET6_ADDRSTRLEN];
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof(ip));
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof(ip));
    else
        return sa->sa_family == AF_UNIX;
    return pf_auth_ip_local(ip);
}

int pf_http_admin_check(void *conn, const char *method, const char *token)
{
    if (strcmp(method, "POST") != 0)
        return 0;
    if (!token)
        return pf_http_client_is_local(conn) ? 0 : 403;
    const char *h = MHD_lookup_connection_value((struct MHD_Connection *)conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 401;
    h += 7;
    while (*h == ' ')
        h++;
    return pf_auth_token_eq(token, h, strlen(h)) ? 0 : 401;
}

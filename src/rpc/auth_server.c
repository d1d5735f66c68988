/* Server-side parts of the authentication layer (pf/auth.h), kept out of libpegaflow: the
 * caller's proven addresses (transport IP, mutual-TLS subjectAltNames) and the listener's
 * SSL credentials. */
#include <arpa/inet.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "pf/auth.h"
#include "pf/rpc.h"
#include "rpc/rpc_internal.h"

void pf_rpc_call_identities(struct pf_rpc_call *call, char (*ips)[PF_AUTH_IP_MAX], size_t max,
                            size_t *n_p)
{
    size_t n = 0;
    if (max > 0 && pf_auth_peer_ip(pf_rpc_call_peer(call), ips[0], PF_AUTH_IP_MAX) == 0)
        n++;
    grpc_auth_context *ctx = grpc_call_auth_context(pf_rpc_call_grpc(call));
    if (ctx) {
        if (grpc_auth_context_peer_is_authenticated(ctx)) {
            grpc_auth_property_iterator it =
                grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_SAN_PROPERTY_NAME);
            const grpc_auth_property *pr;
            while (n < max && (pr = grpc_auth_property_iterator_next(&it)) != NULL) {
                if (pr->value_length == 0 || pr->value_length >= PF_AUTH_IP_MAX)
                    continue;
                memcpy(ips[n], pr->value, pr->value_length);
                ips[n][pr->value_length] = '\0';
                struct in6_addr a;
                struct in_addr a4; /* DNS names are not addresses */
                if (inet_pton(AF_INET, ips[n], &a4) == 1 || inet_pton(AF_INET6, ips[n], &a) == 1)
                    n++;
            }
        }
        grpc_auth_context_release(ctx);
    }
    *n_p = n;
}

grpc_server_credentials *pf_auth_server_creds(const struct pf_auth *a)
{
    if (!a || !a->cert_pem)
        return grpc_insecure_server_credentials_create();
    grpc_ssl_pem_key_cert_pair kp = {.private_key = a->key_pem, .cert_chain = a->cert_pem};
    return grpc_ssl_server_credentials_create_ex(
        a->ca_pem, &kp, 1,
        a->ca_pem ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                  : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
}

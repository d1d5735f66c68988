/* Authentication of the gRPC and HTTP endpoints (docs/security.md).
 *
 * Three independent mechanisms, each off unless its flag is given:
 *  - TLS (--tls-cert/--tls-key, optionally --tls-ca): every gRPC listener except a
 *    Unix-socket --local-addr speaks TLS, every outgoing channel verifies the server with the
 *    CA. With a CA, servers demand a client certificate signed by it (mutual TLS) and
 *    channels present this node's certificate.
 *  - Cluster token (--cluster-token-file): peer and MetaServer RPCs carry it as the call
 *    metadata "pf-cluster-token"; servers compare it in constant time. Missing or wrong:
 *    UNAUTHENTICATED.
 *  - Admin token (--admin-token-file): the HTTP POST endpoints want "Authorization: Bearer
 *    TOKEN" (401 otherwise); GET /health and /metrics stay open.
 * Methods are classified (enum pf_rpc_access): OPEN (Health), PEER (cluster RPCs, the
 * default for a method no rule names) and LOCAL (what a local vLLM worker calls). LOCAL
 * methods from a caller that is not on this host (Unix socket, loopback, or one of this
 * host's interface addresses) answer PERMISSION_DENIED unless the call carries the cluster
 * token, when the server enforces locality (pf_rpc_server_config.local_only).
 *
 * Everything here is immutable after creation and safe to share between threads. */
#ifndef PF_AUTH_H
#define PF_AUTH_H

#include <stdbool.h>
#include <stddef.h>

/* Metadata key of the cluster token on gRPC calls. */
#define PF_AUTH_TOKEN_MD "pf-cluster-token"
/* Metadata key of a tenant token (pf/tenant.h; libpegaflow: PEGAFLOW_TENANT_TOKEN_FILE). */
#define PF_AUTH_TENANT_MD "pf-tenant-token"
/* Longest token accepted from a file (bytes, after trimming trailing whitespace). */
#define PF_AUTH_TOKEN_MAX 4096

enum pf_rpc_access {
    PF_RPC_ACCESS_PEER = 0, /* needs the cluster token when one is configured */
    PF_RPC_ACCESS_OPEN,     /* anyone who can connect (and pass TLS) */
    PF_RPC_ACCESS_LOCAL,    /* callers on this host, or with the cluster token */
};

struct pf_rpc_access_rule {
    const char *path; /* "/pegaflow.Engine/Save" */
    enum pf_rpc_access access;
};

/* Classes of the Engine service's methods (src/rpc/engine_access.c). */
extern const struct pf_rpc_access_rule pf_engine_access[];
extern const size_t pf_engine_naccess;

struct pf_auth_config {
    const char *tls_cert; /* PEM certificate chain file; with tls_key */
    const char *tls_key;  /* PEM private key file */
    const char *tls_ca;   /* PEM CA file: verify servers, require client certificates */
    const char *cluster_token_file;
    const char *admin_token_file;
};

/* Loaded credentials: NULL members are not configured. */
struct pf_auth {
    char *cert_pem, *key_pem, *ca_pem;
    char *cluster_token;
    char *admin_token;
};

/* Reads every configured file. Errors (-EINVAL: cert without key, key without cert, CA
 * without cert, empty or oversized token, not PEM; -errno of open/read) come with a
 * one-line message naming the flag. On error nothing is kept. */
int pf_auth_load(const struct pf_auth_config *cfg, struct pf_auth *a, char *err, size_t errlen);
/* Frees (and wipes the secrets of) what pf_auth_load read. Accepts NULL. */
void pf_auth_free(struct pf_auth *a);

/* Reads a token file: the first line without trailing whitespace (CR, LF, spaces). The
 * token must be non-empty printable ASCII without spaces, at most PF_AUTH_TOKEN_MAX bytes.
 * *tok_p is malloc'ed. what names the flag in err. */
int pf_auth_read_token(const char *path, const char *what, char **tok_p, char *err, size_t errlen);
/* Reads a whole PEM file (must contain "-----BEGIN "). *pem_p is malloc'ed, NUL-terminated. */
int pf_auth_read_pem(const char *path, const char *what, char **pem_p, char *err, size_t errlen);

/* Constant-time comparison of a configured token with len bytes received. */
bool pf_auth_token_eq(const char *want, const void *got, size_t len);

/* Is the caller behind gRPC peer string `peer` ("ipv4:1.2.3.4:5", "ipv6:[::1]:5",
 * "unix:/path") on this host? Unix socket, loopback, or an address of one of this host's
 * interfaces (getifaddrs, re-read at most once a second when an address is not found). */
bool pf_auth_peer_is_local(const char *peer);
/* The IP of a gRPC peer string, without brackets ("1.2.3.4", "::1"), in host. -EINVAL when
 * the peer is not an IP endpoint (unix sockets). */
int pf_auth_peer_ip(const char *peer, char *host, size_t hostlen);

/* Longest IP text (IPv6 with room). */
#define PF_AUTH_IP_MAX 64
struct pf_rpc_call;
/* The addresses a caller has proven: its transport IP (first; none for a Unix socket) and,
 * with mutual TLS, the IP subjectAltNames of its verified certificate. Writes up to max
 * entries into ips and their number into *n_p. Valid in a handler. */
void pf_rpc_call_identities(struct pf_rpc_call *call, char (*ips)[PF_AUTH_IP_MAX], size_t max,
                            size_t *n_p);
/* Is host (an IP literal) in ips[0..n), comparing parsed addresses (so "::ffff:1.2.3.4"
 * equals "1.2.3.4")? Two loopback addresses count as equal: single-host simulations give
 * nodes distinct 127.0.0.x identities while their connections come from 127.0.0.1. */
bool pf_auth_ip_in(const char *host, const char (*ips)[PF_AUTH_IP_MAX], size_t n);
/* Is host (an IP literal) loopback or an address of one of this host's interfaces? */
bool pf_auth_ip_local(const char *host);

/* Checks a call to `path` by `peer` carrying `token` (NULL: none; tlen bytes) against the
 * policy: rules (NULL: every method is PEER), the credentials (NULL: none configured) and
 * whether LOCAL methods are restricted to this host. Returns 0 (allowed) or the gRPC code
 * (PF_GRPC_UNAUTHENTICATED, PF_GRPC_PERMISSION_DENIED) with the reason in msg. A wrong
 * token is refused even where no token is needed. */
int pf_auth_check(const struct pf_auth *a, const struct pf_rpc_access_rule *rules, size_t nrules,
                  bool local_only, const char *path, const char *peer, const void *token,
                  size_t tlen, char *msg, size_t msglen);

/* ------------------------------------------------------------------ channels */

/* Security of an outgoing channel. All NULL: plaintext, no token (today's default). */
struct pf_rpc_channel_opts {
    bool tls;             /* TLS (implied by ca_pem); with ca_pem NULL the system roots */
    const char *ca_pem;   /* verify the server against this CA */
    const char *cert_pem; /* client certificate chain (mutual TLS), with key_pem */
    const char *key_pem;
    const char *token;        /* sent as PF_AUTH_TOKEN_MD on every call */
    const char *tenant_token; /* sent as PF_AUTH_TENANT_MD (never a process default) */
    /* A channel whose caller treats every failure as final (libpegaflow: a failed query is a
     * miss, a failed save is recomputed): gRPC's retry filter (transparent retries of calls
     * that never reached the server: a copy of each call's metadata and message held until
     * the call commits) and channelz call counting are left out of every call. */
    bool lean_calls;
};

struct pf_rpc_channel;
/* pf_rpc_channel_open with explicit security. Targets "unix:PATH" never use TLS. Strings
 * are copied. -EINVAL for cert without key (or the reverse). */
int pf_rpc_channel_open_opts(const char *target, const struct pf_rpc_channel_opts *o,
                             struct pf_rpc_channel **ch_p);
/* Process-wide options of pf_rpc_channel_open (copied; NULL resets to plaintext). Set once
 * at start-up, before channels are opened; thread-safe. Returns 0 or -ENOMEM. */
int pf_rpc_set_default_channel_opts(const struct pf_rpc_channel_opts *o);
/* Channel options from the loaded credentials of this process (the node's certificate is
 * its client certificate). Pointers into a. */
void pf_auth_channel_opts(const struct pf_auth *a, struct pf_rpc_channel_opts *o);

/* The channel options libpegaflow takes from its environment: PEGAFLOW_TLS_CA (TLS with
 * that CA), PEGAFLOW_TLS_CERT + PEGAFLOW_TLS_KEY (client certificate), PEGAFLOW_TOKEN_FILE
 * (cluster token), PEGAFLOW_TENANT_TOKEN_FILE (tenant token, docs/security.md "Tenants").
 * The PEM texts and the tokens are malloc'ed into *e and *o points into them (free with
 * pf_auth_env_free after the channel is open: channels copy). -errno with a message naming
 * the variable when a file is unreadable or malformed, or only one of CERT/KEY is set
 * (-EINVAL). */
struct pf_auth_env {
    char *ca, *cert, *key, *token;
    char *tenant_token; /* PEGAFLOW_TENANT_TOKEN_FILE */
};
int pf_auth_env_load(struct pf_auth_env *e, struct pf_rpc_channel_opts *o, char *err,
                     size_t errlen);
void pf_auth_env_free(struct pf_auth_env *e);

#endif

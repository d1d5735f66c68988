/* Authentication policy of the gRPC layer (pf/auth.h): credential files, the per-call check
 * (token metadata, caller locality, method class). Part of libpegaflow too (channel options
 * from the environment); what needs the server (a call's identities, listener credentials)
 * is in auth_server.c.
 *
 * Locality: a caller is local when it came in over a Unix socket, from loopback, or from an
 * address one of this host's interfaces carries. The interface list is cached and re-read
 * (getifaddrs) when an address is not in it, at most once a second, so a remote caller
 * cannot make every call pay for a netlink dump; and when it is older than
 * IFADDR_MAX_AGE_NS, so that an address this host gave up stops counting as local. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#define PF_LOG_MOD "auth"
#include "pf/auth.h"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/rpc.h"
#include "rpc/rpc_internal.h"

#define PEM_MAX (1u << 20)

static void wipe_free(char *s)
{
    if (!s)
        return;
    volatile char *p = s;
    while (*p)
        *p++ = 0;
    free(s);
}

/* Reads at most max bytes of path into a NUL-terminated buffer. */
static int read_small(const char *path, const char *what, size_t max, char **buf_p, size_t *len_p,
                      char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open %s: %s", what, path, strerror(e));
        return -e;
    }
    char *buf = malloc(max + 1);
    size_t n = 0;
    int rc = 0;
    if (!buf) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", what);
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, max + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            snprintf(err, errlen, "%s: cannot read %s: %s", what, path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > max) {
            rc = -EINVAL;
            snprintf(err, errlen, "%s: %s is larger than %zu bytes", what, path, max);
            goto out;
        }
    }
    buf[n] = '\0';
    *buf_p = buf;
    *len_p = n;
    buf = NULL;
out:
    if (buf) {
        memset(buf, 0, max + 1);
        free(buf);
    }
    close(fd);
    return rc;
}

int pf_auth_read_token(const char *path, const char *what, char **tok_p, char *err, size_t errlen)
{
    char *buf;
    size_t n;
    int rc = read_small(path, what, PF_AUTH_TOKEN_MAX + 2, &buf, &n, err, errlen);
    if (rc)
        return rc;
    char *nl = strchr(buf, '\n');
    if (nl) {
        /* only trailing blank lines may follow the token */
        for (const char *p = nl; *p; p++)
            if (*p != '\n' && *p != '\r' && *p != ' ' && *p != '\t') {
                snprintf(err, errlen, "%s: %s has more than one line", what, path);
                rc = -EINVAL;
                goto err_buf;
            }
        *nl = '\0';
    }
    n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = '\0';
    if (n == 0) {
        snprintf(err, errlen, "%s: %s is empty", what, path);
        rc = -EINVAL;
        goto err_buf;
    }
    if (n > PF_AUTH_TOKEN_MAX) {
        snprintf(err, errlen, "%s: the token in %s is longer than %d bytes", what, path,
                 PF_AUTH_TOKEN_MAX);
        rc = -EINVAL;
        goto err_buf;
    }
    for (size_t i = 0; i < n; i++)
        if (buf[i] <= ' ' || buf[i] > '~') {
            snprintf(err, errlen,
                     "%s: the token in %s must be printable ASCII without spaces (byte %zu)", what,
                     path, i);
            rc = -EINVAL;
            goto err_buf;
        }
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 0004))
        pf_warn("%s: %s is readable by every user of this host", what, path);
    *tok_p = buf;
    return 0;
err_buf:
    wipe_free(buf);
    return rc;
}

int pf_auth_read_pem(const char *path, const char *what, char **pem_p, char *err, size_t errlen)
{
    char *buf;
    size_t n;
    int rc = read_small(path, what, PEM_MAX, &buf, &n, err, errlen);
    if (rc)
        return rc;
    if (strlen(buf) != n || !strstr(buf, "-----BEGIN ")) {
        snprintf(err, errlen, "%s: %s is not a PEM file", what, path);
        wipe_free(buf);
        return -EINVAL;
    }
    *pem_p = buf;
    return 0;
}

int pf_auth_load(const struct pf_auth_config *cfg, struct pf_auth *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof(*a));
    if (!!cfg->tls_cert != !!cfg->tls_key) {
        snprintf(err, errlen, "%s: TLS needs --tls-cert and --tls-key together",
                 cfg->tls_cert ? "--tls-cert" : "--tls-key");
        return -EINVAL;
    }
    if (cfg->tls_ca && !cfg->tls_cert) {
        snprintf(err, errlen, "--tls-ca: needs --tls-cert and --tls-key (this node's certificate)");
        return -EINVAL;
    }
    int rc = 0;
    if (cfg->tls_cert &&
        ((rc = pf_auth_read_pem(cfg->tls_cert, "--tls-cert", &a->cert_pem, err, errlen)) ||
         (rc = pf_auth_read_pem(cfg->tls_key, "--tls-key", &a->key_pem, err, errlen))))
        goto err_free;
    if (cfg->tls_ca && (rc = pf_auth_read_pem(cfg->tls_ca, "--tls-ca", &a->ca_pem, err, errlen)))
        goto err_free;
    if (a->key_pem && !strstr(a->key_pem, "PRIVATE KEY-----")) {
        snprintf(err, errlen, "--tls-key: %s holds no PRIVATE KEY", cfg->tls_key);
        rc = -EINVAL;
        goto err_free;
    }
    if (a->cert_pem && !strstr(a->cert_pem, "-----BEGIN CERTIFICATE-----")) {
        snprintf(err, errlen, "--tls-cert: %s holds no CERTIFICATE", cfg->tls_cert);
        rc = -EINVAL;
        goto err_free;
    }
    if (a->ca_pem && !strstr(a->ca_pem, "-----BEGIN CERTIFICATE-----")) {
        snprintf(err, errlen, "--tls-ca: %s holds no CERTIFICATE", cfg->tls_ca);
        rc = -EINVAL;
        goto err_free;
    }
    if (cfg->cluster_token_file &&
        (rc = pf_auth_read_token(cfg->cluster_token_file, "--cluster-token-file", &a->cluster_token,
                                 err, errlen)))
        goto err_free;
    if (cfg->admin_token_file &&
        (rc = pf_auth_read_token(cfg->admin_token_file, "--admin-token-file", &a->admin_token, err,
                                 errlen)))
        goto err_free;
    return 0;
err_free:
    pf_auth_free(a);
    return rc;
}

void pf_auth_free(struct pf_auth *a)
{
    if (!a)
        return;
    free(a->cert_pem);
    wipe_free(a->key_pem);
    free(a->ca_pem);
    wipe_free(a->cluster_token);
    wipe_free(a->admin_token);
    memset(a, 0, sizeof(*a));
}

bool pf_auth_token_eq(const char *want, const void *got, size_t len)
{
    size_t wl = strlen(want);
    const unsigned char *g = got, *w = (const unsigned char *)want;
    /* the time depends on the received length only, never on where the bytes differ */
    unsigned char diff = (unsigned char)(wl != len);
    for (size_t i = 0; i < len; i++)
        diff |= (unsigned char)(g[i] ^ (i < wl ? w[i] : 0));
    return diff == 0;
}

/* ------------------------------------------------------------------ locality */

int pf_auth_peer_ip(const char *peer, char *host, size_t hostlen)
{
    const char *p;
    if (strncmp(peer, "ipv4:", 5) == 0) {
        p = peer + 5;
        const char *colon = strrchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        if (n == 0 || n >= hostlen)
            return -EINVAL;
        memcpy(host, p, n);
        host[n] = '\0';
        return 0;
    }
    if (strncmp(peer, "ipv6:", 5) == 0) {
        p = peer + 5;
        if (*p == '[') {
            const char *end = strchr(p, ']');
            if (!end)
                return -EINVAL;
            size_t n = (size_t)(end - p - 1);
            if (n == 0 || n >= hostlen)
                return -EINVAL;
            memcpy(host, p + 1, n);
            host[n] = '\0';
            /* scope ids (%eth0) are not part of the address */
            char *pct = strchr(host, '%');
            if (pct)
                *pct = '\0';
            return 0;
        }
        size_t n = strlen(p);
        if (n == 0 || n >= hostlen)
            return -EINVAL;
        memcpy(host, p, n + 1);
        return 0;
    }
    return -EINVAL;
}

#define IFADDR_MAX        256
#define IFADDR_MAX_AGE_NS (10 * PF_NS_PER_SEC) /* re-read an older list on the next check */

static pthread_mutex_t if_mu = PTHREAD_MUTEX_INITIALIZER;
static struct in6_addr if_addrs[IFADDR_MAX]; /* v4 as v4-mapped */
static size_t if_n;
static uint64_t if_read_ns;
static bool if_valid;

static void map_v4(const struct in_addr *a4, struct in6_addr *a6)
{
    memset(a6, 0, sizeof(*a6));
    a6->s6_addr[10] = 0xff;
    a6->s6_addr[11] = 0xff;
    memcpy(&a6->s6_addr[12], a4, 4);
}

static void if_reread_locked(void)
{
    struct ifaddrs *ifa = NULL;
    if_read_ns = pf_now_ns();
    if (getifaddrs(&ifa) != 0) {
        pf_log_ratelimited(PF_LOG_WARN, 10000, "getifaddrs: %s", strerror(errno));
        return;
    }
    if_n = 0;
    for (struct ifaddrs *i = ifa; i && if_n < IFADDR_MAX; i = i->ifa_next) {
        if (!i->ifa_addr)
            continue;
        if (i->ifa_addr->sa_family == AF_INET)
            map_v4(&((struct sockaddr_in *)i->ifa_addr)->sin_addr, &if_addrs[if_n++]);
        else if (i->ifa_addr->sa_family == AF_INET6)
            if_addrs[if_n++] = ((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
    }
    if_valid = true;
    freeifaddrs(ifa);
}

static bool if_has(const struct in6_addr *a)
{
    bool found = false;
    pthread_mutex_lock(&if_mu);
    if (if_valid && pf_now_ns() - if_read_ns > IFADDR_MAX_AGE_NS)
        if_reread_locked(); /* a removed address must not stay local forever */
    for (int pass = 0; pass < 2 && !found; pass++) {
        if (pass == 1 || !if_valid) {
            if (if_valid && pf_now_ns() - if_read_ns < PF_NS_PER_SEC)
                break;
            if_reread_locked();
        }
        for (size_t i = 0; i < if_n && !found; i++)
            found = memcmp(&if_addrs[i], a, sizeof(*a)) == 0;
    }
    pthread_mutex_unlock(&if_mu);
    return found;
}

bool pf_auth_peer_is_local(const char *peer)
{
    if (!peer)
        return false;
    if (strncmp(peer, "unix:", 5) == 0 || strncmp(peer, "unix-abstract:", 14) == 0)
        return true;
    char host[INET6_ADDRSTRLEN + 8];
    if (pf_auth_peer_ip(peer, host, sizeof(host)) != 0)
        return false;
    struct in6_addr a6;
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1)
        map_v4(&a4, &a6);
    else if (inet_pton(AF_INET6, host, &a6) != 1)
        return false;
    if (IN6_IS_ADDR_LOOPBACK(&a6))
        return true;
    if (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127)
        return true;
    return if_has(&a6);
}

static int parse_ip(const char *host, struct in6_addr *a6)
{
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        map_v4(&a4, a6);
        return 0;
    }
    return inet_pton(AF_INET6, host, a6) == 1 ? 0 : -EINVAL;
}

static bool is_loopback6(const struct in6_addr *a)
{
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool pf_auth_ip_local(const char *host)
{
    struct in6_addr h;
    return parse_ip(host, &h) == 0 && (is_loopback6(&h) || if_has(&h));
}

bool pf_auth_ip_in(const char *host, const char (*ips)[PF_AUTH_IP_MAX], size_t n)
{
    struct in6_addr h, x;
    if (parse_ip(host, &h) != 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (parse_ip(ips[i], &x) != 0)
            continue;
        if (memcmp(&h, &x, sizeof(h)) == 0 || (is_loopback6(&h) && is_loopback6(&x)))
            return true;
    }
    return false;
}

/* ------------------------------------------------------------------ policy */

int pf_auth_check(const struct pf_auth *a, const struct pf_rpc_access_rule *rules, size_t nrules,
                  bool local_only, const char *path, const char *peer, const void *token,
                  size_t tlen, char *msg, size_t msglen)
{
    enum pf_rpc_access cls = PF_RPC_ACCESS_PEER;
    for (size_t i = 0; rules && i < nrules; i++)
        if (strcmp(rules[i].path, path) == 0) {
            cls = rules[i].access;
            break;
        }
    const char *want = a ? a->cluster_token : NULL;
    bool authed = false;
    if (want && token) {
        if (!pf_auth_token_eq(want, token, tlen)) {
            snprintf(msg, msglen, "%s: wrong cluster token (%s metadata)", path, PF_AUTH_TOKEN_MD);
            return PF_GRPC_UNAUTHENTICATED;
        }
        authed = true;
    }
    switch (cls) {
    case PF_RPC_ACCESS_OPEN:
        return 0;
    case PF_RPC_ACCESS_LOCAL:
        if (!local_only || authed || pf_auth_peer_is_local(peer))
            return 0;
        snprintf(msg, msglen,
                 "%s is only served to callers on this host (Unix socket, loopback or a local "
                 "address)%s; caller %s. To serve workers elsewhere: %s",
                 path, want ? " or with the cluster token" : "", peer ? peer : "?",
                 want ? "give them the cluster token (PEGAFLOW_TOKEN_FILE)"
                      : "start the server with --cluster-token-file FILE and give the workers "
                        "the token (PEGAFLOW_TOKEN_FILE), or --local-rpcs any (no protection)");
        return PF_GRPC_PERMISSION_DENIED;
    case PF_RPC_ACCESS_PEER:
    default:
        if (!want || authed)
            return 0;
        snprintf(msg, msglen,
                 "%s needs the cluster token (%s metadata); caller %s sent none (nodes: "
                 "--cluster-token-file with the same secret; clients: PEGAFLOW_TOKEN_FILE)",
                 path, PF_AUTH_TOKEN_MD, peer ? peer : "?");
        return PF_GRPC_UNAUTHENTICATED;
    }
}

/* ------------------------------------------------------------------ credentials */

void pf_auth_channel_opts(const struct pf_auth *a, struct pf_rpc_channel_opts *o)
{
    memset(o, 0, sizeof(*o));
    if (!a)
        return;
    o->tls = a->cert_pem != NULL;
    o->ca_pem = a->ca_pem;
    if (a->ca_pem) {
        o->cert_pem = a->cert_pem;
        o->key_pem = a->key_pem;
    }
    o->token = a->cluster_token;
}

int pf_auth_env_load(struct pf_auth_env *e, struct pf_rpc_channel_opts *o, char *err, size_t errlen)
{
    memset(e, 0, sizeof(*e));
    memset(o, 0, sizeof(*o));
    const char *ca = getenv("PEGAFLOW_TLS_CA"), *cert = getenv("PEGAFLOW_TLS_CERT"),
               *key = getenv("PEGAFLOW_TLS_KEY"), *tok = getenv("PEGAFLOW_TOKEN_FILE");
    int rc = 0;
    if (ca && *ca && (rc = pf_auth_read_pem(ca, "PEGAFLOW_TLS_CA", &e->ca, err, errlen)))
        goto err_free;
    if (!!(cert && *cert) != !!(key && *key)) {
        snprintf(err, errlen, "PEGAFLOW_TLS_CERT and PEGAFLOW_TLS_KEY must be set together");
        rc = -EINVAL;
        goto err_free;
    }
    if (cert && *cert &&
        ((rc = pf_auth_read_pem(cert, "PEGAFLOW_TLS_CERT", &e->cert, err, errlen)) ||
         (rc = pf_auth_read_pem(key, "PEGAFLOW_TLS_KEY", &e->key, err, errlen))))
        goto err_free;
    if (tok && *tok &&
        (rc = pf_auth_read_token(tok, "PEGAFLOW_TOKEN_FILE", &e->token, err, errlen)))
        goto err_free;
    const char *ttok = getenv("PEGAFLOW_TENANT_TOKEN_FILE");
    if (ttok && *ttok &&
        (rc =
             pf_auth_read_token(ttok, "PEGAFLOW_TENANT_TOKEN_FILE", &e->tenant_token, err, errlen)))
        goto err_free;
    o->tls = e->ca || e->cert;
    o->ca_pem = e->ca;
    o->cert_pem = e->cert;
    o->key_pem = e->key;
    o->token = e->token;
    o->tenant_token = e->tenant_token;
    return 0;
err_free:
    pf_auth_env_free(e);
    return rc;
}

void pf_auth_env_free(struct pf_auth_env *e)
{
    if (!e)
        return;
    free(e->ca);
    free(e->cert);
    wipe_free(e->key);
    wipe_free(e->token);
    wipe_free(e->tenant_token);
    memset(e, 0, sizeof(*e));
}

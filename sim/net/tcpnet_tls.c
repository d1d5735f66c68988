/* TCP fabric, TLS (docs/security.md "Fabric TLS"): with the node's certificate configured
 * (pf_net_config.tls_*), every fabric connection is TLS 1.3 (OpenSSL) and a peer that does
 * not complete the handshake is refused.
 *
 * Design: an in-process relay per connection. The fabric code keeps working on a plain
 * stream socket: after the TCP connect (requesting side) or accept (serving side) the
 * socket is handed to a relay thread that owns it and its SSL object, and the fabric gets
 * one end of an AF_UNIX socketpair instead; the relay encrypts what the fabric writes to the
 * pair and decrypts what arrives from the peer. One thread per SSL object: OpenSSL does not
 * allow SSL_read and SSL_write on one SSL concurrently, and the fabric reads and writes a
 * connection from different threads. Shutting the pair end down (QP invalidation, served
 * connections killed) reaches the relay as end-of-file: it closes the TLS connection, and
 * the peer's relay passes the end-of-file on to the peer's fabric, so the error semantics of
 * the plain fabric hold. Kernel TLS would avoid the copies but is not available everywhere
 * (not in this project's test VMs); the relay works on any kernel.
 *
 * Verification: the requesting side verifies the serving node's certificate against the
 * CA (--tls-ca; without one the system's default roots) and that it names the IP address
 * it connects to (subjectAltName); with a CA the serving side requires a client
 * certificate signed by it. Handshakes are bounded by the connect timeout (requesting side)
 * and TCPNET_TLS_ACCEPT_MS (serving side). Session tickets are off (no post-handshake
 * messages), renegotiation does not exist in TLS 1.3. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define PF_LOG_MOD "tcpnet"
#include "pf/clock.h"
#include "pf/common.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/thread.h"

#include "tcpnet_internal.h"

/* The bytes between two relays pass through libssl's socket I/O, which ThreadSanitizer does
 * not see (the library is uninstrumented and suppressed, ci/tsan.supp): with both nodes in
 * one process (the unit tests) it would miss the kernel's hand-off of the fabric's data from
 * one node's threads to the other's. Modelled on this address: released when bytes are handed
 * to SSL_write, acquired when SSL_read returns bytes (no-ops outside TSan builds). */
static char tcpnet_tls_wire;

#define TCPNET_TLS_ACCEPT_MS 10000
#define TCPNET_TLS_BUF       (256u << 10)

struct tcpnet_tls {
    SSL_CTX *cli, *srv;
    bool mutual;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int relays; /* running relay threads (under mu) */
    bool stopping;
    struct pf_metric *m_hs;
};

struct relay {
    struct tcpnet_tls *tls;
    SSL *ssl;
    int net, app;
    bool accept; /* handshake still to do (serving side) */
    char peer[INET6_ADDRSTRLEN + 8];
    uint8_t *up, *down; /* app -> net plaintext; net -> app plaintext */
    size_t up_off, up_len, down_off, down_len;
};

static void tls_errstr(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "connection closed or timed out");
    ERR_clear_error();
}

static int load_pem_certs(const char *pem, SSL_CTX *ctx, bool chain, char *err, size_t errlen)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    if (!b)
        return -ENOMEM;
    int n = 0, rc = 0;
    X509 *x;
    while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
        int ok;
        if (!chain) {
            ok = X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), x);
            X509_free(x);
        } else if (n == 0) {
            ok = SSL_CTX_use_certificate(ctx, x);
            X509_free(x);
        } else {
            ok = SSL_CTX_add_extra_chain_cert(ctx, x); /* takes x */
            if (!ok)
                X509_free(x);
        }
        if (!ok) {
            rc = -EINVAL;
            break;
        }
        n++;
    }
    ERR_clear_error(); /* the end of the PEM text */
    BIO_free(b);
    if (rc == 0 && n == 0)
        rc = -EINVAL;
    if (rc)
        snprintf(err, errlen, "the %s holds no usable certificate",
                 chain ? "--tls-cert" : "--tls-ca");
    return rc;
}

static SSL_CTX *make_ctx(bool server, const struct pf_net_config *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx) {
        snprintf(err, errlen, "cannot create an OpenSSL context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (load_pem_certs(cfg->tls_cert_pem, ctx, true, err, errlen) != 0)
        goto err_ctx;
    BIO *b = BIO_new_mem_buf(cfg->tls_key_pem, -1);
    EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    int ok = k && SSL_CTX_use_PrivateKey(ctx, k) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    EVP_PKEY_free(k);
    if (!ok) {
        snprintf(err, errlen, "the --tls-key cannot be used with the --tls-cert");
        goto err_ctx;
    }
    if (cfg->tls_ca_pem) {
        if (load_pem_certs(cfg->tls_ca_pem, ctx, false, err, errlen) != 0)
            goto err_ctx;
        SSL_CTX_set_verify(
            ctx, server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER,
            NULL);
    } else if (!server) {
        SSL_CTX_set_default_verify_paths(ctx);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    ERR_clear_error();
    return ctx;
err_ctx:
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return NULL;
}

int pf_tcpnet_tls_create(const struct pf_net_config *cfg, struct tcpnet_tls **tls_p, char *err,
                         size_t errlen)
{
    if (!cfg->tls_key_pem) {
        snprintf(err, errlen, "TLS on the TCP fabric needs the key of --tls-cert (--tls-key)");
        return -EINVAL;
    }
    struct tcpnet_tls *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->cli = make_ctx(false, cfg, err, errlen);
    t->srv = t->cli ? make_ctx(true, cfg, err, errlen) : NULL;
    if (!t->srv) {
        SSL_CTX_free(t->cli);
        free(t);
        return -EINVAL;
    }
    t->mutual = cfg->tls_ca_pem != NULL;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->m_hs = pf_metric_counter("pegaflow_tcpnet_tls_handshakes",
                                "TLS handshakes of the TCP fabric", "side,result");
    *tls_p = t;
    return 0;
}

bool pf_tcpnet_tls_mutual(const struct tcpnet_tls *t)
{
    return t->mutual;
}

void pf_tcpnet_tls_destroy(struct tcpnet_tls *t)
{
    if (!t)
        return;
    /* relays end when their fabric side is closed (the NICs are gone by now) */
    pthread_mutex_lock(&t->mu);
    t->stopping = true;
    uint64_t dl = pf_now_ns() + 5000 * PF_NS_PER_MS;
    while (t->relays > 0 && pf_now_ns() < dl) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    int left = t->relays;
    pthread_mutex_unlock(&t->mu);
    if (left) {
        pf_warn("TCP fabric TLS: %d relay(s) still running at close", left);
        return; /* they still use the contexts: leave them (process exit) */
    }
    SSL_CTX_free(t->cli);
    SSL_CTX_free(t->srv);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static void set_nonblock(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* Drives a handshake step function on a non-blocking fd until done or the deadline. */
static int handshake(SSL *ssl, int fd, bool accept, uint64_t deadline_ns)
{
    for (;;) {
        int r = accept ? SSL_accept(ssl) : SSL_connect(ssl);
        if (r == 1)
            return 0;
        int e = SSL_get_error(ssl, r);
        short ev;
        if (e == SSL_ERROR_WANT_READ)
            ev = POLLIN;
        else if (e == SSL_ERROR_WANT_WRITE)
            ev = POLLOUT;
        else
            return -ECONNREFUSED;
        int rc = pf_tcpnet_wait_fd(fd, ev, deadline_ns);
        if (rc)
            return rc;
    }
}

static void relay_free(struct relay *r)
{
    if (r->ssl)
        SSL_free(r->ssl);
    if (r->net >= 0)
        close(r->net);
    if (r->app >= 0)
        close(r->app);
    free(r->up);
    free(r->down);
    free(r);
}

/* One pass over the four directions; returns 1 on progress, 0 when everything would block
 * (*ev_net / *ev_app: what to poll for), -1 when the connection is over. */
static int relay_step(struct relay *r, short *ev_net, short *ev_app)
{
    int progress = 0;
    *ev_net = 0;
    *ev_app = 0;
    /* app -> peer */
    if (r->up_off == r->up_len) {
        ssize_t n = read(r->app, r->up, TCPNET_TLS_BUF);
        if (n == 0)
            return -1;
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (n > 0) {
            r->up_off = 0;
            r->up_len = (size_t)n;
            progress = 1;
        } else {
            *ev_app |= POLLIN;
        }
    }
    if (r->up_off < r->up_len) {
        pf_hb_release(&tcpnet_tls_wire);
        int n = SSL_write(r->ssl, r->up + r->up_off, (int)(r->up_len - r->up_off));
        if (n > 0) {
            r->up_off += (size_t)n;
            progress = 1;
        } else {
            int e = SSL_get_error(r->ssl, n);
            if (e == SSL_ERROR_WANT_WRITE)
                *ev_net |= POLLOUT;
            else if (e == SSL_ERROR_WANT_READ)
                *ev_net |= POLLIN;
            else
                return -1;
        }
    }
    /* peer -> app */
    if (r->down_off == r->down_len) {
        int n = SSL_read(r->ssl, r->down, TCPNET_TLS_BUF);
        if (n > 0) {
            pf_hb_acquire(&tcpnet_tls_wire);
            r->down_off = 0;
            r->down_len = (size_t)n;
            progress = 1;
        } else {
            int e = SSL_get_error(r->ssl, n);
            if (e == SSL_ERROR_WANT_READ)
                *ev_net |= POLLIN;
            else if (e == SSL_ERROR_WANT_WRITE)
                *ev_net |= POLLOUT;
            else
                return -1; /* close_notify, reset, or a record that does not authenticate */
        }
    }
    if (r->down_off < r->down_len) {
        ssize_t n = send(r->app, r->down + r->down_off, r->down_len - r->down_off,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            r->down_off += (size_t)n;
            progress = 1;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            return -1;
        } else {
            *ev_app |= POLLOUT;
        }
    }
    return progress;
}

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    struct tcpnet_tls *t = r->tls;
    if (r->accept) {
        int rc = handshake(r->ssl, r->net, true, pf_now_ns() + TCPNET_TLS_ACCEPT_MS * PF_NS_PER_MS);
        if (rc) {
            char es[160];
            tls_errstr(es, sizeof(es));
            pf_child_add(pf_metric_child2(t->m_hs, "serve", "refused"), 1);
            pf_log_ratelimited(PF_LOG_WARN, 5000,
                               "TCP fabric TLS: refused a connection from %s (no TLS handshake "
                               "with a certificate of the cluster CA): %s",
                               r->peer, rc == -ETIMEDOUT ? "handshake timed out" : es);
            goto out;
        }
        pf_child_add(pf_metric_child2(t->m_hs, "serve", "ok"), 1);
    }
    for (;;) {
        short evn, eva;
        int p = relay_step(r, &evn, &eva);
        if (p < 0)
            break;
        if (p > 0)
            continue;
        struct pollfd pf[2] = {{.fd = r->net, .events = evn}, {.fd = r->app, .events = eva}};
        int n = poll(pf, 2, 1000);
        if (n < 0 && errno != EINTR)
            break;
        if ((pf[0].revents | pf[1].revents) & POLLNVAL)
            break;
        /* errors and hang-ups surface in the next read/write */
    }
    /* a best-effort close_notify; the peer sees end-of-file either way */
    SSL_shutdown(r->ssl);
out:
    ERR_clear_error();
    relay_free(r);
    pthread_mutex_lock(&t->mu);
    t->relays--;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Socketpair + relay thread over net (which the relay owns from here, also on failure).
 * *app_p: the fabric's end, blocking unless app_nonblock. */
static int start_relay(struct tcpnet_tls *t, SSL *ssl, int net, bool accept, const char *peer,
                       bool app_nonblock, int *app_p)
{
    int sp[2] = {-1, -1};
    struct relay *r = calloc(1, sizeof(*r));
    int rc = 0;
    if (!r) {
        SSL_free(ssl);
        close(net);
        return -ENOMEM;
    }
    r->tls = t;
    r->ssl = ssl;
    r->net = net;
    r->app = -1;
    r->accept = accept;
    snprintf(r->peer, sizeof(r->peer), "%s", peer);
    r->up = malloc(TCPNET_TLS_BUF);
    r->down = malloc(TCPNET_TLS_BUF);
    if (!r->up || !r->down) {
        rc = -ENOMEM;
        goto err_relay;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
        rc = -errno;
        goto err_relay;
    }
    r->app = sp[1];
    set_nonblock(sp[1], true);
    set_nonblock(net, true);
    if (app_nonblock)
        set_nonblock(sp[0], true);
    pthread_mutex_lock(&t->mu);
    t->relays++;
    pthread_mutex_unlock(&t->mu);
    pthread_t th;
    rc = pf_thread_start(&th, "pf-tcpnet-tls", -1, relay_main, r);
    if (rc) {
        pthread_mutex_lock(&t->mu);
        t->relays--;
        pthread_mutex_unlock(&t->mu);
        close(sp[0]);
        goto err_relay;
    }
    pthread_detach(th);
    *app_p = sp[0];
    return 0;
err_relay:
    relay_free(r);
    return rc;
}

int pf_tcpnet_tls_client(struct tcpnet_tls *t, int fd, const char *peer_ip, uint64_t deadline_ns,
                         int *app_p)
{
    SSL *ssl = SSL_new(t->cli);
    if (!ssl) {
        close(fd);
        return -ENOMEM;
    }
    SSL_set_fd(ssl, fd);
    /* the serving node's certificate must name the address we connect to */
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), peer_ip);
    set_nonblock(fd, true);
    int rc = handshake(ssl, fd, false, deadline_ns);
    if (rc) {
        char es[160];
        tls_errstr(es, sizeof(es));
        long v = SSL_get_verify_result(ssl);
        pf_child_add(pf_metric_child2(t->m_hs, "connect", "failed"), 1);
        pf_warn("TCP fabric TLS: handshake with %s failed: %s%s%s", peer_ip,
                rc == -ETIMEDOUT ? "timed out (a plaintext peer?)" : es,
                v != X509_V_OK ? "; certificate: " : "",
                v != X509_V_OK ? X509_verify_cert_error_string(v) : "");
        SSL_free(ssl);
        close(fd);
        return rc == -ETIMEDOUT ? rc : -ECONNREFUSED;
    }
    pf_child_add(pf_metric_child2(t->m_hs, "connect", "ok"), 1);
    return start_relay(t, ssl, fd, false, peer_ip, false, app_p);
}

int pf_tcpnet_tls_server(struct tcpnet_tls *t, int fd, int *app_p)
{
    char peer[INET6_ADDRSTRLEN + 8] = "?";
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sin_family == AF_INET)
        inet_ntop(AF_INET, &sa.sin_addr, peer, sizeof(peer));
    SSL *ssl = SSL_new(t->srv);
    if (!ssl) {
        close(fd);
        return -ENOMEM;
    }
    SSL_set_fd(ssl, fd);
    return start_relay(t, ssl, fd, true, peer, true, app_p);
}

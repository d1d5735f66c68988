/* TCP fabric under TLS (sim/net/tcpnet_tls.c, docs/security.md "Fabric TLS"): the whole NET
 * contract (net_contract.h: byte-exact READs, pipelining, remote errors, invalidation with
 * READs in flight, a remote QP invalidated, concurrent and bidirectional QPs) with TLS on
 * both nodes, then the refusals: a plaintext fabric against a TLS one (both directions), a
 * certificate of another CA, a certificate that does not name the serving address, and
 * unusable PEM configurations. Certificates come from tests/integration/certs.sh (openssl),
 * fresh per run. */
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net_contract.h"
#include "pf/metrics.h"
#include "pftest.h"

static char dir[] = "/tmp/pf-tcptls.XXXXXX";
static char *ca, *crt, *key, *rogue_crt, *rogue_key, *other_crt, *other_key;

static char *slurp(const char *name)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    char *s = pft_read_file(p);
    if (!s)
        fail_msg("cannot read %s", p);
    return s;
}

static int make_pki(void **st)
{
    (void)st;
    if (!mkdtemp(dir))
        return -1;
    const char *top = getenv("PF_TOP") ? getenv("PF_TOP") : ".";
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "bash -c '. \"%s/tests/integration/certs.sh\" && make_certs \"%s\" "
             "node=127.0.0.1,127.0.0.2 other=127.0.0.9' >/dev/null 2>&1",
             top, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "certs.sh failed (openssl missing? PF_TOP=%s)\n", top);
        return -1;
    }
    ca = slurp("ca.crt");
    crt = slurp("node.crt");
    key = slurp("node.key");
    rogue_crt = slurp("rogue.crt");
    rogue_key = slurp("rogue.key");
    other_crt = slurp("other.crt");
    other_key = slurp("other.key");
    return 0;
}

static int drop_pki(void **st)
{
    (void)st;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    (void)!system(cmd);
    free(ca);
    free(crt);
    free(key);
    free(rogue_crt);
    free(rogue_key);
    free(other_crt);
    free(other_key);
    return 0;
}

static int tls_on(void **st)
{
    (void)st;
    nc_tls_cert = crt;
    nc_tls_key = key;
    nc_tls_ca = ca;
    return 0;
}

static struct pf_net *open_with(const char *nic, const char *c, const char *k, const char *a)
{
    nc_tls_cert = c;
    nc_tls_key = k;
    nc_tls_ca = a;
    return nc_open("tcp", (const char *[]){nic});
}

static double hs(const char *side, const char *result)
{
    return pf_metric_value_of("pegaflow_tcpnet_tls_handshakes", (const char *[]){side, result});
}

/* Serving-side refusals are counted by the relay thread: wait for the count (deadline). */
static void wait_refused(double want)
{
    uint64_t dl = pf_now_ns() + 15000 * PF_NS_PER_MS;
    while (hs("serve", "refused") < want) {
        if (pf_now_ns() > dl)
            fail_msg("serving refusals %g, want %g", hs("serve", "refused"), want);
        usleep(5000);
    }
}

/* A serves (a_*), B connects (b_*): B's connect must fail, and A's to B. */
static void expect_refused(struct pf_net *a, struct pf_net *b)
{
    uint8_t ea[PF_NET_EP_MAX], eb[PF_NET_EP_MAX];
    size_t la = 0, lb = 0;
    struct pf_net_qp *qa, *qb;
    assert_int_equal(pf_net_qp_create(a, 0, &qa), 0);
    assert_int_equal(pf_net_qp_create(b, 0, &qb), 0);
    assert_int_equal(pf_net_qp_local_endpoint(qa, ea, sizeof(ea), &la), 0);
    assert_int_equal(pf_net_qp_local_endpoint(qb, eb, sizeof(eb), &lb), 0);
    assert_int_not_equal(pf_net_qp_connect(qb, ea, la), 0);
    assert_int_not_equal(pf_net_qp_connect(qa, eb, lb), 0);
    pf_net_qp_destroy(qb);
    pf_net_qp_destroy(qa);
}

static void test_plaintext_peer_refused(void **st)
{
    (void)st;
    double r0 = hs("serve", "refused"), f0 = hs("connect", "failed");
    struct pf_net *a = open_with("127.0.0.1", crt, key, ca);
    struct pf_net *b = open_with("127.0.0.2", NULL, NULL, NULL);
    expect_refused(a, b);
    wait_refused(r0 + 1);                           /* A refused B's plaintext HELLO */
    assert_true(hs("connect", "failed") >= f0 + 1); /* A's handshake with plaintext B */
    pf_net_close(b);
    pf_net_close(a);
}

static void test_other_ca_refused(void **st)
{
    (void)st;
    double r0 = hs("serve", "refused");
    struct pf_net *a = open_with("127.0.0.1", crt, key, ca);
    struct pf_net *b = open_with("127.0.0.2", rogue_crt, rogue_key, ca);
    expect_refused(a, b);
    wait_refused(r0 + 1);
    pf_net_close(b);
    pf_net_close(a);
}

static void test_wrong_address_refused(void **st)
{
    (void)st;
    /* A's certificate names 127.0.0.9, not the 127.0.0.1 B connects to */
    double f0 = hs("connect", "failed");
    struct pf_net *a = open_with("127.0.0.1", other_crt, other_key, ca);
    struct pf_net *b = open_with("127.0.0.2", crt, key, ca);
    uint8_t ea[PF_NET_EP_MAX];
    size_t la = 0;
    struct pf_net_qp *qa, *qb;
    assert_int_equal(pf_net_qp_create(a, 0, &qa), 0);
    assert_int_equal(pf_net_qp_create(b, 0, &qb), 0);
    assert_int_equal(pf_net_qp_local_endpoint(qa, ea, sizeof(ea), &la), 0);
    assert_int_equal(pf_net_qp_connect(qb, ea, la), -ECONNREFUSED);
    assert_true(hs("connect", "failed") >= f0 + 1);
    pf_net_qp_destroy(qb);
    pf_net_qp_destroy(qa);
    pf_net_close(b);
    pf_net_close(a);
}

static void test_bad_config(void **st)
{
    (void)st;
    struct pf_net_config cfg = {.nics = (const char *[]){"127.0.0.1"}, .nnics = 1};
    struct pf_net *n = NULL;
    char chosen[64], err[256];
    cfg.tls_cert_pem = crt; /* no key */
    assert_int_not_equal(pf_hal_net_open("tcp", &cfg, &n, chosen, sizeof(chosen), err, sizeof(err)),
                         0);
    cfg.tls_key_pem = rogue_key; /* not the certificate's key */
    assert_int_not_equal(pf_hal_net_open("tcp", &cfg, &n, chosen, sizeof(chosen), err, sizeof(err)),
                         0);
    cfg.tls_cert_pem = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
    cfg.tls_key_pem = key;
    assert_int_not_equal(pf_hal_net_open("tcp", &cfg, &n, chosen, sizeof(chosen), err, sizeof(err)),
                         0);
    cfg.tls_cert_pem = crt;
    cfg.tls_ca_pem = "no PEM here";
    assert_int_not_equal(pf_hal_net_open("tcp", &cfg, &n, chosen, sizeof(chosen), err, sizeof(err)),
                         0);
    cfg.tls_ca_pem = ca;
    assert_int_equal(pf_hal_net_open("tcp", &cfg, &n, chosen, sizeof(chosen), err, sizeof(err)), 0);
    pf_net_close(n);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    nc_backend = "tcp";
    nc_seed_init();
    const struct CMUnitTest contract[] = {NC_CONTRACT_TESTS};
    const struct CMUnitTest refusals[] = {
        cmocka_unit_test(test_plaintext_peer_refused),
        cmocka_unit_test(test_other_ca_refused),
        cmocka_unit_test(test_wrong_address_refused),
        cmocka_unit_test(test_bad_config),
    };
    if (make_pki(NULL) != 0) {
        printf("SKIP: cannot make test certificates with tests/integration/certs.sh\n");
        return 77;
    }
    tls_on(NULL);
    int rc = cmocka_run_group_tests_name("tcpnet contract under TLS", contract, NULL, NULL);
    rc |= cmocka_run_group_tests_name("tcpnet TLS refusals", refusals, NULL, NULL);
    drop_pki(NULL);
    return rc;
}

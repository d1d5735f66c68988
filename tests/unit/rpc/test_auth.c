/* Authentication policy (src/rpc/auth.c): token and PEM files (good and every refusal),
 * constant-time comparison, peer strings and locality (loopback, Unix socket, this host's
 * interface addresses, a TEST-NET address that is nobody's), the method-class matrix, and a
 * real server with a cluster token, access rules, locality and a Unix-socket listener, called
 * with no token, the right token and a wrong one. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.pb-c.h"
#include "pf/auth.h"
#include "pf/rpc.h"

static char dir[] = "/tmp/pf-auth-test.XXXXXX";

static const char *write_file(const char *name, const char *text)
{
    static char path[8][256];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(p, 0600);
    return p;
}

static void test_token_file(void **st)
{
    char err[300], *tok = NULL;
    assert_int_equal(
        pf_auth_read_token(write_file("t1", "s3cret\n"), "--x", &tok, err, sizeof(err)), 0);
    assert_string_equal(tok, "s3cret");
    free(tok);
    assert_int_equal(
        pf_auth_read_token(write_file("t2", "abc \r\n\n"), "--x", &tok, err, sizeof(err)), 0);
    assert_string_equal(tok, "abc");
    free(tok);
    assert_int_equal(pf_auth_read_token(write_file("t3", "\n"), "--x", &tok, err, sizeof(err)),
                     -EINVAL);
    assert_non_null(strstr(err, "is empty"));
    assert_int_equal(pf_auth_read_token(write_file("t4", "a b\n"), "--x", &tok, err, sizeof(err)),
                     -EINVAL);
    assert_non_null(strstr(err, "printable ASCII"));
    assert_int_equal(
        pf_auth_read_token(write_file("t5", "one\ntwo\n"), "--x", &tok, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "more than one line"));
    assert_int_equal(
        pf_auth_read_token("/nonexistent/token", "--cluster-token-file", &tok, err, sizeof(err)),
        -ENOENT);
    assert_non_null(strstr(err, "--cluster-token-file: cannot open /nonexistent/token"));
    char *big = malloc(PF_AUTH_TOKEN_MAX + 10);
    memset(big, 'a', PF_AUTH_TOKEN_MAX + 1);
    big[PF_AUTH_TOKEN_MAX + 1] = '\0';
    assert_int_equal(pf_auth_read_token(write_file("t6", big), "--x", &tok, err, sizeof(err)),
                     -EINVAL);
    free(big);
}

static void test_load(void **st)
{
    struct pf_auth a;
    char err[300];
    const char *pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const char *key = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";
    const char *crt = write_file("c.pem", pem), *k = write_file("k.pem", key);
    struct pf_auth_config c = {.tls_cert = crt};
    assert_int_equal(pf_auth_load(&c, &a, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--tls-cert and --tls-key together"));
    c = (struct pf_auth_config){.tls_key = k};
    assert_int_equal(pf_auth_load(&c, &a, err, sizeof(err)), -EINVAL);
    c = (struct pf_auth_config){.tls_ca = crt};
    assert_int_equal(pf_auth_load(&c, &a, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--tls-ca"));
    c = (struct pf_auth_config){.tls_cert = k, .tls_key = k};
    assert_int_equal(pf_auth_load(&c, &a, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "holds no CERTIFICATE"));
    c = (struct pf_auth_config){.tls_cert = crt, .tls_key = crt};
    assert_int_equal(pf_auth_load(&c, &a, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "PRIVATE KEY"));
    c = (struct pf_auth_config){.tls_cert = crt, .tls_key = write_file("junk", "hello\n")};
    assert_int_equal(pf_auth_load(&c, &a, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "is not a PEM file"));
    c = (struct pf_auth_config){.tls_cert = crt,
                                .tls_key = k,
                                .tls_ca = crt,
                                .cluster_token_file = write_file("ct", "tok1\n"),
                                .admin_token_file = write_file("at", "tok2\n")};
    assert_int_equal(pf_auth_load(&c, &a, err, sizeof(err)), 0);
    assert_string_equal(a.cluster_token, "tok1");
    assert_string_equal(a.admin_token, "tok2");
    assert_non_null(a.ca_pem);
    struct pf_rpc_channel_opts o;
    pf_auth_channel_opts(&a, &o);
    assert_true(o.tls);
    assert_ptr_equal(o.cert_pem, a.cert_pem); /* mutual TLS: our certificate as client */
    assert_string_equal(o.token, "tok1");
    pf_auth_free(&a);
    assert_null(a.cluster_token);
    pf_auth_free(NULL);
}

static void test_token_eq(void **st)
{
    assert_true(pf_auth_token_eq("abc", "abc", 3));
    assert_false(pf_auth_token_eq("abc", "abd", 3));
    assert_false(pf_auth_token_eq("abc", "ab", 2));
    assert_false(pf_auth_token_eq("abc", "abcd", 4));
    assert_false(pf_auth_token_eq("abc", "", 0));
    assert_false(pf_auth_token_eq("abc", "abc\0", 4)); /* NUL bytes count */
}

static void test_peers(void **st)
{
    char h[64];
    assert_int_equal(pf_auth_peer_ip("ipv4:10.1.2.3:5000", h, sizeof(h)), 0);
    assert_string_equal(h, "10.1.2.3");
    assert_int_equal(pf_auth_peer_ip("ipv6:[fe80::1%eth0]:5000", h, sizeof(h)), 0);
    assert_string_equal(h, "fe80::1");
    assert_int_equal(pf_auth_peer_ip("unix:/tmp/x", h, sizeof(h)), -EINVAL);
    assert_int_equal(pf_auth_peer_ip("ipv6:[::1", h, sizeof(h)), -EINVAL);
    assert_true(pf_auth_peer_is_local("ipv4:127.0.0.1:1"));
    assert_true(pf_auth_peer_is_local("ipv4:127.9.9.9:1"));
    assert_true(pf_auth_peer_is_local("ipv6:[::1]:1"));
    assert_true(pf_auth_peer_is_local("ipv6:[::ffff:127.0.0.1]:1"));
    assert_true(pf_auth_peer_is_local("unix:/run/pegaflow.sock"));
    assert_true(pf_auth_peer_is_local("unix:"));
    assert_false(pf_auth_peer_is_local("ipv4:192.0.2.77:1")); /* TEST-NET-1: nobody's */
    assert_false(pf_auth_peer_is_local("ipv4:192.0.2.77:1")); /* cached list, same answer */
    assert_false(pf_auth_peer_is_local("garbage"));
    assert_false(pf_auth_peer_is_local(NULL));
    /* an address of one of this host's interfaces is local */
    struct ifaddrs *ifa = NULL, *i;
    assert_int_equal(getifaddrs(&ifa), 0);
    int checked = 0;
    for (i = ifa; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        char ip[INET_ADDRSTRLEN], peer[64];
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof(ip));
        snprintf(peer, sizeof(peer), "ipv4:%s:4242", ip);
        assert_true(pf_auth_peer_is_local(peer));
        checked++;
    }
    freeifaddrs(ifa);
    assert_true(checked > 0);

    char ids[3][PF_AUTH_IP_MAX] = {"10.0.0.1", "::ffff:10.0.0.2", "127.0.0.1"};
    const char(*c)[PF_AUTH_IP_MAX] = (const char(*)[PF_AUTH_IP_MAX])ids;
    assert_true(pf_auth_ip_in("10.0.0.1", c, 3));
    assert_true(pf_auth_ip_in("10.0.0.2", c, 3));  /* v4-mapped equals v4 */
    assert_true(pf_auth_ip_in("127.0.0.3", c, 3)); /* loopback is one host */
    assert_false(pf_auth_ip_in("10.0.0.3", c, 3));
    assert_false(pf_auth_ip_in("10.0.0.1", c, 0));
    assert_false(pf_auth_ip_in("not-an-ip", c, 3));
}

static const struct pf_rpc_access_rule rules[] = {
    {"/t/Open", PF_RPC_ACCESS_OPEN},
    {"/t/Local", PF_RPC_ACCESS_LOCAL},
    {"/t/Peer", PF_RPC_ACCESS_PEER},
};

static void test_policy(void **st)
{
    struct pf_auth a = {.cluster_token = (char *)"tok"};
    char m[300];
    const char *remote = "ipv4:192.0.2.77:1", *local = "ipv4:127.0.0.1:1";
    /* no credentials configured, no locality: everything open (today's behaviour) */
    assert_int_equal(pf_auth_check(NULL, rules, 3, false, "/t/Local", remote, NULL, 0, m, 300), 0);
    assert_int_equal(pf_auth_check(NULL, rules, 3, false, "/t/Peer", remote, NULL, 0, m, 300), 0);
    /* locality without a token: remote callers of LOCAL methods are refused */
    assert_int_equal(pf_auth_check(NULL, rules, 3, true, "/t/Local", remote, NULL, 0, m, 300),
                     PF_GRPC_PERMISSION_DENIED);
    assert_non_null(strstr(m, "only served to callers on this host"));
    assert_int_equal(pf_auth_check(NULL, rules, 3, true, "/t/Local", local, NULL, 0, m, 300), 0);
    /* with a cluster token */
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Open", remote, NULL, 0, m, 300), 0);
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Peer", remote, NULL, 0, m, 300),
                     PF_GRPC_UNAUTHENTICATED);
    assert_non_null(strstr(m, "needs the cluster token"));
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Peer", local, NULL, 0, m, 300),
                     PF_GRPC_UNAUTHENTICATED); /* peers are peers, wherever they are */
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Peer", remote, "tok", 3, m, 300), 0);
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Peer", remote, "tok2", 4, m, 300),
                     PF_GRPC_UNAUTHENTICATED);
    assert_non_null(strstr(m, "wrong cluster token"));
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Local", remote, NULL, 0, m, 300),
                     PF_GRPC_PERMISSION_DENIED);
    assert_non_null(strstr(m, "or with the cluster token"));
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Local", remote, "tok", 3, m, 300), 0);
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Local", local, NULL, 0, m, 300), 0);
    /* a wrong token is refused even where none is needed */
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Open", local, "x", 1, m, 300),
                     PF_GRPC_UNAUTHENTICATED);
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Local", local, "x", 1, m, 300),
                     PF_GRPC_UNAUTHENTICATED);
    /* a method no rule names is PEER */
    assert_int_equal(pf_auth_check(&a, rules, 3, true, "/t/Other", local, NULL, 0, m, 300),
                     PF_GRPC_UNAUTHENTICATED);
    assert_int_equal(pf_auth_check(&a, NULL, 0, true, "/t/Local", local, NULL, 0, m, 300),
                     PF_GRPC_UNAUTHENTICATED);
    /* the Engine table: worker RPCs LOCAL, P2P PEER, Health OPEN */
    assert_int_equal(pf_auth_check(&a, pf_engine_access, pf_engine_naccess, true,
                                   "/pegaflow.Engine/Shutdown", remote, NULL, 0, m, 300),
                     PF_GRPC_PERMISSION_DENIED);
    assert_int_equal(pf_auth_check(&a, pf_engine_access, pf_engine_naccess, true,
                                   "/pegaflow.Engine/Session", remote, NULL, 0, m, 300),
                     PF_GRPC_PERMISSION_DENIED);
    assert_int_equal(pf_auth_check(&a, pf_engine_access, pf_engine_naccess, true,
                                   "/pegaflow.Engine/RdmaHandshake", local, NULL, 0, m, 300),
                     PF_GRPC_UNAUTHENTICATED);
    assert_int_equal(pf_auth_check(&a, pf_engine_access, pf_engine_naccess, true,
                                   "/pegaflow.Engine/Health", remote, NULL, 0, m, 300),
                     0);
}

/* ---- a real server */

static int h_echo(void *ctx, struct pf_rpc_call *call, const ProtobufCMessage *m)
{
    Pegaflow__UnregisterResponse resp = PEGAFLOW__UNREGISTER_RESPONSE__INIT;
    Pegaflow__ResponseStatus s = PEGAFLOW__RESPONSE_STATUS__INIT;
    s.ok = 1;
    s.message = (char *)pf_rpc_call_peer(call);
    resp.status = &s;
    return pf_rpc_respond(call, &resp.base);
}

static int call(const char *target, const char *path, const char *token)
{
    struct pf_rpc_channel_opts o = {.token = token};
    struct pf_rpc_channel *ch;
    assert_int_equal(pf_rpc_channel_open_opts(target, &o, &ch), 0);
    Pegaflow__UnregisterRequest req = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    req.instance_id = (char *)"x";
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status s;
    pf_rpc_unary(ch, path, &req.base, &pegaflow__unregister_response__descriptor, 5000, &resp, &s);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    pf_rpc_channel_close(ch);
    return s.code;
}

static void test_server(void **st)
{
    static const struct pf_rpc_method methods[] = {
        {.path = "/t/Open",
         .metric_name = "open",
         .req_desc = &pegaflow__unregister_request__descriptor,
         .unary = h_echo},
        {.path = "/t/Local",
         .metric_name = "local",
         .req_desc = &pegaflow__unregister_request__descriptor,
         .unary = h_echo},
        {.path = "/t/Peer",
         .metric_name = "peer",
         .req_desc = &pegaflow__unregister_request__descriptor,
         .unary = h_echo},
    };
    struct pf_auth a = {.cluster_token = (char *)"tok"};
    char sock[300], unix_target[310], err[300];
    snprintf(sock, sizeof(sock), "%s/rpc.sock", dir);
    snprintf(unix_target, sizeof(unix_target), "unix:%s", sock);
    struct pf_rpc_server_config c = {.addr = "127.0.0.1:0",
                                     .threads = 2,
                                     .methods = methods,
                                     .nmethods = 3,
                                     .metric_prefix = "pfauthtest",
                                     .auth = &a,
                                     .rules = rules,
                                     .nrules = 3,
                                     .local_only = true,
                                     .local_addr = unix_target};
    struct pf_rpc_server *s;
    int port;
    assert_int_equal(pf_rpc_server_start(&c, &s, &port, err, sizeof(err)), 0);
    char tcp[64];
    snprintf(tcp, sizeof(tcp), "127.0.0.1:%d", port);
    assert_int_equal(call(tcp, "/t/Open", NULL), PF_GRPC_OK);
    assert_int_equal(call(tcp, "/t/Local", NULL), PF_GRPC_OK); /* loopback is local */
    assert_int_equal(call(tcp, "/t/Peer", NULL), PF_GRPC_UNAUTHENTICATED);
    assert_int_equal(call(tcp, "/t/Peer", "tok"), PF_GRPC_OK);
    assert_int_equal(call(tcp, "/t/Peer", "nope"), PF_GRPC_UNAUTHENTICATED);
    assert_int_equal(call(tcp, "/t/Local", "nope"), PF_GRPC_UNAUTHENTICATED);
    /* the Unix socket listener serves the same methods, plaintext */
    assert_int_equal(call(unix_target, "/t/Local", NULL), PF_GRPC_OK);
    assert_int_equal(call(unix_target, "/t/Peer", NULL), PF_GRPC_UNAUTHENTICATED);
    assert_int_equal(call(unix_target, "/t/Peer", "tok"), PF_GRPC_OK);
    pf_rpc_server_stop(s);

    /* a local listener that is not unix:PATH is refused */
    c.local_addr = "127.0.0.1:0";
    assert_int_equal(pf_rpc_server_start(&c, &s, &port, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "is not unix:PATH"));
    /* a Unix socket in a directory that does not exist: refused with a reason, nothing
     * left listening (the TCP port is free again) */
    c.local_addr = "unix:/nonexistent-dir/x.sock";
    assert_int_equal(pf_rpc_server_start(&c, &s, &port, err, sizeof(err)), -EADDRNOTAVAIL);
    assert_non_null(strstr(err, "cannot listen on unix:/nonexistent-dir/x.sock"));
    /* a certificate gRPC cannot use fails the start with a reason */
    struct pf_auth bad = {.cert_pem = (char *)"-----BEGIN CERTIFICATE-----\nAAAA\n-----END "
                                              "CERTIFICATE-----\n",
                          .key_pem = (char *)"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END "
                                             "PRIVATE KEY-----\n"};
    c.local_addr = NULL;
    c.auth = &bad;
    assert_int_not_equal(pf_rpc_server_start(&c, &s, &port, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "TLS certificate/key is invalid"));
    /* channel options: a certificate without its key is refused */
    struct pf_rpc_channel_opts o = {.tls = true, .cert_pem = "x"};
    struct pf_rpc_channel *ch;
    assert_int_equal(pf_rpc_channel_open_opts(tcp, &o, &ch), -EINVAL);
}

static void test_env(void **st)
{
    struct pf_auth_env e;
    struct pf_rpc_channel_opts o;
    char err[300];
    unsetenv("PEGAFLOW_TLS_CA");
    unsetenv("PEGAFLOW_TLS_CERT");
    unsetenv("PEGAFLOW_TLS_KEY");
    unsetenv("PEGAFLOW_TOKEN_FILE");
    assert_int_equal(pf_auth_env_load(&e, &o, err, sizeof(err)), 0);
    assert_false(o.tls);
    assert_null(o.token);
    setenv("PEGAFLOW_TOKEN_FILE", write_file("envtok", "zz\n"), 1);
    setenv("PEGAFLOW_TLS_CA",
           write_file("envca", "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n"), 1);
    assert_int_equal(pf_auth_env_load(&e, &o, err, sizeof(err)), 0);
    assert_true(o.tls);
    assert_string_equal(o.token, "zz");
    pf_auth_env_free(&e);
    setenv("PEGAFLOW_TLS_CERT", "/nonexistent.crt", 1);
    assert_int_equal(pf_auth_env_load(&e, &o, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "PEGAFLOW_TLS_CERT and PEGAFLOW_TLS_KEY"));
    setenv("PEGAFLOW_TLS_KEY", "/nonexistent.key", 1);
    assert_int_equal(pf_auth_env_load(&e, &o, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "PEGAFLOW_TLS_CERT: cannot open"));
    unsetenv("PEGAFLOW_TLS_CA");
    unsetenv("PEGAFLOW_TLS_CERT");
    unsetenv("PEGAFLOW_TLS_KEY");
    unsetenv("PEGAFLOW_TOKEN_FILE");
}

int main(void)
{
    assert_non_null(mkdtemp(dir));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_file), cmocka_unit_test(test_load),
        cmocka_unit_test(test_token_eq),   cmocka_unit_test(test_peers),
        cmocka_unit_test(test_policy),     cmocka_unit_test(test_server),
        cmocka_unit_test(test_env),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return rc;
}

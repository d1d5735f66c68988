/* p2p_e2e's auth scenario (see p2p_e2e.c): calls made with chosen credentials and the checks
 * of every refusal. Header-only, included once by p2p_e2e.c after p2p_cluster.h. */
#ifndef PF_TEST_P2P_AUTH_H
#define PF_TEST_P2P_AUTH_H

/* ------------------------------------------------------------------ auth */

static char *sec_file(const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", sec_dir, name);
    char *t = pft_read_file(path);
    PFT_CHECK(t, "cannot read %s", path);
    return t;
}

/* Credentials of one attempt: which certificate (NULL: none), which token (NULL: none). */
struct cred {
    const char *what;
    bool tls;
    const char *cert; /* "t" (ours), "rogue" (another CA) or NULL */
    const char *token;
};

/* One unary call to target with cred; returns the gRPC code (message in msg). */
static int call_as(const char *target, const struct cred *c, const char *path,
                   const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd, char *msg,
                   size_t msglen)
{
    struct pf_rpc_channel_opts o = {.tls = c->tls, .token = c->token};
    char *ca = NULL, *crt = NULL, *key = NULL;
    if (c->tls)
        o.ca_pem = ca = sec_file("ca.crt");
    if (c->cert) {
        char f[64];
        snprintf(f, sizeof(f), "%s.crt", c->cert);
        o.cert_pem = crt = sec_file(f);
        snprintf(f, sizeof(f), "%s.key", c->cert);
        o.key_pem = key = sec_file(f);
    }
    struct pf_rpc_channel *ch;
    PFT_CHECK(pf_rpc_channel_open_opts(target, &o, &ch) == 0, "channel %s", target);
    ProtobufCMessage *resp = NULL;
    struct pf_rpc_status st = {0};
    pf_rpc_unary(ch, path, req, rd, 5000, &resp, &st);
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    pf_rpc_channel_close(ch);
    snprintf(msg, msglen, "%s", st.msg);
    free(ca);
    free(crt);
    free(key);
    return st.code;
}

static void expect_code(const char *target, const struct cred *c, const char *path,
                        const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd, int want,
                        const char *want_msg)
{
    char msg[PF_RPC_ERRMSG];
    int code = call_as(target, c, path, req, rd, msg, sizeof(msg));
    PFT_CHECK(code == want, "%s %s as '%s': %s (%s), want %s", target, path, c->what,
              pf_grpc_code_name(code), msg, pf_grpc_code_name(want));
    PFT_CHECK(!want_msg || strstr(msg, want_msg), "%s %s as '%s': message '%s' lacks '%s'", target,
              path, c->what, msg, want_msg);
    fprintf(stderr, "    %-44s %-26s -> %s\n", path + 10, c->what, pf_grpc_code_name(code));
}

/* HTTP status of curl -X method on n's path with an optional bearer token. */
static int http_as(struct node *n, const char *method, const char *path, const char *bearer)
{
    char cmd[1024], out[16] = "";
    snprintf(cmd, sizeof(cmd),
             "curl -s -o /dev/null -w '%%{http_code}' -X %s %s%s%s 'http://%s:%d%s'", method,
             bearer ? "-H 'Authorization: Bearer " : "", bearer ? bearer : "", bearer ? "'" : "",
             n->p.http_host, n->p.http_port, path);
    FILE *f = popen(cmd, "r");
    PFT_CHECK(f, "popen curl");
    if (!fgets(out, sizeof(out), f))
        out[0] = '\0';
    pclose(f);
    return atoi(out);
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = '\0';
}

static void sc_auth(void)
{
    PFT_CHECK(sec_dir, "the auth scenario needs PF_P2P_SECURITY_DIR (run test_auth.sh)");
    bool netns = NA.ns[0] != '\0';
    char *tok = sec_file("token"), *wrong = sec_file("wrong-token"),
         *admin = sec_file("admin-token");
    trim(tok);
    trim(wrong);
    trim(admin);

    /* TLS and tokens end to end: A saves, B discovers it at the MetaServer and fetches */
    sync_pair_start();
    PFT_CHECK(pft_log_contains(&MS.p, "mutual TLS") && pft_log_contains(&NA.p, "mutual TLS"),
              "listeners without mutual TLS");
    PFT_CHECK(!pft_log_contains(&NA.p, "without authentication") &&
                  !pft_log_contains(&MS.p, "without authentication"),
              "a secured listener warned that it is open");
    struct pf_client *ca = connect_to(&NA), *cb = connect_to(&NB);
    struct world wa, wb;
    const size_t N = 8;
    pworld(&wa, "inst-A", 1, 2, 32, SEG, 1, true);
    pworld(&wb, "inst-B", 1, 2, 32, SEG, 2, true);
    world_register(ca, &wa);
    world_register(cb, &wb);
    world_save_ok(ca, &wa, 0, 0, N);
    wait_meta(NA.p.addr, 0, N, (long)N, 20000);
    fetch_check(cb, &wb, "req-auth", 0, N, 0, &wa, 0, 0, (long)N, 30000);
    PFT_CHECK(node_metric(&NB, "pegaflow_rdma_fetch_total{status=\"ok\"}") == 1, "no P2P fetch");

    /* the MetaServer and a node's peer RPCs: every wrong credential is refused */
    const struct cred good = {"mTLS + token", true, "t", tok},
                      notok = {"mTLS, no token", true, "t", NULL},
                      badtok = {"mTLS, wrong token", true, "t", wrong},
                      rogue = {"cert of another CA + token", true, "rogue", tok},
                      nocert = {"TLS without cert + token", true, NULL, tok},
                      plain = {"plaintext + token", false, NULL, tok};
    uint8_t h[HLEN];
    hash_of(0, h);
    ProtobufCBinaryData hb = {HLEN, h};
    Pegaflow__QueryPrefixBlocksRequest qp = PEGAFLOW__QUERY_PREFIX_BLOCKS_REQUEST__INIT;
    qp.namespace_ = (char *)NSTR;
    qp.n_block_hashes = 1;
    qp.block_hashes = &hb;
    Pegaflow__ReleaseTransferLockRequest rl = PEGAFLOW__RELEASE_TRANSFER_LOCK_REQUEST__INIT;
    rl.transfer_session_id = (char *)"00000000-0000-4000-8000-000000000000";
    struct {
        const char *target, *path;
        const ProtobufCMessage *req;
        const ProtobufCMessageDescriptor *rd;
    } peer_rpcs[] = {
        {MS.p.addr, "/pegaflow.MetaServer/QueryPrefixBlocks", &qp.base,
         &pegaflow__query_prefix_blocks_response__descriptor},
        {NA.p.addr, "/pegaflow.Engine/ReleaseTransferLock", &rl.base,
         &pegaflow__release_transfer_lock_response__descriptor},
    };
    for (size_t i = 0; i < PF_ARRAY_SIZE(peer_rpcs); i++) {
        const char *t = peer_rpcs[i].target, *pa = peer_rpcs[i].path;
        expect_code(t, &good, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_OK, NULL);
        expect_code(t, &notok, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAUTHENTICATED,
                    "needs the cluster token");
        expect_code(t, &badtok, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAUTHENTICATED,
                    "wrong cluster token");
        expect_code(t, &rogue, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAVAILABLE, NULL);
        expect_code(t, &nocert, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAVAILABLE, NULL);
        expect_code(t, &plain, pa, peer_rpcs[i].req, peer_rpcs[i].rd, PF_GRPC_UNAVAILABLE, NULL);
    }

    /* worker RPCs: from another host only with the token; over the Unix socket without */
    Pegaflow__UnregisterRequest ur = PEGAFLOW__UNREGISTER_REQUEST__INIT;
    ur.instance_id = (char *)"nobody";
    Pegaflow__ShutdownRequest sd = PEGAFLOW__SHUTDOWN_REQUEST__INIT;
    const char *unreg = "/pegaflow.Engine/UnregisterContext";
    char msg[PF_RPC_ERRMSG];
    int code = call_as(NA.p.addr, &good, unreg, &ur.base,
                       &pegaflow__unregister_response__descriptor, msg, sizeof(msg));
    PFT_CHECK(code != PF_GRPC_PERMISSION_DENIED && code != PF_GRPC_UNAUTHENTICATED &&
                  code != PF_GRPC_UNAVAILABLE,
              "UnregisterContext with the token: %s (%s)", pf_grpc_code_name(code), msg);
    if (netns) {
        expect_code(NA.p.addr, &notok, unreg, &ur.base, &pegaflow__unregister_response__descriptor,
                    PF_GRPC_PERMISSION_DENIED, "only served to callers on this host");
        expect_code(NA.p.addr, &notok, "/pegaflow.Engine/Shutdown", &sd.base,
                    &pegaflow__shutdown_response__descriptor, PF_GRPC_PERMISSION_DENIED, NULL);
        PFT_CHECK(kill(NA.p.pid, 0) == 0 && !pft_log_contains(&NA.p, "Shutdown requested"),
                  "A obeyed a refused Shutdown");
    }
    if (netns) {
        /* Session (a parked stream) from another host without the token: refused, and the
         * refusal is a status, not an accepted stream */
        struct pf_rpc_channel_opts so = {.tls = true};
        char *sca = sec_file("ca.crt"), *scrt = sec_file("t.crt"), *skey = sec_file("t.key");
        so.ca_pem = sca;
        so.cert_pem = scrt;
        so.key_pem = skey;
        struct pf_rpc_channel *sch;
        PFT_CHECK(pf_rpc_channel_open_opts(NA.p.addr, &so, &sch) == 0, "channel");
        Pegaflow__SessionRequest sr = PEGAFLOW__SESSION_REQUEST__INIT;
        sr.instance_id = (char *)"inst-A";
        struct pf_rpc_stream *ss = NULL;
        struct pf_rpc_status sst = {0};
        int src = pf_rpc_stream_open(sch, "/pegaflow.Engine/Session", &sr.base, 5000, &ss, &sst);
        PFT_CHECK(src != 0 && sst.code == PF_GRPC_PERMISSION_DENIED,
                  "Session from another host without the token: rc %d %s (%s)", src,
                  pf_grpc_code_name(sst.code), sst.msg);
        pf_rpc_channel_close(sch);
        free(sca);
        free(scrt);
        free(skey);
        fprintf(stderr, "    %-44s %-26s -> %s\n", "Engine/Session", "mTLS, no token",
                pf_grpc_code_name(sst.code));
    }
    const struct cred unix_none = {"unix socket, nothing", false, NULL, NULL};
    code = call_as(NA.sock, &unix_none, unreg, &ur.base, &pegaflow__unregister_response__descriptor,
                   msg, sizeof(msg));
    PFT_CHECK(code != PF_GRPC_PERMISSION_DENIED && code != PF_GRPC_UNAUTHENTICATED &&
                  code != PF_GRPC_UNAVAILABLE,
              "UnregisterContext over %s: %s (%s)", NA.sock, pf_grpc_code_name(code), msg);
    fprintf(stderr, "    UnregisterContext over the Unix socket, no credentials -> %s\n",
            pf_grpc_code_name(code));

    /* RdmaHandshake: requester_id must be the caller's proven address, endpoints too */
    if (netns) {
        uint8_t ep[TCPNET_EP_LEN];
        struct tcpnet_ep e = {.port = 9, .token = 1};
        inet_pton(AF_INET, MS.ip, e.ip); /* another host than the caller */
        tcpnet_ep_encode(ep, &e);
        ProtobufCBinaryData eps[2] = {{sizeof(ep), ep}, {sizeof(ep), ep}};
        Pegaflow__HandshakeMemRegion reg = PEGAFLOW__HANDSHAKE_MEM_REGION__INIT, *regp = &reg;
        reg.addr = 4096;
        reg.length = 4096;
        Pegaflow__HandshakeNic nic = PEGAFLOW__HANDSHAKE_NIC__INIT, *nicp = &nic;
        nic.n_endpoints = 2;
        nic.endpoints = eps;
        nic.n_regions = 1;
        nic.regions = &regp;
        Pegaflow__HandshakeMetadata md = PEGAFLOW__HANDSHAKE_METADATA__INIT;
        md.backend = (char *)"tcp";
        md.n_nics = 1;
        md.nics = &nicp;
        md.qps_per_nic = 2;
        uint8_t blob[512];
        size_t blen = pegaflow__handshake_metadata__pack(&md, blob);
        Pegaflow__RdmaHandshakeRequest hs = PEGAFLOW__RDMA_HANDSHAKE_REQUEST__INIT;
        hs.handshake_metadata = (ProtobufCBinaryData){blen, blob};
        hs.requester_id = NB.p.addr; /* spoofed: we are not B */
        expect_code(NA.p.addr, &good, "/pegaflow.Engine/RdmaHandshake", &hs.base,
                    &pegaflow__rdma_handshake_response__descriptor, PF_GRPC_PERMISSION_DENIED,
                    "not an address the caller proved");
        char self[64];
        snprintf(self, sizeof(self), "%s:9", getenv("PF_P2P_IP_T") ? getenv("PF_P2P_IP_T") : "");
        hs.requester_id = self;
        expect_code(NA.p.addr, &good, "/pegaflow.Engine/RdmaHandshake", &hs.base,
                    &pegaflow__rdma_handshake_response__descriptor, PF_GRPC_PERMISSION_DENIED,
                    MS.ip);
        /* proven by the certificate only (test_auth.sh puts 10.77.0.200 in t's
         * subjectAltName; no host has it): authorised, so A tries the endpoint, which names
         * the client's own address where nothing listens on port 9 */
        inet_pton(AF_INET, getenv("PF_P2P_IP_T"), e.ip);
        tcpnet_ep_encode(ep, &e);
        hs.handshake_metadata.len = pegaflow__handshake_metadata__pack(&md, blob);
        hs.requester_id = (char *)"10.77.0.200:9";
        expect_code(NA.p.addr, &good, "/pegaflow.Engine/RdmaHandshake", &hs.base,
                    &pegaflow__rdma_handshake_response__descriptor, PF_GRPC_UNAVAILABLE,
                    "cannot connect QP");
    }

    /* HTTP: POST needs the admin token; GET /health and /metrics stay open */
    PFT_CHECK(http_as(&NA, "POST", "/cache/memory/cleanup", NULL) == 401, "POST without token");
    PFT_CHECK(http_as(&NA, "POST", "/cache/memory/cleanup", wrong) == 401, "POST wrong token");
    PFT_CHECK(http_as(&NA, "POST", "/instances/cleanup?id=nobody", tok) == 401,
              "POST with the cluster token instead of the admin token");
    PFT_CHECK(http_as(&NA, "POST", "/cache/memory/cleanup", admin) == 200, "POST admin token");
    PFT_CHECK(http_as(&NA, "GET", "/health", NULL) == 200, "GET /health");
    PFT_CHECK(http_as(&NA, "GET", "/metrics", NULL) == 200, "GET /metrics");
    fprintf(stderr, "    HTTP: POST 401 without/with a wrong token, 200 with it; GET open\n");

    /* a node with the wrong cluster token gets no MetaServer session */
    char wpath[600];
    snprintf(wpath, sizeof(wpath), "%s/wrong-token", sec_dir);
    token_override = wpath;
    char meta[128];
    snprintf(meta, sizeof(meta), "http://%s", MS.p.addr);
    const char *cargs[] = {"--gpu-backend",
                           "sim",
                           "--sim-gpus",
                           "1",
                           "--nics",
                           NC.nic,
                           "--net-backend",
                           "tcp",
                           "--pool-size",
                           "16mb",
                           "--metaserver-addr",
                           meta,
                           NULL};
    spawn(&NC, "pegaflow-server", 0, cargs);
    token_override = NULL;
    wait_log(&NC, "heartbeat failed: UNAUTHENTICATED", 20000);
    PFT_CHECK(!pft_log_contains(&NC.p, "MetaServer session established"),
              "C got a session with the wrong token");
    fprintf(stderr, "    node with the wrong cluster token: heartbeat UNAUTHENTICATED\n");

    pf_client_close(ca);
    pf_client_close(cb);
    stop_all();
    world_free(&wa);
    world_free(&wb);
    free(tok);
    free(wrong);
    free(admin);
}

/* redis-server in the MetaServer's namespace on its IP (port 7379 in a fresh namespace, a
 * free port on loopback), started or restarted on the same port; waits for PING. */

#endif

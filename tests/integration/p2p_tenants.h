/* The "tenants" scenario of p2p_e2e (docs/security.md "Tenants"): nodes A and B with the
 * same --tenants-file; on A, tenants T1 and T2 save different bytes under equal block hashes
 * in their own namespaces; on B each tenant's query is fetched from A over the fabric and
 * loads its own tenant's bytes, byte-exact; hashes only T1 saved stay a miss for T2 (the
 * MetaServer and the peer are asked per namespace). Header-only, included by p2p_e2e.c after
 * p2p_cluster.h. */
#ifndef PF_TEST_P2P_TENANTS_H
#define PF_TEST_P2P_TENANTS_H

#define P2P_TOK1 "p2p-tenant-one-0123456789"
#define P2P_TOK2 "p2p-tenant-two-9876543210"

static char tdir[300];

static void tenant_file(const char *name, const char *text)
{
    char p[400];
    snprintf(p, sizeof(p), "%s/%s", tdir, name);
    FILE *f = fopen(p, "w");
    PFT_CHECK(f != NULL, "cannot write %s", p);
    fputs(text, f);
    fclose(f);
    chmod(p, 0600);
}

static struct pf_client *connect_tenant(struct node *n, const char *tokfile)
{
    char p[400];
    snprintf(p, sizeof(p), "%s/%s", tdir, tokfile);
    setenv("PEGAFLOW_TENANT_TOKEN_FILE", p, 1);
    struct pf_client *c = connect_to(n);
    unsetenv("PEGAFLOW_TENANT_TOKEN_FILE");
    return c;
}

static void sc_tenants(void)
{
    const char *base = getenv("PF_TEST_LOGDIR") ? getenv("PF_TEST_LOGDIR") : "/tmp";
    snprintf(tdir, sizeof(tdir), "%s/p2p-tenants.XXXXXX", base);
    PFT_CHECK(mkdtemp(tdir) != NULL, "mkdtemp");
    chmod(tdir, 0755); /* the nodes may run as another user in their namespaces: root here */
    tenant_file("t1.tok", P2P_TOK1 "\n");
    tenant_file("t2.tok", P2P_TOK2 "\n");
    tenant_file("tenants", "tenant=T1 token=" P2P_TOK1 " namespaces=ns-t1\n"
                           "tenant=T2 token=" P2P_TOK2 " namespaces=ns-t2\n");
    char tf[400];
    snprintf(tf, sizeof(tf), "%s/tenants", tdir);
    const char *extra[] = {"--tenants-file", tf, NULL};
    start_ms(0, "30");
    start_node(&NA, extra);
    start_node(&NB, extra);
    struct pf_client *a1 = connect_tenant(&NA, "t1.tok"), *a2 = connect_tenant(&NA, "t2.tok");
    struct pf_client *b1 = connect_tenant(&NB, "t1.tok"), *b2 = connect_tenant(&NB, "t2.tok");
    const size_t N = 16;
    struct world s1, s2, d1, d2;
    world_init_tagged(&s1, "t1-src", "ns-t1", 2, 2, KV_SPLIT, 64, SEG, 1, true);
    world_init_tagged(&s2, "t2-src", "ns-t2", 2, 2, KV_SPLIT, 64, SEG, 2, true);
    world_init_tagged(&d1, "t1-dst", "ns-t1", 2, 2, KV_SPLIT, 64, SEG, 1, false);
    world_init_tagged(&d2, "t2-dst", "ns-t2", 2, 2, KV_SPLIT, 64, SEG, 2, false);
    world_register(a1, &s1);
    world_register(a2, &s2);
    world_register(b1, &d1);
    world_register(b2, &d2);
    /* equal hashes [0, N) in both namespaces; [N, 2N) only in T1's */
    world_save_ok(a1, &s1, 0, 0, 2 * N);
    world_save_ok(a2, &s2, 0, 0, N);
    wait_meta_ns("ns-t1", NA.p.addr, 0, 2 * N, (long)(2 * N), 20000);
    wait_meta_ns("ns-t2", NA.p.addr, 0, N, (long)N, 20000);
    /* T2 first: A's RAM holds T1's blocks under the same hashes */
    fetch_check(b2, &d2, "t2-fetch", 0, N, 0, &s2, 0, 0, (long)N, 30000);
    fetch_check(b1, &d1, "t1-fetch", 0, N, 0, &s1, 0, 0, (long)N, 30000);
    for (int r = 0; r < 2; r++)
        for (int l = 0; l < 2; l++)
            for (size_t i = 0; i < N; i++)
                PFT_CHECK(!kvt_block_equal(&d1.kv[r][l], i, &d2.kv[r][l], i),
                          "rank %d layer %d block %zu: the tenants loaded the same bytes", r, l, i);
    /* T1-only hashes are nobody's in T2's namespace, on A's RAM or through the fabric */
    fetch_check(b2, &d2, "t2-only-t1", N, N, 0, &s2, 0, 32, 0, 30000);
    fetch_check(b1, &d1, "t1-rest", N, N, 0, &s1, N, 32, (long)N, 30000);
    /* tenant checks hold on the serving node too: T2 cannot name T1's instance */
    struct pf_query_result res;
    EXPECT(query(a2, "t1-src", "t2-on-t1", 0, N, &res), PF_GRPC_PERMISSION_DENIED,
           "instance t1-src does not belong to tenant T2");
    PFT_CHECK(node_metric(&NB, "pegaflow_tenant_hit_blocks_total{tenant=\"T2\"}") >= N,
              "T2's hits on B");
    pf_client_close(a1);
    pf_client_close(a2);
    pf_client_close(b1);
    pf_client_close(b2);
    world_free(&s1);
    world_free(&s2);
    world_free(&d1);
    world_free(&d2);
    stop_all();
    fprintf(stderr, "    tenants: equal hashes in two namespaces fetched across nodes, each "
                    "tenant its own bytes\n");
}

#endif

/* The tenants file parser and lookups (src/tenant/parse.c): a good file (comments, blank
 * lines, CRLF, prefixes, quotas), every refusal with its line number, the file checks of
 * pf_tenants_load (missing, not regular, too large, world-readable accepted), token lookup
 * (exact length, not a prefix) and namespace matching. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "pf/tenant.h"

#define TOK_A "aaaaaaaaaaaaaaaa1"
#define TOK_B "bbbbbbbbbbbbbbbb2"

static int parse(const char *text, struct pf_tenants **t_p, char *err, size_t errlen)
{
    return pf_tenants_parse(text, strlen(text), "T", t_p, err, errlen);
}

static void test_good(void **st)
{
    (void)st;
    const char *text =
        "# tenants\n"
        "\n"
        "   # indented comment\n"
        "tenant=acme token=" TOK_A " namespaces=acme,acme-* ram=4mb ssd=1gb\r\n"
        "\ttenant=beta.2  namespaces=beta token=" TOK_B " ssd=unlimited ram=unlimited\n"
        "tenant=c_3 token=cccccccccccccccc3 namespaces=x*"; /* no final newline */
    struct pf_tenants *t = NULL;
    char err[512] = "";
    assert_int_equal(parse(text, &t, err, sizeof(err)), 0);
    assert_int_equal(t->n, 3);
    assert_string_equal(t->t[0].name, "acme");
    assert_int_equal(t->t[0].line, 4);
    assert_int_equal(t->t[0].ram_quota, 4u << 20);
    assert_int_equal(t->t[0].nrules, 2);
    assert_false(t->t[0].rules[0].prefix);
    assert_true(t->t[0].rules[1].prefix);
    assert_string_equal(t->t[0].rules[1].pat, "acme-");
    assert_int_equal(t->t[1].ram_quota, 0);
    assert_int_equal(t->t[0].ssd_quota, 1ull << 30);
    assert_int_equal(t->t[1].ssd_quota, 0);
    assert_int_equal(t->t[2].ssd_quota, 0); /* absent: unlimited */
    assert_string_equal(t->t[1].name, "beta.2");

    assert_ptr_equal(pf_tenants_by_token(t, TOK_A, strlen(TOK_A)), &t->t[0]);
    assert_ptr_equal(pf_tenants_by_token(t, TOK_B, strlen(TOK_B)), &t->t[1]);
    assert_null(pf_tenants_by_token(t, TOK_A, strlen(TOK_A) - 1)); /* a prefix is not it */
    assert_null(pf_tenants_by_token(t, TOK_A "x", strlen(TOK_A) + 1));
    assert_null(pf_tenants_by_token(t, NULL, 0));
    assert_ptr_equal(pf_tenants_by_name(t, "c_3"), &t->t[2]);
    assert_null(pf_tenants_by_name(t, "nobody"));

    assert_true(pf_tenant_allows(&t->t[0], "acme"));
    assert_true(pf_tenant_allows(&t->t[0], "acme-"));
    assert_true(pf_tenant_allows(&t->t[0], "acme-prod"));
    assert_false(pf_tenant_allows(&t->t[0], "acmex"));
    assert_false(pf_tenant_allows(&t->t[0], "acm"));
    assert_false(pf_tenant_allows(&t->t[0], "beta"));
    assert_ptr_equal(pf_tenants_by_namespace(t, "beta"), &t->t[1]);
    assert_ptr_equal(pf_tenants_by_namespace(t, "xyz"), &t->t[2]);
    assert_null(pf_tenants_by_namespace(t, "betas"));
    assert_null(pf_tenants_by_namespace(t, ""));
    pf_tenants_free(t);
    pf_tenants_free(NULL);
}

/* text must be refused with a message containing want (which names the line). */
static void refuse(const char *text, const char *want)
{
    struct pf_tenants *t = (struct pf_tenants *)0x1;
    char err[512] = "";
    int rc = parse(text, &t, err, sizeof(err));
    if (rc != -EINVAL || !strstr(err, want))
        fail_msg("text '%s': rc=%d err='%s', want -EINVAL with '%s'", text, rc, err, want);
    assert_ptr_equal(t, (struct pf_tenants *)0x1); /* untouched */
}

#define GOOD "tenant=a token=" TOK_A " namespaces=a\n"

static void test_refusals(void **st)
{
    (void)st;
    refuse("", "T: no tenant defined");
    refuse("# only a comment\n\n", "T: no tenant defined");
    refuse(GOOD "tenant=b token=" TOK_B " namespaces=b bogus\n",
           "T:2: field 'bogus' is not key=value");
    refuse(GOOD "tenant=b token=" TOK_B " namespaces=b color=red\n", "T:2: unknown key 'color'");
    refuse("tenant=a tenant=b token=" TOK_A " namespaces=a\n", "T:1: tenant= given twice");
    refuse("tenant=a token=" TOK_A " token=" TOK_B " namespaces=a\n", "T:1: token= given twice");
    refuse("tenant=a token=" TOK_A " namespaces=a namespaces=b\n", "T:1: namespaces= given twice");
    refuse("tenant=a token=" TOK_A " namespaces=a ram=1mb ram=2mb\n", "T:1: ram= given twice");
    refuse("token=" TOK_A " namespaces=a\n", "T:1: tenant= is missing");
    refuse("tenant=a namespaces=a\n", "T:1: token= is missing");
    refuse("tenant=a token=" TOK_A "\n", "T:1: namespaces= is missing");
    refuse("tenant= token=" TOK_A " namespaces=a\n", "T:1: tenant name '' must be");
    refuse("tenant=a/b token=" TOK_A " namespaces=a\n", "T:1: tenant name 'a/b' must be");
    refuse("tenant=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa token=" TOK_A
           " namespaces=a\n",
           "T:1: tenant name");
    refuse("tenant=a token=short namespaces=a\n",
           "T:1: token must be 16 to 4096 characters (got 5)");
    refuse("tenant=a token=aaaaaaaaaaaaaaaa\x01 namespaces=a\n",
           "T:1: token must be printable ASCII (byte 16)");
    refuse("tenant=a token=" TOK_A " namespaces=\n", "T:1: namespaces= is empty");
    refuse("tenant=a token=" TOK_A " namespaces=a,,b\n", "T:1: empty namespace");
    refuse("tenant=a token=" TOK_A " namespaces=a,\n", "T:1: empty namespace");
    refuse("tenant=a token=" TOK_A " namespaces=a*b\n",
           "T:1: namespace rule 'a*b': '*' is allowed only at the end");
    refuse("tenant=a token=" TOK_A " namespaces=a**\n", "T:1: namespace rule 'a**'");
    refuse("tenant=a token=" TOK_A " namespaces=a,a\n",
           "T:1: namespace rule 'a' repeats or overlaps 'a'");
    refuse("tenant=a token=" TOK_A " namespaces=ab,a*\n",
           "T:1: namespace rule 'a*' repeats or overlaps 'ab'");
    refuse("tenant=a token=" TOK_A " namespaces=a ram=lots\n", "T:1: ram='lots' is not a size");
    refuse("tenant=a token=" TOK_A " namespaces=a ram=0\n", "T:1: ram='0' is not a size above 0");
    refuse("tenant=a token=" TOK_A " namespaces=a ram=\n", "T:1: ram='' is not a size");
    refuse("tenant=a token=" TOK_A " namespaces=a ssd=1gb ssd=2gb\n", "T:1: ssd= given twice");
    refuse("tenant=a token=" TOK_A " namespaces=a ssd=lots\n", "T:1: ssd='lots' is not a size");
    refuse("tenant=a token=" TOK_A " namespaces=a ssd=0\n", "T:1: ssd='0' is not a size above 0");
    refuse("tenant=a token=" TOK_A " namespaces=a ssd=\n", "T:1: ssd='' is not a size");
    refuse("tenant=a token=" TOK_A " namespaces=a ssd=-1gb\n", "T:1: ssd='-1gb' is not a size");
    refuse("tenant=a token=" TOK_A " namespaces=a ssd=Unlimited\n",
           "T:1: ssd='Unlimited' is not a size");
    refuse(GOOD "tenant=a token=" TOK_B " namespaces=b\n",
           "T:2: tenant a is already defined on line 1");
    refuse(GOOD "tenant=b token=" TOK_A " namespaces=b\n",
           "T:2: tenant b has the same token as tenant a (line 1)");
    refuse(GOOD "tenant=b token=" TOK_B " namespaces=a\n",
           "T:2: namespace rule 'a' of tenant b overlaps rule 'a' of tenant a (line 1)");
    refuse(GOOD "tenant=b token=" TOK_B " namespaces=*\n",
           "T:2: namespace rule '*' of tenant b overlaps");
    refuse("tenant=a token=" TOK_A " namespaces=a-*\n\ntenant=b token=" TOK_B " namespaces=a-b\n",
           "T:3: namespace rule 'a-b' of tenant b overlaps rule 'a-*' of tenant a (line 1)");
    refuse("tenant=a token=" TOK_A " namespaces=ab*\ntenant=b token=" TOK_B " namespaces=a*\n",
           "T:2: namespace rule 'a*' of tenant b overlaps rule 'ab*'");
    static const char nul[] = "tenant=a token=" TOK_A " namespaces=a\0\n";
    struct pf_tenants *t;
    char err[256];
    assert_int_equal(pf_tenants_parse(nul, sizeof(nul) - 1, "T", &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "T:1: NUL byte"));
    /* too many rules */
    char big[4096] = "tenant=a token=" TOK_A " namespaces=";
    for (int i = 0; i <= PF_TENANT_RULES_MAX; i++)
        snprintf(big + strlen(big), sizeof(big) - strlen(big), "%sn%d", i ? "," : "", i);
    refuse(big, "T:1: more than 64 namespace rules");
}

static void test_many_tenants(void **st)
{
    (void)st;
    size_t cap = (PF_TENANT_MAX + 2) * 80;
    char *text = malloc(cap);
    size_t n = 0;
    for (int i = 0; i <= PF_TENANT_MAX; i++)
        n += (size_t)snprintf(text + n, cap - n, "tenant=t%d token=tok-%016d namespaces=ns%d.\n", i,
                              i, i);
    struct pf_tenants *t;
    char err[256];
    assert_int_equal(pf_tenants_parse(text, n, "T", &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "T:1025: more than 1024 tenants"));
    /* one less is fine, and each tenant keeps its own namespace */
    char *last = strstr(text, "tenant=t1024 ");
    assert_int_equal(pf_tenants_parse(text, (size_t)(last - text), "T", &t, err, sizeof(err)), 0);
    assert_int_equal(t->n, PF_TENANT_MAX);
    assert_string_equal(pf_tenants_by_namespace(t, "ns7.")->name, "t7");
    pf_tenants_free(t);
    free(text);
}

static char dir[] = "/tmp/pf-tenant-test.XXXXXX";

static void test_load(void **st)
{
    (void)st;
    assert_non_null(mkdtemp(dir));
    char p[300], err[512];
    struct pf_tenants *t;
    snprintf(p, sizeof(p), "%s/missing", dir);
    assert_int_equal(pf_tenants_load(p, &t, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "--tenants-file: cannot open"));
    assert_int_equal(pf_tenants_load(dir, &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "is not a regular file"));
    snprintf(p, sizeof(p), "%s/t", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("tenant=a token=" TOK_A " namespaces=a\n", f);
    fclose(f);
    chmod(p, 0644); /* world-readable: accepted with a warning, like the token files */
    assert_int_equal(pf_tenants_load(p, &t, err, sizeof(err)), 0);
    assert_int_equal(t->n, 1);
    pf_tenants_free(t);
    f = fopen(p, "w");
    fputs("tenant=a token=" TOK_A " namespaces=a\nbroken\n", f);
    fclose(f);
    assert_int_equal(pf_tenants_load(p, &t, err, sizeof(err)), -EINVAL);
    char want[400];
    snprintf(want, sizeof(want), "%s:2: field 'broken'", p);
    assert_non_null(strstr(err, want));
    assert_int_equal(truncate(p, PF_TENANT_FILE_MAX + 1), 0);
    assert_int_equal(pf_tenants_load(p, &t, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "is larger than"));
    unlink(p);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_many_tenants),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

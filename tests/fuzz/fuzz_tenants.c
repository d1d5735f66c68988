/* Fuzz target: the tenants file parser (src/tenant/parse.c, docs/security.md "Tenants").
 *
 * Input: the file's bytes, parsed with pf_tenants_parse (what = "F").
 * Checks: the result is 0 or -EINVAL with a message naming the source ("F:" or "F: ");
 * an accepted set holds 1..PF_TENANT_MAX tenants, each with a valid name, a token of
 * PF_TENANT_TOKEN_MIN..MAX printable bytes that pf_tenants_by_token finds (and a token one
 * byte shorter does not, unless it is another tenant's whole token), a name pf_tenants_by_name
 * finds, 1..PF_TENANT_RULES_MAX rules; every rule's own pattern (an exact name, or the prefix
 * itself) belongs to its tenant and to no other (pf_tenants_by_namespace: namespaces never overlap
 * across tenants). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "pf/log.h"
#include "pf/tenant.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    pf_log_set_level(PF_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct pf_tenants *t = NULL;
    char err[512] = "";
    int rc = pf_tenants_parse((const char *)data, size, "F", &t, err, sizeof(err));
    if (rc != 0) {
        if (rc != -EINVAL)
            fz_fail("pf_tenants_parse returned %d", rc);
        if (strncmp(err, "F:", 2) != 0)
            fz_fail("refusal without the source in its message: '%s'", err);
        return 0;
    }
    if (!t || t->n == 0 || t->n > PF_TENANT_MAX)
        fz_fail("accepted a set of %zu tenants", t ? t->n : 0);
    for (size_t i = 0; i < t->n; i++) {
        const struct pf_tenant *x = &t->t[i];
        size_t nl = strlen(x->name);
        if (nl == 0 || nl > PF_TENANT_NAME_MAX)
            fz_fail("tenant name of %zu bytes", nl);
        if (x->toklen < PF_TENANT_TOKEN_MIN || x->toklen > PF_TENANT_TOKEN_MAX ||
            strlen(x->token) != x->toklen)
            fz_fail("tenant %s: token of %zu bytes", x->name, x->toklen);
        if (pf_tenants_by_token(t, x->token, x->toklen) != x)
            fz_fail("tenant %s: its token finds another tenant", x->name);
        /* A token one byte shorter never authenticates as x; it may be another tenant's
         * whole token (tokens are compared whole), and then it finds exactly that one. */
        const struct pf_tenant *p = pf_tenants_by_token(t, x->token, x->toklen - 1);
        if (p == x ||
            (p && (p->toklen != x->toklen - 1 || memcmp(p->token, x->token, p->toklen) != 0)))
            fz_fail("tenant %s: a token prefix is accepted", x->name);
        if (pf_tenants_by_name(t, x->name) != x)
            fz_fail("tenant %s: not found by name", x->name);
        if (x->nrules == 0 || x->nrules > PF_TENANT_RULES_MAX)
            fz_fail("tenant %s: %zu rules", x->name, x->nrules);
        for (size_t r = 0; r < x->nrules; r++) {
            const char *pat = x->rules[r].pat;
            if (strchr(pat, '*'))
                fz_fail("tenant %s: rule '%s' keeps a '*'", x->name, pat);
            if (!pf_tenant_allows(x, pat))
                fz_fail("tenant %s: its rule '%s' does not match itself", x->name, pat);
            if (pf_tenants_by_namespace(t, pat) != x)
                fz_fail("namespace '%s' of tenant %s belongs to another tenant", pat, x->name);
            for (size_t o = 0; o < t->n; o++)
                if (o != i && pf_tenant_allows(&t->t[o], pat))
                    fz_fail("namespace '%s' is allowed for tenants %s and %s", pat, x->name,
                            t->t[o].name);
        }
    }
    pf_tenants_free(t);
    return 0;
}

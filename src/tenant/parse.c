/* The tenants file (pf/tenant.h): a strict line parser producing an immutable struct
 * pf_tenants, and the token/namespace lookups over it. Tokens are compared in constant
 * time (pf_auth_token_eq); they are wiped when the set is freed. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PF_LOG_MOD "tenant"
#include "pf/auth.h"
#include "pf/config.h"
#include "pf/log.h"
#include "pf/tenant.h"

static void wipe(char *s, size_t n)
{
    if (s) {
        volatile char *p = s;
        for (size_t i = 0; i < n; i++)
            p[i] = 0;
    }
}

static void tenant_clear(struct pf_tenant *t)
{
    free(t->name);
    if (t->token) {
        wipe(t->token, t->toklen);
        free(t->token);
    }
    for (size_t i = 0; i < t->nrules; i++)
        free(t->rules[i].pat);
    free(t->rules);
    memset(t, 0, sizeof(*t));
}

void pf_tenants_free(struct pf_tenants *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        tenant_clear(&t->t[i]);
    free(t->t);
    free(t);
}

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > PF_TENANT_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

/* Can a namespace match both rules? */
static bool rules_overlap(const struct pf_tenant_rule *a, const struct pf_tenant_rule *b)
{
    size_t la = strlen(a->pat), lb = strlen(b->pat);
    if (!a->prefix && !b->prefix)
        return strcmp(a->pat, b->pat) == 0;
    if (a->prefix && b->prefix)
        return strncmp(a->pat, b->pat, la < lb ? la : lb) == 0;
    const struct pf_tenant_rule *p = a->prefix ? a : b, *x = a->prefix ? b : a;
    size_t lp = strlen(p->pat);
    return strlen(x->pat) >= lp && strncmp(x->pat, p->pat, lp) == 0;
}

static bool rule_match(const struct pf_tenant_rule *r, const char *ns)
{
    if (r->prefix)
        return strncmp(ns, r->pat, strlen(r->pat)) == 0;
    return strcmp(ns, r->pat) == 0;
}

/* namespaces=a,b*,c: 0 or -EINVAL/-ENOMEM with the reason in err. */
/* A quota value: a size above 0 (pf_parse_size) or "unlimited" (0). */
static int parse_quota(const char *key, const char *v, size_t vl, const char *where, uint64_t *b_p,
                       char *err, size_t errlen)
{
    char buf[64];
    uint64_t b = 0;
    if (vl == 9 && memcmp(v, "unlimited", 9) == 0) {
        b = 0;
    } else if (vl == 0 || vl >= sizeof(buf) ||
               (memcpy(buf, v, vl), buf[vl] = '\0', pf_parse_size(buf, &b) != 0) || b == 0) {
        snprintf(err, errlen, "%s: %s='%.*s' is not a size above 0 (e.g. 512mb, 4gb) or unlimited",
                 where, key, (int)(vl > 64 ? 64 : vl), v);
        return -EINVAL;
    }
    *b_p = b;
    return 0;
}

static int parse_rules(struct pf_tenant *t, const char *v, size_t n, const char *where, char *err,
                       size_t errlen)
{
    if (n == 0) {
        snprintf(err, errlen, "%s: namespaces= is empty", where);
        return -EINVAL;
    }
    size_t i = 0;
    while (i <= n) {
        size_t j = i;
        while (j < n && v[j] != ',')
            j++;
        size_t l = j - i;
        bool prefix = l > 0 && v[j - 1] == '*';
        size_t pl = prefix ? l - 1 : l;
        if (l == 0 || (!prefix && pl == 0)) {
            snprintf(err, errlen, "%s: empty namespace in namespaces=", where);
            return -EINVAL;
        }
        for (size_t k = i; k < i + pl; k++)
            if (v[k] == '*' || (unsigned char)v[k] <= ' ' || (unsigned char)v[k] > '~') {
                snprintf(err, errlen,
                         "%s: namespace rule '%.*s': '*' is allowed only at the end and names "
                         "are printable ASCII",
                         where, (int)l, v + i);
                return -EINVAL;
            }
        if (t->nrules == PF_TENANT_RULES_MAX) {
            snprintf(err, errlen, "%s: more than %d namespace rules", where, PF_TENANT_RULES_MAX);
            return -EINVAL;
        }
        struct pf_tenant_rule r = {.pat = strndup(v + i, pl), .prefix = prefix};
        if (!r.pat)
            return -ENOMEM;
        for (size_t k = 0; k < t->nrules; k++)
            if (rules_overlap(&t->rules[k], &r)) {
                snprintf(err, errlen, "%s: namespace rule '%.*s' repeats or overlaps '%s%s'", where,
                         (int)l, v + i, t->rules[k].pat, t->rules[k].prefix ? "*" : "");
                free(r.pat);
                return -EINVAL;
            }
        if (!t->rules) {
            t->rules = calloc(PF_TENANT_RULES_MAX, sizeof(*t->rules));
            if (!t->rules) {
                free(r.pat);
                return -ENOMEM;
            }
        }
        t->rules[t->nrules++] = r;
        i = j + 1;
    }
    return 0;
}

static int parse_line(struct pf_tenant *t, const char *s, size_t n, const char *where, char *err,
                      size_t errlen)
{
    bool seen_ns = false, seen_ram = false, seen_ssd = false;
    size_t i = 0;
    while (i < n) {
        while (i < n && (s[i] == ' ' || s[i] == '\t'))
            i++;
        if (i == n)
            break;
        size_t j = i;
        while (j < n && s[j] != ' ' && s[j] != '\t')
            j++;
        const char *f = s + i, *eq = memchr(f, '=', j - i);
        if (!eq) {
            snprintf(err, errlen, "%s: field '%.*s' is not key=value", where,
                     (int)(j - i > 64 ? 64 : j - i), f);
            return -EINVAL;
        }
        size_t kl = (size_t)(eq - f);
        const char *v = eq + 1;
        size_t vl = j - i - kl - 1;
#define KEY(k) (kl == sizeof(k) - 1 && memcmp(f, k, kl) == 0)
#define ONCE(cond)                                                                                 \
    do {                                                                                           \
        if (cond) {                                                                                \
            snprintf(err, errlen, "%s: %.*s= given twice", where, (int)kl, f);                     \
            return -EINVAL;                                                                        \
        }                                                                                          \
    } while (0)
        if (KEY("tenant")) {
            ONCE(t->name);
            if (!name_ok(v, vl)) {
                snprintf(err, errlen,
                         "%s: tenant name '%.*s' must be 1-%d characters of A-Z a-z 0-9 _ . -",
                         where, (int)(vl > 80 ? 80 : vl), v, PF_TENANT_NAME_MAX);
                return -EINVAL;
            }
            if (!(t->name = strndup(v, vl)))
                return -ENOMEM;
        } else if (KEY("token")) {
            ONCE(t->token);
            if (vl < PF_TENANT_TOKEN_MIN || vl > PF_TENANT_TOKEN_MAX) {
                snprintf(err, errlen, "%s: token must be %d to %d characters (got %zu)", where,
                         PF_TENANT_TOKEN_MIN, PF_TENANT_TOKEN_MAX, vl);
                return -EINVAL;
            }
            for (size_t k = 0; k < vl; k++)
                if ((unsigned char)v[k] <= ' ' || (unsigned char)v[k] > '~') {
                    snprintf(err, errlen, "%s: token must be printable ASCII (byte %zu)", where, k);
                    return -EINVAL;
                }
            if (!(t->token = strndup(v, vl)))
                return -ENOMEM;
            t->toklen = vl;
        } else if (KEY("namespaces")) {
            ONCE(seen_ns);
            seen_ns = true;
            int rc = parse_rules(t, v, vl, where, err, errlen);
            if (rc)
                return rc;
        } else if (KEY("ram") || KEY("ssd")) {
            bool ram = KEY("ram");
            if (ram) {
                ONCE(seen_ram);
                seen_ram = true;
            } else {
                ONCE(seen_ssd);
                seen_ssd = true;
            }
            uint64_t b = 0;
            int rc = parse_quota(ram ? "ram" : "ssd", v, vl, where, &b, err, errlen);
            if (rc)
                return rc;
            if (ram)
                t->ram_quota = b;
            else
                t->ssd_quota = b;
        } else {
            snprintf(err, errlen,
                     "%s: unknown key '%.*s' (expected tenant, token, namespaces, ram, ssd)", where,
                     (int)(kl > 64 ? 64 : kl), f);
            return -EINVAL;
        }
#undef KEY
#undef ONCE
        i = j;
    }
    const char *missing = !t->name    ? "tenant="
                          : !t->token ? "token="
                          : !seen_ns  ? "namespaces="
                                      : NULL;
    if (missing) {
        snprintf(err, errlen, "%s: %s is missing", where, missing);
        return -EINVAL;
    }
    return 0;
}

int pf_tenants_parse(const char *text, size_t len, const char *what, struct pf_tenants **t_p,
                     char *err, size_t errlen)
{
    struct pf_tenants *ts = calloc(1, sizeof(*ts));
    if (!ts)
        return -ENOMEM;
    size_t cap = 0;
    int rc = 0;
    unsigned line = 0;
    char where[320];
    for (size_t i = 0; i < len && rc == 0;) {
        line++;
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        const char *s = text + i;
        size_t n = e - i;
        i = e + 1;
        if (n && s[n - 1] == '\r')
            n--;
        snprintf(where, sizeof(where), "%s:%u", what, line);
        if (memchr(s, '\0', n)) {
            snprintf(err, errlen, "%s: NUL byte in the line", where);
            rc = -EINVAL;
            break;
        }
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t'))
            k++;
        if (k == n || s[k] == '#')
            continue;
        if (ts->n == PF_TENANT_MAX) {
            snprintf(err, errlen, "%s: more than %d tenants", where, PF_TENANT_MAX);
            rc = -EINVAL;
            break;
        }
        if (ts->n == cap) {
            size_t nc = cap ? cap * 2 : 8;
            struct pf_tenant *m = realloc(ts->t, nc * sizeof(*m));
            if (!m) {
                rc = -ENOMEM;
                break;
            }
            ts->t = m;
            cap = nc;
        }
        struct pf_tenant *t = &ts->t[ts->n];
        memset(t, 0, sizeof(*t));
        t->line = line;
        rc = parse_line(t, s, n, where, err, errlen);
        if (rc) {
            tenant_clear(t);
            break;
        }
        ts->n++;
        for (size_t o = 0; o + 1 < ts->n && rc == 0; o++) {
            const struct pf_tenant *p = &ts->t[o];
            if (strcmp(p->name, t->name) == 0) {
                snprintf(err, errlen, "%s: tenant %s is already defined on line %u", where, t->name,
                         p->line);
                rc = -EINVAL;
            } else if (p->toklen == t->toklen && memcmp(p->token, t->token, t->toklen) == 0) {
                snprintf(err, errlen, "%s: tenant %s has the same token as tenant %s (line %u)",
                         where, t->name, p->name, p->line);
                rc = -EINVAL;
            }
            for (size_t a = 0; a < p->nrules && rc == 0; a++)
                for (size_t b = 0; b < t->nrules && rc == 0; b++)
                    if (rules_overlap(&p->rules[a], &t->rules[b])) {
                        snprintf(err, errlen,
                                 "%s: namespace rule '%s%s' of tenant %s overlaps rule '%s%s' of "
                                 "tenant %s (line %u): a namespace belongs to one tenant",
                                 where, t->rules[b].pat, t->rules[b].prefix ? "*" : "", t->name,
                                 p->rules[a].pat, p->rules[a].prefix ? "*" : "", p->name, p->line);
                        rc = -EINVAL;
                    }
        }
    }
    if (rc == 0 && ts->n == 0) {
        snprintf(err, errlen, "%s: no tenant defined", what);
        rc = -EINVAL;
    }
    if (rc) {
        if (rc == -ENOMEM)
            snprintf(err, errlen, "%s: out of memory", what);
        pf_tenants_free(ts);
        return rc;
    }
    *t_p = ts;
    return 0;
}

int pf_tenants_load(const char *path, struct pf_tenants **t_p, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "--tenants-file: cannot open %s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    int rc = 0;
    char *buf = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "--tenants-file: %s is not a regular file", path);
        rc = -EINVAL;
        goto out;
    }
    if (st.st_size > (off_t)PF_TENANT_FILE_MAX) {
        snprintf(err, errlen, "--tenants-file: %s is larger than %u bytes", path,
                 PF_TENANT_FILE_MAX);
        rc = -EINVAL;
        goto out;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        snprintf(err, errlen, "--tenants-file: out of memory");
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            snprintf(err, errlen, "--tenants-file: cannot read %s: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap) { /* grew while we read it */
            snprintf(err, errlen, "--tenants-file: %s changed while it was read", path);
            rc = -EINVAL;
            goto out;
        }
    }
    char perr[600] = "";
    rc = pf_tenants_parse(buf, n, path, t_p, perr, sizeof(perr));
    if (rc)
        snprintf(err, errlen, "--tenants-file: %s", perr);
    if (rc == 0 && (st.st_mode & 0004))
        pf_warn("--tenants-file: %s is readable by every user of this host", path);
out:
    if (buf) {
        wipe(buf, cap);
        free(buf);
    }
    close(fd);
    return rc;
}

const struct pf_tenant *pf_tenants_by_token(const struct pf_tenants *t, const void *tok, size_t len)
{
    const struct pf_tenant *hit = NULL;
    if (!t || !tok)
        return NULL;
    for (size_t i = 0; i < t->n; i++) /* every token is compared: no early exit */
        if (pf_auth_token_eq(t->t[i].token, tok, len))
            hit = &t->t[i];
    return hit;
}

const struct pf_tenant *pf_tenants_by_name(const struct pf_tenants *t, const char *name)
{
    for (size_t i = 0; t && name && i < t->n; i++)
        if (strcmp(t->t[i].name, name) == 0)
            return &t->t[i];
    return NULL;
}

bool pf_tenant_allows(const struct pf_tenant *t, const char *ns)
{
    for (size_t i = 0; t && ns && i < t->nrules; i++)
        if (rule_match(&t->rules[i], ns))
            return true;
    return false;
}

const struct pf_tenant *pf_tenants_by_namespace(const struct pf_tenants *t, const char *ns)
{
    for (size_t i = 0; t && ns && i < t->n; i++)
        if (pf_tenant_allows(&t->t[i], ns))
            return &t->t[i];
    return NULL;
}

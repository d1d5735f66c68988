/* Flag-table parser and value parsers. The tables live with each binary's application
 * module (src/app); this file knows only types. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>

#include "pf/config.h"
#include "pf/log.h"
#include "pf/util.h"

#define MAX_FLAGS 128
static bool given[MAX_FLAGS];

static void seterr(char *err, size_t len, const char *fmt, ...) PF_PRINTF(3, 4);
static void seterr(char *err, size_t len, const char *fmt, ...)
{
    if (!err || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

void pf_strlist_free(struct pf_strlist *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int pf_strlist_push(struct pf_strlist *l, const char *s)
{
    char **nv = realloc(l->v, (l->n + 1) * sizeof(*nv));
    if (!nv)
        return -ENOMEM;
    l->v = nv;
    nv[l->n] = strdup(s);
    if (!nv[l->n])
        return -ENOMEM;
    l->n++;
    return 0;
}

int pf_parse_u64(const char *s, uint64_t *v_p)
{
    if (!s || !*s || !isdigit((unsigned char)*s))
        return -EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -EINVAL;
    *v_p = v;
    return 0;
}

int pf_parse_bool(const char *s, bool *v_p)
{
    static const char *t[] = {"true", "1", "yes", "on"};
    static const char *f[] = {"false", "0", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, t[i]) == 0) {
            *v_p = true;
            return 0;
        }
        if (strcasecmp(s, f[i]) == 0) {
            *v_p = false;
            return 0;
        }
    }
    return -EINVAL;
}

int pf_parse_size(const char *s, uint64_t *bytes_p)
{
    if (!s)
        return -EINVAL;
    while (isspace((unsigned char)*s))
        s++;
    /* decimal digits with an optional fraction only: no sign, hex or exponent */
    const char *q = s;
    while (isdigit((unsigned char)*q))
        q++;
    if (*q == '.') {
        q++;
        while (isdigit((unsigned char)*q))
            q++;
    }
    if (q == s || (q == s + 1 && *s == '.'))
        return -EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end != q)
        return -EINVAL;
    if (errno || end == s || !isfinite(v) || v < 0)
        return -EINVAL;
    while (isspace((unsigned char)*end))
        end++;
    static const struct {
        const char *sfx;
        int shift;
    } units[] = {
        {"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
        {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40},
    };
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].sfx) == 0) {
            double b = ldexp(v, units[i].shift);
            if (b >= 18446744073709551615.0)
                return -ERANGE;
            uint64_t r = (uint64_t)b;
            if ((double)r != b && units[i].shift == 0)
                return -EINVAL; /* fractional bytes */
            *bytes_p = r;
            return 0;
        }
    }
    return -EINVAL;
}

void pf_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *sfx[] = {"b", "kb", "mb", "gb", "tb"};
    int i = 0;
    double v = (double)bytes;
    while (i < 4 && v >= 1024.0) {
        v /= 1024.0;
        i++;
    }
    if (v == floor(v))
        snprintf(buf, len, "%.0f%s", v, sfx[i]);
    else
        snprintf(buf, len, "%.2f%s", v, sfx[i]);
}

int pf_addr_split(const char *addr, char *host, size_t hostlen, uint16_t *port_p)
{
    if (!addr || !*addr)
        return -EINVAL;
    const char *colon;
    const char *hs = addr;
    size_t hl;
    if (addr[0] == '[') {
        const char *rb = strchr(addr, ']');
        if (!rb || rb[1] != ':')
            return -EINVAL;
        hs = addr + 1;
        hl = (size_t)(rb - hs);
        colon = rb + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon)
            return -EINVAL;
        if (memchr(addr, ':', (size_t)(colon - addr)))
            return -EINVAL; /* bare IPv6 without brackets */
        hl = (size_t)(colon - addr);
    }
    if (hl == 0 || hl >= hostlen)
        return -EINVAL;
    uint64_t port;
    if (pf_parse_u64(colon + 1, &port) != 0 || port > 65535)
        return -EINVAL;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *port_p = (uint16_t)port;
    return 0;
}

int pf_addr_check(const char *addr, char *err, size_t errlen)
{
    char host[256];
    uint16_t port;
    if (pf_addr_split(addr, host, sizeof(host), &port) != 0) {
        seterr(err, errlen, "'%s' is not host:port (e.g. 127.0.0.1:50055)", addr ? addr : "");
        return -EINVAL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        seterr(err, errlen, "cannot resolve host '%s' (%s)", host, gai_strerror(rc));
        return -EHOSTUNREACH;
    }
    freeaddrinfo(res);
    return 0;
}

bool pf_addr_is_unroutable(const char *addr)
{
    char host[256];
    uint16_t port;
    if (pf_addr_split(addr, host, sizeof(host), &port) != 0)
        return true;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        uint32_t h = ntohl(a4.s_addr);
        return h == 0 || h == 0x7f000001u;
    }
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_UNSPECIFIED(&a6) || IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

int pf_url_to_target(const char *url, char *out, size_t outlen)
{
    const char *p = url;
    const char *sep = strstr(url, "://");
    if (sep) {
        size_t sl = (size_t)(sep - url);
        if (!(sl == 4 && strncasecmp(url, "http", 4) == 0))
            return -EPROTONOSUPPORT;
        p = sep + 3;
    }
    size_t n = strlen(p);
    while (n > 0 && p[n - 1] == '/')
        n--;
    if (n == 0 || n >= outlen)
        return -EINVAL;
    memcpy(out, p, n);
    out[n] = '\0';
    char host[256];
    uint16_t port;
    if (pf_addr_split(out, host, sizeof(host), &port) != 0 || port == 0)
        return -EINVAL;
    return 0;
}

static const struct pf_flag *find_flag(const struct pf_flag *tab, size_t n, const char *name,
                                       size_t namelen)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(tab[i].name) == namelen && strncmp(tab[i].name, name, namelen) == 0)
            return &tab[i];
    return NULL;
}

static int push_list_items(struct pf_strlist *l, const char *val, const struct pf_flag *f,
                           char *err, size_t errlen)
{
    char *copy = strdup(val);
    if (!copy)
        return -ENOMEM;
    int rc = 0;
    char *save = NULL;
    bool any = false;
    for (char *tok = strtok_r(copy, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
        tok = pf_strtrim(tok);
        if (!*tok)
            continue;
        any = true;
        rc = pf_strlist_push(l, tok);
        if (rc)
            break;
    }
    if (!rc && !any) {
        seterr(err, errlen, "--%s: empty value", f->name);
        rc = -EINVAL;
    }
    free(copy);
    return rc;
}

static int set_value(const struct pf_flag *f, void *cfg, const char *val, char *err, size_t errlen)
{
    char *field = (char *)cfg + f->off;
    char buf[200];
    switch (f->type) {
    case PF_FLAG_BOOL: {
        bool b;
        if (pf_parse_bool(val, &b) != 0) {
            seterr(err, errlen, "--%s: '%s' is not a boolean (true or false)", f->name, val);
            return -EINVAL;
        }
        *(bool *)field = b;
        return 0;
    }
    case PF_FLAG_STR:
        if (!*val) {
            seterr(err, errlen, "--%s: empty value", f->name);
            return -EINVAL;
        }
        free(*(char **)field);
        *(char **)field = strdup(val);
        return *(char **)field ? 0 : -ENOMEM;
    case PF_FLAG_ADDR:
        if (pf_addr_check(val, buf, sizeof(buf)) != 0) {
            seterr(err, errlen, "--%s: %s", f->name, buf);
            return -EINVAL;
        }
        free(*(char **)field);
        *(char **)field = strdup(val);
        return *(char **)field ? 0 : -ENOMEM;
    case PF_FLAG_STRLIST:
        return push_list_items((struct pf_strlist *)field, val, f, err, errlen);
    case PF_FLAG_SIZE: {
        uint64_t v;
        if (pf_parse_size(val, &v) != 0) {
            seterr(err, errlen,
                   "--%s: invalid size '%s' (expected a number with an optional unit b, kb, mb, "
                   "gb or tb, e.g. 512mb or 1.5gb)",
                   f->name, val);
            return -EINVAL;
        }
        if (v < f->min || (f->max && v > f->max)) {
            char a[32], b[32];
            pf_format_size(f->min, a, sizeof(a));
            pf_format_size(f->max, b, sizeof(b));
            seterr(err, errlen, "--%s: size '%s' out of range [%s, %s]", f->name, val, a,
                   f->max ? b : "unlimited");
            return -EINVAL;
        }
        *(uint64_t *)field = v;
        return 0;
    }
    case PF_FLAG_U64: {
        uint64_t v;
        if (pf_parse_u64(val, &v) != 0) {
            seterr(err, errlen, "--%s: '%s' is not a non-negative integer", f->name, val);
            return -EINVAL;
        }
        if (v < f->min || (f->max && v > f->max)) {
            seterr(err, errlen, "--%s: %s out of range [%llu, %llu]", f->name, val,
                   (unsigned long long)f->min, (unsigned long long)f->max);
            return -EINVAL;
        }
        *(uint64_t *)field = v;
        return 0;
    }
    case PF_FLAG_DOUBLE: {
        char *end;
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v)) {
            seterr(err, errlen, "--%s: '%s' is not a number", f->name, val);
            return -EINVAL;
        }
        if (v < f->dmin || v > f->dmax) {
            seterr(err, errlen, "--%s: %s out of range [%g, %g]", f->name, val, f->dmin, f->dmax);
            return -EINVAL;
        }
        *(double *)field = v;
        return 0;
    }
    case PF_FLAG_LOGLEVEL: {
        enum pf_log_level lvl;
        if (pf_log_level_parse(val, &lvl) != 0) {
            seterr(err, errlen,
                   "--%s: unknown log level '%s' (expected trace, debug, info, warn or error)",
                   f->name, val);
            return -EINVAL;
        }
        *(enum pf_log_level *)field = lvl;
        return 0;
    }
    }
    return -EINVAL;
}

static bool is_flag_arg(const char *a)
{
    return a[0] == '-' && a[1] == '-' && a[2] != '\0';
}

int pf_flags_parse(const struct pf_flag *tab, size_t n, void *cfg, int argc, char **argv, char *err,
                   size_t errlen)
{
    if (n > MAX_FLAGS) {
        seterr(err, errlen, "internal: too many flags");
        return -EINVAL;
    }
    memset(given, 0, sizeof(given));
    for (size_t i = 0; i < n; i++) {
        if (tab[i].defval && set_value(&tab[i], cfg, tab[i].defval, err, errlen) != 0)
            return -EINVAL;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0)
            return 2;
        if (!is_flag_arg(a)) {
            seterr(err, errlen, "unexpected argument '%s' (flags start with --; see --help)", a);
            return -EINVAL;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        const struct pf_flag *f = find_flag(tab, n, name, nl);
        if (!f) {
            seterr(err, errlen, "--%.*s: unknown flag (see --help)", (int)nl, name);
            return -EINVAL;
        }
        size_t idx = (size_t)(f - tab);
        if (f->type == PF_FLAG_STRLIST && !given[idx]) /* first use replaces the default */
            pf_strlist_free((struct pf_strlist *)((char *)cfg + f->off));
        if (given[idx] && f->type != PF_FLAG_STRLIST) {
            seterr(err, errlen, "--%s: given more than once", f->name);
            return -EINVAL;
        }
        given[idx] = true;
        if (eq) {
            if (set_value(f, cfg, eq + 1, err, errlen) != 0)
                return -EINVAL;
            continue;
        }
        if (f->type == PF_FLAG_BOOL) {
            bool b;
            if (i + 1 < argc && pf_parse_bool(argv[i + 1], &b) == 0) {
                *(bool *)((char *)cfg + f->off) = b;
                i++;
            } else {
                *(bool *)((char *)cfg + f->off) = true;
            }
            continue;
        }
        if (i + 1 >= argc || is_flag_arg(argv[i + 1])) {
            seterr(err, errlen, "--%s: missing value", f->name);
            return -EINVAL;
        }
        if (set_value(f, cfg, argv[++i], err, errlen) != 0)
            return -EINVAL;
        if (f->flags & PF_FLAGF_MULTI) {
            while (i + 1 < argc && !is_flag_arg(argv[i + 1])) {
                if (set_value(f, cfg, argv[++i], err, errlen) != 0)
                    return -EINVAL;
            }
        }
    }
    return 0;
}

bool pf_flags_given(const struct pf_flag *tab, size_t n, const char *name)
{
    for (size_t i = 0; i < n && i < MAX_FLAGS; i++)
        if (strcmp(tab[i].name, name) == 0)
            return given[i];
    return false;
}

void pf_flags_free(const struct pf_flag *tab, size_t n, void *cfg)
{
    for (size_t i = 0; i < n; i++) {
        char *field = (char *)cfg + tab[i].off;
        if (tab[i].type == PF_FLAG_STR || tab[i].type == PF_FLAG_ADDR) {
            free(*(char **)field);
            *(char **)field = NULL;
        } else if (tab[i].type == PF_FLAG_STRLIST) {
            pf_strlist_free((struct pf_strlist *)field);
        }
    }
}

static void usage_flag(FILE *out, const struct pf_flag *f)
{
    char left[96];
    if (f->type == PF_FLAG_BOOL && !f->metavar)
        snprintf(left, sizeof(left), "--%s", f->name);
    else
        snprintf(left, sizeof(left), "--%s <%s>", f->name, f->metavar ? f->metavar : "VALUE");
    fprintf(out, "  %-38s %s", left, f->help);
    if (f->defval)
        fprintf(out, " (default: %s)", f->defval);
    fputc('\n', out);
}

static void usage_tail(FILE *out)
{
    fprintf(out, "  %-38s %s\n  %-38s %s\n", "--help", "Print this help and exit", "--version",
            "Print the version (the client_version clients must send) and exit");
}

void pf_flags_usage(FILE *out, const char *prog, const char *summary, const struct pf_flag *tab,
                    size_t n)
{
    fprintf(out, "Usage: %s [flags]\n\n%s\n\nFlags:\n", prog, summary);
    for (size_t i = 0; i < n; i++)
        if (!(tab[i].flags & PF_FLAGF_HIDDEN))
            usage_flag(out, &tab[i]);
    usage_tail(out);
}

static bool in_groups(const struct pf_flag_group *groups, size_t ngroups, const char *name)
{
    for (size_t g = 0; g < ngroups; g++)
        for (const char *const *p = groups[g].names; *p; p++)
            if (strcmp(*p, name) == 0)
                return true;
    return false;
}

void pf_flags_usage_grouped(FILE *out, const char *prog, const char *summary,
                            const struct pf_flag *tab, size_t n, const struct pf_flag_group *groups,
                            size_t ngroups)
{
    fprintf(out, "Usage: %s [flags]\n\n%s\n", prog, summary);
    for (size_t g = 0; g < ngroups; g++) {
        fprintf(out, "\n%s:\n", groups[g].title);
        for (const char *const *p = groups[g].names; *p; p++) {
            const struct pf_flag *f = find_flag(tab, n, *p, strlen(*p));
            if (f && !(f->flags & PF_FLAGF_HIDDEN))
                usage_flag(out, f);
        }
    }
    bool other = false;
    for (size_t i = 0; i < n; i++) {
        if ((tab[i].flags & PF_FLAGF_HIDDEN) || in_groups(groups, ngroups, tab[i].name))
            continue;
        if (!other)
            fprintf(out, "\nOther flags:\n");
        other = true;
        usage_flag(out, &tab[i]);
    }
    fprintf(out, "\nGeneral:\n");
    usage_tail(out);
}

/* Command-line flags: a declarative table per binary, a parser that fills a config struct,
 * and value parsers (sizes, durations, addresses) shared with the HTTP/RPC layers.
 *
 * Syntax accepted: --name value, --name=value; boolean switches as --name, --name=false or
 * --name false; PF_FLAG_MULTI lists as --nics a,b or --nics a b (values up to the next
 * "--" argument) and may repeat. Every error is one line naming the flag and the problem,
 * written into the caller's buffer; binaries print it and exit 2. */
#ifndef PF_CONFIG_H
#define PF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum pf_flag_type {
    PF_FLAG_BOOL,     /* bool */
    PF_FLAG_STR,      /* char * (strdup'ed; NULL when unset and no default) */
    PF_FLAG_STRLIST,  /* struct pf_strlist */
    PF_FLAG_SIZE,     /* uint64_t bytes, "30gb", "1.5GB", "512" */
    PF_FLAG_U64,      /* uint64_t within [min, max] */
    PF_FLAG_DOUBLE,   /* double within [min, max] (as doubles: dmin/dmax) */
    PF_FLAG_LOGLEVEL, /* enum pf_log_level */
    PF_FLAG_ADDR,     /* char * "host:port", validated and resolvable */
};

#define PF_FLAGF_MULTI  0x1u /* STRLIST: comma/space separated, several args, repeatable */
#define PF_FLAGF_HIDDEN 0x2u /* not listed by --help */

struct pf_strlist {
    char **v;
    size_t n;
};

struct pf_flag {
    const char *name; /* without the leading "--" */
    enum pf_flag_type type;
    size_t off; /* offsetof(config struct, field) */
    const char *defval;
    const char *metavar;
    const char *help;
    uint64_t min, max;
    double dmin, dmax;
    unsigned flags;
};

/* Parses argv[1..] into cfg. Defaults are applied first. Returns 0, 1 when --help or
 * --version was requested (the caller prints and exits 0), or -EINVAL with err filled. */
int pf_flags_parse(const struct pf_flag *tab, size_t n, void *cfg, int argc, char **argv, char *err,
                   size_t errlen);
/* Was the flag given on the command line (after the last pf_flags_parse)? */
bool pf_flags_given(const struct pf_flag *tab, size_t n, const char *name);
/* Frees strings and lists the parser allocated in cfg. */
void pf_flags_free(const struct pf_flag *tab, size_t n, void *cfg);
/* --help text: one entry per flag with metavar, default and help. */
void pf_flags_usage(FILE *out, const char *prog, const char *summary, const struct pf_flag *tab,
                    size_t n);

/* A --help section: a title and the names (without "--") of the flags listed under it, in
 * that order, NULL-terminated. */
struct pf_flag_group {
    const char *title;
    const char *const *names;
};
/* --help text in sections: each group's flags under its title, in the groups' order; visible
 * flags no group names are listed last under "Other flags", so a new flag is never hidden.
 * A name that is not in tab is skipped (the caller's tests catch it). */
void pf_flags_usage_grouped(FILE *out, const char *prog, const char *summary,
                            const struct pf_flag *tab, size_t n, const struct pf_flag_group *groups,
                            size_t ngroups);

void pf_strlist_free(struct pf_strlist *l);
int pf_strlist_push(struct pf_strlist *l, const char *s);

/* "30gb", "1.5GB", "512kb", "4096", "2 MiB": binary multiples, case-insensitive. */
int pf_parse_size(const char *s, uint64_t *bytes_p);
/* Formats bytes as "30gb"/"512mb"/"1.5gb"/"123b" into buf. */
void pf_format_size(uint64_t bytes, char *buf, size_t len);
int pf_parse_u64(const char *s, uint64_t *v_p);
int pf_parse_bool(const char *s, bool *v_p);

/* host:port split. host may be [ipv6]. port 0..65535. Returns 0 or -EINVAL. The outputs
 * are written into caller buffers. */
int pf_addr_split(const char *addr, char *host, size_t hostlen, uint16_t *port_p);
/* Resolves host (numeric or name). Returns 0, -EINVAL (bad form) or -EHOSTUNREACH. */
int pf_addr_check(const char *addr, char *err, size_t errlen);
/* True when the host is not usable as an address that other nodes connect to:
 * unspecified (0.0.0.0, ::), 127.0.0.1, ::1 or "localhost". Other 127/8 addresses are
 * accepted so single-host simulations can give nodes distinct identities. */
bool pf_addr_is_unroutable(const char *addr);
/* "http://h:p", "h:p" -> "h:p" in out. "https://" and other schemes are -EPROTONOSUPPORT. */
int pf_url_to_target(const char *url, char *out, size_t outlen);

#endif

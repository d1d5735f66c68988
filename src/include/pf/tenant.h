/* Tenants bound to credentials (docs/security.md "Tenants").
 *
 * A tenants file (--tenants-file) maps a tenant token to a tenant name, the namespaces the
 * tenant may register (exact names, or prefixes written NAME*) and byte quotas in the RAM
 * pool and on the SSD. One tenant per line, whitespace-separated key=value fields:
 *
 *     # comment
 *     tenant=acme token=0123456789abcdef0123 namespaces=acme,acme-* ram=4gb ssd=64gb
 *
 * Parsing is strict: every problem is an error naming the line (unknown or repeated key,
 * missing tenant/token/namespaces, a bad name, token or size, a duplicate tenant or token,
 * a namespace rule of two tenants that can match the same namespace). Namespace rules of
 * different tenants never overlap, so every namespace belongs to at most one tenant.
 *
 * Two layers:
 *  - struct pf_tenants: one parsed file, immutable after parsing (share freely, free once);
 *  - struct pf_tenancy: the server's live state: the current pf_tenants (replaced whole by
 *    pf_tenancy_reload, e.g. on SIGHUP; on a bad file the old set stays), which tenant
 *    registered each instance, the Save quota hook for the engine, and the per-tenant
 *    metrics. Thread-safe. */
#ifndef PF_TENANT_H
#define PF_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PF_TENANT_MD        "pf-tenant-token" /* = PF_AUTH_TENANT_MD (pf/auth.h) */
#define PF_TENANT_NAME_MAX  64                /* [A-Za-z0-9_.-], 1..64 bytes */
#define PF_TENANT_TOKEN_MIN 16                /* printable ASCII without spaces */
#define PF_TENANT_TOKEN_MAX 4096
#define PF_TENANT_FILE_MAX  (1u << 20) /* bytes of a tenants file */
#define PF_TENANT_RULES_MAX 64         /* namespace rules per tenant */
#define PF_TENANT_MAX       1024       /* tenants per file */

struct pf_tenant_rule {
    char *pat;   /* namespace, or the prefix without its '*' */
    bool prefix; /* written "pat*" */
};

struct pf_tenant {
    char *name;
    char *token;
    size_t toklen;
    struct pf_tenant_rule *rules;
    size_t nrules;
    uint64_t ram_quota; /* bytes; 0 = unlimited */
    uint64_t ssd_quota; /* bytes; 0 = unlimited */
    unsigned line;
};

struct pf_tenants {
    struct pf_tenant *t;
    size_t n;
};

/* Parses len bytes of text (need not be NUL-terminated). what names the source in errors
 * ("FILE:LINE: ..."). Errors: -EINVAL with one line in err; -ENOMEM. *t_p on success only. */
int pf_tenants_parse(const char *text, size_t len, const char *what, struct pf_tenants **t_p,
                     char *err, size_t errlen);
/* Reads and parses a tenants file. The file must be a regular file of at most
 * PF_TENANT_FILE_MAX bytes; one that other users can read is accepted with a warning (as the
 * token files, docs/security.md). -errno of open/read with a message naming the file. */
int pf_tenants_load(const char *path, struct pf_tenants **t_p, char *err, size_t errlen);
/* Frees and wipes the tokens. Accepts NULL. */
void pf_tenants_free(struct pf_tenants *t);

/* The tenant whose token equals tok[0..len) (constant time per configured token), or NULL. */
const struct pf_tenant *pf_tenants_by_token(const struct pf_tenants *t, const void *tok,
                                            size_t len);
const struct pf_tenant *pf_tenants_by_name(const struct pf_tenants *t, const char *name);
/* The tenant one of whose rules matches ns, or NULL. */
const struct pf_tenant *pf_tenants_by_namespace(const struct pf_tenants *t, const char *ns);
bool pf_tenant_allows(const struct pf_tenant *t, const char *ns);

/* ---------------------------------------------------------------- live state */

struct pf_engine;
struct pf_tenancy;

/* Loads path (pf_tenants_load) and registers the per-tenant metrics. */
int pf_tenancy_create(const char *path, struct pf_tenancy **tc_p, char *err, size_t errlen);
/* Installs the engine's Save quota hook and the RAM bytes gauge (before serving). */
void pf_tenancy_attach(struct pf_tenancy *tc, struct pf_engine *e);
/* Installs the SSD writer's quota hook (pf_ssd_quota) and the SSD bytes gauge; s must
 * outlive the tenancy (pf_tenancy_destroy removes the hook). */
struct pf_ssd;
void pf_tenancy_attach_ssd(struct pf_tenancy *tc, struct pf_ssd *s);
/* Re-reads the file. On success the new set replaces the old one (instances keep their
 * tenant by name: a tenant removed from the file has its calls refused) and a line
 * "tenants reloaded from PATH: N tenant(s)" is logged; pegaflow_tenant_reloads_total
 * {result} counts both outcomes. On error the old set stays, err says why. */
int pf_tenancy_reload(struct pf_tenancy *tc, char *err, size_t errlen);
/* Detaches from the engine (quota hook and gauge) and frees. Accepts NULL. */
void pf_tenancy_destroy(struct pf_tenancy *tc);

/* What a worker RPC asks (pf_tenancy_check). */
enum pf_tenant_op {
    PF_TENANT_OP_REGISTER, /* ns is the requested namespace */
    PF_TENANT_OP_INSTANCE, /* Save, QueryPrefetch, Load, UnregisterContext */
    PF_TENANT_OP_SESSION,  /* Session: the instance is this tenant's (registered by it); a
                            * session for an id nobody registered yet is refused, so that
                            * closing it can never end another tenant's instance */
    PF_TENANT_OP_ANY,      /* Release: a valid token suffices (the lease is the capability) */
};

/* Checks a worker call carrying token tok[0..len) (tok NULL: none). Returns 0, or:
 *  -ENOKEY  no token / a token not in the file        (UNAUTHENTICATED)
 *  -EACCES  the namespace is not allowed, or the instance belongs to another tenant
 *                                                     (PERMISSION_DENIED)
 * with a message naming the namespace/instance and the tenant. Refusals are counted in
 * pegaflow_tenant_refusals_total{tenant,reason}. On success the tenant's name is copied
 * into tenant (PF_TENANT_NAME_MAX + 1 bytes, may be NULL). */
int pf_tenancy_check(struct pf_tenancy *tc, enum pf_tenant_op op, const void *tok, size_t len,
                     const char *instance_id, const char *ns, char *tenant, char *err,
                     size_t errlen);
/* After a successful Register: the instance belongs to tenant from now on. */
void pf_tenancy_bind(struct pf_tenancy *tc, const char *instance_id, const char *tenant);
/* Held by a Register from its check to its bind: two tenants registering one free instance
 * id at once cannot both pass the check. */
void pf_tenancy_register_lock(struct pf_tenancy *tc);
void pf_tenancy_register_unlock(struct pf_tenancy *tc);
/* A Query of tenant answered hits blocks (pegaflow_tenant_hit_blocks_total). */
void pf_tenancy_count_hits(struct pf_tenancy *tc, const char *tenant, uint64_t hits);

#endif

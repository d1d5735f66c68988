/* Fault plan: parser for the --fault-spec / PEGAFLOW_FAULTS string and the per-call
 * decision used by the faulty: decorators. One mutex guards the RNG and rule counters;
 * decisions are rare enough (one per HAL op) that contention does not matter. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PF_LOG_MOD "fault"
#include "pf/clock.h"
#include "pf/config.h"
#include "pf/fault.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/util.h"

#define MAX_RULES 32

struct rule {
    char op[32];
    bool wildcard; /* op is a prefix ("gpu.") */
    double prob;
    uint64_t nth;
    uint64_t times; /* 0 = unlimited */
    struct pf_fault_hit act;
    uint64_t calls, fired;
};

struct pf_fault_plan {
    pthread_mutex_t mu;
    struct rule rules[MAX_RULES];
    size_t n;
    uint64_t seed;
    uint64_t rng;
    uint64_t fired;
    char *spec;
};

static const char *const known_ops[] = {
    "gpu.d2h",     "gpu.h2d",     "gpu.ipc_open", "gpu.host_register", "gpu.sync", "net.read",
    "net.connect", "net.reg_mem", "blk.write",    "blk.read",          "blk.open", "engine.seal",
};

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

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool op_known(const char *op, bool *wildcard)
{
    size_t l = strlen(op);
    *wildcard = l >= 2 && strcmp(op + l - 2, ".*") == 0;
    if (*wildcard)
        return strcmp(op, "gpu.*") == 0 || strcmp(op, "net.*") == 0 || strcmp(op, "blk.*") == 0;
    for (size_t i = 0; i < PF_ARRAY_SIZE(known_ops); i++)
        if (strcmp(op, known_ops[i]) == 0)
            return true;
    return false;
}

static int parse_rule(struct rule *r, char *clause, char *err, size_t errlen)
{
    char *colon = strchr(clause, ':');
    char *opname = pf_strtrim(clause);
    char *params = NULL;
    if (colon) {
        *colon = '\0';
        opname = pf_strtrim(clause);
        params = colon + 1;
    }
    if (!op_known(opname, &r->wildcard)) {
        seterr(err, errlen,
               "fault spec: unknown op '%s' (known: gpu.d2h gpu.h2d gpu.ipc_open "
               "gpu.host_register gpu.sync net.read net.connect net.reg_mem blk.write blk.read "
               "blk.open, or gpu.* net.* blk.*)",
               opname);
        return -EINVAL;
    }
    snprintf(r->op, sizeof(r->op), "%.*s", (int)(strlen(opname) - (r->wildcard ? 1 : 0)), opname);
    r->prob = 1.0;
    r->nth = 1;
    bool has_prob = false, has_nth = false, has_times = false, has_action = false;
    char *save = NULL;
    for (char *kv = params ? strtok_r(params, ",", &save) : NULL; kv;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            seterr(err, errlen, "fault spec: '%s' in %s is not key=value", pf_strtrim(kv), opname);
            return -EINVAL;
        }
        *eq = '\0';
        char *k = pf_strtrim(kv), *v = pf_strtrim(eq + 1);
        uint64_t u;
        bool b;
        if (strcmp(k, "prob") == 0) {
            char *end;
            double p = strtod(v, &end);
            if (*end || end == v || p < 0 || p > 1) {
                seterr(err, errlen, "fault spec: %s prob=%s is not in [0, 1]", opname, v);
                return -EINVAL;
            }
            r->prob = p;
            has_prob = true;
        } else if (strcmp(k, "nth") == 0 || strcmp(k, "times") == 0 || strcmp(k, "delay") == 0 ||
                   strcmp(k, "stall") == 0) {
            if (pf_parse_u64(v, &u) != 0 ||
                (strcmp(k, "delay") != 0 && strcmp(k, "stall") != 0 && u == 0)) {
                seterr(err, errlen, "fault spec: %s %s=%s is not a positive integer", opname, k, v);
                return -EINVAL;
            }
            if (k[0] == 'n') {
                r->nth = u;
                has_nth = true;
            } else if (k[0] == 't') {
                r->times = u;
                has_times = true;
            } else if (k[0] == 's') {
                r->act.stall_ms = u;
                has_action = true;
            } else {
                r->act.delay_ms = u;
                has_action = true;
            }
        } else if (strcmp(k, "error") == 0) {
            int e;
            if (pf_errno_parse(v, &e) != 0) {
                seterr(err, errlen, "fault spec: %s error=%s is not an errno name", opname, v);
                return -EINVAL;
            }
            r->act.error = -e;
            has_action = true;
        } else if (strcmp(k, "at") == 0) {
            if (strcmp(v, "post") == 0)
                r->act.at_complete = false;
            else if (strcmp(v, "complete") == 0)
                r->act.at_complete = true;
            else {
                seterr(err, errlen, "fault spec: %s at=%s (expected post or complete)", opname, v);
                return -EINVAL;
            }
        } else if (strcmp(k, "corrupt") == 0 || strcmp(k, "drop") == 0 || strcmp(k, "fatal") == 0) {
            if (pf_parse_bool(v, &b) != 0) {
                seterr(err, errlen, "fault spec: %s %s=%s is not 0 or 1", opname, k, v);
                return -EINVAL;
            }
            if (k[0] == 'c')
                r->act.corrupt = b;
            else if (k[0] == 'd')
                r->act.drop = b;
            else
                r->act.fatal = b;
            has_action = has_action || b;
        } else {
            seterr(err, errlen,
                   "fault spec: unknown key '%s' in %s (known: prob nth times error at delay "
                   "stall corrupt drop fatal)",
                   k, opname);
            return -EINVAL;
        }
    }
    if (r->act.stall_ms && strcmp(r->op, "net.read") != 0) {
        seterr(err, errlen,
               "fault spec: stall=MS is for net.read only (it holds a READ's submission; "
               "use delay=MS on %s)",
               opname);
        return -EINVAL;
    }
    if (!has_action || (r->act.error == 0 && !r->act.corrupt && !r->act.drop && !r->act.fatal &&
                        r->act.delay_ms == 0 && r->act.stall_ms == 0 && r->act.at_complete))
        r->act.error = -EIO;
    if (r->act.fatal && r->act.error == 0)
        r->act.error = -EIO;
    if (strcmp(r->op, "engine.seal") == 0 &&
        (r->act.delay_ms == 0 || r->act.error || r->act.corrupt || r->act.drop || r->act.fatal ||
         r->act.at_complete)) {
        seterr(err, errlen,
               "fault spec: engine.seal takes delay=MS only (it postpones when saved blocks "
               "become visible; nothing there can fail)");
        return -EINVAL;
    }
    if (!has_times && has_nth && !has_prob)
        r->times = 1;
    return 0;
}

int pf_fault_plan_parse(const char *spec, struct pf_fault_plan **plan_p, char *err, size_t errlen)
{
    struct pf_fault_plan *p = calloc(1, sizeof(*p));
    char *copy = strdup(spec ? spec : "");
    int rc = -ENOMEM;
    if (!p || !copy)
        goto err_free;
    pthread_mutex_init(&p->mu, NULL);
    bool seeded = false;
    char *save = NULL;
    for (char *cl = strtok_r(copy, ";", &save); cl; cl = strtok_r(NULL, ";", &save)) {
        cl = pf_strtrim(cl);
        if (!*cl)
            continue;
        if (strncmp(cl, "seed=", 5) == 0) {
            if (pf_parse_u64(cl + 5, &p->seed) != 0) {
                seterr(err, errlen, "fault spec: seed=%s is not an integer", cl + 5);
                rc = -EINVAL;
                goto err_free;
            }
            seeded = true;
            continue;
        }
        if (p->n == MAX_RULES) {
            seterr(err, errlen, "fault spec: more than %d rules", MAX_RULES);
            rc = -EINVAL;
            goto err_free;
        }
        rc = parse_rule(&p->rules[p->n], cl, err, errlen);
        if (rc)
            goto err_free;
        p->n++;
    }
    if (p->n == 0) {
        seterr(err, errlen, "fault spec: no rules in '%s'", spec ? spec : "");
        rc = -EINVAL;
        goto err_free;
    }
    if (!seeded) {
        const char *env = getenv("PEGAFLOW_FAULT_SEED");
        if (!env || pf_parse_u64(env, &p->seed) != 0)
            p->seed = pf_wall_ns() ^ (uint64_t)getpid();
    }
    p->rng = p->seed;
    p->spec = strdup(spec);
    free(copy);
    *plan_p = p;
    return 0;
err_free:
    free(copy);
    if (p)
        pthread_mutex_destroy(&p->mu);
    free(p);
    return rc;
}

void pf_fault_plan_free(struct pf_fault_plan *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->mu);
    free(p->spec);
    free(p);
}

uint64_t pf_fault_plan_seed(const struct pf_fault_plan *p)
{
    return p ? p->seed : 0;
}

const char *pf_fault_plan_spec(const struct pf_fault_plan *p)
{
    return p && p->spec ? p->spec : "";
}

bool pf_fault_plan_covers(const struct pf_fault_plan *p, const char *cls)
{
    if (!p)
        return false;
    size_t l = strlen(cls);
    for (size_t i = 0; i < p->n; i++)
        if (strncmp(p->rules[i].op, cls, l) == 0 && p->rules[i].op[l] == '.')
            return true;
    return false;
}

static void count_metric(const char *op, const struct pf_fault_hit *h)
{
    static struct pf_metric *m;
    if (!m)
        m = pf_metric_counter("pegaflow_faults_injected_total",
                              "Faults injected by the fault plan (--fault-spec)", "op,kind");
    const char *kind = h->fatal      ? "fatal"
                       : h->drop     ? "drop"
                       : h->corrupt  ? "corrupt"
                       : h->error    ? (h->at_complete ? "error_complete" : "error_post")
                       : h->stall_ms ? "stall"
                                     : "delay";
    pf_child_add(pf_metric_child2(m, op, kind), 1);
}

bool pf_fault_check(struct pf_fault_plan *p, const char *op, struct pf_fault_hit *hit)
{
    memset(hit, 0, sizeof(*hit));
    if (!p)
        return false;
    bool fired = false;
    pthread_mutex_lock(&p->mu);
    /* every matching rule counts the call; the first one that fires decides */
    for (size_t i = 0; i < p->n; i++) {
        struct rule *r = &p->rules[i];
        bool match = r->wildcard ? strncmp(op, r->op, strlen(r->op)) == 0 : strcmp(op, r->op) == 0;
        if (!match)
            continue;
        r->calls++;
        if (fired || r->calls < r->nth)
            continue;
        if (r->times && r->fired >= r->times)
            continue;
        if (r->prob < 1.0) {
            double u = (double)(splitmix(&p->rng) >> 11) / 9007199254740992.0;
            if (u >= r->prob)
                continue;
        }
        r->fired++;
        p->fired++;
        *hit = r->act;
        fired = true;
    }
    pthread_mutex_unlock(&p->mu);
    if (fired) {
        count_metric(op, hit);
        pf_debug("injected fault on %s: error=%s delay=%llums stall=%llums corrupt=%d drop=%d "
                 "fatal=%d",
                 op, hit->error ? pf_errno_name(hit->error) : "-",
                 (unsigned long long)hit->delay_ms, (unsigned long long)hit->stall_ms, hit->corrupt,
                 hit->drop, hit->fatal);
    }
    return fired;
}

void pf_fault_corrupt(struct pf_fault_plan *p, void *buf, size_t len)
{
    if (!len)
        return;
    uint8_t *b = buf;
    size_t flips = len < 8 ? len : 8;
    size_t stride = len / flips;
    pthread_mutex_lock(&p->mu);
    uint64_t r = splitmix(&p->rng);
    pthread_mutex_unlock(&p->mu);
    /* distinct bytes, each changed (XOR with a non-zero value): always a real corruption */
    for (size_t i = 0; i < flips; i++)
        b[i * stride + (size_t)(r % stride)] ^= 0xA5;
}

uint64_t pf_fault_fired(const struct pf_fault_plan *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    uint64_t f = p->fired;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return f;
}

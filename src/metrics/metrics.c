/* Process-global metric registry. Families live in a linked list under a registry lock;
 * children (label-value combinations) in a per-family list under the family lock. Values
 * are doubles stored as atomic 64-bit words (add via CAS), so counters, gauges and sums
 * share one representation. Rendering walks everything under the locks. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "otlp_metrics.pb-c.h"
#include "pf/common.h"

#include "pf/metrics.h"
#include "metrics/metrics_internal.h"

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pf_metric *families;
static struct pf_metric_child sink;

const double pf_buckets_rpc_seconds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                         0.05,   0.1,   0.25,   0.5,   1.0,  2.0};
const size_t pf_buckets_rpc_seconds_n = sizeof(pf_buckets_rpc_seconds) / sizeof(double);
const double pf_buckets_io_seconds[] = {0.01, 0.025, 0.05, 0.1,  0.25, 0.5,
                                        1.0,  2.5,   5.0,  10.0, 30.0, 60.0};
const size_t pf_buckets_io_seconds_n = sizeof(pf_buckets_io_seconds) / sizeof(double);

static inline void add_d(_Atomic uint64_t *w, double v)
{
    uint64_t old = atomic_load_explicit(w, memory_order_relaxed), nw;
    do {
        double d;
        memcpy(&d, &old, sizeof(d));
        d += v;
        memcpy(&nw, &d, sizeof(nw));
    } while (!atomic_compare_exchange_weak_explicit(w, &old, nw, memory_order_relaxed,
                                                    memory_order_relaxed));
}

static inline void set_d(_Atomic uint64_t *w, double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    atomic_store_explicit(w, b, memory_order_relaxed);
}

static size_t split_labels(const char *labels, char **out)
{
    if (!labels || !*labels)
        return 0;
    size_t n = 0;
    const char *p = labels;
    while (*p && n < PF_METRIC_MAX_LABELS) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        out[n++] = strndup(p, l);
        if (!c)
            break;
        p = c + 1;
    }
    return n;
}

static struct pf_metric_child *child_new(struct pf_metric *m, const char *const *values)
{
    struct pf_metric_child *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->fam = m;
    for (size_t i = 0; i < m->nlabels; i++) {
        c->values[i] = strdup(values && values[i] ? values[i] : "");
        if (!c->values[i])
            goto err;
    }
    if (m->kind == K_HIST) {
        c->bucket_counts = calloc(m->nbuckets, sizeof(*c->bucket_counts));
        if (!c->bucket_counts)
            goto err;
    }
    return c;
err:
    for (size_t i = 0; i < m->nlabels; i++)
        free(c->values[i]);
    free(c);
    return NULL;
}

static struct pf_metric *fam_get(enum kind k, const char *name, const char *help,
                                 const char *labels, const double *buckets, size_t nb)
{
    pthread_mutex_lock(&reg_mu);
    struct pf_metric *m;
    for (m = families; m; m = m->next)
        if (strcmp(m->name, name) == 0)
            break;
    if (m) {
        pthread_mutex_unlock(&reg_mu);
        return m->kind == k ? m : NULL;
    }
    m = calloc(1, sizeof(*m));
    if (!m)
        goto out;
    m->kind = k;
    m->name = strdup(name);
    m->help = strdup(help ? help : "");
    m->nlabels = split_labels(labels, m->labels);
    pthread_mutex_init(&m->mu, NULL);
    if (k == K_HIST && nb) {
        m->buckets = malloc(nb * sizeof(double));
        if (m->buckets)
            memcpy(m->buckets, buckets, nb * sizeof(double));
        m->nbuckets = m->buckets ? nb : 0;
    }
    if (m->nlabels == 0 && k != K_GAUGE_FN)
        m->plain = child_new(m, NULL);
    /* append so rendering follows registration order */
    struct pf_metric **pp = &families;
    while (*pp)
        pp = &(*pp)->next;
    *pp = m;
out:
    pthread_mutex_unlock(&reg_mu);
    return m;
}

struct pf_metric *pf_metric_counter(const char *name, const char *help, const char *labels)
{
    return fam_get(K_COUNTER, name, help, labels, NULL, 0);
}

struct pf_metric *pf_metric_gauge(const char *name, const char *help, const char *labels)
{
    return fam_get(K_GAUGE, name, help, labels, NULL, 0);
}

struct pf_metric *pf_metric_histogram(const char *name, const char *help, const char *labels,
                                      const double *buckets, size_t nbuckets)
{
    return fam_get(K_HIST, name, help, labels, buckets, nbuckets);
}

struct pf_metric *pf_metric_gauge_fn(const char *name, const char *help, const char *labels,
                                     pf_metric_collect_fn fn, void *ctx)
{
    struct pf_metric *m = fam_get(K_GAUGE_FN, name, help, labels, NULL, 0);
    if (!m)
        return NULL;
    struct fn_entry *e = calloc(1, sizeof(*e));
    if (!e)
        return m;
    e->fn = fn;
    e->ctx = ctx;
    pthread_mutex_lock(&m->mu);
    e->next = m->fns;
    m->fns = e;
    pthread_mutex_unlock(&m->mu);
    return m;
}

void pf_metric_gauge_fn_clear(struct pf_metric *m, void *ctx)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    struct fn_entry **pp = &m->fns;
    while (*pp) {
        if ((*pp)->ctx == ctx) {
            struct fn_entry *e = *pp;
            *pp = e->next;
            free(e);
        } else {
            pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

struct pf_metric_child *pf_metric_child(struct pf_metric *m, const char *const *values)
{
    if (!m || m->kind == K_GAUGE_FN)
        return &sink;
    if (m->nlabels == 0)
        return m->plain ? m->plain : &sink;
    pthread_mutex_lock(&m->mu);
    struct pf_metric_child *c;
    for (c = m->children; c; c = c->next) {
        size_t i;
        for (i = 0; i < m->nlabels; i++)
            if (strcmp(c->values[i], values[i] ? values[i] : "") != 0)
                break;
        if (i == m->nlabels)
            break;
    }
    if (!c) {
        c = child_new(m, values);
        if (c) {
            struct pf_metric_child **pp = &m->children;
            while (*pp)
                pp = &(*pp)->next;
            *pp = c;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return c ? c : &sink;
}

struct pf_metric_child *pf_metric_child1(struct pf_metric *m, const char *v0)
{
    const char *v[1] = {v0};
    return pf_metric_child(m, v);
}

struct pf_metric_child *pf_metric_child2(struct pf_metric *m, const char *v0, const char *v1)
{
    const char *v[2] = {v0, v1};
    return pf_metric_child(m, v);
}

void pf_child_add(struct pf_metric_child *c, double v)
{
    if (c && c != &sink)
        add_d(&c->val, v);
}

void pf_child_set(struct pf_metric_child *c, double v)
{
    if (c && c != &sink)
        set_d(&c->val, v);
}

void pf_child_observe(struct pf_metric_child *c, double v)
{
    if (!c || c == &sink || !c->fam || c->fam->kind != K_HIST)
        return;
    struct pf_metric *m = c->fam;
    size_t i = 0;
    while (i < m->nbuckets && v > m->buckets[i])
        i++;
    if (i < m->nbuckets)
        atomic_fetch_add_explicit(&c->bucket_counts[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->count, 1, memory_order_relaxed);
    add_d(&c->val, v);
}

double pf_child_value(struct pf_metric_child *c)
{
    if (!c || c == &sink)
        return 0;
    if (c->fam && c->fam->kind == K_HIST)
        return (double)atomic_load(&c->count);
    return load_d(&c->val);
}

void pf_metric_add(struct pf_metric *m, double v)
{
    if (m)
        pf_child_add(m->plain, v);
}

void pf_metric_set(struct pf_metric *m, double v)
{
    if (m)
        pf_child_set(m->plain, v);
}

void pf_metric_observe(struct pf_metric *m, double v)
{
    if (m)
        pf_child_observe(m->plain, v);
}

double pf_metric_value(struct pf_metric *m)
{
    return m ? pf_child_value(m->plain) : 0;
}

double pf_metric_value_of(const char *name, const char *const *values)
{
    pthread_mutex_lock(&reg_mu);
    struct pf_metric *m;
    for (m = families; m; m = m->next)
        if (strcmp(m->name, name) == 0)
            break;
    pthread_mutex_unlock(&reg_mu);
    if (!m)
        return 0;
    if (m->nlabels == 0)
        return pf_metric_value(m);
    return pf_child_value(pf_metric_child(m, values));
}

/* ---- rendering ---- */

struct sbuf {
    char *p;
    size_t len, cap;
    int err;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->err)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->err = -EINVAL;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = (b->cap + (size_t)n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->err = -ENOMEM;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

static void sb_escaped(struct sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            sb_printf(b, "\\\\");
        else if (*s == '"')
            sb_printf(b, "\\\"");
        else if (*s == '\n')
            sb_printf(b, "\\n");
        else
            sb_printf(b, "%c", *s);
    }
}

static void sb_value(struct sbuf *b, double v)
{
    if (isnan(v))
        sb_printf(b, "NaN");
    else if (isinf(v))
        sb_printf(b, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        sb_printf(b, "%.0f", v);
    else
        sb_printf(b, "%.9g", v);
}

static void sb_labels(struct sbuf *b, struct pf_metric *m, char *const *values, const char *extra_k,
                      const char *extra_v)
{
    if (m->nlabels == 0 && !extra_k)
        return;
    sb_printf(b, "{");
    size_t i;
    for (i = 0; i < m->nlabels; i++) {
        sb_printf(b, "%s%s=\"", i ? "," : "", m->labels[i]);
        sb_escaped(b, values[i]);
        sb_printf(b, "\"");
    }
    if (extra_k)
        sb_printf(b, "%s%s=\"%s\"", i ? "," : "", extra_k, extra_v);
    sb_printf(b, "}");
}

const char *pf_metrics_sample_name(struct pf_metric *m, char *buf, size_t len)
{
    size_t n = strlen(m->name);
    if (m->kind == K_COUNTER && !(n >= 6 && strcmp(m->name + n - 6, "_total") == 0)) {
        snprintf(buf, len, "%s_total", m->name);
        return buf;
    }
    return m->name;
}

struct emit_ctx {
    struct sbuf *b;
    struct pf_metric *m;
    const char *name;
};

static void emit_fn(void *p, const char *const *label_values, double v)
{
    struct emit_ctx *e = p;
    char *vals[PF_METRIC_MAX_LABELS] = {0};
    for (size_t i = 0; i < e->m->nlabels; i++)
        vals[i] = (char *)(label_values && label_values[i] ? label_values[i] : "");
    sb_printf(e->b, "%s", e->name);
    sb_labels(e->b, e->m, vals, NULL, NULL);
    sb_printf(e->b, " ");
    sb_value(e->b, v);
    sb_printf(e->b, "\n");
}

static void render_child(struct sbuf *b, struct pf_metric *m, const char *name,
                         struct pf_metric_child *c)
{
    if (m->kind != K_HIST) {
        sb_printf(b, "%s", name);
        sb_labels(b, m, c->values, NULL, NULL);
        sb_printf(b, " ");
        sb_value(b, load_d(&c->val));
        sb_printf(b, "\n");
        return;
    }
    uint64_t cum = 0;
    char le[64];
    for (size_t i = 0; i < m->nbuckets; i++) {
        cum += atomic_load(&c->bucket_counts[i]);
        snprintf(le, sizeof(le), "%.9g", m->buckets[i]);
        sb_printf(b, "%s_bucket", name);
        sb_labels(b, m, c->values, "le", le);
        sb_printf(b, " %llu\n", (unsigned long long)cum);
    }
    /* an observation adds to its bucket before the count: a render between the two must
     * not show +Inf below a finite bucket */
    uint64_t count = atomic_load(&c->count);
    if (count < cum)
        count = cum;
    sb_printf(b, "%s_bucket", name);
    sb_labels(b, m, c->values, "le", "+Inf");
    sb_printf(b, " %llu\n", (unsigned long long)count);
    sb_printf(b, "%s_sum", name);
    sb_labels(b, m, c->values, NULL, NULL);
    sb_printf(b, " ");
    sb_value(b, load_d(&c->val));
    sb_printf(b, "\n%s_count", name);
    sb_labels(b, m, c->values, NULL, NULL);
    sb_printf(b, " %llu\n", (unsigned long long)count);
}

int pf_metrics_render(char **out, size_t *len)
{
    struct sbuf b = {0};
    b.cap = 16384;
    b.p = malloc(b.cap);
    if (!b.p)
        return -ENOMEM;
    b.p[0] = '\0';
    pthread_mutex_lock(&reg_mu);
    for (struct pf_metric *m = families; m; m = m->next) {
        char nbuf[256];
        const char *name = pf_metrics_sample_name(m, nbuf, sizeof(nbuf));
        static const char *types[] = {"counter", "gauge", "histogram", "gauge"};
        sb_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, m->help, name, types[m->kind]);
        pthread_mutex_lock(&m->mu);
        if (m->kind == K_GAUGE_FN) {
            struct emit_ctx e = {&b, m, name};
            for (struct fn_entry *f = m->fns; f; f = f->next)
                f->fn(f->ctx, emit_fn, &e);
        } else if (m->plain) {
            render_child(&b, m, name, m->plain);
        } else {
            for (struct pf_metric_child *c = m->children; c; c = c->next)
                render_child(&b, m, name, c);
        }
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_unlock(&reg_mu);
    if (b.err) {
        free(b.p);
        return b.err;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

struct pf_metric *pf_metrics_registry_lock(void)
{
    pthread_mutex_lock(&reg_mu);
    return families;
}

void pf_metrics_registry_unlock(void)
{
    pthread_mutex_unlock(&reg_mu);
}

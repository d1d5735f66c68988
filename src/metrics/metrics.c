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

enum kind { K_COUNTER, K_GAUGE, K_HIST, K_GAUGE_FN };

struct pf_metric_child {
    struct pf_metric_child *next;
    struct pf_metric *fam;
    char *values[PF_METRIC_MAX_LABELS];
    _Atomic uint64_t val; /* double bits: counter/gauge value or histogram sum */
    _Atomic uint64_t count;
    _Atomic uint64_t *bucket_counts; /* histogram: nbuckets (non-cumulative) */
};

struct fn_entry {
    struct fn_entry *next;
    pf_metric_collect_fn fn;
    void *ctx;
};

struct pf_metric {
    struct pf_metric *next;
    enum kind kind;
    char *name;
    char *help;
    char *labels[PF_METRIC_MAX_LABELS];
    size_t nlabels;
    double *buckets;
    size_t nbuckets;
    pthread_mutex_t mu;
    struct pf_metric_child *children;
    struct pf_metric_child *plain; /* the child of an unlabelled family */
    struct fn_entry *fns;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pf_metric *families;
static struct pf_metric_child sink;

const double pf_buckets_rpc_seconds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                         0.05,   0.1,   0.25,   0.5,   1.0,  2.0};
const size_t pf_buckets_rpc_seconds_n = sizeof(pf_buckets_rpc_seconds) / sizeof(double);
const double pf_buckets_io_seconds[] = {0.01, 0.025, 0.05, 0.1,  0.25, 0.5,
                                        1.0,  2.5,   5.0,  10.0, 30.0, 60.0};
const size_t pf_buckets_io_seconds_n = sizeof(pf_buckets_io_seconds) / sizeof(double);

static inline double load_d(_Atomic uint64_t *w)
{
    uint64_t b = atomic_load_explicit(w, memory_order_relaxed);
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

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

static const char *sample_name(struct pf_metric *m, char *buf, size_t len)
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
        const char *name = sample_name(m, nbuf, sizeof(nbuf));
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

/* ---- OTLP/JSON rendering ---- */

struct otlp_emit {
    cJSON *points;
    struct pf_metric *m;
    char ts[32];
};

static cJSON *otlp_attrs(struct pf_metric *m, char *const *values)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < m->nlabels; i++) {
        cJSON *kv = cJSON_CreateObject();
        cJSON_AddStringToObject(kv, "key", m->labels[i]);
        cJSON *v = cJSON_AddObjectToObject(kv, "value");
        cJSON_AddStringToObject(v, "stringValue", values[i] ? values[i] : "");
        cJSON_AddItemToArray(a, kv);
    }
    return a;
}

static void otlp_point(cJSON *points, struct pf_metric *m, struct pf_metric_child *c,
                       const char *start, const char *now)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddItemToObject(p, "attributes", otlp_attrs(m, c->values));
    cJSON_AddStringToObject(p, "startTimeUnixNano", start);
    cJSON_AddStringToObject(p, "timeUnixNano", now);
    if (m->kind == K_HIST) {
        char buf[32];
        /* buckets first, then the count (an observation adds to its bucket before the
         * count): count and bucketCounts stay consistent, the overflow bucket never wraps */
        cJSON *bc = cJSON_CreateArray();
        uint64_t total = 0;
        for (size_t i = 0; i < m->nbuckets; i++) {
            uint64_t v = atomic_load(&c->bucket_counts[i]);
            total += v;
            snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
            cJSON_AddItemToArray(bc, cJSON_CreateString(buf));
        }
        uint64_t count = atomic_load(&c->count);
        if (count < total)
            count = total;
        snprintf(buf, sizeof(buf), "%llu", (unsigned long long)(count - total));
        cJSON_AddItemToArray(bc, cJSON_CreateString(buf));
        snprintf(buf, sizeof(buf), "%llu", (unsigned long long)count);
        cJSON_AddStringToObject(p, "count", buf);
        cJSON_AddNumberToObject(p, "sum", load_d(&c->val));
        cJSON_AddItemToObject(p, "bucketCounts", bc);
        cJSON *eb = cJSON_AddArrayToObject(p, "explicitBounds");
        for (size_t i = 0; i < m->nbuckets; i++)
            cJSON_AddItemToArray(eb, cJSON_CreateNumber(m->buckets[i]));
    } else {
        cJSON_AddNumberToObject(p, "asDouble", load_d(&c->val));
    }
    cJSON_AddItemToArray(points, p);
}

static void otlp_emit_fn(void *ctx, const char *const *label_values, double v)
{
    struct otlp_emit *e = ctx;
    struct pf_metric_child tmp = {0};
    for (size_t i = 0; i < e->m->nlabels; i++)
        tmp.values[i] = (char *)(label_values && label_values[i] ? label_values[i] : "");
    cJSON *p = cJSON_CreateObject();
    cJSON_AddItemToObject(p, "attributes", otlp_attrs(e->m, tmp.values));
    cJSON_AddStringToObject(p, "timeUnixNano", e->ts);
    cJSON_AddNumberToObject(p, "asDouble", v);
    cJSON_AddItemToArray(e->points, p);
}

int pf_metrics_render_otlp(const char *service, uint64_t start_ns, char **out, size_t *len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char now[32], start[32];
    snprintf(now, sizeof(now), "%llu",
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    snprintf(start, sizeof(start), "%llu", (unsigned long long)start_ns);
    cJSON *root = cJSON_CreateObject();
    cJSON *rms = cJSON_AddArrayToObject(root, "resourceMetrics");
    cJSON *rm = cJSON_CreateObject();
    cJSON_AddItemToArray(rms, rm);
    cJSON *res = cJSON_AddObjectToObject(rm, "resource");
    cJSON *ra = cJSON_AddArrayToObject(res, "attributes");
    cJSON *kv = cJSON_CreateObject();
    cJSON_AddStringToObject(kv, "key", "service.name");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(kv, "value"), "stringValue", service);
    cJSON_AddItemToArray(ra, kv);
    cJSON *sms = cJSON_AddArrayToObject(rm, "scopeMetrics");
    cJSON *sm = cJSON_CreateObject();
    cJSON_AddItemToArray(sms, sm);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(sm, "scope"), "name", "pegaflow");
    cJSON *metrics = cJSON_AddArrayToObject(sm, "metrics");
    pthread_mutex_lock(&reg_mu);
    for (struct pf_metric *m = families; m; m = m->next) {
        char nbuf[256];
        cJSON *jm = cJSON_CreateObject();
        cJSON_AddStringToObject(jm, "name", sample_name(m, nbuf, sizeof(nbuf)));
        cJSON_AddStringToObject(jm, "description", m->help);
        cJSON *data;
        if (m->kind == K_COUNTER) {
            data = cJSON_AddObjectToObject(jm, "sum");
            cJSON_AddNumberToObject(data, "aggregationTemporality", 2);
            cJSON_AddTrueToObject(data, "isMonotonic");
        } else if (m->kind == K_HIST) {
            data = cJSON_AddObjectToObject(jm, "histogram");
            cJSON_AddNumberToObject(data, "aggregationTemporality", 2);
        } else {
            data = cJSON_AddObjectToObject(jm, "gauge");
        }
        cJSON *points = cJSON_AddArrayToObject(data, "dataPoints");
        pthread_mutex_lock(&m->mu);
        if (m->kind == K_GAUGE_FN) {
            struct otlp_emit e = {.points = points, .m = m};
            snprintf(e.ts, sizeof(e.ts), "%s", now);
            for (struct fn_entry *f = m->fns; f; f = f->next)
                f->fn(f->ctx, otlp_emit_fn, &e);
        } else if (m->plain) {
            otlp_point(points, m, m->plain, start, now);
        } else {
            for (struct pf_metric_child *c = m->children; c; c = c->next)
                otlp_point(points, m, c, start, now);
        }
        pthread_mutex_unlock(&m->mu);
        cJSON_AddItemToArray(metrics, jm);
    }
    pthread_mutex_unlock(&reg_mu);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s)
        return -ENOMEM;
    *out = s;
    *len = strlen(s);
    return 0;
}

/* ---- OTLP/protobuf rendering (proto/otlp_metrics.proto, the published field numbers) ---- */

/* every allocation of one rendering, freed together */
struct pb_arena {
    void **v;
    size_t n, cap;
    bool oom;
};

static void *pa_track(struct pb_arena *a, void *p)
{
    if (!p || a->oom) {
        free(p);
        a->oom = true;
        return NULL;
    }
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 256;
        void **nv = realloc(a->v, nc * sizeof(*nv));
        if (!nv) {
            free(p);
            a->oom = true;
            return NULL;
        }
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = p;
    return p;
}

static void *pa_calloc(struct pb_arena *a, size_t n, size_t sz)
{
    return pa_track(a, calloc(n ? n : 1, sz));
}

static char *pa_strdup(struct pb_arena *a, const char *s)
{
    return pa_track(a, strdup(s ? s : ""));
}

static void pa_free(struct pb_arena *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
}

typedef Opentelemetry__Proto__Metrics__V1__KeyValue pb_kv;
typedef Opentelemetry__Proto__Metrics__V1__NumberDataPoint pb_ndp;
typedef Opentelemetry__Proto__Metrics__V1__HistogramDataPoint pb_hdp;

static pb_kv *pb_string_kv(struct pb_arena *a, const char *key, const char *val)
{
    pb_kv *kv = pa_calloc(a, 1, sizeof(*kv));
    Opentelemetry__Proto__Metrics__V1__AnyValue *v = pa_calloc(a, 1, sizeof(*v));
    if (!kv || !v)
        return NULL;
    opentelemetry__proto__metrics__v1__key_value__init(kv);
    opentelemetry__proto__metrics__v1__any_value__init(v);
    kv->key = pa_strdup(a, key);
    v->value_case = OPENTELEMETRY__PROTO__METRICS__V1__ANY_VALUE__VALUE_STRING_VALUE;
    v->string_value = pa_strdup(a, val);
    kv->value = v;
    return kv;
}

static pb_kv **pb_attrs(struct pb_arena *a, struct pf_metric *m, char *const *values)
{
    pb_kv **kvs = pa_calloc(a, m->nlabels, sizeof(*kvs));
    for (size_t i = 0; kvs && i < m->nlabels; i++)
        kvs[i] = pb_string_kv(a, m->labels[i], values[i]);
    return kvs;
}

static pb_ndp *pb_number_point(struct pb_arena *a, struct pf_metric *m, char *const *values,
                               uint64_t start, uint64_t now, double v)
{
    pb_ndp *p = pa_calloc(a, 1, sizeof(*p));
    if (!p)
        return NULL;
    opentelemetry__proto__metrics__v1__number_data_point__init(p);
    p->n_attributes = m->nlabels;
    p->attributes = pb_attrs(a, m, values);
    p->start_time_unix_nano = start;
    p->time_unix_nano = now;
    p->value_case = OPENTELEMETRY__PROTO__METRICS__V1__NUMBER_DATA_POINT__VALUE_AS_DOUBLE;
    p->as_double = v;
    return p;
}

static pb_hdp *pb_hist_point(struct pb_arena *a, struct pf_metric *m, struct pf_metric_child *c,
                             uint64_t start, uint64_t now)
{
    pb_hdp *p = pa_calloc(a, 1, sizeof(*p));
    uint64_t *bc = pa_calloc(a, m->nbuckets + 1, sizeof(uint64_t));
    double *eb = pa_calloc(a, m->nbuckets, sizeof(double));
    if (!p || !bc || !eb)
        return NULL;
    opentelemetry__proto__metrics__v1__histogram_data_point__init(p);
    p->n_attributes = m->nlabels;
    p->attributes = pb_attrs(a, m, c->values);
    p->start_time_unix_nano = start;
    p->time_unix_nano = now;
    /* buckets first, then the count, as the JSON rendering: consistent, never wrapping */
    uint64_t total = 0;
    for (size_t i = 0; i < m->nbuckets; i++) {
        bc[i] = atomic_load(&c->bucket_counts[i]);
        total += bc[i];
        eb[i] = m->buckets[i];
    }
    uint64_t count = atomic_load(&c->count);
    if (count < total)
        count = total;
    bc[m->nbuckets] = count - total;
    p->count = count;
    p->sum = load_d(&c->val);
    p->n_bucket_counts = m->nbuckets + 1;
    p->bucket_counts = bc;
    p->n_explicit_bounds = m->nbuckets;
    p->explicit_bounds = eb;
    return p;
}

struct pb_emit {
    struct pb_arena *a;
    struct pf_metric *m;
    uint64_t now;
    pb_ndp **v;
    size_t n, cap;
};

static void pb_emit_fn(void *ctx, const char *const *label_values, double v)
{
    struct pb_emit *e = ctx;
    if (e->n == e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 8;
        pb_ndp **nv = pa_calloc(e->a, nc, sizeof(*nv));
        if (!nv)
            return;
        if (e->n)
            memcpy(nv, e->v, e->n * sizeof(*nv));
        e->v = nv;
        e->cap = nc;
    }
    char *vals[PF_METRIC_MAX_LABELS] = {0};
    for (size_t i = 0; i < e->m->nlabels; i++)
        vals[i] = (char *)(label_values && label_values[i] ? label_values[i] : "");
    pb_ndp *p = pb_number_point(e->a, e->m, vals, 0, e->now, v);
    if (p)
        e->v[e->n++] = p;
}

/* the family's points; the caller holds m->mu */
static void pb_family(struct pb_arena *a, struct pf_metric *m, uint64_t start, uint64_t now,
                      Opentelemetry__Proto__Metrics__V1__Metric *jm)
{
    size_t n = m->plain ? 1 : 0;
    for (struct pf_metric_child *c = m->children; c; c = c->next)
        n++;
    if (m->kind == K_HIST) {
        Opentelemetry__Proto__Metrics__V1__Histogram *h = pa_calloc(a, 1, sizeof(*h));
        pb_hdp **pts = pa_calloc(a, n, sizeof(*pts));
        if (!h || !pts)
            return;
        opentelemetry__proto__metrics__v1__histogram__init(h);
        h->aggregation_temporality =
            OPENTELEMETRY__PROTO__METRICS__V1__AGGREGATION_TEMPORALITY__AGGREGATION_TEMPORALITY_CUMULATIVE;
        if (m->plain)
            pts[h->n_data_points++] = pb_hist_point(a, m, m->plain, start, now);
        for (struct pf_metric_child *c = m->children; c && !m->plain; c = c->next)
            pts[h->n_data_points++] = pb_hist_point(a, m, c, start, now);
        h->data_points = pts;
        jm->data_case = OPENTELEMETRY__PROTO__METRICS__V1__METRIC__DATA_HISTOGRAM;
        jm->histogram = h;
        return;
    }
    pb_ndp **pts;
    size_t np = 0;
    if (m->kind == K_GAUGE_FN) {
        struct pb_emit e = {.a = a, .m = m, .now = now};
        for (struct fn_entry *f = m->fns; f; f = f->next)
            f->fn(f->ctx, pb_emit_fn, &e);
        pts = e.v;
        np = e.n;
    } else {
        pts = pa_calloc(a, n, sizeof(*pts));
        if (!pts)
            return;
        uint64_t st = m->kind == K_COUNTER ? start : 0;
        if (m->plain)
            pts[np++] = pb_number_point(a, m, m->plain->values, st, now, load_d(&m->plain->val));
        for (struct pf_metric_child *c = m->children; c && !m->plain; c = c->next)
            pts[np++] = pb_number_point(a, m, c->values, st, now, load_d(&c->val));
    }
    if (m->kind == K_COUNTER) {
        Opentelemetry__Proto__Metrics__V1__Sum *s = pa_calloc(a, 1, sizeof(*s));
        if (!s)
            return;
        opentelemetry__proto__metrics__v1__sum__init(s);
        s->aggregation_temporality =
            OPENTELEMETRY__PROTO__METRICS__V1__AGGREGATION_TEMPORALITY__AGGREGATION_TEMPORALITY_CUMULATIVE;
        s->is_monotonic = true;
        s->n_data_points = np;
        s->data_points = pts;
        jm->data_case = OPENTELEMETRY__PROTO__METRICS__V1__METRIC__DATA_SUM;
        jm->sum = s;
    } else {
        Opentelemetry__Proto__Metrics__V1__Gauge *g = pa_calloc(a, 1, sizeof(*g));
        if (!g)
            return;
        opentelemetry__proto__metrics__v1__gauge__init(g);
        g->n_data_points = np;
        g->data_points = pts;
        jm->data_case = OPENTELEMETRY__PROTO__METRICS__V1__METRIC__DATA_GAUGE;
        jm->gauge = g;
    }
}

int pf_metrics_render_otlp_pb(const char *service, uint64_t start_ns, uint8_t **out, size_t *len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    struct pb_arena a = {0};
    Opentelemetry__Proto__Metrics__V1__ExportMetricsServiceRequest req =
        OPENTELEMETRY__PROTO__METRICS__V1__EXPORT_METRICS_SERVICE_REQUEST__INIT;
    Opentelemetry__Proto__Metrics__V1__ResourceMetrics
        rm = OPENTELEMETRY__PROTO__METRICS__V1__RESOURCE_METRICS__INIT,
        *rmp = &rm;
    Opentelemetry__Proto__Metrics__V1__Resource res =
        OPENTELEMETRY__PROTO__METRICS__V1__RESOURCE__INIT;
    Opentelemetry__Proto__Metrics__V1__ScopeMetrics
        sm = OPENTELEMETRY__PROTO__METRICS__V1__SCOPE_METRICS__INIT,
        *smp = &sm;
    Opentelemetry__Proto__Metrics__V1__InstrumentationScope scope =
        OPENTELEMETRY__PROTO__METRICS__V1__INSTRUMENTATION_SCOPE__INIT;
    pb_kv *svc = pb_string_kv(&a, "service.name", service);
    res.n_attributes = 1;
    res.attributes = &svc;
    rm.resource = &res;
    rm.n_scope_metrics = 1;
    rm.scope_metrics = &smp;
    scope.name = "pegaflow";
    scope.version = PF_VERSION;
    sm.scope = &scope;
    req.n_resource_metrics = 1;
    req.resource_metrics = &rmp;

    pthread_mutex_lock(&reg_mu);
    size_t nf = 0;
    for (struct pf_metric *m = families; m; m = m->next)
        nf++;
    Opentelemetry__Proto__Metrics__V1__Metric **ms = pa_calloc(&a, nf, sizeof(*ms));
    for (struct pf_metric *m = families; ms && m; m = m->next) {
        char nbuf[256];
        Opentelemetry__Proto__Metrics__V1__Metric *jm = pa_calloc(&a, 1, sizeof(*jm));
        if (!jm)
            break;
        opentelemetry__proto__metrics__v1__metric__init(jm);
        jm->name = pa_strdup(&a, sample_name(m, nbuf, sizeof(nbuf)));
        jm->description = pa_strdup(&a, m->help);
        pthread_mutex_lock(&m->mu);
        pb_family(&a, m, start_ns, now, jm);
        pthread_mutex_unlock(&m->mu);
        ms[sm.n_metrics++] = jm;
    }
    sm.metrics = ms;
    pthread_mutex_unlock(&reg_mu);
    int rc = -ENOMEM;
    if (a.oom || !svc || !ms)
        goto out;
    size_t n = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        goto out;
    protobuf_c_message_pack(&req.base, buf);
    *out = buf;
    *len = n;
    rc = 0;
out:
    pa_free(&a);
    return rc;
}

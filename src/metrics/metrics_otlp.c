/* OTLP renderings of the metric registry (contract in pf/metrics.h): OTLP/JSON and
 * OTLP/protobuf (proto/otlp_metrics.proto) export requests of every family, for the OTLP
 * exporter (otlp.c). */
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
    struct pf_metric *first = pf_metrics_registry_lock();
    for (struct pf_metric *m = first; m; m = m->next) {
        char nbuf[256];
        cJSON *jm = cJSON_CreateObject();
        cJSON_AddStringToObject(jm, "name", pf_metrics_sample_name(m, nbuf, sizeof(nbuf)));
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
    pf_metrics_registry_unlock();
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

    struct pf_metric *first = pf_metrics_registry_lock();
    size_t nf = 0;
    for (struct pf_metric *m = first; m; m = m->next)
        nf++;
    Opentelemetry__Proto__Metrics__V1__Metric **ms = pa_calloc(&a, nf, sizeof(*ms));
    for (struct pf_metric *m = first; ms && m; m = m->next) {
        char nbuf[256];
        Opentelemetry__Proto__Metrics__V1__Metric *jm = pa_calloc(&a, 1, sizeof(*jm));
        if (!jm)
            break;
        opentelemetry__proto__metrics__v1__metric__init(jm);
        jm->name = pa_strdup(&a, pf_metrics_sample_name(m, nbuf, sizeof(nbuf)));
        jm->description = pa_strdup(&a, m->help);
        pthread_mutex_lock(&m->mu);
        pb_family(&a, m, start_ns, now, jm);
        pthread_mutex_unlock(&m->mu);
        ms[sm.n_metrics++] = jm;
    }
    sm.metrics = ms;
    pf_metrics_registry_unlock();
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

/* Private to src/metrics: the registry's records, shared by metrics.c (registry, values,
 * Prometheus text) and metrics_otlp.c (OTLP JSON and protobuf renderings). A family's
 * children are read under its mu; the family list under the registry lock. */
#ifndef PF_METRICS_INTERNAL_H
#define PF_METRICS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

static inline double load_d(_Atomic uint64_t *w)
{
    uint64_t b = atomic_load_explicit(w, memory_order_relaxed);
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

/* The exposition name of a family's samples (counters end in _total); buf holds it when it
 * has to be built. */
const char *pf_metrics_sample_name(struct pf_metric *m, char *buf, size_t len);
/* Takes the registry lock and returns the first family (NULL when none); the list is
 * stable until pf_metrics_registry_unlock. */
struct pf_metric *pf_metrics_registry_lock(void);
void pf_metrics_registry_unlock(void);

#endif

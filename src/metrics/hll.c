/* HyperLogLog with linear-counting small-range correction (no large-range correction), and
 * sliding windows built from slots of clamp(window / 24, 1 min, 1 h): each slot has its own
 * registers and request count; a window's estimate merges (max) the registers of the slots
 * it covers. Slot boundaries are aligned to the set's start time.
 *
 * A scrape must not re-merge every slot (3 gauges x 63 slots x 64 KiB): per window the
 * max-merge of its closed live slots (every live slot but the current one) is kept and
 * rebuilt only when the current slot index moves (a slot opens or expires: at most once per
 * slot length) or a record lands in a slot other than the one it was built for; an estimate
 * then folds in the current slot only, in the same register order, so it is bit-identical
 * to the full merge. Each window's (cardinality, total) is also cached under the set's
 * generation (bumped by every record, which is also the only thing that advances a ring)
 * and the current slot index, so the three gauges of one scrape compute it once. Everything
 * is under the set's one mutex. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pf/hll.h"
#include "pf/metrics.h"

struct pf_hll {
    unsigned bits;
    uint8_t *reg;
};

struct pf_hll *pf_hll_new(unsigned bits)
{
    struct pf_hll *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->bits = bits;
    h->reg = calloc((size_t)1 << bits, 1);
    if (!h->reg) {
        free(h);
        return NULL;
    }
    return h;
}

void pf_hll_free(struct pf_hll *h)
{
    if (h) {
        free(h->reg);
        free(h);
    }
}

static void reg_add(uint8_t *reg, unsigned bits, uint64_t x)
{
    size_t idx = (size_t)(x >> (64 - bits));
    uint64_t rest = x << bits;
    uint8_t rank = rest ? (uint8_t)(__builtin_clzll(rest) + 1) : (uint8_t)(64 - bits + 1);
    if (rank > reg[idx])
        reg[idx] = rank;
}

/* 2^-r for every rank a register can hold (r <= 64 - 4 + 1): exact powers of two, the same
 * doubles ldexp(1.0, -r) gives. */
static double pow2_neg[66];
static pthread_once_t pow2_once = PTHREAD_ONCE_INIT;

static void pow2_init(void)
{
    for (int r = 0; r < 66; r++)
        pow2_neg[r] = ldexp(1.0, -r);
}

/* Estimate from the harmonic sum of 2^-reg[i] (summed in register order) and the number of
 * zero registers. */
static double estimate_of(double sum, size_t zeros, unsigned bits)
{
    size_t m = (size_t)1 << bits;
    double alpha = m == 16   ? 0.673
                   : m == 32 ? 0.697
                   : m == 64 ? 0.709
                             : 0.7213 / (1 + 1.079 / (double)m);
    double e = alpha * (double)m * (double)m / sum;
    if (e <= 2.5 * (double)m && zeros)
        e = (double)m * log((double)m / (double)zeros);
    return e;
}

static double reg_estimate(const uint8_t *reg, unsigned bits)
{
    pthread_once(&pow2_once, pow2_init);
    size_t m = (size_t)1 << bits;
    double sum = 0;
    size_t zeros = 0;
    for (size_t i = 0; i < m; i++) {
        sum += pow2_neg[reg[i]];
        zeros += reg[i] == 0;
    }
    return estimate_of(sum, zeros, bits);
}

/* reg_estimate of the register-wise max of a and b (b may be NULL), without storing it. */
static double reg_estimate_max(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    if (!b)
        return reg_estimate(a, bits);
    pthread_once(&pow2_once, pow2_init);
    size_t m = (size_t)1 << bits;
    double sum = 0;
    size_t zeros = 0;
    for (size_t i = 0; i < m; i++) {
        uint8_t r = a[i] > b[i] ? a[i] : b[i];
        sum += pow2_neg[r];
        zeros += r == 0;
    }
    return estimate_of(sum, zeros, bits);
}

void pf_hll_add(struct pf_hll *h, uint64_t x)
{
    reg_add(h->reg, h->bits, x);
}

double pf_hll_estimate(const struct pf_hll *h)
{
    return reg_estimate(h->reg, h->bits);
}

static uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define FNV_PRIME 0x100000001b3ull

/* FNV-1a-64 state after u64le(len(ns)) || ns: the part every identity of a namespace shares. */
static uint64_t fnv_ns(const char *ns)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t nl = strlen(ns);
    for (int i = 0; i < 8; i++) {
        h ^= (uint8_t)(nl >> (8 * i));
        h *= FNV_PRIME;
    }
    for (const char *p = ns; *p; p++) {
        h ^= (uint8_t)*p;
        h *= FNV_PRIME;
    }
    return h;
}

uint64_t pf_hll_identity(const char *ns, const uint8_t *hash, size_t len)
{
    uint64_t h = fnv_ns(ns);
    for (size_t i = 0; i < len; i++) {
        h ^= hash[i];
        h *= FNV_PRIME;
    }
    return splitmix64(h); /* the reference sends it big-endian; as a number it is this */
}

/* pf_hll_identity of n hashes of one namespace into out[]. FNV-1a is one dependent multiply
 * per byte, so four hashes of equal length advance side by side (four independent chains
 * keep the multiplier busy); the namespace prefix is hashed once. */
static void identities(const char *ns, const uint8_t *const *hashes, const size_t *lens, size_t n,
                       uint64_t *out)
{
    const uint64_t h0 = fnv_ns(ns);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        size_t len = lens[i];
        if (lens[i + 1] != len || lens[i + 2] != len || lens[i + 3] != len)
            break;
        const uint8_t *a = hashes[i], *b = hashes[i + 1], *c = hashes[i + 2], *d = hashes[i + 3];
        uint64_t ha = h0, hb = h0, hc = h0, hd = h0;
        for (size_t j = 0; j < len; j++) {
            ha = (ha ^ a[j]) * FNV_PRIME;
            hb = (hb ^ b[j]) * FNV_PRIME;
            hc = (hc ^ c[j]) * FNV_PRIME;
            hd = (hd ^ d[j]) * FNV_PRIME;
        }
        out[i] = splitmix64(ha);
        out[i + 1] = splitmix64(hb);
        out[i + 2] = splitmix64(hc);
        out[i + 3] = splitmix64(hd);
    }
    for (; i < n; i++) {
        uint64_t h = h0;
        for (size_t j = 0; j < lens[i]; j++)
            h = (h ^ hashes[i][j]) * FNV_PRIME;
        out[i] = splitmix64(h);
    }
}

struct window {
    uint64_t len_ns, slot_ns;
    size_t nslots;
    uint8_t *regs;     /* nslots x m */
    uint64_t *totals;  /* per slot */
    uint64_t *slot_id; /* absolute slot index each ring position holds */
    char label[32];
    /* max-merge and total of the live slots other than closed_cur, valid while closed_ok */
    uint8_t *closed;
    uint64_t closed_total, closed_cur;
    bool closed_ok;
    /* last estimate, valid while est_ok, the set's gen == est_gen and the slot is est_cur */
    double est_card;
    uint64_t est_total, est_gen, est_cur;
    bool est_ok;
};

struct pf_hll_set {
    pthread_mutex_t mu;
    unsigned bits;
    const struct pf_clock *clk;
    uint64_t start_ns;
    struct window w[8];
    size_t nw;
    uint64_t gen; /* bumped by every pf_hll_record (the only writer of slots and rings) */
    struct pf_metric *m_card, *m_total, *m_rate;
};

static void label_of(uint64_t secs, char *out, size_t n)
{
    if (secs % 86400 == 0)
        snprintf(out, n, "%llud", (unsigned long long)(secs / 86400));
    else if (secs % 3600 == 0)
        snprintf(out, n, "%lluh", (unsigned long long)(secs / 3600));
    else if (secs % 60 == 0)
        snprintf(out, n, "%llum", (unsigned long long)(secs / 60));
    else
        snprintf(out, n, "%llus", (unsigned long long)secs);
}

/* Moves the ring forward to now, clearing slots that fell out of the window. */
static void advance(struct pf_hll_set *s, struct window *w, uint64_t now)
{
    uint64_t cur = (now - s->start_ns) / w->slot_ns;
    size_t m = (size_t)1 << s->bits;
    size_t pos = (size_t)(cur % w->nslots);
    if (w->slot_id[pos] != cur) {
        memset(w->regs + pos * m, 0, m);
        w->totals[pos] = 0;
        w->slot_id[pos] = cur;
    }
}

static bool slot_live(const struct window *w, size_t pos, uint64_t cur)
{
    return w->slot_id[pos] != UINT64_MAX && w->slot_id[pos] + w->nslots > cur &&
           w->slot_id[pos] <= cur;
}

/* Adds total and the misses to every window: ids[] when given, else (out of memory) each
 * identity computed here, under the lock. */
static void record(struct pf_hll_set *s, const uint64_t *ids, const char *ns,
                   const uint8_t *const *hashes, const size_t *lens, size_t nmiss, uint64_t total)
{
    uint64_t now = pf_clock_now(s->clk);
    size_t m = (size_t)1 << s->bits;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nw; i++) {
        struct window *w = &s->w[i];
        advance(s, w, now);
        uint64_t cur = (now - s->start_ns) / w->slot_ns;
        size_t pos = (size_t)(cur % w->nslots);
        /* A record into the slot the closed merge left out (the usual case) keeps it; one
         * into any other slot (the clock read before the lock, behind a reader that already
         * moved on; or a new slot, whose advance may have cleared a merged one) drops it. */
        if (cur != w->closed_cur)
            w->closed_ok = false;
        w->totals[pos] += total;
        for (size_t k = 0; k < nmiss; k++)
            reg_add(w->regs + pos * m, s->bits,
                    ids ? ids[k] : pf_hll_identity(ns, hashes[k], lens[k]));
    }
    s->gen++;
    pthread_mutex_unlock(&s->mu);
}

void pf_hll_record(struct pf_hll_set *s, const char *ns, const uint8_t *const *hashes,
                   const size_t *lens, size_t nmiss, uint64_t total)
{
    if (!s)
        return;
    /* identities outside the lock, once for every window (a miss of 4,096 hashes was
     * ~500 us of FNV per call under this lock, three times over) */
    uint64_t idbuf[256], *ids = idbuf;
    if (nmiss > sizeof(idbuf) / sizeof(idbuf[0]) && !(ids = malloc(nmiss * sizeof(*ids))))
        ids = NULL; /* out of memory: the identities are computed under the lock, one by one */
    if (ids)
        identities(ns, hashes, lens, nmiss, ids);
    record(s, ids, ns, hashes, lens, nmiss, total);
    if (ids != idbuf)
        free(ids);
}

void pf_hll_identities(const char *ns, const uint8_t *const *hashes, const size_t *lens, size_t n,
                       uint64_t *out)
{
    identities(ns, hashes, lens, n, out);
}

void pf_hll_record_ids(struct pf_hll_set *s, const uint64_t *ids, size_t nmiss, uint64_t total)
{
    if (s && (ids || nmiss == 0))
        record(s, ids, NULL, NULL, NULL, nmiss, total);
}

/* Rebuilds w->closed for current slot cur: the max-merge of every live slot but cur. */
static void closed_rebuild(struct pf_hll_set *s, struct window *w, uint64_t cur)
{
    size_t m = (size_t)1 << s->bits;
    memset(w->closed, 0, m);
    w->closed_total = 0;
    for (size_t p = 0; p < w->nslots; p++) {
        if (!slot_live(w, p, cur) || w->slot_id[p] == cur)
            continue;
        w->closed_total += w->totals[p];
        const uint8_t *r = w->regs + p * m;
        for (size_t j = 0; j < m; j++)
            if (r[j] > w->closed[j])
                w->closed[j] = r[j];
    }
    w->closed_cur = cur;
    w->closed_ok = true;
}

/* The full merge of window i's live slots, estimated. Caller holds s->mu. */
static void window_estimate(struct pf_hll_set *s, size_t i, double *card_p, uint64_t *total_p)
{
    struct window *w = &s->w[i];
    size_t m = (size_t)1 << s->bits;
    uint64_t now = pf_clock_now(s->clk);
    uint64_t cur = (now - s->start_ns) / w->slot_ns;
    if (w->est_ok && w->est_gen == s->gen && w->est_cur == cur) {
        *card_p = w->est_card;
        *total_p = w->est_total;
        return;
    }
    if (!w->closed_ok || w->closed_cur != cur)
        closed_rebuild(s, w, cur);
    size_t pos = (size_t)(cur % w->nslots);
    const uint8_t *cur_reg = NULL;
    uint64_t total = w->closed_total;
    if (slot_live(w, pos, cur) && w->slot_id[pos] == cur) {
        cur_reg = w->regs + pos * m;
        total += w->totals[pos];
    }
    w->est_card = reg_estimate_max(w->closed, cur_reg, s->bits);
    w->est_total = total;
    w->est_gen = s->gen;
    w->est_cur = cur;
    w->est_ok = true;
    *card_p = w->est_card;
    *total_p = total;
}

double pf_hll_cardinality(struct pf_hll_set *s, size_t window)
{
    double c;
    uint64_t t;
    pthread_mutex_lock(&s->mu);
    window_estimate(s, window, &c, &t);
    pthread_mutex_unlock(&s->mu);
    return c;
}

uint64_t pf_hll_total(struct pf_hll_set *s, size_t window)
{
    double c;
    uint64_t t;
    pthread_mutex_lock(&s->mu);
    window_estimate(s, window, &c, &t);
    pthread_mutex_unlock(&s->mu);
    return t;
}

enum { G_CARD, G_TOTAL, G_RATE };

static void collect(struct pf_hll_set *s, int which, pf_metric_emit_fn emit, void *ectx)
{
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nw; i++) {
        double c;
        uint64_t t;
        window_estimate(s, i, &c, &t);
        double v = which == G_CARD ? c : which == G_TOTAL ? (double)t : t ? 1.0 - c / (double)t : 0;
        if (which == G_RATE)
            v = v < 0 ? 0 : v > 1 ? 1 : v;
        const char *lv[1] = {s->w[i].label};
        emit(ectx, lv, v);
    }
    pthread_mutex_unlock(&s->mu);
}

static void collect_card(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    collect(ctx, G_CARD, emit, ectx);
}
static void collect_total(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    collect(ctx, G_TOTAL, emit, ectx);
}
static void collect_rate(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    collect(ctx, G_RATE, emit, ectx);
}

int pf_hll_set_create(const char *windows, unsigned bits, const struct pf_clock *clk,
                      struct pf_hll_set **s_p)
{
    if (bits < 4 || bits > 18)
        return -EINVAL;
    struct pf_hll_set *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->bits = bits;
    s->clk = clk;
    s->start_ns = pf_clock_now(clk);
    pthread_mutex_init(&s->mu, NULL);
    const char *p = windows;
    size_t m = (size_t)1 << bits;
    int rc = 0;
    while (*p && s->nw < 8) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        uint64_t mult = *end == 's'   ? 1
                        : *end == 'm' ? 60
                        : *end == 'h' ? 3600
                        : *end == 'd' ? 86400
                                      : 0;
        if (end == p || !mult || v * mult < 60) {
            rc = -EINVAL;
            goto err;
        }
        uint64_t secs = v * mult;
        struct window *w = &s->w[s->nw];
        uint64_t slot = secs / 24;
        slot = slot < 60 ? 60 : slot > 3600 ? 3600 : slot;
        w->len_ns = secs * PF_NS_PER_SEC;
        w->slot_ns = slot * PF_NS_PER_SEC;
        w->nslots = (size_t)((secs + slot - 1) / slot);
        w->regs = calloc(w->nslots * m, 1);
        w->totals = calloc(w->nslots, sizeof(*w->totals));
        w->slot_id = malloc(w->nslots * sizeof(*w->slot_id));
        w->closed = calloc(m, 1);
        if (!w->regs || !w->totals || !w->slot_id || !w->closed) {
            s->nw++;
            rc = -ENOMEM;
            goto err;
        }
        for (size_t i = 0; i < w->nslots; i++)
            w->slot_id[i] = UINT64_MAX;
        label_of(secs, w->label, sizeof(w->label));
        s->nw++;
        p = end + 1;
        if (*p == ',')
            p++;
    }
    s->m_card = pf_metric_gauge_fn("pegaflow_hll_cardinality",
                                   "Distinct missed blocks in the window (HyperLogLog)", "window",
                                   collect_card, s);
    s->m_total = pf_metric_gauge_fn("pegaflow_hll_total_requests",
                                    "Blocks asked for by prefix queries in the window", "window",
                                    collect_total, s);
    s->m_rate = pf_metric_gauge_fn("pegaflow_hll_estimated_hit_rate",
                                   "Hit rate an unbounded cache would have had in the window",
                                   "window", collect_rate, s);
    *s_p = s;
    return 0;
err:
    pf_hll_set_destroy(s);
    return rc;
}

void pf_hll_set_destroy(struct pf_hll_set *s)
{
    if (!s)
        return;
    pf_metric_gauge_fn_clear(s->m_card, s);
    pf_metric_gauge_fn_clear(s->m_total, s);
    pf_metric_gauge_fn_clear(s->m_rate, s);
    for (size_t i = 0; i < s->nw; i++) {
        free(s->w[i].regs);
        free(s->w[i].totals);
        free(s->w[i].slot_id);
        free(s->w[i].closed);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

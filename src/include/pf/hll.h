/* Block-reuse estimator (reference §8.3): per time window, a sliding HyperLogLog of the
 * identities of blocks that missed, and the number of blocks asked for. The estimated hit
 * rate of a cache that had remembered everything in the window is
 * clamp(1 - distinct_misses / total, 0, 1). Exported as pegaflow_hll_cardinality,
 * pegaflow_hll_total_requests and pegaflow_hll_estimated_hit_rate, labelled window="15m".
 * Identity = splitmix64(FNV-1a-64(u64le(len(ns)) || ns || hash)) big-endian: stable across
 * nodes. Thread-safe. */
#ifndef PF_HLL_H
#define PF_HLL_H

#include <stddef.h>
#include <stdint.h>

#include "pf/clock.h"

struct pf_hll_set;

/* windows: "15m,1h,1d"; bits: 4..18. Registers the gauges. */
int pf_hll_set_create(const char *windows, unsigned bits, const struct pf_clock *clk,
                      struct pf_hll_set **s_p);
void pf_hll_set_destroy(struct pf_hll_set *s);
/* One prefix query: total blocks asked for and the identities of those that missed. */
void pf_hll_record(struct pf_hll_set *s, const char *ns, const uint8_t *const *hashes,
                   const size_t *lens, size_t nmiss, uint64_t total);
uint64_t pf_hll_identity(const char *ns, const uint8_t *hash, size_t len);
/* The identities of n hashes (pf_hll_identity each, several computed side by side), for a
 * caller that has time for them before it knows which hashes missed (the query thread while
 * the MetaServer answers); out[] has n entries. No set needed, no lock. */
void pf_hll_identities(const char *ns, const uint8_t *const *hashes, const size_t *lens, size_t n,
                       uint64_t *out);
/* pf_hll_record with the misses' identities already computed (pf_hll_identities). */
void pf_hll_record_ids(struct pf_hll_set *s, const uint64_t *ids, size_t nmiss, uint64_t total);

/* Estimates for window i (tests). */
double pf_hll_cardinality(struct pf_hll_set *s, size_t window);
uint64_t pf_hll_total(struct pf_hll_set *s, size_t window);

/* A single HyperLogLog (exposed for tests). */
struct pf_hll;
struct pf_hll *pf_hll_new(unsigned bits);
void pf_hll_free(struct pf_hll *h);
void pf_hll_add(struct pf_hll *h, uint64_t x);
double pf_hll_estimate(const struct pf_hll *h);

#endif

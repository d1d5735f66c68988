/* Leases: "QueryPrefetch pins, Load consumes, Release cancels".
 *
 * A lease holds strong references (or RAM cache pins) to the blocks a Ready answer reported, so
 * they survive pressure eviction until every worker of the instance has loaded them. It has a
 * 16-byte random id, the owning instance, a share count (the instance's world_size: each worker's
 * Load consumes one, the last deletes the lease) and an expiry (600 s by default). Expired
 * leases are removed by pf_lease_sweep (called periodically) and by opportunistic sweeps on
 * create/consume (at most once a second); an expired lease is never honoured either way.
 * Thread-safe; block references are dropped outside the table lock. */
#ifndef PF_LEASE_H
#define PF_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "pf/block.h"
#include "pf/clock.h"

#define PF_LEASE_ID_LEN 16

struct pf_lease_table;

int pf_lease_table_create(const struct pf_clock *clk, uint64_t ttl_ns, struct pf_lease_table **t_p);
/* Drops every lease. Accepts NULL. */
void pf_lease_table_destroy(struct pf_lease_table *t);

/* Creates a lease owning the n strong references in blocks (the array is copied; the
 * references are transferred even on failure). Writes the id. 0 or -ENOMEM. */
int pf_lease_create(struct pf_lease_table *t, const char *instance_id, struct pf_block **blocks,
                    size_t n, uint32_t shares, uint8_t id_out[PF_LEASE_ID_LEN]);

/* As pf_lease_create, but blocks are pins in cache c (pf_cache_prefix_pin) that the lease
 * takes over, even on failure (then unpinned); freeing the lease unpins them. c must
 * outlive the table (destroy the table first). */
struct pf_cache;
int pf_lease_create_pinned(struct pf_lease_table *t, struct pf_cache *c, const char *instance_id,
                           struct pf_block **blocks, size_t n, uint32_t shares,
                           uint8_t id_out[PF_LEASE_ID_LEN]);

/* Consumes one share. On success *blocks_p is a malloc'ed array of n new strong
 * references (caller puts each and frees the array). Errors: -EINVAL (id not 16 bytes),
 * -ESTALE (unknown, expired or exhausted), -EPERM (belongs to another instance: msg names
 * it; no share consumed). msg may be NULL. */
int pf_lease_consume(struct pf_lease_table *t, const uint8_t *id, size_t idlen,
                     const char *instance_id, struct pf_block ***blocks_p, size_t *n_p, char *msg,
                     size_t msglen);

/* Like pf_lease_consume without taking the share: the same checks and errors, the same new
 * references. A caller that validates its request against the blocks first and only then
 * takes the share (pf_lease_commit) leaves the lease intact when it rejects the request. */
int pf_lease_peek(struct pf_lease_table *t, const uint8_t *id, size_t idlen,
                  const char *instance_id, struct pf_block ***blocks_p, size_t *n_p, char *msg,
                  size_t msglen);

/* Takes one share of a lease (freed with its last share). 0; -ESTALE when it expired or
 * was used up since the peek (a concurrent consumer); -EINVAL for a bad id length. */
int pf_lease_commit(struct pf_lease_table *t, const uint8_t *id, size_t idlen);
/* Takes one share of each of n leases, all or nothing, under one lock. A lease named twice
 * is -EEXIST; an unknown, expired or used-up lease is -ESTALE; a bad id length -EINVAL.
 * On error *bad_p is the index of the offending id and no share was taken. */
struct pf_lease_ref {
    const uint8_t *id;
    size_t len;
};
int pf_lease_commit_all(struct pf_lease_table *t, const struct pf_lease_ref *ids, size_t n,
                        size_t *bad_p);
/* Removes the lease outright. 0, -EINVAL (bad length) or -ESTALE (unknown or expired). */
int pf_lease_release(struct pf_lease_table *t, const uint8_t *id, size_t idlen);
/* Drops every lease of the instance; returns how many. */
size_t pf_lease_drop_instance(struct pf_lease_table *t, const char *instance_id);
/* Drops expired leases; returns how many. */
size_t pf_lease_sweep(struct pf_lease_table *t);
size_t pf_lease_count(struct pf_lease_table *t);

#endif

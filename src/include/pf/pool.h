/* Pinned host memory pool.
 *
 * One region per NUMA node (when NUMA affinity is on and the host has several nodes) or
 * one global region, each an anonymous mapping (optionally MAP_HUGETLB) pre-touched by
 * threads bound to its node and registered with the GPU backend. Inside a region an O(1)
 * two-level segregated-fit offset allocator hands out whole units (unit = max(512, hint)
 * rounded up to 512, and large enough that the unit count fits 32 bits).
 *
 * Allocations are refcounted (struct pf_alloc): blocks sharing one contiguous save
 * allocation each hold a reference; the memory returns to the pool when the last goes.
 * All functions are thread-safe (one mutex per region). */
#ifndef PF_POOL_H
#define PF_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pf_gpu;
struct pf_pool;
struct pf_pool_region;

struct pf_alloc {
    struct pf_pool_region *region;
    void *ptr;
    uint64_t size; /* bytes actually reserved (whole units) */
    uint32_t node; /* allocator node index */
    _Atomic uint32_t refs;
};

struct pf_pool_config {
    uint64_t size;         /* total bytes (--pool-size) */
    uint64_t hint;         /* --hint-value-size, 0 = none */
    bool hugepages;        /* --use-hugepages */
    bool numa_affinity;    /* !--disable-numa-affinity */
    const int *numa_nodes; /* nodes that need a region (GPU-local nodes); NULL = all */
    size_t nnuma_nodes;
    uint32_t shards;    /* --pool-shards (sub-pools per region), >= 1 */
    struct pf_gpu *gpu; /* host_register target, may be NULL */
    bool skip_memcheck; /* tests: do not compare with MemAvailable */
};

/* Creates and pre-touches the regions. Errors carry a one-line reason naming the flag:
 * -ENOMEM (--pool-size exceeds available memory / hugepages not reserved), -EINVAL. */
/* Every pool mapping starts on a PF_POOL_ALIGN boundary and so does every shard of it
 * (when the unit divides it): NIC and GPU registrations of the pool cover whole huge pages. */
#define PF_POOL_ALIGN (2ull << 20)

/* Pages backing a pool region: explicit huge pages (--use-hugepages, or without it when
 * enough are reserved and free: MAP_HUGETLB), else transparent huge pages (MADV_HUGEPAGE,
 * when the kernel honours it), else base pages. pf_pool_create logs which per region. */
enum pf_pool_pages { PF_POOL_PAGES_BASE, PF_POOL_PAGES_THP, PF_POOL_PAGES_HUGETLB };
enum pf_pool_pages pf_pool_region_pages(const struct pf_pool *p, size_t i);
const char *pf_pool_pages_name(enum pf_pool_pages k);

int pf_pool_create(const struct pf_pool_config *cfg, struct pf_pool **p_p, char *err,
                   size_t errlen);
/* Frees everything. All allocations must have been released. Accepts NULL. */
void pf_pool_destroy(struct pf_pool *p);

/* Allocates size bytes on numa (-1 = any region; with NUMA regions a node is served only
 * by its own region). Returns 0 or -ENOMEM (no free range large enough). refs = 1. */
int pf_pool_alloc(struct pf_pool *p, uint64_t size, int numa, struct pf_alloc **a_p);
static inline void pf_alloc_get(struct pf_alloc *a)
{
    atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
}
/* Drops a reference; the last one returns the range to the pool. Accepts NULL. */
void pf_alloc_put(struct pf_alloc *a);

uint64_t pf_pool_capacity(const struct pf_pool *p);
uint64_t pf_pool_used(const struct pf_pool *p);
uint64_t pf_pool_unit(const struct pf_pool *p);
/* The largest allocation that could ever succeed for numa (-1 = any region): the biggest
 * shard that may serve it. A larger request fails however much is freed. */
uint64_t pf_pool_max_alloc(const struct pf_pool *p, int numa);
/* Largest free range (bytes) of the region serving numa (-1 = max over regions). */
uint64_t pf_pool_largest_free(struct pf_pool *p, int numa);
/* Region of numa, for callers choosing placement; -1 if numa has no own region. */
int pf_pool_region_index(const struct pf_pool *p, int numa);

/* Regions, for NIC registration and topology logs. */
size_t pf_pool_region_count(const struct pf_pool *p);
void pf_pool_region_info(const struct pf_pool *p, size_t i, void **base_p, uint64_t *len_p,
                         int *numa_p);

/* ---- the offset allocator (exposed for unit tests) ---- */
struct pf_offalloc;
/* capacity in units; max_allocs bounds the node table (0 = 4,000,000). */
int pf_offalloc_create(uint32_t capacity, uint32_t max_allocs, struct pf_offalloc **a_p);
void pf_offalloc_destroy(struct pf_offalloc *a);
/* Returns 0 and the node/offset of a range of `units`, or -ENOMEM. */
int pf_offalloc_alloc(struct pf_offalloc *a, uint32_t units, uint32_t *node_p, uint32_t *off_p);
void pf_offalloc_free(struct pf_offalloc *a, uint32_t node);
uint32_t pf_offalloc_free_units(const struct pf_offalloc *a);
uint32_t pf_offalloc_largest_free(const struct pf_offalloc *a);
uint32_t pf_offalloc_live(const struct pf_offalloc *a);

#endif

/* Pinned pool: mappings (one per NUMA node or one global), each split into shards with
 * their own lock and offset allocator. Memory is mapped once at start-up, bound to its
 * node, pre-touched by node-local threads (so first touch places pages locally and later
 * saves never page-fault), and registered with the GPU backend. */
#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PF_LOG_MOD "pool"
#include "pf/config.h"
#include "pf/hal_gpu.h"
#include "pf/log.h"
#include "pf/metrics.h"
#include "pf/pool.h"
#include "pf/thread.h"

#define MAX_MAPPINGS 64
#define MAX_SHARDS   1024

struct mapping {
    void *base;
    uint64_t len;
    uint64_t maplen; /* what was mmap'ed (hugepage rounding) */
    int numa;        /* -1: global */
    enum pf_pool_pages pages;
    struct pf_gpu_host_reg *reg;
};

struct pf_pool_region {
    struct pf_pool *pool;
    struct mapping *map;
    char *base;
    uint64_t len;
    pthread_mutex_t mu;
    struct pf_offalloc *oa;
};

struct pf_pool {
    uint64_t unit;
    uint64_t capacity;
    _Atomic uint64_t used;
    struct mapping maps[MAX_MAPPINGS];
    size_t nmaps;
    struct pf_pool_region *shards;
    size_t nshards;
    uint32_t shards_per_map;
    _Atomic uint32_t rr;
    struct pf_metric *m_cap, *m_used;
};

static uint64_t meminfo_kb(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

struct touch_job {
    char *base;
    uint64_t len;
    uint64_t page;
    int numa;
};

static void *touch_main(void *p)
{
    struct touch_job *j = p;
    for (uint64_t off = 0; off < j->len; off += j->page)
        ((volatile char *)j->base)[off] = 0;
    return NULL;
}

/* Parallel first touch: one thread per GiB, at most the number of CPUs. */
static void pretouch(char *base, uint64_t len, uint64_t page, int numa)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t nthr = len >> 30;
    if (nthr < 1)
        nthr = 1;
    if (ncpu > 0 && nthr > (uint64_t)ncpu)
        nthr = (uint64_t)ncpu;
    if (nthr > 64)
        nthr = 64;
    pthread_t t[64];
    struct touch_job jobs[64];
    uint64_t chunk = pf_round_up(len / nthr, page);
    size_t started = 0;
    for (uint64_t i = 0; i < nthr; i++) {
        uint64_t off = i * chunk;
        if (off >= len)
            break;
        jobs[i] = (struct touch_job){base + off, PF_MIN_OF(chunk, len - off), page, numa};
        if (pf_thread_start(&t[i], "pool-touch", numa, touch_main, &jobs[i]) != 0) {
            touch_main(&jobs[i]);
            continue;
        }
        started |= (size_t)1 << i;
    }
    for (uint64_t i = 0; i < nthr; i++)
        if (started & ((size_t)1 << i))
            pthread_join(t[i], NULL);
}

static uint64_t huge_page_size(void)
{
    uint64_t kb = meminfo_kb("Hugepagesize");
    return kb ? kb * 1024 : 2u << 20;
}

/* Whether the kernel's transparent huge pages honour MADV_HUGEPAGE ("always" or "madvise"
 * selected in /sys/kernel/mm/transparent_hugepage/enabled). */
static bool thp_enabled(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return false;
    char line[128] = "";
    bool on = fgets(line, sizeof(line), f) &&
              (strstr(line, "[always]") != NULL || strstr(line, "[madvise]") != NULL);
    fclose(f);
    return on;
}

/* An anonymous mapping of len bytes whose base is aligned to PF_POOL_ALIGN (over-mapped by
 * one alignment and trimmed), or MAP_FAILED. */
static void *mmap_aligned(uint64_t len)
{
    uint64_t over = len + PF_POOL_ALIGN;
    char *raw = mmap(NULL, over, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return MAP_FAILED;
    char *a = (char *)pf_round_up((uint64_t)(uintptr_t)raw, PF_POOL_ALIGN);
    if (a > raw)
        munmap(raw, (size_t)(a - raw));
    if (a + len < raw + over)
        munmap(a + len, (size_t)(raw + over - (a + len)));
    return a;
}

const char *pf_pool_pages_name(enum pf_pool_pages k)
{
    switch (k) {
    case PF_POOL_PAGES_HUGETLB:
        return "explicit huge pages (MAP_HUGETLB)";
    case PF_POOL_PAGES_THP:
        return "transparent huge pages (MADV_HUGEPAGE)";
    default:
        return "base pages (no huge pages reserved, transparent huge pages disabled)";
    }
}

static int map_region(struct mapping *m, uint64_t len, bool huge, int numa, char *err,
                      size_t errlen)
{
    uint64_t hp = huge_page_size();
    uint64_t page = huge ? hp : (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t maplen = pf_round_up(len, huge ? hp : PF_POOL_ALIGN);
    void *p = MAP_FAILED;
    enum pf_pool_pages kind = PF_POOL_PAGES_BASE;
    /* explicit huge pages: required with --use-hugepages, else taken when enough are
     * reserved and free (reserved at mmap, no MAP_NORESERVE: a shortage fails here, never
     * as SIGBUS at first touch); their mappings are huge-page aligned */
    bool try_huge = huge || (hp == PF_POOL_ALIGN && meminfo_kb("HugePages_Free") * 1024 >= maplen);
    if (try_huge) {
        p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
                 -1, 0);
        if (p != MAP_FAILED) {
            kind = PF_POOL_PAGES_HUGETLB;
            page = hp;
        } else if (!huge) {
            pf_info("pool: %llu MiB of explicit huge pages not available (%s): falling back to "
                    "transparent huge pages",
                    (unsigned long long)(maplen >> 20), strerror(errno));
        }
    }
    if (p == MAP_FAILED && !huge)
        p = mmap_aligned(maplen);
    if (p == MAP_FAILED) {
        int e = errno;
        char sz[32];
        pf_format_size(maplen, sz, sizeof(sz));
        if (huge)
            snprintf(err, errlen,
                     "--use-hugepages: cannot map %s of huge pages (%s); reserve them first: "
                     "echo N > /proc/sys/vm/nr_hugepages",
                     sz, strerror(e));
        else
            snprintf(err, errlen, "--pool-size: cannot map %s: %s", sz, strerror(e));
        return -e;
    }
    /* transparent huge pages where the kernel allows them: fewer TLB misses for copies,
     * fewer scatter segments per SSD request and NIC registration */
    if (kind != PF_POOL_PAGES_HUGETLB && madvise(p, maplen, MADV_HUGEPAGE) == 0 && thp_enabled())
        kind = PF_POOL_PAGES_THP;
    if (numa >= 0 && numa_available() >= 0) {
        struct bitmask *bm = numa_allocate_nodemask();
        numa_bitmask_setbit(bm, (unsigned)numa);
        if (mbind(p, maplen, MPOL_BIND, bm->maskp, bm->size + 1, 0) != 0)
            pf_warn("mbind of pool region to NUMA node %d failed: %s", numa, strerror(errno));
        numa_free_nodemask(bm);
    }
    pretouch(p, maplen, page, numa);
    m->base = p;
    m->len = len;
    m->maplen = maplen;
    m->numa = numa;
    m->pages = kind;
    return 0;
}

void pf_alloc_put(struct pf_alloc *a)
{
    if (!a)
        return;
    if (atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) != 1)
        return;
    struct pf_pool_region *r = a->region;
    pthread_mutex_lock(&r->mu);
    pf_offalloc_free(r->oa, a->node);
    pthread_mutex_unlock(&r->mu);
    struct pf_pool *p = r->pool;
    uint64_t used = atomic_fetch_sub(&p->used, a->size) - a->size;
    pf_metric_set(p->m_used, (double)used);
    free(a);
}

static int shard_alloc(struct pf_pool_region *r, uint64_t units, struct pf_alloc *a)
{
    uint32_t node, off;
    pthread_mutex_lock(&r->mu);
    int rc = pf_offalloc_alloc(r->oa, (uint32_t)units, &node, &off);
    pthread_mutex_unlock(&r->mu);
    if (rc)
        return rc;
    a->region = r;
    a->node = node;
    a->ptr = r->base + (uint64_t)off * r->pool->unit;
    a->size = units * r->pool->unit;
    atomic_init(&a->refs, 1);
    return 0;
}

int pf_pool_alloc(struct pf_pool *p, uint64_t size, int numa, struct pf_alloc **a_p)
{
    if (size == 0)
        return -EINVAL;
    uint64_t units = (size + p->unit - 1) / p->unit;
    if (units > UINT32_MAX)
        return -ENOMEM;
    struct pf_alloc *a = malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    size_t first = 0, count = p->nshards;
    int mi = numa >= 0 ? pf_pool_region_index(p, numa) : -1;
    if (mi >= 0) {
        first = (size_t)mi * p->shards_per_map;
        count = p->shards_per_map;
    }
    uint32_t start = atomic_fetch_add_explicit(&p->rr, 1, memory_order_relaxed);
    int rc = -ENOMEM;
    for (size_t i = 0; i < count && rc; i++)
        rc = shard_alloc(&p->shards[first + (start + i) % count], units, a);
    if (rc) {
        free(a);
        return rc;
    }
    uint64_t used = atomic_fetch_add(&p->used, a->size) + a->size;
    pf_metric_set(p->m_used, (double)used);
    *a_p = a;
    return 0;
}

uint64_t pf_pool_max_alloc(const struct pf_pool *p, int numa)
{
    size_t first = 0, count = p->nshards;
    int mi = numa >= 0 ? pf_pool_region_index(p, numa) : -1;
    if (mi >= 0) {
        first = (size_t)mi * p->shards_per_map;
        count = p->shards_per_map;
    }
    uint64_t max = 0;
    for (size_t i = 0; i < count; i++)
        if (p->shards[first + i].len > max)
            max = p->shards[first + i].len;
    return max / p->unit * p->unit;
}

int pf_pool_region_index(const struct pf_pool *p, int numa)
{
    if (p->nmaps == 1 && p->maps[0].numa < 0)
        return -1;
    for (size_t i = 0; i < p->nmaps; i++)
        if (p->maps[i].numa == numa)
            return (int)i;
    return -1;
}

uint64_t pf_pool_capacity(const struct pf_pool *p)
{
    return p->capacity;
}

uint64_t pf_pool_used(const struct pf_pool *p)
{
    return atomic_load(&((struct pf_pool *)p)->used);
}

uint64_t pf_pool_unit(const struct pf_pool *p)
{
    return p->unit;
}

uint64_t pf_pool_largest_free(struct pf_pool *p, int numa)
{
    size_t first = 0, count = p->nshards;
    int mi = numa >= 0 ? pf_pool_region_index(p, numa) : -1;
    if (mi >= 0) {
        first = (size_t)mi * p->shards_per_map;
        count = p->shards_per_map;
    }
    uint64_t best = 0;
    for (size_t i = first; i < first + count; i++) {
        pthread_mutex_lock(&p->shards[i].mu);
        uint64_t l = pf_offalloc_largest_free(p->shards[i].oa);
        pthread_mutex_unlock(&p->shards[i].mu);
        if (l > best)
            best = l;
    }
    return best * p->unit;
}

enum pf_pool_pages pf_pool_region_pages(const struct pf_pool *p, size_t i)
{
    return p->maps[i].pages;
}

size_t pf_pool_region_count(const struct pf_pool *p)
{
    return p->nmaps;
}

void pf_pool_region_info(const struct pf_pool *p, size_t i, void **base_p, uint64_t *len_p,
                         int *numa_p)
{
    *base_p = p->maps[i].base;
    *len_p = p->maps[i].len;
    *numa_p = p->maps[i].numa;
}

static uint64_t choose_unit(uint64_t size, uint64_t hint)
{
    uint64_t unit = hint ? hint : 512;
    uint64_t min_for_32bit = (size + UINT32_MAX - 1) / UINT32_MAX;
    if (unit < min_for_32bit)
        unit = min_for_32bit;
    return pf_round_up(unit, 512);
}

int pf_pool_create(const struct pf_pool_config *cfg, struct pf_pool **p_p, char *err, size_t errlen)
{
    char sz[32], av[32];
    if (cfg->size == 0) {
        snprintf(err, errlen, "--pool-size: must be greater than 0");
        return -EINVAL;
    }
    if (cfg->hugepages) {
        uint64_t hp = huge_page_size();
        uint64_t free_hp = meminfo_kb("HugePages_Free") * hp;
        if (free_hp < pf_round_up(cfg->size, hp)) {
            pf_format_size(cfg->size, sz, sizeof(sz));
            pf_format_size(free_hp, av, sizeof(av));
            snprintf(err, errlen,
                     "--use-hugepages: --pool-size %s needs that much in huge pages but only %s "
                     "are free; reserve more with echo N > /proc/sys/vm/nr_hugepages",
                     sz, av);
            return -ENOMEM;
        }
    } else if (!cfg->skip_memcheck) {
        uint64_t avail = meminfo_kb("MemAvailable") * 1024;
        if (avail && cfg->size > avail) {
            pf_format_size(cfg->size, sz, sizeof(sz));
            pf_format_size(avail, av, sizeof(av));
            snprintf(err, errlen,
                     "--pool-size %s exceeds the memory available on this machine (%s "
                     "MemAvailable); choose a smaller pool",
                     sz, av);
            return -ENOMEM;
        }
    }
    struct pf_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->unit = choose_unit(cfg->size, cfg->hint);
    p->shards_per_map = cfg->shards ? cfg->shards : 1;
    /* NUMA placement: one mapping per node in use when affinity is on and several nodes
     * exist; else one global mapping. */
    int nodes[MAX_MAPPINGS];
    size_t nn = 0;
    if (cfg->numa_affinity && numa_available() >= 0 && numa_num_configured_nodes() > 1) {
        if (cfg->numa_nodes && cfg->nnuma_nodes) {
            for (size_t i = 0; i < cfg->nnuma_nodes && nn < MAX_MAPPINGS; i++) {
                bool dup = false;
                for (size_t j = 0; j < nn; j++)
                    dup |= nodes[j] == cfg->numa_nodes[i];
                if (!dup && cfg->numa_nodes[i] >= 0)
                    nodes[nn++] = cfg->numa_nodes[i];
            }
        } else {
            for (int n = 0; n <= numa_max_node() && nn < MAX_MAPPINGS; n++)
                if (numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)n))
                    nodes[nn++] = n;
        }
    }
    int rc = 0;
    size_t nmaps = nn > 1 ? nn : 1;
    uint64_t per = pf_round_down(cfg->size / nmaps, p->unit);
    if (per < p->unit) {
        snprintf(err, errlen, "--pool-size: too small for %zu NUMA regions of one unit", nmaps);
        rc = -EINVAL;
        goto err_free;
    }
    for (size_t i = 0; i < nmaps; i++) {
        rc = map_region(&p->maps[i], per, cfg->hugepages, nn > 1 ? nodes[i] : -1, err, errlen);
        if (rc)
            goto err_unmap;
        p->nmaps++;
        if (cfg->gpu) {
            rc =
                pf_gpu_host_register(cfg->gpu, p->maps[i].base, p->maps[i].maplen, &p->maps[i].reg);
            if (rc) {
                snprintf(err, errlen, "cannot register the pinned pool with the GPU: %s",
                         strerror(-rc));
                goto err_unmap;
            }
        }
    }
    p->nshards = p->nmaps * p->shards_per_map;
    p->shards = calloc(p->nshards, sizeof(*p->shards));
    if (!p->shards) {
        rc = -ENOMEM;
        goto err_unmap;
    }
    for (size_t m = 0; m < p->nmaps; m++) {
        uint64_t units = p->maps[m].len / p->unit;
        uint64_t per_shard = units / p->shards_per_map;
        /* shard bases on PF_POOL_ALIGN boundaries when the unit divides it and each shard
         * keeps at least one alignment (the last shard takes the remainder) */
        uint64_t au = PF_POOL_ALIGN % p->unit == 0 ? PF_POOL_ALIGN / p->unit : 0;
        if (au && per_shard >= au)
            per_shard = per_shard / au * au;
        for (uint32_t s = 0; s < p->shards_per_map; s++) {
            struct pf_pool_region *r = &p->shards[m * p->shards_per_map + s];
            uint64_t u = s + 1 == p->shards_per_map ? units - per_shard * s : per_shard;
            r->pool = p;
            r->map = &p->maps[m];
            r->base = (char *)p->maps[m].base + per_shard * s * p->unit;
            r->len = u * p->unit;
            pthread_mutex_init(&r->mu, NULL);
            rc = pf_offalloc_create((uint32_t)u, 0, &r->oa);
            if (rc) {
                snprintf(err, errlen, "cannot create the pool allocator: %s", strerror(-rc));
                goto err_unmap;
            }
            p->capacity += r->len;
        }
    }
    p->m_cap = pf_metric_gauge("pegaflow_pool_capacity_bytes", "Pinned pool capacity", NULL);
    p->m_used = pf_metric_gauge("pegaflow_pool_used_bytes", "Pinned pool bytes in use", NULL);
    pf_metric_set(p->m_cap, (double)p->capacity);
    pf_metric_set(p->m_used, 0);
    pf_format_size(p->capacity, sz, sizeof(sz));
    pf_info("pinned pool: %s in %zu region(s) x %u shard(s), unit %llu bytes%s", sz, p->nmaps,
            p->shards_per_map, (unsigned long long)p->unit, cfg->hugepages ? ", hugepages" : "");
    for (size_t m = 0; m < p->nmaps; m++)
        pf_info("  region %zu: NUMA %s%d, %llu bytes at %p, %s", m,
                p->maps[m].numa < 0 ? "any/" : "", p->maps[m].numa,
                (unsigned long long)p->maps[m].len, p->maps[m].base,
                pf_pool_pages_name(p->maps[m].pages));
    *p_p = p;
    return 0;
err_unmap:
    pf_pool_destroy(p);
    return rc;
err_free:
    free(p);
    return rc;
}

void pf_pool_destroy(struct pf_pool *p)
{
    if (!p)
        return;
    for (size_t i = 0; p->shards && i < p->nshards; i++) {
        pf_offalloc_destroy(p->shards[i].oa);
        pthread_mutex_destroy(&p->shards[i].mu);
    }
    free(p->shards);
    for (size_t m = 0; m < p->nmaps; m++) {
        pf_gpu_host_unregister(p->maps[m].reg);
        munmap(p->maps[m].base, p->maps[m].maplen);
    }
    free(p);
}

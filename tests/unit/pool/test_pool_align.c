/* Pool placement (issue 23 item 2): every mapping and every shard of it starts on a 2 MiB
 * (PF_POOL_ALIGN) boundary, whatever the pool size, shard count and NUMA layout, so NIC and
 * GPU registrations cover whole huge pages; the pages backing each region are the ones this
 * machine offers (explicit huge pages when enough are reserved and free, else transparent
 * huge pages when the kernel honours MADV_HUGEPAGE, else base pages: mm/hugetlb and the
 * transparent_hugepage/enabled modes, Documentation/admin-guide/mm/transhuge.rst), and the
 * memory is usable end to end. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/pool.h"

static uint64_t meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':')
            v = strtoull(line + kl + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static bool thp_on(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    bool on = f && fgets(line, sizeof(line), f) &&
              (strstr(line, "[always]") || strstr(line, "[madvise]"));
    if (f)
        fclose(f);
    return on;
}

/* What pf_pool_create should have chosen for a region of len bytes on this machine. */
static enum pf_pool_pages expected(uint64_t len)
{
    uint64_t need = (len + PF_POOL_ALIGN - 1) / PF_POOL_ALIGN * PF_POOL_ALIGN;
    if (meminfo("Hugepagesize") * 1024 == PF_POOL_ALIGN && meminfo("HugePages_Free") * 1024 >= need)
        return PF_POOL_PAGES_HUGETLB;
    return thp_on() ? PF_POOL_PAGES_THP : PF_POOL_PAGES_BASE;
}

static void check_pool(uint64_t size, uint32_t shards, uint64_t hint)
{
    struct pf_pool *p;
    char err[256];
    struct pf_pool_config c = {.size = size, .hint = hint, .shards = shards};
    assert_int_equal(pf_pool_create(&c, &p, err, sizeof(err)), 0);
    for (size_t r = 0; r < pf_pool_region_count(p); r++) {
        void *base;
        uint64_t len;
        int numa;
        pf_pool_region_info(p, r, &base, &len, &numa);
        assert_int_equal((uintptr_t)base % PF_POOL_ALIGN, 0);
        enum pf_pool_pages k = pf_pool_region_pages(p, r);
        /* a racing reservation by another process may take the free huge pages between
         * the check and the mmap: the fallback is then the right answer too */
        if (expected(len) == PF_POOL_PAGES_HUGETLB)
            assert_true(k == PF_POOL_PAGES_HUGETLB || k == (thp_on() ? PF_POOL_PAGES_THP : 0));
        else
            assert_int_equal(k, expected(len));
        assert_non_null(pf_pool_pages_name(k));
    }
    /* the first allocation of each (empty) shard starts at the shard's base: allocations
     * rotate over the shards */
    struct pf_alloc *a[64];
    uint64_t unit = pf_pool_unit(p);
    for (uint32_t i = 0; i < shards; i++) {
        assert_int_equal(pf_pool_alloc(p, unit, -1, &a[i]), 0);
        if (PF_POOL_ALIGN % unit == 0)
            assert_int_equal((uintptr_t)a[i]->ptr % PF_POOL_ALIGN, 0);
        memset(a[i]->ptr, (int)i + 1, a[i]->size);
    }
    for (uint32_t i = 0; i < shards; i++) {
        assert_int_equal(((uint8_t *)a[i]->ptr)[a[i]->size - 1], (uint8_t)(i + 1));
        pf_alloc_put(a[i]);
    }
    assert_int_equal(pf_pool_used(p), 0);
    pf_pool_destroy(p);
}

static void test_aligned_regions_and_shards(void **st)
{
    (void)st;
    check_pool(64ull << 20, 1, 0);
    check_pool((64ull << 20) + 12345, 3, 0); /* odd size: rounded, shards still aligned */
    check_pool(40ull << 20, 7, 4096);
    check_pool(1ull << 20, 1, 0);     /* below one alignment: the base is still aligned */
    check_pool(24ull << 20, 2, 1536); /* a unit that does not divide 2 MiB: base only */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_aligned_regions_and_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* pf_app_malloc_settings: the server's malloc thresholds, checked by what glibc then does (a
 * 1 MiB block from the arena, not mmap; a freed one kept, not handed back), and left alone
 * when GLIBC_TUNABLES names a threshold. */
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/app.h"

static void test_tunables_win(void **st)
{
    assert_int_equal(pf_app_malloc_settings("glibc.malloc.trim_threshold=1000000"), 1);
    assert_int_equal(pf_app_malloc_settings("glibc.malloc.tcache_count=0:"
                                            "glibc.malloc.mmap_threshold=65536"),
                     1);
}

static void test_thresholds_applied(void **st)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    print_message("skipped: a sanitizer's allocator replaces glibc malloc in this build\n");
    skip();
#endif
    assert_int_equal(pf_app_malloc_settings("glibc.malloc.tcache_count=7"), 0);
    struct mallinfo2 m0 = mallinfo2();
    /* below the mmap threshold: from the arena (glibc's default would mmap it at first) */
    uint8_t *a = malloc(1 << 20);
    assert_non_null(a);
    memset(a, 0x5a, 1 << 20);
    struct mallinfo2 m1 = mallinfo2();
    assert_int_equal(m1.hblks, m0.hblks);
    /* freed: kept in the arena (under the trim threshold), not handed back */
    free(a);
    struct mallinfo2 m2 = mallinfo2();
    assert_true(m2.fordblks >= m0.fordblks + (1 << 20) - 4096);
    /* at the threshold and above: mmap, as before */
    uint8_t *b = malloc(PF_APP_MALLOC_MMAP_MIN + 4096);
    assert_non_null(b);
    struct mallinfo2 m3 = mallinfo2();
    assert_int_equal(m3.hblks, m0.hblks + 1);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tunables_win),
        cmocka_unit_test(test_thresholds_applied),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Fault-spec parser and decision rules (prob/nth/times/actions/seed). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pf/fault.h"

static struct pf_fault_plan *parse_ok(const char *spec)
{
    struct pf_fault_plan *p = NULL;
    char err[256];
    int rc = pf_fault_plan_parse(spec, &p, err, sizeof(err));
    if (rc)
        fail_msg("parse '%s': %s", spec, err);
    return p;
}

static void expect_bad(const char *spec, const char *want)
{
    struct pf_fault_plan *p = NULL;
    char err[256] = "";
    assert_int_equal(pf_fault_plan_parse(spec, &p, err, sizeof(err)), -EINVAL);
    assert_null(p);
    if (!strstr(err, want))
        fail_msg("error for '%s' was '%s', expected '%s'", spec, err, want);
}

static void test_parse_errors(void **st)
{
    expect_bad("", "no rules");
    expect_bad("gpu.nope:error=EIO", "unknown op");
    expect_bad("gpu.d2h:error=EWHAT", "not an errno");
    expect_bad("gpu.d2h:prob=2", "prob=2");
    expect_bad("gpu.d2h:nth=0", "positive");
    expect_bad("gpu.d2h:bogus=1", "unknown key");
    expect_bad("gpu.d2h:error", "key=value");
    expect_bad("gpu.d2h:at=later", "at=later");
    expect_bad("seed=x;gpu.d2h:error=EIO", "seed=x");
    expect_bad("gpu.d2h:corrupt=maybe", "corrupt=maybe");
    /* engine.seal postpones sealing; it has nothing that could fail */
    expect_bad("engine.seal:error=EIO", "delay=MS only");
    expect_bad("engine.seal:delay=5,corrupt=1", "delay=MS only");
    expect_bad("engine.seal:nth=2", "delay=MS only");
    expect_bad("engine.*:delay=5", "unknown op");
    /* stall holds a READ's submission; other ops have delay */
    expect_bad("blk.write:stall=5", "net.read only");
    expect_bad("net.*:stall=5", "net.read only");
    expect_bad("net.read:stall=x", "stall=x");
}

static void test_net_read_stall(void **st)
{
    struct pf_fault_plan *p =
        parse_ok("net.read:nth=2,drop=1,times=1;net.read:nth=3,stall=40,times=1");
    struct pf_fault_hit h;
    assert_false(pf_fault_check(p, "net.read", &h));
    assert_true(pf_fault_check(p, "net.read", &h));
    assert_true(h.drop);
    assert_int_equal(h.stall_ms, 0);
    assert_true(pf_fault_check(p, "net.read", &h));
    assert_int_equal(h.stall_ms, 40);
    assert_int_equal(h.error, 0); /* a stall alone is not a failure */
    assert_false(h.drop || h.corrupt || h.fatal);
    assert_false(pf_fault_check(p, "net.read", &h));
    pf_fault_plan_free(p);
}

static void test_engine_seal_delay(void **st)
{
    struct pf_fault_plan *p = parse_ok("engine.seal:delay=40,times=2");
    struct pf_fault_hit h;
    assert_true(pf_fault_check(p, "engine.seal", &h));
    assert_int_equal(h.delay_ms, 40);
    assert_int_equal(h.error, 0);
    assert_false(h.corrupt || h.drop || h.fatal || h.at_complete);
    assert_true(pf_fault_check(p, "engine.seal", &h));
    assert_false(pf_fault_check(p, "engine.seal", &h)); /* times=2 */
    assert_false(pf_fault_plan_covers(p, "gpu"));
    pf_fault_plan_free(p);
}

static void test_nth_times(void **st)
{
    struct pf_fault_plan *p = parse_ok("seed=7;blk.write:nth=3,error=ENOSPC");
    assert_int_equal(pf_fault_plan_seed(p), 7);
    struct pf_fault_hit h;
    assert_false(pf_fault_check(p, "blk.write", &h));
    assert_false(pf_fault_check(p, "blk.write", &h));
    assert_true(pf_fault_check(p, "blk.write", &h));
    assert_int_equal(h.error, -ENOSPC);
    assert_false(h.at_complete);
    /* nth without prob fires once by default */
    for (int i = 0; i < 10; i++)
        assert_false(pf_fault_check(p, "blk.write", &h));
    assert_false(pf_fault_check(p, "blk.read", &h));
    assert_int_equal(pf_fault_fired(p), 1);
    pf_fault_plan_free(p);

    p = parse_ok("net.read:corrupt=1,times=2");
    int fired = 0;
    for (int i = 0; i < 10; i++)
        if (pf_fault_check(p, "net.read", &h)) {
            fired++;
            assert_true(h.corrupt);
            assert_int_equal(h.error, 0);
        }
    assert_int_equal(fired, 2);
    pf_fault_plan_free(p);
}

static void test_prob_is_seeded(void **st)
{
    int a[200], b[200];
    for (int run = 0; run < 2; run++) {
        struct pf_fault_plan *p = parse_ok("seed=42;net.read:prob=0.3,error=EIO");
        struct pf_fault_hit h;
        int n = 0;
        for (int i = 0; i < 200; i++) {
            int f = pf_fault_check(p, "net.read", &h);
            (run ? b : a)[i] = f;
            n += f;
        }
        assert_true(n > 20 && n < 120); /* ~60 expected; wide bounds, deterministic seed */
        pf_fault_plan_free(p);
    }
    assert_memory_equal(a, b, sizeof(a));
}

static void test_actions_and_wildcard(void **st)
{
    struct pf_fault_plan *p =
        parse_ok("gpu.*:delay=5,at=complete,error=EIO;net.connect:fatal=1;blk.read:drop=1");
    struct pf_fault_hit h;
    assert_true(pf_fault_check(p, "gpu.h2d", &h));
    assert_int_equal(h.delay_ms, 5);
    assert_true(h.at_complete);
    assert_int_equal(h.error, -EIO);
    assert_true(pf_fault_check(p, "gpu.sync", &h));
    assert_true(pf_fault_check(p, "net.connect", &h));
    assert_true(h.fatal);
    assert_int_equal(h.error, -EIO);
    assert_true(pf_fault_check(p, "blk.read", &h));
    assert_true(h.drop);
    assert_true(pf_fault_plan_covers(p, "gpu"));
    assert_true(pf_fault_plan_covers(p, "net"));
    assert_true(pf_fault_plan_covers(p, "blk"));
    pf_fault_plan_free(p);
    p = parse_ok("net.read:error=ECONNRESET");
    assert_false(pf_fault_plan_covers(p, "gpu"));
    assert_false(pf_fault_check(NULL, "net.read", &h));
    pf_fault_plan_free(p);
}

static void test_corrupt_always_changes(void **st)
{
    struct pf_fault_plan *p = parse_ok("seed=1;net.read:corrupt=1");
    for (size_t len = 1; len < 300; len += 7) {
        unsigned char a[300], b[300];
        memset(a, 0x5a, len);
        memcpy(b, a, len);
        pf_fault_corrupt(p, b, len);
        assert_memory_not_equal(a, b, len);
    }
    pf_fault_plan_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_errors),           cmocka_unit_test(test_nth_times),
        cmocka_unit_test(test_prob_is_seeded),         cmocka_unit_test(test_actions_and_wildcard),
        cmocka_unit_test(test_corrupt_always_changes), cmocka_unit_test(test_engine_seal_delay),
        cmocka_unit_test(test_net_read_stall),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

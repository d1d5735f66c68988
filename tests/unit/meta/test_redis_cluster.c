/* Redis Cluster client: key slots match Redis' own (CRC16/XMODEM mod 16384, hash tags), every
 * slot has a tag that maps to it, bad configurations are refused, and an unreachable Redis
 * fails fast with -ENOTCONN (no seed answers). Cluster routing, MOVED and failures against
 * real servers: tests/integration/test_metaserver_redis.sh. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "meta/meta_internal.h"
#include "pf/clock.h"

static void test_slots_match_redis(void **state)
{
    (void)state;
    /* values from redis-cli CLUSTER KEYSLOT */
    assert_int_equal(pf_redis_slot("foo", 3), 12182);
    assert_int_equal(pf_redis_slot("bar", 3), 5061);
    assert_int_equal(pf_redis_slot("123456789", 9), 0x31c3 & 16383);
    /* hash tags: only the first {...} with something inside counts */
    assert_int_equal(pf_redis_slot("{user1000}.following", 20), pf_redis_slot("user1000", 8));
    assert_int_not_equal(pf_redis_slot("foo{}{bar}", 10), pf_redis_slot("bar", 3)); /* whole key */
    assert_int_equal(pf_redis_slot("foo{{bar}}zap", 13), pf_redis_slot("{bar", 4));
    assert_int_equal(pf_redis_slot("foo{bar}{zap}", 13), pf_redis_slot("bar", 3));
    for (unsigned s = 0; s < 16384; s++) {
        char k[32];
        int l = snprintf(k, sizeof(k), "pf:c:{%s}", pf_redis_slot_tag((uint16_t)s));
        assert_int_equal(pf_redis_slot(k, (size_t)l), s);
    }
}

static void test_open_rejects_and_fails_fast(void **state)
{
    (void)state;
    struct pf_redis *r;
    struct pf_redis_config bad = {.seeds = "nohostport", .timeout_ms = 100};
    assert_int_equal(pf_redis_open(&bad, &r), -EINVAL);
    bad.seeds = "h:0";
    assert_int_equal(pf_redis_open(&bad, &r), -EINVAL);
    bad.seeds = "h:70000";
    assert_int_equal(pf_redis_open(&bad, &r), -EINVAL);
    bad.seeds = "127.0.0.1:1";
    bad.timeout_ms = 0;
    assert_int_equal(pf_redis_open(&bad, &r), -EINVAL);
    pf_redis_close(NULL);
    /* port 1 on loopback: connection refused at once */
    struct pf_redis_config cfg = {.seeds = "127.0.0.1:1,127.0.0.1:2", .timeout_ms = 500};
    assert_int_equal(pf_redis_open(&cfg, &r), 0);
    const char *argv[] = {"GET", "k"};
    size_t lens[] = {3, 1};
    struct pf_redis_cmd c = {.argc = 2, .argv = argv, .argvlen = lens, .slot = 0};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pf_redis_exec(r, &c, 1), -ENOTCONN);
        assert_null(c.reply);
    }
    assert_int_equal(pf_redis_nmasters(r), 0);
    assert_null(pf_redis_script_sha(r, 0));
    pf_redis_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_match_redis),
        cmocka_unit_test(test_open_rejects_and_fails_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

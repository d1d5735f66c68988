/* Flag parsing, size parsing, addresses, URLs and the server's cross-flag rules. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/app.h"
#include "pf/config.h"

static void test_sizes_good(void **st)
{
    struct {
        const char *in;
        uint64_t out;
    } cases[] = {
        {"0", 0},
        {"512", 512},
        {"512b", 512},
        {"1kb", 1024},
        {"1KB", 1024},
        {"4k", 4096},
        {"2mb", 2u << 20},
        {"2MiB", 2u << 20},
        {"30gb", 30ull << 30},
        {"30GB", 30ull << 30},
        {"1.5gb", 3ull << 29},
        {"1tb", 1ull << 40},
        {" 64mb", 64ull << 20},
        {"2 mb", 2ull << 20},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t v = 1234567;
        assert_int_equal(pf_parse_size(cases[i].in, &v), 0);
        assert_int_equal(v, cases[i].out);
    }
}

static void test_sizes_bad(void **st)
{
    const char *bad[] = {"",    "12xb", "gb",   "-1gb",          "1.5", "1e400gb",
                         "abc", "1gb2", "0x10", "99999999999tb", NULL};
    for (size_t i = 0; bad[i]; i++) {
        uint64_t v = 42;
        assert_int_not_equal(pf_parse_size(bad[i], &v), 0);
        assert_int_equal(v, 42); /* output untouched on failure */
    }
}

static void test_format_size(void **st)
{
    char b[32];
    pf_format_size(30ull << 30, b, sizeof(b));
    assert_string_equal(b, "30gb");
    pf_format_size(1536ull << 20, b, sizeof(b));
    assert_string_equal(b, "1.50gb");
    pf_format_size(100, b, sizeof(b));
    assert_string_equal(b, "100b");
}

static void test_addr(void **st)
{
    char host[64];
    uint16_t port;
    assert_int_equal(pf_addr_split("127.0.0.1:50055", host, sizeof(host), &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 50055);
    assert_int_equal(pf_addr_split("[::1]:9", host, sizeof(host), &port), 0);
    assert_string_equal(host, "::1");
    assert_int_not_equal(pf_addr_split("nohost", host, sizeof(host), &port), 0);
    assert_int_not_equal(pf_addr_split("h:70000", host, sizeof(host), &port), 0);
    assert_int_not_equal(pf_addr_split(":80", host, sizeof(host), &port), 0);
    assert_int_not_equal(pf_addr_split("::1:80", host, sizeof(host), &port), 0);
    char err[128];
    assert_int_equal(pf_addr_check("127.0.0.1:1", err, sizeof(err)), 0);
    assert_int_equal(pf_addr_check("nohost", err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "nohost"));
    assert_int_equal(pf_addr_check("no-such-host.invalid:1", err, sizeof(err)), -EHOSTUNREACH);
    assert_true(pf_addr_is_unroutable("0.0.0.0:1"));
    assert_true(pf_addr_is_unroutable("127.0.0.1:1"));
    assert_true(pf_addr_is_unroutable("localhost:1"));
    assert_true(pf_addr_is_unroutable("[::]:1"));
    assert_false(pf_addr_is_unroutable("10.0.0.1:1"));
    assert_false(pf_addr_is_unroutable("127.0.0.2:1"));
}

static void test_url(void **st)
{
    char t[64];
    assert_int_equal(pf_url_to_target("http://10.0.0.100:50056", t, sizeof(t)), 0);
    assert_string_equal(t, "10.0.0.100:50056");
    assert_int_equal(pf_url_to_target("10.0.0.100:50056/", t, sizeof(t)), 0);
    assert_string_equal(t, "10.0.0.100:50056");
    assert_int_equal(pf_url_to_target("https://x:1", t, sizeof(t)), -EPROTONOSUPPORT);
    assert_int_not_equal(pf_url_to_target("http://nohostport", t, sizeof(t)), 0);
    assert_int_not_equal(pf_url_to_target("http://h:0", t, sizeof(t)), 0);
}

static int parse(struct pf_server_config *c, char *err, size_t n, ...)
{
    char *argv[32] = {"pegaflow-server"};
    int argc = 1;
    va_list ap;
    va_start(ap, n);
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    return pf_server_config_parse(c, argc, argv, err, n);
}

static void test_server_defaults(void **st)
{
    struct pf_server_config c;
    char err[256];
    unsetenv("PEGAFLOW_FAULTS");
    assert_int_equal(parse(&c, err, sizeof(err), NULL), 0);
    assert_string_equal(c.addr, "127.0.0.1:50055");
    assert_string_equal(c.http_addr, "0.0.0.0:9091");
    assert_int_equal(c.pool_size, 30ull << 30);
    assert_int_equal(c.hint_value_size, 0);
    assert_false(c.use_hugepages);
    assert_true(c.enable_prometheus);
    assert_int_equal(c.metrics_period_secs, 10);
    assert_int_equal(c.ssd_cache_capacity, 512ull << 30);
    assert_int_equal(c.ssd_write_queue_depth, 8);
    assert_int_equal(c.ssd_prefetch_queue_depth, 2);
    assert_int_equal(c.ssd_write_inflight, 2);
    assert_int_equal(c.ssd_prefetch_inflight, 16);
    assert_int_equal(c.max_prefetch_blocks, 800);
    assert_true(c.ssd_recover); /* issue 25: recovery on by default */
    assert_false(c.ssd_reformat);
    assert_int_equal(c.ssd_drain_timeout_secs, 5);
    assert_int_equal(c.ssd_prefetch_staging, 1ull << 30);
    assert_int_equal(c.transfer_lock_timeout_secs, 120);
    assert_int_equal(c.metaserver_queue_depth, 4096);
    assert_int_equal(c.rpc_threads, 8);
    assert_int_equal(c.log_level, PF_LOG_INFO);
    assert_true(c.integrity);
    assert_string_equal(c.gpu_backend, "auto");
    assert_int_equal(c.nics.n, 0);
    pf_server_config_free(&c);
}

static void test_server_values(void **st)
{
    struct pf_server_config c;
    char err[256];
    assert_int_equal(parse(&c, err, sizeof(err), "--pool-size", "1.5GB", "--devices", "0,2", "3",
                           "--use-hugepages", "--enable-prometheus=false", "--log-level", "DEBUG",
                           "--ssd-cache-path", "/a", "--ssd-cache-path", "/b", "/c", "--integrity",
                           "off", "--hint-value-size", "64kb", NULL),
                     0);
    assert_int_equal(c.pool_size, 3ull << 29);
    assert_int_equal(c.ndevice_ids, 3);
    assert_int_equal(c.device_ids[0], 0);
    assert_int_equal(c.device_ids[1], 2);
    assert_int_equal(c.device_ids[2], 3);
    assert_true(c.use_hugepages);
    assert_false(c.enable_prometheus);
    assert_int_equal(c.log_level, PF_LOG_DEBUG);
    assert_int_equal(c.ssd_cache_path.n, 3);
    assert_string_equal(c.ssd_cache_path.v[2], "/c");
    assert_false(c.integrity);
    assert_int_equal(c.hint_value_size, 64 * 1024);
    pf_server_config_free(&c);
}

static void expect_error(const char *want, ...)
{
    char *argv[32] = {"pegaflow-server"};
    int argc = 1;
    va_list ap;
    va_start(ap, want);
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    struct pf_server_config c;
    char err[300] = "";
    assert_int_equal(pf_server_config_parse(&c, argc, argv, err, sizeof(err)), -EINVAL);
    if (!strstr(err, want))
        fail_msg("error '%s' does not mention '%s'", err, want);
    pf_server_config_free(&c);
}

static void test_server_errors(void **st)
{
    expect_error("--pool-size", "--pool-size", "12xb", NULL);
    expect_error("--pool-size", "--pool-size", "0", NULL);
    expect_error("--addr", "--addr", "nohost", NULL);
    expect_error("--log-level", "--log-level", "loud", NULL);
    expect_error("--bogus", "--bogus", NULL);
    expect_error("missing value", "--addr", NULL);
    expect_error("unexpected argument", "stray", NULL);
    expect_error("--devices", "--devices", "x", NULL);
    expect_error("listed twice", "--devices", "1,1", NULL);
    expect_error("--metric-hll-bucket-bits", "--metric-hll-bucket-bits", "3", NULL);
    expect_error("--metric-hll-windows", "--metric-hll-windows", "30s", NULL);
    expect_error("--metric-hll-windows", "--metric-hll-windows", "1h,60m", NULL);
    expect_error("--metric-hll-windows", "--metric-hll-windows", "-1m", NULL);
    expect_error("--metric-hll-windows", "--metric-hll-windows", "15m,-1h", NULL);
    expect_error("--trace-sample-rate", "--trace-sample-rate", "2", NULL);
    expect_error("--use-hugepages", "--use-hugepages=maybe", NULL);
    expect_error("more than once", "--pool-size", "1gb", "--pool-size", "2gb", NULL);
    expect_error("--gpu-backend", "--gpu-backend", "opencl", NULL);
    expect_error("--nics", "--nics", "eth0", NULL);
    expect_error("--metaserver-addr", "--metaserver-addr", "http://10.0.0.1:1", NULL);
    expect_error("not routable", "--nics", "eth0", "--metaserver-addr", "http://127.0.0.1:1", NULL);
    expect_error("not routable", "--nics", "eth0", "--metaserver-addr", "http://127.0.0.1:1",
                 "--addr", "0.0.0.0:50055", NULL);
    expect_error("--metaserver-addr", "--nics", "eth0", "--metaserver-addr", "ftp://x:1", "--addr",
                 "127.0.0.2:1", NULL);
    expect_error("--enable-debug", "--fault-spec", "gpu.d2h:error=EIO", NULL);
    expect_error("unknown op", "--enable-debug", "--fault-spec", "gpu.nope:error=EIO", NULL);
    setenv("PEGAFLOW_FAULTS", "gpu.d2h:error=EIO", 1);
    expect_error("PEGAFLOW_FAULTS", NULL);
    unsetenv("PEGAFLOW_FAULTS");
}

static void test_p2p_ok(void **st)
{
    struct pf_server_config c;
    char err[256];
    /* (P2P needs a cluster token or --insecure-cluster: tests/unit/app/test_server_help) */
    assert_int_equal(parse(&c, err, sizeof(err), "--nics", "veth0", "veth1", "--metaserver-addr",
                           "http://127.0.0.1:50056", "--addr", "127.0.0.2:50055",
                           "--insecure-cluster", NULL),
                     0);
    assert_int_equal(c.nics.n, 2);
    assert_string_equal(c.metaserver_target, "127.0.0.1:50056");
    pf_server_config_free(&c);
    /* several replicas (issue 14): comma-separated URLs -> "host:port,host:port" */
    assert_int_equal(parse(&c, err, sizeof(err), "--nics", "veth0", "--metaserver-addr",
                           "http://10.0.0.1:50056,10.0.0.2:50057", "--addr", "127.0.0.2:50055",
                           "--insecure-cluster", NULL),
                     0);
    assert_string_equal(c.metaserver_target, "10.0.0.1:50056,10.0.0.2:50057");
    pf_server_config_free(&c);
    expect_error("empty or overlong entry", "--nics", "veth0", "--metaserver-addr",
                 "http://10.0.0.1:1,", "--addr", "127.0.0.2:1", NULL);
    expect_error("'ftp://x:1' is not a MetaServer address", "--nics", "veth0", "--metaserver-addr",
                 "http://10.0.0.1:1,ftp://x:1", "--addr", "127.0.0.2:1", NULL);
}

static void test_meta_flags(void **st)
{
    struct pf_meta_config c;
    char err[256];
    char *argv1[] = {"m"};
    assert_int_equal(pf_meta_config_parse(&c, 1, argv1, err, sizeof(err)), 0);
    assert_string_equal(c.addr, "127.0.0.1:50056");
    assert_string_equal(c.http_addr, "0.0.0.0:9092");
    assert_int_equal(c.ttl_minutes, 120);
    assert_int_equal(c.node_stale_secs, 30);
    assert_int_equal(c.sweep_interval_secs, 600);
    pf_meta_config_free(&c);
    char *argv2[] = {"m", "--ttl-minutes", "0"};
    assert_int_equal(pf_meta_config_parse(&c, 3, argv2, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--ttl-minutes"));
    pf_meta_config_free(&c);
    char *argv3[] = {"m", "--sweep-interval-secs", "0"};
    assert_int_equal(pf_meta_config_parse(&c, 3, argv3, err, sizeof(err)), -EINVAL);
    pf_meta_config_free(&c);
    char *argv4[] = {"m", "--ttl-minutes", "1", "--node-stale-secs", "61"};
    assert_int_equal(pf_meta_config_parse(&c, 5, argv4, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "shorter"));
    pf_meta_config_free(&c);
    char *argv5[] = {"m"};
    assert_int_equal(pf_meta_config_parse(&c, 1, argv5, err, sizeof(err)), 0);
    assert_string_equal(c.store, "memory");
    pf_meta_config_free(&c);
    char *argv6[] = {"m", "--store", "redis://10.0.0.5:7000,10.0.0.6:7000"};
    assert_int_equal(pf_meta_config_parse(&c, 3, argv6, err, sizeof(err)), 0);
    assert_string_equal(c.store, "redis://10.0.0.5:7000,10.0.0.6:7000");
    pf_meta_config_free(&c);
    char *argv7[] = {"m", "--store", "mongodb://x:1"};
    assert_int_equal(pf_meta_config_parse(&c, 3, argv7, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "--store"));
    pf_meta_config_free(&c);
}

static void test_help_version(void **st)
{
    struct pf_server_config c;
    char err[64];
    char *a1[] = {"s", "--help"};
    assert_int_equal(pf_server_config_parse(&c, 2, a1, err, sizeof(err)), 1);
    pf_server_config_free(&c);
    char *a2[] = {"s", "--version"};
    assert_int_equal(pf_server_config_parse(&c, 2, a2, err, sizeof(err)), 2);
    pf_server_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_good),    cmocka_unit_test(test_sizes_bad),
        cmocka_unit_test(test_format_size),   cmocka_unit_test(test_addr),
        cmocka_unit_test(test_url),           cmocka_unit_test(test_server_defaults),
        cmocka_unit_test(test_server_values), cmocka_unit_test(test_server_errors),
        cmocka_unit_test(test_p2p_ok),        cmocka_unit_test(test_meta_flags),
        cmocka_unit_test(test_help_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

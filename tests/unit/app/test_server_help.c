/* pegaflow-server --help in the seeds' sections, and refusals of flag combinations that name
 * the flags and print a command line that works (the example itself is parsed here). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "app/app.h"
#include "pf/config.h"
#include "pf/meta.h"

static int parse(struct pf_server_config *cfg, char *err, size_t errlen, const char *line)
{
    char *buf = strdup(line), *argv[64], *save = NULL;
    int argc = 0;
    assert_non_null(buf);
    for (char *t = strtok_r(buf, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    argv[argc] = NULL;
    int rc = pf_server_config_parse(cfg, argc, argv, err, errlen);
    free(buf);
    return rc;
}

/* refused with both flags named; the "e.g. ..." command line in the message parses */
static void expect_refusal_with_example(const char *line, const char *want1, const char *want2)
{
    struct pf_server_config cfg;
    char err[512] = "";
    assert_int_equal(parse(&cfg, err, sizeof(err), line), -EINVAL);
    pf_server_config_free(&cfg);
    print_message("%s -> %s\n", line, err);
    assert_non_null(strstr(err, want1));
    assert_non_null(strstr(err, want2));
    assert_null(strchr(err, '\n'));
    const char *ex = strstr(err, "e.g. ");
    assert_non_null(ex);
    /* the example's token file (/etc/pegaflow/cluster-token, P2P needs one) -> a real one */
    static const char etc[] = "/etc/pegaflow/cluster-token";
    char tok[] = "/tmp/pf-token-XXXXXX", cmd[700];
    int fd = mkstemp(tok);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "s3cret\n", 7), 7);
    close(fd);
    const char *at = strstr(ex, etc);
    assert_non_null(at);
    snprintf(cmd, sizeof(cmd), "%.*s%s%s", (int)(at - ex - 5), ex + 5, tok, at + strlen(etc));
    char err2[512] = "";
    int rc2 = parse(&cfg, err2, sizeof(err2), cmd);
    unlink(tok);
    assert_int_equal(rc2, 0);
    assert_non_null(cfg.metaserver_addr);
    assert_true(cfg.nics.n > 0);
    pf_server_config_free(&cfg);
}

static void test_p2p_refusals_print_a_working_example(void **st)
{
    expect_refusal_with_example("pegaflow-server --metaserver-addr http://10.0.0.100:50056",
                                "--metaserver-addr without --nics", "together");
    expect_refusal_with_example("pegaflow-server --nics mlx5_0", "--nics without --metaserver-addr",
                                "together");
    expect_refusal_with_example(
        "pegaflow-server --nics mlx5_0 --metaserver-addr http://10.0.0.100:50056", "--addr",
        "not routable");
}

/* protected by default (docs/security.md): P2P without a cluster token is refused unless
 * --insecure-cluster; worker RPCs are local-only with --local-rpcs auto whatever else is set;
 * a MetaServer on a reachable address needs a token too */
static void test_protected_defaults(void **st)
{
    struct pf_server_config cfg;
    char err[512] = "";
    const char *p2p = "x --addr 10.0.0.1:50055 --nics mlx5_0 --metaserver-addr "
                      "http://10.0.0.100:50056";
    assert_int_equal(parse(&cfg, err, sizeof(err), p2p), -EINVAL);
    pf_server_config_free(&cfg);
    assert_non_null(strstr(err, "P2P needs a cluster token"));
    assert_non_null(strstr(err, "--cluster-token-file"));
    assert_non_null(strstr(err, "--insecure-cluster"));
    char line[300];
    snprintf(line, sizeof(line), "%s --insecure-cluster", p2p);
    assert_int_equal(parse(&cfg, err, sizeof(err), line), 0);
    assert_true(cfg.insecure_cluster);
    assert_true(cfg.local_only);
    pf_server_config_free(&cfg);
    assert_int_equal(parse(&cfg, err, sizeof(err), "x"), 0);
    assert_true(cfg.local_only); /* auto, nothing configured: still this host only */
    pf_server_config_free(&cfg);
    assert_int_equal(parse(&cfg, err, sizeof(err), "x --local-rpcs any"), 0);
    assert_false(cfg.local_only);
    pf_server_config_free(&cfg);

    struct pf_meta_config mc;
    char *reach[] = {"x", "--addr", "0.0.0.0:50056", NULL};
    assert_int_equal(pf_meta_config_parse(&mc, 3, reach, err, sizeof(err)), -EINVAL);
    pf_meta_config_free(&mc);
    assert_non_null(strstr(err, "--insecure-cluster"));
    char *reach_ok[] = {"x", "--addr", "0.0.0.0:50056", "--insecure-cluster", NULL};
    assert_int_equal(pf_meta_config_parse(&mc, 4, reach_ok, err, sizeof(err)), 0);
    pf_meta_config_free(&mc);
    char *lo[] = {"x", NULL}; /* the default 127.0.0.1:50056 needs nothing */
    assert_int_equal(pf_meta_config_parse(&mc, 1, lo, err, sizeof(err)), 0);
    pf_meta_config_free(&mc);
}

/* the Redis password (docs/security.md): redacted in every message, also in argv once read */
static void test_redis_password_redacted(void **st)
{
    char out[128];
    pf_meta_store_redact("redis://alice:s3cret@10.0.0.5:6379", out, sizeof(out));
    assert_string_equal(out, "redis://alice:***@10.0.0.5:6379");
    pf_meta_store_redact("redis://s3cret@h:1,h:2", out, sizeof(out));
    assert_string_equal(out, "redis://***@h:1,h:2");
    pf_meta_store_redact("redis://h:1", out, sizeof(out));
    assert_string_equal(out, "redis://h:1");
    pf_meta_store_redact("memory", out, sizeof(out));
    assert_string_equal(out, "memory");
    struct pf_meta_config mc;
    char err[512] = "";
    char bad[] = "redsi://alice:s3cret@h:1", flag[] = "--store";
    char *argv[] = {"x", flag, bad, NULL};
    assert_int_equal(pf_meta_config_parse(&mc, 3, argv, err, sizeof(err)), -EINVAL);
    pf_meta_config_free(&mc);
    assert_null(strstr(err, "s3cret"));
    assert_null(strstr(bad, "s3cret")); /* gone from argv (ps, /proc/PID/cmdline) */
    assert_string_equal(bad, "redsi://alice:******@h:1");
    /* from the environment: copied, then wiped and unset */
    setenv("PEGAFLOW_REDIS_PASSWORD", "envpw", 1);
    char url[] = "redis://127.0.0.1:1";
    char *argv2[] = {"x", flag, url, NULL};
    assert_int_equal(pf_meta_config_parse(&mc, 3, argv2, err, sizeof(err)), 0);
    assert_string_equal(mc.redis_password, "envpw");
    assert_null(getenv("PEGAFLOW_REDIS_PASSWORD"));
    pf_meta_config_free(&mc);
    /* from a file */
    char pw[] = "/tmp/pf-redispw-XXXXXX";
    int fd = mkstemp(pw);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "filepw\n", 7), 7);
    close(fd);
    char pflag[] = "--redis-password-file";
    char *argv3[] = {"x", flag, url, pflag, pw, NULL};
    assert_int_equal(pf_meta_config_parse(&mc, 5, argv3, err, sizeof(err)), 0);
    assert_string_equal(mc.redis_password, "filepw");
    pf_meta_config_free(&mc);
    char mem[] = "memory";
    char *argv4[] = {"x", flag, mem, pflag, pw, NULL};
    assert_int_equal(pf_meta_config_parse(&mc, 5, argv4, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "needs a redis:// --store"));
    pf_meta_config_free(&mc);
    unlink(pw);
}

static void test_fault_refusal_names_the_fix(void **st)
{
    struct pf_server_config cfg;
    char err[512] = "";
    assert_int_equal(parse(&cfg, err, sizeof(err), "x --fault-spec gpu.d2h:error=EIO"), -EINVAL);
    pf_server_config_free(&cfg);
    assert_non_null(strstr(err, "--fault-spec"));
    assert_non_null(strstr(err, "add --enable-debug"));
    const char *ex = strstr(err, "e.g. ");
    assert_non_null(ex);
    /* the example, with its quotes removed as a shell would */
    char line[256];
    size_t j = 0;
    for (const char *p = ex + 5; *p && j + 1 < sizeof(line); p++)
        if (*p != '\'')
            line[j++] = *p;
    line[j] = '\0';
    assert_int_equal(parse(&cfg, err, sizeof(err), line), 0);
    assert_true(cfg.enable_debug);
    pf_server_config_free(&cfg);
}

static void test_meta_ttl_refusal_names_the_fix(void **st)
{
    struct pf_meta_config cfg;
    char err[512] = "";
    char *argv[] = {"x", "--ttl-minutes", "1", "--node-stale-secs", "90", NULL};
    assert_int_equal(pf_meta_config_parse(&cfg, 5, argv, err, sizeof(err)), -EINVAL);
    pf_meta_config_free(&cfg);
    assert_non_null(strstr(err, "--node-stale-secs"));
    assert_non_null(strstr(err, "raise --ttl-minutes to at least 2"));
}

static char *usage_text(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    pf_flags_usage_grouped(f, "pegaflow-server", "summary", pf_server_flags, pf_server_nflags,
                           pf_server_flag_groups, pf_server_nflag_groups);
    fclose(f);
    return text;
}

/* the section a flag is listed in: the last "Title:" line above "  --name " */
static const char *section_of(const char *text, const char *name, char *title, size_t tlen)
{
    char needle[96];
    snprintf(needle, sizeof(needle), "\n  --%s ", name);
    const char *at = strstr(text, needle);
    if (!at)
        return NULL;
    assert_null(strstr(at + 1, needle)); /* listed once */
    const char *sec = NULL;
    for (const char *p = text; p && p < at; p = strchr(p + 1, '\n'))
        if (p[0] == '\n' && p[1] != ' ' && p[1] != '\n' && strchr(p + 1, ':'))
            sec = p + 1;
    assert_non_null(sec);
    size_t n = (size_t)(strchr(sec, ':') - sec);
    snprintf(title, tlen, "%.*s", (int)n, sec);
    return title;
}

static void test_help_groups_as_the_seeds(void **st)
{
    char *text = usage_text();
    /* every flag exactly once, none left in "Other flags" */
    assert_null(strstr(text, "Other flags:"));
    char title[128];
    for (size_t i = 0; i < pf_server_nflags; i++) {
        if (pf_server_flags[i].flags & PF_FLAGF_HIDDEN)
            continue;
        if (!section_of(text, pf_server_flags[i].name, title, sizeof(title)))
            fail_msg("--%s is missing from --help", pf_server_flags[i].name);
    }
    /* seeds/server.md's sections, in its order */
    static const struct {
        const char *section;
        const char *flags[10];
    } seeds[] = {
        {"Server",
         {"addr", "devices", "pool-size", "hint-value-size", "use-hugepages",
          "enable-lfu-admission", "disable-numa-affinity", "blockwise-alloc", "log-level"}},
        {"HTTP & Metrics",
         {"http-addr", "enable-prometheus", "metrics-otel-endpoint", "metrics-period-secs"}},
        {"SSD Cache",
         {"ssd-cache-path", "ssd-cache-capacity", "ssd-write-queue-depth",
          "ssd-prefetch-queue-depth", "ssd-write-inflight", "ssd-prefetch-inflight",
          "max-prefetch-blocks"}},
        {"Cross-Node",
         {"nics", "metaserver-addr", "transfer-lock-timeout-secs", "metaserver-queue-depth"}},
    };
    const char *prev = text;
    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        char head[64];
        snprintf(head, sizeof(head), "\n%s", seeds[s].section);
        const char *h = strstr(text, head);
        assert_non_null(h);
        assert_true(h > prev); /* sections in the seeds' order */
        prev = h;
        for (size_t k = 0; k < 10 && seeds[s].flags[k]; k++) {
            assert_non_null(section_of(text, seeds[s].flags[k], title, sizeof(title)));
            if (strncmp(title, seeds[s].section, strlen(seeds[s].section)) != 0)
                fail_msg("--%s is under '%s', seeds/server.md has it under '%s'", seeds[s].flags[k],
                         title, seeds[s].section);
        }
    }
    /* defaults as documented */
    assert_non_null(strstr(text, "(default: 127.0.0.1:50055)"));
    assert_non_null(strstr(text, "(default: 30gb)"));
    assert_non_null(strstr(text, "(default: 0.0.0.0:9091)"));
    assert_non_null(strstr(text, "(default: 512gb)"));
    assert_non_null(strstr(text, "(default: 800)"));
    assert_non_null(strstr(text, "(default: 120)"));
    free(text);
}

static void test_ungrouped_flag_is_listed_under_other(void **st)
{
    static const struct pf_flag tab[] = {
        {.name = "alpha", .type = PF_FLAG_BOOL, .help = "a"},
        {.name = "beta", .type = PF_FLAG_BOOL, .help = "b"},
    };
    static const char *const first_names[] = {"alpha", NULL};
    static const struct pf_flag_group groups[] = {{"First", first_names}};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    pf_flags_usage_grouped(f, "p", "s", tab, 2, groups, 1);
    fclose(f);
    const char *first = strstr(text, "\nFirst:\n  --alpha"),
               *other = strstr(text, "\nOther flags:\n  --beta");
    assert_non_null(first);
    assert_non_null(other);
    assert_true(first < other);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_p2p_refusals_print_a_working_example),
        cmocka_unit_test(test_protected_defaults),
        cmocka_unit_test(test_redis_password_redacted),
        cmocka_unit_test(test_fault_refusal_names_the_fix),
        cmocka_unit_test(test_meta_ttl_refusal_names_the_fix),
        cmocka_unit_test(test_help_groups_as_the_seeds),
        cmocka_unit_test(test_ungrouped_flag_is_listed_under_other),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

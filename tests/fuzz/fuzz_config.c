/* Fuzz target: command-line and value parsing (src/common/config.c, src/app/server_config.c,
 * meta_config.c): sizes, durations (--metric-hll-windows), integers and ranges, booleans,
 * addresses, URLs, flag syntax, device lists, fault specs.
 *
 * Input: byte 0 picks the mode, the rest is NUL-separated arguments (at most 64):
 *   0  pegaflow-server's flag table, pf_server_config_parse (the binary's whole validation)
 *   1  pegaflow-metaserver's, pf_meta_config_parse
 *   2+ every value parser on each argument; byte 0 also sizes the output buffers (host and
 *      URL targets from 1 byte up) to exercise the truncation paths
 * Checks: results are 0, 1 (--help), 2 (--version) or -EINVAL with a message; an accepted
 * size formats back (pf_format_size) into a string that parses to within 1%; split
 * addresses fit their buffer, and a port is never above 65535. Host names are never
 * resolved over the network (guard.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "fuzz.h"
#include "pf/config.h"
#include "pf/log.h"

#define MAXARG 64

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    pf_log_set_level(PF_LOG_ERROR);
    unsetenv("PEGAFLOW_FAULTS");
    return 0;
}

static void check_rc(const char *what, int rc, const char *err)
{
    if (rc != 0 && rc != 1 && rc != 2 && rc != -EINVAL)
        fz_fail("%s returned %d", what, rc);
    if (rc == -EINVAL && !err[0])
        fz_fail("%s refused the arguments without a message", what);
}

static void values(const char *s, unsigned sel)
{
    uint64_t v;
    if (pf_parse_size(s, &v) == 0 && v < (1ull << 60)) {
        char buf[64];
        uint64_t back;
        pf_format_size(v, buf, sizeof(buf));
        if (pf_parse_size(buf, &back) != 0)
            fz_fail("size %llu formats as '%s', which does not parse", (unsigned long long)v, buf);
        uint64_t d = back > v ? back - v : v - back;
        if (d > v / 100 + 1)
            fz_fail("size '%s' = %llu formats as '%s' = %llu", s, (unsigned long long)v, buf,
                    (unsigned long long)back);
    }
    (void)pf_parse_u64(s, &v);
    bool b;
    (void)pf_parse_bool(s, &b);
    enum pf_log_level lvl;
    (void)pf_log_level_parse(s, &lvl);
    size_t cap = 1 + sel % 300;
    char *host = malloc(cap);
    uint16_t port;
    if (!host)
        fz_fail("out of memory");
    if (pf_addr_split(s, host, cap, &port) == 0 && strlen(host) >= cap)
        fz_fail("pf_addr_split wrote a %zu-byte host into %zu bytes", strlen(host), cap);
    (void)pf_addr_is_unroutable(s);
    char *target = malloc(cap);
    if (!target)
        fz_fail("out of memory");
    int rc = pf_url_to_target(s, target, cap);
    if (rc == 0 && strlen(target) >= cap)
        fz_fail("pf_url_to_target overflowed its buffer");
    if (rc != 0 && rc != -EINVAL && rc != -EPROTONOSUPPORT)
        fz_fail("pf_url_to_target returned %d", rc);
    char err[200] = "";
    rc = pf_addr_check(s, err, sizeof(err));
    if (rc != 0 && !err[0])
        fz_fail("pf_addr_check refused '%s' without a message", s);
    free(target);
    free(host);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned sel = data[0];
    char *buf = malloc(size); /* data[1..] plus a final NUL */
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *argv[MAXARG + 2];
    int argc = 0;
    argv[argc++] = sel == 1 ? "pegaflow-metaserver" : "pegaflow-server";
    for (size_t i = 0; i < size - 1 && argc <= MAXARG;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    char err[512] = "";
    if (sel == 0) {
        struct pf_server_config cfg;
        int rc = pf_server_config_parse(&cfg, argc, argv, err, sizeof(err));
        check_rc("pf_server_config_parse", rc, err);
        pf_server_config_free(&cfg);
    } else if (sel == 1) {
        struct pf_meta_config cfg;
        int rc = pf_meta_config_parse(&cfg, argc, argv, err, sizeof(err));
        check_rc("pf_meta_config_parse", rc, err);
        pf_meta_config_free(&cfg);
    } else {
        for (int i = 1; i < argc; i++)
            values(argv[i], sel);
    }
    free(buf);
    return 0;
}

/* pegaflow-cli: small operator tool over libpegaflow.
 *   pegaflow-cli [--addr HOST:PORT|unix:PATH] [--timeout-ms N] health|shutdown|version
 * TLS and the cluster token come from libpegaflow's environment (PEGAFLOW_TLS_CA, ...,
 * docs/security.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/pegaflow.h"

static int usage(void)
{
    fprintf(stderr, "usage: pegaflow-cli [--addr HOST:PORT|unix:PATH] [--timeout-ms N] "
                    "health|shutdown|version\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *addr = "127.0.0.1:50055";
    unsigned long long tmo = 5000;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--addr") == 0 && i + 1 < argc)
            addr = argv[++i];
        else if (strcmp(argv[i], "--timeout-ms") == 0 && i + 1 < argc) {
            char *end;
            const char *v = argv[++i];
            tmo = strtoull(v, &end, 10);
            if (*v < '0' || *v > '9' || *end || tmo == 0) {
                fprintf(stderr,
                        "pegaflow-cli: --timeout-ms needs a positive number of "
                        "milliseconds, got '%s'\n",
                        v);
                return 2;
            }
        } else
            return usage();
    }
    if (i != argc - 1)
        return usage();
    const char *cmd = argv[i];
    if (strcmp(cmd, "version") == 0) {
        printf("%s\n", pf_client_version());
        return 0;
    }
    struct pf_client *c;
    int rc = pf_client_connect(addr, &c);
    if (rc) {
        fprintf(stderr, "pegaflow-cli: %s: %s\n", addr, pf_last_error_message());
        return 1;
    }
    if (strcmp(cmd, "health") == 0)
        rc = pf_client_health(c, tmo);
    else if (strcmp(cmd, "shutdown") == 0)
        rc = pf_client_shutdown(c, tmo);
    else {
        pf_client_close(c);
        return usage();
    }
    if (rc)
        fprintf(stderr, "pegaflow-cli: %s %s: %s (%d)\n", cmd, addr, pf_last_error_message(),
                pf_last_error_code());
    else
        printf("ok\n");
    pf_client_close(c);
    return rc ? 1 : 0;
}

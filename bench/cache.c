/* bench/cache: in-process cost of the RAM cache's prefix lookup with 10^6 resident blocks
 * (the part of QueryPrefetch that grows with the number of hashes), to separate it from the
 * RPC cost measured by bench/engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pf/block.h"
#include "pf/cache.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int usage(void)
{
    fprintf(stderr, "usage: cache [--blocks N (>= 8192, default 1000000)] [--json FILE]\n");
    return 2;
}

int main(int argc, char **argv)
{
    size_t n = 1000000;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--blocks") && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else
            return usage();
    }
    if (n < 8192)
        return usage();
    double per_key_ns[2] = {0, 0};
    struct pf_cache *c;
    pf_cache_create(NULL, &c);
    struct pf_block_key *keys = malloc(n * sizeof(*keys));
    for (size_t i = 0; i < n; i++) {
        uint8_t h[32];
        for (int j = 0; j < 32; j++)
            h[j] = (uint8_t)((i * 2654435761u) >> (j % 24)) ^ (uint8_t)j;
        memcpy(h, &i, sizeof(i));
        pf_key_make(1, h, 32, &keys[i]);
        struct pf_block *b = pf_block_new(&keys[i], 1);
        pf_cache_insert(c, b, PF_CLASS_RETAINED);
        pf_block_put(b);
    }
    struct pf_block **out = malloc(4096 * sizeof(*out));
    const size_t qn[2] = {1, 4096};
    for (int k = 0; k < 2; k++) {
        int iters = k ? 500 : 100000;
        double t0 = now_s();
        for (int it = 0; it < iters; it++) {
            size_t first = ((size_t)it * 7919u) % (n - qn[k]);
            size_t hits = pf_cache_prefix(c, keys + first, qn[k], out);
            for (size_t i = 0; i < hits; i++)
                pf_block_put(out[i]);
        }
        double dt = (now_s() - t0) / iters;
        printf("prefix lookup of %zu keys among %zu resident: %.1f us (%.0f ns/key)\n", qn[k], n,
               dt * 1e6, dt * 1e9 / (double)qn[k]);
        per_key_ns[k] = dt * 1e9 / (double)qn[k];
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f,
                "{\"bench\":\"cache\",\"resident\":%zu,\"ns_per_key_1\":%.1f,"
                "\"ns_per_key_4096\":%.1f}\n",
                n, per_key_ns[0], per_key_ns[1]);
        fclose(f);
    }
    pf_cache_destroy(c);
    free(keys);
    free(out);
    return 0;
}

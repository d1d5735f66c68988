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

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
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
    }
    pf_cache_destroy(c);
    free(keys);
    free(out);
    return 0;
}

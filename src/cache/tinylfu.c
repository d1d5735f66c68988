/* Count-min sketch with 8-bit saturating counters and periodic halving (TinyLFU).
 * width = ceil(e * n), depth = ceil(log2 n), at least 16 x 2. Every touch increments the
 * key's counter in each row; after 8 * n touches every counter is halved so old
 * popularity fades. Row indices come from double hashing of the 64-bit key hash. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "pf/cache.h"

struct pf_tinylfu {
    uint32_t width, depth;
    uint64_t touches, reset_at, resets;
    uint8_t *counters; /* depth rows of width */
};

int pf_tinylfu_create(uint64_t items, struct pf_tinylfu **t_p)
{
    if (items < 1)
        items = 1;
    struct pf_tinylfu *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    double w = ceil(exp(1.0) * (double)items);
    double d = ceil(log2((double)items));
    t->width = w < 16 ? 16 : (w > (1u << 28) ? (1u << 28) : (uint32_t)w);
    t->depth = d < 2 ? 2 : (d > 16 ? 16 : (uint32_t)d);
    t->reset_at = 8 * items;
    t->counters = calloc((size_t)t->width * t->depth, 1);
    if (!t->counters) {
        free(t);
        return -ENOMEM;
    }
    *t_p = t;
    return 0;
}

void pf_tinylfu_destroy(struct pf_tinylfu *t)
{
    if (!t)
        return;
    free(t->counters);
    free(t);
}

static inline uint32_t idx(const struct pf_tinylfu *t, uint64_t h, uint32_t row)
{
    uint64_t h1 = h, h2 = (h >> 32) | (h << 32);
    return (uint32_t)((h1 + row * (h2 | 1)) % t->width);
}

void pf_tinylfu_touch(struct pf_tinylfu *t, uint64_t h)
{
    for (uint32_t r = 0; r < t->depth; r++) {
        uint8_t *c = &t->counters[(size_t)r * t->width + idx(t, h, r)];
        if (*c < 255)
            (*c)++;
    }
    if (++t->touches >= t->reset_at) {
        size_t n = (size_t)t->width * t->depth;
        for (size_t i = 0; i < n; i++)
            t->counters[i] >>= 1;
        t->touches = 0;
        t->resets++;
    }
}

uint32_t pf_tinylfu_estimate(const struct pf_tinylfu *t, uint64_t h)
{
    uint32_t m = 255;
    for (uint32_t r = 0; r < t->depth; r++) {
        uint8_t c = t->counters[(size_t)r * t->width + idx(t, h, r)];
        if (c < m)
            m = c;
    }
    return m;
}

uint64_t pf_tinylfu_resets(const struct pf_tinylfu *t)
{
    return t->resets;
}

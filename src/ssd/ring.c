/* Log-structured ring arithmetic of one SSD shard (see ssd_internal.h): logical head that
 * never wraps, a physical offset of head % cap, a skip to the wrap point for a block that
 * does not fit before the end, and tail = head - cap below which ranges are overwritten. */
#include <errno.h>

#include "ssd/ssd_internal.h"

void ssd_ring_init(struct ssd_ring *r, uint64_t cap)
{
    r->cap = cap;
    r->head = 0;
}

int ssd_ring_plan(const struct ssd_ring *r, uint64_t len, uint64_t *start_p, uint64_t *tail_p)
{
    if (len == 0)
        return -EINVAL;
    if (len > r->cap)
        return -E2BIG;
    uint64_t start = r->head;
    uint64_t phys = start % r->cap;
    if (phys + len > r->cap)
        start += r->cap - phys; /* skip the remainder of this lap */
    uint64_t head = start + len;
    *start_p = start;
    *tail_p = head > r->cap ? head - r->cap : 0;
    return 0;
}

int ssd_ring_alloc(struct ssd_ring *r, uint64_t len, uint64_t *start_p, uint64_t *off_p)
{
    uint64_t start, tail;
    int rc = ssd_ring_plan(r, len, &start, &tail);
    if (rc)
        return rc;
    r->head = start + len;
    *start_p = start;
    *off_p = start % r->cap;
    return 0;
}

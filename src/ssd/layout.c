/* Block serialization for the SSD: all slots in slot order, each slot's segments (K then
 * V) at their padded stride, so a block is one vectored write from pool memory and one
 * vectored read into staging memory, and the bytes between seg_len and seg_stride are
 * carried but never checksummed. Rebuilt blocks keep the original per-slot geometry, NUMA
 * node and checksum. */
#include <stdlib.h>

#include "pf/pool.h"
#include "ssd/ssd_internal.h"

static bool aligned_ptr(const void *p)
{
    return (uintptr_t)p % PF_BLK_ALIGN == 0;
}

uint64_t ssd_block_disk_len(const struct pf_block *b)
{
    uint64_t len = 0;
    for (uint16_t i = 0; i < b->nslots; i++) {
        struct pf_slot sv, *s = &sv;
        pf_block_slot(b, i, s);
        if (s->nseg == 0 || s->nseg > 2 || !s->k || (s->nseg == 2 && !s->v))
            return 0;
        if (s->seg_stride == 0 || s->seg_stride % PF_BLK_ALIGN != 0 || s->seg_len > s->seg_stride)
            return 0;
        if (!aligned_ptr(s->k) || (s->nseg == 2 && !aligned_ptr(s->v)))
            return 0;
        len += (uint64_t)s->seg_stride * s->nseg;
    }
    return len;
}

int ssd_block_iov(const struct pf_block *b, struct iovec *iov)
{
    int n = 0;
    for (uint16_t i = 0; i < b->nslots; i++) {
        struct pf_slot sv, *s = &sv;
        pf_block_slot(b, i, s);
        for (uint8_t g = 0; g < s->nseg; g++) {
            uint8_t *p = g ? s->v : s->k;
            if (n > 0 && (uint8_t *)iov[n - 1].iov_base + iov[n - 1].iov_len == p) {
                iov[n - 1].iov_len += s->seg_stride;
                continue;
            }
            iov[n++] = (struct iovec){p, s->seg_stride};
        }
    }
    return n;
}

struct pf_block *ssd_block_rebuild(const struct pf_block_key *key, const struct ssd_slot_meta *m,
                                   uint16_t nslots, uint8_t *const *base,
                                   struct pf_alloc *const *allocs)
{
    struct pf_slot *slots = calloc(nslots ? nslots : 1, sizeof(*slots));
    if (!slots)
        return NULL;
    for (uint16_t i = 0; i < nslots; i++) {
        struct pf_slot *s = &slots[i];
        s->k = base[i];
        s->ka = allocs[i];
        pf_alloc_get(allocs[i]);
        if (m[i].nseg > 1) {
            s->v = base[i] + m[i].seg_stride;
            s->va = allocs[i];
            pf_alloc_get(allocs[i]);
        }
        s->checksum = m[i].checksum;
        s->has_checksum = m[i].has_checksum;
        s->seg_len = m[i].seg_len;
        s->seg_stride = m[i].seg_stride;
        s->numa = m[i].numa;
        s->nseg = m[i].nseg;
    }
    struct pf_block *b = NULL;
    if (pf_block_pack(NULL, key, nslots, slots, &b) != 0) {
        for (uint16_t i = 0; i < nslots; i++) {
            pf_alloc_put(slots[i].ka);
            pf_alloc_put(slots[i].va);
        }
        b = NULL;
    }
    free(slots);
    return b;
}

int ssd_block_verify(const struct pf_block *b)
{
    for (uint16_t i = 0; i < b->nslots; i++)
        if (!pf_block_slot_verify(b, i))
            return i;
    return -1;
}

/* Sim GPU KV caches for integration tests: per (rank, layer) tensors in POSIX shm, in the
 * three layouts vLLM produces (blocks-first, KV-first split, K/V adjacent), seeded fills and
 * block-by-block comparison. Header-only (static functions) for the test programs. */
#ifndef PF_KVSIM_H
#define PF_KVSIM_H

#include <string.h>

#include "client/pegaflow.h"
#include "pftest.h"

enum kv_layout { KV_CONTIG = 0, KV_SPLIT = 1, KV_ADJACENT = 2 };

struct kvt {
    struct pf_simkv *shm;
    enum kv_layout lay;
    uint64_t num_blocks, seg; /* seg = bytes_per_block (one segment) */
    uint64_t kv_stride;
    uint32_t segments;
    uint8_t ipc[512];
    size_t ipc_len;
};

static inline int kvt_create(struct kvt *t, enum kv_layout lay, uint64_t num_blocks, uint64_t seg,
                             int sim_device)
{
    memset(t, 0, sizeof(*t));
    t->lay = lay;
    t->num_blocks = num_blocks;
    t->seg = seg;
    uint64_t bytes;
    switch (lay) {
    case KV_SPLIT: /* (2, N, ...): all K blocks then all V blocks */
        t->segments = 2;
        t->kv_stride = num_blocks * seg;
        bytes = 2 * num_blocks * seg;
        break;
    case KV_ADJACENT: /* (N, 2, ...) registered as 2 segments with stride == seg */
        t->segments = 2;
        t->kv_stride = seg;
        bytes = 2 * num_blocks * seg;
        break;
    default:
        t->segments = 1;
        t->kv_stride = 0;
        bytes = num_blocks * seg;
    }
    int rc = pf_simkv_create(bytes, sim_device, &t->shm);
    if (rc)
        return rc;
    return pf_simkv_ipc(t->shm, 0, bytes, t->ipc, sizeof(t->ipc), &t->ipc_len);
}

static inline void kvt_destroy(struct kvt *t)
{
    pf_simkv_destroy(t->shm);
    t->shm = NULL;
}

/* The bytes of block b as (pointer, length) pairs: 1 or 2 pieces. */
static inline int kvt_pieces(const struct kvt *t, uint64_t b, uint8_t **p, uint64_t *len)
{
    uint8_t *base = pf_simkv_ptr(t->shm);
    switch (t->lay) {
    case KV_SPLIT:
        p[0] = base + b * t->seg;
        p[1] = base + t->kv_stride + b * t->seg;
        len[0] = len[1] = t->seg;
        return 2;
    case KV_ADJACENT:
        p[0] = base + b * 2 * t->seg;
        len[0] = 2 * t->seg;
        return 1;
    default:
        p[0] = base + b * t->seg;
        len[0] = t->seg;
        return 1;
    }
}

static inline void kvt_fill_block(struct kvt *t, uint64_t b, uint64_t seed, uint64_t stream)
{
    uint8_t *p[2];
    uint64_t l[2];
    int n = kvt_pieces(t, b, p, l);
    for (int i = 0; i < n; i++)
        pft_fill(p[i], l[i], seed, stream * 2 + (uint64_t)i);
}

static inline bool kvt_block_equal(const struct kvt *a, uint64_t ba, const struct kvt *b,
                                   uint64_t bb)
{
    uint8_t *pa[2], *pb[2];
    uint64_t la[2], lb[2];
    int na = kvt_pieces(a, ba, pa, la), nb = kvt_pieces(b, bb, pb, lb);
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++)
        if (la[i] != lb[i] || memcmp(pa[i], pb[i], la[i]) != 0)
            return false;
    return true;
}

static inline bool kvt_block_zero(const struct kvt *t, uint64_t b)
{
    uint8_t *p[2];
    uint64_t l[2];
    int n = kvt_pieces(t, b, p, l);
    for (int i = 0; i < n; i++)
        for (uint64_t j = 0; j < l[i]; j++)
            if (p[i][j])
                return false;
    return true;
}

static inline struct pf_layer_desc kvt_desc(const struct kvt *t, const char *name)
{
    struct pf_layer_desc d = {
        .name = name,
        .ipc = t->ipc,
        .ipc_len = t->ipc_len,
        .num_blocks = t->num_blocks,
        .bytes_per_block = t->seg,
        .kv_stride_bytes = t->kv_stride,
        .segments = t->segments,
    };
    return d;
}

#endif

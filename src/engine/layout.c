/* Per-layer GPU layout validation (reference §3.1): one affine layout per registered layer,
 * contiguous (one copy per block) or split K/V (two copies per block), bounds-checked
 * against the registered storage so no copy can leave it. */
#include <errno.h>
#include <stdio.h>

#include "engine/engine_internal.h"
#include "pf/common.h"

int pf_layout_init(struct pf_layout *l, pf_devptr_t base, uint64_t size, uint64_t num_blocks,
                   uint64_t seg_bytes, uint64_t kv_stride, uint32_t segments, bool pad512,
                   char *err, size_t errlen)
{
    if (base == 0 || size == 0) {
        snprintf(err, errlen, "tensor storage is empty");
        return -EINVAL;
    }
    if (num_blocks == 0 || seg_bytes == 0 || segments == 0) {
        snprintf(err, errlen,
                 "num_blocks, bytes_per_block and segments must be > 0 (got %llu, "
                 "%llu, %u)",
                 (unsigned long long)num_blocks, (unsigned long long)seg_bytes, segments);
        return -EINVAL;
    }
    if (seg_bytes > UINT32_MAX) {
        snprintf(err, errlen, "bytes_per_block %llu exceeds 4 GiB", (unsigned long long)seg_bytes);
        return -EINVAL;
    }
    struct pf_layout x = {.base = base,
                          .size = size,
                          .num_blocks = num_blocks,
                          .seg_bytes = seg_bytes,
                          .kv_stride = kv_stride,
                          .segments = segments};
    uint64_t last_end, t;
    if (segments == 1) {
        x.nseg = 1;
        x.copy_len = seg_bytes;
        x.block_stride = seg_bytes;
        x.kv_stride = 0;
    } else {
        if (kv_stride == 0) {
            snprintf(err, errlen, "%u segments need kv_stride_bytes > 0", segments);
            return -EINVAL;
        }
        if (kv_stride < seg_bytes) {
            snprintf(err, errlen,
                     "kv_stride_bytes %llu is smaller than bytes_per_block %llu (K and V "
                     "would overlap)",
                     (unsigned long long)kv_stride, (unsigned long long)seg_bytes);
            return -EINVAL;
        }
        if (kv_stride == seg_bytes) {
            /* K and V adjacent: one copy of the whole block */
            if (!pf_mul_ok(seg_bytes, segments, &x.copy_len) || x.copy_len > UINT32_MAX) {
                snprintf(err, errlen, "block of %u x %llu bytes is too large", segments,
                         (unsigned long long)seg_bytes);
                return -EINVAL;
            }
            x.nseg = 1;
            x.block_stride = x.copy_len;
            x.kv_stride = 0;
        } else if (segments == 2) {
            x.nseg = 2;
            x.copy_len = seg_bytes;
            x.block_stride = seg_bytes; /* KV-first: all K blocks, then all V blocks */
        } else {
            snprintf(err, errlen,
                     "%u segments with kv_stride_bytes %llu > bytes_per_block is not a supported "
                     "layout (split layouts have exactly 2 segments)",
                     segments, (unsigned long long)kv_stride);
            return -EINVAL;
        }
    }
    /* bounds of the last block (and its V segment) */
    if (!pf_mul_ok(num_blocks - 1, x.block_stride, &t) ||
        !pf_add_ok(t, x.nseg == 2 ? x.kv_stride : 0, &t) || !pf_add_ok(t, x.copy_len, &last_end) ||
        !pf_add_ok(base, last_end, &t)) {
        snprintf(err, errlen, "layout address arithmetic overflows");
        return -EINVAL;
    }
    if (last_end > size) {
        snprintf(
            err, errlen, "layout needs %llu bytes (%llu blocks) but the tensor storage has %llu",
            (unsigned long long)last_end, (unsigned long long)num_blocks, (unsigned long long)size);
        return -EINVAL;
    }
    if (x.nseg == 2) {
        /* V of block 0 must not overlap K of the blocks kv_stride/stride and one more later */
        uint64_t q = x.kv_stride / x.block_stride;
        for (uint64_t j = q; j <= q + 1 && j < num_blocks; j++) {
            uint64_t ks = j * x.block_stride, ke = ks + x.copy_len;
            uint64_t vs = x.kv_stride, ve = vs + x.copy_len;
            if (ks < ve && vs < ke) {
                snprintf(err, errlen,
                         "split layout: V of block 0 (offset %llu) overlaps K of block %llu; "
                         "kv_stride_bytes must be at least num_blocks x bytes_per_block",
                         (unsigned long long)vs, (unsigned long long)j);
                return -EINVAL;
            }
        }
    }
    x.host_stride = pad512 ? pf_round_up(x.copy_len, 512) : x.copy_len;
    *l = x;
    return 0;
}

/* Range merging and kernel descriptor building for copy_batch (pure functions).
 *
 * A save or load produces one descriptor per segment per block per layer; consecutive
 * blocks are often consecutive on both sides (vLLM allocates block ids in runs, the
 * pinned allocator hands out contiguous runs per save), so merging them turns thousands
 * of small copies into a few large ones. Merging is allowed only inside one device
 * allocation and one host registration: a DMA or a memcpy that spans two allocations
 * which merely happen to be adjacent in the address space is not valid CUDA. */
#include "cuda_internal.h"

static bool span_continues(const struct pf_cuda_span *run, const struct pf_cuda_span *s,
                           uint64_t max_len)
{
    return s->dev_alloc == run->dev_alloc && s->host_alloc == run->host_alloc &&
           run->dev + run->len == s->dev && run->host + run->len == s->host && s->len <= max_len &&
           run->len <= max_len - s->len;
}

size_t pf_cuda_spans_merge(struct pf_cuda_span *s, size_t n, uint64_t max_len)
{
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i].len == 0)
            continue;
        if (out > 0 && span_continues(&s[out - 1], &s[i], max_len)) {
            s[out - 1].len += s[i].len;
            continue;
        }
        s[out++] = s[i];
    }
    return out;
}

size_t pf_cuda_kdesc_count(const struct pf_cuda_span *s, size_t n, uint64_t chunk)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t pieces = s[i].len / chunk + (s[i].len % chunk != 0);
        if (pieces > SIZE_MAX - total)
            return SIZE_MAX;
        total += (size_t)pieces;
    }
    return total;
}

size_t pf_cuda_kdesc_build(const struct pf_cuda_span *s, size_t n, uint64_t chunk, int d2h,
                           struct pf_cuda_kdesc *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint64_t off = 0; off < s[i].len; off += chunk) {
            uint64_t len = s[i].len - off < chunk ? s[i].len - off : chunk;
            out[k].dst = d2h ? s[i].host + off : s[i].dev + off;
            out[k].src = d2h ? s[i].dev + off : s[i].host + off;
            out[k].len = len;
            k++;
        }
    }
    return k;
}

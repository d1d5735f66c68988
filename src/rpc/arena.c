/* Decode arena for large RPC requests (see rpc_internal.h). */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "rpc/rpc_internal.h"

static void *arena_alloc(void *ad, size_t n)
{
    struct pf_rpc_arena *a = ad;
    size_t r = (n + 15) & ~(size_t)15;
    if (r >= n && a->cap - a->used >= r) {
        void *p = a->base + a->used;
        a->used += r;
        return p;
    }
    return malloc(n);
}

static void arena_free(void *ad, void *p)
{
    struct pf_rpc_arena *a = ad;
    if ((char *)p >= a->base && (char *)p < a->base + a->cap)
        return;
    free(p);
}

ProtobufCAllocator *pf_rpc_arena_open(struct pf_rpc_arena *a, ProtobufCAllocator *pa, uint64_t cost)
{
    if (cost < PF_RPC_ARENA_MIN || cost > SIZE_MAX)
        return NULL;
    void *p = mmap(NULL, (size_t)cost, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    *a = (struct pf_rpc_arena){.base = p, .cap = (size_t)cost};
    *pa = (ProtobufCAllocator){.alloc = arena_alloc, .free = arena_free, .allocator_data = a};
    return pa;
}

void pf_rpc_arena_close(struct pf_rpc_arena *a)
{
    if (a->base)
        munmap(a->base, a->cap);
    a->base = NULL;
}

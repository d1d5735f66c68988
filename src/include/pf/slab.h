/* Size-class allocator for small, numerous objects (blocks): 16-byte aligned objects carved
 * from 2 MiB chunks that ask the kernel for transparent huge pages (MADV_HUGEPAGE), so a
 * cache of millions of blocks is walked with few TLB misses, and with no per-object malloc
 * header. Classes are multiples of PF_SLAB_GRAIN (16) bytes up to PF_SLAB_MAX, so a record
 * wastes under 16 bytes (64-byte classes cost a 112-byte block 16 and a 484-byte one 28);
 * larger requests fall back to aligned_alloc. Chunks are never returned to the system (freed
 * objects are reused). Thread-safe (one lock per class). */
#ifndef PF_SLAB_H
#define PF_SLAB_H

#include <stddef.h>

#define PF_SLAB_MAX   4096
#define PF_SLAB_GRAIN 16

/* Zeroed, 16-byte aligned object of size bytes, or NULL. */
void *pf_slab_alloc(size_t size);
/* Frees an object allocated with the same size. Accepts NULL. */
void pf_slab_free(void *p, size_t size);
/* Large zeroed arrays (hash-table buckets): mmap + MADV_HUGEPAGE above 1 MiB. */
void *pf_big_calloc(size_t n, size_t size);
void pf_big_free(void *p, size_t n, size_t size);

#endif

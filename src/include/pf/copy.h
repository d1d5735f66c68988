/* Bulk copies for the sim GPU backend's copy engine (src/common/copy_fast.c).
 *
 * pf_copy_bulk is memcpy that chooses non-temporal stores itself for large copies: a KV
 * block copied into the pinned pool is not read again soon, and streaming stores avoid
 * the read-for-ownership of every destination line (glibc's memcpy switches to them only
 * above its non_temporal_threshold, a fraction of the L3 that block-sized calls stay
 * below). Every user gets the same choice; no environment setting is involved.
 *
 * pf_copy_hash copies and computes the xxh3-64 of the copied bytes in one pass: the copy
 * runs in chunks small enough to stay in L1/L2 and each chunk is hashed from the
 * destination right after it was written, so the destination is never read back from
 * memory. The state is libxxhash's streaming XXH3 state; several calls on one state hash
 * the concatenation (two segments of one slot).
 *
 * Both are plain functions without fault handling: run them under pf_guard_call when src
 * is client memory. */
#ifndef PF_COPY_H
#define PF_COPY_H

#include <stddef.h>
#include <stdint.h>

/* Copies at or above this many bytes use non-temporal stores (the block size from which
 * streaming stores were measured faster than cached ones on the development machine, see
 * bench/README.md). */
#define PF_COPY_NT_MIN (64u << 10)

/* Bytes copied then hashed at a time by pf_copy_hash (well inside L1d + L2). */
#define PF_COPY_HASH_CHUNK (32u << 10)

/* memcpy(dst, src, len); regions must not overlap. Any alignment, any length. */
void pf_copy_bulk(void *dst, const void *src, size_t len);

/* The non-temporal path itself, whatever len is (exposed for tests). Its streaming loop is
 * the widest the CPU has: AVX-512 (64-byte stores; ~20 % faster than AVX2 on the
 * development VM, bench/README.md "The copy limit with two threads"), AVX2, or SSE2. */
void pf_copy_nt(void *dst, const void *src, size_t len);

/* Tests: the streaming loop pf_copy_nt uses from now on; one the CPU lacks is refused
 * (-ENOTSUP) and AUTO restores the default choice. */
enum pf_copy_isa { PF_COPY_ISA_AUTO, PF_COPY_ISA_SSE2, PF_COPY_ISA_AVX2, PF_COPY_ISA_AVX512 };
int pf_copy_force_isa(enum pf_copy_isa isa);

/* Opaque XXH3 streaming state (XXH3_state_t, 64-byte aligned, 576 bytes); allocate with
 * pf_hash_state_new, free with pf_hash_state_free. */
struct pf_hash_state;
struct pf_hash_state *pf_hash_state_new(void);
void pf_hash_state_free(struct pf_hash_state *h);
void pf_hash_reset(struct pf_hash_state *h);
uint64_t pf_hash_digest(const struct pf_hash_state *h);

/* memcpy(dst, src, len) and update h with the len bytes written. */
void pf_copy_hash(void *dst, const void *src, size_t len, struct pf_hash_state *h);

#endif

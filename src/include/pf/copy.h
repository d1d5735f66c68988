/* Bulk copies for the sim GPU backend's copy engine (src/common/copy_fast.c).
 *
 * pf_copy_bulk is memcpy that chooses non-temporal stores itself for large copies: a KV
 * block copied into the pinned pool is not read again soon, and streaming stores avoid
 * the read-for-ownership of every destination line (glibc's memcpy switches to them only
 * above its non_temporal_threshold, a fraction of the L3 that block-sized calls stay
 * below). Every user gets the same choice; no environment setting is involved.
 *
 * pf_copy_hash copies and computes the xxh3-64 of the copied bytes in one pass
 * (src/common/copy_hash.c): the state is its own implementation of XXH3's long-input
 * accumulators, so each 64-byte stripe is hashed from the register that copies it (a
 * streaming store to the destination, a few vector operations beside it) and neither the
 * source nor the destination is read twice; with AVX-512 whole 16 KiB groups are read as four
 * 4 KiB streams side by side, as pf_copy_nt does (each 1 KiB block's sum formed apart, then
 * folded in input order). Several calls on one state hash the
 * concatenation (two segments of one slot); the value is XXH3_64bits (seed 0) of it.
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

/* Below PF_COPY_NT_MIN, pf_copy_hash copies with cached stores this many bytes at a time
 * and hashes each chunk from L1/L2 right after. */
#define PF_COPY_HASH_CHUNK (32u << 10)

/* How far ahead of its loads a streaming loop prefetches the source (with the AVX-512
 * copy + hash loop, 1-2 KiB brought two threads from 0.81 to 0.99 of the plain streaming
 * copy on the development VM, bench/README.md "Save: the hash beside the copy"). */
#define PF_COPY_AHEAD 2048u

/* The address to prefetch at stripe i of a loop over m 64-byte stripes from s: PF_COPY_AHEAD
 * on, but never past the last stripe (no reads the copy does not need). */
static inline const char *pf_copy_ahead(const char *s, size_t i, size_t m)
{
    size_t a = i + PF_COPY_AHEAD / 64;
    return s + 64 * (a < m ? a : m - 1);
}

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

/* The loop pf_copy_nt and pf_copy_hash use now (never AUTO on x86-64). */
enum pf_copy_isa pf_copy_isa_now(void);

/* Opaque XXH3-64 streaming state (64-byte aligned, under 512 bytes); allocate with
 * pf_hash_state_new (NULL when out of memory), free with pf_hash_state_free; reset starts
 * a new input. One state is one thread's at a time. */
struct pf_hash_state;
struct pf_hash_state *pf_hash_state_new(void);
void pf_hash_state_free(struct pf_hash_state *h);
void pf_hash_reset(struct pf_hash_state *h);
uint64_t pf_hash_digest(const struct pf_hash_state *h);

/* memcpy(dst, src, len) and update h with the len bytes written (the bytes hashed are
 * the bytes in dst even if src changes meanwhile). Regions must not overlap. */
void pf_copy_hash(void *dst, const void *src, size_t len, struct pf_hash_state *h);

#endif

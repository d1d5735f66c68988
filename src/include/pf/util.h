/* Randomness, UUIDs, errno names, hashing and string helpers. */
#ifndef PF_UTIL_H
#define PF_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Fills buf with n cryptographically random bytes (getrandom). Returns 0 or -errno. */
int pf_random_bytes(void *buf, size_t n);

/* UUID v4: 16 raw bytes, canonical text "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx" (36 chars). */
#define PF_UUID_STR_LEN 37
int pf_uuid_v4(uint8_t out[16]);
void pf_uuid_format(const uint8_t in[16], char out[PF_UUID_STR_LEN]);
/* Accepts the canonical hyphenated form and the 32-hex "simple" form. Returns 0 or -EINVAL. */
int pf_uuid_parse(const char *s, uint8_t out[16]);

/* Hex encoding of n bytes into out (2n+1 bytes). */
void pf_hex_encode(const void *in, size_t n, char *out);

/* "EIO" -> EIO. Returns 0 or -EINVAL for unknown names. Also accepts decimal numbers. */
int pf_errno_parse(const char *name, int *err_p);
/* EIO -> "EIO" (static string, "E?" when unknown). */
const char *pf_errno_name(int err);

/* 64-bit hashes (xxh3). pf_hash64 is for hash tables; pf_checksum for data integrity. */
uint64_t pf_hash64(const void *data, size_t len);
uint64_t pf_hash64_seed(const void *data, size_t len, uint64_t seed);

/* xxh3-64 of a[0..alen) followed by b[0..blen) (b may be NULL), through libxxhash's run-time
 * dispatch to the widest vector unit (src/common/checksum_fast.c): the same value as any other
 * xxh3-64 of those bytes. Thread-safe, no allocation. */
uint64_t pf_checksum2(const void *a, size_t alen, const void *b, size_t blen);

/* Streaming xxh3-64 checksum over several segments. */
struct pf_checksum {
    void *state; /* XXH3_state_t* */
};
int pf_checksum_init(struct pf_checksum *c);
void pf_checksum_update(struct pf_checksum *c, const void *data, size_t len);
uint64_t pf_checksum_final(struct pf_checksum *c);
void pf_checksum_destroy(struct pf_checksum *c);

/* strdup that aborts on ENOMEM is not offered: use strdup and handle NULL. */
/* Trims leading/trailing whitespace in place; returns s. */
char *pf_strtrim(char *s);

#endif

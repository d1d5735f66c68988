/* Data checksums at the speed of the CPU's widest vector unit.
 *
 * The project compiles for baseline x86-64, so an inlined xxh3 runs its SSE2 loop (about
 * 8 GB/s here). libxxhash's dispatching entry points pick AVX2 or AVX-512 at run time
 * (about 25 GB/s on the same machine, the same values by the xxh3 specification), so the
 * checksums of saved and fetched slots call those. Small inputs (keys) stay inlined where
 * they are hashed. */
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include "pf/util.h"

uint64_t pf_checksum2(const void *a, size_t alen, const void *b, size_t blen)
{
    if (!b || blen == 0)
        return XXH3_64bits_dispatch(a, alen);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update_dispatch(&st, a, alen);
    XXH3_64bits_update_dispatch(&st, b, blen);
    return XXH3_64bits_digest(&st);
}

/* Fuzz target: the SSD block layout (src/ssd/layout.c). The SSD tier keeps no header on
 * disk: an index entry holds each slot's geometry and checksum (struct ssd_slot_meta), and
 * a block's bytes are read back into one staging allocation and rebuilt from that geometry,
 * then verified against the checksums. This target plays that read path with fuzzed
 * geometry and fuzzed disk bytes, corrupting one byte of the image when asked.
 *
 * Input: byte 0: slots (1 + b % 8); per slot 6 bytes: segments (1 + (b & 1)), stride in
 * 512-byte units (1 + b % 8), data length (2 bytes LE, modulo stride + 1), flags (bit 0:
 * has a checksum, bit 1: corrupt one byte), corrupt offset (within that slot's bytes, as a
 * fraction b/256); the rest fills the disk image (cycled). Checks: the checksums of the
 * written image verify after rebuild (ssd_block_verify == -1); a corrupted byte inside a
 * checksummed slot's data is reported in that slot, one in the padding or in a slot without
 * checksum is not; ssd_block_disk_len equals the image size; ssd_block_iov yields one merged
 * segment covering exactly the staging allocation; the rebuilt geometry equals the entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "pf/block.h"
#include "pf/log.h"
#include "pf/pool.h"
#include "ssd/ssd_internal.h"

#define MAXSLOTS 8

static struct pf_pool *pool;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[256];
    pf_log_set_level(PF_LOG_ERROR);
    struct pf_pool_config pc = {.size = 4 << 20, .shards = 1, .skip_memcheck = true};
    if (pf_pool_create(&pc, &pool, err, sizeof(err)) != 0)
        fz_fail("pool: %s", err);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint16_t n = (uint16_t)(1 + data[0] % MAXSLOTS);
    if (size < 1 + (size_t)n * 6)
        return 0;
    struct ssd_slot_meta m[MAXSLOTS];
    int corrupt_slot = -1;
    uint64_t corrupt_off = 0; /* within the slot's bytes */
    uint64_t slot_off[MAXSLOTS], total = 0;
    const uint8_t *p = data + 1;
    for (uint16_t i = 0; i < n; i++, p += 6) {
        uint32_t stride = 512u * (1 + p[1] % 8);
        m[i] = (struct ssd_slot_meta){.nseg = (uint8_t)(1 + (p[0] & 1)),
                                      .seg_stride = stride,
                                      .seg_len = (uint32_t)(p[2] | p[3] << 8) % (stride + 1),
                                      .has_checksum = p[4] & 1,
                                      .numa = -1};
        slot_off[i] = total;
        total += ssd_slot_disk_len(&m[i]);
        if ((p[4] & 2) && corrupt_slot < 0) {
            corrupt_slot = i;
            corrupt_off = ssd_slot_disk_len(&m[i]) * p[5] / 256;
        }
    }
    const uint8_t *fill = p;
    size_t nfill = size - (size_t)(p - data);
    struct pf_alloc *a;
    if (pf_pool_alloc(pool, total, -1, &a) != 0)
        fz_fail("pool allocation of %llu bytes", (unsigned long long)total);
    uint8_t *img = a->ptr;
    for (uint64_t i = 0; i < total; i++)
        img[i] = nfill ? fill[i % nfill] : (uint8_t)i;
    uint8_t *base[MAXSLOTS];
    struct pf_alloc *allocs[MAXSLOTS];
    for (uint16_t i = 0; i < n; i++) {
        base[i] = img + slot_off[i];
        allocs[i] = a;
    }
    struct pf_block_key key;
    if (pf_key_make(1, "fuzz", 4, &key) != 0)
        fz_fail("key");
    /* the write side: checksums of the image as written */
    struct pf_block *w = ssd_block_rebuild(&key, m, n, base, allocs);
    if (!w)
        fz_fail("rebuild (write side) failed");
    for (uint16_t i = 0; i < n; i++) {
        struct pf_slot ws;
        pf_block_slot(w, i, &ws);
        m[i].checksum = pf_slot_compute_checksum(&ws);
    }
    if (ssd_block_disk_len(w) != total)
        fz_fail("disk_len %llu, image %llu", (unsigned long long)ssd_block_disk_len(w),
                (unsigned long long)total);
    pf_block_put(w);
    /* the read side */
    bool in_data = false;
    if (corrupt_slot >= 0) {
        uint64_t seg_off = corrupt_off % m[corrupt_slot].seg_stride;
        in_data = seg_off < m[corrupt_slot].seg_len && m[corrupt_slot].has_checksum;
        img[slot_off[corrupt_slot] + corrupt_off] ^= 0x5a;
    }
    struct pf_block *b = ssd_block_rebuild(&key, m, n, base, allocs);
    pf_alloc_put(a); /* the blocks hold their own references */
    if (!b)
        fz_fail("rebuild failed");
    for (uint16_t i = 0; i < n; i++) {
        struct pf_slot sv, *s = &sv;
        pf_block_slot(b, i, s);
        if (s->nseg != m[i].nseg || s->seg_len != m[i].seg_len ||
            s->seg_stride != m[i].seg_stride ||
            (m[i].has_checksum && s->checksum != m[i].checksum) ||
            s->has_checksum != m[i].has_checksum || s->k != base[i] ||
            (s->nseg == 2) != (s->v != NULL))
            fz_fail("slot %u: rebuilt geometry differs from the entry", i);
    }
    int bad = ssd_block_verify(b);
    if (in_data && bad != corrupt_slot)
        fz_fail("corrupted byte %llu of slot %d not found (verify %d)",
                (unsigned long long)corrupt_off, corrupt_slot, bad);
    if (!in_data && bad != -1)
        fz_fail("verify reports slot %d, nothing checksummed was changed", bad);
    if (ssd_block_disk_len(b) != total)
        fz_fail("disk_len after rebuild");
    struct iovec iov[2 * MAXSLOTS];
    int niov = ssd_block_iov(b, iov);
    if (niov != 1 || iov[0].iov_base != img || iov[0].iov_len != total)
        fz_fail("ssd_block_iov: %d segments for one contiguous image", niov);
    pf_block_put(b);
    return 0;
}

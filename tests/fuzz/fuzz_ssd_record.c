/* Fuzz target: the SSD record header and superblock parsers (src/ssd/format.c), which the
 * recovery scan runs over whatever a crashed or foreign file holds.
 *
 * Input: byte 0 selects the mode.
 *   even: the rest is parsed as raw bytes (ssd_rec_decode, ssd_sb_decode). A header that
 *         decodes must be canonical: re-encoding its decoded fields gives the same hdr_len
 *         bytes (so no byte string other than the one the writer produced is accepted);
 *         its slot table must add up to payload_len and match its layout fingerprint.
 *   odd:  a valid header is built from the input (byte 1: slots - 1 (mod 64), byte 2:
 *         namespace length, byte 3: key length 1..40, then seq, geometry and name bytes),
 *         encoded, decoded (must succeed and round-trip), then 1-4 bytes at fuzzed
 *         positions are XORed with fuzzed non-zero masks: the corrupted header must never
 *         decode as OK, and decoding never reads past the buffer (ASan). The same for a
 *         superblock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "pf/log.h"
#include "ssd/format.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    pf_log_set_level(PF_LOG_ERROR);
    return 0;
}

static uint8_t take(const uint8_t **p, const uint8_t *end)
{
    return *p < end ? *(*p)++ : 0;
}

static void check_canonical(const uint8_t *buf, size_t len)
{
    struct ssd_rec_hdr h;
    if (ssd_rec_decode(buf, len, &h) != SSD_PARSE_OK)
        return;
    if (h.hdr_len > len || h.hdr_len % 512)
        fz_fail("accepted a header of %u bytes in %zu", h.hdr_len, len);
    struct ssd_rec_slot *s = calloc(h.nslots, sizeof(*s));
    uint8_t *re = malloc(h.hdr_len);
    if (!s || !re)
        fz_fail("oom");
    uint64_t total = 0;
    for (uint16_t i = 0; i < h.nslots; i++) {
        ssd_rec_slot_at(&h, i, &s[i]);
        total += (uint64_t)s[i].seg_stride * s[i].nseg;
    }
    if (total != h.payload_len)
        fz_fail("slot table adds up to %llu, payload_len %llu", (unsigned long long)total,
                (unsigned long long)h.payload_len);
    uint64_t fp = h.layout_fp;
    struct ssd_rec_hdr e = h;
    if (ssd_rec_encode(&e, s, re, h.hdr_len) != 0)
        fz_fail("a decoded header does not encode");
    if (e.layout_fp != fp || e.hdr_len != h.hdr_len || memcmp(re, buf, h.hdr_len) != 0)
        fz_fail("accepted a non-canonical header");
    free(s);
    free(re);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1, *end = data + size;
    if ((data[0] & 1) == 0) {
        /* raw bytes: exact-size copy so ASan sees any over-read */
        size_t n = size - 1;
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
            return 0;
        memcpy(buf, p, n);
        check_canonical(buf, n);
        if (n >= SSD_SB_SIZE) {
            struct ssd_superblock sb;
            uint32_t v;
            (void)ssd_sb_decode(buf, &sb, &v);
        }
        free(buf);
        return 0;
    }
    struct ssd_rec_hdr h;
    memset(&h, 0, sizeof(h));
    h.nslots = (uint16_t)(1 + take(&p, end) % 64);
    size_t ns_len = take(&p, end);
    h.key.len = (uint8_t)(1 + take(&p, end) % PF_HASH_MAX);
    for (int i = 0; i < 8; i++)
        h.seq = h.seq << 8 | take(&p, end);
    for (uint8_t i = 0; i < h.key.len; i++)
        h.key.hash[i] = take(&p, end);
    for (int i = 0; i < 16; i++)
        h.uuid[i] = take(&p, end);
    for (size_t i = 0; i < ns_len; i++)
        h.ns[i] = (char)(1 + take(&p, end) % 255);
    h.ns[ns_len] = 0;
    struct ssd_rec_slot s[64];
    uint64_t total = 0;
    for (uint16_t i = 0; i < h.nslots; i++) {
        uint32_t stride = 512u * (1 + take(&p, end) % 16);
        s[i] = (struct ssd_rec_slot){.seg_stride = stride,
                                     .seg_len = 1 + take(&p, end) * 7u % stride,
                                     .nseg = (uint8_t)(1 + (take(&p, end) & 1)),
                                     .numa = (int16_t)(take(&p, end) % 3 - 1),
                                     .checksum = (uint64_t)take(&p, end) * 0x9e3779b97f4a7c15ull};
        total += (uint64_t)stride * s[i].nseg;
    }
    h.payload_len = total;
    uint32_t len = ssd_rec_hdr_len(ns_len, h.nslots);
    uint8_t *buf = malloc(len);
    if (!buf)
        return 0;
    if (ssd_rec_encode(&h, s, buf, len) != 0)
        fz_fail("encode refused a valid header");
    struct ssd_rec_hdr d;
    if (ssd_rec_decode(buf, len, &d) != SSD_PARSE_OK)
        fz_fail("a header as written does not decode");
    if (d.seq != h.seq || d.payload_len != total || d.nslots != h.nslots ||
        d.key.len != h.key.len || memcmp(d.key.hash, h.key.hash, h.key.len) || strcmp(d.ns, h.ns) ||
        memcmp(d.uuid, h.uuid, 16))
        fz_fail("a header does not round-trip");
    check_canonical(buf, len);
    /* short buffers are never accepted */
    if (ssd_rec_decode(buf, len - 1, &d) == SSD_PARSE_OK)
        fz_fail("a truncated header decoded");
    int flips = 1 + take(&p, end) % 4;
    for (int i = 0; i < flips; i++) {
        uint32_t pos = ((uint32_t)take(&p, end) << 8 | take(&p, end)) % len;
        uint8_t mask = take(&p, end);
        buf[pos] ^= mask ? mask : 0x80;
    }
    /* flips may cancel out (the same byte twice): only a changed header must be refused */
    uint8_t *orig = malloc(len);
    if (!orig || ssd_rec_encode(&h, s, orig, len) != 0)
        fz_fail("encode");
    struct ssd_rec_hdr c;
    if (memcmp(orig, buf, len) != 0 && ssd_rec_decode(buf, len, &c) == SSD_PARSE_OK)
        fz_fail("accepted a corrupted record header");
    free(orig);
    free(buf);
    /* the superblock: the same property */
    struct ssd_superblock sb = {.version = SSD_FORMAT_VERSION,
                                .file_size = SSD_SB_SIZE + 512ull * (1 + take(&p, end)),
                                .ring_off = SSD_SB_SIZE,
                                .shard = take(&p, end),
                                .nshards = 1 + take(&p, end)};
    sb.ring_cap = sb.file_size - SSD_SB_SIZE;
    uint8_t *sbuf = malloc(SSD_SB_SIZE), *sorig = malloc(SSD_SB_SIZE);
    if (!sbuf || !sorig)
        fz_fail("oom");
    ssd_sb_encode(&sb, sbuf);
    memcpy(sorig, sbuf, SSD_SB_SIZE);
    struct ssd_superblock sd;
    uint32_t v;
    if (ssd_sb_decode(sbuf, &sd, &v) != 0 || sd.file_size != sb.file_size)
        fz_fail("a superblock as written does not decode");
    uint32_t pos = ((uint32_t)take(&p, end) << 8 | take(&p, end)) % SSD_SB_SIZE;
    uint8_t mask = take(&p, end);
    sbuf[pos] ^= mask ? mask : 1;
    if (ssd_sb_decode(sbuf, &sd, &v) == 0)
        fz_fail("accepted a corrupted superblock");
    free(sbuf);
    free(sorig);
    return 0;
}

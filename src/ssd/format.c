/* Superblock and record-header codecs of the SSD on-disk format (format.h, docs/ssd.md).
 *
 * Superblock (first 512 bytes of the SSD_SB_SIZE area; the rest is zero):
 *   0 magic[8] "PFSSDSB\0" | 8 u32 version | 12 u32 sb_size | 16 u64 file_size
 *   24 u64 ring_off | 32 u64 ring_cap | 40 u32 shard | 44 u32 nshards | 48 uuid[16]
 *   64..504 zero | 504 u64 xxh3-64 of bytes [0, 504) | 512..4096 zero
 * Record header (hdr_len bytes, a multiple of 4096):
 *   0 magic[8] "PFSSDREC" | 8 u32 version | 12 u32 hdr_len | 16 u64 seq | 24 u64 payload_len
 *   32 uuid[16] | 48 u64 layout_fp | 56 u16 nslots | 58 u8 key_len | 59 u8 ns_len
 *   60 u32 zero | 64 key[40] (key_len used, rest zero) | 104 u64 zero | 112 u64 zero
 *   120 u64 hdr_checksum: xxh3-64 of bytes [0, hdr_len) with this field zero
 *   128 ns[ns_len] padded to 8 | then nslots x 24 bytes: u64 checksum, u32 seg_len,
 *   u32 seg_stride, i16 numa, u8 nseg, u8 zero, u32 zero | zero up to hdr_len. */
#include <errno.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "pf/hal_blk.h"
#include "pf/util.h"
#include "ssd/format.h"

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

void ssd_sb_encode(const struct ssd_superblock *sb, uint8_t *buf)
{
    memset(buf, 0, SSD_SB_SIZE);
    memcpy(buf, SSD_SB_MAGIC, 8);
    put32(buf + 8, sb->version);
    put32(buf + 12, SSD_SB_SIZE);
    put64(buf + 16, sb->file_size);
    put64(buf + 24, sb->ring_off);
    put64(buf + 32, sb->ring_cap);
    put32(buf + 40, sb->shard);
    put32(buf + 44, sb->nshards);
    memcpy(buf + 48, sb->uuid, 16);
    put64(buf + 504, XXH3_64bits(buf, 504));
}

int ssd_sb_decode(const uint8_t *buf, struct ssd_superblock *sb, uint32_t *version_p)
{
    if (all_zero(buf, 512))
        return -ENODATA;
    if (memcmp(buf, SSD_SB_MAGIC, 8) != 0)
        return -EBADMSG;
    uint32_t v = get32(buf + 8);
    *version_p = v;
    if (v != SSD_FORMAT_VERSION)
        return -EPROTO;
    if (get64(buf + 504) != XXH3_64bits(buf, 504) || get32(buf + 12) != SSD_SB_SIZE ||
        !all_zero(buf + 64, 504 - 64) || !all_zero(buf + 512, SSD_SB_SIZE - 512))
        return -EBADMSG;
    sb->version = v;
    sb->file_size = get64(buf + 16);
    sb->ring_off = get64(buf + 24);
    sb->ring_cap = get64(buf + 32);
    sb->shard = get32(buf + 40);
    sb->nshards = get32(buf + 44);
    memcpy(sb->uuid, buf + 48, 16);
    if (sb->ring_off != SSD_SB_SIZE || sb->ring_cap == 0 || sb->ring_cap % PF_BLK_ALIGN ||
        sb->ring_off + sb->ring_cap > sb->file_size)
        return -EBADMSG;
    return 0;
}

uint64_t ssd_layout_fp(const struct ssd_rec_slot *slots, uint16_t nslots)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    uint8_t b[12];
    put16(b, nslots);
    XXH3_64bits_update(&st, b, 2);
    for (uint16_t i = 0; i < nslots; i++) {
        put32(b, slots[i].seg_len);
        put32(b + 4, slots[i].seg_stride);
        put32(b + 8, slots[i].nseg);
        XXH3_64bits_update(&st, b, 12);
    }
    return XXH3_64bits_digest(&st);
}

static size_t ns_area(size_t ns_len)
{
    return (ns_len + 7) / 8 * 8;
}

uint32_t ssd_rec_hdr_len(size_t ns_len, uint16_t nslots)
{
    uint64_t n = SSD_REC_FIXED + ns_area(ns_len) + (uint64_t)nslots * SSD_REC_SLOT_BYTES;
    return (uint32_t)((n + SSD_REC_ALIGN - 1) / SSD_REC_ALIGN * SSD_REC_ALIGN);
}

int ssd_rec_encode(struct ssd_rec_hdr *h, const struct ssd_rec_slot *slots, uint8_t *buf,
                   size_t buflen)
{
    size_t ns_len = strnlen(h->ns, SSD_NS_MAX + 1);
    if (ns_len > SSD_NS_MAX || h->nslots == 0 || h->nslots > SSD_REC_SLOTS_MAX || h->key.len == 0 ||
        h->key.len > PF_HASH_MAX)
        return -EINVAL;
    h->version = SSD_REC_VERSION;
    h->hdr_len = ssd_rec_hdr_len(ns_len, h->nslots);
    h->layout_fp = ssd_layout_fp(slots, h->nslots);
    if (buflen < h->hdr_len)
        return -EINVAL;
    memset(buf, 0, h->hdr_len);
    memcpy(buf, SSD_REC_MAGIC, 8);
    put32(buf + 8, h->version);
    put32(buf + 12, h->hdr_len);
    put64(buf + 16, h->seq);
    put64(buf + 24, h->payload_len);
    memcpy(buf + 32, h->uuid, 16);
    put64(buf + 48, h->layout_fp);
    put16(buf + 56, h->nslots);
    buf[58] = h->key.len;
    buf[59] = (uint8_t)ns_len;
    memcpy(buf + 64, h->key.hash, h->key.len);
    memcpy(buf + SSD_REC_FIXED, h->ns, ns_len);
    uint8_t *t = buf + SSD_REC_FIXED + ns_area(ns_len);
    for (uint16_t i = 0; i < h->nslots; i++, t += SSD_REC_SLOT_BYTES) {
        put64(t, slots[i].checksum);
        put32(t + 8, slots[i].seg_len);
        put32(t + 12, slots[i].seg_stride);
        put16(t + 16, (uint16_t)slots[i].numa);
        t[18] = slots[i].nseg;
    }
    put64(buf + 120, XXH3_64bits(buf, h->hdr_len));
    return 0;
}

enum ssd_parse ssd_rec_decode(const uint8_t *buf, size_t len, struct ssd_rec_hdr *h)
{
    if (len < SSD_REC_FIXED || memcmp(buf, SSD_REC_MAGIC, 8) != 0)
        return len < SSD_REC_FIXED && len >= 8 && memcmp(buf, SSD_REC_MAGIC, 8) == 0
                   ? SSD_PARSE_SHORT
                   : SSD_PARSE_NONE;
    uint32_t version = get32(buf + 8);
    if (version != SSD_REC_VERSION)
        return SSD_PARSE_VERSION;
    uint32_t hdr_len = get32(buf + 12);
    uint16_t nslots = get16(buf + 56);
    uint8_t key_len = buf[58], ns_len = buf[59];
    /* hdr_len must be exactly what its fields need: bounded before it is used as a length */
    if (nslots == 0 || nslots > SSD_REC_SLOTS_MAX || hdr_len != ssd_rec_hdr_len(ns_len, nslots))
        return SSD_PARSE_CHECKSUM;
    if (len < hdr_len)
        return SSD_PARSE_SHORT;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    static const uint8_t zero8[8];
    XXH3_64bits_update(&st, buf, 120);
    XXH3_64bits_update(&st, zero8, 8);
    XXH3_64bits_update(&st, buf + 128, hdr_len - 128);
    if (XXH3_64bits_digest(&st) != get64(buf + 120))
        return SSD_PARSE_CHECKSUM;
    /* a verified header still has to make sense */
    if (key_len == 0 || key_len > PF_HASH_MAX || get32(buf + 60) || get64(buf + 104) ||
        get64(buf + 112) || !all_zero(buf + 64 + key_len, PF_HASH_MAX - key_len))
        return SSD_PARSE_INVALID;
    memset(h, 0, sizeof(*h));
    h->version = version;
    h->hdr_len = hdr_len;
    h->seq = get64(buf + 16);
    h->payload_len = get64(buf + 24);
    memcpy(h->uuid, buf + 32, 16);
    h->layout_fp = get64(buf + 48);
    h->nslots = nslots;
    h->key.len = key_len;
    memcpy(h->key.hash, buf + 64, key_len);
    memcpy(h->ns, buf + SSD_REC_FIXED, ns_len);
    h->ns[ns_len] = 0;
    if (memchr(h->ns, 0, ns_len) ||
        !all_zero(buf + SSD_REC_FIXED + ns_len, ns_area(ns_len) - ns_len))
        return SSD_PARSE_INVALID;
    h->slots_raw = buf + SSD_REC_FIXED + ns_area(ns_len);
    uint64_t total = 0;
    struct ssd_rec_slot s;
    XXH3_state_t fp;
    XXH3_64bits_reset(&fp);
    uint8_t b[12];
    put16(b, nslots);
    XXH3_64bits_update(&fp, b, 2);
    for (uint16_t i = 0; i < nslots; i++) {
        ssd_rec_slot_at(h, i, &s);
        const uint8_t *t = h->slots_raw + (size_t)i * SSD_REC_SLOT_BYTES;
        if (t[19] || get32(t + 20) || s.nseg < 1 || s.nseg > 2 || s.seg_stride == 0 ||
            s.seg_stride % PF_BLK_ALIGN || s.seg_len > s.seg_stride || s.seg_len == 0)
            return SSD_PARSE_INVALID;
        total += (uint64_t)s.seg_stride * s.nseg;
        put32(b, s.seg_len);
        put32(b + 4, s.seg_stride);
        put32(b + 8, s.nseg);
        XXH3_64bits_update(&fp, b, 12);
    }
    size_t used = SSD_REC_FIXED + ns_area(ns_len) + (size_t)nslots * SSD_REC_SLOT_BYTES;
    if (total != h->payload_len || XXH3_64bits_digest(&fp) != h->layout_fp ||
        !all_zero(buf + used, hdr_len - used))
        return SSD_PARSE_INVALID;
    return SSD_PARSE_OK;
}

void ssd_rec_slot_at(const struct ssd_rec_hdr *h, uint16_t i, struct ssd_rec_slot *s)
{
    const uint8_t *t = h->slots_raw + (size_t)i * SSD_REC_SLOT_BYTES;
    s->checksum = get64(t);
    s->seg_len = get32(t + 8);
    s->seg_stride = get32(t + 12);
    s->numa = (int16_t)get16(t + 16);
    s->nseg = t[18];
}

bool ssd_rec_payload_ok(const struct ssd_rec_hdr *h, const uint8_t *p)
{
    uint64_t off = 0;
    for (uint16_t i = 0; i < h->nslots; i++) {
        struct ssd_rec_slot s;
        ssd_rec_slot_at(h, i, &s);
        const uint8_t *k = p + off;
        const uint8_t *v = s.nseg > 1 ? k + s.seg_stride : NULL;
        if (pf_checksum2(k, s.seg_len, v, v ? s.seg_len : 0) != s.checksum)
            return false;
        off += (uint64_t)s.seg_stride * s.nseg;
    }
    return off == h->payload_len;
}

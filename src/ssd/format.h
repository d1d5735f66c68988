/* On-disk format of the SSD tier (docs/ssd.md, "On-disk format"): a superblock at the start
 * of every shard file and a self-describing header in front of every record, so that the
 * ring can be scanned and the index rebuilt after any crash.
 *
 * File:   [superblock: SSD_SB_SIZE bytes][ring: cap bytes]; ring offset r at file offset
 *         SSD_SB_SIZE + r.
 * Record: [header: hdr_len bytes, a multiple of 4096][payload: the block's slots, as before],
 *         taking round_up(hdr_len + payload, 4096) bytes of the ring.
 *
 * All integers little-endian. Checksums are xxh3-64 (libxxhash). Nothing here does I/O or
 * holds locks; every decoder validates every field before it returns success and never
 * reads outside the buffer it is given. */
#ifndef PF_SSD_FORMAT_H
#define PF_SSD_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pf/block.h"

#define SSD_SB_SIZE        4096u
#define SSD_SB_MAGIC       "PFSSDSB\0"
#define SSD_REC_MAGIC      "PFSSDREC"
#define SSD_FORMAT_VERSION 1u
#define SSD_REC_VERSION    1u
#define SSD_NS_MAX         255u  /* namespace name bytes a record can carry */
#define SSD_REC_SLOTS_MAX  4096u /* slots a record can carry */
#define SSD_REC_FIXED      128u  /* fixed part of a record header */
#define SSD_REC_SLOT_BYTES 24u   /* one slot descriptor */
#define SSD_REC_ALIGN                                                                              \
    4096u /* records start (and headers end) 4 KiB-aligned: a block's                              \
           * bytes keep the file-system block alignment O_DIRECT needs                             \
           * to take its fast path (and 4Kn devices need at all) */

struct ssd_superblock {
    uint32_t version;
    uint64_t file_size;
    uint64_t ring_off, ring_cap;
    uint32_t shard, nshards;
    uint8_t uuid[16]; /* identity of this file's contents, random at formatting */
};

/* One slot of a record (the geometry and checksum the index keeps). */
struct ssd_rec_slot {
    uint64_t checksum; /* xxh3-64 of the slot's data bytes (pf_checksum2 of K then V) */
    uint32_t seg_len, seg_stride;
    int16_t numa;
    uint8_t nseg;
};

struct ssd_rec_hdr {
    uint32_t version;
    uint32_t hdr_len; /* bytes, multiple of SSD_REC_ALIGN */
    uint64_t seq;     /* store-wide, strictly increasing over the file's lifetime */
    uint64_t payload_len;
    uint8_t uuid[16];
    uint64_t layout_fp;      /* ssd_layout_fp of the slots */
    struct pf_block_key key; /* key.ns is not stored (process-local): see ns */
    char ns[SSD_NS_MAX + 1];
    uint16_t nslots;
    const uint8_t *slots_raw; /* decode: the slot table inside the caller's buffer */
};

enum ssd_parse {
    SSD_PARSE_OK = 0,
    SSD_PARSE_NONE,     /* no record magic here (free space, zeros, the middle of data) */
    SSD_PARSE_VERSION,  /* record magic with a version this build does not read */
    SSD_PARSE_CHECKSUM, /* record magic, header checksum does not verify */
    SSD_PARSE_INVALID,  /* header checksum verifies but a field is out of range */
    SSD_PARSE_SHORT,    /* the buffer ends before hdr_len (read more and retry) */
};

/* Superblock: encodes into buf (SSD_SB_SIZE bytes, zero-filled first). */
void ssd_sb_encode(const struct ssd_superblock *sb, uint8_t *buf);
/* 0 ok; -ENODATA: all zero (a fresh file); -EPROTO: our magic, another format version
 * (*version_p set); -EBADMSG: not ours or corrupt. */
int ssd_sb_decode(const uint8_t *buf, struct ssd_superblock *sb, uint32_t *version_p);

/* Fingerprint of a block geometry: slot count and each slot's (seg_len, seg_stride, nseg). */
uint64_t ssd_layout_fp(const struct ssd_rec_slot *slots, uint16_t nslots);
/* Header bytes for a record with a namespace name of ns_len bytes and nslots slots. */
static inline uint64_t ssd_rec_span(uint64_t hdr_len, uint64_t payload)
{
    return (hdr_len + payload + SSD_REC_ALIGN - 1) / SSD_REC_ALIGN * SSD_REC_ALIGN;
}
uint32_t ssd_rec_hdr_len(size_t ns_len, uint16_t nslots);
/* Encodes h (version, hdr_len and layout_fp are computed) with the slot table into buf of
 * h->hdr_len bytes (hdr_len computed first with ssd_rec_hdr_len). -EINVAL when the
 * namespace or slot count do not fit. */
int ssd_rec_encode(struct ssd_rec_hdr *h, const struct ssd_rec_slot *slots, uint8_t *buf,
                   size_t buflen);
/* Decodes the header at buf (len bytes available). On SSD_PARSE_OK, h is filled and
 * h->slots_raw points into buf; ssd_rec_slot_at reads slot i. */
enum ssd_parse ssd_rec_decode(const uint8_t *buf, size_t len, struct ssd_rec_hdr *h);
void ssd_rec_slot_at(const struct ssd_rec_hdr *h, uint16_t i, struct ssd_rec_slot *s);
/* Whether the payload (h->payload_len bytes at p) matches every slot checksum and the slot
 * table adds up to payload_len. */
bool ssd_rec_payload_ok(const struct ssd_rec_hdr *h, const uint8_t *p);

#endif

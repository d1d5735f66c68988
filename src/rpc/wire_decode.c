/* Requests decoded in place (see wire_decode.h). Two passes over the bytes: the first checks
 * wire types and counts the repeated elements and string bytes; one allocation then holds
 * every array; the second fills them. */
#include <errno.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/wire.h"
#include "rpc/wire_decode.h"

/* SaveRequest and SaveLayer field numbers (proto/engine.proto) */
enum { REQ_INSTANCE = 1, REQ_TP = 2, REQ_DEVICE = 3, REQ_SAVES = 4, REQ_PP = 5 };
enum { LAYER_NAME = 1, LAYER_IDS = 2, LAYER_HASHES = 3 };

/* One SaveLayer: its counts and its (last) name. */
struct layer_scan {
    size_t nids, nhashes;
    const uint8_t *name;
    size_t namelen;
};

/* Packed block ids: the number of varints in [p, end), or -1 when one is truncated. */
static long packed_count(const uint8_t *p, const uint8_t *end, uint32_t *out)
{
    struct pf_wire w = {p, end};
    long n = 0;
    while (w.p < w.end) {
        uint64_t v;
        if (w.p[0] < 0x80) { /* one-byte ids (< 128): the common first blocks */
            v = *w.p++;
        } else if (pf_wire_get_varint(&w, &v) != 0) {
            return -1;
        }
        if (out)
            out[n] = (uint32_t)v;
        n++;
    }
    return n;
}

/* Walks one SaveLayer: counts (fill NULL) or fills ids and hashes. 0 or -EBADMSG. */
static int layer_walk(const uint8_t *p, size_t len, struct layer_scan *sc, uint32_t *ids,
                      struct pf_bytes *hashes)
{
    struct pf_wire w = {p, p + len};
    struct pf_wire_field f = {0};
    size_t ni = 0, nh = 0;
    int r;
    while ((r = pf_wire_next(&w, &f)) == 1) {
        switch (f.number) {
        case LAYER_NAME:
            if (f.type != 2)
                return -EBADMSG;
            sc->name = f.data;
            sc->namelen = f.len;
            break;
        case LAYER_IDS:
            if (f.type == 0) {
                if (ids)
                    ids[ni] = (uint32_t)f.varint;
                ni++;
            } else if (f.type == 2) {
                long n = packed_count(f.data, f.data + f.len, ids ? ids + ni : NULL);
                if (n < 0)
                    return -EBADMSG;
                ni += (size_t)n;
            } else {
                return -EBADMSG;
            }
            break;
        case LAYER_HASHES:
            if (f.type != 2)
                return -EBADMSG;
            if (hashes)
                hashes[nh] = (struct pf_bytes){f.data, f.len};
            nh++;
            break;
        default:
            break; /* unknown fields are skipped, as protobuf does */
        }
    }
    if (r < 0)
        return -EBADMSG;
    sc->nids = ni;
    sc->nhashes = nh;
    return 0;
}

static size_t round8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* Copies a string field's n bytes at p (NULL: absent, "") to *cur as a C string; returns it
 * and advances *cur past its NUL. */
static const char *put_str(char **cur, const uint8_t *p, size_t n)
{
    char *s = *cur;
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    *cur += n + 1;
    return s;
}

int pf_wire_decode_save(const uint8_t *data, size_t len, struct pf_wire_save *s)
{
    memset(s, 0, sizeof(*s));
    struct pf_wire w = {data, data + len};
    struct pf_wire_field f = {0};
    const uint8_t *inst = NULL;
    size_t instlen = 0, nlayers = 0, nids = 0, nhashes = 0, strbytes = 0;
    uint64_t tp = 0, pp = 0, dev = 0;
    int r;
    /* pass 1: wire types, counts */
    while ((r = pf_wire_next(&w, &f)) == 1) {
        switch (f.number) {
        case REQ_INSTANCE:
            if (f.type != 2)
                return -EBADMSG;
            inst = f.data;
            instlen = f.len;
            break;
        case REQ_TP:
        case REQ_DEVICE:
        case REQ_PP:
            if (f.type != 0)
                return -EBADMSG;
            *(f.number == REQ_TP ? &tp : f.number == REQ_PP ? &pp : &dev) = f.varint;
            break;
        case REQ_SAVES: {
            if (f.type != 2)
                return -EBADMSG;
            struct layer_scan sc = {0};
            if (layer_walk(f.data, f.len, &sc, NULL, NULL) != 0)
                return -EBADMSG;
            nlayers++;
            nids += sc.nids;
            nhashes += sc.nhashes;
            strbytes += sc.namelen + 1;
            break;
        }
        default:
            break;
        }
    }
    if (r < 0)
        return -EBADMSG;
    strbytes += instlen + 1;
    /* one allocation: layers, hash references, ids, strings (each part 8-byte aligned) */
    size_t off_h = round8(nlayers * sizeof(struct pf_engine_save_layer));
    size_t off_i = off_h + round8(nhashes * sizeof(struct pf_bytes));
    size_t off_s = off_i + round8(nids * sizeof(uint32_t));
    char *mem = malloc(off_s + strbytes);
    if (!mem)
        return -ENOMEM;
    struct pf_engine_save_layer *layers = (void *)mem;
    struct pf_bytes *hashes = (void *)(mem + off_h);
    uint32_t *ids = (void *)(mem + off_i);
    char *str = mem + off_s;
    s->instance_id = put_str(&str, inst, instlen);
    /* pass 2: the layers (the wire was checked in pass 1) */
    w = (struct pf_wire){data, data + len};
    size_t li = 0;
    while (pf_wire_next(&w, &f) == 1) {
        if (f.number != REQ_SAVES)
            continue;
        struct layer_scan sc = {0};
        (void)layer_walk(f.data, f.len, &sc, ids, hashes);
        layers[li++] = (struct pf_engine_save_layer){.name = put_str(&str, sc.name, sc.namelen),
                                                     .block_ids = ids,
                                                     .nids = sc.nids,
                                                     .hashes = hashes,
                                                     .nhashes = sc.nhashes};
        ids += sc.nids;
        hashes += sc.nhashes;
    }
    s->tp_rank = (uint32_t)tp;
    s->pp_rank = (uint32_t)pp;
    s->device_id = (int32_t)(uint32_t)dev;
    s->layers = layers;
    s->nlayers = nlayers;
    s->mem = mem;
    return 0;
}

void pf_wire_save_free(struct pf_wire_save *s)
{
    free(s->mem);
    memset(s, 0, sizeof(*s));
}

int pf_wire_decode_prefix_query(const uint8_t *data, size_t len, struct pf_wire_prefix_query *q)
{
    enum { PQ_NAMESPACE = 1, PQ_HASHES = 2 };
    memset(q, 0, sizeof(*q));
    struct pf_wire w = {data, data + len};
    struct pf_wire_field f = {0};
    const uint8_t *ns = NULL;
    size_t nslen = 0, n = 0;
    int r;
    while ((r = pf_wire_next(&w, &f)) == 1) {
        if (f.number != PQ_NAMESPACE && f.number != PQ_HASHES)
            continue; /* unknown fields are skipped */
        if (f.type != 2)
            return -EBADMSG;
        if (f.number == PQ_NAMESPACE) {
            ns = f.data;
            nslen = f.len;
        } else {
            n++;
        }
    }
    if (r < 0)
        return -EBADMSG;
    size_t off_s = round8(n * sizeof(struct pf_meta_hash));
    char *mem = malloc(off_s + nslen + 1);
    if (!mem)
        return -ENOMEM;
    struct pf_meta_hash *hashes = (void *)mem;
    char *str = mem + off_s;
    q->ns = put_str(&str, ns, nslen);
    w = (struct pf_wire){data, data + len};
    size_t i = 0;
    while (pf_wire_next(&w, &f) == 1)
        if (f.number == PQ_HASHES)
            hashes[i++] = (struct pf_meta_hash){.len = f.len, .data = f.data};
    q->hashes = hashes;
    q->n = n;
    q->mem = mem;
    return 0;
}

void pf_wire_prefix_query_free(struct pf_wire_prefix_query *q)
{
    free(q->mem);
    memset(q, 0, sizeof(*q));
}

/* Protobuf wire-format field reader (see wire.h). Rejects truncated varints and lengths,
 * field number 0, and the deprecated group wire types. */
#include "rpc/wire.h"

static int varint(struct pf_wire *w, uint64_t *v)
{
    uint64_t r = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (w->p >= w->end)
            return -1;
        uint8_t b = *w->p++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -1;
}

int pf_wire_next(struct pf_wire *w, struct pf_wire_field *f)
{
    if (w->p >= w->end)
        return 0;
    uint64_t key;
    if (varint(w, &key) != 0)
        return -1;
    f->number = (uint32_t)(key >> 3);
    f->type = (uint32_t)(key & 7);
    if (f->number == 0 || key >> 3 > 0x1fffffff)
        return -1;
    switch (f->type) {
    case 0:
        return varint(w, &f->varint) == 0 ? 1 : -1;
    case 1:
        if (w->end - w->p < 8)
            return -1;
        w->p += 8;
        return 1;
    case 5:
        if (w->end - w->p < 4)
            return -1;
        w->p += 4;
        return 1;
    case 2: {
        uint64_t len;
        if (varint(w, &len) != 0 || len > (uint64_t)(w->end - w->p))
            return -1;
        f->data = w->p;
        f->len = (size_t)len;
        w->p += len;
        return 1;
    }
    default:
        return -1;
    }
}

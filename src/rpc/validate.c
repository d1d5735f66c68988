/* Wire-level request validation (see validate.h). One pass over the encoded bytes per
 * nesting level, guided by the protobuf-c descriptors; repeated counts are kept per field
 * index in a small array on the stack (messages here have few fields). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "rpc/validate.h"
#include "rpc/wire.h"

#define MAX_FIELDS 64

/* Upper bound of the elements in a length-delimited run of a repeated field: 1 for strings,
 * bytes and messages; for a packed scalar run, its bytes over the element's minimum size. */
static uint64_t packed_elems(const ProtobufCFieldDescriptor *fd, size_t len)
{
    switch (fd->type) {
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE:
        return 1;
    case PROTOBUF_C_TYPE_DOUBLE:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return len / 8;
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return len / 4;
    default:
        return len; /* varints: at least one byte each */
    }
}

static int check(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                 unsigned depth, char *err, size_t errlen)
{
    if (depth > PF_RPC_MAX_DEPTH) {
        snprintf(err, errlen, "%s nests messages deeper than %u levels", d->short_name,
                 PF_RPC_MAX_DEPTH);
        return -EINVAL;
    }
    if (len == 0)
        return 0; /* the empty message (data may be NULL: no pointer arithmetic on it) */
    uint32_t counts[MAX_FIELDS] = {0};
    struct pf_wire w = {data, data + len};
    struct pf_wire_field f = {0};
    const ProtobufCFieldDescriptor *fd = NULL;
    uint32_t fd_number = 0; /* fd's field number: a repeated field's run looks it up once */
    int r;
    while ((r = pf_wire_next(&w, &f)) == 1) {
        if (f.number != fd_number) {
            fd = protobuf_c_message_descriptor_get_field(d, f.number);
            fd_number = f.number;
        }
        if (!fd)
            continue;
        size_t idx = (size_t)(fd - d->fields);
        if (fd->label == PROTOBUF_C_LABEL_REPEATED && idx < MAX_FIELDS) {
            uint64_t add = f.type == 2 ? packed_elems(fd, f.len) : 1;
            if ((uint64_t)counts[idx] + add > PF_RPC_MAX_REPEATED) {
                snprintf(err, errlen, "%s.%s has more than %u elements", d->short_name, fd->name,
                         PF_RPC_MAX_REPEATED);
                return -E2BIG;
            }
            counts[idx] += (uint32_t)add;
        }
        if (f.type != 2)
            continue;
        if (fd->type == PROTOBUF_C_TYPE_STRING) {
            if (f.len > PF_RPC_MAX_STRING) {
                snprintf(err, errlen, "%s.%s is %zu bytes; string fields are limited to %u bytes",
                         d->short_name, fd->name, f.len, PF_RPC_MAX_STRING);
                return -EMSGSIZE;
            }
            const uint8_t *nul = memchr(f.data, 0, f.len);
            if (nul) {
                snprintf(err, errlen, "%s.%s contains a NUL byte (at offset %zu)", d->short_name,
                         fd->name, (size_t)(nul - f.data));
                return -EINVAL;
            }
        } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
            int rc = check(fd->descriptor, f.data, f.len, depth + 1, err, errlen);
            if (rc)
                return rc;
        }
    }
    if (r < 0) {
        snprintf(err, errlen, "malformed %s (protobuf decoding failed)", d->short_name);
        return -EINVAL;
    }
    return 0;
}

int pf_rpc_validate(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, char *err,
                    size_t errlen)
{
    return check(d, data, len, 0, err, errlen);
}

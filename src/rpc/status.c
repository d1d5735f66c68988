/* gRPC status names and the errno <-> status mappings used on both sides of the wire,
 * plus the protobuf-c <-> byte buffer helpers. */
#include <errno.h>

#include "pf/rpc.h"
#include "rpc/rpc_internal.h"

static const char *const names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *pf_grpc_code_name(int code)
{
    if (code < 0 || (size_t)code >= sizeof(names) / sizeof(names[0]))
        return "UNKNOWN";
    return names[code];
}

int pf_grpc_code_from_errno(int e)
{
    switch (e) {
    case 0:
        return PF_GRPC_OK;
    case -EINVAL:
    case -ERANGE:
    case -E2BIG:
        return PF_GRPC_INVALID_ARGUMENT;
    case -ENOENT:
    case -EPERM:
    case -ESTALE:
        return PF_GRPC_FAILED_PRECONDITION;
    case -ETIMEDOUT:
        return PF_GRPC_DEADLINE_EXCEEDED;
    case -EOPNOTSUPP:
        return PF_GRPC_UNIMPLEMENTED;
    case -EAGAIN:
    case -ENOBUFS:
        return PF_GRPC_RESOURCE_EXHAUSTED;
    case -ECANCELED:
        return PF_GRPC_CANCELLED;
    case -ECONNREFUSED:
    case -ENOTCONN:
        return PF_GRPC_UNAVAILABLE;
    default:
        return PF_GRPC_INTERNAL;
    }
}

int pf_errno_from_grpc_code(int code)
{
    switch (code) {
    case PF_GRPC_OK:
        return 0;
    case PF_GRPC_CANCELLED:
        return -ECANCELED;
    case PF_GRPC_INVALID_ARGUMENT:
        return -EINVAL;
    case PF_GRPC_DEADLINE_EXCEEDED:
        return -ETIMEDOUT;
    case PF_GRPC_NOT_FOUND:
        return -ENOENT;
    case PF_GRPC_ALREADY_EXISTS:
        return -EEXIST;
    case PF_GRPC_PERMISSION_DENIED:
    case PF_GRPC_UNAUTHENTICATED:
        return -EACCES;
    case PF_GRPC_RESOURCE_EXHAUSTED:
        return -ENOBUFS;
    case PF_GRPC_FAILED_PRECONDITION:
        return -EPERM;
    case PF_GRPC_ABORTED:
        return -ECONNABORTED;
    case PF_GRPC_OUT_OF_RANGE:
        return -ERANGE;
    case PF_GRPC_UNIMPLEMENTED:
        return -EOPNOTSUPP;
    case PF_GRPC_INTERNAL:
        return -EIO;
    case PF_GRPC_UNAVAILABLE:
        return -ECONNREFUSED;
    case PF_GRPC_DATA_LOSS:
        return -EBADMSG;
    default:
        return -EPROTO;
    }
}

grpc_byte_buffer *pf_rpc_pack(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_slice pf_rpc_bb_to_slice(grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader r;
    grpc_byte_buffer_reader_init(&r, bb);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return s;
}

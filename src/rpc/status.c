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

/* The one errno -> status table. docs/server.md ("Error codes") lists the same rows and a
 * unit test checks both ways. Anything not listed is INTERNAL: a server fault, never a
 * client mistake (the engine returns one of the listed codes for every client mistake). */
const struct pf_errno_code pf_errno_codes[] = {
    {EINVAL, PF_GRPC_INVALID_ARGUMENT},    {ERANGE, PF_GRPC_INVALID_ARGUMENT},
    {E2BIG, PF_GRPC_INVALID_ARGUMENT},     {EMSGSIZE, PF_GRPC_INVALID_ARGUMENT},
    {ENOENT, PF_GRPC_FAILED_PRECONDITION}, {EPERM, PF_GRPC_FAILED_PRECONDITION},
    {ESTALE, PF_GRPC_FAILED_PRECONDITION}, {EFAULT, PF_GRPC_FAILED_PRECONDITION},
    {ENODEV, PF_GRPC_FAILED_PRECONDITION}, {EEXIST, PF_GRPC_ALREADY_EXISTS},
    {EACCES, PF_GRPC_PERMISSION_DENIED},   {ETIMEDOUT, PF_GRPC_DEADLINE_EXCEEDED},
    {EOPNOTSUPP, PF_GRPC_UNIMPLEMENTED},   {EAGAIN, PF_GRPC_RESOURCE_EXHAUSTED},
    {ENOBUFS, PF_GRPC_RESOURCE_EXHAUSTED}, {ENOMEM, PF_GRPC_RESOURCE_EXHAUSTED},
    {ENOSPC, PF_GRPC_RESOURCE_EXHAUSTED},  {ECANCELED, PF_GRPC_CANCELLED},
    {ECONNREFUSED, PF_GRPC_UNAVAILABLE},   {ENOTCONN, PF_GRPC_UNAVAILABLE},
    {ESHUTDOWN, PF_GRPC_UNAVAILABLE},      {ENOTRECOVERABLE, PF_GRPC_UNAVAILABLE},
};
const size_t pf_errno_ncodes = sizeof(pf_errno_codes) / sizeof(pf_errno_codes[0]);

int pf_grpc_code_from_errno(int e)
{
    if (e == 0)
        return PF_GRPC_OK;
    for (size_t i = 0; i < pf_errno_ncodes; i++)
        if (-e == pf_errno_codes[i].err)
            return pf_errno_codes[i].code;
    return PF_GRPC_INTERNAL;
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

/* Wire types against the reference's engine.proto (pegaflow-proto/proto/engine.proto): every
 * field we share with the reference has the reference's scalar type, so any decoder generated
 * from the reference proto reads what we send; and bytes we encode decode with the reference's
 * types by a strict wire reader (a uint32 field must be a varint of at most 5 bytes holding a
 * 32-bit value) - int32 -1 (a 10-byte varint) would not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.pb-c.h"
#include "pf/p2p.h"

struct ref_field {
    const ProtobufCMessageDescriptor *msg;
    unsigned num;
    ProtobufCType type;
};

/* the reference's types for the messages both protos have (field number -> type) */
static const struct ref_field ref[] = {
    {&pegaflow__transfer_slot_info__descriptor, 1, PROTOBUF_C_TYPE_UINT64},
    {&pegaflow__transfer_slot_info__descriptor, 2, PROTOBUF_C_TYPE_UINT64},
    {&pegaflow__transfer_slot_info__descriptor, 3, PROTOBUF_C_TYPE_UINT64},
    {&pegaflow__transfer_slot_info__descriptor, 4, PROTOBUF_C_TYPE_UINT64},
    {&pegaflow__transfer_slot_info__descriptor, 5, PROTOBUF_C_TYPE_UINT32},
    {&pegaflow__transfer_block_info__descriptor, 1, PROTOBUF_C_TYPE_BYTES},
    {&pegaflow__transfer_block_info__descriptor, 2, PROTOBUF_C_TYPE_MESSAGE},
    {&pegaflow__query_blocks_for_transfer_request__descriptor, 1, PROTOBUF_C_TYPE_STRING},
    {&pegaflow__query_blocks_for_transfer_request__descriptor, 2, PROTOBUF_C_TYPE_BYTES},
    {&pegaflow__query_blocks_for_transfer_request__descriptor, 3, PROTOBUF_C_TYPE_STRING},
    {&pegaflow__query_blocks_for_transfer_response__descriptor, 1, PROTOBUF_C_TYPE_MESSAGE},
    {&pegaflow__query_blocks_for_transfer_response__descriptor, 2, PROTOBUF_C_TYPE_MESSAGE},
    {&pegaflow__query_blocks_for_transfer_response__descriptor, 3, PROTOBUF_C_TYPE_STRING},
    {&pegaflow__query_blocks_for_transfer_response__descriptor, 4, PROTOBUF_C_TYPE_UINT32},
    {&pegaflow__release_transfer_lock_request__descriptor, 1, PROTOBUF_C_TYPE_STRING},
    {&pegaflow__release_transfer_lock_response__descriptor, 2, PROTOBUF_C_TYPE_UINT64},
    {&pegaflow__rdma_handshake_request__descriptor, 1, PROTOBUF_C_TYPE_STRING},
    {&pegaflow__rdma_handshake_request__descriptor, 2, PROTOBUF_C_TYPE_BYTES},
    {&pegaflow__rdma_handshake_response__descriptor, 2, PROTOBUF_C_TYPE_BYTES},
    {&pegaflow__query_prefix_blocks_request__descriptor, 1, PROTOBUF_C_TYPE_STRING},
    {&pegaflow__query_prefix_blocks_request__descriptor, 2, PROTOBUF_C_TYPE_BYTES},
    {&pegaflow__node_prefix__descriptor, 1, PROTOBUF_C_TYPE_STRING},
    {&pegaflow__node_prefix__descriptor, 2, PROTOBUF_C_TYPE_UINT32},
    {&pegaflow__query_ready__descriptor, 1, PROTOBUF_C_TYPE_UINT64},
    {&pegaflow__query_ready__descriptor, 2, PROTOBUF_C_TYPE_BYTES},
    {&pegaflow__query_ready__descriptor, 3, PROTOBUF_C_TYPE_UINT32},
};

static void test_field_types_are_the_references(void **st)
{
    for (size_t i = 0; i < sizeof(ref) / sizeof(ref[0]); i++) {
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(ref[i].msg, ref[i].num);
        if (!f)
            fail_msg("%s has no field %u", ref[i].msg->name, ref[i].num);
        if (f->type != ref[i].type)
            fail_msg("%s.%s (= %u) has type %d, the reference's is %d", ref[i].msg->name, f->name,
                     ref[i].num, (int)f->type, (int)ref[i].type);
    }
}

/* strict reader: the varint at *p (advancing it); its length in bytes in *len_p */
static uint64_t varint(const uint8_t **p, const uint8_t *end, size_t *len_p)
{
    uint64_t v = 0;
    size_t n = 0;
    for (;;) {
        assert_true(*p < end && n < 10);
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << (7 * n++);
        if (!(b & 0x80))
            break;
    }
    *len_p = n;
    return v;
}

/* the value of field num (a varint of the reference's width) in the message buf; -1 absent */
static int64_t ref_varint_field(const uint8_t *buf, size_t len, unsigned num, bool is32,
                                const uint8_t **sub_p, size_t *sublen_p, unsigned sub_num)
{
    const uint8_t *p = buf, *end = buf + len;
    int64_t found = -1;
    while (p < end) {
        size_t n;
        uint64_t key = varint(&p, end, &n);
        unsigned f = (unsigned)(key >> 3), wt = key & 7;
        if (wt == 0) {
            uint64_t v = varint(&p, end, &n);
            if (f == num) {
                if (is32) {
                    if (n > 5 || v > UINT32_MAX)
                        fail_msg("field %u: a %zu-byte varint (%llu) where the reference has "
                                 "uint32",
                                 f, n, (unsigned long long)v);
                }
                found = (int64_t)v;
            }
        } else if (wt == 2) {
            uint64_t l = varint(&p, end, &n);
            assert_true(l <= (uint64_t)(end - p));
            if (sub_p && f == sub_num && !*sub_p) {
                *sub_p = p;
                *sublen_p = (size_t)l;
            }
            p += l;
        } else if (wt == 1) {
            p += 8;
        } else if (wt == 5) {
            p += 4;
        } else {
            fail_msg("wire type %u", wt);
        }
    }
    return found;
}

static void test_no_numa_decodes_as_the_references_unknown(void **st)
{
    Pegaflow__TransferSlotInfo si = PEGAFLOW__TRANSFER_SLOT_INFO__INIT, *sp = &si;
    si.k_ptr = 0x7f0000001000ull;
    si.k_size = 4096;
    si.numa_node = PF_WIRE_NUMA_NONE;
    Pegaflow__TransferBlockInfo bi = PEGAFLOW__TRANSFER_BLOCK_INFO__INIT, *bp = &bi;
    uint8_t h[32] = {1};
    bi.block_hash = (ProtobufCBinaryData){32, h};
    bi.n_slots = 1;
    bi.slots = &sp;
    Pegaflow__QueryBlocksForTransferResponse r = PEGAFLOW__QUERY_BLOCKS_FOR_TRANSFER_RESPONSE__INIT;
    r.n_blocks = 1;
    r.blocks = &bp;
    r.transfer_session_id = "s";
    r.lock_timeout_secs = 120;
    size_t len = protobuf_c_message_get_packed_size(&r.base);
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    protobuf_c_message_pack(&r.base, buf);
    const uint8_t *blk = NULL, *slot = NULL;
    size_t blen = 0, slen = 0;
    assert_int_equal(ref_varint_field(buf, len, 4, true, &blk, &blen, 2), 120);
    assert_non_null(blk);
    ref_varint_field(blk, blen, 0, false, &slot, &slen, 2);
    assert_non_null(slot);
    /* the reference's NumaNode::UNKNOWN is u32::MAX */
    assert_int_equal(ref_varint_field(slot, slen, 5, true, NULL, NULL, 0), (int64_t)UINT32_MAX);
    assert_int_equal(ref_varint_field(slot, slen, 2, false, NULL, NULL, 0), 4096);
    free(buf);

    Pegaflow__NodePrefix np = PEGAFLOW__NODE_PREFIX__INIT;
    np.node = "10.0.0.1:50055";
    np.prefix_len = 7;
    len = protobuf_c_message_get_packed_size(&np.base);
    buf = malloc(len);
    assert_non_null(buf);
    protobuf_c_message_pack(&np.base, buf);
    assert_int_equal(ref_varint_field(buf, len, 2, true, NULL, NULL, 0), 7);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_field_types_are_the_references),
        cmocka_unit_test(test_no_numa_decodes_as_the_references_unknown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

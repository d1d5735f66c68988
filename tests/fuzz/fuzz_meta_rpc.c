/* Fuzz target: every request of service pegaflow.MetaServer (src/meta/service.c), unpacked
 * by the generated protobuf-c code (QueryPrefixBlocks: validated by pf_rpc_validate, then
 * decoded in place by its raw handler, as in the server) and checked by the handlers, against a fresh in-memory
 * store per input (fake clock, stale 30 s, TTL 120 s).
 *
 * Input: byte 0 < 0x80: one request, byte 0 picks the method in pf_meta_methods[] (modulo
 * their number), the rest is the message. Byte 0 >= 0x80: a sequence of records
 * [u8 method][u16 little-endian length][message]; method 0xff is not a request but
 * "advance the clock by the message's first byte in seconds, then sweep" so expiry paths run
 * between requests. Checks (fuzz.h): the handler contract, responses that serialize, and
 * no INTERNAL answer; after every sweep the store's counters stay consistent (no owners
 * without keys). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.pb-c.h"
#include "fuzz.h"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/meta.h"
#include "pf/rpc.h"
#include "rpc/validate.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    pf_log_set_level(PF_LOG_ERROR);
    return 0;
}

static void one(struct pf_meta_store *st, struct pf_fake_clock *clk, uint8_t sel,
                const uint8_t *msg, size_t len)
{
    if (sel == 0xff) {
        pf_fake_clock_advance(clk, (uint64_t)(len ? msg[0] : 1) * PF_NS_PER_SEC);
        struct pf_meta_sweep_stats ss;
        pf_meta_store_sweep(st, &ss);
        struct pf_meta_store_stats s;
        pf_meta_store_get_stats(st, &s);
        if ((s.entries == 0) != (s.owners == 0))
            fz_fail("store: %llu keys but %llu owners after a sweep", (unsigned long long)s.entries,
                    (unsigned long long)s.owners);
        return;
    }
    const struct pf_rpc_method *m = &pf_meta_methods[sel % pf_meta_nmethods];
    if (m->raw) { /* decoded in place (QueryPrefixBlocks), after validation as in the server */
        char verr[PF_RPC_ERRMSG];
        if (pf_rpc_validate(m->req_desc, msg, len, verr, sizeof(verr)) != 0)
            return; /* the server answers with validation's error */
        struct pf_rpc_call call;
        fz_call_reset(&call);
        int rc = m->raw(st, &call, msg, len);
        fz_check_unary(m->path, rc, &call);
        return;
    }
    ProtobufCMessage *req = protobuf_c_message_unpack(m->req_desc, NULL, len, msg);
    if (!req)
        return; /* the server answers INVALID_ARGUMENT "malformed ..." */
    struct pf_rpc_call call;
    fz_call_reset(&call);
    int rc = m->unary(st, &call, req);
    fz_check_unary(m->path, rc, &call);
    protobuf_c_message_free_unpacked(req, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct pf_fake_clock clk;
    pf_fake_clock_init(&clk, 1000 * PF_NS_PER_SEC);
    struct pf_meta_store_config cfg = {.node_stale_secs = 30, .ttl_secs = 120, .clock = &clk.base};
    struct pf_meta_store *st;
    if (pf_meta_store_create(&cfg, &st) != 0)
        fz_fail("cannot create the store");
    if (data[0] < 0x80) {
        one(st, &clk, data[0], data + 1, size - 1);
    } else {
        size_t pos = 1;
        while (size - pos >= 3) {
            uint8_t sel = data[pos];
            size_t len = (size_t)data[pos + 1] | (size_t)data[pos + 2] << 8;
            pos += 3;
            if (len > size - pos)
                len = size - pos;
            one(st, &clk, sel, data + pos, len);
            pos += len;
        }
    }
    pf_meta_store_destroy(st);
    return 0;
}

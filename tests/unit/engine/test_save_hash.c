/* Saves with integrity on store, for every slot, the xxh3-64 of its bytes (K then V) as an
 * independent implementation (the inlined streaming pf_checksum_*) computes it from the
 * client's memory, and the slot's bytes equal that memory: seeded random KV data, one- and
 * two-segment (split K/V) layers, block sizes across the 32 KiB hashing chunk, odd sizes and
 * tensor offsets, blocks saved out of order. Run once on "sim" (the fused copy + hash of
 * copy_batch_hash) and once on "faulty:sim" (no fused copy: the engine's own chunked
 * copy-then-hash pipeline), which must give the same checksums. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client/pegaflow.h"
#include "engine/engine_internal.h"
#include "pf/hal.h"
#include "pf/util.h"
#include "pftest.h"

struct geo {
    uint64_t bpb; /* bytes_per_block (per segment) */
    uint32_t nb;
    int split;       /* two segments: V at kv_stride */
    uint64_t offset; /* of the tensor inside the shm object */
};

static const struct geo geos[] = {
    {4096, 8, 0, 0},     {1000, 16, 1, 0},    {32767, 6, 0, 64}, {32768, 5, 1, 13},
    {32769, 5, 1, 4096}, {65536, 4, 0, 4099}, {200003, 3, 1, 7}, {524288, 3, 0, 0},
};
#define NGEO (sizeof(geos) / sizeof(geos[0]))

static uint64_t ref_hash(const void *a, size_t la, const void *b, size_t lb)
{
    struct pf_checksum c;
    assert_int_equal(pf_checksum_init(&c), 0);
    pf_checksum_update(&c, a, la);
    if (b)
        pf_checksum_update(&c, b, lb);
    uint64_t v = pf_checksum_final(&c);
    pf_checksum_destroy(&c);
    return v;
}

static void run(const char *backend)
{
    char chosen[32], err[256];
    struct pf_gpu *g;
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    pf_hal_init();
    assert_int_equal(pf_hal_gpu_open(backend, &gc, &g, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    struct pf_engine *e;
    struct pf_engine_config ec = {.gpu = g,
                                  .pool_size = 64 << 20,
                                  .integrity = true,
                                  .skip_memcheck = true,
                                  .save_chunk_bytes = 100000}; /* the fallback pipelines */
    assert_int_equal(pf_engine_create(&ec, &e, err, sizeof(err)), 0);
    uint64_t seed = pft_seed();
    for (size_t gi = 0; gi < NGEO; gi++) {
        const struct geo *G = &geos[gi];
        uint64_t kv = G->split ? G->nb * G->bpb + 512 : 0; /* V after every K, a gap between */
        uint64_t size = kv + G->nb * G->bpb;
        struct pf_simkv *mem;
        assert_int_equal(pf_simkv_create(G->offset + size, 0, &mem), 0);
        uint8_t *base = (uint8_t *)pf_simkv_ptr(mem) + G->offset;
        pft_fill(pf_simkv_ptr(mem), G->offset + size, seed, gi);
        struct pf_engine_layer l = {.name = "L",
                                    .num_blocks = G->nb,
                                    .bytes_per_block = G->bpb,
                                    .kv_stride_bytes = kv,
                                    .segments = G->split ? 2 : 1};
        l.ipc.kind = PF_IPC_SIM_SHM;
        l.ipc.offset = G->offset;
        l.ipc.size = size;
        snprintf(l.ipc.shm_name, sizeof(l.ipc.shm_name), "%s", pf_simkv_name(mem));
        char inst[32], ns[32];
        snprintf(inst, sizeof(inst), "i%zu", gi);
        snprintf(ns, sizeof(ns), "ns-%s-%zu", backend, gi);
        struct pf_engine_register r = {.instance_id = inst,
                                       .namespace_ = ns,
                                       .client_version = PF_VERSION,
                                       .tp_size = 1,
                                       .world_size = 1,
                                       .layers = &l,
                                       .nlayers = 1};
        if (pf_engine_register(e, &r, err, sizeof(err)) != 0)
            fail_msg("register %zu: %s", gi, err);
        /* every block, in reverse order (descriptors not adjacent) */
        uint32_t ids[16];
        uint8_t hb[16][16];
        struct pf_bytes hs[16];
        for (uint32_t j = 0; j < G->nb; j++) {
            ids[j] = G->nb - 1 - j;
            memset(hb[j], 0, sizeof(hb[j]));
            snprintf((char *)hb[j], sizeof(hb[j]), "b%u", ids[j]);
            hs[j] = (struct pf_bytes){hb[j], sizeof(hb[j])};
        }
        struct pf_engine_save_layer sl = {
            .name = "L", .block_ids = ids, .nids = G->nb, .hashes = hs, .nhashes = G->nb};
        if (pf_engine_save(e, inst, 0, 0, 0, &sl, 1, err, sizeof(err)) != 0)
            fail_msg("save %zu: %s", gi, err);
        assert_int_equal(pf_engine_flush(e, 10000), 0);
        uint32_t nsid;
        assert_int_equal(pf_ns_lookup(ns, &nsid), 0);
        for (uint32_t j = 0; j < G->nb; j++) {
            struct pf_block_key k;
            struct pf_block *b;
            pf_key_make(nsid, hb[j], sizeof(hb[j]), &k);
            assert_int_equal(pf_cache_prefix(pf_engine_cache(e), &k, 1, &b), 1);
            struct pf_slot s;
            pf_block_slot(b, 0, &s);
            const uint8_t *K = base + (uint64_t)ids[j] * G->bpb;
            const uint8_t *V = G->split ? base + kv + (uint64_t)ids[j] * G->bpb : NULL;
            assert_int_equal(s.nseg, G->split ? 2 : 1);
            assert_int_equal(s.seg_len, G->bpb);
            assert_memory_equal(s.k, K, G->bpb);
            if (V)
                assert_memory_equal(s.v, V, G->bpb);
            assert_true(s.has_checksum);
            uint64_t want = ref_hash(K, G->bpb, V, V ? G->bpb : 0);
            if (s.checksum != want)
                fail_msg("%s: geometry %zu block %u: stored checksum %llx, reference %llx", backend,
                         gi, ids[j], (unsigned long long)s.checksum, (unsigned long long)want);
            pf_block_put(b);
        }
        assert_int_equal(pf_engine_unregister(e, inst, err, sizeof(err)), 0);
        pf_simkv_destroy(mem);
    }
    pf_engine_destroy(e);
    pf_gpu_close(g);
}

static void test_fused(void **st)
{
    run("sim");
}

static void test_fallback(void **st)
{
    run("faulty:sim");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused),
        cmocka_unit_test(test_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* bench/query_cpu: server-side CPU cost of one QueryPrefetch of 1 and 4096 hashes with 10^6
 * resident blocks, split into request decoding (the server's zero-copy wire reader) and the
 * engine's work (key hashing, lookup, lease, reuse estimator), and within that the RAM
 * cache's prefix lookup alone (keys already hashed, lines warm from the engine's pass: a lower
 * bound), once taking references (pf_cache_prefix) and once pinning (pf_cache_prefix_pin, the
 * query's path), in the same iterations. Means and per-iteration medians (a loaded VM's
 * preemptions move the means). In-process: no network, no scheduler wake-ups. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/pegaflow.h"
#include "engine.pb-c.h"
#include "pf/block.h"
#include "pf/cache.h"
#include "pf/engine.h"
#include "pf/hal.h"
#include "pf/pool.h"
#include "rpc/wire.h"
#include "benchutil.h"

/* Resident blocks need an allocation: one static stand-in whose count never drops to 0. */
static uint8_t fake_mem[64];
static struct pf_alloc fake = {.ptr = fake_mem, .size = sizeof(fake_mem), .refs = 1u << 30};

#define USAGE                                                                                      \
    "query_cpu [--blocks N (>= 8192, default 1000000)] [--iters N (4096-hash queries, default "    \
    "300)] [--json FILE]"

static int usage(void)
{
    fprintf(stderr, "usage: %s\n", USAGE);
    return 2;
}

int main(int argc, char **argv)
{
    long nb = 1000000;
    int iters4096 = 300;
    const char *json = NULL;
    const struct bu_opt opts[] = {{"--blocks", BU_LONG, &nb},
                                  {"--iters", BU_INT, &iters4096},
                                  {"--json", BU_STR, &json},
                                  {NULL, 0, NULL}};
    bu_parse_opts(argc, argv, opts, USAGE);
    size_t n = nb < 0 ? 0 : (size_t)nb;
    if (n < 8192 || iters4096 < 1)
        return usage();
    double dec_us[2] = {0, 0}, eng_us[2] = {0, 0}, cache_us[2] = {0, 0};
    double eng_p50[2] = {0, 0}, cache_p50[2] = {0, 0}, pin_p50[2] = {0, 0};
    char chosen[32], err[256];
    struct pf_gpu *g;
    struct pf_gpu_config gc = {.sim_default_devices = 1};
    pf_hal_init();
    if (pf_hal_gpu_open("sim", &gc, &g, chosen, sizeof(chosen), err, sizeof(err)))
        return 1;
    struct pf_engine_config ec = {.gpu = g, .pool_size = 64 << 20, .skip_memcheck = true};
    struct pf_engine *e;
    if (pf_engine_create(&ec, &e, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct pf_simkv *kv;
    pf_simkv_create(1 << 20, 0, &kv);
    struct pf_engine_layer l = {
        .name = "ALL_LAYERS", .num_blocks = 256, .bytes_per_block = 4096, .segments = 1};
    l.ipc.kind = PF_IPC_SIM_SHM;
    l.ipc.size = 1 << 20;
    snprintf(l.ipc.shm_name, sizeof(l.ipc.shm_name), "%s", pf_simkv_name(kv));
    struct pf_engine_register r = {.instance_id = "q",
                                   .namespace_ = "nsq",
                                   .client_version = PF_VERSION,
                                   .tp_size = 1,
                                   .world_size = 1,
                                   .layers = &l,
                                   .nlayers = 1};
    if (pf_engine_register(e, &r, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint32_t ns;
    pf_ns_lookup("nsq", &ns);
    uint8_t(*hs)[32] = malloc(n * 32);
    struct pf_block_key *keys = malloc(n * sizeof(*keys));
    struct pf_block **hit = malloc(4096 * sizeof(*hit));
    for (size_t i = 0; i < n; i++) {
        for (int j = 0; j < 32; j++)
            hs[i][j] = (uint8_t)(i * 131 + (size_t)j * 7 + (i >> 8));
        memcpy(hs[i], &i, sizeof(i));
        pf_key_make(ns, hs[i], 32, &keys[i]);
        pf_alloc_get(&fake);
        struct pf_slot s = {.k = fake_mem, .ka = &fake, .seg_len = 64, .seg_stride = 64, .nseg = 1};
        struct pf_block *b;
        if (pf_block_pack(NULL, &keys[i], 1, &s, &b) != 0)
            abort();
        pf_cache_insert(pf_engine_cache(e), b, PF_CLASS_RETAINED);
        pf_block_put(b);
    }
    const size_t qn[2] = {1, 4096};
    for (int qi = 0; qi < 2; qi++) {
        int iters = qi ? iters4096 : 20000;
        double t_dec = 0, t_eng = 0, t_cache = 0;
        /* per-iteration times: the medians are what a loaded VM still measures (a mean takes
         * every preemption in) */
        double *v_eng = malloc((size_t)iters * sizeof(*v_eng));
        double *v_cache = malloc((size_t)iters * sizeof(*v_cache));
        double *v_pin = malloc((size_t)iters * sizeof(*v_pin));
        double *v_unpin = malloc((size_t)iters * sizeof(*v_unpin));
        if (!v_eng || !v_cache || !v_pin || !v_unpin)
            return 1;
        ProtobufCBinaryData *bd = malloc(qn[qi] * sizeof(*bd));
        struct pf_bytes *pb = malloc(qn[qi] * sizeof(*pb));
        for (int it = 0; it < iters; it++) {
            size_t first = ((size_t)it * 7919) % (n - qn[qi]);
            Pegaflow__QueryRequest q = PEGAFLOW__QUERY_REQUEST__INIT;
            q.instance_id = "q";
            q.req_id = "r";
            q.n_block_hashes = qn[qi];
            for (size_t i = 0; i < qn[qi]; i++)
                bd[i] = (ProtobufCBinaryData){32, hs[first + i]};
            q.block_hashes = bd;
            size_t len = protobuf_c_message_get_packed_size(&q.base);
            uint8_t *buf = malloc(len);
            protobuf_c_message_pack(&q.base, buf);
            /* decoded as the server does: the wire reader, hashes pointing into the buffer */
            double t0 = bu_now();
            struct pf_wire w = {buf, buf + len};
            struct pf_wire_field f = {0};
            size_t k = 0;
            while (pf_wire_next(&w, &f) == 1)
                if (f.number == 2 && k < qn[qi])
                    pb[k++] = (struct pf_bytes){f.data, f.len};
            double t1 = bu_now();
            struct pf_engine_query eq = {
                .instance_id = "q", .req_id = "r", .hashes = pb, .n = qn[qi]};
            struct pf_engine_query_result res;
            pf_engine_query(e, &eq, &res, err, sizeof(err));
            double t2 = bu_now();
            struct pf_bytes lease = {res.lease, 16};
            pf_engine_release(e, &lease, err, sizeof(err));
            free(buf);
            if (res.num_hit_blocks != qn[qi]) {
                fprintf(stderr, "query of %zu resident hashes answered %u hits\n", qn[qi],
                        res.num_hit_blocks);
                return 1;
            }
            t_dec += t1 - t0;
            t_eng += t2 - t1;
            v_eng[it] = t2 - t1;
            /* the RAM cache's part alone: prefix lookup of the same keys (already hashed) */
            double t3 = bu_now();
            size_t got = pf_cache_prefix(pf_engine_cache(e), keys + first, qn[qi], hit);
            double t4 = bu_now();
            t_cache += t4 - t3;
            v_cache[it] = t4 - t3;
            for (size_t i = 0; i < got; i++)
                pf_block_put(hit[i]);
            /* the same lookup pinning instead of referencing (what the engine's query does),
             * unpin included as the puts above are */
            double t5 = bu_now();
            got = pf_cache_prefix_pin(pf_engine_cache(e), keys + first, qn[qi], hit);
            double t6 = bu_now();
            pf_cache_unpin(pf_engine_cache(e), hit, got);
            v_pin[it] = t6 - t5;
            v_unpin[it] = bu_now() - t6;
        }
        printf("%4zu hashes: request decode %.1f us, engine query %.1f us (%.0f ns/hash), of "
               "which cache prefix lookup %.1f us (%.0f ns/key)\n",
               qn[qi], t_dec / iters * 1e6, t_eng / iters * 1e6,
               t_eng / iters * 1e9 / (double)qn[qi], t_cache / iters * 1e6,
               t_cache / iters * 1e9 / (double)qn[qi]);
        eng_p50[qi] = bu_median(v_eng, iters) * 1e6;
        cache_p50[qi] = bu_median(v_cache, iters) * 1e6;
        printf("%4zu hashes: medians: engine query %.1f us (%.1f ns/hash), cache prefix lookup "
               "%.1f us (%.1f ns/key)\n",
               qn[qi], eng_p50[qi], eng_p50[qi] * 1e3 / (double)qn[qi], cache_p50[qi],
               cache_p50[qi] * 1e3 / (double)qn[qi]);
        pin_p50[qi] = bu_median(v_pin, iters) * 1e6;
        printf("%4zu hashes: medians: cache prefix lookup pinning %.1f us (%.1f ns/key), unpin "
               "%.1f us\n",
               qn[qi], pin_p50[qi], pin_p50[qi] * 1e3 / (double)qn[qi],
               bu_median(v_unpin, iters) * 1e6);
        free(v_eng);
        free(v_cache);
        free(v_pin);
        free(v_unpin);
        dec_us[qi] = t_dec / iters * 1e6;
        eng_us[qi] = t_eng / iters * 1e6;
        cache_us[qi] = t_cache / iters * 1e6;
        free(bd);
        free(pb);
    }
    if (json) {
        cJSON *root = bu_json_obj(NULL, NULL);
        bu_json_str(root, "bench", "query_cpu");
        bu_json_num(root, "resident", (double)n);
        bu_json_num(root, "decode_us_1", dec_us[0]);
        bu_json_num(root, "engine_us_1", eng_us[0]);
        bu_json_num(root, "cache_us_1", cache_us[0]);
        bu_json_num(root, "decode_us_4096", dec_us[1]);
        bu_json_num(root, "engine_us_4096", eng_us[1]);
        bu_json_num(root, "cache_us_4096", cache_us[1]);
        bu_json_num(root, "engine_p50_us_1", eng_p50[0]);
        bu_json_num(root, "engine_p50_us_4096", eng_p50[1]);
        bu_json_num(root, "cache_p50_us_4096", cache_p50[1]);
        bu_json_num(root, "cache_pin_p50_us_4096", pin_p50[1]);
        bu_json_write(root, json);
    }
    free(keys);
    free(hit);
    free(hs);
    pf_engine_destroy(e);
    pf_gpu_close(g);
    pf_simkv_destroy(kv);
    return 0;
}

/* gpu_kv_check: end-to-end save/load through a running pegaflow-server on a real GPU.
 *
 * This process plays a vLLM worker: it allocates KV caches with cudaMalloc, exports each
 * layer as an IpcTensor (cudaIpcMemHandle + device UUID, pf_client_ipc_cuda), registers
 * them with the server (started by tests/gpu/run.sh with --gpu-backend cuda), fills them
 * with seeded random bytes, saves every block, queries until every hash is resident,
 * zeroes the caches, loads the blocks back into a permutation of the block ids and
 * compares every byte. Four cases: split K/V and contiguous layouts, each in
 * TRANSFER_MODE_DIRECT and TRANSFER_MODE_KERNEL. Split layers are separate allocations;
 * contiguous layers are views of one allocation (the server shares one opened handle).
 * Save and load throughput is printed next to cudaMemcpy of the same bytes with pinned
 * memory.
 *
 * Usage: gpu_kv_check --server HOST:PORT [--device N] [--layers L] [--blocks N]
 *                     [--block-kib K] [--seed S]
 * Exits 0 when every case is byte-exact, 1 otherwise, 77 without a usable GPU. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/pegaflow.h"

#include "gpu_common.h"

#define HASH_LEN   32
#define RPC_MS     60000
#define LOAD_MS    120000
#define MAX_LAYERS 64

struct opts {
    const char *server;
    int device;
    unsigned layers;
    unsigned blocks;      /* per layer, block 0 (vLLM's null block) is never saved */
    uint64_t block_bytes; /* bytes of one K (or V) segment */
    uint64_t seed;
};

struct kvcase {
    const char *name;
    bool split;
    int mode; /* 0 direct, 1 kernel */
};

struct layer {
    char name[32];
    uint8_t *dev;   /* the layer's tensor storage (inside alloc) */
    uint64_t bytes; /* of the tensor */
    uint8_t ipc[256];
    size_t ipc_len;
};

struct result {
    uint64_t bytes;
    double save_s, load_s;
    bool exact;
};

static void die_rpc(const char *what, int rc)
{
    printf("FAIL: %s: %s (gRPC status %d: %s)\n", what, strerror(-rc), pf_last_error_code(),
           pf_last_error_message());
    exit(1);
}

/* Where block b of layer l's K (seg 0) or V (seg 1) lives, as an offset in the tensor. */
static uint64_t seg_off(const struct opts *o, bool split, unsigned b, int seg)
{
    if (split)
        return (uint64_t)seg * o->blocks * o->block_bytes + (uint64_t)b * o->block_bytes;
    return (uint64_t)b * 2 * o->block_bytes + (uint64_t)seg * o->block_bytes;
}

static void make_hash(uint8_t *h, uint64_t seed, unsigned casei, unsigned b)
{
    for (int i = 0; i < HASH_LEN; i += 8) {
        uint64_t v = gc_splitmix(seed ^ gc_splitmix(((uint64_t)casei << 32) | b) ^ (uint64_t)i);
        memcpy(h + i, &v, 8);
    }
}

static struct result run_case(struct pf_client *cl, const struct opts *o, unsigned casei,
                              const struct kvcase *kc, const uint8_t uuid[16])
{
    struct result res = {0};
    const unsigned L = o->layers, N = o->blocks, nsave = N - 1;
    const uint64_t tensor = (uint64_t)N * 2 * o->block_bytes;
    struct layer layers[MAX_LAYERS];
    uint8_t *shared = NULL;
    if (!kc->split)
        GC_CUDA(cudaMalloc((void **)&shared, tensor * L));
    for (unsigned l = 0; l < L; l++) {
        struct layer *ly = &layers[l];
        snprintf(ly->name, sizeof(ly->name), "model.layers.%02u.attn", l);
        ly->bytes = tensor;
        uint64_t off = 0;
        cudaIpcMemHandle_t h;
        if (kc->split) {
            GC_CUDA(cudaMalloc((void **)&ly->dev, tensor));
            GC_CUDA(cudaIpcGetMemHandle(&h, ly->dev));
        } else {
            off = (uint64_t)l * tensor;
            ly->dev = shared + off;
            GC_CUDA(cudaIpcGetMemHandle(&h, shared));
        }
        int rc = pf_client_ipc_cuda(uuid, (const uint8_t *)&h, off, tensor, ly->ipc,
                                    sizeof(ly->ipc), &ly->ipc_len);
        if (rc)
            die_rpc("pf_client_ipc_cuda", rc);
    }

    /* seeded contents: layer l's whole tensor is stream (case, l) */
    uint8_t *orig = malloc(tensor * L), *back = malloc(tensor);
    if (!orig || !back) {
        printf("FAIL: out of host memory\n");
        exit(1);
    }
    for (unsigned l = 0; l < L; l++) {
        gc_fill(orig + l * tensor, tensor, o->seed, ((uint64_t)casei << 16) | l);
        GC_CUDA(cudaMemcpy(layers[l].dev, orig + l * tensor, tensor, cudaMemcpyHostToDevice));
    }

    char inst[96], ns[64];
    snprintf(inst, sizeof(inst), "gpu-check-%s-%d", kc->name, (int)getpid());
    snprintf(ns, sizeof(ns), "gpu-check-%d-%u", (int)getpid(), casei);
    struct pf_layer_desc ld[MAX_LAYERS];
    for (unsigned l = 0; l < L; l++)
        ld[l] = (struct pf_layer_desc){
            .name = layers[l].name,
            .ipc = layers[l].ipc,
            .ipc_len = layers[l].ipc_len,
            .num_blocks = N,
            .bytes_per_block = kc->split ? o->block_bytes : 2 * o->block_bytes,
            .kv_stride_bytes = kc->split ? (uint64_t)N * o->block_bytes : 0,
            .segments = kc->split ? 2 : 1,
        };
    struct pf_register_args ra = {
        .instance_id = inst,
        .namespace_ = ns,
        .tp_rank = 0,
        .tp_size = 1,
        .world_size = 1,
        .device_id = o->device,
        .transfer_mode = kc->mode,
        .layers = ld,
        .nlayers = L,
    };
    int rc = pf_client_register(cl, &ra, RPC_MS);
    if (rc)
        die_rpc("RegisterContextBatch", rc);

    /* save blocks 1..N-1 of every layer; logical block i is block id i+1 */
    uint32_t *ids = calloc(nsave, sizeof(*ids));
    uint8_t *hashes = calloc(nsave, HASH_LEN);
    if (!ids || !hashes)
        exit(1);
    for (unsigned i = 0; i < nsave; i++) {
        ids[i] = i + 1;
        make_hash(hashes + (size_t)i * HASH_LEN, o->seed, casei, i);
    }
    struct pf_save_layer sl[MAX_LAYERS];
    for (unsigned l = 0; l < L; l++)
        sl[l] = (struct pf_save_layer){.name = layers[l].name,
                                       .block_ids = ids,
                                       .hashes = hashes,
                                       .hash_len = HASH_LEN,
                                       .n = nsave};
    res.bytes = (uint64_t)nsave * L * 2 * o->block_bytes;
    double t0 = gc_now();
    rc = pf_client_save(cl, inst, 0, 0, o->device, sl, L, RPC_MS);
    res.save_s = gc_now() - t0;
    if (rc)
        die_rpc("Save", rc);

    /* sealing is asynchronous: ask until every hash is resident */
    struct pf_query_result q = {0};
    double dl = gc_now() + 30;
    for (;;) {
        rc = pf_client_query(cl, inst, "gpu-check-req", hashes, NULL, HASH_LEN, nsave, 0, 0, &q,
                             NULL, 0, RPC_MS);
        if (rc)
            die_rpc("QueryPrefetch", rc);
        if (!q.loading && q.num_hit_blocks == nsave)
            break;
        if (q.lease_len)
            pf_client_release(cl, q.lease, q.lease_len, RPC_MS);
        if (gc_now() > dl) {
            printf("FAIL: %s: only %u of %u blocks resident after 30 s\n", kc->name,
                   q.num_hit_blocks, nsave);
            exit(1);
        }
        usleep(10000);
    }

    for (unsigned l = 0; l < L; l++)
        GC_CUDA(cudaMemset(layers[l].dev, 0, tensor));
    GC_CUDA(cudaDeviceSynchronize());

    /* load logical block i into block id nsave - i (reversed) */
    int64_t *targets = calloc(nsave, sizeof(*targets));
    if (!targets)
        exit(1);
    for (unsigned i = 0; i < nsave; i++)
        targets[i] = (int64_t)(nsave - i);
    const char *names[MAX_LAYERS];
    for (unsigned l = 0; l < L; l++)
        names[l] = layers[l].name;
    size_t group_sizes[1] = {L};
    size_t group_counts[1] = {nsave};
    struct pf_load_item item = {
        .lease = q.lease,
        .lease_len = q.lease_len,
        .targets = targets,
        .group_counts = group_counts,
    };
    struct pf_loadstate *ls = NULL;
    rc = pf_loadstate_create(&ls);
    if (rc)
        die_rpc("pf_loadstate_create", rc);
    t0 = gc_now();
    rc = pf_client_load(cl, inst, 0, o->device, pf_loadstate_name(ls), names, group_sizes, 1, &item,
                        1, RPC_MS);
    if (rc)
        die_rpc("Load", rc);
    int64_t state = pf_loadstate_wait(ls, LOAD_MS);
    res.load_s = gc_now() - t0;
    pf_loadstate_destroy(ls);
    if (state != 1) {
        printf("FAIL: %s: load state %lld (want 1)\n", kc->name, (long long)state);
        exit(1);
    }

    /* compare every byte: target block t = nsave - i holds logical block i (block id
     * i + 1) of the original; block 0 stays zero */
    res.exact = true;
    size_t bad = 0;
    for (unsigned l = 0; l < L; l++) {
        GC_CUDA(cudaMemcpy(back, layers[l].dev, tensor, cudaMemcpyDeviceToHost));
        const uint8_t *src = orig + l * tensor;
        for (int seg = 0; seg < 2; seg++) {
            uint64_t z = seg_off(o, kc->split, 0, seg);
            for (uint64_t k = 0; k < o->block_bytes; k++) {
                if (back[z + k]) {
                    if (bad++ < 5)
                        printf("FAIL: %s: layer %u block 0 (never saved) was written\n", kc->name,
                               l);
                    break;
                }
            }
            for (unsigned i = 0; i < nsave; i++) {
                uint64_t got = seg_off(o, kc->split, (unsigned)targets[i], seg);
                uint64_t want = seg_off(o, kc->split, ids[i], seg);
                if (memcmp(back + got, src + want, o->block_bytes) != 0 && bad++ < 5)
                    printf("FAIL: %s: layer %u %s of block %u loaded into %lld differs\n", kc->name,
                           l, seg ? "V" : "K", ids[i], (long long)targets[i]);
            }
        }
    }
    if (bad) {
        res.exact = false;
        printf("FAIL: %s: %zu mismatching segments\n", kc->name, bad);
    }

    rc = pf_client_unregister(cl, inst, RPC_MS);
    if (rc)
        die_rpc("UnregisterContext", rc);
    free(targets);
    free(ids);
    free(hashes);
    free(orig);
    free(back);
    if (kc->split)
        for (unsigned l = 0; l < L; l++)
            GC_CUDA(cudaFree(layers[l].dev));
    else
        GC_CUDA(cudaFree(shared));
    return res;
}

static void usage(void)
{
    fprintf(stderr, "usage: gpu_kv_check --server HOST:PORT [--device N] [--layers L] "
                    "[--blocks N] [--block-kib K] [--seed S]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct opts o = {.layers = 8, .blocks = 257, .block_bytes = 64 * 1024};
    o.seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (strcmp(a, "--server") == 0)
            o.server = v;
        else if (strcmp(a, "--device") == 0)
            o.device = atoi(v);
        else if (strcmp(a, "--layers") == 0)
            o.layers = (unsigned)atoi(v);
        else if (strcmp(a, "--blocks") == 0)
            o.blocks = (unsigned)atoi(v);
        else if (strcmp(a, "--block-kib") == 0)
            o.block_bytes = strtoull(v, NULL, 0) * 1024;
        else if (strcmp(a, "--seed") == 0)
            o.seed = strtoull(v, NULL, 0);
        else
            usage();
        i++;
    }
    if (!o.server || o.layers < 1 || o.layers > MAX_LAYERS || o.blocks < 2 || !o.block_bytes)
        usage();

    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIP: no usable CUDA GPU (cudaGetDeviceCount: %s)\n",
               e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
        return 77;
    }
    GC_CUDA(cudaSetDevice(o.device));
    struct cudaDeviceProp p;
    GC_CUDA(cudaGetDeviceProperties(&p, o.device));
    uint8_t uuid[16];
    memcpy(uuid, p.uuid.bytes, 16);
    char us[48];
    gc_uuid_str(uuid, us, sizeof(us));
    printf("gpu_kv_check: seed %llu, device %d (%s, %s), %u layers x %u blocks x 2 x %llu KiB\n",
           (unsigned long long)o.seed, o.device, p.name, us, o.layers, o.blocks,
           (unsigned long long)(o.block_bytes >> 10));

    struct pf_client *cl = NULL;
    int rc = pf_client_connect(o.server, &cl);
    if (rc == 0)
        rc = pf_client_health(cl, RPC_MS);
    if (rc)
        die_rpc("connect/Health", rc);

    static const struct kvcase cases[] = {
        {"split-direct", true, 0},
        {"split-kernel", true, 1},
        {"contiguous-direct", false, 0},
        {"contiguous-kernel", false, 1},
    };
    struct result r[4];
    uint64_t bytes = 0;
    for (unsigned i = 0; i < 4; i++) {
        r[i] = run_case(cl, &o, i, &cases[i], uuid);
        bytes = r[i].bytes;
        printf("%-18s %s\n", cases[i].name, r[i].exact ? "byte-exact" : "MISMATCH");
        fflush(stdout);
    }
    double base_d2h, base_h2d;
    gc_memcpy_baseline(bytes, 3, &base_d2h, &base_h2d);

    printf("\n%-20s %10s %12s %12s %9s %9s\n", "case", "MiB", "save D2H", "load H2D", "save/cpy",
           "load/cpy");
    printf("%-20s %10.1f %7.2f GB/s %7.2f GB/s %9s %9s\n", "cudaMemcpy pinned",
           (double)bytes / (1 << 20), base_d2h, base_h2d, "1.00", "1.00");
    bool ok = true;
    for (unsigned i = 0; i < 4; i++) {
        double s = gc_gbps(r[i].bytes, r[i].save_s), l = gc_gbps(r[i].bytes, r[i].load_s);
        printf("%-20s %10.1f %7.2f GB/s %7.2f GB/s %9.2f %9.2f\n", cases[i].name,
               (double)r[i].bytes / (1 << 20), s, l, base_d2h > 0 ? s / base_d2h : 0,
               base_h2d > 0 ? l / base_h2d : 0);
        ok = ok && r[i].exact;
    }
    printf("(save = Save RPC latency incl. the D2H copy; load = Load RPC until the load state "
           "reads 1)\n");
    pf_client_close(cl);
    printf("gpu_kv_check: %s (seed %llu)\n", ok ? "PASS" : "FAIL", (unsigned long long)o.seed);
    return ok ? 0 : 1;
}

/* Sim GPU contract: cross-process IPC open, async copies and stream ordering, bounds and
 * registration checks (-EFAULT, nothing written), descriptor validation, mappings kept alive
 * by in-flight copies, the faulty: decorator's GPU faults, and copy_batch_hash: the fused
 * copy + xxh3 gives the bytes of a plain copy and, per hash run, the checksum an independent
 * implementation computes, at many sizes and offsets, and fails like copy_batch. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/pegaflow.h"
#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/util.h"
#include "pftest.h"

#define SZ (1u << 20)

static struct pf_gpu *open_sim(const char *name, struct pf_fault_plan *p, uint64_t bw)
{
    struct pf_gpu *g;
    char chosen[64], err[256];
    int devs[2] = {0, 3};
    struct pf_gpu_config cfg = {.devices = devs, .ndevices = 2, .faults = p, .sim_bandwidth = bw};
    pf_hal_init();
    assert_int_equal(pf_hal_gpu_open(name, &cfg, &g, chosen, sizeof(chosen), err, sizeof(err)), 0);
    return g;
}

static void pattern(uint8_t *p, size_t n, uint8_t salt)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + salt + (i >> 9));
}

static void test_devices(void **st)
{
    struct pf_gpu *g = open_sim("sim", NULL, 0);
    assert_int_equal(pf_gpu_device_count(g), 2);
    struct pf_gpu_dev_info info;
    assert_int_equal(pf_gpu_device_info(g, 1, &info), 0);
    assert_int_equal(info.index, 3);
    assert_true(info.numa_node >= 0);
    assert_int_equal(pf_gpu_device_info(g, 2, &info), -ENODEV);
    pf_gpu_close(g);
}

/* A child process owns the "GPU memory"; the parent (the server role) maps it. */
static void test_cross_process(void **st)
{
    int to_parent[2], to_child[2];
    assert_int_equal(pipe(to_parent), 0);
    assert_int_equal(pipe(to_child), 0);
    pid_t pid = fork();
    if (pid == 0) {
        struct pf_simkv *kv;
        if (pf_simkv_create(SZ, 3, &kv))
            _exit(2);
        pattern(pf_simkv_ptr(kv), SZ, 7);
        char name[128];
        snprintf(name, sizeof(name), "%s", pf_simkv_name(kv));
        if (write(to_parent[1], name, sizeof(name)) != sizeof(name))
            _exit(3);
        char go;
        if (read(to_child[0], &go, 1) != 1)
            _exit(4);
        /* the parent wrote bytes [4096, 8192) with salt 99 */
        uint8_t want[4096];
        pattern(want, sizeof(want), 99);
        int ok = memcmp((uint8_t *)pf_simkv_ptr(kv) + 4096, want, sizeof(want)) == 0;
        pf_simkv_destroy(kv);
        _exit(ok ? 0 : 5);
    }
    char name[128];
    assert_int_equal(read(to_parent[0], name, sizeof(name)), sizeof(name));
    struct pf_gpu *g = open_sim("sim", NULL, 0);
    struct pf_ipc_desc d = {.kind = PF_IPC_SIM_SHM, .offset = 0, .size = SZ, .sim_device = 3};
    snprintf(d.shm_name, sizeof(d.shm_name), "%s", name);
    struct pf_gpu_mapping *m;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), 0);
    assert_int_equal(m->device, 1);
    assert_true(m->base >> 63); /* never a dereferenceable user-space address */
    uint8_t *host = aligned_alloc(4096, SZ);
    struct pf_gpu_host_reg *r;
    assert_int_equal(pf_gpu_host_register(g, host, SZ, &r), 0);
    struct pf_gpu_stream *s;
    assert_int_equal(pf_gpu_stream_create(g, 1, &s), 0);
    struct pf_copy_desc c = {.dev = m->base, .host = host, .len = SZ};
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 10000), 0);
    uint8_t *want = malloc(SZ);
    pattern(want, SZ, 7);
    assert_memory_equal(host, want, SZ);
    pattern(host, 4096, 99);
    c = (struct pf_copy_desc){.dev = m->base + 4096, .host = host, .len = 4096};
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_H2D, PF_COPY_MODE_KERNEL, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 10000), 0);
    assert_int_equal(write(to_child[1], "g", 1), 1);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    pf_gpu_stream_destroy(s);
    pf_gpu_ipc_close(m);
    pf_gpu_host_unregister(r);
    pf_gpu_close(g);
    free(host);
    free(want);
}

struct fixture {
    struct pf_gpu *g;
    struct pf_simkv *kv;
    struct pf_gpu_mapping *m;
    uint8_t *host;
    struct pf_gpu_host_reg *r;
    struct pf_gpu_stream *s;
};

static void fx_open(struct fixture *f, const char *backend, struct pf_fault_plan *p, uint64_t off,
                    uint64_t size)
{
    f->g = open_sim(backend, p, 0);
    assert_int_equal(pf_simkv_create(SZ, 0, &f->kv), 0);
    struct pf_ipc_desc d = {.kind = PF_IPC_SIM_SHM, .offset = off, .size = size, .sim_device = 0};
    snprintf(d.shm_name, sizeof(d.shm_name), "%s", pf_simkv_name(f->kv));
    assert_int_equal(pf_gpu_ipc_open(f->g, &d, &f->m), 0);
    f->host = aligned_alloc(4096, SZ);
    memset(f->host, 0, SZ);
    assert_int_equal(pf_gpu_host_register(f->g, f->host, SZ, &f->r), 0);
    assert_int_equal(pf_gpu_stream_create(f->g, 0, &f->s), 0);
}

static void fx_close(struct fixture *f)
{
    pf_gpu_stream_destroy(f->s);
    pf_gpu_ipc_close(f->m);
    pf_gpu_host_unregister(f->r);
    pf_gpu_close(f->g);
    pf_simkv_destroy(f->kv);
    free(f->host);
}

static void test_bounds(void **st)
{
    struct fixture f;
    fx_open(&f, "sim", NULL, 4096, 65536); /* the tensor is a window of the object */
    uint8_t *dev = pf_simkv_ptr(f.kv);
    pattern(dev, SZ, 3);
    uint8_t before[SZ / 4];
    memcpy(before, f.host, sizeof(before));
    struct pf_copy_desc bad[] = {
        {.dev = f.m->base + 65536 - 8, .host = f.host, .len = 16}, /* crosses the end */
        {.dev = f.m->base - 1, .host = f.host, .len = 1},          /* before the start */
        {.dev = 0x1000, .host = f.host, .len = 1},                 /* not a device address */
        {.dev = f.m->base, .host = before, .len = 16},             /* unregistered host */
        {.dev = f.m->base, .host = f.host + SZ - 8, .len = 16},    /* host range overflows */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &bad[i], 1), -EFAULT);
    /* a batch with one bad descriptor queues nothing */
    struct pf_copy_desc mix[2] = {{.dev = f.m->base, .host = f.host, .len = 128}, bad[0]};
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_H2D, 0, mix, 2), -EFAULT);
    assert_int_equal(pf_gpu_stream_sync(f.s, 1000), 0);
    uint8_t full[4096 + 128];
    pattern(full, sizeof(full), 3);
    assert_memory_equal(dev + 4096, full + 4096, 128); /* device untouched */
    assert_memory_equal(f.host, before, sizeof(before));
    /* the window's own range works and lands at the right offset */
    struct pf_copy_desc ok = {.dev = f.m->base + 65536 - 16, .host = f.host, .len = 16};
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &ok, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 1000), 0);
    assert_memory_equal(f.host, dev + 4096 + 65536 - 16, 16);
    fx_close(&f);
}

static void test_descriptor_errors(void **st)
{
    struct pf_gpu *g = open_sim("sim", NULL, 0);
    struct pf_simkv *kv;
    assert_int_equal(pf_simkv_create(8192, 0, &kv), 0);
    struct pf_ipc_desc d = {.kind = PF_IPC_CUDA, .size = 4096};
    struct pf_gpu_mapping *m;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    d.kind = PF_IPC_SIM_SHM;
    snprintf(d.shm_name, sizeof(d.shm_name), "%s", pf_simkv_name(kv));
    d.sim_device = 1; /* not opened (devices 0 and 3) */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -ENODEV);
    d.sim_device = 0;
    d.offset = 4096;
    d.size = 4097;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -ERANGE);
    snprintf(d.shm_name, sizeof(d.shm_name), "/pf_test_no_such_object");
    d.offset = 0;
    d.size = 16;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -ENOENT);
    snprintf(d.shm_name, sizeof(d.shm_name), "no-slash");
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    pf_simkv_destroy(kv);
    pf_gpu_close(g);
}

static void test_ordering_and_lifetime(void **st)
{
    struct fixture f;
    fx_open(&f, "sim", NULL, 0, SZ);
    /* H2D then D2H on one stream: the second sees the first's bytes */
    uint8_t *src = f.host, *dst = f.host + SZ / 2;
    for (int round = 0; round < 20; round++) {
        pattern(src, SZ / 4, (uint8_t)round);
        struct pf_copy_desc up = {.dev = f.m->base + 8192, .host = src, .len = SZ / 4};
        struct pf_copy_desc down = {.dev = f.m->base + 8192, .host = dst, .len = SZ / 4};
        assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_H2D, 0, &up, 1), 0);
        assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &down, 1), 0);
        assert_int_equal(pf_gpu_stream_sync(f.s, 10000), 0);
        assert_memory_equal(src, dst, SZ / 4);
    }
    /* closing a mapping with copies queued is safe: they hold the mapping */
    struct pf_copy_desc many[64];
    for (int i = 0; i < 64; i++)
        many[i] = (struct pf_copy_desc){.dev = f.m->base + (uint64_t)i * 4096,
                                        .host = f.host + (uint64_t)i * 4096,
                                        .len = 4096};
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, many, 64), 0);
    pf_gpu_ipc_close(f.m);
    assert_int_equal(pf_gpu_stream_sync(f.s, 10000), 0);
    assert_memory_equal(f.host, pf_simkv_ptr(f.kv), 64 * 4096);
    struct pf_copy_desc after = {.dev = many[0].dev, .host = f.host, .len = 16};
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &after, 1), -EFAULT);
    f.m = NULL;
    fx_close(&f);
}

/* Descriptors adjacent on both sides are copied as one; every other neighbour (adjacent on
 * one side only, backwards, overlapping on the device side) stays its own copy: the bytes
 * land exactly where each descriptor says. */
static void test_merged_descriptors(void **st)
{
    struct fixture f;
    fx_open(&f, "sim", NULL, 0, SZ);
    uint8_t *dev = pf_simkv_ptr(f.kv);
    pattern(dev, SZ, 11);
    memset(f.host, 0, SZ);
    const uint64_t B = 4096;
    struct pf_copy_desc d[] = {
        {.dev = f.m->base + 0 * B, .host = f.host + 0 * B, .len = B},
        {.dev = f.m->base + 1 * B, .host = f.host + 1 * B, .len = B}, /* both adjacent */
        {.dev = f.m->base + 2 * B, .host = f.host + 2 * B, .len = 100},
        {.dev = f.m->base + 2 * B + 100, .host = f.host + 5 * B, .len = B}, /* device only */
        {.dev = f.m->base + 9 * B, .host = f.host + 6 * B, .len = B},       /* host only */
        {.dev = f.m->base + 3 * B, .host = f.host + 7 * B, .len = B},       /* backwards */
        {.dev = f.m->base + 3 * B, .host = f.host + 8 * B, .len = B},       /* same source */
    };
    size_t n = sizeof(d) / sizeof(d[0]);
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, d, n), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 10000), 0);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(d[i].host, dev + (d[i].dev - f.m->base), d[i].len);
    assert_int_equal(f.host[2 * B + 100], 0); /* nothing between descriptors */
    /* and back: H2D of the same layout into a cleared device range */
    memset(dev, 0, 10 * B);
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_H2D, 0, d, 5), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 10000), 0);
    for (size_t i = 0; i < 5; i++)
        assert_memory_equal(dev + (d[i].dev - f.m->base), d[i].host, d[i].len);
    fx_close(&f);
}

static void test_bandwidth_cap_correct(void **st)
{
    struct pf_gpu *g = open_sim("sim", NULL, 1ull << 30);
    struct pf_simkv *kv;
    assert_int_equal(pf_simkv_create(SZ, 0, &kv), 0);
    pattern(pf_simkv_ptr(kv), SZ, 11);
    struct pf_ipc_desc d = {.kind = PF_IPC_SIM_SHM, .size = SZ};
    snprintf(d.shm_name, sizeof(d.shm_name), "%s", pf_simkv_name(kv));
    struct pf_gpu_mapping *m;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), 0);
    uint8_t *host = malloc(SZ);
    struct pf_gpu_host_reg *r;
    assert_int_equal(pf_gpu_host_register(g, host, SZ, &r), 0);
    struct pf_gpu_stream *s;
    assert_int_equal(pf_gpu_stream_create(g, 0, &s), 0);
    struct pf_copy_desc c = {.dev = m->base, .host = host, .len = SZ};
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, 0, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 10000), 0);
    assert_memory_equal(host, pf_simkv_ptr(kv), SZ);
    pf_gpu_stream_destroy(s);
    pf_gpu_ipc_close(m);
    pf_gpu_host_unregister(r);
    pf_gpu_close(g);
    pf_simkv_destroy(kv);
    free(host);
}

static void test_faults(void **st)
{
    struct pf_fault_plan *p;
    char err[200];
    assert_int_equal(pf_fault_plan_parse("seed=3;gpu.d2h:nth=1,times=1,corrupt=1;gpu.d2h:nth=2,"
                                         "times=1,error=EIO,at=complete;gpu.h2d:corrupt=1,"
                                         "times=1;gpu.h2d:nth=2,drop=1,times=1",
                                         &p, err, sizeof(err)),
                     0);
    struct fixture f;
    fx_open(&f, "sim", p, 0, SZ); /* the plan names gpu ops: faulty: is added */
    uint8_t *dev = pf_simkv_ptr(f.kv);
    pattern(dev, SZ, 21);
    struct pf_copy_desc c = {.dev = f.m->base, .host = f.host, .len = 4096};
    /* 1st D2H: corrupted */
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 5000), 0);
    assert_memory_not_equal(f.host, dev, 4096);
    /* 2nd D2H: fails at completion */
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 5000), -EIO);
    /* 3rd D2H: clean */
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 5000), 0);
    assert_memory_equal(f.host, dev, 4096);
    /* 1st H2D: the device receives corrupted bytes, the host source stays intact */
    pattern(f.host, 4096, 77);
    uint8_t keep[4096];
    memcpy(keep, f.host, sizeof(keep));
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_H2D, 0, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 5000), 0);
    assert_memory_equal(f.host, keep, 4096);
    assert_memory_not_equal(dev, keep, 4096);
    /* 2nd H2D: dropped, never completes */
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_H2D, 0, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 50), -ETIMEDOUT);
    assert_true(pf_fault_fired(p) >= 4);
    fx_close(&f);
    pf_fault_plan_free(p);

    assert_int_equal(pf_fault_plan_parse("gpu.h2d:fatal=1", &p, err, sizeof(err)), 0);
    fx_open(&f, "sim", p, 0, SZ);
    /* fatal: the device is lost (hal_gpu.h "Lost device"), health says so */
    char why[128];
    assert_int_equal(pf_gpu_health(f.g, why, sizeof(why)), 0);
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_H2D, 0, &c, 1), -ENOTRECOVERABLE);
    assert_int_equal(pf_gpu_copy_batch(f.s, PF_COPY_D2H, 0, &c, 1), -ENOTRECOVERABLE);
    assert_int_equal(pf_gpu_stream_sync(f.s, 50), -ENOTRECOVERABLE);
    assert_int_equal(pf_gpu_health(f.g, why, sizeof(why)), -ENOTRECOVERABLE);
    assert_non_null(strstr(why, "GPU context lost"));
    fx_close(&f);
    pf_fault_plan_free(p);
}

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

/* Runs of one descriptor (a one-segment slot) and of two (K then V) at sizes across the
 * 32 KiB hashing chunk, at unaligned device and host offsets, in one batch. */
static void test_copy_hash(void **st)
{
    struct fixture f;
    fx_open(&f, "sim", NULL, 0, SZ);
    uint8_t *dev = pf_simkv_ptr(f.kv);
    pft_fill(dev, SZ, pft_seed(), 5);
    static const uint64_t lens[] = {1,    63,    64,    65,    240,   241,
                                    4096, 32767, 32768, 32769, 65536, 100003};
    size_t nl = sizeof(lens) / sizeof(lens[0]);
    struct pf_copy_desc d[64];
    uint8_t join[64];
    uint64_t sums[64];
    size_t n = 0;
    uint64_t dofs = 3, hofs = 0;
    for (size_t i = 0; i < nl; i++) {
        for (int segs = 1; segs <= 2; segs++) {
            for (int s = 0; s < segs; s++) {
                uint64_t len = lens[(i + (size_t)s * 5) % nl];
                assert_true(dofs + len <= SZ && hofs + len <= SZ);
                d[n] = (struct pf_copy_desc){
                    .dev = f.m->base + dofs, .host = f.host + hofs, .len = len};
                join[n++] = s != 0;
                dofs = (dofs + len * 7 + 17) % (SZ - 110000); /* scattered, unaligned */
                hofs += len + 1 + (i & 7);
            }
        }
    }
    assert_true(hofs <= SZ);
    memset(sums, 0, sizeof(sums));
    assert_int_equal(pf_gpu_copy_batch_hash(f.s, PF_COPY_D2H, 0, d, n, join, sums), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 10000), 0);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *src = dev + (d[i].dev - f.m->base);
        assert_memory_equal(d[i].host, src, d[i].len);
        bool last = i + 1 == n || !join[i + 1];
        if (!last)
            continue;
        uint64_t want =
            join[i] ? ref_hash(dev + (d[i - 1].dev - f.m->base), d[i - 1].len, src, d[i].len)
                    : ref_hash(src, d[i].len, NULL, 0);
        if (sums[i] != want)
            fail_msg("run ending at descriptor %zu (%llu bytes): checksum %llx, want %llx", i,
                     (unsigned long long)d[i].len, (unsigned long long)sums[i],
                     (unsigned long long)want);
    }
    /* the same errors as copy_batch, nothing queued */
    struct pf_copy_desc bad = {.dev = f.m->base + SZ - 8, .host = f.host, .len = 16};
    assert_int_equal(pf_gpu_copy_batch_hash(f.s, PF_COPY_D2H, 0, &bad, 1, join, sums), -EFAULT);
    assert_int_equal(pf_gpu_copy_batch_hash(f.s, PF_COPY_H2D, 0, d, 1, join, sums), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch_hash(f.s, PF_COPY_D2H, 0, d, 1, NULL, sums), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch_hash(f.s, PF_COPY_D2H, 0, d, 0, NULL, NULL), 0);
    assert_int_equal(pf_gpu_stream_sync(f.s, 10000), 0);
    /* (a client that shrinks its memory mid-copy: tests/integration/hostile.c sigbus_save,
     * through the server, whose saves take this path; cmocka's own SIGBUS handler would
     * shadow the guard's here) */
    fx_close(&f);
    /* the faulty: decorator has no fused copy: callers fall back to copy_batch */
    struct pf_fault_plan *p;
    char err[200];
    assert_int_equal(pf_fault_plan_parse("gpu.d2h:nth=99,times=1,error=EIO", &p, err, sizeof(err)),
                     0);
    fx_open(&f, "sim", p, 0, SZ);
    assert_int_equal(pf_gpu_copy_batch_hash(f.s, PF_COPY_D2H, 0, &bad, 1, join, sums), -EOPNOTSUPP);
    fx_close(&f);
    pf_fault_plan_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_cross_process),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_descriptor_errors),
        cmocka_unit_test(test_ordering_and_lifetime),
        cmocka_unit_test(test_merged_descriptors),
        cmocka_unit_test(test_bandwidth_cap_correct),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_copy_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The CUDA GPU backend (hw/cuda) through the HAL: its operations.
 *
 * Real driver: without a usable GPU (no libcuda.so.1, or no device) opening "cuda" must
 * answer -ENODEV with a log line saying why, and "auto" must fall back to "sim". On a
 * machine with a GPU the same tests check that "cuda" opens and reports sane devices.
 *
 * Fake driver (fake_cuda.c, loaded by the backend exactly as it loads libcuda.so.1, see
 * cuda_test_util.h): discovery and --devices, UUID lookup, shared refcounted IPC
 * allocations, validation (-EFAULT before anything is enqueued), merging, both transfer
 * modes byte-exact with the fake's asynchronous streams, batched copies where the driver
 * has cuMemcpyBatchAsync, the kernel's pinned descriptor slots (no free on the copy path,
 * several batches in flight), event polling with -ETIMEDOUT, ordinary async errors, and
 * logging once per call site. Driver loading, "auto" failing loudly, sticky errors and
 * chunked pinning: test_cuda_open.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef PF_TEST_HAVE_CUDA
#include "cuda_test_util.h"

static int gpus_present(void)
{
    struct pf_gpu *g = NULL;
    int saved = atomic_load(&pf_log_level_cur);
    pf_log_set_level(PF_LOG_OFF);
    int rc = pf_hal_gpu_open("cuda", NULL, &g, NULL, 0, NULL, 0);
    pf_log_set_level((enum pf_log_level)saved);
    if (rc)
        return 0;
    int n = pf_gpu_device_count(g);
    pf_gpu_close(g);
    return n;
}

static void test_register(void **st)
{
    pf_hal_init();
    /* pf_hal_init registered the backend already: a second registration is refused */
    assert_int_equal(pf_cuda_register(), -EEXIST);
}

static void test_open_cuda(void **st)
{
    char log[4096];
    struct open_call c = {.name = "cuda"};
    capture_log(log, sizeof(log), do_open, &c);
    if (gpus_present() == 0) {
        assert_true(c.rc == -ENODEV || c.rc == -ENOTRECOVERABLE);
        assert_null(c.g);
        assert_non_null(strstr(c.err, "cuda"));
        assert_true(strstr(log, "no usable CUDA GPU") || strstr(log, "cannot use it"));
        return;
    }
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.chosen, "cuda");
    assert_non_null(strstr(log, "CUDA driver "));
    int n = pf_gpu_device_count(c.g);
    for (int i = 0; i < n; i++) {
        struct pf_gpu_dev_info info;
        assert_int_equal(pf_gpu_device_info(c.g, i, &info), 0);
        assert_int_equal(info.index, i);
        assert_true(info.total_mem > 0);
        assert_true(info.name[0] != '\0');
        static const uint8_t zero[16];
        assert_memory_not_equal(info.uuid, zero, 16);
    }
    struct pf_gpu_dev_info info;
    assert_int_equal(pf_gpu_device_info(c.g, n, &info), -ENODEV);
    char why[128];
    assert_int_equal(pf_gpu_health(c.g, why, sizeof(why)), 0);
    pf_gpu_close(c.g);
}

static void test_open_auto(void **st)
{
    char log[4096];
    struct open_call c = {.name = "auto"};
    capture_log(log, sizeof(log), do_open, &c);
    if (access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0) {
        /* a GPU is installed: cuda, or a loud refusal, never a silent sim */
        if (c.rc == 0)
            assert_string_equal(c.chosen, "cuda");
        else
            assert_int_equal(c.rc, -ENOTRECOVERABLE);
    } else {
        assert_int_equal(c.rc, 0);
        assert_string_equal(c.chosen, "sim");
        assert_non_null(strstr(log, "chose sim"));
    }
    pf_gpu_close(c.g);
}

/* ------------------------------------------------------------------ fake driver */

static int fake_setup(void **st)
{
    fake_use(2, true);
    return 0;
}

static int fake_teardown(void **st)
{
    fake_check_released();
    return 0;
}

static void open_fake_two(void *p)
{
    *(struct pf_gpu **)p = fake_open(NULL, 0);
}

static void test_fake_discovery(void **st)
{
    char log[8192];
    struct pf_gpu *g = NULL;
    capture_log(log, sizeof(log), open_fake_two, &g);
    /* the driver version, the requested API version and the kernel's PTX ISA at start */
    assert_non_null(strstr(log, "CUDA driver 12.2"));
    assert_non_null(strstr(log, "entry points at CUDA 12.0"));
    assert_non_null(strstr(log, "PTX ISA 7.0"));
    assert_non_null(strstr(log, "cuMemcpyBatchAsync) unavailable"));
    assert_int_equal(pf_gpu_device_count(g), 2);
    assert_int_equal(fk.contexts, 2);
    assert_int_equal(fk.modules, 2); /* the copy kernel JIT-loaded into each context */
    struct pf_gpu_dev_info info;
    assert_int_equal(pf_gpu_device_info(g, 1, &info), 0);
    assert_int_equal(info.index, 1);
    assert_string_equal(info.name, "Fake GPU 1");
    assert_string_equal(info.pci_bus_id, "0000:3c:00.0");
    assert_int_equal(info.total_mem, 81ull << 30);
    uint8_t u[16];
    fake_uuid_(1, u);
    assert_memory_equal(info.uuid, u, 16);
    assert_int_equal(pf_gpu_device_info(g, 2, &info), -ENODEV);
    pf_gpu_close(g);
    assert_int_equal(fk.contexts, 0); /* primary contexts released */

    int devs[] = {1};
    g = fake_open(devs, 1);
    assert_int_equal(pf_gpu_device_count(g), 1);
    assert_int_equal(pf_gpu_device_info(g, 0, &info), 0);
    assert_int_equal(info.index, 1);
    pf_gpu_close(g);
    int bad[] = {0, 5};
    struct pf_gpu_config cfg = {.devices = bad, .ndevices = 2};
    assert_int_equal(pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, NULL, 0), -ENODEV);
    assert_int_equal(fk.contexts, 0);
}

static void test_fake_ipc(void **st)
{
    struct pf_gpu *g = fake_open(NULL, 0);
    CUipcMemHandle ha, hb;
    int ia = fake_export_(1, 1 << 20, &ha);
    fake_export_(1, 1 << 19, &hb);
    struct pf_gpu_mapping *m1 = NULL, *m2 = NULL, *m3 = NULL, *mb = NULL;
    struct pf_ipc_desc d = fake_desc(1, &ha, 0, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m1), 0);
    assert_int_equal(m1->device, 1); /* found by UUID */
    assert_ptr_equal((void *)(uintptr_t)m1->base, fk.allocs[ia].p);
    assert_int_equal(m1->size, 1 << 19);
    /* a second view of the same allocation shares the opened handle */
    d = fake_desc(1, &ha, 1 << 19, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m2), 0);
    assert_int_equal(fk.ipc_opens, 1);
    assert_int_equal(m2->base, m1->base + (1 << 19));
    /* past the end of the allocation */
    d = fake_desc(1, &ha, 3 << 18, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ERANGE);
    d = fake_desc(1, &ha, UINT64_MAX, 2);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ERANGE);
    assert_null(m3);
    d = fake_desc(7, &ha, 0, 4096); /* unknown UUID */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ENODEV);
    d = fake_desc(0, &ha, 0, 4096); /* a device that does not hold the handle */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ENODEV);
    d = fake_desc(1, &ha, 0, 0);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    d = fake_desc(1, &ha, 0, 4096);
    d.has_uuid = false; /* two devices: cannot tell which */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    d = fake_desc(1, &ha, 0, 4096);
    d.kind = PF_IPC_SIM_SHM;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    d.kind = PF_IPC_UNSPECIFIED;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -EINVAL);
    fk.ipc_open_err = CUDA_ERROR_MAP_FAILED; /* exporter gone */
    d = fake_desc(1, &hb, 0, 4096);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m3), -ENOENT);
    fk.ipc_open_err = CUDA_SUCCESS;
    assert_null(m3);
    assert_int_equal(fk.ipc_opens, 1);
    /* the handle closes with its last view, and opens again */
    pf_gpu_ipc_close(m1);
    assert_int_equal(fk.ipc_closes, 0);
    pf_gpu_ipc_close(m2);
    assert_int_equal(fk.ipc_closes, 1);
    d = fake_desc(1, &ha, 0, 1 << 20);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m1), 0);
    assert_int_equal(fk.ipc_opens, 2);
    pf_gpu_ipc_close(m1);
    /* a mapping left open is released by close */
    d = fake_desc(1, &hb, 0, 1 << 19);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &mb), 0);
    pf_gpu_close(g);
    assert_int_equal(fk.ipc_closes, 3);
}

static void test_fake_ipc_without_range_query(void **st)
{
    /* cuMemGetAddressRange failing: sizes cannot be checked, views still work */
    fk.no_addr_range = true;
    int one = 1;
    struct pf_gpu *g = fake_open(&one, 1);
    CUipcMemHandle h;
    fake_export_(1, 1 << 16, &h);
    struct pf_gpu_mapping *m = NULL;
    struct pf_ipc_desc d = fake_desc(1, &h, 1 << 15, 1 << 15);
    d.has_uuid = false; /* one device: it must be that one */
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), 0);
    assert_int_equal(m->device, 0);
    pf_gpu_ipc_close(m);
    pf_gpu_close(g);
}

static void test_fake_host_register(void **st)
{
    struct pf_gpu *g = fake_open(NULL, 0);
    size_t len = 1 << 20;
    uint8_t *h = aligned_alloc(4096, len);
    assert_non_null(h);
    struct pf_gpu_host_reg *r = NULL, *r2 = NULL;
    assert_int_equal(pf_gpu_host_register(g, h, 0, &r), -EINVAL);
    assert_int_equal(pf_gpu_host_register(g, NULL, len, &r), -EINVAL);
    assert_int_equal(pf_gpu_host_register(g, h, len, &r), 0);
    assert_ptr_equal(r->addr, h);
    assert_int_equal(r->len, len);
    assert_int_equal(fk.registers, 1); /* small: one chunk */
    assert_int_equal(pf_gpu_host_register(g, h + 4096, 4096, &r2), -EEXIST);
    assert_null(r2);
    pf_gpu_host_unregister(r);
    assert_int_equal(pf_gpu_host_register(g, h + 4096, 4096, &r2), 0);
    pf_gpu_close(g); /* releases r2 */
    free(h);
}

/* host block k <- device block perm(k): runs of 8 adjacent blocks in reverse run order,
 * plus zero-length descriptors with garbage pointers that must be ignored */
static size_t rig_plan(struct fake_rig *rig, struct pf_copy_desc *d, unsigned *perm)
{
    size_t n = 0;
    for (unsigned k = 0; k < RIG_NBLK; k++) {
        perm[k] = (RIG_NBLK / 8 - 1 - k / 8) * 8 + k % 8;
        d[n++] = (struct pf_copy_desc){rig->m->base + (uint64_t)perm[k] * RIG_BLK,
                                       rig->host + (size_t)k * RIG_BLK, RIG_BLK};
        if (k % 9 == 4)
            d[n++] = (struct pf_copy_desc){0xdead, NULL, 0};
    }
    return n;
}

/* Saves and loads the rig's plan (8 merged runs) in mode; checks bytes and call counts:
 * per_range: direct copies one call per run, else one cuMemcpyBatchAsync. */
static void check_copies(struct fake_rig *rig, enum pf_copy_mode mode, bool per_range)
{
    struct pf_copy_desc d[RIG_NBLK * 2];
    unsigned perm[RIG_NBLK];
    size_t n = rig_plan(rig, d, perm);

    pattern(rig->dev, rig->len, 1);
    memset(rig->host, 0, rig->len);
    int calls = fk.copy_calls, batches = fk.batch_calls, launches = fk.launches;
    int uploads = fk.uploads;
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_D2H, mode, d, n), 0);
    assert_int_equal(pf_gpu_stream_sync(rig->s, 1000), 0);
    for (unsigned k = 0; k < RIG_NBLK; k++)
        assert_memory_equal(rig->host + (size_t)k * RIG_BLK, rig->dev + (size_t)perm[k] * RIG_BLK,
                            RIG_BLK);
    if (mode == PF_COPY_MODE_DIRECT) {
        assert_int_equal(fk.copy_calls - calls, per_range ? 8 : 0);
        assert_int_equal(fk.batch_calls - batches, per_range ? 0 : 1);
        assert_int_equal(fk.launches, launches);
    } else {
        assert_int_equal(fk.copy_calls, calls);
        assert_int_equal(fk.uploads - uploads, 1);   /* one descriptor upload */
        assert_int_equal(fk.launches - launches, 1); /* one launch per batch */
        assert_int_equal(fk.last_launch_n, 8 * 8 * RIG_BLK / PF_CUDA_KERNEL_CHUNK);
    }
    assert_int_equal(fk.pageable, 0); /* every host side pinned, descriptors included */

    pattern(rig->host, rig->len, 2);
    memset(rig->dev, 0, rig->len);
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_H2D, mode, d, n / 2), 0);
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_H2D, mode, d + n / 2, n - n / 2), 0);
    assert_int_equal(pf_gpu_stream_sync(rig->s, 1000), 0);
    for (unsigned k = 0; k < RIG_NBLK; k++)
        assert_memory_equal(rig->dev + (size_t)perm[k] * RIG_BLK, rig->host + (size_t)k * RIG_BLK,
                            RIG_BLK);
    assert_int_equal(fk.pageable, 0);
}

static void test_fake_copy_direct(void **st)
{
    /* R535 (12.2): no cuMemcpyBatchAsync, one async copy per merged range */
    struct fake_rig rig;
    rig_up(&rig);
    check_copies(&rig, PF_COPY_MODE_DIRECT, true);
    rig_down(&rig);
}

static void test_fake_copy_batched(void **st)
{
    /* R570 (12.8): scattered ranges go out as one cuMemcpyBatchAsync */
    fk.driver_version = 12080;
    struct fake_rig rig;
    rig_up(&rig);
    check_copies(&rig, PF_COPY_MODE_DIRECT, false);
    /* 5000 scattered ranges: two calls (4096 ranges a call), bytes exact */
    enum { NP = 5000 };
    static struct pf_copy_desc sc[NP];
    for (unsigned i = 0; i < NP; i++)
        sc[i] = (struct pf_copy_desc){rig.m->base + 3 + 500ull * i, rig.host + 1 + 700ull * i, 200};
    pattern(rig.dev, rig.len, 5);
    memset(rig.host, 0, rig.len);
    int b0 = fk.batch_calls;
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, sc, NP), 0);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), 0);
    assert_int_equal(fk.batch_calls - b0, 2);
    for (unsigned i = 0; i < NP; i++)
        assert_memory_equal(rig.host + 1 + 700 * i, rig.dev + 3 + 500 * i, 200);
    /* a single range needs no batch */
    int calls = fk.copy_calls;
    struct pf_copy_desc one = {rig.m->base, rig.host, 4096};
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &one, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), 0);
    assert_int_equal(fk.copy_calls, calls + 1);
    rig_down(&rig);

    /* --gpu-copy-batch off: per range again; on: required, refused where missing */
    struct pf_gpu *g = NULL;
    struct pf_gpu_config cfg = {.gpu_copy_batch = PF_GPU_COPY_BATCH_OFF};
    assert_int_equal(pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, NULL, 0), 0);
    pf_gpu_close(g);
    fk.driver_version = 12020;
    cfg.gpu_copy_batch = PF_GPU_COPY_BATCH_ON;
    char err[256];
    assert_int_equal(pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, err, sizeof(err)), -EOPNOTSUPP);
    /* and the 13.0 driver hands out the 12.8 ABI the backend asked for */
    fk.driver_version = 13000;
    rig_up(&rig);
    check_copies(&rig, PF_COPY_MODE_DIRECT, false);
    rig_down(&rig);
}

static void test_fake_copy_batched_off(void **st)
{
    fk.driver_version = 12080;
    int one = 1;
    struct pf_gpu_config cfg = {
        .devices = &one, .ndevices = 1, .gpu_copy_batch = PF_GPU_COPY_BATCH_OFF};
    struct fake_rig rig;
    assert_int_equal(pf_hal_gpu_open("cuda", &cfg, &rig.g, NULL, 0, NULL, 0), 0);
    rig.len = (size_t)RIG_BLK * RIG_NBLK;
    CUipcMemHandle h;
    int i = fake_export_(1, rig.len, &h);
    rig.dev = fk.allocs[i].p;
    struct pf_ipc_desc d = fake_desc(1, &h, 0, rig.len);
    assert_int_equal(pf_gpu_ipc_open(rig.g, &d, &rig.m), 0);
    rig.host = aligned_alloc(4096, rig.len);
    assert_int_equal(pf_gpu_host_register(rig.g, rig.host, rig.len, &rig.r), 0);
    assert_int_equal(pf_gpu_stream_create(rig.g, 0, &rig.s), 0);
    check_copies(&rig, PF_COPY_MODE_DIRECT, true);
    rig_down(&rig);
}

static void test_fake_copy_kernel(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    check_copies(&rig, PF_COPY_MODE_KERNEL, false);
    assert_int_equal(fk.mallocs, 4);     /* the stream's descriptor slots, allocated once */
    assert_int_equal(fk.host_allocs, 4); /* pinned staging */

    /* 3000 unaligned, non-adjacent 100-byte pieces */
    enum { NP = 3000 };
    static struct pf_copy_desc d[NP];
    for (unsigned i = 0; i < NP; i++)
        d[i] = (struct pf_copy_desc){rig.m->base + 3 + 200ull * i, rig.host + 1 + 300ull * i, 100};
    pattern(rig.dev, rig.len, 3);
    memset(rig.host, 0, rig.len);
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_KERNEL, d, NP), 0);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), 0);
    assert_int_equal(fk.last_launch_n, NP);
    for (unsigned i = 0; i < NP; i++)
        assert_memory_equal(rig.host + 1 + 300 * i, rig.dev + 3 + 200 * i, 100);

    /* ten batches in flight without a sync: each reads its own slot's descriptors (the
     * staging of a slot is reused only after its launch ran), all land byte-exact */
    pattern(rig.dev, rig.len, 4);
    memset(rig.host, 0, rig.len);
    for (unsigned b = 0; b < 10; b++) {
        struct pf_copy_desc one[6];
        for (unsigned j = 0; j < 6; j++) {
            unsigned blk = (b * 6 + j) % RIG_NBLK;
            one[j] = (struct pf_copy_desc){rig.m->base + (uint64_t)(RIG_NBLK - 1 - blk) * RIG_BLK,
                                           rig.host + (size_t)blk * RIG_BLK, RIG_BLK};
        }
        assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_KERNEL, one, 6), 0);
    }
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), 0);
    for (unsigned blk = 0; blk < 60; blk++) /* 10 x 6 blocks */
        assert_memory_equal(rig.host + (size_t)blk * RIG_BLK,
                            rig.dev + (size_t)(RIG_NBLK - 1 - blk) * RIG_BLK, RIG_BLK);
    assert_int_equal(fk.pageable, 0);
    assert_int_equal(fk.frees, 0); /* nothing freed on the copy path */
    assert_int_equal(fk.mallocs, 4);
    rig_down(&rig);
    assert_int_equal(fk.frees, 4);
}

static void test_fake_copy_validation(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    uint8_t *unreg = malloc(8192);
    assert_non_null(unreg);
    struct pf_copy_desc ok = {rig.m->base, rig.host, 4096};
    struct pf_copy_desc bad[] = {
        {rig.m->base + rig.len - 4096, rig.host, 8192}, /* past the mapping */
        {rig.m->base - 4096, rig.host, 4096},           /* before it */
        {rig.m->base, unreg, 4096},                     /* unregistered host memory */
        {rig.m->base, rig.host + rig.len - 100, 4096},  /* past the registration */
        {rig.m->base, rig.host, UINT64_MAX},            /* overflowing length */
    };
    int before = fk.copies + fk.uploads + fk.launches;
    for (int mode = 0; mode < 2; mode++) {
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            struct pf_copy_desc two[2] = {ok, bad[i]}; /* nothing of the batch is enqueued */
            assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, mode, two, 2), -EFAULT);
            assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_H2D, mode, &bad[i], 1), -EFAULT);
        }
    }
    assert_int_equal(fk.copies + fk.uploads + fk.launches, before);
    assert_int_equal(pf_gpu_copy_batch(rig.s, 0, PF_COPY_MODE_DIRECT, &ok, 1), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, 7, &ok, 1), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &ok, 0), 0);
    struct pf_copy_desc empty = {0x1234, NULL, 0};
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_KERNEL, &empty, 1), 0);
    assert_int_equal(fk.copies + fk.uploads + fk.launches, before);
    free(unreg);
    rig_down(&rig);
}

static void test_fake_mapping_of_other_device(void **st)
{
    struct pf_gpu *g = fake_open(NULL, 0);
    CUipcMemHandle h0, h1;
    fake_export_(0, 1 << 16, &h0);
    fake_export_(1, 1 << 16, &h1);
    struct pf_gpu_mapping *m0 = NULL, *m1 = NULL;
    struct pf_ipc_desc d = fake_desc(0, &h0, 0, 1 << 16);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m0), 0);
    d = fake_desc(1, &h1, 0, 1 << 16);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m1), 0);
    uint8_t *host = aligned_alloc(4096, 1 << 16);
    struct pf_gpu_host_reg *r = NULL;
    assert_int_equal(pf_gpu_host_register(g, host, 1 << 16, &r), 0);
    struct pf_gpu_stream *s = NULL;
    assert_int_equal(pf_gpu_stream_create(g, m1->device, &s), 0);
    struct pf_copy_desc c = {m0->base, host, 4096}; /* device 0's memory on device 1's stream */
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), -EFAULT);
    c.dev = m1->base;
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 1000), 0);
    assert_int_equal(fk.last_copy_dev, 1); /* the copy ran in the stream's device context */
    pf_gpu_stream_destroy(s);
    pf_gpu_host_unregister(r);
    pf_gpu_ipc_close(m0);
    pf_gpu_ipc_close(m1);
    pf_gpu_close(g);
    free(host);
}

static void test_fake_sync(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    struct pf_copy_desc c = {rig.m->base, rig.host, 4096};
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), 0);
    fk.not_ready = 1 << 30; /* the copy never finishes */
    assert_int_equal(pf_gpu_stream_sync(rig.s, 0), -ETIMEDOUT);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 5), -ETIMEDOUT);
    fk.not_ready = 3; /* finishes after a few polls */
    assert_int_equal(pf_gpu_stream_sync(rig.s, 10000), 0);
    assert_int_equal(fk.not_ready, 0);
    /* an ordinary (not sticky) asynchronous error: reported once, the stream goes on */
    fk.async_err = CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), -EINVAL);
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), 0);
    char why[64];
    assert_int_equal(pf_gpu_health(rig.g, why, sizeof(why)), 0);
    rig_down(&rig);
}

static void copy_three_failures(void *p)
{
    struct fake_rig *rig = p;
    struct pf_copy_desc c = {rig->m->base, rig->host, 4096};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1),
                         -EINVAL);
}

static void test_fake_error_logged_once(void **st)
{
    struct fake_rig rig;
    rig_up(&rig);
    fk.memcpy_err = CUDA_ERROR_INVALID_VALUE;
    char log[4096];
    capture_log(log, sizeof(log), copy_three_failures, &rig);
    fk.memcpy_err = CUDA_SUCCESS;
    int lines = 0;
    for (const char *p = log; (p = strstr(p, "cuMemcpyDtoHAsync: ")); p++)
        lines++;
    assert_int_equal(lines, 1);
    assert_non_null(strstr(log, "invalid argument"));
    assert_non_null(strstr(log, "CUDA error 1"));
    rig_down(&rig);
}

int main(void)
{
    fake_lib_load();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_open_cuda),
        cmocka_unit_test(test_open_auto),
        cmocka_unit_test_setup_teardown(test_fake_discovery, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_ipc, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_ipc_without_range_query, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_host_register, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_direct, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_batched, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_batched_off, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_kernel, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_copy_validation, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_mapping_of_other_device, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_sync, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_fake_error_logged_once, fake_setup, fake_teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fake_lib_cleanup();
    return rc;
}
#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit (HAVE_CUDA=0), hw/cuda is not compiled\n");
    return 77;
}
#endif

/* The CUDA GPU backend (hw/cuda) against the fake driver library (fake_cuda.c): what the
 * first GPU node would have shown.
 *
 * - Driver loading: the backend dlopens the driver and resolves every entry point with
 *   cuGetProcAddress at CUDA 12.0, so an R535 (12.2) driver serves it; a driver older than
 *   that, a missing library, cuInit failing or no device visible while /dev/nvidia* exists
 *   make "auto" refuse to start (-ENOTRECOVERABLE and an error naming the cause) instead
 *   of silently choosing the sim GPU; without device nodes "auto" still falls back.
 * - Exclusive-process compute mode held by another process: a loud refusal naming it.
 * - The embedded copy kernel is PTX ISA 7.0 for sm_75, which a 12.2 driver JITs; a driver
 *   that cannot JIT it leaves kernel mode failing cleanly (-ENOEXEC), direct copies work.
 * - Sticky errors (700/719): the backend is dead, every later op fails -ENOTRECOVERABLE
 *   (the stream is not usable again), health says why, one error line.
 * - Pinning: a 600 GiB registration (the fake refuses single registrations of >= 512 GiB,
 *   vLLM #51080) goes through in <= 64 GiB chunks registered by several threads; a copy
 *   across a chunk boundary is split, never one DMA over two registrations. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef PF_TEST_HAVE_CUDA
#include "cuda_test_util.h"

static int fake_teardown(void **st)
{
    fake_check_released();
    return 0;
}

/* Opens name with the log captured; returns the call. */
static struct open_call open_logged(const char *name, char *log, size_t loglen)
{
    struct open_call c = {.name = name};
    capture_log(log, loglen, do_open, &c);
    return c;
}

static void expect_loud(const char *cause)
{
    char log[8192];
    struct open_call c = open_logged("auto", log, sizeof(log));
    assert_int_equal(c.rc, -ENOTRECOVERABLE);
    assert_null(c.g);
    assert_non_null(strstr(c.err, "not falling back"));
    assert_null(strstr(log, "chose sim"));
    assert_non_null(strstr(log, "ERROR"));
    assert_non_null(strstr(log, "cannot use it"));
    assert_non_null(strstr(log, cause));
    c = open_logged("cuda", log, sizeof(log));
    assert_int_equal(c.rc, -ENOTRECOVERABLE);
}

static void expect_fallback(void)
{
    char log[8192];
    struct open_call c = open_logged("auto", log, sizeof(log));
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.chosen, "sim");
    assert_non_null(strstr(log, "no usable CUDA GPU"));
    pf_gpu_close(c.g);
}

static void test_old_driver(void **st)
{
    /* R520 (CUDA 11.8): cuGetProcAddress refuses a 12.0 request (CUDA_ERROR_INVALID_VALUE) */
    fake_use(1, true);
    fk.driver_version = 11080;
    expect_loud("older than this backend needs");
    fake_use(1, false); /* no device nodes: not a GPU node, the sim is right */
    fk.driver_version = 11080;
    expect_fallback();
}

static void test_r535_driver_opens(void **st)
{
    /* the oldest driver production runs: every entry point resolves at 12.0 */
    fake_use(1, true);
    char log[8192];
    struct open_call c = open_logged("auto", log, sizeof(log));
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.chosen, "cuda");
    assert_non_null(strstr(log, "CUDA driver 12.2"));
    pf_gpu_close(c.g);
}

static void test_missing_library(void **st)
{
    fake_use(1, true);
    pf_cuda_test_set_driver("/nonexistent/libcuda.so.1");
    expect_loud("cannot load the CUDA driver library");
    pf_cuda_test_set_devdir(devdir_empty);
    expect_fallback();
}

static void test_init_fails(void **st)
{
    /* a forward-compatibility libcuda on an older kernel module (cuInit: 803) */
    fake_use(1, true);
    fk.init_err = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    expect_loud("CUDA error 803");
}

static void test_no_device_with_nodes(void **st)
{
    fake_use(0, true); /* nodes present, cuDeviceGetCount 0 (e.g. CUDA_VISIBLE_DEVICES="") */
    expect_loud("0 devices");
    fake_use(0, false);
    expect_fallback();
}

static void test_exclusive_process(void **st)
{
    fake_use(2, true);
    fk.compute_mode[1] = CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
    fk.held_elsewhere[1] = true; /* the vLLM worker owns GPU 1 */
    char log[8192];
    struct open_call c = open_logged("auto", log, sizeof(log));
    assert_int_equal(c.rc, -ENOTRECOVERABLE);
    assert_non_null(strstr(log, "exclusive-process"));
    assert_non_null(strstr(log, "CUDA error 46"));
    assert_non_null(strstr(log, "MPS"));
    assert_null(strstr(log, "chose sim"));
    assert_int_equal(fk.contexts, 0); /* GPU 0's context released again */
    /* exclusive but free: this process gets it */
    fk.held_elsewhere[1] = false;
    c = open_logged("cuda", log, sizeof(log));
    assert_int_equal(c.rc, 0);
    pf_gpu_close(c.g);
}

static void test_embedded_ptx(void **st)
{
    /* what ships: PTX ISA 7.0 (every R450+ driver JITs it), sm_75, the entry point */
    assert_non_null(strstr(pf_cuda_kernel_ptx, "\n.version 7.0\n"));
    assert_non_null(strstr(pf_cuda_kernel_ptx, "\n.target sm_75\n"));
    assert_non_null(strstr(pf_cuda_kernel_ptx, ".entry " PF_CUDA_KERNEL_NAME "("));
}

static void test_ptx_not_loadable(void **st)
{
    fake_use(1, true);
    fk.ptx_isa_max = 65; /* a driver that JITs only older PTX */
    char log[8192];
    struct open_call c = open_logged("cuda", log, sizeof(log));
    assert_int_equal(c.rc, 0); /* direct copies still serve */
    assert_non_null(strstr(log, "copy kernel"));
    assert_non_null(strstr(log, "CUDA error 222"));
    struct pf_gpu *g = c.g;
    CUipcMemHandle h;
    fake_export_(0, 1 << 16, &h);
    struct pf_gpu_mapping *m = NULL;
    struct pf_ipc_desc d = fake_desc(0, &h, 0, 1 << 16);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), 0);
    uint8_t *host = aligned_alloc(4096, 1 << 16);
    struct pf_gpu_host_reg *r = NULL;
    assert_int_equal(pf_gpu_host_register(g, host, 1 << 16, &r), 0);
    struct pf_gpu_stream *s = NULL;
    assert_int_equal(pf_gpu_stream_create(g, 0, &s), 0);
    struct pf_copy_desc cd = {m->base, host, 4096};
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_KERNEL, &cd, 1), -ENOEXEC);
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &cd, 1), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 1000), 0);
    pf_gpu_stream_destroy(s);
    pf_gpu_host_unregister(r);
    pf_gpu_ipc_close(m);
    pf_gpu_close(g);
    free(host);
}

/* ------------------------------------------------------------------ sticky errors */

struct sticky_case {
    struct fake_rig *rig;
    CUresult err;
};

static void sticky_run(void *p)
{
    struct sticky_case *c = p;
    struct fake_rig *rig = c->rig;
    struct pf_copy_desc d = {rig->m->base, rig->host, 4096};
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &d, 1), 0);
    fk.async_err = c->err; /* the copy faults on the GPU */
    assert_int_equal(pf_gpu_stream_sync(rig->s, 1000), -ENOTRECOVERABLE);
    /* not usable again: every later op fails the same way, without a hang */
    assert_int_equal(pf_gpu_stream_sync(rig->s, 1000), -ENOTRECOVERABLE);
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &d, 1),
                     -ENOTRECOVERABLE);
    assert_int_equal(pf_gpu_copy_batch(rig->s, PF_COPY_H2D, PF_COPY_MODE_KERNEL, &d, 1),
                     -ENOTRECOVERABLE);
    struct pf_gpu_stream *s2 = NULL;
    assert_int_equal(pf_gpu_stream_create(rig->g, 0, &s2), -ENOTRECOVERABLE);
    struct pf_gpu_host_reg *r2 = NULL;
    uint8_t other[64];
    assert_int_equal(pf_gpu_host_register(rig->g, other, sizeof(other), &r2), -ENOTRECOVERABLE);
    CUipcMemHandle h;
    fake_export_(1, 4096, &h);
    struct pf_ipc_desc id = fake_desc(1, &h, 0, 4096);
    struct pf_gpu_mapping *m2 = NULL;
    assert_int_equal(pf_gpu_ipc_open(rig->g, &id, &m2), -ENOTRECOVERABLE);
}

static void check_sticky(CUresult err, const char *text)
{
    fake_use(2, true);
    struct fake_rig rig;
    rig_up(&rig);
    char why[256];
    assert_int_equal(pf_gpu_health(rig.g, why, sizeof(why)), 0);
    struct sticky_case c = {&rig, err};
    char log[8192];
    capture_log(log, sizeof(log), sticky_run, &c);
    /* one error line saying what happened and what to do */
    int lines = 0;
    for (const char *p = log; (p = strstr(p, "GPU context lost")); p++)
        lines++;
    assert_int_equal(lines, 1);
    assert_non_null(strstr(log, "ERROR"));
    assert_non_null(strstr(log, "restarted"));
    assert_int_equal(pf_gpu_health(rig.g, why, sizeof(why)), -ENOTRECOVERABLE);
    assert_non_null(strstr(why, text));
    assert_non_null(strstr(why, "restart"));
    rig_down(&rig); /* teardown frees the backend's memory without waiting on CUDA */
}

static void test_sticky_illegal_address(void **st)
{
    check_sticky(CUDA_ERROR_ILLEGAL_ADDRESS, "illegal memory access");
}

static void test_sticky_launch_failed(void **st)
{
    check_sticky(CUDA_ERROR_LAUNCH_FAILED, "CUDA error 719");
}

static void test_sticky_through_faulty_decorator(void **st)
{
    /* faulty:cuda forwards health, so fault-injection runs see the lost device too */
    fake_use(2, true);
    struct fake_rig rig;
    rig_up(&rig);
    struct pf_gpu *g = NULL;
    assert_int_equal(pf_fault_gpu_wrap(rig.g, NULL, &g), 0);
    char why[256];
    assert_int_equal(pf_gpu_health(g, why, sizeof(why)), 0);
    struct pf_copy_desc d = {rig.m->base, rig.host, 4096};
    assert_int_equal(pf_gpu_copy_batch(rig.s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &d, 1), 0);
    fk.async_err = CUDA_ERROR_ILLEGAL_ADDRESS;
    assert_int_equal(pf_gpu_stream_sync(rig.s, 1000), -ENOTRECOVERABLE);
    assert_int_equal(pf_gpu_health(g, why, sizeof(why)), -ENOTRECOVERABLE);
    assert_non_null(strstr(why, "CUDA error 700"));
    free(g); /* the decorator shell only; rig_down closes the inner backend */
    rig_down(&rig);
}

/* ------------------------------------------------------------------ pinning */

struct reg_call {
    struct pf_gpu *g;
    void *p;
    size_t len;
    struct pf_gpu_host_reg *r;
    int rc;
};

static void do_register(void *arg)
{
    struct reg_call *c = arg;
    c->rc = pf_gpu_host_register(c->g, c->p, c->len, &c->r);
}

static void test_large_pool_chunked(void **st)
{
    /* 600 GiB of address space, never touched (the fake does not read registered memory) */
    fake_use(1, true);
    fk.reg_cap = FAKE_REG_CAP_R580;
    size_t len = 600ull << 30;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        printf("SKIP: cannot reserve 600 GiB of address space here: %s\n", strerror(errno));
        skip();
    }
    struct reg_call c = {.g = fake_open(NULL, 0), .p = p, .len = len};
    do_register(&c);
    assert_int_equal(c.rc, 0);
    assert_true(fk.registers >= 10);
    assert_true(fk.max_reg_len <= PF_CUDA_REG_CHUNK);
    assert_true(fk.max_reg_threads >= 2); /* chunks registered in parallel */
    pf_gpu_host_unregister(c.r);
    pf_gpu_close(c.g);
    munmap(p, len);
}

static void test_large_pool_progress_logged(void **st)
{
    fake_use(1, true);
    fk.reg_cap = FAKE_REG_CAP_R580;
    size_t len = 130ull << 30;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        printf("SKIP: cannot reserve 130 GiB of address space here: %s\n", strerror(errno));
        skip();
    }
    struct reg_call c = {.g = fake_open(NULL, 0), .p = p, .len = len};
    char log[16384];
    capture_log(log, sizeof(log), do_register, &c);
    assert_int_equal(c.rc, 0);
    assert_non_null(strstr(log, "INFO"));
    assert_non_null(strstr(log, "3 chunks"));
    assert_non_null(strstr(log, "3 of 3 chunks"));
    assert_non_null(strstr(log, "pinned 130.00 GiB"));
    pf_gpu_host_unregister(c.r);
    pf_gpu_close(c.g);
    munmap(p, len);
}

static void test_single_registration_refused(void **st)
{
    /* a pool under the chunk size but over the driver's cap: the error reaches the caller
     * and nothing stays registered */
    fake_use(1, true);
    fk.reg_cap = 1 << 20;
    struct pf_gpu *g = fake_open(NULL, 0);
    size_t len = 4 << 20;
    void *p = aligned_alloc(4096, len);
    struct pf_gpu_host_reg *r = NULL;
    assert_int_equal(pf_gpu_host_register(g, p, len, &r), -ENOMEM);
    assert_null(r);
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        assert_null(fk.regs[i].p);
    /* in chunks under the cap it goes through, and a failure half-way rolls back */
    pf_cuda_test_set_reg_chunk(512 << 10);
    assert_int_equal(pf_gpu_host_register(g, p, len, &r), 0);
    assert_int_equal(fk.registers, 1 + 8);
    pf_gpu_host_unregister(r);
    pf_cuda_test_set_reg_chunk(2 << 20);
    assert_int_equal(pf_gpu_host_register(g, p, len, &r), -ENOMEM);
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        assert_null(fk.regs[i].p);
    pf_gpu_close(g);
    free(p);
}

static void test_copy_across_chunks(void **st)
{
    /* 1 MiB chunks: descriptors straddling a chunk boundary are split (direct copies stay
     * inside one registration, so none is "pageable"; kernel pieces use each chunk's own
     * alias, so none faults) and the bytes land exactly */
    fake_use(1, true);
    pf_cuda_test_set_reg_chunk(1 << 20);
    struct pf_gpu *g = fake_open(NULL, 0);
    size_t len = 4 << 20;
    CUipcMemHandle h;
    int ai = fake_export_(0, len, &h);
    uint8_t *dev = fk.allocs[ai].p;
    struct pf_gpu_mapping *m = NULL;
    struct pf_ipc_desc d = fake_desc(0, &h, 0, len);
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), 0);
    uint8_t *host = aligned_alloc(1 << 20, len);
    struct pf_gpu_host_reg *r = NULL;
    assert_int_equal(pf_gpu_host_register(g, host, len, &r), 0);
    assert_int_equal(fk.registers, 4);
    struct pf_gpu_stream *s = NULL;
    assert_int_equal(pf_gpu_stream_create(g, 0, &s), 0);
    for (int mode = 0; mode < 2; mode++) {
        struct pf_copy_desc cd[3];
        for (int k = 0; k < 3; k++) /* 64 KiB across each of the three inner boundaries */
            cd[k] = (struct pf_copy_desc){m->base + ((uint64_t)(k + 1) << 20) - 12345,
                                          host + ((size_t)(k + 1) << 20) - 32768, 65536};
        pattern(dev, len, 7 + (unsigned)mode);
        memset(host, 0, len);
        int copies = fk.copies;
        assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, mode, cd, 3), 0);
        assert_int_equal(pf_gpu_stream_sync(s, 1000), 0);
        assert_int_equal(fk.sticky, CUDA_SUCCESS);
        assert_int_equal(fk.pageable, 0);
        if (mode == PF_COPY_MODE_DIRECT)
            assert_int_equal(fk.copies - copies, 6); /* each split in two */
        for (int k = 0; k < 3; k++)
            assert_memory_equal(host + ((size_t)(k + 1) << 20) - 32768,
                                dev + ((size_t)(k + 1) << 20) - 12345, 65536);
    }
    pf_gpu_stream_destroy(s);
    pf_gpu_host_unregister(r);
    pf_gpu_ipc_close(m);
    pf_gpu_close(g);
    free(host);
}

int main(void)
{
    fake_lib_load();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_old_driver, fake_teardown),
        cmocka_unit_test_teardown(test_r535_driver_opens, fake_teardown),
        cmocka_unit_test_teardown(test_missing_library, fake_teardown),
        cmocka_unit_test_teardown(test_init_fails, fake_teardown),
        cmocka_unit_test_teardown(test_no_device_with_nodes, fake_teardown),
        cmocka_unit_test_teardown(test_exclusive_process, fake_teardown),
        cmocka_unit_test(test_embedded_ptx),
        cmocka_unit_test_teardown(test_ptx_not_loadable, fake_teardown),
        cmocka_unit_test_teardown(test_sticky_illegal_address, fake_teardown),
        cmocka_unit_test_teardown(test_sticky_launch_failed, fake_teardown),
        cmocka_unit_test_teardown(test_sticky_through_faulty_decorator, fake_teardown),
        cmocka_unit_test_teardown(test_large_pool_chunked, fake_teardown),
        cmocka_unit_test_teardown(test_large_pool_progress_logged, fake_teardown),
        cmocka_unit_test_teardown(test_single_registration_refused, fake_teardown),
        cmocka_unit_test_teardown(test_copy_across_chunks, fake_teardown),
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

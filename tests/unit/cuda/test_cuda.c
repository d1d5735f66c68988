/* The CUDA GPU backend (hw/cuda/cuda.c) through the HAL registry.
 *
 * Without a usable GPU (no driver: CUDA error 35, or no device: 100) opening "cuda" must
 * answer -ENODEV with a log line saying why, and "auto" must fall back to "sim" and say
 * so. On a machine with a GPU the same binary checks instead that "cuda" opens, reports
 * sane device info, and rejects bad input (SIM_SHM descriptors, unknown UUIDs, device
 * ranges outside every mapping, unregistered host memory) without touching memory. */
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
#include <cuda_runtime_api.h>

#include "pf/hal.h"
#include "pf/log.h"

static int gpus_present(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    return e == cudaSuccess ? n : 0;
}

/* Runs fn with the log captured into buf (NUL-terminated). */
static void capture_log(char *buf, size_t len, void (*fn)(void *), void *arg)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    pf_log_set_fd(fileno(f));
    fn(arg);
    pf_log_set_fd(2);
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    fputs(buf, stderr); /* keep it in the test log */
}

struct open_call {
    const char *name;
    int rc;
    struct pf_gpu *g;
    char chosen[32];
    char err[256];
};

static void do_open(void *p)
{
    struct open_call *c = p;
    struct pf_gpu_config cfg = {0};
    c->rc =
        pf_hal_gpu_open(c->name, &cfg, &c->g, c->chosen, sizeof(c->chosen), c->err, sizeof(c->err));
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
        assert_int_equal(c.rc, -ENODEV);
        assert_null(c.g);
        assert_non_null(strstr(c.err, "cuda"));
        assert_non_null(strstr(log, "no usable CUDA GPU"));
        return;
    }
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.chosen, "cuda");
    int n = pf_gpu_device_count(c.g);
    assert_int_equal(n, gpus_present());
    for (int i = 0; i < n; i++) {
        struct pf_gpu_dev_info info;
        assert_int_equal(pf_gpu_device_info(c.g, i, &info), 0);
        assert_int_equal(info.index, i);
        assert_true(info.total_mem > 0);
        assert_true(info.name[0] != '\0');
        assert_true(info.numa_node >= -1);
        static const uint8_t zero[16];
        assert_memory_not_equal(info.uuid, zero, 16);
    }
    struct pf_gpu_dev_info info;
    assert_int_equal(pf_gpu_device_info(c.g, n, &info), -ENODEV);
    pf_gpu_close(c.g);
}

static void test_open_auto_falls_back(void **st)
{
    char log[4096];
    struct open_call c = {.name = "auto"};
    capture_log(log, sizeof(log), do_open, &c);
    assert_int_equal(c.rc, 0);
    if (gpus_present() == 0) {
        assert_string_equal(c.chosen, "sim");
        assert_non_null(strstr(log, "chose sim"));
        assert_non_null(strstr(log, "cuda"));
    } else {
        assert_string_equal(c.chosen, "cuda");
    }
    pf_gpu_close(c.g);
}

static void test_devices_out_of_range(void **st)
{
    int n = gpus_present();
    int devs[1] = {n + 5};
    struct pf_gpu_config cfg = {.devices = devs, .ndevices = 1};
    struct pf_gpu *g = NULL;
    char err[256];
    int rc = pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, err, sizeof(err));
    assert_int_equal(rc, -ENODEV);
    assert_null(g);
}

/* ---- GPU only: input validation of an opened backend */

static void test_rejects_bad_input(void **st)
{
    if (gpus_present() == 0) {
        printf("no GPU: input validation of an opened backend is checked on GPU hosts\n");
        skip();
    }
    struct pf_gpu *g = NULL;
    assert_int_equal(pf_hal_gpu_open("cuda", NULL, &g, NULL, 0, NULL, 0), 0);
    struct pf_gpu_mapping *m = NULL;
    struct pf_ipc_desc d = {.kind = PF_IPC_SIM_SHM, .size = 4096};
    strcpy(d.shm_name, "/pf-not-a-gpu");
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    d.kind = PF_IPC_UNSPECIFIED;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    d.kind = PF_IPC_CUDA;
    d.has_uuid = true;
    memset(d.device_uuid, 0xee, sizeof(d.device_uuid));
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -ENODEV);
    d.size = 0;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EINVAL);
    assert_null(m);

    size_t len = 1 << 20;
    void *host = aligned_alloc(4096, len);
    assert_non_null(host);
    struct pf_gpu_host_reg *r = NULL;
    assert_int_equal(pf_gpu_host_register(g, host, len, &r), 0);
    struct pf_gpu_stream *s = NULL;
    assert_int_equal(pf_gpu_stream_create(g, 0, &s), 0);
    assert_int_equal(pf_gpu_stream_create(g, pf_gpu_device_count(g), &s), -ENODEV);
    void *dev = NULL;
    assert_int_equal(cudaMalloc(&dev, len), cudaSuccess);
    /* device memory of this process is not an imported mapping: refused */
    struct pf_copy_desc c = {.dev = (pf_devptr_t)(uintptr_t)dev, .host = host, .len = 4096};
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 1), -EFAULT);
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_H2D, PF_COPY_MODE_KERNEL, &c, 1), -EFAULT);
    assert_int_equal(pf_gpu_copy_batch(s, 0, PF_COPY_MODE_DIRECT, &c, 1), -EINVAL);
    assert_int_equal(pf_gpu_copy_batch(s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &c, 0), 0);
    assert_int_equal(pf_gpu_stream_sync(s, 1000), 0);
    pf_gpu_stream_destroy(s);
    pf_gpu_host_unregister(r);
    cudaFree(dev);
    free(host);
    pf_gpu_close(g);
}

int main(void)
{
    int n = gpus_present();
    printf("%d CUDA GPU(s) visible to this test\n", n);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_open_cuda),
        cmocka_unit_test(test_open_auto_falls_back),
        cmocka_unit_test(test_devices_out_of_range),
        cmocka_unit_test(test_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit (HAVE_CUDA=0), hw/cuda is not compiled\n");
    return 77;
}
#endif

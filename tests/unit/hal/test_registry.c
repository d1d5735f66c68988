/* HAL registry: stub filling, selection by name, auto fallback, faulty: wrapping. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "pf/fault.h"
#include "pf/hal.h"

static struct pf_gpu fake_obj;
static int fake_count(struct pf_gpu *g)
{
    return 3;
}
static const struct pf_gpu_ops fake_ops = {.name = "fake", .device_count = fake_count};
static int fake_open(const struct pf_gpu_config *c, struct pf_gpu **g_p)
{
    fake_obj.ops = &fake_ops;
    *g_p = &fake_obj;
    return 0;
}
static const struct pf_gpu_backend fake = {.name = "fake", .ops = &fake_ops, .open = fake_open};

static int hw_open(const struct pf_gpu_config *c, struct pf_gpu **g_p)
{
    return -ENODEV;
}
static const struct pf_gpu_ops hw_ops = {.name = "fakehw"};
static const struct pf_gpu_backend fakehw = {
    .name = "fakehw", .hardware = 1, .ops = &hw_ops, .open = hw_open};

static void test_stubs_and_names(void **st)
{
    pf_hal_init();
    assert_int_equal(pf_hal_register_gpu(&fake), 0);
    assert_int_equal(pf_hal_register_gpu(&fake), -EEXIST);
    struct pf_gpu *g;
    char chosen[64], err[256];
    assert_int_equal(pf_hal_gpu_open("fake", NULL, &g, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    assert_string_equal(chosen, "fake");
    assert_int_equal(pf_gpu_device_count(g), 3);
    /* every op the backend left NULL answers -EOPNOTSUPP instead of crashing */
    struct pf_gpu_dev_info info;
    assert_int_equal(pf_gpu_device_info(g, 0, &info), -EOPNOTSUPP);
    struct pf_gpu_stream *s;
    assert_int_equal(pf_gpu_stream_create(g, 0, &s), -EOPNOTSUPP);
    struct pf_gpu_mapping *m;
    struct pf_ipc_desc d = {0};
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EOPNOTSUPP);
    pf_gpu_close(g);
    assert_int_equal(pf_hal_gpu_open("opencl", NULL, &g, chosen, sizeof(chosen), err, sizeof(err)),
                     -ENOENT);
    assert_non_null(strstr(err, "unknown gpu backend 'opencl'"));
    assert_non_null(strstr(err, "sim"));
}

static void test_auto_falls_back(void **st)
{
    assert_int_equal(pf_hal_register_gpu(&fakehw), 0);
    struct pf_gpu *g;
    char chosen[64], err[256];
    struct pf_gpu_config cfg = {.sim_default_devices = 2};
    assert_int_equal(pf_hal_gpu_open("auto", &cfg, &g, chosen, sizeof(chosen), err, sizeof(err)),
                     0);
    /* cuda (if compiled) and fakehw report no device: the first simulation backend wins */
    assert_string_equal(chosen, "sim");
    assert_int_equal(pf_gpu_device_count(g), 2);
    pf_gpu_close(g);
    assert_int_equal(pf_hal_gpu_open("fakehw", &cfg, &g, chosen, sizeof(chosen), err, sizeof(err)),
                     -ENODEV);
    assert_non_null(strstr(err, "fakehw"));
}

static void test_faulty_prefix(void **st)
{
    struct pf_gpu *g;
    char chosen[64], err[256];
    struct pf_gpu_config cfg = {.sim_default_devices = 1};
    assert_int_equal(
        pf_hal_gpu_open("faulty:sim", &cfg, &g, chosen, sizeof(chosen), err, sizeof(err)), 0);
    assert_string_equal(chosen, "faulty:sim");
    assert_int_equal(pf_gpu_device_count(g), 1);
    pf_gpu_close(g);
    /* a plan naming gpu ops wraps automatically */
    struct pf_fault_plan *p;
    assert_int_equal(pf_fault_plan_parse("gpu.ipc_open:error=EACCES", &p, err, sizeof(err)), 0);
    cfg.faults = p;
    assert_int_equal(pf_hal_gpu_open("sim", &cfg, &g, chosen, sizeof(chosen), err, sizeof(err)), 0);
    assert_string_equal(chosen, "faulty:sim");
    struct pf_ipc_desc d = {.kind = PF_IPC_SIM_SHM, .size = 1};
    struct pf_gpu_mapping *m;
    assert_int_equal(pf_gpu_ipc_open(g, &d, &m), -EACCES);
    pf_gpu_close(g);
    pf_fault_plan_free(p);
}

static void test_other_classes(void **st)
{
    struct pf_net *n;
    struct pf_blk *b;
    char chosen[64], err[256];
    assert_int_equal(pf_hal_net_open("nosuch", NULL, &n, chosen, sizeof(chosen), err, sizeof(err)),
                     -ENOENT);
    assert_int_equal(pf_hal_blk_open("nosuch", NULL, &b, chosen, sizeof(chosen), err, sizeof(err)),
                     -ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stubs_and_names),
        cmocka_unit_test(test_auto_falls_back),
        cmocka_unit_test(test_faulty_prefix),
        cmocka_unit_test(test_other_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

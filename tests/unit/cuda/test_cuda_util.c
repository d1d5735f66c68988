/* CUDA backend helpers (hw/cuda/cuda_util.c): CUDA error -> -errno translation, PCI bus id
 * normalisation, GPU NUMA node from a fake sysfs tree, UUID formatting. No GPU needed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef PF_TEST_HAVE_CUDA
#include "cuda_internal.h"

static void test_errno_table(void **st)
{
    static const struct {
        CUresult e;
        int err;
    } cases[] = {
        {CUDA_SUCCESS, 0},
        {CUDA_ERROR_INVALID_VALUE, -EINVAL},
        {CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM},
        {CUDA_ERROR_NOT_INITIALIZED, -ENODEV},
        {CUDA_ERROR_NO_DEVICE, -ENODEV},
        {CUDA_ERROR_INVALID_DEVICE, -ENODEV},
        {CUDA_ERROR_STUB_LIBRARY, -ENODEV},
        {CUDA_ERROR_DEVICE_UNAVAILABLE, -ENODEV},
        {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, -ENODEV},
        {CUDA_ERROR_NOT_READY, -EAGAIN},
        {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, -EEXIST},
        {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, -ENOENT},
        {CUDA_ERROR_INVALID_HANDLE, -ENOENT},
        {CUDA_ERROR_TIMEOUT, -ETIMEDOUT},
        {CUDA_ERROR_NO_BINARY_FOR_GPU, -ENOEXEC},
        {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, -ENOEXEC},
        {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, -ENOMEM},
        {CUDA_ERROR_NOT_SUPPORTED, -EOPNOTSUPP},
        {CUDA_ERROR_NOT_PERMITTED, -EPERM},
        {CUDA_ERROR_DEINITIALIZED, -ESHUTDOWN},
        {CUDA_ERROR_ECC_UNCORRECTABLE, -EIO},
        {CUDA_ERROR_UNKNOWN, -EIO},
        /* sticky (cuda.h: "any further CUDA work will return the same error") */
        {CUDA_ERROR_ILLEGAL_ADDRESS, -ENOTRECOVERABLE},
        {CUDA_ERROR_LAUNCH_FAILED, -ENOTRECOVERABLE},
        {CUDA_ERROR_LAUNCH_TIMEOUT, -ENOTRECOVERABLE},
        {CUDA_ERROR_MISALIGNED_ADDRESS, -ENOTRECOVERABLE},
        {CUDA_ERROR_CONTAINED, -ENOTRECOVERABLE},
        {CUDA_ERROR_EXTERNAL_DEVICE, -ENOTRECOVERABLE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (pf_cuda_errno(cases[i].e) != cases[i].err)
            fail_msg("CUDA error %d -> %d, want %d", (int)cases[i].e, pf_cuda_errno(cases[i].e),
                     cases[i].err);
    }
}

static void test_sticky_codes(void **st)
{
    /* exactly the codes cuda.h documents with "This leaves the process in an inconsistent
     * state and any further CUDA work will return the same error" */
    static const int sticky[] = {226, 700, 702, 714, 715, 716, 717, 718, 719, 911};
    for (int c = 0; c < 1000; c++) {
        bool want = false;
        for (size_t i = 0; i < sizeof(sticky) / sizeof(sticky[0]); i++)
            want = want || sticky[i] == c;
        if (pf_cuda_sticky((CUresult)c) != want)
            fail_msg("CUDA error %d: sticky %d, want %d", c, pf_cuda_sticky((CUresult)c), want);
    }
    assert_false(pf_cuda_sticky(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)); /* 701: recoverable */
}

static void test_errno_unknown_codes_are_eio(void **st)
{
    assert_int_equal(pf_cuda_errno((CUresult)12345), -EIO);
    assert_int_equal(pf_cuda_errno((CUresult)-1), -EIO);
}

static void test_errno_every_code_negative(void **st)
{
    for (int c = 1; c < 1000; c++)
        assert_true(pf_cuda_errno((CUresult)c) < 0);
}

static void test_no_gpu_codes(void **st)
{
    assert_true(pf_cuda_no_gpu(CUDA_ERROR_NO_DEVICE));
    assert_true(pf_cuda_no_gpu(CUDA_ERROR_STUB_LIBRARY));
    assert_true(pf_cuda_no_gpu(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH));
    assert_false(pf_cuda_no_gpu(CUDA_SUCCESS));
    assert_false(pf_cuda_no_gpu(CUDA_ERROR_INVALID_VALUE));
    assert_false(pf_cuda_no_gpu(CUDA_ERROR_OUT_OF_MEMORY));
    assert_false(pf_cuda_no_gpu(CUDA_ERROR_ILLEGAL_ADDRESS));
    /* every "no GPU" code also translates to -ENODEV */
    for (int c = 1; c < 1000; c++)
        if (pf_cuda_no_gpu((CUresult)c))
            assert_int_equal(pf_cuda_errno((CUresult)c), -ENODEV);
}

static void test_busid_normalize(void **st)
{
    char b[32];
    assert_int_equal(pf_cuda_busid_normalize("0000:3B:00.0", b, sizeof(b)), 0);
    assert_string_equal(b, "0000:3b:00.0");
    assert_int_equal(pf_cuda_busid_normalize("00000000:AF:1f.7", b, sizeof(b)), 0);
    assert_string_equal(b, "0000:af:1f.7");
    assert_int_equal(pf_cuda_busid_normalize("0001:c1:00.0", b, sizeof(b)), 0);
    assert_string_equal(b, "0001:c1:00.0");
    const char *bad[] = {"",
                         "3b:00.0",
                         "0000:3b:00",
                         "0000:3b:00.0x",
                         "0000:100:00.0",
                         "0000:3b:20.0",
                         "0000:3b:00.8",
                         "zz:3b:00.0",
                         NULL};
    for (size_t i = 0; bad[i]; i++) {
        strcpy(b, "untouched");
        assert_int_equal(pf_cuda_busid_normalize(bad[i], b, sizeof(b)), -EINVAL);
    }
    assert_int_equal(pf_cuda_busid_normalize(NULL, b, sizeof(b)), -EINVAL);
    char tiny[8];
    assert_int_equal(pf_cuda_busid_normalize("0000:3b:00.0", tiny, sizeof(tiny)), -EINVAL);
}

/* A fake sysfs tree under a temporary directory. */
struct fake_sysfs {
    char root[64];
};

static void sysfs_put(struct fake_sysfs *fs, const char *busid, const char *content)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/bus", fs->root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/bus/pci", fs->root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/bus/pci/devices", fs->root);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s", fs->root, busid);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/numa_node", fs->root, busid);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
}

static void test_numa_node_from_sysfs(void **st)
{
    struct fake_sysfs fs;
    strcpy(fs.root, "/tmp/pf-cuda-sysfs-XXXXXX");
    assert_non_null(mkdtemp(fs.root));
    sysfs_put(&fs, "0000:3b:00.0", "1\n");
    sysfs_put(&fs, "0000:af:00.0", "-1\n");
    sysfs_put(&fs, "0000:18:00.0", "garbage\n");
    sysfs_put(&fs, "0000:19:00.0", "");
    sysfs_put(&fs, "0000:86:00.0", "3");
    /* CUDA's spelling (upper case, 8-digit domain) finds the lower-case sysfs entry */
    assert_int_equal(pf_cuda_numa_node(fs.root, "0000:3B:00.0"), 1);
    assert_int_equal(pf_cuda_numa_node(fs.root, "00000000:3b:00.0"), 1);
    assert_int_equal(pf_cuda_numa_node(fs.root, "0000:86:00.0"), 3);
    assert_int_equal(pf_cuda_numa_node(fs.root, "0000:AF:00.0"), -1); /* kernel says -1 */
    assert_int_equal(pf_cuda_numa_node(fs.root, "0000:18:00.0"), -1); /* unparsable */
    assert_int_equal(pf_cuda_numa_node(fs.root, "0000:19:00.0"), -1); /* empty */
    assert_int_equal(pf_cuda_numa_node(fs.root, "0000:5e:00.0"), -1); /* missing */
    assert_int_equal(pf_cuda_numa_node(fs.root, "not-a-bus-id"), -1);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fs.root);
    assert_int_equal(system(cmd), 0);
}

static void test_uuid_format(void **st)
{
    const uint8_t u[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
                           0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
    char b[48];
    pf_cuda_uuid_format(u, b, sizeof(b));
    assert_string_equal(b, "GPU-12345678-9abc-def0-0123-456789abcdef");
    char small[8];
    pf_cuda_uuid_format(u, small, sizeof(small));
    assert_string_equal(small, "GPU-123");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errno_table),
        cmocka_unit_test(test_sticky_codes),
        cmocka_unit_test(test_errno_unknown_codes_are_eio),
        cmocka_unit_test(test_errno_every_code_negative),
        cmocka_unit_test(test_no_gpu_codes),
        cmocka_unit_test(test_busid_normalize),
        cmocka_unit_test(test_numa_node_from_sysfs),
        cmocka_unit_test(test_uuid_format),
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

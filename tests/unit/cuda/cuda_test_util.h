/* Helpers shared by test_cuda.c and test_cuda_open.c: loading the fake driver library
 * (fake_cuda.c) the way the backend does, a fake /dev, log capture, a rig of one mapped
 * allocation + one registration + one stream. Included by one test file per binary. */
#ifndef PF_TEST_CUDA_TEST_UTIL_H
#define PF_TEST_CUDA_TEST_UTIL_H

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "pf/hal.h"
#include "pf/log.h"

#include "cuda_internal.h"

#define PF_UNUSED __attribute__((unused))

static char fake_path[PATH_MAX + 32] PF_UNUSED;
static char devdir_nodes[64] PF_UNUSED, devdir_empty[64] PF_UNUSED;
static struct fake_cu *fk_ PF_UNUSED;
static void (*fake_reset_)(int) PF_UNUSED;
static int (*fake_export_)(int, size_t, CUipcMemHandle *) PF_UNUSED;
static void (*fake_uuid_)(int, uint8_t *) PF_UNUSED;
#define fk (*fk_)

/* dlopens <O>/tests/fakes/libpffakecuda.so (the backend's dlopen of the same path then
 * returns this instance) and makes a /dev with and one without NVIDIA nodes. */
static inline void fake_lib_load(void)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        abort();
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    /* <O>/tests/unit/cuda/test_x -> <O>/tests/fakes/ (outside tests/unit, whose
     * executables tests/run.sh runs) */
    snprintf(fake_path, sizeof(fake_path), "%s/../../fakes/libpffakecuda.so", exe);
    void *h = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load the fake driver %s: %s\n", fake_path, dlerror());
        abort();
    }
    fk_ = ((struct fake_cu * (*)(void)) dlsym(h, "fake_cu_state"))();
    *(void **)&fake_reset_ = dlsym(h, "fake_cu_reset");
    *(void **)&fake_export_ = dlsym(h, "fake_cu_export");
    *(void **)&fake_uuid_ = dlsym(h, "fake_cu_uuid");
    if (!fk_ || !fake_reset_ || !fake_export_ || !fake_uuid_)
        abort();
    snprintf(devdir_nodes, sizeof(devdir_nodes), "/tmp/pf-cuda-dev-XXXXXX");
    snprintf(devdir_empty, sizeof(devdir_empty), "/tmp/pf-cuda-nodev-XXXXXX");
    if (!mkdtemp(devdir_nodes) || !mkdtemp(devdir_empty))
        abort();
    char node[128];
    snprintf(node, sizeof(node), "%s/nvidiactl", devdir_nodes);
    FILE *f = fopen(node, "w");
    if (!f)
        abort();
    fclose(f);
}

static inline void fake_lib_cleanup(void)
{
    char node[128];
    snprintf(node, sizeof(node), "%s/nvidiactl", devdir_nodes);
    unlink(node);
    rmdir(devdir_nodes);
    rmdir(devdir_empty);
}

/* Use the fake driver with ndev GPUs; nodes: whether /dev shows NVIDIA device nodes. */
static inline void fake_use(int ndev, bool nodes)
{
    fake_reset_(ndev);
    pf_cuda_test_set_driver(fake_path);
    pf_cuda_test_set_devdir(nodes ? devdir_nodes : devdir_empty);
}

static inline void fake_unuse(void)
{
    pf_cuda_test_set_driver(NULL);
    pf_cuda_test_set_devdir(NULL);
    pf_cuda_test_set_reg_chunk(0);
}

/* Runs fn with the log captured into buf (NUL-terminated). */
static inline void capture_log(char *buf, size_t len, void (*fn)(void *), void *arg)
{
    FILE *f = tmpfile();
    if (!f)
        abort();
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
    struct pf_gpu_config cfg;
    int rc;
    struct pf_gpu *g;
    char chosen[32];
    char err[256];
};

static inline void do_open(void *p)
{
    struct open_call *c = p;
    c->rc = pf_hal_gpu_open(c->name, &c->cfg, &c->g, c->chosen, sizeof(c->chosen), c->err,
                            sizeof(c->err));
}

static inline struct pf_gpu *fake_open(const int *devs, size_t n)
{
    struct pf_gpu_config cfg = {.devices = devs, .ndevices = n};
    struct pf_gpu *g = NULL;
    char err[256];
    int rc = pf_hal_gpu_open("cuda", &cfg, &g, NULL, 0, err, sizeof(err));
    if (rc)
        fail_msg("open cuda (fake): %s", err);
    return g;
}

static inline struct pf_ipc_desc fake_desc(int dev, const CUipcMemHandle *h, uint64_t off,
                                           uint64_t size)
{
    struct pf_ipc_desc d = {.kind = PF_IPC_CUDA, .has_uuid = true, .offset = off, .size = size};
    fake_uuid_(dev, d.device_uuid);
    memcpy(d.cuda_handle, h, 64);
    return d;
}

static inline void pattern(uint8_t *p, size_t len, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

/* After a test: every stream, event, context, IPC handle and registration released (a
 * dead backend leaves its CUDA objects to the process exit: not checked then). */
static inline void fake_check_released(void)
{
    if (!fk.sticky) {
        assert_int_equal(fk.streams, 0);
        assert_int_equal(fk.events, 0);
        assert_int_equal(fk.contexts, 0);
        assert_int_equal(fk.modules, 0);
        for (int i = 0; i < fk.nallocs; i++)
            assert_int_equal(fk.allocs[i].opened, 0);
        for (int i = 0; i < FAKE_MAX_REGS; i++)
            assert_null(fk.regs[i].p);
        assert_int_equal(fk.mallocs, fk.frees);
        assert_int_equal(fk.host_allocs, fk.host_frees);
    }
    fake_unuse();
}

/* A device allocation of 64 blocks of 64 KiB on CUDA device 1, mapped, a registered host
 * buffer and a stream (HAL device 0 = CUDA device 1). */
struct fake_rig {
    struct pf_gpu *g;
    struct pf_gpu_mapping *m;
    struct pf_gpu_host_reg *r;
    struct pf_gpu_stream *s;
    uint8_t *dev, *host;
    size_t len;
};

#define RIG_BLK  (64u * 1024u)
#define RIG_NBLK 64u

static inline void rig_up(struct fake_rig *rig)
{
    int one = 1;
    rig->g = fake_open(&one, 1);
    rig->len = (size_t)RIG_BLK * RIG_NBLK;
    CUipcMemHandle h;
    int i = fake_export_(1, rig->len, &h);
    rig->dev = fk.allocs[i].p;
    struct pf_ipc_desc d = fake_desc(1, &h, 0, rig->len);
    assert_int_equal(pf_gpu_ipc_open(rig->g, &d, &rig->m), 0);
    rig->host = aligned_alloc(4096, rig->len);
    assert_non_null(rig->host);
    assert_int_equal(pf_gpu_host_register(rig->g, rig->host, rig->len, &rig->r), 0);
    assert_int_equal(pf_gpu_stream_create(rig->g, rig->m->device, &rig->s), 0);
}

static inline void rig_down(struct fake_rig *rig)
{
    fk.not_ready = 0;
    pf_gpu_stream_destroy(rig->s);
    pf_gpu_host_unregister(rig->r);
    pf_gpu_ipc_close(rig->m);
    pf_gpu_close(rig->g);
    free(rig->host);
}

#endif

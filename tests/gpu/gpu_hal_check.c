/* gpu_hal_check: the CUDA GPU backend exercised through the HAL on a real GPU, without the
 * engine.
 *
 * A child process plays the vLLM worker: it allocates two device buffers A and B, exports
 * their IPC handles and device UUID, and loads or dumps their contents on request through
 * a host mapping shared with the parent. The parent opens the "cuda" backend, imports A as
 * two views (one opened handle, refcounted) and B, registers host memory and copies 64 KiB
 * blocks both ways in both transfer modes: runs of adjacent blocks in shuffled order (they
 * merge), and blocks cut into pieces with unaligned, non-adjacent boundaries (the kernel's
 * 4-byte and byte paths). Every byte is compared. Then it times sequential and scattered
 * copies against pinned cudaMemcpy of the same bytes, and checks the error paths.
 *
 * Usage: gpu_hal_check [--device N] [--owner-visible LIST] [--mib-a N] [--mib-b N]
 *                      [--seed S] [--reps N]
 * --owner-visible sets CUDA_VISIBLE_DEVICES for the child only (it then uses its device
 * 0): the backend must still find the memory by UUID.
 * Exits 0 (pass), 1 (fail), 77 (no usable GPU). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pf/hal.h"
#include "pf/log.h"

#include "gpu_common.h"

#define BS (64u * 1024u)

enum { OP_READY = 1, OP_LOAD, OP_DUMP, OP_EXIT };

struct msg {
    int op;
    int status; /* CUDA error code of the owner's operation, 0 = ok */
    uint64_t size[2];
    uint8_t uuid[16];
    uint8_t handle[2][64];
    char text[256];
};

struct opts {
    int device;
    const char *owner_visible;
    uint64_t size_a, size_b;
    uint64_t seed;
    int reps;
};

struct pdesc {
    uint64_t dev_off; /* in the A|B space: A at 0, B at size_a */
    uint64_t host_off;
    uint64_t len;
};

struct ctx {
    const struct opts *o;
    int fd;
    uint8_t *shm; /* shared with the owner: A then B */
    uint64_t total;
    struct pf_gpu *g;
    struct pf_gpu_mapping *ma1, *ma2, *mb;
    struct pf_gpu_host_reg *reg;
    struct pf_gpu_stream *s;
    uint8_t *host;
    int cuda_dev; /* CUDA ordinal (this process) of the mappings' device */
    int failures;
};

#define CHECK(c, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            (c)->failures++;                                                                       \
        }                                                                                          \
    } while (0)

static int msg_send(int fd, const struct msg *m)
{
    return send(fd, m, sizeof(*m), 0) == (ssize_t)sizeof(*m) ? 0 : -1;
}

static int msg_recv(int fd, struct msg *m)
{
    return recv(fd, m, sizeof(*m), 0) == (ssize_t)sizeof(*m) ? 0 : -1;
}

/* ------------------------------------------------------------------ owner (child) */

static int owner_main(int fd, const struct opts *o, uint8_t *shm)
{
    if (o->owner_visible)
        setenv("CUDA_VISIBLE_DEVICES", o->owner_visible, 1);
    int dev = o->owner_visible ? 0 : o->device;
    struct msg m = {.op = OP_READY, .size = {o->size_a, o->size_b}};
    void *buf[2] = {NULL, NULL};
    struct cudaDeviceProp p;
    cudaError_t e = cudaSetDevice(dev);
    for (int i = 0; i < 2 && e == cudaSuccess; i++)
        e = cudaMalloc(&buf[i], m.size[i]);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        cudaIpcMemHandle_t h;
        e = cudaIpcGetMemHandle(&h, buf[i]);
        memcpy(m.handle[i], &h, sizeof(h));
    }
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&p, dev);
    if (e == cudaSuccess)
        memcpy(m.uuid, p.uuid.bytes, 16);
    m.status = (int)e;
    if (e != cudaSuccess)
        snprintf(m.text, sizeof(m.text), "%s (CUDA error %d)", cudaGetErrorString(e), (int)e);
    if (msg_send(fd, &m) || e != cudaSuccess)
        return 1;
    for (;;) {
        if (msg_recv(fd, &m))
            return 1; /* parent gone */
        if (m.op == OP_EXIT)
            break;
        e = cudaSuccess;
        if (m.op == OP_LOAD) {
            e = cudaMemcpy(buf[0], shm, o->size_a, cudaMemcpyHostToDevice);
            if (e == cudaSuccess)
                e = cudaMemcpy(buf[1], shm + o->size_a, o->size_b, cudaMemcpyHostToDevice);
        } else if (m.op == OP_DUMP) {
            e = cudaMemcpy(shm, buf[0], o->size_a, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess)
                e = cudaMemcpy(shm + o->size_a, buf[1], o->size_b, cudaMemcpyDeviceToHost);
        }
        m.status = (int)e;
        snprintf(m.text, sizeof(m.text), "%s", cudaGetErrorString(e));
        if (msg_send(fd, &m))
            return 1;
    }
    cudaFree(buf[0]);
    cudaFree(buf[1]);
    return 0;
}

static int owner_do(struct ctx *c, int op)
{
    struct msg m = {.op = op};
    if (msg_send(c->fd, &m) || msg_recv(c->fd, &m)) {
        printf("FAIL: the owner process is gone\n");
        exit(1);
    }
    if (m.status) {
        printf("FAIL: owner op %d: %s\n", op, m.text);
        exit(1);
    }
    return 0;
}

/* ------------------------------------------------------------------ plans */

static uint64_t rng_next(uint64_t *st)
{
    *st += 1;
    return gc_splitmix(*st);
}

/* A copy plan over the whole A|B space: host block k <- device block perm[k]. scatter:
 * runs of 1..8 adjacent blocks in shuffled order; cut: every 5th block cut into three
 * pieces placed in reverse order on the host (not adjacent, unaligned). */
static size_t make_plan(uint64_t total, uint64_t seed, bool scatter, bool cut, struct pdesc **out)
{
    size_t nblk = total / BS;
    size_t *perm = calloc(nblk, sizeof(*perm));
    size_t *runs = calloc(nblk + 1, sizeof(*runs));
    struct pdesc *d = calloc(nblk * 3, sizeof(*d));
    if (!perm || !runs || !d) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    uint64_t st = seed;
    size_t nruns = 0;
    for (size_t b = 0; b < nblk;) {
        runs[nruns++] = b;
        b += scatter ? 1 + rng_next(&st) % 8 : nblk;
    }
    runs[nruns] = nblk;
    size_t *order = calloc(nruns, sizeof(*order));
    if (!order)
        exit(1);
    for (size_t i = 0; i < nruns; i++)
        order[i] = i;
    for (size_t i = nruns; scatter && i > 1; i--) {
        size_t j = rng_next(&st) % i;
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    size_t k = 0;
    for (size_t r = 0; r < nruns; r++) {
        size_t start = runs[order[r]], end = runs[order[r] + 1];
        for (size_t b = start; b < end; b++)
            perm[k++] = b;
    }
    size_t n = 0;
    for (k = 0; k < nblk; k++) {
        uint64_t dev = (uint64_t)perm[k] * BS, host = (uint64_t)k * BS;
        if (cut && k % 5 == 0) {
            d[n++] = (struct pdesc){dev, host + BS - 1000, 1000};
            d[n++] = (struct pdesc){dev + 1000, host + BS - 1003, 3};
            d[n++] = (struct pdesc){dev + 1003, host, BS - 1003};
        } else {
            d[n++] = (struct pdesc){dev, host, BS};
        }
    }
    free(order);
    free(runs);
    free(perm);
    *out = d;
    return n;
}

static pf_devptr_t dev_addr(struct ctx *c, uint64_t off)
{
    uint64_t half = c->o->size_a / 2;
    if (off < half)
        return c->ma1->base + off;
    if (off < c->o->size_a)
        return c->ma2->base + (off - half);
    return c->mb->base + (off - c->o->size_a);
}

static struct pf_copy_desc *to_copy(struct ctx *c, const struct pdesc *p, size_t n)
{
    struct pf_copy_desc *d = calloc(n, sizeof(*d));
    if (!d)
        exit(1);
    for (size_t i = 0; i < n; i++)
        d[i] = (struct pf_copy_desc){dev_addr(c, p[i].dev_off), c->host + p[i].host_off, p[i].len};
    return d;
}

/* Submits d in `batches` copy_batch calls and one sync. Returns the elapsed seconds. */
static double run_copies(struct ctx *c, enum pf_copy_dir dir, enum pf_copy_mode mode,
                         const struct pf_copy_desc *d, size_t n, int batches, const char *what)
{
    double t0 = gc_now();
    size_t per = (n + (size_t)batches - 1) / (size_t)batches;
    for (size_t i = 0; i < n; i += per) {
        size_t m = n - i < per ? n - i : per;
        int rc = pf_gpu_copy_batch(c->s, dir, mode, d + i, m);
        CHECK(c, rc == 0, "%s: copy_batch: %s", what, strerror(-rc));
    }
    int rc = pf_gpu_stream_sync(c->s, 60000);
    CHECK(c, rc == 0, "%s: stream_sync: %s", what, strerror(-rc));
    return gc_now() - t0;
}

static const char *mode_name(enum pf_copy_mode m)
{
    return m == PF_COPY_MODE_KERNEL ? "kernel" : "direct";
}

/* Byte-exact D2H and H2D of a scattered plan in one mode. */
static void check_mode(struct ctx *c, enum pf_copy_mode mode)
{
    struct pdesc *p;
    size_t n = make_plan(c->total, c->o->seed + (uint64_t)mode, true, true, &p);
    struct pf_copy_desc *d = to_copy(c, p, n);
    char what[64];

    snprintf(what, sizeof(what), "D2H %s", mode_name(mode));
    gc_fill(c->shm, c->total, c->o->seed, 100 + (uint64_t)mode);
    owner_do(c, OP_LOAD);
    memset(c->host, 0x5a, c->total);
    run_copies(c, PF_COPY_D2H, mode, d, n, 3, what);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(c->host + p[i].host_off, c->shm + p[i].dev_off, p[i].len) != 0) {
            if (bad++ < 5)
                printf("FAIL: %s: descriptor %zu (device +%llu -> host +%llu, %llu bytes) "
                       "differs\n",
                       what, i, (unsigned long long)p[i].dev_off, (unsigned long long)p[i].host_off,
                       (unsigned long long)p[i].len);
        }
    }
    c->failures += bad != 0;
    printf("%-12s %zu descriptors, %llu bytes: %s\n", what, n, (unsigned long long)c->total,
           bad ? "MISMATCH" : "byte-exact");

    snprintf(what, sizeof(what), "H2D %s", mode_name(mode));
    gc_fill(c->host, c->total, c->o->seed, 200 + (uint64_t)mode);
    memset(c->shm, 0, c->total);
    owner_do(c, OP_LOAD);
    run_copies(c, PF_COPY_H2D, mode, d, n, 3, what);
    owner_do(c, OP_DUMP);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(c->shm + p[i].dev_off, c->host + p[i].host_off, p[i].len) != 0) {
            if (bad++ < 5)
                printf("FAIL: %s: descriptor %zu (host +%llu -> device +%llu, %llu bytes) "
                       "differs\n",
                       what, i, (unsigned long long)p[i].host_off, (unsigned long long)p[i].dev_off,
                       (unsigned long long)p[i].len);
        }
    }
    c->failures += bad != 0;
    printf("%-12s %zu descriptors, %llu bytes: %s\n", what, n, (unsigned long long)c->total,
           bad ? "MISMATCH" : "byte-exact");
    free(d);
    free(p);
}

static void bandwidth(struct ctx *c)
{
    double base_d2h, base_h2d;
    GC_CUDA(cudaSetDevice(c->cuda_dev));
    gc_memcpy_baseline(c->total, c->o->reps, &base_d2h, &base_h2d);
    printf("\n%-28s %10s %10s %8s %8s\n", "HAL copies (GB/s)", "D2H", "H2D", "D2H/cpy", "H2D/cpy");
    printf("%-28s %10.2f %10.2f %8s %8s\n", "cudaMemcpy pinned", base_d2h, base_h2d, "1.00",
           "1.00");
    for (int scatter = 0; scatter < 2; scatter++) {
        struct pdesc *p;
        size_t n = make_plan(c->total, c->o->seed, scatter, false, &p);
        struct pf_copy_desc *d = to_copy(c, p, n);
        for (int mode = 0; mode < 2; mode++) {
            double best[2] = {0, 0};
            for (int r = 0; r < c->o->reps; r++) {
                for (int dir = 0; dir < 2; dir++) {
                    double t =
                        run_copies(c, dir ? PF_COPY_H2D : PF_COPY_D2H, mode, d, n, 1, "bandwidth");
                    if (gc_gbps(c->total, t) > best[dir])
                        best[dir] = gc_gbps(c->total, t);
                }
            }
            char name[64];
            snprintf(name, sizeof(name), "%s %s (%zu descs)", mode_name(mode),
                     scatter ? "scattered" : "sequential", n);
            printf("%-28s %10.2f %10.2f %8.2f %8.2f\n", name, best[0], best[1],
                   base_d2h > 0 ? best[0] / base_d2h : 0, base_h2d > 0 ? best[1] / base_h2d : 0);
        }
        free(d);
        free(p);
    }
    printf("\n");
}

static void check_errors(struct ctx *c, const struct msg *ready)
{
    struct pf_gpu_mapping *m = NULL;
    struct pf_ipc_desc d = {.kind = PF_IPC_SIM_SHM, .size = BS};
    strcpy(d.shm_name, "/pf-gpu-check");
    CHECK(c, pf_gpu_ipc_open(c->g, &d, &m) == -EINVAL, "SIM_SHM IpcTensor not refused");
    d = (struct pf_ipc_desc){.kind = PF_IPC_CUDA, .has_uuid = true, .size = BS};
    memset(d.device_uuid, 0xee, 16);
    memcpy(d.cuda_handle, ready->handle[1], 64);
    CHECK(c, pf_gpu_ipc_open(c->g, &d, &m) == -ENODEV, "unknown device UUID not refused");
    memcpy(d.device_uuid, ready->uuid, 16);
    d.offset = c->o->size_b;
    d.size = 1ull << 40;
    int rc = pf_gpu_ipc_open(c->g, &d, &m);
    if (rc == 0) {
        printf("note: IpcTensor bounds not checked (driver lacks cuMemGetAddressRange)\n");
        pf_gpu_ipc_close(m);
    } else {
        CHECK(c, rc == -ERANGE, "IpcTensor beyond its allocation: %s, want ERANGE", strerror(-rc));
    }
    /* device range past the end of B's mapping */
    struct pf_copy_desc cd = {c->mb->base + c->mb->size - 4096, c->host, 8192};
    rc = pf_gpu_copy_batch(c->s, PF_COPY_D2H, PF_COPY_MODE_DIRECT, &cd, 1);
    CHECK(c, rc == -EFAULT, "copy past the end of a mapping: %s, want EFAULT", strerror(-rc));
    /* host memory that is not registered */
    uint8_t *unreg = malloc(8192);
    cd = (struct pf_copy_desc){c->mb->base, unreg, 8192};
    rc = pf_gpu_copy_batch(c->s, PF_COPY_D2H, PF_COPY_MODE_KERNEL, &cd, 1);
    CHECK(c, rc == -EFAULT, "copy to unregistered host memory: %s, want EFAULT", strerror(-rc));
    /* host range running past the registration */
    cd = (struct pf_copy_desc){c->mb->base, c->host + c->total - 4096, 8192};
    rc = pf_gpu_copy_batch(c->s, PF_COPY_H2D, PF_COPY_MODE_DIRECT, &cd, 1);
    CHECK(c, rc == -EFAULT, "copy past the host registration: %s, want EFAULT", strerror(-rc));
    free(unreg);
    rc = pf_gpu_stream_sync(c->s, 0);
    CHECK(c, rc == 0, "sync of an idle stream with timeout 0: %s", strerror(-rc));
    printf("error paths checked\n");
}

/* ------------------------------------------------------------------ parent */

static int parent_main(int fd, const struct opts *o, uint8_t *shm)
{
    struct ctx c = {.o = o, .fd = fd, .shm = shm, .total = o->size_a + o->size_b};
    struct msg ready;
    if (msg_recv(fd, &ready) || ready.op != OP_READY) {
        printf("FAIL: the owner process did not start\n");
        return 1;
    }
    if (ready.status == cudaErrorInsufficientDriver || ready.status == cudaErrorNoDevice) {
        printf("SKIP: no usable CUDA GPU (%s)\n", ready.text);
        return 77;
    }
    if (ready.status) {
        printf("FAIL: owner: %s\n", ready.text);
        return 1;
    }
    char uuid[48];
    gc_uuid_str(ready.uuid, uuid, sizeof(uuid));
    printf("owner: A %llu MiB, B %llu MiB on %s%s%s\n", (unsigned long long)(o->size_a >> 20),
           (unsigned long long)(o->size_b >> 20), uuid,
           o->owner_visible ? ", owner CUDA_VISIBLE_DEVICES=" : "",
           o->owner_visible ? o->owner_visible : "");

    char chosen[32], err[256];
    int rc = pf_hal_gpu_open("cuda", NULL, &c.g, chosen, sizeof(chosen), err, sizeof(err));
    if (rc) {
        printf("FAIL: open cuda backend: %s\n", err);
        return 1;
    }
    struct pf_ipc_desc d = {.kind = PF_IPC_CUDA, .has_uuid = true};
    memcpy(d.device_uuid, ready.uuid, 16);
    memcpy(d.cuda_handle, ready.handle[0], 64);
    d.offset = 0;
    d.size = o->size_a / 2;
    rc = pf_gpu_ipc_open(c.g, &d, &c.ma1);
    if (rc == 0) {
        d.offset = o->size_a / 2;
        rc = pf_gpu_ipc_open(c.g, &d, &c.ma2); /* same handle: shares the opened allocation */
    }
    struct pf_gpu_mapping *extra = NULL;
    if (rc == 0) {
        d.offset = BS;
        d.size = BS;
        rc = pf_gpu_ipc_open(c.g, &d, &extra);
    }
    if (rc == 0) {
        pf_gpu_ipc_close(extra); /* must not close the handle the other views use */
        memcpy(d.cuda_handle, ready.handle[1], 64);
        d.offset = 0;
        d.size = o->size_b;
        rc = pf_gpu_ipc_open(c.g, &d, &c.mb);
    }
    if (rc) {
        printf("FAIL: ipc_open: %s\n", strerror(-rc));
        return 1;
    }
    CHECK(&c, c.ma2->base == c.ma1->base + o->size_a / 2, "views of one allocation disagree");
    struct pf_gpu_dev_info info;
    pf_gpu_device_info(c.g, c.ma1->device, &info);
    c.cuda_dev = info.index;
    printf("server side: HAL device %d = CUDA %d (%s), NUMA node %d, PCI %s\n", c.ma1->device,
           info.index, info.name, info.numa_node, info.pci_bus_id);
    c.host = mmap(NULL, c.total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c.host == MAP_FAILED) {
        printf("FAIL: mmap host buffer\n");
        return 1;
    }
    rc = pf_gpu_host_register(c.g, c.host, c.total, &c.reg);
    if (rc == 0)
        rc = pf_gpu_stream_create(c.g, c.ma1->device, &c.s);
    if (rc) {
        printf("FAIL: host_register/stream_create: %s\n", strerror(-rc));
        return 1;
    }

    check_mode(&c, PF_COPY_MODE_DIRECT);
    check_mode(&c, PF_COPY_MODE_KERNEL);
    check_errors(&c, &ready);
    bandwidth(&c);

    pf_gpu_stream_destroy(c.s);
    pf_gpu_ipc_close(c.ma1);
    pf_gpu_ipc_close(c.ma2);
    /* every view of A closed: the handle was closed, so it opens again */
    memcpy(d.cuda_handle, ready.handle[0], 64);
    d.offset = 0;
    d.size = o->size_a;
    struct pf_gpu_mapping *again = NULL;
    rc = pf_gpu_ipc_open(c.g, &d, &again);
    CHECK(&c, rc == 0, "re-opening A after closing all its views: %s", strerror(-rc));
    pf_gpu_ipc_close(again);
    pf_gpu_ipc_close(c.mb);
    pf_gpu_host_unregister(c.reg);
    munmap(c.host, c.total);
    pf_gpu_close(c.g);
    struct msg bye = {.op = OP_EXIT};
    msg_send(fd, &bye);
    printf("gpu_hal_check: %s (seed %llu)\n", c.failures ? "FAIL" : "PASS",
           (unsigned long long)o->seed);
    return c.failures ? 1 : 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: gpu_hal_check [--device N] [--owner-visible LIST] [--mib-a N] "
                    "[--mib-b N] [--seed S] [--reps N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct opts o = {.device = 0, .size_a = 256ull << 20, .size_b = 128ull << 20, .reps = 5};
    o.seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (strcmp(a, "--device") == 0)
            o.device = atoi(v);
        else if (strcmp(a, "--owner-visible") == 0)
            o.owner_visible = v;
        else if (strcmp(a, "--mib-a") == 0)
            o.size_a = strtoull(v, NULL, 0) << 20;
        else if (strcmp(a, "--mib-b") == 0)
            o.size_b = strtoull(v, NULL, 0) << 20;
        else if (strcmp(a, "--seed") == 0)
            o.seed = strtoull(v, NULL, 0);
        else if (strcmp(a, "--reps") == 0)
            o.reps = atoi(v);
        else
            usage();
        i++;
    }
    /* A splits into two views at a block boundary */
    if (o.size_a < 2 * BS || o.size_a % (2 * BS) || o.size_b < BS || o.size_b % BS || o.reps < 1)
        usage();
    printf("gpu_hal_check: seed %llu\n", (unsigned long long)o.seed);
    fflush(stdout);
    uint64_t total = o.size_a + o.size_b;
    uint8_t *shm = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int sv[2];
    if (shm == MAP_FAILED || socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
        perror("gpu_hal_check: setup");
        return 1;
    }
    /* fork before anything touches CUDA: a CUDA context does not survive fork */
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        _exit(owner_main(sv[1], &o, shm));
    }
    close(sv[1]);
    int rc = parent_main(sv[0], &o, shm);
    close(sv[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        printf("FAIL: owner process exited with status %d\n", status);
        rc = 1;
    }
    return rc;
}

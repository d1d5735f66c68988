/* CUDA GPU backend ("cuda"): the GPU HAL on the CUDA driver API, loaded at run time
 * (cuda_drv.c; no CUDA library is linked, so one binary runs on R535+ drivers whatever
 * toolkit built it, and starts on machines without a driver).
 *
 * Open: the driver library is loaded, cuInit, cuDeviceGetCount, filtered by --devices
 * (CUDA ordinals as this process sees them); each device's UUID, name, PCI bus id and
 * NUMA node (sysfs of the PCI device) are read once and its primary context is retained;
 * the copy kernel (embedded PTX) is loaded into each context. The driver version, the API
 * version the entry points were requested at and the kernel's PTX ISA are logged at
 * info. No GPU installed (no /dev/nvidiactl or /dev/nvidia0) and no usable CUDA ->
 * -ENODEV, "auto" falls back to sim. A GPU installed but CUDA unusable (driver too old,
 * library missing, exclusive-process mode held by another process, no device visible
 * although nodes exist) -> an error saying why and -ENOTRECOVERABLE: "auto" refuses to
 * start rather than silently running on the sim GPU.
 *
 * IPC import: an IpcTensor names its GPU by UUID (not by index, so CUDA_VISIBLE_DEVICES
 * differences between client and server do not matter) and carries the cudaIpcMemHandle
 * (CUipcMemHandle: the same 64 bytes) of the allocation plus the offset of the tensor
 * inside it. Several tensors are often views of one allocation and CUDA refuses to open a
 * handle twice in one context, so opened allocations are shared and refcounted by
 * (device, handle); the last ipc_close closes the handle. cuMemGetAddressRange checks the
 * view against the allocation's size.
 *
 * Sticky errors: after an error cuda.h documents as sticky (pf_cuda_sticky: 700, 719, ...)
 * every later CUDA call of the process fails the same way. The first one marks the
 * backend dead (logged at error once); from then on every operation answers
 * -ENOTRECOVERABLE without calling CUDA and health() reports why, so the server turns
 * unhealthy and its supervisor restarts it.
 *
 * Host memory: cuda_host.c; streams and copies: cuda_copy.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PF_LOG_MOD "cuda"
#include "pf/hal.h"
#include "pf/log.h"

#include "cuda_backend.h"

_Static_assert(sizeof(CUipcMemHandle) == sizeof(((struct pf_ipc_desc *)0)->cuda_handle),
               "IpcTensor handle size");

static const char *cuda_devdir = "/dev";

void pf_cuda_test_set_devdir(const char *dir)
{
    cuda_devdir = dir ? dir : "/dev";
}

static const struct pf_gpu_ops cuda_ops;

static const char *cu_str(struct cuda_gpu *g, CUresult e)
{
    const char *s = NULL;
    if (!g->cu.GetErrorString || g->cu.GetErrorString(e, &s) != CUDA_SUCCESS || !s)
        s = "unknown CUDA error";
    return s;
}

void cuda_mark_dead(struct cuda_gpu *g, CUresult e, const char *what)
{
    int zero = 0;
    if (!atomic_compare_exchange_strong(&g->dead, &zero, (int)e))
        return;
    pthread_mutex_lock(&g->dead_mu);
    snprintf(g->dead_why, sizeof(g->dead_why), "%.*s: %s (CUDA error %d)", (int)strcspn(what, "("),
             what, cu_str(g, e), (int)e);
    pthread_mutex_unlock(&g->dead_mu);
    pf_error("GPU context lost: %.*s: %s (CUDA error %d). CUDA documents this error as sticky: "
             "every further CUDA call of this process fails the same way, so saves and loads "
             "now fail, /health reports unhealthy, and the server must be restarted",
             (int)strcspn(what, "("), what, cu_str(g, e), (int)e);
}

int cuda_fail(struct cuda_gpu *g, CUresult e, const char *what, _Atomic bool *site_logged)
{
    if (pf_cuda_sticky(e)) {
        cuda_mark_dead(g, e, what);
        return -ENOTRECOVERABLE;
    }
    enum pf_log_level lvl = atomic_exchange(site_logged, true) ? PF_LOG_DEBUG : PF_LOG_WARN;
    if (pf_log_enabled(lvl))
        pf_log_write(lvl, PF_LOG_MOD, "%.*s: %s (CUDA error %d)", (int)strcspn(what, "("), what,
                     cu_str(g, e), (int)e);
    return pf_cuda_errno(e);
}

int cuda_ctx(struct cuda_gpu *g, int dev)
{
    int rc;
    CU_CALL(g, rc, CtxSetCurrent, g->devs[dev].ctx);
    return rc;
}

uint32_t cuda_new_id(struct cuda_gpu *g)
{
    return atomic_fetch_add(&g->next_id, 1) + 1;
}

/* ------------------------------------------------------------------ devices */

static int cuda_count(struct pf_gpu *pg)
{
    return cg(pg)->ndev;
}

static int cuda_info(struct pf_gpu *pg, int dev, struct pf_gpu_dev_info *info_p)
{
    struct cuda_gpu *g = cg(pg);
    if (dev < 0 || dev >= g->ndev)
        return -ENODEV;
    const struct cuda_dev *d = &g->devs[dev];
    memset(info_p, 0, sizeof(*info_p));
    info_p->index = d->ordinal;
    info_p->numa_node = d->numa;
    memcpy(info_p->uuid, d->uuid, sizeof(d->uuid));
    snprintf(info_p->name, sizeof(info_p->name), "%s", d->name);
    snprintf(info_p->pci_bus_id, sizeof(info_p->pci_bus_id), "%s", d->busid);
    info_p->total_mem = d->total_mem;
    /* two streams per direction: the next batch's upload and launch (or batched copy call)
     * is enqueued while the previous batch's DMA runs, instead of after its sync */
    info_p->copy_streams = 2;
    return 0;
}

static int cuda_health(struct pf_gpu *pg, char *why, size_t whylen)
{
    struct cuda_gpu *g = cg(pg);
    if (!cuda_is_dead(g))
        return 0;
    pthread_mutex_lock(&g->dead_mu);
    snprintf(why, whylen, "GPU context lost: %s; restart the server", g->dead_why);
    pthread_mutex_unlock(&g->dead_mu);
    return -ENOTRECOVERABLE;
}

/* ------------------------------------------------------------------ IPC import */

static int cuda_dev_by_uuid(struct cuda_gpu *g, const struct pf_ipc_desc *d)
{
    if (!d->has_uuid) {
        if (g->ndev == 1)
            return 0;
        pf_warn("IpcTensor without a device UUID, and this server opened %d GPUs: cannot tell "
                "which one holds it",
                g->ndev);
        return -EINVAL;
    }
    for (int i = 0; i < g->ndev; i++)
        if (memcmp(g->devs[i].uuid, d->device_uuid, 16) == 0)
            return i;
    char want[48];
    pf_cuda_uuid_format(d->device_uuid, want, sizeof(want));
    pf_warn("IpcTensor names %s, which is not one of the %d GPU(s) this server opened "
            "(check --devices and CUDA_VISIBLE_DEVICES of the server)",
            want, g->ndev);
    return -ENODEV;
}

/* Finds or opens the allocation of handle on dev. Caller holds g->ipc_mu. */
static int cuda_alloc_get(struct cuda_gpu *g, int dev, const uint8_t handle[64],
                          struct cuda_alloc **a_p)
{
    for (struct cuda_alloc *a = g->allocs; a; a = a->next) {
        if (a->dev == dev && memcmp(a->handle, handle, 64) == 0) {
            a->refs++;
            *a_p = a;
            return 0;
        }
    }
    struct cuda_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    int rc = cuda_ctx(g, dev);
    if (rc)
        goto err_free;
    CUipcMemHandle h;
    memcpy(&h, handle, sizeof(h));
    static _Atomic bool open_site;
    CUresult e = g->cu.IpcOpenMemHandle(&a->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (e != CUDA_SUCCESS) {
        rc = cuda_fail(g, e, "cuIpcOpenMemHandle", &open_site);
        /* a handle whose exporter is gone or that was never valid: "not found" */
        if (e == CUDA_ERROR_MAP_FAILED || e == CUDA_ERROR_INVALID_HANDLE)
            rc = -ENOENT;
        goto err_free;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (g->cu.MemGetAddressRange(&base, &size, a->base) == CUDA_SUCCESS && base == a->base)
        a->size = size;
    a->dev = dev;
    memcpy(a->handle, handle, 64);
    a->id = cuda_new_id(g);
    a->refs = 1;
    a->next = g->allocs;
    g->allocs = a;
    pf_debug("opened IPC allocation %u at 0x%llx (%llu bytes) on GPU %d", a->id,
             (unsigned long long)a->base, (unsigned long long)a->size, g->devs[dev].ordinal);
    *a_p = a;
    return 0;
err_free:
    free(a);
    return rc;
}

/* Drops one reference. Caller holds g->ipc_mu. */
static void cuda_alloc_put(struct cuda_gpu *g, struct cuda_alloc *a)
{
    if (--a->refs > 0)
        return;
    for (struct cuda_alloc **pp = &g->allocs; *pp; pp = &(*pp)->next) {
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    }
    if (!cuda_is_dead(g)) { /* a dead context is torn down by the process exit */
        int rc = cuda_ctx(g, a->dev);
        if (rc == 0)
            CU_CALL(g, rc, IpcCloseMemHandle, a->base);
    }
    pf_debug("closed IPC allocation %u on GPU %d", a->id, g->devs[a->dev].ordinal);
    free(a);
}

static int cuda_ipc_open(struct pf_gpu *pg, const struct pf_ipc_desc *d,
                         struct pf_gpu_mapping **m_p)
{
    struct cuda_gpu *g = cg(pg);
    if (d->kind == PF_IPC_SIM_SHM) {
        pf_warn("refusing IpcTensor of kind SIM_SHM (%s): the cuda GPU backend imports "
                "CUDA_IPC descriptors only; the client uses the sim GPU, start the server "
                "with --gpu-backend sim",
                d->shm_name);
        return -EINVAL;
    }
    if (d->kind != PF_IPC_CUDA) {
        pf_warn("refusing IpcTensor of kind %d: the cuda GPU backend imports CUDA_IPC "
                "descriptors only",
                (int)d->kind);
        return -EINVAL;
    }
    if (d->size == 0) {
        pf_warn("IpcTensor of 0 bytes");
        return -EINVAL;
    }
    uint64_t end;
    if (!pf_add_ok(d->offset, d->size, &end))
        return -ERANGE;
    if (cuda_is_dead(g))
        return -ENOTRECOVERABLE;
    int dev = cuda_dev_by_uuid(g, d);
    if (dev < 0)
        return dev;
    struct cuda_map *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    pthread_mutex_lock(&g->ipc_mu);
    struct cuda_alloc *a = NULL;
    int rc = cuda_alloc_get(g, dev, d->cuda_handle, &a);
    if (rc)
        goto err_unlock;
    uint64_t base = a->base, dev_end;
    if ((a->size && end > a->size) || !pf_add_ok(base, end, &dev_end)) {
        pf_warn("IpcTensor range [%llu, +%llu) exceeds its CUDA allocation of %llu bytes",
                (unsigned long long)d->offset, (unsigned long long)d->size,
                (unsigned long long)a->size);
        rc = -ERANGE;
        goto err_put;
    }
    m->alloc = a;
    m->base.gpu = pg;
    m->base.device = dev;
    m->base.base = base + d->offset;
    m->base.size = d->size;
    pthread_rwlock_wrlock(&g->lock);
    m->next = g->maps;
    g->maps = m;
    pthread_rwlock_unlock(&g->lock);
    pthread_mutex_unlock(&g->ipc_mu);
    *m_p = &m->base;
    return 0;
err_put:
    cuda_alloc_put(g, a);
err_unlock:
    pthread_mutex_unlock(&g->ipc_mu);
    free(m);
    return rc;
}

static void cuda_ipc_close(struct pf_gpu_mapping *mp)
{
    struct cuda_map *m = pf_container_of(mp, struct cuda_map, base);
    struct cuda_gpu *g = cg(mp->gpu);
    pthread_mutex_lock(&g->ipc_mu);
    pthread_rwlock_wrlock(&g->lock);
    for (struct cuda_map **pp = &g->maps; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    pthread_rwlock_unlock(&g->lock);
    cuda_alloc_put(g, m->alloc);
    pthread_mutex_unlock(&g->ipc_mu);
    free(m);
}

/* ------------------------------------------------------------------ open / close */

static void cuda_release_devs(struct cuda_gpu *g)
{
    for (int i = 0; i < g->ndev; i++) {
        struct cuda_dev *d = &g->devs[i];
        if (!d->ctx)
            continue;
        if (!cuda_is_dead(g)) {
            if (d->mod && g->cu.CtxSetCurrent(d->ctx) == CUDA_SUCCESS)
                g->cu.ModuleUnload(d->mod);
            g->cu.DevicePrimaryCtxRelease(d->dev);
        }
        d->ctx = NULL;
    }
}

static void cuda_close(struct pf_gpu *pg)
{
    struct cuda_gpu *g = cg(pg);
    /* the core closes its mappings and registrations first; anything left is released */
    while (g->maps)
        cuda_ipc_close(&g->maps->base);
    while (g->regs)
        cuda_host_unregister(&g->regs->base);
    cuda_release_devs(g);
    pf_cu_unload(&g->cu);
    pthread_rwlock_destroy(&g->lock);
    pthread_mutex_destroy(&g->ipc_mu);
    pthread_mutex_destroy(&g->dead_mu);
    free(g);
}

/* Loads the copy kernel into d's context. Failure leaves kernel mode unavailable on d. */
static void cuda_load_kernel(struct cuda_gpu *g, struct cuda_dev *d)
{
    static _Atomic bool site;
    CUresult e = g->cu.ModuleLoadData(&d->mod, pf_cuda_kernel_ptx);
    if (e == CUDA_SUCCESS)
        e = g->cu.ModuleGetFunction(&d->kfn, d->mod, PF_CUDA_KERNEL_NAME);
    if (e == CUDA_SUCCESS)
        return;
    int rc = cuda_fail(g, e, "cuModuleLoadData(copy kernel)", &site);
    (void)rc;
    pf_error("GPU %d (%s): the copy kernel (PTX ISA %s, sm_75) does not load: %s (CUDA error "
             "%d); TRANSFER_MODE_KERNEL copies on it fail, direct copies work",
             d->ordinal, d->name, PF_CUDA_PTX_ISA, cu_str(g, e), (int)e);
    if (d->mod)
        g->cu.ModuleUnload(d->mod);
    d->mod = NULL;
    d->kfn = NULL;
}

static int cuda_dev_probe(struct cuda_gpu *g, struct cuda_dev *d, int ordinal)
{
    int rc, attr = 0;
    d->ordinal = ordinal;
    CU_CALL(g, rc, DeviceGet, &d->dev, ordinal);
    if (rc)
        return rc;
    char name[256] = "";
    CU_CALL(g, rc, DeviceGetName, name, (int)sizeof(name), d->dev);
    if (rc)
        return rc;
    size_t nl = strnlen(name, sizeof(d->name) - 1); /* truncated to what the HAL carries */
    memcpy(d->name, name, nl);
    d->name[nl] = '\0';
    CUuuid u;
    CU_CALL(g, rc, DeviceGetUuid, &u, d->dev);
    if (rc)
        return rc;
    memcpy(d->uuid, u.bytes, sizeof(d->uuid));
    size_t total = 0;
    CU_CALL(g, rc, DeviceTotalMem, &total, d->dev);
    if (rc)
        return rc;
    d->total_mem = total;
    CU_CALL(g, rc, DeviceGetAttribute, &attr, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, d->dev);
    if (rc)
        return rc;
    d->can_map_host = attr != 0;
    char raw[32];
    CU_CALL(g, rc, DeviceGetPCIBusId, raw, (int)sizeof(raw), d->dev);
    if (rc)
        return rc;
    if (pf_cuda_busid_normalize(raw, d->busid, sizeof(d->busid)) != 0)
        snprintf(d->busid, sizeof(d->busid), "%s", raw);
    d->numa = pf_cuda_numa_node("/sys", d->busid);
    int mode = CU_COMPUTEMODE_DEFAULT;
    CU_CALL(g, rc, DeviceGetAttribute, &mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, d->dev);
    if (rc)
        return rc;
    /* the primary context now: errors show at start-up, not on the first copy */
    CUresult e = g->cu.DevicePrimaryCtxRetain(&d->ctx, d->dev);
    if (e != CUDA_SUCCESS) {
        d->ctx = NULL;
        if (mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS || mode == CU_COMPUTEMODE_PROHIBITED)
            pf_error("GPU %d (%s, %s) is in %s compute mode and refuses this process a context: "
                     "%s (CUDA error %d). Another process (the vLLM worker) owns it; set "
                     "`nvidia-smi -i %d -c DEFAULT`, or run vLLM and the server as clients of "
                     "one MPS daemon",
                     ordinal, d->name, d->busid,
                     mode == CU_COMPUTEMODE_PROHIBITED ? "prohibited" : "exclusive-process",
                     cu_str(g, e), (int)e, ordinal);
        else
            pf_error("GPU %d (%s): cuDevicePrimaryCtxRetain: %s (CUDA error %d)", ordinal, d->name,
                     cu_str(g, e), (int)e);
        return pf_cuda_errno(e) ? pf_cuda_errno(e) : -EIO;
    }
    rc = cuda_ctx(g, (int)(d - g->devs));
    if (rc)
        return rc;
    cuda_load_kernel(g, d);
    if (!d->can_map_host)
        pf_warn("GPU %d (%s) cannot map host memory: TRANSFER_MODE_KERNEL will fail on it", ordinal,
                d->name);
    char uuid[48];
    pf_cuda_uuid_format(d->uuid, uuid, sizeof(uuid));
    pf_info("GPU %d: %s %s, PCI %s, NUMA node %d, %llu MiB", ordinal, d->name, uuid, d->busid,
            d->numa, (unsigned long long)(d->total_mem >> 20));
    return 0;
}

/* Is an NVIDIA GPU installed (its device nodes exist)? */
static bool cuda_nodes(char *node, size_t len)
{
    static const char *const names[] = {"nvidiactl", "nvidia0"};
    for (size_t i = 0; i < 2; i++) {
        struct stat st;
        snprintf(node, len, "%s/%s", cuda_devdir, names[i]);
        if (stat(node, &st) == 0)
            return true;
    }
    return false;
}

/* "CUDA unusable": with device nodes present a loud refusal, else "no GPU here". */
static int cuda_unusable(bool nodes, const char *node, const char *why)
{
    if (nodes) {
        pf_error("a GPU is installed (%s exists) but CUDA cannot use it: %s. Refusing to fall "
                 "back to the sim GPU; fix the driver, or pass --gpu-backend sim to run without "
                 "the GPU",
                 node, why);
        return -ENOTRECOVERABLE;
    }
    pf_info("no usable CUDA GPU: %s", why);
    return -ENODEV;
}

static int cuda_open(const struct pf_gpu_config *cfg, struct pf_gpu **g_p)
{
    char node[512], why[400];
    bool nodes = cuda_nodes(node, sizeof(node));
    struct cuda_gpu *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    pthread_mutex_init(&g->ipc_mu, NULL);
    pthread_rwlock_init(&g->lock, NULL);
    pthread_mutex_init(&g->dead_mu, NULL);
    g->base.ops = &cuda_ops;
    int rc = pf_cu_load(NULL, &g->cu, why, sizeof(why));
    if (rc) {
        rc = cuda_unusable(nodes, node, why);
        goto err_free;
    }
    CUresult e = g->cu.Init(0);
    g->cu.initialised = e == CUDA_SUCCESS;
    if (e != CUDA_SUCCESS) {
        snprintf(why, sizeof(why), "cuInit: %s (CUDA error %d)", cu_str(g, e), (int)e);
        rc = cuda_unusable(nodes, node, why);
        goto err_free;
    }
    int ver = 0, count = 0;
    if (g->cu.DriverGetVersion(&ver) != CUDA_SUCCESS)
        ver = 0;
    g->cu.driver_version = ver;
    e = g->cu.DeviceGetCount(&count);
    if (e != CUDA_SUCCESS || count <= 0) {
        if (e == CUDA_SUCCESS)
            snprintf(why, sizeof(why), "cuDeviceGetCount: 0 devices");
        else
            snprintf(why, sizeof(why), "cuDeviceGetCount: %s (CUDA error %d)", cu_str(g, e),
                     (int)e);
        rc = cuda_unusable(nodes, node, why);
        goto err_free;
    }
    g->batch = g->cu.MemcpyBatchAsync && !(cfg && cfg->gpu_copy_batch == PF_GPU_COPY_BATCH_OFF);
    if (cfg && cfg->gpu_copy_batch == PF_GPU_COPY_BATCH_ON && !g->cu.MemcpyBatchAsync) {
        pf_error("--gpu-copy-batch on: this driver (CUDA %d.%d) has no cuMemcpyBatchAsync "
                 "(CUDA 12.8, R570 and newer)",
                 ver / 1000, ver % 1000 / 10);
        rc = -EOPNOTSUPP;
        goto err_free;
    }
    pf_info("CUDA driver %d.%d; driver API entry points at CUDA %d.%d; copy kernel PTX ISA %s "
            "(sm_75+, JIT by the driver); batched copies (cuMemcpyBatchAsync) %s",
            ver / 1000, ver % 1000 / 10, PF_CU_API_VERSION / 1000, PF_CU_API_VERSION % 1000 / 10,
            PF_CUDA_PTX_ISA,
            g->batch ? "on"
                     : (g->cu.MemcpyBatchAsync ? "off (--gpu-copy-batch off)"
                                               : "unavailable (driver < 12.8)"));
    size_t n = cfg && cfg->devices ? cfg->ndevices : (size_t)count;
    if (n == 0 || n > CUDA_MAX_DEVS) {
        pf_error("--devices: %zu devices requested, between 1 and %d supported", n, CUDA_MAX_DEVS);
        rc = -EINVAL;
        goto err_free;
    }
    for (size_t i = 0; i < n; i++) {
        int ord = cfg && cfg->devices ? cfg->devices[i] : (int)i;
        if (ord < 0 || ord >= count) {
            pf_error("--devices: CUDA device %d does not exist (this process sees %d: 0..%d)", ord,
                     count, count - 1);
            rc = -ENODEV;
            goto err_free;
        }
        g->ndev = (int)i + 1;
        rc = cuda_dev_probe(g, &g->devs[i], ord);
        if (rc) {
            if (nodes && rc == -ENODEV)
                rc = -ENOTRECOVERABLE; /* installed but refused: never the sim fallback */
            goto err_free;
        }
    }
    pf_info("CUDA backend: %d of %d GPU(s) opened", g->ndev, count);
    *g_p = &g->base;
    return 0;
err_free:
    cuda_release_devs(g);
    pf_cu_unload(&g->cu);
    pthread_rwlock_destroy(&g->lock);
    pthread_mutex_destroy(&g->ipc_mu);
    pthread_mutex_destroy(&g->dead_mu);
    free(g);
    return rc;
}

static const struct pf_gpu_ops cuda_ops = {
    .name = "cuda",
    .device_count = cuda_count,
    .device_info = cuda_info,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .copy_batch = cuda_copy_batch,
    .stream_sync = cuda_stream_sync,
    .health = cuda_health,
    .close = cuda_close,
};

static const struct pf_gpu_backend cuda_backend = {
    .name = "cuda",
    .hardware = 1,
    .ops = &cuda_ops,
    .open = cuda_open,
};

int pf_cuda_register(void)
{
    return pf_hal_register_gpu(&cuda_backend);
}

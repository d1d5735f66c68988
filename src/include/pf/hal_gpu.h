/* GPU hardware abstraction.
 *
 * One struct pf_gpu is opened per process (pf_hal_gpu_open) and covers every device the
 * backend manages. The core calls only the static inline wrappers below, never ops->
 * directly; unimplemented ops are filled with -EOPNOTSUPP stubs at registration, so no
 * wrapper needs a NULL check.
 *
 * Memory kinds are explicit: device memory is a pf_devptr_t (an opaque 64-bit address the
 * core must never dereference; the sim backend hands out addresses that are not mapped in
 * the process at all), host memory is a plain pointer that must be registered
 * (host_register) before a copy touches it.
 *
 * Backends: "cuda" (hw/cuda, the CUDA driver API loaded at run time + IPC handles), "sim" (sim/gpu,
 * POSIX shared memory "device memory" and engine threads doing the copies), and the
 * "faulty:<inner>" decorator (src/hal/fault_gpu.c) driven by the fault plan.
 *
 * Threading: a pf_gpu and its mappings may be used from any thread. A stream is used by
 * one thread at a time (its owner), which submits batches and syncs.
 *
 * Lost device: some GPU faults are not recoverable in-process (CUDA's sticky errors, e.g.
 * 700 illegal address, 719 launch failed: "any further CUDA work will return the same
 * error", cuda.h). After one, the backend is dead: every op that needs the device answers
 * -ENOTRECOVERABLE (streams are NOT usable again), health() answers -ENOTRECOVERABLE with
 * the reason, and the server reports itself unhealthy so its supervisor restarts it.
 * Teardown ops (ipc_close, host_unregister, stream_destroy, close) still free the
 * backend's own memory. */
#ifndef PF_HAL_GPU_H
#define PF_HAL_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef uint64_t pf_devptr_t;

enum pf_mem_kind {
    PF_MEM_HOST = 0,   /* pageable host memory */
    PF_MEM_PINNED = 1, /* host memory registered with the GPU backend */
    PF_MEM_DEVICE = 2, /* device memory: a pf_devptr_t, never dereferenced by the core */
};

enum pf_ipc_kind {
    PF_IPC_UNSPECIFIED = 0,
    PF_IPC_CUDA = 1,    /* IpcTensor.Kind.CUDA_IPC */
    PF_IPC_SIM_SHM = 2, /* IpcTensor.Kind.SIM_SHM */
};

/* Decoded IpcTensor (proto/engine.proto). */
struct pf_ipc_desc {
    enum pf_ipc_kind kind;
    bool has_uuid;
    uint8_t device_uuid[16];
    uint8_t cuda_handle[64];
    char shm_name[256];
    uint64_t offset; /* of the tensor storage inside the allocation / shm object */
    uint64_t size;   /* bytes of the tensor storage */
    int sim_device;
};

struct pf_gpu_dev_info {
    int index;     /* backend ordinal, what --devices names */
    int numa_node; /* -1 when unknown */
    uint8_t uuid[16];
    char name[64];
    char pci_bus_id[32];
    uint64_t total_mem;
    /* Streams per copy direction the engine keeps busy on this device (0 = 1): with more
     * than one, a batch is submitted while the previous one still drains (the engine's
     * gpu_worker.c; at most PF_COPY_STREAMS_MAX). */
    int copy_streams;
};

enum pf_copy_dir {
    PF_COPY_D2H = 1,
    PF_COPY_H2D = 2,
};

enum pf_copy_mode {
    PF_COPY_MODE_DIRECT = 0, /* TRANSFER_MODE_DIRECT: one async memcpy per merged range */
    PF_COPY_MODE_KERNEL = 1, /* TRANSFER_MODE_KERNEL: one copy-kernel launch per batch */
};

/* One contiguous copy between a device range and a registered host range. */
struct pf_copy_desc {
    pf_devptr_t dev;
    void *host;
    uint64_t len;
};

struct pf_gpu;

/* A mapped foreign allocation (an imported IpcTensor). base..base+size is the tensor's
 * storage in device address space. Backends embed this first. */
struct pf_gpu_mapping {
    struct pf_gpu *gpu;
    int device;
    pf_devptr_t base;
    uint64_t size;
};

struct pf_gpu_host_reg {
    struct pf_gpu *gpu;
    void *addr;
    size_t len;
};

struct pf_gpu_stream {
    struct pf_gpu *gpu;
    int device;
};

struct pf_gpu_ops {
    const char *name;
    /* Number of devices this backend opened (after --devices filtering). */
    int (*device_count)(struct pf_gpu *g);
    /* Info for device ordinal dev (0 <= dev < count). 0 or -ENODEV. */
    int (*device_info)(struct pf_gpu *g, int dev, struct pf_gpu_dev_info *info_p);
    /* Imports an IpcTensor. The mapping stays valid until ipc_close. Errors: -EINVAL (bad
     * descriptor, wrong kind for this backend), -ENODEV (device not found), -ENOENT (shm or
     * handle not found), -ERANGE (offset+size outside the allocation). */
    int (*ipc_open)(struct pf_gpu *g, const struct pf_ipc_desc *d, struct pf_gpu_mapping **m_p);
    void (*ipc_close)(struct pf_gpu_mapping *m);
    /* Registers host memory for copies (pinning/mapping). */
    int (*host_register)(struct pf_gpu *g, void *addr, size_t len, struct pf_gpu_host_reg **r_p);
    void (*host_unregister)(struct pf_gpu_host_reg *r);
    int (*stream_create)(struct pf_gpu *g, int dev, struct pf_gpu_stream **s_p);
    /* Waits for outstanding work (bounded by the backend), then frees. Accepts NULL. */
    void (*stream_destroy)(struct pf_gpu_stream *s);
    /* Enqueues n copies; returns without waiting. Every device range must lie inside one
     * mapping of the stream's device and every host range inside registered memory, else
     * -EFAULT and nothing of this call is enqueued (the sim checks everything first; CUDA
     * may have enqueued part of it: callers always stream_sync before reusing memory).
     * Host memory must stay valid until a stream_sync returned 0 or an error other than
     * -ETIMEDOUT. */
    int (*copy_batch)(struct pf_gpu_stream *s, enum pf_copy_dir dir, enum pf_copy_mode mode,
                      const struct pf_copy_desc *d, size_t n);
    /* Waits until every copy enqueued so far finished. Returns 0, the first error a copy
     * reported since the previous sync, or -ETIMEDOUT (work still in flight; call again).
     * After an ordinary error the stream is usable again; after -ENOTRECOVERABLE (the
     * device is lost, see above) it never is. */
    int (*stream_sync)(struct pf_gpu_stream *s, uint64_t timeout_ms);
    /* 0 while the backend can reach its devices; -ENOTRECOVERABLE once a device is lost,
     * with a sentence in why (what failed, what to do). Cheap, any thread. Backends
     * without it are always healthy. */
    int (*health)(struct pf_gpu *g, char *why, size_t whylen);
    void (*close)(struct pf_gpu *g);
    /* Optional (default -EOPNOTSUPP; the CUDA backend keeps it so and callers then hash the
     * host bytes themselves): copy_batch that also computes xxh3-64 checksums of the bytes
     * it copies, in the same pass, while they are still in the CPU's caches. D2H only
     * (-EINVAL otherwise). Descriptors form hash runs: descriptor i starts a new run unless
     * join[i] is non-zero, then its bytes continue the run of descriptor i-1 (join[0] is
     * ignored). When a stream_sync after this call returned 0, sums[i] of the last
     * descriptor of every run holds XXH3_64bits (seed 0, the value pf_checksum2 gives) of
     * the run's bytes in descriptor order, as they were written to the host; the other
     * entries are unspecified. join and sums must stay valid until that sync; on any
     * error sums are unspecified. Validation and errors as copy_batch; n == 0 returns 0
     * (a backend probe). */
    int (*copy_batch_hash)(struct pf_gpu_stream *s, enum pf_copy_dir dir, enum pf_copy_mode mode,
                           const struct pf_copy_desc *d, size_t n, const uint8_t *join,
                           uint64_t *sums);
};

struct pf_gpu {
    const struct pf_gpu_ops *ops;
};

/* --gpu-copy-batch: how direct-mode copies of scattered ranges are issued (cuda). */
enum pf_gpu_copy_batch {
    PF_GPU_COPY_BATCH_AUTO = 0, /* cuMemcpyBatchAsync where the driver has it (12.8+) */
    PF_GPU_COPY_BATCH_ON = 1,   /* required: open fails on older drivers */
    PF_GPU_COPY_BATCH_OFF = 2,  /* one async copy per merged range */
};

/* Backend-independent open parameters. */
struct pf_gpu_config {
    const int *devices; /* --devices; NULL = all the backend finds */
    size_t ndevices;
    uint64_t sim_bandwidth;       /* sim: bytes/s per device copy engine, 0 = unlimited */
    int sim_default_devices;      /* sim: devices when --devices is not given */
    struct pf_fault_plan *faults; /* faulty: decorator's plan */
    enum pf_gpu_copy_batch gpu_copy_batch;
};

static inline int pf_gpu_device_count(struct pf_gpu *g)
{
    return g->ops->device_count(g);
}
static inline int pf_gpu_device_info(struct pf_gpu *g, int dev, struct pf_gpu_dev_info *info_p)
{
    return g->ops->device_info(g, dev, info_p);
}
static inline int pf_gpu_ipc_open(struct pf_gpu *g, const struct pf_ipc_desc *d,
                                  struct pf_gpu_mapping **m_p)
{
    return g->ops->ipc_open(g, d, m_p);
}
static inline void pf_gpu_ipc_close(struct pf_gpu_mapping *m)
{
    if (m)
        m->gpu->ops->ipc_close(m);
}
static inline int pf_gpu_host_register(struct pf_gpu *g, void *addr, size_t len,
                                       struct pf_gpu_host_reg **r_p)
{
    return g->ops->host_register(g, addr, len, r_p);
}
static inline void pf_gpu_host_unregister(struct pf_gpu_host_reg *r)
{
    if (r)
        r->gpu->ops->host_unregister(r);
}
static inline int pf_gpu_stream_create(struct pf_gpu *g, int dev, struct pf_gpu_stream **s_p)
{
    return g->ops->stream_create(g, dev, s_p);
}
static inline void pf_gpu_stream_destroy(struct pf_gpu_stream *s)
{
    if (s)
        s->gpu->ops->stream_destroy(s);
}
static inline int pf_gpu_copy_batch(struct pf_gpu_stream *s, enum pf_copy_dir dir,
                                    enum pf_copy_mode mode, const struct pf_copy_desc *d, size_t n)
{
    return s->gpu->ops->copy_batch(s, dir, mode, d, n);
}
static inline int pf_gpu_stream_sync(struct pf_gpu_stream *s, uint64_t timeout_ms)
{
    return s->gpu->ops->stream_sync(s, timeout_ms);
}
static inline int pf_gpu_copy_batch_hash(struct pf_gpu_stream *s, enum pf_copy_dir dir,
                                         enum pf_copy_mode mode, const struct pf_copy_desc *d,
                                         size_t n, const uint8_t *join, uint64_t *sums)
{
    return s->gpu->ops->copy_batch_hash(s, dir, mode, d, n, join, sums);
}
static inline int pf_gpu_health(struct pf_gpu *g, char *why, size_t whylen)
{
    return g->ops->health(g, why, whylen);
}
static inline void pf_gpu_close(struct pf_gpu *g)
{
    if (g)
        g->ops->close(g);
}

#endif

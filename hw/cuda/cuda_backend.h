/* State shared by the files of the CUDA backend (cuda.c: open, devices, IPC; cuda_host.c:
 * host registration; cuda_copy.c: streams and copies). C only (cuda_internal.h is the
 * part the nvcc-built kernel shares). */
#ifndef PF_HW_CUDA_BACKEND_H
#define PF_HW_CUDA_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>

#include "pf/hal_gpu.h"

#include "cuda_internal.h"

#define CUDA_MAX_DEVS 64

struct cuda_dev {
    int ordinal; /* CUDA ordinal in this process */
    CUdevice dev;
    CUcontext ctx; /* retained primary context */
    CUmodule mod;  /* the copy kernel, NULL when it did not load */
    CUfunction kfn;
    int numa;
    bool can_map_host;
    uint8_t uuid[16];
    char name[64];
    char busid[32];
    uint64_t total_mem;
};

/* One opened IPC allocation, shared by the mappings of its views (g->ipc_mu). */
struct cuda_alloc {
    struct cuda_alloc *next;
    int dev;
    uint8_t handle[64];
    CUdeviceptr base;
    uint64_t size;
    uint32_t id;
    unsigned refs;
};

struct cuda_map {
    struct pf_gpu_mapping base;
    struct cuda_map *next;
    struct cuda_alloc *alloc;
};

/* One cuMemHostRegister of a registration (<= the chunk size). */
struct cuda_chunk {
    uint64_t off; /* from the registration's start */
    uint64_t len;
    uint64_t devptr; /* device alias of the chunk's first byte */
    uint32_t id;
    bool registered;
};

struct cuda_reg {
    struct pf_gpu_host_reg base;
    struct cuda_reg *next;
    size_t nchunks;
    struct cuda_chunk *chunks;
};

struct cuda_gpu {
    struct pf_gpu base;
    struct pf_cu cu;
    int ndev;
    struct cuda_dev devs[CUDA_MAX_DEVS];
    bool batch;             /* direct mode uses cuMemcpyBatchAsync */
    pthread_mutex_t ipc_mu; /* allocs; taken before lock */
    struct cuda_alloc *allocs;
    pthread_rwlock_t lock; /* maps, regs: read by copy_batch */
    struct cuda_map *maps;
    struct cuda_reg *regs;
    _Atomic uint32_t next_id;
    /* 0, or the sticky CUresult that killed this process's CUDA contexts */
    _Atomic int dead;
    pthread_mutex_t dead_mu;
    char dead_why[200];
};

static inline struct cuda_gpu *cg(struct pf_gpu *g)
{
    return pf_container_of(g, struct cuda_gpu, base);
}

/* Translates a failed CUDA call to -errno and logs it once per call site (first at warn,
 * later at debug). A sticky error marks g dead (cuda_mark_dead) and answers
 * -ENOTRECOVERABLE. */
int cuda_fail(struct cuda_gpu *g, CUresult e, const char *what, _Atomic bool *site_logged);
/* Records that g's contexts are dead (first caller logs at error, with what). */
void cuda_mark_dead(struct cuda_gpu *g, CUresult e, const char *what);
static inline bool cuda_is_dead(struct cuda_gpu *g)
{
    return atomic_load(&g->dead) != 0;
}
/* Makes dev's primary context current on this thread. */
int cuda_ctx(struct cuda_gpu *g, int dev);
uint32_t cuda_new_id(struct cuda_gpu *g);

/* rc_ = 0 or -errno of g_->cu.fn_(...), logged at this call site on failure. */
#define CU_CALL(g_, rc_, fn_, ...)                                                                 \
    do {                                                                                           \
        static _Atomic bool cu_site_;                                                              \
        CUresult cu_e_ = (g_)->cu.fn_(__VA_ARGS__);                                                \
        (rc_) = cu_e_ == CUDA_SUCCESS ? 0 : cuda_fail((g_), cu_e_, "cu" #fn_, &cu_site_);          \
    } while (0)

/* cuda_host.c */
int cuda_host_register(struct pf_gpu *pg, void *addr, size_t len, struct pf_gpu_host_reg **r_p);
void cuda_host_unregister(struct pf_gpu_host_reg *rp);
/* The registration that holds host..host+len entirely (possibly across its chunks), or
 * NULL; *chunk_p = index of the chunk holding host. Caller holds g->lock. */
const struct cuda_reg *cuda_find_reg(struct cuda_gpu *g, uint64_t host, uint64_t len,
                                     const struct cuda_reg *hint, size_t *chunk_p);

/* cuda_copy.c */
int cuda_stream_create(struct pf_gpu *pg, int dev, struct pf_gpu_stream **s_p);
void cuda_stream_destroy(struct pf_gpu_stream *sp);
int cuda_copy_batch(struct pf_gpu_stream *sp, enum pf_copy_dir dir, enum pf_copy_mode mode,
                    const struct pf_copy_desc *d, size_t n);
int cuda_stream_sync(struct pf_gpu_stream *sp, uint64_t timeout_ms);

#endif

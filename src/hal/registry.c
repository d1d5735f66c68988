/* HAL backend registry. Each class keeps a small table of registered backends, each with
 * a copy of its ops table in which every NULL op is replaced by an -EOPNOTSUPP stub.
 * Selection by name, "auto" (hardware first, then simulation) and the faulty: decorator
 * are handled here so the core only ever sees a filled ops table. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PF_LOG_MOD "hal"
#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/log.h"

#define MAX_BACKENDS 8

/* ---- -EOPNOTSUPP stubs ---- */
static int gs_count(struct pf_gpu *g)
{
    return -EOPNOTSUPP;
}
static int gs_info(struct pf_gpu *g, int d, struct pf_gpu_dev_info *i)
{
    return -EOPNOTSUPP;
}
static int gs_ipc_open(struct pf_gpu *g, const struct pf_ipc_desc *d, struct pf_gpu_mapping **m)
{
    return -EOPNOTSUPP;
}
static void gs_ipc_close(struct pf_gpu_mapping *m)
{
}
static int gs_host_reg(struct pf_gpu *g, void *a, size_t l, struct pf_gpu_host_reg **r)
{
    return -EOPNOTSUPP;
}
static void gs_host_unreg(struct pf_gpu_host_reg *r)
{
}
static int gs_stream_create(struct pf_gpu *g, int d, struct pf_gpu_stream **s)
{
    return -EOPNOTSUPP;
}
static void gs_stream_destroy(struct pf_gpu_stream *s)
{
}
static int gs_copy(struct pf_gpu_stream *s, enum pf_copy_dir d, enum pf_copy_mode m,
                   const struct pf_copy_desc *c, size_t n)
{
    return -EOPNOTSUPP;
}
static int gs_copy_hash(struct pf_gpu_stream *s, enum pf_copy_dir d, enum pf_copy_mode m,
                        const struct pf_copy_desc *c, size_t n, const uint8_t *j, uint64_t *h)
{
    return -EOPNOTSUPP;
}
static int gs_sync(struct pf_gpu_stream *s, uint64_t t)
{
    return -EOPNOTSUPP;
}
/* no health op: the backend has no way to lose its device, it is always healthy */
static int gs_health(struct pf_gpu *g, char *why, size_t whylen)
{
    return 0;
}
static void gs_close(struct pf_gpu *g)
{
}

static int ns_count(struct pf_net *n)
{
    return -EOPNOTSUPP;
}
static int ns_info(struct pf_net *n, int i, struct pf_net_nic_info *p)
{
    return -EOPNOTSUPP;
}
static int ns_reg(struct pf_net *n, int nic, void *a, uint64_t l, unsigned acc,
                  struct pf_net_mr **mr)
{
    return -EOPNOTSUPP;
}
static void ns_dereg(struct pf_net_mr *mr)
{
}
static int ns_qp_create(struct pf_net *n, int nic, struct pf_net_qp **qp)
{
    return -EOPNOTSUPP;
}
static int ns_ep(struct pf_net_qp *qp, void *b, size_t c, size_t *l)
{
    return -EOPNOTSUPP;
}
static int ns_connect(struct pf_net_qp *qp, const void *e, size_t l)
{
    return -EOPNOTSUPP;
}
static int ns_read(struct pf_net_qp *qp, const struct pf_net_sge *s, size_t n, uint64_t ra,
                   uint32_t rk, uint64_t w)
{
    return -EOPNOTSUPP;
}
static int ns_poll(struct pf_net_qp *qp, struct pf_net_cqe *o, size_t m, uint64_t t)
{
    return -EOPNOTSUPP;
}
static void ns_inval(struct pf_net_qp *qp)
{
}
static void ns_qp_destroy(struct pf_net_qp *qp)
{
}
static void ns_close(struct pf_net *n)
{
}

static int bs_open(struct pf_blk *b, const char *p, uint64_t s, unsigned f, struct pf_blk_file **fp)
{
    return -EOPNOTSUPP;
}
static void bs_fclose(struct pf_blk_file *f)
{
}
static int bs_qcreate(struct pf_blk *b, unsigned d, struct pf_blk_queue **q)
{
    return -EOPNOTSUPP;
}
static void bs_qdestroy(struct pf_blk_queue *q)
{
}
static int bs_submit(struct pf_blk_queue *q, struct pf_blk_file *f, enum pf_blk_op op, uint64_t off,
                     const struct iovec *iov, int n, uint64_t tag)
{
    return -EOPNOTSUPP;
}
static int bs_poll(struct pf_blk_queue *q, struct pf_blk_cqe *o, size_t m, uint64_t t)
{
    return -EOPNOTSUPP;
}
static void bs_close(struct pf_blk *b)
{
}

#define FILL(dst, src, field, stub) (dst)->field = (src)->field ? (src)->field : (stub)

static void fill_gpu(struct pf_gpu_ops *d, const struct pf_gpu_ops *s)
{
    d->name = s->name;
    FILL(d, s, device_count, gs_count);
    FILL(d, s, device_info, gs_info);
    FILL(d, s, ipc_open, gs_ipc_open);
    FILL(d, s, ipc_close, gs_ipc_close);
    FILL(d, s, host_register, gs_host_reg);
    FILL(d, s, host_unregister, gs_host_unreg);
    FILL(d, s, stream_create, gs_stream_create);
    FILL(d, s, stream_destroy, gs_stream_destroy);
    FILL(d, s, copy_batch, gs_copy);
    FILL(d, s, stream_sync, gs_sync);
    FILL(d, s, health, gs_health);
    FILL(d, s, close, gs_close);
    FILL(d, s, copy_batch_hash, gs_copy_hash);
}

static void fill_net(struct pf_net_ops *d, const struct pf_net_ops *s)
{
    d->name = s->name;
    FILL(d, s, nic_count, ns_count);
    FILL(d, s, nic_info, ns_info);
    FILL(d, s, reg_mem, ns_reg);
    FILL(d, s, dereg_mem, ns_dereg);
    FILL(d, s, qp_create, ns_qp_create);
    FILL(d, s, qp_local_endpoint, ns_ep);
    FILL(d, s, qp_connect, ns_connect);
    d->ep_host = s->ep_host;   /* optional: NULL = does not connect by address */
    d->ep_check = s->ep_check; /* optional: NULL = no compatibility check */
    FILL(d, s, post_read, ns_read);
    d->post_reads = s->post_reads; /* optional: NULL = pf_net_post_reads posts one by one */
    d->post_read_digest = s->post_read_digest; /* optional: NULL = digests not honoured */
    FILL(d, s, poll, ns_poll);
    FILL(d, s, qp_invalidate, ns_inval);
    FILL(d, s, qp_destroy, ns_qp_destroy);
    FILL(d, s, close, ns_close);
}

static void fill_blk(struct pf_blk_ops *d, const struct pf_blk_ops *s)
{
    d->name = s->name;
    FILL(d, s, file_open, bs_open);
    FILL(d, s, file_close, bs_fclose);
    FILL(d, s, queue_create, bs_qcreate);
    FILL(d, s, queue_destroy, bs_qdestroy);
    FILL(d, s, submit, bs_submit);
    FILL(d, s, poll, bs_poll);
    FILL(d, s, close, bs_close);
}

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    struct pf_gpu_backend b;
    struct pf_gpu_ops filled;
} gpus[MAX_BACKENDS];
static size_t ngpus;
static struct {
    struct pf_net_backend b;
    struct pf_net_ops filled;
} nets[MAX_BACKENDS];
static size_t nnets;
static struct {
    struct pf_blk_backend b;
    struct pf_blk_ops filled;
} blks[MAX_BACKENDS];
static size_t nblks;

#define REGISTER(arr, cnt, fill, be)                                                               \
    do {                                                                                           \
        int rc_ = 0;                                                                               \
        pthread_mutex_lock(&reg_mu);                                                               \
        for (size_t i_ = 0; i_ < (cnt); i_++)                                                      \
            if (strcmp(arr[i_].b.name, (be)->name) == 0) {                                         \
                rc_ = -EEXIST;                                                                     \
                goto out_;                                                                         \
            }                                                                                      \
        if ((cnt) == MAX_BACKENDS) {                                                               \
            rc_ = -ENOSPC;                                                                         \
            goto out_;                                                                             \
        }                                                                                          \
        arr[cnt].b = *(be);                                                                        \
        fill(&arr[cnt].filled, (be)->ops);                                                         \
        (cnt)++;                                                                                   \
    out_:                                                                                          \
        pthread_mutex_unlock(&reg_mu);                                                             \
        return rc_;                                                                                \
    } while (0)

int pf_hal_register_gpu(const struct pf_gpu_backend *b)
{
    REGISTER(gpus, ngpus, fill_gpu, b);
}

int pf_hal_register_net(const struct pf_net_backend *b)
{
    REGISTER(nets, nnets, fill_net, b);
}

int pf_hal_register_blk(const struct pf_blk_backend *b)
{
    REGISTER(blks, nblks, fill_blk, b);
}

const struct pf_gpu_ops *pf_hal_gpu_filled(const struct pf_gpu_ops *ops)
{
    for (size_t i = 0; i < ngpus; i++)
        if (gpus[i].b.ops == ops)
            return &gpus[i].filled;
    return ops;
}

const struct pf_net_ops *pf_hal_net_filled(const struct pf_net_ops *ops)
{
    for (size_t i = 0; i < nnets; i++)
        if (nets[i].b.ops == ops)
            return &nets[i].filled;
    return ops;
}

const struct pf_blk_ops *pf_hal_blk_filled(const struct pf_blk_ops *ops)
{
    for (size_t i = 0; i < nblks; i++)
        if (blks[i].b.ops == ops)
            return &blks[i].filled;
    return ops;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void do_init(void)
{
    /* hardware first: "auto" tries backends in registration order */
    pf_cuda_register();
    pf_simgpu_register();
    pf_verbs_register();
    pf_tcpnet_register();
    pf_uring_register();
}

void pf_hal_init(void)
{
    pthread_once(&init_once, do_init);
}

static void seterr(char *err, size_t len, const char *fmt, ...) PF_PRINTF(3, 4);
static void seterr(char *err, size_t len, const char *fmt, ...)
{
    if (!err || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

static const char *strip_faulty(const char *name, bool *faulty)
{
    *faulty = strncmp(name, "faulty:", 7) == 0;
    return *faulty ? name + 7 : name;
}

/* Generic open: arrays differ per class, so a macro keeps one algorithm for the three. */
#define HAL_OPEN(arr, cnt, cls, obj_t, cfg_t, fillfn, wrapfn)                                      \
    pf_hal_init();                                                                                 \
    bool faulty;                                                                                   \
    const char *want = strip_faulty(name ? name : "auto", &faulty);                                \
    obj_t *obj = NULL;                                                                             \
    int rc = -ENOENT;                                                                              \
    size_t picked = SIZE_MAX;                                                                      \
    char why[160] = "";                                                                            \
    if (strcmp(want, "auto") == 0) {                                                               \
        for (int pass = 1; pass >= 0 && picked == SIZE_MAX; pass--) {                              \
            for (size_t i = 0; i < (cnt); i++) {                                                   \
                if (arr[i].b.hardware != pass)                                                     \
                    continue;                                                                      \
                rc = arr[i].b.open(cfg, &obj);                                                     \
                if (rc == 0) {                                                                     \
                    picked = i;                                                                    \
                    break;                                                                         \
                }                                                                                  \
                if (rc == -ENOTRECOVERABLE) { /* hardware present but unusable: no fallback */     \
                    seterr(err, errlen,                                                            \
                           cls " backend auto: %s is installed but unusable (the log says why); "  \
                               "not falling back",                                                 \
                           arr[i].b.name);                                                         \
                    return rc;                                                                     \
                }                                                                                  \
                snprintf(why + strlen(why), sizeof(why) - strlen(why), "%s%s: %s",                 \
                         why[0] ? "; " : "", arr[i].b.name, strerror(-rc));                        \
            }                                                                                      \
        }                                                                                          \
        if (picked == SIZE_MAX) {                                                                  \
            seterr(err, errlen, cls " backend auto: nothing usable (%s)", why);                    \
            return rc ? rc : -ENODEV;                                                              \
        }                                                                                          \
        if (why[0])                                                                                \
            pf_info(cls " backend auto: chose %s (%s)", arr[picked].b.name, why);                  \
        else                                                                                       \
            pf_info(cls " backend auto: chose %s", arr[picked].b.name);                            \
    } else {                                                                                       \
        for (size_t i = 0; i < (cnt); i++)                                                         \
            if (strcmp(arr[i].b.name, want) == 0)                                                  \
                picked = i;                                                                        \
        if (picked == SIZE_MAX) {                                                                  \
            char known[128] = "auto";                                                              \
            for (size_t i = 0; i < (cnt); i++)                                                     \
                snprintf(known + strlen(known), sizeof(known) - strlen(known), ", %s",             \
                         arr[i].b.name);                                                           \
            seterr(err, errlen, "unknown " cls " backend '%s' (known: %s)", want, known);          \
            return -ENOENT;                                                                        \
        }                                                                                          \
        rc = arr[picked].b.open(cfg, &obj);                                                        \
        if (rc) {                                                                                  \
            seterr(err, errlen, cls " backend %s: %s", want, strerror(-rc));                       \
            return rc;                                                                             \
        }                                                                                          \
    }                                                                                              \
    obj->ops = &arr[picked].filled;                                                                \
    if (faulty || (cfg && cfg->faults && pf_fault_plan_covers(cfg->faults, cls))) {                \
        obj_t *w = NULL;                                                                           \
        rc = wrapfn(obj, cfg ? cfg->faults : NULL, &w);                                            \
        if (rc) {                                                                                  \
            obj->ops->close(obj);                                                                  \
            seterr(err, errlen, "faulty:%s: %s", arr[picked].b.name, strerror(-rc));               \
            return rc;                                                                             \
        }                                                                                          \
        obj = w;                                                                                   \
        faulty = true;                                                                             \
    }                                                                                              \
    if (chosen)                                                                                    \
        snprintf(chosen, chosenlen, "%s%s", faulty ? "faulty:" : "", arr[picked].b.name);          \
    *out_p = obj;                                                                                  \
    return 0;

int pf_hal_gpu_open(const char *name, const struct pf_gpu_config *cfg, struct pf_gpu **out_p,
                    char *chosen, size_t chosenlen, char *err, size_t errlen)
{
    HAL_OPEN(gpus, ngpus, "gpu", struct pf_gpu, struct pf_gpu_config, fill_gpu, pf_fault_gpu_wrap)
}

int pf_hal_net_open(const char *name, const struct pf_net_config *cfg, struct pf_net **out_p,
                    char *chosen, size_t chosenlen, char *err, size_t errlen)
{
    HAL_OPEN(nets, nnets, "net", struct pf_net, struct pf_net_config, fill_net, pf_fault_net_wrap)
}

int pf_hal_blk_open(const char *name, const struct pf_blk_config *cfg, struct pf_blk **out_p,
                    char *chosen, size_t chosenlen, char *err, size_t errlen)
{
    HAL_OPEN(blks, nblks, "blk", struct pf_blk, struct pf_blk_config, fill_blk, pf_fault_blk_wrap)
}

/* HAL registry: explicit backend registration and selection by name.
 *
 * Backends register themselves from pf_hal_init() (src/hal/registry.c calls each
 * backend's register function; a backend that is not compiled in has a register function
 * returning -ENODEV). Selection:
 *   GPU  --gpu-backend auto|cuda|sim       (auto: cuda when a device is present, else sim)
 *   NET  --net-backend auto|verbs|tcp      (auto: verbs when an RDMA device exists, else tcp)
 *   BLK  uring
 * A "faulty:" prefix wraps the chosen backend in the fault-injection decorator (the fault
 * plan comes from --fault-spec / PEGAFLOW_FAULTS; pf_hal_*_open adds the decorator
 * automatically when the plan names that class). Unimplemented ops of every backend are
 * replaced with -EOPNOTSUPP stubs at registration. */
#ifndef PF_HAL_H
#define PF_HAL_H

#include <stddef.h>

#include "pf/hal_blk.h"
#include "pf/hal_gpu.h"
#include "pf/hal_net.h"

struct pf_gpu_backend {
    const char *name;
    int hardware; /* 1: real device backend, tried first by "auto" */
    const struct pf_gpu_ops *ops;
    /* Opens the backend. -ENODEV when no device is usable (auto then falls back);
     * -ENOTRECOVERABLE when the hardware is installed but cannot be used (e.g. a GPU whose
     * driver is too old): auto then fails instead of silently using the simulation. */
    int (*open)(const struct pf_gpu_config *cfg, struct pf_gpu **g_p);
};

struct pf_net_backend {
    const char *name;
    int hardware;
    const struct pf_net_ops *ops;
    int (*open)(const struct pf_net_config *cfg, struct pf_net **n_p);
    /* Optional: 0 when the hardware is present (used by auto before opening). */
    int (*probe)(void);
};

struct pf_blk_backend {
    const char *name;
    int hardware;
    const struct pf_blk_ops *ops;
    int (*open)(const struct pf_blk_config *cfg, struct pf_blk **b_p);
};

/* Registers every compiled backend (idempotent, thread-safe). */
void pf_hal_init(void);

int pf_hal_register_gpu(const struct pf_gpu_backend *b);
int pf_hal_register_net(const struct pf_net_backend *b);
int pf_hal_register_blk(const struct pf_blk_backend *b);

/* Returns the filled (stubbed) ops table for a registered backend ops table, or the input
 * when it was not registered. Backends' open functions set obj->ops to their static table;
 * pf_hal_*_open replaces it with the filled copy. */
const struct pf_gpu_ops *pf_hal_gpu_filled(const struct pf_gpu_ops *ops);
const struct pf_net_ops *pf_hal_net_filled(const struct pf_net_ops *ops);
const struct pf_blk_ops *pf_hal_blk_filled(const struct pf_blk_ops *ops);

/* Opens a backend by name ("auto", "sim", "cuda", "faulty:sim", ...). On success the name
 * of the backend actually opened is written to chosen (may be NULL). Errors: -ENOENT
 * (unknown name, the message lists the known ones), -ENODEV (no such hardware),
 * -ENOTRECOVERABLE (hardware installed but unusable; "auto" does not fall back), others
 * from the backend. err gets a one-line reason. */
int pf_hal_gpu_open(const char *name, const struct pf_gpu_config *cfg, struct pf_gpu **g_p,
                    char *chosen, size_t chosenlen, char *err, size_t errlen);
int pf_hal_net_open(const char *name, const struct pf_net_config *cfg, struct pf_net **n_p,
                    char *chosen, size_t chosenlen, char *err, size_t errlen);
int pf_hal_blk_open(const char *name, const struct pf_blk_config *cfg, struct pf_blk **b_p,
                    char *chosen, size_t chosenlen, char *err, size_t errlen);

/* Decorators (src/hal/fault_*.c): wrap an opened backend. Ownership of inner passes to the
 * decorator (closing the decorator closes inner). */
int pf_fault_gpu_wrap(struct pf_gpu *inner, struct pf_fault_plan *plan, struct pf_gpu **g_p);
int pf_fault_net_wrap(struct pf_net *inner, struct pf_fault_plan *plan, struct pf_net **n_p);
int pf_fault_blk_wrap(struct pf_blk *inner, struct pf_fault_plan *plan, struct pf_blk **b_p);

/* Backend register functions (each returns 0, or -ENODEV when not compiled in). */
int pf_simgpu_register(void);
int pf_cuda_register(void);
int pf_tcpnet_register(void);
int pf_verbs_register(void);
int pf_uring_register(void);

#endif

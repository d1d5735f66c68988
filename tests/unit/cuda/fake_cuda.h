/* Control interface of the fake CUDA driver library (fake_cuda.c -> libpffakecuda.so).
 *
 * The backend loads the library exactly as it loads libcuda.so.1 (dlopen, then
 * cuGetProcAddress_v2 for every entry point; pf_cuda_test_set_driver names the file). The
 * test dlopens the same file (glibc hands back the same instance) and drives it through
 * fake_cu_state(). Every behaviour cites the CUDA document it follows (fake_cuda.c). */
#ifndef PF_TEST_FAKE_CUDA_H
#define PF_TEST_FAKE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#define FAKE_MAX_DEVS   4
#define FAKE_MAX_ALLOCS 16
#define FAKE_MAX_REGS   64
#define FAKE_ALIAS_OFF  (1ull << 46) /* device alias of registered host memory */
/* vLLM #51080: one registration of >= 2^39 bytes fails with code 2 (out of memory) */
#define FAKE_REG_CAP_R580 (512ull << 30)

struct fake_alloc {
    uint8_t *p;
    size_t size;
    int dev;
    int opened; /* cuIpcOpenMemHandle count not yet closed */
};

struct fake_cu {
    /* ---- configuration (set by the test before open) */
    int ndev;
    int driver_version;              /* cuDriverGetVersion; newer cuGetProcAddress requests fail */
    CUresult init_err;               /* answered by cuInit */
    int ptx_isa_max;                 /* highest PTX ISA the "driver" JITs, 10 * major + minor */
    uint64_t reg_cap;                /* a cuMemHostRegister of >= reg_cap bytes fails (0: no cap) */
    int compute_mode[FAKE_MAX_DEVS]; /* CU_COMPUTEMODE_* */
    bool held_elsewhere[FAKE_MAX_DEVS]; /* another process has a context on it */
    int not_ready;                      /* cuEventQuery answers NOT_READY this many times */
    CUresult async_err;                 /* the next cuEventQuery answers this (sticky ones stay) */
    CUresult memcpy_err;                /* every copy call answers this while set */
    CUresult ipc_open_err;
    bool no_addr_range; /* cuMemGetAddressRange answers NOT_FOUND */
    /* ---- state */
    CUresult sticky; /* once set, every call answers it (cuda.h: sticky errors) */
    struct fake_alloc allocs[FAKE_MAX_ALLOCS];
    int nallocs;
    struct {
        uint8_t *p;
        size_t len;
    } regs[FAKE_MAX_REGS];
    /* ---- counters */
    int ipc_opens, ipc_closes;
    int copies;      /* individual D2H/H2D KV copies executed (direct and batched) */
    int copy_calls;  /* cuMemcpy{DtoH,HtoD}Async calls for KV data */
    int batch_calls; /* cuMemcpyBatchAsync calls */
    int uploads;     /* descriptor uploads (H2D into cuMemAlloc memory) */
    int pageable;    /* copies whose host side was not pinned memory (staged synchronously) */
    int launches;
    int mallocs, frees, host_allocs, host_frees;
    int streams, events, contexts, modules;
    int registers, max_reg_threads, reg_threads_now;
    uint64_t max_reg_len;
    size_t last_launch_n;
    int last_copy_dev; /* device whose context was current for the last copy call */
    uint64_t copied;
};

struct fake_cu *fake_cu_state(void);
/* Frees the fake's allocations and zeroes the state, then sets the defaults: ndev,
 * driver 12.2 (R535), PTX ISA 8.2, no registration cap. */
void fake_cu_reset(int ndev);
/* Exports a device allocation of size bytes on device dev: returns its index. */
int fake_cu_export(int dev, size_t size, CUipcMemHandle *h);
void fake_cu_uuid(int dev, uint8_t u[16]);

#endif

/* Private state of the fake CUDA driver (fake_cuda.c, fake_cuda_copy.c): one library,
 * two files; nothing here is exported from the shared object (hidden visibility). */
#ifndef PF_TEST_FAKE_CUDA_INT_H
#define PF_TEST_FAKE_CUDA_INT_H

#include <pthread.h>

#include <cudaTypedefs.h>

#include "fake_cuda.h"

#pragma GCC visibility push(hidden)

enum { OP_COPY, OP_KERNEL, OP_RECORD };
struct op {
    int kind;
    uint64_t dst, src, len; /* OP_KERNEL: src = descriptor array, len = count */
};
struct fstream {
    int tag; /* 1 */
    int dev;
    struct op *ops;
    size_t n, cap, done;
};
struct fevent {
    int tag; /* 2 */
    struct fstream *st;
    size_t pos; /* ops up to here complete the event */
    bool recorded;
};

extern pthread_mutex_t mu;
extern struct fake_cu fk;
extern bool inited;
extern __thread int cur; /* device of the current context of this thread */
extern int fn_obj;       /* the copy kernel's CUfunction */
extern int module_obj;   /* CUmodule */

bool is_sticky(CUresult e);
CUresult gate(bool need_ctx);
int find_reg(uint64_t a, uint64_t len, bool alias);
bool is_kv_dev(uint64_t a, uint64_t len);
int find_dbuf(uint64_t a, uint64_t len, bool host);
bool is_pinned(uint64_t a, uint64_t len);
void push(struct fstream *s, struct op o);
void run_until(struct fstream *s, size_t pos);
CUresult stream_ok(CUstream st);
void live_add(void *p);
void live_del(void *p);

#define GATE(need_ctx)                                                                             \
    pthread_mutex_lock(&mu);                                                                       \
    CUresult g_e_ = gate(need_ctx);                                                                \
    if (g_e_ != CUDA_SUCCESS) {                                                                    \
        pthread_mutex_unlock(&mu);                                                                 \
        return g_e_;                                                                               \
    }

#define RET(e)                                                                                     \
    do {                                                                                           \
        CUresult r_e_ = (e);                                                                       \
        pthread_mutex_unlock(&mu);                                                                 \
        return r_e_;                                                                               \
    } while (0)

/* fake_cuda_copy.c */
CUresult f_StreamCreate(CUstream *st, unsigned flags);
CUresult f_StreamDestroy(CUstream st);
CUresult f_EventCreate(CUevent *ev, unsigned flags);
CUresult f_EventDestroy(CUevent ev);
CUresult f_EventRecord(CUevent ev, CUstream st);
CUresult f_EventQuery(CUevent ev);
CUresult f_MemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t len, CUstream st);
CUresult f_MemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t len, CUstream st);
CUresult f_MemcpyBatchAsync_v12080(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                   size_t count, CUmemcpyAttributes *attrs, size_t *idxs,
                                   size_t nattrs, size_t *fail, CUstream st);
CUresult f_MemcpyBatchAsync_v13000(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                   size_t count, CUmemcpyAttributes *attrs, size_t *idxs,
                                   size_t nattrs, CUstream st);
CUresult f_ModuleLoadData(CUmodule *m, const void *image);
CUresult f_ModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult f_ModuleUnload(CUmodule m);
CUresult f_LaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream st, void **params,
                        void **extra);

#pragma GCC visibility pop

#endif

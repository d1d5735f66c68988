/* The fake CUDA driver (see fake_cuda.c for the rules and their sources): streams and
 * events, copies (direct and batched), the copy kernel's module and launches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_int.h"

/* ------------------------------------------------------------------ streams, events */

CUresult f_StreamCreate(CUstream *st, unsigned flags)
{
    GATE(true);
    if (flags != CU_STREAM_NON_BLOCKING) /* the backend must not sync with the NULL stream */
        RET(CUDA_ERROR_INVALID_VALUE);
    struct fstream *s = calloc(1, sizeof(*s));
    if (!s)
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    s->tag = 1;
    s->dev = cur;
    live_add(s);
    fk.streams++;
    *st = (CUstream)s;
    RET(CUDA_SUCCESS);
}

CUresult f_StreamDestroy(CUstream st)
{
    GATE(true);
    struct fstream *s = (struct fstream *)st;
    run_until(s, s->n); /* cuda.h: pending work completes before the resources go */
    live_del(s);
    free(s->ops);
    free(s);
    fk.streams--;
    RET(CUDA_SUCCESS);
}

CUresult f_EventCreate(CUevent *ev, unsigned flags)
{
    GATE(true);
    struct fevent *v = calloc(1, sizeof(*v));
    if (!v)
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    v->tag = 2;
    live_add(v);
    *ev = (CUevent)v;
    fk.events++;
    RET(CUDA_SUCCESS);
}

CUresult f_EventDestroy(CUevent ev)
{
    GATE(true);
    live_del(ev);
    free(ev);
    fk.events--;
    RET(CUDA_SUCCESS);
}

CUresult f_EventRecord(CUevent ev, CUstream st)
{
    GATE(true);
    CUresult e = stream_ok(st);
    if (e)
        RET(e);
    struct fevent *v = (struct fevent *)ev;
    struct fstream *s = (struct fstream *)st;
    push(s, (struct op){.kind = OP_RECORD});
    v->st = s;
    v->pos = s->n;
    v->recorded = true;
    RET(CUDA_SUCCESS);
}

CUresult f_EventQuery(CUevent ev)
{
    GATE(false);
    struct fevent *v = (struct fevent *)ev;
    if (fk.async_err) {
        CUresult r = fk.async_err;
        fk.async_err = CUDA_SUCCESS;
        if (is_sticky(r))
            fk.sticky = r;
        RET(r);
    }
    if (fk.not_ready > 0) {
        fk.not_ready--;
        RET(CUDA_ERROR_NOT_READY);
    }
    if (v->recorded) /* cuda.h: an event never recorded is complete */
        run_until(v->st, v->pos);
    RET(fk.sticky ? fk.sticky : CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ copies */

/* Queues one copy (or stages it now when the host side is pageable). */
static CUresult copy(struct fstream *s, uint64_t dst, uint64_t src, size_t len, bool d2h)
{
    uint64_t host = d2h ? dst : src, dev = d2h ? src : dst;
    if (!d2h && find_dbuf(dev, len, false) >= 0) { /* descriptor upload */
        fk.uploads++;
        if (!is_pinned(host, len)) {
            fk.pageable++;
            memcpy((void *)(uintptr_t)dev, (const void *)(uintptr_t)host, len);
            return CUDA_SUCCESS;
        }
        push(s, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .len = len});
        return CUDA_SUCCESS;
    }
    if (!is_kv_dev(dev, len))
        return CUDA_ERROR_INVALID_VALUE;
    fk.copies++;
    fk.copied += len;
    fk.last_copy_dev = cur;
    if (!is_pinned(host, len)) { /* pageable (or straddling two registrations): staged now */
        fk.pageable++;
        memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, len);
        return CUDA_SUCCESS;
    }
    push(s, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .len = len});
    return CUDA_SUCCESS;
}

CUresult f_MemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t len, CUstream st)
{
    GATE(true);
    CUresult e = stream_ok(st);
    if (e)
        RET(e);
    if (fk.memcpy_err)
        RET(fk.memcpy_err);
    if (find_dbuf(dst, len, false) < 0)
        fk.copy_calls++;
    RET(copy((struct fstream *)st, dst, (uint64_t)(uintptr_t)src, len, false));
}

CUresult f_MemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t len, CUstream st)
{
    GATE(true);
    CUresult e = stream_ok(st);
    if (e)
        RET(e);
    if (fk.memcpy_err)
        RET(fk.memcpy_err);
    fk.copy_calls++;
    RET(copy((struct fstream *)st, (uint64_t)(uintptr_t)dst, src, len, true));
}

static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                      CUmemcpyAttributes *attrs, size_t *idxs, size_t nattrs, CUstream st)
{
    GATE(true);
    CUresult e = stream_ok(st);
    if (e)
        RET(e);
    if (fk.memcpy_err)
        RET(fk.memcpy_err);
    if (count == 0 || !attrs || !idxs || nattrs == 0 || nattrs > count || idxs[0] != 0)
        RET(CUDA_ERROR_INVALID_VALUE);
    for (size_t k = 0; k < nattrs; k++) {
        if ((k > 0 && idxs[k] <= idxs[k - 1]) || idxs[k] >= count)
            RET(CUDA_ERROR_INVALID_VALUE);
        if (attrs[k].srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM &&
            attrs[k].srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
            attrs[k].srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
            RET(CUDA_ERROR_INVALID_VALUE);
    }
    fk.batch_calls++;
    for (size_t i = 0; i < count; i++) {
        bool d2h = is_kv_dev(srcs[i], sizes[i]);
        e = copy((struct fstream *)st, dsts[i], srcs[i], sizes[i], d2h);
        if (e)
            RET(e);
    }
    RET(CUDA_SUCCESS);
}

CUresult f_MemcpyBatchAsync_v12080(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                   size_t count, CUmemcpyAttributes *attrs, size_t *idxs,
                                   size_t nattrs, size_t *fail, CUstream st)
{
    if (!fail)
        return CUDA_ERROR_INVALID_VALUE;
    *fail = SIZE_MAX;
    return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, st);
}

CUresult f_MemcpyBatchAsync_v13000(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                   size_t count, CUmemcpyAttributes *attrs, size_t *idxs,
                                   size_t nattrs, CUstream st)
{
    return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, st);
}

/* ------------------------------------------------------------------ modules, launch */

CUresult f_ModuleLoadData(CUmodule *m, const void *image)
{
    GATE(true);
    const char *s = image;
    const char *v = strstr(s, "\n.version ");
    int maj = 0, min = 0;
    if (!v || sscanf(v, "\n.version %d.%d", &maj, &min) != 2 || !strstr(s, "\n.target sm_"))
        RET(CUDA_ERROR_INVALID_IMAGE);
    if (maj * 10 + min > fk.ptx_isa_max)
        RET(CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
    fk.modules++;
    *m = (CUmodule)&module_obj;
    RET(CUDA_SUCCESS);
}

CUresult f_ModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    GATE(true);
    if (m != (CUmodule)&module_obj)
        RET(CUDA_ERROR_INVALID_HANDLE);
    if (strcmp(name, "pf_cuda_copy_kernel") != 0)
        RET(CUDA_ERROR_NOT_FOUND);
    *f = (CUfunction)&fn_obj;
    RET(CUDA_SUCCESS);
}

CUresult f_ModuleUnload(CUmodule m)
{
    GATE(true);
    fk.modules--;
    RET(CUDA_SUCCESS);
}

CUresult f_LaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream st, void **params,
                        void **extra)
{
    GATE(true);
    CUresult e = stream_ok(st);
    if (e)
        RET(e);
    if (f != (CUfunction)&fn_obj || !params || extra)
        RET(CUDA_ERROR_INVALID_VALUE);
    if (bx != 256 || by != 1 || bz != 1 || gx == 0 || gx > 65535 || gy != 1 || gz != 1)
        RET(CUDA_ERROR_INVALID_VALUE); /* __launch_bounds__(256) and the kernel's grid */
    CUdeviceptr descp = *(CUdeviceptr *)params[0];
    uint64_t n = *(uint64_t *)params[1];
    if (find_dbuf(descp, n * 24, false) < 0) /* the kernel reads device memory only */
        RET(CUDA_ERROR_INVALID_VALUE);
    fk.launches++;
    fk.last_launch_n = n;
    push((struct fstream *)st, (struct op){.kind = OP_KERNEL, .src = descp, .len = n});
    RET(CUDA_SUCCESS);
}

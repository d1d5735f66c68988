/* faulty:<inner> GPU decorator. Forwards every op to the inner backend, consulting the
 * fault plan first: gpu.ipc_open, gpu.host_register, gpu.d2h / gpu.h2d (per copy batch)
 * and gpu.sync. Copy faults: error at post (nothing submitted), error at completion
 * (submitted, reported by the next sync), delay (before submission), drop (never submitted;
 * every later sync of that stream times out), corrupt (D2H: bytes flipped in the host
 * destination after the copy; H2D: the data is copied from a corrupted, registered bounce
 * buffer), fatal (the device is lost as after a sticky CUDA error, hal_gpu.h "Lost device": every
 * later op fails with -ENOTRECOVERABLE and health() reports it). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LOG_MOD "fault"
#include "pf/clock.h"
#include "pf/fault.h"
#include "pf/hal.h"
#include "pf/log.h"

struct fgpu {
    struct pf_gpu base;
    struct pf_gpu *inner;
    struct pf_fault_plan *plan;
    _Atomic bool dead;
};

struct fmap {
    struct pf_gpu_mapping base;
    struct pf_gpu_mapping *inner;
};

struct freg {
    struct pf_gpu_host_reg base;
    struct pf_gpu_host_reg *inner;
};

struct pending_corrupt {
    void *host;
    uint64_t len;
};

struct bounce {
    void *buf;
    struct pf_gpu_host_reg *reg;
};

struct fstream {
    struct pf_gpu_stream base;
    struct pf_gpu_stream *inner;
    int pending_err;
    bool dropped;
    struct pending_corrupt *corrupt;
    size_t ncorrupt, capcorrupt;
    struct bounce *bounces;
    size_t nbounce, capbounce;
};

static const struct pf_gpu_ops fgpu_ops;

static struct fgpu *fg(struct pf_gpu *g)
{
    return pf_container_of(g, struct fgpu, base);
}

static int fault_or_dead(struct fgpu *f, const char *op, struct pf_fault_hit *h)
{
    if (atomic_load(&f->dead))
        return -ENOTRECOVERABLE;
    if (!pf_fault_check(f->plan, op, h))
        return 0;
    if (h->fatal) {
        atomic_store(&f->dead, true);
        pf_error("injected fatal fault on %s: GPU unusable from now on", op);
        return -ENOTRECOVERABLE;
    }
    if (h->delay_ms)
        pf_sleep_ms(h->delay_ms);
    if (h->error && !h->at_complete)
        return h->error;
    return 0;
}

static int f_count(struct pf_gpu *g)
{
    return pf_gpu_device_count(fg(g)->inner);
}

static int f_info(struct pf_gpu *g, int dev, struct pf_gpu_dev_info *info_p)
{
    return pf_gpu_device_info(fg(g)->inner, dev, info_p);
}

static int f_ipc_open(struct pf_gpu *g, const struct pf_ipc_desc *d, struct pf_gpu_mapping **m_p)
{
    struct fgpu *f = fg(g);
    struct pf_fault_hit h;
    int rc = fault_or_dead(f, "gpu.ipc_open", &h);
    if (rc)
        return rc;
    if (h.error)
        return h.error;
    struct fmap *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    rc = pf_gpu_ipc_open(f->inner, d, &m->inner);
    if (rc) {
        free(m);
        return rc;
    }
    m->base = *m->inner;
    m->base.gpu = g;
    *m_p = &m->base;
    return 0;
}

static void f_ipc_close(struct pf_gpu_mapping *mp)
{
    struct fmap *m = pf_container_of(mp, struct fmap, base);
    pf_gpu_ipc_close(m->inner);
    free(m);
}

static int f_host_register(struct pf_gpu *g, void *addr, size_t len, struct pf_gpu_host_reg **r_p)
{
    struct fgpu *f = fg(g);
    struct pf_fault_hit h;
    int rc = fault_or_dead(f, "gpu.host_register", &h);
    if (rc)
        return rc;
    if (h.error)
        return h.error;
    struct freg *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    rc = pf_gpu_host_register(f->inner, addr, len, &r->inner);
    if (rc) {
        free(r);
        return rc;
    }
    r->base = *r->inner;
    r->base.gpu = g;
    *r_p = &r->base;
    return 0;
}

static void f_host_unregister(struct pf_gpu_host_reg *rp)
{
    struct freg *r = pf_container_of(rp, struct freg, base);
    pf_gpu_host_unregister(r->inner);
    free(r);
}

static int f_stream_create(struct pf_gpu *g, int dev, struct pf_gpu_stream **s_p)
{
    struct fgpu *f = fg(g);
    if (atomic_load(&f->dead))
        return -ENOTRECOVERABLE;
    struct fstream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    int rc = pf_gpu_stream_create(f->inner, dev, &s->inner);
    if (rc) {
        free(s);
        return rc;
    }
    s->base.gpu = g;
    s->base.device = dev;
    *s_p = &s->base;
    return 0;
}

static void release_bounces(struct fstream *s)
{
    for (size_t i = 0; i < s->nbounce; i++) {
        pf_gpu_host_unregister(s->bounces[i].reg);
        free(s->bounces[i].buf);
    }
    s->nbounce = 0;
}

static void f_stream_destroy(struct pf_gpu_stream *sp)
{
    struct fstream *s = pf_container_of(sp, struct fstream, base);
    pf_gpu_stream_destroy(s->inner);
    release_bounces(s);
    free(s->bounces);
    free(s->corrupt);
    free(s);
}

static int push_corrupt(struct fstream *s, void *host, uint64_t len)
{
    if (s->ncorrupt == s->capcorrupt) {
        size_t nc = s->capcorrupt ? s->capcorrupt * 2 : 8;
        void *p = realloc(s->corrupt, nc * sizeof(*s->corrupt));
        if (!p)
            return -ENOMEM;
        s->corrupt = p;
        s->capcorrupt = nc;
    }
    s->corrupt[s->ncorrupt++] = (struct pending_corrupt){host, len};
    return 0;
}

static int h2d_bounce(struct fstream *s, struct fgpu *f, const struct pf_copy_desc *d, size_t n,
                      struct pf_copy_desc **out_p)
{
    struct pf_copy_desc *c = malloc(n * sizeof(*c));
    if (!c)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        c[i] = d[i];
        if (s->nbounce == s->capbounce) {
            size_t nc = s->capbounce ? s->capbounce * 2 : 8;
            void *p = realloc(s->bounces, nc * sizeof(*s->bounces));
            if (!p)
                goto err;
            s->bounces = p;
            s->capbounce = nc;
        }
        void *buf = malloc(d[i].len ? d[i].len : 1);
        if (!buf)
            goto err;
        memcpy(buf, d[i].host, d[i].len);
        pf_fault_corrupt(f->plan, buf, d[i].len);
        struct pf_gpu_host_reg *reg = NULL;
        if (pf_gpu_host_register(f->inner, buf, d[i].len ? d[i].len : 1, &reg) != 0) {
            free(buf);
            goto err;
        }
        s->bounces[s->nbounce++] = (struct bounce){buf, reg};
        c[i].host = buf;
    }
    *out_p = c;
    return 0;
err:
    free(c);
    return -ENOMEM;
}

static int f_copy(struct pf_gpu_stream *sp, enum pf_copy_dir dir, enum pf_copy_mode mode,
                  const struct pf_copy_desc *d, size_t n)
{
    struct fstream *s = pf_container_of(sp, struct fstream, base);
    struct fgpu *f = fg(sp->gpu);
    struct pf_fault_hit h;
    int rc = fault_or_dead(f, dir == PF_COPY_D2H ? "gpu.d2h" : "gpu.h2d", &h);
    if (rc)
        return rc;
    if (h.drop) {
        s->dropped = true;
        return 0;
    }
    if (h.corrupt && dir == PF_COPY_H2D) {
        struct pf_copy_desc *c;
        rc = h2d_bounce(s, f, d, n, &c);
        if (rc)
            return rc;
        rc = pf_gpu_copy_batch(s->inner, dir, mode, c, n);
        free(c);
    } else {
        rc = pf_gpu_copy_batch(s->inner, dir, mode, d, n);
        if (rc == 0 && h.corrupt)
            for (size_t i = 0; i < n && rc == 0; i++)
                rc = push_corrupt(s, d[i].host, d[i].len);
    }
    if (rc == 0 && h.error && h.at_complete && !s->pending_err)
        s->pending_err = h.error;
    return rc;
}

/* The decorator injects its faults on copy_batch only, so it offers no fused copy+hash:
 * the engine falls back to copy_batch and hashes the host bytes itself, and every gpu.d2h
 * fault (drop, corrupt after the copy, error) applies exactly as without the extension. */
static int f_copy_hash(struct pf_gpu_stream *sp, enum pf_copy_dir dir, enum pf_copy_mode mode,
                       const struct pf_copy_desc *d, size_t n, const uint8_t *join, uint64_t *sums)
{
    return -EOPNOTSUPP;
}

static int f_sync(struct pf_gpu_stream *sp, uint64_t timeout_ms)
{
    struct fstream *s = pf_container_of(sp, struct fstream, base);
    struct fgpu *f = fg(sp->gpu);
    if (atomic_load(&f->dead))
        return -ENOTRECOVERABLE;
    if (s->dropped) {
        pf_sleep_ms(timeout_ms < 1000 ? timeout_ms : 1000);
        return -ETIMEDOUT;
    }
    int rc = pf_gpu_stream_sync(s->inner, timeout_ms);
    if (rc == -ETIMEDOUT)
        return rc;
    if (rc == 0)
        for (size_t i = 0; i < s->ncorrupt; i++)
            pf_fault_corrupt(f->plan, s->corrupt[i].host, s->corrupt[i].len);
    s->ncorrupt = 0;
    release_bounces(s);
    if (rc == 0 && s->pending_err)
        rc = s->pending_err;
    s->pending_err = 0;
    struct pf_fault_hit h;
    if (rc == 0) {
        int frc = fault_or_dead(f, "gpu.sync", &h);
        if (frc)
            rc = frc;
        else if (h.error)
            rc = h.error;
    }
    return rc;
}

static int f_health(struct pf_gpu *g, char *why, size_t whylen)
{
    if (atomic_load(&fg(g)->dead)) {
        snprintf(why, whylen, "GPU context lost: injected fatal fault; restart the server");
        return -ENOTRECOVERABLE;
    }
    return pf_gpu_health(fg(g)->inner, why, whylen);
}

static void f_close(struct pf_gpu *g)
{
    struct fgpu *f = fg(g);
    pf_gpu_close(f->inner);
    free(f);
}

static const struct pf_gpu_ops fgpu_ops = {
    .name = "faulty",
    .device_count = f_count,
    .device_info = f_info,
    .ipc_open = f_ipc_open,
    .ipc_close = f_ipc_close,
    .host_register = f_host_register,
    .host_unregister = f_host_unregister,
    .stream_create = f_stream_create,
    .stream_destroy = f_stream_destroy,
    .copy_batch = f_copy,
    .stream_sync = f_sync,
    .health = f_health,
    .close = f_close,
    .copy_batch_hash = f_copy_hash,
};

int pf_fault_gpu_wrap(struct pf_gpu *inner, struct pf_fault_plan *plan, struct pf_gpu **g_p)
{
    struct fgpu *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    f->base.ops = &fgpu_ops;
    f->inner = inner;
    f->plan = plan;
    *g_p = &f->base;
    return 0;
}

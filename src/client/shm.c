/* Client-side shared memory helpers: the load_state_shm record and sim "GPU" KV memory.
 * Both are POSIX shm objects this process creates (O_EXCL) and unlinks when destroyed. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "pf/clock.h"
#include "pf/util.h"

#define PFLD_MAGIC 0x50464C44u
#define LS_SIZE    32 /* 8-byte offset prefix + 16-byte record + 8 slack */

struct pf_loadstate {
    char name[64]; /* without the leading '/' */
    void *base;
    _Atomic int64_t *state;
};

/* libpegaflow's per-thread status (client.c) */
void pf_clientlib_local_error(int rc, const char *what);

int pf_loadstate_create(struct pf_loadstate **ls_p)
{
    struct pf_loadstate *ls = calloc(1, sizeof(*ls));
    if (!ls)
        return -ENOMEM;
    uint8_t id[16];
    char hex[33];
    int rc = pf_random_bytes(id, sizeof(id));
    if (rc)
        goto err_free;
    pf_hex_encode(id, sizeof(id), hex);
    snprintf(ls->name, sizeof(ls->name), "pega_load_%s", hex);
    char path[80];
    snprintf(path, sizeof(path), "/%s", ls->name);
    int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        rc = -errno;
        goto err_free;
    }
    if (ftruncate(fd, LS_SIZE) != 0) {
        rc = -errno;
        close(fd);
        goto err_unlink;
    }
    ls->base = mmap(NULL, LS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (ls->base == MAP_FAILED) {
        rc = -errno;
        goto err_unlink;
    }
    uint64_t off = 8;
    memcpy(ls->base, &off, sizeof(off));
    uint32_t hdr[2] = {PFLD_MAGIC, 1};
    memcpy((char *)ls->base + off, hdr, sizeof(hdr));
    ls->state = (_Atomic int64_t *)((char *)ls->base + off + 8);
    atomic_store_explicit(ls->state, 0, memory_order_release);
    *ls_p = ls;
    return 0;
err_unlink:
    shm_unlink(path);
err_free:
    free(ls);
    pf_clientlib_local_error(rc, "cannot create the load_state_shm record");
    return rc;
}

const char *pf_loadstate_name(const struct pf_loadstate *ls)
{
    return ls->name;
}

int64_t pf_loadstate_get(const struct pf_loadstate *ls)
{
    return atomic_load_explicit(ls->state, memory_order_acquire);
}

int64_t pf_loadstate_cancel(struct pf_loadstate *ls)
{
    int64_t expect = 0;
    if (atomic_compare_exchange_strong_explicit(ls->state, &expect, 2, memory_order_acq_rel,
                                                memory_order_acquire))
        return 2;
    return expect; /* a final value (or 2: asked already) */
}

int64_t pf_loadstate_wait(const struct pf_loadstate *ls, uint64_t timeout_ms)
{
    uint64_t deadline = pf_now_ns() + timeout_ms * PF_NS_PER_MS;
    uint64_t sleep_us = 20;
    for (;;) {
        int64_t v = pf_loadstate_get(ls);
        if ((v != 0 && v != 2) || pf_now_ns() >= deadline)
            return v;
        usleep((useconds_t)sleep_us); /* poll with backoff: the server writes one word */
        if (sleep_us < 2000)
            sleep_us *= 2;
    }
}

void pf_loadstate_destroy(struct pf_loadstate *ls)
{
    if (!ls)
        return;
    char path[80];
    snprintf(path, sizeof(path), "/%s", ls->name);
    munmap(ls->base, LS_SIZE);
    shm_unlink(path);
    free(ls);
}

struct pf_simkv {
    char name[64];
    void *ptr;
    uint64_t size;
    int dev;
};

int pf_simkv_create(uint64_t bytes, int sim_device, struct pf_simkv **kv_p)
{
    static _Atomic unsigned counter;
    if (bytes == 0)
        return -EINVAL;
    struct pf_simkv *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return -ENOMEM;
    uint8_t r[4];
    pf_random_bytes(r, sizeof(r));
    snprintf(kv->name, sizeof(kv->name), "/pf_simkv_%d_%u_%02x%02x%02x%02x", (int)getpid(),
             atomic_fetch_add(&counter, 1), r[0], r[1], r[2], r[3]);
    int fd = shm_open(kv->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    int rc;
    if (fd < 0) {
        rc = -errno;
        goto err_free;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        rc = -errno;
        close(fd);
        goto err_unlink;
    }
    kv->ptr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (kv->ptr == MAP_FAILED) {
        rc = -errno;
        goto err_unlink;
    }
    kv->size = bytes;
    kv->dev = sim_device;
    *kv_p = kv;
    return 0;
err_unlink:
    shm_unlink(kv->name);
err_free:
    free(kv);
    pf_clientlib_local_error(rc, "cannot create sim KV memory");
    return rc;
}

void *pf_simkv_ptr(const struct pf_simkv *kv)
{
    return kv->ptr;
}

uint64_t pf_simkv_size(const struct pf_simkv *kv)
{
    return kv->size;
}

const char *pf_simkv_name(const struct pf_simkv *kv)
{
    return kv->name;
}

int pf_simkv_ipc(const struct pf_simkv *kv, uint64_t offset, uint64_t size, uint8_t *buf,
                 size_t cap, size_t *len_p)
{
    if (offset > kv->size || size > kv->size - offset)
        return -ERANGE;
    return pf_client_ipc_sim(kv->name, kv->dev, offset, size, buf, cap, len_p);
}

void pf_simkv_destroy(struct pf_simkv *kv)
{
    if (!kv)
        return;
    munmap(kv->ptr, kv->size);
    shm_unlink(kv->name);
    free(kv);
}
